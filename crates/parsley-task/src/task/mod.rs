//! The task: partition `p` of every source of a stage, as pure logic — its gate, node clock,
//! fold state and event-time order — with no Kafka client in it.
//!
//! The stream thread owns the I/O around a task. It offers each fetched record
//! ([`Task::offer`]) and hands over the evidence it reads (positions, high watermarks, live
//! heads); the task delivers what its gate releases ([`Task::deliver`]), stamps every emission
//! with its node clock and hands it to an [`Output`]; delivery reports come back through
//! [`Task::acked`]; at a commit the task writes what changed to a [`ChangelogWriter`]
//! ([`Task::write_changelog`]) and names the input offsets to commit with it. A task of a stage
//! with the built-in clock also writes and reads its ticks (module `ticks`).
//!
//! # Invariants
//! - Per delivered record, in this order: the node clock observes the record (its coordinate,
//!   its stamp, and the coordinates replacing its in-flight claims), the handler runs, the fold
//!   state changes, and each emission is stamped with the node clock and handed to the output.
//!   The clock is transactional: sends not acknowledged yet are claimed in flight, so no send
//!   waits for another's acknowledgement (`parsley_clock::CausalClock`).
//! - A tick of the built-in clock is the exception: delivered, it only moves processing time
//!   (not observed, not handled); sent, it claims nothing (module `ticks`).
//! - A send the output refuses releases its claim in the clock before the error returns.
//! - `dirty` names exactly the state keys changed since the last changelog write; `changed`
//!   is set by every delivery and release since then.
//! - `snapshot_offsets` are the input offsets the last written snapshot was committed with:
//!   both describe the same moment, as the changelog and the group's offsets do after a commit.
//! - `causes` names the input record of every send made since the last changelog write (by the
//!   sequence of the first send of each run): a send refused for good names its input.

mod bad;
mod fold;
mod global;
mod punctuation;
mod rebuild;
mod rollback;
mod ticks;
mod timers;

use bad::check_key;
pub use bad::{Cause, RefusedInput};
pub use fold::{FoldState, Sealed};
pub use punctuation::Punctuations;
pub use rebuild::{StartEvidence, event_time_of, rebuild_task};
pub use rollback::LastCommit;
use std::borrow::Cow;
use std::collections::VecDeque;
pub use ticks::tick_due;
pub use timers::KeyedTimers;

use parsley_clock::{CausalClock, Channel, Coordinate, TopicId, codec};
use parsley_gate::{Gate, GateError};
use parsley_stage::changelog::{
    EVENT_TIME_KEY, META_KEY, ParkedRecord, TASK_STATE_KEY, TaskSnapshot,
};
use parsley_stage::{
    BadRecordKind, BadRecordPolicy, RawDelivery, RawEmission, RawStep, RawTimer, StateChange,
    user_headers,
};
use tracing::{trace, warn};

use super::context::{DeadLetterTopic, TaskContext};
use super::output::{ChangelogWriter, Header, Outgoing, Output};
use super::policy::{Bad, DeadLetterCause};
use super::record::{Fetched, Payload, Rare, TaskCounts, Work};
use super::{backpressure, policy};
use crate::error::{Error, InputRecord, Refusal, Result};
use crate::error::{ProcessingError, RecordError, SetupError};
use crate::event_time::{Delivered, EventTime, HandOver};
use crate::metrics::StageMetrics;
use crate::topic::{SendTag, partition_for};

/// The `tracing` target of the event sent for every record delivered to the handler, at
/// `TRACE` level, with fields `topic` (a `&str`: `fmt` prints it quoted), `partition` and
/// `offset` (committed or not): a delivery journal for audits such as the fault-injection
/// suite's re-read measurement. Off unless a subscriber enables it (e.g.
/// `RUST_LOG=parsley::delivery=trace`).
pub const DELIVERY_TARGET: &str = "parsley::delivery";

/// The timestamp a handler sees for a record without one (a message format before v1), and
/// the emission timestamp that leaves the choice to the producer's clock.
pub const NO_TIMESTAMP: i64 = -1;

/// One record handed to the handler.
struct Handled<'a> {
    source: usize,
    offset: i64,
    /// ms since the epoch, [`NO_TIMESTAMP`] when it has none.
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<Vec<u8>>,
    /// The record's headers, when the stage keeps them (for a dead letter).
    headers: &'a [Header],
}

