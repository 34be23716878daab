//! Unit tests of the gate: the rule, look-ahead, density adaptation, evidence, spilling and
//! re-fetching, impossible stamps, and restarts.

use parsley_clock::{Channel, Clock, Coordinate, InFlight, SenderId, SenderTag, Stamp, TopicId};

use super::*;
use crate::error::{GateError, ImpossibleReason};

fn ch(t: u8, p: i32) -> Channel {
    Channel::new(TopicId::from_bytes([t; 16]), p)
}

fn sender(n: u8) -> SenderId {
    SenderId::from_bytes([n; 16])
}

/// A record of `sender`/`seq` claiming `claims` by coordinate and `in_flight` in flight.
fn rec(
    offset: i64,
    from: Option<(u8, u64)>,
    claims: &[Coordinate],
    in_flight: &[(Channel, u64)],
) -> Arrival<i64> {
    Arrival {
        offset,
        timestamp: 0,
        epoch: 1,
        stamp: Some(Stamp {
            sender: from.map(|(s, seq)| SenderTag {
                sender: sender(s),
                seq,
            }),
            clock: claims.iter().copied().collect::<Clock>(),
            in_flight: in_flight
                .iter()
                .map(|&(channel, seq)| InFlight { channel, seq })
                .collect(),
            acked_through: None,
        }),
        payload: offset,
    }
}

fn plain(offset: i64) -> Arrival<i64> {
    Arrival {
        offset,
        timestamp: 0,
        epoch: 1,
        stamp: None,
        payload: offset,
    }
}

fn drain(gate: &mut Gate<i64>) -> Vec<Coordinate> {
    std::iter::from_fn(|| gate.next_delivery().map(|d| d.coordinate)).collect()
}

fn seeded(channels: &[Channel]) -> Gate<i64> {
    let mut g = Gate::new(channels.iter().copied());
    for c in channels {
        g.seed(*c, 0).unwrap();
    }
    g
}

#[test]
fn a_record_waits_for_its_claimed_cause_on_another_consumed_channel() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(b, rec(0, None, &[a.at(2)], &[])).unwrap();
    assert!(g.next_delivery().is_none(), "a@2 not delivered yet");
    assert_eq!(
        g.blocked_heads(),
        vec![BlockedHead {
            head: b.at(0),
            awaits: Awaiting::Frontier(a.at(2)),
        }]
    );
    g.offer(a, plain(0)).unwrap();
    g.offer(a, plain(1)).unwrap();
    assert_eq!(drain(&mut g), vec![a.at(0), a.at(1)]);
    g.offer(a, plain(2)).unwrap();
    assert_eq!(drain(&mut g), vec![a.at(2), b.at(0)]);
    assert_eq!(g.metrics().held, 1);
}

#[test]
fn awaited_names_the_channels_blocked_records_wait_on() {
    let (a, b, c) = (ch(1, 0), ch(2, 0), ch(3, 0));
    let mut g = seeded(&[a, b, c]);
    assert!(!g.awaited(&a));
    // b@0 waits for a's frontier; c@0 for an in-flight claim of sender 1 on b.
    g.offer(b, rec(0, None, &[a.at(2)], &[])).unwrap();
    g.offer(c, rec(0, Some((1, 5)), &[], &[(b, 4)])).unwrap();
    assert!(g.next_delivery().is_none());
    assert!(g.awaited(&a), "b@0 waits on a");
    assert!(g.awaited(&b), "c@0's claim waits on b");
    assert!(!g.awaited(&c));
    for o in 0..3 {
        g.offer(a, plain(o)).unwrap();
    }
    drain(&mut g);
    assert!(!g.awaited(&a), "b@0 was delivered");
}

#[test]
fn the_payload_of_a_held_record_is_readable_until_it_is_delivered_or_spilled() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(b, rec(0, None, &[a.at(1)], &[])).unwrap();
    g.offer(b, plain(1)).unwrap();
    assert_eq!(g.payload(&b.at(0)), Some(&0));
    assert_eq!(g.payload(&b.at(1)), Some(&1), "queued behind the head");
    assert_eq!(g.payload(&b.at(2)), None, "not fetched");
    assert_eq!(g.payload(&ch(9, 0).at(0)), None, "not consumed");
    g.spill(&b);
    assert_eq!(
        g.payload(&b.at(0)),
        Some(&0),
        "a tracked head is never spilled"
    );
    assert_eq!(g.payload(&b.at(1)), None, "spilled: payload dropped");
    g.offer(a, plain(0)).unwrap();
    g.offer(a, plain(1)).unwrap();
    assert_eq!(drain(&mut g), vec![a.at(0), a.at(1), b.at(0)]);
    assert_eq!(g.payload(&b.at(0)), None, "delivered");
}

