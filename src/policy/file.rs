//! The policy file (`policy.file`, TOML or YAML by its extension): read,
//! checked against the loaded models, and refused whole if any rule is
//! wrong.
//!
//! ```toml
//! version = "2026-12-01.1"
//!
//! [[rules]]
//! id = "kids"
//! when = { tenant = ["kids", "kids-es"] }   # tenant, topic, lang, priority, user_id, metadata.KEY
//! human_review = false                      # true: every verdict at least "review"
//! models.profanity.is_offensive = { review_at = 0.2, block_at = 0.5 }
//! models.minilm.toxic = { review_at = 0.3, block_at = 0.6 }
//! routes = [{ verdicts = ["review"], topic = "kids-review", priority = "high" }]
//!
//! [[rules]]
//! id = "default"                            # the last rule has no `when`
//! models.profanity.is_offensive = { review_at = 0.5, block_at = 0.85 }
//! ```

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use super::ModelId;
use super::state_rules::StateRule;
use super::{Field, Judge, Match, Route, Rule, Ruleset, Verdict};
use crate::config::Thresholds;

/// A policy that cannot take over: where in the file, and why.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("invalid policy: {at}: {message}")]
pub struct PolicyError {
    pub at: String,
    pub message: String,
}

impl PolicyError {
    pub fn new(at: impl Into<String>, message: impl Into<String>) -> PolicyError {
        PolicyError {
            at: at.into(),
            message: message.into(),
        }
    }
}

/// What the policy needs to know of a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLabels {
    /// The name the configuration gives it (`inference.models[].name`).
    pub name: String,
    pub labels: Vec<String>,
    /// Index of the manifest's `score_label`.
    pub score_label: usize,
}

impl ModelLabels {
    pub fn of(name: &str, manifest: &crate::inference::manifest::Manifest) -> ModelLabels {
        ModelLabels {
            name: name.to_string(),
            labels: manifest.labels.clone(),
            score_label: manifest.score_index(),
        }
    }

    pub fn index(&self, label: &str) -> Option<usize> {
        self.labels.iter().position(|l| l == label)
    }

