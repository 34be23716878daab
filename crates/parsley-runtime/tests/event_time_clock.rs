//! The built-in clock on the real broker (`EventTimeOrder::clock`): a stage that orders by event
//! time with no ticker of the user's. Live records over two inputs, produced with delays below
//! the lag, leave in event-time order with none late; a tick that would release a parked record
//! commits without waiting for the commit interval; a restart resumes the parked records and
//! the clock and releases everything in order; the clock's topic exists, compacted, with the
//! partitions of the stage's sources, and holds the committed ticks of every task; when one of
//! two instances stops, the other ticks for the task it takes over and releases its parked
//! records in order.
//!
//! The tests wait on committed deliveries and task gauges, never on time. Event times are
//! wall-clock times minus a producer delay (or plus an offset for records that must stay
//! parked across a stop), so the clock — wall time, trailing by about one tick interval plus
//! one commit interval — is what releases them.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use parsley_runtime::{Running, Runtime, RuntimeConfig, TaskMetrics};
use parsley_stage::{EventTimeOrder, Topology, clock_topic};
use parsley_testkit::fixtures::{
    DEADLINE, admin, bootstrap, committed_values, create_topic, forward_topology_with, key_on,
    raw_producer, read_committed, unique_topic, wait_committed, wait_metrics, wait_tasks,
};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// The lag of every test's clock, ms: well above the producers' delays (at most
/// [`MAX_DELAY_MS`]) and the clock's own trail, so that no record is late on a loaded machine.
const LAG_MS: i64 = 1_500;

/// The largest producer delay the tests write: event time = now - delay.
const MAX_DELAY_MS: i64 = 450;

/// Producer delays, ms, used in turn: the two inputs' records arrive out of event-time order.
const DELAYS: [i64; 8] = [0, 350, 100, MAX_DELAY_MS, 200, 50, 400, 250];

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Live records, as a producer writes them: each value names its record, each event time is
/// unique (a tie would leave in delivery order, which the tests do not predict).
struct Live {
    producer: BaseProducer,
    /// `(partition, event time, value)` of every record sent.
    sent: Vec<(i32, i64, String)>,
    times: BTreeSet<i64>,
}

impl Live {
    fn new() -> Self {
        Live {
            producer: raw_producer(None),
            sent: Vec::new(),
            times: BTreeSet::new(),
        }
    }

    /// Sends `n` records named `{prefix}{i}`, alternately to `topics`, to partition 0 with
    /// key `k`, with event time `now + offset_ms - DELAYS[i]` (lowered by a millisecond while
    /// taken), and waits for their acknowledgements.
    fn send(&mut self, topics: &[&str], prefix: &str, n: usize, offset_ms: i64) {
        self.send_to(topics, 0, "k", prefix, n, offset_ms);
    }

    /// [`Live::send`] to `partition`, with `key` (murmur2 must put it on `partition`).
    fn send_to(
        &mut self,
        topics: &[&str],
        partition: i32,
        key: &str,
        prefix: &str,
        n: usize,
        offset_ms: i64,
    ) {
        for i in 0..n {
            let mut t = now_ms() + offset_ms - DELAYS[i % DELAYS.len()];
            while !self.times.insert(t) {
                t -= 1;
            }
            let value = format!("{prefix}{i}");
            self.producer
                .send(
                    BaseRecord::to(topics[i % topics.len()])
                        .partition(partition)
                        .key(key)
                        .payload(&value)
                        .timestamp(t),
                )
                .map_err(|(e, _)| e)
                .expect("send");
            self.sent.push((partition, t, value));
        }
        self.producer.flush(DEADLINE).expect("flush");
    }

    /// The values sent to `partition`, in event-time order.
    fn in_event_time_order_on(&self, partition: i32) -> Vec<String> {
        let mut sent: Vec<(i64, String)> = self
            .sent
            .iter()
            .filter(|(p, _, _)| *p == partition)
            .map(|(_, t, v)| (*t, v.clone()))
            .collect();
        sent.sort();
        sent.into_iter().map(|(_, v)| v).collect()
    }

    /// The values sent (all to partition 0), in event-time order.
    fn in_event_time_order(&self) -> Vec<String> {
        self.in_event_time_order_on(0)
    }

    /// The values sent, in the order sent.
    fn in_send_order(&self) -> Vec<String> {
        self.sent.iter().map(|(_, _, v)| v.clone()).collect()
    }
}

/// One stage, `forward`, of application `app`, reading `sources` in event-time order with the
/// built-in clock (lag [`LAG_MS`], the default tick interval) and forwarding to `sink`.
fn clocked(app: &str, sources: &[&str], sink: &str) -> Topology {
    forward_topology_with(app, sources, sink, |s| {
        s.order_by_event_time(EventTimeOrder::new().clock(LAG_MS))
    })
}

fn start(topology: &Topology) -> Running {
    Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap()
}

