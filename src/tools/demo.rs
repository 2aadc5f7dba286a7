//! `modstream demo`: the real pipeline against an embedded Kafka cluster, fed
//! a realistic mix of benign, abusive, urgent and malformed posts. Its
//! configuration also serves `bench` and the integration tests.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use super::embedded::EmbeddedBroker;
use super::generator::generate;
use super::read::{ReadRecord, TopicReader, read_topic};
use super::send::produce_all;
use crate::config::Settings;
use crate::shutdown::Shutdown;

pub struct DemoOptions {
    pub events: usize,
    pub max_duration: Duration,
    pub model_dir: Option<std::path::PathBuf>,
}

/// The paced demo: `rate` events per second for `seconds` (None: until
/// Ctrl-C), with /metrics served on `listen` meanwhile.
pub struct PacedOptions {
    pub rate: f64,
    pub seconds: Option<u64>,
    pub listen: std::net::SocketAddr,
    pub model_dir: Option<std::path::PathBuf>,
}

pub const DEMO_INPUT: &str = "moderation.events";
pub const DEMO_VERDICTS: &str = "moderation.verdicts";
pub const DEMO_DLQ: &str = "moderation.dlq";
const PARTITIONS: i32 = 4;

/// Settings for a pipeline against `bootstrap` with the demo topics.
pub fn demo_settings(bootstrap: &str, group: &str) -> Result<Settings, crate::config::ConfigError> {
    Settings::from_toml(&demo_config(bootstrap, group, 64, 10))
}

/// The demo configuration as TOML (for a separate `modstream run` process).
pub fn demo_config(bootstrap: &str, group: &str, max_batch_size: usize, delay_ms: u64) -> String {
    demo_config_for(
        bootstrap,
        group,
        [DEMO_INPUT, DEMO_VERDICTS, DEMO_DLQ],
        max_batch_size,
        delay_ms,
    )
}

/// [`demo_config`] with other topics: `[input, verdicts, dlq]`.
pub fn demo_config_for(
    bootstrap: &str,
    group: &str,
    [input, verdicts, dlq]: [&str; 3],
    max_batch_size: usize,
    delay_ms: u64,
) -> String {
    format!(
        r#"
        [kafka]
        bootstrap_servers = "{bootstrap}"
        group_id = "{group}"
        drain_timeout = "3s"
        # A restarted member can wait a whole session timeout for the group
        # to settle (librdkafka issue 5569): keep it short on a local cluster.
        [kafka.consumer]
        "session.timeout.ms" = 6000
        "heartbeat.interval.ms" = 500
        "fetch.wait.max.ms" = 10
        "fetch.error.backoff.ms" = 10
        [kafka.producer]
        "linger.ms" = 2
        [input]
        topics = ["{input}"]
        [output]
        topic = "{verdicts}"
        dlq_topic = "{dlq}"
        [batching]
        max_batch_size = {max_batch_size}
        max_batch_delay = "{delay_ms}ms"
        "#
    )
}

/// An embedded cluster with the demo topics.
fn start_broker() -> Result<EmbeddedBroker, super::embedded::EmbeddedError> {
    EmbeddedBroker::start(&[
        (DEMO_INPUT, PARTITIONS),
        (DEMO_VERDICTS, PARTITIONS),
        (DEMO_DLQ, 1),
    ])
}

pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    use anyhow::Context;
    let broker = start_broker()?;
    let bootstrap = broker.bootstrap_servers().to_string();
    println!("embedded Kafka at {bootstrap}   (watch: kcat -b {bootstrap} -C -t {DEMO_VERDICTS})");
    let mut settings = demo_settings(&bootstrap, "modstream-demo")?;
    if let Some(dir) = opts.model_dir {
        settings.inference.model_dir = dir;
    }
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals();
    let pipeline = tokio::spawn(crate::pipeline::run(settings, shutdown.clone()));

    let events = generate(opts.events, 100, "demo-");
    let texts: HashMap<String, String> = events
        .iter()
        .filter_map(|e| e.text.clone().map(|t| (e.event_id.clone(), t)))
        .collect();
    let valid = texts.len();
    let started = Instant::now();
    produce_all(&bootstrap, DEMO_INPUT, &events)
        .await
        .context("producing demo events")?;
    println!(
        "produced {} events ({} valid, {} malformed) in {:.2}s",
        events.len(),
        valid,
        events.len() - valid,
        started.elapsed().as_secs_f64()
    );

    // Read verdicts as they come, with a progress line.
    let deadline = started + opts.max_duration;
    let reader_bootstrap = bootstrap.clone();
    let progress = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<ReadRecord>> {
        let reader =
            TopicReader::from_beginning(&reader_bootstrap, DEMO_VERDICTS, Some(PARTITIONS))?;
        let mut shown = Instant::now();
        let mut n = 0;
        let verdicts = reader.read(valid, deadline - Instant::now(), |_| {
            n += 1;
            if shown.elapsed() >= Duration::from_millis(500) {
                shown = Instant::now();
                eprint!(
                    "\rverdicts {n:>6}/{valid}  {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                let _ = std::io::stderr().flush();
            }
        })?;
        eprintln!(
            "\rverdicts {:>6}/{valid}  {:.1}s",
            verdicts.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(verdicts)
    });
    let verdicts = progress.await??;
    let elapsed = started.elapsed();
    shutdown.stop.cancel();
    let summary = pipeline.await??;
    let dlq = read_topic(
        &bootstrap,
        DEMO_DLQ,
        1,
        events.len() - valid,
        Duration::from_secs(5),
    )?;

    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    let mut latency = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut samples: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for v in &verdicts {
        let json: serde_json::Value = serde_json::from_slice(&v.payload)?;
        let kind = json["verdict"].as_str().unwrap_or("?").to_string();
        if let Some(ms) = json["latency_ms"].as_u64() {
            latency.record(ms)?;
        }
        let id = json["event_id"].as_str().unwrap_or_default();
        let list = samples.entry(kind.clone()).or_default();
        if list.len() < 2 {
            let score = json["scores"]["offensive"].as_f64().unwrap_or(0.0);
            list.push(format!(
                "  {kind:<6} {score:.2}  {}",
                texts.get(id).map(String::as_str).unwrap_or("")
            ));
        }
        *by_kind.entry(kind).or_default() += 1;
    }
    let mut dlq_reasons: BTreeMap<String, usize> = BTreeMap::new();
    for d in &dlq {
        let reason = d
            .headers
            .get(crate::record::header::REASON)
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .unwrap_or_default();
        *dlq_reasons.entry(reason).or_default() += 1;
    }

    println!("\n== modstream demo summary ==");
    println!("events           {}", events.len());
    println!(
        "verdicts         {} of {valid} valid  {by_kind:?}",
        verdicts.len()
    );
    println!("dead-lettered    {}  {dlq_reasons:?}", dlq.len());
    println!(
        "throughput       {:.0} events/s (produce to last verdict, {:.2}s)",
        events.len() as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "latency          p50 {} ms, p99 {} ms, max {} ms (record timestamp to verdict; all events were produced at once, before the pipeline joined, so this is mostly queueing and start-up: --rate R measures it under a paced load)",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
        latency.max()
    );
    println!(
        "pipeline         consumed {}, verdicts acked {}, dlq acked {}",
        summary.consumed, summary.verdicts, summary.dlq
    );
    println!("sample verdicts:");
    for lines in samples.values() {
        for l in lines {
            println!("{l}");
        }
    }
    if verdicts.len() < valid {
        anyhow::bail!(
            "only {} of {valid} verdicts arrived within {:?}",
            verdicts.len(),
            opts.max_duration
        );
    }
    drop(broker);
    Ok(())
}