/// A record as it arrived, for a dead letter.
struct Original<'a> {
    /// Index of its source topic.
    source: usize,
    offset: i64,
    key: Option<&'a [u8]>,
    value: Option<Vec<u8>>,
    headers: &'a [Header],
    /// ms since the epoch.
    timestamp: Option<i64>,
}

/// The partition of a record with key `key` among `partitions`: murmur2 of the key, as the
/// Java client chooses; a record without a key goes to the sending task's partition (modulo
/// the count), so where it lands does not depend on timing.
fn partition_of(key: Option<&[u8]>, task: i32, partitions: i32) -> i32 {
    match key {
        Some(key) => partition_for(key, partitions),
        None => task.rem_euclid(partitions),
    }
}

/// One task: partition `p` of every source.
pub struct Task {
    partition: i32,
    gate: Gate<Payload>,
    clock: CausalClock,
    /// The fold state, and which keys changed since the last changelog write.
    fold: FoldState,
    /// Deliveries or releases since the last changelog write (the clock and gate changed).
    changed: bool,
    /// The input offsets of the last snapshot written.
    snapshot_offsets: Vec<(Channel, i64)>,
    /// Deliveries not yet added to the task's metrics.
    counts: TaskCounts,
    /// Event-time order (watermark and timer queue), when the stage orders by event time.
    event_time: Option<EventTime>,
    /// The processor's keyed event-time timers.
    timers: KeyedTimers,
    /// The processor's punctuation schedules (module `punctuation`).
    punctuations: Punctuations,
    /// The event-time position of what the task has handed over: the release time of the
    /// last record handed over or timer fired while a release runs, the watermark after it
    /// (`None`: not ordering by event time, or no watermark yet). Never decreases.
    position: Option<i64>,
    /// The stamp encoder's buffer, reused across sends.
    stamp_buf: Vec<u8>,
    /// The input record of each run of sends not known to be acknowledged yet, by the send
    /// sequence of its first send (ascending): names the input of a refused send. Cleared at
    /// each changelog write, when every send is acknowledged.
    causes: VecDeque<(u64, Cause)>,
    /// Input records whose outputs were refused for good, to skip or dead-letter on delivery.
    refused: Vec<RefusedInput>,
    /// Its partition of the built-in clock's topic and its last tick, when the stage has one.
    ticker: Option<ticks::Ticker>,
    /// While it reads its global sources to their end offsets: what waits (module `global`).
    bootstrap: Option<Box<global::Bootstrap>>,
    /// The processor's task state (`RawStep::task_state`), and whether it changed since the
    /// last changelog write.
    task_state: (Option<Vec<u8>>, bool),
    /// What its changelog held at its last commit, and what it wrote since (module
    /// `rollback`).
    last_commit: rollback::Image,
}

impl Task {
    fn with(
        partition: i32,
        gate: Gate<Payload>,
        clock: CausalClock,
        fold: FoldState,
        snapshot_offsets: Vec<(Channel, i64)>,
    ) -> Self {
        Task {
            partition,
            gate,
            clock,
            fold,
            changed: false,
            snapshot_offsets,
            counts: TaskCounts::default(),
            event_time: None,
            timers: KeyedTimers::default(),
            punctuations: Punctuations::default(),
            position: None,
            stamp_buf: Vec::with_capacity(256),
            causes: VecDeque::new(),
            refused: Vec::new(),
            ticker: None,
            bootstrap: None,
            task_state: (None, false),
            last_commit: rollback::Image::default(),
        }
    }

    /// Seeds a channel new to the task at `position` (its log start).
    ///
    /// # Errors
    /// The gate's, for a channel the task does not consume or one seeded already.
    pub fn seed(&mut self, channel: Channel, position: i64) -> Result<(), GateError> {
        self.gate.seed(channel, position)
    }

    /// Sets the task's event-time order (after its restore).
    pub fn set_event_time(&mut self, event_time: Option<EventTime>) {
        self.position = event_time.as_ref().and_then(EventTime::watermark);
        self.event_time = event_time;
    }

    /// Moves the event-time position up to `time`.
    fn advance_position(&mut self, time: i64) {
        self.position = Some(self.position.map_or(time, |p| p.max(time)));
    }

    /// Gives the task its restored keyed timers.
    pub fn set_timers(&mut self, timers: KeyedTimers) {
        self.timers = timers;
    }

