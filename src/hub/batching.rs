//! The latency target's controller applied: its choice of batch size and
//! deadline goes to every partition and to dispatch.

use super::{Deliver, Hub, MAX_BATCH_CHOICES};
use crate::slo::{self, Choice};
use crate::telemetry::metric;
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    /// The latency target's controller looks again; its new choice applies
    /// to every partition's open and next batches and to dispatch.
    pub(super) fn adjust_batching(&mut self) {
        let Some(controller) = self.slo.as_mut() else {
            return;
        };
        let was_missed = controller.status().missed;
        let changed = controller.tick(Instant::now());
        let status = controller.status();
        if let Some(choice) = changed {
            self.batch = choice;
            // Kept when the size changes or the deadline by a tenth.
            let noted = self.summary.batch_choices.last().is_some_and(|(_, last)| {
                last.size == choice.size && last.delay.abs_diff(choice.delay) * 10 <= last.delay
            });
            if !noted && self.summary.batch_choices.len() < MAX_BATCH_CHOICES {
                self.summary
                    .batch_choices
                    .push((std::time::Instant::now(), choice));
            }
            for partition in self.partitions.values_mut() {
                partition.set_batching(choice.size, choice.delay);
            }
            export_choice(choice);
        }
        metrics::gauge!(metric::BATCHING_SATURATED)
            .set(f64::from(u8::from(status.mode == slo::Mode::Throughput)));
        metrics::gauge!(metric::LATENCY_TARGET_MISSED).set(f64::from(u8::from(status.missed)));
        tracing::trace!(
            mode = ?status.mode,
            size = status.choice.size,
            delay = ?status.choice.delay,
            p99 = ?status.p99,
            outside_batching = ?status.uncontrolled,
            events_per_s = status.rate.round(),
            "batching choice"
        );
        let target = self.settings.batching.target_p99.unwrap_or_default();
        if status.missed && !was_missed {
            tracing::warn!(
                target_p99 = ?target,
                p99 = ?status.p99.unwrap_or_default(),
                events_per_s = status.rate.round(),
                outside_batching = ?status.uncontrolled,
                batch_size = status.choice.size,
                cause = status.miss_cause(),
                "latency target missed; batching for throughput until it can be met again"
            );
        } else if was_missed && !status.missed {
            tracing::info!(target_p99 = ?target, p99 = ?status.p99.unwrap_or_default(), "latency target met again");
        }
    }
}

/// The batch size and deadline in use, as metrics.
pub(super) fn export_choice(choice: Choice) {
    metrics::gauge!(metric::BATCH_TARGET_SIZE).set(choice.size as f64);
    metrics::gauge!(metric::BATCH_TARGET_DELAY_SECONDS).set(choice.delay.as_secs_f64());
}
