//! Exactly-once on the consumer thread: the state of the transactions, the
//! decision at the end of each, and the end itself (seal, commit, or abort,
//! seek back and rewind the hub). The consumer context only calls in: at a
//! revoke ([`Txn::end_at_revoke`]); the poll loop
//! at each commit interval and at shutdown. The hub's side (handing records
//! over, the seal's answer, dropping rewound partitions) is
//! `hub::transaction`; the producer's transactional calls are
//! [`crate::producer::transaction`].
//!
//! Every `kafka.commit_interval`, after a revoke's drain, and at shutdown,
//! the consumer thread asks the hub to seal (nothing more goes to the
//! producer; everything handed over acknowledged), then sends the sealed
//! positions with the group's metadata and commits. If the hub asks for an
//! abort (a delivery failed, the seal's deadline passed), the revoke could
//! not drain, or the commit fails or takes longer than
//! `kafka.transaction_timeout`, the transaction is aborted, every partition
//! still owned is sought back to the offset this member last committed (or,
//! before a first commit, the offset it started at), and the hub drops
//! their state: their events are read and scored again, and only the next
//! transaction's records become visible to `read_committed` readers.
//! Fenced or fatal: the pipeline stops non-zero, writing nothing more.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::partitions_of;
use crate::consumer::rebalance::{self, Control, SealFailure, Sealed};
use crate::producer::transaction::{TransactionError, Transactions};
use crate::telemetry::Health;
use crate::telemetry::metric::TxnOutcome;
use crate::tp::{Generation, Position, Positions, Tp};

/// What the consumer thread needs for exactly-once.
pub struct ExactlyOnce {
    pub transactions: Transactions,
    pub health: Arc<Health>,
    pub timeout: Duration,
    /// The shutdown gave up on deliveries: the last transaction is aborted.
    pub shutdown_abort: CancellationToken,
}

/// The transactions' state on the consumer thread.
pub struct TxnDriver {
    pub(super) eo: ExactlyOnce,
    /// Since when a transaction's end has been running (read by the watchdog).
    pub(super) busy: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Positions the hub sent or answered since the last commit.
    pending: HashMap<Tp, i64>,
    /// Positions this member committed, per owned partition.
    committed: HashMap<Tp, i64>,
    /// The first offset polled of each owned partition since its assignment.
    started_at: HashMap<Tp, i64>,
}

/// Why a transaction ends.
pub(super) enum End<'a> {
    Interval,
    /// A revoke of these partitions; `drained`: the hub answered in time.
    Revoke {
        revoked: &'a [Tp],
        drained: bool,
    },
    /// The hub is gone; everything it delivered was sent as positions.
    Shutdown,
}

impl End<'_> {
    pub fn revoked(&self) -> &[Tp] {
        match self {
            End::Revoke { revoked, .. } => revoked,
            _ => &[],
        }
    }

    /// After an abort, the partitions whose state the hub drops: those
    /// still `owned` (sought back) and those this end revokes (no longer
    /// ours: what the hub still holds of them belongs to the aborted
    /// transaction and would otherwise go out in the next one while their
    /// new owner reads them again from the committed offset).
    pub fn dropped_after_abort(&self, owned: Vec<Tp>) -> Vec<Tp> {
        let mut dropped = owned;
        dropped.extend(
            self.revoked()
                .iter()
                .filter(|tp| !dropped.contains(tp))
                .cloned()
                .collect::<Vec<_>>(),
        );
        dropped
    }
}

/// What to do with the open transaction.
pub(super) enum Decision {
    Commit { records: Option<u64> },
    Abort { why: TxnOutcome, reason: String },
}

impl TxnDriver {
    pub fn new(eo: ExactlyOnce) -> TxnDriver {
        let busy = Arc::default();
        spawn_watchdog(Arc::clone(&busy), eo.health.clone(), eo.timeout);
        TxnDriver {
            eo,
            busy,
            pending: HashMap::new(),
            committed: HashMap::new(),
            started_at: HashMap::new(),
        }
    }

    /// Where an owned partition started (its first offset polled).
    pub(super) fn note_polled(&mut self, tp: &Tp, offset: i64) {
        if !self.started_at.contains_key(tp) {
            self.started_at.insert(tp.clone(), offset);
        }
    }

