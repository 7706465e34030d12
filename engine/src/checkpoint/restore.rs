//! Choosing and laying out the checkpoint a job restarts from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::CheckpointError;
use super::metadata::{CheckpointMetadata, OperatorState};
use super::storage::CheckpointStorage;
use crate::state::StateSource;

/// A verified checkpoint or savepoint, with its state files copied where
/// the tasks read them. Nothing in it depends on the parallelism the
/// snapshot was taken at: state is per operator uid and key-group range.
#[derive(Debug)]
pub struct RestoredJob {
    pub metadata: CheckpointMetadata,
    /// The `chk-N` or savepoint directory.
    pub path: PathBuf,
    /// Operator uid → its keyed state, one source per subtask of the run
    /// that took the snapshot.
    pub keyed: HashMap<String, Vec<StateSource>>,
    /// `<uid>/<subtask>` → operator state that is not keyed.
    pub operator_state: HashMap<String, Vec<u8>>,
    /// In-flight key → the batches to replay before new input.
    pub in_flight: HashMap<String, Vec<crate::change::ChangeBatch>>,
    /// Checkpoints newer than this one that could not be used, and why.
    pub skipped: Vec<String>,
    /// Bytes of state files read or laid out (all of the snapshot's, or
    /// a worker's share of it).
    pub laid_out: u64,
}

impl RestoredJob {
    pub fn checkpoint_id(&self) -> u64 {
        self.metadata.checkpoint_id
    }

    pub fn is_savepoint(&self) -> bool {
        self.metadata.savepoint.is_some()
    }

    /// The keyed state of operator `uid` (none: it starts empty).
    pub fn keyed_state(&self, uid: &str) -> &[StateSource] {
        self.keyed.get(uid).map_or(&[], Vec::as_slice)
    }
}

/// Where operator subtask state lives locally (RocksDB directory), per
/// attempt: an attempt that was aborted may still hold its instance open
/// for a moment (RocksDB locks by path within a process), and the next one
/// must not wait for it.
pub fn local_state_dir(job_dir: &Path, uid: &str, subtask: usize, attempt: &str) -> PathBuf {
    job_dir.join("state").join(format!("{uid}-{subtask}-{attempt}"))
}

/// Checks a snapshot's metadata against the job about to restore it.
pub type Compatibility<'a> = &'a dyn Fn(&CheckpointMetadata) -> Result<(), CheckpointError>;

/// Verifies checkpoint `id` and copies its state into `job_dir/state`.
pub fn restore_one(
    storage: &CheckpointStorage,
    id: u64,
    check: Compatibility,
    job_dir: &Path,
    wanted: Wanted,
) -> Result<RestoredJob, CheckpointError> {
    restore_dir_for(storage, &storage.chk_dir(id), check, job_dir, wanted)
}

/// Verifies the snapshot whose `_metadata` is in `dir` (file paths are
/// relative to `storage`'s root) and lays its state out in `job_dir`.
pub fn restore_dir(
    storage: &CheckpointStorage,
    dir: &Path,
    check: Compatibility,
    job_dir: &Path,
) -> Result<RestoredJob, CheckpointError> {
    restore_dir_for(storage, dir, check, job_dir, &|_, _| true)
}

/// Which keyed state a process lays out: operator uid and key groups of a
/// snapshot's part. A worker of a job spread over processes takes only
/// the parts whose key groups its own subtasks own (with N workers, a
/// restore downloads about 1/N of the state, not all of it).
pub type Wanted<'a> = &'a dyn Fn(&str, &std::ops::Range<u16>) -> bool;

