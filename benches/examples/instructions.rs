//! The workloads of the `clock_codec` and `gate_delivery` benchmarks, run a given number of
//! times, for counting their instructions under callgrind (wall-clock time on a shared machine
//! drifts; instruction counts do not).
//!
//! ```sh
//! cargo build --release -p parsley-benches --example instructions
//! valgrind --tool=callgrind --callgrind-out-file=cg.out --toggle-collect='*measured_*' \
//!     target/release/examples/instructions round_trip 16 2000
//! ```
//!
//! Arguments: the workload (`encode`, `decode`, `round_trip` or `gate`), the number of entries
//! per stamp, and the repetitions (stamps encoded or decoded; delivered records, in batches of
//! 1,000, for `gate`). Only the `measured_*` functions are counted: the instructions per
//! repetition are callgrind's total divided by the repetitions.
#![forbid(unsafe_code)]

use std::hint::black_box;

use parsley_benches::workloads::{
    GATE_BATCH, arrival, codec_stamp, gate_consumed, gate_stamps, seeded_gate,
};
use parsley_clock::{Channel, Stamp, codec};
use parsley_gate::Gate;

#[inline(never)]
fn measured_encode(s: &Stamp, buf: &mut Vec<u8>, reps: usize) {
    for _ in 0..reps {
        buf.clear();
        codec::encode_into(black_box(s), buf);
        black_box(buf.len());
    }
}

#[inline(never)]
fn measured_decode(bytes: &[u8], reps: usize) {
    for _ in 0..reps {
        black_box(codec::decode(black_box(bytes)).expect("valid"));
    }
}

#[inline(never)]
fn measured_round_trip(s: &Stamp, buf: &mut Vec<u8>, reps: usize) {
    for _ in 0..reps {
        buf.clear();
        codec::encode_into(black_box(s), buf);
        black_box(codec::decode(buf).expect("valid"));
    }
}

/// `gate_delivery`'s routine: offer and deliver a batch.
#[inline(never)]
fn measured_gate(mut g: Gate<()>, stamps: Vec<Stamp>, consumed: &[Channel]) {
    for (i, s) in stamps.into_iter().enumerate() {
        g.offer(consumed[0], arrival(i as i64 + 1, Some(s)))
            .expect("offer");
        black_box(g.next_delivery().expect("deliverable"));
    }
}

/// `gate_delivery`'s setup and batches.
fn gate(entries: usize, reps: usize) {
    let consumed = gate_consumed();
    let stamps = gate_stamps(entries, &consumed);
    for _ in 0..reps.div_ceil(GATE_BATCH as usize) {
        measured_gate(seeded_gate(&consumed), stamps.clone(), &consumed);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: instructions encode|decode|round_trip|gate ENTRIES REPETITIONS";
    let [_, what, entries, reps] = &args[..] else {
        panic!("{usage}")
    };
    let entries: usize = entries.parse().expect(usage);
    let reps: usize = reps.parse().expect(usage);
    let s = codec_stamp(entries);
    let bytes = codec::encode(&s);
    let mut buf = Vec::with_capacity(1024);
    match what.as_str() {
        "encode" => measured_encode(&s, &mut buf, reps),
        "decode" => measured_decode(&bytes, reps),
        "round_trip" => measured_round_trip(&s, &mut buf, reps),
        "gate" => gate(entries, reps),
        _ => panic!("{usage}"),
    }
}
