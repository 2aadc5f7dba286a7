//! modstream with its default configuration against the same job written
//! the usual way in Python (`bench/python_consumer.py`: confluent-kafka
//! `consume(128)` → onnxruntime → produce → flush → commit), each as its own
//! process on its own fresh cluster holding the same pre-produced events.
//! Throughput comes from the verdict records' own timestamps (first to
//! last, so start-up and the group join do not count); peak RSS and CPU
//! time from each process, read the same way: `/proc/PID` sampled every
//! 10 ms, VmHWM for the peak, and the CPU seconds it spent from the first
//! sample after a verdict was read to the last, per verdict read between
//! those two samples (its start-up does not count).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::BenchOptions;
use super::cell::Cell;
use super::measure::inference_settings;
use super::print::Print;
use super::process::service_binary;
use super::watch::{ProcessRun, TimedReader, watch};
use modstream::tools::generator::{GeneratedEvent, generate};
use modstream::tools::report::{BaselineRow, OwnRun, PythonRun, TracingCost};
use modstream::tools::send;

pub(super) async fn run(opts: &BenchOptions, python: &Path) -> anyhow::Result<BaselineRow> {
    let script = python_script(opts)?;
    let events = generate(opts.events, 0, "b-");
    let model_dir = std::path::absolute(inference_settings(opts).model_dir)?;
    let m = modstream(opts, &events, &model_dir, "").await?;
    let p = python_job(
        opts,
        &events,
        python,
        &script,
        &model_dir,
        IntraThreads::Default,
    )
    .await?;
    let one = python_job(
        opts,
        &events,
        python,
        &script,
        &model_dir,
        IntraThreads::One,
    )
    .await?;
    Ok(BaselineRow {
        events: events.len(),
        modstream_per_s: m.per_s,
        modstream_peak_rss_bytes: m.peak_rss_bytes,
        python_per_s: p.per_s,
        python_peak_rss_bytes: p.peak_rss_bytes,
        modstream_cpu_s_per_million: m.cpu_s_per_million(),
        modstream_kafka_cpu_share: Some(m.kafka_share()),
        python_cpu_s_per_million: p.cpu_s_per_million(),
        modstream_broker_cpu_us_per_verdict: m.broker_cpu_us_per_verdict(),
        python_broker_cpu_us_per_verdict: p.broker_cpu_us_per_verdict(),
        python_one_thread: Some(PythonRun {
            per_s: one.per_s,
            peak_rss_bytes: one.peak_rss_bytes,
            cpu_s_per_million: one.cpu_s_per_million(),
            broker_cpu_us_per_verdict: one.broker_cpu_us_per_verdict(),
        }),
        kcat_floor: match opts.kcat_floor {
            true => Some(super::relay::kcat_floor(opts, &events).await?),
            false => None,
        },
    })
}

/// `--own-runs`: `modstream run` at its default configuration, the same
/// events each time.
pub(super) async fn own_runs(opts: &BenchOptions) -> anyhow::Result<Vec<OwnRun>> {
    let events = generate(opts.events, 0, "o-");
    let model_dir = std::path::absolute(inference_settings(opts).model_dir)?;
    // Each round runs the default configuration, then each contender.
    let mut contenders = vec![OwnContender::Plain];
    if opts.state_rules {
        contenders.push(OwnContender::State);
    }
    contenders.extend(
        opts.tracing_ratios
            .iter()
            .map(|r| OwnContender::Tracing(*r)),
    );
    let state_extra = crate::state::rules_config(&model_dir)?;
    let sink = match opts.tracing_ratios.is_empty() {
        true => None,
        false => Some(crate::traces::Sink::start().await?),
    };
    let mut runs = Vec::with_capacity(opts.own_runs * contenders.len());
    for _ in 0..opts.own_runs {
        for &contender in &contenders {
            let extra = match (contender, &sink) {
                (OwnContender::State, _) => state_extra.clone(),
                (OwnContender::Tracing(ratio), Some(sink)) => sink.config(ratio),
                _ => String::new(),
            };
            let exported = sink.as_ref().map_or(0, |s| s.bytes());
            let m = modstream(opts, &events, &model_dir, &extra).await?;
            let run = OwnRun {
                events: events.len(),
                per_s: m.per_s,
                cpu_us_per_verdict: m.cpu_s_per_million(),
                kafka_cpu_share: m.kafka_share(),
                peak_rss_bytes: m.peak_rss_bytes,
                broker_cpu_us_per_verdict: m.broker_cpu_us_per_verdict(),
                state: (contender == OwnContender::State).then(|| m.changelog.cost(events.len())),
                tracing: match (contender, &sink) {
                    (OwnContender::Tracing(ratio), Some(sink)) => Some(TracingCost {
                        sampling_ratio: ratio,
                        otlp_bytes_per_verdict: (sink.bytes() - exported) as f64
                            / events.len().max(1) as f64,
                    }),
                    _ => None,
                },
                floor: None,
            };
            run.print();
            runs.push(run);
        }
        if opts.kcat_floor {
            let floor = super::relay::kcat_floor(opts, &events).await?;
            floor.print();
            let round = runs.len() - contenders.len();
            runs[round].floor = Some(floor);
        }
    }
    Ok(runs)
}

