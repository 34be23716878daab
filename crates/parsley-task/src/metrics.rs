//! Per-stage and per-task metrics and progress events.
//!
//! Counters are updated by the stage's stream thread and read from any thread through
//! [`StageMetrics::snapshot`] (the stage's totals) and [`StageMetrics::tasks`] (one
//! [`TaskMetrics`] per task this instance owns). After every committed transaction the stream
//! thread sends a [`Progress::Committed`] event with a snapshot, so a caller can wait on
//! committed evidence ("stage X has committed N deliveries") instead of sleeping.
//!
//! The per-key violation counter of event-time stages ([`StageMetrics::late_by_key`]) is the
//! tasks' state, not this instance's count: published at every commit and when a task is
//! restored, from the timer queue (which changelogs it).
//!
//! A stage's metrics also say where the stage stands — assigned or not, ended or not, and how —
//! and keep the digest of its clients' librdkafka statistics, for the
//! metrics endpoint (`RuntimeConfig::metrics_address`) and its readiness check.
//!
//! Invariants: stage counters only grow (except the `blocked_heads` gauge); a task's entry
//! exists from its assignment (in phase [`TaskPhase::Restoring`]) until it is revoked, and its
//! counters only grow while this instance owns it (a task that comes back after a revocation
//! starts again at zero); a task's per-key late counts leave with it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use parsley_stage::BadRecordKind;

use crate::client_stats::ClientStatistics;
use crate::error::Error;
use crate::explain::{Explained, Explanation};
use crate::query::Queries;

mod group;
pub use group::{Ownership, StandbyMetrics, TaskOwner};

/// Live counters of one stage (all tasks of one stream thread).
#[derive(Debug, Default)]
pub struct StageMetrics {
    fetched: AtomicU64,
    delivered: AtomicU64,
    held: AtomicU64,
    gate_wait_us: AtomicU64,
    max_gate_wait_us: AtomicU64,
    blocked_heads: AtomicU64,
    emitted: AtomicU64,
    transactions: AtomicU64,
    commit_us: AtomicU64,
    aborts: AtomicU64,
    lost_assignments: AtomicU64,
    committed_deliveries: AtomicU64,
    committed_emissions: AtomicU64,
    lookahead: AtomicU64,
    impossible_stamps: AtomicU64,
    dead_lettered: AtomicU64,
    reads_beyond_cap: AtomicU64,
    spilled: AtomicU64,
    refetched: AtomicU64,
    /// The stage's memory against the bound, per holder (module `memory`).
    state_memory: [AtomicU64; 3],
    state_memory_bound: AtomicU64,
    memory_pauses: AtomicU64,
    memory_spilled: AtomicU64,
    aligned: AtomicU64,
    late: AtomicU64,
    raised: AtomicU64,
    timers_fired: AtomicU64,
    too_late: AtomicU64,
    parked: AtomicU64,
    overlapped: AtomicU64,
    own_write_commits: AtomicU64,
    tick_commits: AtomicU64,
    ticks: AtomicU64,
    ticks_read: AtomicU64,
    /// Bad records by kind, in [`BadRecordKind::ALL`]'s order.
    bad_records: [AtomicU64; 6],
    skipped: AtomicU64,
    tasks: Mutex<BTreeMap<i32, TaskMetrics>>,
    /// The warm copies of tasks this instance does not own, by partition.
    standbys: Mutex<BTreeMap<i32, StandbyMetrics>>,
    standby_records_discarded: AtomicU64,
    /// The per-key violation counter of event-time tasks: `(task, key) -> late records`.
    late_keys: Mutex<BTreeMap<(i32, Vec<u8>), u64>>,
    /// The consumer holds an assignment (set when one is handled, cleared at a revocation).
    assigned: AtomicBool,
    /// Who holds the stage's partitions, as the group coordinator last described it.
    ownership: Mutex<Option<Ownership>>,
    /// What a commit call that has waited long waits on, in words (module `stage::coordinator`
    /// of the runtime), until the commit ends.
    commit_wait: Mutex<Option<String>>,
    /// How the stream thread ended, once it has.
    ended: Mutex<Option<StageEnd>>,
    /// The digest of the stage's clients' last librdkafka statistics.
    clients: Mutex<ClientStatistics>,
    /// What its tasks wait for, published by the stream thread on request (module
    /// `explain`).
    explained: Explained,
    /// Interactive queries waiting for the stream thread (module `query`).
    queries: Queries,
    /// Who holds each task, among the members that advertise an application endpoint, as
    /// the group coordinator last described the group.
    owners: Mutex<Vec<TaskOwner>>,
}

/// How a stage's stream thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageEnd {
    /// It stopped cleanly after a shutdown request.
    Stopped,
    /// It ended with an error (its text).
    Failed(String),
    /// It panicked.
    Panicked,
}

