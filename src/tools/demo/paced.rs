//! The paced demo: the pipeline on an embedded cluster, fed `rate` events/s
//! open loop, printing progress each second, /metrics and /readyz served
//! while it runs; latency is counted from the first paced event, after a
//! warm-up event proved the pipeline joined and scored. Ctrl-C (or the end
//! of `--seconds`) stops the sending after the second under way; the
//! pipeline then finishes the events sent, the summary is printed and the
//! demo exits 0 (a second Ctrl-C exits at once).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::producer::FutureProducer;

use super::{DEMO_INPUT, DEMO_VERDICTS, PARTITIONS, PacedOptions, demo_settings, start_broker};
use crate::shutdown::Shutdown;
use crate::tools::generator::generate;
use crate::tools::read::TopicReader;
use crate::tools::send;

type Latencies = (BTreeMap<String, u64>, hdrhistogram::Histogram<u64>);

pub async fn run_paced(opts: PacedOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        opts.rate > 0.0 && opts.rate <= 1_000_000.0,
        "--rate must be above 0 and at most 1000000 events/s"
    );
    let broker = start_broker()?;
    let bootstrap = broker.bootstrap_servers().to_string();
    let metrics = crate::telemetry::install_recorder()?;
    let mut settings = demo_settings(&bootstrap, "modstream-demo")?;
    if let Some(dir) = &opts.model_dir {
        settings.inference.model_dir = dir.clone();
    }
    crate::pipeline::register_zeroes(&settings);
    let health = Arc::new(crate::telemetry::Health::default());
    let stop_listener = tokio_util::sync::CancellationToken::new();
    let listener =
        crate::telemetry::serve(opts.listen, metrics, health.clone(), stop_listener.clone())
            .await?;
    // Ctrl-C stops the sending, not the pipeline: it finishes what was sent.
    let interrupted = crate::shutdown::on_signal();
    let shutdown = Shutdown::new();
    let mut pipeline = tokio::spawn(crate::pipeline::run_with_health(
        settings,
        shutdown.clone(),
        health,
    ));
    println!("embedded Kafka at {bootstrap}");
    println!("  watch the verdicts: kcat -b {bootstrap} -C -t {DEMO_VERDICTS}");
    println!(
        "  metrics: http://{}/metrics   health: http://{}/readyz",
        opts.listen, opts.listen
    );
    let counts = Counts::default();
    let reader = spawn_reader(bootstrap.clone(), counts.clone());
    let producer = send::event_producer(&bootstrap)?;
    send::produce_with(&producer, DEMO_INPUT, &generate(1, 0, "warmup-")).await?;
    wait_for_warm_up(&counts, &mut pipeline).await?;
    println!(
        "pipeline joined; sending {:.0} events/s {}",
        opts.rate,
        opts.seconds
            .map_or("until Ctrl-C".to_string(), |s| format!("for {s} s"))
    );
    let sent = send_rounds(&producer, &opts, &interrupted, &counts).await?;
    if interrupted.is_cancelled() {
        println!(
            "Ctrl-C: sending stopped; waiting for the verdicts of the events sent (Ctrl-C again to exit at once)"
        );
    }
    counts.expected.store(sent.valid, Ordering::SeqCst);
    counts.stop.store(true, Ordering::SeqCst);
    let (by_kind, latency) = reader.await??;
    shutdown.stop.cancel();
    let summary = pipeline.await??;
    stop_listener.cancel();
    let _ = listener.await;
    drop(producer);
    drop(broker);
    print_summary(&sent, &by_kind, &latency, summary.dlq)
}

/// The summary; an error if a verdict is missing.
fn print_summary(
    sent: &Sent,
    by_kind: &BTreeMap<String, u64>,
    latency: &hdrhistogram::Histogram<u64>,
    dlq: u64,
) -> anyhow::Result<()> {
    let verdicts: u64 = by_kind.values().sum();
    println!("\n== modstream demo (paced) ==");
    println!(
        "sent             {} events in {:.1}s ({} valid)",
        sent.events,
        sent.took.as_secs_f64(),
        sent.valid
    );
    println!("verdicts         {verdicts}  {by_kind:?}");
    println!("dead-lettered    {dlq}");
    println!(
        "latency          p50 {} ms, p99 {} ms, max {} ms (record timestamp to verdict, after the pipeline joined)",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
        latency.max()
    );
    anyhow::ensure!(
        verdicts >= sent.valid,
        "only {verdicts} of {} verdicts arrived",
        sent.valid
    );
    Ok(())
}

