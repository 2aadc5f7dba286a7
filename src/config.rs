//! Settings: `config/modstream.toml` (or `--config PATH`) layered with
//! environment variables `MODSTREAM__SECTION__KEY`.
//!
//! Guarantee: a `Settings` value that left [`Settings::load`] is valid. Every
//! problem is reported with its key and the reason before any connection is
//! made, and librdkafka properties that would break at-least-once delivery are
//! refused here rather than discovered in production.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration")]
    Load(#[from] config::ConfigError),
    #[error("invalid configuration: {key}: {reason}")]
    Invalid { key: String, reason: String },
}

/// A value that does not fit its key (wrong type, unknown variant) names
/// the key, like the checks in [`Settings::validate`]; the index of a list
/// element is left out. Other errors (an unknown or missing key) stay as
/// the configuration library words them.
fn with_key(e: config::ConfigError) -> ConfigError {
    let key_of = |key: &str| match key.find('[') {
        Some(i) => key[..i].to_string(),
        None => key.to_string(),
    };
    let about_value = |e: &config::ConfigError| match e {
        config::ConfigError::Type { .. } => true,
        config::ConfigError::Message(m) => m.starts_with(UNKNOWN_VALUE),
        _ => false,
    };
    match e {
        config::ConfigError::At {
            error,
            key: Some(key),
            ..
        } if about_value(&error) => invalid(&key_of(&key), error.to_string()),
        config::ConfigError::Type {
            key: Some(ref key), ..
        } => invalid(&key_of(key), e.to_string()),
        other => ConfigError::Load(other),
    }
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
    pub telemetry: TelemetrySettings,
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
    /// Extra librdkafka consumer properties, passed through.
    #[serde(default)]
    pub consumer: Properties,
    /// Extra librdkafka producer properties, passed through.
    #[serde(default)]
    pub producer: Properties,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InputSettings {
    #[serde(deserialize_with = "one_or_many")]
    pub topics: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSettings {
    pub topic: String,
    pub dlq_topic: String,
    /// Comparison records of the shadow model (`inference.shadow`).
    pub shadow_topic: String,
}

impl Default for OutputSettings {
    fn default() -> Self {
        OutputSettings {
            topic: "moderation.verdicts".to_string(),
            dlq_topic: "moderation.dlq".to_string(),
            shadow_topic: "moderation.shadow".to_string(),
        }
    }
}

/// A candidate model scoring a sample of the live events on spare capacity
/// (see [`crate::shadow`]).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowSettings {
    /// Its directory; unset: no shadow.
    pub model_dir: Option<PathBuf>,
    /// Share of the events it scores, 0 to 1 (by a hash of the event id).
    pub share: f64,
}

impl Default for ShadowSettings {
    fn default() -> Self {
        ShadowSettings {
            model_dir: None,
            share: 1.0,
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
    /// continuously (see [`crate::slo`]) with `max_batch_size` and
    /// `max_batch_delay` as their upper bounds.
    #[serde(with = "humantime_serde")]
    pub target_p99: Option<Duration>,
}

impl Default for BatchingSettings {
    fn default() -> Self {
        BatchingSettings {
            max_batch_size: 64,
            max_batch_delay: Duration::from_millis(20),
            target_p99: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InferenceSettings {
    pub model_dir: PathBuf,
    /// Inference sessions, each on its own thread: "auto" (the default) or a
    /// number. See [`InferenceSettings::worker_count`].
    pub workers: Workers,
    pub intra_threads: usize,
    /// Path of libonnxruntime.so; `ORT_DYLIB_PATH` wins over it.
    pub runtime_library: Option<PathBuf>,
    /// Execution providers in order of preference: "cuda", "tensorrt", "cpu".
    pub execution_providers: Vec<ExecutionProvider>,
    /// GPU for the cuda / tensorrt providers.
    pub device_id: i32,
    /// Half precision where the provider supports it (TensorRT).
    pub fp16: bool,
    /// Fail at start when no GPU provider can be registered, instead of
    /// falling back to CPU with a warning.
    pub require_gpu: bool,
    /// Token models: how a batch is split by token length into forward
    /// passes so that short posts are not padded to a long one.
    /// "longest": sorted by length, cut where padding costs more than
    /// `pass_overhead_tokens` per extra pass, each pass padded to its
    /// longest text. "bucket": one pass per `length_buckets` bucket, padded
    /// to the bucket bound (fixed shapes, e.g. for TensorRT).
    pub pad_to: PadTo,
    /// Token models, pad_to = "longest": a pass's fixed cost in tokens.
    pub pass_overhead_tokens: usize,
    /// Token models: bucket bounds for pad_to = "bucket" (lengths above the
    /// last go to the model's max_length); also the lengths warmed up.
    pub length_buckets: Vec<usize>,
    /// Run each padded shape once at start so that the first real batch does
    /// not pay for allocations and kernel selection.
    pub warm_up: bool,
    /// The circuit breaker: after this many model runs in a row in which
    /// every event failed, the model is taken as broken: events wait instead
    /// of going to the DLQ, consumption pauses, /readyz fails, and a probe
    /// retries the model with backoff (1 s doubling to 30 s) until it works.
    /// 0: never.
    pub breaker_after: u32,
    /// Bytes of the score cache (texts seen again are scored once per
    /// loaded model); 0 turns it off.
    pub cache_bytes: u64,
    /// How often `modstream run` looks for a new model in `model_dir` (a
    /// changed manifest or model file, or a symlink swapped to another
    /// version directory) and loads it without stopping; SIGHUP looks at
    /// once and also re-reads `policy`. 0: only on SIGHUP.
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
    pub shadow: ShadowSettings,
}

impl Default for InferenceSettings {
    fn default() -> Self {
        InferenceSettings {
            model_dir: PathBuf::from("models/profanity-check"),
            workers: Workers::Auto,
            intra_threads: 1,
            runtime_library: None,
            execution_providers: vec![ExecutionProvider::Cpu],
            device_id: 0,
            fp16: false,
            require_gpu: false,
            pad_to: PadTo::Longest,
            pass_overhead_tokens: 24,
            length_buckets: vec![16, 32, 64, 128],
            warm_up: true,
            breaker_after: 5,
            cache_bytes: 0,
            reload_interval: Duration::from_secs(5),
            shadow: ShadowSettings::default(),
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

choice! {
    /// An ONNX Runtime execution provider.
    #[derive(clap::ValueEnum)]
    ExecutionProvider { Cpu = "cpu", Cuda = "cuda", Tensorrt = "tensorrt" }
}

/// How many inference sessions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// As many as serve the hardware (see [`InferenceSettings::worker_count`]).
    Auto,
    Count(usize),
}

impl Serialize for Workers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Workers::Auto => s.serialize_str("auto"),
            Workers::Count(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Count(usize),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Count(n) => Ok(Workers::Count(n)),
            Repr::Text(t) if t.trim() == "auto" => Ok(Workers::Auto),
            // Environment variables arrive as text.
            Repr::Text(t) => t.trim().parse().map(Workers::Count).map_err(|_| {
                serde::de::Error::custom(format!("{UNKNOWN_VALUE} {t:?}; use \"auto\" or a number"))
            }),
        }
    }
}

impl InferenceSettings {
    /// The number of sessions. "auto": on CPU, the cores this process may
    /// use (affinity and cgroup quota, as the standard library reads them)
    /// divided by `intra_threads`, 1 to 64; on a GPU provider, 1 per device
    /// (not measured yet: scripts/gpu-check.sh is the way to find better).
    ///
    /// `"auto"` reads the cgroup files on every call: resolve it once.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            Workers::Count(n) => n,
            Workers::Auto => {
                let gpu = self
                    .execution_providers
                    .first()
                    .is_some_and(|p| *p != ExecutionProvider::Cpu);
                if gpu {
                    return 1;
                }
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (cores / self.intra_threads.max(1)).clamp(1, 64)
            }
        }
    }
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

/// librdkafka properties passed through. Values of secret properties
/// (passwords, keys, secrets) never appear in `Debug` output or config dumps.
#[derive(Clone, Default, PartialEq)]
pub struct Properties(pub BTreeMap<String, String>);

impl std::ops::Deref for Properties {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// Whether a librdkafka property holds a secret.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "ssl.key.pem",
        "ssl_key",
        "sasl.oauthbearer.config",
    ]
    .iter()
    .any(|s| key.contains(s))
}

pub const REDACTED: &str = "<redacted>";

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Properties {
    /// The properties with secret values replaced by [`REDACTED`].
    pub fn redacted(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    if is_secret(k) {
                        REDACTED.to_string()
                    } else {
                        v.clone()
                    },
                )
            })
            .collect()
    }
}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.redacted()).finish()
    }
}

