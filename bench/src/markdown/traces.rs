//! Tracing's table: `--own-runs` with `--tracing-ratios` (each round
//! without tracing, then at each ratio).

use std::fmt::Write;

use modstream::tools::report::Report;
use modstream::tools::stats::median;

use super::MIB;

/// The runs in the order they ran, and the medians of each contender.
/// Whether it rendered (any run traced).
pub(super) fn own_runs(out: &mut String, report: &Report) -> bool {
    let runs = &report.own_runs;
    let Some(first) = runs.first() else {
        return false;
    };
    if runs.iter().all(|r| r.tracing.is_none()) {
        return false;
    }
    let _ = writeln!(
        out,
        "**`modstream run` without and with tracing**, taking turns, {} runs on the same {} events without a trace context (its own process; CPU between its first and last verdict; spans to an OTLP/HTTP sink in the bench's process)\n\n| run | tracing | verdicts/s | CPU µs per verdict | peak RSS MiB | OTLP bytes per verdict |\n|---|---|---|---|---|---|",
        runs.len(),
        first.events
    );
    let or_dash = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    let name = |ratio: Option<f64>| ratio.map_or("off".to_string(), |r| format!("{} %", r * 100.0));
    for (i, r) in runs.iter().enumerate() {
        let ratio = r.tracing.as_ref().map(|t| t.sampling_ratio);
        let bytes = r.tracing.as_ref().map(|t| t.otlp_bytes_per_verdict);
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {:.0} | {} |",
            i + 1,
            name(ratio),
            r.per_s,
            or_dash(r.cpu_us_per_verdict),
            r.peak_rss_bytes as f64 / MIB,
            or_dash(bytes),
        );
    }
    let mut contenders: Vec<Option<f64>> = Vec::new();
    for r in runs {
        let ratio = r.tracing.as_ref().map(|t| t.sampling_ratio);
        if !contenders.contains(&ratio) {
            contenders.push(ratio);
        }
    }
    for ratio in contenders {
        let of: Vec<_> = (runs.iter())
            .filter(|r| r.tracing.as_ref().map(|t| t.sampling_ratio) == ratio)
            .collect();
        let per_s: Vec<f64> = of.iter().map(|r| r.per_s).collect();
        let cpu: Vec<f64> = of.iter().filter_map(|r| r.cpu_us_per_verdict).collect();
        let _ = writeln!(
            out,
            "| median | {} | {:.0} | {} | | |",
            name(ratio),
            median(&per_s).unwrap_or(0.0),
            or_dash(median(&cpu))
        );
    }
    out.push('\n');
    true
}
