//! `cargo xtask bench e2e`: the end-to-end benchmark on a real broker.
//!
//! Side by side in one run, for each payload size, over the same topics and the same commit
//! interval:
//! - **raw**: a plain rdkafka transactional consume→produce loop, no stamps ([`raw`]);
//! - **parsley**: a topology of one pass-through stage run by the runtime ([`parsley`]);
//! - **raw-stamped**, a reference: the raw loop with a stamp header on every output,
//!   of the mean length the Parsley run's outputs carry (measured from its output topic, or
//!   `--stamp-bytes`): the cost of the wire format alone, apart from Parsley's own work.
//!
//! *Throughput phase*: a fresh 4-partition input topic is preloaded with `--records` records;
//! each mode then copies all of them to a fresh output topic, in its own process, with a fresh
//! consumer group, in the order raw, parsley, raw-stamped, then reversed (the machine is
//! noisy, so each mode runs twice and the order alternates). Throughput is records divided by the
//! time from the first record fetched to the end of the commit that covers the last one; the table
//! compares each mode's best run (other work on the machine only ever slows a run down).
//!
//! *Latency phase* (raw and parsley; `--skip-live` skips it): per mode, fresh topics; once one
//! warm-up record per partition has come back (the loop has joined its group and committed), a
//! producer writes records at `--rate` per second with their send time in the value, and a
//! `read_committed` reader of the output takes each record's latency: receive time minus send time,
//! what a downstream user sees.
//!
//! *Broker CPU*: with `--broker-pid` (or `$PARSLEY_BROKER_PID`, which `cargo xtask bench e2e`
//! sets for the local broker), the broker process's CPU time over each throughput run, per
//! record: on a machine the broker shares, throughput follows client plus broker CPU. The part
//! its JVM's JIT compiler threads spent is shown apart (in brackets): a broker compiles for
//! minutes after it starts, and again whenever a workload runs code it has not run before.
//!
//! *Requests*: with `--statistics DIR`, each throughput run's clients report librdkafka's
//! statistics into `DIR/<case>.jsonl`, and a line per run gives the requests per 1,000
//! output records by type (Produce, AddPartitionsToTxn, EndTxn, Fetch, …) and the records per
//! produce batch: what each loop asks of the broker.
//!
//! *Memory*: each case runs in its own child process (`e2e worker …`), which reports its peak
//! resident set (`VmHWM`) and CPU time; the table shows the largest peak of each mode.
//!
//! The table ends with the verdict against the targets of issue 4: Parsley's throughput at
//! least 0.9× the raw loop's, and the p99 latency of live records at most 1.5× the commit
//! interval. When the raw-stamped reference ran, a second line per payload gives its ratio to
//! the raw loop (the most a loop that stamps every output can reach on that machine) and
//! Parsley's ratio to it.

mod load;
mod parsley;
mod raw;
mod statistics;
mod worker;

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use parsley_runtime::{Admin, TopicSpec, changelog_topic};

use crate::worker::{Mode, Report, WorkerArgs};

