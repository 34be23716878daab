//! A real Apache Kafka cluster of several nodes on this machine (KRaft, each node a combined
//! broker and controller, three by default), started by the project from the same Maven
//! Central jars as the single broker ([`crate::broker`]), for the tests and fault runs that
//! need a partition leader to move: leader failover, a transaction or group coordinator that
//! leaves, `min.insync.replicas` refusing writes.
//!
//! Files live in `cluster/` of [`broker::state_dir`]: `nodes` (one `id port controller_port`
//! line per node), `bootstrap` (every node's `host:port`, comma-separated) and one
//! `node-{id}/` per node with its `server.properties`, `data/` (formatted anew at every
//! [`up`]), `server.log`, `console.log` and `broker.pid`. Only `PLAINTEXT` listeners on
//! 127.0.0.1; the single broker's secure listener has no counterpart here.
//!
//! Every topic is created with replication factor 3 and `min.insync.replicas=2` unless it
//! says otherwise, the internal topics (`__consumer_offsets`, `__transaction_state`) likewise,
//! each with [`INTERNAL_PARTITIONS`] partitions. Leadership moves only when something moves it:
//! automatic leader rebalancing is off, so a test decides when the preferred leader comes back
//! ([`elect_preferred_leader`]). A node killed with `kill -9` is fenced by the controller
//! within [`SESSION_TIMEOUT_MS`]: its partitions get new leaders and it leaves every ISR.
//!
//! Invariants:
//! - [`up`] returns only once every node answers a metadata request and the cluster's metadata
//!   lists every node (each registered and unfenced) — no fixed sleep;
//! - [`start`] keeps a node's data, ports and configuration, and returns once the others list
//!   it again;
//! - [`down`], [`kill`] and [`stop`] act only on a process recorded in a node's `broker.pid`
//!   whose command line is that node's broker.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::broker::{
    self, BrokerError, free_port_other_than, io, log4j_config, process_alive, resolve_jars,
    run_capture, tail,
};
use crate::wire::{Connection, Metadata, UNKNOWN_TOPIC_OR_PARTITION};

/// Nodes of the cluster `cargo kafka up --brokers 3` starts.
pub const DEFAULT_NODES: usize = 3;
/// The replication factor of every topic (user and internal) unless it says otherwise.
pub const REPLICATION_FACTOR: i32 = 3;
/// `min.insync.replicas` of every topic unless it says otherwise.
pub const MIN_INSYNC_REPLICAS: i32 = 2;
/// Partitions of `__consumer_offsets` and of `__transaction_state` (Kafka's default is 50:
/// fewer make the first transaction and the first group join start faster, and change
/// nothing else).
pub const INTERNAL_PARTITIONS: i32 = 6;
/// `broker.session.timeout.ms`: how long the controller waits for a silent node before it
/// fences it (Kafka's default is 9 s).
pub const SESSION_TIMEOUT_MS: u64 = 3_000;
/// How long [`up`] and [`start`] wait for a node to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its `node.id` (1, 2, 3, …): the broker id in metadata.
    pub id: i32,
    /// Its `PLAINTEXT` listener's port on 127.0.0.1.
    pub port: u16,
    /// Its controller listener's port on 127.0.0.1.
    pub controller_port: u16,
}

impl Node {
    /// Its client address, `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// What [`up`] did: the single broker's answer, with the cluster's bootstrap list.
pub use crate::broker::Up;

/// A partition as the cluster's metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// The leader's node id; `None` while it has none.
    pub leader: Option<i32>,
    /// The replicas, the preferred leader first.
    pub replicas: Vec<i32>,
    /// The in-sync replicas.
    pub isr: Vec<i32>,
}

/// The directory holding the cluster's files.
pub fn cluster_dir() -> PathBuf {
    broker::state_dir().join("cluster")
}

fn node_dir(id: i32) -> PathBuf {
    cluster_dir().join(format!("node-{id}"))
}

/// The cluster's bootstrap list (every node), as recorded by [`up`].
///
/// # Errors
/// [`BrokerError::NoBroker`] when no cluster was started.
pub fn bootstrap() -> Result<String, BrokerError> {
    fs::read_to_string(cluster_dir().join("bootstrap"))
        .map(|s| s.trim().to_string())
        .map_err(|_| BrokerError::NoBroker)
}