    /// Gives the task its punctuation schedules, restored.
    pub fn set_punctuations(&mut self, punctuations: Punctuations) {
        self.punctuations = punctuations;
    }

    /// Keyed timers set now.
    pub fn timers_set(&self) -> usize {
        self.timers.len()
    }

    /// The task's partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The task's gate.
    pub fn gate(&self) -> &Gate<Payload> {
        &self.gate
    }

    /// The task's gate, to hand it evidence and apply backpressure.
    pub fn gate_mut(&mut self) -> &mut Gate<Payload> {
        &mut self.gate
    }

    /// The gate, with the event-time order of an event-time stage (live-head evidence).
    pub fn gate_and_event_time(&mut self) -> (&Gate<Payload>, Option<&mut EventTime>) {
        (&self.gate, self.event_time.as_mut())
    }

    /// The event-time order, when the stage orders by event time.
    pub fn event_time(&self) -> Option<&EventTime> {
        self.event_time.as_ref()
    }

    /// The event-time order, when the stage orders by event time.
    pub fn event_time_mut(&mut self) -> Option<&mut EventTime> {
        self.event_time.as_mut()
    }

    /// The node clock.
    pub fn clock(&self) -> &CausalClock {
        &self.clock
    }

    /// The fold state.
    pub fn fold(&self) -> &FoldState {
        &self.fold
    }

    /// Keys with fold state (on disk: approximately, committed keys).
    pub fn state_len(&self) -> usize {
        self.fold.len()
    }

    /// The transactions this task wrote its changelog in so far committed; every changelog
    /// record of its partition below `next` is committed (`None`: no delivery report named an
    /// offset yet). Fold state on disk moves there ([`FoldState::committed`]).
    ///
    /// # Errors
    /// A failed write of the state store.
    pub fn committed(&mut self, next: Option<i64>) -> Result<()> {
        self.last_commit.committed();
        self.fold.committed(next)
    }

    /// The deliveries counted since the last call.
    pub fn take_counts(&mut self) -> TaskCounts {
        std::mem::take(&mut self.counts)
    }

    /// Offers a fetched record of this task to its gate, applying the policy to a malformed
    /// stamp first; a full channel that an in-flight claim needs spills at once. While the
    /// task bootstraps its global sources, a record of another channel waits instead (module
    /// `global`).
    ///
    /// # Errors
    /// The policy's error for a malformed stamp; the gate's refusal (the record is dropped
    /// with the error: the stage stops and reads it again after a restart).
    pub fn offer(&mut self, ctx: &TaskContext, fetched: impl Into<Box<Fetched>>) -> Result<()> {
        let Some(fetched) = self.hold_for_bootstrap(ctx, fetched.into()) else {
            return Ok(());
        };
        let Fetched {
            channel,
            mut arrival,
            malformed,
            ..
        } = *fetched;
        if let Some(error) = malformed {
            ctx.metrics.impossible();
            ctx.metrics
                .task(self.partition, |m| m.impossible_stamps += 1);
            if let Some(reason) = policy::on_malformed(&ctx.policy, *error)? {
                arrival
                    .payload
                    .rare
                    .get_or_insert_with(Box::default)
                    .dead_letter = Some(reason);
            }
        }
        let refetching = self.gate.refetching(&channel).is_some();
        let refetched = if refetching {
            self.gate.metrics().refetched
        } else {
            0
        };
        self.gate
            .offer(channel, arrival)
            .map_err(|refused| ctx.gate_error(self.partition, refused.kind))?;
        ctx.metrics.fetched();
        if refetching {
            ctx.metrics
                .refetched(self.gate.metrics().refetched - refetched);
        }
        backpressure::on_offer(&mut self.gate, channel, ctx.cap, &ctx.metrics);
        Ok(())
    }

