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
    pub providers: Vec<String>,
    /// Fail unless a GPU provider can be used.
    #[arg(long)]
    pub require_gpu: bool,
    /// Inference workers (sessions) in the pipeline; the raw loop uses one.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Offer this multiple of saturation to a separate `modstream run` for
    /// 3 s and report its peak RSS (0: skip).
    #[arg(long, default_value_t = 10.0)]
    pub overload: f64,
    /// Where bench.json and bench.svg go.
    #[arg(long = "out", default_value = "target/bench")]
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
}

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

/// Power-of-two buckets of run sizes: "1", "2-3", "4-7", ...
fn run_size_histogram(sizes: &[u64]) -> std::collections::BTreeMap<String, u64> {
    let mut h = std::collections::BTreeMap::new();
    for (size, &n) in sizes.iter().enumerate().filter(|(s, n)| *s > 0 && **n > 0) {
        let low = 1usize << size.ilog2();
        let key = if low == 1 {
            "1".to_string()
        } else {
            format!("{low:>4}-{}", low * 2 - 1)
        };
        *h.entry(key).or_insert(0) += n;
    }
    h
}

fn settings(
    opts: &BenchOptions,
    cell: &Cell,
    batch: usize,
    delay_ms: u64,
) -> anyhow::Result<crate::config::Settings> {
    let mut s = crate::config::Settings::from_toml(&cell.config(batch, delay_ms))?;
    s.inference = inference_settings(opts);
    s.limits.max_in_flight = s.limits.max_in_flight.max(batch * 4);
    Ok(s)
}

/// Where one run happens: a fresh embedded cluster, or (`--bootstrap`) fresh
/// topics and a fresh group on the given cluster, so that runs never see
/// each other's records.
struct Cell {
    _embedded: Option<EmbeddedBroker>,
    bootstrap: String,
    input: String,
    verdicts: String,
    dlq: String,
    group: String,
}

