//! The delivery gate of one task: which fetched record may be delivered next.
//!
//! # The rule (DESIGN.md §4)
//! A task consumes a fixed set of channels: partition `p` of every source topic, whether or not
//! the consumer holds them yet. Fetched records wait in one queue per channel, in offset order.
//! A record `m` is **deliverable** when
//! 1. every entry `(c', o')` of its stamp's clock is satisfied: `c'` not consumed → the
//!    **ignore branch**; `c'` consumed but not seeded → blocked (a consumed channel is never
//!    ignored); `o' < B[c']` → out of scope; otherwise `F[c'] >= o'`;
//! 2. every in-flight claim `(s, c', k)` (`s` is `m`'s sender) on a consumed `c'` is settled:
//!    the task delivered `s`'s record with sequence `>= k` on `c'`; or no fetched, undelivered
//!    record of `s` on `c'` has a sequence `<= k` (those are delivered first, pulled ahead if
//!    needed) **and** either a fetched record of `s` on `c'` has a sequence above `k`, or the
//!    consumer's position on `c'` has reached `E(c')`, the high watermark read after the poll
//!    that returned `m`;
//! 3. every in-flight claim on a channel the task does not consume has such an `E`, so that the
//!    node can replace the claim by the coordinate `(c', E - 1)` (DESIGN.md §3);
//! 4. `m` is the head of its queue — or it is the first undelivered record of its sender on its
//!    channel and an in-flight claim of a blocked record pulls it (**claim-driven
//!    look-ahead**).
//!
//! Among deliverable records the gate picks the smallest record timestamp, then the smallest
//! channel, then the smallest offset: a given sequence of events always gives the same order.
//!
//! # Claim-driven look-ahead and why it cannot deadlock
//! Two transactional senders that each send to `c` then `c'` can have their appends land
//! crossed, so strict per-channel FIFO would wait in a cycle. A blocked record's in-flight claim
//! may therefore pull its target ahead of earlier records of *other* senders on the target's
//! channel; per-(channel, sender) order is kept. Every wait the gate keeps points from a record
//! to one sent earlier in real time (a coordinate claim covers records appended before the
//! claimed offset, which the claimer saw before sending; an in-flight claim names an earlier
//! send; per-sender order is send order), and sent-before is acyclic. Strict FIFO across
//! senders, the one constraint that follows append order instead, is what look-ahead relaxes.
//!
//! # Density adaptation
//! A `read_committed` partition is not dense: commit markers and aborted records take offsets
//! the consumer never returns.
//! - **Seeding** ([`Gate::seed`]): the first assignment sets `B` to the consumer's position and
//!   `F = B - 1`.
//! - **Bridging**: a fetched head at `o` proves the consumer returned nothing in `(F, o)`, so `F`
//!   rises to `o - 1` when it arrives; delivering the head sets `F = o` and then advances over
//!   consecutive look-ahead deliveries. A look-ahead delivery leaves `F` unchanged and is kept
//!   in the look-ahead set (persisted by [`Gate::snapshot`]).
//! - **Position advance** ([`Gate::position`]): when no fetched record of a channel is
//!   undelivered, `F = max(F, position - 1)`, where the position is the consumer's
//!   *application* position read after the poll.
//!
//! # Evidence and wake-ups
//! No timers. A blocked record is filed under the one channel its first unsatisfied claim
//! concerns and re-checked on *any* event there — a fetched record, a delivery (look-ahead
//! included), a position, a high watermark, seeding. (Indexing by the awaited frontier offset
//! alone would lose wake-ups: in-flight claims settle by sequences and positions, which do not
//! move `F`.) High watermarks are asked for by [`Gate::evidence_wanted`] and supplied with
//! [`Gate::high_watermark`] together with the poll epoch after which they were read.
//!
//! # Backpressure and spilling
//! A runtime bounds what each channel's queue holds ([`Gate::held`]) and pauses a full
//! channel — except one that [`Gate::needs_reading`] names: an unsettled in-flight claim waits
//! for a record further on, and pausing would deadlock. Such a channel **spills**
//! ([`Gate::spill`]): the payloads and stamps of its untracked undelivered records are dropped
//! and each leaves a stub (offset, timestamp, poll epoch, sender tag), so the frontier, bridging
//! and per-sender order stay exact. A stub that is needed — the head of its queue, or the
//! target of a claim or of its sender's order — is named by [`Gate::refetch_wanted`]; the
//! runtime seeks back and re-fetches it between [`Gate::begin_refetch`] and the offset where
//! reading stopped ([`Gate::end_refetch`] to stop early). Re-fetched records refill their
//! stubs; every other re-fetched record is already held or delivered and is ignored. Tracked
//! records (heads and pulled records) are never spilled, so a re-fetch always makes progress.
//!
//! # Impossible stamps
//! A claim on the record's own channel at or beyond its own offset, or a coordinate claim at or
//! beyond the channel's high watermark read after the record's poll (a claim from the future),
//! cannot come from a truthful sender. Such a record is held and reported
//! ([`Gate::take_impossible`]); the caller applies its policy with [`Gate::resolve`].
//!
//! # Invariants, per consumed channel
//! - `frontier`: every offset `<= frontier` was delivered or is absent for this consumer; it
//!   never decreases;
//! - `queue`: fetched records with offsets above the frontier, ascending; its front is never a
//!   delivered record;
//! - `lookahead`: exactly the delivered offsets above the frontier;
//! - `undelivered` counts the queue's undelivered records, `spilled` those of them that are
//!   stubs; a tracked record is never a stub;
//! - per sender: the highest delivered sequence, and the fetched undelivered records by
//!   sequence (in offset order, since one sender's sends to one partition append in order).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use parsley_clock::{Channel, Coordinate, SenderId, SenderTag, Stamp};

use crate::error::{GateError, ImpossibleReason, Refused};

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

/// The committed part of a gate: what survives a restart (DESIGN.md §7). Fetch-time evidence
/// (fetched records, positions, high watermarks) is rebuilt by fetching again, never restored.
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
/// simulator's oracle or liveness check fail (DESIGN.md §4). Settable only with the
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

type Idx = usize;

/// Hashes a random UUID by its first 8 bytes (sender ids are random: no need for SipHash).
#[derive(Default)]
struct SenderHasher(u64);

impl Hasher for SenderHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(b);
        }
    }
}

type SenderMap<V> = HashMap<SenderId, V, BuildHasherDefault<SenderHasher>>;

#[derive(Debug, Default)]
struct SenderState {
    /// Highest delivered (or discarded) sequence.
    delivered: Option<u64>,
    /// Fetched, undelivered records: sequence → offset.
    pending: BTreeMap<u64, i64>,
}

#[derive(Debug)]
struct Slot<R> {
    offset: i64,
    timestamp: i64,
    epoch: u64,
    stamp: Option<Stamp>,
    /// `None` once delivered (a look-ahead tombstone) or while spilled.
    payload: Option<R>,
    /// Spilled: undelivered, payload and stamp dropped until re-fetched.
    spilled: bool,
    /// The stamp's sender tag, kept while spilled (to check the re-fetched record).
    sender: Option<SenderTag>,
    /// Clock entries `[..cursor]` are satisfied for good.
    cursor: usize,
    waited: bool,
    /// Head of its queue or pulled by a claim: being checked.
    tracked: bool,
    ready: bool,
    /// Reported impossible, waiting for [`Gate::resolve`].
    impossible: bool,
    /// Resolved with [`Resolution::Deliver`]: impossible claims are ignored.
    allow_impossible: bool,
    blocked: Option<Awaiting>,
}

#[derive(Debug)]
struct ChannelState<R> {
    channel: Channel,
    baseline: Option<i64>,
    frontier: i64,
    queue: VecDeque<Slot<R>>,
    /// Undelivered records in `queue` (spilled ones included).
    undelivered: usize,
    /// Spilled records in `queue`.
    spilled: usize,
    /// While re-fetching spilled records.
    refetch: Option<Refetch>,
    lookahead: BTreeSet<i64>,
    senders: SenderMap<SenderState>,
    /// The consumer's application position (next offset to return), latest reading.
    position: Option<i64>,
    /// Latest high watermark reading and the poll epoch it was read after.
    high_watermark: Option<(i64, u64)>,
    /// Tracked records (channel, offset) to re-check on any event on this channel.
    watchers: Vec<(Idx, i64)>,
}

