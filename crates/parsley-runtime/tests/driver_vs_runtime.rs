//! The topology test driver against the real runtime on the local broker: a two-stage
//! stateful topology run both ways on the same input gives the same outputs per key and the
//! same fold state (the runtime's read back from its changelog topics).

use std::collections::BTreeMap;

use parsley_runtime::driver::TopologyTestDriver;
use parsley_runtime::{Runtime, RuntimeConfig, TopicInfo, changelog_topic, partition_for};
use parsley_stage::{Handler, HandlerResult, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{
    CountKeys, admin, bootstrap, create_topic, raw_producer, read_committed, send_stamped,
    unique_topic, utf8_stage, wait_committed,
};

/// Sums the numbers after `=` in its input lines (`key=n`), per key, and emits `key=total`.
struct SumCounts(String);

impl Handler for SumCounts {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = u64;

    fn handle(
        &self,
        r: Record<'_, String, String>,
        s: Option<u64>,
    ) -> HandlerResult<String, String, u64> {
        let n: u64 = r.value.rsplit('=').next().unwrap_or("").parse()?;
        let total = s.unwrap_or(0) + n;
        let line = format!("{}={total}", r.key);
        Ok(Step::none()
            .set_state(total)
            .emit(self.0.as_str(), r.key, line))
    }
}

/// Values per key, in the order each key's records were appended.
fn by_key(records: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in records {
        out.entry(k).or_default().push(v);
    }
    out
}

/// The fold state a stage's changelog topic holds: the latest `0x00 ++ key` record of each key.
fn changelog_state(app: &str, stage: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let name = changelog_topic(&format!("{app}.{stage}"));
    let topic: TopicInfo = admin().describe_topics(&[name.as_str()]).unwrap().remove(0);
    let mut state = BTreeMap::new();
    for r in read_committed(&topic) {
        let key = r.key.unwrap_or_default();
        if let Some((0, k)) = key.split_first() {
            match r.value {
                Some(v) => state.insert(k.to_vec(), v),
                None => state.remove(k),
            };
        }
    }
    state
}

#[test]
fn the_driver_and_the_runtime_give_the_same_outputs_and_state() {
    let orders = create_topic("driver-orders", 2);
    let counts = create_topic("driver-counts", 2);
    let sums = create_topic("driver-sums", 2);
    let app = unique_topic("driver-vs-runtime");
    let topology = Topology::builder(&app)
        .stage("count", CountKeys::new(&counts.name), |s| {
            utf8_stage(s, &[&orders.name], &[&counts.name])
        })
        .stage("sum", SumCounts(sums.name.clone()), |s| {
            utf8_stage(s, &[&counts.name], &[&sums.name])
        })
        .build()
        .unwrap();
    let input: Vec<(String, String)> = (0..30)
        .map(|i| (format!("customer-{}", i * 7 % 5), format!("order-{i}")))
        .collect();

    // In memory.
    let driver = TopologyTestDriver::builder(topology.clone())
        .partitions(&orders.name, 2)
        .partitions(&counts.name, 2)
        .partitions(&sums.name, 2)
        .build()
        .unwrap();
    let pipe = driver.input_topic(&orders.name, Utf8, Utf8).unwrap();
    for (k, v) in &input {
        pipe.pipe(k.clone(), v.clone()).unwrap();
    }
    let driver_sums = by_key(
        driver
            .output_topic(&sums.name, Utf8, Utf8)
            .unwrap()
            .read_key_values(),
    );
    let driver_counts = by_key(
        driver
            .output_topic(&counts.name, Utf8, Utf8)
            .unwrap()
            .read_key_values(),
    );

    // On the broker: the same records, on the partitions murmur2 gives their keys.
    let producer = raw_producer(None);
    for (k, v) in &input {
        let partition = partition_for(k.as_bytes(), 2);
        send_stamped(
            &producer,
            &orders.name,
            partition,
            k.as_bytes(),
            v.as_bytes(),
            None,
        );
    }
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "sum", input.len() as u64);
    running.stop().unwrap();
    let read = |topic: &TopicInfo| {
        by_key(read_committed(topic).into_iter().map(|r| {
            (
                String::from_utf8(r.key.unwrap()).unwrap(),
                String::from_utf8(r.value.unwrap()).unwrap(),
            )
        }))
    };

    assert_eq!(driver_sums.len(), 5, "{driver_sums:?}");
    assert_eq!(driver_sums["customer-0"].last().unwrap(), "customer-0=21");
    assert_eq!(read(&counts), driver_counts);
    assert_eq!(read(&sums), driver_sums);
    for stage in ["count", "sum"] {
        let in_memory: BTreeMap<Vec<u8>, Vec<u8>> = driver.raw_states(stage).unwrap();
        assert_eq!(in_memory.len(), 5, "{stage}");
        assert_eq!(changelog_state(&app, stage), in_memory, "{stage}");
    }
}

/// The first changelog record of each transaction on a partition names the producer (header
/// `parsley.txn`: its transactional id), and no other record does: a restore held by an open
/// transaction reads that first record to say whose the transaction is. Three transactions of
/// five keys each, every one waited for by its committed offsets; a commit marker takes one
/// offset, so a transaction's first record is the partition's first or follows a gap.
#[test]
fn each_transactions_first_changelog_record_names_the_producer_and_no_other_does() {
    let orders = create_topic("txn-header-orders", 1);
    let counts = create_topic("txn-header-counts", 1);
    let app = unique_topic("txn-header");
    let topology = Topology::builder(&app)
        .stage("count", CountKeys::new(&counts.name), |s| {
            utf8_stage(s, &[&orders.name], &[&counts.name])
        })
        .build()
        .unwrap();
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let producer = raw_producer(None);
    for round in 1..=3u64 {
        for i in 0..5 {
            let key = format!("customer-{i}");
            send_stamped(&producer, &orders.name, 0, key.as_bytes(), b"order", None);
        }
        wait_committed(&running, "count", round * 5);
    }
    running.stop().unwrap();

    let name = changelog_topic(&format!("{app}.count"));
    let topic: TopicInfo = admin().describe_topics(&[name.as_str()]).unwrap().remove(0);
    let records = read_committed(&topic);
    let mut previous: Option<i64> = None;
    let mut firsts = 0;
    let mut named_by = BTreeMap::new();
    for r in &records {
        let first = previous.is_none_or(|p| r.offset > p + 1);
        previous = Some(r.offset);
        let names: Vec<&Option<Vec<u8>>> = r
            .headers
            .iter()
            .filter(|(h, _)| h == "parsley.txn")
            .map(|(_, v)| v)
            .collect();
        if first {
            firsts += 1;
            assert_eq!(names.len(), 1, "a transaction's first record: {r:?}");
            let id = String::from_utf8(names[0].clone().unwrap()).unwrap();
            *named_by.entry(id).or_insert(0) += 1;
        } else {
            assert!(names.is_empty(), "a later record of its transaction: {r:?}");
        }
    }
    assert!(firsts >= 3, "three transactions at least: {records:?}");
    assert!(
        records.len() > firsts + 10,
        "five keys per transaction: {records:?}"
    );
    assert_eq!(named_by.len(), 1, "one producer: {named_by:?}");
    let id = named_by.keys().next().unwrap();
    assert!(id.starts_with(&format!("{app}.count")), "{id}");
}
