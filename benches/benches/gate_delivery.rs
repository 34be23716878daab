//! Gate cost per delivered record: offer a stamped record, release it.
//!
//! The task consumes 4 channels; each record's stamp names `entries` channels, 2 of them
//! consumed by the task (already delivered up to the claimed offset) and the rest on channels
//! the task does not consume (the ignore branch). Records arrive in causal order, so every
//! record is delivered at once: this measures the cost of the checks, not of waiting.
#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use parsley_benches::workloads::{
    GATE_BATCH as BATCH, arrival, gate_consumed, gate_stamps, seeded_gate,
};

fn bench(c: &mut Criterion) {
    let consumed = gate_consumed();
    let mut group = c.benchmark_group("gate");
    group.throughput(Throughput::Elements(BATCH as u64));
    for entries in [4usize, 16, 64] {
        let stamps = gate_stamps(entries, &consumed);
        group.bench_with_input(
            BenchmarkId::new("deliver", entries),
            &stamps,
            |b, stamps| {
                b.iter_batched(
                    || (seeded_gate(&consumed), stamps.clone()),
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
