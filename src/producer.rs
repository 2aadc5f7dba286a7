//! Delivery of verdicts and dead-letter records.
//!
//! Guarantee: [`Sink::deliver`] hands a record to librdkafka at once (so the
//! produce order is the call order), then resolves only when the broker has
//! acknowledged it (`acks=all`, idempotent producer). A transient failure is
//! retried with backoff until it succeeds or the caller gives up through the
//! cancellation token (which also ends a wait for librdkafka); the caller
//! marks an offset delivered only on `Ok`. A record the broker can never
//! take (too large, malformed) is not retried as it is: a dead-letter record
//! is sent again with its value cut to a budget, then without value and
//! input headers; past that, and for a verdict, the delivery ends with
//! [`ProducerError::Rejected`] so that its partition is not pinned. A fatal
//! client error (idempotence broken) is not retried: it ends the delivery
//! with [`ProducerError::Fatal`] and the pipeline stops.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;

use crate::config::KafkaSettings;
use crate::consumer::Tp;
use crate::telemetry::metric;
use crate::verdict::header;

#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    #[error("cannot create the Kafka producer")]
    Create(#[source] KafkaError),
    #[error("delivery abandoned at shutdown")]
    Abandoned,
    /// The broker refuses this record whatever is retried (and, for a
    /// dead-letter record, also its cut-down forms).
    #[error("the broker refuses this record: {0}")]
    Rejected(String),
    /// The idempotent producer hit a fatal error (e.g. a broken sequence):
    /// librdkafka will not deliver anything more from this client.
    #[error("fatal producer error: {0}")]
    Fatal(String),
    /// Deliveries to a topic failed for the whole service (not authorized,
    /// topic missing) for `kafka.service_failure_timeout`.
    #[error(
        "deliveries to {topic} failed for {lasted_s} s (kafka.service_failure_timeout): {error}"
    )]
    Service {
        topic: String,
        lasted_s: u64,
        error: String,
    },
}

/// Errors that sending the same record again cannot fix: it is too large or
/// malformed for the broker.
pub fn is_permanent_for_record(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::MessageBatchTooLarge
                | C::InvalidMessage
                | C::InvalidRecord
        )
    )
}

/// Errors that concern every record to a topic, not one record: the client
/// is not authorized, or the topic does not exist. Retried, but if they
/// last `kafka.service_failure_timeout` the service stops with the reason.
pub fn is_service_level(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::InvalidTopic
        )
    )
}

/// Service-level delivery failures now, by topic: since when, and the last
/// error. Written by the delivery tasks, read by the hub's watchdog.
#[derive(Default)]
struct ServiceFailures(std::sync::Mutex<HashMap<String, (std::time::Instant, String)>>);

impl ServiceFailures {
    fn failed(&self, topic: &str, error: &KafkaError) {
        if let Ok(mut f) = self.0.lock() {
            let entry = f
                .entry(topic.to_string())
                .or_insert_with(|| (std::time::Instant::now(), String::new()));
            entry.1 = error.to_string();
        }
    }

    fn delivered(&self, topic: &str) {
        if let Ok(mut f) = self.0.lock()
            && !f.is_empty()
        {
            f.remove(topic);
        }
    }

    /// The longest-lasting one: (topic, how long, last error).
    fn oldest(&self) -> Option<(String, std::time::Duration, String)> {
        let f = self.0.lock().ok()?;
        f.iter()
            .min_by_key(|(_, (since, _))| *since)
            .map(|(t, (since, e))| (t.clone(), since.elapsed(), e.clone()))
    }
}

/// A record to produce, owned so that it can be sent again on failure.
#[derive(Debug, Clone)]
pub struct OutRecord {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    /// `None` is a null value.
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(Cow<'static, str>, Option<Vec<u8>>)>,
    /// Kafka timestamp (ms); `None`: the producer's clock.
    pub timestamp_ms: Option<i64>,
    /// "verdict" or "dlq", for metrics and logs.
    pub kind: &'static str,
}

impl OutRecord {
    /// The record as librdkafka takes it.
    pub fn as_future_record(&self) -> FutureRecord<'_, [u8], [u8]> {
        let mut record = FutureRecord::to(&self.topic);
        if let Some(payload) = &self.payload {
            record = record.payload(payload.as_slice());
        }
        if let Some(key) = &self.key {
            record = record.key(key.as_slice());
        }
        if let Some(ts) = self.timestamp_ms {
            record = record.timestamp(ts);
        }
        if !self.headers.is_empty() {
            let headers = self
                .headers
                .iter()
                .fold(OwnedHeaders::new(), |h, (key, value)| {
                    h.insert(Header {
                        key: key.as_ref(),
                        value: value.as_deref(),
                    })
                });
            record = record.headers(headers);
        }
        record
    }

