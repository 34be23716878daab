//! Parsley's side of the catalogue: the DSL topology of each [`Op`], run through Parsley's
//! [`TopologyTestDriver`], its outputs rendered as the Kafka Streams program renders its own.
//!
//! The types are the ones a Kafka Streams application ported to Parsley would declare: a key
//! or value that may be absent where the operator passes it on (stateless operators, a key
//! that a re-keying replaces, the values a windowed count or aggregate folds) is an `Option`;
//! where Kafka Streams skips a record without a key or value (aggregations, joins, tables), the
//! type holds none and the pipeline runs under [`BadRecordPolicy::Skip`], so Parsley skips the
//! same records. A windowed `reduce` takes plain values: Kafka Streams folds a null into its
//! reduce, where a Rust reducer of `String`s has none to take (a documented difference).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use parsley_dsl::{
    Branched, Consumed, JoinWindows, Joined, KStream, KTable, LatePolicy, SessionWindows,
    SlidingWindows, StreamsBuilder, Suppressed, TimeWindows, Windowed,
};
use parsley_stage::{BadRecordPolicy, Handler, HandlerResult, Record, Step, Topology};
use parsley_task::driver::{RawInput, TopologyTestDriver};

use crate::scenario::{Grouping, How, JoinKind, Op, Outcome, Output, Outputs, Scenario};

/// The functions every operator applies, the same as the Kafka Streams program's `Fns`.
pub mod fns {
    /// A value that ends in an even digit.
    pub fn even(v: Option<&str>) -> bool {
        v.and_then(|v| v.chars().last())
            .is_some_and(|c| "02468".contains(c))
    }

    /// A value of one character (a UTF-16 unit in Java: the values are ASCII).
    pub fn single(v: Option<&str>) -> bool {
        v.is_some_and(|v| v.chars().count() == 1)
    }

    /// The value with a tick; `None` as the text `null`.
    pub fn tick(v: Option<&str>) -> String {
        v.map_or_else(|| "null".to_string(), |v| format!("{v}'"))
    }

    /// A value as a number: its decimal digits, 0 for anything else.
    pub fn num(v: Option<&str>) -> i64 {
        v.and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// A new key from a value: one of `k0`, `k1`, `k2`.
    pub fn bucket(v: Option<&str>) -> String {
        format!("k{}", num(v).rem_euclid(3))
    }

    /// Two values joined: `a/b`, a missing side as `null`.
    pub fn pair(a: Option<&str>, b: Option<&str>) -> String {
        format!("{}/{}", a.unwrap_or("null"), b.unwrap_or("null"))
    }

    /// An aggregate and a value: `a+b`.
    pub fn plus(a: &str, b: &str) -> String {
        format!("{a}+{b}")
    }

    /// An aggregate and a value taken out of it: `a-b`.
    pub fn minus(a: &str, b: &str) -> String {
        format!("{a}-{b}")
    }

    /// The foreign key a value names: `a`, `b` or `c` for a number of 0, 1 or 2 modulo 4
    /// (every value that is not one: 0), none for 3.
    pub fn foreign_key(v: Option<&str>) -> Option<String> {
        ["a", "b", "c"]
            .get(usize::try_from(num(v).rem_euclid(4)).unwrap_or(3))
            .map(|k| (*k).to_string())
    }

    /// Each character of the value, in order.
    pub fn chars(v: Option<&str>) -> Vec<String> {
        v.map(|v| v.chars().map(String::from).collect())
            .unwrap_or_default()
    }
}

/// How an output topic's keys are rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Text,
    Windowed,
}

/// The compiled topology of a scenario and how its outputs are read.
struct Built {
    topology: Topology,
    outputs: Vec<(String, KeyKind)>,
    /// The records a `foreach` was called with, read as the output topic `out`.
    collected: Option<Arc<Mutex<Vec<Output>>>>,
}

/// A nullable stream, as Kafka Streams' `KStream<String, String>`.
type Nullable = KStream<Option<String>, Option<String>>;

fn ms(n: i64) -> Duration {
    Duration::from_millis(u64::try_from(n).expect("durations are not negative"))
}

