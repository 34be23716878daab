//! A real single-node Apache Kafka broker (KRaft, broker and controller in one JVM), started
//! by the project from Maven Central jars on the machine's Java 17.
//!
//! Files live in [`state_dir`] (`target/kafka/` of the workspace by default, or
//! `$PARSLEY_KAFKA_DIR`): `pom.xml` and `libs/` (the resolved jars), `server.properties`,
//! `data/` (KRaft storage, formatted anew at every start), `tls/` (the secure listener's
//! throw-away CA and broker keystore, made anew at every start, and `client.properties`, the
//! Java client settings that reach the secure listener), `server.log`, `broker.pid`,
//! `bootstrap` (the `host:port` that tests and examples read) and `secure` (the secure
//! listener's address and the credentials of its two users, read by [`secure_listener`] and
//! [`least_privilege_listener`]).
//!
//! The broker has two client listeners on 127.0.0.1: `PLAINTEXT`, which everything uses unless
//! it tests security, and `SASL_SSL` ([`SecureListener`]): TLS with a broker certificate
//! signed by a CA made at start (valid for `127.0.0.1` and `localhost`), and SASL/SCRAM-SHA-512
//! with two users whose credentials are bootstrapped into the metadata log when the storage is
//! formatted. Brokers talk to each other and to the controller over `PLAINTEXT`.
//!
//! The broker authorizes every request with KRaft's `StandardAuthorizer` (KIP-11's model:
//! ACLs on topics, groups, transactional ids and the cluster, kept in the metadata log). Three
//! principals are super users, allowed everything: `User:ANONYMOUS`, which every client of the
//! `PLAINTEXT` listener is and which the controller and the broker use between themselves, and
//! `User:parsley`, the secure listener's first user ([`secure_listener`]). The second,
//! `User:parsley-app` ([`least_privilege_listener`]), has no ACL at start: it may do nothing
//! until an ACL allows it — the principal that tests what an application needs.
//!
//! Invariants:
//! - [`up`] is idempotent: when the recorded broker answers a metadata request it returns
//!   [`Up::AlreadyRunning`] and changes nothing;
//! - [`up`] returns only once the broker answers a metadata request on the `PLAINTEXT`
//!   listener ([`crate::wire`]) and Kafka's own Java client, with the recorded credentials and
//!   trusting the recorded CA, gets an answer on the secure one — no fixed sleep;
//! - [`restart`] keeps data, ports, configuration, TLS material, credentials and ACLs;
//! - every client of the `PLAINTEXT` listener and the secure listener's first user are super
//!   users; the least-privilege user is allowed only what ACLs created after [`up`] allow;
//! - [`down`] stops only the process recorded in `broker.pid`, and only if its command line is
//!   the broker this module started with this state directory.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub mod secure;

use crate::wire::Connection;
pub use secure::{LEAST_PRIVILEGE_USER, SecureListener, least_privilege_listener, secure_listener};

/// The Apache Kafka version the project runs (`org.apache.kafka:kafka_2.13`).
pub const KAFKA_VERSION: &str = "4.4.0";
/// The log4j2 version that routes the broker's logging to `server.log`.
pub const LOG4J_VERSION: &str = "2.25.3";
/// The environment variable that points tests and examples at an existing cluster.
pub const BOOTSTRAP_ENV: &str = "PARSLEY_BOOTSTRAP";
/// The SASL mechanism of the secure listener.
pub const SECURE_MECHANISM: &str = "SCRAM-SHA-512";
/// The SCRAM user of the secure listener: a super user.
const SECURE_USER: &str = "parsley";
/// The principals the broker's authorizer allows everything (`super.users`): the `PLAINTEXT`
/// listener's clients, the controller and the brokers (`User:ANONYMOUS`), and the secure
/// listener's first user (`User:parsley`).
pub const SUPER_USERS: [&str; 2] = ["User:ANONYMOUS", "User:parsley"];
/// Days the throw-away certificates are valid: longer than any broker is left running.
const CERT_VALIDITY_DAYS: &str = "365";

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
        "no Kafka broker: run `cargo kafka up` (or `cargo xtask test`), or set {BOOTSTRAP_ENV}=host:port"
    )]
    NoBroker,
    /// The `secure` record in the state directory cannot be read.
    #[error("{path}: {reason}")]
    BadRecord {
        /// The record.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A command was given arguments it does not take.
    #[error("{0}")]
    BadArgument(String),
    /// A topic could not be read back.
    #[error("reading {topic}: {source}")]
    Read {
        /// The topic.
        topic: String,
        /// What failed.
        source: crate::wire::WireError,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BrokerError + '_ {
    move |source| BrokerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The directory holding the broker's jars, config, data and the bootstrap file, created if
/// missing and canonical: the running broker is recognised by this path in its command line,
/// so two spellings of one directory (`$CARGO_TARGET_DIR` set or not, `..` in it) must give
/// the same path — or a second broker would start in the same directory and wipe its data.
pub fn state_dir() -> PathBuf {
    let dir = match std::env::var_os("PARSLEY_KAFKA_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../..")
                    .join("target")
            })
            .join("kafka"),
    };
    // Best effort: an uncreatable directory fails later, naming it, where it is written.
    let _ = fs::create_dir_all(&dir);
    fs::canonicalize(&dir).unwrap_or(dir)
}

