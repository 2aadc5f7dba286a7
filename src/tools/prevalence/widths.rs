//! How wide the 95 % intervals are against the number of labels: the
//! simulated stream of [`crate::sampling::simulate`] (100,000 events, 1 %
//! violating), sampled at the shipped rates scaled so that each step draws
//! about twice the labels of the one before; at each step the mean width of
//! the prevalence, recall and precision intervals over independent samples,
//! and how often they covered the truth.

use crate::config::SamplingSettings;
use crate::sampling::simulate::Population;

/// The simulation's size.
#[derive(Debug, Clone)]
pub struct Plan {
    pub events: usize,
    pub share: f64,
    /// Samples drawn at each step.
    pub replicates: u64,
    /// Each step's rates: the shipped ones times this.
    pub scales: Vec<f64>,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            events: 100_000,
            share: 0.01,
            replicates: 100,
            scales: vec![0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
        }
    }
}

/// One step's figures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WidthRow {
    /// The simulated stream: events, the violating share, samples drawn.
    pub events: usize,
    pub share: f64,
    pub replicates: u64,
    pub min_rate: f64,
    pub max_rate: f64,
    /// Mean labels (samples) per day of 100,000 events.
    pub labels: f64,
    pub prevalence_width: f64,
    pub recall_width: f64,
    pub precision_width: f64,
    pub prevalence_coverage: f64,
    pub recall_coverage: f64,
    pub precision_coverage: f64,
}

pub fn simulate(plan: &Plan) -> Vec<WidthRow> {
    let population = Population::new(plan.events, plan.share, 7);
    let truth = population.prevalence();
    let (recall, precision) = population.recall_precision();
    let shipped = SamplingSettings::default();
    plan.scales
        .iter()
        .map(|&k| {
            let rates = SamplingSettings {
                min_rate: (shipped.min_rate * k).min(1.0),
                max_rate: (shipped.max_rate * k).min(1.0),
                ..shipped.clone()
            };
            let mut labels = 0usize;
            let mut width = [0.0f64; 3];
            let mut covered = [0usize; 3];
            let mut counted = [0usize; 3];
            for r in 0..plan.replicates {
                let sample = population.sample(&rates, 1_000_000 + r);
                labels += sample.len();
                let e = population.estimate(&sample);
                for (i, (est, t)) in [
                    (e.prevalence, truth),
                    (e.recall, recall),
                    (e.precision, precision),
                ]
                .into_iter()
                .enumerate()
                {
                    if let Some(est) = est {
                        width[i] += est.width();
                        covered[i] += usize::from(est.covers(t));
                        counted[i] += 1;
                    }
                }
            }
            let mean = |i: usize| width[i] / counted[i].max(1) as f64;
            let cover = |i: usize| covered[i] as f64 / counted[i].max(1) as f64;
            WidthRow {
                events: plan.events,
                share: plan.share,
                replicates: plan.replicates,
                min_rate: rates.min_rate,
                max_rate: rates.max_rate,
                labels: labels as f64 / plan.replicates as f64,
                prevalence_width: mean(0),
                recall_width: mean(1),
                precision_width: mean(2),
                prevalence_coverage: cover(0),
                recall_coverage: cover(1),
                precision_coverage: cover(2),
            }
        })
        .collect()
}

/// The table: one line per step.
pub fn render(rows: &[WidthRow]) -> String {
    let mut out = String::from(
        "100,000 events, 1 % violating (simulated); mean 95 % interval width (coverage) over independent samples\n\
         min_rate  max_rate  labels  prevalence         recall             precision\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{:<9.5} {:<9.4} {:>6.0}  {:.4} ({:.2})      {:.3} ({:.2})       {:.3} ({:.2})\n",
            r.min_rate,
            r.max_rate,
            r.labels,
            r.prevalence_width,
            r.prevalence_coverage,
            r.recall_width,
            r.recall_coverage,
            r.precision_width,
            r.precision_coverage
        ));
    }
    out
}
