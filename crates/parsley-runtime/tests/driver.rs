//! The topology test driver without a broker: a stateful count per key, a two-stage pipeline,
//! the gate holding a record whose cause is not delivered, internal topics, co-partitioning,
//! and determinism.

use parsley_clock::{Clock, Stamp};
use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_runtime::{Error, partition_for};
use parsley_runtime::{RecordError, SetupError};
use parsley_stage::{Handler, HandlerResult, InternalTopic, Json, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{CountKeys, Forward, utf8_stage};

/// Sums the numbers after `=` in its input lines (`key=n`), per key, and emits `key=total`.
struct SumCounts(&'static str);

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
        Ok(Step::none().set_state(total).emit(self.0, r.key, line))
    }
}

fn count_topology() -> Topology {
    Topology::builder("shop")
        .stage("count", CountKeys::new("counts"), |s| {
            utf8_stage(s, &["orders"], &["counts"])
        })
        .build()
        .unwrap()
}

fn pipeline() -> Topology {
    Topology::builder("shop")
        .stage("count", CountKeys::new("counts"), |s| {
            utf8_stage(s, &["orders"], &["counts"])
        })
        .stage("sum", SumCounts("sums"), |s| {
            utf8_stage(s, &["counts"], &["sums"])
        })
        .build()
        .unwrap()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_stateful_count_per_key_emits_running_counts_and_keeps_its_state() {
    let driver = TopologyTestDriver::builder(count_topology())
        .partitions("orders", 3)
        .partitions("counts", 3)
        .build()
        .unwrap();
    let orders = driver.input_topic("orders", Utf8, Utf8).unwrap();
    let mut counts = driver.output_topic("counts", Utf8, Utf8).unwrap();
    for key in ["apple", "pear", "apple", "fig", "apple", "pear"] {
        orders.pipe(key.to_string(), "x".to_string()).unwrap();
    }
    let records = counts.read_records();
    let lines: Vec<&str> = records.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(
        lines,
        ["apple=1", "pear=1", "apple=2", "fig=1", "apple=3", "pear=2"]
    );
    for r in &records {
        assert_eq!(
            r.partition,
            partition_for(r.key.as_bytes(), 3),
            "murmur2 of the key: {r:?}"
        );
        assert!(
            r.stamp.as_ref().is_some_and(|s| s.sender.is_some()),
            "stamped by its task"
        );
    }
    // Offsets are dense from 0 in every partition.
    for p in 0..3 {
        let offsets: Vec<i64> = records
            .iter()
            .filter(|r| r.partition == p)
            .map(|r| r.offset)
            .collect();
        assert_eq!(offsets, (0..offsets.len() as i64).collect::<Vec<_>>());
    }
    assert!(counts.is_empty());

    assert_eq!(
        driver
            .state("count", &"apple".to_string(), Utf8, Json)
            .unwrap(),
        Some(3u64)
    );
    assert_eq!(
        driver
            .state("count", &"kiwi".to_string(), Utf8, Json)
            .unwrap(),
        None::<u64>
    );
    let all = driver.states::<String, u64>("count", Utf8, Json).unwrap();
    assert_eq!(
        all.into_iter().collect::<Vec<_>>(),
        [
            ("apple".to_string(), 3),
            ("fig".into(), 1),
            ("pear".into(), 2)
        ]
    );
    assert_eq!(
        driver.raw_state("count", b"pear").unwrap(),
        Some(b"2".to_vec())
    );
    let m = driver.metrics("count").unwrap();
    assert_eq!(
        (m.delivered, m.committed_deliveries, m.committed_emissions),
        (6, 6, 6)
    );
    assert!(matches!(
        driver.state("nope", &"apple".to_string(), Utf8, Json),
        Err::<Option<u64>, _>(Error::Setup(SetupError::UnknownStage(s))) if s == "nope"
    ));
    assert!(matches!(
        driver.output_topic("nope", Utf8, Utf8).err(),
        Some(Error::Setup(SetupError::UnknownTopic { topic })) if topic == "nope"
    ));
}

#[test]
fn a_two_stage_pipeline_feeds_stage_two_from_stage_ones_sink() {
    let driver = TopologyTestDriver::builder(pipeline())
        .partitions("orders", 2)
        .partitions("counts", 2)
        .build()
        .unwrap();
    let orders = driver.input_topic("orders", Utf8, Utf8).unwrap();
    let mut sums = driver.output_topic("sums", Utf8, Utf8).unwrap();
    for key in ["a", "a", "b", "a"] {
        orders.pipe(key.to_string(), "x".to_string()).unwrap();
    }
    // a: counts 1, 2, 3 → sums 1, 3, 6; b: 1 → 1.
    assert_eq!(
        sums.read_key_values(),
        pairs(&[("a", "a=1"), ("a", "a=3"), ("b", "b=1"), ("a", "a=6")])
    );
    let sum_state = driver.states::<String, u64>("sum", Utf8, Json).unwrap();
    assert_eq!(sum_state.get("a"), Some(&6));
    assert_eq!(sum_state.get("b"), Some(&1));
    assert_eq!(driver.metrics("sum").unwrap().delivered, 4);

    // Stage 2's outputs claim what stage 2 delivered: stage 1's outputs, by coordinate.
    let mut counts = driver.output_topic("counts", Utf8, Utf8).unwrap();
    let last_count = counts.read_records().pop().unwrap();
    let mut all = driver.output_topic("sums", Utf8, Utf8).unwrap();
    let last_sum = all.read_records().pop().unwrap();
    let stamp = last_sum.stamp.unwrap();
    assert_eq!(
        stamp.clock.get(&last_count.coordinate.channel),
        Some(last_count.offset)
    );

    // With auto-run off, records pile up and one run takes them as one batch.
    driver.set_auto_run(false);
    orders.pipe("b".to_string(), "x".to_string()).unwrap();
    assert!(sums.is_empty(), "nothing runs before run()");
    driver.run().unwrap();
    assert_eq!(sums.read_values(), ["b=3"]);
}

#[test]
fn a_payment_visible_before_its_order_is_held_until_the_order_is_delivered() {
    let topology = Topology::builder("shop")
        .stage("pay", Forward("out".into()), |s| {
            utf8_stage(s, &["orders", "payments"], &["out"])
        })
        .build()
        .unwrap();
    let driver = TopologyTestDriver::builder(topology).build().unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();

    // The shop's transaction holds the order: it is in the log (the high watermark counts
    // it), not visible.
    let shop = driver.causal_producer("shop");
    shop.begin();
    let order = shop.send("orders", b"o-1", b"order").unwrap();
    assert_eq!(order.coordinate.offset, 0);
    // The payment service saw the order (it was told its coordinate) and pays for it.
    let service = driver.causal_producer("payments");
    service.observe(order.coordinate, None);
    let payment = service.send("payments", b"o-1", b"paid").unwrap();
    assert!(out.is_empty(), "the payment waits for its cause");
    let m = driver.metrics("pay").unwrap();
    assert_eq!((m.fetched, m.delivered, m.blocked_heads), (1, 0, 1));

    shop.commit().unwrap();
    let delivered = out.read_records();
    let values: Vec<&str> = delivered.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(values, ["order", "paid"], "delivered right after its cause");
    let m = driver.metrics("pay").unwrap();
    assert_eq!((m.delivered, m.held, m.blocked_heads), (2, 1, 0));
    // The forwarded payment claims both inputs it was delivered after.
    let stamp = delivered[1].stamp.clone().unwrap();
    assert_eq!(stamp.clock.get(&order.coordinate.channel), Some(0));
    assert_eq!(stamp.clock.get(&payment.coordinate.channel), Some(0));

    // Without the open transaction nothing holds a record back.
    let a = service.send("payments", b"o-2", b"paid again").unwrap();
    assert_eq!(a.coordinate.offset, 1);
    assert_eq!(out.read_values(), ["paid again"]);
}

#[test]
fn records_of_one_batch_wait_for_causes_offered_after_them() {
    let topology = Topology::builder("shop")
        .stage("pay", Forward("out".into()), |s| {
            utf8_stage(s, &["orders", "payments"], &["out"])
        })
        .build()
        .unwrap();
    let driver = TopologyTestDriver::builder(topology)
        .auto_run(false)
        .build()
        .unwrap();
    let orders_id = driver.topic("orders").unwrap().id;
    let claims_order = Stamp::new(
        None,
        [parsley_clock::Channel::new(orders_id, 0).at(0)]
            .into_iter()
            .collect::<Clock>(),
    );
    // Appended first, so offered first in the batch; its cause is in the same batch.
    driver
        .pipe_raw(
            "payments",
            RawInput::new(Some(b"o-1"), Some(b"paid")).stamp(claims_order.clone()),
        )
        .unwrap();
    driver
        .pipe_raw("orders", RawInput::new(Some(b"o-1"), Some(b"order")))
        .unwrap();
    driver.run().unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    assert_eq!(out.read_values(), ["order", "paid"]);
    assert_eq!(driver.metrics("pay").unwrap().held, 1);

    // A claim on a record the log does not hold, not even in an open transaction, is one no
    // truthful sender makes: an impossible stamp, which stops the stage by default.
    let claims_nothing = Stamp::new(
        None,
        [parsley_clock::Channel::new(orders_id, 0).at(5)]
            .into_iter()
            .collect::<Clock>(),
    );
    driver
        .pipe_raw(
            "payments",
            RawInput::new(Some(b"o-2"), Some(b"paid")).stamp(claims_nothing),
        )
        .unwrap();
    let err = driver.run().unwrap_err();
    assert!(
        matches!(err.stage_error(), Error::Record(RecordError::ImpossibleStamp { stage, topic, stamp })
            if stage == "pay" && topic == "payments" && stamp.record.offset == 1
                && stamp.claim.offset == 5),
        "{err}"
    );
}

#[test]
fn internal_topics_take_the_largest_partition_count_of_the_topics_they_follow() {
    /// Re-keys each record by its value.
    struct Rekey;
    impl Handler for Rekey {
        type Key = String;
        type Value = String;
        type Output = String;
        type State = ();
        fn handle(
            &self,
            r: Record<'_, String, String>,
            _: Option<()>,
        ) -> HandlerResult<String, String, ()> {
            Ok(Step::none().emit("shop-rekey-repartition", r.value.clone(), r.key))
        }
    }
    let topology = Topology::builder("shop")
        .stage("rekey", Rekey, |s| {
            utf8_stage(s, &["orders"], &["shop-rekey-repartition"])
        })
        .stage("count", CountKeys::new("counts"), |s| {
            utf8_stage(s, &["shop-rekey-repartition"], &["counts"])
        })
        .internal_topic(InternalTopic::new(
            "shop-rekey-repartition",
            ["orders".to_string(), "returns".to_string()],
        ))
        .build()
        .unwrap();
    let driver = TopologyTestDriver::builder(topology.clone())
        .partitions("orders", 3)
        .partitions("returns", 5)
        .build()
        .unwrap();
    assert_eq!(
        driver.topic("shop-rekey-repartition").unwrap().partitions,
        5
    );
    // The second stage's tasks follow it: five, and five changelog partitions.
    assert_eq!(driver.task_metrics("count").unwrap().len(), 5);
    let orders = driver.input_topic("orders", Utf8, Utf8).unwrap();
    for (customer, product) in [("c1", "apple"), ("c2", "apple"), ("c3", "pear")] {
        orders.pipe(customer.into(), product.into()).unwrap();
    }
    let mut counts = driver.output_topic("counts", Utf8, Utf8).unwrap();
    assert_eq!(
        counts
            .read_key_values_to_map()
            .into_iter()
            .collect::<Vec<_>>(),
        pairs(&[("apple", "apple=2"), ("pear", "pear=1")])
    );
    let mut repartitioned = driver
        .output_topic("shop-rekey-repartition", Utf8, Utf8)
        .unwrap();
    for r in repartitioned.read_records() {
        assert_eq!(r.partition, partition_for(r.key.as_bytes(), 5));
    }

    let err = TopologyTestDriver::builder(topology)
        .partitions("orders", 3)
        .partitions("shop-rekey-repartition", 2)
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, Error::Setup(SetupError::InternalTopicPartitions { topic, partitions: 2, expected: 3 })
            if topic == "shop-rekey-repartition"),
        "{err}"
    );
}

