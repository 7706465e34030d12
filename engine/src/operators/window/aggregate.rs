//! Window aggregation (`GROUP BY window_start, window_end, keys...` over a
//! TUMBLE/HOP/CUMULATE window TVF, or the legacy `GROUP BY TUMBLE(...)`).
//!
//! State, per subtask, in one of two stores:
//!
//! **RocksDB** (`state.backend.type = rocksdb`), through the keyed-state
//! layer ([`KeyedState`]):
//! - `window-acc` (value state): key, namespace = window end → the
//!   DataFusion accumulator state of every aggregate, in Weir's row
//!   encoding;
//! - `window-timers` (timers): an event-time timer per (key, window) at the
//!   window's last millisecond (`end - 1`, Flink's `maxTimestamp`).
//!
//! Rows first pre-aggregate in memory (the same live panes as the heap
//! store; Flink's window buffer), so RocksDB sees one read and one write
//! per (key, window) per flush, not per row. A flush — at every snapshot,
//! and when the buffer holds `table.exec.window-agg.buffer-size-limit`
//! groups (500 000) — fetches the stored
//! states of all buffered groups with one multi-get per window, merges
//! them into the buffer's accumulators, and writes them back in one write
//! batch with a timer for each new group. A window due to fire whose end
//! was never flushed (nor restored) fires straight from the buffer; one
//! that was is flushed first and fires from RocksDB.
//!
//! **Heap** (`hashmap`): live accumulators, one pane per window end
//! ([`super::panes`]); a batch updates them in place and a window fires by
//! evaluating its pane. They become bytes only at a snapshot, in the same
//! canonical entries the RocksDB store exports, so either store restores
//! the other's snapshots at any parallelism.
//!
//! On watermark `w`: every window with `end - 1 <= w` fires (Flink's rule),
//! its result is emitted and its state deleted, before `w` moves on.
//! Rows are late when every window containing them has fired: they are
//! dropped and counted (`late_rows_dropped`).

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
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

use super::panes::{KeyHasher, Pane, Panes};
use super::slices::{Frozen, Slicer, Slices, pane_bytes};
use super::{assign_windows, is_fired, window_start};
use crate::canonical::{aggregate_extras, canonical_exprs};
use crate::checkpoint::OperatorSnapshot;
use crate::clock::Clock;
use crate::error::{ExecError, Result};
use crate::keygroup::{KeyEncoder, KeyGroup, key_group};
use crate::message::{MIN_WATERMARK, Timestamp};
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{ChangelogMode, PlanNode, StateKeys, StreamNode, WindowKind};
use crate::plan::{GroupOutput, WindowAggregateNode, WindowSpec};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::RowCodec;
use crate::state::keyed::{decode_time, encode_time};
use crate::state::{
    EntryRef, KeyedEntries, KeyedState, KeyedWrite, RestoredEntry, StateDecl, StateKind, StateSource, Timer,
    restored_entries,
};

const ACC: usize = 0;
const TIMERS: usize = 1;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "window-acc",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "window-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Windows fired per state round trip; bounds memory when a watermark
/// jump fires many windows at once.
const FIRE_CHUNK: usize = 8192;

/// A restored window's keys and encoded accumulator states.
type RestoredPane = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Bytes a live group is counted as (key aside) in the state-size metric.
const LIVE_GROUP_BYTES: i64 = 32;

/// Where the windows live.
pub enum WindowStore {
    /// Bytes in a state backend (RocksDB), through the keyed-state layer,
    /// behind an in-memory pre-aggregation buffer of `buffered` groups.
    Keyed {
        /// Boxed: the keyed state is most of the enum's size.
        state: Box<KeyedState>,
        buffer: Panes,
        buffered: usize,
        /// Groups buffered before a flush
        /// (`table.exec.window-agg.buffer-size-limit`).
        limit: usize,
        /// Window ends RocksDB may hold state of (flushed): a buffered
        /// window of any other end fires from memory alone...
        spilled: BTreeSet<i64>,
        /// ...unless it ends at or before this, the latest end of the
        /// restored windows.
        restored_until: Option<i64>,
    },
    /// Live accumulators on the heap, owning `groups`.
    Live { panes: Panes, groups: Range<KeyGroup> },
}

impl WindowStore {
    /// The RocksDB store, with an empty buffer.
    pub fn keyed(state: KeyedState, limit: usize) -> Result<Self> {
        // Restored windows are in RocksDB: a window ending no later than
        // the last of them may have state there.
        let restored_until = state.max_timer_time(TIMERS)?.map(|t| t.saturating_add(1));
        Ok(WindowStore::Keyed {
            state: Box::new(state),
            buffer: Panes::default(),
            buffered: 0,
            limit: limit.max(1),
            spilled: BTreeSet::new(),
            restored_until,
        })
    }
}

/// The aggregates of the operator: their accumulators and how their state
/// becomes bytes.
pub(super) struct Aggs {
    aggregates: Vec<Arc<AggregateFunctionExpr>>,
    /// Types of each aggregate's state columns, in order.
    state_types: Vec<Vec<DataType>>,
    state_codec: RowCodec,
}

