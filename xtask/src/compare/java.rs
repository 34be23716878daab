//! The Kafka Streams programs, built with Maven and run: the reference program of
//! `compare/kafka-streams/` — `cargo xtask compare` runs its word count and shop pipelines,
//! `cargo xtask bench e2e` its `bench-pass` and `bench-count` modes — and the conformance
//! harness's program of `compare/conformance/kafka-streams/` (`cargo xtask conformance`).
//!
//! Maven builds each into the repository's `target/` (`target/compare/kafka-streams/` and
//! `target/conformance/kafka-streams/`: the jar and its dependencies in `libs/`), as it resolves
//! the broker's jars into `target/kafka/`: from Maven Central into the local Maven repository
//! once, then from there. A build is kept while the project's files are unchanged (a
//! fingerprint of them is recorded beside the jar), and Maven runs offline first, so a machine
//! that has built it once needs no network.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// A Maven program of the repository.
pub struct Program {
    /// Its directory under the repository's root.
    dir: &'static str,
    /// The property of its `pom.xml` that names its build directory.
    target_property: &'static str,
    /// Its build directory under `target/`.
    build: &'static str,
    /// The jar it makes there.
    jar: &'static str,
}

/// The reference program of `cargo xtask compare` and `cargo xtask bench e2e`.
pub const COMPARE: Program = Program {
    dir: "compare/kafka-streams",
    target_property: "compare.target",
    build: "compare/kafka-streams",
    jar: "parsley-ks-compare.jar",
};

/// The Kafka Streams side of `cargo xtask conformance`.
pub const CONFORMANCE: Program = Program {
    dir: "compare/conformance/kafka-streams",
    target_property: "conformance.target",
    build: "conformance/kafka-streams",
    jar: "parsley-ks-conformance.jar",
};

/// The repository's `target/` (or `$CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Where the reference program is built: `target/compare/kafka-streams/`.
pub fn build_dir() -> PathBuf {
    target_dir().join(COMPARE.build)
}

/// Builds the reference program unless the build of the same sources is there; returns the
/// jar.
///
/// # Errors
/// Maven missing or failing.
pub fn build() -> Result<PathBuf> {
    build_program(&COMPARE)
}

/// Builds `program` unless the build of the same sources is there; returns its jar.
///
/// # Errors
/// Maven missing or failing.
pub fn build_program(program: &Program) -> Result<PathBuf> {
    let project = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(program.dir);
    let out = target_dir().join(program.build);
    let jar = out.join(program.jar);
    let stamp = out.join(format!(".built-{:016x}", fingerprint(&project)?));
    if stamp.exists() && jar.exists() {
        println!("xtask: {} is built ({})", program.dir, jar.display());
        return Ok(jar);
    }
    parsley_testkit::broker::check_maven()?;
    if let Ok(entries) = fs::read_dir(&out) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(".built-") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    let maven = |offline: bool| -> Result<std::process::Output> {
        let mut cmd = Command::new("mvn");
        cmd.args(["-B", "-q"]);
        if offline {
            cmd.arg("-o");
        }
        cmd.arg("-f")
            .arg(project.join("pom.xml"))
            .arg(format!("-D{}={}", program.target_property, out.display()))
            .args(["clean", "package"]);
        cmd.output().context("running mvn")
    };
    println!("xtask: building {} with Maven", program.dir);
    let mut output = maven(true)?;
    if !output.status.success() {
        println!(
            "xtask: not everything is in the local Maven repository: resolving from \
             Maven Central"
        );
        output = maven(false)?;
    }
    if !output.status.success() {
        let text = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = text.lines().collect();
        bail!(
            "mvn package of {} failed ({}):\n{}",
            project.display(),
            output.status,
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
    }
    if !jar.exists() {
        bail!("mvn package did not make {}", jar.display());
    }
    fs::write(&stamp, "").with_context(|| format!("writing {}", stamp.display()))?;
    Ok(jar)
}

/// A fingerprint of the project's files (`pom.xml` and everything under `src/`): their paths
/// and contents, FNV-1a.
fn fingerprint(project: &Path) -> Result<u64> {
    let mut files = vec![project.join("pom.xml")];
    let mut dirs = vec![project.join("src")];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = e?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut hash = Fnv::default();
    for f in files {
        hash.add(
            f.strip_prefix(project)
                .unwrap_or(&f)
                .to_string_lossy()
                .as_bytes(),
        );
        hash.add(&fs::read(&f).with_context(|| format!("reading {}", f.display()))?);
    }
    Ok(hash.0)
}

/// 64-bit FNV-1a: stable across builds and toolchains, unlike the standard library's hasher.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for b in bytes.iter().chain([&0xff]) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The command that runs `mode` (`wordcount` or `shop`) of the program in `jar` with `args`
/// (`--name value` pairs), its state under the build directory.
pub fn command(jar: &Path, mode: &str, args: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(["-Xms256m", "-Xmx1g", "-jar"])
        .arg(jar)
        .arg(mode)
        .arg("--state-dir")
        .arg(build_dir().join("state"));
    for (name, value) in args {
        cmd.arg(format!("--{name}")).arg(value);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_1a_separates_its_inputs() {
        let of = |parts: &[&[u8]]| {
            let mut h = Fnv::default();
            for p in parts {
                h.add(p);
            }
            h.0
        };
        assert_eq!(
            of(&[b"pom.xml", b"<project/>"]),
            of(&[b"pom.xml", b"<project/>"])
        );
        assert_ne!(of(&[b"ab", b"c"]), of(&[b"a", b"bc"]));
        assert_ne!(of(&[b"a"]), of(&[b"b"]));
    }
}
