//! Savepoints: snapshots a user takes to change a job (upgrade the query,
//! change parallelism, move machines), in a format Weir owns.
//!
//! A savepoint is taken by the same barriers as a checkpoint (always
//! aligned) and written, self-contained, to its own directory:
//!
//! ```text
//! <dir>/_metadata                  the manifest (CheckpointMetadata, format 2,
//!                                  `savepoint` set): every file with size and
//!                                  xxHash64, then an xxh64 line over itself
//! <dir>/state/<uid>-<subtask>.arrows   keyed state of one operator subtask:
//!                                  Arrow IPC entries (state, key_group, key,
//!                                  value), see state::transfer
//! <dir>/state/<uid>-<subtask>.bin  operator state that is not keyed
//! ```
//!
//! plus, in the manifest, source split positions by split id and the sinks'
//! committables. Nothing in it refers to a job's `shared/` files, and no
//! checkpoint garbage collection touches it. RocksDB state is exported from
//! the task's native local checkpoint (opened read-only) by key group;
//! heap state is already in canonical form.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::metadata::{CheckpointMetadata, FORMAT_VERSION, OperatorInfo, OperatorState, SavepointInfo};
use super::storage::CheckpointStorage;
use super::{CheckpointError, OperatorSnapshot, TaskSnapshot};
use crate::state::transfer::{EntriesWriter, for_each_in_rocksdb};

/// A request to take a savepoint, answered with its directory.
#[derive(Debug)]
pub struct SavepointRequest {
    pub dir: PathBuf,
    /// Stop the job at the savepoint (`STOP JOB ... WITH SAVEPOINT`).
    pub stop: bool,
    /// Fire every window and timer first (`DRAIN`).
    pub drain: bool,
    pub reply: tokio::sync::oneshot::Sender<Result<SavepointDone, String>>,
}

/// A completed savepoint.
#[derive(Debug, Clone)]
pub struct SavepointDone {
    pub path: PathBuf,
    pub checkpoint_id: u64,
    pub bytes: u64,
    pub drained: bool,
}

/// Everything a savepoint's manifest holds besides its files.
pub struct SavepointHeader {
    pub id: u64,
    pub job: String,
    pub fingerprint: String,
    pub trigger_time_ms: i64,
    pub max_parallelism: u16,
    pub operator_info: BTreeMap<String, OperatorInfo>,
    pub info: SavepointInfo,
}

/// Writes the savepoint into `storage` (its own root, a local directory
/// or an object-store prefix, which must not hold one already). On
/// failure what was written is removed.
pub fn write(
    storage: &CheckpointStorage,
    header: SavepointHeader,
    snapshots: Vec<TaskSnapshot>,
    carried: BTreeMap<String, Vec<serde_json::Value>>,
) -> Result<CheckpointMetadata, CheckpointError> {
    if storage.exists(super::storage::METADATA_FILE)? {
        return Err(CheckpointError::Incompatible(format!(
            "{} already holds a savepoint; choose another directory",
            storage.root().display()
        )));
    }
    let result = write_inner(storage, header, snapshots, carried);
    if result.is_err() {
        let _ = storage.destroy();
    }
    result
}

