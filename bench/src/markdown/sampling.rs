//! Sampling's table (`--sampling-runs`).

use std::fmt::Write;

use modstream::tools::report::Report;

/// Throughput with sampling off and on at the shipped rates.
pub(super) fn render(out: &mut String, report: &Report) {
    let Some(r) = &report.sampling else {
        return;
    };
    let _ = writeln!(
        out,
        "**Sampling for prevalence** (batch 64 / 20 ms, saturation, the median of {} runs each; `[sampling]` as shipped)\n\n| off/s | on/s | on ÷ off | verdicts sampled | sampler ns/verdict |\n|---|---|---|---|---|\n| {:.0} | {:.0} | {:.3} | {:.2} % | {:.0} |\n",
        r.runs,
        r.off_per_s,
        r.on_per_s,
        r.on_per_s / r.off_per_s,
        r.sampled_share * 100.0,
        r.draw_ns
    );
}
