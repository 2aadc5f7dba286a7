//! `modstream demo`: the real pipeline against an embedded Kafka cluster, fed
//! a realistic mix of benign, abusive, urgent and malformed posts. Its helpers
//! (sample stream, verdict reader) also serve the integration tests.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::config::Settings;
use crate::embedded::EmbeddedBroker;
use crate::shutdown::Shutdown;

const SAMPLE_POSTS: &str = include_str!("../data/sample_posts.txt");

/// (is_abusive, text) for every sample post.
pub fn sample_posts() -> Vec<(bool, &'static str)> {
    SAMPLE_POSTS
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('|'))
        .map(|(label, text)| (label == "abusive", text))
        .collect()
}

/// One generated input record.
#[derive(Debug, Clone)]
pub struct GeneratedEvent {
    pub event_id: String,
    pub key: String,
    pub payload: Vec<u8>,
    /// The text when the payload is a valid event; None for malformed ones.
    pub text: Option<String>,
    /// Marked `"priority": "urgent"`.
    pub urgent: bool,
}

/// What a generated stream holds.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Every n-th record is malformed (0 = none).
    pub malformed_every: usize,
    /// Fraction of valid posts written from the abusive samples.
    pub abusive_share: f64,
    /// Fraction of valid posts marked `"priority": "urgent"`.
    pub urgent_share: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            malformed_every: 100,
            abusive_share: 0.2,
            urgent_share: 0.05,
        }
    }
}

/// [`generate_mix`] with the default shares and `malformed_every`.
pub fn generate(count: usize, malformed_every: usize, prefix: &str) -> Vec<GeneratedEvent> {
    let mix = Mix {
        malformed_every,
        ..Default::default()
    };
    generate_mix(count, &mix, prefix)
}

/// A cheap deterministic hash (splitmix64), so that streams repeat exactly.
fn spread(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A post of realistic, skewed length built from the sample posts of one
/// class: a quarter are short replies (a few words), most are one post, some
/// two to four, one in fifty a long thread (eight posts, ~150+ tokens).
pub fn post_text(i: usize, abusive: bool) -> String {
    let posts = sample_posts();
    let pool: Vec<&str> = posts
        .iter()
        .filter(|(a, _)| *a == abusive)
        .map(|(_, t)| *t)
        .collect();
    let pick = |k: u64| pool[(spread(i as u64 * 31 + k) % pool.len() as u64) as usize];
    let joined = |n: u64| (1..=n).map(pick).collect::<Vec<_>>().join(" ");
    match spread(i as u64) % 100 {
        0..25 => {
            let words = 2 + (spread(i as u64 + 7) % 4) as usize;
            pick(1)
                .split_whitespace()
                .take(words)
                .collect::<Vec<_>>()
                .join(" ")
        }
        25..80 => pick(1).to_string(),
        80..92 => joined(2),
        92..98 => joined(3 + spread(i as u64 + 3) % 2),
        _ => joined(8),
    }
}

/// A deterministic stream: every `malformed_every`-th record is malformed,
/// posts of skewed length with the given abusive and urgent shares, keys
/// over 500 users.
pub fn generate_mix(count: usize, mix: &Mix, prefix: &str) -> Vec<GeneratedEvent> {
    let malformed_every = mix.malformed_every;
    let malformed: [&[u8]; 5] = [
        b"this is not json",
        br#"{"event_id":"x"}"#,
        b"[1,2,3]",
        b"{\"event_id\":\"bad-utf8\",\"text\":\"\xff\xfe\"}",
        br#"{"event_id":"","text":"empty id"}"#,
    ];
    let share = |i: usize, salt: u64, fraction: f64| {
        (spread(i as u64 ^ salt) % 10_000) < (fraction.clamp(0.0, 1.0) * 10_000.0) as u64
    };
    (0..count)
        .map(|i| {
            let event_id = format!("{prefix}{i}");
            let key = format!("user-{}", i % 500);
            if malformed_every > 0 && i % malformed_every == malformed_every - 1 {
                let payload = malformed[(i / malformed_every) % malformed.len()].to_vec();
                return GeneratedEvent {
                    event_id,
                    key,
                    payload,
                    text: None,
                    urgent: false,
                };
            }
            let text = post_text(i, share(i, 0xAB, mix.abusive_share));
            let urgent = share(i, 0x0E, mix.urgent_share);
            let priority = if urgent { "urgent" } else { "normal" };
            let payload = serde_json::json!({
                "event_id": event_id,
                "text": text,
                "user_id": key,
                "lang": "en",
                "created_at": chrono::Utc::now().timestamp_millis(),
                "priority": priority,
            })
            .to_string()
            .into_bytes();
            GeneratedEvent {
                event_id,
                key,
                payload,
                text: Some(text.to_string()),
                urgent,
            }
        })
        .collect()
}

/// A producer for generated events.
pub fn event_producer(bootstrap: &str) -> Result<FutureProducer, String> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .map_err(|e| e.to_string())
}

/// Produce records to `topic` and wait until the broker has all of them.
pub async fn produce_all(
    bootstrap: &str,
    topic: &str,
    events: &[GeneratedEvent],
) -> Result<(), String> {
    produce_with(&event_producer(bootstrap)?, topic, events).await
}

/// [`produce_all`] with a producer the caller keeps.
pub async fn produce_with(
    producer: &FutureProducer,
    topic: &str,
    events: &[GeneratedEvent],
) -> Result<(), String> {
    await_deliveries(enqueue(producer, topic, events)?).await
}

/// Hand records to the producer without waiting for acknowledgements (an
/// open-loop load generator must not slow down when the broker does).
pub fn enqueue(
    producer: &FutureProducer,
    topic: &str,
    events: &[GeneratedEvent],
) -> Result<Vec<DeliveryFuture>, String> {
    enqueue_at(producer, topic, events, None)
}

