//! One measured windows run: fresh topics, the seeded history, then one way of windowed
//! counting started over it while live traffic flows (*startup and live*), and afterwards the
//! same way started again, fresh, over everything written (*replay*). Each phase's final
//! results are read by a `read_committed` consumer and compared with the batch ground truth.
//!
//! Each phase ends on evidence, once the live events are all written: when the job has
//! processed and committed every record written, closed every window it can, committed its
//! results, and the consumer has read them all. Stream time: its committed record count
//! reaches the records written and the consumer has read as many results as it committed
//! (the windows stream time has not passed stay open: no later record will come to pass
//! them). Evidence: the stage's committed deliveries reach the records written, every task's
//! watermark has passed the last window's end with no keyed timer left, its committed
//! emissions reach its emissions, and the consumer has read as many. Should a job stop making
//! progress — nothing fetched, processed, committed or read for `grace` — the phase ends
//! there, with a warning.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use parsley_runtime::{Admin, Running, TopicSpec};
use tracing::warn;

use super::evidence::{self, Emitted, EvidenceSettings};
use super::stream_time::{self, StreamTimeJob, StreamTimeSettings};
use super::{Final, Truth, WindowFigures, WindowId};
use crate::error::{Error, Result};
use crate::measure::Anchor;
use crate::observe::{Observer, Seen};
use crate::produce::{self, LiveTraffic};
use crate::workload::{Workload, WorkloadConfig};

/// The ways of windowed counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowMethod {
    /// The Parsley DSL pipeline, windows closed by the stage's watermark.
    Evidence,
    /// Kafka Streams' stream time with grace (one row per grace).
    StreamTime,
}

impl WindowMethod {
    /// Both, in the table's order.
    pub const ALL: [WindowMethod; 2] = [WindowMethod::Evidence, WindowMethod::StreamTime];

    /// A short name for flags and topics.
    pub fn slug(self) -> &'static str {
        match self {
            WindowMethod::Evidence => "evidence",
            WindowMethod::StreamTime => "stream-time",
        }
    }

    /// Parses [`WindowMethod::slug`].
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown name.
    pub fn from_slug(s: &str) -> Result<Self> {
        WindowMethod::ALL
            .into_iter()
            .find(|m| m.slug() == s)
            .ok_or_else(|| {
                Error::config(
                    "windows",
                    format!("unknown windowing {s:?} (evidence, stream-time)"),
                )
            })
    }
}

/// Settings of the windows runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowSettings {
    /// Tumbling window size, ms.
    pub size_ms: i64,
    /// Stream time: one windowed count per grace, ms.
    pub graces_ms: Vec<i64>,
    /// Stream time: Kafka Streams' `max.task.idle.ms`.
    pub task_idle_ms: i64,
    /// Evidence: the built-in clock's lag, ms.
    pub lag_ms: i64,
    /// Evidence: the built-in clock's tick interval, ms.
    pub tick_interval_ms: i64,
    /// Both: the commit interval.
    pub commit_interval: Duration,
    /// Also run the replay phase.
    pub replay: bool,
}

/// One phase's figures for one row.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseFigures {
    /// The comparison with the ground truth.
    pub figures: WindowFigures,
    /// Records dropped (stream time) or counted too late (evidence): left out of a window
    /// because it had closed.
    pub dropped: u64,
    /// Windows still open when the phase ended, if the method reports them.
    pub open: Option<u64>,
}

/// One row of the windows table: a method (and grace) on one seed.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRow {
    /// The method as the table names it.
    pub name: String,
    /// The method.
    pub method: WindowMethod,
    /// The workload's seed.
    pub seed: u64,
    /// Events counted by the ground truth.
    pub events: u64,
    /// Startup over history, then live.
    pub live: PhaseFigures,
    /// The replay over everything written.
    pub replay: Option<PhaseFigures>,
}

impl WindowRow {
    /// A short label for the chart: `evidence`, `grace 0 ms`, …
    pub fn label(&self) -> String {
        match self.method {
            WindowMethod::Evidence => "evidence".to_string(),
            WindowMethod::StreamTime => self
                .name
                .strip_prefix("stream time, ")
                .unwrap_or(&self.name)
                .to_string(),
        }
    }
}

/// Runs `method` on a fresh copy of the workload `config` (no ticker: no control records);
/// one row per output (stream time: per grace).
///
/// # Errors
/// Any [`Error`] of the generator, the job or the observer.
pub fn run(
    bootstrap: &str,
    config: &WorkloadConfig,
    method: WindowMethod,
    settings: &WindowSettings,
    grace: Duration,
    bar: &ProgressBar,
) -> Result<Vec<WindowRow>> {
    let admin = Admin::new(bootstrap, Duration::from_secs(60))
        .map_err(|e| Error::runtime("creating an admin client", e))?;
    let workload = Workload::new(WorkloadConfig {
        prefix: format!(
            "{}-{}-s{}-{:x}",
            config.prefix,
            method.slug(),
            config.seed,
            produce::now_ms()
        ),
        control_interval_ms: 0,
        ..config.clone()
    })?;
    produce::create_topics(&admin, &workload)?;
    let mut cleanup = workload.topics();
    let result = measure(
        bootstrap,
        &admin,
        &workload,
        method,
        settings,
        grace,
        bar,
        &mut cleanup,
    );
    cleanup.sort_unstable();
    cleanup.dedup();
    let names: Vec<&str> = cleanup.iter().map(String::as_str).collect();
    if let Err(e) = admin.delete_topics(&names) {
        warn!(error = %e, "deleting the windows run's topics");
    }
    result
}

