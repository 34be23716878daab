//! The tasks' side of "why is it waiting?" (`crate::explain`): between two turns,
//! when a caller asked, a snapshot of what each task waits for — its blocked records, its
//! paused channels, its watermark — published with the stage's metrics.
//!
//! Invariant: the snapshot is taken at the end of a turn, after delivery, backpressure and
//! the commit check, so it describes the tasks as the next turn finds them; nothing is read
//! per record, and a turn nobody asked about costs one relaxed atomic load.

use super::Tasks;
use crate::stage::alignment;
use crate::stage::intake::Intake;
use parsley_task::context::TaskContext;
use parsley_task::explain::{self, TaskExplanation};
use parsley_task::task::Task;

impl Tasks {
    /// Publishes what every task waits for, when a caller asked since the last snapshot;
    /// `intake` says what the consumer pauses and holds.
    pub(crate) fn explain_if_asked(&self, ctx: &TaskContext, intake: &Intake) {
        let explained = ctx.metrics.explained();
        if !explained.wanted() {
            return;
        }
        let tasks = self
            .tasks
            .values()
            .map(|task| self.explain_task(ctx, intake, task))
            .collect();
        explained.publish(tasks);
    }

    /// What `task` waits for now.
    fn explain_task(&self, ctx: &TaskContext, intake: &Intake, task: &Task) -> TaskExplanation {
        let names = |id| {
            let name = ctx.topic_name(id);
            (!name.is_empty()).then_some(name)
        };
        let gate = task.gate();
        let (blocked, blocked_not_listed) =
            explain::blocked_records(gate, |p| p.key.as_deref(), &names);
        TaskExplanation {
            partition: task.partition(),
            blocked,
            blocked_not_listed,
            paused: explain::paused_channels(gate, intake.full(), ctx.cap, &names),
            ahead: task
                .event_time()
                .map(|et| {
                    let max_drift = self.event_time.as_ref().and_then(|o| o.max_drift_ms);
                    let limit = max_drift.map_or(0, |d| alignment::limit(d, et.lag_ms()));
                    gate.consumed()
                        .filter(|c| intake.held_records(c) > 0)
                        .map(|c| explain::AheadChannel {
                            channel: explain::channel_name(c, &names),
                            drift_ms: et.drift(&c).filter(|d| *d != i64::MAX),
                            max_drift_ms: limit,
                            held_records: intake.held_records(&c) as u64,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            event_time: task
                .event_time()
                .map(|et| explain::watermark(et.watermark(), et.parked(), et.held_by(), &names)),
            restore: None,
            bootstrap: task
                .bootstrap_remaining()
                .into_iter()
                .map(|(c, frontier, end)| explain::BootstrapChannel {
                    channel: explain::channel_name(c, &names),
                    position: frontier.map(|f| f + 1),
                    end,
                })
                .collect(),
        }
    }
}
