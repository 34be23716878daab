//! Offset vector clocks over channels.
//!
//! A [`Clock`] maps channels to offset watermarks. An entry `(c, n)` claims every offset
//! `<= n` on `c`; a channel without an entry claims nothing (the book's specification,
//! §1). The same type plays the two roles the literature calls `VT(m)` and `VT(p)`: attached to a
//! record (inside a [`Stamp`](crate::Stamp)) it states the record's dependencies; held by a node it
//! accumulates what the node delivered and learned.
//!
//! Invariants kept here:
//! - entries are sorted by [`Channel`] and each channel appears at most once;
//! - every offset is `>= 0` (an entry for "nothing" is simply absent);
//! - merging is pointwise max, so it is commutative, associative and idempotent, and a merged
//!   clock covers everything either side covered (property-tested below).
//!
//! Costs: `get`/`covers` are a binary search, `O(log n)`; `observe` is `O(n)` when it inserts a
//! new channel and `O(log n)` otherwise; `merge` is `O(n + m)` and allocates only when the
//! other clock names a channel this one lacks.

use std::fmt;

use crate::channel::{Channel, Coordinate};
use crate::error::{Error, Result};

/// A map channel → highest claimed offset, kept as a small sorted vector.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Clock {
    /// Sorted by channel, unique channels, offsets `>= 0`.
    entries: Vec<(Channel, i64)>,
}

impl Clock {
    /// The empty clock: claims nothing.
    pub const fn new() -> Self {
        Clock {
            entries: Vec::new(),
        }
    }

