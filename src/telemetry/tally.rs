//! Faults one run met and got past, counted for that run alone: the metrics
//! count them for the whole process, so a caller that runs several
//! pipelines in one process (the tests, the bench) reads its own run's here.

use std::sync::atomic::{AtomicU64, Ordering};

/// Written by the stages that meet each fault; read at the end of the run
/// into [`FaultCounts`].
#[derive(Debug, Default)]
pub struct FaultTally {
    commit_failures: AtomicU64,
    delivery_failures: AtomicU64,
    resends: AtomicU64,
    most_stalled: AtomicU64,
}

/// What a [`FaultTally`] counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounts {
    /// Offset commits that failed (`modstream_commits_total{outcome="error"}`).
    pub commit_failures: u64,
    /// Failed delivery attempts (`modstream_delivery_failures_total`).
    pub delivery_failures: u64,
    /// Records modstream itself sent again after a failed attempt (beyond
    /// librdkafka's own retries).
    pub resends: u64,
    /// The most partitions stalled at once, of either kind
    /// (`modstream_stalled_partitions`' highest value).
    pub most_stalled: u64,
}

impl FaultTally {
    pub fn commit_failed(&self) {
        self.commit_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn delivery_failed(&self) {
        self.delivery_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn resent(&self) {
        self.resends.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stalled_now(&self, partitions: usize) {
        self.most_stalled
            .fetch_max(partitions as u64, Ordering::Relaxed);
    }

    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            commit_failures: self.commit_failures.load(Ordering::Relaxed),
            delivery_failures: self.delivery_failures.load(Ordering::Relaxed),
            resends: self.resends.load(Ordering::Relaxed),
            most_stalled: self.most_stalled.load(Ordering::Relaxed),
        }
    }
}
