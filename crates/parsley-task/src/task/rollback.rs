//! Returning a task to its last commit in memory, after an abort, without reading its
//! changelog: what a restore of the committed changelog would build, rebuilt from what the
//! task kept ([`rebuild_task`](super::rebuild_task) then does the rest, as after a read).
//!
//! A task keeps an image of its changelog partition at its last commit: everything a restore
//! folds ([`Restored`]) but the fold state, taken from the restore that built it and moved
//! forward by the records of each transaction once it commits ([`Task::committed`]). The fold
//! state keeps, instead of a copy, the values its changed keys had at the last commit (module
//! `fold`: undo). The records a task wrote in a transaction whose commit it has not heard of
//! yet are kept aside (`Image::pending`): the stream thread may take the next transaction's
//! work while that commit is in flight, and an abort returns to the last commit that
//! succeeded.
//!
//! When the task has not heard whether its last written transaction committed (the commit
//! failed, stalled or was given up), the group's committed offsets, read once the
//! transaction is resolved, tell: the changelog and the offsets commit together, so the
//! offsets name the snapshot that committed ([`Task::sealed_outcome`]). Where they cannot tell
//! (both snapshots name the same offsets, or the transaction wrote no snapshot for the task),
//! the caller restores from the changelog.
//!
//! # Invariants
//! - `Image::restored`, folded with `Image::pending` when that transaction committed, is what
//!   [`Restored::apply`] folds from the task's committed changelog partition, fold state aside
//!   (`state_elsewhere`), with no record counted.
//! - `Image::pending` holds exactly the records, other than fold state, written since the last
//!   [`Task::committed`], and how many fold-state records were (`None`: no changelog write
//!   since).
//! - A task not built by [`rebuild_task`](super::rebuild_task) has no image, and is never
//!   rolled back in memory.

use parsley_clock::Channel;
use parsley_stage::changelog::{META_KEY, Restored, TaskSnapshot};

use super::fold::{Records, Sealed};
use super::{FoldState, Task};
use crate::context::TaskContext;

/// A task's image of its changelog at its last commit (module docs).
#[derive(Default)]
pub(super) struct Image {
    /// What the committed changelog folds to, fold state aside; `None`: not known.
    restored: Option<Box<Restored>>,
    /// Parsley's own records written since the last commit the task heard of, and how many
    /// fold-state records.
    pending: Option<(Records, usize)>,
}

impl Image {
    /// The image of a task restored from `restored` (what its changelog folded to).
    pub(super) fn of(restored: &Restored) -> Self {
        Image {
            restored: Some(Box::new(restored.image())),
            pending: None,
        }
    }

    /// `records`, and `state` fold-state records, were written in the open transaction.
    pub(super) fn written(&mut self, records: Records, state: usize) {
        if self.restored.is_some() {
            let pending = self.pending.get_or_insert_with(Default::default);
            pending.0.extend(records);
            pending.1 += state;
        }
    }

    /// The transactions written so far committed: their records join the image. A record
    /// that does not fold (never one the task wrote) leaves the image unknown.
    pub(super) fn committed(&mut self) {
        let Some((pending, _)) = self.pending.take() else {
            return;
        };
        if let Some(restored) = &mut self.restored
            && fold(restored, &pending).is_err()
        {
            self.restored = None;
        }
    }

    /// The snapshot written since the last commit, if the transaction wrote records: `Ok(None)`
    /// when it wrote none, `Err(())` when it wrote records but no snapshot that decodes.
    fn pending_snapshot(&self) -> Result<Option<TaskSnapshot>, ()> {
        let Some((pending, _)) = self
            .pending
            .as_ref()
            .filter(|(records, state)| !records.is_empty() || *state > 0)
        else {
            return Ok(None);
        };
        let value = pending
            .iter()
            .rev()
            .find(|(k, _)| k == META_KEY)
            .and_then(|(_, v)| v.as_deref())
            .ok_or(())?;
        TaskSnapshot::decode(value).map(Some).map_err(|_| ())
    }
}

/// Folds `records` into `restored`, in order.
fn fold(restored: &mut Restored, records: &Records) -> Result<(), String> {
    for (key, value) in records {
        restored.apply(key, value.as_deref())?;
    }
    restored.records = 0;
    Ok(())
}

