//! Verdicts: a policy's decision on a model's (or several models')
//! probabilities, written as the verdict record, the decision record and
//! routed copies.
//!
//! Verdict (JSON, keyed like the input event), fields in name order:
//! `{"event_id", "latency_ms", "model": {"name", "version"}, "processed_at",
//!   "reason": {"human_review", "models": [{"crossed": [{"label", "score",
//!   "threshold", "verdict"}], "id", "name", "scores", "version"}],
//!   "policy", "rule", "match"?, "wave"?, "reused"?}, "review_priority"?, "scores": {label: p},
//!   "source": {"topic", "partition", "offset"}, "tenant"?, "verdict":
//!   "allow"|"review"|"block", "warnings"?}`.
//! `model` and `scores` are those of the first model that judged the event
//! (the only one in a single-model configuration); `reason` has every
//! judging model. `tenant` when the event has one, `warnings` when optional
//! fields were left out, `review_priority` only in a copy a rule routed to
//! another topic. `latency_ms` runs from the input record's Kafka timestamp
//! (or the event's `created_at` when the record has none) to when the
//! verdict was made; it is null in a verdict judged again (`rescore`,
//! `explain`), where the time since the event is no pipeline's latency.
//!
//! Dead-letter records are in [`crate::producer::record`].

use crate::config::{Policy, Thresholds};
use crate::event::{self, Event};
use crate::inference::manifest::Manifest;
use crate::policy::{Decision, Judge, Match, ModelId, Rule, RuleId, Ruleset};
use crate::producer::record::{OutRecord, RecordKind};
use crate::tp::Tp;

mod body;
mod marks;
mod stamp;

use body::{
    DecisionBody, DrawnRef, DropBody, EventRef, ModelOf, ModelRef, SampleBody, Scores, SourceRef,
    VerdictBody,
};

pub use crate::policy::{Verdict, decide};
pub use marks::{ClusterId, ListMatch, Marks, WaveNote};
pub use stamp::{Stamp, rfc3339};

/// A new model version for the hub (from a hot reload).
#[derive(Debug)]
pub struct NewScorer {
    /// The model (its lane).
    pub model: ModelId,
    /// The version the workers' results carry from their next job on.
    pub version: u64,
    pub scorer: std::sync::Arc<Scorer>,
}

/// A loaded model's identity and labels (and, for the tools that judge one
/// model alone, the configuration's `[policy]` thresholds for it).
#[derive(Debug)]
pub struct Scorer {
    /// The configuration's name for it (`inference.models[].name`).
    pub id: String,
    labels: Vec<String>,
    model_name: String,
    model_version: String,
    /// Label indices in name order (the order of `scores` in a verdict).
    sorted_labels: Vec<usize>,
    /// One rule: this model by `[policy]` (shadow, rescore, bench).
    alone: Ruleset,
}

/// One model's judgement of an event (for shadow comparison records).
#[derive(serde::Serialize)]
pub struct Judgement<'a> {
    model: ModelRef<'a>,
    scores: Scores<'a>,
    pub verdict: Verdict,
}

pub use crate::policy::PolicyError;

/// An event judged: the rules in force when it arrived, the rule that
/// decided, its decision, and each judging model (index, identity,
/// probabilities) in the order they ran.
pub struct Judged<'a> {
    pub rules: &'a Ruleset,
    pub rule: RuleId,
    pub decision: &'a Decision,
    pub models: JudgingModels<'a>,
    /// What matching found (lists, waves), if it ran.
    pub marks: Option<&'a Marks>,
    /// The state rule that raised the verdict, if one did.
    pub state: Option<&'a crate::policy::state_rules::Fired>,
}

/// The models that judged an event: inline for up to two (no allocation
/// per verdict for the usual one or two models).
pub type JudgingModels<'a> = smallvec::SmallVec<[ScoredBy<'a>; 2]>;

/// One model's scores of an event.
#[derive(Debug, Clone)]
pub struct ModelScores {
    pub model: ModelId,
    /// The identity of the model version that scored it.
    pub scorer: std::sync::Arc<Scorer>,
    pub probabilities: Vec<f32>,
    /// Taken from its wave's first scored post, not from a run of the model.
    pub reused: bool,
}

