//! The in-flight ledger: the events accepted and not yet answered (the
//! count the hub's intake is bounded by, `limits.max_in_flight`, and its
//! gauge), the run's counts ([`RunSummary`]) and the per-verdict metrics
//! ([`Meters`]). Each changes only through a method here, named for what
//! happened.

use std::time::Duration;

use std::sync::Arc;

use metrics::Gauge;
use tokio::time::Instant;

use super::meters::Meters;
use super::stages::delivery::Refused;
use super::stages::outputs::Decided;
use super::stages::scoring::slo::Choice;
use crate::inference::TokenStats;
use crate::policy::Ruleset;
use crate::telemetry::metric;
use crate::tp::Tp;

/// Counts of one run, for the demo and the tests.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub consumed: u64,
    pub verdicts: u64,
    pub dlq: u64,
    pub stale: u64,
    /// Deliveries given up at shutdown (their offsets stay uncommitted).
    pub abandoned: u64,
    /// Records the broker refused for good (committed past, counted, logged).
    pub undeliverable: u64,
    /// Revokes of this member's partitions, and the events that were in
    /// flight in the revoked partitions when each began (drained before the
    /// answer, or left uncommitted for the next owner).
    pub revokes: u64,
    pub revoked_in_flight: u64,
    /// Exactly-once: aborted transactions whose partitions were read again,
    /// and records whose delivery failed inside a transaction (it aborts).
    pub rewinds: u64,
    pub aborted_records: u64,
    /// Model runs, and the time spent in them.
    pub batches: u64,
    pub inference_seconds: f64,
    /// Token models: tokens fed, real and padded (padding efficiency = real ÷ padded).
    pub real_tokens: u64,
    pub padded_tokens: u64,
    /// Model runs by size: `run_sizes[n]` runs of n events.
    pub run_sizes: Vec<u64>,
    /// Where an event's time goes: waiting for its batch to close (summed
    /// over closed batches), and from enqueueing its verdict to the broker's
    /// acknowledgement (summed over records).
    pub batch_wait_seconds: f64,
    pub closed_batches: u64,
    pub produce_seconds: f64,
    /// With `batching.target_p99`: the batch sizes and deadlines chosen, and
    /// when (a change of size, or of the deadline by more than a tenth; the
    /// first [`MAX_BATCH_CHOICES`]).
    pub batch_choices: Vec<(std::time::Instant, Choice)>,
    /// The faults this run met and got past (commit and delivery failures,
    /// re-sends, the most partitions stalled at once).
    pub faults: crate::telemetry::FaultCounts,
}

/// How many batch choices a [`RunSummary`] keeps.
pub const MAX_BATCH_CHOICES: usize = 100_000;

/// A delivered verdict's latency: from when its event happened (or, with
/// no record timestamp, from its poll) and from its poll.
pub(super) struct Latency {
    pub(super) end_to_end: Duration,
    pub(super) in_hub: Duration,
}

pub(super) struct Ledger {
    /// Events accepted and not yet acknowledged (or dropped, or abandoned).
    in_flight: usize,
    /// `limits.max_in_flight`: past it no input is taken.
    max_in_flight: usize,
    gauge: Gauge,
    summary: RunSummary,
    meters: Meters,
}

impl Ledger {
    /// `first_choice`: with a latency target, the batching the run starts
    /// with (the first of the choices the summary keeps).
    /// `rules`: the policy at start (its rules' counters).
    pub(super) fn new(
        first_choice: Option<Choice>,
        max_in_flight: usize,
        rules: &Arc<Ruleset>,
    ) -> Ledger {
        let gauge = metrics::gauge!(metric::IN_FLIGHT_EVENTS);
        gauge.set(0.0);
        Ledger {
            in_flight: 0,
            max_in_flight,
            meters: Meters::new(rules),
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

    /// Whether fewer events are in flight than `limits.max_in_flight`.
    pub(super) fn has_room(&self) -> bool {
        self.in_flight < self.max_in_flight
    }

    /// A new policy in force: its rules' counters.
    pub(super) fn policy_loaded(&mut self, rules: &Arc<Ruleset>) {
        self.meters.policy_loaded(rules);
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

    /// A verdict reached its topic: counted by verdict and rule; its
    /// latency, for the latency controllers of the models that scored it.
    pub(super) fn verdict_delivered(&mut self, decided: &Decided, received_at: Instant) -> Latency {
        self.summary.verdicts += 1;
        self.meters
            .verdict(decided.verdict, &decided.rules, decided.rule);
        let in_hub = received_at.elapsed();
        let end_to_end = decided.event_time_ms.map(|t| {
            let ms = (chrono::Utc::now().timestamp_millis() - t).max(0);
            self.meters.end_to_end.record(ms as f64 / 1000.0);
            Duration::from_millis(ms as u64)
        });
        // Without a record timestamp only the part in the hub is known.
        let end_to_end = end_to_end.unwrap_or(in_hub).max(in_hub);
        Latency { end_to_end, in_hub }
    }

    pub(super) fn dead_letter_delivered(&mut self, reason: crate::event::RejectReason) {
        self.summary.dlq += 1;
        metrics::counter!(metric::DLQ_TOTAL, "reason" => reason.code()).increment(1);
    }

    /// A record of `tp`'s `offset` the broker refused for good: counted,
    /// logged with where the original lives, and committed past.
    pub(super) fn undeliverable(&mut self, tp: &Tp, offset: i64, refused: &Refused) {
        let kind = refused.kind.as_str();
        metrics::counter!(metric::UNDELIVERABLE_TOTAL, "kind" => kind).increment(1);
        tracing::error!(topic = %tp.topic, partition = tp.partition, offset, kind, to = %refused.topic, error = %refused.error, "the broker refuses this record for good; its offset is committed");
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
