//! "Replay equals live": runs a pipeline live while its input is written, then replays the
//! same input under fresh application ids with randomized fetch sizes, and compares every
//! output key's sequence of values byte for byte.
//!
//! A pipeline whose outputs depend only on its input — on the records and the order Kafka's
//! offsets and the records' stamps and timestamps give them — must produce, per key, the same
//! values in the same order however the history is fetched. Stream processors that decide
//! order from arrival (which partition a fetch returned first, how long a partition was idle)
//! produce another order on replay, and windows or joins then hold other state.
//!
//! [`ReplayCheck::run`]:
//! 1. **Live run.** Creates the run's output topics, starts the topology of application
//!    `{prefix}-live` (its outputs `{prefix}-live-{output}`), calls the feed, which writes the
//!    input while the pipeline runs, and waits until the pipeline has settled (below); stops
//!    it and reads every output topic `read_committed` to its end offsets.
//! 2. **Replays** `1..=N`: the same for application `{prefix}-replay-{i}`, which reads the
//!    input topics from offset 0, its stages' consumers fetching with [`FetchSizes`] drawn
//!    from the check's seed.
//! 3. **Comparison** of each replay's per-key sequences with the live run's
//!    ([`sequences::compare`]): the first difference (output, key, index, both values) and how
//!    many keys differ.
//!
//! **Settled** means: [`Running::wait_until_caught_up`] returned (every stage's group has
//! committed the last stable offset of every source partition), and before and after that
//! wait every stage had handed every delivered record to its handler and committed it,
//! emitted and committed the same records, fired the same timers, and had no record parked in
//! an event-time queue. A record parked for event-time order has its offset committed with the
//! queue, so caught up alone does not mean its output has been written; the built-in clock
//! releases it after its lag.
//!
//! A run's stage metrics give its late records: `late` (released below the watermark of an
//! event-time stage, out of event-time order) and `too_late` (after every window it belonged
//! to had closed). A live run with late records cannot be expected to equal its replay: the
//! order the live run gave those records came from when they arrived.

mod fetch;
pub mod sequences;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parsley_runtime::rdkafka::consumer::{BaseConsumer, Consumer};
use parsley_runtime::rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use parsley_runtime::{
    Admin, ClientRole, MetricsSnapshot, Progress, Running, Runtime, RuntimeConfig, TopicSpec,
};
use parsley_stage::Topology;
use rand::SeedableRng;
use rand::rngs::StdRng;

pub use fetch::FetchSizes;
pub use sequences::{Comparison, Difference, Entry, Found, OutputRecord, Sequences};

/// What a feed or a topology builder may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why the check could not finish (a difference is not an error: see [`ReplayReport`]).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The topology of a run could not be built.
    #[error("building the topology of the {run} run: {source}")]
    Build {
        /// The run (`live`, `replay 3`).
        run: String,
        /// The builder's error.
        source: BoxError,
    },
    /// The feed failed.
    #[error("feeding the live run: {0}")]
    Feed(BoxError),
    /// The runtime failed: a stage, the wait, or an admin call of the check.
    #[error("the {run} run: {source}")]
    Runtime {
        /// The run.
        run: String,
        /// The runtime's error.
        source: Box<parsley_runtime::Error>,
    },
    /// A run did not settle in time.
    #[error("the {run} run did not settle within {timeout:?}; stages: {metrics}")]
    Timeout {
        /// The run.
        run: String,
        /// The check's timeout per run.
        timeout: Duration,
        /// The stages' counters at the deadline.
        metrics: String,
    },
    /// An output topic could not be read back.
    #[error("reading {topic}: {reason}")]
    Read {
        /// The topic.
        topic: String,
        /// What went wrong.
        reason: String,
    },
}

