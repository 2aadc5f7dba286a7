//! The Kafka consumer: one dedicated thread creates it, owns it and is the
//! only one to poll it.
//!
//! Guarantee: records are forwarded in poll order, stamped with the rebalance
//! generation they were polled in; the pipeline is never handed more than its
//! bounded channel holds: when it is full, the assigned partitions are paused
//! (polling goes on, so the group membership stays alive) and resumed once the
//! backlog is forwarded. Offsets are only ever *stored* as positions the hub
//! sends (after delivery, see [`crate::rebalance`] for revokes); this thread
//! commits what is stored.
//!
//! What this thread owns: the consumer handle, the pause state, and the
//! rebalance generation. It learns positions only by message.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::rebalance::{self, Positions, RebalanceEvent};
use crate::telemetry::metric;
use crate::telemetry::{Health, Stall};

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
    #[error("cannot reach Kafka at {bootstrap} within {waited_s} s")]
    Unreachable { bootstrap: String, waited_s: u64 },
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

/// A topic-partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tp {
    pub topic: Arc<str>,
    pub partition: i32,
}

/// One consumed record, owned.
#[derive(Debug)]
pub struct Ingested {
    pub tp: Tp,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's Kafka timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
    pub generation: u64,
    pub received_at: tokio::time::Instant,
    /// Its share of `limits.max_in_flight_bytes`, held until its verdict or
    /// DLQ record is acknowledged (or it is dropped): released on drop.
    pub bytes: Option<OwnedSemaphorePermit>,
}

impl Ingested {
    /// Bytes it holds: key, value and headers.
    fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.payload.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }
}

/// The bytes of records consumed and not yet delivered, shared by the
/// consumer thread (which takes a record's share before forwarding it) and
/// the records themselves (which give it back when dropped).
#[derive(Clone)]
pub struct ByteBudget {
    semaphore: Arc<Semaphore>,
    total: usize,
}

