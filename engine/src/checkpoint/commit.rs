//! The commit side of a two-phase-commit sink, which the checkpoint
//! coordinator drives: a leaf both the coordinator and the sinks use.

use crate::error::Result;

/// What one sink's commit of a checkpoint made in its own system.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkCommit {
    /// The sink's table.
    pub sink: String,
    /// The version the commit made (a Delta table's); `None`: it made
    /// none (a replay its system already records).
    pub version: Option<u64>,
    /// How long the commit took: how much later than the checkpoint the
    /// rows became visible.
    pub duration: std::time::Duration,
    /// Files the commit added.
    pub files: usize,
}

impl SinkCommit {
    /// `lake: Delta version 12 in 41 ms (3 files)`.
    pub fn describe(&self) -> String {
        match self.version {
            Some(v) => format!(
                "{}: Delta version {v} in {} ms ({} files)",
                self.sink,
                self.duration.as_millis(),
                self.files
            ),
            None => format!("{}: committed before (replay skipped)", self.sink),
        }
    }
}

/// The second phase of a two-phase-commit sink (Flink's `Committer`).
///
/// The writer pre-commits at each barrier: its output is durable but not
/// visible, and described by committables stored in the checkpoint. When
/// the checkpoint is complete, `commit` makes them visible. `commit` must
/// be idempotent: after a crash, every committable of the restored
/// checkpoint is committed again. `recover` then discards whatever the
/// failed attempt wrote that no checkpoint holds.
pub trait Committer: Send + Sync {
    /// What the last [`Committer::commit`] made in the sink's own system,
    /// taken once (SHOW CHECKPOINTS, the metrics): a Delta table's version
    /// and how long the commit took. `None`: nothing to say.
    fn take_report(&self) -> Option<SinkCommit> {
        None
    }

    /// Checkpoint `checkpoint_id` completed (or was restored): its
    /// committables, and any carried from checkpoints that did not
    /// complete, become visible. A sink that records what it committed
    /// (a Delta table's `txn` version) records `checkpoint_id`.
    fn commit(&self, checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()>;

    /// The newest checkpoint id the sink's own system records as
    /// committed by this job (a Delta table's `txn` version), if any:
    /// the job's checkpoint ids continue above it, so a run whose
    /// checkpoint directory was emptied, or that restored an older
    /// savepoint, never has its commits taken for replays.
    fn committed_through(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Deletes in-progress and pending output not in a completed checkpoint.
    fn recover(&self) -> Result<()>;

    /// Deletes the in-progress and pending output of attempt `attempt`
    /// (its [`crate::connectors::SinkContext::attempt`]), which will never
    /// commit: another run of the job took over its checkpoints. Only that
    /// attempt's files: the other run's are left alone.
    fn abandon(&self, _attempt: &str) -> Result<()> {
        Ok(())
    }

    /// A job spread over workers: worker 0 committed these committables,
    /// which this process's writers pre-committed; what this process
    /// still holds for them (a Kafka producer keeping its transactional
    /// id busy) is let go. Never commits or aborts anything.
    fn release(&self, _committables: &[serde_json::Value]) -> Result<()> {
        Ok(())
    }

    /// The job ended without checkpointing (its writers committed their
    /// output at end of input): commits what waits for the end (a
    /// partitioned file sink's partitions).
    fn finish(&self) -> Result<()> {
        Ok(())
    }
}
