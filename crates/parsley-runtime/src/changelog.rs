//! The changelog of a stage: every task's fold state and Parsley's own state, written in the
//! stage's transaction and read back on assignment (the book's specification, §7, "exact restore").
//!
//! Shape: one compacted topic per stage, `{application}.{stage}.changelog`, with as many
//! partitions as the stage's sources; partition `p` belongs to task `p`. Records:
//! - key `0x00 ++ k`, value `v`: the fold state of key `k` (a tombstone deletes it);
//! - key [`META_KEY`], value a [`TaskSnapshot`]: the task's sender id and next send sequence,
//!   its node clock, its gate snapshot (baselines, frontiers, look-ahead sets, delivered
//!   sequences) and the input offsets committed with it;
//! - for a stage that orders by event time (the timer queue's changelog form, see
//!   `parsley_gate::TimerQueue`):
//!   - key [`EVENT_TIME_KEY`], value the task's watermark snapshot and the queue's header,
//!     written in the same transaction as every task snapshot, so both describe the same
//!     moment;
//!   - key `0x04 ++ segment number (8 bytes, big-endian)`, value one segment of the timer
//!     queue: the records parked during one commit interval that were still parked at its
//!     commit (several segments when they exceed the segment size), or carried forward from an
//!     older segment; a tombstone once none of its records is parked. A released record is not
//!     written: an entry is parked iff its park time is above the watermark of the event-time
//!     record committed with it;
//!   - key `0x03 ++ k`, value the late count of key `k`;
//!   - key `0x05 ++ time (8 bytes big-endian, sign bit flipped) ++ k`, an empty value: a keyed
//!     timer the processor set for key `k` at that event time, not fired yet (a tombstone
//!     once it fired).
//!
//!   Key `0x02` held one parked record per key in an earlier form (no longer read: a restore
//!   that meets one fails, naming it).
//!
//! Every record carries a `parsley.txn` header: the transactional id of the producer that
//! wrote it, so a restore held by an open transaction names whose it is (`open_transaction`).
//!
//! Invariants:
//! - the runtime writes the changelog only inside the stage's transaction, after every output
//!   of the transaction is acknowledged (so the clock has no in-flight claims), together with
//!   the input offsets: a committed changelog prefix and the group's committed offsets describe
//!   the same moment;
//! - restore reads a partition `read_committed` from its start up to the high watermark taken
//!   when the restore starts (`READ_UNCOMMITTED` `ListOffsets`), so it waits for the markers of
//!   a transaction still completing and never stops at an older commit;
//! - a snapshot is used only when its input offsets equal the group's committed offsets; fetch
//!   evidence (queues, positions, high watermarks) is never restored, it is fetched again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use parsley_clock::{Channel, Clock, SenderId, TopicId};
use parsley_gate::{ChannelSnapshot, GateSnapshot, Part};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::admin::{Admin, TopicInfo, TopicSpec};
use crate::clients::ClientRole;
use crate::error::{Error, Result};
use crate::open_transaction::OpenTransactionWatch;
use crate::security::Endpoint;
use crate::stage::{TIMER_PREFIX, timer_of};
use tracing::warn;

/// Key prefix of fold-state records.
pub(crate) const STATE_PREFIX: u8 = 0x00;
/// Key of the task snapshot record.
pub(crate) const META_KEY: &[u8] = b"\x01parsley.task";
/// Key of the event-time record of a stage that orders by event time (`event_time`'s
/// encoding: watermark snapshot and timer queue), always written with the task snapshot.
pub(crate) const EVENT_TIME_KEY: &[u8] = b"\x01parsley.event_time";

/// Key prefix of a parked record of the timer queue in the earlier, per-record form.
const OLD_TIMER_PREFIX: u8 = 0x02;
/// Key prefix of a key's late count.
const LATE_PREFIX: u8 = 0x03;
/// Key prefix of a segment of the timer queue.
const SEGMENT_PREFIX: u8 = 0x04;

/// The changelog key of a part of a task's timer queue (module docs: the layout).
pub(crate) fn timer_part_key(part: &Part<Vec<u8>>) -> Vec<u8> {
    match part {
        Part::Segment(n) => {
            let mut key = Vec::with_capacity(9);
            key.push(SEGMENT_PREFIX);
            key.extend_from_slice(&n.to_be_bytes());
            key
        }
        Part::Late(k) => {
            let mut key = Vec::with_capacity(1 + k.len());
            key.push(LATE_PREFIX);
            key.extend_from_slice(k);
            key
        }
    }
}

