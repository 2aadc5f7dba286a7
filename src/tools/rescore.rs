//! `modstream rescore`: judge a range of an input topic again (a new model,
//! a new policy) and write the verdicts to another topic, without touching
//! the live consumer group.
//!
//! It reads with its own consumer, assigned (never subscribed) to the
//! partitions, under a group id of its own that never commits: the live
//! group's offsets are untouched. The range per partition runs from the
//! first offset at or after `--from` (`offsets_for_times`, or explicit
//! `--from-offsets`) to the first offset at or after `--to` (exclusive), or
//! to the end as of the start. Every worker scores at full speed (batches of
//! `batching.max_batch_size`); verdicts have the live schema (`source` names
//! the original's topic, partition and offset). Invalid events are counted,
//! not written. Safe to stop and rerun: a rerun writes the range's verdicts
//! again (downstream sees duplicates, as after any at-least-once retry).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::inference::{InferenceJob, InferencePool, JobId};
use crate::producer::{ProducerError, Sink};
use crate::tools::range;
use crate::tp::Tp;
use crate::verdict::{Scorer, Verdict};

#[derive(Debug, Clone, clap::Args)]
pub struct RescoreOptions {
    /// The input topic to read.
    #[arg(long)]
    pub topic: String,
    /// Start: records written at or after this time (RFC 3339, or ms since
    /// the epoch).
    #[arg(long, conflicts_with = "from_offsets")]
    pub from: Option<String>,
    /// Start: explicit offsets, `PARTITION:OFFSET,...` (partitions not named
    /// are not read).
    #[arg(long)]
    pub from_offsets: Option<String>,
    /// End (exclusive): records written before this time; default: the end
    /// of each partition when the command starts.
    #[arg(long)]
    pub to: Option<String>,
    /// Where the verdicts go.
    #[arg(long)]
    pub output_topic: String,
    /// Score with this model instead of the configured one.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// An earlier verdict topic (of the same range) to compare against: the
    /// report counts the events whose verdict differs.
    #[arg(long)]
    pub compare_topic: Option<String>,
    /// Configuration file (brokers, security, policy, workers); the
    /// environment overrides it as for `run`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct RescoreReport {
    pub topic: String,
    pub output_topic: String,
    pub model: String,
    /// Per partition: [first offset, end offset) read.
    pub ranges: Ranges,
    pub events: u64,
    pub verdicts: BTreeMap<String, u64>,
    /// Records that are not valid events (counted, not written).
    pub invalid: u64,
    /// Events the model failed on (counted, not written).
    pub failed: u64,
    pub seconds: f64,
    /// With `--compare-topic`: events found there, and those whose verdict differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compared: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub differing: Option<u64>,
}

/// A time given as RFC 3339 or as ms since the epoch.
pub fn parse_time(text: &str) -> anyhow::Result<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| anyhow::anyhow!("{text:?} is neither RFC 3339 nor ms since the epoch: {e}"))
}

fn parse_offsets(text: &str) -> anyhow::Result<Vec<(i32, i64)>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|pair| {
            let (p, o) = pair.trim().split_once(':').ok_or_else(|| {
                anyhow::anyhow!("--from-offsets: {pair:?} is not PARTITION:OFFSET")
            })?;
            Ok((p.parse()?, o.parse()?))
        })
        .collect()
}

/// Per partition: [first offset, end offset).
type Ranges = BTreeMap<i32, (i64, i64)>;

/// One valid event of the range, waiting for its score.
struct Item {
    tp: Tp,
    offset: i64,
    key: Option<Vec<u8>>,
    timestamp_ms: Option<i64>,
    event: crate::event::Event,
}

