//! The rebalance protocol between the consumer thread and the hub, both
//! sides in one place.
//!
//! librdkafka runs the rebalance callback on the consumer thread, inside a
//! poll. Positions (the next offset to read of a partition, everything
//! before it delivered) have one owner, the hub; the consumer thread learns
//! them by message and only hands them to librdkafka.
//!
//! **Revoke.** The callback ([`request_drain`]) sends [`Control::Revoke`]
//! and blocks, at most `kafka.drain_timeout` (kept below
//! `session.timeout.ms` by config validation), for the answer. The hub
//! ([`Revokes`]) closes the partitions' open batches at once, lets what is
//! in inference and delivery finish, then drops their state and answers with
//! their final positions (also when its time is up: the rest stays
//! uncommitted for the next owner). Records of those partitions polled
//! before the revoke carry an older generation and are dropped as stale. The
//! callback stores the answered positions and commits synchronously.
//!
//! **Assign.** The commit made in a revoke can be refused
//! (REBALANCE_IN_PROGRESS) or fail; a partition that comes straight back
//! would then restart at an old committed offset. So, after a revoke, the
//! callback asks the hub ([`request_resume`]) for the positions it answered
//! in the last revoke; those ahead of the group's committed offset (another
//! member may have gone further) become the start positions, and the hub is
//! told which were applied ([`Control::Resumed`]) so that the next
//! revoke answers them again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

pub use crate::tp::Positions;
use crate::tp::{Generation, Position, Tp};

/// The consumer thread's control messages to the hub, on their own channel:
/// the rebalance callback's revokes and assignments, and with exactly-once
/// the ends of transactions (seal, unseal, rewind).
#[derive(Debug)]
pub enum Control {
    /// Drain these partitions, then answer with their positions on `done`.
    Revoke {
        partitions: Vec<Tp>,
        generation: Generation,
        done: std::sync::mpsc::Sender<Positions>,
    },
    /// Which of these partitions have a position from the last revoke?
    Assign {
        partitions: Vec<Tp>,
        reply: std::sync::mpsc::Sender<Positions>,
    },
    /// These positions were applied to the new assignment and stored.
    Resumed { positions: Positions },
    /// Exactly-once, the end of a transaction: hand nothing more to the
    /// producer; once every record handed over is acknowledged (or at
    /// `deadline`), answer what the transaction holds. Records ready
    /// meanwhile wait for [`Control::Unseal`].
    Seal {
        deadline: Instant,
        reply: std::sync::mpsc::Sender<Sealed>,
    },
    /// The transaction ended (committed or aborted) and the next began.
    Unseal,
    /// The transaction was aborted and these partitions were sought back to
    /// their committed offsets: drop their state (their events are read
    /// again, polled in `generation`), then answer on `done`.
    Rewind {
        partitions: Vec<Tp>,
        generation: Generation,
        done: std::sync::mpsc::Sender<()>,
    },
}

/// The hub's answer to a seal: the position of every owned partition,
/// the records handed to the producer since the last seal, and why the
/// transaction must be aborted instead of committed, if it must.
#[derive(Debug, Default)]
pub struct Sealed {
    pub positions: Positions,
    pub records: u64,
    pub abort: Option<String>,
}

/// Why a seal got no answer.
#[derive(Debug, PartialEq, Eq)]
pub enum SealFailure {
    /// The hub has stopped (the end of a shutdown): nothing is in flight.
    Gone,
    /// No answer by the deadline and a grace second.
    NoAnswer,
}

/// Consumer side of a transaction's end: the hub's [`Sealed`] answer.
pub fn request_seal(tx: &mpsc::Sender<Control>, deadline: Instant) -> Result<Sealed, SealFailure> {
    let (reply, answer) = std::sync::mpsc::channel();
    tx.blocking_send(Control::Seal { deadline, reply })
        .map_err(|_| SealFailure::Gone)?;
    let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
    answer.recv_timeout(wait).map_err(|e| match e {
        std::sync::mpsc::RecvTimeoutError::Disconnected => SealFailure::Gone,
        std::sync::mpsc::RecvTimeoutError::Timeout => SealFailure::NoAnswer,
    })
}

/// Consumer side of an abort: the hub dropped these partitions' state
/// (waits at most `timeout`; false if the hub is gone).
pub fn request_rewind(
    tx: &mpsc::Sender<Control>,
    partitions: Vec<Tp>,
    generation: Generation,
    timeout: Duration,
) -> bool {
    let (done, answer) = std::sync::mpsc::channel();
    tx.blocking_send(Control::Rewind {
        partitions,
        generation,
        done,
    })
    .is_ok()
        && answer.recv_timeout(timeout).is_ok()
}

/// Consumer side of a revoke: ask the hub to drain `partitions` and wait for
/// their positions, at most `timeout`. `None` when the hub is gone (end of a
/// shutdown) or did not answer in time; the caller commits what it stored.
pub fn request_drain(
    tx: &mpsc::Sender<Control>,
    partitions: Vec<Tp>,
    generation: Generation,
    timeout: Duration,
) -> Option<Positions> {
    let (done, drained) = std::sync::mpsc::channel();
    tx.blocking_send(Control::Revoke {
        partitions,
        generation,
        done,
    })
    .ok()?;
    match drained.recv_timeout(timeout) {
        Ok(positions) => Some(positions),
        Err(_) => {
            tracing::warn!(
                waited_ms = timeout.as_millis() as u64,
                "drain timed out; undelivered events will be reprocessed by the next owner"
            );
            None
        }
    }
}

