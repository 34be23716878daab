//! Tables re-grouped by a new key (`KTable::group_by`) and aggregated with a subtractor: the
//! values, timestamps and record counts Kafka Streams 4.4 gives (`KTableRepartitionMap`,
//! `KTableAggregate`, `KTableReduce`).

use super::Harness;
use crate::StreamsBuilder;

/// `t` (customer → city) re-grouped by city and counted, as a change stream.
fn customers_per_city() -> Harness {
    let b = StreamsBuilder::new("app");
    b.table::<String, String>("t")
        .group_by(|_customer, city| (city.clone(), ()))
        .named("per-city")
        .count()
        .to_change_stream()
        .to("out");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "re-grouping, then counting");
    assert_eq!(t.stages()[1].sources(), ["app-per-city-repartition"]);
    Harness::new(t)
}

#[test]
fn a_row_that_moves_leaves_its_old_group_before_it_joins_the_new_one() {
    let h = customers_per_city();
    h.pipe_at("t", Some("ann"), Some("paris"), 10).unwrap();
    h.pipe_at("t", Some("bob"), Some("paris"), 20).unwrap();
    // ann moves: paris loses one (at the later of 30 and its aggregate's 20), rome gains one.
    h.pipe_at("t", Some("ann"), Some("rome"), 30).unwrap();
    assert_eq!(
        h.records("out"),
        ["paris=1@10", "paris=2@20", "paris=1@30", "rome=1@30"]
    );
}

#[test]
fn an_update_within_its_group_is_one_record_subtracted_then_added() {
    let h = customers_per_city();
    h.pipe_at("t", Some("ann"), Some("paris"), 10).unwrap();
    h.pipe_at("t", Some("bob"), Some("paris"), 20).unwrap();
    // bob's row is rewritten with the same city, older: one result, the count unchanged, at
    // the aggregate's later timestamp (Kafka Streams emits once since KIP-904).
    h.pipe_at("t", Some("bob"), Some("paris"), 15).unwrap();
    assert_eq!(h.records("out"), ["paris=1@10", "paris=2@20", "paris=2@20"]);
}

#[test]
fn a_deleted_row_is_subtracted_and_an_empty_group_counts_zero() {
    let h = customers_per_city();
    h.pipe_at("t", Some("ann"), Some("paris"), 10).unwrap();
    h.pipe_at("t", Some("ann"), None, 40).unwrap();
    // A tombstone for a row the table does not hold changes nothing.
    h.pipe_at("t", Some("zoe"), None, 41).unwrap();
    assert_eq!(h.records("out"), ["paris=1@10", "paris=0@40"]);
}

#[test]
fn reduce_takes_a_changed_balance_out_of_its_branch_total_and_adds_the_new_one() {
    let b = StreamsBuilder::new("bank");
    b.table::<String, String>("accounts")
        .group_by(|_account, row| {
            let (branch, cents) = row.split_once(':').unwrap();
            (branch.to_string(), cents.parse::<i64>().unwrap())
        })
        .reduce(|total, cents| total + cents, |total, cents| total - cents)
        .to_stream()
        .to("totals");
    let h = Harness::new(b.build().unwrap());
    h.pipe_at("accounts", Some("a1"), Some("north:100"), 1)
        .unwrap();
    h.pipe_at("accounts", Some("a2"), Some("north:50"), 2)
        .unwrap();
    h.pipe_at("accounts", Some("a1"), Some("north:70"), 3)
        .unwrap();
    h.pipe_at("accounts", Some("a2"), Some("south:50"), 4)
        .unwrap();
    assert_eq!(
        h.records("totals"),
        [
            "north=100@1",
            "north=150@2",
            "north=120@3",
            "north=70@4",
            "south=50@4"
        ]
    );
}

#[test]
fn aggregate_starts_each_group_from_the_initializer_and_sees_the_group_key() {
    let b = StreamsBuilder::new("app");
    b.table::<String, String>("t")
        .group_by(|k, v| (v.clone(), k.clone()))
        .aggregate(
            String::new,
            |city, customer, members| format!("{members}+{customer}@{city}"),
            |_city, customer, members| format!("{members}-{customer}"),
        )
        .to_stream()
        .to("out");
    let h = Harness::new(b.build().unwrap());
    h.pipe("t", Some("ann"), Some("paris")).unwrap();
    h.pipe("t", Some("ann"), Some("rome")).unwrap();
    h.pipe("t", Some("ann"), Some("paris")).unwrap();
    assert_eq!(
        h.lines("out"),
        [
            "paris=+ann@paris",
            "paris=+ann@paris-ann",
            "rome=+ann@rome",
            "rome=+ann@rome-ann",
            "paris=+ann@paris-ann+ann@paris",
        ]
    );
}
