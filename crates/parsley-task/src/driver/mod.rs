//! A topology test driver: runs any [`Topology`] in memory, with no broker, through the same
//! tasks the runtime runs — Kafka Streams' `TopologyTestDriver` for Parsley.
//!
//! ```
//! use parsley_task::driver::TopologyTestDriver;
//! use parsley_stage::{Handler, HandlerResult, Record, Step, Topology, Utf8};
//!
//! /// Counts the records of each key.
//! struct Count;
//! impl Handler for Count {
//!     type Key = String;
//!     type Value = String;
//!     type Output = String;
//!     type State = u64;
//!     fn handle(&self, r: Record<'_, String, String>, n: Option<u64>)
//!         -> HandlerResult<String, String, u64> {
//!         let n = n.unwrap_or(0) + 1;
//!         Ok(Step::none().emit("counts", r.key, n.to_string()).set_state(n))
//!     }
//! }
//!
//! let topology = Topology::builder("shop")
//!     .stage("count", Count, |s| {
//!         s.source("orders").sink("counts")
//!             .key_codec(Utf8).value_codec(Utf8).output_codec(Utf8)
//!     })
//!     .build()?;
//! let driver = TopologyTestDriver::builder(topology)
//!     .partitions("orders", 2) // the sink keeps 1: a topic not named has one partition
//!     .build()?;
//! let orders = driver.input_topic("orders", Utf8, Utf8)?;
//! let mut counts = driver.output_topic("counts", Utf8, Utf8)?;
//!
//! orders.pipe("apple".into(), "1 kg".into())?; // runs the topology before it returns
//! orders.pipe("pear".into(), "2 kg".into())?;
//! orders.pipe_at("apple".into(), "3 kg".into(), 1_700_000_000_000)?; // ms since the epoch
//! assert_eq!(
//!     counts.read_key_values(),
//!     [("apple".to_string(), "1".to_string()), ("pear".into(), "1".into()), ("apple".into(), "2".into())]
//! );
//! assert_eq!(driver.state("count", &"apple".to_string(), Utf8, parsley_stage::Json)?, Some(2u64));
//!
//! driver.restart()?; // every task restored from its changelog
//! orders.pipe("apple".into(), "4 kg".into())?;
//! assert_eq!(counts.read_values(), ["3"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it runs
//! Each stage is a set of the runtime's own tasks (the stream thread's `Task`: gate, node
//! clock, fold state, event-time order), one per partition of its sources, built and restored
//! by the runtime's own code. A run ([`TopologyTestDriver::run`]) takes one **turn** per stage
//! at a time, in the topology's order, and goes round until no turn moved anything. A turn is
//! one poll batch of the stream thread with a commit at its end: every visible record not
//! fetched yet is offered to its task's gate (in append order across its channels); the
//! positions and high watermarks the gates ask for are handed over (in memory every end is
//! known: a position is the last stable offset just read up to, a high watermark the end of
//! the partition); impossible stamps go to the stage's policy; what the gates release is
//! delivered, its emissions stamped by the task's clock, appended and acknowledged at once;
//! an event-time task gets its live-head evidence and delivers again; a task of a stage with
//! the built-in clock writes a tick when one is due (below); then every task writes
//! its changelog records into the stage's in-memory changelog and its input offsets become the
//! group's committed offsets. [`TopologyTestDriver::restart`] rebuilds every task from that
//! changelog at those offsets, as an assignment does after a restart.
//!
//! # Invariants
//! - Deterministic: the same topology, pipes and calls give the same deliveries, outputs,
//!   offsets and state. Nothing moves by the wall clock: a record piped without a timestamp
//!   gets the driver's time ([`TopologyTestDriver::time_ms`], moved only by
//!   [`TopologyTestDriver::advance_time`]), a control stream's processing time moves only
//!   with the control records piped, and a built-in clock ticks on the driver's time: a task
//!   writes a tick, stamped with the driver's time, at its first turn and then at the first
//!   turn after the time has moved at least one tick interval since its last tick.
//! - Offsets are `i64`, dense from 0 in every partition; timestamps are ms since the epoch.
//! - A stage's outputs become visible only when its turn commits; a turn that fails leaves no
//!   output, changelog record or committed offset, and its stage stays stopped until it is
//!   restarted.
//! - Topic ids are fake, deterministic UUIDs per topic name; a partition of a keyed record is
//!   murmur2 of its key bytes modulo the partition count, as real writers choose.
//!
//! # What it does not model
//! Rebalances (each stage owns every task, always), broker faults and client errors, commit
//! intervals and commit overlap, backpressure (no channel is paused, spilled or re-fetched),
//! aborted transactions (a producer's transaction can only commit; a stage's failed turn leaves
//! no trace instead of aborted records), transaction markers (offsets are dense), retention and
//! deleted or recreated topics, and size or timestamp limits (no output is refused:
//! [`parsley_stage::BadRecordKind::OutputRefused`] never occurs).

