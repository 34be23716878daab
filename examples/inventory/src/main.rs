//! `cargo xtask demo`: a two-stage causal pipeline over generated inventory events, on a
//! real Kafka broker, checked against the generator's ground truth.
//!
//! 1. Four co-partitioned topics are created for this run: stock, sales, facts, ledger.
//! 2. The generator writes rounds of stock events and sales (transactional, some aborted).
//! 3. Stage one (`sales-facts`) turns sales into facts. Stage two (`ledger`) then replays the
//!    stock history together with the facts — a late start, as after a deploy or a replay,
//!    which is when fetch order and causal order part ways — ordered by event time, so each
//!    product's ledger lists its movements in the order they happened (`--arrival-order`
//!    keeps the causal arrival order instead). With `--pace-ms` both stages start first and
//!    the generator writes while they run, pausing between its transactions: live traffic,
//!    for watching the metrics endpoint.
//! 4. The facts and the ledger are read back and the delivery order of every task is checked
//!    by the oracle. The exit status is non-zero on any violation or loss.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use parsley_inventory::check::check;
use parsley_inventory::generator::{GenConfig, GroundTruth, generate};
use parsley_inventory::pipeline::{names, read_logs, topology};
use parsley_runtime::{
    Admin, ClientSettings, GateMode, MetricsSnapshot, Progress, Running, Runtime, RuntimeConfig,
    TopicSpec,
};

#[derive(Parser, Debug)]
#[command(about = "Parsley's inventory demo: a causally ordered two-stage pipeline")]
struct Args {
    /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP, else the local broker).
    #[arg(long)]
    bootstrap: Option<String>,
    /// Number of products.
    #[arg(long, default_value_t = 2_000)]
    products: usize,
    /// Rounds of stock-then-sales per partition slice.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Random seed of the generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Bytes of padding per stock event (stock records heavier than facts).
    #[arg(long, default_value_t = 400)]
    note_bytes: usize,
    /// Share of generator transactions that abort.
    #[arg(long, default_value_t = 0.05)]
    abort_ratio: f64,
    /// Commit interval of the stages, ms.
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// Start both stages at once instead of stage two after stage one has caught up.
    #[arg(long)]
    together: bool,
    /// Negative control: run the stages with the gate switched off (arrival order), to see
    /// what the check reports without it. The demo then fails if the race produced any
    /// out-of-order delivery. Implies `--arrival-order` (the event-time sort would hide it).
    #[arg(long)]
    gate_off: bool,
    /// The ledger keeps causal (arrival) order instead of ordering by event time.
    #[arg(long)]
    arrival_order: bool,
    /// Run the pipeline over the local broker's SASL_SSL listener (SCRAM-SHA-512 over TLS):
    /// the stages' clients and the generator's connect with its credentials and CA; the check
    /// reads the outputs back over the plain listener.
    #[arg(long, conflicts_with = "bootstrap")]
    secure: bool,
    /// Where the stages serve their metrics (`/metrics`, Prometheus text), health
    /// (`/health/live`, `/health/ready`) and why records wait (`/explain`) while they run; port
    /// 0 picks a free port, printed at start.
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_address: SocketAddr,
    /// Serve no metrics endpoint.
    #[arg(long, conflicts_with = "metrics_address")]
    no_metrics: bool,
    /// Live traffic: start both stages first, then write the generator's transactions with
    /// this pause, ms, between one and the next (0, the default: write every event first,
    /// then start the stages). For watching the metrics of a pipeline that keeps up with its
    /// input: `--rounds 100 --pace-ms 400` runs for about three minutes.
    #[arg(long, default_value_t = 0, conflicts_with = "together")]
    pace_ms: u64,
}

