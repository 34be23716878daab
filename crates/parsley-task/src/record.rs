//! What moves through a task: a fetched record on its way to the gate ([`Fetched`]), what
//! the gate hands back on delivery ([`Payload`], its rare parts boxed in [`Rare`]), and the
//! counts a task keeps of its work ([`Work`] for the open transaction, [`TaskCounts`] for its
//! metrics). [`fetched`] builds a [`Fetched`] from any [`FetchedMessage`]: a polled Kafka
//! message in the stream thread, a stored record in the test driver — one path for both.
//!
//! Invariant: a payload's common part stays small — every record moves through the gate by
//! value — and whatever only some records carry is in [`Rare`], absent for the others.

use std::time::Instant;

use parsley_clock::{Channel, Stamp, codec};
use parsley_gate::Arrival;

use super::context::TaskContext;
use super::output::Header;
use crate::context::GateMode;
use crate::error::RecordError;
use crate::error::{Error, Result};

/// What the gate hands back on delivery.
#[derive(Debug)]
pub struct Payload {
    /// Index of the source topic in the stage's sources (`TaskContext::sources`).
    pub source: usize,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// When the record's poll batch was taken (gate-wait metrics).
    pub arrived: Instant,
    /// The Kafka record timestamp, ms since the epoch (the event time of an event-time stage);
    /// `None` when the record has none.
    pub record_timestamp: Option<i64>,
    /// What few records carry; boxed: every record moves through the gate by value, and the
    /// common case should be small.
    pub rare: Option<Box<Rare>>,
}

/// What few records carry ([`Payload::rare`]).
#[derive(Debug, Default)]
pub struct Rare {
    /// The stamp, when the gate does not check it (`GateMode::Off`): still merged
    /// into the node clock on delivery.
    pub unchecked_stamp: Option<Stamp>,
    /// Why the record goes to the dead-letter topic instead of the handler, if it does.
    pub dead_letter: Option<Box<str>>,
    /// The record's headers, kept when the stage may dead-letter it or when it has one that
    /// is not Parsley's own (for the handler).
    pub headers: Box<[Header]>,
}

impl Rare {
    /// The stamp the gate did not check, if any.
    pub fn unchecked_stamp(rare: &Option<Box<Rare>>) -> Option<&Stamp> {
        rare.as_ref()?.unchecked_stamp.as_ref()
    }

    /// Why the record goes to the dead-letter topic, if it does.
    pub fn dead_letter(rare: &Option<Box<Rare>>) -> Option<&str> {
        rare.as_ref()?.dead_letter.as_deref()
    }

    /// The record's headers, when the stage keeps them; else none.
    pub fn headers(rare: &Option<Box<Rare>>) -> &[Header] {
        rare.as_ref().map_or(&[], |r| &r.headers)
    }
}

/// A polled record, copied out of the consumer's buffer.
#[derive(Debug)]
pub struct Fetched {
    /// The task's partition.
    pub partition: i32,
    /// The record's channel.
    pub channel: Channel,
    /// What the gate takes.
    pub arrival: Arrival<Payload>,
    /// The stamp header could not be decoded (the record is unstamped in `arrival`).
    pub malformed: Option<Box<Error>>,
}

/// Work done since the last commit: what makes a commit worth writing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// Records delivered to the handler or dead-lettered.
    pub deliveries: u64,
    /// Records the handler sent (its emissions; a dead letter is counted by the
    /// `dead_lettered` metric, its record in `deliveries`).
    pub emissions: u64,
    /// Gate deliveries parked in an event-time queue (the queue changed: commit it).
    pub parked: u64,
    /// Ticks of the built-in clock written (commit them: they count only once visible) or read.
    pub ticks: u64,
}

impl Work {
    /// No delivery, send, parked record or tick.
    pub fn is_empty(&self) -> bool {
        *self == Work::default()
    }
}

impl std::ops::AddAssign for Work {
    fn add_assign(&mut self, other: Work) {
        self.deliveries += other.deliveries;
        self.emissions += other.emissions;
        self.parked += other.parked;
        self.ticks += other.ticks;
    }
}

/// Per-task deliveries not yet added to the task's [`crate::metrics::TaskMetrics`] (one lock per
/// delivery round, not per record).
#[derive(Debug, Default)]
pub struct TaskCounts {
    /// Records delivered.
    pub delivered: u64,
    /// Deliveries the gate held.
    pub held: u64,
    /// Time those deliveries waited in the gate, µs.
    pub gate_wait_us: u64,
    /// The longest of those waits, µs.
    pub max_gate_wait_us: u64,
    /// Late records.
    pub late: u64,
    /// Watermarks raised.
    pub raised: u64,
    /// Ticks of the built-in clock written.
    pub ticks: u64,
}

