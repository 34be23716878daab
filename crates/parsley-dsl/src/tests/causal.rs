//! The causal stream–table join through the topology test driver: a payment whose stamp
//! claims an order version is joined with that version or a later one, never an older one —
//! and the same script without the gate shows the older join it prevents.

use parsley_runtime::GateMode;
use parsley_runtime::driver::TopologyTestDriver;
use parsley_stage::{Topology, Utf8};

use crate::StreamsBuilder;

/// Orders (a table keyed by order id, values `customer:amount`) settled by payments (a stream
/// keyed by order id, values the amount paid).
fn settle() -> Topology {
    let b = StreamsBuilder::new("shop");
    let orders = b.table::<String, String>("orders");
    b.stream::<String, i64>("payments")
        .left_join(&orders, |paid, order| match order {
            Some(o) => format!("{paid} paid against order {o}"),
            None => format!("{paid} paid against no order"),
        })
        .to("settled");
    b.build().unwrap()
}

/// The script: order `o-1` written as `ann:5`, then revised to `ann:7` in a transaction that
/// stays open (the revision is in the log, not yet visible to the join's task); the payments
/// service saw the revision and pays 7, stamped with that claim. Returns what the join wrote
/// before the shop commits, and the shop's producer to commit with.
fn pay_against_a_pending_revision(driver: &TopologyTestDriver) -> Vec<String> {
    let shop = driver.causal_producer("shop");
    shop.send("orders", b"o-1", b"ann:5").unwrap();
    shop.begin();
    let revision = shop.send("orders", b"o-1", b"ann:7").unwrap();
    let payments = driver.causal_producer("payments");
    payments.observe(revision.coordinate, None);
    payments.send("payments", b"o-1", b"7").unwrap();
    driver
        .output_topic("settled", Utf8, Utf8)
        .unwrap()
        .read_values()
}

#[test]
fn a_payment_is_joined_with_the_order_version_it_claims_never_an_older_one() {
    let driver = TopologyTestDriver::builder(settle()).build().unwrap();
    let before = pay_against_a_pending_revision(&driver);
    assert!(before.is_empty(), "held until its order: {before:?}");
    assert_eq!(driver.metrics("orders").unwrap().blocked_heads, 1);

    driver.causal_producer("shop").commit().unwrap();
    let mut settled = driver.output_topic("settled", Utf8, Utf8).unwrap();
    assert_eq!(settled.read_values(), ["7 paid against order ann:7"]);

    // After a restart the table comes back from the changelog: a second payment claiming the
    // same revision joins with it at once.
    driver.restart().unwrap();
    let payments = driver.causal_producer("payments");
    payments.send("payments", b"o-1", b"0").unwrap();
    assert_eq!(settled.read_values(), ["0 paid against order ann:7"]);
}

#[test]
fn without_the_gate_the_same_payment_joins_with_the_older_order_version() {
    let driver = TopologyTestDriver::builder(settle())
        .gate_mode(GateMode::Off)
        .build()
        .unwrap();
    assert_eq!(
        pay_against_a_pending_revision(&driver),
        ["7 paid against order ann:5"]
    );
}
