//! Event-time ordering of one task: the runtime side of [`WatermarkTracker`] and
//! [`TimerQueue`] (the book's specification, §5; the rules themselves live in `parsley-gate`).
//!
//! # What the stream thread does, per task
//! - **At task start**, after the restore: one batched `ListOffsets(LATEST, READ_UNCOMMITTED)`
//!   for the task's event-time inputs gives each its startup end ([`EventTime::start`]), and
//!   the tracker reads the restored gate's frontiers: a channel whose committed frontier
//!   already reaches the fresh end is caught up at once, one mid-history waits only for the
//!   offsets above its frontier.
//! - **Per gate delivery** ([`EventTime::deliver`]): the record's event time (its Kafka record
//!   timestamp, ms) goes to the tracker, and the record is parked in the timer queue under
//!   `max(event time, park times of its parked ancestors)`; one released at once (its park time
//!   is at or below the watermark) is handed back to the caller.
//! - **After each poll batch**: the tracker reads the gate's frontiers ([`EventTime::follow`]);
//!   each caught-up channel gets its live-head evidence ([`EventTime::fetched_head`], below),
//!   and the queue releases everything at or below the watermark ([`EventTime::release`]).
//!
//! # Live-head evidence
//! The book's specification (§5) judges a caught-up channel at its live head when `F + 1` reaches
//! the LSO returned with its latest fetch response. librdkafka keeps that LSO but does not expose
//! it; it exposes the same response's high watermark, which is at or above it. Per channel and poll
//! batch, [`head_evidence`] picks, without a request when it can:
//! - `F + 1 >=` the **high watermark of the latest fetch response** (librdkafka's cached value,
//!   a local read): at the head by that response, whose LSO is at or below it;
//! - `F + 1 <` an **earlier LSO reading** from the leader: behind (an LSO never decreases, so a
//!   fresh reading could only confirm it; staying in the minimum is the safe side anyway);
//! - otherwise (an open transaction may sit between the LSO and the high watermark, fetched
//!   records are not delivered yet, or no response arrived yet): the **LSO read from the
//!   leader**, one batched `ListOffsets(LATEST, READ_COMMITTED)` for all such channels
//!   (`Admin::last_stable_offsets`); a reading taken
//!   after the poll is at or above the LSO of the responses that poll returned. A producer that
//!   holds a transaction open therefore costs a request per batch but cannot stall the
//!   watermark. Every decision rests on a fetch response or a leader's answer, never on
//!   silence; the readings are fetch-time evidence and are not persisted.
//!
//! The cached value is only as fresh as the consumer's fetching. A partition paused by
//! backpressure is not fetched, so its cached value is not used (the leader is asked). A
//! partition whose fetches stall (its leader moving) keeps its last response: a channel at its
//! head by that response stays there until fetching resumes, as with Kafka Streams' KIP-695
//! lag, and a record appended meanwhile whose event time the control clock passes by more
//! than the lag is counted late, not reordered silently.
//!
//! # Parked ancestors
//! A delivery's ancestors in the queue are the parked records of the same task that its stamp
//! claims:
//! - on each channel `c` of its clock, the parked records of `c` at offsets `<= clock[c]`;
//! - for each in-flight claim `(c, seq)`, the parked records of `c` sent by the stamp's sender
//!   with a sequence `<= seq`;
//! - for each replacement coordinate the gate hands over, the parked records of its channel at
//!   offsets `<=` it.
//!
//! On an unordered input that other stages write and none of its writers reads (a
//! repartition topic: module `stage::upstream`), a claim on the record's own channel is its
//! writing task's acknowledged earlier send, not a record it read: there the channel's parked
//! records of the same sender at offsets `<=` the claim are its ancestors, not the other
//! writers' records below it (those are not its causes, and counting them would park it behind
//! later event times while history is read, and not live). A stamp that `CausalClock` writes
//! never names the channel its record is sent to (the record's own coordinate supersedes that
//! entry), so such a claim comes only from stamps written by earlier releases or by hand.
//!
//! Records the task already released may be claimed too; they change nothing (their park time
//! is at or below the watermark). Cost: each claim scans the parked records of its channel
//! below it (`O(k)`), so a stamped delivery during a long catch-up pays for what is parked.
//!
//! Same-key order is event-time order: two records of one key leave in ascending event time,
//! ties in delivery order (and the gate delivers each channel in offset order).
//!
//! # The control stream
//! A [`ControlStream`](parsley_stage::ControlStream) topic is one of the stage's sources; its
//! channel is not an event-time input. Each control record the gate delivers feeds
//! [`WatermarkTracker::control`] with its record timestamp and is handed to the handler at
//! once, or, if it claims parked records, parked at their highest park time (so it still
//! follows its causes; never counted late).
//!
//! # The built-in clock
//! The topic of a [`BuiltInClock`](parsley_stage::BuiltInClock) is the stage's control stream:
//! its channel is not an event-time input either, and each tick the gate delivers feeds
//! [`WatermarkTracker::control`] with its record timestamp ([`EventTime::tick`]). Unlike a
//! control record it is never parked and never handed to the handler (the task's module
//! `ticks` writes and reads them).
//!
//! # State
//! [`EventTime::take_changes`] gives the task's event-time record (the watermark snapshot, the
//! names of the topics whose records may be parked, by topic id, and the timer queue's header:
//! its watermark, next arrival and segment numbers, counters),
//! written with the task snapshot in the same transaction, and the changes of the timer queue
//! since the last commit ([`TimerQueue::take_changes`]; the key layout and the records' encoding
//! are `parsley_stage::changelog`'s): the records parked since and still parked as one
//! **segment** record (split when large), a tombstone per segment none of whose records is
//! parked any more, the parked records of segments carried forward, and one record per key
//! whose late count grew. Releases write
//! nothing: an entry is parked iff its park time is above the watermark committed with it. A
//! queue holding days of history is therefore written once, about one record per commit
//! interval, and a live record parked and released within one commit interval is not written
//! at all. [`EventTime::decode`] rebuilds the state from the record and the latest record of
//! every part ([`EventTimeState::decode`]).

