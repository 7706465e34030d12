//! `chk-N/_metadata`: what a completed checkpoint holds. It names every
//! file of the checkpoint with its size and xxHash64 checksum, so a restore
//! detects a missing, truncated or altered file before using it.
//!
//! On disk the JSON body is followed by one line `xxh64:<hex>` over the
//! body: a torn or altered metadata file is detected as well.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::CheckpointError;

/// 2: state matched by operator uid, keyed state per key-group range in
/// Weir's key encoding, savepoints.
pub const FORMAT_VERSION: u32 = 2;

/// A file in checkpoint storage, relative to the job's checkpoint root
/// (`chk-7/...` private, `shared/...` shared between checkpoints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub path: String,
    pub size: u64,
    pub xxh64: String,
}

/// A source split's position: where a restored reader seeks to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitPosition {
    pub split: String,
    pub position: u64,
    pub finished: bool,
    /// Where the split ends when that was fixed as the job first started
    /// (a bounded Kafka partition's stop offset, Flink's split state), so
    /// that a restored job stops where the first attempt would have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
}

/// One operator subtask's state in a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OperatorState {
    /// Keyed state as a RocksDB checkpoint: every file of the instance, by
    /// its local name; it holds the key groups `key_groups`.
    Rocksdb {
        files: BTreeMap<String, FileRef>,
        key_groups: Range<u16>,
        /// The RocksDB instance's identity: a later checkpoint references
        /// these files by name only from the same instance.
        #[serde(default)]
        identity: String,
    },
    /// Keyed state of `key_groups` in canonical form (Arrow IPC entries):
    /// heap checkpoints and savepoints.
    Entries { file: FileRef, key_groups: Range<u16> },
    /// Operator state that is not keyed (a LIMIT's counters).
    Heap { file: FileRef },
    /// A two-phase-commit sink's pre-committed, not yet committed output.
    Sink { committables: Vec<serde_json::Value> },
    /// A task's in-flight input at an unaligned checkpoint.
    InFlight { file: FileRef },
}

/// What a restore checks an operator's state against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorInfo {
    /// The operator as EXPLAIN shows it, for messages.
    pub description: String,
    pub parallelism: usize,
    /// Weir's names of the key types (keyed operators).
    #[serde(default)]
    pub key_types: Vec<String>,
    /// Set by snapshots that record the keys of every keyed kind (older
    /// ones left SESSION windows' and OVER aggregates' empty).
    #[serde(default)]
    pub keys_recorded: bool,
}

/// Set when the snapshot is a savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointInfo {
    /// Every watermark was advanced to the end first (`DRAIN`).
    pub drained: bool,
    /// The job stopped at it.
    pub stopped: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    pub format: u32,
    pub checkpoint_id: u64,
    pub job: String,
    /// Identifies the plan the state belongs to; a different plan cannot
    /// be restored from it.
    pub plan_fingerprint: String,
    pub trigger_time_ms: i64,
    /// Taken when every task had finished (end of input or stop).
    pub is_final: bool,
    /// Number of key groups; a restore needs the same.
    pub max_parallelism: u16,
    /// Version of Weir's key encoding (`state::codec::FORMAT_VERSION`).
    pub key_format: u32,
    #[serde(default)]
    pub savepoint: Option<SavepointInfo>,
    /// Operator uid → what its state belongs to.
    pub operator_info: BTreeMap<String, OperatorInfo>,
    /// Source uid → split positions (by split id).
    pub sources: BTreeMap<String, Vec<SplitPosition>>,
    /// `<operator uid>/<subtask>` → state.
    pub operators: BTreeMap<String, OperatorState>,
}

impl CheckpointMetadata {
    /// Every file the checkpoint references.
    pub fn files(&self) -> impl Iterator<Item = &FileRef> {
        self.operators
            .values()
            .flat_map(|s| -> Box<dyn Iterator<Item = &FileRef>> {
                match s {
                    OperatorState::Rocksdb { files, .. } => Box::new(files.values()),
                    OperatorState::Heap { file }
                    | OperatorState::InFlight { file }
                    | OperatorState::Entries { file, .. } => Box::new(std::iter::once(file)),
                    OperatorState::Sink { .. } => Box::new(std::iter::empty()),
                }
            })
    }

    pub fn committables(&self) -> impl Iterator<Item = &serde_json::Value> {
        self.operators.values().flat_map(|s| match s {
            OperatorState::Sink { committables } => committables.as_slice(),
            _ => &[],
        })
    }

    /// Bytes of in-flight data (unaligned checkpoints) it holds.
    pub fn in_flight_size(&self) -> u64 {
        self.operators
            .values()
            .map(|s| match s {
                OperatorState::InFlight { file } => file.size,
                _ => 0,
            })
            .sum()
    }

