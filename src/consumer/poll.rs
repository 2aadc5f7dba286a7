//! The poll loop: forward polled records to the hub in poll order, pause
//! the assignment under sustained backpressure, commit on the interval.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Headers};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::budget::{ByteBudget, Forward, Ingested, forward};
use super::exactly_once::End;
use super::fetch_watchdog::FetchWatchdog;
use super::{KafkaConsumer, commit, is_fatal, partitions_of};
use crate::telemetry::metric::{self, ErrorKind};
use crate::tp::{Generation, Tp};

/// How long the pipeline may stay full before the partitions are paused.
/// Well below `max.poll.interval.ms`: polling is suspended meanwhile.
const BACKPRESSURE_THRESHOLD: Duration = Duration::from_millis(500);

/// The loop's state: records polled while the pipeline was full (forwarded
/// before new ones), and whether the assignment is paused.
pub(super) struct PollLoop<'a> {
    pub consumer: &'a KafkaConsumer,
    pub budget: &'a ByteBudget,
    pub watchdog: &'a mut FetchWatchdog,
    pub records_tx: mpsc::Sender<Ingested>,
    pub commit_interval: Duration,
    backlog: VecDeque<Ingested>,
    paused: bool,
    backlog_since: Option<Instant>,
    topics: Topics,
    in_flight_bytes: metrics::Gauge,
}

/// Each input topic's name, shared by its records' [`Tp`]s, and its
/// `modstream_events_consumed_total` counter: found by name per record
/// (a handful of topics) instead of allocated and looked up each time.
#[derive(Default)]
struct Topics(Vec<(std::sync::Arc<str>, metrics::Counter)>);

impl Topics {
    fn of(&mut self, topic: &str) -> &(std::sync::Arc<str>, metrics::Counter) {
        let i = match self.0.iter().position(|(t, _)| &**t == topic) {
            Some(i) => i,
            None => {
                let counter =
                    metrics::counter!(metric::CONSUMED_TOTAL, "topic" => topic.to_string());
                self.0.push((std::sync::Arc::from(topic), counter));
                self.0.len() - 1
            }
        };
        &self.0[i]
    }
}

/// Whether the hub is still there to take records.
enum Hub {
    Open,
    Gone,
}

impl<'a> PollLoop<'a> {
    pub fn new(
        consumer: &'a KafkaConsumer,
        budget: &'a ByteBudget,
        watchdog: &'a mut FetchWatchdog,
        records_tx: mpsc::Sender<Ingested>,
        commit_interval: Duration,
    ) -> Self {
        PollLoop {
            consumer,
            budget,
            watchdog,
            records_tx,
            commit_interval,
            backlog: VecDeque::new(),
            paused: false,
            backlog_since: None,
            topics: Topics::default(),
            in_flight_bytes: metrics::gauge!(metric::IN_FLIGHT_BYTES),
        }
    }

