//! Foreign-key joins (`KTable::join_on_foreign_key`, `left_join_on_foreign_key`): the values,
//! tombstones and timestamps Kafka Streams 4.4 gives when each record is processed to the end
//! before the next, and — stage turn by stage turn — that the result of an order always
//! reflects its current foreign key under any interleaving of the subscription and response
//! paths.
//!
//! Orders `o → "customer:amount"` (`-` for no customer) join customers `c → name`.

use std::collections::BTreeMap;

use parsley_runtime::driver::TopologyTestDriver;
use proptest::prelude::*;

use super::Harness;
use crate::StreamsBuilder;
use parsley_stage::Topology;

/// The customer an order value names, if any.
#[allow(clippy::ptr_arg)] // the extractor takes `&V`, `V` = `String`
fn customer(order: &String) -> Option<String> {
    let (c, _) = order.split_once(':')?;
    (c != "-").then(|| c.to_string())
}

fn orders_with_names(left: bool) -> Topology {
    let b = StreamsBuilder::new("shop");
    let orders = b.table::<String, String>("orders");
    let customers = b.table::<String, String>("customers");
    let named = orders.named("with-name");
    let joined = if left {
        named.left_join_on_foreign_key(&customers, customer, |order, name| {
            format!("{order}|{}", name.map_or("?", String::as_str))
        })
    } else {
        named.join_on_foreign_key(&customers, customer, |order, name| {
            format!("{order}|{name}")
        })
    };
    joined.to_change_stream().to("out");
    b.build().unwrap()
}

#[test]
fn the_join_compiles_into_two_stages_calling_each_other_through_two_topics() {
    let t = orders_with_names(false);
    let stages: Vec<(&str, &[String], &[String])> = t
        .stages()
        .iter()
        .map(|s| (s.name(), s.sources(), s.sinks()))
        .collect();
    assert_eq!(
        stages,
        [
            (
                "orders",
                &[
                    "orders".to_string(),
                    "shop-with-name-subscription-response".into()
                ][..],
                &[
                    "shop-with-name-subscription-registration".to_string(),
                    "out".into()
                ][..]
            ),
            (
                "customers",
                &[
                    "customers".to_string(),
                    "shop-with-name-subscription-registration".into()
                ][..],
                &["shop-with-name-subscription-response".to_string()][..]
            ),
        ]
    );
    let described = t.describe().to_string();
    assert!(described.contains("(store with-name)"), "{described}");
    assert!(
        described.contains("(store with-name-foreign)"),
        "{described}"
    );
}

#[test]
fn an_order_follows_its_customer_and_leaves_it_when_it_moves() {
    let h = Harness::new(orders_with_names(false));
    h.pipe_at("customers", Some("c1"), Some("Ann"), 1).unwrap();
    h.pipe_at("customers", Some("c2"), Some("Bob"), 2).unwrap();
    // The later of the order's and the customer's timestamps.
    h.pipe_at("orders", Some("o1"), Some("c1:10"), 5).unwrap();
    // A customer's update answers every order subscribed to it, at its own timestamp.
    h.pipe_at("customers", Some("c1"), Some("Annie"), 7)
        .unwrap();
    // Moving: the old customer forgets the order without an answer, the new one answers.
    h.pipe_at("orders", Some("o1"), Some("c2:10"), 8).unwrap();
    h.pipe_at("customers", Some("c1"), Some("Ann2"), 9).unwrap();
    h.pipe_at("orders", Some("o1"), None, 11).unwrap();
    assert_eq!(
        h.records("out"),
        [
            "o1=c1:10|Ann@5",
            "o1=c1:10|Annie@7",
            "o1=c2:10|Bob@8",
            "o1=-@11"
        ]
    );
}

