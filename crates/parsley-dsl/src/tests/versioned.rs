//! Versioned tables and the stream–table join by timestamp, with and without a grace period.

use std::time::Duration;

use super::Harness;
use crate::{Consumed, Joined, StreamsBuilder};

/// `prices` versioned with `retention_ms` of history, `orders` joined with it (inner to
/// `priced`, left to `all`) with `grace_ms` of grace when given.
fn pipeline(retention_ms: u64, grace_ms: Option<u64>) -> Harness {
    let b = StreamsBuilder::new("shop");
    let prices = b.table_with::<String, String>(
        "prices",
        Consumed::default().versioned(Duration::from_millis(retention_ms)),
    );
    prices.to_change_stream().to("price-changes");
    let orders = b.stream::<String, String>("orders");
    let joined = grace_ms.map_or_else(Joined::default, |g| {
        Joined::with_grace_period(Duration::from_millis(g))
    });
    orders
        .join_with(&prices, |o, p| format!("{o} at {p}"), joined.clone())
        .to("priced");
    orders
        .left_join_with(
            &prices,
            |o, p| format!("{o} at {}", p.map_or("none", String::as_str)),
            joined,
        )
        .to("all");
    Harness::new(b.build().unwrap())
}

#[test]
fn a_record_joins_the_version_of_its_own_time_and_an_out_of_order_update_changes_only_history() {
    let h = pipeline(100, None);
    h.pipe_at("prices", Some("tea"), Some("10"), 10).unwrap();
    h.pipe_at("prices", Some("tea"), Some("20"), 20).unwrap();
    // Out of order: it goes into the history between the two, and the table's value stays 20.
    h.pipe_at("prices", Some("tea"), Some("15"), 15).unwrap();
    for ts in [9, 12, 15, 17, 25] {
        h.pipe_at("orders", Some("tea"), Some(&format!("o{ts}")), ts)
            .unwrap();
    }
    assert_eq!(
        h.lines("priced"),
        [
            "tea=o12 at 10",
            "tea=o15 at 15",
            "tea=o17 at 15",
            "tea=o25 at 20"
        ]
    );
    assert_eq!(h.lines("all")[0], "tea=o9 at none");
    assert_eq!(
        h.records("price-changes"),
        ["tea=10@10", "tea=20@20"],
        "the out-of-order update forwards nothing"
    );
}

#[test]
fn history_beyond_the_retention_is_gone_and_an_update_that_old_is_dropped() {
    let h = pipeline(100, None);
    h.pipe_at("prices", Some("tea"), Some("10"), 10).unwrap();
    h.pipe_at("prices", Some("tea"), Some("300"), 300).unwrap();
    // Observed stream time 300, retention 100: 150 is before the horizon (200).
    h.pipe_at("prices", Some("tea"), Some("150"), 150).unwrap();
    h.pipe_at("orders", Some("tea"), Some("old"), 150).unwrap();
    h.pipe_at("orders", Some("tea"), Some("late"), 250).unwrap();
    h.pipe_at("orders", Some("tea"), Some("now"), 300).unwrap();
    // 250 is within the retention: the version of 10 was valid until 300.
    assert_eq!(h.lines("priced"), ["tea=late at 10", "tea=now at 300"]);
    assert_eq!(
        h.lines("all"),
        ["tea=old at none", "tea=late at 10", "tea=now at 300"]
    );
    assert_eq!(h.records("price-changes"), ["tea=10@10", "tea=300@300"]);
    // A deletion is a version too: as of its time and later there is no value.
    h.pipe_at("prices", Some("tea"), None, 320).unwrap();
    h.pipe_at("orders", Some("tea"), Some("gone"), 330).unwrap();
    h.pipe_at("orders", Some("tea"), Some("before"), 310)
        .unwrap();
    assert_eq!(h.lines("priced")[2..], ["tea=before at 300"]);
}

