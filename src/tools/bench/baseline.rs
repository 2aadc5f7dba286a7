//! modstream with its default configuration against the same job written
//! the usual way in Python (`bench/python_consumer.py`: confluent-kafka
//! `consume(128)` → onnxruntime → produce → flush → commit), each as its own
//! process on its own fresh cluster holding the same pre-produced events.
//! Throughput comes from the verdict records' own timestamps (first to
//! last, so start-up and the group join do not count), peak RSS from each
//! process, both read the same way: `/proc/PID/status` VmHWM of that
//! process, sampled every 50 ms until it is done.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::BenchOptions;
use super::measure::{Cell, inference_settings, peak_rss_of};
use super::report::BaselineRow;
use crate::tools::generator::{GeneratedEvent, generate};
use crate::tools::read::TopicReader;
use crate::tools::send;

pub(super) async fn run(opts: &BenchOptions, python: &Path) -> anyhow::Result<BaselineRow> {
    let script = opts
        .python_script
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench/python_consumer.py"));
    anyhow::ensure!(script.exists(), "{} not found", script.display());
    let events = generate(opts.events, 0, "b-");
    let model_dir = std::path::absolute(inference_settings(opts).model_dir)?;
    let (modstream_per_s, modstream_peak) = modstream(opts, &events, &model_dir).await?;
    let (python_per_s, python_peak) =
        python_job(opts, &events, python, &script, &model_dir).await?;
    Ok(BaselineRow {
        events: events.len(),
        modstream_per_s,
        modstream_peak_rss_bytes: modstream_peak,
        python_per_s,
        python_peak_rss_bytes: python_peak,
    })
}

/// `modstream run` with only the topics, group and model set.
async fn modstream(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    model_dir: &Path,
) -> anyhow::Result<(f64, u64)> {
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
             [output]\ntopic = {:?}\ndlq_topic = {:?}\n[inference]\nmodel_dir = {:?}\n\
             [telemetry]\nlisten = \"127.0.0.1:0\"\nlog_level = \"warn\"\n",
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
    let pid = child.id().to_string();
    let reader = spawn_timed_reader(&cell, events.len());
    let mut peak = 0;
    while !reader.is_finished() {
        peak = peak.max(peak_rss_of(&pid));
        if let Some(status) = child.try_wait()? {
            reader.abort();
            anyhow::bail!("modstream run exited before its last verdict: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak = peak.max(peak_rss_of(&pid));
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((reader.await??, peak))
}

async fn python_job(
    opts: &BenchOptions,
    events: &[GeneratedEvent],
    python: &Path,
    script: &Path,
    model_dir: &Path,
) -> anyhow::Result<(f64, u64)> {
    let cell = Cell::new(opts).await?;
    send::produce_all(&cell.bootstrap, &cell.input, events).await?;
    let reader = spawn_timed_reader(&cell, events.len());
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
    // Its peak RSS the way modstream's is read: VmHWM of that process,
    // sampled until it exits (the kernel keeps it to the end).
    let pid = child.id().to_string();
    let mut peak = 0;
    let status = loop {
        peak = peak.max(peak_rss_of(&pid));
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    anyhow::ensure!(status.success(), "the Python consumer failed: {status}");
    anyhow::ensure!(peak > 0, "could not read the Python consumer's peak RSS");
    Ok((reader.await??, peak))
}

/// Reads `want` verdicts; verdicts per second from their own timestamps.
fn spawn_timed_reader(cell: &Cell, want: usize) -> tokio::task::JoinHandle<anyhow::Result<f64>> {
    let (bootstrap, topic) = (cell.bootstrap.clone(), cell.verdicts.clone());
    tokio::task::spawn_blocking(move || {
        let reader = TopicReader::from_beginning(&bootstrap, &topic, None)?;
        let (mut first, mut last) = (i64::MAX, i64::MIN);
        let read = reader.read(want, Duration::from_secs(600), |r| {
            if let Some(t) = r.timestamp_ms {
                first = first.min(t);
                last = last.max(t);
            }
        })?;
        anyhow::ensure!(read.len() == want, "only {} of {want} verdicts", read.len());
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
