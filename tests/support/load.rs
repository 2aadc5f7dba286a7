//! Steady load and a clock on the verdicts, for the fault tests on a Kafka
//! cluster: events sent at a fixed rate (acks=all, one producer, its own
//! retries), and the arrival time of every verdict as a reader sees it, so
//! that the time without verdicts after a fault can be measured.

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
