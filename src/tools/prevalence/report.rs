//! The samples joined with their labels, and the estimates per group and
//! label (see [`crate::sampling::estimate`]). Pure: the topics are read by
//! the caller.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use crate::sampling::estimate::{self, Estimate, Unit};
use crate::sampling::records::{DropRecord, LabelEntry, SampleRecord};

/// The thresholds of the "at other thresholds" table and chart.
pub const THRESHOLDS: [f64; 9] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];

/// What the report groups by, beside the whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    Tenant,
    Rule,
}

/// The records read, and what could not be read as one.
#[derive(Debug, Default)]
pub struct Inputs {
    pub samples: Vec<SampleRecord>,
    /// Drawn events the rate bound dropped.
    pub drops: Vec<DropRecord>,
    /// The labels topic's records in its order.
    pub labels: Vec<LabelEntry>,
    pub refused_samples: usize,
    pub refused_labels: usize,
}

/// The report's settings.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Samples taken from (inclusive) / before (exclusive), by `sampled_at`.
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub by: Option<GroupBy>,
    /// Labels that mean "violates nothing": counted, not estimated.
    pub negative: Vec<String>,
}

/// Prevalence, precision and recall of one label in one group.
#[derive(Debug, Clone)]
pub struct Row {
    /// `all`, or the group's tenant or rule (`-`: none).
    pub group: String,
    pub label: String,
    /// Labelled samples in the group.
    pub labelled: usize,
    pub prevalence: Estimate,
    /// At the thresholds that decided each sample (None: no sample of
    /// the label, or none flagged).
    pub precision: Option<Estimate>,
    pub recall: Option<Estimate>,
}

/// Precision and recall of one label at each of [`THRESHOLDS`], by the
/// highest score of the label in each sample's reason.
#[derive(Debug, Clone)]
pub struct Curve {
    pub label: String,
    pub points: Vec<(f64, Option<Estimate>, Option<Estimate>)>,
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Distinct samples (by event id) in the window.
    pub samples: usize,
    /// Samples of an event already sampled (judged again after a crash or
    /// a rebalance), counted once.
    pub repeated: usize,
    /// Of those, with another inclusion probability than the first.
    pub conflicting: usize,
    pub outside: usize,
    pub labelled: usize,
    pub unlabelled: usize,
    pub labels_without_sample: usize,
    pub refused_samples: usize,
    pub refused_labels: usize,
    /// Drawn events the rate bound dropped, each once, and never sampled
    /// in another run.
    pub dropped: usize,
    pub rows: Vec<Row>,
    pub curves: Vec<Curve>,
}

/// Joins samples and labels and estimates.
pub fn build(inputs: Inputs, scope: &Scope) -> Report {
    let mut report = Report {
        refused_samples: inputs.refused_samples,
        refused_labels: inputs.refused_labels,
        ..Report::default()
    };
    let labels = latest_labels(inputs.labels, &mut report.refused_labels);
    let mut seen: HashMap<String, f64> = HashMap::new();
    let mut samples = Vec::new();
    for s in inputs.samples {
        let at = DateTime::parse_from_rfc3339(&s.sampled_at).map(|t| t.with_timezone(&Utc));
        let Ok(at) = at else {
            report.refused_samples += 1;
            continue;
        };
        if scope.from.is_some_and(|f| at < f) || scope.to.is_some_and(|t| at >= t) {
            report.outside += 1;
            continue;
        }
        if !(s.sample.probability > 0.0 && s.sample.probability <= 1.0) {
            report.refused_samples += 1;
            continue;
        }
        if let Some(&p) = seen.get(&s.event_id) {
            report.repeated += 1;
            report.conflicting += usize::from(p != s.sample.probability);
            continue;
        }
        seen.insert(s.event_id.clone(), s.sample.probability);
        samples.push(s);
    }
    report.samples = samples.len();
    let in_window = |at: &str| {
        DateTime::parse_from_rfc3339(at)
            .map(|t| t.with_timezone(&Utc))
            .is_ok_and(|t| scope.from.is_none_or(|f| t >= f) && scope.to.is_none_or(|to| t < to))
    };
    let dropped: BTreeSet<&str> = (inputs.drops.iter())
        .filter(|d| in_window(&d.sampled_at) && !seen.contains_key(&d.event_id))
        .map(|d| d.event_id.as_str())
        .collect();
    report.dropped = dropped.len();
    report.labels_without_sample = labels.keys().filter(|id| !seen.contains_key(*id)).count();
    let labelled: Vec<(&SampleRecord, &str)> = samples
        .iter()
        .filter_map(|s| labels.get(&s.event_id).map(|l| (s, l.as_str())))
        .collect();
    report.labelled = labelled.len();
    report.unlabelled = samples.len() - labelled.len();
    let names: BTreeSet<&str> = labelled
        .iter()
        .map(|(_, l)| *l)
        .filter(|l| !scope.negative.iter().any(|n| n == l))
        .collect();
    let mut groups: BTreeMap<String, Vec<(&SampleRecord, &str)>> = BTreeMap::new();
    if let Some(by) = scope.by {
        for &(s, l) in &labelled {
            let key = match by {
                GroupBy::Tenant => s.tenant.clone().unwrap_or_else(|| "-".into()),
                GroupBy::Rule => s.reason.rule.clone(),
            };
            groups.entry(key).or_default().push((s, l));
        }
    }
    let all = std::iter::once(("all".to_string(), labelled.clone()));
    for (group, members) in all.chain(groups) {
        for &label in &names {
            if let Some(row) = row(&group, label, &members) {
                report.rows.push(row);
            }
        }
    }
    report.curves = names.iter().map(|l| curve(l, &labelled)).collect();
    report
}

