//! `modstream explain`: find an event in a topic and show how the current
//! policy and models judge it, and why.
//!
//! It reads the topic from its first to its last offset (as of the start)
//! with its own consumer, assigned and never committing (the live group is
//! not touched), keeps every record whose event id is the one asked for
//! (read by the topic's mapping), loads each model the configuration names
//! (one session each) and the policy (`policy.file` or `[policy]`), and
//! judges each found record as the pipeline would: the rule that matches,
//! every model that rule names, the thresholds crossed. It prints that, and
//! the verdict record the pipeline would write.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::{InputFormat, ModelSpec, Settings};
use crate::event::Event;
use crate::inference;
use crate::pipeline::reload::PolicySource;
use crate::policy::ModelId;
use crate::policy::ModelLabels;
use crate::tools::range;
use crate::tp::Tp;
use crate::verdict::{self, Answer, Judged, Scorer, Timing};

#[derive(Debug, Clone, clap::Args)]
pub struct ExplainOptions {
    /// The event id to look for.
    #[arg(long)]
    pub event_id: String,
    /// The topic to look in (an input topic: the event is read by its mapping).
    #[arg(long)]
    pub topic: String,
    /// Configuration file (brokers, mapping, models, policy).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// How long to read at most before giving up.
    #[arg(long, default_value = "60s", value_parser = humantime_serde::re::humantime::parse_duration)]
    pub timeout: Duration,
}

/// One record of the event, found and judged.
pub struct Found {
    pub tp: Tp,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub event: Event,
}

/// Read the topic and judge every record of the event; the text to print.
pub fn run(opts: &ExplainOptions) -> anyhow::Result<String> {
    let settings = Settings::load(opts.config.as_deref())?;
    anyhow::ensure!(
        settings.input.format == InputFormat::Json,
        "explain reads JSON and CloudEvents input; input.format {:?} needs the schema registry, which explain does not read yet",
        settings.input.format
    );
    let found = find(&settings, opts)?;
    anyhow::ensure!(
        !found.is_empty(),
        "no event {:?} in {} (read from the first offset to the end of every partition)",
        opts.event_id,
        opts.topic
    );
    let specs = settings.models();
    let mut models = load_models(&specs)?;
    let labels: Vec<ModelLabels> = specs
        .iter()
        .zip(&models)
        .map(|(s, (_, m))| ModelLabels::of(&s.name, &m.manifest))
        .collect();
    let rules = PolicySource::of(&settings).rules(&labels)?;
    let mut out = String::new();
    for f in found {
        let rule_id = rules.rule_for(&opts.topic, &f.event);
        let rule = &rules.rules()[rule_id.0];
        let scores = run_models(&mut models, rule, &f.event.text)?;
        let mut decision = rule.judge(|m| scores_of(&scores, m));
        let score = |label: &str| label_score(&scores, label);
        let at = StateAt {
            f: &f,
            rules: &rules,
            score: &score,
        };
        let state = StateJudged::of(&settings, at, &mut decision, opts.timeout)?;
        let fired = state.as_ref().and_then(|s| s.fired.clone());
        let judged = Judged {
            rules: &rules,
            rule: rule_id,
            decision: &decision,
            models: scores
                .iter()
                .map(|s| crate::verdict::ScoredBy {
                    model: s.model,
                    scorer: s.scorer,
                    probabilities: &s.probabilities,
                })
                .collect(),
            marks: None,
            state: fired.as_ref(),
        };
        let answer = Answer {
            source: &f.tp,
            offset: f.offset,
            key: f.key.as_deref(),
            event: &f.event,
            timestamp_ms: f.timestamp_ms,
        };
        out.push_str(&describe(&f, &judged));
        if let Some(state) = &state {
            out.push_str(&state.describe());
        }
        let topic = &settings.output.topic;
        let record = verdict::verdict_record(topic, &answer, &judged, None, Timing::Rejudged);
        let body: serde_json::Value =
            serde_json::from_slice(record.payload.as_deref().unwrap_or_default())?;
        out.push_str(&serde_json::to_string_pretty(&body)?);
        out.push('\n');
    }
    Ok(out)
}

/// With `[state]`: the state of the event's partition as the changelog
/// holds it just before the event (the changes of earlier offsets), and
/// what the state rules make of the event.
struct StateBefore {
    store: crate::state::Store,
    /// Changelog records read.
    records: u64,
}

/// What the state rules made of the event.
struct StateJudged {
    entity: Option<String>,
    known: bool,
    records: u64,
    fired: Option<crate::policy::state_rules::Fired>,
}

