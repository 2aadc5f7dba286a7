//! The verdict and decision records as written, serialized from borrowed
//! parts (no `serde_json::Value` per record). Fields and score labels are
//! in name order, as they always were.

use super::marks::{MatchRef, WaveRef};
use super::{Judged, ScoredBy, Scorer};
use crate::policy::ModelId;
use crate::policy::Verdict;

#[derive(serde::Serialize)]
pub(super) struct VerdictBody<'a> {
    pub event_id: &'a str,
    pub latency_ms: Option<i64>,
    pub model: ModelOf<'a>,
    pub processed_at: &'a str,
    pub reason: Reason<'a>,
    /// Only in a routed copy: the priority its rule gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub review_priority: Option<&'a str>,
    pub scores: Scores<'a>,
    pub source: SourceRef<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<&'a str>,
    pub verdict: Verdict,
    /// Optional fields of the event left out, and why (only when some were).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A risk-weighted sample for `output.samples_topic` (see
/// `crate::sampling::records`).
#[derive(serde::Serialize)]
pub(super) struct SampleBody<'a> {
    pub event: EventRef<'a>,
    pub event_id: &'a str,
    pub reason: Reason<'a>,
    pub sample: DrawnRef<'a>,
    pub sampled_at: &'a str,
    pub source: SourceRef<'a>,
    pub tenant: Option<&'a str>,
    pub verdict: Verdict,
}

/// A drawn event the rate bound dropped, for `output.samples_topic` (so
/// that `modstream prevalence` counts each once): no event, no reason.
#[derive(serde::Serialize)]
pub(super) struct DropBody<'a> {
    /// Always true: what tells a drop from a sample.
    pub dropped: bool,
    pub event_id: &'a str,
    pub rule: &'a str,
    pub sample: DrawnRef<'a>,
    pub sampled_at: &'a str,
    pub source: SourceRef<'a>,
    pub tenant: Option<&'a str>,
}

/// The event as sampled, for the people who label it.
#[derive(serde::Serialize)]
pub(super) struct EventRef<'a> {
    pub created_at_ms: Option<i64>,
    pub event_id: &'a str,
    pub lang: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<&'a serde_json::Map<String, serde_json::Value>>,
    pub tenant: Option<&'a str>,
    pub text: &'a str,
    pub user_id: Option<&'a str>,
}

#[derive(serde::Serialize)]
pub(super) struct DrawnRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<&'a str>,
    pub model: &'a str,
    pub probability: f64,
    pub score: f64,
}

/// One event's audit record for `output.decisions_topic`.
#[derive(serde::Serialize)]
pub(super) struct DecisionBody<'a> {
    pub decided_at: &'a str,
    pub event_id: &'a str,
    /// When the event happened (ms since the epoch), if known.
    pub event_time_ms: Option<i64>,
    pub human_review: bool,
    pub models: Vec<ModelRef<'a>>,
    pub policy: &'a str,
    pub reasons: Vec<CrossedRef<'a>>,
    pub rule: &'a str,
    pub source: SourceRef<'a>,
    pub tenant: Option<&'a str>,
    pub verdict: Verdict,
}

#[derive(serde::Serialize)]
pub(super) struct ModelRef<'a> {
    /// The configuration's name for the model (only in reasons and decisions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    pub name: &'a str,
    pub version: &'a str,
}

/// The model a verdict's scores are from.
#[derive(serde::Serialize)]
pub(super) struct ModelOf<'a> {
    pub name: &'a str,
    pub version: &'a str,
}

#[derive(serde::Serialize)]
pub(super) struct SourceRef<'a> {
    pub offset: i64,
    pub partition: i32,
    pub topic: &'a str,
}

/// The verdict's `reason`: the policy version and rule that decided, and
/// per judging model its identity, scores and the thresholds crossed.
#[derive(serde::Serialize)]
pub(super) struct Reason<'a> {
    pub human_review: bool,
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matched: Option<MatchRef<'a>>,
    pub models: Vec<ModelReason<'a>>,
    pub policy: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
    pub rule: &'a str,
    /// The state rule that raised the verdict, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<StateRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wave: Option<WaveRef<'a>>,
}

