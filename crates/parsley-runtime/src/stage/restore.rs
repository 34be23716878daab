//! Restore: building an assigned task from its changelog partition (the book's specification, §7,
//! exact restore).
//!
//! The task's changelog partition is read `read_committed` up to its high watermark
//! (`changelog::restore`): fold state, sender incarnation and sequence, node clock, gate
//! snapshot and, for an event-time stage, the watermark and timer queue. The task starts from
//! that snapshot only if it was committed with exactly the group's committed offsets
//! ([`Task::restore`]); a task that never committed starts fresh, its gate seeded at the
//! assigned positions ([`Task::fresh`]). A consumed channel the snapshot does not name starts
//! at its log start offset (case C11). An event-time task then reads the startup end of each
//! input (one batched `ListOffsets(LATEST, READ_UNCOMMITTED)`) and follows the restored gate's
//! frontiers (the book's specification, §5).
//!
//! Invariant: a task reports [`TaskPhase::Running`] only once everything restored is in
//! place — the snapshot, the state, the event-time state and its counters.

use std::collections::BTreeMap;
use std::time::Instant;

use parsley_clock::Channel;
use parsley_gate::Part;
use parsley_stage::changelog::Restored;
use tracing::{info, info_span};

use super::StageRunner;
use super::context::TaskContext;
use super::task::{FoldState, KeyedTimers, Task};
use crate::admin::Admin;
use crate::changelog;
use crate::clients::ClientRole;
use crate::error::{Error, Result};
use crate::event_time::EventTime;
use crate::metrics::TaskPhase;
use crate::state_store::{self, ChangelogView, StateStores, TaskStore};

impl StageRunner {
    /// Builds the task of `partition`, assigned at `positions` (the group's committed offsets,
    /// or the log start where it has none), from its changelog partition (module docs).
    ///
    /// # Errors
    /// The changelog's read and decoding errors; [`crate::Error::RestoreMismatch`];
    /// [`crate::Error::EventTime`]; admin errors.
    pub(super) fn restore_task(
        &mut self,
        partition: i32,
        positions: Vec<(Channel, i64)>,
    ) -> Result<Task> {
        let _span = info_span!("restore", partition).entered();
        let started = Instant::now();
        let metrics = self.metrics.clone();
        metrics.task(partition, |m| m.phase = TaskPhase::Restoring);
        let client = self.restore_client();
        let changelog = self.txn.changelog().clone();
        let (from, restored, store) = match &self.stores {
            Some(stores) => {
                let (store, from, restored) = self.local_copy(stores, partition)?;
                (from, restored, Some(store))
            }
            None => (0, Restored::default(), None),
        };
        metrics.task(partition, |m| m.restore_start = from);
        let (restored, replaced) = changelog::restore(
            &client,
            self.evidence.admin(),
            (&changelog.name, partition),
            (from, restored, store.as_ref().map(|s| (s, changelog.id))),
            (self.config.timeout, self.config.transaction_timeout()),
            &mut |position, end| {
                metrics.task(partition, |m| {
                    m.restore_position = position;
                    m.restore_end = end;
                })
            },
            &mut |wait| metrics.explained().set_restore(partition, wait),
        )?;
        let records = restored.records;
        let mut cluster = Cluster(self.evidence.admin());
        let (task, moved) = rebuild_task(
            &self.ctx,
            self.spec.event_time(),
            partition,
            positions,
            restored,
            store.map(|s| FoldState::disk(s, changelog.id)),
            &mut cluster,
        )?;
        for (channel, start) in moved {
            self.intake
                .seek(&self.ctx, channel, start, self.config.timeout)?;
        }
        if task.event_time().is_some() {
            self.wait_for_upstream(partition)?;
        }
        let took = started.elapsed();
        self.metrics.task(partition, |m| {
            m.phase = TaskPhase::Running;
            m.restore_ms = took.as_millis() as u64;
        });
        info!(
            partition,
            from,
            records,
            consumers_replaced = replaced,
            keys = task.state_len(),
            sender = %task.clock().sender(),
            next_seq = task.clock().next_seq(),
            took_ms = took.as_millis() as u64,
            "task restored"
        );
        Ok(task)
    }

    /// The keyspace of task `partition` in the stage's state store, the changelog offset to
    /// read from and what the keyspace holds besides fold state: from its checkpoint when that
    /// can be trusted (`state_store::judge`), else from 0 with the keyspace cleared.
    ///
    /// # Errors
    /// [`Error::StateStore`]; admin errors.
    fn local_copy(
        &self,
        stores: &StateStores,
        partition: i32,
    ) -> Result<(TaskStore, i64, Restored)> {
        let store = stores.task(partition)?;
        let changelog = self.txn.changelog();
        let admin = self.evidence.admin();
        let at = [(changelog.name.as_str(), partition)];
        let view = ChangelogView {
            topic: changelog.id,
            log_start: admin.log_start_offsets(&at)?[0],
            end: admin.high_watermarks(&at)?[0],
            delete_retention_ms: stores.delete_retention_ms(),
            now_ms: state_store::now_ms(),
        };
        let mut restored = Restored {
            state_elsewhere: true,
            ..Restored::default()
        };
        match state_store::judge(store.checkpoint()?, view) {
            Ok(from) => {
                store.load_into(&mut restored)?;
                Ok((store, from, restored))
            }
            Err(why) => {
                info!(
                    partition,
                    why, "the state store's copy is not used: reading the changelog whole"
                );
                store.clear()?;
                Ok((store, 0, restored))
            }
        }
    }