    /// An empty clock with room for `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        Clock {
            entries: Vec::with_capacity(capacity),
        }
    }

    /// Builds a clock from entries that are already sorted by channel, unique and `>= 0`.
    ///
    /// # Errors
    /// [`Error::UnsortedEntries`] when the channels are not strictly ascending;
    /// [`Error::NegativeOffset`] for an offset below zero.
    pub fn try_from_sorted(entries: Vec<(Channel, i64)>) -> Result<Self> {
        for (i, &(channel, offset)) in entries.iter().enumerate() {
            if offset < 0 {
                return Err(Error::NegativeOffset { channel, offset });
            }
            if i > 0 && entries[i - 1].0 >= channel {
                return Err(Error::UnsortedEntries { channel });
            }
        }
        Ok(Clock { entries })
    }

    /// Wraps entries the caller guarantees to be sorted, unique and `>= 0` (the decoder, which
    /// checks as it reads).
    pub(crate) fn from_sorted_unchecked(entries: Vec<(Channel, i64)>) -> Self {
        debug_assert!(Clock::try_from_sorted(entries.clone()).is_ok());
        Clock { entries }
    }

    /// Number of channels the clock names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when the clock claims nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, sorted by channel.
    pub fn entries(&self) -> &[(Channel, i64)] {
        &self.entries
    }

    /// Iterates over the entries as coordinates, sorted by channel.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Coordinate> + '_ {
        self.entries.iter().map(|&(c, o)| c.at(o))
    }

    /// The highest offset claimed on `channel`, or `None` when it claims nothing there.
    pub fn get(&self, channel: &Channel) -> Option<i64> {
        self.entries
            .binary_search_by(|(c, _)| c.cmp(channel))
            .ok()
            .map(|i| self.entries[i].1)
    }

    /// `true` when the clock claims `coordinate`, i.e. has an entry `(c, n)` with `n >= offset`.
    pub fn covers(&self, coordinate: Coordinate) -> bool {
        self.get(&coordinate.channel)
            .is_some_and(|n| n >= coordinate.offset)
    }

    /// `true` when this clock claims everything `other` claims (pointwise `>=`).
    pub fn dominates(&self, other: &Clock) -> bool {
        other.iter().all(|c| self.covers(c))
    }

    /// Raises the entry of `coordinate.channel` to at least `coordinate.offset`.
    ///
    /// # Panics
    /// When the offset is negative; see [`Clock::try_observe`].
    pub fn observe(&mut self, coordinate: Coordinate) {
        if let Err(e) = self.try_observe(coordinate) {
            observe_failed(e)
        }
    }

    /// Raises the entry of `coordinate.channel` to at least `coordinate.offset`.
    ///
    /// # Errors
    /// [`Error::NegativeOffset`] when the offset is below zero; the clock is unchanged.
    pub fn try_observe(&mut self, coordinate: Coordinate) -> Result<()> {
        let Coordinate { channel, offset } = coordinate;
        if offset < 0 {
            return Err(Error::NegativeOffset { channel, offset });
        }
        match self.entries.binary_search_by(|(c, _)| c.cmp(&channel)) {
            Ok(i) => {
                let e = &mut self.entries[i].1;
                *e = (*e).max(offset);
            }
            Err(i) => self.entries.insert(i, (channel, offset)),
        }
        Ok(())
    }

    /// Pointwise max: afterwards this clock claims everything either clock claimed.
    pub fn merge(&mut self, other: &Clock) {
        if other.entries.is_empty() {
            return;
        }
        if self.entries.is_empty() {
            self.entries.extend_from_slice(&other.entries);
            return;
        }
        // In place when every channel of `other` is already here (the steady state of a node).
        let mut missing = 0usize;
        let mut i = 0usize;
        for &(channel, offset) in &other.entries {
            while i < self.entries.len() && self.entries[i].0 < channel {
                i += 1;
            }
            if i < self.entries.len() && self.entries[i].0 == channel {
                let e = &mut self.entries[i].1;
                *e = (*e).max(offset);
            } else {
                missing += 1;
            }
        }
        if missing == 0 {
            return;
        }
        let mut merged = Vec::with_capacity(self.entries.len() + missing);
        let (mut a, mut b) = (0usize, 0usize);
        let (left, right) = (&self.entries, &other.entries);
        while a < left.len() && b < right.len() {
            match left[a].0.cmp(&right[b].0) {
                std::cmp::Ordering::Less => {
                    merged.push(left[a]);
                    a += 1;
                }
                std::cmp::Ordering::Greater => {
                    merged.push(right[b]);
                    b += 1;
                }
                std::cmp::Ordering::Equal => {
                    // Already raised in place above.
                    merged.push(left[a]);
                    a += 1;
                    b += 1;
                }
            }
        }
        merged.extend_from_slice(&left[a..]);
        merged.extend_from_slice(&right[b..]);
        self.entries = merged;
    }

    /// Drops every entry for which `keep` returns `false`.
    pub fn retain(&mut self, mut keep: impl FnMut(Coordinate) -> bool) {
        self.entries.retain(|&(c, o)| keep(c.at(o)));
    }
}

#[cold]
#[inline(never)]
fn observe_failed(e: Error) -> ! {
    panic!("Clock::observe: {e}")
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(c, o)| (c.to_string(), o)))
            .finish()
    }
}

