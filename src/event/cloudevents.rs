//! CloudEvents 1.0 over Kafka (the Kafka protocol binding), as input:
//!
//! - binary mode: the attributes in `ce_*` headers (`ce_id`, `ce_source`,
//!   `ce_type`, `ce_time`, ...), the record value is the event's data;
//! - structured mode: the `content-type` header starts with
//!   `application/cloudevents+json`; the value is the JSON envelope, its
//!   `data` member the event's data.
//!
//! The mapping then reads the data (JSON pointers) and the attributes
//! (`ce:ATTRIBUTE`). Any other record is plain: its value is the data.

use std::collections::HashMap;

use serde_json::Value;

use super::{RejectReason, Rejection, reject};

/// The CloudEvents attributes of a record (none for a plain record).
pub type Attributes = HashMap<String, String>;

/// How a record carries its event.
pub enum Carried<'a> {
    /// The value is the data.
    Plain,
    /// Binary mode: attributes from the headers; the value is the data.
    Binary(Attributes),
    /// Structured mode: the value is the envelope.
    Structured(&'a [u8]),
}

const STRUCTURED: &str = "application/cloudevents+json";

/// Tell the mode from the headers.
pub fn carried<'a>(headers: &[(String, Option<Vec<u8>>)], value: &'a [u8]) -> Carried<'a> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_deref())
    };
    if header("content-type").is_some_and(|v| {
        std::str::from_utf8(v).is_ok_and(|s| s.trim().to_ascii_lowercase().starts_with(STRUCTURED))
    }) {
        return Carried::Structured(value);
    }
    if header("ce_specversion").is_none() {
        return Carried::Plain;
    }
    let attributes = headers
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("ce_")?;
            let value = std::str::from_utf8(v.as_deref()?).ok()?;
            Some((name.to_ascii_lowercase(), value.to_string()))
        })
        .collect();
    Carried::Binary(attributes)
}

/// A structured-mode envelope split into its attributes and its data.
pub fn open_envelope(envelope: Value) -> Result<(Attributes, Value), Rejection> {
    let Value::Object(mut members) = envelope else {
        return Err(reject(
            RejectReason::NotAnObject,
            "a structured CloudEvent must be a JSON object",
        ));
    };
    if !members.get("specversion").is_some_and(Value::is_string) {
        return Err(reject(
            RejectReason::InvalidField,
            "a structured CloudEvent needs a string specversion",
        ));
    }
    if members.contains_key("data_base64") {
        return Err(reject(
            RejectReason::InvalidField,
            "CloudEvent data_base64 (binary data) is not read: moderation needs the data as JSON",
        ));
    }
    let data = members.remove("data").unwrap_or(Value::Null);
    let attributes = members
        .into_iter()
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k, s)),
            Value::Number(n) => Some((k, n.to_string())),
            Value::Bool(b) => Some((k, b.to_string())),
            _ => None,
        })
        .collect();
    Ok((attributes, data))
}

/// A verdict as a CloudEvent (output): its attributes.
pub struct Outgoing<'a> {
    /// Unique per input record: `<topic>-<partition>-<offset>` (a verdict
    /// sent again after a crash has the same id, so readers can drop it).
    pub id: String,
    pub source: &'a str,
    /// The input event's id.
    pub subject: &'a str,
    /// When the verdict was made (RFC 3339).
    pub time: &'a str,
}

/// The CloudEvents type of a verdict.
pub const VERDICT_TYPE: &str = "dev.modstream.verdict";

impl Outgoing<'_> {
    /// Binary mode: the `ce_*` headers (and `content-type`).
    pub fn headers(&self, content_type: &str) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("ce_specversion", b"1.0".to_vec()),
            ("ce_id", self.id.as_bytes().to_vec()),
            ("ce_source", self.source.as_bytes().to_vec()),
            ("ce_type", VERDICT_TYPE.as_bytes().to_vec()),
            ("ce_subject", self.subject.as_bytes().to_vec()),
            ("ce_time", self.time.as_bytes().to_vec()),
            ("content-type", content_type.as_bytes().to_vec()),
        ]
    }

    /// Structured mode: the JSON envelope around `data`.
    pub fn envelope(&self, data: Value) -> Vec<u8> {
        serde_json::json!({
            "specversion": "1.0",
            "id": self.id,
            "source": self.source,
            "type": VERDICT_TYPE,
            "subject": self.subject,
            "time": self.time,
            "datacontenttype": "application/json",
            "data": data,
        })
        .to_string()
        .into_bytes()
    }
}

/// The content type of a structured-mode CloudEvent.
pub const STRUCTURED_CONTENT_TYPE: &str = STRUCTURED;

#[cfg(test)]
mod tests {
    use super::*;

    fn h(k: &str, v: &str) -> (String, Option<Vec<u8>>) {
        (k.to_string(), Some(v.as_bytes().to_vec()))
    }

    #[test]
    fn the_mode_comes_from_the_headers() {
        assert!(matches!(carried(&[], b"{}"), Carried::Plain));
        let binary = [
            h("ce_specversion", "1.0"),
            h("ce_id", "a1"),
            h("other", "x"),
        ];
        match carried(&binary, b"{}") {
            Carried::Binary(a) => {
                assert_eq!(a["id"], "a1");
                assert_eq!(a.len(), 2);
            }
            _ => panic!("binary mode"),
        }
        let structured = [h(
            "Content-Type",
            "application/cloudevents+json; charset=UTF-8",
        )];
        assert!(matches!(
            carried(&structured, b"{}"),
            Carried::Structured(_)
        ));
    }

    #[test]
    fn an_envelope_gives_attributes_and_data() {
        let (a, data) = open_envelope(serde_json::json!({
            "specversion": "1.0", "id": "x", "source": "/feed", "type": "post.created",
            "data": {"body": "hi"}
        }))
        .unwrap();
        assert_eq!(
            (a["id"].as_str(), a["type"].as_str()),
            ("x", "post.created")
        );
        assert_eq!(data["body"], "hi");
        let no_version = open_envelope(serde_json::json!({"id": "x"})).unwrap_err();
        assert_eq!(no_version.reason, RejectReason::InvalidField);
    }
}
