//! Project automation: `cargo xtask <command>`.
//!
//! - `kafka up|down|status|read`: the local single-node Kafka broker, or with `up --brokers 3`
//!   a local three-node cluster: the commands of `cargo kafka` (`parsley_broker::cli`), which
//!   build nothing but the launcher;
//! - `demo`: starts the broker if none, runs the inventory demo, stops what it started;
//! - `test`: starts the broker if none, checks the crates' layering (`layering`), runs
//!   `cargo fmt --check`, clippy with warnings denied,
//!   every workspace test (unit, integration, doctests, the book's examples), the book's build
//!   and link check (`book`), the comparison with Kafka Streams (`conformance --quick`), the
//!   stampers' and the schema-registry codecs' tests (`python`, `registry`, `java`), a
//!   small run of the demo, the end-to-end benchmark's smoke run (`bench e2e --quick`, dev
//!   profile), two seeded fault-injection runs and a two-minute soak, a short run of every fuzz target and its
//!   negative control, stops what it started;
//! - `registry`: the schema-registry codecs against the local registry run as a process and
//!   against Confluent's Python serializers (see [`registry`]); needs no broker;
//! - `book`: builds the book with mdBook (installed at a pinned version when missing),
//!   warnings denied, and checks every relative link and anchor of the built pages and every
//!   relative link of the README (see [`book`]); needs no broker;
//! - `layering`: checks on the dependency tree that each crate depends only on the crates
//!   below it and that the crates below the Kafka half build no C (see [`layering`]);
//! - `soak-gate`: many random simulator histories through the gate and the oracle;
//! - `chaos`: the inventory stages as processes under injected faults, checked by the oracle;
//! - `soak`: the same pipeline for an hour at half its measured maximum throughput with a
//!   fault every few minutes: memory, latency per window, the oracle at the end (see [`soak`]);
//! - `experiment`: starts the broker if none, runs the event-time ordering experiment (a fixed
//!   window, timeout idleness in two layers and in one, offset completeness, on the same
//!   generated input per seed; then windowed counting closed by evidence against stream time;
//!   release build), prints its tables and writes them with a chart under
//!   `target/experiment/`, stops what it started;
//! - `bench e2e`: builds the Kafka Streams program with Maven (see [`compare::java`]), starts
//!   the broker if none, runs the end-to-end benchmark (a raw transactional loop, Parsley's
//!   pass-through and counting stages and Kafka Streams' pass-through and count, release
//!   build) and prints its table, stops what it started; `--quick` is a short smoke run;
//! - `compare`: starts the broker if none, runs the word count and shop pipelines in Kafka
//!   Streams and in Parsley on the same generated input and compares the final value of every
//!   key with each other and with the answer the inputs give (see [`compare`]), stops what it
//!   started;
//! - `conformance`: builds the Kafka Streams program of `compare/conformance/kafka-streams/`
//!   with Maven and runs generated scenarios of every DSL operator through Kafka Streams' and
//!   Parsley's test drivers, compared exactly and after the documented normalisations (see
//!   [`conformance`]); needs no broker;
//! - `replay`: starts the broker if none, runs the shop's revenue per customer and hour live
//!   while its input is written, then replays it under fresh application ids with randomized
//!   fetch sizes and compares every output key's values with the live run's (see [`replay`]),
//!   stops what it started;
//! - `inspect`: asks a running process why its records wait (`GET /explain` on its metrics
//!   endpoint) and prints a table (see [`inspect`]);
//! - `fuzz`: the `cargo-fuzz` targets under `fuzz/` for a time or a number of executions each
//!   (see [`fuzz`]).
//!
//! Missing Java or Maven are installed from Debian's packages when running as root on a
//! Debian-like machine; elsewhere the error says what to install.
#![forbid(unsafe_code)]

mod bench;
mod book;
mod cluster;
mod compare;
mod conformance;
mod fuzz;
mod inspect;
mod jvm;
mod layering;
mod python;
mod registry;
mod replay;
mod soak;

