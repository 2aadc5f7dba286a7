//! The mapping applied: an event read from a decoded value, the record's
//! key and headers, and its CloudEvents attributes, by the sources of
//! [`crate::config::Mapping`].

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::Value;

use super::cloudevents::{self, Attributes, Carried};
use super::fields::{Optional, OptionalField};
use super::{Event, RejectReason, Rejection, kind, parse_json, reject};
use crate::config::{FieldSource, InputSettings, Limits, Mapping, TimeUnit};

/// What a record offers besides its value.
#[derive(Clone, Copy)]
pub struct RecordParts<'a> {
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: &'a [(String, Option<Vec<u8>>)],
}

/// A field's source with what reading it needs worked out once: its name
/// (in warnings and rejections) and, for a JSON pointer, its reference
/// tokens unescaped (`Value::pointer` would split and unescape them again
/// for every record).
#[derive(Debug, Clone)]
struct Source {
    from: FieldSource,
    name: String,
    tokens: Vec<String>,
}

impl Source {
    fn new(from: FieldSource) -> Source {
        let tokens = match &from {
            FieldSource::Pointer(p) => p
                .split('/')
                .skip(1)
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect(),
            _ => Vec::new(),
        };
        Source {
            name: from.to_string(),
            from,
            tokens,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// The value a JSON pointer's tokens lead to, by RFC 6901 as
/// `serde_json::Value::pointer` reads it (an array index is decimal without
/// a sign or a leading zero).
fn lookup<'v>(mut value: &'v Value, tokens: &[String]) -> Option<&'v Value> {
    for token in tokens {
        value = match value {
            Value::Object(map) => map.get(token)?,
            Value::Array(items) => {
                let valid = !token.is_empty()
                    && token.bytes().all(|b| b.is_ascii_digit())
                    && (token == "0" || !token.starts_with('0'));
                items.get(token.parse::<usize>().ok().filter(|_| valid)?)?
            }
            _ => return None,
        };
    }
    Some(value)
}

/// A mapping with its sources parsed.
#[derive(Debug, Clone)]
struct Compiled {
    id: Source,
    text: Vec<Source>,
    text_separator: String,
    user_id: Option<Source>,
    lang: Option<Source>,
    created_at: Option<Source>,
    created_at_unit: TimeUnit,
    priority: Option<Source>,
    tenant: Option<Source>,
    metadata: Option<Source>,
}

impl Compiled {
    /// Sources were checked when the settings loaded; one that does not
    /// parse reads nothing.
    fn new(m: &Mapping) -> Compiled {
        let parse = |s: &str| FieldSource::parse(s).ok().flatten().map(Source::new);
        Compiled {
            id: parse(&m.id)
                .unwrap_or_else(|| Source::new(FieldSource::Pointer("/event_id".into()))),
            text: m.text.iter().filter_map(|t| parse(t)).collect(),
            text_separator: m.text_separator.clone(),
            user_id: parse(&m.user_id),
            lang: parse(&m.lang),
            created_at: parse(&m.created_at),
            created_at_unit: m.created_at_unit,
            priority: parse(&m.priority),
            tenant: parse(&m.tenant),
            metadata: parse(&m.metadata),
        }
    }
}

/// Reads events from input records, by topic.
#[derive(Debug, Clone)]
pub struct Decoder {
    default: Compiled,
    by_topic: HashMap<String, Compiled>,
    limits: Limits,
}

impl Decoder {
    pub fn new(input: &InputSettings, limits: &Limits) -> Decoder {
        let by_topic = input
            .mappings
            .iter()
            .flat_map(|m| {
                let compiled = Compiled::new(m);
                m.topics.iter().map(move |t| (t.clone(), compiled.clone()))
            })
            .collect();
        Decoder {
            default: Compiled::new(&input.mapping),
            by_topic,
            limits: limits.clone(),
        }
    }

