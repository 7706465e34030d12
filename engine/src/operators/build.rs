//! What an operator's constructor (`build` in each operator's file) gets
//! from the runtime: its node in the graph, its subtask, the job's options,
//! its metrics and what a restored snapshot holds for it. The runtime makes
//! one per operator subtask (`runtime/job.rs::create_operator`); the
//! operator's own choices (caches, time columns, which store) stay in its
//! file.

use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use crate::checkpoint::restore::{RestoredJob, local_state_dir};
use crate::config::{JobConfig, StateBackendKind};
use crate::error::{ExecError, Result};
use crate::keygroup::KeyGroup;
use crate::plan::{NodeId, StateKeys, StreamGraph, StreamNode};
use crate::runtime::metrics::NodeMetrics;
use crate::state::{KeyedState, RocksDbTuning, StateDecl, StateSource, open_keyed};

/// Entries of a GROUP BY's accumulators or a Top-N's partitions kept in
/// memory over RocksDB between snapshots.
pub const STATE_CACHE_ENTRIES: usize = 100_000;

/// One operator subtask about to be built.
pub struct BuildCtx<'a> {
    pub graph: &'a StreamGraph,
    pub id: NodeId,
    pub subtask: usize,
    pub config: &'a JobConfig,
    pub tuning: &'a RocksDbTuning,
    pub metrics: Arc<NodeMetrics>,
    pub restored: Option<&'a RestoredJob>,
    /// The job attempt's tag: local state directories are per attempt.
    pub attempt: &'a str,
}

impl BuildCtx<'_> {
    pub fn node(&self) -> &StreamNode {
        self.graph.node(self.id)
    }

    /// The operator's output schema.
    pub fn schema(&self) -> SchemaRef {
        self.node().schema.clone()
    }

    /// The schema of the operator's (first) input.
    pub fn input_schema(&self) -> Result<SchemaRef> {
        self.graph
            .inputs(self.id)
            .next()
            .map(|e| self.graph.node(e.from).schema.clone())
            .ok_or_else(|| ExecError::internal(format!("node {} has no input", self.id)))
    }

    /// Whether every input carries inserts only (no updates, no deletes).
    pub fn input_insert_only(&self) -> bool {
        self.graph
            .inputs(self.id)
            .all(|e| self.graph.node(e.from).changelog.is_insert_only())
    }

    pub fn max_parallelism(&self) -> u16 {
        self.config.max_parallelism
    }

    /// Keyed state lives in RocksDB (not on the heap).
    pub fn rocksdb(&self) -> bool {
        self.config.state_backend == StateBackendKind::RocksDb
    }

    /// The key groups this subtask owns.
    pub fn key_groups(&self) -> Range<KeyGroup> {
        crate::keygroup::groups_of_subtask(self.subtask, self.config.max_parallelism, self.node().parallelism)
    }

    /// The operator's keyed state in the restored snapshot (empty: a
    /// fresh start), one source per subtask of the run that took it.
    pub fn restored_keyed(&self) -> &[StateSource] {
        let uid = &self.node().uid;
        self.restored.map_or(&[][..], |r| r.keyed_state(uid))
    }

    /// This subtask's operator state that is not keyed (a LIMIT's count).
    pub fn restored_operator_state(&self) -> Option<&[u8]> {
        let key = crate::checkpoint::operator_key(&self.node().uid, self.subtask);
        self.restored
            .and_then(|r| r.operator_state.get(&key))
            .map(Vec::as_slice)
    }

    /// The subtask's keyed state with the operator's states `decls`:
    /// opened from what was restored for its key groups, with
    /// `table.exec.state.ttl`.
    pub fn keyed_state(&self, decls: &[StateDecl]) -> Result<KeyedState> {
        let mut state = self.open_keyed(decls)?;
        state.set_ttl(self.config.state_ttl);
        Ok(state)
    }

    /// [`BuildCtx::keyed_state`] without the job's state TTL (a window's
    /// state ends with its window).
    pub fn open_keyed(&self, decls: &[StateDecl]) -> Result<KeyedState> {
        let node = self.node();
        // Keyed state is recorded and checked by its keys on restore: a
        // node kind that does not say what they are cannot have any.
        if matches!(node.kind.state_keys(), StateKeys::None) {
            return Err(ExecError::internal(format!(
                "operator {} opens keyed state but its node kind reports no state keys (plan::PlanNode::state_keys)",
                node.uid
            )));
        }
        let dir = local_state_dir(&self.config.job_dir, &node.uid, self.subtask, self.attempt);
        let mut state = open_keyed(
            self.config.state_backend,
            self.tuning,
            &dir,
            decls,
            self.key_groups(),
            self.max_parallelism(),
            self.restored_keyed(),
        )?;
        state.set_clock(self.clock());
        state.share_size(self.metrics.state_bytes.clone());
        Ok(state)
    }

    /// The job's processing-time clock.
    pub fn clock(&self) -> crate::clock::Clock {
        self.config.clock.clone()
    }
}