use std::collections::BTreeMap;

use parsley_clock::{Channel, Coordinate, SenderId, SenderTag, Stamp, TopicId};
use parsley_gate::{Control, Gate, GateError, Parking, Part, TimerQueue, WatermarkTracker};
use parsley_stage::changelog::{EventTimeRecord, EventTimeState, ParkedRecord, timer_part_key};

/// One record handed back for the handler.
#[derive(Debug)]
pub struct HandOver {
    /// Its key, as delivered.
    pub key: Option<Vec<u8>>,
    /// The record.
    pub record: ParkedRecord,
    /// Its event time was below the watermark when it was parked.
    pub late: bool,
}

impl HandOver {
    /// A record the queue released under `key` (empty for a keyless record).
    fn new(key: Vec<u8>, record: ParkedRecord, late: bool) -> Self {
        HandOver {
            key: (!record.keyless).then_some(key),
            record,
            late,
        }
    }
}

/// What [`EventTime::deliver`] did.
#[derive(Debug)]
pub enum Delivered {
    /// Parked; `late` when its event time was below the watermark.
    Parked {
        /// Counted as late.
        late: bool,
        /// Parked above its own event time, behind a parked causal ancestor.
        raised: bool,
    },
    /// Released at once.
    Now(HandOver),
}

/// The live-head evidence of one caught-up channel after a poll batch
/// ([`head_evidence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadEvidence {
    /// The high watermark of the channel's latest fetch response, which the frontier has
    /// reached: at the head by that response (its LSO is at or below it).
    Fetched(i64),
    /// An earlier LSO reading the frontier has not reached: behind (an LSO never decreases, so
    /// a fresh reading could only be higher).
    Behind(i64),
    /// Neither decides: ask the leader for the LSO.
    Ask,
}

/// Which evidence decides whether a caught-up channel is at its live head (module docs: live
/// head), given `next = F + 1` (the gate's frontier plus one), the high watermark of its
/// latest fetch response `fetched_high_watermark` (librdkafka's cached value, `None` or
/// negative before the first response) and the channel's last LSO reading `last_stable`.
pub fn head_evidence(
    next: i64,
    fetched_high_watermark: Option<i64>,
    last_stable: Option<i64>,
) -> HeadEvidence {
    match (fetched_high_watermark, last_stable) {
        (Some(hw), _) if hw >= 0 && next >= hw => HeadEvidence::Fetched(hw),
        (_, Some(lso)) if next < lso => HeadEvidence::Behind(lso),
        _ => HeadEvidence::Ask,
    }
}