fn main() -> ExitCode {
    // librdkafka's own warnings about transient states (a coordinator still loading on a
    // fresh broker) are retried by the client; show them with RUST_LOG=librdkafka=warn.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("inventory: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<bool> {
    let (bootstrap, clients) = if args.secure {
        let listener = parsley_testkit::broker::secure_listener()?.context(
            "--secure needs the local broker's secure listener (none is recorded: on an \
             external cluster there is none; else restart the broker with `cargo kafka \
             down && cargo kafka up`)",
        )?;
        let clients = ClientSettings::new().set_all(listener.client_properties());
        (listener.bootstrap, clients)
    } else {
        let bootstrap = match &args.bootstrap {
            Some(b) => b.clone(),
            None => parsley_testkit::broker::bootstrap()?,
        };
        (bootstrap, ClientSettings::new())
    };
    let run_id = format!("inv-{:08x}", rand::random::<u32>());
    println!(
        "Parsley inventory demo — run {run_id} on {bootstrap}: {} products, {} partitions, {} rounds, seed {}{}",
        args.products,
        args.partitions,
        args.rounds,
        args.seed,
        if args.gate_off {
            " — NEGATIVE CONTROL: gate off"
        } else {
            ""
        }
    );
    let admin = Admin::connect(&bootstrap, &clients, Duration::from_secs(30))?;
    let names = names(&run_id);
    let infos = admin.create_topics(
        &[&names.stock, &names.sales, &names.facts, &names.ledger]
            .map(|n| TopicSpec::new(n.as_str(), args.partitions)),
    )?;
    let (facts_info, ledger_info) = (infos[2].clone(), infos[3].clone());

    // Writes the generator's events: before the stages start, or with `--pace-ms` while they
    // run. The ground truth and the seconds it took.
    let gen_config = GenConfig {
        products: args.products,
        rounds: args.rounds,
        partitions: args.partitions,
        seed: args.seed,
        note_bytes: args.note_bytes,
        abort_ratio: args.abort_ratio,
        transactional_prefix: format!("{run_id}-generator"),
        pace: Duration::from_millis(args.pace_ms),
        rate: None,
        control: None,
        clients: clients.clone(),
    };
    let write = || -> Result<(GroundTruth, f64)> {
        let started = Instant::now();
        let bar = ProgressBar::new(0);
        let truth = generate(&bootstrap, &names.stock, &names.sales, &gen_config, &bar)?;
        Ok((truth, started.elapsed().as_secs_f64()))
    };
    let event_time = !(args.arrival_order || args.gate_off);
    let topology = topology(&run_id, &names, event_time)?;
    let mut config = RuntimeConfig::new(&bootstrap)
        .client_settings(clients)
        .commit_interval(Duration::from_millis(args.commit_interval_ms))
        .gate(if args.gate_off {
            GateMode::Off
        } else {
            GateMode::Causal
        });
    if !args.no_metrics {
        config = config.metrics_address(args.metrics_address);
    }
    let runtime = Runtime::new(topology, config);

    let (truth, generate_secs, pipeline_started);
    let (one, two, one_secs, two_secs);
    if args.pace_ms > 0 {
        // Live: the stages run while the generator writes.
        let running = runtime.start()?;
        announce(&running, "sales-facts + ledger");
        pipeline_started = Instant::now();
        (truth, generate_secs) = write()?;
        let expected = [
            ("sales-facts", truth.sales),
            ("ledger", truth.stock_events + truth.sales),
        ];
        await_committed(&running, &expected)?;
        let secs = pipeline_started.elapsed().as_secs_f64();
        let stats = running.stop()?;
        (one, two) = (stats[0].1, stats[1].1);
        (one_secs, two_secs) = (secs, secs);
    } else {
        (truth, generate_secs) = write()?;
        let expected_one = truth.sales;
        let expected_two = truth.stock_events + truth.sales;
        pipeline_started = Instant::now();
        if args.together {
            let running = runtime.start()?;
            announce(&running, "sales-facts + ledger");
            await_committed(
                &running,
                &[("sales-facts", expected_one), ("ledger", expected_two)],
            )?;
            let secs = pipeline_started.elapsed().as_secs_f64();
            let stats = running.stop()?;
            (one, two) = (stats[0].1, stats[1].1);
            (one_secs, two_secs) = (secs, secs);
        } else {
            let first = runtime.start_stages(&["sales-facts"])?;
            announce(&first, "sales-facts");
            await_committed(&first, &[("sales-facts", expected_one)])?;
            one_secs = pipeline_started.elapsed().as_secs_f64();
            // Stopped before the ledger starts (it has nothing left to do), so that the
            // ledger's endpoint can take the same address.
            one = first.stop()?[0].1;
            let second_started = Instant::now();
            let second = runtime.start_stages(&["ledger"])?;
            announce(&second, "ledger");
            await_committed(&second, &[("ledger", expected_two)])?;
            two_secs = second_started.elapsed().as_secs_f64();
            two = second.stop()?[0].1;
        }
    }
    let pipeline_secs = pipeline_started.elapsed().as_secs_f64();

    let logs = read_logs(&facts_info, &ledger_info)?;
    let outcome = check(&truth, &names, args.partitions, &logs);

    println!();
    println!(
        "generator: {} stock events + {} sales committed in {} transactions ({} events in aborted transactions) in {generate_secs:.1} s",
        truth.stock_events, truth.sales, truth.transactions, truth.aborted_events
    );
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>8} {:>13} {:>8} {:>10}",
        "stage", "records in", "records out", "held", "txns", "max wait ms", "seconds", "records/s"
    );
    for (name, m, secs) in [("sales-facts", one, one_secs), ("ledger", two, two_secs)] {
        print_row(name, &m, secs);
    }
    let total = one.committed_deliveries + two.committed_deliveries;
    println!(
        "pipeline: {total} deliveries in {pipeline_secs:.1} s = {:.0} records/s",
        total as f64 / pipeline_secs
    );
    println!();
    match &outcome.oracle {
        Ok(report) => println!(
            "check: the oracle replayed {} sends and {} deliveries from ground truth and checked {} ancestor constraints: no causal violation",
            report.sends, report.deliveries, report.constraints
        ),
        Err(v) => println!("check: CAUSAL VIOLATION: {v}"),
    }
    for problem in &outcome.completeness {
        println!("check: INCOMPLETE: {problem}");
    }
    for problem in &outcome.state {
        println!("check: STATE: {problem}");
    }
    if outcome.state.is_empty() {
        println!(
            "check: every fact's units sold and every ledger entry's stock level is the fold of the deliveries before it (state exactly once)"
        );
    }
    println!(
        "check: {} ledger entries with a negative stock level (a sale applied before its stock)",
        outcome.oversold
    );
    // Every out-of-order release of an event-time ledger must be a record it counted: late
    // (released at once), or raised (parked behind a causal ancestor with a later time).
    let ordered = !event_time || outcome.event_time_disorder <= two.late + two.raised;
    if event_time {
        println!(
            "check: the ledger orders by event time: {} of {} entries out of event-time order per product; the stage counted {} records late and {} parked behind a later cause{}",
            outcome.event_time_disorder,
            logs.ledger.len(),
            two.late,
            two.raised,
            if ordered {
                ""
            } else {
                " — MORE DISORDER THAN THE STAGE COUNTED"
            }
        );
    } else {
        println!(
            "check: the ledger keeps arrival (causal) order: {} of {} entries out of event-time order per product",
            outcome.event_time_disorder,
            logs.ledger.len()
        );
    }
    let passed = outcome.passed() && ordered;
    if passed && event_time {
        println!(
            "RESULT: PASS — every record delivered exactly once, in causal order, each product's ledger in event-time order"
        );
    } else if passed {
        println!("RESULT: PASS — every record delivered exactly once, in causal order");
    } else {
        println!("RESULT: FAIL");
    }
    Ok(passed)
}

