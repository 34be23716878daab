//! A task's side of the built-in clock ([`parsley_stage::BuiltInClock`]): writing ticks to its
//! partition of the clock topic, and reading them back.
//!
//! **Writing.** [`Task::tick`] is called once per turn of the stream thread (and of the test
//! driver) with the time now, ms since the epoch — the wall clock, or the driver's time. When
//! the clock's interval has passed since the task's last tick (or it has written none since it
//! was built), it hands one tick to the [`Output`], the same send path as the handler's
//! outputs, so the tick is in the stage's transaction: visible when it commits, gone when it
//! aborts or its producer is fenced. A tick has no stamp header (it claims nothing, and the gate
//! passes it once visible), the task's partition number in decimal as key (the topic is
//! compacted; its keys are not checked against murmur2), an empty value and the time now as
//! record timestamp. If the time now is below the last tick's (the wall clock stepped back),
//! a tick is written at once: the watermark never decreases, so an earlier tick changes
//! nothing, and the interval counts from it.
//!
//! **Committing early.** A tick counts only once its transaction commits. When the open
//! transaction's tick would release a parked record or fire a timer once read back
//! ([`Task::open_tick_releases`]), the stage commits at once instead of at the end of the
//! commit interval: a live record then waits for the lag, the next tick and one commit, not
//! for up to a whole commit interval more. Only once every input is caught up (before, offset
//! completeness moves the watermark, and a commit per tick would slow the drain of history),
//! so at most one early commit per tick interval.
//!
//! **Reading.** A tick the gate delivers ([`Task::read_tick`]) moves the task's processing time
//! to its record timestamp ([`EventTime::tick`]) and drives the wall-clock punctuation schedules
//! (module `punctuation`); it is not observed by the node clock (no
//! output claims it), never parked and never handed to the processor, and it counts in no
//! delivery — only in the stage's `ticks_read`. Its offset is committed like any other.
//!
//! Invariant: a tick's send tag names the clock channel; its delivery report touches no
//! clock claim and names no input record.

use super::*;
use crate::error::{ProcessingError, RecordError};

/// The task's partition of the clock topic and what it wrote there.
#[derive(Debug)]
pub(super) struct Ticker {
    channel: Channel,
    /// The timestamp of the last tick written, ms since the epoch; `None` since the task was
    /// built (a restart or a rebalance writes one at once).
    last_ms: Option<i64>,
    /// Ticks written by this task since it was built (their send sequence).
    written: u64,
    /// The timestamp of the last tick written since the last commit started, ms since the
    /// epoch: the tick the open transaction carries, not visible yet.
    open_ms: Option<i64>,
}

/// Whether a tick is due at `now_ms` after one at `last_ms`, every `interval_ms` (module docs).
pub fn tick_due(last_ms: Option<i64>, now_ms: i64, interval_ms: i64) -> bool {
    match last_ms {
        None => true,
        Some(last) => now_ms < last || now_ms - last >= interval_ms,
    }
}

impl Task {
    /// Makes the task write the built-in clock's ticks to `channel` (its partition of the clock
    /// topic).
    pub fn set_clock(&mut self, channel: Channel) {
        self.ticker = Some(Ticker {
            channel,
            last_ms: None,
            written: 0,
            open_ms: None,
        });
    }

    /// `true` for the send tag of a tick: its report touches no clock claim.
    pub fn is_tick(&self, tag: &SendTag) -> bool {
        self.ticker
            .as_ref()
            .is_some_and(|t| t.channel == tag.channel)
    }

    /// How long until this task's next tick is due at `now_ms` (ms since the epoch); `None`
    /// without a built-in clock.
    pub fn tick_due_in(&self, ctx: &TaskContext, now_ms: i64) -> Option<i64> {
        let interval = ctx.clock.as_ref()?.interval_ms;
        let ticker = self.ticker.as_ref()?;
        Some(match ticker.last_ms {
            Some(last) if !tick_due(Some(last), now_ms, interval) => last + interval - now_ms,
            _ => 0,
        })
    }