/// Each event's label: the latest by `labelled_at` (a correction wins),
/// unless a retraction came after it in the topic.
fn latest_labels(labels: Vec<LabelEntry>, refused: &mut usize) -> HashMap<String, String> {
    let mut latest: HashMap<String, (DateTime<Utc>, String)> = HashMap::new();
    for entry in labels {
        let l = match entry {
            LabelEntry::Label(l) => l,
            LabelEntry::Retracted(id) => {
                latest.remove(&id);
                continue;
            }
        };
        let Ok(at) = DateTime::parse_from_rfc3339(&l.labelled_at) else {
            *refused += 1;
            continue;
        };
        let at = at.with_timezone(&Utc);
        match latest.get(&l.event_id) {
            Some((t, _)) if *t > at => {}
            _ => {
                latest.insert(l.event_id, (at, l.label));
            }
        }
    }
    latest.into_iter().map(|(id, (_, l))| (id, l)).collect()
}

fn row(group: &str, label: &str, members: &[(&SampleRecord, &str)]) -> Option<Row> {
    let unit = |s: &SampleRecord, numerator: bool, denominator: bool| Unit {
        probability: s.sample.probability,
        numerator: numerator && denominator,
        denominator,
    };
    let prevalence = estimate::ratio(members.iter().map(|(s, l)| unit(s, *l == label, true)))?;
    let flagged = |s: &SampleRecord| s.flagged_for(label);
    Some(Row {
        group: group.to_string(),
        label: label.to_string(),
        labelled: members.len(),
        prevalence,
        recall: estimate::ratio(
            members
                .iter()
                .map(|(s, l)| unit(s, flagged(s), *l == label)),
        ),
        precision: estimate::ratio(
            members
                .iter()
                .map(|(s, l)| unit(s, *l == label, flagged(s))),
        ),
    })
}

fn curve(label: &str, members: &[(&SampleRecord, &str)]) -> Curve {
    let points = THRESHOLDS
        .iter()
        .map(|&t| {
            let unit = |s: &SampleRecord, numerator: bool, denominator: bool| Unit {
                probability: s.sample.probability,
                numerator: numerator && denominator,
                denominator,
            };
            let at = |s: &SampleRecord| s.score_of(label).is_some_and(|x| x >= t);
            let recall = estimate::ratio(members.iter().map(|(s, l)| unit(s, at(s), *l == label)));
            let precision =
                estimate::ratio(members.iter().map(|(s, l)| unit(s, *l == label, at(s))));
            (t, precision, recall)
        })
        .collect();
    Curve {
        label: label.to_string(),
        points,
    }
}

impl Report {
    /// The report as printed.
    pub fn render(&self) -> String {
        let mut out = format!(
            "samples: {} in the window ({} outside it); {} sampled again after a restart or rebalance, counted once ({} of them with another probability)\n",
            self.samples, self.outside, self.repeated, self.conflicting
        );
        out.push_str(&format!(
            "labelled: {}; unlabelled: {} (left out of the estimates); labels without a sample: {}; records refused: {} samples, {} labels\n",
            self.labelled, self.unlabelled, self.labels_without_sample, self.refused_samples, self.refused_labels
        ));
        out.push_str(&format!(
            "samples dropped by the rate bound (sampling.max_per_second): {}{}\n\n",
            self.dropped,
            if self.dropped > 0 {
                " (the estimates do not account for them: high-risk content is under-counted)"
            } else {
                ""
            }
        ));
        out.push_str(&format!(
            "{:<16} {:<16} {:>10} {:<20} {:>8}  {:<22} {:<22}\n",
            "group",
            "label",
            "prevalence",
            "95% interval",
            "labelled",
            "precision (95%)",
            "recall (95%)"
        ));
        for r in &self.rows {
            out.push_str(&format!(
                "{:<16} {:<16} {:>10.4} {:<20} {:>8}  {:<22} {:<22}\n",
                r.group,
                r.label,
                r.prevalence.value,
                format!("[{:.4}, {:.4}]", r.prevalence.low, r.prevalence.high),
                r.labelled,
                short(r.precision.as_ref()),
                short(r.recall.as_ref()),
            ));
        }
        for c in &self.curves {
            out.push_str(&format!(
                "\nat other thresholds: {} (a sample is flagged when its highest score of {} is at least the threshold)\n{:<10} {:<22} {:<22}\n",
                c.label, c.label, "threshold", "precision (95%)", "recall (95%)"
            ));
            for (t, p, r) in &c.points {
                out.push_str(&format!(
                    "{:<10.1} {:<22} {:<22}\n",
                    t,
                    short(p.as_ref()),
                    short(r.as_ref())
                ));
            }
        }
        out
    }
}

fn short(e: Option<&Estimate>) -> String {
    e.map_or_else(
        || "-".to_string(),
        |e| format!("{:.3} [{:.3}, {:.3}]", e.value, e.low, e.high),
    )
}
