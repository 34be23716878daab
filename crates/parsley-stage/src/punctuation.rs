//! Punctuation: a stage's logic called on time rather than on a record (Kafka Streams'
//! `ProcessorContext.schedule(interval, PunctuationType, Punctuator)`).
//!
//! A stage declares its schedules when it is built ([`crate::StageBuilder::schedule`]); each
//! names an interval in ms and a [`PunctuationType`]. The runtime calls the schedule's
//! [`Punctuator`] when the task's time passes a multiple of the interval:
//!
//! - [`PunctuationType::StreamTime`]: the task's **event-time position** (the stage must order by
//!   event time). The punctuator fires once for **each** multiple of the interval the position
//!   passes, at that multiple, interleaved with the records and keyed timers the watermark
//!   releases as a keyed timer of that time is: after those at its time or earlier, before those
//!   at a later one.
//! - [`PunctuationType::WallClockTime`]: the **ticks of the built-in clock** the task reads back
//!   (the stage must have the built-in clock, [`crate::EventTimeOrder::clock`]). When a tick's
//!   time passes the schedule's next multiple of the interval, the punctuator fires once, at the
//!   tick's time (missed multiples are skipped, as in Kafka Streams), ordered in event time at
//!   the tick's time minus the clock's lag — the event-time position the tick stands for.
//!
//! Either way the firing points are a function of what the task read (records and ticks), and
//! are changelogged with the task's state: a restore or a replay of the same input, ticks
//! included, fires at the same points.
//!
//! A punctuator is pure: given the punctuation (its time) and read access to the fold state of
//! any key of the task ([`FoldStates`]), it returns emissions and state changes by key
//! ([`Punctuated`]). Its emissions carry the punctuation's time as record timestamp unless they
//! set another, and no headers unless they set some.
//!
//! Beside `handler`: it imports `handler` and `codec` only (`processor` calls punctuators).

use std::sync::Arc;

use crate::codec::Codec;
use crate::handler::{Emission, HandlerError, StateChange};

/// What moves a punctuation schedule (Kafka Streams' `PunctuationType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PunctuationType {
    /// The task's event-time position (Kafka Streams' `STREAM_TIME`): needs event-time order.
    StreamTime,
    /// The built-in clock's ticks (Kafka Streams' `WALL_CLOCK_TIME`, but read from Kafka, so
    /// replayable): needs the built-in clock.
    WallClockTime,
}

impl PunctuationType {
    /// The type's byte in the changelog (0: stream time, 1: wall-clock time).
    pub fn to_byte(self) -> u8 {
        match self {
            PunctuationType::StreamTime => 0,
            PunctuationType::WallClockTime => 1,
        }
    }

    /// The type of changelog byte `b`; `None` for another byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(PunctuationType::StreamTime),
            1 => Some(PunctuationType::WallClockTime),
            _ => None,
        }
    }
}

/// One punctuation schedule of a stage: every `interval_ms` ms (`> 0`) of `kind`'s time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// The interval, ms (`> 0`, checked by [`crate::TopologyBuilder::build`]).
    pub interval_ms: i64,
    /// What moves it.
    pub kind: PunctuationType,
}

impl Schedule {
    /// The first multiple of the interval strictly above `time` (ms), saturating at `i64::MAX`.
    ///
    /// # Panics
    /// When `interval_ms <= 0` (the topology's build refuses such a schedule).
    pub fn next_after(&self, time: i64) -> i64 {
        assert!(self.interval_ms > 0, "a punctuation interval must be > 0");
        time.div_euclid(self.interval_ms)
            .saturating_add(1)
            .saturating_mul(self.interval_ms)
    }
}

/// A punctuation that fired, as a punctuator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Punctuation {
    /// The schedule's index among the stage's schedules, in declaration order.
    pub schedule: usize,
    /// What moved it.
    pub kind: PunctuationType,
    /// The punctuation's time, ms since the epoch: the multiple of the interval the event-time
    /// position passed ([`PunctuationType::StreamTime`]), or the time of the tick that passed
    /// the next multiple ([`PunctuationType::WallClockTime`]).
    pub time: i64,
    /// The task's partition.
    pub partition: i32,
}

/// What a punctuator returns: records to emit, in order, and fold-state changes by key.
#[derive(Debug, Clone, PartialEq)]
pub struct Punctuated<K, V, S> {
    /// Records to emit, in order (timestamp: the punctuation's time unless set).
    pub emit: Vec<Emission<K, V>>,
    /// Fold-state changes, applied in order (a key changed twice keeps the last).
    pub states: Vec<(K, StateChange<S>)>,
}

