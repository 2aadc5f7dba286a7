//! `modstream plan`: how many instances and partitions for a rate of events
//! at a p99 latency, answered from a bench report of the user's own
//! hardware and model (`modstream bench`), never from a rule of thumb.
//!
//! The arithmetic (all of it is printed):
//! - one instance holds `per_instance`: the highest verdicts/s any measured
//!   configuration achieved with its p99 at or under the asked p99 (without
//!   `--p99`: the best saturation throughput);
//! - instances = ceil(rate ÷ (per_instance × headroom)), at least 1;
//! - partitions: at least twice the instances (room to double by adding
//!   members alone), rounded up to a multiple of 6 (spreads evenly over 1, 2,
//!   3 or 6 members);
//! - KEDA's lagThreshold = saturation throughput × catch-up seconds × 0.5:
//!   a backlog is cleared within the catch-up time while each instance keeps
//!   half its throughput for the live rate;
//! - one more instance adds per_instance × headroom of capacity;
//! - the cost of a day, where the report measured CPU seconds per million
//!   verdicts of the same model (its Python-baseline run of `modstream run`,
//!   or with `--contender` that row of its cost table): CPU-hours = rate ×
//!   86,400 ÷ 10^6 × CPU-s per million ÷ 3,600, and instance-hours =
//!   CPU-hours ÷ (the bench machine's cores × headroom), instances of that
//!   machine's size.
//!
//! - with `--gpu-rate`, the service's own ceiling beside a GPU (see
//!   [`gpu`]), from a report of a null model's runs (`--service-cost`).
//!
//! One model's figures throughout: with `--contender`, the capacity is that
//! row's too (its `modstream run` at the default cell: saturation, and the
//! p99 at half of it), never the report's main model's.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::tools::report::{CostRow, Report};

mod gpu;

pub use gpu::GpuCeiling;

#[derive(Debug, Clone, clap::Args)]
pub struct PlanOptions {
    /// Events per second to moderate.
    #[arg(long)]
    pub rate: f64,
    /// p99 latency to hold, in milliseconds (as the bench measures it: the
    /// intended send time to the verdict read back).
    #[arg(long = "p99")]
    pub p99_ms: Option<f64>,
    /// The bench report to answer from (`modstream bench` writes
    /// target/bench/bench.json; default: the shipped report,
    /// docs/bench/bench.json, measured on the project's machine, not yours).
    #[arg(long = "from")]
    pub report: Option<PathBuf>,
    /// Share of one instance's capacity to plan for (the rest absorbs
    /// bursts, rebalances and noisy neighbours).
    #[arg(long, default_value_t = 0.7)]
    pub headroom: f64,
    /// Seconds in which the autoscaled group should clear a backlog.
    #[arg(long, default_value_t = 10.0)]
    pub catch_up_seconds: f64,
    /// A row of the report's cost table (a part of its contender's name)
    /// to plan for: its capacity and its cost of a day (default: the
    /// report's main model).
    #[arg(long)]
    pub contender: Option<String>,
    /// A GPU's inferences per second: the CPU cores and instances the
    /// service needs beside it, from `--service-cost`.
    #[arg(long)]
    pub gpu_rate: Option<f64>,
    /// The bench report of the service's own cost (a null model's
    /// `--own-runs`; default: the shipped docs/bench-null/text/bench.json).
    #[arg(long)]
    pub service_cost: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub rate_per_s: f64,
    pub p99_ms: Option<f64>,
    /// Verdicts/s one instance holds at that p99, and the configuration
    /// (and offered load) it was measured with.
    pub per_instance_per_s: f64,
    pub measured_with: String,
    pub measured_p99_ms: Option<f64>,
    pub headroom: f64,
    pub instances: u64,
    pub partitions: u64,
    pub lag_threshold: u64,
    /// Capacity one more instance adds, and each instance's share of the
    /// rate with it.
    pub one_more_instance_adds_per_s: f64,
    pub per_instance_load_now: f64,
    pub per_instance_load_with_one_more: f64,
    /// Where the numbers come from: the report and its run.
    pub source: String,
    pub bench: String,
    /// What a day at the rate costs, where the report measured CPU time.
    pub day: Option<DayCost>,
    /// `--gpu-rate`: what a GPU at that rate needs beside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuCeiling>,
}

