//! `modstream run --until-caught-up`: a backfill or one-off rescoring
//! judges a topic's backlog and stops. At the start (once every input
//! topic exists) it notes each input partition's end offset; it stops the
//! run (the drain of a first SIGTERM: deliver, commit, exit 0) once the
//! group's committed offset of every one of those partitions reached its
//! noted end. A partition that was empty at the start is caught up from
//! the start. The records past the noted ends that arrive meanwhile are
//! judged as usual and committed if delivered before the stop.
//!
//! Committed offsets, not this instance's own positions: several members
//! of one group, each started with the flag, stop together once the group
//! has judged the backlog (and a member's partitions handed to another by
//! a rebalance still count).
//!
//! A transactional producer's last record is followed by its commit
//! marker, which takes an offset and is never handed to a consumer: the
//! committed offset then stops one below the end. A partition whose
//! committed offset has not moved for [`STILL_CHECKS`] checks is read from
//! that offset: if nothing readable lies before the end, it is caught up.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::client::{self, ConsumerRole};
use crate::config::Settings;
use crate::tp::Tp;

/// How often the committed offsets are read.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// A committed offset below its end and unmoved this many checks is read
/// from (for markers only between it and the end).
const STILL_CHECKS: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Watch until caught up, then cancel `stop`; ends early when `stop` is
/// cancelled by anything else. The reader it uses joins no group.
pub fn stop_when_caught_up(
    settings: &Settings,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let settings = settings.clone();
    tokio::task::spawn_blocking(move || {
        let mut config = client::consumer(
            &settings,
            ConsumerRole::RangeReader,
            &settings.kafka.group_id,
        );
        if settings.kafka.exactly_once() {
            // What the group's member reads: no aborted records.
            config.set("isolation.level", "read_committed");
        }
        let reader: BaseConsumer = match config.create() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "--until-caught-up: cannot create its reader; stopping");
                stop.cancel();
                return;
            }
        };
        let Some(ends) = ends_at_start(&reader, &settings.input.topics, &stop) else {
            return;
        };
        tracing::info!(
            partitions = ends.len(),
            records = ends.values().map(|e| e.end - e.start).sum::<i64>(),
            "--until-caught-up: judging the backlog up to the end offsets seen now"
        );
        let mut watch = Watch {
            ends,
            still: HashMap::new(),
        };
        while !stop.is_cancelled() {
            if watch.caught_up(&reader) {
                tracing::info!(
                    "--until-caught-up: every input partition is committed through its end at start; stopping"
                );
                stop.cancel();
                return;
            }
            std::thread::sleep(CHECK_EVERY);
        }
    })
}

/// A partition's offsets at the start: its first and its end.
#[derive(Debug, Clone, Copy)]
struct Ends {
    start: i64,
    end: i64,
}

/// The end of every partition of `topics`, once each topic exists (asked
/// again every check until then; /readyz names a missing one). `None`
/// when `stop` was cancelled first.
fn ends_at_start(
    reader: &BaseConsumer,
    topics: &[String],
    stop: &CancellationToken,
) -> Option<HashMap<Tp, Ends>> {
    while !stop.is_cancelled() {
        if let Some(ends) = read_ends(reader, topics) {
            return Some(ends);
        }
        std::thread::sleep(CHECK_EVERY);
    }
    None
}

fn read_ends(reader: &BaseConsumer, topics: &[String]) -> Option<HashMap<Tp, Ends>> {
    let mut ends = HashMap::new();
    for topic in topics {
        let metadata = reader.fetch_metadata(Some(topic), TIMEOUT).ok()?;
        let t = metadata.topics().iter().find(|t| t.name() == topic)?;
        if t.error().is_some() || t.partitions().is_empty() {
            return None;
        }
        for p in t.partitions() {
            let (start, end) = reader.fetch_watermarks(topic, p.id(), TIMEOUT).ok()?;
            ends.insert(Tp::new(topic, p.id()), Ends { start, end });
        }
    }
    Some(ends)
}

struct Watch {
    ends: HashMap<Tp, Ends>,
    /// Each partition below its end: its committed offset and for how
    /// many checks it has not moved.
    still: HashMap<Tp, (i64, u32)>,
}

impl Watch {
    fn caught_up(&mut self, reader: &BaseConsumer) -> bool {
        let mut tpl = TopicPartitionList::new();
        for tp in self.ends.keys() {
            tpl.add_partition(&tp.topic, tp.partition);
        }
        let Ok(committed) = reader.committed_offsets(tpl, TIMEOUT) else {
            return false;
        };
        let mut behind = Vec::new();
        for e in committed.elements() {
            let tp = Tp::new(e.topic(), e.partition());
            let Some(ends) = self.ends.get(&tp) else {
                continue;
            };
            let at = match e.offset() {
                Offset::Offset(n) => n,
                _ => ends.start,
            };
            if ends.end > ends.start && at < ends.end {
                behind.push((tp, at, ends.end));
            }
        }
        self.still
            .retain(|tp, _| behind.iter().any(|(b, _, _)| b == tp));
        let mut left = 0;
        for (tp, at, end) in behind {
            let entry = self.still.entry(tp.clone()).or_insert((at, 0));
            if entry.0 == at {
                entry.1 += 1;
            } else {
                *entry = (at, 0);
            }
            if entry.1 < STILL_CHECKS || readable_before(reader, &tp, at, end) {
                left += 1;
            }
        }
        left == 0
    }
}

/// Whether a consumer handed anything between `from` and `end` of `tp`
/// (within a second): the rest may be only transaction markers.
fn readable_before(reader: &BaseConsumer, tp: &Tp, from: i64, end: i64) -> bool {
    use rdkafka::Message;
    let mut tpl = TopicPartitionList::new();
    if tpl
        .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(from))
        .is_err()
        || reader.assign(&tpl).is_err()
    {
        return true;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    let mut readable = true;
    while std::time::Instant::now() < deadline {
        match reader.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                readable = m.offset() < end;
                break;
            }
            Some(Err(_)) => break,
            None => {
                let position = reader.position().ok().and_then(|p| {
                    p.find_partition(&tp.topic, tp.partition)
                        .map(|e| e.offset())
                });
                if let Some(Offset::Offset(n)) = position
                    && n >= end
                {
                    readable = false;
                    break;
                }
            }
        }
    }
    let _ = reader.unassign();
    readable
}
