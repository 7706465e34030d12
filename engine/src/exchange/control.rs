//! The control plane of a job spread over workers: what worker 0 (the
//! job's coordinator) and the other workers tell each other, as JSON in
//! control frames on the link between them.
//!
//! Worker 0 starts each attempt (which checkpoint every worker restores,
//! the splits each source subtask reads, the attempt's tag), triggers
//! checkpoints, and ends the job. The others send it their tasks'
//! checkpoint acknowledgements — with their state already written to the
//! checkpoint storage, so only where it is travels — and say when their
//! tasks are done or failed.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{OperatorSnapshot, OperatorState, SplitPosition, TaskReport, TaskSnapshot};
use crate::message::{Barrier, BarrierKind};

/// One control-plane message.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Control {
    /// Worker 0 → the others: the attempt starts.
    Start {
        /// Tags the files the attempt's sinks write (one for the job, so
        /// the coordinator's recovery knows them all).
        attempt: String,
        /// The checkpoint or savepoint every worker restores (`chk-<n>`
        /// or a savepoint directory), if any.
        restore: Option<String>,
        /// Per chain, per subtask: the splits it reads (listed once, by
        /// worker 0, so every worker deals the same).
        splits: Vec<Vec<Vec<SplitPosition>>>,
        /// Where worker 0 keeps the checkpoints: every worker must write
        /// its state there too.
        checkpoints: Option<String>,
    },
    /// Worker 0 → the others: inject this barrier at the sources.
    Trigger {
        barrier: WireBarrier,
        /// Where a savepoint's state goes (its directory).
        savepoint_dir: Option<String>,
    },
    /// Worker 0 → the others: this checkpoint completed; its files are
    /// the base the next incremental checkpoint shares from.
    Completed { checkpoint_id: u64 },
    /// Worker 0 → the others: stop reading (a stop with savepoint
    /// completed, or the job was asked to stop).
    Stop,
    /// Worker 0 → a worker: splits a source's enumerator found for
    /// readers of source node `node` on that worker (reader subtask,
    /// where the split starts).
    Splits {
        node: usize,
        splits: Vec<(usize, SplitPosition)>,
    },
    /// A worker → worker 0: its readers' last watermarks in an alignment
    /// group (reader = source node, subtask).
    Alignment {
        group: String,
        reports: Vec<((usize, usize), i64)>,
    },
    /// Worker 0 → the others: an alignment group's minimum over every
    /// worker's readers.
    GroupMin { group: String, min: i64 },
    /// A worker → worker 0: one task's report.
    Report(WireReport),
    /// A worker → worker 0: every task of the sender ended well.
    TasksDone,
    /// A worker → worker 0: suspend the job (the sender was signalled:
    /// its pod is being deleted). Worker 0 takes a checkpoint and ends
    /// every worker; restarted, they resume from it.
    Suspend,
    /// A worker → worker 0: a task of the sender failed.
    Failed { reason: String },
    /// Worker 0 → the others: the job ended (`ok`: finished or stopped),
    /// or the attempt failed and every worker must go.
    JobDone { ok: bool, reason: String },
}

impl Control {
    pub fn encode(&self) -> Vec<u8> {
        // Plain data (strings, numbers, JSON values): always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Control, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("a control message that does not decode: {e}"))
    }
}

/// A barrier on the control plane.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct WireBarrier {
    pub checkpoint_id: u64,
    pub timestamp: i64,
    /// `Some((stop, drain))` for a savepoint.
    pub savepoint: Option<(bool, bool)>,
}

impl From<Barrier> for WireBarrier {
    fn from(b: Barrier) -> Self {
        WireBarrier {
            checkpoint_id: b.checkpoint_id,
            timestamp: b.timestamp,
            savepoint: match b.kind {
                BarrierKind::Checkpoint => None,
                BarrierKind::Savepoint { stop, drain } => Some((stop, drain)),
            },
        }
    }
}

impl From<WireBarrier> for Barrier {
    fn from(b: WireBarrier) -> Self {
        Barrier {
            checkpoint_id: b.checkpoint_id,
            timestamp: b.timestamp,
            kind: match b.savepoint {
                None => BarrierKind::Checkpoint,
                Some((stop, drain)) => BarrierKind::Savepoint { stop, drain },
            },
        }
    }
}

