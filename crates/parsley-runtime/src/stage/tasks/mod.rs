//! The tasks of the stream thread: the one owner of the stage's tasks and of what belongs to
//! them only — the state store their fold state lives in, the channels that wait for the
//! stages feeding them (module `upstream`), and what restoring one takes.
//!
//! [`Tasks`] walks its tasks for each phase the stream thread runs on them: offering a record,
//! resolving impossible stamps, delivering, writing ticks, watermark alignment and
//! backpressure, settling acknowledgements and writing the changelog at a commit (module
//! `acks`), restoring an assigned task (module `restore`), and the snapshot of what each task
//! waits for (module `explain`), and the answers to interactive queries (module `query`); what
//! the stream threads of one stage in one process share, the state store and the standbys, is
//! in module `siblings`. What a phase needs of another owner — the transaction a
//! delivery sends into, the intake a seek or a held record goes through — is handed to it as
//! a parameter; nothing here keeps a reference to another owner.
//!
//! Invariants:
//! - there is at most one task per partition, and a task is here exactly from the end of its
//!   restore to its revocation or the recovery that rebuilds it;
//! - a task is taken in only once it reports
//!   [`TaskPhase::Running`](parsley_task::metrics::TaskPhase) (module `restore`), and the tasks
//!   are taken out all together: at a revocation once their work is committed, at a recovery
//!   once it is aborted (what they refused for good is kept for their rebuilt selves);
//! - an event-time input channel of a task here that other stages write waits for them until
//!   their history is committed (module `upstream`), and is forgotten at the next look once
//!   its task is gone.

mod acks;
mod explain;
mod global;
mod memory;
mod query;
mod restore;
mod siblings;
mod standby;

pub(crate) use self::siblings::Siblings;
pub(crate) use self::standby::SharedStandbys;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley_clock::Channel;
use parsley_stage::{EventTimeOrder, StageSpec};
use parsley_task::backpressure::{self, Step};
use parsley_task::context::TaskContext;
use parsley_task::error::RecordError;
use parsley_task::error::{Error, Result};
use parsley_task::memory::AtBound;
use parsley_task::record::Fetched;
use parsley_task::state_store::StateStores;
use parsley_task::task::{RefusedInput, Task, publish_counts};
use parsley_task::topic::TopicInfo;
use rdkafka::ClientConfig;
use tracing::{debug, info, trace_span, warn};

use super::alignment;
use super::intake::{self, Hold, Intake};
use super::transaction::Transaction;
use super::upstream::Upstreams;
use crate::admin::Admin;
use crate::config::RuntimeConfig;

/// The wall clock now, ms since the epoch: the timestamp of the built-in clock's ticks.
fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Most held records one turn lets go on for one task: past it, the rest waits for the next
/// turn, so that commits and polls keep their pace during a long catch-up.
const ALIGN_PER_TURN: usize = 4 * intake::MAX_BATCH;

impl Drop for Tasks {
    fn drop(&mut self) {
        self.standbys.leave(self.thread);
    }
}

/// The tasks this instance owns, by partition, and what belongs to them only (module docs).
pub(crate) struct Tasks {
    tasks: BTreeMap<i32, Task>,
    /// The stage's event-time order; `None`: it does not order by event time.
    event_time: Option<EventTimeOrder>,
    /// The stages that write the stage's sources, and the event-time channels waiting for
    /// them (module `upstream`).
    upstreams: Upstreams,
    /// The stage's state store, when fold state lives on disk
    /// ([`RuntimeConfig::state_dir`]).
    stores: Option<StateStores>,
    /// The stage's changelog topic, which a restore reads.
    changelog: TopicInfo,
    /// The configuration of the consumer that reads a changelog partition (module `restore`).
    restore_client: ClientConfig,
    /// The readers of the global sources, one per task, when the stage has global sources
    /// (module `global`).
    global: Option<global::GlobalReaders>,
    /// Warm copies of tasks this instance does not own (module `standby`), shared by the
    /// stage's stream threads in this process (module `siblings`).
    standbys: standby::SharedStandbys,
    /// This stream thread's index among its stage's threads.
    thread: usize,
    /// Interactive reads waiting for a stamp to be delivered (module `query`).
    waiting: Vec<parsley_task::query::Request>,
    /// The stage's share of the memory bound, when there is one (module `memory`).
    memory: Option<memory::StageMemory>,
}

