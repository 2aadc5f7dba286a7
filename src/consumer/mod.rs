//! The Kafka consumer: one dedicated thread creates it, owns it and is the
//! only one to poll it.
//!
//! Guarantee: records are forwarded in poll order, stamped with the rebalance
//! generation they were polled in; the pipeline is never handed more than its
//! bounded channel holds: when it is full, the assigned partitions are paused
//! (polling goes on, so the group membership stays alive) and resumed once the
//! backlog is forwarded. Offsets are only ever *stored* as positions the hub
//! sends (after delivery, see [`crate::consumer::rebalance`] for revokes); this thread
//! commits what is stored.
//!
//! What this thread owns: the consumer handle, the pause state, and the
//! rebalance generation. It learns positions only by message.
//!
//! [`context`] holds librdkafka's callbacks, [`poll`] the poll loop,
//! [`budget`] the records and their byte budget, [`fetch_watchdog`] the
//! check that every lagging partition is fetched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::client::{self, ConsumerRole};
use crate::config::Settings;
use crate::consumer::rebalance::Control;
use crate::telemetry::Health;
use crate::tp::{Lag, Position, Positions, Tp};

mod budget;
mod context;
mod exactly_once;
mod fetch_watchdog;
mod poll;
pub mod rebalance;

pub use exactly_once::ExactlyOnce;

pub use budget::{ByteBudget, Ingested};
pub use context::ModstreamContext;

use context::{ClientFaults, HubLink, Membership};
use fetch_watchdog::FetchWatchdog;
use poll::PollLoop;

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("cannot create the Kafka consumer")]
    Create(#[source] KafkaError),
    #[error("cannot subscribe to {topics:?}")]
    Subscribe {
        topics: Vec<String>,
        #[source]
        source: KafkaError,
    },
    #[error("cannot start the consumer thread")]
    Thread(#[source] std::io::Error),
    #[error("the consumer thread stopped before it was ready")]
    ThreadGone,
    #[error("the consumer thread panicked")]
    Panicked,
    #[error("Kafka refused this client: {0} (check sasl.username / sasl.password / ACLs)")]
    Refused(String),
    /// Exactly-once: the transactional producer was fenced or failed for good.
    #[error("exactly-once stopped: {0}")]
    Transaction(String),
    #[error(
        "cannot reach Kafka at {bootstrap} within {waited_s} s (kafka.startup_timeout): {cause}"
    )]
    Unreachable {
        bootstrap: String,
        waited_s: u64,
        cause: String,
    },
    #[error(
        "TLS with Kafka failed: {0} (check ssl.ca.location: the CA that signed the brokers' certificates, and that their names match bootstrap_servers)"
    )]
    Tls(String),
}

/// Errors that retrying cannot fix: wrong credentials, missing ACLs, or a
/// client that librdkafka declared unusable.
pub fn is_fatal(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::Authentication
                | C::SaslAuthenticationFailed
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::Fatal
        )
    )
}

/// What the consumer thread hands the hub: records, rebalance requests, and
/// a sender for the positions to store.
pub struct ConsumerChannels {
    pub records: mpsc::Receiver<Ingested>,
    pub control: mpsc::Receiver<Control>,
    pub positions: async_channel::Sender<Positions>,
}

/// The running consumer thread. Joining it returns the fatal client error
/// that stopped it, if any.
pub struct ConsumerThread {
    thread: std::thread::JoinHandle<Option<ConsumerError>>,
}

impl ConsumerThread {
    /// Wait for the thread to commit, leave the group and close (blocking);
    /// the fatal client error that stopped it, if any.
    pub fn join(self) -> Result<(), ConsumerError> {
        match self.thread.join() {
            Ok(None) => Ok(()),
            Ok(Some(fatal)) => Err(fatal),
            Err(_) => Err(ConsumerError::Panicked),
        }
    }
}