    /// Today's event schema only (no per-topic mappings).
    pub fn plain(limits: &Limits) -> Decoder {
        Decoder {
            default: Compiled::new(&Mapping::default()),
            by_topic: HashMap::new(),
            limits: limits.clone(),
        }
    }

    /// The event of one record of `topic` whose value is JSON, or why it
    /// has none.
    pub fn decode(&self, topic: &str, record: RecordParts<'_>) -> Result<Event, Rejection> {
        self.decode_with(topic, record, parse_json)
    }

    /// The same, the value (or, for a binary-mode CloudEvent, its data)
    /// decoded by `value` (a Schema Registry codec); a structured-mode
    /// CloudEvent is JSON whatever the format.
    pub fn decode_with(
        &self,
        topic: &str,
        record: RecordParts<'_>,
        value: impl FnOnce(&[u8]) -> Result<Value, Rejection>,
    ) -> Result<Event, Rejection> {
        let bytes = match record.payload {
            Some(b) if !b.is_empty() => b,
            _ => return Err(reject(RejectReason::EmptyPayload, "record has no payload")),
        };
        if bytes.len() > self.limits.max_payload_bytes {
            return Err(reject(
                RejectReason::PayloadTooLarge,
                format!(
                    "payload is {} bytes, limit {}",
                    bytes.len(),
                    self.limits.max_payload_bytes
                ),
            ));
        }
        let (attributes, data) = match cloudevents::carried(record.headers, bytes) {
            Carried::Plain => (Attributes::new(), value(bytes)?),
            Carried::Binary(a) => (a, value(bytes)?),
            Carried::Structured(envelope) => cloudevents::open_envelope(parse_json(envelope)?)?,
        };
        if !data.is_object() {
            return Err(reject(
                RejectReason::NotAnObject,
                format!("payload is JSON {}, not an object", kind(&data)),
            ));
        }
        let mapping = self.by_topic.get(topic).unwrap_or(&self.default);
        let view = View {
            data,
            record,
            attributes,
        };
        view.event(mapping, &self.limits)
    }
}

/// One record's sources.
struct View<'a> {
    data: Value,
    record: RecordParts<'a>,
    attributes: Attributes,
}

