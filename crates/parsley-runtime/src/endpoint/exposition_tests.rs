//! The exposition in memory: names, units, types, labels and values.

use parsley_testkit::exposition::Exposition;

use super::*;
use parsley_task::client_stats::{BrokerRtt, ClientDigest, PartitionLag, TransactionState};

fn task(partition: i32, phase: TaskPhase) -> TaskMetrics {
    TaskMetrics {
        partition,
        phase,
        restore_position: 7,
        restore_end: 9,
        restore_start: 3,
        restore_ms: 0,
        restore_records: 0,
        rollbacks: 0,
        restores: 0,
        delivered: 11,
        held: 2,
        gate_wait_us: 250_000,
        max_gate_wait_us: 200_000,
        blocked_heads: 1,
        impossible_stamps: 0,
        frontier_lag: None,
        parked: 0,
        max_parked: 0,
        late: 0,
        raised: 0,
        watermark_ms: None,
        catching_up: 0,
        ticks: 0,
        timers: 0,
    }
}

/// Two stages: `ledger` running with a restoring task and a running one and both clients'
/// statistics; `facts` ended, with no task.
fn views() -> Vec<StageView> {
    let mut running = task(1, TaskPhase::Running);
    running.frontier_lag = Some(3);
    running.watermark_ms = Some(1_700_000_000_123);
    let mut metrics = MetricsSnapshot {
        delivered: 42,
        gate_wait_us: 1_500_000,
        max_gate_wait_us: 900_000,
        transactions: 3,
        commit_us: 75_000,
        state_memory: [3 << 20, 2 << 20, 1 << 20],
        state_memory_bound: 8 << 20,
        memory_pauses: 2,
        memory_spilled: 5,
        ..MetricsSnapshot::default()
    };
    metrics.bad_records.handler = 4;
    let clients = ClientStatistics {
        consumer: Some(ClientDigest {
            lag: vec![PartitionLag {
                topic: "stock".into(),
                partition: 1,
                lag: 12,
            }],
            rtt: vec![BrokerRtt {
                broker: 1,
                p50: 0.0015,
                p99: 0.25,
            }],
            transaction: None,
        }),
        producer: Some(ClientDigest {
            transaction: Some(TransactionState {
                state: "InTransaction".into(),
            }),
            ..ClientDigest::default()
        }),
    };
    vec![
        StageView {
            name: "ledger".into(),
            bad_record_policy: "skip",
            impossible_policy: "fail",
            running: true,
            metrics,
            tasks: vec![task(0, TaskPhase::Restoring), running],
            clients: vec![clients, ClientStatistics::default()],
            thread_tasks: vec![1, 1],
            ownership: Some(Ownership {
                tasks: 4,
                unowned: 2,
            }),
            standbys: vec![StandbyMetrics {
                partition: 3,
                position: 120,
                end: Some(125),
                records: 118,
            }],
        },
        StageView {
            name: "facts".into(),
            bad_record_policy: "fail",
            impossible_policy: "dead-letter",
            running: false,
            metrics: MetricsSnapshot::default(),
            tasks: Vec::new(),
            clients: vec![ClientStatistics::default()],
            thread_tasks: vec![0],
            ownership: None,
            standbys: Vec::new(),
        },
    ]
}

