//! What every task of a stage shares: the stage's topics by role, its processor, its policy
//! for impossible stamps, and its metrics.
//!
//! Built once at startup from the resolved topics and never changed while the stage runs (a source
//! that changes under the stage ends it: `RecordError::SourceChanged`). Lookups are linear scans: a
//! stage has few topics, and comparing a name is cheaper than hashing it.

use std::sync::Arc;

use parsley_clock::{Channel, TopicId};
use parsley_gate::GateError;
use parsley_stage::{BadRecordPolicy, ImpossiblePolicy, KeyPartitioning, Processor, StageSpec};

use crate::error::{Error, Result};
use crate::error::{ProcessingError, SetupError};
use crate::metrics::StageMetrics;
use crate::topic::TopicInfo;

/// Whether the delivery gate enforces stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GateMode {
    /// Records are delivered only when their claims are satisfied (the default).
    #[default]
    Causal,
    /// **Negative control.** Claims are not checked: each channel is delivered in arrival
    /// order, as a plain consumer would. Stamps are still decoded, merged into the node clock
    /// and carried forward. This exists to show, in tests and in the demo, what the gate
    /// prevents; never use it for real work. Only with the `negative-controls` feature.
    #[cfg(feature = "negative-controls")]
    Off,
}

/// A dead-letter topic ([`ImpossiblePolicy::DeadLetter`], [`BadRecordPolicy::DeadLetter`]).
pub struct DeadLetterTopic {
    /// The resolved topic.
    pub info: TopicInfo,
    /// Its name, shared by every record sent there.
    pub name: Arc<str>,
}

impl DeadLetterTopic {
    /// The dead-letter topic `info`.
    pub fn new(info: TopicInfo) -> Self {
        DeadLetterTopic {
            name: info.name.as_str().into(),
            info,
        }
    }
}

/// The built-in clock of a stage ([`parsley_stage::BuiltInClock`]): where and how often its
/// tasks write ticks.
pub struct ClockTicks {
    /// Index of the clock's topic in `TaskContext::sources`.
    pub source: usize,
    /// The clock's topic name, shared by every tick.
    pub name: Arc<str>,
    /// How often a task writes a tick, ms (`> 0`).
    pub interval_ms: i64,
}

/// A source of the stage that other stages of the topology write (module `upstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FedByStages {
    /// A stage that writes it also reads it: a claim on it may come from reading it, not only
    /// from the writer's own sends.
    pub read_by_writers: bool,
}

/// The stage as its tasks see it.
pub struct TaskContext {
    /// The stage's name (in errors).
    pub stage: String,
    /// The source topics, in the topology's order: a record's `source` is an index here.
    pub sources: Vec<TopicInfo>,
    /// Per source (same order): the partitioner its records' keys are checked against
    /// ([`parsley_stage::KeyPartitioning`]; `Unchecked`: none).
    pub key_partitioning: Vec<KeyPartitioning>,
    /// Per source (same order): every task reads all its partitions
    /// ([`parsley_stage::StageSettings::global_source`]).
    pub global: Vec<bool>,
    /// The declared sinks.
    pub sinks: Vec<TopicInfo>,
    /// Where [`ImpossiblePolicy::DeadLetter`] routes records.
    pub dead_letter: Option<DeadLetterTopic>,
    /// Where [`BadRecordPolicy::DeadLetter`] routes records.
    pub bad_record_dead_letter: Option<DeadLetterTopic>,
    /// Decode, handle, encode.
    pub processor: Arc<dyn Processor>,
    /// Whether the stage keeps fold state by key ([`Processor::keeps_state`]).
    pub keeps_state: bool,
    /// What to do with a record whose stamp is impossible.
    pub policy: ImpossiblePolicy,
    /// What to do with a record the stage cannot process.
    pub bad_records: BadRecordPolicy,
    /// Fetched records keep their headers (for a dead letter: only when a policy may send one).
    pub keep_headers: bool,
    /// Whether the gate enforces stamps.
    pub gate_mode: GateMode,
    /// Fetched-but-undelivered records per channel before it is paused or spills.
    pub cap: usize,
    /// The control stream of an event-time stage (hand-run or the built-in clock's topic):
    /// the index of its source and its lag, ms.
    pub control: Option<(usize, i64)>,
    /// The built-in clock, when the stage has one: its tasks write ticks and never hand one to
    /// the processor.
    pub clock: Option<ClockTicks>,
    /// Per source (same order): other stages of the topology write it, so an event-time task
    /// marks its channel unordered and starts its catch-up only once those stages have
    /// committed their history (module `upstream`). All `None` unless the stream thread sets
    /// them.
    pub fed_by_stages: Vec<Option<FedByStages>>,
    /// The stage's counters.
    pub metrics: Arc<StageMetrics>,
}

