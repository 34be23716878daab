//! Throughput and CPU measured from outside the processes, the same way for every mode.
//!
//! While a case's process runs, the benchmark samples, every [`INTERVAL`]: the offsets the
//! case's consumer group (the raw loop's group, the Parsley stage's group, the Kafka Streams
//! application id) has committed on the input, summed over its partitions — the records the
//! case has consumed *and* committed, outputs included, since every mode commits its input
//! offsets in the transaction that writes its outputs — and the CPU time of the case's process
//! and of the broker (`/proc/PID/stat`, all threads; the part of a JVM's JIT compiler threads
//! apart).
//!
//! A run's window ([`window`]) runs from the first sample at or past 10 % of the input to the
//! first at or past 90 %: throughput is the records committed between those two samples
//! divided by the time between them, and CPU per record the CPU time spent between them
//! divided by the same records. Start-up (a JVM's, a group's join, the first fetches) and
//! shutdown stay outside the window for every mode alike.
//!
//! The committed offsets are read by a consumer of the group that never joins it, with
//! `read_uncommitted`: librdkafka then asks without `require_stable`, and the broker answers
//! at once with the offsets of the last committed transaction instead of making it wait for an
//! open one.

use std::io::Read;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::worker::{self, DEADLINE, Report};

/// How often a run is sampled.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// The window's start, percent of the input.
pub const FROM_PERCENT: u64 = 10;
/// The window's end, percent of the input.
pub const TO_PERCENT: u64 = 90;

/// Deadline of one committed-offsets request.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A process's CPU time, ms: all of it, and the part of its JVM's JIT compiler threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpu {
    /// User plus system time of every thread.
    pub total_ms: u64,
    /// The part of the threads named `C1 CompilerThre…` and `C2 CompilerThre…`.
    pub jit_ms: u64,
}

impl Cpu {
    /// The CPU time spent since `before`.
    pub fn since(self, before: Cpu) -> Cpu {
        Cpu {
            total_ms: self.total_ms.saturating_sub(before.total_ms),
            jit_ms: self.jit_ms.saturating_sub(before.jit_ms),
        }
    }
}

/// The CPU time of process `pid`, from `/proc/PID/stat` (readable while the process is a
/// zombie, before its parent reaps it); its JIT compiler threads are the threads named
/// `C1 CompilerThre…` and `C2 CompilerThre…` in `/proc/PID/task/*/comm` (HotSpot's names, cut
/// to 15 bytes). A freshly started JVM compiles for seconds to minutes, and more whenever a
/// workload runs code it has not run before. `None` when the process cannot be read.
pub fn process_cpu(pid: u32) -> Option<Cpu> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let total_ms = worker::cpu_ms_of_stat(&stat).ok()?;
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
    Some(Cpu { total_ms, jit_ms })
}

/// One look at a running case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Since the case's process started (the middle of the offsets request).
    pub at: Duration,
    /// Records committed: the group's committed offsets on the input, summed.
    pub committed: u64,
    /// The case's process's CPU time.
    pub client: Option<Cpu>,
    /// The broker's CPU time.
    pub broker: Option<Cpu>,
}

/// What happened between the 10 % and the 90 % mark of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Records committed in the window.
    pub records: u64,
    /// Its length.
    pub elapsed: Duration,
    /// The case's process's CPU time in it.
    pub client: Option<Cpu>,
    /// The broker's CPU time in it.
    pub broker: Option<Cpu>,
}

impl Window {
    /// Records per second.
    pub fn throughput(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }

    /// `ms` of CPU time per record of the window, µs.
    pub fn per_record_us(&self, ms: u64) -> f64 {
        ms as f64 * 1000.0 / self.records as f64
    }
}