/// A day of the rate in CPU-hours and instance-hours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DayCost {
    pub cpu_s_per_million: f64,
    pub measured_with: String,
    pub cores: u64,
    pub cpu_hours: f64,
    pub instance_hours: f64,
    /// Instances the measured verdicts/s of the same run need at the
    /// headroom, for a whole day: the throughput view of the same cost.
    pub instances_by_throughput: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot read the bench report {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the bench report {path} is not a modstream bench report")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(
        "no configuration in the bench report held a p99 of {p99_ms} ms (the best was {best_ms:.1} ms); bench a lower load or a smaller batch, or ask for a looser p99"
    )]
    Unreachable { p99_ms: f64, best_ms: f64 },
}

pub fn load(path: &Path) -> Result<Report, PlanError> {
    let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| PlanError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// The answer for `opts` from `report`.
pub fn plan(report: &Report, opts: &PlanOptions) -> Result<Plan, PlanError> {
    if !(opts.rate > 0.0 && opts.rate.is_finite()) {
        return Err(PlanError::Invalid("--rate must be above 0".into()));
    }
    if !(opts.headroom > 0.0 && opts.headroom <= 1.0) {
        return Err(PlanError::Invalid(
            "--headroom must be above 0 and at most 1".into(),
        ));
    }
    let row = match &opts.contender {
        Some(name) => Some(cost_row(report, name)?),
        None => None,
    };
    let saturation = match row {
        Some(r) => r.default_per_s.max(r.target_per_s),
        None => (report.saturation.iter())
            .map(|r| r.pipeline_per_s)
            .fold(0.0, f64::max),
    };
    if saturation <= 0.0 {
        return Err(PlanError::Invalid(
            "the bench report has no saturation run".into(),
        ));
    }
    let Capacity {
        per_instance,
        measured_with,
        measured_p99,
    } = match row {
        Some(r) => row_capacity(r, opts.p99_ms)?,
        None => capacity(report, opts.p99_ms)?,
    };
    let usable = per_instance * opts.headroom;
    let instances = ((opts.rate / usable).ceil() as u64).max(1);
    let partitions = (instances * 2).div_ceil(6) * 6;
    let lag_threshold =
        (((saturation * opts.catch_up_seconds * 0.5) / 1000.0).round() as u64).max(1) * 1000;
    let day = day_cost(report, row, opts)?;
    Ok(Plan {
        day,
        gpu: None,
        rate_per_s: opts.rate,
        p99_ms: opts.p99_ms,
        per_instance_per_s: per_instance,
        measured_with,
        measured_p99_ms: measured_p99,
        headroom: opts.headroom,
        instances,
        partitions,
        lag_threshold,
        one_more_instance_adds_per_s: usable,
        per_instance_load_now: opts.rate / instances as f64 / per_instance,
        per_instance_load_with_one_more: opts.rate / (instances + 1) as f64 / per_instance,
        source: String::new(),
        bench: format!(
            "{} on {}, {} worker(s), {}, broker {}",
            row.map_or(report.model.as_str(), |r| r.contender.as_str()),
            report.machine,
            report.workers,
            report.provider,
            report.broker
        ),
    })
}

/// The cost-table row whose contender's name contains `name`.
fn cost_row<'r>(report: &'r Report, name: &str) -> Result<&'r CostRow, PlanError> {
    report
        .cost
        .iter()
        .find(|r| r.contender.contains(name))
        .ok_or_else(|| {
            let have: Vec<&str> = report.cost.iter().map(|r| r.contender.as_str()).collect();
            PlanError::Invalid(format!(
                "no contender {name:?} in the report's cost table (it has {have:?})"
            ))
        })
}