/// [`restore_dir`] laying out only the keyed state `wanted` says.
pub fn restore_dir_for(
    storage: &CheckpointStorage,
    dir: &Path,
    check: Compatibility,
    job_dir: &Path,
    wanted: Wanted,
) -> Result<RestoredJob, CheckpointError> {
    let metadata = storage.load_dir(dir)?;
    check(&metadata)?;
    let state_root = job_dir.join("state");
    match std::fs::remove_dir_all(&state_root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CheckpointError::LocalState {
                path: state_root,
                source,
            });
        }
    }
    let mut keyed: HashMap<String, Vec<StateSource>> = HashMap::new();
    let mut operator_state = HashMap::new();
    let mut in_flight = HashMap::new();
    let mut laid_out = 0u64;
    for (key, state) in &metadata.operators {
        let (uid, subtask) = super::parse_operator_key(key)?;
        match state {
            OperatorState::Rocksdb { key_groups, .. } | OperatorState::Entries { key_groups, .. }
                if !wanted(uid, key_groups) => {}
            OperatorState::Rocksdb { files, key_groups, .. } => {
                let local = state_root.join("restored").join(format!("{uid}-{subtask}"));
                std::fs::create_dir_all(&local).map_err(|source| CheckpointError::LocalState {
                    path: local.clone(),
                    source,
                })?;
                for (name, f) in files {
                    storage.restore_file(f, &local.join(name))?;
                    laid_out += f.size;
                }
                keyed.entry(uid.to_string()).or_default().push(StateSource::RocksDb {
                    dir: local,
                    key_groups: key_groups.clone(),
                });
            }
            OperatorState::Entries { file, key_groups } => {
                let bytes = storage.read_file(file)?;
                laid_out += file.size;
                keyed.entry(uid.to_string()).or_default().push(StateSource::Entries {
                    bytes: Arc::new(bytes),
                    key_groups: key_groups.clone(),
                    path: storage.locate(&file.path).display().to_string(),
                });
            }
            OperatorState::Heap { file } => {
                operator_state.insert(key.clone(), storage.read_file(file)?);
            }
            OperatorState::InFlight { file } => {
                let bytes = storage.read_file(file)?;
                let path = storage.locate(&file.path).display().to_string();
                in_flight.insert(key.clone(), super::decode_batches(&bytes, &path)?);
            }
            OperatorState::Sink { .. } => {}
        }
    }
    // A crash here, with state half laid out, must leave the next restore
    // as good as this one (it starts by wiping the state directory).
    crate::failpoint::failpoint("restore.state_laid_out");
    Ok(RestoredJob {
        path: dir.to_path_buf(),
        metadata,
        keyed,
        operator_state,
        in_flight,
        skipped: vec![],
        laid_out,
    })
}

/// The newest complete checkpoint that verifies, falling back past ones
/// that do not (each reason kept in `skipped`). `None` when there is no
/// complete checkpoint at all; an error when every one is unusable.
pub fn restore_latest(
    storage: &CheckpointStorage,
    check: Compatibility,
    job_dir: &Path,
) -> Result<Option<RestoredJob>, CheckpointError> {
    restore_latest_from(storage, check, job_dir, 0, &|_, _| true)
}

/// [`restore_latest`] among checkpoints numbered `floor` or above: those
/// of the runs since the job last started from a savepoint (older ones
/// are of the job before that savepoint, and restoring one would undo it).
pub fn restore_latest_from(
    storage: &CheckpointStorage,
    check: Compatibility,
    job_dir: &Path,
    floor: u64,
    wanted: Wanted,
) -> Result<Option<RestoredJob>, CheckpointError> {
    let ids: Vec<u64> = storage.complete_ids()?.into_iter().filter(|id| *id >= floor).collect();
    let mut skipped = vec![];
    let mut last_error = None;
    for id in ids.iter().rev() {
        match restore_one(storage, *id, check, job_dir, wanted) {
            Ok(mut r) => {
                r.skipped = skipped;
                return Ok(Some(r));
            }
            // A changed plan is the user's doing: say so, do not fall back
            // to an older checkpoint of the same old plan. A local disk
            // that cannot take the state (full) is no fault of this
            // checkpoint: falling back to an older one would produce
            // again output the newer one committed.
            Err(
                e @ (CheckpointError::Incompatible(_)
                | CheckpointError::LocalState { .. }
                | CheckpointError::Version { .. }),
            ) => {
                return Err(e);
            }
            Err(e) => {
                tracing::warn!("checkpoint {id} cannot be restored: {e}");
                skipped.push(format!("checkpoint {id}: {e}"));
                last_error = Some(e);
            }
        }
    }
    match last_error {
        None => Ok(None),
        Some(e) => Err(CheckpointError::Corrupt {
            path: storage.root().display().to_string(),
            message: format!(
                "no complete checkpoint can be restored ({}); last error: {e}",
                skipped.join("; ")
            ),
        }),
    }
}
