//! The ordering experiment's real-broker test: on generated history with a startup race
//! (consumers that start at different speeds, one slow topic, partitions of different lengths, a
//! partition silent at startup), offset completeness releases every key in event-time order, every
//! record exactly once, while a one-layer timeout on the same input is measured.
//!
//! Both runs wait on evidence: a run ends when the strategy has reported every record written
//! (history and live) as released; the offset-completeness run then stops its stage (a final
//! commit) and its committed output is read back up to the end offsets.

use std::collections::HashMap;
use std::time::Duration;

use indicatif::ProgressBar;
use parsley_ordering::offsets;
use parsley_ordering::run::{self, Strategy, StrategySettings};
use parsley_ordering::workload::{
    DAY_MS, EventValue, Phase, Silent, WorkloadConfig, parse_product,
};
use parsley_testkit::fixtures::{admin, bootstrap, read_committed, unique_topic};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

#[test]
fn offset_completeness_releases_generated_history_in_event_time_order_despite_a_startup_race() {
    // The hold measurement reads the runtime's delivery journal.
    tracing_subscriber::registry()
        .with(offsets::delivery_capture())
        .try_init()
        .expect("the only subscriber of this test binary");
    let config = WorkloadConfig {
        prefix: unique_topic("ord-race"),
        event_topics: 4,
        partitions: 3,
        products: 200,
        history_records: 20_000,
        history_span_ms: 2 * DAY_MS,
        live_rate: 200,
        live_ms: 3_000,
        control_interval_ms: 20,
        silent: Some(Silent {
            topic: 0,
            partition: 0,
            live_delay_ms: 1_500,
        }),
        skew: 0.6,
        seed: 7,
    };
    let settings = StrategySettings {
        idle: Duration::from_millis(500),
        start_spread: Duration::from_millis(200),
        slow_start: Duration::from_millis(2_000),
        output: true,
        plain_reference: false,
        ..StrategySettings::default()
    };
    let grace = Duration::from_secs(5);
    let bar = ProgressBar::hidden();
    let bootstrap = bootstrap();

    let timeout = run::run(
        &bootstrap,
        &config,
        Strategy::OneLayer,
        &settings,
        grace,
        &bar,
    )
    .expect("the one-layer timeout run");
    let t = &timeout.summary;
    println!(
        "one-layer timeout (idle {:?}, start delays {:?}): {} of {} events released, {} out of order ({:.2} %), {} held at stop",
        settings.idle,
        timeout.start_delays,
        t.records,
        timeout.history_records + timeout.live_records,
        t.out_of_order,
        t.out_of_order_pct(),
        t.unreleased_history + t.unreleased_live
    );
    assert_eq!(
        t.records + t.unreleased_history + t.unreleased_live,
        timeout.history_records + timeout.live_records,
        "every event is either released or counted as held"
    );

    let ordered = run::run(
        &bootstrap,
        &config,
        Strategy::Offsets,
        &settings,
        grace,
        &bar,
    )
    .expect("the offset-completeness run");
    let s = &ordered.summary;
    let late = ordered.late.expect("the stage's late count");
    println!(
        "offset completeness: {} released, {} out of order, {late} counted late, history drained in {:?}",
        s.records, s.out_of_order, s.history_drain
    );
    // History is never out of order. A live record can be late — appended after the control
    // clock passed its event time plus the lag, e.g. a starved generator on a loaded machine —
    // and is then released at once and counted, never hidden: every out-of-order release is
    // such a record (a late record's own time is below the watermark, so nothing of its key
    // with a lower time is still parked to overtake).
    assert_eq!(s.out_of_order_history, 0, "{s:?}");
    assert!(
        s.out_of_order <= late,
        "{} out of order but {late} counted late: {s:?}",
        s.out_of_order
    );
    assert_eq!(s.unreleased_history, 0, "{s:?}");
    assert_eq!(s.unreleased_live, 0, "{s:?}");
    assert_eq!(ordered.history_records, 20_000);
    assert!(ordered.live_records > 0);

    // The committed output is the release log: per product, every sequence number exactly
    // once, history in order, and as many live records behind a higher sequence of their
    // product as the run measured out of order.
    let output = ordered.output.clone().expect("an output topic");
    let info = admin()
        .describe_topics(&[&output])
        .expect("describe the output")
        .remove(0);
    let mut seen: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut inversions = 0u64;
    for r in read_committed(&info) {
        let product = parse_product(&r.key.expect("a key")).expect("a product key");
        let value = EventValue::decode(&r.value.expect("a value")).expect("an event value");
        let released = seen.entry(product).or_default();
        // Below the highest sequence released before it, as the run's measurement counts.
        let highest = released.iter().copied().max();
        if highest.is_some_and(|h| h > value.seq) {
            assert_eq!(
                value.phase,
                Phase::Live,
                "product {product}: history sequence {} released after {highest:?}",
                value.seq
            );
            inversions += 1;
        }
        released.push(value.seq);
    }
    assert_eq!(
        inversions, s.out_of_order,
        "the committed log shows what was measured"
    );
    let mut released = 0u64;
    for (product, mut seqs) in seen {
        seqs.sort_unstable();
        let n = seqs.len() as u64;
        assert!(
            seqs.iter().copied().eq(0..n),
            "product {product}: every sequence exactly once"
        );
        released += n;
    }
    assert_eq!(
        released,
        ordered.history_records + ordered.live_records,
        "every event released exactly once"
    );
    admin()
        .delete_topics(&[&output])
        .expect("delete the output");
}