/// Serialized (config dumps) with secrets redacted.
impl Serialize for Properties {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.redacted().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        properties(d).map(Properties)
    }
}

/// librdkafka properties: values may be strings, numbers or booleans; keys
/// from env vars spell dots as underscores (`FETCH_WAIT_MAX_MS`) or nest
/// (`MODSTREAM__KAFKA__CONSUMER__SASL__PASSWORD` is `sasl.password`), and a
/// nested TOML table is read the same way. An error never shows a value:
/// it may be a secret.
fn properties<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    let mut out = BTreeMap::new();
    for (k, v) in raw {
        flatten_property(&k.replace('_', "."), v, &mut out).map_err(serde::de::Error::custom)?;
    }
    Ok(out)
}

fn flatten_property(
    key: &str,
    value: serde_json::Value,
    out: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let value = match value {
        serde_json::Value::String(s) => s,
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Object(nested) => {
            for (k, v) in nested {
                flatten_property(&format!("{key}.{}", k.replace('_', ".")), v, out)?;
            }
            return Ok(());
        }
        serde_json::Value::Array(_) => {
            return Err(format!(
                "property {key}: expected a string, number or boolean, got a list"
            ));
        }
        serde_json::Value::Null => {
            return Err(format!(
                "property {key}: expected a string, number or boolean, got nothing"
            ));
        }
    };
    out.insert(key.to_string(), value);
    Ok(())
}

