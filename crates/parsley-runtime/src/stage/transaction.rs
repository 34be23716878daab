//! The transaction: one transactional producer per stream thread (EOS v2), and the commit
//! discipline around it. [`Transaction`] owns the producer, the open transaction's state
//! (its work, its own writes, where sends go) and the commit in flight; the stream thread's
//! module `commit` runs a commit's phases through it and the tasks (module `tasks`).
//!
//! Every commit interval one transaction commits the outputs of the deliveries since the last
//! commit, each changed task's fold state and snapshot in the stage's changelog, and, per
//! consumed channel, the first undelivered offset — records fetched but not delivered are
//! simply read again after a crash. A commit, in order: every output acknowledged (so the
//! clocks claim coordinates only), the changelog written, the offsets sent with the consumer's
//! group metadata, `EndTxn`; then the next transaction begins.
//!
//! **Two phases, overlapped.** A commit starts ([`Transaction::start_commit`]) once a
//! transaction's outputs, changelog records and offsets are fixed: its round trips
//! (`AddOffsetsToTxn`, `TxnOffsetCommit`, `EndTxn`) run on a helper thread while the loop's
//! next turns go on polling, gating and delivering ([`Transaction::overlap_turn`]): handlers
//! run and event-time tasks park and release, but each send is stamped and held
//! ([`Sends::Held`]) until the commit returns. Then a turn finishes it
//! ([`Transaction::wait_commit`]): the next transaction begins and the held sends go first, in
//! the order made.
//!
//! **Commit first.** A stage that reads a topic it writes commits at once, not at the
//! interval, when a gate waits on an offset its own open transaction wrote: `read_committed`
//! shows that record only after the commit ([`OwnWrites`]).
//!
//! **Recovery.** A transaction that cannot commit (timed out, a send refused) is aborted
//! ([`Transaction::abort_for_recovery`]) and every task returns to its last commit in place; a
//! producer fenced for its transaction's age (case C08) is replaced; a fence by another process
//! running as this instance (case C09) ends the stage with
//! [`KafkaError::Fenced`](parsley_task::error::KafkaError::Fenced). An output refused for good
//! ([`RecordError::OutputRefused`], cases C16 and C17: named from the delivery reports by
//! [`refusal::culprit`]) is never redone as it was: the redo skips or dead-letters its input record
//! under a policy that takes it, and after a batch the broker refused the producer is replaced.
//!
//! Invariants:
//! - a task's committed offsets and its last committed snapshot describe the same moment —
//!   both are written in the same transaction, after its outputs are acknowledged;
//! - sends go into the open transaction exactly when no commit is in flight
//!   ([`Sends::Open`]); while one is, they are held in the order made and go first into the
//!   next transaction;
//! - the work counted as uncommitted is the open transaction's only: taken by the commit that
//!   makes it visible, forgotten with an abort.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parsley_clock::{Channel, Coordinate, TopicId};
use parsley_gate::Awaiting;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, TopicPartitionList};
use tracing::warn;

use super::commit_call::{CommitCall, NOTICE};
use super::coordinator::Coordinators;
use crate::config::StatisticsSink;
use crate::outbox::{Ack, Outbox};
use crate::refusal::{self, RecordShape};
use parsley_task::error;
use parsley_task::error::{Error, Result};
use parsley_task::error::{Operation, RecordError};
use parsley_task::output::{ChangelogWriter, HeldSend, Outgoing, Output};
use parsley_task::record::Work;
use parsley_task::task::Task;
use parsley_task::topic::TopicInfo;

/// Recoveries in a row, without a commit in between, before a stage gives up.
pub(crate) const MAX_RECOVERIES: u32 = 5;

/// Whether a commit may overlap its round trips with further work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
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
struct Committing {
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
    /// Where the coordinators a commit waits on are.
    coordinators: Coordinators,
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
        coordinators: Coordinators,
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
            coordinators,
        }
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
/// through one writer per transaction ([`Transaction::changelog_writer`]), the first of them
/// naming the producer.
pub(crate) struct TaskChangelog<'a> {
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

impl Transaction {
    /// The commit interval `interval` has passed since the last commit started.
    pub(crate) fn commit_due(&self, interval: Duration) -> bool {
        self.last_commit.elapsed() >= interval
    }

