//! The byte-level face of a stage, as the runtime sees it.
//!
//! The runtime deals in bytes; a [`Processor`] decodes a delivered record with the stage's
//! codecs, calls its [`Handler`] and encodes the resulting [`Step`](crate::Step). Every
//! decoding failure is an [`Error`] that names the record's topic, partition and offset.
//!
//! Above `codec`, `handler` and `error`; below `topology`, whose stage builder wraps a handler
//! and its codecs in one: it imports nothing of `topology`.

use std::borrow::Cow;
use std::sync::Arc;

use crate::codec::{Codec, CodecError};
use crate::error::{Error, Part};
use crate::handler::{Handler, Record, StateChange};
use crate::header::Header;
use crate::punctuation::{FoldStates, Punctuation, PunctuationType, Punctuator, Schedule};

/// A delivered record as bytes.
#[derive(Debug, Clone, Copy)]
pub struct RawRecord<'a> {
    /// Source topic name.
    pub topic: &'a str,
    /// Partition (the task's partition).
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
    /// Record timestamp, ms since the epoch.
    pub timestamp: i64,
    /// Key bytes, `None` for a record without a key.
    pub key: Option<&'a [u8]>,
    /// Value bytes, `None` for a tombstone.
    pub value: Option<&'a [u8]>,
    /// The task's event-time position when the record is handed over, ms since the epoch:
    /// every record with an event time at or below it has been handed over already (late ones
    /// aside) and every timer at or below it has fired. While a backlog is released in
    /// event-time order it is the release time of the record itself; otherwise the task's
    /// watermark. It never decreases and never passes the watermark. `None` when the stage
    /// does not order by event time, or before its watermark is first set.
    pub watermark: Option<i64>,
    /// The record's headers, in order, Parsley's own left out ([`crate::is_own_header`]).
    pub headers: &'a [Header],
    /// The processor's task state, encoded: state that belongs to the task rather than to a
    /// key ([`RawStep::task_state`]); `None` when it has none.
    pub task_state: Option<&'a [u8]>,
}

/// A delivered record as bytes, its value handed over: what the runtime passes to
/// [`Processor::process_delivery`].
#[derive(Debug, Clone)]
pub struct RawDelivery<'a> {
    /// Source topic name.
    pub topic: &'a str,
    /// Partition (the task's partition).
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
    /// Record timestamp, ms since the epoch.
    pub timestamp: i64,
    /// Key bytes, `None` for a record without a key (borrowed: the runtime keys the fold
    /// state by them).
    pub key: Option<&'a [u8]>,
    /// Value bytes, `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// The task's event-time watermark when the record is handed over
    /// ([`RawRecord::watermark`]).
    pub watermark: Option<i64>,
    /// The record's headers ([`RawRecord::headers`]).
    pub headers: &'a [Header],
    /// The processor's task state ([`RawRecord::task_state`]).
    pub task_state: Option<&'a [u8]>,
}

impl RawDelivery<'_> {
    /// The record with its value borrowed.
    pub fn as_record(&self) -> RawRecord<'_> {
        RawRecord {
            topic: self.topic,
            partition: self.partition,
            offset: self.offset,
            timestamp: self.timestamp,
            key: self.key,
            value: self.value.as_deref(),
            watermark: self.watermark,
            headers: self.headers,
            task_state: self.task_state,
        }
    }
}

/// The fold state of any key of the task handling a record: what a processor reads besides
/// its record's own key's state ([`Processor::process_delivery_with`]) — a global table's row
/// under the key a stream record maps to. Reads see the task's state as it is between two
/// records: the changes of the open transaction included.
pub trait StateLookup {
    /// The encoded fold state of key `key` in the task, `None` when it has none.
    ///
    /// # Errors
    /// The store's message, when a state kept on disk cannot be read.
    fn state_of(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, String>;
}

/// A lookup that finds no state: for processors called without a task around them.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLookup;

impl StateLookup for NoLookup {
    fn state_of(&self, _: &[u8]) -> Result<Option<Cow<'_, [u8]>>, String> {
        Ok(None)
    }
}

