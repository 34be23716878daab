//! The in-memory sort of a [`TimerQueue`]: the parked records ([`Entry`]) in a slab, ordered by
//! their id `(park time, arrival)` in a few ascending runs and a B-tree ([`Parked`]). Nothing
//! here knows the changelog beyond the segment number an entry carries.
//!
//! Invariants kept here: every run is ascending; an ordered id is in exactly one run or in the
//! B-tree until [`Parked::split_below`] takes it out; the slot of an ordered id holds its entry
//! under that id (a freed slot is reused, so a slot is trusted only with its id); `len` counts
//! the ordered ids and `occupied` the slots holding an entry (ordered, or released and not
//! taken yet); once no slot is occupied the slab is given back.

use std::collections::{BTreeMap, VecDeque};

#[cfg(doc)]
use super::TimerQueue;

/// A parked record's id: `(park time, arrival)`.
pub(super) type Id = (i64, u64);

#[derive(Debug, Clone)]
pub(super) struct Entry<K, V> {
    pub(super) key: K,
    pub(super) event_time_ms: i64,
    pub(super) late: bool,
    pub(super) value: V,
    /// The live segment that holds it; `None` while pending (not written yet).
    pub(super) segment: Option<u64>,
}

impl<K: PartialEq, V: PartialEq> Entry<K, V> {
    /// Same record (where it is written is bookkeeping, not content).
    pub(super) fn same(&self, other: &Self) -> bool {
        self.key == other.key
            && self.event_time_ms == other.event_time_ms
            && self.late == other.late
            && self.value == other.value
    }
}

/// Entries per chunk of the slab.
pub(super) const CHUNK: usize = 4_096;

/// A slot of the slab: the entry it holds, under its id, or nothing (free).
type Slot<K, V> = Option<(Id, Entry<K, V>)>;

/// Ascending runs of ids kept beside the B-tree (see [`Parked`]).
pub(super) const RUNS: usize = 16;

/// The parked entries: their ids in release order, each pointing into a slab of entries. The
/// ids are kept as up to [`RUNS`] ascending **runs** (deques) and a B-tree for the ids that
/// fit no run: a new id goes to the end of the run whose last id is the greatest below it,
/// else into a new run, else into the B-tree. History arrives in event-time order per input
/// channel, so a task parks a few interleaved ascending sequences: nearly every id is an
/// `O(1)` append instead of a B-tree insert into a tree of all parked records. Release order
/// is the merge of the runs and the tree. The B-tree and runs move small `(id, slot)` pairs,
/// not entries, and a pending id reaches its entry through its slot without a search (a slot
/// is reused once freed, so the id is checked). The slab grows in chunks of [`CHUNK`]
/// entries, so growing never moves the entries already in it. Released entries leave the
/// order at once and their slots when taken ([`Parked::take_slot`]).
#[derive(Debug, Clone)]
pub(super) struct Parked<K, V> {
    pub(super) order: BTreeMap<Id, usize>,
    pub(super) runs: Vec<VecDeque<(Id, usize)>>,
    /// Ids in `order` and `runs`.
    len: usize,
    pub(super) chunks: Vec<Vec<Slot<K, V>>>,
    free: Vec<usize>,
    /// Slots holding an entry (ordered or released and not taken yet).
    occupied: usize,
}

impl<K, V> Default for Parked<K, V> {
    fn default() -> Self {
        Parked {
            order: BTreeMap::new(),
            runs: Vec::new(),
            len: 0,
            chunks: Vec::new(),
            free: Vec::new(),
            occupied: 0,
        }
    }
}