#[test]
fn ignore_branch_baseline_and_unseeded_channels() {
    let (a, b, other) = (ch(1, 0), ch(2, 0), ch(3, 0));
    let mut g = Gate::new([a, b]);
    g.seed(b, 0).unwrap();
    g.offer(b, rec(0, None, &[other.at(99)], &[])).unwrap();
    assert_eq!(drain(&mut g), vec![b.at(0)]);
    assert_eq!(g.metrics().ignored_entries, 1);
    // A consumed channel that is not seeded blocks, never counts as ignored.
    g.offer(b, rec(1, None, &[a.at(3)], &[])).unwrap();
    assert!(g.next_delivery().is_none());
    assert_eq!(g.blocked_heads()[0].awaits, Awaiting::Seeding(a));
    // Seeded above the claim: out of scope, delivered.
    g.seed(a, 10).unwrap();
    assert_eq!(drain(&mut g), vec![b.at(1)]);
    assert_eq!(g.metrics().out_of_scope_entries, 1);
    assert_eq!(g.frontier(&a), Some(9));
}

#[test]
fn a_channel_a_claim_needs_spills_untracked_records_and_refetches_them() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    // b@0 of sender 1 claims its own earlier send to `a` (seq 4) in flight.
    g.offer(b, rec(0, Some((1, 5)), &[], &[(a, 4)])).unwrap();
    assert!(g.needs_reading(&a));
    // a holds a head waiting for b@0 and two records of sender 3.
    g.offer(a, rec(0, Some((2, 0)), &[b.at(0)], &[])).unwrap();
    g.offer(a, rec(1, Some((3, 0)), &[], &[])).unwrap();
    g.offer(a, rec(2, Some((3, 1)), &[], &[])).unwrap();
    assert_eq!(g.held(&a), 3);
    // Spilling keeps the tracked head and drops the rest.
    assert_eq!(g.spill(&a), 2);
    assert_eq!((g.held(&a), g.queued(&a)), (1, 3));
    assert!(g.refetch_wanted().is_empty(), "no stub is needed yet");
    // The claimed send arrives: pulled ahead, then its claimer, then the head.
    g.offer(a, rec(3, Some((1, 4)), &[], &[])).unwrap();
    assert_eq!(drain(&mut g), vec![a.at(3), b.at(0), a.at(0)]);
    assert_eq!(
        g.frontier(&a),
        Some(0),
        "bridging stops below the stub at 1"
    );
    assert_eq!(g.refetch_wanted(), vec![(a, 1)]);
    g.position(a, 4).unwrap();
    assert_eq!(g.frontier(&a), Some(0), "stubs are undelivered records");

    assert!(matches!(
        g.begin_refetch(a, 3),
        Err(GateError::NothingSpilled { from: 3, .. })
    ));
    assert_eq!(g.begin_refetch(a, 1), Ok(4));
    g.position(a, 2).unwrap(); // re-reading: ignored
    g.offer(a, plain(0)).unwrap(); // below the frontier: ignored
    // Another sender at a spilled offset: the history changed, named, record returned.
    let err = g.offer(a, rec(1, Some((9, 0)), &[], &[])).unwrap_err();
    assert!(matches!(
        err.kind,
        GateError::RefetchMismatch { offset: 1, .. }
    ));
    assert_eq!(err.refused.payload, 1);
    g.offer(a, rec(1, Some((3, 0)), &[], &[])).unwrap();
    g.offer(a, rec(2, Some((3, 1)), &[], &[])).unwrap();
    g.offer(a, rec(3, Some((1, 4)), &[], &[])).unwrap(); // delivered ahead: ignored
    assert_eq!(drain(&mut g), vec![a.at(1), a.at(2)]);
    assert_eq!(g.frontier(&a), Some(3));
    assert_eq!((g.metrics().spilled, g.metrics().refetched), (2, 2));
    // Reading reaches where it had stopped: the re-fetch ends by itself.
    g.offer(a, plain(4)).unwrap();
    assert_eq!(g.refetching(&a), None);
    assert_eq!(drain(&mut g), vec![a.at(4)]);
}

