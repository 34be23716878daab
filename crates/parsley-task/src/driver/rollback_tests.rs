//! The return to the last commit in memory (module `rollback` of the task) against the
//! changelog: for random runs of deliveries, commits, commits in flight with work overlapping
//! them, and aborts, every task rebuilt from what it kept equals the one rebuilt from the
//! changelog records committed so far, and it never takes an aborted transaction for a
//! committed one or the reverse.

use std::collections::BTreeMap;
use std::sync::Arc;

use parsley_clock::Channel;
use parsley_stage::changelog::META_KEY;
use parsley_stage::{
    Error, EventTimeOrder, Handler, HandlerResult, Processor, RawEmission, RawRecord, RawStep,
    RawTimer, Record, StageSettings, StateChange, Step, Topology, Utf8,
};
use proptest::prelude::*;

use super::{ChangelogRecord, MemoryChangelog, StageRun};
use crate::driver::TopologyTestDriver;
use crate::driver::log::Logs;
use crate::task::{LastCommit, Sealed};

/// Counts the records of each key, and deletes a key's count at a value "reset".
struct Count;

impl Handler for Count {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = u64;
    fn handle(
        &self,
        r: Record<'_, String, String>,
        n: Option<u64>,
    ) -> HandlerResult<String, String, u64> {
        if r.value == "reset" {
            return Ok(Step::none().delete_state());
        }
        let n = n.unwrap_or(0) + 1;
        Ok(Step::none()
            .emit("counts", r.key, n.to_string())
            .set_state(n))
    }
}

/// Ordered by event time: each record `k` at time `t` counts in `k`'s fold state and in the
/// task state, and sets a timer for `k` at `t + 10`; a timer emits and deletes `k`'s state;
/// "reset" deletes it at once.
struct Reminders;

fn emission(key: &[u8], value: String) -> RawEmission {
    RawEmission {
        topic: Arc::from("counts"),
        key: Some(key.to_vec()),
        value: Some(value.into_bytes()),
        timestamp: None,
        headers: None,
    }
}

impl Processor for Reminders {
    fn process(&self, r: RawRecord<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        let key = r.key.unwrap_or_default();
        let total = r.task_state.map_or(0, |s| s[0]).wrapping_add(1);
        let state = if r.value == Some(b"reset") {
            StateChange::Delete
        } else {
            StateChange::Set(vec![state.map_or(0, |s| s[0]).wrapping_add(1)])
        };
        Ok(RawStep {
            emit: vec![emission(key, format!("at {}", r.timestamp))],
            state,
            task_state: StateChange::Set(vec![total]),
            timers: vec![r.timestamp + 10],
            too_late: 0,
        })
    }

    fn on_timer(&self, t: RawTimer<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        Ok(RawStep {
            emit: vec![emission(t.key, format!("timer {} after {state:?}", t.time))],
            state: StateChange::Delete,
            task_state: StateChange::Keep,
            timers: Vec::new(),
            too_late: 0,
        })
    }

    fn uses_timers(&self) -> bool {
        true
    }
}

/// The stage a run drives.
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// [`Count`].
    Counting,
    /// [`Reminders`], ordered by event time with the built-in clock (40 ms behind the
    /// driver's time: records stay parked across commits until the time moves).
    EventTime,
}

