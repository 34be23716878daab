//! The task snapshot record ([`TaskSnapshot`], key [`META_KEY`](super::META_KEY)).

use parsley_clock::{Channel, Clock, SenderId, TopicId};
use parsley_gate::{ChannelSnapshot, GateSnapshot};

/// Version of the snapshot encoding.
const SNAPSHOT_VERSION: u8 = 1;
/// Most a snapshot's decode may claim, bytes (a corrupt length never allocates more).
const SNAPSHOT_LIMIT: usize = 64 << 20;

/// Parsley's committed state of one task: what the runtime needs besides the fold state to
/// resume the task exactly where its last transaction left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSnapshot {
    /// The task incarnation's sender id.
    pub sender: SenderId,
    /// The sequence of its next send.
    pub next_seq: u64,
    /// Its node clock.
    pub clock: Clock,
    /// Its gate's committed part.
    pub gate: GateSnapshot,
    /// The input offsets committed with this snapshot: first undelivered offset per channel.
    pub offsets: Vec<(Channel, i64)>,
}

type WireChannel = ([u8; 16], i32);
/// Sender id, next sequence, clock entries, gate channels (channel, baseline, frontier,
/// look-ahead offsets, delivered sequences by sender id), input offsets.
type Wire = (
    [u8; 16],
    u64,
    Vec<(WireChannel, i64)>,
    Vec<(WireChannel, i64, i64, Vec<i64>, Vec<([u8; 16], u64)>)>,
    Vec<(WireChannel, i64)>,
);

fn wire(c: Channel) -> WireChannel {
    (c.topic.to_bytes(), c.partition)
}

fn unwire(c: WireChannel) -> Channel {
    Channel::new(TopicId::from_bytes(c.0), c.1)
}

impl TaskSnapshot {
    /// The record's value: version byte 1, then the bincode (standard configuration) of the
    /// fields in order, a channel as its topic id's 16 bytes and its partition.
    pub fn encode(&self) -> Vec<u8> {
        let w: Wire = (
            *self.sender.as_bytes(),
            self.next_seq,
            self.clock
                .entries()
                .iter()
                .map(|(c, o)| (wire(*c), *o))
                .collect(),
            self.gate
                .channels
                .iter()
                .map(|c| {
                    (
                        wire(c.channel),
                        c.baseline,
                        c.frontier,
                        c.lookahead.clone(),
                        c.delivered
                            .iter()
                            .map(|(s, q)| (*s.as_bytes(), *q))
                            .collect(),
                    )
                })
                .collect(),
            self.offsets.iter().map(|(c, o)| (wire(*c), *o)).collect(),
        );
        let mut out = vec![SNAPSHOT_VERSION];
        out.extend(
            bincode::encode_to_vec(&w, bincode::config::standard())
                .expect("encoding plain values into a vector cannot fail"),
        );
        out
    }

