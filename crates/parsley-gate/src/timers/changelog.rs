//! The changelog form of a [`TimerQueue`] ("Changelogging, by segment" in the module guide): its
//! parts ([`Part`], [`QueueParts`]), the whole queue as a fresh changelog would hold it
//! ([`TimerQueue::to_parts`]), what changed since the last write ([`TimerQueue::take_changes`]:
//! new segments, carried segments, tombstones, late counts), the limits ([`SEGMENT_BYTES`],
//! [`CARRY_FACTOR`], [`CARRY_SLACK`]), and the rebuild ([`TimerQueue::from_parts`]).
//!
//! Invariants kept here, between calls: the segment of every written parked entry is live
//! ([`Segment`]), and its `live` counts the parked entries in it; the queue's `log_entries` and
//! `written_parked` are the sums of `total` and `live` over the live segments; a segment emptied
//! since the last write waits in `dead` for its tombstone; a write that fails leaves the queue
//! and its changes as they were.

use std::collections::BTreeSet;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::TimerQueue;
use super::codec::{EntryIn, Header, Segments, decode, decode_segment, encode};
use super::sort::{Entry, Id};
use crate::error::GateError;

/// Default largest size of one segment record's value, bytes (below the broker's default
/// maximum message size of 1 MiB, with room for the key and the batch overhead).
pub const SEGMENT_BYTES: usize = 512 << 10;
/// Live segments may hold this many entries per parked record in them (plus the slack) before
/// the sparsest are carried forward (module docs).
pub const CARRY_FACTOR: u64 = 4;
/// Default carry slack, entries: below this many dead entries nothing is carried.
pub const CARRY_SLACK: u64 = 4_096;

/// What one changelog record of a queue describes (module docs: changelogging).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part<K> {
    /// A segment: parked records written together, by segment number.
    Segment(u64),
    /// The late count of one key.
    Late(K),
}

/// The changelog form of a queue, or of what changed in it since the last
/// [`take_changes`](TimerQueue::take_changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueParts<K> {
    /// The queue-wide record: watermark, next arrival, next segment, counters.
    pub header: Vec<u8>,
    /// Each part's record, or `None` when the part is gone (an emptied or carried segment: a
    /// tombstone).
    pub parts: Vec<(Part<K>, Option<Vec<u8>>)>,
}

/// A written segment still holding parked records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Segment {
    /// Entries written in it.
    pub(super) total: u64,
    /// Of those, still parked.
    pub(super) live: u64,
}

impl<K: Ord + Clone + Serialize, V: Serialize> TimerQueue<K, V> {
    /// Released records not taken yet would be written as released (their park times are at
    /// or below the watermark) before the caller has them: refused.
    fn check_taken(&self) -> Result<(), GateError> {
        match self.ready.len() {
            0 => Ok(()),
            count => Err(GateError::ReleasedNotTaken { count }),
        }
    }

    pub(super) fn header(&self, next_segment: u64) -> Result<Vec<u8>, GateError> {
        encode(&Header {
            watermark: self.watermark,
            next_arrival: self.next_arrival,
            next_segment,
            metrics: self.metrics,
        })
    }

