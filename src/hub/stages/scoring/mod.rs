//! Score: a closed batch goes through the lanes in model order ([`lanes`]):
//! each model's waiting batches are coalesced into its runs (possibly of
//! several partitions) while its workers have room, and each result is
//! taken back to its batches, which then go on to the next model their
//! events need, or, when none, back to their partition. Owns the lanes
//! (queues, breakers, batching choices and latency controllers), the runs
//! in inference ([`jobs`]) and, with `[tracing]`, each run's span.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Settings;
use crate::hub::partition::{ModelScores, Pending, ReadyBatch};
use crate::inference::{InferenceJob, InferenceResult, ScoreError, TokenStats};
use crate::policy::ModelId;
use crate::telemetry::trace_context::TraceContext;
use crate::telemetry::traces::{Run, Traces};
use crate::telemetry::{Health, metric};
use crate::tp::Tp;
use crate::verdict::NewScorer;

mod breaker;
mod jobs;
mod lanes;
mod queue;
pub(crate) mod slo;

use breaker::{BreakerAction, ProbeOutcome, RunOutcome, first_error};
pub use lanes::ModelLane;
use lanes::{Adjusted, Lane, Lanes, NewRun};
use slo::Choice;

pub(crate) struct Scoring {
    /// One lane per model, in the order they score an event.
    lanes: Lanes,
    /// Runs in inference, matched to their results.
    jobs: jobs::JobTable,
    /// `inference.breaker_after`: runs failed whole before a breaker opens.
    breaker_after: u32,
    /// With `[tracing]`: each model run's span.
    traces: Option<Traces>,
    /// /readyz's `model_failing` while a breaker is open.
    health: Arc<Health>,
}

/// Where a batch is after [`Scoring::queue`].
pub(crate) enum Queued {
    /// It waits for a model.
    Waiting,
    /// No (further) model is to score its events: they go back to their
    /// partition.
    Done(ReadyBatch),
}

/// What [`Scoring::dispatch`] did.
pub(crate) enum Dispatched {
    /// A run of this many events went to a model's workers.
    Run { size: usize },
    /// A batch none of whose events a model is still to score (a wave's
    /// kept scores settled them at their model's turn): it is done.
    Done(ReadyBatch),
    /// A run its queue refused (cannot happen while the runs in flight
    /// bound it): taken as its result, every event failed.
    Refused(InferenceResult),
}

/// What a result came back to.
pub(crate) enum Ran {
    /// A probe's, or one of a run no longer held: nothing goes on.
    Nothing,
    /// The model failed every event and its breaker holds the run back:
    /// its batches are back at the front of its queue.
    HeldBack,
    /// The model scored the run.
    Scored(ScoredRun),
}

/// A run the model scored: its batches (each event with its scores, or
/// why it has none), which go on from the model `next`.
pub(crate) struct ScoredRun {
    pub segments: Vec<ReadyBatch>,
    pub next: ModelId,
    pub elapsed: Duration,
    pub tokens: TokenStats,
}

/// What the latency controllers' look found.
pub(crate) struct Looked {
    /// A model batches for throughput: the target cannot be held.
    pub saturated: bool,
    pub missed: bool,
}

impl Scoring {
    pub(crate) fn new(settings: &Settings, models: Vec<ModelLane>, health: Arc<Health>) -> Scoring {
        let lanes = (models.into_iter())
            .map(|m| Lane::new(m, &settings.batching))
            .collect();
        Scoring {
            lanes: Lanes::new(lanes),
            jobs: jobs::JobTable::default(),
            breaker_after: settings.inference.breaker_after,
            traces: None,
            health,
        }
    }

    /// Record each model run's span (`None`: tracing off).
    pub(crate) fn set_traces(&mut self, traces: Option<Traces>) {
        self.traces = traces;
    }

    /// The partitions' batching from the lanes' choices: the smallest size
    /// and token budget, the earliest deadline.
    pub(crate) fn partition_choice(&self) -> (Choice, Option<u64>) {
        (self.lanes.partition_choice(), self.lanes.partition_tokens())
    }