/// One run of the check: its names, what it produced, and how it compares with the live run.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// `live`, or `replay {i}` (from 1).
    pub name: String,
    /// The run's application id.
    pub application_id: String,
    /// The run's output topics, in the order of the check's output names.
    pub topics: Vec<String>,
    /// The fetch sizes of a replay's consumers; `None` for the live run (librdkafka's and the
    /// runtime's defaults).
    pub fetch: Option<FetchSizes>,
    /// Output records, over all outputs.
    pub records: usize,
    /// Distinct keys, over all outputs.
    pub keys: usize,
    /// Records released below an event-time stage's watermark, summed over the stages
    /// ([`MetricsSnapshot::late`]).
    pub late: u64,
    /// Records found too late for every window they belonged to ([`MetricsSnapshot::too_late`]).
    pub too_late: u64,
    /// Records an event-time stage parked above their own event time, behind a parked causal
    /// ancestor with a later one ([`MetricsSnapshot::raised`]): they leave out of event-time
    /// order, never before their cause.
    pub raised: u64,
    /// From the start of the runtime to the outputs read back (the live run's includes the
    /// feed).
    pub elapsed: Duration,
    /// A replay's comparison with the live run (empty for the live run itself).
    pub comparison: Comparison,
}

/// The check's result: the live run and every replay.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// The live run.
    pub live: RunReport,
    /// The replays, in order.
    pub replays: Vec<RunReport>,
}

impl ReplayReport {
    /// Whether every replay's outputs equal the live run's, key by key.
    pub fn identical(&self) -> bool {
        self.replays.iter().all(|r| r.comparison.first.is_none())
    }

    /// The first replay that differs, and its first difference.
    pub fn first_difference(&self) -> Option<(&RunReport, &Difference)> {
        self.replays
            .iter()
            .find_map(|r| r.comparison.first.as_ref().map(|d| (r, d)))
    }

    /// Runs, the live one included.
    pub fn runs(&self) -> usize {
        1 + self.replays.len()
    }
}

/// What [`ReplayCheck::on_run`] calls with each run's report.
type OnRun<'a> = Box<dyn FnMut(&RunReport) + 'a>;

/// The replay check of one pipeline (module docs).
pub struct ReplayCheck<'a> {
    config: RuntimeConfig,
    inputs: Vec<String>,
    outputs: Vec<String>,
    output_partitions: Option<i32>,
    replays: usize,
    seed: u64,
    prefix: String,
    timeout: Duration,
    on_run: Option<OnRun<'a>>,
}

impl<'a> ReplayCheck<'a> {
    /// A check of a pipeline reading `inputs`, run with `config` (its bootstrap, security and
    /// other client settings; the replays add their fetch sizes to it). Defaults: one output
    /// named `out`, 10 replays, seed 1, a prefix unique to this call (`replay-{random}`), 300 s
    /// per run, output topics with as many partitions as the first input.
    pub fn new<S: Into<String>>(
        config: RuntimeConfig,
        inputs: impl IntoIterator<Item = S>,
    ) -> Self {
        ReplayCheck {
            config,
            inputs: inputs.into_iter().map(Into::into).collect(),
            outputs: vec!["out".into()],
            output_partitions: None,
            replays: 10,
            seed: 1,
            prefix: crate::fixtures::unique_topic("replay"),
            timeout: Duration::from_secs(300),
            on_run: None,
        }
    }

