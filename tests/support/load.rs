//! Steady load and readers of the verdicts, for the tests on a Kafka
//! cluster: events sent at a fixed rate (acks=all, one producer, its own
//! retries), from a list or generated as they go (a long soak), and the
//! arrival time of every verdict as a reader sees it (the time without
//! verdicts after a fault), or each event's copies and latency (the soak).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};

use modstream::tools::read::TopicReader;

use super::{INPUT, VERDICTS};

struct Acks(Arc<Mutex<Vec<String>>>);

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = Box<String>;
    fn delivery(&self, result: &DeliveryResult<'_>, id: Self::DeliveryOpaque) {
        if result.is_ok() {
            self.0.lock().unwrap().push(*id);
        }
    }
}

/// Sends `events` at `rate` per second (10 ms slices) in a background
/// thread with acks=all, idempotent; a record the cluster cannot take is retried by
/// librdkafka for up to `message.timeout.ms` = 180 s. Returns the ids the
/// cluster acknowledged, after a flush.
pub fn produce_steady(
    bootstrap: String,
    events: Vec<(String, String, Vec<u8>)>,
    rate: u32,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let producer: ThreadedProducer<Acks> = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("acks", "all")
            // Retries across a broker's death must not write an event twice
            // (the exactly-once tests count outputs per event).
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "180000")
            .create_with_context(Acks(acked.clone()))
            .unwrap();
        let started = Instant::now();
        for (i, (id, key, payload)) in events.iter().enumerate() {
            let due = started + Duration::from_secs_f64(i as f64 / f64::from(rate));
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let mut record = BaseRecord::with_opaque_to(INPUT, Box::new(id.clone()))
                .key(key.as_str())
                .payload(payload.as_slice());
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, r)) => {
                        record = r;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
        let _ = producer.flush(Duration::from_secs(200));
        std::mem::take(&mut *acked.lock().unwrap())
    })
}

/// Reads the verdict topic from the beginning in a background thread and
/// records when each verdict arrived, by input partition, until dropped.
pub struct VerdictClock {
    arrivals: Arc<Mutex<Vec<(i64, Instant)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl VerdictClock {
    pub fn start(bootstrap: &str) -> VerdictClock {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, s, b) = (arrivals.clone(), stop.clone(), bootstrap.to_string());
        let thread = std::thread::spawn(move || {
            let reader = TopicReader::from_beginning(&b, VERDICTS, None).unwrap();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(Some(record)) = reader.poll(Duration::from_millis(50)) {
                    let partition = record
                        .json()
                        .and_then(|v| v["source"]["partition"].as_i64())
                        .unwrap_or(-1);
                    a.lock().unwrap().push((partition, Instant::now()));
                }
            }
        });
        VerdictClock {
            arrivals,
            stop,
            thread: Some(thread),
        }
    }

    /// The longest time an input partition went without a verdict between
    /// `from` and `to` (from `from` to its first verdict after it, between
    /// verdicts, and from its last one to `to`), over every partition that
    /// had verdicts before `from`.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let arrivals = self.arrivals.lock().unwrap();
        let mut partitions: Vec<i64> = arrivals
            .iter()
            .filter(|(_, t)| *t <= from)
            .map(|(p, _)| *p)
            .collect();
        partitions.sort_unstable();
        partitions.dedup();
        let mut longest = Duration::ZERO;
        for partition in partitions {
            let mut last = from;
            for &(_, t) in arrivals
                .iter()
                .filter(|(p, t)| *p == partition && *t > from && *t <= to)
            {
                longest = longest.max(t - last);
                last = t;
            }
            longest = longest.max(to.saturating_duration_since(last));
        }
        longest
    }

    pub fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