    /// The longest token model's `max_length`.
    pub(crate) fn max_length(&self) -> Option<usize> {
        self.lanes.iter().filter_map(Lane::max_length).max()
    }

    /// An event arrived: the latency controllers of the models its rule
    /// names count it (and its predicted tokens).
    pub(crate) fn arrived(&mut self, pending: &Pending) {
        let Some(rule) = pending.rules.rule(pending.rule) else {
            return;
        };
        for (l, lane) in self.lanes.with_ids_mut() {
            if rule.runs(l) {
                lane.arrived(1, pending.tokens);
            }
        }
    }

    /// A batch goes to the first model from `from` on that is to score any
    /// of its events; when none is, it is done.
    pub(crate) fn queue(&mut self, batch: ReadyBatch, from: ModelId) -> Queued {
        let next = (self.lanes.ids())
            .skip(from.0)
            .find(|&l| batch.items.iter().any(|p| p.needs(l)));
        let Some(l) = next else {
            return Queued::Done(batch);
        };
        if batch.urgent {
            for (m, lane) in self.lanes.with_ids_mut() {
                if m != l {
                    lane.promote_earlier(&batch);
                }
            }
        }
        self.lanes[l].enqueue(batch);
        Queued::Waiting
    }

    /// Every model's runs, while its workers' queue has room: ready batches
    /// coalesced into runs of at most the model's run size, counting the
    /// events it is to score, each batch first given to `prepare` (a wave's
    /// kept scores, see [`super::matching::Matching::take_kept`]).
    pub(crate) fn dispatch(&mut self, mut prepare: impl FnMut(&mut ReadyBatch)) -> Vec<Dispatched> {
        let mut done = Vec::new();
        for l in self.lanes.ids() {
            if self.lanes[l].breaker_open() {
                self.probe(l);
                continue;
            }
            while let Some(NewRun { mut segments, size }) = self.lanes[l].take_run(l, &mut prepare)
            {
                if size == 0 {
                    // On to a later model, dispatched later in this pass.
                    for batch in segments {
                        if let Queued::Done(batch) = self.queue(batch, l.next()) {
                            done.push(Dispatched::Done(batch));
                        }
                    }
                    continue;
                }
                let texts = segments
                    .iter_mut()
                    .flat_map(|s| {
                        s.items
                            .iter_mut()
                            .filter(|p| p.needs(l))
                            .map(|p| std::mem::take(&mut p.event.text))
                    })
                    .collect();
                metrics::histogram!(metric::BATCH_SIZE).record(size as f64);
                done.push(Dispatched::Run { size });
                let id = self.jobs.started(l, segments);
                if let Err(e) = self.lanes[l].send(InferenceJob { id, texts }) {
                    tracing::error!("inference queue full despite the bound");
                    let texts = e.into_inner().texts;
                    done.push(Dispatched::Refused(InferenceResult {
                        id,
                        scores: vec![],
                        texts,
                        elapsed: Duration::ZERO,
                        tokens: Default::default(),
                        version: 0,
                        worker: 0,
                    }));
                }
            }
        }
        done
    }

