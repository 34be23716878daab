//! The driver's in-memory topics: append-only partitions of stored records, with the offsets,
//! high watermarks and last stable offsets a broker would report.
//!
//! Invariants:
//! - offsets are dense: record `o` of a partition is at index `o` (no transaction markers);
//! - a record belongs to an open producer transaction until it commits; the **last stable
//!   offset** of a partition is the offset of its first such record, or its end; a
//!   `read_committed` reader sees exactly the records below it;
//! - every record has a timestamp (ms since the epoch) and a global append sequence, unique
//!   and increasing across all partitions: readers that merge partitions order by it;
//! - topic ids are fake but deterministic: the same name always gives the same id.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use parsley_clock::{Channel, Stamp, TopicId, codec, is_stamp_header};
use parsley_stage::KeyPartitioning;

use crate::error::SetupError;
use crate::error::{Error, Result};
use crate::output::Header;
use crate::record::FetchedMessage;
use crate::topic::TopicInfo;

/// A record header as stored: its name and value (`None`: a null value).
pub(super) type StoredHeader = (String, Option<Vec<u8>>);

/// One record in a partition.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    /// The global append sequence.
    pub seq: u64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// ms since the epoch.
    pub timestamp: i64,
    /// Every header, in order; a stamped record's stamp header first.
    pub headers: Vec<StoredHeader>,
    /// The producer whose open transaction holds the record; `None` once committed.
    pub open: Option<String>,
}

impl Stored {
    /// The value of the first stamp header (empty for a null value), if any.
    pub(super) fn stamp_header(&self) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(name, _)| is_stamp_header(name))
            .map(|(_, value)| value.as_deref().unwrap_or_default())
    }

    /// The decoded stamp; `None` without a stamp header or when it does not decode.
    pub(super) fn stamp(&self) -> Option<Stamp> {
        self.stamp_header().and_then(|b| codec::decode(b).ok())
    }
}

/// What to append: everything but the sequence.
#[derive(Debug, Clone)]
pub(super) struct Append {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// ms since the epoch.
    pub timestamp: i64,
    pub headers: Vec<StoredHeader>,
    /// The producer whose open transaction it joins, if any.
    pub open: Option<String>,
}

/// One in-memory topic.
#[derive(Debug)]
pub(super) struct Topic {
    pub info: TopicInfo,
    pub partitions: Vec<Vec<Stored>>,
    /// The partition the next record without a key goes to (round robin).
    next_keyless: i32,
    /// How its writers partition it by key: as a stage reading it declares
    /// ([`KeyPartitioning`]); murmur2 otherwise.
    partitioning: KeyPartitioning,
}

impl Topic {
    /// The end offset (high watermark, `READ_UNCOMMITTED`) of `partition`.
    pub(super) fn end(&self, partition: i32) -> i64 {
        self.partitions
            .get(partition as usize)
            .map_or(0, |p| p.len() as i64)
    }

    /// The last stable offset of `partition`: the first record of an open transaction, or the
    /// end.
    pub(super) fn last_stable(&self, partition: i32) -> i64 {
        self.partitions.get(partition as usize).map_or(0, |p| {
            p.iter().position(|r| r.open.is_some()).unwrap_or(p.len()) as i64
        })
    }
}

/// Every topic of the driver.
#[derive(Debug, Default)]
pub(super) struct Logs {
    topics: BTreeMap<String, Topic>,
    names: HashMap<TopicId, String>,
    next_seq: u64,
}

impl Logs {
    /// Creates topic `name` with `partitions` partitions.
    pub(super) fn create(&mut self, name: &str, partitions: i32) {
        let id = topic_id(name);
        assert!(
            self.names.get(&id).is_none_or(|n| n == name),
            "fake topic ids of {name:?} and {:?} collide",
            self.names[&id]
        );
        self.names.insert(id, name.to_string());
        self.topics.insert(
            name.to_string(),
            Topic {
                info: TopicInfo {
                    name: name.to_string(),
                    id,
                    partitions,
                },
                partitions: (0..partitions).map(|_| Vec::new()).collect(),
                next_keyless: 0,
                partitioning: KeyPartitioning::Murmur2,
            },
        );
    }

    /// Topic `name`.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`].
    pub(super) fn topic(&self, name: &str) -> Result<&Topic> {
        self.topics.get(name).ok_or_else(|| {
            Error::Setup(SetupError::UnknownTopic {
                topic: name.to_string(),
            })
        })
    }

    /// The topic of `id`, if the driver has it.
    pub(super) fn by_id(&self, id: TopicId) -> Option<&Topic> {
        self.names.get(&id).and_then(|n| self.topics.get(n))
    }

    /// The high watermark of `channel` (`READ_UNCOMMITTED`); 0 for a channel the driver does
    /// not have, as the runtime reads a deleted topic.
    pub(super) fn end(&self, channel: Channel) -> i64 {
        self.by_id(channel.topic)
            .map_or(0, |t| t.end(channel.partition))
    }

    /// The last stable offset of `channel`; 0 for a channel the driver does not have.
    pub(super) fn last_stable(&self, channel: Channel) -> i64 {
        self.by_id(channel.topic)
            .map_or(0, |t| t.last_stable(channel.partition))
    }

