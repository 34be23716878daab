//! `cargo xtask python`: the Python stamper's tests (`clients/python`) in a virtual
//! environment under `target/python`, with `confluent-kafka` at the version its
//! `pyproject.toml` pins, installed from PyPI: the stamp codec against the repository's test
//! vectors, the stamping producer on the broker at `bootstrap`, and the shop end to end — the
//! Python payments service feeding the `shop` example's pipeline (built here), stamped and,
//! as the negative control, unstamped.
//!
//! Needs Python 3.9 or later with its `venv` module; on Debian, as root, a missing one is
//! installed from Debian's packages (`python3`, `python3-venv`).

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use parsley_testkit::broker;

/// Runs the tests (module docs).
///
/// # Errors
/// Python missing and not installable; the virtual environment or `pip` failing.
pub fn test(bootstrap: &str) -> Result<ExitCode> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let client = root.join("clients/python");
    let venv = root.join("target/python");
    let python = venv_python()?;
    // Installs the package (and its pinned dependency) only when something is missing.
    let installed = Command::new(&python)
        .args(["-c", "import confluent_kafka, parsley_stamp"])
        .current_dir(&venv)
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        println!(
            "xtask: installing clients/python and confluent-kafka from PyPI into target/python"
        );
        let ok = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--editable"])
            .arg(&client)
            .status()
            .context("running pip")?
            .success();
        if !ok {
            bail!("pip could not install clients/python");
        }
    }
    // The shop's pipeline, which the end-to-end test feeds with the Python payments service.
    let shop = crate::built_shop()?;
    let status = Command::new(&python)
        .args(["-m", "unittest", "discover", "-s", "tests", "-t", "."])
        .current_dir(&client)
        .env(broker::BOOTSTRAP_ENV, bootstrap)
        .env("SHOP_BIN", shop)
        .status()
        .context("running the Python tests")?;
    Ok(crate::exit_code(status, "the Python stamper's tests"))
}

/// The Python of the virtual environment `target/python`, created when missing.
///
/// # Errors
/// As [`make_venv`].
pub fn venv_python() -> Result<std::path::PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/python");
    let python = venv.join("bin/python");
    if !python.is_file() {
        make_venv(&venv)?;
    }
    Ok(python)
}

/// Creates the virtual environment at `venv`, installing Python's `venv` module from Debian's
/// packages first when it is missing and this process may (root, with `apt-get`).
fn make_venv(venv: &Path) -> Result<()> {
    let create = || {
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if create() {
        return Ok(());
    }
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let apt = Command::new("apt-get")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(is_root && apt) {
        bail!(
            "cannot create a Python virtual environment: install Python 3 with its venv module \
             (Debian: apt-get install python3 python3-venv)"
        );
    }
    println!("xtask: installing python3 and python3-venv from Debian's packages");
    let ok = Command::new("apt-get").arg("update").status()?.success()
        && Command::new("apt-get")
            .args([
                "install",
                "-y",
                "--no-install-recommends",
                "python3",
                "python3-venv",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?
            .success();
    if !ok || !create() {
        bail!(
            "cannot create a Python virtual environment at {}",
            venv.display()
        );
    }
    Ok(())
}