impl<K, V, S> Default for Punctuated<K, V, S> {
    fn default() -> Self {
        Punctuated {
            emit: Vec::new(),
            states: Vec::new(),
        }
    }
}

impl<K, V, S> Punctuated<K, V, S> {
    /// Emits nothing and changes no state.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds an emission to `topic`.
    pub fn emit(mut self, topic: impl Into<Arc<str>>, key: K, value: V) -> Self {
        self.emit.push(Emission::to(topic, key, value));
        self
    }

    /// Sets the fold state of `key`.
    pub fn set_state(mut self, key: K, state: S) -> Self {
        self.states.push((key, StateChange::Set(state)));
        self
    }

    /// Deletes the fold state of `key`.
    pub fn delete_state(mut self, key: K) -> Self {
        self.states.push((key, StateChange::Delete));
        self
    }
}

/// What a [`Punctuator`] returns.
pub type PunctuatorResult<K, V, S> = Result<Punctuated<K, V, S>, HandlerError>;

/// Reads the encoded fold state of a key (`None`: it has none), or says why it cannot.
pub type ReadState<'a> = &'a dyn Fn(&[u8]) -> Result<Option<Vec<u8>>, String>;

/// The fold state of the task's keys, typed, as a punctuator reads it: the state between two
/// records, the open transaction's changes included.
pub struct FoldStates<'a, K, S> {
    lookup: ReadState<'a>,
    key: &'a dyn Codec<K>,
    state: &'a dyn Codec<S>,
}

impl<'a, K, S> FoldStates<'a, K, S> {
    /// The state of the keys `lookup` reads, with codecs `key` and `state`.
    pub fn new(lookup: ReadState<'a>, key: &'a dyn Codec<K>, state: &'a dyn Codec<S>) -> Self {
        FoldStates { lookup, key, state }
    }

    /// The fold state of `key`, `None` when it has none.
    ///
    /// # Errors
    /// The key does not encode, the state does not decode, or the store cannot be read
    /// (each message names which).
    pub fn get(&self, key: &K) -> Result<Option<S>, HandlerError> {
        let bytes = self
            .key
            .encode(key)
            .map_err(|e| format!("cannot encode a key to read its state: {e}"))?;
        match (self.lookup)(&bytes)? {
            Some(b) => {
                Ok(Some(self.state.decode(&b).map_err(|e| {
                    format!("cannot decode the state of a key: {e}")
                })?))
            }
            None => Ok(None),
        }
    }
}

/// A punctuation's logic: pure, given the punctuation and the task's state
/// ([`FoldStates`]). Any `Fn(Punctuation, &FoldStates<K, S>) -> PunctuatorResult<K, V, S>` is one.
pub trait Punctuator<K, V, S>: Send + Sync + 'static {
    /// Called once per firing of its schedule (module docs).
    ///
    /// # Errors
    /// A [`HandlerError`] stops the stage (a punctuation has no input record to give a
    /// bad-record policy).
    fn punctuate(
        &self,
        punctuation: Punctuation,
        state: &FoldStates<'_, K, S>,
    ) -> PunctuatorResult<K, V, S>;
}

impl<K, V, S, F> Punctuator<K, V, S> for F
where
    F: Fn(Punctuation, &FoldStates<'_, K, S>) -> PunctuatorResult<K, V, S> + Send + Sync + 'static,
{
    fn punctuate(
        &self,
        punctuation: Punctuation,
        state: &FoldStates<'_, K, S>,
    ) -> PunctuatorResult<K, V, S> {
        self(punctuation, state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_multiple_is_strictly_above_and_saturates() {
        let s = Schedule {
            interval_ms: 1_000,
            kind: PunctuationType::StreamTime,
        };
        assert_eq!(s.next_after(0), 1_000);
        assert_eq!(s.next_after(999), 1_000);
        assert_eq!(s.next_after(1_000), 2_000);
        assert_eq!(s.next_after(-1), 0);
        assert_eq!(s.next_after(i64::MAX), i64::MAX);
        for b in 0..=1 {
            assert_eq!(PunctuationType::from_byte(b).unwrap().to_byte(), b);
        }
        assert_eq!(PunctuationType::from_byte(2), None);
    }
}
