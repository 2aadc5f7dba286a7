//! The bench report as markdown tables: `modstream bench` writes them
//! beside bench.json (bench.md), and docs/benchmarks.md holds them between
//! markers that name the bench.json they come from, so that no figure in
//! the tables is typed by hand ([`splice`] rewrites every block from its
//! file; a test checks the docs against their files).

use std::fmt::Write;
use std::path::Path;

use modstream::tools::report::{Report, SaturationRow, StepTrace};

mod extras;
mod matching;
mod repeats;
mod sampling;
mod state;
mod traces;

/// Opens a generated block: `<!-- bench-tables: PATH -->`, PATH relative
/// to the repository root (several paths: those runs side by side, see
/// [`repeats`]).
pub const BEGIN: &str = "<!-- bench-tables: ";
/// Closes it.
pub const END: &str = "<!-- /bench-tables -->";

const MIB: f64 = (1u64 << 20) as f64;

/// Every table the report has data for.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let or_unrecorded = |v: &str| {
        if v.is_empty() {
            "not recorded".to_string()
        } else {
            v.to_string()
        }
    };
    let _ = writeln!(
        out,
        "Machine: {}; model {}; provider: {}; {} worker(s), {} intra-op thread(s); broker: {}; the bench process's peak RSS {:.0} MiB.\n",
        report.machine,
        report.model,
        or_unrecorded(&report.provider),
        report.workers,
        report.intra_threads,
        or_unrecorded(&report.broker),
        report.peak_rss_bytes as f64 / MIB
    );
    saturation(&mut out, report);
    latency(&mut out, report);
    floor(&mut out, report);
    if let Some(step) = &report.step {
        step_table(&mut out, step);
    }
    extras::extras(&mut out, report);
    out.trim_end().to_string() + "\n"
}

fn cell_name(size: usize, target: Option<u64>) -> String {
    match target {
        Some(t) => format!("adaptive (target p99 {t} ms, ≤ {size})"),
        None => size.to_string(),
    }
}

/// Which optional column groups a saturation table has.
#[derive(Clone, Copy)]
struct SaturationColumns {
    /// Token models: padding efficiency and the raw model without buckets.
    tokens: bool,
    /// Reports with the own process's CPU against the raw model's on as
    /// many sessions (older ones ran the raw model on one).
    cpu: bool,
    /// With `--broker-pid`: the broker's CPU per verdict.
    broker: bool,
}

fn saturation(out: &mut String, report: &Report) {
    if report.saturation.is_empty() {
        return;
    }
    let rows = &report.saturation;
    let columns = SaturationColumns {
        tokens: rows.iter().any(|r| r.padding_efficiency.is_some()),
        cpu: rows.iter().any(|r| r.raw_sessions.is_some()),
        broker: rows.iter().any(|r| {
            r.own_process
                .as_ref()
                .is_some_and(|o| o.broker_cpu_us_per_verdict.is_some())
        }),
    };
    let sessions = rows.iter().find_map(|r| r.raw_sessions).unwrap_or(1);
    let _ = writeln!(out, "**Throughput at saturation**\n");
    let _ = writeln!(out, "{}", saturation_header(columns, sessions));
    for r in rows {
        let _ = writeln!(out, "{}", saturation_cells(r, columns));
    }
    out.push('\n');
}

/// The header and rule lines of a saturation table.
fn saturation_header(c: SaturationColumns, sessions: usize) -> String {
    let mut names = vec![
        "max_batch_size".to_string(),
        "max_batch_delay".into(),
        "events".into(),
        "pipeline verdicts/s".into(),
    ];
    if c.cpu {
        let plural = if sessions == 1 { "" } else { "s" };
        names.push(format!("raw model events/s ({sessions} session{plural})"));
        names.push("pipeline ÷ raw".into());
        for n in [
            "own process verdicts/s",
            "CPU µs per verdict",
            "raw CPU µs per event",
            "CPU ÷ raw",
        ] {
            names.push(n.into());
        }
    } else {
        names.push("raw model events/s".into());
        names.push("pipeline ÷ raw".into());
    }
    if c.broker {
        names.push("broker CPU µs per verdict".into());
    }
    names.push("mean run".into());
    names.push("wait / model / produce ms".into());
    if c.tokens {
        names.push("padding efficiency".into());
        names.push("raw unbucketed/s".into());
    }
    format!("| {} |\n|{}", names.join(" | "), "---|".repeat(names.len()))
}

/// One row of a saturation table.
fn saturation_cells(r: &SaturationRow, c: SaturationColumns) -> String {
    let opt = |v: Option<f64>, d: usize| v.map_or("-".into(), |v| format!("{v:.d$}"));
    let mut line = saturation_row(r);
    let own = r.own_process.as_ref();
    if c.cpu {
        line.push_str(&format!(
            " {} | {} | {} | {} |",
            opt(own.map(|o| o.per_s), 0),
            opt(own.and_then(|o| o.cpu_us_per_verdict), 1),
            opt(r.raw_cpu_us_per_event, 1),
            opt(r.cpu_over_raw(), 2)
        ));
    }
    if c.broker {
        line.push_str(&format!(
            " {} |",
            opt(own.and_then(|o| o.broker_cpu_us_per_verdict), 1)
        ));
    }
    line.push_str(&format!(
        " {:.1} | {:.0} / {:.1} / {:.1} |",
        r.mean_batch_size, r.batch_wait_ms, r.inference_ms, r.produce_ms
    ));
    if c.tokens {
        line.push_str(&format!(
            " {} | {} |",
            opt(r.padding_efficiency, 2),
            opt(r.raw_unbucketed_per_s, 0)
        ));
    }
    line
}

