//! What `chaos soak` prints at the end and writes as CSV: the counts, the faults, the
//! latency and the peak memory per window, the memory's slope, the oracle's verdict.

use parsley_inventory::check::Outcome;
use parsley_inventory::generator::GroundTruth;

use crate::soak::{Injected, RssSample};
use crate::soak_stats::{Summary, latency_windows, mib_per_hour, peaks};

/// What a soak measured.
pub(crate) struct Report<'a> {
    pub seed: u64,
    pub minutes: f64,
    /// The measured maximum: (a backlog's drain, live), records/s.
    pub max: Option<(f64, f64)>,
    pub rate: f64,
    pub generated_secs: f64,
    pub truth: &'a GroundTruth,
    pub faults: &'a [Injected],
    pub rss: &'a [RssSample],
    pub latencies: &'a [(u32, u32)],
    pub window_ms: u32,
    pub driver_peak_mib: f64,
    pub outcome: &'a Outcome,
    /// Stage processes that ended on their own, and why (their log's last line).
    pub exits: &'a [String],
}

/// The stages whose memory is sampled.
pub(crate) const STAGES: [&str; 2] = ["sales-facts", "ledger"];

impl Report<'_> {
    /// Windows of the run (the last one may be shorter).
    pub(crate) fn windows(&self) -> usize {
        ((self.minutes * 60_000.0) / f64::from(self.window_ms))
            .ceil()
            .max(1.0) as usize
    }

    /// The warm-up left out of the memory slope: the first tenth of the run, at most five
    /// minutes (the stage processes' allocator, librdkafka's queues and the state of the
    /// 400 products fill up then).
    pub(crate) fn warmup_ms(&self) -> u32 {
        ((self.minutes * 6_000.0) as u32).min(300_000)
    }

    pub(crate) fn samples(&self, stage: &str) -> Vec<(u32, f64)> {
        self.rss
            .iter()
            .filter(|r| r.stage == stage)
            .map(|r| (r.at, r.mib))
            .collect()
    }

    /// The slope of a stage's longest-lived process's RSS after the warm-up, MiB/h, and how
    /// long that process lived, minutes.
    fn longest_lived(&self, stage: &str) -> Option<(f64, f64)> {
        let mut pids: Vec<u32> = self
            .rss
            .iter()
            .filter(|r| r.stage == stage)
            .map(|r| r.pid)
            .collect();
        pids.dedup();
        let lifetime = |pid: u32| {
            let ats: Vec<u32> = self
                .rss
                .iter()
                .filter(|r| r.pid == pid)
                .map(|r| r.at)
                .collect();
            ats.last().copied().unwrap_or(0) - ats.first().copied().unwrap_or(0)
        };
        let pid = pids.into_iter().max_by_key(|p| lifetime(*p))?;
        let samples: Vec<(u32, f64)> = self
            .rss
            .iter()
            .filter(|r| r.pid == pid)
            .map(|r| (r.at, r.mib))
            .collect();
        let first = samples.first()?.0;
        let slope = mib_per_hour(&samples, first + self.warmup_ms())?;
        Some((slope, f64::from(lifetime(pid)) / 60_000.0))
    }

    pub(crate) fn print(&self) {
        let t = self.truth;
        let oc = self.outcome;
        if let Some((drain, live)) = self.max {
            println!(
                "soak: measured maximum: {live:.0} records/s live (a backlog drains at {drain:.0}); paced at half: {:.0}",
                self.rate
            );
        }
        println!(
            "soak: {} committed input records ({} stock events, {} sales) in {:.1} min: {:.0} records/s; {} records in aborted transactions; {} faults",
            t.stock_events + t.sales,
            t.stock_events,
            t.sales,
            self.generated_secs / 60.0,
            (t.stock_events + t.sales) as f64 / self.generated_secs.max(1e-9),
            t.aborted_events,
            self.faults.len()
        );
        let mut kinds: Vec<&str> = self.faults.iter().map(|f| f.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let by_kind: Vec<String> = kinds
            .iter()
            .map(|k| {
                format!(
                    "{} {k}",
                    self.faults.iter().filter(|f| f.kind == *k).count()
                )
            })
            .collect();
        println!("soak: faults (seed {}): {}", self.seed, by_kind.join(", "));
        for f in self.faults {
            println!(
                "soak:   {:>6.1} min  {:<11} {} ({:.1} s to heal)",
                f64::from(f.at) / 60_000.0,
                f.kind,
                f.what,
                f64::from(f.took) / 1000.0
            );
        }
        let windows = self.windows();
        let lat = latency_windows(self.latencies, self.window_ms, windows);
        let width = f64::from(self.window_ms) / 60_000.0;
        println!(
            "soak: {:>11} {:>9} {:>7} {:>7} {:>8} {:>7} {:>18} {:>13}",
            "window, min",
            "outputs",
            "p50 ms",
            "p99 ms",
            "max ms",
            "faults",
            "peak RSS sf/lg MiB",
            ""
        );
        let stage_peaks: Vec<Vec<Option<f64>>> = STAGES
            .iter()
            .map(|s| peaks(&self.samples(s), self.window_ms, windows))
            .collect();
        for (i, w) in lat.iter().enumerate() {
            let (from, to) = (i as f64 * width, ((i + 1) as f64 * width).min(self.minutes));
            let n_faults = self
                .faults
                .iter()
                .filter(|f| ((f.at / self.window_ms) as usize).min(windows - 1) == i)
                .count();
            let s = w.unwrap_or(Summary {
                n: 0,
                p50: 0,
                p99: 0,
                max: 0,
            });
            let peak = |k: usize| stage_peaks[k][i].map_or("-".to_string(), |v| format!("{v:.0}"));
            println!(
                "soak: {:>5.0}–{:<5.0} {:>9} {:>7} {:>7} {:>8} {:>7} {:>18}",
                from,
                to,
                s.n,
                s.p50,
                s.p99,
                s.max,
                n_faults,
                format!("{}/{}", peak(0), peak(1))
            );
        }
        let warmup = self.warmup_ms();
        for stage in STAGES {
            let samples = self.samples(stage);
            let all = mib_per_hour(&samples, warmup);
            let first_peaks: Vec<(u32, f64)> = peaks(&samples, self.window_ms, windows)
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.map(|v| (i as u32 * self.window_ms, v)))
                .collect();
            let of_peaks = mib_per_hour(&first_peaks, 0);
            let max = samples.iter().map(|s| s.1).fold(0.0, f64::max);
            let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.1}"));
            let longest = self.longest_lived(stage).map_or("-".to_string(), |(s, m)| {
                format!("{s:+.1} MiB/h over its {m:.0} min")
            });
            println!(
                "soak: RSS of {stage}: peak {max:.0} MiB; slope after a {:.0} s warm-up {} MiB/h (all samples), {} MiB/h (peaks per window); its longest-lived process {longest}",
                f64::from(warmup) / 1000.0,
                fmt(all),
                fmt(of_peaks),
            );
        }
        println!(
            "soak: the driver (generator's ground truth, reader, oracle) peaked at {:.0} MiB RSS",
            self.driver_peak_mib
        );
        println!(
            "soak: stage processes that ended on their own (restarted): {}",
            self.exits.len()
        );
        for e in self.exits {
            println!("soak:   {e}");
        }
        let deliveries = oc.oracle.as_ref().map_or(0, |r| r.deliveries);
        println!(
            "soak: oracle: {deliveries} deliveries checked; {} causal violations, {} duplicate/loss findings, {} state mismatches, {} oversold: {}",
            u32::from(oc.oracle.is_err()),
            oc.completeness.len(),
            oc.state.len(),
            oc.oversold,
            if oc.passed() { "PASS" } else { "FAIL" }
        );
        if let Err(v) = &oc.oracle {
            println!("  causal violation: {v}");
        }
        for c in oc.completeness.iter().chain(&oc.state) {
            println!("  {c}");
        }
    }

    /// One row per chart bucket (a tenth of a window): the time, each stage's peak RSS, the
    /// outputs and their latency, the faults that started in it.
    pub(crate) fn csv(&self) -> String {
        let bucket = (self.window_ms / 10).max(1);
        let n = self.windows() * 10;
        let lat = latency_windows(self.latencies, bucket, n);
        let peaks: Vec<Vec<Option<f64>>> = STAGES
            .iter()
            .map(|s| peaks(&self.samples(s), bucket, n))
            .collect();
        let mut out = String::from(
            "minute,rss_sales_facts_mib,rss_ledger_mib,outputs,p50_ms,p99_ms,max_ms,faults\n",
        );
        let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
        for (i, w) in lat.iter().enumerate() {
            let faults: Vec<&str> = self
                .faults
                .iter()
                .filter(|f| ((f.at / bucket) as usize).min(n - 1) == i)
                .map(|f| f.kind)
                .collect();
            let (count, p50, p99, max) = w
                .map_or((0, String::new(), String::new(), String::new()), |s| {
                    (s.n, s.p50.to_string(), s.p99.to_string(), s.max.to_string())
                });
            out.push_str(&format!(
                "{:.2},{},{},{count},{p50},{p99},{max},{}\n",
                f64::from(i as u32 * bucket) / 60_000.0,
                opt(peaks[0][i]),
                opt(peaks[1][i]),
                faults.join("+")
            ));
        }
        out
    }
}