    /// Delivers what the gate releases; for an event-time stage, parks each delivery in the
    /// timer queue and hands over what the watermark releases (module docs of `event_time`).
    /// A tick of the built-in clock moves processing time and goes no further (module
    /// `ticks`).
    ///
    /// # Errors
    /// The processor's; a clock or gate error; [`RecordError::NoEventTime`] for a record without a
    /// timestamp in an event-time stage; a refused send ([`RecordError::OutputRefused`] naming the
    /// stage and the input record for one refused for good).
    pub fn deliver(&mut self, ctx: &TaskContext, out: &mut dyn Output) -> Result<Work> {
        let mut work = Work::default();
        while let Some(d) = self.gate.next_delivery() {
            self.changed = true;
            let payload = d.payload;
            if ctx
                .clock
                .as_ref()
                .is_some_and(|c| c.source == payload.source)
            {
                // A tick: it moves processing time, and nothing else sees it.
                self.read_tick(
                    ctx,
                    payload.source,
                    d.coordinate.offset,
                    payload.record_timestamp,
                )?;
                work.ticks += 1;
                continue;
            }
            let stamp = d.stamp.as_ref().or(Rare::unchecked_stamp(&payload.rare));
            self.clock.observe(d.coordinate, stamp);
            for r in &d.replacements {
                self.clock.learn(*r)?;
            }
            if d.lookahead {
                ctx.metrics.lookahead();
            }
            if let Some(reason) = Rare::dead_letter(&payload.rare) {
                self.impossible_dead_letter(ctx, out, &payload, d.coordinate, reason)?;
                work.deliveries += 1;
                ctx.metrics.delivered();
                self.counts.delivered += 1;
                continue;
            }
            if let Some(key) = &payload.key {
                check_key(
                    ctx,
                    payload.source,
                    self.partition,
                    d.coordinate.offset,
                    key,
                )?;
            }
            let topic = &ctx.sources[payload.source].name;
            // `topic` as a `&str` field: a subscriber gets it without formatting.
            trace!(target: DELIVERY_TARGET, topic = topic.as_str(), partition = self.partition,
                offset = d.coordinate.offset, "delivered");
            if d.waited {
                let us = payload.arrived.elapsed().as_micros() as u64;
                trace!(topic = %topic, partition = self.partition, offset = d.coordinate.offset,
                    waited_us = us, "held record delivered");
                ctx.metrics.held(us);
                self.counts.held += 1;
                self.counts.gate_wait_us += us;
                self.counts.max_gate_wait_us = self.counts.max_gate_wait_us.max(us);
            }
            let Some(et) = self.event_time.as_mut() else {
                let handled = Handled {
                    source: payload.source,
                    offset: d.coordinate.offset,
                    timestamp: payload.record_timestamp.unwrap_or(NO_TIMESTAMP),
                    key: payload.key.as_deref(),
                    value: payload.value,
                    headers: Rare::headers(&payload.rare),
                };
                self.handle(ctx, out, &mut work, handled)?;
                continue;
            };
            let timestamp = payload.record_timestamp.ok_or_else(|| {
                Error::Record(RecordError::NoEventTime {
                    stage: ctx.stage.clone(),
                    topic: topic.clone(),
                    partition: self.partition,
                    offset: d.coordinate.offset,
                })
            })?;
            let record = ParkedRecord {
                channel: (
                    d.coordinate.channel.topic.to_bytes(),
                    d.coordinate.channel.partition,
                ),
                offset: d.coordinate.offset,
                timestamp,
                keyless: payload.key.is_none(),
                headers: user_headers(Rare::headers(&payload.rare)).into_owned(),
                value: payload.value,
                sender: stamp
                    .and_then(|s| s.sender)
                    .map(|t| (*t.sender.as_bytes(), t.seq)),
            };
            let delivered = et
                .deliver(stamp, &d.replacements, payload.key, record)
                .map_err(|e| ctx.gate_error(self.partition, e))?;
            work.parked += 1;
            match delivered {
                Delivered::Parked { late, raised } => {
                    if late {
                        self.counts.late += 1;
                        ctx.metrics.late();
                    }
                    if raised {
                        self.counts.raised += 1;
                        ctx.metrics.raised();
                    }
                }
                Delivered::Now(h) => {
                    if h.late {
                        self.counts.late += 1;
                        ctx.metrics.late();
                    }
                    self.hand_over(ctx, out, &mut work, h)?;
                }
            }
        }
        if let Some(et) = self.event_time.as_mut() {
            et.follow(&self.gate)
                .map_err(|e| ctx.gate_error(self.partition, e))?;
            if et.release() > 0 {
                self.changed = true;
            }
            self.release_in_time_order(ctx, out, &mut work)?;
        }
        if let Some(more) = self.end_bootstrap(ctx, out)? {
            work += more;
        }
        Ok(work)
    }

