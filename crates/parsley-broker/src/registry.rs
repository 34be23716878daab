//! A local schema registry that speaks the subset of the Confluent Schema Registry REST API
//! (v1) that serializers use: register a schema under a subject, look a schema up under a
//! subject, fetch a schema by id, list subjects and versions. In memory; for tests and local
//! development, not for production.
//!
//! A stand-in for a quick local loop without Java: the tests run against a real registry,
//! Apicurio Registry ([`crate::apicurio`]). It answers what a registry answers to the
//! requests below, with the same JSON shapes and error codes, and does not check
//! compatibility between versions of a subject.
//!
//! Requests (paths under the server's root; a subject is percent-decoded):
//! - `POST /subjects/{subject}/versions` with `{"schema", "schemaType"?, "references"?}`:
//!   `{"id"}`. A schema (its type and text, byte for byte) has one id wherever it is
//!   registered; registering it again under a subject that has it returns the same id and
//!   adds no version.
//! - `POST /subjects/{subject}`: `{"subject", "id", "version", "schema", "schemaType"?}` of the
//!   version holding that schema, or 404 with `error_code` 40401 (no such subject) or 40403
//!   (the subject does not hold the schema).
//! - `GET /schemas/ids/{id}`: `{"schema", "schemaType"?}` or 404 with 40403.
//! - `GET /subjects`, `GET /subjects/{subject}/versions`,
//!   `GET /subjects/{subject}/versions/{version | latest}`.
//!
//! As Confluent's registry does, `schemaType` is left out of answers for Avro (the default).
//! Schema references are accepted and ignored.
//!
//! Invariants: ids start at 1 and grow by one per new schema; a subject's versions start at 1
//! and grow by one per schema new to that subject. [`up`] is idempotent and returns once the
//! recorded registry answers `GET /subjects` (no fixed sleep); [`down`] stops only the process
//! recorded in `registry.pid` of [`crate::broker::state_dir`], and only if its command line is
//! this registry's.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::broker::{BrokerError, io, process_alive, state_dir};

/// The environment variable that points tests at another registry (its base URL, such as
/// `http://127.0.0.1:8081` or Apicurio's `http://host:8080/apis/ccompat/v7`).
pub const REGISTRY_URL_ENV: &str = "PARSLEY_REGISTRY_URL";

/// A schema as the registry stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Schema {
    /// `AVRO`, `PROTOBUF` or `JSON`.
    kind: String,
    text: String,
}

/// The registry's contents.
#[derive(Debug, Default)]
struct State {
    /// Schema id - 1 → schema.
    schemas: Vec<Schema>,
    /// Subject → the ids of its versions (version n at index n - 1).
    subjects: BTreeMap<String, Vec<u32>>,
}

/// An HTTP answer: status and JSON body.
type Answer = (u16, Value);

fn not_found(code: u32, message: &str) -> Answer {
    (404, json!({"error_code": code, "message": message}))
}

fn bad_request(code: u32, message: &str) -> Answer {
    let status = if code / 100 == 422 { 422 } else { 400 };
    (status, json!({"error_code": code, "message": message}))
}

impl State {
    fn id_of(&self, schema: &Schema) -> Option<u32> {
        self.schemas
            .iter()
            .position(|s| s == schema)
            .map(|i| i as u32 + 1)
    }

    fn schema_answer(&self, id: u32, mut fields: Value) -> Value {
        let schema = &self.schemas[id as usize - 1];
        fields["schema"] = json!(schema.text);
        if schema.kind != "AVRO" {
            fields["schemaType"] = json!(schema.kind);
        }
        fields
    }

    fn register(&mut self, subject: &str, schema: Schema) -> Answer {
        let id = match self.id_of(&schema) {
            Some(id) => id,
            None => {
                self.schemas.push(schema);
                self.schemas.len() as u32
            }
        };
        let versions = self.subjects.entry(subject.to_string()).or_default();
        if !versions.contains(&id) {
            versions.push(id);
        }
        (200, json!({"id": id}))
    }

    fn lookup(&self, subject: &str, schema: &Schema) -> Answer {
        let Some(versions) = self.subjects.get(subject) else {
            return not_found(40401, &format!("Subject '{subject}' not found."));
        };
        let found = self
            .id_of(schema)
            .and_then(|id| versions.iter().position(|v| *v == id).map(|i| (id, i + 1)));
        match found {
            Some((id, version)) => (
                200,
                self.schema_answer(
                    id,
                    json!({"subject": subject, "id": id, "version": version}),
                ),
            ),
            None => not_found(40403, "Schema not found"),
        }
    }

