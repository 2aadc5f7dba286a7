//! The bench chart: throughput and p99 latency against batch size, as SVG.

use std::path::PathBuf;

use super::report::Report;

/// Redraw the chart of a saved report (`bench.json` → `bench.svg` beside it).
pub fn replot(report_path: &std::path::Path) -> anyhow::Result<PathBuf> {
    let report: Report = serde_json::from_str(&std::fs::read_to_string(report_path)?)?;
    let svg = report_path.with_extension("svg");
    std::fs::write(&svg, chart(&report))?;
    Ok(svg)
}

/// Throughput and p99 latency against batch size (first delay, highest load
/// below saturation), as a small SVG.
pub fn chart(report: &Report) -> String {
    let delay = report
        .saturation
        .first()
        .map_or(0, |r| r.max_batch_delay_ms);
    let tput: Vec<(f64, f64)> = report
        .saturation
        .iter()
        .filter(|r| r.max_batch_delay_ms == delay)
        .map(|r| (r.max_batch_size as f64, r.pipeline_per_s))
        .collect();
    // The highest load below saturation (at 100 % queues dominate).
    let loads: Vec<f64> = report.latency.iter().map(|r| r.offered_fraction).collect();
    let below: Vec<f64> = loads.iter().copied().filter(|f| *f < 1.0).collect();
    let top_load = if below.is_empty() { &loads } else { &below }
        .iter()
        .copied()
        .fold(0.0, f64::max);
    let p99: Vec<(f64, f64)> = report
        .latency
        .iter()
        .filter(|r| r.offered_fraction == top_load)
        .map(|r| (r.max_batch_size as f64, r.p99_ms))
        .collect();
    let (w, h, m) = (640.0, 400.0, 70.0);
    let xmax = tput.iter().map(|p| p.0.log2()).fold(1.0, f64::max);
    let x = |b: f64| m + (b.log2() / xmax) * (w - 2.0 * m);
    let line = |points: &[(f64, f64)], color: &str| {
        let ymax = points.iter().map(|p| p.1).fold(1e-9, f64::max);
        let pts: Vec<String> = points
            .iter()
            .map(|(b, v)| format!("{:.1},{:.1}", x(*b), h - m - v / ymax * (h - 2.0 * m)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        )
    };
    let ticks: String = tput
        .iter()
        .map(|(b, _)| {
            format!(
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{b}</text>",
                x(*b),
                h - m + 16.0
            )
        })
        .collect();
    let tmax = tput.iter().map(|p| p.1).fold(0.0, f64::max);
    let lmax = p99.iter().map(|p| p.1).fold(0.0, f64::max);
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<text x=\"{m}\" y=\"20\" font-size=\"14\">modstream vs max_batch_size (log scale)</text>\
<text x=\"{m}\" y=\"38\" font-size=\"12\" fill=\"steelblue\">throughput at saturation, verdicts/s (top = {tmax:.0})</text>\
<text x=\"{m}\" y=\"54\" font-size=\"12\" fill=\"firebrick\">p99 latency at {:.0}% of saturation, ms (top = {lmax:.1})</text>\
<line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>{ticks}{}{}</svg>\n",
        top_load * 100.0,
        h - m,
        w - m,
        h - m,
        line(&tput, "steelblue"),
        line(&p99, "firebrick")
    )
}
