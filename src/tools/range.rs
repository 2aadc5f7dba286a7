//! Reading a range of an input topic with a consumer of its own: assigned
//! (never subscribed) under a group id that never commits, so that the live
//! group's offsets are not touched. Used by `modstream rescore` and
//! `modstream explain`. Blocking: call it from a blocking context.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::BorrowedMessage;

use crate::client::{self, ConsumerRole};
use crate::config::Settings;
use crate::event::RecordParts;

/// The metadata and watermark timeout.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A range reader for `topic` (its group id names `purpose`, the process and
/// the time) and the topic's partitions.
pub fn open(
    settings: &Settings,
    topic: &str,
    purpose: &str,
) -> anyhow::Result<(BaseConsumer, Vec<i32>)> {
    let group = format!(
        "modstream-{purpose}-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_millis()
    );
    let consumer: BaseConsumer =
        client::consumer(settings, ConsumerRole::RangeReader, &group).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    anyhow::ensure!(!partitions.is_empty(), "topic {topic} not found");
    Ok((consumer, partitions))
}

/// Poll the assigned partitions until each of `ends` (partition → end
/// offset, exclusive) reached its end, or `each` says stop; `each` gets
/// every record below its partition's end, with its parts as the decoder
/// reads them. Past `deadline`, fails.
pub fn read_until(
    consumer: &BaseConsumer,
    mut ends: HashMap<i32, i64>,
    deadline: Option<(Instant, &str)>,
    mut each: impl FnMut(&BorrowedMessage<'_>, RecordParts<'_>) -> std::ops::ControlFlow<()>,
) -> anyhow::Result<()> {
    ends.retain(|_, end| *end > 0);
    while !ends.is_empty() {
        if let Some((at, what)) = deadline {
            anyhow::ensure!(Instant::now() < at, "{what}");
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            // Nothing more to fetch: a partition whose position reached
            // its end is done even if its last offsets held no record
            // (transaction markers, compaction).
            if let Ok(positions) = consumer.position() {
                for e in positions.elements() {
                    if let rdkafka::Offset::Offset(o) = e.offset()
                        && ends.get(&e.partition()).is_some_and(|end| o >= *end)
                    {
                        ends.remove(&e.partition());
                    }
                }
            }
            continue;
        };
        let m = message?;
        let Some(&end) = ends.get(&m.partition()) else {
            continue;
        };
        if m.offset() >= end {
            ends.remove(&m.partition());
            continue;
        }
        if m.offset() + 1 >= end {
            ends.remove(&m.partition());
        }
        let headers: Vec<(String, Option<Vec<u8>>)> = m
            .headers()
            .map(|hs| {
                rdkafka::message::Headers::iter(hs)
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        let parts = RecordParts {
            key: m.key(),
            payload: m.payload(),
            headers: &headers,
        };
        if each(&m, parts).is_break() {
            break;
        }
    }
    Ok(())
}