    fn version(&self, subject: &str, version: &str) -> Answer {
        let Some(versions) = self.subjects.get(subject) else {
            return not_found(40401, &format!("Subject '{subject}' not found."));
        };
        let index = if version == "latest" {
            versions.len().checked_sub(1)
        } else {
            match version.parse::<usize>() {
                Ok(v) if v >= 1 && v <= versions.len() => Some(v - 1),
                Ok(_) => None,
                Err(_) => {
                    return bad_request(42202, "The specified version is not a valid version");
                }
            }
        };
        match index {
            Some(i) => {
                let id = versions[i];
                (
                    200,
                    self.schema_answer(id, json!({"subject": subject, "id": id, "version": i + 1})),
                )
            }
            None => not_found(40402, &format!("Version {version} not found.")),
        }
    }

    /// The answer to `method path` with `body`.
    fn handle(&mut self, method: &str, path: &str, body: &[u8]) -> Answer {
        let path = path.split('?').next().unwrap_or_default();
        let segments: Vec<String> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect();
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        match (method, segments.as_slice()) {
            ("GET", []) => (200, json!({})),
            ("GET", ["subjects"]) => (200, json!(self.subjects.keys().collect::<Vec<_>>())),
            ("GET", ["schemas", "types"]) => (200, json!(["AVRO", "PROTOBUF", "JSON"])),
            ("GET", ["schemas", "ids", id]) => match id.parse::<u32>() {
                Ok(id) if id >= 1 && (id as usize) <= self.schemas.len() => {
                    (200, self.schema_answer(id, json!({})))
                }
                _ => not_found(40403, "Schema not found"),
            },
            ("GET", ["subjects", subject, "versions"]) => match self.subjects.get(*subject) {
                Some(v) => (200, json!((1..=v.len()).collect::<Vec<_>>())),
                None => not_found(40401, &format!("Subject '{subject}' not found.")),
            },
            ("GET", ["subjects", subject, "versions", version]) => self.version(subject, version),
            ("POST", ["subjects", subject, "versions"]) => match parse_schema(body) {
                Ok(schema) => self.register(subject, schema),
                Err(answer) => answer,
            },
            ("POST", ["subjects", subject]) => match parse_schema(body) {
                Ok(schema) => self.lookup(subject, &schema),
                Err(answer) => answer,
            },
            _ => not_found(404, &format!("no such endpoint: {method} {path}")),
        }
    }
}

/// The schema of a register or lookup request's body.
fn parse_schema(body: &[u8]) -> Result<Schema, Answer> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad_request(42201, &format!("Invalid schema: the body is not JSON: {e}")))?;
    let text = value
        .get("schema")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request(42201, "Invalid schema: no \"schema\" string"))?;
    let kind = value
        .get("schemaType")
        .and_then(Value::as_str)
        .unwrap_or("AVRO")
        .to_string();
    if !["AVRO", "PROTOBUF", "JSON"].contains(&kind.as_str()) {
        return Err(bad_request(42201, &format!("Invalid schema type {kind}")));
    }
    if kind != "PROTOBUF" && serde_json::from_str::<Value>(text).is_err() {
        return Err(bad_request(42201, "Invalid schema: not JSON"));
    }
    Ok(Schema {
        kind,
        text: text.to_string(),
    })
}