/// The bootstrap address of the broker to use: `$PARSLEY_BOOTSTRAP`, else the one recorded by
/// [`up`].
///
/// # Errors
/// [`BrokerError::NoBroker`] when neither exists.
pub fn bootstrap() -> Result<String, BrokerError> {
    if let Some(b) = external_bootstrap() {
        return Ok(b);
    }
    fs::read_to_string(state_dir().join("bootstrap"))
        .map(|s| s.trim().to_string())
        .map_err(|_| BrokerError::NoBroker)
}

/// `$PARSLEY_BOOTSTRAP`, when it names a cluster.
fn external_bootstrap() -> Option<String> {
    std::env::var(BOOTSTRAP_ENV)
        .ok()
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
}

/// Whether `$PARSLEY_BOOTSTRAP` points at a cluster other than the local broker recorded in
/// [`state_dir`]. (`cargo xtask test` sets it to the local broker's address: that is not
/// another cluster.)
pub fn uses_external_cluster() -> bool {
    external_bootstrap().is_some_and(|b| {
        fs::read_to_string(state_dir().join("bootstrap")).map_or(true, |local| local.trim() != b)
    })
}

/// What [`up`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Up {
    /// A broker (or a cluster) was started; it answers at this address (a cluster: its
    /// bootstrap list).
    Started(String),
    /// The recorded broker (or cluster) already answers at this address.
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

/// Whether a broker answers a metadata request at `bootstrap` (`host:port`, or a
/// comma-separated list: any of them) within `timeout`, on a `PLAINTEXT` listener.
pub fn answers(bootstrap: &str, timeout: Duration) -> bool {
    bootstrap.split(',').any(|address| {
        Connection::open(address.trim(), timeout).is_ok_and(|mut c| c.metadata(&[]).is_ok())
    })
}