/// One record to produce, encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEmission {
    /// Sink topic name (declared by the stage), shared with the handler's
    /// [`crate::Emission::topic`].
    pub topic: Arc<str>,
    /// Encoded key; `None` for a record without a key ([`Codec::encode_part`]).
    pub key: Option<Vec<u8>>,
    /// Encoded value; `None` for a tombstone ([`Codec::encode_part`]).
    pub value: Option<Vec<u8>>,
    /// The record timestamp, ms since the epoch; `None`: the timestamp of the record (or the
    /// time of the timer) being handled, as Kafka Streams forwards a record's timestamp
    /// unless an operator sets another (an aggregate's latest update, a join's later side).
    pub timestamp: Option<i64>,
    /// The record's headers; `None`: those of the record being handled (none for a timer's),
    /// as its timestamp propagates. Parsley's own names are dropped ([`crate::is_own_header`]).
    pub headers: Option<Vec<Header>>,
}

/// The encoded result of handling one record or one timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawStep {
    /// Records to produce, in order.
    pub emit: Vec<RawEmission>,
    /// Fold state change for the record's key, encoded.
    pub state: StateChange<Vec<u8>>,
    /// Change of the processor's task state, encoded: one value per task beside the fold
    /// state of its keys, for what no single key owns — a time observed over all of the
    /// task's records, records buffered across keys. Kept in the stage's changelog and
    /// restored with the fold state; handed back with every record and timer
    /// ([`RawRecord::task_state`]).
    pub task_state: StateChange<Vec<u8>>,
    /// Event-time timers to set for the record's key, ms since the epoch: the runtime calls
    /// [`Processor::on_timer`] for the key once the task's event-time watermark reaches each
    /// (a timer set twice for the same key and time fires once). Only a stage that orders by
    /// event time and whose processor says [`Processor::uses_timers`] may set timers.
    pub timers: Vec<i64>,
    /// Records this step found too late to use — a windowed operator's record whose windows
    /// had all closed — and did not drop silently: the runtime counts them
    /// (`MetricsSnapshot::too_late`); the operator may also have routed them to a topic.
    pub too_late: u32,
}

impl RawStep {
    /// No emission, no state change, no timer.
    pub fn keep() -> Self {
        RawStep {
            emit: Vec::new(),
            state: StateChange::Keep,
            task_state: StateChange::Keep,
            timers: Vec::new(),
            too_late: 0,
        }
    }
}

/// An event-time timer that fired: what the runtime passes to [`Processor::on_timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawTimer<'a> {
    /// The key the timer was set for (the fold state's key).
    pub key: &'a [u8],
    /// The partition of the task.
    pub partition: i32,
    /// The time it was set for, ms since the epoch.
    pub time: i64,
    /// The task's event-time position as the timer fires, ms since the epoch (the timer's
    /// time: timers fire in event-time order; see [`RawRecord::watermark`]).
    pub watermark: i64,
    /// The processor's task state ([`RawRecord::task_state`]).
    pub task_state: Option<&'a [u8]>,
}

/// A punctuation that fired: what the runtime passes to [`Processor::punctuate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPunctuation {
    /// The schedule's index in [`Processor::schedules`].
    pub schedule: usize,
    /// What moved it.
    pub kind: PunctuationType,
    /// Its time, ms since the epoch ([`Punctuation::time`]).
    pub time: i64,
    /// The task's partition.
    pub partition: i32,
}

/// The encoded result of a punctuation: records to produce and fold-state changes by key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawPunctuated {
    /// Records to produce, in order (timestamp `None`: the punctuation's time).
    pub emit: Vec<RawEmission>,
    /// Fold-state changes by encoded key, in order.
    pub states: Vec<(Vec<u8>, StateChange<Vec<u8>>)>,
}

