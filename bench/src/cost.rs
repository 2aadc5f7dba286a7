//! The cost table (`--cost DIR,DIR` and, with `--cascade`, the cascade at
//! `--cascade-band`): for each model on the same skewed posts, the raw model
//! at its best on all cores (one session with every core as intra-op
//! threads, or one single-threaded session per core, batches of 32 or 64,
//! whichever is fastest),
//! `modstream run` at its default configuration as its own process
//! (verdicts/s, CPU seconds per million verdicts, the Kafka client's share
//! of them, peak RSS; read as the Python baseline's), the pipeline with the
//! latency target at saturation and the default cell's p99 at half of the
//! default's throughput; the plain Python consumer with the same model.

use std::path::{Path, PathBuf};

use super::BenchOptions;
use super::baseline;
use super::cascade;
use super::formats::Encoding;
use super::measure::{self, Batching, Clock, raw_model_throughput};
use super::watch::ProcessRun;
use crate::print::Print;
use modstream::config::InferenceSettings;
use modstream::inference::Model;
use modstream::tools::generator::{GeneratedEvent, generate};
use modstream::tools::report::CostRow;

/// One contender: a model alone, or the configured model with `transformer`
/// behind it at a band.
enum Contender {
    Alone(PathBuf),
    Cascade(PathBuf, cascade::Band),
}

fn name(p: &Path) -> String {
    p.file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned())
}

pub async fn rows(opts: &BenchOptions) -> anyhow::Result<Vec<CostRow>> {
    let mut contenders: Vec<Contender> = opts.cost.iter().cloned().map(Contender::Alone).collect();
    if contenders.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(t) = &opts.cascade {
        contenders.push(Contender::Cascade(t.clone(), opts.cascade_band));
    }
    std::fs::create_dir_all(&opts.out_dir)?;
    let events = generate(opts.events, 0, "k-");
    let mut rows = Vec::new();
    for c in &contenders {
        let row = row(opts, c, &events).await?;
        row.print();
        rows.push(row);
    }
    Ok(rows)
}

async fn row(
    opts: &BenchOptions,
    contender: &Contender,
    events: &[GeneratedEvent],
) -> anyhow::Result<CostRow> {
    let first = std::path::absolute(measure::inference_settings(opts).model_dir)?;
    let (label, o, extra, raw) = match contender {
        Contender::Alone(dir) => {
            let o = BenchOptions {
                model_dir: Some(dir.clone()),
                ..opts.clone()
            };
            let raw = raw_at_best(&o, events)?;
            (name(dir), o, String::new(), Some(raw))
        }
        Contender::Cascade(dir, band) => {
            let encoding = cascade::setup(opts, dir, Some(*band), &opts.out_dir)?;
            let extra = cascade_config(&encoding, &first, dir)?;
            let o = opts.with_encoding(encoding);
            let label = format!(
                "{} → {} at {}-{}",
                name(&first),
                name(dir),
                band.from,
                band.to
            );
            (label, o, extra, None)
        }
    };
    let model_dir = std::path::absolute(measure::inference_settings(&o).model_dir)?;
    let default = baseline::modstream(&o, events, &model_dir, &extra).await?;
    let target = Batching {
        size: 128,
        delay_ms: 20,
        target_p99_ms: Some(opts.target_p99_ms.max(1)),
    };
    let target_per_s = measure::saturation_clocked(&o, target, events.to_vec(), Clock::Verdicts)
        .await?
        .per_s;
    let latency = measure::latency(&o, Batching::fixed(64, 20), 0.5, default.per_s * 0.5).await?;
    let python = match (&opts.python, contender) {
        (Some(python), Contender::Alone(_)) => {
            let script = baseline::python_script(opts)?;
            let threads = baseline::IntraThreads::Default;
            Some(baseline::python_job(&o, events, python, &script, &model_dir, threads).await?)
        }
        _ => None,
    };
    let (raw_per_s, raw_layout) = raw.unzip();
    Ok(CostRow {
        contender: label,
        events: events.len(),
        raw_per_s,
        raw_layout,
        default_per_s: default.per_s,
        cpu_s_per_million: default.cpu_s_per_million(),
        kafka_cpu_share: default.kafka_share(),
        peak_rss_bytes: default.peak_rss_bytes,
        target_per_s,
        target_p99_ms: target.target_p99_ms.unwrap_or_default(),
        p99_at_half_ms: latency.p99_ms,
        python_per_s: python.map(|p: ProcessRun| p.per_s),
        python_cpu_s_per_million: python.and_then(|p| p.cpu_s_per_million()),
        python_peak_rss_bytes: python.map(|p| p.peak_rss_bytes),
    })
}

/// The TOML for `modstream run` of the cascade: both models (workers left
/// at their default) and the sweep's policy file.
fn cascade_config(encoding: &Encoding, first: &Path, second: &Path) -> anyhow::Result<String> {
    let policy = encoding
        .policy_file()
        .ok_or_else(|| anyhow::anyhow!("the cascade has no policy file"))?;
    let second = std::path::absolute(second)?;
    Ok(format!(
        "[[inference.models]]\nname = \"first\"\nmodel_dir = {:?}\n\
         [[inference.models]]\nname = \"second\"\nmodel_dir = {:?}\n\
         [policy]\nfile = {:?}\n",
        first.display().to_string(),
        second.display().to_string(),
        std::path::absolute(policy)?.display().to_string()
    ))
}

/// Raw verdicts/s, the best of batches of 32 and 64 (arrival order) and of
/// one session with all cores and one single-threaded session per core;
/// and which it was.
fn raw_at_best(opts: &BenchOptions, events: &[GeneratedEvent]) -> anyhow::Result<(f64, String)> {
    let mut best = (0.0, String::new());
    for batch in [32, 64] {
        let (per_s, layout) = raw_layouts(opts, events, batch)?;
        if per_s > best.0 {
            best = (per_s, format!("{layout}, batches of {batch}"));
        }
    }
    Ok(best)
}

/// The faster of one session with all cores and one single-threaded
/// session per core (each scoring its share of the batches).
fn raw_layouts(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    batch: usize,
) -> anyhow::Result<(f64, String)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let texts: Vec<String> = events.iter().filter_map(|e| e.text.clone()).collect();
    let base = measure::inference_settings(opts);
    let mut one = Model::load(&InferenceSettings {
        intra_threads: cores,
        ..base.clone()
    })?;
    let (one_per_s, _) = raw_model_throughput(&mut one, &texts, batch)?;
    drop(one);
    let mut models = (0..cores)
        .map(|_| {
            Model::load(&InferenceSettings {
                intra_threads: 1,
                ..base.clone()
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let share = texts.len().div_ceil(cores);
    // Each thread's own rate (its warm-up batch not timed, as above),
    // summed: they ran at the same time.
    let rates = std::thread::scope(|s| {
        let runs: Vec<_> = models
            .iter_mut()
            .zip(texts.chunks(share))
            .map(|(m, part)| s.spawn(move || raw_model_throughput(m, part, batch)))
            .collect();
        runs.into_iter()
            .map(|r| {
                r.join()
                    .map_err(|_| anyhow::anyhow!("a raw scoring thread panicked"))?
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let per_core_per_s: f64 = rates.iter().map(|(per_s, _)| per_s).sum();
    Ok(if one_per_s >= per_core_per_s {
        (one_per_s, format!("1 session × {cores} threads"))
    } else {
        (per_core_per_s, format!("{cores} sessions × 1 thread"))
    })
}
