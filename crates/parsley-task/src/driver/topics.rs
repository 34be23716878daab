//! The typed faces of the driver's topics: [`InputTopic`] pipes records in, [`OutputTopic`]
//! reads them back as a `read_committed` consumer would, each handle from where it last read.

use std::collections::BTreeMap;

use parsley_clock::{Coordinate, Stamp};
use parsley_stage::Codec;

use super::TopologyTestDriver;
use super::log::{Stored, StoredHeader};
use crate::error::Result;

/// One record to pipe as bytes ([`InputTopic::pipe_raw`], [`TopologyTestDriver::pipe_raw`]):
/// what a typed pipe cannot write — a key on a partition of the test's choosing, headers, a
/// stamp made by hand, bytes no codec produces.
///
/// ```
/// use parsley_task::driver::RawInput;
///
/// let record = RawInput::new(Some(b"sku-1"), Some(b"not json"))
///     .partition(1)
///     .timestamp(1_000) // ms since the epoch
///     .header("origin", b"import");
/// assert_eq!(record.partition, Some(1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawInput {
    /// Key bytes; `None`: a record without a key.
    pub key: Option<Vec<u8>>,
    /// Value bytes; `None`: a tombstone.
    pub value: Option<Vec<u8>>,
    /// The record timestamp, ms since the epoch; `None`: the driver's time
    /// ([`TopologyTestDriver::time_ms`]).
    pub timestamp: Option<i64>,
    /// The partition; `None`: murmur2 of the key modulo the partition count, or round robin
    /// for a record without a key, as real writers choose.
    pub partition: Option<i32>,
    /// A stamp, written as the stamp header before the other headers.
    pub stamp: Option<Stamp>,
    /// Headers, in order (`None`: a null value).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl RawInput {
    /// A record with `key` and `value` (either may be absent), no header, the driver's time.
    pub fn new(key: Option<&[u8]>, value: Option<&[u8]>) -> Self {
        RawInput {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            ..RawInput::default()
        }
    }

    /// Sets the record timestamp, ms since the epoch.
    pub fn timestamp(mut self, ms: i64) -> Self {
        self.timestamp = Some(ms);
        self
    }

    /// Writes the record to `partition`, whatever its key.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Stamps the record with `stamp`.
    pub fn stamp(mut self, stamp: Stamp) -> Self {
        self.stamp = Some(stamp);
        self
    }

    /// Adds a header `name` with `value`.
    pub fn header(mut self, name: impl Into<String>, value: &[u8]) -> Self {
        self.headers.push((name.into(), Some(value.to_vec())));
        self
    }
}

/// A record read back from a topic ([`OutputTopic`]), its key and value decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct TestRecord<K, V> {
    /// The topic's name.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset in the partition.
    pub offset: i64,
    /// The record's coordinate: its channel (the topic's id and the partition) and offset,
    /// what a producer claims when it observes the record ([`super::TestProducer::observe_record`]).
    pub coordinate: Coordinate,
    /// The record timestamp, ms since the epoch.
    pub timestamp: i64,
    /// The key.
    pub key: K,
    /// The value.
    pub value: V,
    /// Every header, in order, the stamp header included (`None`: a null value).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The decoded stamp header; `None` without one or when it does not decode.
    pub stamp: Option<Stamp>,
}

impl<K, V> TestRecord<K, V> {
    /// The value of the first header named `name`, as UTF-8 text (lossy), if present and not
    /// null.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// A record read back as bytes: key and value as stored (`None`: absent).
pub type RawRecord = TestRecord<Option<Vec<u8>>, Option<Vec<u8>>>;

/// Pipes typed records into one topic of a [`TopologyTestDriver`], encoded with the handle's
/// codecs; after each pipe the driver runs the topology (unless auto-run is off).
///
/// Every pipe returns the coordinate the record was appended at (offsets: `i64`, from 0 per
/// partition) or the error a stage stopped with while the topology ran
/// ([`TopologyTestDriver::run`]); the record is in the topic either way.
///
/// # Panics
/// Every pipe panics when the handle's codecs cannot encode the key or value.
pub struct InputTopic<'d, K, V> {
    pub(super) driver: &'d TopologyTestDriver,
    pub(super) topic: String,
    pub(super) key_codec: Box<dyn Codec<K>>,
    pub(super) value_codec: Box<dyn Codec<V>>,
}

