//! `cargo xtask bench e2e`: the end-to-end benchmark on a real broker.
//!
//! Side by side in one run, for each payload size, over the same topics and the same commit
//! interval:
//! - **raw**: a plain rdkafka transactional consume→produce loop, no stamps ([`raw`]);
//! - **parsley**: a topology of one pass-through stage run by the runtime ([`parsley`]);
//! - **raw-stamped**, a reference: the raw loop with a stamp header on every output,
//!   of the mean length the Parsley run's outputs carry (measured from its output topic, or
//!   `--stamp-bytes`): the cost of the wire format alone, apart from Parsley's own work;
//! - **ks**: Kafka Streams 4.4's pass-through, `stream(input).to(output)`, exactly-once v2, one
//!   stream thread ([`kafka_streams`]);
//! - **parsley-count**: a count per key written with Parsley's DSL,
//!   `group_by_key().count().to_stream().to(output)` ([`parsley`]);
//! - **ks-count**: Kafka Streams' `groupByKey().count()`, same settings as `ks`.
//!
//! Both counts write the key's new count after every record: Parsley's count always does, and
//! Kafka Streams does with its record cache off (`statestore.cache.max.bytes=0`), which the
//! benchmark sets. With the cache on (its default, 10 MiB), Kafka Streams would write each
//! key's latest count once per commit instead, fewer records on repeated keys; the same output
//! on both sides keeps the comparison about the same work.
//!
//! *Inputs*: per payload size, a fresh 4-partition input of `--records` records with unique
//! keys, which the pass-through modes copy; the counting modes count it and one input per
//! further key count of `--keys` (default: 10,000 keys and unique keys). Keys are 8 decimal
//! digits on every input, placed by murmur2 as Kafka's default partitioner places them
//! ([`load`]).
//!
//! *Throughput phase*: each mode consumes all of an input in its own process (a `worker`, or
//! the JVM), with a fresh output topic and a fresh group or application id, in the order of
//! the list above, then reversed (the machine is noisy, so each mode runs `--repeats` times and
//! the order alternates). Throughput is measured from outside the processes, the same way for
//! every mode ([`sample`]): the group's committed offsets on the input are sampled every
//! 100 ms, and a run's figure is the records committed between the first sample past 10 % of
//! the input and the first past 90 %, divided by the time between them. The CPU time of the
//! case's process and of the broker is sampled with them and divided by the same records, so
//! start-up (a JVM's above all) and shutdown are left out for every mode alike. The table
//! compares each mode's best run (other work on the machine only ever slows a run down) and
//! the mean CPU per record of its runs; with more than one round, a line under each verdict gives
//! the ratio round by round (run `i` of one mode against run `i` of the other): its median and
//! its range. The Rust loops' own figure (first record fetched → end
//! of the commit covering the last) is printed beside each of their runs.
//!
//! *Counts checked*: the first run of each counting mode on each input is read back to its
//! end: one update per input record, and every key's last count equal to its records in the
//! input; a difference stops the benchmark.
//!
//! *Latency phase* (raw and parsley; `--skip-live` skips it): per mode, fresh topics; once one
//! warm-up record per partition has come back (the loop has joined its group and committed), a
//! producer writes records at `--rate` per second with their send time in the value, and a
//! `read_committed` reader of the output takes each record's latency: receive time minus send time,
//! what a downstream user sees.
//!
//! *Broker CPU*: with `--broker-pid` (or `$PARSLEY_BROKER_PID`, which `cargo xtask bench e2e`
//! sets for the local broker), the broker process's CPU time per record in each run's window:
//! on a machine the broker shares, throughput follows client plus broker CPU. The part a JVM's
//! JIT compiler threads spent is shown apart (in brackets), for the broker and for Kafka
//! Streams: a JVM compiles for seconds to minutes after it starts, and again whenever a
//! workload runs code it has not run before.
//!
//! *Requests*: with `--statistics DIR`, each throughput run of a Rust mode has its clients
//! report librdkafka's statistics into `DIR/<case>.jsonl`, and a line per run gives the
//! requests per 1,000 output records by type (Produce, AddPartitionsToTxn, EndTxn, Fetch, …) and
//! the records per produce batch: what each loop asks of the broker.
//!
//! *Memory*: each case's process reports its peak resident set (`VmHWM`) and CPU time; the
//! table shows the largest peak of each mode.
//!
//! *Standbys* (`e2e standby`, `cargo xtask bench standby`): a task moved to another instance,
//! with and without a standby of it there: what its restore read and its first commit after the
//! assignment (module [`standby`]).
//!
//! *Queries* (`e2e queries`, `cargo xtask bench queries`): the latency of interactive queries
//! of a running count, idle and busy, over HTTP, and of a read of one's own write (module
//! [`queries`]).
//!
//! The table ends with the verdicts against the targets:
//! - Parsley's pass-through throughput at least 0.9× the raw loop's;
//! - the p99 latency of live records at most 1.5× the commit interval;
//! - against Kafka Streams, per payload size, for the pass-through and for the count on each
//!   key count: Parsley's throughput at least 2× Kafka Streams' and its client CPU per record
//!   at most ½ of Kafka Streams'.
//!
//! When the raw-stamped reference ran, a further line per payload gives its ratio to the raw
//! loop (the most a loop that stamps every output can reach on that machine) and Parsley's
//! ratio to it. The exit status is 2 when a target is not met, except with `--quick`: a smoke
//! run (100,000 records at 100 B unless `--records` and `--payloads`, one run per mode, no
//! latency phase) whose figures are too short to judge.
#![forbid(unsafe_code)]