/// The violation counter of one key of an event-time stage (the book's specification, §5): how many
/// of its records arrived with an event time below the task's watermark and were released at once,
/// out of event-time order. The count is the task's state: it is changelogged with the timer queue
/// and restored with it, so it counts across restarts and instances (unlike [`TaskMetrics::late`],
/// which counts what this instance saw).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateKey {
    /// The task (partition).
    pub partition: i32,
    /// The record key's bytes (empty for a null key).
    pub key: Vec<u8>,
    /// Late records of this key.
    pub late: u64,
}

/// What a task is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskPhase {
    /// Reading its changelog partition (the book's specification, §7); it delivers nothing yet.
    Restoring,
    /// Restored; fetching and delivering.
    Running,
}

/// The counters of one task (partition `partition` of every source of the stage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMetrics {
    /// The task: the partition of each source it consumes.
    pub partition: i32,
    /// Restoring or running.
    pub phase: TaskPhase,
    /// The next changelog offset the restore reads (i64).
    pub restore_position: i64,
    /// The changelog's high watermark when the restore started: the restore is complete when
    /// `restore_position` reaches it (i64).
    pub restore_end: i64,
    /// The changelog offset the restore started reading at (i64): 0, or the checkpoint of the
    /// task's copy in the state store (`RuntimeConfig::state_dir`),
    /// when it could be trusted.
    pub restore_start: i64,
    /// How long the last restore took, from its start to the task running, ms.
    pub restore_ms: u64,
    /// Changelog records the last restore read: 0 after a return to the last commit in
    /// memory.
    pub restore_records: u64,
    /// Returns to the last commit in memory after an abort, without reading the changelog,
    /// since this instance took the task.
    pub rollbacks: u64,
    /// Restores from the changelog since this instance took the task (its assignment's, and
    /// those after an abort that could not return in memory).
    pub restores: u64,
    /// Records delivered to the handler (committed or not).
    pub delivered: u64,
    /// Delivered records that the gate held for a claimed cause.
    pub held: u64,
    /// Total time held records waited in the gate, µs.
    pub gate_wait_us: u64,
    /// The longest such wait, µs.
    pub max_gate_wait_us: u64,
    /// Heads of this task's channels blocked at the last look (a gauge).
    pub blocked_heads: u64,
    /// Records of this task with impossible stamps, under any policy.
    pub impossible_stamps: u64,
    /// Frontier lag: offsets between the first undelivered offset and the end offset of the
    /// consumer's last fetch response (librdkafka's cached watermark, a local read), summed
    /// over the task's channels and updated at every commit interval; `None` until every
    /// channel has had a fetch response. Commit markers and aborted records count as offsets,
    /// so a caught-up task can show a lag of a few offsets while its input ends in a marker.
    /// The built-in clock's topic is not counted (the task's own ticks).
    pub frontier_lag: Option<i64>,
    /// Event-time stages: records parked in the task's timer queue now (a gauge; restored
    /// records included). `0` for other stages.
    pub parked: u64,
    /// Event-time stages: the most records the task's timer queue held after a poll batch's
    /// deliveries, since this instance took the task. `0` for other stages.
    pub max_parked: u64,
    /// Event-time stages: records taken by this instance's timer queue with an event time
    /// below the watermark (the violation counter, the book's specification, §5): released at once,
    /// or behind a parked causal ancestor. `0` for other stages.
    pub late: u64,
    /// Event-time stages: records this instance's timer queue parked above their own event
    /// time, behind a parked causal ancestor with a later one (the book's specification, §5): they
    /// leave after records with later event times — out of event-time order, but never before their
    /// cause. A skewed upstream clock, or a claim coarser than the true cause (an in-flight claim
    /// replaced by the end offset), makes them. `0` for other stages.
    pub raised: u64,
    /// Event-time stages: the task's event-time watermark, ms since the epoch; `None` while an
    /// input has no evidence yet (nothing is released) and for other stages.
    pub watermark_ms: Option<i64>,
    /// Event-time stages: input channels not caught up yet with the end offset read at task
    /// start (a gauge; one that stays above zero with nothing fetched waits for an open
    /// transaction). `0` for other stages.
    pub catching_up: u64,
    /// Stages with the built-in clock: ticks this instance wrote for the task (committed or
    /// not; `0` for other stages).
    pub ticks: u64,
    /// Event-time stages: keyed timers set and not fired yet (a gauge).
    pub timers: u64,
}

