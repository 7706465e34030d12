//! Keyed state. A backend stores named states (RocksDB column families, or
//! ordered maps on the heap) of byte keys and values, accessed per batch:
//! one multi-get for every key a batch touches, one atomic write batch for
//! every change it makes, and ordered range scans (event-time timers).
//!
//! Key layout used by operators: `key group (2 bytes BE) | key | namespace`,
//! so a subtask's state splits by key-group range when parallelism changes.

mod heap;
mod rocks;

use std::path::Path;

pub use heap::HeapBackend;
pub use rocks::RocksDbBackend;

use crate::checkpoint::OperatorSnapshot;
use crate::config::StateBackendKind;
use crate::error::StateError;

/// Index of a named state declared when the backend was opened.
pub type StateId = usize;

/// Changes applied atomically by [`StateBackend::write`].
#[derive(Debug, Default)]
pub struct WriteBatch {
    pub ops: Vec<(StateId, Vec<u8>, Option<Vec<u8>>)>,
}

impl WriteBatch {
    pub fn put(&mut self, state: StateId, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push((state, key, Some(value)));
    }

    pub fn delete(&mut self, state: StateId, key: Vec<u8>) {
        self.ops.push((state, key, None));
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Contract: reads see every write made before them by the same owner;
/// `scan` visits keys in ascending byte order.
pub trait StateBackend: Send {
    fn multi_get(&self, state: StateId, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError>;

    fn write(&mut self, batch: WriteBatch) -> Result<(), StateError>;

    /// Visits `[start, end)` in key order until `visit` returns false.
    fn scan(
        &self,
        state: StateId,
        start: &[u8],
        end: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StateError>;

    /// The synchronous part of a checkpoint: a consistent copy of every
    /// state as of now, cheap to take (RocksDB: flush + hard links).
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<OperatorSnapshot, StateError>;
}

/// Where a subtask's state starts from.
pub enum Restore {
    Empty,
    /// RocksDB files of a checkpoint, already copied into the directory.
    RocksDbFiles,
    /// A heap snapshot.
    HeapBytes(Vec<u8>),
}

/// Opens the configured backend for one stateful subtask. `dir` is only
/// used by RocksDB; unless restoring it is wiped first.
pub fn open_backend(
    kind: StateBackendKind,
    dir: &Path,
    states: &[&str],
    restore: Restore,
) -> Result<Box<dyn StateBackend>, StateError> {
    Ok(match (kind, restore) {
        (StateBackendKind::RocksDb, Restore::RocksDbFiles) => Box::new(RocksDbBackend::open_existing(dir, states)?),
        (StateBackendKind::RocksDb, _) => Box::new(RocksDbBackend::open_fresh(dir, states)?),
        (StateBackendKind::Heap, Restore::HeapBytes(b)) => Box::new(HeapBackend::restore(states.len(), &b)?),
        (StateBackendKind::Heap, _) => Box::new(HeapBackend::new(states.len())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(backend: &mut dyn StateBackend) {
        let mut b = WriteBatch::default();
        for k in [b"b".as_slice(), b"a", b"c", b"d"] {
            b.put(0, k.to_vec(), k.to_vec());
        }
        b.put(1, b"a".to_vec(), b"other".to_vec());
        b.delete(0, b"d".to_vec());
        backend.write(b).expect("write");
        let got = backend.multi_get(0, &[b"a", b"z", b"d"]).expect("get");
        assert_eq!(got, vec![Some(b"a".to_vec()), None, None]);
        let mut seen = vec![];
        backend
            .scan(0, b"a", b"c", &mut |k, _| {
                seen.push(k.to_vec());
                true
            })
            .expect("scan");
        assert_eq!(seen, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(backend.multi_get(1, &[b"a"]).expect("get")[0], Some(b"other".to_vec()));
    }

    fn dump(b: &dyn StateBackend, state: StateId) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = vec![];
        b.scan(state, b"", &[0xff; 8], &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            true
        })
        .expect("scan");
        out
    }

    #[test]
    fn snapshots_restore_what_was_there_and_not_what_came_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("db");
        let mut rocks = RocksDbBackend::open_fresh(&db, &["s0", "s1"]).expect("open");
        let mut heap = HeapBackend::new(2);
        for b in [&mut rocks as &mut dyn StateBackend, &mut heap] {
            exercise(b);
        }
        let (OperatorSnapshot::RocksDb { dir: chk }, OperatorSnapshot::Heap(bytes)) = (
            rocks.snapshot(1).expect("snapshot"),
            heap.snapshot(1).expect("snapshot"),
        ) else {
            panic!("unexpected snapshot kinds");
        };
        let before = (dump(&rocks, 0), dump(&rocks, 1));
        for b in [&mut rocks as &mut dyn StateBackend, &mut heap] {
            let mut w = WriteBatch::default();
            w.put(0, b"later".to_vec(), b"x".to_vec());
            b.write(w).expect("write");
        }
        drop(rocks);
        let restored_dir = dir.path().join("restored");
        std::fs::rename(&chk, &restored_dir).expect("move checkpoint");
        let rocks = RocksDbBackend::open_existing(&restored_dir, &["s0", "s1"]).expect("reopen");
        let heap = HeapBackend::restore(2, &bytes).expect("restore heap");
        assert_eq!((dump(&rocks, 0), dump(&rocks, 1)), before);
        assert_eq!((dump(&heap, 0), dump(&heap, 1)), before);
        for cut in [1, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                HeapBackend::restore(2, &bytes[..cut]).is_err(),
                "truncated heap snapshot accepted"
            );
        }
    }

    #[test]
    fn heap_and_rocksdb_agree() {
        let dir = tempfile::tempdir().expect("tempdir");
        exercise(&mut HeapBackend::new(2));
        exercise(&mut RocksDbBackend::open_fresh(&dir.path().join("db"), &["s0", "s1"]).expect("open"));
    }
}