mod kafka_streams;
mod load;
mod parsley;
mod queries;
mod raw;
mod sample;
mod standby;
mod statistics;
mod table;
mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// The facade brings the allocator a Parsley service runs with (its `jemalloc` feature); every
// mode of the worker runs with it, the raw loops too.
use ::parsley as _;
use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use parsley_runtime::{Admin, TopicSpec};

use crate::kafka_streams::Program;
use crate::load::{CountEncoding, Keys};
use crate::sample::Sampler;
use crate::table::{Results, Row};
use crate::worker::{Mode, Report, WorkerArgs};

#[derive(Parser, Debug)]
#[command(
    name = "e2e",
    about = "End-to-end benchmark: a raw transactional loop, Parsley stages and Kafka Streams on one broker",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    worker: Option<Sub>,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// One measured case (run by the benchmark itself, one process per case).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Creates topics and optionally preloads the first one, for running workers by hand
    /// (interleaved A/B runs of two builds on one input).
    #[command(hide = true)]
    Topics(TopicsArgs),
    /// A task moved to another instance, with and without a standby of it there: its restore
    /// and its first commit after the assignment (`cargo xtask bench standby`).
    Standby(standby::StandbyArgs),
    /// What an interactive query of a running count costs: `get`, `range`, `all`, over HTTP,
    /// while busy, and `get_at_least` after a write (`cargo xtask bench queries`).
    Queries(queries::QueriesArgs),
}

#[derive(Args, Debug, Clone)]
struct TopicsArgs {
    /// Kafka bootstrap servers.
    #[arg(long)]
    bootstrap: String,
    /// Topics to create, comma-separated.
    #[arg(long, value_delimiter = ',')]
    create: Vec<String>,
    /// Partitions of each topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Records to preload into the first topic.
    #[arg(long, default_value_t = 0)]
    preload: u64,
    /// Payload of the preloaded records, bytes (at least 8).
    #[arg(long, default_value_t = 100)]
    payload: usize,
    /// Distinct keys of the preloaded records: a number, or `unique`.
    #[arg(long, default_value = "unique")]
    keys: Keys,
}

/// The `topics` subcommand.
fn topics(args: &TopicsArgs) -> Result<()> {
    let admin = Admin::new(&args.bootstrap, Duration::from_secs(60))?;
    let names: Vec<&str> = args.create.iter().map(String::as_str).collect();
    create(&admin, &names, args.partitions)?;
    if let (Some(first), true) = (names.first(), args.preload > 0) {
        load::preload(
            &args.bootstrap,
            first,
            args.partitions,
            args.preload,
            args.payload.max(8),
            args.keys,
        )?;
    }
    Ok(())
}

/// Records per input of a `--quick` run, unless `--records`.
const QUICK_RECORDS: u64 = 100_000;

