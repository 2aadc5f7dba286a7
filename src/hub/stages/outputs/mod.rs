//! The outputs composer: given a scored event, the records that answer it
//! (its verdict in the output format, the copies its rule routes, its
//! decision record, its sample, its wave record) or its dead-letter
//! record; and what the delivered verdict counts in. It owns what those
//! records are written with: the output topics, the Avro encoder, the
//! sampler and the shadow model it offers live verdicts to.

use std::sync::Arc;

use super::judge::Judgement;
use crate::config::{OutputSettings, Settings};
use crate::event::{self, RejectReason};
use crate::hub::partition::Pending;
use crate::policy::{ModelId, RuleId, Ruleset};
use crate::producer::record::{self, OutRecord};
use crate::schema::verdict::VerdictEncoder;
use crate::telemetry::metric;
use crate::telemetry::trace_context::TraceContext;
use crate::telemetry::traces::{Post, PostSpan, Traces};
use shadow::Shadow;

/// A record header as the output records carry them.
type Header = (std::borrow::Cow<'static, str>, Option<Vec<u8>>);
use crate::tp::{Source, Tp};
use crate::verdict::{self, Answer, Judged, ScoredBy, Verdict};

mod formats;
mod sampling;
pub mod shadow;

use sampling::Sampling;

/// The records that answer one input offset: the verdict (or dead-letter
/// record) and what goes with it (routed copies, the decision record).
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) main: OutRecord,
    pub(crate) also: Vec<OutRecord>,
    /// With `[tracing]`: the post's span, ended when they are acknowledged.
    pub(crate) span: Option<PostSpan>,
}

impl From<OutRecord> for Outgoing {
    fn from(main: OutRecord) -> Self {
        Outgoing {
            main,
            also: Vec::new(),
            span: None,
        }
    }
}

/// What an input offset's records are, for what their delivery counts in.
pub(crate) enum Outcome {
    Verdict(Decided),
    Dlq(RejectReason),
}

/// What a delivered verdict counts in: its verdict and rule (metrics by
/// rule), when the event happened (ms; see [`crate::event::event_time_ms`]),
/// and the models that scored it (their latency controllers).
pub(crate) struct Decided {
    pub(crate) verdict: Verdict,
    pub(crate) event_time_ms: Option<i64>,
    pub(crate) rules: Arc<Ruleset>,
    pub(crate) rule: RuleId,
    /// Inline for up to two models (no allocation per verdict).
    pub(crate) models: smallvec::SmallVec<[ModelId; 2]>,
}

pub(crate) struct Composer {
    output: OutputSettings,
    /// The CloudEvents `source` of the verdicts.
    ce_source: String,
    /// With `output.format = "avro"`: the registered verdict schema.
    encoder: Option<VerdictEncoder>,
    /// With `output.samples_topic`: risk-weighted samples of the verdicts.
    sampling: Option<Sampling>,
    /// The candidate model offered the live verdicts, if one is configured.
    shadow: Option<Shadow>,
    /// With `[tracing]`: each post's span.
    traces: Option<Traces>,
}

impl Composer {
    pub(crate) fn new(settings: &Settings) -> Composer {
        Composer {
            output: settings.output.clone(),
            ce_source: format!("/modstream/{}", settings.kafka.group_id),
            encoder: None,
            sampling: Sampling::new(settings),
            shadow: None,
            traces: None,
        }
    }

    pub(crate) fn set_traces(&mut self, traces: Option<Traces>) {
        self.traces = traces;
    }

    pub(crate) fn set_encoder(&mut self, encoder: Option<VerdictEncoder>) {
        self.encoder = encoder;
    }

    pub(crate) fn set_shadow(&mut self, shadow: Option<Shadow>) {
        self.shadow = shadow;
    }

    /// The dead-letter record of a record whose event could not be read.
    pub(crate) fn rejected(
        &self,
        tp: &Tp,
        offset: i64,
        original: record::Original,
        rejection: &event::Rejection,
    ) -> OutRecord {
        record::dead_letter(&self.output.dlq_topic, tp, offset, original, rejection)
    }

    /// The dead letter of an event a model could not score (with its
    /// wave record: the wave grew by this post either way).
    pub(crate) fn failed(
        &self,
        pending: Pending,
        failure: crate::inference::ScoreError,
    ) -> (Outgoing, Outcome) {
        metrics::counter!(metric::INFERENCE_FAILURES_TOTAL).increment(1);
        let rejection = event::Rejection {
            reason: RejectReason::InferenceFailed,
            message: failure.to_string(),
        };
        self.dead_letter_of_scored(pending, rejection, Vec::new())
    }

