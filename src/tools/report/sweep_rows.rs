//! The rows of the sweeps in the bench report: the cascade's
//! bands, the cost table, the session options, tokenizing.

use serde::{Deserialize, Serialize};

/// One run of the cascade sweep: the transformer on every event (no band),
/// or behind the first model where its score is in `band`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CascadeRow {
    pub stream: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub band: Option<[f32; 2]>,
    /// Share of the events the transformer scored.
    pub transformer_share: f64,
    pub saturation_per_s: f64,
    /// Against the transformer on every event, same stream.
    pub over_every_event: f64,
    /// Share of events with the verdict the transformer on every event gave.
    pub agreement: f64,
    /// Wall time in model runs (every model's, summed) per verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_us_per_verdict: Option<f64>,
}

/// One contender of the cost table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostRow {
    pub contender: String,
    pub events: usize,
    /// The raw model at its best on all cores (none for a cascade), and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_layout: Option<String>,
    /// `modstream run` at its default configuration, its own process.
    pub default_per_s: f64,
    /// None where the run was too short to say.
    #[serde(default)]
    pub cpu_s_per_million: Option<f64>,
    pub kafka_cpu_share: f64,
    pub peak_rss_bytes: u64,
    /// The pipeline with `batching.target_p99` at saturation.
    pub target_per_s: f64,
    pub target_p99_ms: u64,
    /// The default cell (64 / 20 ms) at half the default's verdicts/s.
    pub p99_at_half_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_cpu_s_per_million: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_peak_rss_bytes: Option<u64>,
}

/// One contender of the session-options sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRow {
    pub contender: String,
    pub events: usize,
    /// `modstream run` with this option, its own process.
    pub per_s: f64,
    #[serde(default)]
    pub cpu_s_per_million: Option<f64>,
    pub peak_rss_bytes: u64,
    /// One session: its load time, and CPU seconds per second at a light load.
    pub load_ms: f64,
    pub light_load_cores: f64,
}

/// A token model's tokenizing beside its scoring, per post, one thread.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenizationRow {
    pub posts: usize,
    pub tokenize_us: f64,
    /// Scoring with tokenizing included.
    pub score_us: f64,
}

/// One run of `modstream run` at its default configuration as its own
/// process (`--own-runs`): the service's own cost on the configured model,
/// the same command before and after a change to the hot path.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnRun {
    pub events: usize,
    pub per_s: f64,
    /// None where the run was too short to say.
    #[serde(default)]
    pub cpu_us_per_verdict: Option<f64>,
    pub kafka_cpu_share: f64,
    pub peak_rss_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_cpu_us_per_verdict: Option<f64>,
    /// With `--state-rules`: this run kept entity state for two state
    /// rules, and what it wrote to the changelog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateCost>,
    /// With `--tracing-ratios`: this run recorded spans at this sampling
    /// ratio, and what it exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingCost>,
    /// With `--kcat-floor`: the Kafka client's floor, run in the same round
    /// on the same events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<super::RelayRun>,
}

/// What tracing exported (`--tracing-ratios`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TracingCost {
    pub sampling_ratio: f64,
    /// OTLP/HTTP request bodies ÷ verdicts.
    pub otlp_bytes_per_verdict: f64,
}

/// What keeping state wrote (`--state-rules`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateCost {
    pub changelog_records: u64,
    /// Keys, values and headers of the changelog's records ÷ verdicts.
    pub changelog_bytes_per_verdict: f64,
}

/// A changelog partition of `entities` entities read back by the restore
/// thread (`--state-restore`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreRow {
    pub entities: u64,
    pub records: u64,
    pub changelog_bytes: u64,
    pub seconds: f64,
    pub entities_per_s: f64,
    /// The restored state's charge against `state.max_bytes`.
    pub state_bytes: u64,
}

/// One contender of the token-batching sweep (`--token-budgets`): batching
/// by count alone, or by a token budget as well, on a long-tailed mix of
/// post lengths.
#[derive(Debug, Serialize, Deserialize)]
pub struct TokenBatchRow {
    pub max_batch_size: usize,
    /// `batching.max_batch_tokens` (None: by count alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch_tokens: Option<u64>,
    /// `batching.target_p99` (None: fixed batching).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_p99_ms: Option<u64>,
    pub events: usize,
    pub saturation_per_s: f64,
    /// Events per model run at saturation.
    pub events_per_run: f64,
    /// Real ÷ padded tokens at saturation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding_efficiency: Option<f64>,
    /// Paced load at rates common to every contender (fractions of the
    /// best count-only contender's saturation).
    pub paced: Vec<super::LatencyRow>,
}

/// What a cost curve grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Curve {
    /// Input partitions owned by the one instance.
    Partitions,
    /// Tenants, each with its own policy rule.
    Tenants,
    /// Bytes of every post.
    PostBytes,
    /// Items of one known-bad list (`--list-items`).
    ListItems,
}

impl Curve {
    /// What the curve's points are counted in.
    pub fn unit(self) -> &'static str {
        match self {
            Curve::Partitions => "partitions",
            Curve::Tenants => "tenants (a rule each)",
            Curve::PostBytes => "bytes per post",
            Curve::ListItems => "known-bad list items",
        }
    }
}

/// One point of a cost curve (`--partition-counts`, `--tenant-counts`,
/// `--post-bytes`): `modstream run` at its default configuration, its own
/// process, then the pipeline at half that rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CurveRow {
    pub curve: Curve,
    pub at: u64,
    pub events: usize,
    pub per_s: f64,
    /// None where the run was too short to say.
    #[serde(default)]
    pub cpu_us_per_verdict: Option<f64>,
    pub peak_rss_bytes: u64,
    /// The default cell (64 / 20 ms) paced at half `per_s`.
    pub p99_at_half_ms: f64,
    /// Partitions of the verdict topic, where not as many as the input's
    /// (`--verdict-partitions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict_partitions: Option<i32>,
    /// With a token model: the tokens per post its tokenizer gives (after
    /// truncation to the model's `max_length`), the mean over the events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_tokens: Option<f64>,
}

/// What the matcher holds at a point of its curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Held {
    /// Items of one known-bad list, loaded from its file.
    ListItems,
    /// Wave clusters, each made by one post before the measured ones.
    WaveClusters,
}

impl Held {
    pub fn unit(self) -> &'static str {
        match self {
            Held::ListItems => "known-bad list items",
            Held::WaveClusters => "wave clusters held",
        }
    }
}

/// One point of the matcher's curves (`--list-items`, `--wave-clusters`):
/// the matcher alone, one thread, holding `at` items or clusters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatcherCurveRow {
    pub held: Held,
    pub at: u64,
    /// Seconds to load the list file, or to make the clusters.
    pub build_s: f64,
    /// What the matcher's state holds once built (against `max_bytes`).
    pub bytes: usize,
    /// How far the process's peak RSS rose while building.
    pub rss_rise_bytes: u64,
    /// Posts inspected after the build, and the time per post.
    pub events: usize,
    pub matcher_us: f64,
    /// Of those posts, the share a list item matched.
    pub matched_share: f64,
}
