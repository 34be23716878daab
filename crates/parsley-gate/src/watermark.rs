//! The event-time watermark of one task, moved only by evidence from Kafka.
//!
//! # The rule (the book's specification, §5)
//! Every input channel contributes the **highest event time in its delivered prefix**: records
//! at offsets `<= F[c]`, the gate's frontier. Records merely fetched may still be causally
//! blocked in the gate, and a look-ahead delivery above the frontier joins the prefix only once
//! the frontier passes it. An input with nothing delivered contributes the lowest value (the
//! first fetch returning only some partitions must not move time: case C13).
//!
//! An input is **in the minimum** unless it is both
//! - **caught up** ([`CatchUp`]: `F[c] + 1 >=` the high watermark read at task start), and
//! - **at the live head**: `F[c] + 1 >=` the latest head reading, which is the LSO returned with
//!   the channel's latest fetch response ([`WatermarkTracker::fetched_head`]), or the startup
//!   end until a fetch response arrives.
//!
//! It re-enters the minimum whenever a fetch response shows it behind again. Caught up with
//! history alone is not enough: reading history takes time, and the live records written
//! meanwhile carry event times below "now minus lag" (without this condition, a model of
//! the workload put 1.36% of records out of order). The head is the LSO, not the high watermark,
//! so that a producer that always holds a transaction open cannot stall the watermark.
//!
//! The **candidate** is the minimum over
//! - the inputs in the minimum, of their delivered-prefix maximum (lowest when none), and
//! - the optional **control stream** ([`Control`]): the highest processing time passed to
//!   [`WatermarkTracker::control`], minus the configured lag (lowest before the first call).
//!
//! The **watermark** is the running maximum of the candidates: it never decreases, so an input
//! that re-enters the minimum holds it where it is until that input's own prefix passes it.
//! With a control stream, once every input has left the minimum the watermark is "now minus
//! lag": after catch-up it jumps to now, the parked history drains in one burst, and a live
//! record waits at most the lag.
//!
//! # Without a control stream
//! When no input is in the minimum and there is no control stream, the minimum of an empty set
//! is not taken (it would be +∞ and push the watermark past records not yet written: case
//! C14). The candidate is then the **highest delivered event time over all inputs**: every
//! input has delivered everything up to its live head, so that is the latest time the task has
//! evidence for. Live records are then released on arrival (a record's own delivery lifts the
//! candidate to its time), and one that arrives with an event time below the watermark is
//! released at once and counted as late by the [`TimerQueue`](crate::TimerQueue).
//!
//! # Assumptions
//! - Event times within one input channel do not decrease (the source's producers write each
//!   partition in event-time order). A channel that breaks this has its lower records counted
//!   as late; no interleaving of channels can make a record late otherwise while its channel
//!   is still reading history.
//! - Except for an **unordered** input ([`WatermarkTracker::unordered`]): one written by
//!   several writers, such as a topic another stage writes from all its tasks, whose event
//!   times interleave within a partition. Its delivered maximum bounds nothing while it reads
//!   history, so it **holds the watermark while it is catching up** (it contributes the lowest
//!   value, as an input with nothing delivered does) and counts like any other input once it
//!   is caught up: its history is parked whole and released in event-time order when it is
//!   read to its startup end.
//! - The head condition uses the frontier, like caught up: `F + 1 >= LSO` means every record
//!   the last fetch response reported is delivered, not merely returned by a poll.
//!
//! # Units
//! Offsets are `i64` Kafka offsets; times are `i64` milliseconds since the Unix epoch.
//!
//! # Restarts
//! [`WatermarkTracker::snapshot`] holds the watermark and each input's delivered-prefix maximum
//! (and the event times of look-ahead deliveries above the frontier); it belongs in the same
//! transaction as the gate's snapshot and the timer queue. End offsets and heads are fetch-time
//! evidence and are read again after a restart.
//!
//! The rules are the book's specification, §5 ("Live head", "Watermark", "Clock"); cases C13,
//! C14.

use std::collections::VecDeque;

use parsley_clock::{Channel, TopicId};

use crate::catchup::{CatchUp, ChannelProgress};
use crate::error::GateError;
use crate::gate::Gate;

/// The control stream: a topic with no event time that contributes processing time minus a
/// lag (the book's specification, §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// How far the control clock runs behind processing time, ms: the longest a live record
    /// may be held, and the producer delay beyond which a live record is late.
    pub lag_ms: i64,
}

/// The event-time state of one input channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Input {
    /// Latest head reading: the LSO of the latest fetch response, or the startup end before
    /// the first one. `None` before [`WatermarkTracker::start`].
    head: Option<i64>,
    /// Highest event time delivered at an offset `<= frontier`; `None` when nothing is.
    prefix_max: Option<i64>,
    /// Event times delivered above the frontier (look-ahead deliveries, and deliveries the
    /// frontier reading has not passed yet): offset → event time. Every key is `> frontier`.
    above: Above,
    /// Written by several writers: holds the watermark while catching up
    /// ([`WatermarkTracker::unordered`]).
    unordered: bool,
}

/// Event times by offset, ascending and unique by offset. Deliveries come in offset order
/// except look-ahead ones, so a record is appended in `O(1)` and a frontier reading takes a
/// prefix off the front, where a map would insert and remove every record of a poll batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Above(VecDeque<(i64, i64)>);

impl Above {
    /// Records `event_time_ms` at `offset` (the highest, if one is there already).
    fn record(&mut self, offset: i64, event_time_ms: i64) {
        match self.0.back_mut() {
            Some((o, t)) if *o == offset => *t = (*t).max(event_time_ms),
            Some((o, _)) if *o > offset => {
                match self.0.binary_search_by_key(&offset, |(o, _)| *o) {
                    Ok(k) => self.0[k].1 = self.0[k].1.max(event_time_ms),
                    Err(k) => self.0.insert(k, (offset, event_time_ms)),
                }
            }
            _ => self.0.push_back((offset, event_time_ms)),
        }
    }

