//! The transaction: one transactional producer per stream thread (EOS v2), and the commit
//! discipline around it.
//!
//! Every commit interval one transaction commits the outputs of the deliveries since the last
//! commit, each changed task's fold state and snapshot in the stage's changelog, and, per
//! consumed channel, the first undelivered offset — records fetched but not delivered are
//! simply read again after a crash. A commit, in order: every output acknowledged (so the
//! clocks claim coordinates only), the changelog written, the offsets sent with the consumer's
//! group metadata, `EndTxn`; then the next transaction begins.
//!
//! **Two phases, overlapped.** A commit starts ([`StageRunner::start_commit`]) once a
//! transaction's outputs, changelog records and offsets are fixed: its round trips
//! (`AddOffsetsToTxn`, `TxnOffsetCommit`, `EndTxn`) run on a helper thread while the loop's
//! next turns go on polling, gating and delivering ([`StageRunner::commit_turn`]): handlers run
//! and event-time tasks park and release, but each send is stamped and held ([`Sends::Held`])
//! until the commit returns. Then a turn finishes it ([`StageRunner::finish_commit`]): the next
//! transaction begins and the held sends go first, in the order made.
//!
//! **Commit first.** A stage that reads a topic it writes commits at once, not at the
//! interval, when a gate waits on an offset its own open transaction wrote: `read_committed`
//! shows that record only after the commit ([`OwnWrites`]).
//!
//! **Recovery.** A transaction that cannot commit (timed out, a send refused) is aborted and every
//! task returns to its last commit in place; a producer fenced for its transaction's age (case C08)
//! is replaced; a fence by another process running as this instance (case C09) ends the stage with
//! [`KafkaError::Fenced`](parsley_task::error::KafkaError::Fenced). An output refused for good
//! ([`RecordError::OutputRefused`], cases C16 and C17: named from the delivery reports by
//! [`refusal::culprit`]) is never redone as it was: the redo skips or dead-letters its input record
//! under a policy that takes it, and after a batch the broker refused the producer is replaced.
//!
//! Invariant: a task's committed offsets and its last committed snapshot describe the same
//! moment — both are written in the same transaction, after its outputs are acknowledged.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parsley_clock::{Channel, Coordinate, TopicId};
use parsley_gate::Awaiting;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, debug_span, warn};

use super::StageRunner;
use super::commit_call::CommitCall;
use crate::config::StatisticsSink;
use crate::outbox::{Ack, Outbox};
use crate::refusal::{self, RecordShape};
use parsley_task::error;
use parsley_task::error::{Error, InputRecord, Result};
use parsley_task::error::{Operation, RecordError};
use parsley_task::metrics::Progress;
use parsley_task::output::{ChangelogWriter, HeldSend, Outgoing, Output};
use parsley_task::record::Work;
use parsley_task::task::{Cause, RefusedInput, Task};
use parsley_task::topic::TopicInfo;

/// Recoveries in a row, without a commit in between, before a stage gives up.
pub(crate) const MAX_RECOVERIES: u32 = 5;

/// Whether a commit may overlap its round trips with further work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overlap {
    /// Commit on a helper thread while the stream thread takes what is ready (the interval
    /// and commit-first commits).
    Yes,
    /// Commit and return: a revocation or a shutdown, after which nothing may be taken.
    No,
}

/// Where the tasks' sends go now.
#[derive(Debug)]
enum Sends {
    /// Into the open transaction.
    Open,
    /// A commit is in flight: sends are stamped and held, in the order made, for the next
    /// transaction.
    Held(Vec<HeldSend>),
}

/// A commit between its two phases: its round trips run on a helper thread.
pub(super) struct Committing {
    call: CommitCall,
    /// The loop takes what is ready meanwhile.
    overlap: bool,
    /// Nothing more is taken: the next turn waits for the call and finishes.
    draining: bool,
    /// The error of the work done meanwhile, surfaced once the commit has finished.
    overlapped: Result<()>,
    /// The work the commit makes visible.
    done: Work,
    /// When the commit started (the interval runs from here), and when its call started.
    commit_started: Instant,
    started: Instant,
    /// What the flush and the changelog write took, µs.
    flush_us: u64,
    changelog_us: u64,
}

/// A blocked head that waits on the open transaction's own write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnWait {
    /// The waiting record.
    pub head: Coordinate,
    /// The coordinate it waits for, at or beyond an offset the open transaction wrote.
    pub awaits: Coordinate,
}

