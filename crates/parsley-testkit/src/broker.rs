//! A real single-node Apache Kafka broker (KRaft, broker and controller in one JVM), started
//! by the project from Maven Central jars on the machine's Java 17.
//!
//! Files live in [`state_dir`] (`target/kafka/` of the workspace by default, or
//! `$PARSLEY_KAFKA_DIR`): `pom.xml` and `libs/` (the resolved jars), `server.properties`,
//! `data/` (KRaft storage, formatted anew at every start), `server.log`, `broker.pid` and
//! `bootstrap` (the `host:port` that tests and examples read).
//!
//! Invariants:
//! - [`up`] is idempotent: when the recorded broker answers a metadata request it returns
//!   [`Up::AlreadyRunning`] and changes nothing;
//! - [`up`] returns only once the broker answers a metadata request — no fixed sleep;
//! - [`down`] stops only the process recorded in `broker.pid`, and only if its command line is
//!   the broker this module started with this state directory.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// The Apache Kafka version the project runs (`org.apache.kafka:kafka_2.13`).
pub const KAFKA_VERSION: &str = "4.4.0";
/// The log4j2 version that routes the broker's logging to `server.log`.
pub const LOG4J_VERSION: &str = "2.25.3";
/// The environment variable that points tests and examples at an existing cluster.
pub const BOOTSTRAP_ENV: &str = "PARSLEY_BOOTSTRAP";

/// Errors of broker management.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// A program the broker needs is missing.
    #[error("{program} was not found on PATH: {install}")]
    MissingProgram {
        /// The program (java, mvn).
        program: &'static str,
        /// What to install.
        install: &'static str,
    },
    /// Java is present but older than 17.
    #[error("Kafka {KAFKA_VERSION} needs Java 17 or newer, found: {found}")]
    JavaTooOld {
        /// The first line of `java -version`.
        found: String,
    },
    /// A command failed.
    #[error("{what} failed ({status}); output:\n{output}")]
    CommandFailed {
        /// What was run.
        what: String,
        /// Its exit status.
        status: String,
        /// The tail of its output.
        output: String,
    },
    /// The broker process exited before it answered.
    #[error("the broker exited during startup; last lines of {log}:\n{tail}")]
    BrokerDied {
        /// The broker log.
        log: PathBuf,
        /// Its tail.
        tail: String,
    },
    /// The broker did not answer a metadata request in time.
    #[error("the broker did not answer a metadata request within {0:?}; see {1}")]
    NotReady(Duration, PathBuf),
    /// No broker is known.
    #[error(
        "no Kafka broker: run `cargo xtask kafka up` (or `cargo xtask test`), or set {BOOTSTRAP_ENV}=host:port"
    )]
    NoBroker,
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BrokerError + '_ {
    move |source| BrokerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The directory holding the broker's jars, config, data and the bootstrap file.
pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PARSLEY_KAFKA_DIR") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join("target")
        });
    target.join("kafka")
}

/// The bootstrap address of the broker to use: `$PARSLEY_BOOTSTRAP`, else the one recorded by
/// [`up`].
///
/// # Errors
/// [`BrokerError::NoBroker`] when neither exists.
pub fn bootstrap() -> Result<String, BrokerError> {
    if let Ok(b) = std::env::var(BOOTSTRAP_ENV)
        && !b.trim().is_empty()
    {
        return Ok(b.trim().to_string());
    }
    fs::read_to_string(state_dir().join("bootstrap"))
        .map(|s| s.trim().to_string())
        .map_err(|_| BrokerError::NoBroker)
}

/// What [`up`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Up {
    /// A broker was started; it answers at this address.
    Started(String),
    /// The recorded broker already answers at this address.
    AlreadyRunning(String),
}

impl Up {
    /// The bootstrap address.
    pub fn bootstrap(&self) -> &str {
        match self {
            Up::Started(b) | Up::AlreadyRunning(b) => b,
        }
    }
}