/// Consumer properties modstream sets itself: overriding them would break the
/// at-least-once guarantee or the meaning of another setting.
const RESERVED_CONSUMER: &[(&str, &str)] = &[
    (
        "enable.auto.offset.store",
        "offsets are stored only after delivery",
    ),
    (
        "enable.auto.commit",
        "modstream commits stored offsets itself (kafka.commit_interval)",
    ),
    ("group.id", "use kafka.group_id"),
    ("bootstrap.servers", "use kafka.bootstrap_servers"),
    (
        "enable.partition.eof",
        "modstream does not handle EOF events",
    ),
];
/// Consumer properties of the classic group protocol only.
const CLASSIC_ONLY: &[&str] = &[
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
];
const RESERVED_PRODUCER: &[(&str, &str)] = &[
    ("bootstrap.servers", "use kafka.bootstrap_servers"),
    ("transactional.id", "modstream does not use transactions"),
];

impl Settings {
    /// Load from an optional file, then `MODSTREAM__*` env vars, then validate.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder();
        let source = match path {
            Some(p) => {
                builder = builder.add_source(config::File::from(p).required(true));
                Some(p.to_path_buf())
            }
            None => {
                builder =
                    builder.add_source(config::File::with_name("config/modstream").required(false));
                Some(PathBuf::from("config/modstream.toml")).filter(|p| p.exists())
            }
        };
        let built = builder
            .add_source(
                config::Environment::with_prefix("MODSTREAM")
                    .prefix_separator("__")
                    .separator("__"),
            )
            .build()?;
        let mut settings: Settings = built.try_deserialize().map_err(with_key)?;
        settings.validate()?;
        settings.source = source;
        Ok(settings)
    }

    /// Parse TOML text (tests and embedded defaults), then validate.
    pub fn from_toml(text: &str) -> Result<Settings, ConfigError> {
        let built = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()?;
        let settings: Settings = built.try_deserialize().map_err(with_key)?;
        settings.validate()?;
        Ok(settings)
    }

    /// The effective configuration as pretty JSON, secrets redacted.
    pub fn redacted_dump(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("cannot render config: {e}"))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return Err(invalid("kafka.bootstrap_servers", "must not be empty"));
        }
        if self.kafka.group_id.trim().is_empty() {
            return Err(invalid("kafka.group_id", "must not be empty"));
        }
        if self.input.topics.is_empty() {
            return Err(invalid("input.topics", "name at least one topic"));
        }
        for (key, topic) in [
            ("output.topic", &self.output.topic),
            ("output.dlq_topic", &self.output.dlq_topic),
        ] {
            if topic.trim().is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
            if self.input.topics.contains(topic) {
                return Err(invalid(
                    key,
                    "must differ from every input topic (it would feed itself)",
                ));
            }
        }
        if self.output.topic == self.output.dlq_topic {
            return Err(invalid("output.dlq_topic", "must differ from output.topic"));
        }
        for (key, value) in &self.kafka.consumer {
            if let Some((_, why)) = RESERVED_CONSUMER.iter().find(|(k, _)| k == key) {
                return Err(invalid(
                    &format!("kafka.consumer.{key}"),
                    format!("cannot be set: {why}"),
                ));
            }
            if key == "isolation.level" && value != "read_committed" && value != "read_uncommitted"
            {
                return Err(invalid(
                    "kafka.consumer.isolation.level",
                    "must be read_committed or read_uncommitted",
                ));
            }
            if key == "group.protocol" && value != "classic" && value != "consumer" {
                return Err(invalid(
                    "kafka.consumer.group.protocol",
                    "must be classic or consumer (KIP-848, Kafka 4.0+)",
                ));
            }
        }
        if self
            .kafka
            .consumer
            .get("group.protocol")
            .map(String::as_str)
            == Some("consumer")
        {
            // With KIP-848 the broker owns these (group.consumer.*); librdkafka
            // refuses them.
            for key in CLASSIC_ONLY {
                if self.kafka.consumer.contains_key(*key) {
                    return Err(invalid(
                        &format!("kafka.consumer.{key}"),
                        "cannot be set with group.protocol = consumer: the broker sets it (group.consumer.* broker configs)",
                    ));
                }
            }
        }
        for (key, value) in &self.kafka.producer {
            if let Some((_, why)) = RESERVED_PRODUCER.iter().find(|(k, _)| k == key) {
                return Err(invalid(
                    &format!("kafka.producer.{key}"),
                    format!("cannot be set: {why}"),
                ));
            }
            if key == "enable.idempotence" && value != "true" {
                return Err(invalid(
                    "kafka.producer.enable.idempotence",
                    "must stay true: retries must not duplicate or reorder verdicts",
                ));
            }
            if (key == "acks" || key == "request.required.acks") && value != "all" && value != "-1"
            {
                return Err(invalid(
                    &format!("kafka.producer.{key}"),
                    "must be all (-1): a verdict counts as delivered only when every in-sync replica has it",
                ));
            }
        }
        let session_timeout_ms: u64 = match self.kafka.consumer.get("session.timeout.ms") {
            Some(v) => v.parse().map_err(|_| {
                invalid(
                    "kafka.consumer.session.timeout.ms",
                    "must be a whole number of milliseconds",
                )
            })?,
            None => 45_000,
        };
        if self.kafka.drain_timeout.as_millis() as u64 >= session_timeout_ms {
            return Err(invalid(
                "kafka.drain_timeout",
                format!(
                    "must be below session.timeout.ms ({session_timeout_ms} ms), or the group evicts this member while it drains"
                ),
            ));
        }
        if self.kafka.drain_timeout.is_zero() {
            return Err(invalid("kafka.drain_timeout", "must be greater than zero"));
        }
        if self.kafka.shutdown_timeout.is_zero() {
            return Err(invalid(
                "kafka.shutdown_timeout",
                "must be greater than zero",
            ));
        }
        if self.kafka.commit_interval.is_zero() {
            return Err(invalid(
                "kafka.commit_interval",
                "must be greater than zero",
            ));
        }
        if self.batching.max_batch_size == 0 || self.batching.max_batch_size > 4096 {
            return Err(invalid(
                "batching.max_batch_size",
                "must be between 1 and 4096",
            ));
        }
        if self
            .batching
            .target_p99
            .is_some_and(|t| t < Duration::from_millis(1))
        {
            return Err(invalid("batching.target_p99", "must be at least 1ms"));
        }
        if !(0.0..=1.0).contains(&self.inference.shadow.share) {
            return Err(invalid("inference.shadow.share", "must be between 0 and 1"));
        }
        if self.limits.max_payload_bytes == 0 {
            return Err(invalid(
                "limits.max_payload_bytes",
                "must be greater than zero",
            ));
        }
        if self.limits.max_text_bytes == 0
            || self.limits.max_text_bytes > self.limits.max_payload_bytes
        {
            return Err(invalid(
                "limits.max_text_bytes",
                "must be between 1 and limits.max_payload_bytes",
            ));
        }
        if self.limits.max_in_flight < self.batching.max_batch_size {
            return Err(invalid(
                "limits.max_in_flight",
                "must be at least batching.max_batch_size",
            ));
        }
        if self.limits.max_in_flight_bytes < self.limits.max_payload_bytes {
            return Err(invalid(
                "limits.max_in_flight_bytes",
                "must be at least limits.max_payload_bytes",
            ));
        }
        if self.limits.stall_after < Duration::from_secs(1) {
            return Err(invalid("limits.stall_after", "must be at least 1s"));
        }
        if let Workers::Count(n) = self.inference.workers
            && !(1..=64).contains(&n)
        {
            return Err(invalid(
                "inference.workers",
                "must be \"auto\" or between 1 and 64",
            ));
        }
        if self.inference.intra_threads == 0 {
            return Err(invalid("inference.intra_threads", "must be at least 1"));
        }
        if self.inference.execution_providers.is_empty() {
            return Err(invalid(
                "inference.execution_providers",
                "name at least one (e.g. [\"cpu\"])",
            ));
        }
        let inf = &self.inference;
        if inf.length_buckets.is_empty()
            || inf.length_buckets.contains(&0)
            || !inf.length_buckets.is_sorted()
        {
            return Err(invalid(
                "inference.length_buckets",
                "need ascending token lengths above zero, e.g. [16, 32, 64, 128]",
            ));
        }
        if inf.require_gpu
            && !inf
                .execution_providers
                .iter()
                .any(|e| *e != ExecutionProvider::Cpu)
        {
            return Err(invalid(
                "inference.require_gpu",
                "is set but execution_providers names no GPU provider (cuda or tensorrt)",
            ));
        }
        let p = &self.policy;
        let thresholds = std::iter::once(("policy".to_string(), (p.review_at, p.block_at))).chain(
            p.labels
                .iter()
                .map(|(l, t)| (format!("policy.labels.{l}"), (t.review_at, t.block_at))),
        );
        for (key, (review_at, block_at)) in thresholds {
            if !(0.0..=1.0).contains(&review_at)
                || !(0.0..=1.0).contains(&block_at)
                || review_at > block_at
            {
                return Err(invalid(&key, "need 0 <= review_at <= block_at <= 1"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
        [input]
        topics = ["posts"]
        [output]
    "#;

    fn with(extra: &str) -> Result<Settings, ConfigError> {
        Settings::from_toml(&format!("{MINIMAL}\n{extra}"))
    }

    fn invalid_key(r: Result<Settings, ConfigError>) -> String {
        match r {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid-config error, got {other:?}"),
        }
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let s = with("").unwrap();
        assert_eq!(s.kafka.group_id, "modstream");
        assert_eq!(s.limits.max_payload_bytes, 256 * 1024);
        assert_eq!(s.limits.max_text_bytes, 64 * 1024);
        assert_eq!(s.output.dlq_topic, "moderation.dlq");
        assert_eq!(s.batching.max_batch_size, 64);
    }

    #[test]
    fn the_metrics_listener_binds_loopback_by_default() {
        let s = with("").unwrap();
        assert!(s.telemetry.listen.ip().is_loopback());
        assert_eq!(s.telemetry.listen.port(), 9464);
    }

    #[test]
    fn the_shipped_config_file_is_valid() {
        let text = include_str!("../config/modstream.toml");
        let s = Settings::from_toml(text).unwrap();
        assert_eq!(s.input.topics, vec!["moderation.events".to_string()]);
    }

    #[test]
    fn topics_given_as_one_string_become_a_list() {
        let s =
            Settings::from_toml(&MINIMAL.replace(r#"["posts"]"#, r#""posts, comments""#)).unwrap();
        assert_eq!(
            s.input.topics,
            vec!["posts".to_string(), "comments".to_string()]
        );
    }

    #[test]
    fn properties_that_break_at_least_once_are_refused() {
        let key = invalid_key(with(
            "[kafka.consumer]\n\"enable.auto.offset.store\" = true",
        ));
        assert_eq!(key, "kafka.consumer.enable.auto.offset.store");
        let key = invalid_key(with("[kafka.consumer]\nenable_auto_commit = \"true\""));
        assert_eq!(key, "kafka.consumer.enable.auto.commit");
        let key = invalid_key(with("[kafka.producer]\nacks = 1"));
        assert_eq!(key, "kafka.producer.acks");
        let key = invalid_key(with("[kafka.producer]\n\"enable.idempotence\" = false"));
        assert_eq!(key, "kafka.producer.enable.idempotence");
    }

    #[test]
    fn harmless_properties_pass_through_with_dots() {
        let s = with("[kafka.consumer]\nfetch_wait_max_ms = 10\n\"client.id\" = \"x\"").unwrap();
        assert_eq!(
            s.kafka
                .consumer
                .get("fetch.wait.max.ms")
                .map(String::as_str),
            Some("10")
        );
        assert_eq!(
            s.kafka.consumer.get("client.id").map(String::as_str),
            Some("x")
        );
    }

    #[test]
    fn drain_timeout_must_stay_below_session_timeout() {
        let key = invalid_key(
            with("[kafka.consumer]\n\"session.timeout.ms\" = 6000\n")
                .map(|mut s| {
                    s.kafka.drain_timeout = Duration::from_secs(6);
                    s
                })
                .and_then(|s| s.validate().map(|_| s)),
        );
        assert_eq!(key, "kafka.drain_timeout");
    }

    #[test]
    fn the_consumer_group_protocol_is_allowed_without_classic_only_keys() {
        let kip848 = "[kafka.consumer]\n\"group.protocol\" = \"consumer\"\n";
        with(kip848).and_then(|s| s.validate().map(|_| s)).unwrap();
        assert_eq!(
            invalid_key(
                with(&format!("{kip848}\"session.timeout.ms\" = 6000\n"))
                    .and_then(|s| s.validate().map(|_| s))
            ),
            "kafka.consumer.session.timeout.ms"
        );
        assert_eq!(
            invalid_key(
                with("[kafka.consumer]\n\"group.protocol\" = \"streams\"\n")
                    .and_then(|s| s.validate().map(|_| s))
            ),
            "kafka.consumer.group.protocol"
        );
    }

    #[test]
    fn a_latency_target_is_read_and_checked() {
        let s = with("[batching]\ntarget_p99 = \"50ms\"").unwrap();
        assert_eq!(s.batching.target_p99, Some(Duration::from_millis(50)));
        assert_eq!(with("").unwrap().batching.target_p99, None);
        assert_eq!(
            invalid_key(with("[batching]\ntarget_p99 = \"500us\"")),
            "batching.target_p99"
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(
            invalid_key(with("[batching]\nmax_batch_size = 0")),
            "batching.max_batch_size"
        );
        assert_eq!(
            invalid_key(with("[policy]\nreview_at = 0.9\nblock_at = 0.5")),
            "policy"
        );
        assert_eq!(
            invalid_key(with("[inference]\nexecution_providers = [\"tpu\"]")),
            "inference.execution_providers"
        );
        assert_eq!(
            invalid_key(with("[limits]\nmax_text_bytes = 999999999")),
            "limits.max_text_bytes"
        );
        let same = MINIMAL.replace("[output]", "[output]\ntopic = \"posts\"");
        assert_eq!(invalid_key(Settings::from_toml(&same)), "output.topic");
        assert_eq!(
            invalid_key(with("[inference]\nlength_buckets = [64, 16]")),
            "inference.length_buckets"
        );
        assert_eq!(
            invalid_key(with("[inference]\npad_to = \"max\"")),
            "inference.pad_to"
        );
        assert_eq!(
            invalid_key(with("[inference]\nrequire_gpu = true")),
            "inference.require_gpu",
            "require_gpu needs a GPU provider in the list"
        );
        assert_eq!(
            invalid_key(with(
                "[policy.labels.threat]\nreview_at = 0.6\nblock_at = 0.2"
            )),
            "policy.labels.threat"
        );
        let per_label = with("[policy.labels.threat]\nreview_at = 0.2\nblock_at = 0.5").unwrap();
        assert_eq!(per_label.policy.labels["threat"].block_at, 0.5);
    }

    #[test]
    fn nested_property_tables_are_dotted_names_and_errors_show_no_value() {
        let s = with("[kafka.consumer.sasl]\npassword = \"hunter2\"\nusername = \"svc\"").unwrap();
        assert_eq!(
            s.kafka.consumer.get("sasl.password").map(String::as_str),
            Some("hunter2")
        );
        assert!(!s.redacted_dump().contains("hunter2"));
        let error = with("[kafka.consumer]\n\"sasl.password\" = [\"hunter2\"]")
            .expect_err("a list is not a property value");
        let text = format!("{error} {error:?}");
        assert!(!text.contains("hunter2"), "secret leaked: {text}");
        assert!(text.contains("sasl.password"), "{text}");
    }

    #[test]
    fn secrets_never_show_in_dumps_or_debug_output() {
        let s = with("[kafka.consumer]\n\"sasl.password\" = \"hunter2\"\n\"sasl.username\" = \"svc\"\n[kafka.producer]\n\"ssl.key.password\" = \"pw2\"").unwrap();
        for text in [s.redacted_dump(), format!("{s:?}")] {
            assert!(
                !text.contains("hunter2") && !text.contains("pw2"),
                "secret leaked: {text}"
            );
            assert!(text.contains(REDACTED));
            assert!(text.contains("svc"), "non-secret values stay visible");
        }
        assert_eq!(
            s.kafka.consumer.get("sasl.password").map(String::as_str),
            Some("hunter2"),
            "librdkafka still gets it"
        );
    }

    #[test]
    fn a_typo_in_a_choice_is_refused_with_the_allowed_values() {
        for (extra, want_key, allowed) in [
            (
                "[inference]\nexecution_providers = [\"cpu\", \"tpu\"]",
                "inference.execution_providers",
                "cpu, cuda, tensorrt",
            ),
            (
                "[inference]\npad_to = \"max\"",
                "inference.pad_to",
                "longest, bucket",
            ),
            (
                "[telemetry]\nlog_format = \"xml\"",
                "telemetry.log_format",
                "text, json",
            ),
        ] {
            match with(extra) {
                Err(ConfigError::Invalid { key, reason }) => {
                    assert_eq!(key, want_key);
                    assert!(reason.contains(allowed), "{key}: {reason}");
                }
                other => panic!("{extra}: expected an invalid-config error, got {other:?}"),
            }
        }
        let s = with("[inference]\nexecution_providers = [\"tensorrt\", \"cpu\"]").unwrap();
        assert_eq!(
            s.inference.execution_providers,
            vec![ExecutionProvider::Tensorrt, ExecutionProvider::Cpu]
        );
        // Dumped as written.
        assert!(s.redacted_dump().contains("\"tensorrt\""));
    }

    #[test]
    fn workers_default_to_auto_and_take_a_number() {
        let s = with("").unwrap();
        assert_eq!(s.inference.workers, Workers::Auto);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(s.inference.worker_count(), cores.clamp(1, 64));
        let s = with("[inference]\nworkers = \"auto\"\nintra_threads = 64").unwrap();
        assert_eq!(s.inference.worker_count(), 1, "at least one");
        let s = with("[inference]\nworkers = 3").unwrap();
        assert_eq!(s.inference.worker_count(), 3);
        let s = with("[inference]\nworkers = \"auto\"\nexecution_providers = [\"cuda\", \"cpu\"]")
            .unwrap();
        assert_eq!(s.inference.worker_count(), 1, "one per GPU until measured");
        assert_eq!(
            invalid_key(with("[inference]\nworkers = 0")),
            "inference.workers"
        );
        assert_eq!(
            invalid_key(with("[inference]\nworkers = \"many\"")),
            "inference.workers"
        );
        assert!(
            with("")
                .unwrap()
                .redacted_dump()
                .contains("\"workers\": \"auto\"")
        );
    }

    #[test]
    fn unknown_keys_are_errors_not_ignored() {
        assert!(matches!(
            with("[batching]\nmax_batch_sise = 3"),
            Err(ConfigError::Load(_))
        ));
    }
}