/// What one instance sustains, as a cost-table row measured it: its
/// default cell at saturation, or (with a p99) at half of it.
fn row_capacity(row: &CostRow, p99_ms: Option<f64>) -> Result<Capacity, PlanError> {
    let with = format!(
        "{}, modstream run at its default configuration (64 / 20 ms)",
        row.contender
    );
    match p99_ms {
        None => Ok(Capacity {
            per_instance: row.default_per_s,
            measured_with: format!("{with}, at saturation"),
            measured_p99: None,
        }),
        Some(p99) if row.p99_at_half_ms <= p99 => Ok(Capacity {
            per_instance: row.default_per_s * 0.5,
            measured_with: format!("{with}, at 50 % of its saturation"),
            measured_p99: Some(row.p99_at_half_ms),
        }),
        Some(p99) => Err(PlanError::Unreachable {
            p99_ms: p99,
            best_ms: row.p99_at_half_ms,
        }),
    }
}

/// CPU seconds per million verdicts of the planned model: the chosen
/// cost-table row's, else the baseline run's (the report's main model);
/// None where neither measured it.
fn day_cost(
    report: &Report,
    row: Option<&CostRow>,
    opts: &PlanOptions,
) -> Result<Option<DayCost>, PlanError> {
    let measured = match row {
        Some(row) => {
            let cpu = row.cpu_s_per_million.ok_or_else(|| {
                PlanError::Invalid(format!(
                    "{}: its run was too short to measure CPU time",
                    row.contender
                ))
            })?;
            Some((cpu, row.contender.clone(), Some(row.default_per_s)))
        }
        None => report.baseline.as_ref().and_then(|b| {
            Some((
                b.modstream_cpu_s_per_million?,
                report.model.clone(),
                Some(b.modstream_per_s),
            ))
        }),
    };
    let Some((cpu_s_per_million, contender, per_s)) = measured else {
        return Ok(None);
    };
    let cores = report
        .machine
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            PlanError::Invalid(format!(
                "the report's machine {:?} names no cores",
                report.machine
            ))
        })?;
    let cpu_hours = opts.rate * 86_400.0 / 1e6 * cpu_s_per_million / 3_600.0;
    Ok(Some(DayCost {
        cpu_s_per_million,
        measured_with: format!("{contender}, modstream run at its default configuration"),
        cores,
        cpu_hours,
        instance_hours: cpu_hours / (cores as f64 * opts.headroom),
        instances_by_throughput: per_s.filter(|p| *p > 0.0).map_or(1, |p| {
            ((opts.rate / (p * opts.headroom)).ceil() as u64).max(1)
        }),
    }))
}

/// What one instance sustains, as the report measured it.
struct Capacity {
    per_instance: f64,
    /// How it was measured.
    measured_with: String,
    /// Its measured p99 (with a p99 asked for).
    measured_p99: Option<f64>,
}

/// What one instance sustains: at saturation, or (with a p99) the highest
/// measured rate that held it.
fn capacity(report: &Report, p99_ms: Option<f64>) -> Result<Capacity, PlanError> {
    let label = |size: usize, delay: u64, target: Option<u64>| match target {
        Some(t) => format!("batching.target_p99 = {t} ms"),
        None => format!("max_batch_size {size}, max_batch_delay {delay} ms"),
    };
    match p99_ms {
        None => {
            let best = report
                .saturation
                .iter()
                .max_by(|a, b| a.pipeline_per_s.total_cmp(&b.pipeline_per_s))
                .ok_or_else(|| PlanError::Invalid("no saturation run".into()))?;
            Ok(Capacity {
                per_instance: best.pipeline_per_s,
                measured_with: format!(
                    "{}, at saturation",
                    label(
                        best.max_batch_size,
                        best.max_batch_delay_ms,
                        best.target_p99_ms
                    )
                ),
                measured_p99: None,
            })
        }
        Some(p99) => {
            let held = report
                .latency
                .iter()
                .filter(|r| r.p99_ms <= p99)
                .max_by(|a, b| a.achieved_per_s.total_cmp(&b.achieved_per_s));
            match held {
                Some(r) => Ok(Capacity {
                    per_instance: r.achieved_per_s,
                    measured_with: format!(
                        "{}, at {:.0} % of its saturation",
                        label(r.max_batch_size, r.max_batch_delay_ms, r.target_p99_ms),
                        r.offered_fraction * 100.0
                    ),
                    measured_p99: Some(r.p99_ms),
                }),
                None => {
                    let best_ms = report
                        .latency
                        .iter()
                        .map(|r| r.p99_ms)
                        .fold(f64::INFINITY, f64::min);
                    Err(PlanError::Unreachable {
                        p99_ms: p99,
                        best_ms,
                    })
                }
            }
        }
    }
}

