//! The producing side shared by stage tasks and plain causal producers: a librdkafka producer
//! whose acknowledgements are collected as evidence.
//!
//! Every stamped send is identified by a send id, a plain `usize` handed to librdkafka as its
//! delivery opaque (no allocation per send); the outbox keeps the [`SendTag`] (task, channel,
//! send sequence) of each id in a queue of sends awaiting their report, in id order.
//!
//! Sends go to librdkafka's `rd_kafka_produceva` directly, not through rdkafka's
//! `BaseProducer::send`: they name their topic by a handle the outbox makes on the topic's
//! first send (rdkafka copies the name into a new C string per send, and librdkafka then looks
//! it up under the client's lock).
//!
//! # Delivery reports are served by the outbox's own thread
//! There is no polling thread: librdkafka's delivery reports wait in the producer's main
//! queue until the thread that owns the outbox serves them — without blocking in
//! [`Outbox::drain`] (once per poll batch of a stage), and with a blocking wait whenever it
//! needs reports to go on (a full producer queue, [`Outbox::flush`], [`Outbox::wait_acked`]).
//! A message is then allocated, reported and freed on one thread, and no lock is contended
//! per report. The blocking wait sleeps until a report arrives, not in fixed steps: librdkafka
//! calls [`queue_nonempty`] (`rd_kafka_queue_cb_event_enable`) whenever the main queue goes
//! from empty to non-empty, which sets a flag and wakes the waiter on a condition variable
//! with the remaining time to the deadline (no rounding of the timeout to whole milliseconds,
//! so no spinning, and never a sleep). A waiter serves everything queued, checks its
//! condition, and blocks only when the queue is empty: any report after that makes the queue
//! non-empty again and wakes it.
//!
//! librdkafka calls that themselves wait for reports to be served — `rd_kafka_flush` (which
//! also makes librdkafka ignore `linger.ms` while it runs) and `rd_kafka_abort_transaction`
//! (which purges and waits for the purged sends' reports) — run on a short-lived helper
//! thread while the owning thread serves reports until the call returns.
//!
//! Invariant: `outstanding` counts sends handed to librdkafka whose delivery report has not
//! been recorded yet; it is incremented before a send and decremented exactly once, by the
//! report or by a synchronous send failure.
//!
//! Invariant of the id queue: `tags[i]` belongs to send id `first_id + i`; an entry becomes
//! `None` when its report is drained, and leading `None`s are popped, so the queue holds the
//! sends from the oldest unreported one on (reports of different partitions arrive out of
//! order). Id 0 marks an untagged send (a changelog write).
//!
//! # A stamped send's value is not copied
//! librdkafka copies a value it is given with `RD_KAFKA_MSG_F_COPY`; a stamped send's value
//! is instead handed over by pointer (no flag) and its buffer kept in the id queue beside the
//! tag until the send's report is drained, when it is dropped. librdkafka reads the value
//! until it reports the send (retries included) and never after, and without
//! `RD_KAFKA_MSG_F_FREE` it does not free it; a report is recorded by the delivery callback,
//! so it is drained after librdkafka's last use. The producer is destroyed before the queue
//! (field order), and [`Outbox::discard`] runs only once every send is reported. A 1 KiB
//! record is thus copied once on its way through a stage (out of the consumer's buffer), as
//! in a plain consume-produce loop, not twice. Changelog writes borrow their bytes and are
//! copied.

use std::collections::VecDeque;
use std::ffi::{CStr, CString, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use parsley_clock::Channel;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka_sys as rdsys;

use crate::clients::ClientRole;
use crate::config::{StatisticsSink, forward_statistics};
use crate::refusal::RecordShape;
use crate::security::{Endpoint, SecurityWatch, WATCH_STEP};
use parsley_task::error;
use parsley_task::error::Operation;
use parsley_task::error::{Error, Result};
use parsley_task::topic::SendTag;

/// A delivery report: the offset the broker assigned, or why the send failed. One is recorded
/// per send, so it is kept small: a failure, rare, is boxed.
#[derive(Debug)]
pub struct Ack {
    /// The send; `None` for a changelog write.
    pub tag: Option<SendTag>,
    /// The record's partition.
    pub partition: i32,
    /// The record's offset, or why the send failed.
    pub result: std::result::Result<i64, Box<Failed>>,
    /// The send id librdkafka reported it with; its tag is looked up by [`Outbox::drain_into`].
    id: usize,
}

/// Why a send failed, from its delivery report.
#[derive(Debug)]
pub struct Failed {
    /// librdkafka's error.
    pub error: KafkaError,
    /// What the broker's limits look at in the record (sizes, timestamp).
    pub shape: RecordShape,
}

/// The delivery opaque of an untagged send (a changelog write).
const UNTAGGED: usize = 0;

/// [`parsley_clock::STAMP_HEADER`] as librdkafka takes a header name.
const STAMP_HEADER_C: &CStr = c"ps";

/// The header naming the transactional id of the producer that wrote a changelog record.
pub(crate) const TXN_HEADER: &str = "parsley.txn";
/// [`TXN_HEADER`] as librdkafka takes a header name.
const TXN_HEADER_C: &CStr = c"parsley.txn";

/// One record as [`Outbox::produce`] hands it to librdkafka.
struct Produce<'a> {
    /// The topic handle ([`topic_handle`]).
    rkt: *mut rdsys::rd_kafka_topic_t,
    partition: i32,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    /// Copy the value (`RD_KAFKA_MSG_F_COPY`); else the caller keeps it alive until the
    /// send's report.
    copy_value: bool,
    /// The delivery opaque: the send id, or [`UNTAGGED`].
    opaque: usize,
    /// ms since the epoch; `None`: the producer's clock.
    timestamp: Option<i64>,
    /// Header names and values (`None`: a header with a null value).
    headers: &'a [(&'a CStr, Option<&'a [u8]>)],
}