impl TaskMetrics {
    /// A task's entry at its assignment: restoring, every count zero.
    pub fn new(partition: i32) -> Self {
        TaskMetrics {
            partition,
            phase: TaskPhase::Restoring,
            restore_position: 0,
            restore_end: 0,
            restore_start: 0,
            restore_ms: 0,
            restore_records: 0,
            rollbacks: 0,
            restores: 0,
            delivered: 0,
            held: 0,
            gate_wait_us: 0,
            max_gate_wait_us: 0,
            blocked_heads: 0,
            impossible_stamps: 0,
            frontier_lag: None,
            parked: 0,
            max_parked: 0,
            late: 0,
            raised: 0,
            watermark_ms: None,
            catching_up: 0,
            ticks: 0,
            timers: 0,
        }
    }
}

/// A copy of a stage's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Records fetched and handed to the gate (the built-in clock's ticks included).
    pub fetched: u64,
    /// Changelog records read into standbys and then thrown away: the copy was dropped
    /// before its task was assigned here (no longer wanted after a rebalance, or its position
    /// fell off the changelog's start). Copies on disk are never thrown away when they are
    /// dropped: the state store keeps them at their checkpoint.
    pub standby_records_discarded: u64,
    /// Records delivered to the handler (committed or not); ticks of the built-in clock are
    /// never delivered.
    pub delivered: u64,
    /// Delivered records that the gate held because a claimed cause was not delivered yet.
    pub held: u64,
    /// Total time held records spent between arrival and delivery, µs.
    pub gate_wait_us: u64,
    /// The longest such wait, µs.
    pub max_gate_wait_us: u64,
    /// Heads blocked at the last look (a gauge).
    pub blocked_heads: u64,
    /// Records sent (committed or not).
    pub emitted: u64,
    /// Transactions committed.
    pub transactions: u64,
    /// Total time the committed transactions' commits took, µs: each from the start of the
    /// commit (flushing the outputs, writing the changelog, sending the input offsets) until
    /// the broker acknowledged it. Divided by `transactions`, the mean commit duration.
    pub commit_us: u64,
    /// Transactions aborted.
    pub aborts: u64,
    /// Assignments lost: the group dropped this member (its session timed out) before it
    /// could commit; its open transaction was aborted and its tasks handed over.
    pub lost_assignments: u64,
    /// Deliveries covered by committed transactions.
    pub committed_deliveries: u64,
    /// Emissions covered by committed transactions.
    pub committed_emissions: u64,
    /// Deliveries ahead of earlier records of their channel (claim-driven look-ahead).
    pub lookahead: u64,
    /// Records whose stamps were impossible (malformed, self claim, claim beyond the high
    /// watermark), under any policy.
    pub impossible_stamps: u64,
    /// Records routed to the dead-letter topic.
    pub dead_lettered: u64,
    /// Records fetched while their channel held more than `max_queued_per_channel` records
    /// (the rest of a poll batch, or a channel whose tracked records alone exceed the cap).
    pub reads_beyond_cap: u64,
    /// Records spilled: a full channel that an in-flight claim needed read dropped their
    /// payloads to read on (the book's specification, §4).
    pub spilled: u64,
    /// Spilled records re-fetched by seeking back.
    pub refetched: u64,
    /// The state's memory this stage holds against the process's bound
    /// (`RuntimeConfig::state_memory_bytes`), bytes, per holder in
    /// [`Holder::ALL`](crate::memory::Holder::ALL)'s order: store, state, held. Zero without a
    /// bound.
    pub state_memory: [u64; 3],
    /// The process's bound, bytes; 0: none.
    pub state_memory_bound: u64,
    /// How often the stage stopped reading because the bound was reached.
    pub memory_pauses: u64,
    /// Records the stage spilled because the bound was reached.
    pub memory_spilled: u64,
    /// Event-time stages: how often an input started holding records for watermark alignment,
    /// a record of it lying beyond the watermark plus the drift
    /// ([`EventTimeOrder::max_drift_ms`](parsley_stage::EventTimeOrder::max_drift_ms)).
    pub aligned: u64,
    /// Event-time stages: records that arrived with an event time below their task's
    /// watermark (the violation counter, summed over tasks).
    pub late: u64,
    /// Event-time stages: records parked above their own event time behind a parked causal
    /// ancestor (summed over tasks; see [`TaskMetrics::raised`]).
    pub raised: u64,
    /// Event-time stages: keyed timers fired ([`parsley_stage::Processor::on_timer`] calls,
    /// summed over tasks).
    pub timers_fired: u64,
    /// Records a processor found too late to use and counted instead of dropping silently (a
    /// DSL window's record that arrived after every window it belongs to had closed;
    /// [`parsley_stage::RawStep::too_late`]).
    pub too_late: u64,
    /// Event-time stages: records parked in the tasks' timer queues at the last look (a gauge).
    pub parked: u64,
    /// Records polled and offered to the gates while a transaction committed (the commit's
    /// round trips overlapped with fetching and, for event-time stages, parking).
    pub overlapped: u64,
    /// Commits made before the commit interval was up because a task's gate blocked on a
    /// record of the open transaction itself (a stage that reads a topic it writes: a task never
    /// waits on its own open transaction; the book's specification, §7).
    pub own_write_commits: u64,
    /// Stages with the built-in clock: commits made before the commit interval was up because
    /// a tick of the open transaction would release a parked record or fire a timer once
    /// read back (a tick counts only once its transaction commits).
    pub tick_commits: u64,
    /// Stages with the built-in clock: ticks written by this instance's tasks (committed or
    /// not; an aborted transaction's ticks are counted and never read).
    pub ticks: u64,
    /// Stages with the built-in clock: ticks read back (each moved its task's processing
    /// time; none was handed to the handler).
    pub ticks_read: u64,
    /// Records the stage could not process, by kind, under any bad-record policy.
    pub bad_records: BadRecordCounts,
    /// Bad records skipped ([`BadRecordPolicy::Skip`](parsley_stage::BadRecordPolicy::Skip));
    /// those dead-lettered are in `dead_lettered`.
    pub skipped: u64,
}

