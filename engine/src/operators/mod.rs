//! Operators: one per file. An operator is a synchronous function of its
//! input messages; the subtask loop (runtime) owns channels and async I/O.
//!
//! Contract for implementers:
//! - `process_batch` may emit any number of batches through `out`.
//! - `on_watermark(w)` is called when the input watermark advances to `w`
//!   (watermarks are non-decreasing). Fire event-time timers here; the
//!   runtime forwards `w` downstream *after* this returns, so results of
//!   fired windows always precede the watermark that fired them.
//! - `on_end_of_input` is called once, after the final watermark.
//! - `snapshot_state(n)` is called when checkpoint barrier `n` reaches the
//!   operator (after alignment); the runtime forwards the barrier.

pub mod calc;
pub mod changelog_normalize;
pub mod dedup_first;
pub mod group;
pub mod interval_join;
pub mod join;
pub mod limit;
pub mod over_aggregate;
pub mod rank;
pub mod temporal_join;
pub mod temporal_sort;
pub mod union;
pub mod upsert_materialize;
pub mod window;
pub mod window_join;
pub mod window_rank;

use crate::change::ChangeBatch;

use crate::checkpoint::OperatorSnapshot;
use crate::error::Result;
use crate::message::Timestamp;

/// Deletes expired state (`table.exec.state.ttl`), a bounded amount per
/// call, and takes what it freed off the operator's state-size metric.
pub(crate) fn expire_state(
    state: &mut crate::state::KeyedState,
    now: i64,
    metrics: &crate::runtime::metrics::NodeMetrics,
) -> Result<()> {
    /// Entries of each state looked at per call.
    const BUDGET: usize = 10_000;
    let freed = state.expire(now, BUDGET)?;
    metrics
        .state_bytes
        .fetch_sub(freed, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Where an operator puts its output. Batches only: watermarks, barriers and
/// statuses are forwarded by the runtime so an operator cannot lose them.
#[derive(Default)]
pub struct Collector {
    batches: Vec<ChangeBatch>,
    /// Set by an operator that needs no more input (e.g. `LIMIT` reached).
    finished: bool,
}

impl Collector {
    /// Emits rows: a `RecordBatch` (inserts) or a [`ChangeBatch`].
    pub fn emit(&mut self, batch: impl Into<ChangeBatch>) {
        let batch = batch.into();
        if batch.num_rows() > 0 {
            self.batches.push(batch);
        }
    }

    pub fn take(&mut self) -> Vec<ChangeBatch> {
        std::mem::take(&mut self.batches)
    }

    pub fn finish(&mut self) {
        self.finished = true;
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

pub trait Operator: Send {
    fn name(&self) -> &str;

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()>;

    /// A batch from input `input` (0 or 1) of a two-input operator (a
    /// join); single-input operators take every batch as input 0.
    fn process_input(&mut self, input: usize, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        let _ = input;
        self.process_batch(batch, out)
    }

    /// The input watermark advanced to `watermark`.
    fn on_watermark(&mut self, _watermark: Timestamp, _out: &mut Collector) -> Result<()> {
        Ok(())
    }

    /// How far behind its input watermark the operator's output rows may
    /// be (ms): the watermark it passes on is that much lower (an interval
    /// join's, as Flink's `getMaxOutputDelay`).
    fn watermark_delay(&self) -> i64 {
        0
    }

    /// How often the operator wants [`Operator::on_processing_time`]
    /// (state TTL cleanup); `None`: never.
    fn processing_time_interval(&self) -> Option<std::time::Duration> {
        None
    }

    /// Processing time (the wall clock, ms) reached `now`: expire state.
    fn on_processing_time(&mut self, _now: i64, _out: &mut Collector) -> Result<()> {
        Ok(())
    }

    /// No more input will arrive. Sinks flush and close here.
    fn on_end_of_input(&mut self, _out: &mut Collector) -> Result<()> {
        Ok(())
    }

    /// Checkpoint barrier `checkpoint_id` passed: every input before it is
    /// processed, none after it. Returns the operator's state (the
    /// synchronous part of the snapshot), or `None` if it has none.
    fn snapshot_state(&mut self, _checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(None)
    }

    /// After end of input, with checkpointing on: what the final
    /// checkpoint must hold (a sink's last pre-committed output).
    fn final_snapshot(&mut self) -> Result<Option<OperatorSnapshot>> {
        Ok(None)
    }
}
