//! The SVG plots: `results.svg` (every scenario against its floor) and
//! `chain.svg` (restore time against the number of turns). SVG only, no
//! fonts or bitmap codecs (`plotters` with the SVG backend).

use anyhow::{anyhow, Result};

use super::types::{ChainSummary, Report, Scenario};
use super::units::secs;
use crate::workload::MIB;

/// Horizontal bars: every scenario's median time, its floor as a black
/// marker, floors as grey bars.
pub(super) fn results(r: &Report) -> Result<String> {
    use plotters::coord::ranged1d::SegmentValue;
    use plotters::prelude::*;
    // The chain rows have their own plot (`chain.svg`); they are drawn here
    // only when nothing else ran.
    let others = r.scenarios.iter().any(|s| !s.id.starts_with("chain-"));
    let rows: Vec<&Scenario> = r
        .scenarios
        .iter()
        .rev()
        .filter(|s| !(others && s.id.starts_with("chain-")))
        .collect();
    let n = rows.len().max(1);
    let xmax = rows
        .iter()
        .flat_map(|s| [s.median_ms, s.floor_ms.unwrap_or(0.0)])
        .fold(1.0f64, f64::max)
        / 1000.0
        * 1.3;
    let mut svg = String::new();
    {
        let height = 90 + 30 * n as u32;
        let root = SVGBackend::with_string(&mut svg, (1100, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
        let title = match (&r.chain, r.payload_bytes) {
            (Some(c), 0) => format!(
                "deltapack bench, scale {} ({} MB chain result): median time vs floor",
                r.scale,
                c.result_bytes / 1_000_000
            ),
            _ => format!(
                "deltapack bench, scale {} ({} MB delta): median time vs floor",
                r.scale,
                r.payload_bytes / 1_000_000
            ),
        };
        let labels: Vec<String> = rows.iter().map(|s| s.label.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(390)
            .build_cartesian_2d(0.0..xmax, (0..n).into_segmented())
            .map_err(|e| anyhow!("plot: {e}"))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE)
            .x_desc("seconds (grey: floors; black mark: the scenario's floor; green: ≤ 1.25× its floor, orange: above)")
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(|e| anyhow!("plot: {e}"))?;
        let colour = |s: &Scenario| match (s.group, s.ratio) {
            ("floor", _) => RGBColor(170, 170, 170),
            (_, Some(x)) if x <= 1.25 => RGBColor(60, 140, 80),
            (_, Some(_)) => RGBColor(210, 110, 40),
            _ => RGBColor(70, 110, 180),
        };
        chart
            .draw_series(
                rows.iter()
                    .enumerate()
                    .map(|(i, s)| row_bar(i, 0.0, s.median_ms / 1000.0, colour(s).filled(), 5)),
            )
            .map_err(|e| anyhow!("plot: {e}"))?;
        chart
            .draw_series(rows.iter().enumerate().filter_map(|(i, s)| {
                let f = s.floor_ms? / 1000.0;
                Some(row_bar(i, f, f + xmax * 0.004, BLACK.filled(), 2))
            }))
            .map_err(|e| anyhow!("plot: {e}"))?;
        chart
            .draw_series(rows.iter().enumerate().map(|(i, s)| {
                let text = match s.ratio {
                    Some(x) => format!("{}  ({x:.2}× floor)", secs(s.median_ms)),
                    None => secs(s.median_ms),
                };
                Text::new(
                    text,
                    (
                        s.median_ms / 1000.0 + xmax * 0.005,
                        SegmentValue::CenterOf(i),
                    ),
                    ("sans-serif", 13),
                )
            }))
            .map_err(|e| anyhow!("plot: {e}"))?;
        root.present().map_err(|e| anyhow!("plot: {e}"))?;
    }
    Ok(svg)
}

/// A horizontal bar across row `i` of a segmented chart, from `x0` to `x1`,
/// `inset` pixels short of the row's top and bottom.
fn row_bar(
    i: usize,
    x0: f64,
    x1: f64,
    style: plotters::style::ShapeStyle,
    inset: u32,
) -> plotters::element::Rectangle<(f64, plotters::coord::ranged1d::SegmentValue<usize>)> {
    use plotters::coord::ranged1d::SegmentValue;
    let mut bar = plotters::element::Rectangle::new(
        [
            (x0, SegmentValue::Exact(i)),
            (x1, SegmentValue::Exact(i + 1)),
        ],
        style,
    );
    bar.set_margin(inset, inset, 0, 0);
    bar
}

/// Restore time against the number of turns (x: log2 N, labelled N), two
/// panels: local (chain new buffer and `restore_into`) and S3-like; the
/// flat restores are dashed horizontal references in the same colours.
pub(super) fn chain(r: &Report, c: &ChainSummary) -> Result<String> {
    // Longer than 120 lines on purpose: plotters builds a figure as one
    // sequence of calls (mesh, series, legends per panel) on shared state.
    use plotters::prelude::*;
    type Line = (&'static str, RGBColor, Vec<Option<f64>>, Option<f64>);
    let e = |e: &dyn std::fmt::Display| anyhow!("chain plot: {e}");
    let xs: Vec<f64> = c.rows.iter().map(|r| f64::from(r.turns).log2()).collect();
    let (x0, x1) = (-0.5, xs.iter().copied().fold(0.0, f64::max) + 0.9);
    let local: Vec<Line> = vec![
        (
            "local, warm, new buffer",
            RGBColor(60, 140, 80),
            c.rows.iter().map(|r| r.warm_ms).collect(),
            c.flat_warm_ms,
        ),
        (
            "local, warm, restore_into",
            RGBColor(70, 110, 180),
            c.rows.iter().map(|r| r.into_ms).collect(),
            c.flat_into_ms,
        ),
    ];
    let s3: Vec<Line> = vec![(
        "S3-like",
        RGBColor(210, 110, 40),
        c.rows.iter().map(|r| r.s3like_ms).collect(),
        c.flat_s3like_ms,
    )];
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let root = root
            .titled(
                &format!(
                    "deltapack bench chain, scale {} ({} MiB result): restore of the last turn, fresh process",
                    r.scale,
                    c.result_bytes / MIB
                ),
                ("sans-serif", 18),
            )
            .map_err(|x| e(&x))?;
        let (left, right) = root.split_horizontally(600);
        let s3_title = format!("S3-like ({} ms per GET)", c.latency_ms);
        for (area, title, lines) in [
            (&left, "local disk, warm page cache", &local),
            (&right, s3_title.as_str(), &s3),
        ] {
            let ymax = lines
                .iter()
                .flat_map(|l| l.2.iter().copied().chain([l.3]))
                .flatten()
                .fold(1.0f64, f64::max)
                / 1000.0
                * 1.25;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 15))
                .margin(14)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(x0..x1, 0.0..ymax)
                .map_err(|x| e(&x))?;
            let labels = xs.clone();
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .x_desc("turns (log scale; dashed: the flat root)")
                .y_desc("seconds (median)")
                .x_labels(((x1 - x0) * 2.0) as usize)
                .x_label_formatter(&|v| {
                    labels
                        .iter()
                        .find(|x| (*x - v).abs() < 0.05)
                        .map(|x| format!("{:.0}", x.exp2()))
                        .unwrap_or_default()
                })
                .draw()
                .map_err(|x| e(&x))?;
            for (name, colour, ys, flat) in lines.iter() {
                let pts: Vec<(f64, f64)> = xs
                    .iter()
                    .zip(ys)
                    .filter_map(|(x, y)| y.map(|y| (*x, y / 1000.0)))
                    .collect();
                let colour = *colour;
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        pts.clone(),
                        colour.stroke_width(2),
                    )))
                    .map_err(|x| e(&x))?
                    .label(format!("chain, {name}"))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 4, colour.filled())))
                    .map_err(|x| e(&x))?;
                chart
                    .draw_series(pts.iter().map(|&(x, y)| {
                        Text::new(secs(y * 1000.0), (x + 0.08, y), ("sans-serif", 12))
                    }))
                    .map_err(|x| e(&x))?;
                if let Some(f) = flat {
                    let f = f / 1000.0;
                    // Dashed by hand (the build has no series features).
                    let dash = (x1 - x0) / 60.0;
                    chart
                        .draw_series((0..60).step_by(2).map(|i| {
                            let a = x0 + i as f64 * dash;
                            PathElement::new(vec![(a, f), (a + dash, f)], colour.stroke_width(1))
                        }))
                        .map_err(|x| e(&x))?
                        .label(format!("flat root, {name}: {}", secs(f * 1000.0)))
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 8, y)], colour.stroke_width(1))
                        });
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|x| e(&x))?;
        }
        root.present().map_err(|x| e(&x))?;
    }
    Ok(svg)
}
