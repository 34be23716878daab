//! The experiment's table (Markdown) and chart (SVG).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::measure::Hold;
use crate::run::{RunOutcome, Strategy};
use crate::windows::run::{PhaseFigures, WindowRow, WindowSettings};

fn secs(d: Option<Duration>) -> String {
    d.map_or("not drained".to_string(), |d| {
        format!("{:.1} s", d.as_secs_f64())
    })
}

fn ms(ms: f64) -> String {
    if ms.abs() >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

fn hold(h: &Hold) -> String {
    if h.records == 0 {
        return "—".to_string();
    }
    format!("{} / {}", ms(h.avg_ms), ms(h.p99_ms))
}

fn hold3(h: &Hold) -> String {
    if h.records == 0 {
        return "—".to_string();
    }
    format!("{} / {} / {}", ms(h.avg_ms), ms(h.p50_ms), ms(h.p99_ms))
}

/// What the Parsley stage's steady live hold is compared with.
#[derive(Debug, Clone, PartialEq)]
pub struct Targets {
    /// The clock's lag, ms.
    pub lag_ms: i64,
    /// The runtime's commit interval.
    pub commit_interval: Duration,
    /// The clock's tick interval (the built-in clock's, or the hand-run ticker's), ms.
    pub tick_ms: i64,
    /// The clock, as the text names it.
    pub clock: String,
}

impl Targets {
    /// The expected average hold: the lag plus half a tick interval.
    pub fn expected_avg_ms(&self) -> f64 {
        self.lag_ms as f64 + self.tick_ms as f64 / 2.0
    }

    /// The p99 bound: the lag plus one commit interval plus one tick interval.
    pub fn p99_bound_ms(&self) -> f64 {
        self.lag_ms as f64 + self.commit_interval.as_secs_f64() * 1000.0 + self.tick_ms as f64
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "not met" }
}

/// The table: one row per run, then the plain-consumer reference and the targets.
pub fn markdown(outcomes: &[RunOutcome], targets: &Targets) -> String {
    let mut s = String::new();
    s.push_str(
        "| strategy | seed | records | out of order | catch-up hold avg / p99 | steady live hold from production avg / p50 / p99 | history drain | first live output | held at stop |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in outcomes {
        let m = &o.summary;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} % ({} history, {} live) | {} | {} | {} | {} | {} |",
            o.strategy.name(),
            o.seed,
            m.records,
            m.out_of_order_pct(),
            m.out_of_order_history,
            m.out_of_order - m.out_of_order_history,
            hold(&m.catch_up),
            hold3(&m.live),
            secs(m.history_drain),
            m.first_live
                .map_or("—".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            m.unreleased_history + m.unreleased_live,
        );
    }
    let plain: Vec<&RunOutcome> = outcomes.iter().filter(|o| o.plain.is_some()).collect();
    if !plain.is_empty() {
        s.push_str(
            "\n| seed | plain consumer drain | offset completeness drain | ratio (target ≤ 1.2) | Parsley arrival-order drain | ratio to it |\n|---:|---:|---:|---:|---:|---:|\n",
        );
        let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) if !b.is_zero() => {
                format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
            }
            _ => "—".into(),
        };
        for o in plain {
            let p = o.plain.as_ref().map(|p| p.elapsed);
            let arrival = outcomes
                .iter()
                .find(|a| a.strategy == Strategy::Arrival && a.seed == o.seed)
                .and_then(|a| a.summary.history_drain);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                o.seed,
                secs(p),
                secs(o.summary.history_drain),
                ratio(o.summary.history_drain, p),
                secs(arrival),
                ratio(o.summary.history_drain, arrival),
            );
        }
    }
    let (expected, bound) = (targets.expected_avg_ms(), targets.p99_bound_ms());
    for o in outcomes.iter().filter(|o| o.strategy == Strategy::Offsets) {
        let l = &o.summary.live;
        let q = &o.summary.live_queue;
        let _ = writeln!(
            s,
            "\nSeed {}, offset completeness ({}, lag {} ms, commit interval {} ms), steady live hold from production over {} records: avg {:.1} ms (expected lag + half a tick interval = {expected:.0} ms; target < 100 ms: {}), p50 {:.1} ms, p99 {:.1} ms (bound lag + commit interval + tick interval = {bound:.0} ms: {}); from the stage's receipt avg {:.1} ms, p99 {:.1} ms. History out of order {} (target 0: {}); the runtime counted {} late records (arrived below the watermark).",
            o.seed,
            targets.clock,
            targets.lag_ms,
            targets.commit_interval.as_millis(),
            l.records,
            l.avg_ms,
            met(l.records > 0 && l.avg_ms < 100.0),
            l.p50_ms,
            l.p99_ms,
            met(l.records > 0 && l.p99_ms < bound),
            q.avg_ms,
            q.p99_ms,
            o.summary.out_of_order_history,
            met(o.summary.out_of_order_history == 0),
            o.late.map_or("?".into(), |l| l.to_string()),
        );
        if let Some(c) = &o.clock {
            let _ = writeln!(
                s,
                "Where it goes (avg / p50 / p99): to the releasing tick (lag + the wait for a tick) {}; from that tick's timestamp to the release (its transaction's commit, the stage's fetch, the release) {}{}. The {} ticks written after the drain became visible to a `read_committed` consumer {} after their timestamps, in commits {} apart, each {} after the last tick it carried (the commit's round trips and the fetch).",
                hold3(&c.to_tick),
                hold3(&c.tick_to_release),
                if c.unmatched > 0 {
                    format!(
                        "; {} records without a tick at or after their time plus the lag",
                        c.unmatched
                    )
                } else {
                    String::new()
                },
                c.ticks.records,
                hold3(&c.ticks),
                hold3(&c.commit_cycle),
                hold3(&c.commit_latency),
            );
        }
    }
    s
}