pub async fn run(opts: RescoreOptions) -> anyhow::Result<RescoreReport> {
    let mut settings = Settings::load(opts.config.as_deref())?;
    // One model judged by [policy]: a policy file's rules (and the models
    // they name) would be ignored, so say so instead.
    anyhow::ensure!(
        settings.policy.file.is_none() && settings.inference.models.is_empty(),
        "rescore judges with one model by [policy]'s thresholds; this configuration sets policy.file or [[inference.models]], which rescore does not apply yet"
    );
    if let Some(dir) = &opts.model {
        settings.inference.model_dir = dir.clone();
    }
    let started = Instant::now();
    let (ranges, consumer) = open_range(&settings, &opts)?;
    let batch = settings.batching.max_batch_size;
    let (results_tx, results) = tokio::sync::mpsc::channel(settings.inference.worker_count() * 4);
    let pool = InferencePool::start(
        &settings.inference,
        crate::inference::RunLimit {
            posts: batch,
            tokens: settings.batching.max_batch_tokens,
        },
        results_tx,
    )?;
    let scorer = Scorer::new(&pool.manifest, &settings.policy)?;
    // The live verdict producer: the same client settings, retries and backoff.
    let sink = Sink::new(
        &settings.kafka,
        settings.limits.max_payload_bytes,
        settings.output.analytics_timeout,
        Default::default(),
    )?;
    let mut report = RescoreReport {
        topic: opts.topic.clone(),
        output_topic: opts.output_topic.clone(),
        model: format!("{} {}", pool.manifest.name, pool.manifest.version),
        ranges: ranges.clone(),
        ..Default::default()
    };
    // The reader: a blocking thread polls the range and hands records over.
    let (records_tx, records) = tokio::sync::mpsc::channel::<Result<Item, ()>>(batch * 8);
    let reader = {
        let decoder = crate::event::Decoder::new(&settings.input, &settings.limits);
        let (topic, ranges) = (opts.topic.clone(), ranges.clone());
        tokio::task::spawn_blocking(move || {
            read_range(&consumer, &ranges, &topic, &decoder, records_tx)
        })
    };
    let mut scoring = Scoring {
        jobs: pool.jobs(),
        capacity: settings.inference.worker_count() * 2,
        batch,
        scorer,
        sink,
        output_topic: opts.output_topic.clone(),
        keep_labels: opts.compare_topic.is_some(),
        labels: HashMap::new(),
        deliveries: Vec::new(),
        cancel: CancellationToken::new(),
        total: ranges.values().map(|(a, b)| (b - a).max(0)).sum(),
        started,
    };
    scoring.run(records, results, &mut report).await?;
    reader.await??;
    scoring
        .delivered_within(settings.kafka.shutdown_timeout)
        .await?;
    drop(scoring.jobs);
    pool.shutdown();
    report.seconds = started.elapsed().as_secs_f64();
    if let Some(compare) = &opts.compare_topic {
        let (compared, differing) =
            compare_with(&settings.kafka.bootstrap_servers, compare, &scoring.labels)?;
        report.compared = Some(compared);
        report.differing = Some(differing);
    }
    Ok(report)
}

/// Poll the range and hand each record over (valid events as items,
/// invalid ones as `Err`), until every partition reached its end.
fn read_range(
    consumer: &BaseConsumer,
    ranges: &Ranges,
    topic: &str,
    decoder: &crate::event::Decoder,
    records_tx: tokio::sync::mpsc::Sender<Result<Item, ()>>,
) -> anyhow::Result<()> {
    let ends = ranges
        .iter()
        .filter(|(_, (a, b))| b > a)
        .map(|(p, (_, b))| (*p, *b))
        .collect();
    range::read_until(consumer, ends, None, |m, parts| {
        let item = decoder
            .decode(topic, parts)
            .map(|event| Item {
                tp: Tp::new(topic, m.partition()),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                timestamp_ms: m.timestamp().to_millis(),
                event,
            })
            .map_err(|_| ());
        match records_tx.blocking_send(item) {
            Ok(()) => std::ops::ControlFlow::Continue(()),
            Err(_) => std::ops::ControlFlow::Break(()),
        }
    })
}

type Delivery =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ProducerError>> + Send>>;

