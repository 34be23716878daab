//! The metrics endpoint: an HTTP/1.1 listener serving the stages' metrics and health
//! ([`RuntimeConfig::metrics_address`](crate::RuntimeConfig::metrics_address)).
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | 200, every metric in the Prometheus text format (version 0.0.4) |
//! | `GET /health/live` | 200 `live` while the endpoint runs |
//! | `GET /health/ready` | 200 once every stage has an assignment and every task is restored; 503 with the reasons while not (restoring, waiting for an assignment, a commit that has waited long on a coordinator, a stage that ended, a stop under way); either answer names the stages whose groups have tasks no member holds |
//! | `GET /store/{name}/{key}` | the value of a `String` key in a store, as JSON; with `?stale=true` from a standby too, with its source and lag (module `store` says how the key is given and what each status means) |
//! | `GET /explain` | 200, why each stage waits, as JSON ([`Explanation`](crate::Explanation), what [`Running::explain`](crate::Running::explain) returns; answered within [`ANSWER_WITHIN`](crate::ANSWER_WITHIN)) |
//! | other paths | 404; other methods than `GET` and `HEAD`: 405 |
//!
//! One thread accepts connections; each connection gets a thread of its own (at most
//! [`MAX_CONNECTIONS`] at a time: beyond, a 503 at once), reads one request head (at most
//! [`MAX_HEAD`] bytes, within [`IO_TIMEOUT`]), answers it and closes (`Connection: close`).
//! `httparse` parses the request head. Closing the endpoint stops the accept thread and joins it,
//! so the listener is closed — its port free again — when [`Endpoint::close`] returns; a
//! connection being answered then finishes on its own thread.

mod exposition;
mod health;
mod store;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parsley_stage::StageSpec;
use tracing::{debug, warn};

use crate::shutdown::Shutdown;
use crate::threads::StageThreads;
use parsley_task::error::SetupError;
use parsley_task::error::{Error, Result};

use self::exposition::StageView;
use self::health::StageHealth;

/// Connections answered at once; more get a 503 at once.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// The longest request head read, bytes.
pub(crate) const MAX_HEAD: usize = 8 * 1024;

/// How long a connection may take to send its request head, and to take the answer.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the endpoint serves: the stages of one [`Running`](crate::Running) and its shutdown
/// signal.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    /// Each stage's spec and the live metrics of its stream threads.
    pub(crate) stages: Arc<[(StageSpec, StageThreads)]>,
    /// Triggered once a stop was asked for.
    pub(crate) shutdown: Shutdown,
}

/// A listener serving [`Served`] on its own thread until closed (or dropped).
#[derive(Debug)]
pub(crate) struct Endpoint {
    address: SocketAddr,
    closing: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Binds `address` (port 0: a free port) and serves `served` there from a thread of its
    /// own.
    ///
    /// # Errors
    /// [`SetupError::MetricsListener`] when the address cannot be bound or the thread cannot be
    /// spawned.
    pub(crate) fn start(address: SocketAddr, served: Served) -> Result<Endpoint> {
        let failed = |source| Error::Setup(SetupError::MetricsListener { address, source });
        let listener = TcpListener::bind(address).map_err(failed)?;
        let bound = listener.local_addr().map_err(failed)?;
        let closing = Arc::new(AtomicBool::new(false));
        let stop = closing.clone();
        let accept = std::thread::Builder::new()
            .name("parsley-metrics".into())
            .spawn(move || accept_loop(listener, &served, &stop))
            .map_err(failed)?;
        Ok(Endpoint {
            address: bound,
            closing,
            accept: Some(accept),
        })
    }

    /// The address the listener is bound to.
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops accepting and closes the listener: returns once it is closed.
    pub(crate) fn close(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.closing.store(true, Ordering::SeqCst);
        // The accept thread is blocked in `accept`: a connection of our own wakes it.
        let wake = SocketAddr::new(reachable(self.address.ip()), self.address.port());
        match TcpStream::connect_timeout(&wake, IO_TIMEOUT) {
            Ok(_) => {
                let _ = accept.join();
            }
            Err(e) => warn!(
                address = %self.address,
                error = %e,
                "the metrics endpoint cannot wake its own listener: it closes at its next connection"
            ),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close();
    }
}

/// An address of this host for a listener bound to `ip`: the loopback address for a wildcard.
fn reachable(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
        IpAddr::V6(v6) if v6.is_unspecified() => Ipv6Addr::LOCALHOST.into(),
        other => other,
    }
}