    /// The pipeline's outputs, by name: each run writes output `name` to topic
    /// `{prefix}-{run}-{name}`, and the builder gets the run's topics in this order.
    pub fn outputs<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.outputs = names.into_iter().map(Into::into).collect();
        self
    }

    /// The partitions of every output topic the check creates.
    pub fn output_partitions(mut self, partitions: i32) -> Self {
        self.output_partitions = Some(partitions);
        self
    }

    /// How many replays.
    pub fn replays(mut self, n: usize) -> Self {
        self.replays = n;
        self
    }

    /// The seed of the replays' fetch sizes: the same seed draws the same sizes.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The prefix of the runs' application ids and output topics.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one run may take to settle (a safety net, not a synchronisation point).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Called with each run's report as soon as it is done (the live run, then each replay).
    pub fn on_run(mut self, f: impl FnMut(&RunReport) + 'a) -> Self {
        self.on_run = Some(Box::new(f));
        self
    }

    /// Runs the check: the live run with `feed` writing the input while the pipeline runs,
    /// then the replays (module docs). `build(application_id, output_topics)` gives a run's
    /// topology.
    ///
    /// # Errors
    /// A topology that does not build, a feed or a stage that fails, a run that does not
    /// settle within the timeout, outputs that cannot be read. Outputs that differ are not
    /// an error: [`ReplayReport::identical`].
    pub fn run<E: Into<BoxError>>(
        mut self,
        build: impl Fn(&str, &[String]) -> Result<Topology, E>,
        feed: impl FnOnce() -> Result<(), BoxError>,
    ) -> Result<ReplayReport, ReplayError> {
        let admin = Admin::connect(
            &self.config.bootstrap,
            &self.config.clients,
            self.config.timeout,
        )
        .map_err(|e| self.runtime_error("live", e))?;
        let partitions = match self.output_partitions {
            Some(p) => p,
            None => {
                let first = self.inputs.first().map(String::as_str).unwrap_or_default();
                admin
                    .describe_topics(&[first])
                    .map_err(|e| self.runtime_error("live", e))?[0]
                    .partitions
            }
        };
        let (live, live_outputs) =
            self.one_run(&admin, partitions, "live", None, &build, Some(feed))?;
        self.report(&live);
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut replays = Vec::new();
        for i in 1..=self.replays {
            let sizes = FetchSizes::random(&mut rng);
            let name = format!("replay-{i}");
            let (mut run, outputs) = self.one_run(
                &admin,
                partitions,
                &name,
                Some(sizes),
                &build,
                None::<fn() -> _>,
            )?;
            run.name = format!("replay {i}");
            run.comparison = sequences::compare(&live_outputs, &outputs);
            self.report(&run);
            replays.push(run);
        }
        Ok(ReplayReport { live, replays })
    }

    fn report(&mut self, run: &RunReport) {
        if let Some(f) = self.on_run.as_mut() {
            f(run);
        }
    }

    fn runtime_error(&self, run: &str, source: parsley_runtime::Error) -> ReplayError {
        ReplayError::Runtime {
            run: run.to_string(),
            source: Box::new(source),
        }
    }

    /// One run named `name` (`live`, `replay-3`): its report and its outputs by name.
    fn one_run<E: Into<BoxError>>(
        &self,
        admin: &Admin,
        partitions: i32,
        name: &str,
        fetch: Option<FetchSizes>,
        build: &impl Fn(&str, &[String]) -> Result<Topology, E>,
        feed: Option<impl FnOnce() -> Result<(), BoxError>>,
    ) -> Result<(RunReport, BTreeMap<String, Sequences>), ReplayError> {
        let app = format!("{}-{name}", self.prefix);
        let topics: Vec<String> = self.outputs.iter().map(|o| format!("{app}-{o}")).collect();
        let specs: Vec<TopicSpec> = topics
            .iter()
            .map(|t| TopicSpec::new(t.clone(), partitions))
            .collect();
        admin
            .create_topics(&specs)
            .map_err(|e| self.runtime_error(name, e))?;
        let topology = build(&app, &topics).map_err(|e| ReplayError::Build {
            run: name.to_string(),
            source: e.into(),
        })?;
        let mut config = self.config.clone();
        for (k, v) in fetch.iter().flat_map(FetchSizes::properties) {
            config = config.consumer_property(k, v);
        }
        let started = Instant::now();
        let running = Runtime::new(topology, config)
            .start()
            .map_err(|e| self.runtime_error(name, e))?;
        let fed = feed.map_or(Ok(()), |f| f().map_err(ReplayError::Feed));
        let settled = fed.and_then(|()| self.settle(&running, name));
        let stopped = running.stop().map_err(|e| self.runtime_error(name, e));
        settled?;
        let stages = stopped?;
        let mut outputs = BTreeMap::new();
        let mut records = 0;
        let mut keys = 0;
        for (output, topic) in self.outputs.iter().zip(&topics) {
            let read = read_to_end(&self.config, admin, topic)?;
            records += read.len();
            let seq = sequences::sequences(&read);
            keys += seq.len();
            outputs.insert(output.clone(), seq);
        }
        let report = RunReport {
            name: name.to_string(),
            application_id: app,
            topics,
            fetch,
            records,
            keys,
            late: stages.iter().map(|(_, m)| m.late).sum(),
            too_late: stages.iter().map(|(_, m)| m.too_late).sum(),
            raised: stages.iter().map(|(_, m)| m.raised).sum(),
            elapsed: started.elapsed(),
            comparison: Comparison::default(),
        };
        Ok((report, outputs))
    }

    /// Waits until `running` has settled (module docs).
    fn settle(&self, running: &Running, run: &str) -> Result<(), ReplayError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let before = running.metrics();
            let left = deadline.saturating_duration_since(Instant::now());
            running
                .wait_until_caught_up(left)
                .map_err(|e| self.runtime_error(run, e))?;
            let after = running.metrics();
            if quiet(&before) && quiet(&after) && activity(&before) == activity(&after) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ReplayError::Timeout {
                    run: run.to_string(),
                    timeout: self.timeout,
                    metrics: format!("{after:?}"),
                });
            }
            // Wake on the next commit, at the latest after 100 ms.
            if let Some(Progress::Failed { stage, error }) =
                running.next_progress(Duration::from_millis(100))
            {
                return Err(self.runtime_error(
                    run,
                    parsley_runtime::Error::StageFailed {
                        stage,
                        source: error,
                    },
                ));
            }
        }
    }
}

