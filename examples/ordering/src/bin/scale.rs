//! `scale`: the history drain of an event-time stage at 1×, 10× and 100× the experiment's
//! history, with and without watermark alignment — drain time and the stage process's peak
//! resident memory against the history's size, as a table and a chart.
//!
//! ```text
//! cargo run --release -p parsley-ordering --bin scale -- --multiples 1,10,100
//! ```
//!
//! For each multiple, the workload's history (the experiment's: 13 topics × 3 partitions, seven
//! days, partition lengths skewed by ±60 %) is written once, with no live traffic. Then, per
//! mode, a worker process of its own (the binary re-run as `scale worker`) runs one stage that
//! reads every event topic in event-time order (no clock: once every input is at its head the
//! watermark follows the delivered event times) and hands each record to a handler that only
//! counts it. The worker reports the drain time — from its start to the handler's last record —
//! its peak resident set (`VmHWM`), the most records its tasks' timer queues held, and how
//! often an input started holding records for alignment. The `arrival` mode runs the same
//! stage without event-time order: the drain the event-time ones are compared with.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use parsley_ordering::cli::{WorkloadArgs, bootstrap};
use parsley_ordering::produce;
use parsley_ordering::workload::Workload;
use parsley_runtime::{Admin, Runtime, RuntimeConfig};
use parsley_stage::{EventTimeOrder, Handler, HandlerError, Record, Step, Topology, Utf8};
use plotters::prelude::*;

/// The experiment's default history, records.
const BASE_HISTORY: u64 = 240_000;

/// The prefix of a worker's result line on stdout.
const RESULT_PREFIX: &str = "scale-result";

/// Drain an event-time stage over 1×, 10× and 100× the experiment's history.
#[derive(Parser, Debug)]
#[command(name = "scale", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    worker: Option<Sub>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// One drain in this process (run by `scale` itself).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP).
    #[arg(long)]
    bootstrap: Option<String>,
    /// Multiples of the experiment's history (240,000 events), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    multiples: Vec<u64>,
    /// Modes, comma-separated: aligned (event-time order, the default drift), unaligned
    /// (event-time order without alignment) and arrival (the same stage in arrival order: the
    /// reference the event-time drains are compared with).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "arrival,aligned,unaligned"
    )]
    modes: Vec<String>,
    /// The aligned mode's drifts, ms, comma-separated: one aligned run per drift (default:
    /// `EventTimeOrder`'s, 60 s).
    #[arg(long, value_delimiter = ',', default_value = "60000")]
    drifts: Vec<i64>,
    /// Skip the unaligned mode above this multiple (its queue grows with the history).
    #[arg(long, default_value_t = 10)]
    unaligned_up_to: u64,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the table and the chart go.
    #[arg(long, default_value = "target/experiment/scale")]
    out: PathBuf,
    /// The workload (its history size is the multiple's; no live traffic is written).
    #[command(flatten)]
    workload: WorkloadArgs,
}