/// A windowed aggregation of `how` in `windows` from `left` to `out`, every update or final
/// results only; `$aggregate` is its `aggregate` (the session one takes a merger too). Kafka
/// Streams' windowed aggregations take records without a value: a count and an aggregate see
/// them as `None`; a reduce's values are plain (a documented difference).
macro_rules! windowed {
    ($b:expr, $windows:expr, $how:expr, $updates:expr, |$w:ident| $aggregate:expr) => {{
        if $how == How::Reduce {
            let w = $b
                .stream::<String, String>("left")
                .group_by_key()
                .windowed_by($windows);
            let w = if $updates { w.emit_updates() } else { w };
            w.reduce(|a, v| fns::plus(&a, &v))
                .to_change_stream()
                .to("out");
        } else {
            let $w = $b
                .stream::<String, Option<String>>("left")
                .group_by_key()
                .windowed_by($windows);
            let $w = if $updates { $w.emit_updates() } else { $w };
            match $how {
                How::Count => $w.count().to_change_stream().to("out"),
                _ => $aggregate.to_change_stream().to("out"),
            }
        }
    }};
}

/// Parsley's topology of `op`.
fn build(op: &Op) -> Built {
    let b = StreamsBuilder::new("conformance");
    b.on_bad_record(BadRecordPolicy::Skip);
    // Late records go to a topic of their own (Kafka Streams drops them); it is not compared.
    b.on_late_record(LatePolicy::ToTopic("late".into()));
    let mut outputs = vec![("out".to_string(), KeyKind::Text)];
    let mut collected = None;
    let nullable = || b.stream::<Option<String>, Option<String>>("left");
    match *op {
        Op::Filter { not } => {
            let s: Nullable = nullable();
            if not {
                s.filter_not(|_, v| fns::even(v.as_deref())).to("out");
            } else {
                s.filter(|_, v| fns::even(v.as_deref())).to("out");
            }
        }
        Op::MapValues => nullable()
            .map_values(|v| Some(fns::tick(v.as_deref())))
            .to("out"),
        Op::MapValuesWithKey => nullable()
            .map_values_with_key(|k, v| Some(fns::pair(k.as_deref(), v.as_deref())))
            .to("out"),
        Op::Map => nullable().map(|k, v| (v, k)).to("out"),
        Op::SelectKey => nullable().select_key(|_, v| v.clone()).to("out"),
        Op::FlatMap => nullable()
            .flat_map(|k, v| [(k.clone(), v.clone()), (v, k)])
            .to("out"),
        Op::FlatMapValues => nullable()
            .flat_map_values(|v| fns::chars(v.as_deref()).into_iter().map(Some))
            .to("out"),
        Op::FlatMapValuesWithKey => nullable()
            .flat_map_values_with_key(|k, v| {
                fns::chars(v.as_deref())
                    .into_iter()
                    .map(|c| Some(fns::pair(k.as_deref(), Some(&c))))
                    .collect::<Vec<_>>()
            })
            .to("out"),
        Op::Peek => nullable().peek(|_, _| {}).to("out"),
        Op::Foreach => {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let log = seen.clone();
            let s: Nullable = nullable();
            s.foreach(move |k, v| {
                log.lock().expect("one driver thread").push(Output {
                    key: k.clone(),
                    value: v.clone(),
                    ts: 0,
                });
            });
            collected = Some(seen);
            outputs.clear();
        }
        Op::Merge => nullable()
            .merge(&b.stream::<Option<String>, Option<String>>("right"))
            .to("out"),
        Op::Repartition => nullable().repartition().to("out"),
        Op::Split {
            default,
            named: false,
        } => {
            let split = nullable()
                .split()
                .branch(|_, v| fns::even(v.as_deref()))
                .branch(|_, v| fns::single(v.as_deref()));
            outputs = ["out-0", "out-1"]
                .map(|t| (t.to_string(), KeyKind::Text))
                .to_vec();
            let branches = if default {
                outputs.push(("out-2".to_string(), KeyKind::Text));
                split.default_branch()
            } else {
                split.no_default_branch()
            };
            for (branch, (topic, _)) in branches.iter().zip(&outputs) {
                branch.to(topic.clone());
            }
        }
        Op::Split {
            default,
            named: true,
        } => {
            let s: Nullable = nullable();
            let split = s
                .named("s-")
                .split()
                .branch_with(|_, v| fns::even(v.as_deref()), Branched::as_("even"))
                .branch_with(
                    |_, v| fns::single(v.as_deref()),
                    Branched::with_function(|s: Nullable| {
                        s.map_values(|v| Some(fns::tick(v.as_deref())))
                    }),
                );
            outputs.clear();
            let branches = if default {
                outputs.push(("out-rest".to_string(), KeyKind::Text));
                split.default_branch_with(
                    Branched::with_consumer(|s: Nullable| s.to("out-rest")).named("rest"),
                )
            } else {
                split.no_default_branch_map()
            };
            for (name, branch) in branches {
                let topic = format!("out-{name}");
                branch.to(topic.clone());
                outputs.push((topic, KeyKind::Text));
            }
        }
        Op::Count { group, named }
        | Op::Reduce { group, named }
        | Op::Aggregate { group, named } => {
            let grouped = match group {
                Grouping::ByKey => b.stream::<String, String>("left").group_by_key(),
                Grouping::SelectKey => b
                    .stream::<Option<String>, String>("left")
                    .select_key(|_, v| fns::bucket(Some(v)))
                    .group_by_key(),
                Grouping::GroupBy => b
                    .stream::<Option<String>, String>("left")
                    .group_by(|_, v| fns::bucket(Some(v))),
            };
            let grouped = if named { grouped.named("agg") } else { grouped };
            match op {
                Op::Count { .. } => grouped.count().to_stream().to("out"),
                Op::Reduce { .. } => grouped
                    .reduce(|a, v| fns::plus(&a, &v))
                    .to_stream()
                    .to("out"),
                _ => grouped
                    .aggregate(|| "0".to_string(), |_, v, a| fns::plus(&a, &v))
                    .to_stream()
                    .to("out"),
            }
        }
        Op::Process => b
            .stream::<String, String>("left")
            .process(Counter)
            .to("out"),
        Op::Join { left, rekey } => {
            let table = b.table::<String, String>("right");
            let stream = if rekey {
                b.stream::<Option<String>, String>("left")
                    .select_key(|_, v| fns::bucket(Some(v)))
            } else {
                b.stream::<String, String>("left")
            };
            if left {
                stream
                    .left_join(&table, |v, t| fns::pair(Some(&v), t.map(String::as_str)))
                    .to("out");
            } else {
                stream
                    .join(&table, |v, t| fns::pair(Some(&v), Some(t)))
                    .to("out");
            }
        }
        Op::Windowed {
            how,
            size,
            advance,
            grace,
            updates,
        } => {
            let windows = TimeWindows::of_size(ms(size))
                .advance_by(ms(advance))
                .grace(ms(grace));
            outputs = vec![("out".to_string(), KeyKind::Windowed)];
            windowed!(b, windows, how, updates, |w| w
                .aggregate(|| "0".to_string(), |_, v, a| fns::plus(&a, &text(v))));
        }
        Op::Sliding {
            how,
            difference,
            grace,
            updates,
            ..
        } => {
            // Kafka Streams' sliding aggregation skips records without a value, so every value
            // type here holds none (such a record is a bad record, skipped).
            let windows = SlidingWindows::of_time_difference_and_grace(ms(difference), ms(grace));
            outputs = vec![("out".to_string(), KeyKind::Windowed)];
            let w = b
                .stream::<String, String>("left")
                .group_by_key()
                .windowed_by(windows);
            let w = if updates { w.emit_updates() } else { w };
            match how {
                How::Count => w.count().to_change_stream().to("out"),
                How::Reduce => w
                    .reduce(|a, v| fns::plus(&a, &v))
                    .to_change_stream()
                    .to("out"),
                How::Aggregate => w
                    .aggregate(|| "0".to_string(), |_, v, a| fns::plus(&a, &v))
                    .to_change_stream()
                    .to("out"),
            }
        }
        Op::Session {
            how,
            gap,
            grace,
            updates,
        } => {
            let windows = SessionWindows::with_inactivity_gap(ms(gap)).grace(ms(grace));
            outputs = vec![("out".to_string(), KeyKind::Windowed)];
            windowed!(b, windows, how, updates, |w| w.aggregate(
                || "0".to_string(),
                |_, v, a| fns::plus(&a, &text(v)),
                |_, a, b| format!("{a}|{b}")
            ));
        }
        Op::JoinWindowed {
            kind,
            difference,
            grace,
        } => {
            let windows = JoinWindows::of_time_difference(ms(difference)).grace(ms(grace));
            let l = b.stream::<String, String>("left");
            let r = b.stream::<String, String>("right");
            match kind {
                JoinKind::Inner => l
                    .join_windowed(&r, windows, |a, c| fns::pair(Some(a), Some(c)))
                    .to("out"),
                JoinKind::Left => l
                    .left_join_windowed(&r, windows, |a, c| {
                        fns::pair(Some(a), c.map(String::as_str))
                    })
                    .to("out"),
                JoinKind::Outer => l
                    .outer_join_windowed(&r, windows, |a, c| {
                        fns::pair(a.map(String::as_str), c.map(String::as_str))
                    })
                    .to("out"),
            }
        }
        Op::Table { change, .. } => {
            let t = b.table::<String, String>("left");
            if change {
                t.to_change_stream().to("out");
            } else {
                t.to_stream().to("out");
            }
        }
        Op::Cogroup => {
            let right = b.stream::<String, String>("right").group_by_key();
            b.stream::<String, String>("left")
                .group_by_key()
                .cogroup(|_, v, a: String| fns::plus(&a, &v))
                .cogroup(right, |_, v, a| fns::plus(&a, &fns::tick(Some(&v))))
                .aggregate(|| "0".to_string())
                .to_stream()
                .to("out");
        }
        Op::TableGroupBy { how } => {
            let grouped = b
                .table::<String, String>("left")
                .group_by(|_, v| (fns::bucket(Some(v)), v.clone()));
            match how {
                How::Count => grouped.count().to_stream().to("out"),
                How::Reduce => grouped
                    .reduce(|a, v| fns::plus(&a, &v), |a, v| fns::minus(&a, &v))
                    .to_stream()
                    .to("out"),
                How::Aggregate => grouped
                    .aggregate(
                        || "0".to_string(),
                        |_, v, a| fns::plus(&a, &v),
                        |_, v, a| fns::minus(&a, &v),
                    )
                    .to_stream()
                    .to("out"),
            }
        }
        Op::ToTable => b
            .stream::<String, Option<String>>("left")
            .to_table()
            .to_change_stream()
            .to("out"),
        Op::TableFilter { not } => {
            let t = b.table::<String, String>("left");
            let t = if not {
                t.filter_not(|_, v| fns::even(Some(v)))
            } else {
                t.filter(|_, v| fns::even(Some(v)))
            };
            t.to_change_stream().to("out");
        }
        Op::TableMapValues => b
            .table::<String, String>("left")
            .map_values(|v| fns::tick(Some(v)))
            .to_change_stream()
            .to("out"),
        Op::TableMapValuesWithKey => b
            .table::<String, String>("left")
            .map_values_with_key(|k, v| fns::pair(Some(k), Some(v)))
            .to_change_stream()
            .to("out"),
        Op::TableJoin { kind } => {
            let l = b.table::<String, String>("left");
            let r = b.table::<String, String>("right");
            let joined: KTable<String, String> = match kind {
                JoinKind::Inner => l.join(&r, |a, c| fns::pair(Some(a), Some(c))),
                JoinKind::Left => l.left_join(&r, |a, c| fns::pair(Some(a), c.map(String::as_str))),
                JoinKind::Outer => l.outer_join(&r, |a, c| {
                    fns::pair(a.map(String::as_str), c.map(String::as_str))
                }),
            };
            joined.to_change_stream().to("out");
        }
        Op::FkJoin { left } => {
            let l = b.table::<String, String>("left");
            let r = b.table::<String, String>("right");
            let foreign_key = |v: &String| fns::foreign_key(Some(v));
            let joined = if left {
                l.left_join_on_foreign_key(&r, foreign_key, |a, c| {
                    fns::pair(Some(a), c.map(String::as_str))
                })
            } else {
                l.join_on_foreign_key(&r, foreign_key, |a, c| fns::pair(Some(a), Some(c)))
            };
            joined.to_change_stream().to("out");
        }
        Op::GlobalJoin { left } => {
            let g = b.global_table::<String, String>("right");
            let s = b.stream::<Option<String>, String>("left");
            let foreign_key = |_: &Option<String>, v: &String| fns::foreign_key(Some(v));
            if left {
                s.left_join_global(&g, foreign_key, |v, c| {
                    fns::pair(Some(&v), c.map(String::as_str))
                })
                .to("out");
            } else {
                s.join_global(&g, foreign_key, |v, c| fns::pair(Some(&v), Some(c)))
                    .to("out");
            }
        }
        Op::VersionedJoin {
            left,
            retention,
            grace,
        } => {
            let table = b.table_with::<String, String>(
                "right",
                Consumed::default().versioned(ms(retention)),
            );
            let stream = b.stream::<String, String>("left");
            let joined = grace.map_or_else(Joined::default, |g| Joined::with_grace_period(ms(g)));
            if left {
                stream.left_join_with(
                    &table,
                    |v, t| fns::pair(Some(&v), t.map(String::as_str)),
                    joined,
                )
            } else {
                stream.join_with(&table, |v, t| fns::pair(Some(&v), Some(t)), joined)
            }
            .to("out");
        }
        Op::Suppress { limit_ms } => b
            .table::<String, String>("left")
            .suppress(Suppressed::until_time_limit(ms(limit_ms)))
            .to_change_stream()
            .to("out"),
    }
    Built {
        topology: b.build().expect("a catalogue topology builds"),
        outputs,
        collected,
    }
}