/// Whether every stage has committed everything it delivered and emitted and has nothing
/// parked.
fn quiet(stages: &[(String, MetricsSnapshot)]) -> bool {
    stages.iter().all(|(_, m)| {
        m.parked == 0 && m.delivered == m.committed_deliveries && m.emitted == m.committed_emissions
    })
}

/// What changes when a stage does work: deliveries, emissions, timers fired.
fn activity(stages: &[(String, MetricsSnapshot)]) -> Vec<(u64, u64, u64)> {
    stages
        .iter()
        .map(|(_, m)| (m.delivered, m.emitted, m.timers_fired))
        .collect()
}

/// How long reading an output back may take: a safety net, not a decision.
const READ_DEADLINE: Duration = Duration::from_secs(300);

/// Every record of `topic` a `read_committed` consumer sees, up to the last stable offsets
/// read when the call begins; done when the consumer's position on every partition has
/// reached its end (evidence, not silence). The consumer gets `config`'s settings for every
/// client and for consumers (security), not the replays' fetch sizes.
fn read_to_end(
    config: &RuntimeConfig,
    admin: &Admin,
    topic: &str,
) -> Result<Vec<OutputRecord>, ReplayError> {
    let fail = |reason: String| ReplayError::Read {
        topic: topic.to_string(),
        reason,
    };
    let info = admin
        .describe_topics(&[topic])
        .map_err(|e| fail(e.to_string()))?
        .remove(0);
    let partitions: Vec<(&str, i32)> = (0..info.partitions).map(|p| (topic, p)).collect();
    let ends = admin
        .last_stable_offsets(&partitions)
        .map_err(|e| fail(e.to_string()))?;
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.bootstrap);
    for (k, v) in config.clients.for_role(ClientRole::Consumer) {
        cc.set(k, v);
    }
    let consumer: BaseConsumer = cc
        .set("group.id", format!("{topic}.replay-reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|e| fail(format!("creating a reader: {e}")))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..info.partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| fail(e.to_string()))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| fail(format!("assigning: {e}")))?;
    let mut out = Vec::new();
    let started = Instant::now();
    loop {
        let positions = consumer
            .position()
            .map_err(|e| fail(format!("positions: {e}")))?;
        let open: Vec<i32> = (0..info.partitions)
            .filter(|p| {
                let end = ends[*p as usize];
                end > 0
                    && positions
                        .find_partition(topic, *p)
                        .and_then(|e| e.offset().to_raw())
                        .is_none_or(|at| at < end)
            })
            .collect();
        if open.is_empty() {
            return Ok(out);
        }
        if started.elapsed() > READ_DEADLINE {
            return Err(fail(format!(
                "partitions {open:?} not read to their ends {ends:?} within {READ_DEADLINE:?}"
            )));
        }
        while let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.map_err(|e| fail(e.to_string()))?;
            if m.offset() >= ends[m.partition() as usize] {
                continue;
            }
            out.push(OutputRecord {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
            });
        }
    }
}