impl Aggs {
    pub(super) fn new(aggregates: &[Arc<AggregateFunctionExpr>]) -> Result<Self> {
        let state_types = aggregates
            .iter()
            .map(|a| {
                a.state_fields()
                    .map(|fs| fs.iter().map(|f| f.data_type().clone()).collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let flat: Vec<DataType> = state_types.iter().flatten().cloned().collect();
        let state_codec = RowCodec::new(&flat).map_err(|m| {
            let names: Vec<&str> = aggregates.iter().map(|a| a.name()).collect();
            ExecError::Config(format!("window aggregate [{}]: {m}", names.join(", ")))
        })?;
        Ok(Self {
            aggregates: aggregates.to_vec(),
            state_types,
            state_codec,
        })
    }

    pub(super) fn accumulators(&self) -> Result<Vec<Box<dyn GroupsAccumulator>>> {
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

    /// Merges encoded states (one per group) into `accs`.
    pub(super) fn merge_stored(
        &self,
        accs: &mut [Box<dyn GroupsAccumulator>],
        stored: &[&[u8]],
        groups: &[usize],
        total_groups: usize,
    ) -> Result<()> {
        if stored.is_empty() {
            return Ok(());
        }
        let columns = self.state_codec.decode(stored.iter().copied())?;
        self.merge_columns(accs, &columns, groups, total_groups)
    }

    fn merge_columns(
        &self,
        accs: &mut [Box<dyn GroupsAccumulator>],
        columns: &[ArrayRef],
        groups: &[usize],
        total_groups: usize,
    ) -> Result<()> {
        let mut offset = 0;
        for (acc, types) in accs.iter_mut().zip(&self.state_types) {
            let cols = &columns[offset..offset + types.len()];
            offset += types.len();
            acc.merge_batch(cols, groups, total_groups)?;
        }
        Ok(())
    }

    /// The state columns of every group of `accs` (which it empties).
    fn state_columns(&self, accs: &mut [Box<dyn GroupsAccumulator>]) -> Result<Vec<ArrayRef>> {
        let mut columns: Vec<ArrayRef> = vec![];
        for (acc, types) in accs.iter_mut().zip(&self.state_types) {
            for (col, ty) in acc.state(EmitTo::All)?.into_iter().zip(types) {
                columns.push(if col.data_type() == ty { col } else { cast(&col, ty)? });
            }
        }
        Ok(columns)
    }

    /// Encodes the state of every group of `accs` (which it empties).
    pub(super) fn encode_states(&self, accs: &mut [Box<dyn GroupsAccumulator>]) -> Result<Vec<Vec<u8>>> {
        let columns = self.state_columns(accs)?;
        let rows = self.state_codec.encode(&columns)?;
        Ok(rows.iter().map(<[u8]>::to_vec).collect())
    }

    /// The values each aggregate reads from `batch`, evaluated once per
    /// batch (each window's rows are then taken from them).
    pub(super) fn evaluate(&self, batch: &RecordBatch) -> Result<Vec<Vec<ArrayRef>>> {
        let n = batch.num_rows();
        self.aggregates
            .iter()
            .map(|agg| {
                agg.expressions()
                    .iter()
                    .map(|e| Ok(e.evaluate(batch)?.into_array(n)?))
                    .collect::<Result<Vec<_>>>()
            })
            .collect()
    }
}

pub struct WindowAggregateOperator {
    name: String,
    window: WindowSpec,
    time_column: usize,
    /// Windows on processing time: rows take the clock, the clock fires.
    proctime: bool,
    /// The job's processing-time clock.
    clock: Clock,
    /// Rows of a window aggregate: the time column is each row's window
    /// end, its one window.
    attached: bool,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    key_encoder: Option<KeyEncoder>,
    group_outputs: Vec<GroupOutput>,
    aggs: Aggs,
    schema: SchemaRef,
    max_parallelism: u16,
    store: WindowStore,
    watermark: Timestamp,
    metrics: Arc<NodeMetrics>,
    /// This subtask's state bytes in memory (panes, slices, the RocksDB
    /// store's buffer; its keyed state counts its own), for the metric and
    /// the state-per-event-time estimate.
    live_bytes: i64,
    /// Hashes group keys for the panes' indexes.
    hasher: KeyHasher,
    /// HOP and CUMULATE: rows go to slices, windows are merged from them.
    slicer: Option<Slicer>,
    slices: Slices,
    max_ts: Timestamp,
    parallelism: usize,
    /// Windows on the wall clock of this zone ([`WindowAggregateNode::zone`]).
    zone: Option<arrow::array::timezone::Tz>,
}

impl PlanNode for WindowAggregateNode {
    fn describe(&self) -> String {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        let aggs: Vec<String> = self.aggregates.iter().map(|a| a.name().to_string()).collect();
        format!(
            "WindowAggregate: {}{}{} keys [{}] aggregates [{}]",
            self.window,
            if self.proctime {
                " on processing time"
            } else if self.attached {
                " of the input's windows"
            } else {
                ""
            },
            self.zone
                .as_ref()
                .map(|z| format!(" in time zone {}", z.id))
                .unwrap_or_default(),
            keys.join(", "),
            aggs.join(", ")
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some(if self.window.kind == WindowKind::Session {
            "each key's open sessions (bounds, accumulators) by key group|key; a timer per session at its end - 1, when it fires and is freed".into()
        } else if self.proctime {
            "accumulators by key group|key|window end; rows take the operator's clock, windows fire when the clock passes their end".into()
        } else {
            "accumulators by key group|key|window end, event-time timers; fires when the watermark passes a window end"
                .into()
        })
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "window",
            format!(
                "{:?}:{}:{}:{};time=#{};keys={};aggs={}",
                self.window.kind,
                self.window.size,
                self.window.slide,
                self.window.offset,
                self.time_column,
                canonical_exprs(&self.keys),
                self.aggregates
                    .iter()
                    .map(|a| format!(
                        "{}{}({}){}",
                        a.fun().name().to_ascii_lowercase(),
                        if a.is_distinct() { " distinct" } else { "" },
                        canonical_exprs(&a.expressions()),
                        aggregate_extras(a)
                    ))
                    .collect::<Vec<_>>()
                    .join(",")
            ) + &window_outputs(&self.group_outputs)
                + if self.proctime { ";proctime" } else { "" }
                + if self.attached { ";attached" } else { "" },
        )
    }

    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.keys)
    }

    fn changelog(&self, _: &ChangelogMode) -> ChangelogMode {
        ChangelogMode::insert_only()
    }
}

/// A window aggregate's grouping outputs when its window columns are not
/// in the order start, end, time (`GROUP BY window_end, window_start`
/// swaps two columns of one type: the same output types, another
/// meaning for every node downstream). Keys keep their GROUP BY order.
fn window_outputs(outputs: &[GroupOutput]) -> String {
    let rank = |o: &GroupOutput| match o {
        GroupOutput::WindowStart => Some(0),
        GroupOutput::WindowEnd => Some(1),
        GroupOutput::WindowTime => Some(2),
        GroupOutput::Key(_) => None,
    };
    let parts: Vec<i32> = outputs.iter().filter_map(rank).collect();
    if parts.windows(2).all(|p| p[0] < p[1]) {
        return String::new();
    }
    let cols: Vec<String> = outputs
        .iter()
        .map(|o| match o {
            GroupOutput::WindowStart => "start".to_string(),
            GroupOutput::WindowEnd => "end".to_string(),
            GroupOutput::WindowTime => "time".to_string(),
            GroupOutput::Key(i) => format!("k{i}"),
        })
        .collect();
    format!(";outputs={}", cols.join(","))
}

/// The operator of a TUMBLE/HOP/CUMULATE window aggregate's subtask.
pub fn build(node: &crate::plan::WindowAggregateNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let groups = ctx.key_groups();
    let sources = ctx.restored_keyed();
    // RocksDB: bytes through the keyed-state layer; heap: live
    // accumulators, filled from the same canonical state.
    let store = if ctx.rocksdb() {
        WindowStore::keyed(ctx.open_keyed(STATES)?, ctx.config.window_buffer_limit)?
    } else {
        WindowStore::Live {
            panes: Default::default(),
            groups: groups.clone(),
        }
    };
    let mut op = WindowAggregateOperator::new(
        node,
        &ctx.input_schema()?,
        ctx.schema(),
        ctx.max_parallelism(),
        store,
        ctx.metrics.clone(),
        ctx.node().parallelism,
    )?;
    if !ctx.config.window_slicing {
        op = op.without_slicing();
    }
    op.clock = ctx.clock();
    if !ctx.rocksdb() && !sources.is_empty() {
        op.restore_live(groups, sources)?;
    }
    Ok(Box::new(op))
}

impl WindowAggregateOperator {
    pub fn new(
        node: &WindowAggregateNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        max_parallelism: u16,
        store: WindowStore,
        metrics: Arc<NodeMetrics>,
        parallelism: usize,
    ) -> Result<Self> {
        let key_encoder = KeyEncoder::for_keys(&node.keys, input_schema)?;
        Ok(Self {
            name: format!("WindowAggregate {}", node.window),
            window: node.window,
            time_column: node.time_column,
            proctime: node.proctime,
            clock: Clock::Wall,
            attached: node.attached,
            keys: node.keys.clone(),
            key_encoder,
            group_outputs: node.group_outputs.clone(),
            aggs: Aggs::new(&node.aggregates)?,
            schema,
            max_parallelism,
            store,
            watermark: MIN_WATERMARK,
            metrics,
            live_bytes: 0,
            hasher: KeyHasher::default(),
            // An attached row is already in its window: nothing to slice.
            slicer: if node.attached { None } else { Slicer::new(&node.window) },
            slices: Slices::default(),
            max_ts: MIN_WATERMARK,
            parallelism,
            zone: node.zone.as_ref().map(|z| z.tz),
        })
    }

    /// Turns slicing off (`table.exec.window-agg.slicing` = false): every
    /// row updates each of its windows.
    pub fn without_slicing(mut self) -> Self {
        self.slicer = None;
        self
    }

    /// The heap store for key groups `groups`, filled from `sources`
    /// (canonical entries or RocksDB checkpoints of any parallelism).
    pub fn restore_live(&mut self, groups: Range<KeyGroup>, sources: &[StateSource]) -> Result<()> {
        // Window end → (keys, encoded accumulator states).
        let mut by_end: HashMap<i64, RestoredPane> = HashMap::new();
        // The accumulators' namespace is the window end.
        restored_entries(sources, groups.clone(), STATES, &[8, 0], &mut |entry| {
            // Every live group has its timer: implied.
            let RestoredEntry::Value { entry, value, .. } = entry else {
                return Ok(());
            };
            let end = decode_time(entry.namespace.try_into().unwrap_or_default());
            let e = by_end.entry(end).or_default();
            e.0.push(entry.key.to_vec());
            e.1.push(value.to_vec());
            Ok(())
        })?;
        let mut panes = Panes::default();
        let mut bytes = 0i64;
        for (end, (keys, values)) in by_end {
            let pane = panes.pane(end);
            let mut idx = Vec::with_capacity(keys.len());
            for k in &keys {
                idx.push(
                    pane.group(k, self.hasher.hash(k), || key_group(k, self.max_parallelism))
                        .0,
                );
                bytes += k.len() as i64 + LIVE_GROUP_BYTES;
            }
            let mut accs = self.aggs.accumulators()?;
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            self.aggs.merge_stored(&mut accs, &refs, &idx, pane.len())?;
            pane.accs = accs;
        }
        self.metrics.state_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.live_bytes += bytes;
        self.store = WindowStore::Live { panes, groups };
        Ok(())
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
        if let WindowStore::Live { panes, .. } = &mut self.store {
            let mut fired = vec![];
            while let Some(p) = panes.pop_fired(up_to) {
                fired.push(p);
            }
            for (end, pane) in fired {
                self.emit_pane(end, pane, out)?;
            }
            return Ok(());
        }
        // Buffered windows due now: from memory if RocksDB holds nothing
        // of their end, else merged into RocksDB to fire with the rest.
        let mut from_memory = vec![];
        if let WindowStore::Keyed {
            state,
            buffer,
            buffered,
            spilled,
            restored_until,
            ..
        } = &mut self.store
        {
            while let Some((end, pane)) = buffer.pop_fired(up_to) {
                *buffered = buffered.saturating_sub(pane.len());
                if spilled.contains(&end) || restored_until.is_some_and(|u| end <= u) {
                    let moved = flush_pane(state, &self.aggs, end, pane)?;
                    self.metrics.state_bytes.fetch_sub(moved, Ordering::Relaxed);
                    self.live_bytes -= moved;
                } else if !pane.is_empty() {
                    from_memory.push((end, pane));
                }
            }
        }
        for (end, pane) in from_memory {
            self.emit_pane(end, pane, out)?;
        }
        if let WindowStore::Keyed { spilled, .. } = &mut self.store {
            spilled.retain(|end| end.saturating_sub(1) > up_to);
        }
        // A window fires when the watermark reaches its last millisecond
        // (end - 1), which is its timer's time.
        loop {
            let WindowStore::Keyed { state, .. } = &mut self.store else {
                return Ok(());
            };
            let timers = state.due_timers(TIMERS, up_to, FIRE_CHUNK)?;
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

    /// A fired window held live: its results, and its state freed.
    fn emit_pane(&mut self, end: i64, mut pane: Pane, out: &mut Collector) -> Result<()> {
        let freed: i64 = pane.keys().map(|k| k.len() as i64 + LIVE_GROUP_BYTES).sum();
        self.metrics.state_bytes.fetch_sub(freed, Ordering::Relaxed);
        self.live_bytes = (self.live_bytes - freed).max(0);
        if pane.is_empty() {
            return Ok(());
        }
        let mut agg_columns = Vec::with_capacity(pane.accs.len());
        for acc in pane.accs.iter_mut() {
            agg_columns.push(acc.evaluate(EmitTo::All)?);
        }
        let ends = vec![end; pane.len()];
        let batch = output_batch(self, &ends, pane.keys(), agg_columns)?;
        out.emit(batch);
        Ok(())
    }

    fn fire_timers(&mut self, timers: &[Timer], out: &mut Collector) -> Result<()> {
        let WindowStore::Keyed { state, .. } = &mut self.store else {
            return Ok(());
        };
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
        let stored = state.get(ACC, &entries)?;
        let mut present: Vec<&[u8]> = vec![];
        let mut groups = vec![];
        for (i, s) in stored.iter().enumerate() {
            if let Some(s) = s {
                present.push(s);
                groups.push(i);
            }
        }
        let n = timers.len();
        let mut accs = self.aggs.accumulators()?;
        self.aggs.merge_stored(&mut accs, &present, &groups, n)?;
        let mut agg_columns = Vec::with_capacity(accs.len());
        for acc in accs.iter_mut() {
            agg_columns.push(acc.evaluate(EmitTo::All)?);
        }
        let mut w = KeyedWrite::default();
        for ((t, e), s) in timers.iter().zip(&entries).zip(&stored) {
            w.delete_timer(TIMERS, t);
            w.delete(ACC, *e, s.as_ref().map(Vec::len));
        }
        state.write(w)?;
        let batch = output_batch(self, &ends, timers.iter().map(|t| t.key.as_slice()), agg_columns)?;
        out.emit(batch);
        Ok(())
    }

    /// The heap store's snapshot: every pane's groups as canonical
    /// entries (`window-acc` and `window-timers`, as the RocksDB store
    /// keeps them), in key order.
    fn snapshot_live(&mut self) -> Result<OperatorSnapshot> {
        let WindowStore::Live { panes, groups } = &mut self.store else {
            return Err(ExecError::internal("not the heap window store"));
        };
        let mut entries = KeyedEntries::new(STATES);
        for (end, pane) in panes.iter_mut() {
            if pane.is_empty() {
                continue;
            }
            // `state` empties the accumulators: they are rebuilt from it.
            let columns = self.aggs.state_columns(&mut pane.accs)?;
            let mut fresh = self.aggs.accumulators()?;
            let all: Vec<usize> = (0..pane.len()).collect();
            self.aggs.merge_columns(&mut fresh, &columns, &all, pane.len())?;
            pane.accs = fresh;
            let rows = self.aggs.state_codec.encode(&columns)?;
            let ns = encode_time(*end);
            for (i, value) in rows.iter().enumerate() {
                let e = EntryRef {
                    key_group: pane.groups[i],
                    key: pane.key(i),
                    namespace: &ns,
                };
                entries.value(ACC, e, value);
                entries.timer(TIMERS, e.key_group, end - 1, e.key, &ns);
            }
        }
        Ok(entries.finish(groups.clone())?)
    }
}

/// Merges a frozen slice into a window's pane: (bytes, groups added).
fn merge_slice(pane: &mut Pane, slice: &Frozen, aggs: &Aggs) -> Result<(i64, usize)> {
    if slice.states.is_empty() || slice.pane.is_empty() {
        return Ok((0, 0));
    }
    let (mut grown, mut new_groups) = (0i64, 0usize);
    // A window's slices mostly hold the same keys: size for the first.
    if pane.is_empty() {
        pane.reserve(slice.pane.len(), slice.pane.key(0).len());
    }
    let mut indices = Vec::with_capacity(slice.pane.len());
    for g in 0..slice.pane.len() {
        let key = slice.pane.key(g);
        let (i, new) = pane.group(key, slice.pane.hash(g), || slice.pane.groups[g]);
        if new {
            grown += key.len() as i64 + LIVE_GROUP_BYTES;
            new_groups += 1;
        }
        indices.push(i);
    }
    if pane.accs.is_empty() {
        pane.accs = aggs.accumulators()?;
    }
    let total = pane.len();
    aggs.merge_columns(&mut pane.accs, &slice.states, &indices, total)?;
    Ok((grown, new_groups))
}

/// Merges one buffered window into RocksDB: one multi-get of its keys'
/// stored states, merged into the buffered accumulators, one write of the
/// results and of a timer for each new (key, window). Returns the bytes
/// the pane was counted as in memory (the keyed state counts what it
/// wrote).
fn flush_pane(state: &mut KeyedState, aggs: &Aggs, end: i64, mut pane: Pane) -> Result<i64> {
    if pane.is_empty() {
        return Ok(0);
    }
    let owned = state.groups();
    if let Some(g) = pane.groups.iter().find(|g| !owned.contains(g)) {
        return Err(ExecError::internal(format!(
            "a row of key group {g} reached the subtask owning key groups {owned:?}"
        )));
    }
    let ns = encode_time(end);
    let mut accs = std::mem::take(&mut pane.accs);
    let entries: Vec<EntryRef> = pane
        .keys()
        .zip(&pane.groups)
        .map(|(k, g)| EntryRef {
            key_group: *g,
            key: k,
            namespace: &ns,
        })
        .collect();
    let stored = state.get(ACC, &entries)?;
    let mut present: Vec<&[u8]> = vec![];
    let mut present_groups = vec![];
    let mut w = KeyedWrite::default();
    for (g, s) in stored.iter().enumerate() {
        match s {
            Some(s) => {
                present.push(s);
                present_groups.push(g);
            }
            None => {
                // A new window of this key: its timer fires at the window's
                // last millisecond.
                let e = entries[g];
                w.add_timer(TIMERS, e.key_group, end - 1, e.key, e.namespace);
            }
        }
    }
    let in_memory = pane.keys().map(|k| k.len() as i64 + LIVE_GROUP_BYTES).sum::<i64>();
    let total = pane.len();
    aggs.merge_stored(&mut accs, &present, &present_groups, total)?;
    for ((e, value), s) in entries.iter().zip(aggs.encode_states(&mut accs)?).zip(&stored) {
        w.put(ACC, *e, s.as_ref().map(Vec::len), value);
    }
    state.write(w)?;
    Ok(in_memory)
}

/// The output rows of fired windows: window columns, keys, aggregates.
fn output_batch<'a>(
    op: &WindowAggregateOperator,
    ends: &[i64],
    keys: impl Iterator<Item = &'a [u8]>,
    agg_columns: Vec<ArrayRef>,
) -> Result<RecordBatch> {
    let starts: Vec<i64> = ends.iter().map(|e| window_start(&op.window, *e)).collect();
    let out = WindowOutput {
        schema: &op.schema,
        group_outputs: &op.group_outputs,
        key_encoder: op.key_encoder.as_ref(),
        zone: op.zone.as_ref(),
    };
    out.batch(&starts, ends, keys, agg_columns)
}

/// How a window aggregate's output rows are laid out.
pub(super) struct WindowOutput<'a> {
    pub schema: &'a SchemaRef,
    pub group_outputs: &'a [GroupOutput],
    pub key_encoder: Option<&'a KeyEncoder>,
    /// Wall-clock windows: `window_time` is the instant of `end - 1`.
    pub zone: Option<&'a arrow::array::timezone::Tz>,
}

impl WindowOutput<'_> {
    /// Rows of windows `[starts[i], ends[i])`: window columns, keys (their
    /// encoded bytes), then the aggregate values.
    pub fn batch<'k>(
        &self,
        starts: &[i64],
        ends: &[i64],
        keys: impl Iterator<Item = &'k [u8]>,
        agg_columns: Vec<ArrayRef>,
    ) -> Result<RecordBatch> {
        let key_columns = match self.key_encoder {
            Some(enc) => enc.codec().decode(keys)?,
            None => vec![],
        };
        let start_arr: TimestampMillisecondArray = starts.iter().map(|s| Some(*s)).collect();
        let end_arr: TimestampMillisecondArray = ends.iter().map(|e| Some(*e)).collect();
        let times: TimestampMillisecondArray = ends
            .iter()
            .map(|e| {
                let last = e.saturating_sub(1);
                match self.zone {
                    // A time that happens twice: its second, when the
                    // window is complete.
                    Some(z) => crate::time_zone::from_local(last, 1000, z, crate::time_zone::Resolve::Later),
                    None => Some(last),
                }
            })
            .collect();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for g in self.group_outputs {
            columns.push(match g {
                GroupOutput::WindowStart => Arc::new(start_arr.clone()),
                GroupOutput::WindowEnd => Arc::new(end_arr.clone()),
                GroupOutput::WindowTime => Arc::new(times.clone()),
                GroupOutput::Key(i) => key_columns
                    .get(*i)
                    .cloned()
                    .ok_or_else(|| ExecError::internal("window key index out of range"))?,
            });
        }
        columns.extend(agg_columns);
        batch_with_schema(self.schema, columns)
    }
}

