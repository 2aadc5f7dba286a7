//! modstream with its default configuration against the same job written
//! the usual way in Python (`bench/python_consumer.py`: confluent-kafka
//! `consume(128)` → onnxruntime → produce → flush → commit), each as its own
//! process on its own fresh cluster holding the same pre-produced events.
//! Throughput comes from the verdict records' own timestamps (first to
//! last, so start-up and the group join do not count); peak RSS and CPU
//! time from each process, read the same way: `/proc/PID` sampled every
//! 50 ms, VmHWM for the peak, and the CPU seconds it spent from the first
//! sample after a verdict was read to the last, per verdict read between
//! those two samples (its start-up does not count).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::BenchOptions;
use super::measure::{Cell, inference_settings};
use super::process::{CpuTime, cpu_time_of, peak_rss_of};
use super::report::BaselineRow;
use crate::tools::generator::{GeneratedEvent, generate};
use crate::tools::read::TopicReader;
use crate::tools::send;

/// What one process did with the events.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProcessRun {
    pub per_s: f64,
    pub peak_rss_bytes: u64,
    /// Between the first sample after a verdict was read and the last
    /// sample, and the verdicts read between those two samples.
    pub cpu: CpuTime,
    pub verdicts: usize,
}

impl ProcessRun {
    /// None where too few verdicts fell between two samples to say (a run
    /// over in a few tens of milliseconds).
    pub fn cpu_s_per_million(&self) -> Option<f64> {
        (self.verdicts >= 20 && self.cpu.total_s > 0.0)
            .then(|| self.cpu.total_s * 1e6 / self.verdicts as f64)
    }

    /// The Kafka client's threads' share of the CPU time.
    pub fn kafka_share(&self) -> f64 {
        self.cpu.kafka_s / self.cpu.total_s.max(1e-9)
    }
}

pub(super) async fn run(opts: &BenchOptions, python: &Path) -> anyhow::Result<BaselineRow> {
    let script = python_script(opts)?;
    let events = generate(opts.events, 0, "b-");
    let model_dir = std::path::absolute(inference_settings(opts).model_dir)?;
    let m = modstream(opts, &events, &model_dir, "").await?;
    let p = python_job(opts, &events, python, &script, &model_dir).await?;
    Ok(BaselineRow {
        events: events.len(),
        modstream_per_s: m.per_s,
        modstream_peak_rss_bytes: m.peak_rss_bytes,
        python_per_s: p.per_s,
        python_peak_rss_bytes: p.peak_rss_bytes,
        modstream_cpu_s_per_million: m.cpu_s_per_million(),
        modstream_kafka_cpu_share: Some(m.kafka_share()),
        python_cpu_s_per_million: p.cpu_s_per_million(),
    })
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
/// (TOML appended after `[inference]`).
pub(super) async fn modstream(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    model_dir: &Path,
    extra: &str,
) -> anyhow::Result<ProcessRun> {
    let exe = std::env::current_exe()?;
    anyhow::ensure!(
        exe.file_stem().is_some_and(|n| n == "modstream"),
        "the baseline needs the modstream binary (run `modstream bench`)"
    );
    let cell = Cell::new(opts).await?;
    send::produce_all(&cell.bootstrap, &cell.input, events).await?;
    let dir = tempfile_dir("modstream-baseline")?;
    let config = dir.join("modstream.toml");
    std::fs::write(
        &config,
        format!(
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
        ),
    )?;
    let mut child = Command::new(&exe)
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .spawn()?;
    let watched = watch(&mut child, &cell, events.len(), false).await;
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await?;
    let _ = std::fs::remove_dir_all(&dir);
    watched
}

pub(super) async fn python_job(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    python: &Path,
    script: &Path,
    model_dir: &Path,
) -> anyhow::Result<ProcessRun> {
    let cell = Cell::new(opts).await?;
    send::produce_all(&cell.bootstrap, &cell.input, events).await?;
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
        .stdout(Stdio::null())
        .spawn()?;
    let run = watch(&mut child, &cell, events.len(), true).await?;
    anyhow::ensure!(
        run.peak_rss_bytes > 0,
        "could not read the Python consumer's peak RSS"
    );
    Ok(run)
}

/// Reads `want` verdicts of `cell` while sampling the process every 50 ms;
/// `exits_itself`: the process ends on its own once done (its last sample
/// is the last taken while it lived), else it must outlive the reading.
async fn watch(
    child: &mut Child,
    cell: &Cell,
    want: usize,
    exits_itself: bool,
) -> anyhow::Result<ProcessRun> {
    let pid = child.id().to_string();
    let read = Arc::new(AtomicUsize::new(0));
    let reader = spawn_timed_reader(cell, want, read.clone());
    let (mut peak, mut first, mut last) = (0, None, (CpuTime::default(), 0));
    loop {
        peak = peak.max(peak_rss_of(&pid));
        let seen = read.load(Ordering::SeqCst);
        if let Some(now) = cpu_time_of(&pid) {
            last = (now, seen);
            if first.is_none() && seen > 0 {
                first = Some((now, seen));
            }
        }
        if reader.is_finished() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            if exits_itself && status.success() {
                break;
            }
            reader.abort();
            anyhow::bail!("the process exited before its last verdict: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let per_s = reader.await??;
    let (first, last) = (first.unwrap_or_default(), last);
    Ok(ProcessRun {
        per_s,
        peak_rss_bytes: peak,
        cpu: last.0.since(&first.0),
        verdicts: last.1.saturating_sub(first.1),
    })
}

/// Reads `want` verdicts, counting them in `read`; verdicts per second
/// from their own timestamps.
fn spawn_timed_reader(
    cell: &Cell,
    want: usize,
    read: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<anyhow::Result<f64>> {
    let (bootstrap, topic) = (cell.bootstrap.clone(), cell.verdicts.clone());
    tokio::task::spawn_blocking(move || {
        let reader = TopicReader::from_beginning(&bootstrap, &topic, None)?;
        let (mut first, mut last) = (i64::MAX, i64::MIN);
        let records = reader.read(want, Duration::from_secs(600), |r| {
            read.fetch_add(1, Ordering::SeqCst);
            if let Some(t) = r.timestamp_ms {
                first = first.min(t);
                last = last.max(t);
            }
        })?;
        anyhow::ensure!(
            records.len() == want,
            "only {} of {want} verdicts",
            records.len()
        );
        anyhow::ensure!(last > first, "verdict timestamps do not span any time");
        Ok((want - 1) as f64 * 1000.0 / (last - first) as f64)
    })
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
