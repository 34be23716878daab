//! Evidence: what the stream thread reads from Kafka after each poll batch and hands to the
//! tasks — the consumer's positions, high watermarks, and for event time the live heads.
//!
//! - **Positions** (position advance, the book's specification, §4): the consumer's application
//!   position of every channel the tasks consume, read after the batch's polls, whose records were
//!   all offered. A local read (`rd_kafka_position`).
//! - **High watermarks** the gates ask for ([`parsley_gate::Gate::evidence_wanted`]): one
//!   batched `ListOffsets(LATEST, READ_UNCOMMITTED)` to the leaders after the batch's polls,
//!   handed to every gate with the batch's epoch; asked again while a reading unblocks a record
//!   that wants evidence on another channel (each channel at most once per batch).
//! - **Live heads** of caught-up event-time inputs (the book's specification, §5,
//!   `event_time::head_evidence`): the high watermark of the channel's latest fetch response when
//!   the frontier has reached it (a local read), an earlier LSO reading when the frontier has not
//!   reached that, and otherwise the LSO read from the leaders in one batched `ListOffsets(LATEST,
//!   READ_COMMITTED)`.
//!
//! Invariant: every reading handed to a gate was taken after the poll that returned the
//! records it is evidence for; nothing here is persisted (fetch-time evidence is read again
//! after a restart).

use parsley_task::error::Operation;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parsley_clock::{Channel, TopicId};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use tracing::warn;

use super::StageRunner;
use crate::admin::Admin;
use parsley_task::context::TaskContext;
use parsley_task::error::Result;
use parsley_task::event_time::{HeadEvidence, head_evidence};
use parsley_task::task::Task;
use parsley_task::topic::TopicInfo;

/// The admin client and the topic names evidence requests need.
pub(crate) struct Evidence {
    admin: Arc<Admin>,
    /// Names of topics by id: the stage's own, then those claims name, resolved on demand.
    topic_names: HashMap<TopicId, String>,
}

impl Evidence {
    /// Evidence for a stage whose topics are `known`.
    pub(crate) fn new<'a>(
        admin: Arc<Admin>,
        known: impl IntoIterator<Item = &'a TopicInfo>,
    ) -> Self {
        Evidence {
            admin,
            topic_names: known.into_iter().map(|t| (t.id, t.name.clone())).collect(),
        }
    }

    /// The stage's admin client.
    pub(crate) fn admin(&self) -> &Admin {
        &self.admin
    }

    /// One batched `ListOffsets(LATEST, READ_UNCOMMITTED)` for `wanted`; a channel whose topic
    /// no longer exists reads 0: it has nothing left to read (the book's specification, §2:
    /// deletion is loss).
    fn high_watermarks(&mut self, wanted: &BTreeSet<Channel>) -> Result<Vec<(Channel, i64)>> {
        let unknown: Vec<_> = wanted
            .iter()
            .map(|c| c.topic)
            .filter(|id| !self.topic_names.contains_key(id))
            .collect();
        if !unknown.is_empty() {
            let found = self.admin.topic_names(&unknown)?;
            self.topic_names.extend(found);
        }
        let mut asked: Vec<(Channel, &str)> = Vec::new();
        let mut gone = Vec::new();
        for c in wanted {
            match self.topic_names.get(&c.topic) {
                Some(name) => asked.push((*c, name.as_str())),
                None => gone.push(*c),
            }
        }
        let request: Vec<(&str, i32)> = asked.iter().map(|(c, n)| (*n, c.partition)).collect();
        let answers = self.admin.high_watermarks(&request)?;
        let mut readings: Vec<(Channel, i64)> = asked
            .iter()
            .zip(answers)
            .map(|((c, _), hw)| (*c, hw))
            .collect();
        for c in gone {
            warn!(channel = %c, "a claim names a topic that does not exist any more");
            readings.push((c, 0));
        }
        Ok(readings)
    }
}

impl StageRunner {
    /// Hands every task the evidence read after the batch's polls: the consumer's positions,
    /// then the high watermarks the gates ask for.
    pub(super) fn read_evidence(&mut self) -> Result<()> {
        if self.tasks.is_empty() {
            return Ok(());
        }
        for (topic, partition, position) in
            consumer_positions(self.intake.consumer(), &self.ctx, &self.tasks)?
        {
            let source = self.ctx.source_index(&topic)?;
            let channel = Channel::new(self.ctx.sources[source].id, partition);
            // A held record is not read past: the gate takes at most its offset.
            let position = self.intake.gate_position(&channel, position);
            if let Some(task) = self.tasks.get_mut(&partition) {
                task.gate_mut()
                    .position(channel, position)
                    .map_err(|e| self.ctx.gate_error(partition, e))?;
            }
        }
        let mut served: BTreeSet<Channel> = BTreeSet::new();
        loop {
            let mut wanted: BTreeSet<Channel> = BTreeSet::new();
            for task in self.tasks.values() {
                wanted.extend(task.gate().evidence_wanted());
            }
            wanted.retain(|c| !served.contains(c));
            if wanted.is_empty() {
                return Ok(());
            }
            let readings = self.evidence.high_watermarks(&wanted)?;
            let epoch = self.intake.epoch();
            for task in self.tasks.values_mut() {
                for &(c, hw) in &readings {
                    task.gate_mut().high_watermark(c, hw, epoch);
                }
            }
            served.extend(wanted);
        }
    }