/// The part of a timer queue that changelog key `key` names; `None` for a key that is not a
/// timer-queue key, an error message for a segment key of the wrong length or a key of the
/// earlier per-record form.
fn timer_part_of(key: &[u8]) -> Option<std::result::Result<Part<Vec<u8>>, String>> {
    match key.split_first() {
        Some((&SEGMENT_PREFIX, rest)) => Some(match <[u8; 8]>::try_from(rest) {
            Ok(b) => Ok(Part::Segment(u64::from_be_bytes(b))),
            Err(_) => Err(format!("a segment key of {} bytes instead of 9", key.len())),
        }),
        Some((&LATE_PREFIX, k)) => Some(Ok(Part::Late(k.to_vec()))),
        Some((&OLD_TIMER_PREFIX, _)) => Some(Err(
            "a parked record in the earlier per-record form of the timer queue's changelog \
             (written by an older Parsley; not read by this one)"
                .into(),
        )),
        _ => None,
    }
}

/// Version of the snapshot encoding.
const SNAPSHOT_VERSION: u8 = 1;
/// Largest snapshot decoded (a corrupt length never allocates more).
const SNAPSHOT_LIMIT: usize = 64 << 20;

pub use parsley_stage::changelog_topic;

/// Describes the changelog topic, creating it (`cleanup.policy=compact`, `partitions`
/// partitions) when it does not exist.
///
/// # Errors
/// [`Error::ChangelogPartitions`] when it exists with another partition count; admin errors.
pub(crate) fn ensure_topic(admin: &Admin, name: &str, partitions: i32) -> Result<TopicInfo> {
    let existing = match admin.describe_topics(&[name]) {
        Ok(mut t) => Some(t.remove(0)),
        Err(Error::UnknownTopic { .. }) => None,
        Err(e) => return Err(e),
    };
    let info = match existing {
        Some(t) => t,
        // Another instance of the stage may create it at the same moment.
        None => admin.create_topic_if_absent(
            &TopicSpec::new(name, partitions).config("cleanup.policy", "compact"),
        )?,
    };
    if info.partitions != partitions {
        return Err(Error::ChangelogPartitions {
            topic: name.to_string(),
            partitions: info.partitions,
            expected: partitions,
        });
    }
    Ok(info)
}