/// `%XX` sequences decoded (as UTF-8, lossily); everything else kept.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one HTTP/1.1 request from `stream` and writes its answer; closes the connection.
fn serve_connection(state: &Mutex<State>, stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    // A body of at most 16 MiB: a schema, not a bulk upload.
    let mut body = vec![0; length.min(16 << 20)];
    reader.read_exact(&mut body)?;
    let (status, answer) = state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .handle(&method, &path, &body);
    let body = answer.to_string();
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        422 => "Unprocessable Entity",
        _ => "Bad Request",
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// Serves `listener` until the process ends: one thread per connection.
fn serve(listener: TcpListener, state: Arc<Mutex<State>>) {
    for stream in listener.incoming().flatten() {
        let state = Arc::clone(&state);
        std::thread::spawn(move || {
            // A broken connection is the client's business: nothing to record.
            let _ = serve_connection(&state, stream);
        });
    }
}

/// A registry served on a thread of this process, on a free port of 127.0.0.1, until the
/// process ends. Each one has its own contents.
#[derive(Debug)]
pub struct InProcess {
    url: String,
}

impl InProcess {
    /// Starts one.
    ///
    /// # Errors
    /// When no port can be bound.
    pub fn start() -> Result<InProcess, BrokerError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io(Path::new("127.0.0.1:0")))?;
        let addr = listener
            .local_addr()
            .map_err(io(Path::new("127.0.0.1:0")))?;
        let state = Arc::new(Mutex::new(State::default()));
        std::thread::spawn(move || serve(listener, state));
        Ok(InProcess {
            url: format!("http://{addr}"),
        })
    }

    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Serves a registry on `127.0.0.1:port` in this thread, forever (`cargo kafka registry up`
/// runs it as a process of its own).
///
/// # Errors
/// When the port cannot be bound.
pub fn serve_forever(port: u16) -> Result<(), BrokerError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = TcpListener::bind(addr).map_err(io(Path::new("127.0.0.1")))?;
    serve(listener, Arc::new(Mutex::new(State::default())));
    Ok(())
}

/// Whether a registry answers `GET {url}/subjects` with 200 within `timeout`.
pub fn answers(url: &str, timeout: Duration) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut addrs) = std::net::ToSocketAddrs::to_socket_addrs(host) else {
        return false;
    };
    let Some(addr) = addrs.next() else {
        return false;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("/{}", prefix.trim_end_matches('/'))
    };
    if write!(
        stream,
        "GET {prefix}/subjects HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut first = String::new();
    BufReader::new(stream).read_line(&mut first).is_ok()
        && first.split_whitespace().nth(1) == Some("200")
}

/// The base URL of the registry to use: `$PARSLEY_REGISTRY_URL`, else the one recorded by
/// [`up`] when it answers.
pub fn url() -> Option<String> {
    if let Ok(url) = std::env::var(REGISTRY_URL_ENV)
        && !url.trim().is_empty()
    {
        return Some(url.trim().trim_end_matches('/').to_string());
    }
    recorded_pid(&state_dir())?;
    let url = fs::read_to_string(state_dir().join("registry")).ok()?;
    let url = url.trim().to_string();
    answers(&url, Duration::from_secs(2)).then_some(url)
}