#[derive(Parser, Debug)]
#[command(
    name = "e2e",
    about = "End-to-end benchmark: a raw transactional loop against a Parsley pass-through stage",
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
        )?;
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
struct BenchArgs {
    /// Kafka bootstrap servers (default: $PARSLEY_BOOTSTRAP).
    #[arg(long)]
    bootstrap: Option<String>,
    /// Records preloaded for the throughput phase (each run copies all of them).
    /// Default: 1,000,000, or 500 MiB of payload when that is fewer (512,000 at 1 KiB), so
    /// each run takes about ten seconds on a two-core machine.
    #[arg(long)]
    records: Option<u64>,
    /// Payload sizes in bytes (the record value; at least 8), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    payloads: Vec<usize>,
    /// Commit interval of both modes, ms.
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
    /// Throughput runs per mode (the order alternates: raw, parsley, parsley, raw, …).
    #[arg(long, default_value_t = 2)]
    repeats: u32,
    /// Modes to run, comma-separated (raw-stamped needs `--stamp-bytes` unless parsley runs
    /// before it).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "raw,parsley,raw-stamped"
    )]
    modes: Vec<Mode>,
    /// Length of the stamp header of the raw-stamped mode, bytes (default: the
    /// mean length in the first Parsley run's output).
    #[arg(long)]
    stamp_bytes: Option<usize>,
    /// Process id of the broker (default: $PARSLEY_BROKER_PID): its CPU time per record is
    /// measured over each throughput run.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Skip the latency phase (throughput runs only).
    #[arg(long)]
    skip_live: bool,
    /// Write each latency run's latencies (µs, one per line, in arrival order) to
    /// `DIR/<case>.txt`.
    #[arg(long, value_name = "DIR")]
    latency_dump: Option<std::path::PathBuf>,
    /// Write librdkafka's statistics of each throughput run's consumer and producer to
    /// `DIR/<case>.jsonl` (one JSON document per line, every 500 ms) and print their per-record
    /// summary (requests by type, produce batches, fetches, transactions).
    #[arg(long, value_name = "DIR")]
    statistics: Option<std::path::PathBuf>,
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

/// The figures of one mode at one payload size.
#[derive(Debug, Clone, Default)]
struct Row {
    /// Throughput of each run, records per second.
    throughput: Vec<f64>,
    /// Transactions per throughput run.
    transactions: Vec<u64>,
    /// CPU time per record over the throughput runs, µs.
    cpu_us_per_record: Vec<f64>,
    /// The broker's CPU time per record over the throughput runs, µs.
    broker_us_per_record: Vec<f64>,
    /// The part of it spent by the JVM's JIT compiler threads, µs.
    broker_jit_us_per_record: Vec<f64>,
    /// Latencies of the live records, µs, sorted.
    latencies: Vec<u64>,
    /// Largest peak RSS of this mode's processes, KiB.
    peak_rss_kib: u64,
}

impl BenchArgs {
    /// Records preloaded at `payload` bytes.
    fn records(&self, payload: usize) -> u64 {
        self.records
            .unwrap_or_else(|| 1_000_000.min((500 << 20) / payload.max(1) as u64))
    }
}

impl Row {
    /// The best run: noise from other work on the machine only ever slows a run down, so the
    /// fastest run is the least disturbed one.
    fn best_throughput(&self) -> f64 {
        self.throughput.iter().copied().fold(0.0, f64::max)
    }