    /// The partition a record with `key` goes to on `topic`: as its writers partition it —
    /// murmur2 of the key, or CRC32 when a stage reading it declares so
    /// ([`Logs::declare_partitioning`]); a record without a key goes round robin.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`].
    pub(super) fn partition_for(&mut self, topic: &str, key: Option<&[u8]>) -> Result<i32> {
        let t = self.topics.get_mut(topic).ok_or_else(|| {
            Error::Setup(SetupError::UnknownTopic {
                topic: topic.to_string(),
            })
        })?;
        Ok(match key {
            Some(k) => crate::topic::partition_by(t.partitioning, k, t.info.partitions)
                .unwrap_or_else(|| crate::topic::partition_for(k, t.info.partitions)),
            None => {
                let p = t.next_keyless;
                t.next_keyless = (p + 1) % t.info.partitions;
                p
            }
        })
    }

    /// Declares that the writers of `topic` partition it by `partitioning` (a stage's
    /// declaration for its source); murmur2 and unchecked sources leave it as it is.
    pub(super) fn declare_partitioning(&mut self, topic: &str, partitioning: KeyPartitioning) {
        if let (Some(t), KeyPartitioning::Crc32) = (self.topics.get_mut(topic), partitioning) {
            t.partitioning = partitioning;
        }
    }

    /// Appends `record` to `topic`/`partition`; returns its offset.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`].
    ///
    /// # Panics
    /// When the partition is not one of the topic's.
    pub(super) fn append(&mut self, topic: &str, partition: i32, record: Append) -> Result<i64> {
        let t = self.topics.get_mut(topic).ok_or_else(|| {
            Error::Setup(SetupError::UnknownTopic {
                topic: topic.to_string(),
            })
        })?;
        let Some(p) = t
            .partitions
            .get_mut(usize::try_from(partition).unwrap_or(usize::MAX))
        else {
            panic!(
                "topic {topic} has {} partition(s), not a partition {partition}",
                t.info.partitions
            )
        };
        let Append {
            key,
            value,
            timestamp,
            headers,
            open,
        } = record;
        p.push(Stored {
            seq: self.next_seq,
            key,
            value,
            timestamp,
            headers,
            open,
        });
        self.next_seq += 1;
        Ok(p.len() as i64 - 1)
    }

    /// Removes the records at and above `offset` of `topic`/`partition` (a failed stage's
    /// uncommitted writes).
    pub(super) fn truncate(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(p) = self
            .topics
            .get_mut(topic)
            .and_then(|t| t.partitions.get_mut(partition as usize))
        {
            p.truncate(offset as usize);
        }
    }

    /// Commits the open transaction of `producer`: its records become visible.
    pub(super) fn commit(&mut self, producer: &str) {
        for topic in self.topics.values_mut() {
            for record in topic.partitions.iter_mut().flatten() {
                if record.open.as_deref() == Some(producer) {
                    record.open = None;
                }
            }
        }
    }
}

/// A deterministic fake topic UUID for `name` ([`name_uuid`]).
pub(super) fn topic_id(name: &str) -> TopicId {
    TopicId::from_bytes(name_uuid("topic", name))
}

/// A deterministic UUID for `name` among names of `kind`: two FNV-1a hashes, with the version
/// and variant bits of a custom (version 8) UUID.
pub(super) fn name_uuid(kind: &str, name: &str) -> [u8; 16] {
    let fnv = |seed: u64| {
        kind.bytes()
            .chain([0])
            .chain(name.bytes())
            .fold(seed, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
    };
    let (hi, lo) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142));
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_be_bytes());
    bytes[8..].copy_from_slice(&lo.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    bytes
}

/// One stored record as the task's intake reads it.
pub(super) struct View<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub record: &'a Stored,
}

impl FetchedMessage for View<'_> {
    fn topic(&self) -> &str {
        self.topic
    }

    fn partition(&self) -> i32 {
        self.partition
    }

    fn offset(&self) -> i64 {
        self.offset
    }

    fn timestamp_ms(&self) -> Option<i64> {
        Some(self.record.timestamp)
    }

    fn key(&self) -> Option<&[u8]> {
        self.record.key.as_deref()
    }

    fn value(&self) -> Option<&[u8]> {
        self.record.value.as_deref()
    }

    fn stamp_header(&self) -> Option<&[u8]> {
        self.record.stamp_header()
    }

    fn all_headers(&self) -> Box<[Header]> {
        self.record
            .headers
            .iter()
            .map(|(n, v)| (Cow::Owned(n.clone()), v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_are_deterministic_and_distinct() {
        assert_eq!(topic_id("orders"), topic_id("orders"));
        assert_ne!(topic_id("orders"), topic_id("payments"));
        assert_ne!(topic_id("a"), topic_id("b"));
    }

    #[test]
    fn the_last_stable_offset_stops_at_an_open_transaction() {
        let mut logs = Logs::default();
        logs.create("t", 1);
        let record = |open: Option<&str>| Append {
            key: None,
            value: None,
            timestamp: 1,
            headers: Vec::new(),
            open: open.map(str::to_string),
        };
        logs.append("t", 0, record(None)).unwrap();
        logs.append("t", 0, record(Some("p"))).unwrap();
        logs.append("t", 0, record(None)).unwrap();
        let c = Channel::new(topic_id("t"), 0);
        assert_eq!((logs.end(c), logs.last_stable(c)), (3, 1));
        logs.commit("p");
        assert_eq!(logs.last_stable(c), 3);
        logs.truncate("t", 0, 1);
        assert_eq!(logs.end(c), 1);
        assert_eq!(logs.end(Channel::new(topic_id("gone"), 0)), 0);
    }
}
