//! The delivery gate of one task: which fetched record may be delivered next.
//!
//! # The rule (DESIGN.md §4, first cut)
//! A task consumes a fixed set of channels (partition `p` of every source topic). Fetched
//! records wait in one FIFO queue per channel. The head `m` of a queue is **deliverable** when
//! every entry `(c', o')` of its stamp's clock is satisfied:
//! - `c'` is not consumed by this task → the **ignore branch**: this task will never see
//!   `c'`, so the entry cannot be waited for (the caller still merges it into the node clock
//!   on delivery, so it travels downstream);
//! - `c'` is consumed but not seeded yet → **blocked**: a consumed channel is never ignored;
//! - `o' < B[c']` (the baseline) → out of scope;
//! - otherwise it needs `F[c'] >= o'` (the frontier).
//!
//! Among deliverable heads the gate picks the smallest record timestamp, then the smallest
//! channel: deterministic for a given arrival order.
//!
//! # Density adaptation
//! A `read_committed` partition is not dense: commit markers and aborted records take offsets
//! the consumer never returns.
//! - **Seeding** ([`Gate::seed`]): the first assignment sets `B` to the consumer's position
//!   and `F = B - 1`.
//! - **Bridging**: a fetched head at offset `o` proves that the consumer returned nothing in
//!   `(F, o)` — those offsets are absent for this task — so `F` rises to `o - 1` when the head
//!   arrives and to `o` when it is delivered.
//!
//! Not handled yet (issue 3), and not pretended: in-flight claims (stamps do not carry them
//! yet), position advance when a queue is empty (so a claim on the offset of a commit marker
//! that no later record follows waits for the next record), look-ahead deliveries.
//!
//! # Wake-ups
//! A blocked head is indexed under the one `(channel, offset)` it waits for and re-checked when
//! that channel's frontier reaches the offset or the channel is seeded. No polling, no timer:
//! the gate only moves on events (offer, seed, delivery).
//!
//! # Invariants, per consumed channel
//! - `frontier`: every offset `<= frontier` has been delivered or is absent for this consumer;
//!   it never decreases.
//! - `queue`: fetched, undelivered records in strictly ascending offset order, all `> frontier`.
//! - a head is in exactly one of: the ready set, the waiter index, or unchecked (only inside a
//!   call).
//!
//! Costs: offering a record is `O(log n)`; checking a head walks its stamp once overall (a
//! cursor remembers the entries already satisfied, which stay satisfied because `F` and `B`
//! never move back); each delivery wakes only the heads waiting on that channel's offsets.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use parsley_clock::{Channel, Coordinate, SenderTag, Stamp};

use crate::error::{GateError, ImpossibleReason, Refused};

/// A fetched record handed to the gate: its offset, timestamp, decoded stamp and an opaque
/// payload the gate hands back on delivery.
#[derive(Debug, Clone)]
pub struct Arrival<R> {
    /// The record's offset on its channel.
    pub offset: i64,
    /// The record's timestamp, ms since the epoch (used only to pick among deliverable heads).
    pub timestamp: i64,
    /// The decoded stamp; `None` for an unstamped record, which claims nothing.
    pub stamp: Option<Stamp>,
    /// What the caller needs back on delivery (key, value, headers, …).
    pub payload: R,
}

/// A record the gate released: deliver it to the handler now.
#[derive(Debug, Clone)]
pub struct Delivery<R> {
    /// Channel and offset of the record.
    pub coordinate: Coordinate,
    /// The record's timestamp, ms since the epoch.
    pub timestamp: i64,
    /// Its stamp, to be merged into the node clock.
    pub stamp: Option<Stamp>,
    /// The payload given in the [`Arrival`].
    pub payload: R,
    /// `true` when the record was held at the head of its queue before it could be delivered.
    pub waited: bool,
}

/// Counters a runtime exports as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateMetrics {
    /// Records delivered.
    pub delivered: u64,
    /// Records that were held at least once because a claim was not satisfied yet.
    pub held: u64,
    /// Clock entries skipped by the ignore branch (channel not consumed by this task).
    pub ignored_entries: u64,
    /// Clock entries below the baseline of their channel (out of scope).
    pub out_of_scope_entries: u64,
}

