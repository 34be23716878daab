//! Interactive queries on the real broker (`Running::store`): a DSL count read by key, by
//! range and whole once its records are committed; a store that does not exist and a store
//! asked for with the wrong types, each a typed error naming it; a read that waits for the
//! stamp of a `CausalProducer` write and returns the written value, and one that times out on
//! a stamp claiming an offset never written, naming the channel.
//!
//! The same store over HTTP (`GET /store/{name}/{key}` on the metrics endpoint), and
//! `Running::key_owner` across two instances of a stage, each holding one task: both name the
//! same owner for every key, with its instance id and advertised endpoint, and the instance
//! that does not own a key refuses to read it (`NotOwned`) while the owner reads it.
//!
//! Every wait is on evidence: committed deliveries, the tasks each instance runs, the owners
//! the group coordinator lists, and the stamp itself.

use std::time::{Duration, Instant};

use parsley_dsl::StreamsBuilder;
use parsley_runtime::{
    CausalProducer, CausalProducerConfig, Clock, QueryError, ReadOnlyStore, Runtime, RuntimeConfig,
    ShortChannel,
};
use parsley_runtime::{KeyOwner, Running, TaskPhase};
use parsley_testkit::fixtures::http_get as get;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, unique_topic, wait_committed, wait_tasks,
};

const USERS: usize = 5;
const CLICKS: usize = 50;

fn user(i: usize) -> String {
    format!("u-{}", i % USERS)
}

/// The count of clicks per user of `topic` in application `app`, its store `clicks-per-user`;
/// with the stage's name.
fn clicks_per_user(app: &str, topic: &str) -> (parsley_stage::Topology, String) {
    let builder = StreamsBuilder::new(app);
    builder
        .stream::<String, String>(topic)
        .group_by_key()
        .named("clicks-per-user")
        .count();
    let topology = builder.build().unwrap();
    let stage = topology.stages()[0].name().to_string();
    (topology, stage)
}

#[test]
fn a_count_is_read_by_key_by_range_and_whole_and_a_stamped_write_is_read_back() {
    let clicks = create_topic("q-clicks", 2);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    for i in 0..CLICKS {
        producer
            .send(&clicks.name, user(i).as_bytes(), b"click")
            .unwrap();
    }
    producer.flush().unwrap();

    let (topology, stage) = clicks_per_user(&unique_topic("q-app"), &clicks.name);
    let config = RuntimeConfig::new(bootstrap()).metrics_address(([127, 0, 0, 1], 0));
    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, &stage, CLICKS as u64);

    let store: ReadOnlyStore<String, i64> = running.store("clicks-per-user").unwrap();
    let per_user = (CLICKS / USERS) as i64;
    assert_eq!(store.get(&"u-1".to_string()).unwrap(), Some(per_user));
    assert_eq!(store.get(&"nobody".to_string()).unwrap(), None);
    assert_eq!(
        store.range("u-1".to_string().."u-3".to_string()).unwrap(),
        vec![("u-1".to_string(), per_user), ("u-2".to_string(), per_user)]
    );
    let mut all = store.all().unwrap();
    all.sort();
    assert_eq!(
        all,
        (0..USERS).map(|i| (user(i), per_user)).collect::<Vec<_>>()
    );

    // A store nobody declared, and the right store with the wrong value type.
    match running.store::<String, i64>("no-such-store") {
        Err(QueryError::UnknownStore { store, known }) => {
            assert_eq!(store, "no-such-store");
            assert_eq!(known, vec!["clicks-per-user".to_string()]);
        }
        other => panic!("expected UnknownStore, got {other:?}"),
    }
    match running.store::<String, String>("clicks-per-user") {
        Err(e @ QueryError::WrongTypes { .. }) => {
            assert!(e.to_string().contains("clicks-per-user"), "{e}");
        }
        other => panic!("expected WrongTypes, got {other:?}"),
    }

    // The same store over HTTP: a String key in the path, the value as JSON.
    let address = running.metrics_address().unwrap();
    assert_eq!(
        get(address, "/store/clicks-per-user/u-1"),
        (
            200,
            format!("{{\"store\":\"clicks-per-user\",\"key\":\"u-1\",\"value\":{per_user}}}\n")
        )
    );
    assert_eq!(
        get(address, "/store/clicks-per-user/nobody"),
        (
            404,
            "{\"store\":\"clicks-per-user\",\"key\":\"nobody\",\"value\":null}\n".to_string()
        )
    );
    let (status, body) = get(address, "/store/no-such-store/u-1");
    assert_eq!(status, 404);
    assert!(body.contains("no-such-store"), "{body}");

    // Read your own write: the value once the key's task has delivered the write's stamp.
    // A plain `get` right after the acknowledgement may still see the old count; this one waits.
    producer.send(&clicks.name, b"u-1", b"click").unwrap();
    producer.flush().unwrap();
    let stamp = producer.clock().clone();
    assert_eq!(
        store
            .get_at_least(&"u-1".to_string(), &stamp, DEADLINE)
            .unwrap(),
        Some(per_user + 1)
    );

    // A stamp claiming an offset nobody wrote is never delivered: the read times out naming
    // the channel, the offset claimed and the task's frontier.
    let channel = producer.channel_for(&clicks.name, b"u-1").unwrap();
    let beyond: Vec<_> = stamp
        .entries()
        .iter()
        .map(|&(c, o)| (c, if c == channel { 1_000_000 } else { o }))
        .collect();
    let beyond = Clock::try_from_sorted(beyond).unwrap();
    match store.get_at_least(&"u-1".to_string(), &beyond, Duration::from_millis(300)) {
        Err(QueryError::NotCaughtUp {
            store: name,
            partition,
            short,
            timeout,
        }) => {
            assert_eq!(name, "clicks-per-user");
            assert_eq!(partition, channel.partition);
            assert_eq!(timeout, Duration::from_millis(300));
            let [
                ShortChannel {
                    topic,
                    partition,
                    claimed,
                    delivered,
                },
            ] = short.as_slice()
            else {
                panic!("one channel short: {short:?}")
            };
            assert_eq!(
                (topic, *partition, *claimed),
                (&clicks.name, channel.partition, 1_000_000)
            );
            assert!(
                *delivered >= stamp.get(&channel),
                "the task delivered the real write: {delivered:?}"
            );
        }
        other => panic!("expected NotCaughtUp, got {other:?}"),
    }
    running.stop().unwrap();
}