/// Whether the secure listener answers a request of Kafka's own Java client, which connects
/// with its credentials and trusts its CA (`BrokerApiVersionsCommand`, from the resolved jars:
/// a TLS handshake and a SCRAM exchange need no library of this crate). One JVM start, a second
/// or two.
fn secure_answers(classpath: &str, java_log: &str, secure: &SecureListener) -> bool {
    let Some(tls) = secure.ca_pem.parent() else {
        return false;
    };
    let config = tls.join("client.properties");
    let written = fs::write(
        &config,
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism={}\n\
             sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
             username=\"{}\" password=\"{}\";\n\
             ssl.truststore.type=PEM\nssl.truststore.location={}\n\
             request.timeout.ms=5000\ndefault.api.timeout.ms=10000\n",
            secure.mechanism,
            secure.username,
            secure.password,
            secure.ca_pem.display()
        ),
    );
    written.is_ok()
        && run_capture(
            Command::new("java").args([
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                java_log,
                "-cp",
                classpath,
                "org.apache.kafka.tools.BrokerApiVersionsCommand",
                "--bootstrap-server",
                &secure.bootstrap,
                "--command-config",
                &config.to_string_lossy(),
            ]),
            "BrokerApiVersionsCommand on the secure listener",
        )
        .is_ok()
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
    let port = free_port_other_than(&[])?;
    let controller_port = free_port_other_than(&[port])?;
    let secure_port = free_port_other_than(&[port, controller_port])?;
    let data = dir.join("data");
    if data.exists() {
        fs::remove_dir_all(&data).map_err(io(&data))?;
    }
    let tls = dir.join("tls");
    // Secrets of this start only: the keystore's password and the SCRAM users'.
    let store_password = uuid::Uuid::new_v4().simple().to_string();
    let least_password = uuid::Uuid::new_v4().simple().to_string();
    let secure = SecureListener {
        bootstrap: format!("127.0.0.1:{secure_port}"),
        mechanism: SECURE_MECHANISM,
        username: SECURE_USER.to_string(),
        password: uuid::Uuid::new_v4().simple().to_string(),
        ca_pem: tls.join("ca.pem"),
        untrusted_ca_pem: tls.join("untrusted-ca.pem"),
    };
    let props = dir.join("server.properties");
    let config = server_properties(
        port,
        controller_port,
        &data,
        secure_port,
        &tls.join("broker.p12"),
        &store_password,
    );
    fs::write(&props, config).map_err(io(&props))?;
    let log4j = dir.join("log4j2.yaml");
    fs::write(&log4j, log4j_config(&dir.join("server.log"))).map_err(io(&log4j))?;
    let classpath = format!("{}/*", libs.display());
    let java_log = format!("-Dlog4j2.configurationFile={}", log4j.display());

    let format_storage = || -> Result<(), BrokerError> {
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
        let scram = |user: &str, password: &str| {
            format!("{}=[name={user},password={password}]", secure.mechanism)
        };
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
                // The SCRAM users, bootstrapped into the metadata log.
                "--add-scram",
                &scram(&secure.username, &secure.password),
                "--add-scram",
                &scram(LEAST_PRIVILEGE_USER, &least_password),
            ]),
            "kafka-storage format",
        )?;
        Ok(())
    };
    // The TLS material (JVM runs of keytool) is made while the storage is formatted (JVM runs
    // of the storage tool): independent work, and most of both is JVM start-up.
    let (formatted, made) = std::thread::scope(|s| {
        let made = s.spawn(|| make_tls(&tls, &store_password));
        let formatted = format_storage();
        (formatted, made.join())
    });
    formatted?;
    made.unwrap_or_else(|_| {
        Err(BrokerError::CommandFailed {
            what: "making the secure listener's TLS material".into(),
            status: "the thread panicked".into(),
            output: String::new(),
        })
    })?;

    let bootstrap = format!("127.0.0.1:{port}");
    spawn(
        &dir,
        &classpath,
        &java_log,
        &props,
        &bootstrap,
        Some(&secure),
    )?;
    let bootstrap_file = dir.join("bootstrap");
    let mut f = fs::File::create(&bootstrap_file).map_err(io(&bootstrap_file))?;
    writeln!(f, "{bootstrap}").map_err(io(&bootstrap_file))?;
    let secure_file = dir.join("secure");
    let record = secure.record(&bootstrap, Some(&least_password));
    fs::write(&secure_file, record).map_err(io(&secure_file))?;
    Ok(Up::Started(bootstrap))
}

