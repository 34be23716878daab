//! One memory bound for the state of every stage of a process (Kafka Streams'
//! `statestore.cache.max.bytes` shared by all stream threads, and RocksDB's bounded-memory
//! configuration: one budget for caches and write buffers of all stores).
//!
//! A [`MemoryBudget`] is one accountant shared by all the stages a process runs: each stage
//! holds a [`MemoryShare`] and, once per poll batch, tells it what it holds now, per
//! [`Holder`]; the share charges or releases the difference on the budget (atomics, no lock).
//! The budget's use is the sum over every share of every holder.
//!
//! What a stage does at the bound ([`MemoryBudget::over`]) is the backpressure plan's
//! (module `backpressure`) with every channel taken as full: a channel no in-flight claim
//! needs is **paused**; a channel a claim needs **spills** its untracked held records (they
//! are re-fetched later) and is read on, so a pause never waits for a record only reading
//! could bring. Commits release what the fold state holds for them (on disk: the changes
//! not in the store yet); reading resumes once use is back under the resume mark
//! ([`MemoryBudget::may_resume`], ⅞ of the bound).
//!
//! # Invariants
//! - The budget's use per holder is the sum of the last values every live share reported for
//!   it; a dropped share releases everything it had charged.
//! - Use grows only while reading: a stage over the bound reads only channels an in-flight
//!   claim needs, and what those bring is spilled. So use passes the bound by at most what
//!   one poll batch brings per stage (the accounting is per batch), plus the stubs of
//!   spilled records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What holds memory against the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holder {
    /// The on-disk store's block cache and write buffers (memtables), as sized from the
    /// bound ([`StoreMemory`]).
    Store,
    /// Fold state on the heap: in memory, every key's value; on disk, the changes not in the
    /// store yet.
    State,
    /// Records fetched and not delivered yet: held by the gate, or parked for event time.
    Held,
}

impl Holder {
    /// Every holder, in the order of the metrics.
    pub const ALL: [Holder; 3] = [Holder::Store, Holder::State, Holder::Held];

    /// The `holder` label of the metrics.
    pub fn label(self) -> &'static str {
        match self {
            Holder::Store => "store",
            Holder::State => "state",
            Holder::Held => "held",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The shared accountant.
#[derive(Debug, Default)]
struct Account {
    bound: u64,
    used: [AtomicU64; 3],
    peak: AtomicU64,
    pauses: AtomicU64,
    spills: AtomicU64,
}

impl Account {
    fn total(&self) -> u64 {
        self.used.iter().map(|u| u.load(Ordering::Relaxed)).sum()
    }
}

/// One memory budget shared by every stage of a process (module docs). Cloning shares it.
#[derive(Debug, Clone)]
pub struct MemoryBudget(Arc<Account>);

/// What a budget holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUse {
    /// The bound, bytes.
    pub bound: u64,
    /// Use per holder, bytes, in [`Holder::ALL`]'s order.
    pub used: [u64; 3],
    /// The highest total seen, bytes.
    pub peak: u64,
    /// Times a stage paused reading because the bound was reached.
    pub pauses: u64,
    /// Records spilled because the bound was reached.
    pub spills: u64,
}

impl MemoryUse {
    /// Total use, bytes.
    pub fn total(&self) -> u64 {
        self.used.iter().sum()
    }

    /// Use by `holder`, bytes.
    pub fn of(&self, holder: Holder) -> u64 {
        self.used[holder.index()]
    }
}

impl MemoryBudget {
    /// A budget of `bound` bytes.
    pub fn new(bound: u64) -> Self {
        MemoryBudget(Arc::new(Account {
            bound,
            ..Account::default()
        }))
    }

    /// The bound, bytes.
    pub fn bound(&self) -> u64 {
        self.0.bound
    }

    /// What every share holds now, bytes.
    pub fn used(&self) -> u64 {
        self.0.total()
    }

    /// `true` once use reaches the bound: stages stop reading what they may stop reading.
    pub fn over(&self) -> bool {
        self.used() >= self.0.bound
    }

    /// `true` once use is back under ⅞ of the bound: paused stages read again.
    pub fn may_resume(&self) -> bool {
        self.used() <= self.0.bound - self.0.bound / 8
    }

