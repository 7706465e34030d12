//! Choosing and laying out the checkpoint a job restarts from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::CheckpointError;
use super::metadata::{CheckpointMetadata, OperatorState};
use super::storage::CheckpointStorage;

/// A verified checkpoint, with its state files copied where the tasks
/// open them.
#[derive(Debug)]
pub struct RestoredJob {
    pub metadata: CheckpointMetadata,
    pub path: PathBuf,
    /// Operator key → serialised heap state.
    pub heap: HashMap<String, Vec<u8>>,
    /// In-flight key → the batches to replay before new input.
    pub in_flight: HashMap<String, Vec<arrow::record_batch::RecordBatch>>,
    /// Checkpoints newer than this one that could not be used, and why.
    pub skipped: Vec<String>,
}

impl RestoredJob {
    pub fn checkpoint_id(&self) -> u64 {
        self.metadata.checkpoint_id
    }
}

/// Where operator subtask state lives locally (RocksDB directory).
pub fn local_state_dir(job_dir: &Path, node: usize, subtask: usize) -> PathBuf {
    job_dir.join("state").join(format!("node-{node}-subtask-{subtask}"))
}

/// Verifies checkpoint `id` and copies its state into `job_dir/state`.
pub fn restore_one(
    storage: &CheckpointStorage,
    id: u64,
    fingerprint: &str,
    job_dir: &Path,
) -> Result<RestoredJob, CheckpointError> {
    let metadata = storage.load(id)?;
    if metadata.plan_fingerprint != fingerprint {
        return Err(CheckpointError::Incompatible(format!(
            "checkpoint {id} in {} was taken by a different plan (query, parallelism or options changed); \
             rescaling and plan changes need a savepoint, which this version does not support yet. \
             To start this job afresh instead, remove {}",
            storage.root().display(),
            storage.root().display()
        )));
    }
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
    let mut heap = HashMap::new();
    let mut in_flight = HashMap::new();
    for (key, state) in &metadata.operators {
        let (node, subtask) = parse_key(key)?;
        match state {
            OperatorState::Rocksdb { files } => {
                let dir = local_state_dir(job_dir, node, subtask);
                std::fs::create_dir_all(&dir).map_err(|source| CheckpointError::LocalState {
                    path: dir.clone(),
                    source,
                })?;
                for (name, f) in files {
                    storage.restore_file(f, &dir.join(name))?;
                }
            }
            OperatorState::Heap { file } => {
                heap.insert(key.clone(), storage.read_file(file)?);
            }
            OperatorState::InFlight { file } => {
                let bytes = storage.read_file(file)?;
                let path = storage.root().join(&file.path).display().to_string();
                in_flight.insert(key.clone(), super::decode_batches(&bytes, &path)?);
            }
            OperatorState::Sink { .. } => {}
        }
    }
    // A crash here, with state half laid out, must leave the next restore
    // as good as this one (it starts by wiping the state directory).
    crate::failpoint::failpoint("restore.state_laid_out");
    Ok(RestoredJob {
        path: storage.chk_dir(id),
        metadata,
        heap,
        in_flight,
        skipped: vec![],
    })
}

fn parse_key(key: &str) -> Result<(usize, usize), CheckpointError> {
    let mut parts = key.split('/');
    parts
        .next()
        .zip(parts.next())
        .and_then(|(n, s)| Some((n.parse().ok()?, s.parse().ok()?)))
        .ok_or_else(|| CheckpointError::Internal(format!("bad operator key '{key}'")))
}

/// The newest complete checkpoint that verifies, falling back past ones
/// that do not (each reason kept in `skipped`). `None` when there is no
/// complete checkpoint at all; an error when every one is unusable.
pub fn restore_latest(
    storage: &CheckpointStorage,
    fingerprint: &str,
    job_dir: &Path,
) -> Result<Option<RestoredJob>, CheckpointError> {
    let ids = storage.complete_ids()?;
    let mut skipped = vec![];
    let mut last_error = None;
    for id in ids.iter().rev() {
        match restore_one(storage, *id, fingerprint, job_dir) {
            Ok(mut r) => {
                r.skipped = skipped;
                return Ok(Some(r));
            }
            // A changed plan is the user's doing: say so, do not fall back
            // to an older checkpoint of the same old plan. A local disk
            // that cannot take the state (full) is no fault of this
            // checkpoint: falling back to an older one would produce
            // again output the newer one committed.
            Err(e @ (CheckpointError::Incompatible(_) | CheckpointError::LocalState { .. })) => {
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
