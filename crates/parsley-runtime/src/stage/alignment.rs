//! Watermark alignment (`EventTimeOrder::max_drift_ms`), as a pure plan the stream thread
//! applies after each poll batch, beside backpressure.
//!
//! An event-time input whose delivered event time runs more than the limit ahead of the
//! watermark ([`WatermarkTracker::drift`](parsley_gate::WatermarkTracker::drift); without bound
//! while the watermark has no value) is paused, and resumed once it is within half the limit: whatever it delivers meanwhile waits in the timer
//! queue, so stopping it early bounds the queue by the drift instead of by the history. The
//! limit is the configured drift plus the control clock's lag (live records run the lag ahead
//! of the watermark and must not be paused for it).
//!
//! Invariants: an input a blocked record waits on ([`Gate::awaited`], or an in-flight claim
//! that needs it read, [`Gate::needs_reading`]) is never paused by alignment — the record could
//! wait for ever; nor is one with no drift (unordered, nothing delivered), nor the input that
//! holds the watermark (its drift is at most zero, or it has delivered nothing, or it is
//! unordered). So whatever holds the watermark is always read — an input, or the control stream,
//! which is not an input — the watermark keeps rising while history is left, and every paused
//! input is resumed.

use std::collections::HashSet;

use parsley_clock::Channel;
use parsley_gate::Gate;

use crate::event_time::EventTime;

/// What the plan needs of one event-time input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Input {
    /// The channel.
    pub channel: Channel,
    /// How far its delivered event time runs ahead of the watermark, ms; `None`: not known.
    pub drift: Option<i64>,
    /// A blocked record waits on it.
    pub awaited: bool,
}

/// The inputs of one task, read from its gate and event-time state.
pub(crate) fn inputs<R>(gate: &Gate<R>, et: &EventTime) -> Vec<Input> {
    et.inputs()
        .into_iter()
        .map(|channel| Input {
            channel,
            drift: et.drift(&channel),
            awaited: gate.awaited(&channel) || gate.needs_reading(&channel),
        })
        .collect()
}

/// The limit of a stage with drift `max_drift_ms` and control lag `lag_ms`, ms.
pub(crate) fn limit(max_drift_ms: i64, lag_ms: Option<i64>) -> i64 {
    max_drift_ms.saturating_add(lag_ms.unwrap_or(0).max(0))
}

/// The pauses (`true`) and resumes (`false`) alignment asks for, given the inputs paused by it
/// now (`ahead`) and the limit, ms.
pub(crate) fn plan(inputs: &[Input], ahead: &HashSet<Channel>, limit: i64) -> Vec<(Channel, bool)> {
    inputs
        .iter()
        .filter_map(|i| {
            let was = ahead.contains(&i.channel);
            let pause = !i.awaited
                && i.drift
                    .is_some_and(|d| if was { d > limit / 2 } else { d > limit });
            (pause != was).then_some((i.channel, pause))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use parsley_clock::TopicId;

    use super::*;

    fn ch(p: i32) -> Channel {
        Channel::new(TopicId::from_halves(1, 1), p)
    }

    fn input(p: i32, drift: Option<i64>, awaited: bool) -> Input {
        Input {
            channel: ch(p),
            drift,
            awaited,
        }
    }

    #[test]
    fn an_input_beyond_the_limit_pauses_and_resumes_within_half_of_it() {
        let none = HashSet::new();
        // Limit 1,000 ms: 1,001 ahead pauses, 1,000 does not.
        let inputs = [input(0, Some(1_001), false), input(1, Some(1_000), false)];
        assert_eq!(plan(&inputs, &none, 1_000), vec![(ch(0), true)]);
        let paused: HashSet<Channel> = [ch(0)].into();
        // Paused at 501 ahead stays paused; at 500 it resumes.
        assert_eq!(plan(&[input(0, Some(501), false)], &paused, 1_000), vec![]);
        assert_eq!(
            plan(&[input(0, Some(500), false)], &paused, 1_000),
            vec![(ch(0), false)]
        );
    }

    #[test]
    fn an_awaited_input_or_one_without_a_drift_is_never_paused() {
        let none = HashSet::new();
        let inputs = [
            input(0, Some(1_000_000), true),
            input(1, None, false),
            input(2, Some(-5), false),
        ];
        assert_eq!(plan(&inputs, &none, 1_000), vec![]);
        // A paused input a blocked record comes to wait on is resumed at once.
        let paused: HashSet<Channel> = [ch(0), ch(1)].into();
        assert_eq!(
            plan(&inputs, &paused, 1_000),
            vec![(ch(0), false), (ch(1), false)]
        );
    }

    #[test]
    fn the_limit_adds_the_clock_lag() {
        assert_eq!(limit(60_000, None), 60_000);
        assert_eq!(limit(60_000, Some(500)), 60_500);
        assert_eq!(limit(i64::MAX, Some(500)), i64::MAX);
    }
}
