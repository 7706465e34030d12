//! The records of the fence's log (see [`super::fence`]) and their keys:
//! what the storage lists and reads, and the fence writes.

use serde::{Deserialize, Serialize};

use super::CheckpointError;

/// The log's directory below the job's checkpoint root.
pub const LOG_DIR: &str = "log";

/// One record of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A run took over the job's checkpoints.
    Generation {
        generation: u64,
        /// Who claimed it (host and process), for messages.
        owner: String,
        time_ms: i64,
        /// The savepoint or checkpoint the run was told to start from
        /// (`execution.state-recovery.path`), if any: a worker restarted
        /// with the same arguments then resumes from the checkpoints taken
        /// since, not from that path again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
    },
    /// Checkpoint `checkpoint` is complete: restorable, its sinks
    /// committable.
    Checkpoint { generation: u64, checkpoint: u64 },
    /// A savepoint was written to `path`: its sinks' output committable.
    /// (Savepoints are restored by path, never from the log.)
    Savepoint {
        generation: u64,
        checkpoint: u64,
        path: String,
    },
    /// The run ended (stopped, cancelled, finished, suspended, failed for
    /// good); it writes nothing more. `status` is how (the next run starts
    /// afresh after an end on purpose, else resumes); `next_id` is above
    /// every checkpoint id the run or its predecessors used, so ids stay
    /// unique after its checkpoints are cleared.
    End {
        generation: u64,
        #[serde(default)]
        status: String,
        #[serde(default)]
        next_id: u64,
    },
}

impl Record {
    pub fn generation(&self) -> u64 {
        match self {
            Record::Generation { generation, .. }
            | Record::Checkpoint { generation, .. }
            | Record::Savepoint { generation, .. }
            | Record::End { generation, .. } => *generation,
        }
    }

    pub(super) fn encode(&self) -> Result<Vec<u8>, CheckpointError> {
        serde_json::to_vec(self).map_err(|e| CheckpointError::Internal(format!("encoding a log record: {e}")))
    }
}

/// The key of the log record at `seq`.
pub fn record_key(seq: u64) -> String {
    format!("{LOG_DIR}/{seq:020}.json")
}

/// The sequence number a log entry's name holds (`None`: not a record,
/// such as a local store's half-written temporary file).
pub fn parse_record_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}