    /// Hands over the records the watermark released, fires the keyed timers due at it and
    /// makes the punctuations due at it, interleaved in event-time order: a timer or a
    /// punctuation before every record released at a later time, after those at its time or
    /// earlier; at one time, records, then keyed timers, then punctuations (timers set
    /// meanwhile at or below the watermark take their place in the same pass). Timers fire in
    /// (time, key) order, punctuations in schedule order. Stream-time schedules are armed at
    /// the position the pass starts from, or, before the task has one, at the first record it
    /// releases (module `punctuation`).
    ///
    /// # Errors
    /// As [`Task::deliver`].
    fn release_in_time_order(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        work: &mut Work,
    ) -> Result<()> {
        let Some(watermark) = self.event_time.as_ref().and_then(EventTime::watermark) else {
            return Ok(());
        };
        if !self.punctuations.is_empty() {
            // Before the task has a position: at the first record it hands over, so that how
            // far the first watermark jumped (batch sizes) does not matter.
            let first = self
                .event_time
                .as_ref()
                .and_then(EventTime::next_release_time);
            let at = self
                .position
                .unwrap_or_else(|| first.map_or(watermark, |f| f.min(watermark)));
            self.punctuations.arm_stream_time(at);
        }
        loop {
            let record = self
                .event_time
                .as_ref()
                .and_then(EventTime::next_release_time);
            let timer = self.timers.next_due(watermark);
            let punctuation = self.punctuations.next_due(watermark);
            let first = [record, timer, punctuation]
                .into_iter()
                .enumerate()
                .filter_map(|(rank, t)| Some((t?, rank)))
                .min();
            match first {
                Some((r, 0)) => {
                    self.advance_position(r);
                    let h = self
                        .event_time
                        .as_mut()
                        .and_then(EventTime::next_release)
                        .expect("a released record");
                    self.hand_over(ctx, out, work, h)?;
                }
                Some((_, 1)) => self.fire_timer(ctx, out, work, watermark)?,
                Some(_) => self.punctuate(ctx, out, work, watermark)?,
                None => {
                    self.advance_position(watermark);
                    return Ok(());
                }
            }
        }
    }

    /// Calls the processor for the first keyed timer due at `watermark`; its emissions carry
    /// its time as their timestamp.
    ///
    /// # Errors
    /// The processor's (a timer has no input record for a bad-record policy); as
    /// [`Task::deliver`].
    fn fire_timer(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        work: &mut Work,
        watermark: i64,
    ) -> Result<()> {
        if let Some((time, key)) = self.timers.take_due(watermark) {
            self.changed = true;
            self.advance_position(time);
            let step = ctx.processor.on_timer(
                RawTimer {
                    key: &key,
                    partition: self.partition,
                    time,
                    watermark: self.position.unwrap_or(time),
                    task_state: self.task_state.0.as_deref(),
                },
                self.fold.get(&key)?.as_deref(),
            )?;
            self.apply(ctx, out, work, &key, step, (time, &[]), None)?;
            ctx.metrics.timer_fired();
        }
        Ok(())
    }

    /// Hands a record released by the timer queue to the handler (late records are counted
    /// when the queue takes them, not here).
    fn hand_over(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        work: &mut Work,
        h: HandOver,
    ) -> Result<()> {
        let record = h.record;
        let id = TopicId::from_bytes(record.channel.0);
        // A record parked before its topic was recreated (a new id) goes to the source of the
        // same name, as it did when parked.
        let source = match ctx.sources.iter().position(|t| t.id == id) {
            Some(s) => s,
            None => {
                let name = self.event_time.as_ref().and_then(|et| et.topic_name(id));
                ctx.source_index(name.ok_or_else(|| {
                    Error::Setup(SetupError::UnknownTopic {
                        topic: id.to_string(),
                    })
                })?)?
            }
        };
        // A parked record keeps its user headers only (module docs of `policy`).
        let handled = Handled {
            source,
            offset: record.offset,
            timestamp: record.timestamp,
            key: h.key.as_deref(),
            value: record.value,
            headers: &record.headers,
        };
        self.handle(ctx, out, work, handled)
    }

