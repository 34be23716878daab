//! Records leaving a [`Gate`]: the next delivery (smallest timestamp, then channel, then
//! offset), the impossible stamps found and their [`Resolution`], and the bookkeeping every
//! removal does — sender state, look-ahead set, and the frontier moving over delivered records
//! and over the gap below the new head (bridging, in the module guide's density adaptation).
//!
//! Invariants kept here: removing the head of a queue moves the frontier over it, over the
//! delivered records behind it and up to just below the next head, and tracks that head; a
//! record removed elsewhere (a look-ahead delivery) leaves the frontier as it is and joins the
//! look-ahead set (except under the `bridge_over_lookahead` negative control); the look-ahead
//! set holds only offsets above the frontier; the front of a queue is never a delivered record.

use parsley_clock::{Coordinate, Stamp};

use super::state::Idx;
use super::{Delivery, Discarded, Gate, ImpossibleStamp, Resolution};
use crate::error::GateError;

impl<R> Gate<R> {
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
        let (_, idx, offset) = self.ready.pop()?;
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
    pub(super) fn advance_front(&mut self, idx: Idx) {
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
}
