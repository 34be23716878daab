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
///
/// An id whose first eight bytes are zero is *short*: a stamp carries its last eight bytes only
/// ([`crate::codec`]). [`SenderId::random`] draws short ids; ids of other forms (restored from
/// state written before short ids existed, or chosen by a caller) take 16 bytes on the wire.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SenderId(Uuid);

impl SenderId {
    /// A fresh random short identity, for a new incarnation: 64 random bits (from a UUID v4,
    /// its fixed version and variant bits left out).
    ///
    /// Two incarnations collide with probability about `n² / 2⁶⁵` for `n` incarnations whose
    /// records meet in one task: below 10⁻¹¹ for 10,000.
    pub fn random() -> Self {
        let b = Uuid::new_v4().into_bytes();
        // Bytes 6 and 8 carry the version and variant bits.
        let short = [b[0], b[1], b[2], b[3], b[4], b[5], b[7], b[9]];
        Self::from_short(short)
    }

    /// The short id whose last eight bytes are `bytes`.
    pub const fn from_short(bytes: [u8; 8]) -> Self {
        let mut full = [0u8; 16];
        let mut i = 0;
        while i < 8 {
            full[8 + i] = bytes[i];
            i += 1;
        }
        SenderId(Uuid::from_bytes(full))
    }

    /// The last eight bytes when the id is short (its first eight are zero).
    pub fn short(&self) -> Option<[u8; 8]> {
        let (hi, lo) = self.as_bytes().split_at(8);
        if hi.iter().all(|&b| b == 0) {
            Some(lo.try_into().expect("eight bytes"))
        } else {
            None
        }
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