/// Event-time state of one task (module docs).
#[derive(Debug)]
pub struct EventTime {
    tracker: WatermarkTracker,
    /// The last LSO read from the leader per input channel (fetch-time evidence, not state).
    last_stable: BTreeMap<Channel, i64>,
    queue: TimerQueue<Vec<u8>, ParkedRecord>,
    /// Parked records by channel and offset: `(park time ms, sender tag)`. Built from the queue
    /// when the first delivery with a stamp or a replacement asks for its ancestors, and kept
    /// from then on: a task that only ever delivers unstamped records never pays for it.
    index: Option<AncestorIndex>,
    /// The control stream's topic, if any.
    control: Option<TopicId>,
    /// Names of the topics whose records may be parked: the stage's sources, and after a
    /// restore the topics of parked records that are no longer sources (deleted or recreated
    /// under a new id; the handler gets them under their name).
    topics: BTreeMap<TopicId, String>,
    /// Unordered inputs whose writers do not read them (topics other stages write): a claim
    /// on a record's own channel there is its writer's own earlier send, so only that
    /// sender's parked records of the channel are its ancestors (module docs). Not state: the
    /// runtime marks them when it starts the task.
    own_sends: std::collections::BTreeSet<TopicId>,
}

/// Parked records by channel and offset: `(park time ms, sender tag)`.
type AncestorIndex = BTreeMap<Channel, BTreeMap<i64, (i64, Option<SenderTag>)>>;

/// What [`EventTime::take_changes`] returns for the changelog.
#[derive(Debug)]
pub struct EventTimeChanges {
    /// The event-time record ([`EventTimeRecord`], written under
    /// `parsley_stage::changelog::EVENT_TIME_KEY`).
    pub record: Vec<u8>,
    /// Changelog keys of the timer queue's changed parts, with their records or `None`
    /// (tombstones).
    pub parts: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl EventTime {
    /// Fresh state for a task whose event-time inputs are `inputs` (the control channel
    /// excluded), with the control stream `control` (its topic and lag); `topics` names the
    /// stage's sources by id.
    pub fn new(
        inputs: Vec<Channel>,
        control: Option<(TopicId, i64)>,
        topics: impl IntoIterator<Item = (TopicId, String)>,
    ) -> Self {
        EventTime {
            tracker: WatermarkTracker::new(inputs, control.map(|(_, lag_ms)| Control { lag_ms })),
            last_stable: BTreeMap::new(),
            queue: TimerQueue::new(),
            index: None,
            control: control.map(|(t, _)| t),
            topics: topics.into_iter().collect(),
            own_sends: Default::default(),
        }
    }

    /// The name of the topic `id` of a parked record's channel; `None` if unknown.
    pub fn topic_name(&self, id: TopicId) -> Option<&str> {
        self.topics.get(&id).map(String::as_str)
    }

    /// State restored from the event-time record `bytes` and the latest record of every part of
    /// the timer queue, `parts` ([`EventTime::take_changes`]); input channels of the snapshot
    /// that are not in `inputs` any more (a deleted topic) are dropped, their parked records
    /// kept, with their topic's name. `topics` names the stage's current sources by id.
    ///
    /// # Errors
    /// A message naming what does not decode or breaks an invariant.
    pub fn decode(
        inputs: Vec<Channel>,
        control: Option<(TopicId, i64)>,
        topics: impl IntoIterator<Item = (TopicId, String)>,
        bytes: &[u8],
        parts: &BTreeMap<Part<Vec<u8>>, Vec<u8>>,
    ) -> Result<Self, String> {
        let EventTimeState {
            tracker,
            queue,
            topics,
        } = EventTimeState::decode(
            inputs,
            control.map(|(_, lag_ms)| Control { lag_ms }),
            topics,
            bytes,
            parts,
        )?;
        Ok(EventTime {
            tracker,
            last_stable: BTreeMap::new(),
            queue,
            index: None,
            control: control.map(|(t, _)| t),
            topics,
            own_sends: Default::default(),
        })
    }

    /// The task's event-time record ([`EventTimeRecord`]: the watermark snapshot, the topic
    /// names and the timer queue's header, encoded) and the changes of the queue since
    /// the last call, as changelog `(key, record or tombstone)` pairs (module docs: state).
    ///
    /// # Errors
    /// The queue's codec error (a value that does not serialise); the changes are kept then.
    pub fn take_changes(&mut self) -> Result<EventTimeChanges, GateError> {
        let changes = self.queue.take_changes()?;
        let record = EventTimeRecord {
            watermark: self.tracker.snapshot(),
            topics: self
                .topics
                .iter()
                .map(|(id, name)| (*id, name.clone()))
                .collect(),
            queue: changes.header,
        }
        .encode();
        Ok(EventTimeChanges {
            record,
            parts: changes
                .parts
                .into_iter()
                .map(|(p, r)| (timer_part_key(&p), r))
                .collect(),
        })
    }

    /// The per-key violation counter: every key with late records and its count, ascending by
    /// key (restored with the queue, so it counts across restarts).
    pub fn late_by_key(&self) -> impl Iterator<Item = (&[u8], u64)> + '_ {
        self.queue.late_by_key().map(|(k, n)| (k.as_slice(), n))
    }

