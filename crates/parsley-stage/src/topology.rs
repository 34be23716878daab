//! The topology builder: stages composed in `main.rs`, validated at build time.
//!
//! ```
//! use parsley_stage::{Handler, HandlerError, Record, Step, Topology, Utf8};
//!
//! struct Count;
//! impl Handler for Count {
//!     type Key = String;
//!     type Value = String;
//!     type Output = u64;
//!     type State = u64;
//!     fn handle(&self, r: Record<'_, String, String>, n: Option<u64>)
//!         -> Result<Step<String, u64, u64>, HandlerError>
//!     {
//!         let n = n.unwrap_or(0) + 1;
//!         Ok(Step::none().emit("counts", r.key, n).set_state(n))
//!     }
//! }
//!
//! let topology = Topology::builder("shop")
//!     .stage("count", Count, |s| s.source("orders").sink("counts").key_codec(Utf8))
//!     .build()?;
//! assert_eq!(topology.stages()[0].group_id(topology.application_id()), "shop.count");
//! # Ok::<(), parsley_stage::Error>(())
//! ```
//!
//! Validation (all problems are reported together in [`Error::InvalidTopology`]): a valid
//! application id and stage names, at least one stage, unique stage names, every stage has at
//! least one source and no duplicate source or sink, topic names are legal Kafka names; an
//! [`EventTimeOrder`]'s control topic is one of the stage's sources, not its only one, with a
//! lag `>= 0`; its built-in clock has a lag `>= 0` and a tick interval `> 0`, and is not
//! combined with a control topic. A stage with the built-in clock gets its clock's topic as one
//! more source and internal topic ([`clock_topic`]).
//! A stage may write a topic it also reads (a loop through itself: its own outputs come back
//! to it once committed); the runtime commits first when a task's gate waits on a record of
//! the open transaction itself (the book's specification, §7).
//! Sources of one stage must be co-partitioned (same partition count, same key hashing); that
//! is checked against the broker when the runtime starts.
//!
//! Above every module but `describe`: it builds on `processor`, `error`, `codec`, `handler`,
//! `event_time` and `internal`, and re-exports their types a stage's settings name
//! ([`EventTimeOrder`], [`BadRecordKind`]); nothing below imports it.

use std::fmt;
use std::sync::Arc;

use crate::codec::{Codec, Json};
pub use crate::error::BadRecordKind;
use crate::error::{Error, Result};
use crate::event_time;
pub use crate::event_time::{
    BuiltInClock, ControlStream, DEFAULT_MAX_DRIFT_MS, DEFAULT_TICK_INTERVAL_MS, EventTimeOrder,
    clock_topic,
};
use crate::handler::Handler;
use crate::internal::InternalTopic;
use crate::processor::{Codecs, Processor, Typed, TypedPunctuator};
use crate::punctuation::{PunctuationType, Punctuator, Schedule};
use crate::store::StoreSpec;

/// A validated set of stages of one application.
#[derive(Clone)]
pub struct Topology {
    application_id: String,
    stages: Vec<StageSpec>,
    internal: Vec<InternalTopic>,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("application_id", &self.application_id)
            .field("stages", &self.stages)
            .field("internal", &self.internal)
            .finish()
    }
}

impl Topology {
    /// Starts a topology for the application `application_id` (the prefix of every consumer
    /// group and transactional id).
    pub fn builder(application_id: impl Into<String>) -> TopologyBuilder {
        TopologyBuilder {
            application_id: application_id.into(),
            stages: Vec::new(),
            internal: Vec::new(),
            problems: Vec::new(),
        }
    }

    /// The application id.
    pub fn application_id(&self) -> &str {
        &self.application_id
    }

    /// The stages, in the order they were added.
    pub fn stages(&self) -> &[StageSpec] {
        &self.stages
    }

    /// The stage called `name`.
    pub fn stage(&self, name: &str) -> Option<&StageSpec> {
        self.stages.iter().find(|s| s.name == name)
    }

    /// The topics the topology creates for itself: the repartition topics, in the order they
    /// were declared, then the built-in clocks' topics, in the order of their stages.
    pub fn internal_topics(&self) -> &[InternalTopic] {
        &self.internal
    }
}

/// One validated stage: its sources, sinks and processor.
#[derive(Clone)]
pub struct StageSpec {
    name: String,
    sources: Vec<String>,
    sinks: Vec<String>,
    processor: Arc<dyn Processor>,
    impossible: ImpossiblePolicy,
    bad_records: BadRecordPolicy,
    /// Sources whose writers partition by key other than with murmur2, and how.
    partitioning: Vec<(String, KeyPartitioning)>,
    /// Sources read whole by every task ([`StageSettings::global_source`]).
    global: Vec<String>,
    event_time: Option<EventTimeOrder>,
    /// The topic of its built-in clock, among its sources (filled in by `build`).
    clock_topic: Option<String>,
    /// The internal topics among its sources and sinks (filled in by `build`).
    internal: Vec<InternalTopic>,
    /// One line per operator, from the front end that compiled the stage.
    operators: Vec<String>,
    /// The views of its fold state that interactive queries read ([`StageSettings::store`]).
    stores: Vec<StoreSpec>,
}