impl Tasks {
    /// No task yet, for the stage of `spec` in application `app`, with feeding stages
    /// `upstreams`, state store `stores` and changelog `changelog`; the standbys are those the
    /// stage's threads in this process share (`siblings`), made by the first with `metrics`.
    pub(crate) fn new(
        app: &str,
        spec: &StageSpec,
        config: &RuntimeConfig,
        upstreams: Upstreams,
        (stores, siblings): (Option<StateStores>, &siblings::Siblings),
        changelog: TopicInfo,
        metrics: &std::sync::Arc<parsley_task::metrics::StageMetrics>,
    ) -> Self {
        let restore_client = restore::restore_client(app, spec, config, &changelog);
        let standbys = siblings.standbys(|| {
            standby::SharedStandbys::new(
                standby::Standbys::new(
                    config.standby_replicas,
                    &config.instance_id,
                    &restore_client,
                    &changelog,
                ),
                metrics.clone(),
            )
        });
        Tasks {
            tasks: BTreeMap::new(),
            event_time: spec.event_time().cloned(),
            upstreams,
            stores,
            standbys,
            thread: config.thread,
            restore_client,
            global: (!spec.global_sources().is_empty()).then(|| {
                global::GlobalReaders::new(
                    restore::global_client(app, spec, config),
                    config.timeout,
                )
            }),
            changelog,
            waiting: Vec::new(),
            memory: config.state_memory.as_ref().map(memory::StageMemory::new),
        }
    }

    /// No task is here.
    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The tasks, by partition.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = (&i32, &Task)> {
        self.tasks.iter()
    }

    /// The task of `partition`, if it is here, to hand it evidence.
    pub(crate) fn get_mut(&mut self, partition: i32) -> Option<&mut Task> {
        self.tasks.get_mut(&partition)
    }