impl ByteBudget {
    pub fn new(total: usize) -> Self {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        ByteBudget {
            semaphore: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.total - self.semaphore.available_permits()
    }

    /// Take `record`'s share unless it has one; false while the budget is
    /// spent. A record larger than the whole budget takes all of it.
    fn take(&self, record: &mut Ingested) -> bool {
        if record.bytes.is_some() {
            return true;
        }
        let want = record.size().clamp(1, self.total).min(u32::MAX as usize) as u32;
        match self.semaphore.clone().try_acquire_many_owned(want) {
            Ok(permit) => {
                record.bytes = Some(permit);
                true
            }
            Err(_) => false,
        }
    }
}

enum Forward {
    Sent,
    /// The hub's channel or the byte budget is full: keep it for later.
    Full(Ingested),
    Closed,
}

/// Hand a record to the hub if the byte budget and the channel allow.
fn forward(tx: &mpsc::Sender<Ingested>, budget: &ByteBudget, mut record: Ingested) -> Forward {
    if !budget.take(&mut record) {
        return Forward::Full(record);
    }
    match tx.try_send(record) {
        Ok(()) => Forward::Sent,
        Err(mpsc::error::TrySendError::Full(record)) => Forward::Full(record),
        Err(mpsc::error::TrySendError::Closed(_)) => Forward::Closed,
    }
}

/// What the consumer thread hands the hub: records, rebalance requests, and
/// a sender for the positions to store.
pub struct ConsumerChannels {
    pub records: mpsc::Receiver<Ingested>,
    pub rebalances: mpsc::Receiver<RebalanceEvent>,
    pub positions: async_channel::Sender<Positions>,
}

/// The running consumer thread. Joining it returns the fatal client error
/// that stopped it, if any.
pub struct ConsumerThread {
    thread: std::thread::JoinHandle<Option<String>>,
}

impl ConsumerThread {
    /// Wait for the thread to commit, leave the group and close (blocking);
    /// the fatal client error that stopped it, if any.
    pub fn join(self) -> Result<(), ConsumerError> {
        match self.thread.join() {
            Ok(None) => Ok(()),
            Ok(Some(fatal)) => Err(ConsumerError::Refused(fatal)),
            Err(_) => Err(ConsumerError::Panicked),
        }
    }
}

pub struct ModstreamContext {
    /// The first fatal client error, if any: the pipeline stops on it.
    fatal: OnceLock<String>,
    /// The first TLS failure (handshake, certificate verification): at start
    /// it is the reason the cluster cannot be reached, and says so.
    tls_failure: OnceLock<String>,
    generation: AtomicU64,
    rebalanced: AtomicBool,
    /// A revoke happened since the last assignment: ask the hub where the
    /// partitions it drained were delivered up to.
    revoked: AtomicBool,
    rebalance_tx: mpsc::Sender<RebalanceEvent>,
    positions_rx: async_channel::Receiver<Positions>,
    drain_timeout: Duration,
    /// Records not yet polled, per partition, from each statistics report.
    lags_tx: std::sync::mpsc::Sender<Vec<(Tp, i64)>>,
}

impl ClientContext for ModstreamContext {
    /// librdkafka statistics (every `statistics.interval.ms`): consumer lag
    /// per assigned partition.
    fn stats(&self, stats: rdkafka::Statistics) {
        let mut lags = Vec::new();
        for (topic, t) in &stats.topics {
            for (partition, p) in &t.partitions {
                if *partition >= 0 && p.consumer_lag >= 0 {
                    metrics::gauge!(metric::CONSUMER_LAG, "topic" => topic.clone(), "partition" => partition.to_string())
                        .set(p.consumer_lag as f64);
                }
                if *partition >= 0 && p.hi_offset >= 0 {
                    // Records not yet handed to modstream (the committed lag
                    // also counts records consumed and not yet delivered, and
                    // is unknown before a first commit).
                    let from = if p.app_offset >= 0 {
                        p.app_offset
                    } else if p.committed_offset >= 0 {
                        p.committed_offset
                    } else {
                        p.lo_offset.max(0)
                    };
                    let tp = Tp {
                        topic: Arc::from(topic.as_str()),
                        partition: *partition,
                    };
                    lags.push((tp, (p.hi_offset - from).max(0)));
                }
            }
        }
        // For the poll loop's fetch watchdog (served on the same thread).
        let _ = self.lags_tx.send(lags);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::SSL) {
            let _ = self.tls_failure.set(reason.to_string());
        }
        if is_fatal(&error) {
            tracing::error!(error = %error, reason, "fatal Kafka client error");
            self.set_fatal(format!("{error}: {reason}"));
        } else {
            metrics::counter!(metric::ERRORS_TOTAL, "kind" => "client").increment(1);
            tracing::warn!(error = %error, reason, "kafka client error");
        }
    }
}

impl ModstreamContext {
    fn fatal_error(&self) -> Option<String> {
        self.fatal.get().cloned()
    }

    fn set_fatal(&self, message: String) {
        let _ = self.fatal.set(message);
    }

    /// Store the positions the hub sent so far (each batch in order).
    fn store_sent_positions(&self, consumer: &BaseConsumer<Self>) {
        while let Ok(positions) = self.positions_rx.try_recv() {
            store(consumer, &positions);
        }
    }

    /// Start the assigned partitions that the hub drained in the last revoke
    /// at their delivered positions where those are ahead of the committed
    /// offsets. Returns the positions applied.
    fn resume_where_delivered(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &mut TopicPartitionList,
    ) -> Positions {
        if !self.revoked.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        let candidates =
            rebalance::request_resume(&self.rebalance_tx, partitions_of(tpl), self.drain_timeout);
        if candidates.is_empty() {
            return Vec::new();
        }
        // Never behind the group's committed offsets (another member may
        // have gone further): if they cannot be read, keep librdkafka's default.
        let Ok(committed) = consumer.committed_offsets(tpl.clone(), Duration::from_secs(5)) else {
            return Vec::new();
        };
        let mut resumed = Vec::new();
        for (tp, position) in candidates {
            let ahead = match committed
                .find_partition(&tp.topic, tp.partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(c)) => position > c,
                Some(Offset::Invalid) | None => true,
                Some(_) => false,
            };
            if ahead
                && tpl
                    .set_partition_offset(&tp.topic, tp.partition, Offset::Offset(position))
                    .is_ok()
            {
                tracing::debug!(topic = %tp.topic, partition = tp.partition, position, "resuming at the delivered position");
                resumed.push((tp, position));
            }
        }
        resumed
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| Tp {
            topic: Arc::from(e.topic()),
            partition: e.partition(),
        })
        .collect()
}

