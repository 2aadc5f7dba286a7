//! What a run left behind, read back: verdicts against the acknowledged
//! inputs (lost, duplicates), committed offsets (now, or watched over a
//! run), the ends of the input, whole topics.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use modstream::tools::read::TopicReader;

use super::{INPUT, VERDICTS};

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

/// Where each lost id is, printed (a failure's evidence, asserts nothing):
/// its input partition and offset (every copy the input holds), the
/// group's committed offset there, the verdict source offsets of that
/// partition around it, and a dead letter naming it, if one does.
pub fn trace_lost(bootstrap: &str, lost: &[String], sources: &HashSet<(i32, i64)>, group: &str) {
    if lost.is_empty() {
        return;
    }
    let wanted: HashSet<&str> = lost.iter().map(String::as_str).collect();
    let read = |topic: &str| {
        TopicReader::from_beginning(bootstrap, topic, None)
            .and_then(|r| r.read_to_end(Duration::from_secs(30)))
            .unwrap_or_else(|e| {
                println!("lost: {topic} not readable: {e}");
                Vec::new()
            })
    };
    let named = |r: &modstream::tools::read::ReadRecord, field: &str| {
        let v = r.json()?;
        let id = v.get(field)?.as_str()?.to_string();
        wanted.contains(id.as_str()).then_some((id, v))
    };
    let input = read(INPUT);
    let partitions = input.iter().map(|r| r.partition + 1).max().unwrap_or(0);
    let committed = committed(bootstrap, group, partitions);
    for r in &input {
        let Some((id, _)) = named(r, "event_id") else {
            continue;
        };
        let p = r.partition;
        let near: Vec<i64> = (r.offset - 3..=r.offset + 3)
            .filter(|o| sources.contains(&(p, *o)))
            .collect();
        println!(
            "lost {id}: input {p}@{}, committed {:?}, verdicts from {p}@{near:?}",
            r.offset,
            committed.get(p as usize)
        );
    }
    for r in read(super::DLQ) {
        if let Some((id, _)) = named(&r, "event_id") {
            let headers: Vec<(&String, String)> = (r.headers.iter())
                .map(|(k, v)| (k, String::from_utf8_lossy(v).into_owned()))
                .collect();
            println!(
                "lost {id}: dead letter {}@{}, headers {headers:?}",
                r.partition, r.offset
            );
        }
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