    /// Positions from the hub, for the next commit.
    pub(super) fn keep(&mut self, positions: Positions) {
        for Position { tp, next: position } in positions {
            // A batch sent earlier never moves a partition back.
            let kept = self.pending.entry(tp).or_insert(position);
            *kept = (*kept).max(position);
        }
    }

    /// Commit or abort, from how the transaction ends and the hub's answer
    /// to the seal (`None`: not asked, at shutdown).
    pub(super) fn decide(
        &mut self,
        end: &End<'_>,
        sealed: Option<Result<Sealed, SealFailure>>,
    ) -> Decision {
        let (records, hub_abort) = match sealed {
            Some(Ok(s)) => {
                self.keep(s.positions);
                (Some(s.records), s.abort)
            }
            Some(Err(_)) => (None, Some("the hub did not answer the seal".to_string())),
            None => (None, None),
        };
        let abort = match end {
            End::Revoke { drained: false, .. } => Some((
                TxnOutcome::AbortedRebalance,
                "the revoke's drain timed out".to_string(),
            )),
            End::Shutdown if self.eo.shutdown_abort.is_cancelled() => Some((
                TxnOutcome::AbortedShutdown,
                "the pipeline stopped before everything was delivered (kafka.shutdown_timeout, or a fatal producer error)".to_string(),
            )),
            _ => hub_abort.map(|why| (TxnOutcome::AbortedFailed, why)),
        };
        match abort {
            Some((why, reason)) => Decision::Abort { why, reason },
            None => Decision::Commit { records },
        }
    }

    /// Commit the pending positions (nothing when nothing happened since
    /// the last commit). `group`: the consumer's group metadata now.
    pub(super) fn commit(
        &mut self,
        group: Option<ConsumerGroupMetadata>,
        records: Option<u64>,
    ) -> Result<(), TransactionError> {
        let moved: Positions = self
            .pending
            .iter()
            .filter(|(tp, p)| self.committed.get(*tp) != Some(*p))
            .map(|(tp, p)| Position::from((tp.clone(), *p)))
            .collect();
        if moved.is_empty() && records.unwrap_or(0) == 0 {
            self.pending.clear();
            return Ok(());
        }
        let group =
            group.ok_or_else(|| TransactionError::Abortable("no group metadata".to_string()))?;
        self.eo
            .transactions
            .commit(&moved, &group, records.unwrap_or(0))?;
        self.committed.extend(self.pending.drain());
        Ok(())
    }

    /// Abort: what the hub sent since the last commit no longer counts.
    pub(super) fn abort(&mut self, why: TxnOutcome) -> Result<(), TransactionError> {
        self.pending.clear();
        self.eo.transactions.abort(why)
    }

    /// Where each of `owned` goes back to after an abort: this member's last
    /// commit, else where it started; partitions nothing was read from
    /// stay where they are.
    pub(super) fn rewind_targets(&self, owned: &[Tp]) -> Positions {
        owned
            .iter()
            .filter_map(|tp| {
                let target = self.committed.get(tp).or(self.started_at.get(tp))?;
                Some(Position {
                    tp: tp.clone(),
                    next: *target,
                })
            })
            .collect()
    }

    /// Revoked partitions are forgotten.
    pub(super) fn forget(&mut self, revoked: &[Tp]) {
        for tp in revoked {
            self.committed.remove(tp);
            self.started_at.remove(tp);
            self.pending.remove(tp);
        }
    }
}

/// How many `kafka.transaction_timeout`s a transaction's end may block
/// before the process stops.
const HUNG_AFTER_TIMEOUTS: u32 = 3;

/// What ending a transaction uses of the consumer thread (the consumer
/// context's parts; the context implements it for the call).
pub(super) trait Thread {
    type Context: ConsumerContext;
    fn consumer(&self) -> &BaseConsumer<Self::Context>;
    fn control_tx(&self) -> &mpsc::Sender<Control>;
    /// Takes the positions the hub sent so far (kept for the commit).
    fn take_sent(&self);
    /// Drops the positions the hub sent before a rewind: they are of the
    /// aborted records.
    fn discard_sent(&self);
    /// Starts a new membership generation (a rewind's).
    fn new_generation(&self) -> Generation;
}

