//! What a start checks and reads once the cluster answers and before its
//! consumer joins the group: every output topic exists and takes this
//! service's writes, and the list topic's items are in force.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::PipelineError;
use crate::config::Settings;
use crate::consumer::{ConsumerChannels, ConsumerThread};
use crate::matching::Matcher;
use crate::policy::Ruleset;
use crate::producer::{ProducerError, Sink};
use crate::shutdown::Shutdown;
use crate::telemetry::{Health, MissingTopic};

/// A start's clients, its consumer in the group.
pub(super) struct Joined {
    pub(super) sink: Sink,
    pub(super) consumer: ConsumerThread,
    /// Tells the consumer thread the pipeline is done (it commits, closes).
    pub(super) consumer_done: CancellationToken,
    pub(super) channels: ConsumerChannels,
    pub(super) lists: Lists,
}

/// The verdict producer (and with exactly-once its transactions), the
/// consumer connected; once the cluster answers, the output topics are
/// checked and the list topic's items put in force, then the consumer
/// joins its group.
pub(super) async fn join_group(
    settings: &Settings,
    rules: &Ruleset,
    matcher: Option<&mut Matcher>,
    health: &Arc<Health>,
    shutdown: &Shutdown,
) -> Result<Joined, PipelineError> {
    let sink = Sink::new(
        &settings.kafka,
        settings.limits.max_payload_bytes,
        settings.output.analytics_timeout,
        health.clone(),
    )?;
    let exactly_once = super::start_transactions(settings, &sink, health, shutdown).await?;
    let consumer_done = CancellationToken::new();
    let connected = crate::consumer::connect(
        settings,
        health.clone(),
        shutdown.stop.clone(),
        consumer_done.clone(),
        exactly_once,
    )
    .await?;
    check_output_topics(settings, rules, &sink).await?;
    check_input_topics(settings, &sink, health).await?;
    let lists = lists_in_force(settings, matcher, health).await?;
    let (consumer, channels) = connected.join().await?;
    health
        .consumer_ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    super::check_producer(&sink, settings.kafka.startup_timeout, health).await;
    tracing::info!(topics = ?settings.input.topics, group = %settings.kafka.group_id, "consuming");
    Ok(Joined {
        sink,
        consumer,
        consumer_done,
        channels,
        lists,
    })
}

/// Input topics the cluster does not list: with `input.require_topics`
/// the start fails naming them; else /readyz names them (and
/// `modstream_input_topics_missing` counts them) until they exist
/// ([`watch_input_topics`]).
async fn check_input_topics(
    settings: &Settings,
    sink: &Sink,
    health: &Health,
) -> Result<(), PipelineError> {
    let missing = missing_input_topics(settings, sink).await;
    if missing.is_empty() {
        return Ok(());
    }
    if settings.input.require_topics {
        return Err(crate::config::ConfigError::Invalid {
            key: "input.topics".into(),
            reason: format!(
                "the cluster has no topic {} (input.require_topics is set)",
                listing(&missing)
            ),
        }
        .into());
    }
    tracing::warn!(
        topics = %listing(&missing),
        "input topics do not exist; /readyz says so until they do"
    );
    health.set_input_missing(missing);
    Ok(())
}

/// `a, b (did you mean c?)`.
fn listing(missing: &[MissingTopic]) -> String {
    let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
    names.join(", ")
}

/// The input topics the cluster does not list now (none if it does not
/// answer: that is the consumer's to report).
async fn missing_input_topics(settings: &Settings, sink: &Sink) -> Vec<MissingTopic> {
    let (sink, topics) = (sink.clone(), settings.input.topics.clone());
    let timeout = std::time::Duration::from_secs(10);
    tokio::task::spawn_blocking(move || sink.missing_topics(&topics, timeout))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// Every 10 s, the input topics the cluster does not list, for /readyz and
/// the gauge (a topic created later is consumed once librdkafka sees it).
pub(super) fn watch_input_topics(
    settings: &Settings,
    sink: &Sink,
    health: &Arc<Health>,
    stop: CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> tokio::task::JoinHandle<()> {
    let (settings, sink, health) = (settings.clone(), sink.clone(), health.clone());
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
            }
            let missing = missing_input_topics(&settings, &sink).await;
            if missing.is_empty() && !health.input_missing().is_empty() {
                tracing::info!("every input topic exists now");
            }
            health.set_input_missing(missing);
        }
    })
}

