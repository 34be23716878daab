//! Cases on the local three-node cluster (replication factor 3, `min.insync.replicas=2`):
//! C21 (the group coordinator leaves the cluster between two transactions), C22 (a
//! partition leader moves twice during a transaction), C28 (a source partition's replicas
//! are moved to other nodes, and its leader with them, while the stage runs) and C29 (the group
//! coordinator unavailable past the commit's bound). They stop and start nodes, so they
//! run one at a time, and only in the cluster's test group: `cargo xtask test --cluster`
//! starts the cluster and runs them with `$PARSLEY_BOOTSTRAP` pointing at it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parsley_runtime::{Progress, Runtime, RuntimeConfig, TopicInfo};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::fixtures::{
    bootstrap, committed_values, create_topic, forward_topology, group_offset, raw_producer,
    send_stamped, spawn_writer, unique_topic, wait_committed,
};
use parsley_testkit::{cluster, logs};

/// Starts the nodes it names again when dropped, so a failing test leaves the cluster whole.
struct Restart(Vec<i32>);

impl Drop for Restart {
    fn drop(&mut self) {
        for id in &self.0 {
            if let Err(e) = cluster::start(*id) {
                eprintln!("node {id} did not come back: {e}");
            }
        }
    }
}

/// Every node up, and every replica of `topics` in sync: the state each case starts from.
fn whole(topics: &[&TopicInfo]) {
    for id in cluster::nodes().expect("a cluster").iter().map(|n| n.id) {
        cluster::start(id).expect("node starts");
    }
    for t in topics {
        for p in 0..t.partitions {
            cluster::wait_partition(&t.name, p, Duration::from_secs(60), |s| {
                s.isr.len() == cluster::REPLICATION_FACTOR as usize
            })
            .expect("every replica in sync");
        }
    }
}

/// Stage settings of both cases: a transaction timeout of 10 s and a client timeout of 15 s,
/// the bounds a wait may not pass without an error.
fn config() -> RuntimeConfig {
    let mut c =
        RuntimeConfig::new(bootstrap()).producer_property("transaction.timeout.ms", "10000");
    c.timeout = Duration::from_secs(15);
    c
}

fn send(topic: &TopicInfo, values: impl IntoIterator<Item = String>) {
    let p = raw_producer(None);
    for v in values {
        send_stamped(&p, &topic.name, 0, b"k", v.as_bytes(), None);
    }
}

/// C21: the group coordinator shuts down cleanly between two transactions and stays down. The
/// next transaction's offsets reach the new coordinator and it commits: every output once, the
/// group's offset at the input's end — within the stage's timeouts, never a hang.
#[test]
#[ignore = "needs the local three-node cluster: cargo xtask test --cluster"]
fn c21_the_group_coordinator_leaves_and_the_next_transaction_commits() {
    let input = create_topic("c21-in", 1);
    let output = create_topic("c21-out", 1);
    whole(&[&input, &output]);
    let app = unique_topic("c21");
    let group = format!("{app}.forward");
    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    send(&input, (0..10).map(|i| format!("a{i}")));
    let running = Runtime::new(topology, config()).start().unwrap();
    // One transaction committed: the producer knows the group's coordinator.
    wait_committed(&running, "forward", 10);
    let coordinator = cluster::group_coordinator(&group)
        .unwrap()
        .expect("the group has a coordinator");
    let _restart = Restart(vec![coordinator]);
    assert!(cluster::stop(coordinator), "node {coordinator} was running");
    let moved = cluster::wait_partition(
        "__consumer_offsets",
        cluster::coordinator_partition(&group),
        Duration::from_secs(30),
        |s| s.leader.is_some_and(|l| l != coordinator),
    )
    .unwrap();
    println!(
        "group coordinator moved from node {coordinator} to node {}",
        moved.leader.unwrap()
    );

    let stopped = Instant::now();
    send(&input, (0..10).map(|i| format!("b{i}")));
    // The bound: the stage's client timeout plus the transaction timeout, with room for one
    // recovery. Progress events are the evidence; a failure is the stage's typed error.
    let bound = Duration::from_secs(15 + 10 + 15);
    loop {
        let committed = running
            .metrics()
            .into_iter()
            .find(|(n, _)| n == "forward")
            .map_or(0, |(_, m)| m.committed_deliveries);
        if committed >= 20 {
            break;
        }
        let left = bound.saturating_sub(stopped.elapsed());
        assert!(
            !left.is_zero(),
            "the stage committed {committed} of 20 deliveries {bound:?} after the coordinator left: a hang"
        );
        if let Some(Progress::Failed { stage, error }) =
            running.next_progress(left.min(Duration::from_millis(50)))
        {
            panic!("stage {stage} failed after the coordinator left: {error}")
        }
    }
    let took = stopped.elapsed();
    running.stop().unwrap();
    let expected: Vec<String> = (0..10)
        .map(|i| format!("a{i}"))
        .chain((0..10).map(|i| format!("b{i}")))
        .collect();
    assert_eq!(
        committed_values(&output),
        expected,
        "every output once, in order"
    );
    assert_eq!(group_offset(&group, &input.name, 0), Some(20));
    println!("the next transaction committed {took:?} after the coordinator stopped");
}

