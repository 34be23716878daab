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
//!    while an input waits for them (module `upstream`), **read the live heads** and deliver
//!    what the watermark now releases;
//! 6. **apply backpressure** — pauses, resumes, spills and re-fetches;
//! 7. **settle acks** into the tasks' clocks;
//! 8. for a stage with the built-in clock, **write a tick** for every task whose tick interval
//!    has passed (the poll waits no longer than the next tick is due, so an idle stage ticks
//!    too);
//! 9. **start a commit** when the interval is due, or at once when a gate waits on the open
//!    transaction's own write: the outputs acknowledged, the changelog written, the offsets and
//!    `EndTxn` started on a helper thread;
//! 10. every few seconds, **check the sources**' topic ids and partition counts;
//! 11. when a caller asked why the stage waits, **publish a snapshot** of what each task waits
//!     for (module `explain`).
//!
//! While a commit's round trips run on the helper thread, each turn is a **commit turn**
//! ([`StageRunner::commit_turn`]) instead: the call's bound checked, and phases 1, 2, 4 and 6
//! repeated with what is ready ([`StageRunner::overlap_batch`]), the sends made meanwhile held
//! for the next transaction; once the call has returned or nothing is ready, the turn
//! **finishes the commit** ([`StageRunner::finish_commit`]) and the next transaction begins.
//! Both phases are called from the loop, one turn at a time: no phase runs the loop's body.
//! A revocation or a shutdown commits both phases at once, with nothing taken between them.
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
//! | `intake` | the consumer and the one poll loop |
//! | `held` | the records of inputs held back by watermark alignment |
//! | `evidence` | positions, high watermarks, live heads |
//! | `rebalance` | the consumer's callback; assignment checks; handing tasks in and out |
//! | `restore` | building an assigned task from its changelog |
//! | `transaction` | begin, commit, overlap, commit first, recovery |
//! | `sources` | the sources' identity, checked while the stage runs |
//! | `startup` | resolving topics and creating the clients |
//! | `upstream` | inputs other stages write: waiting for those stages to commit their history |
//! | `waits` | saying what a slow group join waits for |
//! | `explain` | the snapshot of what each task waits for, taken between turns on request |
//!
//! Invariant: a task's committed offsets and its last committed snapshot describe the same
//! moment — both are written in the same transaction, after its outputs are acknowledged.

mod alignment;
mod commit_call;
mod evidence;
mod explain;
mod held;
mod intake;
mod rebalance;
mod restore;
mod sources;
mod startup;
mod transaction;
mod upstream;
mod waits;

pub(crate) use self::upstream::feeding_stages;
use parsley_task::context::TaskContext;
use parsley_task::task::{Task, publish_counts};

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parsley_stage::StageSpec;
use tracing::{debug, info, info_span, trace_span, warn};

pub use parsley_task::policy::{
    DLQ_KIND_HEADER, DLQ_OFFSET_HEADER, DLQ_PARTITION_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER,
    DLQ_STAGE_HEADER, DLQ_STAMP_HEADER, DLQ_TOPIC_HEADER,
};
pub use parsley_task::task::{DELIVERY_TARGET, NO_TIMESTAMP};

use self::evidence::Evidence;
use self::intake::{Intake, Taking};
use self::sources::SourceCheck;
use self::transaction::{MAX_RECOVERIES, Transaction};
use crate::config::RuntimeConfig;
use parsley_task::backpressure::{self, Step};
use parsley_task::error::Result;
use parsley_task::metrics::{Progress, StageMetrics};

/// The longest a poll waits for a first record: shutdown requests, due commits and due ticks
/// are looked at least this often.
const MAX_POLL_WAIT: Duration = Duration::from_millis(100);

/// The wall clock now, ms since the epoch: the timestamp of the built-in clock's ticks.
fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

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
    /// The tasks this instance owns, by partition.
    tasks: BTreeMap<i32, Task>,
    txn: Transaction,
    metrics: Arc<StageMetrics>,
    observer: Option<Sender<Progress>>,
    shutdown: Arc<AtomicBool>,
    /// The wait for the first assignment, until it comes (module `waits`).
    join_wait: Option<waits::JoinWait>,
    /// The stages that write the stage's sources, and the event-time channels waiting for
    /// them (module `upstream`).
    upstreams: upstream::Upstreams,
    /// The stage's state store, when fold state lives on disk
    /// ([`RuntimeConfig::state_dir`]).
    stores: Option<parsley_task::state_store::StateStores>,
}