    /// Removes the entries at offsets `<= frontier`; returns their highest event time.
    fn take_through(&mut self, frontier: i64) -> Option<i64> {
        let k = self.0.partition_point(|(o, _)| *o <= frontier);
        self.0.drain(..k).map(|(_, t)| t).max()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<(i64, i64)> for Above {
    /// Entries in any order; one offset given twice keeps its highest event time.
    fn from_iter<I: IntoIterator<Item = (i64, i64)>>(entries: I) -> Self {
        let mut above = Above::default();
        for (o, t) in entries {
            above.record(o, t);
        }
        above
    }
}

/// A lower bound in the minimum: the empty minimum is distinguished from "lowest".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Bound {
    /// An input with no evidence: holds the watermark.
    Lowest,
    /// A time, ms since the epoch.
    At(i64),
    /// The minimum of an empty set.
    Unbounded,
}

impl Bound {
    fn of(value: Option<i64>) -> Self {
        value.map_or(Bound::Lowest, Bound::At)
    }
}

/// Why an input is or is not in the minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputState {
    /// Still reading the history that existed at task start.
    CatchingUp,
    /// Caught up, but its latest fetch response shows records not yet delivered.
    Behind,
    /// Caught up and at the live head: out of the minimum.
    Left,
}

/// What holds a task's watermark where it is: the lowest bound of the minimum
/// ([`WatermarkTracker::held_by`]). Offsets are `i64` Kafka offsets; times are `i64` ms since
/// the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// An input channel still in the minimum, whose bound is the lowest.
    Input {
        /// The input channel.
        channel: Channel,
        /// Why it is in the minimum: [`InputState::CatchingUp`] (reading the history that
        /// existed at task start, up to `startup_end`) or [`InputState::Behind`] (caught up,
        /// waiting for its live head, `head`). Never [`InputState::Left`].
        state: InputState,
        /// The highest event time in its delivered prefix, ms; `None` when nothing is
        /// delivered there (or it is unordered and still catching up): it holds the watermark
        /// at "no evidence".
        delivered_max: Option<i64>,
        /// The gate's frontier on it (`-1` before the first reading).
        frontier: i64,
        /// The high watermark read at task start; `None` before [`WatermarkTracker::start`].
        startup_end: Option<i64>,
        /// The latest head reading (the LSO of its latest fetch response, or the startup end
        /// before one); `None` before [`WatermarkTracker::start`].
        head: Option<i64>,
    },
    /// The control stream: processing time minus its lag is the lowest bound (or every input
    /// has left the minimum and the control clock alone moves the watermark).
    Control {
        /// The highest processing time passed to [`WatermarkTracker::control`] minus the lag,
        /// ms; `None` before the first one (the watermark waits for it).
        time_ms: Option<i64>,
        /// The control stream's lag, ms.
        lag_ms: i64,
    },
}

/// The committed part of a [`WatermarkTracker`] (the book's specification, §7): what survives a
/// restart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WatermarkSnapshot {
    /// The watermark, ms since the epoch; `None` when there was no evidence yet.
    pub watermark: Option<i64>,
    /// Per input channel with any delivery.
    pub inputs: Vec<InputSnapshot>,
}

/// The committed event-time state of one input channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSnapshot {
    /// The channel.
    pub channel: Channel,
    /// Highest event time delivered at an offset `<=` the frontier committed with it, ms.
    pub prefix_max: Option<i64>,
    /// `(offset, event time ms)` of deliveries above that frontier, ascending by offset.
    pub lookahead: Vec<(i64, i64)>,
}

/// The event-time watermark of one task (module docs: the rule, the control stream and the
/// behaviour without one).
///
/// Driven by the runtime's stream thread with evidence it has: [`start`](Self::start) at
/// assignment, [`delivered`](Self::delivered) after each delivery,
/// [`frontier`](Self::frontier) (or [`follow`](Self::follow)) after each batch of gate events,
/// [`fetched_head`](Self::fetched_head) per fetch response, [`control`](Self::control) with the
/// injected processing-time clock.
///
/// Cost: each update is `O(log n)` to find the channel and `O(n)` to recompute the minimum, for
/// `n` input channels of the task (39 for the source's 13 topics × 3 partitions); a delivery
/// that raises an input from above the last minimum (the common case while history is read)
/// or one out of the minimum under a control stream skips the recomputation.
#[derive(Debug, Clone)]
pub struct WatermarkTracker {
    catch_up: CatchUp,
    /// Parallel to `catch_up.channels`.
    inputs: Vec<Input>,
    control: Option<Control>,
    /// Highest `processing time - lag` seen, ms.
    control_time: Option<i64>,
    /// Running maximum of the candidates; never decreases.
    watermark: Option<i64>,
    /// The minimum of the last full computation ([`WatermarkTracker::advance`]): a delivery
    /// that raises an input above it cannot move it, and skips the `O(n)` recomputation.
    last_bound: Bound,
}

impl WatermarkTracker {
    /// A tracker for the task's event-time input channels (partition `p` of every source topic
    /// with an event time; the control topic is not one of them), with an optional control
    /// stream. Duplicates are ignored. The watermark is `None` until every input has evidence.
    pub fn new(inputs: impl IntoIterator<Item = Channel>, control: Option<Control>) -> Self {
        let catch_up = CatchUp::new(inputs);
        let inputs = vec![Input::default(); catch_up.channels.len()];
        WatermarkTracker {
            catch_up,
            inputs,
            control,
            control_time: None,
            watermark: None,
            last_bound: Bound::Lowest,
        }
    }

    /// A tracker restored from `snapshot`: the watermark and delivered-prefix maxima come
    /// back; end offsets and heads start unknown and are read again with
    /// [`start`](Self::start), frontiers with [`frontier`](Self::frontier).
    ///
    /// # Errors
    /// [`GateError::NotConsumed`] for a snapshot channel outside `inputs`.
    pub fn restore(
        inputs: impl IntoIterator<Item = Channel>,
        control: Option<Control>,
        snapshot: &WatermarkSnapshot,
    ) -> Result<Self, GateError> {
        let mut t = WatermarkTracker::new(inputs, control);
        for s in &snapshot.inputs {
            let i = t.catch_up.index(&s.channel)?;
            t.inputs[i].prefix_max = s.prefix_max;
            t.inputs[i].above = s.lookahead.iter().copied().collect();
        }
        t.watermark = snapshot.watermark;
        Ok(t)
    }

