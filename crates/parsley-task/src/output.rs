//! Where a task's records go: the two narrow traits between the pure task and the producer.
//!
//! A task stamps each emission with its node clock and hands it to an [`Output`]; at a commit
//! it writes its changed state and snapshot to a [`ChangelogWriter`]. The stream thread's
//! transaction implements both (module `transaction`); tests implement them with vectors.
//!
//! Invariant: a record refused by [`Output::send`] was not sent, and the task releases its
//! claim in the node clock at once (a clock never claims a send that was not made).

use std::sync::Arc;

use crate::error::Result;
use crate::topic::SendTag;

/// A record header: its name and its value (`None`: a header with a null value), as the stage
/// layer defines it.
pub use parsley_stage::Header;

/// One stamped record a task sends, its buffers handed over.
#[derive(Debug)]
pub struct Outgoing<'a> {
    /// The topic.
    pub topic: Arc<str>,
    /// The sending task, the target channel (partition chosen by the key) and the send
    /// sequence: what the delivery report is matched to.
    pub tag: SendTag,
    /// Key bytes; `None`: a record without a key.
    pub key: Option<Vec<u8>>,
    /// Value bytes (the producer keeps the buffer until the send's report, without a copy);
    /// `None`: a tombstone.
    pub value: Option<Vec<u8>>,
    /// The encoded stamp (stamp header); empty: no stamp header (a tick of the
    /// built-in clock: it claims nothing).
    pub stamp: &'a [u8],
    /// Headers besides the stamp (a dead letter's original headers and its own).
    pub headers: &'a [Header],
    /// The record timestamp, ms since the epoch; `None`: the producer's clock.
    pub timestamp: Option<i64>,
}

/// A stamped record kept while a commit is in flight, sent in the next transaction.
#[derive(Debug)]
pub struct HeldSend {
    topic: Arc<str>,
    tag: SendTag,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    stamp: Vec<u8>,
    headers: Vec<Header>,
    timestamp: Option<i64>,
}

impl HeldSend {
    /// Keeps `record`, copying its borrowed parts.
    pub fn hold(record: Outgoing<'_>) -> Self {
        HeldSend {
            topic: record.topic,
            tag: record.tag,
            key: record.key,
            value: record.value,
            stamp: record.stamp.to_vec(),
            headers: record.headers.to_vec(),
            timestamp: record.timestamp,
        }
    }

    /// The send's tag.
    pub fn tag(&self) -> SendTag {
        self.tag
    }

    /// Sends the held record to `output`.
    ///
    /// # Errors
    /// As [`Output::send`].
    pub fn send_to(self, output: &mut dyn Output) -> Result<()> {
        let HeldSend {
            topic,
            tag,
            key,
            value,
            stamp,
            headers,
            timestamp,
        } = self;
        output.send(Outgoing {
            topic,
            tag,
            key,
            value,
            stamp: &stamp,
            headers: &headers,
            timestamp,
        })
    }
}

/// Takes a task's stamped records.
pub trait Output {
    /// Sends `record`, or keeps it to send later in the same order.
    ///
    /// # Errors
    /// When the producer refuses the record; it was not sent. A record it will never take (larger
    /// than its `message.max.bytes`) is [`crate::error::RecordError::OutputRefused`] with the stage
    /// and input left for the task to name ([`crate::Error::refused_in`]).
    fn send(&mut self, record: Outgoing<'_>) -> Result<()>;
}

/// Takes the changelog records of a task (key; value, `None` for a tombstone).
pub trait ChangelogWriter {
    /// Writes one record to the task's changelog partition.
    ///
    /// # Errors
    /// When the producer refuses the record ([`crate::error::RecordError::OutputRefused`] when it
    /// never will).
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()>;
}
