//! The in-flight ledger: the events accepted and not yet answered (the
//! count the hub's intake is bounded by, and its gauge) and the run's
//! counts ([`RunSummary`]). Each changes only through a method here, named
//! for what happened.

use std::time::Duration;

use metrics::Gauge;

use super::{MAX_BATCH_CHOICES, RunSummary};
use crate::inference::TokenStats;
use crate::slo::Choice;
use crate::telemetry::metric;

pub(super) struct Ledger {
    /// Events accepted and not yet acknowledged (or dropped, or abandoned).
    in_flight: usize,
    gauge: Gauge,
    summary: RunSummary,
}

impl Ledger {
    /// `first_choice`: with a latency target, the batching the run starts
    /// with (the first of the choices the summary keeps).
    pub(super) fn new(first_choice: Option<Choice>) -> Ledger {
        let gauge = metrics::gauge!(metric::IN_FLIGHT_EVENTS);
        gauge.set(0.0);
        Ledger {
            in_flight: 0,
            gauge,
            summary: RunSummary {
                batch_choices: first_choice
                    .map(|c| vec![(std::time::Instant::now(), c)])
                    .unwrap_or_default(),
                ..Default::default()
            },
        }
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    #[cfg(test)]
    pub(super) fn summary(&self) -> &RunSummary {
        &self.summary
    }

    pub(super) fn into_summary(self) -> RunSummary {
        self.summary
    }

    /// A record polled; a stale one (of a revoked assignment) goes no
    /// further.
    pub(super) fn polled(&mut self, stale: bool) {
        self.summary.consumed += 1;
        if stale {
            self.summary.stale += 1;
        }
    }

    /// A polled record is tracked by its partition: in flight until its
    /// outputs are acknowledged.
    pub(super) fn accepted(&mut self) {
        self.in_flight += 1;
        self.gauge.set(self.in_flight as f64);
    }

    /// Events that leave without an acknowledgement (dropped by a revoke
    /// or a rewind; their offsets stay uncommitted for whoever reads them
    /// next).
    pub(super) fn dropped(&mut self, events: usize) {
        self.in_flight = self.in_flight.saturating_sub(events);
        self.gauge.set(self.in_flight as f64);
    }

    /// Shutdown gave up on events the breaker held: abandoned, uncommitted.
    pub(super) fn gave_up(&mut self, held: usize) {
        self.summary.abandoned += held as u64;
        self.dropped(held);
    }

    /// An offset's records were answered by the broker, `took` after they
    /// were enqueued; what the answer was is told next.
    pub(super) fn acknowledged(&mut self, took: Duration) {
        self.dropped(1);
        self.summary.produce_seconds += took.as_secs_f64();
    }

    pub(super) fn verdict_delivered(&mut self) {
        self.summary.verdicts += 1;
    }

    pub(super) fn dead_letter_delivered(&mut self) {
        self.summary.dlq += 1;
    }

    /// A record the broker refused for good (committed past).
    pub(super) fn undeliverable(&mut self) {
        self.summary.undeliverable += 1;
    }

    /// A delivery given up (shutdown, or a fatal producer error).
    pub(super) fn abandoned(&mut self) {
        self.summary.abandoned += 1;
    }

    /// A record failed inside a transaction: it aborts, and the offset is
    /// read again.
    pub(super) fn aborted_in_transaction(&mut self) {
        self.summary.aborted_records += 1;
    }

    pub(super) fn rewound(&mut self) {
        self.summary.rewinds += 1;
    }

    /// A revoke began with `in_flight` events of its partitions in flight.
    pub(super) fn revoke_started(&mut self, in_flight: u64) {
        self.summary.revokes += 1;
        self.summary.revoked_in_flight += in_flight;
    }

    /// A partition's batch closed after waiting this long.
    pub(super) fn batch_closed(&mut self, waited: Duration) {
        self.summary.batch_wait_seconds += waited.as_secs_f64();
        self.summary.closed_batches += 1;
    }

    /// A model run of `size` events dispatched.
    pub(super) fn run_started(&mut self, size: usize) {
        let sizes = &mut self.summary.run_sizes;
        if sizes.len() <= size {
            sizes.resize(size + 1, 0);
        }
        sizes[size] += 1;
    }

    /// A model run scored its events in `elapsed`.
    pub(super) fn run_scored(&mut self, elapsed: Duration, tokens: TokenStats) {
        self.summary.batches += 1;
        self.summary.inference_seconds += elapsed.as_secs_f64();
        self.summary.real_tokens += tokens.real;
        self.summary.padded_tokens += tokens.padded;
    }

    /// The partitions' batching changed: kept when the size changes or the
    /// deadline by a tenth (the first [`MAX_BATCH_CHOICES`]).
    pub(super) fn batching_chosen(&mut self, choice: Choice) {
        let choices = &mut self.summary.batch_choices;
        let noted = choices.last().is_some_and(|(_, last)| {
            last.size == choice.size && last.delay.abs_diff(choice.delay) * 10 <= last.delay
        });
        if !noted && choices.len() < MAX_BATCH_CHOICES {
            choices.push((std::time::Instant::now(), choice));
        }
    }
}
