//! A sink subtask's writer, by how its output becomes visible.
//!
//! A two-phase-commit writer is a [`CommittingWriter`]: its pre-commit is
//! a required method, not an operator default that returns nothing, so a
//! new exactly-once sink cannot forget it (Flink's `SinkWriter` and
//! `CommittingSinkWriter`). [`writer_operator`] makes the operator the
//! runtime chains, and refuses a sink whose committer and writer disagree.

use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::connectors::{SinkContext, SinkFactory};
use crate::error::{ExecError, Result};
use crate::message::Timestamp;
use crate::operators::{Collector, Operator};

/// What [`SinkFactory::create_writer`] makes.
pub enum SinkWriter {
    /// Output is visible as it is written (print, blackhole, Kafka
    /// at-least-once). Its `snapshot_state` may flush at a barrier; it has
    /// nothing to commit.
    Direct(Box<dyn Operator>),
    /// Output becomes visible when the factory's committer commits what
    /// the writer pre-committed at a checkpoint's barrier.
    Committing(Box<dyn CommittingWriter>),
}

/// The writer of a two-phase-commit sink. Its operator methods take rows;
/// its own `snapshot_state`/`final_snapshot` are never called: the
/// runtime calls the pre-commits instead.
pub trait CommittingWriter: Operator {
    /// Checkpoint barrier `checkpoint_id`: everything written before it is
    /// made durable but invisible; returns what describes it (stored in
    /// the checkpoint, committed when the checkpoint completes).
    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<Vec<serde_json::Value>>;

    /// After end of input, with checkpointing: the last output's
    /// committables (the final checkpoint commits them).
    fn final_pre_commit(&mut self) -> Result<Vec<serde_json::Value>>;
}

/// The operator of sink subtask `subtask`: a committing writer exactly
/// when the sink has a committer (a committer with a writer that
/// pre-commits nothing would never commit its output; a writer that
/// pre-commits without a committer would never make it visible).
pub fn writer_operator(
    factory: &dyn SinkFactory,
    subtask: usize,
    parallelism: usize,
    ctx: &SinkContext,
) -> Result<Box<dyn Operator>> {
    let commits = factory.committer(ctx).is_some();
    match (factory.create_writer(subtask, parallelism, ctx)?, commits) {
        (SinkWriter::Direct(w), false) => Ok(w),
        (SinkWriter::Committing(w), true) => Ok(Box::new(Committing(w))),
        (SinkWriter::Direct(_), true) => Err(ExecError::internal(format!(
            "sink '{}' has a committer but its writer pre-commits nothing: its output would never be committed",
            factory.name()
        ))),
        (SinkWriter::Committing(_), false) => Err(ExecError::internal(format!(
            "sink '{}' has a writer that pre-commits but no committer: its output would never become visible",
            factory.name()
        ))),
    }
}

/// A committing writer as the operator the runtime chains: barriers
/// pre-commit.
struct Committing(Box<dyn CommittingWriter>);

impl Operator for Committing {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        self.0.process_batch(batch, out)
    }

    fn process_input(&mut self, input: usize, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        self.0.process_input(input, batch, out)
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        self.0.on_watermark(watermark, out)
    }

    fn watermark_delay(&self) -> i64 {
        self.0.watermark_delay()
    }

    fn processing_time_interval(&self) -> Option<std::time::Duration> {
        self.0.processing_time_interval()
    }

    fn on_processing_time(&mut self, now: i64, out: &mut Collector) -> Result<()> {
        self.0.on_processing_time(now, out)
    }

    fn on_end_of_input(&mut self, out: &mut Collector) -> Result<()> {
        self.0.on_end_of_input(out)
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(OperatorSnapshot::Sink(self.0.pre_commit(checkpoint_id)?)))
    }

    fn final_snapshot(&mut self) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(OperatorSnapshot::Sink(self.0.final_pre_commit()?)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::connectors::Committer;

    /// A sink whose writer kind and committer are chosen by the test.
    #[derive(Debug)]
    struct Fake {
        committing_writer: bool,
        committer: bool,
    }

    struct Writer {
        pre_commits: usize,
    }

    impl Operator for Writer {
        fn name(&self) -> &str {
            "Sink: fake"
        }

        fn process_batch(&mut self, _batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
            Ok(())
        }
    }

    impl CommittingWriter for Writer {
        fn pre_commit(&mut self, checkpoint_id: u64) -> Result<Vec<serde_json::Value>> {
            self.pre_commits += 1;
            Ok(vec![serde_json::json!({ "checkpoint": checkpoint_id })])
        }

        fn final_pre_commit(&mut self) -> Result<Vec<serde_json::Value>> {
            Ok(vec![serde_json::json!("final")])
        }
    }

    struct NoCommit;

    impl Committer for NoCommit {
        fn commit(&self, _checkpoint_id: u64, _committables: &[serde_json::Value]) -> Result<()> {
            Ok(())
        }

        fn recover(&self) -> Result<()> {
            Ok(())
        }
    }

    impl SinkFactory for Fake {
        fn name(&self) -> &str {
            "fake"
        }

        fn create_writer(&self, _subtask: usize, _parallelism: usize, _ctx: &SinkContext) -> Result<SinkWriter> {
            let w = Writer { pre_commits: 0 };
            Ok(if self.committing_writer {
                SinkWriter::Committing(Box::new(w))
            } else {
                SinkWriter::Direct(Box::new(w))
            })
        }

        fn committer(&self, _ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
            self.committer.then(|| Arc::new(NoCommit) as Arc<dyn Committer>)
        }
    }

    fn ctx() -> SinkContext {
        SinkContext {
            job_tag: "job".into(),
            attempt: "a".into(),
            exactly_once: true,
            checkpoint_interval: None,
            checkpoint_timeout: None,
            clock: Default::default(),
            spool_dir: std::env::temp_dir(),
            sink_uid: String::new(),
        }
    }

    #[test]
    fn a_committing_writer_pre_commits_at_every_barrier() {
        let sink = Fake {
            committing_writer: true,
            committer: true,
        };
        let mut op = writer_operator(&sink, 0, 1, &ctx()).expect("a committing writer with its committer");
        match op.snapshot_state(7).expect("snapshot") {
            Some(OperatorSnapshot::Sink(c)) => assert_eq!(c, vec![serde_json::json!({ "checkpoint": 7 })]),
            other => panic!("a barrier did not pre-commit: {other:?}"),
        }
        match op.final_snapshot().expect("final snapshot") {
            Some(OperatorSnapshot::Sink(c)) => assert_eq!(c, vec![serde_json::json!("final")]),
            other => panic!("the end did not pre-commit: {other:?}"),
        }
    }

    #[test]
    fn a_writer_and_a_committer_that_disagree_are_refused() {
        let direct_with_committer = Fake {
            committing_writer: false,
            committer: true,
        };
        let err = writer_operator(&direct_with_committer, 0, 1, &ctx())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("sink 'fake' has a committer but its writer pre-commits nothing"),
            "{err}"
        );
        let committing_without = Fake {
            committing_writer: true,
            committer: false,
        };
        let err = writer_operator(&committing_without, 0, 1, &ctx())
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("pre-commits but no committer"), "{err}");
        let direct = Fake {
            committing_writer: false,
            committer: false,
        };
        assert!(
            writer_operator(&direct, 0, 1, &ctx())
                .expect("a direct writer")
                .snapshot_state(1)
                .expect("snapshot")
                .is_none()
        );
    }
}