#[test]
fn bridging_covers_gaps_below_a_fetched_head() {
    // Records at 0 and 1, commit marker at 2, record at 3.
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(b, rec(0, None, &[a.at(2)], &[])).unwrap();
    g.offer(a, plain(0)).unwrap();
    g.offer(a, plain(1)).unwrap();
    assert_eq!(drain(&mut g), vec![a.at(0), a.at(1)]);
    assert_eq!(g.frontier(&a), Some(1));
    g.offer(a, rec(3, None, &[b.at(0)], &[])).unwrap();
    assert_eq!(g.frontier(&a), Some(2));
    assert_eq!(drain(&mut g), vec![b.at(0), a.at(3)]);
}

#[test]
fn position_advance_covers_a_trailing_commit_marker() {
    // C01: records 0..=2, marker at 3, end offset 4.
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(b, rec(0, None, &[a.at(3)], &[])).unwrap();
    for o in 0..3 {
        g.offer(a, plain(o)).unwrap();
    }
    assert_eq!(drain(&mut g), vec![a.at(0), a.at(1), a.at(2)]);
    assert_eq!(
        g.frontier(&a),
        Some(2),
        "the marker is not proven absent yet"
    );
    g.position(a, 4).unwrap();
    assert_eq!(g.frontier(&a), Some(3));
    assert_eq!(g.first_undelivered(&a), Some(4));
    assert_eq!(drain(&mut g), vec![b.at(0)]);
    // A position behind what was offered is a caller bug, named.
    assert!(matches!(
        g.position(a, 2),
        Err(GateError::PositionBehind { .. })
    ));
}

#[test]
fn a_position_does_not_advance_past_undelivered_records() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(a, rec(0, None, &[b.at(0)], &[])).unwrap();
    g.position(a, 7).unwrap();
    assert_eq!(g.frontier(&a), Some(-1));
}

#[test]
fn picks_smallest_timestamp_then_channel() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    let mut late = plain(0);
    late.timestamp = 50;
    let mut early = plain(0);
    early.timestamp = 10;
    g.offer(a, late).unwrap();
    g.offer(b, early).unwrap();
    assert_eq!(drain(&mut g), vec![b.at(0), a.at(0)]);
}

#[test]
fn refused_records_come_back_inside_the_error() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g: Gate<i64> = Gate::new([a]);
    let err = g.offer(a, plain(0)).unwrap_err();
    assert!(matches!(err.kind, GateError::NotSeeded { .. }));
    g.seed(a, 5).unwrap();
    let err = g.offer(b, plain(0)).unwrap_err();
    assert!(matches!(err.kind, GateError::NotConsumed { .. }));
    let err = g.offer(a, plain(4)).unwrap_err();
    assert!(matches!(
        err.kind,
        GateError::OffsetNotAscending {
            offset: 4,
            previous: 4,
            ..
        }
    ));
    assert_eq!(err.refused.payload, 4, "the record is handed back");
}

#[test]
fn a_self_claim_is_held_and_resolved_by_policy() {
    let a = ch(1, 0);
    let mut g = seeded(&[a]);
    g.offer(a, rec(0, Some((1, 0)), &[a.at(0)], &[])).unwrap();
    g.offer(a, plain(1)).unwrap();
    assert!(
        g.next_delivery().is_none(),
        "held, and everything behind it"
    );
    let found = g.take_impossible();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].record, a.at(0));
    assert_eq!(found[0].claim, a.at(0));
    assert_eq!(found[0].reason, ImpossibleReason::SelfClaim);
    assert_eq!(found[0].sender.unwrap().sender, sender(1));
    // Dead-letter it: it comes back, and the channel moves on.
    let discarded = g.resolve(a.at(0), Resolution::Discard).unwrap().unwrap();
    assert_eq!(discarded.payload, 0);
    assert_eq!(drain(&mut g), vec![a.at(1)]);
    assert_eq!(g.frontier(&a), Some(1));
    assert!(matches!(
        g.resolve(a.at(0), Resolution::Deliver),
        Err(GateError::NotHeld { .. })
    ));
    // Deliver-and-count: delivered despite the claim.
    g.offer(a, rec(2, Some((1, 1)), &[a.at(5)], &[])).unwrap();
    assert_eq!(g.take_impossible().len(), 1);
    assert!(g.resolve(a.at(2), Resolution::Deliver).unwrap().is_none());
    assert_eq!(drain(&mut g), vec![a.at(2)]);
    assert_eq!(g.metrics().impossible, 2);
    assert_eq!(g.metrics().discarded, 1);
}

