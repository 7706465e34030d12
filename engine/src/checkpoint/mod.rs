//! Checkpoints: consistent snapshots of a running job taken by barriers
//! that flow through the plan (Chandy-Lamport, as in Flink).
//!
//! - The [`coordinator`] triggers checkpoint N by announcing a barrier to
//!   every source reader. A reader records its split positions, snapshots
//!   its chain, and sends the barrier downstream in-band.
//! - An operator task's input gate aligns barrier N over its channels
//!   (exactly-once) or counts it (at-least-once); then the task forwards
//!   it, snapshots its chain synchronously (RocksDB: flush + native
//!   checkpoint of hard links; heap: serialised copy; 2PC sinks:
//!   pre-commit) and acknowledges with the snapshot.
//! - With every acknowledgement in, the coordinator materialises the
//!   checkpoint on the blocking pool: uploads (only new SSTs with
//!   incremental checkpoints), writes `_metadata` atomically, commits the
//!   sinks' pre-committed output, and deletes what no retained checkpoint
//!   references. Processing never waits for this.
//! - A write that fails (a full or failing disk: ENOSPC, EIO) fails that
//!   checkpoint with the path and OS error as its reason: what it wrote is
//!   removed (its `_metadata` first), its sink output waits for the next
//!   checkpoint, and it counts against `tolerable-failed-checkpoints`.
//! - Restore: [`restore`] picks the newest checkpoint that verifies,
//!   falling back past corrupt ones, and lays its files out for the tasks.

pub mod commit;
pub mod compat;
pub mod coordinator;
pub mod fence;
pub mod metadata;
pub mod objects;
pub mod records;
pub mod restore;
pub mod s3_uploads;
pub mod savepoint;
pub mod storage;
pub mod store;

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

pub use coordinator::{CheckpointCoordinator, CheckpointStats, CheckpointStatus};
pub use fence::Fence;
pub use metadata::{CheckpointMetadata, OperatorState, SplitPosition};
pub use restore::{RestoredJob, restore_latest, restore_latest_from};
pub use storage::CheckpointStorage;

use crate::keygroup::KeyGroup;

pub use crate::error::CheckpointError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointMode {
    ExactlyOnce,
    AtLeastOnce,
}

/// `execution.checkpointing.*` of one job.
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub min_pause: Duration,
    pub tolerable_failed: u32,
    pub num_retained: usize,
    /// `<execution.checkpointing.dir>/<job>` (a URL when on an object
    /// store).
    pub root: PathBuf,
    /// The object store `root` is on (`None`: a local directory).
    pub store: Option<std::sync::Arc<dyn store::CheckpointStore>>,
    /// How to reach S3 for savepoint URLs (`s3.*`).
    pub s3: objects::S3Settings,
    pub mode: CheckpointMode,
    pub incremental: bool,
    /// Unaligned checkpoints (exactly-once only).
    pub unaligned: bool,
    /// With `unaligned`: align first, go unaligned after this (0: never align).
    pub aligned_timeout: Duration,
}

impl CheckpointConfig {
    /// The job's checkpoint storage, on the local disk or the object store.
    pub fn storage(&self) -> CheckpointStorage {
        match &self.store {
            Some(store) => CheckpointStorage::on(store.clone(), self.root.clone()),
            None => CheckpointStorage::new(self.root.clone()),
        }
    }
}

/// What an operator's synchronous snapshot produced.
#[derive(Debug)]
pub enum OperatorSnapshot {
    /// A RocksDB native checkpoint (hard links) in a local directory of
    /// keyed state; the coordinator uploads from it and then deletes it.
    RocksDb {
        dir: PathBuf,
        key_groups: Range<KeyGroup>,
        /// RocksDB's identity of the instance: SST files of the same name
        /// are the same file only within one instance.
        identity: String,
    },
    /// Keyed state in canonical form (Arrow IPC entries, see
    /// [`crate::state::transfer`]): the heap backend's snapshot.
    Entries {
        bytes: Vec<u8>,
        key_groups: Range<KeyGroup>,
    },
    /// Operator state that is not keyed (a LIMIT's counters).
    Heap(Vec<u8>),
    /// Pre-committed, invisible output of a two-phase-commit sink.
    Sink(Vec<serde_json::Value>),
    /// Data in flight at an unaligned checkpoint (Arrow IPC stream),
    /// replayed before new input on restore.
    InFlight(Vec<u8>),
    /// Already written to the checkpoint storage by the worker process
    /// that ran the operator (a job spread over workers): where it is.
    Written(OperatorState),
}

