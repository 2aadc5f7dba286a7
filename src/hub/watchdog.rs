//! The hub's watchdog: stalled partitions and deliveries failing for the
//! whole service, looked at every second.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::partition::Partitions;
use crate::producer::{ProducerError, ServiceFailure};
use crate::telemetry::{Health, Stall, StallKind, StallReporter, metric};

/// How often the watchdog looks at every partition's oldest pending event.
const STALL_CHECK: Duration = Duration::from_secs(1);

/// How long deliveries fail for the whole service before /readyz says so.
const SERVICE_FAILURE_REPORTED_AFTER: Duration = Duration::from_secs(5);

pub(super) struct Watchdog {
    health: Arc<Health>,
    /// The partitions reported stalled now.
    stalls: StallReporter,
    next_check: Instant,
    /// `limits.stall_after`: a partition whose oldest undelivered event
    /// waited this long is stalled.
    stall_after: Duration,
    /// `kafka.service_failure_timeout`: deliveries failing for the whole
    /// service this long stop the run.
    service_failure_timeout: Duration,
}

impl Watchdog {
    pub(super) fn new(settings: &crate::config::Settings, health: Arc<Health>) -> Watchdog {
        Watchdog {
            stalls: StallReporter::new(StallKind::Undelivered, health.clone()),
            health,
            next_check: Instant::now() + STALL_CHECK,
            stall_after: settings.limits.stall_after,
            service_failure_timeout: settings.kafka.service_failure_timeout,
        }
    }

    /// When it looks next: while anything is in flight or stalled.
    pub(super) fn next_look(&self, in_flight: usize) -> Option<Instant> {
        (in_flight > 0 || !self.stalls.is_empty()).then_some(self.next_check)
    }

    /// Whether its look is due.
    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.next_check
    }

    /// The watchdog looks: a partition whose oldest undelivered event has
    /// waited `limits.stall_after` is stalled (its committed offset cannot
    /// move): one error log when it starts, the gauges, and /readyz fails
    /// until it moves again. Deliveries failing for the whole service (not
    /// authorized, topic missing): /readyz fails once that lasts 5 s; after
    /// `kafka.service_failure_timeout` the answer is the error that stops
    /// the run.
    pub(super) fn look(
        &mut self,
        partitions: &Partitions,
        failure: Option<ServiceFailure>,
    ) -> Option<ProducerError> {
        let now = Instant::now();
        self.next_check = now + STALL_CHECK;
        let stop = self.service_failure(failure);
        let mut stalls = Vec::new();
        for (tp, partition) in partitions.iter() {
            let oldest = partition.oldest_pending(now);
            let waited = oldest.map_or(0.0, |(_, w)| w.as_secs_f64());
            metrics::gauge!(metric::OLDEST_PENDING_SECONDS, "topic" => tp.topic.to_string(), "partition" => tp.partition.to_string())
                .set(waited);
            if let Some((offset, waited)) = oldest.filter(|(_, w)| *w >= self.stall_after) {
                stalls.push(Stall {
                    topic: tp.topic.to_string(),
                    partition: tp.partition,
                    offset,
                    waiting_s: waited.as_secs(),
                    pending: partition.in_flight(),
                });
            }
        }
        self.stalls.report(stalls, |tp| partitions.contains_key(tp));
        stop
    }

    fn service_failure(&self, failure: Option<ServiceFailure>) -> Option<ProducerError> {
        let report = failure
            .as_ref()
            .filter(|f| f.lasted >= SERVICE_FAILURE_REPORTED_AFTER)
            .map(|f| {
                format!(
                    "deliveries to {} failing for {} s: {}",
                    f.topic,
                    f.lasted.as_secs(),
                    f.error
                )
            });
        self.health.set_delivery_failing(report);
        let ServiceFailure {
            topic,
            lasted,
            error,
        } = failure?;
        (lasted >= self.service_failure_timeout).then(|| ProducerError::Service {
            topic,
            lasted_s: lasted.as_secs(),
            error,
        })
    }
}
