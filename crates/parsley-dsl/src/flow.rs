//! How records move through a stage's fused operators: each operator is a push function that
//! takes one record and forwards what it makes to its children, depth first, in the order the
//! children were attached.
//!
//! Invariants:
//! - A stage handles one delivered record at a time; the [`Ctx`] it is pushed with holds that
//!   record's metadata, the composite state of its key, and the emissions made so far, in order.
//! - Children are attached while the topology is built and frozen by `StreamsBuilder::build`;
//!   a push function reads them without a lock.
//!
//! Above `data` and `state`; below every operator: it imports nothing of theirs.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use parsley_stage::{CodecError, Error, Header, Part, RawEmission, StateLookup};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::data::Codecs;
use crate::state::Slots;

/// The record being handled, what its key's state holds, and what has been emitted for it.
pub(crate) struct Ctx<'a> {
    /// The stage's name, for errors.
    pub(crate) stage: &'a str,
    /// The delivered record's source topic.
    pub(crate) topic: &'a str,
    /// Its partition.
    pub(crate) partition: i32,
    /// Its offset.
    pub(crate) offset: i64,
    /// The key bytes its fold state is kept under (the delivered record's key, a timer's
    /// key; `None` for a record without a key).
    pub(crate) raw_key: Option<&'a [u8]>,
    /// The timestamp of the record being pushed, ms since the epoch (`-1` for none): the
    /// delivered record's (a timer's time), or another an operator forwards with
    /// ([`forward_at`]), which every operator after it sees and every emission carries.
    pub(crate) timestamp: i64,
    /// The task's event-time watermark, ms since the epoch (`None`: no event-time order, or
    /// not set yet).
    pub(crate) watermark: Option<i64>,
    /// The composite state of its key.
    pub(crate) state: Slots<'a>,
    /// The stage's task state: slots of what no one key owns (a versioned table's observed
    /// stream time, a join's grace buffer), kept as the task's one task state.
    pub(crate) task: Slots<'a>,
    /// The records emitted for it, in order.
    pub(crate) emit: Vec<RawEmission>,
    /// Event-time timers set for its key, ms since the epoch.
    pub(crate) timers: Vec<i64>,
    /// Records found too late for a closed window.
    pub(crate) too_late: u32,
    /// The delivered record's headers (none for a timer), Parsley's own left out.
    pub(crate) record_headers: &'a [Header],
    /// Headers a `process` handler gave the record being pushed, in place of the delivered
    /// record's: every operator after it sees them and every emission carries them.
    pub(crate) headers: Option<Vec<Header>>,
    /// The state of the task's other keys (a global table's rows).
    pub(crate) lookup: &'a dyn StateLookup,
}

