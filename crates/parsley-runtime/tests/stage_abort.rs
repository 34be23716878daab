//! An aborted transaction on the real broker (the book's specification, §7, "exactness of a
//! restore"): after the abort every task returns to its last commit, so the stage's committed
//! outputs are identical — content, per-partition order, causal stamps, send sequences (the aborted
//! sends' sequences are reused) — to those of a run without the abort.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use parsley_runtime::{MetricsSnapshot, Runtime, RuntimeConfig, TopicInfo, partition_for};
use parsley_stage::{Handler, HandlerResult, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{
    DEADLINE, ReadRecord, bootstrap, create_topic, raw_producer, read_committed, send_stamped,
    unique_topic, wait_committed,
};
use rdkafka::producer::Producer;

/// Counts the records of each key and emits `value:count`. When `armed`, the first record
/// whose value is `fault` stalls its handler past the producer's transaction timeout (7 s
/// against 5 s, plus the test broker's 1 s abort sweep): the coordinator aborts the open
/// transaction, its commit fails and the stage recovers; the record is then handled again,
/// normally. (An emission too large for the producer was the fault here until such a record
/// became a refusal for good, `RecordError::OutputRefused`, which is not redone: case C16.)
struct CountWithFault {
    out: String,
    armed: AtomicBool,
}

/// The producer's transaction timeout of both runs.
const TRANSACTION_TIMEOUT_MS: &str = "5000";
/// How long the fault stalls the handler.
const STALL: std::time::Duration = std::time::Duration::from_secs(7);

impl Handler for CountWithFault {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = u64;

    fn handle(
        &self,
        r: Record<'_, String, String>,
        state: Option<u64>,
    ) -> HandlerResult<String, String, u64> {
        let n = state.unwrap_or(0) + 1;
        if r.value == "fault" && self.armed.swap(false, Ordering::SeqCst) {
            std::thread::sleep(STALL);
        }
        let value = format!("{}:{n}", r.value);
        Ok(Step::none()
            .set_state(n)
            .emit(self.out.as_str(), r.key, value))
    }
}

const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
/// Records per input phase; the fault is record `FAULT` of the second phase.
const PHASE: usize = 24;
const FAULT: usize = 12;

/// One run: two phases of the same input on fresh topics (two partitions; a key's input
/// partition is its output partition, so each output partition is written by one task). The
/// first phase is committed before the second is written, in one transaction, so the fault
/// falls in a transaction after a commit, behind other sends of its own transaction.
fn run(fault: bool) -> (TopicInfo, TopicInfo, MetricsSnapshot) {
    let input = create_topic("abort-in", 2);
    let output = create_topic("abort-out", 2);
    let topology = Topology::builder(unique_topic("abort"))
        .stage(
            "count",
            CountWithFault {
                out: output.name.clone(),
                armed: AtomicBool::new(fault),
            },
            |s| {
                s.source(&input.name)
                    .sink(&output.name)
                    .key_codec(Utf8)
                    .value_codec(Utf8)
                    .output_codec(Utf8)
            },
        )
        .build()
        .unwrap();
    let send = |p: &rdkafka::producer::BaseProducer, from: usize| {
        for i in from..from + PHASE {
            let key = KEYS[i % KEYS.len()];
            let value = if i == PHASE + FAULT {
                "fault".to_string()
            } else {
                format!("v{i}")
            };
            let partition = partition_for(key.as_bytes(), 2);
            send_stamped(
                p,
                &input.name,
                partition,
                key.as_bytes(),
                value.as_bytes(),
                None,
            );
        }
    };
    let config = RuntimeConfig::new(bootstrap())
        .producer_property("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS);
    let running = Runtime::new(topology, config).start().unwrap();
    send(&raw_producer(None), 0);
    wait_committed(&running, "count", PHASE as u64);
    let p = raw_producer(Some(&unique_topic("abort-p")));
    p.begin_transaction().unwrap();
    send(&p, PHASE);
    p.commit_transaction(DEADLINE).unwrap();
    wait_committed(&running, "count", 2 * PHASE as u64);
    let m = running.stop().unwrap()[0].1;
    (input, output, m)
}

/// What must be identical between the runs, per committed output record: key, value, send
/// sequence, and the clock's entries on input channels (partition, offset).
type Essential = (String, String, u64, Vec<(i32, i64)>);

fn essentials(input: &TopicInfo, records: &[ReadRecord]) -> BTreeMap<i32, Vec<Essential>> {
    let mut out: BTreeMap<i32, Vec<Essential>> = BTreeMap::new();
    for r in records {
        let stamp = r.stamp.as_ref().expect("stage outputs are stamped");
        let inputs = stamp
            .clock
            .entries()
            .iter()
            .filter(|(c, _)| c.topic == input.id)
            .map(|(c, o)| (c.partition, *o))
            .collect();
        out.entry(r.partition).or_default().push((
            String::from_utf8(r.key.clone().unwrap()).unwrap(),
            String::from_utf8(r.value.clone().unwrap()).unwrap(),
            stamp.sender.unwrap().seq,
            inputs,
        ));
    }
    out
}

#[test]
fn after_an_abort_the_outputs_equal_those_of_a_run_without_it() {
    let (in1, out1, m1) = run(false);
    let (in2, out2, m2) = run(true);
    assert_eq!(m1.aborts, 0, "{m1:?}");
    assert!(
        m2.aborts >= 1,
        "the transaction with the fault aborted: {m2:?}"
    );
    assert!(
        m2.emitted > m2.committed_emissions,
        "the aborted transaction had sends of its own, whose sequences are reused: {m2:?}"
    );
    assert_eq!(m1.committed_deliveries, 2 * PHASE as u64, "{m1:?}");
    assert_eq!(m2.committed_deliveries, 2 * PHASE as u64, "{m2:?}");

    let (r1, r2) = (read_committed(&out1), read_committed(&out2));
    let (e1, e2) = (essentials(&in1, &r1), essentials(&in2, &r2));
    assert_eq!(e1.values().map(Vec::len).sum::<usize>(), 2 * PHASE);
    // Content and order per partition, send sequences, and input coordinates claimed.
    assert_eq!(e1, e2);
    for (p, records) in &e1 {
        // Each output partition is one task's: its sequence has no gap, and each output
        // claims exactly the input record it came from (its task's channel, that offset).
        let seqs: Vec<u64> = records.iter().map(|e| e.2).collect();
        assert_eq!(seqs, (0..records.len() as u64).collect::<Vec<_>>(), "{p}");
        assert!(
            records.iter().all(|e| e.3.len() == 1 && e.3[0].0 == *p),
            "{p}"
        );
    }
    // The record behind the fault was counted once: `fault:7` (k0's 7th record) appears once.
    let fault_key = KEYS[(PHASE + FAULT) % KEYS.len()];
    let faults: Vec<&Essential> = e2
        .values()
        .flatten()
        .filter(|e| e.1.starts_with("fault"))
        .collect();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert_eq!(
        (faults[0].0.as_str(), faults[0].1.as_str()),
        (fault_key, "fault:7")
    );

    // One incarnation per task across the abort, and its clock, restored from the last commit,
    // claims only committed records of its own output partition (none of the aborted sends).
    for (records, out) in [(&r1, &out1), (&r2, &out2)] {
        let mut senders: BTreeMap<i32, BTreeSet<_>> = BTreeMap::new();
        let committed: BTreeSet<(i32, i64)> =
            records.iter().map(|r| (r.partition, r.offset)).collect();
        for r in records {
            let stamp = r.stamp.as_ref().unwrap();
            senders
                .entry(r.partition)
                .or_default()
                .insert(stamp.sender.unwrap().sender);
            for (c, o) in stamp.clock.entries() {
                if c.topic == out.id {
                    assert_eq!(c.partition, r.partition, "{stamp:?}");
                    assert!(
                        committed.contains(&(c.partition, *o)) && *o < r.offset,
                        "output {}@{} claims {c}@{o}, not an earlier committed output",
                        r.partition,
                        r.offset
                    );
                }
            }
        }
        assert!(senders.values().all(|s| s.len() == 1), "{senders:?}");
    }
}
