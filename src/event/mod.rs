//! The input event and its decoding.
//!
//! Guarantee: [`Decoder::decode`] never panics, whatever the bytes, and
//! every input ends as either an [`Event`] or a [`Rejection`] with a
//! machine-readable reason code. A rejection becomes one dead-letter
//! record; nothing is dropped. Only the required fields (id, text) and the
//! shape of the record can reject it: an optional field that cannot be read
//! is left out with a [`FieldWarning`] ([`fields`]).
//!
//! Default schema (JSON object; `[input.mapping]` says where each field
//! comes from otherwise, see [`crate::config::Mapping`]):
//! `{"event_id": string, "text": string, "user_id"?: string, "lang"?: string,
//!   "created_at"?: RFC 3339 string or epoch seconds / milliseconds,
//!   "priority"?: "normal" | "urgent", "tenant"?: string, "metadata"?: object}`.
//! Unknown fields are ignored; for duplicate keys the last one wins. Only
//! what the mapping reads is kept of a JSON value (`mapping::paths`).
//! CloudEvents (binary and structured mode) are read too ([`cloudevents`]).

use serde_json::{Map, Value};

use crate::config::Limits;

pub mod cloudevents;
pub mod fields;
mod mapping;

pub use fields::{FieldWarning, OptionalField};
pub use mapping::{Decoder, RecordParts};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Normal,
    /// Closes its partition's batch at once: the latency lane.
    Urgent,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event_id: String,
    pub text: String,
    pub user_id: Option<String>,
    pub lang: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: Option<i64>,
    pub priority: Priority,
    pub metadata: Option<Map<String, Value>>,
    /// The tenant or community the event belongs to.
    pub tenant: Option<String>,
    /// Optional fields left out, and why.
    pub warnings: Vec<FieldWarning>,
}

/// Why an input record was sent to the dead-letter topic. The code travels in
/// the `modstream.reason` header and labels the DLQ metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    EmptyPayload,
    PayloadTooLarge,
    InvalidUtf8,
    InvalidJson,
    NotAnObject,
    MissingEventId,
    EmptyEventId,
    MissingText,
    EmptyText,
    WrongType,
    InvalidField,
    TextTooLarge,
    /// The model could not score this event (see the inference stage).
    InferenceFailed,
    /// A Schema Registry format: the registry has no schema of this id.
    UnknownSchema,
    /// A Schema Registry format: the bytes are not in the wire format, or
    /// do not decode by their schema.
    Undecodable,
}

impl RejectReason {
    pub const ALL: [RejectReason; 15] = [
        RejectReason::EmptyPayload,
        RejectReason::PayloadTooLarge,
        RejectReason::InvalidUtf8,
        RejectReason::InvalidJson,
        RejectReason::NotAnObject,
        RejectReason::MissingEventId,
        RejectReason::EmptyEventId,
        RejectReason::MissingText,
        RejectReason::EmptyText,
        RejectReason::WrongType,
        RejectReason::InvalidField,
        RejectReason::TextTooLarge,
        RejectReason::InferenceFailed,
        RejectReason::UnknownSchema,
        RejectReason::Undecodable,
    ];

