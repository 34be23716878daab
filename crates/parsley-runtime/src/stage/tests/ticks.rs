//! The built-in clock in a task, without a broker: when a tick is due, what it is, that its
//! report touches no clock claim, and that a tick read back moves the watermark and never
//! reaches the handler.

use parsley_stage::EventTimeOrder;
use parsley_stage::changelog::Restored;

use super::*;
use parsley_task::task::{StartEvidence, rebuild_task, tick_due};

/// A stage counting the keys of `in` (topic 1) and `side` (topic 2) into `out` (topic 3) in
/// event-time order, with the built-in clock (lag 500 ms, a tick every 100 ms) on
/// `app-count-clock` (topic 5).
fn clocked() -> TaskContext {
    let topology = Topology::builder("app")
        .stage("count", CountKeys::new("out"), |s| {
            s.source("in")
                .source("side")
                .sink("out")
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
                .order_by_event_time(EventTimeOrder::new().clock(500))
        })
        .build()
        .unwrap();
    TaskContext::new(
        topology.stage("count").unwrap(),
        vec![
            topic(1, "in"),
            topic(2, "side"),
            topic(5, "app-count-clock"),
        ],
        vec![topic(3, "out")],
        (None, None),
        GateMode::Causal,
        10_000,
        Arc::new(StageMetrics::default()),
    )
}

/// Every source partition is empty at task start.
struct Empty;

impl StartEvidence for Empty {
    fn log_start(&mut self, _: &TaskContext, _: Channel) -> Result<i64> {
        Ok(0)
    }

    fn ends(&mut self, _: &TaskContext, channels: &[Channel]) -> Result<Vec<(i64, i64)>> {
        Ok(vec![(0, 0); channels.len()])
    }
}

/// The task of partition 0, built as a restore of an empty changelog builds it.
fn clocked_task(ctx: &TaskContext) -> Task {
    let positions = ctx.consumed(0).into_iter().map(|c| (c, 0)).collect();
    let order = EventTimeOrder::new().clock(500);
    let (task, moved) = rebuild_task(
        ctx,
        Some(&order),
        0,
        positions,
        Restored::default(),
        None,
        &mut Empty,
    )
    .unwrap();
    assert!(moved.is_empty());
    task
}

#[test]
fn a_tick_is_due_after_the_interval_at_once_after_a_start_and_when_the_clock_steps_back() {
    assert!(tick_due(None, 0, 100), "a task built writes one at once");
    assert!(!tick_due(Some(1_000), 1_000, 100));
    assert!(!tick_due(Some(1_000), 1_099, 100));
    assert!(tick_due(Some(1_000), 1_100, 100));
    assert!(
        tick_due(Some(1_000), 999, 100),
        "the wall clock stepped back"
    );
}

#[test]
fn a_task_writes_an_unstamped_tick_per_interval_and_its_report_claims_nothing() {
    let ctx = clocked();
    let mut task = clocked_task(&ctx);
    let mut out = Sends::default();
    assert_eq!(task.tick_due_in(&ctx, 1_000), Some(0));
    let work = task.tick(&ctx, &mut out, 1_000).unwrap();
    assert_eq!((work.ticks, work.deliveries, work.emissions), (1, 0, 0));
    let tick = out.0[0].clone();
    assert_eq!(
        (
            tick.topic.as_str(),
            tick.tag.channel,
            tick.key.as_deref(),
            tick.value.as_str(),
            tick.timestamp
        ),
        ("app-count-clock", ch(5), Some("0"), "", Some(1_000))
    );
    assert!(
        tick.stamp.is_empty() && tick.headers.is_empty(),
        "no stamp: {tick:?}"
    );
    assert_eq!(task.clock().next_seq(), 0, "the node clock made no send");

    // Not again before the interval has passed.
    assert_eq!(task.tick_due_in(&ctx, 1_040), Some(60));
    assert!(task.tick(&ctx, &mut out, 1_099).unwrap().is_empty());
    assert_eq!(out.0.len(), 1);
    task.tick(&ctx, &mut out, 1_100).unwrap();
    assert_eq!(out.0[1].timestamp, Some(1_100));

    // Its report and its failure touch no claim and name no input record.
    task.acked(tick.tag, 0).unwrap();
    task.send_failed(out.0[1].tag).unwrap();
    assert_eq!(task.cause_of_send(tick.tag), None);
    assert_eq!(ctx.metrics.snapshot().ticks, 2);
}

