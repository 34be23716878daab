//! The pure part of the replay check: an output topic as per-key sequences, and the first
//! difference between two runs' sequences.

use std::collections::BTreeMap;
use std::fmt;

/// One record of an output topic, as the check reads it back (`read_committed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// Partition.
    pub partition: i32,
    /// Offset (i64).
    pub offset: i64,
    /// Key bytes; `None`: a null key.
    pub key: Option<Vec<u8>>,
    /// Value bytes; `None`: a tombstone.
    pub value: Option<Vec<u8>>,
}

/// One entry of a key's sequence: the partition it was written to and its value bytes
/// (`None`: a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Partition.
    pub partition: i32,
    /// Value bytes; `None`: a tombstone.
    pub value: Option<Vec<u8>>,
}

/// An output topic as per-key sequences: key bytes (`None`: a null key) → the key's records in
/// partition order, each partition's in offset order (a key normally lives in one partition).
pub type Sequences = BTreeMap<Option<Vec<u8>>, Vec<Entry>>;

/// The per-key sequences of `records` (in any order: they are sorted by partition and offset
/// first).
pub fn sequences(records: &[OutputRecord]) -> Sequences {
    let mut sorted: Vec<&OutputRecord> = records.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut out = Sequences::new();
    for r in sorted {
        out.entry(r.key.clone()).or_default().push(Entry {
            partition: r.partition,
            value: r.value.clone(),
        });
    }
    out
}

/// What one run has at a position of a key's sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing: the run's sequence for the key ends before this position (or the run has no
    /// record of the key at all).
    Absent,
    /// A record.
    Record(Entry),
}

/// The first place where a replay's output differs from the live run's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The output, by the name the check was given for it.
    pub output: String,
    /// The key's bytes (`None`: a null key).
    pub key: Option<Vec<u8>>,
    /// The position in the key's sequence, from 0.
    pub index: usize,
    /// What the live run has there.
    pub live: Found,
    /// What the replay has there.
    pub replay: Found,
}

/// How a replay's outputs compare with the live run's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Comparison {
    /// The first difference: outputs in name order, keys in byte order, then the first
    /// position where the two sequences of that key differ. `None`: identical.
    pub first: Option<Difference>,
    /// Keys (over all outputs) whose sequences differ.
    pub differing_keys: usize,
}

/// Compares every output's per-key sequences of a replay with the live run's, byte for byte
/// (values and partitions). An output missing from one side counts as having no records.
pub fn compare(
    live: &BTreeMap<String, Sequences>,
    replay: &BTreeMap<String, Sequences>,
) -> Comparison {
    let empty = Sequences::new();
    let mut outputs: Vec<&String> = live.keys().chain(replay.keys()).collect();
    outputs.sort();
    outputs.dedup();
    let mut result = Comparison::default();
    for output in outputs {
        let l = live.get(output).unwrap_or(&empty);
        let r = replay.get(output).unwrap_or(&empty);
        let mut keys: Vec<&Option<Vec<u8>>> = l.keys().chain(r.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let ls = l.get(key).map_or(&[][..], Vec::as_slice);
            let rs = r.get(key).map_or(&[][..], Vec::as_slice);
            let Some(index) = first_mismatch(ls, rs) else {
                continue;
            };
            result.differing_keys += 1;
            if result.first.is_none() {
                let at = |s: &[Entry]| s.get(index).cloned().map_or(Found::Absent, Found::Record);
                result.first = Some(Difference {
                    output: output.clone(),
                    key: key.clone(),
                    index,
                    live: at(ls),
                    replay: at(rs),
                });
            }
        }
    }
    result
}

/// The first position where `a` and `b` differ, one being shorter counting as a difference.
fn first_mismatch(a: &[Entry], b: &[Entry]) -> Option<usize> {
    (0..a.len().max(b.len())).find(|i| a.get(*i) != b.get(*i))
}

