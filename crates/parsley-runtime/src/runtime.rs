//! Running a topology: each stage on its stream threads
//! ([`RuntimeConfig::stream_threads`], one by default; module `threads`), or one stage per
//! process; until told to stop, or until SIGINT or SIGTERM ([`Runtime::run_until_signal`]).

use crate::shutdown::Shutdown;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use parsley_stage::Topology;

use crate::config::RuntimeConfig;
use crate::endpoint::{Endpoint, Served};
use crate::signals::SignalWatch;
use crate::stage::StageRunner;
use crate::threads::StageThreads;
use parsley_task::error::{Error, Result};
use parsley_task::error::{KafkaError, ProcessingError, SetupError};
use parsley_task::explain::Explanation;
use parsley_task::metrics::{
    LateKey, MetricsSnapshot, Progress, StageEnd, StageMetrics, TaskMetrics,
};

/// How often [`Running::wait_for_signal`] looks at its signal flags and the shutdown signal
/// (a signal handler can only set a flag; progress events wake it earlier).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Runs the stages of a [`Topology`] against a cluster.
#[derive(Debug, Clone)]
pub struct Runtime {
    topology: Topology,
    pub(crate) config: RuntimeConfig,
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

    /// Runs the stage `name` on the calling thread — one stream thread, whatever
    /// [`RuntimeConfig::stream_threads`] says — until `shutdown` is triggered (it then
    /// commits and returns `Ok`) or an error stops it (its open transaction is aborted).
    ///
    /// # Errors
    /// [`SetupError::UnsupportedGroupProtocol`] for a consumer `group.protocol` other than
    /// `classic`; [`SetupError::UnknownStage`], topic resolution and co-partitioning errors, and
    /// every error that stops the stage.
    pub fn run_stage(
        &self,
        name: &str,
        shutdown: &Shutdown,
        observer: Option<Sender<Progress>>,
    ) -> Result<MetricsSnapshot> {
        self.config.check_group_protocol()?;
        let metrics = Arc::new(StageMetrics::default());
        self.run_stage_with(
            name,
            shutdown,
            observer,
            (metrics.clone(), &crate::stage::Siblings::new()),
        )?;
        Ok(metrics.snapshot())
    }

    /// Runs one stream thread of stage `name`, the one this runtime's configuration is for,
    /// with its counters and what it shares with the stage's other threads here.
    fn run_stage_with(
        &self,
        name: &str,
        shutdown: &Shutdown,
        observer: Option<Sender<Progress>>,
        (metrics, siblings): (Arc<StageMetrics>, &crate::stage::Siblings),
    ) -> Result<()> {
        let spec = self
            .topology
            .stage(name)
            .ok_or_else(|| Error::Setup(SetupError::UnknownStage(name.to_string())))?
            .clone();
        let feeding = crate::stage::feeding_stages(&self.topology, &spec);
        // A refusal for want of an ACL leaves the stage naming the resource (module
        // `authorization`): its group and transactional id when the error does not.
        let group = spec.group_id(self.topology.application_id());
        let names = crate::authorization::Names {
            transactional_id: Some(self.config.transactional_id(&group)),
            group: Some(group),
            client: None,
        };
        StageRunner::new(
            self.topology.application_id(),
            spec,
            &feeding,
            self.config.clone(),
            (metrics, siblings),
            observer,
            shutdown.0.clone(),
        )
        .and_then(StageRunner::run)
        .map_err(|e| names.typed(e))
    }

    /// Starts every stage on its own stream threads ([`RuntimeConfig::stream_threads`] each).
    ///
    /// # Errors
    /// [`SetupError::UnsupportedGroupProtocol`] as [`Runtime::start_stages`];
    /// [`SetupError::ThreadSpawn`] when a stream thread cannot be spawned. The errors of the
    /// stages themselves come later, typed, as [`Runtime::start_stages`] describes: as
    /// [`Progress::Failed`] to the observer and from [`Running::stop`].
    pub fn start(&self) -> Result<Running> {
        let names: Vec<&str> = self.topology.stages().iter().map(|s| s.name()).collect();
        self.start_stages(&names)
    }

    /// Starts every stage, each on its own stream thread, and runs them until SIGINT or
    /// SIGTERM arrives or a stage fails: [`Runtime::start`], then
    /// [`Running::wait_for_signal`] (whose docs say what happens to SIGINT and SIGTERM). The
    /// signals are watched from before the first stage starts, so one that comes while the
    /// stages start up stops them too.
    ///
    /// Returns every stage's final counters once a signal stopped them all cleanly (each
    /// commits first).
    ///
    /// ```no_run
    /// use parsley_runtime::{Runtime, RuntimeConfig};
    /// # fn topology() -> parsley_stage::Topology { unimplemented!() }
    /// match Runtime::new(topology(), RuntimeConfig::new("127.0.0.1:9092")).run_until_signal() {
    ///     Ok(stages) => println!("stopped on a signal: {} stages committed", stages.len()),
    ///     Err(e) => {
    ///         eprintln!("{e}");
    ///         std::process::exit(1);
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    /// [`SetupError::Signals`] when the handlers cannot be installed (nothing started);
    /// [`SetupError::ThreadSpawn`] as [`Runtime::start`]; and what
    /// [`Running::wait_for_signal`] returns.
    pub fn run_until_signal(&self) -> Result<Vec<(String, MetricsSnapshot)>> {
        let watch = SignalWatch::install()?;
        self.start()?.wait_then_stop(&watch)
    }

