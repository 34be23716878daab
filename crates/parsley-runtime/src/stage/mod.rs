//! The stream thread of one stage: consume, gate, handle, stamp, send, commit.
//!
//! One consumer group per stage (`{application}.{stage}`), `read_committed`, range assignment
//! over co-partitioned sources, so task `p` gets partition `p` of every source. One
//! transactional producer per stream thread (EOS v2: the consumer's group metadata goes with
//! the offsets).
//!
//! # One turn of the stream thread
//! [`StageRunner::run_batch`] is the loop's body, a short list of named phases:
//! 1. **take** a poll batch — one evidence epoch — and offer each record to its task's gate
//!    (rebalance events are handled here: tasks restored on assignment, committed and handed
//!    over on revocation);
//! 2. **read evidence** — the consumer's positions and the high watermarks the gates ask for;
//! 3. **resolve** the impossible stamps the gates found, by the stage's policy;
//! 4. **deliver** what the gates release: handler, fold state, stamped emissions;
//! 5. for an event-time stage, **read the progress of the stages that write its sources**
//!    while an input waits for them (module `upstream`), **read the live heads**, deliver
//!    what the watermark now releases, and every few seconds **say which tasks counted records
//!    late** (module `late`);
//! 6. **apply backpressure** — pauses, resumes, spills and re-fetches;
//! 7. **settle acks** into the tasks' clocks, and let the **standbys read** what their
//!    consumer has ready (module `tasks::standby`);
//! 8. for a stage with the built-in clock, **write a tick** for every task whose tick interval
//!    has passed (the poll waits no longer than the next tick is due, so an idle stage ticks
//!    too);
//! 9. **start a commit** when the interval is due, or at once when a gate waits on the open
//!    transaction's own write or the state's memory is at its bound: the outputs acknowledged, the changelog written, the offsets and
//!    `EndTxn` started on a helper thread;
//! 10. every few seconds, **check the sources**' topic ids and partition counts, and **count
//!     the tasks no member of the group holds** (module `ownership`);
//! 11. when a caller asked why the stage waits, **publish a snapshot** of what each task waits
//!     for (module `tasks::explain`);
//! 12. when callers queried the stage's state, or reads wait for a stamp, **answer the
//!     queries** that can be answered (module `tasks::query`).
//!
//! While a commit's round trips run on the helper thread, each turn is a **commit turn**
//! ([`StageRunner::commit_turn`]) instead: the call's bound checked, and phases 1, 2, 4 and 6
//! repeated with what is ready ([`StageRunner::overlap_batch`]), the sends made meanwhile held
//! for the next transaction; once the call has returned or nothing is ready, the turn
//! **finishes the commit** ([`StageRunner::finish_commit`]) and the next transaction begins.
//! Both phases are called from the loop, one turn at a time: no phase runs the loop's body.
//! A revocation or a shutdown commits both phases at once, with nothing taken between them.
//!
//! # Owners
//! The stream thread's state has four owners, each a type with private fields whose methods
//! keep its invariants (stated in its module docs), as Kafka Streams splits its stream
//! thread, task manager and record collector:
//! - [`Tasks`]: the tasks by partition, and what belongs to them only (the state store, the
//!   channels waiting for upstream stages, what a restore reads with);
//! - [`Intake`]: the consumer, the poll, the records held for alignment, the rebalance events;
//! - [`Transaction`]: the producer, the open transaction, the commit in flight;
//! - [`Evidence`]: the admin client's readings — positions, high watermarks, live heads, what
//!   a failed poll means.
//!
//! [`StageRunner`] keeps the loop and the phases that need more than one owner. A phase that
//! walks one owner and needs another for a step takes the other as a parameter of the first's
//! method (a delivery takes the transaction it sends into, a reading of evidence the intake and
//! the tasks). The phases that need all of them are the stream thread's own: the poll loop with
//! its rebalance events (here), and the commit's phases and the recovery (module `commit`).
//! No owner holds a reference to another.
//!
//! # Layout
//! | module | its one job |
//! |---|---|
//! | `task` | the pure task: gate, handler call, stamping, fold state, event time, snapshot; its `bad` part: policies, dead letters, refused outputs |
//! | `record` | what moves through a task: fetched records, payloads, counts of work |
//! | `context` | what the tasks of a stage share: topics by role, processor, policy |
//! | `output` | the narrow traits a task hands its records to |
//! | `policy` | impossible stamps and dead letters |
//! | `backpressure` | the pure plan of pauses, resumes, spills and re-fetches |
//! | this module | the stream thread: the loop and its phases, the poll loop, rebalance events |
//! | `commit` | the commit's two phases and the recovery, across the owners |
//! | `tasks` | the tasks' owner: offer, deliver, ticks, alignment and backpressure, refused inputs, upstream waits |
//! | `tasks::acks` | the tasks' side of a commit: acknowledgements, refusals named, changelog, held sends |
//! | `tasks::restore` | building an assigned task from its changelog |
//! | `tasks::standby` | warm copies of tasks this instance does not own |
//! | `tasks::explain` | the snapshot of what each task waits for, taken between turns on request |
//! | `intake` | the consumer and the poll |
//! | `held` | the records of inputs held back by watermark alignment |
//! | `alignment` | the pure bounds of watermark alignment |
//! | `evidence` | positions, high watermarks, live heads, what a failed poll means |
//! | `rebalance` | the consumer's callback; assignment checks |
//! | `transaction` | the producer: begin, a commit's call, overlap, commit first, abort |
//! | `commit_call` | a commit's round trips on a helper thread, bounded |
//! | `sources` | the sources' identity, checked while the stage runs |
//! | `ownership` | the tasks no member of the group holds, as its coordinator describes it |
//! | `late` | saying which tasks of an event-time stage counted records late |
//! | `startup` | resolving topics and creating the owners |
//! | `upstream` | inputs other stages write: waiting for those stages to commit their history |
//! | `waits` | saying what a slow group join waits for |
//!
//! Invariant: a task's committed offsets and its last committed snapshot describe the same
//! moment — both are written in the same transaction, after its outputs are acknowledged.

