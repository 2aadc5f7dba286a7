//! Policies: which models judge an event, by which thresholds, and why.
//!
//! A [`Ruleset`] is an ordered list of rules with a version: the first rule
//! whose `when` matches the event decides (the last rule matches every
//! event, so one always does). A rule names the models that judge the
//! event, each with thresholds per label; only those models run on it. The
//! verdict is the most severe over the judged labels (`score >= block_at`
//! blocks, `score >= review_at` goes to review), raised to review when the
//! rule asks for a human on every event; [`Decision`] keeps which labels
//! crossed which threshold, for the verdict's `reason`. A rule may also
//! send copies of some verdicts to other topics ([`Route`]).
//!
//! The ruleset comes from `policy.file` ([`file`]) or, without one, from
//! the configuration's `[policy]` thresholds ([`Ruleset::from_config`]).
//! The hub stamps each event with the ruleset in force when it arrived, so
//! one event is judged by one version from its first model to its verdict.

use std::borrow::Cow;

use crate::config::Thresholds;
use crate::event::{Event, Priority};

pub mod file;
mod index;
pub mod state_rules;

pub use file::{ModelLabels, PolicyError};

/// A verdict, in order of severity (`Ord`: the most severe is the greatest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Allow,
    Review,
    Block,
}

/// Written as its name (`"allow"`): a string in JSON and in the Avro
/// verdict schema alike.
impl serde::Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Verdict {
    pub const ALL: [Verdict; 3] = [Verdict::Allow, Verdict::Review, Verdict::Block];

    /// As written in verdict records and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Review => "review",
            Verdict::Block => "block",
        }
    }

    pub fn parse(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `score >= block_at` blocks, `score >= review_at` goes to review.
pub fn decide(t: &Thresholds, score: f32) -> Verdict {
    if score >= t.block_at {
        Verdict::Block
    } else if score >= t.review_at {
        Verdict::Review
    } else {
        Verdict::Allow
    }
}

/// A rule's place in its ruleset: which rule decided an event, kept with
/// the ruleset it is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RuleId(pub usize);

/// A model's place in the models list (`[[models]]`, the order in which
/// models score an event): how rules name a model, and the hub's lane of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ModelId(pub usize);

impl ModelId {
    /// The model after this one.
    pub fn next(self) -> ModelId {
        ModelId(self.0 + 1)
    }

    /// The models of a list of `n`, in order.
    pub fn all(n: usize) -> impl Iterator<Item = ModelId> {
        (0..n).map(ModelId)
    }
}

/// The rules in force, in order, and their version.
#[derive(Debug, Clone, PartialEq)]
pub struct Ruleset {
    pub version: String,
    rules: Vec<Rule>,
    index: index::TenantIndex,
    /// Rules on an entity's state, after the deciding rule ([`state_rules`]).
    state_rules: Vec<state_rules::StateRule>,
    /// The scores and distinct values they count.
    state_tracked: state_rules::Tracked,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub id: String,
    pub when: Match,
    /// The models that judge, in the order they run (model index order).
    pub judges: Vec<Judge>,
    /// Every verdict of this rule needs a human: at least `review`.
    pub human_review: bool,
    pub routes: Vec<Route>,
    /// Models that run only where an earlier one is unsure.
    pub cascade: Vec<Cascade>,
    /// The known-bad lists its events are matched against (None: all).
    /// A rule without models is decided by its lists alone (allow when
    /// nothing matches).
    pub lists: Option<Vec<String>>,
}

/// A model of the rule that runs only where an earlier model of the rule
/// is unsure: when `after`'s score of `label` is in the band ([`Cascade::contains`]). When it
/// ran, it decides in `after`'s place (`after`'s thresholds are not
/// applied; its scores stay in the reason, marked deferred).
#[derive(Debug, Clone, PartialEq)]
pub struct Cascade {
    pub model: ModelId,
    pub after: ModelId,
    pub label: String,
    pub from: f32,
    pub to: f32,
}

/// The band of a cascade that names none: chosen from the bench's band
/// sweep (docs/benchmarks.md, "A cheap model first").
pub const DEFAULT_BAND: [f32; 2] = [0.1, 0.9];

impl Cascade {
    /// Whether a score is in the band: `from` inclusive, `to` exclusive,
    /// except that a band up to 1 includes 1 (`[0, 1]` is every score).
    pub fn contains(&self, score: f32) -> bool {
        score >= self.from && (score < self.to || self.to >= 1.0)
    }
}

/// One model's part in a rule: (label, thresholds) per judged label. By
/// name, so that a model version with its labels in another order is
/// judged the same (a version that lacks one is refused by the reload).
#[derive(Debug, Clone, PartialEq)]
pub struct Judge {
    pub model: ModelId,
    pub labels: Vec<(String, Thresholds)>,
}

/// A copy of the verdicts in `verdicts` also goes to `topic`, with the
/// rule's `priority` for the queue that reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub verdicts: Vec<Verdict>,
    pub topic: String,
    pub priority: Option<String>,
}

