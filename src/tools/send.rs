//! Sending generated events to a topic: a producer for them, enqueueing
//! without waiting, and the paced open-loop sender used by `produce`,
//! `bench` and the tests.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use super::generator::GeneratedEvent;

/// A producer for generated events.
pub fn event_producer(bootstrap: &str) -> Result<FutureProducer, KafkaError> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
}

/// Produce records to `topic` and wait until the broker has all of them.
pub async fn produce_all(
    bootstrap: &str,
    topic: &str,
    events: &[GeneratedEvent],
) -> Result<(), KafkaError> {
    produce_with(&event_producer(bootstrap)?, topic, events).await
}

/// [`produce_all`] with a producer the caller keeps.
pub async fn produce_with(
    producer: &FutureProducer,
    topic: &str,
    events: &[GeneratedEvent],
) -> Result<(), KafkaError> {
    // In chunks below librdkafka's queue (queue.buffering.max.messages,
    // 100,000 by default).
    for chunk in events.chunks(50_000) {
        await_deliveries(enqueue(producer, topic, chunk, None).await?).await?;
    }
    Ok(())
}

/// Hand records to the producer without waiting for acknowledgements (an
/// open-loop load generator must not slow down when the broker does).
/// With `intended = (first_ms, ms_per_event)` each record's Kafka timestamp
/// is its *intended* send time: a paced generator that falls behind then
/// shows up in modstream's end-to-end latency instead of hiding it (no
/// coordinated omission). A full local queue (more records than
/// librdkafka holds unsent) waits for room: the broker is then the limit,
/// and a generator cannot go faster than it anyway.
pub async fn enqueue(
    producer: &FutureProducer,
    topic: &str,
    events: &[GeneratedEvent],
    intended: Option<(i64, f64)>,
) -> Result<Vec<DeliveryFuture>, KafkaError> {
    let mut pending = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let mut record = FutureRecord::to(topic)
            .key(e.key.as_bytes())
            .payload(e.payload.as_slice());
        if let Some((first_ms, step_ms)) = intended {
            record = record.timestamp(first_ms + (i as f64 * step_ms) as i64);
        }
        let mut waited = Duration::ZERO;
        let delivery = loop {
            match producer.send_result(record) {
                Ok(delivery) => break delivery,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if waited < QUEUE_FULL_PATIENCE =>
                {
                    record = back;
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                    waited += QUEUE_FULL_PAUSE;
                }
                Err((e, _)) => return Err(e),
            }
        };
        pending.push(delivery);
    }
    Ok(pending)
}

/// How long a full local queue may keep one record waiting before the send
/// fails (a broker that takes nothing for that long is down), and the
/// pause between tries.
const QUEUE_FULL_PATIENCE: Duration = Duration::from_secs(60);
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(1);

/// Wait until the broker acknowledged every enqueued record.
pub async fn await_deliveries(pending: Vec<DeliveryFuture>) -> Result<(), KafkaError> {
    for f in pending {
        match f.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(e),
            Err(_) => return Err(KafkaError::Canceled),
        }
    }
    Ok(())
}

/// When and how fast [`send_paced`] sends.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// When the first event is due.
    pub start: Instant,
    /// Events per second; 0 sends everything at once.
    pub rate: f64,
    /// Stamp each record with its intended send time (see [`enqueue`]),
    /// `start` being this wall-clock time in ms.
    pub stamp_from_ms: Option<i64>,
}

impl Schedule {
    /// When event `i` is due.
    pub fn due(&self, i: usize) -> Instant {
        if self.rate > 0.0 {
            self.start + Duration::from_secs_f64(i as f64 / self.rate)
        } else {
            self.start
        }
    }
}

/// Open loop: send `events` on `schedule` in slices of 10 ms (so that the
/// rate holds without bursts), never waiting for acknowledgements; calls
/// `after_slice(sent so far)` after each slice. Returns the deliveries to
/// await.
pub async fn send_paced(
    producer: &FutureProducer,
    topic: &str,
    events: &[GeneratedEvent],
    schedule: Schedule,
    mut after_slice: impl FnMut(usize),
) -> Result<Vec<DeliveryFuture>, KafkaError> {
    let slice = if schedule.rate > 0.0 {
        ((schedule.rate / 100.0) as usize).max(1)
    } else {
        events.len().max(1)
    };
    let mut pending = Vec::with_capacity(events.len());
    for (i, chunk) in events.chunks(slice).enumerate() {
        let first = i * slice;
        tokio::time::sleep_until(schedule.due(first).into()).await;
        let intended = schedule
            .stamp_from_ms
            .filter(|_| schedule.rate > 0.0)
            .map(|ms| {
                let step = 1000.0 / schedule.rate;
                (ms + (first as f64 * step) as i64, step)
            });
        pending.extend(enqueue(producer, topic, chunk, intended).await?);
        after_slice(pending.len());
    }
    Ok(pending)
}
