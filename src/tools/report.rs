//! The bench report (bench.json): what `modstream-bench` measured, read by
//! `modstream plan`. Only data here; the bench builds, prints and draws it.

use std::path::Path;

use serde::{Deserialize, Serialize};

mod sweep_rows;

pub use sweep_rows::{
    CascadeRow, CostRow, Curve, CurveRow, Held, MatcherCurveRow, OwnRun, RestoreRow, SessionRow,
    StateCost, TokenBatchRow, TokenizationRow, TracingCost,
};

#[derive(Debug, Serialize, Deserialize)]
pub struct SaturationRow {
    pub max_batch_size: usize,
    pub max_batch_delay_ms: u64,
    /// The adaptive cell: `batching.target_p99`, with the two above as bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_p99_ms: Option<u64>,
    pub events: usize,
    pub pipeline_per_s: f64,
    pub raw_model_per_s: f64,
    pub pipeline_over_raw: f64,
    pub mean_batch_size: f64,
    pub inference_share: f64,
    /// Model runs by size: "1", "2-3", "4-7", ... → count.
    pub run_sizes: std::collections::BTreeMap<String, u64>,
    /// Time split: mean wait for a batch to close, mean model run, mean
    /// enqueue-to-acknowledgement of one verdict.
    pub batch_wait_ms: f64,
    pub inference_ms: f64,
    pub produce_ms: f64,
    /// Token models: real ÷ padded tokens in the pipeline run, and real
    /// tokens per post.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding_efficiency: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_tokens: Option<f64>,
    /// Token models: the raw model on the same batches padded to their
    /// longest text in one pass (no length buckets), and its efficiency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_unbucketed_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_unbucketed_padding_efficiency: Option<f64>,
    /// How many sessions the raw model ran on at once: the pipeline's
    /// workers (`raw_model_per_s` is theirs together). Absent in older
    /// reports, whose raw model was one session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_sessions: Option<usize>,
    /// The raw model's CPU time per event on those sessions, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_cpu_us_per_event: Option<f64>,
    /// The same cell as its own `modstream run` process (only when the
    /// bench runs as the `modstream` binary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_process: Option<OwnProcess>,
}

/// A cell run as its own `modstream run` process on the same events: its
/// verdicts/s (from the verdicts' timestamps), its CPU time per verdict
/// (utime + stime from `/proc`, first verdict to last), the Kafka client's
/// share of it, its peak RSS; with `--broker-pid`, the broker's CPU time per
/// verdict over the same span.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnProcess {
    pub per_s: f64,
    pub cpu_us_per_verdict: Option<f64>,
    pub kafka_cpu_share: f64,
    /// The inference workers' threads' share (ONNX Runtime's own threads,
    /// which inherit their name, included).
    #[serde(default)]
    pub inference_cpu_share: f64,
    pub peak_rss_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_cpu_us_per_verdict: Option<f64>,
}

impl SaturationRow {
    /// CPU per verdict of the own process against the raw model's CPU per
    /// event: 1 would be a pipeline that costs nothing beyond its model.
    pub fn cpu_over_raw(&self) -> Option<f64> {
        let own = self.own_process.as_ref()?.cpu_us_per_verdict?;
        let raw = self.raw_cpu_us_per_event.filter(|r| *r > 0.0)?;
        Some(own / raw)
    }
}