impl ConsumerContext for ModstreamContext {
    /// rdkafka's default rebalance (pre_rebalance, assign or unassign,
    /// post_rebalance), with [`ModstreamContext::resume_where_delivered`]
    /// applied to an assignment before it takes effect.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let assign = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        let resumed = if assign {
            self.resume_where_delivered(consumer, tpl)
        } else {
            Vec::new()
        };
        let tpl: &TopicPartitionList = tpl;
        let rebalance = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(tpl),
            other => Rebalance::Error(KafkaError::Rebalance(other.into())),
        };
        self.pre_rebalance(consumer, &rebalance);
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match (assign, cooperative) {
            (true, true) => consumer.incremental_assign(tpl),
            (true, false) => consumer.assign(tpl),
            (false, true) => consumer.incremental_unassign(tpl),
            (false, false) => consumer.unassign(),
        };
        match result {
            // Stored again so that the next commit carries them even if no
            // new record arrives (the refused commit is made good); the hub
            // answers them again at the next revoke.
            Ok(()) if !resumed.is_empty() => {
                if store(consumer, &resumed) {
                    let _ = self
                        .rebalance_tx
                        .blocking_send(RebalanceEvent::Resumed { positions: resumed });
                }
            }
            Ok(()) => {}
            Err(e) => {
                metrics::counter!(metric::ERRORS_TOTAL, "kind" => "rebalance").increment(1);
                tracing::error!(error = %e, assign, "applying the rebalance failed");
            }
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                metrics::counter!(metric::REBALANCES_TOTAL, "kind" => "revoke").increment(1);
                let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
                self.rebalanced.store(true, Ordering::SeqCst);
                let partitions = partitions_of(tpl);
                tracing::info!(
                    partitions = partitions.len(),
                    "partitions revoked; draining"
                );
                // The hub is gone at the very end of a shutdown; nothing to drain then.
                let drained = rebalance::request_drain(
                    &self.rebalance_tx,
                    partitions,
                    generation,
                    self.drain_timeout,
                );
                // Positions the hub sent before answering come first.
                self.store_sent_positions(consumer);
                if let Some(positions) = drained {
                    store(consumer, &positions);
                }
                commit(consumer, CommitMode::Sync);
                // Also for lost partitions (eviction): the assignment checks
                // the positions against the group's committed offsets.
                self.revoked.store(true, Ordering::SeqCst);
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => {
                metrics::counter!(metric::ERRORS_TOTAL, "kind" => "rebalance").increment(1);
                tracing::error!(error = %e, "rebalance error");
            }
        }
    }

    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        match result {
            Ok(()) => {
                metrics::counter!(metric::COMMITS_TOTAL, "outcome" => "ok").increment(1);
                tracing::debug!(partitions = offsets.count(), "offsets committed");
            }
            Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                metrics::counter!(metric::COMMITS_TOTAL, "outcome" => "error").increment(1);
                tracing::warn!(error = %e, "offset commit failed; the next commit carries the offsets again");
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            metrics::counter!(metric::REBALANCES_TOTAL, "kind" => "assign").increment(1);
            self.generation.fetch_add(1, Ordering::SeqCst);
            self.rebalanced.store(true, Ordering::SeqCst);
            tracing::info!(partitions = tpl.count(), "partitions assigned");
        }
    }
}

/// Commit the stored offsets; the outcome (also of a synchronous commit)
/// reaches `commit_callback`.
fn commit(consumer: &KafkaConsumer, mode: CommitMode) {
    if let Err(e) = consumer.commit_consumer_state(mode) {
        tracing::debug!(error = %e, "commit not made");
    }
}