/// A record read from a source partition, as [`fetched`] copies it: a message polled by the
/// stage's consumer, or a record of the test driver's in-memory log.
pub trait FetchedMessage {
    /// The topic's name.
    fn topic(&self) -> &str;
    /// The partition.
    fn partition(&self) -> i32;
    /// The offset.
    fn offset(&self) -> i64;
    /// The record timestamp, ms since the epoch; `None` when it has none.
    fn timestamp_ms(&self) -> Option<i64>;
    /// The key bytes; `None`: a record without a key.
    fn key(&self) -> Option<&[u8]>;
    /// The value bytes; `None`: a tombstone.
    fn value(&self) -> Option<&[u8]>;
    /// The value of the first stamp header (empty for a null value); `None` when the
    /// record has none.
    fn stamp_header(&self) -> Option<&[u8]>;
    /// Every header, copied.
    fn all_headers(&self) -> Box<[Header]>;
    /// Whether a header is not one of Parsley's own ([`parsley_stage::is_own_header`]): one
    /// the handler sees. The default copies the headers to look.
    fn has_user_headers(&self) -> bool {
        self.all_headers()
            .iter()
            .any(|(n, _)| !parsley_stage::is_own_header(n))
    }
}

/// Copies what the task needs out of a read record and decodes its stamp. `arrival` counts
/// the records fetched so far (the delivery order under `GateMode::Off`), `epoch` is the
/// poll batch's, `arrived` when the batch took its first record.
///
/// Boxed: the record passes through the poll loop, the hold buffer and the task by value
/// before the gate's queue takes it in; a pointer moves where the 256-byte struct was copied
/// at each step (a dozen copies per record).
///
/// # Errors
/// [`SetupError::UnknownTopic`](crate::error::SetupError::UnknownTopic) when the record's topic is
/// not a source of the stage.
pub fn fetched<M: FetchedMessage + ?Sized>(
    ctx: &TaskContext,
    m: &M,
    // Read only by the negative control, which delivers in arrival order.
    #[cfg_attr(not(feature = "negative-controls"), allow(unused_variables))] arrival: u64,
    epoch: u64,
    arrived: Instant,
) -> Result<Box<Fetched>> {
    let source = ctx.source_index(m.topic())?;
    let channel = Channel::new(ctx.sources[source].id, m.partition());
    let (stamp, malformed) = match decode_stamp(m, channel) {
        Ok(stamp) => (stamp, None),
        Err(e) => (None, Some(Box::new(e))),
    };
    let record_timestamp = m.timestamp_ms();
    // Kafka's v2 record format always has a timestamp; it only orders deliverable records.
    let timestamp = record_timestamp.unwrap_or(i64::MIN);
    let (stamp, unchecked_stamp, timestamp) = match ctx.gate_mode {
        GateMode::Causal => (stamp, None, timestamp),
        // A plain consumer: deliver in arrival order.
        #[cfg(feature = "negative-controls")]
        GateMode::Off => (None, stamp, arrival as i64),
    };
    // Headers are kept for a dead letter (all of them), and for the handler when the record
    // carries one of its own (Parsley's are filtered out on delivery).
    let keep_headers = ctx.keep_headers || m.has_user_headers();
    // Allocated first and written in place: `Box::new` builds the record on the stack and
    // copies it into the allocation.
    let boxed = Box::new_uninit();
    Ok(Box::write(
        boxed,
        Fetched {
            partition: m.partition(),
            channel,
            arrival: Arrival {
                offset: m.offset(),
                epoch,
                timestamp,
                stamp,
                payload: Payload {
                    source,
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.value().map(<[u8]>::to_vec),
                    arrived,
                    record_timestamp,
                    rare: (unchecked_stamp.is_some() || keep_headers).then(|| {
                        Box::new(Rare {
                            unchecked_stamp,
                            dead_letter: None,
                            headers: if keep_headers {
                                m.all_headers()
                            } else {
                                Box::default()
                            },
                        })
                    }),
                },
            },
            malformed,
        },
    ))
}

/// Decodes the stamp header of `m`; `None` when the record has none.
///
/// # Errors
/// [`RecordError::MalformedStamp`] naming the record and the decoder's finding.
fn decode_stamp<M: FetchedMessage + ?Sized>(m: &M, channel: Channel) -> Result<Option<Stamp>> {
    let Some(value) = m.stamp_header() else {
        return Ok(None);
    };
    codec::decode(value).map(Some).map_err(|source| {
        Error::Record(RecordError::MalformedStamp {
            topic: m.topic().to_string(),
            partition: m.partition(),
            offset: m.offset(),
            record: channel.at(m.offset()),
            source: Box::new(source),
        })
    })
}
