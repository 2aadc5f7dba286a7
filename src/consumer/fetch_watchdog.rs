//! The fetch watchdog of the consumer thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;

use super::{KafkaConsumer, partitions_of};
use crate::telemetry::{Health, Stall, StallKind, StallReporter};
use crate::tp::{Lag, Tp};

/// The fetch watchdog: an assigned partition that lags behind its end
/// (librdkafka statistics) yet gave no record for `limits.stall_after`,
/// while the pipeline took every record without pushing back all that
/// time, is not being fetched — by something below modstream (a pause flag
/// left behind, a stuck fetcher). It is reported like a stall (error log
/// once, `modstream_stalled_partitions`, /readyz). While the pipeline
/// pushes back, partitions wait for it: that is the hub's watchdog's
/// business.
pub(super) struct FetchWatchdog {
    lags_rx: std::sync::mpsc::Receiver<Vec<Lag>>,
    lags: HashMap<Tp, i64>,
    /// Written per record (foldhash: see the hub's partitions).
    last_record: foldhash::HashMap<Tp, Instant>,
    stalls: StallReporter,
    stall_after: Duration,
    next_check: Instant,
    /// When the pipeline last pushed back (channel or byte budget full).
    pushed_back: Instant,
}

impl FetchWatchdog {
    pub fn new(
        lags_rx: std::sync::mpsc::Receiver<Vec<Lag>>,
        health: Arc<Health>,
        stall_after: Duration,
    ) -> Self {
        FetchWatchdog {
            lags_rx,
            lags: HashMap::new(),
            last_record: Default::default(),
            stalls: StallReporter::new(StallKind::Unfetched, health),
            stall_after,
            next_check: Instant::now(),
            pushed_back: Instant::now(),
        }
    }

    pub fn pushed_back(&mut self) {
        self.pushed_back = Instant::now();
    }

    pub fn fetched(&mut self, tp: &Tp) {
        let now = Instant::now();
        match self.last_record.get_mut(tp) {
            Some(at) => *at = now,
            None => {
                self.last_record.insert(tp.clone(), now);
            }
        }
    }

    /// About once a second.
    pub fn check(&mut self, consumer: &KafkaConsumer, paused: bool) {
        let now = Instant::now();
        if now < self.next_check {
            return;
        }
        if paused {
            self.pushed_back = now;
        }
        self.next_check = now + Duration::from_secs(1);
        while let Ok(lags) = self.lags_rx.try_recv() {
            self.lags = lags.into_iter().map(|l| (l.tp, l.records)).collect();
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
        self.stalls.report(found, |tp| assigned.contains(tp));
    }

    pub fn stop(&mut self) {
        self.stalls.report(Vec::new(), |_| false);
    }
}

/// Partitions with a lag and no record for `stall_after`.
fn unfetched(
    lags: &HashMap<Tp, i64>,
    last_record: &foldhash::HashMap<Tp, Instant>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lagging_partition_without_records_is_reported_unfetched() {
        let tp = |p| Tp::new("posts", p);
        let now = Instant::now();
        let long_ago = now - Duration::from_secs(90);
        let lags: HashMap<Tp, i64> = [(tp(0), 500), (tp(1), 0), (tp(2), 7)].into();
        let last_record: foldhash::HashMap<Tp, Instant> = [
            (tp(0), long_ago), // lags, nothing for 90 s: not fetched
            (tp(1), long_ago), // at its end: nothing to fetch
            (tp(2), now),      // lags, but records come
            (tp(3), long_ago), // no statistics yet
        ]
        .into_iter()
        .collect();
        let found = unfetched(&lags, &last_record, now, Duration::from_secs(60));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].partition, found[0].pending), (0, 500));
        assert!(found[0].waiting_s >= 90);
    }
}
