//! Stale reads of standbys on the real broker (`ReadOnlyStore::stale_ok`): two instances of a
//! DSL count over three partitions, each keeping one standby per task it owns
//! (`RuntimeConfig::standby_replicas(1)`). The instance that owns one task (the reader) keeps a
//! standby of one of the other's tasks and neither of the third:
//!
//! - its stale read of a key of the standby's task returns the owner's count, marked as read
//!   from a standby at lag 0, once the standby has read the changelog partition to its end
//!   (the end read from the broker, the standby's position from its metrics);
//! - its plain read of that key is `NotOwned`; a stale read of its own key is the owner's;
//! - a key whose task it neither runs nor keeps a standby of is `NotOwned`, stale or not;
//! - a stale read that waits for a stamp refuses the standby's key (`StandbyCannotWait`);
//! - `all` covers its task and its standby, each task with its source;
//! - the same over HTTP: `GET /store/{name}/{key}?stale=true`.
//!
//! In memory and with a state directory (a standby on disk reads its keyspace). Every wait is
//! on evidence: committed deliveries, the tasks each instance runs, the changelog's end offset
//! and the standby's position.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parsley_dsl::StreamsBuilder;
use parsley_runtime::{
    Admin, Clock, QueryError, Read, ReadOnlyStore, Running, Runtime, RuntimeConfig, Source,
    StandbyMetrics, TaskPhase, changelog_topic,
};
use parsley_testkit::fixtures::http_get as get;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, keys_on_each_partition, raw_producer, send_stamped,
    unique_topic, wait_committed,
};

const STORE: &str = "counts";
const PARTITIONS: i32 = 3;

/// Application `app` counting the records of each key of `topic` into store [`STORE`]; with
/// the stage's name.
fn counts(app: &str, topic: &str) -> (parsley_stage::Topology, String) {
    let builder = StreamsBuilder::new(app);
    builder
        .stream::<String, String>(topic)
        .group_by_key()
        .named(STORE)
        .count();
    let topology = builder.build().unwrap();
    let stage = topology.stages()[0].name().to_string();
    (topology, stage)
}

/// The partitions of `stage`'s tasks `running` runs, and whether all of them run (none
/// restoring).
fn tasks(running: &Running, stage: &str) -> (BTreeSet<i32>, bool) {
    let tasks = running
        .task_metrics()
        .into_iter()
        .find(|(n, _)| n == stage)
        .map(|(_, t)| t)
        .unwrap_or_default();
    let all_run = tasks.iter().all(|t| t.phase == TaskPhase::Running);
    (tasks.into_iter().map(|t| t.partition).collect(), all_run)
}

