//! Tables: sources with tombstones, derived tables, stream–table and table–table joins.

use serde::{Deserialize, Serialize};

use super::Harness;
use crate::{StreamsBuilder, read_slot};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    customer: String,
    amount: i64,
}

#[test]
fn a_stream_table_join_reads_the_latest_value_and_a_tombstone_deletes_it() {
    let b = StreamsBuilder::new("shop");
    let orders = b.table::<String, Order>("orders");
    let payments = b.stream::<String, i64>("payments");
    payments
        .join(&orders, |paid, o| {
            format!("{} paid {paid} of {}", o.customer, o.amount)
        })
        .to("settled");
    payments
        .left_join(&orders, |paid, o| match o {
            Some(o) => format!("{} paid {paid}", o.customer),
            None => format!("nobody paid {paid}"),
        })
        .to("all");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1);
    assert_eq!(t.stages()[0].sources(), ["orders", "payments"]);
    let h = Harness::new(t);
    h.pipe("payments", Some("o1"), Some("5")).unwrap();
    h.pipe(
        "orders",
        Some("o1"),
        Some(r#"{"customer":"ann","amount":5}"#),
    )
    .unwrap();
    h.pipe("payments", Some("o1"), Some("5")).unwrap();
    h.pipe(
        "orders",
        Some("o1"),
        Some(r#"{"customer":"bob","amount":7}"#),
    )
    .unwrap();
    h.pipe("payments", Some("o1"), Some("7")).unwrap();
    h.pipe("orders", Some("o1"), None).unwrap();
    h.pipe("payments", Some("o1"), Some("1")).unwrap();
    assert_eq!(
        h.lines("settled"),
        ["o1=ann paid 5 of 5", "o1=bob paid 7 of 7"]
    );
    assert_eq!(
        h.lines("all"),
        [
            "o1=nobody paid 5",
            "o1=ann paid 5",
            "o1=bob paid 7",
            "o1=nobody paid 1"
        ]
    );
    // The tombstone emptied every slot of the key: its state is deleted.
    assert_eq!(h.state("orders", "o1"), None);
}

#[test]
fn a_rekeyed_stream_is_repartitioned_co_partitioned_with_the_table_it_joins() {
    let b = StreamsBuilder::new("shop");
    let customers = b.table::<String, String>("customers");
    b.stream::<String, Order>("orders")
        .select_key(|_, o| o.customer.clone())
        .named("with-name")
        .join(&customers, |o, name| format!("{name}: {}", o.amount))
        .to("named-orders");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    let rep = &t.internal_topics()[0];
    assert_eq!(rep.name, "shop-with-name-input-repartition");
    assert_eq!(rep.partitions_of, ["customers"]);
    let h = Harness::new(t);
    h.pipe("customers", Some("c1"), Some("Ann")).unwrap();
    h.pipe(
        "orders",
        Some("o1"),
        Some(r#"{"customer":"c1","amount":3}"#),
    )
    .unwrap();
    h.pipe(
        "orders",
        Some("o2"),
        Some(r#"{"customer":"c2","amount":4}"#),
    )
    .unwrap();
    assert_eq!(h.lines("named-orders"), ["c1=Ann: 3"]);
}

#[test]
fn derived_tables_forward_changes_and_deletions() {
    let b = StreamsBuilder::new("app");
    let t = b.table::<String, i64>("in");
    t.filter(|_, v| *v >= 10).to_change_stream().to("big");
    t.map_values(|v| v * 2).to_stream().to("doubled");
    t.named("negated")
        .filter_not(|_, v| *v >= 0)
        .to_stream()
        .to("negative");
    let h = Harness::new(b.build().unwrap());
    for (k, v) in [
        ("a", Some("12")),
        ("a", Some("3")),
        ("b", Some("-1")),
        ("a", None),
        ("b", None),
    ] {
        h.pipe("in", Some(k), v).unwrap();
    }
    // Leaving the filter is a deletion downstream: a tombstone when written.
    assert_eq!(h.lines("big"), ["a=12", "a=-"]);
    assert_eq!(h.lines("doubled"), ["a=24", "a=6", "b=-2"]);
    assert_eq!(h.lines("negative"), ["b=-1"]);
}

#[test]
fn table_table_joins_emit_the_join_of_both_sides_latest_values() {
    let b = StreamsBuilder::new("app");
    let left = b.table::<String, i64>("left");
    let right = b.table::<String, String>("right");
    left.join(&right, |l, r| format!("{l}{r}"))
        .to_change_stream()
        .to("inner");
    left.left_join(&right, |l, r| {
        format!("{l}{}", r.map_or("?", String::as_str))
    })
    .to_change_stream()
    .to("left-join");
    left.named("outer")
        .outer_join(&right, |l, r| {
            format!(
                "{}{}",
                l.map_or("?".into(), i64::to_string),
                r.map_or("?", String::as_str)
            )
        })
        .to_change_stream()
        .to("outer");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1);
    let h = Harness::new(t);
    h.pipe("left", Some("k"), Some("1")).unwrap();
    h.pipe("right", Some("k"), Some("a")).unwrap();
    h.pipe("left", Some("k"), Some("2")).unwrap();
    h.pipe("right", Some("j"), Some("b")).unwrap();
    h.pipe("left", Some("k"), None).unwrap();
    h.pipe("right", Some("k"), None).unwrap();
    assert_eq!(h.lines("inner"), ["k=1a", "k=2a", "k=-"]);
    assert_eq!(h.lines("left-join"), ["k=1?", "k=1a", "k=2a", "k=-"]);
    assert_eq!(
        h.lines("outer"),
        ["k=1?", "k=1a", "k=2a", "j=?b", "k=?a", "k=-"]
    );
    // Once both sides of a key are gone, its join slots are gone too. A side is kept with
    // the timestamp of its update (the driver's time, 0).
    let j = h.state("left", "j").unwrap();
    assert_eq!(
        read_slot::<(Option<(i64, i64)>, Option<(String, i64)>)>(&j, "outer").unwrap(),
        Some((None, Some(("b".into(), 0))))
    );
    assert_eq!(h.state("left", "k"), None);
}

#[test]
fn to_table_keeps_the_latest_value_per_key_and_a_none_deletes_it() {
    let b = StreamsBuilder::new("app");
    b.on_bad_record(parsley_stage::BadRecordPolicy::Skip);
    let latest = b.stream::<String, Option<i64>>("in").to_table();
    latest.to_change_stream().to("changes");
    latest.map_values(|v| v * 10).to_stream().to("tenfold");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1, "{}", t.describe());
    let h = Harness::new(t);
    for (k, v, ts) in [
        (Some("a"), Some("1"), 5),
        (Some("b"), Some("2"), 6),
        (Some("a"), Some("3"), 4), // older, still the latest read: an upsert
        (Some("a"), None, 8),
        (Some("a"), None, 9), // a deletion of a key the table does not hold: nothing
        (Some("c"), None, 10), // nor of a key it never held
        (None, Some("7"), 11), // no key: a bad record, skipped
        (Some("b"), Some("2"), 12),
    ] {
        h.pipe_at("in", k, v, ts).unwrap();
    }
    assert_eq!(
        h.records("changes"),
        ["a=1@5", "b=2@6", "a=3@4", "a=-@8", "b=2@12"]
    );
    assert_eq!(
        h.records("tenfold"),
        ["a=10@5", "b=20@6", "a=30@4", "b=20@12"]
    );
    // The deletion emptied the key's row: its state is gone; b's row is kept.
    assert_eq!(h.state("in", "a"), None);
    let row = h.state("in", "b").unwrap();
    assert_eq!(read_slot::<i64>(&row, "to-table-0001").unwrap(), Some(2));
}

#[test]
fn to_table_after_a_key_change_is_repartitioned_and_joins_as_a_source_table_does() {
    let b = StreamsBuilder::new("shop");
    let prices = b
        .stream::<String, Option<String>>("price-lines")
        .select_key(|_, line| {
            line.as_deref()
                .and_then(|l| l.split(':').next())
                .unwrap_or("")
                .to_string()
        })
        .map_values(|line| {
            line.and_then(|l| l.split(':').nth(1).and_then(|p| p.parse::<i64>().ok()))
        })
        .named("latest-price")
        .to_table();
    b.stream::<String, i64>("orders")
        .join(&prices, |quantity, price| quantity * price)
        .to("order-values");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    assert_eq!(t.internal_topics()[0].name, "shop-latest-price-repartition");
    let h = Harness::new(t);
    h.pipe_at("price-lines", Some("x"), Some("pen:3"), 1)
        .unwrap();
    h.pipe_at("orders", Some("pen"), Some("2"), 2).unwrap();
    h.pipe_at("price-lines", Some("y"), Some("pen:5"), 3)
        .unwrap();
    h.pipe_at("orders", Some("pen"), Some("2"), 4).unwrap();
    // A value that is no price: a deletion of the row.
    h.pipe_at("price-lines", Some("z"), Some("pen:?"), 5)
        .unwrap();
    h.pipe_at("orders", Some("pen"), Some("4"), 6).unwrap();
    assert_eq!(h.records("order-values"), ["pen=6@2", "pen=10@4"]);
}