/// One judging model's scores of the event.
#[derive(Debug, Clone, Copy)]
pub struct ScoredBy<'a> {
    pub model: ModelId,
    pub scorer: &'a Scorer,
    pub probabilities: &'a [f32],
}

/// Where a verdict comes from and what it answers.
pub struct Answer<'a> {
    pub source: &'a Tp,
    pub offset: i64,
    /// The input record's key (each record written copies it).
    pub key: Option<&'a [u8]>,
    pub event: &'a Event,
    /// The input record's Kafka timestamp.
    pub timestamp_ms: Option<i64>,
}

impl Scorer {
    /// Fails when `policy.labels` names a label the model does not have.
    pub fn new(manifest: &Manifest, policy: &Policy) -> Result<Scorer, PolicyError> {
        let labels = crate::policy::ModelLabels::of(&manifest.name, manifest);
        let alone = Ruleset::from_config(policy, std::slice::from_ref(&labels))?;
        Ok(Scorer::with_rules(&manifest.name, manifest, alone))
    }

    /// The identity of model `id` (its policy comes from the ruleset).
    pub fn named(id: &str, manifest: &Manifest) -> Scorer {
        let labels = crate::policy::ModelLabels::of(id, manifest);
        let t = Thresholds {
            review_at: 0.5,
            block_at: 0.85,
        };
        let alone = Ruleset::new(
            "config".into(),
            vec![Rule {
                id: "default".into(),
                when: Match::default(),
                judges: vec![Judge {
                    model: ModelId(0),
                    labels: vec![(
                        labels
                            .labels
                            .get(labels.score_label)
                            .cloned()
                            .unwrap_or_default(),
                        t,
                    )],
                }],
                human_review: false,
                routes: Vec::new(),
                cascade: Vec::new(),
                lists: None,
            }],
        );
        Scorer::with_rules(id, manifest, alone)
    }

    fn with_rules(id: &str, manifest: &Manifest, alone: Ruleset) -> Scorer {
        let mut sorted_labels: Vec<usize> = (0..manifest.labels.len()).collect();
        sorted_labels.sort_by_key(|&i| &manifest.labels[i]);
        Scorer {
            id: id.to_string(),
            sorted_labels,
            labels: manifest.labels.clone(),
            model_name: manifest.name.clone(),
            model_version: manifest.version.clone(),
            alone,
        }
    }

    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// "name version" of the manifest.
    pub fn model(&self) -> (&str, &str) {
        (&self.model_name, &self.model_version)
    }

    /// The verdict, scores and model of `probabilities`, serializable.
    pub fn judge<'a>(&'a self, probabilities: &'a [f32]) -> Judgement<'a> {
        Judgement {
            model: ModelRef {
                id: None,
                name: &self.model_name,
                version: &self.model_version,
            },
            scores: Scores {
                scorer: Some(self),
                probabilities,
            },
            verdict: self.decide(probabilities),
        }
    }

    /// This model alone by `[policy]`: the most severe verdict over the
    /// judged labels.
    pub fn decide(&self, probabilities: &[f32]) -> Verdict {
        self.decision(probabilities).verdict
    }

    fn decision(&self, probabilities: &[f32]) -> Decision {
        self.alone.rules()[0].judge(|_| Some((&self.labels, probabilities)))
    }

    /// The verdict record of this model alone by `[policy]` (rescore).
    pub fn verdict_record(
        &self,
        topic: &str,
        answer: Answer<'_>,
        probabilities: &[f32],
    ) -> (OutRecord, Verdict) {
        let json = |body: &VerdictPayload<'_>| Ok::<_, std::convert::Infallible>(to_json(body));
        match self.verdict_record_with(topic, answer, probabilities, json) {
            Ok(done) => done,
            Err(never) => match never {},
        }
    }

