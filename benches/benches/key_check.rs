//! The cost of the key-partition check per delivered record: murmur2 of the key bytes modulo
//! the source's partition count, compared with the record's partition (case C20). Keys of 8
//! bytes (the end-to-end benchmark's keys, `00000042`), 16 and 36 bytes (a UUID as text).
#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use parsley_runtime::partition_for;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_check");
    for len in [8usize, 16, 36] {
        // 1,024 distinct keys of `len` bytes, checked in turn (the branch predictor and cache
        // see a stream of keys, as a stage does).
        let keys: Vec<(Vec<u8>, i32)> = (0..1_024u64)
            .map(|i| {
                let key = format!("{i:0len$}").into_bytes();
                let partition = partition_for(&key, 4);
                (key, partition)
            })
            .collect();
        group.throughput(Throughput::Elements(keys.len() as u64));
        group.bench_with_input(BenchmarkId::new("murmur2", len), &keys, |b, keys| {
            b.iter(|| {
                keys.iter()
                    .filter(|(key, partition)| partition_for(black_box(key), 4) == *partition)
                    .count()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