#[derive(Args, Debug, Clone)]
struct WorkerArgs {
    #[arg(long)]
    bootstrap: String,
    /// The event topics, comma-separated.
    #[arg(long, value_delimiter = ',')]
    topics: Vec<String>,
    /// Records to hand to the handler before stopping.
    #[arg(long)]
    records: u64,
    /// Watermark alignment on (the default drift) or off.
    #[arg(long)]
    unaligned: bool,
    /// The drift of watermark alignment, ms (default: `EventTimeOrder`'s).
    #[arg(long)]
    max_drift_ms: Option<i64>,
    /// No event-time order: records go to the handler as the gate delivers them.
    #[arg(long, conflicts_with = "unaligned")]
    arrival: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.worker {
        Some(Sub::Worker(args)) => worker(&args),
        None => run(&cli.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One drain's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Drain {
    records: u64,
    drain_ms: u64,
    peak_rss_kib: u64,
    max_parked: u64,
    aligned: u64,
}

impl Drain {
    fn line(&self) -> String {
        format!(
            "{RESULT_PREFIX} records={} drain_ms={} peak_rss_kib={} max_parked={} aligned={}",
            self.records, self.drain_ms, self.peak_rss_kib, self.max_parked, self.aligned
        )
    }

    fn parse(line: &str) -> Option<Drain> {
        let rest = line.strip_prefix(RESULT_PREFIX)?;
        let field = |name: &str| -> Option<u64> {
            rest.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some(Drain {
            records: field("records")?,
            drain_ms: field("drain_ms")?,
            peak_rss_kib: field("peak_rss_kib")?,
            max_parked: field("max_parked")?,
            aligned: field("aligned")?,
        })
    }
}

/// Counts what the watermark releases.
struct Count(Arc<AtomicU64>);

impl Handler for Count {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        _: Record<'_, String, String>,
        _: Option<()>,
    ) -> Result<Step<String, String, ()>, HandlerError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(Step::none())
    }
}

/// The peak resident set of this process, KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn worker(args: &WorkerArgs) -> Result<()> {
    let released = Arc::new(AtomicU64::new(0));
    let order = match (args.unaligned, args.max_drift_ms) {
        (true, _) => EventTimeOrder::new().unaligned(),
        (false, Some(drift)) => EventTimeOrder::new().max_drift_ms(drift),
        (false, None) => EventTimeOrder::new(),
    };
    let application = format!("scale-{:x}", produce::now_ms());
    let topology = Topology::builder(application)
        .stage("drain", Count(released.clone()), |s| {
            let s = args
                .topics
                .iter()
                .fold(s, |s, t| s.source(t))
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8);
            if args.arrival {
                s
            } else {
                s.order_by_event_time(order)
            }
        })
        .build()?;
    let started = Instant::now();
    let running = Runtime::new(topology, RuntimeConfig::new(&args.bootstrap)).start()?;
    let deadline = Duration::from_secs(3_600);
    let mut max_parked = 0;
    while released.load(Ordering::Relaxed) < args.records {
        if let Some(parsley_runtime::Progress::Failed { stage, error }) =
            running.next_progress(Duration::from_millis(50))
        {
            bail!("stage {stage} failed: {error}");
        }
        max_parked = max_parked.max(
            running
                .task_metrics()
                .iter()
                .flat_map(|(_, tasks)| tasks.iter().map(|t| t.max_parked))
                .sum::<u64>(),
        );
        if started.elapsed() > deadline {
            bail!(
                "{} of {} records released within {deadline:?}",
                released.load(Ordering::Relaxed),
                args.records
            );
        }
    }
    let drain_ms = started.elapsed().as_millis() as u64;
    let aligned = running.metrics().first().map_or(0, |(_, m)| m.aligned);
    let peak = peak_rss_kib();
    running.stop()?;
    let drain = Drain {
        records: released.load(Ordering::Relaxed),
        drain_ms,
        peak_rss_kib: peak,
        max_parked,
        aligned,
    };
    println!("{}", drain.line());
    Ok(())
}

/// One row of the table.
#[derive(Debug, Clone)]
struct Row {
    multiple: u64,
    mode: String,
    drain: Drain,
}

fn run(args: &RunArgs) -> Result<()> {
    let bootstrap = bootstrap(args.bootstrap.clone())
        .context("no broker: pass --bootstrap or set PARSLEY_BOOTSTRAP")?;
    let admin = Admin::new(&bootstrap, Duration::from_secs(60))?;
    let exe = std::env::current_exe().context("locating this binary")?;
    let mut rows = Vec::new();
    for &multiple in &args.multiples {
        let mut workload_args = args.workload.clone();
        workload_args.history_records = BASE_HISTORY * multiple;
        let prefix = format!("scale-{multiple}x-{:x}", produce::now_ms());
        let workload = Workload::new(workload_args.config(&prefix, args.seed))?;
        produce::create_topics(&admin, &workload)?;
        let history = workload.history(produce::now_ms());
        let records = history.events.len() as u64;
        let bar = ProgressBar::new(records);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta})")?
                .progress_chars("=> "),
        );
        bar.set_message(format!("{multiple}×: writing the history"));
        produce::write_history(&bootstrap, &workload, &history, &bar)?;
        bar.finish_and_clear();
        drop(history);
        let mut runs: Vec<(String, Vec<String>)> = Vec::new();
        for mode in &args.modes {
            match mode.as_str() {
                "arrival" => runs.push((mode.clone(), vec!["--arrival".into()])),
                "aligned" => runs.extend(args.drifts.iter().map(|d| {
                    (
                        format!("aligned, drift {}", drift_label(*d)),
                        vec![format!("--max-drift-ms={d}")],
                    )
                })),
                "unaligned" if multiple <= args.unaligned_up_to => {
                    runs.push((mode.clone(), vec!["--unaligned".into()]));
                }
                "unaligned" => {}
                other => bail!("unknown mode {other:?}: arrival, aligned or unaligned"),
            }
        }
        for (mode, flags) in runs {
            println!("{multiple}× ({records} records), {mode}: draining");
            let out = Command::new(&exe)
                .args(["worker", "--bootstrap", &bootstrap])
                .args(["--topics", &workload.event_topics().join(",")])
                .args(["--records", &records.to_string()])
                .args(&flags)
                .stderr(Stdio::inherit())
                .output()
                .context("running a worker")?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let drain = stdout
                .lines()
                .find_map(Drain::parse)
                .with_context(|| format!("the worker reported nothing ({})", out.status))?;
            println!(
                "{multiple}× {mode}: {} records in {:.1} s, peak RSS {} MiB, at most {} parked, {} holds for alignment",
                drain.records,
                drain.drain_ms as f64 / 1000.0,
                drain.peak_rss_kib / 1024,
                drain.max_parked,
                drain.aligned
            );
            rows.push(Row {
                multiple,
                mode,
                drain,
            });
        }
        let names = workload.topics();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        admin.delete_topics(&names)?;
    }
    std::fs::create_dir_all(&args.out)?;
    let table = table(&rows);
    print!("{table}");
    std::fs::write(args.out.join("scale.md"), &table)?;
    let chart = args.out.join("scale.svg");
    draw(&rows, &chart)?;
    println!("chart: {}", chart.display());
    Ok(())
}

