//! Channels and coordinates: the identity of a partition and of one record in it.
//!
//! A [`Channel`] is `(topic id, partition)` where the topic id is Kafka's topic UUID
//! (KIP-516), not the topic's name: a topic deleted and recreated under the same name gets a
//! new UUID and so is a *different* channel, and a [`Coordinate`] can never silently rebind
//! to another record history (the book's specification, §1).
//!
//! Invariants kept here:
//! - `Channel` orders by topic id, then partition; clocks and the header codec rely on this
//!   order to keep entries sorted and to group them by topic.
//! - A `Coordinate` names a broker-assigned offset (`i64`, `>= 0` for a real record).

use std::cmp::Ordering;
use std::fmt;

use uuid::Uuid;

/// Kafka's topic UUID (KIP-516), as returned by the admin `DescribeTopics` call.
///
/// Shape: 16 bytes, kept as two `u64` halves (most significant first) so that comparisons —
/// the gate and the clocks compare channels on every claim — are two machine words, in the
/// same order as the big-endian bytes, and so that a [`Channel`] is 24 bytes with 8-byte
/// alignment (a `u128` would pad every clock entry to 48 bytes).
/// Displayed in the hyphenated hex form (`0f1e…-…`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TopicId {
    most_significant: u64,
    least_significant: u64,
}

impl TopicId {
    /// Wraps a topic UUID.
    pub const fn from_uuid(uuid: Uuid) -> Self {
        let (most_significant, least_significant) = uuid.as_u64_pair();
        TopicId {
            most_significant,
            least_significant,
        }
    }

    /// Builds a topic id from the two 64-bit halves Kafka uses on the wire
    /// (most significant first), as librdkafka's `rd_kafka_Uuid_*_significant_bits` return.
    pub const fn from_halves(most_significant: i64, least_significant: i64) -> Self {
        TopicId {
            most_significant: most_significant as u64,
            least_significant: least_significant as u64,
        }
    }

    /// Builds a topic id from its 16 big-endian bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        let v = u128::from_be_bytes(bytes);
        TopicId {
            most_significant: (v >> 64) as u64,
            least_significant: v as u64,
        }
    }

    /// The 16 big-endian bytes of the UUID.
    pub const fn to_bytes(&self) -> [u8; 16] {
        (((self.most_significant as u128) << 64) | self.least_significant as u128).to_be_bytes()
    }

    /// The UUID.
    pub const fn as_uuid(&self) -> Uuid {
        Uuid::from_u64_pair(self.most_significant, self.least_significant)
    }

    /// Kafka's reserved "zero" topic id (`Uuid.ZERO_UUID`): never assigned to a real topic.
    pub const fn is_zero(&self) -> bool {
        self.most_significant == 0 && self.least_significant == 0
    }
}

impl TopicId {
    /// The UUID as one number: comparing two of them is a wide compare, not a chain of
    /// branches on each half.
    #[inline(always)]
    const fn as_u128(&self) -> u128 {
        ((self.most_significant as u128) << 64) | self.least_significant as u128
    }
}

/// Orders like the big-endian bytes (the most significant half first).
impl Ord for TopicId {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_u128().cmp(&other.as_u128())
    }
}

impl PartialOrd for TopicId {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }

    #[inline]
    fn lt(&self, other: &Self) -> bool {
        self.as_u128() < other.as_u128()
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.as_uuid(), f)
    }
}

/// A partition of a topic incarnation: `(topic id, partition)`.
///
/// The unit of total order in Kafka and the index of every clock. Ordered by topic id, then
/// partition.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Channel {
    /// The topic's UUID (KIP-516).
    pub topic: TopicId,
    /// The partition number, `>= 0`.
    pub partition: i32,
}

impl Channel {
    /// A channel of `topic` at `partition`.
    pub const fn new(topic: TopicId, partition: i32) -> Self {
        Channel { topic, partition }
    }

    /// The coordinate of the record at `offset` on this channel.
    pub const fn at(self, offset: i64) -> Coordinate {
        Coordinate {
            channel: self,
            offset,
        }
    }
}

impl Ord for Channel {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        self.topic
            .cmp(&other.topic)
            .then(self.partition.cmp(&other.partition))
    }
}

impl PartialOrd for Channel {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }

    /// Branch-light: the clocks and the gate compare channels on every claim.
    #[inline]
    fn lt(&self, other: &Self) -> bool {
        let (a, b) = (self.topic.as_u128(), other.topic.as_u128());
        a < b || (a == b && self.partition < other.partition)
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// A channel plus a broker-assigned offset: the identity of one appended record.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Coordinate {
    /// The channel the record was appended to.
    pub channel: Channel,
    /// The record's offset (`i64`, assigned by the partition leader).
    pub offset: i64,
}

impl fmt::Display for Coordinate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.channel, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_round_trip_to_bytes_in_kafka_order() {
        let id = TopicId::from_halves(0x0102_0304_0506_0708, -1);
        assert_eq!(
            id.to_bytes(),
            [
                1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
            ]
        );
        assert_eq!(TopicId::from_bytes(id.to_bytes()), id);
        assert_eq!(TopicId::from_uuid(id.as_uuid()), id);
        assert!(!id.is_zero());
        assert!(TopicId::from_halves(0, 0).is_zero());
    }

    #[test]
    fn topic_ids_order_like_their_bytes() {
        let low = TopicId::from_bytes([0, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let high = TopicId::from_bytes([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(low < high);
        assert_eq!(low.to_bytes().cmp(&high.to_bytes()), low.cmp(&high));
    }

    #[test]
    fn channels_order_by_topic_then_partition() {
        let a = TopicId::from_halves(1, 0);
        let b = TopicId::from_halves(2, 0);
        let mut v = vec![Channel::new(b, 0), Channel::new(a, 2), Channel::new(a, 1)];
        v.sort();
        assert_eq!(
            v,
            vec![Channel::new(a, 1), Channel::new(a, 2), Channel::new(b, 0)]
        );
    }

    proptest::proptest! {
        /// The hand-written orders agree with the order of (big-endian bytes, partition),
        /// for ids that differ in either half or not at all.
        #[test]
        fn channels_order_like_topic_bytes_then_partition(
            a in proptest::prelude::any::<(u64, u64, i32)>(),
            b in proptest::prelude::any::<(u64, u64, i32)>(),
            same in 0u8..4,
        ) {
            let (ma, la, pa) = a;
            let (mut mb, mut lb, pb) = b;
            if same & 1 != 0 { mb = ma; }
            if same & 2 != 0 { lb = la; }
            let x = Channel::new(TopicId::from_halves(ma as i64, la as i64), pa);
            let y = Channel::new(TopicId::from_halves(mb as i64, lb as i64), pb);
            let expected = (x.topic.to_bytes(), pa).cmp(&(y.topic.to_bytes(), pb));
            proptest::prop_assert_eq!(x.cmp(&y), expected);
            proptest::prop_assert_eq!(x < y, expected.is_lt());
            proptest::prop_assert_eq!(x.partial_cmp(&y), Some(expected));
            proptest::prop_assert_eq!(x.topic.cmp(&y.topic), x.topic.to_bytes().cmp(&y.topic.to_bytes()));
            proptest::prop_assert_eq!(x.topic < y.topic, x.topic.to_bytes() < y.topic.to_bytes());
            proptest::prop_assert_eq!(x == y, expected.is_eq());
        }
    }

    #[test]
    fn coordinate_display_names_channel_and_offset() {
        let c = Channel::new(TopicId::from_halves(0, 1), 3).at(42);
        assert_eq!(c.to_string(), "00000000-0000-0000-0000-000000000001/3@42");
    }
}
