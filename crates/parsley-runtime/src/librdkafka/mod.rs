//! Every call into librdkafka that the `rdkafka` crate does not make for us, behind safe
//! wrappers: the only module of the crate with `unsafe` code.
//!
//! The crate denies `unsafe_code` everywhere else (`#![deny(unsafe_code)]` at its root, allowed
//! on this module alone), so every `unsafe` block, `unsafe impl`, `extern "C"` callback and
//! raw-pointer type of the runtime is in here, as in `rdkafka` itself. The invariant: **every
//! wrapper is safe to call from safe code** because it owns what it passes to librdkafka or
//! borrows it for the call only — a client is taken by reference (`&BaseProducer`, `&Client`,
//! `&BaseConsumer`), so it outlives the call; every librdkafka object made here (queue and topic
//! handles, admin options, requests' arguments, events, header lists, error objects) is owned by
//! a value of this module that destroys it exactly once, after its last use, while its client is
//! alive; nothing a caller can pass makes a pointer dangle. Each `unsafe` block says why
//! (`// SAFETY:`).
//!
//! The one lifetime librdkafka cannot check is a value handed over without a copy (the outbox's
//! stamped sends): `producer::Producer` owns such a buffer from the send until the send's
//! delivery report proves librdkafka is done with it, or until the producer is destroyed (and
//! leaks it rather than free it under a producer still shared with a commit's helper thread).
//!
//! Units: offsets are `i64` (librdkafka's `int64_t`, a negative value being one of its logical
//! offsets), partitions `i32`, timeouts `i32` milliseconds where a wrapper takes them as
//! librdkafka does, record timestamps `i64` ms since the epoch.
//!
//! - `producer`: the producer's main queue and its wake-up callback, topic handles, sends
//!   through `rd_kafka_produceva` (copied, or lent until the report), flush, commit, the
//!   brokers-only metadata request.
//! - `admin`: the admin requests `rdkafka` does not wrap (`DescribeTopics`, `ListOffsets`
//!   with an isolation level and the authorized operations, `DescribeConsumerGroups`,
//!   `CreateAcls`, `DeleteAcls`, `DescribeAcls`), their results as owned values, and the events
//!   of a client's main queue; `acl`: the ACL bindings and filters those three take.
//! - `consumer`: local reads of a consumer's state: positions, and the high watermark cached
//!   from the last fetch response ([`cached_high_watermark`], public).

pub(crate) mod acl;
pub(crate) mod admin;
pub(crate) mod consumer;
pub(crate) mod producer;

pub use consumer::cached_high_watermark;

use std::ffi::{CStr, c_char};

/// A C string librdkafka returned, copied (lossily) into a `String`; empty for null.
///
/// # Safety
/// `p` is null or a NUL-terminated string that stays valid for the call.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A librdkafka object owned here, destroyed once by its destructor when dropped.
struct Guard<T>(*mut T, unsafe extern "C" fn(*mut T));

impl<T> Guard<T> {
    /// Takes ownership of `ptr` (null allowed: nothing to destroy).
    ///
    /// # Safety
    /// `ptr` is null or an object that `destroy` frees, owned by nobody else and used by
    /// nothing after the guard is dropped.
    unsafe fn new(ptr: *mut T, destroy: unsafe extern "C" fn(*mut T)) -> Self {
        Guard(ptr, destroy)
    }
}

impl<T> Drop for Guard<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from the matching librdkafka constructor (`new`'s
            // contract) and is destroyed exactly once, here.
            unsafe { (self.1)(self.0) }
        }
    }
}
