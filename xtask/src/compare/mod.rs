//! `cargo xtask compare`: the word count and shop pipelines in Parsley and in Kafka Streams 4.4
//! on the same input, compared key by key with each other and with the answer the inputs give.
//!
//! 1. Builds the Kafka Streams program with Maven ([`java`]) and the `wordcount` and `shop`
//!    binaries (release).
//! 2. Creates this run's topics (names unique per run, 4 partitions each): the inputs `lines`,
//!    `orders` and `payments`, and an output per pipeline and side.
//! 3. Writes the inputs: `wordcount produce-lines`; `shop produce-orders`, then the payments
//!    service `shop payments` (every K-th order unpaid; `--clock-skew-ms` passed on).
//! 4. Reads the inputs back and computes the expected answers: the count of every word, and
//!    per customer the amounts of every paid order ([`verdict`]).
//! 5. Runs each pipeline in Kafka Streams to completion (the program decides it from the
//!    application's committed offsets), then in Parsley:
//!    `wordcount run --bootstrap B --application-id A --input T --output OUT --until-caught-up`
//!    and
//!    `shop run --bootstrap B --application-id A --orders T --payments T --output OUT --until-caught-up`,
//!    each exiting 0 once it has consumed and committed everything.
//! 6. Reads every output to its end (`read_committed`), takes the last value per key (Kafka
//!    Streams: 8-byte big-endian `Long`; Parsley: a JSON number), compares each side with the
//!    expected answer and the sides with each other, and prints a summary per pipeline; for
//!    the shop also the answers side by side (the first customers, the totals, and how many
//!    customers each side has right).
//!
//! The exit status is non-zero when a side differs from the expected answer or from the other
//! side, except for the shop under a clock skew: a payments service whose clock runs behind
//! stamps payments before their orders, and Kafka Streams' stream–table join, which goes by
//! record timestamps, then misses orders it has not read yet. That shortfall is expected and
//! reported; a Parsley side that differs from the expected answer still fails (its delivery
//! gate releases a payment only after the order its stamp claims).

pub(crate) mod java;
mod topics;
mod verdict;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parsley_runtime::Admin;

use verdict::{Finals, Outcome, Verdict};

/// Customers the shop's side-by-side table lists (then its totals).
const SIDE_BY_SIDE_ROWS: usize = 5;

/// Partitions of every topic the comparison creates.
const PARTITIONS: i32 = 4;

/// The options of `cargo xtask compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Lines of the word count's input.
    #[arg(long, default_value_t = 20_000)]
    lines: u64,
    /// Orders of the shop's input.
    #[arg(long, default_value_t = 5_000)]
    orders: u64,
    /// Customers the orders are spread over.
    #[arg(long, default_value_t = 50)]
    customers: u64,
    /// Seed of both generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Every K-th order stays unpaid.
    #[arg(long, default_value_t = 7)]
    skip_every: u64,
    /// The payments service stamps each payment with its order's timestamp minus this many ms
    /// (a clock running behind); 0: the time of sending. Above 0, Kafka Streams is expected to
    /// miss payments in the shop's join.
    #[arg(long, default_value_t = 0)]
    clock_skew_ms: i64,
    /// Leave a broker this command started running afterwards.
    #[arg(long)]
    keep_broker: bool,
}

/// The two example binaries, built in release mode.
struct Binaries {
    wordcount: PathBuf,
    shop: PathBuf,
}

/// This run's names: topics and application ids.
struct Names {
    lines: String,
    orders: String,
    payments: String,
    wordcount_ks: String,
    wordcount_parsley: String,
    shop_ks: String,
    shop_parsley: String,
    prefix: String,
}

impl Names {
    fn new() -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let prefix = format!("compare-{}-{}", now.as_millis(), std::process::id());
        let name = |what: &str| format!("{prefix}-{what}");
        Names {
            lines: name("lines"),
            orders: name("orders"),
            payments: name("payments"),
            wordcount_ks: name("wordcount-ks"),
            wordcount_parsley: name("wordcount-parsley"),
            shop_ks: name("shop-ks"),
            shop_parsley: name("shop-parsley"),
            prefix,
        }
    }

    /// The application id (and consumer group) of one side of one pipeline: the output
    /// topic's name with `-app`.
    fn app(output: &str) -> String {
        format!("{output}-app")
    }
}

/// Step timings, printed at the end.
#[derive(Default)]
struct Timings(Vec<(String, Duration)>);

impl Timings {
    /// Runs `f` as step `what`, announcing it and recording its duration.
    fn step<T>(&mut self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        println!("xtask: compare: {what}");
        let started = Instant::now();
        let out = f().with_context(|| what.to_string())?;
        self.0.push((what.to_string(), started.elapsed()));
        Ok(out)
    }
}