/// A stamped send awaiting its report: its tag, and its value, which librdkafka reads without
/// a copy until it reports the send (module docs).
struct Pending {
    tag: SendTag,
    /// Never read: it keeps the buffer librdkafka was given alive.
    _value: Option<Vec<u8>>,
    /// The record timestamp it was sent with (`None`: the producer's clock): librdkafka's
    /// report of a failed send does not give it back.
    timestamp: Option<i64>,
}

/// A librdkafka topic handle of the outbox's producer, made on the topic's first send and
/// kept for the outbox's life: a send names its topic by handle, so librdkafka does not look
/// the name up (under the client's lock) and rdkafka does not copy it into a C string per send.
struct TopicHandle {
    name: Box<str>,
    rkt: *mut rdsys::rd_kafka_topic_t,
}

// SAFETY: librdkafka's topic handles may be used from any thread.
unsafe impl Send for TopicHandle {}
// SAFETY: as above; the handle is only passed to librdkafka, never written through here.
unsafe impl Sync for TopicHandle {}

/// Producer context that collects delivery reports.
pub(crate) struct AckContext {
    /// Reports recorded and not drained yet. Recorded by whichever thread serves the queue
    /// (the outbox's owner, or rdkafka's own flush when the producer is dropped).
    acks: Mutex<Vec<Ack>>,
    /// Delivery reports recorded since the producer was created.
    reports: AtomicU64,
    /// Sends without a delivery report yet.
    outstanding: AtomicU64,
    /// Set by [`queue_nonempty`] (and by a helper thread that is done); cleared by the waiter.
    wake: Mutex<Wake>,
    woken: Condvar,
    /// Where librdkafka's statistics go, when asked for.
    statistics: Option<StatisticsSink>,
    /// A failure to authenticate or to set up TLS, when librdkafka reported one.
    watch: SecurityWatch,
}

#[derive(Default)]
struct Wake {
    /// Something happened since the waiter last looked.
    pending: bool,
    /// A thread waits on `woken`: only then is a signal worth a system call.
    waiting: bool,
}

impl AckContext {
    /// Wakes the thread waiting in [`Outbox::wait_until`], or makes its next wait return at
    /// once.
    pub(crate) fn signal(&self) {
        let mut w = self.wake.lock().expect("wake state");
        w.pending = true;
        if w.waiting {
            self.woken.notify_one();
        }
    }

    /// Blocks until [`AckContext::signal`] or `deadline`; `false` on the deadline.
    fn wait_signal(&self, deadline: Instant) -> bool {
        let mut w = self.wake.lock().expect("wake state");
        while !w.pending {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return false;
            }
            w.waiting = true;
            w = self.woken.wait_timeout(w, remaining).expect("wake state").0;
            w.waiting = false;
        }
        w.pending = false;
        true
    }
}

/// Called by librdkafka (on one of its threads, with the queue's lock held) when the
/// producer's main queue goes from empty to non-empty: wakes the outbox's waiter. It calls
/// no librdkafka function, as librdkafka requires.
///
/// # Safety
/// `opaque` is the `AckContext` of the producer whose queue calls this; the outbox disables
/// the callback before the producer (and with it the context) is dropped.
unsafe extern "C" fn queue_nonempty(_rk: *mut rdsys::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: see the function's contract.
    let ctx = unsafe { &*(opaque as *const AckContext) };
    ctx.signal();
}

impl ClientContext for AckContext {
    fn stats_raw(&self, statistics: &[u8]) {
        forward_statistics(self.statistics.as_ref(), statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.watch.event(&error, reason);
    }

    /// librdkafka's lines, the harmless start-up warnings demoted (`client_log`).
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        crate::client_log::forward(level, fac, log_message);
    }
}

