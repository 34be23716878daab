//! The tasks' side of a commit: delivery reports settled into the tasks' clocks, a refused
//! send named by the input record that made it, the tasks' changelog records written into the
//! transaction, the sends held during an overlapped commit sent, and the changelog's
//! acknowledgements handed to the tasks' state once committed. The transaction's side (the
//! producer, its reports, the commit call) is module `transaction`'s.
//!
//! Invariant: every delivery report reaches the task that made the send, if it is still here
//! (a task dropped with its aborted transaction has no claims left), in the order the
//! producer reported them; a refused send is named by its own input record or by none.

use parsley_clock::Channel;
use parsley_task::context::TaskContext;
use parsley_task::error::{Error, InputRecord, Result};
use parsley_task::error::{KafkaError, Operation, RecordError};
use parsley_task::output::HeldSend;
use parsley_task::task::Cause;
use rdkafka::{Offset, TopicPartitionList};
use tracing::warn;

use super::Tasks;
use crate::admin::Admin;
use crate::outbox::Ack;
use crate::refusal::{self, RecordShape};
use crate::stage::transaction::Transaction;

impl Tasks {
    /// Applies the delivery reports the transaction recorded so far to the tasks' clocks;
    /// `admin` reads a topic's limits to explain a refusal.
    ///
    /// # Errors
    /// For a send or changelog write the broker refused: [`RecordError::OutputRefused`] when a
    /// record of the refused batch explains the refusal alone (too large alone, a timestamp outside
    /// the topic's window: [`refusal::culprit`]), naming it and the input record that made it; else
    /// [`KafkaError::Send`].
    pub(crate) fn settle_acks(
        &mut self,
        ctx: &TaskContext,
        txn: &mut Transaction,
        admin: &Admin,
    ) -> Result<()> {
        let acks = txn.drain_acks();
        let settled = self.settle(ctx, txn, admin, &acks);
        txn.keep_acks(acks);
        settled
    }

    /// Applies drained delivery reports (see [`Tasks::settle_acks`]).
    fn settle(
        &mut self,
        ctx: &TaskContext,
        txn: &mut Transaction,
        admin: &Admin,
        acks: &[Ack],
    ) -> Result<()> {
        for (i, ack) in acks.iter().enumerate() {
            let Some(tag) = ack.tag else {
                // A changelog write: its offset moves the state store's next checkpoint.
                match ack.result {
                    Ok(offset) => txn.changelog_acked(ack.partition, offset),
                    Err(_) => return Err(self.send_failed(ctx, txn, admin, acks, i)),
                }
                continue;
            };
            // A task dropped (revoked) with its aborted transaction has no claims left.
            let Some(task) = self.tasks.get_mut(&tag.task) else {
                continue;
            };
            match ack.result {
                Ok(offset) => {
                    task.acked(tag, offset)?;
                    txn.own_write_acked(tag.channel, offset);
                }
                Err(_) => return Err(self.send_failed(ctx, txn, admin, acks, i)),
            }
        }
        Ok(())
    }

