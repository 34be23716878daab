//! What a task does with what it cannot take as it is: impossible stamps and bad records under
//! the stage's policies (dead letters among them), keys on the wrong partition, and input
//! records whose outputs the cluster refused for good.
//!
//! Invariant: a record the policy takes counts as processed — observed by the node clock, its
//! offset committed with the transaction that took it — and changes no fold state.

use super::*;
use crate::error::{RecordError, SetupError};
use crate::topic::partition_by;
use parsley_stage::KeyPartitioning;

/// Checks that a delivered record of source `source` with key `key` is on the partition the
/// source's declared partitioner gives its key ([`parsley_stage::KeyPartitioning`]; case C20).
///
/// # Errors
/// [`RecordError::KeyPartitionMismatch`] naming the record, its key, the partition expected
/// and the partitioner, murmur2 or CRC32, that puts the key where it is, if one does.
pub(super) fn check_key(
    ctx: &TaskContext,
    source: usize,
    partition: i32,
    offset: i64,
    key: &[u8],
) -> Result<()> {
    let partitioner = ctx.key_partitioning[source];
    let partitions = ctx.sources[source].partitions;
    let Some(expected) = partition_by(partitioner, key, partitions) else {
        return Ok(()); // unchecked
    };
    if expected == partition {
        return Ok(());
    }
    let matches = [KeyPartitioning::Murmur2, KeyPartitioning::Crc32]
        .into_iter()
        .find(|p| *p != partitioner && partition_by(*p, key, partitions) == Some(partition));
    Err(Error::Record(RecordError::KeyPartitionMismatch {
        stage: ctx.stage.clone(),
        topic: ctx.sources[source].name.clone(),
        partition,
        offset,
        key: crate::error::render_key(key),
        partitioner,
        expected,
        partitions,
        matches,
    }))
}

/// The input record whose delivery made a run of sends ([`Task::cause_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cause {
    /// Index of its source topic in [`TaskContext::sources`].
    pub source: usize,
    /// Its offset.
    pub offset: i64,
    /// The sends are its dead letter.
    pub dead_letter: bool,
}

/// An input record one of whose outputs was refused for good ([`RecordError::OutputRefused`]),
/// under a bad-record policy that takes it: the redo applies the policy to it instead of
/// handling it ([`BadRecordKind::OutputRefused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedInput {
    /// Index of its source topic in [`TaskContext::sources`].
    pub source: usize,
    /// Its offset.
    pub offset: i64,
    /// The stage.
    pub stage: String,
    /// The input record, named.
    pub input: InputRecord,
    /// The refused output's topic and partition.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Why it was refused.
    pub reason: Refusal,
    /// The policy took it in the open transaction: dropped once that commits.
    pub(super) used: bool,
}

impl RefusedInput {
    /// The input of `error` (an [`RecordError::OutputRefused`] of an output, not of a dead letter,
    /// with its input known), read from source `source`.
    pub fn of(error: &Error, source: usize) -> Option<Self> {
        match error {
            Error::Record(RecordError::OutputRefused {
                stage,
                input: Some(input),
                dead_letter: false,
                topic,
                partition,
                reason,
            }) => Some(RefusedInput {
                source,
                offset: input.offset,
                stage: stage.clone(),
                input: (**input).clone(),
                topic: topic.clone(),
                partition: *partition,
                reason: (**reason).clone(),
                used: false,
            }),
            _ => None,
        }
    }

    /// The error it was refused with.
    pub(super) fn error(&self) -> Error {
        Error::Record(RecordError::OutputRefused {
            stage: self.stage.clone(),
            input: Some(Box::new(self.input.clone())),
            dead_letter: false,
            topic: self.topic.clone(),
            partition: self.partition,
            reason: Box::new(self.reason.clone()),
        })
    }
}

impl Task {
    /// The input record whose delivery made send `seq` of this task, if the send is not
    /// known to be acknowledged yet.
    pub fn cause_of(&self, seq: u64) -> Option<Cause> {
        let after = self.causes.partition_point(|(first, _)| *first <= seq);
        after.checked_sub(1).map(|i| self.causes[i].1)
    }

    /// The input record whose delivery made the send `tag`, if known; `None` for a tick of the
    /// built-in clock (no input record made it).
    pub fn cause_of_send(&self, tag: SendTag) -> Option<Cause> {
        if self.is_tick(&tag) {
            return None;
        }
        self.cause_of(tag.seq)
    }

    /// Notes that the sends from the next sequence on are made for `cause`.
    pub(super) fn note_cause(&mut self, cause: Cause) {
        let first = self.clock.next_seq();
        match self.causes.back_mut() {
            Some((seq, last)) if *seq == first => *last = cause,
            _ => self.causes.push_back((first, cause)),
        }
    }

    /// Input records whose outputs were refused for good: delivered again, they go to the
    /// bad-record policy instead of the handler. Given to a task just restored by a recovery.
    pub fn refuse(&mut self, refused: impl IntoIterator<Item = RefusedInput>) {
        for mut r in refused {
            r.used = false;
            if !self.is_refused(r.source, r.offset) {
                self.refused.push(r);
            }
        }
    }

    /// Takes the refused input records, for the task that replaces this one.
    pub fn take_refused(&mut self) -> Vec<RefusedInput> {
        std::mem::take(&mut self.refused)
    }

    /// Whether the record at `offset` of source `source` is a refused input record.
    pub fn is_refused(&self, source: usize, offset: i64) -> bool {
        self.refused
            .iter()
            .any(|r| r.source == source && r.offset == offset)
    }

