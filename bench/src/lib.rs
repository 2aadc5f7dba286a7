//! modstream-bench (`modstream bench`): how many verdicts per second the whole pipeline
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

mod baseline;
pub mod cascade;
mod cell;
mod chart;
mod cost;
mod curves;
pub mod formats;
mod markdown;
mod matcher_curves;
mod matching;
mod measure;
pub mod models;
mod options;
mod print;
mod process;
mod raw;
mod relay;
mod rows;
mod runs;
mod sampling;
mod session;
mod state;
mod token_batching;
mod traces;
mod watch;

use std::path::{Path, PathBuf};

use modstream::config::{InferenceSettings, PadTo};
use modstream::inference::Model;
use modstream::inference::manifest::InputKind;
use modstream::tools::generator::generate;

pub use chart::{Panel, time_series};
pub use markdown::{BEGIN as TABLES_BEGIN, render as markdown, splice as splice_tables};
pub use measure::{Batching, raw_model_throughput};
pub use modstream::tools::report::{
    BaselineRow, CascadeRow, ChoicePoint, CostRow, DeliveryRow, FloodRow, FloorRow, LatencyRow,
    MatchRow, OverloadRow, OwnProcess, RepeatRow, Report, SamplingRow, SaturationRow, SessionRow,
    ShadowRow, StepBin, StepTrace,
};
pub use options::BenchOptions;
use print::Print;
pub use process::{CpuTime, cpu_time_of, peak_rss_bytes, peak_rss_of};
use runs::{delivery_rows, overload_row, repeat_sweep, shadow_row, step_trace};

/// Run the whole sweep, print the tables as it goes, write bench.json,
/// bench.md and the charts under `opts.out_dir`.
// Long: one line per sweep, in the order they run, then the report that
// holds them all.
pub async fn run(opts: BenchOptions) -> anyhow::Result<Report> {
    let inference = measure::inference_settings(&opts);
    let mut model = Model::load(&inference)?;
    let saturation = saturation_grid(&opts, &inference, &mut model).await?;
    let mut sweep = Sweep {
        best_fixed: saturation
            .iter()
            .filter(|r| r.target_p99_ms.is_none())
            .map(|r| r.pipeline_per_s)
            .fold(0.0, f64::max),
        adaptive: adaptive_cell(&opts),
        saturation,
        latency: Vec::new(),
        broker_floor: Vec::new(),
    };
    sweep.fixed_latency(&opts).await?;
    sweep.floor_and_adaptive_latency(&opts).await?;
    let step = match sweep.adaptive {
        Some(b) if opts.step_seconds > 0 => {
            let trace = step_trace(&opts, b, sweep.best_fixed * 0.2, 4.0).await?;
            trace.print();
            Some(trace)
        }
        _ => None,
    };
    let repeats = repeat_sweep(&opts).await?;
    let overload = overload_row(&opts, &sweep.saturation).await?;
    let shadow = shadow_row(&opts).await?;
    let delivery = delivery_rows(&opts).await?;
    let formats = formats::rows(&opts).await?;
    let models = models::rows(&opts).await?;
    let cascade = cascade::rows(&opts).await?;
    let matching = matching::rows(&opts).await?;
    let match_floods = matching::floods(&opts)?;
    let sampling = sampling::row(&opts).await?;
    let cost = cost::rows(&opts).await?;
    let session = session::rows(&opts).await?;
    let tokenization = session::tokenization(&opts)?;
    let baseline = baseline_row(&opts).await?;
    let own_runs = baseline::own_runs(&opts).await?;
    let token_batching = token_batching::rows(&opts).await?;
    let curves = curves::rows(&opts).await?;
    let matcher_curves = matcher_curves::rows(&opts)?;
    let state_restores = state::restores(&opts).await?;
    let report = Report {
        machine: format!(
            "{} cores",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ),
        model: format!("{} {}", model.manifest.name, model.manifest.version),
        provider: model.provider.to_string(),
        intra_threads: opts.intra_threads,
        saturation: sweep.saturation,
        latency: sweep.latency,
        peak_rss_bytes: peak_rss_bytes(),
        workers: inference.worker_count(),
        broker: opts
            .bootstrap
            .clone()
            .unwrap_or_else(|| "embedded".to_string()),
        overload,
        step,
        repeats,
        baseline,
        broker_floor: sweep.broker_floor,
        shadow,
        delivery,
        formats,
        models,
        cascade,
        matching,
        match_floods,
        sampling,
        cost,
        session,
        tokenization,
        own_runs,
        token_batching,
        curves,
        matcher_curves,
        state_restores,
    };
    write_report(&report, &opts.out_dir)?;
    Ok(report)
}