/// The tasks `running` runs, once it runs exactly one of `stage`'s.
fn one_task(running: &Running, stage: &str) -> i32 {
    wait_tasks(running, stage, "one running task", |tasks| {
        tasks.len() == 1 && tasks[0].phase == TaskPhase::Running
    })[0]
        .partition
}

#[test]
fn two_instances_name_the_same_owner_of_each_key_with_its_endpoint() {
    let clicks = create_topic("q-owners", 2);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    for i in 0..CLICKS {
        producer
            .send(&clicks.name, user(i).as_bytes(), b"click")
            .unwrap();
    }
    producer.flush().unwrap();

    let app = unique_topic("q-owners-app");
    let start = |id: &str, endpoint: &str| {
        let (topology, _) = clicks_per_user(&app, &clicks.name);
        let config = RuntimeConfig::new(bootstrap())
            .instance_id(id)
            .application_endpoint(endpoint);
        Runtime::new(topology, config).start().unwrap()
    };
    let (_, stage) = clicks_per_user(&app, &clicks.name);
    let a = start("inst-a", "127.0.0.1:7001");
    let b = start("inst-b", "127.0.0.1:7002");
    let (task_a, task_b) = (one_task(&a, &stage), one_task(&b, &stage));
    assert_ne!(task_a, task_b);

    let instances = [
        (&a, "inst-a", "127.0.0.1:7001", task_a),
        (&b, "inst-b", "127.0.0.1:7002", task_b),
    ];
    for i in 0..USERS {
        let key = user(i);
        // Each instance learns the other's tasks from the group coordinator's member list,
        // read by its stream thread every 2 s: ask until it names an owner.
        let owners: Vec<KeyOwner> = instances
            .iter()
            .map(|(running, ..)| {
                let started = Instant::now();
                loop {
                    match running.key_owner("clicks-per-user", &key) {
                        Ok(owner) => break owner,
                        Err(QueryError::OwnerUnknown { .. }) if started.elapsed() < DEADLINE => {
                            // Wait on the next progress event (a commit) or 50 ms.
                            let _ = running.next_progress(Duration::from_millis(50));
                        }
                        Err(e) => panic!("key_owner({key}): {e}"),
                    }
                }
            })
            .collect();
        let (_, id, endpoint, task) = instances
            .iter()
            .find(|(.., task)| *task == owners[0].partition)
            .expect("an instance runs the key's task");
        for (owner, (_, me, ..)) in owners.iter().zip(&instances) {
            assert_eq!(
                (
                    owner.partition,
                    owner.instance_id.as_str(),
                    owner.endpoint.as_str()
                ),
                (*task, *id, *endpoint),
                "{me} names the owner of {key}"
            );
            assert_eq!(owner.local, me == id);
        }
        // The owner reads the key once it has counted its clicks; the other refuses.
        for (running, me, ..) in &instances {
            let store: ReadOnlyStore<String, i64> = running.store("clicks-per-user").unwrap();
            if me == id {
                // Its state may come from its own deliveries or from a restore of the other
                // instance's: the value is the evidence.
                let started = Instant::now();
                while store.get(&key).unwrap() != Some((CLICKS / USERS) as i64) {
                    assert!(started.elapsed() < DEADLINE, "{me} never counted {key}");
                    let _ = running.next_progress(Duration::from_millis(50));
                }
            } else {
                match store.get(&key) {
                    Err(QueryError::NotOwned { store, partition }) => {
                        assert_eq!((store.as_str(), partition), ("clicks-per-user", *task));
                    }
                    other => panic!("{me} reads {key} it does not own: {other:?}"),
                }
            }
        }
    }
    a.stop().unwrap();
    b.stop().unwrap();
}