/// The lowest offset the open transaction wrote on each channel of a topic the stage both
/// reads and writes (a loop through itself), from the acks.
///
/// Invariant: cleared when a transaction begins; holds acked writes only (an unacked send's
/// offset is unknown, and the next batch looks again).
#[derive(Debug, Default)]
pub(crate) struct OwnWrites {
    /// The looped topics; empty for most stages, which then never look for waits.
    looped: Vec<TopicId>,
    lowest: BTreeMap<Channel, i64>,
}

impl OwnWrites {
    /// Tracks the writes of the open transaction to `looped` topics.
    pub(crate) fn new(looped: Vec<TopicId>) -> Self {
        OwnWrites {
            looped,
            lowest: BTreeMap::new(),
        }
    }

    /// A send of the open transaction was acknowledged at `offset` on `channel`.
    pub(crate) fn acked(&mut self, channel: Channel, offset: i64) {
        if self.looped.contains(&channel.topic) {
            let lowest = self.lowest.entry(channel).or_insert(offset);
            *lowest = (*lowest).min(offset);
        }
    }

    /// A new transaction began.
    pub(crate) fn clear(&mut self) {
        self.lowest.clear();
    }

    /// The commit-first decision: a blocked head of `tasks` whose gate awaits a frontier at or
    /// beyond an offset that the open transaction wrote on the same channel, if any.
    pub(crate) fn awaited<'a>(&self, tasks: impl IntoIterator<Item = &'a Task>) -> Option<OwnWait> {
        if self.lowest.is_empty() {
            return None;
        }
        tasks.into_iter().find_map(|task| {
            task.gate()
                .blocked_heads()
                .into_iter()
                .find_map(|b| match b.awaits {
                    Awaiting::Frontier(c)
                        if self
                            .lowest
                            .get(&c.channel)
                            .is_some_and(|&lowest| c.offset >= lowest) =>
                    {
                        Some(OwnWait {
                            head: b.head,
                            awaits: c,
                        })
                    }
                    _ => None,
                })
        })
    }
}

/// The stream thread's producer and the state of its open transaction.
pub(crate) struct Transaction {
    outbox: Outbox,
    /// The producer's configuration, to make a new one after a fatal producer error.
    producer_config: ClientConfig,
    statistics: Option<StatisticsSink>,
    /// The stage's changelog: task state and Parsley's own state.
    changelog: TopicInfo,
    sends: Sends,
    /// When the open transaction began: a fence seen before `transaction.timeout.ms` has passed
    /// since cannot be the coordinator's (case C09,
    /// [`KafkaError::Fenced`](parsley_task::error::KafkaError::Fenced)).
    began: Instant,
    /// When the last commit started (the interval runs from the start of a commit).
    last_commit: Instant,
    /// Work done in the open transaction.
    uncommitted: Work,
    own_writes: OwnWrites,
    timeout: Duration,
    /// Per changelog partition, the offset after the last changelog record acknowledged.
    changelog_next: BTreeMap<i32, i64>,
    /// The delivery reports being settled, kept across drains for its capacity.
    acks: Vec<Ack>,
    /// The buffer the next overlapped commit holds its sends in, empty, kept across commits
    /// for its capacity (it grows to a commit interval's sends; grown afresh each time, its
    /// pages were faulted in again at every commit).
    spare_held: Vec<HeldSend>,
    /// The commit in flight, between its two phases.
    committing: Option<Committing>,
}

impl Transaction {
    /// A transactional producer for `producer_config`, its transactions initialised.
    ///
    /// # Errors
    /// When the producer cannot be created or its transactions initialised within `timeout`.
    pub(crate) fn producer(
        producer_config: &ClientConfig,
        statistics: Option<StatisticsSink>,
        timeout: Duration,
    ) -> Result<Outbox> {
        let outbox = Outbox::new(producer_config, statistics)?;
        outbox.init_transactions(timeout)?;
        Ok(outbox)
    }

    /// The transaction state around `outbox` (no transaction begun yet).
    pub(crate) fn new(
        outbox: Outbox,
        producer_config: ClientConfig,
        statistics: Option<StatisticsSink>,
        changelog: TopicInfo,
        own_writes: OwnWrites,
        timeout: Duration,
    ) -> Self {
        Transaction {
            outbox,
            producer_config,
            statistics,
            changelog,
            sends: Sends::Open,
            began: Instant::now(),
            last_commit: Instant::now(),
            uncommitted: Work::default(),
            own_writes,
            timeout,
            changelog_next: BTreeMap::new(),
            acks: Vec::new(),
            spare_held: Vec::new(),
            committing: None,
        }
    }