/// How the writers of a source partition its records by key.
///
/// A stage's tasks are co-partitioned by key: task `p` reads partition `p` of every source, and
/// its fold state and causal claims assume that one key's records of every source are in the
/// task. That holds only when every writer puts a key on the same partition — Kafka Streams
/// and Parsley's own producers use murmur2 of the key bytes, as the Java client's default
/// partitioner does, but librdkafka's default (`consistent_random`, CRC32) does not. So by
/// default the runtime checks each delivered record's key against its partition, and a
/// mismatch stops the stage with an error naming the record, its key, the partition murmur2
/// gives and the partitioner the key matches (case C20), instead of computing a wrong result
/// silently. A source written by librdkafka-based clients with their default partitioner is
/// declared [`KeyPartitioning::Crc32`] and read as it is: each key is still in one partition.
///
/// The checked sources of one stage must share a partitioner: a key's records would otherwise
/// be in different tasks ([`TopologyBuilder::build`] refuses a stage that mixes murmur2 and
/// CRC32 sources; repartition one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyPartitioning {
    /// murmur2 of the key bytes, made positive, modulo the partition count — the Java client's
    /// default partitioner, Kafka Streams' and Parsley's, librdkafka's `murmur2` and
    /// `murmur2_random`; checked (the default).
    #[default]
    Murmur2,
    /// CRC-32 (IEEE) of the key bytes modulo the partition count — librdkafka's `consistent`
    /// and `consistent_random` partitioners, the default of librdkafka-based clients (C,
    /// Python, Go, .NET, Rust's `rdkafka`); checked.
    Crc32,
    /// The writers partition some other way on purpose; keys are not checked. Fold state and
    /// claims then group the records of a partition, whatever their keys.
    Unchecked,
}

/// What a stage does with a record it cannot process: a key or value that does not decode, a
/// key or value that is absent where the stage needs one (a record without a key in a stage
/// that keeps fold state, a tombstone), a handler error, or an output of it that the producer
/// or the broker refuses for good (too large, a timestamp the topic does not accept:
/// [`BadRecordKind::OutputRefused`]). Kafka Streams' deserialization, processing and
/// production exception handlers (KIP-1033) and its dead-letter queue (KIP-1034) are the
/// reference — except that an output refused for good never lets the other outputs of its
/// input record commit without it: the transaction is aborted and the redo applies the policy
/// to the input record.
///
/// A skipped or dead-lettered record counts as **processed**: its offset is committed with the
/// transaction that handled it, the task's node clock has observed it, and records that claim
/// it are delivered after it as after any other — nothing waits for it. It changes no fold
/// state and emits nothing else. A fold state that does not decode, an emission that cannot
/// be encoded and an emission to an undeclared sink are the stage's own faults, not the
/// record's: they always stop the stage.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BadRecordPolicy {
    /// Stop the stage with the typed error naming the record (the default). Its offset is not
    /// committed: a restart meets it again.
    #[default]
    Fail,
    /// Count it (per kind) and go on.
    Skip,
    /// Send it to `topic` in the same transaction as the input offsets — the original key,
    /// value and headers, stamped by the task, with headers naming the stage, the source
    /// topic, partition and offset, the kind of failure and the error — count it and go on.
    DeadLetter {
        /// The dead-letter topic (must exist; not one of the stage's sources).
        topic: String,
    },
}

/// What a stage does with a record whose stamp no truthful sender can produce (the book's
/// specification, §4: a malformed or unknown-version header, a claim on its own channel at or
/// beyond itself, a claim beyond the channel's high watermark). Nothing is dropped silently under
/// any policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ImpossiblePolicy {
    /// Stop the task with an error naming the channel, offset and sender (the default). The
    /// record's offset is not committed: it is read again after a restart.
    #[default]
    Fail,
    /// Deliver the record without its impossible claims (a malformed header: as unstamped) and
    /// count it in the stage's metrics.
    DeliverAndCount,
    /// Route the record, with headers naming its source and the reason, to this topic in the
    /// same transaction, count it, and move on.
    DeadLetter {
        /// The dead-letter topic (must exist).
        topic: String,
    },
}

impl fmt::Debug for StageSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageSpec")
            .field("name", &self.name)
            .field("sources", &self.sources)
            .field("sinks", &self.sinks)
            .field("impossible", &self.impossible)
            .field("bad_records", &self.bad_records)
            .field("partitioning", &self.partitioning)
            .field("global", &self.global)
            .field("event_time", &self.event_time)
            .field("clock_topic", &self.clock_topic)
            .field("internal", &self.internal)
            .field("operators", &self.operators)
            .field("stores", &self.stores)
            .finish_non_exhaustive()
    }
}

impl StageSpec {
    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Source topics, co-partitioned: task `p` consumes partition `p` of each.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// Sink topics the handler may emit to.
    pub fn sinks(&self) -> &[String] {
        &self.sinks
    }

    /// The stage's logic over bytes.
    pub fn processor(&self) -> &Arc<dyn Processor> {
        &self.processor
    }

    /// What the stage does with an impossible stamp.
    pub fn impossible_policy(&self) -> &ImpossiblePolicy {
        &self.impossible
    }

    /// What the stage does with a record it cannot process.
    pub fn bad_record_policy(&self) -> &BadRecordPolicy {
        &self.bad_records
    }

    /// How the writers of source `topic` partition it by key (checked unless it opted out; a
    /// global source is never checked: every task reads all of it).
    pub fn key_partitioning(&self, topic: &str) -> KeyPartitioning {
        if self.is_global(topic) {
            return KeyPartitioning::Unchecked;
        }
        self.partitioning
            .iter()
            .find(|(t, _)| t == topic)
            .map_or(KeyPartitioning::Murmur2, |(_, p)| *p)
    }

    /// The stage's event-time order, if it orders by event time.
    pub fn event_time(&self) -> Option<&EventTimeOrder> {
        self.event_time.as_ref()
    }

    /// The sources every task reads whole, all their partitions
    /// ([`StageSettings::global_source`]); a subset of [`StageSpec::sources`].
    pub fn global_sources(&self) -> &[String] {
        &self.global
    }

    /// The sources read by partition — task `p` reads partition `p` of each — in order: every
    /// source but the global ones. Their partition counts must be equal (co-partitioning).
    pub fn partitioned_sources(&self) -> impl Iterator<Item = &String> {
        self.sources.iter().filter(|t| !self.is_global(t))
    }

    /// Whether source `topic` is read whole by every task ([`StageSettings::global_source`]).
    pub fn is_global(&self, topic: &str) -> bool {
        self.global.iter().any(|t| t == topic)
    }

    /// The topic of the stage's built-in clock ([`EventTimeOrder::clock`]): one of its sources
    /// and an internal topic of the topology, `{application}-{stage}-clock`. `None` without a
    /// built-in clock.
    pub fn clock_topic(&self) -> Option<&str> {
        self.clock_topic.as_deref()
    }