/// Shared between the sender and the reader.
#[derive(Clone)]
struct Counts {
    /// Told to stop: the reader ends once every expected verdict arrived
    /// (or 30 s after the stop).
    stop: Arc<AtomicBool>,
    expected: Arc<AtomicU64>,
    read: Arc<AtomicU64>,
    /// The warm-up event's verdict arrived.
    warm: Arc<AtomicBool>,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            stop: Arc::default(),
            expected: Arc::new(AtomicU64::new(u64::MAX)),
            read: Arc::default(),
            warm: Arc::default(),
        }
    }
}

/// The reader counts verdicts by kind and keeps their latency.
fn spawn_reader(
    bootstrap: String,
    counts: Counts,
) -> tokio::task::JoinHandle<anyhow::Result<Latencies>> {
    tokio::task::spawn_blocking(move || -> anyhow::Result<Latencies> {
        let reader = TopicReader::from_beginning(&bootstrap, DEMO_VERDICTS, Some(PARTITIONS))?;
        let mut by_kind = BTreeMap::new();
        let mut latency = hdrhistogram::Histogram::<u64>::new(3)?;
        let mut stopped_at: Option<Instant> = None;
        loop {
            if counts.stop.load(Ordering::SeqCst) {
                let at = *stopped_at.get_or_insert_with(Instant::now);
                if counts.read.load(Ordering::SeqCst) >= counts.expected.load(Ordering::SeqCst)
                    || at.elapsed() > Duration::from_secs(30)
                {
                    break;
                }
            }
            let Some(v) = reader.poll(Duration::from_millis(100))? else {
                continue;
            };
            let Ok(json) = serde_json::from_slice::<serde_json::Value>(&v.payload) else {
                continue;
            };
            if json["event_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("warmup-"))
            {
                counts.warm.store(true, Ordering::SeqCst);
                continue;
            }
            counts.read.fetch_add(1, Ordering::SeqCst);
            *by_kind
                .entry(json["verdict"].as_str().unwrap_or("?").to_string())
                .or_insert(0) += 1;
            if let Some(ms) = json["latency_ms"].as_u64() {
                latency.record(ms.max(1))?;
            }
        }
        Ok((by_kind, latency))
    })
}

/// Until the warm-up event's verdict came back (at most 60 s); a pipeline
/// that stops before says why.
async fn wait_for_warm_up<T>(
    counts: &Counts,
    pipeline: &mut tokio::task::JoinHandle<Result<T, crate::pipeline::PipelineError>>,
) -> anyhow::Result<()> {
    let joined_by = Instant::now() + Duration::from_secs(60);
    while !counts.warm.load(Ordering::SeqCst) {
        if pipeline.is_finished() {
            return Err(super::pipeline_ended(pipeline.await));
        }
        anyhow::ensure!(
            Instant::now() < joined_by,
            "the pipeline did not score a warm-up event within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// What was sent.
struct Sent {
    events: u64,
    valid: u64,
    took: Duration,
}

/// One round a second, paced, until `opts.seconds` or Ctrl-C (a round
/// under way is sent whole, so that what was sent is known); each second's
/// deliveries are awaited by their own task (bounded: one per second of
/// the run), all of them before this returns.
async fn send_rounds(
    producer: &FutureProducer,
    opts: &PacedOptions,
    interrupted: &tokio_util::sync::CancellationToken,
    counts: &Counts,
) -> anyhow::Result<Sent> {
    let start = Instant::now();
    let per_round = (opts.rate.ceil() as usize).max(1);
    let (mut sent, mut valid) = (0u64, 0u64);
    let mut deliveries = tokio::task::JoinSet::new();
    for round in 0u64.. {
        if interrupted.is_cancelled() || opts.seconds.is_some_and(|s| round >= s) {
            break;
        }
        let events = generate(per_round, 100, &format!("demo-{round}-"));
        valid += events.iter().filter(|e| e.text.is_some()).count() as u64;
        sent += events.len() as u64;
        let schedule = send::Schedule {
            start: start + Duration::from_secs(round),
            rate: opts.rate,
            stamp_from_ms: None,
        };
        let sending = send::send_paced(producer, DEMO_INPUT, &events, schedule, |_| {});
        deliveries.spawn(send::await_deliveries(sending.await?));
        let read = counts.read.load(Ordering::SeqCst);
        println!(
            "{:>5.0}s  sent {sent:>8}  verdicts {read:>8}  ({:.0}/s)",
            start.elapsed().as_secs_f64(),
            read as f64 / start.elapsed().as_secs_f64()
        );
    }
    let took = start.elapsed();
    while let Some(delivered) = deliveries.join_next().await {
        delivered??;
    }
    Ok(Sent {
        events: sent,
        valid,
        took,
    })
}
