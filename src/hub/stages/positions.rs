//! The positions the hub hands the consumer thread to store and commit: a
//! part that owns the last position of each owned partition and those the
//! thread has not taken yet. One batch at a time goes over the channel, the
//! latest position of each partition, so the channel never backs up.

use std::time::Duration;

use tokio::time::Instant;

use crate::tp::{Position, Positions, Tp};

/// How soon the hub tries again to hand positions over when the consumer
/// thread has not taken the previous batch yet.
const RETRY: Duration = Duration::from_millis(10);

pub(crate) struct PositionBook {
    // foldhash: looked up per acknowledgement, where SipHash's DoS
    // resistance buys nothing (keys are the assignment).
    /// The last position of each owned partition.
    last: foldhash::HashMap<Tp, i64>,
    /// Positions not handed over yet, later ones replacing earlier ones.
    unsent: foldhash::HashMap<Tp, i64>,
    to_consumer: async_channel::Sender<Positions>,
}

impl PositionBook {
    pub fn new(to_consumer: async_channel::Sender<Positions>) -> PositionBook {
        PositionBook {
            last: Default::default(),
            unsent: Default::default(),
            to_consumer,
        }
    }

    /// A partition's position moved.
    pub fn moved(&mut self, tp: Tp, next: i64) {
        self.last.insert(tp.clone(), next);
        self.unsent.insert(tp, next);
    }

    /// Hands the waiting positions over once the consumer thread took the
    /// previous batch; else they keep waiting (see [`Self::retry_at`]).
    pub fn send(&mut self) {
        if self.unsent.is_empty() || !self.to_consumer.is_empty() {
            return;
        }
        let batch: Positions = self.unsent.drain().map(Position::from).collect();
        if let Err(async_channel::TrySendError::Full(batch)) = self.to_consumer.try_send(batch) {
            self.unsent
                .extend(batch.into_iter().map(|p| (p.tp, p.next)));
        }
    }

    /// When to try handing over again; None when nothing waits.
    pub fn retry_at(&self) -> Option<Instant> {
        (!self.unsent.is_empty()).then(|| Instant::now() + RETRY)
    }

    /// Positions the consumer thread applied at an assignment (partitions
    /// that came straight back resume there).
    pub fn resumed(&mut self, positions: Positions) {
        self.last
            .extend(positions.into_iter().map(|p| (p.tp, p.next)));
    }

    /// A revoked partition leaves: its position for the revoke's answer
    /// (`last_of_state`, its state's final one, when it has one), and it
    /// is forgotten here (the answer carries it, not the channel).
    pub fn revoked(&mut self, tp: &Tp, last_of_state: Option<i64>) -> Option<Position> {
        self.unsent.remove(tp);
        let last = self.last.remove(tp);
        last_of_state.or(last).map(|next| Position {
            tp: tp.clone(),
            next,
        })
    }

    /// A partition rewound after an abort: its positions are of the
    /// aborted records.
    pub fn forget(&mut self, tp: &Tp) {
        self.last.remove(tp);
        self.unsent.remove(tp);
    }

    /// Every owned partition's last position (a transaction's seal).
    pub fn all(&self) -> Positions {
        self.last
            .iter()
            .map(|(tp, next)| Position::from((tp.clone(), *next)))
            .collect()
    }

    /// At the end: whatever waits goes over, waiting for room.
    pub async fn flush(&mut self) {
        let last: Positions = self.unsent.drain().map(Position::from).collect();
        if !last.is_empty() {
            let _ = self.to_consumer.send(last).await;
        }
    }
}
