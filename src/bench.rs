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

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::config::InferenceSettings;
use crate::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use crate::embedded::EmbeddedBroker;
use crate::inference::Model;
use crate::shutdown::Shutdown;

const PARTITIONS: i32 = 4;

pub struct BenchOptions {
    pub events: usize,
    pub batch_sizes: Vec<usize>,
    pub delays_ms: Vec<u64>,
    /// Offered load as fractions of saturation, for the latency curve.
    pub loads: Vec<f64>,
    pub latency_seconds: u64,
    pub intra_threads: usize,
    pub out_dir: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SaturationRow {
    pub max_batch_size: usize,
    pub max_batch_delay_ms: u64,
    pub events: usize,
    pub pipeline_per_s: f64,
    pub raw_model_per_s: f64,
    pub pipeline_over_raw: f64,
    pub mean_batch_size: f64,
    pub inference_share: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct LatencyRow {
    pub max_batch_size: usize,
    pub max_batch_delay_ms: u64,
    pub offered_fraction: f64,
    pub offered_per_s: f64,
    pub achieved_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub machine: String,
    pub model: String,
    pub intra_threads: usize,
    pub saturation: Vec<SaturationRow>,
    pub latency: Vec<LatencyRow>,
    pub peak_rss_bytes: u64,
}

/// Raw model throughput: events/s scoring `texts` in batches of `batch`.
pub fn raw_model_throughput(
    model: &mut Model,
    texts: &[String],
    batch: usize,
) -> anyhow::Result<f64> {
    let mut batches: Vec<Vec<String>> = texts.chunks(batch).map(<[String]>::to_vec).collect();
    model.score(&mut batches[0])?; // warm-up
    let started = Instant::now();
    for b in &mut batches {
        model.score(b)?;
    }
    Ok(texts.len() as f64 / started.elapsed().as_secs_f64())
}

fn settings(
    bootstrap: &str,
    batch: usize,
    delay_ms: u64,
    threads: usize,
) -> anyhow::Result<crate::config::Settings> {
    let mut s = demo::demo_settings(bootstrap, "bench")?;
    s.batching.max_batch_size = batch;
    s.batching.max_batch_delay = Duration::from_millis(delay_ms);
    s.inference.intra_threads = threads;
    s.limits.max_in_flight = s.limits.max_in_flight.max(batch * 4);
    Ok(s)
}

fn broker() -> anyhow::Result<EmbeddedBroker> {
    Ok(EmbeddedBroker::start(&[
        (DEMO_INPUT, PARTITIONS),
        (DEMO_VERDICTS, PARTITIONS),
        (DEMO_DLQ, 1),
    ])?)
}

/// Pipeline at saturation: events pre-produced, then timed to the last verdict.
async fn saturation(
    opts: &BenchOptions,
    batch: usize,
    delay_ms: u64,
) -> anyhow::Result<(f64, crate::pipeline::RunSummary, f64)> {
    let broker = broker()?;
    let bootstrap = broker.bootstrap_servers().to_string();
    let events = demo::generate(opts.events, 0, "s-");
    demo::produce_all(&bootstrap, DEMO_INPUT, &events)
        .await
        .map_err(anyhow::Error::msg)?;
    let shutdown = Shutdown::new();
    let started = Instant::now();
    let run = tokio::spawn(crate::pipeline::run(
        settings(&bootstrap, batch, delay_ms, opts.intra_threads)?,
        shutdown.clone(),
    ));
    let want = events.len();
    let b = bootstrap.clone();
    let (done_at, _) = tokio::task::spawn_blocking(move || {
        read_verdicts(&b, want, Duration::from_secs(600), |_| {})
    })
    .await??;
    let elapsed = done_at.duration_since(started).as_secs_f64();
    shutdown.stop.cancel();
    let summary = run.await??;
    Ok((want as f64 / elapsed, summary, elapsed))
}

/// Read verdicts until `want` arrived; calls `seen(event_id)` at each one.
/// Returns when the last one was read.
fn read_verdicts(
    bootstrap: &str,
    want: usize,
    timeout: Duration,
    mut seen: impl FnMut(&str),
) -> anyhow::Result<(Instant, usize)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-reader")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.error.backoff.ms", "5")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(DEMO_VERDICTS, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut n = 0;
    let mut last = Instant::now();
    while n < want && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(50)) {
            let m = m?;
            last = Instant::now();
            n += 1;
            if let Ok(v) =
                serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default())
            {
                seen(v["event_id"].as_str().unwrap_or_default());
            }
        }
    }
    anyhow::ensure!(n == want, "only {n} of {want} verdicts within {timeout:?}");
    Ok((last, n))
}