    /// The tasks, to hand them evidence.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut Task> {
        self.tasks.values_mut()
    }

    /// After an assignment of `owned`: the standbys chosen again (module `standby`); `admin`
    /// reads the changelog's offsets.
    pub(crate) fn choose_standbys(
        &mut self,
        owned: &std::collections::BTreeSet<i32>,
        admin: &Admin,
    ) {
        self.standbys
            .choose(self.thread, owned, self.stores.as_ref(), admin);
    }

    /// At an assignment of `owned`, before any restore: no stream thread of the stage warms
    /// them from now on (module `standby`).
    pub(crate) fn own(&self, owned: &std::collections::BTreeSet<i32>) {
        self.standbys.own(self.thread, owned);
    }

    /// Once a turn: the standbys read what their consumer has ready (module `standby`).
    pub(crate) fn read_standbys(&mut self) {
        if self.squeezed() {
            return;
        }
        self.standbys.read();
    }

    /// Hands every task over (a revocation).
    pub(crate) fn clear(&mut self) {
        self.tasks.clear();
        if let Some(g) = &mut self.global {
            g.clear();
        }
    }

    /// Polls the readers of the global sources without waiting and offers what they read to
    /// their tasks (module `global`); `epoch` is the stage consumer's poll batch. Returns how
    /// many records.
    ///
    /// # Errors
    /// A failed poll; the task's, as [`Task::offer`].
    pub(crate) fn take_global(&mut self, ctx: &TaskContext, epoch: u64) -> Result<usize> {
        match &mut self.global {
            Some(g) => g.take(ctx, &mut self.tasks, epoch),
            None => Ok(0),
        }
    }

    /// Whether a task reads its global sources to their end now (module `global`): the poll
    /// waits less meanwhile.
    pub(crate) fn bootstrapping(&self) -> bool {
        self.tasks.values().any(Task::bootstrapping)
    }

    /// Hands each task the positions of its global sources' reader (module `global`).
    ///
    /// # Errors
    /// Reading the positions; the gate's.
    pub(crate) fn global_positions(&mut self, ctx: &TaskContext) -> Result<()> {
        match &self.global {
            Some(g) => g.positions(ctx, &mut self.tasks),
            None => Ok(()),
        }
    }

    /// Takes every task out for a rebuild from the last commit, with what each refused for
    /// good (those inputs stay refused in the rebuilt tasks): a task gone returns to its last
    /// commit in memory when it can ([`Task::into_last_commit`]).
    pub(crate) fn take_all(&mut self) -> (BTreeMap<i32, Task>, Vec<RefusedInput>) {
        let refused = self
            .tasks
            .values_mut()
            .flat_map(Task::take_refused)
            .collect();
        let tasks = std::mem::take(&mut self.tasks);
        self.clear();
        (tasks, refused)
    }

    /// Persists what the state store buffers, if fold state lives on disk: the next start
    /// reads only the tail of the changelog.
    pub(crate) fn persist_stores(&self) {
        if let Some(stores) = &self.stores
            && let Err(e) = stores.persist()
        {
            warn!(error = %e, "the state store could not be persisted; the next start reads more of the changelog");
        }
    }

    /// Hands a fetched record to its task, or holds it in `intake` beyond its channel's
    /// alignment bound (counted when its channel starts holding).
    ///
    /// # Errors
    /// [`ProcessingError::Gate`](parsley_task::error::ProcessingError::Gate) when no task of the
    /// stage consumes the record's partition; the task's.
    pub(crate) fn offer(
        &mut self,
        ctx: &TaskContext,
        intake: &mut Intake,
        f: Box<Fetched>,
    ) -> Result<()> {
        let f = match intake.hold(ctx, f)? {
            Hold::Offer(f) => f,
            Hold::Held { first } => {
                if first {
                    ctx.metrics.aligned();
                }
                return Ok(());
            }
        };
        let partition = f.partition;
        let p = &f.arrival.payload;
        self.observe_fetched(
            p.key.as_ref().map_or(0, Vec::len) + p.value.as_ref().map_or(0, Vec::len),
        );
        let Some(task) = self.tasks.get_mut(&partition) else {
            return Err(ctx.gate_error(
                partition,
                parsley_gate::GateError::NotSeeded { channel: f.channel },
            ));
        };
        task.offer(ctx, f)
    }

    /// Applies the stage's policy to the impossible stamps the gates found.
    pub(crate) fn resolve_impossible(
        &mut self,
        ctx: &TaskContext,
        txn: &mut Transaction,
    ) -> Result<()> {
        for task in self.tasks.values_mut() {
            let work = task.resolve_impossible(ctx, txn);
            txn.add(work?);
        }
        Ok(())
    }

    /// Delivers what every task's gate releases, its sends going to the transaction (held
    /// while a commit is in flight), then publishes the tasks' counters.
    pub(crate) fn deliver(&mut self, ctx: &TaskContext, txn: &mut Transaction) -> Result<()> {
        let mut result = Ok(());
        for task in self.tasks.values_mut() {
            let _span = trace_span!("deliver", partition = task.partition()).entered();
            match task.deliver(ctx, txn) {
                Ok(work) => txn.add(work),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.publish_metrics(ctx);
        result
    }

    /// Adds each task's counted deliveries to its metrics and sets the stage's gauges.
    fn publish_metrics(&mut self, ctx: &TaskContext) {
        publish_counts(
            self.tasks.values_mut(),
            &ctx.metrics,
            self.event_time.is_some(),
        );
    }

    /// Writes a tick of the built-in clock, in the open transaction, for every task whose tick
    /// interval has passed (module `task::ticks`); the wall clock gives the ticks' timestamps.
    pub(crate) fn write_ticks(&mut self, ctx: &TaskContext, txn: &mut Transaction) -> Result<()> {
        if ctx.clock.is_none() {
            return Ok(());
        }
        let now = wall_clock_ms();
        for task in self.tasks.values_mut() {
            let work = task.tick(ctx, txn, now)?;
            txn.add(work);
        }
        Ok(())
    }

    /// How long until a task's next tick is due: the longest the next poll may wait (a stage
    /// without the built-in clock, or with no task, waits for the other reasons only).
    pub(crate) fn until_tick(&self, ctx: &TaskContext) -> Duration {
        let now = wall_clock_ms();
        self.tasks
            .values()
            .filter_map(|t| t.tick_due_in(ctx, now))
            .min()
            .map_or(Duration::MAX, |ms| Duration::from_millis(ms.max(0) as u64))
    }

    /// A task whose open transaction's tick would release a parked record, if any: its
    /// partition and the tick's time (module `task::ticks`).
    pub(crate) fn open_tick_releases(&self) -> Option<(i32, i64)> {
        self.tasks
            .values()
            .find_map(|t| Some((t.partition(), t.open_tick_releases()?)))
    }

    /// Something to commit besides the transaction's work: a task whose consumed positions
    /// moved since its last snapshot.
    pub(crate) fn position_moved(&self) -> bool {
        self.tasks.values().any(Task::position_moved)
    }

    /// The open transaction starts committing: its ticks are counted as committing.
    pub(crate) fn tick_committing(&mut self) {
        for task in self.tasks.values_mut() {
            task.tick_committing();
        }
    }

    /// The input record that the stage's bad-record policy takes for `e`: an output of it
    /// refused for good ([`RecordError::OutputRefused`]) under `Skip` or `DeadLetter`, the first
    /// time. A refused dead letter or changelog record, an input not known, or `Fail` leave
    /// the error to end the stage (counted as a bad record when its input is known).
    pub(crate) fn refused_input(&self, ctx: &TaskContext, e: &Error) -> Option<RefusedInput> {
        let Error::Record(RecordError::OutputRefused {
            input: Some(input),
            dead_letter: false,
            ..
        }) = e
        else {
            return None;
        };
        if ctx.bad_records == parsley_stage::BadRecordPolicy::Fail {
            // Counted here: under the other policies the redo counts it.
            ctx.metrics
                .bad_record(parsley_stage::BadRecordKind::OutputRefused);
            return None;
        }
        let source = ctx.source_index(&input.topic).ok()?;
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
        RefusedInput::of(e, source)
    }

    /// Applies each task's watermark alignment ([`align`]), then its backpressure plan:
    /// gate steps first, then the consumer's pauses and resumes, then its seeks.
    pub(crate) fn apply_backpressure(
        &mut self,
        ctx: &TaskContext,
        intake: &mut Intake,
        txn: &mut Transaction,
        timeout: Duration,
    ) -> Result<()> {
        let mut pauses = Vec::new();
        let mut seeks = Vec::new();
        let max_drift = self.event_time.as_ref().and_then(|o| o.max_drift_ms);
        let at = self.account_memory(ctx, intake.held_bytes());
        let mut spilled_at_bound = 0;
        for task in self.tasks.values_mut() {
            if let Some(drift) = max_drift {
                align(ctx, intake, txn, task, drift)?;
            }
            let partition = task.partition();
            // Parked records, or records held for alignment, wait for the watermark, which
            // only reading moves.
            let keep_reading = task.event_time().is_some_and(|e| e.parked() > 0)
                || (max_drift.is_some()
                    && task.gate().consumed().any(|c| intake.held_records(&c) > 0));
            let steps =
                backpressure::plan_at_bound(task.gate(), intake.full(), ctx.cap, at, keep_reading);
            let gate = task.gate_mut();
            // A global source is read by the task's own reader, not the stage's consumer
            // (module `global`): it is not paused, spilled or sought.
            for step in steps.into_iter().filter(|s| !ctx.is_global(s.channel())) {
                match step {
                    Step::Spill(channel) => {
                        let n = gate.spill(&channel);
                        debug!(%channel, spilled = n, "spilling a channel that is full");
                        ctx.metrics.spilled(n);
                        if at == AtBound::Squeeze {
                            spilled_at_bound += n;
                        }
                    }
                    Step::BeginRefetch { channel, from } => {
                        let resume = gate
                            .begin_refetch(channel, from)
                            .map_err(|e| ctx.gate_error(partition, e))?;
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
        if let Some(m) = &self.memory {
            m.spilled(ctx, spilled_at_bound);
        }
        for (channel, full) in pauses {
            debug!(%channel, full, "backpressure");
            intake.set_full(ctx, channel, full)?;
        }
        if ctx.has_global() {
            // While a task reads its global sources to their end, its other partitions wait
            // (module `global`).
            for task in self.tasks.values() {
                let bootstrapping = task.bootstrapping();
                for channel in ctx.consumed(task.partition()) {
                    if !ctx.is_global(channel) {
                        intake.set_bootstrapping(ctx, channel, bootstrapping)?;
                    }
                }
            }
        }
        for (channel, offset) in seeks {
            intake.seek(ctx, channel, offset, timeout)?;
        }
        Ok(())
    }

    /// Makes the event-time input channels of the task of `partition` that other stages write
    /// wait for them (module `upstream`).
    ///
    /// # Errors
    /// Reading the last stable offsets.
    fn wait_for_upstream(
        &mut self,
        ctx: &TaskContext,
        admin: &Admin,
        partition: i32,
    ) -> Result<()> {
        for (source, topic) in self.event_time_fed(ctx) {
            let channel = Channel::new(ctx.sources[source].id, partition);
            self.upstreams.wait(admin, channel, &topic)?;
        }
        Ok(())
    }

    /// The stage's sources (index and name) that other stages write, when it orders by event
    /// time.
    fn event_time_fed(&self, ctx: &TaskContext) -> Vec<(usize, String)> {
        if self.event_time.is_none() {
            return Vec::new();
        }
        ctx.sources
            .iter()
            .enumerate()
            .filter(|(_, t)| self.upstreams.fed(&t.name).is_some())
            .map(|(i, t)| (i, t.name.clone()))
            .collect()
    }

    /// Reads the feeding stages' progress for the waiting channels, at most once per commit
    /// interval, and starts the catch-up of each channel whose feeding stages have all
    /// committed: its startup end is its high watermark now.
    ///
    /// # Errors
    /// Admin and consumer errors; the tracker's.
    pub(crate) fn read_upstreams(
        &mut self,
        ctx: &TaskContext,
        admin: &Admin,
        config: &RuntimeConfig,
    ) -> Result<()> {
        if !self
            .upstreams
            .look_due(Instant::now(), config.commit_interval)
        {
            return Ok(());
        }
        let tasks = &self.tasks;
        let done = self.upstreams.advance(admin, config.timeout, |c| {
            tasks
                .get(&c.partition)
                .is_some_and(|t| t.event_time().is_some())
        })?;
        if done.is_empty() {
            return Ok(());
        }
        let request: Vec<(&str, i32)> = done
            .iter()
            .map(|(c, topic)| (topic.as_str(), c.partition))
            .collect();
        let ends = admin.high_watermarks(&request)?;
        for ((c, topic), end) in done.iter().zip(ends) {
            let Some(task) = self.tasks.get_mut(&c.partition) else {
                continue;
            };
            let (gate, Some(et)) = task.gate_and_event_time() else {
                continue;
            };
            et.start(*c, end)
                .and_then(|()| et.follow(gate))
                .map_err(|e| ctx.gate_error(c.partition, e))?;
            info!(
                topic = %topic,
                partition = c.partition,
                startup_end = end,
                "the stages writing this event-time input have committed their history"
            );
        }
        Ok(())
    }
}

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
