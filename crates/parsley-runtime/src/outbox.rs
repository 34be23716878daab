//! The producing side shared by stage tasks and plain causal producers: a librdkafka producer
//! whose acknowledgements are collected as evidence.
//!
//! Every stamped send is identified by a send id, a plain `usize` handed to librdkafka as its
//! delivery opaque (no allocation per send); the outbox keeps the [`SendTag`] (task, channel,
//! send sequence) of each id in a queue of sends awaiting their report, in id order.
//!
//! Sends go to librdkafka's `rd_kafka_produceva` directly, not through rdkafka's
//! `BaseProducer::send`: they name their topic by a handle made on the topic's first send
//! (rdkafka copies the name into a new C string per send, and librdkafka then looks it up
//! under the client's lock). The calls themselves, the main queue's callback and the handles
//! are in [`crate::librdkafka::producer`], behind safe wrappers; this module has no `unsafe`.
//!
//! # Delivery reports are served by the outbox's own thread
//! There is no polling thread: librdkafka's delivery reports wait in the producer's main
//! queue until the thread that owns the outbox serves them — without blocking in
//! [`Outbox::drain`] (once per poll batch of a stage), and with a blocking wait whenever it
//! needs reports to go on (a full producer queue, [`Outbox::flush`], [`Outbox::wait_acked`]).
//! A message is then allocated, reported and freed on one thread, and no lock is contended
//! per report. The blocking wait sleeps until a report arrives, not in fixed steps: librdkafka
//! calls [`QueueWake::queue_nonempty`] (`rd_kafka_queue_cb_event_enable`) whenever the main queue goes
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
//! Invariant of the id queue (the ledger of [`native::Producer`]): entry `i` belongs to send id
//! `first_id + i`; an entry becomes `None` when its report is drained, and leading `None`s are
//! popped, so the queue holds the sends from the oldest unreported one on (reports of
//! different partitions arrive out of order). Id 0 marks an untagged send (a changelog write).
//!
//! # A stamped send's value is not copied
//! librdkafka copies a value it is given with `RD_KAFKA_MSG_F_COPY`; a stamped send's value
//! is instead lent by pointer (no flag) and its buffer kept in the id queue beside the tag
//! until the send's report is drained, when it is dropped. librdkafka reads the value until it
//! reports the send (retries included) and never after, and without `RD_KAFKA_MSG_F_FREE` it
//! does not free it; a report is recorded by the delivery callback, so it is drained after
//! librdkafka's last use. The ledger owning the buffers ([`native::Producer`]) frees one only
//! on the report of the message holding it, and the rest only once librdkafka is destroyed
//! (leaking them while a commit's helper thread still holds the producer);
//! [`Outbox::discard`] runs only once every send is reported. A 1 KiB
//! record is thus copied once on its way through a stage (out of the consumer's buffer), as
//! in a plain consume-produce loop, not twice. Changelog writes borrow their bytes and are
//! copied.

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use parsley_clock::Channel;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer as _, ProducerContext};

use crate::clients::ClientRole;
use crate::config::{StatisticsSink, forward_statistics};
use crate::librdkafka::producer::{self as native, QueueWake, Record, Reported, UNTAGGED};
use crate::refusal::RecordShape;
use crate::security::{Endpoint, SecurityWatch, WATCH_STEP};
use parsley_task::error;
use parsley_task::error::Operation;
use parsley_task::error::{Error, Result};
use parsley_task::topic::SendTag;

/// The producer's client, main queue and topic handles.
type Io = native::Io<AckContext>;

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
    /// The send id librdkafka reported it with, and the value it reported; its tag is looked
    /// up by [`Outbox::drain_into`].
    report: Reported,
}

/// Why a send failed, from its delivery report.
#[derive(Debug)]
pub struct Failed {
    /// librdkafka's error.
    pub error: KafkaError,
    /// What the broker's limits look at in the record (sizes, timestamp).
    pub shape: RecordShape,
}

/// [`parsley_clock::STAMP_HEADER`] as librdkafka takes a header name.
const STAMP_HEADER_C: &CStr = c"ps";

/// The header naming the transactional id of the producer that wrote a changelog record.
pub(crate) const TXN_HEADER: &str = "parsley.txn";
/// [`TXN_HEADER`] as librdkafka takes a header name.
const TXN_HEADER_C: &CStr = c"parsley.txn";

/// What the outbox keeps beside a stamped send's value until its report (module docs).
struct Pending {
    tag: SendTag,
    /// The record timestamp it was sent with (`None`: the producer's clock): librdkafka's
    /// report of a failed send does not give it back.
    timestamp: Option<i64>,
}

