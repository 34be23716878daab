//! Running a topology: one stream thread per stage, or one stage per process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use parsley_stage::Topology;

use crate::config::RuntimeConfig;
use crate::error::{Error, Result};
use crate::metrics::{LateKey, MetricsSnapshot, Progress, StageMetrics, TaskMetrics};
use crate::stage::StageRunner;

/// A cloneable request to stop: stream threads commit and return at their next loop turn
/// (within 100 ms of polling).
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// A fresh, untriggered signal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every stage watching this signal to stop.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// `true` once [`Shutdown::trigger`] was called.
    pub fn is_triggered(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Runs the stages of a [`Topology`] against a cluster.
#[derive(Debug, Clone)]
pub struct Runtime {
    topology: Topology,
    config: RuntimeConfig,
}

impl Runtime {
    /// A runtime for `topology` with `config`.
    pub fn new(topology: Topology, config: RuntimeConfig) -> Self {
        Runtime { topology, config }
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Runs the stage `name` on the calling thread until `shutdown` is triggered (it then
    /// commits and returns `Ok`) or an error stops it (its open transaction is aborted).
    ///
    /// # Errors
    /// [`Error::UnknownStage`], topic resolution and co-partitioning errors, and every error
    /// that stops the stage.
    pub fn run_stage(
        &self,
        name: &str,
        shutdown: &Shutdown,
        observer: Option<Sender<Progress>>,
    ) -> Result<MetricsSnapshot> {
        let metrics = Arc::new(StageMetrics::default());
        self.run_stage_with(name, shutdown, observer, metrics.clone())?;
        Ok(metrics.snapshot())
    }

    fn run_stage_with(
        &self,
        name: &str,
        shutdown: &Shutdown,
        observer: Option<Sender<Progress>>,
        metrics: Arc<StageMetrics>,
    ) -> Result<()> {
        let spec = self
            .topology
            .stage(name)
            .ok_or_else(|| Error::UnknownStage(name.to_string()))?
            .clone();
        StageRunner::new(
            self.topology.application_id(),
            spec,
            self.config.clone(),
            metrics,
            observer,
            shutdown.0.clone(),
        )?
        .run()
    }

    /// Starts every stage on its own stream thread.
    ///
    /// # Errors
    /// [`Error::ThreadSpawn`] when a stream thread cannot be spawned. The errors of the
    /// stages themselves come later, typed, as [`Runtime::start_stages`] describes: as
    /// [`Progress::Failed`] to the observer and from [`Running::stop`].
    pub fn start(&self) -> Result<Running> {
        let names: Vec<&str> = self.topology.stages().iter().map(|s| s.name()).collect();
        self.start_stages(&names)
    }

    /// Starts the named stages, each on its own stream thread (to start a downstream stage
    /// later, as a replay or a late joiner does, call this once per group of stages).
    ///
    /// # Errors
    /// [`Error::UnknownStage`] for a name not in the topology; [`Error::ThreadSpawn`] when a
    /// stream thread cannot be spawned. The errors of the stages themselves come later,
    /// typed: each stage that ends with an error sends [`Progress::Failed`] with it (the
    /// stage's own error, shared), and [`Running::stop`] returns the first such stage's as
    /// the `source` of an [`Error::StageFailed`].
    pub fn start_stages(&self, names: &[&str]) -> Result<Running> {
        let shutdown = Shutdown::new();
        let (tx, rx) = channel();
        let mut stages = Vec::new();
        for name in names {
            let name = self
                .topology
                .stage(name)
                .ok_or_else(|| Error::UnknownStage(name.to_string()))?
                .name()
                .to_string();
            let metrics = Arc::new(StageMetrics::default());
            let runtime = self.clone();
            let (sd, obs, m, n) = (shutdown.clone(), tx.clone(), metrics.clone(), name.clone());
            let handle = std::thread::Builder::new()
                .name(format!("parsley-{name}"))
                .spawn(move || {
                    // One error for both receivers: the observer's event and `stop`.
                    let result = runtime
                        .run_stage_with(&n, &sd, Some(obs.clone()), m)
                        .map_err(Arc::new);
                    let _ = obs.send(match &result {
                        Ok(()) => Progress::Stopped { stage: n.clone() },
                        Err(e) => Progress::Failed {
                            stage: n.clone(),
                            error: Arc::clone(e),
                        },
                    });
                    result
                })
                .map_err(|source| Error::ThreadSpawn {
                    stage: name.clone(),
                    source,
                })?;
            stages.push((name, handle, metrics));
        }
        Ok(Running {
            stages,
            shutdown,
            progress: rx,
        })
    }
}

/// A stage's stream thread: it returns the stage's error shared (`Arc`), the same error its
/// [`Progress::Failed`] carried.
type StageThread = JoinHandle<Result<(), Arc<Error>>>;

/// Stages running on their stream threads.
#[derive(Debug)]
pub struct Running {
    stages: Vec<(String, StageThread, Arc<StageMetrics>)>,
    shutdown: Shutdown,
    progress: Receiver<Progress>,
}

impl Running {
    /// The next progress event, waiting at most `timeout`; `None` on timeout.
    pub fn next_progress(&self, timeout: Duration) -> Option<Progress> {
        self.progress.recv_timeout(timeout).ok()
    }

    /// Current counters of every stage.
    pub fn metrics(&self) -> Vec<(String, MetricsSnapshot)> {
        self.stages
            .iter()
            .map(|(n, _, m)| (n.clone(), m.snapshot()))
            .collect()
    }

    /// Current counters of every task of every stage this instance owns (tasks restoring
    /// included), by stage.
    pub fn task_metrics(&self) -> Vec<(String, Vec<TaskMetrics>)> {
        self.stages
            .iter()
            .map(|(n, _, m)| (n.clone(), m.tasks()))
            .collect()
    }

    /// The per-key violation counter of every event-time stage, by stage: each key of a task
    /// this instance owns that had late records, with its count ([`LateKey`]).
    pub fn late_by_key(&self) -> Vec<(String, Vec<LateKey>)> {
        self.stages
            .iter()
            .map(|(n, _, m)| (n.clone(), m.late_by_key()))
            .collect()
    }

    /// The shutdown signal of these stages.
    pub fn shutdown_signal(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Stops every stage (each commits first) and returns their final counters.
    ///
    /// Every stage is stopped and joined even when one failed; the error is that of the first
    /// failed stage in start order.
    ///
    /// # Errors
    /// - [`Error::StageFailed`] for a stage that ended with an error: `stage` names it, and
    ///   `source` is its own typed error (the one its [`Progress::Failed`] carried), so a
    ///   caller can match it without parsing text — through [`Error::stage_error`], e.g.
    ///   `Error::RecordsLost { .. }` or `Error::Fenced { .. }` — and classify it
    ///   ([`Error::is_retriable`], [`Error::is_fenced`], [`Error::is_transient`],
    ///   [`Error::is_fatal`] look through the wrapper).
    /// - [`Error::StagePanicked`] for a stage whose stream thread panicked.
    ///
    /// ```no_run
    /// # use parsley_runtime::{Error, Running};
    /// # fn running() -> Running { unimplemented!() }
    /// match running().stop() {
    ///     Ok(stages) => println!("{} stages stopped", stages.len()),
    ///     Err(e) => match e.stage_error() {
    ///         Error::RecordsLost { topic, from, log_start, .. } => {
    ///             eprintln!("{topic}: records [{from}, {log_start}) were deleted before delivery")
    ///         }
    ///         Error::Fenced { .. } => eprintln!("another process runs with this instance id"),
    ///         _ => eprintln!("{e}"),
    ///     },
    /// }
    /// ```
    pub fn stop(self) -> Result<Vec<(String, MetricsSnapshot)>> {
        self.shutdown.trigger();
        let mut out = Vec::new();
        let mut first_error = None;
        for (name, handle, metrics) in self.stages {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(source)) => {
                    first_error.get_or_insert(Error::StageFailed {
                        stage: name.clone(),
                        source,
                    });
                }
                Err(payload) => {
                    first_error.get_or_insert(Error::StagePanicked {
                        stage: name.clone(),
                        message: panic_message(payload.as_ref()),
                    });
                }
            }
            out.push((name, metrics.snapshot()));
        }
        first_error.map_or(Ok(out), Err)
    }
}

/// The message of a panic, when its payload is a string (`panic!` with a message).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|m| (*m).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn a_panic_message_is_kept_when_the_payload_is_a_string() {
        let literal: Box<dyn std::any::Any + Send> = Box::new("boom");
        let formatted: Box<dyn std::any::Any + Send> = Box::new(format!("boom at {}", 3));
        let other: Box<dyn std::any::Any + Send> = Box::new(7_u32);
        assert_eq!(panic_message(literal.as_ref()).as_deref(), Some("boom"));
        assert_eq!(
            panic_message(formatted.as_ref()).as_deref(),
            Some("boom at 3")
        );
        assert_eq!(panic_message(other.as_ref()), None);
    }
}