    /// The commit-first decision ([`OwnWrites::awaited`]) for `tasks`.
    pub(crate) fn own_write_awaited<'a>(
        &self,
        tasks: impl IntoIterator<Item = &'a Task>,
    ) -> Option<OwnWait> {
        self.own_writes.awaited(tasks)
    }

    /// Nothing was done in the open transaction.
    pub(crate) fn nothing_done(&self) -> bool {
        self.uncommitted.is_empty()
    }

    /// Deliveries made in the open transaction.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn deliveries(&self) -> u64 {
        self.uncommitted.deliveries
    }

    /// The producer, for a fault-injection test's producer fault.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The commit interval runs again from `at` (the start of the last commit, or of a
    /// transaction begun afresh).
    pub(crate) fn restart_interval(&mut self, at: Instant) {
        self.last_commit = at;
    }

    /// The delivery reports recorded so far, to be settled (then handed back with
    /// [`Transaction::keep_acks`], for the buffer's capacity).
    pub(crate) fn drain_acks(&mut self) -> Vec<Ack> {
        let mut acks = std::mem::take(&mut self.acks);
        self.outbox.drain_into(&mut acks);
        acks
    }

    /// Keeps the buffer of settled delivery reports for the next drain.
    pub(crate) fn keep_acks(&mut self, acks: Vec<Ack>) {
        self.acks = acks;
    }

    /// A changelog record of changelog partition `partition` was acknowledged at `offset`.
    pub(crate) fn changelog_acked(&mut self, partition: i32, offset: i64) {
        let next = self.changelog_next.entry(partition).or_default();
        *next = (*next).max(offset + 1);
    }

    /// A send of the open transaction was acknowledged at `offset` on `channel`
    /// ([`OwnWrites::acked`]).
    pub(crate) fn own_write_acked(&mut self, channel: Channel, offset: i64) {
        self.own_writes.acked(channel, offset);
    }

    /// The offset after the last changelog record acknowledged on changelog partition
    /// `partition`, if any.
    pub(crate) fn changelog_next(&self, partition: i32) -> Option<i64> {
        self.changelog_next.get(&partition).copied()
    }

    /// The writer of task `partition`'s changelog records in the open transaction.
    pub(crate) fn changelog_writer(&self, partition: i32, timeout: Duration) -> TaskChangelog<'_> {
        TaskChangelog {
            txn: self,
            channel: Channel::new(self.changelog.id, partition),
            timeout,
            named: false,
        }
    }

    /// Keeps the buffer of sends held during the last commit, emptied, for the next one, if it
    /// is the larger.
    pub(crate) fn keep_spare_held(&mut self, held: Vec<HeldSend>) {
        if held.capacity() > self.spare_held.capacity() {
            self.spare_held = held;
        }
    }

    /// The first phase's call: the work of the open transaction taken as what the commit makes
    /// visible, the outbox flushed unless the commit overlaps, and the offsets and `EndTxn` of
    /// `stage` started on a helper thread ([`CommitCall`]) within `call_timeout`; with
    /// `overlap`, the sends made meanwhile are held for the next transaction. `started` tells
    /// when the commit and its call started, and what the flush and changelog write took.
    ///
    /// # Errors
    /// The flush's; the call's start.
    pub(crate) fn start_commit(
        &mut self,
        stage: &str,
        offsets: TopicPartitionList,
        metadata: ConsumerGroupMetadata,
        overlap: bool,
        (timeout, call_timeout): (Duration, Duration),
        started: CommitStarted,
    ) -> Result<()> {
        // Counted from here: what an overlapped commit takes belongs to the next transaction.
        let done = std::mem::take(&mut self.uncommitted);
        if !overlap {
            self.outbox.flush(timeout)?;
        }
        // The changelog's sends are not waited for when the commit overlaps: the helper's
        // commit flushes them, and this thread serves their delivery reports between the
        // batches it takes meanwhile.
        let call = CommitCall::start(
            stage,
            self.outbox.shared_producer(),
            offsets,
            metadata,
            call_timeout,
        )?;
        if overlap {
            self.sends = Sends::Held(std::mem::take(&mut self.spare_held));
        }
        self.committing = Some(Committing {
            call,
            overlap,
            draining: !overlap,
            overlapped: Ok(()),
            done,
            commit_started: started.commit,
            started: started.call,
            flush_us: started.flush_us,
            changelog_us: started.changelog_us,
        });
        Ok(())
    }

    /// A turn while a commit is in flight: `true` when the loop may take what is ready (the
    /// call has not returned, nothing stopped the overlap; the call's bound checked and the
    /// changelog's delivery reports served), `false` when the commit is to be finished.
    ///
    /// # Errors
    /// [`KafkaError::TransactionStalled`](parsley_task::error::KafkaError::TransactionStalled) when
    /// the call ran past its bound (the commit is dropped, and the recovery replaces the producer).
    pub(crate) fn overlap_turn(&mut self) -> Result<bool> {
        let Some(committing) = self.committing.as_mut() else {
            return Ok(false);
        };
        if committing.draining || committing.call.finished() {
            return Ok(false);
        }
        if let Err(stalled) = check_call(&mut committing.call, &mut self.coordinators, &self.outbox)
        {
            self.committing = None;
            return Err(stalled);
        }
        // The commit's flush waits for the changelog's delivery reports: served between
        // batches.
        self.outbox.serve();
        Ok(true)
    }

    /// What a turn took while the commit is in flight: `true` to go on overlapping;
    /// otherwise nothing more is taken (the error of the work, if any, kept to surface once
    /// the commit has finished) and the commit is to be finished.
    pub(crate) fn overlapped(&mut self, taken: Result<bool>) -> bool {
        let committing = self.committing.as_mut().expect("a commit in flight");
        match taken {
            Ok(true) => return true,
            Ok(false) => committing.draining = true,
            Err(e) => {
                committing.draining = true;
                committing.overlapped = Err(e);
            }
        }
        false
    }

    /// The second phase's wait: for the call (woken by the helper when it returns, and at
    /// least every 100 ms to check its bound), then for every delivery report within
    /// `timeout`. `None` when no commit is in flight.
    ///
    /// # Errors
    /// The call's
    /// ([`KafkaError::TransactionStalled`](parsley_task::error::KafkaError::TransactionStalled)
    /// past its bound); the reports'.
    pub(crate) fn wait_commit(&mut self, timeout: Duration) -> Result<Option<Committed>> {
        let Some(mut committing) = self.committing.take() else {
            return Ok(None);
        };
        let call = &mut committing.call;
        while !self
            .outbox
            .wait_until(Duration::from_millis(100), |_| call.finished())
        {
            check_call(call, &mut self.coordinators, &self.outbox)?;
        }
        committing.call.result()?;
        self.outbox.wait_acked(timeout)?;
        self.coordinators.committed(self.outbox.producer());
        Ok(Some(Committed {
            overlap: committing.overlap,
            overlapped: committing.overlapped,
            done: committing.done,
            commit_started: committing.commit_started,
            call_started: committing.started,
            flush_us: committing.flush_us,
            changelog_us: committing.changelog_us,
        }))
    }

    /// Aborts the open transaction for a recovery from `cause` (module docs): a commit in
    /// flight is given up with it; a producer whose call is still at work, or fenced for its
    /// transaction's age, is replaced. `transactional_id` names the producer in
    /// [`KafkaError::Fenced`](parsley_task::error::KafkaError::Fenced).
    ///
    /// # Errors
    /// [`KafkaError::Fenced`](parsley_task::error::KafkaError::Fenced) when another process running
    /// as this instance fenced the producer; the abort's own error when the producer cannot abort
    /// otherwise; a new producer's.
    pub(crate) fn abort_for_recovery(
        &mut self,
        cause: &Error,
        (timeout, transaction_timeout): (Duration, Duration),
        transactional_id: &str,
    ) -> Result<()> {
        // A commit in flight is given up with the transaction.
        self.committing = None;
        self.coordinators.forget();
        let stalled = matches!(
            cause,
            Error::Kafka(error::KafkaError::TransactionStalled { .. })
        );
        let aborted = (!stalled).then(|| self.outbox.abort_transaction(timeout));
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
            self.replace_producer(timeout)?;
        } else if let Some(aborted) = aborted {
            self.after_abort(
                cause,
                aborted,
                (timeout, transaction_timeout),
                transactional_id,
            )?;
        }
        Ok(())
    }

    /// A new producer for the transactional id in place of this one (a new epoch: initialising
    /// it fences the old one and lets the coordinator finish or abort what it left open).
    fn replace_producer(&mut self, timeout: Duration) -> Result<()> {
        self.outbox =
            Transaction::producer(&self.producer_config, self.statistics.clone(), timeout)?;
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
        (timeout, transaction_timeout): (Duration, Duration),
        transactional_id: &str,
    ) -> Result<()> {
        match aborted {
            Ok(()) => {
                self.outbox.wait_acked(timeout)?;
                self.outbox.discard();
                if let Error::Record(RecordError::OutputRefused { reason, .. }) = cause
                    && reason.by_broker()
                {
                    // librdkafka keeps counting the sequence numbers of the batch the broker
                    // refused, so the next transaction's first send to that partition would be
                    // refused as OUT_OF_ORDER_SEQUENCE_NUMBER and aborted in turn. A new
                    // producer takes the transactional id (a new epoch, sequences from 0).
                    warn!("the broker refused a batch: replacing the producer");
                    self.replace_producer(timeout)?;
                }
            }
            // An abort the producer's transactional state refuses — librdkafka's `_STATE`
            // ("Operation not valid in state BeginCommit", after a commit whose sends failed
            // under a fatal error) or the broker's `INVALID_TXN_STATE` (case C27) — leaves a
            // producer that cannot end its transaction: it is replaced like a fatal one, not
            // the end of the stage.
            Err(rdkafka::error::KafkaError::Transaction(t))
                if t.is_fatal() || refused_by_state(t.code()) =>
            {
                // Fenced: the coordinator bumped the epoch (it aborted a timed-out transaction,
                // case C08) or another producer took the transactional id (case C09); librdkafka
                // reports both as `_FENCED`. The transaction's age tells them apart: the
                // coordinator aborts only a transaction open longer than its timeout, counted
                // from its first partition, which is after `begin`. A younger one was fenced by
                // another process running as this instance: this stage is the zombie and gives
                // up its tasks; taking the id back would fence the live owner in turn.
                let open = self.began.elapsed();
                if crate::client_error::fencing(t.code()) && open < transaction_timeout {
                    return Err(Error::Kafka(error::KafkaError::Fenced {
                        transactional_id: transactional_id.to_string(),
                        open_ms: open.as_millis() as u64,
                        timeout_ms: transaction_timeout.as_millis() as u64,
                        message: t.to_string(),
                    }));
                }
                // A timed-out transaction (or another fatal producer error): this producer is
                // done; a new one takes the id (initialising it completes or aborts whatever
                // the old one left open), and the tasks are rebuilt from the last commit. If
                // the group moved them elsewhere, the next commit is refused and the rebalance
                // hands them over.
                warn!(error = %t, open_ms = open.as_millis() as u64, "the producer is fenced or failed: replacing it");
                self.replace_producer(timeout)?;
            }
            Err(e) => {
                return Err(Error::from(
                    crate::client_error::client(Operation::AbortAfter, e).with_cause(&cause),
                ));
            }
        }
        Ok(())
    }

    /// After an abort: the work of the aborted transaction forgotten and the sends going into
    /// the next transaction again (what was held is dropped with it).
    pub(crate) fn forget_aborted(&mut self) {
        self.uncommitted = Work::default();
        self.sends = Sends::Open;
    }
}