    /// The records of a judged event (its verdict, the copies its rule
    /// routes, its decision record, its sample, its wave record, and the
    /// state step's changelog records), or its dead letter should the
    /// verdict not fit the output format (with the changelog records: the
    /// state has counted it).
    pub(crate) fn compose(
        &mut self,
        mut pending: Pending,
        judgement: Judgement,
    ) -> (Outgoing, Outcome) {
        let Judgement { decision, step } = judgement;
        let rules = pending.rules.clone();
        let rule = &rules.rules()[pending.rule.0];
        let judged = Judged {
            rules: &pending.rules,
            rule: pending.rule,
            decision: &decision,
            models: pending
                .scores
                .iter()
                .map(|m| ScoredBy {
                    model: m.model,
                    scorer: &m.scorer,
                    probabilities: &m.probabilities,
                })
                .collect(),
            marks: pending.matching.marks.as_deref(),
            state: step.fired.as_ref(),
        };
        let answer = Answer {
            source: &pending.tp,
            offset: pending.offset,
            key: pending.original.key.as_deref(),
            event: &pending.event,
            timestamp_ms: pending.original.timestamp_ms,
        };
        let (span, trace) = self.trace(&pending, &rule.id, decision.verdict, step.fired.as_ref());
        let main = match self.verdict(&self.output.topic, &answer, &judged, None) {
            Ok(mut main) => {
                main.headers.extend(trace.iter().cloned());
                main
            }
            Err(e) => {
                drop(judged);
                tracing::error!(error = %e, "a verdict does not fit the output format; dead-lettered");
                let rejection = event::Rejection {
                    reason: RejectReason::Undecodable,
                    message: format!("the verdict could not be written as output.format: {e}"),
                };
                return self.dead_letter_of_scored(pending, rejection, step.changelog);
            }
        };
        let mut also = step.changelog;
        also.extend(self.copies(rule, &answer, &judged, &trace));
        if let Some(sampling) = &mut self.sampling {
            also.extend(sampling.sample(&pending, &answer, &judged));
        }
        let wave = pending.matching.wave_record.take();
        also.extend(wave.map(|w| *w));
        let decided = Decided {
            verdict: decision.verdict,
            event_time_ms: event::event_time_ms(pending.original.timestamp_ms, &pending.event),
            rules: pending.rules.clone(),
            rule: pending.rule,
            models: (pending.scores.iter())
                .filter(|m| !m.reused)
                .map(|m| m.model)
                .collect(),
        };
        drop(judged);
        // Last: the shadow takes the event's text.
        self.offer_shadow(&mut pending);
        (Outgoing { main, also, span }, Outcome::Verdict(decided))
    }

    /// The copies its rule routes and its decision record, continuing its
    /// trace (`trace`: the headers).
    fn copies(
        &self,
        rule: &crate::policy::Rule,
        answer: &Answer<'_>,
        judged: &Judged<'_>,
        trace: &[Header],
    ) -> Vec<OutRecord> {
        let mut copies = Vec::new();
        for route in rule.routes_for(judged.decision.verdict) {
            // The same format as the verdict, which just fitted it.
            let routed = self.verdict(&route.topic, answer, judged, route.priority.as_deref());
            copies.extend(routed.ok());
        }
        if let Some(topic) = &self.output.decisions_topic {
            copies.push(verdict::decision_record(topic, answer, judged));
        }
        for copy in &mut copies {
            copy.headers.extend(trace.iter().cloned());
        }
        copies
    }

    /// With `[tracing]`, the post's span; and the headers that continue
    /// its trace on the records that answer it: from its span, or (tracing
    /// off) from its producer's. A post without a trace context whose span
    /// is sampled out gets none: there is nothing downstream to continue.
    fn trace(
        &self,
        pending: &Pending,
        rule: &str,
        verdict: Verdict,
        fired: Option<&crate::policy::state_rules::Fired>,
    ) -> (Option<PostSpan>, Vec<Header>) {
        let parent = TraceContext::from_headers(&pending.original.headers);
        let span = self.traces.as_ref().map(|traces| {
            traces.post(Post {
                topic: &pending.tp.topic,
                partition: pending.tp.partition,
                offset: pending.offset,
                parent: parent.as_ref(),
                received_at: pending.received_at.into_std(),
                rule,
                verdict: verdict.as_str(),
                state_rule: fired.map(|f| f.rule.as_str()),
            })
        });
        let context = match &span {
            Some(span) => span.context().filter(|c| parent.is_some() || c.sampled()),
            None => parent,
        };
        let headers = context.map(|t| t.headers(t.span_id)).unwrap_or_default();
        (span, headers)
    }

    /// A valid event's dead letter (its model failed, or its verdict does
    /// not fit the output format), with its wave record (the wave grew by
    /// this post either way) and its changelog records (`changelog`: the
    /// state counted it).
    fn dead_letter_of_scored(
        &self,
        mut pending: Pending,
        rejection: event::Rejection,
        changelog: Vec<OutRecord>,
    ) -> (Outgoing, Outcome) {
        let wave = pending.matching.wave_record.take();
        let record = self.rejected(&pending.tp, pending.offset, pending.original, &rejection);
        let mut out: Outgoing = record.into();
        out.also.extend(wave.map(|w| *w));
        out.also.extend(changelog);
        (out, Outcome::Dlq(rejection.reason))
    }

    /// The shadow model gets a sample of the first model's live verdicts
    /// (by `[policy]`, as it judges its own).
    fn offer_shadow(&self, pending: &mut Pending) {
        let Some(shadow) = &self.shadow else {
            return;
        };
        let Some(first) = pending.scores.iter().find(|m| m.model == ModelId(0)) else {
            return;
        };
        if shadow.samples(&pending.event.event_id) {
            shadow.offer(crate::hub::stages::outputs::shadow::ShadowJob {
                event_id: pending.event.event_id.clone(),
                text: std::mem::take(&mut pending.event.text),
                source: Source {
                    tp: pending.tp.clone(),
                    offset: pending.offset,
                },
                live_probabilities: first.probabilities.clone(),
                live: first.scorer.clone(),
            });
        }
    }
}