/// Producer context that collects delivery reports.
pub(crate) struct AckContext {
    /// Reports recorded and not drained yet. Recorded by whichever thread serves the queue
    /// (the outbox's owner, or rdkafka's own flush when the producer is dropped).
    acks: Mutex<Vec<Ack>>,
    /// Delivery reports recorded since the producer was created.
    reports: AtomicU64,
    /// Sends without a delivery report yet.
    outstanding: AtomicU64,
    /// Set by [`QueueWake::queue_nonempty`] (and by a helper thread that is done); cleared by
    /// the waiter.
    wake: Mutex<Wake>,
    woken: Condvar,
    /// Where librdkafka's statistics go, when asked for.
    statistics: Option<StatisticsSink>,
    /// A failure to authenticate or to set up TLS, when librdkafka reported one.
    watch: SecurityWatch,
    /// Topics whose partitions the broker refused to add to a transaction for want of an ACL
    /// (`client_log::refused_partition`): a purged send to one of them is that refusal.
    refused: Mutex<Vec<String>>,
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
impl QueueWake for AckContext {
    fn queue_nonempty(&self) {
        self.signal();
    }
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
        if let Some(topic) = crate::client_log::refused_partition(fac, log_message) {
            let mut refused = self.refused.lock().expect("refused topics");
            if !refused.iter().any(|t| t == topic) {
                refused.push(topic.to_string());
            }
        }
        crate::client_log::forward(level, fac, log_message);
    }
}

impl ProducerContext for AckContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, id: usize) {
        let (m, result) = match result {
            Ok(m) => (m, Ok(m.offset())),
            // Only a failure is measured: which record of a refused batch explains it.
            Err((e, m)) => {
                // Purged because the broker refused its partition a place in the transaction
                // (the refusal's line came first, on the same queue): that refusal.
                let refused = e.rdkafka_error_code() == Some(RDKafkaErrorCode::PurgeQueue)
                    && self
                        .refused
                        .lock()
                        .expect("refused topics")
                        .iter()
                        .any(|t| t == m.topic());
                let error = if refused {
                    KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed)
                } else {
                    e.clone()
                };
                (
                    m,
                    Err(Box::new(Failed {
                        error,
                        shape: RecordShape::of_message(m),
                    })),
                )
            }
        };
        let ack = Ack {
            tag: None,
            partition: m.partition(),
            result,
            report: Reported::of(m, id),
        };
        self.acks.lock().expect("ack state").push(ack);
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        self.reports.fetch_add(1, Ordering::Relaxed);
    }
}

/// A producer plus its collected acknowledgements.
pub(crate) struct Outbox {
    /// The client (shared only with the helper thread of an overlapped commit,
    /// [`Outbox::commit_served`], for the length of that commit), its main queue and topic
    /// handles, and the values of stamped sends awaiting their report, each with its
    /// [`Pending`] (module docs).
    producer: native::Producer<AckContext, Pending>,
    /// The producer's `transactional.id`, if it has one (named in what its init waits for).
    transactional_id: Option<String>,
}

/// Serves what waits in the producer's main queue now, without blocking: delivery reports go
/// to the context's callback on this thread, errors and logs to rdkafka's handlers.
fn serve(io: &Io) {
    for _ in 0..io.queued() {
        io.client().poll(Duration::ZERO);
    }
}

/// Serves the main queue until `done` holds or `timeout` passes, blocking while the queue is
/// empty (module docs); `false` on the timeout.
fn wait_until(io: &Io, timeout: Duration, done: impl Fn(&AckContext) -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let ctx = io.client().context();
    let mut nudge = Nudge::new();
    loop {
        serve(io);
        if done(ctx) {
            return true;
        }
        if io.queued() > 0 {
            // More arrived while serving: the queue did not go empty, so no wake-up would
            // come for it.
            if Instant::now() >= deadline {
                return false;
            }
            continue;
        }
        let until = nudge.next.min(deadline);
        if !ctx.wait_signal(until) {
            if until < deadline {
                nudge.metadata(io);
                continue;
            }
            serve(io);
            return done(ctx);
        }
    }
}

/// How long a wait for delivery reports goes on, sends outstanding, before the producer asks
/// for fresh metadata (and again at this interval while it waits).
const NUDGE_EVERY: Duration = Duration::from_secs(1);

/// The metadata nudge of a long wait for reports. librdkafka refreshes a partition's leader
/// when its connection to the leader fails, but the controller fences a dead leader only after
/// `broker.session.timeout.ms`: the refresh can still name the dead node, and librdkafka then
/// asks again only at `topic.metadata.refresh.interval.ms` (minutes), so the sends to that
/// partition wait until they time out (`message.timeout.ms`) although another replica leads
/// it seconds after the death. Every metadata answer — an application's request too — updates
/// the leaders librdkafka sends to; so while a wait for reports lasts longer than
/// [`NUDGE_EVERY`] with sends outstanding, one metadata request (all topics, bounded by
/// [`NUDGE_EVERY`]) per interval moves them to the new leader as soon as the cluster elected
/// it. A healthy flush takes milliseconds and never asks.
struct Nudge {
    next: Instant,
}

