//! `cargo xtask registry`: the schema-registry codecs (`crates/parsley-registry`) against a
//! real registry — Apicurio Registry built from Maven Central and started for the run
//! (`parsley_broker::apicurio`), or the one `$PARSLEY_REGISTRY_URL` names — and against
//! Confluent's own serializers: Python's `confluent-kafka` with its schema
//! registry client, `AvroSerializer` and `JSONSerializer`, each side reading what the other
//! wrote (the test `interop`, ignored by a plain `cargo test`).
//!
//! The Python side runs in the virtual environment of `cargo xtask python` (`target/python`),
//! with `confluent-kafka`'s `avro`, `json` and `schemaregistry` extras at the version
//! `clients/python/pyproject.toml` pins, installed from PyPI when missing. A registry this
//! command started is stopped at its end; one the environment names is used and left running.

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use parsley_broker::{apicurio, registry};

/// Runs the tests (module docs).
///
/// # Errors
/// Python or the packages missing and not installable; the registry not starting.
pub fn test() -> Result<ExitCode> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = crate::python::venv_python()?;
    let pyproject = std::fs::read_to_string(root.join("clients/python/pyproject.toml"))
        .context("reading clients/python/pyproject.toml")?;
    let version = pyproject
        .split("confluent-kafka==")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .context("no confluent-kafka== pin in clients/python/pyproject.toml")?;
    let installed = Command::new(&python)
        .args([
            "-c",
            "import confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.json_schema",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        println!(
            "xtask: installing confluent-kafka's schema registry serializers from PyPI into target/python"
        );
        let ok = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet"])
            .arg(format!(
                "confluent-kafka[avro,json,schemaregistry]=={version}"
            ))
            .status()
            .context("running pip")?
            .success();
        if !ok {
            bail!("pip could not install confluent-kafka's serializers");
        }
    }
    // A registry named by the environment is used as it is; otherwise a real one is started:
    // Apicurio Registry, built from Maven Central (module `parsley_broker::apicurio`).
    let given = std::env::var(registry::REGISTRY_URL_ENV).ok();
    let started = match given {
        Some(_) => None,
        None => Some(apicurio::Apicurio::start()?),
    };
    let url = given.unwrap_or_else(|| started.as_ref().expect("started").url().to_string());
    println!("xtask: the schema registry at {url}");
    // One test at a time: Apicurio refuses a subject's first two registrations made at once.
    let status = crate::cargo()
        .args([
            "test",
            "-p",
            "parsley-registry",
            "--all-targets",
            "--",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(registry::REGISTRY_URL_ENV, &url)
        .env("PARSLEY_PYTHON", &python)
        .status()
        .context("running the registry codecs' tests");
    drop(started);
    Ok(crate::exit_code(status?, "the registry codecs' tests"))
}
