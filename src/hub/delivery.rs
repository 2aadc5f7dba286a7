//! Delivery: verdicts (or dead-letter records) produced in offset order,
//! acknowledgements, and the positions they let the consumer store.

use super::outputs::{Decided, Outcome};
use super::transaction::HandOver;
use super::{Ack, Deliver, Hold, Hub, InputOffset, ReadyOutput};
use crate::partition::{Finished, Partition};
use crate::producer::ProducerError;
use crate::record::RecordKind;
use crate::state::{Judging, Step};
use crate::telemetry::metric;
use crate::tp::{Generation, Source, Tp};
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    /// Produce the verdicts of a partition's batches in batch order.
    /// A partition whose state is being restored waits for it.
    pub(super) fn emit_in_order(&mut self, tp: &Tp) {
        while let Some(finished) = self
            .partitions
            .get_mut(tp)
            .filter(|p| !p.restoring())
            .and_then(Partition::next_in_order)
        {
            let scored = match finished {
                Finished::Scored(scored) => scored,
                Finished::Rejected(r) => {
                    let r = *r;
                    self.deliver(ReadyOutput {
                        at: InputOffset {
                            tp: tp.clone(),
                            generation: self.partition_generation(tp),
                            offset: r.offset,
                        },
                        out: r.out.into(),
                        outcome: Outcome::Dlq(r.reason),
                        hold: Hold {
                            received_at: r.received_at,
                            bytes: r.bytes,
                        },
                    });
                    continue;
                }
            };
            for mut pending in scored {
                let at = InputOffset {
                    tp: pending.tp.clone(),
                    generation: pending.generation,
                    offset: pending.offset,
                };
                let hold = Hold {
                    received_at: pending.received_at,
                    bytes: pending.bytes.take(),
                };
                self.remember_scores(&pending);
                let keeper = self.state.as_mut();
                // Without state, no second lookup of the partition per event.
                let store = match keeper {
                    Some(_) => self.partitions.get_mut(tp).and_then(Partition::state_mut),
                    None => None,
                };
                let (out, outcome) =
                    self.outputs
                        .compose(pending, |p, verdict| match (keeper, store) {
                            (Some(keeper), Some(store)) => keeper.step(
                                store,
                                Judging {
                                    tp: &p.tp,
                                    offset: p.offset,
                                    event: &p.event,
                                    key: p.original.key.as_deref(),
                                    timestamp_ms: p.original.timestamp_ms,
                                    rules: &p.rules,
                                    verdict,
                                    score: &|label| label_score(&p.scores, label),
                                },
                            ),
                            _ => Step::default(),
                        });
                self.deliver(ReadyOutput {
                    at,
                    out,
                    outcome,
                    hold,
                });
            }
        }
    }

    /// Enqueue an input record's outputs now; the hub's loop polls for
    /// their acknowledgement. Its hold (its share of the byte budget) is
    /// given back after it.
    pub(super) fn deliver(&mut self, ready: ReadyOutput) {
        let epoch = match self.txn.as_mut() {
            None => super::transaction::TxnEpoch::default(),
            Some(txn) => match txn.hand_over() {
                HandOver::Hold => {
                    txn.hold(ready);
                    return;
                }
                HandOver::Send { epoch } => epoch,
            },
        };
        let ReadyOutput {
            at:
                InputOffset {
                    tp,
                    generation,
                    offset,
                },
            out,
            outcome,
            hold: Hold { received_at, bytes },
        } = ready;
        let kind = out.main.kind;
        let source = Source {
            tp: tp.clone(),
            offset,
        };
        let span = out.span;
        let main = self
            .outbox
            .deliver(out.main, source.clone(), self.abort.clone());
        let also: Vec<_> = out
            .also
            .into_iter()
            .map(|r| {
                let copy = CopyOf {
                    kind: r.kind,
                    topic: r.topic.clone(),
                };
                let acked = self.outbox.deliver(r, source.clone(), self.abort.clone());
                async move { (copy, acked.await) }
            })
            .collect();
        let started = Instant::now();
        self.outgoing.push(Box::pin(async move {
            // The offset is done when all its records are acknowledged.
            let (main, also) = futures::future::join(main, futures::future::join_all(also)).await;
            let Delivered {
                outcome: delivered,
                refused_copies,
            } = combine(main, also);
            if let Some(span) = span {
                span.end(delivered.as_ref().map(|_| ()).map_err(ToString::to_string));
            }
            let outcome = delivered.map(|()| outcome);
            drop(bytes);
            Ack {
                tp,
                generation,
                offset,
                outcome,
                kind,
                refused_copies,
                took: started.elapsed(),
                received_at,
                txn: epoch,
            }
        }));
    }

    pub(super) fn on_ack(&mut self, ack: Ack) {
        let Ack {
            tp,
            generation,
            offset,
            outcome,
            kind,
            refused_copies,
            took,
            received_at,
            txn,
        } = ack;
        self.ledger.acknowledged(took);
        if let Some(boundary) = self.txn.as_mut() {
            let failed = match &outcome {
                Err(ProducerError::InTransaction(error)) => Some(error.as_str()),
                _ => None,
            };
            boundary.acknowledged(txn, failed);
        }
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(ProducerError::InTransaction(_)) => {
                // Its transaction will be aborted and the partition read
                // again; the offset stays undelivered until then.
                self.ledger.aborted_in_transaction();
                return;
            }
            Err(ProducerError::Fatal(message)) => {
                self.ledger.abandoned();
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
                let output = &self.settings.output;
                let topic = match kind {
                    RecordKind::Dlq => output.dlq_topic.clone(),
                    _ => output.topic.clone(),
                };
                self.undeliverable(&tp, offset, &Refused { kind, topic, error });
                self.count_refused_copies(&tp, offset, &refused_copies);
                self.advance(&tp, generation, offset);
                return;
            }
            Err(_) => {
                self.ledger.abandoned();
                return;
            }
        };
        match outcome {
            Outcome::Verdict(decided) => self.verdict_delivered(&decided, received_at, took),
            Outcome::Dlq(reason) => {
                self.ledger.dead_letter_delivered();
                metrics::counter!(metric::DLQ_TOTAL, "reason" => reason.code()).increment(1);
            }
        }
        self.count_refused_copies(&tp, offset, &refused_copies);
        self.advance(&tp, generation, offset);
    }

    /// A verdict reached its topic: counted by verdict and rule, and its
    /// latency told to the latency controllers of the models that scored it.
    fn verdict_delivered(
        &mut self,
        decided: &Decided,
        received_at: Instant,
        took: std::time::Duration,
    ) {
        let label = decided.verdict;
        self.ledger.verdict_delivered();
        self.meters.verdict(label, &decided.rules, decided.rule);
        let in_hub = received_at.elapsed();
        let end_to_end = decided.event_time_ms.map(|t| {
            let ms = (chrono::Utc::now().timestamp_millis() - t).max(0);
            self.meters.end_to_end.record(ms as f64 / 1000.0);
            std::time::Duration::from_millis(ms as u64)
        });
        // Without a record timestamp only the part in the hub is known.
        let end_to_end = end_to_end.unwrap_or(in_hub).max(in_hub);
        for &l in &decided.models {
            if let Some(lane) = self.lanes.get_mut(l) {
                lane.delivered(end_to_end, end_to_end - in_hub, took);
            }
        }
    }

    /// The copies of a committed offset that the broker refused for good.
    fn count_refused_copies(&mut self, tp: &Tp, offset: i64, refused: &[Refused]) {
        for copy in refused {
            self.undeliverable(tp, offset, copy);
        }
    }

    fn undeliverable(&mut self, tp: &Tp, offset: i64, refused: &Refused) {
        let kind = refused.kind.as_str();
        metrics::counter!(metric::UNDELIVERABLE_TOTAL, "kind" => kind).increment(1);
        tracing::error!(topic = %tp.topic, partition = tp.partition, offset, kind, to = %refused.topic, error = %refused.error, "the broker refuses this record for good; its offset is committed");
        self.ledger.undeliverable();
    }

    /// An offset is done: move its partition's position if it can.
    pub(super) fn advance(&mut self, tp: &Tp, generation: Generation, offset: i64) {
        let Some(partition) = self.partitions.get_mut(tp) else {
            return;
        };
        if partition.generation() != generation {
            return;
        }
        if let Some(position) = partition.ack(offset) {
            self.positions.moved(tp.clone(), position);
        }
    }

    fn partition_generation(&self, tp: &Tp) -> Generation {
        self.partitions
            .get(tp)
            .map_or(Generation::default(), Partition::generation)
    }
}