/// Bytes as text for a report: UTF-8 as it is, anything else in hex (`0x…`).
pub fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Absent => f.write_str("nothing (the sequence ends)"),
            Found::Record(Entry {
                partition,
                value: Some(v),
            }) => write!(f, "{} (partition {partition})", text(v)),
            Found::Record(Entry {
                partition,
                value: None,
            }) => write!(f, "a tombstone (partition {partition})"),
        }
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key.as_deref().map_or_else(|| "null".to_string(), text);
        write!(
            f,
            "output {}, key {key}, record {} of the key: live {}, replay {}",
            self.output, self.index, self.live, self.replay
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(partition: i32, offset: i64, key: &str, value: &str) -> OutputRecord {
        OutputRecord {
            partition,
            offset,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
        }
    }

    fn outputs(records: &[OutputRecord]) -> BTreeMap<String, Sequences> {
        BTreeMap::from([("out".to_string(), sequences(records))])
    }

    fn entry(partition: i32, value: &str) -> Found {
        Found::Record(Entry {
            partition,
            value: Some(value.as_bytes().to_vec()),
        })
    }

    #[test]
    fn sequences_follow_offsets_per_key_whatever_order_the_records_come_in() {
        let s = sequences(&[
            rec(1, 5, "b", "b2"),
            rec(0, 3, "a", "a2"),
            rec(1, 4, "b", "b1"),
            rec(0, 1, "a", "a1"),
        ]);
        let values = |k: &str| -> Vec<String> {
            s[&Some(k.as_bytes().to_vec())]
                .iter()
                .map(|e| text(e.value.as_deref().unwrap()))
                .collect()
        };
        assert_eq!(values("a"), ["a1", "a2"]);
        assert_eq!(values("b"), ["b1", "b2"]);
    }

    #[test]
    fn interleaving_keys_differently_is_no_difference() {
        let live = outputs(&[
            rec(0, 0, "a", "1"),
            rec(0, 1, "b", "1"),
            rec(0, 2, "a", "2"),
        ]);
        let replay = outputs(&[
            rec(0, 0, "b", "1"),
            rec(0, 1, "a", "1"),
            rec(0, 2, "a", "2"),
        ]);
        assert_eq!(compare(&live, &replay), Comparison::default());
    }

    #[test]
    fn the_first_difference_names_the_key_the_index_and_both_values() {
        let live = outputs(&[
            rec(0, 0, "a", "1"),
            rec(0, 1, "a", "3"),
            rec(1, 0, "b", "5"),
        ]);
        let replay = outputs(&[
            rec(0, 0, "a", "1"),
            rec(0, 1, "a", "2"),
            rec(1, 0, "b", "6"),
        ]);
        let c = compare(&live, &replay);
        assert_eq!(c.differing_keys, 2);
        let d = c.first.unwrap();
        assert_eq!(
            d,
            Difference {
                output: "out".into(),
                key: Some(b"a".to_vec()),
                index: 1,
                live: entry(0, "3"),
                replay: entry(0, "2"),
            }
        );
        assert_eq!(
            d.to_string(),
            "output out, key a, record 1 of the key: live 3 (partition 0), replay 2 (partition 0)"
        );
    }

    #[test]
    fn a_shorter_sequence_a_missing_key_a_tombstone_and_a_partition_are_differences() {
        let live = outputs(&[rec(0, 0, "a", "1"), rec(0, 1, "a", "2")]);
        let shorter = outputs(&[rec(0, 0, "a", "1")]);
        let d = compare(&live, &shorter).first.unwrap();
        assert_eq!(
            (d.index, &d.live, &d.replay),
            (1, &entry(0, "2"), &Found::Absent)
        );
        assert!(
            d.to_string()
                .ends_with("replay nothing (the sequence ends)")
        );

        let extra = outputs(&[
            rec(0, 0, "a", "1"),
            rec(0, 1, "a", "2"),
            rec(0, 2, "z", "9"),
        ]);
        let d = compare(&live, &extra).first.unwrap();
        assert_eq!((d.key.as_deref(), d.index), (Some(&b"z"[..]), 0));
        assert_eq!(d.live, Found::Absent);

        let mut tombstone = rec(0, 1, "a", "");
        tombstone.value = None;
        let d = compare(&live, &outputs(&[rec(0, 0, "a", "1"), tombstone]))
            .first
            .unwrap();
        assert!(d.to_string().ends_with("replay a tombstone (partition 0)"));

        let moved = outputs(&[rec(0, 0, "a", "1"), rec(3, 0, "a", "2")]);
        let d = compare(&live, &moved).first.unwrap();
        assert_eq!((d.index, d.replay), (1, entry(3, "2")));
    }

    #[test]
    fn outputs_are_compared_by_name_and_a_missing_output_is_an_empty_one() {
        let mut live = outputs(&[rec(0, 0, "a", "1")]);
        live.insert("late".into(), sequences(&[rec(0, 0, "k", "v")]));
        let replay = outputs(&[rec(0, 0, "a", "1")]);
        let c = compare(&live, &replay);
        assert_eq!(c.differing_keys, 1);
        assert_eq!(c.first.unwrap().output, "late");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_in_hex() {
        assert_eq!(text(b"c-0001"), "c-0001");
        assert_eq!(text(&[0xff, 0x00, 0x10]), "0xff0010");
    }
}
