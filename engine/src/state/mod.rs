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
}

/// Opens the configured backend for one stateful subtask. `dir` is only
/// used by RocksDB; it is wiped first, since a job that is not restoring
/// starts from empty state.
pub fn open_backend(kind: StateBackendKind, dir: &Path, states: &[&str]) -> Result<Box<dyn StateBackend>, StateError> {
    Ok(match kind {
        StateBackendKind::RocksDb => Box::new(RocksDbBackend::open_fresh(dir, states)?),
        StateBackendKind::Heap => Box::new(HeapBackend::new(states.len())),
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

    #[test]
    fn heap_and_rocksdb_agree() {
        let dir = tempfile::tempdir().expect("tempdir");
        exercise(&mut HeapBackend::new(2));
        exercise(&mut RocksDbBackend::open_fresh(&dir.path().join("db"), &["s0", "s1"]).expect("open"));
    }
}