/// Writes a chart to `path`: out-of-order % and hold averages per strategy and seed, and,
/// with windows rows, the windows whose final result differs and the time to final result.
///
/// # Errors
/// [`Error::Output`] when the file cannot be drawn or written.
pub fn chart(outcomes: &[RunOutcome], rows: &[WindowRow], path: &Path) -> Result<()> {
    draw(outcomes, rows, path).map_err(|e| Error::Output {
        path: path.display().to_string(),
        why: e.to_string(),
    })
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

const COLOURS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];

fn draw(outcomes: &[RunOutcome], rows: &[WindowRow], path: &Path) -> DrawResult {
    let height = if rows.is_empty() { 480 } else { 940 };
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(480);
    let mut seeds: Vec<u64> = outcomes
        .iter()
        .map(|o| o.seed)
        .chain(rows.iter().map(|r| r.seed))
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    draw_strategies(outcomes, &seeds, &top)?;
    if !rows.is_empty() {
        draw_windows(rows, &seeds, &bottom)?;
    }
    // Legend: one colour per seed.
    for (ki, seed) in seeds.iter().enumerate() {
        top.draw(&Text::new(
            format!("seed {seed}"),
            (20 + 90 * ki as i32, 462),
            ("sans-serif", 14)
                .into_font()
                .color(&COLOURS[ki % COLOURS.len()]),
        ))?;
    }
    root.present()?;
    Ok(())
}

