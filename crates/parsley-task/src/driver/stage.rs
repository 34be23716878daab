//! One stage in the driver: its tasks, its consumer's positions, its group's committed offsets
//! and its changelog, in memory, and the turn that the stream thread's loop body mirrors.
//!
//! A turn ([`StageRun::turn`]) is one poll batch of the stream thread with a commit at its end:
//! 1. **take**: every record of the tasks' channels from the fetch position up to the last
//!    stable offset is offered to its task's gate, in append order across channels;
//! 2. **read evidence**: each channel's position (the last stable offset just read up to), then
//!    the high watermarks the gates ask for (the partitions' ends), until none asks again;
//! 3. **resolve** impossible stamps by the stage's policy; 4. **deliver** what the gates
//!    release; 5. for an event-time stage, hand each caught-up input its **live-head
//!    evidence** and deliver again;
//! 6. for a stage with the built-in clock, **write a tick** for every task whose tick interval
//!    has passed on the driver's time since its last tick (or that has written none since it
//!    was built), with the driver's time as its timestamp;
//! 7. **acknowledge** every send at once (the record was appended) and **commit**: each task
//!    writes its changelog records ([`Task::write_changelog`]) and the offsets it names become
//!    the group's committed offsets.
//!
//! Invariants: the sends of a turn are appended as they are made and removed again if the turn
//! fails (a failed transaction leaves nothing visible); the changelog and the committed
//! offsets change only together, at the end of a turn that succeeded; a stopped stage takes
//! no turn until it is restarted from them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use parsley_clock::{Channel, STAMP_HEADER};
use parsley_stage::StageSpec;
use parsley_stage::changelog::Restored;

use super::log::{Append, Logs, View};
use crate::context::GateMode;
use crate::context::TaskContext;
use crate::error::ProcessingError;
use crate::error::{Error, Result};
use crate::event_time::{HeadEvidence, head_evidence};
use crate::metrics::{StageMetrics, TaskPhase};
use crate::output::{ChangelogWriter, Outgoing, Output};
use crate::record::{Work, fetched};
use crate::task::{StartEvidence, Task, publish_counts, rebuild_task};
use crate::topic::SendTag;
use crate::topic::TopicInfo;
use parsley_stage::changelog_topic;

/// A changelog record: key, and value (`None`: a tombstone).
pub(super) type ChangelogRecord = (Vec<u8>, Option<Vec<u8>>);

/// One stage of the topology, run in memory.
pub(super) struct StageRun {
    pub spec: StageSpec,
    pub ctx: TaskContext,
    /// The group id's changelog topic name (in errors).
    changelog_name: String,
    pub tasks: BTreeMap<i32, Task>,
    /// The next offset the consumer fetches, per task and consumed channel (a global source's
    /// channel is read by every task, at its own position).
    fetch: BTreeMap<(i32, Channel), i64>,
    /// The group's committed offsets.
    committed: BTreeMap<Channel, i64>,
    /// The changelog, one record list per partition (task), in append order.
    pub changelog: Vec<Vec<ChangelogRecord>>,
    /// Poll batches so far.
    epoch: u64,
    /// Records fetched so far.
    arrivals: u64,
    /// Work done since the last commit.
    uncommitted: Work,
    /// The error the stage stopped with, until it is restarted.
    pub failed: Option<Arc<Error>>,
    pub metrics: Arc<StageMetrics>,
}

/// The topics of a stage, resolved in the driver's logs.
pub(super) struct StageTopics {
    pub sources: Vec<TopicInfo>,
    pub sinks: Vec<TopicInfo>,
    pub dead_letters: (Option<TopicInfo>, Option<TopicInfo>),
}

impl StageRun {
    /// The stage `spec` of application `app` over `topics`, its tasks started fresh at the log
    /// start of every source.
    ///
    /// # Errors
    /// As [`StageRun::restart`].
    pub(super) fn new(
        app: &str,
        spec: StageSpec,
        topics: StageTopics,
        gate: GateMode,
        logs: &Logs,
    ) -> Result<Self> {
        let metrics = Arc::new(StageMetrics::default());
        // One task per partition of the sources read by partition (a global source may have
        // any count).
        let partitions = topics
            .sources
            .iter()
            .find(|t| !spec.is_global(&t.name))
            .unwrap_or(&topics.sources[0])
            .partitions;
        let ctx = TaskContext::new(
            &spec,
            topics.sources,
            topics.sinks,
            topics.dead_letters,
            gate,
            // Every record is in memory already: no channel is paused, spilled or re-fetched.
            usize::MAX,
            metrics.clone(),
        );
        let mut stage = StageRun {
            changelog_name: changelog_topic(&spec.group_id(app)),
            spec,
            ctx,
            tasks: BTreeMap::new(),
            fetch: BTreeMap::new(),
            committed: BTreeMap::new(),
            changelog: (0..partitions).map(|_| Vec::new()).collect(),
            epoch: 0,
            arrivals: 0,
            uncommitted: Work::default(),
            failed: None,
            metrics,
        };
        stage.restart(logs)?;
        Ok(stage)
    }

