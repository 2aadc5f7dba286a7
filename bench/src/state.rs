//! What entity state costs (`--state-rules`, `--state-restore`): the
//! configuration that turns two state rules on, what a run wrote to its
//! changelog, and the restore thread timed on a changelog of N entities.

use std::path::Path;
use std::time::{Duration, Instant};

use modstream::config::{Settings, StateSettings};
use modstream::policy::Verdict;
use modstream::tools::read::TopicReader;
use modstream::tools::report::{RestoreRow, StateCost};
use modstream::tp::Tp;

use super::BenchOptions;
use super::cell::Cell;
use super::print::Print;

/// Stands for the cell's changelog topic in a configuration's extra TOML.
pub(super) const STATE_TOPIC: &str = "${CELL_STATE_TOPIC}";

/// What a run wrote to its cell's state changelog.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Changelog {
    records: u64,
    /// Keys, values and headers.
    bytes: u64,
}

impl Changelog {
    pub(super) fn cost(&self, verdicts: usize) -> StateCost {
        StateCost {
            changelog_records: self.records,
            changelog_bytes_per_verdict: self.bytes as f64 / verdicts.max(1) as f64,
        }
    }
}

/// The cell's changelog read to its end (nothing when it is empty).
pub(super) async fn changelog_of(cell: &Cell) -> anyhow::Result<Changelog> {
    let (bootstrap, topic) = (cell.bootstrap.clone(), cell.state.clone());
    tokio::task::spawn_blocking(move || {
        let records = TopicReader::from_beginning(&bootstrap, &topic, None)?
            .read_to_end(Duration::from_secs(300))?;
        let bytes = (records.iter())
            .map(|r| {
                let headers: usize = r.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
                r.key.as_ref().map_or(0, Vec::len) + r.payload.len() + headers
            })
            .sum::<usize>();
        anyhow::Ok(Changelog {
            records: records.len() as u64,
            bytes: bytes as u64,
        })
    })
    .await?
}

/// The TOML that turns on state with two state rules (a velocity rule and
/// a history rule) beside the default rule (the model's score label at
/// `[policy]`'s default thresholds): `[policy] file` (written to a
/// temporary file) and `[state] changelog_topic` ([`STATE_TOPIC`], which
/// [`super::baseline::modstream`] replaces with the cell's).
pub(super) fn rules_config(model_dir: &Path) -> anyhow::Result<String> {
    let manifest = modstream::inference::manifest::Manifest::load(model_dir)?;
    let label = manifest.labels[manifest.score_index()].clone();
    let defaults = modstream::config::Policy::default();
    let policy = format!(
        "version = \"bench-state\"\n[[rules]]\nid = \"default\"\nmodels.default.{label:?} = {{ review_at = {}, block_at = {} }}\n\
         [[state_rules]]\nid = \"fast-poster\"\nif = \"user.posts_1m > 5\"\nraise = \"review\"\n\
         [[state_rules]]\nid = \"repeat-offender\"\nif = \"user.blocks_last10 >= 3\"\nraise = \"block\"\n",
        defaults.review_at, defaults.block_at
    );
    let path =
        std::env::temp_dir().join(format!("modstream-bench-state-{}.toml", std::process::id()));
    std::fs::write(&path, policy)?;
    Ok(format!(
        "[policy]\nfile = {:?}\n[state]\nchangelog_topic = \"{STATE_TOPIC}\"\n",
        path.display().to_string()
    ))
}

/// `--state-restore`: for each count, a changelog partition of that many
/// entities (each written by the state step itself, one post each) read
/// back by the restore thread.
pub(super) async fn restores(opts: &BenchOptions) -> anyhow::Result<Vec<RestoreRow>> {
    let mut rows = Vec::new();
    for &entities in &opts.state_restore {
        let cell = Cell::new(opts).await?;
        let bytes = write_changelog(&cell, entities).await?;
        let row = time_restore(&cell, entities, bytes).await?;
        row.print();
        rows.push(row);
    }
    Ok(rows)
}