/// What [`status`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The recorded broker process is alive and answers metadata requests.
    Running {
        /// Its bootstrap address.
        bootstrap: String,
        /// Its process id.
        pid: u32,
    },
    /// The recorded process is alive but does not answer.
    Unresponsive {
        /// Its process id.
        pid: u32,
    },
    /// No broker started by this project is running.
    Stopped,
}

/// Whether a broker answers a metadata request at `bootstrap` within `timeout`.
pub fn answers(bootstrap: &str, timeout: Duration) -> bool {
    let consumer: Result<BaseConsumer, _> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("socket.connection.setup.timeout.ms", "1000")
        .set("log_level", "0")
        .create();
    match consumer {
        Ok(c) => c.fetch_metadata(None, timeout).is_ok(),
        Err(_) => false,
    }
}

/// Starts the local broker if it is not running; returns once it answers.
///
/// # Errors
/// Missing Java or Maven, a failed jar resolution or storage format, or a broker that dies or
/// does not answer.
pub fn up() -> Result<Up, BrokerError> {
    let dir = state_dir();
    if let Status::Running { bootstrap, .. } = status() {
        return Ok(Up::AlreadyRunning(bootstrap));
    }
    // A recorded process that does not answer is ours but broken: stop it first.
    down()?;
    check_java()?;
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let libs = resolve_jars(&dir)?;
    let port = free_port()?;
    let controller_port = free_port_other_than(port)?;
    let data = dir.join("data");
    if data.exists() {
        fs::remove_dir_all(&data).map_err(io(&data))?;
    }
    let props = dir.join("server.properties");
    let config = server_properties(port, controller_port, &data);
    fs::write(&props, config).map_err(io(&props))?;
    let log4j = dir.join("log4j2.yaml");
    fs::write(&log4j, log4j_config(&dir.join("server.log"))).map_err(io(&log4j))?;
    let classpath = format!("{}/*", libs.display());
    let java_log = format!("-Dlog4j2.configurationFile={}", log4j.display());

    let cluster_id = run_capture(
        Command::new("java").args([
            &java_log,
            "-cp",
            &classpath,
            "kafka.tools.StorageTool",
            "random-uuid",
        ]),
        "kafka-storage random-uuid",
    )?;
    let cluster_id = cluster_id.trim().to_string();
    run_capture(
        Command::new("java").args([
            &java_log,
            "-cp",
            &classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            &cluster_id,
            "-c",
            &props.to_string_lossy(),
        ]),
        "kafka-storage format",
    )?;

    let bootstrap = format!("127.0.0.1:{port}");
    spawn(&dir, &classpath, &java_log, &props, &bootstrap)?;
    let bootstrap_file = dir.join("bootstrap");
    let mut f = fs::File::create(&bootstrap_file).map_err(io(&bootstrap_file))?;
    writeln!(f, "{bootstrap}").map_err(io(&bootstrap_file))?;
    Ok(Up::Started(bootstrap))
}

/// Starts the broker process of `props` and waits until it answers at `bootstrap`; records
/// its pid.
fn spawn(
    dir: &Path,
    classpath: &str,
    java_log: &str,
    props: &Path,
    bootstrap: &str,
) -> Result<(), BrokerError> {
    let console = dir.join("console.log");
    let console_file = fs::File::create(&console).map_err(io(&console))?;
    let mut cmd = Command::new("java");
    cmd.args([
        "-Xms512m",
        "-Xmx1g",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        java_log,
        "-cp",
        classpath,
        "kafka.Kafka",
        &props.to_string_lossy(),
    ])
    .stdin(Stdio::null())
    .stdout(console_file.try_clone().map_err(io(&console))?)
    .stderr(console_file);
    {
        use std::os::unix::process::CommandExt;
        // Its own process group: the broker outlives `cargo xtask kafka up`.
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| BrokerError::CommandFailed {
        what: "java kafka.Kafka".into(),
        status: e.to_string(),
        output: String::new(),
    })?;
    let pid = child.id();
    let pid_file = dir.join("broker.pid");
    fs::write(&pid_file, pid.to_string()).map_err(io(&pid_file))?;

    let timeout = Duration::from_secs(120);
    let started = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            let _ = fs::remove_file(&pid_file);
            let log = dir.join("server.log");
            return Err(BrokerError::BrokerDied {
                tail: tail(&log, 30) + &tail(&console, 10),
                log,
            });
        }
        // Each attempt waits up to 2 s for the broker's answer: evidence, not a sleep.
        if answers(bootstrap, Duration::from_secs(2)) {
            break;
        }
        if started.elapsed() > timeout {
            return Err(BrokerError::NotReady(timeout, dir.join("server.log")));
        }
    }
    Ok(())
}

