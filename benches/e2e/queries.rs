//! `cargo xtask bench queries`: what an interactive query of a running count costs
//! (`Running::store`, `ReadOnlyStore::get`, `range`, `all`, `get_at_least`, and
//! `GET /store/{name}/{key}` on the metrics endpoint).
//!
//! On fresh topics of four partitions, the input is preloaded with `--records` records over
//! `--keys` distinct keys (each key `records / keys` times); one instance of the count per key
//! ([`crate::parsley::count_topology`], state on disk unless `--memory`) counts them. Then, with
//! the stage idle:
//!
//! - `get`: `--reads` reads of keys drawn across the key space, each checked against the key's
//!   count in the input;
//! - `range`: reads of 100 consecutive keys, each answer checked to hold them all;
//! - `all`: one read of every key;
//! - over HTTP: `--reads` GETs of `/store/counts/{key}` on the metrics endpoint, each body
//!   checked to hold the count;
//!
//! then `get` again while the stage is busy counting as many records again (sent as fast as a
//! producer can, to keys outside the ones read); and read-your-write: `--writes` times, a `CausalProducer` sends one
//! record to a key, waits for its acknowledgement, and `get_at_least` with the producer's clock
//! must return the key's count including it — timed from the acknowledgement to the answer.
//!
//! Printed per call: how many, p50, p99 and the most, ms. A read is answered by the stream
//! thread at the end of a turn: idle, within the 5 ms slice its poll waits in; busy, after the
//! batch it is on; `get_at_least` also waits for the record to be fetched and delivered.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use parsley_runtime::{
    Admin, CausalProducer, CausalProducerConfig, ReadOnlyStore, Runtime, RuntimeConfig,
};

use crate::load::{self, Keys};
use crate::parsley::COUNT;
use crate::standby::{committed, wait};

/// The input's partitions.
const PARTITIONS: i32 = 4;
/// Keys a `range` read covers.
const RANGE_KEYS: u64 = 100;
/// How long `get_at_least` may wait, each.
const AT_LEAST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug, Clone)]
pub struct QueriesArgs {
    /// Kafka bootstrap servers.
    #[arg(long)]
    pub bootstrap: String,
    /// Records preloaded.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Reads per measured call.
    #[arg(long, default_value_t = 2_000)]
    pub reads: u64,
    /// Read-your-write rounds.
    #[arg(long, default_value_t = 200)]
    pub writes: u64,
    /// State on the heap instead of a state directory.
    #[arg(long)]
    pub memory: bool,
}

/// Latencies of one call, for its line.
struct Latencies(Vec<Duration>);

impl Latencies {
    fn line(mut self, what: &str) -> String {
        self.0.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let at = |q: f64| self.0[((self.0.len() - 1) as f64 * q).round() as usize];
        format!(
            "queries: {what:<28} {:>6} calls  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
            self.0.len(),
            ms(at(0.5)),
            ms(at(0.99)),
            ms(*self.0.last().expect("at least one call"))
        )
    }
}

/// Times `f` `n` times.
fn timed(n: u64, mut f: impl FnMut(u64) -> Result<()>) -> Result<Latencies> {
    let mut all = Vec::with_capacity(n as usize);
    for i in 0..n {
        let started = Instant::now();
        f(i)?;
        all.push(started.elapsed());
    }
    Ok(Latencies(all))
}

/// The key number `i` of `n` calls reads: spread over the key space.
fn key_of(i: u64, n: u64, keys: u64) -> u64 {
    (i * 7_919 + i * keys / n.max(1)) % keys
}

