//! The reference: the Kafka Streams program (`compare/conformance/kafka-streams/`), one JVM for
//! a whole run, fed one scenario per line on its standard input and answering one line each.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::scenario::{Outcome, Scenario};

/// What went wrong with the Kafka Streams program.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// It could not be started, written to or read from.
    #[error("the Kafka Streams program: {0}")]
    Io(#[from] std::io::Error),
    /// It ended before answering.
    #[error("the Kafka Streams program ended before answering (its standard error says why)")]
    Ended,
    /// It answered with something that is not an outcome.
    #[error("the Kafka Streams program answered {line:?}: {source}")]
    Answer {
        /// The line it wrote.
        line: String,
        /// Why it is not an outcome.
        source: serde_json::Error,
    },
}

/// The running Kafka Streams program.
pub struct Reference {
    child: Child,
    /// Closed on drop: the program ends at the end of its input.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Reference {
    /// Starts `java -jar jar` (its standard error goes to this process's).
    ///
    /// # Errors
    /// When `java` cannot be started.
    pub fn start(jar: &Path) -> Result<Self, ReferenceError> {
        let mut child = Command::new("java")
            .args(["-Xms256m", "-Xmx1g", "-XX:+UseSerialGC", "-jar"])
            .arg(jar)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().expect("a piped standard input");
        let stdout = BufReader::new(child.stdout.take().expect("a piped standard output"));
        Ok(Reference {
            child,
            stdin: Some(stdin),
            stdout,
        })
    }

    /// Runs `scenario` through Kafka Streams' test driver.
    ///
    /// # Errors
    /// When the program cannot be reached or answers nonsense.
    pub fn run(&mut self, scenario: &Scenario) -> Result<Outcome, ReferenceError> {
        let line = serde_json::to_string(scenario).expect("a scenario serialises");
        let stdin = self.stdin.as_mut().expect("open until dropped");
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        let mut answer = String::new();
        if self.stdout.read_line(&mut answer)? == 0 {
            return Err(ReferenceError::Ended);
        }
        serde_json::from_str(&answer).map_err(|source| ReferenceError::Answer {
            line: answer.trim_end().to_string(),
            source,
        })
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        // End of input: the program removes its state directory and exits.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