/// Restarts the running broker this project started, keeping its data and its port (a broker
/// restart as a fault: clients reconnect to the same address and find their logs).
///
/// # Errors
/// [`BrokerError::NotReady`] or [`BrokerError::BrokerDied`] when it does not come back; a
/// missing state directory when no broker was started.
pub fn restart() -> Result<String, BrokerError> {
    let dir = state_dir();
    let bootstrap = bootstrap()?;
    down()?;
    let libs = dir.join("libs");
    let classpath = format!("{}/*", libs.display());
    let log4j = dir.join("log4j2.yaml");
    let java_log = format!("-Dlog4j2.configurationFile={}", log4j.display());
    spawn(
        &dir,
        &classpath,
        &java_log,
        &dir.join("server.properties"),
        &bootstrap,
    )?;
    let bootstrap_file = dir.join("bootstrap");
    fs::write(&bootstrap_file, format!("{bootstrap}\n")).map_err(io(&bootstrap_file))?;
    Ok(bootstrap)
}

/// The state of the broker recorded in the state directory.
pub fn status() -> Status {
    let dir = state_dir();
    let Some(pid) = recorded_pid(&dir) else {
        return Status::Stopped;
    };
    let Ok(bootstrap) = fs::read_to_string(dir.join("bootstrap")) else {
        return Status::Unresponsive { pid };
    };
    let bootstrap = bootstrap.trim().to_string();
    if answers(&bootstrap, Duration::from_secs(5)) {
        Status::Running { bootstrap, pid }
    } else {
        Status::Unresponsive { pid }
    }
}

/// Stops the broker this project started (if any) and waits for the process to exit.
/// Returns `true` when a process was stopped.
///
/// # Errors
/// When the pid file cannot be removed.
pub fn down() -> Result<bool, BrokerError> {
    let dir = state_dir();
    let pid_file = dir.join("broker.pid");
    let bootstrap_file = dir.join("bootstrap");
    let Some(pid) = recorded_pid(&dir) else {
        let _ = fs::remove_file(&pid_file);
        let _ = fs::remove_file(&bootstrap_file);
        return Ok(false);
    };
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while process_alive(pid) {
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            break;
        }
        // Waiting for a process to exit: checked against /proc, not slept on blindly.
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = fs::remove_file(&bootstrap_file);
    fs::remove_file(&pid_file).map_err(io(&pid_file))?;
    Ok(true)
}