    /// The changelog topic's name.
    pub(crate) fn changelog_name(&self) -> &str {
        &self.changelog.name
    }

    /// The changelog topic.
    pub(crate) fn changelog(&self) -> &TopicInfo {
        &self.changelog
    }

    /// A commit is in flight (between its two phases).
    pub(crate) fn committing(&self) -> bool {
        self.committing.is_some()
    }

    /// Time left until the commit interval `interval` is due.
    pub(crate) fn until_due(&self, interval: Duration) -> Duration {
        interval.saturating_sub(self.last_commit.elapsed())
    }

    /// Adds work done in the open transaction.
    pub(crate) fn add(&mut self, work: Work) {
        self.uncommitted += work;
    }

    /// Begins the next transaction; returns what was held while a commit was in flight, to
    /// send first.
    ///
    /// # Errors
    /// The producer's.
    pub(crate) fn begin(&mut self) -> Result<Vec<HeldSend>> {
        self.began = Instant::now();
        self.own_writes.clear();
        self.outbox
            .producer()
            .begin_transaction()
            .map_err(|e| crate::client_error::kafka(Operation::BeginTransaction, e))?;
        Ok(match std::mem::replace(&mut self.sends, Sends::Open) {
            Sends::Open => Vec::new(),
            Sends::Held(held) => held,
        })
    }

    /// Waits until every send so far has a delivery report (recorded, not settled).
    ///
    /// # Errors
    /// [`KafkaError::Timeout`](parsley_task::error::KafkaError::Timeout) when they do not arrive
    /// within `timeout`.
    pub(crate) fn flush(&self, timeout: Duration) -> Result<()> {
        self.outbox.flush(timeout)
    }

    /// Aborts the open transaction when a stage ends with an error (best effort).
    pub(crate) fn abort(&self) {
        let _ = self.outbox.abort_transaction(self.timeout);
    }

    /// The producer's `message.max.bytes`.
    fn message_max_bytes(&self) -> u64 {
        self.producer_config
            .get("message.max.bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(refusal::DEFAULT_MESSAGE_MAX_BYTES)
    }

    /// `e`, or [`RecordError::OutputRefused`] when it is librdkafka's `MSG_SIZE_TOO_LARGE` from
    /// `produce()` for the record of `shape` (it will never fit the producer's
    /// `message.max.bytes`). The stage and the input record are named by the caller
    /// ([`Error::refused_in`]). librdkafka does not mark the transaction for abort for a
    /// record it refuses in `produce()`: the caller must not commit it.
    fn refused_by_producer(&self, e: Error, shape: &RecordShape) -> Error {
        match e {
            Error::Kafka(error::KafkaError::Send {
                topic,
                channel,
                source,
            }) if matches!(
                source
                    .library_error()
                    .and_then(|e| e.downcast_ref::<KafkaError>()),
                Some(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageSizeTooLarge
                ))
            ) =>
            {
                Error::Record(RecordError::OutputRefused {
                    stage: String::new(),
                    input: None,
                    dead_letter: false,
                    topic,
                    partition: channel.partition,
                    reason: Box::new(refusal::too_large_for_producer(
                        shape,
                        self.message_max_bytes(),
                    )),
                })
            }
            other => other,
        }
    }
}

impl Output for Transaction {
    fn send(&mut self, r: Outgoing<'_>) -> Result<()> {
        match &mut self.sends {
            Sends::Open => {
                let headers: Vec<(&str, Option<&[u8]>)> = r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_ref(), v.as_deref()))
                    .collect();
                let value_len = r.value.as_ref().map(Vec::len);
                let sent = self.outbox.send(
                    &r.topic,
                    r.tag,
                    r.key.as_deref(),
                    r.value,
                    r.stamp,
                    &headers,
                    r.timestamp,
                    self.timeout,
                );
                sent.map_err(|e| {
                    let stamp = (parsley_clock::STAMP_HEADER.len(), Some(r.stamp.len()));
                    let shape = RecordShape::new(
                        r.tag.channel.partition,
                        r.key.as_ref().map(Vec::len),
                        value_len,
                        std::iter::once(stamp)
                            .filter(|_| !r.stamp.is_empty())
                            .chain(headers.iter().map(|(k, v)| (k.len(), v.map(<[u8]>::len)))),
                        r.timestamp,
                    );
                    self.refused_by_producer(e, &shape)
                })
            }
            Sends::Held(held) => {
                held.push(HeldSend::hold(r));
                Ok(())
            }
        }
    }
}

