//! A task's fold state: in memory (the default), or on disk in the stage's state store
//! (`state_store`), with what changed since the last commit in memory.
//!
//! # Invariants
//! - In memory, `changed` holds exactly the keys changed since the last changelog write, each
//!   with a copy of its value in `values` (`None`: deleted), in the order the keys were first
//!   changed; they are written in that order (the same input writes the same changelog). The
//!   copy spares the write a lookup in `values`, a cache miss per key when keys are many.
//! - On disk, a value is looked up in `open` (changed since the last changelog write), then in
//!   `sealed` (written to the changelog in a transaction not known committed yet), then in the
//!   store; `sealed` holds the last value of every key those transactions wrote, and `written`
//!   every other changelog record of theirs (snapshots, timers), in the order written; both
//!   reach the store only once they commit ([`FoldState::committed`]), with the new checkpoint.
//!   A transaction that does not commit never reaches the store.
//! - Undo (in memory): `undo.open` holds, for every key of `changed` (and no other), its value
//!   just before its first change since the last changelog write (`None`: absent); at a write
//!   those move to `undo.sealed` unless it has the key already, so `undo.sealed` holds, for
//!   every key changed since the last commit known to have succeeded, its value at that commit.
//!   A commit clears `undo.sealed`. Putting back `undo.open`, then `undo.sealed`, returns the
//!   values to the last commit ([`FoldState::roll_back`]); putting back `undo.open` only, to the
//!   last changelog write, for a transaction found committed after all.
//! - On disk, the store holds exactly the committed fold state when `unstored` is `false`:
//!   `open`, `sealed` and `written` are then all uncommitted, and dropping them returns the
//!   state to the last commit. `unstored` is set when a commit found no offset to checkpoint
//!   at and kept its records out of the store.

use std::borrow::Cow;
use std::collections::HashMap;

use parsley_clock::TopicId;
use parsley_stage::changelog::{STATE_PREFIX, StateBytes, StateMap, heap_bytes, state_bytes};

use crate::error::Result;
use crate::output::ChangelogWriter;
use crate::state_store::{Checkpoint, TaskStore, now_ms};

/// Changelog records: key and value (`None`: a tombstone).
pub type Records = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Changes of fold state by key (`None`: deleted), hashed as [`StateMap`] hashes keys.
type Changes = HashMap<StateBytes, Option<StateBytes>, foldhash::quality::RandomState>;

/// The values keys had before their changes (module docs: undo), by key (`None`: absent).
#[derive(Default)]
pub struct Undo {
    /// Keys changed since the last changelog write: their values at that write.
    open: Changes,
    /// Keys changed in the transactions written and not known committed: their values at the
    /// last commit.
    sealed: Changes,
}

/// What became of the transaction a task last wrote its changelog in, when its commit was not
/// confirmed to the task ([`FoldState::roll_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// Nothing was written since the last commit, or it was aborted: it is undone.
    Aborted,
    /// It committed after all: it is kept.
    Committed,
}

/// Changes of in-memory fold state by key (`None`: deleted), in the order first changed.
type OrderedChanges =
    indexmap::IndexMap<StateBytes, Option<StateBytes>, foldhash::quality::RandomState>;

/// A task's fold state by key bytes.
pub enum FoldState {
    /// On the heap.
    Memory {
        /// The values by key.
        values: StateMap,
        /// Keys changed since the last changelog write, with their values (module docs).
        changed: OrderedChanges,
        /// The values before those changes (module docs).
        undo: Box<Undo>,
    },
    /// In the stage's state store.
    Disk(Box<DiskFold>),
}

/// Fold state in a state store, and what is not in it yet.
pub struct DiskFold {
    store: TaskStore,
    /// The changelog topic's id, for the checkpoint.
    changelog: TopicId,
    /// Changes since the last changelog write (`None`: deleted).
    open: Changes,
    /// Changes written to the changelog in transactions not known committed yet.
    sealed: Changes,
    /// Every other changelog record of those transactions (not fold state), in order (full
    /// changelog keys).
    written: Records,
    /// Some of `written` committed and is not in the store yet (module docs).
    unstored: bool,
    /// The bytes of `written` ([`FoldState::memory_bytes`]).
    written_bytes: usize,
}

impl FoldState {
    /// Fold state on the heap, holding `values`.
    pub fn memory(values: StateMap) -> Self {
        FoldState::Memory {
            values,
            changed: OrderedChanges::default(),
            undo: Box::default(),
        }
    }

    /// Fold state in `store`, the keyspace of a task of the stage whose changelog topic is
    /// `changelog`, restored up to its checkpoint.
    pub fn disk(store: TaskStore, changelog: TopicId) -> Self {
        FoldState::Disk(Box::new(DiskFold {
            store,
            changelog,
            open: Changes::default(),
            sealed: Changes::default(),
            written: Vec::new(),
            unstored: false,
            written_bytes: 0,
        }))
    }

