//! The benchmark's table, its ratios and its verdicts against the targets (see the binary's
//! docs).

use std::collections::BTreeMap;

use crate::load::Keys;
use crate::worker::{Mode, Report};

/// Parsley's pass-through throughput against the raw loop's: at least this.
const RAW_RATIO_TARGET: f64 = 0.9;
/// Parsley's throughput against Kafka Streams': at least this.
const KS_THROUGHPUT_TARGET: f64 = 2.0;
/// Parsley's client CPU per record against Kafka Streams': at most this.
const KS_CPU_TARGET: f64 = 0.5;

/// The figures of one mode on one input at one payload size.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Throughput of each measured run (between 10 % and 90 % of the input), records per second.
    pub throughput: Vec<f64>,
    /// Runs too short to measure.
    pub unmeasured: u32,
    /// The process's CPU time per record in each run's window, µs.
    pub cpu_us_per_record: Vec<f64>,
    /// The part of it spent by a JVM's JIT compiler threads, µs.
    pub jit_us_per_record: Vec<f64>,
    /// The broker's CPU time per record in each run's window, µs.
    pub broker_us_per_record: Vec<f64>,
    /// The part of it spent by the broker's JIT compiler threads, µs.
    pub broker_jit_us_per_record: Vec<f64>,
    /// Latencies of the live records, µs, sorted.
    pub latencies: Vec<u64>,
    /// Largest peak RSS of this mode's processes, KiB.
    pub peak_rss_kib: u64,
}

impl Row {
    /// The best run: noise from other work on the machine only ever slows a run down, so the
    /// fastest run is the least disturbed one. 0 when no run was measured.
    pub fn best_throughput(&self) -> f64 {
        self.throughput.iter().copied().fold(0.0, f64::max)
    }

    /// The mean client CPU per record of the runs, µs; NaN when none was measured.
    pub fn cpu_us(&self) -> f64 {
        mean(&self.cpu_us_per_record)
    }

    /// The `q` quantile of the latencies (nearest rank), ms.
    pub fn latency_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let rank =
            ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[rank - 1] as f64 / 1000.0
    }

    /// Takes in the process figures of one of the mode's processes.
    pub fn absorb(&mut self, report: &Report) {
        self.peak_rss_kib = self.peak_rss_kib.max(report.peak_rss_kib);
    }

    fn ran(&self) -> bool {
        !self.throughput.is_empty() || self.unmeasured > 0 || !self.latencies.is_empty()
    }
}

/// Every row of one payload size.
#[derive(Debug, Clone)]
pub struct Results {
    /// The payload, bytes.
    pub payload: usize,
    /// Records per input.
    pub records: u64,
    /// By mode and input keys.
    pub rows: BTreeMap<(Mode, Keys), Row>,
}

/// The mean of `v`; NaN when empty.
fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Parsley against Kafka Streams on one workload: throughput and client CPU ratios.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratios {
    /// Parsley's best throughput over Kafka Streams'.
    pub throughput: f64,
    /// Parsley's mean client CPU per record over Kafka Streams'.
    pub cpu: f64,
}

impl Ratios {
    /// The ratios of `parsley` to `kafka_streams`; `None` unless both were measured.
    pub fn of(parsley: &Row, kafka_streams: &Row) -> Option<Ratios> {
        let (p, k) = (parsley.best_throughput(), kafka_streams.best_throughput());
        (p > 0.0 && k > 0.0).then(|| Ratios {
            throughput: p / k,
            cpu: parsley.cpu_us() / kafka_streams.cpu_us(),
        })
    }

    /// Whether both goals are met (a CPU ratio not measured is not met).
    pub fn met(&self) -> (bool, bool) {
        (
            self.throughput >= KS_THROUGHPUT_TARGET,
            self.cpu <= KS_CPU_TARGET,
        )
    }
}

/// A ratio over interleaved rounds: run `i` of one mode against run `i` of the other (the
/// modes of a round run back to back), its median and its range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The median of the per-round ratios (the mean of the middle two for an even count).
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// How many rounds had both runs measured.
    pub rounds: usize,
}

impl Spread {
    /// The per-round ratios `a[i] / b[i]`; `None` with fewer than two rounds.
    pub fn of(a: &[f64], b: &[f64]) -> Option<Spread> {
        let mut ratios: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(x, y)| x / y)
            .filter(|r| r.is_finite())
            .collect();
        if ratios.len() < 2 {
            return None;
        }
        ratios.sort_by(f64::total_cmp);
        let n = ratios.len();
        let median = if n % 2 == 1 {
            ratios[n / 2]
        } else {
            (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: ratios[0],
            max: ratios[n - 1],
            rounds: n,
        })
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median {:.2}× ({:.2}–{:.2}×, {} rounds)",
            self.median, self.min, self.max, self.rounds
        )
    }
}

