//! The mapping applied: an event read from a decoded value, the record's
//! key and headers, and its CloudEvents attributes, by the sources of
//! [`crate::config::Mapping`].

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::Value;
use smallvec::SmallVec;

use super::cloudevents::{self, Attributes, Carried};
use super::fields::{Optional, OptionalField};
use super::{Event, RejectReason, Rejection, kind, parse_json, reject, utf8};
use crate::config::{FieldSource, InputSettings, Limits, Mapping, TimeUnit};

mod paths;

use paths::{Captured, Paths};

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
    /// A pointer that no other source's pointer lies along (neither leads
    /// into nor out of it): nothing else reads its value, so it is moved
    /// out of the record's tree, not copied ([`Compiled::mark_exclusive`]).
    exclusive: bool,
    /// For a pointer: the nodes of its mapping's [`Paths`] it passes
    /// through.
    path: Vec<usize>,
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
            exclusive: false,
            path: Vec::new(),
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
            Value::Array(items) => items.get(index(token)?)?,
            _ => return None,
        };
    }
    Some(value)
}

/// An array index token: decimal without a sign or a leading zero.
fn index(token: &str) -> Option<usize> {
    let valid = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    token.parse().ok().filter(|_| valid)
}

/// [`lookup`], to move the value out.
fn lookup_mut<'v>(mut value: &'v mut Value, tokens: &[String]) -> Option<&'v mut Value> {
    for token in tokens {
        value = match value {
            Value::Object(map) => map.get_mut(token)?,
            Value::Array(items) => items.get_mut(index(token)?)?,
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
    /// What its pointers read of a record's JSON value.
    paths: Paths,
}

impl Compiled {
    /// Sources were checked when the settings loaded; one that does not
    /// parse reads nothing.
    fn new(m: &Mapping) -> Compiled {
        let parse = |s: &str| FieldSource::parse(s).ok().flatten().map(Source::new);
        let mut compiled = Compiled {
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
            paths: Paths::new(),
        };
        compiled.mark_exclusive();
        let mut paths = Paths::new();
        for source in compiled.sources_mut() {
            if matches!(source.from, FieldSource::Pointer(_)) {
                source.path = paths.add(&source.tokens);
            }
        }
        compiled.paths = paths;
        compiled
    }

    fn sources_mut(&mut self) -> impl Iterator<Item = &mut Source> {
        let optional = [
            &mut self.user_id,
            &mut self.lang,
            &mut self.created_at,
            &mut self.priority,
            &mut self.tenant,
            &mut self.metadata,
        ];
        (std::iter::once(&mut self.id))
            .chain(self.text.iter_mut())
            .chain(optional.into_iter().flatten())
    }

    /// A pointer is exclusive when no other pointer is a prefix of it or
    /// has it as a prefix (the same pointer twice included): moving its
    /// value out then changes nothing another source reads.
    fn mark_exclusive(&mut self) {
        let pointers: Vec<Option<Vec<String>>> = (self.sources_mut())
            .map(|s| matches!(s.from, FieldSource::Pointer(_)).then(|| s.tokens.clone()))
            .collect();
        for (i, source) in self.sources_mut().enumerate() {
            source.exclusive = pointers[i].as_ref().is_some_and(|p| {
                (pointers.iter().enumerate())
                    .filter(|(j, _)| *j != i)
                    .all(|(_, q)| {
                        q.as_ref()
                            .is_none_or(|q| !q.starts_with(p) && !p.starts_with(q))
                    })
            });
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
    /// has none. Only what the mapping reads is kept of the value
    /// ([`paths`]).
    pub fn decode(&self, topic: &str, record: RecordParts<'_>) -> Result<Event, Rejection> {
        let mapping = self.mapping(topic);
        self.decode_as(mapping, record, |bytes| mapping.paths.parse(utf8(bytes)?))
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
        let mapping = self.mapping(topic);
        self.decode_as(mapping, record, |bytes| value(bytes).map(Captured::whole))
    }

    fn mapping(&self, topic: &str) -> &Compiled {
        self.by_topic.get(topic).unwrap_or(&self.default)
    }

    fn decode_as(
        &self,
        mapping: &Compiled,
        record: RecordParts<'_>,
        value: impl FnOnce(&[u8]) -> Result<Captured, Rejection>,
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
            Carried::Structured(envelope) => {
                let (attributes, data) = cloudevents::open_envelope(parse_json(envelope)?)?;
                (attributes, Captured::whole(data))
            }
        };
        if let Some(other) = data.not_an_object() {
            return Err(reject(
                RejectReason::NotAnObject,
                format!("payload is JSON {}, not an object", kind(other)),
            ));
        }
        let mut view = View {
            data,
            record,
            attributes,
        };
        view.event(mapping, &self.limits)
    }
}

/// One record's sources.
struct View<'a> {
    data: Captured,
    record: RecordParts<'a>,
    attributes: Attributes,
}

impl View<'_> {
    fn get(&self, source: &Source) -> Option<Cow<'_, Value>> {
        let text = |b: &[u8]| Cow::Owned(Value::String(String::from_utf8_lossy(b).into_owned()));
        match &source.from {
            FieldSource::Pointer(_) => (self.data)
                .get(&source.path, &source.tokens)
                .map(Cow::Borrowed),
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

    /// A source's value, moved out of the tree where it is exclusive.
    fn take(&mut self, source: Option<&Source>) -> Option<Value> {
        let source = source?;
        if source.exclusive {
            return (self.data)
                .get_mut(&source.path, &source.tokens)
                .map(std::mem::take);
        }
        self.get(source).map(Cow::into_owned)
    }

    fn event(&mut self, m: &Compiled, limits: &Limits) -> Result<Event, Rejection> {
        let event_id = match self.take(Some(&m.id)) {
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
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(reject(
                    RejectReason::WrongType,
                    format!(
                        "the event id ({}) must be a string, got {}",
                        m.id,
                        kind(&other)
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
    fn text(&mut self, m: &Compiled) -> Result<String, Rejection> {
        // Inline for up to two text sources: no allocation per record.
        let moved: SmallVec<[Option<Value>; 2]> = (m.text.iter())
            .map(|s| s.exclusive.then(|| self.take(Some(s))).flatten())
            .collect();
        let mut parts: SmallVec<[Cow<'_, str>; 2]> = SmallVec::new();
        for (source, moved) in m.text.iter().zip(moved) {
            let value = match source.exclusive {
                true => moved.map(Cow::Owned),
                false => self.get(source),
            };
            match value {
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
mod tests;
