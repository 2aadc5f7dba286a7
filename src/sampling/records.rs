//! The samples topic's and the labels topic's records as
//! `modstream prevalence` reads them.
//!
//! A sample (written by the service, JSON, keyed by event id): the verdict's
//! fields (`event_id`, `tenant`, `verdict`, `reason`, `source`), the event
//! itself (`event`: id, text, user, language, tenant, metadata),
//! `sampled_at`, and `sample`: `probability` (its inclusion probability),
//! `score` (the risk score it was drawn by), `model`, `label` (which
//! score; absent: the highest of its rule's labels for that model).
//!
//! A drop (written by the service when the rate bound drops a drawn event,
//! keyed by event id, same topic): `{"dropped": true, "event_id",
//! "tenant", "rule", "sampled_at", "source", "sample"}`, without the event
//! or its reason. Labelling tools skip these.
//!
//! A label (written by reviewers' tools, JSON, keyed by event id):
//! `{"event_id": "e-17", "label": "offensive", "labeller": "alice",
//! "labelled_at": "2026-12-03T10:00:00Z"}`. `label` is what the content
//! is: a label of the policy (`offensive`), or any other word for content
//! that violates nothing (`none`). An event labelled twice counts once, by
//! its latest `labelled_at`; a null value keyed by the event id retracts
//! its labels written before it.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One sample record, the fields the estimates need.
#[derive(Debug, Clone, Deserialize)]
pub struct SampleRecord {
    pub event_id: String,
    pub sampled_at: String,
    #[serde(default)]
    pub tenant: Option<String>,
    /// `allow`, `review` or `block`.
    pub verdict: String,
    pub reason: SampledReason,
    pub sample: Drawn,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SampledReason {
    pub rule: String,
    #[serde(default)]
    pub models: Vec<SampledModel>,
    #[serde(default, rename = "match")]
    pub matched: Option<SampledMatch>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SampledModel {
    pub id: String,
    #[serde(default)]
    pub scores: BTreeMap<String, f64>,
    #[serde(default)]
    pub crossed: Vec<SampledCrossing>,
    /// A later model of a cascade decided in its place.
    #[serde(default)]
    pub deferred: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SampledCrossing {
    pub label: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SampledMatch {
    pub label: String,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
pub struct Drawn {
    pub probability: f64,
    pub score: f64,
}

/// A drawn event the rate bound dropped.
#[derive(Debug, Clone, Deserialize)]
pub struct DropRecord {
    /// Always true.
    pub dropped: bool,
    pub event_id: String,
    pub sampled_at: String,
    #[serde(default)]
    pub tenant: Option<String>,
    pub rule: String,
    pub sample: Drawn,
}

/// A record of the samples topic: a sample, or a drop.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SamplesRecord {
    Sample(SampleRecord),
    Dropped(DropRecord),
}

/// A record of the labels topic, in its order: a label, or (a null value
/// keyed by the event id) the retraction of the labels before it.
#[derive(Debug, Clone)]
pub enum LabelEntry {
    Label(LabelRecord),
    Retracted(String),
}

/// One label from the labels topic.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRecord {
    pub event_id: String,
    pub label: String,
    pub labeller: String,
    /// RFC 3339.
    pub labelled_at: String,
}

impl SampleRecord {
    /// Whether its verdict flagged it for `label` at the thresholds that
    /// decided it: review or block by a threshold of that label (or by a
    /// list item of that label). For a label no model or list of the
    /// sample names: review or block at all.
    pub fn flagged_for(&self, label: &str) -> bool {
        if self.verdict == "allow" {
            return false;
        }
        let models = self.reason.models.iter().filter(|m| !m.deferred);
        let names = |m: &&SampledModel| m.scores.contains_key(label);
        if !self.reason.models.iter().any(|m| names(&m))
            && self
                .reason
                .matched
                .as_ref()
                .is_none_or(|m| m.label != label)
        {
            return true;
        }
        models.flat_map(|m| &m.crossed).any(|c| c.label == label)
            || self
                .reason
                .matched
                .as_ref()
                .is_some_and(|m| m.label == label)
    }

    /// The highest score of `label` any of its models gave (None: none of
    /// them has that label).
    pub fn score_of(&self, label: &str) -> Option<f64> {
        self.reason
            .models
            .iter()
            .filter_map(|m| m.scores.get(label).copied())
            .reduce(f64::max)
    }
}
