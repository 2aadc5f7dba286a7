//! The service beside a GPU (`modstream plan --gpu-rate R`): on a GPU the
//! model's CPU cost nearly vanishes and what stays on the CPU per verdict is
//! the service's own (decode, batch, policy, verdict, Kafka in and out).
//! That cost is measured with a model that costs nothing (the null models of
//! scripts/build-null-models.sh) by `modstream bench --own-runs N`; from it:
//! - CPU cores the service needs to keep a GPU at R inferences/s busy =
//!   R × CPU µs per verdict ÷ 10^6 ÷ headroom, rounded up;
//! - instances of the bench machine's kind = R ÷ (the runs' verdicts/s ×
//!   headroom), rounded up: one instance's own ceiling, whatever the GPU.
//!
//! The medians of the runs are used; the figures include a broker on the
//! same machine only where the bench ran so.

use serde::Serialize;

use super::PlanError;
use crate::tools::report::Report;
use crate::tools::stats::median;

/// What a GPU at `gpu_rate_per_s` needs beside it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuCeiling {
    pub gpu_rate_per_s: f64,
    /// The service's own CPU per verdict and one instance's verdicts/s,
    /// the medians of `runs` runs of the report's model.
    pub cpu_us_per_verdict: f64,
    pub instance_per_s: f64,
    pub runs: usize,
    pub model: String,
    pub machine: String,
    /// Cores busy at R (before headroom), and the cores to provide.
    pub cores_busy: f64,
    pub cores: u64,
    /// Instances of the bench machine's kind that R takes.
    pub instances: u64,
}

/// The ceiling from `report`'s `--own-runs` at `gpu_rate` inferences/s.
pub fn ceiling(report: &Report, gpu_rate: f64, headroom: f64) -> Result<GpuCeiling, PlanError> {
    if !(gpu_rate > 0.0 && gpu_rate.is_finite()) {
        return Err(PlanError::Invalid("--gpu-rate must be above 0".into()));
    }
    let cpu: Vec<f64> = (report.own_runs.iter())
        .filter_map(|r| r.cpu_us_per_verdict)
        .collect();
    let per_s: Vec<f64> = report.own_runs.iter().map(|r| r.per_s).collect();
    let (Some(cpu_us), Some(instance_per_s)) = (median(&cpu), median(&per_s)) else {
        return Err(PlanError::Invalid(format!(
            "the service-cost report (model {}) has no runs of `modstream run` with their CPU time: \
             bench a null model with `modstream bench --model models/null-text --own-runs 5`",
            report.model
        )));
    };
    if instance_per_s <= 0.0 {
        return Err(PlanError::Invalid(
            "the service-cost report's runs delivered no verdicts".into(),
        ));
    }
    let cores_busy = gpu_rate * cpu_us / 1e6;
    Ok(GpuCeiling {
        gpu_rate_per_s: gpu_rate,
        cpu_us_per_verdict: cpu_us,
        instance_per_s,
        runs: cpu.len(),
        model: report.model.clone(),
        machine: report.machine.clone(),
        cores_busy,
        cores: ((cores_busy / headroom).ceil() as u64).max(1),
        instances: ((gpu_rate / (instance_per_s * headroom)).ceil() as u64).max(1),
    })
}

impl GpuCeiling {
    pub fn print(&self, headroom: f64) {
        println!(
            "Beside a GPU at {:.0} inferences/s: the service's own CPU is {:.1} µs per verdict and one instance delivers {:.0} verdicts/s ({}, medians of {} runs of `modstream run` on {}).",
            self.gpu_rate_per_s,
            self.cpu_us_per_verdict,
            self.instance_per_s,
            self.model,
            self.runs,
            self.machine
        );
        println!(
            "It keeps {:.2} cores busy: provide {} core(s) at {:.0} %, and {} instance(s) of that kind to feed the GPU.",
            self.cores_busy,
            self.cores,
            headroom * 100.0,
            self.instances
        );
    }
}