/// The outcome of checking one tracked record.
enum Verdict {
    Ready,
    Blocked {
        awaits: Awaiting,
        watch: Watch,
    },
    Pull {
        channel: Idx,
        offset: i64,
        awaits: Awaiting,
    },
    Impossible(ImpossibleStamp),
}

#[derive(Clone, Copy)]
enum Watch {
    Consumed(Idx),
    Foreign(Channel),
}

/// The delivery gate of one task. `R` is the caller's payload type.
#[derive(Debug)]
pub struct Gate<R> {
    /// Consumed channels, sorted; the index is the channel's `Idx`.
    channels: Vec<ChannelState<R>>,
    /// Deliverable records: (timestamp, channel, offset), smallest first. A record becomes
    /// ready once and stays ready until delivered.
    ready: BinaryHeap<Reverse<(i64, Idx, i64)>>,
    /// Tracked records that are blocked (or held for a resolution): (channel, offset).
    blocked: BTreeSet<(Idx, i64)>,
    /// High watermarks of channels this task does not consume (for replacements).
    foreign_hw: HashMap<Channel, (i64, u64)>,
    foreign_watchers: HashMap<Channel, Vec<(Idx, i64)>>,
    impossible: Vec<ImpossibleStamp>,
    metrics: GateMetrics,
    faults: Faults,
}

impl<R> Gate<R> {
    /// A gate for a task that consumes exactly `consumed` (the topology's channels for the
    /// task, whether or not they are assigned yet). Duplicates are ignored.
    pub fn new(consumed: impl IntoIterator<Item = Channel>) -> Self {
        let mut list: Vec<Channel> = consumed.into_iter().collect();
        list.sort();
        list.dedup();
        Gate {
            channels: list
                .into_iter()
                .map(|channel| ChannelState {
                    channel,
                    baseline: None,
                    frontier: -1,
                    queue: VecDeque::new(),
                    undelivered: 0,
                    spilled: 0,
                    refetch: None,
                    lookahead: BTreeSet::new(),
                    senders: SenderMap::default(),
                    position: None,
                    high_watermark: None,
                    watchers: Vec::new(),
                })
                .collect(),
            ready: BinaryHeap::new(),
            blocked: BTreeSet::new(),
            foreign_hw: HashMap::new(),
            foreign_watchers: HashMap::new(),
            impossible: Vec::new(),
            metrics: GateMetrics::default(),
            faults: Faults::default(),
        }
    }

    /// A gate for `consumed` restored from `snapshot`: baselines, frontiers, look-ahead sets and
    /// delivered sequences come back; queues and evidence start empty. The caller re-fetches
    /// each channel from [`Gate::first_undelivered`]; re-fetched records in the look-ahead set
    /// are recognised and not delivered again.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`] for a snapshot channel outside `consumed`.
    pub fn restore(
        consumed: impl IntoIterator<Item = Channel>,
        snapshot: &GateSnapshot,
    ) -> Result<Self, GateError> {
        let mut gate = Gate::new(consumed);
        for c in &snapshot.channels {
            let idx = gate.index_or_err(c.channel)?;
            let s = &mut gate.channels[idx];
            s.baseline = Some(c.baseline);
            s.frontier = c.frontier;
            s.lookahead = c
                .lookahead
                .iter()
                .copied()
                .filter(|o| *o > c.frontier)
                .collect();
            for &(sender, seq) in &c.delivered {
                s.senders.entry(sender).or_default().delivered = Some(seq);
            }
        }
        Ok(gate)
    }

    /// The committed part of the gate (see [`GateSnapshot`]).
    pub fn snapshot(&self) -> GateSnapshot {
        GateSnapshot {
            channels: self
                .channels
                .iter()
                .filter_map(|s| {
                    Some(ChannelSnapshot {
                        channel: s.channel,
                        baseline: s.baseline?,
                        frontier: s.frontier,
                        lookahead: s.lookahead.iter().copied().collect(),
                        delivered: {
                            let mut d: Vec<(SenderId, u64)> = s
                                .senders
                                .iter()
                                .filter_map(|(id, st)| Some((*id, st.delivered?)))
                                .collect();
                            d.sort();
                            d
                        },
                    })
                })
                .collect(),
        }
    }

    /// Switches on deliberately wrong behaviour (negative controls only).
    #[cfg(feature = "negative-controls")]
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    fn index(&self, channel: &Channel) -> Option<Idx> {
        self.channels
            .binary_search_by(|s| s.channel.cmp(channel))
            .ok()
    }

    fn index_or_err(&self, channel: Channel) -> Result<Idx, GateError> {
        self.index(&channel)
            .ok_or(GateError::NotConsumed { channel })
    }