impl ProducerContext for AckContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, id: usize) {
        let (m, result) = match result {
            Ok(m) => (m, Ok(m.offset())),
            // Only a failure is measured: which record of a refused batch explains it.
            Err((e, m)) => (
                m,
                Err(Box::new(Failed {
                    error: e.clone(),
                    shape: RecordShape::of_message(m),
                })),
            ),
        };
        let ack = Ack {
            tag: None,
            partition: m.partition(),
            result,
            id,
        };
        self.acks.lock().expect("ack state").push(ack);
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        self.reports.fetch_add(1, Ordering::Relaxed);
    }
}

/// The producer's main queue (delivery reports, errors, logs), as a handle of its own.
struct MainQueue(*mut rdsys::rd_kafka_queue_t);

// SAFETY: librdkafka's queue handles may be used from any thread.
unsafe impl Send for MainQueue {}
// SAFETY: as above; the handle is only read (length, callbacks), never moved out.
unsafe impl Sync for MainQueue {}

/// A producer plus its collected acknowledgements.
pub(crate) struct Outbox {
    /// Shared only with the helper thread of an overlapped commit
    /// ([`Outbox::commit_served`]), for the length of that commit.
    producer: Arc<BaseProducer<AckContext>>,
    queue: MainQueue,
    /// The tag of each stamped send from the oldest unreported one on (module docs).
    tags: VecDeque<Option<Pending>>,
    /// The send id of `tags[0]`; ids start at 1.
    first_id: u64,
    /// The handles of the topics sent to so far (a stage sends to few: a linear scan). Locked
    /// only by [`Outbox::send_changelog`] (a few sends per commit); [`Outbox::send`] has
    /// `&mut self` and reads it without the lock.
    topics: Mutex<Vec<TopicHandle>>,
    /// The producer's `transactional.id`, if it has one (named in what its init waits for).
    transactional_id: Option<String>,
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if Arc::strong_count(&self.producer) > 1 {
            // A helper thread still holds the producer (only when unwinding from a panic), so
            // librdkafka may still read the values of unreported sends after the queue goes:
            // leak them rather than free them under it.
            for pending in self.tags.drain(..).flatten() {
                std::mem::forget(pending._value);
            }
        }
        // SAFETY: the queue handle is live; after this call returns librdkafka calls no
        // callback any more (it calls it under the queue's lock, which this call takes), so
        // the context may be dropped with the producer. The handle is destroyed exactly once.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue.0, None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.queue.0);
        }
        let topics = self
            .topics
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for t in topics.drain(..) {
            // SAFETY: each handle was made by `rd_kafka_topic_new` on this outbox's producer,
            // which is still alive (fields drop after this body), and is destroyed once.
            unsafe { rdsys::rd_kafka_topic_destroy(t.rkt) };
        }
    }
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
    pub(crate) fn new(config: &ClientConfig, statistics: Option<StatisticsSink>) -> Result<Self> {
        let mut config = config.clone();
        config.set("enable.idempotence", "true");
        if config.get("transactional.id").is_some() && config.get("retry.backoff.ms").is_none() {
            config.set("retry.backoff.ms", "10");
        }
        let producer: BaseProducer<AckContext> = config
            .create_with_context(AckContext {
                acks: Mutex::new(Vec::new()),
                reports: AtomicU64::new(0),
                outstanding: AtomicU64::new(0),
                wake: Mutex::new(Wake::default()),
                woken: Condvar::new(),
                statistics,
                watch: SecurityWatch::new(Endpoint::of(&config, ClientRole::Producer)),
            })
            .map_err(|e| crate::client_error::kafka(Operation::CreateProducer, e))?;
        let ctx: *const AckContext = &**producer.context();
        // SAFETY: the client handle is live; `rd_kafka_queue_get_main` returns a new handle,
        // destroyed in `Drop`. The context lives in an `Arc` held by the client, so its
        // address is stable for the producer's life, and the callback is disabled in `Drop`
        // before the producer goes.
        let queue = unsafe {
            let q = rdsys::rd_kafka_queue_get_main(producer.client().native_ptr());
            rdsys::rd_kafka_queue_cb_event_enable(q, Some(queue_nonempty), ctx as *mut c_void);
            MainQueue(q)
        };
        Ok(Outbox {
            producer: Arc::new(producer),
            queue,
            tags: VecDeque::new(),
            first_id: 1,
            topics: Mutex::new(Vec::new()),
            transactional_id: config.get("transactional.id").map(str::to_string),
        })
    }

    pub(crate) fn producer(&self) -> &BaseProducer<AckContext> {
        &self.producer
    }

    /// Initialises transactions (`rd_kafka_init_transactions`) once a broker learned from
    /// the cluster's metadata is connected.
    ///
    /// A new producer's first connection is to a bootstrap address; librdkafka replaces it by
    /// the broker the metadata names, and if its transaction state machine asks for the
    /// coordinator in between it finds "no brokers available for transactions" and retries
    /// only on a fixed 500 ms timer (`rd_kafka_txn_coord_query`). That made one stage start
    /// in three take 0.5 s longer (init 507-544 ms against 36-70 ms). A metadata request for
    /// the brokers alone (no topics) first waits for a usable connection and learns the
    /// cluster; then the coordinator query finds a broker up. A failed metadata request is
    /// left to `init_transactions`, which reports the real error.
    ///
    /// # Errors
    /// [`KafkaError::Client`](parsley_task::error::KafkaError::Client) when transactions cannot be
    /// initialised within `timeout`.
    pub(crate) fn init_transactions(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let deadline = started + timeout;
        // In short steps: a failure to authenticate or to set up TLS arrives as an error
        // event in the main queue, served between the steps (module docs of `security`).
        let err = loop {
            let step = WATCH_STEP.min(deadline.saturating_duration_since(Instant::now()));
            let mut metadata: *const rdsys::rd_kafka_metadata = std::ptr::null();
            // SAFETY: the client handle is live; with `all_topics = 0` and no topic handle the
            // request asks for brokers only. A returned metadata object is destroyed once,
            // here.
            let err = unsafe {
                let err = rdsys::rd_kafka_metadata(
                    self.producer.client().native_ptr(),
                    0,
                    std::ptr::null_mut(),
                    &mut metadata,
                    step.as_millis().max(1) as i32,
                );
                if !metadata.is_null() {
                    rdsys::rd_kafka_metadata_destroy(metadata);
                }
                err
            };
            self.serve();
            if let Some(e) = self.ctx().watch.error() {
                return Err(e);
            }
            if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                || Instant::now() >= deadline
            {
                break err;
            }
        };
        tracing::debug!(
            error = ?RDKafkaErrorCode::from(err),
            took_us = started.elapsed().as_micros() as u64,
            "producer connected to the cluster"
        );
        self.init_in_slices(started + timeout, timeout)
    }

    /// `rd_kafka_init_transactions` until `deadline`, in slices of
    /// [`INIT_SLICE`](crate::client_log::INIT_SLICE): librdkafka resumes an init whose call
    /// timed out, and the retriable error of a slice says what it waits for, which is logged
    /// once at INFO per cause (`client_log::init_wait`; `timeout` is the whole init's).
    fn init_in_slices(&self, deadline: Instant, timeout: Duration) -> Result<()> {
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(crate::client_log::INIT_SLICE);
            match self.producer.init_transactions(slice) {
                Err(KafkaError::Transaction(e)) if e.is_retriable() && left > slice => {
                    let code = e.code();
                    if !said.contains(&code)
                        && let Some(notice) = crate::client_log::init_wait(code, timeout)
                    {
                        said.push(code);
                        tracing::info!(
                            transactional_id = self.transactional_id.as_deref().unwrap_or(""),
                            code = ?code,
                            "{notice}"
                        );
                    }
                }
                result => {
                    return result.map_err(|e| {
                        // A failure to authenticate or to set up TLS explains it.
                        self.serve();
                        self.ctx()
                            .watch
                            .explain(crate::client_error::kafka(Operation::InitTransactions, e))
                    });
                }
            }
        }
    }

    /// The producer, for a helper thread that commits while the stream thread goes on
    /// ([`Outbox::commit_served`]). Nothing may be sent until that commit returns.
    pub(crate) fn shared_producer(&self) -> Arc<BaseProducer<AckContext>> {
        Arc::clone(&self.producer)
    }

    fn ctx(&self) -> &AckContext {
        self.producer.context()
    }

    /// Events waiting in the producer's main queue.
    fn queued(&self) -> usize {
        // SAFETY: the queue handle is live for as long as `self`.
        unsafe { rdsys::rd_kafka_queue_length(self.queue.0) }
    }

    /// Serves what waits in the producer's main queue now, without blocking: delivery
    /// reports go to the context's callback on this thread, errors and logs to rdkafka's
    /// handlers.
    pub(crate) fn serve(&self) {
        for _ in 0..self.queued() {
            self.producer.poll(Duration::ZERO);
        }
    }

    /// Serves the main queue until `done` holds or `timeout` passes, blocking while the
    /// queue is empty (module docs); `false` on the timeout.
    pub(crate) fn wait_until(&self, timeout: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            self.serve();
            if done(self) {
                return true;
            }
            if self.queued() > 0 {
                // More arrived while serving: the queue did not go empty, so no wake-up
                // would come for it.
                if Instant::now() >= deadline {
                    return false;
                }
                continue;
            }
            if !self.ctx().wait_signal(deadline) {
                self.serve();
                return done(self);
            }
        }
    }

    /// Serves the reports until `done` holds, blocking while the queue is empty: for a helper
    /// thread's call that waits for reports to be served, which calls
    /// [`AckContext::signal`] when it returns.
    pub(crate) fn serve_until(&self, done: impl Fn() -> bool) {
        while !self.wait_until(Duration::from_secs(3600), |_| done()) {}
    }

    /// Runs `call` (a librdkafka call that waits for delivery reports to be served) on a
    /// helper thread while this thread serves the reports, and returns its result.
    fn serving_while<T: Send>(
        &self,
        call: impl FnOnce(&BaseProducer<AckContext>) -> T + Send,
    ) -> T {
        let finished = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let helper = scope.spawn(|| {
                let result = call(&self.producer);
                finished.store(true, Ordering::Release);
                self.ctx().signal();
                result
            });
            // The call has its own timeout; serve until it returns.
            self.serve_until(|| finished.load(Ordering::Acquire));
            match helper.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Sends one record to an explicit partition with the stamp header (none for an empty
    /// `stamp`: a tick), `extra` headers (whose values may be null) and record timestamp
    /// `timestamp` (ms since the epoch; `None`: the producer's clock). A `None` key is a record
    /// without a key, a `None` value a tombstone. When librdkafka's queue is full it waits for acknowledgements to make room.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        topic: &str,
        tag: SendTag,
        key: Option<&[u8]>,
        value: Option<Vec<u8>>,
        stamp: &[u8],
        extra: &[(&str, Option<&[u8]>)],
        timestamp: Option<i64>,
        timeout: Duration,
    ) -> Result<()> {
        let topics = self
            .topics
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let rkt = topic_handle(&self.producer, topics, topic, tag.channel)?;
        // Header names as C strings: the stamp's is a constant; the extra ones (dead letters
        // only) are made here.
        let extra_names = extra
            .iter()
            .map(|(k, _)| CString::new(*k))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| {
                Error::Kafka(error::KafkaError::Send {
                    topic: topic.to_string(),
                    channel: Box::new(tag.channel),
                    source: Box::new(crate::client_error::client_error(KafkaError::from(e))),
                })
            })?;
        let stamp_only = [(STAMP_HEADER_C, Some(stamp))];
        // An encoded stamp is never empty: an empty one is no header.
        let stamp_header = &stamp_only[..usize::from(!stamp.is_empty())];
        let with_extra: Vec<(&CStr, Option<&[u8]>)>;
        let headers: &[(&CStr, Option<&[u8]>)] = if extra.is_empty() {
            stamp_header
        } else {
            with_extra = stamp_header
                .iter()
                .copied()
                .chain(
                    extra_names
                        .iter()
                        .map(CString::as_c_str)
                        .zip(extra.iter().map(|(_, v)| *v)),
                )
                .collect();
            &with_extra
        };
        let mut id = self.first_id + self.tags.len() as u64;
        if id as usize == UNTAGGED {
            // Only where `usize` is narrower than the ids: skip the id that would read as
            // untagged.
            self.tags.push_back(None);
            id += 1;
        }
        // The buffer stays where it is when the `Vec` moves into the queue.
        let buffer = value.as_ref().map(|v| (v.as_ptr(), v.len()));
        self.tags.push_back(Some(Pending {
            tag,
            _value: value,
            timestamp,
        }));
        // SAFETY: `ptr` and `len` describe the buffer now owned by the queue entry, which is
        // neither changed nor dropped until the send's report is drained (module docs), or
        // right below when the send is refused.
        let value = buffer.map(|(ptr, len)| unsafe { std::slice::from_raw_parts(ptr, len) });
        let record = Produce {
            rkt,
            partition: tag.channel.partition,
            key,
            value,
            copy_value: false,
            opaque: id as usize,
            timestamp,
            headers,
        };
        let sent = self.enqueue(&record, topic, tag.channel, timeout);
        if sent.is_err() {
            // Not handed to librdkafka: no report will come.
            self.tags.pop_back();
        }
        sent
    }

    /// Sends a changelog record (no stamp; `None` is a tombstone) in the open transaction; with
    /// `name_writer` (a transaction's first on a partition: `open_transaction`), naming the
    /// producer's transactional id in a header.
    pub(crate) fn send_changelog(
        &self,
        channel: Channel,
        topic: &str,
        key: &[u8],
        value: Option<&[u8]>,
        name_writer: bool,
        timeout: Duration,
    ) -> Result<()> {
        let rkt = {
            let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
            topic_handle(&self.producer, &mut topics, topic, channel)?
        };
        let writer = self
            .transactional_id
            .as_deref()
            .filter(|_| name_writer)
            .map(|id| [(TXN_HEADER_C, Some(id.as_bytes()))]);
        let record = Produce {
            rkt,
            partition: channel.partition,
            key: Some(key),
            value,
            copy_value: true,
            opaque: UNTAGGED,
            timestamp: None,
            headers: writer.as_ref().map_or(&[][..], |h| &h[..]),
        };
        self.enqueue(&record, topic, channel, timeout)
    }

    /// Hands `record` to the producer, serving delivery reports while its queue is full.
    fn enqueue(
        &self,
        record: &Produce<'_>,
        topic: &str,
        channel: Channel,
        timeout: Duration,
    ) -> Result<()> {
        // Read only once the queue is full: most sends never look at the clock.
        let mut deadline = None;
        loop {
            self.ctx().outstanding.fetch_add(1, Ordering::Relaxed);
            match self.produce(record) {
                Ok(()) => return Ok(()),
                Err(code) => {
                    self.ctx().outstanding.fetch_sub(1, Ordering::Relaxed);
                    if code != RDKafkaErrorCode::QueueFull {
                        return Err(Error::Kafka(error::KafkaError::Send {
                            topic: topic.to_string(),
                            channel: Box::new(channel),
                            source: Box::new(crate::client_error::client_error(
                                KafkaError::MessageProduction(code),
                            )),
                        }));
                    }
                    // Queue full: serve delivery reports until one makes room.
                    let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    let before = self.ctx().reports.load(Ordering::Relaxed);
                    if remaining.is_zero()
                        || !self.wait_until(remaining, |o| {
                            o.ctx().reports.load(Ordering::Relaxed) != before
                        })
                    {
                        return Err(Error::Kafka(error::KafkaError::Timeout {
                            what: format!("room in the producer queue for {topic}"),
                            timeout,
                        }));
                    }
                }
            }
        }
    }

    /// One `rd_kafka_produceva` call: librdkafka copies key and headers, and the value when
    /// `record.copy_value` (`RD_KAFKA_MSG_F_COPY`); else the value must outlive the send's
    /// report.
    fn produce(&self, record: &Produce<'_>) -> std::result::Result<(), RDKafkaErrorCode> {
        use rdsys::rd_kafka_vtype_t as T;
        const FIXED: usize = 7;
        let vu =
            |vtype: T, u: rdsys::rd_kafka_vu_s__bindgen_ty_1| rdsys::rd_kafka_vu_t { vtype, u };
        let mem = |bytes: Option<&[u8]>| rdsys::rd_kafka_vu_s__bindgen_ty_1 {
            mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                ptr: bytes.map_or(std::ptr::null_mut(), |b| b.as_ptr() as *mut c_void),
                size: bytes.map_or(0, <[u8]>::len),
            },
        };
        let fixed = [
            vu(
                T::RD_KAFKA_VTYPE_RKT,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 { rkt: record.rkt },
            ),
            vu(
                T::RD_KAFKA_VTYPE_PARTITION,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    i32_: record.partition,
                },
            ),
            vu(
                T::RD_KAFKA_VTYPE_MSGFLAGS,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    i: if record.copy_value {
                        rdsys::RD_KAFKA_MSG_F_COPY
                    } else {
                        0
                    },
                },
            ),
            vu(T::RD_KAFKA_VTYPE_VALUE, mem(record.value)),
            vu(T::RD_KAFKA_VTYPE_KEY, mem(record.key)),
            vu(
                T::RD_KAFKA_VTYPE_OPAQUE,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    ptr: record.opaque as *mut c_void,
                },
            ),
            vu(
                T::RD_KAFKA_VTYPE_TIMESTAMP,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    i64_: record.timestamp.unwrap_or(0),
                },
            ),
        ];
        // The headers as one list for librdkafka to take over, sized for them (a
        // `RD_KAFKA_VTYPE_HEADER` per header would make it start a list of eight).
        // SAFETY: `rd_kafka_headers_new` returns a new list, which `rd_kafka_header_add`
        // copies each name (NUL-terminated, `-1`) and value into; it fails only on a read-only
        // list (a consumed record's), never on a new one, so its result is not looked at.
        let headers = (!record.headers.is_empty()).then(|| unsafe {
            let list = rdsys::rd_kafka_headers_new(record.headers.len());
            for (name, value) in record.headers {
                let (ptr, len) = value.map_or((std::ptr::null(), 0), |v| {
                    (v.as_ptr() as *const c_void, v.len())
                });
                rdsys::rd_kafka_header_add(list, name.as_ptr(), -1, ptr, len as isize);
            }
            list
        });
        let mut vus = [fixed[0]; FIXED + 1];
        vus[..FIXED].copy_from_slice(&fixed);
        let vus: &[rdsys::rd_kafka_vu_t] = match headers {
            Some(list) => {
                vus[FIXED] = vu(
                    T::RD_KAFKA_VTYPE_HEADERS,
                    rdsys::rd_kafka_vu_s__bindgen_ty_1 { headers: list },
                );
                &vus
            }
            None => &vus[..FIXED],
        };
        // SAFETY: the client handle and `rkt` (a handle of this client, destroyed only in
        // `Drop`) are live; every pointer in `vus` points into `record` or to the header list,
        // which outlive the call; librdkafka copies the key, and the value when asked
        // (`RD_KAFKA_MSG_F_COPY`), else the caller keeps it alive until the report. On
        // success librdkafka owns the header list; on failure it stays ours and is destroyed
        // here, as is the returned error object.
        unsafe {
            let err = rdsys::rd_kafka_produceva(
                self.producer.client().native_ptr(),
                vus.as_ptr(),
                vus.len(),
            );
            if err.is_null() {
                return Ok(());
            }
            if let Some(list) = headers {
                rdsys::rd_kafka_headers_destroy(list);
            }
            let code = rdsys::rd_kafka_error_code(err);
            rdsys::rd_kafka_error_destroy(err);
            Err(code.into())
        }
    }

    /// Sends everything queued now, without waiting out `linger.ms`, and waits until every
    /// send so far has a delivery report. `rd_kafka_flush` makes librdkafka ignore the linger
    /// while it runs (a commit wants its last batch on the wire at once); it waits for the
    /// reports to be served, which this thread does meanwhile (module docs).
    pub(crate) fn flush(&self, timeout: Duration) -> Result<()> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let err = self.serving_while(|producer| {
            // SAFETY: the handle is a live producer for as long as `producer` is borrowed.
            unsafe { rdsys::rd_kafka_flush(producer.client().native_ptr(), ms) }
        });
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(Error::Kafka(error::KafkaError::Timeout {
                what: "flushing the producer".into(),
                timeout,
            }));
        }
        self.wait_acked(timeout)
    }

    /// Waits until every send so far has a delivery report, serving the reports.
    pub(crate) fn wait_acked(&self, timeout: Duration) -> Result<()> {
        let outstanding = |o: &Self| o.ctx().outstanding.load(Ordering::Relaxed);
        if !self.wait_until(timeout, |o| outstanding(o) == 0) {
            return Err(Error::Kafka(error::KafkaError::Timeout {
                what: format!("acknowledgement of {} send(s)", outstanding(self)),
                timeout,
            }));
        }
        Ok(())
    }

    /// Aborts the open transaction (librdkafka purges what is queued and waits for the
    /// reports of the purged sends, which this thread serves meanwhile).
    pub(crate) fn abort_transaction(&self, timeout: Duration) -> KafkaResult<()> {
        self.serving_while(|producer| producer.abort_transaction(timeout))
    }

    /// Serves the delivery reports waiting now (without blocking) and moves every report
    /// recorded so far into `acks` (cleared first), each with the tag of its send. The two
    /// vectors trade places: a caller keeping `acks` across drains allocates nothing.
    pub(crate) fn drain_into(&mut self, acks: &mut Vec<Ack>) {
        self.serve();
        acks.clear();
        std::mem::swap(acks, &mut *self.ctx().acks.lock().expect("ack state"));
        for ack in acks.iter_mut() {
            if ack.id == UNTAGGED {
                continue;
            }
            let index = ack.id.wrapping_sub(self.first_id as usize);
            // Dropping the entry frees the value: librdkafka is done with it.
            let pending = self.tags.get_mut(index).and_then(Option::take);
            debug_assert!(
                pending.is_some(),
                "a report for send id {} without a send",
                ack.id
            );
            if let (Err(f), Some(p)) = (ack.result.as_mut(), &pending) {
                f.shape.timestamp = f.shape.timestamp.or(p.timestamp);
            }
            ack.tag = pending.map(|p| p.tag);
        }
        while self.tags.front().is_some_and(Option::is_none) {
            self.tags.pop_front();
            self.first_id += 1;
        }
    }

    /// Drops the delivery reports recorded so far and forgets every send: after an abort,
    /// once every send is reported.
    pub(crate) fn discard(&mut self) {
        self.ctx().acks.lock().expect("ack state").clear();
        self.first_id += self.tags.len() as u64;
        self.tags.clear();
    }

    /// Commits the open transaction once every send of it is acknowledged.
    ///
    /// `rdkafka`'s `commit_transaction` first calls its `flush`, which polls the producer's
    /// queue in 100 ms steps and so adds up to 100 ms to every commit with sends still in
    /// flight. Here the acknowledgements are awaited first ([`Outbox::flush`]), and
    /// `rd_kafka_commit_transaction` (whose own flush then finds nothing outstanding) is
    /// called directly.
    pub(crate) fn commit_transaction(&self, timeout: Duration) -> Result<()> {
        self.flush(timeout)?;
        Self::commit_served(&self.producer, timeout)
    }

    /// Commits the open transaction of `producer` (`rd_kafka_commit_transaction`). Callable
    /// from any thread; its own flush waits for the delivery reports of every send, so the
    /// sends are either acknowledged already ([`Outbox::flush`]) or the outbox's owning thread
    /// serves their reports until this returns ([`Outbox::serve_until`]).
    pub(crate) fn commit_served(
        producer: &BaseProducer<AckContext>,
        timeout: Duration,
    ) -> Result<()> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the handle is a live producer; the returned error object (if any) is
        // consumed and destroyed by `transaction_result`.
        unsafe {
            transaction_result(
                Operation::CommitTransaction,
                rdsys::rd_kafka_commit_transaction(producer.client().native_ptr(), ms),
            )
        }
    }
}

