//! `modstream topics create`: the topics a configuration names (input,
//! verdicts, dead letters, analytics, shadow, the policy's routes, the
//! state changelog, the list topic), created on the cluster with the
//! settings each needs: compaction for the changelog, the list topic and
//! the decisions topic, and a changelog partition for each input
//! partition. A topic that exists is left as it is and said so (with a
//! changelog narrower than its input, the command to widen it). With
//! `--dry-run` it prints the `kafka-topics.sh` lines instead and touches
//! nothing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

use crate::client::{self, ProducerRole};
use crate::config::Settings;
use crate::inference::manifest::Manifest;
use crate::pipeline::reload::PolicySource;
use crate::policy::ModelLabels;

#[derive(Debug, Clone, clap::Args)]
pub struct TopicsOptions {
    /// Configuration file (default: config/modstream.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Partitions of each topic created (the changelog: at least as many as
    /// its widest input topic).
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Replicas of each topic created (default: the brokers'
    /// default.replication.factor).
    #[arg(long)]
    pub replication: Option<i32>,
    /// Print the kafka-topics.sh lines; create nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Compaction, with each change kept an hour before the cleaner may
/// replace it (a restore needs the last change before the committed
/// offset; docs/state-rules.md).
const CHANGELOG: [(&str, &str); 2] = [
    ("cleanup.policy", "compact"),
    ("min.compaction.lag.ms", "3600000"),
];
const COMPACTED: [(&str, &str); 1] = [("cleanup.policy", "compact")];

/// One topic the configuration names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The key that names it (`output.topic`, `rules.kids.routes`).
    pub key: String,
    pub topic: String,
    pub role: Role,
}

/// What a topic is for, which says its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Input,
    Plain,
    /// Compacted (the list topic, the decisions topic).
    Compacted,
    /// Compacted, and a partition for each input partition.
    Changelog,
}

impl Role {
    fn configs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Role::Input | Role::Plain => &[],
            Role::Compacted => &COMPACTED,
            Role::Changelog => &CHANGELOG,
        }
    }
}

/// Every topic the settings (and their policy file's routes) name, each
/// once, inputs first.
pub fn wanted(settings: &Settings) -> anyhow::Result<Vec<Wanted>> {
    let want = |key: &str, topic: &str, role| Wanted {
        key: key.to_string(),
        topic: topic.to_string(),
        role,
    };
    let output = &settings.output;
    let mut all: Vec<Wanted> = (settings.input.topics.iter())
        .map(|t| want("input.topics", t, Role::Input))
        .collect();
    all.push(want("output.topic", &output.topic, Role::Plain));
    all.push(want("output.dlq_topic", &output.dlq_topic, Role::Plain));
    for (key, topic) in output.analytics_topics() {
        let role = if key == "output.decisions_topic" {
            Role::Compacted
        } else {
            Role::Plain
        };
        all.push(want(key, topic, role));
    }
    if settings.inference.shadow.model_dir.is_some() {
        all.push(want(
            "output.shadow_topic",
            &output.shadow_topic,
            Role::Plain,
        ));
    }
    for (id, topic) in routes(settings)? {
        all.push(want(&format!("rules.{id}.routes"), &topic, Role::Plain));
    }
    if let Some(topic) = &settings.state.changelog_topic {
        all.push(want("state.changelog_topic", topic, Role::Changelog));
    }
    if let Some(topic) = &settings.matching.list_topic {
        all.push(want("matching.list_topic", topic, Role::Compacted));
    }
    let mut seen = std::collections::HashSet::new();
    all.retain(|w| seen.insert(w.topic.clone()));
    Ok(all)
}

/// The policy file's route topics (rule id, topic); none without a file.
/// The policy is checked against the models' manifests, as a start does.
fn routes(settings: &Settings) -> anyhow::Result<Vec<(String, String)>> {
    if settings.policy.file.is_none() {
        return Ok(Vec::new());
    }
    let mut labels = Vec::new();
    for spec in settings.models() {
        let manifest = Manifest::load(&spec.inference.model_dir)?;
        labels.push(ModelLabels::of(&spec.name, &manifest));
    }
    let rules = PolicySource::of(settings).rules(&labels)?;
    Ok((rules.rules().iter())
        .flat_map(|r| {
            r.routes
                .iter()
                .map(|route| (r.id.clone(), route.topic.clone()))
        })
        .collect())
}

