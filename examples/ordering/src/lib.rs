//! The event-time ordering experiment (the book's specification, §5, "Evaluation"): the
//! silence-problem workload and four ways of ordering it by event time, measured on a real
//! broker.
//!
//! - [`workload`]: the workload as data — 12 topics with event time and one without
//!   (valid products, the control stream), 3 partitions each, keyed by product, strict
//!   per-key event-time order, days of history then live traffic, partitions of different
//!   lengths and one silent at startup; deterministic by seed.
//! - [`produce`]: writes it (`generate` binary: `cargo run -p parsley-ordering --bin generate`).
//! - [`baseline`]: (a) a fixed event-time window, (b) timeout idleness in two layers, (c) in
//!   one layer — honest Flink-like jobs on one rdkafka consumer per topic.
//! - [`offsets`]: (d) offset completeness, the Parsley stage ordered by event time with the
//!   built-in clock (or the hand-run control stream).
//! - [`observe`]: a `read_committed` consumer that notes when records became visible (the
//!   clock's ticks, windowed results).
//! - [`windows`]: windowed counting on the same workload, closed by evidence (a Parsley DSL
//!   pipeline) against Kafka Streams' stream time with grace, compared with a batch ground
//!   truth.
//! - [`run`], [`measure`], [`report`]: one measured run per strategy and seed, the figures, the
//!   tables and the chart (`cargo xtask experiment`).
//!
//! ```
//! use parsley_ordering::workload::{Workload, WorkloadConfig};
//!
//! let w = Workload::new(WorkloadConfig { history_records: 1_000, ..WorkloadConfig::default() })?;
//! let history = w.history(1_700_000_000_000);
//! assert_eq!(history.events.len(), 1_000);
//! assert_eq!(w.topics().len(), 13);
//! # Ok::<(), parsley_ordering::Error>(())
//! ```
#![forbid(unsafe_code)]

// The allocator of a Parsley service (jemalloc, the `parsley` crate's default), for every
// strategy and worker this crate runs.
use parsley as _;

pub mod baseline;
pub mod cli;
mod error;
pub mod measure;
pub mod observe;
pub mod offsets;
pub mod plain;
pub mod produce;
pub mod report;
pub mod run;
pub mod windows;
pub mod workload;

pub use error::{Error, Result};
