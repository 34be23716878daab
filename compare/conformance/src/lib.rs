//! Kafka Streams semantics, checked by difference: every operator of Parsley's DSL against the
//! real Kafka Streams, scenario by scenario (`cargo xtask conformance`).
//!
//! A scenario ([`scenario::Scenario`]) is an operator of the catalogue with its parameters and
//! an input script. It runs through Kafka Streams' own `TopologyTestDriver` (the Java program
//! in `kafka-streams/`, [`reference`]) and through Parsley's
//! [`TopologyTestDriver`](parsley_task::driver::TopologyTestDriver) ([`catalogue`]); the
//! records of every output topic — keys, values, tombstones, timestamps, in order — are
//! compared exactly, then after the documented normalisations ([`normalise`]). A scenario is
//! **equal**, a **documented difference** (equal after normalising; the report names each
//! normalisation that changed something) or **differing**: an undocumented difference, a bug.
//!
//! Scenarios come from the corpus (`corpus.jsonl`: interesting scenarios kept, each with why)
//! and from seeds ([`generate`]): proptest strategies spread evenly over the operators, a
//! differing scenario shrunk to a minimal script before it is reported.
#![forbid(unsafe_code)]

pub mod catalogue;
pub mod generate;
pub mod normalise;
pub mod reference;
pub mod scenario;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

use crate::normalise::Normalisation;
use crate::reference::{Reference, ReferenceError};
use crate::scenario::{Outcome, Outputs, Scenario};

/// How one scenario compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The same outputs.
    Equal,
    /// The same outputs after these normalisations, each of which changed something.
    Documented(Vec<&'static str>),
    /// Different outputs even after normalising.
    Differing,
}

/// Both sides' outputs after normalising: Kafka Streams', then Parsley's.
pub type Normalised = (Outputs, Outputs);

/// Compares the two sides' outcomes of `scenario`: exactly, then after every normalisation
/// that applies to it, in order; with the normalised outputs when normalisations applied.
/// `rerun` runs another scenario through Kafka Streams, for normalisations that give it
/// another script or need another of its runs (`None`: it failed).
pub fn compare(
    scenario: &Scenario,
    ks: &Outcome,
    parsley: &Outcome,
    all: &[Normalisation],
    rerun: &mut normalise::Rerun<'_>,
) -> (Verdict, Option<Normalised>) {
    if ks == parsley {
        return (Verdict::Equal, None);
    }
    let applying: Vec<&Normalisation> = all.iter().filter(|n| (n.applies)(scenario)).collect();
    // Kafka Streams failing on records a normalisation takes out of its script is compared on
    // the script without them (below); any other failure differs.
    let ks_failed = ks.error.is_some();
    let rescripted = applying.iter().any(|n| n.reference_script.is_some());
    if parsley.error.is_some() || (ks_failed && !rescripted) {
        return (Verdict::Differing, None);
    }
    let (Some(mut k), Some(mut p)) = (ks.outputs.clone(), parsley.outputs.clone()) else {
        return (Verdict::Differing, None);
    };
    let mut used = Vec::new();
    // A script both sides run instead: the comparison goes on from their outputs of it.
    let mut base = scenario.clone();
    for n in &applying {
        if let Some(rewrite) = n.script {
            base.inputs = rewrite(&base);
        }
    }
    let base = &base;
    if base != scenario {
        let Some(reference) = rerun(base) else {
            return (Verdict::Differing, None);
        };
        let Outcome {
            outputs: Some(ours),
            error: None,
        } = catalogue::run(base)
        else {
            return (Verdict::Differing, None);
        };
        if reference != k || ours != p {
            used.extend(
                applying
                    .iter()
                    .filter(|n| n.script.is_some())
                    .map(|n| n.name),
            );
        }
        (k, p) = (reference, ours);
    }
    let scenario = base;
    let mut script = scenario.inputs.clone();
    // Kafka Streams' outputs are normalised against the script it ran.
    for n in &applying {
        if let Some(rewrite) = n.reference_script {
            let before = script.clone();
            script = rewrite(scenario, script);
            if script != before {
                used.push(n.name);
            }
        }
    }
    let scripted = Scenario {
        inputs: script,
        ..scenario.clone()
    };
    if scripted != *scenario {
        match rerun(&scripted) {
            Some(outputs) => k = outputs,
            None => return (Verdict::Differing, None),
        }
    } else if ks_failed {
        return (Verdict::Differing, None);
    }
    let mut rewritten = scripted.clone();
    for n in &applying {
        let Some(rewrite) = n.reference_op else {
            continue;
        };
        let before = rewritten.clone();
        rewritten.op = rewrite(&rewritten.op);
        if rewritten == before {
            continue;
        }
        // Used when Kafka Streams gives another answer with it.
        match rerun(&rewritten) {
            Some(outputs) if outputs != k => {
                k = outputs;
                used.push(n.name);
            }
            Some(_) => {}
            None => return (Verdict::Differing, None),
        }
    }
    for n in &applying {
        let (k0, p0) = (k.clone(), p.clone());
        (n.apply)(&mut normalise::Pair {
            scenario,
            reference: &rewritten,
            kafka_streams: &mut k,
            parsley: &mut p,
            rerun,
        });
        if (k != k0 || p != p0) && !used.contains(&n.name) {
            used.push(n.name);
        }
    }
    if k == p {
        (Verdict::Documented(used), None)
    } else {
        let normalised = (!applying.is_empty()).then_some((k, p));
        (Verdict::Differing, normalised)
    }
}

