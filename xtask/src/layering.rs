//! The layering of the crates, checked on the dependency tree (`cargo xtask layering`, and a
//! step of `cargo xtask test`).
//!
//! Two rules:
//! - **direction**: each published crate depends (normal dependencies) only on the Parsley
//!   crates below it — clock ← gate ← stage ← task ← runtime, the DSL on the stage layer, the
//!   facade on all of them ([`ALLOWED`]);
//! - **no C below the Kafka half**: the pure crates, the facade without its `kafka` feature,
//!   and the local broker's launcher (`parsley-broker`, what `cargo kafka up` builds) have no
//!   Kafka client, no OpenSSL and no C build in their normal and build dependencies
//!   ([`FORBIDDEN`]): a crate whose tests use only the DSL and the test driver builds without
//!   a C compiler, and starting the broker compiles in seconds.
//!
//! Both are read from `cargo tree`, so they hold for what Cargo would build.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Each published crate, and the broker's launcher, with the Parsley crates it may depend on.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("parsley-clock", &[]),
    ("parsley-broker", &["parsley-clock"]),
    ("parsley-gate", &["parsley-clock"]),
    ("parsley-stage", &["parsley-clock", "parsley-gate"]),
    (
        "parsley-task",
        &["parsley-clock", "parsley-gate", "parsley-stage"],
    ),
    ("parsley-dsl", &["parsley-clock", "parsley-stage"]),
    ("parsley-registry", &["parsley-stage"]),
    (
        "parsley-runtime",
        &[
            "parsley-clock",
            "parsley-gate",
            "parsley-stage",
            "parsley-task",
        ],
    ),
    (
        "parsley",
        &[
            "parsley-clock",
            "parsley-stage",
            "parsley-dsl",
            "parsley-task",
            "parsley-runtime",
        ],
    ),
];

/// Crates that mean a Kafka client or a C build.
pub const FORBIDDEN: &[&str] = &[
    "rdkafka",
    "rdkafka-sys",
    "openssl-sys",
    "openssl-src",
    "libz-sys",
    "cc",
    "cmake",
    "tikv-jemalloc-sys",
];

/// The pure side of the line: each package, and the `cargo tree` flags that select it.
const PURE: &[(&str, &[&str])] = &[
    ("parsley-clock", &[]),
    ("parsley-gate", &[]),
    ("parsley-stage", &[]),
    ("parsley-task", &[]),
    ("parsley-dsl", &[]),
    ("parsley-registry", &[]),
    ("parsley", &["--no-default-features"]),
    ("parsley-broker", &[]),
];

/// Checks both rules; the error names every breach.
pub fn check() -> Result<()> {
    let mut breaches = direction_breaches()?;
    breaches.extend(c_breaches()?);
    if !breaches.is_empty() {
        bail!("the layering is broken:\n  {}", breaches.join("\n  "));
    }
    println!(
        "xtask: layering holds: {} crates depend only on the crates below them; {} have no Kafka client and no C build",
        ALLOWED.len(),
        PURE.len()
    );
    Ok(())
}

/// The breaches of the direction rule.
fn direction_breaches() -> Result<Vec<String>> {
    let mut breaches = Vec::new();
    for (package, allowed) in ALLOWED {
        let direct = tree(package, &["--depth", "1", "-e", "normal"])?;
        for dep in direct.iter().filter(|d| d.starts_with("parsley")) {
            if dep != package && !allowed.contains(&dep.as_str()) {
                breaches.push(format!("{package} depends on {dep}, which is not below it"));
            }
        }
    }
    Ok(breaches)
}

/// The breaches of the no-C rule: a package of [`PURE`] with a [`FORBIDDEN`] crate in its
/// normal or build dependencies.
fn c_breaches() -> Result<Vec<String>> {
    let mut breaches = Vec::new();
    for (package, flags) in PURE {
        let mut args = vec!["-e", "normal,build"];
        args.extend_from_slice(flags);
        let all = tree(package, &args)?;
        for dep in all.iter().filter(|d| FORBIDDEN.contains(&d.as_str())) {
            breaches.push(format!(
                "{package}{} has {dep} in its dependency tree",
                if flags.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", flags.join(" "))
                }
            ));
        }
    }
    Ok(breaches)
}

/// The package names in `cargo tree -p package args`.
fn tree(package: &str, args: &[&str]) -> Result<BTreeSet<String>> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
        .args(["tree", "--prefix", "none", "--format", "{p}", "-p", package])
        .args(args)
        .output()
        .with_context(|| format!("running cargo tree -p {package}"))?;
    if !output.status.success() {
        bail!(
            "cargo tree -p {package} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(parse_tree(&String::from_utf8_lossy(&output.stdout)))
}

/// Package names from `cargo tree --prefix none --format {p}` lines (`name vX.Y.Z (path)`,
/// possibly followed by ` (*)`).
fn parse_tree(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_lines_give_package_names() {
        let names = parse_tree(
            "parsley-task v0.1.0 (/w/crates/parsley-task)\nrdkafka v0.39.0\nserde v1.0.0 (*)\n\n",
        );
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["parsley-task", "rdkafka", "serde"]
        );
    }

    /// The rule on the real dependency tree (`cargo tree`, no build): the launcher that `cargo
    /// kafka up` compiles, like the pure crates, has no Kafka client, OpenSSL or C build.
    #[test]
    fn the_broker_launcher_and_the_pure_crates_build_no_c() {
        assert!(PURE.iter().any(|(p, _)| *p == "parsley-broker"));
        let breaches = c_breaches().unwrap();
        assert!(breaches.is_empty(), "{breaches:#?}");
    }

    #[test]
    fn every_allowed_dependency_is_below_its_crate() {
        // The order of ALLOWED is the layering: a crate may only name crates listed before it.
        for (i, (package, allowed)) in ALLOWED.iter().enumerate() {
            for dep in *allowed {
                let below = ALLOWED[..i].iter().any(|(p, _)| p == dep);
                assert!(
                    below,
                    "{package} may depend on {dep}, which is not listed before it"
                );
            }
        }
    }
}
