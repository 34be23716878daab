//! Backpressure in a [`Gate`]: how much a channel's queue holds ([`Gate::held`]), whether a
//! full channel may be paused ([`Gate::needs_reading`]), spilling ([`Gate::spill`]), and
//! re-fetching spilled records ([`Gate::refetch_wanted`], [`Gate::begin_refetch`],
//! [`Gate::end_refetch`], and the refill of a stub by its re-fetched record). The module guide
//! says why ("Backpressure and spilling").
//!
//! Invariants kept here: only untracked undelivered records are spilled, so a re-fetch always
//! makes progress; a stub keeps its offset, timestamp, poll epoch and sender tag, so the
//! frontier, bridging and per-sender order stay exact; a re-fetched record refills its stub
//! only when it carries the same sender tag, and one at an offset that held no record is
//! refused ([`GateError::RefetchMismatch`]: the history changed); a re-fetched record already
//! held or delivered is ignored.

use std::collections::BTreeMap;

use parsley_clock::{Channel, SenderTag};

use super::check::{Settled, settle};
use super::state::Idx;
use super::{Arrival, Awaiting, Gate, Refetch};
use crate::error::{GateError, Refused};

impl<R> Gate<R> {
    /// Fetched, undelivered records of `channel` that hold their payload: what backpressure
    /// bounds (spilled records are not counted).
    pub fn held(&self, channel: &Channel) -> usize {
        self.index(channel).map_or(0, |i| {
            let s = &self.channels[i];
            s.undelivered - s.spilled
        })
    }

    /// `true` when a blocked record's in-flight claim still needs more of `channel` to be read:
    /// its target is not fetched yet and the position has not reached the evidence. Such a
    /// channel must not be paused for backpressure — a strict pause deadlocks (the book's
    /// specification, §4).
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

    /// A record re-fetched below where reading stopped: refills its stub, or is ignored when
    /// it is delivered, below the frontier, or held.
    pub(super) fn refill(
        &mut self,
        idx: Idx,
        arrival: Arrival<R>,
    ) -> Result<(), Box<Refused<Arrival<R>>>> {
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
}
