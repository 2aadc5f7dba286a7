//! The input event schema and its validation.
//!
//! Guarantee: [`validate`] never panics, whatever the bytes, and every input
//! ends as either an [`Event`] or a [`Rejection`] with a machine-readable
//! reason code. A rejection becomes one dead-letter record; nothing is dropped.
//!
//! Schema (JSON object):
//! `{"event_id": string, "text": string, "user_id"?: string, "lang"?: string,
//!   "created_at"?: RFC 3339 string or epoch milliseconds,
//!   "priority"?: "normal" | "urgent", "metadata"?: object}`.
//! Unknown fields are ignored; for duplicate keys the last one wins.

use serde_json::{Map, Value};

use crate::config::Limits;

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
}

impl RejectReason {
    pub const ALL: [RejectReason; 13] = [
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
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub reason: RejectReason,
    pub message: String,
}

fn reject(reason: RejectReason, message: impl Into<String>) -> Rejection {
    Rejection {
        reason,
        message: message.into(),
    }
}

/// Decode and check one record payload.
pub fn validate(payload: Option<&[u8]>, limits: &Limits) -> Result<Event, Rejection> {
    let mut obj = decode_object(payload, limits)?;
    let event_id = required_string(
        &mut obj,
        "event_id",
        RejectReason::MissingEventId,
        RejectReason::EmptyEventId,
    )?;
    let text = required_string(
        &mut obj,
        "text",
        RejectReason::MissingText,
        RejectReason::EmptyText,
    )?;
    if text.len() > limits.max_text_bytes {
        return Err(reject(
            RejectReason::TextTooLarge,
            format!(
                "text is {} bytes, limit {}",
                text.len(),
                limits.max_text_bytes
            ),
        ));
    }
    let user_id = optional_string(&mut obj, "user_id")?;
    let lang = optional_string(&mut obj, "lang")?;
    let created_at_ms = created_at(&mut obj)?;
    let priority = priority(&mut obj)?;
    let metadata = match obj.remove("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => return Err(wrong_type("metadata", "an object", &other)),
    };
    Ok(Event {
        event_id,
        text,
        user_id,
        lang,
        created_at_ms,
        priority,
        metadata,
    })
}

/// When the event happened, for latency: the input record's Kafka
/// timestamp (ms) when it has one, else the event's `created_at`.
pub fn event_time_ms(record_timestamp_ms: Option<i64>, event: &Event) -> Option<i64> {
    record_timestamp_ms
        .filter(|t| *t > 0)
        .or(event.created_at_ms)
}

/// The payload as a JSON object, within the size limit.
fn decode_object(payload: Option<&[u8]>, limits: &Limits) -> Result<Map<String, Value>, Rejection> {
    let bytes = match payload {
        Some(b) if !b.is_empty() => b,
        _ => return Err(reject(RejectReason::EmptyPayload, "record has no payload")),
    };
    if bytes.len() > limits.max_payload_bytes {
        return Err(reject(
            RejectReason::PayloadTooLarge,
            format!(
                "payload is {} bytes, limit {}",
                bytes.len(),
                limits.max_payload_bytes
            ),
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        reject(
            RejectReason::InvalidUtf8,
            format!("payload is not UTF-8: {e}"),
        )
    })?;
    // serde_json stops at 128 levels of nesting with an error, so hostile
    // deeply nested input cannot overflow the stack.
    let value: Value = serde_json::from_str(text).map_err(|e| {
        reject(
            RejectReason::InvalidJson,
            format!("payload is not JSON: {e}"),
        )
    })?;
    match value {
        Value::Object(obj) => Ok(obj),
        other => Err(reject(
            RejectReason::NotAnObject,
            format!("payload is JSON {}, not an object", kind(&other)),
        )),
    }
}

/// `created_at`: RFC 3339 or whole epoch milliseconds, ms since the epoch.
fn created_at(obj: &mut Map<String, Value>) -> Result<Option<i64>, Rejection> {
    match obj.remove("created_at") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(Some(n.as_i64().ok_or_else(|| {
            reject(
                RejectReason::InvalidField,
                "created_at: epoch milliseconds must be a whole number",
            )
        })?)),
        Some(Value::String(s)) => Ok(Some(
            chrono::DateTime::parse_from_rfc3339(&s)
                .map_err(|e| {
                    reject(
                        RejectReason::InvalidField,
                        format!("created_at: not RFC 3339: {e}"),
                    )
                })?
                .timestamp_millis(),
        )),
        Some(other) => Err(wrong_type(
            "created_at",
            "an RFC 3339 string or epoch milliseconds",
            &other,
        )),
    }
}

fn priority(obj: &mut Map<String, Value>) -> Result<Priority, Rejection> {
    match obj.remove("priority") {
        None | Some(Value::Null) => Ok(Priority::Normal),
        Some(Value::String(s)) if s == "normal" => Ok(Priority::Normal),
        Some(Value::String(s)) if s == "urgent" => Ok(Priority::Urgent),
        Some(Value::String(s)) => Err(reject(
            RejectReason::InvalidField,
            format!("priority: {s:?} is neither \"normal\" nor \"urgent\""),
        )),
        Some(other) => Err(wrong_type("priority", "a string", &other)),
    }
}

fn required_string(
    obj: &mut Map<String, Value>,
    field: &str,
    missing: RejectReason,
    empty: RejectReason,
) -> Result<String, Rejection> {
    match obj.remove(field) {
        None | Some(Value::Null) => Err(reject(missing, format!("{field} is missing"))),
        Some(Value::String(s)) if s.is_empty() => Err(reject(empty, format!("{field} is empty"))),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(wrong_type(field, "a string", &other)),
    }
}

fn optional_string(obj: &mut Map<String, Value>, field: &str) -> Result<Option<String>, Rejection> {
    match obj.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(field, "a string", &other)),
    }
}

fn wrong_type(field: &str, expected: &str, got: &Value) -> Rejection {
    reject(
        RejectReason::WrongType,
        format!("{field} must be {expected}, got {}", kind(got)),
    )
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
        assert_eq!(
            reason(br#"{"event_id":"e","text":"t","user_id":5}"#),
            "wrong_type"
        );
        assert_eq!(
            reason(br#"{"event_id":"e","text":"t","priority":"asap"}"#),
            "invalid_field"
        );
        assert_eq!(
            reason(br#"{"event_id":"e","text":"t","created_at":"yesterday"}"#),
            "invalid_field"
        );
        assert_eq!(
            reason(br#"{"event_id":"e","text":"t","metadata":"x"}"#),
            "wrong_type"
        );
        let long = format!(
            r#"{{"event_id":"e","text":"{}"}}"#,
            "a".repeat(Limits::default().max_text_bytes + 1)
        );
        assert_eq!(reason(long.as_bytes()), "text_too_large");
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