/// The changelog partition of one task, in the open transaction. Its records are all written
/// through one writer per transaction (`write_changelog`), the first of them naming the
/// producer.
struct TaskChangelog<'a> {
    txn: &'a Transaction,
    channel: Channel,
    timeout: Duration,
    /// A record was written: the transaction's first on this partition named the producer.
    named: bool,
}

impl ChangelogWriter for TaskChangelog<'_> {
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        let txn = self.txn;
        let name_writer = !std::mem::replace(&mut self.named, true);
        txn.outbox
            .send_changelog(
                self.channel,
                &txn.changelog.name,
                key,
                value,
                name_writer,
                self.timeout,
            )
            .map_err(|e| {
                let shape = RecordShape::new(
                    self.channel.partition,
                    Some(key.len()),
                    value.map(<[u8]>::len),
                    [],
                    None,
                );
                txn.refused_by_producer(e, &shape)
            })
    }
}

impl StageRunner {
    /// The commit due now, if any: the interval has passed, or a gate waits on the open
    /// transaction's own write (commit first: waiting for the interval would hold the head up
    /// to a whole interval for nothing, and forever with no interval), or a tick of the open
    /// transaction would release a parked record (module `task::ticks`: it counts only once
    /// committed).
    pub(super) fn commit_if_due(&mut self) -> Result<()> {
        if self.txn.last_commit.elapsed() >= self.config.commit_interval {
            return self.start_commit(Overlap::Yes);
        }
        if let Some(wait) = self.txn.own_writes.awaited(self.tasks.values()) {
            debug!(
                head = %wait.head,
                awaits = %wait.awaits,
                "commit first: a gate waits on the open transaction's own write"
            );
            self.metrics.own_write_commit();
            return self.start_commit(Overlap::Yes);
        }
        if let Some((partition, tick_ms)) = self
            .tasks
            .values()
            .find_map(|t| Some((t.partition(), t.open_tick_releases()?)))
        {
            debug!(
                partition,
                tick_ms, "commit first: the open transaction's tick would release a parked record"
            );
            self.metrics.tick_commit();
            return self.start_commit(Overlap::Yes);
        }
        Ok(())
    }

    /// Applies the delivery reports recorded so far to the tasks' clocks.
    ///
    /// # Errors
    /// For a send or changelog write the broker refused: [`RecordError::OutputRefused`] when a
    /// record of the refused batch explains the refusal alone (too large alone, a timestamp outside
    /// the topic's window: [`refusal::culprit`]), naming it and the input record that made it; else
    /// [`KafkaError::Send`](parsley_task::error::KafkaError::Send).
    pub(super) fn settle_acks(&mut self) -> Result<()> {
        let mut acks = std::mem::take(&mut self.txn.acks);
        self.txn.outbox.drain_into(&mut acks);
        let settled = self.settle(&acks);
        self.txn.acks = acks;
        settled
    }

    /// Applies drained delivery reports (see [`StageRunner::settle_acks`]).
    fn settle(&mut self, acks: &[Ack]) -> Result<()> {
        for (i, ack) in acks.iter().enumerate() {
            let Some(tag) = ack.tag else {
                // A changelog write: its offset moves the state store's next checkpoint.
                match ack.result {
                    Ok(offset) => {
                        let next = self.txn.changelog_next.entry(ack.partition).or_default();
                        *next = (*next).max(offset + 1);
                    }
                    Err(_) => return Err(self.send_failed(acks, i)),
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
                    self.txn.own_writes.acked(tag.channel, offset);
                }
                Err(_) => return Err(self.send_failed(acks, i)),
            }
        }
        Ok(())
    }