impl Nudge {
    fn new() -> Self {
        Nudge {
            next: Instant::now() + NUDGE_EVERY,
        }
    }

    /// One metadata request when sends wait for their reports; the next in [`NUDGE_EVERY`].
    fn metadata(&mut self, io: &Io) {
        if io.client().context().outstanding.load(Ordering::Relaxed) > 0 {
            let asked = Instant::now();
            let answer = io.client().client().fetch_metadata(None, NUDGE_EVERY);
            tracing::debug!(
                ok = answer.is_ok(),
                took_ms = asked.elapsed().as_millis() as u64,
                "sends wait for their reports: metadata refreshed"
            );
        }
        self.next = Instant::now() + NUDGE_EVERY;
    }
}

/// Hands a record to the producer (`produce`: one attempt), serving delivery reports while
/// its queue is full.
fn enqueue(
    io: &Io,
    mut produce: impl FnMut() -> std::result::Result<(), RDKafkaErrorCode>,
    topic: &str,
    channel: Channel,
    timeout: Duration,
) -> Result<()> {
    let ctx = io.client().context();
    // Read only once the queue is full: most sends never look at the clock.
    let mut deadline = None;
    loop {
        ctx.outstanding.fetch_add(1, Ordering::Relaxed);
        match produce() {
            Ok(()) => return Ok(()),
            Err(code) => {
                ctx.outstanding.fetch_sub(1, Ordering::Relaxed);
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
                let before = ctx.reports.load(Ordering::Relaxed);
                if remaining.is_zero()
                    || !wait_until(io, remaining, |c| {
                        c.reports.load(Ordering::Relaxed) != before
                    })
                {
                    return Err(Error::Kafka(error::KafkaError::Timeout {
                        what: error::Awaited::QueueRoom {
                            topic: topic.to_string(),
                        },
                        timeout,
                    }));
                }
            }
        }
    }
}

