//! Fold state on disk: a local copy of each task's changelog partition, with a checkpoint, so
//! that state larger than memory stays off the heap and a restart reads only the changelog's
//! tail (as Kafka Streams does with RocksDB and its `.checkpoint` file).
//!
//! A stage run with a state directory (`RuntimeConfig::state_dir`)
//! opens one embedded store per stage under `{dir}/{group id}` (fjall, a log-structured merge
//! tree), with one keyspace per task partition. The keyspace of task `p` holds the records of
//! changelog partition `p` folded in offset order — the latest value of every key, tombstoned
//! keys removed, byte for byte the changelog's keys and values — up to its **checkpoint**: the
//! changelog offset below which every record is reflected, with the changelog topic's id and
//! the wall-clock time it was written. The changelog stays the source of truth.
//!
//! # Invariants
//! - The store holds committed changelog records only: a transaction's records reach it after
//!   the transaction commits, in one atomic batch with the new checkpoint, so the keyspace and
//!   its checkpoint always describe one committed prefix of the changelog. A crash between the
//!   commit and the batch leaves the older checkpoint, and the restore reads the records again.
//! - A checkpoint is conservative: every changelog record below it is reflected; records at or
//!   above it may be, and folding them again changes nothing (the latest value of a key wins).
//! - A restore trusts a checkpoint only when it names the same changelog topic (its id, so a
//!   recreated topic is a new one), lies between the partition's log start offset and its high
//!   watermark, and is younger than the topic's `delete.retention.ms`: within that time
//!   compaction keeps every tombstone written after the checkpoint, so no deleted key comes
//!   back ([`judge`]). Otherwise the keyspace is cleared and the changelog read whole.
//! - Keys of the changelog start with bytes `0x00`–`0x06`; the checkpoint's key starts with
//!   `0xff`, so it never collides with one.

use std::path::{Path, PathBuf};

use fjall::{Database, Keyspace, KeyspaceCreateOptions};
use parsley_clock::TopicId;
use parsley_stage::changelog::{Restored, STATE_PREFIX};

use crate::error::ProcessingError;
use crate::error::{Error, Result};
use crate::memory::StoreMemory;

/// The key of a keyspace's checkpoint.
const CHECKPOINT_KEY: &[u8] = b"\xffparsley.checkpoint";
/// The version byte of the checkpoint's encoding.
const CHECKPOINT_VERSION: u8 = 1;
/// The encoded checkpoint's length: version, topic id, offset, time.
const CHECKPOINT_LEN: usize = 1 + 16 + 8 + 8;
/// The block cache shared by a stage's keyspaces and one keyspace's memtable (what a task's
/// state may hold in memory before it is written out, besides the cache), without a memory
/// bound: 64 MiB and 16 MiB.
const SIZES: StoreMemory = StoreMemory::DEFAULT;
/// Bits per key of every table's Bloom filter (about 1 % false positives).
const FILTER_BITS_PER_KEY: f32 = 10.0;
/// Background threads of a stage's store (flushes and compactions).
const STORE_WORKERS: usize = 1;
/// Changelog keys up to this long are looked up without a heap allocation, bytes.
const STACK_KEY_BYTES: usize = 64;

/// The store's tuning, in one place: how a stage's database and each task's keyspace are
/// opened.
struct StoreOptions;

impl StoreOptions {
    /// The database of a stage at `path`: its block cache of `cache` bytes and one background
    /// worker. With more than one, fjall's first worker hands every compaction it receives
    /// back to the queue and can take it again at once, spinning until another worker takes it
    /// (a tenth of a count's CPU on two cores); one worker flushes and compacts in turn.
    fn database(path: &Path, cache: u64) -> fjall::DatabaseBuilder<Database> {
        Database::builder(path)
            .cache_size(cache)
            .worker_threads(STORE_WORKERS)
    }

