//! Record headers through the DSL: a record's headers pass through stateless operators and
//! repartitions unchanged, a `process` handler reads them (never Parsley's own) and sets the
//! headers of what it emits, and Parsley's own headers cannot be forged. The test case is W3C
//! trace context (`traceparent`), carried end to end.

use std::sync::{Arc, Mutex};

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_stage::{Emission, Handler, HandlerResult, Record, Step};

use crate::StreamsBuilder;

const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn pipe_traced(d: &TopologyTestDriver, topic: &str, key: &str, value: &str) {
    d.pipe_raw(
        topic,
        RawInput::new(Some(key.as_bytes()), Some(value.as_bytes()))
            .header("traceparent", TRACE.as_bytes())
            .header("tenant", b"acme"),
    )
    .unwrap();
}

/// A record read back: key, value and user headers (name, value), as text.
type Read = (String, String, Vec<(String, String)>);

/// Every record of `topic`, Parsley's own headers left out.
fn read(d: &TopologyTestDriver, topic: &str) -> Vec<Read> {
    let mut out = d
        .output_topic(topic, parsley_stage::Bytes, parsley_stage::Bytes)
        .unwrap();
    std::iter::from_fn(|| out.read_raw_record())
        .map(|r| {
            let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
            let headers = r
                .headers
                .into_iter()
                .filter(|(n, _)| !parsley_stage::is_own_header(n))
                .map(|(n, v)| (n, text(v.unwrap_or_default())))
                .collect();
            (text(r.key.unwrap()), text(r.value.unwrap()), headers)
        })
        .collect()
}

fn traced() -> Vec<(String, String)> {
    vec![
        ("traceparent".into(), TRACE.into()),
        ("tenant".into(), "acme".into()),
    ]
}

#[test]
fn headers_pass_through_stateless_operators_and_a_repartition_unchanged() {
    let b = StreamsBuilder::new("app");
    b.stream::<String, String>("orders")
        .filter(|_, v| !v.is_empty())
        .map_values(|v| v.to_uppercase())
        .select_key(|_, v| v.clone())
        .repartition()
        .to("out");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "through a repartition topic");
    let d = TopologyTestDriver::builder(t).build().unwrap();
    pipe_traced(&d, "orders", "o1", "book");
    assert_eq!(read(&d, "out"), [("BOOK".into(), "BOOK".into(), traced())]);
    // Every output carries a stamp too: Parsley's own header, beside the user's.
    let mut out = d
        .output_topic("out", parsley_stage::Bytes, parsley_stage::Bytes)
        .unwrap();
    assert!(out.read_raw_record().unwrap().stamp.is_some());
}

/// Records what it saw and emits with its own headers.
#[derive(Clone, Default)]
struct Tracer {
    seen: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Handler for Tracer {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        self.seen
            .lock()
            .unwrap()
            .push(r.headers.iter().map(|(n, _)| n.to_string()).collect());
        // A child span: the same trace, another parent id; `ps` (the stamp's name) is dropped.
        let child = TRACE.replace("00f067aa0ba902b7", "b7ad6b7169203331");
        let mut step = Step::none().emit("ignored", r.key.clone(), format!("{}!", r.value));
        step.emit
            .push(Emission::to("ignored", r.key, r.value).with_headers(vec![
                ("traceparent".into(), Some(child.into_bytes())),
                ("ps".into(), Some(b"forged".to_vec())),
            ]));
        Ok(step)
    }
}

#[test]
fn a_handler_reads_the_user_headers_and_sets_those_of_what_it_emits() {
    let tracer = Tracer::default();
    let b = StreamsBuilder::new("app");
    b.stream::<String, String>("orders")
        .process(tracer.clone())
        .map_values(|v| v.len().to_string())
        .to("out");
    let d = TopologyTestDriver::builder(b.build().unwrap())
        .build()
        .unwrap();
    // Written by a causal producer: the record carries a stamp the handler never sees.
    let producer = d.causal_producer("shop");
    producer
        .send_record(
            parsley_runtime::OutgoingRecord::new("orders", b"o1", b"pen")
                .header("traceparent", TRACE.as_bytes())
                .header("tenant", b"acme"),
        )
        .unwrap();
    assert_eq!(
        *tracer.seen.lock().unwrap(),
        [vec!["traceparent".to_string(), "tenant".into()]]
    );
    let child = TRACE.replace("00f067aa0ba902b7", "b7ad6b7169203331");
    assert_eq!(
        read(&d, "out"),
        [
            ("o1".into(), "4".into(), traced()),
            ("o1".into(), "3".into(), vec![("traceparent".into(), child)]),
        ]
    );
    // The forged `ps` was dropped: the output's stamp is the stage's own and decodes.
    let mut out = d
        .output_topic("out", parsley_stage::Bytes, parsley_stage::Bytes)
        .unwrap();
    let records: Vec<_> = std::iter::from_fn(|| out.read_raw_record()).collect();
    assert!(records.iter().all(|r| r.stamp.is_some()));
    assert!(
        records[1]
            .headers
            .iter()
            .all(|(_, v)| v.as_deref() != Some(&b"forged"[..]))
    );
}

