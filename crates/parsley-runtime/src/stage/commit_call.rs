//! The end of a commit, bounded: sending the input offsets to the transaction
//! (`AddOffsetsToTxn`, then `TxnOffsetCommit` to the group coordinator) and committing it
//! (`EndTxn`), on a helper thread, while the stream thread serves the producer's delivery
//! reports (and, when the commit overlaps, takes further batches).
//!
//! librdkafka can wait in `send_offsets_to_transaction` past the timeout it was given: when the
//! group coordinator leaves the cluster, a coordinator request may stay parked on the departed
//! broker until some other broker changes state, possibly never (librdkafka issues 5456 and 5511;
//! case C21 reproduces it on the local cluster with Kafka 4.4 and librdkafka 2.12). So the stream
//! thread waits for each of the two calls at most the stage's timeout or its transaction timeout,
//! whichever is shorter (past the transaction timeout the coordinator has aborted the transaction,
//! and the commit can only fail), plus [`GRACE`]. A call that has not returned by then is given up:
//! [`KafkaError::TransactionStalled`], which the stage recovers from like an aborted transaction,
//! except that the producer is replaced instead of asked to abort (librdkafka refuses any
//! transactional call while one is in progress). Initialising the new producer fences the old one's
//! epoch, and the coordinator aborts whatever it left open; the tasks return to their last commit
//! and the work is redone, exactly once.
//!
//! Before that bound, a call is given up as soon as the coordinator it may wait on has moved to
//! another node (module `coordinator`): the producer is replaced then, seconds after the new
//! coordinator is elected instead of at the bound. A call given up at its bound names the
//! coordinator it waited on.
//!
//! A call that takes longer than [`NOTICE`] is said once, at WARN, with what the commit waits
//! for, so a stage that waits seconds for a coordinator is never silent about it.
//!
//! Invariants: nothing is sent on the producer from the start of the call to its result (the
//! stream thread holds its sends back); the helper thread owns a handle of the producer until
//! its call returns, so a given-up producer is freed by that thread, never under it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::producer::{BaseProducer, Producer};
use tracing::warn;

use crate::outbox::{AckContext, Outbox};
use parsley_task::error::{Error, Result};
use parsley_task::error::{KafkaError, Operation, SetupError};

/// What a call may take beyond the stage's timeout before it is given up: librdkafka's own
/// timeout fires first whenever it works.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// How long a call may take before the stream thread says, once, what the commit waits for
/// (a commit takes milliseconds; seconds mean a coordinator or a leader is moving, or writes
/// are refused).
pub(crate) const NOTICE: Duration = Duration::from_secs(5);

/// The phases of the call, as the helper thread reports them.
const SENDING_OFFSETS: u8 = 0;
const COMMITTING: u8 = 1;
const DONE: u8 = 2;

/// The two calls of a commit in progress on their helper thread.
pub(super) struct CommitCall {
    phase: Arc<AtomicU8>,
    result: Receiver<Result<()>>,
    /// The phase the stream thread last saw, and when it saw it begin.
    seen: (u8, Instant),
    /// The phase a notice was logged for.
    noticed: Option<u8>,
    timeout: Duration,
}

/// The call of `phase`, as a log line or an error names it.
fn operation(phase: u8) -> Operation {
    if phase == SENDING_OFFSETS {
        Operation::TxnOffsetCommit
    } else {
        Operation::EndTxn
    }
}

impl CommitCall {
    /// Starts sending `offsets` with `metadata` to `producer`'s open transaction and then
    /// committing it, each call with `timeout`.
    ///
    /// # Errors
    /// [`SetupError::ThreadSpawn`] when the helper thread cannot be spawned (nothing was called).
    pub(super) fn start(
        stage: &str,
        producer: Arc<BaseProducer<AckContext>>,
        offsets: TopicPartitionList,
        metadata: ConsumerGroupMetadata,
        timeout: Duration,
    ) -> Result<Self> {
        Self::spawn(stage, timeout, move |phase| {
            let outcome = producer
                .send_offsets_to_transaction(&offsets, &metadata, timeout)
                .map_err(|e| crate::client_error::kafka(Operation::SendOffsetsToTransaction, e))
                .and_then(|()| {
                    phase.store(COMMITTING, Ordering::Release);
                    Outbox::commit_served(&producer, timeout)
                });
            (outcome, move || producer.context().signal())
        })
    }

    /// Runs `calls` on a helper thread named after `stage`: they store [`COMMITTING`] in the
    /// phase between the two calls and return the result with a wake-up for the stream thread,
    /// called once the result is in.
    fn spawn<W: FnOnce()>(
        stage: &str,
        timeout: Duration,
        calls: impl FnOnce(&AtomicU8) -> (Result<()>, W) + Send + 'static,
    ) -> Result<Self> {
        let phase = Arc::new(AtomicU8::new(SENDING_OFFSETS));
        let (tx, result) = mpsc::sync_channel(1);
        let reported = Arc::clone(&phase);
        std::thread::Builder::new()
            .name(format!("{stage}-commit"))
            .spawn(move || {
                let (outcome, wake) = calls(&reported);
                let _ = tx.send(outcome);
                reported.store(DONE, Ordering::Release);
                wake();
            })
            .map_err(|source| {
                Error::Setup(SetupError::ThreadSpawn {
                    stage: stage.to_string(),
                    source,
                })
            })?;
        Ok(CommitCall {
            phase,
            result,
            seen: (SENDING_OFFSETS, Instant::now()),
            noticed: None,
            timeout,
        })
    }