    /// The fold state of key `k`.
    ///
    /// # Errors
    /// A failed read of the state store.
    pub fn get(&self, k: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        match self {
            FoldState::Memory { values, .. } => Ok(values.get(k).map(|v| Cow::Borrowed(&v[..]))),
            FoldState::Disk(d) => {
                if let Some(v) = d.open.get(k).or_else(|| d.sealed.get(k)) {
                    return Ok(v.as_deref().map(Cow::Borrowed));
                }
                Ok(d.store.get(k)?.map(Cow::Owned))
            }
        }
    }

    /// Every key's fold state now, in key-byte order (an interactive query's `all`): on disk,
    /// the store's keys overlaid with the changes not in it yet.
    ///
    /// # Errors
    /// A failed read of the state store.
    pub fn entries(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match self {
            FoldState::Memory { values, .. } => {
                let mut all: Vec<_> = values
                    .iter()
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .collect();
                all.sort_unstable();
                Ok(all)
            }
            FoldState::Disk(d) => {
                let mut all: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>> = d
                    .store
                    .state_entries()?
                    .into_iter()
                    .map(|(k, v)| (k, Some(v)))
                    .collect();
                for changes in [&d.sealed, &d.open] {
                    for (k, v) in changes {
                        all.insert(k.to_vec(), v.as_ref().map(|v| v.to_vec()));
                    }
                }
                Ok(all
                    .into_iter()
                    .filter_map(|(k, v)| v.map(|v| (k, v)))
                    .collect())
            }
        }
    }

    /// Sets (`Some`) or deletes (`None`) the fold state of key `k`.
    pub fn set(&mut self, k: &[u8], value: Option<Vec<u8>>) {
        match self {
            FoldState::Memory {
                values,
                changed,
                undo,
            } => {
                // A key changed again keeps its bytes and its place, and its value's buffer
                // when it has one.
                match (changed.get_mut(k), value.as_deref()) {
                    (Some(Some(copy)), Some(v)) => {
                        copy.clear();
                        copy.extend_from_slice(v);
                    }
                    (Some(copy), v) => *copy = v.map(StateBytes::from_slice),
                    (None, v) => {
                        // Its first change since the last write: its value before, to undo.
                        undo.open
                            .insert(StateBytes::from_slice(k), values.get(k).cloned());
                        changed.insert(StateBytes::from_slice(k), v.map(StateBytes::from_slice));
                    }
                }
                // A key already present keeps its bytes: no copy of it per change.
                match (value, values.get_mut(k)) {
                    (Some(v), Some(old)) => *old = state_bytes(v),
                    (Some(v), None) => {
                        values.insert(StateBytes::from_slice(k), state_bytes(v));
                    }
                    (None, _) => {
                        values.remove(k);
                    }
                }
            }
            FoldState::Disk(d) => {
                d.open
                    .insert(StateBytes::from_slice(k), value.map(state_bytes));
            }
        }
    }

    /// Keys with fold state (on disk: approximately, committed keys only).
    pub fn len(&self) -> usize {
        match self {
            FoldState::Memory { values, .. } => values.len(),
            FoldState::Disk(d) => d.store.approximate_keys(),
        }
    }

    /// No key has fold state ([`FoldState::len`] is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, when they live on the heap (the test driver reads them).
    pub fn in_memory(&self) -> Option<&StateMap> {
        match self {
            FoldState::Memory { values, .. } => Some(values),
            FoldState::Disk(_) => None,
        }
    }

    /// Whether the changelog records a task writes must also reach the store once committed
    /// ([`FoldState::seal`]).
    pub fn on_disk(&self) -> bool {
        matches!(self, FoldState::Disk(_))
    }

    /// Writes the changelog record of every key changed since the last write (key
    /// `0x00 ++ k`, a tombstone for a deleted key); returns how many.
    ///
    /// # Errors
    /// The writer's.
    pub fn write_changes(&mut self, writer: &mut dyn ChangelogWriter) -> Result<usize> {
        let mut key = vec![STATE_PREFIX];
        let mut written = 0;
        match self {
            FoldState::Memory { changed, undo, .. } => {
                for (k, v) in changed.drain(..) {
                    key.truncate(1);
                    key.extend_from_slice(&k);
                    writer.write(&key, v.as_deref())?;
                    written += 1;
                }
                let Undo { open, sealed } = &mut **undo;
                for (k, v) in open.drain() {
                    sealed.entry(k).or_insert(v);
                }
            }
            FoldState::Disk(d) => {
                for (k, v) in std::mem::take(&mut d.open) {
                    key.truncate(1);
                    key.extend_from_slice(&k);
                    writer.write(&key, v.as_deref())?;
                    d.sealed.insert(k, v);
                    written += 1;
                }
            }
        }
        Ok(written)
    }