mod log;
mod producer;
mod stage;
mod topics;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parsley_clock::{Coordinate, STAMP_HEADER, TopicId, codec};
use parsley_stage::{BadRecordPolicy, Codec, ImpossiblePolicy, Topology};

pub use self::producer::TestProducer;
pub use self::topics::{InputTopic, OutputTopic, RawInput, RawRecord, TestRecord};

use self::log::{Append, Logs, Stored};
use self::producer::ProducerState;
use self::stage::{StageRun, StageTopics};
use crate::context::GateMode;
use crate::error::SetupError;
use crate::error::{Error, Result};
use crate::metrics::{LateKey, MetricsSnapshot, TaskMetrics};
use crate::topic::TopicInfo;

/// One record of a stage's changelog: the key, and the value (`None`: a tombstone).
pub type ChangelogRecord = (Vec<u8>, Option<Vec<u8>>);

/// The most turns one [`TopologyTestDriver::run`] takes by default before it decides the
/// topology feeds itself forever ([`TopologyTestDriverBuilder::max_turns`]).
pub const DEFAULT_MAX_TURNS: usize = 100_000;

/// Runs a [`Topology`] in memory (module docs). Every method takes `&self`: the handles it
/// gives out ([`InputTopic`], [`OutputTopic`], [`TestProducer`]) borrow it and can be used
/// side by side. Not `Sync`: one test thread drives it.
pub struct TopologyTestDriver {
    inner: RefCell<Inner>,
}

/// Builds a [`TopologyTestDriver`] ([`TopologyTestDriver::builder`]).
#[derive(Debug)]
pub struct TopologyTestDriverBuilder {
    topology: Topology,
    partitions: BTreeMap<String, i32>,
    auto_run: bool,
    time_ms: i64,
    gate: GateMode,
    max_turns: usize,
}

impl TopologyTestDriverBuilder {
    /// Gives `topic` `partitions` partitions (a topic not named has one; an internal topic
    /// takes the largest count of its [`InternalTopic::partitions_of`](parsley_stage::InternalTopic::partitions_of),
    /// as the runtime creates it). Naming a topic the topology does not use creates it too,
    /// for a test's own producers and readers.
    ///
    /// # Panics
    /// When `partitions` is not positive.
    pub fn partitions(mut self, topic: impl Into<String>, partitions: i32) -> Self {
        assert!(partitions > 0, "a topic has at least one partition");
        self.partitions.insert(topic.into(), partitions);
        self
    }

    /// Whether every pipe, send and commit runs the topology before it returns (default:
    /// `true`). Off, records only pile up until [`TopologyTestDriver::run`]: one turn then
    /// offers all of them, as one poll batch.
    pub fn auto_run(mut self, on: bool) -> Self {
        self.auto_run = on;
        self
    }

    /// The driver's time at start, ms since the epoch (default 0): the timestamp of records
    /// written without one.
    pub fn start_time_ms(mut self, ms: i64) -> Self {
        self.time_ms = ms;
        self
    }

    /// Whether the gates enforce stamps (default [`GateMode::Causal`]; `GateMode::Off` is
    /// the negative control: arrival order).
    pub fn gate_mode(mut self, gate: GateMode) -> Self {
        self.gate = gate;
        self
    }