    pub fn no_such_label(&self, label: &str) -> String {
        format!(
            "model {} has no label {label:?} (it has {:?})",
            self.name, self.labels
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    version: String,
    rules: Vec<RuleSpec>,
    /// Rules on an entity's state that raise verdicts ([`super::state_rules`]).
    #[serde(default)]
    state_rules: Vec<StateRuleSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateRuleSpec {
    id: String,
    #[serde(default)]
    when: BTreeMap<String, OneOrMany>,
    #[serde(rename = "if")]
    conditions: String,
    raise: String,
    #[serde(default)]
    label: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    #[serde(default)]
    when: BTreeMap<String, OneOrMany>,
    #[serde(default)]
    models: BTreeMap<String, BTreeMap<String, Thresholds>>,
    /// The known-bad lists (`[matching]`) this rule's events are matched
    /// against; left out: all of them; `[]`: none.
    #[serde(default)]
    lists: Option<Vec<String>>,
    #[serde(default)]
    human_review: bool,
    #[serde(default)]
    routes: Vec<RouteSpec>,
    /// `cascade.MODEL = { after = "MODEL", label = "LABEL", band = [from, to] }`
    /// (`band` may be left out: [`super::DEFAULT_BAND`]).
    #[serde(default)]
    cascade: BTreeMap<String, CascadeSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CascadeSpec {
    after: String,
    label: String,
    #[serde(default = "default_band")]
    band: [f32; 2],
}

fn default_band() -> [f32; 2] {
    super::DEFAULT_BAND
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteSpec {
    verdicts: Vec<String>,
    topic: String,
    priority: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl Ruleset {
    /// Read and check a policy file; any wrong rule refuses the whole file.
    pub fn load(path: &Path, models: &[ModelLabels]) -> Result<Ruleset, PolicyError> {
        let at = path.display().to_string();
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => config::FileFormat::Toml,
            Some("yaml" | "yml") => config::FileFormat::Yaml,
            _ => {
                return Err(PolicyError::new(
                    at,
                    "a policy file ends in .toml, .yaml or .yml",
                ));
            }
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::new(&at, format!("cannot read it: {e}")))?;
        Ruleset::parse(&text, format, models)
            .map_err(|e| PolicyError::new(format!("{at}: {}", e.at), e.message))
    }

    pub fn parse(
        text: &str,
        format: config::FileFormat,
        models: &[ModelLabels],
    ) -> Result<Ruleset, PolicyError> {
        let spec: FileSpec = match format {
            config::FileFormat::Toml => {
                toml::from_str(text).map_err(|e| PolicyError::new("file", e.to_string()))?
            }
            // YAML through the configuration's own reader.
            _ => config::Config::builder()
                .add_source(config::File::from_str(text, format))
                .build()
                .and_then(config::Config::try_deserialize)
                .map_err(|e| PolicyError::new("file", e.to_string()))?,
        };
        spec.check(models)
    }
}

impl FileSpec {
    fn check(self, models: &[ModelLabels]) -> Result<Ruleset, PolicyError> {
        if self.version.trim().is_empty() {
            return Err(PolicyError::new("version", "must not be empty"));
        }
        if self.rules.is_empty() {
            return Err(PolicyError::new("rules", "at least the default rule"));
        }
        let mut ids = HashSet::new();
        let last = self.rules.len() - 1;
        let mut rules = Vec::new();
        for (i, spec) in self.rules.into_iter().enumerate() {
            let at = format!("rules[{i}] ({:?})", spec.id);
            let rule = spec.check(models).map_err(|(key, m)| {
                PolicyError::new(
                    format!("{at}{}{key}", if key.is_empty() { "" } else { "." }),
                    m,
                )
            })?;
            if !ids.insert(rule.id.clone()) {
                return Err(PolicyError::new(at, "a rule id may appear once"));
            }
            match (rule.when.is_empty(), i == last) {
                (false, true) => {
                    return Err(PolicyError::new(
                        at,
                        "the last rule is the default: it has no `when` (it matches every event)",
                    ));
                }
                (true, false) => {
                    return Err(PolicyError::new(
                        at,
                        "only the last rule may leave out `when`: the rules after this one could never match",
                    ));
                }
                _ => {}
            }
            rules.push(rule);
        }
        let mut state_rules = Vec::new();
        for (i, spec) in self.state_rules.into_iter().enumerate() {
            let at = format!("state_rules[{i}] ({:?})", spec.id);
            let rule = spec.check(models).map_err(|(key, m)| {
                PolicyError::new(
                    format!("{at}{}{key}", if key.is_empty() { "" } else { "." }),
                    m,
                )
            })?;
            if state_rules.iter().any(|r: &StateRule| r.id == rule.id) {
                return Err(PolicyError::new(at, "a state rule id may appear once"));
            }
            state_rules.push(rule);
        }
        Ok(Ruleset::new(self.version, rules).with_state_rules(state_rules))
    }
}

impl StateRuleSpec {
    fn check(self, models: &[ModelLabels]) -> Result<StateRule, SpecError> {
        check_id(&self.id)?;
        let fields = check_when(self.when)?;
        let conditions =
            StateRule::parse_conditions(&self.conditions).map_err(|m| ("if".into(), m))?;
        let scores = super::state_rules::Tracked::of(&conditions).scores;
        if let Some(score) = scores
            .iter()
            .find(|s| !models.iter().any(|m| m.index(&s.label).is_some()))
        {
            let labels: Vec<&str> = models
                .iter()
                .flat_map(|m| m.labels.iter().map(String::as_str))
                .collect();
            return Err((
                "if".into(),
                format!(
                    "no model has label {:?} (their labels are {labels:?})",
                    score.label
                ),
            ));
        }
        let raise = match Verdict::parse(&self.raise) {
            Some(v @ (Verdict::Review | Verdict::Block)) => v,
            _ => {
                return Err((
                    "raise".into(),
                    format!("{:?}: \"review\" or \"block\"", self.raise),
                ));
            }
        };
        Ok(StateRule {
            id: self.id,
            when: Match { fields },
            conditions,
            raise,
            label: self.label,
        })
    }
}

/// A rule's id: what metrics and reasons name it by.
fn check_id(id: &str) -> Result<(), SpecError> {
    let id_ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if !id_ok {
        return Err((
            "id".into(),
            "1 to 64 characters of A-Z a-z 0-9 _ - .".into(),
        ));
    }
    Ok(())
}

type SpecError = (String, String);

/// The names the configuration gives its models; the one model of
/// `[inference]` (no `[[inference.models]]`) is `default`.
fn no_such_model(models: &[ModelLabels]) -> String {
    let known: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
    if known == [crate::config::SINGLE_MODEL] {
        return format!(
            "no such model: the configuration has one model ([inference] model_dir), named {:?}; write models.{}.LABEL, or name models in [[inference.models]]",
            crate::config::SINGLE_MODEL,
            crate::config::SINGLE_MODEL
        );
    }
    format!("no such model (the configuration's models are {known:?})")
}

impl RuleSpec {
    fn check(self, models: &[ModelLabels]) -> Result<Rule, SpecError> {
        check_id(&self.id)?;
        let fields = check_when(self.when)?;
        if self.models.is_empty() && self.lists.as_ref().is_none_or(Vec::is_empty) {
            return Err((
                "models".into(),
                "at least one model judges (or, without models, name the lists that decide)".into(),
            ));
        }
        let mut judges = Vec::new();
        for (name, labels) in self.models {
            let key = format!("models.{name}");
            let Some(model) = models.iter().position(|m| m.name == name).map(ModelId) else {
                return Err((key, no_such_model(models)));
            };
            if labels.is_empty() {
                return Err((key, "at least one label with its thresholds".into()));
            }
            let mut judged = Vec::new();
            for (label, t) in labels {
                let key = format!("{key}.{label}");
                if models[model.0].index(&label).is_none() {
                    return Err((key, models[model.0].no_such_label(&label)));
                }
                let valid = |x: f32| (0.0..=1.0).contains(&x);
                if !valid(t.review_at) || !valid(t.block_at) || t.review_at > t.block_at {
                    return Err((
                        key,
                        "thresholds within 0..=1 and review_at <= block_at".into(),
                    ));
                }
                judged.push((label, t));
            }
            judges.push(Judge {
                model,
                labels: judged,
            });
        }
        judges.sort_by_key(|j| j.model);
        let routes = self
            .routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.check().map_err(|m| (format!("routes[{i}]"), m)))
            .collect::<Result<_, _>>()?;
        let cascade = self
            .cascade
            .into_iter()
            .map(|(name, c)| c.check(&name, &judges, models))
            .collect::<Result<_, _>>()?;
        Ok(Rule {
            id: self.id,
            when: Match { fields },
            judges,
            human_review: self.human_review,
            routes,
            cascade,
            lists: self.lists,
        })
    }
}

/// `when`: each field known, each with at least one value.
fn check_when(when: BTreeMap<String, OneOrMany>) -> Result<Vec<(Field, Vec<String>)>, SpecError> {
    let mut fields = Vec::new();
    for (name, values) in when {
        let key = format!("when.{name}");
        let field = Field::parse(&name).ok_or_else(|| {
            (
                key.clone(),
                "not a field: tenant, topic, lang, priority, user_id or metadata.KEY".into(),
            )
        })?;
        let values = match values {
            OneOrMany::One(v) => vec![v],
            OneOrMany::Many(v) => v,
        };
        if values.is_empty() {
            return Err((key, "at least one value".into()));
        }
        if field == Field::Priority
            && let Some(bad) = values
                .iter()
                .find(|v| !["normal", "urgent"].contains(&v.as_str()))
        {
            return Err((
                key,
                format!("{bad:?}: a priority is \"normal\" or \"urgent\""),
            ));
        }
        fields.push((field, values));
    }
    Ok(fields)
}

impl CascadeSpec {
    /// Both models judge in the rule, `after` runs first, the label is
    /// `after`'s, the band within 0..=1.
    fn check(
        self,
        name: &str,
        judges: &[Judge],
        models: &[ModelLabels],
    ) -> Result<super::Cascade, SpecError> {
        let key = format!("cascade.{name}");
        let judging = |n: &str| {
            models
                .iter()
                .position(|m| m.name == n)
                .map(ModelId)
                .filter(|i| judges.iter().any(|j| j.model == *i))
        };
        let model = judging(name).ok_or_else(|| {
            (
                key.clone(),
                format!("{name} is not one of this rule's models"),
            )
        })?;
        let after = judging(&self.after).ok_or_else(|| {
            (
                format!("{key}.after"),
                format!("{} is not one of this rule's models", self.after),
            )
        })?;
        if after >= model {
            return Err((
                format!("{key}.after"),
                format!(
                    "{} must run before {name}: earlier in [[inference.models]]",
                    self.after
                ),
            ));
        }
        if models[after.0].index(&self.label).is_none() {
            return Err((
                format!("{key}.label"),
                models[after.0].no_such_label(&self.label),
            ));
        }
        let [from, to] = self.band;
        if !(0.0..=1.0).contains(&from) || !(0.0..=1.0).contains(&to) || from > to {
            return Err((
                format!("{key}.band"),
                "[from, to] within 0..=1, from <= to".into(),
            ));
        }
        Ok(super::Cascade {
            model,
            after,
            label: self.label,
            from,
            to,
        })
    }
}

impl RouteSpec {
    fn check(self) -> Result<Route, String> {
        if self.topic.trim().is_empty() {
            return Err("topic must not be empty".into());
        }
        if self.verdicts.is_empty() {
            return Err("verdicts: at least one of allow, review, block".into());
        }
        let verdicts = self
            .verdicts
            .iter()
            .map(|v| {
                Verdict::parse(v)
                    .ok_or_else(|| format!("verdicts: {v:?} is not allow, review or block"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Route {
            verdicts,
            topic: self.topic,
            priority: self.priority,
        })
    }
}
