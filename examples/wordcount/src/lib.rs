//! Word count on Kafka, one of the two pipelines `cargo xtask compare` runs in Parsley and in
//! Kafka Streams on the same input.
//!
//! - [`lines`]: the input generator: lines of 3–12 words drawn from a fixed vocabulary of
//!   200 lowercase words with Zipf-like frequencies, the same lines for the same seed;
//! - [`produce`]: writes generated lines to a topic as keyless records with a plain
//!   (idempotent, `acks=all`) producer;
//! - [`pipeline`]: the word count in Parsley's DSL, compiled into a [`Topology`]
//!   (with the Kafka Streams version beside it, and both line counts).
//!
//! The binary's `produce-lines` subcommand runs [`produce::produce_lines`]; its `run`
//! subcommand runs [`pipeline::topology`] with Parsley's runtime.
//!
//! [`Topology`]: parsley::Topology
#![forbid(unsafe_code)]

pub mod lines;
pub mod pipeline;
pub mod produce;
