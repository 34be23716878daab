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
    /// When a thread cannot be spawned. Stage errors arrive as [`Progress::Failed`] and from
    /// [`Running::stop`].
    pub fn start(&self) -> Result<Running> {
        let names: Vec<&str> = self.topology.stages().iter().map(|s| s.name()).collect();
        self.start_stages(&names)
    }

    /// Starts the named stages, each on its own stream thread (to start a downstream stage
    /// later, as a replay or a late joiner does, call this once per group of stages).
    ///
    /// # Errors
    /// [`Error::UnknownStage`] for a name not in the topology; [`Error::StageFailed`] when a
    /// thread cannot be spawned. Stage errors arrive as [`Progress::Failed`] and from
    /// [`Running::stop`].
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
                    let result = runtime.run_stage_with(&n, &sd, Some(obs.clone()), m);
                    let _ = obs.send(match &result {
                        Ok(()) => Progress::Stopped { stage: n.clone() },
                        Err(e) => Progress::Failed {
                            stage: n.clone(),
                            error: e.to_string(),
                        },
                    });
                    result
                })
                .map_err(|e| Error::StageFailed {
                    stage: name.clone(),
                    message: format!("cannot spawn its thread: {e}"),
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

/// Stages running on their stream threads.
#[derive(Debug)]
pub struct Running {
    stages: Vec<(String, JoinHandle<Result<()>>, Arc<StageMetrics>)>,
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
    /// # Errors
    /// [`Error::StageFailed`] for the first stage that ended with an error.
    pub fn stop(self) -> Result<Vec<(String, MetricsSnapshot)>> {
        self.shutdown.trigger();
        let mut out = Vec::new();
        let mut first_error = None;
        for (name, handle, metrics) in self.stages {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(Error::StageFailed {
                        stage: name.clone(),
                        message: e.to_string(),
                    });
                }
                Err(_) => {
                    first_error.get_or_insert(Error::StageFailed {
                        stage: name.clone(),
                        message: "its thread panicked".into(),
                    });
                }
            }
            out.push((name, metrics.snapshot()));
        }
        first_error.map_or(Ok(out), Err)
    }
}