#[test]
fn a_claim_beyond_the_high_watermark_read_after_the_record_is_impossible() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    let mut m = rec(0, Some((1, 0)), &[a.at(10_000)], &[]);
    m.epoch = 3;
    g.offer(b, m).unwrap();
    assert!(g.next_delivery().is_none());
    assert_eq!(g.evidence_wanted(), vec![a]);
    // A reading from before the record's poll is not evidence about it.
    g.high_watermark(a, 50, 2);
    assert!(g.take_impossible().is_empty());
    assert_eq!(g.evidence_wanted(), vec![a]);
    g.high_watermark(a, 50, 3);
    let found = g.take_impossible();
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].reason,
        ImpossibleReason::BeyondHighWatermark { high_watermark: 50 }
    );
    assert_eq!(found[0].claim, a.at(10_000));
    assert!(g.evidence_wanted().is_empty());
}

#[test]
fn an_in_flight_claim_waits_for_the_senders_record_and_pulls_it_ahead() {
    // Sender 1 sent x (seq 0) to `a` and then m (seq 1) to `b`, claiming x in flight.
    // On `a`, x landed behind an unrelated record of sender 2 that waits for b@5.
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(a, rec(0, Some((2, 0)), &[b.at(5)], &[])).unwrap();
    g.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
    g.offer(b, rec(0, Some((1, 1)), &[], &[(a, 0)])).unwrap();
    let first = g.next_delivery().unwrap();
    assert_eq!(first.coordinate, a.at(1));
    assert!(first.lookahead, "x was pulled ahead of a@0");
    let second = g.next_delivery().unwrap();
    assert_eq!(second.coordinate, b.at(0));
    assert!(
        second.replacements.is_empty(),
        "resolved by its own delivery"
    );
    assert_eq!(g.frontier(&a), Some(-1), "a look-ahead leaves the frontier");
    assert_eq!(g.lookahead(&a), vec![1]);
    assert_eq!(g.metrics().lookahead, 1);
}

#[test]
fn crossed_in_flight_sends_do_not_deadlock() {
    // The book's specification, §4: X sends r to c' then r2 to c; Y sends z to c then h to c';
    // appends land crossed: c = [r2, z], c' = [h, r]. Strict FIFO would wait in a cycle.
    let (c, c2) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[c, c2]);
    g.offer(c, rec(0, Some((1, 1)), &[], &[(c2, 0)])).unwrap(); // r2
    g.offer(c, rec(1, Some((2, 0)), &[], &[])).unwrap(); // z
    g.offer(c2, rec(0, Some((2, 1)), &[], &[(c, 0)])).unwrap(); // h
    g.offer(c2, rec(1, Some((1, 0)), &[], &[])).unwrap(); // r
    let order = drain(&mut g);
    assert_eq!(order.len(), 4, "nothing deadlocks: {order:?}");
    let at = |x: Coordinate| order.iter().position(|o| *o == x).unwrap();
    assert!(at(c2.at(1)) < at(c.at(0)), "r before r2");
    assert!(at(c.at(1)) < at(c2.at(0)), "z before h");
    assert_eq!(g.frontier(&c), Some(1));
    assert_eq!(g.frontier(&c2), Some(1));
    assert!(g.lookahead(&c).is_empty() && g.lookahead(&c2).is_empty());
}

#[test]
fn an_in_flight_claim_below_the_baseline_settles_on_the_high_watermark() {
    // The target was appended before this task's baseline on `a`.
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g: Gate<i64> = Gate::new([a, b]);
    g.seed(a, 10).unwrap();
    g.seed(b, 0).unwrap();
    let mut m = rec(0, Some((1, 5)), &[], &[(a, 4)]);
    m.epoch = 7;
    g.offer(b, m).unwrap();
    assert!(g.next_delivery().is_none());
    assert_eq!(g.evidence_wanted(), vec![a]);
    g.high_watermark(a, 12, 7);
    assert!(
        g.next_delivery().is_none(),
        "position 10 has not reached 12"
    );
    g.position(a, 12).unwrap();
    let d = g.next_delivery().unwrap();
    assert_eq!(d.coordinate, b.at(0));
    assert_eq!(d.replacements, vec![a.at(11)]);
}

