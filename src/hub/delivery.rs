//! Delivery: verdicts (or dead-letter records) produced in offset order,
//! acknowledgements, and the positions they let the consumer store.

use super::{Ack, Deliver, Hub, Outcome};
use crate::event::{self, RejectReason};
use crate::partition::{Finished, Partition, Pending};
use crate::producer::ProducerError;
use crate::rebalance::Positions;
use crate::record::{self, OutRecord};
use crate::telemetry::metric;
use crate::tp::Tp;
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    /// Produce the verdicts of a partition's batches in batch order.
    pub(super) fn emit_in_order(&mut self, tp: &Tp) {
        while let Some(finished) = self
            .partitions
            .get_mut(tp)
            .and_then(Partition::next_in_order)
        {
            let scored = match finished {
                Finished::Scored(scored) => scored,
                Finished::Rejected(r) => {
                    let r = *r;
                    let at = (tp.clone(), self.partition_generation(tp), r.offset);
                    self.deliver(at, r.out, Outcome::Dlq(r.reason), (r.received_at, r.bytes));
                    continue;
                }
            };
            for (mut pending, score) in scored {
                let at = (pending.tp.clone(), pending.generation, pending.offset);
                let held = (pending.received_at, pending.bytes.take());
                let (out, outcome) = self.outcome(pending, score);
                self.deliver(at, out, outcome, held);
            }
        }
    }

    /// The verdict record of a scored event, or its dead-letter record.
    pub(super) fn outcome(
        &self,
        mut pending: Pending,
        score: Result<Vec<f32>, String>,
    ) -> (OutRecord, Outcome) {
        match score {
            Ok(probabilities) => {
                // The model that scored it (a reload may have switched it).
                let scorer = pending
                    .scored_by
                    .clone()
                    .unwrap_or_else(|| self.scorer.clone());
                if let Some(shadow) = &self.shadow
                    && shadow.samples(&pending.event.event_id)
                {
                    shadow.offer(crate::shadow::ShadowJob {
                        event_id: pending.event.event_id.clone(),
                        text: std::mem::take(&mut pending.event.text),
                        source: (
                            pending.tp.topic.clone(),
                            pending.tp.partition,
                            pending.offset,
                        ),
                        live_probabilities: probabilities.clone(),
                        live: scorer.clone(),
                    });
                }
                let (mut out, label) = scorer.verdict_record(
                    &self.settings.output.topic,
                    &pending.tp,
                    pending.offset,
                    pending.original.key.clone(),
                    &pending.event,
                    &probabilities,
                    pending.original.timestamp_ms,
                );
                let event_id = &pending.event.event_id;
                if let Err(e) = self.dress(&mut out, event_id, &pending.tp, pending.offset) {
                    tracing::error!(error = %e, "a verdict does not fit the output format; dead-lettered");
                    let rejection = event::Rejection {
                        reason: RejectReason::Undecodable,
                        message: format!("the verdict could not be written as output.format: {e}"),
                    };
                    let dlq = &self.settings.output.dlq_topic;
                    let out = record::dead_letter(
                        dlq,
                        &pending.tp,
                        pending.offset,
                        pending.original,
                        &rejection,
                    );
                    return (out, Outcome::Dlq(RejectReason::Undecodable));
                }
                let event_time =
                    event::event_time_ms(pending.original.timestamp_ms, &pending.event);
                (out, Outcome::Verdict(label, event_time))
            }
            Err(message) => {
                metrics::counter!(metric::INFERENCE_FAILURES_TOTAL).increment(1);
                let rejection = event::Rejection {
                    reason: RejectReason::InferenceFailed,
                    message,
                };
                let out = record::dead_letter(
                    &self.settings.output.dlq_topic,
                    &pending.tp,
                    pending.offset,
                    pending.original,
                    &rejection,
                );
                (out, Outcome::Dlq(RejectReason::InferenceFailed))
            }
        }
    }

    /// Enqueue one record now; a task reports its acknowledgement. `bytes`
    /// (the input's share of the byte budget) is given back after it;
    /// `received_at` is when the input was polled.
    pub(super) fn deliver(
        &mut self,
        (tp, generation, offset): (Tp, u64, i64),
        out: OutRecord,
        outcome: Outcome,
        (received_at, bytes): (Instant, Option<tokio::sync::OwnedSemaphorePermit>),
    ) {
        let mut epoch = 0;
        if let Some(txn) = self.txn.as_mut() {
            if txn.holding() {
                txn.held.push(super::transaction::Held {
                    at: (tp, generation, offset),
                    out,
                    outcome,
                    held: (received_at, bytes),
                });
                return;
            }
            txn.outstanding += 1;
            txn.records += 1;
            epoch = txn.epoch;
        }
        let kind = out.kind;
        let delivery = self
            .outbox
            .deliver(out, (tp.clone(), offset), self.abort.clone());
        let acks = self.acks_tx.clone();
        let started = Instant::now();
        self.deliveries.spawn(async move {
            let outcome = delivery.await.map(|()| outcome);
            drop(bytes);
            let _ = acks
                .send(Ack {
                    tp,
                    generation,
                    offset,
                    outcome,
                    kind,
                    took: started.elapsed(),
                    received_at,
                    txn: epoch,
                })
                .await;
        });
    }

    pub(super) fn on_ack(&mut self, ack: Ack) {
        self.release(1);
        self.summary.produce_seconds += ack.took.as_secs_f64();
        // An acknowledgement of an aborted transaction's record (its
        // partition was rewound) concerns neither the open transaction's
        // count nor its fate.
        let current = self.txn.as_ref().is_none_or(|t| t.epoch == ack.txn);
        if let Some(txn) = self.txn.as_mut().filter(|_| current) {
            txn.outstanding = txn.outstanding.saturating_sub(1);
        }
        let outcome = match ack.outcome {
            Ok(outcome) => outcome,
            Err(ProducerError::InTransaction(error)) => {
                // Its transaction will be aborted and the partition read
                // again; the offset stays undelivered until then.
                self.summary.aborted_records += 1;
                if let Some(txn) = self.txn.as_mut().filter(|_| current) {
                    txn.failed.get_or_insert(error);
                }
                return;
            }
            Err(ProducerError::Fatal(message)) => {
                self.summary.abandoned += 1;
                if self.producer_fatal.is_none() {
                    tracing::error!(error = %message, "stopping: the producer cannot deliver any more");
                    self.producer_fatal = Some(ProducerError::Fatal(message));
                    self.stop.cancel();
                    self.abort.cancel();
                }
                return;
            }
            Err(ProducerError::Rejected(error)) => {
                // Never pins the partition: counted, logged with where the
                // original lives, and committed past.
                let kind = ack.kind;
                metrics::counter!(metric::UNDELIVERABLE_TOTAL, "kind" => kind.as_str())
                    .increment(1);
                tracing::error!(topic = %ack.tp.topic, partition = ack.tp.partition, offset = ack.offset, kind = kind.as_str(), error = %error, "the broker refuses this record for good; its offset is committed");
                self.summary.undeliverable += 1;
                self.advance(&ack.tp, ack.generation, ack.offset);
                return;
            }
            Err(_) => {
                self.summary.abandoned += 1;
                return;
            }
        };
        match outcome {
            Outcome::Verdict(label, event_time_ms) => {
                self.summary.verdicts += 1;
                metrics::counter!(metric::VERDICTS_TOTAL, "verdict" => label.as_str()).increment(1);
                let in_hub = ack.received_at.elapsed();
                let end_to_end = event_time_ms.map(|t| {
                    let ms = (chrono::Utc::now().timestamp_millis() - t).max(0);
                    metrics::histogram!(metric::END_TO_END_SECONDS).record(ms as f64 / 1000.0);
                    std::time::Duration::from_millis(ms as u64)
                });
                if let Some(controller) = self.slo.as_mut() {
                    // Without a record timestamp only the part in the hub is known.
                    let end_to_end = end_to_end.unwrap_or(in_hub).max(in_hub);
                    controller.delivered(end_to_end, end_to_end - in_hub, ack.took);
                }
            }
            Outcome::Dlq(reason) => {
                self.summary.dlq += 1;
                metrics::counter!(metric::DLQ_TOTAL, "reason" => reason.code()).increment(1);
            }
        }
        self.advance(&ack.tp, ack.generation, ack.offset);
    }

    /// An offset is done: move its partition's position if it can.
    pub(super) fn advance(&mut self, tp: &Tp, generation: u64, offset: i64) {
        let Some(partition) = self.partitions.get_mut(tp) else {
            return;
        };
        if partition.generation() != generation {
            return;
        }
        if let Some(position) = partition.ack(offset) {
            self.store(tp.clone(), position);
        }
    }

    fn partition_generation(&self, tp: &Tp) -> u64 {
        self.partitions.get(tp).map_or(0, Partition::generation)
    }

    pub(super) fn release(&mut self, events: usize) {
        self.in_flight = self.in_flight.saturating_sub(events);
        metrics::gauge!(metric::IN_FLIGHT_EVENTS).set(self.in_flight as f64);
    }

    /// Record a partition's new position, for the consumer thread to store.
    pub(super) fn store(&mut self, tp: Tp, position: i64) {
        self.positions.insert(tp.clone(), position);
        self.unsent_positions.insert(tp, position);
    }

    /// Hand the new positions to the consumer thread, once it has taken the
    /// previous batch; meanwhile they wait here, later ones replacing earlier
    /// ones (the loop wakes every [`POSITIONS_RETRY`] to try again).
    pub(super) fn send_positions(&mut self) {
        if self.unsent_positions.is_empty() || !self.positions_tx.is_empty() {
            return;
        }
        let batch: Positions = self.unsent_positions.drain().collect();
        if let Err(async_channel::TrySendError::Full(batch)) = self.positions_tx.try_send(batch) {
            self.unsent_positions.extend(batch);
        }
    }
}