/// Accepts connections until `closing`, each answered on a thread of its own.
fn accept_loop(listener: TcpListener, served: &Served, closing: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if closing.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors, a connection reset before it was taken, …: the next
                // accept may work; do not spin on a persistent error.
                debug!(error = %e, "metrics endpoint: accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
            let _ = respond(
                &mut stream,
                &Answer::text(503, "busy: too many connections\n"),
                false,
            );
            continue;
        }
        let (served, slot) = (served.clone(), Slot(active.clone()));
        let spawned = std::thread::Builder::new()
            .name("parsley-metrics-conn".into())
            .spawn(move || {
                let _slot = slot;
                answer_connection(stream, &served);
            });
        if let Err(e) = spawned {
            debug!(error = %e, "metrics endpoint: no thread for a connection");
        }
    }
}

/// A connection's place among the [`MAX_CONNECTIONS`]: given back when its thread ends, even
/// by a panic.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    content_type: &'static str,
    body: String,
    /// Methods allowed, for a 405.
    allow: Option<&'static str>,
}

impl Answer {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            allow: None,
        }
    }
}

/// Reads one request head from `stream` and answers it.
fn answer_connection(mut stream: TcpStream, served: &Served) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let (answer, head_only) = loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        head.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&head) {
            Ok(httparse::Status::Complete(_)) => {
                let method = request.method.unwrap_or_default();
                let path = request.path.unwrap_or_default();
                break (route(method, path, served), method == "HEAD");
            }
            Ok(httparse::Status::Partial) if head.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                break (Answer::text(431, "request head too large\n"), false);
            }
            Err(e) => break (Answer::text(400, format!("bad request: {e}\n")), false),
        }
    };
    if let Err(e) = respond(&mut stream, &answer, head_only) {
        debug!(error = %e, "metrics endpoint: the answer was not taken");
    }
}

/// The answer to `method` on `path` (its query ignored but by `/store`).
fn route(method: &str, path: &str, served: &Served) -> Answer {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    if let Some(rest) = path.strip_prefix("/store/") {
        if method != "GET" && method != "HEAD" {
            return Answer {
                allow: Some("GET, HEAD"),
                ..Answer::text(405, "method not allowed: GET or HEAD\n")
            };
        }
        return store::answer(rest, query, served);
    }
    if !["/metrics", "/health/live", "/health/ready", "/explain"].contains(&path) {
        return Answer::text(
            404,
            "not found: the paths are /metrics, /health/live, /health/ready, /explain and /store/{name}/{key}\n",
        );
    }
    if method != "GET" && method != "HEAD" {
        return Answer {
            allow: Some("GET, HEAD"),
            ..Answer::text(405, "method not allowed: GET or HEAD\n")
        };
    }
    match path {
        "/metrics" => Answer {
            content_type: exposition::CONTENT_TYPE,
            ..Answer::text(200, metrics_text(served))
        },
        "/health/live" => Answer::text(200, "live\n"),
        "/explain" => Answer {
            content_type: "application/json",
            ..Answer::text(200, explain_json(served))
        },
        _ => match health::readiness(&health_of(served), served.shutdown.is_triggered()) {
            Ok(line) => Answer::text(200, format!("{line}\n")),
            Err(reason) => Answer::text(503, format!("{reason}\n")),
        },
    }
}

/// The metrics of `served` in the Prometheus text format.
fn metrics_text(served: &Served) -> String {
    exposition::encode(
        served
            .stages
            .iter()
            .map(|(spec, metrics)| StageView::of(spec, metrics))
            .collect(),
    )
}

/// Why each stage of `served` waits, as JSON.
fn explain_json(served: &Served) -> String {
    let explanation = crate::threads::merge_threads(parsley_task::metrics::explain_stages(
        served.stages.iter().flat_map(|(spec, threads)| {
            threads
                .threads()
                .iter()
                .map(|metrics| (spec.name(), metrics.as_ref(), false))
        }),
    ));
    // Plain data (strings, numbers, options, vectors): serialising it cannot fail.
    serde_json::to_string_pretty(&explanation).expect("an explanation serialises")
}

/// Where each stage of `served` stands.
fn health_of(served: &Served) -> Vec<StageHealth> {
    served
        .stages
        .iter()
        .map(|(spec, metrics)| StageHealth {
            name: spec.name().to_string(),
            assigned: metrics.is_assigned(),
            ended: metrics.ended(),
            tasks: metrics.tasks(),
            ownership: metrics.ownership(),
            commit_wait: metrics.commit_wait(),
        })
        .collect()
}

/// Writes `answer` (its head alone for a `HEAD` request) and closes the connection.
fn respond(stream: &mut TcpStream, answer: &Answer, head_only: bool) -> std::io::Result<()> {
    let reason = match answer.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    };
    let allow = answer
        .allow
        .map(|a| format!("Allow: {a}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        answer.status,
        answer.content_type,
        answer.body.len()
    );
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(answer.body.as_bytes())?;
    }
    stream.flush()?;
    stream.shutdown(std::net::Shutdown::Write)
}

#[cfg(test)]
mod tests;
