//! Key-aware mappers, `foreach` and named branches: exact keys, values and timestamps.

use std::sync::{Arc, Mutex};

use parsley_stage::Error;

use super::Harness;
use crate::{Branched, StreamsBuilder};

#[test]
fn key_aware_mappers_see_the_key_keep_it_and_keep_timestamps() {
    let b = StreamsBuilder::new("app");
    let s = b.stream::<Option<String>, Option<String>>("in");
    s.map_values_with_key(|k, v| {
        format!(
            "{}/{}",
            k.as_deref().unwrap_or("null"),
            v.as_deref().unwrap_or("null")
        )
    })
    .to("labelled");
    s.flat_map_values_with_key(|k, v: Option<String>| {
        let k = k.clone().unwrap_or_default();
        v.unwrap_or_default()
            .chars()
            .map(move |c| format!("{k}:{c}"))
            .collect::<Vec<_>>()
    })
    .to("letters");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1, "{}", t.describe());
    assert!(!t.stages()[0].processor().keeps_state());
    let h = Harness::new(t);
    h.pipe_at("in", Some("a"), Some("12"), 5).unwrap();
    h.pipe_at("in", None, Some("3"), 9).unwrap();
    h.pipe_at("in", Some("b"), None, 7).unwrap();
    h.pipe_at("in", Some("c"), Some(""), 11).unwrap();
    assert_eq!(
        h.records("labelled"),
        ["a=a/12@5", "-=null/3@9", "b=b/null@7", "c=c/@11"]
    );
    assert_eq!(h.records("letters"), ["a=a:1@5", "a=a:2@5", "-=:3@9"]);
}

#[test]
fn key_aware_mappers_keep_the_stream_keyed_as_it_was() {
    // After a key change they leave the stream re-keyed: the count repartitions.
    let b = StreamsBuilder::new("app");
    b.stream::<String, i64>("in")
        .select_key(|_, v| format!("k{}", v % 2))
        .map_values_with_key(|k, v| format!("{k}:{v}"))
        .flat_map_values_with_key(|k, v| [v.clone(), format!("{v}-{k}")])
        .group_by_key()
        .count()
        .to_stream()
        .to("counts");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    let h = Harness::new(t);
    h.pipe_at("in", Some("x"), Some("3"), 4).unwrap();
    h.pipe_at("in", Some("y"), Some("4"), 6).unwrap();
    assert_eq!(
        h.lines("counts"),
        ["k1=1", "k1=2", "k0=1", "k0=2"],
        "two records per input, each counted under its new key"
    );
    // Without a key change there is nothing to repartition.
    let b = StreamsBuilder::new("app");
    b.stream::<String, i64>("in")
        .map_values_with_key(|k, v| format!("{k}{v}"))
        .group_by_key()
        .count()
        .to_stream()
        .to("counts");
    assert_eq!(b.build().unwrap().stages().len(), 1);
}

#[test]
fn a_table_maps_old_and_new_values_with_their_key() {
    let b = StreamsBuilder::new("app");
    b.table::<String, String>("in")
        .map_values_with_key(|k, v| format!("{k}={v}'"))
        .to_change_stream()
        .to("out");
    let h = Harness::new(b.build().unwrap());
    h.pipe_at("in", Some("a"), Some("1"), 3).unwrap();
    h.pipe_at("in", Some("a"), Some("2"), 8).unwrap();
    h.pipe_at("in", Some("b"), Some("5"), 9).unwrap();
    h.pipe_at("in", Some("a"), None, 12).unwrap();
    h.pipe_at("in", Some("c"), None, 13).unwrap();
    assert_eq!(
        h.records("out"),
        ["a=a=1'@3", "a=a=2'@8", "b=b=5'@9", "a=-@12"],
        "a deletion stays one; a key that held nothing gives nothing"
    );
}

#[test]
fn foreach_calls_the_action_per_record_in_order_and_ends_the_stream() {
    let b = StreamsBuilder::new("app");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let s = b.stream::<String, i64>("in");
    s.filter(|_, v| *v > 0)
        .named("log")
        .foreach(move |k, v| log.lock().unwrap().push(format!("{k}={v}")));
    s.to("copy");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1);
    let text = t.describe().to_string();
    assert!(text.contains("log: foreach"), "{text}");
    let h = Harness::new(t);
    for (k, v, ts) in [("a", "2", 1), ("b", "-1", 2), ("c", "1", 3), ("a", "5", 3)] {
        h.pipe_at("in", Some(k), Some(v), ts).unwrap();
    }
    assert_eq!(*seen.lock().unwrap(), ["a=2", "c=1", "a=5"]);
    assert_eq!(h.records("copy"), ["a=2@1", "b=-1@2", "c=1@3", "a=5@3"]);
}

#[test]
fn a_pipeline_that_only_calls_foreach_builds_and_runs() {
    let b = StreamsBuilder::new("app");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    b.stream::<String, String>("in")
        .foreach(move |k, v| log.lock().unwrap().push(format!("{k}={v}")));
    let h = Harness::new(b.build().unwrap());
    h.pipe("in", Some("a"), Some("x")).unwrap();
    h.pipe("in", Some("b"), Some("y")).unwrap();
    assert_eq!(*seen.lock().unwrap(), ["a=x", "b=y"]);
}