/// Peak memory of a separate `modstream run` process offered more than it
/// can take (open loop) for a while, against the same at a light load.
#[derive(Debug, Serialize, Deserialize)]
pub struct OverloadRow {
    pub offered_multiple: f64,
    pub offered_per_s: f64,
    /// How long the load was offered (3 s, shorter where the event cap hit).
    pub seconds: f64,
    pub events: usize,
    pub peak_rss_bytes: u64,
    pub light_load_peak_rss_bytes: u64,
    /// What the peak may reach: the light-load peak, the byte budget
    /// (`limits.max_in_flight_bytes`, which also bounds librdkafka's fetch
    /// queues) and the bench's `RSS_HEADROOM_BYTES`. Absent in older
    /// reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct LatencyRow {
    pub max_batch_size: usize,
    pub max_batch_delay_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_p99_ms: Option<u64>,
    pub offered_fraction: f64,
    pub offered_per_s: f64,
    pub achieved_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// The urgent events alone (they close their batch at once, skipping
    /// `max_batch_delay`).
    #[serde(default)]
    pub urgent_events: usize,
    #[serde(default)]
    pub urgent_p50_ms: f64,
    #[serde(default)]
    pub urgent_p99_ms: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub machine: String,
    pub model: String,
    pub intra_threads: usize,
    pub saturation: Vec<SaturationRow>,
    pub latency: Vec<LatencyRow>,
    pub peak_rss_bytes: u64,
    /// "embedded" or the external bootstrap servers.
    #[serde(default)]
    pub broker: String,
    #[serde(default)]
    pub workers: usize,
    /// The execution provider that ran the model.
    #[serde(default)]
    pub provider: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overload: Option<OverloadRow>,
    /// The adaptive mode under a step in load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepTrace>,
    /// What the score cache buys at each share of repeated texts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeats: Vec<RepeatRow>,
    /// The default configuration against a plain Python consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<BaselineRow>,
    /// The broker's round trip without modstream at the adaptive cell's
    /// offered rates: the floor its latency is judged against.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker_floor: Vec<FloorRow>,
    /// Live throughput with a shadow model scoring every event, and without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowRow>,
    /// At-least-once against exactly-once at some transaction intervals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivery: Vec<DeliveryRow>,
    /// Input formats on the same events (`--formats`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formats: Vec<FormatRow>,
    /// One model against two on the same events (`--second-model`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelRow>,
    /// The session-options sweep (`--session-sweep`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub session: Vec<SessionRow>,
    /// With the session sweep, for a token model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenization: Option<TokenizationRow>,
    /// The cost table (`--cost`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cost: Vec<CostRow>,
    /// The cascade's band sweep (`--cascade`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cascade: Vec<CascadeRow>,
    /// Matching's sweep (`--match-shares`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matching: Vec<MatchRow>,
    /// The matcher under floods built to cost it (`--match-floods`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_floods: Vec<FloodRow>,
    /// Sampling's cost (`--sampling-runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingRow>,
    /// `modstream run` at its default configuration, several runs
    /// (`--own-runs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_runs: Vec<OwnRun>,
    /// Batching by tokens against by count (`--token-budgets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_batching: Vec<TokenBatchRow>,
    /// Cost curves as the work grows (`--partition-counts`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curves: Vec<CurveRow>,
    /// The matcher's curves (`--list-items`, `--wave-clusters`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matcher_curves: Vec<MatcherCurveRow>,
    /// State restores timed (`--state-restore`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_restores: Vec<RestoreRow>,
}

/// Sampling's cost: the default cell at saturation on the generated
/// stream with sampling off and on at the shipped rates (the median of
/// `runs` runs each, taking turns); the share of verdicts the draw picks
/// (by the sampler's rule on the verdicts' scores); and the sampler's own
/// time per verdict, measured alone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SamplingRow {
    pub runs: usize,
    pub off_per_s: f64,
    pub on_per_s: f64,
    pub sampled_share: f64,
    pub draw_ns: f64,
}

/// One near-duplicate share of matching's sweep: the same campaign stream
/// (`tools::campaign`) on the default cell at saturation with matching
/// off, with a known-bad list of 1,000 items only, and with the list,
/// waves and reuse (the median of `runs` runs each, taking turns); and the
/// matcher's own time per event, measured alone on the same texts (one
/// thread).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatchRow {
    pub near_duplicate_share: f64,
    /// Runs of each contender; the figures are their medians.
    #[serde(default)]
    pub runs: usize,
    pub off_per_s: f64,
    pub lists_per_s: f64,
    pub reuse_per_s: f64,
    /// The share of the reuse run's verdicts judged on reused scores.
    pub reused_share: f64,
    pub lists_matcher_us: f64,
    pub waves_matcher_us: f64,
}

/// The matcher alone (waves on, the shipped `[matching]` otherwise) under a
/// flood built to cost it: its time per event, what its state holds at the
/// end against `matching.max_bytes`, what its bounds did, and how far the
/// process's peak RSS rose over its RSS before the flood.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloodRow {
    pub flood: String,
    pub events: usize,
    pub matcher_us: f64,
    pub clusters: usize,
    pub bytes: usize,
    pub max_bytes: usize,
    pub evicted: u64,
    pub candidates_cut: u64,
    pub rss_rise_bytes: u64,
}

/// A contender of the model sweep: which models, the share of the events
/// the second one scores, saturation, latency at half of it, and the time
/// spent in model runs per verdict (every model's runs summed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRow {
    pub contender: String,
    pub second_share: f64,
    pub saturation_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub model_us_per_verdict: f64,
}

/// A contender of the format sweep (`--formats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchFormat {
    Json,
    MappedJson,
    Avro,
    Protobuf,
}

