//! The stages' metrics in the Prometheus text format (version 0.0.4), encoded by
//! `prometheus-client`.
//!
//! Every metric is named `parsley_…`, with its unit in the name (`_seconds`, `_offsets`) and
//! `_total` on counters; labels `stage`, `partition`, `kind`, `policy`, `phase`, `topic`,
//! `broker`, `client`, `quantile`, `state`, `thread`. A stage's own metrics are its totals over
//! its stream threads; only librdkafka's, which are per client, and the tasks per thread carry
//! `thread`. Stage metrics and task metrics have names of their
//! own (`parsley_task_…`), so that a sum over a name never adds a stage to its tasks. A figure
//! the runtime does not know yet (a task's frontier lag or watermark before its evidence) is
//! left out rather than shown as zero. The tables below are the one list of what is exported;
//! the book's operations chapter describes each entry.

use std::fmt;

use parsley_stage::{BadRecordKind, BadRecordPolicy, ImpossiblePolicy, StageSpec};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use parsley_task::client_stats::{ClientDigest, ClientStatistics};
use parsley_task::metrics::{MetricsSnapshot, Ownership, StandbyMetrics, TaskMetrics, TaskPhase};

use crate::threads::StageThreads;

/// The `Content-Type` of what [`encode`] writes.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// One stage as the exposition sees it at one scrape.
#[derive(Debug, Clone)]
pub(crate) struct StageView {
    /// The stage's name.
    pub(crate) name: String,
    /// Its bad-record policy's name (the `policy` label of `parsley_bad_records_total`).
    pub(crate) bad_record_policy: &'static str,
    /// Its impossible-stamp policy's name (the `policy` label of
    /// `parsley_impossible_stamps_total`).
    pub(crate) impossible_policy: &'static str,
    /// Whether its stream thread still runs.
    pub(crate) running: bool,
    /// Its counters.
    pub(crate) metrics: MetricsSnapshot,
    /// Its tasks' counters.
    pub(crate) tasks: Vec<TaskMetrics>,
    /// Its clients' librdkafka statistics, by stream thread.
    pub(crate) clients: Vec<ClientStatistics>,
    /// The tasks each stream thread owns, by thread.
    pub(crate) thread_tasks: Vec<u64>,
    /// Its tasks no member of its group holds, at the last look (`None`: not known).
    pub(crate) ownership: Option<Ownership>,
    /// Its standbys: warm copies of tasks this instance does not own.
    pub(crate) standbys: Vec<StandbyMetrics>,
}

impl StageView {
    /// The stage `spec` now, from the live metrics of its stream threads.
    pub(crate) fn of(spec: &StageSpec, threads: &StageThreads) -> Self {
        StageView {
            name: spec.name().to_string(),
            bad_record_policy: bad_record_policy(spec.bad_record_policy()),
            impossible_policy: impossible_policy(spec.impossible_policy()),
            running: threads.ended().is_none(),
            metrics: threads.snapshot(),
            tasks: threads.tasks(),
            clients: threads
                .threads()
                .iter()
                .map(|m| m.client_statistics())
                .collect(),
            thread_tasks: threads
                .threads()
                .iter()
                .map(|m| m.tasks().len() as u64)
                .collect(),
            ownership: threads.ownership(),
            standbys: threads.standbys(),
        }
    }
}

/// The `policy` label of a bad-record policy.
fn bad_record_policy(policy: &BadRecordPolicy) -> &'static str {
    match policy {
        BadRecordPolicy::Fail => "fail",
        BadRecordPolicy::Skip => "skip",
        BadRecordPolicy::DeadLetter { .. } => "dead-letter",
    }
}

/// The `policy` label of an impossible-stamp policy.
fn impossible_policy(policy: &ImpossiblePolicy) -> &'static str {
    match policy {
        ImpossiblePolicy::Fail => "fail",
        ImpossiblePolicy::DeliverAndCount => "deliver-and-count",
        ImpossiblePolicy::DeadLetter { .. } => "dead-letter",
    }
}

