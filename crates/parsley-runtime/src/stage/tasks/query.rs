//! The tasks' side of interactive queries (`crate::query`): between two turns, the stream
//! thread takes the requests callers filed with the stage (`parsley_task::query`) and answers
//! them from its tasks' fold state; a read that waits for a stamp stays here until the
//! owning task's gate has delivered what the stamp claims on its channels, or until its
//! deadline.
//!
//! Invariants: the answers are taken at the end of a turn, after delivery, so a value is the
//! one the task's last delivered record left (committed or not yet: a transaction that aborts
//! rebuilds the task, and a later read sees the rebuilt state); a turn with nothing asked and
//! nothing waiting costs one relaxed atomic load; a waiting read is answered at the first turn
//! that ends at or after its deadline.

use std::time::Instant;

use parsley_stage::KeyPartitioning;
use parsley_task::context::TaskContext;
use parsley_task::query::{Entries, Request, StoreAnswer, StoreQuery, shortfalls};
use parsley_task::topic::task_of;

use super::Tasks;

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
            StoreQuery::Get { key, at_least } => match task_of(&partitioned(ctx), key) {
                None => StoreAnswer::Task(None),
                Some(partition) => match self.tasks.get(&partition) {
                    None => StoreAnswer::NotOwned { partition },
                    Some(task) => {
                        let short = at_least
                            .as_ref()
                            .map(|w| (shortfalls(&w.stamp, task.gate()), w.deadline))
                            .filter(|(short, _)| !short.is_empty());
                        match short {
                            Some((_, deadline)) if deadline > now => return Some(request),
                            Some((short, _)) => StoreAnswer::Short {
                                partition,
                                short: short
                                    .into_iter()
                                    .map(|s| (ctx.topic_name(s.channel.topic), s))
                                    .collect(),
                            },
                            None => match task.fold().get(key) {
                                Ok(v) => StoreAnswer::Value(v.map(|v| v.into_owned())),
                                Err(e) => StoreAnswer::Failed(e.to_string()),
                            },
                        }
                    }
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
