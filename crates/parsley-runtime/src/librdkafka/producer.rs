//! The producer's side of librdkafka below the outbox: its main queue and the callback that
//! wakes a waiter when the queue fills, topic handles, sends through `rd_kafka_produceva`,
//! flush, commit and the brokers-only metadata request.
//!
//! A send names its topic by a handle made on the topic's first send ([`Io::topic`]): rdkafka
//! copies the name into a new C string per send, and librdkafka then looks it up under the
//! client's lock. A send's value is copied by librdkafka ([`Io::produce_copied`]), or lent to it
//! without a copy ([`Producer::send_lent`]): the [`Producer`] then keeps the buffer until the
//! send's delivery report is drained ([`Producer::take_reported`]), or until librdkafka is
//! destroyed.
//!
//! # Ownership while a commit's helper thread holds the producer
//! [`Io::shared`] hands out the client (an `Arc`) to a helper thread that commits while the
//! owner goes on. When the [`Producer`] is dropped, its queue and topic handles are destroyed
//! while the client is alive (its own `Arc` at least); if it held the last handle of the
//! client, librdkafka is destroyed (every message with it) and only then are the lent buffers
//! freed; if a helper thread still holds the client, librdkafka may still read the values of
//! unreported sends, so they are leaked rather than freed under it.

use std::collections::VecDeque;
use std::ffi::{CStr, CString, c_void};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{BaseProducer, Producer as _, ProducerContext};
use rdkafka_sys as rdsys;

/// The delivery opaque of a send that is not lent (a changelog write): no lent send has this
/// id.
pub(crate) const UNTAGGED: usize = 0;

/// A producer context that is told when the producer's main queue goes from empty to
/// non-empty.
pub(crate) trait QueueWake: Send + Sync {
    /// Called by librdkafka on one of its threads, with the queue's lock held: it must return
    /// quickly and must not call librdkafka (which would deadlock on that lock).
    fn queue_nonempty(&self);
}

/// librdkafka's callback for the main queue (`rd_kafka_queue_cb_event_enable`).
///
/// # Safety
/// `opaque` is the context `C` of the producer whose queue calls this: [`Io::new`] registers
/// it, and [`Io`]'s `Drop` disables the callback before the client (and so the context) can
/// be dropped.
unsafe extern "C" fn queue_nonempty<C: QueueWake>(
    _rk: *mut rdsys::rd_kafka_t,
    opaque: *mut c_void,
) {
    // SAFETY: see the function's contract.
    let ctx = unsafe { &*(opaque as *const C) };
    ctx.queue_nonempty();
}

/// Identities of [`Io`]s, so that a [`Topic`] is only used with the producer that made it.
static NEXT_IO: AtomicU64 = AtomicU64::new(1);

/// A topic handle of one producer, made on the topic's first send.
struct TopicHandle {
    name: Box<str>,
    rkt: *mut rdsys::rd_kafka_topic_t,
}

// SAFETY: librdkafka's topic handles may be used from any thread; the handle is only passed to
// librdkafka, never written through here.
unsafe impl Send for TopicHandle {}
// SAFETY: as above.
unsafe impl Sync for TopicHandle {}

/// A topic of one producer's sends ([`Io::topic`]): valid for as long as that producer's
/// [`Io`], which checks that it made it.
#[derive(Clone, Copy)]
pub(crate) struct Topic {
    rkt: *mut rdsys::rd_kafka_topic_t,
    io: u64,
}

/// One record as [`Io::produce_copied`] and [`Producer::send_lent`] hand it to librdkafka
/// (the value is given separately).
pub(crate) struct Record<'a> {
    pub topic: Topic,
    pub partition: i32,
    /// `None`: no key.
    pub key: Option<&'a [u8]>,
    /// ms since the epoch; `None`: the producer's clock.
    pub timestamp: Option<i64>,
    /// Header names and values (`None`: a header with a null value).
    pub headers: &'a [(&'a CStr, Option<&'a [u8]>)],
}

/// The error of a transactional call (`rd_kafka_error_t`), read and destroyed.
#[derive(Debug)]
pub(crate) struct TxnError {
    pub code: RDKafkaErrorCode,
    pub message: String,
    pub fatal: bool,
    pub requires_abort: bool,
}

/// The producer's main queue (delivery reports, errors, logs), as a handle of its own.
struct MainQueue(*mut rdsys::rd_kafka_queue_t);

