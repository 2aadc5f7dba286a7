//! Traces against a real backend: Jaeger v1.75.0 (scripts/fetch-jaeger.sh
//! builds it; `MODSTREAM_JAEGER` names it), receiving OTLP/HTTP on a free
//! port. The pipeline runs in-process on librdkafka's mock cluster with
//! `[tracing]` on: a post sent with a `traceparent` gets a verdict whose
//! `traceparent` continues the same trace from modstream's span of the
//! post, and Jaeger's query API returns that span and each model run's
//! span, linked to the posts of its batch.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use modstream::shutdown::Shutdown;
use modstream::tools::demo::{self, DEMO_INPUT, DEMO_VERDICTS};
use modstream::tools::embedded::EmbeddedBroker;

const PARTITIONS: i32 = 4;
const TRACED: usize = 10;
const UNTRACED: usize = 10;

fn jaeger_binary() -> PathBuf {
    let path = std::env::var_os("MODSTREAM_JAEGER").map_or_else(
        || modstream::inference::default_cache_dir().join("jaeger-1.75.0/jaeger"),
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "{} is missing: run scripts/test.sh (scripts/fetch-jaeger.sh builds it) or set MODSTREAM_JAEGER",
        path.display()
    );
    path
}

/// Jaeger with in-memory storage, OTLP/HTTP and its query API on free
/// ports of 127.0.0.1 (nothing else listening).
struct Jaeger {
    child: Child,
    otlp: u16,
    query: u16,
    _dir: tempfile::TempDir,
}

