//! Global tables through the topology test driver: every task reads the whole table whatever
//! its partition count, a stream joins it through a key mapper without a repartition, an order
//! whose stamp claims a row version is joined with that version or a later one, and a task
//! reads the table to its end before its first join.

use parsley_runtime::GateMode;
use parsley_runtime::driver::TopologyTestDriver;
use parsley_stage::{Error, Topology, Utf8};

use crate::StreamsBuilder;

/// Orders (keyed by order id, values `customer:cents`) named by a global table of customers
/// (keyed by customer id, values names), inner or left.
fn name_orders(left: bool) -> Topology {
    let b = StreamsBuilder::new("shop");
    let customers = b.global_table::<String, String>("customers");
    let orders = b.stream::<String, String>("orders");
    let customer_of =
        |_: &String, order: &String| order.split_once(':').map(|(c, _)| c.to_string());
    if left {
        orders
            .left_join_global(&customers, customer_of, |order, name| {
                format!("{order} by {}", name.map_or("nobody", String::as_str))
            })
            .to("named");
    } else {
        orders
            .join_global(&customers, customer_of, |order, name| {
                format!("{order} by {name}")
            })
            .to("named");
    }
    b.build().unwrap()
}

fn driver(topology: Topology, gate: GateMode) -> TopologyTestDriver {
    TopologyTestDriver::builder(topology)
        .partitions("orders", 2)
        .partitions("customers", 3)
        .gate_mode(gate)
        .build()
        .unwrap()
}

fn named(driver: &TopologyTestDriver) -> Vec<(String, String)> {
    let mut out = driver.output_topic("named", Utf8, Utf8).unwrap();
    let mut got = out.read_key_values();
    got.sort();
    got
}

#[test]
fn every_task_reads_the_whole_table_and_joins_through_the_key_mapper() {
    let driver = driver(name_orders(false), GateMode::Causal);
    let (shop, crm) = (
        driver.causal_producer("shop"),
        driver.causal_producer("crm"),
    );
    for (id, name) in [("c-1", "ann"), ("c-2", "bob"), ("c-3", "cy"), ("c-4", "di")] {
        crm.send("customers", id.as_bytes(), name.as_bytes())
            .unwrap();
    }
    // Orders of every customer in both order partitions: each task finds every row.
    for (order, value) in [
        ("o-1", "c-1:5"),
        ("o-2", "c-2:6"),
        ("o-3", "c-3:7"),
        ("o-4", "c-4:8"),
        ("o-5", "c-9:9"),
        ("o-8", "cash"),
    ] {
        shop.send("orders", order.as_bytes(), value.as_bytes())
            .unwrap();
    }
    let got = named(&driver);
    assert_eq!(
        got,
        [
            ("o-1".to_string(), "c-1:5 by ann".to_string()),
            ("o-2".into(), "c-2:6 by bob".into()),
            ("o-3".into(), "c-3:7 by cy".into()),
            ("o-4".into(), "c-4:8 by di".into()),
        ],
        "c-9 has no row and `cash` names no customer: the inner join drops both orders"
    );
    let orders_per_partition: Vec<i64> = (0..2)
        .map(|p| {
            driver
                .task_metrics("orders")
                .unwrap()
                .iter()
                .filter(|t| t.partition == p)
                .count() as i64
        })
        .collect();
    assert_eq!(orders_per_partition, [1, 1], "one task per order partition");

    // A tombstone deletes the row in every task; a new name replaces it.
    driver
        .pipe_raw(
            "customers",
            parsley_runtime::driver::RawInput::new(Some(b"c-1"), None),
        )
        .unwrap();
    crm.send("customers", b"c-2", b"bea").unwrap();
    shop.send("orders", b"o-6", b"c-1:1").unwrap();
    shop.send("orders", b"o-7", b"c-2:2").unwrap();
    let got = named(&driver);
    assert_eq!(got.len(), 5);
    assert!(got.contains(&("o-7".into(), "c-2:2 by bea".into())));
    assert!(!got.iter().any(|(k, _)| k == "o-6"), "{got:?}");
}

#[test]
fn a_left_join_gives_every_order_once() {
    let driver = driver(name_orders(true), GateMode::Causal);
    let crm = driver.causal_producer("crm");
    crm.send("customers", b"c-1", b"ann").unwrap();
    let shop = driver.causal_producer("shop");
    shop.send("orders", b"o-1", b"c-1:5").unwrap();
    shop.send("orders", b"o-2", b"c-2:6").unwrap();
    // The mapper gives no key: joined with no row, as Kafka Streams' left join (KIP-962).
    shop.send("orders", b"o-3", b"cash").unwrap();
    assert_eq!(
        named(&driver),
        [
            ("o-1".to_string(), "c-1:5 by ann".to_string()),
            ("o-2".into(), "c-2:6 by nobody".into()),
            ("o-3".into(), "cash by nobody".into())
        ]
    );
}

/// The customer `c-1` renamed in a transaction that stays open; the shop saw the rename and
/// writes an order stamped with that claim. Returns what the join wrote before the CRM
/// commits.
fn order_after_a_pending_rename(driver: &TopologyTestDriver) -> Vec<String> {
    let crm = driver.causal_producer("crm");
    crm.send("customers", b"c-1", b"ann").unwrap();
    crm.begin();
    let rename = crm.send("customers", b"c-1", b"anna").unwrap();
    let shop = driver.causal_producer("shop");
    shop.observe(rename.coordinate, None);
    shop.send("orders", b"o-1", b"c-1:5").unwrap();
    driver
        .output_topic("named", Utf8, Utf8)
        .unwrap()
        .read_values()
}