/// C22: while the stage's transactions write to the output partition, its leader moves twice
/// within a second (a preferred-leader election, then a controlled shutdown of the new
/// leader). Every transaction either commits whole or aborts and is redone: `read_committed`
/// shows every record exactly once, in send order.
#[test]
#[ignore = "needs the local three-node cluster: cargo xtask test --cluster"]
fn c22_the_leader_moves_twice_during_a_transaction() {
    let input = create_topic("c22-in", 1);
    let output = create_topic("c22-out", 1);
    whole(&[&input, &output]);
    let state = cluster::partition(&output.name, 0).unwrap();
    assert_eq!(state.replicas.len(), 3, "replication factor 3: {state:?}");
    let preferred = state.replicas[0];
    // Leadership away from the preferred replica, which then rejoins as a follower: a
    // preferred-leader election will move it back.
    {
        let _restart = Restart(vec![preferred]);
        assert!(cluster::stop(preferred));
        cluster::wait_partition(&output.name, 0, Duration::from_secs(30), |s| {
            s.leader.is_some_and(|l| l != preferred)
        })
        .unwrap();
    }
    cluster::wait_partition(&output.name, 0, Duration::from_secs(60), |s| {
        s.isr.contains(&preferred)
    })
    .unwrap();

    let app = unique_topic("c22");
    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    // Commits every 500 ms: a transaction is open and writing whenever the leader moves.
    let running = Runtime::new(
        topology,
        config().commit_interval(Duration::from_millis(500)),
    )
    .start()
    .unwrap();
    let stop_writing = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&input, &stop_writing);
    wait_committed(&running, "forward", 200);

    let _restart = Restart(vec![preferred]);
    cluster::elect_preferred_leader(&output.name, 0).unwrap();
    let elected = Instant::now();
    assert!(cluster::stop(preferred));
    let after = cluster::wait_partition(&output.name, 0, Duration::from_secs(30), |s| {
        s.leader.is_some_and(|l| l != preferred)
    })
    .unwrap();
    println!(
        "leader moved to node {preferred} (election), then to node {} (controlled shutdown of node {preferred}; seen in the metadata {:?} after the election returned)",
        after.leader.unwrap(),
        elected.elapsed()
    );
    let committed_then = running
        .metrics()
        .into_iter()
        .find(|(n, _)| n == "forward")
        .map_or(0, |(_, m)| m.committed_deliveries);
    // Work goes on after the moves: more than another 200 records committed.
    wait_committed(&running, "forward", committed_then + 200);
    stop_writing.store(true, Ordering::Relaxed);
    let sent = writer.join().unwrap();
    wait_committed(&running, "forward", sent);
    running.stop().unwrap();
    // Every node back before reading (a reader that meets a stopped node fails).
    whole(&[&input, &output]);
    let values = committed_values(&output);
    let expected: Vec<String> = (0..sent).map(|n| n.to_string()).collect();
    assert_eq!(values.len(), expected.len(), "every record exactly once");
    assert_eq!(values, expected, "in send order");
}

