//! The event-time records of a task that orders by event time: the event-time record
//! ([`EventTimeRecord`], key [`EVENT_TIME_KEY`](super::EVENT_TIME_KEY)), the value of a timer
//! queue entry ([`ParkedRecord`], inside the segment records), and the rebuild of the task's
//! watermark and timer queue from both ([`EventTimeState::decode`]).
//!
//! Invariant: a parked entry's topic is named by the event-time record committed with it —
//! the rebuild refuses a parked record whose topic neither the stage's sources nor the record
//! name, so a record handed to the handler after a restore always has its topic's name.

use std::collections::BTreeMap;

use parsley_clock::{Channel, TopicId};
use parsley_gate::{Control, InputSnapshot, Part, TimerQueue, WatermarkSnapshot, WatermarkTracker};
use serde::{Deserialize, Serialize};

/// Version byte of the event-time record; 1 held the whole queue, 2 the header of a queue
/// changelogged record by record, 3 the header of segments whose entries also held the source
/// topic's name and a second copy of the key.
const CODEC_VERSION: u8 = 4;
/// Most an event-time record's decode may claim, bytes (a corrupt length never allocates
/// more).
const DECODE_LIMIT: usize = 1 << 30;

/// A delivered record waiting in a task's timer queue: what the handler needs besides its key
/// (the queue's key), and its coordinate and sender for the ancestor rule. The value of an
/// entry of a segment record (the queue's codec: bincode, standard configuration, through
/// serde). The source topic is named by the channel's topic id, not by name: a parked entry is
/// written once to the changelog, and the name was 40 % of its bytes.
///
/// The byte fields serialise as byte strings (`serde_bytes`): one length and a copy, where
/// serde's default writes a sequence element by element.
///
/// Headers: a record with user headers writes flag `2` beside its keyless flag (`1`), and its
/// value field holds the bincode of `(headers, value)`; one without writes exactly what was
/// written before headers were kept, so older changelogs read as records without headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ParkedWire", try_from = "ParkedWire")]
pub struct ParkedRecord {
    /// Its channel: topic id bytes and partition.
    pub channel: ([u8; 16], i32),
    /// Offset in the source partition.
    pub offset: i64,
    /// Kafka record timestamp, ms since the epoch (the event time, except for control records).
    pub timestamp: i64,
    /// The record had no key (null), as opposed to an empty one: the queue keys both by the
    /// empty key, and the handler gets back what was delivered.
    pub keyless: bool,
    /// Record value.
    pub value: Option<Vec<u8>>,
    /// Sender id bytes and sequence of its stamp, if stamped.
    pub sender: Option<([u8; 16], u64)>,
    /// The record's user headers (Parsley's own left out), handed to the handler with it.
    pub headers: Vec<crate::Header>,
}

/// Flag of a keyless record.
const KEYLESS: u8 = 1;
/// Flag of a record whose value field holds its headers and value.
const WITH_HEADERS: u8 = 2;

/// [`ParkedRecord`] as it is written.
#[derive(Serialize, Deserialize)]
struct ParkedWire {
    #[serde(with = "channel_bytes")]
    channel: ([u8; 16], i32),
    offset: i64,
    timestamp: i64,
    /// [`KEYLESS`] and [`WITH_HEADERS`]; written where a `bool` was (the same byte for 0 and 1).
    flags: u8,
    #[serde(with = "serde_bytes")]
    value: Option<Vec<u8>>,
    sender: Option<([u8; 16], u64)>,
}

/// Headers and value, in the value field of a record with headers.
type WithHeaders = (
    Vec<(String, Option<serde_bytes::ByteBuf>)>,
    Option<serde_bytes::ByteBuf>,
);

impl From<ParkedRecord> for ParkedWire {
    fn from(r: ParkedRecord) -> Self {
        let mut flags = if r.keyless { KEYLESS } else { 0 };
        let value = if r.headers.is_empty() {
            r.value
        } else {
            flags |= WITH_HEADERS;
            let both: WithHeaders = (
                r.headers
                    .into_iter()
                    .map(|(n, v)| (n.into_owned(), v.map(serde_bytes::ByteBuf::from)))
                    .collect(),
                r.value.map(serde_bytes::ByteBuf::from),
            );
            Some(
                bincode::serde::encode_to_vec(&both, bincode::config::standard())
                    .expect("encoding plain values into a vector cannot fail"),
            )
        };
        ParkedWire {
            channel: r.channel,
            offset: r.offset,
            timestamp: r.timestamp,
            flags,
            value,
            sender: r.sender,
        }
    }
}

impl TryFrom<ParkedWire> for ParkedRecord {
    type Error = String;