fn draw_strategies(outcomes: &[RunOutcome], seeds: &[u64], root: &Area<'_>) -> DrawResult {
    let (left, right) = root.split_horizontally(550);
    let strategies: Vec<Strategy> = Strategy::ALL
        .into_iter()
        .filter(|s| outcomes.iter().any(|o| o.strategy == *s))
        .collect();
    let colours = COLOURS;
    let n = strategies.len().max(1) as f64;
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < strategies.len() {
            strategies[i as usize].slug().to_string()
        } else {
            String::new()
        }
    };
    // Each run's bar: its x range and its seed's colour.
    let width = 0.8 / seeds.len().max(1) as f64;
    let placed: Vec<(f64, f64, RGBColor, &RunOutcome)> = outcomes
        .iter()
        .filter_map(|o| {
            let si = strategies.iter().position(|s| *s == o.strategy)?;
            let ki = seeds.iter().position(|k| *k == o.seed)?;
            let x0 = si as f64 - 0.4 + ki as f64 * width;
            Some((x0, x0 + width * 0.9, colours[ki % colours.len()], o))
        })
        .collect();
    // Out of order, %.
    let max_pct = outcomes
        .iter()
        .map(|o| o.summary.out_of_order_pct())
        .fold(1.0, f64::max)
        * 1.1;
    let mut c = ChartBuilder::on(&left)
        .caption("records out of order per key, %", ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..max_pct)?;
    c.configure_mesh()
        .x_labels(strategies.len().max(1) * 2 + 1)
        .x_label_formatter(&label)
        .disable_x_mesh()
        .draw()?;
    c.draw_series(placed.iter().map(|(x0, x1, colour, o)| {
        Rectangle::new(
            [(*x0, 0.0), (*x1, o.summary.out_of_order_pct())],
            colour.filled(),
        )
    }))?;
    // Hold, ms, log scale: catch-up (light) and steady live (solid) averages.
    let max_hold = outcomes
        .iter()
        .flat_map(|o| [o.summary.catch_up.avg_ms, o.summary.live.avg_ms])
        .fold(10.0, f64::max)
        * 2.0;
    let mut c = ChartBuilder::on(&right)
        .caption(
            "hold avg, ms (light: catch-up, solid: steady live)",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n - 0.5, (1.0..max_hold).log_scale())?;
    c.configure_mesh()
        .x_labels(strategies.len().max(1) * 2 + 1)
        .x_label_formatter(&label)
        .disable_x_mesh()
        .draw()?;
    let floor = |v: f64| v.max(1.0);
    c.draw_series(placed.iter().flat_map(|(x0, x1, colour, o)| {
        let mid = (x0 + x1) / 2.0;
        [
            Rectangle::new(
                [(*x0, 1.0), (mid, floor(o.summary.catch_up.avg_ms))],
                colour.mix(0.35).filled(),
            ),
            Rectangle::new(
                [(mid, 1.0), (*x1, floor(o.summary.live.avg_ms))],
                colour.filled(),
            ),
        ]
    }))?;
    Ok(())
}

