//! Windowed counting closed by evidence: a Parsley DSL pipeline on the runtime.
//!
//! ```text
//! events-00 ∪ events-01 ∪ … ∪ events-11
//!   .group_by_key()                       (product; no repartition: co-partitioned topics)
//!   .windowed_by(TimeWindows::of_size(size))
//!   .count()
//!   .to_stream()
//!   .peek(…)                              (notes when each result is emitted)
//!   .to(output)                           (key: Windowed<product> as JSON, value: the count)
//! ```
//!
//! One stage, ordered by event time with the built-in clock
//! (`EventTimeOrder::new().clock(lag).tick_interval_ms(tick)`), commit interval as set. Each
//! window's final result is emitted once, when the stage's watermark reaches its end (no
//! grace): during history that takes every input's offset evidence, live the clock passing
//! the end plus the lag. A record too late for its window is counted (`too_late`), never
//! folded in after the result.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parsley_dsl::{StreamsBuilder, TimeWindows, Windowed};
use parsley_runtime::{Running, Runtime, RuntimeConfig, changelog_topic};
use parsley_stage::{EventTimeOrder, Topology};

use super::WindowId;
use crate::error::{Error, Result};
use crate::workload::{Workload, parse_product};

/// Settings of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceSettings {
    /// Tumbling window size, ms.
    pub size_ms: i64,
    /// The built-in clock's lag, ms.
    pub lag_ms: i64,
    /// The built-in clock's tick interval, ms.
    pub tick_interval_ms: i64,
    /// The runtime's commit interval.
    pub commit_interval: Duration,
}

/// When each window's result was emitted (handed to the stage's producer, before its
/// commit), first emission only.
pub type Emitted = Arc<Mutex<HashMap<WindowId, Instant>>>;

/// The pipeline of application `application` on `workload`'s event topics, its results to
/// `output`; each result's emission is noted in `emitted` (a `peek` before the sink).
///
/// # Errors
/// [`Error::Config`] when it does not build.
pub fn topology(
    application: &str,
    workload: &Workload,
    output: &str,
    settings: &EvidenceSettings,
    emitted: Emitted,
) -> Result<Topology> {
    let size = u64::try_from(settings.size_ms)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| Error::config("window size", "must be positive"))?;
    let builder = StreamsBuilder::new(application);
    builder.event_time(
        EventTimeOrder::new()
            .clock(settings.lag_ms)
            .tick_interval_ms(settings.tick_interval_ms),
    );
    let topics = workload.event_topics();
    let (first, rest) = topics
        .split_first()
        .ok_or_else(|| Error::config("event_topics", "at least one is needed"))?;
    let merged = rest
        .iter()
        .fold(builder.stream::<String, String>(first), |s, t| {
            s.merge(&builder.stream::<String, String>(t))
        });
    merged
        .group_by_key()
        .named("count")
        .windowed_by(TimeWindows::of_size(Duration::from_millis(size)))
        .count()
        .to_stream()
        .peek(move |w: &Windowed<String>, _| {
            let now = Instant::now();
            if let (Ok(product), Ok(mut e)) = (parse_product(w.key.as_bytes()), emitted.lock()) {
                e.entry((product, w.start)).or_insert(now);
            }
        })
        .to(output);
    builder
        .build()
        .map_err(|e| Error::config("windowed topology", e.to_string()))
}

/// The internal topics the runtime makes for `topology` (changelogs, clock topics): to delete
/// after the run.
pub fn internal_topics(topology: &Topology, application: &str) -> Vec<String> {
    topology
        .stages()
        .iter()
        .flat_map(|s| {
            let mut t = vec![changelog_topic(&s.group_id(application))];
            t.extend(s.clock_topic().map(str::to_string));
            t
        })
        .chain(topology.internal_topics().iter().map(|t| t.name.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Starts the runtime on `topology`.
///
/// # Errors
/// [`Error::Runtime`] when it does not start.
pub fn start(bootstrap: &str, topology: Topology, settings: &EvidenceSettings) -> Result<Running> {
    Runtime::new(
        topology,
        RuntimeConfig::new(bootstrap).commit_interval(settings.commit_interval),
    )
    .start()
    .map_err(|e| Error::runtime("starting the windowed pipeline", e))
}

/// Parses a result as the pipeline writes it: (product, window start, count).
pub fn parse_result(key: &[u8], value: &[u8]) -> Option<(u32, i64, u64)> {
    let w: Windowed<String> = serde_json::from_slice(key).ok()?;
    let count: u64 = serde_json::from_slice(value).ok()?;
    Some((parse_product(w.key.as_bytes()).ok()?, w.start, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::WorkloadConfig;

    #[test]
    fn one_stage_reads_every_event_topic_and_results_parse_back() {
        let w = Workload::new(WorkloadConfig {
            event_topics: 3,
            ..WorkloadConfig::default()
        })
        .unwrap();
        let settings = EvidenceSettings {
            size_ms: 1_000,
            lag_ms: 20,
            tick_interval_ms: 20,
            commit_interval: Duration::from_millis(100),
        };
        let t = topology("app", &w, "counts", &settings, Emitted::default()).unwrap();
        assert_eq!(t.stages().len(), 1);
        let stage = &t.stages()[0];
        for topic in w.event_topics() {
            assert!(stage.sources().contains(&topic), "{topic}");
        }
        assert!(stage.clock_topic().is_some());
        let internal = internal_topics(&t, "app");
        assert!(
            internal.iter().any(|t| t.ends_with("-clock")),
            "{internal:?}"
        );
        assert_eq!(
            parse_result(br#"{"key":"p00042","start":1000,"end":2000}"#, b"3"),
            Some((42, 1_000, 3))
        );
        assert_eq!(parse_result(b"p00042", b"3"), None);
    }
}
