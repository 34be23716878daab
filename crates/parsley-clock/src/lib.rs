//! Channels, offset vector clocks and stamps: the causal vocabulary of Parsley.
//!
//! Parsley orders deliveries by Kafka's own evidence. The evidence is named here:
//! a [`Channel`] is `(topic UUID, partition)`, a [`Coordinate`] is a channel plus an offset,
//! a [`Clock`] claims every offset up to its entry on each channel, and a [`Stamp`] — carried
//! in the [`STAMP_HEADER`] record header — says who sent a record ([`SenderTag`]) and what it
//! depends on. [`CausalClock`] is the node clock of a sender: stage tasks and plain producers
//! use it to stamp what they send.
//!
//! ```
//! use parsley_clock::{codec, CausalClock, Channel, SenderId, TopicId};
//!
//! let orders = Channel::new(TopicId::from_halves(1, 2), 0);
//! let invoices = Channel::new(TopicId::from_halves(3, 4), 0);
//!
//! let mut clock = CausalClock::new(SenderId::random());
//! clock.observe(orders.at(41), None); // we consumed orders/0 up to offset 41
//! let stamp = clock.stamp(invoices)?; // the invoice we send depends on it
//! assert!(stamp.clock.covers(orders.at(41)));
//!
//! let header = codec::encode(&stamp);
//! assert_eq!(codec::decode(&header)?, stamp);
//! # Ok::<(), parsley_clock::Error>(())
//! ```
//!
//! This crate is pure: no I/O, no Kafka client. Its vocabulary and rules are the book's
//! specification, §1 and §3.
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod causal;
mod channel;
mod clock;
pub mod codec;
mod error;
mod sender;
mod stamp;

pub use causal::CausalClock;
pub use channel::{Channel, Coordinate, TopicId};
pub use clock::Clock;
pub use codec::{LEGACY_STAMP_HEADER, STAMP_HEADER, is_stamp_header};
pub use error::{DecodeErrorKind, Error, Result};
pub use sender::{SenderId, SenderTag};
pub use stamp::{InFlight, Stamp};