/// The recorded nodes, by id.
///
/// # Errors
/// [`BrokerError::NoBroker`] when no cluster was started; [`BrokerError::BadRecord`] when the
/// `nodes` file cannot be read.
pub fn nodes() -> Result<Vec<Node>, BrokerError> {
    let path = cluster_dir().join("nodes");
    let text = fs::read_to_string(&path).map_err(|_| BrokerError::NoBroker)?;
    let parse = |line: &str| -> Option<Node> {
        let mut fields = line.split_whitespace();
        let node = Node {
            id: fields.next()?.parse().ok()?,
            port: fields.next()?.parse().ok()?,
            controller_port: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(node)
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            parse(line).ok_or_else(|| BrokerError::BadRecord {
                path: path.clone(),
                reason: format!("a line is not `id port controller_port`: {line:?}"),
            })
        })
        .collect()
}

/// The node of id `id`.
///
/// # Errors
/// [`BrokerError::NoBroker`] when no cluster was started or it has no such node.
pub fn node(id: i32) -> Result<Node, BrokerError> {
    nodes()?
        .into_iter()
        .find(|n| n.id == id)
        .ok_or(BrokerError::NoBroker)
}

/// The pid of node `id`'s process if it is alive and is that node's broker.
pub fn pid(id: i32) -> Option<u32> {
    let dir = node_dir(id);
    let pid: u32 = fs::read_to_string(dir.join("broker.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    let props = dir.join("server.properties");
    (cmdline.contains("kafka.Kafka") && cmdline.contains(&*props.to_string_lossy())).then_some(pid)
}

/// The ids of the nodes whose processes are alive.
pub fn alive() -> Vec<i32> {
    nodes()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| pid(n.id).is_some())
        .map(|n| n.id)
        .collect()
}

/// Starts a cluster of `count` nodes unless the recorded one runs with every node up; returns
/// once every node answers and the cluster's metadata lists them all.
///
/// # Errors
/// Missing Java or Maven, a failed jar resolution or storage format, a node that dies or does
/// not answer within two minutes.
///
/// # Panics
/// When `count` is 0.
pub fn up(count: usize) -> Result<Up, BrokerError> {
    assert!(count > 0, "a cluster has at least one node");
    if let (Ok(bootstrap), Ok(recorded)) = (bootstrap(), nodes())
        && recorded.len() == count
        && alive().len() == count
        && lists_all(&bootstrap, count, Duration::from_secs(5))
    {
        return Ok(Up::AlreadyRunning(bootstrap));
    }
    down()?;
    broker::check_java()?;
    let dir = cluster_dir();
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let libs = resolve_jars(&broker::state_dir())?;
    let classpath = format!("{}/*", libs.display());
    let mut taken = Vec::new();
    let mut all = Vec::new();
    for id in 1..=count as i32 {
        let port = free_port_other_than(&taken)?;
        taken.push(port);
        let controller_port = free_port_other_than(&taken)?;
        taken.push(controller_port);
        all.push(Node {
            id,
            port,
            controller_port,
        });
    }
    let voters = all
        .iter()
        .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
        .collect::<Vec<_>>()
        .join(",");
    for n in &all {
        let nd = node_dir(n.id);
        fs::create_dir_all(&nd).map_err(io(&nd))?;
        let props = nd.join("server.properties");
        fs::write(&props, server_properties(n, &voters, &nd.join("data"))).map_err(io(&props))?;
        let log4j = nd.join("log4j2.yaml");
        fs::write(&log4j, log4j_config(&nd.join("server.log"))).map_err(io(&log4j))?;
    }
    let nodes_file = dir.join("nodes");
    let lines: String = all
        .iter()
        .map(|n| format!("{} {} {}\n", n.id, n.port, n.controller_port))
        .collect();
    fs::write(&nodes_file, lines).map_err(io(&nodes_file))?;

    let java_log = |id: i32| {
        format!(
            "-Dlog4j2.configurationFile={}",
            node_dir(id).join("log4j2.yaml").display()
        )
    };
    let cluster_id = run_capture(
        Command::new("java").args([
            &java_log(1),
            "-cp",
            &classpath,
            "kafka.tools.StorageTool",
            "random-uuid",
        ]),
        "kafka-storage random-uuid",
    )?
    .trim()
    .to_string();
    // Every node's storage is formatted with the same cluster id; the JVMs run side by side.
    std::thread::scope(|s| {
        let handles: Vec<_> = all
            .iter()
            .map(|n| {
                let props = node_dir(n.id).join("server.properties");
                let java_log = java_log(n.id);
                let (classpath, cluster_id) = (&classpath, &cluster_id);
                s.spawn(move || {
                    run_capture(
                        Command::new("java").args([
                            &java_log,
                            "-cp",
                            classpath,
                            "kafka.tools.StorageTool",
                            "format",
                            "-t",
                            cluster_id,
                            "-c",
                            &props.to_string_lossy(),
                        ]),
                        "kafka-storage format",
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(BrokerError::CommandFailed {
                        what: "kafka-storage format".into(),
                        status: "the thread running it panicked".into(),
                        output: String::new(),
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let bootstrap = all.iter().map(Node::address).collect::<Vec<_>>().join(",");
    // The nodes start together: a controller quorum needs a majority of them to elect a leader.
    let mut children = Vec::new();
    for n in &all {
        children.push((n.id, spawn_node(n.id, &classpath)?));
    }
    wait_listed(&bootstrap, count, &mut children)?;
    let bootstrap_file = dir.join("bootstrap");
    fs::write(&bootstrap_file, format!("{bootstrap}\n")).map_err(io(&bootstrap_file))?;
    Ok(Up::Started(bootstrap))
}

/// Starts node `id`'s JVM (its own process group, so it outlives the caller) and records its
/// pid.
fn spawn_node(id: i32, classpath: &str) -> Result<Child, BrokerError> {
    let nd = node_dir(id);
    let console = nd.join("console.log");
    let console_file = fs::File::create(&console).map_err(io(&console))?;
    let java_log = format!(
        "-Dlog4j2.configurationFile={}",
        nd.join("log4j2.yaml").display()
    );
    let props = nd.join("server.properties");
    let mut cmd = Command::new("java");
    cmd.args([
        "-Xms256m",
        "-Xmx768m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        &java_log,
        "-cp",
        classpath,
        "kafka.Kafka",
        &props.to_string_lossy(),
    ])
    .stdin(Stdio::null())
    .stdout(console_file.try_clone().map_err(io(&console))?)
    .stderr(console_file);
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let child = cmd.spawn().map_err(|e| BrokerError::CommandFailed {
        what: format!("java kafka.Kafka (node {id})"),
        status: e.to_string(),
        output: String::new(),
    })?;
    let pid_file = nd.join("broker.pid");
    fs::write(&pid_file, child.id().to_string()).map_err(io(&pid_file))?;
    Ok(child)
}

/// Waits until the metadata at `bootstrap` lists `count` nodes; fails when one of `children`
/// exits first or after [`READY_TIMEOUT`].
fn wait_listed(
    bootstrap: &str,
    count: usize,
    children: &mut [(i32, Child)],
) -> Result<(), BrokerError> {
    let started = Instant::now();
    loop {
        for (id, child) in children.iter_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                let nd = node_dir(*id);
                let _ = fs::remove_file(nd.join("broker.pid"));
                let log = nd.join("server.log");
                return Err(BrokerError::BrokerDied {
                    tail: tail(&log, 30) + &tail(&nd.join("console.log"), 10),
                    log,
                });
            }
        }
        // Each attempt waits up to 2 s for the cluster's answer: evidence, not a sleep.
        if lists_all(bootstrap, count, Duration::from_secs(2)) {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            return Err(BrokerError::NotReady(
                READY_TIMEOUT,
                node_dir(children[0].0).join("server.log"),
            ));
        }
    }
}

/// Whether the metadata at `bootstrap` lists at least `count` brokers within `timeout`.
fn lists_all(bootstrap: &str, count: usize, timeout: Duration) -> bool {
    brokers_listed(bootstrap, timeout).is_some_and(|ids| ids.len() >= count)
}

/// The broker ids the metadata at `bootstrap` lists (registered and unfenced).
fn brokers_listed(bootstrap: &str, timeout: Duration) -> Option<Vec<i32>> {
    let metadata = metadata(bootstrap, &[], timeout).ok()?;
    Some(metadata.brokers.iter().map(|b| b.id).collect())
}

/// The metadata of `topics` from the first node of `bootstrap` (a comma-separated list) that
/// answers within `timeout`.
fn metadata(bootstrap: &str, topics: &[&str], timeout: Duration) -> Result<Metadata, String> {
    let mut last = String::from("no address");
    for address in bootstrap.split(',') {
        match Connection::open(address.trim(), timeout).and_then(|mut c| c.metadata(topics)) {
            Ok(m) => return Ok(m),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// Stops every node of the cluster (`SIGTERM`, a controlled shutdown; `kill -9` after 30 s)
/// and forgets the bootstrap list. Returns `true` when a process was stopped.
///
/// # Errors
/// When a pid file cannot be removed.
pub fn down() -> Result<bool, BrokerError> {
    let ids: Vec<i32> = nodes()
        .unwrap_or_default()
        .into_iter()
        .map(|n| n.id)
        .collect();
    // SIGTERM to every node first: they shut down side by side.
    let pids: Vec<(i32, u32)> = ids
        .iter()
        .filter_map(|&id| pid(id).map(|p| (id, p)))
        .collect();
    for (_, p) in &pids {
        let _ = Command::new("kill").arg(p.to_string()).status();
    }
    for (id, p) in &pids {
        wait_exit(*p, Duration::from_secs(30));
        let pid_file = node_dir(*id).join("broker.pid");
        fs::remove_file(&pid_file).map_err(io(&pid_file))?;
    }
    let _ = fs::remove_file(cluster_dir().join("bootstrap"));
    Ok(!pids.is_empty())
}

/// Waits until process `pid` has exited; `kill -9` once `grace` has passed.
fn wait_exit(pid: u32, grace: Duration) {
    let deadline = Instant::now() + grace;
    while process_alive(pid) {
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        // Waiting for a process to exit: checked against /proc, not slept on blindly.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills node `id` with `SIGKILL` (no controlled shutdown: its leaderships move only once the
/// controller fences it, within [`SESSION_TIMEOUT_MS`]) and waits until the process is gone.
/// Returns `false` when it was not running.
pub fn kill(id: i32) -> bool {
    let Some(p) = pid(id) else { return false };
    let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    wait_exit(p, Duration::from_secs(30));
    true
}

/// Stops node `id` with `SIGTERM`: a controlled shutdown, in which the controller moves its
/// leaderships to other replicas before it exits. Waits until the process is gone (`kill -9`
/// after 60 s). Returns `false` when it was not running.
pub fn stop(id: i32) -> bool {
    let Some(p) = pid(id) else { return false };
    let _ = Command::new("kill").arg(p.to_string()).status();
    wait_exit(p, Duration::from_secs(60));
    true
}

/// Starts node `id` again with its data, ports and configuration; returns once the cluster's
/// metadata lists it (registered and unfenced). Does nothing when it runs.
///
/// # Errors
/// [`BrokerError::BrokerDied`] or [`BrokerError::NotReady`] when it does not come back;
/// [`BrokerError::NoBroker`] when the cluster has no such node.
pub fn start(id: i32) -> Result<(), BrokerError> {
    let n = node(id)?;
    if pid(id).is_some() {
        return Ok(());
    }
    let libs = broker::state_dir().join("libs");
    let classpath = format!("{}/*", libs.display());
    let mut child = spawn_node(id, &classpath)?;
    let started = Instant::now();
    let own = n.address();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            let nd = node_dir(id);
            let _ = fs::remove_file(nd.join("broker.pid"));
            let log = nd.join("server.log");
            return Err(BrokerError::BrokerDied {
                tail: tail(&log, 30) + &tail(&nd.join("console.log"), 10),
                log,
            });
        }
        if brokers_listed(&own, Duration::from_secs(2)).is_some_and(|ids| ids.contains(&id)) {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            return Err(BrokerError::NotReady(
                READY_TIMEOUT,
                node_dir(id).join("server.log"),
            ));
        }
    }
}

/// Partition `partition` of `topic` as the cluster's metadata shows it now.
///
/// # Errors
/// [`BrokerError::NoBroker`] without a cluster; [`BrokerError::CommandFailed`] when no node
/// answers, or the metadata has no such partition.
pub fn partition(topic: &str, partition: i32) -> Result<PartitionState, BrokerError> {
    let failed = |status: String| BrokerError::CommandFailed {
        what: format!("reading the metadata of {topic}/{partition}"),
        status,
        output: String::new(),
    };
    let metadata = metadata(&bootstrap()?, &[topic], Duration::from_secs(10)).map_err(failed)?;
    let t = metadata
        .topics
        .iter()
        .find(|t| t.name == topic && t.error != UNKNOWN_TOPIC_OR_PARTITION)
        .ok_or_else(|| failed("no such topic".into()))?;
    let p = t
        .partitions
        .iter()
        .find(|p| p.id == partition)
        .ok_or_else(|| failed("no such partition".into()))?;
    Ok(PartitionState {
        leader: (p.leader >= 0).then_some(p.leader),
        replicas: p.replicas.clone(),
        isr: p.isr.clone(),
    })
}

/// Waits until partition `partition` of `topic` satisfies `done` (re-reading the metadata);
/// returns the state that did.
///
/// # Errors
/// [`BrokerError::NotReady`] after `timeout`; the errors of [`partition`] that persist.
pub fn wait_partition(
    topic: &str,
    partition_id: i32,
    timeout: Duration,
    done: impl Fn(&PartitionState) -> bool,
) -> Result<PartitionState, BrokerError> {
    let deadline = Instant::now() + timeout;
    loop {
        let state = partition(topic, partition_id);
        if let Ok(s) = &state
            && done(s)
        {
            return state;
        }
        if Instant::now() > deadline {
            return state.and(Err(BrokerError::NotReady(timeout, cluster_dir())));
        }
        // Metadata is re-read every 100 ms until it shows the change (evidence).
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every partition of `topics` has a leader and every replica in sync (one
/// metadata request per topic and round): the cluster has healed from a fault. A topic that
/// does not exist (yet) has nothing to heal.
///
/// # Errors
/// [`BrokerError::NotReady`] after `timeout`, naming a partition that was not whole in the
/// last round's metadata as the log to look at; [`BrokerError::NoBroker`] without a cluster.
pub fn wait_in_sync(topics: &[String], timeout: Duration) -> Result<(), BrokerError> {
    let bootstrap = bootstrap()?;
    let deadline = Instant::now() + timeout;
    loop {
        let mut lagging = None;
        for topic in topics {
            let whole = metadata(&bootstrap, &[topic], Duration::from_secs(5))
                .ok()
                .and_then(|m| {
                    let t = m.topics.iter().find(|t| &t.name == topic)?;
                    if t.error == UNKNOWN_TOPIC_OR_PARTITION {
                        // Not created yet: nothing of it to heal.
                        return Some(true);
                    }
                    Some(
                        !t.partitions.is_empty()
                            && t.partitions
                                .iter()
                                .all(|p| p.leader >= 0 && p.isr.len() == p.replicas.len()),
                    )
                })
                .unwrap_or(false);
            if !whole {
                lagging = Some(topic.clone());
                break;
            }
        }
        let Some(topic) = lagging else {
            return Ok(());
        };
        if Instant::now() > deadline {
            return Err(BrokerError::NotReady(
                timeout,
                cluster_dir().join(format!("{topic}: a replica out of sync")),
            ));
        }
        // Metadata is re-read every 100 ms until it shows every replica back (evidence).
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Java's `String.hashCode` of `s` (UTF-16 code units, wrapping arithmetic).
fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The partition of an internal topic (`__consumer_offsets`, `__transaction_state`, each with
/// [`INTERNAL_PARTITIONS`]) that holds `key` (a group id, a transactional id): Kafka's
/// `Utils.abs(key.hashCode()) % partitions`, as its group and transaction coordinators place
/// them. The leader of that partition is the key's coordinator.
pub fn coordinator_partition(key: &str) -> i32 {
    let h = java_hash(key);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % INTERNAL_PARTITIONS
}

/// The node that is group `group`'s coordinator now: the leader of its `__consumer_offsets`
/// partition (`None` while it has none, or before the topic exists).
///
/// # Errors
/// As [`partition`].
pub fn group_coordinator(group: &str) -> Result<Option<i32>, BrokerError> {
    Ok(partition("__consumer_offsets", coordinator_partition(group))?.leader)
}

/// The node that is transactional id `id`'s transaction coordinator now: the leader of its
/// `__transaction_state` partition.
///
/// # Errors
/// As [`partition`].
pub fn transaction_coordinator(id: &str) -> Result<Option<i32>, BrokerError> {
    Ok(partition("__transaction_state", coordinator_partition(id))?.leader)
}

/// Runs one of Kafka's command-line tools (`class` with `args`) against the cluster.
fn kafka_tool(class: &str, args: &[&str]) -> Result<String, BrokerError> {
    let libs = broker::state_dir().join("libs");
    let classpath = format!("{}/*", libs.display());
    let log4j = node_dir(1).join("tools-log4j2.yaml");
    fs::write(&log4j, log4j_config(&node_dir(1).join("tools.log"))).map_err(io(&log4j))?;
    let java_log = format!("-Dlog4j2.configurationFile={}", log4j.display());
    let bootstrap = bootstrap()?;
    let mut cmd = Command::new("java");
    cmd.args([
        &java_log,
        "-cp",
        &classpath,
        class,
        "--bootstrap-server",
        &bootstrap,
    ])
    .args(args);
    run_capture(&mut cmd, class)
}

/// Moves the leadership of `topic`/`partition` back to its preferred replica (the first in
/// [`PartitionState::replicas`]), with Kafka's leader-election tool; returns once the election
/// is done. An election that finds the preferred replica leading already is not an error.
///
/// # Errors
/// [`BrokerError::CommandFailed`] when the tool fails (the preferred replica is not in sync,
/// or is down).
pub fn elect_preferred_leader(topic: &str, partition: i32) -> Result<(), BrokerError> {
    elect_leader("PREFERRED", topic, partition)
}

/// Elects a leader for `topic`/`partition` among its live replicas even if none is in sync (an
/// unclean election, which may lose records the last leader acknowledged): for a partition
/// whose only in-sync replica died and came back after Kafka cleared it from the eligible
/// leaders. Returns once the election is done; a partition that has a leader is left alone.
///
/// # Errors
/// [`BrokerError::CommandFailed`] when the tool fails.
pub fn elect_unclean_leader(topic: &str, partition: i32) -> Result<(), BrokerError> {
    elect_leader("UNCLEAN", topic, partition)
}

/// Runs Kafka's leader-election tool with `--election-type kind` on `topic`/`partition`; an
/// election that is not needed (the wanted leader leads already) is not an error.
fn elect_leader(kind: &str, topic: &str, partition: i32) -> Result<(), BrokerError> {
    let partition = partition.to_string();
    let args = [
        "--election-type",
        kind,
        "--topic",
        topic,
        "--partition",
        &partition,
    ];
    match kafka_tool("org.apache.kafka.tools.LeaderElectionCommand", &args) {
        Err(BrokerError::CommandFailed { output, .. })
            if output.contains("ElectionNotNeededException")
                || output.contains("Valid replica already elected") =>
        {
            Ok(())
        }
        other => other.map(drop),
    }
}

/// Creates `topic` with one partition whose replicas are on the nodes `replicas` (the first the
/// preferred leader), with Kafka's topic tool: a topic whose replicas a test can then move to
/// other nodes ([`reassign`]).
///
/// # Errors
/// [`BrokerError::CommandFailed`] when the tool fails.
pub fn create_topic_on(topic: &str, replicas: &[i32]) -> Result<(), BrokerError> {
    let assignment = replicas
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(":");
    kafka_tool(
        "org.apache.kafka.tools.TopicCommand",
        &[
            "--create",
            "--topic",
            topic,
            "--replica-assignment",
            &assignment,
        ],
    )
    .map(drop)
}

/// Moves the replicas of `topic`/`partition` to the nodes `replicas` with Kafka's reassignment
/// tool, and returns once the partition's replicas are those, all in sync (or fails after
/// `timeout`).
///
/// # Errors
/// [`BrokerError::CommandFailed`] when the tool fails; as [`wait_partition`].
pub fn reassign(
    topic: &str,
    partition: i32,
    replicas: &[i32],
    timeout: Duration,
) -> Result<PartitionState, BrokerError> {
    let plan = format!(
        r#"{{"version":1,"partitions":[{{"topic":"{topic}","partition":{partition},"replicas":[{}]}}]}}"#,
        replicas
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let file = node_dir(1).join(format!("reassign-{topic}-{partition}.json"));
    fs::write(&file, plan).map_err(io(&file))?;
    let path = file.display().to_string();
    kafka_tool(
        "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
        &["--reassignment-json-file", &path, "--execute"],
    )?;
    let mut want = replicas.to_vec();
    want.sort_unstable();
    wait_partition(topic, partition, timeout, |s| {
        let (mut r, mut isr) = (s.replicas.clone(), s.isr.clone());
        r.sort_unstable();
        isr.sort_unstable();
        r == want && isr == want && s.leader.is_some()
    })
}

/// Sets topic config `name` to `value` on `topic` (an incremental change: the topic's other
/// configs stay), with Kafka's config tool.
///
/// # Errors
/// [`BrokerError::CommandFailed`] when the tool fails.
pub fn set_topic_config(topic: &str, name: &str, value: &str) -> Result<(), BrokerError> {
    kafka_tool(
        "org.apache.kafka.tools.ConfigCommand",
        &[
            "--entity-type",
            "topics",
            "--entity-name",
            topic,
            "--alter",
            "--add-config",
            &format!("{name}={value}"),
        ],
    )
    .map(drop)
}

/// A node's configuration: its `PLAINTEXT` listener and controller listener on loopback, the
/// quorum's `voters`, replication factor 3 and `min.insync.replicas=2` everywhere.
fn server_properties(node: &Node, voters: &str, data: &Path) -> String {
    format!(
        "# Written by parsley-broker: one node of a local cluster (combined broker+controller).
process.roles=broker,controller
node.id={id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data}
num.partitions=1
default.replication.factor={REPLICATION_FACTOR}
min.insync.replicas={MIN_INSYNC_REPLICAS}
auto.create.topics.enable=false
delete.topic.enable=true
group.initial.rebalance.delay.ms=0
offsets.topic.replication.factor={REPLICATION_FACTOR}
offsets.topic.num.partitions={INTERNAL_PARTITIONS}
transaction.state.log.replication.factor={REPLICATION_FACTOR}
transaction.state.log.min.isr={MIN_INSYNC_REPLICAS}
transaction.state.log.num.partitions={INTERNAL_PARTITIONS}
share.coordinator.state.topic.replication.factor={REPLICATION_FACTOR}
share.coordinator.state.topic.min.isr={MIN_INSYNC_REPLICAS}
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
# Leadership moves only when a test or the fault driver moves it.
auto.leader.rebalance.enable=false
unclean.leader.election.enable=false
# A node killed with kill -9 is fenced within 3 s (default 9 s); a lagging follower leaves the
# ISR after 5 s (default 30 s).
broker.heartbeat.interval.ms=500
broker.session.timeout.ms={SESSION_TIMEOUT_MS}
replica.lag.time.max.ms=5000
log.flush.interval.messages=9223372036854775807
",
        id = node.id,
        port = node.port,
        controller_port = node.controller_port,
        data = data.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_matches_javas_string_hash_code() {
        // Values of `"…".hashCode()` on a JVM.
        assert_eq!(java_hash(""), 0);
        assert_eq!(java_hash("a"), 97);
        assert_eq!(java_hash("hello"), 99_162_322);
        assert_eq!(java_hash("polygenelubricants"), i32::MIN);
        // A character outside the BMP counts as its two UTF-16 code units.
        assert_eq!(java_hash("\u{1F600}"), 0xD83D * 31 + 0xDE00);
    }

    #[test]
    fn the_coordinator_partition_is_kafkas_abs_hash_modulo_the_partitions() {
        assert_eq!(
            coordinator_partition("hello"),
            99_162_322 % INTERNAL_PARTITIONS
        );
        // Integer.MIN_VALUE has no absolute value: Kafka's Utils.abs maps it to 0.
        assert_eq!(coordinator_partition("polygenelubricants"), 0);
        // A negative hash: "Aa-negative" style keys fold to their absolute value.
        let negative = (0..1000)
            .map(|i| format!("group-{i}"))
            .find(|k| java_hash(k) < 0 && java_hash(k) != i32::MIN)
            .unwrap();
        assert_eq!(
            coordinator_partition(&negative),
            java_hash(&negative).abs() % INTERNAL_PARTITIONS
        );
    }

    #[test]
    fn a_node_is_configured_for_three_replicas_and_two_in_sync() {
        let n = Node {
            id: 2,
            port: 9100,
            controller_port: 9101,
        };
        let props = server_properties(&n, "1@127.0.0.1:1,2@127.0.0.1:9101", Path::new("/d"));
        for line in [
            "node.id=2",
            "controller.quorum.voters=1@127.0.0.1:1,2@127.0.0.1:9101",
            "listeners=PLAINTEXT://127.0.0.1:9100,CONTROLLER://127.0.0.1:9101",
            "default.replication.factor=3",
            "min.insync.replicas=2",
            "offsets.topic.replication.factor=3",
            "transaction.state.log.min.isr=2",
            "auto.leader.rebalance.enable=false",
        ] {
            assert!(props.lines().any(|l| l == line), "missing {line}");
        }
    }
}