/// A task's report with its state already written (see
/// [`crate::checkpoint::OperatorSnapshot::Written`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireReport {
    Ack {
        checkpoint_id: u64,
        task: usize,
        snapshot: WireSnapshot,
        alignment_us: u64,
        sync_us: u64,
    },
    Finished {
        task: usize,
        snapshot: WireSnapshot,
    },
    Decline {
        checkpoint_id: u64,
        task: usize,
        reason: String,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireSnapshot {
    pub sources: Vec<(String, Vec<SplitPosition>)>,
    pub operators: Vec<(String, OperatorState)>,
}

impl WireSnapshot {
    fn into_task_snapshot(self) -> TaskSnapshot {
        TaskSnapshot {
            sources: self.sources,
            operators: self
                .operators
                .into_iter()
                .map(|(k, s)| {
                    let op = match s {
                        // Kept apart: output of aborted checkpoints is
                        // carried to the next by the coordinator.
                        OperatorState::Sink { committables } => OperatorSnapshot::Sink(committables),
                        other => OperatorSnapshot::Written(other),
                    };
                    (k, op)
                })
                .collect(),
        }
    }
}

impl WireReport {
    /// The report as the coordinator takes it from a local task.
    /// The task the report is of.
    pub fn task(&self) -> usize {
        match self {
            WireReport::Ack { task, .. } | WireReport::Finished { task, .. } | WireReport::Decline { task, .. } => {
                *task
            }
        }
    }

    pub fn into_task_report(self) -> TaskReport {
        match self {
            WireReport::Ack {
                checkpoint_id,
                task,
                snapshot,
                alignment_us,
                sync_us,
            } => TaskReport::Ack {
                checkpoint_id,
                task,
                snapshot: snapshot.into_task_snapshot(),
                alignment: Duration::from_micros(alignment_us),
                sync: Duration::from_micros(sync_us),
            },
            WireReport::Finished { task, snapshot } => TaskReport::Finished {
                task,
                snapshot: snapshot.into_task_snapshot(),
            },
            WireReport::Decline {
                checkpoint_id,
                task,
                reason,
            } => TaskReport::Decline {
                checkpoint_id,
                task,
                reason,
            },
        }
    }
}

/// The operators of a checkpoint one worker wrote, by key: the base of
/// its next incremental checkpoint once that checkpoint completed.
pub type Written = BTreeMap<String, OperatorState>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_survives_the_wire_with_its_state_written_and_its_sink_output_apart() {
        let report = Control::Report(WireReport::Ack {
            checkpoint_id: 7,
            task: 3,
            snapshot: WireSnapshot {
                sources: vec![(
                    "source-bid".into(),
                    vec![SplitPosition {
                        split: "f.csv".into(),
                        position: 10,
                        finished: false,
                        end: None,
                    }],
                )],
                operators: vec![
                    (
                        "sink/1".into(),
                        OperatorState::Sink {
                            committables: vec![serde_json::json!({"file": "a"})],
                        },
                    ),
                    (
                        "group/1".into(),
                        OperatorState::Heap {
                            file: crate::checkpoint::metadata::FileRef {
                                path: "chk-7/x".into(),
                                size: 3,
                                xxh64: "00".into(),
                            },
                        },
                    ),
                ],
            },
            alignment_us: 5,
            sync_us: 6,
        });
        let back = Control::decode(&report.encode()).expect("decodes");
        let Control::Report(r) = back else { panic!("{back:?}") };
        let TaskReport::Ack {
            checkpoint_id,
            task,
            snapshot,
            alignment,
            ..
        } = r.into_task_report()
        else {
            panic!("not an ack")
        };
        assert_eq!((checkpoint_id, task, alignment), (7, 3, Duration::from_micros(5)));
        assert_eq!(snapshot.sources[0].1[0].position, 10);
        assert!(matches!(&snapshot.operators[0].1, OperatorSnapshot::Sink(c) if c.len() == 1));
        assert!(matches!(
            &snapshot.operators[1].1,
            OperatorSnapshot::Written(OperatorState::Heap { .. })
        ));
        assert!(Control::decode(b"{\"type\":\"nope\"}").is_err());
    }
}
