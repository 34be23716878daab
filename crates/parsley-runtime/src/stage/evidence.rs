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
//! - **A failed poll** ([`Evidence::poll_failed`]): what the cluster says now decides whether
//!   the stage carries on — a source deleted or recreated, a position below its log start.
//!
//! [`Evidence`] owns the stage's admin client and the names of the topics claims name; it
//! reads the consumer and the tasks it is handed and keeps nothing of them.
//!
//! Invariant: every reading handed to a gate was taken after the poll that returned the
//! records it is evidence for; nothing here is persisted (fetch-time evidence is read again
//! after a restart).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parsley_clock::{Channel, TopicId};
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tracing::warn;

use super::intake::Intake;
use super::sources;
use super::tasks::Tasks;
use crate::admin::Admin;
use crate::librdkafka::cached_high_watermark;
use crate::security::is_security_failure;
use parsley_task::context::TaskContext;
use parsley_task::error::{Error, Result};
use parsley_task::error::{Operation, RecordError};
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

impl Evidence {
    /// Hands every task the evidence read after the batch's polls: the consumer's positions
    /// (through `intake`), then the high watermarks the gates ask for.
    pub(crate) fn read(
        &mut self,
        ctx: &TaskContext,
        intake: &Intake,
        tasks: &mut Tasks,
    ) -> Result<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        for (topic, partition, position) in consumer_positions(intake.consumer(), ctx, tasks)? {
            let source = ctx.source_index(&topic)?;
            let channel = Channel::new(ctx.sources[source].id, partition);
            // A held record is not read past: the gate takes at most its offset.
            let position = intake.gate_position(&channel, position);
            if let Some(task) = tasks.get_mut(partition) {
                task.position(ctx, channel, position)?;
            }
        }
        tasks.global_positions(ctx)?;
        let mut served: BTreeSet<Channel> = BTreeSet::new();
        loop {
            let mut wanted: BTreeSet<Channel> = BTreeSet::new();
            for (_, task) in tasks.iter() {
                wanted.extend(task.gate().evidence_wanted());
            }
            wanted.retain(|c| !served.contains(c));
            if wanted.is_empty() {
                return Ok(());
            }
            let readings = self.high_watermarks(&wanted)?;
            let epoch = intake.epoch();
            for task in tasks.values_mut() {
                for &(c, hw) in &readings {
                    task.gate_mut().high_watermark(c, hw, epoch);
                }
            }
            served.extend(wanted);
        }
    }

    /// Hands the trackers the live-head evidence of every caught-up event-time input of every
    /// task, after the batch's polls and deliveries (module docs).
    pub(crate) fn read_heads(
        &self,
        ctx: &TaskContext,
        intake: &Intake,
        tasks: &mut Tasks,
    ) -> Result<()> {
        let mut ask: Vec<Channel> = Vec::new();
        for task in tasks.values_mut() {
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
                let fetched = if intake.is_paused(&c) {
                    None
                } else {
                    let name = &ctx.source_of(c)?.name;
                    cached_high_watermark(intake.consumer(), name, c.partition)
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
                    .map_err(|e| ctx.gate_error(c.partition, e))?;
            }
        }
        if ask.is_empty() {
            return Ok(());
        }
        let mut request = Vec::with_capacity(ask.len());
        for c in &ask {
            request.push((ctx.source_of(*c)?.name.as_str(), c.partition));
        }
        let heads = self.admin.last_stable_offsets(&request)?;
        for (c, lso) in ask.iter().zip(heads) {
            if let Some(et) = tasks.get_mut(c.partition).and_then(Task::event_time_mut) {
                et.fetched_head(*c, lso, true)
                    .map_err(|e| ctx.gate_error(c.partition, e))?;
            }
        }
        Ok(())
    }

    /// Sets every task's frontier lag from the end offsets of the consumer's last fetch
    /// responses (a local read, no request). The built-in clock's topic is left out: the
    /// task's own ticks are always a little ahead of what it has read.
    pub(crate) fn publish_frontier_lag(ctx: &TaskContext, intake: &Intake, tasks: &Tasks) {
        let clock = ctx.clock.as_ref().map(|c| c.source);
        for (_, task) in tasks.iter() {
            let mut lag = Some(0);
            for (i, source) in ctx.sources.iter().enumerate() {
                if Some(i) == clock {
                    continue;
                }
                let channel = Channel::new(source.id, task.partition());
                let end = cached_high_watermark(intake.consumer(), &source.name, task.partition());
                let first = task.gate().first_undelivered(&channel);
                lag = match (lag, end, first) {
                    (Some(l), Some(end), Some(first)) => Some(l + (end - first).max(0)),
                    _ => None,
                };
            }
            ctx.metrics.task(task.partition(), |m| m.frontier_lag = lag);
        }
    }

    /// Decides what an error of `intake`'s poll means: `Ok` to carry on, or the error that
    /// ends the stage; `timeout` bounds the descriptions it takes.
    /// - A failure to authenticate or to set up TLS:
    ///   [`KafkaError::Security`](parsley_task::error::KafkaError::Security).
    /// - A transient connection error (a broker restarting, a network blip): librdkafka
    ///   reconnects by itself; carry on.
    /// - An unknown topic or partition: [`RecordError::SourceDeleted`] when the cluster confirms a
    ///   source is gone, [`RecordError::SourceChanged`] when it was recreated (a new topic id);
    ///   otherwise metadata not caught up yet (a topic just created, a leader moving): carry
    ///   on.
    /// - A fetch position that fell out of range (with `auto.offset.reset=error`) while the
    ///   stage runs: [`RecordError::RecordsLost`] for the channel whose position now lies below its
    ///   log start offset (retention or `DeleteRecords` removed records the stage had not
    ///   fetched: case C12 mid-stream); librdkafka's error names no partition, so the positions
    ///   are compared with the log start offsets read now.
    /// - Anything else is the client's error — unless a source was recreated meanwhile, which
    ///   explains it: [`RecordError::SourceChanged`] then.
    pub(crate) fn poll_failed(
        &self,
        ctx: &TaskContext,
        intake: &Intake,
        tasks: &Tasks,
        e: KafkaError,
        timeout: Duration,
    ) -> Result<()> {
        use rdkafka::types::RDKafkaErrorCode as C;
        if let Some(code) = e.rdkafka_error_code()
            && is_security_failure(code)
        {
            return Err(intake.security_error(code, e.to_string()));
        }
        if crate::client_error::transient(&e) {
            warn!(error = %e, "consumer: transient error, carrying on");
            return Ok(());
        }
        if let Some(code @ (C::TopicAuthorizationFailed | C::GroupAuthorizationFailed)) =
            e.rdkafka_error_code()
        {
            return Err(self.refused_fetch(ctx, code, &e));
        }
        match e.rdkafka_error_code() {
            Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => {
                // Deleted ends the stage, recreated too (a new id); else metadata catching up.
                if let Some(change) = sources::source_change(&self.admin, ctx, timeout)? {
                    return Err(change);
                }
                warn!(error = %e, "consumer: a source is unknown to it but exists: carrying on");
                return Ok(());
            }
            Some(C::AutoOffsetReset) => match self.records_lost(ctx, intake, tasks) {
                Ok(Some(lost)) => return Err(lost),
                Ok(None) => {}
                Err(lookup) => warn!(error = %lookup, "cannot name the channel a fetch lost"),
            },
            _ => {}
        }
        // A source recreated under the stage explains errors like a position out of range on
        // the new topic: say that instead (a description that fails explains nothing).
        if let Ok(Some(change)) = sources::source_change(&self.admin, ctx, timeout) {
            return Err(change);
        }
        Err(crate::client_error::kafka(Operation::Poll, e))
    }

    /// The error of a fetch or group request refused for want of an ACL: for a topic, the
    /// typed error naming the first source the principal may not read (librdkafka's consumer
    /// error names no topic: [`Admin::unreadable`] finds it); for the group, the client
    /// error, which the stage names by its group when it ends (module `authorization`).
    fn refused_fetch(
        &self,
        ctx: &TaskContext,
        code: rdkafka::types::RDKafkaErrorCode,
        e: &KafkaError,
    ) -> Error {
        let name = match code {
            rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed => {
                let sources: Vec<&str> = ctx.sources.iter().map(|t| t.name.as_str()).collect();
                match self.admin.unreadable(&sources) {
                    Ok(refused) => refused.into_iter().next(),
                    Err(lookup) => {
                        warn!(error = %lookup, "cannot name the source a fetch was refused");
                        None
                    }
                }
            }
            _ => return crate::client_error::kafka(Operation::Poll, e.clone()),
        };
        crate::authorization::refused(
            Operation::Poll,
            code,
            name.as_deref(),
            crate::clients::ClientRole::Consumer,
            e,
        )
        .unwrap_or_else(|| crate::client_error::kafka(Operation::Poll, e.clone()))
    }

    /// [`RecordError::RecordsLost`] for the first channel whose consumer position lies below its
    /// log start offset, if any.
    fn records_lost(
        &self,
        ctx: &TaskContext,
        intake: &Intake,
        tasks: &Tasks,
    ) -> Result<Option<Error>> {
        let positions = consumer_positions(intake.consumer(), ctx, tasks)?;
        let channels: Vec<(&str, i32)> =
            positions.iter().map(|(t, p, _)| (t.as_str(), *p)).collect();
        let starts = self.admin.log_start_offsets(&channels)?;
        Ok(positions
            .into_iter()
            .zip(starts)
            .find(|((_, _, position), start)| position < start)
            .map(|((topic, partition, from), log_start)| {
                Error::Record(RecordError::RecordsLost {
                    topic,
                    partition,
                    from,
                    log_start,
                })
            }))
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
fn consumer_positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    ctx: &TaskContext,
    tasks: &Tasks,
) -> Result<Vec<(String, i32, i64)>> {
    let tasks = tasks.iter();
    let mut positions = TopicPartitionList::with_capacity(tasks.len() * ctx.sources.len());
    for (partition, task) in tasks {
        for source in ctx.sources.iter().filter(|t| !ctx.is_global_topic(t.id)) {
            if task
                .gate()
                .baseline(&Channel::new(source.id, *partition))
                .is_some()
            {
                positions.add_partition(&source.name, *partition);
            }
        }
    }
    crate::librdkafka::consumer::positions(consumer, &mut positions).map_err(|code| {
        crate::client_error::kafka(
            Operation::ReadPositions,
            rdkafka::error::KafkaError::MetadataFetch(code),
        )
    })?;
    Ok(positions
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(position) => Some((e.topic().to_string(), e.partition(), position)),
            _ => None,
        })
        .collect())
}
