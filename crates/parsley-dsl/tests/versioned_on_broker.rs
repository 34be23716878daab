//! A versioned table and a stream–table join with a grace period on the real broker: orders
//! (2 partitions) priced as of their own timestamps from a versioned table of prices (2
//! partitions, co-partitioned), an out-of-order price included. Records held by the grace
//! buffer across a clean stop are released after the restart, from the task state in the
//! changelog, and every order is priced exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use parsley_dsl::{Consumed, Joined, StreamsBuilder};
use parsley_runtime::{Running, Runtime, RuntimeConfig};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, raw_producer, read_committed, unique_topic, wait_committed,
};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Products.
const PRODUCTS: usize = 6;

/// Starts the pipeline; returns it and the name of its one stage.
fn start(app: &str, prices: &str, orders: &str, out: &str) -> (Running, String) {
    let builder = StreamsBuilder::new(app);
    let table = builder.table_with::<String, String>(
        prices,
        Consumed::default().versioned(Duration::from_secs(60)),
    );
    builder
        .stream::<String, String>(orders)
        .join_with(
            &table,
            |order, price| format!("{order} at {price}"),
            Joined::with_grace_period(Duration::from_millis(100)),
        )
        .to(out);
    let topology = builder.build().unwrap();
    let stage = topology.stages()[0].name().to_string();
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    (running, stage)
}

/// Writes `value` under `key` at timestamp `ts` to partition of `topic` murmur2 picks.
fn send(p: &BaseProducer, topic: &str, partitions: i32, key: &str, value: &str, ts: i64) {
    let partition = parsley_runtime::partition_for(key.as_bytes(), partitions);
    p.send(
        BaseRecord::to(topic)
            .key(key)
            .payload(value)
            .partition(partition)
            .timestamp(ts),
    )
    .map_err(|(e, _)| e)
    .unwrap();
}

#[test]
fn orders_are_priced_as_of_their_time_and_held_records_survive_a_restart() {
    let prices = create_topic("dsl-versioned-prices", 2);
    let orders = create_topic("dsl-versioned-orders", 2);
    let out = create_topic("dsl-versioned-priced", 2);
    let app = unique_topic("dsl-versioned");
    let plain = raw_producer(None);
    let products: Vec<String> = (0..PRODUCTS).map(|p| format!("p-{p}")).collect();

    let (running, stage) = start(&app, &prices.name, &orders.name, &out.name);
    // Prices first, each product's 1.5 written after its 2: out of order, into the history.
    for (version, ts) in [("1", 1_000), ("2", 2_000), ("1.5", 1_500)] {
        for p in &products {
            send(
                &plain,
                &prices.name,
                prices.partitions,
                p,
                &format!("{p}v{version}"),
                ts,
            );
        }
    }
    plain.flush(DEADLINE).unwrap();
    wait_committed(&running, &stage, 3 * PRODUCTS as u64);
    // Orders at 1,200, 1,700 and 2,500: the last one of each task releases the first two
    // (grace 100 ms) and stays held.
    for ts in [1_200, 1_700, 2_500] {
        for p in &products {
            send(
                &plain,
                &orders.name,
                orders.partitions,
                p,
                &format!("{p}@{ts}"),
                ts,
            );
        }
    }
    plain.flush(DEADLINE).unwrap();
    wait_committed(&running, &stage, 6 * PRODUCTS as u64);
    running.stop().unwrap();
    assert_eq!(
        read_committed(&out).len(),
        2 * PRODUCTS,
        "the orders at 2,500 are held"
    );

    // Restarted: a new price at 2,550 (after the held orders' time), then orders at 3,000
    // release those held across the restart — priced as of 2,500 — and are held in turn
    // until orders at 4,000 release them.
    let (running, stage) = start(&app, &prices.name, &orders.name, &out.name);
    for p in &products {
        send(
            &plain,
            &prices.name,
            prices.partitions,
            p,
            &format!("{p}v3"),
            2_550,
        );
    }
    plain.flush(DEADLINE).unwrap();
    wait_committed(&running, &stage, PRODUCTS as u64);
    for ts in [3_000, 4_000] {
        for p in &products {
            send(
                &plain,
                &orders.name,
                orders.partitions,
                p,
                &format!("{p}@{ts}"),
                ts,
            );
        }
    }
    plain.flush(DEADLINE).unwrap();
    wait_committed(&running, &stage, 3 * PRODUCTS as u64);
    running.stop().unwrap();

    let mut priced: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for r in read_committed(&out) {
        priced
            .entry(String::from_utf8(r.key.unwrap()).unwrap())
            .or_default()
            .push((
                String::from_utf8(r.value.unwrap()).unwrap(),
                r.timestamp.unwrap(),
            ));
    }
    assert_eq!(priced.len(), PRODUCTS);
    for (p, got) in &priced {
        let want: Vec<(String, i64)> = [(1_200, "1"), (1_700, "1.5"), (2_500, "2"), (3_000, "3")]
            .into_iter()
            .map(|(ts, v)| (format!("{p}@{ts} at {p}v{v}"), ts))
            .collect();
        assert_eq!(got, &want, "{p}: as of each order's time, exactly once");
    }
}
