//! One assigned partition's state, owned by the hub: the batcher that groups
//! its events, the tracker of its undelivered offsets, the reorder buffer
//! that puts its scored batches back in order, and the rebalance generation
//! it belongs to; and the table of the owned partitions ([`Partitions`]).
//!
//! Guarantee: batches of a partition are numbered in the order they close,
//! and [`Partition::next_in_order`] hands scored batches back strictly in
//! that order, whatever order the model finishes them in (so verdicts are
//! produced in offset order); the position reported by [`Partition::ack`]
//! never passes an offset whose record was not acknowledged.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use std::sync::Arc;

use crate::event;
use crate::policy::{ModelId, RuleId, Ruleset};
use crate::producer::record::{Original, OutRecord};
use crate::tp::{Generation, Tp};
use crate::verdict::Marks;
pub use crate::verdict::ModelScores;
use batcher::{Batcher, CloseReason, ClosedBatch};
use offsets::OffsetTracker;

pub mod batcher;
pub mod offsets;
mod table;

pub use table::Partitions;

/// A valid event waiting for its verdict.
#[derive(Debug)]
pub struct Pending {
    pub tp: Tp,
    /// The generation of the partition state that accepted it.
    pub generation: Generation,
    pub offset: i64,
    /// The input record as it was (key and timestamp go into the verdict;
    /// all of it into a dead-letter record if the model fails on it).
    pub original: Original,
    pub event: event::Event,
    /// When the consumer thread polled it.
    pub received_at: Instant,
    /// Its predicted tokens ([`crate::inference::tokens::TokenEstimate`]): what it
    /// costs of `batching.max_batch_tokens`.
    pub tokens: u64,
    /// Its share of `limits.max_in_flight_bytes` (see [`crate::consumer::ByteBudget`]).
    pub bytes: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The rules in force when it arrived, and the one that decides it
    /// (which models score it, and by which thresholds).
    pub rules: Arc<Ruleset>,
    pub rule: RuleId,
    /// Each model that scored it so far, in the order they ran.
    pub scores: Vec<ModelScores>,
    /// Why a model could not score it: it goes to the DLQ, and the models
    /// after that one skip it.
    pub failed: Option<crate::inference::ScoreError>,
    /// What matching found (with `[matching]`).
    pub matching: Matching,
}

/// What matching found for an event ([`crate::matching`]).
#[derive(Debug, Default)]
pub struct Matching {
    /// Its marks; a deciding list match means no model runs.
    pub marks: Option<Box<Marks>>,
    /// The near-duplicate cluster it joined (its scores may be kept for
    /// the cluster's later posts).
    pub cluster: Option<crate::verdict::ClusterId>,
    /// A wave record to write with its verdict (its wave started or grew).
    pub wave_record: Option<Box<OutRecord>>,
}

impl Pending {
    /// Whether model `model` is still to score this event.
    pub fn needs(&self, model: ModelId) -> bool {
        self.failed.is_none()
            && (self.matching.marks.as_ref()).is_none_or(|m| m.deciding().is_none())
            && self.scores_of(model).is_none()
            && self
                .rules
                .rule(self.rule)
                .is_some_and(|r| r.runs_after(model, |m| self.scores_of(m)))
    }

    /// Model `model`'s labels and probabilities of this event, if it scored it.
    pub fn scores_of(&self, model: ModelId) -> Option<(&[String], &[f32])> {
        self.scores
            .iter()
            .find(|m| m.model == model)
            .map(|m| (m.scorer.labels(), m.probabilities.as_slice()))
    }
}

/// An invalid event's dead-letter record, put in line with the partition's
/// batches (exactly-once: records are handed over in offset order).
#[derive(Debug)]
pub struct Rejected {
    pub offset: i64,
    pub out: OutRecord,
    pub reason: event::RejectReason,
    pub received_at: Instant,
    pub bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// What [`Partition::next_in_order`] hands back.
#[derive(Debug)]
pub enum Finished {
    /// Every model that was to score them has (or one failed).
    Scored(Vec<Pending>),
    Rejected(Box<Rejected>),
}

impl Finished {
    fn len(&self) -> usize {
        match self {
            Finished::Scored(s) => s.len(),
            Finished::Rejected(_) => 1,
        }
    }
}

/// A closed batch of one partition, numbered, waiting for (or in) a model run.
#[derive(Debug)]
pub struct ReadyBatch {
    pub tp: Tp,
    pub generation: Generation,
    pub seq: u64,
    pub items: Vec<Pending>,
    /// Closed by an urgent event: it jumps the dispatch queue.
    pub urgent: bool,
    /// How long its first event waited for the batch to close.
    pub waited: Duration,
}

pub struct Partition {
    tp: Tp,
    generation: Generation,
    batcher: Batcher<Pending>,
    offsets: OffsetTracker,
    /// Number of the next batch to close, and of the next one whose verdicts
    /// may be produced; `finished` holds scored batches that came back early.
    next_batch_seq: u64,
    next_emit_seq: u64,
    finished: BTreeMap<u64, Finished>,
}

impl Partition {
    pub fn new(
        tp: Tp,
        generation: Generation,
        max_batch_size: usize,
        max_batch_delay: Duration,
    ) -> Self {
        Partition {
            tp,
            generation,
            batcher: Batcher::new(max_batch_size, max_batch_delay),
            offsets: OffsetTracker::new(),
            next_batch_seq: 0,
            next_emit_seq: 0,
            finished: BTreeMap::new(),
        }
    }

