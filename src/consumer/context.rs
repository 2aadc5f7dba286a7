//! The consumer's context: what librdkafka calls back on the consumer
//! thread. Rebalances are handed to the hub ([`crate::consumer::rebalance`]) and
//! waited for; statistics feed the lag gauge and the fetch watchdog.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::exactly_once::{End, Thread, Txn, TxnFatal};
use super::{commit, is_fatal, partitions_of, store};
use crate::consumer::rebalance::{self, Control};
use crate::telemetry::Health;
use crate::telemetry::metric::{self, CommitOutcome, ErrorKind, RebalanceKind};
use crate::tp::{Generation, Lag, Position, Positions, Tp};

/// The consumer's context: librdkafka's callbacks (statistics, errors,
/// rebalances, commits) run here, on the consumer thread, inside a poll.
/// Its state, grouped by what it belongs to.
pub struct ModstreamContext {
    pub(super) faults: ClientFaults,
    pub(super) membership: Membership,
    pub(super) hub: HubLink,
    /// Records not yet polled, per partition, from each statistics report.
    pub(super) lags_tx: std::sync::mpsc::Sender<Vec<Lag>>,
    /// With `kafka.delivery = "exactly_once"`: the transactions, ended on
    /// this thread ([`super::exactly_once`]). Locked only by this thread.
    pub(super) txn: Option<Txn>,
    /// This run's health, for its fault tally.
    pub(super) health: Arc<Health>,
}

/// The client's failures: the first of each kind, and the last error.
#[derive(Default)]
pub(super) struct ClientFaults {
    /// The first fatal client error, if any: the pipeline stops on it.
    fatal: OnceLock<String>,
    /// The fatal error is exactly-once's (fenced, or a transaction that
    /// cannot end), not the client's.
    transaction_fatal: AtomicBool,
    /// The first TLS failure (handshake, certificate verification): at start
    /// it is the reason the cluster cannot be reached, and says so.
    tls_failure: OnceLock<String>,
    /// The last client error (a name that does not resolve, a refused
    /// connection): the reason a start that cannot reach the cluster gives.
    last: std::sync::Mutex<Option<String>>,
}

impl ClientFaults {
    pub(super) fn fatal(&self) -> Option<String> {
        self.fatal.get().cloned()
    }

    pub(super) fn set_fatal(&self, message: String) {
        let _ = self.fatal.set(message);
    }

    pub(super) fn set_transaction_fatal(&self, message: String) {
        self.transaction_fatal.store(true, Ordering::SeqCst);
        self.set_fatal(message);
    }

    pub(super) fn transaction_fatal(&self) -> bool {
        self.transaction_fatal.load(Ordering::SeqCst)
    }

    pub(super) fn tls_failure(&self) -> Option<String> {
        self.tls_failure.get().cloned()
    }

    fn set_last(&self, reason: &str) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(reason.to_string());
        }
    }

    pub(super) fn last(&self) -> Option<String> {
        self.last.lock().ok().and_then(|l| l.clone())
    }
}

/// The group membership as the callbacks change it and the poll loop
/// reads it.
#[derive(Default)]
pub(super) struct Membership {
    /// Counts rebalances: records polled before one are told apart.
    generation: AtomicU64,
    /// A rebalance happened since the poll loop last looked.
    rebalanced: AtomicBool,
    /// A revoke happened since the last assignment: ask the hub where the
    /// partitions it drained were delivered up to.
    revoked: AtomicBool,
}

impl Membership {
    /// A rebalance: the next generation.
    pub(super) fn rebalance(&self) -> Generation {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.rebalanced.store(true, Ordering::SeqCst);
        Generation(generation)
    }

    pub(super) fn generation(&self) -> Generation {
        Generation(self.generation.load(Ordering::SeqCst))
    }

    /// Whether a rebalance happened since the last call.
    pub(super) fn take_rebalanced(&self) -> bool {
        self.rebalanced.swap(false, Ordering::SeqCst)
    }

    fn mark_revoked(&self) {
        self.revoked.store(true, Ordering::SeqCst);
    }

    /// Whether a revoke happened since the last call.
    fn take_revoked(&self) -> bool {
        self.revoked.swap(false, Ordering::SeqCst)
    }
}

/// The consumer thread's side of its channels with the hub.
pub(super) struct HubLink {
    pub(super) control_tx: mpsc::Sender<Control>,
    pub(super) positions_rx: async_channel::Receiver<Positions>,
    /// How long a revoke waits for the hub's drain.
    pub(super) drain_timeout: Duration,
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
                    let tp = Tp::new(topic, *partition);
                    lags.push(Lag {
                        tp,
                        records: (p.hi_offset - from).max(0),
                    });
                }
            }
        }
        // For the poll loop's fetch watchdog (served on the same thread).
        let _ = self.lags_tx.send(lags);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::client::log::log_line(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::SSL) {
            let _ = self.faults.tls_failure.set(reason.to_string());
        }
        if is_fatal(&error) {
            tracing::error!(error = %error, reason, "fatal Kafka client error");
            self.faults.set_fatal(format!("{error}: {reason}"));
        } else {
            metrics::counter!(metric::ERRORS_TOTAL, "kind" => ErrorKind::Client.as_str())
                .increment(1);
            if crate::client::log::is_cause(&error) {
                self.faults.set_last(reason);
            }
            if let Some(held) = crate::client::log::gate().admit(reason) {
                tracing::warn!(error = %error, reason, held_back = held, "kafka client error");
            }
        }
    }
}

