//! OVER aggregates on event time: `agg(...) OVER (PARTITION BY k ORDER BY
//! rowtime {ROWS n | RANGE INTERVAL ... | ROWS/RANGE UNBOUNDED} PRECEDING
//! AND CURRENT ROW)` (Flink's `RowTimeRowsBoundedPrecedingFunction`,
//! `RowTimeRangeBoundedPrecedingFunction` and the unbounded ones).
//! Append-only: each row is emitted once, with its aggregates appended,
//! when the watermark reaches its time; rows of one key in time order
//! (ties in arrival order).
//!
//! - RANGE: the rows of one time are one frame end: each gets the
//!   aggregates over the rows of its key within `[ts - offset, ts]` (or
//!   every row up to `ts`), its ties included.
//! - ROWS: each row gets the aggregates over itself and the `n` rows
//!   before it (or every row before it), ties in arrival order.
//! - A row at or before the last time its key emitted (bounded frames,
//!   Flink's `lastTriggeringTs`) or the watermark (unbounded frames) is
//!   late: dropped and counted.
//!
//! State, through the keyed-state layer:
//! - `over-rows` (value): key, namespace = time → the key's rows of that
//!   time in arrival order; kept while a later row's frame can hold them;
//! - `over-key` (value): key → the last time emitted, and for unbounded
//!   frames the accumulators' state (rows are folded in and freed);
//! - `over-timers` (timers): one per key and row time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Literal;
use hashbrown::HashMap;

use crate::canonical::{canonical_expr, canonical_exprs};
use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::{KeyEncoder, KeyGroup};
use crate::message::Timestamp;
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{ChangelogMode, PlanNode, StateKeys, StreamNode};
use crate::plan::{LagCall, OverAggregateNode, OverFrame, OverOutput};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::{RowCodec, RowList};
use crate::state::keyed::{decode_time, encode_time};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

const ROWS: usize = 0;
const KEY: usize = 1;
const TIMERS: usize = 2;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "over-rows",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "over-key",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "over-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Timers fired per state round trip.
const FIRE_CHUNK: usize = 4096;

pub struct OverAggregateOperator {
    partition: Vec<Arc<dyn PhysicalExpr>>,
    key_encoder: Option<KeyEncoder>,
    time_column: usize,
    frame: OverFrame,
    aggregates: Vec<Arc<AggregateFunctionExpr>>,
    lags: Vec<LagCall>,
    /// Whether every aggregate's sliding accumulator retracts (else a
    /// bounded frame is computed afresh for each row time).
    retracts: bool,
    /// The output columns after the input's, in order.
    outputs: Vec<OverOutput>,
    /// Accumulator state of every aggregate, in order (unbounded frames).
    state_codec: RowCodec,
    state_types: Vec<Vec<DataType>>,
    input_schema: SchemaRef,
    codec: RowCodec,
    schema: SchemaRef,
    state: KeyedState,
    watermark: Timestamp,
    metrics: Arc<NodeMetrics>,
}

/// A key's stored facts: the last time it emitted, and (unbounded frames)
/// its accumulators' state.
struct KeyMeta {
    last: Option<Timestamp>,
    acc: Option<Vec<u8>>,
}

fn encode_meta(last: Timestamp, acc: Option<&[u8]>) -> Vec<u8> {
    let mut v = last.to_be_bytes().to_vec();
    if let Some(a) = acc {
        v.extend_from_slice(a);
    }
    v
}

fn decode_meta(v: Option<&[u8]>) -> Result<KeyMeta> {
    let Some(v) = v else {
        return Ok(KeyMeta { last: None, acc: None });
    };
    let last = v
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(i64::from_be_bytes)
        .ok_or_else(|| StateError::Corrupt {
            state: STATES[KEY].name.into(),
            message: format!("a key's entry of {} bytes has no time", v.len()),
        })?;
    Ok(KeyMeta {
        last: Some(last),
        acc: (v.len() > 8).then(|| v[8..].to_vec()),
    })
}