impl FromIterator<Coordinate> for Clock {
    /// Collects coordinates, keeping the highest offset per channel.
    ///
    /// # Panics
    /// On a negative offset.
    fn from_iter<I: IntoIterator<Item = Coordinate>>(iter: I) -> Self {
        let mut clock = Clock::new();
        for c in iter {
            clock.observe(c);
        }
        clock
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::channel::TopicId;

    fn ch(t: u8, p: i32) -> Channel {
        Channel::new(TopicId::from_bytes([t; 16]), p)
    }

    #[test]
    fn entry_claims_every_offset_at_or_below_it() {
        let clock: Clock = [ch(1, 0).at(5)].into_iter().collect();
        assert!(clock.covers(ch(1, 0).at(0)));
        assert!(clock.covers(ch(1, 0).at(5)));
        assert!(!clock.covers(ch(1, 0).at(6)));
        assert!(
            !clock.covers(ch(1, 1).at(0)),
            "absent channel claims nothing"
        );
    }

    #[test]
    fn observe_keeps_the_maximum_and_rejects_negative_offsets() {
        let mut clock = Clock::new();
        clock.observe(ch(1, 0).at(7));
        clock.observe(ch(1, 0).at(3));
        assert_eq!(clock.get(&ch(1, 0)), Some(7));
        let err = clock.try_observe(ch(2, 0).at(-1)).unwrap_err();
        assert!(matches!(err, Error::NegativeOffset { offset: -1, .. }));
        assert_eq!(clock.len(), 1);
    }

    #[test]
    fn try_from_sorted_rejects_unsorted_and_duplicate_channels() {
        assert!(Clock::try_from_sorted(vec![(ch(1, 1), 0), (ch(1, 0), 0)]).is_err());
        assert!(Clock::try_from_sorted(vec![(ch(1, 0), 0), (ch(1, 0), 1)]).is_err());
        assert!(Clock::try_from_sorted(vec![(ch(1, 0), 0), (ch(1, 1), 9)]).is_ok());
    }

    #[test]
    fn merge_table() {
        // (left, right, expected)
        type Entries = Vec<(Channel, i64)>;
        let cases: Vec<(Entries, Entries, Entries)> = vec![
            (vec![], vec![(ch(1, 0), 3)], vec![(ch(1, 0), 3)]),
            (vec![(ch(1, 0), 3)], vec![], vec![(ch(1, 0), 3)]),
            (
                vec![(ch(1, 0), 3)],
                vec![(ch(1, 0), 9)],
                vec![(ch(1, 0), 9)],
            ),
            (
                vec![(ch(1, 0), 9)],
                vec![(ch(1, 0), 3)],
                vec![(ch(1, 0), 9)],
            ),
            (
                vec![(ch(1, 0), 1), (ch(3, 0), 1)],
                vec![(ch(2, 0), 5), (ch(3, 0), 4), (ch(4, 0), 2)],
                vec![(ch(1, 0), 1), (ch(2, 0), 5), (ch(3, 0), 4), (ch(4, 0), 2)],
            ),
        ];
        for (left, right, expected) in cases {
            let mut l = Clock::try_from_sorted(left).unwrap();
            l.merge(&Clock::try_from_sorted(right).unwrap());
            assert_eq!(l.entries(), &expected[..]);
        }
    }

    pub(crate) fn arb_clock() -> impl Strategy<Value = Clock> {
        proptest::collection::vec((0u8..4, 0i32..4, 0i64..1_000), 0..12).prop_map(|v| {
            v.into_iter()
                .map(|(t, p, o)| Channel::new(TopicId::from_bytes([t; 16]), p).at(o))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn merge_is_commutative(a in arb_clock(), b in arb_clock()) {
            let mut ab = a.clone(); ab.merge(&b);
            let mut ba = b.clone(); ba.merge(&a);
            prop_assert_eq!(ab, ba);
        }

        #[test]
        fn merge_is_associative(a in arb_clock(), b in arb_clock(), c in arb_clock()) {
            let mut left = a.clone(); left.merge(&b); left.merge(&c);
            let mut bc = b.clone(); bc.merge(&c);
            let mut right = a.clone(); right.merge(&bc);
            prop_assert_eq!(left, right);
        }

        #[test]
        fn merge_is_idempotent_and_an_upper_bound(a in arb_clock(), b in arb_clock()) {
            let mut aa = a.clone(); aa.merge(&a);
            prop_assert_eq!(&aa, &a);
            let mut ab = a.clone(); ab.merge(&b);
            prop_assert!(ab.dominates(&a));
            prop_assert!(ab.dominates(&b));
            // Least upper bound: every entry comes from one side.
            for c in ab.iter() {
                prop_assert!(a.get(&c.channel) == Some(c.offset) || b.get(&c.channel) == Some(c.offset));
            }
            // Sorted and unique.
            prop_assert!(ab.entries().windows(2).all(|w| w[0].0 < w[1].0));
        }
    }
}
