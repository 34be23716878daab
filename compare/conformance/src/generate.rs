//! Scenarios generated from seeds: proptest strategies for each operator of the catalogue and
//! for input scripts, so that a difference found is shrunk to a minimal script.
//!
//! Inputs are what breaks stream processors: keys from a small set (so records meet), absent
//! keys and values, empty values, equal timestamps and timestamps that go back, both input
//! topics interleaved. Durations of windows and joins are a few ms, the same scale as the
//! timestamps, so windows close, sessions merge and join windows expire within a script.

use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;

use crate::scenario::{Grouping, How, Input, JoinKind, Op, Scenario};

/// The most records in a generated script.
const MAX_INPUTS: usize = 14;

/// One step of a script before times are laid out: topic, key, value, time since the last
/// step, and how far this record is written back in time.
type Step = (bool, Option<String>, Option<String>, i64, i64);

fn key() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        12 => prop::sample::select(vec!["a", "b", "c"]).prop_map(|k| Some(k.to_string())),
        1 => Just(None),
    ]
}

fn value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        14 => (0i64..30).prop_map(|n| Some(n.to_string())),
        1 => Just(None),
        1 => Just(Some(String::new())),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        any::<bool>(),
        key(),
        value(),
        0i64..6,
        prop_oneof![4 => Just(0i64), 1 => 1i64..20],
    )
}

/// A script: timestamps move forward by the steps' gaps, a record written back sits below.
fn inputs(two_topics: bool) -> impl Strategy<Value = Vec<Input>> {
    prop::collection::vec(step(), 0..=MAX_INPUTS).prop_map(move |steps| {
        let mut now = 0i64;
        steps
            .into_iter()
            .map(|(right, key, value, gap, back)| {
                now += gap;
                Input {
                    topic: if two_topics && right { "right" } else { "left" }.to_string(),
                    key,
                    value,
                    ts: (now - back).max(0),
                }
            })
            .collect()
    })
}

fn grouping() -> impl Strategy<Value = Grouping> {
    prop_oneof![
        Just(Grouping::ByKey),
        Just(Grouping::SelectKey),
        Just(Grouping::GroupBy)
    ]
}

fn grace() -> impl Strategy<Value = i64> {
    prop_oneof![Just(0i64), 1i64..8]
}

/// A windowed aggregation of `how`: tumbling half the time, else hopping.
fn windowed(how: How) -> BoxedStrategy<Op> {
    (1i64..16, any::<bool>(), 1i64..16, grace(), any::<bool>())
        .prop_map(
            move |(size, tumbling, advance, grace, updates)| Op::Windowed {
                how,
                size,
                advance: if tumbling { size } else { advance.min(size) },
                grace,
                updates,
            },
        )
        .boxed()
}

fn sliding(how: How) -> BoxedStrategy<Op> {
    (1i64..12, grace(), any::<bool>())
        .prop_map(move |(difference, grace, updates)| Op::Sliding {
            how,
            difference,
            grace,
            updates,
            retention: None,
        })
        .boxed()
}

fn session(how: How) -> BoxedStrategy<Op> {
    (0i64..8, grace(), any::<bool>())
        .prop_map(move |(gap, grace, updates)| Op::Session {
            how,
            gap,
            grace,
            updates,
        })
        .boxed()
}

fn join_windowed(kind: JoinKind) -> BoxedStrategy<Op> {
    (0i64..8, grace())
        .prop_map(move |(difference, grace)| Op::JoinWindowed {
            kind,
            difference,
            grace,
        })
        .boxed()
}

/// A stream–table join with a versioned table: `left_join_with` when `left`, with a grace
/// period when `grace`.
fn versioned_join(left: bool, grace: bool) -> BoxedStrategy<Op> {
    // Kafka Streams refuses a grace longer than the retention, and so does `build`.
    (0i64..40, 0i64..20)
        .prop_map(move |(retention, g)| Op::VersionedJoin {
            left,
            retention,
            grace: grace.then_some(g.min(retention)),
        })
        .boxed()
}

