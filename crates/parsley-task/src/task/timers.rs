//! A task's keyed event-time timers: the times at which a processor asked to be called back
//! for a key ([`parsley_stage::RawStep::timers`], [`parsley_stage::Processor::on_timer`]).
//!
//! # Invariants
//! - A timer is a `(time, key)` pair, set at most once: setting it again changes nothing.
//! - Timers fire in ascending `(time, key)` order, each once, when the task's watermark is at
//!   or above its time; a timer set at or below the watermark fires in the same pass.
//! - `changes` names exactly the timers whose changelog record must change at the next write:
//!   set since the last write (and still set), or fired after being written; after that write
//!   the changelog holds exactly the set timers (key [`timer_key`], empty value; a tombstone
//!   once fired).
//!
//! The key's encoding is `parsley_stage::changelog`'s ([`timer_key`], `timer_of`).

use std::collections::{BTreeMap, BTreeSet};

use parsley_stage::changelog::timer_key;

/// The keyed timers of one task (module docs).
#[derive(Debug, Default)]
pub struct KeyedTimers {
    set: BTreeSet<(i64, Vec<u8>)>,
    /// Since the last changelog write: timer → whether it is set now.
    changes: BTreeMap<(i64, Vec<u8>), bool>,
}

impl KeyedTimers {
    /// Timers restored from a changelog (each set).
    pub fn restored(set: BTreeSet<(i64, Vec<u8>)>) -> Self {
        KeyedTimers {
            set,
            changes: BTreeMap::new(),
        }
    }

    /// Sets the timer `(time, key)` unless it is set.
    pub fn set(&mut self, time: i64, key: &[u8]) {
        let timer = (time, key.to_vec());
        if self.set.insert(timer.clone()) {
            self.changes.insert(timer, true);
        }
    }

    /// The time of the first timer due at `watermark` (time `<= watermark`), if any.
    pub fn next_due(&self, watermark: i64) -> Option<i64> {
        self.set
            .first()
            .map(|(t, _)| *t)
            .filter(|t| *t <= watermark)
    }

    /// The time of the first timer set, if any.
    pub fn next(&self) -> Option<i64> {
        self.set.first().map(|(t, _)| *t)
    }

    /// Takes the first timer due at `watermark` (time `<= watermark`), if any.
    pub fn take_due(&mut self, watermark: i64) -> Option<(i64, Vec<u8>)> {
        let first = self.set.first()?;
        if first.0 > watermark {
            return None;
        }
        let timer = self.set.pop_first().expect("a first timer");
        // Set since the last write: never written, so nothing to delete.
        if self.changes.remove(&timer) != Some(true) {
            self.changes.insert(timer.clone(), false);
        }
        Some(timer)
    }

    /// Timers set now.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// No timer is set.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The changelog records of the changes since the last call: key, and an empty value for
    /// a timer set, `None` (a tombstone) for one fired.
    pub fn take_changes(&mut self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        std::mem::take(&mut self.changes)
            .into_iter()
            .map(|((time, key), set)| (timer_key(time, &key), set.then(Vec::new)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_fire_once_in_time_then_key_order_and_their_changes_are_written_once() {
        let mut t = KeyedTimers::default();
        t.set(20, b"b");
        t.set(10, b"z");
        t.set(20, b"a");
        t.set(20, b"a");
        assert_eq!(t.len(), 3);
        assert_eq!(t.take_due(5), None);
        assert_eq!(t.take_due(20), Some((10, b"z".to_vec())));
        assert_eq!(t.take_due(20), Some((20, b"a".to_vec())));
        // Set and fired between two writes: never written; `b` is written once.
        assert_eq!(t.take_changes(), [(timer_key(20, b"b"), Some(Vec::new()))]);
        assert!(t.take_changes().is_empty());
        assert_eq!(t.take_due(i64::MAX), Some((20, b"b".to_vec())));
        assert_eq!(t.take_due(i64::MAX), None);
        assert_eq!(t.take_changes(), [(timer_key(20, b"b"), None)]);
    }
}