    /// Keeps `records`, the changelog records other than fold state just written in the open
    /// transaction, until it commits (on disk; nothing in memory). The fold state's records
    /// are kept by [`FoldState::write_changes`].
    pub fn seal(&mut self, records: Records) {
        if let FoldState::Disk(d) = self {
            d.written_bytes += records.iter().map(record_bytes).sum::<usize>();
            d.written.extend(records);
        }
    }

    /// The transactions written so far committed, and every changelog record of this task
    /// below offset `next` (the one after its last write, from the delivery reports) is
    /// committed: on disk, their records go to the store with checkpoint `next`.
    ///
    /// # Errors
    /// A failed write of the state store.
    pub fn committed(&mut self, next: Option<i64>) -> Result<()> {
        let d = match self {
            FoldState::Memory { undo, .. } => {
                undo.sealed.clear();
                return Ok(());
            }
            FoldState::Disk(d) => d,
        };
        if !d.pending() {
            return Ok(());
        }
        let Some(offset) = next else {
            // No delivery report named an offset: nothing to checkpoint at; keep them (a
            // lookup still finds them) until one does.
            d.unstored = true;
            return Ok(());
        };
        d.store.write_with_state(
            d.sealed.iter().map(|(k, v)| (&k[..], v.as_deref())),
            d.written.iter().map(|(k, v)| (k.as_slice(), v.as_deref())),
            Checkpoint {
                topic: d.changelog,
                offset,
                written_ms: now_ms(),
            },
        )?;
        d.written.clear();
        d.written_bytes = 0;
        d.sealed.clear();
        d.unstored = false;
        Ok(())
    }

    /// Returns the fold state to the last commit, `sealed` telling what became of the
    /// transaction last written (module docs: undo), as a restore of the committed changelog
    /// would build it: nothing changed since. `false` when that cannot be done here (on disk:
    /// committed records not in the store yet, or a written transaction found committed);
    /// the state is then left to a restore from the changelog.
    pub fn roll_back(&mut self, sealed: Sealed) -> bool {
        match self {
            FoldState::Memory {
                values,
                changed,
                undo,
            } => {
                changed.clear();
                let Undo {
                    open,
                    sealed: at_commit,
                } = &mut **undo;
                let put_back = |values: &mut StateMap, undo: &mut Changes| {
                    for (k, v) in undo.drain() {
                        match v {
                            Some(v) => values.insert(k, v),
                            None => values.remove(&k),
                        };
                    }
                };
                put_back(values, open);
                match sealed {
                    Sealed::Aborted => put_back(values, at_commit),
                    Sealed::Committed => at_commit.clear(),
                }
                true
            }
            FoldState::Disk(d) => {
                if d.unstored || (sealed == Sealed::Committed && d.pending()) {
                    return false;
                }
                d.open.clear();
                d.sealed.clear();
                d.written.clear();
                d.written_bytes = 0;
                true
            }
        }
    }
}

impl DiskFold {
    /// Records written to the changelog and not in the store yet.
    fn pending(&self) -> bool {
        !self.sealed.is_empty() || !self.written.is_empty()
    }
}

/// The heap bytes of one kept changelog record: its vectors and their buffers.
fn record_bytes((k, v): &(Vec<u8>, Option<Vec<u8>>)) -> usize {
    std::mem::size_of::<(Vec<u8>, Option<Vec<u8>>)>() + k.len() + v.as_ref().map_or(0, Vec::len)
}

/// One entry of a map of fold state: key, value and the table's control byte. Keys and
/// values up to 16 bytes are inline ([`StateBytes`]).
const ENTRY_BYTES: usize = std::mem::size_of::<(StateBytes, Option<StateBytes>)>() + 1;
/// What a changelog record kept for the store costs, estimated before it is written: its
/// vectors and 16 bytes each of key and value.
const WRITTEN_BYTES: usize = std::mem::size_of::<(Vec<u8>, Option<Vec<u8>>)>() + 32;