/// Store positions (next offset to read) for the next commit; false if
/// librdkafka refused them.
fn store(consumer: &KafkaConsumer, positions: &Positions) -> bool {
    let mut tpl = TopicPartitionList::new();
    for (tp, position) in positions {
        if tpl
            .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*position))
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
    rebalance_tx: mpsc::Sender<RebalanceEvent>,
    positions_rx: async_channel::Receiver<Positions>,
    lags_tx: std::sync::mpsc::Sender<Vec<(Tp, i64)>>,
) -> Result<KafkaConsumer, ConsumerError> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .set("group.id", &settings.kafka.group_id)
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("statistics.interval.ms", "5000");
    for (k, v) in &settings.kafka.consumer {
        cfg.set(k, v);
    }
    let context = ModstreamContext {
        fatal: OnceLock::new(),
        tls_failure: OnceLock::new(),
        generation: AtomicU64::new(0),
        rebalanced: AtomicBool::new(false),
        revoked: AtomicBool::new(false),
        rebalance_tx,
        positions_rx,
        drain_timeout: settings.kafka.drain_timeout,
        lags_tx,
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
        if let Some(e) = consumer.context().fatal_error() {
            return Err(ConsumerError::Refused(e));
        }
        match consumer.fetch_metadata(None, Duration::from_millis(500)) {
            Ok(_) => return Ok(()),
            Err(e) if is_fatal(&e) => return Err(ConsumerError::Refused(e.to_string())),
            // A certificate that does not verify will not start to: say so now.
            Err(_) if consumer.context().tls_failure.get().is_some() => {
                let reason = consumer.context().tls_failure.get().cloned();
                return Err(ConsumerError::Tls(reason.unwrap_or_default()));
            }
            Err(_) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => {
                return Err(ConsumerError::Unreachable {
                    bootstrap: bootstrap.to_string(),
                    waited_s: timeout.as_secs(),
                });
            }
        }
    }
}

/// Start the consumer thread: it creates the consumer, checks that the
/// cluster answers, subscribes (returning here once it has, or with the
/// reason it could not), then forwards records until `stop_fetching` fires,
/// keeps serving callbacks and storing positions until `pipeline_done`
/// fires, commits synchronously and closes the consumer.
pub async fn start(
    settings: &Settings,
    health: Arc<Health>,
    stop_fetching: CancellationToken,
    pipeline_done: CancellationToken,
) -> Result<(ConsumerThread, ConsumerChannels), ConsumerError> {
    let (records_tx, records) = mpsc::channel(1024);
    let (rebalance_tx, rebalances) = mpsc::channel(16);
    // One batch at a time: the hub coalesces positions until it is taken.
    let (positions, positions_rx) = async_channel::bounded(1);
    let (ready_tx, ready) = oneshot::channel();
    let settings = settings.clone();
    let thread = std::thread::Builder::new()
        .name("kafka-consumer".into())
        .spawn(move || {
            let kafka = &settings.kafka;
            let (lags_tx, lags_rx) = std::sync::mpsc::channel();
            let consumer = match create(&settings, rebalance_tx, positions_rx, lags_tx)
                .and_then(|c| {
                    check_connection(&c, &kafka.bootstrap_servers, kafka.startup_timeout)?;
                    Ok(c)
                })
                .and_then(|c| {
                    subscribe(&c, &settings.input.topics)?;
                    Ok(c)
                }) {
                Ok(consumer) => consumer,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return None;
                }
            };
            if ready_tx.send(Ok(())).is_err() {
                return None;
            }
            let budget = ByteBudget::new(settings.limits.max_in_flight_bytes);
            let mut watchdog = FetchWatchdog::new(lags_rx, health, settings.limits.stall_after);
            poll_loop(
                &consumer,
                &budget,
                &mut watchdog,
                records_tx,
                kafka.commit_interval,
                &stop_fetching,
            );
            // Input is closed: the hub drains, then we commit what it stored.
            while !pipeline_done.is_cancelled() {
                let _ = consumer.poll(Duration::from_millis(50));
                consumer.context().store_sent_positions(&consumer);
            }
            consumer.context().store_sent_positions(&consumer);
            commit(&consumer, CommitMode::Sync);
            let fatal = consumer.context().fatal_error();
            // Dropping the consumer closes it and leaves the group.
            drop(consumer);
            tracing::info!("consumer closed");
            fatal
        })
        .map_err(ConsumerError::Thread)?;
    ready.await.map_err(|_| ConsumerError::ThreadGone)??;
    Ok((
        ConsumerThread { thread },
        ConsumerChannels {
            records,
            rebalances,
            positions,
        },
    ))
}