impl PlanNode for OverAggregateNode {
    fn describe(&self) -> String {
        let keys: Vec<String> = self.partition.iter().map(|k| k.to_string()).collect();
        let aggs: Vec<String> = self
            .outputs
            .iter()
            .map(|out| match out {
                OverOutput::Aggregate(a) => self.aggregates[*a].name().to_string(),
                OverOutput::Lag(l) => format!("LAG({}, {})", self.lags[*l].arg, self.lags[*l].offset),
            })
            .collect();
        let frame = match self.frame {
            OverFrame::Rows(Some(n)) => format!("ROWS {n} PRECEDING"),
            OverFrame::Rows(None) => "ROWS UNBOUNDED PRECEDING".to_string(),
            OverFrame::Range(Some(ms)) => format!("RANGE {ms} ms PRECEDING"),
            OverFrame::Range(None) => "RANGE UNBOUNDED PRECEDING".to_string(),
        };
        format!(
            "OverAggregate: partition [{}] order by #{} {frame} aggregates [{}]",
            keys.join(", "),
            self.time_column,
            aggs.join(", ")
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some(
            "rows by key group|partition key|time while a later row's frame can hold them; per key the last time emitted (and unbounded frames' accumulators); a timer per key and time"
                .into(),
        )
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "over_aggregate",
            format!(
                "time={};frame={:?};partition={};aggs={}",
                self.time_column,
                self.frame,
                canonical_exprs(&self.partition),
                self.aggregates
                    .iter()
                    .map(|a| a.name().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ) + &self
                .lags
                .iter()
                .map(|l| {
                    format!(";lag={}:{}", canonical_expr(&l.arg), l.offset)
                        + &if l.default.is_null() {
                            String::new()
                        } else {
                            format!(
                                ":default={}",
                                canonical_expr(&(Arc::new(Literal::new(l.default.clone())) as Arc<dyn PhysicalExpr>))
                            )
                        }
                })
                .collect::<String>()
                + &over_outputs(self),
        )
    }

    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.partition)
    }

    fn changelog(&self, _: &ChangelogMode) -> ChangelogMode {
        ChangelogMode::insert_only()
    }
}

/// An OVER aggregate's output columns, when not its aggregates then its
/// LAGs in order.
fn over_outputs(o: &OverAggregateNode) -> String {
    let natural: Vec<OverOutput> = (0..o.aggregates.len())
        .map(OverOutput::Aggregate)
        .chain((0..o.lags.len()).map(OverOutput::Lag))
        .collect();
    if o.outputs == natural {
        return String::new();
    }
    let cols: Vec<String> = o
        .outputs
        .iter()
        .map(|c| match c {
            OverOutput::Aggregate(i) => format!("a{i}"),
            OverOutput::Lag(i) => format!("l{i}"),
        })
        .collect();
    format!(";outputs={}", cols.join(","))
}

