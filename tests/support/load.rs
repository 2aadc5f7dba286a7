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
/// thread with acks=all; a record the cluster cannot take is retried by
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
        let ids = acked.lock().unwrap().clone();
        ids
    })
}

/// Reads the verdict topic from the beginning in a background thread and
/// records when each verdict arrived, until `stop` is set.
pub struct VerdictClock {
    arrivals: Arc<Mutex<Vec<Instant>>>,
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
                if let Ok(Some(_)) = reader.poll(Duration::from_millis(50)) {
                    a.lock().unwrap().push(Instant::now());
                }
            }
        });
        VerdictClock {
            arrivals,
            stop,
            thread: Some(thread),
        }
    }

    /// The longest time without a verdict between `from` and `to`
    /// (counting from `from` to the first verdict after it).
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let arrivals = self.arrivals.lock().unwrap();
        let mut last = from;
        let mut longest = Duration::ZERO;
        for &t in arrivals.iter().filter(|t| **t > from && **t <= to) {
            longest = longest.max(t - last);
            last = t;
        }
        longest.max(to.saturating_duration_since(last).min(to - from))
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