/// The scoring loop: full batches to the workers, verdicts to the sink.
struct Scoring {
    jobs: async_channel::Sender<InferenceJob>,
    capacity: usize,
    batch: usize,
    scorer: Scorer,
    sink: Sink,
    output_topic: String,
    /// With `--compare-topic`: each event's new verdict.
    keep_labels: bool,
    labels: HashMap<String, Verdict>,
    deliveries: Vec<Delivery>,
    /// Ends the deliveries' retries (see [`run`]).
    cancel: CancellationToken,
    total: i64,
    started: Instant,
}

impl Scoring {
    /// Retries are bounded: what is not acknowledged within `timeout`
    /// (kafka.shutdown_timeout) after the last verdict fails the command.
    async fn delivered_within(&mut self, timeout: std::time::Duration) -> anyhow::Result<()> {
        let all = futures::future::try_join_all(std::mem::take(&mut self.deliveries));
        match tokio::time::timeout(timeout, all).await {
            Ok(delivered) => {
                delivered.map_err(|e| anyhow::anyhow!("a verdict was not delivered: {e}"))?;
                Ok(())
            }
            Err(_) => {
                self.cancel.cancel();
                anyhow::bail!(
                    "verdicts not acknowledged within kafka.shutdown_timeout ({} s) after the range was scored",
                    timeout.as_secs()
                );
            }
        }
    }

    async fn run(
        &mut self,
        mut records: tokio::sync::mpsc::Receiver<Result<Item, ()>>,
        mut results: tokio::sync::mpsc::Receiver<crate::inference::InferenceResult>,
        report: &mut RescoreReport,
    ) -> anyhow::Result<()> {
        let mut in_flight: HashMap<JobId, Vec<Item>> = HashMap::new();
        let mut next_id = JobId::default();
        let mut pending: Vec<Item> = Vec::new();
        let mut input_open = true;
        let mut shown = Instant::now();
        while input_open || !pending.is_empty() || !in_flight.is_empty() {
            // Dispatch full batches (or the rest once the input is done).
            while in_flight.len() < self.capacity
                && (pending.len() >= self.batch || (!input_open && !pending.is_empty()))
            {
                let take = pending.len().min(self.batch);
                let items: Vec<Item> = pending.drain(..take).collect();
                let texts = items.iter().map(|i| i.event.text.clone()).collect();
                let id = next_id.take();
                self.jobs.send(InferenceJob { id, texts }).await?;
                in_flight.insert(id, items);
            }
            tokio::select! {
                Some(result) = results.recv(), if !in_flight.is_empty() => {
                    let items = in_flight.remove(&result.id).unwrap_or_default();
                    for (item, score) in items.into_iter().zip(result.scores) {
                        match score {
                            Ok(probabilities) => self.verdict(item, &probabilities, report),
                            Err(_) => report.failed += 1,
                        }
                    }
                }
                record = records.recv(), if input_open && pending.len() < self.batch * 4 => match record {
                    Some(Ok(item)) => { report.events += 1; pending.push(item); }
                    Some(Err(())) => { report.events += 1; report.invalid += 1; }
                    None => input_open = false,
                },
            }
            if shown.elapsed() >= Duration::from_secs(1) {
                shown = Instant::now();
                eprintln!(
                    "rescore: {}/{} records read, {} verdicts, {:.0}/s",
                    report.events,
                    self.total,
                    report.verdicts.values().sum::<u64>(),
                    report.events as f64 / self.started.elapsed().as_secs_f64()
                );
            }
        }
        Ok(())
    }