/// C28: a source partition is reassigned while the stage reads it — its replicas moved from
/// two nodes to two others, its leader with them — under a writer that keeps writing. The
/// stage neither stalls (it commits hundreds more records after the move) nor duplicates nor
/// loses a record: the output is the input, once each, in order.
#[test]
#[ignore = "needs the local three-node cluster: cargo xtask test --cluster"]
fn c28_a_source_partition_reassigned_while_the_stage_reads_it() {
    let nodes: Vec<i32> = cluster::nodes()
        .expect("a cluster")
        .iter()
        .map(|n| n.id)
        .collect();
    let (a, b, c) = (nodes[0], nodes[1], nodes[2]);
    let name = unique_topic("c28-in");
    cluster::create_topic_on(&name, &[a, b]).expect("the input on two nodes");
    let input = parsley_testkit::fixtures::admin()
        .describe_topics(&[name.as_str()])
        .unwrap()
        .remove(0);
    let output = create_topic("c28-out", 1);
    whole(&[&output]);
    cluster::wait_partition(&input.name, 0, Duration::from_secs(60), |s| {
        s.isr.len() == 2 && s.leader == Some(a)
    })
    .expect("the input's replicas in sync, its preferred leader leading");

    let app = unique_topic("c28");
    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    let running = Runtime::new(
        topology,
        config().commit_interval(Duration::from_millis(500)),
    )
    .start()
    .unwrap();
    let stop_writing = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&input, &stop_writing);
    wait_committed(&running, "forward", 200);

    // From nodes {a, b} to {b, c}: a's replica moves to c, and the leader leaves a.
    let moved = Instant::now();
    let after = cluster::reassign(&input.name, 0, &[b, c], Duration::from_secs(120)).unwrap();
    println!(
        "input partition moved from nodes {a},{b} to {:?}, leader {:?}, in {:?}",
        after.replicas,
        after.leader,
        moved.elapsed()
    );
    assert_ne!(after.leader, Some(a), "the leader left node {a}");
    let committed_then = running
        .metrics()
        .into_iter()
        .find(|(n, _)| n == "forward")
        .map_or(0, |(_, m)| m.committed_deliveries);
    // No stall: the stage goes on reading the moved partition.
    wait_committed(&running, "forward", committed_then + 200);
    stop_writing.store(true, Ordering::Relaxed);
    let sent = writer.join().unwrap();
    wait_committed(&running, "forward", sent);
    running.stop().unwrap();
    let values = committed_values(&output);
    let expected: Vec<String> = (0..sent).map(|n| n.to_string()).collect();
    assert_eq!(values.len(), expected.len(), "every record exactly once");
    assert_eq!(values, expected, "in send order");
}

/// Puts the replicas of `__consumer_offsets` partition `partition` back on every node when
/// dropped (after the node that held it alone is started again).
struct Spread(i32);

impl Drop for Spread {
    fn drop(&mut self) {
        let all: Vec<i32> = cluster::nodes()
            .map(|n| n.iter().map(|n| n.id).collect())
            .unwrap_or_default();
        for id in &all {
            let _ = cluster::start(*id);
        }
        // Its only replica was killed: Kafka keeps it out of the eligible leaders when it
        // comes back, and only an unclean election gives the partition a leader again.
        let led =
            cluster::wait_partition("__consumer_offsets", self.0, Duration::from_secs(10), |s| {
                s.leader.is_some()
            });
        if led.is_err()
            && let Err(e) = cluster::elect_unclean_leader("__consumer_offsets", self.0)
        {
            eprintln!("__consumer_offsets partition {} has no leader: {e}", self.0);
        }
        if let Err(e) =
            cluster::reassign("__consumer_offsets", self.0, &all, Duration::from_secs(120))
        {
            eprintln!(
                "__consumer_offsets partition {} not spread again: {e}",
                self.0
            );
        }
    }
}