    /// Hands the trackers the live-head evidence of every caught-up event-time input of every
    /// task, after the batch's polls and deliveries (module docs).
    pub(super) fn read_heads(&mut self) -> Result<()> {
        let mut ask: Vec<Channel> = Vec::new();
        for task in self.tasks.values_mut() {
            let (gate, Some(et)) = task.gate_and_event_time() else {
                continue;
            };
            for c in et.caught_up_inputs() {
                let Some(frontier) = gate.frontier(&c) else {
                    ask.push(c);
                    continue;
                };
                // A paused partition is not fetched: its last response says nothing about
                // what was appended since.
                let fetched = if self.intake.is_paused(&c) {
                    None
                } else {
                    let name = &self.ctx.source_of(c)?.name;
                    cached_high_watermark(self.intake.consumer(), name, c.partition)
                };
                let head = match head_evidence(frontier + 1, fetched, et.last_stable(&c)) {
                    HeadEvidence::Fetched(hw) => hw,
                    HeadEvidence::Behind(lso) => lso,
                    HeadEvidence::Ask => {
                        ask.push(c);
                        continue;
                    }
                };
                et.fetched_head(c, head, false)
                    .map_err(|e| self.ctx.gate_error(c.partition, e))?;
            }
        }
        if ask.is_empty() {
            return Ok(());
        }
        let mut request = Vec::with_capacity(ask.len());
        for c in &ask {
            request.push((self.ctx.source_of(*c)?.name.as_str(), c.partition));
        }
        let heads = self.evidence.admin().last_stable_offsets(&request)?;
        for (c, lso) in ask.iter().zip(heads) {
            if let Some(et) = self
                .tasks
                .get_mut(&c.partition)
                .and_then(Task::event_time_mut)
            {
                et.fetched_head(*c, lso, true)
                    .map_err(|e| self.ctx.gate_error(c.partition, e))?;
            }
        }
        Ok(())
    }

    /// Sets every task's frontier lag from the end offsets of the consumer's last fetch
    /// responses (a local read, no request). The built-in clock's topic is left out: the
    /// task's own ticks are always a little ahead of what it has read.
    pub(super) fn publish_frontier_lag(&self) {
        let clock = self.ctx.clock.as_ref().map(|c| c.source);
        for task in self.tasks.values() {
            let mut lag = Some(0);
            for (i, source) in self.ctx.sources.iter().enumerate() {
                if Some(i) == clock {
                    continue;
                }
                let channel = Channel::new(source.id, task.partition());
                let end =
                    cached_high_watermark(self.intake.consumer(), &source.name, task.partition());
                let first = task.gate().first_undelivered(&channel);
                lag = match (lag, end, first) {
                    (Some(l), Some(end), Some(first)) => Some(l + (end - first).max(0)),
                    _ => None,
                };
            }
            self.metrics
                .task(task.partition(), |m| m.frontier_lag = lag);
        }
    }
}

/// The consumer's position (the offset after the last record it returned) of every channel
/// the tasks consume, as `(topic, partition, position)`; a channel it has returned nothing from
/// yet is left out.
///
/// Read for the tasks' own channels with `rd_kafka_position`, a local read. rdkafka's
/// `Consumer::position` would first ask librdkafka's main thread for the assignment (a request
/// and a reply between threads, once per poll batch); the tasks are the assignment's
/// partitions, and a channel the consumer no longer has reads as no position.
///
/// # Errors
/// The client's, naming the read.
pub(crate) fn consumer_positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    ctx: &TaskContext,
    tasks: &BTreeMap<i32, Task>,
) -> Result<Vec<(String, i32, i64)>> {
    let mut positions = TopicPartitionList::with_capacity(tasks.len() * ctx.sources.len());
    for (partition, task) in tasks {
        for source in &ctx.sources {
            if task
                .gate()
                .baseline(&Channel::new(source.id, *partition))
                .is_some()
            {
                positions.add_partition(&source.name, *partition);
            }
        }
    }
    // SAFETY: the client handle is alive for as long as `consumer` is borrowed; the list is a
    // valid list owned by `positions`, which librdkafka only updates in place.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_position(consumer.client().native_ptr(), positions.ptr())
    };
    if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(crate::client_error::kafka(
            Operation::ReadPositions,
            rdkafka::error::KafkaError::MetadataFetch(err.into()),
        ));
    }
    Ok(positions
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(position) => Some((e.topic().to_string(), e.partition(), position)),
            _ => None,
        })
        .collect())
}

/// librdkafka's cached high watermark of `topic`/`partition`, from the consumer's last fetch
/// response (`rd_kafka_get_watermark_offsets`: a local read, no request; the rdkafka crate does
/// not wrap it); `None` before the first fetch response. Not evidence for the causal gate
/// (the book's specification, §4, wants a `READ_UNCOMMITTED` `ListOffsets` after the poll: a claim
/// on another channel can name a record appended after that channel's last fetch response); used
/// for the frontier-lag metric and, when the frontier has reached it, as the live-head evidence of
/// event-time ordering (the book's specification, §5: the latest fetch response, whose LSO is at or
/// below it).
fn cached_high_watermark<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the client handle is alive for as long as `consumer` is borrowed; `topic` is a
    // NUL-terminated string that outlives the call; `low` and `high` are valid for writes.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}
