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
//!    With `--rebalance leave`, a second instance of the live pipeline (same application id,
//!    its own instance id) starts before the first round, runs tasks of both stages, and stops
//!    after the second round, leaving its groups: its tasks are handed over to the first
//!    instance in a rebalance while the input is written. With `--rebalance silent` it is a
//!    static member with a [`SILENT_SESSION`] session, which does not leave its groups when it
//!    stops — as a process that died: its tasks stay idle until its session times out, then
//!    the first instance takes them over. Its late records count with the live run's.
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
/// The session timeout of the second instance with `--rebalance silent`.
const SILENT_SESSION: Duration = Duration::from_secs(6);

/// How the second live instance of `--rebalance` leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Leaving {
    /// It stops and leaves its groups: a rebalance at once.
    Leave,
    /// A static member, it stops without leaving: its tasks wait for its session to time out.
    Silent,
}

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
    /// Run a second live instance that joins before the first round and stops after the
    /// second, leaving its groups (`leave`) or not, as a process that died (`silent`).
    #[arg(long, value_enum)]
    rebalance: Option<Leaving>,
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
    let second_late = std::cell::Cell::new(0u64);
    let feed = || -> Result<(), parsley_testkit::replay::BoxError> {
        feed(bootstrap, &orders, &payments, &prefix, args, &second_late).map_err(Into::into)
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

    let mut live = report.live.clone();
    live.late += second_late.get();
    let live = &live;
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
    if let Some(leaving) = args.rebalance {
        println!(
            "  rebalances: a second live instance joined before the first round and stopped \
             after the second ({leaving:?}); {} of the live run's late records were counted by it",
            second_late.get()
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

/// The live input: [`ROUNDS`] rounds of orders, each followed by the payments service. With
/// `--rebalance`, a second instance of the live pipeline runs from before the first round
/// until after the second; its late records are added to `second_late`.
fn feed(
    bootstrap: &str,
    orders: &str,
    payments: &str,
    prefix: &str,
    args: &ReplayArgs,
    second_late: &std::cell::Cell<u64>,
) -> Result<()> {
    let all = shop::orders::generate(args.orders, CUSTOMERS, args.seed);
    let per_round = all.len().div_ceil(ROUNDS as usize);
    let mut second = None;
    if let Some(leaving) = args.rebalance {
        // The live run's application and output, as the replay check names them.
        let app = format!("{prefix}-live");
        let output = format!("{app}-hourly-revenue");
        let topology = shop::pipeline::hourly_revenue(&app, orders, payments, &output)?;
        let mut config = RuntimeConfig::new(bootstrap).instance_id("second");
        if leaving == Leaving::Silent {
            config = config
                .static_membership(true)
                .consumer_property("session.timeout.ms", SILENT_SESSION.as_millis().to_string());
        }
        let running = parsley_runtime::Runtime::new(topology, config)
            .start()
            .context("starting the second live instance")?;
        wait_for_tasks(&running)?;
        second = Some(running);
    }
    for (round, slice) in all.chunks(per_round).enumerate() {
        if round == 2
            && let Some(running) = second.take()
        {
            let stages = running
                .stop()
                .context("stopping the second live instance")?;
            second_late.set(stages.iter().map(|(_, m)| m.late).sum());
            let delivered: Vec<String> = stages
                .iter()
                .map(|(n, m)| format!("{n} {}", m.delivered))
                .collect();
            println!(
                "xtask: replay: the second live instance stopped after round 2 (delivered: {}; \
                 {} records late there)",
                delivered.join(", "),
                second_late.get()
            );
        }
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

/// Waits until every stage of `running` runs at least one task (the rebalances of its join
/// are over).
fn wait_for_tasks(running: &parsley_runtime::Running) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let tasks = running.task_metrics();
        if tasks.iter().all(|(_, t)| {
            t.iter()
                .any(|t| t.phase == parsley_runtime::TaskPhase::Running)
        }) {
            let held: Vec<String> = tasks
                .iter()
                .map(|(n, t)| format!("{n} {}", t.len()))
                .collect();
            println!(
                "xtask: replay: a second live instance runs tasks: {}",
                held.join(", ")
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the second live instance got no task within 120 s: {tasks:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
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
