//! The latency target's controllers applied: each model's controller
//! chooses its run size (in events, or in predicted tokens for a token
//! model with `batching.max_batch_tokens`) and the deadline it asks for;
//! every partition closes its batches at the smallest size, token budget
//! and earliest deadline of them (see [`super::lanes::partition_choice`]).

use super::lanes::{self, Adjusted};
use super::{Deliver, Hub};
use crate::slo::{self, Choice};
use crate::telemetry::metric;
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    /// Each model's controller looks again; a new choice applies to that
    /// model's runs, and to every partition's open and next batches.
    pub(super) fn adjust_batching(&mut self) {
        let target = self.settings.batching.target_p99.unwrap_or_default();
        let (mut saturated, mut missed) = (false, false);
        let partitions = self.partitions.len();
        for lane in self.lanes.iter_mut() {
            let Some(Adjusted { was_missed, status }) = lane.adjust(Instant::now(), partitions)
            else {
                continue;
            };
            saturated |= status.mode == slo::Mode::Throughput;
            missed |= status.missed;
            let model = &lane.scorer().id;
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
        let choice = lanes::partition_choice(&self.lanes);
        let tokens = lanes::partition_tokens(&self.lanes);
        if choice != self.batch || tokens != self.batch_tokens {
            self.batch_tokens = tokens;
            self.set_partition_batching(choice);
        }
        metrics::gauge!(metric::BATCHING_SATURATED).set(f64::from(u8::from(saturated)));
        metrics::gauge!(metric::LATENCY_TARGET_MISSED).set(f64::from(u8::from(missed)));
    }
}

impl<D: Deliver> Hub<D> {
    /// Every partition's open and next batches take `choice` (and the token
    /// budget in force); the open batches' deadlines move with it.
    pub(super) fn set_partition_batching(&mut self, choice: Choice) {
        self.batch = choice;
        self.ledger.batching_chosen(choice);
        for partition in self.partitions.values_mut() {
            partition.set_batching(choice.size, choice.delay, self.batch_tokens);
        }
        let open =
            (self.partitions.iter()).filter_map(|(tp, p)| p.deadline().map(|at| (at, tp.clone())));
        self.deadlines.rebuild(open);
        export_choice(choice);
        metrics::gauge!(metric::BATCH_TARGET_TOKENS).set(self.batch_tokens.unwrap_or(0) as f64);
    }
}

/// The partitions' batch size and deadline in use, as metrics.
pub(super) fn export_choice(choice: Choice) {
    metrics::gauge!(metric::BATCH_TARGET_SIZE).set(choice.size as f64);
    metrics::gauge!(metric::BATCH_TARGET_DELAY_SECONDS).set(choice.delay.as_secs_f64());
}