    /// The keys whose late count grew since the last [`EventTime::take_changes`], with their
    /// counts now.
    pub fn late_changed(&self) -> impl Iterator<Item = (&[u8], u64)> + '_ {
        self.queue.late_changed().map(|(k, n)| (k.as_slice(), n))
    }

    /// The event-time input channels (sorted).
    pub fn inputs(&self) -> Vec<Channel> {
        self.tracker.catch_up().inputs().collect()
    }

    /// Records the startup end (high watermark at task start) of an input.
    pub fn start(&mut self, channel: Channel, end_offset: i64) -> Result<(), GateError> {
        self.tracker.start(channel, end_offset)
    }

    /// Marks an input written by several writers (another stage's tasks): it holds the
    /// watermark while catching up ([`WatermarkTracker::unordered`]). `read_by_writers`: some
    /// writer also reads it, so a claim on the channel may come from reading it; otherwise a
    /// claim on a record's own channel makes only its sender's parked records there its
    /// ancestors (module docs: parked ancestors).
    pub fn unordered(&mut self, channel: Channel, read_by_writers: bool) -> Result<(), GateError> {
        self.tracker.unordered(channel)?;
        if !read_by_writers {
            self.own_sends.insert(channel.topic);
        }
        Ok(())
    }

    /// Reads the gate's frontiers.
    pub fn follow<R>(&mut self, gate: &Gate<R>) -> Result<(), GateError> {
        self.tracker.follow(gate)
    }

    /// Records the head evidence of `channel` after a poll batch ([`head_evidence`]): an LSO
    /// read from the leader (kept for the next batch's [`head_evidence`]), the high watermark
    /// of its latest fetch response that the frontier reached, or an earlier LSO reading it has
    /// not reached.
    pub fn fetched_head(
        &mut self,
        channel: Channel,
        head: i64,
        read_from_leader: bool,
    ) -> Result<(), GateError> {
        self.tracker.fetched_head(channel, head)?;
        if read_from_leader {
            self.last_stable.insert(channel, head);
        }
        Ok(())
    }

    /// The last LSO read from the leader for `channel` ([`EventTime::fetched_head`]).
    pub fn last_stable(&self, channel: &Channel) -> Option<i64> {
        self.last_stable.get(channel).copied()
    }

    /// Input channels caught up with their startup end (their live head matters).
    pub fn caught_up_inputs(&self) -> Vec<Channel> {
        self.tracker
            .catch_up()
            .inputs()
            .filter(|c| self.tracker.caught_up(c))
            .collect()
    }

    /// Input channels not caught up yet.
    pub fn catching_up(&self) -> usize {
        self.tracker.catch_up().waiting().count()
    }

    /// The task's watermark, ms.
    pub fn watermark(&self) -> Option<i64> {
        self.tracker.watermark()
    }

    /// What holds the watermark where it is ([`WatermarkTracker::held_by`]).
    pub fn held_by(&self) -> Option<parsley_gate::Hold> {
        self.tracker.held_by()
    }

    /// How far `channel`'s delivered event time runs ahead of the watermark, ms
    /// ([`WatermarkTracker::drift`]).
    pub fn drift(&self, channel: &Channel) -> Option<i64> {
        self.tracker.drift(channel)
    }

    /// Records parked now.
    pub fn parked(&self) -> usize {
        self.queue.len()
    }

    /// The smallest park time, ms: the watermark the next release needs.
    pub fn next_parked_time(&self) -> Option<i64> {
        self.queue.next_release()
    }

    /// The control stream's lag, ms; `None` without a control stream.
    pub fn lag_ms(&self) -> Option<i64> {
        self.tracker.control_stream().map(|c| c.lag_ms)
    }

    /// The ancestor index, built from the parked records on first use.
    fn index(&mut self) -> &AncestorIndex {
        self.index.get_or_insert_with(|| {
            let mut index = AncestorIndex::new();
            for (park_time, _, r) in self.queue.parked() {
                let sender = r.sender.map(|(s, seq)| SenderTag {
                    sender: SenderId::from_bytes(s),
                    seq,
                });
                index
                    .entry(r.channel())
                    .or_default()
                    .insert(r.offset, (park_time, sender));
            }
            index
        })
    }

    /// The highest park time among the parked records `stamp` and `replacements` claim
    /// (module docs: the ancestor rule); `None` when none is parked.
    fn ancestors(
        &mut self,
        stamp: Option<&Stamp>,
        replacements: &[Coordinate],
        channel: Channel,
    ) -> Option<i64> {
        if stamp.is_none() && replacements.is_empty() {
            return None;
        }
        let own_sends = self.own_sends.contains(&channel.topic);
        let index = self.index();
        let below = |c: &Channel, offset: i64| {
            index
                .get(c)
                .and_then(|m| m.range(..=offset).map(|(_, (t, _))| *t).max())
        };
        let mut max: Option<i64> = None;
        let mut take = |t: Option<i64>| max = max.max(t);
        if let Some(s) = stamp {
            for (c, o) in s.clock.entries() {
                if own_sends && *c == channel {
                    // Its writer's own sends: only that sender's records are its causes.
                    let sender = s.sender.map(|t| t.sender);
                    take(index.get(c).and_then(|m| {
                        m.range(..=*o)
                            .filter(|(_, (_, tag))| tag.map(|t| t.sender) == sender)
                            .map(|(_, (t, _))| *t)
                            .max()
                    }));
                    continue;
                }
                take(below(c, *o));
            }
            if let Some(tag) = s.sender {
                for f in &s.in_flight {
                    take(index.get(&f.channel).and_then(|m| {
                        m.values()
                            .filter(|(_, s)| {
                                s.is_some_and(|s| s.sender == tag.sender && s.seq <= f.seq)
                            })
                            .map(|(t, _)| *t)
                            .max()
                    }));
                }
            }
        }
        for r in replacements {
            take(below(&r.channel, r.offset));
        }
        max
    }

    /// A record the gate delivered: its event time (`record.timestamp`) goes to the tracker and
    /// it is parked under its event time raised to its parked ancestors' park times, or handed
    /// back at once. A control record ticks the control clock instead and is parked only
    /// behind parked ancestors. `key` is the record's key (`None`: a null key), parked as the
    /// queue's key.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`] for a record of a channel that is not an input.
    pub fn deliver(
        &mut self,
        stamp: Option<&Stamp>,
        replacements: &[Coordinate],
        key: Option<Vec<u8>>,
        record: ParkedRecord,
    ) -> Result<Delivered, GateError> {
        let channel = record.channel();
        let ancestors = self.ancestors(stamp, replacements, channel);
        let event_time = if Some(channel.topic) == self.control {
            self.tracker.control(record.timestamp)?;
            match ancestors {
                // Parked behind its causes, at their time: never late.
                Some(t) if self.queue.watermark().is_none_or(|w| t > w) => t,
                _ => {
                    return Ok(Delivered::Now(HandOver {
                        key,
                        record,
                        late: false,
                    }));
                }
            }
        } else {
            self.tracker
                .delivered(channel, record.offset, record.timestamp)?;
            record.timestamp
        };
        let sender = record.sender.map(|(s, seq)| SenderTag {
            sender: SenderId::from_bytes(s),
            seq,
        });
        let offset = record.offset;
        let key = key.unwrap_or_default();
        Ok(match self.queue.park(key, event_time, ancestors, record) {
            Parking::Parked {
                park_time_ms, late, ..
            } => {
                if let Some(index) = &mut self.index {
                    index
                        .entry(channel)
                        .or_default()
                        .insert(offset, (park_time_ms, sender));
                }
                Delivered::Parked {
                    late,
                    raised: park_time_ms > event_time,
                }
            }
            Parking::Released(r) => Delivered::Now(HandOver::new(r.key, r.value, r.late)),
        })
    }

    /// A tick of the built-in clock, read back: processing time moves to its record timestamp
    /// `timestamp` (ms since the epoch), as a control record's would. A tick is never parked
    /// nor handed over (it claims nothing, and the handler never sees one).
    ///
    /// # Errors
    /// [`GateError::NoControlStream`] for a task without a control stream.
    pub fn tick(&mut self, timestamp: i64) -> Result<(), GateError> {
        self.tracker.control(timestamp)
    }

    /// Releases every parked record at or below the tracker's watermark; returns how many.
    /// Take them, in release order, with [`EventTime::next_release`] before the next delivery
    /// or [`EventTime::take_changes`].
    pub fn release(&mut self) -> usize {
        match self.tracker.watermark() {
            Some(w) => self.queue.raise(w),
            None => 0,
        }
    }

    /// The park time of the record [`EventTime::next_release`] gives next, ms.
    pub fn next_release_time(&self) -> Option<i64> {
        self.queue.next_released_time()
    }

    /// The next record [`EventTime::release`] released, in release order.
    pub fn next_release(&mut self) -> Option<HandOver> {
        let r = self.queue.next_released()?;
        if let Some(index) = &mut self.index {
            let c = r.value.channel();
            if let Some(m) = index.get_mut(&c) {
                m.remove(&r.value.offset);
                if m.is_empty() {
                    index.remove(&c);
                }
            }
        }
        Some(HandOver::new(r.key, r.value, r.late))
    }

    /// Releases every parked record at or below the tracker's watermark, in release order.
    #[cfg(test)]
    fn release_all(&mut self) -> Vec<HandOver> {
        self.release();
        std::iter::from_fn(|| self.next_release()).collect()
    }
}

