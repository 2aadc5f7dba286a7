//! The records modstream writes, and the dead-letter format in one place.
//!
//! Dead-letter record: the original key, value (null stays null), headers
//! and timestamp, untouched, followed by the headers `modstream.reason`
//! (code), `modstream.message`, `modstream.source.topic`,
//! `modstream.source.partition`, `modstream.source.offset` (a reader that
//! finds a name twice takes the last one). A value too large for the broker
//! is cut to fit ([`OutRecord::cut_down`]) and marked `modstream.truncated`
//! / `modstream.original.size`.

use std::borrow::Cow;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;

use crate::event::Rejection;
use crate::tp::Tp;

/// What a produced record is, for metrics, logs and the cut-down rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    Verdict,
    Dlq,
    /// An audit record for `output.decisions_topic`.
    Decision,
    /// A wave record for `output.waves_topic`.
    Wave,
    /// A risk-weighted sample for `output.samples_topic`.
    Sample,
    /// A change of an entity's state for `state.changelog_topic`: held to
    /// its offset as the verdict is (a restored state depends on it).
    State,
}

impl RecordKind {
    pub const ALL: [RecordKind; 6] = [
        RecordKind::Verdict,
        RecordKind::Dlq,
        RecordKind::Decision,
        RecordKind::Wave,
        RecordKind::Sample,
        RecordKind::State,
    ];

    /// Records moderation does not depend on (decisions, waves, samples):
    /// given up, counted, when their topic fails, instead of holding their
    /// offset (see `crate::producer::analytics`).
    pub fn is_analytics(self) -> bool {
        matches!(
            self,
            RecordKind::Decision | RecordKind::Wave | RecordKind::Sample
        )
    }

    /// The metric label value and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Verdict => "verdict",
            RecordKind::Dlq => "dlq",
            RecordKind::Decision => "decision",
            RecordKind::Wave => "wave",
            RecordKind::Sample => "sample",
            RecordKind::State => "state",
        }
    }
}

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A record to produce, owned so that it can be sent again on failure.
#[derive(Debug, Clone)]
pub struct OutRecord {
    pub topic: String,
    /// `None`: the producer's partitioner (by key) chooses.
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    /// `None` is a null value.
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(Cow<'static, str>, Option<Vec<u8>>)>,
    /// Kafka timestamp (ms); `None`: the producer's clock.
    pub timestamp_ms: Option<i64>,
    /// What it is: the cut-down applies to dead-letter records only.
    pub kind: RecordKind,
}

impl OutRecord {
    /// The record as librdkafka takes it, its delivery report under
    /// `opaque`.
    pub fn as_base_record(&self, opaque: usize) -> BaseRecord<'_, [u8], [u8], usize> {
        let mut record = BaseRecord::with_opaque_to(&self.topic, opaque);
        if let Some(partition) = self.partition {
            record = record.partition(partition);
        }
        if let Some(payload) = &self.payload {
            record = record.payload(payload.as_slice());
        }
        if let Some(key) = &self.key {
            record = record.key(key.as_slice());
        }
        if let Some(ts) = self.timestamp_ms {
            record = record.timestamp(ts);
        }
        if !self.headers.is_empty() {
            let headers = self
                .headers
                .iter()
                .fold(OwnedHeaders::new(), |h, (key, value)| {
                    h.insert(Header {
                        key: key.as_ref(),
                        value: value.as_deref(),
                    })
                });
            record = record.headers(headers);
        }
        record
    }

    /// The next smaller form of a dead-letter record the broker refused: the
    /// value cut to `budget` bytes, then no value and no input headers
    /// (modstream's headers stay: they say where the original lives).
    /// `None` when there is nothing left to cut, or for a verdict.
    pub fn cut_down(&self, budget: usize) -> Option<OutRecord> {
        if self.kind != RecordKind::Dlq {
            return None;
        }
        let size = self.payload.as_ref().map_or(0, Vec::len);
        let truncated = self.headers.iter().any(|(k, _)| k == header::TRUNCATED);
        let mut cut = self.clone();
        if !truncated && size > budget {
            if let Some(p) = cut.payload.as_mut() {
                p.truncate(budget);
            }
            cut.headers
                .push((Cow::Borrowed(header::TRUNCATED), Some(b"value".to_vec())));
            cut.headers.push((
                Cow::Borrowed(header::ORIGINAL_SIZE),
                Some(size.to_string().into_bytes()),
            ));
            return Some(cut);
        }
        let input_headers = cut
            .headers
            .iter()
            .any(|(k, _)| !k.starts_with("modstream."));
        if size == 0 && !input_headers {
            return None;
        }
        cut.payload = cut.payload.map(|_| Vec::new());
        cut.headers.retain(|(k, _)| k.starts_with("modstream."));
        cut.headers
            .retain(|(k, _)| k != header::TRUNCATED && k != header::ORIGINAL_SIZE);
        cut.headers.push((
            Cow::Borrowed(header::TRUNCATED),
            Some(b"value,headers".to_vec()),
        ));
        cut.headers.push((
            Cow::Borrowed(header::ORIGINAL_SIZE),
            Some(self.original_size().to_string().into_bytes()),
        ));
        Some(cut)
    }