/// How long the pipeline may stay full before the partitions are paused.
/// Well below `max.poll.interval.ms`: polling is suspended meanwhile.
const BACKPRESSURE_THRESHOLD: Duration = Duration::from_millis(500);

fn poll_loop(
    consumer: &KafkaConsumer,
    budget: &ByteBudget,
    watchdog: &mut FetchWatchdog,
    records_tx: mpsc::Sender<Ingested>,
    commit_interval: Duration,
    stop_fetching: &CancellationToken,
) {
    // Records polled while the pipeline was full: forwarded before new ones.
    let mut backlog: VecDeque<Ingested> = VecDeque::new();
    let mut paused = false;
    let mut backlog_since: Option<Instant> = None;
    let mut last_commit = Instant::now();
    while !stop_fetching.is_cancelled() {
        if consumer.context().fatal_error().is_some() {
            // Stop forwarding; the pipeline drains what it has and reports the error.
            break;
        }
        consumer.context().store_sent_positions(consumer);
        while let Some(record) = backlog.pop_front() {
            match forward(&records_tx, budget, record) {
                Forward::Sent => {}
                Forward::Full(record) => {
                    backlog.push_front(record);
                    watchdog.pushed_back();
                    break;
                }
                Forward::Closed => return,
            }
        }
        metrics::gauge!(metric::IN_FLIGHT_BYTES).set(budget.used() as f64);
        let rebalanced = consumer.context().rebalanced.swap(false, Ordering::SeqCst);
        if rebalanced {
            // Records of partitions we no longer own go to their new owner.
            if let Ok(assignment) = consumer.assignment() {
                let owned = partitions_of(&assignment);
                backlog.retain(|r| owned.contains(&r.tp));
            }
            // librdkafka keeps a partition's pause flag across unassign and
            // assign: make the whole new assignment match the backpressure
            // state, whichever it is, or a partition paused before the
            // rebalance is never fetched again.
            set_paused(consumer, paused);
        }
        // A momentarily full channel is normal at full speed: wait a little
        // without polling (no new records) before pausing, because a pause
        // throws away librdkafka's prefetched records and a resume refetches.
        if backlog.is_empty() {
            backlog_since = None;
        } else if backlog_since.is_none() {
            backlog_since = Some(Instant::now());
        }
        let sustained = backlog_since.is_some_and(|t| t.elapsed() >= BACKPRESSURE_THRESHOLD);
        if backlog.is_empty() && paused {
            set_paused(consumer, false);
            paused = false;
        } else if sustained && (!paused || rebalanced) {
            set_paused(consumer, true);
            paused = true;
        }
        if !backlog.is_empty() && !paused {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let timeout = if paused {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(timeout) {
            Some(Ok(m)) => {
                let generation = consumer.context().generation.load(Ordering::SeqCst);
                metrics::counter!(metric::CONSUMED_TOTAL, "topic" => m.topic().to_string())
                    .increment(1);
                let record = Ingested {
                    tp: Tp {
                        topic: Arc::from(m.topic()),
                        partition: m.partition(),
                    },
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    headers: m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                                .collect()
                        })
                        .unwrap_or_default(),
                    timestamp_ms: m.timestamp().to_millis(),
                    generation,
                    received_at: tokio::time::Instant::now(),
                    bytes: None,
                };
                watchdog.fetched(&record.tp);
                if backlog.is_empty() {
                    match forward(&records_tx, budget, record) {
                        Forward::Sent => {}
                        Forward::Full(record) => {
                            backlog.push_back(record);
                            watchdog.pushed_back();
                        }
                        Forward::Closed => return,
                    }
                } else {
                    backlog.push_back(record);
                }
            }
            Some(Err(e)) if is_fatal(&e) => {
                tracing::error!(error = %e, "fatal consumer error");
                consumer.context().set_fatal(e.to_string());
            }
            Some(Err(e)) => {
                metrics::counter!(metric::ERRORS_TOTAL, "kind" => "consume").increment(1);
                tracing::warn!(error = %e, "consumer error");
            }
            None => {}
        }
        if last_commit.elapsed() >= commit_interval {
            commit(consumer, CommitMode::Async);
            last_commit = Instant::now();
        }
        watchdog.check(consumer, paused);
    }
    watchdog.stop();
    if let Ok(assignment) = consumer.assignment() {
        let _ = consumer.pause(&assignment);
    }
}