    pub fn code(self) -> &'static str {
        match self {
            RejectReason::EmptyPayload => "empty_payload",
            RejectReason::PayloadTooLarge => "payload_too_large",
            RejectReason::InvalidUtf8 => "invalid_utf8",
            RejectReason::InvalidJson => "invalid_json",
            RejectReason::NotAnObject => "not_an_object",
            RejectReason::MissingEventId => "missing_event_id",
            RejectReason::EmptyEventId => "empty_event_id",
            RejectReason::MissingText => "missing_text",
            RejectReason::EmptyText => "empty_text",
            RejectReason::WrongType => "wrong_type",
            RejectReason::InvalidField => "invalid_field",
            RejectReason::TextTooLarge => "text_too_large",
            RejectReason::InferenceFailed => "inference_failed",
            RejectReason::UnknownSchema => "unknown_schema",
            RejectReason::Undecodable => "undecodable",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub reason: RejectReason,
    pub message: String,
}

pub fn reject(reason: RejectReason, message: impl Into<String>) -> Rejection {
    Rejection {
        reason,
        message: message.into(),
    }
}

/// Decode and check one record payload against the default schema.
pub fn validate(payload: Option<&[u8]>, limits: &Limits) -> Result<Event, Rejection> {
    Decoder::plain(limits).decode(
        "",
        RecordParts {
            key: None,
            payload,
            headers: &[],
        },
    )
}

/// When the event happened, for latency: the input record's Kafka
/// timestamp (ms) when it has one, else the event's `created_at`.
pub fn event_time_ms(record_timestamp_ms: Option<i64>, event: &Event) -> Option<i64> {
    record_timestamp_ms
        .filter(|t| *t > 0)
        .or(event.created_at_ms)
}

/// Bytes as text, or why not.
fn utf8(bytes: &[u8]) -> Result<&str, Rejection> {
    std::str::from_utf8(bytes).map_err(|e| {
        reject(
            RejectReason::InvalidUtf8,
            format!("payload is not UTF-8: {e}"),
        )
    })
}

/// Bytes as a JSON value.
fn parse_json(bytes: &[u8]) -> Result<Value, Rejection> {
    let text = utf8(bytes)?;
    // serde_json stops at 128 levels of nesting with an error, so hostile
    // deeply nested input cannot overflow the stack.
    serde_json::from_str(text).map_err(|e| {
        reject(
            RejectReason::InvalidJson,
            format!("payload is not JSON: {e}"),
        )
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(payload: &[u8]) -> Result<Event, Rejection> {
        validate(Some(payload), &Limits::default())
    }

    fn reason(payload: &[u8]) -> &'static str {
        match check(payload) {
            Err(r) => r.reason.code(),
            Ok(e) => panic!("expected a rejection, got {e:?}"),
        }
    }

    #[test]
    fn a_full_event_is_accepted() {
        let e = check(
            br#"{"event_id":"e1","text":"hello","user_id":"u9","lang":"en",
            "created_at":"2026-11-29T10:00:00Z","priority":"urgent","metadata":{"app":"feed"}}"#,
        )
        .unwrap();
        assert_eq!(e.event_id, "e1");
        assert_eq!(e.text, "hello");
        assert_eq!(e.user_id.as_deref(), Some("u9"));
        assert_eq!(e.priority, Priority::Urgent);
        assert_eq!(e.created_at_ms, Some(1_795_946_400_000));
        assert!(e.metadata.is_some());
    }

    #[test]
    fn created_at_may_be_epoch_millis() {
        let e = check(br#"{"event_id":"e","text":"t","created_at":1700000000123}"#).unwrap();
        assert_eq!(e.created_at_ms, Some(1_700_000_000_123));
    }

    #[test]
    fn every_rejection_reason_is_reachable() {
        assert_eq!(
            validate(None, &Limits::default())
                .unwrap_err()
                .reason
                .code(),
            "empty_payload"
        );
        assert_eq!(reason(b""), "empty_payload");
        let big = vec![b' '; Limits::default().max_payload_bytes + 1];
        assert_eq!(reason(&big), "payload_too_large");
        assert_eq!(reason(b"{\"event_id\":\"\xff\"}"), "invalid_utf8");
        assert_eq!(reason(b"not json"), "invalid_json");
        assert_eq!(reason(b"[1,2]"), "not_an_object");
        assert_eq!(reason(b"42"), "not_an_object");
        assert_eq!(reason(b"\"text\""), "not_an_object");
        assert_eq!(reason(br#"{"text":"t"}"#), "missing_event_id");
        assert_eq!(reason(br#"{"event_id":"","text":"t"}"#), "empty_event_id");
        assert_eq!(reason(br#"{"event_id":7,"text":"t"}"#), "wrong_type");
        assert_eq!(reason(br#"{"event_id":"e"}"#), "missing_text");
        assert_eq!(reason(br#"{"event_id":"e","text":""}"#), "empty_text");
        assert_eq!(reason(br#"{"event_id":"e","text":["t"]}"#), "wrong_type");
        // A structured CloudEvent without its specversion.
        let structured = [(
            "content-type".to_string(),
            Some(b"application/cloudevents+json".to_vec()),
        )];
        let envelope = Decoder::plain(&Limits::default()).decode(
            "t",
            RecordParts {
                key: None,
                payload: Some(br#"{"id":"x","data":{"event_id":"e","text":"t"}}"#),
                headers: &structured,
            },
        );
        assert_eq!(envelope.unwrap_err().reason.code(), "invalid_field");
        let long = format!(
            r#"{{"event_id":"e","text":"{}"}}"#,
            "a".repeat(Limits::default().max_text_bytes + 1)
        );
        assert_eq!(reason(long.as_bytes()), "text_too_large");
    }

    #[test]
    fn bad_optional_fields_are_left_out_and_the_event_is_moderated() {
        let e = check(
            br#"{"event_id":"e","text":"t","user_id":[5],"priority":"asap",
            "created_at":"yesterday","metadata":"x","lang":7}"#,
        )
        .unwrap();
        assert_eq!((e.user_id, e.lang, e.created_at_ms), (None, None, None));
        assert_eq!((e.priority, e.metadata), (Priority::Normal, None));
        let named: Vec<String> = e.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(named.len(), 5, "{named:?}");
        assert!(
            named[0].starts_with("user_id: /user_id must be"),
            "{named:?}"
        );
    }

    #[test]
    fn deeply_nested_json_is_rejected_without_overflowing() {
        let depth = 100_000;
        let mut s = "[".repeat(depth);
        s.push_str(&"]".repeat(depth));
        assert_eq!(reason(s.as_bytes()), "invalid_json");
    }

    #[test]
    fn unicode_and_nul_text_is_accepted_as_is() {
        let e = check("{\"event_id\":\"e\",\"text\":\"caf\u{e9} \u{1F600} \u{5e9}\u{5dc}\u{5d5}\u{5dd} e\u{301} a\\u0000b\"}".as_bytes()).unwrap();
        assert!(e.text.contains('\0'));
        assert!(e.text.contains('\u{1F600}'));
    }

    #[test]
    fn duplicate_keys_keep_the_last_value() {
        let e = check(br#"{"event_id":"a","event_id":"b","text":"t"}"#).unwrap();
        assert_eq!(e.event_id, "b");
    }

    /// Arbitrary JSON values, nested, with the schema's field names mixed in.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            ".{0,20}".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec(
                    (
                        prop_oneof![
                            Just("event_id".to_string()),
                            Just("text".to_string()),
                            Just("priority".to_string()),
                            Just("created_at".to_string()),
                            Just("metadata".to_string()),
                            "[a-z]{1,8}"
                        ],
                        inner
                    ),
                    0..6
                )
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The fuzz target: any JSON-shaped input is accepted or rejected with
        /// a reason, never a panic, and accepted events satisfy the schema.
        /// `make fuzz` runs it with many more cases.
        #[test]
        fn structured_input_is_accepted_or_rejected_never_panics(v in json_value()) {
            let bytes = serde_json::to_vec(&v).unwrap();
            if let Ok(e) = check(&bytes) {
                prop_assert!(!e.event_id.is_empty() && !e.text.is_empty());
                prop_assert!(e.text.len() <= Limits::default().max_text_bytes);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = check(&bytes);
        }

        #[test]
        fn any_string_fields_round_trip(id in "[^\u{0}]{1,40}", text in ".{1,200}") {
            let payload = serde_json::json!({"event_id": id, "text": text}).to_string();
            let e = check(payload.as_bytes()).unwrap();
            prop_assert_eq!(e.event_id, id);
            prop_assert_eq!(e.text, text);
        }
    }
}
