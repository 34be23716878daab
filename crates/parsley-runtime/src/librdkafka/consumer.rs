//! Local reads of a consumer's state that the `rdkafka` crate does not wrap, or wraps with a
//! request between threads.

use std::ffi::CString;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::types::RDKafkaRespErr;

/// The consumer's application position (the offset after the last record it returned, `i64`)
/// of every partition in `list`, written into the list's offsets in place
/// (`rd_kafka_position`: a local read, no request); a partition the consumer has returned
/// nothing from, or does not have, reads as an invalid offset.
///
/// # Errors
/// librdkafka's error code.
pub(crate) fn positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    list: &mut TopicPartitionList,
) -> Result<(), RDKafkaErrorCode> {
    // SAFETY: the client handle is alive for as long as `consumer` is borrowed; the list is a
    // valid list owned by `list`, borrowed mutably for the call, which librdkafka only updates
    // in place (offsets and errors).
    let err = unsafe { rdkafka_sys::rd_kafka_position(consumer.client().native_ptr(), list.ptr()) };
    if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(err.into())
    }
}

/// librdkafka's cached high watermark (an offset, `i64`) of `topic`/`partition`, from the
/// consumer's last fetch response (`rd_kafka_get_watermark_offsets`: a local read, no request;
/// the `rdkafka` crate does not wrap it); `None` before the first fetch response, for a
/// partition the consumer does not fetch, or for a topic name with a NUL byte.
///
/// Not evidence for the causal gate (the book's specification, §4, wants a `READ_UNCOMMITTED`
/// `ListOffsets` after the poll: a claim on another channel can name a record appended after
/// that channel's last fetch response); good for a lag metric, and for event-time ordering's
/// live-head evidence once the frontier has reached it (§5). On a `read_committed` consumer it
/// is still the high watermark of the response, not its last stable offset.
pub fn cached_high_watermark<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = CString::new(topic).ok()?;
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the client handle is alive for as long as `consumer` is borrowed; `topic` is a
    // NUL-terminated string that outlives the call; `low` and `high` are valid for writes.
    let err = unsafe {
        rdkafka_sys::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}