    /// Starts the named stages, each on its own stream threads
    /// ([`RuntimeConfig::stream_threads`] per stage; to start a downstream stage
    /// later, as a replay or a late joiner does, call this once per group of stages). With
    /// [`RuntimeConfig::metrics_address`] set, the metrics endpoint of these stages is bound
    /// first and serves until [`Running::stop`].
    ///
    /// # Errors
    /// [`SetupError::UnsupportedGroupProtocol`] for a consumer `group.protocol` other than
    /// `classic` (KIP-848's consumer protocol; nothing started); [`SetupError::UnknownStage`] for a
    /// name not in the topology; [`SetupError::MetricsListener`] when the metrics endpoint cannot
    /// listen (nothing started); [`SetupError::ThreadSpawn`] when a stream thread cannot be
    /// spawned. The errors of the stages themselves come later, typed: each stage that ends with an
    /// error sends [`Progress::Failed`] with it (the stage's own error, shared), and
    /// [`Running::stop`] returns the first such stage's as the `source` of an
    /// [`Error::StageFailed`].
    pub fn start_stages(&self, names: &[&str]) -> Result<Running> {
        self.config.check_group_protocol()?;
        let shutdown = Shutdown::new();
        let (tx, rx) = channel();
        let specs = names
            .iter()
            .map(|name| {
                self.topology
                    .stage(name)
                    .cloned()
                    .ok_or_else(|| Error::Setup(SetupError::UnknownStage(name.to_string())))
            })
            .collect::<Result<Vec<_>>>()?;
        let served: Vec<_> = specs
            .into_iter()
            .map(|spec| (spec, StageThreads::new(self.config.stream_threads)))
            .collect();
        let endpoint = match self.config.metrics_address {
            Some(address) => {
                let served = Served {
                    stages: served.clone().into(),
                    shutdown: shutdown.clone(),
                };
                Some(Endpoint::start(address, served)?)
            }
            None => None,
        };
        let mut stages = Vec::new();
        for (spec, threads) in served {
            let name = spec.name().to_string();
            let siblings = crate::stage::Siblings::new();
            let mut handles = Vec::new();
            for (i, metrics) in threads.threads().iter().enumerate() {
                let mut runtime = self.clone();
                runtime.config = runtime.config.for_thread(i);
                if endpoint.is_some() {
                    runtime.config = runtime.config.digesting_statistics(metrics.clone());
                }
                let thread_name = match threads.threads().len() {
                    1 => format!("parsley-{name}"),
                    _ => format!("parsley-{name}-{i}"),
                };
                let context = (shutdown.clone(), tx.clone(), siblings.clone(), name.clone());
                match spawn_thread(thread_name, runtime, metrics.clone(), context) {
                    Ok(handle) => handles.push(handle),
                    Err(source) => {
                        // The threads started so far are stopped before the error returns.
                        shutdown.trigger();
                        for handle in stages
                            .into_iter()
                            .flat_map(|s: RunningStage| s.threads)
                            .chain(handles)
                        {
                            let _ = handle.join();
                        }
                        return Err(Error::Setup(SetupError::ThreadSpawn {
                            stage: name.clone(),
                            source,
                        }));
                    }
                }
            }
            stages.push(RunningStage {
                name,
                threads: handles,
                metrics: threads,
            });
        }
        Ok(Running {
            stages,
            shutdown,
            progress: rx,
            runtime: self.clone(),
            endpoint,
        })
    }
}

/// Spawns stream thread `name` of a stage, which runs with `runtime`'s configuration (made for
/// the thread) and counts into `metrics`; `context`: the shutdown signal, the observer, what the
/// stage's threads share and the stage's name.
fn spawn_thread(
    name: String,
    runtime: Runtime,
    metrics: Arc<StageMetrics>,
    (sd, obs, siblings, n): (
        Shutdown,
        Sender<Progress>,
        Arc<crate::stage::Siblings>,
        String,
    ),
) -> std::io::Result<StageThread> {
    std::thread::Builder::new().name(name).spawn(move || {
        let m = metrics;
        let _panicked = MarkPanic(m.clone());
        // One error for both receivers: the observer's event and `stop`.
        let result = runtime
            .run_stage_with(&n, &sd, Some(obs.clone()), (m.clone(), &siblings))
            .map_err(Arc::new);
        // Recorded before the event, so that whoever waits for the event finds the stage
        // ended (the readiness check).
        m.end(match &result {
            Ok(()) => StageEnd::Stopped,
            Err(e) => StageEnd::Failed(e.to_string()),
        });
        let _ = obs.send(match &result {
            Ok(()) => Progress::Stopped { stage: n.clone() },
            Err(e) => Progress::Failed {
                stage: n.clone(),
                error: Arc::clone(e),
            },
        });
        result
    })
}