/// Open-loop paced load at `rate`/s for `seconds`; latency from each event's
/// intended send time to its verdict being read.
async fn latency(
    opts: &BenchOptions,
    batch: usize,
    delay_ms: u64,
    fraction: f64,
    rate: f64,
) -> anyhow::Result<LatencyRow> {
    let broker = broker()?;
    let bootstrap = broker.bootstrap_servers().to_string();
    let count = ((rate * opts.latency_seconds as f64) as usize).max(10);
    let events = demo::generate(count, 0, "l-");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(crate::pipeline::run(
        settings(&bootstrap, batch, delay_ms, opts.intra_threads)?,
        shutdown.clone(),
    ));
    // One reader for the whole run, started first: a new consumer needs about
    // half a second before its first record, which is not modstream's latency.
    // The clock starts once a warm-up event came back as a verdict, so the
    // group join is not counted either.
    let (warm_tx, warm_rx) = std::sync::mpsc::channel::<()>();
    let b = bootstrap.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let mut read_at: HashMap<String, Instant> = HashMap::new();
        let r = read_verdicts(&b, count + 1, Duration::from_secs(300), |id| {
            if id.starts_with("warmup-") {
                let _ = warm_tx.send(());
            } else {
                read_at.insert(id.to_string(), Instant::now());
            }
        });
        r.map(|_| read_at)
    });
    let warmup = demo::generate(1, 0, "warmup-");
    demo::produce_all(&bootstrap, DEMO_INPUT, &warmup)
        .await
        .map_err(anyhow::Error::msg)?;
    tokio::task::spawn_blocking(move || warm_rx.recv_timeout(Duration::from_secs(60)))
        .await?
        .map_err(|_| anyhow::anyhow!("the warm-up verdict did not come back"))?;
    let start = Instant::now();
    let intended: HashMap<String, Instant> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            (
                e.event_id.clone(),
                start + Duration::from_secs_f64(i as f64 / rate),
            )
        })
        .collect();
    let producer = demo::event_producer(&bootstrap).map_err(anyhow::Error::msg)?;
    // Open loop: send on schedule, collect acknowledgements at the end.
    let slice = ((rate / 100.0) as usize).max(1);
    let mut pending = Vec::with_capacity(events.len());
    for (i, chunk) in events.chunks(slice).enumerate() {
        tokio::time::sleep_until(
            (start + Duration::from_secs_f64((i * slice) as f64 / rate)).into(),
        )
        .await;
        pending.extend(demo::enqueue(&producer, DEMO_INPUT, chunk).map_err(anyhow::Error::msg)?);
    }
    demo::await_deliveries(pending)
        .await
        .map_err(anyhow::Error::msg)?;
    let read_at = reader.await??;
    let finished = read_at.values().max().copied().unwrap_or(start);
    shutdown.stop.cancel();
    run.await??;
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for (id, at) in &read_at {
        if let Some(t) = intended.get(id) {
            h.record(at.saturating_duration_since(*t).as_micros().max(1) as u64)?;
        }
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(LatencyRow {
        max_batch_size: batch,
        max_batch_delay_ms: delay_ms,
        offered_fraction: fraction,
        offered_per_s: rate,
        achieved_per_s: count as f64 / finished.duration_since(start).as_secs_f64(),
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: h.max() as f64 / 1000.0,
    })
}