    /// The channels this gate consumes, sorted.
    pub fn consumed(&self) -> impl ExactSizeIterator<Item = Channel> + '_ {
        self.channels.iter().map(|s| s.channel)
    }

    /// `true` when `channel` is one of this task's consumed channels.
    pub fn consumes(&self, channel: &Channel) -> bool {
        self.index(channel).is_some()
    }

    /// Counters since the gate was built.
    pub fn metrics(&self) -> GateMetrics {
        self.metrics
    }

    /// The baseline `B` of `channel`, `None` when not seeded (or not consumed).
    pub fn baseline(&self, channel: &Channel) -> Option<i64> {
        self.index(channel).and_then(|i| self.channels[i].baseline)
    }

    /// The frontier `F` of `channel`: every offset `<= F` is delivered or absent.
    /// `None` when not seeded (or not consumed).
    pub fn frontier(&self, channel: &Channel) -> Option<i64> {
        let s = &self.channels[self.index(channel)?];
        s.baseline.map(|_| s.frontier)
    }

    /// The first offset of `channel` neither delivered nor proven absent: where a consumer
    /// resumes after a crash, and the offset to commit. `None` when not seeded.
    pub fn first_undelivered(&self, channel: &Channel) -> Option<i64> {
        self.frontier(channel).map(|f| f + 1)
    }

    /// Offsets of `channel` delivered above its frontier (look-ahead deliveries).
    pub fn lookahead(&self, channel: &Channel) -> Vec<i64> {
        self.index(channel)
            .map(|i| self.channels[i].lookahead.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Fetched, undelivered records of `channel` (spilled ones included).
    pub fn queued(&self, channel: &Channel) -> usize {
        self.index(channel)
            .map_or(0, |i| self.channels[i].undelivered)
    }

    /// Fetched, undelivered records of `channel` that hold their payload: what backpressure
    /// bounds (spilled records are not counted).
    pub fn held(&self, channel: &Channel) -> usize {
        self.index(channel).map_or(0, |i| {
            let s = &self.channels[i];
            s.undelivered - s.spilled
        })
    }

    /// Drops the payloads and stamps of `channel`'s untracked undelivered records, leaving
    /// stubs to re-fetch later (see the module docs); returns how many were spilled. For a
    /// channel [`Gate::needs_reading`] names whose queue is full.
    pub fn spill(&mut self, channel: &Channel) -> usize {
        let Some(idx) = self.index(channel) else {
            return 0;
        };
        let s = &mut self.channels[idx];
        let mut n = 0;
        for slot in s.queue.iter_mut() {
            if slot.payload.is_some() && !slot.tracked {
                slot.payload = None;
                slot.stamp = None;
                slot.cursor = 0;
                slot.spilled = true;
                n += 1;
            }
        }
        s.spilled += n;
        self.metrics.spilled += n as u64;
        n
    }

    /// Channels with a spilled record that is needed now — the head of its queue, or the
    /// target of a blocked record's claim or of its sender's order — and the lowest such
    /// offset: seek there and re-fetch between [`Gate::begin_refetch`] and the offset where
    /// reading stopped. While re-fetching, a channel still listed at or above the position
    /// needs more: make room with [`Gate::spill`] rather than end the re-fetch.
    pub fn refetch_wanted(&self) -> Vec<(Channel, i64)> {
        let mut want: BTreeMap<Idx, i64> = BTreeMap::new();
        let mut note = |idx: Idx, offset: i64| {
            let e = want.entry(idx).or_insert(offset);
            *e = (*e).min(offset);
        };
        for (idx, s) in self.channels.iter().enumerate() {
            if s.spilled > 0
                && let Some(front) = s.queue.front()
                && front.spilled
            {
                note(idx, front.offset);
            }
        }
        for &(idx, offset) in &self.blocked {
            let Some(pos) = self.slot_pos(idx, offset) else {
                continue;
            };
            let q = &self.channels[idx].queue[pos];
            if let Some(Awaiting::InFlight {
                sender, channel, ..
            }) = q.blocked
                && let Some(t) = self.index(&channel)
                && self.channels[t].spilled > 0
                && let Some((_, &target)) = self.channels[t]
                    .senders
                    .get(&sender)
                    .and_then(|st| st.pending.iter().next())
                && let Some(tp) = self.slot_pos(t, target)
                && self.channels[t].queue[tp].spilled
            {
                note(t, target);
            }
        }
        want.into_iter()
            .map(|(idx, o)| (self.channels[idx].channel, o))
            .collect()
    }

    /// Starts re-fetching `channel` from `from` (an offset [`Gate::refetch_wanted`] named):
    /// until an offered record or a [`Gate::position`] reaches the returned offset — where
    /// reading had stopped, the caller's position to return to — offered records refill their
    /// stubs and all others are ignored; positions below it are ignored.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`], or [`GateError::NothingSpilled`] when no spilled record
    /// lies at or above `from`.
    pub fn begin_refetch(&mut self, channel: Channel, from: i64) -> Result<i64, GateError> {
        let idx = self.index_or_err(channel)?;
        let s = &mut self.channels[idx];
        if !s.queue.iter().any(|q| q.spilled && q.offset >= from) {
            return Err(GateError::NothingSpilled { channel, from });
        }
        let resume = s
            .position
            .unwrap_or(0)
            .max(s.queue.back().map_or(0, |q| q.offset + 1));
        s.refetch = Some(Refetch { from, resume });
        Ok(resume)
    }

    /// Ends a re-fetch early (the caller seeks back to the offset [`Gate::begin_refetch`]
    /// returned); stubs not refilled yet stay spilled.
    pub fn end_refetch(&mut self, channel: &Channel) {
        if let Some(idx) = self.index(channel) {
            self.channels[idx].refetch = None;
        }
    }

    /// The re-fetch in progress on `channel`, if any.
    pub fn refetching(&self, channel: &Channel) -> Option<Refetch> {
        self.index(channel).and_then(|i| self.channels[i].refetch)
    }

    /// Fetched, undelivered records in all queues.
    pub fn queued_total(&self) -> usize {
        self.channels.iter().map(|s| s.undelivered).sum()
    }

    /// Number of tracked records (heads and pulled records) that are blocked.
    pub fn blocked_count(&self) -> usize {
        self.blocked.len()
    }

    /// Tracked records (heads and pulled records) that are blocked, with what they wait for.
    pub fn blocked_heads(&self) -> Vec<BlockedHead> {
        self.blocked
            .iter()
            .filter_map(|&(idx, offset)| {
                let slot = &self.channels[idx].queue[self.slot_pos(idx, offset)?];
                Some(BlockedHead {
                    head: self.channels[idx].channel.at(offset),
                    awaits: slot.blocked?,
                })
            })
            .collect()
    }

    /// `true` when a blocked record's in-flight claim still needs more of `channel` to be read:
    /// its target is not fetched yet and the position has not reached the evidence. Such a
    /// channel must not be paused for backpressure — a strict pause deadlocks (DESIGN.md §4).
    pub fn needs_reading(&self, channel: &Channel) -> bool {
        let Some(t) = self.index(channel) else {
            return false;
        };
        self.blocked.iter().any(|&(idx, offset)| {
            let Some(pos) = self.slot_pos(idx, offset) else {
                return false;
            };
            let q = &self.channels[idx].queue[pos];
            match q.blocked {
                Some(Awaiting::InFlight {
                    sender,
                    channel: c,
                    seq,
                }) if c == *channel => {
                    matches!(settle(&self.channels[t], sender, seq, q.epoch), Settled::No)
                }
                _ => false,
            }
        })
    }

    /// Channels for which a high watermark read after the next poll is needed: a blocked record
    /// arrived after the last reading. Read them with one batched
    /// `ListOffsets(LATEST, READ_UNCOMMITTED)` and hand them to [`Gate::high_watermark`].
    pub fn evidence_wanted(&self) -> Vec<Channel> {
        let mut out = BTreeSet::new();
        for &(idx, offset) in &self.blocked {
            {
                let Some(pos) = self.slot_pos(idx, offset) else {
                    continue;
                };
                let q = &self.channels[idx].queue[pos];
                let Some(awaits) = q.blocked else { continue };
                let channel = match awaits {
                    Awaiting::Frontier(c) => c.channel,
                    Awaiting::InFlight { channel, .. } | Awaiting::Evidence(channel) => channel,
                    Awaiting::Seeding(_) | Awaiting::Resolution => continue,
                };
                let reading = match self.index(&channel) {
                    Some(i) => self.channels[i].high_watermark,
                    None => self.foreign_hw.get(&channel).copied(),
                };
                if reading.is_none_or(|(_, epoch)| epoch < q.epoch) {
                    out.insert(channel);
                }
            }
        }
        out.into_iter().collect()
    }

    /// Seeds `channel` at the consumer's `position` (the next offset it will fetch) on the
    /// first assignment of the channel to this task: `B = position`, `F = position - 1`.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`], [`GateError::AlreadySeeded`], or
    /// [`GateError::NegativePosition`].
    pub fn seed(&mut self, channel: Channel, position: i64) -> Result<(), GateError> {
        let idx = self.index_or_err(channel)?;
        if position < 0 {
            return Err(GateError::NegativePosition { channel, position });
        }
        let s = &mut self.channels[idx];
        if let Some(baseline) = s.baseline {
            return Err(GateError::AlreadySeeded { channel, baseline });
        }
        s.baseline = Some(position);
        s.frontier = position - 1;
        s.position = Some(position);
        self.event(idx, true);
        Ok(())
    }

    /// Records the consumer's application position on `channel` (the next offset it will
    /// return), read after a poll whose records were all offered. When no fetched record of the
    /// channel is undelivered, the frontier advances to `position - 1`.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`], [`GateError::NotSeeded`], or
    /// [`GateError::PositionBehind`] when the position is below a record already offered.
    pub fn position(&mut self, channel: Channel, position: i64) -> Result<(), GateError> {
        let idx = self.index_or_err(channel)?;
        let s = &mut self.channels[idx];
        if s.baseline.is_none() {
            return Err(GateError::NotSeeded { channel });
        }
        if let Some(r) = s.refetch {
            if position < r.resume {
                // Re-reading below where reading stopped: no new evidence.
                return Ok(());
            }
            // The re-read caught up.
            s.refetch = None;
        }
        let last = s.queue.back().map_or(s.frontier, |q| q.offset);
        if position <= last {
            return Err(GateError::PositionBehind {
                channel,
                position,
                last,
            });
        }
        s.position = Some(s.position.map_or(position, |p| p.max(position)));
        let moved = if s.undelivered == 0 && position - 1 > s.frontier {
            s.frontier = position - 1;
            s.queue.clear();
            s.lookahead.clear();
            true
        } else {
            false
        };
        self.event(idx, moved);
        Ok(())
    }

    /// Records a high watermark of `channel` read after poll `epoch` (any channel: consumed, or
    /// one that an in-flight claim names).
    pub fn high_watermark(&mut self, channel: Channel, high_watermark: i64, epoch: u64) {
        let better = |old: Option<(i64, u64)>| {
            old.map_or((high_watermark, epoch), |(h, e)| {
                (h.max(high_watermark), e.max(epoch))
            })
        };
        match self.index(&channel) {
            Some(idx) => {
                let s = &mut self.channels[idx];
                s.high_watermark = Some(better(s.high_watermark));
                self.event(idx, false);
            }
            None => {
                let v = better(self.foreign_hw.get(&channel).copied());
                self.foreign_hw.insert(channel, v);
                if let Some(w) = self.foreign_watchers.remove(&channel) {
                    for (i, o) in w {
                        self.check(i, o);
                    }
                }
            }
        }
    }

    /// Hands a fetched record of `channel` to the gate.
    ///
    /// # Errors
    /// The record comes back inside the error, nothing is lost: [`GateError::NotConsumed`],
    /// [`GateError::NotSeeded`], [`GateError::OffsetNotAscending`]. An impossible stamp is not
    /// an error here: the record is held and reported by [`Gate::take_impossible`].
    pub fn offer(
        &mut self,
        channel: Channel,
        arrival: Arrival<R>,
    ) -> Result<(), Box<Refused<Arrival<R>>>> {
        let Some(idx) = self.index(&channel) else {
            return Err(Box::new(GateError::NotConsumed { channel }.with(arrival)));
        };
        let s = &mut self.channels[idx];
        if s.baseline.is_none() {
            return Err(Box::new(GateError::NotSeeded { channel }.with(arrival)));
        }
        if let Some(Refetch { resume, .. }) = s.refetch {
            if arrival.offset < resume {
                return self.refill(idx, arrival);
            }
            s.refetch = None;
        }
        let last = s.queue.back().map_or(s.frontier, |q| q.offset);
        if arrival.offset <= last {
            return Err(Box::new(
                GateError::OffsetNotAscending {
                    channel,
                    offset: arrival.offset,
                    previous: last,
                }
                .with(arrival),
            ));
        }
        let offset = arrival.offset;
        if s.position.is_some_and(|p| p <= offset) || s.position.is_none() {
            s.position = Some(offset + 1);
        }
        if s.lookahead.contains(&offset) {
            // Delivered ahead before a restart: re-fetched, not delivered again.
            s.queue.push_back(Slot::tombstone(arrival));
            if s.queue.len() == 1 {
                self.advance_front(idx);
            }
            return Ok(());
        }
        if let Some(tag) = arrival.stamp.as_ref().and_then(|st| st.sender) {
            s.senders
                .entry(tag.sender)
                .or_default()
                .pending
                .insert(tag.seq, offset);
        }
        s.queue.push_back(Slot::new(arrival));
        s.undelivered += 1;
        if self.channels[idx].queue.len() == 1 {
            self.advance_front(idx);
        } else {
            self.event(idx, false);
        }
        Ok(())
    }

    /// A record re-fetched below where reading stopped: refills its stub, or is ignored when
    /// it is delivered, below the frontier, or held.
    fn refill(&mut self, idx: Idx, arrival: Arrival<R>) -> Result<(), Box<Refused<Arrival<R>>>> {
        let s = &mut self.channels[idx];
        let channel = s.channel;
        if arrival.offset <= s.frontier || s.lookahead.contains(&arrival.offset) {
            return Ok(());
        }
        let sender = arrival.stamp.as_ref().and_then(|st| st.sender);
        let tag = |t: Option<SenderTag>| t.map_or_else(|| "none".to_owned(), |t| t.to_string());
        let Some(pos) = self.slot_pos(idx, arrival.offset) else {
            return Err(Box::new(
                GateError::RefetchMismatch {
                    channel,
                    offset: arrival.offset,
                    before: "none".to_owned(),
                    now: tag(sender),
                }
                .with(arrival),
            ));
        };
        let s = &mut self.channels[idx];
        let slot = &mut s.queue[pos];
        if !slot.spilled {
            return Ok(());
        }
        if slot.sender != sender {
            let before = tag(slot.sender);
            return Err(Box::new(
                GateError::RefetchMismatch {
                    channel,
                    offset: arrival.offset,
                    before,
                    now: tag(sender),
                }
                .with(arrival),
            ));
        }
        slot.spilled = false;
        slot.stamp = arrival.stamp;
        slot.payload = Some(arrival.payload);
        s.spilled -= 1;
        self.metrics.refetched += 1;
        if pos == 0 {
            self.advance_front(idx);
        } else {
            self.event(idx, false);
        }
        Ok(())
    }

    /// Impossible stamps found since the last call; each record is held until
    /// [`Gate::resolve`] decides.
    pub fn take_impossible(&mut self) -> Vec<ImpossibleStamp> {
        std::mem::take(&mut self.impossible)
    }

    /// Applies a policy to a record held for an impossible stamp.
    ///
    /// # Errors
    /// [`GateError::NotHeld`] when no such record waits for a resolution.
    pub fn resolve(
        &mut self,
        record: Coordinate,
        resolution: Resolution,
    ) -> Result<Option<Discarded<R>>, GateError> {
        let not_held = GateError::NotHeld { record };
        let idx = self.index(&record.channel).ok_or(not_held.clone())?;
        let pos = self.slot_pos(idx, record.offset).ok_or(not_held.clone())?;
        let slot = &mut self.channels[idx].queue[pos];
        if !slot.impossible {
            return Err(not_held);
        }
        slot.impossible = false;
        slot.blocked = None;
        self.blocked.remove(&(idx, record.offset));
        match resolution {
            Resolution::Deliver => {
                slot.allow_impossible = true;
                // Drop the impossible claims: on its own channel at or beyond itself, and at or
                // beyond a high watermark read after it arrived.
                let epoch = slot.epoch;
                let stamp = slot.stamp.take();
                let stamp = stamp.map(|mut st| {
                    st.clock.retain(|c| {
                        if c.channel == record.channel {
                            return c.offset < record.offset;
                        }
                        match self.index(&c.channel) {
                            Some(j) => !self.channels[j]
                                .high_watermark
                                .is_some_and(|(hw, e)| e >= epoch && c.offset >= hw),
                            None => true,
                        }
                    });
                    st
                });
                let slot = &mut self.channels[idx].queue[pos];
                slot.stamp = stamp;
                slot.cursor = 0;
                self.check(idx, record.offset);
                Ok(None)
            }
            Resolution::Discard => {
                self.metrics.discarded += 1;
                let (stamp, payload) = self.remove(idx, pos);
                Ok(Some(Discarded {
                    coordinate: record,
                    stamp,
                    payload,
                }))
            }
        }
    }

    /// Releases the next deliverable record, if any: smallest timestamp, then channel, then
    /// offset.
    pub fn next_delivery(&mut self) -> Option<Delivery<R>> {
        let Reverse((_, idx, offset)) = self.ready.pop()?;
        let pos = self
            .slot_pos(idx, offset)
            .expect("a ready record is queued");
        let lookahead = pos != 0;
        let waited = self.channels[idx].queue[pos].waited;
        let replacements = self.replacements(idx, pos);
        let timestamp = self.channels[idx].queue[pos].timestamp;
        let (stamp, payload) = self.remove(idx, pos);
        self.metrics.delivered += 1;
        self.metrics.held += u64::from(waited);
        self.metrics.lookahead += u64::from(lookahead);
        Some(Delivery {
            coordinate: self.channels[idx].channel.at(offset),
            timestamp,
            stamp,
            payload,
            waited,
            lookahead,
            replacements,
        })
    }

    /// Takes the record at `pos` of queue `idx` out (delivered or discarded) and updates the
    /// frontier, sender state and look-ahead set.
    fn remove(&mut self, idx: Idx, pos: usize) -> (Option<Stamp>, R) {
        let bridge_over = self.faults.bridge_over_lookahead;
        let s = &mut self.channels[idx];
        let slot = &mut s.queue[pos];
        let offset = slot.offset;
        let payload = slot.payload.take().expect("an undelivered record");
        let stamp = slot.stamp.take();
        slot.tracked = false;
        slot.ready = false;
        if slot.blocked.take().is_some() {
            self.blocked.remove(&(idx, offset));
        }
        let s = &mut self.channels[idx];
        s.undelivered -= 1;
        if let Some(tag) = stamp.as_ref().and_then(|st| st.sender) {
            let st = s.senders.entry(tag.sender).or_default();
            st.pending.remove(&tag.seq);
            st.delivered = Some(st.delivered.map_or(tag.seq, |d| d.max(tag.seq)));
        }
        if pos == 0 {
            self.advance_front(idx);
        } else {
            let s = &mut self.channels[idx];
            s.lookahead.insert(offset);
            if bridge_over && offset > s.frontier {
                // Negative control: pretend everything below the look-ahead delivery is done.
                s.frontier = offset;
                while s.queue.front().is_some_and(|q| q.offset <= offset) {
                    if let Some(q) = s.queue.pop_front()
                        && (q.payload.is_some() || q.spilled)
                    {
                        s.undelivered -= 1;
                        s.spilled -= usize::from(q.spilled);
                    }
                }
                s.lookahead.retain(|o| *o > offset);
                self.event(idx, true);
            } else {
                self.event(idx, false);
            }
        }
        (stamp, payload)
    }

    /// Pops delivered records off the front of queue `idx`, moving the frontier over them and
    /// over the gap below the new head, then tracks the new head.
    fn advance_front(&mut self, idx: Idx) {
        let s = &mut self.channels[idx];
        let before = s.frontier;
        while let Some(front) = s.queue.front() {
            if front.payload.is_some() || front.spilled {
                break;
            }
            s.frontier = s.frontier.max(front.offset);
            s.queue.pop_front();
        }
        if let Some(head) = s.queue.front() {
            // Bridging: nothing was returned between the frontier and the head.
            s.frontier = s.frontier.max(head.offset - 1);
        }
        let frontier = s.frontier;
        if !s.lookahead.is_empty() {
            s.lookahead.retain(|o| *o > frontier);
        }
        let moved = s.frontier > before;
        let head = s.queue.front().map(|h| h.offset);
        if let Some(h) = head {
            self.track(idx, h);
        }
        self.event(idx, moved);
    }

    /// Something happened on channel `idx`: re-check the records watching it.
    fn event(&mut self, idx: Idx, frontier_moved: bool) {
        if self.faults.wakeups_only_on_frontier && !frontier_moved {
            return;
        }
        let watchers = std::mem::take(&mut self.channels[idx].watchers);
        for (i, o) in watchers {
            self.check(i, o);
        }
    }

    /// Starts checking the record at (`idx`, `offset`): a head or a pulled record.
    fn track(&mut self, idx: Idx, offset: i64) {
        let Some(pos) = self.slot_pos(idx, offset) else {
            return;
        };
        let slot = &mut self.channels[idx].queue[pos];
        if slot.tracked || slot.payload.is_none() {
            return;
        }
        slot.tracked = true;
        self.check_at(idx, pos);
    }

    /// The position of the record at `offset` in queue `idx`. The head is the common case.
    fn slot_pos(&self, idx: Idx, offset: i64) -> Option<usize> {
        let queue = &self.channels[idx].queue;
        if queue.front().is_some_and(|h| h.offset == offset) {
            return Some(0);
        }
        self.channels[idx]
            .queue
            .binary_search_by_key(&offset, |s| s.offset)
            .ok()
    }

    fn report_impossible(&mut self, idx: Idx, offset: i64, info: ImpossibleStamp) {
        if let Some(pos) = self.slot_pos(idx, offset) {
            let slot = &mut self.channels[idx].queue[pos];
            if slot.impossible || slot.allow_impossible {
                return;
            }
            slot.impossible = true;
            slot.waited = true;
            slot.blocked = Some(Awaiting::Resolution);
            self.blocked.insert((idx, offset));
            self.metrics.impossible += 1;
            self.impossible.push(info);
        }
    }

    /// Checks a tracked record and files it as ready, blocked, impossible, or pulls its target.
    fn check(&mut self, idx: Idx, offset: i64) {
        if let Some(pos) = self.slot_pos(idx, offset) {
            self.check_at(idx, pos);
        }
    }

    /// [`Gate::check`] of the record at `pos` of queue `idx`.
    fn check_at(&mut self, idx: Idx, pos: usize) {
        let offset = self.channels[idx].queue[pos].offset;
        {
            let slot = &self.channels[idx].queue[pos];
            if slot.payload.is_none() || slot.ready || !slot.tracked || slot.impossible {
                return;
            }
        }
        match self.verdict(idx, pos) {
            Verdict::Ready => {
                let slot = &mut self.channels[idx].queue[pos];
                slot.ready = true;
                let was_blocked = slot.blocked.take().is_some();
                self.ready.push(Reverse((slot.timestamp, idx, offset)));
                if was_blocked {
                    self.blocked.remove(&(idx, offset));
                }
            }
            Verdict::Blocked { awaits, watch } => {
                self.block(idx, pos, awaits, watch);
            }
            Verdict::Pull {
                channel,
                offset: target,
                awaits,
            } => {
                self.block(idx, pos, awaits, Watch::Consumed(channel));
                self.track(channel, target);
            }
            Verdict::Impossible(info) => {
                self.report_impossible(idx, offset, info);
            }
        }
    }

    fn block(&mut self, idx: Idx, pos: usize, awaits: Awaiting, watch: Watch) {
        let slot = &mut self.channels[idx].queue[pos];
        slot.waited = true;
        let offset = slot.offset;
        slot.blocked = Some(awaits);
        self.blocked.insert((idx, offset));
        match watch {
            Watch::Consumed(j) => {
                let w = &mut self.channels[j].watchers;
                if !w.contains(&(idx, offset)) {
                    w.push((idx, offset));
                }
            }
            Watch::Foreign(c) => {
                let w = self.foreign_watchers.entry(c).or_default();
                if !w.contains(&(idx, offset)) {
                    w.push((idx, offset));
                }
            }
        }
    }

    /// Decides about the tracked record at `pos` of queue `idx`.
    fn verdict(&mut self, idx: Idx, pos: usize) -> Verdict {
        if self.faults.gate_off {
            return if pos == 0 {
                Verdict::Ready
            } else {
                Verdict::Blocked {
                    awaits: Awaiting::Resolution,
                    watch: Watch::Consumed(idx),
                }
            };
        }
        let channels = &self.channels;
        let s = &channels[idx];
        let slot = &s.queue[pos];
        let Some(stamp) = slot.stamp.as_ref() else {
            // Unstamped: claims nothing; only a head is tracked.
            return Verdict::Ready;
        };
        let record = s.channel.at(slot.offset);
        // A pulled record keeps its sender's order on its channel: an earlier record of the
        // same sender goes first (it is pulled in turn).
        if pos != 0
            && let Some(tag) = stamp.sender
            && let Some((&first_seq, &first_offset)) = s
                .senders
                .get(&tag.sender)
                .and_then(|st| st.pending.iter().next())
            && first_seq < tag.seq
        {
            return Verdict::Pull {
                channel: idx,
                offset: first_offset,
                awaits: Awaiting::InFlight {
                    sender: tag.sender,
                    channel: s.channel,
                    seq: first_seq,
                },
            };
        }
        // 1. Coordinate claims, from the cursor on.
        let entries = stamp.clock.entries();
        let mut cursor = slot.cursor;
        let mut j = if cursor < entries.len() {
            channels.partition_point(|c| c.channel < entries[cursor].0)
        } else {
            channels.len()
        };
        let mut ignored = 0u64;
        let mut out_of_scope = 0u64;
        let mut result = None;
        // Entries below the first consumed channel are all on the ignore branch: skip them in
        // one step (both lists are sorted).
        if j == 0
            && cursor < entries.len()
            && !channels.is_empty()
            && entries[cursor].0 < channels[0].channel
        {
            let first = channels[0].channel;
            let skip = entries[cursor..].partition_point(|(c, _)| *c < first);
            ignored += skip as u64;
            cursor += skip;
        }
        while cursor < entries.len() {
            let (cc, co) = entries[cursor];
            while j < channels.len() && channels[j].channel < cc {
                j += 1;
            }
            if j == channels.len() {
                // Past the last consumed channel: the rest is on the ignore branch.
                ignored += (entries.len() - cursor) as u64;
                cursor = entries.len();
                break;
            }
            if j < channels.len() && channels[j].channel == cc {
                let t = &channels[j];
                if j == idx && co >= slot.offset && !slot.allow_impossible {
                    // A claim on its own channel at or beyond itself.
                    result = Some(Verdict::Impossible(ImpossibleStamp {
                        record,
                        sender: stamp.sender,
                        claim: cc.at(co),
                        reason: ImpossibleReason::SelfClaim,
                    }));
                    break;
                }
                match t.baseline {
                    None => {
                        result = Some(Verdict::Blocked {
                            awaits: Awaiting::Seeding(cc),
                            watch: Watch::Consumed(j),
                        });
                        break;
                    }
                    Some(b) if co < b => out_of_scope += 1,
                    Some(_) if t.frontier >= co => {}
                    Some(_) => {
                        if !slot.allow_impossible
                            && let Some((hw, epoch)) = t.high_watermark
                            && epoch >= slot.epoch
                            && co >= hw
                        {
                            result = Some(Verdict::Impossible(ImpossibleStamp {
                                record,
                                sender: stamp.sender,
                                claim: cc.at(co),
                                reason: ImpossibleReason::BeyondHighWatermark {
                                    high_watermark: hw,
                                },
                            }));
                        } else {
                            result = Some(Verdict::Blocked {
                                awaits: Awaiting::Frontier(cc.at(co)),
                                watch: Watch::Consumed(j),
                            });
                        }
                        break;
                    }
                }
            } else {
                ignored += 1;
            }
            cursor += 1;
        }
        let strict_fifo = self.faults.strict_fifo;
        let verdict = match result {
            Some(v) => v,
            None => {
                // 2. and 3. In-flight claims.
                let mut v = Verdict::Ready;
                if let Some(tag) = stamp.sender {
                    for claim in &stamp.in_flight {
                        match self.index(&claim.channel) {
                            None => {
                                let valid = self
                                    .foreign_hw
                                    .get(&claim.channel)
                                    .is_some_and(|(_, e)| *e >= slot.epoch);
                                if !valid {
                                    v = Verdict::Blocked {
                                        awaits: Awaiting::Evidence(claim.channel),
                                        watch: Watch::Foreign(claim.channel),
                                    };
                                    break;
                                }
                            }
                            Some(t_idx) => {
                                let t = &channels[t_idx];
                                let awaits = Awaiting::InFlight {
                                    sender: tag.sender,
                                    channel: claim.channel,
                                    seq: claim.seq,
                                };
                                if t.baseline.is_none() {
                                    v = Verdict::Blocked {
                                        awaits: Awaiting::Seeding(claim.channel),
                                        watch: Watch::Consumed(t_idx),
                                    };
                                    break;
                                }
                                match settle(t, tag.sender, claim.seq, slot.epoch) {
                                    Settled::Yes(_) => {}
                                    Settled::Target(o) => {
                                        v = if strict_fifo
                                            || t.queue.front().is_some_and(|h| h.offset == o)
                                        {
                                            Verdict::Blocked {
                                                awaits,
                                                watch: Watch::Consumed(t_idx),
                                            }
                                        } else {
                                            Verdict::Pull {
                                                channel: t_idx,
                                                offset: o,
                                                awaits,
                                            }
                                        };
                                        break;
                                    }
                                    Settled::No => {
                                        v = Verdict::Blocked {
                                            awaits,
                                            watch: Watch::Consumed(t_idx),
                                        };
                                        break;
                                    }
                                }
                            }
                        }
                    }
                }
                v
            }
        };
        self.metrics.ignored_entries += ignored;
        self.metrics.out_of_scope_entries += out_of_scope;
        self.channels[idx].queue[pos].cursor = cursor;
        verdict
    }

    /// The coordinates replacing the in-flight claims of the record at `pos` of queue `idx`
    /// that this node does not resolve by its own deliveries (DESIGN.md §3).
    fn replacements(&self, idx: Idx, pos: usize) -> Vec<Coordinate> {
        let slot = &self.channels[idx].queue[pos];
        let Some(stamp) = slot.stamp.as_ref() else {
            return Vec::new();
        };
        let Some(tag) = stamp.sender else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for claim in &stamp.in_flight {
            let end = match self.index(&claim.channel) {
                None => self.foreign_hw.get(&claim.channel).map(|(hw, _)| *hw),
                Some(t) => match settle(&self.channels[t], tag.sender, claim.seq, slot.epoch) {
                    Settled::Yes(end) => end,
                    // Not settled: only under negative controls (gate off); claim the latest
                    // evidence if any.
                    Settled::Target(_) | Settled::No => {
                        self.channels[t].high_watermark.map(|(hw, _)| hw)
                    }
                },
            };
            if let Some(end) = end
                && end > 0
            {
                out.push(claim.channel.at(end - 1));
            }
        }
        out
    }
}

/// How an in-flight claim `(sender, c', k)` stands on consumed channel `t`.
enum Settled {
    /// Settled; `Some(end)`: replace the claim by `(c', end - 1)`; `None`: resolved by this
    /// node's own delivery, no replacement.
    Yes(Option<i64>),
    /// A fetched, undelivered record of the sender at this offset must be delivered first.
    Target(i64),
    /// Not settled yet.
    No,
}

fn settle<R>(t: &ChannelState<R>, sender: SenderId, seq: u64, epoch: u64) -> Settled {
    let st = t.senders.get(&sender);
    if st.and_then(|s| s.delivered).is_some_and(|d| d >= seq) {
        return Settled::Yes(None);
    }
    if let Some((&first_seq, &first_offset)) = st.and_then(|s| s.pending.iter().next()) {
        if first_seq <= seq {
            return Settled::Target(first_offset);
        }
        // A later record of the sender was fetched: the target lies below it.
        return Settled::Yes(Some(first_offset));
    }
    match (t.position, t.high_watermark) {
        (Some(p), Some((hw, e))) if e >= epoch && p >= hw => Settled::Yes(Some(hw)),
        _ => Settled::No,
    }
}

impl<R> Slot<R> {
    fn new(a: Arrival<R>) -> Self {
        Slot {
            offset: a.offset,
            timestamp: a.timestamp,
            epoch: a.epoch,
            sender: a.stamp.as_ref().and_then(|st| st.sender),
            stamp: a.stamp,
            payload: Some(a.payload),
            spilled: false,
            cursor: 0,
            waited: false,
            tracked: false,
            ready: false,
            impossible: false,
            allow_impossible: false,
            blocked: None,
        }
    }

    fn tombstone(a: Arrival<R>) -> Self {
        let mut s = Slot::new(a);
        s.payload = None;
        s.stamp = None;
        s
    }
}

#[cfg(test)]
mod tests {
    use parsley_clock::{Clock, InFlight, SenderId, TopicId};

    use super::*;

    fn ch(t: u8, p: i32) -> Channel {
        Channel::new(TopicId::from_bytes([t; 16]), p)
    }

    fn sender(n: u8) -> SenderId {
        SenderId::from_bytes([n; 16])
    }

    /// A record of `sender`/`seq` claiming `claims` by coordinate and `in_flight` in flight.
    fn rec(
        offset: i64,
        from: Option<(u8, u64)>,
        claims: &[Coordinate],
        in_flight: &[(Channel, u64)],
    ) -> Arrival<i64> {
        Arrival {
            offset,
            timestamp: 0,
            epoch: 1,
            stamp: Some(Stamp {
                sender: from.map(|(s, seq)| SenderTag {
                    sender: sender(s),
                    seq,
                }),
                clock: claims.iter().copied().collect::<Clock>(),
                in_flight: in_flight
                    .iter()
                    .map(|&(channel, seq)| InFlight { channel, seq })
                    .collect(),
                acked_through: None,
            }),
            payload: offset,
        }
    }

    fn plain(offset: i64) -> Arrival<i64> {
        Arrival {
            offset,
            timestamp: 0,
            epoch: 1,
            stamp: None,
            payload: offset,
        }
    }

    fn drain(gate: &mut Gate<i64>) -> Vec<Coordinate> {
        std::iter::from_fn(|| gate.next_delivery().map(|d| d.coordinate)).collect()
    }

    fn seeded(channels: &[Channel]) -> Gate<i64> {
        let mut g = Gate::new(channels.iter().copied());
        for c in channels {
            g.seed(*c, 0).unwrap();
        }
        g
    }

    #[test]
    fn a_record_waits_for_its_claimed_cause_on_another_consumed_channel() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        g.offer(b, rec(0, None, &[a.at(2)], &[])).unwrap();
        assert!(g.next_delivery().is_none(), "a@2 not delivered yet");
        assert_eq!(
            g.blocked_heads(),
            vec![BlockedHead {
                head: b.at(0),
                awaits: Awaiting::Frontier(a.at(2)),
            }]
        );
        g.offer(a, plain(0)).unwrap();
        g.offer(a, plain(1)).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(0), a.at(1)]);
        g.offer(a, plain(2)).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(2), b.at(0)]);
        assert_eq!(g.metrics().held, 1);
    }

    #[test]
    fn ignore_branch_baseline_and_unseeded_channels() {
        let (a, b, other) = (ch(1, 0), ch(2, 0), ch(3, 0));
        let mut g = Gate::new([a, b]);
        g.seed(b, 0).unwrap();
        g.offer(b, rec(0, None, &[other.at(99)], &[])).unwrap();
        assert_eq!(drain(&mut g), vec![b.at(0)]);
        assert_eq!(g.metrics().ignored_entries, 1);
        // A consumed channel that is not seeded blocks, never counts as ignored.
        g.offer(b, rec(1, None, &[a.at(3)], &[])).unwrap();
        assert!(g.next_delivery().is_none());
        assert_eq!(g.blocked_heads()[0].awaits, Awaiting::Seeding(a));
        // Seeded above the claim: out of scope, delivered.
        g.seed(a, 10).unwrap();
        assert_eq!(drain(&mut g), vec![b.at(1)]);
        assert_eq!(g.metrics().out_of_scope_entries, 1);
        assert_eq!(g.frontier(&a), Some(9));
    }

    #[test]
    fn a_channel_a_claim_needs_spills_untracked_records_and_refetches_them() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        // b@0 of sender 1 claims its own earlier send to `a` (seq 4) in flight.
        g.offer(b, rec(0, Some((1, 5)), &[], &[(a, 4)])).unwrap();
        assert!(g.needs_reading(&a));
        // a holds a head waiting for b@0 and two records of sender 3.
        g.offer(a, rec(0, Some((2, 0)), &[b.at(0)], &[])).unwrap();
        g.offer(a, rec(1, Some((3, 0)), &[], &[])).unwrap();
        g.offer(a, rec(2, Some((3, 1)), &[], &[])).unwrap();
        assert_eq!(g.held(&a), 3);
        // Spilling keeps the tracked head and drops the rest.
        assert_eq!(g.spill(&a), 2);
        assert_eq!((g.held(&a), g.queued(&a)), (1, 3));
        assert!(g.refetch_wanted().is_empty(), "no stub is needed yet");
        // The claimed send arrives: pulled ahead, then its claimer, then the head.
        g.offer(a, rec(3, Some((1, 4)), &[], &[])).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(3), b.at(0), a.at(0)]);
        assert_eq!(
            g.frontier(&a),
            Some(0),
            "bridging stops below the stub at 1"
        );
        assert_eq!(g.refetch_wanted(), vec![(a, 1)]);
        g.position(a, 4).unwrap();
        assert_eq!(g.frontier(&a), Some(0), "stubs are undelivered records");

        assert!(matches!(
            g.begin_refetch(a, 3),
            Err(GateError::NothingSpilled { from: 3, .. })
        ));
        assert_eq!(g.begin_refetch(a, 1), Ok(4));
        g.position(a, 2).unwrap(); // re-reading: ignored
        g.offer(a, plain(0)).unwrap(); // below the frontier: ignored
        // Another sender at a spilled offset: the history changed, named, record returned.
        let err = g.offer(a, rec(1, Some((9, 0)), &[], &[])).unwrap_err();
        assert!(matches!(
            err.kind,
            GateError::RefetchMismatch { offset: 1, .. }
        ));
        assert_eq!(err.refused.payload, 1);
        g.offer(a, rec(1, Some((3, 0)), &[], &[])).unwrap();
        g.offer(a, rec(2, Some((3, 1)), &[], &[])).unwrap();
        g.offer(a, rec(3, Some((1, 4)), &[], &[])).unwrap(); // delivered ahead: ignored
        assert_eq!(drain(&mut g), vec![a.at(1), a.at(2)]);
        assert_eq!(g.frontier(&a), Some(3));
        assert_eq!((g.metrics().spilled, g.metrics().refetched), (2, 2));
        // Reading reaches where it had stopped: the re-fetch ends by itself.
        g.offer(a, plain(4)).unwrap();
        assert_eq!(g.refetching(&a), None);
        assert_eq!(drain(&mut g), vec![a.at(4)]);
    }

    #[test]
    fn bridging_covers_gaps_below_a_fetched_head() {
        // Records at 0 and 1, commit marker at 2, record at 3.
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        g.offer(b, rec(0, None, &[a.at(2)], &[])).unwrap();
        g.offer(a, plain(0)).unwrap();
        g.offer(a, plain(1)).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(0), a.at(1)]);
        assert_eq!(g.frontier(&a), Some(1));
        g.offer(a, rec(3, None, &[b.at(0)], &[])).unwrap();
        assert_eq!(g.frontier(&a), Some(2));
        assert_eq!(drain(&mut g), vec![b.at(0), a.at(3)]);
    }

    #[test]
    fn position_advance_covers_a_trailing_commit_marker() {
        // C01: records 0..=2, marker at 3, end offset 4.
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        g.offer(b, rec(0, None, &[a.at(3)], &[])).unwrap();
        for o in 0..3 {
            g.offer(a, plain(o)).unwrap();
        }
        assert_eq!(drain(&mut g), vec![a.at(0), a.at(1), a.at(2)]);
        assert_eq!(
            g.frontier(&a),
            Some(2),
            "the marker is not proven absent yet"
        );
        g.position(a, 4).unwrap();
        assert_eq!(g.frontier(&a), Some(3));
        assert_eq!(g.first_undelivered(&a), Some(4));
        assert_eq!(drain(&mut g), vec![b.at(0)]);
        // A position behind what was offered is a caller bug, named.
        assert!(matches!(
            g.position(a, 2),
            Err(GateError::PositionBehind { .. })
        ));
    }

    #[test]
    fn a_position_does_not_advance_past_undelivered_records() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        g.offer(a, rec(0, None, &[b.at(0)], &[])).unwrap();
        g.position(a, 7).unwrap();
        assert_eq!(g.frontier(&a), Some(-1));
    }

    #[test]
    fn picks_smallest_timestamp_then_channel() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        let mut late = plain(0);
        late.timestamp = 50;
        let mut early = plain(0);
        early.timestamp = 10;
        g.offer(a, late).unwrap();
        g.offer(b, early).unwrap();
        assert_eq!(drain(&mut g), vec![b.at(0), a.at(0)]);
    }

    #[test]
    fn refused_records_come_back_inside_the_error() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g: Gate<i64> = Gate::new([a]);
        let err = g.offer(a, plain(0)).unwrap_err();
        assert!(matches!(err.kind, GateError::NotSeeded { .. }));
        g.seed(a, 5).unwrap();
        let err = g.offer(b, plain(0)).unwrap_err();
        assert!(matches!(err.kind, GateError::NotConsumed { .. }));
        let err = g.offer(a, plain(4)).unwrap_err();
        assert!(matches!(
            err.kind,
            GateError::OffsetNotAscending {
                offset: 4,
                previous: 4,
                ..
            }
        ));
        assert_eq!(err.refused.payload, 4, "the record is handed back");
    }

    #[test]
    fn a_self_claim_is_held_and_resolved_by_policy() {
        let a = ch(1, 0);
        let mut g = seeded(&[a]);
        g.offer(a, rec(0, Some((1, 0)), &[a.at(0)], &[])).unwrap();
        g.offer(a, plain(1)).unwrap();
        assert!(
            g.next_delivery().is_none(),
            "held, and everything behind it"
        );
        let found = g.take_impossible();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].record, a.at(0));
        assert_eq!(found[0].claim, a.at(0));
        assert_eq!(found[0].reason, ImpossibleReason::SelfClaim);
        assert_eq!(found[0].sender.unwrap().sender, sender(1));
        // Dead-letter it: it comes back, and the channel moves on.
        let discarded = g.resolve(a.at(0), Resolution::Discard).unwrap().unwrap();
        assert_eq!(discarded.payload, 0);
        assert_eq!(drain(&mut g), vec![a.at(1)]);
        assert_eq!(g.frontier(&a), Some(1));
        assert!(matches!(
            g.resolve(a.at(0), Resolution::Deliver),
            Err(GateError::NotHeld { .. })
        ));
        // Deliver-and-count: delivered despite the claim.
        g.offer(a, rec(2, Some((1, 1)), &[a.at(5)], &[])).unwrap();
        assert_eq!(g.take_impossible().len(), 1);
        assert!(g.resolve(a.at(2), Resolution::Deliver).unwrap().is_none());
        assert_eq!(drain(&mut g), vec![a.at(2)]);
        assert_eq!(g.metrics().impossible, 2);
        assert_eq!(g.metrics().discarded, 1);
    }

    #[test]
    fn a_claim_beyond_the_high_watermark_read_after_the_record_is_impossible() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        let mut m = rec(0, Some((1, 0)), &[a.at(10_000)], &[]);
        m.epoch = 3;
        g.offer(b, m).unwrap();
        assert!(g.next_delivery().is_none());
        assert_eq!(g.evidence_wanted(), vec![a]);
        // A reading from before the record's poll is not evidence about it.
        g.high_watermark(a, 50, 2);
        assert!(g.take_impossible().is_empty());
        assert_eq!(g.evidence_wanted(), vec![a]);
        g.high_watermark(a, 50, 3);
        let found = g.take_impossible();
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].reason,
            ImpossibleReason::BeyondHighWatermark { high_watermark: 50 }
        );
        assert_eq!(found[0].claim, a.at(10_000));
        assert!(g.evidence_wanted().is_empty());
    }

    #[test]
    fn an_in_flight_claim_waits_for_the_senders_record_and_pulls_it_ahead() {
        // Sender 1 sent x (seq 0) to `a` and then m (seq 1) to `b`, claiming x in flight.
        // On `a`, x landed behind an unrelated record of sender 2 that waits for b@5.
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        g.offer(a, rec(0, Some((2, 0)), &[b.at(5)], &[])).unwrap();
        g.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
        g.offer(b, rec(0, Some((1, 1)), &[], &[(a, 0)])).unwrap();
        let first = g.next_delivery().unwrap();
        assert_eq!(first.coordinate, a.at(1));
        assert!(first.lookahead, "x was pulled ahead of a@0");
        let second = g.next_delivery().unwrap();
        assert_eq!(second.coordinate, b.at(0));
        assert!(
            second.replacements.is_empty(),
            "resolved by its own delivery"
        );
        assert_eq!(g.frontier(&a), Some(-1), "a look-ahead leaves the frontier");
        assert_eq!(g.lookahead(&a), vec![1]);
        assert_eq!(g.metrics().lookahead, 1);
    }

    #[test]
    fn crossed_in_flight_sends_do_not_deadlock() {
        // DESIGN.md §4: X sends r to c' then r2 to c; Y sends z to c then h to c'; appends
        // land crossed: c = [r2, z], c' = [h, r]. Strict FIFO would wait in a cycle.
        let (c, c2) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[c, c2]);
        g.offer(c, rec(0, Some((1, 1)), &[], &[(c2, 0)])).unwrap(); // r2
        g.offer(c, rec(1, Some((2, 0)), &[], &[])).unwrap(); // z
        g.offer(c2, rec(0, Some((2, 1)), &[], &[(c, 0)])).unwrap(); // h
        g.offer(c2, rec(1, Some((1, 0)), &[], &[])).unwrap(); // r
        let order = drain(&mut g);
        assert_eq!(order.len(), 4, "nothing deadlocks: {order:?}");
        let at = |x: Coordinate| order.iter().position(|o| *o == x).unwrap();
        assert!(at(c2.at(1)) < at(c.at(0)), "r before r2");
        assert!(at(c.at(1)) < at(c2.at(0)), "z before h");
        assert_eq!(g.frontier(&c), Some(1));
        assert_eq!(g.frontier(&c2), Some(1));
        assert!(g.lookahead(&c).is_empty() && g.lookahead(&c2).is_empty());
    }

    #[test]
    fn an_in_flight_claim_below_the_baseline_settles_on_the_high_watermark() {
        // The target was appended before this task's baseline on `a`.
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g: Gate<i64> = Gate::new([a, b]);
        g.seed(a, 10).unwrap();
        g.seed(b, 0).unwrap();
        let mut m = rec(0, Some((1, 5)), &[], &[(a, 4)]);
        m.epoch = 7;
        g.offer(b, m).unwrap();
        assert!(g.next_delivery().is_none());
        assert_eq!(g.evidence_wanted(), vec![a]);
        g.high_watermark(a, 12, 7);
        assert!(
            g.next_delivery().is_none(),
            "position 10 has not reached 12"
        );
        g.position(a, 12).unwrap();
        let d = g.next_delivery().unwrap();
        assert_eq!(d.coordinate, b.at(0));
        assert_eq!(d.replacements, vec![a.at(11)]);
    }

    #[test]
    fn a_later_record_of_the_sender_settles_a_claim_on_an_absent_target() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g: Gate<i64> = Gate::new([a, b]);
        g.seed(a, 10).unwrap();
        g.seed(b, 0).unwrap();
        g.offer(b, rec(0, Some((1, 5)), &[], &[(a, 4)])).unwrap();
        // Sender 1's seq 6 on `a`: seq 4 lies below it, before the baseline.
        g.offer(a, rec(12, Some((1, 6)), &[b.at(0)], &[])).unwrap();
        let d = g.next_delivery().unwrap();
        assert_eq!(d.coordinate, b.at(0));
        assert_eq!(d.replacements, vec![a.at(11)]);
        assert_eq!(drain(&mut g), vec![a.at(12)]);
    }

    #[test]
    fn an_in_flight_claim_on_a_channel_not_consumed_is_replaced_by_its_high_watermark() {
        let (b, other) = (ch(2, 0), ch(9, 3));
        let mut g = seeded(&[b]);
        let mut m = rec(0, Some((1, 3)), &[], &[(other, 2)]);
        m.epoch = 4;
        g.offer(b, m).unwrap();
        assert!(
            g.next_delivery().is_none(),
            "waits for evidence, not for the channel"
        );
        assert_eq!(g.evidence_wanted(), vec![other]);
        g.high_watermark(other, 80, 3);
        assert!(g.next_delivery().is_none(), "read before the record's poll");
        g.high_watermark(other, 81, 4);
        let d = g.next_delivery().unwrap();
        assert_eq!(d.replacements, vec![other.at(80)]);
    }

    #[test]
    fn out_of_order_deliveries_survive_a_restart() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        g.offer(a, rec(0, Some((2, 0)), &[b.at(5)], &[])).unwrap();
        g.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
        g.offer(b, rec(0, Some((1, 1)), &[], &[(a, 0)])).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(1), b.at(0)]);
        let snapshot = g.snapshot();
        assert_eq!(snapshot.channels[0].lookahead, vec![1]);

        // Restart: re-fetch from the first undelivered offsets.
        let mut r: Gate<i64> = Gate::restore([a, b], &snapshot).unwrap();
        assert_eq!(r.first_undelivered(&a), Some(0));
        assert_eq!(r.first_undelivered(&b), Some(1));
        r.offer(a, rec(0, Some((2, 0)), &[b.at(5)], &[])).unwrap();
        r.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
        assert!(r.next_delivery().is_none(), "a@1 is not delivered twice");
        for o in 1..=5 {
            r.offer(b, plain(o)).unwrap();
        }
        assert_eq!(
            drain(&mut r),
            vec![b.at(1), b.at(2), b.at(3), b.at(4), b.at(5), a.at(0)]
        );
        assert_eq!(
            r.frontier(&a),
            Some(1),
            "bridged over the restored look-ahead"
        );
    }

    #[test]
    fn a_pulled_record_keeps_its_senders_order() {
        // Sender 1 sent x0 and x1 to `a`; m claims x1 in flight. x0 goes first.
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = seeded(&[a, b]);
        g.offer(a, rec(0, Some((2, 0)), &[b.at(9)], &[])).unwrap();
        g.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
        g.offer(a, rec(2, Some((1, 1)), &[], &[])).unwrap();
        g.offer(b, rec(0, Some((1, 2)), &[], &[(a, 1)])).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(1), a.at(2), b.at(0)]);
    }
}
