//! What a stream's keys and values are ([`Data`]) and the codecs they cross topics with: a
//! source's ([`Consumed`]), a sink's ([`Produced`]), and the pair of codecs an operator reads
//! or writes a topic with (`Codecs`).
//!
//! At the bottom of the crate: it imports none of its modules.

use std::sync::Arc;

use parsley_stage::{Auto, Codec, KeyPartitioning};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// What a stream's keys and values must be: owned, cloneable (a record reaching two operators
/// is cloned), sendable to the stream threads, and serde-encodable (they cross topics and
/// state). Implemented for every such type.
pub trait Data: Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}

impl<T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static> Data for T {}

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

/// [`Auto`] codecs for a repartition topic.
pub(crate) fn auto_codecs<K: Data, V: Data>() -> Codecs<K, V> {
    Codecs {
        key: Arc::new(Auto),
        value: Arc::new(Auto),
    }
}

/// The codecs a source is read with (Kafka Streams' `Consumed`), and the name of the source's
/// operator. The default is [`Auto`] for both codecs: a `String` as UTF-8, bytes as they are,
/// everything else JSON; and a generated name.
pub struct Consumed<K, V> {
    pub(crate) codecs: Codecs<K, V>,
    pub(crate) name: Option<String>,
    pub(crate) partitioning: KeyPartitioning,
    /// A versioned table's history retention, ms.
    pub(crate) versioned: Option<i64>,
}

impl<K: Data, V: Data> Consumed<K, V> {
    /// Reads keys with `key` and values with `value`.
    pub fn with(key: impl Codec<K> + 'static, value: impl Codec<V> + 'static) -> Self {
        Consumed {
            codecs: Codecs {
                key: Arc::new(key),
                value: Arc::new(value),
            },
            name: None,
            partitioning: KeyPartitioning::Murmur2,
            versioned: None,
        }
    }

    /// How the topic's writers partition it by key (default [`KeyPartitioning::Murmur2`], the
    /// Java client's and Kafka Streams' partitioner), checked on every record read:
    /// [`KeyPartitioning::Crc32`] for a topic written by librdkafka-based clients with their
    /// default partitioner (Python, Go, .NET, Rust's `rdkafka`). A stage reads such a source as
    /// it is — each key stays in one partition. Where a CRC32 stream meets a murmur2 input (a
    /// join, a cogroup, a merge before an aggregation) the DSL repartitions it first; a CRC32
    /// table beside a murmur2 stream is refused at `build` (a table is not repartitioned).
    ///
    /// ```
    /// # use parsley_dsl::{Consumed, StreamsBuilder};
    /// # use parsley_stage::KeyPartitioning;
    /// let builder = StreamsBuilder::new("shop");
    /// builder
    ///     .stream_with::<String, String>(
    ///         "clicks", // written by a Python service with confluent-kafka's defaults
    ///         Consumed::default().key_partitioning(KeyPartitioning::Crc32),
    ///     )
    ///     .group_by_key()
    ///     .count()
    ///     .to_stream()
    ///     .to("clicks-per-user");
    /// let topology = builder.build()?;
    /// assert_eq!(topology.stages().len(), 1, "no repartition: each key is in one partition");
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn key_partitioning(mut self, partitioning: KeyPartitioning) -> Self {
        self.partitioning = partitioning;
        self
    }

    /// Names the source's operator (Kafka Streams' `Consumed.as` and, for a table,
    /// `Materialized.as`): its line in `describe` and, for a source table
    /// ([`StreamsBuilder::table_with`](crate::StreamsBuilder::table_with)), its store — the
    /// state slot its rows are kept in. Name a source table to keep its rows when the pipeline
    /// changes around it: a generated name counts the operators added before it.
    ///
    /// ```
    /// # use parsley_dsl::{Consumed, StreamsBuilder};
    /// let builder = StreamsBuilder::new("shop");
    /// let orders = builder.table_with::<String, String>("orders", Consumed::default().named("orders"));
    /// orders.to_stream().to("order-log");
    /// assert!(builder.build()?.describe().to_string().contains("orders: table orders (store orders)"));
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Keeps the table read with these options versioned (Kafka Streams' versioned key-value
    /// store, KIP-889, as `Materialized.as(Stores.persistentVersionedKeyValueStore(name,
    /// historyRetention))` makes it): beside each key's latest value, every earlier version
    /// a read as of a time within `history_retention` of the table's observed stream time (the
    /// highest timestamp put into it, per task) can need. A stream–table join then joins each
    /// record with the table's value as of the record's timestamp (KIP-914), optionally after
    /// a grace period ([`Joined::with_grace_period`](crate::Joined::with_grace_period)).
    /// An update older than the observed stream time minus the retention is dropped; an update
    /// older than the key's latest version goes into its history and forwards nothing. For
    /// [`StreamsBuilder::table_with`](crate::StreamsBuilder::table_with); `build` refuses it
    /// elsewhere.
    ///
    /// # Panics
    /// When `history_retention` is over `i64::MAX` ms.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use parsley_dsl::{Consumed, Joined, StreamsBuilder};
    /// let builder = StreamsBuilder::new("shop");
    /// let prices = builder.table_with::<String, i64>(
    ///     "prices",
    ///     Consumed::default().versioned(Duration::from_secs(3600)),
    /// );
    /// builder
    ///     .stream::<String, i64>("orders")
    ///     .join_with(&prices, |quantity, price| quantity * price,
    ///         Joined::with_grace_period(Duration::from_secs(5)))
    ///     .to("order-values");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn versioned(mut self, history_retention: std::time::Duration) -> Self {
        self.versioned = Some(
            i64::try_from(history_retention.as_millis())
                .expect("a history retention of at most i64::MAX ms"),
        );
        self
    }
}

impl<K: Data, V: Data> Default for Consumed<K, V> {
    fn default() -> Self {
        Consumed::with(Auto, Auto)
    }
}

/// The codecs a sink is written with (Kafka Streams' `Produced`); the default is [`Auto`] for
/// both. The partition of a written record is murmur2 of its key bytes, as Kafka Streams and
/// the Java client's default partitioner compute it.
pub struct Produced<K, V> {
    pub(crate) codecs: Codecs<K, V>,
}

impl<K: Data, V: Data> Produced<K, V> {
    /// Writes keys with `key` and values with `value`.
    pub fn with(key: impl Codec<K> + 'static, value: impl Codec<V> + 'static) -> Self {
        Produced {
            codecs: Codecs {
                key: Arc::new(key),
                value: Arc::new(value),
            },
        }
    }
}

impl<K: Data, V: Data> Default for Produced<K, V> {
    fn default() -> Self {
        Produced::with(Auto, Auto)
    }
}

/// An `Option` as a list of none or one element.
pub(crate) mod none_or_one {
    use serde::de::{Deserialize, Deserializer, Error};
    use serde::ser::{Serialize, Serializer};

    pub(crate) fn serialize<T: Serialize, S: Serializer>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.as_slice().serialize(serializer)
    }

    pub(crate) fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        let mut values = Vec::<T>::deserialize(deserializer)?;
        match values.len() {
            0 | 1 => Ok(values.pop()),
            n => Err(D::Error::invalid_length(n, &"none or one value")),
        }
    }
}
