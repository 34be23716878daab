//! The producing side shared by stage tasks and plain causal producers: a librdkafka producer
//! whose acknowledgements are collected as evidence.
//!
//! Every stamped send is identified by a send id, a plain `usize` handed to librdkafka as its
//! delivery opaque (no allocation per send); the outbox keeps the [`SendTag`] (task, channel,
//! send sequence) of each id in a queue of sends awaiting their report, in id order. The
//! delivery callback (on the producer's polling thread) records the id and the result and
//! wakes whoever waits for acknowledgements; [`Outbox::drain`] turns them into [`Ack`]s.
//! Waiting is on a condition variable signalled by the callbacks, never a sleep.
//!
//! Invariant: `outstanding` counts sends handed to librdkafka whose delivery report has not
//! been recorded yet; it is incremented before a send and decremented exactly once, by the
//! report (under the state lock, so a waiter cannot miss it) or by a synchronous send failure.
//! Callbacks signal the condition variable only while someone waits (`waiters`): a signal
//! with nobody waiting still costs a system call per delivery report.
//!
//! Invariant of the id queue: `tags[i]` belongs to send id `first_id + i`; an entry becomes
//! `None` when its report is drained, and leading `None`s are popped, so the queue holds the
//! sends from the oldest unreported one on (reports of different partitions arrive out of
//! order). Id 0 marks an untagged send (a changelog write).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use parsley_clock::Channel;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka_sys as rdsys;

use crate::error::{Error, Result};

/// Identifies one send in its delivery report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendTag {
    /// The sending task's partition, or a producer-chosen slot for plain producers.
    pub task: i32,
    /// The channel the record goes to.
    pub channel: Channel,
    /// The sender's send sequence of the record.
    pub seq: u64,
}

/// A delivery report: the offset the broker assigned, or why the send failed.
#[derive(Debug)]
pub struct Ack {
    /// The send; `None` for a changelog write.
    pub tag: Option<SendTag>,
    /// The record's offset, or the error.
    pub result: std::result::Result<i64, KafkaError>,
}

/// A delivery report as the callback records it: the send id and the result.
struct Report {
    id: usize,
    result: std::result::Result<i64, KafkaError>,
}

/// The delivery opaque of an untagged send (a changelog write).
const UNTAGGED: usize = 0;

#[derive(Default)]
struct AckState {
    acks: Vec<Report>,
    /// Delivery reports recorded since the producer was created.
    reports: u64,
    /// Threads waiting on `changed`.
    waiters: u32,
}

/// Producer context that collects delivery reports.
pub(crate) struct AckContext {
    state: Mutex<AckState>,
    changed: Condvar,
    /// Sends without a delivery report yet; decremented under the `state` lock.
    outstanding: AtomicU64,
}

impl ClientContext for AckContext {}

impl ProducerContext for AckContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, id: usize) {
        let result = match result {
            Ok(m) => Ok(m.offset()),
            Err((e, _)) => Err(e.clone()),
        };
        let mut s = self.state.lock().expect("ack state poisoned");
        s.acks.push(Report { id, result });
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        s.reports += 1;
        if s.waiters > 0 {
            self.changed.notify_all();
        }
    }
}

/// A producer plus its collected acknowledgements.
pub(crate) struct Outbox {
    producer: ThreadedProducer<AckContext>,
    /// The tag of each stamped send from the oldest unreported one on (module docs).
    tags: VecDeque<Option<SendTag>>,
    /// The send id of `tags[0]`; ids start at 1.
    first_id: u64,
}

impl Outbox {
    /// Creates the producer from `config` (idempotence is forced on: same-channel sends must
    /// be appended in send order).
    ///
    /// A transactional producer gets `retry.backoff.ms=10` unless `config` sets it: a
    /// transaction begun right after a commit meets `CONCURRENT_TRANSACTIONS` until the
    /// previous markers are written, and librdkafka retries after `retry.backoff.ms` (100 ms
    /// by default), which caps back-to-back transactions near 10 per second. The Java client
    /// lowers this backoff to 20 ms for the same reason (KAFKA-5477).
    pub(crate) fn new(config: &ClientConfig) -> Result<Self> {
        let mut config = config.clone();
        config.set("enable.idempotence", "true");
        if config.get("transactional.id").is_some() && config.get("retry.backoff.ms").is_none() {
            config.set("retry.backoff.ms", "10");
        }
        let producer = config
            .create_with_context(AckContext {
                state: Mutex::new(AckState::default()),
                changed: Condvar::new(),
                outstanding: AtomicU64::new(0),
            })
            .map_err(|e| Error::kafka("creating the producer", e))?;
        Ok(Outbox {
            producer,
            tags: VecDeque::new(),
            first_id: 1,
        })
    }

