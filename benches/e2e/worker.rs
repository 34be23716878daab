//! One measured case in its own process: the raw transactional loop or a Parsley stage,
//! consuming `records` records from the input topic and committing their copies (or, for the
//! counting stage, each key's updated count) to the output topic, then reporting its figures
//! (and its peak memory) on one stdout line. The Kafka Streams modes run in a JVM instead
//! ([`crate::kafka_streams`]), which prints the same line without the loop's own figures.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::{parsley, raw};

/// How long a worker may run before it gives up (a safety net; progress is event-driven).
pub const DEADLINE: Duration = Duration::from_secs(3_600);

/// The prefix of the worker's result line on stdout.
const RESULT_PREFIX: &str = "e2e-result";

/// Which consume→produce loop a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub enum Mode {
    /// rdkafka's consumer and transactional producer, no stamps.
    Raw,
    /// A Parsley topology with one pass-through stage.
    Parsley,
    /// The raw loop, each output also carrying a stamp header of `--stamp-bytes`
    /// filler bytes (a reference: what the wire format alone costs, without Parsley's work).
    RawStamped,
    /// Kafka Streams' pass-through, `stream(input).to(output)` with byte-array serdes (a JVM).
    Ks,
    /// A Parsley DSL count per key: `group_by_key().count()`, each key's new count written
    /// after every record.
    ParsleyCount,
    /// Kafka Streams' `groupByKey().count()` with its record cache off, each key's new count
    /// written after every record (a JVM).
    KsCount,
}

impl Mode {
    /// Every mode, in the table's order.
    pub const ALL: [Mode; 6] = [
        Mode::Raw,
        Mode::RawStamped,
        Mode::Parsley,
        Mode::Ks,
        Mode::ParsleyCount,
        Mode::KsCount,
    ];

    /// Whether a Kafka Streams program in a JVM runs this mode (not a `worker` process).
    pub fn is_kafka_streams(self) -> bool {
        matches!(self, Mode::Ks | Mode::KsCount)
    }

    /// Whether this mode counts per key (its output holds counts, not copies).
    pub fn counts(self) -> bool {
        matches!(self, Mode::ParsleyCount | Mode::KsCount)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Raw => "raw",
            Mode::Parsley => "parsley",
            Mode::RawStamped => "raw-stamped",
            Mode::Ks => "ks",
            Mode::ParsleyCount => "parsley-count",
            Mode::KsCount => "ks-count",
        })
    }
}

/// What a worker is told to do.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The loop to run.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// Kafka bootstrap servers.
    #[arg(long)]
    pub bootstrap: String,
    /// The input topic.
    #[arg(long)]
    pub input: String,
    /// The output topic.
    #[arg(long)]
    pub output: String,
    /// Consumer group (raw) or application id (Parsley, Kafka Streams), fresh for each case.
    #[arg(long)]
    pub group: String,
    /// Records to process: the worker stops after the commit that covers this many.
    #[arg(long)]
    pub records: u64,
    /// Commit interval, ms.
    #[arg(long)]
    pub commit_interval_ms: u64,
    /// Length of the stamp header value of [`Mode::RawStamped`], bytes.
    #[arg(long, default_value_t = 0)]
    pub stamp_bytes: usize,
    /// Raw modes: busy-wait this long after each send, ns — work of a known cost in the loop's
    /// thread, to measure how much work per record a ratio to the raw loops leaves room for.
    #[arg(long, default_value_t = 0, value_name = "NS")]
    pub spin_ns: u64,
    /// Parsley mode: the input opts out of the key-partition check
    /// (`KeyPartitioning::Unchecked`), to measure what the check costs.
    #[arg(long)]
    pub unchecked_keys: bool,
    /// Parsley modes: keep fold state on disk under this directory
    /// (`RuntimeConfig::state_dir`) instead of on the heap.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Parsley modes: stream threads of the stage (`RuntimeConfig::stream_threads`).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Parsley modes: bound the state's memory to this many bytes
    /// (`RuntimeConfig::state_memory_bytes`).
    #[arg(long, value_name = "BYTES")]
    pub state_memory_bytes: Option<u64>,
    /// Parsley modes: once the run has stopped, start the stage again, wait until every task
    /// has restored, and print what its restore read of the changelog (an `e2e-restore` line).
    #[arg(long)]
    pub restart: bool,
    /// Write librdkafka's statistics of the loop's consumer and producer (every
    /// [`crate::statistics::INTERVAL`]) to this file, one JSON document per line.
    #[arg(long, value_name = "FILE")]
    pub statistics: Option<PathBuf>,
}

impl WorkerArgs {
    /// The commit interval.
    pub fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.commit_interval_ms)
    }
}

/// What one loop measured itself (the Rust modes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Records committed.
    pub records: u64,
    /// From the first record fetched to the end of the commit covering the last one.
    pub elapsed: Duration,
    /// Transactions committed.
    pub transactions: u64,
}

/// A worker's report: its measurement plus its process figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// The loop's own measurement; `None` from the Kafka Streams program, which reports only
    /// its process figures.
    pub measured: Option<Measured>,
    /// Peak resident set size of the worker process (`VmHWM`), KiB.
    pub peak_rss_kib: u64,
    /// User plus system CPU time of the worker process (all threads), ms.
    pub cpu_ms: u64,
}

