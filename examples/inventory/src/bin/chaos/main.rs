//! `cargo xtask chaos --runs N --seed S`: the inventory pipeline under faults, checked by the
//! oracle from ground truth.
//!
//! Each run creates fresh topics, writes the workload with the generator (transactional, a
//! tenth of its transactions aborted: a plain producer injecting aborted transactions into the
//! inputs) while the two stages run as **separate OS processes** (`chaos worker`), and injects
//! faults at random moments:
//! - `kill`: `kill -9` of a stage process, mid-transaction or not, then a restart under the
//!   same instance id (a restarted process keeps its identity);
//! - `crash`: a stage process is replaced by one that dies exactly between its state write and
//!   its commit (`chaos worker --crash-after-changelog`, which arms the runtime's crash point
//!   `CrashPoint::AfterChangelog`: at its first commit with deliveries, once its changelog
//!   records are in the log, it aborts with no cleanup; case C10), then by a normal one under
//!   the same instance id;
//! - `join`: a second process of a stage joins the group (new instance id) and later leaves
//!   gracefully;
//! - `broker`: the broker restarts (same port, same data).
//!
//! With `--cluster`, on the local three-node cluster, the cluster's faults join them (see
//! [`cluster`]): `kill -9` of a partition leader, of a transaction coordinator and of a group
//! coordinator, a controlled shutdown, a preferred-leader election during the stages'
//! transactions, and writes refused by `min.insync.replicas` while a node is down.
//!
//! When the generator is done and every committed output is in, the oracle checks every
//! delivery of every task (facts and ledger partitions are the tasks' delivery logs) and the
//! completeness check counts each committed input's contributions: exactly one, to the outputs
//! and to the state they show (each fact's running total and each ledger entry's level is
//! refolded from the ground truth along the delivery log). Fault times come
//! from the seed, so a failing run prints its seed and replays with `--seed`.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use indicatif::ProgressBar;
use parsley_inventory::check::check;
use parsley_inventory::generator::{GenConfig, generate};
use parsley_inventory::pipeline::{names, read_logs};
use parsley_runtime::{Admin, DELIVERY_TARGET, TopicSpec};
use parsley_testkit::fixtures::read_committed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod cluster;
mod pauses;
mod procs;
mod soak;
mod soak_chart;
mod soak_report;
mod soak_stats;
use cluster::ClusterFault;
use procs::{
    COMMIT_INTERVAL_MS, Driver, QUIET, STAGE_TIMEOUT_MS, now_ms, run_topics, stop, suite_logs,
    wait_for_leaders, worker,
};

