//! Rebalancing and cycles on the real broker: two instances of one application in one group
//! (a revoked task commits what it delivered before it is handed over; tasks move with their
//! state; every input reaches the output exactly once), and a loop through two stages that
//! makes progress.

use std::time::Duration;

use std::collections::BTreeMap;

use parsley_runtime::{Runtime, RuntimeConfig, TaskPhase, partition_for};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::fixtures::{
    bootstrap, count_topology, create_topic, forward_topology, raw_producer, read_committed,
    send_stamped, unique_topic, utf8_stage, wait_committed, wait_metrics, wait_tasks,
};

fn config(instance: &str, commit_interval: Duration) -> RuntimeConfig {
    let mut c = RuntimeConfig::new(bootstrap()).commit_interval(commit_interval);
    c.instance_id = instance.to_string();
    c
}

#[test]
fn a_revoked_task_commits_what_it_delivered_before_the_handover() {
    let input = create_topic("rebalance-in", 2);
    let output = create_topic("rebalance-out", 2);
    let p = raw_producer(None);
    let send = |range: std::ops::Range<u32>| {
        for i in range {
            let v = format!("v{i:03}");
            let partition = partition_for(v.as_bytes(), 2);
            send_stamped(&p, &input.name, partition, v.as_bytes(), v.as_bytes(), None);
        }
    };
    send(0..200);
    let topology = forward_topology(
        &unique_topic("rebalance"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );

    // Instance a delivers everything but, with a ten-minute commit interval, commits nothing.
    let a = Runtime::new(topology.clone(), config("a", Duration::from_secs(600)))
        .start()
        .unwrap();
    let m = wait_metrics(&a, "forward", "200 deliveries", |m| m.delivered >= 200);
    assert_eq!(m.committed_deliveries, 0, "{m:?}");

    // Instance b joins: the group rebalances and a's tasks are revoked — a commits first.
    let b = Runtime::new(topology, config("b", Duration::from_millis(100)))
        .start()
        .unwrap();
    let m = wait_metrics(&a, "forward", "200 committed deliveries", |m| {
        m.committed_deliveries >= 200
    });
    assert_eq!(m.aborts, 0, "nothing delivered was thrown away: {m:?}");

    // Both instances work on (a still commits only when it stops): every input reaches the
    // output exactly once.
    send(200..300);
    let delivered_by_a = |r: &parsley_runtime::Running| {
        r.metrics()
            .into_iter()
            .find(|(n, _)| n == "forward")
            .map_or(0, |(_, m)| m.delivered)
    };
    wait_metrics(&b, "forward", "the rest", |mb| {
        mb.committed_deliveries + delivered_by_a(&a) >= 300
    });
    let ma = a.stop().unwrap()[0].1;
    let mb = b.stop().unwrap()[0].1;
    assert_eq!(
        ma.committed_deliveries + mb.committed_deliveries,
        300,
        "{ma:?} {mb:?}"
    );
    let mut out: Vec<String> = read_committed(&output)
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    out.sort();
    let expected: Vec<String> = (0..300).map(|i| format!("v{i:03}")).collect();
    assert_eq!(out, expected);
}

/// Instance `a` counts 100 records of ten keys over two tasks; instance `b` joins and takes one
/// task over (evidence: `b` reports a running task, `a` one task less); 100 more records
/// follow. The moved task's counts go on from where `a` committed them — each key's outputs
/// are exactly `1..=20` — so the task moved with its state.
#[test]
fn a_task_moves_to_a_joining_instance_with_its_state() {
    let input = create_topic("move-in", 2);
    let output = create_topic("move-out", 2);
    let p = raw_producer(None);
    let send = |range: std::ops::Range<u32>| {
        for i in range {
            let key = format!("k{}", i % 10);
            let partition = partition_for(key.as_bytes(), 2);
            send_stamped(&p, &input.name, partition, key.as_bytes(), b"x", None);
        }
    };
    send(0..100);
    let topology = count_topology(&unique_topic("move"), &input.name, &output.name);
    let a = Runtime::new(topology.clone(), config("a", Duration::from_millis(100)))
        .start()
        .unwrap();
    wait_committed(&a, "count", 100);
    let b = Runtime::new(topology, config("b", Duration::from_millis(100)))
        .start()
        .unwrap();
    let moved = wait_tasks(&b, "count", "a task moved to b", |t| {
        t.len() == 1 && t[0].phase == TaskPhase::Running
    })[0]
        .partition;
    wait_tasks(&a, "count", "a kept the other task", |t| {
        t.len() == 1 && t[0].partition != moved
    });
    send(100..200);
    let committed = |r: &parsley_runtime::Running| {
        r.metrics()
            .into_iter()
            .find(|(n, _)| n == "count")
            .map_or(0, |(_, m)| m.committed_deliveries)
    };
    // The second hundred, split between the tasks by the murmur2 partition of each key.
    let to_moved = (100..200u32)
        .filter(|i| partition_for(format!("k{}", i % 10).as_bytes(), 2) == moved)
        .count() as u64;
    wait_metrics(&b, "count", "the moved task's share", |mb| {
        mb.committed_deliveries >= to_moved && committed(&a) >= 200 - to_moved
    });
    a.stop().unwrap();
    b.stop().unwrap();
    let mut by_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in read_committed(&output) {
        let line = String::from_utf8(r.value.unwrap()).unwrap();
        let (k, n) = line.split_once('=').unwrap();
        by_key
            .entry(k.to_string())
            .or_default()
            .push(n.parse().unwrap());
    }
    assert_eq!(by_key.len(), 10);
    for (k, counts) in &by_key {
        assert_eq!(counts, &(1..=20).collect::<Vec<u64>>(), "key {k}");
    }
}

/// Stage `a` of the loop: a new input starts its round trip at hop 0; a record back from the
/// loop goes around again until its third hop, then out.
struct Around {
    input: String,
    mid: String,
    out: String,
}

impl parsley_stage::Handler for Around {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: parsley_stage::Record<'_, String, String>,
        _: Option<()>,
    ) -> parsley_stage::HandlerResult<String, String, ()> {
        let step = parsley_stage::Step::none();
        if r.topic == self.input {
            return Ok(step.emit(self.mid.as_str(), r.key, format!("{}:0", r.value)));
        }
        let (v, hops) = r.value.rsplit_once(':').ok_or("a looped value is v:hops")?;
        let hops: u32 = hops.parse()?;
        Ok(if hops < 3 {
            step.emit(self.mid.as_str(), r.key, format!("{v}:{}", hops + 1))
        } else {
            step.emit(self.out.as_str(), r.key, r.value.clone())
        })
    }
}