    /// The stage's name.
    pub(super) fn name(&self) -> &str {
        self.spec.name()
    }

    /// Rebuilds every task from its changelog partition at the group's committed offsets (the
    /// log start where it has none), as an assignment does: the fetch positions go back there
    /// and a stopped stage runs again.
    ///
    /// # Errors
    /// [`ProcessingError::Changelog`] for a record that does not decode;
    /// [`ProcessingError::RestoreMismatch`]; [`ProcessingError::EventTime`]; the gate's.
    pub(super) fn restart(&mut self, logs: &Logs) -> Result<()> {
        self.restart_with(logs, BTreeMap::new())
    }

    /// [`StageRun::restart`], each task of `last` built from its last commit kept in memory
    /// instead of its changelog.
    fn restart_with(
        &mut self,
        logs: &Logs,
        mut last: BTreeMap<i32, crate::task::LastCommit>,
    ) -> Result<()> {
        self.failed = None;
        self.tasks.clear();
        self.fetch.clear();
        self.uncommitted = Work::default();
        self.metrics.retain_tasks(|_| false);
        for (partition, records) in self.changelog.iter().enumerate() {
            let partition = partition as i32;
            let end = records.len() as i64;
            self.metrics.task(partition, |m| {
                m.phase = TaskPhase::Restoring;
                m.restore_end = end;
            });
            let kept = last.remove(&partition);
            let (mut restored, fold) = match kept {
                Some(l) => (l.restored, Some(l.fold)),
                None => (Restored::default(), None),
            };
            let records = if fold.is_some() {
                &[][..]
            } else {
                &records[..]
            };
            for (offset, (key, value)) in records.iter().enumerate() {
                restored.apply(key, value.as_deref()).map_err(|message| {
                    Error::Processing(ProcessingError::Changelog {
                        topic: self.changelog_name.clone(),
                        partition,
                        offset: offset as i64,
                        message,
                    })
                })?;
            }
            let positions: Vec<(Channel, i64)> = self
                .ctx
                .consumed(partition)
                .into_iter()
                .map(|c| (c, self.committed.get(&c).copied().unwrap_or(0)))
                .collect();
            self.fetch
                .extend(positions.iter().map(|&(c, o)| ((partition, c), o)));
            let (task, moved) = rebuild_task(
                &self.ctx,
                self.spec.event_time(),
                partition,
                positions,
                restored,
                fold,
                &mut Memory(logs),
            )?;
            self.fetch
                .extend(moved.into_iter().map(|(c, o)| ((partition, c), o)));
            // A global channel the snapshot names resumes where its gate has delivered to.
            self.fetch.extend(
                task.global_positions(&self.ctx)
                    .into_iter()
                    .map(|(c, o)| ((partition, c), o)),
            );
            self.metrics.task(partition, |m| {
                m.restore_position = end;
                m.phase = TaskPhase::Running;
            });
            self.tasks.insert(partition, task);
        }
        Ok(())
    }

    /// Records that the stage stopped with `error` in a turn that appended `appended`: those
    /// records are removed (its transaction is aborted), and the stage takes no turn until it
    /// is restarted.
    pub(super) fn fail(
        &mut self,
        error: Error,
        appended: &[(Arc<str>, i32, i64)],
        logs: &mut Logs,
    ) {
        let mut lowest: BTreeMap<(&str, i32), i64> = BTreeMap::new();
        for (topic, partition, offset) in appended {
            let low = lowest.entry((&**topic, *partition)).or_insert(*offset);
            *low = (*low).min(*offset);
        }
        for ((topic, partition), offset) in lowest {
            logs.truncate(topic, partition, offset);
        }
        self.metrics.aborted();
        self.failed = Some(Arc::new(error));
    }

    /// One turn (module docs); `Ok(true)` when it offered a record or did any work (a tick
    /// written or read is work). `appended` collects the records it sends, to remove them if it
    /// fails; `time` is the driver's time, the timestamp of a tick and of a send without one
    /// (ms since the epoch).
    ///
    /// # Errors
    /// Whatever the stream thread's batch would end the stage with.
    pub(super) fn turn(
        &mut self,
        logs: &mut Logs,
        time: i64,
        appended: &mut Vec<(Arc<str>, i32, i64)>,
    ) -> Result<bool> {
        let moved = self.work(logs, time, appended)?;
        self.commit()?;
        Ok(moved)
    }

