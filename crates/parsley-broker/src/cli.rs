//! The commands `cargo kafka up|down|status|read` (the binary `parsley-kafka`) and `cargo
//! xtask kafka …` share: what each does and prints.

use std::process::{Command, ExitCode};

use crate::broker::{self, BOOTSTRAP_ENV, BrokerError, Status, Up};
use crate::cluster;

/// The usage text of `cargo kafka`.
pub const USAGE: &str = "\
usage: cargo kafka <command>

  up [--brokers N]   start this checkout's broker (target/kafka/) unless it runs, and wait
                     until it answers; with N > 1 a separate local cluster of N nodes
  down               stop the broker and the cluster this checkout started
  status             whether they run, where, and the secure listener's credentials
  read TOPIC [--last]
                     print TOPIC as a read_committed consumer sees it, up to its end offsets:
                     key<TAB>value per record, then its headers (the stamp as its size); with
                     --last the last value of each key, sorted by key

  registry up|down|status
                     the local schema registry (Confluent REST API, in memory): start it
                     unless it runs and print its URL, stop it, or say where it runs

$PARSLEY_BOOTSTRAP (host:port) points `read` at another cluster.";

/// Runs `cargo kafka` with the arguments after the program name; prints errors and usage.
pub fn main(args: &[String]) -> ExitCode {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["up"] => up(1),
        ["up", "--brokers", n] => match n.parse::<usize>() {
            Ok(n) => up(n),
            Err(_) => return usage(&format!("--brokers takes a number, not {n:?}")),
        },
        ["up", flag] if flag.starts_with("--brokers=") => {
            let n = &flag["--brokers=".len()..];
            match n.parse::<usize>() {
                Ok(n) => up(n),
                Err(_) => return usage(&format!("--brokers takes a number, not {n:?}")),
            }
        }
        ["down"] => down(),
        ["status"] => {
            status();
            Ok(())
        }
        ["registry", "up"] => registry_up(),
        ["registry", "down"] => {
            match crate::registry::down() {
                Ok(true) => println!("registry: stopped"),
                Ok(false) => println!("registry: not running"),
                Err(e) => {
                    eprintln!("registry: error: {e}");
                    return ExitCode::FAILURE;
                }
            }
            Ok(())
        }
        ["registry", "status"] => {
            match crate::registry::url() {
                Some(url) => println!("registry: running at {url}"),
                None => println!("registry: not running"),
            }
            Ok(())
        }
        // The registry's own process (started by `registry up`); `--dir` names the state
        // directory so that `registry down` recognises it.
        ["registry", "serve", "--port", port, "--dir", _] => match port.parse::<u16>() {
            Ok(port) => crate::registry::serve_forever(port),
            Err(_) => return usage(&format!("--port takes a port number, not {port:?}")),
        },
        ["read", topic] => read(topic, false),
        ["read", topic, "--last"] | ["read", "--last", topic] => read(topic, true),
        [] | ["help"] | ["-h"] | ["--help"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => return usage(&format!("unknown arguments {args:?}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kafka: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("kafka: {problem}\n\n{USAGE}");
    ExitCode::from(2)
}

/// Starts the single broker (`brokers` 1) or a local cluster of `brokers` nodes unless it
/// runs; prints where it answers (the broker: and its secure listener).
///
/// # Errors
/// `brokers` 0; missing Java or Maven that cannot be installed; the errors of
/// [`broker::up`] and [`cluster::up`].
pub fn up(brokers: usize) -> Result<(), BrokerError> {
    if brokers == 0 {
        return Err(BrokerError::BadArgument(
            "--brokers must be at least 1".into(),
        ));
    }
    ensure_prerequisites()?;
    if brokers > 1 {
        match cluster::up(brokers)? {
            Up::Started(b) => println!("kafka: cluster of {brokers} nodes started, bootstrap {b}"),
            Up::AlreadyRunning(b) => {
                println!("kafka: cluster of {brokers} nodes already running, bootstrap {b}")
            }
        }
        return Ok(());
    }
    match broker::up()? {
        Up::Started(b) => println!("kafka: started, bootstrap {b}"),
        Up::AlreadyRunning(b) => println!("kafka: already running, bootstrap {b}"),
    }
    print_secure_listener();
    Ok(())
}

/// Stops the broker and the cluster this checkout started; prints what it did.
///
/// # Errors
/// As [`broker::down`] and [`cluster::down`].
pub fn down() -> Result<(), BrokerError> {
    if broker::down()? {
        println!("kafka: stopped");
    } else {
        println!("kafka: not running");
    }
    if cluster::down()? {
        println!("kafka: cluster stopped");
    }
    Ok(())
}

/// Prints whether the broker and the cluster run, and where.
pub fn status() {
    match broker::status() {
        Status::Running { bootstrap, pid } => {
            println!("kafka: running (pid {pid}), bootstrap {bootstrap}");
            print_secure_listener();
        }
        Status::Unresponsive { pid } => {
            println!("kafka: process {pid} is alive but does not answer")
        }
        Status::Stopped => println!("kafka: not running"),
    }
    print_cluster_status();
}

/// Starts the local schema registry unless it runs (see [`crate::registry::up`]); prints its
/// URL.
///
/// # Errors
/// As [`crate::registry::up`].
pub fn registry_up() -> Result<(), BrokerError> {
    let program = std::env::current_exe().map_err(crate::broker::io(std::path::Path::new(
        "the current executable",
    )))?;
    let url = crate::registry::up(&program)?;
    println!("registry: running at {url}");
    Ok(())
}

/// Prints `topic` as a `read_committed` consumer sees it up to its end offsets (see
/// [`crate::read::print_topic`]), from `$PARSLEY_BOOTSTRAP` or the local broker, which is
/// started (and left running) when it does not run.
///
/// # Errors
/// As [`up`]; [`BrokerError::Read`] when the topic cannot be read.
pub fn read(topic: &str, last: bool) -> Result<(), BrokerError> {
    let bootstrap = match std::env::var(BOOTSTRAP_ENV) {
        Ok(b) if !b.trim().is_empty() => b.trim().to_string(),
        _ => {
            if !matches!(broker::status(), Status::Running { .. }) {
                ensure_prerequisites()?;
                eprintln!("kafka: starting the local broker");
            }
            broker::up()?.bootstrap().to_string()
        }
    };
    crate::read::print_topic(&bootstrap, topic, last, &mut std::io::stdout().lock()).map_err(
        |source| BrokerError::Read {
            topic: topic.to_string(),
            source,
        },
    )
}

/// Prints the local broker's secure listener, or that it has none.
pub fn print_secure_listener() {
    match broker::secure_listener() {
        // The password too: it is made anew for this local test broker at each start, and a
        // client needs it to connect (the broker listens on 127.0.0.1 only).
        Ok(Some(s)) => println!(
            "kafka: secure listener {} (SASL_SSL, {}, user {}, password {}, CA {})",
            s.bootstrap,
            s.mechanism,
            s.username,
            s.password,
            // The path as a reader would type it (`…/crates/parsley-broker/../../target` → `…/target`).
            s.ca_pem
                .canonicalize()
                .unwrap_or(s.ca_pem.clone())
                .display()
        ),
        Ok(None) => println!(
            "kafka: no secure listener recorded (a broker started before it existed: \
             `cargo kafka down` and `up` give it one)"
        ),
        Err(e) => println!("kafka: secure listener unknown: {e}"),
    }
    if let Ok(Some(l)) = broker::least_privilege_listener() {
        println!(
            "kafka: least-privilege user {} on it (password {}): no ACL until granted",
            l.username, l.password
        );
    }
}

/// Prints the cluster's nodes and which run, or nothing when none was started.
pub fn print_cluster_status() {
    let Ok(nodes) = cluster::nodes() else { return };
    if cluster::bootstrap().is_err() {
        return;
    }
    let alive = cluster::alive();
    let line: Vec<String> = nodes
        .iter()
        .map(|n| {
            let state = if alive.contains(&n.id) { "up" } else { "down" };
            format!("node {} at {} {state}", n.id, n.address())
        })
        .collect();
    println!("kafka: cluster: {}", line.join(", "));
}

/// Java and Maven, with the Debian package that has each and the error when it is missing.
const PREREQUISITES: [(&str, &str, &str); 2] = [
    (
        "java",
        "openjdk-17-jre-headless",
        "install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)",
    ),
    (
        "mvn",
        "maven",
        "install Apache Maven (Debian: apt-get install maven)",
    ),
];

/// Installs Java and Maven from Debian's packages when they are missing and this process may
/// (root, with `apt-get`).
///
/// # Errors
/// [`BrokerError::MissingProgram`] for the first one missing when it may not install them;
/// [`BrokerError::CommandFailed`] when `apt-get` fails.
pub fn ensure_prerequisites() -> Result<(), BrokerError> {
    let missing: Vec<_> = PREREQUISITES
        .into_iter()
        .filter(|(program, _, _)| !on_path(program))
        .collect();
    let Some(&(program, _, install)) = missing.first() else {
        return Ok(());
    };
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !(is_root && on_path("apt-get")) {
        return Err(BrokerError::MissingProgram { program, install });
    }
    let packages: Vec<&str> = missing.iter().map(|(_, p, _)| *p).collect();
    eprintln!(
        "kafka: installing {} from Debian's packages",
        packages.join(" ")
    );
    let failed = |status: String| BrokerError::CommandFailed {
        what: format!("apt-get install {}", packages.join(" ")),
        status,
        output: String::new(),
    };
    let ok = Command::new("apt-get")
        .arg("update")
        .status()
        .map_err(|e| failed(e.to_string()))?
        .success()
        && Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| failed(e.to_string()))?
            .success();
    if !ok {
        return Err(failed("a non-zero exit".into()));
    }
    Ok(())
}

/// Whether `program` is a file in a directory of `PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}