/// The fetch watchdog: an assigned partition that lags behind its end
/// (librdkafka statistics) yet gave no record for `limits.stall_after`,
/// while the pipeline took every record without pushing back all that
/// time, is not being fetched — by something below modstream (a pause flag
/// left behind, a stuck fetcher). It is reported like a stall (error log
/// once, `modstream_stalled_partitions`, /readyz). While the pipeline
/// pushes back, partitions wait for it: that is the hub's watchdog's
/// business.
struct FetchWatchdog {
    lags_rx: std::sync::mpsc::Receiver<Vec<(Tp, i64)>>,
    lags: HashMap<Tp, i64>,
    last_record: HashMap<Tp, Instant>,
    reported: HashSet<Tp>,
    health: Arc<Health>,
    stall_after: Duration,
    next_check: Instant,
    /// When the pipeline last pushed back (channel or byte budget full).
    pushed_back: Instant,
}

impl FetchWatchdog {
    fn new(
        lags_rx: std::sync::mpsc::Receiver<Vec<(Tp, i64)>>,
        health: Arc<Health>,
        stall_after: Duration,
    ) -> Self {
        FetchWatchdog {
            lags_rx,
            lags: HashMap::new(),
            last_record: HashMap::new(),
            reported: HashSet::new(),
            health,
            stall_after,
            next_check: Instant::now(),
            pushed_back: Instant::now(),
        }
    }

    fn pushed_back(&mut self) {
        self.pushed_back = Instant::now();
    }

    fn fetched(&mut self, tp: &Tp) {
        let now = Instant::now();
        match self.last_record.get_mut(tp) {
            Some(at) => *at = now,
            None => {
                self.last_record.insert(tp.clone(), now);
            }
        }
    }

    /// About once a second.
    fn check(&mut self, consumer: &KafkaConsumer, paused: bool) {
        let now = Instant::now();
        if now < self.next_check {
            return;
        }
        if paused {
            self.pushed_back = now;
        }
        self.next_check = now + Duration::from_secs(1);
        while let Ok(lags) = self.lags_rx.try_recv() {
            self.lags = lags.into_iter().collect();
        }
        let assigned = consumer
            .assignment()
            .map(|a| partitions_of(&a))
            .unwrap_or_default();
        // A partition's clock starts when it is first seen assigned.
        self.last_record.retain(|tp, _| assigned.contains(tp));
        for tp in &assigned {
            self.last_record.entry(tp.clone()).or_insert(now);
        }
        if now.duration_since(self.pushed_back) < self.stall_after {
            // The pipeline sets the pace now: nothing to say either way.
            return;
        }
        let found = unfetched(&self.lags, &self.last_record, now, self.stall_after);
        for stall in &found {
            let tp = Tp {
                topic: Arc::from(stall.topic.as_str()),
                partition: stall.partition,
            };
            if self.reported.insert(tp) {
                tracing::error!(topic = %stall.topic, partition = stall.partition, lag = stall.pending, waiting_s = stall.waiting_s, "partition not fetched: it lags behind its end, yet no record came");
            }
        }
        self.reported.retain(|tp| {
            let still = found
                .iter()
                .any(|s| s.partition == tp.partition && *s.topic == *tp.topic);
            if !still {
                tracing::info!(topic = %tp.topic, partition = tp.partition, "partition fetched again (or no longer assigned)");
            }
            still
        });
        self.health.set_unfetched(found);
    }