/// The pid in `broker.pid` if that process is alive and is our broker.
fn recorded_pid(dir: &Path) -> Option<u32> {
    let pid: u32 = fs::read_to_string(dir.join("broker.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    let props = dir.join("server.properties");
    (cmdline.contains("kafka.Kafka") && cmdline.contains(&*props.to_string_lossy())).then_some(pid)
}

fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie ("Z") has exited; its parent has not reaped it yet.
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Checks that `java` on `PATH` is Java 17 or newer; returns its major version.
///
/// # Errors
/// [`BrokerError::MissingProgram`] naming the package to install, or
/// [`BrokerError::JavaTooOld`] with the version line found.
pub fn check_java() -> Result<u32, BrokerError> {
    let out = Command::new("java").arg("-version").output().map_err(|_| {
        BrokerError::MissingProgram {
            program: "java",
            install: "install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)",
        }
    })?;
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    let first = text.lines().next().unwrap_or_default().to_string();
    let major = first
        .split('"')
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0);
    if major < 17 {
        return Err(BrokerError::JavaTooOld { found: first });
    }
    Ok(major)
}

/// Checks that `mvn` is on `PATH`.
///
/// # Errors
/// [`BrokerError::MissingProgram`] naming the package to install.
pub fn check_maven() -> Result<(), BrokerError> {
    match Command::new("mvn").arg("-v").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(BrokerError::MissingProgram {
            program: "mvn",
            install: "install Apache Maven (Debian: apt-get install maven)",
        }),
    }
}

/// Resolves `kafka_2.13` and its runtime dependencies with Maven into `dir/libs`.
fn resolve_jars(dir: &Path) -> Result<PathBuf, BrokerError> {
    let libs = dir.join("libs");
    let marker = libs.join(format!(".resolved-{KAFKA_VERSION}-{LOG4J_VERSION}"));
    if marker.exists() {
        return Ok(libs);
    }
    check_maven()?;
    let pom = dir.join("pom.xml");
    fs::write(&pom, pom_xml()).map_err(io(&pom))?;
    if libs.exists() {
        fs::remove_dir_all(&libs).map_err(io(&libs))?;
    }
    run_capture(
        Command::new("mvn").args([
            "-q",
            "-B",
            "-f",
            &pom.to_string_lossy(),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            &format!("-DoutputDirectory={}", libs.display()),
        ]),
        "mvn dependency:copy-dependencies (Kafka broker jars)",
    )?;
    fs::write(&marker, "").map_err(io(&marker))?;
    Ok(libs)
}

fn pom_xml() -> String {
    format!(
        r#"<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- Written by parsley-testkit: the jars of a local Kafka broker. -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.parsley</groupId>
  <artifactId>local-kafka-broker</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{LOG4J_VERSION}</version></dependency>
  </dependencies>
</project>
"#
    )
}

fn server_properties(port: u16, controller_port: u16, data: &Path) -> String {
    format!(
        "# Written by parsley-testkit: one combined broker+controller on loopback.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data}
num.partitions=1
auto.create.topics.enable=false
delete.topic.enable=true
group.initial.rebalance.delay.ms=0
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
# Abort timed-out transactions within a second of their timeout (default: every 10 s), so a
# test of a transaction timeout (case C08) sees the abort promptly.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
log.flush.interval.messages=9223372036854775807
",
        data = data.display()
    )
}

fn log4j_config(log: &Path) -> String {
    format!(
        "Configuration:
  Appenders:
    File:
      name: file
      fileName: \"{}\"
      PatternLayout:
        pattern: \"[%d] %p %m (%c)%n\"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: file
",
        log.display()
    )
}

fn free_port() -> Result<u16, BrokerError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io(Path::new("127.0.0.1:0")))?;
    Ok(l.local_addr().map_err(io(Path::new("127.0.0.1:0")))?.port())
}

fn free_port_other_than(other: u16) -> Result<u16, BrokerError> {
    loop {
        let p = free_port()?;
        if p != other {
            return Ok(p);
        }
    }
}

fn run_capture(cmd: &mut Command, what: &str) -> Result<String, BrokerError> {
    let out = cmd.output().map_err(|e| BrokerError::CommandFailed {
        what: what.to_string(),
        status: e.to_string(),
        output: String::new(),
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        let all = stdout + &String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = all.lines().collect();
        return Err(BrokerError::CommandFailed {
            what: what.to_string(),
            status: out.status.to_string(),
            output: lines[lines.len().saturating_sub(40)..].join("\n"),
        });
    }
    Ok(stdout)
}

fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}
