//! Stages: the `Handler` trait, serde codecs and the topology builder.
//!
//! Users write a [`Handler`] — a pure function of a delivered record and its key's fold
//! state — and compose stages in `main.rs` with [`Topology::builder`]. The runtime
//! (`parsley-runtime`) runs each stage as one consumer group whose tasks are co-partitioned
//! slices of its sources, delivering records through the causal gate and committing outputs,
//! fold state and input offsets in one transaction (the book's specification, §6).
//!
//! See [`topology`] for a complete example. [`CausalClock`] is re-exported for plain producers
//! that feed a topology.
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod codec;
mod describe;
mod error;
mod event_time;
mod handler;
mod internal;
mod processor;
pub mod topology;

pub use codec::{Auto, Bincode, Bytes, Codec, CodecError, Json, Nullable, Utf8};
pub use describe::{StageDescription, TopologyDescription};
pub use error::{Error, Result};
pub use handler::{Emission, Handler, HandlerError, HandlerResult, Record, StateChange, Step};
pub use internal::InternalTopic;
pub use parsley_clock::CausalClock;
pub use processor::{Part, Processor, RawDelivery, RawEmission, RawRecord, RawStep, RawTimer};
pub use topology::{
    BadRecordKind, BadRecordPolicy, BuiltInClock, ControlStream, DEFAULT_TICK_INTERVAL_MS,
    EventTimeOrder, ImpossiblePolicy, KeyPartitioning, StageBuilder, StageSettings, StageSpec,
    Topology, TopologyBuilder, changelog_topic, clock_topic,
};
