//! One lane per model: its queue of batches waiting for it, its runs in
//! flight, its circuit breaker, its batching choice (fixed, or its own
//! latency controller's) and the identity of each of its loaded versions.
//!
//! A closed batch goes through the lanes in model order: to the first model
//! that is to score any of its events, then, when that model's result is
//! back, to the next one, and so on; a batch no (further) model is to score
//! is finished ([`Hub::send_on`]). So every event is scored by exactly the
//! models its rule names, a batch's events go back to their partition
//! together, and a cheap model can run before an expensive one.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::breaker::Breaker;
use super::queue::RunQueue;
use super::{Deliver, Hub};
use crate::inference::InferenceJob;
use crate::partition::ReadyBatch;
use crate::slo::{self, Choice};
use crate::verdict::Scorer;

/// What the hub needs of one loaded model to start.
pub struct ModelLane {
    pub scorer: Scorer,
    pub jobs: async_channel::Sender<InferenceJob>,
    pub workers: usize,
    /// Its largest run.
    pub max_batch: usize,
}

pub(super) struct Lane {
    /// The identity of version 0 (the model the pipeline started with) and
    /// of each version a hot reload added since.
    pub(super) scorer: Arc<Scorer>,
    pub(super) reloaded: HashMap<u64, Arc<Scorer>>,
    pub(super) jobs: async_channel::Sender<InferenceJob>,
    /// Batches waiting for this model (urgent ones first, see [`RunQueue`]).
    pub(super) ready: RunQueue,
    /// Its runs in flight, and how many may be (two per worker).
    pub(super) running: usize,
    pub(super) capacity: usize,
    pub(super) breaker: Breaker,
    /// Its run size (and the deadline it asks of partitions).
    pub(super) batch: Choice,
    pub(super) slo: Option<slo::Controller>,
}

impl Lane {
    pub(super) fn new(spec: ModelLane, settings: &crate::config::BatchingSettings) -> Lane {
        let slo = settings.target_p99.map(|target| {
            slo::Controller::new(
                target,
                spec.max_batch,
                settings.max_batch_delay,
                spec.workers,
                Instant::now(),
            )
        });
        let batch = slo.as_ref().map_or(
            Choice {
                size: spec.max_batch,
                delay: settings.max_batch_delay,
            },
            slo::Controller::choice,
        );
        Lane {
            scorer: Arc::new(spec.scorer),
            reloaded: HashMap::new(),
            jobs: spec.jobs,
            ready: RunQueue::default(),
            running: 0,
            capacity: spec.workers.max(1) * 2,
            breaker: Breaker::default(),
            batch,
            slo,
        }
    }

    /// The identity of the version that scored a run.
    pub(super) fn scorer_of(&self, version: u64) -> Arc<Scorer> {
        self.reloaded
            .get(&version)
            .cloned()
            .unwrap_or_else(|| self.scorer.clone())
    }

    pub(super) fn queued(&self) -> usize {
        self.ready.events()
    }
}

/// The partitions' batching: closed at the smallest of the lanes' sizes
/// (no batch is larger than any model's run) and their earliest deadline.
pub(super) fn partition_choice(lanes: &[Lane]) -> Choice {
    Choice {
        size: lanes.iter().map(|l| l.batch.size).min().unwrap_or(1),
        delay: lanes
            .iter()
            .map(|l| l.batch.delay)
            .min()
            .unwrap_or_default(),
    }
}

impl<D: Deliver> Hub<D> {
    /// A batch goes to the first model from `from` on that is to score any
    /// of its events; when none is, its events go back to their partition
    /// (in order), to be delivered.
    pub(super) fn send_on(&mut self, batch: ReadyBatch, from: usize) {
        let tp = batch.tp.clone();
        let current = self
            .partitions
            .get(&tp)
            .is_some_and(|p| p.generation() == batch.generation);
        if !current {
            // Revoked meanwhile and the drain gave up: the next owner
            // reprocesses these events.
            self.release(batch.items.len());
            return;
        }
        let next = (from..self.lanes.len()).find(|&l| batch.items.iter().any(|p| p.needs(l)));
        if let Some(l) = next {
            if batch.urgent {
                for (m, lane) in self.lanes.iter_mut().enumerate() {
                    if m != l {
                        lane.ready.promote_earlier(&batch);
                    }
                }
            }
            self.lanes[l].ready.push(batch);
            return;
        }
        if let Some(partition) = self.partitions.get_mut(&tp) {
            partition.scored(batch.seq, batch.items);
        }
        self.emit_in_order(&tp);
    }

    /// Whether any model's circuit breaker is open.
    pub(super) fn any_breaker_open(&self) -> bool {
        self.lanes.iter().any(|l| l.breaker.open)
    }

    /// Events waiting for a model.
    pub(super) fn queued(&self) -> usize {
        self.lanes.iter().map(Lane::queued).sum()
    }
}
