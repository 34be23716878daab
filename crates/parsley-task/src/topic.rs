//! Topics and partitions as the task sees them: a topic's identity and partition count, the
//! partition of a key, and the identity of one send.

use parsley_clock::{Channel, TopicId};
use parsley_stage::KeyPartitioning;

/// A topic as the cluster describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// The topic name.
    pub name: String,
    /// Its UUID (KIP-516).
    pub id: TopicId,
    /// Its partition count.
    pub partitions: i32,
}

/// Identifies one send in its delivery report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendTag {
    /// The sending task's partition, or a producer-chosen slot for plain producers.
    pub task: i32,
    /// The channel the record goes to.
    pub channel: Channel,
    /// The sender's send sequence of the record.
    pub seq: u64,
}

/// The partition of `key` among `partitions`: murmur2 of the key bytes, made positive, modulo
/// the partition count — the Java client's default partitioner (`Utils.murmur2`,
/// `Utils.toPositive`), Kafka Streams' and librdkafka's `murmur2` partitioner — so records
/// written by Parsley and by Java producers for one key land in the same partition.
///
/// # Panics
/// When `partitions <= 0`.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    ((murmur2(key) & 0x7fff_ffff) % partitions as u32) as i32
}

/// The partition of `key` among `partitions` by CRC-32 (IEEE) of the key bytes modulo the
/// partition count: librdkafka's `consistent` and `consistent_random` partitioners
/// (`rd_crc32(key) % partition_cnt`), the default of librdkafka-based clients for a record with
/// a key.
///
/// # Panics
/// When `partitions <= 0`.
pub fn crc32_partition_for(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (crc32fast::hash(key) % partitions as u32) as i32
}

/// The partition `partitioning` gives `key` among `partitions`; `None` for
/// [`KeyPartitioning::Unchecked`].
///
/// # Panics
/// When `partitions <= 0`.
pub fn partition_by(partitioning: KeyPartitioning, key: &[u8], partitions: i32) -> Option<i32> {
    match partitioning {
        KeyPartitioning::Murmur2 => Some(partition_for(key, partitions)),
        KeyPartitioning::Crc32 => Some(crc32_partition_for(key, partitions)),
        KeyPartitioning::Unchecked => None,
    }
}

/// The task that owns `key` (its bytes) in a stage whose partitioned (not global) sources are
/// `sources`, each with its partition count and its writers' partitioner: the partition the
/// first checked partitioner gives the key among the sources' partition count (co-partitioned:
/// one count for all; the largest, should they differ), the rule the stage checks delivered
/// records with. `None` when every source is [`KeyPartitioning::Unchecked`] (a key has no one
/// task) or none has a partition.
pub fn task_of(sources: &[(i32, KeyPartitioning)], key: &[u8]) -> Option<i32> {
    let partitions = sources.iter().map(|(n, _)| *n).max().filter(|n| *n > 0)?;
    let partitioning = sources
        .iter()
        .map(|(_, p)| *p)
        .find(|p| *p != KeyPartitioning::Unchecked)?;
    partition_by(partitioning, key, partitions)
}

/// Kafka's murmur2 (seed `0x9747b28c`), as the Java client's `Utils.murmur2` computes it.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() == 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_belongs_to_the_task_the_stages_checked_partitioner_gives_it() {
        use KeyPartitioning::{Crc32, Murmur2, Unchecked};
        let key = b"123456789";
        // The first checked partitioner decides; an unchecked source does not.
        assert_eq!(task_of(&[(1000, Unchecked), (1000, Crc32)], key), Some(262));
        assert_eq!(
            task_of(&[(12, Murmur2), (12, Murmur2)], key),
            Some(partition_for(key, 12))
        );
        assert_ne!(
            task_of(&[(1000, Murmur2)], key),
            Some(262),
            "murmur2 is not CRC-32 here"
        );
        // Nothing checked, or nothing partitioned: no task owns a key.
        assert_eq!(task_of(&[(4, Unchecked)], key), None);
        assert_eq!(task_of(&[], key), None);
    }

    #[test]
    fn crc32_partitions_as_librdkafkas_consistent_partitioner() {
        // CRC-32 (IEEE)'s check value: "123456789" hashes to 0xcbf43926 = 3421780262.
        assert_eq!(crc32_partition_for(b"123456789", 1000), 262);
        assert_eq!(crc32_partition_for(b"", 7), 0, "CRC-32 of nothing is 0");
        assert_eq!(
            partition_by(KeyPartitioning::Crc32, b"123456789", 1000),
            Some(262)
        );
        assert_eq!(
            partition_by(KeyPartitioning::Murmur2, b"k", 4),
            Some(partition_for(b"k", 4))
        );
        assert_eq!(partition_by(KeyPartitioning::Unchecked, b"k", 4), None);
    }

    /// Kafka's own `UtilsTest.testMurmur2` vectors: the Java client's hash of these keys.
    #[test]
    fn keys_land_where_the_java_client_puts_them() {
        // UtilsTest.testMurmur2: murmur2 of these strings' UTF-8 bytes.
        let cases: [(&str, i32); 5] = [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
        ];
        for (key, java) in cases {
            assert_eq!(murmur2(key.as_bytes()) as i32, java, "murmur2({key:?})");
        }
        assert_eq!(murmur2(b"abc") as i32, 479470107);
    }

    #[test]
    fn partitioning_matches_javas_murmur2() {
        // Java: Utils.murmur2("kafka".getBytes()) == 0xd067cf64 (librdkafka's test vector).
        let positive = 0xd067_cf64u32 & 0x7fff_ffff;
        assert_eq!(partition_for(b"kafka", 1000), (positive % 1000) as i32);
        assert_eq!(partition_for(b"kafka", 1000), 580);
        let empty = 0x106e_08d9u32 & 0x7fff_ffff;
        assert_eq!(partition_for(b"", 7), (empty % 7) as i32);
    }

    #[test]
    fn a_partition_is_within_the_count() {
        for n in 1..20 {
            for key in [&b""[..], b"a", b"ab", b"abc", b"abcd", b"abcde"] {
                let p = partition_for(key, n);
                assert!((0..n).contains(&p));
            }
        }
    }

    #[test]
    #[should_panic(expected = "at least one partition")]
    fn no_partitions_panics() {
        partition_for(b"k", 0);
    }
}