    /// A result came back: to its run's batches (with their scores), or
    /// to the breaker that sent it as a probe.
    pub(crate) fn finished(&mut self, result: InferenceResult) -> Ran {
        let run_lane = self.jobs.lane_of(result.id).or_else(|| {
            let probe = |lane: &Lane| lane.is_probe(result.id);
            self.lanes.iter().position(probe).map(ModelId)
        });
        if let Some(lane) = run_lane.and_then(|l| self.lanes.get_mut(l)) {
            lane.ran_version(result.worker, result.version);
        }
        let probe = self.lanes.iter().position(|lane| lane.is_probe(result.id));
        if let Some(l) = probe.map(ModelId) {
            self.probe_ended(l, &result);
            return Ran::Nothing;
        }
        let Some(jobs::Running { lane: l, segments }) = self.jobs.finished(result.id) else {
            return Ran::Nothing;
        };
        let lane = &mut self.lanes[l];
        let dead = !result.scores.is_empty() && result.scores.iter().all(Result::is_err);
        let outcome = if dead {
            RunOutcome::AllFailed
        } else {
            let scored = result.scores.iter().position(Result::is_ok);
            RunOutcome::Scored(scored.and_then(|i| result.texts.get(i).cloned()))
        };
        let limit = self.breaker_after;
        if let BreakerAction::HoldBack { opened } = lane.run_ended(outcome, limit, Instant::now()) {
            self.hold_back(l, segments, result, opened);
            return Ran::HeldBack;
        }
        metrics::histogram!(metric::INFERENCE_SECONDS).record(result.elapsed.as_secs_f64());
        lane.model_ran(l, &segments, result.elapsed);
        metrics::counter!(metric::TOKENS_REAL_TOTAL).increment(result.tokens.real);
        metrics::counter!(metric::TOKENS_PADDED_TOTAL).increment(result.tokens.padded);
        // The model version that scored it (a reload may have switched it).
        let scorer = lane.scorer_of(result.version);
        metrics::counter!(metric::MODEL_EVENTS_TOTAL, "model" => scorer.id.clone())
            .increment(result.scores.len() as u64);
        if let Some(traces) = &self.traces {
            trace_run(traces, l, &scorer, &segments, &result);
        }
        let (elapsed, tokens) = (result.elapsed, result.tokens);
        let mut scores = result.scores.into_iter();
        let mut texts = result.texts.into_iter();
        let mut segments = segments;
        for segment in &mut segments {
            for p in segment.items.iter_mut().filter(|p| p.needs(l)) {
                p.event.text = texts.next().unwrap_or_default();
                match scores.next() {
                    Some(Ok(probabilities)) => p.scores.push(ModelScores {
                        model: l,
                        scorer: scorer.clone(),
                        probabilities,
                        reused: false,
                    }),
                    Some(Err(e)) => p.failed = Some(e),
                    None => p.failed = Some(ScoreError::Missing),
                }
            }
        }
        Ran::Scored(ScoredRun {
            segments,
            next: l.next(),
            elapsed,
            tokens,
        })
    }

    /// A hot reload added a model version; results may carry it from now on.
    pub(crate) fn reloaded(&mut self, new: NewScorer) {
        if let Some(lane) = self.lanes.get_mut(new.model) {
            lane.reloaded(new.version, new.scorer);
        }
    }

    /// A verdict these models scored went out: their latency controllers
    /// count its latency (see [`slo::Controller::delivered`]).
    pub(crate) fn delivered(
        &mut self,
        models: &[ModelId],
        end_to_end: Duration,
        in_hub: Duration,
        took: Duration,
    ) {
        for &l in models {
            if let Some(lane) = self.lanes.get_mut(l) {
                lane.delivered(end_to_end, end_to_end - in_hub, took);
            }
        }
    }

    /// Each model's latency controller looks again (none without a latency
    /// target); a new choice applies to its runs. The partitions' batching
    /// follows [`Self::partition_choice`].
    pub(crate) fn adjust(&mut self, now: Instant, partitions: usize, target: Duration) -> Looked {
        let mut looked = Looked {
            saturated: false,
            missed: false,
        };
        for lane in self.lanes.iter_mut() {
            let Some(Adjusted { was_missed, status }) = lane.adjust(now, partitions) else {
                continue;
            };
            looked.saturated |= status.mode == slo::Mode::Throughput;
            looked.missed |= status.missed;
            report(lane.scorer().id.as_str(), was_missed, &status, target);
        }
        looked
    }

    /// The earliest tick of a lane's latency controller.
    pub(crate) fn next_tick(&self) -> Option<Instant> {
        self.lanes.iter().filter_map(Lane::next_tick).min()
    }

    /// The earliest probe due of an open breaker.
    pub(crate) fn next_probe(&self) -> Option<Instant> {
        self.lanes.iter().filter_map(Lane::next_probe).min()
    }

    /// Whether any model's circuit breaker is open (no input is taken).
    pub(crate) fn any_breaker_open(&self) -> bool {
        self.lanes.iter().any(Lane::breaker_open)
    }

    /// Whether model `l`'s circuit breaker is open.
    #[cfg(test)]
    pub(crate) fn breaker_open(&self, l: ModelId) -> bool {
        self.lanes[l].breaker_open()
    }

