//! One lane per model: its queue of batches waiting for it, its runs in
//! flight, its circuit breaker, its batching choice (fixed, or its own
//! latency controller's) and the identity of each of its loaded versions.
//!
//! A closed batch goes through the lanes in model order: to the first model
//! that is to score any of its events, then, when that model's result is
//! back, to the next one, and so on; a batch no (further) model is to score
//! is finished ([`super::Scoring::queue`]). So every event is scored by exactly the
//! models its rule names, a batch's events go back to their partition
//! together, and a cheap model can run before an expensive one.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::breaker::{Breaker, BreakerAction, ProbeOutcome, RunOutcome};
use super::queue::RunQueue;
use super::slo::{self, Choice};
use crate::hub::partition::ReadyBatch;
use crate::inference::{InferenceJob, JobId};
use crate::policy::ModelId;
use crate::telemetry::metric;
use crate::verdict::Scorer;

/// What the hub needs of one loaded model to start.
pub struct ModelLane {
    pub scorer: Scorer,
    pub jobs: async_channel::Sender<InferenceJob>,
    pub workers: usize,
    /// Its largest run.
    pub max_batch: usize,
    /// A token model's `max_length` (`None`: a text model).
    pub max_length: Option<usize>,
}

/// A lane: a part that owns its model's queue, runs in flight, breaker and
/// batching choice; the hub asks it for runs and tells it how they ended.
pub(super) struct Lane {
    /// The identity of version 0 (the model the pipeline started with) and
    /// of each version a hot reload added since.
    scorer: Arc<Scorer>,
    reloaded: HashMap<u64, Arc<Scorer>>,
    /// The version of each worker's last result: a worker's versions only
    /// grow, so one older than all of these never comes back.
    worker_versions: Vec<u64>,
    jobs: async_channel::Sender<InferenceJob>,
    /// Batches waiting for this model (urgent ones first, see [`RunQueue`]).
    ready: RunQueue,
    /// Its runs in flight, and how many may be (two per worker).
    running: usize,
    capacity: usize,
    breaker: Breaker,
    /// Its run size (and the deadline it asks of partitions).
    batch: Choice,
    /// The predicted tokens a run may hold (`batching.max_batch_tokens`,
    /// or its controller's choice when it counts tokens).
    max_tokens: Option<u64>,
    max_length: Option<usize>,
    slo: Option<slo::Controller>,
    /// What its controller counts.
    unit: CostUnit,
}

/// What a lane's latency controller counts in its arrivals, runs and
/// choice: events, or predicted tokens (a token model with
/// `batching.max_batch_tokens`: a run's cost follows its tokens, not its
/// posts; the choice is then the run's token budget, the count bound stays
/// `max_batch_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CostUnit {
    Events,
    Tokens,
}

/// The lanes, one per model in model order, looked up by [`ModelId`].
pub(super) struct Lanes(Vec<Lane>);

impl Lanes {
    pub(super) fn new(lanes: Vec<Lane>) -> Lanes {
        Lanes(lanes)
    }

    /// Each lane with its model's id.
    pub(super) fn with_ids_mut(&mut self) -> impl Iterator<Item = (ModelId, &mut Lane)> {
        self.0.iter_mut().enumerate().map(|(i, l)| (ModelId(i), l))
    }

    pub(super) fn ids(&self) -> impl Iterator<Item = ModelId> + use<> {
        ModelId::all(self.0.len())
    }

    pub(super) fn get_mut(&mut self, id: ModelId) -> Option<&mut Lane> {
        self.0.get_mut(id.0)
    }

    /// The partitions' token budget: the smallest of the lanes' (no batch
    /// holds more tokens than any model's run may).
    pub(super) fn partition_tokens(&self) -> Option<u64> {
        self.0.iter().filter_map(|l| l.max_tokens).min()
    }

    /// The partitions' batching: closed at the smallest of the lanes' sizes
    /// (no batch is larger than any model's run) and their earliest deadline.
    pub(crate) fn partition_choice(&self) -> Choice {
        Choice {
            size: self.0.iter().map(|l| l.batch.size).min().unwrap_or(1),
            delay: (self.0.iter())
                .map(|l| l.batch.delay)
                .min()
                .unwrap_or_default(),
        }
    }
}

impl std::ops::Deref for Lanes {
    type Target = [Lane];
    fn deref(&self) -> &[Lane] {
        &self.0
    }
}

