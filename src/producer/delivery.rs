//! One record on its way to the broker: sent, its delivery report awaited,
//! and a failure classified (fatal, refused for this record and cut down,
//! or retried with backoff in line with its partition's re-sends).

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;
use tokio_util::sync::CancellationToken;

use super::resends::Place;
use super::{ProducerError, Sink, is_permanent_for_record, is_service_level};
use crate::producer::record::OutRecord;
use crate::telemetry::metric;
use crate::tp::Source;

/// What an attempt sent waits for: the broker's answer, or `Err` if the
/// producer went away without one (see [`super::reports`]).
pub(super) type Reported = tokio::sync::oneshot::Receiver<Result<(), KafkaError>>;

pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One record on its way: its place among its partition's re-sends (when
/// it has one) and the backoff before the next try.
pub(super) struct Delivery {
    pub(super) sink: Sink,
    pub(super) source: Source,
    pub(super) place: Option<Place>,
    /// In its partition's order with the other re-sends (all but analytics
    /// records).
    pub(super) ordered: bool,
    /// An attempt failed: every send from then on is a re-send (counted).
    pub(super) failed: bool,
    pub(super) backoff: Duration,
}

/// What a failed attempt leads to.
enum Next {
    /// Wait the backoff, then send the same record again; first purge
    /// librdkafka's queue of what was queued until then, if set.
    Retry { purge: Option<Instant> },
    /// Send this smaller form at once.
    CutDown(OutRecord),
    /// The delivery ends with this error.
    Stop(ProducerError),
}

impl Delivery {
    /// A record's delivery in its partition's order with the re-sends,
    /// from `place` among them if it has one already.
    pub(super) fn in_order(sink: &Sink, source: Source, place: Option<Place>) -> Delivery {
        Delivery {
            sink: sink.clone(),
            source,
            place,
            ordered: true,
            failed: false,
            backoff: FIRST_BACKOFF,
        }
    }

