//! Queryable stores: what a front end declares so that the fold state of a stage can be read
//! from outside its stream thread (interactive queries, `parsley_runtime::Running::store`).
//!
//! A stage keeps one fold state per key, a byte string its front end gives meaning to (the
//! DSL keeps one slot per stateful operator in it). A [`StoreSpec`] names one view of that
//! state: the store's name, the codec its keys are encoded with — the bytes a key has in the
//! stage's fold state, the record key bytes the stage reads — and how a key's fold state reads
//! as the store's value. Both are kept typed but erased, so that the runtime, which knows
//! neither the key type nor the value type, can hand them back to a caller who names them.
//!
//! Invariants: a store's key codec encodes a key to exactly the bytes the stage's tasks key
//! their fold state with; its value reader never panics on bytes it cannot decode (it returns
//! the error); store names are unique within a topology (checked by
//! [`TopologyBuilder::build`](crate::TopologyBuilder::build)).

use std::any::{Any, TypeId, type_name};
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::{Codec, CodecError};

/// How a key's fold state reads as a store's value: `Ok(None)` when the key's fold state holds
/// no value of this store.
pub type ValueReader<V> = Arc<dyn Fn(&[u8]) -> Result<Option<V>, CodecError> + Send + Sync>;

/// One queryable store of a stage (module docs): its name, key codec and value reader, typed
/// `K` → `V` behind an erased type.
#[derive(Clone)]
pub struct StoreSpec {
    name: String,
    key_type: (TypeId, &'static str),
    value_type: (TypeId, &'static str),
    /// An `Arc<dyn Codec<K>>`.
    key_codec: Arc<dyn Any + Send + Sync>,
    /// A [`ValueReader<V>`].
    value: Arc<dyn Any + Send + Sync>,
    /// The value reader, its values as JSON text (the metrics endpoint's `/store` route).
    json: ValueReader<String>,
}

impl StoreSpec {
    /// The store `name` whose keys `K` are encoded by `key_codec` and whose value of a key is
    /// what `value` reads from the key's fold state.
    pub fn new<K: 'static, V: Serialize + 'static>(
        name: impl Into<String>,
        key_codec: Arc<dyn Codec<K>>,
        value: ValueReader<V>,
    ) -> Self {
        let read = value.clone();
        let json: ValueReader<String> = Arc::new(move |state: &[u8]| {
            read(state)?
                .map(|v| serde_json::to_string(&v).map_err(CodecError::from))
                .transpose()
        });
        StoreSpec {
            json,
            name: name.into(),
            key_type: (TypeId::of::<K>(), type_name::<K>()),
            value_type: (TypeId::of::<V>(), type_name::<V>()),
            key_codec: Arc::new(key_codec),
            value: Arc::new(value),
        }
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The names of the store's key and value types, as [`std::any::type_name`] gives them.
    pub fn types(&self) -> (&'static str, &'static str) {
        (self.key_type.1, self.value_type.1)
    }

    /// The store's value reader with its values as JSON text.
    pub fn json(&self) -> ValueReader<String> {
        self.json.clone()
    }

    /// The store's key codec when its keys are `K`; `None` when they are not.
    pub fn key_codec<K: 'static>(&self) -> Option<Arc<dyn Codec<K>>> {
        if self.key_type.0 != TypeId::of::<K>() {
            return None;
        }
        self.key_codec.downcast_ref::<Arc<dyn Codec<K>>>().cloned()
    }

    /// The store's key codec and value reader when its keys are `K` and its values `V`;
    /// `None` when either type differs.
    pub fn typed<K: 'static, V: 'static>(&self) -> Option<(Arc<dyn Codec<K>>, ValueReader<V>)> {
        if self.key_type.0 != TypeId::of::<K>() || self.value_type.0 != TypeId::of::<V>() {
            return None;
        }
        let key = self.key_codec.downcast_ref::<Arc<dyn Codec<K>>>()?.clone();
        let value = self.value.downcast_ref::<ValueReader<V>>()?.clone();
        Some((key, value))
    }
}

impl fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreSpec")
            .field("name", &self.name)
            .field("key", &self.key_type.1)
            .field("value", &self.value_type.1)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Utf8;

    fn spec() -> StoreSpec {
        let value: ValueReader<u64> = Arc::new(|b: &[u8]| Ok(b.first().map(|v| u64::from(*v))));
        StoreSpec::new::<String, u64>("counts", Arc::new(Utf8), value)
    }

    #[test]
    fn a_store_hands_its_codec_and_reader_back_only_for_its_own_types() {
        let spec = spec();
        let (key, value) = spec.typed::<String, u64>().expect("its own types");
        assert_eq!(key.encode(&"k".to_string()).unwrap(), b"k");
        assert_eq!(value(&[7]).unwrap(), Some(7));
        assert!(spec.typed::<String, i64>().is_none(), "another value type");
        assert!(spec.typed::<Vec<u8>, u64>().is_none(), "another key type");
        assert!(spec.key_codec::<String>().is_some());
        assert!(spec.key_codec::<u64>().is_none());
        assert_eq!((spec.json())(&[7]).unwrap().as_deref(), Some("7"));
        assert_eq!(spec.types(), ("alloc::string::String", "u64"));
    }
}