/// Records a stage's end as a panic when its stream thread unwinds.
struct MarkPanic(Arc<StageMetrics>);

impl Drop for MarkPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.end(StageEnd::Panicked);
        }
    }
}

/// A stage's stream thread: it returns the stage's error shared (`Arc`), the same error its
/// [`Progress::Failed`] carried.
type StageThread = JoinHandle<Result<(), Arc<Error>>>;

/// A stage running on its stream threads.
#[derive(Debug)]
struct RunningStage {
    name: String,
    /// Its stream threads, by index.
    threads: Vec<StageThread>,
    /// Their counters, by index.
    metrics: StageThreads,
}

impl RunningStage {
    /// Whether a stream thread of the stage has ended.
    fn any_finished(&self) -> bool {
        self.threads.iter().any(JoinHandle::is_finished)
    }
}

/// Stages running on their stream threads.
#[derive(Debug)]
pub struct Running {
    stages: Vec<RunningStage>,
    shutdown: Shutdown,
    progress: Receiver<Progress>,
    /// The runtime that started the stages (topology and configuration).
    pub(crate) runtime: Runtime,
    /// The metrics endpoint, when one was asked for.
    endpoint: Option<Endpoint>,
}

impl Running {
    /// The next progress event, waiting at most `timeout`; `None` on timeout.
    pub fn next_progress(&self, timeout: Duration) -> Option<Progress> {
        self.progress.recv_timeout(timeout).ok()
    }

    /// Current counters of every stage (with several stream threads per stage, each counter
    /// summed over them).
    pub fn metrics(&self) -> Vec<(String, MetricsSnapshot)> {
        self.stages
            .iter()
            .map(|s| (s.name.clone(), s.metrics.snapshot()))
            .collect()
    }

    /// Current counters of every stream thread of every stage, by stage, then by thread index
    /// ([`RuntimeConfig::stream_threads`]): what [`Running::metrics`] adds up.
    pub fn thread_metrics(&self) -> Vec<(String, Vec<MetricsSnapshot>)> {
        self.stages
            .iter()
            .map(|s| {
                let threads = s.metrics.threads().iter().map(|m| m.snapshot()).collect();
                (s.name.clone(), threads)
            })
            .collect()
    }

    /// The tasks each stream thread of every stage owns (those restoring included), by stage,
    /// then by thread index: how the group spread the stage's tasks over this process's threads.
    pub fn thread_tasks(&self) -> Vec<(String, Vec<Vec<i32>>)> {
        self.stages
            .iter()
            .map(|s| {
                let threads = s
                    .metrics
                    .threads()
                    .iter()
                    .map(|m| m.tasks().iter().map(|t| t.partition).collect())
                    .collect();
                (s.name.clone(), threads)
            })
            .collect()
    }

    /// Current counters of every task of every stage this instance owns (tasks restoring
    /// included), by stage.
    pub fn task_metrics(&self) -> Vec<(String, Vec<TaskMetrics>)> {
        self.stages
            .iter()
            .map(|s| (s.name.clone(), s.metrics.tasks()))
            .collect()
    }

    /// The state's memory of the whole process against its bound
    /// ([`RuntimeConfig::state_memory_bytes`](crate::RuntimeConfig::state_memory_bytes)): use
    /// per holder, the peak, and the pauses and spills the bound caused; `None` without a
    /// bound. Each stage's part is in its [`MetricsSnapshot`] (`state_memory`).
    pub fn state_memory(&self) -> Option<crate::MemoryUse> {
        self.runtime
            .config
            .state_memory
            .as_ref()
            .map(|b| b.snapshot())
    }

    /// The standbys of every stage, by stage: the warm copies of tasks this instance does not
    /// own ([`RuntimeConfig::standby_replicas`](crate::RuntimeConfig::standby_replicas)), each
    /// with its changelog position and lag ([`StandbyMetrics`](crate::StandbyMetrics)), as
    /// last published (at most every 200 ms): the lags of the copies a stale read
    /// ([`ReadOnlyStore::stale_ok`](crate::ReadOnlyStore::stale_ok)) may answer from.
    pub fn standby_metrics(&self) -> Vec<(String, Vec<crate::StandbyMetrics>)> {
        self.stages
            .iter()
            .map(|s| (s.name.clone(), s.metrics.standbys()))
            .collect()
    }

