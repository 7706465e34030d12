//! State of operators. A backend stores named states (RocksDB column
//! families, or ordered maps on the heap) of byte keys and values, accessed
//! per batch: one multi-get for every key a batch touches, one atomic write
//! batch for every change it makes, and ordered range scans.
//!
//! Operators do not use a backend directly: [`keyed::KeyedState`] owns the
//! layout (key group first), [`codec`] the encoding of keys and values,
//! [`transfer`] the canonical form that savepoints and heap checkpoints
//! hold and how state is split or merged when parallelism changes.

pub mod codec;
mod heap;
pub mod keyed;
mod rocks;
pub mod transfer;

use std::ops::Range;
use std::path::Path;

pub use heap::HeapBackend;
pub use keyed::{
    EntryRef, KeyedEntries, KeyedState, KeyedWrite, RestoredEntry, StateDecl, StateKind, Timer, restored_entries,
};
pub use rocks::{RocksDbBackend, RocksDbTuning};
pub use transfer::StateSource;

use crate::checkpoint::OperatorSnapshot;
use crate::config::StateBackendKind;
use crate::error::StateError;
use crate::keygroup::KeyGroup;

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

    /// Loads entries of one state during a restore (RocksDB: written to an
    /// SST file and ingested, bypassing the memtable and the WAL). Later
    /// entries of the same key win.
    fn ingest(&mut self, state: StateId, mut entries: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        for (k, v) in entries.drain(..) {
            batch.put(state, k, v);
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.write(batch)
    }

    /// The greatest key in `[start, end)`, if any (RocksDB: one reverse
    /// seek).
    fn last_in(&self, state: StateId, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let mut last = None;
        self.scan(state, start, end, &mut |k, _| {
            last = Some(k.to_vec());
            true
        })?;
        Ok(last)
    }

    /// About how many bytes of keys and values the states hold (what a
    /// restore brought in: the state's size starts from it).
    fn estimated_bytes(&self) -> i64;

    /// The synchronous part of a checkpoint: a consistent copy of every
    /// state as of now, cheap to take (RocksDB: flush + hard links; heap:
    /// the canonical entries of `key_groups`).
    fn snapshot(
        &mut self,
        checkpoint_id: u64,
        states: &[&str],
        key_groups: Range<KeyGroup>,
    ) -> Result<OperatorSnapshot, StateError>;
}