/// The operator of an OVER aggregate's subtask.
pub fn build(node: &crate::plan::OverAggregateNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(OverAggregateOperator::new(
        node,
        &ctx.input_schema()?,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl OverAggregateOperator {
    pub fn new(
        node: &OverAggregateNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self> {
        let types: Vec<DataType> = input_schema.fields().iter().map(|f| f.data_type().clone()).collect();
        let state_types = node
            .aggregates
            .iter()
            .map(|a| {
                a.state_fields()
                    .map(|fs| fs.iter().map(|f| f.data_type().clone()).collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let flat: Vec<DataType> = state_types.iter().flatten().cloned().collect();
        Ok(Self {
            partition: node.partition.clone(),
            key_encoder: KeyEncoder::for_keys(&node.partition, input_schema)?,
            time_column: node.time_column,
            frame: node.frame,
            aggregates: node.aggregates.clone(),
            lags: node.lags.clone(),
            retracts: node.aggregates.iter().all(|a| {
                a.create_sliding_accumulator()
                    .is_ok_and(|acc| acc.supports_retract_batch())
            }),
            outputs: node.outputs.clone(),
            state_codec: RowCodec::new(&flat).map_err(|m| ExecError::Config(format!("OVER aggregate: {m}")))?,
            state_types,
            input_schema: input_schema.clone(),
            codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            schema,
            state,
            watermark: Timestamp::MIN,
            metrics,
        })
    }

    fn times(&self, batch: &RecordBatch) -> Result<ArrayRef> {
        let col = batch.column(self.time_column);
        Ok(match col.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, None) => col.clone(),
            _ => cast(col, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        })
    }

    fn accumulators(&self, sliding: bool) -> Result<Vec<Box<dyn Accumulator>>> {
        self.aggregates
            .iter()
            .map(|a| {
                Ok(if sliding {
                    a.create_sliding_accumulator()?
                } else {
                    a.create_accumulator()?
                })
            })
            .collect()
    }

    /// Unbounded frames: accumulators restored from their stored state.
    fn restore_accumulators(&self, acc: Option<&[u8]>) -> Result<Vec<Box<dyn Accumulator>>> {
        let mut accs = self.accumulators(false)?;
        if let Some(bytes) = acc {
            let columns = self.state_codec.decode([bytes])?;
            let mut at = 0;
            for (a, types) in accs.iter_mut().zip(&self.state_types) {
                a.merge_batch(&columns[at..at + types.len()])?;
                at += types.len();
            }
        }
        Ok(accs)
    }

    fn save_accumulators(&self, accs: &mut [Box<dyn Accumulator>]) -> Result<Vec<u8>> {
        let mut columns: Vec<ArrayRef> = vec![];
        for (a, types) in accs.iter_mut().zip(&self.state_types) {
            for (v, ty) in a.state()?.into_iter().zip(types) {
                let arr = v.to_array()?;
                columns.push(if arr.data_type() == ty { arr } else { cast(&arr, ty)? });
            }
        }
        Ok(self.state_codec.encode(&columns)?.row(0).to_vec())
    }

    /// Emits the rows of one key whose times are `due` (ascending), with
    /// their aggregates, into `out_rows`/`out_values`; returns the writes
    /// that free what no later row needs.
    // Row indexes address both `rows` and the aggregates' argument arrays.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    fn fire_key(
        &self,
        group: KeyGroup,
        key: &[u8],
        due: &[Timestamp],
        w: &mut KeyedWrite,
        out_rows: &mut Vec<(Timestamp, Vec<u8>)>,
        out_values: &mut Vec<Vec<ScalarValue>>,
    ) -> Result<()> {
        let entry = EntryRef {
            key_group: group,
            key,
            namespace: &[],
        };
        let meta = self.state.get(KEY, &[entry])?.pop().flatten();
        let meta_len = meta.as_ref().map(Vec::len);
        let meta = decode_meta(meta.as_deref())?;
        let last_due = *due.last().ok_or_else(|| ExecError::internal("no due time"))?;
        // Every stored row of the key up to the last due time, by time
        // then arrival.
        let mut times: Vec<(Timestamp, usize)> = vec![];
        let mut rows: Vec<Vec<u8>> = vec![];
        let mut entries: Vec<(Timestamp, usize)> = vec![];
        let mut corrupt = None;
        self.state.scan_namespaces(ROWS, entry, &mut |ns, v| {
            let Ok(t) = <[u8; 8]>::try_from(ns).map(decode_time) else {
                corrupt = Some(format!("a row time of {} bytes", ns.len()));
                return false;
            };
            if t > last_due {
                return false;
            }
            match RowList::decode(v) {
                Some(rs) => {
                    entries.push((t, v.len()));
                    for r in rs {
                        times.push((t, rows.len()));
                        rows.push(r.to_vec());
                    }
                    true
                }
                None => {
                    corrupt = Some(format!("rows of {} bytes cut short", v.len()));
                    false
                }
            }
        })?;
        if let Some(message) = corrupt {
            return Err(StateError::Corrupt {
                state: STATES[ROWS].name.into(),
                message,
            }
            .into());
        }
        let columns = self.codec.decode(rows.iter().map(Vec::as_slice))?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        let batch = RecordBatch::try_new_with_options(self.input_schema.clone(), columns, &options)?;
        let args: Vec<Vec<ArrayRef>> = self
            .aggregates
            .iter()
            .map(|a| {
                a.expressions()
                    .iter()
                    .map(|e| Ok(e.evaluate(&batch)?.into_array(batch.num_rows())?))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?;
        let lag_args: Vec<ArrayRef> = self
            .lags
            .iter()
            .map(|l| Ok(l.arg.evaluate(&batch)?.into_array(batch.num_rows())?))
            .collect::<Result<_>>()?;
        // The output values of a row whose frame is rows [fs, fe): the
        // aggregates', and each LAG's (Flink's LagAggFunction: the value
        // `offset` rows before the frame's last, or its default).
        let output = |aggs: Vec<ScalarValue>, fs: usize, fe: usize| -> Result<Vec<ScalarValue>> {
            self.outputs
                .iter()
                .map(|o| match o {
                    OverOutput::Aggregate(a) => Ok(aggs[*a].clone()),
                    OverOutput::Lag(l) => {
                        let lag = &self.lags[*l];
                        match (fe.checked_sub(1 + lag.offset)).filter(|i| *i >= fs) {
                            Some(i) => Ok(ScalarValue::try_from_array(&lag_args[*l], i)?),
                            None => Ok(lag.default.clone()),
                        }
                    }
                })
                .collect()
        };
        let slice = |a: usize, b: usize| -> Vec<Vec<ArrayRef>> {
            args.iter()
                .map(|cols| cols.iter().map(|c| c.slice(a, b - a)).collect())
                .collect()
        };
        let update = |accs: &mut [Box<dyn Accumulator>], a: usize, b: usize| -> Result<()> {
            if b > a {
                for (acc, cols) in accs.iter_mut().zip(slice(a, b)) {
                    acc.update_batch(&cols)?;
                }
            }
            Ok(())
        };
        let retract = |accs: &mut [Box<dyn Accumulator>], a: usize, b: usize| -> Result<()> {
            if b > a {
                for (acc, cols) in accs.iter_mut().zip(slice(a, b)) {
                    acc.retract_batch(&cols)?;
                }
            }
            Ok(())
        };
        let evaluate = |accs: &mut [Box<dyn Accumulator>]| -> Result<Vec<ScalarValue>> {
            accs.iter_mut().map(|a| Ok(a.evaluate()?)).collect()
        };
        // The rows of each due time: [lo, hi) in `rows`.
        let span = |t: Timestamp| {
            let lo = times.partition_point(|(x, _)| *x < t);
            let hi = times.partition_point(|(x, _)| *x <= t);
            (lo, hi)
        };
        let mut new_acc = None;
        match self.frame {
            OverFrame::Range(None) | OverFrame::Rows(None) => {
                let mut accs = self.restore_accumulators(meta.acc.as_deref())?;
                for &t in due {
                    let (lo, hi) = span(t);
                    if matches!(self.frame, OverFrame::Range(_)) {
                        update(&mut accs, lo, hi)?;
                        let v = output(evaluate(&mut accs)?, 0, hi)?;
                        for i in lo..hi {
                            out_rows.push((t, std::mem::take(&mut rows[i])));
                            out_values.push(v.clone());
                        }
                    } else {
                        for i in lo..hi {
                            update(&mut accs, i, i + 1)?;
                            out_rows.push((t, std::mem::take(&mut rows[i])));
                            out_values.push(output(evaluate(&mut accs)?, 0, i + 1)?);
                        }
                    }
                }
                if !accs.is_empty() {
                    new_acc = Some(self.save_accumulators(&mut accs)?);
                }
            }
            OverFrame::Range(Some(offset)) => {
                let retracts = self.retracts;
                let mut accs = self.accumulators(true)?;
                let (mut a, mut b) = (0usize, 0usize);
                for &t in due {
                    let (lo, hi) = span(t);
                    let start = times.partition_point(|(x, _)| *x < t.saturating_sub(offset));
                    if retracts {
                        update(&mut accs, b.max(start), hi)?;
                        retract(&mut accs, a, start.min(b))?;
                        (a, b) = (start, hi);
                    } else {
                        accs = self.accumulators(false)?;
                        update(&mut accs, start, hi)?;
                    }
                    let v = output(evaluate(&mut accs)?, start, hi)?;
                    for i in lo..hi {
                        out_rows.push((t, rows[i].clone()));
                        out_values.push(v.clone());
                    }
                }
            }
            OverFrame::Rows(Some(n)) => {
                let n = n as usize;
                let retracts = self.retracts;
                let mut accs = self.accumulators(true)?;
                let mut started = false;
                let mut a = 0usize;
                for &t in due {
                    let (lo, hi) = span(t);
                    for i in lo..hi {
                        let start = i.saturating_sub(n);
                        if retracts {
                            if !started {
                                update(&mut accs, start, i + 1)?;
                                started = true;
                            } else {
                                update(&mut accs, i, i + 1)?;
                                retract(&mut accs, a, start)?;
                            }
                            a = start;
                        } else {
                            accs = self.accumulators(false)?;
                            update(&mut accs, start, i + 1)?;
                        }
                        out_rows.push((t, rows[i].clone()));
                        out_values.push(output(evaluate(&mut accs)?, start, i + 1)?);
                    }
                }
            }
        }
        // Free what no later row's frame holds: later rows are after
        // `last_due` (earlier ones are late).
        let keep_from = match self.frame {
            OverFrame::Range(None) | OverFrame::Rows(None) => Timestamp::MAX,
            OverFrame::Range(Some(offset)) => last_due.saturating_add(1).saturating_sub(offset),
            // The entry holding the n-th last row on.
            OverFrame::Rows(Some(n)) => match times.len().checked_sub(n as usize) {
                Some(i) => times.get(i).map_or(Timestamp::MAX, |x| x.0),
                // Fewer rows than the frame: all stay.
                None => Timestamp::MIN,
            },
        };
        // A LAG reads the `offset` rows before a later row: they stay.
        let keep_from = match self.lags.iter().map(|l| l.offset).max() {
            Some(most) if most > 0 => match times.len().checked_sub(most) {
                Some(i) => keep_from.min(times.get(i).map_or(Timestamp::MAX, |x| x.0)),
                None => Timestamp::MIN,
            },
            _ => keep_from,
        };
        for (t, len) in &entries {
            if *t < keep_from {
                let ns = encode_time(*t);
                w.delete(
                    ROWS,
                    EntryRef {
                        key_group: group,
                        key,
                        namespace: &ns,
                    },
                    Some(*len),
                );
            }
        }
        w.put(KEY, entry, meta_len, encode_meta(last_due, new_acc.as_deref()));
        Ok(())
    }
}

impl Operator for OverAggregateOperator {
    fn name(&self) -> &str {
        "OverAggregate"
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        let batch = batch.into_inserts("OverAggregate")?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let times = self.times(&batch)?;
        let times = times.as_primitive::<TimestampMillisecondType>();
        if let Some(max) = times.iter().flatten().max() {
            self.metrics.max_event_time.fetch_max(max, Ordering::Relaxed);
        }
        let keys = KeyEncoder::encode_rows(self.key_encoder.as_ref(), &self.partition, &batch)?;
        let key_of = |i: usize| -> &[u8] { keys.as_ref().map_or(&[], |k| k.row(i)) };
        // The last time each key emitted (the bounded frames' late rule).
        let mut key_of_row: HashMap<&[u8], usize> = HashMap::new();
        let mut key_rows: Vec<usize> = vec![];
        for i in 0..n {
            key_of_row.entry(key_of(i)).or_insert_with(|| {
                key_rows.push(i);
                key_rows.len() - 1
            });
        }
        let key_refs: Vec<EntryRef> = key_rows
            .iter()
            .map(|&i| EntryRef {
                key_group: self.state.key_group(key_of(i)),
                key: key_of(i),
                namespace: &[],
            })
            .collect();
        let lasts = self
            .state
            .get(KEY, &key_refs)?
            .into_iter()
            .map(|v| decode_meta(v.as_deref()).map(|m| m.last))
            .collect::<Result<Vec<_>>>()?;
        let unbounded = matches!(self.frame, OverFrame::Range(None) | OverFrame::Rows(None));
        // Rows by (key, time), in arrival order.
        let mut parts: BTreeMap<(usize, Timestamp), Vec<usize>> = BTreeMap::new();
        let mut late = 0u64;
        for i in 0..n {
            let k = key_of_row[key_of(i)];
            let is_late = times.is_null(i) || {
                let t = times.value(i);
                if unbounded {
                    t <= self.watermark
                } else {
                    lasts[k].is_some_and(|l| t <= l)
                }
            };
            if is_late {
                late += 1;
                continue;
            }
            parts.entry((k, times.value(i))).or_default().push(i);
        }
        if late > 0 {
            self.metrics.late_rows_dropped.fetch_add(late, Ordering::Relaxed);
        }
        if parts.is_empty() {
            return Ok(());
        }
        let namespaces: Vec<[u8; 8]> = parts.keys().map(|(_, t)| encode_time(*t)).collect();
        let refs: Vec<EntryRef> = parts
            .keys()
            .zip(&namespaces)
            .map(|((k, _), ns)| EntryRef {
                namespace: ns,
                ..key_refs[*k]
            })
            .collect();
        let stored = self.state.get(ROWS, &refs)?;
        let encoded = self.codec.encode(batch.columns())?;
        let mut w = KeyedWrite::default();
        for ((((_, t), rows), e), old) in parts.iter().zip(&refs).zip(stored) {
            let old_len = old.as_ref().map(Vec::len);
            let mut value = old.unwrap_or_default();
            value.extend(RowList::encode(rows.iter().map(|r| encoded.row(*r))));
            if old_len.is_none() {
                w.add_timer(TIMERS, e.key_group, *t, e.key, e.namespace);
            }
            w.put(ROWS, *e, old_len, value);
        }
        self.state.write(w)?;
        Ok(())
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        loop {
            let due: Vec<Timer> = self.state.due_timers(TIMERS, watermark, FIRE_CHUNK)?;
            if due.is_empty() {
                return Ok(());
            }
            let more = due.len() == FIRE_CHUNK;
            // Due times per key, ascending.
            let mut per_key: BTreeMap<(KeyGroup, &[u8]), Vec<Timestamp>> = BTreeMap::new();
            for t in &due {
                per_key.entry((t.key_group, &t.key)).or_default().push(t.time);
            }
            let mut w = KeyedWrite::default();
            for t in &due {
                w.delete_timer(TIMERS, t);
            }
            let (mut rows, mut values) = (vec![], vec![]);
            for ((group, key), mut times) in per_key {
                times.sort_unstable();
                self.fire_key(group, key, &times, &mut w, &mut rows, &mut values)?;
            }
            self.state.write(w)?;
            if !rows.is_empty() {
                // Earlier times first (stable: a key's rows keep their order).
                let mut order: Vec<usize> = (0..rows.len()).collect();
                order.sort_by_key(|i| rows[*i].0);
                let mut columns = self.codec.decode(order.iter().map(|i| rows[*i].1.as_slice()))?;
                for (a, _) in self.outputs.iter().enumerate() {
                    let scalars = order.iter().map(|i| values[*i][a].clone());
                    columns.push(ScalarValue::iter_to_array(scalars)?);
                }
                out.emit(batch_with_schema(&self.schema, columns)?);
            }
            if !more {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::HeapBackend;
    use arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::Column;

    fn input() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    /// `SUM(v) OVER (PARTITION BY k ORDER BY ts <frame>)`.
    fn over(frame: OverFrame) -> OverAggregateOperator {
        let sum = AggregateExprBuilder::new(
            datafusion::functions_aggregate::sum::sum_udaf(),
            vec![Arc::new(Column::new("v", 2))],
        )
        .schema(input())
        .alias("s")
        .build()
        .expect("sum");
        let node = OverAggregateNode {
            partition: vec![Arc::new(Column::new("k", 0))],
            time_column: 1,
            frame,
            aggregates: vec![Arc::new(sum)],
            lags: vec![],
            outputs: vec![OverOutput::Aggregate(0)],
        };
        let mut fields: Vec<Field> = input().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new("s", DataType::Int64, true));
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        let metrics = Arc::new(NodeMetrics::new("over".into()));
        OverAggregateOperator::new(&node, &input(), Arc::new(Schema::new(fields)), state, metrics).expect("over")
    }

    fn feed(op: &mut OverAggregateOperator, rows: &[(&str, i64, i64)], out: &mut Collector) {
        let batch = RecordBatch::try_new(
            input(),
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(TimestampMillisecondArray::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .expect("rows");
        op.process_batch(ChangeBatch::from(batch), out).expect("process");
    }

    /// A long run with the watermark advancing: only the rows a later
    /// frame can hold stay, so state is flat for every frame kind, and
    /// every row is emitted once with the right sum.
    #[test]
    fn state_stays_bounded_as_the_watermark_advances() {
        for frame in [
            OverFrame::Range(Some(100)),
            OverFrame::Rows(Some(3)),
            OverFrame::Range(None),
            OverFrame::Rows(None),
        ] {
            let mut op = over(frame);
            let mut out = Collector::default();
            let keys = ["a", "b", "c", "d"];
            let (mut emitted, mut peak_late, mut at_round_5) = (0usize, 0, 0);
            for round in 0..60i64 {
                let base = round * 1000;
                let rows: Vec<(&str, i64, i64)> = (0..100).map(|i| (keys[i % 4], base + i as i64 * 10, 1)).collect();
                feed(&mut op, &rows, &mut out);
                op.on_watermark(base + 500, &mut out).expect("watermark");
                for b in out.take() {
                    let b = b.into_inserts("test").expect("inserts");
                    let sums = b.column(3).as_primitive::<arrow::datatypes::Int64Type>();
                    for i in 0..b.num_rows() {
                        let expected = match frame {
                            // Each key has a row every 40 ms: 3 in 100 ms.
                            OverFrame::Range(Some(_)) if emitted >= 8 => 3,
                            OverFrame::Rows(Some(_)) if emitted >= 12 => 4,
                            _ => sums.value(i),
                        };
                        assert_eq!(sums.value(i), expected, "{frame:?}");
                        emitted += 1;
                    }
                }
                let bytes = op.state.size_bytes();
                assert_eq!(bytes, op.state.counted_bytes().expect("count"), "{frame:?}");
                if round == 5 {
                    at_round_5 = bytes;
                }
                if round > 10 {
                    peak_late = peak_late.max(bytes);
                }
            }
            op.on_watermark(crate::message::MAX_WATERMARK, &mut out).expect("end");
            emitted += out.take().iter().map(|b| b.num_rows()).sum::<usize>();
            assert!(at_round_5 > 0, "{frame:?}");
            assert!(
                peak_late <= at_round_5 * 2,
                "{frame:?}: state grew with the input: {at_round_5} bytes at round 5, up to {peak_late} later"
            );
            assert_eq!(emitted, 6000, "{frame:?}: every row once");
        }
    }
}