    /// A task's keyspace: its memtable of `sizes.memtable` bytes, and one Bloom filter policy on
    /// every level. A fold looks up each key it changes, and a new key is found in no table,
    /// so a lookup asks the filter of every table it may be in: fjall's default filters of the
    /// first levels (0.01 % false positives, 13 probes each) cost a count over unique keys more
    /// than the few blocks that 1 % false positives read.
    ///
    /// Under a memory bound (`through_cache`) filter and index blocks are partitioned at every
    /// level: a lookup then reads the small partition it needs through the cache. Read whole
    /// through a cache of a few MiB, a level's filter block is evicted before its next use, and
    /// every lookup read and checksummed it again: a count over 2,000,000 unique keys under
    /// a 16 MiB bound spent two thirds of its CPU there (48.2 s against 13.3 s partitioned).
    /// Without a bound fjall's own choice stays (the first levels' blocks pinned whole): on
    /// 5,000,000 unique keys partitioning costs 6-9 % more CPU.
    fn keyspace(sizes: StoreMemory) -> KeyspaceCreateOptions {
        use fjall::config::{
            BloomConstructionPolicy, FilterPolicy, FilterPolicyEntry, PartitioningPolicy,
        };
        let options = KeyspaceCreateOptions::default()
            .max_memtable_size(sizes.memtable)
            .filter_policy(FilterPolicy::all(FilterPolicyEntry::Bloom(
                BloomConstructionPolicy::BitsPerKey(FILTER_BITS_PER_KEY),
            )));
        if sizes.through_cache {
            options
                .filter_block_partitioning_policy(PartitioningPolicy::all(true))
                .index_block_partitioning_policy(PartitioningPolicy::all(true))
        } else {
            options
        }
    }
}
/// The broker's default `delete.retention.ms`, used when the topic's cannot be read.
pub const DEFAULT_DELETE_RETENTION_MS: i64 = 86_400_000;

/// Where a task's keyspace reflects its changelog partition up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// The changelog topic's id.
    pub topic: TopicId,
    /// Every changelog record below this offset is reflected.
    pub offset: i64,
    /// When it was written, ms since the epoch.
    pub written_ms: i64,
}

impl Checkpoint {
    fn encode(&self) -> [u8; CHECKPOINT_LEN] {
        let mut out = [0; CHECKPOINT_LEN];
        out[0] = CHECKPOINT_VERSION;
        out[1..17].copy_from_slice(&self.topic.to_bytes());
        out[17..25].copy_from_slice(&self.offset.to_be_bytes());
        out[25..33].copy_from_slice(&self.written_ms.to_be_bytes());
        out
    }

    /// Decodes a checkpoint; `None` for bytes of another length or version.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; CHECKPOINT_LEN] = bytes.try_into().ok()?;
        if bytes[0] != CHECKPOINT_VERSION {
            return None;
        }
        let id: [u8; 16] = bytes[1..17].try_into().ok()?;
        Some(Checkpoint {
            topic: TopicId::from_bytes(id),
            offset: i64::from_be_bytes(bytes[17..25].try_into().ok()?),
            written_ms: i64::from_be_bytes(bytes[25..33].try_into().ok()?),
        })
    }
}

/// What a restore knows of the changelog partition when it judges a checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct ChangelogView {
    /// The changelog topic's id.
    pub topic: TopicId,
    /// The partition's log start offset.
    pub log_start: i64,
    /// Its high watermark.
    pub end: i64,
    /// The topic's `delete.retention.ms`.
    pub delete_retention_ms: i64,
    /// Now, ms since the epoch.
    pub now_ms: i64,
}

/// Whether a restore may start at `checkpoint` (module docs): `Ok(offset)` to read the tail
/// from, or why the keyspace must be cleared.
pub fn judge(checkpoint: Option<Checkpoint>, view: ChangelogView) -> Result<i64, String> {
    let Some(c) = checkpoint else {
        return Err("no checkpoint".into());
    };
    if c.topic != view.topic {
        return Err(format!(
            "the checkpoint is of changelog topic {}, not {} (deleted and recreated)",
            c.topic, view.topic
        ));
    }
    if c.offset < view.log_start || c.offset > view.end {
        return Err(format!(
            "checkpoint offset {} outside the partition's log [{}, {}]",
            c.offset, view.log_start, view.end
        ));
    }
    let age = view.now_ms.saturating_sub(c.written_ms);
    if age >= view.delete_retention_ms {
        return Err(format!(
            "the checkpoint is {age} ms old, not younger than delete.retention.ms \
             ({} ms): compaction may have removed tombstones written since",
            view.delete_retention_ms
        ));
    }
    Ok(c.offset)
}

/// The on-disk store of one stage instance: one keyspace per task partition.
#[derive(Clone)]
pub struct StateStores {
    db: Database,
    path: PathBuf,
    /// The changelog topic's `delete.retention.ms`.
    delete_retention_ms: i64,
    /// How its keyspaces are sized.
    sizes: StoreMemory,
}

impl std::fmt::Debug for StateStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStores")
            .field("path", &self.path)
            .finish()
    }
}