/// Why a head is not deliverable: the first unsatisfied claim of its stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedHead {
    /// The head's coordinate.
    pub head: Coordinate,
    /// The claimed coordinate it waits for.
    pub awaits: Coordinate,
    /// `true` while the awaited channel is not seeded yet.
    pub awaits_seeding: bool,
}

type Idx = usize;

#[derive(Debug)]
struct ChannelState<R> {
    channel: Channel,
    /// `B`: `None` until seeded.
    baseline: Option<i64>,
    /// `F`; meaningful once seeded.
    frontier: i64,
    queue: VecDeque<Queued<R>>,
    /// Blocked heads of other channels waiting for `frontier >= key` here.
    waiters: BTreeMap<i64, Vec<Idx>>,
}

#[derive(Debug)]
struct Queued<R> {
    arrival: Arrival<R>,
    /// Entries `[..cursor]` of the stamp's clock are satisfied for good.
    cursor: usize,
    waited: bool,
    /// The claim this head waits for, when blocked.
    blocked_on: Option<(Idx, i64)>,
}

/// The delivery gate of one task. `R` is the caller's payload type.
#[derive(Debug)]
pub struct Gate<R> {
    /// Consumed channels, sorted by channel; the index is the channel's `Idx`.
    channels: Vec<ChannelState<R>>,
    /// Deliverable heads: (timestamp, channel index).
    ready: BTreeSet<(i64, Idx)>,
    metrics: GateMetrics,
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
                    waiters: BTreeMap::new(),
                })
                .collect(),
            ready: BTreeSet::new(),
            metrics: GateMetrics::default(),
        }
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

    /// The first offset of `channel` not yet delivered and not proven absent: where a consumer
    /// resumes after a crash, and the offset to commit. `None` when not seeded.
    pub fn first_undelivered(&self, channel: &Channel) -> Option<i64> {
        self.frontier(channel).map(|f| f + 1)
    }

    /// Fetched records of `channel` waiting in its queue.
    pub fn queued(&self, channel: &Channel) -> usize {
        self.index(channel)
            .map_or(0, |i| self.channels[i].queue.len())
    }

    /// Fetched records waiting in all queues.
    pub fn queued_total(&self) -> usize {
        self.channels.iter().map(|s| s.queue.len()).sum()
    }

    /// Number of heads that are blocked (cheap; see [`Gate::blocked_heads`] for details).
    pub fn blocked_count(&self) -> usize {
        self.channels
            .iter()
            .filter(|s| s.queue.front().is_some_and(|q| q.blocked_on.is_some()))
            .count()
    }

    /// Heads that are blocked, with the claim each waits for.
    pub fn blocked_heads(&self) -> Vec<BlockedHead> {
        self.channels
            .iter()
            .filter_map(|s| {
                let q = s.queue.front()?;
                let (idx, offset) = q.blocked_on?;
                let awaited = &self.channels[idx];
                Some(BlockedHead {
                    head: s.channel.at(q.arrival.offset),
                    awaits: awaited.channel.at(offset),
                    awaits_seeding: awaited.baseline.is_none(),
                })
            })
            .collect()
    }

    /// Seeds `channel` at the consumer's `position` (the next offset it will fetch) on the
    /// first assignment of the channel to this task: `B = position`, `F = position - 1`.
    /// Heads waiting for this channel to be seeded are re-checked.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`], [`GateError::AlreadySeeded`], or
    /// [`GateError::NegativePosition`] for a position below zero.
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
        // Every waiter on this channel waited for seeding or for the frontier.
        let waiters = std::mem::take(&mut s.waiters);
        for idx in waiters.into_values().flatten() {
            self.check_head(idx);
        }
        Ok(())
    }

    /// Hands a fetched record of `channel` to the gate.
    ///
    /// # Errors
    /// The record is handed back inside the error, nothing is lost:
    /// [`GateError::NotConsumed`] and [`GateError::NotSeeded`] for a channel the task cannot
    /// accept records on; [`GateError::OffsetNotAscending`] when the offset is not above the
    /// frontier and the last queued offset; [`GateError::ImpossibleStamp`] when the stamp
    /// claims an offset on its own channel at or beyond the record itself.
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
        let last = s.queue.back().map_or(s.frontier, |q| q.arrival.offset);
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
        if let Some(stamp) = &arrival.stamp
            && let Some(claimed) = stamp.clock.get(&channel)
            && claimed >= arrival.offset
        {
            let sender: Option<SenderTag> = stamp.sender;
            return Err(Box::new(
                GateError::ImpossibleStamp {
                    record: channel.at(arrival.offset),
                    sender,
                    claim: channel.at(claimed),
                    reason: ImpossibleReason::SelfClaim,
                }
                .with(arrival),
            ));
        }
        s.queue.push_back(Queued {
            arrival,
            cursor: 0,
            waited: false,
            blocked_on: None,
        });
        if s.queue.len() == 1 {
            self.on_new_head(idx);
        }
        Ok(())
    }

    /// Releases the next deliverable record, if any: smallest timestamp, then channel.
    pub fn next_delivery(&mut self) -> Option<Delivery<R>> {
        let (_, idx) = self.ready.pop_first()?;
        let s = &mut self.channels[idx];
        let q = s
            .queue
            .pop_front()
            .expect("a ready head is the front of its queue");
        let offset = q.arrival.offset;
        // Bridging: the delivered head was the first undelivered record of its channel.
        s.frontier = offset;
        self.metrics.delivered += 1;
        if q.waited {
            self.metrics.held += 1;
        }
        let channel = s.channel;
        self.wake(idx);
        if !self.channels[idx].queue.is_empty() {
            self.on_new_head(idx);
        }
        let Arrival {
            timestamp,
            stamp,
            payload,
            ..
        } = q.arrival;
        Some(Delivery {
            coordinate: channel.at(offset),
            timestamp,
            stamp,
            payload,
            waited: q.waited,
        })
    }

    /// A record became the head of queue `idx`: bridge the gap below it, then check it.
    fn on_new_head(&mut self, idx: Idx) {
        let s = &mut self.channels[idx];
        let head_offset = s.queue.front().expect("new head").arrival.offset;
        if head_offset - 1 > s.frontier {
            s.frontier = head_offset - 1;
            self.wake(idx);
        }
        self.check_head(idx);
    }

    /// Re-checks the heads waiting on channel `idx` whose awaited offset is now covered.
    fn wake(&mut self, idx: Idx) {
        let s = &mut self.channels[idx];
        if s.waiters.is_empty() {
            return;
        }
        let still = s.waiters.split_off(&(s.frontier + 1));
        let woken = std::mem::replace(&mut s.waiters, still);
        for head in woken.into_values().flatten() {
            self.check_head(head);
        }
    }

    /// Checks the head of queue `idx` and files it as ready or under the claim it waits for.
    fn check_head(&mut self, idx: Idx) {
        let (entries_len, cursor) = {
            let Some(q) = self.channels[idx].queue.front() else {
                return;
            };
            (
                q.arrival.stamp.as_ref().map_or(0, |s| s.clock.len()),
                q.cursor,
            )
        };
        let mut cursor = cursor;
        let mut blocked_on = None;
        while cursor < entries_len {
            let (claim_channel, claim_offset) = {
                let q = self.channels[idx].queue.front().expect("head");
                q.arrival.stamp.as_ref().expect("stamped").clock.entries()[cursor]
            };
            match self.index(&claim_channel) {
                None => self.metrics.ignored_entries += 1,
                Some(j) => {
                    let t = &self.channels[j];
                    match t.baseline {
                        None => {
                            blocked_on = Some((j, claim_offset));
                            break;
                        }
                        Some(b) if claim_offset < b => self.metrics.out_of_scope_entries += 1,
                        Some(_) if t.frontier >= claim_offset => {}
                        Some(_) => {
                            blocked_on = Some((j, claim_offset));
                            break;
                        }
                    }
                }
            }
            cursor += 1;
        }
        let s = &mut self.channels[idx];
        let q = s.queue.front_mut().expect("head");
        q.cursor = cursor;
        q.blocked_on = blocked_on;
        match blocked_on {
            None => {
                self.ready.insert((q.arrival.timestamp, idx));
            }
            Some((j, offset)) => {
                q.waited = true;
                self.channels[j]
                    .waiters
                    .entry(offset)
                    .or_default()
                    .push(idx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use parsley_clock::{Clock, SenderId, TopicId};

    use super::*;

    fn ch(t: u8, p: i32) -> Channel {
        Channel::new(TopicId::from_bytes([t; 16]), p)
    }

    fn stamped(offset: i64, claims: &[Coordinate]) -> Arrival<&'static str> {
        Arrival {
            offset,
            timestamp: 0,
            stamp: Some(Stamp::new(
                Some(SenderTag {
                    sender: SenderId::from_bytes([1; 16]),
                    seq: 0,
                }),
                claims.iter().copied().collect::<Clock>(),
            )),
            payload: "",
        }
    }

    fn plain(offset: i64) -> Arrival<&'static str> {
        Arrival {
            offset,
            timestamp: 0,
            stamp: None,
            payload: "",
        }
    }

    fn drain(gate: &mut Gate<&'static str>) -> Vec<Coordinate> {
        std::iter::from_fn(|| gate.next_delivery().map(|d| d.coordinate)).collect()
    }

    #[test]
    fn a_record_waits_for_its_claimed_cause_on_another_consumed_channel() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = Gate::new([a, b]);
        g.seed(a, 0).unwrap();
        g.seed(b, 0).unwrap();
        g.offer(b, stamped(0, &[a.at(2)])).unwrap();
        assert!(g.next_delivery().is_none(), "a@2 not delivered yet");
        assert_eq!(
            g.blocked_heads(),
            vec![BlockedHead {
                head: b.at(0),
                awaits: a.at(2),
                awaits_seeding: false
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
        // Claims on a channel the task does not consume are ignored.
        g.offer(b, stamped(0, &[other.at(99)])).unwrap();
        assert_eq!(drain(&mut g), vec![b.at(0)]);
        assert_eq!(g.metrics().ignored_entries, 1);
        // A consumed channel that is not seeded blocks, never counts as ignored.
        g.offer(b, stamped(1, &[a.at(3)])).unwrap();
        assert!(g.next_delivery().is_none());
        assert!(g.blocked_heads()[0].awaits_seeding);
        // Seeded above the claim: out of scope, delivered.
        g.seed(a, 10).unwrap();
        assert_eq!(drain(&mut g), vec![b.at(1)]);
        assert_eq!(g.metrics().out_of_scope_entries, 1);
        assert_eq!(g.frontier(&a), Some(9));
    }

    #[test]
    fn bridging_covers_gaps_below_a_fetched_head() {
        // Records at 0 and 1, commit marker at 2, record at 3.
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = Gate::new([a, b]);
        g.seed(a, 0).unwrap();
        g.seed(b, 0).unwrap();
        g.offer(b, stamped(0, &[a.at(2)])).unwrap();
        g.offer(a, plain(0)).unwrap();
        g.offer(a, plain(1)).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(0), a.at(1)]);
        assert_eq!(g.frontier(&a), Some(1));
        // The head at 3 proves offset 2 absent: F rises to 2 on arrival, waking b@0.
        g.offer(a, stamped(3, &[b.at(0)])).unwrap();
        assert_eq!(g.frontier(&a), Some(2));
        assert_eq!(drain(&mut g), vec![b.at(0), a.at(3)]);
    }

    #[test]
    fn picks_smallest_timestamp_then_channel() {
        let (a, b) = (ch(1, 0), ch(2, 0));
        let mut g = Gate::new([a, b]);
        g.seed(a, 0).unwrap();
        g.seed(b, 0).unwrap();
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
        let mut g = Gate::new([a]);
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
        let err = g.offer(a, stamped(7, &[a.at(7)])).unwrap_err();
        match err.kind {
            GateError::ImpossibleStamp {
                record,
                claim,
                reason,
                sender,
            } => {
                assert_eq!((record, claim), (a.at(7), a.at(7)));
                assert_eq!(reason, ImpossibleReason::SelfClaim);
                assert_eq!(sender.unwrap().seq, 0);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.refused.offset, 7, "the record is handed back");
        assert_eq!(g.queued(&a), 0);
    }

    #[test]
    fn a_chain_of_waiters_wakes_in_causal_order() {
        // c@0 waits for b@0, which waits for a@0.
        let (a, b, c) = (ch(1, 0), ch(2, 0), ch(3, 0));
        let mut g = Gate::new([a, b, c]);
        for x in [a, b, c] {
            g.seed(x, 0).unwrap();
        }
        g.offer(c, stamped(0, &[b.at(0), a.at(0)])).unwrap();
        g.offer(b, stamped(0, &[a.at(0)])).unwrap();
        assert!(g.next_delivery().is_none());
        g.offer(a, plain(0)).unwrap();
        assert_eq!(drain(&mut g), vec![a.at(0), b.at(0), c.at(0)]);
    }
}