/// [`CommitCall::check`], and more: a call given up at its bound names the coordinator it
/// waited on; one waiting on a coordinator that has moved since the last commit is given up at
/// once (module `coordinator`).
fn check_call(
    call: &mut CommitCall,
    coordinators: &mut Coordinators,
    outbox: &Outbox,
) -> Result<()> {
    match call.check() {
        Err(Error::Kafka(error::KafkaError::TransactionStalled {
            operation,
            timeout,
            coordinator: None,
            moved,
        })) => Err(Error::Kafka(error::KafkaError::TransactionStalled {
            operation,
            timeout,
            coordinator: coordinators.waited_on(outbox.producer(), operation),
            moved,
        })),
        Err(e) => Err(e),
        Ok(()) => match call.waiting() {
            Some((operation, waited)) => match coordinators.moved(outbox.producer(), waited) {
                None => {
                    coordinators.long_wait(outbox.producer(), operation, waited, NOTICE);
                    Ok(())
                }
                Some(moved) => Err(Error::Kafka(error::KafkaError::TransactionStalled {
                    operation,
                    timeout: call.timeout(),
                    coordinator: Some(moved),
                    moved: Some(waited.as_millis() as u64),
                })),
            },
            None => Ok(()),
        },
    }
}

/// Whether `code` says the producer's transactional state refuses the call: librdkafka's own
/// `_STATE`, or the broker's `INVALID_TXN_STATE`. Neither goes away by calling again: a new
/// producer for the transactional id (a new epoch) is the way out.
fn refused_by_state(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::State | RDKafkaErrorCode::InvalidTransactionalState
    )
}

/// When a commit started, for its call and its metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommitStarted {
    /// The commit (the interval runs from here).
    pub commit: Instant,
    /// Its call.
    pub call: Instant,
    /// What the flush and the changelog write took, µs.
    pub flush_us: u64,
    pub changelog_us: u64,
}

/// A commit whose call returned and whose delivery reports arrived: what the second phase
/// goes on with.
pub(crate) struct Committed {
    /// The loop took what was ready meanwhile.
    pub overlap: bool,
    /// The error of the work done meanwhile, to surface once the commit has finished.
    pub overlapped: Result<()>,
    /// The work the commit makes visible.
    pub done: Work,
    /// When the commit and its call started.
    pub commit_started: Instant,
    pub call_started: Instant,
    /// What the flush and the changelog write before the call took, µs.
    pub flush_us: u64,
    pub changelog_us: u64,
}