    /// Runs the handler on one record: fold state, emissions, counts. The record's timestamp
    /// (ms since the epoch, [`NO_TIMESTAMP`] when it has none) is what the handler sees and
    /// what every emission carries (timestamp propagation, as in Kafka Streams), so a
    /// downstream stage that orders by event time sees the event time of the record that
    /// caused each output, not the moment it was produced.
    ///
    /// A record the stage cannot process (a key or value that does not decode or is missing
    /// where it is needed, a handler error) goes to the stage's bad-record policy: a record
    /// without a key in a stage that keeps fold state is one, before its handler runs, and so
    /// is a record the task was told an output of was refused for good ([`Task::refuse`]),
    /// instead of its handler. The value is copied first only when the policy may send it to
    /// the dead-letter topic.
    fn handle(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        work: &mut Work,
        record: Handled<'_>,
    ) -> Result<()> {
        let timestamp = (record.timestamp != NO_TIMESTAMP).then_some(record.timestamp);
        let original = |value: Option<Vec<u8>>| Original {
            source: record.source,
            offset: record.offset,
            key: record.key,
            value,
            headers: record.headers,
            timestamp,
        };
        if !self.refused.is_empty()
            && let Some(refused) = self
                .refused
                .iter_mut()
                .find(|r| r.source == record.source && r.offset == record.offset)
        {
            refused.used = true;
            let error = refused.error();
            let mut original = original(record.value);
            if matches!(refused.reason, Refusal::Timestamp { .. }) {
                // Its dead letter would be refused too: it gets the producer's clock, and the
                // refused timestamp is in its reason.
                original.timestamp = None;
            }
            return self.bad_record(
                ctx,
                out,
                work,
                original,
                BadRecordKind::OutputRefused,
                error,
            );
        }
        if record.key.is_none() && ctx.keeps_state {
            let error = Error::Record(RecordError::KeylessRecord {
                stage: ctx.stage.clone(),
                topic: ctx.sources[record.source].name.clone(),
                partition: self.partition,
                offset: record.offset,
            });
            return self.bad_record(
                ctx,
                out,
                work,
                original(record.value),
                BadRecordKind::MissingKey,
                error,
            );
        }
        let kept = match ctx.bad_records {
            BadRecordPolicy::DeadLetter { .. } => record.value.clone(),
            _ => None,
        };
        let state_key = record.key.unwrap_or_default();
        let headers = user_headers(record.headers);
        let processed = ctx.processor.process_delivery_with(
            RawDelivery {
                topic: &ctx.sources[record.source].name,
                partition: self.partition,
                offset: record.offset,
                timestamp: record.timestamp,
                key: record.key,
                value: record.value,
                watermark: self.position,
                headers: &headers,
                task_state: self.task_state.0.as_deref(),
            },
            self.fold.get(state_key)?.as_deref(),
            &global::FoldLookup(&self.fold),
        );
        let step = match processed {
            Ok(step) => step,
            Err(e) => {
                return match e.bad_record_kind() {
                    Some(kind) => self.bad_record(ctx, out, work, original(kept), kind, e.into()),
                    None => Err(e.into()),
                };
            }
        };
        let cause = Cause {
            source: record.source,
            offset: record.offset,
            dead_letter: false,
        };
        self.apply(
            ctx,
            out,
            work,
            state_key,
            step,
            (record.timestamp, &headers),
            Some(cause),
        )?;
        work.deliveries += 1;
        ctx.metrics.delivered();
        self.counts.delivered += 1;
        Ok(())
    }

