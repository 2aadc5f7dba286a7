//! Test support for real-broker tests: Apache Kafka (`kafka`), `modstream
//! run` processes (`service`), loads (here and `load`), and what a run left
//! behind (`outputs`: the verifier that computes lost and duplicate
//! verdicts, committed offsets). Every process started here is killed when
//! its handle drops, also when a test panics.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::ClientConfig;

mod admin;
pub mod eos;
mod kafka;
pub mod load;
pub mod matching;
pub mod mock_faults;
mod outputs;
pub mod registry;
mod service;
#[allow(unused_imports)]
pub use admin::member_joins_and_leaves;
#[allow(unused_imports)]
pub use kafka::{Broker, Security, Tls, kafka_tool, kcat};
pub use outputs::*;
pub use service::*;

pub const INPUT: &str = "posts";
pub const VERDICTS: &str = "verdicts";
pub const DLQ: &str = "dlq";

/// The repository's root: the service's tests run there already; the
/// bench's (bench/tests, which share this module) one level down.
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .unwrap_or(&here)
        .to_path_buf()
}

/// The `modstream` binary: cargo names it to the service's tests; the
/// bench's find it where cargo builds it, beside their own deps/ folder
/// (`cargo test` in the workspace builds it first).
pub fn modstream_binary() -> PathBuf {
    let binary = option_env!("CARGO_BIN_EXE_modstream").map_or_else(
        || {
            let exe = std::env::current_exe().unwrap();
            // target/<profile>/deps/<test> → target/<profile>/modstream
            let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
            profile.join(format!("modstream{}", std::env::consts::EXE_SUFFIX))
        },
        PathBuf::from,
    );
    assert!(
        binary.is_file(),
        "{} is missing: run the tests of the whole workspace (cargo test), which builds it",
        binary.display()
    );
    binary
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The interpreter of a venv that scripts/test.sh made before `cargo test`
/// (`var` names it; else the cache's `venv`): tests never make one, since
/// two tests making the same venv at once break each other.
pub fn prepared_python(var: &str, venv: &str) -> PathBuf {
    let python = std::env::var_os(var).map_or_else(
        || {
            modstream::inference::default_cache_dir()
                .join(venv)
                .join("bin/python")
        },
        PathBuf::from,
    );
    assert!(
        python.is_file(),
        "{} is missing: run scripts/test.sh (it makes the venv first) or set {var}",
        python.display()
    );
    python
}

/// Valid events with ids `{prefix}{i}`, keyed by user.
pub fn events(prefix: &str, range: std::ops::Range<usize>) -> Vec<(String, String, Vec<u8>)> {
    let posts = modstream::tools::generator::sample_posts();
    range
        .map(|i| {
            let id = format!("{prefix}{i}");
            let key = format!("user-{}", i % 97);
            let text = posts[i % posts.len()].1;
            let payload = serde_json::json!({"event_id": id, "text": text})
                .to_string()
                .into_bytes();
            (id, key, payload)
        })
        .collect()
}

/// Produce to the input topic with acks=all; returns the ids the broker
/// acknowledged.
pub fn produce(bootstrap: &str, batch: &[(String, String, Vec<u8>)]) -> Vec<String> {
    produce_to(bootstrap, INPUT, batch)
}

/// [`produce`] to `topic`.
pub fn produce_to(
    bootstrap: &str,
    topic: &str,
    batch: &[(String, String, Vec<u8>)],
) -> Vec<String> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("message.timeout.ms", "60000")
        .create()
        .unwrap();
    for (_, key, payload) in batch {
        let mut record = BaseRecord::to(topic)
            .key(key.as_str())
            .payload(payload.as_slice());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(50));
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .expect("every input event acknowledged");
    batch.iter().map(|(id, _, _)| id.clone()).collect()
}

/// One record to one partition of `topic`, acknowledged.
pub fn produce_to_partition(bootstrap: &str, topic: &str, partition: i32, key: &str, value: &str) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .create()
        .unwrap();
    let record = BaseRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(value);
    producer.send(record).map_err(|(e, _)| e).unwrap();
    producer
        .flush(Duration::from_secs(60))
        .expect("the record acknowledged");
}

/// Produce `events` in a background thread at a steady rate over `over`:
/// a small chunk every 50 ms through one producer; returns the ids the
/// broker acknowledged (from the delivery reports, so a crash test knows
/// exactly which events the broker has). The load is steady, not bursts: a
/// service under it is at work at any moment, so a kill or a rebalance
/// lands while verdicts are being delivered, not in an idle gap after a
/// burst was committed. Sending does not wait for a chunk's
/// acknowledgements, so a broker slowed by the service's load does not
/// slow the rate (a flush per chunk on a busy machine kept an overload
/// test's producer under its rate).
pub fn produce_paced(
    bootstrap: String,
    events: Vec<(String, String, Vec<u8>)>,
    over: Duration,
) -> std::thread::JoinHandle<Vec<String>> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    const TICK: Duration = Duration::from_millis(50);
    std::thread::spawn(move || {
        let ticks = (over.as_millis() / TICK.as_millis()).max(1) as usize;
        let per = events.len().div_ceil(ticks).max(1);
        let producer: BaseProducer<Acked> = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("acks", "all")
            .set("message.timeout.ms", "60000")
            .create_with_context(Acked::default())
            .unwrap();
        let start = std::time::Instant::now();
        for (i, chunk) in events.chunks(per).enumerate() {
            for (id, key, payload) in chunk {
                let mut record = BaseRecord::with_opaque_to(INPUT, Box::new(id.clone()))
                    .key(key.as_str())
                    .payload(payload.as_slice());
                while let Err((_, r)) = producer.send(record) {
                    record = r;
                    producer.poll(Duration::from_millis(50));
                }
            }
            producer.poll(Duration::ZERO);
            let next = start + TICK * (i as u32 + 1);
            std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
        }
        producer
            .flush(Duration::from_secs(60))
            .expect("every input event reported");
        std::mem::take(&mut *producer.context().ids.lock().unwrap())
    })
}

/// [`produce_paced`]'s delivery reports: the ids the broker acknowledged.
#[derive(Default)]
struct Acked {
    ids: std::sync::Mutex<Vec<String>>,
}

impl rdkafka::ClientContext for Acked {}

impl rdkafka::producer::ProducerContext for Acked {
    type DeliveryOpaque = Box<String>;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, id: Box<String>) {
        if result.is_ok() {
            self.ids.lock().unwrap().push(*id);
        }
    }
}

/// Logs of in-process pipelines on stderr, when RUST_LOG is set.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        modstream::telemetry::init_logging(&Default::default());
    }
}

/// GET a path on 127.0.0.1:port: (status code, body); (0, "") while
/// nothing listens there yet.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// This test binary's Prometheus recorder, installed on first use: the
/// metrics of every pipeline the binary runs in-process.
pub fn metrics() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE.get_or_init(|| modstream::telemetry::install_recorder().unwrap())
}

/// The value of one series (`name{labels}` as the exposition writes it).
pub fn metric_value(series: &str) -> Option<f64> {
    metrics()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