#[derive(Args, Debug, Clone)]
struct BenchArgs {
    /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP).
    #[arg(long)]
    bootstrap: Option<String>,
    /// Records preloaded into each input of the throughput phase (each run consumes all of
    /// them). Default: 1,000,000, or 500 MiB of payload when that is fewer (512,000 at 1 KiB),
    /// so each Rust run takes seconds on a two-core machine; 100,000 with `--quick`. Kafka
    /// Streams needs seconds of JIT compilation to reach its steady state: judge it on inputs
    /// of 10,000,000 records at 100 B.
    #[arg(long)]
    records: Option<u64>,
    /// Payload sizes in bytes (the record value; at least 8), comma-separated. Default:
    /// 100,1024; 100 with `--quick`.
    #[arg(long, value_delimiter = ',')]
    payloads: Option<Vec<usize>>,
    /// Distinct keys of the counting modes' inputs, comma-separated: numbers, or `unique`
    /// (the pass-through modes always copy the input with unique keys).
    #[arg(long, value_delimiter = ',', default_value = "10000,unique")]
    keys: Vec<Keys>,
    /// Commit interval of every mode, ms.
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Records per second written in the latency phase.
    #[arg(long, default_value_t = 2_000)]
    rate: u32,
    /// Seconds of paced writing in the latency phase.
    #[arg(long, default_value_t = 20)]
    latency_secs: u64,
    /// Throughput runs per mode and input (the order alternates: the modes in order, then
    /// reversed, …). 1 with `--quick`.
    #[arg(long)]
    repeats: Option<u32>,
    /// Modes to run, comma-separated (raw-stamped needs `--stamp-bytes` unless parsley runs
    /// before it; ks and ks-count need `--ks-jar`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "raw,parsley,raw-stamped,ks,parsley-count,ks-count"
    )]
    modes: Vec<Mode>,
    /// Length of the stamp header of the raw-stamped mode, bytes (default: the
    /// mean length in the first Parsley run's output).
    #[arg(long)]
    stamp_bytes: Option<usize>,
    /// The Kafka Streams program (`parsley-ks-compare.jar`, built by `cargo xtask bench e2e`
    /// and passed here).
    #[arg(long, value_name = "JAR")]
    ks_jar: Option<PathBuf>,
    /// Kafka Streams' state directory (default: `bench-state/` beside the jar).
    #[arg(long, value_name = "DIR")]
    ks_state_dir: Option<PathBuf>,
    /// Process id of the broker (default: $PARSLEY_BROKER_PID): its CPU time per record is
    /// measured over each throughput run.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Keep the Parsley modes' fold state on disk under `DIR/<case>`
    /// (`RuntimeConfig::state_dir`) instead of on the heap.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Stream threads of the Parsley modes' stage (`RuntimeConfig::stream_threads`).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Skip the latency phase (throughput runs only).
    #[arg(long)]
    skip_live: bool,
    /// A smoke run: 100,000 records at 100 B unless `--records` and `--payloads`, one run per
    /// mode, no latency phase; verdicts printed but not in the exit status.
    #[arg(long)]
    quick: bool,
    /// Write each latency run's latencies (µs, one per line, in arrival order) to
    /// `DIR/<case>.txt`.
    #[arg(long, value_name = "DIR")]
    latency_dump: Option<PathBuf>,
    /// Write librdkafka's statistics of each Rust throughput run's consumer and producer to
    /// `DIR/<case>.jsonl` (one JSON document per line, every 500 ms) and print their per-record
    /// summary (requests by type, produce batches, fetches, transactions).
    #[arg(long, value_name = "DIR")]
    statistics: Option<PathBuf>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,librdkafka=error".into()),
        )
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.worker {
        Some(Sub::Worker(args)) => worker::run(&args).map(|()| true),
        Some(Sub::Topics(args)) => topics(&args).map(|()| true),
        Some(Sub::Standby(args)) => standby::run(&args),
        Some(Sub::Queries(args)) => queries::run(&args),
        None => bench(&cli.bench),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("e2e: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

impl BenchArgs {
    /// Records preloaded at `payload` bytes.
    fn records(&self, payload: usize) -> u64 {
        self.records.unwrap_or(if self.quick {
            QUICK_RECORDS
        } else {
            1_000_000.min((500 << 20) / payload.max(1) as u64)
        })
    }

    /// Payload sizes, bytes.
    fn payloads(&self) -> Vec<usize> {
        match &self.payloads {
            Some(p) => p.clone(),
            None if self.quick => vec![100],
            None => vec![100, 1024],
        }
    }

    /// Throughput runs per mode and input.
    fn repeats(&self) -> u32 {
        self.repeats.unwrap_or(if self.quick { 1 } else { 2 })
    }

    /// Whether the latency phase runs.
    fn live(&self) -> bool {
        !(self.skip_live || self.quick)
    }
}

/// The inputs of one payload size and the modes run on each, in their order within a round:
/// the unique-key input for the pass-through modes (and the counting modes when `keys` has
/// `unique`), then one input per other key count for the counting modes.
fn plan(modes: &[Mode], keys: &[Keys]) -> Vec<(Keys, Vec<Mode>)> {
    let selected =
        |of: &[Mode]| -> Vec<Mode> { of.iter().copied().filter(|m| modes.contains(m)).collect() };
    let pass = selected(&[Mode::Raw, Mode::Parsley, Mode::RawStamped, Mode::Ks]);
    let count = selected(&[Mode::ParsleyCount, Mode::KsCount]);
    let mut plan = Vec::new();
    let mut unique = pass;
    if keys.contains(&Keys::Unique) {
        unique.extend(&count);
    }
    if !unique.is_empty() {
        plan.push((Keys::Unique, unique));
    }
    if !count.is_empty() {
        let mut others: Vec<Keys> = keys
            .iter()
            .copied()
            .filter(|&k| k != Keys::Unique)
            .collect();
        others.sort_unstable();
        others.dedup();
        plan.extend(others.into_iter().map(|k| (k, count.clone())));
    }
    plan
}

/// `round` repeated `repeats` times, every other repetition reversed.
fn interleave(round: &[Mode], repeats: u32) -> Vec<Mode> {
    (0..repeats)
        .flat_map(|i| {
            let mut r = round.to_vec();
            if i % 2 == 1 {
                r.reverse();
            }
            r
        })
        .collect()
}

/// A short name of an input's keys, for topic names.
fn keys_tag(keys: Keys) -> String {
    match keys {
        Keys::Unique => "unique".to_string(),
        Keys::Distinct(n) => format!("k{n}"),
    }
}

/// What every run needs.
struct Env<'a> {
    args: &'a BenchArgs,
    bootstrap: String,
    admin: Admin,
    broker_pid: Option<u32>,
    program: Option<Program>,
}

/// One throughput run to do.
struct Case<'a> {
    /// The case's name: its group or application id, the prefix of its topics.
    name: String,
    mode: Mode,
    payload: usize,
    input: &'a str,
    keys: Keys,
    records: u64,
    stamp_bytes: usize,
    /// Read a counting mode's output back and check it.
    check_counts: bool,
}

