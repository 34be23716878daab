//! Sender identities and send sequences.
//!
//! Every stamped record names the task (or plain producer) that emitted it and the position of
//! that send in the sender's own sequence ("sender tag" in the book's specification, §1). Offsets
//! are assigned by the broker and learned only from acks, so the send sequence is the one order a
//! sender knows at send time.
//!
//! Invariant: a [`SenderId`] names one *incarnation* of a sender. A stage task keeps its id in
//! its committed state and takes a fresh one whenever its state is created fresh, so a
//! sequence number never repeats under the same id with different content.

use std::fmt;

use uuid::Uuid;

/// Identity of an emitting task incarnation or plain producer: 16 bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SenderId(Uuid);

impl SenderId {
    /// A fresh random identity (UUID v4), for a new incarnation.
    pub fn random() -> Self {
        SenderId(Uuid::new_v4())
    }

    /// Wraps a UUID.
    pub const fn from_uuid(uuid: Uuid) -> Self {
        SenderId(uuid)
    }

    /// Builds an id from its 16 big-endian bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        SenderId(Uuid::from_bytes(bytes))
    }

    /// The 16 big-endian bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl fmt::Display for SenderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A sender's identity plus the sequence number of one send (`0` for its first send).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SenderTag {
    /// Who sent the record.
    pub sender: SenderId,
    /// The sender's send sequence for this record; strictly increasing per sender.
    pub seq: u64,
}

impl fmt::Display for SenderTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.sender, self.seq)
    }
}
