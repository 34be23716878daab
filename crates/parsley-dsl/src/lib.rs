//! Parsley's Kafka-Streams-style DSL: streams, tables, re-keying, aggregations, windows closed
//! by evidence and causally consistent joins, compiled into the stages the runtime runs.
//!
//! A [`StreamsBuilder`] reads topics as [`KStream`]s and [`KTable`]s; operators named as in
//! Kafka Streams chain on them; [`StreamsBuilder::build`] compiles the pipeline into a
//! [`Topology`](parsley_stage::Topology) that `parsley_runtime::Runtime` runs with every
//! guarantee of a hand-written stage: each delivered record after its causes, outputs stamped,
//! outputs, state and input offsets committed in one transaction.
//!
//! How a pipeline compiles (see [`Topology::describe`](parsley_stage::Topology::describe)):
//! - operators connected without a repartition are **fused** into one stage (one consumer
//!   group, one handler call per delivered record, no topic in between);
//! - a key change (`map`, `select_key`, `flat_map`, `group_by`, `process`) before a stateful
//!   operator sends the stream through a **repartition topic**
//!   `{application}-{operator}-repartition`, created by the runtime with the partition count
//!   of what it is co-partitioned with, and starts a new stage; the records crossing it stay
//!   stamped, so causal order survives the hop;
//! - stateful operators (tables, aggregations, joins, `process`) keep their values in their
//!   stage's per-key state, one slot per operator, committed with the outputs;
//! - windows ([`TimeWindows`], [`SlidingWindows`], [`SessionWindows`]), windowed stream–stream joins
//!   ([`JoinWindows`]) and expiring table rows ([`KTable::expire_after`]) close on the stage's
//!   event-time watermark through keyed timers: each result is emitted once, when Kafka's
//!   evidence proves the window complete, and records too late for every window are counted
//!   and routed ([`LatePolicy`]), never dropped silently.
//!
//! ```
//! use parsley_dsl::StreamsBuilder;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Clone, Serialize, Deserialize)]
//! struct Order { customer: String, amount_cents: i64 }
//! #[derive(Clone, Serialize, Deserialize)]
//! struct Payment { amount_cents: i64 }
//!
//! let builder = StreamsBuilder::new("shop");
//! let orders = builder.table::<String, Order>("orders");
//! builder
//!     .stream::<String, Payment>("payments")
//!     .join(&orders, |_payment, order| order.clone())
//!     .select_key(|_order_id, order| order.customer.clone())
//!     .group_by_key()
//!     .named("revenue")
//!     .aggregate(|| 0i64, |_customer, order, total| total + order.amount_cents)
//!     .to_stream()
//!     .to("revenue");
//! let topology = builder.build()?;
//! println!("{}", topology.describe());
//! # Ok::<(), parsley_stage::Error>(())
//! ```
//!
//! # Layering
//! Each module imports only modules listed before it (checked by the workspace's
//! `no_import_circles` test):
//! 1. `data` (what records are, their codecs) and `state` (a key's slots): import none of the
//!    others;
//! 2. `flow`: operators as push functions over a record's context;
//! 3. `processor` (a compiled stage) and `late` (records too late for their windows);
//! 4. `graph`: the untyped operators and their compilation into stages;
//! 5. `stream`: [`KStream`] and its stateless operators, sinks and repartitions;
//! 6. `process` ([`KStream::process`] and its punctuation, [`Schedules`]), `split`
//!    ([`KStream::split`] into branches, [`Branched`]), `table` ([`KTable`],
//!    stream–table joins), `stream_join` (windowed stream joins) and `global` ([`GlobalKTable`]
//!    and the stream joins that read it);
//! 7. `grouped`: [`KGroupedStream`] and its aggregations, then `cogroup`: several grouped
//!    streams into one aggregate ([`CogroupedKStream`]), and `grouped_table`: a table
//!    re-grouped ([`KGroupedTable`]) and its aggregations that retract;
//! 8. `window`: [`TimeWindows`] and the [`Windowing`] of a grouped stream, then `sliding`:
//!    [`SlidingWindows`];
//! 9. `session`: [`SessionWindows`];
//! 10. `builder`: [`StreamsBuilder`], the entry point, on top.
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod builder;
mod cogroup;
mod data;
mod flow;
mod foreign_key;
mod global;
mod graph;
mod grouped;
mod grouped_table;
mod late;
mod process;
mod processor;
mod session;
mod sliding;
mod split;
mod state;
mod stream;
mod stream_join;
mod stream_table;
mod suppress;
mod table;
mod window;

pub use builder::StreamsBuilder;
pub use cogroup::CogroupedKStream;
pub use data::{Consumed, Data, Produced};
pub use global::GlobalKTable;
pub use grouped::KGroupedStream;
pub use grouped_table::KGroupedTable;
pub use late::{LatePolicy, LateRecord};
pub use process::Schedules;
pub use session::{SessionWindowedKStream, SessionWindows};
pub use sliding::{SlidingWindowedKStream, SlidingWindows};
pub use split::{Branched, Split};
pub use state::read_slot;
pub use stream::KStream;
pub use stream_join::JoinWindows;
pub use stream_table::Joined;
pub use suppress::Suppressed;
pub use table::KTable;
pub use window::{TimeWindowedKStream, TimeWindows, Windowed, Windowing};

#[cfg(test)]
mod tests;