/// Starts the local registry as a process of its own (`program registry serve --port P
/// --dir D`, `program` being the `parsley-kafka` binary) unless the recorded one answers;
/// returns its base URL once it answers `GET /subjects`.
///
/// # Errors
/// When the process cannot be started, exits, or does not answer within 30 s.
pub fn up(program: &Path) -> Result<String, BrokerError> {
    let dir = state_dir();
    if let Some(pid) = recorded_pid(&dir)
        && let Ok(url) = fs::read_to_string(dir.join("registry"))
        && answers(url.trim(), Duration::from_secs(2))
    {
        let _ = pid;
        return Ok(url.trim().to_string());
    }
    down()?;
    let port = crate::broker::free_port_other_than(&[])?;
    let log = dir.join("registry.log");
    let log_file = fs::File::create(&log).map_err(io(&log))?;
    let mut cmd = Command::new(program);
    cmd.args(["registry", "serve", "--port", &port.to_string(), "--dir"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(io(&log))?)
        .stderr(log_file);
    {
        use std::os::unix::process::CommandExt;
        // Its own process group: the registry outlives `cargo kafka registry up`.
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| BrokerError::CommandFailed {
        what: format!("{} registry serve", program.display()),
        status: e.to_string(),
        output: String::new(),
    })?;
    let pid_file = dir.join("registry.pid");
    fs::write(&pid_file, child.id().to_string()).map_err(io(&pid_file))?;
    let url = format!("http://127.0.0.1:{port}");
    let timeout = Duration::from_secs(30);
    let started = Instant::now();
    // Each attempt waits up to 1 s for the answer: evidence, not a sleep.
    while !answers(&url, Duration::from_secs(1)) {
        if let Ok(Some(status)) = child.try_wait() {
            let _ = fs::remove_file(&pid_file);
            return Err(BrokerError::CommandFailed {
                what: "the schema registry".into(),
                status: status.to_string(),
                output: crate::broker::tail(&log, 10),
            });
        }
        if started.elapsed() > timeout {
            return Err(BrokerError::NotReady(timeout, log));
        }
    }
    let url_file = dir.join("registry");
    fs::write(&url_file, format!("{url}\n")).map_err(io(&url_file))?;
    Ok(url)
}

/// Stops the registry [`up`] started, if it runs; `true` when a process was stopped.
///
/// # Errors
/// When the pid file cannot be removed.
pub fn down() -> Result<bool, BrokerError> {
    let dir = state_dir();
    let pid_file = dir.join("registry.pid");
    let url_file = dir.join("registry");
    let Some(pid) = recorded_pid(&dir) else {
        let _ = fs::remove_file(&pid_file);
        let _ = fs::remove_file(&url_file);
        return Ok(false);
    };
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_alive(pid) {
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            break;
        }
        // Waiting for a process to exit: checked against /proc, not slept on blindly.
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = fs::remove_file(&url_file);
    fs::remove_file(&pid_file).map_err(io(&pid_file))?;
    Ok(true)
}

/// The pid in `registry.pid` if that process is alive and is the registry of `dir`.
fn recorded_pid(dir: &Path) -> Option<u32> {
    let pid: u32 = fs::read_to_string(dir.join("registry.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    (process_alive(pid)
        && cmdline.contains("registry\0serve")
        && cmdline.contains(&*dir.to_string_lossy()))
    .then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avro(text: &str) -> Vec<u8> {
        json!({ "schema": text }).to_string().into_bytes()
    }

    #[test]
    fn one_schema_has_one_id_across_subjects_and_versions_count_per_subject() {
        let mut s = State::default();
        let a = r#"{"type":"string"}"#;
        let b = r#"{"type":"long"}"#;
        assert_eq!(
            s.handle("POST", "/subjects/t-value/versions", &avro(a)).1,
            json!({"id": 1})
        );
        assert_eq!(
            s.handle("POST", "/subjects/t-value/versions", &avro(a)).1,
            json!({"id": 1})
        );
        assert_eq!(
            s.handle("POST", "/subjects/u-value/versions", &avro(a)).1,
            json!({"id": 1})
        );
        assert_eq!(
            s.handle("POST", "/subjects/t-value/versions", &avro(b)).1,
            json!({"id": 2})
        );
        assert_eq!(
            s.handle("GET", "/subjects/t-value/versions", &[]).1,
            json!([1, 2])
        );
        assert_eq!(
            s.handle("GET", "/subjects/t-value/versions/latest", &[]).1,
            json!({"subject": "t-value", "id": 2, "version": 2, "schema": b})
        );
        assert_eq!(
            s.handle("POST", "/subjects/u-value", &avro(a)).1,
            json!({"subject": "u-value", "id": 1, "version": 1, "schema": a})
        );
        assert_eq!(s.handle("POST", "/subjects/u-value", &avro(b)).0, 404);
        assert_eq!(
            s.handle("POST", "/subjects/v-value", &avro(b)).1["error_code"],
            40401
        );
        assert_eq!(
            s.handle("GET", "/schemas/ids/3", &[]).1["error_code"],
            40403
        );
        assert_eq!(
            s.handle("GET", "/subjects", &[]).1,
            json!(["t-value", "u-value"])
        );
    }

    #[test]
    fn schema_types_other_than_avro_are_kept_and_answered() {
        let mut s = State::default();
        let body = json!({"schema": "syntax = \"proto3\"; message M {}", "schemaType": "PROTOBUF"});
        let body = body.to_string().into_bytes();
        assert_eq!(
            s.handle("POST", "/subjects/a%2Eb/versions", &body).1,
            json!({"id": 1})
        );
        assert_eq!(
            s.handle("GET", "/schemas/ids/1", &[]).1,
            json!({"schema": "syntax = \"proto3\"; message M {}", "schemaType": "PROTOBUF"})
        );
        assert_eq!(s.handle("GET", "/subjects", &[]).1, json!(["a.b"]));
        let bad = json!({"schema": "{", "schemaType": "JSON"})
            .to_string()
            .into_bytes();
        assert_eq!(
            s.handle("POST", "/subjects/x/versions", &bad).1["error_code"],
            42201
        );
        assert_eq!(s.handle("POST", "/subjects/x/versions", b"nope").0, 422);
    }

    #[test]
    fn the_in_process_registry_answers_over_http() {
        let registry = InProcess::start().unwrap();
        assert!(answers(registry.url(), Duration::from_secs(5)));
        assert!(!answers("http://127.0.0.1:1", Duration::from_secs(1)));
    }
}