/// A running windowed job.
enum Job {
    Evidence(Box<Running>, Emitted),
    StreamTime(StreamTimeJob),
}

/// What a job reports per output at its stop: records left out of closed windows, windows
/// still open (if known), and when each result was emitted.
type Stopped = (u64, Option<u64>, HashMap<WindowId, Instant>);

impl Job {
    fn check(&self) -> Result<()> {
        match self {
            Job::Evidence(running, _) => crate::offsets::check(running),
            // Its error comes with the stop.
            Job::StreamTime(_) => Ok(()),
        }
    }

    /// Stops it; per output, what it reports.
    fn stop(self) -> Result<Vec<Stopped>> {
        match self {
            Job::Evidence(running, emitted) => {
                let m = running
                    .stop()
                    .map_err(|e| Error::runtime("stopping the windowed pipeline", e))?;
                let emitted = std::mem::take(
                    &mut *emitted
                        .lock()
                        .map_err(|_| Error::Worker("the emission log is poisoned".into()))?,
                );
                Ok(vec![(
                    m.iter().map(|(_, m)| m.too_late).sum(),
                    None,
                    emitted,
                )])
            }
            Job::StreamTime(job) => {
                let r = job.stop()?;
                Ok(r.dropped
                    .into_iter()
                    .zip(r.open)
                    .zip(r.emitted)
                    .map(|((d, o), e)| (d, Some(o), e))
                    .collect())
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn measure(
    bootstrap: &str,
    admin: &Admin,
    workload: &Workload,
    method: WindowMethod,
    settings: &WindowSettings,
    grace: Duration,
    bar: &ProgressBar,
    cleanup: &mut Vec<String>,
) -> Result<Vec<WindowRow>> {
    let c = workload.config();
    let label = format!("seed {}: windows, {}", c.seed, method.slug());
    let history = workload.history(produce::now_ms());
    bar.set_length(history.events.len() as u64);
    bar.set_position(0);
    bar.set_message(format!("{label}: writing history"));
    produce::write_history(bootstrap, workload, &history, bar)?;
    let names: Vec<String> = match method {
        WindowMethod::Evidence => vec![format!(
            "closed by evidence (lag {} ms, a tick every {} ms)",
            settings.lag_ms, settings.tick_interval_ms
        )],
        WindowMethod::StreamTime => settings
            .graces_ms
            .iter()
            .map(|g| format!("stream time, grace {g} ms"))
            .collect(),
    };

    bar.set_message(format!("{label}: startup and live"));
    let phase = start_phase(
        bootstrap, admin, workload, method, settings, "live", cleanup,
    )?;
    let live = LiveTraffic::start(bootstrap, workload, &history)?;
    while !live.wait_done(Duration::from_millis(100)) {
        phase.job.check()?;
        bar.set_position(phase.observer.seen());
    }
    // No ticker: the traffic is over.
    let summary = live.stop()?;
    let truth = Truth::new(settings.size_ms, &history, &summary.acked);
    bar.set_length(truth.windows.len() as u64 * phase.outputs as u64);
    wait_end(&phase, &truth, grace, bar)?;
    let live_figures = phase.finish(&truth)?;

    let replay = if settings.replay {
        bar.set_message(format!("{label}: replay"));
        bar.set_position(0);
        let phase = start_phase(
            bootstrap, admin, workload, method, settings, "replay", cleanup,
        )?;
        wait_end(&phase, &truth, grace, bar)?;
        Some(phase.finish(&truth)?)
    } else {
        None
    };
    Ok(names
        .into_iter()
        .enumerate()
        .map(|(i, name)| WindowRow {
            name,
            method,
            seed: c.seed,
            events: truth.events(),
            live: live_figures[i],
            replay: replay.as_ref().map(|r| r[i]),
        })
        .collect())
}

/// A phase: the job, the observer of its outputs, and when it started.
struct Phase {
    job: Job,
    observer: Observer<(u32, i64, u64)>,
    outputs: usize,
    anchor: Anchor,
}

impl Phase {
    /// Stops the job and the observer; per output, the figures.
    fn finish(self, truth: &Truth) -> Result<Vec<PhaseFigures>> {
        let stopped = self.job.stop();
        let seen = self.observer.stop()?;
        let stopped = stopped?;
        Ok(stopped
            .into_iter()
            .enumerate()
            .map(|(i, (dropped, open, emitted))| PhaseFigures {
                figures: WindowFigures::of(truth, &finals(&seen, i), &emitted, self.anchor),
                dropped,
                open,
            })
            .collect())
    }
}

fn finals(seen: &[Seen<(u32, i64, u64)>], output: usize) -> Vec<Final> {
    seen.iter()
        .filter(|s| s.topic == output)
        .map(|s| Final {
            product: s.item.0,
            start: s.item.1,
            count: s.item.2,
            at: s.at,
        })
        .collect()
}

/// Creates the phase's output topics and starts its job and observer.
fn start_phase(
    bootstrap: &str,
    admin: &Admin,
    workload: &Workload,
    method: WindowMethod,
    settings: &WindowSettings,
    phase: &str,
    cleanup: &mut Vec<String>,
) -> Result<Phase> {
    let c = workload.config();
    let outputs: Vec<String> = match method {
        WindowMethod::Evidence => vec![format!("{}.counts-{phase}", c.prefix)],
        WindowMethod::StreamTime => settings
            .graces_ms
            .iter()
            .map(|g| format!("{}.counts-{phase}-g{g}", c.prefix))
            .collect(),
    };
    let specs: Vec<TopicSpec> = outputs
        .iter()
        .map(|o| TopicSpec::new(o.clone(), c.partitions))
        .collect();
    admin
        .create_topics(&specs)
        .map_err(|e| Error::runtime("creating the windows' output topics", e))?;
    cleanup.extend(outputs.iter().cloned());
    let anchor = Anchor::now();
    let (job, parse): (Job, crate::observe::Parse<(u32, i64, u64)>) = match method {
        WindowMethod::Evidence => {
            let application = format!("{}-win-{phase}", c.prefix);
            let e = EvidenceSettings {
                size_ms: settings.size_ms,
                lag_ms: settings.lag_ms,
                tick_interval_ms: settings.tick_interval_ms,
                commit_interval: settings.commit_interval,
            };
            let emitted = Emitted::default();
            let topology =
                evidence::topology(&application, workload, &outputs[0], &e, emitted.clone())?;
            cleanup.extend(evidence::internal_topics(&topology, &application));
            let running = evidence::start(bootstrap, topology, &e)?;
            (
                Job::Evidence(Box::new(running), emitted),
                Box::new(evidence::parse_result),
            )
        }
        WindowMethod::StreamTime => {
            let s = StreamTimeSettings {
                size_ms: settings.size_ms,
                graces_ms: settings.graces_ms.clone(),
                task_idle_ms: settings.task_idle_ms,
                commit_interval: settings.commit_interval,
            };
            let job = StreamTimeJob::start(
                bootstrap,
                workload,
                &outputs,
                &format!("{}-st-{phase}", c.prefix),
                &s,
            )?;
            (Job::StreamTime(job), Box::new(stream_time::parse_result))
        }
    };
    let topics: Vec<(String, i32)> = outputs.iter().map(|o| (o.clone(), c.partitions)).collect();
    let observer = Observer::start(bootstrap, &topics, parse)?;
    Ok(Phase {
        job,
        observer,
        outputs: outputs.len(),
        anchor,
    })
}

/// Waits for the end of a phase (module docs).
fn wait_end(phase: &Phase, truth: &Truth, grace: Duration, bar: &ProgressBar) -> Result<()> {
    let records = truth.events();
    let last_end = truth
        .windows
        .keys()
        .map(|(_, start)| start + truth.size_ms)
        .max()
        .unwrap_or(i64::MIN);
    let mut progress = (u64::MAX, Instant::now());
    loop {
        phase.job.check()?;
        let seen = phase.observer.seen();
        let (done, marker) = match &phase.job {
            Job::StreamTime(job) => {
                if job.is_finished() {
                    // Failed: its stop reports why.
                    return Ok(());
                }
                let (processed, results) = (job.committed_records(), job.committed_results());
                (
                    processed >= records && seen >= results,
                    processed + results + seen,
                )
            }
            Job::Evidence(running, _) => {
                let m = running
                    .metrics()
                    .into_iter()
                    .map(|(_, m)| m)
                    .next()
                    .unwrap_or_default();
                let closed = running.task_metrics().iter().all(|(_, tasks)| {
                    tasks
                        .iter()
                        .all(|t| t.watermark_ms.is_some_and(|w| w >= last_end) && t.timers == 0)
                });
                (
                    m.committed_deliveries >= records
                        && closed
                        && m.committed_emissions >= m.emitted
                        && seen >= m.emitted,
                    m.fetched.saturating_sub(m.ticks_read)
                        + m.committed_deliveries
                        + m.committed_emissions
                        + seen,
                )
            }
        };
        if done {
            return Ok(());
        }
        if marker != progress.0 {
            progress = (marker, Instant::now());
        } else if progress.1.elapsed() >= grace {
            warn!(
                seen,
                "a windows phase made no progress for {grace:?}: ended there"
            );
            return Ok(());
        }
        bar.set_position(seen);
        std::thread::sleep(Duration::from_millis(10));
    }
}
