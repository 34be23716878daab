//! The public types a [`Gate`] takes and returns: the records handed in ([`Arrival`]) and
//! released ([`Delivery`], [`Discarded`]), impossible stamps ([`ImpossibleStamp`]) and their
//! [`Resolution`], what a blocked record waits for ([`Awaiting`], [`BlockedHead`]), counters
//! ([`GateMetrics`]), the committed state ([`GateSnapshot`], [`ChannelSnapshot`]), a re-fetch in
//! progress ([`Refetch`]) and the negative controls ([`Faults`]).
//!
//! Plain data: the gate's invariants live with its state (`state`), not here.

use parsley_clock::{Channel, Coordinate, SenderId, SenderTag, Stamp};

#[cfg(doc)]
use super::Gate;
use crate::error::ImpossibleReason;

/// A fetched record handed to the gate.
#[derive(Debug, Clone)]
pub struct Arrival<R> {
    /// The record's offset on its channel.
    pub offset: i64,
    /// The record's timestamp, ms since the epoch (orders deliverable records).
    pub timestamp: i64,
    /// The number of the poll that returned the record (non-decreasing across calls): evidence
    /// read after that poll is valid for it.
    pub epoch: u64,
    /// The decoded stamp; `None` for an unstamped record, which claims nothing.
    pub stamp: Option<Stamp>,
    /// What the caller needs back on delivery.
    pub payload: R,
}

/// A record the gate released.
#[derive(Debug, Clone)]
pub struct Delivery<R> {
    /// Channel and offset of the record.
    pub coordinate: Coordinate,
    /// The record's timestamp, ms since the epoch.
    pub timestamp: i64,
    /// Its stamp: merge its clock into the node clock.
    pub stamp: Option<Stamp>,
    /// The payload of the [`Arrival`].
    pub payload: R,
    /// `true` when the record was held before it could be delivered.
    pub waited: bool,
    /// `true` when it was delivered ahead of earlier records of its channel.
    pub lookahead: bool,
    /// Coordinates that replace the stamp's in-flight claims this node did not resolve by its
    /// own deliveries: merge them into the node clock too; never carry the claims forward.
    pub replacements: Vec<Coordinate>,
}

/// A record removed from the gate by [`Gate::resolve`] with [`Resolution::Discard`].
#[derive(Debug, Clone)]
pub struct Discarded<R> {
    /// Channel and offset of the record.
    pub coordinate: Coordinate,
    /// Its stamp.
    pub stamp: Option<Stamp>,
    /// The payload of the [`Arrival`].
    pub payload: R,
}

/// What to do with a record whose stamp is impossible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Deliver it, ignoring its impossible claims (the caller counts it).
    Deliver,
    /// Remove it: it counts as processed for the frontier and for claims on it, and comes back
    /// from [`Gate::resolve`] so the caller can route it to a dead-letter topic.
    Discard,
}

/// A stamp no truthful sender can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImpossibleStamp {
    /// The record carrying it.
    pub record: Coordinate,
    /// Its sender tag, if any.
    pub sender: Option<SenderTag>,
    /// The impossible claim.
    pub claim: Coordinate,
    /// Why it is impossible.
    pub reason: ImpossibleReason,
}

/// Counters a runtime exports as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateMetrics {
    /// Records delivered.
    pub delivered: u64,
    /// Delivered records that were held at least once.
    pub held: u64,
    /// Records delivered ahead of earlier records of their channel (claim-driven look-ahead).
    pub lookahead: u64,
    /// Clock entries skipped by the ignore branch.
    pub ignored_entries: u64,
    /// Clock entries below the baseline of their channel.
    pub out_of_scope_entries: u64,
    /// Impossible stamps found.
    pub impossible: u64,
    /// Records removed with [`Resolution::Discard`].
    pub discarded: u64,
    /// Records spilled (payload and stamp dropped, re-fetched later).
    pub spilled: u64,
    /// Spilled records refilled by a re-fetch.
    pub refetched: u64,
}

/// What a blocked record waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaiting {
    /// The frontier of a channel to reach an offset.
    Frontier(Coordinate),
    /// A consumed channel to be seeded.
    Seeding(Channel),
    /// An in-flight claim of `sender` on `channel` up to `seq` to settle.
    InFlight {
        /// The claim's sender (the record's own sender).
        sender: SenderId,
        /// The claimed channel.
        channel: Channel,
        /// The claimed sequence.
        seq: u64,
    },
    /// A high watermark read after the record's poll, for a channel this task does not
    /// consume (to replace an in-flight claim).
    Evidence(Channel),
    /// A resolution of its impossible stamp.
    Resolution,
}

/// A blocked record and what it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedHead {
    /// The record.
    pub head: Coordinate,
    /// What it waits for.
    pub awaits: Awaiting,
}

/// The committed part of a gate: what survives a restart (the book's specification, §7). Fetch-time
/// evidence (fetched records, positions, high watermarks) is rebuilt by fetching again, never
/// restored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GateSnapshot {
    /// Per consumed channel that was seeded.
    pub channels: Vec<ChannelSnapshot>,
}

/// The committed state of one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSnapshot {
    /// The channel.
    pub channel: Channel,
    /// Its baseline.
    pub baseline: i64,
    /// Its frontier.
    pub frontier: i64,
    /// Offsets delivered above the frontier, ascending.
    pub lookahead: Vec<i64>,
    /// Highest delivered sequence per sender.
    pub delivered: Vec<(SenderId, u64)>,
}

/// A re-fetch of spilled records in progress on one channel ([`Gate::begin_refetch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refetch {
    /// The offset re-fetching started from: a needed spilled record.
    pub from: i64,
    /// The offset where reading had stopped: offers below it refill stubs or are ignored.
    pub resume: i64,
}

/// Deliberately wrong variants of the gate, for negative controls only: each must make the
/// simulator's oracle or liveness check fail (the book's specification, §4). Settable only with the
/// `negative-controls` feature; all off otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Deliver every head at once: no claims checked.
    pub gate_off: bool,
    /// Never pull a record ahead (strict per-channel FIFO).
    pub strict_fifo: bool,
    /// A look-ahead delivery moves the frontier to its own offset.
    pub bridge_over_lookahead: bool,
    /// Re-check blocked records only when a frontier moves.
    pub wakeups_only_on_frontier: bool,
}