/// With two stream threads (`RuntimeConfig::stream_threads`), each owning a task of the
/// count: every key is read on the thread that runs its task, `all` gathers both threads'
/// keys, and `key_owner` names this instance for every key whichever thread holds it.
#[test]
fn a_store_spread_over_two_threads_is_read_whole_and_owned_by_the_instance() {
    let clicks = create_topic("q-threads", 2);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    for i in 0..CLICKS {
        producer
            .send(&clicks.name, user(i).as_bytes(), b"click")
            .unwrap();
    }
    producer.flush().unwrap();

    let (topology, stage) = clicks_per_user(&unique_topic("q-threads-app"), &clicks.name);
    let config = RuntimeConfig::new(bootstrap())
        .instance_id("threads-1")
        .application_endpoint("threads.example:9000")
        .stream_threads(2);
    let running = Runtime::new(topology, config).start().unwrap();
    // Both threads hold a task (the group may first give both to the thread that joined
    // first), and every click is committed.
    let started = Instant::now();
    loop {
        let spread = running.thread_tasks().remove(0).1;
        let running_tasks = running.task_metrics().remove(0).1;
        if spread.iter().all(|t| t.len() == 1)
            && running_tasks.len() == 2
            && running_tasks.iter().all(|t| t.phase == TaskPhase::Running)
        {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the two tasks were not spread over the threads: {spread:?}"
        );
        running.next_progress(Duration::from_millis(20));
    }
    wait_committed(&running, &stage, CLICKS as u64);

    let store: ReadOnlyStore<String, i64> = running.store("clicks-per-user").unwrap();
    let per_user = (CLICKS / USERS) as i64;
    for i in 0..USERS {
        assert_eq!(store.get(&user(i)).unwrap(), Some(per_user), "{}", user(i));
        let owner = running.key_owner("clicks-per-user", &user(i)).unwrap();
        assert_eq!(
            (
                owner.instance_id.as_str(),
                owner.endpoint.as_str(),
                owner.local
            ),
            ("threads-1", "threads.example:9000", true)
        );
    }
    let mut all = store.all().unwrap();
    all.sort();
    assert_eq!(
        all,
        (0..USERS).map(|i| (user(i), per_user)).collect::<Vec<_>>()
    );
    // The keys live on both threads' tasks.
    let partitions: std::collections::BTreeSet<i32> = (0..USERS)
        .map(|i| store.task_of(&user(i)).unwrap())
        .collect();
    assert_eq!(partitions.len(), 2, "the users span both tasks");
    running.stop().unwrap();
}
