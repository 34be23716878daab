//! Windowed stream–stream joins through the topology test driver: pairs within the time
//! difference join at once; a record that joined nothing gives its left or outer result once
//! the watermark proves no partner can come; buffers expire by event time; too-late records
//! are counted.

use std::time::Duration;

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_stage::Utf8;

use crate::{JoinWindows, StreamsBuilder};

fn pipe(driver: &TopologyTestDriver, topic: &str, key: &str, at: i64) {
    driver
        .pipe_raw(
            topic,
            RawInput::new(Some(key.as_bytes()), Some(at.to_string().as_bytes())).timestamp(at),
        )
        .unwrap();
}

#[test]
fn left_and_outer_joins_give_unmatched_results_once_the_watermark_closes_their_window() {
    let b = StreamsBuilder::new("shop");
    let orders = b.stream::<String, i64>("orders");
    let payments = b.stream::<String, i64>("payments");
    let within = JoinWindows::of_time_difference(Duration::from_millis(10));
    orders
        .named("settle")
        .left_join_windowed(&payments, within, |o, p| match p {
            Some(p) => format!("order {o} paid {p}"),
            None => format!("order {o} unpaid"),
        })
        .to("settled");
    orders
        .named("match")
        .outer_join_windowed(&payments, within, |o, p| format!("{o:?}/{p:?}"))
        .to("matched");
    orders
        .named("pairs")
        .join_windowed(&payments, within, |o, p| p - o)
        .to("delays");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1, "{}", t.describe());
    assert!(
        t.describe()
            .to_string()
            .contains("settle: left-join streams within 10 ms, grace 0 ms")
    );
    let driver = TopologyTestDriver::builder(t).build().unwrap();
    let mut settled = driver.output_topic("settled", Utf8, Utf8).unwrap();
    let mut matched = driver.output_topic("matched", Utf8, Utf8).unwrap();
    let mut delays = driver.output_topic("delays", Utf8, Utf8).unwrap();

    pipe(&driver, "orders", "o1", 100);
    pipe(&driver, "payments", "o1", 105); // joins o1's order at once
    pipe(&driver, "orders", "o2", 110);
    pipe(&driver, "payments", "o9", 112); // no order
    pipe(&driver, "orders", "o3", 130); // 11 ms before its payment below: too far apart
    assert_eq!(settled.read_values(), ["order 100 paid 105"]);
    assert_eq!(
        delays.read_key_values(),
        [("o1".to_string(), "5".to_string())]
    );
    assert_eq!(matched.read_values(), ["Some(100)/Some(105)"]);

    // The watermark reaches 141: o2's order (110) and o9's payment (112) expired at 131 and
    // 133 with no partner; o3's order (130) expires at 151.
    pipe(&driver, "payments", "o3", 141);
    assert_eq!(
        settled.read_key_values(),
        [("o2".to_string(), "order 110 unpaid".to_string())]
    );
    assert_eq!(
        matched.read_key_values(),
        [
            ("o2".to_string(), "Some(110)/None".to_string()),
            ("o9".to_string(), "None/Some(112)".to_string()),
        ]
    );
    pipe(&driver, "orders", "o4", 150);
    assert!(
        settled.read_values().is_empty(),
        "o3's order expires at 151"
    );
    assert!(delays.read_values().is_empty());

    // A payment for o2 now is too late for any order in time: counted, not joined.
    pipe(&driver, "payments", "o2", 120);
    assert_eq!(
        driver.metrics("orders").unwrap().too_late,
        3,
        "once per join"
    );
    pipe(&driver, "orders", "o5", 200);
    assert_eq!(
        settled.read_values(),
        ["order 130 unpaid", "order 150 unpaid"]
    );
    // Buffers expire: only o5's order is kept.
    let keys: Vec<Vec<u8>> = driver.raw_states("orders").unwrap().into_keys().collect();
    assert_eq!(keys, [b"o5".to_vec()]);
}

#[test]
fn table_rows_expire_by_event_time_and_a_join_then_no_longer_finds_them() {
    let b = StreamsBuilder::new("shop");
    let orders = b
        .table::<String, String>("orders")
        .expire_after(Duration::from_millis(100));
    orders.to_change_stream().to("order-changes");
    b.stream::<String, i64>("payments")
        .left_join(&orders, |paid, order| match order {
            Some(o) => format!("{paid} against {o}"),
            None => format!("{paid} against nothing"),
        })
        .to("settled");
    let t = b.build().unwrap();
    assert!(t.stages()[0].event_time().is_some());
    let driver = TopologyTestDriver::builder(t).build().unwrap();
    let order = |key: &str, value: &str, at: i64| {
        driver
            .pipe_raw(
                "orders",
                RawInput::new(Some(key.as_bytes()), Some(value.as_bytes())).timestamp(at),
            )
            .unwrap();
    };
    order("o1", "ann", 1000);
    order("o2", "bob", 1000);
    order("o2", "bob again", 1080); // an update keeps o2 until 1180
    pipe(&driver, "payments", "o1", 1050);
    pipe(&driver, "payments", "o1", 1101); // o1 expires at 1100: before this payment
    pipe(&driver, "payments", "o1", 1102);
    pipe(&driver, "payments", "o2", 1103);
    let mut settled = driver.output_topic("settled", Utf8, Utf8).unwrap();
    assert_eq!(
        settled.read_values(),
        [
            "1050 against ann",
            "1101 against nothing", // o1 expired at 1100, before it in event time
            "1102 against nothing",
            "1103 against bob again",
        ]
    );
    let mut changes = driver
        .output_topic("order-changes", Utf8, parsley_stage::Nullable(Utf8))
        .unwrap();
    let deletions: Vec<String> = changes
        .read_key_values()
        .into_iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect();
    assert_eq!(deletions, ["o1"]);
    assert_eq!(
        driver.raw_state("orders", b"o1").unwrap(),
        None,
        "no row, no copy"
    );
}

#[test]
fn expiring_a_table_that_keeps_no_rows_is_refused_at_build() {
    let b = StreamsBuilder::new("shop");
    b.table::<String, String>("orders")
        .filter(|_, v| !v.is_empty())
        .expire_after(Duration::from_secs(1))
        .to_stream()
        .to("out");
    let Err(parsley_stage::Error::InvalidTopology { problems }) = b.build() else {
        panic!("expected an invalid topology")
    };
    assert!(
        problems
            .iter()
            .any(|p| p.contains("only a source table or an aggregation")),
        "{problems:?}"
    );
}