/// The Python consumer's row (`--python`).
async fn baseline_row(opts: &BenchOptions) -> anyhow::Result<Option<BaselineRow>> {
    let Some(python) = &opts.python else {
        return Ok(None);
    };
    let row = baseline::run(opts, python).await?;
    row.print();
    Ok(Some(row))
}

/// bench.json, bench.md (the tables) and the charts into `dir`.
pub fn write_report(report: &Report, dir: &Path) -> anyhow::Result<()> {
    report.write_json(dir)?;
    let md = dir.join("bench.md");
    std::fs::write(&md, markdown::render(report))?;
    eprintln!("tables: {}", md.display());
    for c in chart::draw_all(report, dir)? {
        eprintln!("chart: {}", c.display());
    }
    Ok(())
}

/// From a saved bench.json: the charts and bench.md beside it again; the
/// first chart's path.
pub fn replot(report_path: &Path) -> anyhow::Result<PathBuf> {
    let report = Report::read(report_path)?;
    let dir = report_path.parent().unwrap_or(Path::new("."));
    std::fs::write(dir.join("bench.md"), markdown::render(&report))?;
    chart::draw_all(&report, dir)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("the report has nothing to draw"))
}

/// Rewrite every generated table block of `doc` (a markdown file) from the
/// bench.json it names; paths are relative to the current directory.
pub fn update_docs(doc: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(doc)?;
    std::fs::write(doc, markdown::splice(&text, Path::new("."))?)?;
    Ok(())
}

/// The fixed grid at saturation, then the adaptive cell; beside each size
/// the raw model on as many sessions as the pipeline has workers, and
/// beside each cell the same cell as its own `modstream run` process (its
/// CPU per verdict).
async fn saturation_grid(
    opts: &BenchOptions,
    inference: &InferenceSettings,
    model: &mut Model,
) -> anyhow::Result<Vec<SaturationRow>> {
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
    let mut sessions = (0..inference.worker_count())
        .map(|_| Model::load(inference))
        .collect::<Result<Vec<_>, _>>()?;
    let texts: Vec<String> = generate(opts.events, 0, "raw-")
        .into_iter()
        .filter_map(|e| e.text)
        .collect();
    if process::service_binary().is_none() {
        eprintln!(
            "no modstream binary beside this one: the cells' own-process CPU is not measured"
        );
    }
    let mut rows = Vec::new();
    let mut raw_at = std::collections::HashMap::new();
    print::print_saturation_header();
    for &batch in &opts.batch_sizes {
        let raw = raw::raw_on_sessions(&mut sessions, &texts, batch)?;
        raw_at.insert(batch, raw);
        let naive = match unbucketed.as_mut() {
            Some(m) => Some(raw_model_throughput(m, &texts, batch)?),
            None => None,
        };
        for &delay in &opts.delays_ms {
            let b = Batching::fixed(batch, delay);
            let run = measure::saturation(opts, b).await?;
            let row = rows::saturation_row(b, opts.events, &run, raw.per_s, naive);
            let row = beside(row, raw, own_process(opts, b).await?);
            row.print();
            rows.push(row);
        }
    }
    if let Some(b) = adaptive_cell(opts) {
        let run = measure::saturation(opts, b).await?;
        let raw = raw_at.get(&b.size).copied();
        let raw_per_s = raw.map_or(f64::NAN, |r| r.per_s);
        let mut row = rows::saturation_row(b, opts.events, &run, raw_per_s, None);
        row.target_p99_ms = b.target_p99_ms;
        if let Some(raw) = raw {
            row = beside(row, raw, own_process(opts, b).await?);
        }
        row.print();
        rows.push(row);
    }
    Ok(rows)
}

