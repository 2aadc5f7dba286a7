//! The hub's side of matching ([`crate::matching`]): each valid event is
//! inspected as it arrives; what the matcher found rides with the event
//! (its marks, its cluster, reused scores, a wave record to write with its
//! verdict), and the scores it was judged by are kept for its wave.

use super::{Deliver, Hub};
use crate::matching::{Matcher, Update};
use crate::partition::Pending;
use crate::telemetry::metric;
use tokio::time::Instant;

impl<D: Deliver> Hub<D> {
    /// Matches an arriving event against the lists its rule names and its
    /// wave. A deciding list item settles it (no model runs); in a wave
    /// with kept scores, it takes those of its rule's models (`reused`).
    pub(super) fn inspect(&mut self, pending: &mut Pending) {
        let Some(matcher) = &mut self.matcher else {
            return;
        };
        let Some(rule) = pending.rules.rule(pending.rule) else {
            return;
        };
        let found = matcher.inspect(
            &pending.event.event_id,
            &pending.event.text,
            pending.event.user_id.as_deref(),
            rule.lists.as_deref(),
            Instant::now(),
        );
        pending.matching.cluster = found.cluster;
        let mut marks = found.marks;
        if let (Some(reuse), Some(m)) = (found.reuse, marks.as_mut())
            && m.deciding().is_none()
        {
            pending.scores = reuse
                .iter()
                .filter(|s| rule.runs(s.model))
                .cloned()
                .map(|mut s| {
                    s.reused = true;
                    s
                })
                .collect();
            m.reused = !pending.scores.is_empty();
        }
        pending.matching.marks = marks;
        if let (Some(report), Some(topic)) = (found.report, &self.settings.output.waves_topic) {
            pending.matching.wave_record = Some(Box::new(Matcher::wave_record(topic, &report)));
        }
    }

    /// The scores a post of a cluster was judged by, from its models' runs,
    /// kept for the wave's later posts (the first such post's only).
    pub(super) fn remember_scores(&mut self, pending: &Pending) {
        let (Some(matcher), Some(cluster)) = (&mut self.matcher, pending.matching.cluster) else {
            return;
        };
        if pending.scores.iter().any(|s| s.reused) {
            metrics::counter!(metric::VERDICTS_REUSED_TOTAL).increment(1);
        } else if pending.failed.is_none() {
            matcher.scored(cluster, &pending.scores);
        }
    }

    pub(super) fn on_match_update(&mut self, update: Update) {
        if let Some(matcher) = &mut self.matcher {
            matcher.apply(update);
        }
    }
}
