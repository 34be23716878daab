//! Gate cost per delivered record: offer a stamped record, release it.
//!
//! The task consumes 4 channels; each record's stamp names `entries` channels, 2 of them
//! consumed by the task (already delivered up to the claimed offset) and the rest on channels
//! the task does not consume (the ignore branch). Records arrive in causal order, so every
//! record is delivered at once: this measures the cost of the checks, not of waiting.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use parsley_clock::{Channel, Clock, Stamp, TopicId};
use parsley_gate::{Arrival, Gate};

const BATCH: i64 = 1_000;

fn arrival(offset: i64, stamp: Option<Stamp>) -> Arrival<()> {
    Arrival {
        offset,
        timestamp: 0,
        epoch: 0,
        stamp,
        payload: (),
    }
}

fn bench(c: &mut Criterion) {
    let consumed: Vec<Channel> = (0..4)
        .map(|p| Channel::new(TopicId::from_halves(1, 1), p))
        .collect();
    let mut group = c.benchmark_group("gate");
    group.throughput(Throughput::Elements(BATCH as u64));
    for entries in [4usize, 16, 64] {
        // Stamps for records 1..=BATCH on channel 0: each claims the previous record on
        // channels 0 and 1 and `entries - 2` foreign channels.
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
        group.bench_with_input(
            BenchmarkId::new("deliver", entries),
            &stamps,
            |b, stamps| {
                b.iter_batched(
                    || {
                        let mut g: Gate<()> = Gate::new(consumed.iter().copied());
                        for ch in &consumed {
                            g.seed(*ch, 0).expect("seed");
                        }
                        // Offset 0 of the two claimed channels, delivered: every claim holds.
                        for ch in &consumed[..2] {
                            g.offer(*ch, arrival(0, None)).expect("offer");
                            g.next_delivery().expect("deliverable");
                        }
                        (g, stamps.clone())
                    },
                    |(mut g, stamps)| {
                        for (i, s) in stamps.into_iter().enumerate() {
                            g.offer(consumed[0], arrival(i as i64 + 1, Some(s)))
                                .expect("offer");
                            black_box(g.next_delivery().expect("deliverable"));
                        }
                    },
                    criterion::BatchSize::LargeInput,
                )
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