    /// Applies a processor's step for the fold state of `state_key`: the state change, the
    /// timers it sets, and its emissions with record timestamp `timestamp` (ms since the
    /// epoch; [`NO_TIMESTAMP`]: the producer's clock) and headers `headers` unless they set
    /// their own: the handled record's (none for a timer). `cause`: the input record it handled
    /// (`None` for a timer), named when an output is refused for good.
    ///
    /// # Errors
    /// [`ProcessingError::EventTime`] for timers in a stage that does not order by event time; a
    /// refused send.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        work: &mut Work,
        state_key: &[u8],
        step: RawStep,
        (timestamp, headers): (i64, &[Header]),
        cause: Option<Cause>,
    ) -> Result<()> {
        if step.too_late > 0 {
            ctx.metrics.too_late(step.too_late);
        }
        match step.state {
            StateChange::Keep => {}
            StateChange::Set(s) => self.fold.set(state_key, Some(s)),
            StateChange::Delete => self.fold.set(state_key, None),
        }
        match step.task_state {
            StateChange::Keep => {}
            StateChange::Set(s) => self.task_state = (Some(s), true),
            StateChange::Delete => self.task_state = (None, true),
        }
        if !step.timers.is_empty() {
            if self.event_time.is_none() {
                return Err(Error::Processing(ProcessingError::EventTime {
                    stage: ctx.stage.clone(),
                    partition: self.partition,
                    message:
                        "the processor set a timer, but the stage does not order by event time"
                            .to_string(),
                }));
            }
            for time in step.timers {
                self.timers.set(time, state_key);
            }
        }
        if let (false, Some(cause)) = (step.emit.is_empty(), &cause) {
            self.note_cause(*cause);
        }
        for emission in step.emit {
            let sent = self.emit(ctx, out, emission, timestamp, headers);
            match (&cause, sent) {
                (_, Ok(())) => {}
                (Some(c), Err(e)) => return Err(self.refused_output(ctx, e, c.source, c.offset)),
                (None, Err(e)) => return Err(e),
            }
            work.emissions += 1;
        }
        Ok(())
    }

    /// Stamps one emission with the node clock and hands it to `out`, with its own record
    /// timestamp if it has one, else `timestamp` (ms since the epoch; [`NO_TIMESTAMP`]: the
    /// producer's clock), and its own headers if it has them, else `headers` — Parsley's own
    /// names dropped from either (module docs of `parsley_stage::header`).
    fn emit(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        e: RawEmission,
        timestamp: i64,
        headers: &[Header],
    ) -> Result<()> {
        let sink = ctx.sink(&e.topic)?;
        let channel = Channel::new(
            sink.id,
            partition_of(e.key.as_deref(), self.partition, sink.partitions),
        );
        self.stamp_buf.clear();
        let sender = self.clock.stamp_into(channel, &mut self.stamp_buf)?;
        let tag = SendTag {
            task: self.partition,
            channel,
            seq: sender.seq,
        };
        let sent = out.send(Outgoing {
            topic: e.topic,
            tag,
            key: e.key,
            value: e.value,
            stamp: &self.stamp_buf,
            headers: &match &e.headers {
                Some(own) => user_headers(own),
                None => Cow::Borrowed(headers),
            },
            timestamp: e
                .timestamp
                .or((timestamp != NO_TIMESTAMP).then_some(timestamp)),
        });
        if let Err(err) = sent {
            self.clock.failed(tag.seq, channel)?;
            return Err(err);
        }
        ctx.metrics.emitted();
        Ok(())
    }

    /// Records the broker's offset for an acknowledged send: the clock replaces its in-flight
    /// claim by the coordinate (a tick's report changes nothing: no claim was made).
    ///
    /// # Errors
    /// The clock's, for a send it does not know.
    pub fn acked(&mut self, tag: SendTag, offset: i64) -> Result<()> {
        if self.is_tick(&tag) {
            return Ok(());
        }
        Ok(self.clock.acked(tag.seq, tag.channel.at(offset))?)
    }

    /// Releases the claim of a send that was refused after the task made it.
    ///
    /// # Errors
    /// The clock's, for a send it does not know.
    pub fn send_failed(&mut self, tag: SendTag) -> Result<()> {
        if self.is_tick(&tag) {
            return Ok(());
        }
        Ok(self.clock.failed(tag.seq, tag.channel)?)
    }

    /// The input offsets the task would commit now: the first undelivered offset of each of
    /// its channels, sorted by channel.
    pub fn input_offsets(&self) -> Vec<(Channel, i64)> {
        let mut committed: Vec<(Channel, i64)> = self
            .gate
            .consumed()
            .filter_map(|channel| {
                self.gate
                    .first_undelivered(&channel)
                    .map(|next| (channel, next))
            })
            .collect();
        committed.sort();
        committed
    }

    /// `true` when the task committed before and would now commit other input offsets with
    /// no delivery in between: its position moved over commit markers or aborted records
    /// (case C01 — the committed position after a trailing marker is the end). Such a move is
    /// committed at the next interval in an offsets-only transaction (case C06).
    pub fn position_moved(&self) -> bool {
        !self.snapshot_offsets.is_empty() && self.input_offsets() != self.snapshot_offsets
    }

    /// Writes the task's changed fold state, its timer queue's changes and, when anything
    /// changed, its snapshot to `writer`, and returns the input offsets to commit with them to
    /// the group: those of every channel but the global sources' (kept in the snapshot only).
    /// Called once every output of the transaction is acknowledged, so the snapshot's clock
    /// claims coordinates only.
    ///
    /// # Errors
    /// A refused write; the timer queue's encoding errors.
    pub fn write_changelog(
        &mut self,
        ctx: &TaskContext,
        writer: &mut dyn ChangelogWriter,
    ) -> Result<Vec<(Channel, i64)>> {
        let committed = self.input_offsets();
        // Every send so far is acknowledged: no refusal can name their inputs any more.
        self.causes.clear();
        // A refused input record the policy took commits with this transaction.
        self.refused.retain(|r| !r.used);
        // On disk, the store receives every record once the transaction commits: the fold
        // keeps its own (its sealed changes), the others are copied.
        let state_written = self.fold.write_changes(writer)?;
        let mut all = fold::Tee {
            inner: writer,
            copies: self.fold.on_disk().then(Vec::new),
        };
        // Parsley's own records, kept for the task's image of its last commit.
        let mut writer = fold::Tee {
            inner: &mut all,
            copies: Some(Vec::new()),
        };
        // The timer queue's changes (records parked and released since the last commit): they
        // change only with deliveries and releases, which also write the snapshot below.
        if let Some(et) = &self.event_time {
            ctx.metrics
                .set_late_keys(self.partition, false, et.late_changed());
        }
        let event_time = match self.event_time.as_mut() {
            Some(et) => Some(
                et.take_changes()
                    .map_err(|e| ctx.gate_error(self.partition, e))?,
            ),
            None => None,
        };
        for (key, record) in event_time.iter().flat_map(|c| &c.parts) {
            writer.write(key, record.as_deref())?;
        }
        for (key, value) in self.timers.take_changes() {
            writer.write(&key, value.as_deref())?;
        }
        if std::mem::take(&mut self.task_state.1) {
            writer.write(TASK_STATE_KEY, self.task_state.0.as_deref())?;
        }
        for (key, value) in self.punctuations.take_changes() {
            writer.write(&key, value.as_deref())?;
        }
        // A timer-queue change needs its header (watermark, segment numbers) in the same
        // transaction.
        let queue_changed = event_time.as_ref().is_some_and(|c| !c.parts.is_empty());
        if self.changed || committed != self.snapshot_offsets || queue_changed {
            let snapshot = TaskSnapshot {
                sender: self.clock.sender(),
                next_seq: self.clock.next_seq(),
                clock: self.clock.clock().clone(),
                gate: self.gate.snapshot(),
                offsets: committed.clone(),
            };
            writer.write(META_KEY, Some(&snapshot.encode()))?;
            if let Some(changes) = &event_time {
                // Written with the snapshot, in the same transaction: restored together.
                writer.write(EVENT_TIME_KEY, Some(&changes.record))?;
            }
            self.changed = false;
            self.snapshot_offsets = committed.clone();
        }
        self.last_commit
            .written(writer.copies.take().unwrap_or_default(), state_written);
        let copies = all.copies.take().unwrap_or_default();
        self.fold.seal(copies);
        let mut committed = committed;
        if ctx.has_global() {
            committed.retain(|(c, _)| !ctx.is_global(*c));
        }
        Ok(committed)
    }
}