/// The text of every metric of `stages`.
pub(crate) fn encode(stages: Vec<StageView>) -> String {
    let mut registry = Registry::with_prefix("parsley");
    registry.register_collector(Box::new(Stages(stages)));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("writing to a String does not fail");
    text
}

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    /// A count.
    Count(u64),
    /// A signed integer (offsets).
    Int(i64),
    /// A real number (seconds).
    Real(f64),
}

/// Counter or gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// What a metric is: its name without the prefix, unit and `_total` suffix; its unit; its kind;
/// its help.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Family {
    name: &'static str,
    unit: Option<&'static str>,
    kind: Kind,
    help: &'static str,
}

#[cfg(test)]
impl Family {
    /// The name a scrape shows: `parsley_{name}[_{unit}][_total]`.
    pub(crate) fn exported_name(&self) -> String {
        let unit = self.unit.map(|u| format!("_{u}")).unwrap_or_default();
        let total = if self.kind == Kind::Counter {
            "_total"
        } else {
            ""
        };
        format!("parsley_{}{unit}{total}", self.name)
    }
}

/// One metric of a table: its family and its value for one entry (`None`: not known, no
/// sample).
struct Metric<T> {
    family: Family,
    value: fn(&T) -> Option<Value>,
}

/// A table entry.
const fn m<T>(
    name: &'static str,
    unit: Option<&'static str>,
    kind: Kind,
    help: &'static str,
    value: fn(&T) -> Option<Value>,
) -> Metric<T> {
    Metric {
        family: Family {
            name,
            unit,
            kind,
            help,
        },
        value,
    }
}

/// µs as seconds.
fn seconds(us: u64) -> Value {
    Value::Real(us as f64 / 1_000_000.0)
}

