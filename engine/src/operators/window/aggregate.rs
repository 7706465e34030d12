//! Window aggregation (`GROUP BY window_start, window_end, keys...` over a
//! TUMBLE/HOP/CUMULATE window TVF, or the legacy `GROUP BY TUMBLE(...)`).
//!
//! State, per subtask, in the state backend:
//! - `window-acc`: `key group | key | window end` → the DataFusion
//!   accumulator state of every aggregate, row-encoded;
//! - `window-timers`: `window end | key group | key` → empty. An event-time
//!   timer: ordered by end, so firing is one range scan.
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
use arrow::row::{RowConverter, SortField};
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
use crate::state::{StateBackend, WriteBatch};

const ACC: usize = 0;
const TIMERS: usize = 1;
pub const STATE_NAMES: &[&str] = &["window-acc", "window-timers"];

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
    state_codec: RowConverter,
    schema: SchemaRef,
    max_parallelism: u16,
    state: Box<dyn StateBackend>,
    watermark: Timestamp,
    metrics: Arc<NodeMetrics>,
    /// This subtask's live state bytes and newest event time, for the
    /// state-per-event-time estimate.
    live_bytes: i64,
    max_ts: Timestamp,
    parallelism: usize,
    /// Every timer below this key has fired (where timer scans start).
    fired_below: Vec<u8>,
}

impl WindowAggregateOperator {
    pub fn new(
        node: &WindowAggregateNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        max_parallelism: u16,
        state: Box<dyn StateBackend>,
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
        let state_codec = RowConverter::new(state_types.iter().flatten().cloned().map(SortField::new).collect())?;
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
            fired_below: encode_ts(i64::MIN).to_vec(),
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
        let parser = self.state_codec.parser();
        let rows = stored.iter().map(|b| parser.parse(b));
        let columns = self.state_codec.convert_rows(rows)?;
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
        let rows = self.state_codec.convert_columns(&columns)?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
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
        // Windows with end - 1 <= up_to, i.e. end < up_to + 2.
        let bound = up_to.checked_add(2);
        let end = match bound {
            Some(b) => encode_ts(b).to_vec(),
            None => vec![0xff; 9],
        };
        // Fired timers are deleted, but RocksDB keeps their tombstones until
        // compaction: scanning from the beginning every time would walk all
        // of them (quadratic). Every timer below the last bound has fired,
        // and a new timer is never below it (its window would be late), so
        // each scan starts where the previous one ended.
        let mut start = self.fired_below.clone();
        loop {
            let mut timers: Vec<Vec<u8>> = vec![];
            self.state.scan(TIMERS, &start, &end, &mut |k, _| {
                timers.push(k.to_vec());
                timers.len() < FIRE_CHUNK
            })?;
            let Some(last) = timers.last() else {
                self.fired_below = end;
                return Ok(());
            };
            // The next chunk starts right after this one's last key.
            start = last.clone();
            start.push(0);
            self.fire_timers(&timers, out)?;
        }
    }

    fn fire_timers(&mut self, timers: &[Vec<u8>], out: &mut Collector) -> Result<()> {
        let corrupt = || ExecError::internal("window timer key is shorter than its header");
        let mut acc_keys = Vec::with_capacity(timers.len());
        let mut ends = Vec::with_capacity(timers.len());
        let mut key_rows: Vec<&[u8]> = Vec::with_capacity(timers.len());
        for t in timers {
            if t.len() < 10 {
                return Err(corrupt());
            }
            let end = decode_ts(&t[..8]);
            ends.push(end);
            key_rows.push(&t[10..]);
            acc_keys.push(acc_key(&t[8..10], &t[10..], end));
        }
        let refs: Vec<&[u8]> = acc_keys.iter().map(Vec::as_slice).collect();
        let stored = self.state.multi_get(ACC, &refs)?;
        let mut present = vec![];
        let mut groups = vec![];
        let mut freed: i64 = 0;
        for (i, s) in stored.into_iter().enumerate() {
            freed += timers[i].len() as i64;
            if let Some(s) = s {
                freed += (acc_keys[i].len() + s.len()) as i64;
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
            Some(enc) => {
                let parser = enc.converter().parser();
                enc.converter().convert_rows(key_rows.iter().map(|b| parser.parse(b)))?
            }
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
        let mut wb = WriteBatch::default();
        for (t, k) in timers.iter().zip(acc_keys) {
            wb.delete(TIMERS, t.clone());
            wb.delete(ACC, k);
        }
        self.state.write(wb)?;
        out.emit(batch);
        Ok(())
    }
}

/// Big-endian with the sign bit flipped: byte order equals numeric order.
fn encode_ts(ts: i64) -> [u8; 8] {
    ((ts as u64) ^ (1 << 63)).to_be_bytes()
}

fn decode_ts(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    (u64::from_be_bytes(a) ^ (1 << 63)) as i64
}

fn acc_key(group: &[u8], key: &[u8], end: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(group.len() + key.len() + 8);
    k.extend_from_slice(group);
    k.extend_from_slice(key);
    k.extend_from_slice(&encode_ts(end));
    k
}

fn timer_key(group: &[u8], key: &[u8], end: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(group.len() + key.len() + 8);
    k.extend_from_slice(&encode_ts(end));
    k.extend_from_slice(group);
    k.extend_from_slice(key);
    k
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
            let key: &[u8] = key_rows.as_ref().map_or(&[], |r| r.row(row).data());
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

        let kg_bytes: Vec<[u8; 2]> = group_keys
            .iter()
            .map(|(k, _)| key_group(k, self.max_parallelism).to_be_bytes())
            .collect();
        let acc_keys: Vec<Vec<u8>> = group_keys
            .iter()
            .zip(&kg_bytes)
            .map(|((k, end), kg)| acc_key(kg, k, *end))
            .collect();
        let refs: Vec<&[u8]> = acc_keys.iter().map(Vec::as_slice).collect();
        let stored = self.state.multi_get(ACC, &refs)?;

        let total = group_keys.len();
        let mut accs = self.accumulators()?;
        let mut present = vec![];
        let mut present_groups = vec![];
        let mut wb = WriteBatch::default();
        // Live state bytes, for the alignment sizing aid.
        let mut grown: i64 = 0;
        for (g, s) in stored.into_iter().enumerate() {
            match s {
                Some(s) => {
                    grown -= (acc_keys[g].len() + s.len()) as i64;
                    present.push(s);
                    present_groups.push(g);
                }
                None => {
                    let (k, end) = group_keys[g];
                    let t = timer_key(&kg_bytes[g], k, end);
                    grown += t.len() as i64;
                    wb.put(TIMERS, t, vec![]);
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
        for (key, value) in acc_keys.into_iter().zip(self.encode_states(&mut accs)?) {
            grown += (key.len() + value.len()) as i64;
            wb.put(ACC, key, value);
        }
        self.state.write(wb)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_encoding_orders_numerically() {
        let vals = [i64::MIN, -5, -1, 0, 1, 1000, i64::MAX];
        for w in vals.windows(2) {
            assert!(encode_ts(w[0]) < encode_ts(w[1]));
            assert_eq!(decode_ts(&encode_ts(w[0])), w[0]);
        }
    }
}
