//! The endpoint on a loopback port, with stages that run nowhere: routes, statuses, health
//! as the stages' state moves, the connection cap, and the listener closed by `close`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use parsley_testkit::exposition::Exposition;

use super::*;
use parsley_task::metrics::{StageEnd, StageMetrics, TaskPhase};

/// A handler that is never run.
struct Idle;

impl parsley_stage::Handler for Idle {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();
    fn handle(
        &self,
        _: parsley_stage::Record<'_, String, String>,
        _: Option<()>,
    ) -> parsley_stage::HandlerResult<String, String, ()> {
        Ok(parsley_stage::Step::none())
    }
}

/// An endpoint on a free loopback port serving one stage, `idle`, with its metrics.
fn endpoint() -> (Endpoint, Arc<StageMetrics>, Shutdown) {
    let topology = parsley_stage::Topology::builder("app")
        .stage("idle", Idle, |s| s.source("in"))
        .build()
        .expect("a valid topology");
    let metrics = Arc::new(StageMetrics::default());
    let shutdown = Shutdown::new();
    let served = Served {
        stages: vec![(
            topology.stages()[0].clone(),
            crate::threads::StageThreads::one(metrics.clone()),
        )]
        .into(),
        shutdown: shutdown.clone(),
    };
    let endpoint = Endpoint::start(([127, 0, 0, 1], 0).into(), served).unwrap();
    (endpoint, metrics, shutdown)
}

fn get(address: SocketAddr, path: &str) -> minreq::Response {
    minreq::get(format!("http://{address}{path}"))
        .with_timeout(10)
        .send()
        .unwrap()
}

fn ready(address: SocketAddr) -> (u16, String) {
    let r = get(address, "/health/ready");
    (r.status_code, r.as_str().unwrap().to_string())
}

#[test]
fn metrics_and_liveness_are_served_and_other_requests_refused() {
    let (mut endpoint, metrics, _) = endpoint();
    let address = endpoint.address();
    assert_ne!(address.port(), 0, "port 0 asks for a free port");
    metrics.delivered();
    let r = get(address, "/metrics");
    assert_eq!(r.status_code, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let scraped = Exposition::parse(r.as_str().unwrap()).unwrap();
    assert_eq!(
        scraped.value("parsley_records_delivered_total", &[("stage", "idle")]),
        Some(1.0)
    );
    // A query string is ignored.
    assert_eq!(get(address, "/metrics?x=1").status_code, 200);
    let live = get(address, "/health/live");
    assert_eq!((live.status_code, live.as_str().unwrap()), (200, "live\n"));
    assert_eq!(get(address, "/").status_code, 404);
    let post = minreq::post(format!("http://{address}/metrics"))
        .with_timeout(10)
        .send()
        .unwrap();
    assert_eq!(post.status_code, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    let head = minreq::head(format!("http://{address}/health/live"))
        .with_timeout(10)
        .send()
        .unwrap();
    assert_eq!(head.status_code, 200);
    assert!(head.as_bytes().is_empty(), "a HEAD answer has no body");
    // Not HTTP at all.
    let mut raw = TcpStream::connect(address).unwrap();
    raw.write_all(b"\x00\x01 not a request\r\n\r\n").unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");

    endpoint.close();
    assert!(
        TcpStream::connect(address).is_err(),
        "the listener is closed when close returns"
    );
}

#[test]
fn readiness_follows_the_assignment_the_restores_and_the_stages_end() {
    let (endpoint, metrics, shutdown) = endpoint();
    let address = endpoint.address();
    assert_eq!(
        ready(address),
        (
            503,
            "not ready: stage idle waits for an assignment from its consumer group\n".into()
        )
    );
    metrics.set_assigned(true);
    metrics.task(0, |t| t.phase = TaskPhase::Restoring);
    metrics.task(1, |t| t.phase = TaskPhase::Running);
    let (status, reason) = ready(address);
    assert_eq!(status, 503);
    assert!(
        reason.contains("stage idle is restoring task(s) 0"),
        "{reason}"
    );
    metrics.task(0, |t| t.phase = TaskPhase::Running);
    assert_eq!(
        ready(address),
        (
            200,
            "ready: 1 stage(s) running, 2 task(s) restored\n".into()
        )
    );
    metrics.end(StageEnd::Failed("stage idle: handler: poisoned".into()));
    assert_eq!(
        ready(address),
        (
            503,
            "not ready: stage idle failed: stage idle: handler: poisoned\n".into()
        )
    );
    shutdown.trigger();
    assert!(ready(address).1.starts_with("not ready: stopping"));
    assert_eq!(
        get(address, "/health/live").status_code,
        200,
        "live throughout"
    );
}

#[test]
fn connections_beyond_the_cap_are_turned_away_at_once() {
    let (endpoint, _, _) = endpoint();
    let address = endpoint.address();
    // Connections that send nothing hold their threads (until IO_TIMEOUT).
    let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(address).unwrap())
        .collect();
    // Accepted in order: this one finds every slot taken.
    let r = get(address, "/health/live");
    assert_eq!(
        (r.status_code, r.as_str().unwrap()),
        (503, "busy: too many connections\n")
    );
    drop(idle);
}

#[test]
fn explain_serves_the_stream_threads_snapshot_as_json() {
    let (endpoint, metrics, _) = endpoint();
    let address = endpoint.address();
    let mut waiting = crate::TaskExplanation::new(2);
    waiting.blocked_not_listed = 5;
    // The stage's stream thread, as it answers between two turns.
    let thread = {
        let (metrics, waiting) = (metrics.clone(), waiting.clone());
        std::thread::spawn(move || {
            while !metrics.explained().wanted() {
                std::thread::yield_now();
            }
            metrics.explained().publish(vec![waiting]);
        })
    };
    let r = get(address, "/explain");
    thread.join().unwrap();
    assert_eq!(r.status_code, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let e: crate::Explanation = serde_json::from_str(r.as_str().unwrap()).unwrap();
    assert_eq!(e.stages.len(), 1);
    assert_eq!(e.stages[0].stage, "idle");
    assert!(e.stages[0].fresh);
    assert_eq!(e.stages[0].tasks, vec![waiting.clone()]);
    // Once the stage has ended it is not waited for: its last snapshot, not fresh.
    metrics.end(StageEnd::Stopped);
    let r = get(address, "/explain");
    let e: crate::Explanation = serde_json::from_str(r.as_str().unwrap()).unwrap();
    assert!(!e.stages[0].fresh);
    assert_eq!(e.stages[0].tasks, vec![waiting]);
}