impl Stage {
    fn topology(self) -> Topology {
        let builder = Topology::builder("shop");
        let builder = match self {
            Stage::Counting => builder.stage("count", Count, |s| {
                s.source("orders")
                    .source("returns")
                    .sink("counts")
                    .key_codec(Utf8)
                    .value_codec(Utf8)
                    .output_codec(Utf8)
            }),
            Stage::EventTime => builder.processor_stage(
                "count",
                Arc::new(Reminders),
                StageSettings::new()
                    .source("orders")
                    .source("returns")
                    .sink("counts")
                    .order_by_event_time(EventTimeOrder::new().clock(40).tick_interval_ms(10)),
            ),
        };
        builder.build().unwrap()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A record of key `k` (of six) at event time `1_000 + 5 at`, "reset" when `reset`, to
    /// the second source when `returns` (an event-time task's watermark is its slower input's:
    /// records of the faster one stay parked across commits).
    Pipe {
        k: u8,
        reset: bool,
        at: u8,
        returns: bool,
    },
    /// A turn whose transaction commits.
    Turn,
    /// A turn's work whose changelog is written and whose commit is in flight.
    Seal,
    /// A turn's work in the open transaction (while a commit is in flight, its overlap).
    Work,
    /// The commit in flight returns: the tasks hear of it.
    Heard,
    /// The driver's time moves 15 ms.
    Advance,
    /// The open transaction is aborted; the commit in flight, if any, `committed` or not, the
    /// tasks not told.
    Abort { committed: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, prop::bool::weighted(0.15), 0u8..40, prop::bool::weighted(0.3))
            .prop_map(|(k, reset, at, returns)| Op::Pipe { k, reset, at, returns }),
        2 => Just(Op::Turn),
        2 => Just(Op::Seal),
        2 => Just(Op::Work),
        1 => Just(Op::Heard),
        1 => Just(Op::Advance),
        2 => any::<bool>().prop_map(|committed| Op::Abort { committed }),
    ]
}

/// A commit in flight: the changelog records each task wrote, and the offsets it names.
struct InFlight {
    records: Vec<Vec<ChangelogRecord>>,
    offsets: Vec<(Channel, i64)>,
}

impl StageRun {
    /// Writes every task's changelog records, as a commit starts, without committing them.
    fn seal(&mut self) -> InFlight {
        let mut records: Vec<Vec<ChangelogRecord>> = vec![Vec::new(); self.changelog.len()];
        let mut offsets = Vec::new();
        for task in self.tasks.values_mut() {
            let mut writer = MemoryChangelog(&mut records[task.partition() as usize]);
            offsets.extend(task.write_changelog(&self.ctx, &mut writer).unwrap());
        }
        self.uncommitted = Default::default();
        InFlight { records, offsets }
    }

    /// The commit in flight succeeded: its records and offsets are the committed ones.
    fn land(&mut self, flight: InFlight) {
        for (log, records) in self.changelog.iter_mut().zip(flight.records) {
            log.extend(records);
        }
        self.committed.extend(flight.offsets);
    }

    /// The group's committed offsets for task `partition`, as a restart assigns it.
    fn positions(&self, partition: i32) -> Vec<(Channel, i64)> {
        self.ctx
            .consumed(partition)
            .into_iter()
            .map(|c| (c, self.committed.get(&c).copied().unwrap_or(0)))
            .collect()
    }

    /// Each task's view, with its sender where its changelog has a snapshot.
    fn views(&self) -> Vec<String> {
        self.tasks
            .values()
            .map(|t| {
                let snapshot = self.changelog[t.partition() as usize]
                    .iter()
                    .any(|(k, _)| k == META_KEY);
                t.restored_view(snapshot)
            })
            .collect()
    }

    /// The abort: every task's outcome judged, each rebuilt from what it kept and from the
    /// changelog, compared; the stage goes on with the tasks rebuilt from what they kept.
    /// Returns how many returned in memory.
    fn abort(&mut self, logs: &Logs, truth: Sealed, wrote_nothing: impl Fn(i32) -> bool) -> usize {
        let tasks = std::mem::take(&mut self.tasks);
        let mut last: BTreeMap<i32, LastCommit> = BTreeMap::new();
        for (partition, task) in tasks {
            let positions = self.positions(partition);
            let Some(sealed) = task.sealed_outcome(&self.ctx, &positions) else {
                continue;
            };
            // A transaction that wrote nothing for the task is the same either way.
            if sealed != truth {
                assert!(
                    wrote_nothing(partition),
                    "task {partition} took {truth:?} for {sealed:?}"
                );
            }
            let kept = task.into_last_commit(sealed).expect("fold state in memory");
            last.insert(partition, kept);
        }
        let in_memory = last.len();
        self.restart(logs).unwrap();
        let from_changelog = self.views();
        self.restart_with(logs, last).unwrap();
        assert_eq!(self.views(), from_changelog);
        in_memory
    }
}

