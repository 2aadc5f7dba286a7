//! The tables after the sweep's: what each optional bench measured
//! (matching, sampling, the score cache, the Python baseline, the shadow
//! model, delivery, input formats, models, cascades, costs, ONNX Runtime
//! sessions, memory under overload).

use std::fmt::Write;

use modstream::tools::report::{BaselineRow, Curve, CurveRow, Report, TokenBatchRow};

use super::{MIB, matching, sampling, state, traces};
use modstream::tools::stats::median;

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
    if let Some(one) = &b.python_one_thread {
        // Above the blank line that ends the table.
        out.pop();
        let _ = writeln!(
            out,
            "| Python, onnxruntime on 1 intra-op thread | {:.0} | {:.0} | {} |\n| modstream ÷ Python on 1 thread | {:.2} | {:.2} | {} |\n",
            one.per_s,
            one.peak_rss_bytes as f64 / MIB,
            cpu(one.cpu_s_per_million),
            b.modstream_per_s / one.per_s,
            b.modstream_peak_rss_bytes as f64 / one.peak_rss_bytes as f64,
            match (b.modstream_cpu_s_per_million, one.cpu_s_per_million) {
                (Some(m), Some(p)) => format!("{:.2}", m / p),
                _ => "not recorded".to_string(),
            }
        );
    }
    if let Some(floor) = &b.kcat_floor {
        out.pop();
        let _ = writeln!(
            out,
            "| kcat → kcat, the Kafka client's floor (no work per record) | {:.0} | {:.0} | {} |\n| modstream ÷ floor | {:.2} | {:.2} | {} |\n",
            floor.per_s,
            floor.peak_rss_bytes as f64 / MIB,
            // A few CPU-s per million: one decimal, or it reads as 2 for 1.5.
            floor
                .cpu_us_per_record
                .map_or("not recorded".to_string(), |v| format!("{v:.1}")),
            b.modstream_per_s / floor.per_s,
            b.modstream_peak_rss_bytes as f64 / floor.peak_rss_bytes as f64,
            floor
                .times(b.modstream_cpu_s_per_million)
                .map_or("not recorded".to_string(), |r| format!("{r:.2}"))
        );
    }
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

/// `--own-runs`: each run of the default configuration and their median.
fn own_runs(out: &mut String, report: &Report) {
    if traces::own_runs(out, report) || state::own_runs(out, report) {
        return;
    }
    let runs = &report.own_runs;
    let Some(first) = runs.first() else {
        return;
    };
    // The round's floor beside each run (`--kcat-floor`).
    let floors = runs.iter().any(|r| r.floor.is_some());
    let (floor_head, floor_rule) = match floors {
        true => (
            " kcat floor CPU µs per record | modstream ÷ floor |",
            "---|---|",
        ),
        false => ("", ""),
    };
    let _ = writeln!(
        out,
        "**`modstream run` at its default configuration**, {} runs on the same {} events (its own process; CPU between its first and last verdict)\n\n| run | verdicts/s | CPU µs per verdict | Kafka client's share | peak RSS MiB | broker CPU µs per verdict |{floor_head}\n|---|---|---|---|---|---|{floor_rule}",
        runs.len(),
        first.events
    );
    let or_dash = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    let floor_of = |r: &modstream::tools::report::OwnRun| {
        let floor = r.floor.as_ref()?;
        Some((floor.cpu_us_per_record, floor.times(r.cpu_us_per_verdict)))
    };
    for (i, r) in runs.iter().enumerate() {
        let _ = write!(
            out,
            "| {} | {:.0} | {} | {:.0} % | {:.0} | {} |",
            i + 1,
            r.per_s,
            or_dash(r.cpu_us_per_verdict),
            r.kafka_cpu_share * 100.0,
            r.peak_rss_bytes as f64 / MIB,
            or_dash(r.broker_cpu_us_per_verdict)
        );
        match (floors, floor_of(r)) {
            (false, _) => {}
            (true, Some((cpu, times))) => {
                let _ = write!(out, " {} | {} |", or_dash(cpu), or_ratio(times));
            }
            (true, None) => out.push_str(" — | — |"),
        }
        out.push('\n');
    }
    let per_s: Vec<f64> = runs.iter().map(|r| r.per_s).collect();
    let cpu: Vec<f64> = runs.iter().filter_map(|r| r.cpu_us_per_verdict).collect();
    let _ = write!(
        out,
        "| median | {:.0} | {} | | | |",
        median(&per_s).unwrap_or(0.0),
        or_dash(median(&cpu))
    );
    if floors {
        let floor: Vec<f64> = runs.iter().filter_map(|r| floor_of(r)?.0).collect();
        let times: Vec<f64> = runs.iter().filter_map(|r| floor_of(r)?.1).collect();
        let _ = write!(
            out,
            " {} | {} |",
            or_dash(median(&floor)),
            or_ratio(median(&times))
        );
    }
    out.push_str("\n\n");
}

