//! The stage's part of the process's memory bound
//! ([`RuntimeConfig::state_memory_bytes`](crate::RuntimeConfig::state_memory_bytes); module
//! `memory` of `parsley_task`).
//!
//! Once per poll batch, before its backpressure plan, the stream thread reports what its tasks
//! hold ([`Tasks::account_memory`]): the store's cache and memtables, the fold state on the
//! heap and the standbys', and the records held (fetched, not delivered; parked for event
//! time), each record counted at the mean size of the records this stage fetched, besides the
//! records held before the gates for watermark alignment, at the bytes the hold counts. The
//! decision it gets back ([`AtBound`]) shapes the plan (`backpressure::plan_at_bound`); while
//! squeezed the standbys do not read.

use parsley_task::context::TaskContext;
use parsley_task::memory::{AtBound, Holder, MemoryBudget, MemoryShare, StoreMemory, at_bound};
use tracing::{info, warn};

use super::Tasks;

/// What a record held costs besides its key and value: the gate's slot and the payload's
/// fields.
const RECORD_OVERHEAD: u64 = 160;

/// A stage's share of the bound and what it needs to account for it.
pub(crate) struct StageMemory {
    share: MemoryShare,
    /// The store's sizes under the bound: each task's memtable is reserved.
    store: StoreMemory,
    /// Key and value bytes of the records fetched, and how many, for the mean.
    fetched_bytes: u64,
    fetched: u64,
    /// The last decision.
    at: AtBound,
    /// Warned that in-memory fold state alone fills the bound.
    warned: bool,
}

impl StageMemory {
    /// The share of a stage in `budget`.
    pub(crate) fn new(budget: &MemoryBudget) -> Self {
        StageMemory {
            share: budget.share(),
            store: budget.store_memory(),
            fetched_bytes: 0,
            fetched: 0,
            at: AtBound::Free,
            warned: false,
        }
    }

    /// A record of `bytes` key and value bytes was fetched.
    pub(crate) fn fetched(&mut self, bytes: usize) {
        self.fetched_bytes += bytes as u64;
        self.fetched += 1;
    }

    /// What one held record costs, bytes: the mean of those fetched, with its overhead.
    fn record_bytes(&self) -> u64 {
        RECORD_OVERHEAD + self.fetched_bytes.checked_div(self.fetched).unwrap_or(0)
    }

    /// The decision of the last account.
    pub(crate) fn at(&self) -> AtBound {
        self.at
    }

    /// Counts `n` records spilled at the bound.
    pub(crate) fn spilled(&self, ctx: &TaskContext, n: usize) {
        if n > 0 {
            self.share.budget().spilled(n);
            ctx.metrics.memory_spilled(n);
        }
    }
}

impl Tasks {
    /// Reports what the stage holds to its share of the bound and decides what its reading
    /// does ([`AtBound`]); `Free` without a bound.
    pub(crate) fn account_memory(&mut self, ctx: &TaskContext, aligned_bytes: usize) -> AtBound {
        let Some(mut memory) = self.memory.take() else {
            return AtBound::Free;
        };
        let record = memory.record_bytes();
        // The standbys and the state store are the process's, shared by the stage's threads:
        // thread 0 counts them.
        let standby_bytes = if self.thread == 0 {
            self.standbys.memory_bytes()
        } else {
            0
        };
        let mut state = standby_bytes;
        // Records held before the gates for watermark alignment, at their own count of bytes
        // (key, value and their fixed size: module `held`).
        let mut held = aligned_bytes as u64;
        for task in self.tasks.values() {
            state += task.fold().memory_bytes();
            let gate = task.gate();
            let records: usize = gate.consumed().map(|c| gate.held(&c)).sum::<usize>()
                + task.event_time().map_or(0, |e| e.parked());
            held += records as u64 * record;
        }
        // Each thread reserves a full memtable per task it runs, so that a commit's batch
        // lands in room already counted; thread 0 counts the shared cache, and the store's
        // write buffers as fjall counts them (sealed memtables being written out, the
        // standbys' keyspaces, other threads' memtables: conservative) when they are more.
        let store = match &self.stores {
            Some(stores) => {
                let reserved = memory.store.memtable * self.tasks.len() as u64;
                if self.thread == 0 {
                    memory.store.cache + reserved.max(stores.write_buffer_bytes())
                } else {
                    reserved
                }
            }
            None => 0,
        };
        memory.share.set(Holder::Store, store);
        memory.share.set(Holder::State, state);
        memory.share.set(Holder::Held, held);
        let budget = memory.share.budget().clone();
        let was = memory.at;
        memory.at = at_bound(&budget, was == AtBound::Squeeze);
        if memory.at == AtBound::Squeeze && was == AtBound::Free {
            budget.paused();
            ctx.metrics.memory_paused();
            info!(
                used = budget.used(),
                bound = budget.bound(),
                "the state's memory reached its bound: reading pauses until commits release it"
            );
            if self.stores.is_none() && state >= budget.bound() && !memory.warned {
                memory.warned = true;
                warn!(
                    state,
                    bound = budget.bound(),
                    "fold state on the heap alone fills the memory bound and cannot shrink: \
                     the stage reads no more until the bound is raised (or state moves to \
                     disk with RuntimeConfig::state_dir)"
                );
            }
        }
        let mut used = [0; 3];
        for h in Holder::ALL {
            used[h as usize] = memory.share.get(h);
        }
        ctx.metrics.state_memory(used, budget.bound());
        self.memory = Some(memory);
        self.memory.as_ref().map_or(AtBound::Free, StageMemory::at)
    }

    /// Counts a fetched record's key and value bytes for the mean size of held records.
    pub(crate) fn observe_fetched(&mut self, bytes: usize) {
        if let Some(m) = &mut self.memory {
            m.fetched(bytes);
        }
    }

    /// `true` while the bound squeezes the stage: its standbys do not read.
    pub(crate) fn squeezed(&self) -> bool {
        self.memory
            .as_ref()
            .is_some_and(|m| m.at() == AtBound::Squeeze)
    }
}
