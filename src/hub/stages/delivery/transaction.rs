//! The hub's side of exactly-once (`kafka.delivery = "exactly_once"`,
//! protocol in [`crate::consumer::rebalance`], transactions in
//! [`crate::producer::transaction`]).
//!
//! A transaction must hold exactly the records of the offsets it commits:
//! a record in it whose offset is not committed comes again after a crash
//! (a duplicate); an offset committed whose record is not in it is lost. So
//! at a transaction's end the hub *seals*: it hands nothing more to the
//! producer, and once every record handed over is acknowledged it answers
//! the positions of its partitions, which then cover exactly the records
//! handed over (verdicts and dead-letter records of a partition are handed
//! over in offset order, see `Hub::dead_letter`). Records ready meanwhile
//! wait, in order, until the consumer thread unseals (the next transaction
//! has begun). A failed delivery, or a seal not acknowledged by its
//! deadline, makes the answer ask for an abort; after an abort the consumer
//! seeks the partitions back and the hub drops their state (its
//! `on_rewind`).

use std::collections::HashSet;

use crate::consumer::rebalance::Sealed;
use crate::tp::{Positions, Tp};
use tokio::time::Instant;

/// Where the open transaction is.
#[derive(Default)]
pub(crate) enum Seal {
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

/// The transaction boundary: the exactly-once state of the hub. It decides
/// whether a record goes to the producer or waits, counts what is handed
/// over and acknowledged, and answers a seal; the hub only routes.
#[derive(Default)]
pub(crate) struct TxnBoundary {
    seal: Seal,
    /// Outputs ready while sealed, handed over at the unseal.
    held: Vec<super::ReadyOutput>,
    /// Records handed to the producer and not yet acknowledged.
    outstanding: usize,
    /// Records handed over since the last seal.
    records: u64,
    /// A delivery of this transaction failed: it must be aborted.
    failed: Option<String>,
    /// Counts the transactions begun: an acknowledgement of an earlier one
    /// (a record of an aborted transaction, failed or purged late) is
    /// not the open transaction's.
    epoch: TxnEpoch,
}

/// Which transaction of this hub's a record was handed over in (counted
/// from 0 with at-least-once, where there is one): not Kafka's producer
/// epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TxnEpoch(u64);

/// Where a record's outputs go now.
pub(crate) enum HandOver {
    /// Sealed: they wait until the unseal ([`TxnBoundary::hold`]).
    Hold,
    /// To the producer, as records of the transaction `epoch` (counted).
    Send { epoch: TxnEpoch },
}

impl TxnBoundary {
    /// A record's outputs are ready: where they go.
    pub fn hand_over(&mut self) -> HandOver {
        if !matches!(self.seal, Seal::Open) {
            return HandOver::Hold;
        }
        self.outstanding += 1;
        self.records += 1;
        HandOver::Send { epoch: self.epoch }
    }

    /// Keeps outputs ready while sealed, in order, for the unseal.
    pub fn hold(&mut self, ready: super::ReadyOutput) {
        self.held.push(ready);
    }

    /// A record of transaction `epoch` was acknowledged, or failed with
    /// `failed`. One of an earlier transaction (its partition was rewound)
    /// concerns neither the open transaction's count nor its fate.
    pub fn acknowledged(&mut self, epoch: TxnEpoch, failed: Option<&str>) {
        if epoch != self.epoch {
            return;
        }
        self.outstanding = self.outstanding.saturating_sub(1);
        if let Some(error) = failed {
            self.failed.get_or_insert_with(|| error.to_string());
        }
    }

    /// The consumer thread ends the transaction: hand nothing more over,
    /// answer `reply` once everything handed over is acknowledged.
    pub fn seal(&mut self, deadline: Instant, reply: std::sync::mpsc::Sender<Sealed>) {
        self.seal = Seal::Sealing { deadline, reply };
    }

    /// When a seal must be answered, acknowledged or not.
    pub fn deadline(&self) -> Option<Instant> {
        match self.seal {
            Seal::Sealing { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// Answer a seal with `positions` once everything handed over is
    /// acknowledged, or at its deadline (then the transaction must be
    /// aborted).
    pub fn answer_seal(&mut self, positions: impl FnOnce() -> Positions) {
        let Seal::Sealing { deadline, .. } = self.seal else {
            return;
        };
        let late = Instant::now() >= deadline;
        if self.outstanding > 0 && !late {
            return;
        }
        let Seal::Sealing { reply, .. } = std::mem::replace(&mut self.seal, Seal::Sealed) else {
            return;
        };
        let abort = self.failed.take().or_else(|| {
            late.then(|| {
                format!(
                    "{} records not acknowledged by the transaction's deadline",
                    self.outstanding
                )
            })
        });
        let sealed = Sealed {
            positions: positions(),
            records: std::mem::take(&mut self.records),
            abort,
        };
        let _ = reply.send(sealed);
    }

    /// The next transaction began: the outputs that waited, in order, to
    /// hand over again.
    pub fn unseal(&mut self) -> Vec<super::ReadyOutput> {
        self.seal = Seal::Open;
        // What the last transaction handed over is acknowledged (a commit)
        // or aborted with it; from here on only this one's records count.
        self.epoch.0 += 1;
        self.outstanding = 0;
        self.failed = None;
        std::mem::take(&mut self.held)
    }

    /// Drops the waiting outputs of rewound partitions; how many.
    pub fn drop_held(&mut self, rewound: &HashSet<&Tp>) -> usize {
        let before = self.held.len();
        self.held.retain(|h| !rewound.contains(&h.at.tp));
        before - self.held.len()
    }
}