    /// Whether both calls have returned.
    pub(super) fn finished(&self) -> bool {
        self.phase.load(Ordering::Acquire) == DONE
    }

    /// `Ok` while the call in progress is within its bound (or the whole is finished). Once
    /// a call has taken [`NOTICE`], logs (WARN, once per call) what the commit waits for.
    ///
    /// # Errors
    /// [`KafkaError::TransactionStalled`] naming the call once it has run longer than the timeout
    /// plus [`GRACE`].
    pub(super) fn check(&mut self) -> Result<()> {
        let phase = self.phase.load(Ordering::Acquire);
        if phase != self.seen.0 {
            self.seen = (phase, Instant::now());
        }
        if phase == DONE {
            return Ok(());
        }
        let waited = self.seen.1.elapsed();
        if waited > NOTICE && self.noticed != Some(phase) {
            self.noticed = Some(phase);
            warn!(
                waited_ms = waited.as_millis() as u64,
                timeout_ms = self.timeout.as_millis() as u64,
                "the commit is waiting for {}: a coordinator moving, or writes refused; given up \
                 after the timeout",
                operation(phase)
            );
        }
        if waited <= self.timeout + GRACE {
            return Ok(());
        }
        Err(Error::Kafka(KafkaError::TransactionStalled {
            operation: operation(phase),
            timeout: self.timeout,
            coordinator: None,
            moved: None,
        }))
    }

    /// The call in progress and how long it has waited (since the stream thread last saw its
    /// phase begin); `None` once both have returned.
    pub(super) fn waiting(&self) -> Option<(Operation, Duration)> {
        let phase = self.phase.load(Ordering::Acquire);
        (phase != DONE && phase == self.seen.0).then(|| (operation(phase), self.seen.1.elapsed()))
    }

    /// The bound each call was given.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The calls' result, once [`CommitCall::finished`].
    pub(super) fn result(self) -> Result<()> {
        self.result.recv().unwrap_or_else(|_| {
            Err(Error::Kafka(KafkaError::TransactionStalled {
                operation: Operation::CommitHelperEnded,
                timeout: self.timeout,
                coordinator: None,
                moved: None,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (checking the bound as the stream thread does) until `call` finishes or is given
    /// up; returns what `check` or `result` said and how long it took.
    fn wait(mut call: CommitCall) -> (Result<()>, Duration) {
        let started = Instant::now();
        loop {
            if call.finished() {
                return (call.result(), started.elapsed());
            }
            if let Err(e) = call.check() {
                return (Err(e), started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn calls_that_return_give_their_result() {
        let call = CommitCall::spawn("s", Duration::from_secs(5), |phase| {
            phase.store(COMMITTING, Ordering::Release);
            (Ok(()), || {})
        })
        .unwrap();
        assert!(wait(call).0.is_ok());
        let failing = CommitCall::spawn("s", Duration::from_secs(5), |_| {
            (
                Err(Error::Kafka(KafkaError::Timeout {
                    what: parsley_task::error::Awaited::Flush,
                    timeout: Duration::from_secs(1),
                })),
                || {},
            )
        })
        .unwrap();
        assert!(matches!(
            wait(failing).0,
            Err(Error::Kafka(KafkaError::Timeout { .. }))
        ));
    }

    #[test]
    fn a_call_that_never_returns_is_given_up_after_the_timeout_and_the_grace() {
        let timeout = Duration::from_millis(50);
        // Sending the offsets never returns (the helper waits on a channel nobody sends to).
        let (_never, blocked) = mpsc::channel::<()>();
        let call = CommitCall::spawn("s", timeout, move |_| {
            let _ = blocked.recv();
            (Ok(()), || {})
        })
        .unwrap();
        let (outcome, took) = wait(call);
        assert!(
            matches!(outcome, Err(Error::Kafka(KafkaError::TransactionStalled { operation, timeout: t, .. })) if operation.as_str().starts_with("sending the input offsets") && t == timeout),
            "{outcome:?}"
        );
        assert!(took > timeout + GRACE, "given up after {took:?}");
    }

    #[test]
    fn the_commit_gets_its_own_bound_after_the_offsets() {
        let timeout = Duration::from_millis(50);
        let (_never, blocked) = mpsc::channel::<()>();
        let call = CommitCall::spawn("s", timeout, move |phase| {
            phase.store(COMMITTING, Ordering::Release);
            let _ = blocked.recv();
            (Ok(()), || {})
        })
        .unwrap();
        let (outcome, _) = wait(call);
        assert!(
            matches!(outcome, Err(Error::Kafka(KafkaError::TransactionStalled { operation, .. })) if operation.as_str().starts_with("committing")),
            "{outcome:?}"
        );
    }
}