/// `timeout` in whole milliseconds as librdkafka takes it (at most `i32::MAX`).
fn millis(timeout: Duration) -> i32 {
    timeout.as_millis().min(i32::MAX as u128) as i32
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
                refused: Mutex::new(Vec::new()),
            })
            .map_err(|e| crate::client_error::kafka(Operation::CreateProducer, e))?;
        Ok(Outbox {
            producer: native::Producer::new(producer),
            transactional_id: config.get("transactional.id").map(str::to_string),
        })
    }

    pub(crate) fn producer(&self) -> &BaseProducer<AckContext> {
        self.producer.io().client()
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
            let err = native::brokers_metadata(self.producer(), step.as_millis().max(1) as i32);
            self.serve();
            if let Some(e) = self.ctx().watch.error() {
                return Err(e);
            }
            if err.is_ok() || Instant::now() >= deadline {
                break err;
            }
        };
        tracing::debug!(
            error = ?err.err().unwrap_or(RDKafkaErrorCode::NoError),
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
            match self.producer().init_transactions(slice) {
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
    /// Puts the producer in librdkafka's fatal state with the broker's `INVALID_TXN_STATE`
    /// ([`ProducerFault::InvalidTxnStateAtCommit`](crate::ProducerFault::InvalidTxnStateAtCommit)).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn inject_invalid_txn_state(&self) {
        native::inject_fatal_error(
            self.producer(),
            rdkafka_sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_INVALID_TXN_STATE,
        );
    }

    pub(crate) fn shared_producer(&self) -> Arc<BaseProducer<AckContext>> {
        self.producer.io().shared()
    }

    fn ctx(&self) -> &AckContext {
        self.producer().context()
    }

    /// Serves what waits in the producer's main queue now, without blocking: delivery
    /// reports go to the context's callback on this thread, errors and logs to rdkafka's
    /// handlers.
    pub(crate) fn serve(&self) {
        serve(self.producer.io());
    }

    /// Serves the main queue until `done` holds or `timeout` passes, blocking while the
    /// queue is empty (module docs); `false` on the timeout.
    pub(crate) fn wait_until(&self, timeout: Duration, done: impl Fn(&AckContext) -> bool) -> bool {
        wait_until(self.producer.io(), timeout, done)
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
                let result = call(self.producer());
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
        let refused = |source: KafkaError| {
            Error::Kafka(error::KafkaError::Send {
                topic: topic.to_string(),
                channel: Box::new(tag.channel),
                source: Box::new(crate::client_error::client_error(source)),
            })
        };
        let handle = self.producer.topic_mut(topic).map_err(refused)?;
        // Header names as C strings: the stamp's is a constant; the extra ones (dead letters
        // only) are made here.
        let extra_names = extra
            .iter()
            .map(|(k, _)| CString::new(*k))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| refused(KafkaError::from(e)))?;
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
        let record = Record {
            topic: handle,
            partition: tag.channel.partition,
            key,
            timestamp,
            headers,
        };
        // The value is lent to librdkafka, not copied, and kept beside the tag until the
        // send's report is drained (module docs); not handed over, it is dropped at once.
        self.producer
            .send_lent(&record, value, Pending { tag, timestamp }, |attempt| {
                let io = attempt.io();
                enqueue(io, || attempt.produce(), topic, tag.channel, timeout)
            })
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
        let io = self.producer.io();
        let handle = io.topic(topic).map_err(|source| {
            Error::Kafka(error::KafkaError::Send {
                topic: topic.to_string(),
                channel: Box::new(channel),
                source: Box::new(crate::client_error::client_error(source)),
            })
        })?;
        let writer = self
            .transactional_id
            .as_deref()
            .filter(|_| name_writer)
            .map(|id| [(TXN_HEADER_C, Some(id.as_bytes()))]);
        let record = Record {
            topic: handle,
            partition: channel.partition,
            key: Some(key),
            timestamp: None,
            headers: writer.as_ref().map_or(&[][..], |h| &h[..]),
        };
        enqueue(
            io,
            || io.produce_copied(&record, value, UNTAGGED),
            topic,
            channel,
            timeout,
        )
    }

    /// Sends everything queued now, without waiting out `linger.ms`, and waits until every
    /// send so far has a delivery report. `rd_kafka_flush` makes librdkafka ignore the linger
    /// while it runs (a commit wants its last batch on the wire at once); it waits for the
    /// reports to be served, which this thread does meanwhile (module docs).
    pub(crate) fn flush(&self, timeout: Duration) -> Result<()> {
        let ms = millis(timeout);
        if self
            .serving_while(|producer| native::flush(producer, ms))
            .is_err()
        {
            return Err(Error::Kafka(error::KafkaError::Timeout {
                what: error::Awaited::Flush,
                timeout,
            }));
        }
        self.wait_acked(timeout)
    }

    /// Waits until every send so far has a delivery report, serving the reports.
    pub(crate) fn wait_acked(&self, timeout: Duration) -> Result<()> {
        let outstanding = |c: &AckContext| c.outstanding.load(Ordering::Relaxed);
        if !self.wait_until(timeout, |c| outstanding(c) == 0) {
            return Err(Error::Kafka(error::KafkaError::Timeout {
                what: error::Awaited::Acknowledgements {
                    outstanding: outstanding(self.ctx()),
                },
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
            if ack.report.id() == UNTAGGED {
                continue;
            }
            // Taking the entry frees the value: librdkafka is done with it.
            let pending = self.producer.take_reported(&ack.report);
            debug_assert!(
                pending.is_some(),
                "a report for send id {} without a send",
                ack.report.id()
            );
            if let (Err(f), Some(p)) = (ack.result.as_mut(), &pending) {
                f.shape.timestamp = f.shape.timestamp.or(p.timestamp);
            }
            ack.tag = pending.map(|p| p.tag);
        }
        self.producer.settle();
    }

    /// Drops the delivery reports recorded so far and forgets every send: after an abort,
    /// once every send is reported.
    pub(crate) fn discard(&mut self) {
        let reported = std::mem::take(&mut *self.ctx().acks.lock().expect("ack state"));
        for ack in &reported {
            self.producer.take_reported(&ack.report);
        }
        let leaked = self.producer.forget_lent();
        if leaked > 0 {
            tracing::warn!(
                sends = leaked,
                "sends forgotten before their delivery report: their values are leaked"
            );
        }
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
        Self::commit_served(self.producer(), timeout)
    }

    /// Commits the open transaction of `producer` (`rd_kafka_commit_transaction`). Callable
    /// from any thread; its own flush waits for the delivery reports of every send, so the
    /// sends are either acknowledged already ([`Outbox::flush`]) or the outbox's owning thread
    /// serves their reports until this returns ([`Outbox::serve_until`]).
    pub(crate) fn commit_served(
        producer: &BaseProducer<AckContext>,
        timeout: Duration,
    ) -> Result<()> {
        native::commit_transaction(producer, millis(timeout)).map_err(|e| {
            Error::Kafka(error::KafkaError::Transaction {
                operation: Operation::CommitTransaction,
                code: crate::client_error::code(e.code),
                message: e.message,
                fatal: e.fatal,
                requires_abort: e.requires_abort,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_report_stays_small() {
        // One per send: the failure (error and record shape, over 100 bytes) is boxed. 88
        // bytes: the report carries the address of the value it reports (8 bytes), which lets
        // the ledger free a lent value only on the report of the message that held it.
        assert!(std::mem::size_of::<Ack>() <= 88);
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