/// Exactly-once cannot go on (fenced, a transaction that cannot end, a
/// partition that cannot be sought back): the pipeline stops on it.
#[derive(Debug)]
pub(super) struct TxnFatal(pub(super) String);

/// Exactly-once on the consumer thread: the transactions' state, locked
/// only by that thread (the watchdog reads `busy`).
pub struct Txn(std::sync::Mutex<TxnDriver>);

impl Txn {
    pub fn new(eo: ExactlyOnce) -> Txn {
        Txn(std::sync::Mutex::new(TxnDriver::new(eo)))
    }

    pub(super) fn note_polled(&self, tp: &Tp, offset: i64) {
        if let Ok(mut d) = self.0.lock() {
            d.note_polled(tp, offset);
        }
    }

    /// Positions from the hub, for the next commit.
    pub(super) fn keep(&self, positions: Positions) {
        if let Ok(mut d) = self.0.lock() {
            d.keep(positions);
        }
    }

    /// A revoke's drain ended (`drained`: the hub's answer, if it came in
    /// time): the transaction ends with it.
    pub(super) fn end_at_revoke(
        &self,
        thread: &impl Thread,
        revoked: &[Tp],
        drained: Option<Positions>,
    ) -> Result<(), TxnFatal> {
        let answered = drained.is_some();
        if let Some(positions) = drained {
            self.keep(positions);
        }
        let end = End::Revoke {
            revoked,
            drained: answered,
        };
        self.end(thread, end)
    }

    /// End the open transaction: commit what the hub sealed, or abort and
    /// rewind; then let the hub hand records to the next transaction.
    pub(super) fn end(&self, thread: &impl Thread, end: End<'_>) -> Result<(), TxnFatal> {
        let busy = self.0.lock().map(|d| d.busy.clone()).ok();
        let _busy = busy.as_deref().map(Busy::start);
        let shutdown = matches!(end, End::Shutdown);
        let sealed = if shutdown {
            None
        } else {
            let timeout = self.0.lock().map(|d| d.eo.timeout).unwrap_or_default();
            let deadline = tokio::time::Instant::now() + timeout;
            match rebalance::request_seal(thread.control_tx(), deadline) {
                // The hub stopped: the shutdown's end commits what it sent.
                Err(SealFailure::Gone) => return Ok(()),
                other => Some(other),
            }
        };
        thread.take_sent();
        let Ok(mut d) = self.0.lock() else {
            return Ok(());
        };
        let (why, error) = match d.decide(&end, sealed) {
            Decision::Commit { records } => {
                match d.commit(thread.consumer().group_metadata(), records) {
                    Ok(()) => {
                        d.eo.health.set_transaction_failing(None);
                        (None, None)
                    }
                    Err(e @ TransactionError::TimedOut { .. }) => {
                        (Some(TxnOutcome::AbortedTimeout), Some(e))
                    }
                    Err(e) => (Some(TxnOutcome::AbortedFailed), Some(e)),
                }
            }
            Decision::Abort { why, reason } => {
                (Some(why), Some(TransactionError::Abortable(reason)))
            }
        };
        let ended = match (why, error) {
            (_, Some(e @ (TransactionError::Fenced(_) | TransactionError::Fatal(_)))) => {
                tracing::error!(error = %e, "stopping: the transactional producer cannot go on");
                Err(TxnFatal(e.to_string()))
            }
            (Some(why), Some(e)) => abort_and_rewind(thread, &mut d, why, &e, &end),
            _ => Ok(()),
        };
        d.forget(end.revoked());
        drop(d);
        if !shutdown {
            let _ = thread.control_tx().blocking_send(Control::Unseal);
        }
        ended
    }
}

