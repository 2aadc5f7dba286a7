//! Restore: a newly owned partition's state read back from the changelog
//! before any of its verdicts is produced.
//!
//! One thread reads every restore with one consumer (read_committed: a
//! change of an aborted transaction is never read back). A job reads its
//! changelog partition from the start up to the end offset it had when the
//! job began, keeping the changes of its input topic answering offsets
//! before the first offset the new owner read ([`super::Rebuild`]); then
//! the hub gets the store. Jobs of two input topics that share a changelog
//! partition number are read one after the other.
//!
//! Seen, not only logged: `modstream_state_restoring_partitions` counts the
//! partitions waiting, and /readyz fails while any does, saying which and,
//! if the changelog cannot be read, why; the thread tries again every few
//! seconds. Time is bounded by the changelog's size (it is compacted: one
//! record per entity, plus what the cleaner has not reached yet) and, with
//! exactly-once, by the open transactions on it: a job reads to the high
//! watermark, so a stopped owner's transaction left open is waited out
//! (the broker aborts it after that owner's `kafka.transaction_timeout`, at
//! its next check), since the owners after it may have committed changes
//! past it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{OFFSET_HEADER, Rebuild, Store};
use crate::client::{self, ConsumerRole};
use crate::config::Settings;
use crate::telemetry::{Health, metric};
use crate::tp::{Generation, Tp};

const RETRY: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(10);
/// A restore that reads nothing for this long says why in /readyz.
const HELD: Duration = Duration::from_secs(2);

/// A partition's state to restore.
pub struct Job {
    pub tp: Tp,
    pub generation: Generation,
    /// The first offset the new owner read: changes of later offsets are
    /// not kept.
    pub before: i64,
    /// Cancelled when the partition is dropped before its state is back.
    pub cancel: CancellationToken,
}

