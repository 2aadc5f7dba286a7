//! The hub's circuit breaker on each model (see [`Breaker`]).

use tokio::time::Instant;

use super::{Deliver, Hub};
use crate::inference::{InferenceJob, InferenceResult};
use crate::partition::ReadyBatch;
use crate::telemetry::metric;

/// The circuit breaker's probe: the text when no event was scored yet (else
/// the last text the model scored), and how long it waits between tries
/// (doubling).
const PROBE_TEXT: &str = "modstream probe";
const FIRST_PROBE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
const MAX_PROBE_DELAY: std::time::Duration = std::time::Duration::from_secs(30);

/// The circuit breaker on the model. Closed, events that fail go to the DLQ
/// one by one. After `inference.breaker_after` runs in a row in which every
/// event failed, it opens: that run's batch goes back to the front of the
/// queue, no batch goes to the model and no input is taken (the consumer
/// pauses), /readyz fails; a probe (one synthetic text) runs after 1 s,
/// doubling to 30 s, until the model scores it; then it closes and the held
/// batches are scored as usual. The probe is the last text the model
/// scored: a model that scored it before and fails it now is broken, and
/// poison events alone cannot keep the breaker open.
#[derive(Default)]
pub(super) struct Breaker {
    pub(super) dead_runs: u32,
    pub(super) open: bool,
    /// The probe's job id while it runs.
    pub(super) probe: Option<u64>,
    pub(super) next_probe: Option<Instant>,
    delay: std::time::Duration,
    /// The last text the model scored.
    pub(super) last_scored: Option<String>,
}

impl<D: Deliver> Hub<D> {
    /// Breaker open: when its time has come, try the model on one synthetic
    /// text.
    pub(super) fn probe(&mut self, l: usize) {
        let lane = &mut self.lanes[l];
        let breaker = &mut lane.breaker;
        let due = breaker.next_probe.is_some_and(|t| Instant::now() >= t);
        if breaker.probe.is_some() || !due || lane.running >= lane.capacity {
            return;
        }
        let id = self.next_job_id;
        self.next_job_id += 1;
        let text = breaker.last_scored.clone();
        let job = InferenceJob {
            id,
            texts: vec![text.unwrap_or_else(|| PROBE_TEXT.to_string())],
        };
        if lane.jobs.try_send(job).is_ok() {
            breaker.probe = Some(id);
        }
    }

    pub(super) fn on_probe(&mut self, l: usize, result: InferenceResult) {
        let lane = &mut self.lanes[l];
        let model = lane.scorer.id.clone();
        lane.breaker.probe = None;
        if result.scores.iter().any(Result::is_ok) {
            tracing::info!(
                model,
                held = lane.queued(),
                "the model scores again; closing the circuit breaker"
            );
            lane.breaker = Breaker {
                last_scored: lane.breaker.last_scored.take(),
                ..Breaker::default()
            };
            let open = self.any_breaker_open();
            self.health
                .model_failing
                .store(open, std::sync::atomic::Ordering::SeqCst);
            metrics::gauge!(metric::INFERENCE_BREAKER_OPEN).set(f64::from(u8::from(open)));
            return;
        }
        let breaker = &mut lane.breaker;
        breaker.delay = (breaker.delay * 2).clamp(FIRST_PROBE_DELAY, MAX_PROBE_DELAY);
        breaker.next_probe = Some(Instant::now() + breaker.delay);
        let error = result
            .scores
            .into_iter()
            .find_map(Result::err)
            .unwrap_or_default();
        tracing::warn!(model, error = %error, retry_in_s = breaker.delay.as_secs(), "the model still fails");
    }

    /// A run in which every event failed, the breaker's limit reached (or
    /// the breaker already open): the model is taken as broken. The batch
    /// goes back to the front of the queue (texts restored), nothing more
    /// goes to the DLQ.
    pub(super) fn hold_back(
        &mut self,
        l: usize,
        mut segments: Vec<ReadyBatch>,
        result: InferenceResult,
    ) {
        let error = result
            .scores
            .into_iter()
            .find_map(Result::err)
            .unwrap_or_default();
        let lane = &mut self.lanes[l];
        let breaker = &mut lane.breaker;
        if !breaker.open {
            tracing::error!(model = %lane.scorer.id, runs = breaker.dead_runs, error = %error, "the model fails every event; holding events back and retrying it (circuit breaker open)");
            breaker.open = true;
            breaker.delay = FIRST_PROBE_DELAY;
            breaker.next_probe = Some(Instant::now() + FIRST_PROBE_DELAY);
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
        for segment in segments.into_iter().rev() {
            lane.ready.push_front(segment);
        }
    }

    /// Shutdown gave up while the breaker holds events: they stay
    /// uncommitted for the restart.
    pub(super) fn give_up_held(&mut self) {
        let held: usize = self
            .lanes
            .iter_mut()
            .flat_map(|l| l.ready.drain())
            .map(|b| b.items.len())
            .sum();
        tracing::warn!(
            held,
            "shutdown timeout with the model failing; held events stay uncommitted"
        );
        self.summary.abandoned += held as u64;
        self.release(held);
    }
}