    /// The per-key violation counter of every event-time stage, by stage: each key of a task
    /// this instance owns that had late records, with its count ([`LateKey`]).
    pub fn late_by_key(&self) -> Vec<(String, Vec<LateKey>)> {
        self.stages
            .iter()
            .map(|s| (s.name.clone(), s.metrics.late_by_key()))
            .collect()
    }

    /// Why each stage waits: per stage and per task, every record its gate holds back and the
    /// exact evidence it waits for, the channels paused by backpressure, the event-time
    /// watermark and the input that holds it down, and a restore held by an open transaction
    /// ([`Explanation`]; the endpoint serves the same as JSON at `/explain`).
    ///
    /// Each stream thread takes its snapshot between two turns, when asked: the call asks every
    /// stage at once and waits for their snapshots, at most [`ANSWER_WITHIN`] in all (a turn
    /// polls for at most 100 ms; a commit or a restore can keep a stream thread longer). A stage
    /// that did not answer in time, or that has ended, is explained by its last snapshot,
    /// marked [`StageExplanation::fresh`] `false` with the time it was taken. Nothing is
    /// locked per record: a stream thread nobody asks pays one atomic load per turn.
    ///
    /// [`ANSWER_WITHIN`]: crate::ANSWER_WITHIN
    /// [`StageExplanation::fresh`]: crate::StageExplanation::fresh
    pub fn explain(&self) -> Explanation {
        crate::threads::merge_threads(parsley_task::metrics::explain_stages(
            self.stages.iter().flat_map(|s| {
                s.threads
                    .iter()
                    .zip(s.metrics.threads())
                    .map(|(thread, metrics)| {
                        (s.name.as_str(), metrics.as_ref(), thread.is_finished())
                    })
            }),
        ))
    }

    /// Waits until every stage of these has consumed and committed everything written to its
    /// sources before the wait: its consumer group's committed offsets reach the end of every
    /// source partition (a built-in clock's topic aside: the stage's own ticks are always
    /// ahead), read now, stage after stage in topology order (so a stage reading another's
    /// output is checked after that one is). The end is the last stable offset, or the high
    /// watermark for a topic another stage writes: the last transaction of a stage found
    /// caught up may not have its commit marker in every partition yet, and its records are
    /// waited for all the same. For a batch run — inputs
    /// written, pipeline started, results read once it is done — and for tests.
    ///
    /// Evidence is re-read whenever a commit is reported, and at least every 100 ms. Progress
    /// events that arrive meanwhile are read and dropped. Records written to a source during
    /// the wait may or may not be waited for.
    ///
    /// # Errors
    /// [`Error::StageFailed`] when a stage fails meanwhile (its own error as `source`);
    /// [`KafkaError::Timeout`] when the stages are not caught up within `timeout`; admin and client
    /// errors reading the offsets.
    pub fn wait_until_caught_up(&self, timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        let app = self.runtime.topology.application_id();
        let config = &self.runtime.config;
        let admin = crate::admin::Admin::from_config(
            &config.client_config(&format!("{app}.progress"), crate::ClientRole::Admin, &[]),
            config.timeout,
        )?;
        let mut stages = self
            .runtime
            .topology
            .stages()
            .iter()
            .filter(|s| self.stages.iter().any(|r| r.name == s.name()))
            .map(|s| {
                crate::caught_up::StageProgress::new(app, s, self.runtime.topology.stages(), config)
            })
            .collect::<Result<Vec<_>>>()?;
        // Stages are checked in topology order, upstream first: one pass in which each is
        // caught up proves the whole topology is, unless a stage writes a source of a stage
        // checked before it (a foreign-key join's answers), which can have moved since its
        // check. Then a second pass must find the same targets: nothing moved in between.
        let feeds_back = feeds_back(&self.runtime.topology);
        let mut last_pass: Option<Vec<Vec<(String, i32, i64)>>> = None;
        loop {
            let mut pass = Vec::new();
            for stage in &mut stages {
                match stage.caught_up(&admin, config.timeout)? {
                    Some(targets) => pass.push(targets),
                    None => break,
                }
            }
            if pass.len() == stages.len() {
                if !feeds_back || last_pass.as_ref() == Some(&pass) {
                    return Ok(());
                }
                last_pass = Some(pass);
                continue;
            }
            last_pass = None;
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(Error::Kafka(KafkaError::Timeout {
                    what: parsley_task::error::Awaited::CaughtUp,
                    timeout,
                }));
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            if let Ok(Progress::Failed { stage, error }) = self.progress.recv_timeout(wait) {
                return Err(Error::StageFailed {
                    stage,
                    source: error,
                });
            }
        }
    }

