//! Settings: `config/modstream.toml` (or `--config PATH`) layered with
//! environment variables `MODSTREAM__SECTION__KEY`.
//!
//! Guarantee: a `Settings` value that left [`Settings::load`] is valid. Every
//! problem is reported with its key and the reason before any connection is
//! made, and librdkafka properties that would break at-least-once delivery are
//! refused here rather than discovered in production.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

mod delivery;
mod file;
mod input;
mod matching;
mod models;
mod paths;
mod properties;
mod registry;
mod sampling;
mod state;
#[cfg(test)]
mod tests;
mod traces;
mod validate;

pub use delivery::DeliveryMode;
pub use file::REQUIRED;
pub use input::{FieldSource, InputSettings, Mapping, TimeUnit};
pub use matching::{ListFile, ListMode, ListTopicLate, MatchingSettings};
pub use models::{ModelSettings, ModelSpec, RunLimit, SINGLE_MODEL};
pub use paths::beside_the_binary;
pub use properties::{Properties, REDACTED, is_secret};
pub use registry::{CloudEventsOutput, InputFormat, OutputFormat, SchemaRegistrySettings};
pub use sampling::SamplingSettings;
pub use state::StateSettings;
pub use traces::{OTEL_ENDPOINTS, TracingSettings};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration")]
    Load(#[from] config::ConfigError),
    #[error("invalid configuration: {key}: {reason}")]
    Invalid { key: String, reason: String },
    /// Settings that do not deserialize, with no one key to blame.
    #[error("invalid configuration: {0}")]
    Unreadable(String),
    /// The file itself: not readable, not TOML.
    #[error("invalid configuration file {path}: {reason}")]
    File { path: String, reason: String },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub input: InputSettings,
    #[serde(default)]
    pub output: OutputSettings,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub batching: BatchingSettings,
    #[serde(default)]
    pub inference: InferenceSettings,
    #[serde(default)]
    pub policy: Policy,
    #[serde(default)]
    pub matching: MatchingSettings,
    #[serde(default)]
    pub sampling: SamplingSettings,
    #[serde(default)]
    pub state: StateSettings,
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    #[serde(default)]
    pub tracing: TracingSettings,
    #[serde(default)]
    pub schema_registry: SchemaRegistrySettings,
    /// The file these settings were read from (SIGHUP reads it again).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub bootstrap_servers: String,
    #[serde(default = "default_group_id")]
    pub group_id: String,
    /// How long a revoke may wait for in-flight work before giving up on it.
    #[serde(default = "default_drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// How often stored offsets are committed.
    #[serde(default = "default_commit_interval", with = "humantime_serde")]
    pub commit_interval: Duration,
    /// At start, how long to wait for the cluster to answer before failing.
    #[serde(default = "default_startup_timeout", with = "humantime_serde")]
    pub startup_timeout: Duration,
    /// After SIGTERM, how long to wait for in-flight events to be delivered
    /// before giving up on them (they stay uncommitted) and exiting non-zero.
    #[serde(default = "default_shutdown_timeout", with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// How long deliveries may keep failing for a reason that concerns the
    /// whole service (not authorized, topic missing) before modstream stops
    /// with that reason, exit non-zero (/readyz fails meanwhile).
    #[serde(default = "default_service_failure_timeout", with = "humantime_serde")]
    pub service_failure_timeout: Duration,
    /// `at_least_once` (offsets committed after the broker acknowledged the
    /// verdicts) or `exactly_once` (verdicts, dead-letter records and offsets
    /// in one Kafka transaction; see `crate::producer::transaction`).
    #[serde(default)]
    pub delivery: DeliveryMode,
    /// With `exactly_once`: this instance's part of the transactional id
    /// `<group_id>.<instance_id>` (see [`KafkaSettings::transactional_id`]).
    /// Keep it stable across restarts of one instance (a StatefulSet pod's
    /// name): the restarted instance then fences the old one and aborts its
    /// open transaction at once. Default: the host name.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// With `exactly_once`: the bound on one transaction's commit (its records
    /// acknowledged, its offsets sent, the commit itself); past it the
    /// transaction is aborted. Also the producer's `transaction.timeout.ms`:
    /// the broker aborts a transaction left open this long by a dead instance.
    #[serde(default = "default_transaction_timeout", with = "humantime_serde")]
    pub transaction_timeout: Duration,
    /// Extra librdkafka consumer properties, passed through.
    #[serde(default)]
    pub consumer: Properties,
    /// Extra librdkafka producer properties, passed through.
    #[serde(default)]
    pub producer: Properties,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSettings {
    pub topic: String,
    pub dlq_topic: String,
    /// Comparison records of the shadow model (`inference.shadow`).
    pub shadow_topic: String,
    /// Verdicts in JSON, or Avro through the Schema Registry.
    pub format: OutputFormat,
    /// Verdicts as CloudEvents.
    pub cloudevents: CloudEventsOutput,
    /// One decision record per event (policy, rule, models, reasons), keyed by event id.
    pub decisions_topic: Option<String>,
    /// Wave records (`[matching] waves`): when a wave starts and as it grows.
    pub waves_topic: Option<String>,
    /// Risk-weighted samples for human labels (`[sampling]`); unset: none.
    pub samples_topic: Option<String>,
    /// How long an offset waits for a decision, wave or sample record
    /// before giving it up (counted); while its topic keeps failing, its
    /// records are given up at once but for one try per this interval.
    #[serde(with = "humantime_serde")]
    pub analytics_timeout: Duration,
}

impl OutputSettings {
    /// The analytics topics configured, by key: records there are given up
    /// (counted) when the topic fails, instead of holding moderation.
    pub fn analytics_topics(&self) -> Vec<(&'static str, &String)> {
        [
            ("output.decisions_topic", &self.decisions_topic),
            ("output.waves_topic", &self.waves_topic),
            ("output.samples_topic", &self.samples_topic),
        ]
        .into_iter()
        .filter_map(|(key, topic)| Some((key, topic.as_ref()?)))
        .collect()
    }
}

impl Default for OutputSettings {
    fn default() -> Self {
        OutputSettings {
            topic: "moderation.verdicts".to_string(),
            dlq_topic: "moderation.dlq".to_string(),
            shadow_topic: "moderation.shadow".to_string(),
            format: OutputFormat::default(),
            cloudevents: CloudEventsOutput::default(),
            decisions_topic: None,
            analytics_timeout: Duration::from_secs(10),
            waves_topic: None,
            samples_topic: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_payload_bytes: usize,
    pub max_text_bytes: usize,
    /// Events consumed but not yet delivered; past this the partitions pause.
    pub max_in_flight: usize,
    /// Bytes (key, value, headers) of the records consumed and not yet
    /// delivered; past this the partitions pause. A record larger than this
    /// still goes through, alone.
    pub max_in_flight_bytes: usize,
    /// A partition whose oldest undelivered event waited this long is
    /// stalled: metrics, one error log, /readyz fails until it moves.
    #[serde(with = "humantime_serde")]
    pub stall_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload_bytes: 256 * 1024,
            max_text_bytes: 64 * 1024,
            max_in_flight: 10_000,
            max_in_flight_bytes: 128 * 1024 * 1024,
            stall_after: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchingSettings {
    pub max_batch_size: usize,
    #[serde(with = "humantime_serde")]
    pub max_batch_delay: Duration,
    /// The latency target: when set, batch size and deadline are chosen
    /// continuously (see [`crate::hub::stages::scoring::slo`]) with `max_batch_size` and
    /// `max_batch_delay` as their upper bounds.
    #[serde(with = "humantime_serde")]
    pub target_p99: Option<Duration>,
    /// A budget of predicted tokens per batch and per model run (see
    /// [`crate::inference::tokens::TokenEstimate`]): a batch also closes before the post
    /// that would take it over, so a run's cost, not only its count, is bounded.
    pub max_batch_tokens: Option<u64>,
}

impl Default for BatchingSettings {
    fn default() -> Self {
        BatchingSettings {
            max_batch_size: 64,
            max_batch_delay: Duration::from_millis(20),
            target_p99: None,
            max_batch_tokens: None,
        }
    }
}

/// A setting that takes one of a fixed set of strings: an unknown one is
/// refused with the allowed ones (serde's own enum errors, as the config
/// library words them, do not list them).
macro_rules! choice {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "&'static str")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// The values the setting takes.
            pub const ALL: &[&'static str] = &[$($text),+];

            /// The value as written in the configuration.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl From<$name> for &'static str {
            fn from(value: $name) -> Self {
                value.name()
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(value: String) -> Result<Self, String> {
                match value.as_str() {
                    $($text => Ok($name::$variant),)+
                    other => Err(format!(
                        "{UNKNOWN_VALUE} {other:?}; use one of: {}",
                        Self::ALL.join(", ")
                    )),
                }
            }
        }
    };
}

/// How [`choice`] errors start (to tell them from other errors).
const UNKNOWN_VALUE: &str = "unknown value";

mod inference;
mod session;
pub use inference::{InferenceSettings, ShadowSettings};
pub use session::{GraphOptimization, MemoryArena, SessionOptions, Workers};

choice! {
    /// An ONNX Runtime execution provider.
    #[derive(clap::ValueEnum)]
    ExecutionProvider { Cpu = "cpu", Cuda = "cuda", Tensorrt = "tensorrt" }
}

choice! {
    /// Token models: how a batch is split into padded forward passes.
    PadTo { Longest = "longest", Bucket = "bucket" }
}

choice! {
    LogFormat { Text = "text", Json = "json" }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub review_at: f32,
    pub block_at: f32,
    /// Per-label thresholds (`[policy.labels.toxic] review_at = .., block_at = ..`).
    /// When set, every listed label is judged and the most severe verdict
    /// wins; when empty, the manifest's `score_label` with the thresholds above.
    pub labels: std::collections::BTreeMap<String, Thresholds>,
    /// The policy file (rules per community over the models); it replaces the thresholds above.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    pub review_at: f32,
    pub block_at: f32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            review_at: 0.5,
            block_at: 0.85,
            labels: Default::default(),
            file: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// Address of the /metrics, /healthz, /readyz listener.
    pub listen: std::net::SocketAddr,
    /// "text" or "json".
    pub log_format: LogFormat,
    /// Used when RUST_LOG is not set.
    pub log_level: String,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 9464)),
            log_format: LogFormat::Text,
            log_level: "info".to_string(),
        }
    }
}