    /// Events waiting for a model.
    pub(crate) fn queued(&self) -> usize {
        self.lanes.iter().map(Lane::queued).sum()
    }

    /// Take these partitions' batches off the queues (they will not be
    /// scored); returns how many events they held.
    pub(crate) fn drop_queued(&mut self, tps: &std::collections::HashSet<&Tp>) -> usize {
        self.lanes
            .iter_mut()
            .map(|lane| lane.drop_queued(tps))
            .sum()
    }

    /// Shutdown gave up while the breaker holds events: they stay
    /// uncommitted for the restart; how many.
    pub(crate) fn give_up_held(&mut self) -> usize {
        let held: usize = self.lanes.iter_mut().map(Lane::drain_queued).sum();
        tracing::warn!(
            held,
            "shutdown timeout with the model failing; held events stay uncommitted"
        );
        held
    }

    /// Breaker open: when its time has come, try the model on one
    /// synthetic text.
    fn probe(&mut self, l: ModelId) {
        let Some(text) = self.lanes[l].probe_due(Instant::now()) else {
            return;
        };
        let id = self.jobs.new_id();
        let job = InferenceJob {
            id,
            texts: vec![text],
        };
        self.lanes[l].send_probe(job);
    }

    fn probe_ended(&mut self, l: ModelId, result: &InferenceResult) {
        let lane = &mut self.lanes[l];
        let model = lane.scorer().id.clone();
        let scored = result.scores.iter().any(Result::is_ok);
        match lane.probe_ended(scored, Instant::now()) {
            ProbeOutcome::Closed => {
                tracing::info!(
                    model,
                    held = lane.queued(),
                    "the model scores again; closing the circuit breaker"
                );
                let open = self.any_breaker_open();
                self.health
                    .model_failing
                    .store(open, std::sync::atomic::Ordering::SeqCst);
                metrics::gauge!(metric::INFERENCE_BREAKER_OPEN).set(f64::from(u8::from(open)));
            }
            ProbeOutcome::StillFailing { retry_in } => {
                let error = first_error(result);
                tracing::warn!(model, error = %error, retry_in_s = retry_in.as_secs(), "the model still fails");
            }
        }
    }

    /// The breaker holds a run back (see [`BreakerAction::HoldBack`]): the
    /// batch goes back to the front of the queue (texts restored), nothing
    /// more goes to the DLQ; `opened`: the breaker just opened after that
    /// many runs that failed whole.
    fn hold_back(
        &mut self,
        l: ModelId,
        mut segments: Vec<ReadyBatch>,
        result: InferenceResult,
        opened: Option<u32>,
    ) {
        let error = first_error(&result);
        let lane = &mut self.lanes[l];
        if let Some(runs) = opened {
            tracing::error!(model = %lane.scorer().id, runs, error = %error, "the model fails every event; holding events back and retrying it (circuit breaker open)");
            self.health
                .model_failing
                .store(true, std::sync::atomic::Ordering::SeqCst);
            metrics::gauge!(metric::INFERENCE_BREAKER_OPEN).set(1.0);
        }
        let mut texts = result.texts.into_iter();
        for segment in &mut segments {
            for pending in segment.items.iter_mut().filter(|p| p.needs(l)) {
                pending.event.text = texts.next().unwrap_or_default();
            }
        }
        lane.requeue_front(segments);
    }
}

/// A model run's span, linked to the trace of each post it scored.
fn trace_run(
    traces: &Traces,
    l: ModelId,
    scorer: &crate::verdict::Scorer,
    segments: &[ReadyBatch],
    result: &InferenceResult,
) {
    let posts = || {
        segments
            .iter()
            .flat_map(|s| &s.items)
            .filter(|p| p.needs(l))
    };
    traces.run(Run {
        model: &scorer.id,
        version: scorer.model().1,
        size: result.scores.len(),
        elapsed: result.elapsed,
        oldest: posts().map(|p| p.received_at.into_std()).min(),
        links: posts()
            .filter_map(|p| TraceContext::from_headers(&p.original.headers))
            .collect(),
    });
}

