//! Window Top-N and window deduplication: `ROW_NUMBER() OVER (PARTITION BY
//! window_start, window_end, ... ORDER BY ...)` filtered to the first N,
//! over a window TVF or a window aggregate (Flink's `WindowRankOperator`
//! and `RowTimeWindowDeduplicateOperator`). Append-only: a window's top N
//! are emitted once, `+I`, when the watermark passes the window's end, and
//! its state is freed then.
//!
//! Per row, in arrival order:
//! - a row of a window that has fired (`window_end - 1 <= watermark`) is
//!   late: dropped and counted;
//! - otherwise it joins its partition's rows, after the rows it ties with
//!   (the earlier arrival ranks first), and only the first N are kept (a
//!   row that fell out can never come back: the input is insert-only).
//!   Window deduplication keeping the last row puts a row before its ties
//!   instead (a later row of equal time replaces the kept one).
//!
//! State, through the keyed-state layer: `window-rank-rows` (value: key =
//! the partition, which holds the window's bounds → its kept rows in rank
//! order, each in Weir's row encoding behind its length) and
//! `window-rank-timers` (an event-time timer per partition at
//! `window_end - 1`, Flink's `maxTimestamp`).

use std::cmp::Ordering as CmpOrdering;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, AsArray, UInt64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::ScalarValue;
use datafusion::physical_expr::PhysicalExpr;
use hashbrown::HashMap;

use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::KeyEncoder;
use crate::message::Timestamp;
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::rank::{compare_sort_keys, sort_keys_of};
use crate::operators::{Collector, Operator};
use crate::plan::{RankNode, SortKey};
use crate::state::codec::{RowCodec, RowList};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

const ROWS: usize = 0;
const TIMERS: usize = 1;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "window-rank-rows",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "window-rank-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Windows fired per state read.
const FIRE_CHUNK: usize = 4096;

pub struct WindowRankOperator {
    partition: Vec<Arc<dyn PhysicalExpr>>,
    key_encoder: KeyEncoder,
    order: Vec<SortKey>,
    limit: usize,
    /// A row goes before the rows it ties with (keep-last deduplication).
    later_ties_first: bool,
    /// The input column holding `window_end`.
    end_column: usize,
    input_schema: SchemaRef,
    codec: RowCodec,
    schema: SchemaRef,
    state: KeyedState,
    watermark: Timestamp,
    /// Windows on the wall clock of this zone (the node's `zone`).
    zone: Option<arrow::array::timezone::Tz>,
    metrics: Arc<crate::runtime::metrics::NodeMetrics>,
}

/// A partition met by the batch: its kept rows (sort key, bytes).
struct Part {
    first: usize,
    group: u16,
    /// The window's last millisecond (its timer).
    fires_at: Timestamp,
    rows: Vec<(Vec<ScalarValue>, Vec<u8>)>,
    stored_len: Option<usize>,
    changed: bool,
}