/// Key of a task's in-flight data (unaligned checkpoints) in the metadata.
pub fn in_flight_key(uid: &str, subtask: usize) -> String {
    format!("{uid}/{subtask}/in-flight")
}

/// Key of the in-flight data of input `input` of a task whose input 0 is
/// under `key` (see [`in_flight_key`]).
pub fn in_flight_input_key(key: &str, input: usize) -> String {
    if input == 0 {
        key.to_string()
    } else {
        format!("{key}-{input}")
    }
}

/// Encodes recorded in-flight batches as an Arrow IPC stream.
pub fn encode_batches(batches: &[crate::change::ChangeBatch]) -> Result<Vec<u8>, CheckpointError> {
    if batches.is_empty() {
        return Ok(vec![]);
    }
    let err = |e: arrow::error::ArrowError| CheckpointError::Internal(format!("encoding in-flight data: {e}"));
    // Row kinds ride as a last column, so changes replay as changes.
    let encoded = batches
        .iter()
        .map(|b| b.encode())
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let mut w = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &encoded[0].schema()).map_err(err)?;
    for b in &encoded {
        w.write(b).map_err(err)?;
    }
    w.into_inner().map_err(err)
}

/// Decodes [`encode_batches`] output; `path` names the file in errors.
pub fn decode_batches(bytes: &[u8], path: &str) -> Result<Vec<crate::change::ChangeBatch>, CheckpointError> {
    if bytes.is_empty() {
        return Ok(vec![]);
    }
    let corrupt = |e: arrow::error::ArrowError| CheckpointError::Corrupt {
        path: path.to_string(),
        message: format!("in-flight data unreadable: {e}"),
    };
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(corrupt)?;
    reader
        .map(|b| b.and_then(crate::change::ChangeBatch::decode).map_err(corrupt))
        .collect()
}

/// Key of an operator subtask's state in the metadata.
pub fn operator_key(uid: &str, subtask: usize) -> String {
    format!("{uid}/{subtask}")
}

/// The operator uid and subtask of a metadata key.
pub fn parse_operator_key(key: &str) -> Result<(&str, usize), CheckpointError> {
    let mut parts = key.split('/');
    parts
        .next()
        .zip(parts.next())
        .and_then(|(u, s)| Some((u, s.parse().ok()?)))
        .ok_or_else(|| CheckpointError::Internal(format!("bad operator key '{key}'")))
}

/// One task's part of a checkpoint.
#[derive(Debug, Default)]
pub struct TaskSnapshot {
    /// Source uid → positions of the splits this task read.
    pub sources: Vec<(String, Vec<SplitPosition>)>,
    pub operators: Vec<(String, OperatorSnapshot)>,
}

/// From a task to the coordinator.
#[derive(Debug)]
pub enum TaskReport {
    Ack {
        checkpoint_id: u64,
        task: usize,
        snapshot: TaskSnapshot,
        alignment: Duration,
        sync: Duration,
    },
    /// The task ended (end of input or stop). Its snapshot holds final
    /// split positions and sink output only: a finished operator has
    /// nothing left to produce, so a restore starts it empty.
    Finished { task: usize, snapshot: TaskSnapshot },
    Decline {
        checkpoint_id: u64,
        task: usize,
        reason: String,
    },
}

/// A task's connection to its job's coordinator.
#[derive(Clone)]
pub struct TaskCheckpointing {
    pub task: usize,
    pub reports: tokio::sync::mpsc::UnboundedSender<TaskReport>,
    pub mode: CheckpointMode,
}

impl TaskCheckpointing {
    pub fn report(&self, report: TaskReport) {
        // The coordinator is gone only when the job is ending.
        let _ = self.reports.send(report);
    }
}
