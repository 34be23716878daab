//! Stream operators: stateless ones fused, re-keying and repartitioning, aggregations,
//! `process`, errors.

use parsley_runtime::driver::TopologyTestDriver;
use parsley_runtime::partition_for;
use parsley_stage::{
    BadRecordPolicy, Bytes, Error, Handler, HandlerError, InternalTopic, Json, Part, Record, Step,
    Utf8,
};

use super::{Harness, process_once};
use crate::{Consumed, Produced, StreamsBuilder, read_slot};

#[test]
fn stateless_operators_fuse_into_one_stage_and_keep_order() {
    let b = StreamsBuilder::new("app");
    let s = b.stream::<String, i64>("in");
    s.filter(|_, v| *v > 0).to("positive");
    s.filter_not(|_, v| *v > 0).to("other");
    s.map_values(|v| v * 10).to("times-ten");
    s.map(|k, v| (format!("{k}{v}"), v.to_string()))
        .to("mapped");
    s.flat_map_values(|v| (0..v).collect::<Vec<_>>())
        .to("flat-values");
    s.flat_map(|k, v| vec![(format!("{k}-a"), v), (format!("{k}-b"), -v)])
        .to("flat");
    s.select_key(|k, v| format!("{k}:{v}")).to("rekeyed");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    s.peek(move |k, v| log.lock().unwrap().push(format!("{k}={v}")))
        .to("peeked");
    let branches = s
        .split()
        .branch(|_, v| *v > 1)
        .branch(|_, v| *v > 0)
        .default_branch();
    assert_eq!(branches.len(), 3);
    for (i, branch) in branches.iter().enumerate() {
        branch.to(format!("branch-{i}"));
    }
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1, "{}", t.describe());
    assert!(!t.stages()[0].processor().keeps_state());
    let h = Harness::new(t);
    for (k, v) in [("a", "2"), ("b", "-1"), ("c", "1")] {
        h.pipe("in", Some(k), Some(v)).unwrap();
    }
    assert_eq!(h.lines("positive"), ["a=2", "c=1"]);
    assert_eq!(h.lines("other"), ["b=-1"]);
    assert_eq!(h.lines("times-ten"), ["a=20", "b=-10", "c=10"]);
    assert_eq!(h.lines("mapped"), ["a2=2", "b-1=-1", "c1=1"]);
    assert_eq!(h.lines("flat-values"), ["a=0", "a=1", "c=0"]);
    assert_eq!(
        h.lines("flat"),
        ["a-a=2", "a-b=-2", "b-a=-1", "b-b=1", "c-a=1", "c-b=-1"]
    );
    assert_eq!(h.lines("rekeyed"), ["a:2=2", "b:-1=-1", "c:1=1"]);
    assert_eq!(h.lines("peeked"), ["a=2", "b=-1", "c=1"]);
    assert_eq!(*seen.lock().unwrap(), ["a=2", "b=-1", "c=1"]);
    assert_eq!(h.lines("branch-0"), ["a=2"]);
    assert_eq!(h.lines("branch-1"), ["c=1"]);
    assert_eq!(h.lines("branch-2"), ["b=-1"]);
}

#[test]
fn merge_takes_both_streams_and_codecs_apply_at_sources_and_sinks() {
    let b = StreamsBuilder::new("app");
    let left = b.stream_with("left", Consumed::with(Utf8, Json));
    let right = b.stream::<String, String>("right");
    left.merge(&right)
        .to_with("merged", Produced::with(Json, Json));
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1);
    assert_eq!(t.stages()[0].sources(), ["left", "right"]);
    let h = Harness::new(t);
    h.pipe("left", Some("k"), Some("\"from left\"")).unwrap();
    h.pipe("right", Some("k"), Some("from right")).unwrap();
    assert_eq!(
        h.lines("merged"),
        ["\"k\"=\"from left\"", "\"k\"=\"from right\""]
    );
}