    /// The whole queue in its changelog form (module docs), as a fresh changelog would hold
    /// it: the header, every parked record in segments numbered from 0, and every key's late
    /// count. Leaves the queue and its changes as they are.
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] when a key's or value's serde implementation fails;
    /// [`GateError::ReleasedNotTaken`] while records [`raise`](Self::raise) released are not
    /// all taken.
    pub fn to_parts(&self) -> Result<QueueParts<K>, GateError> {
        self.check_taken()?;
        let mut packer = Segments::new(self.segment_bytes);
        for (id, e) in self.parked.iter() {
            packer.push(id, e)?;
        }
        let segments = packer.finish()?;
        let mut parts = Vec::with_capacity(segments.len() + self.late.len());
        let n = segments.len() as u64;
        for (i, (_, record)) in segments.into_iter().enumerate() {
            parts.push((Part::Segment(i as u64), Some(record)));
        }
        for (k, count) in &self.late {
            parts.push((Part::Late(k.clone()), Some(encode(count)?)));
        }
        Ok(QueueParts {
            header: self.header(n)?,
            parts,
        })
    }

    /// The segments to carry forward now (module docs), sparsest first: while the live
    /// segments hold more than [`CARRY_FACTOR`] entries per parked record plus the slack.
    fn to_carry(&self) -> Vec<u64> {
        let (mut entries, parked) = (self.log_entries, self.written_parked);
        let over = |entries: u64, parked: u64| {
            entries
                > CARRY_FACTOR
                    .saturating_mul(parked)
                    .saturating_add(self.carry_slack)
        };
        if !over(entries, parked) {
            return Vec::new();
        }
        let mut by_density: Vec<(u64, Segment)> =
            self.segments.iter().map(|(n, s)| (*n, *s)).collect();
        // live / total ascending, compared without division.
        by_density.sort_by(|(_, a), (_, b)| {
            (u128::from(a.live) * u128::from(b.total))
                .cmp(&(u128::from(b.live) * u128::from(a.total)))
        });
        let mut carry = Vec::new();
        for (n, s) in by_density {
            if !over(entries, parked) {
                break;
            }
            // Its parked entries are written again in the new segment.
            entries = entries - s.total + s.live;
            carry.push(n);
        }
        carry
    }

    /// What changed since the last call (or since the queue was created or rebuilt): the
    /// header; the records parked since and still parked, as new segments (with the parked
    /// records of carried segments); a tombstone for every segment emptied or carried since;
    /// and the late count of each key whose count grew. A record parked and released between
    /// two calls is not mentioned. Written in order with the rest of a task's state in one
    /// transaction, a compacted changelog holding them rebuilds the queue exactly
    /// ([`from_parts`](Self::from_parts)).
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] when a key's or value's serde implementation fails; the
    /// queue and its changes are left as they were then. [`GateError::ReleasedNotTaken`]
    /// while records [`raise`](Self::raise) released are not all taken.
    pub fn take_changes(&mut self) -> Result<QueueParts<K>, GateError> {
        self.check_taken()?;
        let carry = self.to_carry();
        let first = self.next_segment;
        // One pass: each written entry is looked up once, encoded and given its segment; on an
        // encoding error the entries given one get their old segment back.
        let mut packer = Segments::new(self.segment_bytes);
        let mut assigned: Vec<((Id, usize), Option<u64>)> = Vec::new();
        let mut failed = None;
        for &(id, slot) in &self.pending {
            let Some(e) = self.parked.at_mut(id, slot) else {
                continue; // released since it was parked
            };
            if e.segment.is_some() {
                continue;
            }
            match packer.push(id, e) {
                Ok(n) => {
                    assigned.push(((id, slot), None));
                    e.segment = Some(first + n);
                }
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        if failed.is_none() && !carry.is_empty() {
            let carried: BTreeSet<u64> = carry.iter().copied().collect();
            let ids: Vec<(Id, usize)> = self.parked.ids().collect();
            for (id, slot) in ids {
                let e = self.parked.at_mut(id, slot).expect("parked");
                let Some(old) = e.segment.filter(|s| carried.contains(s)) else {
                    continue;
                };
                match packer.push(id, e) {
                    Ok(n) => {
                        assigned.push(((id, slot), Some(old)));
                        e.segment = Some(first + n);
                    }
                    Err(err) => {
                        failed = Some(err);
                        break;
                    }
                }
            }
        }
        let encoded = match failed {
            Some(err) => Err(err),
            None => packer.finish(),
        };
        let late = encoded.and_then(|segments| {
            let mut late = Vec::with_capacity(self.changed_late.len());
            for k in &self.changed_late {
                let count = self.late.get(k).copied().unwrap_or(0);
                late.push((Part::Late(k.clone()), Some(encode(&count)?)));
            }
            let header = self.header(first + segments.len() as u64)?;
            Ok((segments, late, header))
        });
        let (segments, late, header) = match late {
            Ok(x) => x,
            Err(err) => {
                for ((id, slot), old) in assigned {
                    if let Some(e) = self.parked.at_mut(id, slot) {
                        e.segment = old;
                    }
                }
                return Err(err);
            }
        };
        // Nothing fails from here on.
        let mut parts = Vec::with_capacity(segments.len() + carry.len() + self.dead.len());
        for n in &carry {
            if let Some(s) = self.segments.remove(n) {
                self.log_entries -= s.total;
                self.written_parked -= s.live;
            }
        }
        for (seg_ids, record) in segments {
            let n = self.next_segment;
            self.next_segment += 1;
            let count = seg_ids.len() as u64;
            self.segments.insert(
                n,
                Segment {
                    total: count,
                    live: count,
                },
            );
            self.log_entries += count;
            self.written_parked += count;
            parts.push((Part::Segment(n), Some(record)));
        }
        for n in carry.into_iter().chain(self.dead.drain(..)) {
            parts.push((Part::Segment(n), None));
        }
        parts.extend(late);
        self.pending.clear();
        self.changed_late.clear();
        Ok(QueueParts { header, parts })
    }
}

impl<K: Ord + Clone + DeserializeOwned, V: DeserializeOwned> TimerQueue<K, V> {
    /// Rebuilds a queue from its changelog form: the `header` and the latest record of every
    /// part that has one (tombstoned parts left out). An entry of a segment is parked iff its
    /// park time is above the header's watermark; a segment with none left is tombstoned by
    /// the next [`take_changes`](Self::take_changes). The changelog limits are the defaults
    /// ([`with_changelog_limits`](Self::with_changelog_limits)).
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] for an unknown version, truncated or trailing bytes,
    /// bytes that do not decode, a part given twice, a late count of 0, an empty segment or
    /// one numbered at or above the header's next segment, or entries that break an invariant
    /// (a park time below its own event time, an arrival not below the next arrival, an
    /// arrival given twice).
    pub fn from_parts<'a>(
        header: &[u8],
        parts: impl IntoIterator<Item = (Part<K>, &'a [u8])>,
    ) -> Result<Self, GateError> {
        Self::decode_parts(header, parts).map_err(|message| GateError::TimerQueueCodec { message })
    }

    fn decode_parts<'a>(
        header: &[u8],
        parts: impl IntoIterator<Item = (Part<K>, &'a [u8])>,
    ) -> Result<Self, String> {
        let h: Header = decode("header", header)?;
        let mut q = TimerQueue {
            watermark: h.watermark,
            next_arrival: h.next_arrival,
            next_segment: h.next_segment,
            metrics: h.metrics,
            ..TimerQueue::default()
        };
        let mut arrivals = BTreeSet::new();
        for (part, bytes) in parts {
            match part {
                Part::Segment(n) => {
                    if n >= q.next_segment {
                        return Err(format!(
                            "segment {n} is not below the next segment {}",
                            q.next_segment
                        ));
                    }
                    if q.segments.contains_key(&n) || q.dead.contains(&n) {
                        return Err(format!("segment {n} appears twice"));
                    }
                    let entries: Vec<((i64, u64), EntryIn<K, V>)> = decode_segment(bytes)?;
                    let total = entries.len() as u64;
                    let mut live = 0;
                    for ((t, a), e) in entries {
                        if t < e.event_time_ms {
                            return Err(format!(
                                "park time {t} is below the event time {}",
                                e.event_time_ms
                            ));
                        }
                        if a >= q.next_arrival {
                            return Err(format!("arrival {a} is not below the next arrival"));
                        }
                        if !arrivals.insert(a) {
                            return Err(format!("arrival {a} appears twice"));
                        }
                        if q.watermark.is_some_and(|w| t <= w) {
                            // Released: the watermark committed with it passed it.
                            continue;
                        }
                        live += 1;
                        // The queue is rebuilt with no pending records: every entry is written.
                        q.parked.insert(
                            (t, a),
                            Entry {
                                key: e.key,
                                event_time_ms: e.event_time_ms,
                                late: e.late,
                                value: e.value,
                                segment: Some(n),
                            },
                        );
                    }
                    if live == 0 {
                        q.dead.push(n);
                    } else {
                        q.segments.insert(n, Segment { total, live });
                        q.log_entries += total;
                        q.written_parked += live;
                    }
                }
                Part::Late(key) => {
                    let n: u64 = decode("late count", bytes)?;
                    if n == 0 {
                        return Err("a late count of 0".into());
                    }
                    if q.late.insert(key, n).is_some() {
                        return Err("a key's late count appears twice".into());
                    }
                }
            }
        }
        Ok(q)
    }
}
