//! What the runtime hands a [`Gate`] — the seeding of a channel, fetched records, the
//! consumer's positions, high watermarks — and the evidence the gate asks for
//! ([`Gate::evidence_wanted`]). Each input is an event on its channel: the records watching the
//! channel are re-checked (`check`).
//!
//! Invariants kept here: the records of a channel are offered in ascending offset order above
//! its frontier (an offer out of order is refused and the record handed back); a position is
//! never behind a record already offered; the frontier advances to `position - 1` only when no
//! fetched record of the channel is undelivered (density adaptation, in the module guide); a
//! channel's high watermark reading and the poll epoch it was read after only grow. While a
//! channel is re-fetched, offers and positions below where reading stopped go to the re-fetch
//! (`spill`) instead.

use std::collections::BTreeSet;

use parsley_clock::Channel;

use super::state::Slot;
use super::{Arrival, Awaiting, Gate, Refetch};
use crate::error::{GateError, Refused};

impl<R> Gate<R> {
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
}