    /// The verdict of a scored event, enqueued at once.
    fn verdict(&mut self, item: Item, probabilities: &[f32], report: &mut RescoreReport) {
        let answer = crate::verdict::Answer {
            source: &item.tp,
            offset: item.offset,
            key: item.key.as_deref(),
            event: &item.event,
            timestamp_ms: item.timestamp_ms,
        };
        let (out, label) = self
            .scorer
            .verdict_record(&self.output_topic, answer, probabilities);
        *report.verdicts.entry(label.to_string()).or_default() += 1;
        if self.keep_labels {
            self.labels.insert(item.event.event_id.clone(), label);
        }
        let source = crate::tp::Source {
            tp: item.tp,
            offset: item.offset,
        };
        self.deliveries.push(Box::pin(self.sink.deliver(
            out,
            source,
            self.cancel.clone(),
        )));
    }
}

/// Against an earlier verdict topic: (events found there, those whose
/// verdict differs).
fn compare_with(
    bootstrap: &str,
    topic: &str,
    labels: &HashMap<String, Verdict>,
) -> anyhow::Result<(u64, u64)> {
    let earlier = crate::tools::read::TopicReader::from_beginning(bootstrap, topic, None)?
        .read_to_end(Duration::from_secs(120))?;
    let (mut compared, mut differing) = (0, 0);
    for r in &earlier {
        let Some(v) = r.json() else { continue };
        let Some(now) = v["event_id"].as_str().and_then(|id| labels.get(id)) else {
            continue;
        };
        compared += 1;
        if v["verdict"].as_str() != Some(now.as_str()) {
            differing += 1;
        }
    }
    Ok((compared, differing))
}

/// The consumer assigned to the range's start, and [start, end) per partition.
fn open_range(
    settings: &Settings,
    opts: &RescoreOptions,
) -> anyhow::Result<(Ranges, BaseConsumer)> {
    // Its own group id, never committed: the live group is not touched.
    let (consumer, partitions) = range::open(settings, &opts.topic, "rescore")?;
    let timeout = range::TIMEOUT;
    let high: HashMap<i32, i64> = partitions
        .iter()
        .map(|p| Ok((*p, consumer.fetch_watermarks(&opts.topic, *p, timeout)?.1)))
        .collect::<anyhow::Result<_>>()?;
    // Offsets for a time; a partition with nothing at or after it: its end.
    let at_time = |ms: i64| -> anyhow::Result<HashMap<i32, i64>> {
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition_offset(&opts.topic, *p, Offset::Offset(ms))?;
        }
        let found = consumer.offsets_for_times(tpl, timeout)?;
        Ok(partitions
            .iter()
            .map(|p| {
                let offset = match found.find_partition(&opts.topic, *p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => high[p],
                };
                (*p, offset)
            })
            .collect())
    };
    let starts: HashMap<i32, i64> = match (&opts.from, &opts.from_offsets) {
        (Some(from), None) => at_time(parse_time(from)?)?,
        (None, Some(list)) => parse_offsets(list)?.into_iter().collect(),
        _ => anyhow::bail!("give --from TIME or --from-offsets PARTITION:OFFSET,..."),
    };
    let ends = match &opts.to {
        Some(to) => at_time(parse_time(to)?)?,
        None => high.clone(),
    };
    let mut ranges = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    for (p, start) in &starts {
        anyhow::ensure!(
            high.contains_key(p),
            "partition {p} of {} does not exist",
            opts.topic
        );
        let end = ends[p].min(high[p]);
        ranges.insert(*p, (*start, end));
        if end > *start {
            assignment.add_partition_offset(&opts.topic, *p, Offset::Offset(*start))?;
        }
    }
    consumer.assign(&assignment)?;
    Ok((ranges, consumer))
}

impl RescoreReport {
    pub fn print(&self) {
        println!(
            "rescored {} with {} into {}",
            self.topic, self.model, self.output_topic
        );
        for (p, (a, b)) in &self.ranges {
            println!("  partition {p}: offsets {a}..{b}");
        }
        println!(
            "events {}, verdicts {:?}, invalid {}, model failures {}, {:.1}s",
            self.events, self.verdicts, self.invalid, self.failed, self.seconds
        );
        if let (Some(c), Some(d)) = (self.compared, self.differing) {
            println!("compared with the earlier verdicts of {c} events: {d} differ");
        }
    }
}
