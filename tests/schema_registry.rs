//! Schema Registry formats end to end against a real registry (Apicurio
//! Registry 3.3, its Confluent-compatible API), events produced by a real
//! client nobody here wrote (confluent-kafka's serializers), verdicts read
//! back with its AvroDeserializer; the pipeline on the mock cluster.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use modstream::config::{CloudEventsOutput, InputFormat, Mapping, OutputFormat, Settings};
use modstream::shutdown::Shutdown;
use modstream::telemetry::Health;
use modstream::tools::demo::{self, DEMO_DLQ, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;
use modstream::tools::read;
use support::registry::{self, HeldProducer, Registry};

fn broker() -> EmbeddedBroker {
    EmbeddedBroker::start(&[(DEMO_INPUT, 2), (DEMO_VERDICTS, 2), (DEMO_DLQ, 1)]).unwrap()
}

/// The demo settings reading `format` through `registry`, by the mapping
/// of the client's Post record.
fn settings(bootstrap: &str, registry: &Registry, format: InputFormat) -> Settings {
    let mut s = demo::demo_settings(bootstrap, "g-registry").unwrap();
    s.input.format = format;
    s.input.mapping = Mapping {
        id: "/id".into(),
        text: vec!["/title".into(), "/body".into()],
        tenant: "/community".into(),
        created_at: "/created_utc".into(),
        ..Mapping::default()
    };
    s.schema_registry.url = Some(registry.url());
    s.schema_registry.request_timeout = Duration::from_secs(2);
    s.validate().unwrap();
    s
}

struct Running {
    shutdown: Shutdown,
    health: Arc<Health>,
    pipeline: tokio::task::JoinHandle<
        Result<modstream::pipeline::RunSummary, modstream::pipeline::PipelineError>,
    >,
}

fn start(settings: Settings) -> Running {
    let (shutdown, health) = (Shutdown::new(), Arc::new(Health::default()));
    let pipeline = tokio::spawn(modstream::pipeline::run_with_health(
        settings,
        shutdown.clone(),
        health.clone(),
    ));
    Running {
        shutdown,
        health,
        pipeline,
    }
}

impl Running {
    async fn stop(self) -> modstream::pipeline::RunSummary {
        self.shutdown.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.pipeline)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }
}

