//! The bench report as markdown tables: `modstream bench` writes them
//! beside bench.json (bench.md), and docs/benchmarks.md holds them between
//! markers that name the bench.json they come from, so that no figure in
//! the tables is typed by hand ([`splice`] rewrites every block from its
//! file; a test checks the docs against their files).

use std::fmt::Write;
use std::path::Path;

use modstream::tools::report::{BaselineRow, Report, SaturationRow, StepTrace};

mod matching;
mod repeats;
mod sampling;

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
    extras(&mut out, report);
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
        let mut p99: Vec<f64> = bins.iter().map(|b| b.p99_ms).collect();
        p99.sort_by(f64::total_cmp);
        let median = p99.get(p99.len() / 2).copied().unwrap_or(0.0);
        let worst = p99.last().copied().unwrap_or(0.0);
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

/// modstream at its default configuration against the plain Python consumer.
fn baseline(out: &mut String, b: &BaselineRow) {
    let cpu = |v: Option<f64>| v.map_or("not recorded".to_string(), |v| format!("{v:.0}"));
    let _ = writeln!(
        out,
        "**Against a plain Python consumer** ({} events; peak RSS of each process, VmHWM; CPU seconds of each process between its first and last verdict, per million verdicts)\n\n| job | verdicts/s | peak RSS MiB | CPU-s per million |\n|---|---|---|---|\n| modstream run (default config) | {:.0} | {:.0} | {} |\n| Python (confluent-kafka + onnxruntime) | {:.0} | {:.0} | {} |\n| modstream ÷ Python | {:.2} | {:.2} | {} |\n",
        b.events,
        b.modstream_per_s,
        b.modstream_peak_rss_bytes as f64 / MIB,
        cpu(b.modstream_cpu_s_per_million),
        b.python_per_s,
        b.python_peak_rss_bytes as f64 / MIB,
        cpu(b.python_cpu_s_per_million),
        b.modstream_per_s / b.python_per_s,
        b.modstream_peak_rss_bytes as f64 / b.python_peak_rss_bytes as f64,
        match (b.modstream_cpu_s_per_million, b.python_cpu_s_per_million) {
            (Some(m), Some(p)) => format!("{:.2}", m / p),
            _ => "not recorded".to_string(),
        }
    );
    if let (Some(m), Some(p)) = (
        b.modstream_broker_cpu_us_per_verdict,
        b.python_broker_cpu_us_per_verdict,
    ) {
        let _ = writeln!(
            out,
            "The broker's CPU while each ran (`--broker-pid`), µs per verdict: {m:.1} beside modstream, {p:.1} beside Python.\n"
        );
    }
}