    /// A budget of predicted tokens per batch (`batching.max_batch_tokens`).
    pub fn with_token_budget(mut self, max_batch_tokens: Option<u64>) -> Self {
        self.batcher = self.batcher.with_cost_budget(max_batch_tokens);
        self
    }

    pub fn tp(&self) -> &Tp {
        &self.tp
    }

    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// New batch limits (the latency target's controllers chose them).
    pub fn set_batching(
        &mut self,
        max_batch_size: usize,
        max_batch_delay: Duration,
        max_batch_tokens: Option<u64>,
    ) {
        self.batcher.set_limits(max_batch_size, max_batch_delay);
        self.batcher.set_cost_budget(max_batch_tokens);
    }

    /// Count a consumed offset (valid or not) as undelivered.
    pub fn track(&mut self, offset: i64) {
        self.offsets.track(offset);
    }

    /// Add a valid event; returns the batches it closed, in order: the
    /// open one when the event would have taken it over its token budget,
    /// and the event's own when the event closed it.
    pub fn push(
        &mut self,
        pending: Pending,
        urgent: bool,
        now: Instant,
    ) -> [Option<ReadyBatch>; 2] {
        let tokens = pending.tokens;
        let closed = self.batcher.push(pending, tokens, urgent, now);
        [
            closed.before.map(|b| self.number(b)),
            closed.with.map(|b| self.number(b)),
        ]
    }

    /// When the open batch must close, if one is open.
    pub fn deadline(&self) -> Option<Instant> {
        self.batcher.deadline()
    }

    /// Close the open batch if its deadline has passed.
    pub fn close_expired(&mut self, now: Instant) -> Option<ReadyBatch> {
        let closed = self.batcher.close_expired(now)?;
        Some(self.number(closed))
    }

    /// Close whatever is open (revoke, shutdown).
    pub fn flush(&mut self) -> Option<ReadyBatch> {
        let closed = self.batcher.flush()?;
        Some(self.number(closed))
    }

    fn number(&mut self, batch: ClosedBatch<Pending>) -> ReadyBatch {
        let seq = self.next_batch_seq;
        self.next_batch_seq += 1;
        ReadyBatch {
            tp: self.tp.clone(),
            generation: self.generation,
            seq,
            items: batch.items,
            urgent: batch.reason == CloseReason::Urgent,
            waited: batch.opened_at.elapsed(),
        }
    }

    /// A batch came back from the model.
    pub fn scored(&mut self, seq: u64, scored: Vec<Pending>) {
        self.finished.insert(seq, Finished::Scored(scored));
    }

    /// An invalid event goes in line after everything before it: the open
    /// batch closes (returned, to be scored) and the dead-letter record
    /// takes the next number, finished already.
    pub fn push_rejected(&mut self, rejected: Rejected) -> Option<ReadyBatch> {
        let open = self.flush();
        let seq = self.next_batch_seq;
        self.next_batch_seq += 1;
        self.finished
            .insert(seq, Finished::Rejected(Box::new(rejected)));
        open
    }

    /// The next finished batch in closing order, if it is back.
    pub fn next_in_order(&mut self) -> Option<Finished> {
        let finished = self.finished.remove(&self.next_emit_seq)?;
        self.next_emit_seq += 1;
        Some(finished)
    }

    /// Events finished but held back behind an earlier batch still in inference.
    pub fn held_back(&self) -> usize {
        self.finished.values().map(Finished::len).sum()
    }

    /// An offset's record was acknowledged; returns the position to store
    /// if it moved.
    pub fn ack(&mut self, offset: i64) -> Option<i64> {
        self.offsets.ack(offset);
        self.offsets.take_new_position()
    }

    /// The position to store at the end (revoke), if it moved since the last.
    pub fn final_position(&mut self) -> Option<i64> {
        self.offsets.take_new_position()
    }

