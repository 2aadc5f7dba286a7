//! The hub's circuit breaker on each model (see [`Breaker`]).

use tokio::time::Instant;

use crate::inference::{InferenceResult, JobId};

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
    dead_runs: u32,
    open: bool,
    /// The probe's job id while it runs.
    probe: Option<JobId>,
    next_probe: Option<Instant>,
    delay: std::time::Duration,
    /// The last text the model scored.
    last_scored: Option<String>,
}

/// What a finished run of the model tells the breaker.
#[derive(Debug)]
pub(super) enum RunOutcome {
    /// At least one event was scored (or the run had no result at all);
    /// the text of one that was, the probe from now on.
    Scored(Option<String>),
    /// Every event of the run failed.
    AllFailed,
}

/// What the hub does with a run's batches.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BreakerAction {
    /// Deliver its results as usual (events that failed go to the DLQ).
    Deliver,
    /// Put its batches back at the front of the queue: the model is taken
    /// as broken. `opened`: the breaker has just opened after this many
    /// runs in a row that failed whole.
    HoldBack { opened: Option<u32> },
}

/// The end of a probe.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ProbeOutcome {
    /// The model scored the probe: the breaker is closed again.
    Closed,
    /// It still fails; the next probe waits this long.
    StillFailing { retry_in: std::time::Duration },
}

impl Breaker {
    pub(super) fn is_open(&self) -> bool {
        self.open
    }

    /// A run ended. `limit`: `inference.breaker_after` (0: never opens).
    pub(super) fn on_run(
        &mut self,
        outcome: RunOutcome,
        limit: u32,
        now: Instant,
    ) -> BreakerAction {
        match outcome {
            RunOutcome::Scored(text) => {
                self.dead_runs = 0;
                if text.is_some() {
                    self.last_scored = text;
                }
                BreakerAction::Deliver
            }
            RunOutcome::AllFailed => {
                self.dead_runs += 1;
                if limit == 0 || (!self.open && self.dead_runs < limit) {
                    return BreakerAction::Deliver;
                }
                let opened = (!self.open).then_some(self.dead_runs);
                if !self.open {
                    self.open = true;
                    self.delay = FIRST_PROBE_DELAY;
                    self.next_probe = Some(now + FIRST_PROBE_DELAY);
                }
                BreakerAction::HoldBack { opened }
            }
        }
    }

    /// The probe's text when one is due at `now` and none runs.
    pub(super) fn probe_due(&self, now: Instant) -> Option<String> {
        let due = self.next_probe.is_some_and(|t| now >= t);
        (self.probe.is_none() && due).then(|| {
            self.last_scored
                .clone()
                .unwrap_or_else(|| PROBE_TEXT.to_string())
        })
    }

    /// The probe went to the model as job `id`.
    pub(super) fn probe_sent(&mut self, id: JobId) {
        self.probe = Some(id);
    }

    /// Whether job `id` is this breaker's probe.
    pub(super) fn is_probe(&self, id: JobId) -> bool {
        self.probe == Some(id)
    }

    /// The probe's result: `scored` when the model scored it.
    pub(super) fn on_probe(&mut self, scored: bool, now: Instant) -> ProbeOutcome {
        self.probe = None;
        if scored {
            *self = Breaker {
                last_scored: self.last_scored.take(),
                ..Breaker::default()
            };
            return ProbeOutcome::Closed;
        }
        self.delay = (self.delay * 2).clamp(FIRST_PROBE_DELAY, MAX_PROBE_DELAY);
        self.next_probe = Some(now + self.delay);
        ProbeOutcome::StillFailing {
            retry_in: self.delay,
        }
    }

    /// When the next probe is due (none while one runs).
    pub(super) fn next_probe(&self) -> Option<Instant> {
        self.next_probe.filter(|_| self.probe.is_none())
    }
}

/// The first event's failure of a run, for the log.
pub(super) fn first_error(result: &InferenceResult) -> String {
    result
        .scores
        .iter()
        .find_map(|s| s.as_ref().err())
        .map(ToString::to_string)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn failed(b: &mut Breaker, now: Instant) -> BreakerAction {
        b.on_run(RunOutcome::AllFailed, 3, now)
    }

    #[test]
    fn it_opens_after_the_limit_of_runs_that_failed_whole_in_a_row() {
        let now = Instant::now();
        let mut b = Breaker::default();
        assert_eq!(failed(&mut b, now), BreakerAction::Deliver);
        assert_eq!(failed(&mut b, now), BreakerAction::Deliver);
        // A run that scored anything starts the count again.
        assert_eq!(
            b.on_run(RunOutcome::Scored(Some("ok".into())), 3, now),
            BreakerAction::Deliver
        );
        assert_eq!(failed(&mut b, now), BreakerAction::Deliver);
        assert_eq!(failed(&mut b, now), BreakerAction::Deliver);
        assert!(!b.is_open());
        assert_eq!(
            failed(&mut b, now),
            BreakerAction::HoldBack { opened: Some(3) }
        );
        assert!(b.is_open());
        // Open: every failed run is held back, without opening again.
        assert_eq!(
            failed(&mut b, now),
            BreakerAction::HoldBack { opened: None }
        );
        // No limit: it never opens.
        let mut never = Breaker::default();
        for _ in 0..10 {
            assert_eq!(
                never.on_run(RunOutcome::AllFailed, 0, now),
                BreakerAction::Deliver
            );
        }
    }

    #[test]
    fn probes_use_the_last_scored_text_and_back_off_until_the_model_scores() {
        let start = Instant::now();
        let mut b = Breaker::default();
        assert_eq!(b.probe_due(start), None, "closed: no probe");
        b.on_run(RunOutcome::Scored(Some("last good".into())), 1, start);
        assert_eq!(
            b.on_run(RunOutcome::AllFailed, 1, start),
            BreakerAction::HoldBack { opened: Some(1) }
        );
        assert_eq!(b.probe_due(start), None, "not before its delay");
        assert_eq!(b.next_probe(), Some(start + FIRST_PROBE_DELAY));
        let at = start + FIRST_PROBE_DELAY;
        assert_eq!(b.probe_due(at).as_deref(), Some("last good"));
        b.probe_sent(JobId(7));
        assert!(b.is_probe(JobId(7)) && !b.is_probe(JobId(8)));
        assert_eq!(b.probe_due(at), None, "one probe at a time");
        assert_eq!(b.next_probe(), None);
        let mut waits = Vec::new();
        for _ in 0..7 {
            match b.on_probe(false, at) {
                ProbeOutcome::StillFailing { retry_in } => waits.push(retry_in.as_secs()),
                ProbeOutcome::Closed => panic!("closed on a failed probe"),
            }
        }
        assert_eq!(waits, [2, 4, 8, 16, 30, 30, 30], "doubling to the ceiling");
        assert!(b.is_open());
        assert_eq!(b.on_probe(true, at), ProbeOutcome::Closed);
        assert!(!b.is_open() && b.next_probe().is_none());
        // Closed again with its last scored text kept, the count from zero.
        b.on_run(RunOutcome::AllFailed, 1, at + Duration::from_secs(1));
        assert_eq!(
            b.probe_due(at + Duration::from_secs(3)).as_deref(),
            Some("last good")
        );
    }
}
