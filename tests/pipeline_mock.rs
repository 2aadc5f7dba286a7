//! The whole pipeline on librdkafka's in-process mock cluster: what a user
//! cares about is one verdict per valid event, one DLQ record per malformed
//! one, per-key order, committed offsets at the end, and no duplicates after
//! a clean restart.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use modstream::shutdown::Shutdown;
use modstream::tools::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::generator::{self, GeneratedEvent};
use modstream::tools::read::{self, ReadRecord};
use modstream::tools::send;

const PARTITIONS: i32 = 4;

fn start_broker() -> EmbeddedBroker {
    if std::env::var_os("RUST_LOG").is_some() {
        modstream::telemetry::init_logging(&Default::default());
    }
    EmbeddedBroker::start(&[
        (DEMO_INPUT, PARTITIONS),
        (DEMO_VERDICTS, PARTITIONS),
        (DEMO_DLQ, 1),
    ])
    .expect("embedded cluster starts")
}

fn verdict_json(r: &ReadRecord) -> serde_json::Value {
    serde_json::from_slice(&r.payload).expect("verdicts are JSON")
}

/// (committed, end) offset of every input partition for `group`.
fn committed_and_end(bootstrap: &str, group: &str) -> Vec<(i64, i64)> {
    let committed = support::committed_on(bootstrap, group, DEMO_INPUT, PARTITIONS);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    (0..PARTITIONS)
        .map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(DEMO_INPUT, p, Duration::from_secs(10))
                .unwrap();
            (committed[p as usize], high)
        })
        .collect()
}