#[cfg(test)]
mod tests {
    use parsley_clock::Clock;

    use super::*;

    fn ch(t: u8) -> Channel {
        Channel::new(TopicId::from_bytes([t; 16]), 0)
    }

    /// A record of `c` at `offset` with event time `t` and key `key` ("" for a null key).
    fn rec(c: Channel, offset: i64, t: i64, key: &str) -> (Option<Vec<u8>>, ParkedRecord) {
        let record = ParkedRecord {
            channel: (c.topic.to_bytes(), c.partition),
            offset,
            timestamp: t,
            keyless: key.is_empty(),
            value: None,
            sender: None,
            headers: Vec::new(),
        };
        ((!key.is_empty()).then(|| key.as_bytes().to_vec()), record)
    }

    fn deliver(
        et: &mut EventTime,
        stamp: Option<&Stamp>,
        (key, record): (Option<Vec<u8>>, ParkedRecord),
    ) -> Result<Delivered, GateError> {
        et.deliver(stamp, &[], key, record)
    }

    /// Topic names of channels, as the stage gives its sources: `t` and the id's first byte.
    fn names(channels: &[Channel]) -> Vec<(TopicId, String)> {
        channels
            .iter()
            .map(|c| (c.topic, format!("t{}", c.topic.to_bytes()[0])))
            .collect()
    }

