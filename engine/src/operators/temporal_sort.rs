//! `ORDER BY rowtime [, ...]` on a stream (Flink's `RowTimeSortOperator`):
//! rows are held until the watermark passes their time, then emitted in
//! time order, rows of one time sorted by the other ORDER BY keys (ties in
//! arrival order). Insert-only in and out; one subtask (a total order).
//!
//! Late is Flink's rule: a row at or before the last time emitted is
//! dropped and counted. A row behind the watermark but after that time is
//! kept and emitted at the next watermark (its timer is already due).
//!
//! State, through the keyed-state layer (one key, the empty one):
//! `temporal-sort-rows` (value: namespace = the time → the rows of that
//! time in arrival order, each in Weir's row encoding behind its length;
//! the empty namespace → the last time emitted) and `temporal-sort-timers`
//! (an event-time timer per time).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use hashbrown::HashMap;

use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::message::Timestamp;
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::rank::{compare_sort_keys, sort_keys_of};
use crate::operators::{Collector, Operator};
use crate::plan::TemporalSortNode;
use crate::plan::{PlanNode, StateKeys, StreamNode, canonical_order};
use crate::state::codec::{RowCodec, RowList};
use crate::state::keyed::{decode_time, encode_time};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

const ROWS: usize = 0;
const TIMERS: usize = 1;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "temporal-sort-rows",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "temporal-sort-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Times fired per state read.
const FIRE_CHUNK: usize = 4096;

pub struct TemporalSortOperator {
    node: TemporalSortNode,
    codec: RowCodec,
    schema: SchemaRef,
    state: KeyedState,
    /// The one key's group.
    group: u16,
    /// The last time emitted: rows at or before it are late.
    last_fired: Timestamp,
    metrics: Arc<crate::runtime::metrics::NodeMetrics>,
}

impl PlanNode for TemporalSortNode {
    fn describe(&self) -> String {
        format!(
            "TemporalSort: ${} ASC{}",
            self.time_column,
            self.order.iter().map(|k| format!(", {k}")).collect::<String>()
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some("rows by time until the watermark passes it (one key; a timer per time)".into())
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "temporal_sort",
            format!("time={};order={}", self.time_column, canonical_order(&self.order)),
        )
    }

    // Rows wait for the watermark under one key.
    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&[])
    }
}

/// The operator of a rowtime sort's subtask.
pub fn build(node: &TemporalSortNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(TemporalSortOperator::new(
        node,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl TemporalSortOperator {
    pub fn new(
        node: &TemporalSortNode,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<crate::runtime::metrics::NodeMetrics>,
    ) -> Result<Self> {
        let types: Vec<_> = schema.fields().iter().map(|f| f.data_type().clone()).collect();
        let group = state.key_group(&[]);
        // A restored job goes on from the time it last emitted.
        let last = state.get(ROWS, &[last_fired_entry(group)])?.pop().flatten();
        let last_fired = match last {
            Some(b) => decode_time(b.as_slice().try_into().map_err(|_| Self::corrupt(b.len()))?),
            None => Timestamp::MIN,
        };
        Ok(Self {
            node: node.clone(),
            codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            schema,
            state,
            group,
            last_fired,
            metrics,
        })
    }

    /// The entries of the rows of some times (their encoded namespaces).
    fn entries<'a>(&self, namespaces: &'a [[u8; 8]]) -> Vec<EntryRef<'a>> {
        namespaces
            .iter()
            .map(|ns| EntryRef {
                key_group: self.group,
                key: &[],
                namespace: ns,
            })
            .collect()
    }

    fn corrupt(len: usize) -> StateError {
        StateError::Corrupt {
            state: STATES[ROWS].name.into(),
            message: format!("a time's rows of {len} bytes are cut short"),
        }
    }

    /// The rows of one time in output order: by the other sort keys,
    /// arrival order among ties.
    fn sorted(&self, rows: Vec<&[u8]>) -> Result<Vec<Vec<u8>>> {
        if self.node.order.is_empty() || rows.len() < 2 {
            return Ok(rows.into_iter().map(<[u8]>::to_vec).collect());
        }
        let cols = self.codec.decode(rows.iter().copied())?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        let batch = RecordBatch::try_new_with_options(self.schema.clone(), cols, &options)?;
        let keys = sort_keys_of(&self.node.order, &batch)?;
        let mut idx: Vec<usize> = (0..rows.len()).collect();
        idx.sort_by(|a, b| compare_sort_keys(&self.node.order, &keys[*a], &keys[*b]));
        Ok(idx.into_iter().map(|i| rows[i].to_vec()).collect())
    }
}

/// Where the last time emitted is kept: the empty namespace.
fn last_fired_entry(group: u16) -> EntryRef<'static> {
    EntryRef {
        key_group: group,
        key: &[],
        namespace: &[],
    }
}