/// The stage metrics (label `stage`; the bad-record and impossible-stamp counters have
/// families of their own below).
#[rustfmt::skip]
const STAGE: &[Metric<MetricsSnapshot>] = &[
    m("records_fetched", None, Kind::Counter, "Records fetched and offered to the gate (the built-in clock's ticks included).", |m| Some(Value::Count(m.fetched))),
    m("records_delivered", None, Kind::Counter, "Records delivered to the handler, committed or not (ticks never are).", |m| Some(Value::Count(m.delivered))),
    m("records_held", None, Kind::Counter, "Delivered records that the gate held because a claimed cause was not delivered yet.", |m| Some(Value::Count(m.held))),
    m("gate_wait", Some("seconds"), Kind::Counter, "Total time held records spent in the gate between arrival and delivery.", |m| Some(seconds(m.gate_wait_us))),
    m("gate_wait_max", Some("seconds"), Kind::Gauge, "The longest time a held record spent in the gate.", |m| Some(seconds(m.max_gate_wait_us))),
    m("blocked_heads", None, Kind::Gauge, "Channel heads blocked on a claimed cause at the last look.", |m| Some(Value::Count(m.blocked_heads))),
    m("records_emitted", None, Kind::Counter, "Records sent by the handler, committed or not.", |m| Some(Value::Count(m.emitted))),
    m("transactions_committed", None, Kind::Counter, "Transactions committed.", |m| Some(Value::Count(m.transactions))),
    m("commit", Some("seconds"), Kind::Counter, "Total time the committed transactions' commits took, from the start of each commit (outputs flushed, changelog written, input offsets sent) until the broker acknowledged it.", |m| Some(seconds(m.commit_us))),
    m("transactions_aborted", None, Kind::Counter, "Transactions aborted.", |m| Some(Value::Count(m.aborts))),
    m("assignments_lost", None, Kind::Counter, "Assignments lost: the group dropped this member (its session timed out), so its open transaction was aborted instead of committed.", |m| Some(Value::Count(m.lost_assignments))),
    m("committed_deliveries", None, Kind::Counter, "Deliveries covered by committed transactions.", |m| Some(Value::Count(m.committed_deliveries))),
    m("committed_emissions", None, Kind::Counter, "Emissions covered by committed transactions.", |m| Some(Value::Count(m.committed_emissions))),
    m("lookahead_deliveries", None, Kind::Counter, "Deliveries ahead of earlier records of their channel (claim-driven look-ahead).", |m| Some(Value::Count(m.lookahead))),
    m("records_dead_lettered", None, Kind::Counter, "Records routed to a dead-letter topic (bad records and impossible stamps).", |m| Some(Value::Count(m.dead_lettered))),
    m("records_skipped", None, Kind::Counter, "Bad records skipped under the Skip policy.", |m| Some(Value::Count(m.skipped))),
    m("reads_beyond_cap", None, Kind::Counter, "Records fetched while their channel held more than max_queued_per_channel records.", |m| Some(Value::Count(m.reads_beyond_cap))),
    m("records_spilled", None, Kind::Counter, "Records whose payloads a full channel dropped to read on (re-fetched later).", |m| Some(Value::Count(m.spilled))),
    m("inputs_aligned", None, Kind::Counter, "Event-time stages: how often an input started holding records beyond the watermark plus the drift (watermark alignment).", |m| Some(Value::Count(m.aligned))),
    m("records_refetched", None, Kind::Counter, "Spilled records fetched again by seeking back.", |m| Some(Value::Count(m.refetched))),
    m("state_memory_store", Some("bytes"), Kind::Gauge, "With a memory bound: the stage's state store cache and memtables counted against it.", |m| (m.state_memory_bound > 0).then_some(Value::Count(m.state_memory[0]))),
    m("state_memory_state", Some("bytes"), Kind::Gauge, "With a memory bound: the stage's fold state on the heap (on disk: changes not in the store yet) and in-memory standbys counted against it.", |m| (m.state_memory_bound > 0).then_some(Value::Count(m.state_memory[1]))),
    m("state_memory_held", Some("bytes"), Kind::Gauge, "With a memory bound: the stage's records fetched and not delivered (held by the gate, parked for event time) counted against it.", |m| (m.state_memory_bound > 0).then_some(Value::Count(m.state_memory[2]))),
    m("state_memory_bound", Some("bytes"), Kind::Gauge, "The process's memory bound for state (state_memory_bytes), shared by every stage.", |m| (m.state_memory_bound > 0).then_some(Value::Count(m.state_memory_bound))),
    m("state_memory_pauses", None, Kind::Counter, "With a memory bound: how often the stage stopped reading because the bound was reached.", |m| (m.state_memory_bound > 0).then_some(Value::Count(m.memory_pauses))),
    m("state_memory_spilled", None, Kind::Counter, "With a memory bound: records the stage spilled because the bound was reached.", |m| (m.state_memory_bound > 0).then_some(Value::Count(m.memory_spilled))),
    m("records_late", None, Kind::Counter, "Event-time stages: records that arrived with an event time below their task's watermark.", |m| Some(Value::Count(m.late))),
    m("records_raised", None, Kind::Counter, "Event-time stages: records parked above their own event time behind a parked causal ancestor.", |m| Some(Value::Count(m.raised))),
    m("records_parked", None, Kind::Gauge, "Event-time stages: records parked in the tasks' timer queues at the last look.", |m| Some(Value::Count(m.parked))),
    m("timers_fired", None, Kind::Counter, "Event-time stages: keyed timers fired.", |m| Some(Value::Count(m.timers_fired))),
    m("records_too_late", None, Kind::Counter, "Records a processor found too late to use (a window's record after every window it belongs to closed).", |m| Some(Value::Count(m.too_late))),
    m("records_overlapped", None, Kind::Counter, "Records polled and offered while a transaction committed.", |m| Some(Value::Count(m.overlapped))),
    m("own_write_commits", None, Kind::Counter, "Commits made early because a gate waited on the open transaction's own write.", |m| Some(Value::Count(m.own_write_commits))),
    m("tick_commits", None, Kind::Counter, "Stages with the built-in clock: commits made early because a tick of the open transaction would release a parked record.", |m| Some(Value::Count(m.tick_commits))),
    m("ticks_written", None, Kind::Counter, "Stages with the built-in clock: ticks written, committed or not.", |m| Some(Value::Count(m.ticks))),
    m("ticks_read", None, Kind::Counter, "Stages with the built-in clock: ticks read back.", |m| Some(Value::Count(m.ticks_read))),
    m("standby_records_discarded", None, Kind::Counter, "Changelog records read into standbys kept in memory and thrown away: the standby was dropped before its task was assigned here.", |m| Some(Value::Count(m.standby_records_discarded))),
];