impl std::ops::DerefMut for Lanes {
    fn deref_mut(&mut self) -> &mut [Lane] {
        &mut self.0
    }
}

impl std::ops::Index<ModelId> for Lanes {
    type Output = Lane;
    fn index(&self, id: ModelId) -> &Lane {
        &self.0[id.0]
    }
}

impl std::ops::IndexMut<ModelId> for Lanes {
    fn index_mut(&mut self, id: ModelId) -> &mut Lane {
        &mut self.0[id.0]
    }
}

/// A run a lane took from its queue.
pub(super) struct NewRun {
    /// The batches whose events it scores (of one or more partitions).
    pub segments: Vec<ReadyBatch>,
    /// The events it scores.
    pub size: usize,
}

/// A latency controller's look at its lane (see [`Lane::adjust`]).
pub(super) struct Adjusted {
    pub was_missed: bool,
    pub status: slo::Status,
}

/// Events of a batch that model `lane` is to score, and their predicted tokens.
fn needing(batch: &ReadyBatch, lane: ModelId) -> (usize, u64) {
    batch
        .items
        .iter()
        .filter(|p| p.needs(lane))
        .fold((0, 0), |(n, tokens), p| (n + 1, tokens + p.tokens))
}

impl Lane {
    pub(super) fn new(spec: ModelLane, settings: &crate::config::BatchingSettings) -> Lane {
        let (unit, max_size) = match (spec.max_length, settings.max_batch_tokens) {
            (Some(_), Some(tokens)) => (CostUnit::Tokens, tokens as usize),
            _ => (CostUnit::Events, spec.max_batch),
        };
        let slo = settings.target_p99.map(|target| {
            slo::Controller::new(
                target,
                max_size,
                settings.max_batch_delay,
                spec.workers,
                Instant::now(),
            )
        });
        let first = slo.as_ref().map(slo::Controller::choice);
        let mut lane = Lane {
            scorer: Arc::new(spec.scorer),
            reloaded: HashMap::new(),
            worker_versions: vec![0; spec.workers.max(1)],
            jobs: spec.jobs,
            max_tokens: settings.max_batch_tokens,
            max_length: spec.max_length,
            ready: RunQueue::default(),
            running: 0,
            capacity: spec.workers.max(1) * 2,
            breaker: Breaker::default(),
            batch: Choice {
                size: spec.max_batch,
                delay: settings.max_batch_delay,
            },
            slo,
            unit,
        };
        if let Some(choice) = first {
            lane.apply(choice);
        }
        lane
    }

    /// Its controller's choice: the run size and deadline, or (counting
    /// tokens) the run's token budget and the deadline.
    fn apply(&mut self, choice: Choice) {
        match self.unit {
            CostUnit::Events => self.batch = choice,
            CostUnit::Tokens => {
                self.batch.delay = choice.delay;
                self.max_tokens = Some(choice.size as u64);
            }
        }
    }

    /// A hot reload added this version; results may carry it from now on.
    pub(super) fn reloaded(&mut self, version: u64, scorer: Arc<Scorer>) {
        self.reloaded.insert(version, scorer);
        self.export_versions();
    }

    /// `worker` answered a run with `version`: the versions no worker can
    /// answer with any more are let go (an event scored by one keeps its
    /// own reference until its verdict is out).
    pub(super) fn ran_version(&mut self, worker: usize, version: u64) {
        let Some(last) = self.worker_versions.get_mut(worker) else {
            return;
        };
        *last = (*last).max(version);
        let oldest = self.worker_versions.iter().copied().min().unwrap_or(0);
        let before = self.reloaded.len();
        self.reloaded.retain(|v, _| *v >= oldest);
        if self.reloaded.len() != before {
            self.export_versions();
        }
    }

    /// The versions this lane holds: the one it started with and those a
    /// reload added that a worker may still answer with.
    pub(super) fn versions_held(&self) -> usize {
        1 + self.reloaded.len()
    }

    fn export_versions(&self) {
        metrics::gauge!(metric::MODEL_VERSIONS_HELD, "model" => self.scorer.id.clone())
            .set(self.versions_held() as f64);
    }

    /// The identity of the version that scored a run.
    pub(super) fn scorer_of(&self, version: u64) -> Arc<Scorer> {
        self.reloaded
            .get(&version)
            .cloned()
            .unwrap_or_else(|| self.scorer.clone())
    }

    /// A token model's `max_length`.
    pub(super) fn max_length(&self) -> Option<usize> {
        self.max_length
    }

