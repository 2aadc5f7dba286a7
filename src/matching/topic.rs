//! The list topic (`matching.list_topic`): a compacted topic of list items,
//! keyed by item id (a null value removes the item), that every instance
//! reads from its start on a thread of its own, with a consumer assigned to
//! every partition that never commits. Items reach the matcher as
//! [`Update`]s, so an item a moderator adds matches on every instance
//! within about a poll (a second) of its write.
//!
//! In force before the first verdict: at start the reader notes each
//! partition's end offset, and once it has read up to them it sends
//! [`Update::TopicCaughtUp`] after the items; the pipeline applies the
//! items to the matcher and waits for that before its consumer joins the
//! group ([`catch_up`], bounded by `matching.list_topic_wait`).
//! Partitions added to the topic later are found within
//! [`METADATA_EVERY`] and read from their start.
//!
//! Seen, not only logged: while the topic cannot be read (missing, not
//! authorized, the cluster unreachable) or is still being read to its end
//! at start, /readyz says why (`list_topic`) and
//! `modstream_list_topic_behind` is 1; the reader tries again every few
//! seconds and the lists in force stay. A record that is not an item is
//! logged with its key and counted (`modstream_list_topic_refused_total`);
//! the reader goes on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Fingerprinter, Item, Matcher, Update};
use crate::client::{self, ConsumerRole};
use crate::config::Settings;
use crate::telemetry::{Health, metric};

const RETRY: Duration = Duration::from_secs(3);

/// How often the reader looks for partitions added to the topic.
pub const METADATA_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("cannot create the list topic's consumer: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("cannot start the list topic's thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error(
        "the list topic {topic} was not read to its end within matching.list_topic_wait ({waited_s} s): {why} (set matching.list_topic_late = \"start\" to start anyway)"
    )]
    Late {
        topic: String,
        waited_s: u64,
        why: String,
    },
}

/// Starts the reader of `topic`; it stops when `stop` is cancelled or the
/// matcher's channel is gone.
pub fn spawn(
    settings: &Settings,
    topic: &str,
    updates: mpsc::Sender<Update>,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<std::thread::JoinHandle<()>, TopicError> {
    let group = format!(
        "modstream-lists-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_millis()
    );
    let consumer: BaseConsumer =
        client::consumer(settings, ConsumerRole::RangeReader, &group).create()?;
    let reader = Reader {
        consumer,
        topic: topic.to_string(),
        updates,
        health,
        ends: None,
        announced: false,
        failing: true,
        assigned: 0,
    };
    let mut reader = reader;
    reader.set_state(Some("reading the list topic to its end".into()));
    let thread = std::thread::Builder::new()
        .name("list-topic".into())
        .spawn(move || reader.run(&stop))?;
    Ok(thread)
}

/// Applies the reader's updates to `matcher` until it says it has read the
/// topic to its end offsets at start, for at most `wait`. Returns the
/// items applied, or what /readyz says is missing.
pub async fn catch_up(
    matcher: &mut Matcher,
    updates: &mut mpsc::Receiver<Update>,
    wait: Duration,
    health: &Health,
) -> Result<usize, String> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut applied = 0;
    loop {
        match tokio::time::timeout_at(deadline, updates.recv()).await {
            Ok(Some(Update::TopicCaughtUp)) => return Ok(applied),
            Ok(Some(update)) => {
                matcher.apply(update);
                applied += 1;
            }
            Ok(None) => return Err("the list topic's reader stopped".into()),
            Err(_) => {
                let why = health.list_topic();
                return Err(why.unwrap_or_else(|| "still reading".into()));
            }
        }
    }
}

/// The reader thread's state.
struct Reader {
    consumer: BaseConsumer,
    topic: String,
    updates: mpsc::Sender<Update>,
    health: Arc<Health>,
    /// Each partition's end offset at start, until read up to it (None:
    /// not assigned yet; empty: caught up).
    ends: Option<HashMap<i32, i64>>,
    /// [`Update::TopicCaughtUp`] was sent.
    announced: bool,
    /// /readyz says something is wrong with the topic.
    failing: bool,
    /// Partitions assigned.
    assigned: usize,
}