#[test]
fn named_branches_are_keyed_by_prefix_and_name_or_position() {
    let b = StreamsBuilder::new("app");
    let consumed = Arc::new(Mutex::new(Vec::new()));
    let log = consumed.clone();
    let branches = b
        .stream::<String, i64>("in")
        .named("t-")
        .split()
        .branch_with(|_, v| *v < 0, Branched::as_("neg"))
        .branch(|_, v| *v > 100)
        .branch_with(
            |_, v| *v > 10,
            Branched::with_function(|s| s.map_values(|v| v * 2)),
        )
        .branch_with(
            |_, v| *v == 0,
            Branched::with_consumer(move |s| {
                s.foreach(move |k, v| log.lock().unwrap().push(format!("{k}={v}")));
            })
            .named("zero"),
        )
        .default_branch_with(Branched::as_("rest"));
    let names: Vec<&str> = branches.keys().map(String::as_str).collect();
    assert_eq!(names, ["t-2", "t-3", "t-neg", "t-rest"]);
    for (name, s) in &branches {
        s.to(format!("out-{name}"));
    }
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1);
    let text = t.describe().to_string();
    assert!(
        text.contains("t-: split --> t-neg, t-2, t-3, t-zero, t-rest"),
        "{text}"
    );
    let h = Harness::new(t);
    for (k, v, ts) in [
        ("a", "-4", 1),
        ("b", "200", 2),
        ("c", "20", 3),
        ("d", "0", 4),
        ("e", "7", 5),
        ("f", "-1", 5),
    ] {
        h.pipe_at("in", Some(k), Some(v), ts).unwrap();
    }
    assert_eq!(h.records("out-t-neg"), ["a=-4@1", "f=-1@5"]);
    assert_eq!(h.records("out-t-2"), ["b=200@2"]);
    assert_eq!(h.records("out-t-3"), ["c=40@3"], "the function's stream");
    assert_eq!(h.records("out-t-rest"), ["e=7@5"]);
    assert_eq!(*consumed.lock().unwrap(), ["d=0"]);
}

#[test]
fn unnamed_splits_number_their_branches_and_the_default_is_zero() {
    let b = StreamsBuilder::new("app");
    let s = b.stream::<String, i64>("in");
    let branches = s
        .split()
        .branch(|_, v| *v > 0)
        .branch(|_, v| *v < 0)
        .default_branch_map();
    let names: Vec<&str> = branches.keys().map(String::as_str).collect();
    assert_eq!(names, ["split-0001-0", "split-0001-1", "split-0001-2"]);
    let none = s
        .named("n-")
        .split()
        .branch(|_, v| *v > 0)
        .no_default_branch_map();
    assert_eq!(none.keys().collect::<Vec<_>>(), ["n-1"]);
    branches["split-0001-0"].to("zero");
    none["n-1"].to("positive");
    let h = Harness::new(b.build().unwrap());
    for (k, v) in [("a", "0"), ("b", "3"), ("c", "-3")] {
        h.pipe("in", Some(k), Some(v)).unwrap();
    }
    assert_eq!(h.lines("zero"), ["a=0"]);
    assert_eq!(h.lines("positive"), ["b=3"]);
}

#[test]
fn listed_branches_take_names_too_and_chains_still_run() {
    let b = StreamsBuilder::new("app");
    let branches = b
        .stream::<String, i64>("in")
        .named("s-")
        .split()
        .branch_with(
            |_, v| *v > 0,
            Branched::with_consumer(|s| s.to("by-consumer")),
        )
        .no_default_branch();
    assert_eq!(branches.len(), 1);
    branches[0].to("listed");
    let t = b.build().unwrap();
    assert!(t.describe().to_string().contains("s-1: branch"));
    let h = Harness::new(t);
    h.pipe_at("in", Some("a"), Some("1"), 4).unwrap();
    h.pipe_at("in", Some("b"), Some("-1"), 5).unwrap();
    assert_eq!(h.records("by-consumer"), ["a=1@4"]);
    assert_eq!(h.records("listed"), ["a=1@4"]);
}

#[test]
fn two_branches_of_one_name_make_the_topology_invalid() {
    let b = StreamsBuilder::new("app");
    let branches = b
        .stream::<String, i64>("in")
        .named("s-")
        .split()
        .branch_with(|_, v| *v > 0, Branched::as_("x"))
        .branch_with(|_, v| *v < 0, Branched::as_("x"))
        .no_default_branch_map();
    assert_eq!(branches.len(), 1);
    branches["s-x"].to("out");
    let Err(Error::InvalidTopology { problems }) = b.build() else {
        panic!("a topology with two branches named s-x");
    };
    assert!(
        problems.iter().any(|p| p.contains("\"s-x\" is used twice")),
        "{problems:?}"
    );
}