impl StateBefore {
    /// `None` without `state.changelog_topic`.
    fn read(
        settings: &Settings,
        f: &Found,
        timeout: Duration,
    ) -> anyhow::Result<Option<StateBefore>> {
        let Some(topic) = &settings.state.changelog_topic else {
            return Ok(None);
        };
        let group = format!("modstream-explain-state-{}", std::process::id());
        let mut cfg =
            crate::client::consumer(settings, crate::client::ConsumerRole::RangeReader, &group);
        cfg.set("isolation.level", "read_committed");
        let consumer: rdkafka::consumer::BaseConsumer = cfg.create()?;
        let p = f.tp.partition;
        // To the high watermark, as the restore reads: changes committed
        // past a stopped owner's open transaction count too.
        let (low, high) = crate::client::WrittenEnds::new(&cfg)?.of(topic, p, range::TIMEOUT)?;
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, p, Offset::Offset(low))?;
        consumer.assign(&assignment)?;
        let late =
            format!("the state changelog was not read to its end within --timeout ({timeout:?})");
        let deadline = (std::time::Instant::now() + timeout, late.as_str());
        let mut rebuild = crate::state::Rebuild::default();
        let mut records = 0;
        let ends = HashMap::from([(p, if high > low { high } else { 0 })]);
        range::read_until(&consumer, ends, Some(deadline), |_, parts| {
            records += 1;
            let offset = (parts.headers.iter().rev())
                .find(|(k, _)| k == crate::state::OFFSET_HEADER)
                .and_then(|(_, v)| v.as_deref());
            let key = parts.key.unwrap_or_default();
            // A record that is not a change of state is skipped, as the restore does.
            let _ = rebuild.apply(&f.tp.topic, f.offset, key, parts.payload, offset);
            std::ops::ControlFlow::Continue(())
        })?;
        Ok(Some(StateBefore {
            store: rebuild.finish(),
            records,
        }))
    }

    fn judge(
        &mut self,
        settings: &Settings,
        StateAt { f, rules, score }: StateAt<'_>,
        verdict: verdict::Verdict,
    ) -> StateJudged {
        let entity = crate::policy::Field::parse(&settings.state.entity).and_then(|field| {
            field
                .value(&f.tp.topic, &f.event)
                .map(|v| format!("{}:{v}", settings.state.entity_name))
        });
        let known = entity
            .as_deref()
            .is_some_and(|e| self.store.get(e).is_some());
        let step = crate::state::Keeper::new(&settings.state).map(|mut keeper| {
            keeper.step(
                &mut self.store,
                crate::state::Judging {
                    tp: &f.tp,
                    offset: f.offset,
                    event: &f.event,
                    key: f.key.as_deref(),
                    timestamp_ms: f.timestamp_ms,
                    rules,
                    verdict,
                    score,
                },
            )
        });
        StateJudged {
            entity,
            known,
            records: self.records,
            fired: step.and_then(|s| s.fired),
        }
    }
}

/// The event the state rules judge: where it was found, the rules, and
/// its scores by label (the highest of the models that scored it).
#[derive(Clone, Copy)]
struct StateAt<'a> {
    f: &'a Found,
    rules: &'a crate::policy::Ruleset,
    score: &'a dyn Fn(&str) -> Option<f32>,
}

impl StateJudged {
    /// With `[state]`: what the state rules make of the event, from the
    /// changelog before it; `decision` raised if one fires.
    fn of(
        settings: &Settings,
        at: StateAt<'_>,
        decision: &mut crate::policy::Decision,
        timeout: Duration,
    ) -> anyhow::Result<Option<StateJudged>> {
        let Some(mut before) = StateBefore::read(settings, at.f, timeout)? else {
            return Ok(None);
        };
        let judged = before.judge(settings, at, decision.verdict);
        if let Some(fired) = &judged.fired {
            decision.verdict = decision.verdict.max(fired.raise);
        }
        Ok(Some(judged))
    }

    fn describe(&self) -> String {
        let Some(entity) = &self.entity else {
            return "state: the event names no entity (state.entity)\n".into();
        };
        let before = if self.known {
            format!(
                "{entity}'s state from the changelog before this offset ({} records read)",
                self.records
            )
        } else {
            format!(
                "no state of {entity} in the changelog before this offset ({} records read; the cleaner may have compacted it away)",
                self.records
            )
        };
        match &self.fired {
            Some(f) => format!(
                "state: {before}\n  state rule {:?}: {} = {}: raises to {}\n",
                f.rule, f.counter, f.value, f.raise
            ),
            None => format!("state: {before}\n  no state rule raises it\n"),
        }
    }
}

/// One session of each model the configuration names, with its scorer.
fn load_models(specs: &[ModelSpec]) -> anyhow::Result<Vec<(Scorer, inference::Model)>> {
    let mut models = Vec::new();
    for spec in specs {
        let mut sessions =
            inference::load_sessions(&spec.inference, 1, inference::RunLimit::posts(1))?;
        anyhow::ensure!(!sessions.is_empty(), "model {} did not load", spec.name);
        models.push((
            Scorer::named(&spec.name, &sessions[0].manifest),
            sessions.remove(0),
        ));
    }
    Ok(models)
}