/// Windows: per row label and seed, the windows whose final result differs, and the average
/// time to final result (solid: startup and live — the live windows' — light: replay).
fn draw_windows(rows: &[WindowRow], seeds: &[u64], root: &Area<'_>) -> DrawResult {
    let (left, right) = root.split_horizontally(550);
    let mut labels: Vec<String> = Vec::new();
    for r in rows {
        if !labels.contains(&r.label()) {
            labels.push(r.label());
        }
    }
    let n = labels.len().max(1) as f64;
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    let width = 0.8 / seeds.len().max(1) as f64;
    let placed: Vec<(f64, f64, RGBColor, &WindowRow)> = rows
        .iter()
        .filter_map(|r| {
            let li = labels.iter().position(|l| *l == r.label())?;
            let ki = seeds.iter().position(|k| *k == r.seed)?;
            let x0 = li as f64 - 0.4 + ki as f64 * width;
            Some((x0, x0 + width * 0.9, COLOURS[ki % COLOURS.len()], r))
        })
        .collect();
    let differing = |r: &WindowRow| {
        (
            r.live.figures.differing() as f64,
            r.replay.map_or(0.0, |p| p.figures.differing() as f64),
        )
    };
    let max_diff = rows
        .iter()
        .map(|r| {
            let (a, b) = differing(r);
            a.max(b)
        })
        .fold(1.0, f64::max)
        * 1.1;
    let mut c = ChartBuilder::on(&left)
        .caption(
            "windows differing from the ground truth (solid: startup + live, light: replay)",
            ("sans-serif", 15),
        )
        .margin(15)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..max_diff)?;
    c.configure_mesh()
        .x_labels(labels.len().max(1) * 2 + 1)
        .x_label_formatter(&label)
        .disable_x_mesh()
        .draw()?;
    c.draw_series(placed.iter().flat_map(|(x0, x1, colour, r)| {
        let mid = (x0 + x1) / 2.0;
        let (live, replay) = differing(r);
        [
            Rectangle::new([(*x0, 0.0), (mid, live)], colour.filled()),
            Rectangle::new([(mid, 0.0), (*x1, replay)], colour.mix(0.35).filled()),
        ]
    }))?;
    let finals = |r: &WindowRow| {
        (
            r.live.figures.live_final.avg_ms.max(1.0),
            r.replay
                .map_or(1.0, |p| p.figures.catch_up_final.avg_ms.max(1.0)),
        )
    };
    let max_final = rows
        .iter()
        .map(|r| {
            let (a, b) = finals(r);
            a.max(b)
        })
        .fold(10.0, f64::max)
        * 2.0;
    let mut c = ChartBuilder::on(&right)
        .caption(
            "time to final result avg, ms (solid: live windows, light: replay)",
            ("sans-serif", 15),
        )
        .margin(15)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n - 0.5, (1.0..max_final).log_scale())?;
    c.configure_mesh()
        .x_labels(labels.len().max(1) * 2 + 1)
        .x_label_formatter(&label)
        .disable_x_mesh()
        .draw()?;
    c.draw_series(placed.iter().flat_map(|(x0, x1, colour, r)| {
        let mid = (x0 + x1) / 2.0;
        let (live, replay) = finals(r);
        [
            Rectangle::new([(*x0, 1.0), (mid, live)], colour.filled()),
            Rectangle::new([(mid, 1.0), (*x1, replay)], colour.mix(0.35).filled()),
        ]
    }))?;
    Ok(())
}

fn count_or_dash(n: Option<u64>) -> String {
    n.map_or("—".to_string(), |n| n.to_string())
}

fn differing(p: &PhaseFigures) -> String {
    let f = &p.figures;
    format!(
        "{} ({} / {} / {} / {})",
        f.differing(),
        f.wrong,
        f.missing,
        f.extra,
        f.duplicates
    )
}

/// The windows table: one row per method (and grace) and seed.
pub fn windows_markdown(rows: &[WindowRow], settings: &WindowSettings) -> String {
    let mut s = format!(
        "Windowed count per product in {} ms tumbling windows. *Differing*: windows whose final result is not the ground truth's count (wrong count / no result / a result for a window without events / a second result). *Time to final result*: from the moment a window could first be closed — its end as wall-clock time (live events are produced at their event time), and not before the job's start — until a `read_committed` consumer read its result; *catch-up*: the windows that could be closed before the method had committed every history window's result, *steady live* the live windows after (*emitted*: until the result was handed to the producer, before its commit).\n\n",
        settings.size_ms
    );
    s.push_str(
        "| windowed count | seed | windows | differing after startup + live | left out as late | open at the end | time to final, catch-up avg / p99 | time to final, steady live avg / p50 / p99 | steady live, emitted avg / p99 | replay: differing | replay: left out | replay: time to final avg / p99 |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let f = &r.live.figures;
        let (rd, rl, rt) = match &r.replay {
            Some(p) => (
                differing(p),
                p.dropped.to_string(),
                hold(&p.figures.catch_up_final),
            ),
            None => ("—".into(), "—".into(), "—".into()),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.seed,
            f.windows,
            differing(&r.live),
            r.live.dropped,
            count_or_dash(r.live.open),
            hold(&f.catch_up_final),
            hold3(&f.live_final),
            hold(&f.live_emitted),
            rd,
            rl,
            rt,
        );
    }
    s
}