    /// The error of the failed delivery report `acks[i]`: [`RecordError::OutputRefused`] when the
    /// broker refused a record for what it is and one record among the failed reports of the same
    /// topic explains it alone, else [`KafkaError::Send`](parsley_task::error::KafkaError::Send).
    fn send_failed(&self, acks: &[Ack], i: usize) -> Error {
        let ack = &acks[i];
        let source = ack
            .result
            .as_ref()
            .expect_err("a failed report")
            .error
            .clone();
        let changelog = Channel::new(self.txn.changelog.id, -1);
        let (topic, channel) = match ack.tag {
            Some(tag) => (self.ctx.topic_name(tag.channel.topic), tag.channel),
            None => (self.txn.changelog.name.clone(), changelog),
        };
        let code = source.rdkafka_error_code();
        let send = Error::Kafka(error::KafkaError::Send {
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
        let limits = match self.evidence.admin().topic_limits(&topic) {
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
                    Some(Box::new(self.input_record(tag.task, &cause))),
                    cause.dead_letter,
                ),
                None => (None, false),
            },
            None => (None, false),
        };
        Error::Record(RecordError::OutputRefused {
            stage: self.ctx.stage.clone(),
            input,
            dead_letter,
            topic,
            partition: shape.partition,
            reason: Box::new(reason),
        })
    }

    /// The input record `cause` of a send of task `task`.
    fn input_record(&self, task: i32, cause: &Cause) -> InputRecord {
        InputRecord {
            topic: self.ctx.sources[cause.source].name.clone(),
            partition: task,
            offset: cause.offset,
        }
    }

    /// Commits the open transaction and begins the next one, without overlap: both phases at
    /// once ([`StageRunner::start_commit`], [`StageRunner::finish_commit`]). For a revocation or
    /// a shutdown, after which nothing may be taken; a commit already in flight finishes first.
    pub(super) fn commit(&mut self) -> Result<()> {
        if self.txn.committing.is_some() {
            self.finish_commit()?;
        }
        self.start_commit(Overlap::No)?;
        if self.txn.committing.is_some() {
            self.finish_commit()?;
        }
        Ok(())
    }

    /// The first phase of a commit: every output acknowledged, the changelog written, then the
    /// offsets and `EndTxn` started on a helper thread ([`CommitCall`]). With [`Overlap::Yes`]
    /// and no shutdown pending, the loop's next turns take what is ready while the call runs
    /// ([`StageRunner::commit_turn`]), their sends held for the next transaction; without, the
    /// caller finishes at once. Nothing to commit: the interval restarts, and no commit is in
    /// flight.
    pub(super) fn start_commit(&mut self, overlap: Overlap) -> Result<()> {
        // The interval runs from the start of a commit, as Kafka Streams counts
        // `commit.interval.ms`: a record that arrives during a commit waits for that commit and
        // at most one interval after its start, not a whole interval after its end.
        let commit_started = Instant::now();
        let _span = debug_span!("commit").entered();
        self.publish_frontier_lag();
        if self.txn.uncommitted.is_empty() && !self.tasks.values().any(Task::position_moved) {
            self.txn.last_commit = commit_started;
            return Ok(());
        }
        let flush_started = Instant::now();
        self.txn.outbox.flush(self.config.timeout)?;
        let flush_us = flush_started.elapsed().as_micros() as u64;
        self.settle_acks()?;
        let changelog_started = Instant::now();
        let offsets = self.write_changelog()?;
        #[cfg(feature = "fault-injection")]
        if self.txn.uncommitted.deliveries > 0 {
            crate::fault::reached(
                self.config.crash_point(),
                crate::fault::CrashPoint::AfterChangelog,
                || self.txn.outbox.flush(self.config.timeout),
            )?;
        }
        let metadata = self.intake.group_metadata()?;
        let changelog_us = changelog_started.elapsed().as_micros() as u64;
        let started = Instant::now();
        // Counted from here: what an overlapped commit takes belongs to the next transaction.
        let done = std::mem::take(&mut self.txn.uncommitted);
        for task in self.tasks.values_mut() {
            task.tick_committing();
        }
        let overlap = overlap == Overlap::Yes && !self.shutdown.load(Ordering::Relaxed);
        if !overlap {
            self.txn.outbox.flush(self.config.timeout)?;
        }
        // Waiting longer than the transaction timeout is pointless: by then the coordinator
        // has aborted the transaction, and the commit can only fail.
        let timeout = self.config.timeout.min(self.config.transaction_timeout());
        // The changelog's sends are not waited for when the commit overlaps: the helper's
        // commit flushes them, and this thread serves their delivery reports between the
        // batches it takes meanwhile.
        let call = CommitCall::start(
            &self.ctx.stage,
            self.txn.outbox.shared_producer(),
            offsets,
            metadata,
            timeout,
        )?;
        if overlap {
            self.txn.sends = Sends::Held(std::mem::take(&mut self.txn.spare_held));
        }
        self.txn.committing = Some(Committing {
            call,
            overlap,
            draining: !overlap,
            overlapped: Ok(()),
            done,
            commit_started,
            started,
            flush_us,
            changelog_us,
        });
        Ok(())
    }

