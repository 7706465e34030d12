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

pub mod build;
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
/// call (the state takes what it freed off its size).
pub(crate) fn expire_state(state: &mut crate::state::KeyedState, now: i64) -> Result<()> {
    /// Entries of each state looked at per call.
    const BUDGET: usize = 10_000;
    state.expire(now, BUDGET)?;
    Ok(())
}

/// The keys of a batch's rows, each once in first-seen order as an entry
/// of a keyed value state (in the key group `state` gives it), and the
/// key of each row (an index into them).
pub(crate) fn batch_keys<'a>(
    keys: &'a crate::state::codec::Rows,
    state: &crate::state::KeyedState,
) -> (Vec<crate::state::EntryRef<'a>>, Vec<usize>) {
    let mut slot_of: hashbrown::HashMap<&[u8], usize> = hashbrown::HashMap::new();
    let mut refs = vec![];
    let mut of_row = Vec::with_capacity(keys.len());
    for i in 0..keys.len() {
        let k = keys.row(i);
        let s = *slot_of.entry(k).or_insert_with(|| {
            refs.push(crate::state::EntryRef {
                key_group: state.key_group(k),
                key: k,
                namespace: &[],
            });
            refs.len() - 1
        });
        of_row.push(s);
    }
    (refs, of_row)
}

/// One key's value of a keyed value state as a batch left it.
pub(crate) struct ValueChange<'a> {
    /// The length of the value the state held (`None`: none).
    pub stored_len: Option<usize>,
    /// The new value (`None`: the key has none now).
    pub value: Option<&'a [u8]>,
}

/// Writes the changed values of `refs` to `state` as one write.
pub(crate) fn write_values<'a>(
    state: &mut crate::state::KeyedState,
    id: usize,
    refs: &[crate::state::EntryRef<'_>],
    changes: impl Iterator<Item = (usize, ValueChange<'a>)>,
) -> Result<()> {
    let mut w = crate::state::KeyedWrite::default();
    for (slot, change) in changes {
        let e = refs[slot];
        match change.value {
            Some(v) => w.put(id, e, change.stored_len, v.to_vec()),
            None if change.stored_len.is_some() => w.delete(id, e, change.stored_len),
            None => {}
        }
    }
    state.write(w)?;
    Ok(())
}

/// Emits rows as `codec` encoded them, with their kinds, as one change
/// batch of `schema`.
pub(crate) fn emit_rows(
    codec: &crate::state::codec::RowCodec,
    schema: &arrow::datatypes::SchemaRef,
    emitted: &[(crate::change::RowKind, Vec<u8>)],
    out: &mut Collector,
) -> Result<()> {
    if emitted.is_empty() {
        return Ok(());
    }
    let columns = codec.decode(emitted.iter().map(|(_, r)| r.as_slice()))?;
    let kinds = emitted.iter().map(|(k, _)| *k).collect();
    out.emit(ChangeBatch::new(calc::batch_with_schema(schema, columns)?, kinds));
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

/// What operator unit tests share.
#[cfg(test)]
mod testing {
    use super::{Collector, Operator};

    /// Operator unit tests: feeds `rows` (written as
    /// [`crate::change::from_pretty`] reads them, of `schema`) to input
    /// `input` of `op` and returns what it emits as Flink prints changes
    /// (`+I[a, 1]`).
    pub(crate) fn feed_pretty(
        op: &mut dyn Operator,
        input: usize,
        schema: &arrow::datatypes::SchemaRef,
        rows: &str,
    ) -> Vec<String> {
        let mut out = Collector::default();
        op.process_input(input, crate::change::from_pretty(schema, rows), &mut out)
            .expect("process");
        printed(&mut out)
    }

    /// What `out` holds, as Flink prints changes.
    pub(crate) fn printed(out: &mut Collector) -> Vec<String> {
        out.take()
            .iter()
            .flat_map(|b| crate::connectors::print::format_changes(b).expect("format"))
            .collect()
    }
}