impl MetricsSnapshot {
    /// Adds `other`'s counters to these: the totals of a stage run by several stream threads,
    /// each with counters of its own. Counters and gauges add up; `max_gate_wait_us` is the
    /// larger of the two.
    pub fn merge(&mut self, other: &MetricsSnapshot) {
        // Destructured, so that a counter added to the snapshot cannot be left out here.
        let MetricsSnapshot {
            fetched,
            standby_records_discarded,
            delivered,
            held,
            gate_wait_us,
            max_gate_wait_us,
            blocked_heads,
            emitted,
            transactions,
            commit_us,
            aborts,
            lost_assignments,
            committed_deliveries,
            committed_emissions,
            lookahead,
            impossible_stamps,
            dead_lettered,
            reads_beyond_cap,
            spilled,
            refetched,
            aligned,
            late,
            raised,
            timers_fired,
            too_late,
            parked,
            overlapped,
            own_write_commits,
            tick_commits,
            ticks,
            ticks_read,
            bad_records,
            skipped,
            state_memory,
            state_memory_bound,
            memory_pauses,
            memory_spilled,
        } = *other;
        self.fetched += fetched;
        self.standby_records_discarded += standby_records_discarded;
        self.delivered += delivered;
        self.held += held;
        self.gate_wait_us += gate_wait_us;
        self.max_gate_wait_us = self.max_gate_wait_us.max(max_gate_wait_us);
        self.blocked_heads += blocked_heads;
        self.emitted += emitted;
        self.transactions += transactions;
        self.commit_us += commit_us;
        self.aborts += aborts;
        self.lost_assignments += lost_assignments;
        self.committed_deliveries += committed_deliveries;
        self.committed_emissions += committed_emissions;
        self.lookahead += lookahead;
        self.impossible_stamps += impossible_stamps;
        self.dead_lettered += dead_lettered;
        self.reads_beyond_cap += reads_beyond_cap;
        self.spilled += spilled;
        self.refetched += refetched;
        self.aligned += aligned;
        self.late += late;
        self.raised += raised;
        self.timers_fired += timers_fired;
        self.too_late += too_late;
        self.parked += parked;
        self.overlapped += overlapped;
        self.own_write_commits += own_write_commits;
        self.tick_commits += tick_commits;
        self.ticks += ticks;
        self.ticks_read += ticks_read;
        for (mine, theirs) in self.state_memory.iter_mut().zip(state_memory) {
            *mine += theirs;
        }
        // One bound for the whole process: every thread reports the same.
        self.state_memory_bound = self.state_memory_bound.max(state_memory_bound);
        self.memory_pauses += memory_pauses;
        self.memory_spilled += memory_spilled;
        let BadRecordCounts {
            key_decode,
            value_decode,
            missing_key,
            missing_value,
            handler,
            output_refused,
        } = bad_records;
        self.bad_records.key_decode += key_decode;
        self.bad_records.value_decode += value_decode;
        self.bad_records.missing_key += missing_key;
        self.bad_records.missing_value += missing_value;
        self.bad_records.handler += handler;
        self.bad_records.output_refused += output_refused;
        self.skipped += skipped;
    }
}

/// Bad records of a stage by kind ([`BadRecordKind`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BadRecordCounts {
    /// Keys that did not decode.
    pub key_decode: u64,
    /// Values that did not decode.
    pub value_decode: u64,
    /// Records without a key where the stage needs one.
    pub missing_key: u64,
    /// Records without a value (tombstones) where the stage needs one.
    pub missing_value: u64,
    /// Handler errors.
    pub handler: u64,
    /// Records one of whose outputs was refused for good ([`BadRecordKind::OutputRefused`]).
    pub output_refused: u64,
}