    /// A new share, holding nothing.
    pub fn share(&self) -> MemoryShare {
        MemoryShare {
            budget: self.clone(),
            held: [0; 3],
        }
    }

    /// Counts a pause of a stage's reading at the bound.
    pub fn paused(&self) {
        self.0.pauses.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` records spilled at the bound.
    pub fn spilled(&self, n: usize) {
        self.0.spills.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A snapshot of use, peak and counters.
    pub fn snapshot(&self) -> MemoryUse {
        let a = &self.0;
        MemoryUse {
            bound: a.bound,
            used: std::array::from_fn(|i| a.used[i].load(Ordering::Relaxed)),
            peak: a.peak.load(Ordering::Relaxed),
            pauses: a.pauses.load(Ordering::Relaxed),
            spills: a.spills.load(Ordering::Relaxed),
        }
    }

    /// How to size a state store opened under this budget ([`StoreMemory::of`]).
    pub fn store_memory(&self) -> StoreMemory {
        StoreMemory::of(self.0.bound)
    }
}

/// One stage's part of a [`MemoryBudget`]: what it reported last, per holder. Dropping it
/// releases it all.
#[derive(Debug)]
pub struct MemoryShare {
    budget: MemoryBudget,
    held: [u64; 3],
}

impl MemoryShare {
    /// The budget this share is part of.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// Reports that the stage holds `bytes` for `holder` now: charges or releases the
    /// difference from the last report.
    pub fn set(&mut self, holder: Holder, bytes: u64) {
        let i = holder.index();
        let was = std::mem::replace(&mut self.held[i], bytes);
        let a = &self.budget.0;
        if bytes >= was {
            a.used[i].fetch_add(bytes - was, Ordering::Relaxed);
            a.peak.fetch_max(a.total(), Ordering::Relaxed);
        } else {
            a.used[i].fetch_sub(was - bytes, Ordering::Relaxed);
        }
    }

    /// What this share reported last for `holder`.
    pub fn get(&self, holder: Holder) -> u64 {
        self.held[holder.index()]
    }
}

impl Drop for MemoryShare {
    fn drop(&mut self) {
        for h in Holder::ALL {
            self.set(h, 0);
        }
    }
}

/// The sizes of a state store opened under a bound: its block cache and its write buffers
/// (fjall's memtables). fjall gives each store (one per stage) its own cache, so the bound is
/// split, not shared: each store takes an eighth of it for its cache (at most 64 MiB, the
/// default without a bound) and a sixty-fourth per task keyspace for its memtable (at least
/// 1 MiB, at most 16 MiB, the default). The store charges its cache's capacity and the
/// memtables it holds now, sealed ones being written out included, to [`Holder::Store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreMemory {
    /// The block cache, bytes.
    pub cache: u64,
    /// One keyspace's memtable, bytes.
    pub memtable: u64,
    /// Every table's filter and index blocks are partitioned and read through the cache, so
    /// that they stay within it (under a bound). Without, fjall keeps the first levels' whole
    /// blocks pinned in memory, outside the cache, and reads the others whole through it.
    pub through_cache: bool,
}

impl StoreMemory {
    /// The default without a bound.
    pub const DEFAULT: StoreMemory = StoreMemory {
        cache: 64 << 20,
        memtable: 16 << 20,
        through_cache: false,
    };

    /// The sizes under a bound of `bound` bytes.
    pub fn of(bound: u64) -> Self {
        StoreMemory {
            cache: (bound / 8).clamp(1 << 20, Self::DEFAULT.cache),
            memtable: (bound / 64).clamp(1 << 20, Self::DEFAULT.memtable),
            through_cache: true,
        }
    }
}

/// What a stage does with its reading at the bound, given whether it is over the bound and
/// whether it paused for it before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtBound {
    /// Under the bound: the per-channel cap alone decides.
    Free,
    /// Over the bound (or not yet back under the resume mark): every channel is taken as
    /// full — paused, or spilled when a claim needs it read.
    Squeeze,
}

/// The decision for a stage ([`AtBound`]): over the bound it squeezes; once squeezing, it
/// keeps on until use is back under the resume mark.
pub fn at_bound(budget: &MemoryBudget, squeezing: bool) -> AtBound {
    if budget.over() || (squeezing && !budget.may_resume()) {
        AtBound::Squeeze
    } else {
        AtBound::Free
    }
}

#[cfg(test)]
mod tests;