/// Opens the configured backend for one stateful subtask owning
/// `key_groups`, filled from `sources` (empty: a fresh start). `dir` is
/// only used by RocksDB; it is wiped first unless a RocksDB checkpoint of
/// exactly these key groups is moved there (the same-parallelism restore).
pub fn open_keyed(
    kind: StateBackendKind,
    tuning: &RocksDbTuning,
    dir: &Path,
    decls: &[StateDecl],
    key_groups: Range<KeyGroup>,
    max_parallelism: u16,
    sources: &[StateSource],
) -> Result<KeyedState, StateError> {
    let names: Vec<&str> = decls.iter().map(|d| d.name).collect();
    let overlapping: Vec<&StateSource> = sources
        .iter()
        .filter(|s| {
            let g = s.key_groups();
            g.start < key_groups.end && key_groups.start < g.end
        })
        .collect();
    // Same parallelism: the one RocksDB checkpoint of exactly these key
    // groups becomes this subtask's instance as it is. Another parallelism:
    // the RocksDB checkpoint overlapping most is cloned (SSTs hard-linked)
    // and clipped to these key groups by range deletions; the others are
    // imported (SST ingestion).
    let overlap = |s: &StateSource| {
        let g = s.key_groups();
        usize::from(g.end.min(key_groups.end).saturating_sub(g.start.max(key_groups.start)))
    };
    let exact = match (kind, overlapping.as_slice()) {
        (
            StateBackendKind::RocksDb,
            [
                StateSource::RocksDb {
                    dir: from,
                    key_groups: g,
                },
            ],
        ) if *g == key_groups => Some(from.clone()),
        _ => None,
    };
    let base = match kind {
        StateBackendKind::RocksDb if exact.is_none() => overlapping
            .iter()
            .filter(|s| matches!(s, StateSource::RocksDb { .. }))
            .max_by_key(|s| overlap(s))
            .copied(),
        _ => None,
    };
    let mut backend: Box<dyn StateBackend> = match (kind, &exact, base) {
        (StateBackendKind::RocksDb, Some(from), _) => {
            rocks::move_dir(from, dir)?;
            Box::new(RocksDbBackend::open_existing(dir, &names, tuning)?)
        }
        (StateBackendKind::RocksDb, None, Some(StateSource::RocksDb { dir: from, .. })) => {
            rocks::clone_dir(from, dir)?;
            let db = RocksDbBackend::open_existing(dir, &names, tuning)?;
            db.delete_outside(&key_groups)?;
            Box::new(db)
        }
        (StateBackendKind::RocksDb, _, _) => Box::new(RocksDbBackend::open_fresh(dir, &names, tuning)?),
        (StateBackendKind::Heap, _, _) => Box::new(HeapBackend::new(names.len())),
    };
    let rest: Vec<StateSource> = overlapping
        .into_iter()
        .filter(|s| exact.is_none() && !base.is_some_and(|b| std::ptr::eq(*s, b)))
        .cloned()
        .collect();
    if !rest.is_empty() {
        transfer::import(backend.as_mut(), &names, &rest, key_groups.clone())?;
    }
    let restored = if sources.is_empty() {
        0
    } else {
        backend.estimated_bytes()
    };
    let mut state = KeyedState::new(backend, decls, key_groups, max_parallelism);
    state.add_size(restored);
    Ok(state)
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
    fn snapshots_restore_what_was_there_and_not_what_came_after_at_any_split() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("db");
        let names = ["s0", "s1"];
        let mut rocks = RocksDbBackend::open_fresh(&db, &names, &RocksDbTuning::default()).expect("open");
        let mut heap = HeapBackend::new(2);
        for b in [&mut rocks as &mut dyn StateBackend, &mut heap] {
            exercise_groups(b);
        }
        let (OperatorSnapshot::RocksDb { dir: chk, .. }, OperatorSnapshot::Entries { bytes, .. }) = (
            rocks.snapshot(1, &names, 0..8).expect("snapshot"),
            heap.snapshot(1, &names, 0..8).expect("snapshot"),
        ) else {
            panic!("unexpected snapshot kinds");
        };
        let before = (dump(&rocks, 0), dump(&rocks, 1));
        for b in [&mut rocks as &mut dyn StateBackend, &mut heap] {
            let mut w = WriteBatch::default();
            w.put(0, b"\0\x01later".to_vec(), b"x".to_vec());
            b.write(w).expect("write");
        }
        drop(rocks);
        let decls = [
            StateDecl {
                name: "s0",
                kind: StateKind::Value,
                ttl: false,
            },
            StateDecl {
                name: "s1",
                kind: StateKind::Value,
                ttl: false,
            },
        ];
        let sources = [
            StateSource::RocksDb {
                dir: chk.clone(),
                key_groups: 0..8,
            },
            StateSource::Entries {
                bytes: std::sync::Arc::new(bytes.clone()),
                key_groups: 0..8,
                path: "heap".into(),
            },
        ];
        for source in &sources {
            for kind in [StateBackendKind::RocksDb, StateBackendKind::Heap] {
                // Split in two halves (rescale 1 -> 2), then both halves
                // together hold exactly what was there.
                let mut all = (vec![], vec![]);
                for (i, range) in [0..3u16, 3..8].into_iter().enumerate() {
                    let target = dir.path().join(format!("t-{i}-{kind:?}"));
                    let s = open_keyed(
                        kind,
                        &RocksDbTuning::default(),
                        &target,
                        &decls,
                        range.clone(),
                        8,
                        std::slice::from_ref(source),
                    )
                    .expect("open");
                    let (a, b) = (dump(s.backend(), 0), dump(s.backend(), 1));
                    assert!(
                        a.iter()
                            .chain(&b)
                            .all(|(k, _)| range.contains(&u16::from_be_bytes([k[0], k[1]])))
                    );
                    all.0.extend(a);
                    all.1.extend(b);
                }
                assert_eq!(all, before, "{source:?} into {kind:?}");
            }
        }
        let cut = bytes.len() / 2;
        let truncated = StateSource::Entries {
            bytes: std::sync::Arc::new(bytes[..cut].to_vec()),
            key_groups: 0..8,
            path: "heap".into(),
        };
        assert!(
            open_keyed(
                StateBackendKind::Heap,
                &RocksDbTuning::default(),
                &dir.path().join("x"),
                &decls,
                0..8,
                8,
                &[truncated]
            )
            .is_err()
        );
    }

    fn exercise_groups(backend: &mut dyn StateBackend) {
        let mut b = WriteBatch::default();
        for g in 0u16..8 {
            for k in [b"a".as_slice(), b"bb"] {
                let mut key = g.to_be_bytes().to_vec();
                key.extend_from_slice(k);
                b.put((g % 2) as usize, key, k.to_vec());
            }
        }
        backend.write(b).expect("write");
    }

    #[test]
    fn heap_and_rocksdb_agree() {
        let dir = tempfile::tempdir().expect("tempdir");
        exercise(&mut HeapBackend::new(2));
        exercise(
            &mut RocksDbBackend::open_fresh(&dir.path().join("db"), &["s0", "s1"], &RocksDbTuning::default())
                .expect("open"),
        );
    }
}

