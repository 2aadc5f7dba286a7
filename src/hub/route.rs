//! An event's way through the hub, in the order it goes: each step hands
//! one stage's answer to the next stage ([`super::stages`]).
//!
//! 1. take in and decode ([`Hub::on_record`]): a stale record (polled
//!    before its partition's last revoke) goes no further; the offset is
//!    tracked by its partition; the record is read into an event, or its
//!    dead letter goes in its place ([`Hub::dead_letter`]);
//! 2. match: lists and waves mark the event;
//! 3. batch ([`Hub::batch`]): it joins its partition's open batch; a closed
//!    batch goes to scoring;
//! 4. score ([`Hub::send_on`], [`Hub::dispatch`], [`Hub::on_inference_result`]):
//!    through the models its events need, then back to its partition;
//! 5. order, judge and compose ([`Hub::emit_in_order`]): a partition's
//!    batches in closing order; each event judged (policy, then state
//!    rules) and its records composed;
//! 6. deliver ([`Hub::deliver`], [`Hub::on_ack`]): handed to the producer,
//!    acknowledged;
//! 7. store the position ([`Hub::advance`]): the partition's first
//!    undelivered offset moved, for the consumer thread to store.

use super::stages::delivery::{Ack, Acked, Hold, InputOffset, ReadyOutput};
use super::stages::intake::{Decoded, Unreadable};
use super::stages::judge;
use super::stages::outputs::Outcome;
use super::stages::scoring::{Dispatched, Queued, Ran};
use super::{Deliver, Hub};
use crate::consumer::Ingested;
use crate::hub::partition::{Finished, Pending, ReadyBatch, Rejected};
use crate::inference::InferenceResult;
use crate::policy::ModelId;
use crate::telemetry::metric;
use crate::tp::{Generation, Tp};
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    /// Steps 1 to 3: take in and decode, match, batch.
    pub(super) fn on_record(&mut self, record: Ingested) {
        let stale = self.revokes.is_stale(&record.tp, record.generation);
        self.ledger.polled(stale);
        if stale {
            metrics::counter!(metric::STALE_RECORDS_TOTAL).increment(1);
            return;
        }
        // A revoke whose drain the consumer gave up on ends here, before the
        // partition's new assignment starts.
        if let Some(old) = self.partitions.get(&record.tp)
            && self.revokes.is_stale(&record.tp, old.generation())
        {
            self.finish_revokes(true);
        }
        let generation = self.track(&record);
        self.ledger.accepted();
        match self.stages.intake.take_in(record, generation) {
            Decoded::Valid {
                mut pending,
                urgent,
            } => {
                self.stages.scoring.arrived(&pending);
                self.stages.matching.inspect(&mut pending);
                self.batch(pending, urgent);
            }
            Decoded::Invalid(unreadable) => self.dead_letter(unreadable),
        }
    }

    /// The record's offset counted as undelivered in its partition, made
    /// (its state read back, see [`super::stages::state`]) if this is its
    /// first record. Returns the partition state's generation:
    /// acknowledgements are matched against it, not the (newer) one a later
    /// rebalance stamps on records.
    fn track(&mut self, record: &Ingested) -> Generation {
        let batching = &self.stages.batching;
        let mut new = false;
        let partition = self.partitions.entry(record.tp.clone()).or_insert_with(|| {
            new = true;
            batching.partition(record.tp.clone(), record.generation)
        });
        partition.track(record.offset);
        let generation = partition.generation();
        if new {
            self.stages
                .state
                .opened(&record.tp, generation, record.offset);
        }
        generation
    }

    /// Step 3: a valid event joins its partition's open batch; the batches it
    /// closed go to scoring.
    fn batch(&mut self, pending: Pending, urgent: bool) {
        let Some(partition) = self.partitions.get_mut(&pending.tp) else {
            return;
        };
        let at = pending.received_at;
        let before = partition.deadline();
        let closed = partition.push(pending, urgent, at);
        self.stages.batching.joined(partition, before);
        for batch in closed.into_iter().flatten() {
            self.enqueue(batch);
        }
    }

    /// An unreadable record's dead-letter record goes out at once; with
    /// exactly-once in offset order with the verdicts, behind its
    /// partition's open batch (see [`super::stages::delivery::transaction`]).
    fn dead_letter(&mut self, u: Unreadable) {
        let out = (self.stages.outputs).rejected(&u.tp, u.offset, u.original, &u.rejection);
        let rejected = Rejected {
            offset: u.offset,
            out,
            reason: u.rejection.reason,
            received_at: u.received_at,
            bytes: u.bytes,
        };
        if self.stages.delivery.in_transactions() {
            let Some(partition) = self.partitions.get_mut(&u.tp) else {
                return;
            };
            if let Some(batch) = partition.push_rejected(rejected) {
                self.enqueue(batch);
            }
            self.emit_in_order(&u.tp);
            return;
        }
        self.deliver(ReadyOutput {
            at: InputOffset {
                tp: u.tp,
                generation: u.generation,
                offset: rejected.offset,
            },
            out: rejected.out.into(),
            outcome: Outcome::Dlq(rejected.reason),
            hold: Hold {
                received_at: rejected.received_at,
                bytes: rejected.bytes,
            },
        });
    }

    /// A closed batch goes to its first model's queue (urgent ones ahead
    /// of the others).
    pub(super) fn enqueue(&mut self, batch: ReadyBatch) {
        metrics::histogram!(metric::BATCH_WAIT_SECONDS).record(batch.waited.as_secs_f64());
        self.ledger.batch_closed(batch.waited);
        self.send_on(batch, ModelId(0));
    }

    /// Close the batches whose deadline has passed.
    pub(super) fn close_expired(&mut self) {
        let closed = (self.stages.batching).close_due(Instant::now(), &mut self.partitions);
        for batch in closed {
            self.enqueue(batch);
        }
    }

    pub(super) fn flush_all(&mut self) {
        let tps: Vec<Tp> = self.partitions.keys().cloned().collect();
        self.flush(&tps);
    }

    /// Close whatever is open of these partitions (revoke, rewind, shutdown).
    pub(super) fn flush(&mut self, tps: &[Tp]) {
        for tp in tps {
            if let Some(batch) = self.partitions.get_mut(tp).and_then(|p| p.flush()) {
                self.enqueue(batch);
            }
        }
    }

    /// Step 4: a batch goes to the first model from `from` on that is to score
    /// any of its events; when none is, back to its partition (in order),
    /// to be delivered.
    fn send_on(&mut self, batch: ReadyBatch, from: ModelId) {
        if !self.partitions.current(&batch.tp, batch.generation) {
            // Revoked meanwhile and the drain gave up: the next owner
            // reprocesses these events.
            self.ledger.dropped(batch.items.len());
            return;
        }
        if let Queued::Done(batch) = self.stages.scoring.queue(batch, from) {
            self.scored(batch);
        }
    }

    /// A batch no (further) model is to score, unless its partition state
    /// was dropped since.
    fn done_scoring(&mut self, batch: ReadyBatch) {
        if !self.partitions.current(&batch.tp, batch.generation) {
            self.ledger.dropped(batch.items.len());
            return;
        }
        self.scored(batch);
    }

    /// Every model's runs to its workers, while they have room.
    pub(super) fn dispatch(&mut self) {
        let matching = &self.stages.matching;
        let dispatched = self.stages.scoring.dispatch(|b| matching.take_kept(b));
        for d in dispatched {
            match d {
                Dispatched::Run { size } => self.ledger.run_started(size),
                Dispatched::Done(batch) => self.done_scoring(batch),
                Dispatched::Refused(result) => self.on_inference_result(result),
            }
        }
    }

    /// Step 4: a run's result: its batches go on to the next model they need.
    pub(super) fn on_inference_result(&mut self, result: InferenceResult) {
        let Ran::Scored(run) = self.stages.scoring.finished(result) else {
            return;
        };
        self.ledger.run_scored(run.elapsed, run.tokens);
        self.stages.intake.learn(run.tokens);
        for segment in run.segments {
            self.send_on(segment, run.next);
        }
    }

    /// A batch no (further) model is to score is back with its partition.
    fn scored(&mut self, batch: ReadyBatch) {
        let tp = batch.tp.clone();
        if let Some(partition) = self.partitions.get_mut(&tp) {
            partition.scored(batch.seq, batch.items);
        }
        self.emit_in_order(&tp);
    }

    /// Step 5: a partition's finished batches in closing order: each event
    /// judged and its records composed, then delivered. A partition whose
    /// state is being read back waits for it.
    pub(super) fn emit_in_order(&mut self, tp: &Tp) {
        if self.stages.state.holds(tp) {
            return;
        }
        let generation = self.partitions.generation_of(tp);
        while let Some(finished) = self.partitions.get_mut(tp).and_then(|p| p.next_in_order()) {
            match finished {
                Finished::Scored(scored) => {
                    for pending in scored {
                        self.judge_and_deliver(pending);
                    }
                }
                Finished::Rejected(r) => {
                    let r = *r;
                    self.deliver(ReadyOutput {
                        at: InputOffset {
                            tp: tp.clone(),
                            generation,
                            offset: r.offset,
                        },
                        out: r.out.into(),
                        outcome: Outcome::Dlq(r.reason),
                        hold: Hold {
                            received_at: r.received_at,
                            bytes: r.bytes,
                        },
                    });
                }
            }
        }
    }

    /// Step 5: judge (the policy, then the state rules) and compose one event's
    /// records; a model's failure is dead-lettered instead.
    fn judge_and_deliver(&mut self, mut pending: Pending) {
        let at = InputOffset {
            tp: pending.tp.clone(),
            generation: pending.generation,
            offset: pending.offset,
        };
        let hold = Hold {
            received_at: pending.received_at,
            bytes: pending.bytes.take(),
        };
        self.stages.matching.remember(&pending);
        let stages = &mut self.stages;
        let (out, outcome) = match pending.failed.take() {
            Some(failure) => stages.outputs.failed(pending, failure),
            None => {
                let judgement = judge::judge(&pending, &mut stages.state);
                stages.outputs.compose(pending, judgement)
            }
        };
        self.deliver(ReadyOutput {
            at,
            out,
            outcome,
            hold,
        });
    }

    /// Step 6: an input record's outputs to the producer (or, sealed, held for
    /// the next transaction).
    pub(super) fn deliver(&mut self, ready: ReadyOutput) {
        self.stages.delivery.hand_over(ready);
    }

    /// Step 6, the fast way: a record's report is its offset's
    /// acknowledgement, unless it failed (then its delivery goes on).
    pub(super) fn on_reports(
        &mut self,
        reports: impl Iterator<Item = crate::producer::reports::Report>,
    ) {
        for report in reports {
            if let Some(ack) = self.stages.delivery.reported(report) {
                self.on_ack(ack);
            }
        }
    }

    /// Deliveries are given up: the offsets waiting for their reports are
    /// abandoned, uncommitted.
    pub(super) fn abandon_reported(&mut self) {
        for ack in self.stages.delivery.abandon_reported() {
            self.on_ack(ack);
        }
    }

    /// Step 6: an offset's records were answered: counted, and its position
    /// moves if they were delivered (or refused for good).
    pub(super) fn on_ack(&mut self, ack: Ack) {
        self.ledger.acknowledged(ack.took());
        match self.stages.delivery.acknowledged(ack) {
            Acked::Delivered {
                at,
                outcome,
                refused,
                received_at,
                took,
            } => {
                match outcome {
                    Outcome::Verdict(decided) => {
                        let latency = self.ledger.verdict_delivered(&decided, received_at);
                        (self.stages.scoring).delivered(
                            &decided.models,
                            latency.end_to_end,
                            latency.in_hub,
                            took,
                        );
                    }
                    Outcome::Dlq(reason) => self.ledger.dead_letter_delivered(reason),
                }
                for copy in &refused {
                    self.ledger.undeliverable(&at.tp, at.offset, copy);
                }
                self.advance(&at);
            }
            // Never pins the partition: counted, logged with where the
            // original lives, and committed past.
            Acked::Refused { at, refused } => {
                for record in &refused {
                    self.ledger.undeliverable(&at.tp, at.offset, record);
                }
                self.advance(&at);
            }
            // Its transaction will be aborted and the partition read
            // again; the offset stays undelivered until then.
            Acked::InTransaction => self.ledger.aborted_in_transaction(),
            Acked::Abandoned => self.ledger.abandoned(),
            Acked::Fatal => {
                self.ledger.abandoned();
                self.shutdown.stop.cancel();
                self.shutdown.abort.cancel();
            }
        }
    }

    /// Step 7: an offset is done: its partition's position moves if it can, for
    /// the consumer thread to store.
    fn advance(&mut self, at: &InputOffset) {
        let Some(partition) = self.partitions.get_mut(&at.tp) else {
            return;
        };
        if partition.generation() != at.generation {
            return;
        }
        if let Some(position) = partition.ack(at.offset) {
            self.stages.positions.moved(at.tp.clone(), position);
        }
    }
}