    /// The committed part (see [`WatermarkSnapshot`]).
    pub fn snapshot(&self) -> WatermarkSnapshot {
        WatermarkSnapshot {
            watermark: self.watermark,
            inputs: self
                .catch_up
                .channels
                .iter()
                .zip(&self.inputs)
                .filter(|(_, i)| i.prefix_max.is_some() || !i.above.is_empty())
                .map(|(p, i)| InputSnapshot {
                    channel: p.channel,
                    prefix_max: i.prefix_max,
                    lookahead: i.above.iter().collect(),
                })
                .collect(),
        }
    }

    /// Records the startup end of `channel` (its high watermark from ListOffsets(LATEST,
    /// `READ_UNCOMMITTED`), read at assignment or restart before reading) — see
    /// [`CatchUp::start`]. The reading also serves as the channel's head until its first fetch
    /// response: a high watermark is at or above the LSO of the same moment.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`], [`GateError::NegativeEndOffset`].
    pub fn start(&mut self, channel: Channel, end_offset: i64) -> Result<(), GateError> {
        self.catch_up.start(channel, end_offset)?;
        let i = self.catch_up.index(&channel)?;
        self.inputs[i].head = Some(end_offset);
        self.advance();
        Ok(())
    }

    /// Marks `channel` as **unordered** (module docs: assumptions): its event times may
    /// decrease within the channel because several writers interleave in it (a topic written
    /// by another stage's tasks). While it is not caught up it holds the watermark, whatever
    /// it has delivered; once caught up it counts like any other input. Not part of the
    /// snapshot: the runtime marks the channel again when it starts the task.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`].
    pub fn unordered(&mut self, channel: Channel) -> Result<(), GateError> {
        let i = self.catch_up.index(&channel)?;
        self.inputs[i].unordered = true;
        self.advance();
        Ok(())
    }

    /// Records the gate's frontier of `channel` ([`Gate::frontier`]): deliveries at offsets
    /// `<= frontier` join the delivered prefix, and caught up and the live head are judged
    /// against `frontier + 1`.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`], [`GateError::FrontierBehind`].
    pub fn frontier(&mut self, channel: Channel, frontier: i64) -> Result<(), GateError> {
        self.catch_up.frontier(channel, frontier)?;
        let i = self.catch_up.index(&channel)?;
        let input = &mut self.inputs[i];
        input.prefix_max = input.above.take_through(frontier).max(input.prefix_max);
        self.advance();
        Ok(())
    }

    /// Reads the frontier of every input channel that `gate` has seeded (a convenience over
    /// [`frontier`](Self::frontier)).
    ///
    /// # Errors
    /// [`GateError::FrontierBehind`].
    pub fn follow<R>(&mut self, gate: &Gate<R>) -> Result<(), GateError> {
        for i in 0..self.inputs.len() {
            let channel = self.catch_up.channels[i].channel;
            if let Some(f) = gate.frontier(&channel) {
                self.frontier(channel, f)?;
            }
        }
        Ok(())
    }

    /// Records that the gate delivered the record at `offset` of `channel`, whose event time is
    /// `event_time_ms` (ms since the epoch). A delivery above the known frontier (a look-ahead
    /// delivery, or one whose frontier reading has not been passed yet) counts once the
    /// frontier passes it. Call it before parking the record, or after: the timer queue counts
    /// a record late only when its time is strictly below the watermark.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`].
    pub fn delivered(
        &mut self,
        channel: Channel,
        offset: i64,
        event_time_ms: i64,
    ) -> Result<(), GateError> {
        let i = self.catch_up.index(&channel)?;
        let frontier = self.catch_up.channels[i].frontier;
        if offset <= frontier {
            let old = self.inputs[i].prefix_max;
            if old.is_some_and(|m| m >= event_time_ms) {
                return Ok(()); // nothing changed
            }
            self.inputs[i].prefix_max = Some(event_time_ms);
            let state = Self::state_of(&self.catch_up.channels[i], &self.inputs[i]);
            let in_minimum = state != InputState::Left;
            let unmoved =
                if in_minimum && self.inputs[i].unordered && state == InputState::CatchingUp {
                    // An unordered input holds the minimum at its lowest while catching up.
                    true
                } else if in_minimum {
                    // Raised from above the minimum (or from a value while another input or the
                    // control clock holds it at its lowest): the minimum stays where it is.
                    match (self.last_bound, old) {
                        (Bound::Lowest, Some(_)) => true,
                        (Bound::At(c), Some(o)) => o > c,
                        _ => false,
                    }
                } else {
                    // Out of the minimum, it counts only where there is no control stream.
                    self.control.is_some()
                };
            if unmoved {
                debug_assert_eq!(
                    self.candidate().1,
                    self.last_bound,
                    "a skipped recomputation would have moved the minimum"
                );
            } else {
                self.advance();
            }
        } else {
            self.inputs[i].above.record(offset, event_time_ms);
        }
        Ok(())
    }

    /// Records the last stable offset returned with the latest fetch response of `channel`
    /// (for a `read_committed` consumer, the end of what it can read now). The channel is at
    /// the live head while `frontier + 1 >= last_stable_offset`; a response that shows it
    /// behind puts it back into the minimum.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`], [`GateError::NegativeEndOffset`] (an unknown-offset
    /// sentinel).
    pub fn fetched_head(
        &mut self,
        channel: Channel,
        last_stable_offset: i64,
    ) -> Result<(), GateError> {
        let i = self.catch_up.index(&channel)?;
        if last_stable_offset < 0 {
            return Err(GateError::NegativeEndOffset {
                channel,
                end_offset: last_stable_offset,
            });
        }
        self.inputs[i].head = Some(last_stable_offset);
        self.advance();
        Ok(())
    }

    /// Feeds the control stream with processing time `processing_time_ms` (ms since the epoch,
    /// from the runtime's injected clock): it contributes `processing_time_ms - lag_ms`. A
    /// reading below an earlier one (a clock stepped back) contributes nothing new.
    ///
    /// # Errors
    /// [`GateError::NoControlStream`] when the tracker has no control stream.
    pub fn control(&mut self, processing_time_ms: i64) -> Result<(), GateError> {
        let control = self.control.ok_or(GateError::NoControlStream)?;
        let t = processing_time_ms.saturating_sub(control.lag_ms);
        self.control_time = Some(self.control_time.map_or(t, |c| c.max(t)));
        self.advance();
        Ok(())
    }