/// C29: the group coordinator stays unavailable past the bound. The group's
/// `__consumer_offsets` partition is first moved to one node alone, which is then killed: the
/// partition has no leader, and the group no coordinator, while the rest of the cluster (its
/// controller quorum, the stage's topics, the transaction coordinator) works. The commit
/// waits; past the notice (5 s) the readiness answer says which coordinator it waits on, past
/// the bound the error names it — never a bare timeout.
#[test]
#[ignore = "needs the local three-node cluster: cargo xtask test --cluster"]
fn c29_the_group_coordinator_unavailable_past_the_bound() {
    logs::captured(tracing::Level::WARN);
    let input = create_topic("c29-in", 1);
    let output = create_topic("c29-out", 1);
    whole(&[&input, &output]);
    let app = unique_topic("c29");
    let group = format!("{app}.forward");
    let mut config = RuntimeConfig::new(bootstrap())
        .producer_property("transaction.timeout.ms", "10000")
        .metrics_address(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    config.timeout = Duration::from_secs(8);
    let txn = cluster::transaction_coordinator(&config.transactional_id(&group))
        .unwrap()
        .expect("a transaction coordinator");
    // The node that will hold the group's partition alone: not the transaction coordinator,
    // which the stage still needs.
    let lonely = cluster::nodes()
        .unwrap()
        .iter()
        .map(|n| n.id)
        .find(|id| *id != txn)
        .unwrap();
    let partition = cluster::coordinator_partition(&group);
    let _spread = Spread(partition);
    cluster::reassign(
        "__consumer_offsets",
        partition,
        &[lonely],
        Duration::from_secs(120),
    )
    .expect("the group's partition on one node");
    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    send(&input, (0..10).map(|i| format!("a{i}")));
    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, "forward", 10);
    let address = running.metrics_address().expect("an endpoint");
    let _restart = Restart(vec![lonely]);
    assert!(cluster::kill(lonely), "node {lonely} was running");
    cluster::wait_partition(
        "__consumer_offsets",
        partition,
        Duration::from_secs(30),
        |s| s.leader.is_none(),
    )
    .expect("the group's partition without a leader");
    send(&input, (0..5).map(|i| format!("b{i}")));

    let killed = Instant::now();
    let bound = Duration::from_secs(90);
    let mut said = None;
    let mut error = None;
    while killed.elapsed() < bound && (said.is_none() || error.is_none()) {
        if said.is_none() {
            let r = minreq::get(format!("http://{address}/health/ready"))
                .with_timeout(5)
                .send()
                .expect("the endpoint answers");
            let body = r.as_str().unwrap().to_string();
            if r.status_code == 503 && body.contains("cannot commit") {
                said = Some(body);
            }
        }
        if let Some(Progress::Failed { error: e, .. }) =
            running.next_progress(Duration::from_millis(200))
        {
            error = Some(e.to_string());
        }
        if error.is_none() {
            let text = logs::captured_text(tracing::Level::WARN);
            error = text
                .lines()
                .find(|l| l.contains("aborting the transaction") && l.contains(&group))
                .map(str::to_string);
        }
    }
    let said = said.expect("the readiness answer says the commit cannot go on");
    println!("readiness: {said}");
    assert!(
        said.contains(&format!(
            "on the group coordinator of group {group} (__consumer_offsets partition {partition}, no leader: unavailable)"
        )),
        "the readiness answer names the coordinator: {said}"
    );
    let error = error.expect("the stage's error");
    println!("the stage's error: {error}");
    assert!(
        error.contains(&format!(
            "the group coordinator of group {group} (__consumer_offsets partition {partition}, no leader: unavailable)"
        )) && error.contains("sending the input offsets"),
        "the error names the coordinator and what waited on it: {error}"
    );
    drop(running);
}