    /// [`Scorer::verdict_record`], its body written by `write`.
    pub fn verdict_record_with<E>(
        &self,
        topic: &str,
        answer: Answer<'_>,
        probabilities: &[f32],
        write: impl FnOnce(&VerdictPayload<'_>) -> Result<Vec<u8>, E>,
    ) -> Result<(OutRecord, Verdict), E> {
        let decision = self.decision(probabilities);
        let judged = Judged {
            rules: &self.alone,
            rule: RuleId(0),
            decision: &decision,
            models: smallvec::smallvec![ScoredBy {
                model: ModelId(0),
                scorer: self,
                probabilities,
            }],
            marks: None,
            state: None,
        };
        let record = verdict_record_with(topic, &answer, &judged, None, Timing::Rejudged, write)?;
        Ok((record, decision.verdict))
    }
}

/// When a verdict is made: as the event flows through the pipeline, or
/// again later (its `latency_ms` then null).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    Live,
    Rejudged,
}

/// A verdict's body, the one definition of the verdict: written as JSON,
/// or in Avro from its value resolved against the verdict schema
/// ([`crate::schema::verdict`], whose fields are its fields; a test in
/// this module's tests holds the two together).
pub struct VerdictPayload<'a>(VerdictBody<'a>);

impl serde::Serialize for VerdictPayload<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The verdict record in JSON (`priority`: the route's, in a routed copy).
pub fn verdict_record(
    topic: &str,
    answer: &Answer<'_>,
    judged: &Judged<'_>,
    priority: Option<&str>,
    timing: Timing,
) -> OutRecord {
    let json = |body: &VerdictPayload<'_>| Ok::<_, std::convert::Infallible>(to_json(body));
    match verdict_record_with(topic, answer, judged, priority, timing, json) {
        Ok(record) => record,
        Err(never) => match never {},
    }
}

/// The verdict record, its body written by `write` (JSON, or Avro).
pub fn verdict_record_with<E>(
    topic: &str,
    answer: &Answer<'_>,
    judged: &Judged<'_>,
    priority: Option<&str>,
    timing: Timing,
    write: impl FnOnce(&VerdictPayload<'_>) -> Result<Vec<u8>, E>,
) -> Result<OutRecord, E> {
    let now = chrono::Utc::now();
    let latency_ms = match timing {
        Timing::Live => event::event_time_ms(answer.timestamp_ms, answer.event)
            .map(|t| (now.timestamp_millis() - t).max(0)),
        Timing::Rejudged => None,
    };
    let processed_at = Stamp::at(now);
    let first = judged.models.first();
    let model = ModelOf {
        name: first.map_or("", |m| &m.scorer.model_name),
        version: first.map_or("", |m| &m.scorer.model_version),
    };
    let body = VerdictBody {
        event_id: &answer.event.event_id,
        latency_ms,
        model,
        processed_at: processed_at.as_str(),
        reason: judged.reason(),
        review_priority: priority,
        scores: Scores {
            scorer: first.map(|m| m.scorer),
            probabilities: first.map_or(&[], |m| m.probabilities),
        },
        source: source_ref(answer),
        tenant: answer.event.tenant.as_deref(),
        verdict: judged.decision.verdict,
        warnings: answer
            .event
            .warnings
            .iter()
            .map(ToString::to_string)
            .collect(),
    };
    let payload = write(&VerdictPayload(body))?;
    Ok(OutRecord {
        topic: topic.to_string(),
        partition: None,
        key: answer.key.map(<[u8]>::to_vec),
        payload: Some(payload),
        headers: Vec::new(),
        timestamp_ms: None,
        kind: RecordKind::Verdict,
    })
}

/// The compact audit record for `output.decisions_topic`, keyed by event id
/// (a compacted topic keeps the last decision per event).
pub fn decision_record(topic: &str, answer: &Answer<'_>, judged: &Judged<'_>) -> OutRecord {
    let decided_at = Stamp::at(chrono::Utc::now());
    let body = DecisionBody {
        decided_at: decided_at.as_str(),
        event_id: &answer.event.event_id,
        event_time_ms: event::event_time_ms(answer.timestamp_ms, answer.event),
        human_review: judged.decision.human_review,
        models: judged
            .models
            .iter()
            .map(|m| ModelRef {
                id: Some(&m.scorer.id),
                name: &m.scorer.model_name,
                version: &m.scorer.model_version,
            })
            .collect(),
        policy: &judged.rules.version,
        reasons: judged.crossed(),
        rule: judged.rule_id(),
        source: source_ref(answer),
        tenant: answer.event.tenant.as_deref(),
        verdict: judged.decision.verdict,
    };
    let key = Some(answer.event.event_id.clone().into_bytes());
    record(topic, key, &body, RecordKind::Decision)
}

/// How a sampled event was drawn, for its sample record.
pub struct Drawn<'a> {
    pub sample: crate::sampling::Sample,
    /// The model (configuration name) and label whose score drew it.
    pub model: &'a str,
    pub label: Option<&'a str>,
}

impl Drawn<'_> {
    fn as_ref(&self) -> DrawnRef<'_> {
        DrawnRef {
            label: self.label,
            model: self.model,
            probability: self.sample.probability,
            score: self.sample.score,
        }
    }
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The sample record for `output.samples_topic`, keyed by event id: the
/// event, its verdict and reason, and how it was drawn.
pub fn sample_record(
    topic: &str,
    answer: &Answer<'_>,
    judged: &Judged<'_>,
    drawn: &Drawn<'_>,
) -> OutRecord {
    let sampled_at = now_rfc3339();
    let e = answer.event;
    let body = SampleBody {
        event: EventRef {
            created_at_ms: e.created_at_ms,
            event_id: &e.event_id,
            lang: e.lang.as_deref(),
            metadata: e.metadata.as_ref(),
            tenant: e.tenant.as_deref(),
            text: &e.text,
            user_id: e.user_id.as_deref(),
        },
        event_id: &e.event_id,
        reason: judged.reason(),
        sample: drawn.as_ref(),
        sampled_at: &sampled_at,
        source: source_ref(answer),
        tenant: e.tenant.as_deref(),
        verdict: judged.decision.verdict,
    };
    let key = Some(e.event_id.clone().into_bytes());
    record(topic, key, &body, RecordKind::Sample)
}