impl Jaeger {
    fn start() -> Jaeger {
        let dir = tempfile::tempdir().unwrap();
        let [otlp, query, query_grpc] = [(); 3].map(|()| support::free_port());
        let config = format!(
            "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: []
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"
        );
        let path = dir.path().join("jaeger.yaml");
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("jaeger.log")).unwrap();
        let child = Command::new(jaeger_binary())
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let mut jaeger = Jaeger {
            child,
            otlp,
            query,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(query, "/api/services").0 != 200 {
            let log = std::fs::read_to_string(jaeger._dir.path().join("jaeger.log"));
            assert!(
                jaeger.child.try_wait().unwrap().is_none() && Instant::now() < deadline,
                "Jaeger did not start: {log:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        jaeger
    }

    /// Every span of service `modstream`, as the query API returns them.
    fn spans(&self) -> Vec<serde_json::Value> {
        let (status, body) = get(
            self.query,
            "/api/traces?service=modstream&limit=1000&lookback=1h",
        );
        assert_eq!(status, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        (json["data"].as_array().unwrap().iter())
            .flat_map(|t| t["spans"].as_array().unwrap().clone())
            .collect()
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET over HTTP/1.0 (a whole body, never chunked): (status, body).
fn get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    if stream.read_to_string(&mut response).is_err() {
        return (0, String::new());
    }
    let status = (response.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = (response.split_once("\r\n\r\n"))
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Post `i`'s producer span: (trace id, span id), 32 and 16 hex digits.
fn producer_span(i: usize) -> (String, String) {
    (
        format!(
            "{:032x}",
            0xabc0_0000_0000_0000_0000_0000_0000_0000u128 + i as u128
        ),
        format!("{:016x}", 0x1000 + i),
    )
}

fn tag<'a>(span: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    (span["tags"].as_array()?.iter())
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posts_trace_goes_through_modstream_to_its_verdict_and_the_batch_links_its_posts() {
    let jaeger = Jaeger::start();
    let broker = EmbeddedBroker::start(&[
        (DEMO_INPUT, PARTITIONS),
        (DEMO_VERDICTS, PARTITIONS),
        (demo::DEMO_DLQ, 1),
    ])
    .unwrap();
    let bootstrap = broker.bootstrap_servers().to_string();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for i in 0..TRACED + UNTRACED {
        let id = format!("tr-{i}");
        let payload = format!(r#"{{"event_id":"{id}","text":"a post to follow, number {i}"}}"#);
        let mut record = FutureRecord::to(DEMO_INPUT).key(&id).payload(&payload);
        let parent;
        if i < TRACED {
            let (trace, span) = producer_span(i);
            parent = format!("00-{trace}-{span}-01");
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: "traceparent",
                value: Some(&parent),
            }));
        }
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let mut settings = demo::demo_settings(&bootstrap, "g-traces").unwrap();
    settings.tracing.endpoint = Some(format!("http://127.0.0.1:{}", jaeger.otlp));
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings, shutdown.clone()));
    let verdicts =
        support::read_records(&bootstrap, DEMO_VERDICTS, PARTITIONS, TRACED + UNTRACED).await;
    // Stopping sends the spans still held.
    shutdown.stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), pipeline)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // Each verdict's traceparent: the post's trace, modstream's span as parent.
    let mut verdict_span: HashMap<usize, (String, String)> = HashMap::new();
    for v in &verdicts {
        let json: serde_json::Value = serde_json::from_slice(&v.payload).unwrap();
        let i: usize = json["event_id"].as_str().unwrap()[3..].parse().unwrap();
        let header = String::from_utf8(v.headers["traceparent"].clone()).unwrap();
        let parts: Vec<&str> = header.split('-').collect();
        assert_eq!(parts.len(), 4, "{header}");
        if i < TRACED {
            let (trace, span) = producer_span(i);
            assert_eq!(parts[1], trace, "the post's trace goes on");
            assert_ne!(parts[2], span, "from modstream's span, not the producer's");
        } else {
            assert!((0..TRACED).all(|t| producer_span(t).0 != parts[1]));
        }
        verdict_span.insert(i, (parts[1].to_string(), parts[2].to_string()));
    }
    assert_eq!(
        verdict_span.len(),
        TRACED + UNTRACED,
        "one verdict per post"
    );

    // Jaeger has them: spans arrive within the exporter's timeout.
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = jaeger.spans();
        let posts = spans
            .iter()
            .filter(|s| s["operationName"] == format!("process {DEMO_INPUT}"))
            .count();
        if posts >= TRACED + UNTRACED || Instant::now() > deadline {
            break spans;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let by_id: HashMap<(&str, &str), &serde_json::Value> = spans
        .iter()
        .map(|s| {
            (
                (
                    s["traceID"].as_str().unwrap(),
                    s["spanID"].as_str().unwrap(),
                ),
                s,
            )
        })
        .collect();
    for i in 0..TRACED {
        let (trace, span) = &verdict_span[&i];
        let post = by_id
            .get(&(trace.as_str(), span.as_str()))
            .unwrap_or_else(|| panic!("post {i}'s span {trace}/{span} is not in Jaeger"));
        let parent = &producer_span(i).1;
        assert!(
            post["references"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["refType"] == "CHILD_OF" && r["spanID"] == parent.as_str()),
            "post {i}'s span is the child of its producer's: {post}"
        );
        assert_eq!(
            tag(post, "messaging.system").and_then(|v| v.as_str()),
            Some("kafka")
        );
        assert!(
            tag(post, "messaging.kafka.offset").is_some()
                && tag(post, "modstream.verdict").is_some()
        );
    }
    // The model runs' spans link to the posts of their batch, and only those.
    let runs: Vec<&serde_json::Value> = spans
        .iter()
        .filter(|s| s["operationName"].as_str().unwrap().starts_with("score "))
        .collect();
    assert!(!runs.is_empty(), "no model run's span in Jaeger");
    let traced: BTreeSet<String> = (0..TRACED).map(|i| producer_span(i).0).collect();
    let mut linked = BTreeSet::new();
    let mut scored = 0;
    for run in &runs {
        let own = run["traceID"].as_str().unwrap();
        let links: Vec<String> = (run["references"].as_array().unwrap().iter())
            .map(|r| r["traceID"].as_str().unwrap().to_string())
            .filter(|t| t != own)
            .collect();
        let size = tag(run, "messaging.batch.message_count")
            .and_then(|v| v.as_i64())
            .unwrap();
        assert!(links.len() as i64 <= size, "{run}");
        assert!(
            tag(run, "modstream.batch.wait_ms").is_some()
                && tag(run, "modstream.model_ms").is_some()
        );
        scored += size;
        linked.extend(links);
    }
    assert_eq!(
        linked, traced,
        "the batches link to exactly the posts that carried a trace"
    );
    assert_eq!(
        scored as usize,
        TRACED + UNTRACED,
        "every post in one run's batch"
    );
}