/// Runs `topology` until stage `a` has committed `deliveries`, then returns the values on
/// `out`, sorted; they must be each input `v{i}` (for `i` below `inputs`) after its third hop.
fn around_the_loop(
    topology: parsley_stage::Topology,
    out: &parsley_runtime::TopicInfo,
    inputs: usize,
    deliveries: u64,
) -> parsley_runtime::MetricsSnapshot {
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let m = wait_committed(&running, "a", deliveries);
    running.stop().unwrap();
    let mut got: Vec<String> = read_committed(out)
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    got.sort();
    let mut expected: Vec<String> = (0..inputs).map(|i| format!("v{i}:3")).collect();
    expected.sort();
    assert_eq!(got, expected);
    m
}

/// Stage `a` ([`Around`]): reads `input` and `back`, writes `mid` and `out` (`mid` may be
/// `back`: a loop through the stage itself).
fn around(
    b: parsley_stage::TopologyBuilder,
    input: &str,
    back: &str,
    mid: &str,
    out: &str,
) -> parsley_stage::TopologyBuilder {
    let handler = Around {
        input: input.to_string(),
        mid: mid.to_string(),
        out: out.to_string(),
    };
    b.stage("a", handler, |s| utf8_stage(s, &[input, back], &[mid, out]))
}

#[test]
fn a_stage_that_reads_what_it_writes_through_a_second_stage_makes_progress() {
    // a: in + loop → mid | out;  b: mid → loop.  Each input goes around the loop four times
    // through both stages' transactions; no task waits on its own open transaction.
    let input = create_topic("loop-in", 1);
    let mid = create_topic("loop-mid", 1);
    let back = create_topic("loop-back", 1);
    let out = create_topic("loop-out", 1);
    let topology = around(
        parsley_stage::Topology::builder(unique_topic("loop")),
        &input.name,
        &back.name,
        &mid.name,
        &out.name,
    )
    .stage(
        "b",
        parsley_testkit::fixtures::Forward(back.name.clone()),
        |s| utf8_stage(s, &[&mid.name], &[&back.name]),
    )
    .build()
    .unwrap();
    let p = raw_producer(None);
    for i in 0..10 {
        let v = format!("v{i}");
        send_stamped(&p, &input.name, 0, b"k", v.as_bytes(), None);
    }
    // a: 10 inputs + 4 × 10 returns (b: 4 × 10).
    around_the_loop(topology, &out, 10, 50);
}

#[test]
fn a_stage_that_reads_what_it_writes_itself_makes_progress() {
    // a: in + loop → loop | out, two tasks. Each input goes around the loop four times through
    // the stage's own transactions: every hop is read back once committed, stamped by the
    // task itself (its own sender on a channel it consumes), and routed by key to either task.
    let input = create_topic("self-in", 2);
    let looped = create_topic("self-loop", 2);
    let out = create_topic("self-out", 2);
    let topology = around(
        parsley_stage::Topology::builder(unique_topic("self")),
        &input.name,
        &looped.name,
        &looped.name,
        &out.name,
    )
    .build()
    .unwrap();
    let p = raw_producer(None);
    for i in 0..20 {
        let (k, v) = (format!("k{}", i % 4), format!("v{i}"));
        let partition = partition_for(k.as_bytes(), 2);
        send_stamped(&p, &input.name, partition, k.as_bytes(), v.as_bytes(), None);
    }
    // 20 inputs + 4 × 20 returns.
    let m = around_the_loop(topology, &out, 20, 100);
    assert_eq!(m.impossible_stamps, 0, "{m:?}");
}