/// The per-round line of a throughput ratio of `a` to `b` (and of their client CPU with
/// `cpu`), when there were rounds to pair.
fn per_round(what: &str, a: &Row, b: &Row, cpu: bool) -> Option<String> {
    let throughput = Spread::of(&a.throughput, &b.throughput)?;
    let cpu = cpu
        .then(|| Spread::of(&a.cpu_us_per_record, &b.cpu_us_per_record))
        .flatten()
        .map(|c| format!("; client CPU per record {c}"))
        .unwrap_or_default();
    Some(format!("  {what}, per round: throughput {throughput}{cpu}"))
}

/// Prints the table, the ratios and the verdicts; `true` when every target is met.
pub fn print(commit_interval_ms: u64, results: &[Results]) -> bool {
    let p99_target = 1.5 * commit_interval_ms as f64;
    println!();
    println!(
        "| payload | input keys | mode | records | best records/s (all runs) | ratio to raw | client CPU µs/record (JIT) | broker CPU µs/record (JIT) | p50 ms | p99 ms | max ms | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut verdicts = Vec::new();
    let mut all_met = true;
    for r in results {
        let row = |mode: Mode, keys: Keys| r.rows.get(&(mode, keys)).filter(|row| row.ran());
        let raw_best = row(Mode::Raw, Keys::Unique).map_or(0.0, Row::best_throughput);
        for ((mode, keys), row) in Mode::ALL
            .iter()
            .flat_map(|&m| r.rows.iter().filter(move |((mode, _), _)| *mode == m))
            .filter(|(_, row)| row.ran())
        {
            let mut runs: Vec<String> = row.throughput.iter().map(|t| thousands(*t)).collect();
            runs.extend((0..row.unmeasured).map(|_| "–".to_string()));
            let ms = |q: f64| dash_or(row.latency_ms(q), |l| format!("{l:.1}"));
            let ratio = if mode.counts() {
                "–".to_string()
            } else {
                dash_or(row.best_throughput() / raw_best, |r| format!("{r:.2}×"))
            };
            let with_jit = |total: &[f64], jit: &[f64]| {
                dash_or(mean(total), |t| format!("{t:.2} ({:.2})", mean(jit)))
            };
            println!(
                "| {} | {} | {mode} | {} | {} | {ratio} | {} | {} | {} | {} | {} | {:.0} |",
                size(r.payload),
                match keys {
                    Keys::Unique => "unique".to_string(),
                    Keys::Distinct(n) => thousands(*n as f64),
                },
                thousands(r.records as f64),
                if runs.is_empty() {
                    "–".to_string()
                } else {
                    format!(
                        "{} ({})",
                        dash_or(row.best_throughput(), thousands),
                        runs.join(", ")
                    )
                },
                with_jit(&row.cpu_us_per_record, &row.jit_us_per_record),
                with_jit(&row.broker_us_per_record, &row.broker_jit_us_per_record),
                ms(0.5),
                ms(0.99),
                ms(1.0),
                row.peak_rss_kib as f64 / 1024.0
            );
        }
        if let (Some(parsley), Some(_)) = (
            row(Mode::Parsley, Keys::Unique),
            row(Mode::Raw, Keys::Unique),
        ) {
            let ratio = parsley.best_throughput() / raw_best;
            let throughput_met = ratio >= RAW_RATIO_TARGET;
            let p99 = parsley.latency_ms(0.99);
            // Not measured (`--skip-live`) counts as not met.
            let latency_met = p99 <= p99_target;
            all_met &= throughput_met && latency_met;
            let p99 = dash_or(p99, |p| format!("{p:.1} ms"));
            let ratio = dash_or(ratio, |r| format!("{r:.3}×"));
            verdicts.push(format!(
                "{}: throughput {ratio} the raw loop (target ≥ {RAW_RATIO_TARGET}×): {}; live p99 {p99} (target ≤ {p99_target:.0} ms): {}",
                size(r.payload),
                met(throughput_met),
                met(latency_met)
            ));
            // What the wire format alone allows: every Parsley output carries the stamp header
            // (the book's specification, §3), so on a machine where the loops are CPU-bound
            // Parsley cannot run faster than a raw loop that only adds it.
            let raw = row(Mode::Raw, Keys::Unique).expect("checked above");
            verdicts.extend(per_round("parsley / raw", parsley, raw, true));
            let stamped = row(Mode::RawStamped, Keys::Unique).map_or(0.0, Row::best_throughput);
            if stamped > 0.0 && raw_best > 0.0 {
                verdicts.push(format!(
                    "{}: the stamp header alone (raw-stamped) ran at {:.3}× the raw loop; Parsley at {:.3}× raw-stamped",
                    size(r.payload),
                    stamped / raw_best,
                    parsley.best_throughput() / stamped
                ));
                let stamped = row(Mode::RawStamped, Keys::Unique).expect("measured");
                verdicts.extend(per_round("parsley / raw-stamped", parsley, stamped, true));
            }
        }
        // Parsley against Kafka Streams: the pass-through, then the count on each input.
        let mut pairs = vec![(
            "pass-through".to_string(),
            Mode::Parsley,
            Mode::Ks,
            Keys::Unique,
        )];
        let mut count_keys: Vec<Keys> = r
            .rows
            .keys()
            .filter(|(m, _)| m.counts())
            .map(|&(_, k)| k)
            .collect();
        count_keys.sort_unstable();
        count_keys.dedup();
        pairs.extend(
            count_keys
                .into_iter()
                .map(|k| (format!("count, {k}"), Mode::ParsleyCount, Mode::KsCount, k)),
        );
        for (what, parsley, kafka_streams, keys) in pairs {
            let (Some(p), Some(k)) = (row(parsley, keys), row(kafka_streams, keys)) else {
                continue;
            };
            let Some(ratios) = Ratios::of(p, k) else {
                verdicts.push(format!(
                    "{}, {what}: Parsley against Kafka Streams not measured (runs too short)",
                    size(r.payload)
                ));
                all_met = false;
                continue;
            };
            let (throughput_met, cpu_met) = ratios.met();
            all_met &= throughput_met && cpu_met;
            verdicts.push(format!(
                "{}, {what}: Parsley {:.2}× Kafka Streams' throughput (goal ≥ {KS_THROUGHPUT_TARGET}×): {}; {:.2}× its client CPU per record (goal ≤ {KS_CPU_TARGET}×): {}",
                size(r.payload),
                ratios.throughput,
                met(throughput_met),
                ratios.cpu,
                met(cpu_met)
            ));
            verdicts.extend(per_round("Parsley / Kafka Streams", p, k, true));
        }
    }
    println!();
    for v in verdicts {
        println!("{v}");
    }
    all_met
}

/// `x` formatted by `f`, or a dash when it is not a finite positive-or-zero figure (not
/// measured).
fn dash_or(x: f64, f: impl Fn(f64) -> String) -> String {
    if x.is_finite() && x > 0.0 {
        f(x)
    } else {
        "–".to_string()
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT MET" }
}

/// `1024` as `1 KiB`, `100` as `100 B`.
pub fn size(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// `12345.6` as `12,346`.
pub fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(throughput: &[f64], cpu: &[f64]) -> Row {
        Row {
            throughput: throughput.to_vec(),
            cpu_us_per_record: cpu.to_vec(),
            ..Row::default()
        }
    }

    #[test]
    fn spreads_pair_runs_by_round() {
        let a = [300.0, 100.0, 200.0, 400.0];
        let b = [100.0, 100.0, 100.0, 100.0];
        let s = Spread::of(&a, &b).unwrap();
        assert_eq!((s.median, s.min, s.max, s.rounds), (2.5, 1.0, 4.0, 4));
        let s = Spread::of(&a[..3], &b).unwrap();
        assert_eq!((s.median, s.rounds), (2.0, 3));
        // One round is no spread.
        assert_eq!(Spread::of(&a[..1], &b), None);
        assert_eq!(
            Spread::of(&[2.0, 6.0], &[1.0, 2.0]).unwrap().to_string(),
            "median 2.50× (2.00–3.00×, 2 rounds)"
        );
    }

    #[test]
    fn ratios_take_the_best_throughput_and_the_mean_cpu() {
        let parsley = row(&[500_000.0, 600_000.0], &[1.0, 2.0]);
        let kafka_streams = row(&[200_000.0, 300_000.0], &[5.0, 7.0]);
        let r = Ratios::of(&parsley, &kafka_streams).unwrap();
        assert!((r.throughput - 2.0).abs() < 1e-12);
        assert!((r.cpu - 0.25).abs() < 1e-12);
        assert_eq!(r.met(), (true, true));
        let slower = row(&[390_000.0], &[3.1]);
        assert_eq!(
            Ratios::of(&slower, &kafka_streams).unwrap().met(),
            (false, false)
        );
        // CPU not measured: the goal is not met.
        let no_cpu = row(&[900_000.0], &[]);
        assert_eq!(
            Ratios::of(&no_cpu, &kafka_streams).unwrap().met(),
            (true, false)
        );
        assert_eq!(Ratios::of(&row(&[], &[]), &kafka_streams), None);
    }

    #[test]
    fn figures_print_with_thousands_separators_and_sizes_in_kib() {
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(size(100), "100 B");
        assert_eq!(size(1024), "1 KiB");
        assert_eq!(dash_or(f64::NAN, |x| x.to_string()), "–");
        assert_eq!(dash_or(0.0, |x| x.to_string()), "–");
    }
}
