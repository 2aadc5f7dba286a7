//! The bench charts, drawn with plotters as SVG and PNG beside bench.json:
//!
//! - `latency`: p99 latency against achieved verdicts/s, one line per
//!   configuration (a point per offered load), the latency target as a line;
//! - `throughput`: pipeline against the raw model at saturation, per cell;
//! - `step`: the adaptive mode under a step in load: p99 per half second
//!   and the chosen batch size over time;
//! - `cache`: verdicts/s with the score cache off and on, per share of
//!   repeated texts;
//! - `cascade`: the cascade against its band's width: verdicts/s over the
//!   transformer on every event (log scale), and the verdicts' agreement
//!   with it, a line per stream.
//!
//! Text is drawn with DejaVu Sans (bench/assets/fonts, Bitstream Vera licence),
//! compiled in, so PNGs look the same on any machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use modstream::tools::report::Report;

mod bars;
use bars::{Bars, bar_chart, cache_chart, cascade_chart};

const SIZE: (u32, u32) = (960, 600);
/// The second series of the bar charts.
const GREY: RGBColor = RGBColor(150, 150, 150);
/// The fixed configurations' lines (the adaptive one is red).
const FIXED_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
];
const FONT: &str = "sans-serif";
type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Every chart the report has data for, as SVG and PNG under `dir`.
pub fn draw_all(report: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    register_font()?;
    let mut written = Vec::new();
    macro_rules! render {
        ($name:expr, $draw:ident) => {{
            let svg = dir.join(format!("{}.svg", $name));
            $draw(SVGBackend::new(&svg, SIZE).into_drawing_area(), report)
                .map_err(|e| anyhow::anyhow!("drawing {}: {e}", svg.display()))?;
            let png = dir.join(format!("{}.png", $name));
            $draw(BitMapBackend::new(&png, SIZE).into_drawing_area(), report)
                .map_err(|e| anyhow::anyhow!("drawing {}: {e}", png.display()))?;
            written.push(svg);
            written.push(png);
        }};
    }
    if !report.latency.is_empty() {
        render!("latency", latency_chart);
    }
    if !report.saturation.is_empty() {
        render!("throughput", throughput_chart);
    }
    if report.step.is_some() {
        render!("step", step_chart);
    }
    if !report.repeats.is_empty() {
        render!("cache", cache_chart);
    }
    if report.cascade.iter().any(|c| c.band.is_some()) {
        render!("cascade", cascade_chart);
    }
    Ok(written)
}

fn register_font() -> anyhow::Result<()> {
    static RESULT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = RESULT.get_or_init(|| {
        plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            include_bytes!("../assets/fonts/DejaVuSans.ttf"),
        )
        .is_ok()
    });
    anyhow::ensure!(*ok, "the chart font does not load");
    Ok(())
}

fn title(report: &Report, what: &str) -> String {
    format!(
        "{what} — {}, {} worker(s), {}",
        report.model, report.workers, report.machine
    )
}

/// p99 latency against achieved verdicts/s; one line per configuration.
// Long: one chart's drawing steps in order (axes, one series per cell,
// legend); split up, its layout would be scattered.
fn latency_chart<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Drawn<DB> {
    root.fill(&WHITE)?;
    // (adaptive?, size, delay or target) → (label, points)
    type Lines = BTreeMap<(u8, usize, u64), (String, Vec<(f64, f64)>)>;
    let mut lines = Lines::new();
    for row in &r.latency {
        let (key, label) = match row.target_p99_ms {
            Some(t) => ((1, 0, t), format!("adaptive, target p99 {t} ms")),
            None => (
                (0, row.max_batch_size, row.max_batch_delay_ms),
                format!(
                    "batch {} / {} ms",
                    row.max_batch_size, row.max_batch_delay_ms
                ),
            ),
        };
        lines
            .entry(key)
            .or_insert_with(|| (label, Vec::new()))
            .1
            .push((row.achieved_per_s, row.p99_ms.max(0.1)));
    }
    let x_max = r
        .latency
        .iter()
        .map(|l| l.achieved_per_s)
        .fold(1.0, f64::max)
        * 1.05;
    let y_max = r.latency.iter().map(|l| l.p99_ms).fold(10.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title(r, "p99 latency against throughput"), (FONT, 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("verdicts per second (achieved, open-loop paced load)")
        .y_desc("p99 latency, ms: intended send → verdict read")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let target = r.latency.iter().find_map(|l| l.target_p99_ms);
    if let Some(t) = target {
        let t = t as f64;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, t), (x_max, t)],
                8,
                5,
                BLACK.stroke_width(2),
            ))?
            .label(format!("latency target {t:.0} ms"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    }
    for (i, (key, (label, mut points))) in lines.into_iter().enumerate() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = if key.0 == 1 {
            RED.to_rgba()
        } else {
            FIXED_COLORS[i % FIXED_COLORS.len()].to_rgba()
        };
        let width = if key.0 == 1 { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(width)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
            });
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()?;
    root.present()
}

