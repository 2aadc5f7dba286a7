//! The measurements: the raw model in a tight loop, the pipeline at
//! saturation, paced open-loop latency, and the peak memory of a separate
//! `modstream run` under overload. Each pipeline run gets a fresh [`Cell`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::BenchOptions;
use super::cell::Cell;
use super::process::{peak_rss_of, service_binary};

mod settings;
use modstream::inference::Model;
use modstream::shutdown::Shutdown;
use modstream::tools::generator::{GeneratedEvent, generate};
use modstream::tools::read::TopicReader;
use modstream::tools::report::{FloorRow, LatencyRow};
use modstream::tools::send::{self, Schedule};
use settings::pipeline_settings;
pub use settings::{Batching, inference_settings, service_toml};

/// Raw model throughput: events/s scoring `texts` in batches of `batch`
/// (arrival order), and the padding efficiency of those runs (token models).
pub fn raw_model_throughput(
    model: &mut Model,
    texts: &[String],
    batch: usize,
) -> anyhow::Result<(f64, Option<f64>)> {
    let mut batches: Vec<Vec<String>> = texts.chunks(batch).map(<[String]>::to_vec).collect();
    model.score(&mut batches[0])?; // warm-up
    let before = model.tokens;
    let started = Instant::now();
    for b in &mut batches {
        model.score(b)?;
    }
    let per_s = texts.len() as f64 / started.elapsed().as_secs_f64();
    let padded = model.tokens.padded - before.padded;
    let efficiency = (padded > 0).then(|| (model.tokens.real - before.real) as f64 / padded as f64);
    Ok((per_s, efficiency))
}

/// What a saturation run measured.
pub struct Saturated {
    /// Verdicts per second over the run's clock.
    pub per_s: f64,
    pub summary: modstream::pipeline::RunSummary,
    /// The seconds the clock counted.
    pub elapsed_s: f64,
}

pub(super) async fn saturation(opts: &BenchOptions, b: Batching) -> anyhow::Result<Saturated> {
    saturation_of(opts, b, generate(opts.events, 0, "s-")).await
}

/// Pipeline at saturation on these events.
pub(super) async fn saturation_of(
    opts: &BenchOptions,
    b: Batching,
    events: Vec<GeneratedEvent>,
) -> anyhow::Result<Saturated> {
    saturation_clocked(opts, b, events, Clock::ModelLoaded).await
}

/// When a saturation run's clock starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clock {
    /// Once the model is loaded: the connections and the group join count.
    ModelLoaded,
    /// From the first verdict to the last by their own (produce) timestamps:
    /// start-up, the join and the last transaction's wait do not count. Not
    /// a window between inner verdicts: runs finished out of order release
    /// verdicts in bursts, which such a window can squeeze (10 %–90 % did,
    /// up to 3×, while urgent batches ran newest first). Counts all but one.
    Verdicts,
}

/// [`saturation_of`] with the clock starting at `clock`.
pub(super) async fn saturation_clocked(
    opts: &BenchOptions,
    b: Batching,
    events: Vec<GeneratedEvent>,
    clock: Clock,
) -> anyhow::Result<Saturated> {
    saturation_read(opts, b, events, clock, |_| {}).await
}

