//! Watermark alignment (`EventTimeOrder::max_drift_ms`), as a pure plan the stream thread
//! applies after each poll batch, beside backpressure.
//!
//! Each event-time input gets a **bound**: the watermark plus the limit. A record of the input
//! whose event time (its timestamp, ms) lies above its bound is held before the gate (module
//! `held`), and so is every later record of the input, until the watermark rises far enough;
//! while the watermark has no value the bound is below every event time, so an input that has
//! delivered holds everything it reads next. Only records within the limit of the watermark
//! reach the task and wait in its timer queue, so the queue holds about the inputs' event-time
//! density times the limit instead of whatever the inputs run ahead by. Held records are not
//! delivered: nothing of them is written to the queue's changelog, and a restart reads them
//! again from the committed offsets. The limit is the configured drift plus the control clock's
//! lag (live records run the lag ahead of the watermark and are never held for it).
//!
//! Invariants: an input a blocked record waits on ([`Gate::awaited`], or an in-flight claim
//! that needs it read, [`Gate::needs_reading`]) has no bound — the record could wait for ever —
//! nor has one with no drift (unordered, nothing delivered). One that does not run ahead of the
//! watermark (drift at most zero) lets at least its first held record go on each turn, whatever
//! its event time. The input that holds the watermark is one of these (its drift is at most
//! zero, or it has delivered nothing, or it is unordered), so whatever holds the watermark is
//! always read and offered — an input, or the control stream, which is not an input — the
//! watermark keeps rising while history is left, and every held record goes on.

use parsley_clock::Channel;
use parsley_gate::Gate;

use parsley_task::event_time::EventTime;

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

/// What alignment lets go to the gate of one input now (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bound {
    /// The highest event time that may go to the gate, ms.
    pub up_to: i64,
    /// The input does not run ahead of the watermark (it may hold it): its first held record
    /// goes on whatever its event time, so the watermark can rise past a gap in its history.
    pub at_least_one: bool,
}

/// Each input's bound; `None` when nothing of it is held (module docs). `watermark` is the
/// task's (`None`: no value yet, every bound below every event time), `limit` the stage's
/// ([`limit`]).
pub(crate) fn bounds(
    inputs: &[Input],
    watermark: Option<i64>,
    limit: i64,
) -> Vec<(Channel, Option<Bound>)> {
    let up_to = watermark.map_or(i64::MIN, |w| w.saturating_add(limit));
    inputs
        .iter()
        .map(|i| {
            let bound = match i.drift {
                Some(drift) if !i.awaited => Some(Bound {
                    up_to,
                    at_least_one: drift <= 0,
                }),
                _ => None,
            };
            (i.channel, bound)
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

    fn up_to(up_to: i64) -> Option<Bound> {
        Some(Bound {
            up_to,
            at_least_one: false,
        })
    }

    #[test]
    fn an_input_ahead_of_the_watermark_is_bounded_by_the_watermark_plus_the_limit() {
        // Watermark 10,000, limit 1,000: an input 1 ms ahead or 5,000 ahead gets 11,000.
        let inputs = [input(0, Some(1), false), input(1, Some(5_000), false)];
        assert_eq!(
            bounds(&inputs, Some(10_000), 1_000),
            vec![(ch(0), up_to(11_000)), (ch(1), up_to(11_000))]
        );
        // No watermark yet: an input that delivered holds everything it reads next.
        assert_eq!(
            bounds(&[input(0, Some(i64::MAX), false)], None, 1_000),
            vec![(ch(0), up_to(i64::MIN))]
        );
        // The bound saturates.
        assert_eq!(
            bounds(&[input(0, Some(1), false)], Some(i64::MAX - 5), 1_000),
            vec![(ch(0), up_to(i64::MAX))]
        );
    }

    #[test]
    fn an_input_not_ahead_lets_its_first_held_record_go_on() {
        let inputs = [input(0, Some(0), false), input(1, Some(-5), false)];
        let not_ahead = Some(Bound {
            up_to: 11_000,
            at_least_one: true,
        });
        assert_eq!(
            bounds(&inputs, Some(10_000), 1_000),
            vec![(ch(0), not_ahead), (ch(1), not_ahead)]
        );
    }

    #[test]
    fn an_awaited_input_or_one_without_a_drift_is_never_bounded() {
        let inputs = [input(0, Some(1_000_000), true), input(1, None, false)];
        assert_eq!(
            bounds(&inputs, Some(10_000), 1_000),
            vec![(ch(0), None), (ch(1), None)]
        );
    }

    #[test]
    fn the_limit_adds_the_clock_lag() {
        assert_eq!(limit(60_000, None), 60_000);
        assert_eq!(limit(60_000, Some(500)), 60_500);
        assert_eq!(limit(i64::MAX, Some(500)), i64::MAX);
    }
}