impl<K, V> InputTopic<'_, K, V> {
    /// The topic's name.
    pub fn name(&self) -> &str {
        &self.topic
    }

    /// Pipes `key` and `value` at the driver's time ([`TopologyTestDriver::time_ms`]).
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`].
    pub fn pipe(&self, key: K, value: V) -> Result<Coordinate> {
        let record = RawInput {
            key: self.key(key),
            value: self.value(value),
            ..RawInput::default()
        };
        self.pipe_raw(record)
    }

    /// Pipes `key` and `value` with record timestamp `timestamp_ms` (ms since the epoch: the
    /// event time of an event-time stage).
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`].
    pub fn pipe_at(&self, key: K, value: V, timestamp_ms: i64) -> Result<Coordinate> {
        let record = RawInput {
            key: self.key(key),
            value: self.value(value),
            timestamp: Some(timestamp_ms),
            ..RawInput::default()
        };
        self.pipe_raw(record)
    }

    /// Pipes `value` without a key (partitions taken round robin).
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`].
    pub fn pipe_value(&self, value: V) -> Result<Coordinate> {
        let record = RawInput {
            value: self.value(value),
            ..RawInput::default()
        };
        self.pipe_raw(record)
    }

    /// Pipes a tombstone (no value) for `key`.
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`].
    pub fn pipe_tombstone(&self, key: K) -> Result<Coordinate> {
        let record = RawInput {
            key: self.key(key),
            ..RawInput::default()
        };
        self.pipe_raw(record)
    }

    /// Pipes `record` as bytes ([`RawInput`]).
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`].
    ///
    /// # Panics
    /// When its partition is not one of the topic's.
    pub fn pipe_raw(&self, record: RawInput) -> Result<Coordinate> {
        self.driver.pipe_raw(&self.topic, record)
    }

    fn key(&self, key: K) -> Option<Vec<u8>> {
        self.key_codec
            .encode_part(key)
            .unwrap_or_else(|e| panic!("cannot encode a key piped to {}: {e}", self.topic))
    }

    fn value(&self, value: V) -> Option<Vec<u8>> {
        self.value_codec
            .encode_part(value)
            .unwrap_or_else(|e| panic!("cannot encode a value piped to {}: {e}", self.topic))
    }
}

/// Reads the records of one topic of a [`TopologyTestDriver`] as a `read_committed` consumer
/// would — records of an open producer transaction stay unread until it commits — merged
/// across partitions in the order they were appended, each handle from where it last read.
///
/// # Panics
/// The typed reads panic when a key or value does not decode with the handle's codecs (an
/// absent key or value decodes as the codec's [`Codec::decode_absent`]); read such records
/// with [`OutputTopic::read_raw_record`].
pub struct OutputTopic<'d, K, V> {
    pub(super) driver: &'d TopologyTestDriver,
    pub(super) topic: String,
    pub(super) key_codec: Box<dyn Codec<K>>,
    pub(super) value_codec: Box<dyn Codec<V>>,
    /// The next offset to read, per partition.
    pub(super) next: Vec<i64>,
}

impl<K, V> OutputTopic<'_, K, V> {
    /// The topic's name.
    pub fn name(&self) -> &str {
        &self.topic
    }

    /// The next record, as bytes; `None` when every visible record was read.
    pub fn read_raw_record(&mut self) -> Option<RawRecord> {
        let (partition, offset, id, stored) = self.driver.next_visible(&self.topic, &self.next)?;
        self.next[partition as usize] = offset + 1;
        Some(raw_record(&self.topic, partition, offset, id, stored))
    }

    /// The next record, decoded; `None` when every visible record was read.
    pub fn read_record(&mut self) -> Option<TestRecord<K, V>> {
        let r = self.read_raw_record()?;
        let at = || format!("{}/{}@{}", r.topic, r.partition, r.offset);
        let key = match &r.key {
            Some(k) => self.key_codec.decode(k),
            None => self.key_codec.decode_absent(),
        }
        .unwrap_or_else(|e| panic!("cannot decode the key of {}: {e}", at()));
        let value = match &r.value {
            Some(v) => self.value_codec.decode(v),
            None => self.value_codec.decode_absent(),
        }
        .unwrap_or_else(|e| panic!("cannot decode the value of {}: {e}", at()));
        Some(TestRecord {
            topic: r.topic,
            partition: r.partition,
            offset: r.offset,
            coordinate: r.coordinate,
            timestamp: r.timestamp,
            key,
            value,
            headers: r.headers,
            stamp: r.stamp,
        })
    }

    /// Every record not read yet, decoded.
    pub fn read_records(&mut self) -> Vec<TestRecord<K, V>> {
        std::iter::from_fn(|| self.read_record()).collect()
    }

    /// The keys and values of every record not read yet.
    pub fn read_key_values(&mut self) -> Vec<(K, V)> {
        std::iter::from_fn(|| self.read_record())
            .map(|r| (r.key, r.value))
            .collect()
    }

    /// The values of every record not read yet.
    pub fn read_values(&mut self) -> Vec<V> {
        std::iter::from_fn(|| self.read_record())
            .map(|r| r.value)
            .collect()
    }

    /// The last value of each key among the records not read yet (a tombstone's value is what
    /// the value codec decodes an absent value to).
    pub fn read_key_values_to_map(&mut self) -> BTreeMap<K, V>
    where
        K: Ord,
    {
        self.read_key_values().into_iter().collect()
    }

    /// How many visible records are not read yet.
    pub fn len(&self) -> usize {
        self.driver.visible_after(&self.topic, &self.next)
    }

    /// `true` when every visible record was read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A stored record, read back.
pub(super) fn raw_record(
    topic: &str,
    partition: i32,
    offset: i64,
    id: parsley_clock::TopicId,
    stored: Stored,
) -> RawRecord {
    let stamp = stored.stamp();
    let Stored {
        key,
        value,
        timestamp,
        headers,
        ..
    } = stored;
    let headers: Vec<StoredHeader> = headers;
    TestRecord {
        topic: topic.to_string(),
        partition,
        offset,
        coordinate: parsley_clock::Channel::new(id, partition).at(offset),
        timestamp,
        key,
        value,
        headers,
        stamp,
    }
}
