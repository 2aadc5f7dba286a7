//! The list topic (`matching.list_topic`): a compacted topic of list items,
//! keyed by item id (a null value removes the item), that every instance
//! reads from its start on a thread of its own, with a consumer assigned to
//! every partition that never commits. Items reach the hub's matcher as
//! [`Update`]s, so an item a moderator adds matches on every instance
//! within about a poll (a second) of its write.
//!
//! A record that is not an item is logged with its key and counted
//! (`modstream_list_topic_refused_total`); the reader goes on. While the
//! topic cannot be read (missing, or the cluster unreachable) the reader
//! logs it and tries again every few seconds; the lists in force stay.

use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Fingerprinter, Item, Update};
use crate::client::{self, ConsumerRole};
use crate::config::Settings;
use crate::telemetry::metric;

const RETRY: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("cannot create the list topic's consumer: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("cannot start the list topic's thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts the reader of `topic`; it stops when `stop` is cancelled or the
/// hub is gone.
pub fn spawn(
    settings: &Settings,
    topic: &str,
    updates: mpsc::Sender<Update>,
    stop: CancellationToken,
) -> Result<std::thread::JoinHandle<()>, TopicError> {
    let group = format!(
        "modstream-lists-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_millis()
    );
    let consumer: BaseConsumer =
        client::consumer(settings, ConsumerRole::RangeReader, &group).create()?;
    let topic = topic.to_string();
    let thread = std::thread::Builder::new()
        .name("list-topic".into())
        .spawn(move || read(&consumer, &topic, &updates, &stop))?;
    Ok(thread)
}

fn read(
    consumer: &BaseConsumer,
    topic: &str,
    updates: &mpsc::Sender<Update>,
    stop: &CancellationToken,
) {
    let prints = Fingerprinter;
    while !stop.is_cancelled() {
        if let Err(e) = assign_all(consumer, topic) {
            tracing::warn!(topic, error = %e, "cannot read the list topic yet; trying again");
            std::thread::sleep(RETRY);
            continue;
        }
        tracing::info!(topic, "reading the list topic");
        while !stop.is_cancelled() {
            let Some(message) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(topic, error = %e, "list topic read failed");
                    continue;
                }
            };
            let Some(update) = update_of(message.key(), message.payload(), &prints) else {
                continue;
            };
            if updates.blocking_send(update).is_err() {
                return;
            }
        }
    }
}

/// Assigns every partition of `topic` from its start.
fn assign_all(consumer: &BaseConsumer, topic: &str) -> Result<(), String> {
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err("no such topic".into());
    }
    let mut list = TopicPartitionList::new();
    for p in partitions {
        list.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&list).map_err(|e| e.to_string())
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