    /// The configuration of the consumer that reads a changelog partition (`read_committed`,
    /// assigned explicitly; its group is never joined).
    fn restore_client(&self) -> rdkafka::ClientConfig {
        let group = self.spec.group_id(&self.app);
        let restore_group = format!("{}.restore", self.txn.changelog_name());
        self.config.client_config(
            &group,
            ClientRole::Restore,
            &[
                ("group.id", &restore_group),
                ("isolation.level", "read_committed"),
                ("enable.auto.commit", "false"),
                ("enable.partition.eof", "false"),
                ("fetch.wait.max.ms", "50"),
                // As the stage's consumer: librdkafka stops fetching while 100,000 records
                // wait in the queue and looks again only after `fetch.queue.backoff.ms` (1 s
                // by default), so a restore that folds slower than it fetches would stand
                // still for most of each second (measured on 2 M records: 2.5-4.1x a plain
                // read of the changelog with the default, 0.8-1.2x with 10 ms).
                ("fetch.queue.backoff.ms", "10"),
            ],
        )
    }
}

/// Where a task being restored reads what it needs from its sources' partitions: the cluster
/// (the stream thread), or the in-memory logs (the test driver).
pub(crate) trait StartEvidence {
    /// The log start offset of source channel `channel`.
    ///
    /// # Errors
    /// The read's.
    fn log_start(&mut self, ctx: &TaskContext, channel: Channel) -> Result<i64>;

    /// The high watermark (`READ_UNCOMMITTED`) and the last stable offset of each of
    /// `channels`, in order.
    ///
    /// # Errors
    /// The read's.
    fn ends(&mut self, ctx: &TaskContext, channels: &[Channel]) -> Result<Vec<(i64, i64)>>;
}

/// The cluster, through the stage's admin client.
struct Cluster<'a>(&'a Admin);

impl StartEvidence for Cluster<'_> {
    fn log_start(&mut self, ctx: &TaskContext, channel: Channel) -> Result<i64> {
        let topic = &ctx.source_of(channel)?.name;
        Ok(self
            .0
            .log_start_offsets(&[(topic.as_str(), channel.partition)])?[0])
    }

    fn ends(&mut self, ctx: &TaskContext, channels: &[Channel]) -> Result<Vec<(i64, i64)>> {
        let mut request = Vec::with_capacity(channels.len());
        for c in channels {
            request.push((ctx.source_of(*c)?.name.as_str(), c.partition));
        }
        let ends = self.0.high_watermarks(&request)?;
        let stable = self.0.last_stable_offsets(&request)?;
        Ok(ends.into_iter().zip(stable).collect())
    }
}

/// Builds the task of `partition`, assigned at `positions` (the group's committed offsets, or
/// the log start where it has none), from what its changelog partition holds (`restored`):
/// from its snapshot ([`Task::restore`]) when it has one, else fresh ([`Task::fresh`]); a
/// consumed channel the snapshot does not name is seeded at its log start; an event-time
/// task's order is restored and started ([`start_event_time`]), and its per-key late counts
/// published. Its fold state is `fold` (on disk), or else the restored records' (in memory).
/// Returns the task and the channels whose fetch position must move to their log start,
/// with it.
///
/// # Errors
/// [`Error::RestoreMismatch`]; [`Error::EventTime`]; the gate's; `evidence`'s.
pub(crate) fn rebuild_task(
    ctx: &TaskContext,
    order: Option<&parsley_stage::EventTimeOrder>,
    partition: i32,
    positions: Vec<(Channel, i64)>,
    mut restored: Restored,
    fold: Option<FoldState>,
    evidence: &mut dyn StartEvidence,
) -> Result<(Task, Vec<(Channel, i64)>)> {
    let fold = fold.unwrap_or_else(|| FoldState::memory(std::mem::take(&mut restored.state)));
    // The event-time record belongs to the snapshot it was committed with.
    let event_bytes = restored
        .snapshot
        .as_ref()
        .and(restored.event_time.as_ref())
        .cloned();
    let timers = std::mem::take(&mut restored.timers);
    let keyed_timers = std::mem::take(&mut restored.keyed_timers);
    let mut moved = Vec::new();
    let mut task = match restored.snapshot {
        Some(snapshot) => {
            let (mut task, fresh) = Task::restore(ctx, partition, positions, snapshot, fold)?;
            for (channel, position) in fresh {
                let start = evidence.log_start(ctx, channel)?;
                info!(partition, %channel, group_offset = position, start, "a channel new to the task starts at its log start");
                if start != position {
                    moved.push((channel, start));
                }
                task.seed(channel, start)
                    .map_err(|e| ctx.gate_error(partition, e))?;
            }
            task
        }
        None => Task::fresh(partition, ctx.consumed(partition), &positions, fold)
            .map_err(|e| ctx.gate_error(partition, e))?,
    };
    let event_time = event_time_of(ctx, order, partition, event_bytes.as_deref(), &timers)?;
    let event_time = match event_time {
        Some(et) => Some(start_event_time(ctx, &task, et, evidence)?),
        None => None,
    };
    if !keyed_timers.is_empty() && event_time.is_none() {
        return Err(Error::EventTime {
            stage: ctx.stage.clone(),
            partition,
            message: format!(
                "{} keyed timers are set, but the stage no longer orders by event time",
                keyed_timers.len()
            ),
        });
    }
    task.set_event_time(event_time);
    if let Some(clock) = &ctx.clock {
        task.set_clock(Channel::new(ctx.sources[clock.source].id, partition));
    }
    task.set_timers(KeyedTimers::restored(keyed_timers));
    ctx.metrics.set_late_keys(
        partition,
        true,
        task.event_time()
            .into_iter()
            .flat_map(EventTime::late_by_key),
    );
    Ok((task, moved))
}

