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
//!   store; `written` holds every changelog record of those transactions, in the order written,
//!   and reaches the store only once they commit ([`FoldState::committed`]), with the new
//!   checkpoint. A transaction that does not commit never reaches the store: the task is
//!   rebuilt from the changelog and the store's checkpoint.

use std::borrow::Cow;
use std::collections::HashMap;

use parsley_clock::TopicId;
use parsley_stage::changelog::{STATE_PREFIX, StateBytes, StateMap, state_bytes};

use crate::error::Result;
use crate::output::ChangelogWriter;
use crate::state_store::{Checkpoint, TaskStore, now_ms};

/// Changelog records: key and value (`None`: a tombstone).
pub type Records = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Changes of fold state by key (`None`: deleted), hashed as [`StateMap`] hashes keys.
type Changes = HashMap<StateBytes, Option<StateBytes>, foldhash::quality::RandomState>;

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
    /// Every changelog record of those transactions, in order (full changelog keys).
    written: Records,
}

impl FoldState {
    /// Fold state on the heap, holding `values`.
    pub fn memory(values: StateMap) -> Self {
        FoldState::Memory {
            values,
            changed: OrderedChanges::default(),
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
            FoldState::Memory { values, changed } => {
                // A key changed again keeps its bytes and its place, and its value's buffer
                // when it has one.
                match (changed.get_mut(k), value.as_deref()) {
                    (Some(Some(copy)), Some(v)) => {
                        copy.clear();
                        copy.extend_from_slice(v);
                    }
                    (Some(copy), v) => *copy = v.map(StateBytes::from_slice),
                    (None, v) => {
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
    /// `0x00 ++ k`, a tombstone for a deleted key).
    ///
    /// # Errors
    /// The writer's.
    pub fn write_changes(&mut self, writer: &mut dyn ChangelogWriter) -> Result<()> {
        let mut key = vec![STATE_PREFIX];
        match self {
            FoldState::Memory { changed, .. } => {
                for (k, v) in changed.drain(..) {
                    key.truncate(1);
                    key.extend_from_slice(&k);
                    writer.write(&key, v.as_deref())?;
                }
            }
            FoldState::Disk(d) => {
                for (k, v) in std::mem::take(&mut d.open) {
                    key.truncate(1);
                    key.extend_from_slice(&k);
                    writer.write(&key, v.as_deref())?;
                    d.sealed.insert(k, v);
                }
            }
        }
        Ok(())
    }

    /// Keeps `records`, the changelog records just written in the open transaction, until it
    /// commits (on disk; nothing in memory).
    pub fn seal(&mut self, records: Records) {
        if let FoldState::Disk(d) = self {
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
        let FoldState::Disk(d) = self else {
            return Ok(());
        };
        if d.written.is_empty() {
            return Ok(());
        }
        let Some(offset) = next else {
            // No delivery report named an offset: nothing to checkpoint at; keep them (a
            // lookup still finds them) until one does.
            return Ok(());
        };
        d.store.write(
            d.written.iter().map(|(k, v)| (k.as_slice(), v.as_deref())),
            Checkpoint {
                topic: d.changelog,
                offset,
                written_ms: now_ms(),
            },
        )?;
        d.written.clear();
        d.sealed.clear();
        Ok(())
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