/// One input format on the default cell: saturation, latency at half of
/// it, and what reading a value into an event costs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FormatRow {
    pub format: BenchFormat,
    pub saturation_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Microseconds per event to decode and map (one thread).
    pub decode_us: f64,
    /// That, over the CPU time an event gets at saturation (all cores).
    pub decode_share: f64,
}

/// One delivery mode on the default cell: saturation, and the latency a
/// `read_committed` reader sees under paced load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryRow {
    /// `at_least_once` or `exactly_once`.
    pub delivery: String,
    /// `kafka.commit_interval`: with exactly-once, the transaction interval.
    pub commit_interval_ms: u64,
    pub saturation_per_s: f64,
    /// Aborted transactions read again during the saturation run.
    pub rewinds: u64,
    pub offered_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The broker's own floor at one offered rate: a produce → consume round
/// trip of the same paced load, producer and reader, without modstream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BaselineRow {
    pub events: usize,
    pub modstream_per_s: f64,
    pub modstream_peak_rss_bytes: u64,
    pub python_per_s: f64,
    pub python_peak_rss_bytes: u64,
    /// Each process's CPU seconds per million verdicts, and the share of
    /// modstream's spent in the Kafka client's threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modstream_cpu_s_per_million: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modstream_kafka_cpu_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_cpu_s_per_million: Option<f64>,
    /// With `--broker-pid`: the broker's CPU µs per verdict while each ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modstream_broker_cpu_us_per_verdict: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_broker_cpu_us_per_verdict: Option<f64>,
    /// The same Python job with ONNX Runtime on one intra-op thread (no
    /// threads spinning between runs): the stronger plain consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_one_thread: Option<PythonRun>,
    /// `--kcat-floor`: the Kafka client's floor on the same events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kcat_floor: Option<RelayRun>,
}

/// A relay that does no work per record (`--kcat-floor`): kcat consuming
/// the input into kcat producing the verdict topic, both processes'
/// CPU time per record read back, measured as a `modstream run` is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RelayRun {
    pub events: usize,
    pub per_s: f64,
    /// Both processes', each at its own peak.
    pub peak_rss_bytes: u64,
    /// None where the run was too short to say.
    pub cpu_us_per_record: Option<f64>,
}

impl RelayRun {
    /// `cpu_us` (a verdict's CPU) ÷ the floor's CPU per record.
    pub fn times(&self, cpu_us: Option<f64>) -> Option<f64> {
        Some(cpu_us? / self.cpu_us_per_record.filter(|f| *f > 0.0)?)
    }
}

/// One run of the Python job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PythonRun {
    pub per_s: f64,
    pub peak_rss_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s_per_million: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_cpu_us_per_verdict: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FloorRow {
    pub offered_per_s: f64,
    pub events: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The default cell at saturation without and with a shadow model.
#[derive(Debug, Serialize, Deserialize)]
pub struct ShadowRow {
    pub shadow_model: String,
    pub off_per_s: f64,
    pub on_per_s: f64,
}

/// Paced load at `base_per_s`, then `factor` times that, then back, each for
/// `phase_seconds`, on the adaptive cell.
#[derive(Debug, Serialize, Deserialize)]
pub struct StepTrace {
    pub target_p99_ms: u64,
    pub base_per_s: f64,
    pub factor: f64,
    pub phase_seconds: f64,
    /// By half second of intended send time.
    pub bins: Vec<StepBin>,
    /// The batch size and deadline chosen, from the clock's start (the
    /// choice in force at 0 first).
    pub choices: Vec<ChoicePoint>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct StepBin {
    pub t_s: f64,
    pub offered_per_s: f64,
    pub events: usize,
    pub p99_ms: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ChoicePoint {
    pub t_s: f64,
    pub size: usize,
    pub delay_ms: f64,
}

/// Saturation with the score cache off and on, on a stream where
/// `repeat_share` of the texts repeat an earlier one (the rest unique).
#[derive(Debug, Serialize, Deserialize)]
pub struct RepeatRow {
    pub repeat_share: f64,
    pub cache_bytes: u64,
    pub cache_off_per_s: f64,
    pub cache_on_per_s: f64,
}

impl Report {
    /// bench.json into `dir`.
    pub fn write_json(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("bench.json"), serde_json::to_string_pretty(self)?)?;
        eprintln!("report: {}", dir.join("bench.json").display());
        Ok(())
    }

    /// A saved bench.json.
    pub fn read(path: &Path) -> anyhow::Result<Report> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }
}