fn saturation_row(r: &SaturationRow) -> String {
    let delay = match r.target_p99_ms {
        Some(_) => format!("≤ {} ms", r.max_batch_delay_ms),
        None => format!("{} ms", r.max_batch_delay_ms),
    };
    format!(
        "| {} | {delay} | {} | {:.0} | {:.0} | {:.2} |",
        cell_name(r.max_batch_size, r.target_p99_ms),
        r.events,
        r.pipeline_per_s,
        r.raw_model_per_s,
        r.pipeline_over_raw,
    )
}

fn latency(out: &mut String, report: &Report) {
    if report.latency.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "**Latency against offered load** (open loop, intended send time to verdict read back)\n"
    );
    let _ = writeln!(
        out,
        "| batch | delay | load | offered/s | achieved/s | p50 ms | p99 ms | p99.9 ms | max ms | urgent p50 / p99 ms |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in &report.latency {
        let urgent = if r.urgent_events > 0 {
            format!("{:.1} / {:.1}", r.urgent_p50_ms, r.urgent_p99_ms)
        } else {
            "-".to_string()
        };
        let _ = writeln!(
            out,
            "| {} | {} ms | {:.0} % | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {urgent} |",
            cell_name(r.max_batch_size, r.target_p99_ms),
            r.max_batch_delay_ms,
            r.offered_fraction * 100.0,
            r.offered_per_s,
            r.achieved_per_s,
            r.p50_ms,
            r.p99_ms,
            r.p999_ms,
            r.max_ms
        );
    }
    out.push('\n');
}

fn floor(out: &mut String, report: &Report) {
    if report.broker_floor.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "**The broker's floor** (the same paced load, producer and reader, no modstream)\n\n| offered/s | events | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|"
    );
    for f in &report.broker_floor {
        let _ = writeln!(
            out,
            "| {:.0} | {} | {:.1} | {:.1} | {:.1} |",
            f.offered_per_s, f.events, f.p50_ms, f.p99_ms, f.max_ms
        );
    }
    out.push('\n');
}

fn step_table(out: &mut String, step: &StepTrace) {
    let _ = writeln!(
        out,
        "**A step in load** (target p99 {} ms; {:.0}/s, then ×{}, then back, {} s each; p99 per half second of intended send time)\n\n| phase | offered/s | events | p99 ms, median half second | p99 ms, worst half second |\n|---|---|---|---|---|",
        step.target_p99_ms, step.base_per_s, step.factor, step.phase_seconds
    );
    for (i, name) in ["before", "step", "after"].iter().enumerate() {
        let (from, to) = (
            i as f64 * step.phase_seconds,
            (i + 1) as f64 * step.phase_seconds,
        );
        let bins: Vec<_> = step
            .bins
            .iter()
            .filter(|b| b.t_s >= from && b.t_s < to)
            .collect();
        let p99: Vec<f64> = bins.iter().map(|b| b.p99_ms).collect();
        let median = modstream::tools::stats::median(&p99).unwrap_or(0.0);
        let worst = p99.iter().copied().reduce(f64::max).unwrap_or(0.0);
        let offered = bins.first().map_or(0.0, |b| b.offered_per_s);
        let events: usize = bins.iter().map(|b| b.events).sum();
        let _ = writeln!(
            out,
            "| {name} | {offered:.0} | {events} | {median:.1} | {worst:.1} |"
        );
    }
    let choices: Vec<String> = step
        .choices
        .iter()
        .take(24)
        .map(|c| format!("{:.1} s: {} / {:.1} ms", c.t_s, c.size, c.delay_ms))
        .collect();
    let more = step.choices.len().saturating_sub(choices.len());
    let _ = writeln!(
        out,
        "\nBatch choices (size / deadline): {}{}\n",
        choices.join("; "),
        if more > 0 {
            format!("; … {more} more")
        } else {
            String::new()
        }
    );
}

/// `doc` with every generated block rendered again from the bench.json it
/// names (paths relative to `root`).
pub fn splice(doc: &str, root: &Path) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = doc;
    while let Some(start) = rest.find(BEGIN) {
        let after_begin = &rest[start + BEGIN.len()..];
        let close = after_begin
            .find("-->")
            .ok_or_else(|| anyhow::anyhow!("an unclosed {BEGIN} marker"))?;
        let path = after_begin[..close].trim();
        let body_start = start + BEGIN.len() + close + 3;
        let end = rest[body_start..]
            .find(END)
            .ok_or_else(|| anyhow::anyhow!("the block of {path} has no {END}"))?
            + body_start;
        // One file: its tables; several: the runs side by side.
        let paths: Vec<&str> = path.split_whitespace().collect();
        let body = if let [one] = paths[..] {
            render(&Report::read(&root.join(one))?)
        } else {
            let runs = paths
                .iter()
                .map(|p| Ok((p.to_string(), Report::read(&root.join(p))?)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            repeats::render(&runs)
        };
        out.push_str(&rest[..body_start]);
        out.push('\n');
        out.push_str(&body);
        rest = &rest[end..];
    }
    out.push_str(rest);
    Ok(out)
}