    /// The most turns one run takes (default [`DEFAULT_MAX_TURNS`]).
    pub fn max_turns(mut self, turns: usize) -> Self {
        self.max_turns = turns;
        self
    }

    /// Creates every topic the topology names (sources, sinks, dead-letter and internal
    /// topics) and those named with [`TopologyTestDriverBuilder::partitions`], checks each
    /// stage's sources are co-partitioned, and starts every task fresh.
    ///
    /// # Errors
    /// [`SetupError::NotCoPartitioned`] when a stage's sources have different partition counts;
    /// [`SetupError::InternalTopicPartitions`] when an internal topic was given another count than
    /// the one it takes; a task's start errors.
    pub fn build(self) -> Result<TopologyTestDriver> {
        let topology = self.topology;
        let internal: BTreeMap<&str, &parsley_stage::InternalTopic> = topology
            .internal_topics()
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        let mut names: BTreeSet<&str> = self.partitions.keys().map(String::as_str).collect();
        for spec in topology.stages() {
            names.extend(spec.sources().iter().map(String::as_str));
            names.extend(spec.sinks().iter().map(String::as_str));
            names.extend(dead_letters(spec).into_iter().flatten());
        }
        for t in internal.values() {
            names.insert(&t.name);
            names.extend(t.partitions_of.iter().map(String::as_str));
        }
        let count = |name: &str| self.partitions.get(name).copied().unwrap_or(1);
        let mut logs = Logs::default();
        for name in names {
            let partitions = match internal.get(name) {
                Some(t) => {
                    let expected = t.partitions_of.iter().map(|n| count(n)).max().unwrap_or(1);
                    if let Some(&given) = self.partitions.get(name)
                        && given != expected
                    {
                        return Err(Error::Setup(SetupError::InternalTopicPartitions {
                            topic: name.to_string(),
                            partitions: given,
                            expected,
                        }));
                    }
                    expected
                }
                None => count(name),
            };
            logs.create(name, partitions);
        }
        for spec in topology.stages() {
            for topic in spec.sources() {
                logs.declare_partitioning(topic, spec.key_partitioning(topic));
            }
        }
        let info = |name: &str| -> TopicInfo { logs.topic(name).expect("created").info.clone() };
        let mut stages = Vec::new();
        for spec in topology.stages() {
            let sources: Vec<TopicInfo> = spec.sources().iter().map(|t| info(t)).collect();
            // A global source is read whole by every task: it may have any count.
            let partitioned: Vec<&TopicInfo> = sources
                .iter()
                .filter(|t| !spec.is_global(&t.name))
                .collect();
            if partitioned
                .iter()
                .any(|t| t.partitions != partitioned[0].partitions)
            {
                return Err(Error::Setup(SetupError::NotCoPartitioned {
                    stage: spec.name().to_string(),
                    partitions: partitioned
                        .iter()
                        .map(|t| (t.name.clone(), t.partitions))
                        .collect(),
                }));
            }
            let [impossible, bad] = dead_letters(spec).map(|t| t.map(info));
            let topics = StageTopics {
                sources,
                sinks: spec.sinks().iter().map(|t| info(t)).collect(),
                dead_letters: (impossible, bad),
            };
            stages.push(StageRun::new(
                topology.application_id(),
                spec.clone(),
                topics,
                self.gate,
                &logs,
            )?);
        }
        Ok(TopologyTestDriver {
            inner: RefCell::new(Inner {
                logs,
                stages,
                producers: BTreeMap::new(),
                auto_run: self.auto_run,
                time_ms: self.time_ms,
                max_turns: self.max_turns,
            }),
        })
    }
}

/// The dead-letter topics of a stage: of impossible stamps, of bad records.
fn dead_letters(spec: &parsley_stage::StageSpec) -> [Option<&str>; 2] {
    [
        match spec.impossible_policy() {
            ImpossiblePolicy::DeadLetter { topic } => Some(topic.as_str()),
            _ => None,
        },
        match spec.bad_record_policy() {
            BadRecordPolicy::DeadLetter { topic } => Some(topic.as_str()),
            _ => None,
        },
    ]
}