/// The partitions a topic gets: `partitions`, and for the changelog at
/// least as many as the widest input topic (`inputs`: existing ones).
fn partitions_of(w: &Wanted, partitions: i32, inputs: &HashMap<String, i32>) -> i32 {
    match w.role {
        Role::Changelog => inputs.values().copied().fold(partitions, i32::max),
        _ => partitions,
    }
}

/// The kafka-topics.sh lines that create every wanted topic.
pub fn dry_run(settings: &Settings, opts: &TopicsOptions) -> anyhow::Result<String> {
    let mut out = String::new();
    for w in wanted(settings)? {
        let mut line = format!(
            "kafka-topics.sh --bootstrap-server {} --create --if-not-exists --topic {} --partitions {}",
            settings.kafka.bootstrap_servers,
            w.topic,
            partitions_of(&w, opts.partitions, &HashMap::new())
        );
        if let Some(r) = opts.replication {
            line.push_str(&format!(" --replication-factor {r}"));
        }
        for (k, v) in w.role.configs() {
            line.push_str(&format!(" --config {k}={v}"));
        }
        out.push_str(&format!("# {}\n{line}\n", w.key));
    }
    Ok(out)
}

/// Create what is missing; the text to print. An error when any topic
/// could not be created (each said in the text first).
pub async fn create(settings: &Settings, opts: &TopicsOptions) -> anyhow::Result<String> {
    let wanted = wanted(settings)?;
    let admin: AdminClient<DefaultClientContext> =
        client::producer(&settings.kafka, ProducerRole::Shadow).create()?;
    let timeout = settings.kafka.startup_timeout;
    let existing = existing(&admin, timeout)?;
    let inputs: HashMap<String, i32> = (wanted.iter())
        .filter(|w| w.role == Role::Input)
        .filter_map(|w| Some((w.topic.clone(), *existing.get(&w.topic)?)))
        .collect();
    let mut out = String::new();
    let mut to_create = Vec::new();
    for w in &wanted {
        let wide = partitions_of(w, opts.partitions, &inputs);
        match existing.get(&w.topic) {
            Some(&have) => {
                out.push_str(&format!(
                    "exists   {} ({}): {have} partitions\n",
                    w.topic, w.key
                ));
                if w.role == Role::Changelog && have < wide {
                    out.push_str(&format!(
                        "  it needs {wide} (one per input partition): kafka-topics.sh --bootstrap-server {} --alter --topic {} --partitions {wide}\n",
                        settings.kafka.bootstrap_servers, w.topic
                    ));
                }
            }
            None => to_create.push((w, wide)),
        }
    }
    let replication = opts.replication.unwrap_or(-1);
    let new: Vec<NewTopic> = (to_create.iter())
        .map(|(w, wide)| {
            (w.role.configs().iter()).fold(
                NewTopic::new(&w.topic, *wide, TopicReplication::Fixed(replication)),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let mut failed = 0;
    if !new.is_empty() {
        let options = AdminOptions::new().operation_timeout(Some(timeout));
        let results = admin.create_topics(&new, &options).await?;
        for ((w, wide), result) in to_create.iter().zip(results) {
            let settings: Vec<String> = (w.role.configs().iter())
                .map(|(k, v)| format!(", {k}={v}"))
                .collect();
            match result {
                Ok(_) => out.push_str(&format!(
                    "created  {} ({}): {wide} partitions{}\n",
                    w.topic,
                    w.key,
                    settings.concat()
                )),
                Err((_, code)) => {
                    failed += 1;
                    out.push_str(&format!("failed   {} ({}): {code}\n", w.topic, w.key));
                }
            }
        }
    }
    anyhow::ensure!(failed == 0, "{out}{failed} topic(s) could not be created");
    Ok(out)
}

/// The cluster's topics and their partition counts (a blocking request,
/// on a thread the runtime may block).
fn existing(
    admin: &AdminClient<DefaultClientContext>,
    timeout: Duration,
) -> anyhow::Result<HashMap<String, i32>> {
    let metadata = tokio::task::block_in_place(|| admin.inner().fetch_metadata(None, timeout))?;
    Ok((metadata.topics().iter())
        .filter(|t| t.error().is_none())
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect())
}