/// Rows of one batch that go to one pane.
#[derive(Default)]
struct PaneWork {
    rows: Vec<u32>,
}

/// What every pane a batch updates shares.
struct BatchUpdate<'a> {
    /// Each aggregate's input values for the whole batch.
    evaluated: Vec<Vec<ArrayRef>>,
    /// Each row's key hash (empty without keys).
    hashes: Vec<u64>,
    key_rows: Option<&'a crate::state::codec::Rows>,
    rows: usize,
    hasher: &'a KeyHasher,
    aggs: &'a Aggs,
    max_parallelism: u16,
}

impl BatchUpdate<'_> {
    /// Adds the rows `w` to `pane`: (state bytes added, groups added).
    fn apply(&self, pane: &mut Pane, w: PaneWork, owned: &Range<KeyGroup>) -> Result<(i64, usize)> {
        let (mut grown, mut new_groups) = (0i64, 0usize);
        let mut groups = Vec::with_capacity(w.rows.len());
        // Without keys (a global window aggregate) every row is the one
        // group: one lookup for the pane, not one a row.
        let rows: &[u32] = if self.key_rows.is_none() {
            &w.rows[..w.rows.len().min(1)]
        } else {
            &w.rows
        };
        for &row in rows {
            let key: &[u8] = self.key_rows.map_or(&[], |r| r.row(row as usize));
            let hash = match self.hashes.get(row as usize) {
                Some(h) => *h,
                None => self.hasher.hash(key),
            };
            let (g, new) = pane.group(key, hash, || key_group(key, self.max_parallelism));
            if new {
                new_groups += 1;
                grown += key.len() as i64 + LIVE_GROUP_BYTES;
                if !owned.contains(&pane.groups[g]) {
                    return Err(ExecError::internal(format!(
                        "a row of key group {} reached the subtask owning key groups {owned:?}",
                        pane.groups[g]
                    )));
                }
            }
            groups.push(g);
        }
        if let (None, Some(&g)) = (self.key_rows, groups.first()) {
            groups.resize(w.rows.len(), g);
        }
        if pane.accs.is_empty() {
            pane.accs = self.aggs.accumulators()?;
        }
        let indices = (w.rows.len() != self.rows).then(|| UInt32Array::from(w.rows));
        let total = pane.len();
        for (acc, values) in pane.accs.iter_mut().zip(&self.evaluated) {
            let values = match &indices {
                Some(ix) => values
                    .iter()
                    .map(|v| take(v, ix, None))
                    .collect::<Result<Vec<_>, _>>()?,
                None => values.clone(),
            };
            acc.update_batch(&values, &groups, None, total)?;
        }
        Ok((grown, new_groups))
    }
}