/// Makes the secure listener's TLS material in `tls` (emptied first) with the JDK's `keytool`:
/// a CA (`ca.p12`, its certificate in `ca.pem`), the broker's key pair with a certificate the
/// CA signed for `IP:127.0.0.1` and `DNS:localhost` (`broker.p12`, with the chain), and a
/// second CA that signed nothing (`untrusted-ca.pem`). Every keystore is PKCS12 with
/// `store_password`.
fn make_tls(tls: &Path, store_password: &str) -> Result<(), BrokerError> {
    if tls.exists() {
        fs::remove_dir_all(tls).map_err(io(tls))?;
    }
    fs::create_dir_all(tls).map_err(io(tls))?;
    let path = |name: &str| tls.join(name).to_string_lossy().into_owned();
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("keytool").is_file()));
    if !on_path {
        return Err(BrokerError::MissingProgram {
            program: "keytool",
            install: "install a Java 17 runtime, which has it \
                      (Debian: apt-get install openjdk-17-jre-headless)",
        });
    }
    // `fixed`: arguments without spaces; `args`: the others (paths, names).
    let keytool = |fixed: &str, args: &[&str]| -> Result<(), BrokerError> {
        let mut cmd = Command::new("keytool");
        // A short-lived JVM: skip the optimising compiler and the parallel collector.
        cmd.args(["-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC"])
            .args(fixed.split_whitespace())
            .args(args)
            .args(["-storepass:env", "PARSLEY_STOREPASS"])
            .env("PARSLEY_STOREPASS", store_password);
        run_capture(&mut cmd, &format!("keytool {fixed}")).map(drop)
    };
    let validity = ["-validity", CERT_VALIDITY_DAYS];
    let ca = |name: &str, store: &str, pem: &str| -> Result<(), BrokerError> {
        keytool(
            "-genkeypair -alias ca -keyalg EC -groupname secp256r1 -ext bc:c -storetype PKCS12",
            &[&validity[..], &["-dname", name, "-keystore", &path(store)]].concat(),
        )?;
        keytool(
            "-exportcert -rfc -alias ca",
            &["-keystore", &path(store), "-file", &path(pem)],
        )
    };
    let broker = path("broker.p12");
    std::thread::scope(|s| {
        let untrusted = s.spawn(|| {
            ca(
                "CN=parsley untrusted test CA",
                "untrusted-ca.p12",
                "untrusted-ca.pem",
            )
        });
        let signer = s.spawn(|| ca("CN=parsley test CA", "ca.p12", "ca.pem"));
        keytool(
            "-genkeypair -alias broker -keyalg EC -groupname secp256r1 -dname CN=localhost \
             -storetype PKCS12",
            &[&validity[..], &["-keystore", &broker]].concat(),
        )?;
        keytool(
            "-certreq -alias broker",
            &["-keystore", &broker, "-file", &path("broker.csr")],
        )?;
        join(signer)?;
        keytool(
            // Valid for the addresses clients connect to: librdkafka checks by default.
            "-gencert -rfc -alias ca -ext SAN=IP:127.0.0.1,DNS:localhost \
             -ext KeyUsage:critical=digitalSignature,keyEncipherment \
             -ext ExtendedKeyUsage=serverAuth",
            &[
                &validity[..],
                &["-keystore", &path("ca.p12")],
                &[
                    "-infile",
                    &path("broker.csr"),
                    "-outfile",
                    &path("broker.pem"),
                ],
            ]
            .concat(),
        )?;
        // The signed certificate with its CA: keytool installs a reply whose chain it can
        // build, and the keystore then holds the whole chain.
        let mut chain = String::new();
        for pem in [tls.join("broker.pem"), tls.join("ca.pem")] {
            chain += &fs::read_to_string(&pem).map_err(io(&pem))?;
        }
        let chain_file = tls.join("broker-chain.pem");
        fs::write(&chain_file, chain).map_err(io(&chain_file))?;
        keytool(
            "-importcert -noprompt -alias broker",
            &["-keystore", &broker, "-file", &path("broker-chain.pem")],
        )?;
        join(untrusted)
    })
}

/// The result of a scoped thread that returns one.
fn join(
    handle: std::thread::ScopedJoinHandle<'_, Result<(), BrokerError>>,
) -> Result<(), BrokerError> {
    handle.join().unwrap_or_else(|_| {
        Err(BrokerError::CommandFailed {
            what: "keytool".into(),
            status: "the thread running it panicked".into(),
            output: String::new(),
        })
    })
}

/// Starts the broker process of `props` and waits until it answers at `bootstrap` (and, with
/// `secure`, on that listener with its credentials); records its pid.
fn spawn(
    dir: &Path,
    classpath: &str,
    java_log: &str,
    props: &Path,
    bootstrap: &str,
    secure: Option<&SecureListener>,
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
        // Its own process group: the broker outlives `cargo kafka up`.
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
        if answers(bootstrap, Duration::from_secs(2))
            && secure.is_none_or(|s| secure_answers(classpath, java_log, s))
        {
            break;
        }
        if started.elapsed() > timeout {
            return Err(BrokerError::NotReady(timeout, dir.join("server.log")));
        }
    }
    Ok(())
}

/// Restarts the running broker this project started, keeping its data and its ports (a broker
/// restart as a fault: clients reconnect to the same address and find their logs), and its
/// secure listener with the same TLS material and credentials.
///
/// # Errors
/// [`BrokerError::NotReady`] or [`BrokerError::BrokerDied`] when it does not come back; a
/// missing state directory when no broker was started.
pub fn restart() -> Result<String, BrokerError> {
    restart_with(|| ())
}