/// The task metrics (labels `stage`, `partition`; the phase has a family of its own below).
#[rustfmt::skip]
const TASK: &[Metric<TaskMetrics>] = &[
    m("task_restore_next_offset", None, Kind::Gauge, "The next changelog offset the task's restore reads.", |t| Some(Value::Int(t.restore_position))),
    m("task_restore_start_offset", None, Kind::Gauge, "The changelog offset the task's restore started reading at: 0, or the checkpoint of its copy in the state store.", |t| Some(Value::Int(t.restore_start))),
    m("task_restore_end_offset", None, Kind::Gauge, "The changelog's high watermark when the task's restore started: the restore is done when the next offset reaches it.", |t| Some(Value::Int(t.restore_end))),
    m("task_restore_records", None, Kind::Gauge, "Changelog records the task's last restore read: 0 after a return to its last commit in memory.", |t| Some(Value::Count(t.restore_records))),
    m("task_restores", None, Kind::Counter, "The task's restores from its changelog since this instance took it.", |t| Some(Value::Count(t.restores))),
    m("task_rollbacks", None, Kind::Counter, "The task's returns to its last commit in memory after an abort, without reading its changelog, since this instance took it.", |t| Some(Value::Count(t.rollbacks))),
    m("task_records_delivered", None, Kind::Counter, "Records the task delivered to the handler, committed or not.", |t| Some(Value::Count(t.delivered))),
    m("task_records_held", None, Kind::Counter, "Delivered records the task's gate held for a claimed cause.", |t| Some(Value::Count(t.held))),
    m("task_gate_wait", Some("seconds"), Kind::Counter, "Total time the task's held records waited in its gate.", |t| Some(seconds(t.gate_wait_us))),
    m("task_gate_wait_max", Some("seconds"), Kind::Gauge, "The longest time a held record waited in the task's gate.", |t| Some(seconds(t.max_gate_wait_us))),
    m("task_blocked_heads", None, Kind::Gauge, "Heads of the task's channels blocked at the last look.", |t| Some(Value::Count(t.blocked_heads))),
    m("task_impossible_stamps", None, Kind::Counter, "The task's records with impossible stamps, under any policy.", |t| Some(Value::Count(t.impossible_stamps))),
    m("task_frontier_lag", Some("offsets"), Kind::Gauge, "Offsets between the first undelivered offset and the end of the consumer's last fetch, summed over the task's channels (absent until every channel had a fetch response).", |t| t.frontier_lag.map(Value::Int)),
    m("task_records_parked", None, Kind::Gauge, "Event-time stages: records parked in the task's timer queue.", |t| Some(Value::Count(t.parked))),
    m("task_records_parked_max", None, Kind::Gauge, "Event-time stages: the most records the task's timer queue held after a poll batch, since this instance took the task.", |t| Some(Value::Count(t.max_parked))),
    m("task_records_late", None, Kind::Counter, "Event-time stages: records this instance's queue took with an event time below the watermark.", |t| Some(Value::Count(t.late))),
    m("task_records_raised", None, Kind::Counter, "Event-time stages: records parked above their own event time behind a parked causal ancestor.", |t| Some(Value::Count(t.raised))),
    m("task_watermark_timestamp", Some("seconds"), Kind::Gauge, "Event-time stages: the task's watermark, seconds since the Unix epoch (absent while an input has no evidence).", |t| t.watermark_ms.map(|ms| Value::Real(ms as f64 / 1_000.0))),
    m("task_inputs_catching_up", None, Kind::Gauge, "Event-time stages: input channels not yet at the end offset read at task start.", |t| Some(Value::Count(t.catching_up))),
    m("task_ticks_written", None, Kind::Counter, "Stages with the built-in clock: ticks this instance wrote for the task.", |t| Some(Value::Count(t.ticks))),
    m("task_timers_pending", None, Kind::Gauge, "Event-time stages: keyed timers set and not fired yet.", |t| Some(Value::Count(t.timers))),
];

