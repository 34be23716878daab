//! Output records refused for good (cases C16, C17): how big a record is as each limit counts
//! it, and which record of a refused batch explains the refusal.
//!
//! Two limits count a record's size, its headers included:
//! - librdkafka's `produce()` refuses a record when key, value and serialized headers plus
//!   36 B of record framing (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`) exceed the producer's
//!   `message.max.bytes` (`MSG_SIZE_TOO_LARGE`, synchronously: nothing was sent);
//! - the broker refuses a batch larger than the topic's `max.message.bytes`
//!   (`MESSAGE_TOO_LARGE` in the delivery report of every record of the batch).
//!
//! And the broker refuses a batch holding a `CreateTime` timestamp outside the topic's window,
//! `message.timestamp.after.max.ms` ahead of or `message.timestamp.before.max.ms` behind its
//! clock (Kafka 4.4 reports `INVALID_RECORD`, `INVALID_TIMESTAMP` in earlier versions).
//!
//! A refused batch fails every record in it; the record to name is the one that explains the
//! refusal alone ([`culprit`]): larger than the limit in a batch of its own, or with a
//! timestamp outside the window by this host's clock. When none does (records that fit one by
//! one in a batch that does not, a timestamp at the window's edge that the clock has passed
//! since), the refusal is not the record's: the caller keeps the plain send error, which is
//! retried.

use rdkafka::types::RDKafkaErrorCode;

use parsley_task::error::{
    PRODUCER_SIZE_LIMIT, Refusal, TIMESTAMP_AFTER_LIMIT, TIMESTAMP_BEFORE_LIMIT, TOPIC_SIZE_LIMIT,
};

/// librdkafka's bound of a record's framing in a v2 batch (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`):
/// what `produce()` adds to key, value and headers before comparing with `message.max.bytes`.
pub(crate) const RECORD_MAX_OVERHEAD: u64 = 36;
/// The header of a v2 record batch, the log overhead (offset, length) included
/// (`DefaultRecordBatch.RECORD_BATCH_OVERHEAD`).
pub(crate) const BATCH_OVERHEAD: u64 = 61;
/// librdkafka's default `message.max.bytes`.
pub(crate) const DEFAULT_MESSAGE_MAX_BYTES: u64 = 1_000_000;

/// The bytes of the zigzag varint of `n`, as Kafka's v2 records encode lengths.
pub(crate) fn varint_len(n: i64) -> u64 {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut len = 1;
    while z >= 0x80 {
        z >>= 7;
        len += 1;
    }
    len
}

/// The serialized size of one header (name, value; `None`: a null value), as librdkafka
/// counts it: both lengths as varints, then the bytes.
pub(crate) fn header_len(name: usize, value: Option<usize>) -> u64 {
    let value = value.unwrap_or(0);
    varint_len(name as i64) + name as u64 + varint_len(value as i64) + value as u64
}

/// What the size limits and the timestamp window look at in one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordShape {
    /// The partition it went to.
    pub partition: i32,
    /// Key bytes; `None`: no key.
    pub key: Option<usize>,
    /// Value bytes; `None`: a tombstone.
    pub value: Option<usize>,
    /// Its headers, serialized ([`header_len`] of each).
    pub headers: u64,
    /// How many headers.
    pub header_count: usize,
    /// Its timestamp, ms since the epoch, if it has one.
    pub timestamp: Option<i64>,
}

impl RecordShape {
    /// The shape of a record with `key`, `value` and `headers` (name and value lengths).
    pub(crate) fn new(
        partition: i32,
        key: Option<usize>,
        value: Option<usize>,
        headers: impl IntoIterator<Item = (usize, Option<usize>)>,
        timestamp: Option<i64>,
    ) -> Self {
        let (mut size, mut count) = (0, 0);
        for (name, value) in headers {
            size += header_len(name, value);
            count += 1;
        }
        RecordShape {
            partition,
            key,
            value,
            headers: size,
            header_count: count,
            timestamp,
        }
    }