/// [`restart`], calling `while_down` after the broker stopped and before it starts again: an
/// outage as long as the caller's evidence needs (a client's session timing out, say).
///
/// # Errors
/// [`restart`]'s.
pub fn restart_with(while_down: impl FnOnce()) -> Result<String, BrokerError> {
    let dir = state_dir();
    let bootstrap = bootstrap()?;
    let secure = secure_listener()?;
    let least = least_privilege_listener()?;
    down()?;
    while_down();
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
        secure.as_ref(),
    )?;
    let bootstrap_file = dir.join("bootstrap");
    fs::write(&bootstrap_file, format!("{bootstrap}\n")).map_err(io(&bootstrap_file))?;
    if let Some(secure) = secure {
        let secure_file = dir.join("secure");
        let record = secure.record(&bootstrap, least.as_ref().map(|l| l.password.as_str()));
        fs::write(&secure_file, record).map_err(io(&secure_file))?;
    }
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
    let secure_file = dir.join("secure");
    let Some(pid) = recorded_pid(&dir) else {
        let _ = fs::remove_file(&pid_file);
        let _ = fs::remove_file(&bootstrap_file);
        let _ = fs::remove_file(&secure_file);
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
    let _ = fs::remove_file(&secure_file);
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

pub(crate) fn process_alive(pid: u32) -> bool {
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

/// Resolves `kafka_2.13`, `kafka-tools` and their runtime dependencies with Maven into
/// `dir/libs`.
pub(crate) fn resolve_jars(dir: &Path) -> Result<PathBuf, BrokerError> {
    let libs = dir.join("libs");
    let marker = libs.join(format!(".resolved-{KAFKA_VERSION}-{LOG4J_VERSION}-tools"));
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
  <!-- Written by parsley-broker: the jars of a local Kafka broker. -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.parsley</groupId>
  <artifactId>local-kafka-broker</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <!-- Kafka's command-line tools: the cluster's preferred-leader elections. -->
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{LOG4J_VERSION}</version></dependency>
  </dependencies>
</project>
"#
    )
}

/// The broker's configuration: the `PLAINTEXT` listener on `port`, the controller on
/// `controller_port`, and the `SASL_SSL` listener on `secure_port` with the PKCS12 `keystore`.
fn server_properties(
    port: u16,
    controller_port: u16,
    data: &Path,
    secure_port: u16,
    keystore: &Path,
    store_password: &str,
) -> String {
    format!(
        "# Written by parsley-broker: one combined broker+controller on loopback.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{secure_port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{secure_port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
# The secure listener (parsley_broker::broker::SecureListener): SCRAM-SHA-512 against the
# credentials formatted into the metadata log, over TLS with a certificate of a throw-away CA.
# No client certificates (ssl.client.auth=none, the default).
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location={keystore}
listener.name.sasl_ssl.ssl.keystore.password={store_password}
listener.name.sasl_ssl.ssl.key.password={store_password}
# Every request authorized by KIP-11's ACLs, kept in the metadata log. Super users: the
# PLAINTEXT listener's clients, the controller and the broker (User:ANONYMOUS), and the secure
# listener's first user; its second, {LEAST_PRIVILEGE_USER}, is allowed only what ACLs allow.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users={super_users}
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
        data = data.display(),
        keystore = keystore.display(),
        super_users = SUPER_USERS.join(";"),
    )
}

pub(crate) fn log4j_config(log: &Path) -> String {
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

/// A free port on 127.0.0.1 that is none of `taken`.
pub(crate) fn free_port_other_than(taken: &[u16]) -> Result<u16, BrokerError> {
    loop {
        let p = free_port()?;
        if !taken.contains(&p) {
            return Ok(p);
        }
    }
}

pub(crate) fn run_capture(cmd: &mut Command, what: &str) -> Result<String, BrokerError> {
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

pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::secure::{User, recorded_secure_listener};
    use super::*;

    /// A state directory of its own under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "parsley-broker-{name}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn listener(dir: &Path) -> SecureListener {
        SecureListener {
            bootstrap: "127.0.0.1:9093".into(),
            mechanism: SECURE_MECHANISM,
            username: SECURE_USER.into(),
            password: "0123abcd".into(),
            ca_pem: dir.join("tls").join("ca.pem"),
            untrusted_ca_pem: dir.join("tls").join("untrusted-ca.pem"),
        }
    }

    fn properties(secure_port: u16) -> String {
        server_properties(
            9092,
            9094,
            Path::new("/data"),
            secure_port,
            Path::new("/tls/broker.p12"),
            "pw",
        )
    }

    #[test]
    fn the_record_of_the_recorded_broker_reads_back() {
        let dir = scratch("record");
        let secure = listener(&dir);
        fs::write(dir.join("bootstrap"), "127.0.0.1:9092\n").unwrap();
        fs::write(dir.join("server.properties"), properties(9093)).unwrap();
        fs::write(
            dir.join("secure"),
            secure.record("127.0.0.1:9092", Some("feed")),
        )
        .unwrap();
        assert_eq!(
            recorded_secure_listener(&dir, User::Super).unwrap(),
            Some(secure.clone())
        );
        let least = recorded_secure_listener(&dir, User::LeastPrivilege)
            .unwrap()
            .unwrap();
        assert_eq!(
            (least.username.as_str(), least.password.as_str()),
            (LEAST_PRIVILEGE_USER, "feed")
        );
        assert_eq!(least.principal(), "User:parsley-app");
        assert_eq!(
            (least.bootstrap, least.ca_pem),
            (secure.bootstrap, secure.ca_pem)
        );
        // A record of a broker started without the second user: none.
        fs::write(
            dir.join("secure"),
            listener(&dir).record("127.0.0.1:9092", None),
        )
        .unwrap();
        assert!(matches!(
            recorded_secure_listener(&dir, User::LeastPrivilege),
            Err(BrokerError::BadRecord { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_broker_without_a_recorded_secure_listener_has_none() {
        let dir = scratch("none");
        assert!(matches!(
            recorded_secure_listener(&dir, User::Super),
            Err(BrokerError::NoBroker)
        ));
        // A broker started before the listener existed: no record.
        fs::write(dir.join("bootstrap"), "127.0.0.1:9092\n").unwrap();
        fs::write(
            dir.join("server.properties"),
            "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9094\n",
        )
        .unwrap();
        assert_eq!(recorded_secure_listener(&dir, User::Super).unwrap(), None);
        // A record left behind by an earlier broker: the configuration of the one recorded
        // now has no such listener, or the record names another plaintext address.
        fs::write(
            dir.join("secure"),
            listener(&dir).record("127.0.0.1:9092", None),
        )
        .unwrap();
        assert_eq!(recorded_secure_listener(&dir, User::Super).unwrap(), None);
        fs::write(dir.join("server.properties"), properties(9095)).unwrap();
        assert_eq!(recorded_secure_listener(&dir, User::Super).unwrap(), None);
        fs::write(dir.join("server.properties"), properties(9093)).unwrap();
        fs::write(dir.join("bootstrap"), "127.0.0.1:9096\n").unwrap();
        assert_eq!(recorded_secure_listener(&dir, User::Super).unwrap(), None);
        // A record that cannot be read is an error, not a guess.
        fs::write(dir.join("bootstrap"), "127.0.0.1:9092\n").unwrap();
        fs::write(dir.join("secure"), "bootstrap=127.0.0.1:9093\n").unwrap();
        assert!(matches!(
            recorded_secure_listener(&dir, User::Super),
            Err(BrokerError::BadRecord { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn client_properties_name_protocol_mechanism_credentials_and_ca() {
        let dir = Path::new("/state");
        let secure = listener(dir);
        let props = secure.client_properties();
        let get = |k: &str| {
            props
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(get("sasl.mechanisms"), Some("SCRAM-SHA-512"));
        assert_eq!(get("sasl.username"), Some("parsley"));
        assert_eq!(get("sasl.password"), Some("0123abcd"));
        assert_eq!(get("ssl.ca.location"), Some("/state/tls/ca.pem"));
        assert_eq!(props.len(), 5);
        assert_ne!(secure.with_wrong_password().password, secure.password);
        assert_eq!(
            secure.with_untrusted_ca().ca_pem,
            Path::new("/state/tls/untrusted-ca.pem")
        );
    }

    #[test]
    fn the_plaintext_listener_is_unchanged_and_the_secure_one_is_added() {
        let props = properties(9093);
        assert!(props.contains(
            "\nlisteners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094\n"
        ));
        assert!(props.contains(
            "\nadvertised.listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093\n"
        ));
        assert!(props.contains("\ninter.broker.listener.name=PLAINTEXT\n"));
        assert!(props.contains("\ncontroller.listener.names=CONTROLLER\n"));
    }

    #[test]
    fn the_authorizer_allows_the_plaintext_clients_and_the_first_user_everything() {
        let props = properties(9093);
        assert!(props.contains(
            "\nauthorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
        ));
        assert!(props.contains("\nsuper.users=User:ANONYMOUS;User:parsley\n"));
        assert!(!props.contains("allow.everyone.if.no.acl.found"));
    }
}