/// Parsley's committed state of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskSnapshot {
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
    /// Version byte, then the bincode (standard configuration) of the fields.
    pub(crate) fn encode(&self) -> Vec<u8> {
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

    /// Decodes a snapshot; `Err` names what is wrong.
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Self, String> {
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

/// What a changelog partition holds, read up to the high watermark of the restore's start.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// Fold state by key.
    pub state: HashMap<Vec<u8>, Vec<u8>>,
    /// The latest task snapshot, if the task ever committed.
    pub snapshot: Option<TaskSnapshot>,
    /// The latest event-time record (undecoded), if one was ever written.
    pub event_time: Option<Vec<u8>>,
    /// The latest record of every part of the timer queue that has one (undecoded).
    pub timers: BTreeMap<Part<Vec<u8>>, Vec<u8>>,
    /// The processor's keyed timers set at the last commit: (time, key).
    pub keyed_timers: BTreeSet<(i64, Vec<u8>)>,
    /// Records read.
    pub records: u64,
    /// Consumers replaced after reading nothing for [`RESTORE_STALL`].
    pub replaced: u64,
}

/// How long a restore may read nothing (no record, no position move) before its consumer is
/// replaced by a new one at the next offset to read. A consumer created while the broker
/// restarts can stay without a fetch session after the broker is back (fault-injection run,
/// seed 20); a new client is the evidence-neutral way out: it resumes exactly where the old one
/// stopped.
pub(crate) const RESTORE_STALL: Duration = Duration::from_secs(10);

/// Reads partition `partition` of the changelog `topic` (see the module docs) with consumers
/// made from `client` (a complete `read_committed` consumer configuration). `progress` is
/// called with `(position, end)` — the next offset to read and the high watermark the restore
/// reads up to (offsets, i64) — when the restore starts and after every record.
///
/// A transaction open on the partition holds the position at the last stable offset: that is
/// found out and said once ([`OpenTransactionWatch`]); `transaction_timeout` is this stage's
/// producers' `transaction.timeout.ms`, named as the longest such a wait can take. `held` is
/// called with what the restore waits for whenever that changes (an open transaction found,
/// or gone: `None`), and with `None` when the restore ends.
///
/// # Errors
/// [`Error::Changelog`] for a record that does not decode (topic, partition, offset named);
/// [`Error::RestoreBlocked`] when an open transaction holds the position below the high
/// watermark until `timeout`; [`Error::Timeout`] when the position does not reach the high
/// watermark within `timeout` for another reason; client errors.
pub(crate) fn restore(
    client: &ClientConfig,
    admin: &Admin,
    topic: &str,
    partition: i32,
    (timeout, transaction_timeout): (Duration, Duration),
    progress: &mut dyn FnMut(i64, i64),
    held: &mut dyn FnMut(Option<crate::explain::RestoreWait>),
) -> Result<Restored> {
    let mut said = None;
    let result = read_changelog(
        client,
        admin,
        (topic, partition),
        (timeout, transaction_timeout),
        progress,
        &mut |wait| {
            if wait != said {
                said = wait.clone();
                held(wait);
            }
        },
    );
    if said.is_some() {
        held(None);
    }
    result
}

/// [`restore`], `held` called with what the restore waits for after every look.
fn read_changelog(
    client: &ClientConfig,
    admin: &Admin,
    (topic, partition): (&str, i32),
    (timeout, transaction_timeout): (Duration, Duration),
    progress: &mut dyn FnMut(i64, i64),
    held: &mut dyn FnMut(Option<crate::explain::RestoreWait>),
) -> Result<Restored> {
    let end = admin.high_watermarks(&[(topic, partition)])?[0];
    let mut watch = OpenTransactionWatch::new(topic, partition, end, transaction_timeout, client);
    let mut restored = Restored::default();
    progress(0, end);
    if end == 0 {
        return Ok(restored);
    }
    let open = |from: Offset| -> Result<BaseConsumer> {
        let consumer: BaseConsumer = client
            .create()
            .map_err(|e| Error::kafka("creating the restore consumer", e))?;
        // A new consumer assigned before it knows the partition's leader queries the start
        // offset only when librdkafka's offset-query timer fires, 500 ms later, on every
        // restore; with the topic's metadata in hand it queries at once. Best effort: without
        // it (a broker restarting) the consumer finds the leader itself, as before.
        if let Err(e) = consumer.fetch_metadata(Some(topic), timeout.min(RESTORE_STALL)) {
            tracing::debug!(topic, error = %e, "the restore consumer has no metadata yet");
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, from)
            .map_err(|e| Error::kafka("building the restore assignment", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| Error::kafka("assigning the changelog partition", e))?;
        Ok(consumer)
    };
    let mut consumer = open(Offset::Beginning)?;
    let started = Instant::now();
    // The next offset to read, once known (a record read or a position reported).
    let mut next: Option<i64> = None;
    let mut moved = Instant::now();
    loop {
        let position = consumer
            .position()
            .map_err(|e| Error::kafka("reading the restore position", e))?
            .find_partition(topic, partition)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        if let Some(p) = position
            && next.is_none_or(|n| p > n)
        {
            next = Some(p);
            moved = Instant::now();
            progress(p, end);
        }
        let at = next.unwrap_or(0);
        if at >= end {
            return Ok(restored);
        }
        watch.observe(admin, at, moved.elapsed());
        held(watch.wait());
        if started.elapsed() >= timeout {
            if let Some(blocked) = watch.timed_out(admin, at, timeout) {
                return Err(blocked);
            }
            return Err(Error::Timeout {
                what: format!(
                    "restoring {topic}/{partition}: position {at} of high watermark {end} \
                     ({} consumer(s) replaced after reading nothing for {}s)",
                    restored.replaced,
                    RESTORE_STALL.as_secs()
                ),
                timeout,
            });
        }
        // A position held by an open transaction is no stalled client: a new one would stop
        // at the same offset.
        if moved.elapsed() >= RESTORE_STALL && !watch.held() {
            warn!(
                topic,
                partition,
                position = at,
                end,
                "the restore read nothing for {}s; replacing its consumer",
                RESTORE_STALL.as_secs()
            );
            drop(consumer);
            consumer = open(next.map_or(Offset::Beginning, Offset::Offset))?;
            restored.replaced += 1;
            moved = Instant::now();
            continue;
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = match m {
            Ok(m) => m,
            Err(e)
                if e.rdkafka_error_code()
                    .is_some_and(crate::security::is_security_failure) =>
            {
                let code = e.rdkafka_error_code().expect("a code");
                return Err(Endpoint::of(client, ClientRole::Restore).error(code, e.to_string()));
            }
            // librdkafka reconnects by itself (a broker restarting).
            Err(e) if crate::error::transient(&e) => continue,
            Err(e) => return Err(Error::kafka("reading the changelog", e)),
        };
        // Records arrive in offset order; one below `next` cannot come from this assignment.
        if next.is_some_and(|n| m.offset() < n) {
            continue;
        }
        next = Some(m.offset() + 1);
        moved = Instant::now();
        progress(m.offset() + 1, end);
        restored
            .apply(m.key().unwrap_or_default(), m.payload())
            .map_err(|message| Error::Changelog {
                topic: topic.to_string(),
                partition,
                offset: m.offset(),
                message,
            })?;
    }
}

impl Restored {
    /// Folds one changelog record (`value` `None`: a tombstone) into what the partition holds:
    /// the latest record of each key wins, a tombstone removes its key.
    ///
    /// # Errors
    /// What is wrong with the record: an unknown key, a snapshot or event-time record without
    /// a value, a snapshot or timer key that does not decode.
    pub(crate) fn apply(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> std::result::Result<(), String> {
        self.records += 1;
        if key == META_KEY {
            let value = value.ok_or("task snapshot without a value")?;
            self.snapshot = Some(TaskSnapshot::decode(value)?);
        } else if key == EVENT_TIME_KEY {
            let value = value.ok_or("event-time record without a value")?;
            self.event_time = Some(value.to_vec());
        } else if let Some((&STATE_PREFIX, k)) = key.split_first() {
            match value {
                Some(v) => self.state.insert(k.to_vec(), v.to_vec()),
                None => self.state.remove(k),
            };
        } else if key.first() == Some(&TIMER_PREFIX) {
            let timer = timer_of(key)?;
            match value {
                Some(_) => self.keyed_timers.insert(timer),
                None => self.keyed_timers.remove(&timer),
            };
        } else if let Some(part) = timer_part_of(key) {
            let part = part?;
            match value {
                Some(v) => self.timers.insert(part, v.to_vec()),
                None => self.timers.remove(&part),
            };
        } else {
            return Err(format!("unknown key {key:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod decode_properties;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_keys_round_trip_and_old_keys_are_refused() {
        let parts = [
            Part::Late(Vec::new()),
            Part::Late(b"product-1".to_vec()),
            Part::Segment(0),
            Part::Segment(1),
            Part::Segment(u64::MAX),
        ];
        let keys: Vec<Vec<u8>> = parts.iter().map(timer_part_key).collect();
        assert!(keys.is_sorted(), "segments sort by number: {keys:?}");
        for (p, k) in parts.iter().zip(&keys) {
            assert_eq!(timer_part_of(k), Some(Ok(p.clone())));
        }
        assert_eq!(
            timer_part_of(&keys[3][..8]),
            Some(Err("a segment key of 8 bytes instead of 9".into()))
        );
        let mut old = vec![OLD_TIMER_PREFIX];
        old.extend_from_slice(&[0; 16]);
        assert!(
            matches!(timer_part_of(&old), Some(Err(m)) if m.contains("earlier per-record form"))
        );
        assert_eq!(timer_part_of(META_KEY), None);
        assert_eq!(timer_part_of(EVENT_TIME_KEY), None);
        assert_eq!(timer_part_of(&[STATE_PREFIX, 1]), None);
    }

    #[test]
    fn snapshots_round_trip_and_bad_bytes_are_named() {
        let s = super::decode_properties::snapshot();
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