#[test]
fn a_grace_period_holds_records_until_later_ones_pass_them_then_joins_as_of_their_time() {
    let h = pipeline(1_000, Some(10));
    h.pipe_at("prices", Some("tea"), Some("a"), 0).unwrap();
    h.pipe_at("prices", Some("milk"), Some("m"), 0).unwrap();
    h.pipe_at("orders", Some("tea"), Some("t5"), 5).unwrap();
    h.pipe_at("orders", Some("milk"), Some("m5"), 5).unwrap();
    // Arrives after the orders, out of order by less than the grace: they see it.
    h.pipe_at("prices", Some("tea"), Some("b"), 4).unwrap();
    assert!(h.lines("priced").is_empty(), "held until 15 is observed");
    h.pipe_at("orders", Some("milk"), Some("m15"), 15).unwrap();
    // Released in (time, key bytes) order, milk before tea; m15 itself stays held until 25.
    assert_eq!(h.records("priced"), ["milk=m5 at m@5", "tea=t5 at b@5"]);
    // Further behind than the grace: joined at once.
    h.pipe_at("orders", Some("tea"), Some("t2"), 2).unwrap();
    assert_eq!(h.records("priced")[2], "tea=t2 at a@2");
    // The buffer and the observed times are task state: a restart holds and joins the same.
    h.pipe_at("orders", Some("tea"), Some("t20"), 20).unwrap();
    h.driver.restart().unwrap();
    h.pipe_at("prices", Some("tea"), Some("c"), 19).unwrap();
    h.pipe_at("orders", Some("milk"), Some("m40"), 40).unwrap();
    assert_eq!(
        h.records("priced")[3..],
        ["milk=m15 at m@15", "tea=t20 at c@20"]
    );
    assert_eq!(h.records("all"), h.records("priced"));
}

#[test]
fn a_stateful_operator_after_a_grace_join_reads_it_through_a_repartition() {
    let b = StreamsBuilder::new("shop");
    let prices = b.table_with::<String, i64>(
        "prices",
        Consumed::default().versioned(Duration::from_secs(60)),
    );
    b.stream::<String, i64>("orders")
        .join_with(
            &prices,
            |q, p| q * p,
            Joined::with_grace_period(Duration::from_secs(1)),
        )
        .group_by_key()
        .count()
        .to_stream()
        .to("counts");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    let described = t.describe().to_string();
    assert!(
        described.contains("versioned table prices (60000 ms of history)"),
        "{described}"
    );
    assert!(described.contains("1000 ms grace"), "{described}");
}

#[test]
fn build_refuses_a_grace_period_without_a_versioned_table_and_versioning_a_stream() {
    let b = StreamsBuilder::new("shop");
    let prices = b.table::<String, i64>("prices");
    b.stream::<String, i64>("orders")
        .join_with(
            &prices,
            |q, p| q * p,
            Joined::with_grace_period(Duration::from_secs(1)),
        )
        .to("values");
    let e = b.build().unwrap_err().to_string();
    assert!(e.contains("a grace period needs a versioned table"), "{e}");

    let b = StreamsBuilder::new("shop");
    b.stream_with::<String, i64>(
        "orders",
        Consumed::default().versioned(Duration::from_secs(1)),
    )
    .to("out");
    let e = b.build().unwrap_err().to_string();
    assert!(e.contains("Consumed::versioned is for a table"), "{e}");

    let b = StreamsBuilder::new("shop");
    let prices = b.table_with::<String, i64>(
        "prices",
        Consumed::default().versioned(Duration::from_millis(10)),
    );
    b.stream::<String, i64>("orders")
        .join_with(
            &prices,
            |q, p| q * p,
            Joined::with_grace_period(Duration::from_millis(11)),
        )
        .to("values");
    let e = b.build().unwrap_err().to_string();
    assert!(e.contains("longer than the history retention of"), "{e}");

    // Without a grace period, `join_with` on a plain table is the plain join.
    let b = StreamsBuilder::new("shop");
    let prices = b.table::<String, i64>("prices");
    b.stream::<String, i64>("orders")
        .join_with(&prices, |q, p| q * p, Joined::default())
        .to("values");
    let h = Harness::new(b.build().unwrap());
    h.pipe_at("prices", Some("tea"), Some("3"), 50).unwrap();
    h.pipe_at("orders", Some("tea"), Some("2"), 10).unwrap();
    assert_eq!(h.lines("values"), ["tea=6"]);
}