impl Ctx<'_> {
    /// The headers of the record being pushed: a `process` handler's, else the delivered
    /// record's.
    pub(crate) fn headers(&self) -> &[Header] {
        self.headers.as_deref().unwrap_or(self.record_headers)
    }

    /// A decoding error naming the delivered record.
    pub(crate) fn decode_error(&self, part: Part, source: CodecError) -> Error {
        match source {
            CodecError::Absent => Error::Missing {
                stage: self.stage.to_string(),
                topic: self.topic.to_string(),
                partition: self.partition,
                offset: self.offset,
                part,
            },
            source => Error::Decode {
                stage: self.stage.to_string(),
                topic: self.topic.to_string(),
                partition: self.partition,
                offset: self.offset,
                part,
                source,
            },
        }
    }

    /// The delivered record's key decoded with `codecs` (an absent key as the codec allows).
    pub(crate) fn decode_key<K, V>(
        &self,
        codecs: &Codecs<K, V>,
        key: Option<&[u8]>,
    ) -> Result<K, Error> {
        match key {
            Some(k) => codecs.key.decode(k),
            None => codecs.key.decode_absent(),
        }
        .map_err(|e| self.decode_error(Part::Key, e))
    }

    /// An encoding error of the stage.
    pub(crate) fn encode_error(&self, what: &'static str, source: CodecError) -> Error {
        Error::Encode {
            stage: self.stage.to_string(),
            what,
            source,
        }
    }

    /// The value in the state slot `slot` of the record's key.
    ///
    /// # Errors
    /// [`Error::Decode`] of the state when the key's state or the slot does not decode.
    pub(crate) fn load<S: Serialize + DeserializeOwned>(
        &mut self,
        slot: &str,
    ) -> Result<Option<S>, Error> {
        self.state
            .get(slot)
            .map_err(|e| self.decode_error(Part::State, e))
    }

    /// The value in the state slot `slot` of the record's key and its timestamp (ms since the
    /// epoch; `None` when it was stored without one).
    ///
    /// # Errors
    /// As [`Ctx::load`].
    pub(crate) fn load_timestamped<S: Serialize + DeserializeOwned>(
        &mut self,
        slot: &str,
    ) -> Result<Option<(S, Option<i64>)>, Error> {
        self.state
            .get_timestamped(slot)
            .map_err(|e| self.decode_error(Part::State, e))
    }

    /// Puts `value` in the state slot `slot` of the record's key with `timestamp` (ms since
    /// the epoch; `None` empties it).
    ///
    /// # Errors
    /// As [`Ctx::store`].
    pub(crate) fn store_timestamped<S: Serialize + DeserializeOwned>(
        &mut self,
        slot: &str,
        value: Option<&S>,
        timestamp: i64,
    ) -> Result<(), Error> {
        self.put(slot, value, Some(timestamp))
    }

    /// The value in slot `slot` of an operator whose value changed shape since version 1 of
    /// the state encoding: read as `Old` and converted by `upgrade` when the slot was written
    /// in version 1, else as `S`.
    ///
    /// # Errors
    /// As [`Ctx::load`].
    pub(crate) fn load_upgraded<S, Old>(
        &mut self,
        slot: &str,
        upgrade: impl FnOnce(Old) -> S,
    ) -> Result<Option<S>, Error>
    where
        S: Serialize + DeserializeOwned,
        Old: Serialize + DeserializeOwned,
    {
        self.state
            .get_upgraded(slot, upgrade)
            .map_err(|e| self.decode_error(Part::State, e))
    }

    /// Puts `value` in the state slot `slot` of the record's key (`None` empties it).
    ///
    /// # Errors
    /// [`Error::Decode`] of the state when the key's state does not decode; [`Error::Encode`]
    /// when the value does not encode.
    pub(crate) fn store<S: Serialize + DeserializeOwned>(
        &mut self,
        slot: &str,
        value: Option<&S>,
    ) -> Result<(), Error> {
        self.put(slot, value, None)
    }

    /// The value in slot `slot` of the fold state of the task's key `key` (its bytes, as the
    /// state is kept): another key's, as it is between two records.
    ///
    /// # Errors
    /// [`Error::StateRead`] when the state cannot be read; [`Error::Decode`] of the state when
    /// it or the slot does not decode.
    pub(crate) fn load_of<S: Serialize + DeserializeOwned>(
        &self,
        key: &[u8],
        slot: &str,
    ) -> Result<Option<S>, Error> {
        let raw = self
            .lookup
            .state_of(key)
            .map_err(|message| Error::StateRead {
                stage: self.stage.to_string(),
                message,
            })?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        Slots::new(Some(&raw))
            .get(slot)
            .map_err(|e| self.decode_error(Part::State, e))
    }

    /// Keeps the headers of the record being pushed with part `part` of the state in slot
    /// `slot` (a window by its start, a held record by its time), in the slot's headers slot,
    /// so that a result a timer makes from that part later carries them: the headers of the
    /// part's last update. A record without headers forgets those kept before.
    ///
    /// # Errors
    /// As [`Ctx::store`].
    pub(crate) fn keep_headers<P>(&mut self, slot: &str, part: P) -> Result<(), Error>
    where
        P: Serialize + DeserializeOwned + Ord,
    {
        let name = headers_slot(slot);
        let headers = self.headers().to_vec();
        let mut kept: KeptHeaders<P> = self.load(&name)?.unwrap_or_default();
        let changed = if headers.is_empty() {
            kept.remove(&part).is_some()
        } else {
            kept.insert(part, headers);
            true
        };
        if changed {
            self.store(&name, (!kept.is_empty()).then_some(&kept))?;
        }
        Ok(())
    }

    /// The headers kept with part `part` of slot `slot` ([`Ctx::keep_headers`]), still kept;
    /// empty when none are kept.
    ///
    /// # Errors
    /// As [`Ctx::load`].
    pub(crate) fn kept_headers<P>(&mut self, slot: &str, part: &P) -> Result<Vec<Header>, Error>
    where
        P: Serialize + DeserializeOwned + Ord,
    {
        Ok(self
            .load::<KeptHeaders<P>>(&headers_slot(slot))?
            .and_then(|mut kept| kept.remove(part))
            .unwrap_or_default())
    }

    /// The headers kept with part `part` of slot `slot` ([`Ctx::keep_headers`]), forgotten;
    /// empty when none are kept.
    ///
    /// # Errors
    /// As [`Ctx::store`].
    pub(crate) fn take_headers<P>(&mut self, slot: &str, part: &P) -> Result<Vec<Header>, Error>
    where
        P: Serialize + DeserializeOwned + Ord,
    {
        let name = headers_slot(slot);
        let Some(mut kept) = self.load::<KeptHeaders<P>>(&name)? else {
            return Ok(Vec::new());
        };
        let Some(headers) = kept.remove(part) else {
            return Ok(Vec::new());
        };
        self.store(&name, (!kept.is_empty()).then_some(&kept))?;
        Ok(headers)
    }

    /// The value in slot `slot` of the task state (what no one key owns).
    ///
    /// # Errors
    /// [`Error::Decode`] of the state when the task state or the slot does not decode.
    pub(crate) fn load_task<S: Serialize + DeserializeOwned>(
        &mut self,
        slot: &str,
    ) -> Result<Option<S>, Error> {
        self.task
            .get(slot)
            .map_err(|e| self.decode_error(Part::State, e))
    }

    /// Puts `value` in slot `slot` of the task state (`None` empties it).
    ///
    /// # Errors
    /// As [`Ctx::store`].
    pub(crate) fn store_task<S: Serialize + DeserializeOwned>(
        &mut self,
        slot: &str,
        value: Option<&S>,
    ) -> Result<(), Error> {
        self.task
            .decoded()
            .map_err(|e| self.decode_error(Part::State, e))?;
        self.task
            .put_timestamped(slot, value, None)
            .map_err(|e| self.encode_error("task state", e))
    }

    /// Puts `value` in slot `slot` with `timestamp`, the stored state decoded first so that a
    /// state that does not decode is named as such.
    fn put<S: Serialize + DeserializeOwned>(
        &mut self,
        slot: &str,
        value: Option<&S>,
        timestamp: Option<i64>,
    ) -> Result<(), Error> {
        self.state
            .decoded()
            .map_err(|e| self.decode_error(Part::State, e))?;
        self.state
            .put_timestamped(slot, value, timestamp)
            .map_err(|e| self.encode_error("state", e))
    }

    /// Encodes `key` and `value` with the sink's codecs and emits them to `topic`.
    pub(crate) fn send<K, V>(
        &mut self,
        topic: &Arc<str>,
        codecs: &Codecs<K, V>,
        key: K,
        value: V,
    ) -> Result<(), Error> {
        let key = codecs
            .key
            .encode_part(key)
            .map_err(|e| self.encode_error("emission key", e))?;
        let value = codecs
            .value
            .encode_part(value)
            .map_err(|e| self.encode_error("emission value", e))?;
        self.emit.push(RawEmission {
            topic: topic.clone(),
            key,
            value,
            timestamp: (self.timestamp != NO_TIMESTAMP).then_some(self.timestamp),
            headers: self.headers.clone(),
        });
        Ok(())
    }

    /// [`Ctx::send`] of a record that must have a key (a repartition's).
    ///
    /// # Errors
    /// [`Error::Missing`] of the key (a `MissingKey` bad record) when `key` encodes to none;
    /// as [`Ctx::send`].
    pub(crate) fn send_keyed<K, V>(
        &mut self,
        topic: &Arc<str>,
        codecs: &Codecs<K, V>,
        key: K,
        value: V,
    ) -> Result<(), Error> {
        let before = self.emit.len();
        self.send(topic, codecs, key, value)?;
        if self.emit[before].key.is_none() {
            self.emit.truncate(before);
            return Err(self.decode_error(Part::Key, CodecError::Absent));
        }
        Ok(())
    }
}