impl BadRecordCounts {
    /// The count of `kind`.
    pub fn get(&self, kind: BadRecordKind) -> u64 {
        match kind {
            BadRecordKind::KeyDecode => self.key_decode,
            BadRecordKind::ValueDecode => self.value_decode,
            BadRecordKind::MissingKey => self.missing_key,
            BadRecordKind::MissingValue => self.missing_value,
            BadRecordKind::Handler => self.handler,
            BadRecordKind::OutputRefused => self.output_refused,
            _ => 0,
        }
    }

    /// All kinds together.
    pub fn total(&self) -> u64 {
        BadRecordKind::ALL.iter().map(|k| self.get(*k)).sum()
    }
}

impl StageMetrics {
    /// The current values.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            fetched: g(&self.fetched),
            standby_records_discarded: g(&self.standby_records_discarded),
            delivered: g(&self.delivered),
            held: g(&self.held),
            gate_wait_us: g(&self.gate_wait_us),
            max_gate_wait_us: g(&self.max_gate_wait_us),
            blocked_heads: g(&self.blocked_heads),
            emitted: g(&self.emitted),
            transactions: g(&self.transactions),
            commit_us: g(&self.commit_us),
            aborts: g(&self.aborts),
            lost_assignments: g(&self.lost_assignments),
            committed_deliveries: g(&self.committed_deliveries),
            committed_emissions: g(&self.committed_emissions),
            lookahead: g(&self.lookahead),
            impossible_stamps: g(&self.impossible_stamps),
            dead_lettered: g(&self.dead_lettered),
            reads_beyond_cap: g(&self.reads_beyond_cap),
            spilled: g(&self.spilled),
            refetched: g(&self.refetched),
            state_memory: std::array::from_fn(|i| g(&self.state_memory[i])),
            state_memory_bound: g(&self.state_memory_bound),
            memory_pauses: g(&self.memory_pauses),
            memory_spilled: g(&self.memory_spilled),
            aligned: g(&self.aligned),
            late: g(&self.late),
            raised: g(&self.raised),
            timers_fired: g(&self.timers_fired),
            too_late: g(&self.too_late),
            parked: g(&self.parked),
            overlapped: g(&self.overlapped),
            own_write_commits: g(&self.own_write_commits),
            tick_commits: g(&self.tick_commits),
            ticks: g(&self.ticks),
            ticks_read: g(&self.ticks_read),
            bad_records: BadRecordCounts {
                key_decode: g(&self.bad_records[0]),
                value_decode: g(&self.bad_records[1]),
                missing_key: g(&self.bad_records[2]),
                missing_value: g(&self.bad_records[3]),
                handler: g(&self.bad_records[4]),
                output_refused: g(&self.bad_records[5]),
            },
            skipped: g(&self.skipped),
        }
    }

    /// The counters of every task this instance owns, by partition.
    pub fn tasks(&self) -> Vec<TaskMetrics> {
        self.tasks
            .lock()
            .expect("task metrics")
            .values()
            .copied()
            .collect()
    }

    /// Updates (creating it when new) the entry of task `partition`.
    pub fn task(&self, partition: i32, update: impl FnOnce(&mut TaskMetrics)) {
        let mut tasks = self.tasks.lock().expect("task metrics");
        update(
            tasks
                .entry(partition)
                .or_insert_with(|| TaskMetrics::new(partition)),
        );
    }

    /// The standbys this instance keeps, by partition.
    pub fn standbys(&self) -> Vec<StandbyMetrics> {
        self.standbys
            .lock()
            .expect("standby metrics")
            .values()
            .copied()
            .collect()
    }

    /// Replaces the standbys' figures with `now`.
    pub fn set_standbys(&self, now: impl IntoIterator<Item = StandbyMetrics>) {
        *self.standbys.lock().expect("standby metrics") =
            now.into_iter().map(|m| (m.partition, m)).collect();
    }

    /// Counts `records` changelog records a dropped standby threw away.
    pub fn standby_discarded(&self, records: u64) {
        self.standby_records_discarded
            .fetch_add(records, Ordering::Relaxed);
    }

    /// Forgets the tasks this instance no longer owns.
    pub fn retain_tasks(&self, keep: impl Fn(i32) -> bool) {
        self.tasks
            .lock()
            .expect("task metrics")
            .retain(|p, _| keep(*p));
        self.late_keys
            .lock()
            .expect("late keys")
            .retain(|(p, _), _| keep(*p));
        self.explained.retain_restores(&keep);
    }

    /// The per-key violation counter of every event-time task this instance owns: keys with
    /// late records, ascending by task and key. Updated at every commit and when a task is
    /// restored.
    pub fn late_by_key(&self) -> Vec<LateKey> {
        self.late_keys
            .lock()
            .expect("late keys")
            .iter()
            .map(|((partition, key), late)| LateKey {
                partition: *partition,
                key: key.clone(),
                late: *late,
            })
            .collect()
    }

    /// Sets the late counts of task `partition`'s keys in `counts`; with `replace`, forgets
    /// the task's other keys first (a restored task).
    pub fn set_late_keys<'a>(
        &self,
        partition: i32,
        replace: bool,
        counts: impl IntoIterator<Item = (&'a [u8], u64)>,
    ) {
        let mut keys = self.late_keys.lock().expect("late keys");
        if replace {
            keys.retain(|(p, _), _| *p != partition);
        }
        for (key, late) in counts {
            keys.insert((partition, key.to_vec()), late);
        }
    }

    /// What the stage's tasks wait for: its stream thread's side of `Running::explain`.
    pub fn explained(&self) -> &Explained {
        &self.explained
    }

    /// Interactive queries of the stage's fold state: the callers file them, the stream thread
    /// answers them between turns (module `query`).
    pub fn queries(&self) -> &Queries {
        &self.queries
    }

    /// Records who holds each task ([`TaskOwner`]), by task.
    pub fn set_owners(&self, owners: Vec<TaskOwner>) {
        *self.owners.lock().expect("owners") = owners;
    }

    /// Who held each task, among the members that advertise an application endpoint, at the
    /// stream thread's last look at the group; empty before one, or while it rebalanced.
    pub fn owners(&self) -> Vec<TaskOwner> {
        self.owners.lock().expect("owners").clone()
    }

    /// The consumer got an assignment (`true`, before its tasks restore) or had it revoked.
    pub fn set_assigned(&self, assigned: bool) {
        self.assigned.store(assigned, Ordering::Relaxed);
    }

    /// Records what the group coordinator last said of who holds the stage's tasks (`None`:
    /// no answer yet, or the last request failed).
    pub fn set_ownership(&self, ownership: Option<Ownership>) {
        *self.ownership.lock().expect("ownership") = ownership;
    }

    /// What the group coordinator last said of who holds the stage's tasks; `None` before an
    /// answer (or after a failed request).
    pub fn ownership(&self) -> Option<Ownership> {
        *self.ownership.lock().expect("ownership")
    }

    /// Records what a commit that has waited long waits on (`None`: no commit waits long).
    pub fn set_commit_wait(&self, wait: Option<String>) {
        *self.commit_wait.lock().expect("commit wait") = wait;
    }

    /// What a commit that has waited long waits on: `"sending the input offsets … has waited
    /// 5200 ms on the group coordinator of group g (__consumer_offsets partition 3, node 2)"`.
    pub fn commit_wait(&self) -> Option<String> {
        self.commit_wait.lock().expect("commit wait").clone()
    }

    /// `true` while the consumer holds an assignment (possibly of no partition).
    pub fn is_assigned(&self) -> bool {
        self.assigned.load(Ordering::Relaxed)
    }

    /// Records how the stream thread ended (the first record stands).
    pub fn end(&self, end: StageEnd) {
        self.ended.lock().expect("stage end").get_or_insert(end);
    }

    /// How the stream thread ended; `None` while it runs.
    pub fn ended(&self) -> Option<StageEnd> {
        self.ended.lock().expect("stage end").clone()
    }

    /// Keeps the digest of one client's librdkafka statistics document.
    pub fn record_statistics(&self, json: &[u8]) {
        self.clients.lock().expect("client statistics").record(json);
    }

    /// The digest of the stage's clients' last statistics documents.
    pub fn client_statistics(&self) -> ClientStatistics {
        self.clients.lock().expect("client statistics").clone()
    }

    /// A record fetched.
    pub fn fetched(&self) {
        self.fetched.fetch_add(1, Ordering::Relaxed);
    }

    /// A record delivered to the handler.
    pub fn delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    /// A delivery the gate held for `us` µs.
    pub fn held(&self, us: u64) {
        self.held.fetch_add(1, Ordering::Relaxed);
        self.gate_wait_us.fetch_add(us, Ordering::Relaxed);
        self.max_gate_wait_us.fetch_max(us, Ordering::Relaxed);
    }

    /// `n` records polled while a transaction committed.
    pub fn overlapped(&self, n: u64) {
        self.overlapped.fetch_add(n, Ordering::Relaxed);
    }

    /// A commit made early because a gate waits on the open transaction's own write.
    pub fn own_write_commit(&self) {
        self.own_write_commits.fetch_add(1, Ordering::Relaxed);
    }

    /// A commit made for a tick of the built-in clock.
    pub fn tick_commit(&self) {
        self.tick_commits.fetch_add(1, Ordering::Relaxed);
    }

    /// A tick of the built-in clock written.
    pub fn tick_written(&self) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
    }

    /// A tick of the built-in clock read back.
    pub fn tick_read(&self) {
        self.ticks_read.fetch_add(1, Ordering::Relaxed);
    }

    /// A record that arrived with an event time below its task's watermark.
    pub fn late(&self) {
        self.late.fetch_add(1, Ordering::Relaxed);
    }

    /// A record parked above its own event time behind a parked causal ancestor.
    pub fn raised(&self) {
        self.raised.fetch_add(1, Ordering::Relaxed);
    }

    /// A timer fired.
    pub fn timer_fired(&self) {
        self.timers_fired.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` records dropped as too late.
    pub fn too_late(&self, n: u32) {
        self.too_late.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    /// Records parked now by the stage's event-time tasks (a gauge).
    pub fn parked(&self, n: u64) {
        self.parked.store(n, Ordering::Relaxed);
    }

    /// Channel heads the gates block now (a gauge).
    pub fn blocked_heads(&self, n: u64) {
        self.blocked_heads.store(n, Ordering::Relaxed);
    }

    /// An emission sent.
    pub fn emitted(&self) {
        self.emitted.fetch_add(1, Ordering::Relaxed);
    }

    /// A transaction committed `deliveries` and `emissions`; its commit took `commit_us`.
    pub fn committed(&self, deliveries: u64, emissions: u64, commit_us: u64) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.commit_us.fetch_add(commit_us, Ordering::Relaxed);
        self.committed_deliveries
            .fetch_add(deliveries, Ordering::Relaxed);
        self.committed_emissions
            .fetch_add(emissions, Ordering::Relaxed);
    }

    /// A delivery ahead of earlier records of its channel (claim-driven look-ahead).
    pub fn lookahead(&self) {
        self.lookahead.fetch_add(1, Ordering::Relaxed);
    }

    /// A record whose stamp can never be satisfied.
    pub fn impossible(&self) {
        self.impossible_stamps.fetch_add(1, Ordering::Relaxed);
    }

    /// A bad record of `kind`.
    pub fn bad_record(&self, kind: BadRecordKind) {
        if let Some(i) = BadRecordKind::ALL.iter().position(|k| *k == kind) {
            self.bad_records[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A bad record skipped.
    pub fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// A bad record sent to the dead-letter topic.
    pub fn dead_lettered(&self) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
    }

    /// A record fetched while its channel held more than `max_queued_per_channel` records.
    pub fn beyond_cap(&self) {
        self.reads_beyond_cap.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` records spilled: their payloads dropped, to be read again (the book's
    /// specification, §4).
    pub fn spilled(&self, n: usize) {
        self.spilled.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The stage holds `used` bytes per holder against a bound of `bound` bytes (module
    /// `memory`).
    pub fn state_memory(&self, used: [u64; 3], bound: u64) {
        for (m, u) in self.state_memory.iter().zip(used) {
            m.store(u, Ordering::Relaxed);
        }
        self.state_memory_bound.store(bound, Ordering::Relaxed);
    }

    /// The stage stopped reading at the memory bound.
    pub fn memory_paused(&self) {
        self.memory_pauses.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` records spilled at the memory bound.
    pub fn memory_spilled(&self, n: usize) {
        self.memory_spilled.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// An input started holding records for watermark alignment.
    pub fn aligned(&self) {
        self.aligned.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` spilled records re-fetched by seeking back.
    pub fn refetched(&self, n: u64) {
        self.refetched.fetch_add(n, Ordering::Relaxed);
    }

    /// A transaction aborted.
    pub fn aborted(&self) {
        self.aborts.fetch_add(1, Ordering::Relaxed);
    }

    /// The group dropped this member: its assignment is lost.
    pub fn assignment_lost(&self) {
        self.lost_assignments.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a running stage reports to its observer.
///
/// `Clone` but not `PartialEq`: [`Progress::Failed`] carries the stage's typed error, which
/// has no equality (it holds librdkafka's and the processor's errors). Match on the variants.
// One event per commit: its size does not matter, and boxing the counters would make every
// observer dereference them.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Progress {
    /// A transaction committed; the counters after it. With several stream threads per stage
    /// each thread commits its own transactions and sends its own events, with its own counters
    /// (`Running::metrics` adds them up); so do `Failed` and `Stopped`, once per thread.
    Committed {
        /// The stage.
        stage: String,
        /// Its counters (the committing stream thread's).
        metrics: MetricsSnapshot,
    },
    /// The stage stopped with an error: the last event of that stage.
    ///
    /// `error` is the stage's own typed error (not wrapped in [`Error::StageFailed`]), so
    /// the observer can match on it (`Error::RecordsLost { .. }`, `Error::Fenced { .. }`, …)
    /// and classify it ([`Error::is_retriable`], [`Error::is_fatal`], …). It is shared
    /// (`Arc`) because [`Error`] is not `Clone` and the same error is also what
    /// `Running::stop` returns for this stage, as the `source` of its
    /// [`Error::StageFailed`]. A stream thread that panics sends no event.
    Failed {
        /// The stage.
        stage: String,
        /// The error the stage ended with.
        error: Arc<Error>,
    },
    /// The stage stopped cleanly after a shutdown request.
    Stopped {
        /// The stage.
        stage: String,
    },
}

/// One line on what the tasks of `tasks` (by stage, as `Running::task_metrics` gives them)
/// are doing, for a progress bar: restore progress (changelog offsets read of those to read,
/// summed) while any task restores; then catch-up — the frontier lag summed over every task,
/// in offsets, and for event-time stages the input channels not yet at the end offset read at
/// task start — until every task is caught up.
///
pub fn progress_summary(tasks: &[(String, Vec<TaskMetrics>)]) -> String {
    let all = || tasks.iter().flat_map(|(_, ts)| ts);
    let restoring: Vec<&TaskMetrics> = all().filter(|t| t.phase == TaskPhase::Restoring).collect();
    if !restoring.is_empty() {
        let read: i64 = restoring.iter().map(|t| t.restore_position).sum();
        let end: i64 = restoring.iter().map(|t| t.restore_end).sum();
        return format!(
            "restoring {} task(s): {read}/{end} changelog offsets",
            restoring.len()
        );
    }
    let lags: Vec<i64> = all().filter_map(|t| t.frontier_lag).collect();
    let history: u64 = all().map(|t| t.catching_up).sum();
    let history = if history > 0 {
        format!(", {history} event-time input(s) before their startup end")
    } else {
        String::new()
    };
    match lags.iter().sum::<i64>() {
        _ if lags.is_empty() => format!("starting{history}"),
        0 if history.is_empty() => "caught up".to_string(),
        lag => format!("catching up: frontier lag {lag} offsets{history}"),
    }
}

/// The explanation of `stages` (name, metrics, whether its stream thread has ended), each
/// waited for at most [`ANSWER_WITHIN`](crate::explain::ANSWER_WITHIN) in all.
pub fn explain_stages<'a>(
    stages: impl IntoIterator<Item = (&'a str, &'a StageMetrics, bool)>,
) -> Explanation {
    crate::explain::explain(
        stages.into_iter().map(|(name, metrics, finished)| {
            let ended = finished || metrics.ended().is_some();
            (name, metrics.explained(), ended)
        }),
        crate::explain::ANSWER_WITHIN,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(tasks: Vec<TaskMetrics>) -> Vec<(String, Vec<TaskMetrics>)> {
        vec![("s".to_string(), tasks)]
    }

    #[test]
    fn merged_snapshots_add_up_and_keep_the_longest_wait() {
        let mut a = MetricsSnapshot {
            delivered: 3,
            max_gate_wait_us: 9,
            transactions: 1,
            ..MetricsSnapshot::default()
        };
        a.bad_records.handler = 1;
        let mut b = MetricsSnapshot {
            delivered: 4,
            max_gate_wait_us: 5,
            transactions: 2,
            ..MetricsSnapshot::default()
        };
        b.bad_records.handler = 2;
        a.merge(&b);
        assert_eq!(a.delivered, 7);
        assert_eq!(a.transactions, 3);
        assert_eq!(a.max_gate_wait_us, 9);
        assert_eq!(a.bad_records.handler, 3);
        let mut zero = MetricsSnapshot::default();
        zero.merge(&a);
        assert_eq!(zero, a);
    }

    #[test]
    fn the_progress_summary_says_restore_then_catch_up_then_caught_up() {
        let mut a = TaskMetrics::new(0);
        let mut b = TaskMetrics::new(1);
        (a.restore_position, a.restore_end) = (40, 100);
        (b.restore_position, b.restore_end) = (5, 10);
        assert_eq!(
            progress_summary(&stage(vec![a, b])),
            "restoring 2 task(s): 45/110 changelog offsets"
        );
        b.phase = TaskPhase::Running;
        assert_eq!(
            progress_summary(&stage(vec![a, b])),
            "restoring 1 task(s): 40/100 changelog offsets"
        );
        a.phase = TaskPhase::Running;
        assert_eq!(progress_summary(&stage(vec![a, b])), "starting");
        (a.frontier_lag, b.frontier_lag) = (Some(700), Some(12));
        b.catching_up = 2;
        assert_eq!(
            progress_summary(&stage(vec![a, b])),
            "catching up: frontier lag 712 offsets, 2 event-time input(s) before their startup end"
        );
        (a.frontier_lag, b.frontier_lag, b.catching_up) = (Some(0), Some(0), 0);
        assert_eq!(progress_summary(&stage(vec![a, b])), "caught up");
    }
}
