//! Helpers shared by the event-time tests (`event_time.rs`, `event_time_alignment.rs`).

use std::time::{SystemTime, UNIX_EPOCH};

use parsley_runtime::TaskMetrics;
use rdkafka::producer::{BaseProducer, BaseRecord};

/// An hour ago, ms since the epoch: the tests' time zero.
pub fn base() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    now.as_millis() as i64 - 3_600_000
}

/// Queues `value` under `key` for partition 0 of `topic` with record timestamp `timestamp_ms`
/// (ms since the epoch), without waiting: the caller flushes.
pub fn enqueue(producer: &BaseProducer, topic: &str, key: &str, value: &str, timestamp_ms: i64) {
    producer
        .send(
            BaseRecord::to(topic)
                .partition(0)
                .key(key)
                .payload(value)
                .timestamp(timestamp_ms),
        )
        .map_err(|(e, _)| e)
        .expect("send");
}

/// The one task of `tasks`; panics unless there is exactly one.
pub fn only_task(tasks: &[TaskMetrics]) -> TaskMetrics {
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    tasks[0]
}