/// Starts `topology` as instance `instance` (its transactional ids are its own).
fn start_as(topology: &Topology, instance: &str) -> Running {
    let mut config = RuntimeConfig::new(bootstrap());
    config.instance_id = instance.to_string();
    Runtime::new(topology.clone(), config).start().unwrap()
}

/// Waits until every one of `tasks` tasks of `forward` has a watermark: its clock has ticked
/// and the tick was read back (every input is empty or caught up).
fn clock_running(running: &Running, tasks: usize) -> Vec<TaskMetrics> {
    wait_tasks(running, "forward", "the clock ticking", |t| {
        t.len() == tasks && t.iter().all(|t| t.watermark_ms.is_some())
    })
}

#[test]
fn live_records_of_two_inputs_leave_in_event_time_order_with_no_ticker() {
    let a = create_topic("clk-live-a", 1);
    let b = create_topic("clk-live-b", 1);
    let out = create_topic("clk-live-out", 1);
    let topology = clocked(&unique_topic("clk-live"), &[&a.name, &b.name], &out.name);
    let running = start(&topology);
    // Before any input record: the runtime's own ticks move the watermark.
    clock_running(&running, 1);

    let mut live = Live::new();
    live.send(&[&a.name, &b.name], "x", 16, 0);
    wait_committed(&running, "forward", 16);
    // The clock goes on: a second burst leaves too.
    live.send(&[&b.name, &a.name], "y", 16, 0);
    let m = wait_committed(&running, "forward", 32);
    assert_eq!(m.late, 0, "every delay is below the lag: {m:?}");
    assert_eq!(m.delivered, 32, "no tick is delivered: {m:?}");
    assert!(m.ticks > 0 && m.ticks_read > 0, "{m:?}");
    running.stop().unwrap();

    let expected = live.in_event_time_order();
    assert_ne!(
        expected,
        live.in_send_order(),
        "the test sends out of event-time order"
    );
    assert_eq!(committed_values(&out), expected);
    let times: Vec<i64> = read_committed(&out)
        .iter()
        .map(|r| r.timestamp.unwrap())
        .collect();
    assert!(times.is_sorted(), "{times:?}");
}

/// A tick counts only once its transaction commits: a tick that would release a parked record
/// commits at once. With a commit interval far beyond the test's deadline, only those early
/// commits can make the clock's ticks visible, so the records are released only through them.
#[test]
fn a_tick_that_would_release_a_parked_record_commits_without_waiting_for_the_interval() {
    let a = create_topic("clk-early-a", 1);
    let out = create_topic("clk-early-out", 1);
    let topology = clocked(&unique_topic("clk-early"), &[&a.name], &out.name);
    let mut config = RuntimeConfig::new(bootstrap());
    config.commit_interval = std::time::Duration::from_secs(3_600);
    let running = Runtime::new(topology, config).start().unwrap();

    let mut live = Live::new();
    live.send(&[&a.name], "x", 16, 0);
    let m = wait_metrics(&running, "forward", "16 records released", |m| {
        m.delivered >= 16
    });
    assert!(
        m.tick_commits >= 1,
        "released through an early commit: {m:?}"
    );
    assert_eq!((m.delivered, m.late), (16, 0), "{m:?}");
    running.stop().unwrap();
    assert_eq!(committed_values(&out), live.in_event_time_order());
}

#[test]
fn after_a_restart_the_parked_records_and_the_clock_resume_and_everything_leaves_in_order() {
    let a = create_topic("clk-restart-a", 1);
    let b = create_topic("clk-restart-b", 1);
    let out = create_topic("clk-restart-out", 1);
    let topology = clocked(&unique_topic("clk-restart"), &[&a.name, &b.name], &out.name);
    let inputs = [a.name.as_str(), b.name.as_str()];
    let mut live = Live::new();

    let running = start(&topology);
    clock_running(&running, 1);
    live.send(&inputs, "x", 10, 0);
    wait_committed(&running, "forward", 10);
    // Event times two seconds ahead: parked for at least that long, so certainly at the stop.
    live.send(&inputs, "p", 6, 2_000);
    wait_tasks(&running, "forward", "six parked", |t| {
        t.len() == 1 && t[0].parked == 6
    });
    let watermark_at_stop = running.task_metrics()[0].1[0].watermark_ms.unwrap();
    let stopped = running.stop().unwrap();
    assert_eq!(stopped[0].1.parked, 6, "{:?}", stopped[0].1);

    // While no instance runs, nothing ticks; records arrive with event times below the parked
    // ones.
    live.send(&inputs, "s", 8, 0);

    let running = start(&topology);
    let m = wait_committed(&running, "forward", 14);
    let task = wait_tasks(&running, "forward", "nothing parked", |t| {
        t.len() == 1 && t[0].parked == 0
    })[0];
    assert!(
        task.watermark_ms.unwrap() >= watermark_at_stop,
        "restored, then moved on: {task:?}"
    );
    assert!(task.ticks > 0, "the restarted task ticks: {task:?}");
    assert_eq!(m.late, 0, "{m:?}");
    running.stop().unwrap();
    assert_eq!(committed_values(&out), live.in_event_time_order());
}