/// Every operator of the catalogue as the report names it, with the strategy of its
/// parameters. Generated scenarios are spread evenly over these.
pub fn operators() -> Vec<(&'static str, BoxedStrategy<Op>)> {
    let aggregation = |make: fn(Grouping, bool) -> Op| {
        (grouping(), any::<bool>())
            .prop_map(move |(g, named)| make(g, named))
            .boxed()
    };
    let ops: Vec<BoxedStrategy<Op>> = vec![
        Just(Op::Filter { not: false }).boxed(),
        Just(Op::Filter { not: true }).boxed(),
        Just(Op::MapValues).boxed(),
        Just(Op::MapValuesWithKey).boxed(),
        Just(Op::Map).boxed(),
        Just(Op::SelectKey).boxed(),
        Just(Op::FlatMap).boxed(),
        Just(Op::FlatMapValues).boxed(),
        Just(Op::FlatMapValuesWithKey).boxed(),
        Just(Op::Peek).boxed(),
        Just(Op::Foreach).boxed(),
        Just(Op::Merge).boxed(),
        any::<bool>()
            .prop_map(|default| Op::Split {
                default,
                named: false,
            })
            .boxed(),
        any::<bool>()
            .prop_map(|default| Op::Split {
                default,
                named: true,
            })
            .boxed(),
        Just(Op::Repartition).boxed(),
        aggregation(|group, named| Op::Count { group, named }),
        aggregation(|group, named| Op::Reduce { group, named }),
        aggregation(|group, named| Op::Aggregate { group, named }),
        Just(Op::Process).boxed(),
        any::<bool>()
            .prop_map(|rekey| Op::Join { left: false, rekey })
            .boxed(),
        any::<bool>()
            .prop_map(|rekey| Op::Join { left: true, rekey })
            .boxed(),
        windowed(How::Count),
        windowed(How::Reduce),
        windowed(How::Aggregate),
        sliding(How::Count),
        sliding(How::Reduce),
        sliding(How::Aggregate),
        session(How::Count),
        session(How::Reduce),
        session(How::Aggregate),
        join_windowed(JoinKind::Inner),
        join_windowed(JoinKind::Left),
        join_windowed(JoinKind::Outer),
        (any::<bool>(), any::<bool>())
            .prop_map(|(change, materialized)| Op::Table {
                change,
                materialized,
            })
            .boxed(),
        Just(Op::Cogroup).boxed(),
        Just(Op::ToTable).boxed(),
        Just(Op::TableGroupBy { how: How::Count }).boxed(),
        Just(Op::TableGroupBy { how: How::Reduce }).boxed(),
        Just(Op::TableGroupBy {
            how: How::Aggregate,
        })
        .boxed(),
        Just(Op::TableFilter { not: false }).boxed(),
        Just(Op::TableFilter { not: true }).boxed(),
        Just(Op::TableMapValues).boxed(),
        Just(Op::TableMapValuesWithKey).boxed(),
        Just(Op::TableJoin {
            kind: JoinKind::Inner,
        })
        .boxed(),
        Just(Op::TableJoin {
            kind: JoinKind::Left,
        })
        .boxed(),
        Just(Op::TableJoin {
            kind: JoinKind::Outer,
        })
        .boxed(),
        Just(Op::FkJoin { left: false }).boxed(),
        Just(Op::FkJoin { left: true }).boxed(),
        Just(Op::GlobalJoin { left: false }).boxed(),
        Just(Op::GlobalJoin { left: true }).boxed(),
        versioned_join(false, false),
        versioned_join(true, false),
        versioned_join(false, true),
        versioned_join(true, true),
        prop_oneof![1 => Just(0i64), 4 => 1i64..=20]
            .prop_map(|limit_ms| Op::Suppress { limit_ms })
            .boxed(),
    ];
    ops.into_iter()
        .map(|s| {
            let row = s
                .new_tree(&mut proptest::test_runner::TestRunner::deterministic())
                .expect("a strategy of ops")
                .current()
                .row();
            (row, s)
        })
        .collect()
}

/// Scenarios of the operators `op` generates: one partition for event-time operators, else one
/// or three.
pub fn scenarios(op: BoxedStrategy<Op>) -> impl Strategy<Value = Scenario> {
    op.prop_flat_map(|op| {
        let partitions = if op.one_task() {
            Just(1).boxed()
        } else {
            prop_oneof![3 => Just(1), 1 => Just(3)].boxed()
        };
        let two = op.reads_right();
        (Just(op), partitions, inputs(two))
    })
    .prop_map(|(op, partitions, inputs)| Scenario {
        op,
        partitions,
        inputs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn every_row_is_named_once_and_scripts_keep_time_non_negative() {
        let ops = operators();
        let mut rows: Vec<&str> = ops.iter().map(|(r, _)| *r).collect();
        rows.sort_unstable();
        rows.dedup();
        assert_eq!(rows.len(), ops.len(), "{rows:?}");
        let mut runner = TestRunner::deterministic();
        for (_, op) in ops {
            let s = scenarios(op).new_tree(&mut runner).unwrap().current();
            assert!(s.inputs.iter().all(|i| i.ts >= 0));
            assert!(s.inputs.len() <= MAX_INPUTS);
            if s.op.one_task() {
                assert_eq!(s.partitions, 1);
            }
        }
    }
}
