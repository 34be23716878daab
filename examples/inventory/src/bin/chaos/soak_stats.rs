//! The soak's arithmetic, apart from any broker: latency percentiles per time window, peaks
//! per window, and the least-squares slope of memory over time.

/// Latencies of one window, ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Samples in the window.
    pub n: usize,
    pub p50: u32,
    pub p99: u32,
    pub max: u32,
}

/// The nearest-rank percentile `q` (0 < q ≤ 1) of `sorted` (ascending, not empty).
fn rank(sorted: &[u32], q: f64) -> u32 {
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[i - 1]
}

/// p50, p99 and max of `samples` (reordered in place); `None` when empty.
pub(crate) fn summarize(samples: &mut [u32]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    Some(Summary {
        n: samples.len(),
        p50: rank(samples, 0.50),
        p99: rank(samples, 0.99),
        max: samples[samples.len() - 1],
    })
}

/// Latency samples `(at, latency)` (`at`: ms since the run's start) summarised per window of
/// `width` ms: window `i` holds `i·width ≤ at < (i+1)·width`; `windows` of them (samples
/// beyond the last go to the last, the tail of a run that drains after its end).
pub(crate) fn latency_windows(
    samples: &[(u32, u32)],
    width: u32,
    windows: usize,
) -> Vec<Option<Summary>> {
    let mut buckets: Vec<Vec<u32>> = vec![Vec::new(); windows.max(1)];
    let last = buckets.len() - 1;
    for &(at, latency) in samples {
        buckets[((at / width.max(1)) as usize).min(last)].push(latency);
    }
    buckets.iter_mut().map(|b| summarize(b)).collect()
}

/// The largest value per window of `width` (same windows as [`latency_windows`]).
pub(crate) fn peaks(samples: &[(u32, f64)], width: u32, windows: usize) -> Vec<Option<f64>> {
    let mut out: Vec<Option<f64>> = vec![None; windows.max(1)];
    let last = out.len() - 1;
    for &(at, v) in samples {
        let w = &mut out[((at / width.max(1)) as usize).min(last)];
        *w = Some(w.map_or(v, |m: f64| m.max(v)));
    }
    out
}

/// The least-squares slope of `points` `(x, y)`: Σ(x−x̄)(y−ȳ) / Σ(x−x̄)². `None` with fewer
/// than two distinct `x`.
pub(crate) fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Memory samples `(at ms, MiB)` after `warmup` ms: their slope in MiB per hour.
pub(crate) fn mib_per_hour(samples: &[(u32, f64)], warmup: u32) -> Option<f64> {
    let points: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(at, _)| *at >= warmup)
        .map(|&(at, v)| (f64::from(at) / 3_600_000.0, v))
        .collect();
    slope(&points)
}

/// A `kB` field of a `/proc` text (`VmRSS:` of `/proc/<pid>/status`, `MemAvailable:` of
/// `/proc/meminfo`, …), in MiB.
pub(crate) fn proc_mib(text: &str, field: &str) -> Option<f64> {
    let line = text.lines().find(|l| {
        l.strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// A `kB` field of the `/proc` file at `path`, in MiB (`None` if it cannot be read: a process
/// that is gone).
pub(crate) fn read_proc_mib(path: &str, field: &str) -> Option<f64> {
    proc_mib(&std::fs::read_to_string(path).ok()?, field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<u32> = (1..=100).rev().collect();
        assert_eq!(
            summarize(&mut v),
            Some(Summary {
                n: 100,
                p50: 50,
                p99: 99,
                max: 100
            })
        );
        assert_eq!(
            summarize(&mut [7]),
            Some(Summary {
                n: 1,
                p50: 7,
                p99: 7,
                max: 7
            })
        );
        assert_eq!(summarize(&mut []), None);
        // 1,000 samples with ten slow ones: p99 is the fastest of the slow ones' neighbours.
        let mut v: Vec<u32> = (0..1_000).map(|i| if i < 990 { 10 } else { 500 }).collect();
        let s = summarize(&mut v).unwrap();
        assert_eq!((s.p50, s.p99, s.max), (10, 10, 500));
    }

    #[test]
    fn latency_windows_split_by_arrival_time() {
        let samples = [(0, 5), (599, 7), (600, 100), (1_250, 3), (5_000, 9)];
        let w = latency_windows(&samples, 600, 3);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0].map(|s| (s.n, s.max)), Some((2, 7)));
        assert_eq!(w[1].map(|s| (s.n, s.p50)), Some((1, 100)));
        // The tail beyond the last window counts in it.
        assert_eq!(w[2].map(|s| (s.n, s.max)), Some((2, 9)));
        assert_eq!(latency_windows(&[], 600, 2), vec![None, None]);
    }

    #[test]
    fn peaks_per_window() {
        let samples = [(0, 10.0), (10, 30.0), (20, 20.0), (45, 5.0)];
        assert_eq!(
            peaks(&samples, 20, 4),
            vec![Some(30.0), Some(20.0), Some(5.0), None]
        );
    }

    #[test]
    fn the_slope_is_least_squares() {
        // y = 2x + 1 exactly.
        let line: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 2.0 * x as f64 + 1.0)).collect();
        assert!((slope(&line).unwrap() - 2.0).abs() < 1e-12);
        // Noise symmetric about a flat line: slope 0.
        let flat = [(0.0, 1.0), (0.0, 3.0), (1.0, 1.0), (1.0, 3.0)];
        assert!(slope(&flat).unwrap().abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 1.0)]), None);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
        // 10 MiB more every hour, sampled every minute, the first ten minutes (a warm-up
        // climbing 100 MiB) left out.
        let samples: Vec<(u32, f64)> = (0..120u32)
            .map(|m| {
                let v = if m < 10 {
                    m as f64 * 10.0
                } else {
                    100.0 + m as f64 / 6.0
                };
                (m * 60_000, v)
            })
            .collect();
        let s = mib_per_hour(&samples, 600_000).unwrap();
        assert!((s - 10.0).abs() < 1e-9, "{s}");
    }

    #[test]
    fn rss_is_read_from_proc_status() {
        let status = "Name:\tchaos\nVmPeak:\t  900000 kB\nVmRSS:\t   51200 kB\nThreads:\t12\n";
        assert_eq!(proc_mib(status, "VmRSS"), Some(50.0));
        assert_eq!(proc_mib(status, "VmPeak"), Some(900_000.0 / 1024.0));
        assert_eq!(proc_mib(status, "Vm"), None);
        assert_eq!(proc_mib("Name:\tx\n", "VmRSS"), None);
        assert_eq!(
            proc_mib(
                "MemTotal:  2048 kB\nMemAvailable:    1024 kB\n",
                "MemAvailable"
            ),
            Some(1.0)
        );
    }
}