/// Consumer side of an assignment after a revoke: the positions the hub
/// answered in the last revoke for these partitions (empty if none).
pub fn request_resume(
    tx: &mpsc::Sender<Control>,
    partitions: Vec<Tp>,
    timeout: Duration,
) -> Positions {
    let (reply, answer) = std::sync::mpsc::channel();
    if tx
        .blocking_send(Control::Assign { partitions, reply })
        .is_err()
    {
        return Vec::new();
    }
    answer.recv_timeout(timeout).unwrap_or_default()
}

/// A revoke the hub has not answered yet.
struct PendingRevoke {
    partitions: Vec<Tp>,
    deadline: Instant,
    done: std::sync::mpsc::Sender<Positions>,
}

/// Hub side: revokes waiting for their partitions to drain, the generation
/// at which each partition was last revoked, and the positions answered by
/// the last revoke (for a partition that comes straight back).
#[derive(Default)]
pub struct Revokes {
    pending: Vec<PendingRevoke>,
    /// Read per record (foldhash: see the hub's partitions).
    revoked_at: foldhash::HashMap<Tp, Generation>,
    resume_at: HashMap<Tp, i64>,
}

impl Revokes {
    /// Start a revoke: its partitions' older records are stale from now on.
    pub fn start(
        &mut self,
        partitions: Vec<Tp>,
        generation: Generation,
        drain_timeout: Duration,
        done: std::sync::mpsc::Sender<Positions>,
    ) {
        for tp in &partitions {
            self.revoked_at.insert(tp.clone(), generation);
        }
        self.pending.push(PendingRevoke {
            partitions,
            deadline: Instant::now() + drain_timeout,
            done,
        });
    }

    /// Records of these partitions polled before `generation` are stale
    /// (an abort sought them back).
    pub fn rewound(&mut self, partitions: &[Tp], generation: Generation) {
        for tp in partitions {
            self.revoked_at.insert(tp.clone(), generation);
            self.resume_at.remove(tp);
        }
    }

    /// Whether a record of `tp` polled in `generation` was polled before
    /// the partition's last revoke.
    pub fn is_stale(&self, tp: &Tp, generation: Generation) -> bool {
        self.revoked_at.get(tp).is_some_and(|g| generation < *g)
    }

    /// The earliest drain deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.iter().map(|r| r.deadline).min()
    }

    /// Revokes that may be answered now: every partition drained
    /// (`in_flight(tp) == 0`), time up, or `force`. Their partitions are
    /// returned with the senders to answer on, through [`Revokes::answer`].
    pub fn ready(
        &mut self,
        force: bool,
        in_flight: impl Fn(&Tp) -> usize,
    ) -> Vec<(Vec<Tp>, std::sync::mpsc::Sender<Positions>)> {
        let now = Instant::now();
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let revoke = &self.pending[i];
            let drained = revoke.partitions.iter().all(|tp| in_flight(tp) == 0);
            if drained || force || now >= revoke.deadline {
                let revoke = self.pending.swap_remove(i);
                ready.push((revoke.partitions, revoke.done));
            } else {
                i += 1;
            }
        }
        ready
    }

    /// Answer a revoke with its partitions' positions, and keep them for an
    /// assignment that brings the partitions straight back.
    pub fn answer(&mut self, positions: Positions, done: std::sync::mpsc::Sender<Positions>) {
        self.resume_at = positions.iter().map(|p| (p.tp.clone(), p.next)).collect();
        let _ = done.send(positions);
    }

    /// The positions kept from the last revoke for these partitions; all
    /// kept positions are forgotten (they only serve the next assignment).
    pub fn take_resume(&mut self, partitions: &[Tp]) -> Positions {
        let wanted: HashSet<&Tp> = partitions.iter().collect();
        self.resume_at
            .drain()
            .filter(|(tp, _)| wanted.contains(tp))
            .map(Position::from)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn at(p: i32, next: i64) -> Position {
        Position { tp: tp(p), next }
    }

    fn tp(p: i32) -> Tp {
        Tp {
            topic: Arc::from("t"),
            partition: p,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoke_is_answered_once_drained_or_at_its_deadline() {
        let mut revokes = Revokes::default();
        let (done, answers) = std::sync::mpsc::channel();
        revokes.start(
            vec![tp(0), tp(1)],
            Generation(3),
            Duration::from_secs(2),
            done,
        );
        assert!(revokes.is_stale(&tp(0), Generation(2)));
        assert!(!revokes.is_stale(&tp(0), Generation(3)));
        assert!(!revokes.is_stale(&tp(2), Generation(0)));
        // Partition 1 still has events in flight: not yet.
        assert!(
            revokes
                .ready(false, |t| (t.partition == 1) as usize)
                .is_empty()
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        let ready = revokes.ready(false, |_| 5);
        assert_eq!(ready.len(), 1, "the deadline answers it anyway");
        let (partitions, done) = ready.into_iter().next().unwrap();
        assert_eq!(partitions, vec![tp(0), tp(1)]);
        revokes.answer(vec![at(0, 42)], done);
        assert_eq!(answers.try_recv().unwrap(), vec![at(0, 42)]);
        assert!(revokes.next_deadline().is_none());
        // Kept for an assignment that brings partition 0 back, once.
        assert_eq!(revokes.take_resume(&[tp(0), tp(1)]), vec![at(0, 42)]);
        assert!(revokes.take_resume(&[tp(0)]).is_empty());
    }
}
