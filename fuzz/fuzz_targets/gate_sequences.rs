//! The gate fed arbitrary sequences of the runtime's calls: seeding, fetched records with
//! arbitrary stamps (coordinate claims, sender tags, in-flight claims), consumer positions, high
//! watermarks, polls, deliveries and resolutions of impossible stamps. The sequences keep the
//! runtime's side of the contract (offsets ascend per channel, a position is past every record
//! offered, a high watermark read after a poll is past every record of that poll); the stamps
//! keep none. After each step:
//! - nothing panics;
//! - every delivery is of a record offered and neither delivered nor discarded before;
//! - the causal rule: when a record is delivered, every record offered on a consumed channel at
//!   or above its baseline and at or below a coordinate the delivered record's clock claims has
//!   been delivered or discarded before it (a record delivered by `Resolution::Deliver`, which
//!   drops its impossible claims, is exempt);
//! - a channel's frontier never decreases and is never below its baseline minus one.
//!
//! Built with the `negative-control` feature, the gate runs the deliberately wrong variant
//! that `PARSLEY_FUZZ_FAULT` names (`gate_off` or `bridge_over_lookahead`), and the checks
//! above must find a violation: that is how `cargo xtask fuzz` shows they can fail.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use parsley_clock::{Channel, Clock, Coordinate, InFlight, SenderId, SenderTag, Stamp, TopicId};
use parsley_gate::{Arrival, Gate, Resolution};

/// Channels 0..3 are consumed; channel 3 is not (claims on it are foreign).
const CHANNELS: usize = 4;
const CONSUMED: usize = 3;

fn channel(i: u8) -> Channel {
    let i = usize::from(i) % CHANNELS;
    let topic = TopicId::from_halves(1 + (i / 2) as i64, 7);
    Channel::new(topic, (i % 2) as i32)
}

fn index(c: &Channel) -> usize {
    (0..CHANNELS as u8)
        .find(|&i| channel(i) == *c)
        .map(usize::from)
        .expect("a model channel")
}

fn sender(i: u8) -> SenderId {
    SenderId::from_bytes([1 + i % 2; 16])
}

/// The wrong variant `PARSLEY_FUZZ_FAULT` names.
#[cfg(feature = "negative-control")]
fn fault() -> parsley_gate::Faults {
    static FAULT: std::sync::OnceLock<parsley_gate::Faults> = std::sync::OnceLock::new();
    *FAULT.get_or_init(|| {
        let mut f = parsley_gate::Faults::default();
        match std::env::var("PARSLEY_FUZZ_FAULT").as_deref() {
            Ok("gate_off") => f.gate_off = true,
            Ok("bridge_over_lookahead") => f.bridge_over_lookahead = true,
            other => panic!("PARSLEY_FUZZ_FAULT: gate_off or bridge_over_lookahead, not {other:?}"),
        }
        f
    })
}

#[derive(Arbitrary, Debug)]
enum Op {
    Seed { ch: u8, at: u8 },
    Poll,
    Offer {
        ch: u8,
        gap: u8,
        sender: Option<u8>,
        claims: Vec<(u8, u8)>,
        in_flight: Vec<(u8, u8)>,
        timestamp: u8,
    },
    Position { ch: u8, gap: u8 },
    HighWatermark { ch: u8, ahead: u8 },
    Deliver,
    Resolve { discard: bool },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    Held,
    Delivered,
    Discarded,
}

struct Offered {
    claims: Vec<Coordinate>,
    status: Status,
    forced: bool,
}

#[derive(Default)]
struct Model {
    baseline: [Option<i64>; CHANNELS],
    /// The lowest offset the next record of each channel may have.
    floor: [i64; CHANNELS],
    high_watermark: [i64; CHANNELS],
    next_seq: [u64; 2],
    epoch: u64,
    offered: BTreeMap<(usize, i64), Offered>,
}

