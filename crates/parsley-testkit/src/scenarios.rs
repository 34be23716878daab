//! Fixed, deterministic histories — one per negative control — that fail every time under
//! their wrong rule and pass under the correct rules (the book's specification, §4: "some wrong
//! variants fail rarely at random, so the project's simulator also needs one fixed, deterministic
//! history per variant that fails every time").
//!
//! Each function builds its history step by step on a [`Sim`] running `variant`, drains it,
//! and returns the [`Outcome`]. [`for_variant`] names the history that breaks a variant.

use crate::sim::{Outcome, Sim, Variant, Who};

/// A fixed history, run under a variant.
pub type History = fn(Variant) -> Outcome;

/// The fixed history that breaks `variant` (for [`Variant::Correct`]: the crossed sends).
pub fn for_variant(variant: Variant) -> History {
    match variant {
        Variant::GateOff => effect_fetched_first,
        Variant::StrictFifo | Variant::Correct => crossed_in_flight_sends,
        Variant::ClockClaimsFrontier => output_after_a_lookahead,
        Variant::SettleByLso => committed_above_an_open_transaction,
        Variant::BridgeOverLookahead => lookahead_over_a_blocked_head,
        Variant::WakeupsOnlyOnFrontier => claim_settled_by_evidence_alone,
        Variant::InFlightWithoutTransactions => in_flight_claim_without_transaction,
        Variant::StrictPause => full_channel_a_claim_needs,
    }
}

/// Every fixed history, by name.
pub fn all() -> Vec<(&'static str, History)> {
    vec![
        ("effect fetched first", effect_fetched_first),
        ("crossed in-flight sends", crossed_in_flight_sends),
        ("output after a look-ahead", output_after_a_lookahead),
        (
            "committed above an open transaction",
            committed_above_an_open_transaction,
        ),
        (
            "look-ahead over a blocked head",
            lookahead_over_a_blocked_head,
        ),
        (
            "claim settled by evidence alone",
            claim_settled_by_evidence_alone,
        ),
        (
            "in-flight claim without a transaction",
            in_flight_claim_without_transaction,
        ),
        ("full channel a claim needs", full_channel_a_claim_needs),
    ]
}

/// A producer sends `a` to c0, then (after its ack) `b` to c1, which claims `a`. The task
/// fetches c1 first. Breaks [`Variant::GateOff`].
pub fn effect_fetched_first(variant: Variant) -> Outcome {
    let mut sim = Sim::empty(1, 2, variant);
    let p = sim.add_producer(true, vec![0, 1]);
    let t = sim.add_task(vec![0, 1], vec![], 0);
    sim.send(Who::Producer(p), 0);
    sim.flush(Who::Producer(p));
    sim.send(Who::Producer(p), 1);
    sim.end_producer_txn(p, true);
    sim.start_task(t, Some(&[0, 0]));
    sim.fetch(t, 1, usize::MAX);
    while sim.deliver(t, &[]).is_some() {}
    sim.fetch(t, 0, usize::MAX);
    sim.drain()
}

/// The crossed in-flight sends of the book's specification, §4: X sends `r` to c1 then `r2` to
/// c0 (claiming `r` in flight); Y sends `z` to c0 then `h` to c1 (claiming `z`); the appends land
/// crossed, c0 = [r2, z] and c1 = [h, r]. Strict FIFO waits in a cycle. Breaks
/// [`Variant::StrictFifo`].
pub fn crossed_in_flight_sends(variant: Variant) -> Outcome {
    let mut sim = crossed(variant, 3);
    let t = sim.add_task(vec![0, 1], vec![], 0);
    sim.start_task(t, Some(&[0, 0]));
    sim.drain()
}

/// The crossed appends of [`crossed_in_flight_sends`], committed, on `channels` channels.
fn crossed(variant: Variant, channels: usize) -> Sim {
    let mut sim = Sim::empty(2, channels, variant);
    let x = sim.add_producer(true, vec![0, 1]);
    let y = sim.add_producer(true, vec![0, 1]);
    sim.send(Who::Producer(x), 1); // r
    sim.send(Who::Producer(x), 0); // r2, claims r in flight
    sim.send(Who::Producer(y), 0); // z
    sim.send(Who::Producer(y), 1); // h, claims z in flight
    sim.append(Who::Producer(x), 0); // c0: r2
    sim.append(Who::Producer(y), 0); // c0: r2, z
    sim.append(Who::Producer(y), 1); // c1: h
    sim.append(Who::Producer(x), 1); // c1: h, r
    sim.end_producer_txn(x, true);
    sim.end_producer_txn(y, true);
    sim
}

/// Task T's first delivery in the crossed history is a look-ahead (`z` ahead of `r2`, or `r`
/// ahead of `h`) and it at once emits `o` to c2; task U reads c2 first. A clock that claims
/// only T's frontier does not claim the look-ahead record, so U delivers `o` before that
/// ancestor. Breaks [`Variant::ClockClaimsFrontier`].
pub fn output_after_a_lookahead(variant: Variant) -> Outcome {
    let mut sim = crossed(variant, 3);
    let t = sim.add_task(vec![0, 1], vec![2], 0);
    let u = sim.add_task(vec![0, 1, 2], vec![], 0);
    sim.start_task(t, Some(&[0, 0]));
    sim.fetch(t, 0, usize::MAX);
    sim.fetch(t, 1, usize::MAX);
    sim.deliver(t, &[2]); // a look-ahead delivery; emits o
    while sim.deliver(t, &[]).is_some() {}
    sim.end_task_txn(t, true);
    sim.start_task(u, Some(&[0, 0, 0]));
    sim.fetch(u, 2, usize::MAX);
    while sim.deliver(u, &[]).is_some() {}
    sim.drain()
}