    /// Applies the stage's policy to the impossible stamps the gate found; a dead-lettered
    /// record goes to `out`.
    ///
    /// # Errors
    /// The policy's error ([`RecordError::ImpossibleStamp`] under `Fail`); the gate's; a refused
    /// send.
    pub fn resolve_impossible(&mut self, ctx: &TaskContext, out: &mut dyn Output) -> Result<Work> {
        let mut work = Work::default();
        for stamp in self.gate.take_impossible() {
            ctx.metrics.impossible();
            ctx.metrics
                .task(self.partition, |m| m.impossible_stamps += 1);
            let error = Error::Record(RecordError::ImpossibleStamp {
                stage: ctx.stage.clone(),
                topic: ctx.topic_name(stamp.record.channel.topic),
                stamp: Box::new(stamp),
            });
            let verdict = policy::on_impossible(&ctx.policy, error)?;
            let discarded = self
                .gate
                .resolve(stamp.record, verdict.resolution())
                .map_err(|e| ctx.gate_error(self.partition, e))?;
            if let (Some(d), policy::Impossible::DeadLetter(reason)) = (discarded, &verdict) {
                work.deliveries += 1;
                self.impossible_dead_letter(ctx, out, &d.payload, d.coordinate, reason)?;
            }
        }
        Ok(work)
    }

    /// `e`, naming the stage and the input record at `offset` of source `source` if it is an
    /// [`RecordError::OutputRefused`] of one of its outputs (or of its dead letter, `dead_letter`).
    pub(super) fn refused_output(
        &self,
        ctx: &TaskContext,
        e: Error,
        source: usize,
        offset: i64,
    ) -> Error {
        let input = InputRecord {
            topic: ctx.sources[source].name.clone(),
            partition: self.partition,
            offset,
        };
        e.refused_in(&ctx.stage, Some(input), false)
    }

    /// Sends a record whose stamp is impossible to the stage's dead-letter topic.
    pub(super) fn impossible_dead_letter(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        payload: &Payload,
        coordinate: Coordinate,
        reason: &str,
    ) -> Result<()> {
        let cause = DeadLetterCause {
            stage: &ctx.stage,
            topic: &ctx.sources[payload.source].name,
            partition: coordinate.channel.partition,
            offset: coordinate.offset,
            kind: policy::IMPOSSIBLE_STAMP_KIND,
            reason,
        };
        let record = Original {
            source: payload.source,
            offset: coordinate.offset,
            key: payload.key.as_deref(),
            value: payload.value.clone(),
            headers: Rare::headers(&payload.rare),
            timestamp: payload.record_timestamp,
        };
        self.dead_letter(out, ctx.dead_letter.as_ref(), record, &cause)?;
        ctx.metrics.dead_lettered();
        Ok(())
    }

    /// Sends `record` to the dead-letter topic `dlq`, stamped by the task, with its original
    /// key, value and headers and headers naming `cause` (module docs of `policy`).
    pub(super) fn dead_letter(
        &mut self,
        out: &mut dyn Output,
        dlq: Option<&DeadLetterTopic>,
        record: Original<'_>,
        cause: &DeadLetterCause<'_>,
    ) -> Result<()> {
        let Some(dlq) = dlq else {
            return Err(Error::Setup(SetupError::UnknownTopic {
                topic: "(no dead-letter topic)".into(),
            }));
        };
        let channel = Channel::new(
            dlq.info.id,
            partition_of(record.key, self.partition, dlq.info.partitions),
        );
        let offset = record.offset;
        self.note_cause(Cause {
            source: record.source,
            offset,
            dead_letter: true,
        });
        let stamp = self.clock.stamp(channel)?;
        let tag = SendTag {
            task: self.partition,
            channel,
            seq: stamp.sender.expect("stage stamps carry a sender").seq,
        };
        warn!(source = %cause.source(), kind = cause.kind, reason = cause.reason,
            topic = %dlq.name, "dead-lettered");
        let headers = policy::dead_letter_headers(cause, record.headers);
        let sent = out.send(Outgoing {
            topic: dlq.name.clone(),
            tag,
            key: record.key.map(<[u8]>::to_vec),
            value: record.value,
            stamp: &codec::encode(&stamp),
            headers: &headers,
            timestamp: record.timestamp,
        });
        if let Err(err) = sent {
            self.clock.failed(tag.seq, channel)?;
            let input = InputRecord {
                topic: cause.topic.to_string(),
                partition: cause.partition,
                offset,
            };
            return Err(err.refused_in(cause.stage, Some(input), true));
        }
        // Not an emission: `Work::emissions` counts what the handler sent, as the `emitted`
        // metric does; the dead letter is in `dead_lettered`, its record in `deliveries`.
        Ok(())
    }

    /// Applies the stage's bad-record policy to `record`, which failed as `kind` with
    /// `error`: the error under `Fail`; else the record counts as processed (skipped, or sent
    /// to the dead-letter topic).
    pub(super) fn bad_record(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        work: &mut Work,
        record: Original<'_>,
        kind: BadRecordKind,
        error: Error,
    ) -> Result<()> {
        ctx.metrics.bad_record(kind);
        match policy::on_bad_record(&ctx.bad_records, kind, error)? {
            Bad::Skip => ctx.metrics.skipped(),
            Bad::DeadLetter(reason) => {
                let cause = DeadLetterCause {
                    stage: &ctx.stage,
                    topic: &ctx.sources[record.source].name,
                    partition: self.partition,
                    offset: record.offset,
                    kind: kind.name(),
                    reason: &reason,
                };
                self.dead_letter(out, ctx.bad_record_dead_letter.as_ref(), record, &cause)?;
                ctx.metrics.dead_lettered();
            }
        }
        work.deliveries += 1;
        ctx.metrics.delivered();
        self.counts.delivered += 1;
        Ok(())
    }
}
