//! Several runs of the same bench side by side: per run, the adaptive
//! cell (`--target-p99-ms`) against the best fixed cell of that run, and
//! the median and lowest of those ratios. A docs block that names several
//! bench.json files renders this table (see [`super::splice`]).

use std::fmt::Write;

use modstream::tools::report::{Report, SaturationRow};
use modstream::tools::stats::median;

/// One run: the best fixed cell and the adaptive one, if it has both.
fn cells(report: &Report) -> Option<(&SaturationRow, &SaturationRow)> {
    let fixed = report
        .saturation
        .iter()
        .filter(|r| r.target_p99_ms.is_none())
        .max_by(|a, b| a.pipeline_per_s.total_cmp(&b.pipeline_per_s))?;
    let adaptive = report
        .saturation
        .iter()
        .find(|r| r.target_p99_ms.is_some())?;
    Some((fixed, adaptive))
}

/// The table of `runs` (name, report), in the order given.
pub fn render(runs: &[(String, Report)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**The adaptive cell against the best fixed cell, run by run**\n\n| run | model | events | best fixed cell | its verdicts/s | its mean run | adaptive (target, bounds) | adaptive verdicts/s | adaptive mean run | adaptive ÷ best fixed |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    // Per model, in the order first seen: its runs' ratios.
    let mut ratios: Vec<(String, Vec<f64>)> = Vec::new();
    for (name, report) in runs {
        let Some((fixed, adaptive)) = cells(report) else {
            let _ = writeln!(
                out,
                "| {name} | {} | no adaptive and fixed cells | | | | | | | |",
                report.model
            );
            continue;
        };
        let ratio = adaptive.pipeline_per_s / fixed.pipeline_per_s;
        match ratios.iter_mut().find(|(m, _)| *m == report.model) {
            Some((_, r)) => r.push(ratio),
            None => ratios.push((report.model.clone(), vec![ratio])),
        }
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} / {} ms | {:.0} | {:.1} | {} ms, ≤ {} / {} ms | {:.0} | {:.1} | {:.2} |",
            report.model,
            adaptive.events,
            fixed.max_batch_size,
            fixed.max_batch_delay_ms,
            fixed.pipeline_per_s,
            fixed.mean_batch_size,
            adaptive.target_p99_ms.unwrap_or_default(),
            adaptive.max_batch_size,
            adaptive.max_batch_delay_ms,
            adaptive.pipeline_per_s,
            adaptive.mean_batch_size,
            ratio
        );
    }
    for (model, r) in &ratios {
        if let (Some(median), Some(lowest)) = (median(r), r.iter().copied().reduce(f64::min)) {
            let _ = writeln!(
                out,
                "\n{model}: adaptive ÷ best fixed over {} run(s): median {median:.2}, lowest {lowest:.2}.",
                r.len()
            );
        }
    }
    out
}