// SAFETY: librdkafka's queue handles may be used from any thread.
unsafe impl Send for MainQueue {}
// SAFETY: as above; the handle is only read through (length, callbacks), never moved out, and
// destroyed once, in `Io`'s `Drop`, with exclusive access.
unsafe impl Sync for MainQueue {}

/// The client of a producer, its main queue (callback registered) and its topic handles:
/// what every send and wait needs, shared by reference (`&self`).
pub(crate) struct Io<C: ProducerContext<DeliveryOpaque = usize> + QueueWake> {
    client: Arc<BaseProducer<C>>,
    queue: MainQueue,
    /// Locked only by [`Io::topic`]; [`Io::topic_mut`] reads it without the lock.
    topics: Mutex<Vec<TopicHandle>>,
    id: u64,
}

impl<C: ProducerContext<DeliveryOpaque = usize> + QueueWake> Io<C> {
    fn new(client: BaseProducer<C>) -> Self {
        let ctx: *const C = &**client.context();
        // SAFETY: the client handle is live; `rd_kafka_queue_get_main` returns a new handle,
        // destroyed in `Drop`. The context lives in an `Arc` held by the client, so its
        // address is stable for the client's life, and the callback is disabled in `Drop`
        // before the client can go (it is a field, dropped after `Drop::drop`).
        let queue = unsafe {
            let q = rdsys::rd_kafka_queue_get_main(client.client().native_ptr());
            rdsys::rd_kafka_queue_cb_event_enable(q, Some(queue_nonempty::<C>), ctx as *mut c_void);
            MainQueue(q)
        };
        Io {
            client: Arc::new(client),
            queue,
            topics: Mutex::new(Vec::new()),
            id: NEXT_IO.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The producer.
    pub(crate) fn client(&self) -> &BaseProducer<C> {
        &self.client
    }

    /// The producer, for a helper thread (a commit while the owner goes on): see the module
    /// docs for what this means when the [`Producer`] is dropped.
    pub(crate) fn shared(&self) -> Arc<BaseProducer<C>> {
        Arc::clone(&self.client)
    }

    /// Events waiting in the producer's main queue (delivery reports, errors, logs).
    pub(crate) fn queued(&self) -> usize {
        // SAFETY: the queue handle is live for as long as `self`.
        unsafe { rdsys::rd_kafka_queue_length(self.queue.0) }
    }

    /// The handle of topic `name`, made on its first use (under the lock).
    ///
    /// # Errors
    /// A name with a NUL byte, or librdkafka's refusal to make the handle.
    pub(crate) fn topic(&self, name: &str) -> Result<Topic, KafkaError> {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        Self::find_or_make(&self.client, self.id, &mut topics, name)
    }

    /// [`Io::topic`] without the lock.
    ///
    /// # Errors
    /// As [`Io::topic`].
    pub(crate) fn topic_mut(&mut self, name: &str) -> Result<Topic, KafkaError> {
        let topics = self
            .topics
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        Self::find_or_make(&self.client, self.id, topics, name)
    }

    fn find_or_make(
        client: &BaseProducer<C>,
        io: u64,
        topics: &mut Vec<TopicHandle>,
        name: &str,
    ) -> Result<Topic, KafkaError> {
        if let Some(t) = topics.iter().find(|t| &*t.name == name) {
            return Ok(Topic { rkt: t.rkt, io });
        }
        let cname = CString::new(name).map_err(KafkaError::from)?;
        // SAFETY: the client handle is live; a null configuration takes the producer's
        // default topic configuration. The handle is destroyed in `Drop`, once.
        let rkt = unsafe {
            rdsys::rd_kafka_topic_new(
                client.client().native_ptr(),
                cname.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        if rkt.is_null() {
            // SAFETY: reads this thread's last librdkafka error; no pointer involved.
            let code = unsafe { rdsys::rd_kafka_last_error() };
            return Err(KafkaError::MessageProduction(code.into()));
        }
        topics.push(TopicHandle {
            name: name.into(),
            rkt,
        });
        Ok(Topic { rkt, io })
    }

    /// Sends `record` with `value` copied by librdkafka (`RD_KAFKA_MSG_F_COPY`) and delivery
    /// opaque `opaque` (one `rd_kafka_produceva` call; librdkafka copies key and headers too).
    ///
    /// # Errors
    /// librdkafka's code (`QueueFull` when its queue is full: the caller may serve reports
    /// and try again).
    pub(crate) fn produce_copied(
        &self,
        record: &Record<'_>,
        value: Option<&[u8]>,
        opaque: usize,
    ) -> Result<(), RDKafkaErrorCode> {
        self.produce(record, value, true, opaque)
    }

    /// One `rd_kafka_produceva` call. Without `copy_value` the value must stay alive and
    /// unchanged until librdkafka reports the send or is destroyed: only
    /// [`Producer::send_lent`] passes `false`, with a buffer its ledger owns.
    fn produce(
        &self,
        record: &Record<'_>,
        value: Option<&[u8]>,
        copy_value: bool,
        opaque: usize,
    ) -> Result<(), RDKafkaErrorCode> {
        if record.topic.io != self.id {
            // A handle of another producer (possibly destroyed): never passed to librdkafka.
            return Err(RDKafkaErrorCode::InvalidArgument);
        }
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
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    rkt: record.topic.rkt,
                },
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
                    i: if copy_value {
                        rdsys::RD_KAFKA_MSG_F_COPY
                    } else {
                        0
                    },
                },
            ),
            vu(T::RD_KAFKA_VTYPE_VALUE, mem(value)),
            vu(T::RD_KAFKA_VTYPE_KEY, mem(record.key)),
            vu(
                T::RD_KAFKA_VTYPE_OPAQUE,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    ptr: opaque as *mut c_void,
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
        // SAFETY: the client handle and the topic handle (this client's, checked above, and
        // destroyed only in `Drop`) are live; every pointer in `vus` points into `record` or
        // `value` or to the header list, which outlive the call; librdkafka copies the key,
        // and the value when asked (`RD_KAFKA_MSG_F_COPY`), else the caller keeps it alive
        // until the report (`produce`'s contract). On success librdkafka owns the header list;
        // on failure it stays ours and is destroyed here, as is the returned error object.
        unsafe {
            let err = rdsys::rd_kafka_produceva(
                self.client.client().native_ptr(),
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
}

impl<C: ProducerContext<DeliveryOpaque = usize> + QueueWake> Drop for Io<C> {
    fn drop(&mut self) {
        // SAFETY: the queue handle is live; after this call returns librdkafka calls no
        // callback any more (it calls it under the queue's lock, which this call takes), so
        // the context may be dropped with the client. The handle is destroyed exactly once.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue.0, None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.queue.0);
        }
        let topics = self
            .topics
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for t in topics.drain(..) {
            // SAFETY: each handle was made by `rd_kafka_topic_new` on this client, which is
            // still alive (the field drops after this body), and is destroyed once.
            unsafe { rdsys::rd_kafka_topic_destroy(t.rkt) };
        }
    }
}

/// A delivery report's proof of which buffer librdkafka was done with: made from the reported
/// message in the delivery callback ([`Reported::of`]) and handed to
/// [`Producer::take_reported`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reported {
    id: usize,
    /// The address of the reported message's value (0: none).
    value: usize,
}

impl Reported {
    /// The report of `message`, sent with delivery opaque `id`.
    pub(crate) fn of(message: &BorrowedMessage<'_>, id: usize) -> Self {
        Reported {
            id,
            value: message.payload().map_or(0, |v| v.as_ptr() as usize),
        }
    }

    /// The send's delivery opaque ([`UNTAGGED`] for a copied send).
    pub(crate) fn id(&self) -> usize {
        self.id
    }
}

/// A lent send awaiting its report: what the caller keeps with it, and its value.
struct Lent<T> {
    meta: T,
    value: Option<Vec<u8>>,
}

/// A producer and the values it holds without a copy: [`Io`] plus a ledger of lent sends.
///
/// Invariant of the ledger: `lent[i]` is the send with id `first_id + i`; every `Some` entry
/// was handed to librdkafka (a send it refused is removed at once); an entry becomes `None`
/// when its report is taken, and leading `None`s are removed by [`Producer::settle`]. No id
/// is [`UNTAGGED`].
pub(crate) struct Producer<C: ProducerContext<DeliveryOpaque = usize> + QueueWake, T> {
    /// Dropped by hand in `Drop`, before the ledger.
    io: ManuallyDrop<Io<C>>,
    lent: VecDeque<Option<Lent<T>>>,
    first_id: u64,
}

/// One attempt at a lent send, as [`Producer::send_lent`] hands it to its caller's loop.
pub(crate) struct Attempt<'a, C: ProducerContext<DeliveryOpaque = usize> + QueueWake> {
    io: &'a Io<C>,
    record: &'a Record<'a>,
    value: Option<&'a [u8]>,
    id: usize,
    handed: bool,
}

impl<'a, C: ProducerContext<DeliveryOpaque = usize> + QueueWake> Attempt<'a, C> {
    /// The producer, to serve its reports between attempts.
    pub(crate) fn io(&self) -> &'a Io<C> {
        self.io
    }

    /// Hands the send to librdkafka, its value without a copy. Once it has succeeded, a
    /// further call does nothing and returns `Ok`.
    ///
    /// # Errors
    /// librdkafka's code; the send was not taken and may be tried again.
    pub(crate) fn produce(&mut self) -> Result<(), RDKafkaErrorCode> {
        if self.handed {
            return Ok(());
        }
        self.io.produce(self.record, self.value, false, self.id)?;
        self.handed = true;
        Ok(())
    }
}

impl<C: ProducerContext<DeliveryOpaque = usize> + QueueWake, T> Producer<C, T> {
    /// Takes over `client`: registers the wake-up callback of its main queue.
    pub(crate) fn new(client: BaseProducer<C>) -> Self {
        Producer {
            io: ManuallyDrop::new(Io::new(client)),
            lent: VecDeque::new(),
            first_id: 1,
        }
    }