    /// The changelog parts of `changes`, as the restore reads them.
    fn parts_of(changes: &EventTimeChanges) -> BTreeMap<Part<Vec<u8>>, Vec<u8>> {
        changes
            .parts
            .iter()
            .map(|(k, r)| {
                let n = u64::from_be_bytes(k[1..].try_into().unwrap());
                (Part::Segment(n), r.clone().unwrap())
            })
            .collect()
    }

    fn offsets(h: &[HandOver]) -> Vec<(u8, i64)> {
        h.iter()
            .map(|h| (h.record.channel.0[0], h.record.offset))
            .collect()
    }

    #[test]
    fn head_evidence_asks_the_leader_only_when_neither_the_fetch_response_nor_a_reading_decides() {
        use HeadEvidence::*;
        // The frontier reached the fetch response's high watermark: at the head, no request.
        assert_eq!(head_evidence(10, Some(10), None), Fetched(10));
        assert_eq!(head_evidence(11, Some(10), Some(4)), Fetched(10));
        // Below an earlier LSO reading: behind, no request.
        assert_eq!(head_evidence(7, Some(12), Some(8)), Behind(8));
        assert_eq!(head_evidence(7, None, Some(8)), Behind(8));
        // Fetched records not delivered, or an open transaction between LSO and high
        // watermark, with no reading above the frontier: ask.
        assert_eq!(head_evidence(8, Some(12), Some(8)), Ask);
        assert_eq!(head_evidence(8, Some(12), None), Ask);
        // No fetch response yet (librdkafka's -1001), no reading: ask.
        assert_eq!(head_evidence(0, Some(-1001), None), Ask);
        assert_eq!(head_evidence(0, None, None), Ask);
    }

