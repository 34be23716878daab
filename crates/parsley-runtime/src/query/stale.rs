//! Stale reads: interactive queries that also read the standbys this instance keeps
//! ([`ReadOnlyStore::stale_ok`]), as Kafka Streams' `StoreQueryParameters.enableStaleStores`
//! with the lag its `allLocalStorePartitionLags` reports.
//!
//! A [`StaleStore`] files its reads as a [`ReadOnlyStore`] does, and the stream threads answer
//! them at the end of a turn. A key's task that a thread runs is read as by
//! [`ReadOnlyStore::get`]; a key's task that no thread here runs is read from the process's
//! standby of it, under the lock the standbys' own changelog reads take (module
//! `stage::tasks::standby`), and the answer carries where the standby stood: the next
//! changelog offset it reads and its lag behind the changelog partition's high watermark as its
//! consumer last fetched it ([`Source::Standby`]).
//!
//! Invariants:
//! - every value read says where it came from ([`Source`]); a task that runs here is always
//!   read over its standby (a standby of a task that runs here exists only while the task is
//!   handed over, and then the owner's entries win in [`StaleStore::all`]);
//! - a standby's value is the task's committed state as of its position: the changelog is read
//!   `read_committed`, so it never shows a transaction that may abort; an owner's value may
//!   (read-uncommitted, module docs of `query`);
//! - a standby's lag is the figure of the standbys' metrics (`StandbyMetrics::lag`, the gauge
//!   `parsley_standby_lag_offsets`), taken when the read is answered;
//! - [`StaleStore::get_at_least`] never answers from a standby: a stamp claims offsets of the
//!   stage's inputs, and a standby follows the task's changelog
//!   ([`QueryError::StandbyCannotWait`]);
//! - while any task of the stage restores on this instance, every read fails with
//!   [`QueryError::Restoring`], as an owned read does: the thread that restores answers no
//!   query until its restore ends. A standby that has not caught up is read, with its lag.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeBounds;
use std::time::{Duration, Instant};

use parsley_clock::Clock;
use parsley_task::metrics::StandbyMetrics;
use parsley_task::query::{AtLeast, Entries, StandbyAt, StoreAnswer, StoreQuery};

use super::{QueryError, ReadOnlyStore};

/// Where a stale read's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A task this instance runs: the value its last delivered record left, committed or not
    /// yet (as [`ReadOnlyStore::get`]).
    Owner,
    /// This instance's standby of the task: the task's committed state, its changelog read
    /// `read_committed` up to `position`.
    Standby {
        /// The next changelog offset the standby reads (offsets, i64): every record below it
        /// is applied.
        position: i64,
        /// Changelog offsets between the partition's high watermark, as the standby's consumer
        /// last fetched it, and `position` (i64, at least 0); commit markers count, and the
        /// records of a transaction still open on the partition count as lag. `None` before
        /// the consumer's first fetch response. The figure of
        /// [`StandbyMetrics::lag`] and of the gauge `parsley_standby_lag_offsets`.
        lag: Option<i64>,
    },
}

impl Source {
    /// The source of a value read from the standby that stood at `at`.
    fn standby(at: StandbyAt) -> Self {
        Source::Standby {
            position: at.position,
            lag: at.lag(),
        }
    }
}

/// One key read by [`StaleStore::get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read<V> {
    /// The key's value in the copy read; `None` when it has none there.
    pub value: Option<V>,
    /// The key's task (partition).
    pub partition: i32,
    /// Where the value came from.
    pub source: Source,
}

/// The keys read by [`StaleStore::all`] and [`StaleStore::range`], each with its task, and
/// every task read with its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleEntries<K, V> {
    /// `(task, key, value)`: for `all` by task then key bytes, for `range` in `K`'s order.
    pub entries: Vec<(i32, K, V)>,
    /// Every task read (those without a key in the answer too), by partition, with its
    /// source: the owner's lag is none, a standby's is its own.
    pub tasks: BTreeMap<i32, Source>,
}

impl<K, V> StaleEntries<K, V> {
    /// The largest lag among the standbys read (offsets, i64): `Some(0)` when every task read
    /// runs here or its standby is at its end; `None` when a standby's lag is not known yet.
    pub fn max_lag(&self) -> Option<i64> {
        self.tasks.values().try_fold(0, |max, source| match source {
            Source::Owner => Some(max),
            Source::Standby { lag, .. } => lag.map(|lag| lag.max(max)),
        })
    }
}

/// A view of a store whose reads also cover this instance's standbys (module docs), from
/// [`ReadOnlyStore::stale_ok`]. Cheap to clone; usable from any thread.
#[derive(Debug)]
pub struct StaleStore<K, V> {
    store: ReadOnlyStore<K, V>,
}

impl<K, V> Clone for StaleStore<K, V> {
    fn clone(&self) -> Self {
        StaleStore {
            store: self.store.clone(),
        }
    }
}

impl<K, V> StaleStore<K, V> {
    /// The stale view of `store`.
    pub(super) fn new(store: ReadOnlyStore<K, V>) -> Self {
        StaleStore { store }
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        self.store.name()
    }

    /// The value of `key` now, from the task that runs here when one does, else from this
    /// instance's standby of it, with its source ([`Read`]).
    ///
    /// # Errors
    /// [`QueryError::NotOwned`] when the key's task neither runs here nor has a standby here;
    /// [`QueryError::Restoring`], [`QueryError::Key`], [`QueryError::Decode`],
    /// [`QueryError::State`], [`QueryError::StageEnded`], [`QueryError::NoAnswer`].
    pub fn get(&self, key: &K) -> Result<Read<V>, QueryError> {
        let key = self.store.encode(key)?;
        let query = StoreQuery::GetStale {
            key,
            at_least: None,
        };
        match self.store.ask(query, Duration::ZERO)? {
            StoreAnswer::Stale {
                partition,
                value,
                standby,
            } => Ok(Read {
                value: match value {
                    Some(state) => self.store.value_of(&state)?,
                    None => None,
                },
                partition,
                source: standby.map_or(Source::Owner, Source::standby),
            }),
            other => Err(self.store.unexpected(other)),
        }
    }

