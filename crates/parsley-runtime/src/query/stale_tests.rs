//! Stale reads against stand-in stream threads: each test files a read on one thread and
//! answers the request it finds in the stage's query slot as a stream thread would, so the
//! handle's side — the question asked of each thread, decoding, the source and lag of each
//! value, the merge of several threads' answers, the typed refusals — is checked without a
//! broker. The threads' side is checked on the broker (`parsley-dsl`'s `stale_reads_on_broker`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parsley_stage::{Codec, CodecError, Utf8};
use parsley_task::metrics::{StageMetrics, TaskPhase};
use parsley_task::query::{StandbyAt, StoreAnswer, StoreQuery};

use super::*;
use crate::threads::StageThreads;

/// Values are decimal text; `"-"` is a fold state that holds no value of the store.
fn reader() -> parsley_stage::store::ValueReader<u64> {
    Arc::new(|state: &[u8]| {
        if state == b"-" {
            return Ok(None);
        }
        let text = std::str::from_utf8(state).map_err(|e| CodecError::Malformed(e.to_string()))?;
        text.parse()
            .map(Some)
            .map_err(|e: std::num::ParseIntError| CodecError::Malformed(e.to_string()))
    })
}

/// A stale view of store `counts` over stage `count`'s threads `threads`.
fn stale(threads: &StageThreads) -> StaleStore<String, u64> {
    let codec: Arc<dyn Codec<String>> = Arc::new(Utf8);
    ReadOnlyStore::new("counts", "count", threads.clone(), (codec, reader())).stale_ok()
}

/// Answers the first request filed with `metrics` by `answer`, as the stream thread would at
/// the end of a turn; returns what was asked.
fn serve(metrics: &StageMetrics, answer: impl FnOnce(&StoreQuery) -> StoreAnswer) -> StoreQuery {
    let started = Instant::now();
    loop {
        if let Some(request) = metrics.queries().take().pop() {
            let query = request.query.clone();
            request.answer(answer(&query));
            return query;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nothing was asked"
        );
        std::thread::yield_now();
    }
}

fn entry(partition: i32, key: &str, state: &str) -> (i32, Vec<u8>, Vec<u8>) {
    (
        partition,
        key.as_bytes().to_vec(),
        state.as_bytes().to_vec(),
    )
}

#[test]
fn a_standbys_value_comes_with_its_position_and_lag_and_an_owners_as_the_owners() {
    let metrics = Arc::new(StageMetrics::default());
    let threads = StageThreads::one(metrics.clone());
    let store = stale(&threads);
    let key = "k1".to_string();
    std::thread::scope(|s| {
        let read = s.spawn(|| store.get(&key));
        let asked = serve(&metrics, |_| StoreAnswer::Stale {
            partition: 1,
            value: Some(b"7".to_vec()),
            standby: Some(StandbyAt {
                position: 120,
                end: Some(125),
            }),
        });
        assert!(
            matches!(&asked, StoreQuery::GetStale { key, at_least: None } if key == b"k1"),
            "{asked:?}"
        );
        assert_eq!(
            read.join().unwrap().unwrap(),
            Read {
                value: Some(7),
                partition: 1,
                source: Source::Standby {
                    position: 120,
                    lag: Some(5)
                }
            }
        );

        // Before the standby's consumer had a fetch response its lag is not known; a key
        // without a value in the standby is `None`, not an error.
        let read = s.spawn(|| store.get(&key));
        serve(&metrics, |_| StoreAnswer::Stale {
            partition: 1,
            value: None,
            standby: Some(StandbyAt {
                position: 0,
                end: None,
            }),
        });
        assert_eq!(
            read.join().unwrap().unwrap(),
            Read {
                value: None,
                partition: 1,
                source: Source::Standby {
                    position: 0,
                    lag: None
                }
            }
        );

        let read = s.spawn(|| store.get(&key));
        serve(&metrics, |_| StoreAnswer::Stale {
            partition: 0,
            value: Some(b"3".to_vec()),
            standby: None,
        });
        assert_eq!(
            read.join().unwrap().unwrap(),
            Read {
                value: Some(3),
                partition: 0,
                source: Source::Owner
            }
        );

        // Neither run here nor a standby here.
        let read = s.spawn(|| store.get(&key));
        serve(&metrics, |_| StoreAnswer::NotOwned { partition: 1 });
        assert_eq!(
            read.join().unwrap(),
            Err(QueryError::NotOwned {
                store: "counts".into(),
                partition: 1
            })
        );
    });
}