#[test]
fn word_count_repartitions_by_word_and_counts() {
    let b = StreamsBuilder::new("wc");
    b.stream::<(), String>("lines")
        .flat_map_values(|l| {
            l.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        })
        .group_by(|_, w| w.clone())
        .count()
        .to_stream()
        .to("counts");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    let rep = "wc-count-0003-repartition";
    assert_eq!(
        t.internal_topics(),
        [InternalTopic::new(rep, ["lines".to_string()])]
    );
    assert_eq!(t.stages()[0].sinks(), [rep]);
    assert!(!t.stages()[0].processor().keeps_state(), "keyless lines");
    assert_eq!(t.stages()[1].sources(), [rep]);
    assert!(t.stages()[1].processor().keeps_state());
    let h = Harness::new(t);
    h.pipe("lines", None, Some("the cat The dog")).unwrap();
    h.pipe("lines", None, Some("a cat")).unwrap();
    assert_eq!(
        h.lines("counts"),
        ["the=1", "cat=1", "the=2", "dog=1", "a=1", "cat=2"]
    );
    let state = h.state("count-0003", "cat").unwrap();
    assert_eq!(read_slot::<i64>(&state, "count-0003").unwrap(), Some(2));
}

#[test]
fn group_by_key_aggregates_in_place_unless_the_key_changed() {
    let b = StreamsBuilder::new("app");
    let s = b.stream::<String, i64>("in");
    s.group_by_key()
        .named("sum")
        .aggregate(|| 100, |_, v, a| a + v)
        .to_stream()
        .to("sums");
    s.group_by_key()
        .named("max")
        .reduce(i64::max)
        .to_stream()
        .to("maxes");
    s.select_key(|_, v| if *v % 2 == 0 { "even" } else { "odd" }.to_string())
        .group_by_key()
        .named("parity")
        .count()
        .to_stream()
        .to("parity");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    assert_eq!(
        t.stages()[0].sinks(),
        ["sums", "maxes", "app-parity-repartition"]
    );
    let h = Harness::new(t);
    for (k, v) in [("a", "1"), ("b", "4"), ("a", "7"), ("a", "2")] {
        h.pipe("in", Some(k), Some(v)).unwrap();
    }
    assert_eq!(h.lines("sums"), ["a=101", "b=104", "a=108", "a=110"]);
    assert_eq!(h.lines("maxes"), ["a=1", "b=4", "a=7", "a=7"]);
    assert_eq!(h.lines("parity"), ["odd=1", "even=1", "odd=2", "even=2"]);
    // Two aggregations of one stage keep two slots of the key's state.
    let a = h.state("in", "a").unwrap();
    assert_eq!(read_slot::<i64>(&a, "sum").unwrap(), Some(110));
    assert_eq!(read_slot::<i64>(&a, "max").unwrap(), Some(7));
    assert_eq!(
        read_slot::<i64>(&h.state("parity", "odd").unwrap(), "parity").unwrap(),
        Some(2)
    );
}

/// Counts per key and emits `key:count` under a new key.
struct Tally;
impl Handler for Tally {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = u32;
    fn handle(
        &self,
        r: Record<'_, String, String>,
        n: Option<u32>,
    ) -> Result<Step<String, String, u32>, HandlerError> {
        if r.value == "boom" {
            return Err("boom".into());
        }
        let n = n.unwrap_or(0) + 1;
        Ok(Step::none()
            .emit(
                "ignored",
                format!("{}#{n}", r.key),
                format!("{}@{}", r.value, r.offset),
            )
            .set_state(n))
    }
}

