//! `[input]`: the topics, and where each field of an event comes from
//! (`[input.mapping]`, and `[[input.mappings]]` for topics that differ).
//!
//! A field's source is written as a string: a JSON pointer into the
//! decoded value (`"/post/id"`; RFC 6901, `""` is the whole value), `"key"`
//! (the record key as UTF-8), `"header:NAME"` (a record header as UTF-8),
//! or `"ce:ATTRIBUTE"` (a CloudEvents attribute: `id`, `source`, `type`,
//! `time`, `subject`, ...). An optional field set to `""` is not read.

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid, one_or_many};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InputSettings {
    #[serde(deserialize_with = "one_or_many")]
    pub topics: Vec<String>,
    /// How record values are encoded (registry formats need
    /// `[schema_registry]`).
    #[serde(default)]
    pub format: super::InputFormat,
    /// The mapping of every topic without its own.
    #[serde(default)]
    pub mapping: Mapping,
    /// Mappings of particular topics (each names its `topics`).
    #[serde(default)]
    pub mappings: Vec<Mapping>,
    /// An input topic that does not exist at start fails it (else the
    /// service starts, and /readyz says which are missing until they exist).
    #[serde(default)]
    pub require_topics: bool,
}

impl InputSettings {
    /// The mapping that applies to `topic`.
    pub fn mapping_of(&self, topic: &str) -> &Mapping {
        self.mappings
            .iter()
            .find(|m| m.topics.iter().any(|t| t == topic))
            .unwrap_or(&self.mapping)
    }
}

/// Where an event's fields come from. The default is the event schema of
/// [`crate::event`]: `{"event_id", "text", "user_id", "lang", "created_at",
/// "priority", "tenant", "metadata"}` at the top of a JSON object.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Mapping {
    /// `[[input.mappings]]` only: the input topics it applies to.
    #[serde(
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub topics: Vec<String>,
    /// Required: a string, or a whole number (written in decimal).
    pub id: String,
    /// Required: one source, or several joined with `text_separator` (the
    /// missing ones skipped; the event needs at least one).
    #[serde(deserialize_with = "one_or_many_raw")]
    pub text: Vec<String>,
    pub text_separator: String,
    pub user_id: String,
    pub lang: String,
    /// RFC 3339, or epoch seconds or milliseconds (`created_at_unit`).
    pub created_at: String,
    pub created_at_unit: TimeUnit,
    /// `"normal"` or `"urgent"` (any case).
    pub priority: String,
    /// The tenant or community the event belongs to (a string or a whole
    /// number).
    pub tenant: String,
    /// An object echoed nowhere, kept with the event.
    pub metadata: String,
}

impl Default for Mapping {
    fn default() -> Self {
        Mapping {
            topics: Vec::new(),
            id: "/event_id".into(),
            text: vec!["/text".into()],
            text_separator: "\n\n".into(),
            user_id: "/user_id".into(),
            lang: "/lang".into(),
            created_at: "/created_at".into(),
            created_at_unit: TimeUnit::Auto,
            priority: "/priority".into(),
            tenant: "/tenant".into(),
            metadata: "/metadata".into(),
        }
    }
}

/// How a numeric `created_at` is read.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimeUnit {
    /// Below 10^11 seconds (the year 5138), else milliseconds: 10^11 ms is
    /// March 1973, so the two never meet for posts of this century.
    #[default]
    Auto,
    Seconds,
    Milliseconds,
}

/// One field's source, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldSource {
    /// A JSON pointer into the decoded value.
    Pointer(String),
    Key,
    Header(String),
    CloudEvent(String),
}

impl FieldSource {
    /// `None` for `""` (the field is not read).
    pub fn parse(text: &str) -> Result<Option<FieldSource>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        if text == "key" {
            return Ok(Some(FieldSource::Key));
        }
        if let Some(name) = text.strip_prefix("header:") {
            return match name {
                "" => Err("header: needs a header name".into()),
                n => Ok(Some(FieldSource::Header(n.to_string()))),
            };
        }
        if let Some(name) = text.strip_prefix("ce:") {
            return match name {
                "" => Err("ce: needs a CloudEvents attribute name".into()),
                n if n
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) =>
                {
                    Ok(Some(FieldSource::CloudEvent(n.to_string())))
                }
                n => Err(format!(
                    "ce:{n}: CloudEvents attribute names are lower-case letters and digits"
                )),
            };
        }
        if text.starts_with('/') {
            return Ok(Some(FieldSource::Pointer(text.to_string())));
        }
        Err(format!(
            "{text:?} is not a source: write a JSON pointer (\"/post/id\"), \"key\", \"header:NAME\" or \"ce:ATTRIBUTE\""
        ))
    }
}

impl std::fmt::Display for FieldSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldSource::Pointer(p) => f.write_str(p),
            FieldSource::Key => f.write_str("key"),
            FieldSource::Header(h) => write!(f, "header:{h}"),
            FieldSource::CloudEvent(a) => write!(f, "ce:{a}"),
        }
    }
}

/// A list of sources, or one; unlike topic lists a source is not split at
/// commas (a JSON pointer may hold one).
fn one_or_many_raw<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// Every source parses, the required ones are set, and each topic of
/// `[[input.mappings]]` is an input topic named once.
pub(super) fn validate(input: &InputSettings) -> Result<(), ConfigError> {
    check(&input.mapping, "input.mapping")?;
    let mut seen = std::collections::HashSet::new();
    for (i, m) in input.mappings.iter().enumerate() {
        let key = format!("input.mappings[{i}]");
        if m.topics.is_empty() {
            return Err(invalid(
                &format!("{key}.topics"),
                "name the input topics this mapping applies to",
            ));
        }
        for t in &m.topics {
            if !input.topics.contains(t) {
                return Err(invalid(
                    &format!("{key}.topics"),
                    format!("{t:?} is not in input.topics"),
                ));
            }
            if !seen.insert(t.clone()) {
                return Err(invalid(
                    &format!("{key}.topics"),
                    format!("{t:?} has another mapping already"),
                ));
            }
        }
        check(m, &key)?;
    }
    if !input.mapping.topics.is_empty() {
        return Err(invalid(
            "input.mapping.topics",
            "the default mapping applies to every topic without its own; name topics in [[input.mappings]]",
        ));
    }
    Ok(())
}

fn check(m: &Mapping, key: &str) -> Result<(), ConfigError> {
    let parse = |field: &str, text: &str| {
        FieldSource::parse(text).map_err(|e| invalid(&format!("{key}.{field}"), e))
    };
    if parse("id", &m.id)?.is_none() {
        return Err(invalid(&format!("{key}.id"), "the event id is required"));
    }
    if m.text.is_empty() {
        return Err(invalid(&format!("{key}.text"), "the text is required"));
    }
    for t in &m.text {
        if parse("text", t)?.is_none() {
            return Err(invalid(&format!("{key}.text"), "a text source is empty"));
        }
    }
    for (field, text) in [
        ("user_id", &m.user_id),
        ("lang", &m.lang),
        ("created_at", &m.created_at),
        ("priority", &m.priority),
        ("tenant", &m.tenant),
        ("metadata", &m.metadata),
    ] {
        parse(field, text)?;
    }
    Ok(())
}
