//! The metrics endpoint on the real broker, scraped with an HTTP client:
//! - `/metrics` shows what `Running::metrics()` and `Running::task_metrics()` say, and
//!   librdkafka's consumer lag, round-trip times and transaction state once the clients have
//!   reported them (the user's statistics sink still gets every document);
//! - `/health/ready` is 503 while a task restores, 200 once restored, 503 naming the error
//!   after the stage failed; `/health/live` is 200 throughout;
//! - the listener is closed when `Running::stop` returns.

use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use parsley_runtime::SetupError;
use parsley_runtime::{
    Error, Running, Runtime, RuntimeConfig, StatisticsSink, TaskPhase, TopicSpec, changelog_topic,
};
use parsley_stage::{ImpossiblePolicy, Topology};
use parsley_testkit::exposition::Exposition;
use parsley_testkit::fixtures::http_get as get;
use parsley_testkit::fixtures::{
    CountKeys, DEADLINE, admin, bootstrap, create_topic, forward_topology, key_on, next_failure,
    raw_producer, send_stamped, unique_topic, utf8_stage, wait_committed, wait_tasks,
};
use rdkafka::producer::{BaseRecord, Producer};

/// `/metrics`, parsed.
fn scrape(address: SocketAddr) -> Exposition {
    let (status, text) = get(address, "/metrics");
    assert_eq!(status, 200, "{text}");
    Exposition::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The endpoint's address, with the port the listener picked.
fn address(running: &Running) -> SocketAddr {
    let address = running.metrics_address().expect("the endpoint runs");
    assert_ne!(address.port(), 0);
    address
}

fn on_port_0() -> RuntimeConfig {
    RuntimeConfig::new(bootstrap()).metrics_address(([127, 0, 0, 1], 0))
}

/// Writes each `(partition, value)` with a key of that partition (of `partitions`).
fn send(topic: &str, partitions: i32, records: &[(i32, &str)]) {
    let producer = raw_producer(None);
    for (partition, value) in records {
        let key = key_on(*partition, partitions);
        producer
            .send(
                BaseRecord::<str, str>::to(topic)
                    .partition(*partition)
                    .key(&key)
                    .payload(*value),
            )
            .expect("queued");
    }
    producer.flush(DEADLINE).expect("flushed");
}

#[test]
fn a_scrape_shows_the_stage_and_task_metrics_and_the_clients_statistics() {
    let input = create_topic("scrape-in", 2);
    let output = create_topic("scrape-out", 2);
    let topology = forward_topology(
        &unique_topic("scrape"),
        &[input.name.as_str()],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let (docs, documents) = channel::<String>();
    let sink = StatisticsSink::new(move |json| {
        let _ = docs.send(String::from_utf8_lossy(json).into_owned());
    });
    let config = on_port_0().statistics(Duration::from_millis(100), sink);
    let running = Runtime::new(topology, config).start().unwrap();
    let address = address(&running);
    let records: Vec<(i32, &str)> = (0..10).map(|i| (i % 2, "v")).collect();
    send(&input.name, 2, &records);
    wait_committed(&running, "forward", 10);
    // Every channel has had a fetch response: the frontier lag is known.
    wait_tasks(&running, "forward", "both frontier lags known", |t| {
        t.len() == 2 && t.iter().all(|t| t.frontier_lag.is_some())
    });

    let before = running.metrics()[0].1;
    let scraped = scrape(address);
    let after = running.metrics()[0].1;
    let stage = [("stage", "forward")];
    let value = |name: &str| {
        scraped
            .value(name, &stage)
            .unwrap_or_else(|| panic!("{name}"))
    };
    // Nothing moves these any more: all ten records are delivered and committed.
    assert_eq!(before.committed_deliveries, 10);
    for (name, figure) in [
        ("parsley_records_fetched_total", after.fetched),
        ("parsley_records_delivered_total", after.delivered),
        (
            "parsley_committed_deliveries_total",
            after.committed_deliveries,
        ),
        ("parsley_records_emitted_total", after.emitted),
        (
            "parsley_committed_emissions_total",
            after.committed_emissions,
        ),
        ("parsley_records_held_total", after.held),
    ] {
        assert_eq!(value(name), figure as f64, "{name}");
    }
    let transactions = value("parsley_transactions_committed_total");
    assert!(
        (before.transactions as f64..=after.transactions as f64).contains(&transactions),
        "{transactions} between {} and {}",
        before.transactions,
        after.transactions
    );
    assert_eq!(value("parsley_stage_running"), 1.0);
    assert_eq!(
        scraped.value(
            "parsley_bad_records_total",
            &[
                ("stage", "forward"),
                ("kind", "handler"),
                ("policy", "fail")
            ]
        ),
        Some(0.0)
    );

    let tasks = &running.task_metrics()[0].1;
    assert_eq!(tasks.len(), 2);
    for t in tasks {
        let partition = t.partition.to_string();
        let labels = [("stage", "forward"), ("partition", partition.as_str())];
        assert_eq!(
            scraped.value("parsley_task_records_delivered_total", &labels),
            Some(t.delivered as f64)
        );
        assert_eq!(t.delivered, 5);
        let mut running_phase = labels.to_vec();
        running_phase.push(("phase", "running"));
        assert_eq!(
            scraped.value("parsley_task_phase", &running_phase),
            Some(1.0)
        );
        let lag = scraped
            .value("parsley_task_frontier_lag_offsets", &labels)
            .expect("a known frontier lag is exported");
        assert!(lag >= 0.0, "{lag}");
    }
    let (status, reason) = get(address, "/health/ready");
    assert_eq!(
        (status, reason.as_str()),
        (200, "ready: 1 stage(s) running, 2 task(s) restored\n")
    );

    // librdkafka's figures, once both clients have reported after the commit (the digest is
    // taken before the user's sink gets a document), until the consumer's lag is zero.
    let started = Instant::now();
    let (mut consumer, mut producer) = (false, false);
    let scraped = loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        let json = documents
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no statistics of both clients within {DEADLINE:?}"));
        consumer |= json.contains("\"type\": \"consumer\"");
        producer |= json.contains("\"type\": \"producer\"");
        if !(consumer && producer) {
            continue;
        }
        let scraped = scrape(address);
        let lags = scraped.samples(
            "parsley_kafka_consumer_lag_offsets",
            &[("stage", "forward"), ("topic", input.name.as_str())],
        );
        // Everything written was fetched: the lag reaches zero.
        if lags.len() == 2 && lags.iter().all(|l| l.value == 0.0) {
            break scraped;
        }
    };
    let states = scraped.samples("parsley_kafka_transaction_state", &stage);
    assert_eq!(states.len(), 1, "one state: {states:?}");
    assert_eq!(states[0].value, 1.0);
    let rtts = scraped.samples(
        "parsley_kafka_request_rtt_seconds",
        &[
            ("stage", "forward"),
            ("client", "consumer"),
            ("quantile", "0.99"),
        ],
    );
    assert!(!rtts.is_empty(), "the consumer's round trips");
    assert!(
        rtts.iter().all(|r| r.value > 0.0 && r.value < 60.0),
        "{rtts:?}"
    );

    running.stop().unwrap();
    assert!(
        TcpStream::connect(address).is_err(),
        "the listener is closed once stop returns"
    );
}

#[test]
fn readiness_waits_for_the_restore_and_names_the_error_of_a_failed_stage() {
    let input = create_topic("ready-in", 1);
    let output = create_topic("ready-out", 1);
    let app = unique_topic("ready");
    let topology = Topology::builder(&app)
        .stage(
            "count",
            CountKeys::failing_once_on(&output.name, "poison"),
            |s| utf8_stage(s, &[input.name.as_str()], &[output.name.as_str()]),
        )
        .build()
        .unwrap();
    // A transaction left open on the task's changelog partition holds its restore.
    let changelog = changelog_topic(&format!("{app}.count"));
    admin()
        .create_topics(&[TopicSpec::new(&changelog, 1).config("cleanup.policy", "compact")])
        .unwrap();
    let other = raw_producer(Some(&unique_topic("ready-txn")));
    other.begin_transaction().unwrap();
    send_stamped(&other, &changelog, 0, b"\x00k", b"1", None);

    let running = Runtime::new(topology, on_port_0()).start().unwrap();
    let address = address(&running);
    wait_tasks(&running, "count", "the task restoring", |t| {
        t.len() == 1 && t[0].phase == TaskPhase::Restoring
    });
    let (status, reason) = get(address, "/health/ready");
    assert_eq!(status, 503, "{reason}");
    assert!(
        reason.starts_with("not ready: stage count is restoring task(s) 0 ("),
        "{reason}"
    );
    assert_eq!(get(address, "/health/live"), (200, "live\n".into()));
    let restoring = [
        ("stage", "count"),
        ("partition", "0"),
        ("phase", "restoring"),
    ];
    assert_eq!(
        scrape(address).value("parsley_task_phase", &restoring),
        Some(1.0)
    );

    // The transaction ends: the restore reads past it.
    other.abort_transaction(DEADLINE).unwrap();
    wait_tasks(&running, "count", "the task restored", |t| {
        t.len() == 1 && t[0].phase == TaskPhase::Running
    });
    assert_eq!(
        get(address, "/health/ready"),
        (
            200,
            "ready: 1 stage(s) running, 1 task(s) restored\n".into()
        )
    );
    send(&input.name, 1, &[(0, "a")]);
    wait_committed(&running, "count", 1);
    assert_eq!(get(address, "/health/ready").0, 200);

    // A poisoned record: the handler fails and the stage stops (policy Fail).
    send(&input.name, 1, &[(0, "poison")]);
    let error = next_failure(&running);
    let (status, reason) = get(address, "/health/ready");
    assert_eq!(status, 503, "{reason}");
    assert!(
        reason.starts_with("not ready: stage count failed: "),
        "{reason}"
    );
    assert!(
        reason.contains("dying before the commit"),
        "{reason} ({error})"
    );
    assert_eq!(get(address, "/health/live"), (200, "live\n".into()));
    assert_eq!(
        scrape(address).value("parsley_stage_running", &[("stage", "count")]),
        Some(0.0)
    );

    let stopped = running.stop();
    assert!(
        matches!(stopped, Err(Error::StageFailed { ref stage, .. }) if stage == "count"),
        "{stopped:?}"
    );
    assert!(TcpStream::connect(address).is_err(), "closed after stop");
}

#[test]
fn a_second_start_on_a_port_in_use_fails_and_starts_nothing() {
    let input = create_topic("port-in", 1);
    let output = create_topic("port-out", 1);
    let topology = forward_topology(
        &unique_topic("port"),
        &[input.name.as_str()],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let runtime = Runtime::new(topology.clone(), on_port_0());
    let first = runtime.start().unwrap();
    let taken = address(&first);
    let second = Runtime::new(
        topology,
        RuntimeConfig::new(bootstrap()).metrics_address(taken),
    )
    .start();
    match second {
        Err(Error::Setup(SetupError::MetricsListener { address, .. })) => {
            assert_eq!(address, taken)
        }
        other => panic!("not a listener error: {other:?}"),
    }
    first.stop().unwrap();
    // Freed by the stop: the same port serves again at once.
    let again = Runtime::new(
        forward_topology(
            &unique_topic("port"),
            &[input.name.as_str()],
            &output.name,
            ImpossiblePolicy::Fail,
        ),
        RuntimeConfig::new(bootstrap()).metrics_address(taken),
    )
    .start()
    .unwrap();
    assert_eq!(again.metrics_address(), Some(taken));
    assert_eq!(get(taken, "/health/live").0, 200);
    again.stop().unwrap();
}