impl Operator for WindowAggregateOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        crate::failpoint::failpoint_error("window.snapshot").map_err(ExecError::internal)?;
        // Accumulators and timers are both in the store: one snapshot
        // holds the windows and when they fire. Slices are memory only:
        // their windows take them first.
        self.spill_slices()?;
        self.flush()?;
        Ok(Some(match &mut self.store {
            WindowStore::Keyed { state, .. } => state.snapshot(checkpoint_id)?,
            WindowStore::Live { .. } => self.snapshot_live()?,
        }))
    }

    fn process_batch(&mut self, batch: crate::change::ChangeBatch, _out: &mut Collector) -> Result<()> {
        let batch = batch.into_inserts("window aggregate")?;
        let n = batch.num_rows();
        let times = if self.proctime {
            // The operator's clock when the rows arrive (Flink assigns
            // processing-time windows in the window operator), never
            // behind windows it already fired.
            let now = self.wall_clock(self.clock.now_ms());
            let now = now.max(self.watermark.saturating_add(1));
            TimestampMillisecondArray::from(vec![now; n])
        } else {
            self.event_times(&batch)?
        };
        let key_arrays = self
            .keys
            .iter()
            .map(|k| k.evaluate(&batch).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let key_rows = match &self.key_encoder {
            Some(enc) => Some(enc.encode(&key_arrays)?),
            None => None,
        };
        let watermark = self.watermark;
        let mut late = 0u64;
        // Rows by pane first (a slice, or a window for rows whose slice
        // has ended and for unsliced windows), then each pane's rows find
        // their groups in it, and its accumulators take them in one update.
        let mut work: datafusion::common::HashMap<i64, PaneWork> = Default::default();
        let mut slice_work: datafusion::common::HashMap<i64, PaneWork> = Default::default();
        for row in 0..n {
            if times.is_null(row) {
                late += 1;
                continue;
            }
            let ts = times.value(row);
            if self.attached {
                // The row's window is the one ending at `ts`.
                if is_fired(ts, watermark) {
                    late += 1;
                } else {
                    work.entry(ts).or_default().rows.push(row as u32);
                }
                continue;
            }
            if let Some(end) = self.slicer.and_then(|s| s.slice_end(ts))
                && !is_fired(end, watermark)
            {
                slice_work.entry(end).or_default().rows.push(row as u32);
                continue;
            }
            let mut assigned = false;
            assign_windows(&self.window, ts, |_, end| {
                if is_fired(end, watermark) {
                    return;
                }
                assigned = true;
                work.entry(end).or_default().rows.push(row as u32);
            });
            if !assigned {
                late += 1;
            }
        }
        if late > 0 {
            self.metrics.late_rows_dropped.fetch_add(late, Ordering::Relaxed);
        }
        let mut grown = 0i64;
        if !work.is_empty() || !slice_work.is_empty() {
            // Aggregate inputs once per batch, not once per pane; each
            // row's key hash once for all its panes.
            let update = BatchUpdate {
                evaluated: self.aggs.evaluate(&batch)?,
                hashes: match &key_rows {
                    Some(r) => (0..n).map(|i| self.hasher.hash(r.row(i))).collect(),
                    None => vec![],
                },
                key_rows: key_rows.as_ref(),
                rows: n,
                hasher: &self.hasher,
                aggs: &self.aggs,
                max_parallelism: self.max_parallelism,
            };
            let (panes, owned, buffered) = match &mut self.store {
                WindowStore::Live { panes, groups } => (panes, groups.clone(), None),
                WindowStore::Keyed {
                    state,
                    buffer,
                    buffered,
                    ..
                } => (buffer, state.groups(), Some(buffered)),
            };
            let mut new_groups = 0;
            for (end, w) in work {
                let (g, new) = update.apply(panes.pane(end), w, &owned)?;
                grown += g;
                new_groups += new;
            }
            if let Some(b) = buffered {
                *b += new_groups;
            }
            for (end, w) in slice_work {
                grown += update.apply(self.slices.live.entry(end).or_default(), w, &owned)?.0;
            }
        }
        // Buffered groups count as state until they reach RocksDB (where
        // a flush counts their bytes instead).
        self.account(grown);
        if let WindowStore::Keyed { buffered, limit, .. } = &self.store
            && *buffered + self.slices.groups() >= *limit
        {
            self.flush()?;
        }
        self.after_batch(&times)
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        // Processing-time windows ignore event time, but the end of a
        // bounded input (or a drain) fires what is open.
        if self.proctime && watermark < crate::message::MAX_WATERMARK {
            return Ok(());
        }
        // Wall-clock windows complete on the wall clock.
        let watermark = crate::time_zone::watermark_in(watermark, self.zone.as_ref());
        self.advance_to(watermark, out)
    }

    fn processing_time_interval(&self) -> Option<std::time::Duration> {
        // Windows fire within a tick of their end.
        self.proctime
            .then(|| std::time::Duration::from_millis(self.window.slide.clamp(1, 100) as u64))
    }

    fn on_processing_time(&mut self, now: i64, out: &mut Collector) -> Result<()> {
        if !self.proctime {
            return Ok(());
        }
        // A window [start, end) is complete once the clock reaches end.
        let now = self.wall_clock(now);
        self.advance_to(now.saturating_sub(1), out)
    }
}