/// The producer's handle of topic `topic`, made on its first send (`channel` names the
/// send in an error).
fn topic_handle(
    producer: &BaseProducer<AckContext>,
    topics: &mut Vec<TopicHandle>,
    topic: &str,
    channel: Channel,
) -> Result<*mut rdsys::rd_kafka_topic_t> {
    if let Some(t) = topics.iter().find(|t| &*t.name == topic) {
        return Ok(t.rkt);
    }
    let refused = |source: KafkaError| {
        Error::Kafka(error::KafkaError::Send {
            topic: topic.to_string(),
            channel: Box::new(channel),
            source: Box::new(crate::client_error::client_error(source)),
        })
    };
    let name = CString::new(topic).map_err(|e| refused(KafkaError::from(e)))?;
    // SAFETY: the client handle is live; a null configuration takes the producer's default
    // topic configuration. The handle is destroyed in `Drop`.
    let rkt = unsafe {
        rdsys::rd_kafka_topic_new(
            producer.client().native_ptr(),
            name.as_ptr(),
            std::ptr::null_mut(),
        )
    };
    if rkt.is_null() {
        // SAFETY: reads this thread's last librdkafka error; no pointer involved.
        let code = unsafe { rdsys::rd_kafka_last_error() };
        return Err(refused(KafkaError::MessageProduction(code.into())));
    }
    topics.push(TopicHandle {
        name: topic.into(),
        rkt,
    });
    Ok(rkt)
}