impl View<'_> {
    fn get(&self, source: &Source) -> Option<Cow<'_, Value>> {
        let text = |b: &[u8]| Cow::Owned(Value::String(String::from_utf8_lossy(b).into_owned()));
        match &source.from {
            FieldSource::Pointer(_) => lookup(&self.data, &source.tokens).map(Cow::Borrowed),
            FieldSource::Key => self.record.key.map(text),
            FieldSource::Header(name) => self
                .record
                .headers
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.as_deref())
                .map(text),
            FieldSource::CloudEvent(attribute) => self
                .attributes
                .get(attribute)
                .map(|v| Cow::Owned(Value::String(v.clone()))),
        }
    }

    fn take(&self, source: Option<&Source>) -> Option<Value> {
        source.and_then(|s| self.get(s)).map(Cow::into_owned)
    }

    fn event(&self, m: &Compiled, limits: &Limits) -> Result<Event, Rejection> {
        let event_id = match self.get(&m.id).as_deref() {
            None | Some(Value::Null) => {
                return Err(reject(
                    RejectReason::MissingEventId,
                    format!("the event id ({}) is missing", m.id),
                ));
            }
            Some(Value::String(s)) if s.is_empty() => {
                return Err(reject(
                    RejectReason::EmptyEventId,
                    format!("the event id ({}) is empty", m.id),
                ));
            }
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(reject(
                    RejectReason::WrongType,
                    format!(
                        "the event id ({}) must be a string, got {}",
                        m.id,
                        kind(other)
                    ),
                ));
            }
        };
        let text = self.text(m)?;
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
        fn at(s: &Option<Source>) -> &str {
            s.as_ref().map_or("", |s| s.name.as_str())
        }
        let mut o = Optional::default();
        let user_id = o.id_like(
            OptionalField::UserId,
            at(&m.user_id),
            self.take(m.user_id.as_ref()),
        );
        let tenant = o.id_like(
            OptionalField::Tenant,
            at(&m.tenant),
            self.take(m.tenant.as_ref()),
        );
        let lang = o.string(OptionalField::Lang, at(&m.lang), self.take(m.lang.as_ref()));
        let created_at_ms = o.created_at(
            at(&m.created_at),
            self.take(m.created_at.as_ref()),
            m.created_at_unit,
        );
        let priority = o.priority(at(&m.priority), self.take(m.priority.as_ref()));
        let metadata = o.object(
            OptionalField::Metadata,
            at(&m.metadata),
            self.take(m.metadata.as_ref()),
        );
        Ok(Event {
            event_id,
            text,
            user_id,
            lang,
            created_at_ms,
            priority,
            metadata,
            tenant,
            warnings: o.warnings,
        })
    }

    /// The text sources that are there, joined; one of another type is
    /// the event's fault.
    fn text(&self, m: &Compiled) -> Result<String, Rejection> {
        let mut parts: Vec<Cow<'_, str>> = Vec::with_capacity(m.text.len());
        for source in &m.text {
            match self.get(source) {
                None => {}
                Some(Cow::Borrowed(Value::String(s))) => parts.push(Cow::Borrowed(s)),
                Some(Cow::Owned(Value::String(s))) => parts.push(Cow::Owned(s)),
                Some(v) if v.is_null() => {}
                Some(other) => {
                    return Err(reject(
                        RejectReason::WrongType,
                        format!("text ({source}) must be a string, got {}", kind(&other)),
                    ));
                }
            }
        }
        let names = || {
            m.text
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if parts.is_empty() {
            return Err(reject(
                RejectReason::MissingText,
                format!("text ({}) is missing", names()),
            ));
        }
        parts.retain(|p| !p.is_empty());
        match parts.len() {
            0 => Err(reject(
                RejectReason::EmptyText,
                format!("text ({}) is empty", names()),
            )),
            1 => Ok(parts.swap_remove(0).into_owned()),
            _ => Ok(parts.join(&m.text_separator)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    fn decoder(input: &str) -> Decoder {
        let s = Settings::from_toml(&format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\n{input}"
        ))
        .unwrap();
        Decoder::new(&s.input, &s.limits)
    }

    fn decode(
        d: &Decoder,
        topic: &str,
        payload: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Event, Rejection> {
        let headers: Vec<(String, Option<Vec<u8>>)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec())))
            .collect();
        d.decode(
            topic,
            RecordParts {
                key: key.map(str::as_bytes),
                payload: Some(payload.as_bytes()),
                headers: &headers,
            },
        )
    }

    const FEED: &str = r#"
        topics = ["posts", "comments"]
        [input.mapping]
        id = "/post/id"
        text = ["/post/title", "/post/body"]
        text_separator = " | "
        tenant = "/community/name"
        created_at = "/post/created_utc"
        user_id = "key"
        lang = "header:lang"
        [[input.mappings]]
        topics = ["comments"]
        id = "ce:id"
        text = "/body"
        created_at = "ce:time"
    "#;

    #[test]
    fn a_nested_post_is_read_by_its_mapping() {
        let d = decoder(FEED);
        let e = decode(
            &d,
            "posts",
            r#"{"post": {"id": "p1", "title": "Hello", "body": "world", "created_utc": 1796099449.85},
                "community": {"name": "kids"}}"#,
            Some("u7"),
            &[("lang", "en")],
        )
        .unwrap();
        assert_eq!(e.event_id, "p1");
        assert_eq!(e.text, "Hello | world");
        assert_eq!(e.tenant.as_deref(), Some("kids"));
        assert_eq!(e.created_at_ms, Some(1_796_099_449_850));
        assert_eq!(
            (e.user_id.as_deref(), e.lang.as_deref()),
            (Some("u7"), Some("en"))
        );
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
        // A title alone is enough.
        let e = decode(
            &d,
            "posts",
            r#"{"post": {"id": "p2", "title": "Hi"}}"#,
            None,
            &[],
        )
        .unwrap();
        assert_eq!(e.text, "Hi");
    }

    #[test]
    fn a_missing_or_wrong_typed_required_field_names_its_pointer() {
        let d = decoder(FEED);
        let no_id = decode(&d, "posts", r#"{"post": {"title": "t"}}"#, None, &[]).unwrap_err();
        assert_eq!(no_id.reason, RejectReason::MissingEventId);
        assert!(no_id.message.contains("/post/id"), "{}", no_id.message);
        let bad_body = decode(
            &d,
            "posts",
            r#"{"post": {"id": "p", "body": 5}}"#,
            None,
            &[],
        )
        .unwrap_err();
        assert_eq!(bad_body.reason, RejectReason::WrongType);
        assert!(
            bad_body.message.contains("/post/body"),
            "{}",
            bad_body.message
        );
        let no_text = decode(&d, "posts", r#"{"post": {"id": "p"}}"#, None, &[]).unwrap_err();
        assert_eq!(no_text.reason, RejectReason::MissingText);
        assert!(
            no_text.message.contains("/post/title, /post/body"),
            "{}",
            no_text.message
        );
    }

    #[test]
    fn cloudevents_in_binary_and_structured_mode_map_their_attributes() {
        let d = decoder(FEED);
        let binary = decode(
            &d,
            "comments",
            r#"{"body": "nice"}"#,
            None,
            &[
                ("ce_specversion", "1.0"),
                ("ce_id", "c-1"),
                ("ce_source", "/feed"),
                ("ce_type", "comment.created"),
                ("ce_time", "2026-11-29T10:00:00Z"),
            ],
        )
        .unwrap();
        assert_eq!(
            (binary.event_id.as_str(), binary.text.as_str()),
            ("c-1", "nice")
        );
        assert_eq!(binary.created_at_ms, Some(1_795_946_400_000));
        let structured = decode(
            &d,
            "comments",
            r#"{"specversion": "1.0", "id": "c-2", "source": "/feed", "type": "comment.created",
                "time": "2026-11-29T10:00:00Z", "data": {"body": "hm"}}"#,
            None,
            &[("content-type", "application/cloudevents+json")],
        )
        .unwrap();
        assert_eq!(
            (structured.event_id.as_str(), structured.text.as_str()),
            ("c-2", "hm")
        );
        // Not a CloudEvent: no attributes, so no id.
        let plain = decode(&d, "comments", r#"{"body": "x"}"#, None, &[]).unwrap_err();
        assert_eq!(plain.reason, RejectReason::MissingEventId);
        assert!(plain.message.contains("ce:id"), "{}", plain.message);
    }

    #[test]
    fn a_compiled_pointer_reads_what_serde_json_pointer_reads() {
        let v: Value = serde_json::from_str(
            r#"{"a": {"b/c": [10, {"d~e": "x"}], "": 1, "0": "zero"}, "list": [1, 2, 3]}"#,
        )
        .unwrap();
        for p in [
            "/a",
            "/a/b~1c",
            "/a/b~1c/0",
            "/a/b~1c/1/d~0e",
            "/a/b~1c/01",
            "/a/b~1c/+1",
            "/a/b~1c/-1",
            "/a/b~1c/",
            "/a/",
            "/a/0",
            "/list/2",
            "/list/3",
            "/missing",
            "/a/b~1c/0/deeper",
            "/list/1e0",
        ] {
            let compiled = Source::new(FieldSource::Pointer(p.to_string()));
            assert_eq!(lookup(&v, &compiled.tokens), v.pointer(p), "{p}");
        }
    }
}
