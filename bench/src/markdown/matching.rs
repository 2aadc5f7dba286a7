//! Matching's table (`--match-shares`).

use std::fmt::Write;

use modstream::tools::report::{Held, Report};

/// Matching's sweep: throughput with matching off, lists only, and lists
/// with waves and reuse; the matcher's own time per event.
pub(super) fn render(out: &mut String, report: &Report) {
    if report.matching.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "**Matching before the models** (batch 64 / 20 ms, saturation, the median of {} runs each; a known-bad list of 1,000 items)\n\n| near-duplicates | off/s | lists/s | lists ÷ off | lists + waves + reuse/s | reuse ÷ off | reused | matcher µs/event (lists / with waves) |\n|---|---|---|---|---|---|---|---|",
        report.matching[0].runs
    );
    for r in &report.matching {
        let _ = writeln!(
            out,
            "| {:.0} % | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} % | {:.1} / {:.1} |",
            r.near_duplicate_share * 100.0,
            r.off_per_s,
            r.lists_per_s,
            r.lists_per_s / r.off_per_s,
            r.reuse_per_s,
            r.reuse_per_s / r.off_per_s,
            r.reused_share * 100.0,
            r.lists_matcher_us,
            r.waves_matcher_us
        );
    }
    out.push('\n');
}

/// The matcher under floods (`--match-floods`).
pub(super) fn render_floods(out: &mut String, report: &Report) {
    if report.match_floods.is_empty() {
        return;
    }
    out.push_str("**The matcher under floods** (alone, one thread; waves on, the shipped bounds)\n\n| flood | posts | matcher µs/event | clusters kept | state MiB (of max_bytes) | clusters evicted | candidates cut | peak RSS rise MiB |\n|---|---|---|---|---|---|---|---|\n");
    for r in &report.match_floods {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {} | {:.1} ({:.0}) | {} | {} | {:.0} |",
            r.flood,
            r.events,
            r.matcher_us,
            r.clusters,
            r.bytes as f64 / 1048576.0,
            r.max_bytes as f64 / 1048576.0,
            r.evicted,
            r.candidates_cut,
            r.rss_rise_bytes as f64 / 1048576.0
        );
    }
    out.push('\n');
}

/// The matcher's curves: what it holds, its build, and its time per post.
pub(super) fn render_curves(out: &mut String, report: &Report) {
    let mut kinds: Vec<Held> = report.matcher_curves.iter().map(|c| c.held).collect();
    kinds.dedup();
    for kind in kinds {
        let rows: Vec<_> = (report.matcher_curves.iter())
            .filter(|c| c.held == kind)
            .collect();
        let _ = writeln!(
            out,
            "**The matcher alone as the {} grow** (one thread, {} posts inspected after the build)\n\n| {} | build s | state MiB | peak RSS rise MiB | matcher µs/post | list matched |\n|---|---|---|---|---|---|",
            kind.unit(),
            rows[0].events,
            kind.unit()
        );
        for r in &rows {
            let _ = writeln!(
                out,
                "| {} | {:.2} | {:.1} | {:.0} | {:.2} | {} |",
                r.at,
                r.build_s,
                r.bytes as f64 / 1048576.0,
                r.rss_rise_bytes as f64 / 1048576.0,
                r.matcher_us,
                match r.held {
                    Held::ListItems => format!("{:.0} %", r.matched_share * 100.0),
                    Held::WaveClusters => "—".to_string(),
                }
            );
        }
        let us: Vec<f64> = rows.iter().map(|r| r.matcher_us).collect();
        let lo = us.iter().copied().fold(f64::MAX, f64::min);
        let hi = us.iter().copied().fold(0.0, f64::max);
        if lo > 0.0 {
            let _ = writeln!(
                out,
                "\nMatcher time per post, most ÷ least over the range: {:.2}\n",
                hi / lo
            );
        }
    }
}