    /// The watermark, ms since the epoch: every parked record at or below it may be released.
    /// `None` while some input (or the control stream) has no evidence yet: nothing may be
    /// released. Never decreases.
    pub fn watermark(&self) -> Option<i64> {
        self.watermark
    }

    /// The control stream configuration, if any.
    pub fn control_stream(&self) -> Option<Control> {
        self.control
    }

    /// The catch-up tracker inside (startup ends, frontiers, progress).
    pub fn catch_up(&self) -> &CatchUp {
        &self.catch_up
    }

    /// `true` when `channel` is caught up with the history at task start
    /// ([`CatchUp::caught_up`]).
    pub fn caught_up(&self, channel: &Channel) -> bool {
        self.catch_up.caught_up(channel)
    }

    /// `true` when every input channel of `topic` is caught up ([`CatchUp::topic_caught_up`]).
    pub fn topic_caught_up(&self, topic: TopicId) -> bool {
        self.catch_up.topic_caught_up(topic)
    }

    /// `true` when every input channel is caught up ([`CatchUp::all_caught_up`]).
    pub fn all_caught_up(&self) -> bool {
        self.catch_up.all_caught_up()
    }

    /// Where `channel` stands with respect to the minimum; `None` when it is not an input.
    pub fn state(&self, channel: &Channel) -> Option<InputState> {
        let i = self.catch_up.index(channel).ok()?;
        Some(Self::state_of(&self.catch_up.channels[i], &self.inputs[i]))
    }

    /// `true` when `channel` is an input still in the minimum.
    pub fn in_minimum(&self, channel: &Channel) -> bool {
        self.state(channel).is_some_and(|s| s != InputState::Left)
    }

    /// `true` when `topic` has left the minimum: every one of its input channels has. `false`
    /// for a topic with no input channel.
    pub fn topic_left(&self, topic: TopicId) -> bool {
        let mut any = false;
        for (p, i) in self.catch_up.channels.iter().zip(&self.inputs) {
            if p.channel.topic == topic {
                if Self::state_of(p, i) != InputState::Left {
                    return false;
                }
                any = true;
            }
        }
        any
    }

    /// The highest event time in the delivered prefix of `channel`, ms; `None` when nothing is
    /// delivered there (or it is not an input).
    pub fn delivered_max(&self, channel: &Channel) -> Option<i64> {
        let i = self.catch_up.index(channel).ok()?;
        self.inputs[i].prefix_max
    }

    /// How far the delivered event time of `channel` runs ahead of the watermark, ms (negative
    /// when behind it), for watermark alignment; [`i64::MAX`] while the watermark has no value
    /// (every record delivered meanwhile waits, so every input that delivered runs ahead).
    /// `None` for an unordered input (its delivered event times bound nothing), an input with
    /// nothing delivered, or a channel that is not an input.
    ///
    /// The input that holds the watermark never runs ahead of it: the watermark is at or above
    /// the candidate, which is that input's delivered maximum — or that input has delivered
    /// nothing, or is unordered.
    pub fn drift(&self, channel: &Channel) -> Option<i64> {
        let i = self.catch_up.index(channel).ok()?;
        let input = &self.inputs[i];
        if input.unordered {
            return None;
        }
        let delivered = input.prefix_max?;
        Some(
            self.watermark
                .map_or(i64::MAX, |w| delivered.saturating_sub(w)),
        )
    }

    /// What holds the watermark where it is (see [`Hold`]): the input in the minimum with the
    /// lowest bound — an input with no evidence first; on a tie, the first by channel order;
    /// an input before the control stream on a tie — or the control stream when it is lower,
    /// or when it alone is in the minimum. `None` when nothing is in the minimum and there is
    /// no control stream: the watermark then follows the highest delivered event time and
    /// nothing holds it (module docs). Computed on demand, `O(n)` in the inputs.
    pub fn held_by(&self) -> Option<Hold> {
        let mut lowest: Option<(Bound, usize)> = None;
        for (k, (p, i)) in self.catch_up.channels.iter().zip(&self.inputs).enumerate() {
            let bound = match Self::state_of(p, i) {
                InputState::Left => continue,
                InputState::CatchingUp if i.unordered => Bound::Lowest,
                _ => Bound::of(i.prefix_max),
            };
            if lowest.is_none_or(|(b, _)| bound < b) {
                lowest = Some((bound, k));
            }
        }
        let control = self
            .control
            .map(|c| (Bound::of(self.control_time), c.lag_ms));
        match (lowest, control) {
            (Some((bound, k)), control) if control.is_none_or(|(c, _)| bound <= c) => {
                let (p, i) = (&self.catch_up.channels[k], &self.inputs[k]);
                Some(Hold::Input {
                    channel: p.channel,
                    state: Self::state_of(p, i),
                    delivered_max: match bound {
                        Bound::At(t) => Some(t),
                        _ => None,
                    },
                    frontier: p.frontier,
                    startup_end: p.startup_end,
                    head: i.head,
                })
            }
            (_, Some((_, lag_ms))) => Some(Hold::Control {
                time_ms: self.control_time,
                lag_ms,
            }),
            (_, None) => None,
        }
    }

    fn state_of(progress: &ChannelProgress, input: &Input) -> InputState {
        if !progress.caught_up() {
            InputState::CatchingUp
        } else if input.head.is_some_and(|h| progress.frontier + 1 >= h) {
            InputState::Left
        } else {
            InputState::Behind
        }
    }

    /// The candidate of the module docs (`None` = lowest) and the minimum it came from.
    fn candidate(&self) -> (Option<i64>, Bound) {
        let mut bound = Bound::Unbounded;
        for (p, i) in self.catch_up.channels.iter().zip(&self.inputs) {
            match Self::state_of(p, i) {
                InputState::Left => {}
                InputState::CatchingUp if i.unordered => bound = Bound::Lowest,
                _ => bound = bound.min(Bound::of(i.prefix_max)),
            }
        }
        if self.control.is_some() {
            bound = bound.min(Bound::of(self.control_time));
        }
        let candidate = match bound {
            Bound::Lowest => None,
            Bound::At(t) => Some(t),
            // No control stream and no input in the minimum: release on arrival.
            Bound::Unbounded => self.inputs.iter().filter_map(|i| i.prefix_max).max(),
        };
        (candidate, bound)
    }