    /// A read-only view of store `name` — a store a stage running here declares (the DSL's
    /// source tables and aggregations, named after their operators) — typed `K` → `V`
    /// (Kafka Streams' `KafkaStreams.store`): [`ReadOnlyStore::get`], [`ReadOnlyStore::range`]
    /// and [`ReadOnlyStore::all`] over the tasks this instance runs, answered by the stage's
    /// stream thread between two turns, and [`ReadOnlyStore::get_at_least`], which waits for
    /// a causal stamp (module [`query`](crate::query)); [`ReadOnlyStore::stale_ok`] reads this
    /// instance's standbys too, each value marked with its source and lag.
    ///
    /// # Errors
    /// [`QueryError::UnknownStore`] when no stage running here declares `name`;
    /// [`QueryError::WrongTypes`] when its keys are not `K` or its values not `V`.
    ///
    /// [`ReadOnlyStore::get`]: crate::ReadOnlyStore::get
    /// [`ReadOnlyStore::range`]: crate::ReadOnlyStore::range
    /// [`ReadOnlyStore::all`]: crate::ReadOnlyStore::all
    /// [`ReadOnlyStore::get_at_least`]: crate::ReadOnlyStore::get_at_least
    /// [`ReadOnlyStore::stale_ok`]: crate::ReadOnlyStore::stale_ok
    /// [`QueryError::UnknownStore`]: crate::QueryError::UnknownStore
    /// [`QueryError::WrongTypes`]: crate::QueryError::WrongTypes
    pub fn store<K: 'static, V: 'static>(
        &self,
        name: &str,
    ) -> std::result::Result<crate::ReadOnlyStore<K, V>, crate::QueryError> {
        let topology = &self.runtime.topology;
        crate::query::open(
            name,
            self.stages
                .iter()
                .filter_map(|s| topology.stage(&s.name).map(|spec| (spec, &s.metrics))),
        )
    }