    /// A turn's work, without its commit ([`StageRun::turn`]).
    fn work(
        &mut self,
        logs: &mut Logs,
        time: i64,
        appended: &mut Vec<(Arc<str>, i32, i64)>,
    ) -> Result<bool> {
        self.epoch += 1;
        let offered = self.take(logs)?;
        self.read_evidence(logs);
        let mut work = Work::default();
        let result = (|| {
            for task in self.tasks.values_mut() {
                let mut out = Sends::new(logs, time, appended);
                let done = task.resolve_impossible(&self.ctx, &mut out);
                out.settle(task)?;
                work += done?;
            }
            work += self.deliver(logs, time, appended)?;
            if self.spec.event_time().is_some() {
                self.read_heads(logs)?;
                work += self.deliver(logs, time, appended)?;
            }
            if self.ctx.clock.is_some() {
                for task in self.tasks.values_mut() {
                    let mut out = Sends::new(logs, time, appended);
                    let done = task.tick(&self.ctx, &mut out, time);
                    out.settle(task)?;
                    work += done?;
                }
            }
            Ok::<_, Error>(())
        })();
        self.uncommitted += work;
        result?;
        Ok(offered > 0 || !work.is_empty())
    }

    /// Offers every record that is visible and not fetched yet to its task, in append order
    /// across the task's channels; returns how many.
    fn take(&mut self, logs: &Logs) -> Result<usize> {
        let batch_time = Instant::now();
        let mut offered = 0;
        for (&partition, task) in &mut self.tasks {
            let mut batch: Vec<(u64, &str, i64, Channel)> = Vec::new();
            for channel in self.ctx.consumed(partition) {
                let source = self.ctx.source_position(channel)?;
                let name = self.ctx.sources[source].name.as_str();
                let topic = logs.topic(name)?;
                let from = self.fetch.get(&(partition, channel)).copied().unwrap_or(0);
                let to = topic.last_stable(channel.partition);
                for offset in from..to {
                    let seq = topic.partitions[channel.partition as usize][offset as usize].seq;
                    batch.push((seq, name, offset, channel));
                }
                self.fetch.insert((partition, channel), to.max(from));
            }
            batch.sort_unstable_by_key(|(seq, ..)| *seq);
            for (_, topic, offset, channel) in batch {
                let record =
                    &logs.topic(topic)?.partitions[channel.partition as usize][offset as usize];
                let view = View {
                    topic,
                    partition: channel.partition,
                    offset,
                    record,
                };
                self.arrivals += 1;
                let mut f = fetched(&self.ctx, &view, self.arrivals, self.epoch, batch_time)?;
                // A global source's record is this task's whatever its partition.
                f.partition = partition;
                task.offer(&self.ctx, f)?;
                offered += 1;
            }
        }
        Ok(offered)
    }

    /// Hands every task its channels' positions, then the high watermarks its gate asks for,
    /// until no gate asks for another (each channel once per turn).
    fn read_evidence(&mut self, logs: &Logs) {
        for (&partition, task) in &mut self.tasks {
            for channel in self.ctx.consumed(partition) {
                if task.gate().baseline(&channel).is_none() {
                    continue;
                }
                if let Some(&position) = self.fetch.get(&(partition, channel)) {
                    // Cannot be behind a record offered: every one offered is below it.
                    let _ = task.position(&self.ctx, channel, position);
                }
            }
        }
        let mut served: BTreeSet<Channel> = BTreeSet::new();
        loop {
            let mut wanted: BTreeSet<Channel> = BTreeSet::new();
            for task in self.tasks.values() {
                wanted.extend(task.gate().evidence_wanted());
            }
            wanted.retain(|c| !served.contains(c));
            if wanted.is_empty() {
                return;
            }
            for task in self.tasks.values_mut() {
                for &c in &wanted {
                    task.gate_mut().high_watermark(c, logs.end(c), self.epoch);
                }
            }
            served.extend(wanted);
        }
    }

