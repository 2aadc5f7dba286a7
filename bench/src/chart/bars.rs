//! The bar charts (throughput against the raw model, the score cache) and
//! the cascade's chart.

use plotters::coord::Shift;
use plotters::prelude::*;

use modstream::tools::report::Report;

use super::{Drawn, FIXED_COLORS, FONT, GREY, SIZE, title};

/// One series of a bar chart: one value per label.
pub(super) struct Bars {
    pub(super) legend: String,
    pub(super) colour: RGBColor,
    pub(super) values: Vec<f64>,
}

/// Two bars per group, one of each series; a value that is not finite draws
/// no bar.
pub(super) fn bar_chart<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    caption: &str,
    x_desc: &str,
    labels: &[String],
    series: [Bars; 2],
) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let y_max = series
        .iter()
        .flat_map(|bars| bars.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.15;
    let n = labels.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, (FONT, 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1))
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc(x_desc)
        .y_desc("events per second")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .draw()?;
    for (
        k,
        Bars {
            legend,
            colour: color,
            values,
        },
    ) in series.into_iter().enumerate()
    {
        let offset = if k == 0 { -0.19 } else { 0.19 };
        chart
            .draw_series(
                values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(i, v)| {
                        let x = i as f64 + offset;
                        Rectangle::new([(x - 0.18, 0.0), (x + 0.18, *v)], color.filled())
                    }),
            )?
            .label(legend)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
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

/// Score cache off and on, per share of repeated texts.
pub(super) fn cache_chart<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    r: &Report,
) -> Drawn<DB> {
    let labels: Vec<String> = r
        .repeats
        .iter()
        .map(|x| format!("{:.0} % repeated", x.repeat_share * 100.0))
        .collect();
    let cache_mib = r.repeats.first().map_or(0, |x| x.cache_bytes >> 20);
    bar_chart(
        root,
        &title(r, "score cache at saturation, batch 64 / 20 ms"),
        "share of posts whose text repeats an earlier post exactly",
        &labels,
        [
            Bars {
                legend: "cache off".to_string(),
                colour: GREY,
                values: r.repeats.iter().map(|x| x.cache_off_per_s).collect(),
            },
            Bars {
                legend: format!("cache on ({cache_mib} MiB)"),
                colour: BLUE,
                values: r.repeats.iter().map(|x| x.cache_on_per_s).collect(),
            },
        ],
    )
}

/// The cascade sweep: speed-up (left, log) and agreement (right) against
/// the band's width, one line per stream.
// Long: one chart's drawing steps in order (two panels on one x axis, a
// line per stream in each); split up, its layout would be scattered.
pub(super) fn cascade_chart<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    r: &Report,
) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let root = root.titled(
        &title(r, "a cheap model first: the transformer only in a band"),
        (FONT, 18),
    )?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let mut streams: Vec<&str> = r.cascade.iter().map(|c| c.stream.as_str()).collect();
    streams.dedup();
    let points = |stream: &str,
                  y: &dyn Fn(&modstream::tools::report::CascadeRow) -> f64|
     -> Vec<(f64, f64)> {
        r.cascade
            .iter()
            .filter(|c| c.stream == stream)
            .filter_map(|c| c.band.map(|[f, t]| (f64::from(t - f), y(c))))
            .collect()
    };
    let top = r
        .cascade
        .iter()
        .map(|c| c.over_every_event)
        .fold(2.0, f64::max)
        * 1.5;
    let mut speed = ChartBuilder::on(&left)
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..1f64, (0.5f64..top).log_scale())?;
    speed
        .configure_mesh()
        .x_desc("band width (to − from)")
        .y_desc("verdicts/s ÷ transformer on every event")
        .y_label_formatter(&|v| format!("{v:.1}×"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()?;
    let mut agree = ChartBuilder::on(&right)
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..1f64, 50f64..100.5f64)?;
    agree
        .configure_mesh()
        .x_desc("band width (to − from)")
        .y_desc("verdicts as the transformer on every event gave, %")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .draw()?;
    for (k, stream) in streams.iter().enumerate() {
        let color = FIXED_COLORS[k % FIXED_COLORS.len()];
        let s = points(stream, &|c| c.over_every_event);
        speed
            .draw_series(LineSeries::new(s.clone(), color.stroke_width(2)))?
            .label(format!("{stream} stream"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        speed.draw_series(s.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        let a = points(stream, &|c| c.agreement * 100.0);
        agree.draw_series(LineSeries::new(a.clone(), color.stroke_width(2)))?;
        agree.draw_series(a.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    speed
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()?;
    root.present()
}