/// [`enqueue`] with each record's Kafka timestamp set to its *intended*
/// send time, `(first_ms, ms_per_event)`: a paced generator that falls
/// behind then shows up in modstream's end-to-end latency instead of hiding
/// it (no coordinated omission).
pub fn enqueue_at(
    producer: &FutureProducer,
    topic: &str,
    events: &[GeneratedEvent],
    intended: Option<(i64, f64)>,
) -> Result<Vec<DeliveryFuture>, String> {
    let mut pending = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let mut record = FutureRecord::to(topic)
            .key(e.key.as_bytes())
            .payload(e.payload.as_slice());
        if let Some((first_ms, step_ms)) = intended {
            record = record.timestamp(first_ms + (i as f64 * step_ms) as i64);
        }
        match producer.send_result(record) {
            Ok(f) => pending.push(f),
            Err((err, _)) => return Err(err.to_string()),
        }
    }
    Ok(pending)
}

/// Wait until the broker acknowledged every enqueued record.
pub async fn await_deliveries(pending: Vec<DeliveryFuture>) -> Result<(), String> {
    for f in pending {
        match f.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(e.to_string()),
            Err(_) => return Err("delivery canceled".into()),
        }
    }
    Ok(())
}

/// One record read back from an output topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
}

/// Read `topic` from the beginning until `want` records arrived or `timeout`
/// passed (blocking; call from a blocking context).
pub fn read_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: usize,
    timeout: Duration,
) -> Result<Vec<ReadRecord>, String> {
    read_topic_with_progress(bootstrap, topic, partitions, want, timeout, |_| {})
}

/// [`read_topic`], calling `progress` with the count about every half second.
pub fn read_topic_with_progress(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    want: usize,
    timeout: Duration,
    mut progress: impl FnMut(usize),
) -> Result<Vec<ReadRecord>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("modstream-reader-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| e.to_string())?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut last_progress = Instant::now();
    while out.len() < want && Instant::now() < deadline {
        if last_progress.elapsed() >= Duration::from_millis(500) {
            progress(out.len());
            last_progress = Instant::now();
        }
        match consumer.poll(Timeout::After(Duration::from_millis(100))) {
            Some(Ok(m)) => out.push(ReadRecord {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                payload: m.payload().unwrap_or_default().to_vec(),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            Some(Err(e)) => return Err(e.to_string()),
            None => {}
        }
    }
    Ok(out)
}

pub struct DemoOptions {
    pub events: usize,
    pub max_duration: Duration,
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

pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    use anyhow::Context;
    let broker = EmbeddedBroker::start(&[
        (DEMO_INPUT, PARTITIONS),
        (DEMO_VERDICTS, PARTITIONS),
        (DEMO_DLQ, 1),
    ])?;
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
        .map_err(anyhow::Error::msg)
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
    let progress = tokio::task::spawn_blocking(move || -> Result<Vec<ReadRecord>, String> {
        let verdicts = read_topic_with_progress(
            &reader_bootstrap,
            DEMO_VERDICTS,
            PARTITIONS,
            valid,
            deadline - Instant::now(),
            |n| {
                eprint!(
                    "\rverdicts {n:>6}/{valid}  {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                let _ = std::io::stderr().flush();
            },
        )?;
        eprintln!(
            "\rverdicts {:>6}/{valid}  {:.1}s",
            verdicts.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(verdicts)
    });
    let verdicts = progress.await?.map_err(anyhow::Error::msg)?;
    let elapsed = started.elapsed();
    shutdown.stop.cancel();
    let summary = pipeline.await??;
    let dlq = read_topic(
        &bootstrap,
        DEMO_DLQ,
        1,
        events.len() - valid,
        Duration::from_secs(5),
    )
    .map_err(anyhow::Error::msg)?;

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
            .get(crate::verdict::header::REASON)
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
        "latency          p50 {} ms, p99 {} ms, max {} ms (record timestamp to verdict)",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_streams_honour_the_shares_and_have_a_long_tail() {
        let mix = Mix {
            malformed_every: 50,
            abusive_share: 0.3,
            urgent_share: 0.1,
        };
        let events = generate_mix(10_000, &mix, "x-");
        let valid: Vec<&GeneratedEvent> = events.iter().filter(|e| e.text.is_some()).collect();
        assert_eq!(events.len() - valid.len(), 200);
        let abusive: std::collections::HashSet<&str> = sample_posts()
            .into_iter()
            .filter(|(a, _)| *a)
            .map(|(_, t)| t)
            .collect();
        let share = |f: &dyn Fn(&GeneratedEvent) -> bool| {
            valid.iter().filter(|e| f(e)).count() as f64 / valid.len() as f64
        };
        let abusive_share = share(&|e| {
            let t = e.text.as_deref().unwrap();
            abusive.iter().any(|a| a.starts_with(t) || t.starts_with(a))
        });
        let urgent_share = share(&|e| {
            let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
            v["priority"] == "urgent"
        });
        assert!((0.27..0.33).contains(&abusive_share), "{abusive_share}");
        assert!((0.08..0.12).contains(&urgent_share), "{urgent_share}");
        let mut words: Vec<usize> = valid
            .iter()
            .map(|e| e.text.as_deref().unwrap().split_whitespace().count())
            .collect();
        words.sort();
        let (median, p99) = (words[words.len() / 2], words[words.len() * 99 / 100]);
        assert!(p99 > 5 * median, "median {median} words, p99 {p99}");
        // Deterministic: the same stream every time.
        assert_eq!(
            generate_mix(100, &mix, "x-")[7].payload.len(),
            events[7].payload.len()
        );
    }
}