impl FoldState {
    /// An estimate of the heap bytes this fold state holds, for the memory bound (module
    /// `memory`): in memory, the value table at its capacity and an entry per key changed
    /// since the last commit (the copies to write and to undo); on disk, an entry per change
    /// not in the store yet and the changelog records kept for it (for a change not written
    /// yet, an estimate of its record). Keys and values longer than 16 bytes keep buffers of
    /// their own, counted from a sample of each table ([`heap_bytes`]).
    pub fn memory_bytes(&self) -> u64 {
        fn changes(c: &Changes) -> u64 {
            heap_bytes(c.len(), c.iter().map(|(k, v)| (k, v.as_ref())))
        }
        match self {
            FoldState::Memory {
                values,
                changed,
                undo,
            } => {
                let entries =
                    values.capacity() + changed.len() + undo.open.len() + undo.sealed.len();
                (entries * ENTRY_BYTES) as u64
                    + heap_bytes(values.len(), values.iter().map(|(k, v)| (k, Some(v))))
                    + heap_bytes(changed.len(), changed.iter().map(|(k, v)| (k, v.as_ref())))
                    + changes(&undo.open)
                    + changes(&undo.sealed)
            }
            // A change not written yet is counted with the changelog record it will keep.
            FoldState::Disk(d) => {
                (d.open.len() * (ENTRY_BYTES + WRITTEN_BYTES)
                    + d.sealed.len() * ENTRY_BYTES
                    + d.written_bytes) as u64
                    + changes(&d.open)
                    + changes(&d.sealed)
            }
        }
    }
}

/// A changelog writer that keeps a copy of every record it writes.
pub struct Tee<'a> {
    pub inner: &'a mut dyn ChangelogWriter,
    /// The copies; `None`: keep none.
    pub copies: Option<Records>,
}

impl ChangelogWriter for Tee<'_> {
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.inner.write(key, value)?;
        if let Some(c) = &mut self.copies {
            c.push((key.to_vec(), value.map(<[u8]>::to_vec)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what it is asked to write.
    #[derive(Default)]
    struct Recorder(Records);

    impl ChangelogWriter for Recorder {
        fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
            self.0.push((key.to_vec(), value.map(<[u8]>::to_vec)));
            Ok(())
        }
    }

    fn entry(k: &[u8], v: Option<&[u8]>) -> (Vec<u8>, Option<Vec<u8>>) {
        let mut key = vec![STATE_PREFIX];
        key.extend_from_slice(k);
        (key, v.map(<[u8]>::to_vec))
    }

    #[test]
    fn memory_bytes_count_the_buffers_of_values_longer_than_sixteen_bytes() {
        let mut fold = FoldState::memory(StateMap::default());
        fold.set(b"short", Some(vec![1; 8]));
        let inline = fold.memory_bytes();
        let mut long = FoldState::memory(StateMap::default());
        long.set(b"short", Some(vec![1; 1_000]));
        // The table and the change and undo entries alike; the value's buffer twice, in the
        // table and in the change to write.
        assert_eq!(long.memory_bytes(), inline + 2_000);
    }

    #[test]
    fn in_memory_each_changed_key_is_written_once_in_first_change_order_with_its_last_value() {
        let mut values = StateMap::default();
        values.insert(b"gone"[..].into(), b"old"[..].into());
        values.insert(b"kept"[..].into(), b"same"[..].into());
        let mut fold = FoldState::memory(values);
        fold.set(b"b", Some(b"1".to_vec()));
        fold.set(b"a", Some(b"1".to_vec()));
        fold.set(b"b", Some(b"22".to_vec()));
        fold.set(b"gone", None);
        fold.set(b"c", Some(b"1".to_vec()));
        fold.set(b"c", None);
        fold.set(b"d", None);
        fold.set(b"d", Some(b"4".to_vec()));

        let mut first = Recorder::default();
        fold.write_changes(&mut first).unwrap();
        assert_eq!(
            first.0,
            vec![
                entry(b"b", Some(b"22")),
                entry(b"a", Some(b"1")),
                entry(b"gone", None),
                entry(b"c", None),
                entry(b"d", Some(b"4")),
            ]
        );
        let mut second = Recorder::default();
        fold.write_changes(&mut second).unwrap();
        assert!(second.0.is_empty(), "nothing changed since: {:?}", second.0);
        // The order starts again after a write.
        fold.set(b"z", Some(b"9".to_vec()));
        fold.set(b"b", Some(b"23".to_vec()));
        fold.set(b"z", Some(b"10".to_vec()));
        let mut third = Recorder::default();
        fold.write_changes(&mut third).unwrap();
        assert_eq!(
            third.0,
            vec![entry(b"z", Some(b"10")), entry(b"b", Some(b"23"))]
        );
        fold.set(b"b", Some(b"22".to_vec()));
        fold.write_changes(&mut Recorder::default()).unwrap();

        let values = fold.in_memory().unwrap();
        let mut state: Vec<_> = values
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        state.sort();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = [
            (&b"a"[..], &b"1"[..]),
            (b"b", b"22"),
            (b"d", b"4"),
            (b"kept", b"same"),
            (b"z", b"10"),
        ]
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
        assert_eq!(state, expected);
        assert_eq!(fold.get(b"b").unwrap().as_deref(), Some(&b"22"[..]));
        assert_eq!(fold.get(b"gone").unwrap(), None);
    }
}