    /// Decodes a snapshot ([`TaskSnapshot::encode`]'s inverse). Bounded: a corrupt length never
    /// allocates more than 1 MiB for a snapshot of up to 4 KiB, and never more than 64 MiB
    /// (`parsley_gate::bounded`).
    ///
    /// # Errors
    /// A message naming what is wrong: empty bytes, an unknown version, bytes that do not
    /// decode (truncated, a length above the bound), trailing bytes, a clock whose entries are
    /// not strictly ascending by channel, a gate or input offsets that break the invariants
    /// the encoder keeps (named: the channel and the value).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (&version, body) = bytes.split_first().ok_or("empty snapshot")?;
        if version != SNAPSHOT_VERSION {
            return Err(format!("unknown snapshot version {version}"));
        }
        let (w, used): (Wire, usize) = parsley_gate::bounded::decode::<Wire, SNAPSHOT_LIMIT>(body)
            .map_err(|e| e.to_string())?;
        if used != body.len() {
            return Err(format!("{} trailing bytes", body.len() - used));
        }
        let (sender, next_seq, clock, gate, offsets) = w;
        let clock =
            Clock::try_from_sorted(clock.into_iter().map(|(c, o)| (unwire(c), o)).collect())
                .map_err(|e| format!("clock: {e}"))?;
        let snapshot = TaskSnapshot {
            sender: SenderId::from_bytes(sender),
            next_seq,
            clock,
            gate: GateSnapshot {
                channels: gate
                    .into_iter()
                    .map(
                        |(c, baseline, frontier, lookahead, delivered)| ChannelSnapshot {
                            channel: unwire(c),
                            baseline,
                            frontier,
                            lookahead,
                            delivered: delivered
                                .into_iter()
                                .map(|(s, q)| (SenderId::from_bytes(s), q))
                                .collect(),
                        },
                    )
                    .collect(),
            },
            offsets: offsets.into_iter().map(|(c, o)| (unwire(c), o)).collect(),
        };
        snapshot.check()?;
        Ok(snapshot)
    }

    /// The invariants [`TaskSnapshot::encode`]'s input keeps (a gate's snapshot and the input
    /// offsets computed from it): gate channels strictly ascending; per channel a baseline at
    /// or above 0, a frontier at or above `baseline - 1` and below `i64::MAX`, look-ahead
    /// offsets strictly ascending above the frontier, delivered sequences under strictly
    /// ascending sender ids; the input offsets name the gate's channels, in the same order,
    /// each at its frontier `+ 1` (the first undelivered offset). A snapshot that breaks one
    /// would restore a gate that disagrees with the offsets committed with it, and the next
    /// commit would carry the gate's (`frontier + 1`).
    fn check(&self) -> Result<(), String> {
        let channels = &self.gate.channels;
        for pair in channels.windows(2) {
            if pair[0].channel >= pair[1].channel {
                return Err(format!(
                    "gate channels not strictly ascending: {} before {}",
                    pair[0].channel, pair[1].channel
                ));
            }
        }
        for c in channels {
            let channel = c.channel;
            if c.baseline < 0 {
                return Err(format!(
                    "channel {channel}: negative baseline {}",
                    c.baseline
                ));
            }
            if c.frontier < c.baseline - 1 || c.frontier == i64::MAX {
                return Err(format!(
                    "channel {channel}: frontier {} outside [baseline - 1, i64::MAX) with baseline \
                     {}",
                    c.frontier, c.baseline
                ));
            }
            let mut above = c.frontier;
            for &o in &c.lookahead {
                if o <= above {
                    return Err(format!(
                        "channel {channel}: look-ahead offset {o} not strictly ascending above \
                         the frontier {}",
                        c.frontier
                    ));
                }
                above = o;
            }
            for pair in c.delivered.windows(2) {
                if pair[0].0 >= pair[1].0 {
                    return Err(format!(
                        "channel {channel}: delivered senders not strictly ascending"
                    ));
                }
            }
        }
        let expected = channels.iter().map(|c| (c.channel, c.frontier + 1));
        if !self.offsets.iter().copied().eq(expected) {
            return Err(format!(
                "input offsets {:?} are not the gate channels' frontiers + 1 {:?}",
                self.offsets
                    .iter()
                    .map(|(c, o)| format!("{c}@{o}"))
                    .collect::<Vec<_>>(),
                channels
                    .iter()
                    .map(|c| format!("{}@{}", c.channel, c.frontier + 1))
                    .collect::<Vec<_>>(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_and_bad_bytes_are_named() {
        let s = super::super::decode_properties::snapshot();
        let bytes = s.encode();
        assert_eq!(TaskSnapshot::decode(&bytes).unwrap(), s);
        assert_eq!(TaskSnapshot::decode(&[]).unwrap_err(), "empty snapshot");
        assert!(
            TaskSnapshot::decode(&[2])
                .unwrap_err()
                .contains("version 2")
        );
        assert!(TaskSnapshot::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(
            TaskSnapshot::decode(&long)
                .unwrap_err()
                .contains("trailing")
        );
    }

    #[test]
    fn a_snapshot_that_breaks_the_gate_s_invariants_is_refused_naming_what() {
        let refused = |change: &dyn Fn(&mut TaskSnapshot), expected: &str| {
            let mut s = super::super::decode_properties::snapshot();
            change(&mut s);
            let err = TaskSnapshot::decode(&s.encode()).unwrap_err();
            assert!(err.contains(expected), "{expected:?} not in {err:?}");
        };
        let c = super::super::decode_properties::snapshot().gate.channels[0].clone();
        refused(
            &|s| s.gate.channels.push(s.gate.channels[0].clone()),
            "not strictly ascending",
        );
        refused(
            &|s| s.gate.channels[0].baseline = -3,
            "negative baseline -3",
        );
        refused(
            &|s| s.gate.channels[0].frontier = -2,
            "frontier -2 outside [baseline - 1, i64::MAX)",
        );
        refused(
            &|s| s.gate.channels[0].frontier = i64::MAX,
            "outside [baseline - 1, i64::MAX)",
        );
        refused(
            &|s| s.gate.channels[0].lookahead = vec![15, 12],
            "look-ahead offset 12 not strictly ascending",
        );
        refused(
            &|s| s.gate.channels[0].lookahead = vec![9],
            "look-ahead offset 9 not strictly ascending above the frontier 9",
        );
        refused(
            &|s| {
                let d = s.gate.channels[0].delivered[0];
                s.gate.channels[0].delivered.push(d);
            },
            "delivered senders not strictly ascending",
        );
        // The input offsets must be the frontiers + 1, on the same channels.
        refused(&|s| s.offsets = vec![(c.channel, -1)], "frontiers + 1");
        refused(&|s| s.offsets = vec![(c.channel, 11)], "frontiers + 1");
        refused(&|s| s.offsets.clear(), "frontiers + 1");
        assert!(
            refused_message(|s| s.offsets = vec![(c.channel, 11)])
                .contains(&format!("{}@11", c.channel))
        );
        // An empty gate with no offsets is a valid snapshot (a task that saw nothing yet).
        let mut empty = super::super::decode_properties::snapshot();
        empty.gate.channels.clear();
        empty.offsets.clear();
        assert_eq!(TaskSnapshot::decode(&empty.encode()).unwrap(), empty);
    }

    fn refused_message(change: impl Fn(&mut TaskSnapshot)) -> String {
        let mut s = super::super::decode_properties::snapshot();
        change(&mut s);
        TaskSnapshot::decode(&s.encode()).unwrap_err()
    }
}