/// Runs every case and prints the table; `Ok(false)` when a target is not met.
fn bench(args: &BenchArgs) -> Result<bool> {
    let bootstrap = match &args.bootstrap {
        Some(b) => b.clone(),
        None => std::env::var("PARSLEY_BOOTSTRAP")
            .ok()
            .filter(|b| !b.trim().is_empty())
            .context(
                "no broker: pass --bootstrap, set PARSLEY_BOOTSTRAP or run `cargo xtask bench e2e`",
            )?,
    };
    let payloads = args.payloads();
    if let Some(p) = payloads.iter().find(|&&p| p < 8) {
        bail!("payload {p} B is too small: the latency phase writes an 8-byte send time");
    }
    let program = args
        .ks_jar
        .clone()
        .map(|jar| Program::new(jar, args.ks_state_dir.clone()));
    if program.is_none()
        && let Some(m) = args.modes.iter().find(|m| m.is_kafka_streams())
    {
        bail!(
            "mode {m} needs the Kafka Streams program: pass --ks-jar (`cargo xtask bench e2e` does)"
        );
    }
    let run_id = format!(
        "e2e-{:08x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u32)
    );
    let latency_records = u64::from(args.rate) * args.latency_secs;
    println!(
        "Parsley end-to-end benchmark{} — run {run_id} on {bootstrap}: modes {}, {} runs per mode, payloads {:?} B, counting keys {}, {} partitions, commit interval {} ms, {}",
        if args.quick { " (quick smoke run)" } else { "" },
        args.modes
            .iter()
            .map(Mode::to_string)
            .collect::<Vec<_>>()
            .join(","),
        args.repeats(),
        payloads,
        args.keys
            .iter()
            .map(Keys::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.partitions,
        args.commit_interval_ms,
        if args.live() {
            format!("latency phase {latency_records} records at {}/s", args.rate)
        } else {
            "no latency phase".to_string()
        }
    );
    let broker_pid = args.broker_pid.or_else(|| {
        std::env::var("PARSLEY_BROKER_PID")
            .ok()
            .and_then(|p| p.trim().parse().ok())
    });
    if let Some(pid) = broker_pid
        && sample::process_cpu(pid).is_none()
    {
        bail!("cannot read the CPU time of broker process {pid}");
    }
    let env = Env {
        args,
        admin: Admin::new(&bootstrap, Duration::from_secs(60))?,
        bootstrap,
        broker_pid,
        program,
    };
    let mut results = Vec::new();
    for &payload in &payloads {
        let records = args.records(payload);
        let mut rows: BTreeMap<(Mode, Keys), Row> = BTreeMap::new();
        let mut stamp_bytes = args.stamp_bytes;
        let prefix = format!("{run_id}-{payload}");
        for (keys, modes) in plan(&args.modes, &args.keys) {
            let tag = format!("{prefix}-{}", keys_tag(keys));
            let input = format!("{tag}-in");
            create(&env.admin, &[&input], args.partitions)?;
            println!("{payload} B: preloading {records} records with {keys} into {input}");
            load::preload(
                &env.bootstrap,
                &input,
                args.partitions,
                records,
                payload,
                keys,
            )?;
            let mut checked = Vec::new();
            for (i, mode) in interleave(&modes, args.repeats()).into_iter().enumerate() {
                let stamp = match (mode, stamp_bytes) {
                    (Mode::RawStamped, None) => {
                        bail!("raw-stamped needs --stamp-bytes when no Parsley run precedes it")
                    }
                    (_, s) => s.unwrap_or(0),
                };
                let case = Case {
                    name: format!("{tag}-{mode}-{i}"),
                    mode,
                    payload,
                    input: &input,
                    keys,
                    records,
                    stamp_bytes: stamp,
                    check_counts: mode.counts() && !checked.contains(&mode),
                };
                checked.push(mode);
                let row = rows.entry((mode, keys)).or_default();
                if let Some(s) = throughput_run(&env, &case, i + 1, row)? {
                    stamp_bytes.get_or_insert(s);
                }
            }
            env.admin
                .delete_topics(&[&input])
                .with_context(|| format!("deleting {input}"))?;
        }
        let live: &[Mode] = if args.live() {
            &[Mode::Raw, Mode::Parsley]
        } else {
            &[]
        };
        for &mode in live.iter().filter(|m| args.modes.contains(m)) {
            let row = rows.entry((mode, Keys::Unique)).or_default();
            latency_run(&env, &prefix, mode, payload, row)?;
        }
        results.push(Results {
            payload,
            records,
            rows,
        });
    }
    let met = table::print(args.commit_interval_ms, &results);
    if args.quick {
        println!("(a quick smoke run: inputs too short to judge, the verdicts set no exit status)");
        return Ok(true);
    }
    Ok(met)
}

/// The consumer group whose committed offsets show `case`'s progress, and the internal topics
/// the case creates (deleted after it).
fn group_and_internal_topics(case: &WorkerArgs) -> Result<(String, Vec<String>)> {
    let app = &case.group;
    Ok(match case.mode {
        Mode::Raw | Mode::RawStamped => (app.clone(), Vec::new()),
        Mode::Parsley | Mode::ParsleyCount => {
            let topology = parsley::topology_of(case.mode, case)?;
            let stages = topology.stages();
            let reader = stages
                .iter()
                .find(|s| s.sources().contains(&case.input))
                .context("no stage reads the input")?;
            let changelogs = stages.iter().map(|s| s.changelog_topic(app)).collect();
            (reader.group_id(app), changelogs)
        }
        Mode::Ks | Mode::KsCount => (app.clone(), kafka_streams::internal_topics(case.mode, app)),
    })
}

/// One throughput run of `case` (the `number`-th on its input), its figures added to `row`;
/// returns the mean stamp length of a Parsley pass-through run's output.
fn throughput_run(
    env: &Env<'_>,
    case: &Case<'_>,
    number: usize,
    row: &mut Row,
) -> Result<Option<usize>> {
    let args = env.args;
    let (mode, payload, name) = (case.mode, case.payload, case.name.as_str());
    let output = format!("{name}-out");
    create(&env.admin, &[&output], args.partitions)?;
    let statistics = args
        .statistics
        .as_ref()
        .filter(|_| !mode.is_kafka_streams())
        .map(|dir| dir.join(format!("{name}.jsonl")));
    let worker = WorkerArgs {
        unchecked_keys: false,
        mode,
        bootstrap: env.bootstrap.clone(),
        input: case.input.to_string(),
        output: output.clone(),
        group: name.to_string(),
        records: case.records,
        commit_interval_ms: args.commit_interval_ms,
        stamp_bytes: case.stamp_bytes,
        spin_ns: 0,
        statistics: statistics.clone(),
        state_dir: args
            .state_dir
            .as_ref()
            .filter(|_| !mode.is_kafka_streams())
            .map(|dir| dir.join(name)),
        threads: args.threads,
        restart: false,
        state_memory_bytes: None,
    };
    let (group, internal) = group_and_internal_topics(&worker)?;
    let mut sampler = Sampler::new(
        &env.bootstrap,
        &group,
        case.input,
        args.partitions,
        env.broker_pid,
    )?;
    let child = match (&env.program, mode.is_kafka_streams()) {
        (Some(program), true) => program.spawn(&worker)?,
        (None, true) => bail!("{mode} needs --ks-jar"),
        (_, false) => spawn(&worker, false)?,
    };
    let report = sample::supervise(child, &mut sampler, case.records, name)?;
    let window = sample::window(&sampler.samples, case.records);
    let label = format!("{payload} B, {}: {mode:<13} run {number}", case.keys);
    println!(
        "{label}: {}",
        run_line(case.records, window.as_ref(), &report)
    );
    if let Some(path) = &statistics {
        println!(
            "{label}: librdkafka statistics {}",
            statistics::summary(path, &output)?
        );
    }
    if let Some(w) = &window {
        row.throughput.push(w.throughput());
        if let Some(c) = w.client {
            row.cpu_us_per_record.push(w.per_record_us(c.total_ms));
            row.jit_us_per_record.push(w.per_record_us(c.jit_ms));
        }
        if let Some(b) = w.broker {
            row.broker_us_per_record.push(w.per_record_us(b.total_ms));
            row.broker_jit_us_per_record.push(w.per_record_us(b.jit_ms));
        }
    } else {
        row.unmeasured += 1;
    }
    row.absorb(&report);
    if case.check_counts {
        let encoding = match mode {
            Mode::KsCount => CountEncoding::Long,
            _ => CountEncoding::Json,
        };
        let keys = load::check_counts(
            &env.bootstrap,
            &output,
            args.partitions,
            case.records,
            case.keys,
            encoding,
        )
        .with_context(|| format!("checking the counts of {name}"))?;
        println!(
            "{label}: output checked: {} updates, the last count of each of the {keys} keys equal to its records in the input",
            case.records
        );
    }
    let mut stamp = None;
    match mode {
        Mode::RawStamped => println!(
            "{label}: each output carried a {} B stamp header",
            case.stamp_bytes
        ),
        Mode::Parsley => {
            let s = load::stamp_lengths(&env.bootstrap, &output, args.partitions, 4_000)?;
            println!(
                "{label}: stamp header of the output: mean {:.1} B (min {}, max {}) over {} records from the middle of the output",
                s.mean, s.min, s.max, s.records
            );
            stamp = Some(s.mean.round() as usize);
        }
        _ => {}
    }
    let mut doomed: Vec<&str> = vec![&output];
    doomed.extend(internal.iter().map(String::as_str));
    env.admin
        .delete_topics(&doomed)
        .with_context(|| format!("deleting {doomed:?}"))?;
    Ok(stamp)
}

/// A throughput run's line: the window's figures, then the process's own.
fn run_line(records: u64, window: Option<&sample::Window>, report: &Report) -> String {
    let measured = match window {
        Some(w) => {
            let cpu = |c: Option<sample::Cpu>, what: &str| {
                c.map_or_else(String::new, |c| {
                    format!(
                        ", {what} {:.2} µs CPU/record (JIT {:.2})",
                        w.per_record_us(c.total_ms),
                        w.per_record_us(c.jit_ms)
                    )
                })
            };
            format!(
                "{} records/s between {} % and {} % of the input ({} records in {:.2} s){}{}",
                table::thousands(w.throughput()),
                sample::FROM_PERCENT,
                sample::TO_PERCENT,
                w.records,
                w.elapsed.as_secs_f64(),
                cpu(w.client, "client"),
                cpu(w.broker, "broker")
            )
        }
        None => "too short to measure between 10 % and 90 % of the input".to_string(),
    };
    let own = report.measured.map_or_else(String::new, |m| {
        format!(
            "; its own figure {} records/s in {:.2} s, {} transactions",
            table::thousands(m.records as f64 / m.elapsed.as_secs_f64()),
            m.elapsed.as_secs_f64(),
            m.transactions
        )
    });
    format!(
        "{measured}; whole process {:.2} µs CPU/record, peak RSS {:.0} MiB{own}",
        report.cpu_ms as f64 * 1000.0 / records as f64,
        report.peak_rss_kib as f64 / 1024.0
    )
}

/// The latency phase of `mode` at `payload`: its latencies and peak memory added to `row`.
fn latency_run(
    env: &Env<'_>,
    prefix: &str,
    mode: Mode,
    payload: usize,
    row: &mut Row,
) -> Result<()> {
    let args = env.args;
    let latency_records = u64::from(args.rate) * args.latency_secs;
    let case = format!("{prefix}-{mode}-live");
    let (live_in, live_out) = (format!("{case}-in"), format!("{case}-out"));
    create(&env.admin, &[&live_in, &live_out], args.partitions)?;
    let reader = load::output_reader(&env.bootstrap, &live_out, args.partitions)?;
    let worker = WorkerArgs {
        unchecked_keys: false,
        mode,
        bootstrap: env.bootstrap.clone(),
        input: live_in.clone(),
        output: live_out.clone(),
        group: case.clone(),
        records: latency_records + args.partitions as u64,
        commit_interval_ms: args.commit_interval_ms,
        stamp_bytes: 0,
        spin_ns: 0,
        statistics: None,
        state_dir: None,
        threads: args.threads,
        restart: false,
        state_memory_bytes: None,
    };
    let (_, internal) = group_and_internal_topics(&worker)?;
    let child = spawn(&worker, true)?;
    let producer = load::producer(&env.bootstrap, 0)?;
    let measured =
        load::warm_up(&producer, &live_in, &reader, args.partitions, payload).and_then(|()| {
            load::measure_latency(
                producer,
                &live_in,
                &reader,
                args.partitions,
                payload,
                latency_records,
                args.rate,
            )
        });
    let latencies = match measured {
        Ok(l) => l,
        Err(e) => {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.context(format!("the latency phase of {case}")));
        }
    };
    let report = finish(child, &case)?;
    if let Some(dir) = &args.latency_dump {
        let text: String = latencies.iter().map(|l| format!("{l}\n")).collect();
        let path = dir.join(format!("{case}.txt"));
        std::fs::write(&path, text).with_context(|| format!("writing {path:?}"))?;
    }
    row.latencies = latencies;
    row.latencies.sort_unstable();
    row.absorb(&report);
    println!(
        "{payload} B: {mode:<7} live: {} records at {}/s, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        row.latencies.len(),
        args.rate,
        row.latency_ms(0.5),
        row.latency_ms(0.99),
        row.latency_ms(1.0)
    );
    drop(reader);
    let mut doomed: Vec<&str> = vec![&live_in, &live_out];
    doomed.extend(internal.iter().map(String::as_str));
    env.admin
        .delete_topics(&doomed)
        .with_context(|| format!("deleting {doomed:?}"))
}

