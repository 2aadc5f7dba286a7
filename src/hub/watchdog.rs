//! The hub's watchdog: stalled partitions and deliveries failing for the
//! whole service, looked at every second.

use tokio::time::Instant;

use super::{Deliver, Hub};
use crate::producer::{ProducerError, ServiceFailure};
use crate::telemetry::{Stall, metric};

/// How often the watchdog looks at every partition's oldest pending event.
pub(super) const STALL_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl<D: Deliver> Hub<D> {
    /// Deliveries failing for the whole service (not authorized, topic
    /// missing): /readyz fails once that lasts 5 s; after
    /// `kafka.service_failure_timeout` the run stops with the reason.
    fn check_service_failure(&mut self) {
        let failure = self.outbox.service_failure();
        let report = failure
            .as_ref()
            .filter(|f| f.lasted >= std::time::Duration::from_secs(5))
            .map(|f| {
                format!(
                    "deliveries to {} failing for {} s: {}",
                    f.topic,
                    f.lasted.as_secs(),
                    f.error
                )
            });
        self.health.set_delivery_failing(report);
        let Some(ServiceFailure {
            topic,
            lasted,
            error,
        }) = failure
        else {
            return;
        };
        if lasted >= self.settings.kafka.service_failure_timeout && self.producer_fatal.is_none() {
            tracing::error!(%topic, lasted_s = lasted.as_secs(), error = %error, "stopping: deliveries fail for the whole service");
            self.producer_fatal = Some(ProducerError::Service {
                topic,
                lasted_s: lasted.as_secs(),
                error,
            });
            self.stop.cancel();
            self.abort.cancel();
        }
    }

    /// The watchdog: a partition whose oldest undelivered event has waited
    /// `limits.stall_after` is stalled (its committed offset cannot move):
    /// one error log when it starts, the gauges, and /readyz fails until it
    /// moves again.
    pub(super) fn check_stalls(&mut self) {
        let now = Instant::now();
        self.next_stall_check = now + STALL_CHECK;
        self.check_service_failure();
        let stall_after = self.settings.limits.stall_after;
        let mut stalls = Vec::new();
        for (tp, partition) in &self.partitions {
            let oldest = partition.oldest_pending(now);
            let waited = oldest.map_or(0.0, |(_, w)| w.as_secs_f64());
            metrics::gauge!(metric::OLDEST_PENDING_SECONDS, "topic" => tp.topic.to_string(), "partition" => tp.partition.to_string())
                .set(waited);
            if let Some((offset, waited)) = oldest.filter(|(_, w)| *w >= stall_after) {
                stalls.push(Stall {
                    topic: tp.topic.to_string(),
                    partition: tp.partition,
                    offset,
                    waiting_s: waited.as_secs(),
                    pending: partition.in_flight(),
                });
            }
        }
        let owned = &self.partitions;
        self.stalls.report(stalls, |tp| owned.contains_key(tp));
    }
}
