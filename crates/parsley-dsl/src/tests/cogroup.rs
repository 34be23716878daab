//! Cogroups: several grouped streams folded into one aggregate per key.

use super::Harness;
use crate::{StreamsBuilder, read_slot};

#[test]
fn a_cogroup_folds_every_inputs_records_into_one_aggregate_with_the_latest_timestamp() {
    let b = StreamsBuilder::new("shop");
    let views = b.stream::<String, String>("views").group_by_key();
    let orders = b.stream::<String, i64>("orders").group_by_key();
    views
        .cogroup(|_, page, agg: String| format!("{agg}+v:{page}"))
        .cogroup(orders, |customer, cents, agg| {
            format!("{agg}+o:{customer}:{cents}")
        })
        .named("activity")
        .aggregate(|| "0".to_string())
        .to_stream()
        .to("out");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 1, "{}", t.describe());
    assert_eq!(t.stages()[0].sources(), ["views", "orders"]);
    let h = Harness::new(t);
    h.pipe_at("views", Some("ann"), Some("home"), 5).unwrap();
    h.pipe_at("orders", Some("ann"), Some("120"), 3).unwrap();
    h.pipe_at("views", Some("bob"), Some("cart"), 4).unwrap();
    h.pipe_at("views", Some("ann"), Some("cart"), 9).unwrap();
    h.pipe_at("orders", Some("bob"), Some("70"), 8).unwrap();
    assert_eq!(
        h.records("out"),
        [
            "ann=0+v:home@5",
            "ann=0+v:home+o:ann:120@5", // an older record: the aggregate keeps the latest time
            "bob=0+v:cart@4",
            "ann=0+v:home+o:ann:120+v:cart@9",
            "bob=0+v:cart+o:bob:70@8",
        ]
    );
    // One slot, the cogroup's, for every input.
    let ann = h.state("views", "ann").unwrap();
    assert_eq!(
        read_slot::<String>(&ann, "activity").unwrap().as_deref(),
        Some("0+v:home+o:ann:120+v:cart")
    );
}

#[test]
fn a_rekeyed_input_of_a_cogroup_is_repartitioned_under_the_cogroups_name() {
    let b = StreamsBuilder::new("shop");
    b.on_bad_record(parsley_stage::BadRecordPolicy::Skip);
    let counts = b.stream::<String, i64>("counts").group_by_key();
    let words = b
        .stream::<Option<String>, String>("lines")
        .group_by(|_, word| word.clone());
    counts
        .cogroup(|_, n, total: i64| total + n)
        .cogroup(words, |_, _, total| total + 1)
        .named("words")
        .aggregate(|| 0)
        .to_stream()
        .to("out");
    let t = b.build().unwrap();
    assert_eq!(t.stages().len(), 2, "{}", t.describe());
    let names: Vec<_> = t.internal_topics().iter().map(|i| i.name.clone()).collect();
    assert_eq!(names, ["shop-words-1-repartition"]);
    let h = Harness::new(t);
    h.pipe_at("lines", None, Some("fig"), 1).unwrap();
    h.pipe_at("counts", Some("fig"), Some("10"), 2).unwrap();
    h.pipe_at("lines", Some("x"), Some("fig"), 3).unwrap();
    h.pipe_at("lines", None, Some("kiwi"), 0).unwrap();
    h.pipe_at("counts", None, Some("5"), 4).unwrap(); // no key: a bad record, skipped
    assert_eq!(
        h.records("out"),
        ["fig=1@1", "fig=11@2", "fig=12@3", "kiwi=1@0"]
    );
}