/// Pipeline against raw model at saturation, per cell.
fn throughput_chart<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Drawn<DB> {
    let labels: Vec<String> = r
        .saturation
        .iter()
        .map(|s| match s.target_p99_ms {
            Some(t) => format!("p99≤{t}ms"),
            None => format!("{}/{}ms", s.max_batch_size, s.max_batch_delay_ms),
        })
        .collect();
    let pipeline: Vec<f64> = r.saturation.iter().map(|s| s.pipeline_per_s).collect();
    let raw: Vec<f64> = r.saturation.iter().map(|s| s.raw_model_per_s).collect();
    bar_chart(
        root,
        &title(r, "saturation: pipeline vs raw model"),
        "max_batch_size / max_batch_delay (adaptive: latency target)",
        &labels,
        [
            Bars {
                legend: "pipeline: verdicts/s acknowledged".to_string(),
                colour: BLUE,
                values: pipeline,
            },
            Bars {
                legend: "raw model alone, same batch size, 1 session".to_string(),
                colour: GREY,
                values: raw,
            },
        ],
    )
}

/// The step-load trace: p99 per half second (left) and the chosen batch
/// size (right) over time.
// Long: one chart's drawing steps in order (two panels on one clock:
// p99 per half second, then the batch choices); split up, its layout would
// be scattered.
fn step_chart<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let Some(step) = &r.step else {
        return root.present();
    };
    let t_max = step.phase_seconds * 3.0;
    let target = step.target_p99_ms as f64;
    let y_max = step.bins.iter().map(|b| b.p99_ms).fold(target, f64::max) * 1.2;
    let size_max = step.choices.iter().map(|c| c.size).max().unwrap_or(1) as f64 * 1.2;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "step load, adaptive (target p99 {target:.0} ms): {:.0}/s, ×{} for {:.0} s, back — {}",
                step.base_per_s, step.factor, step.phase_seconds, r.model
            ),
            (FONT, 18),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .right_y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?
        .set_secondary_coord(0f64..t_max, 0f64..size_max);
    chart
        .configure_mesh()
        .x_desc("seconds since the paced load started")
        .y_desc("p99 latency per half second, ms")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("chosen max batch size (events)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()?;
    // The ×factor phase, shaded.
    chart.draw_series(std::iter::once(Rectangle::new(
        [(step.phase_seconds, 0.0), (2.0 * step.phase_seconds, y_max)],
        RGBColor(255, 235, 200).filled(),
    )))?;
    chart
        .draw_series(DashedLineSeries::new(
            vec![(0.0, target), (t_max, target)],
            8,
            5,
            BLACK.stroke_width(2),
        ))?
        .label(format!("latency target {target:.0} ms"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    let p99: Vec<(f64, f64)> = step
        .bins
        .iter()
        .filter(|b| b.events > 0)
        .map(|b| (b.t_s + 0.25, b.p99_ms))
        .collect();
    chart
        .draw_series(LineSeries::new(p99.clone(), RED.stroke_width(2)))?
        .label("p99 latency (left axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart.draw_series(p99.iter().map(|p| Circle::new(*p, 3, RED.filled())))?;
    // The chosen size as a step function.
    let mut steps = Vec::new();
    for (i, c) in step.choices.iter().enumerate() {
        let until = step.choices.get(i + 1).map_or(t_max, |n| n.t_s).min(t_max);
        steps.push((c.t_s.min(t_max), c.size as f64));
        steps.push((until, c.size as f64));
    }
    chart
        .draw_secondary_series(LineSeries::new(steps, BLUE.stroke_width(2)))?
        .label("chosen max batch size (right axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()?;
    root.present()
}

/// One panel of [`time_series`]: its y axis and its points (x, y).
pub struct Panel<'a> {
    pub y_label: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// Panels stacked over one x axis, as an SVG at `path` (the soak's chart:
/// RSS, p99 and the like against minutes).
pub fn time_series(
    path: &Path,
    title: &str,
    x_label: &str,
    panels: &[Panel<'_>],
) -> anyhow::Result<()> {
    register_font()?;
    let height = 220 * panels.len().max(1) as u32 + 40;
    let root = SVGBackend::new(path, (SIZE.0, height)).into_drawing_area();
    let drawn = (|| -> Drawn<SVGBackend> {
        root.fill(&WHITE)?;
        let root = root.titled(title, (FONT, 18))?;
        let x_max = panels
            .iter()
            .flat_map(|p| p.points.iter().map(|(x, _)| *x))
            .fold(1.0, f64::max);
        for (area, panel) in root
            .split_evenly((panels.len().max(1), 1))
            .iter()
            .zip(panels)
        {
            let y_max = panel.points.iter().map(|(_, y)| *y).fold(1.0, f64::max) * 1.15;
            let mut chart = ChartBuilder::on(area)
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(panel.y_label)
                .label_style((FONT, 13))
                .draw()?;
            chart.draw_series(LineSeries::new(panel.points.iter().copied(), &BLUE))?;
            chart.draw_series(
                panel
                    .points
                    .iter()
                    .map(|p| Circle::new(*p, 3, BLUE.filled())),
            )?;
        }
        root.present()
    })();
    drawn.map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))
}