/// `entities` one-post entities' changes on the changelog's partition 0;
/// their bytes (keys, values, headers).
async fn write_changelog(cell: &Cell, entities: u64) -> anyhow::Result<u64> {
    let (bootstrap, topic, input) = (
        cell.bootstrap.clone(),
        cell.state.clone(),
        cell.input.clone(),
    );
    tokio::task::spawn_blocking(move || {
        use rdkafka::producer::{BaseProducer, Producer};
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "20")
            .set("batch.size", "1000000")
            .set("compression.type", "lz4")
            .create()?;
        let settings = StateSettings {
            changelog_topic: Some(topic.clone()),
            max_bytes: usize::MAX,
            ..StateSettings::default()
        };
        let mut keeper = modstream::state::Keeper::new(&settings)
            .ok_or_else(|| anyhow::anyhow!("state is off"))?;
        let rules = modstream::policy::Ruleset::new("bench".into(), Vec::new());
        let tp = Tp::new(&input, 0);
        let now = chrono::Utc::now().timestamp_millis();
        let mut bytes = 0u64;
        for i in 0..entities {
            // One entity at a time: the store is dropped as it goes.
            let mut store = modstream::state::Store::default();
            let user = format!("u-{i}");
            let event = one_post(&user);
            let at = modstream::state::Judging {
                tp: &tp,
                offset: i as i64,
                event: &event,
                key: Some(user.as_bytes()),
                timestamp_ms: Some(now),
                rules: &rules,
                verdict: Verdict::Allow,
                score: &|_| None,
            };
            for record in keeper.step(&mut store, at).changelog {
                bytes += send(&producer, &topic, record)?;
            }
            keeper.dropped(&store);
        }
        producer.flush(Duration::from_secs(300))?;
        anyhow::Ok(bytes)
    })
    .await?
}

/// A user's post, as the state step reads it.
fn one_post(user: &str) -> modstream::event::Event {
    modstream::event::Event {
        event_id: format!("e-{user}"),
        text: String::new(),
        user_id: Some(user.to_string()),
        lang: None,
        created_at_ms: None,
        priority: modstream::event::Priority::Normal,
        metadata: None,
        tenant: None,
        warnings: Vec::new(),
    }
}

/// One changelog record to the topic's partition 0 (waiting while the
/// producer's queue is full); its bytes (key, value, headers).
fn send(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    record: modstream::producer::record::OutRecord,
) -> anyhow::Result<u64> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::BaseRecord;
    let headers = (record.headers.iter()).fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k.as_ref(),
            value: v.as_deref(),
        })
    });
    let header_bytes: usize = (record.headers.iter())
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    let (key, payload) = (
        record.key.unwrap_or_default(),
        record.payload.unwrap_or_default(),
    );
    let bytes = (key.len() + payload.len() + header_bytes) as u64;
    let mut base = BaseRecord::to(topic)
        .partition(0)
        .key(key.as_slice())
        .payload(payload.as_slice())
        .headers(headers);
    while let Err((e, back)) = producer.send(base) {
        let full = rdkafka::error::KafkaError::MessageProduction(
            rdkafka::types::RDKafkaErrorCode::QueueFull,
        );
        anyhow::ensure!(e == full, "{e}");
        base = back;
        producer.poll(Duration::from_millis(10));
    }
    Ok(bytes)
}

/// The restore thread reads the changelog's partition 0 for the input's
/// partition 0 (every change kept: the first offset read is past them all).
async fn time_restore(
    cell: &Cell,
    entities: u64,
    changelog_bytes: u64,
) -> anyhow::Result<RestoreRow> {
    let settings = Settings::from_toml(&format!(
        "[kafka]\nbootstrap_servers = {:?}\n[input]\ntopics = [{:?}]\n[output]\ntopic = {:?}\n",
        cell.bootstrap, cell.input, cell.verdicts
    ))?;
    let (jobs, jobs_rx) = std::sync::mpsc::channel();
    let (restored_tx, mut restored) = tokio::sync::mpsc::channel(1);
    let health = std::sync::Arc::new(modstream::telemetry::Health::default());
    modstream::state::restore::spawn(&settings, &cell.state, jobs_rx, restored_tx, health)?;
    let started = Instant::now();
    jobs.send(modstream::state::restore::Job {
        tp: Tp::new(&cell.input, 0),
        generation: Default::default(),
        before: i64::MAX,
        cancel: Default::default(),
    })?;
    let done = tokio::time::timeout(Duration::from_secs(600), restored.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the restore thread stopped"))?;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        done.store.len() as u64 == entities,
        "restored {} entities of {entities}",
        done.store.len()
    );
    Ok(RestoreRow {
        entities,
        records: done.records,
        changelog_bytes,
        seconds,
        entities_per_s: entities as f64 / seconds,
        state_bytes: done.store.bytes() as u64,
    })
}

impl Print for RestoreRow {
    fn print(&self) {
        eprintln!(
            "state restore: {} entities ({} records, {:.1} MiB) in {:.2} s: {:.0} entities/s, {:.1} MiB of state",
            self.entities,
            self.records,
            self.changelog_bytes as f64 / 1048576.0,
            self.seconds,
            self.entities_per_s,
            self.state_bytes as f64 / 1048576.0
        );
    }
}
