//! Verdicts: the policy applied to a model's probabilities, and the
//! verdict record.
//!
//! Verdict (JSON, keyed like the input event):
//! `{"event_id", "verdict": "allow"|"review"|"block", "scores": {label: p},
//!   "model": {"name", "version"}, "source": {"topic", "partition", "offset"},
//!   "latency_ms", "processed_at", "tenant"?, "warnings"?}`: `tenant` when
//!   the event has one, `warnings` (["created_at: ...", ...]) when optional
//!   fields of the event were left out.
//! `latency_ms` runs from the input record's Kafka timestamp (or the event's
//! `created_at` when the record has none) to when the verdict was made.
//!
//! Dead-letter records are in [`crate::record`].

use crate::config::{Policy, Thresholds};
use crate::event::{self, Event};
use crate::manifest::Manifest;
use crate::record::{OutRecord, RecordKind};
use crate::tp::Tp;

/// A new scorer for the hub (from a hot reload): the version the workers'
/// results carry from their next job on, and the model identity and policy
/// that judge them.
pub type NewScorer = (u64, std::sync::Arc<Scorer>);

/// A verdict, in order of severity (`Ord`: the most severe is the greatest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Review,
    Block,
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
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Turns model probabilities into verdict records.
#[derive(Debug)]
pub struct Scorer {
    labels: Vec<String>,
    /// (label index, thresholds) judged for every event: the policy's
    /// per-label thresholds, or the manifest's score_label with the global ones.
    rules: Vec<(usize, Thresholds)>,
    model_name: String,
    model_version: String,
    /// Label indices in name order (the order of `scores` in a verdict).
    sorted_labels: Vec<usize>,
}

/// A verdict as written, without building a `serde_json::Value` per record.
/// Fields (and score labels) are in name order, as they always were.
#[derive(serde::Serialize)]
struct VerdictBody<'a> {
    event_id: &'a str,
    latency_ms: Option<i64>,
    model: ModelRef<'a>,
    processed_at: String,
    scores: Scores<'a>,
    source: SourceRef<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
    verdict: Verdict,
    /// Optional fields of the event left out, and why (only when some were).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

#[derive(serde::Serialize)]
struct ModelRef<'a> {
    name: &'a str,
    version: &'a str,
}

#[derive(serde::Serialize)]
struct SourceRef<'a> {
    offset: i64,
    partition: i32,
    topic: &'a str,
}

/// `{label: probability}` in label name order; probabilities written as the
/// f64 of the f32 (as `serde_json::Value` did).
struct Scores<'a> {
    labels: &'a [String],
    sorted: &'a [usize],
    probabilities: &'a [f32],
}

impl serde::Serialize for Scores<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for &i in self.sorted {
            if let (Some(label), Some(p)) = (self.labels.get(i), self.probabilities.get(i)) {
                map.serialize_entry(label, &f64::from(*p))?;
            }
        }
        map.end()
    }
}

/// One model's judgement of an event (for shadow comparison records).
#[derive(serde::Serialize)]
pub struct Judgement<'a> {
    model: ModelRef<'a>,
    scores: Scores<'a>,
    pub verdict: Verdict,
}

/// A policy that does not fit the model it would judge.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid policy for this model: policy.labels.{label}: the model has no such label (it has {known:?})"
)]
pub struct PolicyError {
    pub label: String,
    pub known: Vec<String>,
}

impl Scorer {
    /// Fails when `policy.labels` names a label the model does not have.
    pub fn new(manifest: &Manifest, policy: &Policy) -> Result<Scorer, PolicyError> {
        let rules = if policy.labels.is_empty() {
            vec![(
                manifest.score_index(),
                Thresholds {
                    review_at: policy.review_at,
                    block_at: policy.block_at,
                },
            )]
        } else {
            policy
                .labels
                .iter()
                .map(
                    |(label, t)| match manifest.labels.iter().position(|l| l == label) {
                        Some(i) => Ok((i, *t)),
                        None => Err(PolicyError {
                            label: label.clone(),
                            known: manifest.labels.clone(),
                        }),
                    },
                )
                .collect::<Result<_, _>>()?
        };
        let mut sorted_labels: Vec<usize> = (0..manifest.labels.len()).collect();
        sorted_labels.sort_by_key(|&i| &manifest.labels[i]);
        Ok(Scorer {
            sorted_labels,
            labels: manifest.labels.clone(),
            rules,
            model_name: manifest.name.clone(),
            model_version: manifest.version.clone(),
        })
    }

    /// The verdict, scores and model of `probabilities`, serializable.
    pub fn judge<'a>(&'a self, probabilities: &'a [f32]) -> Judgement<'a> {
        Judgement {
            model: ModelRef {
                name: &self.model_name,
                version: &self.model_version,
            },
            scores: Scores {
                labels: &self.labels,
                sorted: &self.sorted_labels,
                probabilities,
            },
            verdict: self.decide(probabilities),
        }
    }

