//! Entity state's tables: `--own-runs` with `--state-rules` (each round
//! without state, then with it) and `--state-restore`.

use std::fmt::Write;

use modstream::tools::report::Report;
use modstream::tools::stats::median;

use super::MIB;

/// `--own-runs --state-rules`: the runs in the order they ran, and the
/// medians of each contender. Whether it rendered (any run kept state).
pub(super) fn own_runs(out: &mut String, report: &Report) -> bool {
    let runs = &report.own_runs;
    let Some(first) = runs.first() else {
        return false;
    };
    if runs.iter().all(|r| r.state.is_none()) {
        return false;
    }
    let _ = writeln!(
        out,
        "**`modstream run` without and with state rules**, taking turns, {} runs on the same {} events (its own process; CPU between its first and last verdict)\n\n| run | state rules | verdicts/s | CPU µs per verdict | peak RSS MiB | changelog records | changelog bytes per verdict |\n|---|---|---|---|---|---|---|",
        runs.len(),
        first.events
    );
    let or_dash = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    for (i, r) in runs.iter().enumerate() {
        let (on, records, bytes) = match &r.state {
            Some(s) => (
                "on",
                s.changelog_records.to_string(),
                format!("{:.1}", s.changelog_bytes_per_verdict),
            ),
            None => ("off", "—".into(), "—".into()),
        };
        let _ = writeln!(
            out,
            "| {} | {on} | {:.0} | {} | {:.0} | {records} | {bytes} |",
            i + 1,
            r.per_s,
            or_dash(r.cpu_us_per_verdict),
            r.peak_rss_bytes as f64 / MIB,
        );
    }
    for (on, name) in [(false, "off"), (true, "on")] {
        let of: Vec<_> = runs.iter().filter(|r| r.state.is_some() == on).collect();
        let per_s: Vec<f64> = of.iter().map(|r| r.per_s).collect();
        let cpu: Vec<f64> = of.iter().filter_map(|r| r.cpu_us_per_verdict).collect();
        let _ = writeln!(
            out,
            "| median | {name} | {:.0} | {} | | | |",
            median(&per_s).unwrap_or(0.0),
            or_dash(median(&cpu))
        );
    }
    out.push('\n');
    true
}

/// `--state-restore`: changelogs of N entities read back, timed.
pub(super) fn restores(out: &mut String, report: &Report) {
    if report.state_restores.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "**State restore** (the restore thread reads one changelog partition of N entities, one change each, written by the state step)\n\n| entities | changelog records | changelog MiB | seconds | entities/s | state MiB |\n|---|---|---|---|---|---|"
    );
    for r in &report.state_restores {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.2} | {:.0} | {:.1} |",
            r.entities,
            r.records,
            r.changelog_bytes as f64 / MIB,
            r.seconds,
            r.entities_per_s,
            r.state_bytes as f64 / MIB
        );
    }
    out.push('\n');
}