    fn try_from(w: ParkedWire) -> Result<Self, String> {
        if w.flags & !(KEYLESS | WITH_HEADERS) != 0 {
            return Err(format!("parked record: unknown flags {}", w.flags));
        }
        let (headers, value) = if w.flags & WITH_HEADERS == 0 {
            (Vec::new(), w.value)
        } else {
            let bytes = w
                .value
                .ok_or("parked record: headers flagged, none written")?;
            let (both, used): (WithHeaders, usize) =
                parsley_gate::bounded::decode_serde::<WithHeaders, DECODE_LIMIT>(&bytes)
                    .map_err(|e| format!("parked record headers: {e}"))?;
            if used != bytes.len() {
                return Err(format!(
                    "parked record headers: {} trailing bytes",
                    bytes.len() - used
                ));
            }
            let headers = both
                .0
                .into_iter()
                .map(|(n, v)| {
                    (
                        std::borrow::Cow::Owned(n),
                        v.map(serde_bytes::ByteBuf::into_vec),
                    )
                })
                .collect();
            (headers, both.1.map(serde_bytes::ByteBuf::into_vec))
        };
        Ok(ParkedRecord {
            channel: w.channel,
            offset: w.offset,
            timestamp: w.timestamp,
            keyless: w.flags & KEYLESS != 0,
            value,
            sender: w.sender,
            headers,
        })
    }
}

/// `([u8; 16], i32)` with the id as a byte string.
mod channel_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_bytes::ByteArray;

    pub(super) fn serialize<S: Serializer>(c: &([u8; 16], i32), s: S) -> Result<S::Ok, S::Error> {
        (ByteArray::new(c.0), c.1).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<([u8; 16], i32), D::Error> {
        let (id, partition) = <(ByteArray<16>, i32)>::deserialize(d)?;
        Ok((id.into_array(), partition))
    }
}

impl ParkedRecord {
    /// Its channel.
    pub fn channel(&self) -> Channel {
        Channel::new(TopicId::from_bytes(self.channel.0), self.channel.1)
    }
}

/// The event-time record of a task, written with every task snapshot in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventTimeRecord {
    /// The watermark tracker's committed part.
    pub watermark: WatermarkSnapshot,
    /// Names of the topics whose records may be parked, by topic id: the stage's sources, and
    /// former sources (deleted or recreated under a new id) that still have parked records.
    pub topics: Vec<(TopicId, String)>,
    /// The timer queue's header ([`parsley_gate::QueueParts::header`]: its watermark, next
    /// arrival, next segment number, counters), in the queue's own encoding.
    pub queue: Vec<u8>,
}

type WireInput = (([u8; 16], i32), Option<i64>, Vec<(i64, i64)>);
/// Watermark, inputs, topic names by id, the queue's header.
type Wire = (
    Option<i64>,
    Vec<WireInput>,
    Vec<([u8; 16], String)>,
    Vec<u8>,
);

impl EventTimeRecord {
    /// The record's value: version byte 4, then the bincode (standard configuration) of the
    /// watermark, the inputs (channel as topic id bytes and partition, prefix maximum,
    /// look-ahead `(offset, event time ms)` pairs), the topic names by id bytes, and the
    /// queue's header as bytes.
    pub fn encode(&self) -> Vec<u8> {
        let wire: Wire = (
            self.watermark.watermark,
            self.watermark
                .inputs
                .iter()
                .map(|s| {
                    (
                        (s.channel.topic.to_bytes(), s.channel.partition),
                        s.prefix_max,
                        s.lookahead.clone(),
                    )
                })
                .collect(),
            self.topics
                .iter()
                .map(|(id, name)| (id.to_bytes(), name.clone()))
                .collect(),
            self.queue.clone(),
        );
        let mut record = vec![CODEC_VERSION];
        record.extend(
            bincode::encode_to_vec(&wire, bincode::config::standard())
                .expect("encoding plain values into a vector cannot fail"),
        );
        record
    }

    /// Decodes a record ([`EventTimeRecord::encode`]'s inverse). Bounded: a corrupt length
    /// never allocates more than 1 MiB for a record of up to 4 KiB, 256 times the record's
    /// length for a larger one, and never more than 1 GiB (`parsley_gate::bounded`). The
    /// queue's header is not decoded here ([`EventTimeState::decode`] does, with the queue's
    /// parts).
    ///
    /// # Errors
    /// A message naming what is wrong: empty bytes, version 3 (with what to do), an unknown
    /// version, bytes that do not decode, trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (&version, body) = bytes.split_first().ok_or("empty event-time record")?;
        if version == 3 {
            return Err(
                "event-time record version 3: its parked records name their topics \
                 (before Parsley 0.1's lean segment entries, version 4); this version cannot \
                 restore them: reset the application (its changelog and committed offsets)"
                    .to_string(),
            );
        }
        if version != CODEC_VERSION {
            return Err(format!("unknown event-time record version {version}"));
        }
        let ((watermark, inputs, topics, queue), used): (Wire, usize) =
            parsley_gate::bounded::decode::<Wire, DECODE_LIMIT>(body).map_err(|e| e.to_string())?;
        if used != body.len() {
            return Err(format!("{} trailing bytes", body.len() - used));
        }
        Ok(EventTimeRecord {
            watermark: WatermarkSnapshot {
                watermark,
                inputs: inputs
                    .into_iter()
                    .map(|((t, p), prefix_max, lookahead)| InputSnapshot {
                        channel: Channel::new(TopicId::from_bytes(t), p),
                        prefix_max,
                        lookahead,
                    })
                    .collect(),
            },
            topics: topics
                .into_iter()
                .map(|(id, name)| (TopicId::from_bytes(id), name))
                .collect(),
            queue,
        })
    }
}