/// Commit the stored offsets; the outcome reaches `commit_callback` (an
/// asynchronous one with the next poll).
fn commit(consumer: &KafkaConsumer, mode: CommitMode) {
    use rdkafka::consumer::ConsumerContext;
    let result = match mode {
        CommitMode::Async => match commit_async(consumer) {
            Ok(()) => return,
            refused => refused,
        },
        CommitMode::Sync => consumer.commit_consumer_state(mode),
    };
    consumer
        .context()
        .commit_callback(result, &TopicPartitionList::new());
}

/// An asynchronous commit of the stored offsets whose outcome comes back
/// on the consumer's own queue, as an event its poll hands to
/// `commit_callback`. librdkafka reports a plain asynchronous commit
/// (`rd_kafka_commit`) only to a configured `offset_commit_cb`, which
/// rust-rdkafka does not set: its failures would reach no counter, only
/// librdkafka's own log. rust-rdkafka has no wrapper for
/// `rd_kafka_commit_queue`.
fn commit_async(consumer: &KafkaConsumer) -> Result<(), KafkaError> {
    use rdkafka::bindings as rd;
    let client = consumer.client().native_ptr();
    // SAFETY: `client` is a live consumer handle for the whole call.
    let queue = unsafe { rd::rd_kafka_queue_get_consumer(client) };
    if queue.is_null() {
        // No group queue (never so for the group consumer): without one,
        // rd_kafka_commit_queue would wait for the answer.
        return consumer.commit_consumer_state(CommitMode::Async);
    }
    // SAFETY: `queue` is ours to destroy once handed over; the commit's
    // reply keeps its own reference to the queue it points to.
    let code = unsafe {
        let code =
            rd::rd_kafka_commit_queue(client, std::ptr::null(), queue, None, std::ptr::null_mut());
        rd::rd_kafka_queue_destroy(queue);
        code
    };
    if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(KafkaError::ConsumerCommit(code.into()))
    }
}

/// Store positions (next offset to read) for the next commit; false if
/// librdkafka refused them.
fn store(consumer: &KafkaConsumer, positions: &Positions) -> bool {
    let mut tpl = TopicPartitionList::new();
    for Position { tp, next } in positions {
        if tpl
            .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*next))
            .is_err()
        {
            return false;
        }
    }
    match consumer.store_offsets(&tpl) {
        Ok(()) => true,
        // Happens for a partition revoked meanwhile: its new owner takes over.
        Err(e) => {
            tracing::debug!(partitions = positions.len(), error = %e, "offsets not stored");
            false
        }
    }
}

type KafkaConsumer = BaseConsumer<ModstreamContext>;

/// Build the consumer (not yet subscribed). Configuration problems surface
/// here, connection problems in [`check_connection`].
fn create(
    settings: &Settings,
    control_tx: mpsc::Sender<Control>,
    positions_rx: async_channel::Receiver<Positions>,
    lags_tx: std::sync::mpsc::Sender<Vec<Lag>>,
    exactly_once: Option<ExactlyOnce>,
    health: Arc<Health>,
) -> Result<KafkaConsumer, ConsumerError> {
    let kafka = &settings.kafka;
    let cfg = client::consumer(settings, ConsumerRole::Group, &kafka.group_id);
    let context = ModstreamContext {
        faults: ClientFaults::default(),
        membership: Membership::default(),
        hub: HubLink {
            control_tx,
            positions_rx,
            drain_timeout: settings.kafka.drain_timeout,
        },
        lags_tx,
        txn: exactly_once.map(exactly_once::Txn::new),
        health,
    };
    cfg.create_with_context(context)
        .map_err(ConsumerError::Create)
}

/// Join the consumer group on the input topics.
fn subscribe(consumer: &KafkaConsumer, topics: &[String]) -> Result<(), ConsumerError> {
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&names)
        .map_err(|source| ConsumerError::Subscribe {
            topics: topics.to_vec(),
            source,
        })
}

