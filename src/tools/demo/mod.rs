//! `modstream demo`: the real pipeline against an embedded Kafka cluster, fed
//! a realistic mix of benign, abusive, urgent and malformed posts. Its
//! configuration also serves `bench` and the integration tests.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use super::embedded::EmbeddedBroker;
use super::generator::{GeneratedEvent, generate};
use super::read::{ReadRecord, TopicReader, read_topic};
use super::send::produce_all;
use crate::config::Settings;
use crate::pipeline::RunSummary;
use crate::shutdown::Shutdown;

mod paced;

pub use paced::run_paced;

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
pub(super) const PARTITIONS: i32 = 4;

/// Settings for a pipeline against `bootstrap` with the demo topics.
pub fn demo_settings(bootstrap: &str, group: &str) -> Result<Settings, crate::config::ConfigError> {
    let mut settings = Settings::from_toml(&demo_config(bootstrap, group, 64, 10))?;
    // The shipped model from any directory (as given where it exists).
    settings.inference.model_dir = crate::tools::beside_the_binary(&settings.inference.model_dir);
    Ok(settings)
}

/// Why a demo ends early: the pipeline stopped before the verdicts came.
pub(crate) fn pipeline_ended<T>(
    ended: Result<Result<T, crate::pipeline::PipelineError>, tokio::task::JoinError>,
) -> anyhow::Error {
    match ended {
        Ok(Err(e)) => anyhow::Error::new(e).context("the pipeline stopped"),
        Ok(Ok(_)) => anyhow::anyhow!("the pipeline stopped before the verdicts arrived"),
        Err(e) => anyhow::Error::new(e).context("the pipeline task failed"),
    }
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
pub(super) fn start_broker() -> Result<EmbeddedBroker, super::embedded::EmbeddedError> {
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
    let mut pipeline = tokio::spawn(crate::pipeline::run(settings, shutdown.clone()));

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
    let deadline = started + opts.max_duration;
    let verdicts = tokio::select! {
        read = read_with_progress(bootstrap.clone(), valid, started, deadline) => read?,
        ended = &mut pipeline => return Err(pipeline_ended(ended)),
    };
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
    let tally = Tally::of(&verdicts, &dlq, &texts)?;
    tally.print(&events, valid, elapsed, &summary);
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

/// Read `want` verdicts as they come (until `deadline`), with progress on
/// stderr: one line rewritten in place on a terminal; piped to a file or a
/// CI log, a whole line every 2 s.
async fn read_with_progress(
    bootstrap: String,
    want: usize,
    started: Instant,
    deadline: Instant,
) -> anyhow::Result<Vec<ReadRecord>> {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let (every, start, end) = if terminal {
        (Duration::from_millis(500), "\r", "")
    } else {
        (Duration::from_secs(2), "", "\n")
    };
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<ReadRecord>> {
        let reader = TopicReader::from_beginning(&bootstrap, DEMO_VERDICTS, Some(PARTITIONS))?;
        let mut shown = Instant::now();
        let mut n = 0;
        let verdicts = reader.read(want, deadline - Instant::now(), |_| {
            n += 1;
            if shown.elapsed() >= every {
                shown = Instant::now();
                eprint!(
                    "{start}verdicts {n:>6}/{want}  {:.1}s{end}",
                    started.elapsed().as_secs_f64()
                );
                let _ = std::io::stderr().flush();
            }
        })?;
        eprintln!(
            "{start}verdicts {:>6}/{want}  {:.1}s",
            verdicts.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(verdicts)
    })
    .await?
}

/// What came out: verdicts by kind, their latency, two samples of each
/// kind, dead-letter records by reason.
struct Tally {
    by_kind: BTreeMap<String, usize>,
    latency: hdrhistogram::Histogram<u64>,
    samples: BTreeMap<String, Vec<String>>,
    dlq_reasons: BTreeMap<String, usize>,
    verdicts: usize,
    dlq: usize,
}

impl Tally {
    fn of(
        verdicts: &[ReadRecord],
        dlq: &[ReadRecord],
        texts: &HashMap<String, String>,
    ) -> anyhow::Result<Tally> {
        let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
        let mut latency = hdrhistogram::Histogram::<u64>::new(3)?;
        let mut samples: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for v in verdicts {
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
        for d in dlq {
            let reason = d
                .headers
                .get(crate::producer::record::header::REASON)
                .map(|r| String::from_utf8_lossy(r).into_owned())
                .unwrap_or_default();
            *dlq_reasons.entry(reason).or_default() += 1;
        }
        Ok(Tally {
            by_kind,
            latency,
            samples,
            dlq_reasons,
            verdicts: verdicts.len(),
            dlq: dlq.len(),
        })
    }

    fn print(
        &self,
        events: &[GeneratedEvent],
        valid: usize,
        elapsed: Duration,
        summary: &RunSummary,
    ) {
        let Tally {
            by_kind,
            latency,
            samples,
            dlq_reasons,
            ..
        } = self;
        println!("\n== modstream demo summary ==");
        println!("events           {}", events.len());
        println!(
            "verdicts         {} of {valid} valid  {by_kind:?}",
            self.verdicts
        );
        println!("dead-lettered    {}  {dlq_reasons:?}", self.dlq);
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
    }
}