impl StageRunner {
    /// Runs until shutdown (Ok, after a final commit) or the first error (the open
    /// transaction is aborted).
    pub(crate) fn run(mut self) -> Result<()> {
        let span = info_span!("stage", app = %self.app, stage = %self.spec.name());
        let _entered = span.enter();
        self.txn.begin()?;
        let result = self.run_loop();
        self.intake.close();
        // What the state store buffers goes to disk: the next start reads only the tail.
        if let Some(stores) = &self.stores
            && let Err(e) = stores.persist()
        {
            warn!(error = %e, "the state store could not be persisted; the next start reads more of the changelog");
        }
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
    /// ([`StageRunner::refused_input`]); otherwise the stage ends with it. Such a recovery is
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
                Err(e) => match self.refused_input(&e) {
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

    /// The input record that the stage's bad-record policy takes for `e`: an output of it
    /// refused for good ([`crate::RecordError::OutputRefused`]) under `Skip` or `DeadLetter`, the
    /// first time. A refused dead letter or changelog record, an input not known, or `Fail`
    /// leave the error to end the stage (counted as a bad record when its input is known).
    fn refused_input(&self, e: &crate::Error) -> Option<parsley_task::task::RefusedInput> {
        let crate::Error::Record(crate::RecordError::OutputRefused {
            input: Some(input),
            dead_letter: false,
            ..
        }) = e
        else {
            return None;
        };
        if self.ctx.bad_records == parsley_stage::BadRecordPolicy::Fail {
            // Counted here: under the other policies the redo counts it.
            self.ctx
                .metrics
                .bad_record(parsley_stage::BadRecordKind::OutputRefused);
            return None;
        }
        let source = self.ctx.source_index(&input.topic).ok()?;
        let again = self
            .tasks
            .get(&input.partition)
            .is_some_and(|t| t.is_refused(source, input.offset));
        if again {
            // The policy took it already and an output of it was refused again: nothing more
            // to take out.
            return None;
        }
        warn!(error = %e, "an output was refused for good: the transaction is aborted and the redo applies the bad-record policy to its input record");
        parsley_task::task::RefusedInput::of(e, source)
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
            self.txn
                .until_due(self.config.commit_interval)
                .min(MAX_POLL_WAIT)
                .min(self.until_tick())
        };
        self.take_batch(Taking::Waiting(wait))?;
        // After the poll: an assignment ready by now has been handled.
        self.watch_join();
        self.read_evidence()?;
        self.resolve_impossible()?;
        self.deliver()?;
        if self.spec.event_time().is_some() {
            self.read_upstreams()?;
            self.read_heads()?;
            self.deliver()?;
        }
        self.apply_backpressure()?;
        self.settle_acks()?;
        self.write_ticks()?;
        self.commit_if_due()?;
        self.check_sources()?;
        self.explain_if_asked();
        Ok(Turn::Running)
    }

    /// Writes a tick of the built-in clock, in the open transaction, for every task whose tick
    /// interval has passed (module `task::ticks`); the wall clock gives the ticks' timestamps.
    fn write_ticks(&mut self) -> Result<()> {
        if self.ctx.clock.is_none() {
            return Ok(());
        }
        let now = wall_clock_ms();
        for task in self.tasks.values_mut() {
            let work = task.tick(&self.ctx, &mut self.txn, now)?;
            self.txn.add(work);
        }
        Ok(())
    }

    /// How long until a task's next tick is due: the longest the next poll may wait (a stage
    /// without the built-in clock, or with no task, waits for the other reasons only).
    fn until_tick(&self) -> Duration {
        let now = wall_clock_ms();
        self.tasks
            .values()
            .filter_map(|t| t.tick_due_in(&self.ctx, now))
            .min()
            .map_or(Duration::MAX, |ms| Duration::from_millis(ms.max(0) as u64))
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

    /// Applies the stage's policy to the impossible stamps the gates found.
    fn resolve_impossible(&mut self) -> Result<()> {
        for task in self.tasks.values_mut() {
            let work = task.resolve_impossible(&self.ctx, &mut self.txn);
            self.txn.add(work?);
        }
        Ok(())
    }

    /// Delivers what every task's gate releases, its sends going to the transaction (held
    /// while a commit is in flight), then publishes the tasks' counters.
    fn deliver(&mut self) -> Result<()> {
        let mut result = Ok(());
        for task in self.tasks.values_mut() {
            let _span = trace_span!("deliver", partition = task.partition()).entered();
            match task.deliver(&self.ctx, &mut self.txn) {
                Ok(work) => self.txn.add(work),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.publish_task_metrics();
        result
    }

    /// Adds each task's counted deliveries to its metrics and sets the stage's gauges.
    fn publish_task_metrics(&mut self) {
        publish_counts(
            self.tasks.values_mut(),
            &self.metrics,
            self.spec.event_time().is_some(),
        );
    }

    /// Applies each task's watermark alignment ([`align`]), then its backpressure plan: gate
    /// steps first, then the consumer's pauses and resumes, then its seeks.
    fn apply_backpressure(&mut self) -> Result<()> {
        let mut pauses = Vec::new();
        let mut seeks = Vec::new();
        let max_drift = self.spec.event_time().and_then(|o| o.max_drift_ms);
        for task in self.tasks.values_mut() {
            if let Some(drift) = max_drift {
                align(&self.ctx, &mut self.intake, &mut self.txn, task, drift)?;
            }
            let partition = task.partition();
            let steps = backpressure::plan(task.gate(), self.intake.full(), self.ctx.cap);
            let gate = task.gate_mut();
            for step in steps {
                match step {
                    Step::Spill(channel) => {
                        let n = gate.spill(&channel);
                        debug!(%channel, spilled = n, "spilling a channel that is full");
                        self.metrics.spilled(n);
                    }
                    Step::BeginRefetch { channel, from } => {
                        let resume = gate
                            .begin_refetch(channel, from)
                            .map_err(|e| self.ctx.gate_error(partition, e))?;
                        debug!(%channel, from, resume, "re-fetching spilled records");
                        seeks.push((channel, from));
                    }
                    Step::EndRefetch { channel, resume } => {
                        gate.end_refetch(&channel);
                        debug!(%channel, resume, "re-fetch ends early: full");
                        seeks.push((channel, resume));
                    }
                    Step::Pause(channel) => pauses.push((channel, true)),
                    Step::Resume(channel) => pauses.push((channel, false)),
                }
            }
        }
        for (channel, full) in pauses {
            debug!(%channel, full, "backpressure");
            self.intake.set_full(&self.ctx, channel, full)?;
        }
        for (channel, offset) in seeks {
            self.intake
                .seek(&self.ctx, channel, offset, self.config.timeout)?;
        }
        Ok(())
    }
}

/// Most held records one turn lets go on for one task: past it, the rest waits for the next
/// turn, so that commits and polls keep their pace during a long catch-up.
const ALIGN_PER_TURN: usize = 4 * intake::MAX_BATCH;

/// Applies watermark alignment (module `alignment`) to `task` with drift `drift`, ms: sets each
/// input's bound and offers what its held records the bound lets go on. Offered records are
/// delivered at once and the bounds set again from the watermark they move, until nothing more
/// goes on or [`ALIGN_PER_TURN`] records went: inputs whose records lie closer together in event
/// time than the drift go on in one turn, not a drift's worth of event time per turn. Held
/// records go to the gate before anything the backpressure plan decides for their channels.
fn align(
    ctx: &TaskContext,
    intake: &mut Intake,
    txn: &mut Transaction,
    task: &mut Task,
    drift: i64,
) -> Result<()> {
    let mut offered = 0;
    loop {
        let bounds = match task.gate_and_event_time() {
            (gate, Some(et)) => {
                let limit = alignment::limit(drift, et.lag_ms());
                alignment::bounds(&alignment::inputs(gate, et), et.watermark(), limit)
            }
            (_, None) => return Ok(()),
        };
        let before = offered;
        for (channel, bound) in bounds {
            for f in intake.set_bound(ctx, channel, bound)? {
                task.offer(ctx, f)?;
                offered += 1;
            }
        }
        if offered == before || offered >= ALIGN_PER_TURN {
            return Ok(());
        }
        let work = task.deliver(ctx, txn)?;
        txn.add(work);
    }
}