#[test]
fn the_clock_topic_is_compacted_co_partitioned_and_holds_every_tasks_committed_ticks() {
    // Also: the stage is caught up with its sources although its own ticks are never all read.
    let a = create_topic("clk-topic-a", 3);
    let b = create_topic("clk-topic-b", 3);
    let out = create_topic("clk-topic-out", 3);
    let app = unique_topic("clk-topic");
    // A tick every 20 ms: every commit (each 100 ms) carries one.
    let topology = forward_topology_with(&app, &[&a.name, &b.name], &out.name, |s| {
        s.order_by_event_time(EventTimeOrder::new().clock(LAG_MS).tick_interval_ms(20))
    });
    let started_ms = now_ms();
    let running = start(&topology);
    clock_running(&running, 3);
    // Caught up with its inputs, though its own ticks are always ahead of its commits.
    running.wait_until_caught_up(DEADLINE).unwrap();
    // The task's own ticks, always a little ahead of what it read, are not a frontier lag.
    wait_tasks(&running, "forward", "two ticks each and no lag", |t| {
        t.len() == 3 && t.iter().all(|t| t.ticks >= 2 && t.frontier_lag == Some(0))
    });
    let m = running.stop().unwrap()[0].1;
    let stopped_ms = now_ms();
    assert_eq!((m.delivered, m.late), (0, 0), "{m:?}");

    let name = clock_topic(&app, "forward");
    let clock = admin().describe_topics(&[name.as_str()]).unwrap().remove(0);
    assert_eq!(clock.partitions, 3);
    let config = admin().topic_config(&name).unwrap();
    assert!(
        config.contains(&("cleanup.policy".to_string(), "compact".to_string())),
        "{config:?}"
    );
    let ticks = read_committed(&clock);
    for p in 0..3 {
        let mine: Vec<_> = ticks.iter().filter(|r| r.partition == p).collect();
        assert!(mine.len() >= 2, "partition {p}: {ticks:?}");
        for r in mine {
            assert_eq!(r.key.as_deref(), Some(p.to_string().as_bytes()), "{r:?}");
            assert_eq!(r.value.as_deref(), Some(&b""[..]), "{r:?}");
            assert!(r.headers.is_empty(), "no stamp: {r:?}");
            let t = r.timestamp.unwrap();
            assert!((started_ms..=stopped_ms).contains(&t), "{r:?}");
        }
    }
}

#[test]
fn when_one_of_two_instances_stops_the_other_ticks_for_its_tasks_and_releases_them_in_order() {
    let a = create_topic("clk-two-a", 2);
    let b = create_topic("clk-two-b", 2);
    let out = create_topic("clk-two-out", 2);
    let topology = clocked(&unique_topic("clk-two"), &[&a.name, &b.name], &out.name);
    let inputs = [a.name.as_str(), b.name.as_str()];
    let x = start_as(&topology, "x");
    clock_running(&x, 2);
    let y = start_as(&topology, "y");
    // Each instance owns one task and ticks for it.
    let on_y = wait_tasks(&y, "forward", "a task moved to y, ticking", |t| {
        t.len() == 1 && t[0].ticks > 0 && t[0].watermark_ms.is_some()
    })[0]
        .partition;
    wait_tasks(&x, "forward", "x kept the other task", |t| {
        t.len() == 1 && t[0].partition != on_y
    });

    // Records on both partitions, event times three seconds ahead: parked on both instances,
    // certainly until y has stopped.
    let mut live = Live::new();
    for p in 0..2 {
        live.send_to(&inputs, p, &key_on(p, 2), &format!("p{p}-"), 8, 3_000);
    }
    wait_tasks(&y, "forward", "y's records parked", |t| {
        t.len() == 1 && t[0].parked == 8
    });
    wait_tasks(&x, "forward", "x's records parked", |t| {
        t.len() == 1 && t[0].parked == 8
    });
    // y stops: its last transaction commits, and its task moves back to x with its parked
    // records; x writes that task's ticks from now on.
    let stopped = y.stop().unwrap();
    assert_eq!(stopped[0].1.parked, 8, "{:?}", stopped[0].1);
    let m = wait_committed(&x, "forward", 16);
    assert_eq!(m.late, 0, "{m:?}");
    let tasks = wait_tasks(&x, "forward", "both tasks drained", |t| {
        t.len() == 2 && t.iter().all(|t| t.parked == 0)
    });
    let moved = tasks.iter().find(|t| t.partition == on_y).unwrap();
    assert!(moved.ticks > 0, "x ticks for the moved task: {moved:?}");
    x.stop().unwrap();
    let records = read_committed(&out);
    for p in 0..2 {
        let got: Vec<String> = records
            .iter()
            .filter(|r| r.partition == p)
            .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
            .collect();
        assert_eq!(got, live.in_event_time_order_on(p), "partition {p}");
    }
}