/// The window of a run over `total` input records (module docs): from the first sample with
/// at least 10 % of them committed to the first with at least 90 %. `None` when the samples
/// do not reach 90 %, or the two marks fall on the same sample (a run shorter than the
/// sampling interval).
pub fn window(samples: &[Sample], total: u64) -> Option<Window> {
    let first = |percent: u64| {
        let mark = (u128::from(total) * u128::from(percent)).div_ceil(100);
        samples.iter().find(|s| u128::from(s.committed) >= mark)
    };
    let (from, to) = (first(FROM_PERCENT)?, first(TO_PERCENT)?);
    if to.at <= from.at || to.committed <= from.committed {
        return None;
    }
    let since = |after: Option<Cpu>, before: Option<Cpu>| Some(after?.since(before?));
    Some(Window {
        records: to.committed - from.committed,
        elapsed: to.at - from.at,
        client: since(to.client, from.client),
        broker: since(to.broker, from.broker),
    })
}

/// Samples one case: its group's committed offsets on the input, its process's CPU time and
/// the broker's.
pub struct Sampler {
    /// A consumer of the case's group that never joins it.
    consumer: BaseConsumer,
    /// Every partition of the input.
    partitions: TopicPartitionList,
    broker_pid: Option<u32>,
    started: Instant,
    /// The samples so far.
    pub samples: Vec<Sample>,
}

impl Sampler {
    /// A sampler of `group`'s committed offsets on the `partitions` partitions of `input`, and
    /// of the broker process `broker_pid`.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub fn new(
        bootstrap: &str,
        group: &str,
        input: &str,
        partitions: i32,
        broker_pid: Option<u32>,
    ) -> Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("isolation.level", "read_uncommitted")
            .set("enable.auto.commit", "false")
            .create()
            .context("creating the offsets sampler")?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(input, p);
        }
        Ok(Sampler {
            consumer,
            partitions: tpl,
            broker_pid,
            started: Instant::now(),
            samples: Vec::new(),
        })
    }

    /// Takes one sample of the case's process `pid` and keeps it; returns the records
    /// committed.
    ///
    /// # Errors
    /// When the committed offsets cannot be read.
    pub fn sample(&mut self, pid: u32) -> Result<u64> {
        let asked = Instant::now();
        let offsets = self
            .consumer
            .committed_offsets(self.partitions.clone(), TIMEOUT)
            .context("reading the group's committed offsets")?;
        let answered = Instant::now();
        let committed = offsets
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o.max(0) as u64,
                _ => 0,
            })
            .sum();
        let at = (asked + (answered - asked) / 2).saturating_duration_since(self.started);
        self.samples.push(Sample {
            at,
            committed,
            client: process_cpu(pid),
            broker: self.broker_pid.and_then(process_cpu),
        });
        Ok(committed)
    }
}