mod alignment;
mod commit;
mod commit_call;
mod coordinator;
mod evidence;
mod held;
mod intake;
mod late;
mod ownership;
mod rebalance;
mod sources;
mod startup;
mod tasks;
mod transaction;
mod upstream;
mod waits;

#[cfg(test)]
pub(crate) use self::ownership::advertised as advertised_for_tests;
pub(crate) use self::tasks::Siblings;
pub(crate) use self::upstream::feeding_stages;
use parsley_task::context::TaskContext;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

use parsley_clock::Channel;
use parsley_stage::StageSpec;
use tracing::{debug, info, info_span, warn};

pub use parsley_task::policy::{
    DLQ_KIND_HEADER, DLQ_OFFSET_HEADER, DLQ_PARTITION_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER,
    DLQ_STAGE_HEADER, DLQ_STAMP_HEADER, DLQ_TOPIC_HEADER,
};
pub use parsley_task::task::{DELIVERY_TARGET, NO_TIMESTAMP};

use self::evidence::Evidence;
use self::intake::{Intake, MAX_BATCH, Polled, Taken, Taking};
use self::late::LateWatch;
use self::ownership::OwnershipCheck;
use self::rebalance::{RebalanceEvent, check_assignment};
use self::sources::SourceCheck;
use self::tasks::Tasks;
use self::transaction::{MAX_RECOVERIES, Transaction};
use self::waits::JoinWait;
use crate::config::RuntimeConfig;
use parsley_task::error::Result;
use parsley_task::metrics::{Progress, StageMetrics, TaskPhase};

/// The longest a poll waits for a first record: shutdown requests, due commits and due ticks
/// are looked at least this often.
const MAX_POLL_WAIT: Duration = Duration::from_millis(100);

/// The longest a poll waits while a task reads its global sources to their end: their readers
/// are polled after the stage's consumer, without waiting, and the stage's partitions of that
/// task are paused meanwhile.
const BOOTSTRAP_POLL_WAIT: Duration = Duration::from_millis(5);

/// How a turn of the stream thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Go on.
    Running,
    /// The final commit of a shutdown is done.
    Stopped,
}