impl Report {
    /// The stdout line the parent parses: `e2e-result [records=N elapsed_us=N
    /// transactions=N] peak_rss_kib=N cpu_ms=N` (the Kafka Streams program prints the last two
    /// only).
    fn line(&self) -> String {
        let measured = self.measured.map_or_else(String::new, |m| {
            format!(
                " records={} elapsed_us={} transactions={}",
                m.records,
                m.elapsed.as_micros(),
                m.transactions
            )
        });
        format!(
            "{RESULT_PREFIX}{measured} peak_rss_kib={} cpu_ms={}",
            self.peak_rss_kib, self.cpu_ms
        )
    }

    /// Finds and parses the result line in a worker's stdout.
    ///
    /// # Errors
    /// When there is no result line or a field is missing or malformed.
    pub fn parse(stdout: &str) -> Result<Report> {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(RESULT_PREFIX))
            .with_context(|| format!("no {RESULT_PREFIX} line in the worker's output"))?;
        let optional = |name: &str| -> Result<Option<u64>> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .map(|v| v.parse().with_context(|| format!("{name} in {line:?}")))
                .transpose()
        };
        let field = |name: &str| -> Result<u64> {
            optional(name)?.with_context(|| format!("no {name} in {line:?}"))
        };
        let measured = match optional("records")? {
            Some(records) => Some(Measured {
                records,
                elapsed: Duration::from_micros(field("elapsed_us")?),
                transactions: field("transactions")?,
            }),
            None => None,
        };
        Ok(Report {
            measured,
            peak_rss_kib: field("peak_rss_kib")?,
            cpu_ms: field("cpu_ms")?,
        })
    }
}

/// Runs the worker's loop and prints its report.
///
/// # Errors
/// Whatever stopped the loop, or when the process figures cannot be read.
pub fn run(args: &WorkerArgs) -> Result<()> {
    let measured = match args.mode {
        Mode::Raw => raw::run(args, None),
        Mode::RawStamped => raw::run(args, Some(args.stamp_bytes)),
        Mode::Parsley | Mode::ParsleyCount => parsley::run(args),
        Mode::Ks | Mode::KsCount => {
            bail!("the {} mode runs in the Kafka Streams program", args.mode)
        }
    }
    .with_context(|| format!("the {} loop", args.mode))?;
    if measured.records < args.records {
        bail!(
            "the {} loop committed {} of {} records",
            args.mode,
            measured.records,
            args.records
        );
    }
    let report = Report {
        measured: Some(measured),
        peak_rss_kib: peak_rss_kib()?,
        cpu_ms: cpu_ms()?,
    };
    println!("{}", report.line());
    if args.restart {
        let r = parsley::restart(args)?;
        println!(
            "e2e-restore read={} changelog_end={} took_ms={} raw_read_ms={} ({:.3} % of the \
             changelog read; {:.2}x a plain consumer's read of all of it)",
            r.read,
            r.end,
            r.took.as_millis(),
            r.raw_read.as_millis(),
            100.0 * r.read as f64 / r.end.max(1) as f64,
            r.took.as_secs_f64() / r.raw_read.as_secs_f64().max(1e-9),
        );
    }
    Ok(())
}

/// `VmHWM` of this process, from `/proc/self/status`, KiB.
fn peak_rss_kib() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .context("no VmHWM in /proc/self/status")?
        .trim()
        .parse()
        .context("parsing VmHWM")
}

/// User plus system CPU time of this process, from `/proc/self/stat`, ms. The kernel reports
/// it in clock ticks of `USER_HZ`, which is 100 on every Linux architecture Rust supports.
fn cpu_ms() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    cpu_ms_of_stat(&stat)
}

/// User plus system CPU time in a process's `/proc/PID/stat` line, ms.
///
/// # Errors
/// When the line is malformed.
pub fn cpu_ms_of_stat(stat: &str) -> Result<u64> {
    // Fields after the command name (which may contain spaces) start at state (field 3);
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').context("malformed /proc/PID/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .context("short /proc/PID/stat")?
            .parse()
            .context("parsing /proc/PID/stat")
    };
    const USER_HZ: u64 = 100;
    Ok((ticks(11)? + ticks(12)?) * 1000 / USER_HZ)
}

/// Fails when `started` is more than [`DEADLINE`] ago.
pub fn check_deadline(started: Instant, what: &str) -> Result<()> {
    if started.elapsed() > DEADLINE {
        bail!("{what}: no end after {DEADLINE:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_with_and_without_the_loop_s_own_figures() {
        let rust = Report {
            measured: Some(Measured {
                records: 1_000,
                elapsed: Duration::from_micros(2_500),
                transactions: 7,
            }),
            peak_rss_kib: 90_000,
            cpu_ms: 1_230,
        };
        let stdout = format!("noise\n{}\n", rust.line());
        assert_eq!(Report::parse(&stdout).unwrap(), rust);
        // The Kafka Streams program's line (Bench.java) has the process figures only.
        let jvm = Report::parse("kafka-streams: …\ne2e-result peak_rss_kib=512000 cpu_ms=9870\n")
            .unwrap();
        assert_eq!(
            jvm,
            Report {
                measured: None,
                peak_rss_kib: 512_000,
                cpu_ms: 9_870
            }
        );
        assert!(Report::parse("e2e-result records=5 peak_rss_kib=1 cpu_ms=1").is_err());
        assert!(Report::parse("e2e-result peak_rss_kib=1").is_err());
        assert!(Report::parse("nothing").is_err());
    }

    #[test]
    fn cpu_time_is_read_from_fields_14_and_15_of_stat() {
        // A command name with spaces and a parenthesis; utime 150 and stime 50 ticks.
        let stat = "4242 (java (x) y) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 40";
        assert_eq!(cpu_ms_of_stat(stat).unwrap(), 2_000);
        assert!(cpu_ms_of_stat("4242 (java) S 1").is_err());
    }
}