/// [`saturation_clocked`], showing `seen` every verdict read.
pub(super) async fn saturation_read(
    opts: &BenchOptions,
    b: Batching,
    events: Vec<GeneratedEvent>,
    clock: Clock,
    mut seen: impl FnMut(&serde_json::Value) + Send + 'static,
) -> anyhow::Result<Saturated> {
    let cell = Cell::new(opts).await?;
    send::produce_all(&cell.bootstrap, &cell.input, &events).await?;
    let shutdown = Shutdown::new();
    let health = std::sync::Arc::new(modstream::telemetry::Health::default());
    let run = tokio::spawn(modstream::pipeline::run_with_health(
        pipeline_settings(opts, &cell, b)?,
        shutdown.clone(),
        health.clone(),
    ));
    let want = events.len();
    let (b, t, partitions) = (
        cell.bootstrap.clone(),
        cell.verdicts.clone(),
        cell.verdict_partitions,
    );
    let reader = tokio::task::spawn_blocking(move || {
        let mut stamps = Vec::with_capacity(want);
        let ends = read_verdicts(
            &b,
            &t,
            partitions,
            want,
            Duration::from_secs(600),
            |v, at| {
                seen(v);
                stamps.extend(at);
            },
        )?;
        // Produce times: a reader starting late would catch up in a burst.
        let span = (stamps.len() == want && want > 1)
            .then(|| stamps.iter().max().zip(stamps.iter().min()))
            .flatten()
            .map(|(last, first)| (last - first) as f64 / 1000.0)
            .filter(|s| *s > 0.0);
        anyhow::Ok((ends, span))
    });
    // The clock starts once the model is loaded and warmed up (start-up is
    // not throughput); the group join is inside the measured time.
    while !health
        .model_loaded
        .load(std::sync::atomic::Ordering::SeqCst)
        && !run.is_finished()
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    let ((_, done_at), span) = reader.await??;
    let (elapsed, counted) = match (clock, span) {
        (Clock::Verdicts, Some(seconds)) => (seconds, want - 1),
        _ => (done_at.duration_since(started).as_secs_f64(), want),
    };
    shutdown.stop.cancel();
    let summary = run.await??;
    Ok(Saturated {
        per_s: counted as f64 / elapsed,
        summary,
        elapsed_s: elapsed,
    })
}

/// Read verdicts until `want` arrived; `seen(verdict, its timestamp)` each.
/// Returns when the first and the last one were read.
fn read_verdicts(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: usize,
    timeout: Duration,
    mut seen: impl FnMut(&serde_json::Value, Option<i64>),
) -> anyhow::Result<(Instant, Instant)> {
    let reader = TopicReader::from_beginning(bootstrap, topic, Some(partitions))?;
    let mut last = Instant::now();
    let mut first = None;
    let read = reader.read(want, timeout, |record| {
        last = Instant::now();
        first.get_or_insert(last);
        if let Some(v) = record.json() {
            seen(&v, record.timestamp_ms);
        }
    })?;
    anyhow::ensure!(
        read.len() == want,
        "only {} of {want} verdicts within {timeout:?}",
        read.len()
    );
    Ok((first.unwrap_or(last), last))
}

/// One event of a paced run: when it was meant to be sent, when its
/// verdict (or, for the broker's floor, the event itself) was read back.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    pub intended: Instant,
    pub read: Instant,
    pub urgent: bool,
}

/// What a paced run saw: per event its intended send time, when its
/// verdict was read, and whether it was urgent; the clock's start; the run's
/// summary (with the batch choices of a latency target).
pub(super) struct PacedRun {
    pub start: Instant,
    pub samples: Vec<Sample>,
    pub summary: modstream::pipeline::RunSummary,
}

/// Open-loop paced load in `phases` of (seconds, events per second), one
/// after the other; latency from each event's intended send time to its
/// verdict being read.
pub(super) async fn paced_run(
    opts: &BenchOptions,
    b: Batching,
    phases: &[(f64, f64)],
) -> anyhow::Result<PacedRun> {
    paced(opts, Some(b), phases).await
}

