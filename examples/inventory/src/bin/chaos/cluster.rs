//! The faults of `chaos run --cluster`, on the local three-node cluster
//! (`parsley_testkit::cluster`: replication factor 3, `min.insync.replicas=2`), on top of the
//! process faults (kill, crash, join):
//! - `leader`: `kill -9` of the node leading a partition of a source or an output, then a
//!   restart;
//! - `txn-coord`: `kill -9` of a stage's transaction coordinator (the leader of its
//!   transactional id's `__transaction_state` partition), then a restart;
//! - `group-coord`: `kill -9` of a stage's group coordinator (the leader of its group's
//!   `__consumer_offsets` partition), then a restart;
//! - `shutdown`: a controlled shutdown of a node (its leaderships move before it exits), then a
//!   restart;
//! - `election`: a preferred-leader election that moves an output partition's leader while the
//!   stages' transactions write to it (first moving the leadership away from the preferred
//!   replica when it holds it);
//! - `min-isr`: an output topic's `min.insync.replicas` raised to 3 and one node killed: every
//!   write to the topic is refused (`NOT_ENOUGH_REPLICAS`) until the node is back; held for
//!   2–6 s, then the node restarts and the setting returns to 2. (With three replicas, one
//!   node down leaves two in sync, which `min.insync.replicas=2` accepts: refusing writes with
//!   one node down needs the higher setting.)
//!
//! Every fault ends healed: each node up and every replica of the run's topics and of the
//! internal topics in sync, read from the cluster's metadata, before the next fault.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use parsley_runtime::RuntimeConfig;
use parsley_testkit::cluster;
use rand::Rng;
use rand::rngs::StdRng;

/// A fault of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ClusterFault {
    Leader,
    TxnCoordinator,
    GroupCoordinator,
    Shutdown,
    Election,
    MinInsync,
}

impl ClusterFault {
    /// Every kind, in the order the suite's first faults take them.
    pub(crate) const ALL: [ClusterFault; 6] = [
        ClusterFault::Leader,
        ClusterFault::TxnCoordinator,
        ClusterFault::GroupCoordinator,
        ClusterFault::Shutdown,
        ClusterFault::Election,
        ClusterFault::MinInsync,
    ];

    /// Its name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ClusterFault::Leader => "leader",
            ClusterFault::TxnCoordinator => "txn-coord",
            ClusterFault::GroupCoordinator => "group-coord",
            ClusterFault::Shutdown => "shutdown",
            ClusterFault::Election => "election",
            ClusterFault::MinInsync => "min-isr",
        }
    }
}

/// What a fault may aim at in one run.
pub(crate) struct Targets<'a> {
    /// The run's sources and outputs.
    pub sources_and_outputs: &'a [String],
    /// The run's outputs.
    pub outputs: &'a [String],
    /// Every topic of the run (changelogs included) and the internal topics: what must be in
    /// sync again before the next fault.
    pub heal: &'a [String],
    /// Partitions of every run topic.
    pub partitions: i32,
    /// Each stage process: its group id and its transactional id.
    pub stages: Vec<(String, String)>,
}

/// The group and transactional id of `stage` of run `run_id` under instance `instance`.
pub(crate) fn stage_ids(
    bootstrap: &str,
    run_id: &str,
    stage: &str,
    instance: &str,
) -> (String, String) {
    let group = format!("{run_id}.{stage}");
    let mut config = RuntimeConfig::new(bootstrap);
    config.instance_id = instance.to_string();
    let transactional_id = config.transactional_id(&group);
    (group, transactional_id)
}

/// How long the cluster may take to heal after a fault.
const HEAL: Duration = Duration::from_secs(120);