/// The stream thread of one stage.
pub(crate) struct StageRunner {
    app: String,
    spec: StageSpec,
    config: RuntimeConfig,
    /// What the tasks share.
    ctx: TaskContext,
    intake: Intake,
    evidence: Evidence,
    /// When the sources' identity was last checked.
    source_check: SourceCheck,
    /// When the group was last described, to count the tasks no member holds.
    ownership: OwnershipCheck,
    /// The late counts last seen per task, to say when they grow.
    late: LateWatch,
    /// The tasks this instance owns, by partition.
    tasks: Tasks,
    txn: Transaction,
    metrics: Arc<StageMetrics>,
    observer: Option<Sender<Progress>>,
    shutdown: Arc<AtomicBool>,
    /// The wait for the first assignment, until it comes (module `waits`).
    join_wait: Option<JoinWait>,
    /// The tasks of this instance's last assignment: an assignment with others comes from a
    /// rebalance that moved tasks here (said in the log).
    last_owned: BTreeSet<i32>,
}

impl StageRunner {
    /// Resolves the stage's topics, checks co-partitioning, creates the clients and
    /// initialises transactions (module `startup`).
    ///
    /// # Errors
    /// [`crate::SetupError::UnknownTopic`], [`crate::SetupError::NotCoPartitioned`],
    /// [`crate::SetupError::ChangelogPartitions`], [`crate::SetupError::InternalTopicPartitions`],
    /// client and admin errors.
    ///
    /// `feeding` names, per source that other stages of the topology write, those stages
    /// ([`feeding_stages`]).
    pub(crate) fn new(
        app: &str,
        spec: StageSpec,
        feeding: &[(String, Vec<StageSpec>)],
        config: RuntimeConfig,
        (metrics, siblings): (Arc<StageMetrics>, &Siblings),
        observer: Option<Sender<Progress>>,
        shutdown: Arc<AtomicBool>,
    ) -> Result<Self> {
        let started = startup::start(app, &spec, feeding, &config, (&metrics, siblings))?;
        Ok(StageRunner {
            app: app.to_string(),
            spec,
            config,
            ctx: started.ctx,
            intake: started.intake,
            evidence: started.evidence,
            source_check: SourceCheck::new(),
            ownership: OwnershipCheck::new(),
            late: LateWatch::new(),
            tasks: started.tasks,
            txn: started.txn,
            metrics,
            observer,
            shutdown,
            join_wait: Some(started.join_wait),
            last_owned: BTreeSet::new(),
        })
    }

    /// Runs until shutdown (Ok, after a final commit) or the first error (the open
    /// transaction is aborted).
    pub(crate) fn run(mut self) -> Result<()> {
        let span = info_span!("stage", app = %self.app, stage = %self.spec.name());
        let _entered = span.enter();
        self.txn.begin()?;
        let result = self.run_loop();
        self.intake.close();
        // What the state store buffers goes to disk: the next start reads only the tail.
        self.tasks.persist_stores();
        match &result {
            Ok(()) => info!("stopped"),
            Err(e) => {
                warn!(error = %e, "failed; aborting the open transaction");
                self.txn.abort();
                self.metrics.aborted();
            }
        }
        result
    }

    /// Runs turns until shutdown. A transaction that cannot commit (a timed-out or otherwise
    /// aborted transaction, a send the broker refused: [`crate::Error::is_retriable`]) is
    /// aborted and every task returns to its last commit ([`StageRunner::recover`]); a fence by
    /// another process running as this instance or any other error ends the stage. Recoveries
    /// without a commit in between are bounded, so a persistent fault cannot loop forever.
    ///
    /// An output refused for good ([`crate::RecordError::OutputRefused`]) is never retried as it
    /// was: under a bad-record policy that takes records, its transaction is aborted the same
    /// way and the redo skips or dead-letters its input record
    /// ([`Tasks::refused_input`]); otherwise the stage ends with it. Such a recovery is
    /// not counted: each takes one more input record out, so they cannot loop.
    fn run_loop(&mut self) -> Result<()> {
        let mut recoveries = 0;
        loop {
            let transactions = self.metrics.snapshot().transactions;
            match self.run_batch().map_err(|e| self.explained(e)) {
                Ok(Turn::Stopped) => return Ok(()),
                Ok(Turn::Running) => {
                    if self.metrics.snapshot().transactions > transactions {
                        recoveries = 0;
                    }
                }
                Err(e) if e.is_retriable() && recoveries < MAX_RECOVERIES => {
                    recoveries += 1;
                    self.recover(&e, None)?;
                }
                Err(e) => match self.tasks.refused_input(&self.ctx, &e) {
                    Some(refused) => self.recover(&e, Some(refused))?,
                    None => return Err(e),
                },
            }
        }
    }

