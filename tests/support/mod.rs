//! Test support for real-broker tests: Apache Kafka (`kafka`), `modstream
//! run` processes, and the verifier that computes lost and duplicate verdicts.
//! Every process started here is killed when its handle drops, also when a
//! test panics.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use modstream::tools::read::TopicReader;

pub mod eos;
mod kafka;
pub mod load;
pub mod mock_faults;
pub mod registry;
#[allow(unused_imports)]
pub use kafka::{Broker, Security, Tls, kafka_tool};

pub const INPUT: &str = "posts";
pub const VERDICTS: &str = "verdicts";
pub const DLQ: &str = "dlq";

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

/// A `modstream run` process configured by file.
pub struct Modstream {
    child: Option<Child>,
    pub name: String,
    /// How the process ended, once it was seen to end by itself.
    exited: Option<std::process::ExitStatus>,
}

pub fn write_config(dir: &Path, bootstrap: &str, group: &str) -> PathBuf {
    write_config_with(dir, bootstrap, group, &[])
}

/// [`write_config`] with librdkafka properties for both clients (security).
pub fn write_config_with(
    dir: &Path,
    bootstrap: &str,
    group: &str,
    client_props: &[(&str, &str)],
) -> PathBuf {
    let props: String = client_props
        .iter()
        .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
        .collect();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/profanity-check");
    let path = dir.join(format!("{group}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
drain_timeout = "3s"
commit_interval = "500ms"
[kafka.consumer]
"session.timeout.ms" = 6000
"heartbeat.interval.ms" = 500
"max.poll.interval.ms" = 20000
"group.protocol" = "classic"
{props}[kafka.producer]
"linger.ms" = 2
{props}
[input]
topics = ["{INPUT}"]
[output]
topic = "{VERDICTS}"
dlq_topic = "{DLQ}"
[batching]
max_batch_size = 32
max_batch_delay = "10ms"
[inference]
model_dir = "{}"
[telemetry]
# Several services run at once: each takes a free port.
listen = "127.0.0.1:0"
"#,
            model.display()
        ),
    )
    .unwrap();
    path
}

impl Modstream {
    pub fn start(config: &Path, name: &str, log_dir: &Path) -> Modstream {
        // MODSTREAM_TEST_LOGDIR keeps the service logs after the test.
        let kept = std::env::var_os("MODSTREAM_TEST_LOGDIR").map(PathBuf::from);
        let log_dir = kept.as_deref().unwrap_or(log_dir);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_dir.join(format!("{name}.log")))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_modstream"))
            .args(["run", "--config"])
            .arg(config)
            .env(
                "RUST_LOG",
                std::env::var("MODSTREAM_TEST_LOG").unwrap_or_else(|_| "modstream=info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("modstream starts");
        Modstream {
            child: Some(child),
            name: name.to_string(),
            exited: None,
        }
    }

    /// Take over a process started elsewhere (killed on drop).
    pub fn adopt(child: Child, name: &str) -> Modstream {
        Modstream {
            child: Some(child),
            name: name.to_string(),
            exited: None,
        }
    }

    /// SIGKILL: no drain, no commit.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for a clean exit; returns whether it exited 0.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                if !status.success() {
                    println!("{}: exited with {status} after SIGTERM", self.name);
                }
                return status.success();
            }
            if Instant::now() > deadline {
                println!(
                    "{}: still running {timeout:?} after SIGTERM; killed",
                    self.name
                );
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the process.
    pub fn signal(&self, signal: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &c.id().to_string()])
                .status();
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait().unwrap() {
            None => true,
            Some(status) => {
                self.exited = Some(status);
                self.child = None;
                false
            }
        }
    }

    /// The exit code of a process that ended by itself (seen by
    /// [`Modstream::is_running`]); None while it runs or if it was killed.
    pub fn exit_code(&mut self) -> Option<i32> {
        self.is_running();
        self.exited.and_then(|s| s.code())
    }
}

impl Drop for Modstream {
    fn drop(&mut self) {
        self.kill9();
    }
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

/// Produce with acks=all; returns the ids the broker acknowledged.
pub fn produce(bootstrap: &str, batch: &[(String, String, Vec<u8>)]) -> Vec<String> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("message.timeout.ms", "60000")
        .create()
        .unwrap();
    for (_, key, payload) in batch {
        let mut record = BaseRecord::to(INPUT)
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

/// Produce `events` in a background thread in 20 chunks paced over
/// `over`, each chunk acknowledged before the next (so a crash test knows
/// exactly which events the broker has); returns the acknowledged ids.
pub fn produce_paced(
    bootstrap: String,
    events: Vec<(String, String, Vec<u8>)>,
    over: Duration,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let chunks = 20;
        let per = events.len().div_ceil(chunks);
        let mut acked = Vec::new();
        for chunk in events.chunks(per) {
            acked.extend(produce(&bootstrap, chunk));
            std::thread::sleep(over / chunks as u32);
        }
        acked
    })
}