/// Every output topic the configuration and the policy name, by key:
/// each must exist and take this service's writes before it consumes
/// anything (see [`crate::producer::topics`]).
async fn check_output_topics(
    settings: &Settings,
    rules: &Ruleset,
    sink: &Sink,
) -> Result<(), PipelineError> {
    let output = &settings.output;
    let mut topics: Vec<(String, String)> = vec![
        ("output.topic".into(), output.topic.clone()),
        ("output.dlq_topic".into(), output.dlq_topic.clone()),
    ];
    topics.extend(
        (output.analytics_topics().into_iter())
            .map(|(key, topic)| (key.to_string(), topic.clone())),
    );
    if let Some(topic) = &settings.state.changelog_topic {
        topics.push(("state.changelog_topic".into(), topic.clone()));
    }
    if settings.inference.shadow.model_dir.is_some() {
        topics.push(("output.shadow_topic".into(), output.shadow_topic.clone()));
    }
    for rule in rules.rules() {
        for route in &rule.routes {
            topics.push((format!("rules.{}.routes", rule.id), route.topic.clone()));
        }
    }
    let mut seen = std::collections::HashSet::new();
    topics.retain(|(_, topic)| seen.insert(topic.clone()));
    let (sink, timeout) = (sink.clone(), settings.kafka.startup_timeout);
    let checked = sink.clone();
    tokio::task::spawn_blocking(move || checked.check_topics(&topics, timeout))
        .await
        .map_err(|_| PipelineError::Producer(ProducerError::Abandoned))??;
    check_changelog_partitions(settings, &sink).await
}

/// The state changelog has a partition for each input partition (a change
/// is written to the input partition's number).
async fn check_changelog_partitions(settings: &Settings, sink: &Sink) -> Result<(), PipelineError> {
    let Some(changelog) = settings.state.changelog_topic.clone() else {
        return Ok(());
    };
    let mut topics = settings.input.topics.clone();
    topics.push(changelog.clone());
    let (sink, timeout) = (sink.clone(), settings.kafka.startup_timeout);
    let counts = tokio::task::spawn_blocking(move || sink.partition_counts(&topics, timeout))
        .await
        .map_err(|_| PipelineError::Producer(ProducerError::Abandoned))?;
    // A cluster that does not answer here answered the topic check just before.
    let Ok(counts) = counts else {
        return Ok(());
    };
    let have = counts.get(&changelog).copied().unwrap_or(0);
    let widest = (settings.input.topics.iter())
        .filter_map(|t| counts.get(t).map(|n| (t, *n)))
        .max_by_key(|(_, n)| *n);
    match widest {
        Some((input, needed)) if needed > have => Err(crate::producer::topics::TopicCheckError {
            key: "state.changelog_topic".into(),
            topic: changelog,
            problem: format!(
                "it has {have} partitions and input topic {input} has {needed}: the changelog needs one per input partition (add partitions to it)"
            ),
        }
        .into()),
        _ => Ok(()),
    }
}

/// List changes on their way to the matcher (the list topic's items, the
/// list files read again), and the list topic's reader's stop.
pub(super) struct Lists {
    pub(super) tx: mpsc::Sender<crate::matching::Update>,
    pub(super) rx: mpsc::Receiver<crate::matching::Update>,
    pub(super) list_topic: tokio_util::sync::DropGuard,
}

/// With a list topic: its reader started, and its items read up to the end
/// offsets it had at start and applied to the matcher before the consumer
/// joins (at most `matching.list_topic_wait`; past it the start fails, or
/// with `list_topic_late = "start"` goes on and /readyz says so).
async fn lists_in_force(
    settings: &Settings,
    matcher: Option<&mut Matcher>,
    health: &Arc<Health>,
) -> Result<Lists, PipelineError> {
    let (tx, rx) = mpsc::channel(256);
    let stop = CancellationToken::new();
    // Dropped on an early return: the reader stops.
    let mut lists = Lists {
        tx,
        rx,
        list_topic: stop.clone().drop_guard(),
    };
    let (Some(topic), Some(matcher)) = (&settings.matching.list_topic, matcher) else {
        return Ok(lists);
    };
    crate::matching::topic::spawn(settings, topic, lists.tx.clone(), health.clone(), stop)?;
    let wait = settings.matching.list_topic_wait;
    let started = std::time::Instant::now();
    match crate::matching::topic::catch_up(matcher, &mut lists.rx, wait, health).await {
        Ok(items) => {
            let took_ms = started.elapsed().as_millis() as u64;
            tracing::info!(
                topic,
                items,
                took_ms,
                "list topic in force before joining the group"
            );
        }
        Err(why) if settings.matching.list_topic_late == crate::config::ListTopicLate::Start => {
            tracing::warn!(topic, why = %why, "starting before the list topic is read to its end (matching.list_topic_late = \"start\"); /readyz says so until it is");
        }
        Err(why) => {
            return Err(crate::matching::topic::TopicError::Late {
                topic: topic.clone(),
                waited_s: wait.as_secs(),
                why,
            }
            .into());
        }
    }
    Ok(lists)
}

/// With `state.changelog_topic`: the state's keeper and the restore
/// thread (it stops when the hub drops its end of the jobs).
pub(super) fn state(
    settings: &Settings,
    health: &Arc<Health>,
) -> Result<Option<(crate::state::Keeper, crate::hub::Restores)>, PipelineError> {
    let Some(keeper) = crate::state::Keeper::new(&settings.state) else {
        return Ok(None);
    };
    let (jobs, jobs_rx) = std::sync::mpsc::channel();
    let (restored_tx, restored) = tokio::sync::mpsc::channel(16);
    crate::state::restore::spawn(
        settings,
        keeper.topic(),
        jobs_rx,
        restored_tx,
        health.clone(),
    )?;
    Ok(Some((keeper, crate::hub::Restores { jobs, restored })))
}
