//! The causal delivery gate: pure decision logic, no I/O.
//!
//! A [`Gate`] holds the fetched records of one task (partition `p` of every source topic of a
//! stage) and releases a record only when every coordinate its stamp claims on the channels
//! this task consumes has been delivered or proven absent (the book's specification, §2 and §4).
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
//! # Event-time ordering (the book's specification, §5)
//! On top of causal delivery, a stage may order by event time per key. A [`CatchUp`] tracker
//! says when each input has read the history that existed at task start (its frontier reaches
//! the high watermark read then); a [`WatermarkTracker`] turns delivered event times, fetch
//! heads and an optional control clock into a watermark that moves only on that evidence; a
//! [`TimerQueue`] is the sort: delivered records are parked under their event time (raised to
//! their parked ancestors') and released in order as the watermark passes them.
//!
//! ```
//! use parsley_clock::{Channel, TopicId};
//! use parsley_gate::{Control, Parking, TimerQueue, WatermarkTracker};
//!
//! let (fast, slow) = (Channel::new(TopicId::from_halves(1, 1), 0), Channel::new(TopicId::from_halves(1, 1), 1));
//! let mut clock = WatermarkTracker::new([fast, slow], Some(Control { lag_ms: 1_000 }));
//! let mut sort: TimerQueue<&str, &str> = TimerQueue::new();
//! clock.start(fast, 1)?; // high watermarks read at task start
//! clock.start(slow, 1)?;
//! clock.control(1_000_000)?; // processing time, from an injected clock
//!
//! // The fast partition delivers first: its record waits, time does not move.
//! clock.delivered(fast, 0, 500)?;
//! clock.frontier(fast, 0)?; // the gate's frontier
//! assert!(matches!(sort.park("sku-1", 500, [], "sold"), Parking::Parked { .. }));
//! assert_eq!(clock.watermark(), None);
//!
//! // The slow partition delivers its earlier record; both are now caught up and at the head:
//! // the clock jumps to now minus the lag and both records leave in event-time order.
//! clock.delivered(slow, 0, 400)?;
//! clock.frontier(slow, 0)?;
//! sort.park("sku-1", 400, [], "in stock");
//! assert_eq!(clock.watermark(), Some(999_000));
//! let out: Vec<&str> = sort.advance(999_000).into_iter().map(|r| r.value).collect();
//! assert_eq!(out, ["in stock", "sold"]);
//! # Ok::<(), parsley_gate::GateError>(())
//! ```
//!
//! The rules are those of the book's specification, §4 (the gate) and §5 (event time).
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

pub mod bounded;
mod catchup;
mod error;
mod gate;
mod timers;
mod watermark;

pub use catchup::{CatchUp, ChannelProgress};
pub use error::{GateError, ImpossibleReason, Refused};
#[cfg(feature = "negative-controls")]
pub use gate::Faults;
pub use gate::{
    Arrival, Awaiting, BlockedHead, ChannelSnapshot, Delivery, Discarded, Gate, GateMetrics,
    GateSnapshot, ImpossibleStamp, Refetch, Resolution,
};
pub use timers::{
    CARRY_FACTOR, CARRY_SLACK, Parking, Part, QueueParts, Released, SEGMENT_BYTES, TimerMetrics,
    TimerQueue, segment_ids,
};
pub use watermark::{
    Control, Hold, InputSnapshot, InputState, WatermarkSnapshot, WatermarkTracker,
};
