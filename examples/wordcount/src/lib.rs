//! Word count on Kafka, one of the two pipelines `cargo xtask compare` runs in Parsley and in
//! Kafka Streams on the same input.
//!
//! - [`lines`]: the input generator: lines of 3–12 words drawn from a fixed vocabulary of
//!   200 lowercase words with Zipf-like frequencies, the same lines for the same seed;
//! - [`produce`]: writes generated lines to a topic as keyless records with a plain
//!   (idempotent, `acks=all`) producer.
//!
//! The binary's `produce-lines` subcommand runs [`produce::produce_lines`].

pub mod lines;
pub mod produce;
