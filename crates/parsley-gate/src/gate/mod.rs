//! The delivery gate of one task: which fetched record may be delivered next.
//!
//! # The rule (the book's specification, §4)
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
//!    node can replace the claim by the coordinate `(c', E - 1)` (the book's specification, §3);
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
//! The invariants of each consumed channel's state are listed with that state (`state`).
//!
//! # Where the parts live
//! - this file: the [`Gate`] and its core API — building, restoring and snapshotting it, and
//!   read-only views of its channels;
//! - `types`: the public records, evidence and counters the gate takes and returns
//!   ([`Arrival`], [`Delivery`], [`GateSnapshot`], [`Faults`], …);
//! - `state`: the per-channel state (the queue of fetched records, per-sender bookkeeping) and
//!   its invariants;
//! - `intake`: what the runtime hands the gate — seeding, fetched records, positions, high
//!   watermarks — and the evidence the gate asks for;
//! - `release`: records leaving the gate — deliveries, resolutions of impossible stamps — and
//!   the frontier moves that follow a removal;
//! - `check`: the deliverability check — the rule above, claim-driven look-ahead, blocking and
//!   wake-ups, and the replacements of in-flight claims;
//! - `spill`: backpressure, spilling and re-fetching.

use std::collections::{BTreeSet, HashMap, VecDeque};

use parsley_clock::{Channel, Coordinate, SenderId};

use crate::error::GateError;

mod check;
mod intake;
mod release;
mod spill;
mod state;
mod types;

#[cfg(test)]
mod tests;

use state::{ChannelState, Idx, Ready, SenderMap};
pub use types::{
    Arrival, Awaiting, BlockedHead, ChannelSnapshot, Delivery, Discarded, Faults, GateMetrics,
    GateSnapshot, ImpossibleStamp, Refetch, Resolution,
};

/// The delivery gate of one task. `R` is the caller's payload type.
#[derive(Debug)]
pub struct Gate<R> {
    /// Consumed channels, sorted; the index is the channel's `Idx`.
    channels: Vec<ChannelState<R>>,
    /// Deliverable records: (timestamp, channel, offset), smallest first. A record becomes
    /// ready once and stays ready until delivered.
    ready: Ready,
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
            ready: Ready::default(),
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

    /// The index of a consumed channel: a scan of the few a task usually consumes, a binary
    /// search of many.
    #[inline]
    fn index(&self, channel: &Channel) -> Option<Idx> {
        if self.channels.len() <= check::LINEAR_CHANNELS {
            return self.channels.iter().position(|s| s.channel == *channel);
        }
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

    /// Fetched, undelivered records in all queues.
    pub fn queued_total(&self) -> usize {
        self.channels.iter().map(|s| s.undelivered).sum()
    }

    /// Number of tracked records (heads and pulled records) that are blocked.
    pub fn blocked_count(&self) -> usize {
        self.blocked.len()
    }

    /// `true` when a blocked record waits on `channel`: for its frontier to reach an offset,
    /// for it to be seeded, or for an in-flight claim on it to settle. A caller that pauses
    /// channels for reasons of its own (watermark alignment) must not pause such a channel:
    /// the blocked record could wait for ever.
    pub fn awaited(&self, channel: &Channel) -> bool {
        self.blocked.iter().any(|&(idx, offset)| {
            let Some(pos) = self.slot_pos(idx, offset) else {
                return false;
            };
            match self.channels[idx].queue[pos].blocked {
                Some(Awaiting::Frontier(c)) => c.channel == *channel,
                Some(Awaiting::Seeding(c)) => c == *channel,
                Some(Awaiting::InFlight { channel: c, .. }) => c == *channel,
                Some(Awaiting::Evidence(_) | Awaiting::Resolution) | None => false,
            }
        })
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

    /// The payload of the fetched, undelivered record at `coordinate`: what a caller shows of a
    /// [`BlockedHead`] (its key, say). `None` when the gate holds no undelivered record there,
    /// or holds it spilled (payload dropped until it is re-fetched: [`Gate::spill`]).
    pub fn payload(&self, coordinate: &Coordinate) -> Option<&R> {
        let idx = self.index(&coordinate.channel)?;
        let pos = self.slot_pos(idx, coordinate.offset)?;
        self.channels[idx].queue[pos].payload.as_ref()
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
}