pub(super) fn scrape() -> Exposition {
    let text = encode(views());
    Exposition::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn every_family_is_described_typed_and_named_by_the_prometheus_conventions() {
    let scraped = scrape();
    let names: Vec<String> = families().iter().map(Family::exported_name).collect();
    let typed: Vec<&str> = scraped.types.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(typed, names, "every family, in the order of families()");
    for f in families() {
        let name = f.exported_name();
        assert!(name.starts_with("parsley_"), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{name}"
        );
        let kind = scraped.kind(&name).unwrap();
        match f.kind {
            Kind::Counter => {
                assert_eq!(kind, "counter", "{name}");
                assert!(name.ends_with("_total"), "{name}");
            }
            Kind::Gauge => {
                assert_eq!(kind, "gauge", "{name}");
                assert!(!name.ends_with("_total"), "{name}");
            }
        }
        if let Some(unit) = f.unit {
            let base = name.trim_end_matches("_total");
            assert!(base.ends_with(&format!("_{unit}")), "{name}: unit {unit}");
        }
        assert!(!name.contains("_ms") && !name.contains("_us"), "{name}");
        assert!(scraped.help[&name].ends_with('.'), "{name}: help");
    }
    for sample in &scraped.samples {
        assert!(sample.labels.contains_key("stage"), "{sample:?}");
        if sample.name.starts_with("parsley_task_") {
            assert!(sample.labels.contains_key("partition"), "{sample:?}");
        }
    }
}

#[test]
fn values_are_the_stages_figures_in_the_units_their_names_say() {
    let s = scrape();
    let ledger = [("stage", "ledger")];
    assert_eq!(s.value("parsley_stage_running", &ledger), Some(1.0));
    assert_eq!(
        s.value("parsley_stage_running", &[("stage", "facts")]),
        Some(0.0)
    );
    // Tasks no member holds: absent while the group could not be described.
    assert_eq!(
        s.value("parsley_stage_unowned_partitions", &ledger),
        Some(2.0)
    );
    assert_eq!(
        s.value("parsley_stage_unowned_partitions", &[("stage", "facts")]),
        None
    );
    assert_eq!(
        s.value("parsley_records_delivered_total", &ledger),
        Some(42.0)
    );
    // A standby's lag: high watermark 125, next offset 120.
    let standby = [("stage", "ledger"), ("partition", "3")];
    assert_eq!(s.value("parsley_standby_lag_offsets", &standby), Some(5.0));
    assert_eq!(
        s.value("parsley_standby_records_read_total", &standby),
        Some(118.0)
    );
    // µs become seconds.
    assert_eq!(
        s.value("parsley_gate_wait_seconds_total", &ledger),
        Some(1.5)
    );
    assert_eq!(s.value("parsley_gate_wait_max_seconds", &ledger), Some(0.9));
    assert_eq!(
        s.value("parsley_transactions_committed_total", &ledger),
        Some(3.0)
    );
    assert_eq!(
        s.value("parsley_commit_seconds_total", &ledger),
        Some(0.075)
    );
    // Bad records: one series per kind, labelled with the stage's policy.
    let bad = s.samples("parsley_bad_records_total", &ledger);
    assert_eq!(bad.len(), BadRecordKind::ALL.len());
    assert!(bad.iter().all(|b| b.labels["policy"] == "skip"));
    assert_eq!(
        s.value(
            "parsley_bad_records_total",
            &[("stage", "ledger"), ("kind", "handler")]
        ),
        Some(4.0)
    );
    assert_eq!(
        s.value(
            "parsley_impossible_stamps_total",
            &[("stage", "facts"), ("policy", "dead-letter")]
        ),
        Some(0.0)
    );
    // Tasks: the phase as a pair of series; unknown figures left out.
    let p0 = [("stage", "ledger"), ("partition", "0")];
    let p1 = [("stage", "ledger"), ("partition", "1")];
    let phase = |p: &[(&str, &str)], name: &str| {
        let mut labels = p.to_vec();
        labels.push(("phase", name));
        s.value("parsley_task_phase", &labels)
    };
    assert_eq!(
        (phase(&p0, "restoring"), phase(&p0, "running")),
        (Some(1.0), Some(0.0))
    );
    assert_eq!(
        (phase(&p1, "restoring"), phase(&p1, "running")),
        (Some(0.0), Some(1.0))
    );
    assert_eq!(s.value("parsley_task_restore_next_offset", &p0), Some(7.0));
    assert_eq!(s.value("parsley_task_restore_end_offset", &p0), Some(9.0));
    assert_eq!(s.value("parsley_task_restore_start_offset", &p0), Some(3.0));
    assert_eq!(
        s.value("parsley_task_records_delivered_total", &p1),
        Some(11.0)
    );
    assert_eq!(
        s.value("parsley_task_gate_wait_seconds_total", &p1),
        Some(0.25)
    );
    assert_eq!(s.value("parsley_task_frontier_lag_offsets", &p0), None);
    assert_eq!(s.value("parsley_task_frontier_lag_offsets", &p1), Some(3.0));
    assert_eq!(
        s.value("parsley_task_watermark_timestamp_seconds", &p1),
        Some(1_700_000_000.123)
    );
    assert_eq!(
        s.value("parsley_task_watermark_timestamp_seconds", &p0),
        None
    );
    // librdkafka's figures.
    assert_eq!(
        s.value(
            "parsley_kafka_consumer_lag_offsets",
            &[("stage", "ledger"), ("topic", "stock"), ("partition", "1")]
        ),
        Some(12.0)
    );
    let rtt = |quantile| {
        s.value(
            "parsley_kafka_request_rtt_seconds",
            &[
                ("stage", "ledger"),
                ("client", "consumer"),
                ("broker", "1"),
                ("quantile", quantile),
            ],
        )
    };
    assert_eq!((rtt("0.5"), rtt("0.99")), (Some(0.0015), Some(0.25)));
    assert_eq!(
        s.value(
            "parsley_kafka_transaction_state",
            &[("stage", "ledger"), ("state", "InTransaction")]
        ),
        Some(1.0)
    );
    // A stage without statistics has no series of them.
    assert!(
        s.samples("parsley_kafka_transaction_state", &[("stage", "facts")])
            .is_empty()
    );
    // librdkafka's figures are per client: each stream thread's under its `thread`; the
    // second thread of `ledger` reported none.
    assert_eq!(
        s.value(
            "parsley_kafka_transaction_state",
            &[
                ("stage", "ledger"),
                ("thread", "0"),
                ("state", "InTransaction")
            ]
        ),
        Some(1.0)
    );
    assert!(
        s.samples(
            "parsley_kafka_transaction_state",
            &[("stage", "ledger"), ("thread", "1")]
        )
        .is_empty()
    );
    // The tasks of each thread.
    for (stage, thread, tasks) in [
        ("ledger", "0", 1.0),
        ("ledger", "1", 1.0),
        ("facts", "0", 0.0),
    ] {
        assert_eq!(
            s.value(
                "parsley_stage_thread_tasks",
                &[("stage", stage), ("thread", thread)]
            ),
            Some(tasks),
            "{stage} {thread}"
        );
    }
}

#[test]
fn label_values_are_escaped() {
    let mut stage = views().remove(1);
    stage.name = "odd \"name\" \\ with\na newline".into();
    let text = encode(vec![stage]);
    let scraped = Exposition::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        scraped.value(
            "parsley_stage_running",
            &[("stage", "odd \"name\" \\ with\na newline")]
        ),
        Some(0.0)
    );
}

#[test]
fn the_book_lists_every_exported_metric() {
    let book = include_str!("../../../../book/src/operations.md");
    let missing: Vec<String> = families()
        .iter()
        .map(Family::exported_name)
        .filter(|name| !book.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in book/src/operations.md: {missing:?}"
    );
}