/// `{"counter": "posts_1m", "entity": "user:u-9", "rule": "fast-poster", "value": 6}`.
#[derive(serde::Serialize)]
pub(super) struct StateRef<'a> {
    pub counter: &'a str,
    pub entity: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<&'a str>,
    pub raise: Verdict,
    pub rule: &'a str,
    pub value: u64,
}

#[derive(serde::Serialize)]
pub(super) struct ModelReason<'a> {
    pub crossed: Vec<Crossing<'a>>,
    /// Its thresholds were not applied: a later model of a cascade ran
    /// where it was unsure, and decided.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deferred: bool,
    pub id: &'a str,
    pub name: &'a str,
    pub scores: Scores<'a>,
    pub version: &'a str,
}

/// A threshold crossed, in a decision record: naming its model.
#[derive(serde::Serialize)]
pub(super) struct CrossedRef<'a> {
    pub label: &'a str,
    pub model: &'a str,
    pub score: f64,
    pub threshold: f64,
    pub verdict: Verdict,
}

/// A threshold crossed, in a verdict's reason (under its model).
#[derive(serde::Serialize)]
pub(super) struct Crossing<'a> {
    pub label: &'a str,
    pub score: f64,
    pub threshold: f64,
    pub verdict: Verdict,
}

/// `{label: probability}` in label name order; probabilities written as the
/// f64 of the f32 (as `serde_json::Value` did).
pub(super) struct Scores<'a> {
    /// None: no model judged (`{}`).
    pub scorer: Option<&'a Scorer>,
    pub probabilities: &'a [f32],
}

impl serde::Serialize for Scores<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        let Some(scorer) = self.scorer else {
            return map.end();
        };
        for &i in &scorer.sorted_labels {
            if let (Some(label), Some(p)) = (scorer.labels.get(i), self.probabilities.get(i)) {
                map.serialize_entry(label, &f64::from(*p))?;
            }
        }
        map.end()
    }
}

impl<'a> Judged<'a> {
    /// The crossings of all models, each naming its model.
    pub(super) fn crossed(&self) -> Vec<CrossedRef<'a>> {
        self.decision
            .crossings
            .iter()
            .filter_map(|c| {
                let scorer = self.models.iter().find(|m| m.model == c.model)?.scorer;
                Some(CrossedRef {
                    label: &c.label,
                    model: &scorer.id,
                    score: f64::from(c.score),
                    threshold: f64::from(c.threshold),
                    verdict: c.verdict,
                })
            })
            .collect()
    }

    /// The crossings of one model.
    fn crossings_of(&self, model: ModelId) -> Vec<Crossing<'a>> {
        self.decision
            .crossings
            .iter()
            .filter(|c| c.model == model)
            .map(|c| Crossing {
                label: &c.label,
                score: f64::from(c.score),
                threshold: f64::from(c.threshold),
                verdict: c.verdict,
            })
            .collect()
    }

    pub(super) fn reason(&self) -> Reason<'a> {
        Reason {
            human_review: self.decision.human_review,
            models: self
                .models
                .iter()
                .map(
                    |&ScoredBy {
                         model,
                         scorer,
                         probabilities,
                     }| ModelReason {
                        crossed: self.crossings_of(model),
                        deferred: self.decision.deferred.contains(&model),
                        id: &scorer.id,
                        name: &scorer.model_name,
                        scores: Scores {
                            scorer: Some(scorer),
                            probabilities,
                        },
                        version: &scorer.model_version,
                    },
                )
                .collect(),
            policy: &self.rules.version,
            rule: self.rule_id(),
            matched: self
                .marks
                .and_then(|m| m.matched.as_ref())
                .map(MatchRef::from),
            reused: self.marks.is_some_and(|m| m.reused),
            state: self.state.map(|f| StateRef {
                counter: &f.counter,
                entity: &f.entity,
                label: f.label.as_deref(),
                raise: f.raise,
                rule: &f.rule,
                value: f.value,
            }),
            wave: self.marks.and_then(|m| m.wave.as_ref()).map(WaveRef::from),
        }
    }

    pub(super) fn rule_id(&self) -> &'a str {
        self.rules.rule(self.rule).map_or("", |r| r.id.as_str())
    }
}