impl Operator for TemporalSortOperator {
    fn name(&self) -> &str {
        "TemporalSort"
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        let batch = batch.into_inserts("TemporalSort")?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let times = batch.column(self.node.time_column);
        let times = match times.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, None) => times.clone(),
            _ => cast(times, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        };
        let times = times.as_primitive::<TimestampMillisecondType>();
        let rows = self.codec.encode(batch.columns())?;
        // New rows per time, in arrival order.
        let mut by_time: HashMap<Timestamp, Vec<usize>> = HashMap::new();
        let mut order: Vec<Timestamp> = vec![];
        let mut late = 0u64;
        for i in 0..n {
            if times.is_null(i) || times.value(i) <= self.last_fired {
                late += 1;
                continue;
            }
            let t = times.value(i);
            by_time
                .entry(t)
                .or_insert_with(|| {
                    order.push(t);
                    vec![]
                })
                .push(i);
        }
        if late > 0 {
            self.metrics.late_rows_dropped.fetch_add(late, Ordering::Relaxed);
        }
        if order.is_empty() {
            return Ok(());
        }
        let namespaces: Vec<[u8; 8]> = order.iter().map(|t| encode_time(*t)).collect();
        let refs = self.entries(&namespaces);
        let stored = self.state.get(ROWS, &refs)?;
        let mut w = KeyedWrite::default();
        for ((t, e), old) in order.iter().zip(&refs).zip(stored) {
            let old_len = old.as_ref().map(Vec::len);
            let mut value = old.unwrap_or_default();
            value.extend_from_slice(&RowList::encode(by_time[t].iter().map(|i| rows.row(*i))));
            if old_len.is_none() {
                w.add_timer(TIMERS, self.group, *t, &[], &[]);
            }
            w.put(ROWS, *e, old_len, value);
        }
        self.state.write(w)?;
        Ok(())
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        loop {
            let mut due: Vec<Timer> = self.state.due_timers(TIMERS, watermark, FIRE_CHUNK)?;
            if due.is_empty() {
                return Ok(());
            }
            // One key: one key group, already in time order.
            due.sort_by_key(|t| t.time);
            let namespaces: Vec<[u8; 8]> = due.iter().map(|t| encode_time(t.time)).collect();
            let refs = self.entries(&namespaces);
            let stored = self.state.get(ROWS, &refs)?;
            let mut w = KeyedWrite::default();
            let mut emitted: Vec<Vec<u8>> = vec![];
            for ((timer, e), value) in due.iter().zip(&refs).zip(stored) {
                w.delete_timer(TIMERS, timer);
                let Some(value) = value else { continue };
                w.delete(ROWS, *e, Some(value.len()));
                let rows = RowList::decode(&value).ok_or_else(|| Self::corrupt(value.len()))?;
                emitted.extend(self.sorted(rows)?);
            }
            if let Some(last) = due.last() {
                // Stored once anything fired (or was restored).
                let old = (self.last_fired != Timestamp::MIN).then_some(8);
                self.last_fired = self.last_fired.max(last.time);
                w.put(
                    ROWS,
                    last_fired_entry(self.group),
                    old,
                    encode_time(self.last_fired).to_vec(),
                );
            }
            self.state.write(w)?;
            if !emitted.is_empty() {
                let columns = self.codec.decode(emitted.iter().map(Vec::as_slice))?;
                out.emit(batch_with_schema(&self.schema, columns)?);
            }
            if due.len() < FIRE_CHUNK {
                return Ok(());
            }
        }
    }
}