/// Before subscribing: wait until the cluster answers a metadata request, so
/// that wrong credentials or a wrong address fail the start instead of a
/// silent wait. Polling here serves error events; without a subscription it
/// cannot hand out a record.
fn check_connection(
    consumer: &KafkaConsumer,
    bootstrap: &str,
    timeout: Duration,
) -> Result<(), ConsumerError> {
    let started = Instant::now();
    loop {
        let _ = consumer.poll(Duration::from_millis(50));
        if let Some(e) = consumer.context().faults.fatal() {
            return Err(ConsumerError::Refused(e));
        }
        match consumer.fetch_metadata(None, Duration::from_millis(500)) {
            Ok(_) => return Ok(()),
            Err(e) if is_fatal(&e) => return Err(ConsumerError::Refused(e.to_string())),
            // A certificate that does not verify will not start to: say so now.
            Err(_) if consumer.context().faults.tls_failure().is_some() => {
                let reason = consumer.context().faults.tls_failure();
                return Err(ConsumerError::Tls(reason.unwrap_or_default()));
            }
            Err(_) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                let cause = consumer
                    .context()
                    .faults
                    .last()
                    .unwrap_or_else(|| e.to_string());
                return Err(ConsumerError::Unreachable {
                    bootstrap: bootstrap.to_string(),
                    waited_s: timeout.as_secs(),
                    cause,
                });
            }
        }
    }
}

/// Input is closed: the hub drains, then commit what it stored
/// (exactly-once: transactions go on ending on the interval, and the last
/// one ends after the hub).
fn drain_then_commit(
    consumer: &KafkaConsumer,
    pipeline_done: &CancellationToken,
    interval: Duration,
) {
    let exactly_once = consumer.context().txn.is_some();
    let mut last_end = Instant::now();
    while !pipeline_done.is_cancelled() {
        let _ = consumer.poll(Duration::from_millis(50));
        consumer.context().store_sent_positions(consumer);
        if exactly_once && last_end.elapsed() >= interval {
            consumer
                .context()
                .end_transaction(consumer, exactly_once::End::Interval);
            last_end = Instant::now();
        }
    }
    if exactly_once {
        consumer
            .context()
            .end_transaction(consumer, exactly_once::End::Shutdown);
    } else {
        consumer.context().store_sent_positions(consumer);
        commit(consumer, CommitMode::Sync);
    }
}

/// What the consumer thread lives by, from creation to close.
struct Life {
    settings: Settings,
    health: Arc<Health>,
    stop_fetching: CancellationToken,
    pipeline_done: CancellationToken,
    exactly_once: Option<ExactlyOnce>,
    records_tx: mpsc::Sender<Ingested>,
    control_tx: mpsc::Sender<Control>,
    positions_rx: async_channel::Receiver<Positions>,
    connected_tx: oneshot::Sender<Result<(), ConsumerError>>,
    join_rx: oneshot::Receiver<()>,
    joined_tx: oneshot::Sender<Result<(), ConsumerError>>,
}

