//! The deliverability check of a [`Gate`]: whether a tracked record — the head of its queue,
//! or a record pulled ahead by a claim — may be delivered (the rule in the module guide), and
//! what it waits for when it may not.
//!
//! - [`Gate::verdict`] walks the stamp's clock from the record's cursor, then its in-flight
//!   claims ([`settle`]); a claim whose target is a fetched, undelivered record of the sender
//!   pulls that record ahead (claim-driven look-ahead); an impossible claim holds the record
//!   for a [`Resolution`];
//! - a blocked record is filed under the one channel its first unsatisfied claim concerns (or
//!   the channel not consumed whose high watermark it needs) and re-checked on any event there
//!   ([`Gate::event`]);
//! - [`Gate::replacements`] gives, on delivery, the coordinates that replace the in-flight
//!   claims this node did not resolve by its own deliveries.
//!
//! Invariants kept here: only tracked records with their payload are checked; clock entries
//! before a record's cursor are satisfied for good; a record becomes ready once and stays ready
//! until delivered; a blocked record is in the gate's blocked set with what it awaits, and in
//! the watcher list of the channel it awaits (or held for a resolution).

use parsley_clock::{Channel, Coordinate, SenderId};

#[cfg(doc)]
use super::Resolution;
use super::state::{ChannelState, Idx};
use super::{Awaiting, Gate, ImpossibleStamp};
use crate::error::ImpossibleReason;

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

/// Up to this many consumed channels, the walk over a stamp starts at the first of them and a
/// channel is found by a scan, rather than with a binary search.
pub(super) const LINEAR_CHANNELS: usize = 8;

#[derive(Clone, Copy)]
enum Watch {
    Consumed(Idx),
    Foreign(Channel),
}

impl<R> Gate<R> {
    /// Something happened on channel `idx`: re-check the records watching it.
    #[inline(always)]
    pub(super) fn event(&mut self, idx: Idx, frontier_moved: bool) {
        if !self.channels[idx].watchers.is_empty() {
            self.wake(idx, frontier_moved);
        }
    }

    #[inline(never)]
    fn wake(&mut self, idx: Idx, frontier_moved: bool) {
        if self.faults.wakeups_only_on_frontier && !frontier_moved {
            return;
        }
        let watchers = std::mem::take(&mut self.channels[idx].watchers);
        for (i, o) in watchers {
            self.check(i, o);
        }
    }

    /// Starts checking the record at (`idx`, `offset`): a head or a pulled record.
    pub(super) fn track(&mut self, idx: Idx, offset: i64) {
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
    pub(super) fn check(&mut self, idx: Idx, offset: i64) {
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
                self.ready.push((slot.timestamp, idx, offset));
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
        // A merge walk over the two sorted lists. A task consumes few channels: start at the
        // first, or find the place with a binary search when there are many.
        let mut j = if channels.len() <= LINEAR_CHANNELS || cursor >= entries.len() {
            0
        } else {
            channels.partition_point(|c| c.channel < entries[cursor].0)
        };
        let mut ignored = 0u64;
        let mut out_of_scope = 0u64;
        let mut result = None;
        while cursor < entries.len() {
            let (cc, co) = entries[cursor];
            while j < channels.len() && channels[j].channel < cc {
                j += 1;
            }
            let Some(t) = channels.get(j) else {
                // Past the last consumed channel: the rest is on the ignore branch.
                ignored += (entries.len() - cursor) as u64;
                cursor = entries.len();
                break;
            };
            if t.channel != cc {
                // Not consumed, and neither is any entry below the next consumed channel:
                // the ignore branch for all of them (the rest of a foreign topic's group, say).
                let skip = 1 + entries[cursor + 1..]
                    .iter()
                    .take_while(|(c, _)| *c < t.channel)
                    .count();
                ignored += skip as u64;
                cursor += skip;
                continue;
            }
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
                            reason: ImpossibleReason::BeyondHighWatermark { high_watermark: hw },
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
    /// that this node does not resolve by its own deliveries (the book's specification, §3).
    pub(super) fn replacements(&self, idx: Idx, pos: usize) -> Vec<Coordinate> {
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
pub(super) enum Settled {
    /// Settled; `Some(end)`: replace the claim by `(c', end - 1)`; `None`: resolved by this
    /// node's own delivery, no replacement.
    Yes(Option<i64>),
    /// A fetched, undelivered record of the sender at this offset must be delivered first.
    Target(i64),
    /// Not settled yet.
    No,
}

pub(super) fn settle<R>(t: &ChannelState<R>, sender: SenderId, seq: u64, epoch: u64) -> Settled {
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