    /// Delivers what every task's gate releases, then publishes the tasks' counters.
    fn deliver(
        &mut self,
        logs: &mut Logs,
        time: i64,
        appended: &mut Vec<(Arc<str>, i32, i64)>,
    ) -> Result<Work> {
        let mut work = Work::default();
        let mut result = Ok(());
        for task in self.tasks.values_mut() {
            let mut out = Sends::new(logs, time, appended);
            let done = task.deliver(&self.ctx, &mut out);
            let settled = out.settle(task);
            match done.and_then(|w| settled.map(|()| w)) {
                Ok(w) => work += w,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        publish_counts(
            self.tasks.values_mut(),
            &self.metrics,
            self.spec.event_time().is_some(),
        );
        result.map(|()| work)
    }

    /// Hands each caught-up event-time input of every task its live-head evidence: the
    /// partition's end when the frontier reached it (the latest fetch response), an earlier
    /// last stable offset it has not reached, or else the last stable offset now (the
    /// stream thread's `head_evidence` choice).
    fn read_heads(&mut self, logs: &Logs) -> Result<()> {
        for task in self.tasks.values_mut() {
            let partition = task.partition();
            let (gate, Some(et)) = task.gate_and_event_time() else {
                continue;
            };
            for c in et.caught_up_inputs() {
                let (head, from_leader) = match gate.frontier(&c) {
                    None => (logs.last_stable(c), true),
                    Some(f) => match head_evidence(f + 1, Some(logs.end(c)), et.last_stable(&c)) {
                        HeadEvidence::Fetched(hw) => (hw, false),
                        HeadEvidence::Behind(lso) => (lso, false),
                        HeadEvidence::Ask => (logs.last_stable(c), true),
                    },
                };
                et.fetched_head(c, head, from_leader)
                    .map_err(|e| self.ctx.gate_error(partition, e))?;
            }
        }
        Ok(())
    }

    /// Commits what the turn did, as the stream thread commits its transaction: nothing when
    /// there is no work and no position moved; else every task writes its changelog records
    /// and its input offsets become the group's committed offsets.
    fn commit(&mut self) -> Result<()> {
        if self.uncommitted.is_empty() && !self.tasks.values().any(Task::position_moved) {
            return Ok(());
        }
        for task in self.tasks.values_mut() {
            let mut writer = MemoryChangelog(&mut self.changelog[task.partition() as usize]);
            let offsets = task.write_changelog(&self.ctx, &mut writer)?;
            self.committed.extend(offsets);
        }
        // Committed at once: no offset to checkpoint at (fold state is in memory).
        for task in self.tasks.values_mut() {
            task.committed(None)?;
        }
        let done = std::mem::take(&mut self.uncommitted);
        // In memory a commit takes no broker round trip: no time to count.
        self.metrics.committed(done.deliveries, done.emissions, 0);
        Ok(())
    }

    /// The fold state of `key` (bytes) in any task, if one has it.
    pub(super) fn state(&self, key: &[u8]) -> Option<&[u8]> {
        self.tasks
            .values()
            .find_map(|t| t.fold().in_memory()?.get(key).map(|v| &v[..]))
    }
}

/// The in-memory logs as a restored task's start evidence.
struct Memory<'a>(&'a Logs);

impl StartEvidence for Memory<'_> {
    fn log_start(&mut self, _: &TaskContext, _: Channel) -> Result<i64> {
        // Nothing is ever deleted from an in-memory log.
        Ok(0)
    }

    fn ends(&mut self, _: &TaskContext, channels: &[Channel]) -> Result<Vec<(i64, i64)>> {
        Ok(channels
            .iter()
            .map(|c| (self.0.end(*c), self.0.last_stable(*c)))
            .collect())
    }
}

/// A task's changelog partition.
struct MemoryChangelog<'a>(&'a mut Vec<ChangelogRecord>);

impl ChangelogWriter for MemoryChangelog<'_> {
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.0.push((key.to_vec(), value.map(<[u8]>::to_vec)));
        Ok(())
    }
}

/// Where a task's sends go: appended to the in-memory topics at once, their acknowledgements
/// kept for the task.
struct Sends<'a> {
    logs: &'a mut Logs,
    time: i64,
    appended: &'a mut Vec<(Arc<str>, i32, i64)>,
    acks: Vec<(SendTag, i64)>,
}

impl<'a> Sends<'a> {
    fn new(logs: &'a mut Logs, time: i64, appended: &'a mut Vec<(Arc<str>, i32, i64)>) -> Self {
        Sends {
            logs,
            time,
            appended,
            acks: Vec::new(),
        }
    }

    /// Hands `task` the acknowledgements of its sends.
    fn settle(self, task: &mut Task) -> Result<()> {
        for (tag, offset) in self.acks {
            task.acked(tag, offset)?;
        }
        Ok(())
    }
}

impl Output for Sends<'_> {
    fn send(&mut self, r: Outgoing<'_>) -> Result<()> {
        let partition = r.tag.channel.partition;
        let mut headers = Vec::with_capacity(1 + r.headers.len());
        if !r.stamp.is_empty() {
            headers.push((STAMP_HEADER.to_string(), Some(r.stamp.to_vec())));
        }
        headers.extend(r.headers.iter().map(|(n, v)| (n.to_string(), v.clone())));
        let offset = self.logs.append(
            &r.topic,
            partition,
            Append {
                key: r.key,
                value: r.value,
                timestamp: r.timestamp.unwrap_or(self.time),
                headers,
                open: None,
            },
        )?;
        self.appended.push((r.topic, partition, offset));
        self.acks.push((r.tag, offset));
        Ok(())
    }
}

#[cfg(test)]
#[path = "rollback_tests.rs"]
mod rollback_tests;
