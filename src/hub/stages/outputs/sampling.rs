//! The hub's side of sampling ([`crate::sampling`]): each verdict's risk
//! score (its sampling model's score of the sampling label, or the highest
//! of the labels its rule judges by that model; 0 when that model did not
//! score it), the draw, and the sample record written with the verdict.

use crate::config::Settings;
use crate::hub::partition::{ModelScores, Pending};
use crate::policy::{ModelId, Rule};
use crate::producer::record::OutRecord;
use crate::sampling::{Candidate, Draw, Sampler};
use crate::tp::Source;
use crate::verdict::{self, Answer, Drawn, Judged};
use tokio::time::Instant;

/// The sampler and what it draws by.
pub(super) struct Sampling {
    sampler: Sampler,
    topic: String,
    model: ModelId,
    model_name: String,
    label: Option<String>,
}

impl Sampling {
    /// With `output.samples_topic` set.
    pub(super) fn new(settings: &Settings) -> Option<Sampling> {
        let topic = settings.output.samples_topic.clone()?;
        let s = &settings.sampling;
        let models = settings.models();
        // Validated: a named model is one of them.
        let index = s
            .model
            .as_ref()
            .and_then(|name| models.iter().position(|m| &m.name == name))
            .unwrap_or(0);
        Some(Sampling {
            sampler: Sampler::new(s),
            topic,
            model: ModelId(index),
            model_name: models
                .get(index)
                .map_or_else(String::new, |m| m.name.clone()),
            label: s.label.clone(),
        })
    }

    /// The risk score of an event judged by `rule` with these scores.
    fn score(&self, rule: &Rule, scores: &[ModelScores]) -> f64 {
        let Some(m) = scores.iter().find(|s| s.model == self.model) else {
            return 0.0;
        };
        let labels = m.scorer.labels();
        let of = |label: &str| {
            labels
                .iter()
                .position(|l| l == label)
                .and_then(|i| m.probabilities.get(i))
                .map(|&p| f64::from(p))
        };
        match &self.label {
            Some(label) => of(label).unwrap_or(0.0),
            None => rule
                .judges
                .iter()
                .filter(|j| j.model == self.model)
                .flat_map(|j| &j.labels)
                .filter_map(|(label, _)| of(label))
                .fold(0.0, f64::max),
        }
    }
}

impl Sampling {
    /// The sample record of a judged event if it is drawn, or its drop
    /// record if the rate bound dropped it.
    pub(super) fn sample(
        &mut self,
        pending: &Pending,
        answer: &Answer<'_>,
        judged: &Judged<'_>,
    ) -> Option<OutRecord> {
        let sampling = self;
        let rule = pending.rules.rule(pending.rule)?;
        let source = Source {
            tp: pending.tp.clone(),
            offset: pending.offset,
        };
        let candidate = Candidate {
            event_id: &pending.event.event_id,
            tenant: pending.event.tenant.as_deref(),
            rule: &rule.id,
            score: sampling.score(rule, &pending.scores),
            source: &source,
        };
        let drawn = |sample| Drawn {
            sample,
            model: &sampling.model_name,
            label: sampling.label.as_deref(),
        };
        let topic = &sampling.topic;
        match sampling.sampler.draw(&candidate, Instant::now()) {
            Draw::NotSampled => None,
            Draw::Sampled(s) => Some(verdict::sample_record(topic, answer, judged, &drawn(s))),
            Draw::Dropped(s) => Some(verdict::drop_record(topic, answer, judged, &drawn(s))),
        }
    }
}