    /// One turn of the loop while a commit is in flight: the call's bound checked, the
    /// changelog's delivery reports served, and what is ready taken
    /// ([`StageRunner::overlap_batch`]); once the call has returned or nothing is ready, the
    /// commit finishes ([`StageRunner::finish_commit`]).
    ///
    /// # Errors
    /// [`KafkaError::TransactionStalled`](parsley_task::error::KafkaError::TransactionStalled) when
    /// the call ran past its bound (the commit is dropped, and the recovery replaces the producer);
    /// [`StageRunner::finish_commit`]'s.
    pub(super) fn commit_turn(&mut self) -> Result<()> {
        let Some(committing) = self.txn.committing.as_mut() else {
            return Ok(());
        };
        if !committing.draining && !committing.call.finished() {
            if let Err(stalled) = committing.call.check() {
                self.txn.committing = None;
                return Err(stalled);
            }
            // The commit's flush waits for the changelog's delivery reports: served between
            // batches.
            self.txn.outbox.serve();
            let taken = if self.shutdown.load(Ordering::Relaxed) {
                Ok(false)
            } else {
                self.overlap_batch()
            };
            let committing = self.txn.committing.as_mut().expect("a commit in flight");
            match taken {
                Ok(true) => return Ok(()),
                Ok(false) => committing.draining = true,
                Err(e) => {
                    committing.draining = true;
                    committing.overlapped = Err(e);
                }
            }
        }
        self.finish_commit()
    }

    /// The second phase of a commit: waits for the call (woken by the helper when it returns,
    /// and at least every 100 ms to check its bound), then the changelog's acknowledgements
    /// reach the tasks' state, the metrics and the observer hear of the commit, the next
    /// transaction begins (after an overlapped commit even if a shutdown arrived meanwhile: the
    /// work done during the commit goes into it, and the shutdown commits it) and the sends held
    /// meanwhile go first. An error of the work done during the commit surfaces last, with the
    /// next transaction open: the recovery aborts it and returns the tasks to the commit just
    /// made.
    ///
    /// # Errors
    /// The call's
    /// ([`KafkaError::TransactionStalled`](parsley_task::error::KafkaError::TransactionStalled)
    /// past its bound); the acknowledgements'; the next transaction's; the overlapped work's; a
    /// held send's.
    pub(super) fn finish_commit(&mut self) -> Result<()> {
        let Some(mut committing) = self.txn.committing.take() else {
            return Ok(());
        };
        let call = &mut committing.call;
        while !self
            .txn
            .outbox
            .wait_until(Duration::from_millis(100), |_| call.finished())
        {
            call.check()?;
        }
        committing.call.result()?;
        self.txn.outbox.wait_acked(self.config.timeout)?;
        self.settle_acks()?;
        // Committed: what the tasks wrote to the changelog may reach their state store.
        for (partition, task) in &mut self.tasks {
            task.committed(self.txn.changelog_next.get(partition).copied())?;
        }
        let done = &committing.done;
        let commit_us = committing.commit_started.elapsed().as_micros() as u64;
        self.metrics
            .committed(done.deliveries, done.emissions, commit_us);
        debug!(
            deliveries = done.deliveries,
            emissions = done.emissions,
            took_us = committing.started.elapsed().as_micros() as u64,
            flush_us = committing.flush_us,
            changelog_us = committing.changelog_us,
            poll_batches = self.intake.epoch(),
            "committed"
        );
        if let Some(o) = &self.observer {
            let _ = o.send(Progress::Committed {
                stage: self.spec.name().to_string(),
                metrics: self.metrics.snapshot(),
            });
        }
        let mut held = Vec::new();
        if committing.overlap || !self.shutdown.load(Ordering::Relaxed) {
            held = self.txn.begin()?;
        }
        self.txn.last_commit = committing.commit_started;
        committing.overlapped?;
        self.send_held(held)
    }