fn extras(out: &mut String, report: &Report) {
    matching::render(out, report);
    matching::render_floods(out, report);
    sampling::render(out, report);
    if !report.repeats.is_empty() {
        let _ = writeln!(
            out,
            "**The score cache against repeated texts** (batch 64 / 20 ms, saturation)\n\n| repeated texts | cache bytes | cache off/s | cache on/s | on ÷ off |\n|---|---|---|---|---|"
        );
        for r in &report.repeats {
            let _ = writeln!(
                out,
                "| {:.0} % | {} MiB | {:.0} | {:.0} | {:.2} |",
                r.repeat_share * 100.0,
                r.cache_bytes >> 20,
                r.cache_off_per_s,
                r.cache_on_per_s,
                r.cache_on_per_s / r.cache_off_per_s
            );
        }
        out.push('\n');
    }
    if let Some(b) = &report.baseline {
        baseline(out, b);
    }
    if let Some(s) = &report.shadow {
        let _ = writeln!(
            out,
            "**A shadow model's cost** (batch 64 / 20 ms, saturation, the shadow scoring every event)\n\n| shadow model | live verdicts/s without | with | with ÷ without |\n|---|---|---|---|\n| {} | {:.0} | {:.0} | {:.2} |\n",
            s.shadow_model,
            s.off_per_s,
            s.on_per_s,
            s.on_per_s / s.off_per_s
        );
    }
    delivery(out, report);
    formats(out, report);
    models(out, report);
    cascade(out, report);
    cost(out, report);
    session(out, report);
    if let Some(o) = &report.overload {
        let _ = writeln!(
            out,
            "**Memory under overload** (a separate `modstream run`, peak RSS)\n\n| offered | events | seconds | peak RSS MiB | at 25 % load MiB |\n|---|---|---|---|---|\n| {:.0}× saturation ({:.0}/s) | {} | {:.1} | {:.0} | {:.0} |\n",
            o.offered_multiple,
            o.offered_per_s,
            o.events,
            o.seconds,
            o.peak_rss_bytes as f64 / MIB,
            o.light_load_peak_rss_bytes as f64 / MIB
        );
        if let Some(bound) = o.bound_bytes {
            let _ = writeln!(
                out,
                "The bound (the light-load peak + `limits.max_in_flight_bytes` + 64 MiB): {:.0} MiB, {}.\n",
                bound as f64 / MIB,
                if o.peak_rss_bytes <= bound {
                    "held"
                } else {
                    "exceeded"
                }
            );
        }
    }
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

fn delivery(out: &mut String, report: &Report) {
    let Some(alo) = report.delivery.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "**At-least-once against exactly-once** (batch 64 / 20 ms; saturation, then paced at half the at-least-once saturation, latency to a `read_committed` reader)\n\n| delivery | commit_interval | verdicts/s at saturation | ÷ at-least-once | aborted and read again | offered/s | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|---|---|---|"
    );
    for r in &report.delivery {
        let _ = writeln!(
            out,
            "| {} | {} ms | {:.0} | {:.2} | {} | {:.0} | {:.1} | {:.1} | {:.1} |",
            r.delivery,
            r.commit_interval_ms,
            r.saturation_per_s,
            r.saturation_per_s / alo.saturation_per_s,
            r.rewinds,
            r.offered_per_s,
            r.p50_ms,
            r.p99_ms,
            r.max_ms
        );
    }
    let _ = writeln!(out);
}

fn models(out: &mut String, report: &Report) {
    let Some(one) = report.models.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "**One model against two** (batch 64 / 20 ms; the same events; saturation, then paced at half of it; model time: every model's runs summed, per verdict)\n\n| models | second model scores | verdicts/s at saturation | ÷ first | p50 ms | p99 ms | µs in model runs per verdict |\n|---|---|---|---|---|---|---|"
    );
    for r in &report.models {
        let _ = writeln!(
            out,
            "| {} | {:.0} % | {:.0} | {:.2} | {:.1} | {:.1} | {:.0} |",
            r.contender,
            r.second_share * 100.0,
            r.saturation_per_s,
            r.saturation_per_s / one.saturation_per_s,
            r.p50_ms,
            r.p99_ms,
            r.model_us_per_verdict
        );
    }
    let _ = writeln!(out);
}

fn formats(out: &mut String, report: &Report) {
    let Some(json) = report.formats.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "**Input formats** (batch 64 / 20 ms; the same events; saturation, then paced at half of it; decoding: value to event with its mapping, one thread)\n\n| format | verdicts/s at saturation | ÷ first | p50 ms | p99 ms | decode µs/event | share of an event's CPU |\n|---|---|---|---|---|---|---|"
    );
    for r in &report.formats {
        let _ = writeln!(
            out,
            "| {:?} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} % |",
            r.format,
            r.saturation_per_s,
            r.saturation_per_s / json.saturation_per_s,
            r.p50_ms,
            r.p99_ms,
            r.decode_us,
            r.decode_share * 100.0
        );
    }
    let _ = writeln!(out);
}

