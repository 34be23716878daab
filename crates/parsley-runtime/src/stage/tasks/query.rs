//! The tasks' side of interactive queries (`crate::query`): between two turns, the stream
//! thread takes the requests callers filed with the stage (`parsley_task::query`) and answers
//! them from its tasks' fold state; a read that waits for a stamp stays here until the
//! owning task's gate has delivered what the stamp claims on its channels, or until its
//! deadline. A stale read of a key whose task the thread does not run is answered from the
//! process's standby of the task, if it keeps one (module `standby`), under the standbys' lock.
//!
//! Invariants: the answers are taken at the end of a turn, after delivery, so a value is the
//! one the task's last delivered record left (committed or not yet: a transaction that aborts
//! rebuilds the task, and a later read sees the rebuilt state); a turn with nothing asked and
//! nothing waiting costs one relaxed atomic load; a waiting read is answered at the first turn
//! that ends at or after its deadline; a standby is read only for a partition the thread runs
//! no task of, and never waited on for a stamp.

use std::time::Instant;

use parsley_stage::KeyPartitioning;
use parsley_task::context::TaskContext;
use parsley_task::query::{AtLeast, Entries, Request, StoreAnswer, StoreQuery, shortfalls};
use parsley_task::task::Task;
use parsley_task::topic::task_of;

use super::Tasks;

/// A read of a task's state: answered, or waiting for a stamp.
enum Owned {
    Answer(StoreAnswer),
    Wait,
}

impl Tasks {
    /// Answers the queries filed since the last turn, and the reads waiting for a stamp that
    /// can be answered now (module docs).
    pub(crate) fn answer_queries(&mut self, ctx: &TaskContext) {
        let mut requests = ctx.metrics.queries().take();
        if requests.is_empty() && self.waiting.is_empty() {
            return;
        }
        requests.append(&mut self.waiting);
        let now = Instant::now();
        for request in requests {
            if let Some(request) = self.answer(ctx, request, now) {
                self.waiting.push(request);
            }
        }
    }

    /// Answers `request`, or hands it back when it waits for a stamp not delivered yet.
    fn answer(&self, ctx: &TaskContext, request: Request, now: Instant) -> Option<Request> {
        let answer = match &request.query {
            StoreQuery::TaskOf { key } => StoreAnswer::Task(task_of(&partitioned(ctx), key)),
            StoreQuery::All => self
                .entries()
                .map_or_else(|e| StoreAnswer::Failed(e.to_string()), StoreAnswer::Entries),
            StoreQuery::AllStale { standbys } => self.stale_entries(*standbys),
            StoreQuery::Get { key, at_least } => match task_of(&partitioned(ctx), key) {
                None => StoreAnswer::Task(None),
                Some(partition) => match self.tasks.get(&partition) {
                    None => StoreAnswer::NotOwned { partition },
                    Some(task) => match read(ctx, task, key, at_least.as_ref(), now) {
                        Owned::Wait => return Some(request),
                        Owned::Answer(answer) => answer,
                    },
                },
            },
            StoreQuery::GetStale { key, at_least } => match task_of(&partitioned(ctx), key) {
                None => StoreAnswer::Task(None),
                Some(partition) => match self.tasks.get(&partition) {
                    Some(task) => match read(ctx, task, key, at_least.as_ref(), now) {
                        Owned::Wait => return Some(request),
                        Owned::Answer(StoreAnswer::Value(value)) => StoreAnswer::Stale {
                            partition,
                            value,
                            standby: None,
                        },
                        Owned::Answer(answer) => answer,
                    },
                    None if at_least.is_some() => {
                        if self.standbys.holds(partition) {
                            StoreAnswer::StandbyCannotWait { partition }
                        } else {
                            StoreAnswer::NotOwned { partition }
                        }
                    }
                    None => match self.standbys.get(partition, key) {
                        None => StoreAnswer::NotOwned { partition },
                        Some(Ok((value, at))) => StoreAnswer::Stale {
                            partition,
                            value,
                            standby: Some(at),
                        },
                        Some(Err(e)) => StoreAnswer::Failed(e.to_string()),
                    },
                },
            },
        };
        request.answer(answer);
        None
    }

    /// Every key's fold state in every task, by task then key bytes.
    fn entries(&self) -> parsley_task::Result<Entries> {
        let mut entries = Vec::new();
        for (partition, task) in &self.tasks {
            let all = task.fold().entries()?;
            entries.extend(all.into_iter().map(|(k, v)| (*partition, k, v)));
        }
        Ok(entries)
    }

    /// Every key's fold state in every task and, with `standbys`, in every standby of the
    /// process but of the tasks here: [`StoreAnswer::StaleEntries`].
    fn stale_entries(&self, standbys: bool) -> StoreAnswer {
        let mut entries = match self.entries() {
            Ok(entries) => entries,
            Err(e) => return StoreAnswer::Failed(e.to_string()),
        };
        let owned: Vec<i32> = self.tasks.keys().copied().collect();
        let mut at = Vec::new();
        if standbys {
            match self.standbys.entries() {
                Ok((more, standing)) => {
                    entries.extend(more.into_iter().filter(|(p, ..)| !owned.contains(p)));
                    at = standing
                        .into_iter()
                        .filter(|(p, _)| !owned.contains(p))
                        .collect();
                }
                Err(e) => return StoreAnswer::Failed(e.to_string()),
            }
        }
        StoreAnswer::StaleEntries {
            entries,
            owned,
            standbys: at,
        }
    }
}

/// The fold state of `key` in `task`, once the task has delivered what `at_least` claims
/// ([`Owned::Wait`] until then, or until its deadline: [`StoreAnswer::Short`]).
fn read(
    ctx: &TaskContext,
    task: &Task,
    key: &[u8],
    at_least: Option<&AtLeast>,
    now: Instant,
) -> Owned {
    let short = at_least
        .map(|w| (shortfalls(&w.stamp, task.gate()), w.deadline))
        .filter(|(short, _)| !short.is_empty());
    Owned::Answer(match short {
        Some((_, deadline)) if deadline > now => return Owned::Wait,
        Some((short, _)) => StoreAnswer::Short {
            partition: task.partition(),
            short: short
                .into_iter()
                .map(|s| (ctx.topic_name(s.channel.topic), s))
                .collect(),
        },
        None => match task.fold().get(key) {
            Ok(v) => StoreAnswer::Value(v.map(|v| v.into_owned())),
            Err(e) => StoreAnswer::Failed(e.to_string()),
        },
    })
}

/// The partition count and partitioner of each partitioned (not global) source of the stage.
fn partitioned(ctx: &TaskContext) -> Vec<(i32, KeyPartitioning)> {
    ctx.sources
        .iter()
        .zip(&ctx.key_partitioning)
        .zip(&ctx.global)
        .filter(|(_, global)| !**global)
        .map(|((t, p), _)| (t.partitions, *p))
        .collect()
}
