//! What a producer sends and what the broker acknowledges: [`OutgoingRecord`] and [`Acked`],
//! shared by the causal producer of the Kafka runtime and the test driver's producers.

use parsley_clock::{Coordinate, is_stamp_header};

use crate::error::RecordError;
use crate::error::{Error, RecordProblem, Result};

/// A send the broker acknowledged: its sequence and coordinate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The send sequence `CausalProducer::send` or `CausalProducer::send_record` returned.
    pub seq: u64,
    /// Where the record was appended.
    pub coordinate: Coordinate,
}

/// One record for `CausalProducer::send_record`: topic, key and value, and optionally a
/// record timestamp and headers besides the stamp.
///
/// ```
/// use parsley_task::outgoing::OutgoingRecord;
///
/// let record = OutgoingRecord::new("invoices", b"customer-7", b"42.00 EUR")
///     .timestamp(1_767_225_600_000) // ms since the epoch
///     .header("currency", b"EUR")
///     .header("issued-by", b"invoicing");
/// assert_eq!(record.headers().len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord<'a> {
    pub(crate) topic: &'a str,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
    pub(crate) timestamp: Option<i64>,
    pub(crate) headers: Vec<(&'a str, &'a [u8])>,
}

impl<'a> OutgoingRecord<'a> {
    /// A record with `key` and `value` for `topic`, its timestamp the producer's clock, no
    /// header but the stamp.
    pub fn new(topic: &'a str, key: &'a [u8], value: &'a [u8]) -> Self {
        OutgoingRecord {
            topic,
            key,
            value,
            timestamp: None,
            headers: Vec::new(),
        }
    }

    /// Sets the record timestamp, ms since the epoch (it must be positive).
    pub fn timestamp(mut self, ms: i64) -> Self {
        self.timestamp = Some(ms);
        self
    }

    /// Adds a header `name` with `value`, after the stamp header and the headers added before
    /// (any name but the stamp header's, [`parsley_clock::STAMP_HEADER`] and
    /// [`parsley_clock::LEGACY_STAMP_HEADER`]; names may repeat, as Kafka allows).
    pub fn header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The topic.
    pub fn topic(&self) -> &'a str {
        self.topic
    }

    /// The key's bytes.
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The value's bytes.
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// The record timestamp set, ms since the epoch; `None`: the producer's clock.
    pub fn record_timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// The headers added, in order (the stamp header is not among them).
    pub fn headers(&self) -> &[(&'a str, &'a [u8])] {
        &self.headers
    }

    /// Why the record cannot be sent as asked, if it cannot.
    pub fn check(&self) -> Result<()> {
        let problem = if let Some(ms) = self.timestamp.filter(|ms| *ms <= 0) {
            RecordProblem::Timestamp(ms)
        } else if let Some((name, _)) = self.headers.iter().find(|(n, _)| is_stamp_header(n)) {
            RecordProblem::ReservedHeader((*name).to_string())
        } else if let Some((name, _)) = self.headers.iter().find(|(n, _)| n.contains('\0')) {
            RecordProblem::NulInHeaderName((*name).to_string())
        } else {
            return Ok(());
        };
        Err(Error::Record(RecordError::InvalidRecord {
            topic: self.topic.to_string(),
            problem,
        }))
    }
}
