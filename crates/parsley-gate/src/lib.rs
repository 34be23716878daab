//! The causal delivery gate: pure decision logic, no I/O.
//!
//! A [`Gate`] holds the fetched records of one task (partition `p` of every source topic of a
//! stage) and releases a record only when every coordinate its stamp claims on the channels
//! this task consumes has been delivered or proven absent (DESIGN.md §2 and §4).
//!
//! ```
//! use parsley_clock::{Channel, Clock, Stamp, TopicId};
//! use parsley_gate::{Arrival, Gate};
//!
//! let stock = Channel::new(TopicId::from_halves(1, 1), 0);
//! let sales = Channel::new(TopicId::from_halves(2, 2), 0);
//! let mut gate = Gate::new([stock, sales]);
//! gate.seed(stock, 0)?;
//! gate.seed(sales, 0)?;
//!
//! // A sale that depends on stock@0 arrives first: it is held.
//! let claims: Clock = [stock.at(0)].into_iter().collect();
//! gate.offer(sales, Arrival { offset: 0, timestamp: 2, epoch: 1, stamp: Some(Stamp::new(None, claims)), payload: "sold" })
//!     .map_err(|e| e.kind)?;
//! assert!(gate.next_delivery().is_none());
//!
//! // Its cause arrives: both are released, cause first.
//! gate.offer(stock, Arrival { offset: 0, timestamp: 1, epoch: 1, stamp: None, payload: "in stock" })
//!     .map_err(|e| e.kind)?;
//! assert_eq!(gate.next_delivery().unwrap().payload, "in stock");
//! assert_eq!(gate.next_delivery().unwrap().payload, "sold");
//! # Ok::<(), parsley_gate::GateError>(())
//! ```
//!
//! Source: the causal-model seed ("What breaks the textbook algorithms here") and DESIGN.md §4.
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod error;
mod gate;

pub use error::{GateError, ImpossibleReason, Refused};
#[cfg(feature = "negative-controls")]
pub use gate::Faults;
pub use gate::{
    Arrival, Awaiting, BlockedHead, ChannelSnapshot, Delivery, Discarded, Gate, GateMetrics,
    GateSnapshot, ImpossibleStamp, Refetch, Resolution,
};