    #[test]
    fn a_leader_reading_is_kept_and_a_fetch_response_value_is_not() {
        let a = ch(1);
        let mut et = EventTime::new(vec![a], None, []);
        et.fetched_head(a, 7, false).unwrap();
        assert_eq!(et.last_stable(&a), None);
        et.fetched_head(a, 9, true).unwrap();
        assert_eq!(et.last_stable(&a), Some(9));
    }

    #[test]
    fn an_effect_stamped_earlier_than_its_parked_cause_waits_for_it_and_survives_a_restart() {
        let (a, b) = (ch(1), ch(2));
        let mut et = EventTime::new(vec![a, b], None, names(&[a, b]));
        et.start(a, 10).unwrap();
        et.start(b, 10).unwrap();
        // a@0 at t=500 is parked; b@0 at t=100 claims a@0: parked at 500, not 100.
        assert!(matches!(
            deliver(&mut et, None, rec(a, 0, 500, "k")).unwrap(),
            Delivered::Parked { late: false, .. }
        ));
        let claims_a0 = Stamp::new(None, Clock::try_from_sorted(vec![(a, 0)]).unwrap());
        assert!(matches!(
            deliver(&mut et, Some(&claims_a0), rec(b, 0, 100, "k")).unwrap(),
            Delivered::Parked { late: false, .. }
        ));
        // b@1 at t=200 claims nothing parked.
        deliver(&mut et, None, rec(b, 1, 200, "j")).unwrap();
        assert_eq!(et.ancestors(Some(&claims_a0), &[], b), Some(500));
        assert_eq!(et.ancestors(None, &[b.at(0)], a), Some(500));

        let changes = et.take_changes().unwrap();
        assert_eq!(
            changes.parts.len(),
            1,
            "one segment for the three parked records"
        );
        let parts: BTreeMap<Part<Vec<u8>>, Vec<u8>> = changes
            .parts
            .iter()
            .map(|(k, r)| {
                assert_eq!(k, &timer_part_key(&Part::Segment(0)));
                (Part::Segment(0), r.clone().unwrap())
            })
            .collect();
        let mut back =
            EventTime::decode(vec![a, b], None, names(&[a, b]), &changes.record, &parts).unwrap();
        assert_eq!(back.parked(), 3);
        assert_eq!(back.index, None, "built on first use");
        assert_eq!(
            back.index(),
            et.index(),
            "the same as the one kept while parking"
        );
        back.start(a, 1).unwrap();
        back.start(b, 2).unwrap();
        let mut gate: Gate<()> = Gate::new([a, b]);
        gate.seed(a, 1).unwrap();
        gate.seed(b, 2).unwrap();
        back.follow(&gate).unwrap();
        // Both caught up and at the head: everything leaves, the effect after its cause.
        assert_eq!(back.watermark(), Some(500));
        assert_eq!(offsets(&back.release_all()), [(2, 1), (1, 0), (2, 0)]);
        assert!(back.index().is_empty());
    }

    #[test]
    fn on_a_topic_other_stages_write_a_claim_on_the_records_own_channel_names_its_senders_records()
    {
        let a = ch(1);
        let (one, two) = (SenderId::from_bytes([1; 16]), SenderId::from_bytes([2; 16]));
        let sent = |offset: i64, t: i64, sender: SenderId, seq: u64| {
            let (key, mut r) = rec(a, offset, t, "k");
            r.sender = Some((*sender.as_bytes(), seq));
            (key, r)
        };
        for read_by_writers in [false, true] {
            let mut et = EventTime::new(vec![a], None, names(&[a]));
            et.unordered(a, read_by_writers).unwrap();
            // Two writing tasks interleave; task two runs ahead in event time. Everything
            // parks: an unordered input without a startup end holds the watermark.
            deliver(&mut et, None, sent(0, 100, one, 0)).unwrap();
            deliver(&mut et, None, sent(1, 900, two, 0)).unwrap();
            deliver(&mut et, None, sent(2, 150, one, 1)).unwrap();
            // Task one's next record claims its own acknowledged send at offset 2.
            let stamp = Stamp::new(
                Some(SenderTag {
                    sender: one,
                    seq: 2,
                }),
                Clock::try_from_sorted(vec![(a, 2)]).unwrap(),
            );
            let got = et
                .deliver(
                    Some(&stamp),
                    &[],
                    Some(b"k".to_vec()),
                    sent(3, 200, one, 2).1,
                )
                .unwrap();
            let raised = matches!(got, Delivered::Parked { raised: true, .. });
            assert_eq!(
                raised, read_by_writers,
                "raised behind task two's record only when a writer may have read it"
            );
            assert_eq!(et.watermark(), None);
        }
    }