impl StateStores {
    /// Opens (or creates) the store of the stage whose group id is `group` under `dir`; its
    /// changelog topic keeps tombstones `delete_retention_ms`.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`] when it cannot be opened (another process holds it, no
    /// space, no permission).
    pub fn open(dir: &Path, group: &str, delete_retention_ms: i64) -> Result<Self> {
        Self::open_sized(dir, group, delete_retention_ms, SIZES)
    }

    /// [`StateStores::open`] with the cache and memtables of `sizes` (under a memory bound,
    /// module `memory`).
    ///
    /// # Errors
    /// As [`StateStores::open`].
    pub fn open_sized(
        dir: &Path,
        group: &str,
        delete_retention_ms: i64,
        sizes: StoreMemory,
    ) -> Result<Self> {
        let path = dir.join(group);
        let db = StoreOptions::database(&path, sizes.cache)
            .open()
            .map_err(|e| store_error(&path, "opening", e))?;
        Ok(StateStores {
            db,
            path,
            delete_retention_ms,
            sizes,
        })
    }

    /// What the store's write buffers hold now, bytes: every keyspace's memtable and those
    /// sealed and not yet written out, as fjall counts them (one of its unstable counters,
    /// pinned by the lock file). The block cache, sized when the store opens, is not in it.
    pub fn write_buffer_bytes(&self) -> u64 {
        self.db.write_buffer_size()
    }

    /// The changelog topic's `delete.retention.ms`.
    pub fn delete_retention_ms(&self) -> i64 {
        self.delete_retention_ms
    }

    /// The keyspace of task `partition`.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`].
    pub fn task(&self, partition: i32) -> Result<TaskStore> {
        let keyspace = self
            .db
            .keyspace(&format!("task-{partition}"), || {
                StoreOptions::keyspace(self.sizes)
            })
            .map_err(|e| store_error(&self.path, "opening a keyspace of", e))?;
        Ok(TaskStore {
            db: self.db.clone(),
            keyspace,
            path: self.path.clone(),
            partition,
        })
    }

