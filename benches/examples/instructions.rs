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

use std::hint::black_box;

use parsley_clock::{Channel, Clock, SenderId, SenderTag, Stamp, TopicId, codec};
use parsley_gate::{Arrival, Gate};

/// Records per gate batch, as in `gate_delivery`.
const BATCH: i64 = 1_000;

/// `clock_codec`'s stamp: `entries` channels over `entries / 4` topics.
fn stamp(entries: usize) -> Stamp {
    let clock: Clock = (0..entries)
        .map(|i| {
            let topic = TopicId::from_halves(0x1234_5678 + (i / 4) as i64, 0x9abc_def0);
            Channel::new(topic, (i % 4) as i32).at(1_000_000_000 + (i as i64 * 7_919) % 5_000)
        })
        .collect();
    let sender = Some(SenderTag {
        sender: SenderId::from_short([7; 8]),
        seq: 123_456,
    });
    Stamp::new(sender, clock)
}

fn arrival(offset: i64, stamp: Option<Stamp>) -> Arrival<()> {
    Arrival {
        offset,
        timestamp: 0,
        epoch: 0,
        stamp,
        payload: (),
    }
}

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
    let consumed: Vec<Channel> = (0..4)
        .map(|p| Channel::new(TopicId::from_halves(1, 1), p))
        .collect();
    let stamps: Vec<Stamp> = (1..=BATCH)
        .map(|o| {
            let mut clock: Clock = (0..entries - 2)
                .map(|i| Channel::new(TopicId::from_halves(2 + i as i64, 0), 0).at(o * 10))
                .collect();
            clock.observe(consumed[0].at(o - 1));
            clock.observe(consumed[1].at(0));
            Stamp::new(None, clock)
        })
        .collect();
    for _ in 0..reps.div_ceil(BATCH as usize) {
        let mut g: Gate<()> = Gate::new(consumed.iter().copied());
        for ch in &consumed {
            g.seed(*ch, 0).expect("seed");
        }
        for ch in &consumed[..2] {
            g.offer(*ch, arrival(0, None)).expect("offer");
            g.next_delivery().expect("deliverable");
        }
        measured_gate(g, stamps.clone(), &consumed);
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
    let s = stamp(entries);
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