    pub(crate) fn producer(&self) -> &ThreadedProducer<AckContext> {
        &self.producer
    }

    fn ctx(&self) -> &AckContext {
        self.producer.context()
    }

    /// Sends one record to an explicit partition with the stamp header (and `extra` headers)
    /// and record timestamp `timestamp` (ms since the epoch; `None`: the producer's clock).
    /// When librdkafka's queue is full it waits for acknowledgements to make room.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        topic: &str,
        tag: SendTag,
        key: &[u8],
        value: &[u8],
        stamp: &[u8],
        extra: &[(&str, &[u8])],
        timestamp: Option<i64>,
        timeout: Duration,
    ) -> Result<()> {
        let headers = extra.iter().fold(
            OwnedHeaders::new().insert(Header {
                key: parsley_clock::STAMP_HEADER,
                value: Some(stamp),
            }),
            |h, (k, v)| {
                h.insert(Header {
                    key: k,
                    value: Some(*v),
                })
            },
        );
        let mut id = self.first_id + self.tags.len() as u64;
        if id as usize == UNTAGGED {
            // Only where `usize` is narrower than the ids: skip the id that would read as
            // untagged.
            self.tags.push_back(None);
            id += 1;
        }
        self.tags.push_back(Some(tag));
        let mut record = BaseRecord::with_opaque_to(topic, id as usize)
            .partition(tag.channel.partition)
            .key(key)
            .payload(value)
            .headers(headers);
        if let Some(t) = timestamp {
            record = record.timestamp(t);
        }
        let sent = self.enqueue(record, tag.channel, timeout);
        if sent.is_err() {
            // Not handed to librdkafka: no report will come.
            self.tags.pop_back();
        }
        sent
    }

    /// Sends a changelog record (no stamp; `None` is a tombstone) in the open transaction.
    pub(crate) fn send_changelog(
        &self,
        channel: Channel,
        topic: &str,
        key: &[u8],
        value: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<()> {
        let mut record = BaseRecord::with_opaque_to(topic, UNTAGGED)
            .partition(channel.partition)
            .key(key);
        if let Some(v) = value {
            record = record.payload(v);
        }
        self.enqueue(record, channel, timeout)
    }

    /// Hands `record` to the producer, waiting for room while its queue is full.
    fn enqueue(
        &self,
        mut record: BaseRecord<'_, [u8], [u8], usize>,
        channel: Channel,
        timeout: Duration,
    ) -> Result<()> {
        // Read only once the queue is full: most sends never look at the clock.
        let mut deadline = None;
        loop {
            self.ctx().outstanding.fetch_add(1, Ordering::Relaxed);
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((e, back)) => {
                    let mut s = self.ctx().state.lock().expect("ack state");
                    self.ctx().outstanding.fetch_sub(1, Ordering::Relaxed);
                    if e.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull) {
                        return Err(Error::Send {
                            topic: back.topic.to_string(),
                            channel: Box::new(channel),
                            source: e,
                        });
                    }
                    // Queue full: wait for a delivery report to make room.
                    let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        return Err(Error::Timeout {
                            what: format!("room in the producer queue for {}", back.topic),
                            timeout,
                        });
                    }
                    let before = s.reports;
                    s.waiters += 1;
                    let (mut s, _) = self
                        .ctx()
                        .changed
                        .wait_timeout_while(s, remaining, |s| s.reports == before)
                        .expect("ack state");
                    s.waiters -= 1;
                    record = back;
                }
            }
        }
    }

    /// Sends everything queued now, without waiting out `linger.ms`, and waits until every
    /// send so far has a delivery report. `rd_kafka_flush` makes librdkafka ignore the linger
    /// for what is queued (a commit wants its last batch on the wire at once); it may serve
    /// delivery callbacks on this thread.
    pub(crate) fn flush(&self, timeout: Duration) -> Result<()> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the handle is a live producer for as long as `self` is borrowed.
        let err = unsafe { rdsys::rd_kafka_flush(self.producer.client().native_ptr(), ms) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(Error::Timeout {
                what: "flushing the producer".into(),
                timeout,
            });
        }
        self.wait_acked(timeout)
    }

    /// Waits until every send so far has a delivery report.
    pub(crate) fn wait_acked(&self, timeout: Duration) -> Result<()> {
        let outstanding = &self.ctx().outstanding;
        let mut s = self.ctx().state.lock().expect("ack state");
        s.waiters += 1;
        let (mut s, _) = self
            .ctx()
            .changed
            .wait_timeout_while(s, timeout, |_| outstanding.load(Ordering::Relaxed) > 0)
            .expect("ack state");
        s.waiters -= 1;
        let left = outstanding.load(Ordering::Relaxed);
        if left > 0 {
            return Err(Error::Timeout {
                what: format!("acknowledgement of {left} send(s)"),
                timeout,
            });
        }
        Ok(())
    }

    /// Takes the delivery reports recorded so far, each with the tag of its send.
    pub(crate) fn drain(&mut self) -> Vec<Ack> {
        let reports = std::mem::take(&mut self.ctx().state.lock().expect("ack state").acks);
        let acks = reports
            .into_iter()
            .map(|Report { id, result }| {
                let tag = if id == UNTAGGED {
                    None
                } else {
                    let index = id.wrapping_sub(self.first_id as usize);
                    let tag = self.tags.get_mut(index).and_then(Option::take);
                    debug_assert!(tag.is_some(), "a report for send id {id} without a send");
                    tag
                };
                Ack { tag, result }
            })
            .collect();
        while self.tags.front().is_some_and(Option::is_none) {
            self.tags.pop_front();
            self.first_id += 1;
        }
        acks
    }

    /// Drops the delivery reports recorded so far and forgets every send: after an abort,
    /// once every send is reported.
    pub(crate) fn discard(&mut self) {
        self.ctx().state.lock().expect("ack state").acks.clear();
        self.first_id += self.tags.len() as u64;
        self.tags.clear();
    }

    /// Commits the open transaction once every send of it is acknowledged.
    ///
    /// `rdkafka`'s `commit_transaction` first calls its `flush`, which polls the producer's
    /// queue in 100 ms steps and so adds up to 100 ms to every commit with sends still in
    /// flight. Here the acknowledgements are awaited on the delivery callbacks instead, and
    /// `rd_kafka_commit_transaction` (whose own flush waits on librdkafka's message count,
    /// served by the polling thread) is called directly.
    pub(crate) fn commit_transaction(&self, timeout: Duration) -> Result<()> {
        self.flush(timeout)?;
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the handle is a live producer; the returned error object (if any) is
        // consumed and destroyed by `transaction_result`.
        unsafe {
            transaction_result(
                "committing the transaction",
                rdsys::rd_kafka_commit_transaction(self.producer.client().native_ptr(), ms),
            )
        }
    }
}