fuzz_target!(|ops: Vec<Op>| {
    let mut gate: Gate<()> = Gate::new((0..CONSUMED as u8).map(channel));
    #[cfg(feature = "negative-control")]
    gate.set_faults(fault());
    let mut m = Model::default();
    let mut frontier: [Option<i64>; CHANNELS] = [None; CHANNELS];
    for op in ops.into_iter().take(512) {
        match op {
            Op::Seed { ch, at } => {
                let i = usize::from(ch) % CHANNELS;
                let at = i64::from(at % 8);
                if gate.seed(channel(ch), at).is_ok() {
                    m.baseline[i] = Some(at);
                    m.floor[i] = at;
                    frontier[i] = Some(at - 1);
                }
            }
            Op::Poll => m.epoch += 1,
            Op::Offer { ch, gap, sender: s, claims, in_flight, timestamp } => {
                let i = usize::from(ch) % CHANNELS;
                let offset = m.floor[i] + i64::from(gap % 3);
                let mut clock = Clock::new();
                for (c, o) in claims.into_iter().take(6) {
                    clock.observe(Coordinate { channel: channel(c), offset: i64::from(o % 12) });
                }
                let tag = s.map(|s| {
                    let k = usize::from(s % 2);
                    m.next_seq[k] += 1;
                    SenderTag { sender: sender(s), seq: m.next_seq[k] }
                });
                let mut claims_in_flight: Vec<InFlight> = Vec::new();
                if let Some(tag) = tag {
                    for (c, back) in in_flight.into_iter().take(3) {
                        let seq = tag.seq.saturating_sub(1 + u64::from(back % 4));
                        let channel = channel(c);
                        if seq > 0 && !claims_in_flight.iter().any(|f| f.channel == channel) {
                            claims_in_flight.push(InFlight { channel, seq });
                        }
                    }
                    claims_in_flight.sort_by_key(|f| f.channel);
                }
                let mut stamp = Stamp::new(tag, clock);
                stamp.in_flight = claims_in_flight;
                if stamp.validate().is_err() {
                    stamp.in_flight.clear();
                }
                let claimed: Vec<Coordinate> = stamp.clock.iter().collect();
                let arrival = Arrival {
                    offset,
                    timestamp: i64::from(timestamp),
                    epoch: m.epoch,
                    stamp: Some(stamp),
                    payload: (),
                };
                if gate.offer(channel(ch), arrival).is_ok() {
                    m.floor[i] = offset + 1;
                    m.offered.insert(
                        (i, offset),
                        Offered { claims: claimed, status: Status::Held, forced: false },
                    );
                }
            }
            Op::Position { ch, gap } => {
                let i = usize::from(ch) % CHANNELS;
                let position = m.floor[i] + i64::from(gap % 3);
                if gate.position(channel(ch), position).is_ok() {
                    m.floor[i] = position;
                }
            }
            Op::HighWatermark { ch, ahead } => {
                let i = usize::from(ch) % CHANNELS;
                let h = (m.floor[i] + i64::from(ahead % 4)).max(m.high_watermark[i]);
                m.high_watermark[i] = h;
                gate.high_watermark(channel(ch), h, m.epoch);
                // Records polled later are of a later poll.
                m.epoch += 1;
            }
            Op::Deliver => {
                while let Some(d) = gate.next_delivery() {
                    let i = index(&d.coordinate.channel);
                    let key = (i, d.coordinate.offset);
                    let record = m.offered.get(&key).unwrap_or_else(|| {
                        panic!("delivered {:?}, never offered", d.coordinate)
                    });
                    assert_eq!(record.status, Status::Held, "{:?} twice", d.coordinate);
                    if !record.forced {
                        for c in &record.claims {
                            let j = index(&c.channel);
                            let Some(base) = m.baseline[j].filter(|&b| j < CONSUMED && b <= c.offset)
                            else {
                                continue;
                            };
                            for (&(_, o), r) in m.offered.range((j, base)..=(j, c.offset)) {
                                assert!(
                                    (j, o) == key || r.status != Status::Held,
                                    "{:?} delivered before its cause {:?}@{o}",
                                    d.coordinate,
                                    c.channel
                                );
                            }
                        }
                    }
                    m.offered.get_mut(&key).expect("offered").status = Status::Delivered;
                }
            }
            Op::Resolve { discard } => {
                for s in gate.take_impossible() {
                    let resolution = if discard { Resolution::Discard } else { Resolution::Deliver };
                    let i = index(&s.record.channel);
                    if gate.resolve(s.record, resolution).is_ok() {
                        if let Some(r) = m.offered.get_mut(&(i, s.record.offset)) {
                            if discard {
                                r.status = Status::Discarded;
                            } else {
                                r.forced = true;
                            }
                        }
                    }
                }
            }
        }
        for i in 0..CONSUMED {
            let now = gate.frontier(&channel(i as u8));
            if let (Some(before), Some(now)) = (frontier[i], now) {
                assert!(now >= before, "channel {i}: frontier {before} → {now}");
            }
            if let (Some(base), Some(now)) = (m.baseline[i], now) {
                assert!(now >= base - 1, "channel {i}: frontier {now} below baseline {base}");
            }
            if now.is_some() {
                frontier[i] = now;
            }
        }
    }
});