/// One operator's input: handles a record and forwards what it makes.
pub(crate) type Push<K, V> = Arc<dyn Fn(&mut Ctx<'_>, K, V) -> Result<(), Error> + Send + Sync>;

/// The children of an operator, once frozen.
pub(crate) type Children<K, V> = Arc<OnceLock<Box<[Push<K, V>]>>>;

/// Where an operator's output goes: children are attached while building and frozen at build.
pub(crate) struct Outlet<K, V> {
    adding: Rc<RefCell<Vec<Push<K, V>>>>,
    frozen: Children<K, V>,
}

impl<K, V> Clone for Outlet<K, V> {
    fn clone(&self) -> Self {
        Outlet {
            adding: self.adding.clone(),
            frozen: self.frozen.clone(),
        }
    }
}

impl<K: 'static, V: 'static> Outlet<K, V> {
    /// A new outlet and the function that freezes its children.
    pub(crate) fn new() -> (Self, Box<dyn FnOnce()>) {
        let outlet = Outlet {
            adding: Rc::new(RefCell::new(Vec::new())),
            frozen: Arc::new(OnceLock::new()),
        };
        let (adding, frozen) = (outlet.adding.clone(), outlet.frozen.clone());
        let freeze = Box::new(move || {
            let children = std::mem::take(&mut *adding.borrow_mut());
            let _ = frozen.set(children.into_boxed_slice());
        });
        (outlet, freeze)
    }

    /// Attaches a child.
    pub(crate) fn attach(&self, child: Push<K, V>) {
        self.adding.borrow_mut().push(child);
    }

    /// The children, for a push function to forward to.
    pub(crate) fn children(&self) -> Children<K, V> {
        self.frozen.clone()
    }
}

/// Forwards one record to every child: clones for all but the last.
pub(crate) fn forward<K: Clone, V: Clone>(
    children: &Children<K, V>,
    ctx: &mut Ctx<'_>,
    key: K,
    value: V,
) -> Result<(), Error> {
    let Some(children) = children.get() else {
        return Ok(());
    };
    let Some((last, rest)) = children.split_last() else {
        return Ok(());
    };
    for child in rest {
        child(ctx, key.clone(), value.clone())?;
    }
    last(ctx, key, value)
}

/// [`forward`] with record timestamp `timestamp` (ms since the epoch): the children, and the
/// emissions they make, see it instead of the context's, as Kafka Streams forwards
/// `record.withTimestamp(..)`.
pub(crate) fn forward_at<K: Clone, V: Clone>(
    children: &Children<K, V>,
    ctx: &mut Ctx<'_>,
    timestamp: i64,
    key: K,
    value: V,
) -> Result<(), Error> {
    let before = std::mem::replace(&mut ctx.timestamp, timestamp);
    let forwarded = forward(children, ctx, key, value);
    ctx.timestamp = before;
    forwarded
}

/// [`forward_at`] with `headers` in place of the record's (none for a timer): a result made
/// from state carries the headers kept with it ([`Ctx::keep_headers`]).
pub(crate) fn forward_headed<K: Clone, V: Clone>(
    children: &Children<K, V>,
    ctx: &mut Ctx<'_>,
    (timestamp, headers): (i64, Vec<Header>),
    key: K,
    value: V,
) -> Result<(), Error> {
    let before = ctx.headers.replace(headers);
    let forwarded = forward_at(children, ctx, timestamp, key, value);
    ctx.headers = before;
    forwarded
}

/// The slot beside slot `slot` that keeps the headers of its parts ([`Ctx::keep_headers`]).
fn headers_slot(slot: &str) -> String {
    format!("{slot}.headers")
}

/// Headers kept by part of a slot.
type KeptHeaders<P> = std::collections::BTreeMap<P, Vec<Header>>;

/// The timestamp of a record without one (a message format before v1).
pub(crate) const NO_TIMESTAMP: i64 = -1;

/// A table's update of one key: its value before and after (`None`: absent or deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change<V> {
    pub(crate) old: Option<V>,
    pub(crate) new: Option<V>,
}