    /// The instance that owns the task of `key` in store `name` (Kafka Streams'
    /// `queryMetadataForKey`): the task the stage's partitioner gives the key's bytes (the
    /// store's key codec), and the instance id and
    /// [application endpoint](RuntimeConfig::application_endpoint) of the group member that
    /// holds it — this instance when it runs the task and advertises an endpoint, else as the
    /// group coordinator listed the members at the stream thread's last look (every 2 s).
    /// Members that advertise no endpoint are never named.
    ///
    /// # Errors
    /// [`QueryError::UnknownStore`]; [`QueryError::WrongTypes`] when the store's keys are not
    /// `K`; [`QueryError::OwnerUnknown`] when no advertising member held the task at the last
    /// look (the group rebalanced, or the owner advertises nothing); [`QueryError::Key`],
    /// [`QueryError::Unpartitioned`], [`QueryError::StageEnded`], [`QueryError::NoAnswer`].
    ///
    /// [`QueryError::UnknownStore`]: crate::QueryError::UnknownStore
    /// [`QueryError::WrongTypes`]: crate::QueryError::WrongTypes
    /// [`QueryError::OwnerUnknown`]: crate::QueryError::OwnerUnknown
    /// [`QueryError::Key`]: crate::QueryError::Key
    /// [`QueryError::Unpartitioned`]: crate::QueryError::Unpartitioned
    /// [`QueryError::StageEnded`]: crate::QueryError::StageEnded
    /// [`QueryError::NoAnswer`]: crate::QueryError::NoAnswer
    pub fn key_owner<K: 'static>(
        &self,
        name: &str,
        key: &K,
    ) -> std::result::Result<crate::KeyOwner, crate::QueryError> {
        let topology = &self.runtime.topology;
        let config = &self.runtime.config;
        crate::query::key_owner(
            name,
            key,
            self.stages
                .iter()
                .filter_map(|s| topology.stage(&s.name).map(|spec| (spec, &s.metrics))),
            (&config.instance_id, config.application_endpoint.as_deref()),
        )
    }

    /// The address of the metrics endpoint of these stages
    /// ([`RuntimeConfig::metrics_address`]; with port 0, the port picked); `None` when none was
    /// asked for. It serves until [`Running::stop`] returns, or until the `Running` is dropped.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.endpoint.as_ref().map(Endpoint::address)
    }

    /// The shutdown signal of these stages.
    pub fn shutdown_signal(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Waits until SIGINT or SIGTERM arrives, then stops every stage cleanly
    /// ([`Running::stop`]: each commits first) and returns their final counters. The wait
    /// also ends when a stage ends on its own — it failed, or its stream thread panicked: the
    /// other stages are stopped and the error returned — and when the
    /// [shutdown signal](Running::shutdown_signal) is triggered from another thread (another
    /// reason to stop, such as a closed input: the stages are stopped as on a signal). Progress
    /// events that arrive meanwhile are read and dropped.
    ///
    /// ```no_run
    /// use parsley_runtime::{Runtime, RuntimeConfig};
    /// # fn topology() -> parsley_stage::Topology { unimplemented!() }
    /// let running = Runtime::new(topology(), RuntimeConfig::new("127.0.0.1:9092")).start()?;
    /// // Stop when standard input closes, too.
    /// let shutdown = running.shutdown_signal().clone();
    /// std::thread::spawn(move || {
    ///     let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    ///     shutdown.trigger();
    /// });
    /// running.wait_for_signal()?;
    /// # Ok::<(), parsley_runtime::Error>(())
    /// ```
    ///
    /// # SIGINT and SIGTERM
    /// Nothing is installed before the call (not at library load, not at [`Runtime::start`]).
    /// The call installs `signal-hook`'s process-wide handler for both signals, even where the
    /// disposition was to ignore them; a handler the program had installed before is chained
    /// and still runs first. Then:
    /// - while the call runs, the first SIGINT or SIGTERM asks for the clean stop, and another
    ///   one arriving after it (a stop that hangs) runs the signal's default action: the
    ///   process terminates at once;
    /// - when the call returns, its actions are removed, but `signal-hook` cannot uninstall its
    ///   handler: from then on SIGINT and SIGTERM do nothing unless the program handles them
    ///   itself — with `signal-hook` (its actions run), or with `sigaction`, which replaces the
    ///   handler. A program that ends after the call is not concerned; one that goes on should
    ///   install its own handling, or call this again.
    ///
    /// # Errors
    /// - [`SetupError::Signals`] when the handlers cannot be installed (the stages are stopped);
    /// - [`Error::StageFailed`] for the stage whose [`Progress::Failed`] ended the wait: its
    ///   own typed error as `source` (see [`Running::stop`]); the other stages were stopped;
    /// - whatever [`Running::stop`] returns otherwise: a stage that failed or panicked while
    ///   the wait ended or during the stop.
    pub fn wait_for_signal(self) -> Result<Vec<(String, MetricsSnapshot)>> {
        let watch = match SignalWatch::install() {
            Ok(watch) => watch,
            Err(e) => {
                // Stopping is the caller's only way out now: do it, report why.
                let _ = self.stop();
                return Err(e);
            }
        };
        self.wait_then_stop(&watch)
    }

    /// Waits as [`Running::wait_for_signal`] describes, with `watch` for the signals, then
    /// stops every stage (`watch` stays installed through the stop).
    pub(crate) fn wait_then_stop(
        self,
        watch: &SignalWatch,
    ) -> Result<Vec<(String, MetricsSnapshot)>> {
        let failed = loop {
            if let Some(signal) = watch.arrived() {
                tracing::info!(signal, "stopping every stage on a signal");
                break None;
            }
            if self.shutdown.is_triggered() {
                break None;
            }
            if self.stages.iter().any(RunningStage::any_finished) {
                // Ended without being asked: failed (its event may be queued) or panicked.
                break self.progress.try_iter().find_map(failure);
            }
            match self.progress.recv_timeout(SIGNAL_POLL) {
                Ok(event) => {
                    if let Some(failed) = failure(event) {
                        break Some(failed);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                // Every stream thread has ended (or there were none).
                Err(RecvTimeoutError::Disconnected) => break None,
            }
        };
        if let Some((stage, error)) = &failed {
            tracing::warn!(stage, %error, "a stage failed: stopping the others");
        }
        let stopped = self.stop();
        match failed {
            Some((stage, source)) => Err(Error::StageFailed { stage, source }),
            None => stopped,
        }
    }

    /// Stops every stage (each commits first) and returns their final counters; then closes
    /// the metrics endpoint, if any (its readiness says `stopping` meanwhile).
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
    /// - [`ProcessingError::StagePanicked`] for a stage whose stream thread panicked.
    ///
    /// ```no_run
    /// # use parsley_runtime::{Error, Running};
    /// # use parsley_runtime::{KafkaError, RecordError};
    /// # fn running() -> Running { unimplemented!() }
    /// match running().stop() {
    ///     Ok(stages) => println!("{} stages stopped", stages.len()),
    ///     Err(e) => match e.stage_error() {
    ///         Error::Record(RecordError::RecordsLost { topic, from, log_start, .. }) => {
    ///             eprintln!("{topic}: records [{from}, {log_start}) were deleted before delivery")
    ///         }
    ///         Error::Kafka(KafkaError::Fenced { .. }) => eprintln!("another process runs with this instance id"),
    ///         _ => eprintln!("{e}"),
    ///     },
    /// }
    /// ```
    pub fn stop(self) -> Result<Vec<(String, MetricsSnapshot)>> {
        self.shutdown.trigger();
        let mut out = Vec::new();
        let mut first_error = None;
        for RunningStage {
            name,
            threads,
            metrics,
        } in self.stages
        {
            for handle in threads {
                match handle.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(source)) => {
                        first_error.get_or_insert(Error::StageFailed {
                            stage: name.clone(),
                            source,
                        });
                    }
                    Err(payload) => {
                        first_error.get_or_insert(Error::Processing(
                            ProcessingError::StagePanicked {
                                stage: name.clone(),
                                message: panic_message(payload.as_ref()),
                            },
                        ));
                    }
                }
            }
            out.push((name, metrics.snapshot()));
        }
        if let Some(mut endpoint) = self.endpoint {
            endpoint.close();
        }
        first_error.map_or(Ok(out), Err)
    }
}