#[derive(Parser, Debug)]
#[command(about = "The inventory pipeline under faults (kill -9, join/leave, broker restart)")]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Run the fault-injection suite.
    Run {
        /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP, else the local broker).
        #[arg(long)]
        bootstrap: Option<String>,
        /// Runs, each with its own seed (`seed`, `seed + 1`, …).
        #[arg(long, default_value_t = 3)]
        runs: u64,
        /// Seed of the first run.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Rounds of the generator per partition slice.
        #[arg(long, default_value_t = 8)]
        rounds: usize,
        /// Faults per run (at least one of each kind over the whole suite).
        #[arg(long, default_value_t = 4)]
        faults: usize,
        /// The ledger orders its deliveries by event time (no control stream): its timer
        /// queue — parked records in changelog segments, the watermark, the late counts — goes
        /// through every fault too. The checks are the same: causal order, each committed
        /// input exactly once in the outputs and in the state.
        #[arg(long)]
        event_time: bool,
        /// On the local three-node cluster (its bootstrap list unless `--bootstrap` is
        /// given), with the cluster's faults as well.
        #[arg(long)]
        cluster: bool,
        /// Stream threads per stage in each stage process (`RuntimeConfig::stream_threads`):
        /// each thread a member of the stage's group with its own transactional producer.
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// A long run at half the pipeline's measured maximum throughput with a fault every few
    /// minutes: memory, end-to-end latency per window, the oracle's check at the end.
    Soak {
        /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP, else the local broker).
        #[arg(long)]
        bootstrap: Option<String>,
        /// Length of the run, minutes.
        #[arg(long, default_value_t = 60.0)]
        minutes: f64,
        /// Committed input records per second (default: half the measured maximum).
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Mean seconds between faults (each gap drawn from half to one and a half times it).
        #[arg(long, default_value_t = 180.0)]
        fault_every: f64,
        /// On the local three-node cluster, with its faults.
        #[arg(long)]
        cluster: bool,
        /// Width of the report's windows, minutes.
        #[arg(long, default_value_t = 10.0)]
        window_minutes: f64,
        /// Generator rounds of the throughput measurement's backlog.
        #[arg(long, default_value_t = 300)]
        measure_rounds: usize,
        /// Seconds of the live measurement (the generator unpaced, the stages running).
        #[arg(long, default_value_t = 60.0)]
        measure_secs: f64,
        /// Products of the workload (a transaction of the generator holds about a quarter of
        /// them: its size).
        #[arg(long, default_value_t = 400)]
        products: usize,
        /// Directory of the CSV and the chart.
        #[arg(long, default_value = "target/soak")]
        out: std::path::PathBuf,
    },
    /// One stage process (used by `run`; stops cleanly when its stdin closes or on SIGINT or
    /// SIGTERM).
    Worker {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        run_id: String,
        #[arg(long)]
        stage: String,
        #[arg(long)]
        instance: String,
        /// The ledger orders by event time.
        #[arg(long)]
        event_time: bool,
        /// Abort the process at its first commit with deliveries, once its changelog records
        /// are in the log and before its offsets and commit (case C10).
        #[arg(long)]
        crash_after_changelog: bool,
        /// Stream threads of the stage.
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Workers also journal every delivery (the runtime's `parsley::delivery` events) into
    // their log files, for the re-read measurement.
    let default_filter = match args.mode {
        // And the runtime's INFO lines: what a start or a join waits for (the pause check
        // looks for a line inside every long pause).
        Mode::Worker { .. } => format!("{QUIET},parsley_runtime=info,{DELIVERY_TARGET}=trace"),
        Mode::Run { .. } | Mode::Soak { .. } => QUIET.to_string(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_ansi(false)
        .with_timer(EpochMillis)
        .with_writer(std::io::stderr)
        .init();
    let result = match args.mode {
        Mode::Worker {
            bootstrap,
            run_id,
            stage,
            instance,
            event_time,
            crash_after_changelog,
            threads,
        } => worker(
            &bootstrap,
            &run_id,
            &stage,
            &instance,
            (event_time, crash_after_changelog, threads),
        )
        .map(|()| true),
        Mode::Run {
            bootstrap,
            runs,
            seed,
            rounds,
            faults,
            event_time,
            cluster,
            threads,
        } => suite(
            bootstrap,
            runs,
            seed,
            (rounds, faults),
            (event_time, cluster, threads),
        ),
        Mode::Soak {
            bootstrap,
            minutes,
            rate,
            seed,
            fault_every,
            cluster,
            window_minutes,
            measure_rounds,
            measure_secs,
            products,
            out,
        } => soak::soak(soak::SoakArgs {
            measure_secs,
            bootstrap,
            products,
            minutes,
            rate,
            seed,
            fault_every,
            cluster,
            window_minutes,
            measure_rounds,
            out,
        }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("chaos: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The generator's pause between transactions, ms: the workload spans the fault window (eight
/// rounds of four transactions take about 32 × 0.15 s), and a transaction every 150 ms keeps
/// a stage with uncommitted work about half the time, so kills hit work in hand.
const PACE_MS: u64 = 150;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    Crash,
    Join,
    Broker,
    Cluster(ClusterFault),
}

/// How long a process armed with `--crash-after-changelog` may run without reaching a commit
/// with deliveries (no input came its way) before it is killed instead. Fault scheduling, not
/// synchronisation: the abort itself is observed by the process's exit status.
const CRASH_WAIT: Duration = Duration::from_secs(20);

#[derive(Default)]
struct RunReport {
    faults: BTreeMap<&'static str, u32>,
    deliveries: u64,
    aborted_events: u64,
    violation: Option<String>,
    completeness: Vec<String>,
    /// Outputs whose state is not the fold of the deliveries before them, per stage.
    state: Vec<String>,
    oversold: u64,
    secs: f64,
    /// The most records of one channel that a killed process had delivered and another
    /// process delivered again (re-read), over the run's kills.
    reread_max: usize,
    /// The longest span of first-delivery times of the records one kill made the next owner
    /// re-read on one channel, ms: at most one commit interval when only uncommitted work is
    /// redone.
    reread_span_ms: i64,
    /// The longest time between a re-read record's first delivery and the kill, ms (the span
    /// plus a commit the kill interrupted).
    reread_window_ms: i64,
    /// What each cluster fault did, in order.
    cluster_faults: Vec<String>,
    /// The longest time a stage went without a delivery between its first and its last, ms.
    longest_pause_ms: i64,
    /// Pauses longer than the stages' timeout with no log line of a stage in them.
    silent_stalls: Vec<String>,
}

impl RunReport {
    /// No causal violation, every committed input contributed exactly once to the committed
    /// outputs and to the state they show, no oversold entry.
    fn passed(&self) -> bool {
        self.violation.is_none()
            && self.completeness.is_empty()
            && self.state.is_empty()
            && self.oversold == 0
            && self.silent_stalls.is_empty()
    }
}

fn suite(
    bootstrap: Option<String>,
    runs: u64,
    seed: u64,
    (rounds, faults): (usize, usize),
    (event_time, on_cluster, threads): (bool, bool, usize),
) -> Result<bool> {
    let bootstrap = match bootstrap {
        Some(b) => b,
        None if on_cluster => parsley_testkit::cluster::bootstrap()?,
        None => parsley_testkit::broker::bootstrap()?,
    };
    let logs = suite_logs(&std::env::temp_dir().join("parsley-chaos"))?;
    println!(
        "chaos: {runs} run(s) from seed {seed} on {bootstrap}, {faults} faults each, ledger in {} order, {threads} stream thread(s) per stage process; worker logs in {} (removed if every run passes)",
        if event_time { "event-time" } else { "arrival" },
        logs.display()
    );
    println!(
        "{:>4} {:>6} {:>5} {:>5} {:>5} {:>7} {:>7} {:>10} {:>8} {:>10} {:>10} {:>5} {:>7} {:>8} {:>10} {:>7} {:>8}  result",
        "run",
        "seed",
        "kill",
        "crash",
        "join",
        "broker",
        "cluster",
        "deliveries",
        "aborted",
        "violations",
        "dup/loss",
        "state",
        "re-read",
        "span ms",
        "window ms",
        "pause s",
        "seconds"
    );
    let (mut reread_max, mut span_max, mut window_max, mut pause_max) = (0, 0, 0, 0);
    let mut all_ok = true;
    let mut totals: BTreeMap<&'static str, u32> = BTreeMap::new();
    for run in 0..runs {
        let s = seed + run;
        // Every fault kind at least once over the suite: run r starts with kind r mod the number of kinds.
        let report = one_run(
            &bootstrap,
            &logs,
            s,
            run,
            RunShape {
                rounds,
                faults,
                event_time,
                on_cluster,
                threads,
            },
        )?;
        for (k, n) in &report.faults {
            *totals.entry(k).or_default() += n;
        }
        let ok = report.passed();
        all_ok &= ok;
        reread_max = reread_max.max(report.reread_max);
        window_max = window_max.max(report.reread_window_ms);
        span_max = span_max.max(report.reread_span_ms);
        pause_max = pause_max.max(report.longest_pause_ms);
        println!(
            "{:>4} {:>6} {:>5} {:>5} {:>5} {:>7} {:>7} {:>10} {:>8} {:>10} {:>10} {:>5} {:>7} {:>8} {:>10} {:>7.1} {:>8.1}  {}",
            run,
            s,
            report.faults.get("kill").unwrap_or(&0),
            report.faults.get("crash").unwrap_or(&0),
            report.faults.get("join").unwrap_or(&0),
            report.faults.get("broker").unwrap_or(&0),
            ClusterFault::ALL
                .iter()
                .map(|f| report.faults.get(f.name()).unwrap_or(&0))
                .sum::<u32>(),
            report.deliveries,
            report.aborted_events,
            u32::from(report.violation.is_some()),
            report.completeness.len(),
            report.state.len(),
            report.reread_max,
            report.reread_span_ms,
            report.reread_window_ms,
            report.longest_pause_ms as f64 / 1000.0,
            report.secs,
            if ok { "PASS" } else { "FAIL" }
        );
        if let Some(v) = &report.violation {
            println!("  causal violation (replay with --seed {s} --runs 1): {v}");
        }
        for c in &report.completeness {
            println!("  duplicate or loss (replay with --seed {s} --runs 1): {c}");
        }
        for c in &report.state {
            println!("  state not exactly once (replay with --seed {s} --runs 1): {c}");
        }
        if report.oversold > 0 {
            println!("  {} ledger entries oversold", report.oversold);
        }
        for line in &report.cluster_faults {
            println!("  {line}");
        }
        for stall in &report.silent_stalls {
            println!("  silent stall (replay with --seed {s} --runs 1): {stall}");
        }
    }
    println!(
        "chaos: faults injected: {} kill -9, {} crash(es) between a state write and its commit, {} join/leave, {} broker restarts, aborted transactions in every run; {}",
        totals.get("kill").unwrap_or(&0),
        totals.get("crash").unwrap_or(&0),
        totals.get("join").unwrap_or(&0),
        totals.get("broker").unwrap_or(&0),
        if all_ok {
            "0 violations, 0 duplicates, 0 losses, every state the fold of its deliveries"
        } else {
            "FAILURES above"
        }
    );
    if on_cluster {
        let counts: Vec<String> = ClusterFault::ALL
            .iter()
            .map(|f| format!("{} {}", totals.get(f.name()).unwrap_or(&0), f.name()))
            .collect();
        println!("chaos: cluster faults injected: {}", counts.join(", "));
    }
    println!(
        "chaos: the longest a stage went without a delivery between its first and its last: {:.1} s; \
         pauses over {} s (the stages' timeout) without a log line: {}",
        pause_max as f64 / 1000.0,
        STAGE_TIMEOUT_MS / 1000,
        if all_ok { "none" } else { "see FAILURES above" }
    );
    println!(
        "chaos: after a kill -9, at most {reread_max} records of one channel were delivered again, \
         first delivered within a span of at most {span_max} ms (commit interval {COMMIT_INTERVAL_MS} ms), \
         at most {window_max} ms before the kill"
    );
    if all_ok {
        // Nothing to look into: a passing suite's worker logs (tens of MB) go.
        if let Err(e) = std::fs::remove_dir_all(&logs) {
            eprintln!("chaos: could not remove {}: {e}", logs.display());
        }
    } else {
        println!("chaos: worker logs kept in {}", logs.display());
    }
    Ok(all_ok)
}

/// What every run of a suite does.
#[derive(Debug, Clone, Copy)]
struct RunShape {
    /// Rounds of the generator per partition slice.
    rounds: usize,
    /// Faults per run.
    faults: usize,
    /// The ledger orders by event time.
    event_time: bool,
    /// On the local cluster, with its faults.
    on_cluster: bool,
    /// Stream threads per stage process.
    threads: usize,
}

fn one_run(
    bootstrap: &str,
    logs: &std::path::Path,
    seed: u64,
    run: u64,
    shape: RunShape,
) -> Result<RunReport> {
    let RunShape {
        rounds,
        faults,
        event_time,
        on_cluster,
        threads,
    } = shape;
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let run_id = format!("chaos-{seed}-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let names = names(&run_id);
    let partitions = 4;
    let admin = Admin::new(bootstrap, Duration::from_secs(30))?;
    let infos = admin.create_topics(
        &[&names.stock, &names.sales, &names.facts, &names.ledger]
            .map(|n| TopicSpec::new(n.as_str(), partitions)),
    )?;
    let (facts, ledger) = (infos[2].clone(), infos[3].clone());
    let mut driver = Driver {
        bootstrap: bootstrap.to_string(),
        run_id: run_id.clone(),
        exe: std::env::current_exe()?,
        logs: logs.to_path_buf(),
        spawned: 0,
        event_time,
        journal: true,
        threads,
    };
    let mut workers = vec![
        driver.spawn("sales-facts", "sf-0")?,
        driver.spawn("ledger", "lg-0")?,
    ];
    let mut generator = Some({
        let (bootstrap, stock, sales, prefix) = (
            bootstrap.to_string(),
            names.stock.clone(),
            names.sales.clone(),
            format!("{run_id}-generator"),
        );
        std::thread::spawn(move || {
            generate(
                &bootstrap,
                &stock,
                &sales,
                &GenConfig {
                    clients: Default::default(),
                    products: 400,
                    rounds,
                    partitions,
                    seed,
                    note_bytes: 100,
                    abort_ratio: 0.1,
                    transactional_prefix: prefix,
                    pace: Duration::from_millis(PACE_MS),
                    rate: None,
                    control: None,
                },
                &ProgressBar::hidden(),
            )
        })
    });
    let mut truth = None;
    // The generator is the workload, not the system under test: it finishes before a broker
    // restart (its own producers would need the same care the stages get).
    let mut finish_generator = |truth: &mut Option<_>| -> Result<()> {
        if let Some(g) = generator.take() {
            *truth = Some(
                g.join()
                    .map_err(|_| anyhow::anyhow!("the generator panicked"))??,
            );
        }
        Ok(())
    };

    let mut report = RunReport::default();
    // Killed workers: their log and the kill's moment (ms since epoch).
    let mut killed: Vec<(PathBuf, i64)> = Vec::new();
    // Broker restarts only on the broker this project started (never on someone's cluster).
    let own_broker = matches!(
        parsley_testkit::broker::status(),
        parsley_testkit::broker::Status::Running { bootstrap: ref b, .. } if b == bootstrap
    );
    let mut kinds = vec![Fault::Kill, Fault::Crash, Fault::Join];
    if own_broker {
        kinds.push(Fault::Broker);
    }
    // The cluster's faults first: run r of the suite starts with kind r mod the number of
    // kinds, so 20 runs start with each of the nine kinds at least twice.
    if on_cluster {
        kinds.splice(0..0, ClusterFault::ALL.map(Fault::Cluster));
    }
    let sources_and_outputs =
        [&names.stock, &names.sales, &names.facts, &names.ledger].map(|n| n.to_string());
    let outputs = [names.facts.clone(), names.ledger.clone()];
    let mut heal = run_topics(&run_id, &names);
    heal.extend(["__consumer_offsets", "__transaction_state"].map(String::from));
    let targets = cluster::Targets {
        sources_and_outputs: &sources_and_outputs,
        outputs: &outputs,
        heal: &heal,
        partitions,
        stages: workers
            .iter()
            .map(|w| cluster::stage_ids(bootstrap, &run_id, w.stage, &w.instance))
            .collect(),
    };
    for i in 0..faults {
        let fault = if i == 0 {
            kinds[(run % kinds.len() as u64) as usize]
        } else {
            kinds[rng.random_range(0..kinds.len())]
        };
        // The fault's moment: random, from the seed (fault timing, not synchronisation).
        std::thread::sleep(Duration::from_millis(rng.random_range(300..2_500)));
        match fault {
            Fault::Kill => {
                let i = rng.random_range(0..workers.len());
                killed.push(driver.kill_and_respawn(&mut workers, i)?);
                *report.faults.entry("kill").or_default() += 1;
            }
            Fault::Crash => {
                use std::os::unix::process::ExitStatusExt;
                let i = rng.random_range(0..workers.len());
                let mut w = workers.remove(i);
                w.child.kill()?;
                w.child.wait()?;
                let mut armed = driver.spawn_with(w.stage, &w.instance, true)?;
                let deadline = Instant::now() + CRASH_WAIT;
                let status = loop {
                    if let Some(status) = armed.child.try_wait()? {
                        break Some(status);
                    }
                    if Instant::now() >= deadline {
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                match status {
                    Some(s) if s.signal() == Some(6) => {
                        *report.faults.entry("crash").or_default() += 1;
                    }
                    Some(s) => bail!(
                        "run {run} (seed {seed}): worker {}/{} armed to abort after its changelog write exited with {s} (log in {})",
                        w.stage,
                        w.instance,
                        armed.log.display()
                    ),
                    None => {
                        // No delivery reached it: a plain kill after all.
                        armed.child.kill()?;
                        armed.child.wait()?;
                        *report.faults.entry("kill").or_default() += 1;
                    }
                }
                let again = driver.spawn(w.stage, &w.instance)?;
                workers.insert(i, again);
            }
            Fault::Join => {
                let stage = if rng.random_bool(0.5) {
                    "sales-facts"
                } else {
                    "ledger"
                };
                let extra = driver.spawn(stage, &format!("extra-{i}"))?;
                std::thread::sleep(Duration::from_millis(rng.random_range(2_000..5_000)));
                stop(extra)?;
                *report.faults.entry("join").or_default() += 1;
            }
            Fault::Broker => {
                finish_generator(&mut truth)?;
                parsley_testkit::broker::restart()?;
                // The broker answers before it leads its partitions again (with thousands of
                // partitions, tens of seconds later): the next fault waits for the evidence
                // that this one is over — every partition of the run has a leader.
                wait_for_leaders(&admin, &run_topics(&run_id, &names), partitions)?;
                *report.faults.entry("broker").or_default() += 1;
            }
            Fault::Cluster(kind) => {
                let what = cluster::inject(kind, &mut rng, &targets)
                    .with_context(|| format!("run {run} (seed {seed}): {}", kind.name()))?;
                report.cluster_faults.push(what);
                *report.faults.entry(kind.name()).or_default() += 1;
            }
        }
        for w in &mut workers {
            if let Some(status) = w.child.try_wait()? {
                bail!(
                    "run {run} (seed {seed}): worker {}/{} exited with {status} (log in {})",
                    w.stage,
                    w.instance,
                    logs.display()
                );
            }
        }
    }
    finish_generator(&mut truth)?;
    let truth = truth.expect("the generator finished");
    report.aborted_events = truth.aborted_events;

    // Done when every committed output is in: one fact per sale, one ledger entry per stock
    // event and fact (counted from the output topics, not from any process's counters).
    let expected = (
        truth.sales as usize,
        (truth.stock_events + truth.sales) as usize,
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let have = (read_committed(&facts).len(), read_committed(&ledger).len());
        if have.0 >= expected.0 && have.1 >= expected.1 {
            break;
        }
        for w in &mut workers {
            if let Some(status) = w.child.try_wait()? {
                bail!(
                    "run {run} (seed {seed}): worker {}/{} exited with {status}",
                    w.stage,
                    w.instance
                );
            }
        }
        if Instant::now() > deadline {
            bail!("run {run} (seed {seed}): outputs {have:?} of {expected:?} after 300 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    for w in workers {
        stop(w)?;
    }
    let logs = read_logs(&facts, &ledger)?;
    let outcome = check(&truth, &names, partitions, &logs);
    report.deliveries = match &outcome.oracle {
        Ok(r) => r.deliveries,
        Err(_) => 0,
    };
    report.violation = outcome.oracle.err().map(|v| v.to_string());
    report.completeness = outcome.completeness;
    report.state = outcome.state;
    report.oversold = outcome.oversold;
    (
        report.reread_max,
        report.reread_span_ms,
        report.reread_window_ms,
    ) = reread(&driver.logs, &run_id, &killed)?;
    let pauses = pauses::pauses(
        &driver.logs,
        &run_id,
        &["sales-facts", "ledger"],
        &format!(" {DELIVERY_TARGET}: delivered "),
        STAGE_TIMEOUT_MS,
    )?;
    report.longest_pause_ms = pauses.longest_ms;
    report.silent_stalls = pauses.silent;
    // A broker that keeps every run's partitions restarts ever slower; a failed run keeps its
    // topics for the post-mortem.
    if report.passed() {
        let topics = run_topics(&run_id, &names);
        admin.delete_topics(&topics.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
    report.secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Log timestamps as milliseconds since the Unix epoch: the driver compares a worker's
/// delivery times with the moment of a kill without parsing dates.
struct EpochMillis;

impl tracing_subscriber::fmt::time::FormatTime for EpochMillis {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{}", now_ms())
    }
}

/// One line of a worker's delivery journal: (ms since epoch, topic, partition, offset).
fn journal_line(line: &str) -> Option<(i64, String, i32, i64)> {
    let rest = line.split_once(&format!(" {DELIVERY_TARGET}: delivered "))?;
    let at = rest.0.split_whitespace().next()?.parse().ok()?;
    let field = |name: &str| {
        rest.1
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    Some((
        at,
        // A `&str` field: quoted by `fmt`.
        field("topic")?.trim_matches('"').to_string(),
        field("partition")?.parse().ok()?,
        field("offset")?.parse().ok()?,
    ))
}

/// The re-read after each kill: records the killed process delivered that a process started
/// later delivered again (its uncommitted work). Returns the most such records on one channel
/// after one kill, the longest span of their first-delivery times on one channel (ms; with a
/// commit every [`COMMIT_INTERVAL_MS`] counted from the end of the last one, at most one
/// interval), and the longest time from such a record's first delivery to its kill (ms; the
/// span plus a commit the kill interrupted).
fn reread(logs: &Path, run_id: &str, killed: &[(PathBuf, i64)]) -> Result<(usize, i64, i64)> {
    // Every journal of the run, in spawn order (the file name's last number).
    let mut journals: Vec<(u32, PathBuf)> = std::fs::read_dir(logs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{run_id}-")))
        })
        .filter_map(|p| {
            let n = p.file_stem()?.to_str()?.rsplit('-').next()?.parse().ok()?;
            Some((n, p))
        })
        .collect();
    journals.sort();
    let read = |p: &Path| -> Result<Vec<(i64, String, i32, i64)>> {
        let text = std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
        Ok(text.lines().filter_map(journal_line).collect())
    };
    let (mut most, mut span, mut window) = (0, 0, 0);
    for (log, at) in killed {
        let Some(k) = journals.iter().position(|(_, p)| p == log) else {
            continue;
        };
        let later: HashSet<(String, i32, i64)> = journals[k + 1..]
            .iter()
            .map(|(_, p)| read(p))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .map(|(_, t, p, o)| (t, p, o))
            .collect();
        // Per channel: re-read records, first and last first-delivery time.
        let mut per_channel: HashMap<(String, i32), (usize, i64, i64)> = HashMap::new();
        for (ts, t, p, o) in read(log)? {
            if later.contains(&(t.clone(), p, o)) {
                let e = per_channel.entry((t, p)).or_insert((0, ts, ts));
                *e = (e.0 + 1, e.1.min(ts), e.2.max(ts));
                window = window.max(at - ts);
            }
        }
        for (n, first, last) in per_channel.into_values() {
            most = most.max(n);
            span = span.max(last - first);
        }
    }
    Ok((most, span, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_line_parses_to_its_time_and_coordinate() {
        let line = "1796022811838 TRACE run{stage=\"ledger\"}:deliver{partition=3}: \
                    parsley::delivery: delivered topic=\"chaos-1-ab.ledger\" partition=3 offset=1234";
        assert_eq!(
            journal_line(line),
            Some((1_796_022_811_838, "chaos-1-ab.ledger".to_string(), 3, 1234))
        );
        assert_eq!(journal_line("1796022811838  WARN other: x"), None);
        assert_eq!(
            journal_line(
                "not-a-time TRACE parsley::delivery: delivered topic=t partition=0 offset=1"
            ),
            None
        );
    }
}