/// Event fields a rule matches on: every field named must hold one of its
/// values (an event without the field does not match). Empty: every event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Match {
    pub fields: Vec<(Field, Vec<String>)>,
}

/// What a rule can look at.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    Tenant,
    Topic,
    Lang,
    Priority,
    UserId,
    /// `metadata.KEY`: a value of the event's metadata object (strings as
    /// they are, numbers and booleans as written in JSON).
    Metadata(String),
}

impl Field {
    pub fn parse(name: &str) -> Option<Field> {
        Some(match name {
            "tenant" => Field::Tenant,
            "topic" => Field::Topic,
            "lang" => Field::Lang,
            "priority" => Field::Priority,
            "user_id" => Field::UserId,
            _ => Field::Metadata(name.strip_prefix("metadata.")?.to_string()),
        })
    }

    /// The event's value of this field, borrowed where the event holds it.
    pub fn value<'a>(&self, topic: &'a str, event: &'a Event) -> Option<Cow<'a, str>> {
        let borrowed = |s: &'a Option<String>| s.as_deref().map(Cow::Borrowed);
        match self {
            Field::Tenant => borrowed(&event.tenant),
            Field::Topic => Some(Cow::Borrowed(topic)),
            Field::Lang => borrowed(&event.lang),
            Field::Priority => Some(Cow::Borrowed(match event.priority {
                Priority::Normal => "normal",
                Priority::Urgent => "urgent",
            })),
            Field::UserId => borrowed(&event.user_id),
            Field::Metadata(key) => match event.metadata.as_ref()?.get(key)? {
                serde_json::Value::String(s) => Some(Cow::Borrowed(s)),
                v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => {
                    Some(Cow::Owned(v.to_string()))
                }
                _ => None,
            },
        }
    }
}

impl Match {
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub fn matches(&self, topic: &str, event: &Event) -> bool {
        self.fields.iter().all(|(field, values)| {
            field
                .value(topic, event)
                .is_some_and(|v| values.iter().any(|x| *x == *v))
        })
    }
}

/// A label that crossed a threshold: its score, the threshold crossed
/// (`block_at` for a block, `review_at` for a review) and what it means.
#[derive(Debug, Clone, PartialEq)]
pub struct Crossing {
    pub model: ModelId,
    pub label: String,
    pub score: f32,
    pub threshold: f32,
    pub verdict: Verdict,
}

/// How a rule judged one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    /// Models whose thresholds were not applied: a later model of a
    /// cascade ran where they were unsure.
    pub deferred: Vec<ModelId>,
    /// The verdict the scores alone gave (before `human_review`).
    pub by_score: Verdict,
    pub human_review: bool,
    pub crossings: Vec<Crossing>,
}

impl Ruleset {
    /// Without `policy.file`: one rule, `default`, in which every model
    /// judges its manifest's `score_label` by `[policy]`'s thresholds; with
    /// `[policy.labels]` (one model only, checked by the configuration) the
    /// listed labels instead.
    pub fn from_config(
        policy: &crate::config::Policy,
        models: &[ModelLabels],
    ) -> Result<Ruleset, PolicyError> {
        let global = Thresholds {
            review_at: policy.review_at,
            block_at: policy.block_at,
        };
        let mut judges = Vec::new();
        for (i, m) in models.iter().enumerate() {
            let labels = if policy.labels.is_empty() || i > 0 {
                let label = m.labels.get(m.score_label).cloned().unwrap_or_default();
                vec![(label, global)]
            } else {
                policy
                    .labels
                    .iter()
                    .map(|(label, t)| match m.index(label) {
                        Some(_) => Ok((label.clone(), *t)),
                        None => Err(PolicyError::new(
                            format!("policy.labels.{label}"),
                            m.no_such_label(label),
                        )),
                    })
                    .collect::<Result<_, _>>()?
            };
            judges.push(Judge {
                model: ModelId(i),
                labels,
            });
        }
        Ok(Ruleset::new(
            "config".to_string(),
            vec![Rule {
                id: "default".to_string(),
                when: Match::default(),
                judges,
                human_review: false,
                routes: Vec::new(),
                cascade: Vec::new(),
                lists: None,
            }],
        ))
    }

    /// The rules of `version`, in order.
    pub fn new(version: String, rules: Vec<Rule>) -> Ruleset {
        let index = index::TenantIndex::of(&rules);
        Ruleset {
            version,
            rules,
            index,
            state_rules: Vec::new(),
            state_tracked: state_rules::Tracked::default(),
        }
    }

    /// These state rules beside the rules.
    pub fn with_state_rules(mut self, state_rules: Vec<state_rules::StateRule>) -> Ruleset {
        self.state_tracked =
            state_rules::Tracked::of(state_rules.iter().flat_map(|r| &r.conditions));
        self.state_rules = state_rules;
        self
    }

    /// The state rules, in order.
    pub fn state_rules(&self) -> &[state_rules::StateRule] {
        &self.state_rules
    }

