//! `cargo xtask java`: the JVM stamper's tests (`clients/java`, Maven, Java 17): the codec
//! against the repository's stamp test vectors, the interceptors on the broker at
//! `bootstrap` — a consume-produce service stamped by configuration alone — and the shop end to
//! end: a Java payments service feeding the `shop` example's pipeline (built here), with the
//! interceptors and, as the negative control, without. Maven resolves
//! `kafka-clients`, JUnit and Jackson from Maven Central when they are not in the local
//! repository; the build goes to `target/clients/java/`.

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};
use parsley_testkit::broker;

/// Runs the tests (module docs).
///
/// # Errors
/// Maven missing, or not starting.
pub fn test(bootstrap: &str) -> Result<ExitCode> {
    broker::check_maven()?;
    let pom = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/java/pom.xml");
    // The shop's pipeline, which the end-to-end test feeds with the Java payments service.
    let shop = crate::built_shop()?;
    let status = Command::new("mvn")
        .args(["-B", "-q", "-f"])
        .arg(&pom)
        .arg("test")
        .env(broker::BOOTSTRAP_ENV, bootstrap)
        .env("SHOP_BIN", shop)
        .status()
        .context("running mvn")?;
    if status.success() {
        println!(
            "xtask: the JVM stamper's tests passed (reports in target/clients/java/surefire-reports)"
        );
    }
    Ok(crate::exit_code(
        status,
        "the JVM stamper's tests (mvn test)",
    ))
}