/// A stage's logic over bytes: decode, handle, encode.
pub trait Processor: Send + Sync {
    /// Handles one delivered record. `state` is the encoded fold state of the record's key
    /// (the state is keyed by the record's key bytes).
    ///
    /// # Errors
    /// [`Error::Decode`] for undecodable key, value or state; [`Error::Handler`] when the
    /// handler fails; [`Error::Encode`] when an emission or the state cannot be encoded;
    /// [`Error::UndeclaredSink`] for an emission to a topic the stage did not declare.
    fn process(&self, record: RawRecord<'_>, state: Option<&[u8]>) -> Result<RawStep, Error>;

    /// [`Processor::process`] with the record's value handed over, so that a value codec that
    /// keeps its bytes ([`Codec::decode_owned`]) takes them without a copy. The runtime calls
    /// this method; the default borrows the value and calls [`Processor::process`].
    ///
    /// # Errors
    /// As [`Processor::process`].
    fn process_delivery(
        &self,
        delivery: RawDelivery<'_>,
        state: Option<&[u8]>,
    ) -> Result<RawStep, Error> {
        self.process(delivery.as_record(), state)
    }

    /// [`Processor::process_delivery`] with the fold state of every other key of the task
    /// readable through `lookup`. The runtime calls this method; the default ignores `lookup`
    /// and calls [`Processor::process_delivery`].
    ///
    /// # Errors
    /// As [`Processor::process`]; [`Error::StateRead`] when `lookup` fails.
    fn process_delivery_with(
        &self,
        delivery: RawDelivery<'_>,
        state: Option<&[u8]>,
        lookup: &dyn StateLookup,
    ) -> Result<RawStep, Error> {
        let _ = lookup;
        self.process_delivery(delivery, state)
    }

    /// Called once for each event-time timer the processor set ([`RawStep::timers`]) when the
    /// task's watermark reaches its time, interleaved in event-time order with the records the
    /// watermark releases: after those released at its time or earlier, before those at a
    /// later time; timers of one time in ascending key order. `state` is the
    /// key's fold state; the step's emissions carry the timer's time as their timestamp. The
    /// default does nothing.
    ///
    /// # Errors
    /// As [`Processor::process`] (an error stops the stage: a timer has no input record to
    /// give a bad-record policy).
    fn on_timer(&self, timer: RawTimer<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        let _ = (timer, state);
        Ok(RawStep::keep())
    }

    /// Whether the processor sets event-time timers; such a stage must order by event time
    /// (checked by [`crate::TopologyBuilder::build`]). The default: `false`.
    fn uses_timers(&self) -> bool {
        false
    }

    /// The stage's punctuation schedules, in declaration order (module `punctuation`). A
    /// stream-time schedule needs event-time order, a wall-clock one the built-in clock (checked
    /// by [`crate::TopologyBuilder::build`]). The default: none.
    fn schedules(&self) -> &[Schedule] {
        &[]
    }

    /// Called once per firing of schedule `punctuation.schedule`, interleaved in event-time
    /// order with the records and timers the watermark releases (module `punctuation`);
    /// `lookup` reads the fold state of any key of the task. The default does nothing.
    ///
    /// # Errors
    /// [`Error::Punctuator`] when the punctuator fails; [`Error::Encode`] and
    /// [`Error::UndeclaredSink`] as [`Processor::process`] (an error stops the stage).
    fn punctuate(
        &self,
        punctuation: RawPunctuation,
        lookup: &dyn StateLookup,
    ) -> Result<RawPunctuated, Error> {
        let _ = (punctuation, lookup);
        Ok(RawPunctuated::default())
    }

    /// Whether the stage keeps fold state by key. A stage that keeps none takes records
    /// without a key (its handler decides what they mean); one that keeps state cannot key
    /// them, and the runtime hands them to the stage's bad-record policy. The default: `true`.
    fn keeps_state(&self) -> bool {
        true
    }
}

pub(crate) struct Codecs<H: Handler> {
    pub(crate) key: Arc<dyn Codec<H::Key>>,
    pub(crate) value: Arc<dyn Codec<H::Value>>,
    pub(crate) output: Arc<dyn Codec<H::Output>>,
    pub(crate) state: Arc<dyn Codec<H::State>>,
}

/// A typed punctuator of a handler's stage.
pub(crate) type TypedPunctuator<H> =
    Arc<dyn Punctuator<<H as Handler>::Key, <H as Handler>::Output, <H as Handler>::State>>;

pub(crate) struct Typed<H: Handler> {
    pub(crate) stage: String,
    pub(crate) handler: H,
    pub(crate) codecs: Codecs<H>,
    pub(crate) sinks: Vec<String>,
    /// The schedules, and the punctuator of each (same order).
    pub(crate) schedules: Vec<Schedule>,
    pub(crate) punctuators: Vec<TypedPunctuator<H>>,
}

impl<H: Handler> Processor for Typed<H> {
    fn process(&self, record: RawRecord<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        self.run(record, Value::Borrowed(record.value), state)
    }