    /// The next smaller form of a dead-letter record the broker refused: the
    /// value cut to `budget` bytes, then no value and no input headers
    /// (modstream's headers stay: they say where the original lives).
    /// `None` when there is nothing left to cut, or for a verdict.
    fn cut_down(&self, budget: usize) -> Option<OutRecord> {
        if self.kind != "dlq" {
            return None;
        }
        let size = self.payload.as_ref().map_or(0, Vec::len);
        let truncated = self.headers.iter().any(|(k, _)| k == header::TRUNCATED);
        let mut cut = self.clone();
        if !truncated && size > budget {
            if let Some(p) = cut.payload.as_mut() {
                p.truncate(budget);
            }
            cut.headers
                .push((Cow::Borrowed(header::TRUNCATED), Some(b"value".to_vec())));
            cut.headers.push((
                Cow::Borrowed(header::ORIGINAL_SIZE),
                Some(size.to_string().into_bytes()),
            ));
            return Some(cut);
        }
        let input_headers = cut
            .headers
            .iter()
            .any(|(k, _)| !k.starts_with("modstream."));
        if size == 0 && !input_headers {
            return None;
        }
        cut.payload = cut.payload.map(|_| Vec::new());
        cut.headers.retain(|(k, _)| k.starts_with("modstream."));
        cut.headers
            .retain(|(k, _)| k != header::TRUNCATED && k != header::ORIGINAL_SIZE);
        cut.headers.push((
            Cow::Borrowed(header::TRUNCATED),
            Some(b"value,headers".to_vec()),
        ));
        cut.headers.push((
            Cow::Borrowed(header::ORIGINAL_SIZE),
            Some(self.original_size().to_string().into_bytes()),
        ));
        Some(cut)
    }

    /// The value's size before any cut.
    fn original_size(&self) -> usize {
        self.headers
            .iter()
            .find(|(k, _)| k == header::ORIGINAL_SIZE)
            .and_then(|(_, v)| std::str::from_utf8(v.as_deref()?).ok()?.parse().ok())
            .unwrap_or_else(|| self.payload.as_ref().map_or(0, Vec::len))
    }
}

/// Where a record comes from: its input partition and offset.
pub type Source = (Tp, i64);

/// Records to be sent again, by input partition: each goes out only when
/// it has the lowest offset waiting in its partition, so that re-sends keep
/// offset order, and a new record of a partition with re-sends waiting
/// queues behind them instead of overtaking them.
/// An offset may wait twice: a partition revoked and assigned back to this
/// instance is consumed again while the first copies' re-sends still run,
/// so each offset counts its places.
#[derive(Default)]
struct Resends {
    waiting: std::sync::Mutex<HashMap<Tp, BTreeMap<i64, usize>>>,
    turn: tokio::sync::Notify,
}

impl Resends {
    fn any_waiting(&self, tp: &Tp) -> bool {
        self.waiting
            .lock()
            .is_ok_and(|w| w.get(tp).is_some_and(|s| !s.is_empty()))
    }

    fn join(self: &Arc<Self>, source: &Source) -> Place {
        if let Ok(mut w) = self.waiting.lock() {
            *w.entry(source.0.clone())
                .or_default()
                .entry(source.1)
                .or_default() += 1;
        }
        Place {
            resends: self.clone(),
            source: source.clone(),
        }
    }

    /// No earlier offset of the partition waits.
    fn is_first(&self, (tp, offset): &Source) -> bool {
        self.waiting.lock().map_or(true, |w| {
            w.get(tp)
                .and_then(|waiting| waiting.keys().next())
                .is_none_or(|first| first >= offset)
        })
    }
}

/// A record's place among its partition's re-sends; leaving it (dropping
/// it) lets the next one go.
struct Place {
    resends: Arc<Resends>,
    source: Source,
}

