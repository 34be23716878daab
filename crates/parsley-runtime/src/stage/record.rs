//! What moves through a task: a fetched record on its way to the gate ([`Fetched`]), what
//! the gate hands back on delivery ([`Payload`], its rare parts boxed in [`Rare`]), and the
//! counts a task keeps of its work ([`Work`] for the open transaction, [`TaskCounts`] for its
//! metrics).
//!
//! Invariant: a payload's common part stays small — every record moves through the gate by
//! value — and whatever only some records carry is in [`Rare`], absent for the others.

use std::time::Instant;

use parsley_clock::{Channel, Stamp};
use parsley_gate::Arrival;

use super::output::Header;
use crate::error::Error;

/// What the gate hands back on delivery.
#[derive(Debug)]
pub(crate) struct Payload {
    /// Index of the source topic in the stage's sources (`TaskContext::sources`).
    pub source: usize,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// When the record's poll batch was taken (gate-wait metrics).
    pub arrived: Instant,
    /// The Kafka record timestamp, ms since the epoch (the event time of an event-time stage);
    /// `None` when the record has none.
    pub record_timestamp: Option<i64>,
    /// What few records carry; boxed: every record moves through the gate by value, and the
    /// common case should be small.
    pub rare: Option<Box<Rare>>,
}

/// What few records carry ([`Payload::rare`]).
#[derive(Debug, Default)]
pub(crate) struct Rare {
    /// The stamp, when the gate does not check it ([`crate::GateMode::Off`]): still merged
    /// into the node clock on delivery.
    pub unchecked_stamp: Option<Stamp>,
    /// Why the record goes to the dead-letter topic instead of the handler, if it does.
    pub dead_letter: Option<Box<str>>,
    /// The record's headers, kept only when the stage may dead-letter it.
    pub headers: Box<[Header]>,
}

impl Rare {
    /// The stamp the gate did not check, if any.
    pub(crate) fn unchecked_stamp(rare: &Option<Box<Rare>>) -> Option<&Stamp> {
        rare.as_ref()?.unchecked_stamp.as_ref()
    }

    /// Why the record goes to the dead-letter topic, if it does.
    pub(crate) fn dead_letter(rare: &Option<Box<Rare>>) -> Option<&str> {
        rare.as_ref()?.dead_letter.as_deref()
    }

    /// The record's headers, when the stage keeps them; else none.
    pub(crate) fn headers(rare: &Option<Box<Rare>>) -> &[Header] {
        rare.as_ref().map_or(&[], |r| &r.headers)
    }
}

/// A polled record, copied out of the consumer's buffer.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// The task's partition.
    pub partition: i32,
    /// The record's channel.
    pub channel: Channel,
    /// What the gate takes.
    pub arrival: Arrival<Payload>,
    /// The stamp header could not be decoded (the record is unstamped in `arrival`).
    pub malformed: Option<Box<Error>>,
}

/// Work done since the last commit: what makes a commit worth writing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    /// Records delivered to the handler or dead-lettered.
    pub deliveries: u64,
    /// Records sent (emissions and dead letters).
    pub emissions: u64,
    /// Gate deliveries parked in an event-time queue (the queue changed: commit it).
    pub parked: u64,
}

impl Work {
    /// No delivery, send or parked record.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Work::default()
    }
}

impl std::ops::AddAssign for Work {
    fn add_assign(&mut self, other: Work) {
        self.deliveries += other.deliveries;
        self.emissions += other.emissions;
        self.parked += other.parked;
    }
}

/// Per-task deliveries not yet added to the task's [`crate::TaskMetrics`] (one lock per
/// delivery round, not per record).
#[derive(Debug, Default)]
pub(crate) struct TaskCounts {
    pub delivered: u64,
    pub held: u64,
    pub gate_wait_us: u64,
    pub max_gate_wait_us: u64,
    pub late: u64,
    pub raised: u64,
}