/// A task at its last commit, as a restore of its changelog would find it: what the changelog
/// folds to (fold state aside), and the fold state. [`rebuild_task`](super::rebuild_task)
/// builds the task from them.
pub struct LastCommit {
    /// The changelog's fold, without the fold state (`state_elsewhere`).
    pub restored: Restored,
    /// The fold state at the last commit.
    pub fold: FoldState,
}

impl Task {
    /// What became of the transaction this task last wrote its changelog in, judged by the
    /// group's committed offsets `positions` (read once every transaction is resolved; module
    /// docs): [`Sealed::Aborted`] when nothing was written since the last commit, or when the
    /// offsets are the last commit's and not the written snapshot's; [`Sealed::Committed`]
    /// when they are the written snapshot's and not the last commit's. `None` when the task
    /// has no image, when the offsets match neither (the group moved on elsewhere) or both,
    /// or when the transaction wrote records but no snapshot: the caller restores from the
    /// changelog.
    pub fn sealed_outcome(
        &self,
        ctx: &TaskContext,
        positions: &[(Channel, i64)],
    ) -> Option<Sealed> {
        let restored = self.last_commit.restored.as_ref()?;
        let pending = self.last_commit.pending_snapshot().ok()?;
        let fits = |s: &TaskSnapshot| {
            s.offsets
                .iter()
                .filter(|(c, _)| !ctx.is_global(*c) && positions.iter().any(|(p, _)| p == c))
                .all(|named| positions.contains(named))
        };
        let at_commit = restored.snapshot.as_ref().map(fits);
        match (pending.as_ref().map(fits), at_commit) {
            // Nothing written since: a task that never committed starts fresh whatever the
            // offsets say, as a restore would build it.
            (None, None | Some(true)) => Some(Sealed::Aborted),
            (Some(true), Some(false)) => Some(Sealed::Committed),
            (Some(false), Some(true) | None) => Some(Sealed::Aborted),
            _ => None,
        }
    }

    /// The task at its last commit, given what became of the transaction it last wrote
    /// ([`Task::sealed_outcome`]): its image, folded with that transaction's records if it
    /// committed, and its fold state rolled back ([`FoldState::roll_back`]). `None` when the
    /// task has no image or its fold state cannot be rolled back here: the caller restores
    /// from the changelog. The task's refused inputs are not in it: take them first
    /// ([`Task::take_refused`]).
    pub fn into_last_commit(self, sealed: Sealed) -> Option<LastCommit> {
        let Task {
            mut fold,
            last_commit,
            ..
        } = self;
        let mut restored = *last_commit.restored?;
        if sealed == Sealed::Committed
            && let Some((pending, _)) = &last_commit.pending
        {
            fold_or_none(&mut restored, pending)?;
        }
        if !fold.roll_back(sealed) {
            return None;
        }
        Some(LastCommit { restored, fold })
    }
}

/// [`fold`], `None` when a record does not fold.
fn fold_or_none(restored: &mut Restored, records: &Records) -> Option<()> {
    fold(restored, records).ok()
}

#[cfg(test)]
impl Task {
    /// Everything a restore sets of this task, to compare two builds of it; with the clock's
    /// sender id when `sender` (a task that never committed gets a new one at each build).
    pub(crate) fn restored_view(&self, sender: bool) -> String {
        let mut values: Vec<(Vec<u8>, Vec<u8>)> = self
            .fold
            .in_memory()
            .map(|v| v.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect())
            .unwrap_or_default();
        values.sort();
        format!(
            "{:?}",
            (
                self.partition,
                sender.then(|| self.clock.sender()),
                self.clock.next_seq(),
                self.clock.clock(),
                self.gate.snapshot(),
                &self.snapshot_offsets,
                values,
                &self.task_state,
                &self.timers,
                self.event_time.as_ref().map(|e| {
                    let mut late: Vec<(Vec<u8>, u64)> =
                        e.late_by_key().map(|(k, n)| (k.to_vec(), n)).collect();
                    late.sort();
                    let at = (e.watermark(), e.next_parked_time(), e.next_release_time());
                    (at, e.parked(), e.catching_up(), late)
                }),
                (self.position, &self.refused, self.changed),
            )
        )
    }
}