    /// Writes every task's changelog records in the open transaction and returns the input
    /// offsets to commit with them.
    fn write_changelog(&mut self) -> Result<TopicPartitionList> {
        let mut offsets = TopicPartitionList::new();
        for task in self.tasks.values_mut() {
            let mut writer = TaskChangelog {
                txn: &self.txn,
                channel: Channel::new(self.txn.changelog.id, task.partition()),
                timeout: self.config.timeout,
                named: false,
            };
            let written = task
                .write_changelog(&self.ctx, &mut writer)
                .map_err(|e| e.refused_in(&self.ctx.stage, None, false))?;
            for (channel, next) in written {
                offsets
                    .add_partition_offset(
                        &self.ctx.source_of(channel)?.name,
                        channel.partition,
                        Offset::Offset(next),
                    )
                    .map_err(|e| crate::client_error::kafka(Operation::BuildOffsetsToCommit, e))?;
            }
        }
        Ok(offsets)
    }

    /// Sends, in the order made, what the tasks made while the last commit was in flight. A
    /// refused send releases its claim in its task's clock.
    fn send_held(&mut self, mut held: Vec<HeldSend>) -> Result<()> {
        let result = self.send_each(&mut held);
        held.clear();
        if held.capacity() > self.txn.spare_held.capacity() {
            self.txn.spare_held = held;
        }
        result
    }

    /// Sends and takes out each of `held`, in order; stops at the first refused.
    fn send_each(&mut self, held: &mut Vec<HeldSend>) -> Result<()> {
        for record in held.drain(..) {
            let tag = record.tag();
            if let Err(err) = record.send_to(&mut self.txn) {
                let mut cause = None;
                if let Some(task) = self.tasks.get_mut(&tag.task) {
                    task.send_failed(tag)?;
                    cause = task.cause_of_send(tag);
                }
                let input = cause.as_ref().map(|c| self.input_record(tag.task, c));
                let dead_letter = cause.is_some_and(|c| c.dead_letter);
                return Err(err.refused_in(&self.ctx.stage, input, dead_letter));
            }
        }
        Ok(())
    }

    /// Aborts the open transaction and returns every task to its last commit: restored from
    /// the changelog at the group's committed offsets (read with `require_stable`), the
    /// consumer sought back there, fetch evidence dropped (the book's specification, §7). The input
    /// records whose outputs were refused for good stay refused in the restored tasks, `refused`
    /// (the one `cause` names) among them.
    ///
    /// # Errors
    /// [`KafkaError::Fenced`](parsley_task::error::KafkaError::Fenced) when another process running
    /// as this instance fenced the producer; the abort's own error when the producer cannot abort
    /// otherwise; the restore's errors.
    pub(super) fn recover(&mut self, cause: &Error, refused: Option<RefusedInput>) -> Result<()> {
        warn!(error = %cause, "aborting the transaction; every task returns to its last commit");
        // A commit in flight is given up with the transaction.
        self.txn.committing = None;
        let stalled = matches!(
            cause,
            Error::Kafka(error::KafkaError::TransactionStalled { .. })
        );
        let aborted = (!stalled).then(|| self.txn.outbox.abort_transaction(self.config.timeout));
        // librdkafka refuses the abort while a call it timed out is still at work in the
        // background ("retry call to resume": a commit whose EndTxn is waiting for a
        // coordinator), as while a call has not returned at all.
        let in_progress = matches!(
            &aborted,
            Some(Err(KafkaError::Transaction(t))) if t.code() == RDKafkaErrorCode::Conflict
        );
        if stalled || in_progress {
            // A new producer takes the transactional id; initialising it lets the coordinator
            // finish or abort what the old one left open, and the tasks restart from whatever
            // the group's committed offsets then say. The old producer is freed when its last
            // call returns.
            warn!("a transactional call is still in progress: replacing the producer");
            self.replace_producer()?;
        } else if let Some(aborted) = aborted {
            self.after_abort(cause, aborted)?;
        }
        self.restart_from_last_commit(refused)
    }

    /// A new producer for the transactional id in place of this one (a new epoch: initialising
    /// it fences the old one and lets the coordinator finish or abort what it left open).
    fn replace_producer(&mut self) -> Result<()> {
        self.txn.outbox = Transaction::producer(
            &self.txn.producer_config,
            self.txn.statistics.clone(),
            self.config.timeout,
        )?;
        Ok(())
    }