fn or_ratio(v: Option<f64>) -> String {
    v.map_or("—".to_string(), |v| format!("{v:.2}"))
}

/// `--token-budgets`: batching by tokens against by count, saturation and
/// the same paced rates.
fn token_batching(out: &mut String, report: &Report) {
    let rows = &report.token_batching;
    let Some(first) = rows.first() else {
        return;
    };
    let name = |r: &TokenBatchRow| {
        let bound = match r.max_batch_tokens {
            None => format!("≤ {} posts", r.max_batch_size),
            Some(t) => format!("≤ {t} tokens (≤ {} posts)", r.max_batch_size),
        };
        match (r.target_p99_ms, r.max_batch_tokens) {
            (None, _) => bound,
            (Some(t), None) => format!("p99 ≤ {t} ms, counting posts ({bound})"),
            (Some(t), Some(_)) => format!("p99 ≤ {t} ms, counting tokens ({bound})"),
        }
    };
    let best_count = (rows.iter())
        .filter(|r| r.max_batch_tokens.is_none() && r.target_p99_ms.is_none())
        .map(|r| r.saturation_per_s)
        .fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "**Batching by tokens against by count**, a long-tailed mix of post lengths ({} events; most under 20 tokens, a tail to 512)\n\n| batches close at | verdicts/s at saturation | ÷ best by count | events per run | real ÷ padded tokens |\n|---|---|---|---|---|",
        first.events
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2} | {:.1} | {} |",
            name(r),
            r.saturation_per_s,
            r.saturation_per_s / best_count.max(1e-9),
            r.events_per_run,
            r.padding_efficiency
                .map_or("—".to_string(), |e| format!("{:.2}", e))
        );
    }
    let rates: Vec<f64> = first.paced.iter().map(|p| p.offered_per_s).collect();
    if rates.is_empty() {
        out.push('\n');
        return;
    }
    let header: String = rates
        .iter()
        .map(|r| format!(" p50 / p99 ms at {r:.0}/s |"))
        .collect();
    let _ = writeln!(
        out,
        "\n| batches close at |{header}\n|---|{}",
        "---|".repeat(rates.len())
    );
    for r in rows {
        let cells: String = (r.paced.iter())
            .map(|p| format!(" {:.1} / {:.1} |", p.p50_ms, p.p99_ms))
            .collect();
        let _ = writeln!(out, "| {} |{cells}", name(r));
    }
    out.push('\n');
}

/// The cost curves: each curve's points and how far its CPU per verdict
/// moved over its range.
fn curves(out: &mut String, report: &Report) {
    let mut kinds: Vec<Curve> = report.curves.iter().map(|c| c.curve).collect();
    kinds.dedup();
    for kind in kinds {
        let rows: Vec<&CurveRow> = report.curves.iter().filter(|c| c.curve == kind).collect();
        let _ = writeln!(
            out,
            "**Cost as the {} grow** (`modstream run` at its default configuration, its own process, {} events each; p99 of the default cell paced at half its verdicts/s)\n\n| {} | verdicts/s | CPU µs per verdict | peak RSS MiB | p99 ms at half |\n|---|---|---|---|---|",
            kind.unit(),
            rows[0].events,
            kind.unit()
        );
        for r in &rows {
            let tokens = r
                .mean_tokens
                .map_or(String::new(), |t| format!(" ({t:.0} tokens)"));
            let verdicts =
                (r.verdict_partitions).map_or(String::new(), |v| format!(" (verdict topic: {v})"));
            let _ = writeln!(
                out,
                "| {}{tokens}{verdicts} | {:.0} | {} | {:.0} | {:.1} |",
                r.at,
                r.per_s,
                r.cpu_us_per_verdict
                    .map_or("—".to_string(), |c| format!("{c:.1}")),
                r.peak_rss_bytes as f64 / MIB,
                r.p99_at_half_ms
            );
        }
        let cpu: Vec<f64> = rows.iter().filter_map(|r| r.cpu_us_per_verdict).collect();
        let (lo, hi) = (
            cpu.iter().copied().fold(f64::MAX, f64::min),
            cpu.iter().copied().fold(0.0, f64::max),
        );
        if cpu.len() == rows.len() && lo > 0.0 {
            let _ = writeln!(
                out,
                "\nCPU per verdict, most ÷ least over the range: {:.2}\n",
                hi / lo
            );
        } else {
            out.push('\n');
        }
    }
}

pub(super) fn extras(out: &mut String, report: &Report) {
    matching::render(out, report);
    matching::render_floods(out, report);
    matching::render_curves(out, report);
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
    own_runs(out, report);
    state::restores(out, report);
    token_batching(out, report);
    curves(out, report);
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