/// What the driver holds.
struct Inner {
    logs: Logs,
    stages: Vec<StageRun>,
    producers: BTreeMap<String, ProducerState>,
    auto_run: bool,
    /// ms since the epoch.
    time_ms: i64,
    max_turns: usize,
}

impl Inner {
    /// Runs every stage that is not stopped until no turn moves anything (module docs).
    fn run(&mut self) -> Result<()> {
        let mut turns = 0usize;
        loop {
            let mut moved = false;
            for stage in &mut self.stages {
                while stage.failed.is_none() {
                    turns += 1;
                    assert!(
                        turns <= self.max_turns,
                        "the topology did not settle within {} turns: a stage that feeds \
                         itself forever? (TopologyTestDriverBuilder::max_turns)",
                        self.max_turns
                    );
                    let mut appended = Vec::new();
                    match stage.turn(&mut self.logs, self.time_ms, &mut appended) {
                        Ok(true) => moved = true,
                        Ok(false) => break,
                        Err(e) => stage.fail(e, &appended, &mut self.logs),
                    }
                }
            }
            if !moved {
                break;
            }
        }
        self.failure()
    }

    /// One turn of stage `stage` (see [`TopologyTestDriver::turn`]).
    fn turn(&mut self, stage: &str) -> Result<bool> {
        let s = self
            .stages
            .iter_mut()
            .find(|s| s.name() == stage)
            .ok_or_else(|| Error::Setup(SetupError::UnknownStage(stage.to_string())))?;
        if s.failed.is_some() {
            return self.failure().map(|()| false);
        }
        let mut appended = Vec::new();
        let moved = match s.turn(&mut self.logs, self.time_ms, &mut appended) {
            Ok(moved) => moved,
            Err(e) => {
                s.fail(e, &appended, &mut self.logs);
                false
            }
        };
        self.failure().map(|()| moved)
    }

    /// `Err` naming the first stopped stage, if any.
    fn failure(&self) -> Result<()> {
        match self.stages.iter().find(|s| s.failed.is_some()) {
            Some(s) => Err(Error::StageFailed {
                stage: s.name().to_string(),
                source: s.failed.clone().expect("a stopped stage"),
            }),
            None => Ok(()),
        }
    }

    /// After a write becomes visible: runs the topology when auto-run is on.
    fn after_write(&mut self) -> Result<()> {
        if self.auto_run { self.run() } else { Ok(()) }
    }

    /// The stage named `name`.
    fn stage(&self, name: &str) -> Result<&StageRun> {
        self.stages
            .iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| Error::Setup(SetupError::UnknownStage(name.to_string())))
    }

    /// The producer named `name`, created on first use.
    fn producer(&mut self, name: &str) -> &mut ProducerState {
        self.producers
            .entry(name.to_string())
            .or_insert_with(|| ProducerState::new(name))
    }

    /// The next visible record of `topic` at or after `next` (per partition), the earliest
    /// appended first: its partition, offset, topic id and a copy.
    fn next_visible(&self, topic: &str, next: &[i64]) -> Option<(i32, i64, TopicId, Stored)> {
        let t = self.logs.topic(topic).ok()?;
        let (partition, offset) = (0..t.info.partitions)
            .filter_map(|p| {
                let at = next.get(p as usize).copied().unwrap_or(0);
                (at < t.last_stable(p)).then_some((p, at))
            })
            .min_by_key(|&(p, at)| t.partitions[p as usize][at as usize].seq)?;
        let stored = t.partitions[partition as usize][offset as usize].clone();
        Some((partition, offset, t.info.id, stored))
    }
}

impl TopologyTestDriver {
    /// A builder for a driver running `topology`.
    pub fn builder(topology: Topology) -> TopologyTestDriverBuilder {
        TopologyTestDriverBuilder {
            topology,
            partitions: BTreeMap::new(),
            auto_run: true,
            time_ms: 0,
            gate: GateMode::Causal,
            max_turns: DEFAULT_MAX_TURNS,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.borrow_mut())
    }