    /// The control stream that moves the stage's processing-time clock: the hand-run one
    /// ([`EventTimeOrder::control`]), or the built-in clock's topic with its lag. `None` for a
    /// stage with neither, or that does not order by event time.
    pub fn control_stream(&self) -> Option<ControlStream> {
        let order = self.event_time.as_ref()?;
        match (&order.control, &order.clock, &self.clock_topic) {
            (Some(control), _, _) => Some(control.clone()),
            (None, Some(clock), Some(topic)) => Some(ControlStream {
                topic: topic.clone(),
                lag_ms: clock.lag_ms,
            }),
            _ => None,
        }
    }

    /// The internal topics among the stage's sources and sinks: the runtime creates each one
    /// that is absent before the stage starts (see [`InternalTopic`]).
    pub fn internal_topics(&self) -> &[InternalTopic] {
        &self.internal
    }

    /// The consumer group of this stage: `{application_id}.{stage}`.
    pub fn group_id(&self, application_id: &str) -> String {
        format!("{application_id}.{}", self.name)
    }

    /// The stage's changelog topic: `{application_id}.{stage}.changelog` (see
    /// [`changelog_topic`]).
    pub fn changelog_topic(&self, application_id: &str) -> String {
        changelog_topic(&self.group_id(application_id))
    }

    /// The stage's queryable stores ([`StageSettings::store`]); empty for a stage added with
    /// a handler.
    pub fn stores(&self) -> &[StoreSpec] {
        &self.stores
    }

    /// The stage's store named `name`, if it has one.
    pub fn store(&self, name: &str) -> Option<&StoreSpec> {
        self.stores.iter().find(|s| s.name() == name)
    }

    /// What the stage runs, one line per operator, as its front end described it (the DSL
    /// names its fused operators); empty for a stage added with a handler.
    pub fn operators(&self) -> &[String] {
        &self.operators
    }
}

/// The changelog topic of the stage whose consumer group is `group`: `{group}.changelog`,
/// compacted, with as many partitions as the stage's sources. The runtime creates it and
/// writes each task's fold state and Parsley's own state (clock, sender sequence, gate
/// snapshot) to it in the same transaction as the task's outputs.
pub fn changelog_topic(group: &str) -> String {
    format!("{group}.changelog")
}

/// Builds a [`Topology`]; see the module docs.
pub struct TopologyBuilder {
    application_id: String,
    stages: Vec<StageSpec>,
    internal: Vec<InternalTopic>,
    problems: Vec<String>,
}

impl TopologyBuilder {
    /// Declares a topic the topology creates for itself (see [`InternalTopic`]). Checked by
    /// [`TopologyBuilder::build`]: a legal name, declared once, a source or sink of some stage,
    /// its partition count taken from at least one topic that is not internal.
    pub fn internal_topic(mut self, topic: InternalTopic) -> Self {
        self.internal.push(topic);
        self
    }

    /// Adds a stage named `name` running `processor` — a stage's logic over bytes, for front
    /// ends that compile to processors themselves (the DSL) — with the sources, sinks and
    /// policies of `settings`.
    pub fn processor_stage(
        mut self,
        name: impl Into<String>,
        processor: Arc<dyn Processor>,
        settings: StageSettings,
    ) -> Self {
        self.stages.push(settings.into_spec(name.into(), processor));
        self
    }

    /// Adds a stage named `name` running `handler`, configured by `configure`.
    pub fn stage<H: Handler>(
        mut self,
        name: impl Into<String>,
        handler: H,
        configure: impl FnOnce(StageBuilder<H>) -> StageBuilder<H>,
    ) -> Self
    where
        Json: Codec<H::Key> + Codec<H::Value> + Codec<H::Output> + Codec<H::State>,
    {
        let name = name.into();
        let StageBuilder {
            name: _,
            handler,
            settings,
            codecs,
            schedules,
            punctuators,
        } = configure(StageBuilder {
            name: name.clone(),
            handler,
            schedules: Vec::new(),
            punctuators: Vec::new(),
            settings: StageSettings::default(),
            codecs: Codecs {
                key: Arc::new(Json),
                value: Arc::new(Json),
                output: Arc::new(Json),
                state: Arc::new(Json),
            },
        });
        let processor: Arc<dyn Processor> = Arc::new(Typed {
            stage: name.clone(),
            handler,
            codecs,
            sinks: settings.sinks.clone(),
            schedules,
            punctuators,
        });
        self.stages.push(settings.into_spec(name, processor));
        self
    }