    /// Writes a tick to `out` with record timestamp `now_ms` (ms since the epoch) when one is
    /// due (module docs); the work counts it so that its transaction commits.
    ///
    /// # Errors
    /// The output's refusal.
    pub fn tick(&mut self, ctx: &TaskContext, out: &mut dyn Output, now_ms: i64) -> Result<Work> {
        let (Some(clock), Some(ticker)) = (&ctx.clock, self.ticker.as_mut()) else {
            return Ok(Work::default());
        };
        if !tick_due(ticker.last_ms, now_ms, clock.interval_ms) {
            return Ok(Work::default());
        }
        let tag = SendTag {
            task: self.partition,
            channel: ticker.channel,
            seq: ticker.written,
        };
        out.send(Outgoing {
            topic: clock.name.clone(),
            tag,
            key: Some(self.partition.to_string().into_bytes()),
            value: Some(Vec::new()),
            stamp: &[],
            headers: &[],
            timestamp: Some(now_ms),
        })?;
        ticker.last_ms = Some(now_ms);
        ticker.open_ms = Some(now_ms);
        ticker.written += 1;
        self.counts.ticks += 1;
        ctx.metrics.tick_written();
        trace!(partition = self.partition, now_ms, "tick written");
        Ok(Work {
            ticks: 1,
            ..Work::default()
        })
    }

    /// The tick of the open transaction is no longer open: a commit started (module docs).
    pub fn tick_committing(&mut self) {
        if let Some(t) = self.ticker.as_mut() {
            t.open_ms = None;
        }
    }

    /// The timestamp of the open transaction's tick (ms since the epoch) when, once read
    /// back, it would release a parked record or fire a keyed timer: every input caught up
    /// (the clock, not offset completeness, moves the watermark) and the earliest parked
    /// record or timer at or below that tick's timestamp minus the lag. `None` otherwise, and
    /// without a built-in clock.
    pub fn open_tick_releases(&self) -> Option<i64> {
        let open = self.ticker.as_ref()?.open_ms?;
        let et = self.event_time.as_ref()?;
        if et.catching_up() > 0 {
            return None;
        }
        let moved_to = open.saturating_sub(et.lag_ms()?);
        let next = [
            et.next_parked_time(),
            self.timers.next(),
            self.punctuations.next(),
        ]
        .into_iter()
        .flatten()
        .min()?;
        (next <= moved_to).then_some(open)
    }

    /// A tick the gate delivered at `offset` with record timestamp `timestamp` (ms since the
    /// epoch): processing time moves to it (module docs).
    ///
    /// # Errors
    /// [`RecordError::NoEventTime`] for a record without a timestamp;
    /// [`ProcessingError::EventTime`] for a task without event-time order (the built-in clock is
    /// part of it); the tracker's.
    pub(super) fn read_tick(
        &mut self,
        ctx: &TaskContext,
        source: usize,
        offset: i64,
        timestamp: Option<i64>,
    ) -> Result<()> {
        let timestamp = timestamp.ok_or_else(|| {
            Error::Record(RecordError::NoEventTime {
                stage: ctx.stage.clone(),
                topic: ctx.sources[source].name.clone(),
                partition: self.partition,
                offset,
            })
        })?;
        let et = self.event_time.as_mut().ok_or_else(|| {
            Error::Processing(ProcessingError::EventTime {
                stage: ctx.stage.clone(),
                partition: self.partition,
                message: "a tick of the built-in clock, but the task has no event-time order"
                    .into(),
            })
        })?;
        et.tick(timestamp)
            .map_err(|e| ctx.gate_error(self.partition, e))?;
        let lag = et.lag_ms().unwrap_or(0);
        if self.punctuations.tick(timestamp, lag) {
            self.changed = true;
        }
        ctx.metrics.tick_read();
        Ok(())
    }
}
