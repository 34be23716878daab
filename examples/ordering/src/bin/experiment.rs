//! `experiment` (run by `cargo xtask experiment`): the same generated input through four
//! ordering strategies on a real broker, per seed; prints the table and writes it with a
//! chart under `target/experiment/`.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use parsley_ordering::cli::{WorkloadArgs, bootstrap};
use parsley_ordering::offsets::{self, Clock};
use parsley_ordering::report;
use parsley_ordering::run::{self, Strategy, StrategySettings};
use parsley_ordering::windows::run::{self as windows_run, WindowMethod, WindowSettings};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Run the event-time ordering experiment: a fixed window, timeout idleness in two layers and
/// in one, and offset completeness, on the same generated input.
#[derive(Parser, Debug)]
#[command(name = "experiment")]
struct Cli {
    /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP).
    #[arg(long)]
    bootstrap: Option<String>,
    /// Generator seeds, comma-separated: one run per strategy and seed.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// Strategies, comma-separated (window, two-layer, one-layer, offsets, and arrival: the
    /// Parsley stage without event-time ordering, as a reference; none: skip).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "window,two-layer,one-layer,offsets,arrival"
    )]
    strategies: Vec<String>,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// (a) the fixed window, ms of event time.
    #[arg(long, default_value_t = 5_000)]
    window_ms: i64,
    /// (b) idleness per partition at the source, ms.
    #[arg(long, default_value_t = 1_000)]
    source_idle_ms: u64,
    /// (b) idleness per topic at the union, ms.
    #[arg(long, default_value_t = 500)]
    union_idle_ms: u64,
    /// (c) idleness per partition, ms.
    #[arg(long, default_value_t = 1_000)]
    idle_ms: u64,
    /// (a)–(c) watermark emission interval, ms (Flink's default: 200).
    #[arg(long, default_value_t = 200)]
    watermark_interval_ms: u64,
    /// (a)–(c) every topic's consumer starts within this many ms (drawn by seed).
    #[arg(long, default_value_t = 300)]
    start_spread_ms: u64,
    /// (a)–(c) one event topic per seed is slow: its consumer starts within this many ms.
    #[arg(long, default_value_t = 2_000)]
    slow_start_ms: u64,
    /// (b)–(d) the clock's lag, ms: the baselines' processing-time source and the Parsley
    /// stage's clock trail wall time by this much.
    #[arg(long, default_value_t = 20)]
    lag_ms: i64,
    /// (d) the built-in clock's tick interval, ms.
    #[arg(long, default_value_t = 20)]
    tick_interval_ms: i64,
    /// (d) order the Parsley stage by the hand-run control stream (the workload's control
    /// topic, written by a ticker every --control-interval-ms) instead of the built-in clock.
    /// Without it no control records are written.
    #[arg(long)]
    ticker: bool,
    /// (d) the runtime's commit interval, ms.
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// How long a run waits for held records after the live events end, ms; a windows phase
    /// that makes no progress for this long ends there.
    #[arg(long, default_value_t = 3_000)]
    grace_ms: u64,
    /// Warm-up runs before the measured ones, not reported: offset completeness (with its
    /// plain consumer) on the first seed's workload, with at most one second of live traffic. A broker's JIT compiler works for minutes
    /// after it starts and again on code paths a workload has not run yet (transactions,
    /// `read_committed` fetches, group coordination): on a broker started just before, its
    /// compiler threads took 0.7–1.0 s of CPU during a 1.8 s drain of the first measured run
    /// (`perf record -a`), on a two-core machine the stage shares. 0: none.
    #[arg(long, default_value_t = 2)]
    warmup: u32,
    /// Windowed counting, comma-separated (evidence: the Parsley DSL pipeline closed by its
    /// watermark; stream-time: Kafka Streams' stream time with grace, one row per grace;
    /// none: skip).
    #[arg(long, value_delimiter = ',', default_value = "evidence,stream-time")]
    windows: Vec<String>,
    /// Windowed counting: tumbling window size, ms.
    #[arg(long, default_value_t = 1_000)]
    window_size_ms: i64,
    /// Stream time: graces, ms, comma-separated (one row each, on one record sequence).
    #[arg(long, value_delimiter = ',', default_value = "0,2000")]
    graces_ms: Vec<i64>,
    /// Stream time: Kafka Streams' `max.task.idle.ms` (0, the default: wait for partitions
    /// whose lag is unknown or above 0; -1: never wait).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    task_idle_ms: i64,
    /// Windowed counting: skip the replay over everything written.
    #[arg(long)]
    no_replay: bool,
    /// Where the table and the chart go.
    #[arg(long, default_value = "target/experiment")]
    out: PathBuf,
}