    /// The shape of a message librdkafka reported (a failed delivery: librdkafka gives no
    /// timestamp for it, the sender fills it in).
    pub(crate) fn of_message<M: rdkafka::message::Message>(m: &M) -> Self {
        use rdkafka::message::Headers;
        let headers = m.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| (h.key.len(), h.value.map(<[u8]>::len)))
                .collect()
        });
        RecordShape::new(
            m.partition(),
            m.key().map(<[u8]>::len),
            m.payload().map(<[u8]>::len),
            headers,
            m.timestamp().to_millis(),
        )
    }

    /// Key, value and headers.
    fn content(&self) -> u64 {
        (self.key.unwrap_or(0) + self.value.unwrap_or(0)) as u64 + self.headers
    }

    /// The size librdkafka's `produce()` compares with the producer's `message.max.bytes`.
    pub(crate) fn producer_size(&self) -> u64 {
        RECORD_MAX_OVERHEAD + self.content()
    }

    /// The size of an uncompressed v2 batch holding this record alone: what the broker
    /// compares with the topic's `max.message.bytes` when the record is alone in its batch.
    pub(crate) fn lone_batch_size(&self) -> u64 {
        let len = |l: Option<usize>| l.map_or(-1, |l| l as i64);
        // Attributes (1 B), timestamp delta and offset delta (0: 1 B each), key, value, the
        // header count and the headers.
        let body = 3
            + varint_len(len(self.key))
            + varint_len(len(self.value))
            + varint_len(self.header_count as i64)
            + self.content();
        BATCH_OVERHEAD + varint_len(body as i64) + body
    }
}

/// What a refusal is judged against: the topic's settings, as far as they could be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TopicLimits {
    /// `max.message.bytes`.
    pub max_message_bytes: Option<u64>,
    /// `message.timestamp.type` is `LogAppendTime`: the broker sets every timestamp itself.
    pub log_append_time: bool,
    /// `message.timestamp.after.max.ms`.
    pub after_max_ms: Option<i64>,
    /// `message.timestamp.before.max.ms`.
    pub before_max_ms: Option<i64>,
}

impl TopicLimits {
    /// The settings of a topic from its configuration entries (name, value).
    pub(crate) fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut limits = TopicLimits::default();
        for (name, value) in entries {
            match name {
                "max.message.bytes" => limits.max_message_bytes = value.parse().ok(),
                "message.timestamp.type" => limits.log_append_time = value == "LogAppendTime",
                "message.timestamp.after.max.ms" => limits.after_max_ms = value.parse().ok(),
                "message.timestamp.before.max.ms" => limits.before_max_ms = value.parse().ok(),
                _ => {}
            }
        }
        limits
    }
}

/// The broker's codes that refuse a record for what it is: a batch too large, a timestamp
/// outside the window (`INVALID_RECORD` is what Kafka 4.4 answers for it).
pub(crate) fn is_refusal(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidTimestamp
            | RDKafkaErrorCode::InvalidRecord
    )
}

/// The refusal of a record that librdkafka's `produce()` refused with `MSG_SIZE_TOO_LARGE`
/// under the producer's `message.max.bytes` of `limit`.
pub(crate) fn too_large_for_producer(record: &RecordShape, limit: u64) -> Refusal {
    Refusal::TooLarge {
        size: record.producer_size(),
        limit: Some(limit),
        setting: PRODUCER_SIZE_LIMIT,
    }
}

