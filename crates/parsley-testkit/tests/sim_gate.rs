//! The gate and the clock against the oracle, in the simulator (the book's specification, §8).
//!
//! - every fixed history passes under the correct rules, and each negative control fails its
//!   own fixed history every time;
//! - random histories (stage DAGs, transactional and idempotent producers, appends landing in
//!   random order across partitions, acks arriving later, 30 % of stage transactions aborting
//!   and restoring, tasks seeded mid-log) keep the invariant and liveness: 10,000 histories by
//!   default, `PARSLEY_SIM_HISTORIES` to change it, `cargo xtask soak-gate` for more;
//! - every negative control fails in some share of random histories; the rate is printed.

use parsley_testkit::scenarios;
use parsley_testkit::sim::{self, SimConfig, Variant, tally};
use proptest::prelude::*;

fn histories() -> u64 {
    std::env::var("PARSLEY_SIM_HISTORIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

#[test]
fn fixed_histories_pass_under_the_correct_rules() {
    for (name, history) in scenarios::all() {
        let o = history(Variant::Correct);
        assert!(!o.failed(), "{name}: {o:?}");
        assert!(o.deliveries > 0, "{name} delivered nothing");
    }
}

#[test]
fn each_negative_control_fails_its_fixed_history_every_time() {
    for variant in Variant::NEGATIVE {
        let history = scenarios::for_variant(variant);
        for _ in 0..3 {
            let o = history(variant);
            assert!(o.failed(), "{variant:?} passed its fixed history: {o:?}");
        }
    }
}

#[test]
fn the_crossed_in_flight_sends_deadlock_strict_fifo_and_not_look_ahead() {
    let strict = scenarios::crossed_in_flight_sends(Variant::StrictFifo);
    assert!(
        strict.stall.is_some() && strict.violation.is_none(),
        "{strict:?}"
    );
    let lookahead = scenarios::crossed_in_flight_sends(Variant::Correct);
    assert!(!lookahead.failed());
    assert_eq!(lookahead.deliveries, 4);
    assert!(
        lookahead.lookahead >= 1,
        "resolved by look-ahead: {lookahead:?}"
    );
}

#[test]
fn random_histories_keep_the_invariant_and_liveness() {
    let n = histories();
    let t = tally(0, n, &SimConfig::default());
    println!(
        "{} histories: {} deliveries ({:.2} % ahead of partition order), {} stage aborts restored, {} records spilled and {} re-fetched, {} violations, {} stalls",
        t.histories,
        t.deliveries,
        100.0 * t.lookahead as f64 / t.deliveries.max(1) as f64,
        t.task_aborts,
        t.spilled,
        t.refetched,
        t.violations,
        t.stalls
    );
    if let Some((seed, why)) = &t.first_failure {
        panic!("seed {seed} failed (replay: sim::run({seed}, &SimConfig::default())):\n{why}");
    }
    assert_eq!(t.histories, n);
    assert!(t.lookahead > 0, "the histories exercise look-ahead");
    assert!(t.task_aborts > 0, "the histories exercise aborts");
    assert!(
        t.spilled > 0 && t.refetched > 0,
        "the histories exercise spilling"
    );
}

#[test]
fn random_histories_with_tasks_that_read_what_they_write_keep_the_invariant_and_liveness() {
    // Half the tasks also consume one of their own output channels: they deliver their own
    // records (their own sender, in-flight claims on a channel they consume) once committed,
    // and the records of the other tasks writing there.
    let config = SimConfig {
        self_loops: 0.5,
        ..SimConfig::default()
    };
    let n = histories() / 2;
    let t = tally(1_000_000, n, &config);
    println!(
        "{} histories with self-loops: {} deliveries ({} of the task's own records), {} stage aborts restored, {} violations, {} stalls",
        t.histories, t.deliveries, t.own, t.task_aborts, t.violations, t.stalls
    );
    if let Some((seed, why)) = &t.first_failure {
        panic!(
            "seed {seed} failed (replay: sim::run({seed}, &config) with self_loops 0.5):\n{why}"
        );
    }
    assert_eq!(t.histories, n);
    assert!(t.own > 0, "the histories deliver tasks' own records");
}

#[test]
fn negative_controls_fail_in_random_histories() {
    for variant in Variant::NEGATIVE {
        let config = SimConfig {
            variant,
            ..SimConfig::default()
        };
        let t = tally(0, 300, &config);
        let failed = t.violations + t.stalls;
        println!(
            "{variant:?}: {failed} of {} random histories failed ({:.1} %: {} violations, {} stalls)",
            t.histories,
            100.0 * failed as f64 / t.histories as f64,
            t.violations,
            t.stalls
        );
        assert!(
            failed > 0,
            "{variant:?} never failed in 300 random histories"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Other shapes than the default: more or fewer channels, producers and tasks, longer
    /// runs, other abort rates.
    #[test]
    fn histories_of_other_shapes_keep_the_invariant_and_liveness(
        seed in any::<u64>(),
        channels in 3usize..10,
        transactional in 0usize..4,
        idempotent in 0usize..3,
        tasks in 1usize..6,
        steps in 50usize..800,
        task_abort in 0.0f64..0.6,
        queue_cap in 1usize..12,
        self_loops in prop_oneof![Just(0.0f64), 0.0f64..1.0],
    ) {
        prop_assume!(transactional + idempotent > 0);
        let config = SimConfig {
            channels,
            transactional_producers: transactional,
            idempotent_producers: idempotent,
            tasks,
            steps,
            task_abort_ratio: task_abort,
            producer_abort_ratio: 0.1,
            queue_cap,
            self_loops,
            variant: Variant::Correct,
        };
        let o = sim::run(seed, &config);
        prop_assert!(!o.failed(), "seed {seed}, {config:?}: {o:?}");
    }
}

#[test]
fn a_full_channel_a_claim_needs_spills_then_refetches_what_it_dropped() {
    // c1 = [w, f1, f2, r] with a cap of 3: the head `w` waits for c0's `r2`, which waits for
    // `r` in flight. c1 spills `f1` and `f2` (the head is tracked and stays), reads `r`, and
    // re-fetches the two stubs once the head needs them.
    let o = scenarios::full_channel_a_claim_needs(Variant::Correct);
    assert!(!o.failed(), "{o:?}");
    assert_eq!(o.deliveries, 5, "r, r2, w, f1, f2: {o:?}");
    assert_eq!((o.spilled, o.refetched), (2, 2), "{o:?}");
}