/// Turns a librdkafka transactional API result into a `Result`, destroying the error object.
///
/// # Safety
/// `err` is null or an error object returned by librdkafka that nobody else will destroy.
unsafe fn transaction_result(
    operation: Operation,
    err: *mut rdsys::rd_kafka_error_t,
) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: `err` is a valid error object (caller's contract), destroyed exactly once here.
    unsafe {
        let message = std::ffi::CStr::from_ptr(rdsys::rd_kafka_error_string(err))
            .to_string_lossy()
            .into_owned();
        let e = Error::Kafka(error::KafkaError::Transaction {
            operation,
            code: crate::client_error::code(RDKafkaErrorCode::from(rdsys::rd_kafka_error_code(
                err,
            ))),
            message,
            fatal: rdsys::rd_kafka_error_is_fatal(err) != 0,
            requires_abort: rdsys::rd_kafka_error_txn_requires_abort(err) != 0,
        });
        rdsys::rd_kafka_error_destroy(err);
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_report_stays_small() {
        // One per send: the failure (error and record shape, over 100 bytes) is boxed.
        assert!(std::mem::size_of::<Ack>() <= 80);
        assert!(std::mem::size_of::<Failed>() > 100);
    }

    #[test]
    fn the_c_header_names_are_the_header_names() {
        assert_eq!(TXN_HEADER_C.to_str().unwrap(), TXN_HEADER);
    }

    #[test]
    fn the_c_stamp_header_name_is_the_stamp_header() {
        assert_eq!(STAMP_HEADER_C.to_str(), Ok(parsley_clock::STAMP_HEADER));
    }

    #[test]
    fn with_no_broker_init_transactions_fails_within_its_timeout_naming_the_step() {
        // Nothing listens on port 1: the metadata request waits out the timeout, and the
        // initialisation gets what is left of it (none), so the whole call ends near the
        // timeout, with the initialisation's error, not the metadata request's.
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("transactional.id", "parsley-outbox-no-broker")
            .set("log_level", "0");
        let outbox = Outbox::new(&config, None).unwrap();
        let timeout = Duration::from_millis(500);
        let started = Instant::now();
        let err = outbox.init_transactions(timeout).unwrap_err();
        let took = started.elapsed();
        match &err {
            Error::Kafka(error::KafkaError::Client { operation, .. }) => {
                assert_eq!(operation, "initialising transactions")
            }
            other => panic!("expected the initialisation's error, got {other:?}"),
        }
        assert!(
            took < timeout * 10,
            "init_transactions took {took:?} with a {timeout:?} timeout"
        );
    }
}
