//! `--plot out.svg`: what differs between the policies against overcommit, one line per
//! policy, in four panels: all containers within one NUMA node; within one NUMA node where one
//! fit, on an axis zoomed to the policies that place (the others are named "off scale"); the
//! NUMA imbalance of requested CPUs and of CPU limits (max/mean). A panel whose figure has a
//! goal ([`crate::goals::GOALS`]) draws its threshold as a dashed line.

use crate::goals::{Goal, Metric, GOALS};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// One trace's figures for one policy; shares in 0..=1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Measured overcommit (sum of limits / CPUs).
    pub overcommit: f64,
    pub one_numa: f64,
    pub one_numa_where_fits: f64,
    /// max/mean of requested CPUs per NUMA node.
    pub imbalance: f64,
    /// max/mean of CPU limits (requests where none) per NUMA node.
    pub limit_imbalance: f64,
}

/// One policy's curve.
pub struct Series {
    pub label: String,
    pub points: Vec<Point>,
}

/// A panel: its caption, the value it shows, and its y range.
struct Panel {
    caption: &'static str,
    y_desc: &'static str,
    value: fn(&Point) -> f64,
    range: (f64, f64),
    /// The figure's goal, if it has one; its threshold in the panel's unit.
    goal: Option<(Goal, f64)>,
}

/// The goal of `metric`, with its threshold scaled to a panel's unit.
fn goal_of(metric: Metric, scale: f64) -> Option<(Goal, f64)> {
    GOALS
        .iter()
        .find(|g| g.metric == metric)
        .map(|g| (*g, g.threshold * scale))
}

/// The lower end of the zoomed locality axis: just below the lowest value of the policies
/// whose values all lie above 50% (the engine's), never above 95%.
fn zoom_floor(series: &[Series]) -> f64 {
    let low = series
        .iter()
        .filter(|s| s.points.iter().all(|p| p.one_numa_where_fits > 0.5))
        .flat_map(|s| s.points.iter().map(|p| p.one_numa_where_fits * 100.0))
        .fold(f64::INFINITY, f64::min);
    if low.is_finite() {
        (low - 1.0).floor().min(95.0)
    } else {
        0.0
    }
}

pub fn plot(path: &std::path::Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (2200, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let areas = root.split_evenly((1, 4));
    let (x0, x1) = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.overcommit))
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 <= x1 {
        (x0 - 0.1, x1 + 0.1)
    } else {
        (0.0, 3.5)
    };
    for (panel, area) in panels(series).iter().zip(areas.iter()) {
        draw_panel(panel, area, series, (x0, x1))?;
    }
    root.present()?;
    Ok(())
}

/// The four panels, their ranges fitted to `series`.
fn panels(series: &[Series]) -> [Panel; 4] {
    // A max/mean panel: from 1 to just above the highest value, at least to `at_least`.
    let ratio = |caption, value: fn(&Point) -> f64, at_least: f64, metric| {
        let top = series
            .iter()
            .flat_map(|s| s.points.iter().map(value))
            .fold(1.0_f64, f64::max);
        Panel {
            caption,
            y_desc: "max/mean",
            value,
            range: (1.0, (top + 0.02).max(at_least)),
            goal: goal_of(metric, 1.0),
        }
    };
    [
        Panel {
            caption: "containers within one NUMA node (%)",
            y_desc: "%",
            value: |p| p.one_numa * 100.0,
            range: (0.0, 105.0),
            goal: None,
        },
        Panel {
            caption: "within one NUMA node where one fit (%, zoomed)",
            y_desc: "%",
            value: |p| p.one_numa_where_fits * 100.0,
            range: (zoom_floor(series), 100.5),
            goal: goal_of(Metric::OneNumaWhereFits, 100.0),
        },
        ratio(
            "NUMA imbalance of requested CPUs (max/mean)",
            |p| p.imbalance,
            1.1,
            Metric::ImbalanceByRequest,
        ),
        ratio(
            "NUMA imbalance of CPU limits (max/mean)",
            |p| p.limit_imbalance,
            1.25,
            Metric::ImbalanceByLimit,
        ),
    ]
}