/// The drop record for `output.samples_topic`, keyed by event id: a drawn
/// event the rate bound dropped (`"dropped": true`; no event, no reason).
pub fn drop_record(
    topic: &str,
    answer: &Answer<'_>,
    judged: &Judged<'_>,
    drawn: &Drawn<'_>,
) -> OutRecord {
    let sampled_at = now_rfc3339();
    let e = answer.event;
    let body = DropBody {
        dropped: true,
        event_id: &e.event_id,
        rule: judged.rule_id(),
        sample: drawn.as_ref(),
        sampled_at: &sampled_at,
        source: source_ref(answer),
        tenant: e.tenant.as_deref(),
    };
    let key = Some(e.event_id.clone().into_bytes());
    record(topic, key, &body, RecordKind::Sample)
}

fn source_ref<'a>(answer: &Answer<'a>) -> SourceRef<'a> {
    SourceRef {
        offset: answer.offset,
        partition: answer.source.partition,
        topic: &answer.source.topic,
    }
}

fn record(
    topic: &str,
    key: Option<Vec<u8>>,
    body: &impl serde::Serialize,
    kind: RecordKind,
) -> OutRecord {
    OutRecord {
        topic: topic.to_string(),
        partition: None,
        key,
        payload: Some(to_json(body)),
        headers: Vec::new(),
        timestamp_ms: None,
        kind,
    }
}

fn to_json(body: &impl serde::Serialize) -> Vec<u8> {
    thread_local! {
        /// Grown once to the largest record written on this thread, so that
        /// serializing does not reallocate as the record grows.
        static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Serializing these structs cannot fail; an empty body would be a bug.
    BUFFER.with_borrow_mut(|buffer| {
        buffer.clear();
        match serde_json::to_writer(&mut *buffer, body) {
            Ok(()) => buffer.clone(),
            Err(_) => Vec::new(),
        }
    })
}

#[cfg(test)]
mod tests;