impl Plan {
    pub fn print(&self) {
        println!("From {}: {}.", self.source, self.bench);
        match (self.p99_ms, self.measured_p99_ms) {
            (Some(p99), Some(measured)) => println!(
                "One instance holds {:.0} events/s at p99 ≤ {p99} ms (measured {measured:.1} ms with {}).",
                self.per_instance_per_s, self.measured_with
            ),
            _ => println!(
                "One instance holds {:.0} events/s ({}; no p99 asked).",
                self.per_instance_per_s, self.measured_with
            ),
        }
        println!(
            "For {:.0} events/s at {:.0} % of each instance's capacity: {} instance(s) (each at {:.0} % of it).",
            self.rate_per_s,
            self.headroom * 100.0,
            self.instances,
            self.per_instance_load_now * 100.0
        );
        println!(
            "Partitions of the input topic: {} (at least the instances, room to double them, a multiple of 6).",
            self.partitions
        );
        println!(
            "KEDA lagThreshold: {} (saturation throughput × catch-up seconds × 0.5).",
            self.lag_threshold
        );
        println!(
            "One more instance adds {:.0} events/s of planned capacity (each instance then at {:.0} %).",
            self.one_more_instance_adds_per_s,
            self.per_instance_load_with_one_more * 100.0
        );
        match &self.day {
            Some(d) => println!(
                "A day of {:.0} events/s: {:.1} CPU-hours ({:.0} CPU-s per million verdicts, {}), {:.1} instance-hours of {} cores at {:.0} % (by that run's verdicts/s instead: {} instance(s) × 24 h = {} instance-hours).",
                self.rate_per_s,
                d.cpu_hours,
                d.cpu_s_per_million,
                d.measured_with,
                d.instance_hours,
                d.cores,
                self.headroom * 100.0,
                d.instances_by_throughput,
                d.instances_by_throughput * 24
            ),
            None => println!(
                "The report measured no CPU time for this model (bench with --python to cost a day, or choose a row of its cost table with --contender)."
            ),
        }
        if let Some(gpu) = &self.gpu {
            gpu.print(self.headroom);
        }
        println!(
            "These numbers hold for the hardware, model and broker of that bench run only; bench yours."
        );
    }
}

/// Where the shipped reports are (relative to the repository): the main
/// one, and the service's own cost with the null text model.
pub const SHIPPED_REPORT: &str = "docs/bench/bench.json";
pub const SHIPPED_SERVICE_COST: &str = "docs/bench-null/text/bench.json";

pub fn run(opts: &PlanOptions) -> anyhow::Result<()> {
    let (path, source) = match &opts.report {
        Some(path) => (path.clone(), format!("the bench report {}", path.display())),
        None => {
            let path = crate::tools::beside_the_binary(Path::new(SHIPPED_REPORT));
            let source = format!(
                "the shipped bench report {} (the project's machine, not yours: `modstream bench` measures yours, `--from target/bench/bench.json` reads it)",
                path.display()
            );
            (path, source)
        }
    };
    let report = load(&path)?;
    let mut plan = plan(&report, opts)?;
    plan.source = source;
    if let Some(rate) = opts.gpu_rate {
        let path = match &opts.service_cost {
            Some(path) => path.clone(),
            None => crate::tools::beside_the_binary(Path::new(SHIPPED_SERVICE_COST)),
        };
        plan.gpu = Some(gpu::ceiling(&load(&path)?, rate, opts.headroom)?);
    }
    if opts.json {
        use std::io::Write;
        writeln!(
            std::io::stdout(),
            "{}",
            serde_json::to_string_pretty(&plan)?
        )?;
    } else {
        plan.print();
    }
    Ok(())
}

#[cfg(test)]
mod tests;