    /// Writes what the store buffers to disk (a clean shutdown: the next start reads only
    /// what was committed since).
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`].
    pub fn persist(&self) -> Result<()> {
        self.db
            .persist(fjall::PersistMode::SyncAll)
            .map_err(|e| store_error(&self.path, "persisting", e))
    }
}

fn store_error(path: &Path, doing: &str, e: impl std::fmt::Display) -> Error {
    Error::Processing(ProcessingError::StateStore {
        path: path.display().to_string(),
        message: format!("{doing} the state store: {e}"),
    })
}

/// The keyspace of one task: its changelog partition's fold, up to a checkpoint.
pub struct TaskStore {
    db: Database,
    keyspace: Keyspace,
    path: PathBuf,
    partition: i32,
}

impl TaskStore {
    fn error(&self, doing: &str, e: impl std::fmt::Display) -> Error {
        Error::Processing(ProcessingError::StateStore {
            path: self.path.display().to_string(),
            message: format!("{doing} task {}'s keyspace: {e}", self.partition),
        })
    }

    /// The checkpoint; `None` when there is none or it does not decode.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`] for a failed read.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        let raw = self
            .keyspace
            .get(CHECKPOINT_KEY)
            .map_err(|e| self.error("reading the checkpoint of", e))?;
        Ok(raw.and_then(|r| Checkpoint::decode(&r)))
    }

    /// Empties the keyspace (its checkpoint too): the changelog is read whole.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`].
    pub fn clear(&self) -> Result<()> {
        self.keyspace.clear().map_err(|e| self.error("clearing", e))
    }

    /// Folds every record the keyspace holds except fold state (the task snapshot, event-time
    /// records, keyed timers) into `restored`, as the changelog's records would be.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`] for a failed read or a record that does not fold, named by
    /// key.
    pub fn load_into(&self, restored: &mut Restored) -> Result<()> {
        for guard in self
            .keyspace
            .range(vec![STATE_PREFIX + 1]..CHECKPOINT_KEY.to_vec())
        {
            let (key, value) = guard.into_inner().map_err(|e| self.error("reading", e))?;
            restored
                .apply(&key, Some(&value))
                .map_err(|m| self.error("folding a record of", format!("key {key:?}: {m}")))?;
        }
        restored.records = 0;
        Ok(())
    }

    /// Every key's fold state in the keyspace, in key order: `(k, value)` for each changelog
    /// key `0x00 ++ k`.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`] for a failed read.
    pub fn state_entries(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for guard in self
            .keyspace
            .range(vec![STATE_PREFIX]..vec![STATE_PREFIX + 1])
        {
            let (key, value) = guard.into_inner().map_err(|e| self.error("reading", e))?;
            out.push((key[1..].to_vec(), value.to_vec()));
        }
        Ok(out)
    }

    /// The fold state of key `k` (changelog key `0x00 ++ k`).
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`].
    pub fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>> {
        // A lookup per record: the key's changelog form on the stack when it fits.
        let mut stack = [0u8; STACK_KEY_BYTES];
        let heap;
        let key: &[u8] = if k.len() < STACK_KEY_BYTES {
            stack[0] = STATE_PREFIX;
            stack[1..=k.len()].copy_from_slice(k);
            &stack[..=k.len()]
        } else {
            heap = [&[STATE_PREFIX][..], k].concat();
            &heap
        };
        Ok(self
            .keyspace
            .get(key)
            .map_err(|e| self.error("reading", e))?
            .map(|v| v.to_vec()))
    }

    /// Applies changelog records (`None`: a tombstone) and moves the checkpoint, atomically.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`].
    pub fn write<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        checkpoint: Checkpoint,
    ) -> Result<()> {
        self.write_with_state(std::iter::empty(), records, checkpoint)
    }

    /// Applies, atomically, fold state (`(k, value)` for changelog key `0x00 ++ k`) and other
    /// changelog records (full keys), each with `None` for a tombstone, and moves the
    /// checkpoint: [`TaskStore::write`] without a copy of each fold key in its changelog form.
    ///
    /// # Errors
    /// [`ProcessingError::StateStore`].
    pub fn write_with_state<'a, 'b>(
        &self,
        state: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        records: impl IntoIterator<Item = (&'b [u8], Option<&'b [u8]>)>,
        checkpoint: Checkpoint,
    ) -> Result<()> {
        let mut batch = self.db.batch();
        let mut key = vec![STATE_PREFIX];
        for (k, value) in state {
            key.truncate(1);
            key.extend_from_slice(k);
            match value {
                Some(v) => batch.insert(&self.keyspace, &key[..], v),
                None => batch.remove(&self.keyspace, &key[..]),
            }
        }
        for (key, value) in records {
            match value {
                Some(v) => batch.insert(&self.keyspace, key, v),
                None => batch.remove(&self.keyspace, key),
            }
        }
        batch.insert(&self.keyspace, CHECKPOINT_KEY, checkpoint.encode());
        batch.commit().map_err(|e| self.error("writing", e))
    }

    /// Keys with fold state, approximately (a metric).
    pub fn approximate_keys(&self) -> usize {
        self.keyspace.approximate_len()
    }
}