#[test]
fn a_read_that_waits_for_a_stamp_is_refused_by_a_standby_with_a_typed_error() {
    let metrics = Arc::new(StageMetrics::default());
    let threads = StageThreads::one(metrics.clone());
    let store = stale(&threads);
    let key = "k1".to_string();
    let stamp = parsley_clock::Clock::default();
    std::thread::scope(|s| {
        let read = s.spawn(|| store.get_at_least(&key, &stamp, Duration::from_millis(50)));
        let asked = serve(&metrics, |_| StoreAnswer::StandbyCannotWait {
            partition: 1,
        });
        assert!(
            matches!(
                asked,
                StoreQuery::GetStale {
                    at_least: Some(_),
                    ..
                }
            ),
            "{asked:?}"
        );
        let refused = read.join().unwrap().unwrap_err();
        assert_eq!(
            refused,
            QueryError::StandbyCannotWait {
                store: "counts".into(),
                partition: 1
            }
        );
        assert!(refused.to_string().contains("standby"), "{refused}");

        // The owner's answer is the value, as `ReadOnlyStore::get_at_least`'s.
        let read = s.spawn(|| store.get_at_least(&key, &stamp, Duration::from_millis(50)));
        serve(&metrics, |_| StoreAnswer::Stale {
            partition: 0,
            value: Some(b"4".to_vec()),
            standby: None,
        });
        assert_eq!(read.join().unwrap(), Ok(Some(4)));
    });
}

#[test]
fn all_reads_the_standbys_on_the_first_thread_only_and_a_task_run_here_wins_over_its_standby() {
    let (first, second) = (
        Arc::new(StageMetrics::default()),
        Arc::new(StageMetrics::default()),
    );
    let threads = StageThreads::from_threads(vec![first.clone(), second.clone()]);
    let store = stale(&threads);
    std::thread::scope(|s| {
        let read = s.spawn(|| store.all());
        // The first thread runs task 0 and read the standbys of tasks 1 and 2; by the time the
        // second thread answers, task 2 was handed over to it.
        let asked = serve(&first, |_| StoreAnswer::StaleEntries {
            entries: vec![
                entry(0, "b", "1"),
                entry(0, "a", "2"),
                entry(1, "c", "5"),
                entry(1, "e", "-"),
                entry(2, "d", "6"),
            ],
            owned: vec![0],
            standbys: vec![
                (
                    1,
                    StandbyAt {
                        position: 10,
                        end: Some(13),
                    },
                ),
                (
                    2,
                    StandbyAt {
                        position: 4,
                        end: Some(4),
                    },
                ),
            ],
        });
        assert!(
            matches!(asked, StoreQuery::AllStale { standbys: true }),
            "{asked:?}"
        );
        let asked = serve(&second, |_| StoreAnswer::StaleEntries {
            entries: vec![entry(2, "d", "8")],
            owned: vec![2],
            standbys: Vec::new(),
        });
        assert!(
            matches!(asked, StoreQuery::AllStale { standbys: false }),
            "the standbys are the process's: read once, {asked:?}"
        );
        let all = read.join().unwrap().unwrap();
        assert_eq!(
            all.entries,
            vec![
                (0, "a".to_string(), 2),
                (0, "b".to_string(), 1),
                (1, "c".to_string(), 5),
                (2, "d".to_string(), 8),
            ],
            "by task then key bytes; task 2 as its owner holds it; a key without a value left out"
        );
        assert_eq!(
            all.tasks,
            BTreeMap::from([
                (0, Source::Owner),
                (
                    1,
                    Source::Standby {
                        position: 10,
                        lag: Some(3)
                    }
                ),
                (2, Source::Owner),
            ])
        );
        assert_eq!(all.max_lag(), Some(3));

        let read = s.spawn(|| store.range("b".to_string().."d".to_string()));
        serve(&first, |_| StoreAnswer::StaleEntries {
            entries: vec![entry(1, "c", "5"), entry(0, "b", "1"), entry(0, "a", "2")],
            owned: vec![0],
            standbys: vec![(
                1,
                StandbyAt {
                    position: 10,
                    end: None,
                },
            )],
        });
        serve(&second, |_| StoreAnswer::StaleEntries {
            entries: Vec::new(),
            owned: Vec::new(),
            standbys: Vec::new(),
        });
        let range = read.join().unwrap().unwrap();
        assert_eq!(
            range.entries,
            vec![(0, "b".to_string(), 1), (1, "c".to_string(), 5)]
        );
        assert_eq!(range.max_lag(), None, "a standby's lag not known yet");
    });
}

#[test]
fn a_stale_read_fails_at_once_while_a_task_of_the_stage_restores() {
    let metrics = Arc::new(StageMetrics::default());
    metrics.task(3, |t| t.phase = TaskPhase::Restoring);
    let threads = StageThreads::one(metrics.clone());
    // Nobody answers: the refusal comes before any request is filed.
    assert_eq!(
        stale(&threads).get(&"k".to_string()),
        Err(QueryError::Restoring {
            store: "counts".into(),
            partitions: vec![3]
        })
    );
    assert!(metrics.queries().take().is_empty(), "nothing was filed");
}

#[test]
fn max_lag_is_zero_when_every_task_read_runs_here() {
    let all: StaleEntries<String, u64> = StaleEntries {
        entries: Vec::new(),
        tasks: BTreeMap::from([(0, Source::Owner), (1, Source::Owner)]),
    };
    assert_eq!(all.max_lag(), Some(0));
}