impl<K, V> Parked<K, V> {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, slot: usize) -> Option<&Slot<K, V>> {
        self.chunks.get(slot / CHUNK)?.get(slot % CHUNK)
    }

    fn slot_mut(&mut self, slot: usize) -> Option<&mut Slot<K, V>> {
        self.chunks.get_mut(slot / CHUNK)?.get_mut(slot % CHUNK)
    }

    /// Parks `e` under a new `id`; returns its slot.
    pub(super) fn insert(&mut self, id: Id, e: Entry<K, V>) -> usize {
        let slot = match self.free.pop() {
            Some(slot) => {
                *self.slot_mut(slot).expect("a free slot is in the slab") = Some((id, e));
                slot
            }
            None => {
                if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
                    self.chunks.push(Vec::with_capacity(CHUNK));
                }
                let n = self.chunks.len() - 1;
                let chunk = &mut self.chunks[n];
                chunk.push(Some((id, e)));
                n * CHUNK + chunk.len() - 1
            }
        };
        // The run whose last id is the greatest below `id`.
        let mut best: Option<(usize, Id)> = None;
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(&(last, _)) = run.back()
                && last < id
                && best.is_none_or(|(_, b)| last > b)
            {
                best = Some((i, last));
            }
        }
        match best {
            Some((i, _)) => self.runs[i].push_back((id, slot)),
            None if self.runs.len() < RUNS => self.runs.push(VecDeque::from([(id, slot)])),
            None => {
                self.order.insert(id, slot);
            }
        }
        self.len += 1;
        self.occupied += 1;
        slot
    }

    /// The entry `id`, if it is still in `slot`.
    pub(super) fn at_mut(&mut self, id: Id, slot: usize) -> Option<&mut Entry<K, V>> {
        match self.slot_mut(slot) {
            Some(Some((i, e))) if *i == id => Some(e),
            _ => None,
        }
    }

    pub(super) fn holds(&self, id: Id, slot: usize) -> bool {
        matches!(self.slot(slot), Some(Some((i, _))) if *i == id)
    }

    /// The entry in `slot` (an id of the order or of [`Parked::split_below`]).
    pub(super) fn get(&self, slot: usize) -> &Entry<K, V> {
        let (_, e) = self
            .slot(slot)
            .and_then(Option::as_ref)
            .expect("an ordered id has its slot");
        e
    }

    /// Removes the ids below `bound` (all of them for `None`) from the order and returns them
    /// with their slots, in id order; their entries stay until taken.
    pub(super) fn split_below(&mut self, bound: Option<Id>) -> Vec<(Id, usize)> {
        let below = |id: &Id| bound.is_none_or(|b| *id < b);
        let mut due = Vec::new();
        for run in &mut self.runs {
            let k = run.partition_point(|(id, _)| below(id));
            due.extend(run.drain(..k));
        }
        self.runs.retain(|run| !run.is_empty());
        let rest = match bound {
            Some(b) => self.order.split_off(&b),
            None => BTreeMap::new(),
        };
        due.extend(std::mem::replace(&mut self.order, rest));
        // A merge of ascending runs: the stable sort finds them.
        due.sort();
        self.len -= due.len();
        due
    }

    /// Takes the entry out of `slot` (one [`Parked::split_below`] returned) and frees the slot;
    /// once nothing is left, gives the slab back (pending ids then find nothing, as they
    /// should).
    pub(super) fn take_slot(&mut self, slot: usize) -> Entry<K, V> {
        let (_, e) = self
            .slot_mut(slot)
            .and_then(Option::take)
            .expect("a released id has its slot");
        self.free.push(slot);
        self.occupied -= 1;
        if self.occupied == 0 {
            self.chunks = Vec::new();
            self.free = Vec::new();
        }
        e
    }

    /// `(id, slot)` of every entry in release order.
    pub(super) fn ids(&self) -> impl Iterator<Item = (Id, usize)> + use<K, V> {
        let mut all: Vec<(Id, usize)> = Vec::with_capacity(self.len);
        for run in &self.runs {
            all.extend(run.iter().copied());
        }
        all.extend(self.order.iter().map(|(id, slot)| (*id, *slot)));
        all.sort();
        all.into_iter()
    }

    /// The entries in release order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Id, &Entry<K, V>)> + '_ {
        self.ids().map(|(id, slot)| (id, self.get(slot)))
    }

    pub(super) fn first_id(&self) -> Option<Id> {
        self.runs
            .iter()
            .filter_map(|run| run.front().map(|(id, _)| *id))
            .chain(self.order.keys().next().copied())
            .min()
    }
}