/// The judgement in words.
fn describe(f: &Found, judged: &Judged<'_>) -> String {
    let rule = &judged.rules.rules()[judged.rule.0];
    let mut s = format!(
        "event {} at {}/{}@{}{}\npolicy {}, rule {:?}{}\n",
        f.event.event_id,
        f.tp.topic,
        f.tp.partition,
        f.offset,
        f.event
            .tenant
            .as_deref()
            .map(|t| format!(" (tenant {t})"))
            .unwrap_or_default(),
        judged.rules.version,
        rule.id,
        if rule.when.is_empty() {
            " (the default)"
        } else {
            ""
        },
    );
    for m in &judged.models {
        let (scorer, probabilities) = (m.scorer, m.probabilities);
        let (name, version) = scorer.model();
        let deferred = judged.decision.deferred.contains(&m.model);
        let scores: Vec<String> = scorer
            .labels()
            .iter()
            .zip(probabilities.iter())
            .map(|(l, p)| format!("{l}={p:.3}"))
            .collect();
        let note = if deferred {
            " (unsure: a later model decides)"
        } else {
            ""
        };
        s.push_str(&format!(
            "  {} ({name} {version}): {}{note}\n",
            scorer.id,
            scores.join(" ")
        ));
        for c in judged
            .decision
            .crossings
            .iter()
            .filter(|c| c.model == m.model)
        {
            let which = if c.verdict == verdict::Verdict::Block {
                "block_at"
            } else {
                "review_at"
            };
            s.push_str(&format!(
                "    {} {:.3} >= {which} {:.3}: {}\n",
                c.label, c.score, c.threshold, c.verdict
            ));
        }
    }
    if judged.decision.human_review {
        s.push_str("  the rule sends every verdict to human review\n");
    }
    s.push_str(&format!("verdict: {}\n", judged.decision.verdict));
    s
}

/// Every record of the topic whose event id is the one asked for.
fn find(settings: &Settings, opts: &ExplainOptions) -> anyhow::Result<Vec<Found>> {
    let (consumer, partitions) = range::open(settings, &opts.topic, "explain")?;
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for p in partitions {
        let (low, high) = consumer.fetch_watermarks(&opts.topic, p, range::TIMEOUT)?;
        if high > low {
            ends.insert(p, high);
            assignment.add_partition_offset(&opts.topic, p, Offset::Offset(low))?;
        }
    }
    consumer.assign(&assignment)?;
    let decoder = crate::event::Decoder::new(&settings.input, &settings.limits);
    let late = format!(
        "the topic was not read to its end within --timeout ({:?})",
        opts.timeout
    );
    let deadline = (std::time::Instant::now() + opts.timeout, late.as_str());
    let mut found = Vec::new();
    range::read_until(&consumer, ends, Some(deadline), |m, parts| {
        if let Ok(event) = decoder.decode(&opts.topic, parts)
            && event.event_id == opts.event_id
        {
            found.push(Found {
                tp: Tp::new(&opts.topic, m.partition()),
                offset: m.offset(),
                timestamp_ms: m.timestamp().to_millis(),
                key: m.key().map(<[u8]>::to_vec),
                event,
            });
        }
        std::ops::ControlFlow::Continue(())
    })?;
    Ok(found)
}

/// One model's scores of the event.
struct Scored<'a> {
    model: ModelId,
    scorer: &'a Scorer,
    probabilities: Vec<f32>,
}

/// The event's text scored by the models `rule` runs, in order.
fn run_models<'m>(
    models: &'m mut [(Scorer, inference::Model)],
    rule: &crate::policy::Rule,
    text: &str,
) -> anyhow::Result<Vec<Scored<'m>>> {
    let mut scores: Vec<Scored> = Vec::new();
    for (i, (scorer, model)) in models.iter_mut().enumerate() {
        let i = ModelId(i);
        if rule.runs_after(i, |m| scores_of(&scores, m)) {
            let mut texts = [text.to_string()];
            let p = model.score(&mut texts)?.pop().unwrap_or_default();
            scores.push(Scored {
                model: i,
                scorer,
                probabilities: p,
            });
        }
    }
    Ok(scores)
}

/// The highest score for `label` among the models that scored the event.
fn label_score(scores: &[Scored], label: &str) -> Option<f32> {
    (scores.iter())
        .filter_map(|s| {
            let at = s.scorer.labels().iter().position(|l| l == label)?;
            s.probabilities.get(at).copied()
        })
        .reduce(f32::max)
}

/// Model `m`'s labels and probabilities among those scored so far.
fn scores_of<'s>(scores: &'s [Scored], m: ModelId) -> Option<(&'s [String], &'s [f32])> {
    scores
        .iter()
        .find(|s| s.model == m)
        .map(|s| (s.scorer.labels(), s.probabilities.as_slice()))
}