/// Runs `cargo xtask compare`.
///
/// # Errors
/// A build, a broker, a generator or a pipeline that fails, or outputs that cannot be read.
pub fn run(args: CompareArgs) -> Result<ExitCode> {
    if args.customers == 0 {
        bail!("--customers must be at least 1");
    }
    if args.clock_skew_ms < 0 {
        bail!("--clock-skew-ms must not be negative");
    }
    super::ensure_prerequisites()?;
    parsley_testkit::broker::check_java()?;
    let started = Instant::now();
    let mut t = Timings::default();
    let jar = t.step("build the Kafka Streams program (Maven)", java::build)?;
    let bins = t.step("build the example binaries (release)", build_binaries)?;
    super::with_broker(args.keep_broker, |bootstrap| {
        let code = compare(bootstrap, &args, &jar, &bins, &mut t)?;
        println!("xtask: compare: timings");
        for (what, d) in &t.0 {
            println!("  {:>7.1} s  {what}", d.as_secs_f64());
        }
        println!("  {:>7.1} s  in all", started.elapsed().as_secs_f64());
        Ok(code)
    })
}

/// Builds the `wordcount` and `shop` binaries in release mode.
fn build_binaries() -> Result<Binaries> {
    let status = super::cargo()
        .args([
            "build",
            "--release",
            "--package",
            "wordcount",
            "--package",
            "shop",
        ])
        .args(["--bin", "wordcount", "--bin", "shop"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release of the examples failed ({status})");
    }
    let release = java::target_dir().join("release");
    Ok(Binaries {
        wordcount: release.join("wordcount"),
        shop: release.join("shop"),
    })
}

/// Runs `cmd` (described as `what`); fails unless it exits 0.
fn run_ok(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} exited with {status}");
    }
    Ok(())
}

