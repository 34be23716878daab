//! `generate`: writes the silence-problem workload to a broker — topics, seven days of
//! history, then live traffic — and prints the partition lengths.
//!
//! ```text
//! cargo run -p parsley-ordering --bin generate -- --prefix demo --seed 3
//! ```
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use parsley_ordering::cli::{WorkloadArgs, bootstrap};
use parsley_ordering::produce::{self, LiveTraffic};
use parsley_ordering::workload::Workload;
use parsley_runtime::Admin;

/// Write the silence-problem workload (history, then live traffic) to Kafka.
#[derive(Parser, Debug)]
#[command(name = "generate")]
struct Cli {
    /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP).
    #[arg(long)]
    bootstrap: Option<String>,
    /// Prefix of the topic names (`{prefix}.events-00`, …, `{prefix}.products`); the topics
    /// must not exist yet.
    #[arg(long, default_value = "ordering")]
    prefix: String,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    workload: WorkloadArgs,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match generate(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("generate: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn generate(cli: Cli) -> Result<()> {
    let bootstrap =
        bootstrap(cli.bootstrap).context("no broker: pass --bootstrap or set PARSLEY_BOOTSTRAP")?;
    let workload = Workload::new(cli.workload.config(&cli.prefix, cli.seed))?;
    let c = workload.config().clone();
    let admin = Admin::new(&bootstrap, Duration::from_secs(60))?;
    produce::create_topics(&admin, &workload)?;
    let history = workload.history(produce::now_ms());
    let bar = ProgressBar::new(history.events.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta})")?
            .progress_chars("=> "),
    );
    bar.set_message("history");
    produce::write_history(&bootstrap, &workload, &history, &bar)?;
    bar.finish();
    println!(
        "history: {} events over {} days, {} products, written to {} event topics × {} partitions (+ {} with {} valid products)",
        history.events.len(),
        c.history_span_ms as f64 / parsley_ordering::workload::DAY_MS as f64,
        c.products,
        c.event_topics,
        c.partitions,
        workload.control_topic(),
        c.products
    );
    for (t, lengths) in workload.partition_lengths(&history).iter().enumerate() {
        println!("  {}: {:?}", workload.event_topic(t), lengths);
    }
    println!(
        "live: {} events/s for {:.1} s (event time = now), control records every {} ms per partition{}",
        c.live_rate,
        c.live_ms as f64 / 1000.0,
        c.control_interval_ms,
        c.silent.map_or(String::new(), |s| format!(
            "; {}/{} silent for the first {} ms",
            workload.event_topic(s.topic),
            s.partition,
            s.live_delay_ms
        ))
    );
    let live = LiveTraffic::start(&bootstrap, &workload, &history)?;
    let bar = ProgressBar::new_spinner();
    bar.set_message("live traffic");
    let deadline = Duration::from_millis(c.live_ms) + Duration::from_secs(60);
    let started = std::time::Instant::now();
    while !live.wait_done(Duration::from_millis(200)) {
        bar.set_message(format!("live traffic: {} events", live.records_written()));
        bar.tick();
        anyhow::ensure!(
            started.elapsed() < deadline,
            "live traffic did not finish in {deadline:?}"
        );
    }
    let summary = live.stop()?;
    bar.finish_and_clear();
    println!(
        "live: {} events and {} control records written",
        summary.records, summary.control_records
    );
    Ok(())
}