fn run(stage: Stage, ops: Vec<Op>) -> usize {
    let driver = TopologyTestDriver::builder(stage.topology())
        .partitions("orders", 2)
        .partitions("returns", 2)
        .start_time_ms(1_000)
        .auto_run(false)
        .build()
        .unwrap();
    let orders = driver.input_topic("orders", Utf8, Utf8).unwrap();
    let returns = driver.input_topic("returns", Utf8, Utf8).unwrap();
    let mut flight: Option<InFlight> = None;
    let mut in_memory = 0;
    for op in ops {
        if let Op::Pipe {
            k,
            reset,
            at,
            returns: to_returns,
        } = op
        {
            let value = if reset { "reset" } else { "1" };
            let at = 1_000 + 5 * i64::from(at);
            let topic = if to_returns { &returns } else { &orders };
            topic.pipe_at(format!("k{k}"), value.into(), at).unwrap();
            continue;
        }
        if let Op::Advance = op {
            driver.advance_time(15).unwrap();
            continue;
        }
        driver.with(|inner| {
            let logs = &mut inner.logs;
            let time = inner.time_ms;
            let stage = &mut inner.stages[0];
            let mut appended = Vec::new();
            match op {
                Op::Pipe { .. } | Op::Advance => unreachable!(),
                Op::Turn if flight.is_none() => {
                    stage.turn(logs, time, &mut appended).unwrap();
                }
                Op::Seal if flight.is_none() => {
                    stage.work(logs, time, &mut appended).unwrap();
                    flight = Some(stage.seal());
                }
                Op::Turn | Op::Seal | Op::Work => {
                    stage.work(logs, time, &mut appended).unwrap();
                }
                Op::Heard => {
                    if let Some(f) = flight.take() {
                        stage.land(f);
                        for task in stage.tasks.values_mut() {
                            task.committed(None).unwrap();
                        }
                    }
                }
                Op::Abort { committed } => {
                    let flight = flight.take();
                    let empty: Vec<bool> = match &flight {
                        Some(f) => f.records.iter().map(Vec::is_empty).collect(),
                        None => vec![true; stage.changelog.len()],
                    };
                    let truth = match flight {
                        Some(f) if committed => {
                            stage.land(f);
                            Sealed::Committed
                        }
                        _ => Sealed::Aborted,
                    };
                    in_memory += stage.abort(logs, truth, |p| empty[p as usize]);
                }
            }
        });
    }
    in_memory
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_task_returned_to_its_last_commit_in_memory_is_the_one_its_changelog_rebuilds(
        ops in prop::collection::vec(op(), 1..60)
    ) {
        run(Stage::Counting, ops);
    }

    #[test]
    fn an_event_time_task_returned_in_memory_is_the_one_its_changelog_rebuilds(
        ops in prop::collection::vec(op(), 1..60)
    ) {
        run(Stage::EventTime, ops);
    }
}

/// The plain case — work since the last commit, no commit in flight — returns in memory.
#[test]
fn an_abort_with_no_commit_in_flight_returns_every_task_in_memory() {
    use Op::*;
    let pipe = |k| Pipe {
        k,
        reset: false,
        at: k,
        returns: false,
    };
    let ops = vec![
        pipe(0),
        pipe(1),
        Turn,
        pipe(0),
        pipe(2),
        Work,
        Abort { committed: false },
        pipe(3),
        Seal,
        pipe(0),
        Work,
        Abort { committed: true },
        pipe(4),
        Seal,
        Work,
        Abort { committed: false },
    ];
    // Two tasks at each of the three aborts (the first commit's offsets differ from the one in
    // flight at the last two, so the offsets tell).
    assert_eq!(run(Stage::Counting, ops.clone()), 6);
    assert_eq!(run(Stage::EventTime, ops), 6);
}