    /// The `q` quantile of the latencies (nearest rank), ms.
    fn latency_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let rank =
            ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[rank - 1] as f64 / 1000.0
    }

    fn absorb(&mut self, report: &Report) {
        self.peak_rss_kib = self.peak_rss_kib.max(report.peak_rss_kib);
    }
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
    if let Some(p) = args.payloads.iter().find(|&&p| p < 8) {
        bail!("payload {p} B is too small: the latency phase writes an 8-byte send time");
    }
    let run_id = format!(
        "e2e-{:08x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u32)
    );
    let latency_records = u64::from(args.rate) * args.latency_secs;
    println!(
        "Parsley end-to-end benchmark — run {run_id} on {bootstrap}: {} runs per mode, payloads {:?} B, {} partitions, commit interval {} ms, latency phase {latency_records} records at {}/s",
        args.repeats, args.payloads, args.partitions, args.commit_interval_ms, args.rate
    );
    let broker_pid = args.broker_pid.or_else(|| {
        std::env::var("PARSLEY_BROKER_PID")
            .ok()
            .and_then(|p| p.trim().parse().ok())
    });
    if let Some(pid) = broker_pid
        && process_cpu_ms(pid).is_none()
    {
        bail!("cannot read the CPU time of broker process {pid}");
    }
    let admin = Admin::new(&bootstrap, Duration::from_secs(60))?;
    let mut results = Vec::new();
    for &payload in &args.payloads {
        let records = args.records(payload);
        let mut rows = [Row::default(), Row::default(), Row::default()];
        let mut stamp_bytes = args.stamp_bytes;
        let prefix = format!("{run_id}-{payload}");
        let input = format!("{prefix}-in");
        create(&admin, &[&input], args.partitions)?;
        println!("{payload} B: preloading {records} records into {input}");
        load::preload(&bootstrap, &input, args.partitions, records, payload)?;

        // raw, parsley, raw-stamped, then reversed: the first raw-stamped run comes after a
        // Parsley run whose stamp length it copies.
        let once: Vec<Mode> = [Mode::Raw, Mode::Parsley, Mode::RawStamped]
            .into_iter()
            .filter(|m| args.modes.contains(m))
            .collect();
        let order: Vec<Mode> = (0..args.repeats)
            .flat_map(|i| {
                let mut round = once.clone();
                if i % 2 == 1 {
                    round.reverse();
                }
                round
            })
            .collect();
        for (i, mode) in order.into_iter().enumerate() {
            let case = format!("{prefix}-{mode}-{i}");
            let output = format!("{case}-out");
            create(&admin, &[&output], args.partitions)?;
            let stamp = match (mode, stamp_bytes) {
                (Mode::RawStamped, None) => {
                    bail!("raw-stamped needs --stamp-bytes when no Parsley run precedes it")
                }
                (_, s) => s.unwrap_or(0),
            };
            let broker_before = broker_pid.and_then(broker_cpu_ms);
            let child = spawn(&WorkerArgs {
                unchecked_keys: false,
                mode,
                bootstrap: bootstrap.clone(),
                input: input.clone(),
                output: output.clone(),
                group: case.clone(),
                records,
                commit_interval_ms: args.commit_interval_ms,
                stamp_bytes: stamp,
                statistics: args
                    .statistics
                    .as_ref()
                    .map(|dir| dir.join(format!("{case}.jsonl"))),
            })?;
            let report = finish(child, &case)?;
            let broker_ms = broker_pid
                .and_then(broker_cpu_ms)
                .zip(broker_before)
                .map(|(after, before)| after.since(before));
            let m = report.measured;
            let throughput = m.records as f64 / m.elapsed.as_secs_f64();
            let per_record = |ms: u64| ms as f64 * 1000.0 / m.records as f64;
            let broker_us = broker_ms.map(|b| per_record(b.total_ms));
            let broker_jit_us = broker_ms.map(|b| per_record(b.jit_ms));
            println!(
                "{payload} B: {mode:<7} run {}: {} records in {:.2} s = {throughput:.0} records/s, {} transactions, {:.1} µs CPU per record{}, peak RSS {:.0} MiB",
                i + 1,
                m.records,
                m.elapsed.as_secs_f64(),
                m.transactions,
                report.cpu_ms as f64 * 1000.0 / m.records as f64,
                broker_us
                    .zip(broker_jit_us)
                    .map_or_else(String::new, |(b, j)| format!(
                        " (broker {b:.1}, of it {j:.1} in its JIT compiler)"
                    )),
                report.peak_rss_kib as f64 / 1024.0
            );
            if let Some(dir) = &args.statistics {
                let path = dir.join(format!("{case}.jsonl"));
                println!(
                    "{payload} B: {mode:<7} run {}: librdkafka statistics {}",
                    i + 1,
                    statistics::summary(&path, &output)?
                );
            }
            let row = &mut rows[mode as usize];
            row.throughput.push(throughput);
            row.transactions.push(m.transactions);
            row.cpu_us_per_record
                .push(report.cpu_ms as f64 * 1000.0 / m.records as f64);
            row.broker_us_per_record.extend(broker_us);
            row.broker_jit_us_per_record.extend(broker_jit_us);
            row.absorb(&report);
            if mode == Mode::RawStamped {
                println!("{payload} B: raw-stamped: each output carried a {stamp} B stamp header");
            }
            if mode == Mode::Parsley {
                let s = load::stamp_lengths(&bootstrap, &output, args.partitions, 4_000)?;
                println!(
                    "{payload} B: stamp header of the output: mean {:.1} B (min {}, max {}) over {} records from the middle of the output",
                    s.mean, s.min, s.max, s.records
                );
                stamp_bytes.get_or_insert(s.mean.round() as usize);
            }
            delete(&admin, mode, &case, &[&output])?;
        }

        let live: &[Mode] = if args.skip_live {
            &[]
        } else {
            &[Mode::Raw, Mode::Parsley]
        };
        for &mode in live.iter().filter(|m| args.modes.contains(m)) {
            let case = format!("{prefix}-{mode}-live");
            let (live_in, live_out) = (format!("{case}-in"), format!("{case}-out"));
            create(&admin, &[&live_in, &live_out], args.partitions)?;
            let reader = load::output_reader(&bootstrap, &live_out, args.partitions)?;
            let child = spawn(&WorkerArgs {
                unchecked_keys: false,
                mode,
                bootstrap: bootstrap.clone(),
                input: live_in.clone(),
                output: live_out.clone(),
                group: case.clone(),
                records: latency_records + args.partitions as u64,
                commit_interval_ms: args.commit_interval_ms,
                stamp_bytes: 0,
                statistics: None,
            })?;
            let producer = load::producer(&bootstrap, 0)?;
            let measured = load::warm_up(&producer, &live_in, &reader, args.partitions, payload)
                .and_then(|()| {
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
            let row = &mut rows[mode as usize];
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
            delete(&admin, mode, &case, &[&live_in, &live_out])?;
        }
        admin
            .delete_topics(&[&input])
            .with_context(|| format!("deleting {input}"))?;
        results.push((payload, records, rows));
    }
    Ok(print_table(args, &results))
}

/// Prints the table and the verdict; `true` when every target is met.
fn print_table(args: &BenchArgs, results: &[(usize, u64, [Row; 3])]) -> bool {
    let interval_ms = args.commit_interval_ms as f64;
    let p99_target = 1.5 * interval_ms;
    println!();
    println!(
        "| payload | mode | records | best records/s (all runs) | ratio of best | CPU µs/record | broker CPU µs/record (JIT) | p50 ms | p99 ms | max ms | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut verdicts = Vec::new();
    let mut all_met = true;
    for (payload, records, rows) in results {
        let raw_mean = rows[Mode::Raw as usize].best_throughput();
        for mode in Mode::ALL {
            let row = &rows[mode as usize];
            if row.throughput.is_empty() && row.latencies.is_empty() {
                continue;
            }
            let runs: Vec<String> = row.throughput.iter().map(|t| thousands(*t)).collect();
            let cpu = row.cpu_us_per_record.iter().sum::<f64>()
                / row.cpu_us_per_record.len().max(1) as f64;
            // A figure not measured (no raw run, no live phase) shows as a dash.
            let ms = |q: f64| match row.latency_ms(q) {
                l if l.is_nan() => "–".to_string(),
                l => format!("{l:.1}"),
            };
            let ratio = match row.best_throughput() / raw_mean {
                r if r.is_finite() => format!("{r:.2}×"),
                _ => "–".to_string(),
            };
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let broker = match row.broker_us_per_record.as_slice() {
                [] => "–".to_string(),
                b => format!(
                    "{:.1} ({:.1})",
                    mean(b),
                    mean(&row.broker_jit_us_per_record)
                ),
            };
            println!(
                "| {} | {mode} | {} | {} ({}) | {ratio} | {cpu:.1} | {broker} | {} | {} | {} | {:.0} |",
                size(*payload),
                thousands(*records as f64),
                thousands(row.best_throughput()),
                runs.join(", "),
                ms(0.5),
                ms(0.99),
                ms(1.0),
                row.peak_rss_kib as f64 / 1024.0
            );
        }
        let parsley = &rows[Mode::Parsley as usize];
        if parsley.throughput.is_empty() {
            continue;
        }
        let ratio = parsley.best_throughput() / raw_mean;
        let throughput_met = ratio >= 0.9;
        let p99 = parsley.latency_ms(0.99);
        // Not measured (`--skip-live`) counts as not met.
        let latency_met = p99 <= p99_target;
        all_met &= throughput_met && latency_met;
        verdicts.push(format!(
            "{}: throughput {ratio:.3}× the raw loop (target ≥ 0.9×): {}; live p99 {p99:.1} ms (target ≤ {p99_target:.0} ms): {}",
            size(*payload),
            met(throughput_met),
            met(latency_met)
        ));
        // What the wire format alone allows: every Parsley output carries the stamp header
        // (the book's specification, §3), so on a machine where the loops are CPU-bound Parsley
        // cannot run faster than a raw loop that only adds it.
        let stamped = rows[Mode::RawStamped as usize].best_throughput();
        if stamped.is_finite() && stamped > 0.0 && raw_mean > 0.0 {
            verdicts.push(format!(
                "{}: the stamp header alone (raw-stamped) ran at {:.3}× the raw loop; Parsley at {:.3}× raw-stamped",
                size(*payload),
                stamped / raw_mean,
                parsley.best_throughput() / stamped
            ));
        }
    }
    println!();
    for v in verdicts {
        println!("{v}");
    }
    all_met
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT MET" }
}

fn size(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// `12345.6` as `12,346`.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
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

/// Deletes the topics of case `case`: `names`, and the stage's changelog in a Parsley case.
fn delete(admin: &Admin, mode: Mode, case: &str, names: &[&str]) -> Result<()> {
    let changelog = changelog_topic(&format!("{case}.{}", parsley::STAGE));
    let mut doomed = names.to_vec();
    if mode == Mode::Parsley {
        doomed.push(&changelog);
    }
    admin
        .delete_topics(&doomed)
        .with_context(|| format!("deleting {doomed:?}"))
}

/// User plus system CPU time of process `pid` (all its threads), from `/proc/PID/stat`, ms;
/// `None` when it cannot be read.
fn process_cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    worker::cpu_ms_of_stat(&stat).ok()
}

/// The broker's CPU time, ms: all of it, and the part of its JVM's JIT compiler threads.
#[derive(Debug, Clone, Copy)]
struct BrokerCpu {
    total_ms: u64,
    jit_ms: u64,
}

impl BrokerCpu {
    /// The CPU time spent since `before`.
    fn since(self, before: BrokerCpu) -> BrokerCpu {
        BrokerCpu {
            total_ms: self.total_ms.saturating_sub(before.total_ms),
            jit_ms: self.jit_ms.saturating_sub(before.jit_ms),
        }
    }
}

/// The CPU time of broker process `pid`; its JIT compiler threads are the threads named
/// `C1 CompilerThre…` and `C2 CompilerThre…` in `/proc/PID/task/*/comm` (HotSpot's names,
/// cut to 15 bytes). A freshly started broker compiles for minutes, and more while a workload
/// runs code paths it has not run before: that CPU time is the JVM's, not the workload's.
/// `None` when the process cannot be read.
fn broker_cpu_ms(pid: u32) -> Option<BrokerCpu> {
    let total_ms = process_cpu_ms(pid)?;
    let mut jit_ms = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.starts_with("C1 Compiler") || comm.starts_with("C2 Compiler") {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            jit_ms += worker::cpu_ms_of_stat(&stat).unwrap_or(0);
        }
    }
    Some(BrokerCpu { total_ms, jit_ms })
}

/// Starts a worker process for one case.
fn spawn(args: &WorkerArgs) -> Result<std::process::Child> {
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
        .args(
            args.statistics
                .iter()
                .flat_map(|p| [std::ffi::OsStr::new("--statistics"), p.as_os_str()]),
        )
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
