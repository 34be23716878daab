//! `cargo xtask inspect [--address HOST:PORT] [--json]`: asks a running Parsley process why
//! its records wait (`GET /explain` on its metrics endpoint) and prints a table — stage, task,
//! channel, offset, key, waits for — one row per wait (`parsley_runtime::Explanation`'s
//! `Display`).
//!
//! The request is a plain HTTP/1.1 GET over a std `TcpStream` (the endpoint is ours: it
//! answers with `Content-Length` and closes the connection), so no HTTP client is needed.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use parsley_runtime::Explanation;

/// How long connecting, sending and reading may each take (the endpoint answers within
/// `parsley_runtime::ANSWER_WITHIN`).
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The arguments of `cargo xtask inspect`.
#[derive(clap::Args)]
pub(crate) struct InspectArgs {
    /// The metrics endpoint of the process to inspect (`RuntimeConfig::metrics_address`).
    #[arg(long, default_value = "127.0.0.1:9464")]
    address: String,
    /// Print the endpoint's JSON as it came instead of the table.
    #[arg(long)]
    json: bool,
}

/// Fetches `/explain` from the address in `args` and prints it.
pub(crate) fn run(args: InspectArgs) -> Result<()> {
    let body = get(&args.address, "/explain")?;
    if args.json {
        println!("{body}");
        return Ok(());
    }
    let explanation: Explanation = serde_json::from_str(&body)
        .with_context(|| format!("the answer of {}/explain is no explanation", args.address))?;
    print!("{}", table(&explanation));
    Ok(())
}

/// The table printed for `explanation`, with a line per stage that did not answer with a fresh
/// snapshot.
fn table(explanation: &Explanation) -> String {
    let mut out = explanation.to_string();
    for stage in explanation.stages.iter().filter(|s| !s.fresh) {
        let taken = stage.taken_at_ms.map_or_else(
            || "never".to_string(),
            |t| format!("at {t} ms since the epoch"),
        );
        out.push_str(&format!(
            "(stage {} did not answer in time: its last snapshot, taken {taken}, is shown)\n",
            stage.stage
        ));
    }
    out
}

/// The body of a `GET path` on `address` (HTTP/1.1, `Connection: close`).
///
/// # Errors
/// When the address does not resolve, the connection or the exchange fails or times out, or
/// the answer is not a 200.
fn get(address: &str, path: &str) -> Result<String> {
    let target = address
        .to_socket_addrs()
        .with_context(|| format!("resolving {address}"))?
        .next()
        .with_context(|| format!("{address} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&target, IO_TIMEOUT).with_context(|| {
        format!("connecting to {address} (is a process serving its metrics endpoint there?)")
    })?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .with_context(|| format!("reading the answer of {address}{path}"))?;
    let answer = String::from_utf8(answer).context("the answer is not UTF-8")?;
    body_of(&answer).with_context(|| format!("GET {address}{path}"))
}

/// The body of a complete HTTP/1.1 answer, when its status is 200.
fn body_of(answer: &str) -> Result<String> {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("the answer has no complete head")?;
    let status = head.lines().next().unwrap_or_default();
    match status.split_whitespace().nth(1) {
        Some("200") => Ok(body.to_string()),
        Some(_) => bail!("{status}: {}", body.trim_end()),
        None => bail!("not an HTTP answer: {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_of_a_200_is_returned_and_another_status_is_an_error() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        assert_eq!(body_of(ok).unwrap(), "{}");
        let missing = "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\nnot found\n";
        assert_eq!(
            body_of(missing).unwrap_err().to_string(),
            "HTTP/1.1 404 Not Found: not found"
        );
        assert!(body_of("garbage").is_err());
    }

    #[test]
    fn a_stage_that_did_not_answer_is_said() {
        let e: Explanation = serde_json::from_str(
            r#"{"stages":[{"stage":"join","taken_at_ms":null,"fresh":false,"tasks":[]}]}"#,
        )
        .unwrap();
        assert_eq!(
            table(&e),
            "nothing waits (1 stage(s) did not answer: last snapshot shown)\n\
             (stage join did not answer in time: its last snapshot, taken never, is shown)\n"
        );
    }
}
