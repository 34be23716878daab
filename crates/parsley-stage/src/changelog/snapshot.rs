//! The task snapshot record ([`TaskSnapshot`], key [`META_KEY`](super::META_KEY)).

use parsley_clock::{Channel, Clock, SenderId, TopicId};
use parsley_gate::{ChannelSnapshot, GateSnapshot};

/// Version of the snapshot encoding.
const SNAPSHOT_VERSION: u8 = 1;
/// Largest snapshot body decoded, bytes (a corrupt length never allocates more).
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
    /// allocates more than 64 MiB.
    ///
    /// # Errors
    /// A message naming what is wrong: empty bytes, an unknown version, bytes that do not
    /// decode (truncated, a length above the bound), trailing bytes, a clock whose entries are
    /// not strictly ascending by channel.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (&version, body) = bytes.split_first().ok_or("empty snapshot")?;
        if version != SNAPSHOT_VERSION {
            return Err(format!("unknown snapshot version {version}"));
        }
        let config = bincode::config::standard().with_limit::<SNAPSHOT_LIMIT>();
        let (w, used): (Wire, usize) =
            bincode::decode_from_slice(body, config).map_err(|e| e.to_string())?;
        if used != body.len() {
            return Err(format!("{} trailing bytes", body.len() - used));
        }
        let (sender, next_seq, clock, gate, offsets) = w;
        let clock =
            Clock::try_from_sorted(clock.into_iter().map(|(c, o)| (unwire(c), o)).collect())
                .map_err(|e| format!("clock: {e}"))?;
        Ok(TaskSnapshot {
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
        })
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
}