fn write_inner(
    storage: &CheckpointStorage,
    header: SavepointHeader,
    snapshots: Vec<TaskSnapshot>,
    mut carried: BTreeMap<String, Vec<serde_json::Value>>,
) -> Result<CheckpointMetadata, CheckpointError> {
    let mut sources: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let mut operators = BTreeMap::new();
    let mut local_dirs = vec![];
    for snapshot in &snapshots {
        for (_, op) in &snapshot.operators {
            if let OperatorSnapshot::RocksDb { dir, .. } = op {
                local_dirs.push(dir.clone());
            }
        }
    }
    let result: Result<(), CheckpointError> = (|| {
        for snapshot in snapshots {
            for (uid, positions) in snapshot.sources {
                sources.entry(uid).or_default().extend(positions);
            }
            for (key, op) in snapshot.operators {
                let state = match op {
                    OperatorSnapshot::Sink(mut committables) => {
                        if let Some(mut extra) = carried.remove(&key) {
                            extra.append(&mut committables);
                            committables = extra;
                        }
                        OperatorState::Sink { committables }
                    }
                    op => write_operator(storage, &key, op)?,
                };
                operators.insert(key, state);
            }
        }
        super::metadata::add_carried(&mut operators, std::mem::take(&mut carried));
        Ok(())
    })();
    for d in local_dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    result?;
    let meta = CheckpointMetadata {
        format: FORMAT_VERSION,
        checkpoint_id: header.id,
        job: header.job,
        plan_fingerprint: header.fingerprint,
        trigger_time_ms: header.trigger_time_ms,
        is_final: false,
        max_parallelism: header.max_parallelism,
        key_format: crate::state::codec::FORMAT_VERSION,
        savepoint: Some(header.info),
        operator_info: header.operator_info,
        sources,
        operators,
    };
    storage.commit_savepoint(&meta)?;
    Ok(meta)
}

/// Writes one operator's part of a savepoint into `storage` (the
/// savepoint's directory) in the canonical form, and says where it is. A
/// worker of a job spread over processes writes its own operators so.
pub(crate) fn write_operator(
    storage: &CheckpointStorage,
    key: &str,
    op: OperatorSnapshot,
) -> Result<OperatorState, CheckpointError> {
    let name = key.replace('/', "-");
    Ok(match op {
        OperatorSnapshot::RocksDb {
            dir: local, key_groups, ..
        } => {
            let mut out = EntriesWriter::new()?;
            for_each_in_rocksdb(&local, key_groups.clone(), &mut |state, g, k, v| {
                out.push(state, g, k, v)
            })?;
            let file = storage.write_file(&format!("state/{name}.arrows"), &out.finish()?)?;
            let _ = std::fs::remove_dir_all(&local);
            OperatorState::Entries { file, key_groups }
        }
        OperatorSnapshot::Entries { bytes, key_groups } => {
            let file = storage.write_file(&format!("state/{name}.arrows"), &bytes)?;
            OperatorState::Entries { file, key_groups }
        }
        OperatorSnapshot::Heap(bytes) => {
            let file = storage.write_file(&format!("state/{name}.bin"), &bytes)?;
            OperatorState::Heap { file }
        }
        OperatorSnapshot::InFlight(_) => {
            return Err(CheckpointError::Internal(
                "a savepoint barrier was not aligned (in-flight data recorded)".into(),
            ));
        }
        OperatorSnapshot::Sink(committables) => OperatorState::Sink { committables },
        OperatorSnapshot::Written(state) => state,
    })
}

/// One row of `SHOW SAVEPOINTS`.
#[derive(Debug, Clone)]
pub struct SavepointListing {
    pub path: PathBuf,
    pub checkpoint_id: u64,
    pub trigger_time_ms: i64,
    pub bytes: u64,
    pub drained: bool,
    pub stopped: bool,
}

/// The savepoints below `root` (one directory each, on the local disk
/// or an object store), oldest first; unreadable ones are skipped.
pub fn list(root: &CheckpointStorage) -> Vec<SavepointListing> {
    let Ok(names) = root.subdirs() else {
        return vec![];
    };
    let mut out = vec![];
    for name in names {
        let dir = root.root().join(&name);
        let Ok(meta) = root.read_metadata(&format!("{name}/{}", super::storage::METADATA_FILE)) else {
            continue;
        };
        let Some(info) = &meta.savepoint else { continue };
        out.push(SavepointListing {
            checkpoint_id: meta.checkpoint_id,
            trigger_time_ms: meta.trigger_time_ms,
            bytes: meta.full_size(),
            drained: info.drained,
            stopped: info.stopped,
            path: dir,
        });
    }
    out.sort_by_key(|s| (s.trigger_time_ms, s.checkpoint_id));
    out
}
