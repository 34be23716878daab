//! Stamp encode and decode time, and encoded bytes per entry.
//!
//! Stamps name `entries` channels spread over `entries / 4` topics (four partitions each),
//! with offsets around 10^9 that differ by a few thousand between partitions of a topic: the
//! shape of a stage reading a few busy topics.
#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use parsley_benches::workloads::codec_stamp as stamp;
use parsley_clock::{Clock, Stamp, codec};

/// The stamp of `entries` with only the first entry of each topic.
fn firsts(s: &Stamp) -> Stamp {
    let clock: Clock = s
        .clock
        .iter()
        .filter(|c| c.channel.partition == 0)
        .collect();
    Stamp::new(s.sender, clock)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("stamp");
    for entries in [4usize, 16, 64] {
        let s = stamp(entries);
        let bytes = codec::encode(&s);
        let topics = entries.div_ceil(4);
        // Head, sender, sequence and topic count.
        let fixed = codec::encode(&Stamp::new(s.sender, Clock::new())).len();
        let heads = codec::encode(&firsts(&s)).len();
        let first = (heads - fixed) as f64 / topics as f64 - 16.0;
        let further = (bytes.len() - heads) as f64 / (entries - topics) as f64;
        println!(
            "stamp of {entries} entries over {topics} topics: {} bytes; {fixed} fixed, {first:.2} bytes for a topic's first entry beyond its 16-byte id, {further:.2} bytes per further entry",
            bytes.len()
        );
        group.throughput(Throughput::Elements(entries as u64));
        group.bench_with_input(BenchmarkId::new("encode", entries), &s, |b, s| {
            let mut buf = Vec::with_capacity(1024);
            b.iter(|| {
                buf.clear();
                codec::encode_into(black_box(s), &mut buf);
                black_box(buf.len())
            })
        });
        group.bench_with_input(BenchmarkId::new("decode", entries), &bytes, |b, bytes| {
            b.iter(|| codec::decode(black_box(bytes)).expect("valid"))
        });
        group.bench_with_input(BenchmarkId::new("round_trip", entries), &s, |b, s| {
            let mut buf = Vec::with_capacity(1024);
            b.iter(|| {
                buf.clear();
                codec::encode_into(black_box(s), &mut buf);
                codec::decode(&buf).expect("valid")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
