//! What the stream threads of one stage in one process share
//! ([`RuntimeConfig::stream_threads`](crate::RuntimeConfig::stream_threads)): each thread is a
//! member of the stage's group with its own consumer, producer and tasks, and a task lives on
//! one thread at a time; but the stage has one state store per process and one set of
//! standbys per process.
//!
//! - **The state store.** A store directory is held by one open store at a time (`fjall`
//!   locks it), and a task that moves from one thread to another must find its keyspace and
//!   checkpoint. So the first thread to start opens `{state_dir}/{group id}` and every thread
//!   of the stage uses that store, one keyspace per task as with one thread. Two threads never
//!   write one keyspace at once: under the eager range assignor a thread commits a revoked
//!   task's work — its state reaches the keyspace right after the commit — before it gives the
//!   partitions up, and the task's next owner is assigned only after every member did.
//! - **The standbys.** The standbys are chosen for the instance, from the tasks all its threads
//!   own, as Kafka Streams assigns standbys per client: no thread warms a task another thread of
//!   the process owns, and a task assigned to any thread takes over its standby, whichever
//!   thread read it (module `tasks::standby`).

use std::sync::{Arc, Mutex, PoisonError};

use parsley_task::error::Result;
use parsley_task::state_store::StateStores;

use super::SharedStandbys;

/// What the stream threads of one stage in one process share (module docs).
#[derive(Debug, Default)]
pub(crate) struct Siblings {
    /// The stage's state store, once a thread opened it.
    stores: Mutex<Option<StateStores>>,
    /// The stage's standbys, once a thread made them.
    standbys: Mutex<Option<SharedStandbys>>,
}

impl Siblings {
    /// Nothing shared yet.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Siblings::default())
    }

    /// The stage's state store: the one a thread opened before, else the one `open` opens.
    ///
    /// # Errors
    /// `open`'s.
    pub(crate) fn stores(&self, open: impl FnOnce() -> Result<StateStores>) -> Result<StateStores> {
        let mut stores = self.stores.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(stores) = &*stores {
            return Ok(stores.clone());
        }
        let opened = open()?;
        *stores = Some(opened.clone());
        Ok(opened)
    }

    /// The stage's standbys: those a thread made before, else the ones `make` makes.
    pub(crate) fn standbys(&self, make: impl FnOnce() -> SharedStandbys) -> SharedStandbys {
        self.standbys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(make)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use parsley_clock::TopicId;
    use parsley_task::state_store::Checkpoint;

    use super::*;

    #[test]
    fn the_threads_of_a_stage_share_one_store_opened_once() {
        let dir = std::env::temp_dir().join(format!(
            "parsley-siblings-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let siblings = Siblings::new();
        let opened = AtomicUsize::new(0);
        let open = || {
            opened.fetch_add(1, Ordering::SeqCst);
            StateStores::open(&dir, "app.stage", 86_400_000)
        };
        let first = siblings.stores(open).unwrap();
        let second = siblings.stores(open).unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 1, "opened once");
        // A store of its own for the second thread cannot be opened while the first holds the
        // directory: the reason the threads share one.
        assert!(
            StateStores::open(&dir, "app.stage", 86_400_000).is_err(),
            "a second store on the same directory opens"
        );
        // What one thread writes for a task, the other finds: a task that moves between
        // threads keeps its keyspace and checkpoint.
        let checkpoint = Checkpoint {
            topic: TopicId::from_bytes([7; 16]),
            offset: 42,
            written_ms: 1,
        };
        first
            .task(3)
            .unwrap()
            .write([(&b"\x01k"[..], Some(&b"v"[..]))], checkpoint)
            .unwrap();
        assert_eq!(
            second.task(3).unwrap().checkpoint().unwrap(),
            Some(checkpoint)
        );
        drop((first, second, siblings));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