    pub(super) fn queued(&self) -> usize {
        self.ready.events()
    }

    /// The model's identity as it started (its id names it in metrics).
    pub(super) fn scorer(&self) -> &Arc<Scorer> {
        &self.scorer
    }

    /// A batch waits for this model.
    pub(super) fn enqueue(&mut self, batch: ReadyBatch) {
        self.ready.push(batch);
    }

    /// An urgent batch of another model: its partition's earlier batches
    /// here go ahead too (its verdict leaves after theirs anyway).
    pub(super) fn promote_earlier(&mut self, urgent: &ReadyBatch) {
        self.ready.promote_earlier(urgent);
    }

    /// Runs held back by the breaker go back to the front, in order.
    pub(super) fn requeue_front(&mut self, segments: Vec<ReadyBatch>) {
        for segment in segments.into_iter().rev() {
            self.ready.push_front(segment);
        }
    }

    /// Takes these partitions' batches off the queue; how many events they held.
    pub(super) fn drop_queued(&mut self, tps: &std::collections::HashSet<&crate::tp::Tp>) -> usize {
        let mut dropped = 0;
        self.ready.retain(|b| {
            let keep = !tps.contains(&b.tp);
            if !keep {
                dropped += b.items.len();
            }
            keep
        });
        dropped
    }

    /// Empties the queue (shutdown gave up); the events it held.
    pub(super) fn drain_queued(&mut self) -> usize {
        self.ready.drain().map(|b| b.items.len()).sum()
    }

    /// The next run of model `l` while its workers have room: ready batches
    /// coalesced (possibly of several partitions) up to its run size and
    /// token budget, counting the events it is to score, each batch first given to
    /// `prepare` (which may settle some of its events). Counted as running
    /// unless no event is left to score (size 0: the batches go on).
    pub(super) fn take_run(
        &mut self,
        l: ModelId,
        mut prepare: impl FnMut(&mut ReadyBatch),
    ) -> Option<NewRun> {
        if self.ready.is_empty() || self.running >= self.capacity {
            return None;
        }
        let mut segments = Vec::new();
        let (mut size, mut tokens) = (0, 0);
        while let Some(next) = self.ready.front_mut() {
            prepare(next);
            let (n, t) = needing(next, l);
            let over_budget = self.max_tokens.is_some_and(|max| tokens + t > max);
            if size > 0 && (size + n > self.batch.size || over_budget) {
                break;
            }
            let Some(batch) = self.ready.pop_front() else {
                break;
            };
            size += n;
            tokens += t;
            segments.push(batch);
        }
        if size > 0 {
            self.running += 1;
        }
        Some(NewRun { segments, size })
    }

    /// Hands a run to the workers' queue (bounded by the runs counted).
    pub(super) fn send(
        &self,
        job: InferenceJob,
    ) -> Result<(), async_channel::TrySendError<InferenceJob>> {
        self.jobs.try_send(job)
    }

    /// A run ended: the breaker's answer to how.
    pub(super) fn run_ended(
        &mut self,
        outcome: RunOutcome,
        limit: u32,
        now: Instant,
    ) -> BreakerAction {
        self.running = self.running.saturating_sub(1);
        self.breaker.on_run(outcome, limit, now)
    }

    /// Whether its circuit breaker is open.
    pub(super) fn breaker_open(&self) -> bool {
        self.breaker.is_open()
    }

    /// Whether job `id` is its breaker's probe.
    pub(super) fn is_probe(&self, id: JobId) -> bool {
        self.breaker.is_probe(id)
    }

    /// When its next probe is due, if the breaker is open.
    pub(super) fn next_probe(&self) -> Option<Instant> {
        self.breaker.next_probe()
    }

    /// The breaker's probe text when one is due and a worker has room.
    pub(super) fn probe_due(&mut self, now: Instant) -> Option<String> {
        if self.running >= self.capacity {
            return None;
        }
        self.breaker.probe_due(now)
    }

    /// Sends the probe run; the breaker waits for it if it went.
    pub(super) fn send_probe(&mut self, job: InferenceJob) {
        let id = job.id;
        if self.jobs.try_send(job).is_ok() {
            self.breaker.probe_sent(id);
        }
    }

    /// The probe ended, `scored` or not: the breaker's answer.
    pub(super) fn probe_ended(&mut self, scored: bool, now: Instant) -> ProbeOutcome {
        self.breaker.on_probe(scored, now)
    }