#[test]
fn a_later_record_of_the_sender_settles_a_claim_on_an_absent_target() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g: Gate<i64> = Gate::new([a, b]);
    g.seed(a, 10).unwrap();
    g.seed(b, 0).unwrap();
    g.offer(b, rec(0, Some((1, 5)), &[], &[(a, 4)])).unwrap();
    // Sender 1's seq 6 on `a`: seq 4 lies below it, before the baseline.
    g.offer(a, rec(12, Some((1, 6)), &[b.at(0)], &[])).unwrap();
    let d = g.next_delivery().unwrap();
    assert_eq!(d.coordinate, b.at(0));
    assert_eq!(d.replacements, vec![a.at(11)]);
    assert_eq!(drain(&mut g), vec![a.at(12)]);
}

#[test]
fn an_in_flight_claim_on_a_channel_not_consumed_is_replaced_by_its_high_watermark() {
    let (b, other) = (ch(2, 0), ch(9, 3));
    let mut g = seeded(&[b]);
    let mut m = rec(0, Some((1, 3)), &[], &[(other, 2)]);
    m.epoch = 4;
    g.offer(b, m).unwrap();
    assert!(
        g.next_delivery().is_none(),
        "waits for evidence, not for the channel"
    );
    assert_eq!(g.evidence_wanted(), vec![other]);
    g.high_watermark(other, 80, 3);
    assert!(g.next_delivery().is_none(), "read before the record's poll");
    g.high_watermark(other, 81, 4);
    let d = g.next_delivery().unwrap();
    assert_eq!(d.replacements, vec![other.at(80)]);
}

#[test]
fn out_of_order_deliveries_survive_a_restart() {
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(a, rec(0, Some((2, 0)), &[b.at(5)], &[])).unwrap();
    g.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
    g.offer(b, rec(0, Some((1, 1)), &[], &[(a, 0)])).unwrap();
    assert_eq!(drain(&mut g), vec![a.at(1), b.at(0)]);
    let snapshot = g.snapshot();
    assert_eq!(snapshot.channels[0].lookahead, vec![1]);

    // Restart: re-fetch from the first undelivered offsets.
    let mut r: Gate<i64> = Gate::restore([a, b], &snapshot).unwrap();
    assert_eq!(r.first_undelivered(&a), Some(0));
    assert_eq!(r.first_undelivered(&b), Some(1));
    r.offer(a, rec(0, Some((2, 0)), &[b.at(5)], &[])).unwrap();
    r.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
    assert!(r.next_delivery().is_none(), "a@1 is not delivered twice");
    for o in 1..=5 {
        r.offer(b, plain(o)).unwrap();
    }
    assert_eq!(
        drain(&mut r),
        vec![b.at(1), b.at(2), b.at(3), b.at(4), b.at(5), a.at(0)]
    );
    assert_eq!(
        r.frontier(&a),
        Some(1),
        "bridged over the restored look-ahead"
    );
}

#[test]
fn a_pulled_record_keeps_its_senders_order() {
    // Sender 1 sent x0 and x1 to `a`; m claims x1 in flight. x0 goes first.
    let (a, b) = (ch(1, 0), ch(2, 0));
    let mut g = seeded(&[a, b]);
    g.offer(a, rec(0, Some((2, 0)), &[b.at(9)], &[])).unwrap();
    g.offer(a, rec(1, Some((1, 0)), &[], &[])).unwrap();
    g.offer(a, rec(2, Some((1, 1)), &[], &[])).unwrap();
    g.offer(b, rec(0, Some((1, 2)), &[], &[(a, 1)])).unwrap();
    assert_eq!(drain(&mut g), vec![a.at(1), a.at(2), b.at(0)]);
}