/// A restore's end.
pub struct Restored {
    pub tp: Tp,
    pub generation: Generation,
    pub store: Store,
    /// Changelog records read, and how long it took.
    pub records: u64,
    pub took: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot create the state changelog's consumer: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("cannot start the state restore thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts the restore thread; it stops when `jobs` closes or `restored`
/// is gone.
pub fn spawn(
    settings: &Settings,
    topic: &str,
    jobs: std::sync::mpsc::Receiver<Job>,
    restored: mpsc::Sender<Restored>,
    health: Arc<Health>,
) -> Result<std::thread::JoinHandle<()>, RestoreError> {
    let group = format!(
        "modstream-state-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_millis()
    );
    let mut cfg = client::consumer(settings, ConsumerRole::RangeReader, &group);
    cfg.set("isolation.level", "read_committed");
    let consumer: BaseConsumer = cfg.create()?;
    let ends = client::WrittenEnds::new(&cfg)?;
    let reader = Reader {
        consumer,
        ends,
        topic: topic.to_string(),
        restored,
        health,
        waiting: VecDeque::new(),
        reading: BTreeMap::new(),
    };
    Ok(std::thread::Builder::new()
        .name("state-restore".into())
        .spawn(move || reader.run(&jobs))?)
}

/// A job being read.
struct Reading {
    job: Job,
    /// The changelog partition's end offset when the job began.
    end: i64,
    rebuild: Rebuild,
    records: u64,
    started: Instant,
    /// The last position seen, and since when: one that stays short of the
    /// end is said in /readyz once.
    last: (Option<i64>, Instant),
    held_said: bool,
}

struct Reader {
    consumer: BaseConsumer,
    ends: client::WrittenEnds,
    topic: String,
    restored: mpsc::Sender<Restored>,
    health: Arc<Health>,
    /// Jobs not started: new, waiting for their changelog partition, or
    /// to be tried again (not before the instant).
    waiting: VecDeque<(Job, Instant)>,
    /// By changelog partition.
    reading: BTreeMap<i32, Reading>,
}

impl Reader {
    fn run(mut self, jobs: &std::sync::mpsc::Receiver<Job>) {
        let mut last_check = Instant::now();
        loop {
            let idle = self.reading.is_empty() && self.waiting.is_empty();
            let next = if idle {
                match jobs.recv() {
                    Ok(job) => Some(job),
                    Err(_) => return,
                }
            } else {
                match jobs.try_recv() {
                    Ok(job) => Some(job),
                    Err(std::sync::mpsc::TryRecvError::Empty) => None,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
                }
            };
            if let Some(job) = next {
                self.health
                    .set_restoring(&job.tp, Some("reading its changelog".into()));
                self.waiting.push_back((job, Instant::now()));
                continue;
            }
            self.start_waiting();
            if self.reading.is_empty() {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            // Positions are looked at every 100 ms, or when nothing came,
            // not per record (the lookup costs more than a record).
            let read = self.poll();
            if read && last_check.elapsed() < Duration::from_millis(100) {
                continue;
            }
            last_check = Instant::now();
            if self.finish_done().is_err() {
                return;
            }
        }
    }

    /// Starts the waiting jobs whose changelog partition is free.
    fn start_waiting(&mut self) {
        let now = Instant::now();
        for _ in 0..self.waiting.len() {
            let Some((job, at)) = self.waiting.pop_front() else {
                break;
            };
            if job.cancel.is_cancelled() {
                self.health.set_restoring(&job.tp, None);
                continue;
            }
            if at > now || self.reading.contains_key(&job.tp.partition) {
                self.waiting.push_back((job, at));
                continue;
            }
            match self.start(&job) {
                Ok(end) => {
                    self.reading.insert(
                        job.tp.partition,
                        Reading {
                            job,
                            end,
                            rebuild: Rebuild::default(),
                            records: 0,
                            started: Instant::now(),
                            last: (None, Instant::now()),
                            held_said: false,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(topic = %self.topic, partition = job.tp.partition, error = %e, "cannot read the state changelog; trying again");
                    self.health.set_restoring(
                        &job.tp,
                        Some(format!(
                            "cannot read {} partition {}: {e}",
                            self.topic, job.tp.partition
                        )),
                    );
                    self.waiting.push_back((job, now + RETRY));
                }
            }
        }
    }

    /// Assigns the job's changelog partition from its start; its end offset:
    /// the high watermark, not the last stable offset. A stopped owner's
    /// open transaction holds the latter back while the owners after it
    /// commit changes past it; the job ends once that transaction has ended
    /// too.
    fn start(&self, job: &Job) -> Result<i64, String> {
        let p = job.tp.partition;
        let (low, high) = (self.ends)
            .of(&self.topic, p, WAIT)
            .map_err(|e| e.to_string())?;
        // 0: nothing to read.
        let high = if high > low { high } else { 0 };
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&self.topic, p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
        self.consumer
            .incremental_assign(&list)
            .map_err(|e| e.to_string())?;
        Ok(high)
    }

    /// One record read and applied; whether one came.
    fn poll(&mut self) -> bool {
        match self.consumer.poll(Duration::from_millis(100)) {
            None => false,
            Some(Err(e)) => {
                tracing::warn!(topic = %self.topic, error = %e, "state changelog read failed");
                false
            }
            Some(Ok(message)) => {
                let Some(reading) = self.reading.get_mut(&message.partition()) else {
                    return true;
                };
                reading.records += 1;
                let offset = message.headers().and_then(|h| {
                    h.iter()
                        .filter(|h| h.key == OFFSET_HEADER)
                        .last()
                        .and_then(|h| h.value)
                });
                let applied = reading.rebuild.apply(
                    &reading.job.tp.topic,
                    reading.job.before,
                    message.key().unwrap_or_default(),
                    message.payload(),
                    offset,
                );
                if let Err(why) = applied {
                    tracing::warn!(topic = %self.topic, partition = message.partition(), offset = message.offset(), why, "state changelog record skipped");
                }
                true
            }
        }
    }

    /// Hands back the jobs read to their end (and drops the cancelled).
    fn finish_done(&mut self) -> Result<(), ()> {
        let positions = self.consumer.position().unwrap_or_default();
        for (p, reading) in &mut self.reading {
            let at = positions
                .find_partition(&self.topic, *p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(at) => Some(at),
                    _ => None,
                });
            if reading.last.0 != at {
                reading.last = (at, Instant::now());
            } else if !reading.held_said && reading.last.1.elapsed() >= HELD {
                reading.held_said = true;
                let why = format!(
                    "reading {} partition {p}: nothing readable past offset {} of {}: an open transaction holds it (a stopped member's ends when the broker aborts it, after its transaction timeout), or the broker does not answer",
                    self.topic,
                    at.unwrap_or(0),
                    reading.end
                );
                tracing::warn!(topic = %reading.job.tp.topic, partition = reading.job.tp.partition, why, "state restore held");
                self.health.set_restoring(&reading.job.tp, Some(why));
            }
        }
        let done: Vec<i32> = self
            .reading
            .iter()
            .filter(|(p, r)| {
                r.job.cancel.is_cancelled()
                    || r.end == 0
                    || positions
                        .find_partition(&self.topic, **p)
                        .is_some_and(|e| matches!(e.offset(), Offset::Offset(at) if at >= r.end))
            })
            .map(|(p, _)| *p)
            .collect();
        for p in done {
            let Some(reading) = self.reading.remove(&p) else {
                continue;
            };
            let mut list = TopicPartitionList::new();
            let _ = list.add_partition(&self.topic, p);
            if let Err(e) = self.consumer.incremental_unassign(&list) {
                tracing::warn!(topic = %self.topic, partition = p, error = %e, "cannot unassign a restored changelog partition");
            }
            self.health.set_restoring(&reading.job.tp, None);
            if reading.job.cancel.is_cancelled() {
                continue;
            }
            let store = reading.rebuild.finish();
            metrics::counter!(metric::STATE_RESTORED_ENTITIES_TOTAL).increment(store.len() as u64);
            let took = reading.started.elapsed();
            tracing::info!(topic = %reading.job.tp.topic, partition = p, entities = store.len(), records = reading.records, took_ms = took.as_millis() as u64, "state restored from the changelog");
            let restored = Restored {
                tp: reading.job.tp,
                generation: reading.job.generation,
                store,
                records: reading.records,
                took,
            };
            if self.restored.blocking_send(restored).is_err() {
                return Err(());
            }
        }
        Ok(())
    }
}