impl ModstreamContext {
    /// Store the positions the hub sent so far (each batch in order); with
    /// exactly-once keep them for the next transaction's commit instead.
    pub(super) fn store_sent_positions(&self, consumer: &BaseConsumer<Self>) {
        while let Ok(positions) = self.hub.positions_rx.try_recv() {
            match &self.txn {
                Some(txn) => txn.keep(positions),
                None => {
                    store(consumer, &positions);
                }
            }
        }
    }

    /// Exactly-once: where an owned partition started (its first offset
    /// polled).
    pub(super) fn note_polled(&self, tp: &Tp, offset: i64) {
        if let Some(txn) = &self.txn {
            txn.note_polled(tp, offset);
        }
    }

    /// Exactly-once: end the open transaction (see [`super::exactly_once`]).
    pub(super) fn end_transaction(&self, consumer: &BaseConsumer<Self>, end: End<'_>) {
        if let Some(txn) = &self.txn {
            let ended = txn.end(&self.thread(consumer), end);
            self.on_transaction_fatal(ended);
        }
    }

    /// The parts of this context a transaction's end uses.
    fn thread<'a>(&'a self, consumer: &'a BaseConsumer<Self>) -> OnThread<'a> {
        OnThread {
            context: self,
            consumer,
        }
    }

    fn on_transaction_fatal(&self, ended: Result<(), TxnFatal>) {
        if let Err(TxnFatal(message)) = ended {
            self.faults.set_transaction_fatal(message);
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
        if !self.membership.take_revoked() || self.txn.is_some() {
            // Exactly-once: what the revoke answered is committed with its
            // transaction or aborted with it; the committed offset is right.
            return Vec::new();
        }
        let candidates = rebalance::request_resume(
            &self.hub.control_tx,
            partitions_of(tpl),
            self.hub.drain_timeout,
        );
        if candidates.is_empty() {
            return Vec::new();
        }
        // Never behind the group's committed offsets (another member may
        // have gone further): if they cannot be read, keep librdkafka's default.
        let Ok(committed) = consumer.committed_offsets(tpl.clone(), Duration::from_secs(5)) else {
            return Vec::new();
        };
        let mut resumed = Vec::new();
        for Position { tp, next: position } in candidates {
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
                resumed.push(Position { tp, next: position });
            }
        }
        resumed
    }
}

/// The consumer thread, as a transaction's end sees it.
struct OnThread<'a> {
    context: &'a ModstreamContext,
    consumer: &'a BaseConsumer<ModstreamContext>,
}

impl Thread for OnThread<'_> {
    type Context = ModstreamContext;

    fn consumer(&self) -> &BaseConsumer<ModstreamContext> {
        self.consumer
    }

    fn control_tx(&self) -> &mpsc::Sender<Control> {
        &self.context.hub.control_tx
    }

    fn take_sent(&self) {
        self.context.store_sent_positions(self.consumer);
    }

    fn discard_sent(&self) {
        while self.context.hub.positions_rx.try_recv().is_ok() {}
    }

    fn new_generation(&self) -> Generation {
        self.context.membership.rebalance()
    }
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
                        .hub
                        .control_tx
                        .blocking_send(Control::Resumed { positions: resumed });
                }
            }
            Ok(()) => {}
            Err(e) => {
                metrics::counter!(metric::ERRORS_TOTAL, "kind" => ErrorKind::Rebalance.as_str())
                    .increment(1);
                tracing::error!(error = %e, assign, "applying the rebalance failed");
            }
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                metrics::counter!(metric::REBALANCES_TOTAL, "kind" => RebalanceKind::Revoke.as_str()).increment(1);
                let generation = self.membership.rebalance();
                let partitions = partitions_of(tpl);
                tracing::info!(
                    partitions = partitions.len(),
                    "partitions revoked; draining"
                );
                // The hub is gone at the very end of a shutdown; nothing to drain then.
                let drained = rebalance::request_drain(
                    &self.hub.control_tx,
                    partitions,
                    generation,
                    self.hub.drain_timeout,
                );
                // Positions the hub sent before answering come first.
                self.store_sent_positions(consumer);
                if let Some(txn) = &self.txn {
                    let ended =
                        txn.end_at_revoke(&self.thread(consumer), &partitions_of(tpl), drained);
                    self.on_transaction_fatal(ended);
                } else {
                    if let Some(positions) = drained {
                        store(consumer, &positions);
                    }
                    commit(consumer, CommitMode::Sync);
                }
                // Also for lost partitions (eviction): the assignment checks
                // the positions against the group's committed offsets.
                self.membership.mark_revoked();
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => {
                metrics::counter!(metric::ERRORS_TOTAL, "kind" => ErrorKind::Rebalance.as_str())
                    .increment(1);
                tracing::error!(error = %e, "rebalance error");
            }
        }
    }

    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        // A commit that failed for some or every partition may carry its
        // errors on the partitions alone, with no error of its own.
        let result = result.and_then(|()| {
            offsets
                .elements()
                .iter()
                .find_map(|p| p.error().err()?.rdkafka_error_code())
                .map_or(Ok(()), |code| Err(KafkaError::ConsumerCommit(code)))
        });
        match result {
            Ok(()) => {
                metrics::counter!(metric::COMMITS_TOTAL, "outcome" => CommitOutcome::Ok.as_str())
                    .increment(1);
                tracing::debug!(partitions = offsets.count(), "offsets committed");
            }
            Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                metrics::counter!(metric::COMMITS_TOTAL, "outcome" => CommitOutcome::Error.as_str()).increment(1);
                self.health.faults.commit_failed();
                tracing::warn!(error = %e, "offset commit failed; the next commit carries the offsets again");
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            metrics::counter!(metric::REBALANCES_TOTAL, "kind" => RebalanceKind::Assign.as_str())
                .increment(1);
            self.membership.rebalance();
            tracing::info!(partitions = tpl.count(), "partitions assigned");
        }
    }
}