/// Starts the event-time order `et` of `task` just restored: the startup end of each input —
/// one batched `ListOffsets(LATEST, READ_UNCOMMITTED)` in the stream thread — and the restored
/// gate's frontiers: completeness from end offsets, never from a timeout.
///
/// # Errors
/// `evidence`'s; the tracker's, naming the task.
fn start_event_time(
    ctx: &TaskContext,
    task: &Task,
    mut et: EventTime,
    evidence: &mut dyn StartEvidence,
) -> Result<EventTime> {
    let partition = task.partition();
    // An input other stages write waits for them before it gets its startup end (module
    // `upstream`); meanwhile it holds the watermark.
    let mut inputs = Vec::new();
    for c in et.inputs() {
        if let Some(fed) = ctx.fed_by_stages[ctx.source_position(c)?] {
            et.unordered(c, fed.read_by_writers)
                .map_err(|e| ctx.gate_error(partition, e))?;
        } else {
            inputs.push(c);
        }
    }
    let ends = evidence.ends(ctx, &inputs)?;
    for (c, (end, lso)) in inputs.iter().zip(ends) {
        et.start(*c, end)
            .map_err(|e| ctx.gate_error(partition, e))?;
        // Completeness waits for an open transaction to resolve (completeness is never guessed):
        // say which channel waits and for what, rather than guess.
        if lso < end && task.gate().first_undelivered(c).is_some_and(|f| f < end) {
            info!(
                topic = %ctx.source_of(*c)?.name,
                partition = c.partition,
                last_stable_offset = lso,
                startup_end = end,
                "event-time catch-up waits for an open transaction: history ends at the \
                 high watermark, above the last stable offset, until it commits or aborts"
            );
        }
    }
    et.follow(task.gate())
        .map_err(|e| ctx.gate_error(partition, e))?;
    info!(
        partition,
        parked = et.parked(),
        watermark = ?et.watermark(),
        catching_up = et.catching_up(),
        "event-time order started"
    );
    Ok(et)
}

/// The event-time order of a task just restored, when the stage orders by event time (not
/// started yet: the caller reads the startup ends): decoded from `bytes` (the changelog's
/// event-time record committed with the task's snapshot) and `timers`, or fresh.
///
/// # Errors
/// [`Error::EventTime`] for a record that does not decode, or for parked records in the
/// changelog of a stage that no longer orders by event time (they would be lost).
pub(crate) fn event_time_of(
    ctx: &TaskContext,
    order: Option<&parsley_stage::EventTimeOrder>,
    partition: i32,
    bytes: Option<&[u8]>,
    timers: &BTreeMap<Part<Vec<u8>>, Vec<u8>>,
) -> Result<Option<EventTime>> {
    let event_error = |message: String| Error::EventTime {
        stage: ctx.stage.clone(),
        partition,
        message,
    };
    if order.is_none() {
        if timers.keys().any(|p| matches!(p, Part::Segment(_))) {
            return Err(event_error(
                "the changelog holds parked records but the stage no longer orders by event time; they would be lost".into(),
            ));
        }
        return Ok(None);
    }
    // The hand-run control stream or the built-in clock's topic.
    let control = ctx
        .control
        .map(|(source, lag_ms)| (ctx.sources[source].id, lag_ms));
    let inputs: Vec<Channel> = ctx
        .sources
        .iter()
        .filter(|t| Some(t.id) != control.map(|(id, _)| id))
        .map(|t| Channel::new(t.id, partition))
        .collect();
    let topics = ctx.sources.iter().map(|t| (t.id, t.name.clone()));
    Ok(Some(match bytes {
        Some(b) => EventTime::decode(inputs, control, topics, b, timers).map_err(event_error)?,
        None => EventTime::new(inputs, control, topics),
    }))
}