    /// `e`, or the refusal that explains it: once the broker refused a record, librdkafka
    /// refuses further sends of the transaction in `produce()` (`_STATE`), so a send error met
    /// before the refused record's delivery report was settled is explained by that report
    /// (and a refused batch no record explains may be explained by reports still to come).
    /// For such send errors the outstanding reports are awaited (a flush) and settled; an
    /// [`crate::RecordError::OutputRefused`] among them replaces `e`.
    fn explained(&mut self, e: crate::Error) -> crate::Error {
        if !matches!(e, crate::Error::Kafka(crate::KafkaError::Send { .. })) {
            return e;
        }
        let explainable = crate::client_error::library_error(&e)
            .and_then(rdkafka::error::KafkaError::rdkafka_error_code)
            .is_some_and(|code| {
                code == rdkafka::types::RDKafkaErrorCode::State || crate::refusal::is_refusal(code)
            });
        if !explainable {
            return e;
        }
        if let Err(flush) = self.txn.flush(self.config.timeout) {
            debug!(error = %flush, "no delivery reports to explain a refused send");
            return e;
        }
        match self.settle_acks() {
            Err(refused @ crate::Error::Record(crate::RecordError::OutputRefused { .. })) => {
                refused
            }
            _ => e,
        }
    }

    /// One turn: the phases of the module docs.
    fn run_batch(&mut self) -> Result<Turn> {
        if self.txn.committing() {
            // A commit in flight: its turn, not the loop's phases.
            self.commit_turn()?;
            return Ok(Turn::Running);
        }
        if self.shutdown.load(Ordering::Relaxed) {
            self.commit()?;
            return Ok(Turn::Stopped);
        }
        let wait = if self.intake.take_released() {
            // Records held for watermark alignment were just released into the gates.
            Duration::ZERO
        } else {
            let most = if self.tasks.bootstrapping() {
                BOOTSTRAP_POLL_WAIT
            } else {
                MAX_POLL_WAIT
            };
            self.txn
                .until_due(self.config.commit_interval)
                .min(most)
                .min(self.tasks.until_tick(&self.ctx))
        };
        self.take_batch(Taking::Waiting(wait))?;
        // After the poll: an assignment ready by now has been handled.
        self.watch_join();
        self.read_evidence()?;
        self.tasks.resolve_impossible(&self.ctx, &mut self.txn)?;
        self.deliver()?;
        if self.spec.event_time().is_some() {
            self.tasks
                .read_upstreams(&self.ctx, self.evidence.admin(), &self.config)?;
            self.evidence
                .read_heads(&self.ctx, &self.intake, &mut self.tasks)?;
            self.deliver()?;
            self.late.look(&self.metrics);
        }
        self.apply_backpressure()?;
        self.settle_acks()?;
        self.tasks.read_standbys();
        self.tasks.write_ticks(&self.ctx, &mut self.txn)?;
        // The checks that ask the cluster come before a commit starts: one that waits on a node
        // that died (up to its bound) never holds up the watch on a commit call in flight.
        self.source_check
            .check(self.evidence.admin(), &self.ctx, self.config.timeout)?;
        self.check_ownership();
        self.commit_if_due()?;
        self.tasks.explain_if_asked(&self.ctx, &self.intake);
        self.tasks.answer_queries(&self.ctx);
        Ok(Turn::Running)
    }

    /// One poll batch while the transaction commits on a helper thread: the records ready now
    /// are offered, the evidence read, and the tasks deliver — their sends held until the next
    /// transaction opens (the work belongs to it, and an abort of the committing one returns
    /// the tasks to their last commit like any other). Live-head readings and impossible
    /// stamps wait for the next turn.
    ///
    /// `Ok(false)` when nothing was ready, or when a rebalance event arrived (the record polled
    /// with it waits, unoffered, so no position passes it).
    fn overlap_batch(&mut self) -> Result<bool> {
        let taken = self.take_batch(Taking::Ready)?;
        if taken.records == 0 || taken.at_rebalance {
            return Ok(false);
        }
        self.metrics.overlapped(taken.records as u64);
        self.read_evidence()?;
        self.deliver()?;
        self.apply_backpressure()?;
        Ok(true)
    }

