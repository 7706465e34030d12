//! Errors of the engine, each saying whose fault it is.

use std::path::PathBuf;

use datafusion::error::DataFusionError;

/// Errors of a state backend: the outside world's (disk, RocksDB) or ours
/// (a value that does not decode).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// `op` says what the backend was doing ("writing state", "flushing
    /// state for checkpoint 7"); RocksDB's message names the file and the
    /// OS error (a full disk: "No space left on device").
    #[error("state backend: {op} in {path}: {message}")]
    RocksDb { op: String, path: PathBuf, message: String },
    #[error("state backend: {op} in {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("internal error: corrupt state value in '{state}': {message}")]
    Corrupt { state: String, message: String },
}

/// Errors raised by connectors. `Config` is the user's fault (bad option),
/// `Data` is a bad record (the file and offset are in `location`), `Io` is
/// the outside world's.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    #[error("connector '{connector}': {message}")]
    Config { connector: String, message: String },
    #[error("{location}: {message}")]
    Data { location: String, message: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// An external system (a Kafka cluster) failed or could not be reached.
    #[error("{system}: {message}")]
    External { system: String, message: String },
    /// A path outside the allowed directories (the user's request).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A source cannot go on with what its system holds now (a Delta
    /// commit that deletes rows under a continuous read): no retry or
    /// restart helps, unlike `External`.
    #[error("{location}: {message}")]
    CannotFollow { location: String, message: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Connector(#[from] ConnectorError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Catalog(#[from] weir_catalog::CatalogError),
    #[error(transparent)]
    CheckpointStorage(#[from] CheckpointError),
    /// Checkpointing failed more often than the job tolerates.
    #[error("{0}")]
    Checkpoint(String),
    #[error("{0}")]
    DataFusion(#[from] DataFusionError),
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// A job option or plan the user gave that cannot run.
    #[error("{0}")]
    Config(String),
    /// A job spread over workers cannot go on: a worker is unreachable,
    /// failed, or runs another plan.
    #[error("{0}")]
    Cluster(String),
    /// The job was cancelled (by the user or because another task failed).
    #[error("job cancelled")]
    Cancelled,
    /// An invariant of ours broke: a bug, never the user's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ExecError {
    pub fn internal(msg: impl Into<String>) -> Self {
        ExecError::Internal(msg.into())
    }
}

pub type Result<T, E = ExecError> = std::result::Result<T, E>;

/// Errors of checkpoint storage and restore: corrupt or missing files are
/// the storage's fault; `LocalState` the local disk's (laying a
/// checkpoint out for the tasks); `Incompatible` is a changed job.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint storage {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Not the checkpoint's fault: a restore does not fall back past it.
    #[error("local state directory {path}: {source}")]
    LocalState { path: PathBuf, source: std::io::Error },
    #[error("checkpoint file {path} is missing")]
    Missing { path: PathBuf },
    #[error("checkpoint file {path} is corrupt: {message}")]
    Corrupt { path: String, message: String },
    #[error("checkpoint cannot be restored into this job: {0}")]
    Incompatible(String),
    /// Written by another version of Weir.
    #[error("{path} has format version {found}; this build of Weir reads version {supported}")]
    Version {
        path: String,
        found: String,
        supported: u32,
    },
    #[error("internal error in checkpointing: {0}")]
    Internal(String),
    #[error(transparent)]
    State(#[from] StateError),
    /// The checkpoint's time ran out while its files were being written
    /// (the storage slow or unreachable).
    #[error("{0}")]
    Expired(String),
    /// Another run of the job took over its checkpoints (see
    /// [`crate::checkpoint::fence`]): this one must stop writing.
    #[error(
        "the checkpoints in {root} were taken over by generation {by} ({owner}): this run \
         (generation {generation}) stops without publishing a checkpoint or committing its sinks \
         (log record {seq} is not its own)"
    )]
    Fenced {
        root: String,
        generation: u64,
        by: u64,
        owner: String,
        seq: u64,
    },
}