    /// Validates and returns the topology.
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] listing every problem found.
    pub fn build(self) -> Result<Topology> {
        let mut problems = self.problems;
        if let Err(why) = legal_name(&self.application_id) {
            problems.push(format!("application id {:?}: {why}", self.application_id));
        }
        if self.stages.is_empty() {
            problems.push("the topology has no stage".to_string());
        }
        for (i, stage) in self.stages.iter().enumerate() {
            let name = &stage.name;
            if let Err(why) = legal_name(name) {
                problems.push(format!("stage name {name:?}: {why}"));
            }
            if self.stages[..i].iter().any(|s| s.name == *name) {
                problems.push(format!("stage {name:?} is defined twice"));
            }
            if stage.sources.is_empty() {
                problems.push(format!("stage {name:?} has no source topic"));
            }
            for (kind, topics) in [("source", &stage.sources), ("sink", &stage.sinks)] {
                for (j, topic) in topics.iter().enumerate() {
                    if let Err(why) = legal_name(topic) {
                        problems.push(format!("stage {name:?}: {kind} topic {topic:?}: {why}"));
                    }
                    if topics[..j].contains(topic) {
                        problems.push(format!(
                            "stage {name:?}: {kind} topic {topic:?} is listed twice"
                        ));
                    }
                }
            }
            let dead_letters = [
                match &stage.impossible {
                    ImpossiblePolicy::DeadLetter { topic } => Some(topic),
                    _ => None,
                },
                match &stage.bad_records {
                    BadRecordPolicy::DeadLetter { topic } => Some(topic),
                    _ => None,
                },
            ];
            for (j, topic) in dead_letters.iter().enumerate() {
                let Some(topic) = topic else { continue };
                if dead_letters[..j].contains(&Some(*topic)) {
                    continue;
                }
                if let Err(why) = legal_name(topic) {
                    problems.push(format!(
                        "stage {name:?}: dead-letter topic {topic:?}: {why}"
                    ));
                }
                if stage.sources.contains(topic) {
                    problems.push(format!(
                        "stage {name:?}: dead-letter topic {topic:?} is also a source"
                    ));
                }
            }
            for (topic, _) in &stage.partitioning {
                if !stage.sources.contains(topic) {
                    problems.push(format!(
                        "stage {name:?}: key partitioning of {topic:?}, which is not a source of the stage"
                    ));
                }
            }
            let by = |p: KeyPartitioning| -> Vec<&String> {
                let sources = stage.sources.iter();
                sources.filter(|t| stage.key_partitioning(t) == p).collect()
            };
            let (murmur2, crc32) = (by(KeyPartitioning::Murmur2), by(KeyPartitioning::Crc32));
            if let (Some(m), Some(c)) = (murmur2.first(), crc32.first()) {
                problems.push(format!(
                    "stage {name:?}: source {c:?} is partitioned by CRC32 and source {m:?} by murmur2: a key's records would be in different tasks; repartition one of them"
                ));
            }
            if !stage.global.is_empty() {
                if stage.sources.iter().all(|t| stage.is_global(t)) {
                    problems.push(format!(
                        "stage {name:?} reads only global sources: its tasks need a source read by partition"
                    ));
                }
                if stage.event_time.is_some() {
                    problems.push(format!(
                        "stage {name:?} orders by event time and reads the global source {:?}: a global source is read in a stage without event-time order (repartition between them)",
                        stage.global[0]
                    ));
                }
            }
            punctuation_problems(name, stage, &mut problems);
            if stage.processor.uses_timers() && stage.event_time.is_none() {
                problems.push(format!(
                    "stage {name:?} sets event-time timers but does not order by event time"
                ));
            }
            if let Some(order) = &stage.event_time {
                event_time::problems(name, &stage.sources, order, &mut problems);
            }
        }
        let mut stages = self.stages;
        let mut internal = self.internal;
        add_clock_topics(
            &self.application_id,
            &mut stages,
            &mut internal,
            &mut problems,
        );
        for (i, topic) in internal.iter().enumerate() {
            let name = &topic.name;
            if let Err(why) = legal_name(name) {
                problems.push(format!("internal topic {name:?}: {why}"));
            }
            if internal[..i].iter().any(|t| t.name == *name) {
                problems.push(format!("internal topic {name:?} is declared twice"));
            }
            if !stages
                .iter()
                .any(|s| s.sources.contains(name) || s.sinks.contains(name))
            {
                problems.push(format!(
                    "internal topic {name:?} is neither a source nor a sink of any stage"
                ));
            }
            if topic.partitions_of.is_empty() {
                problems.push(format!(
                    "internal topic {name:?} takes its partition count from no topic"
                ));
            }
            for of in &topic.partitions_of {
                if internal.iter().any(|t| t.name == *of) {
                    problems.push(format!(
                        "internal topic {name:?} takes its partition count from {of:?}, which is internal too"
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(Error::InvalidTopology { problems });
        }
        for stage in &mut stages {
            stage.internal = internal
                .iter()
                .filter(|t| stage.sources.contains(&t.name) || stage.sinks.contains(&t.name))
                .cloned()
                .collect();
        }
        Ok(Topology {
            application_id: self.application_id,
            stages,
            internal,
        })
    }
}

/// How long a segment of a clock topic stays open, ms: compaction, which keeps the latest tick
/// of each partition, never touches the open segment.
const CLOCK_SEGMENT_MS: &str = "3600000";

/// Adds the topic of each stage's built-in clock ([`clock_topic`]) to the stage's sources
/// (its keys unchecked: a tick's key is its partition number) and to `internal`, co-partitioned
/// with the stage's other sources — through their own counts for internal ones. A stage with no
/// source gets none (that is reported already); a stage that lists the clock's topic as a
/// source itself is a problem.
fn add_clock_topics(
    application_id: &str,
    stages: &mut [StageSpec],
    internal: &mut Vec<InternalTopic>,
    problems: &mut Vec<String>,
) {
    let declared = internal.len();
    for stage in stages {
        if stage.event_time.as_ref().is_none_or(|o| o.clock.is_none()) || stage.sources.is_empty() {
            continue;
        }
        let topic = clock_topic(application_id, &stage.name);
        if stage.sources.contains(&topic) {
            problems.push(format!(
                "stage {:?}: source {topic:?} is the name of its built-in clock's topic",
                stage.name
            ));
            continue;
        }
        let mut partitions_of: Vec<String> = Vec::new();
        for source in &stage.sources {
            let of = match internal[..declared].iter().find(|t| t.name == *source) {
                Some(t) => t.partitions_of.clone(),
                None => vec![source.clone()],
            };
            for name in of {
                if !partitions_of.contains(&name) {
                    partitions_of.push(name);
                }
            }
        }
        internal.push(
            InternalTopic::new(topic.clone(), partitions_of)
                .config("cleanup.policy", "compact")
                .config("segment.ms", CLOCK_SEGMENT_MS),
        );
        stage.sources.push(topic.clone());
        stage
            .partitioning
            .push((topic.clone(), KeyPartitioning::Unchecked));
        stage.clock_topic = Some(topic);
    }
}

/// A stage's sources, sinks and policies: what [`StageBuilder`] configures besides codecs, and
/// what [`TopologyBuilder::processor_stage`] takes.
#[derive(Debug, Clone, Default)]
pub struct StageSettings {
    sources: Vec<String>,
    sinks: Vec<String>,
    impossible: ImpossiblePolicy,
    bad_records: BadRecordPolicy,
    partitioning: Vec<(String, KeyPartitioning)>,
    global: Vec<String>,
    event_time: Option<EventTimeOrder>,
    operators: Vec<String>,
    stores: Vec<StoreSpec>,
}

impl StageSettings {
    /// No source, no sink, the default policies.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a source topic. All sources of a stage must be co-partitioned.
    pub fn source(mut self, topic: impl Into<String>) -> Self {
        self.sources.push(topic.into());
        self
    }

    /// Declares a sink topic the stage may emit to.
    pub fn sink(mut self, topic: impl Into<String>) -> Self {
        self.sinks.push(topic.into());
        self
    }

    /// Adds a **global source**: a topic every task reads whole — all its partitions, whatever
    /// their count — as Kafka Streams' global tables are read by every instance. Its records
    /// go through each task's gate like any other input's (a claim on one of its partitions
    /// is waited for), are handled with the fold state of their own key, and are never
    /// committed to the stage's consumer group: each task keeps its position in its
    /// changelog snapshot. A task delivers nothing of its other sources until it has read
    /// every partition of its global sources up to the end offsets it found when it started.
    /// Its keys are not checked against their partitions. Checked by
    /// [`TopologyBuilder::build`]: the stage has a source that is not global, and does not
    /// order by event time.
    pub fn global_source(mut self, topic: impl Into<String>) -> Self {
        let topic = topic.into();
        self.global.push(topic.clone());
        self.sources.push(topic);
        self
    }

    /// What to do with records whose stamps are impossible (default: fail the task).
    pub fn on_impossible_stamp(mut self, policy: ImpossiblePolicy) -> Self {
        self.impossible = policy;
        self
    }

    /// How the writers of source `topic` partition it by key (default:
    /// [`KeyPartitioning::Murmur2`], checked on every delivered record). Checked by
    /// [`TopologyBuilder::build`]: `topic` must be a source of the stage.
    pub fn key_partitioning(
        mut self,
        topic: impl Into<String>,
        partitioning: KeyPartitioning,
    ) -> Self {
        let topic = topic.into();
        self.partitioning.retain(|(t, _)| *t != topic);
        if partitioning != KeyPartitioning::Murmur2 {
            self.partitioning.push((topic, partitioning));
        }
        self
    }

    /// What to do with records the stage cannot process (default: fail the stage); see
    /// [`BadRecordPolicy`]. A dead-letter topic is checked by [`TopologyBuilder::build`]: a
    /// legal name, not a source of the stage.
    pub fn on_bad_record(mut self, policy: BadRecordPolicy) -> Self {
        self.bad_records = policy;
        self
    }

    /// Orders the stage's deliveries by event time (the Kafka record timestamp) per task; see
    /// [`EventTimeOrder`]. Checked by [`TopologyBuilder::build`]: a control topic must be a
    /// source of the stage, not its only one, with a lag `>= 0`; a built-in clock needs a lag
    /// `>= 0`, a tick interval `> 0` and no control topic beside it.
    pub fn order_by_event_time(mut self, order: EventTimeOrder) -> Self {
        self.event_time = Some(order);
        self
    }

    /// Describes what the stage runs, one line per operator ([`StageSpec::operators`], shown
    /// by [`Topology::describe`]).
    pub fn operators(mut self, lines: Vec<String>) -> Self {
        self.operators = lines;
        self
    }

    /// Declares a queryable store over the stage's fold state (module
    /// [`store`](crate::store)); a store of the same name declared before is replaced.
    pub fn store(mut self, store: StoreSpec) -> Self {
        self.stores.retain(|s| s.name() != store.name());
        self.stores.push(store);
        self
    }

    /// The source topics declared so far.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// The sink topics declared so far.
    pub fn sinks(&self) -> &[String] {
        &self.sinks
    }

    fn into_spec(self, name: String, processor: Arc<dyn Processor>) -> StageSpec {
        let StageSettings {
            sources,
            sinks,
            impossible,
            bad_records,
            partitioning,
            global,
            event_time,
            operators,
            stores,
        } = self;
        StageSpec {
            name,
            sources,
            sinks,
            processor,
            impossible,
            bad_records,
            partitioning,
            global,
            event_time,
            clock_topic: None,
            internal: Vec::new(),
            operators,
            stores,
        }
    }
}

/// Configures one stage: sources, sinks, policies ([`StageSettings`]) and codecs (JSON by
/// default).
pub struct StageBuilder<H: Handler> {
    name: String,
    handler: H,
    settings: StageSettings,
    codecs: Codecs<H>,
    schedules: Vec<Schedule>,
    punctuators: Vec<TypedPunctuator<H>>,
}

impl<H: Handler> StageBuilder<H> {
    /// Adds a source topic. All sources of a stage must be co-partitioned.
    pub fn source(mut self, topic: impl Into<String>) -> Self {
        self.settings = self.settings.source(topic);
        self
    }

    /// Declares a sink topic the handler may emit to.
    pub fn sink(mut self, topic: impl Into<String>) -> Self {
        self.settings = self.settings.sink(topic);
        self
    }

    /// Adds a global source, read whole by every task ([`StageSettings::global_source`]).
    pub fn global_source(mut self, topic: impl Into<String>) -> Self {
        self.settings = self.settings.global_source(topic);
        self
    }

    /// The codec of input and output keys (and of the state key).
    pub fn key_codec(mut self, codec: impl Codec<H::Key> + 'static) -> Self {
        self.codecs.key = Arc::new(codec);
        self
    }

    /// The codec of input values.
    pub fn value_codec(mut self, codec: impl Codec<H::Value> + 'static) -> Self {
        self.codecs.value = Arc::new(codec);
        self
    }

    /// The codec of emitted values.
    pub fn output_codec(mut self, codec: impl Codec<H::Output> + 'static) -> Self {
        self.codecs.output = Arc::new(codec);
        self
    }

    /// The codec of the fold state.
    pub fn state_codec(mut self, codec: impl Codec<H::State> + 'static) -> Self {
        self.codecs.state = Arc::new(codec);
        self
    }

    /// What to do with records whose stamps are impossible (default: fail the task).
    pub fn on_impossible_stamp(mut self, policy: ImpossiblePolicy) -> Self {
        self.settings = self.settings.on_impossible_stamp(policy);
        self
    }

    /// How the writers of source `topic` partition it by key; see
    /// [`StageSettings::key_partitioning`].
    pub fn key_partitioning(
        mut self,
        topic: impl Into<String>,
        partitioning: KeyPartitioning,
    ) -> Self {
        self.settings = self.settings.key_partitioning(topic, partitioning);
        self
    }

    /// What to do with records the stage cannot process; see
    /// [`StageSettings::on_bad_record`].
    pub fn on_bad_record(mut self, policy: BadRecordPolicy) -> Self {
        self.settings = self.settings.on_bad_record(policy);
        self
    }

    /// Orders the stage's deliveries by event time; see
    /// [`StageSettings::order_by_event_time`].
    pub fn order_by_event_time(mut self, order: EventTimeOrder) -> Self {
        self.settings = self.settings.order_by_event_time(order);
        self
    }

    /// Schedules `punctuator` every `interval_ms` ms (`> 0`) of `kind`'s time (Kafka Streams'
    /// `ProcessorContext.schedule`; module `punctuation` and the book's DSL chapter,
    /// "Punctuation"). Schedules are numbered in the order they are added
    /// ([`crate::Punctuation::schedule`]). [`TopologyBuilder::build`] reports an interval
    /// `<= 0`, a stream-time schedule on a stage without event-time order and a wall-clock one
    /// on a stage without the built-in clock.
    pub fn schedule(
        mut self,
        interval_ms: i64,
        kind: PunctuationType,
        punctuator: impl Punctuator<H::Key, H::Output, H::State>,
    ) -> Self {
        self.schedules.push(Schedule { interval_ms, kind });
        self.punctuators.push(Arc::new(punctuator));
        self
    }

    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The problems of stage `name`'s punctuation schedules, appended to `problems`.
fn punctuation_problems(name: &str, stage: &StageSpec, problems: &mut Vec<String>) {
    for (i, s) in stage.processor.schedules().iter().enumerate() {
        if s.interval_ms <= 0 {
            problems.push(format!(
                "stage {name:?}: punctuation schedule {i}: interval {} ms is not positive",
                s.interval_ms
            ));
        }
        match s.kind {
            PunctuationType::StreamTime if stage.event_time.is_none() => problems.push(format!(
                "stage {name:?}: punctuation schedule {i} is on stream time but the stage does \
                 not order by event time"
            )),
            PunctuationType::WallClockTime
                if stage.event_time.as_ref().is_none_or(|o| o.clock.is_none()) =>
            {
                problems.push(format!(
                    "stage {name:?}: punctuation schedule {i} is on wall-clock time but the \
                     stage has no built-in clock (EventTimeOrder::clock)"
                ))
            }
            _ => {}
        }
    }
}

/// Kafka's legal topic (and here: id) names: 1–249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn legal_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > 249 {
        return Err("is longer than 249 characters");
    }
    if name == "." || name == ".." {
        return Err("cannot be '.' or '..'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("may contain only ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{HandlerError, Record, Step};
    use crate::processor::{RawDelivery, RawRecord};
    use crate::{Bincode, StateChange, Utf8};

    struct Echo;
    impl Handler for Echo {
        type Key = String;
        type Value = u32;
        type Output = u32;
        type State = u32;
        fn handle(
            &self,
            r: Record<'_, String, u32>,
            state: Option<u32>,
        ) -> std::result::Result<Step<String, u32, u32>, HandlerError> {
            if r.value == 13 {
                return Err("unlucky".into());
            }
            let total = state.unwrap_or(0) + r.value;
            Ok(Step::none().emit("out", r.key, total).set_state(total))
        }
    }

    #[test]
    fn a_global_source_is_read_beside_a_partitioned_one_never_alone_nor_by_event_time() {
        let t = Topology::builder("app")
            .stage("a", Echo, |s| {
                s.global_source("rates").source("in").sink("out")
            })
            .build()
            .unwrap();
        let a = t.stage("a").unwrap();
        assert_eq!(a.sources(), ["rates", "in"]);
        assert_eq!(a.global_sources(), ["rates"]);
        assert_eq!(a.partitioned_sources().collect::<Vec<_>>(), ["in"]);
        assert!(a.is_global("rates") && !a.is_global("in"));
        // Its keys are not checked: every task reads every partition.
        assert_eq!(a.key_partitioning("rates"), KeyPartitioning::Unchecked);
        assert!(
            t.describe()
                .to_string()
                .contains("rates (global: every partition)")
        );

        let err = Topology::builder("app")
            .stage("a", Echo, |s| s.global_source("rates").sink("out"))
            .stage("b", Echo, |s| {
                s.global_source("rates")
                    .source("in")
                    .sink("out2")
                    .order_by_event_time(EventTimeOrder::new())
            })
            .build()
            .unwrap_err();
        let Error::InvalidTopology { problems } = err else {
            panic!("{err}")
        };
        assert!(
            problems.contains(
                &"stage \"a\" reads only global sources: its tasks need a source read by partition"
                    .to_string()
            ),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.starts_with(
                "stage \"b\" orders by event time and reads the global source \"rates\""
            )),
            "{problems:?}"
        );
    }

    #[test]
    fn a_stage_reading_crc32_and_murmur2_sources_is_refused_and_alone_each_is_kept() {
        let err = Topology::builder("app")
            .stage("a", Echo, |s| {
                s.source("crc")
                    .source("java")
                    .source("other")
                    .sink("out")
                    .key_partitioning("crc", KeyPartitioning::Crc32)
                    .key_partitioning("other", KeyPartitioning::Unchecked)
            })
            .build()
            .unwrap_err();
        let Error::InvalidTopology { problems } = err else {
            panic!("{err}")
        };
        assert_eq!(
            problems,
            [
                "stage \"a\": source \"crc\" is partitioned by CRC32 and source \"java\" by murmur2: a key's records would be in different tasks; repartition one of them"
            ]
        );
        let t = Topology::builder("app")
            .stage("a", Echo, |s| {
                s.source("crc")
                    .source("other")
                    .sink("out")
                    .key_partitioning("crc", KeyPartitioning::Crc32)
                    .key_partitioning("other", KeyPartitioning::Unchecked)
            })
            .build()
            .unwrap();
        let a = t.stage("a").unwrap();
        assert_eq!(a.key_partitioning("crc"), KeyPartitioning::Crc32);
        assert_eq!(a.key_partitioning("other"), KeyPartitioning::Unchecked);
        assert_eq!(a.key_partitioning("out"), KeyPartitioning::Murmur2);
    }

    #[test]
    fn build_reports_every_problem_at_once() {
        let err = Topology::builder("app id")
            .stage("a", Echo, |s| s.source("in").source("in").sink("in"))
            .stage("a", Echo, |s| s.sink("bad/topic"))
            .build()
            .unwrap_err();
        let Error::InvalidTopology { problems } = err else {
            panic!("{err}")
        };
        let text = problems.join("\n");
        for needle in [
            "application id \"app id\"",
            "source topic \"in\" is listed twice",
            "stage \"a\" is defined twice",
            "stage \"a\" has no source topic",
            "sink topic \"bad/topic\"",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert!(matches!(
            Topology::builder("x").build(),
            Err(Error::InvalidTopology { .. })
        ));
    }

    #[test]
    fn internal_topics_are_validated_and_handed_to_the_stages_that_touch_them() {
        let rep = InternalTopic::new("app-sum-repartition", ["in".to_string()]);
        let t = Topology::builder("app")
            .stage("rekey", Echo, |s| {
                s.source("in").sink("app-sum-repartition")
            })
            .stage("sum", Echo, |s| s.source("app-sum-repartition").sink("out"))
            .stage("other", Echo, |s| s.source("in").sink("out"))
            .internal_topic(rep.clone())
            .build()
            .unwrap();
        assert_eq!(t.internal_topics(), std::slice::from_ref(&rep));
        assert_eq!(
            t.stage("rekey").unwrap().internal_topics(),
            std::slice::from_ref(&rep)
        );
        assert_eq!(
            t.stage("sum").unwrap().internal_topics(),
            std::slice::from_ref(&rep)
        );
        assert!(t.stage("other").unwrap().internal_topics().is_empty());

        let err = Topology::builder("app")
            .stage("a", Echo, |s| s.source("in").sink("app-x-repartition"))
            .internal_topic(InternalTopic::new(
                "app-x-repartition",
                ["app-y".to_string()],
            ))
            .internal_topic(InternalTopic::new("app-x-repartition", Vec::new()))
            .internal_topic(InternalTopic::new("app-y", ["in".to_string()]))
            .build()
            .unwrap_err();
        let Error::InvalidTopology { problems } = err else {
            panic!("{err}")
        };
        assert_eq!(
            problems,
            [
                "internal topic \"app-x-repartition\" takes its partition count from \"app-y\", which is internal too",
                "internal topic \"app-x-repartition\" is declared twice",
                "internal topic \"app-x-repartition\" takes its partition count from no topic",
                "internal topic \"app-y\" is neither a source nor a sink of any stage",
            ]
        );
    }

    #[test]
    fn a_stage_may_write_a_topic_it_reads() {
        let topology = Topology::builder("app")
            .stage("loop", Echo, |s| s.source("in").source("out").sink("out"))
            .build()
            .expect("a loop through one stage is valid");
        assert_eq!(topology.stages()[0].sources(), ["in", "out"]);
        assert_eq!(topology.stages()[0].sinks(), ["out"]);
    }

    #[test]
    fn event_time_order_is_validated_at_build_time() {
        let ok = Topology::builder("app")
            .stage("a", Echo, |s| {
                s.source("in")
                    .source("ticks")
                    .sink("out")
                    .order_by_event_time(EventTimeOrder::new().control("ticks", 500))
            })
            .build()
            .unwrap();
        let order = ok.stages()[0].event_time().unwrap();
        assert_eq!(
            order.control,
            Some(ControlStream {
                topic: "ticks".into(),
                lag_ms: 500
            })
        );
        let err = Topology::builder("app")
            .stage("a", Echo, |s| {
                s.source("in")
                    .sink("out")
                    .order_by_event_time(EventTimeOrder::new().control("ticks", -1))
            })
            .stage("b", Echo, |s| {
                s.source("ticks")
                    .sink("out")
                    .order_by_event_time(EventTimeOrder::new().control("ticks", 0))
            })
            .build()
            .unwrap_err();
        let Error::InvalidTopology { problems } = err else {
            panic!("{err}")
        };
        assert_eq!(
            problems,
            [
                "stage \"a\": control topic \"ticks\" is not a source of the stage",
                "stage \"a\": control lag -1 ms is negative",
                "stage \"b\": control topic \"ticks\" is the only source: nothing has an event time",
            ]
        );
    }

    #[test]
    fn a_built_in_clock_adds_its_topic_as_a_source_and_an_internal_topic() {
        let t = Topology::builder("app")
            .stage("rekey", Echo, |s| {
                s.source("in").sink("app-sum-repartition")
            })
            .stage("sum", Echo, |s| {
                s.source("app-sum-repartition")
                    .source("more")
                    .sink("out")
                    .order_by_event_time(EventTimeOrder::new().clock(250))
            })
            .internal_topic(InternalTopic::new(
                "app-sum-repartition",
                ["in".to_string()],
            ))
            .build()
            .unwrap();
        let sum = t.stage("sum").unwrap();
        assert_eq!(sum.clock_topic(), Some("app-sum-clock"));
        assert_eq!(
            sum.sources(),
            ["app-sum-repartition", "more", "app-sum-clock"]
        );
        assert_eq!(
            sum.key_partitioning("app-sum-clock"),
            KeyPartitioning::Unchecked,
            "a tick's key is its partition number"
        );
        assert_eq!(
            sum.control_stream(),
            Some(ControlStream {
                topic: "app-sum-clock".into(),
                lag_ms: 250
            })
        );
        assert_eq!(
            sum.event_time().unwrap().clock,
            Some(BuiltInClock {
                lag_ms: 250,
                tick_interval_ms: DEFAULT_TICK_INTERVAL_MS
            })
        );
        // Co-partitioned with the other sources: an internal one through its own counts.
        let clock = &t.internal_topics()[1];
        assert_eq!(clock.name, "app-sum-clock");
        assert_eq!(clock.partitions_of, ["in", "more"]);
        assert!(
            clock
                .config
                .contains(&("cleanup.policy".into(), "compact".into()))
        );
        assert_eq!(sum.internal_topics().len(), 2);
        assert!(t.stage("rekey").unwrap().clock_topic().is_none());
        assert!(t.stage("rekey").unwrap().control_stream().is_none());
    }

    #[test]
    fn a_built_in_clock_is_validated_at_build_time() {
        let err = Topology::builder("app")
            .stage("a", Echo, |s| {
                s.source("in")
                    .source("ticks")
                    .sink("out")
                    .order_by_event_time(EventTimeOrder::new().control("ticks", 0).clock(-5))
            })
            .stage("b", Echo, |s| {
                s.source("in")
                    .sink("out")
                    .order_by_event_time(EventTimeOrder::new().clock(0).tick_interval_ms(0))
            })
            .stage("c", Echo, |s| {
                s.source("in")
                    .source("app-c-clock")
                    .order_by_event_time(EventTimeOrder::new().clock(0))
            })
            .build()
            .unwrap_err();
        let Error::InvalidTopology { problems } = err else {
            panic!("{err}")
        };
        assert_eq!(
            problems,
            [
                "stage \"a\": the built-in clock and the control stream \"ticks\" together: choose one",
                "stage \"a\": clock lag -5 ms is negative",
                "stage \"b\": clock tick interval 0 ms is not positive",
                "stage \"c\": source \"app-c-clock\" is the name of its built-in clock's topic",
            ]
        );
        // A clock name longer than Kafka allows is reported like any internal topic's.
        let long = "s".repeat(240);
        let err = Topology::builder("app")
            .stage(long.as_str(), Echo, |s| {
                s.source("in")
                    .order_by_event_time(EventTimeOrder::new().clock(0))
            })
            .build()
            .unwrap_err();
        assert!(
            err.to_string().contains("-clock\": is longer than 249"),
            "{err}"
        );
    }

    #[test]
    #[should_panic(expected = "turn the built-in clock on first")]
    fn a_tick_interval_without_a_clock_panics() {
        let _ = EventTimeOrder::new().tick_interval_ms(50);
    }

    #[test]
    fn a_second_clock_call_keeps_the_interval() {
        let order = EventTimeOrder::new()
            .clock(100)
            .tick_interval_ms(30)
            .clock(200);
        assert_eq!(
            order.clock,
            Some(BuiltInClock {
                lag_ms: 200,
                tick_interval_ms: 30
            })
        );
    }

    #[test]
    fn processor_decodes_handles_and_encodes() {
        let t = Topology::builder("app")
            .stage("sum", Echo, |s| {
                s.source("in")
                    .sink("out")
                    .key_codec(Utf8)
                    .state_codec(Bincode)
            })
            .build()
            .unwrap();
        let p = t.stage("sum").unwrap().processor().clone();
        let raw = |value: &'static [u8]| RawRecord {
            topic: "in",
            partition: 2,
            offset: 7,
            timestamp: 0,
            key: Some(b"k"),
            value: Some(value),
            watermark: None,
            headers: &[],
            task_state: None,
        };
        let state = Bincode.encode(&5u32).unwrap();
        let step = p.process(raw(b"3"), Some(&state)).unwrap();
        assert_eq!(&*step.emit[0].topic, "out");
        assert_eq!(step.emit[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(step.emit[0].value.as_deref(), Some(&b"8"[..]));
        assert_eq!(step.state, StateChange::Set(Bincode.encode(&8u32).unwrap()));

        let err = p.process(raw(b"nope"), None).unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot decode the value of in/2@7"),
            "{err}"
        );
        let err = p.process(raw(b"13"), None).unwrap_err();
        assert!(
            err.to_string()
                .contains("handler failed on in/2@7: unlucky"),
            "{err}"
        );
        let err = p
            .process(raw(b"1"), Some(b"\xff\xff\xff\xff\xff\xff"))
            .unwrap_err();
        assert!(err.to_string().contains("cannot decode the state"), "{err}");

        // The runtime's entry point hands the value over; the outcome is the same.
        let delivery = |value: Option<&[u8]>| RawDelivery {
            topic: "in",
            partition: 2,
            offset: 7,
            timestamp: 0,
            key: Some(b"k"),
            value: value.map(<[u8]>::to_vec),
            watermark: None,
            headers: &[],
            task_state: None,
        };
        assert_eq!(
            p.process_delivery(delivery(Some(b"3")), Some(&state))
                .unwrap(),
            step
        );
        let err = p.process_delivery(delivery(None), None).unwrap_err();
        assert!(err.to_string().contains("value"), "{err}");
        let err = p
            .process_delivery(delivery(Some(b"nope")), None)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot decode the value of in/2@7"),
            "{err}"
        );
    }

    #[test]
    fn emitting_to_an_undeclared_sink_is_an_error() {
        let t = Topology::builder("app")
            .stage("sum", Echo, |s| {
                s.source("in").sink("elsewhere").key_codec(Utf8)
            })
            .build()
            .unwrap();
        let err = t.stages()[0]
            .processor()
            .process(
                RawRecord {
                    topic: "in",
                    partition: 0,
                    offset: 0,
                    timestamp: 0,
                    key: Some(b"k"),
                    value: Some(b"1"),
                    watermark: None,
                    headers: &[],
                    task_state: None,
                },
                None,
            )
            .unwrap_err();
        assert!(matches!(err, Error::UndeclaredSink { ref topic, .. } if topic == "out"));
    }
}