/// The coordinate-claim walk (a merge over two sorted lists, skipping runs of entries the task
/// does not consume, and finding consumed channels by a scan or a binary search) against the
/// rule read entry by entry.
mod walk {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// What the rule says of a stamp on the record at `own`@`offset`: the verdict, and the
    /// entries counted on the ignore branch and out of scope before it was reached.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Expected {
        Ready,
        Blocked(Awaiting),
        Impossible(Coordinate),
    }

    /// `consumed`: channel → `None` (not seeded) or `(baseline, frontier)`.
    fn rule(
        consumed: &BTreeMap<Channel, Option<(i64, i64)>>,
        own: Channel,
        offset: i64,
        clock: &Clock,
    ) -> (Expected, u64, u64) {
        let (mut ignored, mut out_of_scope) = (0, 0);
        for c in clock.iter() {
            match consumed.get(&c.channel) {
                None => ignored += 1,
                Some(None) => {
                    return (
                        Expected::Blocked(Awaiting::Seeding(c.channel)),
                        ignored,
                        out_of_scope,
                    );
                }
                Some(Some(_)) if c.channel == own && c.offset >= offset => {
                    return (Expected::Impossible(c), ignored, out_of_scope);
                }
                Some(Some((baseline, _))) if c.offset < *baseline => out_of_scope += 1,
                Some(Some((_, frontier))) if *frontier >= c.offset => {}
                Some(Some(_)) => {
                    return (
                        Expected::Blocked(Awaiting::Frontier(c)),
                        ignored,
                        out_of_scope,
                    );
                }
            }
        }
        (Expected::Ready, ignored, out_of_scope)
    }

    /// A task's channels (1 to 12, so that both ways of finding a channel are taken), each
    /// seeded or not with a baseline and a position, the record's channel among them, and a
    /// clock over a superset of them.
    #[allow(clippy::type_complexity)]
    fn case() -> impl Strategy<
        Value = (
            Vec<(Channel, Option<(i64, i64)>)>,
            usize,
            i64,
            Vec<(Channel, i64)>,
        ),
    > {
        let channel = (0u8..5, 0i32..4).prop_map(|(t, p)| ch(t, p));
        let consumed = proptest::collection::btree_map(
            channel.clone(),
            proptest::option::weighted(0.85, (0i64..10, 0i64..10)),
            1..13,
        );
        let claims = proptest::collection::vec((channel, 0i64..30), 0..24);
        (consumed, any::<prop::sample::Index>(), 0i64..5, claims).prop_map(
            |(consumed, own, extra, claims)| {
                let mut consumed: Vec<_> = consumed.into_iter().collect();
                let own = own.index(consumed.len());
                // The record's own channel is seeded.
                consumed[own].1.get_or_insert((0, 0));
                (consumed, own, extra, claims)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_walk_follows_the_rule_entry_by_entry((consumed, own, extra, claims) in case()) {
            let mut g: Gate<i64> = Gate::new(consumed.iter().map(|(c, _)| *c));
            let mut state = BTreeMap::new();
            for &(c, seeding) in &consumed {
                let Some((baseline, ahead)) = seeding else {
                    state.insert(c, None);
                    continue;
                };
                g.seed(c, baseline).unwrap();
                // Nothing fetched: the position moves the frontier to just below it.
                g.position(c, baseline + ahead).unwrap();
                state.insert(c, Some((baseline, baseline + ahead - 1)));
            }
            let own_channel = consumed[own].0;
            let (baseline, frontier) = state[&own_channel].unwrap();
            let offset = frontier + 1 + extra;
            // The head bridges its channel's frontier up to just below it.
            state.insert(own_channel, Some((baseline, offset - 1)));
            let clock: Clock = claims.iter().map(|&(c, o)| c.at(o)).collect();
            let (expected, ignored, out_of_scope) = rule(&state, own_channel, offset, &clock);

            let arrival = Arrival {
                offset,
                timestamp: 0,
                epoch: 1,
                stamp: Some(Stamp::new(None, clock)),
                payload: offset,
            };
            g.offer(own_channel, arrival).unwrap();
            let record = own_channel.at(offset);
            let found = match g.take_impossible().as_slice() {
                [] => match g.blocked_heads().as_slice() {
                    [] => Expected::Ready,
                    [b] => {
                        prop_assert_eq!(b.head, record);
                        Expected::Blocked(b.awaits)
                    }
                    more => panic!("one record, several blocked: {more:?}"),
                },
                [i] => Expected::Impossible(i.claim),
                more => panic!("one record, several impossible: {more:?}"),
            };
            prop_assert_eq!(found, expected);
            let m = g.metrics();
            prop_assert_eq!((m.ignored_entries, m.out_of_scope_entries), (ignored, out_of_scope));
            if matches!(found, Expected::Ready) {
                prop_assert_eq!(g.next_delivery().map(|d| d.coordinate), Some(record));
            }
        }
    }
}
