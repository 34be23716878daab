//! The stream thread's commit: its two phases and the recovery, the phases that need every
//! owner at once — the tasks write their changelog and settle their acknowledgements, the
//! intake gives the group metadata and the positions to start again from, the transaction
//! runs the call (module `transaction` says what a commit is, and why in two phases).
//!
//! [`StageRunner::start_commit`] fixes a transaction's outputs, changelog records and offsets
//! and starts its call on a helper thread; while it runs, each turn of the loop is a
//! [`StageRunner::commit_turn`], which takes what is ready ([`StageRunner::overlap_batch`])
//! with the sends held; [`StageRunner::finish_commit`] waits for the call, hands the
//! changelog's acknowledgements to the tasks, begins the next transaction and sends what was
//! held. [`StageRunner::commit`] runs both phases at once, for a revocation or a shutdown.
//! [`StageRunner::recover`] aborts the open transaction and rebuilds every task from its last
//! commit: in memory when the task can tell what that commit was (module `rollback` of the
//! task), else from its changelog.
//!
//! Invariant: a commit's work is visible once its call returned, and the next transaction
//! begins only after it; a recovery leaves no task, no held send and no work of the aborted
//! transaction behind, and builds each task as a read of its committed changelog would.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parsley_clock::Channel;
use tracing::{debug, debug_span, info, warn};

use super::StageRunner;
use super::evidence::Evidence;
use super::transaction::{CommitStarted, Overlap};
use parsley_task::context::TaskContext;
use parsley_task::error::{Error, Operation, Result};
use parsley_task::metrics::Progress;
use parsley_task::task::{LastCommit, RefusedInput, Task};

impl StageRunner {
    /// The commit due now, if any: the interval has passed, or a gate waits on the open
    /// transaction's own write (commit first: waiting for the interval would hold the head up
    /// to a whole interval for nothing, and forever with no interval), or a tick of the open
    /// transaction would release a parked record (module `task::ticks`: it counts only once
    /// committed).
    pub(super) fn commit_if_due(&mut self) -> Result<()> {
        if self.txn.commit_due(self.config.commit_interval) {
            return self.start_commit(Overlap::Yes);
        }
        if let Some(wait) = self
            .txn
            .own_write_awaited(self.tasks.iter().map(|(_, t)| t))
        {
            debug!(
                head = %wait.head,
                awaits = %wait.awaits,
                "commit first: a gate waits on the open transaction's own write"
            );
            self.metrics.own_write_commit();
            return self.start_commit(Overlap::Yes);
        }
        if let Some((partition, tick_ms)) = self.tasks.open_tick_releases() {
            debug!(
                partition,
                tick_ms, "commit first: the open transaction's tick would release a parked record"
            );
            self.metrics.tick_commit();
            return self.start_commit(Overlap::Yes);
        }
        if self.tasks.squeezed() && !self.txn.nothing_done() {
            // A commit is what releases the fold state's memory (on disk, its changes go to
            // the store): at the bound it comes at once, as a full cache flushes.
            debug!("commit first: the state's memory is at its bound");
            return self.start_commit(Overlap::Yes);
        }
        Ok(())
    }

    /// Commits the open transaction and begins the next one, without overlap: both phases at
    /// once ([`StageRunner::start_commit`], [`StageRunner::finish_commit`]). For a revocation or
    /// a shutdown, after which nothing may be taken; a commit already in flight finishes first.
    pub(super) fn commit(&mut self) -> Result<()> {
        if self.txn.committing() {
            self.finish_commit()?;
        }
        self.start_commit(Overlap::No)?;
        if self.txn.committing() {
            self.finish_commit()?;
        }
        Ok(())
    }