/// A task's event-time state rebuilt from its changelog: the watermark tracker, the timer
/// queue and the names of the topics its parked records come from.
#[derive(Debug)]
pub struct EventTimeState {
    /// The watermark tracker, restored (end offsets and heads unknown until read again).
    pub tracker: WatermarkTracker,
    /// The timer queue, restored with its parked records, late counts and counters.
    pub queue: TimerQueue<Vec<u8>, ParkedRecord>,
    /// Topic names by id: the stage's current sources, and former topics that still have
    /// parked records.
    pub topics: BTreeMap<TopicId, String>,
}

impl EventTimeState {
    /// Rebuilds the state of a task whose event-time inputs are `inputs` (the control channel
    /// excluded), with the control stream `control`, from the event-time record `record` and
    /// the latest record of every part of the timer queue, `parts` (tombstoned parts left
    /// out). Input channels of the record that are not in `inputs` any more (a deleted topic)
    /// are dropped, their parked records kept, with their topic's name. `topics` names the
    /// stage's current sources by id.
    ///
    /// # Errors
    /// A message naming what does not decode or breaks an invariant: the record's
    /// ([`EventTimeRecord::decode`]), the tracker's, the queue's
    /// ([`TimerQueue::from_parts`]), or a parked record whose topic has no name.
    pub fn decode(
        inputs: Vec<Channel>,
        control: Option<Control>,
        topics: impl IntoIterator<Item = (TopicId, String)>,
        record: &[u8],
        parts: &BTreeMap<Part<Vec<u8>>, Vec<u8>>,
    ) -> Result<Self, String> {
        let EventTimeRecord {
            mut watermark,
            topics: names,
            queue,
        } = EventTimeRecord::decode(record)?;
        watermark.inputs.retain(|s| inputs.contains(&s.channel));
        let tracker =
            WatermarkTracker::restore(inputs, control, &watermark).map_err(|e| e.to_string())?;
        let queue: TimerQueue<Vec<u8>, ParkedRecord> =
            TimerQueue::from_parts(&queue, parts.iter().map(|(p, r)| (p.clone(), r.as_slice())))
                .map_err(|e| e.to_string())?;
        // The current sources' names, and those of former topics that still have parked
        // records.
        let mut topics: BTreeMap<TopicId, String> = topics.into_iter().collect();
        let former: BTreeMap<TopicId, String> = names
            .into_iter()
            .filter(|(id, _)| !topics.contains_key(id))
            .collect();
        for (_, _, r) in queue.parked() {
            let id = TopicId::from_bytes(r.channel.0);
            if let std::collections::btree_map::Entry::Vacant(slot) = topics.entry(id) {
                let name = former.get(&id).ok_or_else(|| {
                    format!(
                        "the parked record at offset {} of topic {id} partition {} has no \
                         topic name in the event-time record",
                        r.offset, r.channel.1
                    )
                })?;
                slot.insert(name.clone());
            }
        }
        Ok(EventTimeState {
            tracker,
            queue,
            topics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape a parked record was written in before headers were kept.
    #[derive(Serialize)]
    struct Before {
        #[serde(with = "channel_bytes")]
        channel: ([u8; 16], i32),
        offset: i64,
        timestamp: i64,
        keyless: bool,
        #[serde(with = "serde_bytes")]
        value: Option<Vec<u8>>,
        sender: Option<([u8; 16], u64)>,
    }

    fn bytes<T: Serialize>(t: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(t, bincode::config::standard()).unwrap()
    }

    fn parked(bytes: &[u8]) -> Result<ParkedRecord, String> {
        bincode::serde::decode_from_slice::<ParkedRecord, _>(bytes, bincode::config::standard())
            .map(|(r, _)| r)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_parked_record_without_headers_is_written_as_before_and_one_with_them_round_trips() {
        let plain = ParkedRecord {
            channel: ([7; 16], 2),
            offset: 41,
            timestamp: 1_000,
            keyless: true,
            value: Some(b"v".to_vec()),
            sender: Some(([9; 16], 3)),
            headers: Vec::new(),
        };
        let before = Before {
            channel: ([7; 16], 2),
            offset: 41,
            timestamp: 1_000,
            keyless: true,
            value: Some(b"v".to_vec()),
            sender: Some(([9; 16], 3)),
        };
        assert_eq!(bytes(&plain), bytes(&before), "older changelogs still read");
        assert_eq!(parked(&bytes(&before)).unwrap(), plain);
        let traced = ParkedRecord {
            headers: vec![
                ("traceparent".into(), Some(b"00-ab-cd-01".to_vec())),
                ("empty".into(), None),
            ],
            value: None,
            ..plain
        };
        assert_eq!(parked(&bytes(&traced)).unwrap(), traced);
    }

    #[test]
    fn corrupt_parked_headers_are_an_error_not_a_panic() {
        let record = |keyless| Before {
            channel: ([7; 16], 2),
            offset: 41,
            timestamp: 1_000,
            keyless,
            value: Some(vec![0xff, 0xff, 0xff, 0xff, 0xff]),
            sender: None,
        };
        let mut wire = bytes(&record(false));
        // The flags byte: where a keyless record differs.
        let flag = (0..wire.len())
            .find(|&i| wire[i] != bytes(&record(true))[i])
            .unwrap();
        assert_eq!(wire[flag], 0);
        wire[flag] = WITH_HEADERS;
        assert!(parked(&wire).unwrap_err().contains("headers"));
        wire[flag] = 4;
        assert!(parked(&wire).unwrap_err().contains("unknown flags 4"));
    }

    #[test]
    fn a_record_round_trips_and_version_3_is_refused_with_what_to_do() {
        let a = Channel::new(TopicId::from_halves(1, 2), 0);
        let record = EventTimeRecord {
            watermark: WatermarkSnapshot {
                watermark: Some(500),
                inputs: vec![InputSnapshot {
                    channel: a,
                    prefix_max: Some(400),
                    lookahead: vec![(7, 600)],
                }],
            },
            topics: vec![(a.topic, "in".to_string())],
            queue: TimerQueue::<Vec<u8>, ParkedRecord>::new()
                .to_parts()
                .unwrap()
                .header,
        };
        let mut bytes = record.encode();
        assert_eq!(EventTimeRecord::decode(&bytes).unwrap(), record);
        assert_eq!(
            EventTimeRecord::decode(&[]).unwrap_err(),
            "empty event-time record"
        );
        bytes[0] = 3;
        let err = EventTimeRecord::decode(&bytes).unwrap_err();
        assert!(
            err.contains("version 3") && err.contains("reset the application"),
            "{err}"
        );
        bytes[0] = 9;
        let err = EventTimeRecord::decode(&bytes).unwrap_err();
        assert!(err.contains("unknown event-time record version 9"), "{err}");
    }

    #[test]
    fn a_parked_record_of_an_unnamed_topic_is_refused() {
        let (a, gone) = (
            Channel::new(TopicId::from_halves(1, 2), 0),
            Channel::new(TopicId::from_halves(3, 4), 0),
        );
        let mut queue: TimerQueue<Vec<u8>, ParkedRecord> = TimerQueue::new();
        let record = ParkedRecord {
            channel: (gone.topic.to_bytes(), 0),
            offset: 5,
            timestamp: 100,
            keyless: false,
            value: Some(b"v".to_vec()),
            sender: None,
            headers: Vec::new(),
        };
        let _ = queue.park(b"k".to_vec(), 100, [], record);
        let written = queue.to_parts().unwrap();
        let parts: BTreeMap<Part<Vec<u8>>, Vec<u8>> = written
            .parts
            .into_iter()
            .filter_map(|(p, b)| Some((p, b?)))
            .collect();
        let mut event_time = EventTimeRecord {
            queue: written.header,
            ..EventTimeRecord::default()
        };
        let sources = [(a.topic, "in".to_string())];
        let err =
            EventTimeState::decode(vec![a], None, sources.clone(), &event_time.encode(), &parts)
                .unwrap_err();
        assert!(
            err.contains("offset 5") && err.contains("no topic name"),
            "{err}"
        );
        event_time.topics = vec![(gone.topic, "gone".to_string())];
        let state =
            EventTimeState::decode(vec![a], None, sources, &event_time.encode(), &parts).unwrap();
        assert_eq!(state.queue.len(), 1);
        assert_eq!(
            state.topics.get(&gone.topic).map(String::as_str),
            Some("gone")
        );
        assert_eq!(state.topics.get(&a.topic).map(String::as_str), Some("in"));
    }
}
