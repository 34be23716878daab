//! Parsley's benchmarks; the library holds only the micro-benchmarks' shared workloads
//! ([`workloads`]).
//!
//! Criterion benchmarks in `benches/`, run with `cargo bench -p parsley-benches`:
//! - `clock_codec`: stamp encode and decode time and encoded bytes per entry, for stamps of
//!   4, 16 and 64 entries;
//! - `gate_delivery`: gate cost per delivered record for stamps of 4, 16 and 64 entries;
//! - `key_check`: the key-partition check per delivered record (murmur2 of 8-, 16- and 36-byte
//!   keys).
//!
//! The end-to-end benchmark, the `e2e` binary in `e2e/`, run with `cargo xtask bench e2e`: a
//! raw rdkafka transactional loop, a Parsley pass-through stage and a Parsley count per key
//! against Kafka Streams' pass-through and count, on a real broker (throughput and CPU per
//! record measured from outside the processes, live-record latency, peak memory).
//!
//! Figures are recorded in the book ("Benchmarks").
#![forbid(unsafe_code)]

pub mod workloads;