/// Reads a little past `want` so that duplicates would show.
async fn read_settled(
    bootstrap: &str,
    topic: &'static str,
    partitions: i32,
    want: usize,
) -> Vec<ReadRecord> {
    let mut records = support::read_records(bootstrap, topic, partitions, want).await;
    let b = bootstrap.to_string();
    let extra = tokio::task::spawn_blocking(move || {
        read::read_topic(&b, topic, partitions, usize::MAX, Duration::from_secs(2))
    })
    .await
    .unwrap()
    .unwrap();
    if extra.len() > records.len() {
        records = extra;
    }
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_one_verdict_each_in_key_order_and_committed_to_the_end() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap_servers().to_string();
    let events = generator::generate(10_000, 100, "e-");
    let malformed: Vec<&GeneratedEvent> = events.iter().filter(|e| e.text.is_none()).collect();
    let valid = events.len() - malformed.len();
    assert_eq!(malformed.len(), 100, "1 % malformed");
    send::produce_all(&bootstrap, DEMO_INPUT, &events)
        .await
        .unwrap();

    let settings = demo::demo_settings(&bootstrap, "g-main").unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let verdicts = read_settled(&bootstrap, DEMO_VERDICTS, PARTITIONS, valid).await;
    let dlq = read_settled(&bootstrap, DEMO_DLQ, 1, malformed.len()).await;
    shutdown.stop.cancel();
    let summary = tokio::time::timeout(Duration::from_secs(60), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // Exactly one verdict per valid event.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for v in &verdicts {
        let json = verdict_json(v);
        *seen
            .entry(json["event_id"].as_str().unwrap().to_string())
            .or_default() += 1;
        assert!(["allow", "review", "block"].contains(&json["verdict"].as_str().unwrap()));
        assert_eq!(json["model"]["name"], "alt-profanity-check");
        assert_eq!(json["source"]["topic"], DEMO_INPUT);
    }
    let expected: HashSet<&str> = events
        .iter()
        .filter(|e| e.text.is_some())
        .map(|e| e.event_id.as_str())
        .collect();
    assert_eq!(verdicts.len(), valid, "one verdict per valid event");
    assert_eq!(seen.len(), valid);
    assert!(seen.keys().all(|id| expected.contains(id.as_str())));
    assert_eq!(summary.verdicts as usize, valid);

    // Exactly one DLQ record per malformed event, original bytes and key kept.
    assert_eq!(dlq.len(), malformed.len());
    for d in &dlq {
        let reason = String::from_utf8(d.headers["modstream.reason"].clone()).unwrap();
        assert!(!reason.is_empty());
        assert!(
            malformed
                .iter()
                .any(|m| m.payload == d.payload && Some(m.key.as_bytes()) == d.key.as_deref()),
            "DLQ record carries an original payload and key untouched"
        );
        assert!(d.headers.contains_key("modstream.source.offset"));
    }

    // Per key, verdicts appear in the order of their input offsets.
    let mut last_offset: HashMap<Vec<u8>, i64> = HashMap::new();
    let mut by_partition: Vec<&ReadRecord> = verdicts.iter().collect();
    by_partition.sort_by_key(|r| (r.partition, r.offset));
    for v in by_partition {
        let source_offset = verdict_json(v)["source"]["offset"].as_i64().unwrap();
        let key = v.key.clone().expect("verdicts keep the input key");
        if let Some(prev) = last_offset.insert(key, source_offset) {
            assert!(source_offset > prev, "verdicts of a key out of input order");
        }
    }

    // The group's committed offsets equal the end offsets.
    for (committed, end) in committed_and_end(&bootstrap, "g-main") {
        assert_eq!(
            committed, end,
            "committed offset at the end of the partition"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_mid_stream_then_restart_gives_every_event_one_verdict() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap_servers().to_string();
    let events = generator::generate(20_000, 0, "r-");
    send::produce_all(&bootstrap, DEMO_INPUT, &events)
        .await
        .unwrap();

    // First run: stop it as soon as some verdicts are out.
    let mut settings = demo::demo_settings(&bootstrap, "g-restart").unwrap();
    settings.batching.max_batch_size = 16;
    let shutdown = Shutdown::new();
    let first = tokio::spawn(modstream::pipeline::run(settings.clone(), shutdown.clone()));
    let started = Instant::now();
    loop {
        let seen = support::read_records(&bootstrap, DEMO_VERDICTS, PARTITIONS, 200)
            .await
            .len();
        if seen >= 200 || started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    shutdown.stop.cancel();
    let first_summary = tokio::time::timeout(Duration::from_secs(60), first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        (first_summary.verdicts as usize) < events.len(),
        "the first run was stopped mid-stream ({} verdicts)",
        first_summary.verdicts
    );
    let after_first = committed_and_end(&bootstrap, "g-restart");
    let committed_first: i64 = after_first.iter().map(|(c, _)| (*c).max(0)).sum();
    assert_eq!(
        committed_first as u64, first_summary.verdicts,
        "committed exactly what was delivered"
    );

    // Second run: picks up where the first one committed.
    let shutdown = Shutdown::new();
    let second = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let verdicts = read_settled(&bootstrap, DEMO_VERDICTS, PARTITIONS, events.len()).await;
    let mut ids: HashMap<String, usize> = HashMap::new();
    for v in &verdicts {
        *ids.entry(verdict_json(v)["event_id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let duplicates: usize = ids.values().map(|n| n - 1).sum();
    println!(
        "restart: {} verdicts, {} distinct, {duplicates} duplicates",
        verdicts.len(),
        ids.len()
    );
    assert_eq!(ids.len(), events.len(), "every event has a verdict");
    assert_eq!(duplicates, 0, "a clean restart produces no duplicates");
    shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for (committed, end) in committed_and_end(&bootstrap, "g-restart") {
        assert_eq!(
            committed, end,
            "committed offset at the end of the partition"
        );
    }
}

/// The load generator (`modstream produce`, the bench) sends more records
/// at once than librdkafka's queue holds (100,000 by default) while the
/// broker takes none for a second: it waits for room instead of failing
/// with a full queue, and every record is acknowledged once the broker is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generator_sends_more_records_at_once_than_the_producer_queue_holds() {
    let broker = std::sync::Arc::new(start_broker());
    let bootstrap = broker.bootstrap_servers().to_string();
    let events = generator::generate(120_000, 0, "q-");
    let producer = send::event_producer(&bootstrap).unwrap();
    // The producer knows the partitions, then the broker goes away.
    send::produce_with(&producer, DEMO_INPUT, &events[..1])
        .await
        .unwrap();
    broker.with_cluster(|c| c.broker_down(1)).unwrap();
    let b = broker.clone();
    let back = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_secs(1));
        b.with_cluster(|c| c.broker_up(1)).unwrap();
    });
    let schedule = send::Schedule {
        start: Instant::now(),
        rate: 0.0,
        stamp_from_ms: None,
    };
    let pending = send::send_paced(&producer, DEMO_INPUT, &events, schedule, |_| {})
        .await
        .expect("a full queue is waited out");
    assert_eq!(pending.len(), events.len());
    back.await.unwrap();
    send::await_deliveries(pending)
        .await
        .expect("every record acknowledged");
}

/// W3C trace context: a post's `traceparent` (and `tracestate`) is carried
/// onto its verdict, so the services downstream continue its trace; an
/// invalid one is not continued; a dead letter keeps the input's headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posts_trace_context_is_continued_on_its_verdict() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    const TRACED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const INVALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
    let broker = start_broker();
    let bootstrap = broker.bootstrap_servers().to_string();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    // (event id, payload, traceparent, tracestate)
    let posts = [
        (
            "t-traced",
            r#"{"event_id":"t-traced","text":"hello there"}"#,
            Some(TRACED),
            Some("congo=t61rcWkgMzE"),
        ),
        (
            "t-invalid",
            r#"{"event_id":"t-invalid","text":"hello again"}"#,
            Some(INVALID),
            None,
        ),
        (
            "t-none",
            r#"{"event_id":"t-none","text":"hello once more"}"#,
            None,
            None,
        ),
        ("t-dead", r#"{"event_id":"t-dead"}"#, Some(TRACED), None),
    ];
    for (id, payload, parent, state) in posts {
        let mut headers = OwnedHeaders::new();
        for (key, value) in [("traceparent", parent), ("tracestate", state)] {
            if let Some(value) = value {
                headers = headers.insert(Header {
                    key,
                    value: Some(value),
                });
            }
        }
        let record = FutureRecord::to(DEMO_INPUT)
            .key(id)
            .payload(payload)
            .headers(headers);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let settings = demo::demo_settings(&bootstrap, "g-trace").unwrap();
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let verdicts = read_settled(&bootstrap, DEMO_VERDICTS, PARTITIONS, 3).await;
    let dlq = read_settled(&bootstrap, DEMO_DLQ, 1, 1).await;
    shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let header = |r: &ReadRecord, name: &str| {
        r.headers
            .get(name)
            .map(|v| String::from_utf8(v.clone()).unwrap())
    };
    let by_id: HashMap<String, &ReadRecord> = verdicts
        .iter()
        .map(|v| (verdict_json(v)["event_id"].as_str().unwrap().to_string(), v))
        .collect();
    assert_eq!(by_id.len(), 3, "one verdict per valid post");
    let traced = by_id["t-traced"];
    assert_eq!(header(traced, "traceparent").as_deref(), Some(TRACED));
    assert_eq!(
        header(traced, "tracestate").as_deref(),
        Some("congo=t61rcWkgMzE")
    );
    for id in ["t-invalid", "t-none"] {
        assert_eq!(header(by_id[id], "traceparent"), None, "{id}");
    }
    assert_eq!(dlq.len(), 1);
    assert_eq!(header(&dlq[0], "traceparent").as_deref(), Some(TRACED));
}