    /// Phase 2: the consumer's positions and the high watermarks the gates ask for, to the
    /// tasks (module `evidence`).
    fn read_evidence(&mut self) -> Result<()> {
        self.evidence.read(&self.ctx, &self.intake, &mut self.tasks)
    }

    /// Phase 4: what the gates release, delivered into the transaction (module `tasks`).
    fn deliver(&mut self) -> Result<()> {
        self.tasks.deliver(&self.ctx, &mut self.txn)
    }

    /// Phase 6: watermark alignment and the backpressure plan, applied to the tasks' gates
    /// and the consumer (module `tasks`).
    fn apply_backpressure(&mut self) -> Result<()> {
        self.tasks.apply_backpressure(
            &self.ctx,
            &mut self.intake,
            &mut self.txn,
            self.config.timeout,
        )
    }

    /// Phase 7: the delivery reports recorded so far, settled into the tasks' clocks (module
    /// `tasks::acks`).
    fn settle_acks(&mut self) -> Result<()> {
        self.tasks
            .settle_acks(&self.ctx, &mut self.txn, self.evidence.admin())
    }

    /// Phase 10: every few seconds, the tasks no member of the group holds (module
    /// `ownership`).
    fn check_ownership(&mut self) {
        self.ownership.check(
            self.evidence.admin(),
            &self.spec.group_id(&self.app),
            &self.ctx,
            self.config.session_timeout(),
            &self.metrics,
        );
    }

    /// Once per turn until the first assignment: says once what a slow join waits for
    /// (module `waits`).
    fn watch_join(&mut self) {
        if let Some(wait) = self.join_wait.as_mut() {
            wait.watch(self.evidence.admin(), &self.app, &self.spec, &self.config);
        }
    }

    /// The one poll loop: takes one poll batch and offers each record to its task. Rebalance
    /// events arrive from the consumer's callback during a poll: with [`Taking::Waiting`] they
    /// are handled at once, before the record polled with them is offered; with
    /// [`Taking::Ready`] (a commit in flight) the batch stops at them (module `intake`).
    fn take_batch(&mut self, taking: Taking) -> Result<Taken> {
        let mut timeout = match taking {
            Taking::Waiting(wait) => wait,
            Taking::Ready => Duration::ZERO,
        };
        if self.intake.rebalance_waiting() {
            match taking {
                Taking::Waiting(_) => {
                    self.rebalance()?;
                }
                Taking::Ready => {
                    return Ok(Taken {
                        records: 0,
                        at_rebalance: true,
                    });
                }
            }
        }
        self.intake.next_epoch();
        let mut taken = Taken::default();
        while taken.records < MAX_BATCH {
            match self.intake.poll(timeout, &self.ctx)? {
                Polled::Record(f) => {
                    self.tasks.offer(&self.ctx, &mut self.intake, f)?;
                    taken.records += 1;
                }
                Polled::Rebalance => match taking {
                    Taking::Waiting(_) => {
                        if !self.rebalance()? {
                            break;
                        }
                        taken.records += 1;
                    }
                    Taking::Ready => {
                        taken.at_rebalance = true;
                        break;
                    }
                },
                Polled::Nothing => break,
                Polled::Failed(e) => {
                    if crate::client_error::transient(&e) {
                        // A node unreachable: maybe the group coordinator's (module
                        // `ownership`).
                        self.ownership.transport_failed();
                        self.source_check.transport_failed();
                    }
                    self.evidence.poll_failed(
                        &self.ctx,
                        &self.intake,
                        &self.tasks,
                        e,
                        self.config.timeout,
                    )?;
                    break;
                }
            }
            timeout = Duration::ZERO;
        }
        taken.records += self.tasks.take_global(&self.ctx, self.intake.epoch())?;
        Ok(taken)
    }