/// The broker's own floor under the same paced load, producer and reader,
/// without modstream: the reader reads the input topic itself, so each
/// sample is a produce → consume round trip.
pub(super) async fn broker_round_trip(opts: &BenchOptions, rate: f64) -> anyhow::Result<FloorRow> {
    let run = paced(opts, None, &[(opts.latency_seconds as f64, rate)]).await?;
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for &Sample { intended, read, .. } in &run.samples {
        h.record(read.saturating_duration_since(intended).as_micros().max(1) as u64)?;
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(FloorRow {
        offered_per_s: rate,
        events: run.samples.len(),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: h.max() as f64 / 1000.0,
    })
}

/// When each event's record came back, by event id; the warm-up event is
/// signalled on `warm` instead.
fn spawn_arrival_reader(
    bootstrap: String,
    topic: String,
    partitions: i32,
    want: usize,
    warm: std::sync::mpsc::Sender<()>,
) -> tokio::task::JoinHandle<anyhow::Result<HashMap<String, Instant>>> {
    tokio::task::spawn_blocking(move || {
        let mut read_at: HashMap<String, Instant> = HashMap::new();
        let r = read_verdicts(
            &bootstrap,
            &topic,
            partitions,
            want,
            Duration::from_secs(300),
            |v, _| {
                let id = v["event_id"].as_str().unwrap_or_default();
                if id.starts_with("warmup-") {
                    let _ = warm.send(());
                } else {
                    read_at.insert(id.to_string(), Instant::now());
                }
            },
        );
        r.map(|_| read_at)
    })
}

/// [`paced_run`] with the pipeline (`Some`) or without it (`None`: the
/// input records themselves are read back).
async fn paced(
    opts: &BenchOptions,
    pipeline: Option<Batching>,
    phases: &[(f64, f64)],
) -> anyhow::Result<PacedRun> {
    let cell = Cell::new(opts).await?;
    let bootstrap = cell.bootstrap.clone();
    let counts: Vec<usize> = phases
        .iter()
        .map(|(seconds, rate)| ((rate * seconds) as usize).max(10))
        .collect();
    let count: usize = counts.iter().sum();
    let events = opts.variant.events(count, "l-");
    let shutdown = Shutdown::new();
    let run = match pipeline {
        Some(b) => Some(tokio::spawn(modstream::pipeline::run(
            pipeline_settings(opts, &cell, b)?,
            shutdown.clone(),
        ))),
        None => None,
    };
    let (read_topic, read_partitions) = match pipeline {
        Some(_) => (cell.verdicts.clone(), cell.verdict_partitions),
        None => (cell.input.clone(), cell.partitions),
    };
    // One reader for the whole run, started first: a new consumer needs about
    // half a second before its first record, which is not modstream's latency.
    // The clock starts once a warm-up event came back as a verdict, so the
    // group join is not counted either.
    let (warm_tx, warm_rx) = std::sync::mpsc::channel::<()>();
    let reader = spawn_arrival_reader(
        bootstrap.clone(),
        read_topic,
        read_partitions,
        count + 1,
        warm_tx,
    );
    // The warm-up goes through the load's own producer, so that its
    // connection and metadata are not in the first events' latency either.
    let producer = send::event_producer(&bootstrap)?;
    let warmup = opts.variant.events(1, "warmup-");
    send::produce_with(&producer, &cell.input, &warmup).await?;
    tokio::task::spawn_blocking(move || warm_rx.recv_timeout(Duration::from_secs(60)))
        .await?
        .map_err(|_| anyhow::anyhow!("the warm-up verdict did not come back"))?;
    let start = Instant::now();
    let mut intended: HashMap<&str, Instant> = HashMap::new();
    let mut pending = Vec::new();
    let (mut phase_start, mut first) = (start, 0);
    for (&(seconds, rate), &n) in phases.iter().zip(&counts) {
        let slice = &events[first..first + n];
        let schedule = Schedule {
            start: phase_start,
            rate,
            stamp_from_ms: None,
        };
        for (i, e) in slice.iter().enumerate() {
            intended.insert(e.event_id.as_str(), schedule.due(i));
        }
        pending.extend(send::send_paced(&producer, &cell.input, slice, schedule, |_| {}).await?);
        phase_start += Duration::from_secs_f64(seconds);
        first += n;
    }
    send::await_deliveries(pending).await?;
    let read_at = reader.await??;
    shutdown.stop.cancel();
    let summary = match run {
        Some(run) => run.await??,
        None => modstream::pipeline::RunSummary::default(),
    };
    Ok(PacedRun {
        start,
        samples: samples_of(&events, &intended, &read_at),
        summary,
    })
}

/// The events that were sent and read back, with both times.
fn samples_of(
    events: &[GeneratedEvent],
    intended: &HashMap<&str, Instant>,
    read_at: &HashMap<String, Instant>,
) -> Vec<Sample> {
    events
        .iter()
        .filter_map(|e| {
            Some(Sample {
                intended: *intended.get(e.event_id.as_str())?,
                read: *read_at.get(&e.event_id)?,
                urgent: e.urgent,
            })
        })
        .collect()
}

/// Open-loop paced load at `rate`/s for `opts.latency_seconds`; its latency
/// percentiles, all events and the urgent ones.
pub(super) async fn latency(
    opts: &BenchOptions,
    b: Batching,
    fraction: f64,
    rate: f64,
) -> anyhow::Result<LatencyRow> {
    let run = paced_run(opts, b, &[(opts.latency_seconds as f64, rate)]).await?;
    let finished = run
        .samples
        .iter()
        .map(|s| s.read)
        .max()
        .unwrap_or(run.start);
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut hu = h.clone();
    for &Sample {
        intended,
        read,
        urgent,
    } in &run.samples
    {
        let micros = read.saturating_duration_since(intended).as_micros().max(1) as u64;
        h.record(micros)?;
        if urgent {
            hu.record(micros)?;
        }
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(LatencyRow {
        max_batch_size: b.size,
        max_batch_delay_ms: b.delay_ms,
        target_p99_ms: b.target_p99_ms,
        offered_fraction: fraction,
        offered_per_s: rate,
        achieved_per_s: run.samples.len() as f64 / finished.duration_since(run.start).as_secs_f64(),
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: h.max() as f64 / 1000.0,
        urgent_events: hu.len() as usize,
        urgent_p50_ms: hu.value_at_quantile(0.5) as f64 / 1000.0,
        urgent_p99_ms: hu.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

/// What a process's peak RSS may exceed its light-load peak by beyond its
/// byte budget (`limits.max_in_flight_bytes`): allocator slack, librdkafka's
/// buffers beside the fetch queues the budget bounds, and the producer's
/// queue. The same constant as `tests/memory.rs`'s flood bound.
pub const RSS_HEADROOM_BYTES: u64 = 64 << 20;

/// Largest overload backlog: 4 partitions × 5 MB of mock-cluster retention
/// at ~250 bytes per event would be 80,000.
const MAX_OVERLOAD_EVENTS: usize = 60_000;

/// Offer `rate`/s for `seconds` (at most [`MAX_OVERLOAD_EVENTS`]; open loop) to a separate `modstream run`
/// process, let it work on the backlog 5 s more, and read its peak RSS.
pub(super) async fn peak_rss_under_load(
    opts: &BenchOptions,
    b: Batching,
    rate: f64,
    seconds: u64,
) -> anyhow::Result<(usize, u64)> {
    let exe = service_binary().ok_or_else(|| {
        anyhow::anyhow!(
            "the overload run needs the modstream binary beside modstream-bench (cargo build --release)"
        )
    })?;
    let cell = Cell::new(opts).await?;
    let bootstrap = cell.bootstrap.clone();
    let dir = std::env::temp_dir().join(format!("modstream-overload-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("modstream.toml");
    let toml = service_toml(opts, &cell, b)?;
    std::fs::write(&config, toml)?;
    let mut child = std::process::Command::new(&exe)
        .args(["run", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let pid = child.id().to_string();
    // librdkafka's mock cluster keeps 5 MB per partition and drops older
    // records (the consumer then warns "Offset out of range" and skips
    // ahead): cap the offered backlog below that.
    let count = ((rate * seconds as f64) as usize).min(MAX_OVERLOAD_EVENTS);
    let events = generate(count, 0, "o-");
    let producer = send::event_producer(&bootstrap)?;
    let schedule = Schedule {
        start: Instant::now(),
        rate,
        stamp_from_ms: None,
    };
    let mut peak = 0;
    let pending = send::send_paced(&producer, &cell.input, &events, schedule, |_| {
        peak = peak.max(peak_rss_of(&pid));
    })
    .await?;
    send::await_deliveries(pending).await?;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(peak_rss_of(&pid));
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let exit = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        child.wait().ok()
    })
    .await?;
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(
        peak > 0,
        "could not read the peak RSS of pid {pid} (exit {exit:?})"
    );
    Ok((count, peak))
}