    /// What follows an abort of the open transaction: on success, the reports awaited and the
    /// outbox emptied (the producer replaced after a batch the broker refused); a fenced or failed
    /// producer replaced, or the stage ended with
    /// [`KafkaError::Fenced`](parsley_task::error::KafkaError::Fenced) when another process runs as
    /// this instance.
    fn after_abort(
        &mut self,
        cause: &Error,
        aborted: std::result::Result<(), KafkaError>,
    ) -> Result<()> {
        match aborted {
            Ok(()) => {
                self.txn.outbox.wait_acked(self.config.timeout)?;
                self.txn.outbox.discard();
                if let Error::Record(RecordError::OutputRefused { reason, .. }) = cause
                    && reason.by_broker()
                {
                    // librdkafka keeps counting the sequence numbers of the batch the broker
                    // refused, so the next transaction's first send to that partition would be
                    // refused as OUT_OF_ORDER_SEQUENCE_NUMBER and aborted in turn. A new
                    // producer takes the transactional id (a new epoch, sequences from 0).
                    warn!("the broker refused a batch: replacing the producer");
                    self.replace_producer()?;
                }
            }
            Err(rdkafka::error::KafkaError::Transaction(t)) if t.is_fatal() => {
                // Fenced: the coordinator bumped the epoch (it aborted a timed-out transaction,
                // case C08) or another producer took the transactional id (case C09); librdkafka
                // reports both as `_FENCED`. The transaction's age tells them apart: the
                // coordinator aborts only a transaction open longer than its timeout, counted
                // from its first partition, which is after `begin`. A younger one was fenced by
                // another process running as this instance: this stage is the zombie and gives
                // up its tasks; taking the id back would fence the live owner in turn.
                let open = self.txn.began.elapsed();
                let timeout = self.config.transaction_timeout();
                if crate::client_error::fencing(t.code()) && open < timeout {
                    let group = self.spec.group_id(&self.app);
                    return Err(Error::Kafka(error::KafkaError::Fenced {
                        transactional_id: self.config.transactional_id(&group),
                        open_ms: open.as_millis() as u64,
                        timeout_ms: timeout.as_millis() as u64,
                        message: t.to_string(),
                    }));
                }
                // A timed-out transaction (or another fatal producer error): this producer is
                // done; a new one takes the id (initialising it completes or aborts whatever
                // the old one left open), and the tasks are rebuilt from the last commit. If
                // the group moved them elsewhere, the next commit is refused and the rebalance
                // hands them over.
                warn!(error = %t, open_ms = open.as_millis() as u64, "the producer is fenced or failed: replacing it");
                self.replace_producer()?;
            }
            Err(e) => {
                return Err(Error::from(
                    crate::client_error::client(Operation::AbortAfter, e).with_cause(&cause),
                ));
            }
        }
        Ok(())
    }

    /// Every task back to its last commit after an abort: the consumer sought back to the
    /// group's committed offsets, each task restored from the changelog, `refused` inputs
    /// kept refused, and a new transaction begun.
    fn restart_from_last_commit(&mut self, refused: Option<RefusedInput>) -> Result<()> {
        self.metrics.aborted();
        self.txn.uncommitted = Work::default();
        // A record held behind a rebalance event is read again from the committed offsets.
        self.intake.drop_deferred();
        self.txn.sends = Sends::Open;
        let positions = self.intake.start_positions()?;
        self.intake.resume_all(&self.ctx)?;
        let mut refused: Vec<RefusedInput> = self
            .tasks
            .values_mut()
            .flat_map(Task::take_refused)
            .chain(refused)
            .collect();
        self.tasks.clear();
        let mut by_task: BTreeMap<i32, Vec<(Channel, i64)>> = BTreeMap::new();
        for (topic, partition, position) in positions {
            let source = self.ctx.source_index(&topic)?;
            let channel = Channel::new(self.ctx.sources[source].id, partition);
            self.intake
                .seek(&self.ctx, channel, position, self.config.timeout)?;
            by_task
                .entry(partition)
                .or_default()
                .push((channel, position));
        }
        for (partition, positions) in by_task {
            let mut task = self.restore_task(partition, positions)?;
            task.refuse(refused.extract_if(.., |r| r.input.partition == partition));
            self.tasks.insert(partition, task);
        }
        // Nothing was held (the sends were dropped above).
        self.txn.begin()?;
        self.txn.last_commit = Instant::now();
        Ok(())
    }
}