    fn process_delivery(
        &self,
        delivery: RawDelivery<'_>,
        state: Option<&[u8]>,
    ) -> Result<RawStep, Error> {
        let RawDelivery {
            topic,
            partition,
            offset,
            timestamp,
            key,
            value,
            watermark,
            headers,
            task_state,
        } = delivery;
        let record = RawRecord {
            topic,
            partition,
            offset,
            timestamp,
            key,
            value: None,
            watermark,
            headers,
            task_state,
        };
        self.run(record, Value::Owned(value), state)
    }

    fn schedules(&self) -> &[Schedule] {
        &self.schedules
    }

    fn punctuate(
        &self,
        p: RawPunctuation,
        lookup: &dyn StateLookup,
    ) -> Result<RawPunctuated, Error> {
        let Some(punctuator) = self.punctuators.get(p.schedule) else {
            return Ok(RawPunctuated::default());
        };
        let read = |key: &[u8]| -> Result<Option<Vec<u8>>, String> {
            Ok(lookup.state_of(key)?.map(|c| c.into_owned()))
        };
        let state = FoldStates::new(&read, &*self.codecs.key, &*self.codecs.state);
        let punctuated = punctuator
            .punctuate(
                Punctuation {
                    schedule: p.schedule,
                    kind: p.kind,
                    time: p.time,
                    partition: p.partition,
                },
                &state,
            )
            .map_err(|source| Error::Punctuator {
                stage: self.stage.clone(),
                partition: p.partition,
                time: p.time,
                source,
            })?;
        let encode_err = |what: &'static str, source| Error::Encode {
            stage: self.stage.clone(),
            what,
            source,
        };
        let emit = punctuated
            .emit
            .into_iter()
            .map(|e| self.encode_emission(e))
            .collect::<Result<Vec<_>, Error>>()?;
        let states = punctuated
            .states
            .into_iter()
            .map(|(k, change)| {
                let key = self
                    .codecs
                    .key
                    .encode_owned(k)
                    .map_err(|x| encode_err("punctuation state key", x))?;
                let change = match change {
                    StateChange::Keep => StateChange::Keep,
                    StateChange::Delete => StateChange::Delete,
                    StateChange::Set(s) => StateChange::Set(
                        self.codecs
                            .state
                            .encode_owned(s)
                            .map_err(|x| encode_err("state", x))?,
                    ),
                };
                Ok((key, change))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(RawPunctuated { emit, states })
    }

    /// `false` when the handler's `State` is `()`: the way a stage declares it keeps none.
    fn keeps_state(&self) -> bool {
        std::any::TypeId::of::<H::State>() != std::any::TypeId::of::<()>()
    }
}

/// A record's value bytes as the runtime or a caller hands them to [`Typed::run`].
enum Value<'a> {
    Borrowed(Option<&'a [u8]>),
    Owned(Option<Vec<u8>>),
}

impl<H: Handler> Typed<H> {
    /// One emission encoded, to a declared sink.
    fn encode_emission(
        &self,
        e: crate::handler::Emission<H::Key, H::Output>,
    ) -> Result<RawEmission, Error> {
        let encode_err = |what: &'static str, source| Error::Encode {
            stage: self.stage.clone(),
            what,
            source,
        };
        if !self.sinks.iter().any(|s| **s == *e.topic) {
            return Err(Error::UndeclaredSink {
                stage: self.stage.clone(),
                topic: e.topic.to_string(),
            });
        }
        Ok(RawEmission {
            key: self
                .codecs
                .key
                .encode_part(e.key)
                .map_err(|x| encode_err("emission key", x))?,
            value: self
                .codecs
                .output
                .encode_part(e.value)
                .map_err(|x| encode_err("emission value", x))?,
            timestamp: e.timestamp,
            topic: e.topic,
            headers: e.headers,
        })
    }

