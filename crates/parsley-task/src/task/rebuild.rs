//! Rebuilding an assigned task from what its changelog partition holds, the same way in the
//! stream thread and in the test driver (the book's specification, §7, exact restore).
//!
//! The task starts from its snapshot only if it was committed with exactly the group's
//! committed offsets ([`Task::restore`]); a task that never committed starts fresh, its gate
//! seeded at the assigned positions ([`Task::fresh`]). A consumed channel the snapshot does not
//! name starts at its log start offset (case C11). An event-time task then reads the startup end
//! of each input and follows the restored gate's frontiers (the book's specification, §5).
//! Where the log starts and ends comes through [`StartEvidence`]: the cluster in the stream
//! thread, the in-memory logs in the test driver.

use std::collections::BTreeMap;

use parsley_clock::{CausalClock, Channel, SenderId};
use parsley_gate::{Gate, GateError, Part};
use parsley_stage::changelog::{Restored, TaskSnapshot};
use tracing::{info, warn};

use super::{FoldState, KeyedTimers, Punctuations, Task};
use crate::context::TaskContext;
use crate::error::ProcessingError;
use crate::error::{Error, Result};
use crate::event_time::EventTime;

/// Where a task being restored reads what it needs from its sources' partitions: the cluster
/// (the stream thread), or the in-memory logs (the test driver).
pub trait StartEvidence {
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

impl Task {
    /// A task that never committed: a new sender incarnation, its gate seeded at `positions`
    /// (the consumer's start positions), with fold state `fold` (what the changelog holds
    /// without a snapshot: nothing, normally).
    ///
    /// # Errors
    /// The gate's, for a position on a channel the task does not consume.
    pub fn fresh(
        partition: i32,
        consumed: Vec<Channel>,
        positions: &[(Channel, i64)],
        fold: FoldState,
    ) -> Result<Self, GateError> {
        let mut gate = Gate::new(consumed);
        for &(channel, position) in positions {
            gate.seed(channel, position)?;
        }
        let clock = CausalClock::transactional(SenderId::random());
        Ok(Task::with(partition, gate, clock, fold, Vec::new()))
    }