#[test]
fn an_order_is_joined_with_the_row_version_it_claims_never_an_older_one() {
    let driver = driver(name_orders(true), GateMode::Causal);
    let before = order_after_a_pending_rename(&driver);
    assert!(before.is_empty(), "held until its row: {before:?}");
    assert_eq!(driver.metrics("orders").unwrap().blocked_heads, 1);
    driver.causal_producer("crm").commit().unwrap();
    assert_eq!(named(&driver), [("o-1".into(), "c-1:5 by anna".into())]);

    // Restarted, each task resumes the table from its changelog and its own positions.
    driver.restart().unwrap();
    driver
        .causal_producer("shop")
        .send("orders", b"o-2", b"c-1:1")
        .unwrap();
    assert_eq!(
        named(&driver),
        [
            ("o-1".into(), "c-1:5 by anna".into()),
            ("o-2".into(), "c-1:1 by anna".into())
        ]
    );
}

#[test]
fn without_the_gate_the_same_order_is_joined_with_the_older_row() {
    let driver = driver(name_orders(true), GateMode::Off);
    assert_eq!(order_after_a_pending_rename(&driver), ["c-1:5 by ann"]);
}

#[test]
fn a_task_reads_the_table_to_its_end_before_its_first_join() {
    let driver = TopologyTestDriver::builder(name_orders(true))
        .partitions("customers", 3)
        .auto_run(false)
        .build()
        .unwrap();
    // The order is written before the row, with an earlier timestamp, by writers that know
    // nothing of each other: fetched together, the gate would deliver the order first.
    driver
        .pipe_raw("orders", raw(b"o-1", b"c-1:5").timestamp(1_000))
        .unwrap();
    driver
        .pipe_raw("customers", raw(b"c-1", b"ann").timestamp(2_000))
        .unwrap();
    // A task starting now finds the row below the table's end: it joins with it.
    driver.restart().unwrap();
    driver.run().unwrap();
    assert_eq!(named(&driver), [("o-1".into(), "c-1:5 by ann".into())]);
}

fn raw(key: &'static [u8], value: &'static [u8]) -> parsley_runtime::driver::RawInput {
    parsley_runtime::driver::RawInput::new(Some(key), Some(value))
}

#[test]
fn two_stages_that_join_one_global_table_each_read_it_whole() {
    let b = StreamsBuilder::new("shop");
    let customers = b.global_table::<String, String>("customers");
    let name = |_: &String, v: &String| v.split_once(':').map(|(c, _)| c.to_string());
    b.stream::<String, String>("orders")
        .join_global(&customers, name, |v, n| format!("{v}/{n}"))
        .select_key(|_, v| v.clone())
        .group_by_key()
        .count()
        .to_stream()
        .map_values(|n| n.to_string())
        .to("counts");
    b.stream::<String, String>("returns")
        .join_global(&customers, name, |v, n| format!("{v} returned by {n}"))
        .to("named");
    let topology = b.build().unwrap();
    let text = topology.describe().to_string();
    assert_eq!(
        text.matches("customers (global: every partition)").count(),
        2,
        "{text}"
    );
    let driver = TopologyTestDriver::builder(topology)
        .partitions("customers", 2)
        .build()
        .unwrap();
    driver.pipe_raw("customers", raw(b"c-1", b"ann")).unwrap();
    driver.pipe_raw("orders", raw(b"o-1", b"c-1:5")).unwrap();
    driver.pipe_raw("returns", raw(b"o-1", b"c-1:5")).unwrap();
    assert_eq!(
        named(&driver),
        [("o-1".into(), "c-1:5 returned by ann".into())]
    );
    let counts = driver
        .output_topic("counts", Utf8, Utf8)
        .unwrap()
        .read_key_values();
    assert_eq!(counts, [("c-1:5/ann".to_string(), "1".to_string())]);
}

#[test]
fn build_refuses_a_global_table_nobody_joins_and_one_in_a_windowed_stage() {
    let b = StreamsBuilder::new("shop");
    b.global_table::<String, String>("customers");
    b.stream::<String, String>("orders").to("copy");
    let Err(Error::InvalidTopology { problems }) = b.build() else {
        panic!("a global table nobody joins is refused");
    };
    assert!(
        problems
            .iter()
            .any(|p| p
                .contains("global table \"global-table-0000\" (customers) is joined by no stream")),
        "{problems:?}"
    );

    let b = StreamsBuilder::new("shop");
    let customers = b.global_table::<String, String>("customers");
    b.stream::<String, String>("orders")
        .join_global(&customers, |_, v| Some(v.clone()), |v, n| format!("{v}{n}"))
        .group_by_key()
        .windowed_by(crate::TimeWindows::of_size(std::time::Duration::from_secs(
            1,
        )))
        .count()
        .to_stream()
        .map(|w, n| (w.key.clone(), n.to_string()))
        .to("counts");
    let Err(Error::InvalidTopology { problems }) = b.build() else {
        panic!("a global table in a windowed stage is refused");
    };
    assert!(
        problems
            .iter()
            .any(|p| p.contains("orders by event time and reads the global source \"customers\"")),
        "{problems:?}"
    );
}

#[test]
fn describe_shows_the_global_table_in_the_stage_that_joins_it() {
    let text = name_orders(false).describe().to_string();
    assert!(
        text.contains("customers (global: every partition)"),
        "{text}"
    );
    assert!(
        text.contains(
            "global-table-0000: global table customers (store global-table-0000) --> join-0002"
        ),
        "{text}"
    );
}