/// The standbys of `stage` that `running` keeps.
fn standbys(running: &Running, stage: &str) -> Vec<StandbyMetrics> {
    running
        .standby_metrics()
        .into_iter()
        .find(|(n, _)| n == stage)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

fn stale_reads(state_dirs: bool) {
    let input = create_topic("stale-in", PARTITIONS);
    let app = unique_topic("stale-app");
    let (topology, stage) = counts(&app, &input.name);
    // Two keys on each partition, key i sent i + 1 times: every count differs.
    let keys = keys_on_each_partition(2, PARTITIONS);
    let producer = raw_producer(None);
    for (i, (p, k)) in keys.iter().enumerate() {
        for _ in 0..=i {
            send_stamped(&producer, &input.name, *p, k.as_bytes(), b"x", None);
        }
    }
    let total: u64 = (1..=keys.len() as u64).sum();
    let count_of =
        |key: &str| -> i64 { keys.iter().position(|(_, k)| k == key).unwrap() as i64 + 1 };

    let dirs: Vec<PathBuf> = (0..2)
        .map(|_| std::env::temp_dir().join(unique_topic("parsley-stale")))
        .collect();
    let start = |i: usize| {
        let mut config = RuntimeConfig::new(bootstrap())
            .instance_id(format!("{app}-{i}"))
            .standby_replicas(1)
            .metrics_address(([127, 0, 0, 1], 0));
        if state_dirs {
            config = config.state_dir(&dirs[i]);
        }
        Runtime::new(topology.clone(), config).start().unwrap()
    };
    let first = start(0);
    wait_committed(&first, &stage, total);
    let second = start(1);

    // The three tasks spread over the two instances, all running: one owns one, the other two.
    let started = Instant::now();
    let (reader, owner, own) = loop {
        let (on_first, first_runs) = tasks(&first, &stage);
        let (on_second, second_runs) = tasks(&second, &stage);
        if first_runs
            && second_runs
            && on_first.len() + on_second.len() == PARTITIONS as usize
            && on_first.is_disjoint(&on_second)
            && !on_first.is_empty()
            && !on_second.is_empty()
        {
            break if on_first.len() == 1 {
                (&first, &second, on_first)
            } else {
                (&second, &first, on_second)
            };
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the tasks never spread: {on_first:?} {on_second:?}"
        );
        let _ = first.next_progress(Duration::from_millis(20));
    };
    let own = *own.first().unwrap();

    // The reader's standby of one of the owner's tasks reads the changelog partition to its
    // end: its position at or past the partition's high watermark, as the broker says now.
    let changelog = changelog_topic(&topology.stages()[0].group_id(&app));
    let admin = Admin::new(&bootstrap(), DEADLINE).unwrap();
    let started = Instant::now();
    let warm = loop {
        if let [s] = standbys(reader, &stage)[..]
            && s.partition != own
        {
            let end = admin.high_watermarks(&[(&changelog, s.partition)]).unwrap()[0];
            // Its own consumer's view agrees: lag 0 in the standbys' metrics.
            if end > 0 && s.position >= end && s.lag() == Some(0) {
                break s.partition;
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the reader's standby never reached its changelog's end: {:?}",
            standbys(reader, &stage)
        );
        let _ = reader.next_progress(Duration::from_millis(20));
    };
    let neither = (0..PARTITIONS).find(|p| *p != own && *p != warm).unwrap();
    let key_on = |p: i32| keys.iter().find(|(q, _)| *q == p).unwrap().1.clone();
    let (warm_key, own_key, no_key) = (key_on(warm), key_on(own), key_on(neither));

    let plain: ReadOnlyStore<String, i64> = reader.store(STORE).unwrap();
    let stale = plain.stale_ok();
    // The owner's value, from the standby, at its end.
    let read = stale.get(&warm_key).unwrap();
    let Read {
        value,
        partition,
        source: Source::Standby { position, lag },
    } = read
    else {
        panic!("a standby read: {read:?}")
    };
    assert_eq!(
        (value, partition, lag),
        (Some(count_of(&warm_key)), warm, Some(0)),
        "{read:?}"
    );
    assert!(position > 0, "{read:?}");
    let owners: ReadOnlyStore<String, i64> = owner.store(STORE).unwrap();
    assert_eq!(owners.get(&warm_key).unwrap(), Some(count_of(&warm_key)));
    // Without the opt-in the standby is not read.
    assert_eq!(
        plain.get(&warm_key),
        Err(QueryError::NotOwned {
            store: STORE.into(),
            partition: warm
        })
    );
    // Its own key: the owner's value.
    assert_eq!(
        stale.get(&own_key).unwrap(),
        Read {
            value: Some(count_of(&own_key)),
            partition: own,
            source: Source::Owner
        }
    );
    // A key whose task is neither run nor warm here.
    for read in [stale.get(&no_key).map(|r| r.value), plain.get(&no_key)] {
        assert_eq!(
            read,
            Err(QueryError::NotOwned {
                store: STORE.into(),
                partition: neither
            })
        );
    }
    // A stamp cannot be waited for on a standby; on the owned task it can (an empty stamp
    // claims nothing).
    assert_eq!(
        stale.get_at_least(&warm_key, &Clock::default(), Duration::from_millis(100)),
        Err(QueryError::StandbyCannotWait {
            store: STORE.into(),
            partition: warm
        })
    );
    assert_eq!(
        stale.get_at_least(&own_key, &Clock::default(), Duration::from_millis(100)),
        Ok(Some(count_of(&own_key)))
    );
    // `all`: the owned task's keys and the standby's, each task with its source.
    let all = stale.all().unwrap();
    let expected: Vec<(i32, String, i64)> = keys
        .iter()
        .filter(|(p, _)| *p == own || *p == warm)
        .map(|(p, k)| (*p, k.clone(), count_of(k)))
        .collect();
    let mut got = all.entries.clone();
    got.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(got, expected_sorted);
    assert_eq!(all.tasks.get(&own), Some(&Source::Owner));
    assert!(
        matches!(
            all.tasks.get(&warm),
            Some(Source::Standby { lag: Some(0), .. })
        ),
        "{:?}",
        all.tasks
    );
    assert_eq!(all.tasks.len(), 2, "{:?}", all.tasks);
    assert_eq!(all.max_lag(), Some(0));

    // Over HTTP.
    let address = reader.metrics_address().unwrap();
    let (status, body) = get(address, &format!("/store/{STORE}/{warm_key}?stale=true"));
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["value"], count_of(&warm_key), "{body}");
    assert_eq!(
        (&json["source"], &json["partition"], &json["lag"]),
        (
            &serde_json::json!("standby"),
            &serde_json::json!(warm),
            &serde_json::json!(0)
        ),
        "{body}"
    );
    let (status, body) = get(address, &format!("/store/{STORE}/{own_key}?stale=true"));
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["source"], "owner", "{body}");
    assert_eq!(
        get(address, &format!("/store/{STORE}/{warm_key}")).0,
        421,
        "no opt-in: not owned"
    );
    assert_eq!(
        get(address, &format!("/store/{STORE}/{no_key}?stale=true")).0,
        421,
        "no task here at all"
    );
    assert_eq!(
        get(address, &format!("/store/{STORE}/{warm_key}?stale=yes")).0,
        400
    );

    first.stop().unwrap();
    second.stop().unwrap();
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn a_standby_is_read_stale_in_memory_marked_with_its_lag() {
    stale_reads(false);
}

#[test]
fn a_standby_on_disk_is_read_stale_from_its_keyspace() {
    stale_reads(true);
}