fn draw_panel<DB: DrawingBackend>(
    panel: &Panel,
    area: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[Series],
    (x0, x1): (f64, f64),
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let (y0, y1) = panel.range;
    let mut chart = ChartBuilder::on(area)
        .caption(panel.caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc("overcommit (sum of limits / CPUs, measured)")
        .y_desc(panel.y_desc)
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|p| (p.overcommit, (panel.value)(p)))
            .collect();
        let visible = pts.iter().all(|p| p.1 >= y0 && p.1 <= y1);
        let label = if visible {
            s.label.clone()
        } else {
            format!("{} (off scale)", s.label)
        };
        let kept: Vec<(f64, f64)> = pts.into_iter().filter(|p| p.1 >= y0 && p.1 <= y1).collect();
        line(&mut chart, kept.clone(), color.stroke_width(2), label)?;
        chart.draw_series(kept.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    if let Some((g, y)) = panel.goal {
        let label = format!("goal ({}): {}", g.policy, g.threshold_text());
        let dash = DashedLineSeries::new(vec![(x0, y), (x1, y)], 8, 5, BLACK.stroke_width(1));
        chart
            .draw_series(dash)?
            .label(label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(1)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerLeft)
}

/// A chart of both axes in `f64`.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// `points` as a line of `style`, named `label` in the legend by a stroke of that style.
fn line<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    points: Vec<(f64, f64)>,
    style: ShapeStyle,
    label: String,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .draw_series(LineSeries::new(points, style))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    Ok(())
}

/// The legend, at `position`.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// `--rebalance --rebalance-plot out.svg`: usage imbalance (max/mean over NUMA nodes) per
/// sampling round against simulated time, one line per run, and the rebalancer's threshold.
pub fn plot_timeline(
    path: &std::path::Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    threshold: f64,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let pts = || series.iter().flat_map(|s| s.1.iter());
    let (x0, x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (x0, x1) = if x0 < x1 { (x0, x1) } else { (0.0, 1.0) };
    let y1 = pts().fold(threshold, |m, p| m.max(p.1)) + 0.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(x0..x1, 1.0..y1)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc("usage imbalance (max/mean over NUMA nodes)")
        .draw()?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        line(
            &mut chart,
            points.clone(),
            color.stroke_width(2),
            label.clone(),
        )?;
    }
    let level = vec![(x0, threshold), (x1, threshold)];
    let label = format!("threshold {threshold}");
    line(&mut chart, level, BLACK.stroke_width(1), label)?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(label: &str, fits: &[f64]) -> Series {
        Series {
            label: label.into(),
            points: fits
                .iter()
                .enumerate()
                .map(|(i, f)| Point {
                    overcommit: 1.0 + i as f64,
                    one_numa: *f,
                    one_numa_where_fits: *f,
                    imbalance: 1.1,
                    limit_imbalance: 1.2,
                })
                .collect(),
        }
    }

    #[test]
    fn zoom_follows_the_placing_policies() {
        let s = [
            series("kubelet", &[0.05, 0.06]),
            series("topology-aware", &[0.974, 0.99]),
            series("numa-aware", &[1.0, 1.0]),
        ];
        assert_eq!(zoom_floor(&s), 95.0, "at least 95-100 shown");
        assert_eq!(zoom_floor(&[series("kubelet", &[0.05])]), 0.0);
        assert_eq!(zoom_floor(&[series("x", &[0.6])]), 59.0);
    }

    /// The SVG `draw` writes to the path it is given (in a folder of its own, `name`).
    fn drawn(name: &str, draw: impl FnOnce(&std::path::Path) -> anyhow::Result<()>) -> String {
        let dir = std::env::temp_dir().join(format!("tap-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("out.svg");
        draw(&path).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("svg");
        let _ = std::fs::remove_dir_all(&dir);
        svg
    }

    #[test]
    fn plot_names_policies_off_scale() {
        let s = [
            series("kubelet", &[0.05, 0.06]),
            series("topology-aware", &[0.97, 0.99]),
        ];
        let svg = drawn("plot", |path| plot(path, "t", &s));
        assert!(
            svg.contains("kubelet (off scale)"),
            "the zoomed panel names what it leaves out"
        );
        assert!(svg.contains("NUMA imbalance of requested CPUs"));
        assert!(svg.contains("NUMA imbalance of CPU limits"));
        let goals = svg.matches("goal (topology-aware)").count();
        assert_eq!(goals, 3, "a dashed line per goal, in its panel's legend");
    }

    #[test]
    fn timeline_draws_each_run_and_the_threshold() {
        let runs = [
            ("without".to_string(), vec![(0.0, 1.4), (10.0, 1.5)]),
            ("with".to_string(), vec![(0.0, 1.2), (10.0, 1.1)]),
        ];
        let svg = drawn("timeline", |path| plot_timeline(path, "t", &runs, 1.15));
        for label in ["without", "with", "threshold 1.15"] {
            assert!(svg.contains(label), "{label}");
        }
    }
}