/// Runs the benchmark and prints its figures.
///
/// # Errors
/// A stage that fails, a wrong answer, a deadline passed, client errors.
pub fn run(args: &QueriesArgs) -> Result<bool> {
    ensure!(
        args.keys > RANGE_KEYS && args.records >= args.keys,
        "--keys must exceed {RANGE_KEYS} and --records be at least --keys"
    );
    let run = format!("queries-{}", std::process::id());
    let (input, output) = (format!("{run}-in"), format!("{run}-out"));
    let admin = Admin::new(&args.bootstrap, Duration::from_secs(60))?;
    crate::create(&admin, &[&input, &output], PARTITIONS)?;
    let keys = Keys::Distinct(args.keys);
    load::preload(&args.bootstrap, &input, PARTITIONS, args.records, 8, keys)?;
    let topology = crate::parsley::count_topology(&run, &input, &output)?;
    let stage = topology.stages()[0].name().to_string();
    let changelog = parsley_runtime::changelog_topic(&topology.stages()[0].group_id(&run));
    let dir = std::env::temp_dir().join(&run);
    let metrics: SocketAddr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut config = RuntimeConfig::new(&args.bootstrap)
        .instance_id(&run)
        .metrics_address(metrics);
    if !args.memory {
        config = config.state_dir(&dir);
    }
    println!(
        "queries: {} records over {} keys, {PARTITIONS} partitions, state {}",
        args.records,
        args.keys,
        if args.memory { "in memory" } else { "on disk" }
    );
    let running = Runtime::new(topology, config)
        .start()
        .context("starting the count")?;
    wait(&running, &stage, "the count of the preload", |r| {
        Ok(committed(r, &stage) >= args.records)
    })?;
    let store: ReadOnlyStore<String, i64> = running.store(COUNT)?;
    let name = |k: u64| format!("{k:08}");
    let count = |k: u64| keys.count_of(k, args.records) as i64;

    let get = timed(args.reads, |i| {
        let k = key_of(i, args.reads, args.keys);
        let v = store.get(&name(k))?;
        ensure!(
            v == Some(count(k)),
            "get {}: {v:?}, expected {}",
            name(k),
            count(k)
        );
        Ok(())
    })?;
    println!("{}", get.line("get, idle"));
    let range = timed(args.reads / 10, |i| {
        let from = key_of(i, args.reads / 10, args.keys - RANGE_KEYS);
        let got = store.range(name(from)..name(from + RANGE_KEYS))?;
        ensure!(
            got.len() as u64 == RANGE_KEYS
                && got
                    .iter()
                    .all(|(k, v)| k.parse().is_ok_and(|k| *v == count(k))),
            "range from {}: {} keys",
            name(from),
            got.len()
        );
        Ok(())
    })?;
    println!(
        "{}",
        range.line(&format!("range of {RANGE_KEYS} keys, idle"))
    );
    let all = timed(1, |_| {
        let got: BTreeMap<String, i64> = store.all()?.into_iter().collect();
        ensure!(got.len() as u64 == args.keys, "all: {} keys", got.len());
        Ok(())
    })?;
    println!("{}", all.line(&format!("all ({} keys), idle", args.keys)));
    let http = timed(args.reads, |i| {
        let k = key_of(i, args.reads, args.keys);
        let path = format!("/store/{COUNT}/{}", name(k));
        let r = minreq::get(format!("http://{metrics}{path}"))
            .with_timeout(30)
            .send()
            .with_context(|| format!("GET {path}"))?;
        let body = r.as_str().context("a UTF-8 body")?;
        ensure!(
            r.status_code == 200 && body.contains(&format!("\"value\":{}", count(k))),
            "GET {path}: {} {body}",
            r.status_code
        );
        Ok(())
    })?;
    println!("{}", http.line("GET /store/{name}/{key}"));

    // Busy: a producer writes as many records again, to keys above the ones read, as fast as
    // it can; `get` reads until the stage has counted them.
    let total = 2 * args.records;
    let (busy_get, sent) = std::thread::scope(|s| -> Result<(Latencies, u64)> {
        let writer = s.spawn(|| -> Result<()> {
            let producer = load::producer(&args.bootstrap, 5)?;
            for i in 0..args.records {
                load::send_keyed(&producer, &input, PARTITIONS, args.keys + i)?;
            }
            load::flush(&producer)
        });
        let mut latencies = Vec::new();
        let mut i = 0;
        while committed(&running, &stage) < total {
            let k = key_of(i, args.reads, args.keys);
            let started = Instant::now();
            let v = store.get(&name(k))?;
            latencies.push(started.elapsed());
            ensure!(v == Some(count(k)), "get {} (busy): {v:?}", name(k));
            i += 1;
        }
        writer.join().expect("the writer does not panic")?;
        ensure!(
            !latencies.is_empty(),
            "the stage counted the second load before any read"
        );
        Ok((Latencies(latencies), args.records))
    })?;
    println!(
        "{} ({sent} records counted meanwhile)",
        busy_get.line("get, busy")
    );

    // Read your write.
    let mut producer = CausalProducer::new(CausalProducerConfig::new(&args.bootstrap))?;
    let mut ryw = Vec::with_capacity(args.writes as usize);
    for i in 0..args.writes {
        let k = key_of(i, args.writes, args.keys);
        let before = store.get(&name(k))?.unwrap_or(0);
        producer.send(&input, name(k).as_bytes(), b"once")?;
        producer.flush()?;
        let acked = Instant::now();
        let v = store.get_at_least(&name(k), producer.clock(), AT_LEAST_TIMEOUT)?;
        ryw.push(acked.elapsed());
        if v != Some(before + 1) {
            bail!("get_at_least {}: {v:?}, expected {}", name(k), before + 1);
        }
    }
    println!("{}", Latencies(ryw).line("get_at_least after an ack"));
    running.stop().context("stopping the count")?;
    admin
        .delete_topics(&[&input, &output, &changelog])
        .context("deleting the topics")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(true)
}
