//! Delivery of verdicts and dead-letter records.
//!
//! Guarantee: [`Sink::deliver`] hands a record to librdkafka at once (so the
//! produce order is the call order), then resolves only when the broker has
//! acknowledged it (`acks=all`, idempotent producer). A transient failure is
//! retried with backoff until it succeeds or the caller gives up through the
//! cancellation token (which also ends a wait for librdkafka); the caller
//! marks an offset delivered only on `Ok`. Re-sends keep offset order per
//! input partition (`resends.rs`): a record that failed goes out again only
//! when no earlier record of its partition waits to be queued; after a
//! failure the partition's first re-send goes alone and keeps its place
//! until it is acknowledged, then the others are queued again at once, in
//! offset order (not one round trip each); a new record of a partition
//! with records waiting queues behind them. After a delivery
//! timeout, what librdkafka still holds queued is purged (blocking, once
//! per timeout) so that it joins the re-sends instead of overtaking them.
//! A record the broker can never
//! take (too large, malformed) is not retried as it is: a dead-letter record
//! is sent again with its value cut to a budget, then without value and
//! input headers; past that, and for a verdict, the delivery ends with
//! [`ProducerError::Rejected`] so that its partition is not pinned. A fatal
//! client error (idempotence broken) is not retried: it ends the delivery
//! with [`ProducerError::Fatal`] and the pipeline stops. Analytics records
//! (decisions, waves, samples) are bounded in time and given up when their
//! topic fails ([`analytics`]).
//!
//! The fast way, [`Sink::send_reported`], takes a verdict or dead letter
//! whose partition has no re-sends waiting: it is enqueued at once as
//! `deliver` would, but no future waits for it; its delivery report comes
//! back by token on one channel ([`reports`]) that the hub drains, and a
//! failure goes on through [`Sink::follow`] exactly as `deliver`'s would
//! have after that failure.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::{Producer, PurgeConfig, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;

use crate::client::log::LastError;
use crate::client::{self, ProducerRole};
use crate::config::KafkaSettings;
use crate::producer::record::{OutRecord, RecordKind};
use crate::telemetry::{Health, MissingTopic, metric};
use crate::tp::Source;

mod analytics;
mod delivery;
pub mod record;
pub mod reports;
mod resends;
pub mod topics;
pub mod transaction;

use analytics::{Gate, Pass};
use delivery::{Delivery, FIRST_BACKOFF, Reported};
use reports::{Report, VerdictContext};
use resends::Resends;

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
    /// Exactly-once: a record of the open transaction failed; the
    /// transaction will be aborted and its input read again.
    #[error("delivery failed inside a transaction: {0}")]
    InTransaction(String),
    /// An analytics record (decision, wave, sample) given up: its topic
    /// failed, or it was not acknowledged within `output.analytics_timeout`.
    /// Counted; its offset goes on.
    #[error("analytics record given up: {0}")]
    GivenUp(String),
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

/// A delivery failure concerning the whole service (not authorized, topic
/// missing) that lasts now.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceFailure {
    pub topic: String,
    /// Since the first failure after the last delivery to the topic.
    pub lasted: Duration,
    pub error: String,
}

/// Service-level delivery failures now, by topic: since when, and the last
/// error. Written by the deliveries, read by the hub's watchdog.
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

    /// The longest-lasting one.
    fn oldest(&self) -> Option<ServiceFailure> {
        let f = self.0.lock().ok()?;
        f.iter()
            .min_by_key(|(_, (since, _))| *since)
            .map(|(t, (since, e))| ServiceFailure {
                topic: t.clone(),
                lasted: since.elapsed(),
                error: e.clone(),
            })
    }
}

/// The verdict producer: its librdkafka logs without repeats, its
/// delivery reports by token ([`reports`]).
pub type VerdictProducer = ThreadedProducer<VerdictContext>;

/// The verdict producer and what its deliveries share (one `Arc`: each
/// record's delivery holds a clone).
#[derive(Clone)]
pub struct Sink(Arc<SinkShared>);

impl std::ops::Deref for Sink {
    type Target = SinkShared;

    fn deref(&self) -> &SinkShared {
        &self.0
    }
}

pub struct SinkShared {
    producer: VerdictProducer,
    last_error: LastError,
    /// The fast way's reports, until the hub takes them.
    reports: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Report>>>,
    resends: Arc<Resends>,
    service_failures: ServiceFailures,
    /// When the last purge after a delivery timeout started.
    purges: tokio::sync::Mutex<Option<Instant>>,
    /// How many bytes of a refused dead-letter value are sent again.
    dlq_value_budget: usize,
    /// `kafka.delivery = "exactly_once"`: a transactional producer; a
    /// failed record is not sent again (its transaction aborts).
    exactly_once: bool,
    /// This run's health, for its fault tally.
    health: Arc<Health>,
    /// `modstream_records_produced_total` by kind, resolved once.
    produced: Produced,
    /// Analytics topics that fail, and how long an analytics record is
    /// waited for (`output.analytics_timeout`).
    gate: Gate,
    analytics_timeout: Duration,
}

