//! Parsley's task, and everything that runs it without Kafka.
//!
//! A task is partition `p` of every source of a stage: it offers each fetched record to its
//! [`Gate`](parsley_gate::Gate), hands what the gate releases to the stage's handler, keeps the
//! handler's fold state, orders by event time when the stage asks (end offsets, not timeouts),
//! and stamps every emission with its node clock. What it sends and what it writes to its
//! changelog go through two narrow traits, [`output::Output`] and [`output::ChangelogWriter`]:
//! the Kafka runtime (`parsley-runtime`) implements them on a transactional producer, the
//! [`TopologyTestDriver`] on in-memory logs. This crate has no Kafka client in its dependency
//! tree, so a crate whose tests use only the DSL and the driver builds without a C compiler.
//!
//! # Layers
//! | module | its one job |
//! |---|---|
//! | [`error`] | the one public error type, with its classification |
//! | [`topic`] | a topic's identity, the partition of a key, the identity of a send |
//! | [`outgoing`] | what a producer sends, what the broker acknowledges |
//! | [`context`] | what the tasks of a stage share: topics by role, processor, policy |
//! | [`output`] | the traits a task hands its records to |
//! | [`record`] | what moves through a task: fetched records, payloads, counts of work |
//! | [`policy`] | impossible stamps and dead letters |
//! | [`backpressure`] | the pure plan of pauses, resumes, spills and re-fetches |
//! | [`event_time`] | watermark, timer queue and parking of an event-time task |
//! | [`task`] | the task: gate, handler call, stamping, fold state, snapshot, rebuild |
//! | [`state_store`] | fold state on disk, with a local checkpoint |
//! | [`metrics`], [`explain`] | what a stage reports: counters, phases, why it waits |
//! | [`query`] | interactive queries: requests to a stream thread, the wait for a stamp |
//! | [`driver`] | the in-memory test driver |
//!
//! Each module imports only modules above it in this table (`metrics`, `explain` and `query`
//! aside, which the task writes to), and the Kafka runtime only this crate's public items.
//!
//! ```
//! use parsley_task::TopologyTestDriver;
//! use parsley_stage::{Handler, HandlerResult, Record, Step, Topology, Utf8};
//!
//! /// Writes one invoice per order.
//! struct Invoice;
//! impl Handler for Invoice {
//!     type Key = String;
//!     type Value = String;
//!     type Output = String;
//!     type State = ();
//!     fn handle(&self, r: Record<'_, String, String>, _: Option<()>)
//!         -> HandlerResult<String, String, ()>
//!     {
//!         Ok(Step::none().emit("invoices", r.key, format!("invoice for {}", r.value)))
//!     }
//! }
//!
//! let topology = Topology::builder("shop")
//!     .stage("invoice", Invoice, |s| {
//!         s.source("orders").sink("invoices")
//!             .key_codec(Utf8).value_codec(Utf8).output_codec(Utf8)
//!     })
//!     .build()?;
//! let driver = TopologyTestDriver::builder(topology).build()?;
//! let order = driver.input_topic("orders", Utf8, Utf8)?.pipe("alice".into(), "2 kg".into())?;
//!
//! let invoice = driver.output_topic("invoices", Utf8, Utf8)?.read_record().unwrap();
//! assert_eq!(invoice.value, "invoice for 2 kg");
//! assert!(invoice.stamp.unwrap().clock.covers(order)); // the invoice claims its order
//! # Ok::<(), parsley_task::Error>(())
//! ```
#![forbid(unsafe_code)]

pub mod backpressure;
pub mod client_stats;
pub mod context;
pub mod driver;
pub mod error;
pub mod event_time;
pub mod explain;
pub mod memory;
pub mod metrics;
pub mod outgoing;
pub mod output;
pub mod policy;
pub mod query;
pub mod record;
pub mod state_store;
pub mod task;
pub mod topic;

pub use context::GateMode;
pub use driver::TopologyTestDriver;
pub use error::{Error, Result};

/// A map keyed by channel, hashed with foldhash: the stream thread looks a record's channel up
/// in several of these per record, and std's SipHash of a channel (a 16-byte topic id and a
/// partition) took about 250 instructions per lookup. Channels come from the group's assignment,
/// not from record bytes, so a hash flooding attack is not a concern.
pub type ChannelMap<V> =
    std::collections::HashMap<parsley_clock::Channel, V, foldhash::fast::RandomState>;

/// A set of channels hashed as [`ChannelMap`].
pub type ChannelSet =
    std::collections::HashSet<parsley_clock::Channel, foldhash::fast::RandomState>;