    /// A handle that pipes records into `topic`, encoded with `key_codec` and `value_codec`.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`] for a topic the driver does not have.
    pub fn input_topic<K, V>(
        &self,
        topic: &str,
        key_codec: impl Codec<K> + 'static,
        value_codec: impl Codec<V> + 'static,
    ) -> Result<InputTopic<'_, K, V>> {
        self.with(|d| d.logs.topic(topic).map(|_| ()))?;
        Ok(InputTopic {
            driver: self,
            topic: topic.to_string(),
            key_codec: Box::new(key_codec),
            value_codec: Box::new(value_codec),
        })
    }

    /// A handle that reads `topic` from its start, decoding with `key_codec` and
    /// `value_codec`.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`] for a topic the driver does not have.
    pub fn output_topic<K, V>(
        &self,
        topic: &str,
        key_codec: impl Codec<K> + 'static,
        value_codec: impl Codec<V> + 'static,
    ) -> Result<OutputTopic<'_, K, V>> {
        let partitions = self.with(|d| d.logs.topic(topic).map(|t| t.info.partitions))?;
        Ok(OutputTopic {
            driver: self,
            topic: topic.to_string(),
            key_codec: Box::new(key_codec),
            value_codec: Box::new(value_codec),
            next: vec![0; partitions as usize],
        })
    }

    /// The causal producer named `name` (created on first use; the same name is the same
    /// producer, its clock kept).
    pub fn causal_producer(&self, name: &str) -> TestProducer<'_> {
        self.with(|d| {
            d.producer(name);
        });
        TestProducer {
            driver: self,
            name: name.to_string(),
        }
    }

    /// Pipes `record` into `topic` as bytes; then runs the topology (unless auto-run is off).
    /// Returns the coordinate the record was appended at.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`]; then as [`TopologyTestDriver::run`] (the record is in the
    /// topic either way).
    ///
    /// # Panics
    /// When the record's partition is not one of the topic's.
    pub fn pipe_raw(&self, topic: &str, record: RawInput) -> Result<Coordinate> {
        self.with(|d| {
            let RawInput {
                key,
                value,
                timestamp,
                partition,
                stamp,
                headers,
            } = record;
            let partition = match partition {
                Some(p) => p,
                None => d.logs.partition_for(topic, key.as_deref())?,
            };
            let mut all = Vec::with_capacity(headers.len() + 1);
            if let Some(s) = stamp {
                all.push((STAMP_HEADER.to_string(), Some(codec::encode(&s))));
            }
            all.extend(headers);
            let offset = d.logs.append(
                topic,
                partition,
                Append {
                    key,
                    value,
                    timestamp: timestamp.unwrap_or(d.time_ms),
                    headers: all,
                    open: None,
                },
            )?;
            let id = d.logs.topic(topic)?.info.id;
            d.after_write()?;
            Ok(parsley_clock::Channel::new(id, partition).at(offset))
        })
    }

    /// Runs every stage until nothing more can be delivered: turn after turn, stage by stage
    /// in the topology's order, until no turn offers a record or does any work (module docs).
    /// Pipes, sends and commits call it themselves unless auto-run is off.
    ///
    /// # Errors
    /// [`Error::StageFailed`] naming the first stopped stage, its `source` the typed error the
    /// stage stopped with — the one the runtime's stream thread would end with, e.g.
    /// [`ProcessingError::Stage`](crate::error::ProcessingError::Stage) (a handler error or a
    /// record that does not decode, under [`BadRecordPolicy::Fail`]),
    /// [`RecordError::KeyPartitionMismatch`](crate::error::RecordError::KeyPartitionMismatch),
    /// [`RecordError::KeylessRecord`](crate::error::RecordError::KeylessRecord),
    /// [`RecordError::ImpossibleStamp`](crate::error::RecordError::ImpossibleStamp),
    /// [`RecordError::MalformedStamp`](crate::error::RecordError::MalformedStamp) — each naming the
    /// topic, partition and offset of the record; match it with [`Error::stage_error`]. A stopped
    /// stage takes no turn until it is restarted ([`TopologyTestDriver::restart`]), and every run
    /// returns its error until then; the other stages run as far as they can.
    ///
    /// # Panics
    /// When the topology does not settle within the builder's
    /// [`max_turns`](TopologyTestDriverBuilder::max_turns) (a stage that feeds itself forever).
    pub fn run(&self) -> Result<()> {
        self.with(Inner::run)
    }

    /// Gives stage `stage` one turn and returns whether it moved: it takes every record
    /// offered to it so far as one poll batch, delivers what its gates allow and commits. With
    /// auto-run off, a test chooses the order in which stages run — to interleave the paths
    /// between stages adversarially — where [`TopologyTestDriver::run`] runs them in topology
    /// order until nothing moves.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`]; as [`TopologyTestDriver::run`] (a stopped stage takes no
    /// turn).
    pub fn turn(&self, stage: &str) -> Result<bool> {
        self.with(|d| d.turn(stage))
    }

    /// Turns auto-run on or off ([`TopologyTestDriverBuilder::auto_run`]).
    pub fn set_auto_run(&self, on: bool) {
        self.with(|d| d.auto_run = on);
    }

    /// Restarts every stage: each task is rebuilt from its changelog at the group's committed
    /// offsets by the runtime's restore code, as after a process restart — fold state,
    /// sender and next send sequence, clock, gate and event-time state come back; records not
    /// committed are read again. A stopped stage runs again. Then runs the topology (unless
    /// auto-run is off).
    ///
    /// # Errors
    /// A restore error ([`ProcessingError::Changelog`](crate::error::ProcessingError::Changelog),
    /// [`ProcessingError::RestoreMismatch`](crate::error::ProcessingError::RestoreMismatch),
    /// [`ProcessingError::EventTime`](crate::error::ProcessingError::EventTime)); then as
    /// [`TopologyTestDriver::run`].
    pub fn restart(&self) -> Result<()> {
        self.with(|d| {
            for stage in &mut d.stages {
                stage.restart(&d.logs)?;
            }
            d.after_write()
        })
    }

    /// Restarts stage `stage` alone ([`TopologyTestDriver::restart`]).
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`]; as [`TopologyTestDriver::restart`].
    pub fn restart_stage(&self, stage: &str) -> Result<()> {
        self.with(|d| {
            let Inner { stages, logs, .. } = d;
            let s = stages
                .iter_mut()
                .find(|s| s.name() == stage)
                .ok_or_else(|| Error::Setup(SetupError::UnknownStage(stage.to_string())))?;
            s.restart(logs)?;
            d.after_write()
        })
    }

    /// The fold state of `key` in stage `stage` (in whichever task holds it), decoded.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    ///
    /// # Panics
    /// When `key_codec` cannot encode the key or `state_codec` cannot decode the state.
    pub fn state<K, S>(
        &self,
        stage: &str,
        key: &K,
        key_codec: impl Codec<K>,
        state_codec: impl Codec<S>,
    ) -> Result<Option<S>> {
        let key = key_codec
            .encode(key)
            .unwrap_or_else(|e| panic!("cannot encode the key: {e}"));
        Ok(self.raw_state(stage, &key)?.map(|s| {
            state_codec
                .decode(&s)
                .unwrap_or_else(|e| panic!("cannot decode the state of stage {stage}: {e}"))
        }))
    }

    /// The fold state of the key with bytes `key` in stage `stage`, as bytes.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    pub fn raw_state(&self, stage: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.with(|d| Ok(d.stage(stage)?.state(key).map(<[u8]>::to_vec)))
    }

    /// Every key's fold state in stage `stage`, decoded.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    ///
    /// # Panics
    /// When a key or state does not decode.
    pub fn states<K: Ord, S>(
        &self,
        stage: &str,
        key_codec: impl Codec<K>,
        state_codec: impl Codec<S>,
    ) -> Result<BTreeMap<K, S>> {
        Ok(self
            .raw_states(stage)?
            .into_iter()
            .map(|(k, s)| {
                let key = key_codec
                    .decode(&k)
                    .unwrap_or_else(|e| panic!("cannot decode a state key of {stage}: {e}"));
                let state = state_codec
                    .decode(&s)
                    .unwrap_or_else(|e| panic!("cannot decode a state of {stage}: {e}"));
                (key, state)
            })
            .collect())
    }

    /// Every key's fold state in stage `stage`, as bytes, by key bytes.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    pub fn raw_states(&self, stage: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        self.with(|d| {
            Ok(d.stage(stage)?
                .tasks
                .values()
                .filter_map(|t| t.fold().in_memory())
                .flatten()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect())
        })
    }

    /// Stage `stage`'s counters: deliveries, held records, emissions, commits, bad records
    /// by kind, skipped, dead-lettered, late, … (gate waits are measured on the wall clock and
    /// are the only counters that differ from run to run).
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    pub fn metrics(&self, stage: &str) -> Result<MetricsSnapshot> {
        self.with(|d| Ok(d.stage(stage)?.metrics.snapshot()))
    }

    /// Stage `stage`'s counters per task.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    pub fn task_metrics(&self, stage: &str) -> Result<Vec<TaskMetrics>> {
        self.with(|d| Ok(d.stage(stage)?.metrics.tasks()))
    }

    /// The per-key late counts of event-time stage `stage`.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    pub fn late_by_key(&self, stage: &str) -> Result<Vec<LateKey>> {
        self.with(|d| Ok(d.stage(stage)?.metrics.late_by_key()))
    }

    /// The error stage `stage` stopped with, until it is restarted.
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    pub fn failure(&self, stage: &str) -> Result<Option<Arc<Error>>> {
        self.with(|d| Ok(d.stage(stage)?.failed.clone()))
    }

    /// Topic `topic`: its fake id and partition count.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`].
    pub fn topic(&self, topic: &str) -> Result<TopicInfo> {
        self.with(|d| Ok(d.logs.topic(topic)?.info.clone()))
    }

    /// The records of stage `stage`'s changelog partition `partition`, in append order: key,
    /// and value (`None`: a tombstone).
    ///
    /// # Errors
    /// [`SetupError::UnknownStage`].
    pub fn changelog(&self, stage: &str, partition: i32) -> Result<Vec<ChangelogRecord>> {
        self.with(|d| {
            Ok(d.stage(stage)?
                .changelog
                .get(partition as usize)
                .cloned()
                .unwrap_or_default())
        })
    }

    /// The driver's time, ms since the epoch: the timestamp of records written without one.
    pub fn time_ms(&self) -> i64 {
        self.with(|d| d.time_ms)
    }

    /// Moves the driver's time forward by `ms` milliseconds, then runs the topology (unless
    /// auto-run is off). The time is the timestamp of records written without one and of the
    /// built-in clock's ticks: a stage with a [`BuiltInClock`](parsley_stage::BuiltInClock)
    /// writes a tick at the next turn of each task once the time has moved at least one tick
    /// interval since its last tick, and only then.
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`].
    ///
    /// # Panics
    /// When `ms` is negative: the driver's time never goes back.
    pub fn advance_time(&self, ms: i64) -> Result<()> {
        assert!(
            ms >= 0,
            "the driver's time never goes back (advance_time({ms}))"
        );
        self.with(|d| {
            d.time_ms += ms;
            d.after_write()
        })
    }

    /// The next visible record of `topic` at or after `next` ([`Inner::next_visible`]).
    fn next_visible(&self, topic: &str, next: &[i64]) -> Option<(i32, i64, TopicId, Stored)> {
        self.with(|d| d.next_visible(topic, next))
    }

    /// How many records of `topic` are visible at or after `next` (per partition).
    fn visible_after(&self, topic: &str, next: &[i64]) -> usize {
        self.with(|d| {
            d.logs.topic(topic).map_or(0, |t| {
                (0..t.info.partitions)
                    .map(|p| {
                        let at = next.get(p as usize).copied().unwrap_or(0);
                        (t.last_stable(p) - at).max(0) as usize
                    })
                    .sum()
            })
        })
    }
}

impl std::fmt::Debug for TopologyTestDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.inner.borrow();
        f.debug_struct("TopologyTestDriver")
            .field(
                "stages",
                &d.stages.iter().map(StageRun::name).collect::<Vec<_>>(),
            )
            .field("time_ms", &d.time_ms)
            .field("auto_run", &d.auto_run)
            .finish_non_exhaustive()
    }
}