/// What the verdict topic says about a set of acknowledged input ids.
#[derive(Debug)]
pub struct Verification {
    pub acked_inputs: usize,
    pub verdicts: usize,
    pub distinct: usize,
    pub lost: Vec<String>,
    pub duplicates: usize,
    /// copies per id → how many ids had that many copies
    pub histogram: BTreeMap<usize, usize>,
    /// (partition, source offset) of every verdict
    pub sources: HashSet<(i32, i64)>,
}

impl Verification {
    /// Print lost / duplicates and keep a row for docs/reliability.md
    /// (scripts/reliability-table.sh collects the rows).
    pub fn report(&self, scenario: &str) {
        let row = serde_json::json!({
            "scenario": scenario,
            "acked_inputs": self.acked_inputs,
            "verdicts": self.verdicts,
            "lost": self.lost.len(),
            "duplicates": self.duplicates,
            "copies_histogram": self.histogram.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        });
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability");
        let _ = std::fs::create_dir_all(&dir);
        let file: String = scenario
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let _ = std::fs::write(dir.join(format!("{file}.json")), row.to_string());
        println!(
            "{scenario}: acked inputs {}, verdicts {}, distinct {}, lost {}, duplicates {}, copies histogram {:?}",
            self.acked_inputs,
            self.verdicts,
            self.distinct,
            self.lost.len(),
            self.duplicates,
            self.histogram
        );
        if !self.lost.is_empty() {
            let mut lost = self.lost.clone();
            lost.sort();
            println!(
                "{scenario}: lost ids (first 20): {:?}",
                &lost[..lost.len().min(20)]
            );
        }
    }
}

/// Read the verdict topic to its end with a fresh group (until `want`
/// distinct acked ids are seen or `timeout`), then compute lost/duplicates.
pub fn verify(bootstrap: &str, acked: &[String], timeout: Duration) -> Verification {
    let reader = TopicReader::from_beginning(bootstrap, VERDICTS, None).unwrap();
    let wanted: HashSet<&str> = acked.iter().map(String::as_str).collect();
    let mut copies: HashMap<String, usize> = HashMap::new();
    let mut sources = HashSet::new();
    let mut verdicts = 0;
    let deadline = Instant::now() + timeout;
    let mut quiet_since = Instant::now();
    loop {
        let seen_all = wanted.iter().all(|id| copies.contains_key(*id));
        // Once everything is there, read a little longer so duplicates show.
        if (seen_all && quiet_since.elapsed() > Duration::from_secs(1)) || Instant::now() > deadline
        {
            break;
        }
        match reader.poll(Duration::from_millis(100)) {
            Ok(Some(m)) => {
                let v = m.json().expect("verdict JSON");
                let id = v["event_id"].as_str().unwrap().to_string();
                sources.insert((
                    v["source"]["partition"].as_i64().unwrap() as i32,
                    v["source"]["offset"].as_i64().unwrap(),
                ));
                *copies.entry(id).or_default() += 1;
                verdicts += 1;
                quiet_since = Instant::now();
            }
            Err(e) => panic!("verifier read failed: {e}"),
            Ok(None) => {}
        }
    }
    let lost: Vec<String> = acked
        .iter()
        .filter(|id| !copies.contains_key(*id))
        .cloned()
        .collect();
    let mut histogram = BTreeMap::new();
    for n in copies.values() {
        *histogram.entry(*n).or_default() += 1;
    }
    Verification {
        acked_inputs: acked.len(),
        verdicts,
        distinct: copies.len(),
        duplicates: verdicts - copies.len(),
        lost,
        histogram,
        sources,
    }
}

/// Committed offset per input partition for `group` (-1 when none).
pub fn committed(bootstrap: &str, group: &str, partitions: i32) -> Vec<i64> {
    committed_on(bootstrap, group, INPUT, partitions)
}

/// Committed offset per partition of `topic` for `group` (-1 when none).
pub fn committed_on(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // Real Kafka creates its offsets topic at the first group request: the
    // coordinator may answer "not coordinator" for a few seconds.
    let deadline = Instant::now() + Duration::from_secs(30);
    let c = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                println!("committed offsets of {group} not readable yet: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("committed offsets of {group}: {e}"),
        }
    };
    (0..partitions)
        .map(|p| match c.find_partition(topic, p).unwrap().offset() {
            Offset::Offset(o) => o,
            _ => -1,
        })
        .collect()
}

/// Samples `group`'s committed offsets of the input every 200 ms in a
/// background thread, until stopped: a committed offset that ever moves
/// backwards shows a member committing work it no longer owned.
pub struct CommitWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<i64>>>,
}