    /// The first phase of a commit: every output acknowledged, the changelog written, then the
    /// offsets and `EndTxn` started on a helper thread ([`Transaction::start_commit`]). With
    /// [`Overlap::Yes`] and no shutdown pending, the loop's next turns take what is ready while
    /// the call runs ([`StageRunner::commit_turn`]), their sends held for the next transaction;
    /// without, the caller finishes at once. Nothing to commit: the interval restarts, and no
    /// commit is in flight.
    ///
    /// [`Transaction::start_commit`]: super::transaction::Transaction::start_commit
    pub(super) fn start_commit(&mut self, overlap: Overlap) -> Result<()> {
        // The interval runs from the start of a commit, as Kafka Streams counts
        // `commit.interval.ms`: a record that arrives during a commit waits for that commit and
        // at most one interval after its start, not a whole interval after its end.
        let commit_started = Instant::now();
        let _span = debug_span!("commit").entered();
        Evidence::publish_frontier_lag(&self.ctx, &self.intake, &self.tasks);
        if self.txn.nothing_done() && !self.tasks.position_moved() {
            self.txn.restart_interval(commit_started);
            return Ok(());
        }
        let flush_started = Instant::now();
        self.txn.flush(self.config.timeout)?;
        let flush_us = flush_started.elapsed().as_micros() as u64;
        self.settle_acks()?;
        let changelog_started = Instant::now();
        let offsets = self
            .tasks
            .write_changelog(&self.ctx, &self.txn, self.config.timeout)?;
        #[cfg(feature = "fault-injection")]
        if self.txn.deliveries() > 0 {
            crate::fault::reached(
                self.config.crash_point(),
                crate::fault::CrashPoint::AfterChangelog,
                || self.txn.flush(self.config.timeout),
            )?;
        }
        #[cfg(feature = "fault-injection")]
        if self.txn.deliveries() > 0
            && self
                .config
                .fire(crate::fault::ProducerFault::InvalidTxnStateAtCommit)
        {
            tracing::warn!("producer fault: INVALID_TXN_STATE, fatal, before the offsets");
            self.txn.outbox().inject_invalid_txn_state();
        }
        let metadata = self.intake.group_metadata()?;
        let changelog_us = changelog_started.elapsed().as_micros() as u64;
        let started = Instant::now();
        self.tasks.tick_committing();
        let overlap = overlap == Overlap::Yes && !self.shutdown.load(Ordering::Relaxed);
        // Waiting longer than the transaction timeout is pointless: by then the coordinator
        // has aborted the transaction, and the commit can only fail.
        let timeout = self.config.timeout.min(self.config.transaction_timeout());
        self.txn.start_commit(
            &self.ctx.stage,
            offsets,
            metadata,
            overlap,
            (self.config.timeout, timeout),
            CommitStarted {
                commit: commit_started,
                call: started,
                flush_us,
                changelog_us,
            },
        )
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
        if self.txn.overlap_turn()? {
            let taken = if self.shutdown.load(Ordering::Relaxed) {
                Ok(false)
            } else {
                self.overlap_batch()
            };
            if self.txn.overlapped(taken) {
                return Ok(());
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
        let Some(committed) = self.txn.wait_commit(self.config.timeout)? else {
            return Ok(());
        };
        #[cfg(feature = "fault-injection")]
        if committed.done.deliveries > 0
            && self.config.fire(crate::fault::ProducerFault::UnheardCommit)
        {
            tracing::warn!(
                "producer fault: an error after the commit, before the tasks hear of it"
            );
            return Err(parsley_task::error::Error::Kafka(
                parsley_task::error::KafkaError::Transaction {
                    operation: parsley_task::error::Operation::Commit,
                    code: crate::client_error::code(
                        rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                    ),
                    message: "injected: the commit's aftermath failed".into(),
                    fatal: false,
                    requires_abort: true,
                },
            ));
        }
        self.settle_acks()?;
        // Committed: what the tasks wrote to the changelog may reach their state store.
        self.tasks.committed(&self.txn)?;
        let done = &committed.done;
        let commit_us = committed.commit_started.elapsed().as_micros() as u64;
        self.metrics
            .committed(done.deliveries, done.emissions, commit_us);
        debug!(
            deliveries = done.deliveries,
            emissions = done.emissions,
            took_us = committed.call_started.elapsed().as_micros() as u64,
            flush_us = committed.flush_us,
            changelog_us = committed.changelog_us,
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
        if committed.overlap || !self.shutdown.load(Ordering::Relaxed) {
            held = self.txn.begin()?;
        }
        self.txn.restart_interval(committed.commit_started);
        committed.overlapped?;
        self.tasks.send_held(&self.ctx, &mut self.txn, held)
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
        let group = self.spec.group_id(&self.app);
        self.txn.abort_for_recovery(
            cause,
            (self.config.timeout, self.config.transaction_timeout()),
            &self.config.transactional_id(&group),
        )?;
        self.restart_from_last_commit(refused)
    }

    /// The open transaction aborted because the group dropped this member (a lost
    /// assignment): a commit in flight is given up with it and nothing is committed; the
    /// caller then hands every task over. Nothing begun (no send, no position moved, no commit
    /// in flight): nothing to abort.
    ///
    /// # Errors
    /// [`Transaction::abort_for_recovery`](super::transaction::Transaction::abort_for_recovery)'s:
    /// a fence by another process running as this instance ends the stage.
    pub(super) fn abort_lost(&mut self) -> Result<()> {
        if !self.txn.committing() && self.txn.nothing_done() && !self.tasks.position_moved() {
            return Ok(());
        }
        let group = self.spec.group_id(&self.app);
        let cause = Error::admin(
            Operation::Rebalance,
            "the assignment was lost: the group dropped this member".to_string(),
        );
        self.txn.abort_for_recovery(
            &cause,
            (self.config.timeout, self.config.transaction_timeout()),
            &self.config.transactional_id(&group),
        )?;
        self.metrics.aborted();
        self.txn.forget_aborted();
        self.intake.drop_deferred();
        Ok(())
    }

    /// Every task back to its last commit after an abort: the consumer sought back to the
    /// group's committed offsets (read once the transaction is resolved), each task rebuilt
    /// from its last commit kept in memory when it can tell what that was ([`last_commit`]),
    /// else restored from the changelog; `refused` inputs kept refused, and a new transaction
    /// begun.
    fn restart_from_last_commit(&mut self, refused: Option<RefusedInput>) -> Result<()> {
        self.metrics.aborted();
        self.txn.forget_aborted();
        // A record held behind a rebalance event is read again from the committed offsets.
        self.intake.drop_deferred();
        let positions = self.intake.start_positions()?;
        self.intake.resume_all(&self.ctx)?;
        let (mut gone, taken) = self.tasks.take_all();
        let mut refused: Vec<RefusedInput> = taken.into_iter().chain(refused).collect();
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
            let last = gone
                .remove(&partition)
                .and_then(|task| last_commit(&self.ctx, task, &positions));
            self.tasks.restore(
                &self.ctx,
                &mut self.intake,
                self.evidence.admin(),
                &self.config,
                partition,
                positions,
                refused.extract_if(.., |r| r.input.partition == partition),
                last,
            )?;
        }
        // Nothing was held (the sends were dropped above).
        self.txn.begin()?;
        self.txn.restart_interval(Instant::now());
        Ok(())
    }
}

/// `task` at its last commit, kept in memory, given the group's committed offsets `positions`
/// for it (read once the aborted transaction is resolved): `None` when it cannot tell what that
/// commit was, or cannot return there in memory (said, and left to a read of the changelog).
fn last_commit(ctx: &TaskContext, task: Task, positions: &[(Channel, i64)]) -> Option<LastCommit> {
    let partition = task.partition();
    let Some(sealed) = task.sealed_outcome(ctx, positions) else {
        info!(
            partition,
            "the task cannot tell its last commit from the group's offsets: restoring it from the changelog"
        );
        return None;
    };
    let last = task.into_last_commit(sealed);
    if last.is_none() {
        info!(
            partition,
            ?sealed,
            "the task cannot return to its last commit in memory: restoring it from the changelog"
        );
    }
    last
}