    /// Send until acknowledged, cut down, given up or cancelled.
    pub(super) async fn run(
        mut self,
        mut record: OutRecord,
        mut attempt: Option<Result<Reported, KafkaError>>,
        cancel: CancellationToken,
    ) -> Result<(), ProducerError> {
        loop {
            // Whether the failure below is librdkafka refusing to queue the
            // record (it never reached a transaction) or its delivery report.
            let mut local = false;
            let error = match attempt.take() {
                None => {
                    if let Some(p) = &self.place {
                        tokio::select! {
                            _ = p.turn() => {}
                            _ = cancel.cancelled() => return Err(ProducerError::Abandoned),
                        }
                    }
                    let sent = self.sink.enqueue(&record);
                    if self.failed {
                        self.sink.health.faults.resent();
                    }
                    let in_doubt = self.failed && self.sink.resends.in_doubt(&self.source.tp);
                    if sent.is_ok() && !in_doubt {
                        // Handed over in order: the next one may go. After
                        // a failure, the first re-send goes alone and keeps
                        // its place until it is acknowledged: queued behind
                        // it while the broker is still away, later records
                        // could be sent while it times out, and overtake
                        // it. Once one is through, the rest are queued
                        // again at once, in order (one round trip each,
                        // hundreds of them after an outage stalled a
                        // partition for minutes).
                        self.place = None;
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
                        Ok(Ok(())) => {
                            if self.failed && self.ordered {
                                self.sink.resends.confirmed(&self.source.tp);
                            }
                            self.sink.produced.of(record.kind).increment(1);
                            self.sink.service_failures.delivered(&record.topic);
                            return Ok(());
                        }
                        Ok(Err(e)) => e,
                        Err(_canceled) => KafkaError::Canceled,
                    }
                }
                Some(Err(e)) => {
                    local = true;
                    e
                }
            };
            match self.after_failure(&record, &error, local) {
                Next::Stop(e) => return Err(e),
                Next::CutDown(cut) => record = cut,
                Next::Retry { purge } => {
                    if let Some(since) = purge {
                        self.sink.purge_queued(since).await;
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return Err(ProducerError::Abandoned),
                        _ = tokio::time::sleep(self.backoff) => {}
                    }
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Classify a failed attempt: fatal, refused for this record, or worth
    /// a retry (in line with the partition's other re-sends).
    fn after_failure(&mut self, record: &OutRecord, error: &KafkaError, local: bool) -> Next {
        self.failed = true;
        let kind = record.kind.as_str();
        metrics::counter!(metric::DELIVERY_FAILURES_TOTAL, "kind" => kind).increment(1);
        self.sink.health.faults.delivery_failed();
        let producer = &self.sink.producer;
        if let Some((code, reason)) = producer.client().fatal_error() {
            // The pipeline logs the stop once; every in-flight record ends here.
            tracing::debug!(topic = %record.topic, error = %error, "fatal producer error; not retrying");
            return Next::Stop(ProducerError::Fatal(format!("{code:?}: {reason}")));
        }
        let code = error.rdkafka_error_code();
        if self.sink.exactly_once && !(local && is_permanent_for_record(error)) {
            // The transaction holding it cannot commit as it is: it is
            // aborted and the partition read again. (A record too large for
            // librdkafka's queue is cut down, as without transactions. A
            // full queue is not waited out: were the transaction aborted
            // meanwhile, the record would join the next one while its
            // partition is read again.)
            tracing::debug!(topic = %record.topic, kind, error = %error, "delivery failed in a transaction");
            return Next::Stop(ProducerError::InTransaction(error.to_string()));
        }
        if is_permanent_for_record(error) {
            return match record.cut_down(self.sink.dlq_value_budget) {
                Some(cut) => {
                    tracing::warn!(topic = %record.topic, kind, error = %error, "the broker refuses this record; sending it cut down");
                    Next::CutDown(cut)
                }
                None => Next::Stop(ProducerError::Rejected(error.to_string())),
            };
        }
        if !self.ordered {
            // Not in line with anything, and no stop of the service for
            // its topic (see [`analytics`]): a plain retry.
            tracing::debug!(topic = %record.topic, kind, error = %error, "analytics record failed; retrying");
            return Next::Retry { purge: None };
        }
        if is_service_level(error) {
            self.sink.service_failures.failed(&record.topic, error);
        }
        // In line with the partition's other re-sends, by offset; joined
        // before the purge, so that a record the hub hands over from now on
        // queues behind this one instead of going out first.
        if self.place.is_none() {
            self.place = Some(self.sink.resends.join(&self.source));
        }
        self.sink.resends.doubt(&self.source.tp);
        // librdkafka gave up on this record, but later records of its input
        // partition may still wait in its queue: delivered when the leader
        // returns, they would overtake this one's re-send. Everything queued
        // is failed (before the re-send), so that it all joins the re-sends
        // and goes out again in offset order (records already sent to a
        // broker are not touched).
        let purge = (code == Some(RDKafkaErrorCode::MessageTimedOut)).then(Instant::now);
        if code == Some(RDKafkaErrorCode::PurgeQueue) {
            tracing::debug!(topic = %record.topic, kind, "taken back from the producer queue after a timeout; sending again in order");
        } else {
            tracing::warn!(topic = %record.topic, kind, error = %error, retry_in_ms = self.backoff.as_millis() as u64, "delivery failed; retrying");
        }
        Next::Retry { purge }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::producer::tests::{source, verdict_record};
    use crate::tools::embedded::EmbeddedBroker;
    use crate::tools::read::TopicReader;

    /// After a failure, a partition's first re-send goes alone (queued behind
    /// it while the broker was still away, records 1 to 99 overtook record 0
    /// when it timed out); once it is acknowledged the others are queued
    /// again at once, in offset order: with a 200 ms round trip, 100 of them
    /// take well under half of 100 round trips (one each stalled a partition
    /// for minutes). Their first copies keep offset order in the topic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partitions_re_sends_are_not_one_round_trip_each() {
        const RECORDS: i64 = 100;
        const ROUND_TRIP: Duration = Duration::from_millis(200);
        let broker = EmbeddedBroker::start(&[("out", 1)]).unwrap();
        let bootstrap = broker.bootstrap_servers().to_string();
        let kafka = crate::config::Settings::from_toml(&format!(
            "[kafka]\nbootstrap_servers = \"{bootstrap}\"\n[kafka.producer]\n\"message.timeout.ms\" = \"300\"\n[input]\ntopics = [\"in\"]\n[output]\ntopic = \"out\"\ndlq_topic = \"dlq\""
        ))
        .unwrap()
        .kafka;
        let sink = Sink::new(&kafka, 1024, Duration::from_secs(10), Arc::default()).unwrap();
        broker.with_cluster(|c| c.broker_down(1)).unwrap();
        let deliver = |offset: i64| {
            let mut record = verdict_record();
            record.payload = Some(offset.to_string().into_bytes());
            tokio::spawn(sink.deliver(record, source(offset), CancellationToken::new()))
        };
        let deliveries: Vec<_> = (0..RECORDS).map(deliver).collect();
        // Once every record has failed, while the broker is away, the
        // partition's first re-send is all that librdkafka holds of it.
        let failed = |sink: &Sink| sink.health.faults.counts().delivery_failures;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while failed(&sink) < RECORDS as u64 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(failed(&sink) >= RECORDS as u64, "every first send failed");
        let mut most_held = 0;
        for _ in 0..100 {
            most_held = most_held.max(sink.producer.in_flight_count());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(most_held, 1, "records held by librdkafka at once");
        // Then the broker is back, slow.
        broker
            .with_cluster(|c| {
                c.broker_round_trip_time(1, ROUND_TRIP)?;
                c.broker_up(1)
            })
            .unwrap();
        let up = std::time::Instant::now();
        for delivery in deliveries {
            tokio::time::timeout(Duration::from_secs(60), delivery)
                .await
                .expect("acknowledged at last")
                .unwrap()
                .expect("delivered");
        }
        let took = up.elapsed();
        println!("{RECORDS} re-sends acknowledged {took:?} after the broker came back");
        let sink_faults = sink.health.faults.counts();
        assert!(
            sink_faults.resends >= RECORDS as u64,
            "every record was sent again: {sink_faults:?}"
        );
        // One round trip each would be 20 s; the backoff, the reconnection
        // and the purges after a timeout take a few seconds.
        assert!(
            took < ROUND_TRIP * RECORDS as u32 / 2,
            "{RECORDS} re-sends took {took:?} with a {ROUND_TRIP:?} round trip"
        );
        let offsets: Vec<i64> = tokio::task::spawn_blocking(move || {
            TopicReader::from_beginning(&bootstrap, "out", None)
                .unwrap()
                .read_to_end(Duration::from_secs(30))
                .unwrap()
        })
        .await
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).parse().unwrap())
        .collect();
        let mut first = std::collections::HashSet::new();
        let firsts: Vec<i64> = offsets.into_iter().filter(|o| first.insert(*o)).collect();
        assert_eq!(
            firsts,
            (0..RECORDS).collect::<Vec<_>>(),
            "first copies in offset order"
        );
    }
}