/// Adds each of `tasks`' counted deliveries to its metrics and sets the stage's gauges
/// (`event_time`: the stage orders by event time).
pub fn publish_counts<'a>(
    tasks: impl IntoIterator<Item = &'a mut Task>,
    metrics: &StageMetrics,
    event_time: bool,
) {
    let mut blocked_total = 0;
    let mut parked_total = 0;
    for task in tasks {
        let counts = task.take_counts();
        let blocked = task.gate().blocked_count() as u64;
        blocked_total += blocked;
        let timers = task.timers_set() as u64;
        let et = task
            .event_time()
            .map(|et| (et.parked() as u64, et.watermark(), et.catching_up() as u64));
        parked_total += et.map_or(0, |(parked, _, _)| parked);
        metrics.task(task.partition(), |m| {
            m.delivered += counts.delivered;
            m.held += counts.held;
            m.gate_wait_us += counts.gate_wait_us;
            m.max_gate_wait_us = m.max_gate_wait_us.max(counts.max_gate_wait_us);
            m.blocked_heads = blocked;
            m.late += counts.late;
            m.raised += counts.raised;
            m.ticks += counts.ticks;
            if let Some((parked, watermark, catching_up)) = et {
                m.parked = parked;
                m.max_parked = m.max_parked.max(parked);
                m.watermark_ms = watermark;
                m.catching_up = catching_up;
                m.timers = timers;
            }
        });
    }
    metrics.blocked_heads(blocked_total);
    if event_time {
        metrics.parked(parked_total);
    }
}