#[test]
fn sources_that_are_not_co_partitioned_are_refused_as_the_runtime_refuses_them() {
    let topology = Topology::builder("shop")
        .stage("pay", Forward("out".into()), |s| {
            utf8_stage(s, &["orders", "payments"], &["out"])
        })
        .build()
        .unwrap();
    let err = TopologyTestDriver::builder(topology)
        .partitions("orders", 2)
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, Error::Setup(SetupError::NotCoPartitioned { stage, partitions })
            if stage == "pay"
                && *partitions == [("orders".to_string(), 2), ("payments".to_string(), 1)]),
        "{err}"
    );
}

#[test]
fn the_same_script_gives_the_same_records_offsets_and_state() {
    let script = || {
        let driver = TopologyTestDriver::builder(pipeline())
            .partitions("orders", 4)
            .partitions("counts", 4)
            .build()
            .unwrap();
        let orders = driver.input_topic("orders", Utf8, Utf8).unwrap();
        for i in 0..40 {
            orders.pipe(format!("k{}", i % 7), "x".into()).unwrap();
        }
        let mut sums = driver.output_topic("sums", Utf8, Utf8).unwrap();
        let records: Vec<(i32, i64, String)> = sums
            .read_records()
            .into_iter()
            .map(|r| (r.partition, r.offset, r.value))
            .collect();
        (records, driver.raw_states("sum").unwrap())
    };
    let (first, state) = script();
    assert_eq!(first.len(), 40);
    assert_eq!(script(), (first, state));
}