/// A routed copy or decision record, as its acknowledgement reports it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct CopyOf {
    pub(super) kind: RecordKind,
    pub(super) topic: String,
}

/// A record the broker refused for good.
#[derive(Debug)]
pub(super) struct Refused {
    kind: RecordKind,
    topic: String,
    error: String,
}

/// One offset's fate, from the acknowledgements of all its records.
#[derive(Debug)]
struct Delivered {
    outcome: Result<(), ProducerError>,
    refused_copies: Vec<Refused>,
}

/// A failure that is not a refusal for good (abandoned, fatal, in a
/// transaction) decides, the verdict's (or dead letter's) own first, since
/// the offset is then read again and every record sent again with it; then
/// the verdict's refusal for good (committed past). Copies refused for good
/// are only reported: they never hold the offset back.
fn combine(
    main: Result<(), ProducerError>,
    copies: Vec<(CopyOf, Result<(), ProducerError>)>,
) -> Delivered {
    let mut refused_copies = Vec::new();
    let mut copy_failure = None;
    for (copy, acked) in copies {
        match acked {
            // Counted where it was given up; never holds the offset.
            Ok(()) | Err(ProducerError::GivenUp(_)) => {}
            Err(ProducerError::Rejected(error)) => refused_copies.push(Refused {
                kind: copy.kind,
                topic: copy.topic,
                error,
            }),
            Err(e) => {
                copy_failure.get_or_insert(e);
            }
        }
    }
    let outcome = match (main, copy_failure) {
        // A copy abandoned beside a verdict refused for good: committing
        // past the refusal would lose the copy, which a rerun sends again.
        (Err(ProducerError::Rejected(_)), Some(e)) => Err(e),
        (Err(e), _) => Err(e),
        (Ok(()), Some(e)) => Err(e),
        (Ok(()), None) => Ok(()),
    };
    Delivered {
        outcome,
        refused_copies,
    }
}

/// The highest score for `label` among the models that scored an event.
fn label_score(scores: &[crate::verdict::ModelScores], label: &str) -> Option<f32> {
    scores
        .iter()
        .filter_map(|m| {
            let at = m.scorer.labels().iter().position(|l| l == label)?;
            m.probabilities.get(at).copied()
        })
        .reduce(f32::max)
}