/// A corpus entry: a scenario kept, why, and the verdict it must get.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kept {
    /// What the scenario shows.
    pub why: String,
    /// The normalisations that make the two sides equal, in the order they apply; none: the
    /// sides are equal as they are.
    #[serde(default)]
    pub expect: Vec<String>,
    /// The scenario.
    pub scenario: Scenario,
}

/// What a run does.
#[derive(Debug, Clone)]
pub struct Config {
    /// The Kafka Streams program's jar.
    pub jar: PathBuf,
    /// Generated scenarios in all, spread evenly over the operators.
    pub scenarios: usize,
    /// The seed of the generator.
    pub seed: u64,
    /// Only the operators whose report name contains this.
    pub only: Option<String>,
    /// The corpus file, run first.
    pub corpus: Option<PathBuf>,
}

/// The counts of one operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Scenarios run (corpus and generated).
    pub run: usize,
    /// Equal.
    pub equal: usize,
    /// Documented differences.
    pub documented: usize,
    /// Undocumented differences.
    pub differing: usize,
}

/// An undocumented difference: the minimal scenario found and both sides' outcomes.
#[derive(Debug, Clone)]
pub struct Difference {
    /// The scenario (shrunk when generated).
    pub scenario: Scenario,
    /// Kafka Streams' outcome.
    pub kafka_streams: Outcome,
    /// Parsley's outcome.
    pub parsley: Outcome,
    /// Both sides' outputs after the normalisations that apply, if any.
    pub normalised: Option<Normalised>,
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Counts per operator, by the report's name.
    pub counts: BTreeMap<&'static str, Counts>,
    /// How many scenarios each normalisation made equal.
    pub normalised: BTreeMap<&'static str, usize>,
    /// One minimal scenario per operator with an undocumented difference.
    pub differences: Vec<Difference>,
    /// Corpus entries whose verdict is not the one they expect: why, what they expect, what
    /// they got.
    pub unexpected: Vec<(String, Vec<String>, Verdict)>,
}

impl Report {
    /// Whether no scenario differed undocumented and every corpus entry got its verdict.
    pub fn passed(&self) -> bool {
        self.counts.values().all(|c| c.differing == 0) && self.unexpected.is_empty()
    }

    /// The per-operator table, the normalisations used and each difference, as text.
    pub fn render(&self, all: &[Normalisation]) -> String {
        let mut out = String::new();
        let width = self
            .counts
            .keys()
            .map(|r| r.chars().count())
            .max()
            .unwrap_or(0)
            .max(28);
        let _ = writeln!(
            out,
            "{:<width$} {:>9} {:>9} {:>11} {:>10}",
            "operator", "scenarios", "equal", "documented", "differing"
        );
        let mut total = Counts::default();
        for (row, c) in &self.counts {
            let _ = writeln!(
                out,
                "{row:<width$} {:>9} {:>9} {:>11} {:>10}",
                c.run, c.equal, c.documented, c.differing
            );
            total.run += c.run;
            total.equal += c.equal;
            total.documented += c.documented;
            total.differing += c.differing;
        }
        let _ = writeln!(
            out,
            "{:<width$} {:>9} {:>9} {:>11} {:>10}",
            "all", total.run, total.equal, total.documented, total.differing
        );
        if !self.normalised.is_empty() {
            let _ = writeln!(
                out,
                "\ndocumented differences (scenarios each normalisation took part in; one may need several):"
            );
            for n in all {
                if let Some(count) = self.normalised.get(n.name) {
                    let _ = writeln!(out, "  {:<32} {count:>6}  book/src/{}", n.name, n.book);
                }
            }
        }
        for (why, expect, got) in &self.unexpected {
            let _ = writeln!(
                out,
                "\ncorpus entry with another verdict: {why}\n  expects: {}\n  got:     {got:?}",
                if expect.is_empty() {
                    "equal".to_string()
                } else {
                    expect.join(", ")
                },
            );
        }
        for d in &self.differences {
            let _ = writeln!(
                out,
                "\nundocumented difference in {}:\n  scenario: {}\n  kafka streams: {}\n  parsley:       {}",
                d.scenario.op.row(),
                serde_json::to_string(&d.scenario).expect("a scenario serialises"),
                render_outcome(&d.kafka_streams),
                render_outcome(&d.parsley),
            );
            if let Some((k, p)) = &d.normalised {
                let as_outcome = |o: &Outputs| Outcome {
                    outputs: Some(o.clone()),
                    error: None,
                };
                let _ = writeln!(
                    out,
                    "  normalised:\n  kafka streams: {}\n  parsley:       {}",
                    render_outcome(&as_outcome(k)),
                    render_outcome(&as_outcome(p)),
                );
            }
        }
        out
    }
}