impl Place {
    /// Wait until no earlier record of the partition waits.
    async fn turn(&self) {
        loop {
            let notified = self.resends.turn.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.resends.is_first(&self.source) {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Ok(mut w) = self.resends.waiting.lock() {
            let (tp, offset) = &self.source;
            if let Some(waiting) = w.get_mut(tp) {
                if let Some(places) = waiting.get_mut(offset) {
                    *places -= 1;
                    if *places == 0 {
                        waiting.remove(offset);
                    }
                }
                if waiting.is_empty() {
                    w.remove(tp);
                }
            }
        }
        self.resends.turn.notify_waiters();
    }
}

#[derive(Clone)]
pub struct Sink {
    producer: FutureProducer,
    resends: Arc<Resends>,
    service_failures: Arc<ServiceFailures>,
    /// How many bytes of a refused dead-letter value are sent again.
    dlq_value_budget: usize,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Room left for key and headers when a dead-letter value is cut to fit
/// the producer's `message.max.bytes`.
const HEADROOM_BYTES: usize = 64 * 1024;

impl Sink {
    /// `dlq_value_budget`: at most this many bytes of a refused dead-letter
    /// value are sent again (less if `message.max.bytes` requires).
    pub fn new(kafka: &KafkaSettings, dlq_value_budget: usize) -> Result<Sink, ProducerError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &kafka.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            // librdkafka's own retries end after this; then `deliver` sends
            // the record again. The default (300 s) would hold a verdict, and
            // its offset, for five minutes after a broker hiccup.
            .set("message.timeout.ms", "30000");
        for (k, v) in &kafka.producer {
            cfg.set(k, v);
        }
        let message_max = kafka
            .producer
            .get("message.max.bytes")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1_000_000);
        let producer = cfg.create().map_err(ProducerError::Create)?;
        Ok(Sink {
            producer,
            resends: Arc::default(),
            service_failures: Arc::default(),
            dlq_value_budget: dlq_value_budget
                .min(message_max.saturating_sub(HEADROOM_BYTES))
                .max(1),
        })
    }

    /// Enqueue now (unless earlier records of the same input partition wait
    /// to be sent again: then after them); the future resolves once the
    /// broker acknowledged the record. `source` is the input partition and
    /// offset it answers: re-sends go out in that order.
    pub fn deliver(
        &self,
        record: OutRecord,
        source: Source,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        let resends = self.resends.clone();
        // A partition with re-sends waiting: this record queues behind them.
        let mut place = resends
            .any_waiting(&source.0)
            .then(|| resends.join(&source));
        let mut attempt = match place {
            Some(_) => None,
            None => Some(
                self.producer
                    .send_result(record.as_future_record())
                    .map_err(|(e, _)| e),
            ),
        };
        if let Some(Err(_)) = &attempt {
            // Not even queued (queue full): later records must not overtake it.
            place = Some(resends.join(&source));
        }
        let (producer, budget) = (self.producer.clone(), self.dlq_value_budget);
        let service_failures = self.service_failures.clone();
        async move {
            let mut record = record;
            let mut backoff = FIRST_BACKOFF;
            loop {
                let error = match attempt.take() {
                    None => {
                        if let Some(p) = &place {
                            tokio::select! {
                                _ = p.turn() => {}
                                _ = cancel.cancelled() => return Err(ProducerError::Abandoned),
                            }
                        }
                        let sent = producer
                            .send_result(record.as_future_record())
                            .map_err(|(e, _)| e);
                        if sent.is_ok() {
                            // Handed over in order: the next one may go.
                            place = None;
                        }
                        attempt = Some(sent);
                        continue;
                    }
                    Some(Ok(delivery)) => {
                        let outcome = tokio::select! {
                            outcome = delivery => outcome,
                            _ = cancel.cancelled() => return Err(ProducerError::Abandoned),
                        };
                        match outcome {
                            Ok(Ok(_)) => {
                                metrics::counter!(metric::PRODUCED_TOTAL, "kind" => record.kind)
                                    .increment(1);
                                service_failures.delivered(&record.topic);
                                return Ok(());
                            }
                            Ok(Err((e, _))) => e,
                            Err(_canceled) => KafkaError::Canceled,
                        }
                    }
                    Some(Err(e)) => e,
                };
                metrics::counter!(metric::DELIVERY_FAILURES_TOTAL, "kind" => record.kind)
                    .increment(1);
                if let Some((code, reason)) = producer.client().fatal_error() {
                    // The pipeline logs the stop once; every in-flight record ends here.
                    tracing::debug!(topic = %record.topic, error = %error, "fatal producer error; not retrying");
                    return Err(ProducerError::Fatal(format!("{code:?}: {reason}")));
                }
                if is_permanent_for_record(&error) {
                    let Some(cut) = record.cut_down(budget) else {
                        return Err(ProducerError::Rejected(error.to_string()));
                    };
                    tracing::warn!(topic = %record.topic, kind = record.kind, error = %error, "the broker refuses this record; sending it cut down");
                    record = cut;
                    continue;
                }
                if is_service_level(&error) {
                    service_failures.failed(&record.topic, &error);
                }
                let code = error.rdkafka_error_code();
                if code == Some(RDKafkaErrorCode::MessageTimedOut) {
                    // librdkafka gave up on this record, but later records
                    // of its input partition may still wait in its queue:
                    // delivered when the leader returns, they would overtake
                    // this one's re-send. Fail everything queued now, so that
                    // it all joins the re-sends and goes out again in offset
                    // order (records already sent to a broker are not touched).
                    producer.purge(PurgeConfig::default().queue().non_blocking());
                }
                if code == Some(RDKafkaErrorCode::PurgeQueue) {
                    tracing::debug!(topic = %record.topic, kind = record.kind, "taken back from the producer queue after a timeout; sending again in order");
                } else {
                    tracing::warn!(topic = %record.topic, kind = record.kind, error = %error, retry_in_ms = backoff.as_millis() as u64, "delivery failed; retrying");
                }
                // In line with the partition's other re-sends, by offset.
                if place.is_none() {
                    place = Some(resends.join(&source));
                }
                tokio::select! {
                    _ = cancel.cancelled() => return Err(ProducerError::Abandoned),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// The delivery failure concerning the whole service that has lasted
    /// longest, if one lasts now: (topic, for how long, last error).
    pub fn service_failure(&self) -> Option<(String, Duration, String)> {
        self.service_failures.oldest()
    }

    /// Whether the cluster answers this producer's metadata request (blocking).
    pub fn reachable(&self, timeout: Duration) -> bool {
        self.producer.client().fetch_metadata(None, timeout).is_ok()
    }

    /// Wait for everything queued to be delivered (shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(Timeout::After(timeout))
    }

    /// Drop what librdkafka still holds, queued or in flight (shutdown after
    /// `kafka.shutdown_timeout`): nothing more is sent.
    pub fn purge(&self) {
        self.producer
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(offset: i64) -> Source {
        (
            Tp {
                topic: Arc::from("in"),
                partition: 0,
            },
            offset,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fatal_producer_error_ends_the_delivery_instead_of_retrying_forever() {
        let broker = crate::tools::embedded::EmbeddedBroker::start(&[("out", 1)]).unwrap();
        let kafka = crate::config::Settings::from_toml(&format!(
            "[kafka]\nbootstrap_servers = \"{}\"\n[input]\ntopics = [\"in\"]\n[output]\ntopic = \"out\"\ndlq_topic = \"dlq\"",
            broker.bootstrap_servers()
        ))
        .unwrap()
        .kafka;
        let sink = Sink::new(&kafka, 1024).unwrap();
        let record = OutRecord {
            topic: "out".into(),
            key: None,
            payload: Some(b"v".to_vec()),
            headers: Vec::new(),
            timestamp_ms: None,
            kind: "verdict",
        };
        sink.deliver(record.clone(), source(0), CancellationToken::new())
            .await
            .expect("delivered before the fault");
        // librdkafka's own hook for testing fatal errors.
        let code = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                sink.producer.client().native_ptr(),
                rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                c"injected by the test".as_ptr(),
            )
        };
        assert_eq!(
            code,
            rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        );
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            sink.deliver(record, source(1), CancellationToken::new()),
        )
        .await
        .expect("a fatal error ends the delivery, no endless retry");
        match result {
            Err(ProducerError::Fatal(message)) => {
                assert!(message.contains("injected"), "{message}")
            }
            other => panic!("expected a fatal error, got {other:?}"),
        }
    }
}

#[cfg(test)]
mod cut_tests {
    use super::*;

    fn dlq(payload: usize, input_headers: usize) -> OutRecord {
        let mut headers: Vec<(Cow<'static, str>, Option<Vec<u8>>)> = (0..input_headers)
            .map(|i| (Cow::Owned(format!("h{i}")), Some(vec![b'x'; 10])))
            .collect();
        headers.push((Cow::Borrowed(header::SOURCE_OFFSET), Some(b"7".to_vec())));
        OutRecord {
            topic: "dlq".into(),
            key: Some(b"k".to_vec()),
            payload: Some(vec![b'a'; payload]),
            headers,
            timestamp_ms: Some(1),
            kind: "dlq",
        }
    }

    fn header(r: &OutRecord, name: &str) -> Option<String> {
        r.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
    }

    #[test]
    fn a_refused_dead_letter_record_is_cut_down_step_by_step_then_given_up() {
        let first = dlq(1000, 2);
        let cut = first.cut_down(100).expect("the value is cut first");
        assert_eq!(cut.payload.as_ref().map(Vec::len), Some(100));
        assert_eq!(header(&cut, header::TRUNCATED).as_deref(), Some("value"));
        assert_eq!(header(&cut, header::ORIGINAL_SIZE).as_deref(), Some("1000"));
        assert_eq!(header(&cut, "h0").as_deref(), Some("xxxxxxxxxx"));
        assert_eq!(
            (cut.key.clone(), cut.timestamp_ms),
            (Some(b"k".to_vec()), Some(1))
        );
        let bare = cut.cut_down(100).expect("then value and input headers go");
        assert_eq!(bare.payload, Some(Vec::new()));
        assert_eq!(header(&bare, "h0"), None);
        assert_eq!(
            header(&bare, header::SOURCE_OFFSET).as_deref(),
            Some("7"),
            "where the original lives"
        );
        assert_eq!(
            header(&bare, header::ORIGINAL_SIZE).as_deref(),
            Some("1000")
        );
        assert_eq!(
            bare.cut_down(100).map(|r| r.headers.len()),
            None,
            "nothing left to cut"
        );
        // Small value, large input headers: straight to the bare form.
        assert_eq!(dlq(10, 3).cut_down(100).unwrap().payload, Some(Vec::new()));
        // A verdict is never cut.
        let mut verdict = dlq(1000, 0);
        verdict.kind = "verdict";
        assert!(verdict.cut_down(100).is_none());
    }
}

#[cfg(test)]
mod resend_tests {
    use super::*;

    fn source(partition: i32, offset: i64) -> Source {
        (
            Tp {
                topic: Arc::from("in"),
                partition,
            },
            offset,
        )
    }

    async fn goes_now(place: &Place) -> bool {
        tokio::time::timeout(Duration::from_millis(20), place.turn())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn re_sends_of_a_partition_go_out_in_offset_order() {
        let resends = Arc::new(Resends::default());
        let late = resends.join(&source(0, 5));
        let early = resends.join(&source(0, 3));
        let elsewhere = resends.join(&source(1, 9));
        assert!(resends.any_waiting(&source(0, 0).0));
        assert!(!goes_now(&late).await, "offset 5 waits for offset 3");
        assert!(goes_now(&early).await);
        assert!(goes_now(&elsewhere).await, "other partitions are not held");
        // Offset 3 handed to librdkafka: 5 is next, and wakes up.
        let waiting = tokio::spawn(async move {
            late.turn().await;
            late
        });
        drop(early);
        let late = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken when its turn came")
            .unwrap();
        drop(late);
        drop(elsewhere);
        assert!(!resends.any_waiting(&source(0, 0).0));
    }

    /// The same offset twice (its partition came back and was consumed
    /// again while the first copy's re-sends ran): when one copy goes, the
    /// other is not left waiting for a turn that never comes (it was, and
    /// its partition's commits stopped for good).
    #[tokio::test]
    async fn an_offset_waiting_twice_is_never_stuck() {
        let resends = Arc::new(Resends::default());
        let first_copy = resends.join(&source(0, 7));
        let second_copy = resends.join(&source(0, 7));
        let later = resends.join(&source(0, 8));
        assert!(goes_now(&first_copy).await && goes_now(&second_copy).await);
        assert!(
            !goes_now(&later).await,
            "offset 8 waits for both copies of 7"
        );
        drop(first_copy);
        assert!(goes_now(&second_copy).await, "still its turn");
        assert!(!goes_now(&later).await, "7 still waits once");
        drop(second_copy);
        assert!(goes_now(&later).await);
        drop(later);
        assert!(!resends.any_waiting(&source(0, 0).0));
    }
}