impl TaskContext {
    /// The context of the tasks of `spec`, its topics resolved: `sources` in the stage's
    /// order, `sinks`, and the dead-letter topics of impossible stamps and of bad records.
    /// Records keep their headers only when a policy may dead-letter them.
    ///
    /// # Panics
    /// When the control stream's topic (the built-in clock's included) is not among `sources`:
    /// the topology's build makes it a source.
    pub fn new(
        spec: &StageSpec,
        sources: Vec<TopicInfo>,
        sinks: Vec<TopicInfo>,
        (dead_letter, bad_record_dead_letter): (Option<TopicInfo>, Option<TopicInfo>),
        gate_mode: GateMode,
        cap: usize,
        metrics: Arc<StageMetrics>,
    ) -> Self {
        let key_partitioning = sources
            .iter()
            .map(|t| spec.key_partitioning(&t.name))
            .collect();
        let global = sources.iter().map(|t| spec.is_global(&t.name)).collect();
        let index = |topic: &str| {
            sources
                .iter()
                .position(|t| t.name == topic)
                .expect("the build makes the control topic a source")
        };
        let control = spec.control_stream().map(|c| (index(&c.topic), c.lag_ms));
        let clock = match (spec.clock_topic(), spec.event_time().and_then(|o| o.clock)) {
            (Some(topic), Some(clock)) => Some(ClockTicks {
                source: index(topic),
                name: topic.into(),
                interval_ms: clock.tick_interval_ms,
            }),
            _ => None,
        };
        TaskContext {
            stage: spec.name().to_string(),
            fed_by_stages: vec![None; sources.len()],
            sources,
            key_partitioning,
            global,
            sinks,
            dead_letter: dead_letter.map(DeadLetterTopic::new),
            bad_record_dead_letter: bad_record_dead_letter.map(DeadLetterTopic::new),
            processor: spec.processor().clone(),
            keeps_state: spec.processor().keeps_state(),
            policy: spec.impossible_policy().clone(),
            bad_records: spec.bad_record_policy().clone(),
            keep_headers: matches!(
                spec.impossible_policy(),
                ImpossiblePolicy::DeadLetter { .. }
            ) || matches!(
                spec.bad_record_policy(),
                BadRecordPolicy::DeadLetter { .. }
            ),
            gate_mode,
            cap,
            control,
            clock,
            metrics,
        }
    }

    /// The channels a task of `partition` consumes: partition `partition` of every source, and
    /// every partition of each global source.
    pub fn consumed(&self, partition: i32) -> Vec<Channel> {
        let mut consumed = Vec::with_capacity(self.sources.len());
        for (t, global) in self.sources.iter().zip(&self.global) {
            if *global {
                consumed.extend((0..t.partitions).map(|p| Channel::new(t.id, p)));
            } else {
                consumed.push(Channel::new(t.id, partition));
            }
        }
        consumed
    }

    /// Whether the stage reads a global source.
    pub fn has_global(&self) -> bool {
        self.global.contains(&true)
    }

    /// Whether `channel` is a partition of a global source: read by every task, its offsets kept
    /// in the tasks' snapshots and never committed to the group.
    pub fn is_global(&self, channel: Channel) -> bool {
        self.is_global_topic(channel.topic)
    }

    /// Whether the source of id `topic` is a global source.
    pub fn is_global_topic(&self, topic: parsley_clock::TopicId) -> bool {
        self.sources
            .iter()
            .zip(&self.global)
            .any(|(t, global)| *global && t.id == topic)
    }

    /// The partitions of the global sources, as channels (each task consumes all of them).
    pub fn global_channels(&self) -> Vec<Channel> {
        let mut channels = Vec::new();
        for (t, global) in self.sources.iter().zip(&self.global) {
            if *global {
                channels.extend((0..t.partitions).map(|p| Channel::new(t.id, p)));
            }
        }
        channels
    }

    /// The index of source `topic` in `sources`, looked up per record.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`] when `topic` is not a source of the stage.
    pub fn source_index(&self, topic: &str) -> Result<usize> {
        self.sources
            .iter()
            .position(|t| t.name == topic)
            .ok_or_else(|| {
                Error::Setup(SetupError::UnknownTopic {
                    topic: topic.to_string(),
                })
            })
    }

    /// The index in `sources` of the topic of `channel`.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`] (naming the topic id) when it is not a source of the stage.
    pub fn source_position(&self, channel: Channel) -> Result<usize> {
        self.sources
            .iter()
            .position(|t| t.id == channel.topic)
            .ok_or_else(|| {
                Error::Setup(SetupError::UnknownTopic {
                    topic: channel.topic.to_string(),
                })
            })
    }

    /// The source topic of `channel`.
    ///
    /// # Errors
    /// As [`TaskContext::source_position`].
    pub fn source_of(&self, channel: Channel) -> Result<&TopicInfo> {
        Ok(&self.sources[self.source_position(channel)?])
    }

    /// The sink named `topic`.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`] when the stage did not declare it.
    pub fn sink(&self, topic: &str) -> Result<&TopicInfo> {
        self.sinks
            .iter()
            .find(|t| *t.name == *topic)
            .ok_or_else(|| {
                Error::Setup(SetupError::UnknownTopic {
                    topic: topic.to_string(),
                })
            })
    }

    /// The name of a topic the stage reads or writes, by id; empty when it is none of them.
    pub fn topic_name(&self, id: TopicId) -> String {
        self.sources
            .iter()
            .chain(&self.sinks)
            .chain(self.dead_letter.as_ref().map(|d| &d.info))
            .chain(self.bad_record_dead_letter.as_ref().map(|d| &d.info))
            .find(|t| t.id == id)
            .map_or_else(String::new, |t| t.name.clone())
    }

    /// A gate error of the task of `partition`, named by stage and task.
    pub fn gate_error(&self, partition: i32, source: GateError) -> Error {
        Error::Processing(ProcessingError::Gate {
            stage: self.stage.clone(),
            partition,
            source: Box::new(source),
        })
    }
}