/// An outcome on one line: each topic's records, then the error.
pub fn render_outcome(o: &Outcome) -> String {
    let mut out = String::new();
    match &o.outputs {
        None => out.push_str("no outputs"),
        Some(outputs) => {
            for (topic, records) in outputs {
                let records: Vec<String> = records.iter().map(ToString::to_string).collect();
                let _ = write!(out, "{topic}: [{}] ", records.join(", "));
            }
        }
    }
    if let Some(e) = &o.error {
        let _ = write!(out, "error: {e}");
    }
    out.trim_end().to_string()
}

/// Runs one scenario on both sides and compares them.
fn check(
    reference: &mut Reference,
    scenario: &Scenario,
    all: &[Normalisation],
) -> Result<(Verdict, Difference), ReferenceError> {
    let ks = reference.run(scenario)?;
    let parsley = catalogue::run(scenario);
    let mut failed = None;
    let (verdict, normalised) = compare(scenario, &ks, &parsley, all, &mut |s| match reference
        .run(s)
    {
        Ok(Outcome {
            outputs: Some(outputs),
            error: None,
        }) => Some(outputs),
        Ok(_) => None,
        Err(e) => {
            failed = Some(e);
            None
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok((
            verdict,
            Difference {
                scenario: scenario.clone(),
                kafka_streams: ks,
                parsley,
                normalised,
            },
        )),
    }
}

/// The most shrinking steps for one difference.
const MAX_SHRINKS: usize = 2_000;

/// Runs the corpus, then the generated scenarios.
///
/// # Errors
/// The Kafka Streams program failing; a corpus file that does not read.
pub fn run(config: &Config) -> Result<Report, Box<dyn std::error::Error>> {
    let all = normalise::all();
    let mut reference = Reference::start(&config.jar)?;
    let mut report = Report::default();
    let wanted = |row: &str| config.only.as_deref().is_none_or(|o| row.contains(o));
    let record = |report: &mut Report, verdict: &Verdict, s: &Scenario| {
        let c = report.counts.entry(s.op.row()).or_default();
        c.run += 1;
        match verdict {
            Verdict::Equal => c.equal += 1,
            Verdict::Documented(used) => {
                c.documented += 1;
                for n in used {
                    *report.normalised.entry(n).or_default() += 1;
                }
            }
            Verdict::Differing => c.differing += 1,
        }
    };
    if let Some(path) = &config.corpus {
        let text = std::fs::read_to_string(path)?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let kept: Kept = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            if !wanted(kept.scenario.op.row()) {
                continue;
            }
            let (verdict, difference) = check(&mut reference, &kept.scenario, &all)?;
            record(&mut report, &verdict, &kept.scenario);
            let expected = match &verdict {
                Verdict::Equal => kept.expect.is_empty(),
                Verdict::Documented(used) => *used == kept.expect,
                Verdict::Differing => false,
            };
            if verdict == Verdict::Differing {
                report.differences.push(difference);
            } else if !expected {
                report.unexpected.push((kept.why, kept.expect, verdict));
            }
        }
    }
    let operators: Vec<_> = generate::operators()
        .into_iter()
        .filter(|(row, _)| wanted(row))
        .collect();
    let per_operator = config.scenarios.div_ceil(operators.len().max(1));
    for (index, (row, op)) in operators.into_iter().enumerate() {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&config.seed.to_le_bytes());
        seed[8..16].copy_from_slice(&(index as u64).to_le_bytes());
        let mut runner = TestRunner::new_with_rng(
            RunnerConfig::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
        );
        let strategy = generate::scenarios(op);
        let mut found = false;
        for _ in 0..per_operator {
            let mut tree = strategy
                .new_tree(&mut runner)
                .map_err(|reason| format!("generating a scenario: {reason}"))?;
            let scenario = tree.current();
            let (verdict, difference) = check(&mut reference, &scenario, &all)?;
            record(&mut report, &verdict, &scenario);
            if verdict != Verdict::Differing || found {
                continue;
            }
            found = true;
            let mut minimal = difference;
            // Shrink: simplify while the difference stays, step back when it goes.
            let mut differs = true;
            for _ in 0..MAX_SHRINKS {
                let moved = if differs {
                    tree.simplify()
                } else {
                    tree.complicate()
                };
                if !moved {
                    break;
                }
                let (verdict, difference) = check(&mut reference, &tree.current(), &all)?;
                differs = verdict == Verdict::Differing;
                if differs {
                    minimal = difference;
                }
            }
            debug_assert_eq!(minimal.scenario.op.row(), row);
            report.differences.push(minimal);
        }
    }
    Ok(report)
}
