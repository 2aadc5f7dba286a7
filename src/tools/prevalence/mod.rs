//! `modstream prevalence`: how much of the stream violates each label,
//! with 95 % intervals, and how well the policy's thresholds find it;
//! from the risk-weighted samples (`output.samples_topic`) and the labels
//! people gave them (the labels topic; see
//! [`crate::sampling::records`]).
//!
//! Both topics are read from their first offset to their end (as of the
//! start) by a consumer of its own (assigned, never committing), with the
//! configuration's Kafka settings. `--widths DIR` reads no topic: it
//! simulates a stream ([`crate::sampling::simulate`]) and writes how wide
//! the intervals are against the number of labels.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::config::Settings;
use crate::sampling::records::{LabelEntry, LabelRecord, SamplesRecord};
use crate::tools::range;

#[cfg(feature = "charts")]
pub mod chart;
pub mod report;
pub mod widths;

pub use report::{GroupBy, Inputs, Report, Scope};

#[derive(Debug, Clone, clap::Args)]
pub struct PrevalenceOptions {
    /// The samples topic (`output.samples_topic`).
    #[arg(long, default_value = "moderation.samples")]
    pub samples: String,
    /// The labels topic reviewers' tools write.
    #[arg(long, default_value = "moderation.labels")]
    pub labels: String,
    /// Samples taken from this time on (RFC 3339, by `sampled_at`).
    #[arg(long)]
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    /// Samples taken before this time (RFC 3339).
    #[arg(long)]
    pub to: Option<chrono::DateTime<chrono::Utc>>,
    /// Also per tenant or per policy rule.
    #[arg(long, value_enum)]
    pub by: Option<GroupBy>,
    /// Labels that mean "violates nothing" (counted, not estimated).
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub negative: Vec<String>,
    /// Draw precision and recall against the threshold (SVG).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Configuration file (its Kafka settings: brokers, security).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// How long to read at most before giving up.
    #[arg(long, default_value = "60s", value_parser = humantime_serde::re::humantime::parse_duration)]
    pub timeout: Duration,
    /// Read no topic: simulate, and write the intervals' widths against
    /// the number of labels (widths.json, widths.svg) to this directory.
    #[arg(long)]
    pub widths: Option<PathBuf>,
}

/// The text to print.
pub fn run(opts: &PrevalenceOptions) -> anyhow::Result<String> {
    if !cfg!(feature = "charts") && (opts.chart.is_some() || opts.widths.is_some()) {
        anyhow::bail!(
            "this modstream was built without charts (--chart, --widths): build it with `cargo build --release --features charts`, or build the workspace (`cargo build --release`)"
        );
    }
    #[cfg(feature = "charts")]
    if let Some(dir) = &opts.widths {
        let rows = widths::simulate(&widths::Plan::default());
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("widths.json"),
            serde_json::to_string_pretty(&rows)?,
        )?;
        chart::widths(&rows, &dir.join("widths.svg"))?;
        return Ok(widths::render(&rows));
    }
    let settings = Settings::load(opts.config.as_deref())?;
    let mut inputs = Inputs::default();
    read(
        &settings,
        &opts.samples,
        opts.timeout,
        |_, payload| match payload.map(serde_json::from_slice::<SamplesRecord>) {
            Some(Ok(SamplesRecord::Sample(s))) => inputs.samples.push(s),
            Some(Ok(SamplesRecord::Dropped(d))) => inputs.drops.push(d),
            Some(Err(_)) => inputs.refused_samples += 1,
            None => {}
        },
    )?;
    read(&settings, &opts.labels, opts.timeout, |key, payload| {
        let key = key.and_then(|k| std::str::from_utf8(k).ok());
        match (payload.map(serde_json::from_slice::<LabelRecord>), key) {
            (Some(Ok(l)), _) => inputs.labels.push(LabelEntry::Label(l)),
            (Some(Err(_)), _) => inputs.refused_labels += 1,
            (None, Some(id)) => inputs.labels.push(LabelEntry::Retracted(id.to_string())),
            (None, None) => inputs.refused_labels += 1,
        }
    })?;
    let scope = Scope {
        from: opts.from,
        to: opts.to,
        by: opts.by,
        negative: opts.negative.clone(),
    };
    let report = report::build(inputs, &scope);
    let mut out = report.render();
    #[cfg(feature = "charts")]
    if let Some(path) = &opts.chart {
        chart::thresholds(&report, path)?;
        out.push_str(&format!("\nchart: {}\n", path.display()));
    }
    Ok(out)
}

/// Every record's key and value (None: a null value) of `topic`, in each
/// partition's order, first offset to the end as of now.
fn read(
    settings: &Settings,
    topic: &str,
    timeout: Duration,
    mut each: impl FnMut(Option<&[u8]>, Option<&[u8]>),
) -> anyhow::Result<()> {
    let (consumer, partitions) = range::open(settings, topic, "prevalence")?;
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for p in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, range::TIMEOUT)?;
        if high > low {
            ends.insert(p, high);
            assignment.add_partition_offset(topic, p, Offset::Offset(low))?;
        }
    }
    consumer.assign(&assignment)?;
    let late = format!("{topic} was not read to its end within --timeout ({timeout:?})");
    let deadline = (std::time::Instant::now() + timeout, late.as_str());
    range::read_until(&consumer, ends, Some(deadline), |_, parts| {
        each(parts.key, parts.payload);
        std::ops::ControlFlow::Continue(())
    })
}

#[cfg(test)]
mod tests;