    /// Decodes, handles and encodes one record; its value comes as `value` (the `value` field
    /// of `record` is not read).
    fn run(
        &self,
        record: RawRecord<'_>,
        value: Value<'_>,
        state: Option<&[u8]>,
    ) -> Result<RawStep, Error> {
        let decode_err = |part: Part, source| Error::Decode {
            stage: self.stage.clone(),
            topic: record.topic.to_string(),
            partition: record.partition,
            offset: record.offset,
            part,
            source,
        };
        let missing = |part: Part| Error::Missing {
            stage: self.stage.clone(),
            topic: record.topic.to_string(),
            partition: record.partition,
            offset: record.offset,
            part,
        };
        // An absent part decodes only where its type can stand for it (codec module docs);
        // otherwise it is `Missing`, not a decoding failure.
        let absent_or = |part: Part| {
            move |e: CodecError| match e {
                CodecError::Absent => missing(part),
                e => decode_err(part, e),
            }
        };
        let key = match record.key {
            Some(k) => self.codecs.key.decode(k),
            None => self.codecs.key.decode_absent(),
        }
        .map_err(absent_or(Part::Key))?;
        let value = match value {
            Value::Borrowed(Some(v)) => self.codecs.value.decode(v),
            Value::Owned(Some(v)) => self.codecs.value.decode_owned(v),
            Value::Borrowed(None) | Value::Owned(None) => self.codecs.value.decode_absent(),
        }
        .map_err(absent_or(Part::Value))?;
        let state = state
            .map(|s| self.codecs.state.decode(s))
            .transpose()
            .map_err(|e| decode_err(Part::State, e))?;
        let step = self
            .handler
            .handle(
                Record {
                    topic: record.topic,
                    partition: record.partition,
                    offset: record.offset,
                    timestamp: record.timestamp,
                    key,
                    value,
                    headers: record.headers,
                },
                state,
            )
            .map_err(|source| Error::Handler {
                stage: self.stage.clone(),
                topic: record.topic.to_string(),
                partition: record.partition,
                offset: record.offset,
                source,
            })?;
        let encode_err = |what: &'static str, source| Error::Encode {
            stage: self.stage.clone(),
            what,
            source,
        };
        // Collected in place: when an `Emission<K, V>` is the size of a `RawEmission` (byte
        // keys and values), the step's vector is reused instead of a second one allocated.
        let emit = step
            .emit
            .into_iter()
            .map(|e| self.encode_emission(e))
            .collect::<Result<Vec<_>, Error>>()?;
        let state = match step.state {
            StateChange::Keep => StateChange::Keep,
            StateChange::Delete => StateChange::Delete,
            StateChange::Set(s) => StateChange::Set(
                self.codecs
                    .state
                    .encode_owned(s)
                    .map_err(|x| encode_err("state", x))?,
            ),
        };
        Ok(RawStep {
            emit,
            state,
            task_state: StateChange::Keep,
            timers: Vec::new(),
            too_late: 0,
        })
    }
}