/// Turns a librdkafka transactional API result into a `Result`, destroying the error object.
///
/// # Safety
/// `err` is null or an error object returned by librdkafka that nobody else will destroy.
unsafe fn transaction_result(operation: &str, err: *mut rdsys::rd_kafka_error_t) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: `err` is a valid error object (caller's contract), destroyed exactly once here.
    unsafe {
        let message = std::ffi::CStr::from_ptr(rdsys::rd_kafka_error_string(err))
            .to_string_lossy()
            .into_owned();
        let e = Error::Transaction {
            operation: operation.to_string(),
            code: RDKafkaErrorCode::from(rdsys::rd_kafka_error_code(err)),
            message,
            fatal: rdsys::rd_kafka_error_is_fatal(err) != 0,
            requires_abort: rdsys::rd_kafka_error_txn_requires_abort(err) != 0,
        };
        rdsys::rd_kafka_error_destroy(err);
        Err(e)
    }
}

/// The partition of `key` among `partitions`: murmur2 of the key bytes, as the Java client's
/// default partitioner and Kafka Streams compute it (librdkafka's `murmur2` partitioner), so
/// records written by Parsley and by Java producers for one key land in the same partition.
///
/// # Panics
/// When `partitions <= 0`.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    // SAFETY: the murmur2 partitioner reads `keylen` bytes of `key` and ignores the topic and
    // opaque pointers.
    unsafe {
        rdsys::rd_kafka_msg_partitioner_murmur2(
            std::ptr::null(),
            key.as_ptr().cast(),
            key.len(),
            partitions,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitioning_matches_javas_murmur2() {
        // Java: Utils.murmur2("kafka".getBytes()) == 0xd067cf64 (librdkafka's test vector).
        let positive = 0xd067_cf64u32 & 0x7fff_ffff;
        assert_eq!(partition_for(b"kafka", 1000), (positive % 1000) as i32);
        assert_eq!(partition_for(b"kafka", 1000), 580);
        let empty = 0x106e_08d9u32 & 0x7fff_ffff;
        assert_eq!(partition_for(b"", 7), (empty % 7) as i32);
    }
}