#[test]
fn process_runs_a_handler_with_state_after_a_repartition_when_rekeyed() {
    let b = StreamsBuilder::new("app");
    let s = b.stream::<String, String>("in");
    s.named("tally").process(Tally).to("direct");
    s.select_key(|_, v| v.clone())
        .named("by-value")
        .process(Tally)
        .to("by-value");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    assert_eq!(
        t.internal_topics()[0].name,
        "app-by-value-input-repartition"
    );
    let h = Harness::new(t);
    h.pipe("in", Some("k"), Some("x")).unwrap();
    h.pipe("in", Some("k"), Some("y")).unwrap();
    h.pipe("in", Some("j"), Some("x")).unwrap();
    assert_eq!(h.lines("direct"), ["k#1=x@0", "k#2=y@1", "j#1=x@2"]);
    assert_eq!(h.lines("by-value"), ["x#1=x@0", "y#1=y@1", "x#2=x@2"]);
    let err = h.pipe("in", Some("k"), Some("boom")).unwrap_err();
    assert!(
        matches!(err.stage_error(), parsley_runtime::Error::Processing(parsley_runtime::ProcessingError::Stage(Error::Handler { stage, topic, offset: 3, .. }))
            if stage == "in" && topic == "in"),
        "{err}"
    );
    // The stopped stage kept what it had committed: nothing of the failed record.
    assert_eq!(h.lines("direct").len(), 3);
}

#[test]
fn bad_records_and_bad_state_are_typed_errors_naming_the_record() {
    let b = StreamsBuilder::new("app");
    b.stream::<String, i64>("in")
        .group_by_key()
        .named("n")
        .count()
        .to_stream()
        .to("out");
    let t = b.build().unwrap();
    let at = |offset| ("in", offset);
    let err = process_once(&t, "in", at(0), (Some("k"), Some("not a number")), None).unwrap_err();
    assert!(
        matches!(&err, Error::Decode { topic, offset: 0, part: Part::Value, .. } if topic == "in"),
        "{err}"
    );
    let err = process_once(&t, "in", at(1), (None, Some("1")), None).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Missing {
                part: Part::Key,
                offset: 1,
                ..
            }
        ),
        "{err}"
    );
    let err = process_once(&t, "in", at(2), (Some("k"), None), None).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Missing {
                part: Part::Value,
                offset: 2,
                ..
            }
        ),
        "{err}"
    );
    let err = process_once(&t, "in", at(3), (Some("k"), Some("1")), Some(&[9, 9, 9])).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Decode {
                part: Part::State,
                offset: 3,
                ..
            }
        ),
        "{err}"
    );

    // Through the driver, the first bad record stops the stage with that error, and nothing
    // of it reaches the output.
    let h = Harness::new(t);
    let err = h.pipe("in", Some("k"), Some("not a number")).unwrap_err();
    assert!(
        matches!(
            err.stage_error(),
            parsley_runtime::Error::Processing(parsley_runtime::ProcessingError::Stage(
                Error::Decode {
                    offset: 0,
                    part: Part::Value,
                    ..
                }
            ))
        ),
        "{err}"
    );
    assert!(h.lines("out").is_empty());
}