    /// The error of the failed delivery report `acks[i]`: [`RecordError::OutputRefused`] when the
    /// broker refused a record for what it is and one record among the failed reports of the
    /// same topic explains it alone, else [`KafkaError::Send`].
    fn send_failed(
        &self,
        ctx: &TaskContext,
        txn: &Transaction,
        admin: &Admin,
        acks: &[Ack],
        i: usize,
    ) -> Error {
        let ack = &acks[i];
        let source = ack
            .result
            .as_ref()
            .expect_err("a failed report")
            .error
            .clone();
        let changelog = Channel::new(txn.changelog().id, -1);
        let (topic, channel) = match ack.tag {
            Some(tag) => (ctx.topic_name(tag.channel.topic), tag.channel),
            None => (txn.changelog().name.clone(), changelog),
        };
        let code = source.rdkafka_error_code();
        let send = Error::Kafka(KafkaError::Send {
            topic: topic.clone(),
            channel: Box::new(channel),
            source: Box::new(crate::client_error::client_error(source)),
        });
        let Some(code) = code.filter(|c| refusal::is_refusal(*c)) else {
            return send;
        };
        // Every failed report of the same topic with the same code: the refused batch is
        // among them (a batch's reports arrive together).
        let same_topic = |a: &Ack| match (a.tag, ack.tag) {
            (Some(a), Some(b)) => a.channel.topic == b.channel.topic,
            (None, None) => true,
            _ => false,
        };
        let failed: Vec<(&Ack, RecordShape)> = acks
            .iter()
            .filter(|a| same_topic(a))
            .filter_map(|a| match &a.result {
                Err(f) if f.error.rdkafka_error_code() == Some(code) => Some((a, f.shape)),
                _ => None,
            })
            .collect();
        let shapes: Vec<RecordShape> = failed.iter().map(|(_, s)| *s).collect();
        let limits = match admin.topic_limits(&topic) {
            Ok(limits) => limits,
            Err(e) => {
                warn!(error = %e, %topic, "cannot read the topic's limits to explain a refusal");
                refusal::TopicLimits::default()
            }
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let Some((j, reason)) = refusal::culprit(code, &shapes, &limits, now_ms) else {
            warn!(error = %send, "the broker refused a batch that no record explains alone");
            return send;
        };
        let (culprit, shape) = &failed[j];
        let (input, dead_letter) = match culprit.tag {
            Some(tag) => match self.tasks.get(&tag.task).and_then(|t| t.cause_of_send(tag)) {
                Some(cause) => (
                    Some(Box::new(input_record(ctx, tag.task, &cause))),
                    cause.dead_letter,
                ),
                None => (None, false),
            },
            None => (None, false),
        };
        Error::Record(RecordError::OutputRefused {
            stage: ctx.stage.clone(),
            input,
            dead_letter,
            topic,
            partition: shape.partition,
            reason: Box::new(reason),
        })
    }

    /// Writes every task's changelog records in the open transaction and returns the input
    /// offsets to commit with them.
    pub(crate) fn write_changelog(
        &mut self,
        ctx: &TaskContext,
        txn: &Transaction,
        timeout: std::time::Duration,
    ) -> Result<TopicPartitionList> {
        let mut offsets = TopicPartitionList::new();
        for task in self.tasks.values_mut() {
            let mut writer = txn.changelog_writer(task.partition(), timeout);
            let written = task
                .write_changelog(ctx, &mut writer)
                .map_err(|e| e.refused_in(&ctx.stage, None, false))?;
            for (channel, next) in written {
                offsets
                    .add_partition_offset(
                        &ctx.source_of(channel)?.name,
                        channel.partition,
                        Offset::Offset(next),
                    )
                    .map_err(|e| crate::client_error::kafka(Operation::BuildOffsetsToCommit, e))?;
            }
        }
        Ok(offsets)
    }

    /// Committed: what the tasks wrote to the changelog may reach their state store, up to
    /// what the transaction saw acknowledged.
    pub(crate) fn committed(&mut self, txn: &Transaction) -> Result<()> {
        for (partition, task) in &mut self.tasks {
            task.committed(txn.changelog_next(*partition))?;
        }
        Ok(())
    }

    /// Sends into `txn`, in the order made, what the tasks made while the last commit was in
    /// flight. A refused send releases its claim in its task's clock.
    pub(crate) fn send_held(
        &mut self,
        ctx: &TaskContext,
        txn: &mut Transaction,
        mut held: Vec<HeldSend>,
    ) -> Result<()> {
        let result = self.send_each(ctx, txn, &mut held);
        held.clear();
        txn.keep_spare_held(held);
        result
    }

    /// Sends and takes out each of `held`, in order; stops at the first refused.
    fn send_each(
        &mut self,
        ctx: &TaskContext,
        txn: &mut Transaction,
        held: &mut Vec<HeldSend>,
    ) -> Result<()> {
        for record in held.drain(..) {
            let tag = record.tag();
            if let Err(err) = record.send_to(txn) {
                let mut cause = None;
                if let Some(task) = self.tasks.get_mut(&tag.task) {
                    task.send_failed(tag)?;
                    cause = task.cause_of_send(tag);
                }
                let input = cause.as_ref().map(|c| input_record(ctx, tag.task, c));
                let dead_letter = cause.is_some_and(|c| c.dead_letter);
                return Err(err.refused_in(&ctx.stage, input, dead_letter));
            }
        }
        Ok(())
    }
}

/// The input record `cause` of a send of task `task`.
fn input_record(ctx: &TaskContext, task: i32, cause: &Cause) -> InputRecord {
    InputRecord {
        topic: ctx.sources[cause.source].name.clone(),
        partition: task,
        offset: cause.offset,
    }
}
