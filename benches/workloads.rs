//! The workloads of the `clock_codec` and `gate_delivery` benchmarks, shared with the
//! `instructions` example that counts their instructions under callgrind.

use parsley_clock::{Channel, Clock, SenderId, SenderTag, Stamp, TopicId};
use parsley_gate::{Arrival, Gate};

/// Records per gate batch.
pub const GATE_BATCH: i64 = 1_000;

/// The codec's stamp: `entries` channels over `entries / 4` topics (four partitions each),
/// offsets around 10^9 that differ by up to 5,000 between partitions of a topic, and a short
/// sender id (as `SenderId::random` draws) at sequence 123,456.
pub fn codec_stamp(entries: usize) -> Stamp {
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

/// The gate task's four consumed channels (partitions 0–3 of one topic).
pub fn gate_consumed() -> Vec<Channel> {
    (0..4)
        .map(|p| Channel::new(TopicId::from_halves(1, 1), p))
        .collect()
}

/// Stamps for records `1..=GATE_BATCH` on `consumed[0]`: each claims the previous record on
/// `consumed[0]`, offset 0 of `consumed[1]`, and `entries - 2` channels the task does not
/// consume (the ignore branch).
///
/// # Panics
/// When `entries < 2` or `consumed` has fewer than two channels.
pub fn gate_stamps(entries: usize, consumed: &[Channel]) -> Vec<Stamp> {
    (1..=GATE_BATCH)
        .map(|o| {
            let mut clock: Clock = (0..entries - 2)
                .map(|i| Channel::new(TopicId::from_halves(2 + i as i64, 0), 0).at(o * 10))
                .collect();
            clock.observe(consumed[0].at(o - 1));
            clock.observe(consumed[1].at(0));
            Stamp::new(None, clock)
        })
        .collect()
}

/// A gate over `consumed`, every channel seeded at 0 and offset 0 of the first two delivered:
/// every claim of [`gate_stamps`]'s first record holds.
pub fn seeded_gate(consumed: &[Channel]) -> Gate<()> {
    let mut g: Gate<()> = Gate::new(consumed.iter().copied());
    for ch in consumed {
        g.seed(*ch, 0).expect("seed");
    }
    for ch in &consumed[..2] {
        g.offer(*ch, arrival(0, None)).expect("offer");
        g.next_delivery().expect("deliverable");
    }
    g
}

/// A fetched record at `offset` with `stamp` and no payload.
pub fn arrival(offset: i64, stamp: Option<Stamp>) -> Arrival<()> {
    Arrival {
        offset,
        timestamp: 0,
        epoch: 0,
        stamp,
        payload: (),
    }
}
