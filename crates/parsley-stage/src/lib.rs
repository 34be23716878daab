//! Stages: the `Handler` trait, serde codecs and the topology builder.
//!
//! Users write a [`Handler`] — a pure function of a delivered record and its key's fold
//! state — and compose stages in `main.rs` with [`Topology::builder`]. The runtime
//! (`parsley-runtime`) runs each stage as one consumer group whose tasks are co-partitioned
//! slices of its sources, delivering records through the causal gate and committing outputs,
//! fold state and input offsets in one transaction (the book's specification, §6).
//!
//! A handler is plain Rust, so it is tested by calling it; the topology that names its sources
//! and sinks is checked when it is built:
//!
//! ```
//! use parsley_stage::{Handler, HandlerResult, Record, StateChange, Step, Topology, Utf8};
//!
//! /// Counts the orders of each customer and emits the running count.
//! struct CountOrders;
//! impl Handler for CountOrders {
//!     type Key = String;
//!     type Value = String;
//!     type Output = u64;
//!     type State = u64;
//!     fn handle(&self, r: Record<'_, String, String>, n: Option<u64>)
//!         -> HandlerResult<String, u64, u64>
//!     {
//!         let n = n.unwrap_or(0) + 1;
//!         Ok(Step::none().emit("order-counts", r.key, n).set_state(n))
//!     }
//! }
//!
//! // The handler alone: one delivered record and the key's fold state in, one step out.
//! let order = Record {
//!     topic: "orders", partition: 0, offset: 7, timestamp: 1_700_000_000_000,
//!     key: "alice".to_string(), value: "2 kg of apples".to_string(), headers: &[],
//! };
//! let step = CountOrders.handle(order, Some(2))?;
//! assert_eq!(step.emit[0].value, 3);
//! assert_eq!(step.state, StateChange::Set(3));
//!
//! // The handler as a stage: validated at build time, described for review.
//! let topology = Topology::builder("shop")
//!     .stage("count-orders", CountOrders, |s| {
//!         s.source("orders").sink("order-counts").key_codec(Utf8).value_codec(Utf8)
//!     })
//!     .build()?;
//! assert_eq!(topology.stages()[0].group_id(topology.application_id()), "shop.count-orders");
//! println!("{}", topology.describe());
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```
//!
//! See [`topology`] for what the builder validates. The runtime runs a topology against a
//! broker (`parsley_runtime::Runtime`) or in memory (`parsley_runtime::TopologyTestDriver`);
//! most services use the DSL (`parsley_dsl`) instead of writing handlers by hand.
//! [`changelog`] is the byte format of a stage's changelog records and the fold a restore
//! applies to them (pure; the runtime reads and writes the topic).
//! [`CausalClock`] is re-exported for plain producers that feed a topology.
//!
//! # Layering
//! Each module imports only modules listed before it (checked by the workspace's
//! `no_import_circles` test):
//! 1. `codec`, `handler`, `internal`, `event_time` and [`changelog`]: import none of the others;
//! 2. `error`: the error types of `codec` and `handler`; `punctuation`: `codec` and `handler`;
//!    [`store`]: a queryable view of fold state, over `codec`;
//! 3. `processor`: a handler and its codecs as bytes, failing with `error`'s errors;
//! 4. [`topology`]: stages built from processors and validated;
//! 5. `describe`: a built topology, for people.
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

pub mod changelog;
mod codec;
mod describe;
mod error;
mod event_time;
mod handler;
mod header;
mod internal;
mod processor;
mod punctuation;
pub mod store;
pub mod topology;

pub use codec::{Auto, Bincode, Bytes, Codec, CodecError, Json, Nullable, Utf8};
pub use describe::{StageDescription, TopologyDescription};
pub use error::{BadRecordKind, Error, Part, Result};
pub use handler::{Emission, Handler, HandlerError, HandlerResult, Record, StateChange, Step};
pub use header::{Header, is_own_header, user_headers};
pub use internal::InternalTopic;
pub use parsley_clock::CausalClock;
pub use processor::{
    NoLookup, Processor, RawDelivery, RawEmission, RawPunctuated, RawPunctuation, RawRecord,
    RawStep, RawTimer, StateLookup,
};
pub use punctuation::{
    FoldStates, Punctuated, Punctuation, PunctuationType, Punctuator, PunctuatorResult, ReadState,
    Schedule,
};
pub use topology::{
    BadRecordPolicy, BuiltInClock, ControlStream, DEFAULT_MAX_DRIFT_MS, DEFAULT_TICK_INTERVAL_MS,
    EventTimeOrder, ImpossiblePolicy, KeyPartitioning, StageBuilder, StageSettings, StageSpec,
    Topology, TopologyBuilder, changelog_topic, clock_topic,
};
