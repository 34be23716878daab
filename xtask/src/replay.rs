//! `cargo xtask replay`: "replay equals live" on the shop's revenue per customer and hour
//! (`shop::pipeline::hourly_revenue`), with the test kit's check
//! (`parsley_testkit::replay`).
//!
//! 1. Creates this run's input topics `replay-{ms}-{pid}-orders` and `…-payments` (4
//!    partitions each).
//! 2. **Live run**: starts the pipeline, then writes the input while it runs, in
//!    [`ROUNDS`] rounds: a slice of the generated orders (the shop's order generator and its
//!    plain producer), then the payments service (`shop::payments`, a `CausalProducer`: each
//!    payment claims its order) pays every order written so far but every 7th. Both stamp
//!    their records with the time of sending, so the live window stage takes them on its
//!    built-in clock, [`HOURLY_CLOCK_LAG_MS`] behind. Waits until the pipeline has settled and
//!    reads its output.
//! 3. **Replays**: the same pipeline under fresh application ids, from offset 0 of the same
//!    inputs, each with fetch sizes drawn from `--seed`; each output compared with the live
//!    one, key by key, byte for byte.
//! 4. Prints a line per run and a summary: runs, keys, output records per run, whether every
//!    replay is identical, the first difference, wall time per run, and the records of each
//!    run taken out of event-time order (late, too late for their windows, or parked behind a
//!    later cause). A live run with late records is reported as such: its order for them came
//!    from their arrival, which no replay repeats. A check that crosses an hour boundary is
//!    reported too: a replay after the hour may close the window the live run left open.
//!
//! The exit status is non-zero when a replay differs.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parsley_runtime::{Admin, RuntimeConfig, TopicSpec};
use parsley_testkit::replay::{ReplayCheck, RunReport};
use shop::payments::{self, PaymentsConfig};
use shop::pipeline::HOURLY_CLOCK_LAG_MS;

/// Partitions of the input topics (and of the output topics).
const PARTITIONS: i32 = 4;
/// Rounds of the live input: orders, then their payments, this many times.
pub const ROUNDS: u64 = 4;
/// Customers the orders are spread over.
const CUSTOMERS: u64 = 50;
/// Every K-th order stays unpaid.
const SKIP_EVERY: u64 = 7;

/// The options of `cargo xtask replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Replays of the live run's input.
    #[arg(long, default_value_t = 10)]
    replays: usize,
    /// Seed of the orders and of the replays' fetch sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Orders written during the live run.
    #[arg(long, default_value_t = 2_000)]
    orders: u64,
    /// Leave a broker this command started running afterwards.
    #[arg(long)]
    keep_broker: bool,
}

/// Runs `cargo xtask replay`.
///
/// # Errors
/// A broker, a generator, the payments service or a run of the pipeline that fails.
pub fn run(args: ReplayArgs) -> Result<ExitCode> {
    if args.orders < ROUNDS {
        bail!("--orders must be at least {ROUNDS}");
    }
    super::with_broker(args.keep_broker, |bootstrap| check(bootstrap, &args))
}

