//! Window aggregation (`GROUP BY window_start, window_end, keys...` over a
//! TUMBLE/HOP/CUMULATE window TVF, or the legacy `GROUP BY TUMBLE(...)`).
//!
//! State, per subtask, through the keyed-state layer ([`KeyedState`]):
//! - `window-acc` (value state): key, namespace = window end → the
//!   DataFusion accumulator state of every aggregate, in Weir's row
//!   encoding;
//! - `window-timers` (timers): an event-time timer per (key, window) at the
//!   window's last millisecond (`end - 1`, Flink's `maxTimestamp`).
//!
//! Per batch: rows are assigned to windows, grouped by (key, window), the
//! existing accumulator states of all touched groups are fetched with one
//! multi-get, merged and updated with DataFusion `GroupsAccumulator`s for the
//! whole batch at once, and written back in one write batch.
//!
//! On watermark `w`: every window with `end - 1 <= w` fires (Flink's rule),
//! its result is emitted and its state deleted, before `w` moves on.
//! Rows are late when every window containing them has fired: they are
//! dropped and counted (`late_rows_dropped`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, ArrayRef, AsArray, TimestampMillisecondArray, UInt32Array};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::GroupsAccumulatorAdapter;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;

use super::{assign_windows, is_fired, window_start};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result};
use crate::keygroup::{KeyEncoder, key_group};
use crate::message::{MIN_WATERMARK, Timestamp};
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{GroupOutput, WindowAggregateNode, WindowSpec};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::RowCodec;
use crate::state::keyed::{decode_time, encode_time};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

const ACC: usize = 0;
const TIMERS: usize = 1;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "window-acc",
        kind: StateKind::Value,
    },
    StateDecl {
        name: "window-timers",
        kind: StateKind::Timers,
    },
];

/// Windows fired per state round trip; bounds memory when a watermark
/// jump fires many windows at once.
const FIRE_CHUNK: usize = 8192;

pub struct WindowAggregateOperator {
    name: String,
    window: WindowSpec,
    time_column: usize,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    key_encoder: Option<KeyEncoder>,
    group_outputs: Vec<GroupOutput>,
    aggregates: Vec<Arc<AggregateFunctionExpr>>,
    /// Types of each aggregate's state columns, in order.
    state_types: Vec<Vec<DataType>>,
    state_codec: RowCodec,
    schema: SchemaRef,
    max_parallelism: u16,
    state: KeyedState,
    watermark: Timestamp,
    metrics: Arc<NodeMetrics>,
    /// This subtask's live state bytes and newest event time, for the
    /// state-per-event-time estimate.
    live_bytes: i64,
    max_ts: Timestamp,
    parallelism: usize,
}