/// A value as Java's string concatenation shows it: `null` for none.
fn text(v: Option<String>) -> String {
    v.unwrap_or_else(|| "null".to_string())
}

/// The handler of [`Op::Process`]: counts each key's records and emits `value#count`.
struct Counter;

impl Handler for Counter {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = i64;

    fn handle(
        &self,
        r: Record<'_, String, String>,
        n: Option<i64>,
    ) -> HandlerResult<String, String, i64> {
        let n = n.unwrap_or(0) + 1;
        Ok(Step::none()
            .emit("out", r.key, format!("{}#{n}", r.value))
            .set_state(n))
    }
}

/// Runs `scenario` through Parsley's test driver.
pub fn run(scenario: &Scenario) -> Outcome {
    let built = build(&scenario.op);
    let mut driver =
        TopologyTestDriver::builder(built.topology).partitions("left", scenario.partitions);
    if scenario.op.reads_right() {
        driver = driver.partitions("right", scenario.partitions);
    }
    let driver = match driver.build() {
        Ok(d) => d,
        Err(e) => {
            return Outcome {
                outputs: None,
                error: Some(format!("the driver did not start: {e}")),
            };
        }
    };
    let mut error = None;
    for input in &scenario.inputs {
        let record = RawInput::new(
            input.key.as_deref().map(str::as_bytes),
            input.value.as_deref().map(str::as_bytes),
        )
        .timestamp(input.ts);
        if let Err(e) = driver.pipe_raw(&input.topic, record) {
            error = Some(e.to_string());
            break;
        }
    }
    let mut outputs = Outputs::new();
    for (topic, keys) in built.outputs {
        let mut out = driver
            .output_topic(&topic, parsley_stage::Bytes, parsley_stage::Bytes)
            .expect("a sink of the topology");
        let records = std::iter::from_fn(|| out.read_raw_record())
            .map(|r| Output {
                key: r.key.map(|k| render_key(&k, keys)),
                value: r.value.map(|v| String::from_utf8_lossy(&v).into_owned()),
                ts: r.timestamp,
            })
            .collect();
        outputs.insert(topic, records);
    }
    if let Some(seen) = built.collected {
        let seen = seen.lock().expect("one driver thread").clone();
        outputs.insert("out".to_string(), seen);
    }
    Outcome {
        outputs: Some(outputs),
        error,
    }
}