/// A latency controller's look, in the log: every choice at trace level, a
/// target missed (or met again) once.
fn report(model: &str, was_missed: bool, status: &slo::Status, target: Duration) {
    tracing::trace!(
        model,
        mode = ?status.mode,
        size = status.choice.size,
        delay = ?status.choice.delay,
        p99 = ?status.p99,
        outside_batching = ?status.uncontrolled,
        events_per_s = status.rate.round(),
        "batching choice"
    );
    if status.missed && !was_missed {
        tracing::warn!(
            model,
            target_p99 = ?target,
            p99 = ?status.p99.unwrap_or_default(),
            events_per_s = status.rate.round(),
            outside_batching = ?status.uncontrolled,
            batch_size = status.choice.size,
            cause = status.miss_cause(),
            "latency target missed; batching for throughput until it can be met again"
        );
    } else if was_missed && !status.missed {
        tracing::info!(model, target_p99 = ?target, p99 = ?status.p99.unwrap_or_default(), "latency target met again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::partition::tests::{pending, tp};
    use crate::tp::Generation;

    fn scoring() -> (Scoring, async_channel::Receiver<InferenceJob>) {
        let manifest: crate::inference::manifest::Manifest =
            serde_json::from_value(serde_json::json!({
                "name": "m", "version": "1", "input_kind": "text", "inputs": ["text"],
                "output": "p", "labels": ["offensive"], "score_label": "offensive",
            }))
            .unwrap();
        let (jobs, taken) = async_channel::bounded(4);
        let settings = Settings::from_toml(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]",
        )
        .unwrap();
        let lane = ModelLane {
            scorer: crate::verdict::Scorer::named("default", &manifest),
            jobs,
            workers: 1,
            max_batch: 8,
            max_length: None,
        };
        (Scoring::new(&settings, vec![lane], Arc::default()), taken)
    }

    fn batch(seq: u64, offsets: std::ops::Range<i64>) -> ReadyBatch {
        ReadyBatch {
            tp: tp(0),
            generation: Generation(0),
            seq,
            items: offsets.map(|o| pending(&tp(0), Generation(0), o)).collect(),
            urgent: false,
            waited: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn batches_of_several_partitions_run_as_one_and_come_back_scored_in_their_batches() {
        let (mut scoring, taken) = scoring();
        assert!(matches!(
            scoring.queue(batch(0, 0..3), ModelId(0)),
            Queued::Waiting
        ));
        let mut other = batch(0, 0..2);
        other.tp = tp(1);
        for p in &mut other.items {
            p.tp = tp(1);
        }
        assert!(matches!(scoring.queue(other, ModelId(0)), Queued::Waiting));
        let dispatched = scoring.dispatch(|_| {});
        assert!(matches!(dispatched[..], [Dispatched::Run { size: 5 }]));
        let job = taken.try_recv().expect("one run");
        assert_eq!(job.texts.len(), 5);
        let result = InferenceResult {
            id: job.id,
            scores: (0..5).map(|i| Ok(vec![i as f32 / 10.0])).collect(),
            texts: job.texts.clone(),
            elapsed: Duration::from_millis(1),
            tokens: TokenStats::default(),
            version: 0,
            worker: 0,
        };
        let Ran::Scored(run) = scoring.finished(result) else {
            panic!("scored");
        };
        assert_eq!(run.next, ModelId(1), "on from the next model");
        let sizes: Vec<usize> = run.segments.iter().map(|s| s.items.len()).collect();
        assert_eq!(sizes, [3, 2], "each batch whole, in run order");
        let last = &run.segments[1].items[1];
        assert_eq!(last.scores[0].probabilities, [0.4]);
        assert_eq!(last.event.text, "post 1", "its text given back");
        // Every event scored: the next queueing finds no model left.
        let segment = run.segments.into_iter().next().unwrap();
        assert!(matches!(scoring.queue(segment, run.next), Queued::Done(_)));
        // A result matched once: the same id again is nothing.
        let again = InferenceResult {
            id: job.id,
            scores: vec![],
            texts: vec![],
            elapsed: Duration::ZERO,
            tokens: TokenStats::default(),
            version: 0,
            worker: 0,
        };
        assert!(matches!(scoring.finished(again), Ran::Nothing));
    }
}
