//! Saying when an event-time stage counts records late.
//!
//! A record that reaches an event-time task with an event time below the task's watermark is
//! released at once, out of event-time order, and counted (`parsley_task_records_late_total`;
//! the book's specification, §5). With a control clock, that is a record that reached the
//! stage more than the clock's lag after its event time. After a rebalance that happens to the
//! outputs of an upstream stage's task for the time it had no live owner — a dead member's
//! session timeout, a restore: the upstream task processes that backlog once it runs again,
//! and this stage's clock went on meanwhile (its own tasks kept running).
//!
//! Every [`LOOK_EVERY`] the stream thread compares each task's late count with the one it last
//! saw, and logs one line per task whose count grew: the task, how many since the last line
//! and in all, the watermark, how long ago this instance was assigned the task and whether it
//! took the task over from another member. At most one line per task per [`LOOK_EVERY`].
//!
//! Invariant: the counts seen are reset when a task is assigned (its metrics start again at
//! zero then).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tracing::info;

use parsley_task::metrics::{StageMetrics, TaskMetrics};

/// How often the late counts are looked at.
pub(crate) const LOOK_EVERY: Duration = Duration::from_secs(5);

/// What this instance knows of one task's late records.
#[derive(Debug)]
struct Seen {
    /// When this instance was assigned the task.
    assigned: Instant,
    /// It took the task over from another member (an assignment after its first).
    taken_over: bool,
    /// The late count at the last look.
    late: u64,
}

/// The late counts seen per task.
#[derive(Debug)]
pub(crate) struct LateWatch {
    last: Instant,
    tasks: BTreeMap<i32, Seen>,
}

impl LateWatch {
    /// A watch with no task.
    pub(crate) fn new() -> Self {
        LateWatch {
            last: Instant::now(),
            tasks: BTreeMap::new(),
        }
    }

    /// The tasks of an assignment, `taken_over` those another member owned before.
    pub(crate) fn assigned(&mut self, tasks: &BTreeSet<i32>, taken_over: &[i32]) {
        let now = Instant::now();
        self.tasks = tasks
            .iter()
            .map(|p| {
                let seen = Seen {
                    assigned: now,
                    taken_over: taken_over.contains(p),
                    late: 0,
                };
                (*p, seen)
            })
            .collect();
    }

    /// Once per turn: every [`LOOK_EVERY`], one line per task whose late count grew (module
    /// docs).
    pub(crate) fn look(&mut self, metrics: &StageMetrics) {
        if self.last.elapsed() < LOOK_EVERY {
            return;
        }
        self.last = Instant::now();
        for (t, new, seen) in self.grown(&metrics.tasks()) {
            info!(
                task = t.partition,
                late = new,
                late_total = t.late,
                watermark_ms = t.watermark_ms,
                assigned_ms_ago = seen.assigned.elapsed().as_millis() as u64,
                taken_over = seen.taken_over,
                "records reached the task with event times below its watermark and were released \
                 at once, out of event-time order: they reached the stage more than the clock's \
                 lag after their event time (after a rebalance, typically the outputs of an \
                 upstream stage's task for the time it had no live owner)"
            );
        }
    }

    /// The tasks of `tasks` whose late count grew since the last call, with how much and what
    /// this instance knows of them; their counts are now the ones seen.
    fn grown<'a>(&mut self, tasks: &'a [TaskMetrics]) -> Vec<(&'a TaskMetrics, u64, SeenNow)> {
        let mut grown = Vec::new();
        for t in tasks {
            let Some(seen) = self.tasks.get_mut(&t.partition) else {
                continue;
            };
            if t.late > seen.late {
                grown.push((
                    t,
                    t.late - seen.late,
                    SeenNow {
                        assigned: seen.assigned,
                        taken_over: seen.taken_over,
                    },
                ));
                seen.late = t.late;
            }
        }
        grown
    }
}

/// What [`LateWatch::grown`] hands back of a task: when it was assigned, and whether it was
/// taken over.
#[derive(Debug, Clone, Copy)]
struct SeenNow {
    assigned: Instant,
    taken_over: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(partition: i32, late: u64) -> TaskMetrics {
        let mut t = TaskMetrics::new(partition);
        t.late = late;
        t
    }

    #[test]
    fn a_task_is_named_once_per_growth_of_its_late_count_and_again_from_zero_after_an_assignment() {
        let mut watch = LateWatch::new();
        watch.assigned(&BTreeSet::from([0, 1]), &[1]);
        let first = [task(0, 0), task(1, 146), task(7, 3)];
        let grown = watch.grown(&first);
        let named: Vec<(i32, u64, bool)> = grown
            .iter()
            .map(|(t, n, s)| (t.partition, *n, s.taken_over))
            .collect();
        assert_eq!(named, [(1, 146, true)], "task 7 is not this instance's");
        assert!(watch.grown(&[task(0, 0), task(1, 146)]).is_empty());
        let second = [task(0, 2), task(1, 150)];
        let grown = watch.grown(&second);
        let named: Vec<(i32, u64)> = grown.iter().map(|(t, n, _)| (t.partition, *n)).collect();
        assert_eq!(named, [(0, 2), (1, 4)]);
        // A new assignment: the tasks' counts start again at zero.
        watch.assigned(&BTreeSet::from([1]), &[]);
        let third = [task(1, 5)];
        let grown = watch.grown(&third);
        assert_eq!(grown.len(), 1);
        assert_eq!((grown[0].1, grown[0].2.taken_over), (5, false));
    }
}