fn print_row(name: &str, m: &MetricsSnapshot, secs: f64) {
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>8} {:>13.1} {:>8.1} {:>10.0}",
        name,
        m.committed_deliveries,
        m.committed_emissions,
        m.held,
        m.transactions,
        m.max_gate_wait_us as f64 / 1000.0,
        secs,
        m.committed_deliveries as f64 / secs
    );
}

/// Says where the metrics endpoint of `stages` serves, if it does.
fn announce(running: &Running, stages: &str) {
    if let Some(address) = running.metrics_address() {
        println!(
            "{stages}: metrics at http://{address}/metrics, health at http://{address}/health/live and /health/ready"
        );
    }
}

/// Waits until each stage has committed its expected deliveries, on progress events.
fn await_committed(running: &Running, targets: &[(&str, u64)]) -> Result<()> {
    let bar = ProgressBar::new(targets.iter().map(|(_, n)| n).sum());
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:<22} {bar:30} {pos}/{len} committed deliveries  {msg}",
        )
        .expect("template"),
    );
    bar.set_prefix(
        targets
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" + "),
    );
    // A safety net that fails loudly; progress itself is driven by commit events.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let metrics = running.metrics();
        let committed = |stage: &str| {
            metrics
                .iter()
                .find(|(n, _)| n == stage)
                .map_or(0, |(_, m)| m.committed_deliveries)
        };
        bar.set_position(targets.iter().map(|(s, _)| committed(s)).sum());
        bar.set_message(parsley_runtime::progress_summary(&running.task_metrics()));
        if targets.iter().all(|(s, n)| committed(s) >= *n) {
            bar.finish();
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("the pipeline did not commit the expected deliveries in time: {metrics:?}");
        }
        // Commits drive the bar; a restore commits nothing, so look again within 200 ms.
        if let Some(Progress::Failed { stage, error }) =
            running.next_progress(left.min(Duration::from_millis(200)))
        {
            bail!("stage {stage} failed: {error}");
        }
    }
}