/// The tick at `offset` of the clock's partition 0, written at `timestamp_ms`.
fn tick_at(offset: i64, timestamp_ms: i64) -> Fetched {
    let mut tick = raw_fetched(2, offset, Some(b"0"), b"", &[], None);
    tick.channel = ch(5);
    tick.arrival.payload.record_timestamp = Some(timestamp_ms);
    tick
}

#[test]
fn a_tick_read_back_moves_the_watermark_and_never_reaches_the_handler() {
    let ctx = clocked();
    let mut task = clocked_task(&ctx);
    let mut out = Sends::default();
    // in@0, event time 1,000: parked, the clock has not ticked.
    task.offer(&ctx, fetched(0, 0, "a", "x", None)).unwrap();
    let work = task.deliver(&ctx, &mut out).unwrap();
    assert_eq!((work.parked, work.deliveries), (1, 0));
    assert_eq!(task.event_time().unwrap().watermark(), None);

    // A tick at 1,499: the watermark is 999, the record stays.
    task.offer(&ctx, tick_at(0, 1_499)).unwrap();
    let work = task.deliver(&ctx, &mut out).unwrap();
    assert_eq!((work.ticks, work.deliveries), (1, 0));
    assert_eq!(task.event_time().unwrap().watermark(), Some(999));
    assert!(out.0.is_empty());

    // A tick at 1,500 releases it; neither tick was handed over or claimed.
    task.offer(&ctx, tick_at(1, 1_500)).unwrap();
    let work = task.deliver(&ctx, &mut out).unwrap();
    assert_eq!((work.ticks, work.deliveries, work.emissions), (1, 1, 1));
    assert_eq!(out.0[0].value, "a=1");
    assert_eq!(
        task.clock().clock().get(&ch(5)),
        None,
        "ticks are not observed"
    );
    let m = ctx.metrics.snapshot();
    assert_eq!((m.ticks_read, m.delivered, m.late), (2, 1, 0));
    // Their offsets commit like any other.
    assert!(task.input_offsets().contains(&(ch(5), 2)));
}

#[test]
fn an_open_tick_that_would_release_a_parked_record_asks_for_a_commit_until_one_starts() {
    let ctx = clocked();
    let mut task = clocked_task(&ctx);
    let mut out = Sends::default();
    // Nothing parked: a tick asks for nothing.
    task.tick(&ctx, &mut out, 1_400).unwrap();
    assert_eq!(task.open_tick_releases(), None);

    // in@0, event time 1,000, parked. The open tick at 1,400 would move the watermark to 900.
    task.offer(&ctx, fetched(0, 0, "a", "x", None)).unwrap();
    assert_eq!(task.deliver(&ctx, &mut out).unwrap().parked, 1);
    assert_eq!(task.open_tick_releases(), None);

    // A tick at 1,500 would release it (1,500 - 500 lag = 1,000): commit it now.
    task.tick(&ctx, &mut out, 1_500).unwrap();
    assert_eq!(task.open_tick_releases(), Some(1_500));
    // A commit started: that tick is no longer the open transaction's.
    task.tick_committing();
    assert_eq!(task.open_tick_releases(), None);
    // The next interval's tick asks again while the record is still parked.
    task.tick(&ctx, &mut out, 1_600).unwrap();
    assert_eq!(task.open_tick_releases(), Some(1_600));
}