#[test]
fn build_reports_every_problem_at_once() {
    let b = StreamsBuilder::new("app");
    let s = b.stream::<String, String>("in");
    b.stream::<String, String>("in").to("x");
    s.named("same").filter(|_, _| true).to("a");
    s.named("same").filter(|_, _| true).to("b");
    s.to("bad topic");
    let Err(Error::InvalidTopology { problems }) = b.build() else {
        panic!("expected an invalid topology")
    };
    let text = problems.join("\n");
    for needle in [
        "topic \"in\" is the source of two operators",
        "operator name \"same\" is used twice",
        "sink topic \"bad topic\"",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    let Err(Error::InvalidTopology { problems }) = StreamsBuilder::new("app").build() else {
        panic!("expected an invalid topology")
    };
    assert!(problems.iter().any(|p| p == "the topology reads no topic"));
}

#[test]
#[should_panic(expected = "after StreamsBuilder::build")]
fn an_operator_added_after_build_panics() {
    let b = StreamsBuilder::new("app");
    let s = b.stream::<String, String>("in");
    s.to("out");
    let _ = b.build().unwrap();
    s.to("late");
}

#[test]
fn every_stateful_operator_can_be_named_and_describe_lists_its_store() {
    use crate::{JoinWindows, TimeWindows};
    use std::time::Duration;
    let b = StreamsBuilder::new("app");
    let orders = b.table_with::<String, i64>("orders", Consumed::default().named("orders"));
    let prices = b
        .stream::<String, Option<i64>>("prices")
        .named("prices")
        .to_table();
    let payments = b.stream::<String, i64>("payments");
    payments
        .named("paid")
        .join(&orders, |p, o| p + o)
        .to("paid-orders");
    orders
        .named("valued")
        .join(&prices, |o, p| o * p)
        .to_stream()
        .to("values");
    prices
        .named("recent")
        .expire_after(Duration::from_secs(60))
        .to_stream()
        .to("recent-prices");
    payments
        .group_by_key()
        .named("totals")
        .count()
        .to_stream()
        .to("totals");
    payments
        .group_by_key()
        .named("per-minute")
        .windowed_by(TimeWindows::of_size(Duration::from_secs(60)))
        .count()
        .to_stream()
        .to("per-minute");
    payments
        .named("pairs")
        .join_windowed(
            &b.stream::<String, i64>("refunds"),
            JoinWindows::of_time_difference(Duration::from_secs(5)),
            |p, r| p - r,
        )
        .to("net");
    orders
        .group_by(|_, o| (o.to_string(), ()))
        .named("by-amount")
        .count()
        .to_stream()
        .to("amounts");
    let text = b.build().unwrap().describe().to_string();
    for store in [
        "orders: table orders (store orders)",
        "prices: to table (store prices)",
        "paid: join stream with table orders (store paid)",
        "valued: table-join of orders with prices (store valued)",
        "recent: expire rows of prices 60000 ms after their last update (store recent)",
        "totals: count (store totals)",
        "per-minute: windowed count (tumbling 60000 ms, grace 0 ms) (store per-minute)",
        "by-amount: aggregate (table) (store by-amount)",
    ] {
        assert!(text.contains(store), "{store:?} missing in:\n{text}");
    }
    assert!(
        text.contains("(store pairs"),
        "the windowed join's store:\n{text}"
    );
    // No stateful operator is left with a generated name (`{kind}-NNNN`).
    for line in text.lines().filter(|l| l.contains("(store ")) {
        let store = line
            .split("(store ")
            .nth(1)
            .unwrap()
            .split(')')
            .next()
            .unwrap();
        let generated = store
            .rsplit_once('-')
            .is_some_and(|(_, n)| n.len() == 4 && n.chars().all(|c| c.is_ascii_digit()));
        assert!(!generated, "a generated store name: {line}");
    }
}

#[test]
fn a_named_source_table_keeps_its_store_when_an_operator_is_added_before_it() {
    let pipeline = |extra: bool| {
        let b = StreamsBuilder::new("app");
        if extra {
            b.stream::<String, String>("other").to("elsewhere");
        }
        b.table_with::<String, String>("t", Consumed::default().named("rows"))
            .to_stream()
            .to("out");
        b.build().unwrap()
    };
    for extra in [false, true] {
        let topology = pipeline(extra);
        let stage = topology
            .stages()
            .iter()
            .find(|s| s.sources().iter().any(|t| t == "t"))
            .unwrap()
            .name()
            .to_string();
        let h = Harness::new(topology);
        h.pipe("t", Some("k"), Some("v")).unwrap();
        let state = h.state(&stage, "k").expect("the row is kept");
        assert_eq!(
            read_slot::<String>(&state, "rows").unwrap(),
            Some("v".to_string()),
            "the row in the slot named rows (extra operator: {extra})"
        );
    }
}

#[test]
fn describe_names_every_operator_and_its_successors() {
    let b = StreamsBuilder::new("app");
    b.stream::<String, i64>("in")
        .filter(|_, v| *v > 0)
        .group_by(|_, v| v.to_string())
        .named("by-value")
        .count()
        .to_stream()
        .to("out");
    let text = b.build().unwrap().describe().to_string();
    for line in [
        "Stage in (consumer group app.in, changelog app.in.changelog)",
        "source-0000: source in --> filter-0001",
        "filter-0001: filter --> select-key-0002",
        "select-key-0002: select key --> by-value-sink",
        "by-value-sink: to app-by-value-repartition",
        "sinks: app-by-value-repartition (internal, partitions as in)",
        "Stage by-value (consumer group app.by-value, changelog app.by-value.changelog)",
        "source-0004: source app-by-value-repartition (internal) --> by-value",
        "by-value: count (store by-value) --> to-stream-0006",
    ] {
        assert!(text.contains(line), "{line:?} missing in:\n{text}");
    }
}

#[test]
fn repartition_branches_without_default_grouped_codecs_table_codecs_and_skip_policy() {
    let b = StreamsBuilder::new("app");
    b.on_bad_record(BadRecordPolicy::Skip);
    let s = b.stream::<String, i64>("in");
    let branches = s.split().branch(|_, v| *v > 0).no_default_branch();
    assert_eq!(branches.len(), 1);
    branches[0]
        .select_key(|_, v| format!("n{v}"))
        .repartition()
        .to("by-number");
    s.group_by(|k, _| k.to_uppercase())
        .named("upper")
        .with_codecs(Json, Json)
        .count()
        .to_stream()
        .to("upper-counts");
    b.table_with("names", Consumed::with(Utf8, Utf8))
        .map_values(|n: &String| n.len() as i64)
        .to_stream()
        .to("name-lengths");
    let t = b.build().unwrap();
    let repartition = t
        .internal_topics()
        .iter()
        .map(|i| i.name.clone())
        .find(|n| n != "app-upper-repartition")
        .unwrap();
    let driver = TopologyTestDriver::builder(t)
        .partitions("in", 3)
        .build()
        .unwrap();
    assert_eq!(driver.topic(&repartition).unwrap().partitions, 3);
    let input = driver.input_topic("in", Utf8, Utf8).unwrap();
    for (k, v) in [
        ("a", "1"),
        ("b", "-2"),
        ("c", "3"),
        ("a", "oops"),
        ("d", "4"),
    ] {
        input.pipe(k.into(), v.into()).unwrap();
    }
    driver
        .input_topic("names", Utf8, Utf8)
        .unwrap()
        .pipe("c1".into(), "Ann".into())
        .unwrap();

    // The bad record was skipped and counted; everything after it went on.
    assert_eq!(driver.metrics("in").unwrap().skipped, 1);
    // Every record crossed the repartition topic into the partition its new key hashes to.
    let mut crossed = driver.output_topic(&repartition, Bytes, Bytes).unwrap();
    let crossed = std::iter::from_fn(|| crossed.read_raw_record()).collect::<Vec<_>>();
    assert_eq!(crossed.len(), 3);
    for r in &crossed {
        let key = r.key.as_deref().unwrap();
        assert_eq!(r.partition, partition_for(key, 3), "{r:?}");
    }
    let mut by_number = driver.output_topic("by-number", Utf8, Utf8).unwrap();
    let mut numbers = by_number.read_key_values();
    numbers.sort();
    assert_eq!(
        numbers,
        [
            ("n1".into(), "1".into()),
            ("n3".into(), "3".into()),
            ("n4".into(), "4".into())
        ]
    );
    // The grouped codecs apply to the repartition topic alone: JSON keys there, UTF-8 after.
    let mut upper = driver
        .output_topic("app-upper-repartition", Bytes, Bytes)
        .unwrap();
    let first = upper.read_raw_record().unwrap();
    assert_eq!(first.key.as_deref(), Some(&b"\"A\""[..]));
    let counts = driver
        .output_topic("upper-counts", Utf8, Json)
        .unwrap()
        .read_key_values_to_map();
    assert_eq!(counts.get("A"), Some(&1i64));
    assert_eq!(counts.len(), 4);
    assert_eq!(
        driver
            .output_topic("name-lengths", Utf8, Json)
            .unwrap()
            .read_key_values(),
        [("c1".to_string(), 3i64)]
    );
}