/// X holds a transaction open with `z` on c1; Y then commits `r` on c1 and `m` on c0, `m`
/// claiming `r` in flight. The LSO of c1 stays at `z`, below `r`: settling by the LSO delivers
/// `m` before `r`. Breaks [`Variant::SettleByLso`].
pub fn committed_above_an_open_transaction(variant: Variant) -> Outcome {
    let mut sim = Sim::empty(3, 2, variant);
    let x = sim.add_producer(true, vec![1]);
    let y = sim.add_producer(true, vec![0, 1]);
    let t = sim.add_task(vec![0, 1], vec![], 0);
    sim.send(Who::Producer(x), 1); // z, open
    sim.append(Who::Producer(x), 1);
    sim.send(Who::Producer(y), 1); // r
    sim.send(Who::Producer(y), 0); // m, claims r in flight
    sim.end_producer_txn(y, true);
    sim.start_task(t, Some(&[0, 0]));
    sim.fetch(t, 0, usize::MAX);
    sim.fetch(t, 1, usize::MAX);
    while sim.deliver(t, &[]).is_some() {}
    sim.end_producer_txn(x, true);
    sim.drain()
}

/// On c1, `u` (blocked: it claims `v` on c2, not fetched yet) precedes `x`; `m` on c0 pulls `x`
/// ahead; then `w` on c0 claims `u` by coordinate. Moving the frontier of c1 over the
/// look-ahead delivery of `x` treats `u` as done. Breaks [`Variant::BridgeOverLookahead`].
pub fn lookahead_over_a_blocked_head(variant: Variant) -> Outcome {
    let mut sim = Sim::empty(4, 3, variant);
    let y = sim.add_producer(false, vec![0, 1, 2]);
    let x = sim.add_producer(true, vec![0, 1]);
    let t = sim.add_task(vec![0, 1, 2], vec![], 0);
    sim.send(Who::Producer(y), 2); // v
    sim.flush(Who::Producer(y));
    sim.send(Who::Producer(y), 1); // u, claims v
    sim.flush(Who::Producer(y));
    sim.send(Who::Producer(x), 1); // x
    sim.send(Who::Producer(x), 0); // m, claims x in flight
    sim.end_producer_txn(x, true);
    sim.send(Who::Producer(y), 0); // w, claims u
    sim.flush(Who::Producer(y));
    sim.start_task(t, Some(&[0, 0, 0]));
    sim.fetch(t, 0, usize::MAX);
    sim.fetch(t, 1, usize::MAX);
    while sim.deliver(t, &[]).is_some() {}
    sim.drain()
}

/// X commits `x` on c1 and `m` on c0 (claiming `x` in flight); the task's baseline on c1 is
/// above `x`. The claim settles only on evidence — the high watermark of c1 and the position —
/// which moves no frontier. Breaks [`Variant::WakeupsOnlyOnFrontier`].
pub fn claim_settled_by_evidence_alone(variant: Variant) -> Outcome {
    let mut sim = Sim::empty(5, 2, variant);
    let x = sim.add_producer(true, vec![0, 1]);
    let t = sim.add_task(vec![0, 1], vec![], 0);
    sim.send(Who::Producer(x), 1); // x
    sim.send(Who::Producer(x), 0); // m
    sim.end_producer_txn(x, true);
    // c1 holds x and a commit marker: the baseline at its end, 2.
    sim.start_task(t, Some(&[0, 2]));
    sim.fetch(t, 0, usize::MAX);
    while sim.deliver(t, &[]).is_some() {}
    sim.drain()
}

/// An idempotent producer that claims in flight: `m` on c0 claims `r` on c1 while `r` is not
/// appended yet; `m` is visible at once. Breaks [`Variant::InFlightWithoutTransactions`].
pub fn in_flight_claim_without_transaction(variant: Variant) -> Outcome {
    let mut sim = Sim::empty(6, 2, variant);
    let p = sim.add_producer(false, vec![0, 1]);
    let t = sim.add_task(vec![0, 1], vec![], 0);
    sim.send(Who::Producer(p), 1); // r
    sim.send(Who::Producer(p), 0); // m
    sim.append(Who::Producer(p), 0);
    sim.start_task(t, Some(&[0, 0]));
    sim.fetch(t, 0, usize::MAX);
    sim.fetch(t, 1, usize::MAX);
    while sim.deliver(t, &[]).is_some() {}
    sim.drain()
}

/// With a cap of 3 records per channel: c1 = [w, f1, f2, r] where W's `w`, `f1`, `f2` claim
/// `r2` (c0@0), and `r2` claims X's `r` in flight. Three records fill c1 before `r` is read; a
/// strict pause of c1 never reads `r`, so nothing moves. Breaks [`Variant::StrictPause`].
pub fn full_channel_a_claim_needs(variant: Variant) -> Outcome {
    let mut sim = Sim::empty(7, 2, variant);
    sim.set_queue_cap(3);
    let x = sim.add_producer(true, vec![0, 1]);
    let w = sim.add_producer(false, vec![1]);
    let t = sim.add_task(vec![0, 1], vec![], 0);
    sim.send(Who::Producer(x), 1); // r
    sim.send(Who::Producer(x), 0); // r2, claims r in flight
    sim.append(Who::Producer(x), 0); // c0: r2
    sim.observe(Who::Producer(w), 0, 0); // W read r2
    for _ in 0..3 {
        sim.send(Who::Producer(w), 1); // w, f1, f2
    }
    sim.flush(Who::Producer(w));
    sim.end_producer_txn(x, true); // r appended at c1@3, markers
    sim.start_task(t, Some(&[0, 0]));
    sim.fetch(t, 1, usize::MAX);
    sim.fetch(t, 0, usize::MAX);
    while sim.deliver(t, &[]).is_some() {}
    sim.drain()
}