/// The operator of a window Top-N's subtask (`end`: the `window_end`
/// column; `later_ties_first`: see [`crate::plan::RankStrategy::Window`]).
pub fn build(node: &RankNode, end: usize, later_ties_first: bool, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(WindowRankOperator::new(
        node,
        end,
        later_ties_first,
        &ctx.input_schema()?,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl WindowRankOperator {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: &RankNode,
        end_column: usize,
        later_ties_first: bool,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<crate::runtime::metrics::NodeMetrics>,
    ) -> Result<Self> {
        let types: Vec<_> = input_schema.fields().iter().map(|f| f.data_type().clone()).collect();
        Ok(Self {
            partition: node.partition.clone(),
            key_encoder: KeyEncoder::for_keys(&node.partition, input_schema)?
                .ok_or_else(|| ExecError::internal("a window rank without its window in the partition"))?,
            order: node.order.clone(),
            limit: node.limit.max(1),
            later_ties_first,
            end_column,
            input_schema: input_schema.clone(),
            codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            schema,
            state,
            watermark: Timestamp::MIN,
            zone: node.zone.as_ref().map(|z| z.tz),
            metrics,
        })
    }

    /// The kept rows of a stored value, with their sort keys.
    fn decode(&self, bytes: &[u8]) -> Result<Vec<(Vec<ScalarValue>, Vec<u8>)>> {
        let rows = RowList::decode(bytes).ok_or_else(|| StateError::Corrupt {
            state: STATES[ROWS].name.into(),
            message: format!("a partition of {} bytes is cut short", bytes.len()),
        })?;
        let cols = self.codec.decode(rows.iter().copied())?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        let batch = RecordBatch::try_new_with_options(self.input_schema.clone(), cols, &options)?;
        Ok(sort_keys_of(&self.order, &batch)?
            .into_iter()
            .zip(rows)
            .map(|(k, r)| (k, r.to_vec()))
            .collect())
    }

    /// Where a row with sort key `key` goes among `rows`: after its ties,
    /// or before them for keep-last deduplication.
    fn position(&self, rows: &[(Vec<ScalarValue>, Vec<u8>)], key: &[ScalarValue]) -> usize {
        rows.partition_point(|(k, _)| match compare_sort_keys(&self.order, k, key) {
            CmpOrdering::Less => true,
            CmpOrdering::Equal => !self.later_ties_first,
            CmpOrdering::Greater => false,
        })
    }
}

impl Operator for WindowRankOperator {
    fn name(&self) -> &str {
        "WindowRank"
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        let batch = batch.into_inserts("WindowRank")?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let ends = batch.column(self.end_column);
        let ends = match ends.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, None) => ends.clone(),
            _ => cast(ends, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        };
        let ends = ends.as_primitive::<TimestampMillisecondType>();
        let keys = self
            .partition
            .iter()
            .map(|k| k.evaluate(&batch).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = self.key_encoder.encode(&keys)?;
        let sorts = sort_keys_of(&self.order, &batch)?;
        let rows = self.codec.encode(batch.columns())?;

        let mut late = 0u64;
        let mut part_of: HashMap<&[u8], usize> = HashMap::new();
        let mut parts: Vec<Part> = vec![];
        let mut row_part = Vec::with_capacity(n);
        for i in 0..n {
            // A window's last millisecond at or before the watermark: fired.
            let fires_at = if ends.is_null(i) {
                None
            } else {
                Some(ends.value(i).saturating_sub(1))
            };
            let Some(fires_at) = fires_at.filter(|t| *t > self.watermark) else {
                late += 1;
                row_part.push(None);
                continue;
            };
            let k = keys.row(i);
            let p = *part_of.entry(k).or_insert_with(|| {
                parts.push(Part {
                    first: i,
                    group: self.state.key_group(k),
                    fires_at,
                    rows: vec![],
                    stored_len: None,
                    changed: false,
                });
                parts.len() - 1
            });
            row_part.push(Some(p));
        }
        if late > 0 {
            self.metrics.late_rows_dropped.fetch_add(late, Ordering::Relaxed);
        }
        if parts.is_empty() {
            return Ok(());
        }
        let refs: Vec<EntryRef> = parts
            .iter()
            .map(|p| EntryRef {
                key_group: p.group,
                key: keys.row(p.first),
                namespace: &[],
            })
            .collect();
        for (part, stored) in parts.iter_mut().zip(self.state.get(ROWS, &refs)?) {
            if let Some(v) = stored {
                part.stored_len = Some(v.len());
                part.rows = self.decode(&v)?;
            }
        }
        for (i, p) in row_part.iter().enumerate() {
            let Some(p) = p else { continue };
            let at = self.position(&parts[*p].rows, &sorts[i]);
            if at >= self.limit {
                continue;
            }
            let part = &mut parts[*p];
            part.rows.insert(at, (sorts[i].clone(), rows.row(i).to_vec()));
            part.rows.truncate(self.limit);
            part.changed = true;
        }

        let mut w = KeyedWrite::default();
        for (part, e) in parts.iter().zip(&refs) {
            if !part.changed {
                continue;
            }
            let value = RowList::encode(part.rows.iter().map(|(_, r)| r.as_slice()));
            if part.stored_len.is_none() {
                w.add_timer(TIMERS, part.group, part.fires_at, e.key, &[]);
            }
            w.put(ROWS, *e, part.stored_len, value);
        }
        self.state.write(w)?;
        Ok(())
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        // Wall-clock windows complete on the wall clock.
        let watermark = crate::time_zone::watermark_in(watermark, self.zone.as_ref());
        self.watermark = self.watermark.max(watermark);
        loop {
            let mut due: Vec<Timer> = self.state.due_timers(TIMERS, watermark, FIRE_CHUNK)?;
            if due.is_empty() {
                return Ok(());
            }
            // Timers come key group by key group: earlier windows first, as
            // Flink fires them (in time order within a chunk).
            due.sort_by_key(|t| t.time);
            let refs: Vec<EntryRef> = due
                .iter()
                .map(|t| EntryRef {
                    key_group: t.key_group,
                    key: &t.key,
                    namespace: &[],
                })
                .collect();
            let stored = self.state.get(ROWS, &refs)?;
            let mut w = KeyedWrite::default();
            let mut emitted: Vec<Vec<u8>> = vec![];
            let mut ranks: Vec<u64> = vec![];
            for ((timer, e), value) in due.iter().zip(&refs).zip(stored) {
                w.delete_timer(TIMERS, timer);
                let Some(value) = value else { continue };
                w.delete(ROWS, *e, Some(value.len()));
                let rows = RowList::decode(&value).ok_or_else(|| StateError::Corrupt {
                    state: STATES[ROWS].name.into(),
                    message: format!("a partition of {} bytes is cut short", value.len()),
                })?;
                for (r, row) in rows.into_iter().enumerate() {
                    emitted.push(row.to_vec());
                    ranks.push(r as u64 + 1);
                }
            }
            self.state.write(w)?;
            if !emitted.is_empty() {
                let mut columns = self.codec.decode(emitted.iter().map(Vec::as_slice))?;
                // The rank column, when the plan keeps it.
                if self.schema.fields().len() > columns.len() {
                    columns.push(Arc::new(UInt64Array::from(ranks)));
                }
                out.emit(batch_with_schema(&self.schema, columns)?);
            }
            if due.len() < FIRE_CHUNK {
                return Ok(());
            }
        }
    }
}
