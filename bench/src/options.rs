//! What `modstream bench` measures: its command line.

use std::path::PathBuf;

use super::{cascade, formats};
use modstream::config::ExecutionProvider;

/// What to measure; also the command line of `modstream bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// Events per saturation run.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// The grid's batch sizes (`batching.max_batch_size`).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub batch_sizes: Vec<usize>,
    /// The grid's batch deadlines in ms (`batching.max_batch_delay`).
    #[arg(long, value_delimiter = ',', default_value = "5,20")]
    pub delays_ms: Vec<u64>,
    /// Offered load as fractions of saturation, for the latency curve.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "0.25,0.5,0.75,1.0")]
    pub loads: Vec<f64>,
    /// Seconds of paced load per latency point.
    #[arg(long, default_value_t = 5)]
    pub latency_seconds: u64,
    /// Intra-op threads per inference session (`inference.intra_threads`).
    #[arg(long, default_value_t = 1)]
    pub intra_threads: usize,
    /// Model directory (default: models/profanity-check).
    #[arg(long = "model")]
    pub model_dir: Option<PathBuf>,
    /// Run against this Kafka cluster instead of the embedded one (each run
    /// creates fresh `modstream-bench-*` topics there, left behind, and a
    /// fresh group).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// With `--bootstrap`: the broker's process id, whose CPU time per
    /// verdict is read beside each `modstream run` process's (a broker on
    /// the same machine is part of what a verdict costs there).
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Execution providers in order of preference (cuda, tensorrt, cpu).
    #[arg(long, value_delimiter = ',', default_value = "cpu")]
    pub providers: Vec<ExecutionProvider>,
    /// Fail unless a GPU provider can be used.
    #[arg(long)]
    pub require_gpu: bool,
    /// Inference workers (sessions) in the pipeline; the raw loop uses one.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Score cache bytes in the pipeline (`inference.cache_bytes`; 0: off).
    #[arg(long, default_value_t = 0)]
    pub cache_bytes: u64,
    /// Offer this multiple of saturation to a separate `modstream run` for
    /// 3 s and report its peak RSS (0: skip).
    #[arg(long, default_value_t = 10.0)]
    pub overload: f64,
    /// The adaptive mode's latency target (`batching.target_p99`), run beside
    /// the fixed grid with the largest batch size and delay as its bounds
    /// (0: skip).
    #[arg(long, default_value_t = 50)]
    pub target_p99_ms: u64,
    /// Step-load trace of the adaptive mode: 20 % of the best fixed cell's
    /// saturation, then ×4, then back, this many seconds each (0: skip).
    #[arg(long, default_value_t = 10)]
    pub step_seconds: u64,
    /// Shares of repeated texts for the score-cache sweep (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "0,0.3,0.7")]
    pub repeat_shares: Vec<f64>,
    /// The score cache's size in that sweep.
    #[arg(long, default_value_t = 64 << 20)]
    pub repeat_cache_bytes: u64,
    /// Python interpreter with confluent-kafka and onnxruntime (made by
    /// bench/python-baseline.sh) for the plain-Python baseline (absent: skip).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The baseline script (default: bench/python_consumer.py).
    #[arg(long)]
    pub python_script: Option<PathBuf>,
    /// A shadow model: the default cell (64 / 20 ms) at saturation with it
    /// scoring every event and without (absent: skip).
    #[arg(long)]
    pub shadow_model: Option<PathBuf>,
    /// At-least-once against exactly-once (`kafka.delivery`), one
    /// exactly-once contender per transaction interval given here
    /// (`kafka.commit_interval`, ms), on the default cell (64 / 20 ms):
    /// saturation, then latency as a `read_committed` reader sees it at half
    /// the at-least-once saturation (empty: skip). Needs `--bootstrap`: the
    /// embedded cluster's `read_committed` is not Kafka's.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub delivery_intervals_ms: Vec<u64>,
    /// Input formats on the same events, each on the default cell
    /// (64 / 20 ms): json, mapped-json, avro, protobuf (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub formats: Vec<formats::BenchFormat>,
    /// The Schema Registry (Confluent API) for `--formats avro,protobuf`.
    #[arg(long)]
    pub registry_url: Option<String>,
    /// A second model: the default cell with the model alone, then with a
    /// copy of it and with this one on every event, then this one on a
    /// quarter (absent: skip).
    #[arg(long)]
    pub second_model: Option<PathBuf>,
    /// A transformer behind the configured model: one run per band of
    /// `--cascade-bands` with it scoring only the events whose `offensive`
    /// score is in the band, against it on every event (absent: skip).
    #[arg(long)]
    pub cascade: Option<PathBuf>,
    /// (empty: no band sweep; the cost table's cascade still runs).
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 0..,
        default_value = "0.4-0.6,0.2-0.8,0.1-0.9,0.05-0.95,0.02-0.98,0-1"
    )]
    pub cascade_bands: Vec<cascade::Band>,
    /// The cascade's band in the cost table (default: the policy's).
    #[arg(long, default_value_t = cascade::Band::DEFAULT)]
    pub cascade_band: cascade::Band,
    /// Models for the cost table: raw at its best, `modstream run` at its
    /// default (CPU seconds per million verdicts, peak RSS), the latency
    /// target, p99 at half load, the Python consumer; then the cascade with
    /// `--cascade` (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub cost: Vec<PathBuf>,
    /// Near-duplicate shares for matching's sweep: at each, a campaign
    /// stream with matching off, a known-bad list only, and the list with
    /// waves and reuse (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub match_shares: Vec<f64>,
    /// Runs of each contender at each share (the row: their medians).
    #[arg(long, default_value_t = 1)]
    pub match_runs: usize,
    /// The matcher alone under two floods of this many posts each (0:
    /// skip): variants of one text at about 0.45 similarity (each its own
    /// cluster, all sharing bands), and long posts unlike each other.
    #[arg(long, default_value_t = 0)]
    pub match_floods: usize,
    /// Sampling's cost: the default cell with sampling off and on at the
    /// shipped rates, this many runs each taking turns (0: skip).
    #[arg(long, default_value_t = 0)]
    pub sampling_runs: usize,
    /// The session-options sweep: `modstream run` at its default and with
    /// one session option changed at a time (workers × intra-op threads,
    /// spinning, graph optimization, memory arena).
    #[arg(long)]
    pub session_sweep: bool,
    /// `modstream run` at its default configuration with the configured
    /// model, its own process, this many runs on the same events (0: skip):
    /// the service's own CPU per verdict, before and after a change.
    #[arg(long, default_value_t = 0)]
    pub own_runs: usize,
    /// With `--own-runs`: each round runs `modstream run` without state,
    /// then with two state rules reading each user's state (a changelog
    /// topic as large as the input): CPU per verdict both ways, and the
    /// changelog's bytes per verdict.
    #[arg(long)]
    pub state_rules: bool,
    /// The Kafka client's floor beside `--own-runs` (each round) and
    /// `--python`: Debian's kcat consuming the input into kcat producing,
    /// the same events and broker, CPU per record of both processes.
    #[arg(long)]
    pub kcat_floor: bool,
    /// With `--own-runs`: each round also runs `modstream run` with
    /// `[tracing]` on at each of these sampling ratios (posts without a
    /// trace context, so the ratio decides), its spans sent to an OTLP/HTTP
    /// sink in the bench: CPU per verdict against tracing off.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub tracing_ratios: Vec<f64>,
    /// A changelog partition of each of these many entities read back by
    /// the state restore thread, timed (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub state_restore: Vec<u64>,
    /// Batching by tokens against batching by count, on a long-tailed mix
    /// of post lengths (most under 20 tokens, a tail to 512): each
    /// `batching.max_batch_tokens` given here (with `--token-batch-size` as
    /// the count bound) against each of `--batch-sizes` by count alone, at
    /// saturation and at the same paced rates (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub token_budgets: Vec<u64>,
    /// The count bound of the token-budget contenders.
    #[arg(long, default_value_t = 256)]
    pub token_batch_size: usize,
    /// With `--token-budgets`: two more contenders with this latency target
    /// (`batching.target_p99`): the controller counting posts, bounded by
    /// the largest of `--batch-sizes`, and counting tokens, bounded by the
    /// largest budget and `--token-batch-size` posts (0: none).
    #[arg(long, default_value_t = 0)]
    pub token_target_p99_ms: u64,
    /// Cost curve: input partitions owned by the one instance (empty: skip).
    /// Each point: `modstream run` at its default configuration, its own
    /// process (verdicts/s, CPU per verdict), then p99 at half that rate.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub partition_counts: Vec<i32>,
    /// Cost curve: tenants, each with its own policy rule, the events spread
    /// evenly over them (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub tenant_counts: Vec<usize>,
    /// Partitions of the verdict topic (0: as many as the input's): the
    /// partitions curve with a verdict topic that does not grow with it.
    #[arg(long, default_value_t = 0)]
    pub verdict_partitions: i32,
    /// Cost curve: every post about this many bytes (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub post_bytes: Vec<usize>,
    /// Cost curve: items of one known-bad list (distinct made-up texts of
    /// ten words), in `modstream run` and in the matcher alone, with its
    /// load time and memory (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub list_items: Vec<usize>,
    /// Cost curve: wave clusters the matcher holds (waves on), in the
    /// matcher alone (empty: skip).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    pub wave_clusters: Vec<usize>,
    /// What a sweep changes for its runs (not on the command line).
    #[arg(skip)]
    pub variant: Variant,
    /// Where bench.json and the charts go.
    #[arg(long = "out", default_value = "target/bench")]
    pub out_dir: PathBuf,
}

