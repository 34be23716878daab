//! The windows row on the real broker, small: a DSL windowed count closed by evidence and
//! Kafka Streams' stream time (grace 0 and 1 s) over generated history, live traffic and a
//! replay, each compared with the batch ground truth.
//!
//! Closed by evidence, the replay matches the ground truth exactly and the startup-and-live
//! phase differs at most where the stage counted a record too late (a live record that
//! reached Kafka after the clock had passed its window; each changes one window). Under
//! stream time every difference is accounted for: a dropped record or a window stream time
//! never passed. Nothing is counted twice, nothing invented. Each phase ends on evidence
//! (every record processed and committed, every closable window's result read).

use std::time::Duration;

use indicatif::ProgressBar;
use parsley_ordering::windows::run::{self, PhaseFigures, WindowMethod, WindowSettings};
use parsley_ordering::workload::{DAY_MS, Silent, WorkloadConfig};
use parsley_testkit::fixtures::{bootstrap, unique_topic};

fn check(name: &str, phase: &PhaseFigures, exact: bool) {
    let f = &phase.figures;
    println!(
        "{name}: {} windows, {} wrong, {} missing, {} left out as late, {} open",
        f.windows,
        f.wrong,
        f.missing,
        phase.dropped,
        phase.open.unwrap_or(0)
    );
    assert_eq!((f.extra, f.duplicates), (0, 0), "{name}: {f:?}");
    if exact {
        assert_eq!(f.differing(), 0, "{name}: {f:?}");
        assert_eq!(phase.dropped, 0, "{name}");
    } else {
        assert!(
            f.differing() <= phase.dropped + phase.open.unwrap_or(0),
            "{name}: every difference is a counted record or an open window: {f:?}, {phase:?}"
        );
    }
}

#[test]
fn windows_closed_by_evidence_match_the_ground_truth_and_stream_time_accounts_for_its_differences()
{
    let config = WorkloadConfig {
        prefix: unique_topic("ord-win"),
        event_topics: 4,
        partitions: 3,
        products: 200,
        history_records: 5_000,
        history_span_ms: DAY_MS,
        live_rate: 200,
        live_ms: 2_000,
        control_interval_ms: 0,
        silent: Some(Silent {
            topic: 0,
            partition: 0,
            live_delay_ms: 1_000,
        }),
        skew: 0.6,
        seed: 11,
    };
    let settings = WindowSettings {
        size_ms: 1_000,
        graces_ms: vec![0, 1_000],
        task_idle_ms: 0,
        lag_ms: 20,
        tick_interval_ms: 20,
        commit_interval: Duration::from_millis(100),
        replay: true,
    };
    // Only a stalled job ends a phase on this.
    let stall = Duration::from_secs(30);
    let bar = ProgressBar::hidden();
    let bootstrap = bootstrap();

    let evidence = run::run(
        &bootstrap,
        &config,
        WindowMethod::Evidence,
        &settings,
        stall,
        &bar,
    )
    .expect("the evidence run");
    assert_eq!(evidence.len(), 1);
    let e = &evidence[0];
    assert!(e.events > 5_000, "history and live events: {}", e.events);
    assert!(e.live.figures.windows > 4_000);
    let late = e.live.dropped;
    let f = &e.live.figures;
    println!(
        "evidence, startup and live: {} windows, {} differ, {late} counted too late",
        f.windows,
        f.differing()
    );
    assert_eq!((f.extra, f.duplicates), (0, 0), "{f:?}");
    assert!(f.differing() <= late, "{f:?}, {late} too late");
    check(
        "evidence, replay",
        e.replay.as_ref().expect("a replay"),
        true,
    );

    let stream_time = run::run(
        &bootstrap,
        &config,
        WindowMethod::StreamTime,
        &settings,
        stall,
        &bar,
    )
    .expect("the stream-time run");
    assert_eq!(stream_time.len(), 2, "one row per grace");
    for r in &stream_time {
        check(&format!("{}, startup and live", r.name), &r.live, false);
        check(
            &format!("{}, replay", r.name),
            r.replay.as_ref().expect("a replay"),
            false,
        );
    }
}