/// Runs a case's process to its end, sampling it every [`INTERVAL`], and parses its report.
/// A process whose standard input is piped (the Kafka Streams program) runs until it is
/// closed: once `records` records are committed. `case` names it in errors.
///
/// # Errors
/// When the process fails or outlives [`DEADLINE`], or its report cannot be parsed.
pub fn supervise(
    mut child: Child,
    sampler: &mut Sampler,
    records: u64,
    case: &str,
) -> Result<Report> {
    let pid = child.id();
    let mut stdout = child.stdout.take().context("the case's standard output")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let mut stdin = child.stdin.take();
    let started = Instant::now();
    let mut next = started;
    // Failed samples (a coordinator moving at a group's start: `NotCoordinator`) are left
    // out; the first is said when more than one failed.
    let (mut failed, mut first_failure) = (0u32, None);
    let status: ExitStatus = loop {
        // Sampled before `try_wait`: an exited process is read as a zombie, before it is
        // reaped, so the last sample still has its CPU time.
        match sampler.sample(pid) {
            Ok(committed) if committed >= records => drop(stdin.take()),
            Ok(_) => {}
            Err(e) => {
                failed += 1;
                first_failure.get_or_insert(e);
            }
        }
        if let Some(status) = child.try_wait().context("waiting for the case")? {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{case}: no end after {DEADLINE:?}");
        }
        next += INTERVAL;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    };
    let text = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reader of {case}'s output panicked"))?
        .with_context(|| format!("reading {case}'s output"))?;
    if let (true, Some(e)) = (failed > 1, first_failure) {
        eprintln!(
            "e2e: {case}: {failed} of {} samples failed, the first: {e:#}",
            sampler.samples.len() as u32 + failed
        );
    }
    if !status.success() {
        bail!("the process of {case} exited with {status}");
    }
    Report::parse(&text).with_context(|| format!("the report of {case}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ms: u64, committed: u64, client_ms: u64, broker_ms: u64) -> Sample {
        Sample {
            at: Duration::from_millis(ms),
            committed,
            client: Some(Cpu {
                total_ms: client_ms,
                jit_ms: client_ms / 10,
            }),
            broker: Some(Cpu {
                total_ms: broker_ms,
                jit_ms: 0,
            }),
        }
    }

    #[test]
    fn the_window_runs_from_the_first_sample_past_10_percent_to_the_first_past_90() {
        // 1,000 records: the marks are 100 and 900.
        let samples = [
            sample(0, 0, 500, 0),
            sample(100, 0, 700, 10),
            sample(200, 99, 800, 20),
            sample(300, 150, 900, 30),
            sample(400, 500, 1_000, 50),
            sample(500, 899, 1_100, 70),
            sample(600, 950, 1_200, 90),
            sample(700, 1_000, 1_300, 100),
        ];
        let w = window(&samples, 1_000).unwrap();
        // From (300 ms, 150) to (600 ms, 950): 800 records in 300 ms.
        assert_eq!(w.records, 800);
        assert_eq!(w.elapsed, Duration::from_millis(300));
        assert!((w.throughput() - 800.0 / 0.3).abs() < 1e-6);
        assert_eq!(
            w.client,
            Some(Cpu {
                total_ms: 300,
                jit_ms: 30
            })
        );
        assert_eq!(w.broker.map(|b| b.total_ms), Some(60));
        // 300 ms over 800 records: 375 µs per record.
        assert!((w.per_record_us(300) - 375.0).abs() < 1e-9);
    }

    #[test]
    fn a_mark_met_exactly_counts_and_the_marks_round_up() {
        // 10 records: the marks are 1 and 9.
        let samples = [
            sample(0, 1, 0, 0),
            sample(100, 8, 0, 0),
            sample(200, 9, 0, 0),
        ];
        let w = window(&samples, 10).unwrap();
        assert_eq!((w.records, w.elapsed), (8, Duration::from_millis(200)));
        // 15 records: 10 % is 1.5, so the first mark is 2.
        let samples = [
            sample(0, 1, 0, 0),
            sample(100, 2, 0, 0),
            sample(300, 14, 0, 0),
        ];
        let w = window(&samples, 15).unwrap();
        assert_eq!((w.records, w.elapsed), (12, Duration::from_millis(200)));
    }

    #[test]
    fn no_window_when_the_run_does_not_reach_90_percent_or_passes_both_marks_at_once() {
        let short = [
            sample(0, 0, 0, 0),
            sample(100, 500, 0, 0),
            sample(200, 899, 0, 0),
        ];
        assert_eq!(window(&short, 1_000), None);
        let jump = [sample(0, 0, 0, 0), sample(100, 1_000, 0, 0)];
        assert_eq!(window(&jump, 1_000), None);
        assert_eq!(window(&[], 1_000), None);
    }

    #[test]
    fn cpu_is_missing_from_the_window_when_a_mark_has_none() {
        let mut samples = [sample(0, 100, 10, 10), sample(100, 900, 20, 20)];
        samples[0].broker = None;
        let w = window(&samples, 1_000).unwrap();
        assert_eq!(w.client.map(|c| c.total_ms), Some(10));
        assert_eq!(w.broker, None);
    }
}