fn create(admin: &Admin, names: &[&str], partitions: i32) -> Result<()> {
    let specs: Vec<TopicSpec> = names
        .iter()
        .map(|n| TopicSpec::new(*n, partitions))
        .collect();
    admin
        .create_topics(&specs)
        .with_context(|| format!("creating {names:?}"))?;
    Ok(())
}

/// Starts a worker process for one case, its standard output piped; `inherit_stdin` for the
/// latency phase's workers, which are waited for with [`finish`] (a throughput run's worker
/// gets none: [`sample::supervise`] takes a piped standard input as the order to stop at the
/// end of the input, which a worker does by itself).
fn spawn(args: &WorkerArgs, inherit_stdin: bool) -> Result<std::process::Child> {
    let exe = std::env::current_exe().context("locating the benchmark binary")?;
    Command::new(exe)
        .arg("worker")
        .args(["--mode", &args.mode.to_string()])
        .args(["--bootstrap", &args.bootstrap])
        .args(["--input", &args.input])
        .args(["--output", &args.output])
        .args(["--group", &args.group])
        .args(["--records", &args.records.to_string()])
        .args(["--commit-interval-ms", &args.commit_interval_ms.to_string()])
        .args(["--stamp-bytes", &args.stamp_bytes.to_string()])
        .args(args.unchecked_keys.then_some("--unchecked-keys"))
        .args(args.restart.then_some("--restart"))
        .args(["--threads", &args.threads.to_string()])
        .args(
            args.state_dir
                .iter()
                .flat_map(|p| [std::ffi::OsStr::new("--state-dir"), p.as_os_str()]),
        )
        .args(args.state_memory_bytes.iter().flat_map(|b| {
            [
                std::ffi::OsString::from("--state-memory-bytes"),
                b.to_string().into(),
            ]
        }))
        .args(
            args.statistics
                .iter()
                .flat_map(|p| [std::ffi::OsStr::new("--statistics"), p.as_os_str()]),
        )
        .stdin(if inherit_stdin {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting a worker")
}

/// Waits for a worker and parses its report.
fn finish(child: std::process::Child, case: &str) -> Result<Report> {
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for the worker of {case}"))?;
    if !out.status.success() {
        bail!("the worker of {case} exited with {}", out.status);
    }
    Report::parse(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("the report of {case}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_copies_the_unique_input_and_counts_every_key_count() {
        let all = [
            Mode::Raw,
            Mode::Parsley,
            Mode::RawStamped,
            Mode::Ks,
            Mode::ParsleyCount,
            Mode::KsCount,
        ];
        let keys = [Keys::Distinct(10_000), Keys::Unique, Keys::Distinct(10_000)];
        assert_eq!(
            plan(&all, &keys),
            vec![
                (Keys::Unique, all.to_vec()),
                (
                    Keys::Distinct(10_000),
                    vec![Mode::ParsleyCount, Mode::KsCount]
                ),
            ]
        );
        // Without `unique` among the keys, the unique input is only copied.
        assert_eq!(
            plan(&[Mode::Raw, Mode::KsCount], &[Keys::Distinct(5)]),
            vec![
                (Keys::Unique, vec![Mode::Raw]),
                (Keys::Distinct(5), vec![Mode::KsCount])
            ]
        );
        // Counting modes alone need no unique input unless asked for.
        assert_eq!(
            plan(&[Mode::ParsleyCount], &[Keys::Distinct(5)]),
            vec![(Keys::Distinct(5), vec![Mode::ParsleyCount])]
        );
    }

    #[test]
    fn rounds_alternate_so_parsley_runs_before_raw_stamped_first() {
        let round = [Mode::Raw, Mode::Parsley, Mode::RawStamped];
        assert_eq!(
            interleave(&round, 3),
            [
                Mode::Raw,
                Mode::Parsley,
                Mode::RawStamped,
                Mode::RawStamped,
                Mode::Parsley,
                Mode::Raw,
                Mode::Raw,
                Mode::Parsley,
                Mode::RawStamped
            ]
        );
        assert!(interleave(&round, 0).is_empty());
    }

    #[test]
    fn every_mode_s_group_is_the_one_that_commits_the_input() {
        let case = |mode| WorkerArgs {
            mode,
            bootstrap: "localhost:9092".into(),
            input: "in".into(),
            output: "out".into(),
            group: "case".into(),
            records: 1,
            commit_interval_ms: 100,
            stamp_bytes: 0,
            spin_ns: 0,
            unchecked_keys: false,
            statistics: None,
            state_dir: None,
            threads: 1,
            restart: false,
            state_memory_bytes: None,
        };
        let of = |mode| group_and_internal_topics(&case(mode)).unwrap();
        assert_eq!(of(Mode::Raw), ("case".to_string(), vec![]));
        assert_eq!(
            of(Mode::Parsley),
            (
                "case.pass".to_string(),
                vec![parsley_runtime::changelog_topic("case.pass")]
            )
        );
        let (group, internal) = of(Mode::ParsleyCount);
        // The DSL names a stage after the topic it reads.
        assert_eq!(group, "case.in");
        assert_eq!(internal, [parsley_runtime::changelog_topic(&group)]);
        assert_eq!(of(Mode::Ks), ("case".to_string(), vec![]));
        assert_eq!(
            of(Mode::KsCount),
            (
                "case".to_string(),
                vec!["case-counts-changelog".to_string()]
            )
        );
    }
}