    /// Bytes of state the checkpoint references.
    pub fn full_size(&self) -> u64 {
        self.files().map(|f| f.size).sum()
    }

    pub fn encode(&self) -> Result<Vec<u8>, CheckpointError> {
        let mut body = serde_json::to_vec_pretty(self).map_err(|e| CheckpointError::Internal(e.to_string()))?;
        body.push(b'\n');
        let sum = checksum(&body);
        body.extend_from_slice(format!("xxh64:{sum}\n").as_bytes());
        Ok(body)
    }

    /// Parses and verifies metadata read from `path` (for messages).
    pub fn decode(bytes: &[u8], path: &str) -> Result<Self, CheckpointError> {
        let corrupt = |message: String| CheckpointError::Corrupt {
            path: path.to_string(),
            message,
        };
        let text = std::str::from_utf8(bytes).map_err(|_| corrupt("not UTF-8".into()))?;
        let trimmed = text.strip_suffix('\n').unwrap_or(text);
        let (body, trailer) = trimmed
            .rsplit_once('\n')
            .ok_or_else(|| corrupt(format!("truncated ({} bytes, no checksum line)", bytes.len())))?;
        let expected = trailer
            .strip_prefix("xxh64:")
            .ok_or_else(|| corrupt(format!("truncated ({} bytes, no checksum line)", bytes.len())))?;
        let mut body = body.as_bytes().to_vec();
        body.push(b'\n');
        let actual = checksum(&body);
        if actual != expected {
            return Err(corrupt(format!(
                "checksum mismatch: stored {expected}, computed {actual}"
            )));
        }
        // The version first: a newer format may not parse as this one.
        let version = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("format")?.as_u64());
        if let Some(v) = version.filter(|v| *v != u64::from(FORMAT_VERSION)) {
            return Err(CheckpointError::Version {
                path: path.to_string(),
                found: v.to_string(),
                supported: FORMAT_VERSION,
            });
        }
        let meta: Self = serde_json::from_slice(&body).map_err(|e| corrupt(format!("unreadable: {e}")))?;
        if meta.format != FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {} is not supported (this build reads {FORMAT_VERSION})",
                meta.format
            )));
        }
        Ok(meta)
    }
}

/// xxHash64 of `bytes`, as 16 hex digits.
pub fn checksum(bytes: &[u8]) -> String {
    let mut h = twox_hash::XxHash64::with_seed(0);
    h.write(bytes);
    format!("{:016x}", h.finish())
}

/// Adds sink output carried over from aborted checkpoints to `operators`.
pub fn add_carried(operators: &mut BTreeMap<String, OperatorState>, carried: BTreeMap<String, Vec<serde_json::Value>>) {
    for (key, committables) in carried {
        match operators.entry(key) {
            std::collections::btree_map::Entry::Occupied(mut e) => {
                if let OperatorState::Sink { committables: c } = e.get_mut() {
                    c.extend(committables);
                }
            }
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(OperatorState::Sink { committables });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointMetadata {
        let mut files = BTreeMap::new();
        files.insert(
            "000012.sst".into(),
            FileRef {
                path: "shared/n3-s0-c1-000012.sst".into(),
                size: 10,
                xxh64: "00".into(),
            },
        );
        let mut operators = BTreeMap::new();
        operators.insert(
            "window-1/0".into(),
            OperatorState::Rocksdb {
                files,
                key_groups: 0..128,
                identity: "i".into(),
            },
        );
        operators.insert(
            "sink-2/0".into(),
            OperatorState::Sink {
                committables: vec![serde_json::json!({"pending": "a", "target": "b"})],
            },
        );
        CheckpointMetadata {
            format: FORMAT_VERSION,
            checkpoint_id: 1,
            job: "j".into(),
            plan_fingerprint: "f".into(),
            trigger_time_ms: 0,
            is_final: false,
            max_parallelism: 128,
            key_format: 1,
            savepoint: None,
            operator_info: BTreeMap::new(),
            sources: BTreeMap::new(),
            operators,
        }
    }

    #[test]
    fn round_trips_and_detects_truncation_and_flips() {
        let m = sample();
        let bytes = m.encode().expect("encode");
        assert_eq!(CheckpointMetadata::decode(&bytes, "x").expect("decode"), m);
        assert_eq!(m.full_size(), 10);
        assert_eq!(m.committables().count(), 1);
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 3] {
            let err = CheckpointMetadata::decode(&bytes[..cut], "x").expect_err("truncated");
            assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        }
        for i in [2, bytes.len() / 3, bytes.len() - 30] {
            let mut b = bytes.clone();
            b[i] ^= 0x04;
            assert!(CheckpointMetadata::decode(&b, "x").is_err(), "flip at {i} undetected");
        }
    }
}
