//! `--plot out.svg`: locality against overcommit, one line per policy.

use plotters::prelude::*;

/// One policy's curve: (overcommit, share within one NUMA node, share within one NUMA node
/// where one fits), shares in 0..=1.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64, f64)>,
}

pub fn plot(path: &std::path::Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let panels = root.split_evenly((1, 2));
    let (x0, x1) = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 <= x1 {
        (x0 - 0.1, x1 + 0.1)
    } else {
        (0.0, 3.5)
    };
    let captions = [
        "containers within one NUMA node (%)",
        "within one NUMA node where one fit (%)",
    ];
    for (k, panel) in panels.iter().enumerate() {
        let mut chart = ChartBuilder::on(panel)
            .caption(captions[k], ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(x0..x1, 0.0..105.0)?;
        chart
            .configure_mesh()
            .x_desc("overcommit (sum of limits / CPUs, measured)")
            .y_desc("%")
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|p| (p.0, if k == 0 { p.1 } else { p.2 } * 100.0))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(s.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::MiddleMiddle)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