/// How many records `topic` holds now.
async fn count_now(bootstrap: &str, topic: &'static str) -> usize {
    let b = bootstrap.to_string();
    tokio::task::spawn_blocking(move || {
        read::TopicReader::from_beginning(&b, topic, None)
            .unwrap()
            .read_to_end(Duration::from_secs(30))
            .unwrap()
            .len()
    })
    .await
    .unwrap()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn produce_raw(bootstrap: &str, values: &[Vec<u8>]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for v in values {
        producer
            .send(
                FutureRecord::<str, [u8]>::to(DEMO_INPUT)
                    .key("raw")
                    .payload(v),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
}

/// The id the registry gave the latest schema of `<topic>-value`.
fn schema_id(registry: &Registry) -> u32 {
    let (status, body) = support::http_get(
        registry.port,
        &format!("/apis/ccompat/v7/subjects/{DEMO_INPUT}-value/versions/latest"),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["id"].as_u64().unwrap() as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_evolved_mid_stream_and_bad_records_with_avro_verdicts_read_by_the_avro_deserializer()
{
    let registry = Arc::new(Registry::start());
    let broker = broker();
    let bootstrap = broker.bootstrap_servers().to_string();
    // Version 1 then version 2 (adds `community`) on the same topic.
    for (format, start) in [("avro", 0), ("avro2", 100)] {
        let (b, r) = (bootstrap.clone(), registry.clone());
        blocking(move || registry::produce(&b, &r, DEMO_INPUT, format, start, 100)).await;
    }
    let v2 = schema_id(&registry);
    produce_raw(
        &bootstrap,
        &[
            b"{\"not\": \"in the wire format\"}".to_vec(),
            vec![0, 0x7f, 0xff, 0xff, 0x01, 2, b'x'],
            [vec![0], v2.to_be_bytes().to_vec(), vec![0xff, 0xff, 0xff]].concat(),
        ],
    )
    .await;
    let mut s = settings(&bootstrap, &registry, InputFormat::Avro);
    s.output.format = OutputFormat::Avro;
    s.output.cloudevents = CloudEventsOutput::Binary;
    let running = start(s);
    let dlq = support::read_records(&bootstrap, DEMO_DLQ, 1, 3).await;
    let (b, r) = (bootstrap.clone(), registry.clone());
    let verdicts = blocking(move || registry::avro_verdicts(&b, &r, DEMO_VERDICTS, 200)).await;
    let summary = running.stop().await;
    assert_eq!((summary.verdicts, summary.dlq), (200, 3));

    let by_id: HashMap<String, &serde_json::Value> = verdicts
        .iter()
        .map(|v| (v["value"]["event_id"].as_str().unwrap().to_string(), v))
        .collect();
    assert_eq!(
        by_id.len(),
        200,
        "one verdict per event, read by AvroDeserializer"
    );
    for i in 0..200 {
        let id = if i < 100 {
            format!("avro-{i}")
        } else {
            format!("avro2-{i}")
        };
        let v = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("{id} has no verdict"));
        let tenant = &v["value"]["tenant"];
        if i < 100 {
            assert!(tenant.is_null(), "v1 has no community: {v}");
        } else {
            assert_eq!(tenant, "hiking", "v2's community: {v}");
        }
        assert!(["allow", "review", "block"].contains(&v["value"]["verdict"].as_str().unwrap()));
        assert_eq!(
            v["headers"]["ce_subject"],
            id.as_str(),
            "CloudEvents subject: {v}"
        );
        assert_eq!(v["headers"]["ce_type"], "dev.modstream.verdict");
    }
    let mut reasons: Vec<String> = dlq
        .iter()
        .map(|d| String::from_utf8(d.headers["modstream.reason"].clone()).unwrap())
        .collect();
    reasons.sort();
    assert_eq!(reasons, ["undecodable", "undecodable", "unknown_schema"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_and_json_schema_events_are_read_by_the_mapping() {
    for (format, input) in [
        ("protobuf", InputFormat::Protobuf),
        ("json_schema", InputFormat::JsonSchema),
    ] {
        // A registry each: a subject keeps the type of its first schema.
        let registry = Arc::new(Registry::start());
        let broker = broker();
        let bootstrap = broker.bootstrap_servers().to_string();
        let (b, r) = (bootstrap.clone(), registry.clone());
        blocking(move || registry::produce(&b, &r, DEMO_INPUT, format, 0, 100)).await;
        let running = start(settings(&bootstrap, &registry, input));
        let verdicts = support::read_records(&bootstrap, DEMO_VERDICTS, 2, 100).await;
        let summary = running.stop().await;
        if summary.dlq > 0 {
            let d = &support::read_records(&bootstrap, DEMO_DLQ, 1, 1).await[0];
            panic!(
                "{format}: {}",
                String::from_utf8_lossy(&d.headers["modstream.message"])
            );
        }
        assert_eq!((summary.verdicts, summary.dlq), (100, 0), "{format}");
        for r in &verdicts {
            let v: serde_json::Value = serde_json::from_slice(&r.payload).unwrap();
            assert!(v["event_id"].as_str().unwrap().starts_with(format), "{v}");
            assert_eq!(v["tenant"], "hiking", "{format}: {v}");
            assert!(v.get("warnings").is_none(), "{format}: {v}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_hung_for_20_s_dead_letters_nothing_and_the_partitions_resume() {
    let registry = Arc::new(Registry::start());
    let broker = broker();
    let bootstrap = broker.bootstrap_servers().to_string();
    let (b, r) = (bootstrap.clone(), registry.clone());
    blocking(move || registry::produce(&b, &r, DEMO_INPUT, "avro", 0, 100)).await;
    let running = start(settings(&bootstrap, &registry, InputFormat::Avro));
    assert_eq!(
        support::read_records(&bootstrap, DEMO_VERDICTS, 2, 100)
            .await
            .len(),
        100
    );
    // A producer with schema v2's id in its cache; then the registry hangs
    // (SIGSTOP: connections open, no answer) and v2 records arrive.
    let (b, r) = (bootstrap.clone(), registry.clone());
    let held = blocking(move || HeldProducer::start(&b, &r, DEMO_INPUT, "avro2", 100, 100)).await;
    registry.signal("-STOP");
    blocking(move || held.go()).await;
    let hung = Instant::now();
    let mut reported = None;
    while hung.elapsed() < Duration::from_secs(20) {
        if reported.is_none() {
            reported = running.health.registry_unreachable();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reason = reported.expect("/readyz reports the registry unreachable");
    assert!(reason.contains("records wait in order"), "{reason}");
    assert!(!running.health.ready(), "not ready while records wait");
    let during = count_now(&bootstrap, DEMO_VERDICTS).await;
    assert_eq!(during, 100, "v2 records wait for their schema");
    let dead = count_now(&bootstrap, DEMO_DLQ).await;
    assert_eq!(dead, 0, "nothing dead-lettered for the registry's outage");
    registry.signal("-CONT");
    let verdicts = support::read_records(&bootstrap, DEMO_VERDICTS, 2, 200).await;
    assert_eq!(verdicts.len(), 200, "the partitions resumed");
    assert_eq!(
        running.health.registry_unreachable(),
        None,
        "cleared once it answers"
    );
    let summary = running.stop().await;
    assert_eq!((summary.verdicts, summary.dlq), (200, 0));
}
