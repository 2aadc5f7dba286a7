//! Dispatch: each model's waiting batches coalesced into its runs, and the
//! results taken back to the batches (then on to the next model, or to
//! their partitions).

use super::breaker::{BreakerAction, RunOutcome};
use super::lanes::NewRun;
use super::{Deliver, Hub};
use crate::inference::{InferenceJob, InferenceResult, ScoreError};
use crate::partition::{ModelScores, ReadyBatch};
use crate::policy::ModelId;
use crate::telemetry::metric;
use crate::telemetry::trace_context::TraceContext;
use crate::telemetry::traces::Run;
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    /// Every model's runs, while its workers' queue has room.
    pub(super) fn dispatch(&mut self) {
        for lane in self.lanes.ids() {
            self.dispatch_lane(lane);
        }
    }

    /// Coalesce ready batches (possibly of several partitions) into runs of
    /// at most the model's run size, counting the events it is to score.
    fn dispatch_lane(&mut self, l: ModelId) {
        if self.lanes[l].breaker_open() {
            self.probe(l);
            return;
        }
        loop {
            // A wave's posts whose first post was scored since they arrived
            // take its scores here, at their model's turn.
            let matcher = self.matcher.as_ref();
            let prepare = |batch: &mut ReadyBatch| super::matching::take_kept(matcher, batch);
            let Some(NewRun { mut segments, size }) = self.lanes[l].take_run(l, prepare) else {
                break;
            };
            if size == 0 {
                for segment in segments {
                    self.send_on(segment, l.next());
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
            self.ledger.run_started(size);
            let id = self.jobs.started(l, segments);
            if let Err(e) = self.lanes[l].send(InferenceJob { id, texts }) {
                // Cannot happen while `running` bounds the queue; keep the
                // events anyway (scored as failed).
                tracing::error!("inference queue full despite the bound");
                let texts = e.into_inner().texts;
                self.on_inference_result(InferenceResult {
                    id,
                    scores: vec![],
                    texts,
                    elapsed: std::time::Duration::ZERO,
                    tokens: Default::default(),
                    version: 0,
                    worker: 0,
                });
            }
        }
    }

    pub(super) fn on_inference_result(&mut self, result: InferenceResult) {
        let run_lane = self.jobs.lane_of(result.id).or_else(|| {
            let probe = |lane: &super::Lane| lane.is_probe(result.id);
            self.lanes.iter().position(probe).map(ModelId)
        });
        if let Some(lane) = run_lane.and_then(|l| self.lanes.get_mut(l)) {
            lane.ran_version(result.worker, result.version);
        }
        let probe = self.lanes.iter().position(|lane| lane.is_probe(result.id));
        if let Some(l) = probe.map(ModelId) {
            self.on_probe(l, result);
            return;
        }
        let Some(super::jobs::Running { lane: l, segments }) = self.jobs.finished(result.id) else {
            return;
        };
        let lane = &mut self.lanes[l];
        let dead = !result.scores.is_empty() && result.scores.iter().all(Result::is_err);
        let outcome = if dead {
            RunOutcome::AllFailed
        } else {
            let scored = result.scores.iter().position(Result::is_ok);
            RunOutcome::Scored(scored.and_then(|i| result.texts.get(i).cloned()))
        };
        let limit = self.settings.inference.breaker_after;
        if let BreakerAction::HoldBack { opened } = lane.run_ended(outcome, limit, Instant::now()) {
            self.hold_back(l, segments, result, opened);
            return;
        }
        metrics::histogram!(metric::INFERENCE_SECONDS).record(result.elapsed.as_secs_f64());
        lane.model_ran(l, &segments, result.elapsed);
        self.ledger.run_scored(result.elapsed, result.tokens);
        let t = result.tokens;
        self.token_estimate
            .learn(t.whole_texts, t.whole_bytes, t.whole_tokens);
        metrics::counter!(metric::TOKENS_REAL_TOTAL).increment(result.tokens.real);
        metrics::counter!(metric::TOKENS_PADDED_TOTAL).increment(result.tokens.padded);
        // The model version that scored it (a reload may have switched it).
        let scorer = lane.scorer_of(result.version);
        metrics::counter!(metric::MODEL_EVENTS_TOTAL, "model" => scorer.id.clone())
            .increment(result.scores.len() as u64);
        if let Some(traces) = &self.traces {
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
        let mut scores = result.scores.into_iter();
        let mut texts = result.texts.into_iter();
        for mut segment in segments {
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
            self.send_on(segment, l.next());
        }
    }
}
