//! librdkafka statistics of a stage's clients reach the sink of
//! [`RuntimeConfig::statistics`] on the real broker: JSON documents from the stage's consumer
//! and from its transactional producer, the producer's counting the records it produced.

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use parsley_runtime::{Runtime, RuntimeConfig, StatisticsSink};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, forward_topology, raw_producer, unique_topic, wait_committed,
};
use rdkafka::producer::{BaseRecord, Producer};

/// The string value of `"field": "…"` in a librdkafka statistics document (it writes one
/// space after the colon of a top-level field).
fn field<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let start = json.find(&format!("\"{name}\": \""))? + name.len() + 5;
    Some(&json[start..start + json[start..].find('"')?])
}

/// The integer value of top-level field `"name":…`.
fn number(json: &str, name: &str) -> Option<u64> {
    let start = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let digits: String = json[start..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[test]
fn statistics_of_the_consumer_and_the_producer_reach_the_sink() {
    let input = create_topic("stats-in", 1);
    let output = create_topic("stats-out", 1);
    let (tx, rx) = channel::<String>();
    let sink = StatisticsSink::new(move |json| {
        let _ = tx.send(String::from_utf8_lossy(json).into_owned());
    });
    let topology = forward_topology(
        &unique_topic("stats"),
        &[input.name.as_str()],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(
        topology,
        RuntimeConfig::new(bootstrap()).statistics(Duration::from_millis(20), sink),
    )
    .start()
    .expect("the stage starts");
    let producer = raw_producer(None);
    for i in 0..3 {
        let value = format!("v{i}");
        producer
            .send(
                BaseRecord::<str, str>::to(&input.name)
                    .key("k")
                    .payload(&value),
            )
            .expect("queued");
    }
    producer.flush(DEADLINE).expect("flushed");
    wait_committed(&running, "forward", 3);

    // Reports keep coming every 20 ms: wait for a consumer's and for a producer's that has
    // counted the three outputs (its `txmsgs` also counts the changelog's snapshot records).
    let started = Instant::now();
    let (mut consumer, mut producer_msgs) = (false, 0);
    while !(consumer && producer_msgs >= 3) {
        let remaining = DEADLINE.saturating_sub(started.elapsed());
        let json = rx
            .recv_timeout(remaining)
            .unwrap_or_else(|_| panic!("no statistics of both clients within {DEADLINE:?}"));
        match field(&json, "type") {
            Some("consumer") => consumer = true,
            Some("producer") => {
                producer_msgs = producer_msgs.max(number(&json, "txmsgs").unwrap_or(0));
            }
            other => panic!("a statistics document of an unknown client type {other:?}"),
        }
    }
    running.stop().expect("the stage stops");
}