impl WindowAggregateOperator {
    pub fn new(
        node: &WindowAggregateNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        max_parallelism: u16,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
        parallelism: usize,
    ) -> Result<Self> {
        let key_types = node
            .keys
            .iter()
            .map(|k| k.data_type(input_schema))
            .collect::<Result<Vec<_>, _>>()?;
        let key_encoder = if key_types.is_empty() {
            None
        } else {
            Some(KeyEncoder::new(&key_types)?)
        };
        let state_types = node
            .aggregates
            .iter()
            .map(|a| {
                a.state_fields()
                    .map(|fs| fs.iter().map(|f| f.data_type().clone()).collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let flat: Vec<DataType> = state_types.iter().flatten().cloned().collect();
        let state_codec = RowCodec::new(&flat).map_err(|m| {
            let names: Vec<&str> = node.aggregates.iter().map(|a| a.name()).collect();
            ExecError::Config(format!("window aggregate [{}]: {m}", names.join(", ")))
        })?;
        Ok(Self {
            name: format!("WindowAggregate {}", node.window),
            window: node.window,
            time_column: node.time_column,
            keys: node.keys.clone(),
            key_encoder,
            group_outputs: node.group_outputs.clone(),
            aggregates: node.aggregates.clone(),
            state_types,
            state_codec,
            schema,
            max_parallelism,
            state,
            watermark: MIN_WATERMARK,
            metrics,
            live_bytes: 0,
            max_ts: MIN_WATERMARK,
            parallelism,
        })
    }

    fn accumulators(&self) -> Result<Vec<Box<dyn GroupsAccumulator>>> {
        self.aggregates
            .iter()
            .map(|a| {
                if a.groups_accumulator_supported() {
                    Ok(a.create_groups_accumulator()?)
                } else {
                    let a = Arc::clone(a);
                    Ok(Box::new(GroupsAccumulatorAdapter::new(move || a.create_accumulator()))
                        as Box<dyn GroupsAccumulator>)
                }
            })
            .collect()
    }

    /// Merges stored states (row-encoded, one per group) into `accs`.
    fn merge_stored(
        &self,
        accs: &mut [Box<dyn GroupsAccumulator>],
        stored: &[Vec<u8>],
        groups: &[usize],
        total_groups: usize,
    ) -> Result<()> {
        if stored.is_empty() {
            return Ok(());
        }
        let columns = self.state_codec.decode(stored.iter().map(Vec::as_slice))?;
        let mut offset = 0;
        for (acc, types) in accs.iter_mut().zip(&self.state_types) {
            let cols = &columns[offset..offset + types.len()];
            offset += types.len();
            acc.merge_batch(cols, groups, total_groups)?;
        }
        Ok(())
    }

    /// Row-encodes the state of every group of `accs`.
    fn encode_states(&self, accs: &mut [Box<dyn GroupsAccumulator>]) -> Result<Vec<Vec<u8>>> {
        let mut columns: Vec<ArrayRef> = vec![];
        for (acc, types) in accs.iter_mut().zip(&self.state_types) {
            for (col, ty) in acc.state(EmitTo::All)?.into_iter().zip(types) {
                columns.push(if col.data_type() == ty { col } else { cast(&col, ty)? });
            }
        }
        let rows = self.state_codec.encode(&columns)?;
        Ok(rows.iter().map(<[u8]>::to_vec).collect())
    }

    fn event_times(&self, batch: &RecordBatch) -> Result<TimestampMillisecondArray> {
        let col = batch.column(self.time_column);
        let col = match col.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, None) => col.clone(),
            _ => cast(col, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        };
        Ok(col.as_primitive::<TimestampMillisecondType>().clone())
    }

    fn fire(&mut self, up_to: Timestamp, out: &mut Collector) -> Result<()> {
        // A window fires when the watermark reaches its last millisecond
        // (end - 1), which is its timer's time.
        loop {
            let timers = self.state.due_timers(TIMERS, up_to, FIRE_CHUNK)?;
            if timers.is_empty() {
                return Ok(());
            }
            let more = timers.len() == FIRE_CHUNK;
            self.fire_timers(&timers, out)?;
            if !more {
                return Ok(());
            }
        }
    }

    fn fire_timers(&mut self, timers: &[Timer], out: &mut Collector) -> Result<()> {
        let mut ends = Vec::with_capacity(timers.len());
        for t in timers {
            let ns: [u8; 8] = t
                .namespace
                .as_slice()
                .try_into()
                .map_err(|_| ExecError::internal("window timer without a window end"))?;
            ends.push(decode_time(ns));
        }
        let entries: Vec<EntryRef> = timers
            .iter()
            .map(|t| EntryRef {
                key_group: t.key_group,
                key: &t.key,
                namespace: &t.namespace,
            })
            .collect();
        let stored = self.state.get(ACC, &entries)?;
        let mut present = vec![];
        let mut groups = vec![];
        let mut freed: i64 = 0;
        for (i, s) in stored.into_iter().enumerate() {
            freed += (timers[i].key.len() + 22) as i64;
            if let Some(s) = s {
                freed += (timers[i].key.len() + 10 + s.len()) as i64;
                present.push(s);
                groups.push(i);
            }
        }
        self.metrics.state_bytes.fetch_sub(freed, Ordering::Relaxed);
        // After a restore, state from before it is freed too: not below 0.
        self.live_bytes = (self.live_bytes - freed).max(0);
        let n = timers.len();
        let mut accs = self.accumulators()?;
        self.merge_stored(&mut accs, &present, &groups, n)?;
        let mut agg_columns = Vec::with_capacity(accs.len());
        for acc in accs.iter_mut() {
            agg_columns.push(acc.evaluate(EmitTo::All)?);
        }
        let key_columns = match &self.key_encoder {
            Some(enc) => enc.codec().decode(timers.iter().map(|t| t.key.as_slice()))?,
            None => vec![],
        };
        let starts: TimestampMillisecondArray = ends.iter().map(|e| Some(window_start(&self.window, *e))).collect();
        let end_arr: TimestampMillisecondArray = ends.iter().map(|e| Some(*e)).collect();
        let times: TimestampMillisecondArray = ends.iter().map(|e| Some(e - 1)).collect();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for g in &self.group_outputs {
            columns.push(match g {
                GroupOutput::WindowStart => Arc::new(starts.clone()),
                GroupOutput::WindowEnd => Arc::new(end_arr.clone()),
                GroupOutput::WindowTime => Arc::new(times.clone()),
                GroupOutput::Key(i) => key_columns
                    .get(*i)
                    .cloned()
                    .ok_or_else(|| ExecError::internal("window key index out of range"))?,
            });
        }
        columns.extend(agg_columns);
        let batch = batch_with_schema(&self.schema, columns)?;
        let mut w = KeyedWrite::default();
        for (t, e) in timers.iter().zip(&entries) {
            w.delete_timer(TIMERS, t);
            w.delete(ACC, *e);
        }
        self.state.write(w)?;
        out.emit(batch);
        Ok(())
    }
}

impl Operator for WindowAggregateOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        crate::failpoint::failpoint_error("window.snapshot").map_err(ExecError::internal)?;
        // Accumulators and timers are both in the backend: one snapshot
        // holds the windows and when they fire.
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn process_batch(&mut self, batch: RecordBatch, _out: &mut Collector) -> Result<()> {
        let n = batch.num_rows();
        let times = self.event_times(&batch)?;
        let key_arrays = self
            .keys
            .iter()
            .map(|k| k.evaluate(&batch).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let key_rows = match &self.key_encoder {
            Some(enc) => Some(enc.encode(&key_arrays)?),
            None => None,
        };

        // (key, window end) → group index; rows expanded per window.
        let mut group_of: HashMap<(&[u8], i64), usize> = HashMap::new();
        let mut group_keys: Vec<(&[u8], i64)> = vec![];
        let mut row_idx: Vec<u32> = Vec::with_capacity(n);
        let mut group_idx: Vec<usize> = Vec::with_capacity(n);
        let mut late = 0u64;
        let watermark = self.watermark;
        for row in 0..n {
            if times.is_null(row) {
                late += 1;
                continue;
            }
            let key: &[u8] = key_rows.as_ref().map_or(&[], |r| r.row(row));
            let mut assigned = false;
            assign_windows(&self.window, times.value(row), |_, end| {
                if is_fired(end, watermark) {
                    return;
                }
                assigned = true;
                let g = *group_of.entry((key, end)).or_insert_with(|| {
                    group_keys.push((key, end));
                    group_keys.len() - 1
                });
                row_idx.push(row as u32);
                group_idx.push(g);
            });
            if !assigned {
                late += 1;
            }
        }
        if late > 0 {
            self.metrics.late_rows_dropped.fetch_add(late, Ordering::Relaxed);
        }
        if group_keys.is_empty() {
            return Ok(());
        }

        let namespaces: Vec<[u8; 8]> = group_keys.iter().map(|(_, end)| encode_time(*end)).collect();
        let entries: Vec<EntryRef> = group_keys
            .iter()
            .zip(&namespaces)
            .map(|((k, _), ns)| EntryRef {
                key_group: key_group(k, self.max_parallelism),
                key: k,
                namespace: ns,
            })
            .collect();
        let groups = self.state.groups();
        if let Some(e) = entries.iter().find(|e| !groups.contains(&e.key_group)) {
            return Err(ExecError::internal(format!(
                "a row of key group {} reached the subtask owning key groups {groups:?}",
                e.key_group
            )));
        }
        let stored = self.state.get(ACC, &entries)?;

        let total = group_keys.len();
        let mut accs = self.accumulators()?;
        let mut present = vec![];
        let mut present_groups = vec![];
        let mut w = KeyedWrite::default();
        // Live state bytes, for the alignment sizing aid.
        let mut grown: i64 = 0;
        for (g, s) in stored.into_iter().enumerate() {
            match s {
                Some(s) => {
                    grown -= (entries[g].key.len() + 10 + s.len()) as i64;
                    present.push(s);
                    present_groups.push(g);
                }
                None => {
                    // A new window of this key: its timer fires at the
                    // window's last millisecond.
                    let e = entries[g];
                    w.add_timer(TIMERS, e.key_group, group_keys[g].1 - 1, e.key, e.namespace);
                }
            }
        }
        self.merge_stored(&mut accs, &present, &present_groups, total)?;

        let identity = row_idx.len() == n;
        let indices = (!identity).then(|| UInt32Array::from(row_idx));
        for (acc, agg) in accs.iter_mut().zip(&self.aggregates) {
            let mut values = vec![];
            for e in agg.expressions() {
                let v = e.evaluate(&batch)?.into_array(n)?;
                values.push(match &indices {
                    Some(ix) => take(&v, ix, None)?,
                    None => v,
                });
            }
            acc.update_batch(&values, &group_idx, None, total)?;
        }
        for (e, value) in entries.iter().zip(self.encode_states(&mut accs)?) {
            w.put(ACC, *e, value);
        }
        grown += w.bytes_written;
        self.state.write(w)?;
        self.metrics.state_bytes.fetch_add(grown, Ordering::Relaxed);
        self.live_bytes += grown;
        if let Some(max) = times.iter().flatten().max() {
            self.metrics.max_event_time.fetch_max(max, Ordering::Relaxed);
            self.max_ts = self.max_ts.max(max);
        }
        // State held per second of event time: the live state spans the
        // event time between the watermark and the newest row.
        if self.watermark > MIN_WATERMARK && self.max_ts > self.watermark {
            let span_s = (self.max_ts - self.watermark) as f64 / 1000.0;
            let rate = (self.live_bytes as f64 / span_s) as i64 * self.parallelism as i64;
            self.metrics.peak_state_rate.fetch_max(rate, Ordering::Relaxed);
        }
        Ok(())
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        self.fire(watermark, out)
    }
}
