//! The rows of the issue-24 sweeps in the bench report: the cascade's
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

impl CascadeRow {
    pub fn print(&self) {
        let band = self
            .band
            .map_or("transformer on every event".to_string(), |[f, t]| {
                format!("band {f}-{t}")
            });
        eprintln!(
            "cascade, {} stream, {band}: {:.1} % to the transformer, {:.0} verdicts/s ({:.2}×), agreement {:.2} %",
            self.stream,
            self.transformer_share * 100.0,
            self.saturation_per_s,
            self.over_every_event,
            self.agreement * 100.0
        );
    }
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

impl CostRow {
    pub fn print(&self) {
        eprintln!(
            "cost, {}: raw {} ; modstream default {:.0}/s, {} CPU-s per million ({:.1} % Kafka client), {} MiB peak; p99 target {:.0}/s; p99 at half {:.1} ms; Python {}",
            self.contender,
            self.raw_per_s
                .map_or("—".to_string(), |r| format!("{r:.0}/s")),
            self.default_per_s,
            self.cpu_s_per_million
                .map_or("—".to_string(), |v| format!("{v:.0}")),
            self.kafka_cpu_share * 100.0,
            self.peak_rss_bytes >> 20,
            self.target_per_s,
            self.p99_at_half_ms,
            self.python_per_s.map_or("—".to_string(), |p| format!(
                "{p:.0}/s, {:.0} CPU-s per million, {} MiB peak",
                self.python_cpu_s_per_million.unwrap_or_default(),
                self.python_peak_rss_bytes.unwrap_or_default() >> 20
            )),
        );
    }
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

impl SessionRow {
    pub fn print(&self) {
        eprintln!(
            "session, {}: {:.0}/s, {} CPU-s per million, {} MiB peak; load {:.0} ms; light load {:.2} cores",
            self.contender,
            self.per_s,
            self.cpu_s_per_million
                .map_or("—".to_string(), |v| format!("{v:.0}")),
            self.peak_rss_bytes >> 20,
            self.load_ms,
            self.light_load_cores
        );
    }
}

/// A token model's tokenizing beside its scoring, per post, one thread.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenizationRow {
    pub posts: usize,
    pub tokenize_us: f64,
    /// Scoring with tokenizing included.
    pub score_us: f64,
}