impl CommitWatch {
    pub fn start(bootstrap: &str, group: &str, partitions: i32) -> CommitWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(INPUT, p);
        }
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(c) = consumer.committed_offsets(tpl.clone(), Duration::from_secs(5)) {
                    samples.push(
                        (0..partitions)
                            .map(|p| match c.find_partition(INPUT, p).map(|e| e.offset()) {
                                Some(Offset::Offset(o)) => o,
                                _ => -1,
                            })
                            .collect(),
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            samples
        });
        CommitWatch { stop, thread }
    }

    /// Stop sampling; asserts no partition's committed offset ever moved
    /// backwards, and returns how many samples were taken.
    pub fn never_backwards(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let samples = self.thread.join().unwrap();
        for pair in samples.windows(2) {
            for (p, (before, after)) in pair[0].iter().zip(&pair[1]).enumerate() {
                assert!(
                    after >= before,
                    "partition {p}: committed offset moved back from {before} to {after}"
                );
            }
        }
        samples.len()
    }
}

/// (partition, source offset) of every verdict in the topic now: reads each
/// partition up to its current high watermark.
pub fn verdict_sources(bootstrap: &str) -> HashSet<(i32, i64)> {
    TopicReader::from_beginning(bootstrap, VERDICTS, None)
        .unwrap()
        .read_to_end(Duration::from_secs(60))
        .expect("could not read the verdict topic to its end")
        .iter()
        .map(|r| {
            let v = r.json().expect("verdict JSON");
            (
                v["source"]["partition"].as_i64().unwrap() as i32,
                v["source"]["offset"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// Records in the verdict topic now (sum of high watermarks); asks again
/// for up to 60 s while a broker is down.
pub fn verdict_count(bootstrap: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let count = consumer
            .fetch_metadata(Some(VERDICTS), Duration::from_secs(10))
            .and_then(|metadata| {
                let partitions = metadata.topics()[0].partitions().len() as i32;
                (0..partitions)
                    .map(|p| {
                        consumer
                            .fetch_watermarks(VERDICTS, p, Duration::from_secs(10))
                            .map(|w| w.1)
                    })
                    .sum::<Result<i64, _>>()
            });
        match count {
            Ok(n) => return n,
            Err(e) if Instant::now() < deadline => {
                println!("verdict count not readable yet: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("verdict count: {e}"),
        }
    }
}

/// Wait until the verdict topic grew by `by` records (or `timeout` passed).
pub fn wait_for_progress(bootstrap: &str, by: i64, timeout: Duration) -> bool {
    let start = verdict_count(bootstrap);
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if verdict_count(bootstrap) >= start + by {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// Logs of in-process pipelines on stderr, when RUST_LOG is set.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        modstream::telemetry::init_logging(&Default::default());
    }
}

/// GET a path on 127.0.0.1:port: (status code, body).
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
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

/// The end (high watermark) of every input partition now (-2: unreadable).
pub fn input_ends(bootstrap: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(INPUT, p, Duration::from_secs(10))
                .map_or(-2, |w| w.1)
        })
        .collect()
}

/// Wait until `group`'s committed offset of every input partition is that
/// partition's end (true), or `timeout` passed (false).
pub fn wait_for_committed_end(
    bootstrap: &str,
    group: &str,
    partitions: i32,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let ends = input_ends(bootstrap, partitions);
        let committed = committed(bootstrap, group, partitions);
        if committed == ends {
            return true;
        }
        if Instant::now() > deadline {
            println!("committed {committed:?}, ends {ends:?}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The log a [`Modstream`] named `name` wrote under `dir` (or under
/// MODSTREAM_TEST_LOGDIR when set); empty if there is none.
pub fn log_of(dir: &Path, name: &str) -> String {
    let dir =
        std::env::var_os("MODSTREAM_TEST_LOGDIR").map_or_else(|| dir.to_path_buf(), Into::into);
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// Every record of `topic` now: each partition read to its high watermark,
/// off the async runtime.
pub async fn read_to_end(bootstrap: &str, topic: &str) -> Vec<modstream::tools::read::ReadRecord> {
    let (b, t) = (bootstrap.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        TopicReader::from_beginning(&b, &t, None)
            .unwrap()
            .read_to_end(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("could not read {t} to its end: {e}"))
    })
    .await
    .unwrap()
}

/// The event ids of these records (JSON values with an `event_id`), each
/// with how many records carry it.
pub fn event_id_counts(records: &[modstream::tools::read::ReadRecord]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for r in records {
        let v = r.json().expect("a JSON record");
        let id = v["event_id"].as_str().expect("an event_id").to_string();
        *counts.entry(id).or_default() += 1;
    }
    counts
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

/// `topic` read from its beginning until `want` records arrived or 60 s
/// passed, off the async runtime.
pub async fn read_records(
    bootstrap: &str,
    topic: &'static str,
    partitions: i32,
    want: usize,
) -> Vec<modstream::tools::read::ReadRecord> {
    let b = bootstrap.to_string();
    tokio::task::spawn_blocking(move || {
        modstream::tools::read::read_topic(&b, topic, partitions, want, Duration::from_secs(60))
    })
    .await
    .unwrap()
    .unwrap()
}
