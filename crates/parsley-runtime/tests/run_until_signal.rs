//! `Runtime::run_until_signal` in a real process on the real broker: a child process (this
//! test binary, running the ignored test below) counts records with a commit interval of ten
//! minutes, so nothing it delivers becomes visible before its shutdown's final commit. Once the
//! child has delivered every record (its outputs are in the log, uncommitted), the test sends
//! it SIGTERM: the child must exit with status 0, and its outputs and input offsets must then
//! be committed — which only the clean stop can have done.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use parsley_runtime::{Runtime, RuntimeConfig, partition_for};
use parsley_stage::Topology;
use parsley_testkit::fixtures::{
    CountKeys, DEADLINE, admin, bootstrap, committed_values, create_topic, group_offset,
    raw_producer, send_stamped, unique_topic, utf8_stage,
};

/// `application,input,output` for the child.
const CHILD_ENV: &str = "PARSLEY_SIGNAL_CHILD";
const RECORDS: usize = 12;

fn counting(app: &str, input: &str, output: &str) -> Topology {
    Topology::builder(app)
        .stage("count", CountKeys::new(output), |s| {
            utf8_stage(s, &[input], &[output])
        })
        .build()
        .unwrap()
}

/// The child: counts until a signal stops it; prints what it committed. Does nothing unless the
/// test below starts it.
#[test]
#[ignore = "a child process of the SIGTERM test, started by it"]
fn signal_child_counts_until_a_signal_stops_it() {
    let Ok(names) = std::env::var(CHILD_ENV) else {
        return;
    };
    let names: Vec<&str> = names.split(',').collect();
    let config = RuntimeConfig::new(bootstrap()).commit_interval(Duration::from_secs(600));
    let stopped = Runtime::new(counting(names[0], names[1], names[2]), config)
        .run_until_signal()
        .expect("stopped cleanly on the signal");
    println!(
        "child: committed_deliveries={}",
        stopped[0].1.committed_deliveries
    );
}

/// Kills the child if the test fails before it exits.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn sigterm_stops_a_running_topology_cleanly_with_a_final_commit_and_exit_status_0() {
    let input = create_topic("signal-in", 2);
    let output = create_topic("signal-out", 2);
    let app = unique_topic("signal");
    // Six keys, each on the partition murmur2 gives it (a task counts the keys of its
    // partition), and the running counts the stage must commit.
    let p = raw_producer(None);
    let mut counts = std::collections::HashMap::new();
    let mut expected = Vec::new();
    for i in 0..RECORDS {
        let key = format!("k{}", i % 6);
        let partition = partition_for(key.as_bytes(), 2);
        send_stamped(&p, &input.name, partition, key.as_bytes(), b"x", None);
        let n = counts.entry(key.clone()).or_insert(0);
        *n += 1;
        expected.push(format!("{key}={n}"));
    }
    expected.sort();
    let mut child = Reaped(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "signal_child_counts_until_a_signal_stops_it",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_ENV, format!("{app},{},{}", input.name, output.name))
            .env("PARSLEY_BOOTSTRAP", bootstrap())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );

    // Evidence that the child delivered every record: its outputs are in the log (the high
    // watermarks count them), in a transaction that is still open.
    let started = Instant::now();
    loop {
        let ends = admin()
            .high_watermarks(&[(&output.name, 0), (&output.name, 1)])
            .unwrap();
        if ends.iter().sum::<i64>() >= RECORDS as i64 {
            break;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("the child exited before the signal: {status}");
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the child did not deliver {RECORDS} records: output ends {ends:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        committed_values(&output).is_empty(),
        "nothing is committed before the signal (ten-minute commit interval)"
    );
    assert_eq!(group_offset(&format!("{app}.count"), &input.name, 0), None);

    let pid = child.0.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(kill.success(), "kill -TERM {pid}: {kill}");
    let status = child.0.wait().unwrap();
    let mut stdout = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "the child's exit: {status}\n{stdout}"
    );
    assert!(
        stdout.contains(&format!("committed_deliveries={RECORDS}")),
        "{stdout}"
    );

    // The final commit: every count, and the input offsets at the end of each partition.
    let mut committed = committed_values(&output);
    committed.sort();
    assert_eq!(committed, expected);
    for partition in 0..2 {
        assert_eq!(
            group_offset(&format!("{app}.count"), &input.name, partition),
            Some((RECORDS / 2) as i64),
            "partition {partition}"
        );
    }
}
