//! `KTable::suppress(Suppressed::until_time_limit(..))`: each key's updates held until the
//! stage's watermark is the limit past the first of them, then the latest emitted once, as a
//! change from the value before, with the latest update's timestamp.

use std::time::Duration;

use super::Harness;
use crate::{StreamsBuilder, Suppressed};

/// `stock` (item → level) suppressed for `limit` ms, as a change stream.
fn stock(limit: u64) -> Harness {
    let b = StreamsBuilder::new("app");
    b.table::<String, String>("stock")
        .suppress(Suppressed::until_time_limit(Duration::from_millis(limit)))
        .to_change_stream()
        .to("out");
    Harness::new(b.build().unwrap())
}

#[test]
fn updates_within_the_limit_are_emitted_once_as_the_latest() {
    let h = stock(10);
    h.pipe_at("stock", Some("a"), Some("1"), 0).unwrap();
    h.pipe_at("stock", Some("a"), Some("2"), 4).unwrap();
    h.pipe_at("stock", Some("b"), Some("7"), 5).unwrap();
    h.pipe_at("stock", Some("a"), Some("3"), 9).unwrap();
    assert_eq!(h.records("out"), Vec::<String>::new(), "nothing before 10");
    // Event time reaches 12: a's buffer (opened at 0) is due, b's (opened at 5) is not.
    h.pipe_at("stock", Some("c"), Some("0"), 12).unwrap();
    assert_eq!(h.records("out"), ["a=3@9"]);
    h.pipe_at("stock", Some("c"), Some("1"), 15).unwrap();
    assert_eq!(h.records("out"), ["a=3@9", "b=7@5"]);
}

#[test]
fn a_deletion_is_buffered_like_an_update() {
    let h = stock(10);
    h.pipe_at("stock", Some("a"), Some("1"), 0).unwrap();
    h.pipe_at("stock", Some("z"), Some("0"), 10).unwrap();
    h.pipe_at("stock", Some("a"), None, 11).unwrap();
    h.pipe_at("stock", Some("z"), Some("1"), 30).unwrap();
    assert_eq!(h.records("out"), ["a=1@0", "z=0@10", "a=-@11"]);
}

#[test]
fn a_record_at_the_limit_updates_the_buffer_it_closes() {
    let h = stock(10);
    h.pipe_at("stock", Some("a"), Some("1"), 0).unwrap();
    // The watermark passes 10 only once the record at 10 is handed over: one result, as in
    // Kafka Streams, which buffers the record, then evicts.
    h.pipe_at("stock", Some("a"), Some("2"), 10).unwrap();
    h.pipe_at("stock", Some("z"), Some("0"), 25).unwrap();
    assert_eq!(h.records("out"), ["a=2@10"]);
}

#[test]
fn buffers_due_together_are_emitted_in_key_order() {
    let h = stock(1);
    h.pipe_at("stock", Some("c"), Some("0"), 0).unwrap();
    h.pipe_at("stock", Some("a"), Some("x"), 0).unwrap();
    // The record at 1 updates c's buffer, due at 1 as a's is: Kafka Streams evicts both after
    // it, by buffer time, then key.
    h.pipe_at("stock", Some("c"), Some("1"), 1).unwrap();
    assert_eq!(h.records("out"), ["a=x@0", "c=1@1"]);
    // Limit 0: a record is emitted after it is handed over, an out-of-order one at once.
    let h = stock(0);
    h.pipe_at("stock", Some("b"), Some("1"), 5).unwrap();
    h.pipe_at("stock", Some("a"), Some("2"), 5).unwrap();
    h.pipe_at("stock", Some("b"), Some("3"), 2).unwrap();
    assert_eq!(h.records("out"), ["b=1@5", "a=2@5", "b=3@2"]);
}

#[test]
fn a_record_past_the_limit_finds_its_buffer_emitted_and_opens_a_new_one() {
    let h = stock(10);
    h.pipe_at("stock", Some("a"), Some("1"), 0).unwrap();
    // Kafka Streams buffers this record, then evicts a's buffer with it: `a=2@11` once.
    // Here the watermark passes 10 before the record at 11 is handed over.
    h.pipe_at("stock", Some("a"), Some("2"), 11).unwrap();
    h.pipe_at("stock", Some("z"), Some("0"), 25).unwrap();
    assert_eq!(h.records("out"), ["a=1@0", "a=2@11"]);
}

#[test]
fn a_restart_keeps_what_is_buffered() {
    let h = stock(10);
    h.pipe_at("stock", Some("a"), Some("1"), 0).unwrap();
    h.pipe_at("stock", Some("a"), Some("2"), 3).unwrap();
    h.driver.restart().unwrap();
    h.pipe_at("stock", Some("z"), Some("0"), 20).unwrap();
    assert_eq!(h.records("out"), ["a=2@3"]);
}

#[test]
fn on_a_quiet_input_the_built_in_clock_emits_what_is_due() {
    let b = StreamsBuilder::new("app");
    b.event_time(parsley_stage::EventTimeOrder::new().clock(1_000));
    b.table::<String, String>("stock")
        .suppress(Suppressed::until_time_limit(Duration::from_millis(10)))
        .to_change_stream()
        .to("out");
    let h = Harness::new(b.build().unwrap());
    h.pipe_at("stock", Some("a"), Some("1"), 0).unwrap();
    h.pipe_at("stock", Some("a"), Some("2"), 5).unwrap();
    assert_eq!(h.records("out"), Vec::<String>::new());
    // No record comes; wall time moves on, and the clock written into Kafka with it.
    h.driver.advance_time(5_000).unwrap();
    assert_eq!(h.records("out"), ["a=2@5"]);
}