fn cascade(out: &mut String, report: &Report) {
    if report.cascade.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "**A cheap model first** (batch 64 / 20 ms; saturation; the transformer only where the first model's `offensive` score is in the band; agreement: the share of events whose verdict is the one the transformer on every event gave; that reference ran before the bands and after them: its row has the faster run and the second run's agreement with the first; ÷ band 0–1: against the cascade whose band takes every score, the same transformer work in the same two-model shape; model time: every model's runs summed, wall time in the workers, per verdict)\n\n| stream | band | to the transformer | verdicts/s | ÷ transformer on every event | ÷ band 0–1 | agreement | µs in model runs per verdict |\n|---|---|---|---|---|---|---|---|"
    );
    for r in &report.cascade {
        let whole = report
            .cascade
            .iter()
            .find(|w| w.stream == r.stream && w.band == Some([0.0, 1.0]))
            .map_or("—".to_string(), |w| {
                format!("{:.2}", r.saturation_per_s / w.saturation_per_s)
            });
        let band = r
            .band
            .map_or("transformer on every event".to_string(), |[f, t]| {
                format!("{f}–{t}")
            });
        let _ = writeln!(
            out,
            "| {} | {band} | {:.1} % | {:.0} | {:.2} | {whole} | {:.2} % | {} |",
            r.stream,
            r.transformer_share * 100.0,
            r.saturation_per_s,
            r.over_every_event,
            r.agreement * 100.0,
            r.model_us_per_verdict
                .map_or("—".to_string(), |us| format!("{us:.0}"))
        );
    }
    let _ = writeln!(out);
}

fn cost(out: &mut String, report: &Report) {
    let Some(first) = report.cost.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "**What a verdict costs** ({} events; `modstream run` at its default configuration as its own process: verdicts/s from the verdicts' timestamps, CPU seconds of the process between its first and last verdict per million verdicts, the share of them in the Kafka client's threads, peak RSS; the latency target at saturation; p99 of the default cell at half the default's verdicts/s; raw: the model alone at its best on all cores)\n\n| contender | raw verdicts/s | modstream verdicts/s | ÷ raw | CPU-s per million | Kafka client's share | peak RSS MiB | with p99 ≤ {} ms: verdicts/s | p99 ms at half load | Python verdicts/s | Python CPU-s per million | Python peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|",
        first.events, first.target_p99_ms
    );
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "—".to_string());
    for r in &report.cost {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {:.1} % | {:.0} | {:.0} | {:.1} | {} | {} | {} |",
            r.contender,
            or_dash(
                r.raw_per_s
                    .map(|v| format!("{v:.0} ({})", r.raw_layout.as_deref().unwrap_or("")))
            ),
            r.default_per_s,
            or_dash(r.raw_per_s.map(|v| format!("{:.2}", r.default_per_s / v))),
            or_dash(r.cpu_s_per_million.map(|v| format!("{v:.0}"))),
            r.kafka_cpu_share * 100.0,
            r.peak_rss_bytes as f64 / MIB,
            r.target_per_s,
            r.p99_at_half_ms,
            or_dash(r.python_per_s.map(|v| format!("{v:.0}"))),
            or_dash(r.python_cpu_s_per_million.map(|v| format!("{v:.0}"))),
            or_dash(
                r.python_peak_rss_bytes
                    .map(|v| format!("{:.0}", v as f64 / MIB))
            ),
        );
    }
    let _ = writeln!(out);
}

fn session(out: &mut String, report: &Report) {
    let Some(first) = report.session.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "**Session options** ({} events; `modstream run` with one option changed, its own process: verdicts/s, CPU seconds per million verdicts, peak RSS; one session in the bench's process: load time, median of 3, and CPU seconds per second at a light load, a batch of 2 every 50 ms)\n\n| contender | verdicts/s | ÷ default | CPU-s per million | peak RSS MiB | session load ms | CPU at light load, cores |\n|---|---|---|---|---|---|---|",
        first.events
    );
    for r in &report.session {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2} | {} | {:.0} | {:.0} | {:.2} |",
            r.contender,
            r.per_s,
            r.per_s / first.per_s,
            r.cpu_s_per_million
                .map_or("—".to_string(), |v| format!("{v:.0}")),
            r.peak_rss_bytes as f64 / MIB,
            r.load_ms,
            r.light_load_cores
        );
    }
    let _ = writeln!(out);
    if let Some(t) = &report.tokenization {
        let _ = writeln!(
            out,
            "Tokenizing ({} posts, the model's tokenizer, one thread): {:.1} µs per post, {:.1} % of scoring it ({:.0} µs per post, tokenizing included, one session, one thread, batches of 32).\n",
            t.posts,
            t.tokenize_us,
            t.tokenize_us / t.score_us * 100.0,
            t.score_us
        );
    }
}