/// A key's bytes as text: UTF-8, or a windowed key's JSON as `key@start/end`.
fn render_key(bytes: &[u8], kind: KeyKind) -> String {
    match kind {
        KeyKind::Text => String::from_utf8_lossy(bytes).into_owned(),
        KeyKind::Windowed => match serde_json::from_slice::<Windowed<String>>(bytes) {
            Ok(w) => format!("{}@{}/{}", w.key, w.start, w.end),
            Err(e) => format!("<not a windowed key: {e}>"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Input;

    fn input(key: &str, value: &str, ts: i64) -> Input {
        Input {
            topic: "left".into(),
            key: Some(key.into()),
            value: Some(value.into()),
            ts,
        }
    }

    #[test]
    fn functions_match_the_kafka_streams_program() {
        assert!(fns::even(Some("12")) && !fns::even(Some("3")) && !fns::even(None));
        assert!(!fns::even(Some("")));
        assert_eq!(fns::bucket(Some("5")), "k2");
        assert_eq!(fns::bucket(Some("x")), "k0");
        assert_eq!(fns::bucket(None), "k0");
        assert_eq!(fns::pair(Some("a"), None), "a/null");
        assert_eq!(fns::chars(Some("12")), ["1", "2"]);
        assert_eq!(fns::tick(None), "null");
        assert_eq!(fns::foreign_key(Some("5")).as_deref(), Some("b"));
        assert_eq!(fns::foreign_key(Some("x")).as_deref(), Some("a"));
        assert_eq!(fns::foreign_key(Some("7")), None);
    }

    #[test]
    fn a_count_renders_as_kafka_streams_renders_it() {
        let outcome = run(&Scenario {
            op: Op::Count {
                group: Grouping::ByKey,
                named: false,
            },
            partitions: 1,
            inputs: vec![input("a", "1", 5), input("a", "2", 7)],
        });
        assert_eq!(outcome.error, None);
        let out = &outcome.outputs.unwrap()["out"];
        let text: Vec<String> = out.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["a=1@5", "a=2@7"]);
    }
}
