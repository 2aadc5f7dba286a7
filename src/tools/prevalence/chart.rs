//! The prevalence charts, SVG: precision and recall against the threshold
//! (`--chart`), and the intervals' widths against the number of labels
//! (`--widths`). Text in DejaVu Sans, compiled in (the bench's copy,
//! bench/assets/fonts, Bitstream Vera licence).

use std::path::Path;

use plotters::prelude::*;

use super::report::Report;
use super::widths::WidthRow;

const SIZE: (u32, u32) = (900, 560);
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

const FONT: &str = "sans-serif";

fn register_font() -> anyhow::Result<()> {
    static RESULT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = RESULT.get_or_init(|| {
        plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            include_bytes!("../../../bench/assets/fonts/DejaVuSans.ttf"),
        )
        .is_ok()
    });
    anyhow::ensure!(*ok, "the chart font does not load");
    Ok(())
}

/// Which width of a row a line draws.
type Width = fn(&WidthRow) -> f64;

fn failed(e: impl std::fmt::Display, path: &Path) -> anyhow::Error {
    anyhow::anyhow!("drawing {}: {e}", path.display())
}

/// Precision (solid) and recall (dashed by points) per label against the
/// threshold, from the report's curves.
pub fn thresholds(report: &Report, path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let area = SVGBackend::new(path, SIZE).into_drawing_area();
    area.fill(&WHITE).map_err(|e| failed(e, path))?;
    let mut chart = ChartBuilder::on(&area)
        .caption(
            "precision and recall against the threshold (95 % intervals as bars)",
            (FONT, 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0f64..1.0, 0.0f64..1.0)
        .map_err(|e| failed(e, path))?;
    chart
        .configure_mesh()
        .x_desc("threshold")
        .y_desc("precision / recall")
        .draw()
        .map_err(|e| failed(e, path))?;
    for (i, c) in report.curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        for (name, pick, filled) in [("precision", 0usize, true), ("recall", 1usize, false)] {
            let points: Vec<(f64, f64, f64, f64)> = c
                .points
                .iter()
                .filter_map(|(t, p, r)| {
                    let e = if pick == 0 { p } else { r };
                    e.as_ref().map(|e| (*t, e.value, e.low, e.high))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|p| (p.0, p.1)),
                    color.stroke_width(2),
                ))
                .map_err(|e| failed(e, path))?
                .label(format!("{} {name}", c.label))
                .legend(move |(x, y)| {
                    let style = if filled {
                        color.filled()
                    } else {
                        color.stroke_width(1)
                    };
                    Circle::new((x + 10, y), 4, style)
                });
            chart
                .draw_series(points.iter().map(|p| {
                    let style = if filled {
                        color.filled()
                    } else {
                        color.stroke_width(1)
                    };
                    Circle::new((p.0, p.1), 4, style)
                }))
                .map_err(|e| failed(e, path))?;
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.mix(0.5))),
                )
                .map_err(|e| failed(e, path))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| failed(e, path))?;
    area.present().map_err(|e| failed(e, path))?;
    Ok(())
}

/// Mean interval width against labels per 100,000 events (log scale).
pub fn widths(rows: &[WidthRow], path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let area = SVGBackend::new(path, SIZE).into_drawing_area();
    area.fill(&WHITE).map_err(|e| failed(e, path))?;
    let most = rows.iter().map(|r| r.labels).fold(1.0, f64::max) * 1.3;
    let least = rows.iter().map(|r| r.labels).fold(most, f64::min) / 1.3;
    let top = rows
        .iter()
        .flat_map(|r| [r.recall_width, r.precision_width])
        .fold(0.0, f64::max)
        * 1.1;
    let prevalence_top = rows.iter().map(|r| r.prevalence_width).fold(0.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&area)
        .caption(
            "95 % interval width against labels (100,000 events, 1 % violating, simulated)",
            (FONT, 18),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .right_y_label_area_size(64)
        .build_cartesian_2d((least..most).log_scale(), 0.0f64..top.max(0.01))
        .map_err(|e| failed(e, path))?
        .set_secondary_coord((least..most).log_scale(), 0.0f64..prevalence_top.max(0.001));
    chart
        .configure_mesh()
        .x_desc("labelled samples")
        .y_desc("recall / precision interval width")
        .draw()
        .map_err(|e| failed(e, path))?;
    chart
        .configure_secondary_axes()
        .y_desc("prevalence interval width")
        .draw()
        .map_err(|e| failed(e, path))?;
    let series: [(&str, Width, RGBColor); 2] = [
        ("recall", |r| r.recall_width, COLORS[1]),
        ("precision", |r| r.precision_width, COLORS[2]),
    ];
    for (name, of, color) in series {
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|r| (r.labels, of(r))),
                color.stroke_width(2),
            ))
            .map_err(|e| failed(e, path))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .draw_secondary_series(LineSeries::new(
            rows.iter().map(|r| (r.labels, r.prevalence_width)),
            COLORS[0].stroke_width(3),
        ))
        .map_err(|e| failed(e, path))?
        .label("prevalence (right axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[0].stroke_width(3)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| failed(e, path))?;
    area.present().map_err(|e| failed(e, path))?;
    Ok(())
}
