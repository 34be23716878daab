//! The `Handler` trait: a stage's logic as a pure function.
//!
//! At the bottom of the crate: it imports none of its modules.
//!
//! A handler sees one delivered record and the current fold state of the record's key, and
//! returns a [`Step`]: the records to emit and what becomes of the fold state. The runtime
//! stamps, claims and orders the emissions downstream, and commits the new fold state in the
//! same transaction as the delivery (the book's specification, §6).
//!
//! The causal guarantee covers only effects that leave through the returned [`Step`]: a write
//! to an external system or a send through a private producer is invisible to the causal
//! model (the book's specification, §2, precondition 4).

use crate::header::Header;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A delivered record, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a, K, V> {
    /// The source topic's name.
    pub topic: &'a str,
    /// The partition: the task's partition number.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// The record's Kafka timestamp, ms since the epoch (`-1` for a record without one). Every
    /// record the handler emits for it carries the same timestamp (timestamp propagation, as
    /// in Kafka Streams), so event time flows through a pipeline of stages.
    pub timestamp: i64,
    /// The decoded key.
    pub key: K,
    /// The decoded value.
    pub value: V,
    /// The record's headers, in order; Parsley's own (its stamp) left out. Every record the
    /// handler emits for it carries them unless it sets others ([`Emission::headers`]).
    pub headers: &'a [Header],
}

/// One record to produce.
#[derive(Debug, Clone, PartialEq)]
pub struct Emission<K, V> {
    /// The sink topic; must be one of the stage's declared sinks. Shared, not owned: a handler
    /// that keeps its sink's name as an `Arc<str>` hands out a clone per emission (a reference
    /// count, no allocation); a `&str` or `String` is converted (one allocation).
    pub topic: Arc<str>,
    /// The key; the partition is the Kafka default partitioner's hash of its encoded bytes
    /// (murmur2, as Java clients and Kafka Streams compute it).
    pub key: K,
    /// The value.
    pub value: V,
    /// The record timestamp, ms since the epoch; `None` (the default): the timestamp of the
    /// record being handled (Kafka Streams' timestamp propagation). [`Emission::at`] sets
    /// another, as Kafka Streams' `Record::withTimestamp` does.
    pub timestamp: Option<i64>,
    /// The record's headers; `None` (the default): those of the record being handled, as
    /// its timestamp propagates (Kafka Streams forwards a record with its headers).
    /// [`Emission::with_headers`] sets others — none with `Vec::new()`. Parsley's own names
    /// (`ps`, `parsley.*`) are dropped: they cannot be forged.
    pub headers: Option<Vec<Header>>,
}

impl<K, V> Emission<K, V> {
    /// An emission of `key`/`value` to `topic` (see [`Emission::topic`] for the cheap way to
    /// name it).
    pub fn to(topic: impl Into<Arc<str>>, key: K, value: V) -> Self {
        Emission {
            topic: topic.into(),
            key,
            value,
            timestamp: None,
            headers: None,
        }
    }

    /// The emission with record timestamp `ms` (ms since the epoch) instead of the handled
    /// record's.
    pub fn at(mut self, ms: i64) -> Self {
        self.timestamp = Some(ms);
        self
    }

    /// The emission with headers `headers` instead of the handled record's.
    ///
    /// ```
    /// # use parsley_stage::Emission;
    /// let e = Emission::to("out", "k", 1).with_headers(vec![("traceparent".into(), Some(b"00-..".to_vec()))]);
    /// assert_eq!(e.headers.unwrap()[0].0, "traceparent");
    /// ```
    pub fn with_headers(mut self, headers: Vec<Header>) -> Self {
        self.headers = Some(headers);
        self
    }
}

/// What becomes of the fold state of the delivered record's key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StateChange<S> {
    /// Leave it as it is.
    #[default]
    Keep,
    /// Replace it.
    Set(S),
    /// Remove it.
    Delete,
}

/// The result of handling one record.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<K, V, S> {
    /// Records to emit, in order.
    pub emit: Vec<Emission<K, V>>,
    /// The fold state change for the record's key.
    pub state: StateChange<S>,
}

impl<K, V, S> Default for Step<K, V, S> {
    fn default() -> Self {
        Step {
            emit: Vec::new(),
            state: StateChange::Keep,
        }
    }
}

impl<K, V, S> Step<K, V, S> {
    /// Emits nothing and keeps the state.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds an emission to `topic` (an `Arc<str>` the handler keeps, cloned per call, costs
    /// no allocation; see [`Emission::topic`]).
    pub fn emit(mut self, topic: impl Into<Arc<str>>, key: K, value: V) -> Self {
        self.emit.push(Emission::to(topic, key, value));
        self
    }

    /// Sets the new fold state.
    pub fn set_state(mut self, state: S) -> Self {
        self.state = StateChange::Set(state);
        self
    }

    /// Deletes the fold state.
    pub fn delete_state(mut self) -> Self {
        self.state = StateChange::Delete;
        self
    }
}

/// An error a handler returns for a record it cannot process. The stage's bad-record policy
/// decides what follows ([`BadRecordKind::Handler`](crate::BadRecordKind::Handler)): by default
/// the stage stops with it.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What [`Handler::handle`] returns: a [`Step`] or a [`HandlerError`].
pub type HandlerResult<K, V, S> = Result<Step<K, V, S>, HandlerError>;

/// A stage's logic. Implementations must be pure: the same record and state give the same
/// step, so a record re-delivered after an abort yields the same outputs.
pub trait Handler: Send + Sync + 'static {
    /// The key of input and output records.
    type Key: Serialize + DeserializeOwned + Send + 'static;
    /// The value of input records (an enum when the sources carry different kinds).
    type Value: Serialize + DeserializeOwned + Send + 'static;
    /// The value of emitted records.
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// The fold state kept per key.
    type State: Serialize + DeserializeOwned + Send + 'static;

    /// Handles one delivered record given its key's current fold state.
    ///
    /// # Errors
    /// A [`HandlerError`] fails the task; the record is not acknowledged.
    fn handle(
        &self,
        record: Record<'_, Self::Key, Self::Value>,
        state: Option<Self::State>,
    ) -> HandlerResult<Self::Key, Self::Output, Self::State>;
}