    /// The scores and distinct values the state rules count.
    pub fn state_tracked(&self) -> &state_rules::Tracked {
        &self.state_tracked
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule that decides this event (the first that matches; the last
    /// matches every event), tried among the rules its tenant can match
    /// ([`index`]).
    pub fn rule_for(&self, topic: &str, event: &Event) -> RuleId {
        RuleId(
            (self.index.candidates(event.tenant.as_deref()))
                .find(|&i| self.rules[i].when.matches(topic, event))
                .unwrap_or(self.rules.len().saturating_sub(1)),
        )
    }

    /// Rule `id`; None when it is not of this ruleset.
    pub fn rule(&self, id: RuleId) -> Option<&Rule> {
        self.rules.get(id.0)
    }

    /// Every label a rule judges of model `model` that `labels` lacks.
    pub fn missing_labels(&self, model: ModelId, labels: &[String]) -> Vec<&str> {
        let mut missing: Vec<&str> = self
            .rules
            .iter()
            .flat_map(|r| r.judges.iter().filter(|j| j.model == model))
            .flat_map(|j| j.labels.iter().map(|(l, _)| l.as_str()))
            .filter(|l| !labels.iter().any(|have| have == l))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        missing
    }

    /// The first list a rule names that is not among `known`, with the
    /// rule's id.
    pub fn unknown_list<'a>(&'a self, known: &[String]) -> Option<(&'a str, &'a str)> {
        self.rules.iter().find_map(|r| {
            let lists = r.lists.as_deref().unwrap_or_default();
            let unknown = lists.iter().find(|l| !known.contains(l))?;
            Some((r.id.as_str(), unknown.as_str()))
        })
    }

    /// Rule ids, for metric labels (they come from the file, never from
    /// event data).
    pub fn rule_ids(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.id.as_str())
    }
}

/// A label's score in one model's (labels, probabilities).
fn score_of(scores: Option<(&[String], &[f32])>, label: &str) -> Option<f32> {
    let (names, probabilities) = scores?;
    let i = names.iter().position(|n| n == label)?;
    probabilities.get(i).copied()
}

impl Rule {
    /// Whether model `model` may score the events of this rule (a cascaded
    /// one only where the model before it is unsure: [`Rule::runs_after`]).
    pub fn runs(&self, model: ModelId) -> bool {
        self.judges.iter().any(|j| j.model == model)
    }

    /// Whether model `model` is to score an event of this rule, given the
    /// scores of the models that ran before it (`scores(model)`).
    pub fn runs_after<'a>(
        &self,
        model: ModelId,
        scores: impl Fn(ModelId) -> Option<(&'a [String], &'a [f32])>,
    ) -> bool {
        if !self.runs(model) {
            return false;
        }
        match self.cascade.iter().find(|c| c.model == model) {
            None => true,
            Some(c) => score_of(scores(c.after), &c.label).is_some_and(|s| c.contains(s)),
        }
    }

    /// The verdict from each judging model's labels and probabilities
    /// (`scores(model)`; a model without scores judges nothing).
    pub fn judge<'a>(
        &self,
        scores: impl Fn(ModelId) -> Option<(&'a [String], &'a [f32])>,
    ) -> Decision {
        let deferred: Vec<ModelId> = self
            .cascade
            .iter()
            .filter(|c| scores(c.model).is_some())
            .map(|c| c.after)
            .collect();
        let mut crossings = Vec::new();
        for judge in self.judges.iter().filter(|j| !deferred.contains(&j.model)) {
            let Some((names, probabilities)) = scores(judge.model) else {
                continue;
            };
            for (label, t) in &judge.labels {
                let score = names
                    .iter()
                    .position(|n| n == label)
                    .and_then(|i| probabilities.get(i))
                    .copied()
                    .unwrap_or(0.0);
                let verdict = decide(t, score);
                let threshold = match verdict {
                    Verdict::Block => t.block_at,
                    Verdict::Review => t.review_at,
                    Verdict::Allow => continue,
                };
                crossings.push(Crossing {
                    model: judge.model,
                    label: label.clone(),
                    score,
                    threshold,
                    verdict,
                });
            }
        }
        let by_score = crossings
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Allow);
        let verdict = if self.human_review {
            by_score.max(Verdict::Review)
        } else {
            by_score
        };
        Decision {
            verdict,
            deferred,
            by_score,
            human_review: self.human_review,
            crossings,
        }
    }

    /// The decision of a known-bad list's item (its verdict, raised to
    /// review when the rule asks for a human): no model judged.
    pub fn decided_by(&self, verdict: Verdict) -> Decision {
        Decision {
            verdict: if self.human_review {
                verdict.max(Verdict::Review)
            } else {
                verdict
            },
            deferred: Vec::new(),
            by_score: verdict,
            human_review: self.human_review,
            crossings: Vec::new(),
        }
    }

    /// The routes a verdict of this rule takes besides the output topic.
    pub fn routes_for(&self, verdict: Verdict) -> impl Iterator<Item = &Route> {
        self.routes
            .iter()
            .filter(move |r| r.verdicts.contains(&verdict))
    }
}

#[cfg(test)]
mod tests;