#[test]
fn an_inner_join_answers_a_new_order_only_when_its_customer_exists() {
    let h = Harness::new(orders_with_names(false));
    h.pipe_at("orders", Some("o1"), Some("c9:5"), 1).unwrap();
    assert_eq!(h.records("out"), Vec::<String>::new(), "no customer c9 yet");
    h.pipe_at("customers", Some("c9"), Some("Zed"), 2).unwrap();
    // Moving to a customer that does not exist deletes the result.
    h.pipe_at("orders", Some("o1"), Some("c8:5"), 3).unwrap();
    h.pipe_at("customers", Some("c8"), Some("Eve"), 4).unwrap();
    // The customer's deletion deletes the result; an update to no customer deletes it too.
    h.pipe_at("customers", Some("c8"), None, 6).unwrap();
    h.pipe_at("orders", Some("o1"), Some("c9:6"), 7).unwrap();
    h.pipe_at("orders", Some("o1"), Some("-:6"), 8).unwrap();
    assert_eq!(
        h.records("out"),
        [
            "o1=c9:5|Zed@2",
            "o1=-@3",
            "o1=c8:5|Eve@4",
            "o1=-@6",
            "o1=c9:6|Zed@7",
            "o1=-@8"
        ]
    );
}

#[test]
fn a_left_join_answers_every_order_and_one_without_a_customer_at_once() {
    let h = Harness::new(orders_with_names(true));
    h.pipe_at("orders", Some("o1"), Some("c1:10"), 1).unwrap();
    h.pipe_at("orders", Some("o2"), Some("-:3"), 2).unwrap();
    h.pipe_at("customers", Some("c1"), Some("Ann"), 3).unwrap();
    h.pipe_at("customers", Some("c1"), None, 4).unwrap();
    h.pipe_at("orders", Some("o1"), Some("-:10"), 5).unwrap();
    h.pipe_at("orders", Some("o1"), None, 6).unwrap();
    assert_eq!(
        h.records("out"),
        [
            "o1=c1:10|?@1",
            "o2=-:3|?@2",
            "o1=c1:10|Ann@3",
            "o1=c1:10|?@4",
            "o1=-:10|?@5",
            "o1=-@6"
        ]
    );
}

#[test]
fn a_restart_keeps_the_versions_subscriptions_and_customers() {
    let h = Harness::new(orders_with_names(false));
    h.pipe_at("customers", Some("c1"), Some("Ann"), 1).unwrap();
    h.pipe_at("orders", Some("o1"), Some("c1:10"), 2).unwrap();
    h.driver.restart().unwrap();
    h.pipe_at("customers", Some("c1"), Some("Annie"), 3)
        .unwrap();
    h.pipe_at("orders", Some("o1"), Some("c1:11"), 4).unwrap();
    assert_eq!(
        h.records("out"),
        ["o1=c1:10|Ann@2", "o1=c1:10|Annie@3", "o1=c1:11|Annie@4"]
    );
}

/// A driver that runs only when told, stage by stage.
fn by_turns(left: bool, partitions: i32) -> TopologyTestDriver {
    TopologyTestDriver::builder(orders_with_names(left))
        .partitions("orders", partitions)
        .partitions("customers", partitions)
        .auto_run(false)
        .build()
        .unwrap()
}

fn pipe(d: &TopologyTestDriver, topic: &str, key: &str, value: Option<&str>) {
    d.pipe_raw(
        topic,
        parsley_runtime::driver::RawInput::new(Some(key.as_bytes()), value.map(str::as_bytes)),
    )
    .unwrap();
}

/// `out` as (key, value) pairs, `None` for a tombstone.
fn results(d: &TopologyTestDriver) -> Vec<(String, Option<String>)> {
    let mut out = d
        .output_topic("out", parsley_stage::Bytes, parsley_stage::Bytes)
        .unwrap();
    std::iter::from_fn(|| out.read_raw_record())
        .map(|r| {
            let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
            (text(r.key.unwrap()), r.value.map(text))
        })
        .collect()
}