/// A family of its own (not a table's: more labels than the table's, or a value per kind,
/// phase, partition, broker or state).
const fn own(
    name: &'static str,
    unit: Option<&'static str>,
    kind: Kind,
    help: &'static str,
) -> Family {
    Family {
        name,
        unit,
        kind,
        help,
    }
}

const STAGE_RUNNING: Family = own(
    "stage_running",
    None,
    Kind::Gauge,
    "1 while the stage's stream thread runs; 0 once it stopped, failed or panicked.",
);
const STAGE_UNOWNED: Family = own(
    "stage_unowned_partitions",
    None,
    Kind::Gauge,
    "Tasks (partitions) of the stage that no member of its consumer group holds, as the group coordinator described the group at the last look (every few seconds): all of them while the group rebalances; a dead member counts as holding its tasks until its session times out (absent while the group cannot be described).",
);
const STAGE_THREAD_TASKS: Family = own(
    "stage_thread_tasks",
    None,
    Kind::Gauge,
    "Tasks (partitions) each stream thread of the stage in this process owns, restoring ones included (label thread: its index).",
);
const BAD_RECORDS: Family = own(
    "bad_records",
    None,
    Kind::Counter,
    "Records the stage could not process, by kind, under its bad-record policy.",
);
const IMPOSSIBLE_STAMPS: Family = own(
    "impossible_stamps",
    None,
    Kind::Counter,
    "Records whose stamps were impossible (malformed, a self claim, a claim beyond the high watermark), under the stage's impossible-stamp policy.",
);
const TASK_PHASE: Family = own(
    "task_phase",
    None,
    Kind::Gauge,
    "1 for the task's phase (restoring its changelog, or running), 0 for the other.",
);
const STANDBY_LAG: Family = own(
    "standby_lag",
    Some("offsets"),
    Kind::Gauge,
    "Offsets between the changelog partition's high watermark, as last fetched, and the next offset the task's standby reads (absent before its first fetch).",
);
const STANDBY_RECORDS: Family = own(
    "standby_records_read",
    None,
    Kind::Counter,
    "Changelog records the task's standby has read since it started.",
);
const CONSUMER_LAG: Family = own(
    "kafka_consumer_lag",
    Some("offsets"),
    Kind::Gauge,
    "Offsets between the partition's end (its last stable offset: stages read committed records) and the stage consumer's position, from the consumer's last librdkafka statistics.",
);
const REQUEST_RTT: Family = own(
    "kafka_request_rtt",
    Some("seconds"),
    Kind::Gauge,
    "Round-trip time of the client's requests to the broker over librdkafka's last statistics window (quantile 0.5 and 0.99).",
);
const TRANSACTION_STATE: Family = own(
    "kafka_transaction_state",
    None,
    Kind::Gauge,
    "1 for the state the stage's transactional producer was in at its last statistics (librdkafka's name).",
);

/// Every family a scrape describes, in its order.
#[cfg(test)]
pub(crate) fn families() -> Vec<Family> {
    let mut all = vec![STAGE_RUNNING, STAGE_UNOWNED, STAGE_THREAD_TASKS];
    all.extend(STAGE.iter().map(|m| m.family));
    all.extend([BAD_RECORDS, IMPOSSIBLE_STAMPS, TASK_PHASE]);
    all.extend(TASK.iter().map(|m| m.family));
    all.extend([STANDBY_LAG, STANDBY_RECORDS]);
    all.extend([CONSUMER_LAG, REQUEST_RTT, TRANSACTION_STATE]);
    all
}

