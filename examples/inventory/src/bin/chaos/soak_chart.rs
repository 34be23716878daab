//! The soak's chart (SVG): each stage process's RSS over time above, the end-to-end latency
//! (p50 and p99 per tenth of a window, log scale) below, every fault's moment a grey line
//! in both, named in the upper one.

use std::path::Path;

use plotters::prelude::*;

use crate::soak_report::{Report, STAGES};
use crate::soak_stats::latency_windows;

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

const COLOURS: [RGBColor; 2] = [BLUE, RED];

pub(crate) fn draw(r: &Report<'_>, path: &Path) -> DrawResult {
    let root = SVGBackend::new(path, (1100, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(380);
    let minutes = r.minutes.max(1e-3);
    let to_min = |at: u32| f64::from(at) / 60_000.0;
    let grey = RGBColor(170, 170, 170);

    // RSS per stage: every sample, the processes of a stage one line (a restart drops it).
    let max_rss = r.rss.iter().map(|s| s.mib).fold(1.0, f64::max) * 1.15;
    let mut c = ChartBuilder::on(&top)
        .caption(
            "RSS of each stage process, MiB (sampled every 5 s)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..minutes, 0.0..max_rss)?;
    c.configure_mesh().x_desc("minutes").draw()?;
    for f in r.faults {
        let x = to_min(f.at);
        c.draw_series(LineSeries::new([(x, 0.0), (x, max_rss)], grey))?;
        c.draw_series(std::iter::once(Text::new(
            f.kind.to_string(),
            (x, max_rss * 0.97),
            ("sans-serif", 11).into_font().color(&BLACK),
        )))?;
    }
    for (k, stage) in STAGES.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        c.draw_series(LineSeries::new(
            r.samples(stage).into_iter().map(|(at, v)| (to_min(at), v)),
            colour.stroke_width(2),
        ))?
        .label(*stage)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    // Latency per bucket.
    let bucket = (r.window_ms / 10).max(1);
    let n = r.windows() * 10;
    let lat = latency_windows(r.latencies, bucket, n);
    let max_lat = lat
        .iter()
        .flatten()
        .map(|s| f64::from(s.max))
        .fold(10.0, f64::max)
        * 1.5;
    let mut c = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "end-to-end latency, ms (log scale): p50 and p99 per {:.0} s",
                f64::from(bucket) / 1000.0
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..minutes, (1.0..max_lat).log_scale())?;
    c.configure_mesh().x_desc("minutes").draw()?;
    for f in r.faults {
        let x = to_min(f.at);
        c.draw_series(LineSeries::new([(x, 1.0), (x, max_lat)], grey))?;
    }
    let mid = |i: usize| (i as f64 + 0.5) * f64::from(bucket) / 60_000.0;
    for (label, colour, pick) in [
        (
            "p99",
            RED,
            (|s: &crate::soak_stats::Summary| s.p99) as fn(&_) -> u32,
        ),
        ("p50", BLUE, |s| s.p50),
    ] {
        c.draw_series(LineSeries::new(
            lat.iter()
                .enumerate()
                .filter_map(|(i, s)| s.map(|s| (mid(i).min(minutes), f64::from(pick(&s).max(1))))),
            colour.stroke_width(2),
        ))?
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
