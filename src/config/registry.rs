//! `[schema_registry]`, and the record formats of `input.format` and
//! `output.format` that need it.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use super::{ConfigError, REDACTED, Settings, invalid};

/// How input record values are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// A JSON object (or a CloudEvent carrying one).
    #[default]
    Json,
    /// The Confluent wire format (magic byte 0, schema id) and Avro binary.
    Avro,
    /// The Confluent wire format with message indexes, then Protobuf.
    Protobuf,
    /// The Confluent wire format, then JSON.
    JsonSchema,
}

impl InputFormat {
    pub fn needs_registry(self) -> bool {
        self != InputFormat::Json
    }
}

/// How verdicts are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    #[default]
    Json,
    /// Avro in the Confluent wire format, the verdict schema registered
    /// under `<output.topic>-value` at start.
    Avro,
}

/// Verdicts as CloudEvents (the input's event id as `subject`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CloudEventsOutput {
    #[default]
    Off,
    /// `ce_*` headers; the value is the verdict.
    Binary,
    /// The value is a JSON envelope whose `data` is the verdict.
    Structured,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SchemaRegistrySettings {
    /// The Confluent-compatible API (Confluent Schema Registry, Apicurio's
    /// `/apis/ccompat/v7`, Redpanda, Karapace).
    pub url: Option<String>,
    /// HTTP basic authentication.
    pub username: Option<String>,
    #[serde(serialize_with = "redacted")]
    pub password: Option<String>,
    /// PEM file of the CA that signed the registry's certificate.
    pub ca_location: Option<PathBuf>,
    /// One request's bound.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// While the registry cannot be reached, records wait (in order, never
    /// dead-lettered); it is asked again after this, doubling up to 10 s.
    #[serde(with = "humantime_serde")]
    pub retry_backoff: Duration,
}

impl Default for SchemaRegistrySettings {
    fn default() -> Self {
        SchemaRegistrySettings {
            url: None,
            username: None,
            password: None,
            ca_location: None,
            request_timeout: Duration::from_secs(5),
            retry_backoff: Duration::from_millis(500),
        }
    }
}

fn redacted<S: Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_str(REDACTED),
        None => s.serialize_none(),
    }
}

pub(super) fn validate(settings: &Settings) -> Result<(), ConfigError> {
    let registry = &settings.schema_registry;
    let needs = [
        ("input.format", settings.input.format.needs_registry()),
        (
            "output.format",
            settings.output.format == OutputFormat::Avro,
        ),
    ];
    for (key, needed) in needs {
        if needed && registry.url.is_none() {
            return Err(invalid(
                key,
                "this format needs schema_registry.url (a Confluent-compatible registry)",
            ));
        }
    }
    if let Some(url) = &registry.url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(invalid(
            "schema_registry.url",
            "must start with http:// or https://",
        ));
    }
    if registry.password.is_some() != registry.username.is_some() {
        return Err(invalid(
            "schema_registry.password",
            "username and password go together",
        ));
    }
    if registry.request_timeout.is_zero() || registry.retry_backoff.is_zero() {
        return Err(invalid(
            "schema_registry.request_timeout",
            "request_timeout and retry_backoff must be above zero",
        ));
    }
    if settings.output.format == OutputFormat::Avro
        && settings.output.cloudevents == CloudEventsOutput::Structured
    {
        return Err(invalid(
            "output.cloudevents",
            "structured mode is a JSON envelope; with output.format = \"avro\" use \"binary\"",
        ));
    }
    Ok(())
}