    /// Events consumed and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.offsets.in_flight()
    }

    /// The oldest undelivered offset and how long it has waited.
    pub fn oldest_pending(&self, now: Instant) -> Option<(i64, Duration)> {
        self.offsets
            .oldest_pending()
            .map(|(offset, since)| (offset, now.saturating_duration_since(since)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn tp(partition: i32) -> Tp {
        Tp {
            topic: Arc::from("posts"),
            partition,
        }
    }

    pub fn pending(tp: &Tp, generation: Generation, offset: i64) -> Pending {
        Pending {
            tp: tp.clone(),
            generation,
            offset,
            original: Original::default(),
            received_at: Instant::now(),
            tokens: 4,
            bytes: None,
            rules: Arc::new(one_model_rules()),
            rule: RuleId(0),
            scores: Vec::new(),
            failed: None,
            matching: Matching::default(),
            event: event::validate(
                Some(format!(r#"{{"event_id":"e{offset}","text":"post {offset}"}}"#).as_bytes()),
                &Default::default(),
            )
            .unwrap(),
        }
    }

    /// `[policy]`'s default rule over one model with one label.
    pub fn one_model_rules() -> Ruleset {
        let model = crate::policy::ModelLabels {
            name: "default".into(),
            labels: vec!["offensive".into()],
            score_label: 0,
        };
        Ruleset::from_config(&Default::default(), &[model]).unwrap()
    }

    fn score(batch: ReadyBatch) -> Vec<Pending> {
        batch.items
    }

    fn offsets(scored: &[Pending]) -> Vec<i64> {
        scored.iter().map(|p| p.offset).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn batches_finished_out_of_order_come_back_in_closing_order() {
        let mut p = Partition::new(tp(0), Generation(1), 2, Duration::from_millis(20));
        let mut batches = Vec::new();
        for offset in 0..6 {
            p.track(offset);
            batches.extend(
                p.push(
                    pending(&tp(0), Generation(1), offset),
                    false,
                    Instant::now(),
                )
                .into_iter()
                .flatten(),
            );
        }
        assert_eq!(batches.len(), 3);
        assert_eq!(
            batches.iter().map(|b| b.seq).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        let third = batches.pop().unwrap();
        let second = batches.pop().unwrap();
        let first = batches.pop().unwrap();
        // The model finishes the last batch first: nothing may be produced yet.
        p.scored(third.seq, score(third));
        p.scored(second.seq, score(second));
        assert!(p.next_in_order().is_none());
        assert_eq!(p.held_back(), 4);
        p.scored(first.seq, score(first));
        let order: Vec<i64> = std::iter::from_fn(|| p.next_in_order())
            .flat_map(|b| match b {
                Finished::Scored(s) => offsets(&s),
                Finished::Rejected(r) => vec![r.offset],
            })
            .collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(p.held_back(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_position_waits_for_the_earliest_unacknowledged_offset() {
        let mut p = Partition::new(tp(0), Generation(1), 8, Duration::from_millis(20));
        for offset in 10..13 {
            p.track(offset);
        }
        assert_eq!(p.in_flight(), 3);
        assert_eq!(p.ack(12), Some(10), "10 and 11 are not delivered yet");
        assert_eq!(p.ack(11), None);
        assert_eq!(p.ack(10), Some(13), "all delivered: one past the last");
        assert_eq!(p.in_flight(), 0);
        assert_eq!(p.final_position(), None, "already reported");
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_batch_closes_at_its_deadline_and_reports_its_wait() {
        let mut p = Partition::new(tp(3), Generation(7), 64, Duration::from_millis(20));
        p.track(0);
        let closed = p.push(pending(&tp(3), Generation(7), 0), false, Instant::now());
        assert!(closed.iter().all(Option::is_none));
        let deadline = p.deadline().expect("a batch is open");
        tokio::time::advance(Duration::from_millis(19)).await;
        assert!(p.close_expired(Instant::now()).is_none());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(Instant::now(), deadline);
        let batch = p
            .close_expired(Instant::now())
            .expect("closed at the deadline");
        assert_eq!(
            (batch.tp.clone(), batch.generation, batch.seq),
            (tp(3), Generation(7), 0)
        );
        assert_eq!(batch.waited, Duration::from_millis(20));
        assert!(!batch.urgent);
        // An urgent event closes its batch at once.
        p.track(1);
        let [before, urgent] = p.push(pending(&tp(3), Generation(7), 1), true, Instant::now());
        assert!(before.is_none());
        let urgent = urgent.unwrap();
        assert!(urgent.urgent);
        assert_eq!(urgent.seq, 1);
    }
}