/// The paced demo: the pipeline on an embedded cluster, fed `rate` events/s
/// open loop, printing progress each second, /metrics and /readyz served
/// while it runs; latency is counted from the first paced event, after a
/// warm-up event proved the pipeline joined and scored.
pub async fn run_paced(opts: PacedOptions) -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    anyhow::ensure!(
        opts.rate > 0.0 && opts.rate <= 1_000_000.0,
        "--rate must be above 0 and at most 1000000 events/s"
    );
    let broker = start_broker()?;
    let bootstrap = broker.bootstrap_servers().to_string();
    let metrics = crate::telemetry::install_recorder()?;
    let mut settings = demo_settings(&bootstrap, "modstream-demo")?;
    if let Some(dir) = opts.model_dir {
        settings.inference.model_dir = dir;
    }
    crate::telemetry::register_zeroes(&settings);
    let health = Arc::new(crate::telemetry::Health::default());
    let stop_listener = tokio_util::sync::CancellationToken::new();
    let listener =
        crate::telemetry::serve(opts.listen, metrics, health.clone(), stop_listener.clone())
            .await?;
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals();
    let pipeline = tokio::spawn(crate::pipeline::run_with_health(
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

    // The reader counts verdicts and keeps their latency; it runs until told
    // to stop and every expected verdict arrived (or 30 s after the stop).
    let stop_reading = Arc::new(AtomicBool::new(false));
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let read = Arc::new(AtomicU64::new(0));
    let warm = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, expected, read, warm) = (
            stop_reading.clone(),
            expected.clone(),
            read.clone(),
            warm.clone(),
        );
        let bootstrap = bootstrap.clone();
        tokio::task::spawn_blocking(
            move || -> anyhow::Result<(BTreeMap<String, u64>, hdrhistogram::Histogram<u64>)> {
                let reader =
                    TopicReader::from_beginning(&bootstrap, DEMO_VERDICTS, Some(PARTITIONS))?;
                let mut by_kind = BTreeMap::new();
                let mut latency = hdrhistogram::Histogram::<u64>::new(3)?;
                let mut stopped_at: Option<Instant> = None;
                loop {
                    if stop.load(Ordering::SeqCst) {
                        let at = *stopped_at.get_or_insert_with(Instant::now);
                        if read.load(Ordering::SeqCst) >= expected.load(Ordering::SeqCst)
                            || at.elapsed() > Duration::from_secs(30)
                        {
                            break;
                        }
                    }
                    if let Some(v) = reader.poll(Duration::from_millis(100))? {
                        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&v.payload)
                        else {
                            continue;
                        };
                        if json["event_id"]
                            .as_str()
                            .is_some_and(|id| id.starts_with("warmup-"))
                        {
                            warm.store(true, Ordering::SeqCst);
                            continue;
                        }
                        read.fetch_add(1, Ordering::SeqCst);
                        *by_kind
                            .entry(json["verdict"].as_str().unwrap_or("?").to_string())
                            .or_insert(0) += 1;
                        if let Some(ms) = json["latency_ms"].as_u64() {
                            latency.record(ms.max(1))?;
                        }
                    }
                }
                Ok((by_kind, latency))
            },
        )
    };

    let producer = super::send::event_producer(&bootstrap)?;
    super::send::produce_with(&producer, DEMO_INPUT, &generate(1, 0, "warmup-")).await?;
    let joined_by = Instant::now() + Duration::from_secs(60);
    while !warm.load(Ordering::SeqCst) {
        anyhow::ensure!(
            Instant::now() < joined_by && !pipeline.is_finished(),
            "the pipeline did not score a warm-up event within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "pipeline joined; sending {:.0} events/s {}",
        opts.rate,
        opts.seconds
            .map_or("until Ctrl-C".to_string(), |s| format!("for {s} s"))
    );
    let start = Instant::now();
    let per_round = (opts.rate.ceil() as usize).max(1);
    let (mut sent, mut valid) = (0u64, 0u64);
    // Each second's deliveries are awaited by their own task (bounded: one
    // per second of the run).
    let mut deliveries = tokio::task::JoinSet::new();
    for round in 0u64.. {
        if shutdown.stop.is_cancelled() || opts.seconds.is_some_and(|s| round >= s) {
            break;
        }
        let events = generate(per_round, 100, &format!("demo-{round}-"));
        valid += events.iter().filter(|e| e.text.is_some()).count() as u64;
        sent += events.len() as u64;
        let schedule = super::send::Schedule {
            start: start + Duration::from_secs(round),
            rate: opts.rate,
            stamp_from_ms: None,
        };
        tokio::select! {
            r = super::send::send_paced(&producer, DEMO_INPUT, &events, schedule, |_| {}) => {
                deliveries.spawn(super::send::await_deliveries(r?));
            }
            _ = shutdown.stop.cancelled() => break,
        }
        println!(
            "{:>5.0}s  sent {sent:>8}  verdicts {:>8}  ({:.0}/s)",
            start.elapsed().as_secs_f64(),
            read.load(Ordering::SeqCst),
            read.load(Ordering::SeqCst) as f64 / start.elapsed().as_secs_f64()
        );
    }
    let sending = start.elapsed();
    while let Some(delivered) = deliveries.join_next().await {
        delivered??;
    }
    expected.store(valid, Ordering::SeqCst);
    stop_reading.store(true, Ordering::SeqCst);
    let (by_kind, latency) = reader.await??;
    shutdown.stop.cancel();
    let summary = pipeline.await??;
    stop_listener.cancel();
    let _ = listener.await;
    let verdicts: u64 = by_kind.values().sum();
    println!("\n== modstream demo (paced) ==");
    println!(
        "sent             {sent} events in {:.1}s ({valid} valid)",
        sending.as_secs_f64()
    );
    println!("verdicts         {verdicts}  {by_kind:?}");
    println!("dead-lettered    {}", summary.dlq);
    println!(
        "latency          p50 {} ms, p99 {} ms, max {} ms (record timestamp to verdict, after the pipeline joined)",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
        latency.max()
    );
    drop(producer);
    drop(broker);
    anyhow::ensure!(
        verdicts >= valid,
        "only {verdicts} of {valid} verdicts arrived"
    );
    Ok(())
}
