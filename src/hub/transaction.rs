//! The hub's side of exactly-once (`kafka.delivery = "exactly_once"`,
//! protocol in [`crate::rebalance`], transactions in
//! [`crate::transaction`]).
//!
//! A transaction must hold exactly the records of the offsets it commits:
//! a record in it whose offset is not committed comes again after a crash
//! (a duplicate); an offset committed whose record is not in it is lost. So
//! at a transaction's end the hub *seals*: it hands nothing more to the
//! producer, and once every record handed over is acknowledged it answers
//! the positions of its partitions, which then cover exactly the records
//! handed over (verdicts and dead-letter records of a partition are handed
//! over in offset order, see [`super::intake`]). Records ready meanwhile
//! wait, in order, until the consumer thread unseals (the next transaction
//! has begun). A failed delivery, or a seal not acknowledged by its
//! deadline, makes the answer ask for an abort; after an abort the consumer
//! seeks the partitions back and the hub drops their state ([`Hub::on_rewind`]).

use std::collections::HashSet;

use super::{Deliver, Hub};
use crate::rebalance::Sealed;
use crate::tp::Tp;
use tokio::time::Instant;

/// Where the open transaction is.
#[derive(Default)]
pub(super) enum Seal {
    /// Records go to the producer as they are ready.
    #[default]
    Open,
    /// Waiting for the records handed over to be acknowledged.
    Sealing {
        deadline: Instant,
        reply: std::sync::mpsc::Sender<Sealed>,
    },
    /// Answered; the consumer thread commits or aborts.
    Sealed,
}

/// The exactly-once state of the hub.
#[derive(Default)]
pub(super) struct TxnState {
    pub seal: Seal,
    /// Outputs ready while sealed, handed over at the unseal.
    pub held: Vec<super::ReadyOutput>,
    /// Records handed to the producer and not yet acknowledged.
    pub outstanding: usize,
    /// Records handed over since the last seal.
    pub records: u64,
    /// A delivery of this transaction failed: it must be aborted.
    pub failed: Option<String>,
    /// Counts the transactions begun: an acknowledgement of an earlier one
    /// (a record of an aborted transaction, failed or purged late) is
    /// not the open transaction's.
    pub epoch: u64,
}

impl TxnState {
    /// Whether records wait instead of going to the producer.
    pub fn holding(&self) -> bool {
        !matches!(self.seal, Seal::Open)
    }

    pub fn deadline(&self) -> Option<Instant> {
        match self.seal {
            Seal::Sealing { deadline, .. } => Some(deadline),
            _ => None,
        }
    }
}

impl<D: Deliver> Hub<D> {
    pub(super) fn on_seal(&mut self, deadline: Instant, reply: std::sync::mpsc::Sender<Sealed>) {
        if let Some(txn) = self.txn.as_mut() {
            txn.seal = Seal::Sealing { deadline, reply };
        } else {
            // At-least-once never seals; answer so that nothing waits.
            let _ = reply.send(Sealed::default());
        }
    }

    /// Answer a seal once everything handed over is acknowledged, or at its
    /// deadline (then the transaction must be aborted).
    pub(super) fn answer_seal(&mut self) {
        let Some(txn) = self.txn.as_mut() else {
            return;
        };
        let Seal::Sealing { deadline, .. } = txn.seal else {
            return;
        };
        let late = Instant::now() >= deadline;
        if txn.outstanding > 0 && !late {
            return;
        }
        let Seal::Sealing { reply, .. } = std::mem::replace(&mut txn.seal, Seal::Sealed) else {
            return;
        };
        let abort = txn.failed.take().or_else(|| {
            late.then(|| {
                format!(
                    "{} records not acknowledged by the transaction's deadline",
                    txn.outstanding
                )
            })
        });
        let sealed = Sealed {
            positions: self
                .positions
                .iter()
                .map(|(t, p)| (t.clone(), *p))
                .collect(),
            records: std::mem::take(&mut txn.records),
            abort,
        };
        let _ = reply.send(sealed);
    }

    /// The next transaction began: the records that waited go out, in order.
    pub(super) fn on_unseal(&mut self) {
        let Some(txn) = self.txn.as_mut() else {
            return;
        };
        txn.seal = Seal::Open;
        // What the last transaction handed over is acknowledged (a commit)
        // or aborted with it; from here on only this one's records count.
        txn.epoch += 1;
        txn.outstanding = 0;
        txn.failed = None;
        let held = std::mem::take(&mut txn.held);
        for ready in held {
            self.deliver(ready);
        }
    }

    /// The transaction was aborted and the consumer sought `partitions` back
    /// to their committed offsets: everything of theirs in the hub goes
    /// (results still in inference, and acknowledgements of the aborted
    /// records, are dropped when they come back: their partition state is
    /// gone or newer); records polled before `generation` are stale.
    pub(super) fn on_rewind(
        &mut self,
        partitions: Vec<Tp>,
        generation: u64,
        done: std::sync::mpsc::Sender<()>,
    ) {
        let rewound: HashSet<&Tp> = partitions.iter().collect();
        let mut dropped = 0;
        if let Some(txn) = self.txn.as_mut() {
            let before = txn.held.len();
            txn.held.retain(|h| !rewound.contains(&h.at.tp));
            dropped += before - txn.held.len();
        }
        self.flush(&partitions);
        for tp in &partitions {
            if let Some(partition) = self.partitions.remove(tp) {
                dropped += partition.held_back();
            }
            self.positions.remove(tp);
            self.unsent_positions.remove(tp);
        }
        dropped += self.drop_queued(&rewound);
        self.release(dropped);
        self.revokes.rewound(&partitions, generation);
        self.summary.rewinds += 1;
        tracing::debug!(
            partitions = partitions.len(),
            dropped,
            "rewound after an abort"
        );
        let _ = done.send(());
    }
}