    /// [`ReadOnlyStore::get_at_least`]: the value of `key` once the task that runs here has
    /// delivered everything `stamp` claims, waiting at most `timeout`. Never from a standby
    /// (module docs).
    ///
    /// # Errors
    /// [`QueryError::StandbyCannotWait`] when the key's task is only a standby here;
    /// otherwise as [`ReadOnlyStore::get_at_least`].
    pub fn get_at_least(
        &self,
        key: &K,
        stamp: &Clock,
        timeout: Duration,
    ) -> Result<Option<V>, QueryError> {
        let key = self.store.encode(key)?;
        let at_least = Some(AtLeast {
            stamp: stamp.clone(),
            deadline: Instant::now() + timeout,
        });
        match self
            .store
            .ask(StoreQuery::GetStale { key, at_least }, timeout)?
        {
            StoreAnswer::Stale {
                value,
                standby: None,
                ..
            } => match value {
                Some(state) => self.store.value_of(&state),
                None => Ok(None),
            },
            StoreAnswer::Short { partition, short } => {
                Err(self.store.not_caught_up(partition, short, timeout))
            }
            other => Err(self.store.unexpected(other)),
        }
    }

    /// Every key with a value in the tasks that run here and in this instance's standbys,
    /// with its task and value, by task then key bytes; and the source of every task read.
    ///
    /// # Errors
    /// [`QueryError::Restoring`], [`QueryError::Decode`], [`QueryError::State`],
    /// [`QueryError::StageEnded`], [`QueryError::NoAnswer`].
    pub fn all(&self) -> Result<StaleEntries<K, V>, QueryError> {
        match self
            .store
            .ask(StoreQuery::AllStale { standbys: true }, Duration::ZERO)?
        {
            StoreAnswer::StaleEntries {
                entries,
                owned,
                standbys,
            } => {
                let mut out = Vec::with_capacity(entries.len());
                for (partition, key, state) in entries {
                    if let Some(value) = self.store.value_of(&state)? {
                        out.push((partition, self.store.key_of(&key)?, value));
                    }
                }
                let mut tasks: BTreeMap<i32, Source> =
                    owned.into_iter().map(|p| (p, Source::Owner)).collect();
                tasks.extend(standbys.into_iter().map(|(p, at)| (p, Source::standby(at))));
                Ok(StaleEntries {
                    entries: out,
                    tasks,
                })
            }
            other => Err(self.store.unexpected(other)),
        }
    }

    /// The keys in `range` among [`StaleStore::all`]'s, in `K`'s order; `tasks` lists every
    /// task read.
    ///
    /// # Errors
    /// As [`StaleStore::all`].
    pub fn range(&self, range: impl RangeBounds<K>) -> Result<StaleEntries<K, V>, QueryError>
    where
        K: Ord,
    {
        let mut all = self.all()?;
        all.entries.retain(|(_, k, _)| range.contains(k));
        all.entries.sort_by(|a, b| a.1.cmp(&b.1));
        Ok(all)
    }

    /// The task (partition) that owns `key`: [`ReadOnlyStore::task_of`].
    ///
    /// # Errors
    /// As [`ReadOnlyStore::task_of`].
    pub fn task_of(&self, key: &K) -> Result<i32, QueryError> {
        self.store.task_of(key)
    }

    /// The standbys of the store's stage on this instance, by partition, each with its
    /// position and lag as last published (at most every 200 ms): the figures of
    /// [`Running::standby_metrics`](crate::Running::standby_metrics) for this store's stage.
    pub fn standbys(&self) -> Vec<StandbyMetrics> {
        self.store.metrics.standbys()
    }
}

/// The stale entries the stream threads answered, put together ([`StaleParts::finish`]).
#[derive(Debug, Default)]
pub(super) struct StaleParts {
    /// Entries of tasks a thread runs.
    owned_entries: Entries,
    owned: BTreeSet<i32>,
    /// Entries of standbys.
    standby_entries: Entries,
    standbys: BTreeMap<i32, StandbyAt>,
}

impl StaleParts {
    /// Adds one thread's answer: `entries` of the tasks `owned` it runs and of the standbys
    /// `standbys` it read.
    pub(super) fn add(
        &mut self,
        entries: Entries,
        owned: Vec<i32>,
        standbys: Vec<(i32, StandbyAt)>,
    ) {
        let owned: BTreeSet<i32> = owned.into_iter().collect();
        for entry in entries {
            if owned.contains(&entry.0) {
                self.owned_entries.push(entry);
            } else {
                self.standby_entries.push(entry);
            }
        }
        self.owned.extend(owned);
        self.standbys.extend(standbys);
    }

    /// Every thread's answer as one: a task a thread runs wins over a standby of it (a task
    /// handed over between two threads' answers); entries by task then key bytes.
    pub(super) fn finish(self) -> StoreAnswer {
        let owned = self.owned;
        let mut entries = self.owned_entries;
        entries.extend(
            self.standby_entries
                .into_iter()
                .filter(|(p, ..)| !owned.contains(p)),
        );
        entries.sort_unstable_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        StoreAnswer::StaleEntries {
            entries,
            standbys: self
                .standbys
                .into_iter()
                .filter(|(p, _)| !owned.contains(p))
                .collect(),
            owned: owned.into_iter().collect(),
        }
    }
}

#[cfg(test)]
#[path = "stale_tests.rs"]
mod tests;