/// Peak resident set size of this process (Linux), bytes.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_string)
        })
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub async fn run(opts: BenchOptions) -> anyhow::Result<Report> {
    let inference = InferenceSettings {
        intra_threads: opts.intra_threads,
        ..Default::default()
    };
    let mut model = Model::load(&inference)?;
    let texts: Vec<String> = demo::generate(opts.events, 0, "raw-")
        .into_iter()
        .filter_map(|e| e.text)
        .collect();
    let mut saturation_rows = Vec::new();
    eprintln!(
        "{:>6} {:>8} {:>12} {:>12} {:>7} {:>10}",
        "batch", "delay", "pipeline/s", "raw/s", "ratio", "mean batch"
    );
    for &batch in &opts.batch_sizes {
        let raw = raw_model_throughput(&mut model, &texts, batch)?;
        for &delay in &opts.delays_ms {
            let (per_s, summary, elapsed) = saturation(&opts, batch, delay).await?;
            let mean_batch = if summary.batches > 0 {
                summary.verdicts as f64 / summary.batches as f64
            } else {
                0.0
            };
            let row = SaturationRow {
                max_batch_size: batch,
                max_batch_delay_ms: delay,
                events: opts.events,
                pipeline_per_s: per_s,
                raw_model_per_s: raw,
                pipeline_over_raw: per_s / raw,
                mean_batch_size: mean_batch,
                inference_share: summary.inference_seconds / elapsed,
            };
            eprintln!(
                "{:>6} {:>6}ms {:>12.0} {:>12.0} {:>7.2} {:>10.1}",
                batch,
                delay,
                row.pipeline_per_s,
                row.raw_model_per_s,
                row.pipeline_over_raw,
                row.mean_batch_size
            );
            saturation_rows.push(row);
        }
    }
    let mut latency_rows = Vec::new();
    eprintln!(
        "{:>6} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "batch", "delay", "load", "offered/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    for &batch in &opts.batch_sizes {
        let delay = opts.delays_ms[0];
        let Some(sat) = saturation_rows
            .iter()
            .find(|r| r.max_batch_size == batch && r.max_batch_delay_ms == delay)
        else {
            continue;
        };
        for &fraction in &opts.loads {
            let row = latency(&opts, batch, delay, fraction, sat.pipeline_per_s * fraction).await?;
            eprintln!(
                "{:>6} {:>6}ms {:>6.0}% {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                batch,
                delay,
                fraction * 100.0,
                row.offered_per_s,
                row.p50_ms,
                row.p99_ms,
                row.p999_ms,
                row.max_ms
            );
            latency_rows.push(row);
        }
    }
    let report = Report {
        machine: format!(
            "{} cores",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ),
        model: format!("{} {}", model.manifest.name, model.manifest.version),
        intra_threads: opts.intra_threads,
        saturation: saturation_rows,
        latency: latency_rows,
        peak_rss_bytes: peak_rss_bytes(),
    };
    std::fs::create_dir_all(&opts.out_dir)?;
    std::fs::write(
        opts.out_dir.join("bench.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(opts.out_dir.join("bench.svg"), chart(&report))?;
    eprintln!(
        "report: {}  chart: {}",
        opts.out_dir.join("bench.json").display(),
        opts.out_dir.join("bench.svg").display()
    );
    Ok(report)
}

/// Redraw the chart of a saved report (`bench.json` → `bench.svg` beside it).
pub fn replot(report_path: &std::path::Path) -> anyhow::Result<PathBuf> {
    let report: Report = serde_json::from_str(&std::fs::read_to_string(report_path)?)?;
    let svg = report_path.with_extension("svg");
    std::fs::write(&svg, chart(&report))?;
    Ok(svg)
}

/// Throughput and p99 latency against batch size (first delay, highest load
/// below saturation), as a small SVG.
pub fn chart(report: &Report) -> String {
    let delay = report
        .saturation
        .first()
        .map_or(0, |r| r.max_batch_delay_ms);
    let tput: Vec<(f64, f64)> = report
        .saturation
        .iter()
        .filter(|r| r.max_batch_delay_ms == delay)
        .map(|r| (r.max_batch_size as f64, r.pipeline_per_s))
        .collect();
    // The highest load below saturation (at 100 % queues dominate).
    let loads: Vec<f64> = report.latency.iter().map(|r| r.offered_fraction).collect();
    let below: Vec<f64> = loads.iter().copied().filter(|f| *f < 1.0).collect();
    let top_load = if below.is_empty() { &loads } else { &below }
        .iter()
        .copied()
        .fold(0.0, f64::max);
    let p99: Vec<(f64, f64)> = report
        .latency
        .iter()
        .filter(|r| r.offered_fraction == top_load)
        .map(|r| (r.max_batch_size as f64, r.p99_ms))
        .collect();
    let (w, h, m) = (640.0, 400.0, 70.0);
    let xmax = tput.iter().map(|p| p.0.log2()).fold(1.0, f64::max);
    let x = |b: f64| m + (b.log2() / xmax) * (w - 2.0 * m);
    let line = |points: &[(f64, f64)], color: &str| {
        let ymax = points.iter().map(|p| p.1).fold(1e-9, f64::max);
        let pts: Vec<String> = points
            .iter()
            .map(|(b, v)| format!("{:.1},{:.1}", x(*b), h - m - v / ymax * (h - 2.0 * m)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        )
    };
    let ticks: String = tput
        .iter()
        .map(|(b, _)| {
            format!(
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{b}</text>",
                x(*b),
                h - m + 16.0
            )
        })
        .collect();
    let tmax = tput.iter().map(|p| p.1).fold(0.0, f64::max);
    let lmax = p99.iter().map(|p| p.1).fold(0.0, f64::max);
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<text x=\"{m}\" y=\"20\" font-size=\"14\">modstream vs max_batch_size (log scale)</text>\
<text x=\"{m}\" y=\"38\" font-size=\"12\" fill=\"steelblue\">throughput at saturation, verdicts/s (top = {tmax:.0})</text>\
<text x=\"{m}\" y=\"54\" font-size=\"12\" fill=\"firebrick\">p99 latency at {:.0}% of saturation, ms (top = {lmax:.1})</text>\
<line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>{ticks}{}{}</svg>\n",
        top_load * 100.0,
        h - m,
        w - m,
        h - m,
        line(&tput, "steelblue"),
        line(&p99, "firebrick")
    )
}