    fn stop(&mut self) {
        self.health.set_unfetched(Vec::new());
    }
}

/// Partitions with a lag and no record for `stall_after`.
fn unfetched(
    lags: &HashMap<Tp, i64>,
    last_record: &HashMap<Tp, Instant>,
    now: Instant,
    stall_after: Duration,
) -> Vec<Stall> {
    let mut found: Vec<Stall> = last_record
        .iter()
        .filter_map(|(tp, at)| {
            let lag = *lags.get(tp)?;
            let waited = now.saturating_duration_since(*at);
            (lag > 0 && waited >= stall_after).then(|| Stall {
                topic: tp.topic.to_string(),
                partition: tp.partition,
                offset: -1,
                waiting_s: waited.as_secs(),
                pending: lag as usize,
            })
        })
        .collect();
    found.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    found
}

fn set_paused(consumer: &KafkaConsumer, pause: bool) {
    let Ok(assignment) = consumer.assignment() else {
        return;
    };
    let result = if pause {
        consumer.pause(&assignment)
    } else {
        consumer.resume(&assignment)
    };
    match result {
        Ok(()) => {
            let n = if pause { assignment.count() } else { 0 };
            metrics::gauge!(metric::PAUSED_PARTITIONS).set(n as f64);
            tracing::debug!(
                paused = pause,
                partitions = assignment.count(),
                "backpressure"
            );
        }
        Err(e) => tracing::warn!(error = %e, "cannot pause or resume partitions"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value_len: usize) -> Ingested {
        Ingested {
            tp: Tp {
                topic: Arc::from("posts"),
                partition: 0,
            },
            offset: 0,
            key: Some(b"k".to_vec()),
            payload: Some(vec![b'x'; value_len]),
            headers: vec![("h".to_string(), None)],
            timestamp_ms: None,
            generation: 0,
            received_at: tokio::time::Instant::now(),
            bytes: None,
        }
    }

    #[test]
    fn the_byte_budget_holds_records_back_until_earlier_ones_are_done() {
        let budget = ByteBudget::new(100);
        let (tx, mut rx) = mpsc::channel(8);
        // 60 + key 1 + header name 1 = 62 bytes.
        assert!(matches!(forward(&tx, &budget, record(60)), Forward::Sent));
        assert_eq!(budget.used(), 62);
        let Forward::Full(held) = forward(&tx, &budget, record(60)) else {
            panic!("over the budget: held back");
        };
        assert!(held.bytes.is_none());
        // The first one is done (its verdict acknowledged): its bytes return.
        drop(rx.try_recv().unwrap());
        assert_eq!(budget.used(), 0);
        assert!(matches!(forward(&tx, &budget, held), Forward::Sent));
        drop(rx.try_recv().unwrap());
        // A record larger than the whole budget still goes, alone.
        assert!(matches!(forward(&tx, &budget, record(1000)), Forward::Sent));
        assert_eq!(budget.used(), 100);
    }

    #[test]
    fn a_lagging_partition_without_records_is_reported_unfetched() {
        let tp = |p| Tp {
            topic: Arc::from("posts"),
            partition: p,
        };
        let now = Instant::now();
        let long_ago = now - Duration::from_secs(90);
        let lags: HashMap<Tp, i64> = [(tp(0), 500), (tp(1), 0), (tp(2), 7)].into();
        let last_record: HashMap<Tp, Instant> = [
            (tp(0), long_ago), // lags, nothing for 90 s: not fetched
            (tp(1), long_ago), // at its end: nothing to fetch
            (tp(2), now),      // lags, but records come
            (tp(3), long_ago), // no statistics yet
        ]
        .into();
        let found = unfetched(&lags, &last_record, now, Duration::from_secs(60));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].partition, found[0].pending), (0, 500));
        assert!(found[0].waiting_s >= 90);
    }
}