    /// The task restored from its last committed `snapshot` and fold state (the book's
    /// specification, §7, exact restore), assigned at `positions` (the group's committed offsets,
    /// or the log start where it has none). Returns the task and the consumed channels the snapshot
    /// does not name, with their assigned positions: channels new to the task, which the caller
    /// seeds ([`Task::seed`]) at their log start. A global source's channel is compared with
    /// nothing: it resumes at the snapshot's offset, or is new (its position in `positions` is
    /// its log start).
    ///
    /// Channels the snapshot names that the task no longer consumes belong to a deleted topic
    /// (a recreated topic is a new channel) and are dropped; a consumed channel the snapshot
    /// does not name is new: a group offset for it can only be left over from the topic's
    /// previous incarnation (case C11).
    ///
    /// # Errors
    /// [`ProcessingError::RestoreMismatch`] when the snapshot was committed with other offsets than
    /// `positions` on the channels it names; the gate's errors.
    pub fn restore(
        ctx: &TaskContext,
        partition: i32,
        mut positions: Vec<(Channel, i64)>,
        mut snapshot: TaskSnapshot,
        fold: FoldState,
    ) -> Result<(Self, Vec<(Channel, i64)>)> {
        let consumed = ctx.consumed(partition);
        positions.sort();
        let gone: Vec<Channel> = snapshot
            .offsets
            .iter()
            .map(|(c, _)| *c)
            .filter(|c| !consumed.contains(c))
            .collect();
        if !gone.is_empty() {
            warn!(
                partition,
                ?gone,
                "channels of the snapshot are gone (topic deleted or recreated)"
            );
        }
        snapshot.offsets.retain(|(c, _)| consumed.contains(c));
        snapshot
            .gate
            .channels
            .retain(|c| consumed.contains(&c.channel));
        let mut fresh = Vec::new();
        positions.retain(|&(c, o)| {
            let known = snapshot.offsets.iter().any(|(s, _)| *s == c);
            if !known {
                fresh.push((c, o));
            }
            // A global channel resumes where the snapshot says: the group has no offset for it.
            known && !ctx.is_global(c)
        });
        let mut snapshot_offsets = snapshot.offsets.clone();
        snapshot_offsets.sort();
        let committed_with: Vec<(Channel, i64)> = snapshot_offsets
            .iter()
            .copied()
            .filter(|(c, _)| !ctx.is_global(*c))
            .collect();
        if committed_with != positions {
            let name = |cs: &[(Channel, i64)]| {
                cs.iter()
                    .map(|(c, o)| format!("{}/{}@{o}", ctx.topic_name(c.topic), c.partition))
                    .collect()
            };
            return Err(Error::Processing(ProcessingError::RestoreMismatch {
                stage: ctx.stage.clone(),
                partition,
                changelog: name(&committed_with),
                group: name(&positions),
            }));
        }
        let gate = Gate::restore(consumed.iter().copied(), &snapshot.gate)
            .map_err(|e| ctx.gate_error(partition, e))?;
        let clock = CausalClock::resume(snapshot.sender, snapshot.next_seq, snapshot.clock, true);
        Ok((
            Task::with(partition, gate, clock, fold, snapshot_offsets),
            fresh,
        ))
    }
}

/// Builds the task of `partition`, assigned at `positions` (the group's committed offsets, or
/// the log start where it has none), from what its changelog partition holds (`restored`):
/// from its snapshot ([`Task::restore`]) when it has one, else fresh ([`Task::fresh`]); a
/// consumed channel the snapshot does not name is seeded at its log start; an event-time
/// task's order is restored and started (`start_event_time`), and its per-key late counts
/// published; a task with global sources starts its bootstrap at their last stable offsets
/// ([`Task::start_bootstrap`]). Its fold state is `fold` (on disk), or else the restored records' (in memory).
/// Returns the task and the channels whose fetch position must move to their log start,
/// with it.
///
/// # Errors
/// [`ProcessingError::RestoreMismatch`]; [`ProcessingError::EventTime`]; the gate's; `evidence`'s.
pub fn rebuild_task(
    ctx: &TaskContext,
    order: Option<&parsley_stage::EventTimeOrder>,
    partition: i32,
    positions: Vec<(Channel, i64)>,
    mut restored: Restored,
    fold: Option<FoldState>,
    evidence: &mut dyn StartEvidence,
) -> Result<(Task, Vec<(Channel, i64)>)> {
    // What the changelog held, kept to return to it without reading it (module `rollback`).
    let image = super::rollback::Image::of(&restored);
    let fold = fold.unwrap_or_else(|| FoldState::memory(std::mem::take(&mut restored.state)));
    // The event-time record belongs to the snapshot it was committed with.
    let event_bytes = restored
        .snapshot
        .as_ref()
        .and(restored.event_time.as_ref())
        .cloned();
    let timers = std::mem::take(&mut restored.timers);
    let keyed_timers = std::mem::take(&mut restored.keyed_timers);
    // The task state, like the fold state, belongs to the snapshot it was committed with.
    let task_state = restored
        .snapshot
        .as_ref()
        .and(std::mem::take(&mut restored.task_state));
    let punctuations = std::mem::take(&mut restored.punctuations);
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
    task.task_state = (task_state, false);
    task.last_commit = image;
    let event_time = event_time_of(ctx, order, partition, event_bytes.as_deref(), &timers)?;
    let event_time = match event_time {
        Some(et) => Some(start_event_time(ctx, &task, et, evidence)?),
        None => None,
    };
    if !keyed_timers.is_empty() && event_time.is_none() {
        return Err(Error::Processing(ProcessingError::EventTime {
            stage: ctx.stage.clone(),
            partition,
            message: format!(
                "{} keyed timers are set, but the stage no longer orders by event time",
                keyed_timers.len()
            ),
        }));
    }
    task.set_event_time(event_time);
    if ctx.has_global() {
        // Caught up to the last stable offsets found now, as a read-committed consumer sees
        // the end (module `global` of the task).
        let channels = ctx.global_channels();
        let ends = evidence.ends(ctx, &channels)?;
        task.start_bootstrap(
            channels
                .into_iter()
                .zip(ends)
                .map(|(c, (_, lso))| (c, lso))
                .collect(),
        );
    }
    if let Some(clock) = &ctx.clock {
        task.set_clock(Channel::new(ctx.sources[clock.source].id, partition));
    }
    task.set_timers(KeyedTimers::restored(keyed_timers));
    task.set_punctuations(Punctuations::new(ctx.processor.schedules(), punctuations));
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
/// [`ProcessingError::EventTime`] for a record that does not decode, or for parked records in the
/// changelog of a stage that no longer orders by event time (they would be lost).
pub fn event_time_of(
    ctx: &TaskContext,
    order: Option<&parsley_stage::EventTimeOrder>,
    partition: i32,
    bytes: Option<&[u8]>,
    timers: &BTreeMap<Part<Vec<u8>>, Vec<u8>>,
) -> Result<Option<EventTime>> {
    let event_error = |message: String| {
        Error::Processing(ProcessingError::EventTime {
            stage: ctx.stage.clone(),
            partition,
            message,
        })
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
