//! Match (with `[matching]`; absent otherwise): each valid event is
//! inspected as it arrives, against the lists its rule names and its wave
//! ([`crate::matching`]); what the matcher found rides with the event (its
//! marks, its cluster, reused scores, a wave record to write with its
//! verdict), and the scores it was judged by are kept for its wave's later
//! posts of the same text. Such a post takes them as it arrives if they
//! are kept by then, else at its model's turn ([`Matching::take_kept`]): a
//! backlog read at once reuses too.
//!
//! Why reuse is safe against a poster who writes the input: scores are
//! kept and taken by the post's exact text (a post of the wave that
//! differs in one byte runs its models), only while its cluster is a wave,
//! and only scores a model gave are kept (never reused ones); see
//! [`crate::matching::waves`].

use crate::hub::partition::{ModelScores, Pending, ReadyBatch};
use crate::matching::{Matcher, Post, Update};
use crate::policy::Rule;
use crate::telemetry::metric;
use crate::tp::Source;
use crate::verdict::Marks;
use tokio::time::Instant;

/// The matching stage: the matcher, when `[matching]` is on.
pub(crate) struct Matching {
    matcher: Option<Matcher>,
    /// `output.waves_topic`: where a wave's record goes.
    waves_topic: Option<String>,
}

impl Matching {
    /// Matching is off (until [`Self::set_matcher`]): every event goes on
    /// as it came. `waves_topic`: `output.waves_topic`.
    pub(crate) fn off(waves_topic: Option<String>) -> Matching {
        Matching {
            matcher: None,
            waves_topic,
        }
    }

    pub(crate) fn set_matcher(&mut self, matcher: Option<Matcher>) {
        self.matcher = matcher;
    }

    /// Matches an arriving event against the lists its rule names and its
    /// wave. A deciding list item settles it (no model runs); in a wave
    /// with scores kept for its text, it takes those of its rule's models
    /// (`reused`).
    pub(crate) fn inspect(&mut self, pending: &mut Pending) {
        let Some(matcher) = &mut self.matcher else {
            return;
        };
        let Some(rule) = pending.rules.rule(pending.rule) else {
            return;
        };
        let source = Source {
            tp: pending.tp.clone(),
            offset: pending.offset,
        };
        let post = Post {
            event_id: &pending.event.event_id,
            text: &pending.event.text,
            user: pending.event.user_id.as_deref(),
            source: &source,
            rule_lists: rule.lists.as_deref(),
        };
        let found = matcher.inspect(&post, Instant::now());
        pending.matching.cluster = found.cluster;
        let mut marks = found.marks;
        if let (Some(reuse), Some(m)) = (found.reuse, marks.as_mut()) {
            reuse_scores(&mut pending.scores, m, &reuse, rule);
        }
        pending.matching.marks = marks;
        if let (Some(report), Some(topic)) = (found.report, &self.waves_topic) {
            pending.matching.wave_record = Some(Box::new(Matcher::wave_record(topic, &report)));
        }
    }

    /// The scores a post of a cluster was judged by, from its models' runs,
    /// kept for its wave's later posts of the same text.
    pub(crate) fn remember(&mut self, pending: &Pending) {
        let (Some(matcher), Some(cluster)) = (&mut self.matcher, pending.matching.cluster) else {
            return;
        };
        if pending.scores.iter().any(|s| s.reused) {
            metrics::counter!(metric::VERDICTS_REUSED_TOTAL).increment(1);
        } else if pending.failed.is_none() {
            matcher.scored(cluster, &pending.event.text, &pending.scores);
        }
    }

    /// A list changed (a list file read again, the list topic's items).
    pub(crate) fn apply(&mut self, update: Update) {
        if let Some(matcher) = &mut self.matcher {
            matcher.apply(update);
        }
    }

    /// A model was reloaded: scores kept by the old version go.
    pub(crate) fn model_reloaded(&mut self) {
        if let Some(matcher) = &mut self.matcher {
            matcher.model_reloaded();
        }
    }

    /// A batch at its model's turn: each event of a wave, not scored yet,
    /// whose text an earlier post of its wave was scored on since it
    /// arrived takes those scores (with `matching.reuse`).
    pub(crate) fn take_kept(&self, batch: &mut ReadyBatch) {
        let Some(matcher) = &self.matcher else {
            return;
        };
        for p in &mut batch.items {
            let (Some(cluster), Some(marks)) = (p.matching.cluster, p.matching.marks.as_mut())
            else {
                continue;
            };
            if marks.wave.is_none() || !p.scores.is_empty() || p.failed.is_some() {
                continue;
            }
            let kept = matcher.kept(cluster, &p.event.text);
            let (Some(kept), Some(rule)) = (kept, p.rules.rule(p.rule)) else {
                continue;
            };
            reuse_scores(&mut p.scores, marks, &kept, rule);
        }
    }
}

/// An event takes a wave's kept scores of the models its rule runs (a
/// deciding list item needs none); its marks say so.
fn reuse_scores(
    scores: &mut Vec<ModelScores>,
    marks: &mut Marks,
    kept: &[ModelScores],
    rule: &Rule,
) {
    if marks.deciding().is_some() {
        return;
    }
    scores.extend(
        kept.iter()
            .filter(|s| rule.runs(s.model))
            .cloned()
            .map(|mut s| {
                s.reused = true;
                s
            }),
    );
    marks.reused = scores.iter().any(|s| s.reused);
}