/// Every stage's metrics, encoded at each scrape.
#[derive(Debug)]
struct Stages(Vec<StageView>);

/// A sample's labels.
type Labels = Vec<(&'static str, String)>;

impl Collector for Stages {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let stages = &self.0;
        let stage = |s: &StageView| vec![("stage", s.name.clone())];
        let e = &mut encoder;
        family(
            e,
            &STAGE_RUNNING,
            stages
                .iter()
                .map(|s| (stage(s), Value::Count(u64::from(s.running)))),
        )?;
        family(
            e,
            &STAGE_UNOWNED,
            stages
                .iter()
                .filter_map(|s| Some((stage(s), Value::Count(s.ownership?.unowned)))),
        )?;
        family(
            e,
            &STAGE_THREAD_TASKS,
            stages.iter().flat_map(|s| {
                s.thread_tasks.iter().enumerate().map(|(thread, tasks)| {
                    let labels = vec![("stage", s.name.clone()), ("thread", thread.to_string())];
                    (labels, Value::Count(*tasks))
                })
            }),
        )?;
        for metric in STAGE {
            let series = stages
                .iter()
                .filter_map(|s| Some((stage(s), (metric.value)(&s.metrics)?)));
            family(e, &metric.family, series)?;
        }
        family(
            e,
            &BAD_RECORDS,
            stages.iter().flat_map(|s| {
                BadRecordKind::ALL.iter().map(|kind| {
                    let labels = vec![
                        ("stage", s.name.clone()),
                        ("kind", kind.name().to_string()),
                        ("policy", s.bad_record_policy.to_string()),
                    ];
                    (labels, Value::Count(s.metrics.bad_records.get(*kind)))
                })
            }),
        )?;
        family(
            e,
            &IMPOSSIBLE_STAMPS,
            stages.iter().map(|s| {
                let labels = vec![
                    ("stage", s.name.clone()),
                    ("policy", s.impossible_policy.to_string()),
                ];
                (labels, Value::Count(s.metrics.impossible_stamps))
            }),
        )?;
        let task = |s: &StageView, t: &TaskMetrics| -> Labels {
            vec![
                ("stage", s.name.clone()),
                ("partition", t.partition.to_string()),
            ]
        };
        family(
            e,
            &TASK_PHASE,
            stages.iter().flat_map(|s| {
                s.tasks.iter().flat_map(move |t| {
                    [
                        ("restoring", TaskPhase::Restoring),
                        ("running", TaskPhase::Running),
                    ]
                    .map(|(name, phase)| {
                        let mut labels = task(s, t);
                        labels.push(("phase", name.to_string()));
                        (labels, Value::Count(u64::from(t.phase == phase)))
                    })
                })
            }),
        )?;
        for metric in TASK {
            let series = stages.iter().flat_map(|s| {
                s.tasks
                    .iter()
                    .filter_map(move |t| Some((task(s, t), (metric.value)(t)?)))
            });
            family(e, &metric.family, series)?;
        }
        let standby = |s: &StageView, t: &StandbyMetrics| -> Labels {
            vec![
                ("stage", s.name.clone()),
                ("partition", t.partition.to_string()),
            ]
        };
        family(
            e,
            &STANDBY_LAG,
            stages.iter().flat_map(|s| {
                s.standbys
                    .iter()
                    .filter_map(move |t| Some((standby(s, t), Value::Int(t.lag()?))))
            }),
        )?;
        family(
            e,
            &STANDBY_RECORDS,
            stages.iter().flat_map(|s| {
                s.standbys
                    .iter()
                    .map(move |t| (standby(s, t), Value::Count(t.records)))
            }),
        )?;
        encode_clients(e, stages)
    }
}

