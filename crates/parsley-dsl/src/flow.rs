//! How records move through a stage's fused operators: each operator is a push function that
//! takes one record and forwards what it makes to its children, depth first, in the order the
//! children were attached.
//!
//! Invariants:
//! - A stage handles one delivered record at a time; the [`Ctx`] it is pushed with holds that
//!   record's metadata, the composite state of its key, and the emissions made so far, in order.
//! - Children are attached while the topology is built and frozen by `StreamsBuilder::build`;
//!   a push function reads them without a lock.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use parsley_stage::{Codec, CodecError, Error, Part, RawEmission};
use serde::Serialize;
use serde::de::DeserializeOwned;

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
    /// Its timestamp, ms since the epoch (`-1` for none).
    pub(crate) timestamp: i64,
    /// The task's event-time watermark, ms since the epoch (`None`: no event-time order, or
    /// not set yet).
    pub(crate) watermark: Option<i64>,
    /// The composite state of its key.
    pub(crate) state: Slots<'a>,
    /// The records emitted for it, in order.
    pub(crate) emit: Vec<RawEmission>,
    /// Event-time timers set for its key, ms since the epoch.
    pub(crate) timers: Vec<i64>,
    /// Records found too late for a closed window.
    pub(crate) too_late: u32,
}

impl Ctx<'_> {
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
        self.state
            .decoded()
            .map_err(|e| self.decode_error(Part::State, e))?;
        self.state
            .put(slot, value)
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
        });
        Ok(())
    }
}

/// A key codec and a value codec.
pub(crate) struct Codecs<K, V> {
    pub(crate) key: Arc<dyn Codec<K>>,
    pub(crate) value: Arc<dyn Codec<V>>,
}

impl<K, V> Clone for Codecs<K, V> {
    fn clone(&self) -> Self {
        Codecs {
            key: self.key.clone(),
            value: self.value.clone(),
        }
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

/// A table's update of one key: its value before and after (`None`: absent or deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change<V> {
    pub(crate) old: Option<V>,
    pub(crate) new: Option<V>,
}