impl Cell {
    async fn new(opts: &BenchOptions) -> anyhow::Result<Cell> {
        let Some(bootstrap) = &opts.bootstrap else {
            let broker = EmbeddedBroker::start(&[
                (DEMO_INPUT, PARTITIONS),
                (DEMO_VERDICTS, PARTITIONS),
                (DEMO_DLQ, 1),
            ])?;
            return Ok(Cell {
                bootstrap: broker.bootstrap_servers().to_string(),
                _embedded: Some(broker),
                input: DEMO_INPUT.to_string(),
                verdicts: DEMO_VERDICTS.to_string(),
                dlq: DEMO_DLQ.to_string(),
                group: "bench".to_string(),
            });
        };
        static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let prefix = format!(
            "modstream-bench-{}-{}-{run}",
            std::process::id(),
            chrono::Utc::now().timestamp()
        );
        let cell = Cell {
            _embedded: None,
            bootstrap: bootstrap.clone(),
            input: format!("{prefix}-events"),
            verdicts: format!("{prefix}-verdicts"),
            dlq: format!("{prefix}-dlq"),
            group: prefix,
        };
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for (topic, partitions) in [
            (&cell.input, PARTITIONS),
            (&cell.verdicts, PARTITIONS),
            (&cell.dlq, 1),
        ] {
            // The cluster's default replication first; 1 where that is refused.
            let mut created = Err(String::new());
            for replication in [-1, 1] {
                let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
                created = match admin.create_topics([&new], &options).await {
                    Ok(mut r) => r
                        .pop()
                        .unwrap_or(Err((
                            topic.clone(),
                            rdkafka::types::RDKafkaErrorCode::Unknown,
                        )))
                        .map(|_| ())
                        .map_err(|(_, e)| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if created.is_ok() {
                    break;
                }
            }
            created.map_err(|e| anyhow::anyhow!("cannot create bench topic {topic}: {e}"))?;
        }
        Ok(cell)
    }

    fn config(&self, batch: usize, delay_ms: u64) -> String {
        demo::demo_config_for(
            &self.bootstrap,
            &self.group,
            [&self.input, &self.verdicts, &self.dlq],
            batch,
            delay_ms,
        )
    }
}

/// Pipeline at saturation: events pre-produced, then timed to the last verdict.
async fn saturation(
    opts: &BenchOptions,
    batch: usize,
    delay_ms: u64,
) -> anyhow::Result<(f64, crate::pipeline::RunSummary, f64)> {
    let cell = Cell::new(opts).await?;
    let events = demo::generate(opts.events, 0, "s-");
    demo::produce_all(&cell.bootstrap, &cell.input, &events)
        .await
        .map_err(anyhow::Error::msg)?;
    let shutdown = Shutdown::new();
    let health = std::sync::Arc::new(crate::telemetry::Health::default());
    let run = tokio::spawn(crate::pipeline::run_with_health(
        settings(opts, &cell, batch, delay_ms)?,
        shutdown.clone(),
        health.clone(),
    ));
    let want = events.len();
    let (b, t) = (cell.bootstrap.clone(), cell.verdicts.clone());
    let reader = tokio::task::spawn_blocking(move || {
        read_verdicts(&b, &t, want, Duration::from_secs(600), |_| {})
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
    let (_, done_at) = reader.await??;
    let elapsed = done_at.duration_since(started).as_secs_f64();
    shutdown.stop.cancel();
    let summary = run.await??;
    Ok((want as f64 / elapsed, summary, elapsed))
}

/// Read verdicts until `want` arrived; calls `seen(event_id)` at each one.
/// Returns when the first and the last one were read.
fn read_verdicts(
    bootstrap: &str,
    topic: &str,
    want: usize,
    timeout: Duration,
    mut seen: impl FnMut(&str),
) -> anyhow::Result<(Instant, Instant)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-reader")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.error.backoff.ms", "5")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut n = 0;
    let mut last = Instant::now();
    let mut first = None;
    while n < want && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(50)) {
            let m = m?;
            last = Instant::now();
            first.get_or_insert(last);
            n += 1;
            if let Ok(v) =
                serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default())
            {
                seen(v["event_id"].as_str().unwrap_or_default());
            }
        }
    }
    anyhow::ensure!(n == want, "only {n} of {want} verdicts within {timeout:?}");
    Ok((first.unwrap_or(last), last))
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
    let cell = Cell::new(opts).await?;
    let bootstrap = cell.bootstrap.clone();
    let count = ((rate * opts.latency_seconds as f64) as usize).max(10);
    let events = demo::generate(count, 0, "l-");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(crate::pipeline::run(
        settings(opts, &cell, batch, delay_ms)?,
        shutdown.clone(),
    ));
    // One reader for the whole run, started first: a new consumer needs about
    // half a second before its first record, which is not modstream's latency.
    // The clock starts once a warm-up event came back as a verdict, so the
    // group join is not counted either.
    let (warm_tx, warm_rx) = std::sync::mpsc::channel::<()>();
    let (b, t) = (bootstrap.clone(), cell.verdicts.clone());
    let reader = tokio::task::spawn_blocking(move || {
        let mut read_at: HashMap<String, Instant> = HashMap::new();
        let r = read_verdicts(&b, &t, count + 1, Duration::from_secs(300), |id| {
            if id.starts_with("warmup-") {
                let _ = warm_tx.send(());
            } else {
                read_at.insert(id.to_string(), Instant::now());
            }
        });
        r.map(|_| read_at)
    });
    let warmup = demo::generate(1, 0, "warmup-");
    demo::produce_all(&bootstrap, &cell.input, &warmup)
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
        pending.extend(demo::enqueue(&producer, &cell.input, chunk).map_err(anyhow::Error::msg)?);
    }
    demo::await_deliveries(pending)
        .await
        .map_err(anyhow::Error::msg)?;
    let read_at = reader.await??;
    let finished = read_at.values().max().copied().unwrap_or(start);
    shutdown.stop.cancel();
    run.await??;
    let urgent: std::collections::HashSet<&str> = events
        .iter()
        .filter(|e| e.urgent)
        .map(|e| e.event_id.as_str())
        .collect();
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut hu = h.clone();
    for (id, at) in &read_at {
        if let Some(t) = intended.get(id) {
            let micros = at.saturating_duration_since(*t).as_micros().max(1) as u64;
            h.record(micros)?;
            if urgent.contains(id.as_str()) {
                hu.record(micros)?;
            }
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
        urgent_events: hu.len() as usize,
        urgent_p50_ms: hu.value_at_quantile(0.5) as f64 / 1000.0,
        urgent_p99_ms: hu.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

/// Largest overload backlog: 4 partitions × 5 MB of mock-cluster retention
/// at ~250 bytes per event would be 80,000.
const MAX_OVERLOAD_EVENTS: usize = 60_000;

/// Offer `rate`/s for `seconds` (at most [`MAX_OVERLOAD_EVENTS`]; open loop) to a separate `modstream run`
/// process, let it work on the backlog 5 s more, and read its peak RSS.
async fn peak_rss_under_load(
    opts: &BenchOptions,
    batch: usize,
    delay_ms: u64,
    rate: f64,
    seconds: u64,
) -> anyhow::Result<(usize, u64)> {
    let exe = std::env::current_exe()?;
    anyhow::ensure!(
        exe.file_stem().is_some_and(|n| n == "modstream"),
        "the overload run needs the modstream binary (run `modstream bench`)"
    );
    let cell = Cell::new(opts).await?;
    let bootstrap = cell.bootstrap.clone();
    let dir = std::env::temp_dir().join(format!("modstream-overload-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("modstream.toml");
    let inference = inference_settings(opts);
    let model_dir = std::path::absolute(&inference.model_dir)?;
    let toml = [
        cell.config(batch, delay_ms),
        "[inference]".to_string(),
        format!("model_dir = {:?}", model_dir.display().to_string()),
        format!("intra_threads = {}", inference.intra_threads),
        format!("workers = {}", inference.workers),
        format!("execution_providers = {:?}", inference.execution_providers),
        format!("require_gpu = {}", inference.require_gpu),
        "[telemetry]".to_string(),
        "listen = \"127.0.0.1:0\"".to_string(),
        "log_level = \"warn\"".to_string(),
    ];
    std::fs::write(&config, toml.join("\n"))?;
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
    let events = demo::generate(count, 0, "o-");
    let producer = demo::event_producer(&bootstrap).map_err(anyhow::Error::msg)?;
    let start = Instant::now();
    let slice = ((rate / 100.0) as usize).max(1);
    let mut pending = Vec::with_capacity(events.len());
    let mut peak = 0;
    for (i, chunk) in events.chunks(slice).enumerate() {
        tokio::time::sleep_until(
            (start + Duration::from_secs_f64((i * slice) as f64 / rate)).into(),
        )
        .await;
        pending.extend(demo::enqueue(&producer, &cell.input, chunk).map_err(anyhow::Error::msg)?);
        peak = peak.max(peak_rss_of(&pid));
    }
    demo::await_deliveries(pending)
        .await
        .map_err(anyhow::Error::msg)?;
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

fn mean_ms(total_seconds: f64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        total_seconds * 1000.0 / count as f64
    }
}

/// Peak resident set size of this process (Linux), bytes.
pub fn peak_rss_bytes() -> u64 {
    peak_rss_of("self")
}

/// Peak resident set size of a process (`/proc/<pid>/status` VmHWM), bytes.
pub fn peak_rss_of(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_string)
        })
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn inference_settings(opts: &BenchOptions) -> InferenceSettings {
    let mut inference = InferenceSettings {
        intra_threads: opts.intra_threads,
        workers: opts.workers.max(1),
        require_gpu: opts.require_gpu,
        ..Default::default()
    };
    if !opts.providers.is_empty() {
        inference.execution_providers = opts.providers.clone();
    }
    if let Some(dir) = &opts.model_dir {
        inference.model_dir = dir.clone();
    }
    inference
}

pub async fn run(opts: BenchOptions) -> anyhow::Result<Report> {
    let inference = inference_settings(&opts);
    let mut model = Model::load(&inference)?;
    // Token models: the same model without length buckets (one pass per
    // batch, padded to its longest text), the naive dynamic batching.
    let mut unbucketed = match model.manifest.input_kind.as_str() {
        "tokens" => Some(Model::load(&InferenceSettings {
            pad_to: "longest".to_string(),
            pass_overhead_tokens: 1 << 30,
            ..inference.clone()
        })?),
        _ => None,
    };
    let texts: Vec<String> = demo::generate(opts.events, 0, "raw-")
        .into_iter()
        .filter_map(|e| e.text)
        .collect();
    let mut saturation_rows = Vec::new();
    eprintln!(
        "{:>6} {:>8} {:>11} {:>9} {:>6} {:>7} {:>8} {:>8} {:>8} {:>6} {:>10}",
        "batch",
        "delay",
        "pipeline/s",
        "raw/s",
        "ratio",
        "mean n",
        "wait ms",
        "model ms",
        "prod ms",
        "pad eff",
        "unbucketed"
    );
    for &batch in &opts.batch_sizes {
        let (raw, _) = raw_model_throughput(&mut model, &texts, batch)?;
        let naive = match unbucketed.as_mut() {
            Some(m) => Some(raw_model_throughput(m, &texts, batch)?),
            None => None,
        };
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
                run_sizes: run_size_histogram(&summary.run_sizes),
                batch_wait_ms: mean_ms(summary.batch_wait_seconds, summary.closed_batches),
                inference_ms: mean_ms(summary.inference_seconds, summary.batches),
                produce_ms: mean_ms(summary.produce_seconds, summary.verdicts + summary.dlq),
                padding_efficiency: (summary.padded_tokens > 0)
                    .then(|| summary.real_tokens as f64 / summary.padded_tokens as f64),
                mean_tokens: (summary.real_tokens > 0)
                    .then(|| summary.real_tokens as f64 / summary.verdicts.max(1) as f64),
                raw_unbucketed_per_s: naive.map(|n| n.0),
                raw_unbucketed_padding_efficiency: naive.and_then(|n| n.1),
            };
            let opt = |v: Option<f64>, digits: usize| {
                v.map_or("-".to_string(), |v| format!("{v:.digits$}"))
            };
            eprintln!(
                "{:>6} {:>6}ms {:>11.0} {:>9.0} {:>6.2} {:>7.1} {:>8.1} {:>8.1} {:>8.1} {:>6} {:>10}",
                batch,
                delay,
                row.pipeline_per_s,
                row.raw_model_per_s,
                row.pipeline_over_raw,
                row.mean_batch_size,
                row.batch_wait_ms,
                row.inference_ms,
                row.produce_ms,
                opt(row.padding_efficiency, 2),
                opt(row.raw_unbucketed_per_s, 0)
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
                "{:>6} {:>6}ms {:>6.0}% {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1}   urgent {:.1} / {:.1}",
                batch,
                delay,
                fraction * 100.0,
                row.offered_per_s,
                row.p50_ms,
                row.p99_ms,
                row.p999_ms,
                row.max_ms,
                row.urgent_p50_ms,
                row.urgent_p99_ms
            );
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
            let (_, light) =
                peak_rss_under_load(&opts, batch, delay, sat.pipeline_per_s * 0.25, seconds)
                    .await?;
            let rate = sat.pipeline_per_s * opts.overload;
            let (events, peak) = peak_rss_under_load(&opts, batch, delay, rate, seconds).await?;
            eprintln!(
                "overload: {events} events offered at {:.0}× saturation ({rate:.0}/s for {:.1}s): peak RSS {} MiB (at 25 %: {} MiB)",
                opts.overload,
                events as f64 / rate,
                peak >> 20,
                light >> 20
            );
            Some(OverloadRow {
                offered_multiple: opts.overload,
                offered_per_s: rate,
                seconds: events as f64 / rate,
                events,
                peak_rss_bytes: peak,
                light_load_peak_rss_bytes: light,
            })
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
        workers: inference.workers,
        broker: opts
            .bootstrap
            .clone()
            .unwrap_or_else(|| "embedded".to_string()),
        overload,
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
