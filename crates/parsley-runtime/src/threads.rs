//! The stream threads of one stage in one process, as one stage
//! ([`RuntimeConfig::stream_threads`](crate::RuntimeConfig::stream_threads)).
//!
//! Each stream thread keeps counters of its own ([`StageMetrics`]); [`StageThreads`] reads them
//! as the stage's: counters and gauges summed over the threads
//! ([`MetricsSnapshot::merge`]), the tasks, standbys and late keys of every thread together (a
//! task lives on one thread at a time), and a stage that is assigned only when every thread
//! is. Interactive queries ask the thread that runs the key's task (module `query`).

use std::sync::Arc;

use parsley_task::explain::{Explanation, StageExplanation};
use parsley_task::metrics::{
    LateKey, MetricsSnapshot, Ownership, StageEnd, StageMetrics, StandbyMetrics, TaskMetrics,
    TaskOwner,
};

/// The counters of every stream thread of one stage in one process, by thread index.
#[derive(Debug, Clone)]
pub(crate) struct StageThreads(Arc<[Arc<StageMetrics>]>);

impl StageThreads {
    /// Fresh counters for `n` threads (at least one).
    pub(crate) fn new(n: usize) -> Self {
        StageThreads(
            (0..n.max(1))
                .map(|_| Arc::new(StageMetrics::default()))
                .collect(),
        )
    }

    /// One thread with counters `metrics`.
    #[cfg(test)]
    pub(crate) fn one(metrics: Arc<StageMetrics>) -> Self {
        StageThreads(Arc::from([metrics]))
    }

    /// Threads with counters `metrics`, by thread index.
    #[cfg(test)]
    pub(crate) fn from_threads(metrics: Vec<Arc<StageMetrics>>) -> Self {
        StageThreads(metrics.into())
    }

    /// Each thread's counters, by thread index.
    pub(crate) fn threads(&self) -> &[Arc<StageMetrics>] {
        &self.0
    }

    /// The stage's counters: every thread's, added up.
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let mut total = MetricsSnapshot::default();
        for m in self.0.iter() {
            total.merge(&m.snapshot());
        }
        total
    }

    /// The tasks of every thread, by partition (a task lives on one thread; during a handover
    /// the thread that restores it is listed).
    pub(crate) fn tasks(&self) -> Vec<TaskMetrics> {
        let mut tasks: Vec<TaskMetrics> = self.0.iter().flat_map(|m| m.tasks()).collect();
        tasks.sort_by_key(|t| {
            (
                t.partition,
                t.phase == parsley_task::metrics::TaskPhase::Running,
            )
        });
        tasks.dedup_by_key(|t| t.partition);
        tasks
    }

    /// The standbys of the stage in this process, by partition.
    pub(crate) fn standbys(&self) -> Vec<StandbyMetrics> {
        let mut standbys: Vec<StandbyMetrics> = self.0.iter().flat_map(|m| m.standbys()).collect();
        standbys.sort_by_key(|s| s.partition);
        standbys
    }

    /// The late keys of every thread's tasks.
    pub(crate) fn late_by_key(&self) -> Vec<LateKey> {
        let mut keys: Vec<LateKey> = self.0.iter().flat_map(|m| m.late_by_key()).collect();
        keys.sort_by(|a, b| (a.partition, &a.key).cmp(&(b.partition, &b.key)));
        keys
    }

    /// How a thread of the stage ended, the first thread first: a stage one of whose threads
    /// ended no longer runs whole.
    pub(crate) fn ended(&self) -> Option<StageEnd> {
        self.0.iter().find_map(|m| m.ended())
    }

    /// Every thread has its assignment.
    pub(crate) fn is_assigned(&self) -> bool {
        self.0.iter().all(|m| m.is_assigned())
    }

    /// The group's tasks no member holds, at the last look of the first thread that looked.
    pub(crate) fn ownership(&self) -> Option<Ownership> {
        self.0.iter().find_map(|m| m.ownership())
    }

    /// The group's members holding each task, at the last look of the first thread that found
    /// any.
    pub(crate) fn owners(&self) -> Vec<TaskOwner> {
        self.0
            .iter()
            .map(|m| m.owners())
            .find(|o| !o.is_empty())
            .unwrap_or_default()
    }

    /// What a commit of a thread has waited long for, if any.
    pub(crate) fn commit_wait(&self) -> Option<String> {
        self.0.iter().find_map(|m| m.commit_wait())
    }
}

/// `explanation` with the entries of one stage's threads made one per stage (each thread
/// explains its own tasks): tasks together by partition, the oldest snapshot's time, fresh only
/// when every thread's was.
pub(crate) fn merge_threads(explanation: Explanation) -> Explanation {
    let mut stages: Vec<StageExplanation> = Vec::new();
    for s in explanation.stages {
        match stages.iter_mut().find(|m| m.stage == s.stage) {
            None => stages.push(s),
            Some(m) => {
                m.fresh &= s.fresh;
                m.taken_at_ms = match (m.taken_at_ms, s.taken_at_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                m.tasks.extend(s.tasks);
                m.tasks.sort_by_key(|t| t.partition);
            }
        }
    }
    Explanation { stages }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsley_task::metrics::TaskPhase;

    #[test]
    fn a_stages_threads_read_as_one_stage() {
        let threads = StageThreads::new(2);
        let [a, b] = threads.threads() else {
            panic!("two threads")
        };
        for _ in 0..3 {
            a.delivered();
        }
        b.delivered();
        a.committed(3, 0, 10);
        b.committed(1, 0, 20);
        a.task(2, |t| t.phase = TaskPhase::Running);
        b.task(0, |t| t.phase = TaskPhase::Running);
        b.task(1, |t| t.phase = TaskPhase::Restoring);
        let total = threads.snapshot();
        assert_eq!(total.delivered, 4);
        assert_eq!(total.transactions, 2);
        assert_eq!(total.committed_deliveries, 4);
        assert_eq!(total.commit_us, 30);
        let partitions: Vec<i32> = threads.tasks().iter().map(|t| t.partition).collect();
        assert_eq!(partitions, [0, 1, 2]);
        assert!(!threads.is_assigned());
        a.set_assigned(true);
        assert!(!threads.is_assigned(), "one thread is not assigned yet");
        b.set_assigned(true);
        assert!(threads.is_assigned());
        assert_eq!(threads.ended(), None);
        b.end(StageEnd::Stopped);
        assert_eq!(threads.ended(), Some(StageEnd::Stopped));
    }

    #[test]
    fn one_stages_explanations_merge_into_one() {
        let entry = |stage: &str, fresh, at, partition| StageExplanation {
            stage: stage.to_string(),
            taken_at_ms: at,
            fresh,
            tasks: vec![parsley_task::explain::TaskExplanation::new(partition)],
        };
        let merged = merge_threads(Explanation {
            stages: vec![
                entry("a", true, Some(5), 3),
                entry("b", true, Some(1), 0),
                entry("a", false, Some(4), 1),
            ],
        });
        assert_eq!(merged.stages.len(), 2);
        let a = &merged.stages[0];
        assert_eq!(a.stage, "a");
        assert!(!a.fresh);
        assert_eq!(a.taken_at_ms, Some(4));
        let partitions: Vec<i32> = a.tasks.iter().map(|t| t.partition).collect();
        assert_eq!(partitions, [1, 3]);
    }
}