/// Everything after the builds, on the cluster at `bootstrap`.
fn compare(
    bootstrap: &str,
    args: &CompareArgs,
    jar: &Path,
    bins: &Binaries,
    t: &mut Timings,
) -> Result<ExitCode> {
    let n = Names::new();
    let admin = Admin::new(bootstrap, Duration::from_secs(30))?;
    t.step("create this run's topics", || {
        let topics = [
            n.lines.as_str(),
            &n.orders,
            &n.payments,
            &n.wordcount_ks,
            &n.shop_ks,
            &n.wordcount_parsley,
            &n.shop_parsley,
        ];
        println!(
            "xtask: compare: topics {}-*: {}",
            n.prefix,
            topics
                .iter()
                .map(|t| &t[n.prefix.len() + 1..])
                .collect::<Vec<_>>()
                .join(", ")
        );
        topics::create(&admin, &topics, PARTITIONS)
    })?;

    // The inputs.
    let (lines, seed) = (args.lines.to_string(), args.seed.to_string());
    t.step("write the lines (wordcount produce-lines)", || {
        run_ok(
            Command::new(&bins.wordcount)
                .args([
                    "produce-lines",
                    "--bootstrap",
                    bootstrap,
                    "--topic",
                    &n.lines,
                ])
                .args(["--lines", &lines, "--seed", &seed]),
            "wordcount produce-lines",
        )
    })?;
    t.step("write the orders (shop produce-orders)", || {
        run_ok(
            Command::new(&bins.shop)
                .args([
                    "produce-orders",
                    "--bootstrap",
                    bootstrap,
                    "--topic",
                    &n.orders,
                ])
                .args(["--orders", &args.orders.to_string()])
                .args(["--customers", &args.customers.to_string(), "--seed", &seed]),
            "shop produce-orders",
        )
    })?;
    t.step("pay the orders (shop payments)", || {
        run_ok(
            Command::new(&bins.shop)
                .args(["payments", "--bootstrap", bootstrap])
                .args(["--orders-topic", &n.orders, "--payments-topic", &n.payments])
                .args(["--group", &format!("{}-payments-service", n.prefix)])
                .args(["--skip-every", &args.skip_every.to_string()])
                .args(["--clock-skew-ms", &args.clock_skew_ms.to_string()]),
            "shop payments",
        )
    })?;

    // The answers the inputs give.
    let (expected_words, expected_shop) =
        t.step("compute the expected answers from the inputs", || {
            let lines = topics::read_to_end(bootstrap, &admin, &n.lines)?;
            let words = verdict::expected_word_counts(&lines)?;
            let orders = topics::read_to_end(bootstrap, &admin, &n.orders)?;
            let payments = topics::read_to_end(bootstrap, &admin, &n.payments)?;
            let shop = verdict::expected_revenue(&orders, &payments)?;
            println!(
                "xtask: compare: expected: {} lines give {} words, {} distinct; {} orders and {} \
             payments ({} of no order) give {} cents over {} customers; {} payments ({} cents) \
             are timestamped before their orders",
                lines.len(),
                words.values().sum::<i64>(),
                words.len(),
                shop.orders,
                shop.payments,
                shop.orphans,
                shop.revenue.values().sum::<i64>(),
                shop.revenue.len(),
                shop.early,
                shop.early_cents
            );
            Ok((words, shop))
        })?;

    // Kafka Streams.
    let ks_app = |out: &str| Names::app(out);
    t.step("Kafka Streams: word count", || {
        run_ok(
            &mut java::command(
                jar,
                "wordcount",
                &[
                    ("bootstrap", bootstrap),
                    ("application-id", &ks_app(&n.wordcount_ks)),
                    ("input", &n.lines),
                    ("output", &n.wordcount_ks),
                ],
            ),
            "the Kafka Streams word count",
        )
    })?;
    t.step("Kafka Streams: shop", || {
        run_ok(
            &mut java::command(
                jar,
                "shop",
                &[
                    ("bootstrap", bootstrap),
                    ("application-id", &ks_app(&n.shop_ks)),
                    ("orders", &n.orders),
                    ("payments", &n.payments),
                    ("output", &n.shop_ks),
                ],
            ),
            "the Kafka Streams shop",
        )
    })?;

    // Parsley.
    t.step("Parsley: word count", || {
        run_ok(
            Command::new(&bins.wordcount)
                .args(["run", "--bootstrap", bootstrap])
                .args(["--application-id", &Names::app(&n.wordcount_parsley)])
                .args(["--input", &n.lines, "--output", &n.wordcount_parsley])
                .arg("--until-caught-up"),
            "the Parsley word count",
        )
    })?;
    t.step("Parsley: shop", || {
        run_ok(
            Command::new(&bins.shop)
                .args(["run", "--bootstrap", bootstrap])
                .args(["--application-id", &Names::app(&n.shop_parsley)])
                .args(["--orders", &n.orders, "--payments", &n.payments])
                .args(["--output", &n.shop_parsley])
                .arg("--until-caught-up"),
            "the Parsley shop",
        )
    })?;

    // The outputs.
    let finals = |topic: &str, decode: fn(&[u8]) -> Result<i64>| -> Result<Finals> {
        let records = topics::read_to_end(bootstrap, &admin, topic)?;
        verdict::last_values(&records, decode).with_context(|| format!("the output {topic}"))
    };
    let (words, shop, shop_sides) = t.step("read the outputs", || {
        let words = Outcome::new(
            &expected_words,
            &finals(&n.wordcount_ks, verdict::decode_ks_long)?,
            &finals(&n.wordcount_parsley, verdict::decode_json_number)?,
        );
        let ks = finals(&n.shop_ks, verdict::decode_ks_long)?;
        let parsley = finals(&n.shop_parsley, verdict::decode_json_number)?;
        let shop = Outcome::new(&expected_shop.revenue, &ks, &parsley);
        Ok((words, shop, (ks, parsley)))
    })?;

    let skewed = args.clock_skew_ms > 0;
    let word_verdict = report("word count", &words, false);
    let shop_verdict = report(
        &format!(
            "shop revenue per customer (clock skew {} ms)",
            args.clock_skew_ms
        ),
        &shop,
        skewed,
    );
    println!("  the answers side by side (revenue in cents):");
    println!(
        "{}",
        verdict::side_by_side(
            "customer",
            &expected_shop.revenue,
            &shop_sides.0,
            &shop_sides.1,
            SIDE_BY_SIDE_ROWS
        )
    );
    if skewed {
        explain_skew(&shop, &expected_shop);
    }
    let failed = [word_verdict, shop_verdict].contains(&Verdict::Fail);
    println!(
        "xtask: compare: verdict: {}",
        if failed { "FAILED" } else { "ok" }
    );
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Prints the summary of one pipeline and returns its verdict.
fn report(pipeline: &str, outcome: &Outcome, difference_expected: bool) -> Verdict {
    println!("xtask: compare: {pipeline}");
    println!(
        "  Kafka Streams vs expected: {}",
        outcome.kafka_streams.summary("expected", "Kafka Streams")
    );
    println!(
        "  Parsley vs expected:       {}",
        outcome.parsley.summary("expected", "Parsley")
    );
    println!(
        "  Kafka Streams vs Parsley:  {}",
        outcome.between.summary("Kafka Streams", "Parsley")
    );
    let v = verdict::verdict(outcome, difference_expected);
    println!(
        "  verdict: {}",
        match v {
            Verdict::Agree => "every side matches the expected answer",
            Verdict::ExpectedDifference =>
                "Kafka Streams falls short of the expected answer, as the clock skew predicts",
            Verdict::Fail => "FAILED: a difference the setup does not explain",
        }
    );
    v
}

/// Says which side of the skewed shop is right, and how far Kafka Streams is off.
fn explain_skew(shop: &Outcome, expected: &verdict::ExpectedRevenue) {
    let ks_right = shop.kafka_streams.agrees();
    let short: i64 = shop
        .kafka_streams
        .differing
        .iter()
        .map(|(_, e, ks)| e - ks)
        .sum::<i64>()
        + shop
            .kafka_streams
            .only_left
            .iter()
            .map(|k| expected.revenue[k])
            .sum::<i64>();
    println!(
        "  which side is right: the expected answer sums every paid order from the input topics; \
         Kafka Streams {}",
        if ks_right {
            "matches it".to_string()
        } else {
            format!(
                "is {short} cents short of it ({} of {} customers off; {} payments, {} cents, are \
                 timestamped before their orders)",
                shop.kafka_streams.differing.len() + shop.kafka_streams.only_left.len(),
                expected.revenue.len(),
                expected.early,
                expected.early_cents
            )
        }
    );
    if shop.parsley.agrees() {
        println!("  Parsley matches it: Parsley is right");
    } else {
        println!("  Parsley does not match it");
    }
}