    /// Handles the waiting rebalance events, then offers the record polled with them, if any
    /// (`true` then).
    fn rebalance(&mut self) -> Result<bool> {
        self.handle_rebalance()?;
        match self.intake.take_deferred() {
            Some(f) => {
                self.tasks.offer(&self.ctx, &mut self.intake, f)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Handles the rebalance events recorded so far (module `rebalance`): restores the tasks
    /// of an assignment, commits and hands over the tasks of a revocation.
    fn handle_rebalance(&mut self) -> Result<()> {
        for event in self.intake.take_events() {
            match event {
                RebalanceEvent::Assigned(positions) => {
                    // At an assignment: the wait for the first one ends, said with how long it
                    // took.
                    let first = self.join_wait.is_some();
                    match self.join_wait.take() {
                        Some(wait) => info!(
                            ?positions,
                            joined_after_ms = wait.waited().as_millis() as u64,
                            "assigned"
                        ),
                        None => info!(?positions, "assigned"),
                    }
                    let assigned: BTreeSet<i32> = positions.iter().map(|(_, p, _)| *p).collect();
                    let taken_over: Vec<i32> =
                        assigned.difference(&self.last_owned).copied().collect();
                    if !first && !taken_over.is_empty() {
                        // A survivor says why it has new tasks: their owner left the group, or
                        // died and was noticed once its session timed out.
                        info!(
                            tasks = ?taken_over,
                            session_timeout_ms = self.config.session_timeout().as_millis() as u64,
                            "took over tasks another member owned: it left the group, or stopped \
                             heartbeating and the group dropped it after the session timeout"
                        );
                    }
                    self.late
                        .assigned(&assigned, if first { &[] } else { &taken_over });
                    self.tasks.own(&assigned);
                    self.last_owned = assigned;
                    let mut by_task: BTreeMap<i32, Vec<(Channel, i64)>> = BTreeMap::new();
                    for (topic, partition, position) in positions {
                        let source = self.ctx.source_index(&topic)?;
                        by_task.entry(partition).or_default().push((
                            Channel::new(self.ctx.sources[source].id, partition),
                            position,
                        ));
                    }
                    let names: Vec<&str> =
                        self.ctx.sources.iter().map(|t| t.name.as_str()).collect();
                    let now = self.evidence.admin().describe_topics(&names)?;
                    check_assignment(
                        &self.ctx.stage,
                        &self.ctx.sources,
                        |t| self.spec.is_global(t),
                        &now,
                        &by_task,
                    )?;
                    // Every assigned task shows as restoring until its own restore is done, so
                    // the readiness check never takes the first restored tasks for all of them.
                    for partition in by_task.keys() {
                        self.metrics
                            .task(*partition, |m| m.phase = TaskPhase::Restoring);
                    }
                    self.metrics.set_assigned(true);
                    for (partition, positions) in by_task {
                        self.tasks.restore(
                            &self.ctx,
                            &mut self.intake,
                            self.evidence.admin(),
                            &self.config,
                            partition,
                            positions,
                            [],
                            None,
                        )?;
                    }
                    self.tasks
                        .choose_standbys(&self.last_owned, self.evidence.admin());
                }
                RebalanceEvent::Revoked {
                    partitions,
                    lost: true,
                } => {
                    // The group dropped this member (its session timed out): the generation is
                    // gone, and a commit now would carry no generation at all, which a group
                    // without members accepts — the offsets of a zombie. As Kafka Streams'
                    // `onPartitionsLost`: the open transaction is aborted, nothing committed;
                    // whoever owns the tasks next restores them from the last commit.
                    warn!(
                        ?partitions,
                        "assignment lost: aborting the open transaction, then handing the tasks over"
                    );
                    self.metrics.assignment_lost();
                    self.abort_lost()?;
                    self.intake.unassign()?;
                    self.tasks.clear();
                    self.metrics.retain_tasks(|_| false);
                    self.metrics.set_assigned(false);
                }
                RebalanceEvent::Revoked { partitions, .. } => {
                    // Commit first: what was delivered is not done again by the next owner,
                    // and the next owner restores exactly this state. The group generation is
                    // still ours until the unassign below.
                    info!(
                        ?partitions,
                        "revoked: committing, then handing the tasks over"
                    );
                    self.commit()?;
                    self.intake.unassign()?;
                    self.tasks.clear();
                    self.metrics.retain_tasks(|_| false);
                    self.metrics.set_assigned(false);
                }
                RebalanceEvent::Failed(error) => return Err(error),
            }
        }
        Ok(())
    }
}