/// What a sweep changes for one of its runs.
#[derive(Debug, Clone, Default)]
pub struct Variant {
    /// The input's format and what reads it (the format, model and cascade
    /// sweeps).
    pub encoding: formats::Encoding,
    /// The delivery sweep's mode and commit interval.
    pub exactly_once: bool,
    pub commit_interval_ms: Option<u64>,
    /// Matching's sweep: `[matching]` for its runs.
    pub matching: Option<modstream::config::MatchingSettings>,
    /// Sampling's runs: `output.samples_topic` set, `[sampling]` as shipped.
    pub sampling: bool,
    /// The posts' lengths (the token-batching sweep: a long tail).
    pub lengths: modstream::tools::generator::Lengths,
    /// `batching.max_batch_tokens` (the token-batching sweep).
    pub max_batch_tokens: Option<u64>,
    /// Partitions of the input and verdict topics (default: 4).
    pub partitions: Option<i32>,
    /// Tenants the events are spread over (`t0`, `t1`, ...; 0: none), and
    /// the policy file that gives each its rule.
    pub tenants: usize,
    pub policy: Option<std::path::PathBuf>,
}

impl Variant {
    /// A stream of `count` valid posts of this variant's lengths, in its encoding.
    pub fn events(
        &self,
        count: usize,
        prefix: &str,
    ) -> Vec<modstream::tools::generator::GeneratedEvent> {
        let mix = modstream::tools::generator::Mix {
            malformed_every: 0,
            lengths: self.lengths,
            ..Default::default()
        };
        let mut events = modstream::tools::generator::generate_mix(count, &mix, prefix);
        if self.tenants > 0 {
            for (i, event) in events.iter_mut().enumerate() {
                if let Ok(serde_json::Value::Object(mut o)) = serde_json::from_slice(&event.payload)
                {
                    o.insert("tenant".into(), format!("t{}", i % self.tenants).into());
                    event.payload = serde_json::Value::Object(o).to_string().into_bytes();
                }
            }
        }
        self.encoding.apply(events)
    }
}

impl BenchOptions {
    /// These options with the input in `encoding`.
    pub fn with_encoding(&self, encoding: formats::Encoding) -> BenchOptions {
        let mut o = self.clone();
        o.variant.encoding = encoding;
        o
    }
}