/// The families of librdkafka's statistics: one consumer and one producer per stream thread,
/// labelled `thread` (its index).
fn encode_clients(e: &mut DescriptorEncoder<'_>, stages: &[StageView]) -> fmt::Result {
    /// Each stream thread's index and statistics.
    fn threads(s: &StageView) -> impl Iterator<Item = (String, &ClientStatistics)> {
        s.clients
            .iter()
            .enumerate()
            .map(|(i, c)| (i.to_string(), c))
    }
    fn clients(c: &ClientStatistics) -> [(&'static str, Option<&ClientDigest>); 2] {
        [
            ("consumer", c.consumer.as_ref()),
            ("producer", c.producer.as_ref()),
        ]
    }
    family(
        e,
        &CONSUMER_LAG,
        stages.iter().flat_map(|s| {
            threads(s).flat_map(move |(thread, c)| {
                let lag = c.consumer.iter().flat_map(|c| &c.lag);
                lag.map(move |l| {
                    let labels = vec![
                        ("stage", s.name.clone()),
                        ("thread", thread.clone()),
                        ("topic", l.topic.clone()),
                        ("partition", l.partition.to_string()),
                    ];
                    (labels, Value::Int(l.lag))
                })
            })
        }),
    )?;
    family(
        e,
        &REQUEST_RTT,
        stages.iter().flat_map(|s| {
            threads(s).flat_map(move |(thread, c)| {
                clients(c).into_iter().flat_map(move |(client, digest)| {
                    let thread = thread.clone();
                    digest.into_iter().flat_map(move |d| {
                        let thread = thread.clone();
                        d.rtt.iter().flat_map(move |r| {
                            let thread = thread.clone();
                            [("0.5", r.p50), ("0.99", r.p99)].map(move |(quantile, v)| {
                                let labels = vec![
                                    ("stage", s.name.clone()),
                                    ("thread", thread.clone()),
                                    ("client", client.to_string()),
                                    ("broker", r.broker.to_string()),
                                    ("quantile", quantile.to_string()),
                                ];
                                (labels, Value::Real(v))
                            })
                        })
                    })
                })
            })
        }),
    )?;
    family(
        e,
        &TRANSACTION_STATE,
        stages.iter().flat_map(|s| {
            threads(s).filter_map(move |(thread, c)| {
                let t = c.producer.as_ref()?.transaction.as_ref()?;
                let labels = vec![
                    ("stage", s.name.clone()),
                    ("thread", thread),
                    ("state", t.state.clone()),
                ];
                Some((labels, Value::Count(1)))
            })
        }),
    )
}

/// Encodes `f`'s descriptor and its `series`.
fn family(
    encoder: &mut DescriptorEncoder<'_>,
    f: &Family,
    series: impl IntoIterator<Item = (Labels, Value)>,
) -> fmt::Result {
    let unit = f.unit.map(|u| match u {
        "seconds" => Unit::Seconds,
        other => Unit::Other(other.to_string()),
    });
    let kind = match f.kind {
        Kind::Counter => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
    };
    let mut descriptor = encoder.encode_descriptor(f.name, f.help, unit.as_ref(), kind)?;
    for (labels, value) in series {
        let mut sample = descriptor.encode_family(&labels)?;
        match (f.kind, value) {
            (Kind::Counter, Value::Count(v)) => {
                sample.encode_counter::<NoLabelSet, _, u64>(&v, None)?
            }
            (Kind::Counter, Value::Real(v)) => {
                sample.encode_counter::<NoLabelSet, _, u64>(&v, None)?
            }
            (Kind::Counter, Value::Int(v)) => {
                sample.encode_counter::<NoLabelSet, _, u64>(&v.max(0).unsigned_abs(), None)?
            }
            (Kind::Gauge, Value::Count(v)) => sample.encode_gauge(&v)?,
            (Kind::Gauge, Value::Int(v)) => sample.encode_gauge(&v)?,
            (Kind::Gauge, Value::Real(v)) => sample.encode_gauge(&v)?,
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "exposition_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "dashboard_tests.rs"]
mod dashboard_tests;