    #[test]
    fn a_control_record_ticks_the_clock_and_passes_unless_it_claims_a_parked_record() {
        let (a, ctl) = (ch(1), ch(9));
        let mut et = EventTime::new(vec![a], Some((ctl.topic, 100)), names(&[a, ctl]));
        et.start(a, 0).unwrap();
        assert_eq!(et.watermark(), None, "the control stream has not ticked");
        assert!(matches!(
            deliver(&mut et, None, rec(ctl, 0, 1_000, "c")).unwrap(),
            Delivered::Now(HandOver { late: false, .. })
        ));
        assert_eq!(et.watermark(), Some(900));
        assert!(et.release_all().is_empty());
        assert!(matches!(
            deliver(&mut et, None, rec(a, 0, 950, "k")).unwrap(),
            Delivered::Parked { late: false, .. }
        ));
        // A control record claiming a@0 (parked at 950) waits for it.
        let claims = Stamp::new(None, Clock::try_from_sorted(vec![(a, 0)]).unwrap());
        assert!(matches!(
            deliver(&mut et, Some(&claims), rec(ctl, 1, 1_100, "c")).unwrap(),
            Delivered::Parked { late: false, .. }
        ));
        assert_eq!(offsets(&et.release_all()), [(1, 0), (9, 1)]);
    }
    #[test]
    fn a_null_key_and_an_empty_key_come_back_as_delivered_also_after_a_restore() {
        let a = ch(1);
        let mut et = EventTime::new(vec![a], None, names(&[a]));
        et.start(a, 10).unwrap();
        deliver(&mut et, None, rec(a, 0, 300, "")).unwrap();
        let (_, empty) = rec(a, 1, 200, "x");
        et.deliver(None, &[], Some(Vec::new()), empty).unwrap();
        deliver(&mut et, None, rec(a, 2, 100, "k")).unwrap();
        let changes = et.take_changes().unwrap();
        let mut back = EventTime::decode(
            vec![a],
            None,
            names(&[a]),
            &changes.record,
            &parts_of(&changes),
        )
        .unwrap();
        back.start(a, 3).unwrap();
        let mut gate: Gate<()> = Gate::new([a]);
        gate.seed(a, 3).unwrap();
        back.follow(&gate).unwrap();
        let keys: Vec<(i64, Option<Vec<u8>>)> = back
            .release_all()
            .into_iter()
            .map(|h| (h.record.offset, h.key))
            .collect();
        assert_eq!(
            keys,
            [(2, Some(b"k".to_vec())), (1, Some(Vec::new())), (0, None)]
        );
    }

    #[test]
    fn a_record_parked_before_its_topic_was_recreated_keeps_its_name_across_a_restore() {
        let (old, new, b) = (ch(1), ch(3), ch(2));
        let mut et = EventTime::new(vec![old, b], None, names(&[old, b]));
        et.start(old, 10).unwrap();
        et.start(b, 10).unwrap();
        deliver(&mut et, None, rec(old, 0, 300, "k")).unwrap();
        let changes = et.take_changes().unwrap();
        // The topic came back under a new id, with the same name.
        let same_name = vec![(new.topic, "t1".to_string()), (b.topic, "t2".to_string())];
        let back = EventTime::decode(
            vec![new, b],
            None,
            same_name,
            &changes.record,
            &parts_of(&changes),
        )
        .unwrap();
        assert_eq!(back.topic_name(old.topic), Some("t1"));
        assert_eq!(back.topic_name(new.topic), Some("t1"));
        assert_eq!(back.topic_name(b.topic), Some("t2"));
        // A former topic with nothing parked is forgotten.
        let mut drained = EventTime::new(vec![old, b], None, names(&[old, b]));
        drained.start(b, 10).unwrap();
        deliver(&mut drained, None, rec(b, 0, 300, "k")).unwrap();
        let changes = drained.take_changes().unwrap();
        let back = EventTime::decode(
            vec![b],
            None,
            names(&[b]),
            &changes.record,
            &parts_of(&changes),
        )
        .unwrap();
        assert_eq!(back.topic_name(old.topic), None);
    }
}