impl WindowAggregateOperator {
    /// The processing-time clock as the windows read it: in a session
    /// zone, its wall time there (windows on `PROCTIME()`, a
    /// TIMESTAMP_LTZ, are cut on that wall clock).
    fn wall_clock(&self, now: i64) -> i64 {
        match &self.zone {
            Some(z) => crate::time_zone::to_local(now, 1000, z).unwrap_or(now),
            None => now,
        }
    }
}

impl WindowAggregateOperator {
    /// Time (event time, or the clock for processing-time windows)
    /// passed `to`: slices freeze and due windows fire.
    fn advance_to(&mut self, to: Timestamp, out: &mut Collector) -> Result<()> {
        if to <= self.watermark {
            return Ok(());
        }
        self.watermark = to;
        self.advance_slices(to)?;
        self.fire(to, out)
    }
}

impl WindowAggregateOperator {
    /// Event-time bookkeeping after a batch: the newest event time, and the
    /// state held per second of event time (the alignment sizing aid).
    fn after_batch(&mut self, times: &TimestampMillisecondArray) -> Result<()> {
        if let Some(max) = times.iter().flatten().max() {
            self.metrics.max_event_time.fetch_max(max, Ordering::Relaxed);
            self.max_ts = self.max_ts.max(max);
        }
        // State held per second of event time: the live state spans the
        // event time between the watermark and the newest row.
        if self.watermark > MIN_WATERMARK && self.max_ts > self.watermark {
            let span_ms = self.max_ts - self.watermark;
            self.metrics.peak_state_span_ms.fetch_max(span_ms, Ordering::Relaxed);
            let span_s = span_ms as f64 / 1000.0;
            let keyed = match &self.store {
                WindowStore::Keyed { state, .. } => state.size_bytes(),
                WindowStore::Live { .. } => 0,
            };
            let rate = ((self.live_bytes + keyed) as f64 / span_s) as i64 * self.parallelism as i64;
            self.metrics.peak_state_rate.fetch_max(rate, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl WindowAggregateOperator {
    fn account(&mut self, grown: i64) {
        self.metrics.state_bytes.fetch_add(grown, Ordering::Relaxed);
        self.live_bytes += grown;
    }

    /// The pane of window `end` in the store's memory (the heap store's
    /// panes, or the RocksDB store's buffer, counted as buffered).
    fn window_pane(store: &mut WindowStore, end: i64) -> (&mut Pane, Option<&mut usize>) {
        match store {
            WindowStore::Live { panes, .. } => (panes.pane(end), None),
            WindowStore::Keyed { buffer, buffered, .. } => (buffer.pane(end), Some(buffered)),
        }
    }

    /// Freezes the slices the watermark passed, and merges frozen slices
    /// into their windows that are due (they fire next).
    fn advance_slices(&mut self, watermark: Timestamp) -> Result<()> {
        let Some(slicer) = self.slicer else {
            return Ok(());
        };
        for (end, pane) in self.slices.take_ended(watermark) {
            self.freeze(&slicer, end, pane)?;
        }
        self.merge_frozen(Some(watermark))
    }

    /// Every slice merged into every window it has not reached yet, and
    /// dropped: before a snapshot or a flush, which see windows only.
    fn spill_slices(&mut self) -> Result<()> {
        let Some(slicer) = self.slicer else {
            return Ok(());
        };
        for (end, pane) in self.slices.take_live() {
            self.freeze(&slicer, end, pane)?;
        }
        self.merge_frozen(None)
    }

    fn freeze(&mut self, slicer: &Slicer, end: i64, mut pane: Pane) -> Result<()> {
        let states = if pane.accs.is_empty() {
            vec![]
        } else {
            self.aggs.state_columns(&mut pane.accs)?
        };
        let (next_window, last_window) = slicer.windows(end);
        self.slices.frozen.insert(
            end,
            Frozen {
                pane,
                states,
                next_window,
                last_window,
            },
        );
        Ok(())
    }

    /// Merges each frozen slice into its windows up to `due` (all with
    /// `None`), dropping the slices whose last window it reached.
    fn merge_frozen(&mut self, due: Option<Timestamp>) -> Result<()> {
        let Some(slicer) = self.slicer else {
            return Ok(());
        };
        let slide = slicer.slide();
        let mut done = vec![];
        let mut grown = 0i64;
        for (end, f) in self.slices.frozen.iter_mut() {
            while f.next_window <= f.last_window && due.is_none_or(|w| is_fired(f.next_window, w)) {
                let (pane, buffered) = Self::window_pane(&mut self.store, f.next_window);
                let (g, new) = merge_slice(pane, f, &self.aggs)?;
                grown += g;
                if let Some(b) = buffered {
                    *b += new;
                }
                match f.next_window.checked_add(slide) {
                    Some(next) => f.next_window = next,
                    None => break,
                }
            }
            if f.next_window > f.last_window || due.is_none() {
                done.push(*end);
            }
        }
        for end in done {
            if let Some(f) = self.slices.frozen.remove(&end) {
                grown -= pane_bytes(&f.pane, LIVE_GROUP_BYTES);
            }
        }
        self.account(grown);
        Ok(())
    }

    /// Moves the RocksDB store's buffer into RocksDB: per window, one
    /// multi-get of the stored states of its buffered keys, merged into the
    /// buffered accumulators, then one write of every new state and a
    /// timer for each new (key, window). A no-op for the heap store.
    fn flush(&mut self) -> Result<()> {
        self.spill_slices()?;
        let WindowStore::Keyed {
            state,
            buffer,
            buffered,
            spilled,
            ..
        } = &mut self.store
        else {
            return Ok(());
        };
        if *buffered == 0 {
            return Ok(());
        }
        *buffered = 0;
        let mut moved: i64 = 0;
        for (end, pane) in buffer.take_all() {
            spilled.insert(end);
            moved += flush_pane(state, &self.aggs, end, pane)?;
        }
        self.metrics.state_bytes.fetch_sub(moved, Ordering::Relaxed);
        self.live_bytes -= moved;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::testing::{feed_pretty, printed};
    use crate::state::HeapBackend;
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

    /// `SELECT k, window_start, window_end, COUNT(v), SUM(v) FROM
    /// TUMBLE(.., ts, 10 ms) GROUP BY k, window_start, window_end` on
    /// `store` (the heap store when `None`).
    fn tumble(store: Option<KeyedState>) -> WindowAggregateOperator {
        let agg = |f, name: &str| {
            let v: Arc<dyn PhysicalExpr> = Arc::new(Column::new("v", 2));
            Arc::new(
                AggregateExprBuilder::new(f, vec![v])
                    .schema(input())
                    .alias(name)
                    .build()
                    .expect("aggregate"),
            )
        };
        let node = WindowAggregateNode {
            window: WindowSpec {
                kind: WindowKind::Tumble,
                size: 10,
                slide: 10,
                offset: 0,
            },
            time_column: 1,
            proctime: false,
            attached: false,
            keys: vec![Arc::new(Column::new("k", 0))],
            group_outputs: vec![GroupOutput::Key(0), GroupOutput::WindowStart, GroupOutput::WindowEnd],
            aggregates: vec![
                agg(datafusion::functions_aggregate::count::count_udaf(), "c"),
                agg(datafusion::functions_aggregate::sum::sum_udaf(), "s"),
            ],
            zone: None,
        };
        let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("window_start", ts.clone(), false),
            Field::new("window_end", ts, false),
            Field::new("c", DataType::Int64, false),
            Field::new("s", DataType::Int64, true),
        ]));
        let store = match store {
            Some(state) => WindowStore::keyed(state, 1000).expect("store"),
            None => WindowStore::Live {
                panes: Default::default(),
                groups: 0..128,
            },
        };
        let metrics = Arc::new(NodeMetrics::new("window".into()));
        WindowAggregateOperator::new(&node, &input(), schema, 128, store, metrics, 1).expect("operator")
    }

    fn keyed() -> KeyedState {
        KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128)
    }

    fn watermark(op: &mut WindowAggregateOperator, wm: Timestamp) -> Vec<String> {
        let mut out = Collector::default();
        op.on_watermark(wm, &mut out).expect("watermark");
        let mut rows = printed(&mut out);
        rows.sort();
        rows
    }

    /// A window fires when the watermark reaches its last millisecond,
    /// with each key's count and sum; a row of a fired window is late.
    #[test]
    fn windows_fire_at_their_last_millisecond_per_key() {
        for store in [None, Some(keyed())] {
            let rocks = store.is_some();
            let mut op = tumble(store);
            let s = input();
            assert!(feed_pretty(&mut op, 0, &s, "a 1 1\na 5 2\nb 12 3\na 15 4\nb 9 .").is_empty());
            assert!(watermark(&mut op, 8).is_empty(), "keyed: {rocks}");
            let fired = watermark(&mut op, 9);
            assert_eq!(fired.len(), 2, "{fired:?}");
            assert!(
                fired[0].starts_with("+I[a, ") && fired[0].ends_with(", 2, 3]"),
                "{fired:?}"
            );
            // b's window [0, 10) holds one row with a NULL v: counted out.
            assert!(
                fired[1].starts_with("+I[b, ") && fired[1].ends_with(", 0, null]"),
                "{fired:?}"
            );
            assert!(feed_pretty(&mut op, 0, &s, "a 3 100").is_empty());
            assert_eq!(op.metrics.late_rows_dropped.load(Ordering::Relaxed), 1);
            let fired = watermark(&mut op, 19);
            assert_eq!(fired.len(), 2, "{fired:?}");
            assert!(
                fired[0].ends_with(", 1, 4]") && fired[1].ends_with(", 1, 3]"),
                "{fired:?}"
            );
            assert!(watermark(&mut op, crate::message::MAX_WATERMARK).is_empty());
            if let WindowStore::Keyed { state, .. } = &mut op.store {
                assert_eq!(state.size_bytes(), 0, "fired windows are freed");
                assert_eq!(state.counted_bytes().expect("count"), 0);
            }
        }
    }

    /// The heap store's snapshot restores into either store (the state
    /// layer's entries), and the windows fire there as they would have.
    #[test]
    fn the_heap_stores_snapshot_restores_into_either_store() {
        let mut op = tumble(None);
        let s = input();
        assert!(feed_pretty(&mut op, 0, &s, "a 1 1\na 5 2\nb 12 3\na 15 4").is_empty());
        let expected = {
            let mut uninterrupted = tumble(None);
            feed_pretty(&mut uninterrupted, 0, &s, "a 1 1\na 5 2\nb 12 3\na 15 4");
            watermark(&mut uninterrupted, 19)
        };
        assert_eq!(expected.len(), 3);
        let Some(OperatorSnapshot::Entries { bytes, key_groups }) = op.snapshot_state(1).expect("snapshot") else {
            panic!("the heap store snapshots entries")
        };
        let source = StateSource::Entries {
            bytes: Arc::new(bytes),
            key_groups,
            path: "snapshot".into(),
        };
        let mut heap = tumble(None);
        heap.restore_live(0..128, std::slice::from_ref(&source))
            .expect("restore");
        assert_eq!(watermark(&mut heap, 19), expected);
        let state = crate::state::open_keyed(
            crate::config::StateBackendKind::Heap,
            &crate::state::RocksDbTuning::default(),
            std::path::Path::new("unused"),
            STATES,
            0..128,
            128,
            &[source],
        )
        .expect("open");
        let mut keyed = tumble(Some(state));
        assert_eq!(watermark(&mut keyed, 19), expected);
    }
}