/// Now, ms since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsley_stage::changelog::META_KEY;

    fn view(end: i64) -> ChangelogView {
        ChangelogView {
            topic: TopicId::from_bytes([7; 16]),
            log_start: 0,
            end,
            delete_retention_ms: 1_000,
            now_ms: 10_000,
        }
    }

    fn at(offset: i64, written_ms: i64) -> Option<Checkpoint> {
        Some(Checkpoint {
            topic: TopicId::from_bytes([7; 16]),
            offset,
            written_ms,
        })
    }

    #[test]
    fn a_checkpoint_is_trusted_only_for_the_same_topic_inside_the_log_and_retention() {
        assert_eq!(judge(at(40, 9_500), view(50)), Ok(40));
        assert_eq!(judge(at(50, 9_500), view(50)), Ok(50));
        assert_eq!(judge(None, view(50)).unwrap_err(), "no checkpoint");
        let mut other = at(40, 9_500).unwrap();
        other.topic = TopicId::from_bytes([8; 16]);
        assert!(
            judge(Some(other), view(50))
                .unwrap_err()
                .contains("recreated")
        );
        assert!(
            judge(at(51, 9_500), view(50))
                .unwrap_err()
                .contains("outside")
        );
        let mut started = view(50);
        started.log_start = 41;
        assert!(
            judge(at(40, 9_500), started)
                .unwrap_err()
                .contains("outside")
        );
        // As old as the retention: a tombstone written just after it may be gone.
        assert!(
            judge(at(40, 9_000), view(50))
                .unwrap_err()
                .contains("delete.retention.ms")
        );
        assert_eq!(judge(at(40, 9_001), view(50)), Ok(40));
    }

    #[test]
    fn checkpoints_round_trip_and_bad_bytes_are_none() {
        let c = at(-1, i64::MIN).unwrap();
        assert_eq!(Checkpoint::decode(&c.encode()), Some(c));
        let c = at(i64::MAX, 1_700_000_000_000).unwrap();
        assert_eq!(Checkpoint::decode(&c.encode()), Some(c));
        let mut bad = c.encode();
        bad[0] = 2;
        assert_eq!(Checkpoint::decode(&bad), None);
        assert_eq!(Checkpoint::decode(&bad[..32]), None);
        assert_eq!(Checkpoint::decode(&[]), None);
    }

    #[test]
    fn write_buffer_bytes_count_what_the_memtables_hold() {
        let dir = std::env::temp_dir().join(format!("parsley-store-{}", uuid::Uuid::new_v4()));
        // Default sizes: a 16 MiB memtable, which the batch below does not fill (no flush).
        let stores = StateStores::open(&dir, "app.stage", 1_000).unwrap();
        assert_eq!(stores.write_buffer_bytes(), 0);
        let store = stores.task(0).unwrap();
        let keys: Vec<Vec<u8>> = (0..10_000u32).map(|i| i.to_be_bytes().to_vec()).collect();
        store
            .write_with_state(
                keys.iter().map(|k| (&k[..], Some(&[7u8; 100][..]))),
                [],
                at(1, 1).unwrap(),
            )
            .unwrap();
        let written = stores.write_buffer_bytes();
        assert!(
            written >= 10_000 * 100,
            "10,000 values of 100 bytes in the memtable, counted: {written}"
        );
        drop((store, stores));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_keyspace_mirrors_the_records_written_and_keeps_them_across_a_reopen() {
        let dir = std::env::temp_dir().join(format!("parsley-store-{}", uuid::Uuid::new_v4()));
        let snapshot = parsley_stage::changelog::TaskSnapshot {
            sender: parsley_clock::SenderId::from_short([5; 8]),
            next_seq: 3,
            clock: Default::default(),
            gate: Default::default(),
            offsets: Vec::new(),
        }
        .encode();
        {
            let stores = StateStores::open(&dir, "app.stage", 1_000).unwrap();
            // One process at a time: a second open of the same store is refused, named.
            let second = StateStores::open(&dir, "app.stage", 1_000).unwrap_err();
            assert!(
                matches!(&second, Error::Processing(ProcessingError::StateStore { path, .. }) if path.ends_with("app.stage")),
                "{second}"
            );
            let store = stores.task(2).unwrap();
            assert_eq!(store.checkpoint().unwrap(), None);
            let first = at(10, 1).unwrap();
            store
                .write_with_state(
                    [(&b"a"[..], Some(&b"1"[..]))],
                    [
                        (&b"\x00b"[..], Some(&b"2"[..])),
                        (META_KEY, Some(&snapshot[..])),
                    ],
                    first,
                )
                .unwrap();
            let second = at(20, 2).unwrap();
            // A key too long for a lookup's stack buffer.
            let long = [b'k'; STACK_KEY_BYTES + 1];
            store
                .write_with_state(
                    [(&b"a"[..], None), (&long[..], Some(&b"7"[..]))],
                    [(&b"\x00b"[..], Some(&b"3"[..]))],
                    second,
                )
                .unwrap();
            // Another task's keyspace is another partition's.
            assert_eq!(stores.task(3).unwrap().get(b"b").unwrap(), None);
            stores.persist().unwrap();
        }
        let stores = StateStores::open(&dir, "app.stage", 1_000).unwrap();
        let store = stores.task(2).unwrap();
        assert_eq!(store.checkpoint().unwrap(), at(20, 2));
        assert_eq!(store.get(b"a").unwrap(), None);
        assert_eq!(store.get(b"b").unwrap(), Some(b"3".to_vec()));
        let long = [b'k'; STACK_KEY_BYTES + 1];
        assert_eq!(store.get(&long).unwrap(), Some(b"7".to_vec()));
        assert_eq!(store.get(&long[1..]).unwrap(), None);
        let mut restored = Restored::default();
        store.load_into(&mut restored).unwrap();
        assert_eq!(restored.snapshot.map(|s| s.next_seq), Some(3));
        assert!(restored.state.is_empty(), "fold state stays on disk");
        assert_eq!(restored.records, 0);
        store.clear().unwrap();
        assert_eq!(store.checkpoint().unwrap(), None);
        assert_eq!(store.get(b"b").unwrap(), None);
        drop((store, stores));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
