//! Delivery of verdicts and dead-letter records.
//!
//! Guarantee: [`Sink::deliver`] hands a record to librdkafka at once (so the
//! produce order is the call order), then resolves only when the broker has
//! acknowledged it (`acks=all`, idempotent producer). A failed delivery is
//! retried with backoff until it succeeds or the caller gives up through the
//! cancellation token; the caller marks an offset delivered only on `Ok`.
//! A fatal client error (idempotence broken) is not retried: it ends the
//! delivery with [`ProducerError::Fatal`] and the pipeline stops.

use std::future::Future;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;

use crate::config::KafkaSettings;
use crate::telemetry::metric;

#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    #[error("cannot create the Kafka producer")]
    Create(#[source] KafkaError),
    #[error("delivery abandoned at shutdown")]
    Abandoned,
    /// The idempotent producer hit a fatal error (e.g. a broken sequence):
    /// librdkafka will not deliver anything more from this client.
    #[error("fatal producer error: {0}")]
    Fatal(String),
}

/// A record to produce, owned so that it can be sent again on failure.
#[derive(Debug, Clone)]
pub struct OutRecord {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(&'static str, Vec<u8>)>,
    /// "verdict" or "dlq", for metrics and logs.
    pub kind: &'static str,
}

impl OutRecord {
    fn as_future_record(&self) -> FutureRecord<'_, [u8], [u8]> {
        let mut record = FutureRecord::to(&self.topic).payload(self.payload.as_slice());
        if let Some(key) = &self.key {
            record = record.key(key.as_slice());
        }
        if !self.headers.is_empty() {
            let headers = self
                .headers
                .iter()
                .fold(OwnedHeaders::new(), |h, (key, value)| {
                    h.insert(Header {
                        key,
                        value: Some(value.as_slice()),
                    })
                });
            record = record.headers(headers);
        }
        record
    }
}

#[derive(Clone)]
pub struct Sink {
    producer: FutureProducer,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Sink {
    pub fn new(kafka: &KafkaSettings) -> Result<Sink, ProducerError> {
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
        let producer = cfg.create().map_err(ProducerError::Create)?;
        Ok(Sink { producer })
    }

    /// Enqueue now; the future resolves once the broker acknowledged the record.
    pub fn deliver(
        &self,
        record: OutRecord,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<(), ProducerError>> + Send + 'static {
        let first = self
            .producer
            .send_result(record.as_future_record())
            .map_err(|(e, _)| e);
        let producer = self.producer.clone();
        async move {
            let mut attempt = first;
            let mut backoff = FIRST_BACKOFF;
            loop {
                let error = match attempt {
                    Ok(delivery) => match delivery.await {
                        Ok(Ok(_)) => {
                            metrics::counter!(metric::PRODUCED_TOTAL, "kind" => record.kind)
                                .increment(1);
                            return Ok(());
                        }
                        Ok(Err((e, _))) => e,
                        Err(_canceled) => KafkaError::Canceled,
                    },
                    Err(e) => e,
                };
                metrics::counter!(metric::DELIVERY_FAILURES_TOTAL, "kind" => record.kind)
                    .increment(1);
                if let Some((code, reason)) = producer.client().fatal_error() {
                    // The pipeline logs the stop once; every in-flight record ends here.
                    tracing::debug!(topic = %record.topic, error = %error, "fatal producer error; not retrying");
                    return Err(ProducerError::Fatal(format!("{code:?}: {reason}")));
                }
                tracing::warn!(topic = %record.topic, kind = record.kind, error = %error, retry_in_ms = backoff.as_millis() as u64, "delivery failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Err(ProducerError::Abandoned),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                attempt = producer
                    .send_result(record.as_future_record())
                    .map_err(|(e, _)| e);
            }
        }
    }

    /// Whether the cluster answers this producer's metadata request (blocking).
    pub fn reachable(&self, timeout: Duration) -> bool {
        self.producer.client().fetch_metadata(None, timeout).is_ok()
    }

    /// Wait for everything queued to be delivered (shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(Timeout::After(timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fatal_producer_error_ends_the_delivery_instead_of_retrying_forever() {
        let broker = crate::tools::embedded::EmbeddedBroker::start(&[("out", 1)]).unwrap();
        let kafka = crate::config::Settings::from_toml(&format!(
            "[kafka]\nbootstrap_servers = \"{}\"\n[input]\ntopics = [\"in\"]\n[output]\ntopic = \"out\"\ndlq_topic = \"dlq\"",
            broker.bootstrap_servers()
        ))
        .unwrap()
        .kafka;
        let sink = Sink::new(&kafka).unwrap();
        let record = OutRecord {
            topic: "out".into(),
            key: None,
            payload: b"v".to_vec(),
            headers: Vec::new(),
            kind: "verdict",
        };
        sink.deliver(record.clone(), CancellationToken::new())
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
            sink.deliver(record, CancellationToken::new()),
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