fn check(bootstrap: &str, args: &ReplayArgs) -> Result<ExitCode> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let prefix = format!("replay-{}-{}", now.as_millis(), std::process::id());
    let orders = format!("{prefix}-orders");
    let payments = format!("{prefix}-payments");
    let admin = Admin::new(bootstrap, Duration::from_secs(30))?;
    admin
        .create_topics(&[
            TopicSpec::new(&orders, PARTITIONS),
            TopicSpec::new(&payments, PARTITIONS),
        ])
        .context("creating the input topics")?;
    println!(
        "xtask: replay: shop revenue per customer and hour (1 h windows, emit_updates, built-in \
         clock lag {HOURLY_CLOCK_LAG_MS} ms); {} orders over {CUSTOMERS} customers in {ROUNDS} \
         rounds, every {SKIP_EVERY}th unpaid; {} replays, seed {}; topics {prefix}-*",
        args.orders, args.replays, args.seed
    );
    let feed = || -> Result<(), parsley_testkit::replay::BoxError> {
        feed(bootstrap, &orders, &payments, &prefix, args).map_err(Into::into)
    };
    let started = Instant::now();
    let started_ms = wall_clock_ms();
    let report = ReplayCheck::new(RuntimeConfig::new(bootstrap), [&orders, &payments])
        .outputs(["hourly-revenue"])
        .output_partitions(PARTITIONS)
        .replays(args.replays)
        .seed(args.seed)
        .prefix(prefix.as_str())
        .on_run(print_run)
        .run(
            |app, outputs| shop::pipeline::hourly_revenue(app, &orders, &payments, &outputs[0]),
            feed,
        )
        .context("the replay check")?;

    let live = &report.live;
    println!("xtask: replay: summary");
    println!(
        "  runs: {} (the live run and {} replays)",
        report.runs(),
        report.replays.len()
    );
    println!("  keys (customer and hour): {}", live.keys);
    let records: Vec<String> = std::iter::once(live)
        .chain(&report.replays)
        .map(|r| r.records.to_string())
        .collect();
    println!("  output records per run: {}", records.join(", "));
    let walls: Vec<String> = std::iter::once(live)
        .chain(&report.replays)
        .map(|r| format!("{:.1}", r.elapsed.as_secs_f64()))
        .collect();
    println!("  wall time per run, s: {}", walls.join(", "));
    println!(
        "  live run: {} records late (released below the watermark), {} too late for their \
         windows, {} parked behind a later cause",
        live.late, live.too_late, live.raised
    );
    let replay_late: u64 = report
        .replays
        .iter()
        .map(|r| r.late + r.too_late + r.raised)
        .sum();
    println!("  replays: {replay_late} records late, too late or parked behind a later cause");
    println!(
        "  identical: {}",
        if report.identical() { "yes" } else { "no" }
    );
    if let Some((run, d)) = report.first_difference() {
        println!(
            "  first difference: {} ({} of {} keys differ): {d}",
            run.name, run.comparison.differing_keys, live.keys
        );
        let differing = report
            .replays
            .iter()
            .filter(|r| r.comparison.first.is_some())
            .count();
        println!(
            "  replays that differ: {differing} of {}",
            report.replays.len()
        );
    }
    if live.late + live.too_late > 0 {
        println!(
            "  the live run had late records: it took them in the order they arrived, which a \
             replay cannot repeat, so this pipeline's replay cannot be expected to equal it"
        );
    }
    let hour = |ms: i64| ms.div_euclid(3_600_000);
    if !report.identical() && hour(started_ms) != hour(wall_clock_ms()) {
        println!(
            "  the check crossed an hour boundary: a run after it may close, on its clock, the \
             hour the live run left open, and emit that window's final sum, which the live run \
             never reached (a property of windows closed by the wall clock, not of the order); \
             run it again"
        );
    }
    println!(
        "xtask: replay: {} in {:.1} s",
        if report.identical() {
            "every replay equals the live run"
        } else {
            "FAILED: a replay differs from the live run"
        },
        started.elapsed().as_secs_f64()
    );
    Ok(if report.identical() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The wall clock now, ms since the epoch.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The live input: [`ROUNDS`] rounds of orders, each followed by the payments service.
fn feed(
    bootstrap: &str,
    orders: &str,
    payments: &str,
    prefix: &str,
    args: &ReplayArgs,
) -> Result<()> {
    let all = shop::orders::generate(args.orders, CUSTOMERS, args.seed);
    let per_round = all.len().div_ceil(ROUNDS as usize);
    for (round, slice) in all.chunks(per_round).enumerate() {
        shop::orders::write_orders(bootstrap, orders, slice)
            .with_context(|| format!("writing the orders of round {}", round + 1))?;
        payments::run(&PaymentsConfig {
            bootstrap: bootstrap.to_string(),
            orders_topic: orders.to_string(),
            payments_topic: payments.to_string(),
            group: format!("{prefix}-payments-service"),
            skip_every: Some(SKIP_EVERY),
            clock_skew_ms: 0,
        })
        .with_context(|| format!("paying the orders of round {}", round + 1))?;
    }
    Ok(())
}

/// One line per run, as soon as it is done.
fn print_run(r: &RunReport) {
    let fetch = r
        .fetch
        .map_or_else(|| "default fetch sizes".to_string(), |f| f.to_string());
    let verdict = match (&r.fetch, &r.comparison.first) {
        (None, _) => String::new(),
        (Some(_), None) => "; identical to the live run".to_string(),
        (Some(_), Some(d)) => format!(
            "; DIFFERS in {} keys, first: {d}",
            r.comparison.differing_keys
        ),
    };
    println!(
        "xtask: replay: {}: {} records, {} keys, late {}, too late {}, raised {}, {:.1} s; {fetch}{verdict}",
        r.name,
        r.records,
        r.keys,
        r.late,
        r.too_late,
        r.raised,
        r.elapsed.as_secs_f64()
    );
}