    /// Events arrived for this model, of these predicted tokens (its
    /// controller's arrival rate).
    pub(super) fn arrived(&mut self, events: u64, tokens: u64) {
        if let Some(controller) = self.slo.as_mut() {
            controller.arrived(match self.unit {
                CostUnit::Events => events,
                CostUnit::Tokens => tokens,
            });
        }
    }

    /// A run of these batches' events for model `l` took `took`.
    pub(super) fn model_ran(
        &mut self,
        l: ModelId,
        segments: &[ReadyBatch],
        took: std::time::Duration,
    ) {
        let unit = self.unit;
        if let Some(controller) = self.slo.as_mut() {
            let (events, tokens) = segments
                .iter()
                .map(|b| needing(b, l))
                .fold((0, 0), |(n, t), (bn, bt)| (n + bn, t + bt));
            let size = match unit {
                CostUnit::Events => events,
                CostUnit::Tokens => tokens as usize,
            };
            controller.model_run(size, took);
        }
    }

    /// A verdict this model scored went out (see [`slo::Controller::delivered`]).
    pub(super) fn delivered(
        &mut self,
        end_to_end: std::time::Duration,
        before_hub: std::time::Duration,
        delivery: std::time::Duration,
    ) {
        if let Some(controller) = self.slo.as_mut() {
            controller.delivered(end_to_end, before_hub, delivery);
        }
    }

    /// Its controller looks again (none without a latency target): a new
    /// choice becomes its run size and deadline.
    pub(super) fn adjust(&mut self, now: Instant, partitions: usize) -> Option<Adjusted> {
        let waiting = match self.unit {
            CostUnit::Events => self.queued(),
            CostUnit::Tokens => self.ready.tokens() as usize,
        };
        let queue = slo::Queue {
            waiting,
            partitions,
        };
        let controller = self.slo.as_mut()?;
        let was_missed = controller.status().missed;
        let chosen = controller.tick(now, queue);
        let status = controller.status();
        if let Some(choice) = chosen {
            self.apply(choice);
        }
        Some(Adjusted { was_missed, status })
    }

    /// When its controller looks next.
    pub(super) fn next_tick(&self) -> Option<Instant> {
        self.slo.as_ref().map(slo::Controller::next_tick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(workers: usize) -> Lane {
        let manifest: crate::inference::manifest::Manifest =
            serde_json::from_value(serde_json::json!({
                "name": "m", "version": "1", "input_kind": "text", "inputs": ["text"],
                "output": "p", "labels": ["offensive"], "score_label": "offensive",
            }))
            .unwrap();
        let spec = ModelLane {
            scorer: Scorer::named("default", &manifest),
            jobs: async_channel::bounded(1).0,
            workers,
            max_batch: 8,
            max_length: None,
        };
        let settings = crate::config::Settings::from_toml(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]",
        )
        .unwrap();
        Lane::new(spec, &settings.batching)
    }

    #[test]
    fn a_version_no_worker_can_answer_with_any_more_is_let_go() {
        let mut lane = lane(2);
        let manifest = |v: &str| -> crate::inference::manifest::Manifest {
            serde_json::from_value(serde_json::json!({
                "name": "m", "version": v, "input_kind": "text", "inputs": ["text"],
                "output": "p", "labels": ["offensive"], "score_label": "offensive",
            }))
            .unwrap()
        };
        let versions: Vec<Arc<Scorer>> = (1..=3)
            .map(|v| Arc::new(Scorer::named("default", &manifest(&v.to_string()))))
            .collect();
        for (v, scorer) in (1..).zip(&versions) {
            lane.reloaded(v, scorer.clone());
        }
        assert_eq!(lane.versions_held(), 4);
        // Worker 0 took all three swaps; worker 1 still answers with version 1.
        lane.ran_version(0, 3);
        lane.ran_version(1, 1);
        assert_eq!(lane.versions_held(), 4, "version 1 and 2 may still come");
        assert!(Arc::ptr_eq(&lane.scorer_of(1), &versions[0]));
        lane.ran_version(1, 3);
        assert_eq!(lane.versions_held(), 2, "the first and the last");
        assert!(Arc::ptr_eq(&lane.scorer_of(3), &versions[2]));
        assert_eq!(Arc::strong_count(&versions[0]), 1, "version 1 let go");
        // A late result of an older run of worker 0 lowers nothing.
        lane.ran_version(0, 2);
        assert_eq!(lane.versions_held(), 2);
    }
}