/// Which of the records the broker refused with `code` — the failed records of one topic in
/// one round of delivery reports, a refused batch among them — explains the refusal alone,
/// judged against the topic's `limits` at `now_ms` (this host's clock): its index and the
/// refusal. `None` when no record does (module docs).
///
/// A size refusal with the limit unknown names the largest record, and a timestamp refusal
/// with the window unknown the timestamp furthest from `now_ms`: the best guess, with the
/// limit reported unknown.
pub(crate) fn culprit(
    code: RDKafkaErrorCode,
    failed: &[RecordShape],
    limits: &TopicLimits,
    now_ms: i64,
) -> Option<(usize, Refusal)> {
    match code {
        RDKafkaErrorCode::MessageSizeTooLarge => {
            let too_large = |i: usize, r: &RecordShape, limit| {
                (
                    i,
                    Refusal::TooLarge {
                        size: r.lone_batch_size(),
                        limit,
                        setting: TOPIC_SIZE_LIMIT,
                    },
                )
            };
            match limits.max_message_bytes {
                Some(limit) => failed
                    .iter()
                    .enumerate()
                    .find(|(_, r)| r.lone_batch_size() > limit)
                    .map(|(i, r)| too_large(i, r, Some(limit))),
                None => failed
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, r)| r.lone_batch_size())
                    .map(|(i, r)| too_large(i, r, None)),
            }
        }
        RDKafkaErrorCode::InvalidTimestamp | RDKafkaErrorCode::InvalidRecord => {
            if limits.log_append_time {
                return None;
            }
            let refusal = |timestamp: i64, setting, max_ms| Refusal::Timestamp {
                timestamp,
                skew_ms: timestamp - now_ms,
                setting,
                max_ms,
            };
            let outside = failed.iter().enumerate().find_map(|(i, r)| {
                let ts = r.timestamp?;
                let skew = ts - now_ms;
                match (limits.after_max_ms, limits.before_max_ms) {
                    (Some(after), _) if skew > after => {
                        Some((i, refusal(ts, TIMESTAMP_AFTER_LIMIT, Some(after))))
                    }
                    (_, Some(before)) if -skew > before => {
                        Some((i, refusal(ts, TIMESTAMP_BEFORE_LIMIT, Some(before))))
                    }
                    _ => None,
                }
            });
            let window_known = limits.after_max_ms.is_some() || limits.before_max_ms.is_some();
            if outside.is_some() || window_known || code != RDKafkaErrorCode::InvalidTimestamp {
                return outside;
            }
            failed
                .iter()
                .enumerate()
                .filter_map(|(i, r)| Some((i, r.timestamp?)))
                .max_by_key(|(_, ts)| (ts - now_ms).unsigned_abs())
                .map(|(i, ts)| {
                    let setting = if ts >= now_ms {
                        TIMESTAMP_AFTER_LIMIT
                    } else {
                        TIMESTAMP_BEFORE_LIMIT
                    };
                    (i, refusal(ts, setting, None))
                })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode as C;

    const NOW: i64 = 1_800_000_000_000;
    const HOUR: i64 = 3_600_000;

    fn record(value: usize, timestamp: i64) -> RecordShape {
        // A 32-byte key and the stamp header (13-byte name, 39-byte stamp) of case C16.
        RecordShape::new(0, Some(32), Some(value), [(13, Some(39))], Some(timestamp))
    }

    #[test]
    fn varints_are_zigzag_as_kafka_encodes_lengths() {
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(-1), 1);
        assert_eq!(varint_len(63), 1);
        assert_eq!(varint_len(64), 2);
        assert_eq!(varint_len(-65), 2);
        assert_eq!(varint_len(8191), 2);
        assert_eq!(varint_len(8192), 3);
        assert_eq!(varint_len(i64::MAX), 10);
        // The stamp header of case C16: 1 + 13 + 1 + 39.
        assert_eq!(header_len(13, Some(39)), 54);
        assert_eq!(header_len(3, None), 5);
    }

    #[test]
    fn the_producer_counts_key_value_headers_and_36_bytes() {
        // Case C16 (a): 99,900 B fit `message.max.bytes=100000` with the key, not with the
        // stamp header too.
        let r = record(99_900, NOW);
        assert_eq!(RECORD_MAX_OVERHEAD + 32 + 99_900, 99_968);
        assert_eq!(r.producer_size(), 100_022);
        assert_eq!(
            too_large_for_producer(&r, 100_000),
            Refusal::TooLarge {
                size: 100_022,
                limit: Some(100_000),
                setting: PRODUCER_SIZE_LIMIT
            }
        );
    }

    #[test]
    fn a_lone_batch_is_its_header_and_the_framed_record() {
        // Java's DefaultRecord.sizeInBytes for key "k", value "v", no headers: 1 (length) +
        // 1 (attributes) + 1 + 1 (deltas) + 1 + 1 (key) + 1 + 1 (value) + 1 (header count).
        let r = RecordShape::new(0, Some(1), Some(1), [], None);
        assert_eq!(r.lone_batch_size(), 61 + 9);
        // A tombstone without a key: lengths -1.
        let r = RecordShape::new(0, None, None, [], None);
        assert_eq!(r.lone_batch_size(), 61 + 1 + 6);
        // 3000 B with the stamp: the body is over 127 B, so its length takes two bytes.
        let r = record(3000, NOW);
        let body = 3 + 1 + 2 + 1 + 32 + 3000 + 54;
        assert_eq!(r.lone_batch_size(), 61 + 2 + body);
    }

    #[test]
    fn a_refused_batch_names_the_record_too_large_alone() {
        let limits = TopicLimits {
            max_message_bytes: Some(2000),
            ..TopicLimits::default()
        };
        let batch = [record(5, NOW), record(3000, NOW), record(5, NOW)];
        let (i, refusal) = culprit(C::MessageSizeTooLarge, &batch, &limits, NOW).unwrap();
        assert_eq!(i, 1);
        assert_eq!(
            refusal,
            Refusal::TooLarge {
                size: batch[1].lone_batch_size(),
                limit: Some(2000),
                setting: TOPIC_SIZE_LIMIT
            }
        );
        assert!(refusal.to_string().contains("over the limit of 2000 B"));
        // Records that fit one by one: not theirs (the batch was too large as a whole).
        let small = [record(1500, NOW), record(1500, NOW)];
        assert_eq!(culprit(C::MessageSizeTooLarge, &small, &limits, NOW), None);
        // The limit unknown: the largest, its limit reported unknown.
        let (i, refusal) =
            culprit(C::MessageSizeTooLarge, &batch, &TopicLimits::default(), NOW).unwrap();
        assert_eq!(i, 1);
        assert!(matches!(refusal, Refusal::TooLarge { limit: None, .. }));
    }

    #[test]
    fn a_refused_timestamp_is_judged_against_the_topics_window() {
        let limits = TopicLimits::from_entries([
            ("message.timestamp.type", "CreateTime"),
            ("message.timestamp.after.max.ms", "3600000"),
            ("message.timestamp.before.max.ms", "9223372036854775807"),
            ("max.message.bytes", "1048588"),
        ]);
        assert_eq!(limits.after_max_ms, Some(HOUR));
        assert_eq!(limits.max_message_bytes, Some(1_048_588));
        let batch = [record(5, NOW), record(5, NOW + 2 * HOUR)];
        for code in [C::InvalidRecord, C::InvalidTimestamp] {
            let (i, refusal) = culprit(code, &batch, &limits, NOW).unwrap();
            assert_eq!(i, 1);
            assert_eq!(
                refusal,
                Refusal::Timestamp {
                    timestamp: NOW + 2 * HOUR,
                    skew_ms: 2 * HOUR,
                    setting: TIMESTAMP_AFTER_LIMIT,
                    max_ms: Some(HOUR)
                }
            );
            assert_eq!(
                refusal.to_string(),
                format!(
                    "record timestamp {} ms is 7200000 ms ahead of this host's clock, beyond \
                     message.timestamp.after.max.ms of the topic = 3600000 ms",
                    NOW + 2 * HOUR
                )
            );
        }
        // Thirty days back passes the default window: nothing to name.
        let past = [record(5, NOW - 30 * 24 * HOUR)];
        assert_eq!(culprit(C::InvalidRecord, &past, &limits, NOW), None);
        let narrow = TopicLimits {
            before_max_ms: Some(24 * HOUR),
            ..limits
        };
        let (_, refusal) = culprit(C::InvalidRecord, &past, &narrow, NOW).unwrap();
        assert!(matches!(
            refusal,
            Refusal::Timestamp { setting: TIMESTAMP_BEFORE_LIMIT, skew_ms, .. } if skew_ms == -30 * 24 * HOUR
        ));
        // A LogAppendTime topic sets timestamps itself; an invalid record there is something
        // else.
        let appended = TopicLimits {
            log_append_time: true,
            ..limits
        };
        assert_eq!(culprit(C::InvalidRecord, &batch, &appended, NOW), None);
        // The window unknown: INVALID_TIMESTAMP names the furthest, INVALID_RECORD nothing.
        let unknown = TopicLimits::default();
        let (i, refusal) = culprit(C::InvalidTimestamp, &batch, &unknown, NOW).unwrap();
        assert_eq!(i, 1);
        assert!(matches!(refusal, Refusal::Timestamp { max_ms: None, .. }));
        assert_eq!(culprit(C::InvalidRecord, &batch, &unknown, NOW), None);
        // Other codes are not refusals of a record.
        assert!(!is_refusal(C::NotLeaderForPartition));
        assert_eq!(
            culprit(C::NotLeaderForPartition, &batch, &limits, NOW),
            None
        );
    }
}