/// A drift for people: `60 s`, `1 h`.
fn drift_label(ms: i64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{} h", ms / 3_600_000),
        ms if ms % 60_000 == 0 && ms >= 600_000 => format!("{} min", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{} s", ms / 1_000),
        ms => format!("{ms} ms"),
    }
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| history | mode | records | drain s | × arrival order | records/s | peak RSS MiB | most parked | holds for alignment |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let d = &r.drain;
        let arrival = rows
            .iter()
            .find(|a| a.multiple == r.multiple && a.mode == "arrival")
            .map(|a| a.drain.drain_ms);
        let ratio = arrival.map_or("–".into(), |a| {
            format!("{:.2}", d.drain_ms as f64 / a.max(1) as f64)
        });
        let _ = writeln!(
            s,
            "| {}× | {} | {} | {:.1} | {ratio} | {:.0} | {} | {} | {} |",
            r.multiple,
            r.mode,
            d.records,
            d.drain_ms as f64 / 1000.0,
            d.records as f64 * 1000.0 / d.drain_ms.max(1) as f64,
            d.peak_rss_kib / 1024,
            d.max_parked,
            d.aligned
        );
    }
    s
}

/// Drain time and peak memory against the history's size (log scale), one line per mode.
fn draw(rows: &[Row], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let max_records = rows.iter().map(|r| r.drain.records).max().unwrap_or(1) as f64;
    let panels: [(&str, Metric, Area<'_>); 2] = [
        ("drain time, s", |d| d.drain_ms as f64 / 1000.0, left),
        (
            "peak resident memory, MiB",
            |d| d.peak_rss_kib as f64 / 1024.0,
            right,
        ),
    ];
    for (title, value, area) in panels {
        let top = rows.iter().map(|r| value(&r.drain)).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (BASE_HISTORY as f64 / 2.0..max_records * 2.0).log_scale(),
                0.0..top,
            )?;
        chart
            .configure_mesh()
            .x_desc("history, records")
            .x_label_formatter(&|x| format!("{:.0}k", x / 1000.0))
            .draw()?;
        let mut modes: Vec<&str> = Vec::new();
        for r in rows {
            if !modes.contains(&r.mode.as_str()) {
                modes.push(&r.mode);
            }
        }
        let palette = [BLACK, BLUE, GREEN, MAGENTA, RED, CYAN];
        for (k, mode) in modes.into_iter().enumerate() {
            let colour = palette[k % palette.len()];
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.mode == mode)
                .map(|r| (r.drain.records as f64, value(&r.drain)))
                .collect();
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(std::iter::once(PathElement::new(points.clone(), colour)))?
                .label(mode)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// What a chart panel shows of a drain.
type Metric = fn(&Drain) -> f64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_line_reads_back() {
        let d = Drain {
            records: 24_000_000,
            drain_ms: 98_765,
            peak_rss_kib: 512_000,
            max_parked: 4_321,
            aligned: 17,
        };
        assert_eq!(Drain::parse(&d.line()), Some(d));
        assert_eq!(Drain::parse("other output"), None);
    }

    #[test]
    fn drifts_read_as_people_write_them() {
        assert_eq!(drift_label(60_000), "60 s");
        assert_eq!(drift_label(600_000), "10 min");
        assert_eq!(drift_label(3_600_000), "1 h");
        assert_eq!(drift_label(1_500), "1500 ms");
    }
}