    /// The client, its queue and its topics.
    pub(crate) fn io(&self) -> &Io<C> {
        &self.io
    }

    /// As [`Io::topic_mut`].
    ///
    /// # Errors
    /// As [`Io::topic`].
    pub(crate) fn topic_mut(&mut self, name: &str) -> Result<Topic, KafkaError> {
        self.io.topic_mut(name)
    }

    /// Sends `record` with `value` lent to librdkafka (no copy) and `meta` kept beside it,
    /// under the next send id (its delivery opaque). `attempts` drives the send: it calls
    /// [`Attempt::produce`] until it succeeds or gives up, serving reports in between (a full
    /// queue). If no attempt succeeded the entry is removed (its value dropped: librdkafka
    /// never took it); otherwise it stays until its report ([`Producer::take_reported`]),
    /// whatever `attempts` returns.
    ///
    /// # Errors
    /// What `attempts` returns.
    pub(crate) fn send_lent<E>(
        &mut self,
        record: &Record<'_>,
        value: Option<Vec<u8>>,
        meta: T,
        attempts: impl FnOnce(&mut Attempt<'_, C>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut id = self.first_id + self.lent.len() as u64;
        if id as usize == UNTAGGED {
            // Only where `usize` is narrower than the ids: skip the id that would read as
            // untagged.
            self.lent.push_back(None);
            id += 1;
        }
        // The buffer stays where it is when the `Vec` moves into the ledger.
        self.lent.push_back(Some(Lent { meta, value }));
        let value = self
            .lent
            .back()
            .and_then(Option::as_ref)
            .and_then(|l| l.value.as_deref());
        let mut attempt = Attempt {
            io: &self.io,
            record,
            value,
            id: id as usize,
            handed: false,
        };
        let result = attempts(&mut attempt);
        if !attempt.handed {
            // Not handed to librdkafka: no report will come, nothing reads the value.
            self.lent.pop_back();
        }
        result
    }

    /// Takes the entry of the lent send `report` reports, dropping its value, and returns
    /// what was kept with it; `None` for a copied send, or a report without a lent send.
    ///
    /// The value is dropped only if `report` was made from the message that holds it (a
    /// non-empty value's address identifies it among live buffers); otherwise it is leaked,
    /// which never happens when each report is taken once.
    pub(crate) fn take_reported(&mut self, report: &Reported) -> Option<T> {
        if report.id == UNTAGGED {
            return None;
        }
        let index = report.id.wrapping_sub(self.first_id as usize);
        let Lent { meta, value } = self.lent.get_mut(index).and_then(Option::take)?;
        if let Some(v) = value
            && !v.is_empty()
            && v.as_ptr() as usize != report.value
        {
            std::mem::forget(v);
            debug_assert!(false, "a report for send id {} of another value", report.id);
        }
        Some(meta)
    }

    /// Removes the leading entries whose reports were taken.
    pub(crate) fn settle(&mut self) {
        while self.lent.front().is_some_and(Option::is_none) {
            self.lent.pop_front();
            self.first_id += 1;
        }
    }

    /// Forgets every lent send (after an abort, once every report was taken): an entry still
    /// waiting for its report leaks its value, which librdkafka may still read. Returns how
    /// many did.
    pub(crate) fn forget_lent(&mut self) -> usize {
        self.first_id += self.lent.len() as u64;
        let mut leaked = 0;
        for lent in self.lent.drain(..).flatten() {
            leaked += 1;
            std::mem::forget(lent.value);
        }
        leaked
    }
}

impl<C: ProducerContext<DeliveryOpaque = usize> + QueueWake, T> Drop for Producer<C, T> {
    fn drop(&mut self) {
        // Nobody else can clone the client while `self` is borrowed mutably: with one handle
        // left, dropping `io` destroys librdkafka and every message with it.
        let last = Arc::strong_count(&self.io.client) == 1;
        // SAFETY: `io` is dropped once, here, and not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.io) };
        if !last {
            // A helper thread still holds the client (only when unwinding from a panic, or a
            // commit call given up): librdkafka may still read the values of unreported
            // sends. Leaked rather than freed under it.
            for lent in self.lent.drain(..).flatten() {
                std::mem::forget(lent.value);
            }
        }
        // Otherwise the ledger drops after this body, once librdkafka is gone.
    }
}

/// Sends everything queued now, without waiting out `linger.ms`, and waits up to
/// `timeout_ms` (ms) for every send's delivery report to be served (`rd_kafka_flush`).
///
/// # Errors
/// librdkafka's code (`_TIMED_OUT`).
pub(crate) fn flush<C: ProducerContext>(
    producer: &BaseProducer<C>,
    timeout_ms: i32,
) -> Result<(), RDKafkaErrorCode> {
    // SAFETY: the handle is a live producer for as long as `producer` is borrowed.
    let err = unsafe { rdsys::rd_kafka_flush(producer.client().native_ptr(), timeout_ms) };
    if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(err.into())
    }
}

/// Commits the open transaction of `producer` (`rd_kafka_commit_transaction`), waiting up to
/// `timeout_ms` (ms). Callable from any thread.
///
/// # Errors
/// The transactional error, read and destroyed.
pub(crate) fn commit_transaction<C: ProducerContext>(
    producer: &BaseProducer<C>,
    timeout_ms: i32,
) -> Result<(), TxnError> {
    // SAFETY: the handle is a live producer for as long as `producer` is borrowed; a returned
    // error object is read and destroyed once, here.
    unsafe {
        let err = rdsys::rd_kafka_commit_transaction(producer.client().native_ptr(), timeout_ms);
        if err.is_null() {
            return Ok(());
        }
        let e = TxnError {
            code: rdsys::rd_kafka_error_code(err).into(),
            message: super::cstr(rdsys::rd_kafka_error_string(err)),
            fatal: rdsys::rd_kafka_error_is_fatal(err) != 0,
            requires_abort: rdsys::rd_kafka_error_txn_requires_abort(err) != 0,
        };
        rdsys::rd_kafka_error_destroy(err);
        Err(e)
    }
}

/// Puts `producer` in librdkafka's fatal error state with `code` (`rd_kafka_test_fatal_error`,
/// librdkafka's own hook for testing its fatal error paths): every later transactional call
/// fails with a fatal error of that code.
#[cfg(feature = "fault-injection")]
pub(crate) fn inject_fatal_error<C: ProducerContext>(
    producer: &BaseProducer<C>,
    code: rdsys::rd_kafka_resp_err_t,
) {
    let reason = c"injected by a fault-injection test";
    // SAFETY: the handle is a live producer for as long as `producer` is borrowed; the reason
    // is a NUL-terminated string librdkafka copies.
    unsafe {
        rdsys::rd_kafka_test_fatal_error(producer.client().native_ptr(), code, reason.as_ptr());
    }
}

/// A metadata request for the cluster's brokers alone (no topics: `rd_kafka_metadata` with
/// `all_topics = 0` and no topic handle), waiting up to `timeout_ms` (ms): it waits for a
/// usable connection and learns the cluster.
///
/// # Errors
/// librdkafka's code.
pub(crate) fn brokers_metadata<C: ProducerContext>(
    producer: &BaseProducer<C>,
    timeout_ms: i32,
) -> Result<(), RDKafkaErrorCode> {
    let mut metadata: *const rdsys::rd_kafka_metadata = std::ptr::null();
    // SAFETY: the client handle is live; `metadata` is valid for writes. A returned metadata
    // object is destroyed once, here.
    let err = unsafe {
        let err = rdsys::rd_kafka_metadata(
            producer.client().native_ptr(),
            0,
            std::ptr::null_mut(),
            &mut metadata,
            timeout_ms,
        );
        if !metadata.is_null() {
            rdsys::rd_kafka_metadata_destroy(metadata);
        }
        err
    };
    if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(err.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;
    use rdkafka::client::ClientContext;
    use rdkafka::producer::DeliveryResult;
    use std::time::{Duration, Instant};

    /// Records each delivery report's proof.
    #[derive(Default)]
    struct Reports(Mutex<Vec<Reported>>);

    impl ClientContext for Reports {}

    impl ProducerContext for Reports {
        type DeliveryOpaque = usize;

        fn delivery(&self, result: &DeliveryResult<'_>, id: usize) {
            let m = match result {
                Ok(m) | Err((_, m)) => m,
            };
            self.0.lock().unwrap().push(Reported::of(m, id));
        }
    }

    impl QueueWake for Reports {
        fn queue_nonempty(&self) {}
    }

    /// A producer whose sends fail fast: nothing listens on port 1.
    fn producer() -> Producer<Reports, &'static str> {
        let client = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "100")
            .set("log_level", "0")
            .create_with_context(Reports::default())
            .unwrap();
        Producer::new(client)
    }

