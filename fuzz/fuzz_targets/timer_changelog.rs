//! The timer queue's changelog decoder. A queue built by arbitrary parks and raises is written
//! in its changelog form and rebuilt: the rebuilt queue equals it. Then arbitrary bytes are
//! flipped in the written records and the decoder runs again: it never panics, and a queue it
//! accepts releases its records in ascending `(park time, arrival)` order when raised.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use parsley_gate::{Part, TimerQueue};

#[derive(Arbitrary, Debug)]
enum Op {
    /// Parks a record of key `key` at event time `time`, raised to its ancestors' times.
    Park {
        key: u8,
        time: i16,
        ancestors: Vec<i16>,
        value: u16,
    },
    /// Raises the watermark and takes what it released.
    Raise(i16),
}

#[derive(Arbitrary, Debug)]
struct Input {
    ops: Vec<Op>,
    /// `(record index, byte index, xor)`: byte flips in the written records (index 0 is the
    /// header, then each part in order).
    flips: Vec<(u8, u16, u8)>,
}

type Queue = TimerQueue<Vec<u8>, u16>;

fn rebuild(header: &[u8], parts: &[(Part<Vec<u8>>, Vec<u8>)]) -> Result<Queue, parsley_gate::GateError> {
    Queue::from_parts(header, parts.iter().map(|(p, b)| (p.clone(), b.as_slice())))
}

fuzz_target!(|input: Input| {
    let mut queue = Queue::new().with_changelog_limits(256, 4);
    for op in input.ops.iter().take(256) {
        match op {
            Op::Park { key, time, ancestors, value } => {
                let _ = queue.park(
                    vec![*key % 8],
                    i64::from(*time),
                    ancestors.iter().take(4).map(|&a| i64::from(a)),
                    *value,
                );
            }
            Op::Raise(w) => {
                queue.raise(i64::from(*w));
            }
        }
        while queue.next_released().is_some() {}
    }
    let written = queue.to_parts().expect("a queue with every release taken writes itself");
    let mut parts: Vec<(Part<Vec<u8>>, Vec<u8>)> = written
        .parts
        .into_iter()
        .filter_map(|(p, b)| Some((p, b?)))
        .collect();
    let rebuilt = rebuild(&written.header, &parts).expect("its own changelog decodes");
    assert!(rebuilt == queue, "the rebuilt queue differs from the one written");

    let mut header = written.header;
    for &(record, at, xor) in &input.flips {
        let bytes = match usize::from(record) % (parts.len() + 1) {
            0 => &mut header,
            i => &mut parts[i - 1].1,
        };
        if !bytes.is_empty() {
            let at = usize::from(at) % bytes.len();
            bytes[at] ^= xor;
        }
    }
    if let Ok(mut q) = rebuild(&header, &parts) {
        q.raise(i64::MAX);
        let mut last = None;
        while let Some(r) = q.next_released() {
            let id = (r.park_time_ms, r.arrival);
            assert!(last < Some(id), "released out of order: {last:?} then {id:?}");
            assert!(r.park_time_ms >= r.event_time_ms, "a park time below its event time");
            last = Some(id);
        }
    }
});
