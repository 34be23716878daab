//! Case C24 on the real broker: a start position chosen once. Parsley has no "start at the
//! latest offset" option: a group with no committed offset starts every input partition at its
//! log start offset (the book's *Recovery*). The case is checked in that form: a new group
//! starts, delivers, and its process dies before anything is committed (the crash point
//! `CrashPoint::AfterChangelog` aborts it at its first commit, after the changelog write and
//! before the offsets); records are produced while it is down; the restart — still a group
//! with no committed offset — starts again at the log start, so the records from before the
//! crash and those produced meanwhile are all processed, each exactly once.

use parsley_runtime::{CrashPoint, Runtime, RuntimeConfig};
use parsley_stage::Topology;
use parsley_testkit::fixtures::{
    bootstrap, committed_values, count_topology, create_topic, group_offset, next_failure,
    raw_producer, send_stamped, unique_topic, wait_committed,
};

fn counting(app: &str, input: &str, output: &str) -> (Topology, RuntimeConfig) {
    let topology = count_topology(app, input, output);
    // The dead process stays a group member until its session times out: a short one lets
    // the restart join within seconds.
    let config = RuntimeConfig::new(bootstrap())
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000")
        .instance_id("c24");
    (topology, config)
}

#[test]
fn c24_a_new_group_that_dies_before_its_first_commit_starts_at_the_same_place_again() {
    use std::os::unix::process::ExitStatusExt;
    let input = create_topic("c24-in", 1);
    let output = create_topic("c24-out", 1);
    let plain = raw_producer(None);
    for k in ["a", "b", "c"] {
        send_stamped(&plain, &input.name, 0, k.as_bytes(), b"x", None);
    }
    let app = unique_topic("c24");
    let group = format!("{app}.count");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "c24_child_starts_and_dies_before_its_first_commit",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(
            "PARSLEY_C24_CHILD",
            format!("{app},{},{}", input.name, output.name),
        )
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(6), "the child aborted: {status:?}");
    assert_eq!(
        group_offset(&group, &input.name, 0),
        None,
        "nothing was committed"
    );
    assert!(committed_values(&output).is_empty());

    // Produced while the group's only member is down.
    for k in ["d", "e"] {
        send_stamped(&plain, &input.name, 0, k.as_bytes(), b"x", None);
    }
    let (topology, config) = counting(&app, &input.name, &output.name);
    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, "count", 5);
    running.stop().unwrap();
    assert_eq!(
        committed_values(&output),
        ["a=1", "b=1", "c=1", "d=1", "e=1"],
        "the records from before the crash and those produced meanwhile, each once"
    );
    assert_eq!(group_offset(&group, &input.name, 0), Some(5));
}

/// The child of the test above: runs the counting stage armed with
/// [`CrashPoint::AfterChangelog`] until the crash point aborts the process at its first commit.
#[test]
#[ignore = "a child process of the C24 test, started by it"]
fn c24_child_starts_and_dies_before_its_first_commit() {
    let Ok(names) = std::env::var("PARSLEY_C24_CHILD") else {
        return;
    };
    let names: Vec<&str> = names.split(',').collect();
    let (topology, config) = counting(names[0], names[1], names[2]);
    let config = config.crash_at(CrashPoint::AfterChangelog);
    let running = Runtime::new(topology, config).start().unwrap();
    let error = next_failure(&running);
    panic!("the crash point did not abort the process; the stage failed instead: {error}");
}