impl Reader {
    fn run(mut self, stop: &CancellationToken) {
        let prints = Fingerprinter;
        let mut next_metadata = Instant::now();
        let mut last_check = Instant::now();
        while !stop.is_cancelled() {
            if Instant::now() >= next_metadata {
                next_metadata = Instant::now() + METADATA_EVERY;
                if let Err(e) = self.assign_new() {
                    tracing::warn!(topic = %self.topic, error = %e, "cannot read the list topic; trying again");
                    self.set_state(Some(format!("cannot read it: {e}")));
                    next_metadata = Instant::now() + RETRY;
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
            if self.assigned == 0 {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            match self.consumer.poll(Duration::from_millis(200)) {
                None => {}
                Some(Err(e)) => {
                    tracing::warn!(topic = %self.topic, error = %e, "list topic read failed");
                    self.set_state(Some(format!("read failed: {e}")));
                    continue;
                }
                Some(Ok(message)) => {
                    let update = update_of(message.key(), message.payload(), &prints);
                    if let Some(update) = update
                        && self.updates.blocking_send(update).is_err()
                    {
                        return;
                    }
                    if self.failing && self.announced {
                        self.set_state(None);
                    }
                }
            }
            // Positions are looked at every 100 ms, not per record.
            if self.announced || last_check.elapsed() < Duration::from_millis(100) {
                continue;
            }
            last_check = Instant::now();
            if !self.caught_up_now() {
                continue;
            }
            if self.updates.blocking_send(Update::TopicCaughtUp).is_err() {
                return;
            }
        }
    }

    /// Whether the reader has read up to the end offsets it noted at start.
    fn caught_up_now(&mut self) -> bool {
        let Some(ends) = &mut self.ends else {
            return false;
        };
        if !ends.is_empty()
            && let Ok(positions) = self.consumer.position()
        {
            for e in positions.elements_for_topic(&self.topic) {
                if let (Offset::Offset(at), Some(end)) = (e.offset(), ends.get(&e.partition()))
                    && at >= *end
                {
                    ends.remove(&e.partition());
                }
            }
        }
        if !ends.is_empty() {
            return false;
        }
        tracing::info!(topic = %self.topic, "list topic read to its end; its items are in force");
        self.announced = true;
        self.set_state(None);
        true
    }

    /// Assigns, from their start, the topic's partitions not assigned yet
    /// (all of them the first time, noting their end offsets).
    fn assign_new(&mut self) -> Result<(), String> {
        let metadata = (self.consumer)
            .fetch_metadata(Some(&self.topic), Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.topic)
            .ok_or("no such topic")?;
        if let Some(e) = topic.error() {
            return Err(format!("{e:?}"));
        }
        let mut partitions: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
        partitions.sort_unstable();
        if partitions.is_empty() {
            return Err("no such topic".into());
        }
        if partitions.len() <= self.assigned {
            return Ok(());
        }
        let new = &partitions[self.assigned..];
        let first = self.ends.is_none();
        let mut ends = HashMap::new();
        let mut list = TopicPartitionList::new();
        for &p in new {
            if first {
                let (low, high) = (self.consumer)
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(10))
                    .map_err(|e| e.to_string())?;
                if high > low {
                    ends.insert(p, high);
                }
            }
            list.add_partition_offset(&self.topic, p, Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
        if first {
            self.consumer.assign(&list).map_err(|e| e.to_string())?;
            tracing::info!(topic = %self.topic, partitions = new.len(), "reading the list topic");
            self.ends = Some(ends);
        } else {
            (self.consumer.incremental_assign(&list)).map_err(|e| e.to_string())?;
            tracing::info!(topic = %self.topic, partitions = ?new, "list topic partitions added; reading them");
        }
        self.assigned = partitions.len();
        Ok(())
    }

    /// What /readyz says of the topic (None: read up to date) and the gauge.
    fn set_state(&mut self, why: Option<String>) {
        self.failing = why.is_some();
        let behind = why.is_some() || !self.announced;
        metrics::gauge!(metric::LIST_TOPIC_BEHIND).set(if behind { 1.0 } else { 0.0 });
        self.health
            .set_list_topic(why.map(|w| format!("list topic {}: {w}", self.topic)));
    }
}

/// A record's update: an item, or (null value) its removal; None for a
/// record that is not one (logged and counted).
pub fn update_of(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    prints: &Fingerprinter,
) -> Option<Update> {
    let refuse = |key: &str, why: &str| {
        tracing::warn!(key, why, "list topic record refused");
        metrics::counter!(metric::LIST_TOPIC_REFUSED_TOTAL).increment(1);
    };
    let Some(key) = key
        .and_then(|k| std::str::from_utf8(k).ok())
        .filter(|k| !k.is_empty())
    else {
        refuse("", "no key (the item id) in UTF-8");
        return None;
    };
    let Some(value) = value else {
        return Some(Update::TopicRemoved(key.to_string()));
    };
    match Item::parse(value, Some(key), prints) {
        Ok(item) => Some(Update::TopicItem(item)),
        Err(e) => {
            refuse(key, &e.to_string());
            None
        }
    }
}