    fn record(topic: Topic) -> Record<'static> {
        Record {
            topic,
            partition: 0,
            key: Some(b"k"),
            timestamp: None,
            headers: &[(c"h", Some(b"v")), (c"null", None)],
        }
    }

    #[test]
    fn a_lent_value_is_freed_on_its_own_report_only() {
        let mut p = producer();
        let topic = p.topic_mut("lent").unwrap();
        let sent = p.send_lent(&record(topic), Some(vec![7; 64]), "first", |a| a.produce());
        assert_eq!(sent, Ok(()));
        assert_eq!(p.lent.len(), 1);
        // A report made from another message (here: of the same id, another value) does not
        // free the value: it is leaked (in a release build), never freed under librdkafka.
        let forged = Reported {
            id: 1,
            value: 0xdead_beef,
        };
        let taken =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.take_reported(&forged)));
        assert_eq!(taken.is_err(), cfg!(debug_assertions));
        drop(p);
        let mut p = producer();
        let topic = p.topic_mut("lent").unwrap();
        p.send_lent(&record(topic), Some(vec![7; 64]), "second", |a| a.produce())
            .unwrap();
        // The send times out undelivered; its report frees the value.
        let deadline = Instant::now() + Duration::from_secs(10);
        let report = loop {
            p.io().client().poll(Duration::from_millis(50));
            if let Some(r) = p.io().client().context().0.lock().unwrap().pop() {
                break r;
            }
            assert!(Instant::now() < deadline, "no delivery report");
        };
        assert_eq!(report.id(), 1);
        assert_eq!(p.take_reported(&report), Some("second"));
        p.settle();
        assert!(p.lent.is_empty());
        assert_eq!(p.first_id, 2);
    }

    #[test]
    fn a_refused_lent_send_leaves_no_entry_and_a_topic_of_another_producer_is_refused() {
        let mut other = producer();
        let foreign = other.topic_mut("elsewhere").unwrap();
        let mut p = producer();
        let refused = p.send_lent(&record(foreign), Some(vec![1; 8]), "x", |a| a.produce());
        assert_eq!(refused, Err(RDKafkaErrorCode::InvalidArgument));
        assert!(p.lent.is_empty());
        // Ids go on from where they were: the refused send took none.
        let topic = p.topic_mut("here").unwrap();
        p.send_lent(&record(topic), None, "tombstone", |a| {
            a.produce()?;
            a.produce() // a second call does nothing
        })
        .unwrap();
        assert_eq!(p.lent.len(), 1);
        assert_eq!(p.first_id, 1);
        assert_eq!(p.forget_lent(), 1);
        assert_eq!(p.first_id, 2);
    }
}