#[test]
fn a_stage_ordered_by_event_time_keeps_the_headers_of_the_records_it_parks() {
    let b = StreamsBuilder::new("app");
    let orders = b.stream::<String, String>("orders");
    // The window makes the stage order by event time: every record is parked in its timer
    // queue, changelogged, then handed over; the pass-through branch shows its headers.
    orders
        .group_by_key()
        .windowed_by(crate::TimeWindows::of_size(
            std::time::Duration::from_millis(10),
        ))
        .count()
        .to_stream()
        .map(|w, n| (w.key, n.to_string()))
        .to("counts");
    orders.to("out");
    let d = TopologyTestDriver::builder(b.build().unwrap())
        .auto_run(false)
        .build()
        .unwrap();
    pipe_traced(&d, "orders", "o1", "a");
    d.run().unwrap();
    // Restored from the changelog before it is handed over, when still parked.
    d.restart().unwrap();
    pipe_traced(&d, "orders", "o2", "b");
    d.run().unwrap();
    let out = read(&d, "out");
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.iter().all(|(_, _, h)| *h == traced()), "{out:?}");
}

/// Writes `value` under `key` at `ts` to `topic` with trace `trace` as its `traceparent`.
fn pipe_trace_at(
    d: &TopologyTestDriver,
    topic: &str,
    key: &str,
    value: &str,
    ts: i64,
    trace: &str,
) {
    d.pipe_raw(
        topic,
        RawInput::new(Some(key.as_bytes()), Some(value.as_bytes()))
            .timestamp(ts)
            .header("traceparent", trace.as_bytes()),
    )
    .unwrap();
}

/// The `traceparent` of each record of `topic`, with its key and value.
fn traces(d: &TopologyTestDriver, topic: &str) -> Vec<(String, String, String)> {
    read(d, topic)
        .into_iter()
        .map(|(k, v, h)| {
            let trace = h
                .into_iter()
                .find(|(n, _)| n == "traceparent")
                .map_or_else(|| "-".to_string(), |(_, t)| t);
            (k, v, trace)
        })
        .collect()
}

#[test]
fn a_result_a_timer_makes_carries_the_headers_of_the_last_update_it_was_made_from() {
    use std::time::Duration;

    use crate::{JoinWindows, SessionWindows, SlidingWindows, Suppressed, TimeWindows};

    let ms = Duration::from_millis;
    let b = StreamsBuilder::new("app");
    let events = b.stream::<String, String>("events");
    events
        .group_by_key()
        .windowed_by(TimeWindows::of_size(ms(10)))
        .count()
        .to_stream()
        .map(|w, n| (w.key, format!("window {}: {n}", w.start)))
        .to("windows");
    events
        .group_by_key()
        .windowed_by(SessionWindows::with_inactivity_gap(ms(3)))
        .count()
        .to_stream()
        .map(|w, n| (w.key, format!("session {}-{}: {n}", w.start, w.end)))
        .to("sessions");
    events
        .group_by_key()
        .windowed_by(SlidingWindows::of_time_difference_with_no_grace(ms(2)))
        .count()
        .to_stream()
        .map(|w, n| (w.key, format!("sliding {}-{}: {n}", w.start, w.end)))
        .to("sliding");
    b.table::<String, String>("stock")
        .suppress(Suppressed::until_time_limit(ms(5)))
        .to_stream()
        .to("suppressed");
    b.stream::<String, String>("left")
        .left_join_windowed(
            &b.stream::<String, String>("right"),
            JoinWindows::of_time_difference(ms(2)),
            |l, r| format!("{l}/{}", r.map_or("none", String::as_str)),
        )
        .to("joined");
    let d = TopologyTestDriver::builder(b.build().unwrap())
        .build()
        .unwrap();

    pipe_trace_at(&d, "events", "k", "a", 1, "A");
    pipe_trace_at(&d, "events", "k", "b", 2, "B");
    pipe_trace_at(&d, "events", "j", "c", 30, "C");
    // The window [0, 10) and the session [1, 2) of k were last updated by b; the sliding
    // window [0, 2] too.
    assert_eq!(
        traces(&d, "windows"),
        [("k".into(), "window 0: 2".into(), "B".into())]
    );
    assert_eq!(
        traces(&d, "sessions"),
        [("k".into(), "session 1-2: 2".into(), "B".into())]
    );
    let sliding = traces(&d, "sliding");
    assert!(
        sliding.contains(&("k".into(), "sliding 0-2: 2".into(), "B".into())),
        "{sliding:?}"
    );
    assert!(
        sliding.iter().all(|(k, _, t)| k == "k" && t != "-"),
        "{sliding:?}"
    );

    pipe_trace_at(&d, "stock", "tea", "3", 1, "A");
    pipe_trace_at(&d, "stock", "tea", "4", 2, "B");
    pipe_trace_at(&d, "stock", "milk", "9", 20, "C");
    assert_eq!(
        traces(&d, "suppressed"),
        [("tea".into(), "4".into(), "B".into())]
    );

    pipe_trace_at(&d, "left", "k", "x", 1, "A");
    pipe_trace_at(&d, "left", "k", "y", 1, "B");
    pipe_trace_at(&d, "left", "j", "z", 50, "C");
    // Each record that joined nothing carries its own headers, not the record that moved
    // event time past it.
    assert_eq!(
        traces(&d, "joined"),
        [
            ("k".into(), "x/none".into(), "A".into()),
            ("k".into(), "y/none".into(), "B".into())
        ]
    );
}