/// Injects `fault` and heals the cluster; returns a line saying what was done.
pub(crate) fn inject(fault: ClusterFault, rng: &mut StdRng, t: &Targets<'_>) -> Result<String> {
    let nodes: Vec<i32> = cluster::nodes()?.iter().map(|n| n.id).collect();
    let what = match fault {
        ClusterFault::Leader => {
            let topic = &t.sources_and_outputs[rng.random_range(0..t.sources_and_outputs.len())];
            let p = rng.random_range(0..t.partitions);
            let leader = leader_of(topic, p)?;
            kill_and_restart(leader, topic, p)?;
            format!("kill -9 of node {leader}, leader of {topic}/{p}")
        }
        ClusterFault::TxnCoordinator | ClusterFault::GroupCoordinator => {
            let (group, transactional_id) = &t.stages[rng.random_range(0..t.stages.len())];
            let (internal, key) = if fault == ClusterFault::TxnCoordinator {
                ("__transaction_state", transactional_id)
            } else {
                ("__consumer_offsets", group)
            };
            let p = cluster::coordinator_partition(key);
            let leader = leader_of(internal, p)?;
            kill_and_restart(leader, internal, p)?;
            format!("kill -9 of node {leader}, coordinator of {key} ({internal}/{p})")
        }
        ClusterFault::Shutdown => {
            let node = nodes[rng.random_range(0..nodes.len())];
            cluster::stop(node);
            cluster::start(node)?;
            format!("controlled shutdown of node {node}")
        }
        ClusterFault::Election => {
            let topic = &t.outputs[rng.random_range(0..t.outputs.len())];
            let p = rng.random_range(0..t.partitions);
            let state = cluster::partition(topic, p)?;
            let preferred = state.replicas[0];
            if state.leader == Some(preferred) {
                // Away from the preferred replica first (a controlled shutdown), which then
                // rejoins as a follower.
                cluster::stop(preferred);
                cluster::wait_partition(topic, p, HEAL, |s| {
                    s.leader.is_some_and(|l| l != preferred)
                })?;
                cluster::start(preferred)?;
                cluster::wait_partition(topic, p, HEAL, |s| s.isr.contains(&preferred))?;
            }
            cluster::elect_preferred_leader(topic, p)?;
            cluster::wait_partition(topic, p, HEAL, |s| s.leader == Some(preferred))?;
            format!("preferred-leader election of {topic}/{p} to node {preferred}")
        }
        ClusterFault::MinInsync => {
            let topic = &t.outputs[rng.random_range(0..t.outputs.len())];
            let node = nodes[rng.random_range(0..nodes.len())];
            cluster::set_topic_config(topic, "min.insync.replicas", "3")?;
            cluster::kill(node);
            // Writes are refused once the ISR has shrunk below 3 (the controller fenced the
            // node): evidence from the metadata.
            cluster::wait_partition(topic, 0, HEAL, |s| s.isr.len() < 3)?;
            // How long the refusal lasts: from the seed (fault timing, not synchronisation).
            let held = Duration::from_millis(rng.random_range(2_000..6_000));
            std::thread::sleep(held);
            cluster::start(node)?;
            cluster::wait_in_sync(std::slice::from_ref(topic), HEAL)?;
            cluster::set_topic_config(topic, "min.insync.replicas", "2")?;
            format!(
                "{topic} refused writes for {} ms (min.insync.replicas=3, node {node} killed)",
                held.as_millis()
            )
        }
    };
    cluster::wait_in_sync(t.heal, HEAL).context("the cluster did not heal after a fault")?;
    Ok(what)
}

/// The leader of `topic`/`partition` now.
fn leader_of(topic: &str, partition: i32) -> Result<i32> {
    match cluster::partition(topic, partition)?.leader {
        Some(l) => Ok(l),
        None => bail!("{topic}/{partition} has no leader"),
    }
}

/// Kills node `leader` of `topic`/`partition`, waits until another node leads it (the
/// controller fenced the killed one), and starts the killed node again.
fn kill_and_restart(leader: i32, topic: &str, partition: i32) -> Result<()> {
    cluster::kill(leader);
    cluster::wait_partition(topic, partition, HEAL, |s| {
        s.leader.is_some_and(|l| l != leader)
    })?;
    cluster::start(leader)?;
    Ok(())
}