impl Drop for VerdictClock {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The event ids of the soak's events: `soak-{i}`.
pub const PREFIX: &str = "soak-";

/// What the verdict reader has seen.
#[derive(Default)]
struct Seen {
    /// Copies per event, by its index (event ids `soak-{i}`).
    copies: Vec<u8>,
    total: usize,
    /// `latency_ms` of the verdicts read since the last sample.
    window: Vec<i64>,
    /// The timestamps of the backlog's verdicts.
    backlog: Vec<i64>,
}

/// Reads the verdict topic from its beginning in a background thread.
pub struct VerdictReader {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl VerdictReader {
    /// Events below `backlog` are the saturation's backlog.
    pub fn start(bootstrap: &str, backlog: usize) -> VerdictReader {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, b) = (seen.clone(), stop.clone(), bootstrap.to_string());
        let thread = std::thread::spawn(move || {
            let reader = TopicReader::from_beginning(&b, VERDICTS, None).unwrap();
            while !st.load(Ordering::Relaxed) {
                let Ok(Some(record)) = reader.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let Some(v) = record.json() else { continue };
                let Some(index) = v["event_id"]
                    .as_str()
                    .and_then(|id| id.strip_prefix(PREFIX)?.parse::<usize>().ok())
                else {
                    continue;
                };
                let mut seen = s.lock().unwrap();
                if seen.copies.len() <= index {
                    seen.copies.resize(index + 1, 0);
                }
                seen.copies[index] = seen.copies[index].saturating_add(1);
                seen.total += 1;
                if let Some(latency) = v["latency_ms"].as_i64() {
                    seen.window.push(latency);
                }
                if let Some(t) = record.timestamp_ms.filter(|_| index < backlog) {
                    seen.backlog.push(t);
                }
            }
        });
        VerdictReader {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Distinct events below `n` with a verdict (the backlog's).
    pub fn distinct_below(&self, n: usize) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.copies.iter().take(n).filter(|c| **c > 0).count()
    }

    /// The backlog's verdicts per second in its steady middle: from the
    /// 5 % to the 95 % verdict by their timestamps (the first runs start
    /// cold, the last partitions finish alone).
    pub fn backlog_rate(&self) -> f64 {
        let mut times = self.seen.lock().unwrap().backlog.clone();
        times.sort_unstable();
        let (lo, hi) = (times.len() / 20, times.len() * 19 / 20);
        (hi - lo) as f64 / ((times[hi] - times[lo]).max(1) as f64 / 1000.0)
    }

    pub fn take_window(&self) -> (Vec<i64>, usize) {
        let mut seen = self.seen.lock().unwrap();
        let window = std::mem::take(&mut seen.window);
        let read = window.len();
        (window, read)
    }

    pub fn lost(&self, wanted: &[usize]) -> usize {
        let seen = self.seen.lock().unwrap();
        wanted
            .iter()
            .filter(|&&i| seen.copies.get(i).is_none_or(|c| *c == 0))
            .count()
    }

    pub fn duplicates(&self) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.total - seen.copies.iter().filter(|c| **c > 0).count()
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct IndexAcks(Arc<Mutex<Vec<usize>>>);

impl ClientContext for IndexAcks {}

impl ProducerContext for IndexAcks {
    type DeliveryOpaque = usize;
    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        if result.is_ok() {
            self.0.lock().unwrap().push(index);
        }
    }
}

/// Events `soak-{from}`.. sent at `rate` per second in 10 ms slices for
/// `duration`, generated as they go (a long soak holds no list of them).
pub struct PacedLoad {
    thread: std::thread::JoinHandle<Vec<usize>>,
}

impl PacedLoad {
    pub fn start(bootstrap: &str, from: usize, rate: u32, duration: Duration) -> PacedLoad {
        let bootstrap = bootstrap.to_string();
        let thread = std::thread::spawn(move || {
            let acked = Arc::new(Mutex::new(Vec::new()));
            let producer: ThreadedProducer<IndexAcks> = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("acks", "all")
                .set("enable.idempotence", "true")
                .set("linger.ms", "5")
                .set("message.timeout.ms", "180000")
                .create_with_context(IndexAcks(acked.clone()))
                .unwrap();
            let started = Instant::now();
            let mut next = from;
            let mut slice = 0u64;
            while started.elapsed() < duration {
                slice += 1;
                let due = (u64::from(rate) * slice / 100) as usize + from;
                for (id, key, payload) in super::events(PREFIX, next..due) {
                    let index: usize = id[PREFIX.len()..].parse().unwrap();
                    let mut record = BaseRecord::with_opaque_to(INPUT, index)
                        .key(key.as_str())
                        .payload(payload.as_slice());
                    loop {
                        match producer.send(record) {
                            Ok(()) => break,
                            Err((_, r)) => {
                                record = r;
                                std::thread::sleep(Duration::from_millis(10));
                            }
                        }
                    }
                }
                next = due.max(next);
                let wake = started + Duration::from_millis(10 * slice);
                if let Some(wait) = wake.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let _ = producer.flush(Duration::from_secs(200));
            std::mem::take(&mut *acked.lock().unwrap())
        });
        PacedLoad { thread }
    }

    /// Wait for the last events to be acknowledged; the acknowledged indices.
    pub fn finish(self) -> Vec<usize> {
        self.thread.join().unwrap()
    }
}