impl Life {
    /// The consumer thread: create, check the connection, wait to be told
    /// to join, subscribe, poll until told to stop, drain, commit, close.
    /// The fatal client error that stopped it, if any.
    fn run(self) -> Option<ConsumerError> {
        let Life {
            settings,
            health,
            stop_fetching,
            pipeline_done,
            exactly_once,
            records_tx,
            control_tx,
            positions_rx,
            connected_tx,
            join_rx,
            joined_tx,
        } = self;
        let (settings, health) = (&settings, &health);
        let kafka = &settings.kafka;
        let (lags_tx, lags_rx) = std::sync::mpsc::channel();
        let consumer = match create(
            settings,
            control_tx,
            positions_rx,
            lags_tx,
            exactly_once,
            health.clone(),
        )
        .and_then(|c| {
            check_connection(&c, &kafka.bootstrap_servers, kafka.startup_timeout)?;
            Ok(c)
        }) {
            Ok(consumer) => consumer,
            Err(e) => {
                let _ = connected_tx.send(Err(e));
                return None;
            }
        };
        if connected_tx.send(Ok(())).is_err() || join_rx.blocking_recv().is_err() {
            return None;
        }
        if let Err(e) = subscribe(&consumer, &settings.input.topics) {
            let _ = joined_tx.send(Err(e));
            return None;
        }
        if joined_tx.send(Ok(())).is_err() {
            return None;
        }
        let limits = &settings.limits;
        let budget = ByteBudget::new(crate::client::FetchBounds::of(limits).hub_bytes(limits));
        let mut watchdog = FetchWatchdog::new(lags_rx, health.clone(), settings.limits.stall_after);
        PollLoop::new(
            &consumer,
            &budget,
            &mut watchdog,
            records_tx,
            kafka.commit_interval,
        )
        .run(&stop_fetching);
        drain_then_commit(&consumer, &pipeline_done, kafka.commit_interval);
        let fatal = consumer.context().faults.fatal().map(|m| {
            if consumer.context().faults.transaction_fatal() {
                ConsumerError::Transaction(m)
            } else {
                ConsumerError::Refused(m)
            }
        });
        // Dropping the consumer closes it and leaves the group.
        drop(consumer);
        tracing::info!("consumer closed");
        fatal
    }
}

/// The consumer thread, connected to the cluster and not yet in its group
/// ([`connect`]): what a start checks before joining happens meanwhile.
pub struct Connected {
    join: oneshot::Sender<()>,
    joined: oneshot::Receiver<Result<(), ConsumerError>>,
    thread: std::thread::JoinHandle<Option<ConsumerError>>,
    channels: ConsumerChannels,
}

impl Connected {
    /// Subscribe: the consumer joins its group on the input topics.
    pub async fn join(self) -> Result<(ConsumerThread, ConsumerChannels), ConsumerError> {
        let _ = self.join.send(());
        self.joined.await.map_err(|_| ConsumerError::ThreadGone)??;
        Ok((
            ConsumerThread {
                thread: self.thread,
            },
            self.channels,
        ))
    }
}

/// Start the consumer thread: it creates the consumer and checks that the
/// cluster answers (returning here once it does, or with the reason it
/// does not: wrong credentials, a certificate, an address); once told to
/// [`Connected::join`], it subscribes, then forwards records until
/// `stop_fetching` fires, keeps serving callbacks and storing positions
/// until `pipeline_done` fires, commits synchronously and closes the
/// consumer. Dropping the [`Connected`] handle instead closes it unjoined.
pub async fn connect(
    settings: &Settings,
    health: Arc<Health>,
    stop_fetching: CancellationToken,
    pipeline_done: CancellationToken,
    exactly_once: Option<ExactlyOnce>,
) -> Result<Connected, ConsumerError> {
    let (records_tx, records) = mpsc::channel(1024);
    let (control_tx, control) = mpsc::channel(16);
    // One batch at a time: the hub coalesces positions until it is taken.
    let (positions, positions_rx) = async_channel::bounded(1);
    let (connected_tx, connected) = oneshot::channel();
    let (join, join_rx) = oneshot::channel::<()>();
    let (joined_tx, joined) = oneshot::channel();
    let life = Life {
        settings: settings.clone(),
        health,
        stop_fetching,
        pipeline_done,
        exactly_once,
        records_tx,
        control_tx,
        positions_rx,
        connected_tx,
        join_rx,
        joined_tx,
    };
    let thread = std::thread::Builder::new()
        .name("kafka-consumer".into())
        .spawn(move || life.run())
        .map_err(ConsumerError::Thread)?;
    connected.await.map_err(|_| ConsumerError::ThreadGone)??;
    Ok(Connected {
        join,
        joined,
        thread,
        channels: ConsumerChannels {
            records,
            control,
            positions,
        },
    })
}

/// The partitions of a librdkafka list.
fn partitions_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| Tp::new(e.topic(), e.partition()))
        .collect()
}