use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use parsley_testkit::broker::{self, Status, Up};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Parsley project automation")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Manage the local Kafka broker.
    Kafka {
        #[command(subcommand)]
        action: KafkaCmd,
    },
    /// Run the inventory demo on the local broker (started if none is running).
    Demo {
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
        /// Extra arguments for the demo binary (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run many random simulator histories through the gate and the oracle.
    SoakGate {
        /// How many histories.
        #[arg(long, default_value_t = 100_000)]
        histories: u64,
        /// The first seed (histories use seeds `seed..seed + histories`).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also run every negative control and report its failure rate.
        #[arg(long)]
        negative_controls: bool,
    },
    /// Run the inventory pipeline's stages as processes under injected faults (kill -9,
    /// join/leave, broker restart, aborted input transactions) and check every run with the
    /// oracle.
    Chaos {
        /// Runs (seeds `seed`, `seed + 1`, …).
        #[arg(long, default_value_t = 20)]
        runs: u64,
        /// Seed of the first run; a failing run prints its seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
        /// The ledger stage orders by event time: its timer queue goes through the faults.
        #[arg(long)]
        event_time: bool,
        /// On the local three-node cluster (started if none runs), with its own faults on top:
        /// kill -9 of a partition leader, of the transaction and of the group coordinator, a
        /// controlled shutdown, a preferred-leader election during a transaction, and a node
        /// down while `min.insync.replicas` refuses writes.
        #[arg(long)]
        cluster: bool,
        /// Stream threads per stage in each stage process (`RuntimeConfig::stream_threads`).
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// The inventory pipeline for a long run at half its measured maximum throughput, a fault
    /// every few minutes (kill -9 of a stage process, a broker restart or join/leave; with
    /// `--cluster` kill -9 of a stage process, of a partition leader's node and of a
    /// transaction or group coordinator, a preferred-leader election); each stage's RSS and
    /// the end-to-end latency per window, the oracle's check at the end; CSV and chart under
    /// `target/soak/`.
    Soak {
        /// Length, minutes.
        #[arg(long, default_value_t = 60.0)]
        minutes: f64,
        /// Committed input records per second, or `measured`: half the maximum measured first.
        #[arg(long, default_value = "measured")]
        rate: String,
        /// Seed of the fault schedule and the workload.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Mean seconds between faults.
        #[arg(long, default_value_t = 180.0)]
        fault_every: f64,
        /// On the local three-node cluster (started if none runs), with its faults.
        #[arg(long)]
        cluster: bool,
        /// Leave a broker or cluster this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
        /// Extra arguments for the driver (after `--`; `-- --help` lists them).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The event-time ordering experiment (the book's specification, §5) on the local broker
    /// (started if none is running): the same generated input through a fixed window, timeout
    /// idleness in two layers and in one, and offset completeness with the built-in clock; then
    /// windowed counting closed by evidence against stream time with grace, against a batch ground
    /// truth; tables and chart under `target/experiment/`.
    Experiment {
        /// Generator seeds, comma-separated (default: 1,2,3).
        #[arg(long)]
        seeds: Option<String>,
        /// History events (default: 240,000).
        #[arg(long)]
        history_records: Option<u64>,
        /// Products (default: 2,000).
        #[arg(long)]
        products: Option<u32>,
        /// Seconds of live traffic (default: 30).
        #[arg(long)]
        live_secs: Option<f64>,
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
        /// Extra arguments for the experiment binary (after `--`; `-- --help` lists them).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The cargo-fuzz targets (stamp decoder, timer queue changelog, changelog records, gate
    /// sequences), each for a time or a number of executions; installs cargo-fuzz when missing
    /// (needs nightly).
    Fuzz(fuzz::FuzzArgs),
    /// Benchmarks on the local broker (started if none is running).
    Bench {
        #[command(subcommand)]
        kind: bench::BenchCmd,
    },
    /// Run the word count and shop pipelines in Kafka Streams 4.4 and in Parsley on the same
    /// input (local broker, started if none is running) and compare the final value of every
    /// key with each other and with the answer computed from the inputs.
    Compare(compare::CompareArgs),
    /// Parsley's DSL against Kafka Streams 4.4: generated scenarios of every operator through
    /// both test drivers, their outputs compared exactly and after the documented
    /// normalisations; fails on any undocumented difference.
    Conformance(conformance::ConformanceArgs),
    /// "Replay equals live": run the shop's revenue per customer and hour live while its input
    /// is written, replay the input N times under fresh application ids with randomized fetch
    /// sizes, and compare every output key's sequence of values with the live run's (local
    /// broker, started if none is running).
    Replay(replay::ReplayArgs),
    /// Why is it waiting? Fetch `/explain` from a running process's metrics endpoint and print
    /// every wait: stage, task, channel, offset, key, waits for.
    Inspect(inspect::InspectArgs),
    /// Build the book with mdBook (installed at a pinned version when missing), warnings
    /// denied, and check every relative link and anchor in it and in the README.
    Book,
    /// Check the crates' layering on the dependency tree: each crate depends only on the crates
    /// below it, and nothing below the Kafka half builds C.
    Layering,
    /// The Python stamper's tests (`clients/python`): its codec against the stamp's test
    /// vectors and its producer on the local broker (started if needed), in a virtual
    /// environment under `target/python` with `confluent-kafka` from PyPI.
    Python {
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
    },
    /// The schema-registry codecs against the local schema registry run as a process and
    /// against Confluent's serializers (Python's confluent-kafka, in `target/python`).
    Registry,
    /// The JVM stamper's tests (`clients/java`, Maven): its codec against the stamp's test
    /// vectors and its interceptors on the local broker (started if needed).
    Java {
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
    },
    /// How fast a stage commits again after its group or transaction coordinator's node is
    /// killed (kill -9), on the local three-node cluster (started if none runs): per run and
    /// median/worst, the first commit after the kill less the kill and less the new
    /// coordinator's election.
    Failover {
        /// Runs per kind.
        #[arg(long, default_value_t = 10)]
        runs: u32,
        /// The coordinator killed: `group`, `txn` or `both`.
        #[arg(long, default_value = "both", value_parser = ["group", "txn", "both"])]
        kind: String,
        /// librdkafka `debug` contexts for the stage's clients (e.g. `cgrp,eos,protocol`),
        /// logged to stderr with the runtime's DEBUG lines.
        #[arg(long)]
        debug: Option<String>,
        /// Leave a cluster this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
    },
    /// The test command: format check, clippy (warnings denied), every workspace test on the
    /// local broker, the book's build and link check, the comparison with Kafka Streams, the
    /// Python and JVM stampers' tests, the schema-registry codecs' tests, a small demo (also
    /// over SASL_SSL), the
    /// end-to-end benchmark's smoke run, two seeded fault-injection runs and the fuzz targets.
    Test {
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
        /// Only the cluster's test group, on the local three-node cluster (started if none
        /// runs): leader failover, coordinators that leave, `min.insync.replicas`.
        #[arg(long)]
        cluster: bool,
    },
}

#[derive(Subcommand)]
enum KafkaCmd {
    /// Resolve the jars, format storage, start the broker and wait until it answers.
    Up {
        /// Nodes: 1 is the single broker every command uses; more start a separate local
        /// cluster (combined broker+controller nodes, replication factor 3,
        /// `min.insync.replicas=2`) for `test --cluster` and `chaos --cluster`.
        #[arg(long, default_value_t = 1)]
        brokers: usize,
    },
    /// Stop the broker and the cluster this project started.
    Down,
    /// Show whether the broker and the cluster run and where.
    Status,
    /// Print a topic as a `read_committed` consumer sees it, up to its end offsets: one
    /// `key<TAB>value` line per record (UTF-8; `-` for a null key or a tombstone), or with
    /// `--last` the last value of each key, sorted by key.
    Read {
        /// The topic.
        topic: String,
        /// Only the last value of each key.
        #[arg(long)]
        last: bool,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Cmd::Kafka { action } => {
            // The same commands as `cargo kafka …`, which builds only the launcher.
            match action {
                KafkaCmd::Up { brokers } => parsley_broker::cli::up(brokers)?,
                KafkaCmd::Down => parsley_broker::cli::down()?,
                KafkaCmd::Status => parsley_broker::cli::status(),
                KafkaCmd::Read { topic, last } => parsley_broker::cli::read(&topic, last)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Demo { args, .. } if args.iter().any(|a| a == "--help" || a == "-h") => {
            let mut cmd = cargo();
            cmd.args(["run", "--quiet", "--package", "parsley-inventory"])
                .args(["--bin", "parsley-inventory", "--"])
                .args(&args);
            status_code(&mut cmd, "the inventory demo")
        }
        Cmd::Demo { keep_broker, args } => with_broker(keep_broker, |bootstrap| {
            println!("xtask: building and running the inventory demo");
            demo(bootstrap, &args)
        }),
        Cmd::SoakGate {
            histories,
            seed,
            negative_controls,
        } => soak_gate(histories, seed, negative_controls),
        Cmd::Chaos {
            runs,
            seed,
            keep_broker,
            event_time,
            cluster: true,
            threads,
        } => cluster::with_cluster(keep_broker, |bootstrap| {
            chaos(bootstrap, runs, seed, (event_time, threads), true)
        }),
        Cmd::Chaos {
            runs,
            seed,
            keep_broker,
            event_time,
            cluster: false,
            threads,
        } => with_broker(keep_broker, |bootstrap| {
            chaos(bootstrap, runs, seed, (event_time, threads), false)
        }),
        Cmd::Soak {
            minutes,
            rate,
            seed,
            fault_every,
            cluster,
            keep_broker,
            args,
        } => {
            let a = soak::SoakArgs {
                minutes,
                rate: soak::parse_rate(&rate).map_err(|e| anyhow::anyhow!("--rate {e}"))?,
                seed,
                fault_every,
                cluster,
                args,
            };
            if cluster {
                cluster::with_cluster(keep_broker, |bootstrap| soak::run(bootstrap, &a))
            } else {
                with_broker(keep_broker, |bootstrap| soak::run(bootstrap, &a))
            }
        }
        Cmd::Experiment {
            seeds,
            history_records,
            products,
            live_secs,
            keep_broker,
            mut args,
        } => {
            if !args.iter().any(|a| a == "--out" || a.starts_with("--out=")) {
                let out =
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/experiment");
                args.extend(["--out".to_string(), out.display().to_string()]);
            }
            release_bin(
                (
                    "parsley-ordering",
                    "experiment",
                    "the event-time ordering experiment",
                ),
                [
                    ("--seeds", seeds),
                    ("--history-records", history_records.map(|r| r.to_string())),
                    ("--products", products.map(|p| p.to_string())),
                    ("--live-secs", live_secs.map(|s| s.to_string())),
                ],
                args,
                keep_broker,
            )
        }
        Cmd::Bench { kind } => bench::run(kind),
        Cmd::Compare(args) => compare::run(args),
        Cmd::Conformance(args) => conformance::run(&args),
        Cmd::Replay(args) => replay::run(args),
        Cmd::Inspect(args) => inspect::run(args).map(|()| ExitCode::SUCCESS),
        Cmd::Fuzz(args) => fuzz::run(args).map(|()| ExitCode::SUCCESS),
        Cmd::Book => {
            book::check()?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Layering => {
            layering::check()?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Python { keep_broker } => with_broker(keep_broker, python::test),
        Cmd::Java { keep_broker } => with_broker(keep_broker, jvm::test),
        Cmd::Registry => registry::test(),
        Cmd::Test {
            keep_broker,
            cluster: true,
        } => cluster::test(keep_broker),
        Cmd::Failover {
            runs,
            kind,
            debug,
            keep_broker,
        } => cluster::failover(runs, &kind, debug.as_deref(), keep_broker),
        Cmd::Test {
            keep_broker,
            cluster: false,
        } => with_broker(keep_broker, |bootstrap| {
            let steps: [(&str, &[&str]); 5] = [
                ("cargo fmt --check", &["fmt", "--all", "--", "--check"]),
                (
                    "cargo clippy",
                    &[
                        "clippy",
                        "--workspace",
                        "--all-targets",
                        "--",
                        "-D",
                        "warnings",
                    ],
                ),
                // The fuzz crate is outside the workspace: checked here so that a change to a
                // type it builds fails in minutes, not at the fuzzing step at the end.
                (
                    "cargo check of the fuzz targets",
                    &["check", "--manifest-path", "fuzz/Cargo.toml", "--bins"],
                ),
                (
                    "cargo test (unit, integration, benches as tests)",
                    &["test", "--workspace", "--all-targets"],
                ),
                (
                    "cargo test --doc (doctests and the book's examples)",
                    &["test", "--workspace", "--doc"],
                ),
            ];
            println!("xtask: the crates' layering (cargo xtask layering)");
            layering::check()?;
            let mut counted = TestCounts::default();
            for (what, args) in steps {
                println!("xtask: {what}");
                let mut cmd = cargo();
                cmd.args(args).env(broker::BOOTSTRAP_ENV, bootstrap);
                let code = if args[0] == "test" {
                    counted_tests(&mut cmd, what, &mut counted)?
                } else {
                    status_code(&mut cmd, what)?
                };
                if code != ExitCode::SUCCESS {
                    println!("xtask: so far {counted}");
                    bail!("{what} failed");
                }
            }
            println!("xtask: cargo test, all binaries: {counted}");
            println!("xtask: the book: mdbook build (warnings denied) and its links checked");
            book::check()?;
            println!(
                "xtask: the DSL against Kafka Streams (cargo xtask conformance --quick: the corpus and {} generated scenarios)",
                conformance::QUICK
            );
            if conformance::run(&conformance::ConformanceArgs::quick())? != ExitCode::SUCCESS {
                bail!("the comparison with Kafka Streams found an undocumented difference");
            }
            println!(
                "xtask: the Python stamper (cargo xtask python: the stamp's test vectors, the producer on the broker)"
            );
            if python::test(bootstrap)? != ExitCode::SUCCESS {
                bail!("the Python stamper's tests failed");
            }
            println!(
                "xtask: the schema-registry codecs (cargo xtask registry: the local registry as a process, Confluent's Python serializers)"
            );
            if registry::test()? != ExitCode::SUCCESS {
                bail!("the schema-registry codecs' tests failed");
            }
            println!(
                "xtask: the JVM stamper (cargo xtask java: the stamp's test vectors, the interceptors on the broker)"
            );
            if jvm::test(bootstrap)? != ExitCode::SUCCESS {
                bail!("the JVM stamper's tests failed");
            }
            // The README's first command, small: it must keep working.
            println!("xtask: a small run of the demo");
            if demo(
                bootstrap,
                &["--products", "200", "--rounds", "5"].map(String::from),
            )? != ExitCode::SUCCESS
            {
                bail!("the demo failed");
            }
            // The same over the broker's SASL_SSL listener (SCRAM-SHA-512 over TLS): every
            // client of the stages and the generator gets the security settings. An external
            // cluster has no listener of ours.
            if broker::uses_external_cluster() {
                println!("xtask: no secure listener on an external cluster: its demo is skipped");
            } else {
                println!("xtask: a small run of the demo over the SASL_SSL listener");
                if demo(
                    bootstrap,
                    &["--products", "200", "--rounds", "5", "--secure"].map(String::from),
                )? != ExitCode::SUCCESS
                {
                    bail!("the demo over the SASL_SSL listener failed");
                }
            }
            println!(
                "xtask: the end-to-end benchmark's smoke run (cargo xtask bench e2e --quick, dev profile)"
            );
            if bench_smoke(bootstrap)? != ExitCode::SUCCESS {
                bail!("the end-to-end benchmark's smoke run failed");
            }
            println!(
                "xtask: fault injection, one seeded run (cargo xtask chaos --runs 1 --seed 1)"
            );
            if chaos(bootstrap, 1, 1, (false, 1), false)? != ExitCode::SUCCESS {
                bail!("the fault-injection run failed");
            }
            println!(
                "xtask: fault injection with an event-time ledger, one seeded run (cargo xtask chaos --runs 1 --seed 2 --event-time)"
            );
            if chaos(bootstrap, 1, 2, (true, 1), false)? != ExitCode::SUCCESS {
                bail!("the event-time fault-injection run failed");
            }
            println!(
                "xtask: a two-minute soak (cargo xtask soak --minutes 2 --fault-every 30 -- --window-minutes 1 --measure-secs 15 --measure-rounds 100)"
            );
            if soak::short(bootstrap)? != ExitCode::SUCCESS {
                bail!("the two-minute soak failed");
            }
            println!(
                "xtask: a short run of every fuzz target (cargo xtask fuzz --seconds {})",
                fuzz::SHORT_SECONDS
            );
            fuzz::run_short()?;
            println!("xtask: all checks passed");
            Ok(ExitCode::SUCCESS)
        }),
    }
}

/// Runs random simulator histories in chunks with a progress line; fails on the first failure.
fn soak_gate(histories: u64, first: u64, negative_controls: bool) -> Result<ExitCode> {
    use parsley_testkit::sim::{SimConfig, Variant, tally};
    let started = std::time::Instant::now();
    let chunk = 1_000u64;
    let mut done = 0u64;
    let mut total = parsley_testkit::sim::Tally::default();
    while done < histories {
        let n = chunk.min(histories - done);
        let t = tally(first + done, n, &SimConfig::default());
        done += n;
        let failure = t.first_failure.clone();
        total.absorb(t);
        eprint!(
            "\rsoak-gate: {done}/{histories} histories, {} deliveries, {} violations, {} stalls",
            total.deliveries, total.violations, total.stalls
        );
        if let Some((seed, why)) = failure {
            eprintln!();
            bail!("seed {seed} failed:\n{why}");
        }
    }
    eprintln!();
    println!(
        "soak-gate: {} histories from seed {first}: {} deliveries ({:.2} % ahead of partition order), {} stage aborts restored, {} records spilled and {} re-fetched, 0 violations, 0 stalls, in {:.1} s",
        total.histories,
        total.deliveries,
        100.0 * total.lookahead as f64 / total.deliveries.max(1) as f64,
        total.task_aborts,
        total.spilled,
        total.refetched,
        started.elapsed().as_secs_f64()
    );
    if negative_controls {
        let n = (histories / 10).clamp(100, 5_000);
        for variant in Variant::NEGATIVE {
            let t = tally(
                first,
                n,
                &SimConfig {
                    variant,
                    ..SimConfig::default()
                },
            );
            println!(
                "negative control {variant:?}: {} of {n} histories failed ({:.1} %; {} violations, {} stalls)",
                t.violations + t.stalls,
                100.0 * (t.violations + t.stalls) as f64 / n as f64,
                t.violations,
                t.stalls
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds (release) and runs binary `bin` of `package` (described as `what`) on a broker,
/// with the `flags` that have a value, then `args`; `--help` among them prints the binary's
/// help without a broker.
pub(crate) fn release_bin<const N: usize>(
    (package, bin, what): (&str, &str, &str),
    flags: [(&str, Option<String>); N],
    args: Vec<String>,
    keep_broker: bool,
) -> Result<ExitCode> {
    let mut forwarded: Vec<String> = Vec::new();
    for (flag, value) in flags {
        if let Some(v) = value {
            forwarded.extend([flag.to_string(), v]);
        }
    }
    forwarded.extend(args);
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        package,
        "--bin",
        bin,
        "--",
    ]);
    if forwarded.iter().any(|a| a == "--help" || a == "-h") {
        return status_code(cmd.args(&forwarded), what);
    }
    with_broker(keep_broker, |bootstrap| {
        println!("xtask: building (release) and running {what}");
        // The local broker's process id, for benchmarks that measure its CPU time.
        if std::env::var(broker::BOOTSTRAP_ENV).map_or(true, |b| b.trim().is_empty())
            && let Status::Running { pid, .. } = broker::status()
        {
            cmd.env("PARSLEY_BROKER_PID", pid.to_string());
        }
        // The bootstrap last: after a subcommand that `forwarded` starts with, it is that
        // subcommand's.
        cmd.args(&forwarded).args(["--bootstrap", bootstrap]);
        status_code(&mut cmd, what)
    })
}

/// Runs `f` with a broker: `$PARSLEY_BOOTSTRAP` if set, else the local one (started if
/// needed and stopped afterwards unless `keep` or it was already running).
fn with_broker(keep: bool, f: impl FnOnce(&str) -> Result<ExitCode>) -> Result<ExitCode> {
    if let Ok(b) = std::env::var(broker::BOOTSTRAP_ENV)
        && !b.trim().is_empty()
    {
        println!(
            "xtask: using the cluster at {b} ({})",
            broker::BOOTSTRAP_ENV
        );
        return f(b.trim());
    }
    ensure_prerequisites()?;
    println!(
        "xtask: making sure a local Kafka broker runs (the first time, Maven fetches its jars)"
    );
    let up = broker::up().context("starting the local Kafka broker")?;
    let started = matches!(up, Up::Started(_));
    println!(
        "xtask: kafka {} at {}",
        if started {
            "started"
        } else {
            "already running"
        },
        up.bootstrap()
    );
    let result = f(up.bootstrap());
    if started && !keep {
        broker::down().context("stopping the local Kafka broker")?;
        println!("xtask: kafka stopped");
    }
    result
}

/// The end-to-end benchmark's smoke run (`--quick`: every mode on 100,000 records, the counts
/// checked) on `bootstrap`, in the dev profile the test command's other steps built (its figures
/// are not measurements, so no release build is made for them); builds the Kafka Streams
/// program first (Maven, kept while its sources are unchanged).
fn bench_smoke(bootstrap: &str) -> Result<ExitCode> {
    let jar = compare::java::build()?;
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--quiet",
        "--package",
        "parsley-benches",
        "--bin",
        "e2e",
        "--",
    ])
    .args(["--quick", "--bootstrap", bootstrap, "--ks-jar"])
    .arg(&jar);
    if !broker::uses_external_cluster()
        && let Status::Running { pid, .. } = broker::status()
    {
        cmd.env("PARSLEY_BROKER_PID", pid.to_string());
    }
    status_code(&mut cmd, "the end-to-end benchmark's smoke run")
}

/// Runs the inventory demo with `args` on `bootstrap`.
fn demo(bootstrap: &str, args: &[String]) -> Result<ExitCode> {
    let mut cmd = cargo();
    cmd.args(["run", "--package", "parsley-inventory"])
        .args(["--bin", "parsley-inventory", "--"])
        .args(args)
        .env(broker::BOOTSTRAP_ENV, bootstrap);
    status_code(&mut cmd, "the inventory demo")
}

/// Runs the fault-injection driver of the inventory example.
fn chaos(
    bootstrap: &str,
    runs: u64,
    seed: u64,
    (event_time, threads): (bool, usize),
    on_cluster: bool,
) -> Result<ExitCode> {
    let mut cmd = chaos_driver("run");
    cmd.args([
        "--runs",
        &runs.to_string(),
        "--seed",
        &seed.to_string(),
        "--bootstrap",
        bootstrap,
        "--threads",
        &threads.to_string(),
    ]);
    if event_time {
        cmd.arg("--event-time");
    }
    if on_cluster {
        // The driver's readers find the cluster through the variable too.
        cmd.arg("--cluster").env(broker::BOOTSTRAP_ENV, bootstrap);
    }
    status_code(&mut cmd, "the fault-injection driver")
}

/// `cargo run` of the inventory example's fault-injection driver (`chaos`) in `mode`, its
/// arguments to follow.
fn chaos_driver(mode: &str) -> Command {
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "--package", "parsley-inventory"])
        .args(["--bin", "chaos", "--", mode]);
    cmd
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
}

/// Runs `cmd` and passes its exit status on (a failure says so on stderr).
/// Test counts summed over the `test result:` lines of `cargo test`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct TestCounts {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl std::fmt::Display for TestCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} ignored",
            self.passed, self.failed, self.ignored
        )
    }
}

impl TestCounts {
    /// Adds the counts of one libtest summary line (`test result: ok. 3 passed; 0 failed;
    /// 1 ignored; ...`); other lines are left alone.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(['.', ';']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match kind {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Runs `cmd` (a `cargo test`) as [`status_code`] does, echoing its standard output line by
/// line and adding its `test result:` lines to `counts`.
fn counted_tests(cmd: &mut Command, what: &str, counts: &mut TestCounts) -> Result<ExitCode> {
    use std::io::BufRead;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {what}"))?;
    let stdout = child.stdout.take().context("the test command's output")?;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.with_context(|| format!("reading {what}'s output"))?;
        println!("{line}");
        counts.add_line(&line);
    }
    let status = child.wait().with_context(|| format!("running {what}"))?;
    Ok(exit_code(status, what))
}

fn status_code(cmd: &mut Command, what: &str) -> Result<ExitCode> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    Ok(exit_code(status, what))
}

/// Builds the `shop` example's binary (the pipeline the stampers' end-to-end tests feed) and
/// returns its path.
///
/// # Errors
/// The build failing.
fn built_shop() -> Result<std::path::PathBuf> {
    let ok = cargo()
        .args(["build", "-p", "shop", "--bin", "shop"])
        .status()
        .context("building the shop example")?
        .success();
    if !ok {
        bail!("cargo build -p shop failed");
    }
    Ok(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/shop"))
}

/// `status` as this process's exit code (reported when it is a failure).
fn exit_code(status: std::process::ExitStatus, what: &str) -> ExitCode {
    if status.success() {
        return ExitCode::SUCCESS;
    }
    eprintln!("xtask: {what} exited with {status}");
    match status.code() {
        Some(code) if (1..=255).contains(&code) => ExitCode::from(code as u8),
        _ => ExitCode::FAILURE,
    }
}

/// Installs Java and Maven from Debian's packages when they are missing and we may (see
/// `parsley_broker::cli::ensure_prerequisites`).
pub(crate) fn ensure_prerequisites() -> Result<()> {
    Ok(parsley_broker::cli::ensure_prerequisites()?)
}

#[cfg(test)]
mod tests {
    use super::TestCounts;
    use crate::bench::runs_kafka_streams;

    #[test]
    fn the_benchmark_needs_kafka_streams_unless_its_modes_leave_it_out() {
        let of = |args: &[&str]| {
            runs_kafka_streams(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
        };
        assert!(of(&[]));
        assert!(of(&["--repeats", "3"]));
        assert!(of(&["--modes", "raw,ks-count"]));
        assert!(of(&["--modes=ks"]));
        assert!(!of(&["--modes", "raw,parsley,parsley-count"]));
        assert!(!of(&["--modes=raw-stamped"]));
    }

    #[test]
    fn test_counts_add_up_libtest_summaries_and_skip_other_lines() {
        let mut c = TestCounts::default();
        c.add_line("test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.01s");
        c.add_line(
            "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 5 filtered out",
        );
        c.add_line("test a_test_named_test_result ... ok");
        c.add_line("running 3 tests");
        assert_eq!(
            c,
            TestCounts {
                passed: 15,
                failed: 2,
                ignored: 1
            }
        );
        assert_eq!(c.to_string(), "15 passed, 2 failed, 1 ignored");
    }
}