#[test]
fn an_answer_overtaken_by_a_move_is_dropped_and_a_deletion_gives_one_tombstone() {
    let d = by_turns(false, 1);
    pipe(&d, "customers", "c1", Some("Ann"));
    pipe(&d, "customers", "c2", Some("Bob"));
    pipe(&d, "orders", "o1", Some("c1:10"));
    d.run().unwrap();
    // c1 changes (its answer to o1 is built for o1's first version) while o1 moves to c2 and
    // is then deleted; the customers' stage answers only after the orders' stage took all
    // three order updates.
    pipe(&d, "customers", "c1", Some("Annie"));
    pipe(&d, "orders", "o1", Some("c2:10"));
    pipe(&d, "orders", "o1", None);
    assert!(d.turn("orders").unwrap());
    assert!(d.turn("customers").unwrap());
    d.run().unwrap();
    assert_eq!(
        results(&d),
        [
            ("o1".to_string(), Some("c1:10|Ann".to_string())),
            // Not `c1:10|Annie` (an old version's answer), not `c2:10|Bob` (the moved row's,
            // overtaken by the deletion): one tombstone.
            ("o1".to_string(), None),
        ]
    );
}

/// One step of an adversarial schedule.
#[derive(Debug, Clone)]
enum Step {
    /// An order's new value: its customer (`None`: none) — or its deletion.
    Order(usize, Option<Option<usize>>),
    /// A customer's new name, or its deletion.
    Customer(usize, bool),
    /// One turn of the orders' stage or the customers'.
    Turn(bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0..3usize,
            prop::option::weighted(0.85, prop::option::of(0..3usize))
        )
            .prop_map(|(o, v)| Step::Order(o, v)),
        (0..3usize, prop::bool::weighted(0.8)).prop_map(|(c, v)| Step::Customer(c, v)),
        any::<bool>().prop_map(Step::Turn),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Under any schedule of the two stages: every result joins an order's value with the
    /// customer that value names; an order's results never go back to an older value; and
    /// when everything has run, each order's last result is the join of the final tables.
    #[test]
    fn every_result_reflects_the_current_foreign_key(
        left in any::<bool>(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let d = by_turns(left, 2);
        let mut orders: BTreeMap<String, String> = BTreeMap::new();
        let mut customers: BTreeMap<String, String> = BTreeMap::new();
        for (n, s) in steps.iter().enumerate() {
            match s {
                Step::Order(o, v) => {
                    let key = format!("o{o}");
                    let value = v.map(|c| match c {
                        Some(c) => format!("c{c}:{n}"),
                        None => format!("-:{n}"),
                    });
                    pipe(&d, "orders", &key, value.as_deref());
                    match value {
                        Some(v) => orders.insert(key, v),
                        None => orders.remove(&key),
                    };
                }
                Step::Customer(c, alive) => {
                    let key = format!("c{c}");
                    let value = alive.then(|| format!("c{c}#{n}"));
                    pipe(&d, "customers", &key, value.as_deref());
                    match value {
                        Some(v) => customers.insert(key, v),
                        None => customers.remove(&key),
                    };
                }
                Step::Turn(first) => {
                    d.turn(if *first { "orders" } else { "customers" }).unwrap();
                }
            }
        }
        d.run().unwrap();
        let mut last: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut newest: BTreeMap<String, usize> = BTreeMap::new();
        for (key, value) in results(&d) {
            if let Some(v) = &value {
                let (order, name) = v.split_once('|').unwrap();
                let (c, n) = order.split_once(':').unwrap();
                if name != "?" {
                    prop_assert_eq!(name.split_once('#').unwrap().0, c, "{} joined {}", order, name);
                }
                let n: usize = n.parse().unwrap();
                let before = newest.insert(key.clone(), n).unwrap_or(0);
                prop_assert!(n >= before, "{}: a result of {} after one of {}", key, n, before);
            }
            last.insert(key, value);
        }
        for o in 0..3 {
            let key = format!("o{o}");
            let expected = orders.get(&key).and_then(|v| {
                let name = customer(v).and_then(|c| customers.get(&c).cloned());
                match (left, name) {
                    (_, Some(name)) => Some(format!("{v}|{name}")),
                    (true, None) => Some(format!("{v}|?")),
                    (false, None) => None,
                }
            });
            let got = last.get(&key).cloned().flatten();
            prop_assert_eq!(got, expected, "{}", key);
        }
    }
}