fn abort_and_rewind(
    thread: &impl Thread,
    d: &mut TxnDriver,
    why: TxnOutcome,
    error: &TransactionError,
    end: &End<'_>,
) -> Result<(), TxnFatal> {
    if why == TxnOutcome::AbortedTimeout {
        tracing::error!(error = %error, "transaction aborted: it could not commit in time; its events are read again");
        d.eo.health.set_transaction_failing(Some(error.to_string()));
    } else {
        tracing::warn!(error = %error, outcome = why.as_str(), "transaction aborted; its events are read again");
    }
    if let Err(e) = d.abort(why) {
        tracing::error!(error = %e, "stopping: the transaction cannot be aborted");
        return Err(TxnFatal(e.to_string()));
    }
    if matches!(end, End::Shutdown) {
        // Nothing is read any more: the next owner starts at the commit.
        return Ok(());
    }
    let owned: Vec<Tp> = thread
        .consumer()
        .assignment()
        .map(|a| partitions_of(&a))
        .unwrap_or_default()
        .into_iter()
        .filter(|tp| !end.revoked().contains(tp))
        .collect();
    for Position { tp, next: target } in d.rewind_targets(&owned) {
        let sought = thread.consumer().seek(
            &tp.topic,
            tp.partition,
            Offset::Offset(target),
            Duration::from_secs(5),
        );
        if let Err(e) = sought {
            // Going on would skip the aborted events: stop instead (a
            // restart reads from the committed offsets).
            tracing::error!(topic = %tp.topic, partition = tp.partition, error = %e, "cannot seek back after an abort");
            return Err(TxnFatal(format!(
                "cannot seek {tp:?} back after an abort: {e}"
            )));
        }
    }
    let generation = thread.new_generation();
    let dropped = end.dropped_after_abort(owned);
    rebalance::request_rewind(thread.control_tx(), dropped, generation, d.eo.timeout);
    thread.discard_sent();
    Ok(())
}

/// Marks a transaction's end as running until dropped (for the watchdog).
struct Busy<'a>(&'a std::sync::Mutex<Option<std::time::Instant>>);

impl<'a> Busy<'a> {
    fn start(slot: &'a std::sync::Mutex<Option<std::time::Instant>>) -> Busy<'a> {
        if let Ok(mut b) = slot.lock() {
            *b = Some(std::time::Instant::now());
        }
        Busy(slot)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Ok(mut b) = self.0.lock() {
            *b = None;
        }
    }
}

/// librdkafka bounds every transaction call by its timeout, except where it
/// does not: `send_offsets_to_transaction` can block past it while the
/// group coordinator is down (librdkafka issues 5456, 5511). The consumer
/// thread is stuck inside it then, so this thread watches each end of a
/// transaction as a whole (the seal's wait, the commit, an abort and the
/// seeks after it, as `Busy` marks them): past the
/// timeout (and 5 s) /readyz fails with the reason and one error is
/// logged; past three timeouts the process exits with status 70 (no abort
/// is possible while the call runs; a restart with the same transactional
/// id fences this producer and aborts its transaction). The held records
/// also show as stalled partitions meanwhile.
fn spawn_watchdog(
    busy: Arc<std::sync::Mutex<Option<Instant>>>,
    health: Arc<Health>,
    timeout: Duration,
) {
    let spawned = std::thread::Builder::new()
        .name("txn-watchdog".into())
        .spawn(move || {
            let mut reported = false;
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let since = busy.lock().ok().and_then(|b| *b);
                let Some(blocked) = since.map(|s| s.elapsed()) else {
                    reported = false;
                    continue;
                };
                if blocked > timeout + Duration::from_secs(5) && !reported {
                    reported = true;
                    let why = format!(
                        "a transaction's end has not returned for {} s (kafka.transaction_timeout is {} s): librdkafka waits for the group coordinator",
                        blocked.as_secs(),
                        timeout.as_secs()
                    );
                    tracing::error!(reason = %why, "transaction stuck");
                    health.set_transaction_failing(Some(why));
                }
                if blocked > timeout * HUNG_AFTER_TIMEOUTS {
                    tracing::error!(
                        blocked_s = blocked.as_secs(),
                        "stopping: a transaction's end is stuck in librdkafka; exiting so that a restart fences this producer"
                    );
                    std::process::exit(70);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the transaction watchdog");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abort_at_a_revoke_drops_the_revoked_partitions_too() {
        let (a, b) = (Tp::new("posts", 0), Tp::new("posts", 1));
        let revoked = [b.clone()];
        let end = End::Revoke {
            revoked: &revoked,
            drained: false,
        };
        assert_eq!(end.dropped_after_abort(vec![a.clone()]), vec![a.clone(), b]);
        assert_eq!(End::Interval.dropped_after_abort(vec![a.clone()]), vec![a]);
    }
}
