//! `modstream bench`: how many verdicts per second the whole pipeline
//! sustains, at what tail latency, for which batch size and deadline, and how
//! that compares with the raw model on the same batches and threads.
//!
//! Method (all in one process, one run, so that ratios are fair on a noisy
//! machine): for each `max_batch_size` × `max_batch_delay` the pipeline runs
//! on a fresh embedded cluster holding `events` pre-produced events
//! (saturation: throughput = events ÷ time to the last acknowledged verdict);
//! the raw model scores the same texts in a tight loop over pre-built batches
//! of that size. Latency runs offer a paced, open-loop load at a fraction of
//! the measured saturation; each event's latency runs from its *intended*
//! send time to the moment its verdict is read back, so queueing behind a
//! late send is counted (no coordinated omission).

mod chart;
mod measure;
mod report;

use std::path::PathBuf;

use crate::config::{ExecutionProvider, InferenceSettings, PadTo};
use crate::inference::{InputKind, Model};
use crate::tools::generator::generate;

pub use chart::{chart, replot};
pub use measure::{peak_rss_bytes, peak_rss_of, raw_model_throughput};
pub use report::{LatencyRow, OverloadRow, Report, SaturationRow};

/// What to measure; also the command line of `modstream bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// Events per saturation run.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    pub batch_sizes: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "5,20")]
    pub delays_ms: Vec<u64>,
    /// Offered load as fractions of saturation, for the latency curve.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,0.75,1.0")]
    pub loads: Vec<f64>,
    /// Seconds of paced load per latency point.
    #[arg(long, default_value_t = 5)]
    pub latency_seconds: u64,
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
    /// Where bench.json and bench.svg go.
    #[arg(long = "out", default_value = "target/bench")]
    pub out_dir: PathBuf,
}

/// Run the whole sweep, print the table as it goes, write bench.json and
/// bench.svg under `opts.out_dir`.
pub async fn run(opts: BenchOptions) -> anyhow::Result<Report> {
    let inference = measure::inference_settings(&opts);
    let mut model = Model::load(&inference)?;
    // Token models: the same model without length buckets (one pass per
    // batch, padded to its longest text), the naive dynamic batching.
    let mut unbucketed = match model.manifest.input_kind {
        InputKind::Tokens => Some(Model::load(&InferenceSettings {
            pad_to: PadTo::Longest,
            pass_overhead_tokens: 1 << 30,
            ..inference.clone()
        })?),
        InputKind::Text => None,
    };
    let texts: Vec<String> = generate(opts.events, 0, "raw-")
        .into_iter()
        .filter_map(|e| e.text)
        .collect();
    let mut saturation_rows = Vec::new();
    report::print_saturation_header();
    for &batch in &opts.batch_sizes {
        let (raw, _) = raw_model_throughput(&mut model, &texts, batch)?;
        let naive = match unbucketed.as_mut() {
            Some(m) => Some(raw_model_throughput(m, &texts, batch)?),
            None => None,
        };
        for &delay in &opts.delays_ms {
            let (per_s, summary, elapsed) = measure::saturation(&opts, batch, delay).await?;
            let row = SaturationRow::new(
                (batch, delay, opts.events),
                per_s,
                raw,
                &summary,
                elapsed,
                naive,
            );
            row.print();
            saturation_rows.push(row);
        }
    }
    let mut latency_rows = Vec::new();
    report::print_latency_header();
    for &batch in &opts.batch_sizes {
        let delay = opts.delays_ms[0];
        let Some(sat) = saturation_rows
            .iter()
            .find(|r| r.max_batch_size == batch && r.max_batch_delay_ms == delay)
        else {
            continue;
        };
        for &fraction in &opts.loads {
            let row =
                measure::latency(&opts, batch, delay, fraction, sat.pipeline_per_s * fraction)
                    .await?;
            row.print();
            latency_rows.push(row);
        }
    }
    let overload = match saturation_rows
        .iter()
        .find(|r| r.max_batch_size == *opts.batch_sizes.last().unwrap_or(&1))
    {
        Some(sat) if opts.overload > 0.0 => {
            let (batch, delay) = (sat.max_batch_size, sat.max_batch_delay_ms);
            let seconds = 3;
            let (_, light) = measure::peak_rss_under_load(
                &opts,
                batch,
                delay,
                sat.pipeline_per_s * 0.25,
                seconds,
            )
            .await?;
            let rate = sat.pipeline_per_s * opts.overload;
            let (events, peak) =
                measure::peak_rss_under_load(&opts, batch, delay, rate, seconds).await?;
            let row = OverloadRow {
                offered_multiple: opts.overload,
                offered_per_s: rate,
                seconds: events as f64 / rate,
                events,
                peak_rss_bytes: peak,
                light_load_peak_rss_bytes: light,
            };
            row.print();
            Some(row)
        }
        _ => None,
    };
    let report = Report {
        machine: format!(
            "{} cores",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ),
        model: format!("{} {}", model.manifest.name, model.manifest.version),
        provider: model.provider.to_string(),
        intra_threads: opts.intra_threads,
        saturation: saturation_rows,
        latency: latency_rows,
        peak_rss_bytes: peak_rss_bytes(),
        workers: inference.worker_count(),
        broker: opts
            .bootstrap
            .clone()
            .unwrap_or_else(|| "embedded".to_string()),
        overload,
    };
    report.write(&opts.out_dir)?;
    Ok(report)
}
