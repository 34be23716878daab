//! A real Confluent-compatible schema registry for the tests: Apicurio Registry
//! [`APICURIO_VERSION`], built from Maven Central and run on the machine's Java 17, in memory.
//! Its Confluent API is at `/apis/ccompat/v7` ([`Apicurio::url`]).
//!
//! Apicurio publishes its application as a plain jar that needs Quarkus' build step, so
//! [`Apicurio::start`] writes a small Maven project into `apicurio/` of the broker's
//! [`state_dir`](crate::broker::state_dir) — a dependency on the application, Apicurio's and
//! Quarkus' BOMs, and `quarkus-maven-plugin`'s `build` goal — and builds it once (about 75 s
//! and 210 MB of downloads on a fresh machine; the runner jar is kept). Two artifacts the
//! application names are not served by Maven Central and are replaced: the JSON Schema
//! validator `com.github.everit-org.json-schema:org.everit.json.schema` (the same library is
//! published as `com.github.erosb:everit-json-schema`), and the configuration-index extension,
//! pinned to the one version whose two halves Central serves.
//!
//! Invariants: [`Apicurio::start`] returns only once `GET /subjects` answers (no fixed sleep),
//! or fails naming the log's tail; the process is this value's and is killed when it drops.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::broker::{BrokerError, check_java, check_maven, io, run_capture, state_dir};

/// The Apicurio Registry version the tests run.
pub const APICURIO_VERSION: &str = "2.4.2.Final";
/// The Quarkus version that Apicurio version is built with (its parent POM's).
const QUARKUS_VERSION: &str = "2.16.4.Final";
/// How long a start may take before it is a failure (a loaded two-core machine: ~25 s).
const START_BOUND: Duration = Duration::from_secs(180);

/// A running Apicurio Registry (module docs).
pub struct Apicurio {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Apicurio {
    /// Builds the registry when it is not built yet and starts it on a free port of
    /// 127.0.0.1; returns once its Confluent API answers.
    ///
    /// # Errors
    /// Java or Maven missing; the build failing (Maven's output); the registry exiting or not
    /// answering within 180 s (the tail of its log).
    pub fn start() -> Result<Self, BrokerError> {
        check_java()?;
        let dir = state_dir().join("apicurio");
        let jar = build(&dir)?;
        let port = crate::broker::free_port_other_than(&[])?;
        let log = dir.join("run.log");
        let out = fs::File::create(&log).map_err(io(&log))?;
        let err = out.try_clone().map_err(io(&log))?;
        let child = Command::new("java")
            .arg("-Xmx512m")
            .arg("-Dquarkus.http.host=127.0.0.1")
            .arg(format!("-Dquarkus.http.port={port}"))
            .arg("-jar")
            .arg(&jar)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(&jar))?;
        let mut registry = Apicurio {
            child,
            url: format!("http://127.0.0.1:{port}/apis/ccompat/v7"),
            dir,
        };
        let started = Instant::now();
        while !crate::registry::answers(&registry.url, Duration::from_secs(2)) {
            let exited = registry.child.try_wait().ok().flatten();
            if exited.is_some() || started.elapsed() > START_BOUND {
                return Err(BrokerError::CommandFailed {
                    what: format!("Apicurio Registry {APICURIO_VERSION} at {}", registry.url),
                    status: exited.map_or_else(|| "not answering".into(), |s| s.to_string()),
                    output: tail(&registry.dir.join("run.log")),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(registry)
    }

    /// The base URL of its Confluent API (`http://127.0.0.1:PORT/apis/ccompat/v7`).
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Apicurio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The runner jar in `dir`, built first when missing.
fn build(dir: &Path) -> Result<PathBuf, BrokerError> {
    let jar = dir.join("target/apicurio-registry-runner-1.0-runner.jar");
    let marker = dir.join(format!(".built-{APICURIO_VERSION}"));
    if jar.exists() && marker.exists() {
        return Ok(jar);
    }
    check_maven()?;
    let resources = dir.join("src/main/resources");
    fs::create_dir_all(&resources).map_err(io(&resources))?;
    let pom = dir.join("pom.xml");
    fs::write(&pom, pom_xml()).map_err(io(&pom))?;
    let properties = resources.join("application.properties");
    fs::write(
        &properties,
        "# Quarkus indexes the prebuilt application jar's beans and resources.\n\
         quarkus.index-dependency.apicurio-app.group-id=io.apicurio\n\
         quarkus.index-dependency.apicurio-app.artifact-id=apicurio-registry-app\n",
    )
    .map_err(io(&properties))?;
    println!(
        "parsley-broker: building Apicurio Registry {APICURIO_VERSION} with Maven (the first time: about 75 s)"
    );
    run_capture(
        Command::new("mvn").args([
            "-q",
            "-B",
            "-ntp",
            "-f",
            &pom.to_string_lossy(),
            "package",
            "-DskipTests",
        ]),
        "mvn package (Apicurio Registry)",
    )?;
    fs::write(&marker, "").map_err(io(&marker))?;
    Ok(jar)
}

fn pom_xml() -> String {
    format!(
        r#"<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- Written by parsley-broker: Apicurio Registry built from Maven Central. -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.parsley</groupId>
  <artifactId>apicurio-registry-runner</artifactId>
  <version>1.0</version>
  <packaging>jar</packaging>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencyManagement>
    <dependencies>
      <!-- Central serves this extension's -deployment half only at 0.1.10.Final. -->
      <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-common-app-components-config-index</artifactId><version>0.1.10.Final</version></dependency>
      <dependency><groupId>io.apicurio</groupId><artifactId>apicurio-registry</artifactId><version>{APICURIO_VERSION}</version><type>pom</type><scope>import</scope></dependency>
      <dependency><groupId>io.quarkus</groupId><artifactId>quarkus-bom</artifactId><version>{QUARKUS_VERSION}</version><type>pom</type><scope>import</scope></dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId><artifactId>apicurio-registry-app</artifactId><version>{APICURIO_VERSION}</version>
      <exclusions>
        <!-- Not on Central; the same library is, as com.github.erosb:everit-json-schema. -->
        <exclusion><groupId>com.github.everit-org.json-schema</groupId><artifactId>org.everit.json.schema</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency><groupId>com.github.erosb</groupId><artifactId>everit-json-schema</artifactId><version>1.14.2</version></dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>io.quarkus</groupId><artifactId>quarkus-maven-plugin</artifactId><version>{QUARKUS_VERSION}</version>
        <executions><execution><goals><goal>build</goal></goals></execution></executions>
      </plugin>
    </plugins>
  </build>
</project>
"#
    )
}

/// The last lines of `log`, for an error.
fn tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