fn main() -> ExitCode {
    tracing_subscriber::registry()
        .with(offsets::delivery_capture())
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(
                    EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn,librdkafka=error".into()),
                ),
        )
        .init();
    match experiment(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("experiment: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn experiment(cli: Cli) -> Result<()> {
    let bootstrap = bootstrap(cli.bootstrap.clone()).context(
        "no broker: pass --bootstrap, set PARSLEY_BOOTSTRAP or run `cargo xtask experiment`",
    )?;
    let named = |list: &[String]| -> Vec<String> {
        list.iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s != "none")
            .collect()
    };
    let strategies = named(&cli.strategies)
        .iter()
        .map(|s| Strategy::from_slug(s))
        .collect::<parsley_ordering::Result<Vec<_>>>()?;
    let window_methods = named(&cli.windows)
        .iter()
        .map(|s| WindowMethod::from_slug(s))
        .collect::<parsley_ordering::Result<Vec<_>>>()?;
    let window_settings = WindowSettings {
        size_ms: cli.window_size_ms,
        graces_ms: cli.graces_ms.clone(),
        task_idle_ms: cli.task_idle_ms,
        lag_ms: cli.lag_ms,
        tick_interval_ms: cli.tick_interval_ms,
        commit_interval: Duration::from_millis(cli.commit_interval_ms),
        replay: !cli.no_replay,
    };
    let clock = if cli.ticker {
        Clock::Ticker
    } else {
        Clock::BuiltIn {
            tick_interval_ms: cli.tick_interval_ms,
        }
    };
    let targets = report::Targets {
        lag_ms: cli.lag_ms,
        commit_interval: Duration::from_millis(cli.commit_interval_ms),
        tick_ms: if cli.ticker {
            cli.workload.control_interval_ms as i64
        } else {
            cli.tick_interval_ms
        },
        clock: clock.describe(),
    };
    // The same input for every row: with the built-in clock, no ticker writes control records.
    let workload_config = |prefix: &str, seed: u64| {
        let mut c = cli.workload.config(prefix, seed);
        if !cli.ticker {
            c.control_interval_ms = 0;
        }
        c
    };
    let settings = StrategySettings {
        window_ms: cli.window_ms,
        source_idle: Duration::from_millis(cli.source_idle_ms),
        union_idle: Duration::from_millis(cli.union_idle_ms),
        idle: Duration::from_millis(cli.idle_ms),
        watermark_interval: Duration::from_millis(cli.watermark_interval_ms),
        start_spread: Duration::from_millis(cli.start_spread_ms),
        slow_start: Duration::from_millis(cli.slow_start_ms),
        control_lag_ms: cli.lag_ms,
        clock,
        commit_interval: Duration::from_millis(cli.commit_interval_ms),
        output: false,
        plain_reference: true,
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let w = &cli.workload;
    println!(
        "Event-time ordering experiment on {bootstrap}: seeds {:?}; {} topics × {} partitions, {} products, {} history events over {} days, live {} events/s for {} s, silent partition {} ms; window {} ms; idleness {} ms (one layer), {} ms source / {} ms union (two layers), watermarks every {} ms, consumers start within {} ms, one slow topic within {} ms; lag {} ms, {}, commit interval {} ms",
        cli.seeds,
        w.topics,
        w.partitions,
        w.products,
        w.history_records,
        w.history_days,
        w.live_rate,
        w.live_secs,
        w.silent_ms,
        cli.window_ms,
        cli.idle_ms,
        cli.source_idle_ms,
        cli.union_idle_ms,
        cli.watermark_interval_ms,
        cli.start_spread_ms,
        cli.slow_start_ms,
        cli.lag_ms,
        targets.clock,
        cli.commit_interval_ms
    );
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({per_sec})")?
            .progress_chars("=> "),
    );
    if let Some(&seed) = cli.seeds.first() {
        let mut config = workload_config("ordering-warmup", seed);
        // The history is what warms the broker; a second of live traffic is enough.
        config.live_ms = config.live_ms.min(1_000);
        for round in 1..=cli.warmup {
            bar.suspend(|| println!("warm-up run {round} of {} (not reported)", cli.warmup));
            run::run(
                &bootstrap,
                &config,
                Strategy::Offsets,
                &settings,
                Duration::from_millis(cli.grace_ms),
                &bar,
            )
            .with_context(|| format!("warm-up run {round}"))?;
        }
    }
    let mut outcomes = Vec::new();
    let mut window_rows = Vec::new();
    for &seed in &cli.seeds {
        let config = workload_config("ordering", seed);
        for &strategy in &strategies {
            let o = run::run(
                &bootstrap,
                &config,
                strategy,
                &settings,
                Duration::from_millis(cli.grace_ms),
                &bar,
            )
            .with_context(|| format!("seed {seed}, {}", strategy.name()))?;
            let l = &o.summary.live;
            bar.suspend(|| {
                println!(
                    "seed {seed} {}: {} released, {:.2} % out of order, drain {:?}{}; steady live hold from production avg {:.1} ms, p50 {:.1} ms, p99 {:.1} ms ({} records){}",
                    strategy.name(),
                    o.summary.records,
                    o.summary.out_of_order_pct(),
                    o.summary.history_drain,
                    o.plain.map_or(String::new(), |p| format!(
                        " (plain consumer {:?})",
                        p.elapsed
                    )),
                    l.avg_ms,
                    l.p50_ms,
                    l.p99_ms,
                    l.records,
                    o.clock.map_or(String::new(), |c| format!(
                        "; to the releasing tick avg {:.1} ms, tick to release avg {:.1} ms (p99 {:.1}); commits every {:.1} ms (p99 {:.1}), visible {:.1} ms (p99 {:.1}) after their last tick",
                        c.to_tick.avg_ms,
                        c.tick_to_release.avg_ms,
                        c.tick_to_release.p99_ms,
                        c.commit_cycle.avg_ms,
                        c.commit_cycle.p99_ms,
                        c.commit_latency.avg_ms,
                        c.commit_latency.p99_ms
                    ))
                )
            });
            outcomes.push(o);
        }
        for &method in &window_methods {
            let rows = windows_run::run(
                &bootstrap,
                &config,
                method,
                &window_settings,
                Duration::from_millis(cli.grace_ms),
                &bar,
            )
            .with_context(|| format!("seed {seed}, windows {}", method.slug()))?;
            for r in &rows {
                let f = &r.live.figures;
                bar.suspend(|| {
                    println!(
                        "seed {seed} windows, {}: {} windows, {} differ after startup and live ({} left out as late); catch-up final after avg {:.0} ms; steady live windows final after avg {:.1} ms / p50 {:.1} ms / p99 {:.1} ms ({} windows; emitted after avg {:.1} ms){}",
                        r.name,
                        f.windows,
                        f.differing(),
                        r.live.dropped,
                        f.catch_up_final.avg_ms,
                        f.live_final.avg_ms,
                        f.live_final.p50_ms,
                        f.live_final.p99_ms,
                        f.live_final.records,
                        f.live_emitted.avg_ms,
                        r.replay.map_or(String::new(), |p| format!(
                            "; replay: {} differ, final after avg {:.0} ms / p99 {:.0} ms",
                            p.figures.differing(),
                            p.figures.catch_up_final.avg_ms,
                            p.figures.catch_up_final.p99_ms
                        ))
                    )
                });
            }
            window_rows.extend(rows);
        }
    }
    bar.finish_and_clear();
    let mut table = if outcomes.is_empty() {
        String::new()
    } else {
        report::markdown(&outcomes, &targets)
    };
    if !window_rows.is_empty() {
        table.push('\n');
        table.push_str(&report::windows_markdown(&window_rows, &window_settings));
    }
    println!("\n{table}");
    std::fs::create_dir_all(&cli.out).with_context(|| format!("creating {}", cli.out.display()))?;
    let md = cli.out.join("results.md");
    let mut f = std::fs::File::create(&md).with_context(|| format!("creating {}", md.display()))?;
    writeln!(
        f,
        "# Event-time ordering experiment\n\n`{command}`\n\n{table}"
    )?;
    let svg = cli.out.join("results.svg");
    report::chart(&outcomes, &window_rows, &svg)?;
    println!("wrote {} and {}", md.display(), svg.display());
    Ok(())
}