    /// The most severe verdict over the judged labels.
    pub fn decide(&self, probabilities: &[f32]) -> Verdict {
        self.rules
            .iter()
            .map(|(i, t)| decide(t, probabilities.get(*i).copied().unwrap_or(0.0)))
            .max()
            .unwrap_or(Verdict::Allow)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn verdict_record(
        &self,
        topic: &str,
        source: &Tp,
        offset: i64,
        key: Option<Vec<u8>>,
        event: &Event,
        probabilities: &[f32],
        timestamp_ms: Option<i64>,
    ) -> (OutRecord, Verdict) {
        let verdict = self.decide(probabilities);
        let now = chrono::Utc::now();
        let started = event::event_time_ms(timestamp_ms, event);
        let latency_ms = started.map(|t| (now.timestamp_millis() - t).max(0));
        let body = VerdictBody {
            event_id: &event.event_id,
            latency_ms,
            model: ModelRef {
                name: &self.model_name,
                version: &self.model_version,
            },
            processed_at: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            scores: Scores {
                labels: &self.labels,
                sorted: &self.sorted_labels,
                probabilities,
            },
            source: SourceRef {
                offset,
                partition: source.partition,
                topic: &source.topic,
            },
            tenant: event.tenant.as_deref(),
            verdict,
            warnings: event.warnings.iter().map(ToString::to_string).collect(),
        };
        // Serializing a struct cannot fail; an empty body would be a bug.
        let payload = serde_json::to_vec(&body).unwrap_or_default();
        let record = OutRecord {
            topic: topic.to_string(),
            key,
            payload: Some(payload),
            headers: Vec::new(),
            timestamp_ms: None,
            kind: RecordKind::Verdict,
        };
        (record, verdict)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn thresholds_split_allow_review_block() {
        let p = Thresholds {
            review_at: 0.5,
            block_at: 0.9,
        };
        assert_eq!(decide(&p, 0.1), Verdict::Allow);
        assert_eq!(decide(&p, 0.5), Verdict::Review);
        assert_eq!(decide(&p, 0.89), Verdict::Review);
        assert_eq!(decide(&p, 0.9), Verdict::Block);
    }

    #[test]
    fn per_label_thresholds_take_the_most_severe_verdict() {
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "name": "m", "version": "1", "input_kind": "tokens",
            "inputs": ["input_ids"], "output": "logits",
            "labels": ["toxic", "threat", "insult"], "score_label": "toxic",
        }))
        .unwrap();
        let mut policy = Policy::default();
        let t = |review_at, block_at| Thresholds {
            review_at,
            block_at,
        };
        policy.labels.insert("toxic".into(), t(0.8, 0.95));
        policy.labels.insert("threat".into(), t(0.2, 0.5));
        let scorer = Scorer::new(&manifest, &policy).unwrap();
        assert_eq!(scorer.decide(&[0.1, 0.1, 0.99]), Verdict::Allow); // insult not judged
        assert_eq!(scorer.decide(&[0.85, 0.1, 0.0]), Verdict::Review);
        assert_eq!(scorer.decide(&[0.85, 0.6, 0.0]), Verdict::Block); // threat blocks
        // Without per-label thresholds: score_label with the global ones.
        let scorer = Scorer::new(&manifest, &Policy::default()).unwrap();
        assert_eq!(scorer.decide(&[0.9, 0.0, 0.0]), Verdict::Block);
        assert_eq!(scorer.decide(&[0.1, 0.99, 0.99]), Verdict::Allow);
        // A label the model lacks is refused where the policy is built.
        policy.labels.insert("spam".into(), t(0.5, 0.9));
        let error = Scorer::new(&manifest, &policy).expect_err("refused");
        assert_eq!(error.label, "spam");
        assert!(error.to_string().contains("policy.labels.spam"), "{error}");
    }

    #[test]
    fn verdicts_are_written_as_they_always_were() {
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "name": "m", "version": "2.1", "input_kind": "text", "inputs": ["text"],
            "output": "p", "labels": ["offensive", "clean", "árbol"], "score_label": "offensive",
        }))
        .unwrap();
        let scorer = Scorer::new(&manifest, &Policy::default()).unwrap();
        let tp = Tp::new("posts", 3);
        for (id, probabilities, timestamp) in [
            (
                "e-1",
                vec![0.1f32, 0.9, 0.333_333_34],
                Some(1_700_000_000_000),
            ),
            ("ü \"quoted\" 😀", vec![0.97, 0.03, 1e-8], None),
            ("short", vec![0.5], Some(0)),
        ] {
            let event = crate::event::validate(
                Some(json!({"event_id": id, "text": "t"}).to_string().as_bytes()),
                &Default::default(),
            )
            .unwrap();
            let (record, verdict) =
                scorer.verdict_record("v", &tp, 42, None, &event, &probabilities, timestamp);
            let written = String::from_utf8(record.payload.unwrap()).unwrap();
            let parsed: serde_json::Value = serde_json::from_str(&written).unwrap();
            // What the serde_json::Value version wrote for the same record.
            let scores: serde_json::Map<String, serde_json::Value> = manifest
                .labels
                .iter()
                .zip(&probabilities)
                .map(|(label, p)| (label.clone(), json!(p)))
                .collect();
            let before = json!({
                "event_id": id,
                "verdict": verdict,
                "scores": scores,
                "model": {"name": "m", "version": "2.1"},
                "source": {"topic": "posts", "partition": 3, "offset": 42},
                "latency_ms": parsed["latency_ms"],
                "processed_at": parsed["processed_at"],
            })
            .to_string();
            assert_eq!(written, before);
        }
    }
}