    /// The value's size before any cut.
    fn original_size(&self) -> usize {
        self.headers
            .iter()
            .find(|(k, _)| k == header::ORIGINAL_SIZE)
            .and_then(|(_, v)| std::str::from_utf8(v.as_deref()?).ok()?.parse().ok())
            .unwrap_or_else(|| self.payload.as_ref().map_or(0, Vec::len))
    }
}

/// Header names of dead-letter records.
pub mod header {
    pub const REASON: &str = "modstream.reason";
    pub const MESSAGE: &str = "modstream.message";
    pub const SOURCE_TOPIC: &str = "modstream.source.topic";
    pub const SOURCE_PARTITION: &str = "modstream.source.partition";
    pub const SOURCE_OFFSET: &str = "modstream.source.offset";
    /// Set on a dead-letter record whose value was cut to fit the broker.
    pub const TRUNCATED: &str = "modstream.truncated";
    /// The size in bytes of the value before it was cut.
    pub const ORIGINAL_SIZE: &str = "modstream.original.size";
}

/// An input record's own parts, kept for its dead-letter copy.
#[derive(Debug, Default)]
pub struct Original {
    pub key: Option<Vec<u8>>,
    /// `None` for a null value (tombstone): the copy is null too.
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's Kafka timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
}

/// The dead-letter copy of an input record: its key, value, headers and
/// timestamp as they were, then modstream's headers.
pub fn dead_letter(
    topic: &str,
    source: &Tp,
    offset: i64,
    original: Original,
    rejection: &Rejection,
) -> OutRecord {
    let own = [
        (header::REASON, rejection.reason.code().to_string()),
        (header::MESSAGE, rejection.message.clone()),
        (header::SOURCE_TOPIC, source.topic.to_string()),
        (header::SOURCE_PARTITION, source.partition.to_string()),
        (header::SOURCE_OFFSET, offset.to_string()),
    ];
    let mut headers: Vec<(Cow<'static, str>, Option<Vec<u8>>)> = original
        .headers
        .into_iter()
        .map(|(k, v)| (Cow::Owned(k), v))
        .collect();
    headers.extend(
        own.into_iter()
            .map(|(k, v)| (Cow::Borrowed(k), Some(v.into_bytes()))),
    );
    OutRecord {
        topic: topic.to_string(),
        partition: None,
        key: original.key,
        payload: original.payload,
        headers,
        timestamp_ms: original.timestamp_ms,
        kind: RecordKind::Dlq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dlq(payload: usize, input_headers: usize) -> OutRecord {
        let mut headers: Vec<(Cow<'static, str>, Option<Vec<u8>>)> = (0..input_headers)
            .map(|i| (Cow::Owned(format!("h{i}")), Some(vec![b'x'; 10])))
            .collect();
        headers.push((Cow::Borrowed(header::SOURCE_OFFSET), Some(b"7".to_vec())));
        OutRecord {
            topic: "dlq".into(),
            partition: None,
            key: Some(b"k".to_vec()),
            payload: Some(vec![b'a'; payload]),
            headers,
            timestamp_ms: Some(1),
            kind: RecordKind::Dlq,
        }
    }

    fn header(r: &OutRecord, name: &str) -> Option<String> {
        r.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
    }

    #[test]
    fn a_refused_dead_letter_record_is_cut_down_step_by_step_then_given_up() {
        let first = dlq(1000, 2);
        let cut = first.cut_down(100).expect("the value is cut first");
        assert_eq!(cut.payload.as_ref().map(Vec::len), Some(100));
        assert_eq!(header(&cut, header::TRUNCATED).as_deref(), Some("value"));
        assert_eq!(header(&cut, header::ORIGINAL_SIZE).as_deref(), Some("1000"));
        assert_eq!(header(&cut, "h0").as_deref(), Some("xxxxxxxxxx"));
        assert_eq!(
            (cut.key.clone(), cut.timestamp_ms),
            (Some(b"k".to_vec()), Some(1))
        );
        let bare = cut.cut_down(100).expect("then value and input headers go");
        assert_eq!(bare.payload, Some(Vec::new()));
        assert_eq!(header(&bare, "h0"), None);
        assert_eq!(
            header(&bare, header::SOURCE_OFFSET).as_deref(),
            Some("7"),
            "where the original lives"
        );
        assert_eq!(
            header(&bare, header::ORIGINAL_SIZE).as_deref(),
            Some("1000")
        );
        assert_eq!(
            bare.cut_down(100).map(|r| r.headers.len()),
            None,
            "nothing left to cut"
        );
        // Small value, large input headers: straight to the bare form.
        assert_eq!(dlq(10, 3).cut_down(100).unwrap().payload, Some(Vec::new()));
        // A verdict is never cut.
        let mut verdict = dlq(1000, 0);
        verdict.kind = RecordKind::Verdict;
        assert!(verdict.cut_down(100).is_none());
    }
}