/// What one `--own-runs` run turns on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum OwnContender {
    /// The default configuration.
    Plain,
    /// `--state-rules`.
    State,
    /// `--tracing-ratios`: tracing on at this ratio.
    Tracing(f64),
}

/// ONNX Runtime's intra-op threads in the Python job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IntraThreads {
    /// Its default session options: one thread per core, spinning between
    /// runs.
    Default,
    /// One thread: the stronger baseline on a loaded machine.
    One,
}

impl IntraThreads {
    /// The script's INTRA_THREADS argument (0: ONNX Runtime's default).
    fn arg(self) -> &'static str {
        match self {
            IntraThreads::Default => "0",
            IntraThreads::One => "1",
        }
    }
}

pub(super) fn python_script(opts: &BenchOptions) -> anyhow::Result<PathBuf> {
    let script = opts
        .python_script
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench/python_consumer.py"));
    anyhow::ensure!(script.exists(), "{} not found", script.display());
    Ok(script)
}

/// `modstream run` with only the topics, group and model set, and `extra`
/// (TOML appended after `[inference]`; [`crate::state::STATE_TOPIC`] in it
/// stands for the cell's state changelog).
pub(super) async fn modstream(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    model_dir: &Path,
    extra: &str,
) -> anyhow::Result<ProcessRun> {
    service_process(opts, events, |cell| {
        Ok(format!(
            "[kafka]\nbootstrap_servers = {:?}\ngroup_id = {:?}\n[input]\ntopics = [{:?}]\n\
             [output]\ntopic = {:?}\ndlq_topic = {:?}\n\
             [telemetry]\nlisten = \"127.0.0.1:0\"\nlog_level = \"warn\"\n\
             [inference]\nmodel_dir = {:?}\n{extra}",
            cell.bootstrap,
            cell.group,
            cell.input,
            cell.verdicts,
            cell.dlq,
            model_dir.display().to_string()
        )
        .replace(crate::state::STATE_TOPIC, &cell.state))
    })
    .await
}

/// `modstream run` as its own process, with the configuration `config`
/// writes for a fresh cell that holds `events`, watched until every verdict
/// is read.
pub(super) async fn service_process(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    config: impl FnOnce(&Cell) -> anyhow::Result<String>,
) -> anyhow::Result<ProcessRun> {
    let exe = service_binary().ok_or_else(|| {
        anyhow::anyhow!(
            "a separate modstream process needs the modstream binary beside modstream-bench"
        )
    })?;
    let cell = Cell::new(opts).await?;
    send::produce_all(&cell.bootstrap, &cell.input, events).await?;
    let dir = tempfile_dir("modstream-baseline")?;
    let path = dir.join("modstream.toml");
    std::fs::write(&path, config(&cell)?)?;
    let reader = TimedReader::start(&cell, events.len()).await?;
    let mut child = Command::new(&exe)
        .args(["run", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .spawn()?;
    let watched = watch(&mut child, reader, false, opts.broker_pid).await;
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await?;
    let _ = std::fs::remove_dir_all(&dir);
    let changelog = crate::state::changelog_of(&cell).await?;
    watched.map(|run| ProcessRun { changelog, ..run })
}

pub(super) async fn python_job(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    python: &Path,
    script: &Path,
    model_dir: &Path,
    threads: IntraThreads,
) -> anyhow::Result<ProcessRun> {
    let cell = Cell::new(opts).await?;
    send::produce_all(&cell.bootstrap, &cell.input, events).await?;
    let reader = TimedReader::start(&cell, events.len()).await?;
    let mut child = Command::new(python)
        .arg(script)
        .args([
            &cell.bootstrap,
            &cell.input,
            &cell.verdicts,
            "python-baseline",
        ])
        .arg(model_dir)
        .arg(events.len().to_string())
        .arg(threads.arg())
        .stdout(Stdio::null())
        .spawn()?;
    let run = watch(&mut child, reader, true, opts.broker_pid).await?;
    anyhow::ensure!(
        run.peak_rss_bytes > 0,
        "could not read the Python consumer's peak RSS"
    );
    Ok(run)
}

fn tempfile_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "{name}-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_micros()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