/// A saturation row with the raw model's run and its own process's beside it.
fn beside(mut row: SaturationRow, raw: raw::RawRun, own: Option<OwnProcess>) -> SaturationRow {
    row.raw_sessions = Some(raw.sessions);
    row.raw_cpu_us_per_event = Some(raw.cpu_us_per_event);
    row.own_process = own;
    row
}

/// The cell `b` as its own `modstream run` process on the saturation
/// run's events (None without the `modstream` binary beside this one).
async fn own_process(opts: &BenchOptions, b: Batching) -> anyhow::Result<Option<OwnProcess>> {
    if process::service_binary().is_none() {
        return Ok(None);
    }
    let events = generate(opts.events, 0, "s-");
    let run = baseline::service_process(opts, &events, |cell| measure::service_toml(opts, cell, b))
        .await?;
    Ok(Some(OwnProcess {
        per_s: run.per_s,
        // CPU seconds per million verdicts = CPU µs per verdict.
        cpu_us_per_verdict: run.cpu_s_per_million(),
        kafka_cpu_share: run.kafka_share(),
        inference_cpu_share: run.cpu.inference_s / run.cpu.total_s.max(1e-9),
        peak_rss_bytes: run.peak_rss_bytes,
        broker_cpu_us_per_verdict: run.broker_cpu_us_per_verdict(),
    }))
}

/// The adaptive cell: a latency target, bounded by the grid's largest size
/// and delay.
fn adaptive_cell(opts: &BenchOptions) -> Option<Batching> {
    (opts.target_p99_ms > 0).then_some(Batching {
        size: opts.batch_sizes.iter().copied().max().unwrap_or(64),
        delay_ms: opts.delays_ms.iter().copied().max().unwrap_or(20),
        target_p99_ms: Some(opts.target_p99_ms),
    })
}

/// The latency part of the sweep, filled in order.
struct Sweep {
    saturation: Vec<SaturationRow>,
    best_fixed: f64,
    adaptive: Option<Batching>,
    latency: Vec<LatencyRow>,
    broker_floor: Vec<FloorRow>,
}

impl Sweep {
    /// Each batch size with the first delay, at each fraction of its own
    /// saturation.
    async fn fixed_latency(&mut self, opts: &BenchOptions) -> anyhow::Result<()> {
        print::print_latency_header();
        let delay = opts.delays_ms[0];
        for &batch in &opts.batch_sizes {
            let Some(per_s) = self
                .saturation
                .iter()
                .find(|r| r.max_batch_size == batch && r.max_batch_delay_ms == delay)
                .map(|r| r.pipeline_per_s)
            else {
                continue;
            };
            for &fraction in &opts.loads {
                let b = Batching::fixed(batch, delay);
                let row = measure::latency(opts, b, fraction, per_s * fraction).await?;
                row.print();
                self.latency.push(row);
            }
        }
        Ok(())
    }

    /// The adaptive cell at the same fractions of the best fixed cell's
    /// saturation (what this machine can do), each right after the broker
    /// alone at that rate: the floor of every latency here, measured with
    /// the broker in the same state (it slows as a run fills it).
    async fn floor_and_adaptive_latency(&mut self, opts: &BenchOptions) -> anyhow::Result<()> {
        for &fraction in &opts.loads {
            let rate = self.best_fixed * fraction;
            let floor = measure::broker_round_trip(opts, rate).await?;
            floor.print();
            self.broker_floor.push(floor);
            if let Some(b) = self.adaptive {
                let row = measure::latency(opts, b, fraction, rate).await?;
                row.print();
                self.latency.push(row);
            }
        }
        Ok(())
    }
}