/// One counter per [`RecordKind`] (a labelled `counter!` looks its series
/// up in the registry on every call).
struct Produced([metrics::Counter; 6]);

impl Produced {
    fn new() -> Produced {
        Produced(
            RecordKind::ALL
                .map(|k| metrics::counter!(metric::PRODUCED_TOTAL, "kind" => k.as_str())),
        )
    }

    fn of(&self, kind: RecordKind) -> &metrics::Counter {
        let i = match kind {
            RecordKind::Verdict => 0,
            RecordKind::Dlq => 1,
            RecordKind::Decision => 2,
            RecordKind::Wave => 3,
            RecordKind::Sample => 4,
            RecordKind::State => 5,
        };
        &self.0[i]
    }
}

/// Room left for key and headers when a dead-letter value is cut to fit
/// the producer's `message.max.bytes`.
const HEADROOM_BYTES: usize = 64 * 1024;

impl Sink {
    /// `dlq_value_budget`: at most this many bytes of a refused dead-letter
    /// value are sent again (less if `message.max.bytes` requires).
    /// `analytics_timeout`: see [`analytics`].
    pub fn new(
        kafka: &KafkaSettings,
        dlq_value_budget: usize,
        analytics_timeout: Duration,
        health: Arc<Health>,
    ) -> Result<Sink, ProducerError> {
        let message_max = kafka
            .producer
            .get("message.max.bytes")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1_000_000);
        let (context, reports) = VerdictContext::new();
        let last_error = context.quiet.last_error.clone();
        let producer = client::producer(kafka, ProducerRole::Verdicts)
            .create_with_context(context)
            .map_err(ProducerError::Create)?;
        Ok(Sink(Arc::new(SinkShared {
            producer,
            last_error,
            reports: std::sync::Mutex::new(Some(reports)),
            resends: Arc::default(),
            service_failures: ServiceFailures::default(),
            purges: tokio::sync::Mutex::default(),
            dlq_value_budget: dlq_value_budget
                .min(message_max.saturating_sub(HEADROOM_BYTES))
                .max(1),
            exactly_once: kafka.exactly_once(),
            health,
            produced: Produced::new(),
            gate: Gate::default(),
            analytics_timeout,
        })))
    }

    /// The producer itself (exactly-once: its transactions are begun and
    /// ended by [`crate::producer::transaction::Transactions`]).
    pub fn producer(&self) -> VerdictProducer {
        self.producer.clone()
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
        use futures::future::Either;
        if record.kind.is_analytics() {
            return Either::Left(self.clone().deliver_analytics(record, source, cancel));
        }
        Either::Right(self.deliver_in_order(record, source, cancel))
    }

    /// A verdict, dead letter or routed copy: in its partition's order.
    fn deliver_in_order(
        &self,
        record: OutRecord,
        source: Source,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        let resends = &self.resends;
        // A partition with re-sends waiting: this record queues behind them.
        let mut place = resends
            .any_waiting(&source.tp)
            .then(|| resends.join(&source));
        let attempt = match place {
            Some(_) => None,
            None => Some(self.enqueue(&record)),
        };
        if let Some(Err(_)) = &attempt {
            // Not even queued (queue full): later records must not overtake it.
            place = Some(resends.join(&source));
        }
        Delivery::in_order(self, source, place).run(record, attempt, cancel)
    }

    /// An analytics record: not in its partition's order, waited for at
    /// most `output.analytics_timeout` (with exactly-once, until its
    /// transaction ends), given up at once while its topic is closed.
    async fn deliver_analytics(
        self,
        record: OutRecord,
        source: Source,
        cancel: CancellationToken,
    ) -> Result<(), ProducerError> {
        let (kind, topic) = (record.kind, record.topic.clone());
        let interval = self.analytics_timeout;
        if let Pass::GiveUp(error) = self.gate.pass(&topic, interval) {
            analytics::given_up(kind);
            return Err(ProducerError::GivenUp(error));
        }
        let attempt = Some(self.enqueue(&record));
        let delivery = Delivery {
            sink: self.clone(),
            source,
            place: None,
            ordered: false,
            failed: false,
            backoff: FIRST_BACKOFF,
        };
        let run = delivery.run(record, attempt, cancel);
        let outcome = if self.exactly_once {
            run.await
        } else {
            match tokio::time::timeout(interval, run).await {
                Ok(outcome) => outcome,
                Err(_) => Err(ProducerError::GivenUp(format!(
                    "not acknowledged within output.analytics_timeout ({interval:?})"
                ))),
            }
        };
        match outcome {
            Ok(()) => {
                self.gate.delivered(&topic, &self.health);
                Ok(())
            }
            Err(e @ (ProducerError::Abandoned | ProducerError::Fatal(_))) => Err(e),
            Err(e @ ProducerError::InTransaction(_)) => {
                self.gate
                    .failed(&topic, &e.to_string(), interval, &self.health);
                Err(e)
            }
            Err(e) => {
                let error = match e {
                    ProducerError::GivenUp(why) => why,
                    other => other.to_string(),
                };
                self.gate.failed(&topic, &error, interval, &self.health);
                analytics::given_up(kind);
                Err(ProducerError::GivenUp(error))
            }
        }
    }

    /// Fail every record queued in librdkafka (not those sent to a broker)
    /// with `PurgeQueue`, unless a purge that started at or after `since`
    /// already did. Blocking, on a blocking thread: when it returns, no
    /// record that was queued at `since` can still be sent by librdkafka
    /// (the non-blocking purge leaves the brokers' own queues for later,
    /// and a leader that returns meanwhile would send them first).
    async fn purge_queued(&self, since: Instant) {
        let mut last = self.purges.lock().await;
        if last.is_some_and(|started| started >= since) {
            return;
        }
        *last = Some(Instant::now());
        let producer = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            producer.purge(PurgeConfig::default().queue());
        })
        .await;
    }

    fn enqueue(&self, record: &OutRecord) -> Result<Reported, KafkaError> {
        let context = self.producer.context();
        let (token, reported) = context.waited_token();
        match (self.producer).send(record.as_base_record(VerdictContext::opaque(token))) {
            Ok(()) => Ok(reported),
            Err((e, _)) => {
                context.forget(token);
                Err(e)
            }
        }
    }

    /// The delivery failure concerning the whole service that has lasted
    /// longest, if one lasts now.
    pub fn service_failure(&self) -> Option<ServiceFailure> {
        self.service_failures.oldest()
    }

    /// Each `(key, topic)` exists and this producer may write it
    /// (blocking; see [`topics`]).
    pub fn check_topics(
        &self,
        topics: &[(String, String)],
        timeout: Duration,
    ) -> Result<(), topics::TopicCheckError> {
        topics::check(self.producer.client(), topics, timeout)
    }

    /// The last error the producer's client reported (why it cannot
    /// connect, if it cannot).
    pub fn last_client_error(&self) -> Option<String> {
        self.last_error.get()
    }

    /// Of `topics`, those the cluster does not list (blocking; a request for
    /// every topic, which creates none). Err: the cluster did not answer.
    pub fn missing_topics(
        &self,
        topics: &[String],
        timeout: Duration,
    ) -> Result<Vec<MissingTopic>, KafkaError> {
        let metadata = self.producer.client().fetch_metadata(None, timeout)?;
        let listed: std::collections::BTreeSet<&str> = (metadata.topics().iter())
            .filter(|t| t.error().is_none())
            .map(|t| t.name())
            .collect();
        Ok(topics
            .iter()
            .filter(|t| !listed.contains(t.as_str()))
            .map(|t| MissingTopic::among(t, listed.iter().copied()))
            .collect())
    }

    /// How many partitions each of `topics` the cluster lists has (blocking).
    pub fn partition_counts(
        &self,
        topics: &[String],
        timeout: Duration,
    ) -> Result<std::collections::HashMap<String, usize>, KafkaError> {
        let metadata = self.producer.client().fetch_metadata(None, timeout)?;
        Ok((metadata.topics().iter())
            .filter(|t| t.error().is_none() && topics.iter().any(|n| n == t.name()))
            .map(|t| (t.name().to_string(), t.partitions().len()))
            .collect())
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
    use crate::tools::embedded::EmbeddedBroker;

    /// Offset `offset` of partition 0 of the input.
    pub(super) fn source(offset: i64) -> Source {
        Source {
            tp: crate::tp::Tp::new("in", 0),
            offset,
        }
    }

    /// A sink on an embedded broker with the topic `out` (keep the broker
    /// while the sink is used).
    pub(super) fn sink_on_embedded_broker() -> (EmbeddedBroker, Sink) {
        let broker = EmbeddedBroker::start(&[("out", 1)]).unwrap();
        let kafka = crate::config::Settings::from_toml(&format!(
            "[kafka]\nbootstrap_servers = \"{}\"\n[input]\ntopics = [\"in\"]\n[output]\ntopic = \"out\"\ndlq_topic = \"dlq\"",
            broker.bootstrap_servers()
        ))
        .unwrap()
        .kafka;
        let sink = Sink::new(&kafka, 1024, Duration::from_secs(10), Arc::default()).unwrap();
        (broker, sink)
    }

    /// A small verdict to `out`.
    pub(super) fn verdict_record() -> OutRecord {
        OutRecord {
            topic: "out".into(),
            partition: None,
            key: None,
            payload: Some(b"v".to_vec()),
            headers: Vec::new(),
            timestamp_ms: None,
            kind: crate::producer::record::RecordKind::Verdict,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fatal_producer_error_ends_the_delivery_instead_of_retrying_forever() {
        let (_broker, sink) = sink_on_embedded_broker();
        let record = verdict_record();
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
