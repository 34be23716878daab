//! Criterion benchmarks of Parsley (no library code; see `benches/`).
//!
//! - `clock_codec`: stamp encode and decode time and encoded bytes per entry, for stamps of
//!   4, 16 and 64 entries;
//! - `gate_delivery`: gate cost per delivered record for stamps of 4, 16 and 64 entries.
//!
//! Run with `cargo bench -p parsley-benches`; figures are recorded in the book.