    /// Poll and forward until `stop_fetching` fires, a fatal client error
    /// happens or the hub is gone; then pause the assignment (nothing more
    /// is fetched while the pipeline drains).
    pub fn run(mut self, stop_fetching: &CancellationToken) {
        let consumer = self.consumer;
        let mut last_commit = Instant::now();
        while !stop_fetching.is_cancelled() {
            if consumer.context().faults.fatal().is_some() {
                // Stop forwarding; the pipeline drains what it has and reports the error.
                break;
            }
            consumer.context().store_sent_positions(consumer);
            if let Hub::Gone = self.forward_backlog() {
                return;
            }
            self.in_flight_bytes.set(self.budget.used() as f64);
            let rebalanced = consumer.context().membership.take_rebalanced();
            if rebalanced {
                self.after_rebalance();
            }
            self.apply_backpressure(rebalanced);
            if !self.backlog.is_empty() && !self.paused {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            if let Hub::Gone = self.poll_once() {
                return;
            }
            if last_commit.elapsed() >= self.commit_interval {
                if consumer.context().txn.is_some() {
                    consumer.context().end_transaction(consumer, End::Interval);
                } else {
                    commit(consumer, CommitMode::Async);
                }
                last_commit = Instant::now();
            }
            self.watchdog.check(consumer, self.paused);
        }
        self.watchdog.stop();
        if let Ok(assignment) = consumer.assignment() {
            let _ = consumer.pause(&assignment);
        }
    }

    fn forward_backlog(&mut self) -> Hub {
        while let Some(record) = self.backlog.pop_front() {
            match forward(&self.records_tx, self.budget, record) {
                Forward::Sent => {}
                Forward::Full(record) => {
                    self.backlog.push_front(record);
                    self.watchdog.pushed_back();
                    break;
                }
                Forward::Closed => return Hub::Gone,
            }
        }
        Hub::Open
    }

    fn after_rebalance(&mut self) {
        // Records of partitions we no longer own go to their new owner.
        if let Ok(assignment) = self.consumer.assignment() {
            let owned = partitions_of(&assignment);
            self.backlog.retain(|r| owned.contains(&r.tp));
        }
        // librdkafka keeps a partition's pause flag across unassign and
        // assign: make the whole new assignment match the backpressure
        // state, whichever it is, or a partition paused before the
        // rebalance is never fetched again.
        set_paused(self.consumer, self.paused);
    }

    /// A momentarily full channel is normal at full speed: wait a little
    /// without polling (no new records) before pausing, because a pause
    /// throws away librdkafka's prefetched records and a resume refetches.
    fn apply_backpressure(&mut self, rebalanced: bool) {
        if self.backlog.is_empty() {
            self.backlog_since = None;
        } else if self.backlog_since.is_none() {
            self.backlog_since = Some(Instant::now());
        }
        let sustained = self
            .backlog_since
            .is_some_and(|t| t.elapsed() >= BACKPRESSURE_THRESHOLD);
        if self.backlog.is_empty() && self.paused {
            set_paused(self.consumer, false);
            self.paused = false;
        } else if sustained && (!self.paused || rebalanced) {
            set_paused(self.consumer, true);
            self.paused = true;
        }
    }

    fn poll_once(&mut self) -> Hub {
        let timeout = if self.paused {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(100)
        };
        match self.consumer.poll(timeout) {
            Some(Ok(m)) => {
                let generation = self.consumer.context().membership.generation();
                let (topic, consumed) = self.topics.of(m.topic());
                consumed.increment(1);
                let tp = Tp {
                    topic: topic.clone(),
                    partition: m.partition(),
                };
                let record = ingested(&m, tp, generation);
                consumer_note(self.consumer, &record);
                self.watchdog.fetched(&record.tp);
                if !self.backlog.is_empty() {
                    self.backlog.push_back(record);
                    return Hub::Open;
                }
                match forward(&self.records_tx, self.budget, record) {
                    Forward::Sent => {}
                    Forward::Full(record) => {
                        self.backlog.push_back(record);
                        self.watchdog.pushed_back();
                    }
                    Forward::Closed => return Hub::Gone,
                }
            }
            Some(Err(e)) if is_fatal(&e) => {
                tracing::error!(error = %e, "fatal consumer error");
                self.consumer.context().faults.set_fatal(e.to_string());
            }
            Some(Err(e)) => {
                metrics::counter!(metric::ERRORS_TOTAL, "kind" => ErrorKind::Consume.as_str())
                    .increment(1);
                tracing::warn!(error = %e, "consumer error");
            }
            None => {}
        }
        Hub::Open
    }
}

/// Exactly-once: where each partition started.
fn consumer_note(consumer: &KafkaConsumer, record: &Ingested) {
    consumer.context().note_polled(&record.tp, record.offset);
}

/// A polled message, owned, stamped with the rebalance generation.
fn ingested(m: &BorrowedMessage<'_>, tp: Tp, generation: Generation) -> Ingested {
    Ingested {
        tp,
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
    }
}

pub(super) fn set_paused(consumer: &KafkaConsumer, pause: bool) {
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