fn default_group_id() -> String {
    "modstream".to_string()
}
fn default_drain_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_startup_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_shutdown_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_service_failure_timeout() -> Duration {
    Duration::from_secs(300)
}
fn default_commit_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_transaction_timeout() -> Duration {
    Duration::from_secs(10)
}

/// A list, or one string (from an env var) holding comma-separated names.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let names = match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s.split(',').map(str::to_string).collect(),
        OneOrMany::Many(v) => v,
    };
    Ok(names
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

impl Settings {
    /// The effective configuration as pretty JSON, secrets redacted.
    pub fn redacted_dump(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("cannot render config: {e}"))
    }

    /// Every setting checked against the others; the first problem names
    /// its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate::kafka(&self.kafka)?;
        validate::topics(&self.input, &self.output)?;
        input::validate(&self.input)?;
        registry::validate(self)?;
        validate::batching_and_limits(&self.batching, &self.limits)?;
        validate::inference(&self.inference)?;
        models::validate(self)?;
        validate::policy(&self.policy)?;
        matching::validate(&self.matching)?;
        sampling::validate(&self.sampling)?;
        state::validate(&self.state)?;
        traces::validate(&self.tracing)?;
        if let Some(model) = &self.sampling.model
            && !self.models().iter().any(|m| &m.name == model)
        {
            return Err(invalid(
                "sampling.model",
                format!("{model:?} is not a model of [inference]"),
            ));
        }
        Ok(())
    }
}