    fn advance(&mut self) {
        let (candidate, bound) = self.candidate();
        self.last_bound = bound;
        if let Some(c) = candidate {
            self.watermark = Some(self.watermark.map_or(c, |w| w.max(c)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Parking, TimerQueue};
    use proptest::prelude::*;

    proptest! {
        /// `Above` holds what an offset-keyed map that keeps each offset's highest event time
        /// holds, whatever the order of the offsets, and a frontier reading takes the same
        /// prefix with the same highest event time.
        #[test]
        fn above_keeps_what_a_map_of_highest_event_times_keeps(
            ops in proptest::collection::vec((0..40i64, -5..100i64, any::<bool>()), 0..200),
        ) {
            let mut above = Above::default();
            let mut model: std::collections::BTreeMap<i64, i64> = Default::default();
            for (offset, t, take) in ops {
                if take {
                    let rest = model.split_off(&(offset + 1));
                    let taken = std::mem::replace(&mut model, rest);
                    prop_assert_eq!(above.take_through(offset), taken.into_values().max());
                } else {
                    above.record(offset, t);
                    let e = model.entry(offset).or_insert(t);
                    *e = (*e).max(t);
                }
                prop_assert_eq!(
                    above.iter().collect::<Vec<_>>(),
                    model.iter().map(|(o, t)| (*o, *t)).collect::<Vec<_>>()
                );
            }
            let rebuilt: Above = model.iter().rev().map(|(o, t)| (*o, *t)).collect();
            prop_assert_eq!(rebuilt, above);
        }
    }

    fn ch(t: u8, p: i32) -> Channel {
        Channel::new(TopicId::from_bytes([t; 16]), p)
    }

    /// Delivers `(offset, event time)` pairs in order on `c`, advancing its frontier over each.
    fn deliver(w: &mut WatermarkTracker, c: Channel, records: &[(i64, i64)]) {
        for &(o, t) in records {
            w.delivered(c, o, t).unwrap();
            w.frontier(c, o).unwrap();
        }
    }

    #[test]
    fn held_by_names_the_lowest_input_in_the_minimum_and_whether_it_catches_up_or_is_behind() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut w = WatermarkTracker::new([a, b], None);
        assert_eq!(
            w.held_by(),
            Some(Hold::Input {
                channel: a,
                state: InputState::CatchingUp,
                delivered_max: None,
                frontier: -1,
                startup_end: None,
                head: None,
            }),
            "before any evidence the first input holds it"
        );
        w.start(a, 2).unwrap();
        w.start(b, 3).unwrap();
        deliver(&mut w, a, &[(0, 100), (1, 200)]);
        deliver(&mut w, b, &[(0, 150)]);
        // a is caught up and at its startup end: out of the minimum; b reads history.
        assert_eq!(w.state(&a), Some(InputState::Left));
        assert_eq!(
            w.held_by(),
            Some(Hold::Input {
                channel: b,
                state: InputState::CatchingUp,
                delivered_max: Some(150),
                frontier: 0,
                startup_end: Some(3),
                head: Some(3),
            })
        );
        deliver(&mut w, b, &[(1, 160), (2, 170)]);
        // Both left, no control stream: nothing holds it.
        assert_eq!(w.held_by(), None);
        // A fetch response shows a behind its live head: it holds the watermark again.
        w.fetched_head(a, 5).unwrap();
        assert_eq!(
            w.held_by(),
            Some(Hold::Input {
                channel: a,
                state: InputState::Behind,
                delivered_max: Some(200),
                frontier: 1,
                startup_end: Some(2),
                head: Some(5),
            })
        );
    }

    #[test]
    fn drift_is_measured_from_the_watermark_and_the_holder_never_runs_ahead() {
        let (a, b, c, u) = (ch(1, 0), ch(2, 0), ch(3, 0), ch(4, 0));
        let mut w = WatermarkTracker::new([a, b, c, u], None);
        for x in [a, b, c] {
            w.start(x, 100).unwrap();
        }
        w.start(u, 1).unwrap();
        w.unordered(u).unwrap();
        assert_eq!(w.drift(&a), None, "nothing delivered");
        deliver(&mut w, a, &[(0, 1_000), (1, 90_000)]);
        deliver(&mut w, b, &[(0, 5_000)]);
        // c has delivered nothing and u catches up: no watermark yet, so whatever a and b
        // delivered waits, and both run ahead without bound.
        assert_eq!(w.watermark(), None);
        assert_eq!(w.drift(&a), Some(i64::MAX));
        assert_eq!(w.drift(&b), Some(i64::MAX));
        assert_eq!(w.drift(&c), None, "nothing delivered");
        assert_eq!(w.drift(&ch(9, 0)), None, "not an input");
        deliver(&mut w, c, &[(0, 3_000)]);
        assert_eq!(w.watermark(), None, "u still holds it");
        // u reads to its startup end: its delivered event times count for nothing here.
        deliver(&mut w, u, &[(0, 1_000_000)]);
        assert_eq!(w.drift(&u), None, "unordered");
        // The input that holds the watermark (the lowest prefix) has a drift of zero.
        assert_eq!(w.watermark(), Some(3_000));
        let Some(Hold::Input { channel, .. }) = w.held_by() else {
            panic!("an input holds it")
        };
        assert_eq!(channel, c);
        assert_eq!(w.drift(&c), Some(0));
        assert_eq!(w.drift(&b), Some(2_000));
        assert_eq!(w.drift(&a), Some(87_000));
    }

    #[test]
    fn held_by_names_the_control_stream_when_it_is_lower_or_alone() {
        let a = ch(1, 0);
        let mut w = WatermarkTracker::new([a], Some(Control { lag_ms: 1_000 }));
        w.start(a, 1).unwrap();
        w.control(5_000).unwrap();
        // a has nothing delivered: it holds it, below the control clock.
        assert!(matches!(w.held_by(), Some(Hold::Input { channel, .. }) if channel == a));
        deliver(&mut w, a, &[(0, 9_000)]);
        // a left the minimum: the control clock alone moves the watermark.
        assert_eq!(
            w.held_by(),
            Some(Hold::Control {
                time_ms: Some(4_000),
                lag_ms: 1_000
            })
        );
        assert_eq!(w.watermark(), Some(4_000));
        // Behind again with a delivered maximum above the control clock: the clock holds it.
        w.fetched_head(a, 3).unwrap();
        assert_eq!(
            w.held_by(),
            Some(Hold::Control {
                time_ms: Some(4_000),
                lag_ms: 1_000
            })
        );
    }

    #[test]
    fn an_unordered_input_holds_the_watermark_while_catching_up() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        // Two writers interleaved in a: 100, 10, 110, 20.
        let history = [(0, 100), (1, 10), (2, 110), (3, 20)];
        let mut ordered = WatermarkTracker::new([a, b], Some(Control { lag_ms: 100 }));
        let mut unordered = ordered.clone();
        unordered.unordered(a).unwrap();
        for w in [&mut ordered, &mut unordered] {
            w.control(10_000).unwrap();
            w.start(a, 4).unwrap();
            w.start(b, 0).unwrap();
            deliver(w, a, &history[..3]);
        }
        assert_eq!(
            ordered.watermark(),
            Some(110),
            "an ordered input's delivered maximum bounds it: 20 would come late"
        );
        assert_eq!(unordered.watermark(), None, "held while a catches up");
        deliver(&mut unordered, a, &history[3..]);
        assert_eq!(unordered.state(&a), Some(InputState::Left));
        assert_eq!(unordered.watermark(), Some(9_900), "caught up: the clock");
        // Caught up, it counts like any input: behind, its delivered maximum bounds a rise.
        unordered.fetched_head(a, 6).unwrap();
        assert_eq!(unordered.state(&a), Some(InputState::Behind));
        unordered.control(20_000).unwrap();
        assert_eq!(unordered.watermark(), Some(9_900));
        deliver(&mut unordered, a, &[(4, 15_000), (5, 15_001)]);
        assert_eq!(unordered.watermark(), Some(19_900));
        assert!(matches!(
            unordered.unordered(ch(9, 0)),
            Err(GateError::NotConsumed { .. })
        ));
    }

    #[test]
    fn no_evidence_means_no_watermark() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], None);
        assert_eq!(w.watermark(), None);
        w.start(a, 10).unwrap();
        w.start(b, 10).unwrap();
        deliver(&mut w, a, &[(0, 100)]);
        assert_eq!(w.watermark(), None, "b has delivered nothing");
        deliver(&mut w, b, &[(0, 40)]);
        assert_eq!(w.watermark(), Some(40));
    }

    #[test]
    fn c13_the_first_fetch_returning_one_partition_does_not_move_time() {
        // p0 holds event times 100..=200, p1 holds 0..=50; the first fetch returns only p0.
        let (p0, p1) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([p0, p1], None);
        w.start(p0, 101).unwrap();
        w.start(p1, 51).unwrap();
        let p0_records: Vec<(i64, i64)> = (0..=100).map(|o| (o, 100 + o)).collect();
        deliver(&mut w, p0, &p0_records);
        assert!(w.caught_up(&p0));
        assert_eq!(
            w.watermark(),
            None,
            "p1 is below its startup end and silent"
        );
        deliver(&mut w, p1, &[(0, 0), (1, 1)]);
        assert_eq!(w.watermark(), Some(1), "p1's progress bounds the watermark");
        let p1_records: Vec<(i64, i64)> = (2..=50).map(|o| (o, o)).collect();
        deliver(&mut w, p1, &p1_records);
        // Both caught up and at the head (startup end), no control: release on arrival.
        assert_eq!(w.watermark(), Some(200));
    }

    #[test]
    fn c14_an_empty_partition_adds_no_bound_and_no_infinity() {
        let (empty, p0) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([empty, p0], None);
        w.start(empty, 0).unwrap();
        w.start(p0, 101).unwrap();
        assert_eq!(w.state(&empty), Some(InputState::Left));
        let records: Vec<(i64, i64)> = (0..=99).map(|o| (o, o)).collect();
        deliver(&mut w, p0, &records);
        assert_eq!(
            w.watermark(),
            Some(99),
            "the empty partition does not hold it"
        );
        // Event time 150 was written at offset 101 during catch-up: the fetch shows it.
        w.fetched_head(p0, 102).unwrap();
        deliver(&mut w, p0, &[(100, 100)]);
        assert!(w.caught_up(&p0));
        assert_eq!(w.state(&p0), Some(InputState::Behind));
        assert_eq!(w.watermark(), Some(100));
        deliver(&mut w, p0, &[(101, 150)]);
        assert_eq!(w.state(&p0), Some(InputState::Left));
        assert_eq!(w.watermark(), Some(150), "at most 150, never +inf");
    }

    #[test]
    fn an_input_leaves_only_when_caught_up_and_at_the_live_head() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], Some(Control { lag_ms: 10 }));
        w.control(1_000).unwrap();
        w.start(a, 2).unwrap();
        w.start(b, 100).unwrap();
        deliver(&mut w, b, &[(0, 50)]);
        // a: at a head reading but not caught up — still in the minimum.
        w.fetched_head(a, 0).unwrap();
        deliver(&mut w, a, &[(0, 20)]);
        assert_eq!(w.state(&a), Some(InputState::CatchingUp));
        assert_eq!(w.watermark(), Some(20));
        // a caught up with history (startup end 2) but the fetch shows records up to 5.
        w.fetched_head(a, 5).unwrap();
        deliver(&mut w, a, &[(1, 30)]);
        assert!(w.caught_up(&a));
        assert_eq!(w.state(&a), Some(InputState::Behind));
        assert_eq!(
            w.watermark(),
            Some(30),
            "caught up alone does not leave the minimum"
        );
        deliver(&mut w, a, &[(2, 35), (3, 40), (4, 45)]);
        assert_eq!(w.state(&a), Some(InputState::Left));
        assert_eq!(w.watermark(), Some(50), "now b bounds it");
    }

    #[test]
    fn an_input_re_enters_the_minimum_when_a_fetch_shows_it_behind() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], Some(Control { lag_ms: 100 }));
        w.start(a, 1).unwrap();
        w.start(b, 1).unwrap();
        deliver(&mut w, a, &[(0, 500)]);
        deliver(&mut w, b, &[(0, 600)]);
        w.control(1_000).unwrap();
        assert_eq!(w.watermark(), Some(900), "both left: now minus lag");
        // b's next fetch shows a live record not delivered yet.
        w.fetched_head(b, 2).unwrap();
        assert!(w.in_minimum(&b));
        w.control(2_000).unwrap();
        assert_eq!(
            w.watermark(),
            Some(900),
            "held by b's delivered prefix (600), not lowered"
        );
        deliver(&mut w, b, &[(1, 1_950)]);
        assert_eq!(w.state(&b), Some(InputState::Left));
        assert_eq!(w.watermark(), Some(1_900));
    }

    #[test]
    fn a_re_entering_input_with_nothing_delivered_holds_the_watermark() {
        // Empty at startup (caught up at once), then live records arrive.
        let (empty, a) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([empty, a], None);
        w.start(empty, 0).unwrap();
        w.start(a, 1).unwrap();
        deliver(&mut w, a, &[(0, 70)]);
        assert_eq!(w.watermark(), Some(70));
        w.fetched_head(empty, 3).unwrap();
        assert_eq!(w.state(&empty), Some(InputState::Behind));
        w.fetched_head(a, 2).unwrap();
        deliver(&mut w, a, &[(1, 90)]);
        assert_eq!(
            w.watermark(),
            Some(70),
            "empty's next record is unknown: held"
        );
        deliver(&mut w, empty, &[(0, 80)]);
        assert_eq!(w.watermark(), Some(80));
    }

    #[test]
    fn only_the_delivered_prefix_counts_not_look_ahead_deliveries() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], None);
        w.start(a, 10).unwrap();
        w.start(b, 10).unwrap();
        deliver(&mut w, b, &[(0, 1_000)]);
        deliver(&mut w, a, &[(0, 10)]);
        assert_eq!(w.watermark(), Some(10));
        // a@3 (time 300) is pulled ahead of blocked a@1 and a@2: the frontier stays at 0.
        w.delivered(a, 3, 300).unwrap();
        w.frontier(a, 0).unwrap();
        assert_eq!(w.delivered_max(&a), Some(10));
        assert_eq!(
            w.watermark(),
            Some(10),
            "a look-ahead delivery does not move time"
        );
        deliver(&mut w, a, &[(1, 20), (2, 30)]);
        assert_eq!(w.watermark(), Some(30));
        w.frontier(a, 3).unwrap(); // the gate bridges over the look-ahead delivery
        assert_eq!(w.watermark(), Some(300));
    }

    #[test]
    fn fetched_records_do_not_count_before_they_are_delivered() {
        // The tracker hears only of deliveries; a fetch response moves the head, not time.
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], None);
        w.start(a, 5).unwrap();
        w.start(b, 5).unwrap();
        deliver(&mut w, a, &[(0, 10)]);
        deliver(&mut w, b, &[(0, 50)]);
        w.fetched_head(a, 5).unwrap();
        assert_eq!(w.watermark(), Some(10));
    }

    #[test]
    fn a_delivery_reported_before_its_frontier_counts_once_the_frontier_passes() {
        let a = ch(1, 0);
        let mut w = WatermarkTracker::new([a], None);
        w.start(a, 10).unwrap();
        w.delivered(a, 0, 7).unwrap();
        assert_eq!(w.watermark(), None);
        w.frontier(a, 0).unwrap();
        assert_eq!(w.watermark(), Some(7));
    }

    #[test]
    fn the_control_stream_contributes_processing_time_minus_lag() {
        let a = ch(1, 0);
        let mut w = WatermarkTracker::new([a], Some(Control { lag_ms: 250 }));
        w.start(a, 1).unwrap();
        deliver(&mut w, a, &[(0, 10_000)]);
        assert_eq!(
            w.watermark(),
            None,
            "a configured control stream with no reading holds"
        );
        w.control(5_000).unwrap();
        assert_eq!(
            w.watermark(),
            Some(4_750),
            "min(now - lag, nothing in the minimum)"
        );
        w.control(4_000).unwrap();
        assert_eq!(
            w.watermark(),
            Some(4_750),
            "a clock stepped back changes nothing"
        );
        w.control(20_000).unwrap();
        assert_eq!(
            w.watermark(),
            Some(19_750),
            "live records wait at most the lag"
        );
    }

    #[test]
    fn the_control_stream_changes_nothing_while_history_is_in_the_minimum() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], Some(Control { lag_ms: 1_000 }));
        w.start(a, 100).unwrap();
        w.start(b, 100).unwrap();
        w.control(1_000_000).unwrap();
        deliver(&mut w, a, &[(0, 5)]);
        deliver(&mut w, b, &[(0, 7)]);
        assert_eq!(w.watermark(), Some(5));
    }

    #[test]
    fn after_history_the_clock_jumps_to_now_and_the_parked_tail_drains_in_one_burst() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let now = 7 * 24 * 3_600_000;
        let mut w = WatermarkTracker::new([a, b], Some(Control { lag_ms: 1_000 }));
        let mut q: TimerQueue<u32, (Channel, i64)> = TimerQueue::new();
        w.control(now).unwrap();
        w.start(a, 3).unwrap();
        w.start(b, 3).unwrap();
        let mut released = Vec::new();
        // History: a is fast, b slow; times interleave across channels.
        for (c, o, t) in [
            (a, 0, 1_000),
            (a, 1, 3_000),
            (a, 2, 5_000),
            (b, 0, 2_000),
            (b, 1, 4_000),
        ] {
            w.delivered(c, o, t).unwrap();
            w.frontier(c, o).unwrap();
            if let Parking::Released(r) = q.park(7, t, [], (c, o)) {
                released.push(r.event_time_ms);
            }
            if let Some(wm) = w.watermark() {
                released.extend(q.advance(wm).into_iter().map(|r| r.event_time_ms));
            }
        }
        assert_eq!(released, vec![1_000, 2_000, 3_000, 4_000]);
        assert_eq!(w.watermark(), Some(4_000));
        assert_eq!(q.len(), 1);
        w.delivered(b, 2, 6_000).unwrap();
        q.park(7, 6_000, [], (b, 2));
        w.frontier(b, 2).unwrap();
        assert!(w.all_caught_up());
        assert_eq!(w.watermark(), Some(now - 1_000), "jumps to now minus lag");
        let burst: Vec<i64> = q
            .advance(w.watermark().unwrap())
            .into_iter()
            .map(|r| r.event_time_ms)
            .collect();
        assert_eq!(
            burst,
            vec![5_000, 6_000],
            "the parked tail, in order, at once"
        );
        assert!(q.is_empty());
        assert_eq!(q.metrics().late, 0);
    }

    #[test]
    fn without_a_control_stream_live_records_are_released_on_arrival_and_counted_when_late() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], None);
        let mut q: TimerQueue<&str, i64> = TimerQueue::new();
        w.start(a, 0).unwrap();
        w.start(b, 0).unwrap();
        assert_eq!(
            w.watermark(),
            None,
            "both left, nothing delivered: no evidence"
        );
        let mut step = |w: &mut WatermarkTracker, c: Channel, o: i64, t: i64| {
            w.delivered(c, o, t).unwrap();
            w.frontier(c, o).unwrap();
            let parking = q.park("k", t, [], o);
            let released = q.advance(w.watermark().unwrap());
            (parking, released)
        };
        let (p, r) = step(&mut w, a, 0, 100);
        assert!(matches!(
            p,
            Parking::Parked {
                park_time_ms: 100,
                ..
            }
        ));
        assert_eq!(r.len(), 1, "released on arrival");
        assert_eq!(
            w.watermark(),
            Some(100),
            "the highest delivered time, not +inf"
        );
        let (p, _) = step(&mut w, b, 0, 90);
        match p {
            Parking::Released(r) => assert!(r.late),
            other => panic!("expected a late release, got {other:?}"),
        }
        assert_eq!(w.watermark(), Some(100));
        assert_eq!(q.late_for(&"k"), 1);
    }

    #[test]
    fn the_head_is_the_lso_so_an_open_transaction_does_not_stall_a_caught_up_input() {
        // Caught up at the startup high watermark 10; later a producer holds a transaction
        // open at 12 with records above it: the fetch's LSO is 12, the high watermark 20.
        let a = ch(1, 0);
        let mut w = WatermarkTracker::new([a], Some(Control { lag_ms: 0 }));
        w.start(a, 10).unwrap();
        w.control(1_000).unwrap();
        let records: Vec<(i64, i64)> = (0..12).map(|o| (o, o)).collect();
        deliver(&mut w, a, &records);
        w.fetched_head(a, 12).unwrap();
        assert_eq!(w.state(&a), Some(InputState::Left));
        assert_eq!(w.watermark(), Some(1_000));
    }

    #[test]
    fn a_topic_leaves_the_minimum_only_when_every_channel_has() {
        let (t1, t2) = (TopicId::from_bytes([1; 16]), TopicId::from_bytes([2; 16]));
        let (a0, a1) = (Channel::new(t1, 0), Channel::new(t1, 1));
        let mut w = WatermarkTracker::new([a0, a1], None);
        w.start(a0, 0).unwrap();
        w.start(a1, 1).unwrap();
        assert!(!w.topic_left(t1));
        assert!(!w.topic_caught_up(t1));
        deliver(&mut w, a1, &[(0, 1)]);
        assert!(w.topic_left(t1));
        assert!(w.topic_caught_up(t1));
        assert!(!w.topic_left(t2), "no channel of t2 is an input");
    }

    #[test]
    fn a_snapshot_restores_the_watermark_and_delivered_prefixes_not_fetch_evidence() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut w = WatermarkTracker::new([a, b], None);
        w.start(a, 100).unwrap();
        w.start(b, 100).unwrap();
        deliver(&mut w, a, &[(0, 10), (1, 20)]);
        deliver(&mut w, b, &[(0, 15)]);
        w.delivered(b, 5, 99).unwrap(); // a look-ahead delivery above b's frontier
        assert_eq!(w.watermark(), Some(15));
        let snap = w.snapshot();
        let mut r = WatermarkTracker::restore([a, b], None, &snap).unwrap();
        assert_eq!(r.snapshot(), snap);
        assert_eq!(r.watermark(), Some(15));
        assert!(!r.caught_up(&a), "end offsets are read again");
        r.start(a, 110).unwrap();
        r.start(b, 110).unwrap();
        r.frontier(a, 1).unwrap();
        r.frontier(b, 0).unwrap();
        assert_eq!(r.delivered_max(&a), Some(20));
        deliver(&mut r, b, &[(1, 16), (2, 17), (3, 18), (4, 19)]);
        r.frontier(b, 5).unwrap();
        assert_eq!(
            r.delivered_max(&b),
            Some(99),
            "the look-ahead time survived"
        );
        assert_eq!(r.watermark(), Some(20));
        assert_eq!(
            WatermarkTracker::restore([a], None, &snap).unwrap_err(),
            GateError::NotConsumed { channel: b }
        );
    }

    #[test]
    fn bad_evidence_is_refused() {
        let (a, other) = (ch(1, 0), ch(9, 9));
        let mut w = WatermarkTracker::new([a], None);
        assert_eq!(w.control(5), Err(GateError::NoControlStream));
        assert_eq!(
            w.delivered(other, 0, 1),
            Err(GateError::NotConsumed { channel: other })
        );
        assert_eq!(
            w.fetched_head(a, -1001),
            Err(GateError::NegativeEndOffset {
                channel: a,
                end_offset: -1001
            })
        );
        w.frontier(a, 3).unwrap();
        assert_eq!(
            w.frontier(a, 2),
            Err(GateError::FrontierBehind {
                channel: a,
                frontier: 2,
                previous: 3
            })
        );
    }

    #[test]
    fn follow_reads_the_gates_frontiers() {
        let a = ch(1, 0);
        let mut gate: Gate<()> = Gate::new([a]);
        gate.seed(a, 0).unwrap();
        let mut w = WatermarkTracker::new([a], None);
        w.start(a, 4).unwrap();
        w.delivered(a, 0, 5).unwrap();
        w.follow(&gate).unwrap();
        assert_eq!(w.watermark(), None, "the gate has delivered nothing");
        gate.offer(
            a,
            crate::Arrival {
                offset: 0,
                timestamp: 5,
                epoch: 1,
                stamp: None,
                payload: (),
            },
        )
        .unwrap();
        assert!(gate.next_delivery().is_some());
        gate.position(a, 4).unwrap(); // offsets 1..=3: an aborted transaction and its marker
        w.follow(&gate).unwrap();
        assert!(w.caught_up(&a));
        assert_eq!(w.watermark(), Some(5));
    }
}