/// The stage and error of a [`Progress::Failed`] event.
fn failure(event: Progress) -> Option<(String, Arc<Error>)> {
    match event {
        Progress::Failed { stage, error } => Some((stage, error)),
        _ => None,
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{Sender, channel};

    use signal_hook::consts::{SIGINT, SIGTERM};

    use super::{Running, StageThread, panic_message};
    use crate::shutdown::Shutdown;
    use crate::signals::SignalWatch;
    use parsley_task::error::Error;
    use parsley_task::error::{ProcessingError, RecordError};
    use parsley_task::metrics::Progress;

    /// How a fake stage's stream thread ends.
    enum Fake {
        /// Runs until the shutdown signal, then stops cleanly.
        UntilShutdown,
        /// Fails at once, as a stage does: a `Progress::Failed`, then the error.
        Fails,
        /// Panics at once (no event).
        Panics,
    }

    /// Stages on fake stream threads (no Kafka), started as `start_stages` starts them; each
    /// flag says that stage saw the shutdown signal.
    fn running(stages: &[(&str, Fake)]) -> (Running, Vec<Arc<AtomicBool>>) {
        let shutdown = Shutdown::new();
        let (tx, rx) = channel();
        let mut threads = Vec::new();
        let mut stopped = Vec::new();
        for (name, how) in stages {
            let (name, sd, tx): (String, Shutdown, Sender<Progress>) =
                (name.to_string(), shutdown.clone(), tx.clone());
            let saw = Arc::new(AtomicBool::new(false));
            stopped.push(saw.clone());
            let thread: StageThread = match how {
                Fake::UntilShutdown => {
                    let stage = name.clone();
                    std::thread::spawn(move || {
                        while !sd.is_triggered() {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        saw.store(true, Ordering::SeqCst);
                        let _ = tx.send(Progress::Stopped { stage });
                        Ok(())
                    })
                }
                Fake::Fails => {
                    let stage = name.clone();
                    std::thread::spawn(move || {
                        let error = Arc::new(Error::Record(RecordError::RecordsLost {
                            topic: "in".into(),
                            partition: 2,
                            from: 5,
                            log_start: 50,
                        }));
                        let _ = tx.send(Progress::Failed {
                            stage,
                            error: error.clone(),
                        });
                        Err(error)
                    })
                }
                Fake::Panics => std::thread::spawn(move || {
                    let _keep = tx;
                    panic!("boom")
                }),
            };
            threads.push(super::RunningStage {
                name,
                threads: vec![thread],
                metrics: crate::threads::StageThreads::new(1),
            });
        }
        let running = Running {
            stages: threads,
            shutdown,
            progress: rx,
            runtime: super::Runtime::new(idle_topology(), crate::RuntimeConfig::new("127.0.0.1:9")),
            endpoint: None,
        };
        (running, stopped)
    }

    /// A one-stage topology the fake stages stand for (never run).
    fn idle_topology() -> parsley_stage::Topology {
        struct Idle;
        impl parsley_stage::Handler for Idle {
            type Key = String;
            type Value = String;
            type Output = String;
            type State = ();
            fn handle(
                &self,
                _: parsley_stage::Record<'_, String, String>,
                _: Option<()>,
            ) -> parsley_stage::HandlerResult<String, String, ()> {
                Ok(parsley_stage::Step::none())
            }
        }
        parsley_stage::Topology::builder("app")
            .stage("idle", Idle, |s| s.source("in"))
            .build()
            .expect("a valid topology")
    }

    #[test]
    fn a_signal_ends_the_wait_and_every_stage_stops_cleanly() {
        let (running, stopped) = running(&[("a", Fake::UntilShutdown), ("b", Fake::UntilShutdown)]);
        let watch = SignalWatch::unregistered();
        watch.set(SIGTERM);
        assert_eq!(watch.arrived(), Some("SIGTERM"));
        let stages = running.wait_then_stop(&watch).unwrap();
        let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(stopped.iter().all(|s| s.load(Ordering::SeqCst)));
    }

    /// The one test that installs real handlers and raises a real signal in this process (the
    /// handlers stay installed, with no action, for the rest of the test binary).
    #[test]
    fn a_raised_sigint_reaches_an_installed_watch_and_ends_the_wait() {
        let (running, stopped) = running(&[("a", Fake::UntilShutdown)]);
        let watch = SignalWatch::install().unwrap();
        assert_eq!(watch.arrived(), None);
        signal_hook::low_level::raise(SIGINT).unwrap();
        assert_eq!(watch.arrived(), Some("SIGINT"));
        let stages = running.wait_then_stop(&watch).unwrap();
        assert_eq!(stages.len(), 1);
        assert!(stopped[0].load(Ordering::SeqCst));
        drop(watch);
    }

    #[test]
    fn a_failed_stage_ends_the_wait_the_others_stop_and_its_error_is_returned() {
        let (running, stopped) = running(&[("a", Fake::UntilShutdown), ("b", Fake::Fails)]);
        let e = running
            .wait_then_stop(&SignalWatch::unregistered())
            .unwrap_err();
        match &e {
            Error::StageFailed { stage, source } => {
                assert_eq!(stage, "b");
                assert!(
                    matches!(
                        **source,
                        Error::Record(RecordError::RecordsLost { partition: 2, .. })
                    ),
                    "{e}"
                );
            }
            other => panic!("not the stage's failure: {other}"),
        }
        assert!(stopped[0].load(Ordering::SeqCst), "a was stopped");
    }

    #[test]
    fn a_panicked_stage_ends_the_wait_and_the_others_stop() {
        let (running, stopped) = running(&[("a", Fake::UntilShutdown), ("b", Fake::Panics)]);
        let e = running
            .wait_then_stop(&SignalWatch::unregistered())
            .unwrap_err();
        assert!(
            matches!(&e, Error::Processing(ProcessingError::StagePanicked { stage, message: Some(m) }) if stage == "b" && m == "boom"),
            "{e}"
        );
        assert!(stopped[0].load(Ordering::SeqCst), "a was stopped");
    }

    #[test]
    fn a_shutdown_triggered_elsewhere_ends_the_wait() {
        let (running, stopped) = running(&[("a", Fake::UntilShutdown)]);
        let shutdown = running.shutdown_signal().clone();
        let trigger = std::thread::spawn(move || shutdown.trigger());
        let stages = running
            .wait_then_stop(&SignalWatch::unregistered())
            .unwrap();
        trigger.join().unwrap();
        assert_eq!(stages.len(), 1);
        assert!(stopped[0].load(Ordering::SeqCst));
    }

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

/// Whether a stage of `topology` writes a source of itself or of a stage that comes before it;
/// a built-in clock's topic, which its stage writes and reads, aside (it is no input to catch
/// up with).
fn feeds_back(topology: &Topology) -> bool {
    let specs = topology.stages();
    specs.iter().enumerate().any(|(i, earlier)| {
        specs[i..].iter().any(|later| {
            later
                .sinks()
                .iter()
                .any(|t| earlier.sources().contains(t) && Some(t.as_str()) != earlier.clock_topic())
        })
    })
}

#[cfg(test)]
mod feeds_back_tests {
    use parsley_stage::{EventTimeOrder, Handler, HandlerResult, Record, Step, Topology};

    use super::feeds_back;

    struct Echo;

    impl Handler for Echo {
        type Key = Vec<u8>;
        type Value = Vec<u8>;
        type Output = Vec<u8>;
        type State = ();

        fn handle(
            &self,
            _: Record<'_, Vec<u8>, Vec<u8>>,
            _: Option<()>,
        ) -> HandlerResult<Vec<u8>, Vec<u8>, ()> {
            Ok(Step::none())
        }
    }

    #[test]
    fn only_a_stage_writing_a_source_checked_before_it_feeds_back() {
        let line = Topology::builder("app")
            .stage("a", Echo, |s| s.source("in").sink("mid"))
            .stage("b", Echo, |s| s.source("mid").sink("out"))
            .build()
            .unwrap();
        assert!(!feeds_back(&line));
        // A foreign-key join's shape: the second stage answers the first.
        let cycle = Topology::builder("app")
            .stage("left", Echo, |s| {
                s.source("in").source("answers").sink("asks")
            })
            .stage("right", Echo, |s| {
                s.source("other").source("asks").sink("answers")
            })
            .build()
            .unwrap();
        assert!(feeds_back(&cycle));
        // A built-in clock's topic is written and read by its own stage: no feedback.
        let clocked = Topology::builder("app")
            .stage("w", Echo, |s| {
                s.source("in")
                    .sink("out")
                    .order_by_event_time(EventTimeOrder::new().clock(1_000))
            })
            .build()
            .unwrap();
        assert!(clocked.stages()[0].clock_topic().is_some());
        assert!(!feeds_back(&clocked));
    }
}