#[cfg(test)]
mod import_tests {
    use super::*;
    use crate::checkpoint::OperatorSnapshot;

    use super::keyed::tests::DECLS;

    /// Entries imported from a snapshot, then deleted, are gone from the
    /// next snapshot (the state a savepoint exports).
    #[test]
    fn imported_entries_deleted_stay_deleted_in_the_next_snapshot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut a = open_keyed(
            StateBackendKind::RocksDb,
            &RocksDbTuning::default(),
            &dir.path().join("a"),
            DECLS,
            0..8,
            8,
            &[],
        )
        .expect("open");
        let mut w = KeyedWrite::default();
        for g in 0u16..8 {
            let e = EntryRef {
                key_group: g,
                key: b"k",
                namespace: b"ns",
            };
            w.put(0, e, None, vec![g as u8]);
            w.add_timer(1, g, 10, b"k", b"ns");
        }
        a.write(w).expect("write");
        let OperatorSnapshot::RocksDb {
            dir: chk, key_groups, ..
        } = a.snapshot(1).expect("snapshot")
        else {
            panic!()
        };
        let source = StateSource::RocksDb { dir: chk, key_groups };
        let mut b = open_keyed(
            StateBackendKind::RocksDb,
            &RocksDbTuning::default(),
            &dir.path().join("b"),
            DECLS,
            0..4,
            8,
            &[source],
        )
        .expect("import");
        // What the restore brought counts in the state's size (RocksDB's
        // estimate of its files).
        assert!(b.size_bytes() > 0, "restored state sized {}", b.size_bytes());
        let due = b.due_timers(1, 100, 100).expect("due");
        assert_eq!(due.len(), 4);
        let mut w = KeyedWrite::default();
        for t in &due {
            w.delete_timer(1, t);
            w.delete(
                0,
                EntryRef {
                    key_group: t.key_group,
                    key: &t.key,
                    namespace: &t.namespace,
                },
                Some(1),
            );
        }
        b.write(w).expect("delete");
        let OperatorSnapshot::RocksDb { dir: chk2, .. } = b.snapshot(2).expect("snapshot") else {
            panic!()
        };
        let mut left = 0;
        transfer::for_each_in_rocksdb(&chk2, 0..8, &mut |_, _, _, _| {
            left += 1;
            Ok(())
        })
        .expect("export");
        assert_eq!(left, 0, "deleted entries came back");
    }
}
