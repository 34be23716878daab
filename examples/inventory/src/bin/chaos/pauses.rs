//! Pauses: a stage that stops delivering for longer than its configured timeouts must say
//! why in its log.
//!
//! Per stage, the delivery times of all its processes in a run (their journals) make one
//! timeline from its first delivery to its last; every input of the pipeline is committed
//! before the last, so a long gap in it is the pipeline waiting with work in hand: this stage,
//! or the stage upstream whose outputs it waits for (a downstream stage cannot see records
//! that are not committed yet, so it has nothing to say). A gap longer than `threshold_ms`
//! with no log line of any stage process of the run inside it is a silent stall: the run
//! fails. The longest gap is reported either way.

use std::path::Path;

use anyhow::{Context, Result};

/// What the pauses of one run were.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Pauses {
    /// The longest gap between two deliveries of one stage, ms.
    pub longest_ms: i64,
    /// Gaps longer than the threshold without a log line in them, described.
    pub silent: Vec<String>,
}

/// A log line's time (ms since the epoch, the first word of every line the workers write)
/// and whether it is a delivery of the journal.
fn timed(line: &str, delivery_marker: &str) -> Option<(i64, bool)> {
    let at = line.split_whitespace().next()?.parse().ok()?;
    Some((at, line.contains(delivery_marker)))
}

/// The pauses of `stages` in the worker logs of run `run_id` under `logs` (files
/// `{run_id}-{stage}-…`), deliveries being the lines that contain `delivery_marker`.
pub(crate) fn pauses(
    logs: &Path,
    run_id: &str,
    stages: &[&str],
    delivery_marker: &str,
    threshold_ms: i64,
) -> Result<Pauses> {
    let mut found = Pauses::default();
    // Every stage process's log lines that are not deliveries, and each stage's deliveries.
    let mut said = Vec::new();
    let mut deliveries: Vec<Vec<i64>> = vec![Vec::new(); stages.len()];
    for entry in std::fs::read_dir(logs)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stage) = stages
            .iter()
            .position(|s| name.starts_with(&format!("{run_id}-{s}-")))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        for (at, delivery) in text.lines().filter_map(|l| timed(l, delivery_marker)) {
            if delivery {
                deliveries[stage].push(at);
            } else {
                said.push(at);
            }
        }
    }
    for (stage, deliveries) in stages.iter().zip(&mut deliveries) {
        let gaps = silent_gaps(deliveries, &mut said, threshold_ms);
        found.longest_ms = found.longest_ms.max(gaps.0);
        found.silent.extend(gaps.1.into_iter().map(|(from, ms)| {
            format!("stage {stage}: no delivery and no log line for {ms} ms from {from} (ms since the epoch)")
        }));
    }
    Ok(found)
}

/// The longest gap between consecutive `deliveries`, and each gap longer than `threshold_ms`
/// with no time of `said` strictly inside it (its start and length).
fn silent_gaps(
    deliveries: &mut [i64],
    said: &mut [i64],
    threshold_ms: i64,
) -> (i64, Vec<(i64, i64)>) {
    deliveries.sort_unstable();
    said.sort_unstable();
    let mut longest = 0;
    let mut silent = Vec::new();
    for pair in deliveries.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let gap = b - a;
        longest = longest.max(gap);
        if gap > threshold_ms {
            let first_after = said.partition_point(|&t| t <= a);
            if said.get(first_after).is_none_or(|&t| t >= b) {
                silent.push((a, gap));
            }
        }
    }
    (longest, silent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_gap_needs_a_log_line_inside_it() {
        let mut deliveries = vec![0, 100, 200, 20_200, 20_300, 50_000];
        // A line inside the first long gap, none inside the second.
        let mut said = vec![5_000, 20_300, 50_000];
        let (longest, silent) = silent_gaps(&mut deliveries, &mut said, 10_000);
        assert_eq!(longest, 29_700);
        assert_eq!(silent, vec![(20_300, 29_700)]);
    }

    #[test]
    fn short_gaps_are_never_silent_stalls() {
        let mut deliveries = vec![3, 1, 2, 9_000];
        let (longest, silent) = silent_gaps(&mut deliveries, &mut [], 10_000);
        assert_eq!((longest, silent), (8_997, vec![]));
    }

    #[test]
    fn a_line_needs_its_time_first() {
        let marker = " parsley::delivery: delivered ";
        assert_eq!(
            timed(
                "1796185032890  WARN parsley_runtime::stage::intake: x",
                marker
            ),
            Some((1_796_185_032_890, false))
        );
        assert_eq!(
            timed("17  TRACE parsley::delivery: delivered topic=\"t\"", marker),
            Some((17, true))
        );
        assert_eq!(timed("chaos: error: x", marker), None);
    }
}
