//! Non-windowed GROUP BY (and global aggregates): an updating result with
//! one live row per key, Flink's `GroupAggFunction` row by row.
//!
//! State, through the keyed-state layer ([`KeyedState`]), on either
//! backend:
//! - `group-acc` (value state): key → the key's row count and every
//!   call's accumulator ([`KeyAccs`]);
//!   (FIRST_VALUE, LAST_VALUE, LISTAGG and ARRAY_AGG over an updating
//!   input keep the values present there, so their cost grows with the
//!   key's values, as the result itself does);
//! - `group-agg-map` (value state): key, namespace = call index (u16 BE) |
//!   value in Weir's key encoding → count (zigzag varint), for MIN/MAX and
//!   DISTINCT calls. DISTINCT calls over the same argument share one
//!   entry per value, named by the first of them, holding a count per
//!   call in call order (Flink's shared distinct `MapView`): q16's
//!   `COUNT(DISTINCT bidder)` with three FILTERs reads and writes one
//!   entry per row, not four.
//!
//! A batch costs one multi-get of its keys' accumulators, one of its
//! map entries, and one write; rows are then applied in order, each
//! emitting what Flink's operator emits for it:
//! - a retraction (`-U`/`-D`) for a key without state is dropped (its row
//!   was never seen, or its state expired);
//! - the key's first row: `+I(key, values)`;
//! - later rows: `-U(key, old)` `+U(key, new)`, or nothing when the values
//!   did not change;
//! - the key's row count back to 0: `-D(key, old)`, state cleared.

use std::collections::BTreeMap;

use hashbrown::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, ArrayRef, BooleanArray, Float64Array, Int64Array, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::physical_expr::PhysicalExpr;

use super::accs::{Acc, AggSpec, KeyAccs, decode_count};
use crate::canonical::{canonical_expr, canonical_exprs};
use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result};
use crate::keygroup::{KeyEncoder, KeyGroup};
use crate::operators::build::{BuildCtx, STATE_CACHE_ENTRIES};
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{AggFunc, GroupAggregateNode};
use crate::plan::{ChangelogMode, PlanNode, StateKeys, StreamNode, humantime_ms};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::type_name;
use crate::state::codec::{decode_counts, encode_counts};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind};

/// The accumulators' state (cached over RocksDB: read by key only).
pub const ACC: usize = 0;
pub const MAP: usize = 1;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "group-acc",
        kind: StateKind::Value,
        ttl: true,
    },
    StateDecl {
        name: "group-agg-map",
        kind: StateKind::Value,
        ttl: true,
    },
];

pub struct GroupAggregateOperator {
    name: String,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// `None` for a global aggregate (one key: the empty row).
    key_encoder: Option<KeyEncoder>,
    specs: Vec<AggSpec>,
    /// Per call: where its value counts live (calls keeping a map).
    maps: Vec<Option<MapSlot>>,
    schema: SchemaRef,
    state: KeyedState,
    metrics: Arc<NodeMetrics>,
    /// Keys' accumulators as the last batches left them, live (without
    /// TTL): a key's accumulators are neither decoded nor encoded per
    /// batch, only written to state at a snapshot and when more than
    /// [`LIVE_KEYS`] are held (then all are written and forgotten), as the
    /// window operator's pre-aggregation buffer. With TTL every batch
    /// writes through (expiry reads the state's write times).
    live: HashMap<Vec<u8>, LiveKey>,
    /// The most keys held live ([`LIVE_KEYS`]).
    live_limit: usize,
    /// The input is insert-only: DISTINCT value entries of several calls
    /// hold presence bits ([`encode_map_value`]).
    insert_only: bool,
    /// `table.exec.mini-batch.*` enabled: the most rows applied as one
    /// bundle, whose changes to a key are emitted as one result (Flink's
    /// `MiniBatchGroupAggFunction`): `-U`/`+U` once per key and bundle, not
    /// per row. `None`: a result per input row, as Flink without it.
    mini_batch: Option<usize>,
}

/// A DISTINCT value entry's per-call counts as stored. Over insert-only
/// input a value never leaves, so only whether each call has seen it
/// matters: two or more calls store presence bits (Flink keeps a bitmap
/// too), `ceil(n / 8)` bytes where the counts take at least `n`, so an
/// entry written as counts (by an earlier build) still reads by its
/// length. Otherwise varint counts.
fn encode_map_value(c: &[i64], insert_only: bool) -> Vec<u8> {
    if !insert_only || c.len() < 2 {
        return encode_counts(c);
    }
    let mut bits = vec![0u8; c.len().div_ceil(8)];
    for (i, n) in c.iter().enumerate() {
        if *n > 0 {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    bits
}

/// Fills `out` from [`encode_map_value`]'s bytes; `None` unless they hold
/// `out.len()` counts or presence bits.
fn decode_map_value(v: &[u8], out: &mut [i64], insert_only: bool) -> Option<()> {
    if insert_only && out.len() >= 2 && v.len() == out.len().div_ceil(8) {
        for (i, n) in out.iter_mut().enumerate() {
            *n = i64::from((v[i / 8] >> (i % 8)) & 1);
        }
        return Some(());
    }
    decode_counts(v, out)
}

/// Live keys a group aggregate keeps ([`GroupAggregateOperator::live`]).
const LIVE_KEYS: usize = 100_000;

/// A key's accumulators held live.
struct LiveKey {
    group: KeyGroup,
    accs: KeyAccs,
    /// Stored size of its accumulators in state (`None`: none).
    stored_len: Option<usize>,
    /// Changed since they were last written to state.
    dirty: bool,
    /// Bytes counted in the state-size metric for it while it is not in
    /// state at all (an estimate: its accumulators are not encoded until
    /// written; then the state counts them).
    unwritten: i64,
}

/// What a live key not yet in state adds to the state-size metric: its
/// key and about 9 bytes per call (the keyed-state prefix, the row count).
fn unwritten_bytes(key: &[u8], calls: usize) -> i64 {
    (key.len() + 3 + 9 * (calls + 1)) as i64
}

/// A key of the batch: where it lives and what it holds.
struct Slot {
    group: KeyGroup,
    /// First row of the key in the batch (its key bytes).
    row: usize,
    /// Stored size of its accumulators before the batch (`None`: none).
    stored_len: Option<usize>,
    accs: Option<KeyAccs>,
    /// Its live result row (what a later change retracts): an index
    /// into the batch's [`Results`].
    shown: Option<u32>,
    /// Changed by this batch.
    dirty: bool,
    /// Held live before the batch: its key bytes (given back to
    /// [`GroupAggregateOperator::live`] without a copy), whether its
    /// accumulators were not written to state yet, and its
    /// [`LiveKey::unwritten`] bytes.
    live: Option<(Vec<u8>, bool, i64)>,
}

/// The value counts (MIN/MAX/DISTINCT) one batch touches: each entry
/// (slot, namespace = call | value), its count, and whether it changed.
#[derive(Default)]
struct ValueCounts {
    entries: Vec<(u32, Vec<u8>)>,
    /// Where each entry's counts start in `count` (one per call sharing
    /// its map).
    start: Vec<u32>,
    count: Vec<i64>,
    dirty: Vec<bool>,
    /// Each entry's stored length (`None`: none).
    stored: Vec<Option<usize>>,
}

/// Where a map-keeping call's value counts live: in the map of call
/// `leader`, at `pos` of the `width` counts of each entry.
#[derive(Debug, Clone, Copy)]
struct MapSlot {
    leader: usize,
    pos: usize,
    width: usize,
}

/// Each call's [`MapSlot`]: DISTINCT calls (not MIN/MAX, which rescan
/// their map) over the same argument, input type and addition class
/// share the first one's map.
fn map_slots(specs: &[AggSpec]) -> Vec<Option<MapSlot>> {
    let shareable = |s: &AggSpec| s.call.distinct && !matches!(s.call.func, AggFunc::Min | AggFunc::Max);
    let same_input = |a: &AggSpec, b: &AggSpec| {
        a.call.input_type == b.call.input_type
            && a.class == b.class
            && a.call.arg.as_ref().map(|e| e.to_string()) == b.call.arg.as_ref().map(|e| e.to_string())
    };
    let mut slots: Vec<Option<MapSlot>> = vec![None; specs.len()];
    for j in 0..specs.len() {
        if !specs[j].uses_map() {
            continue;
        }
        let leader = (0..j)
            .filter(|_| shareable(&specs[j]))
            .find(|&l| {
                slots[l].is_some_and(|m| m.leader == l) && shareable(&specs[l]) && same_input(&specs[l], &specs[j])
            })
            .unwrap_or(j);
        let pos = slots.iter().flatten().filter(|m| m.leader == leader).count();
        slots[j] = Some(MapSlot { leader, pos, width: 0 });
    }
    let widths: Vec<usize> = (0..specs.len())
        .map(|l| slots.iter().flatten().filter(|m| m.leader == l).count())
        .collect();
    for m in slots.iter_mut().flatten() {
        m.width = widths[m.leader];
    }
    slots
}

/// One emitted change: its kind, the input row whose key it carries, and
/// its aggregate values (an index into [`Results`]: a `-U` names the row
/// its `+U` named before, so no values are copied).
struct Emitted {
    kind: RowKind,
    row: u32,
    values: u32,
}

/// The aggregate values of the result rows a batch shows or retracts,
/// each row once, a column per call: BIGINT and DOUBLE results (counts,
/// sums, averages, extremes of those types) as plain values, others as
/// `ScalarValue`s. A result per input row makes this the hot path.
struct Results {
    columns: Vec<ResultColumn>,
    len: u32,
}

enum ResultColumn {
    I64(Vec<Option<i64>>),
    F64(Vec<Option<f64>>),
    Any(Vec<ScalarValue>),
}

impl Results {
    fn new(specs: &[AggSpec]) -> Self {
        let columns = specs
            .iter()
            .map(|s| match s.call.output_type {
                DataType::Int64 => ResultColumn::I64(vec![]),
                DataType::Float64 => ResultColumn::F64(vec![]),
                _ => ResultColumn::Any(vec![]),
            })
            .collect();
        Results { columns, len: 0 }
    }

    /// Appends the results of `accs`; returns their row.
    fn push(&mut self, specs: &[AggSpec], accs: &KeyAccs) -> Result<u32> {
        for ((col, spec), acc) in self.columns.iter_mut().zip(specs).zip(&accs.accs) {
            match col {
                ResultColumn::I64(c) => c.push(match spec.value_i64(acc) {
                    Some(v) => v,
                    None => match spec.value(acc)? {
                        ScalarValue::Int64(v) => v,
                        other => return Err(ExecError::internal(format!("a BIGINT result of {other:?}"))),
                    },
                }),
                ResultColumn::F64(c) => c.push(match spec.value_f64(acc) {
                    Some(v) => v,
                    None => match spec.value(acc)? {
                        ScalarValue::Float64(v) => v,
                        other => return Err(ExecError::internal(format!("a DOUBLE result of {other:?}"))),
                    },
                }),
                ResultColumn::Any(c) => c.push(spec.value(acc)?),
            }
        }
        self.len += 1;
        Ok(self.len - 1)
    }

    /// Forgets the last row.
    fn pop(&mut self) {
        for col in &mut self.columns {
            match col {
                ResultColumn::I64(c) => drop(c.pop()),
                ResultColumn::F64(c) => drop(c.pop()),
                ResultColumn::Any(c) => drop(c.pop()),
            }
        }
        self.len -= 1;
    }

    /// Rows `a` and `b` hold equal values (DOUBLEs as `ScalarValue`
    /// compares them: NaN equals NaN).
    fn same(&self, a: u32, b: u32) -> bool {
        let (a, b) = (a as usize, b as usize);
        self.columns.iter().all(|col| match col {
            ResultColumn::I64(c) => c[a] == c[b],
            ResultColumn::F64(c) => match (c[a], c[b]) {
                (Some(x), Some(y)) => x.total_cmp(&y).is_eq(),
                (x, y) => x.is_none() && y.is_none(),
            },
            ResultColumn::Any(c) => c[a] == c[b],
        })
    }

    /// Call `j`'s column over every row, its values moved out.
    fn column(&mut self, j: usize) -> Result<ArrayRef> {
        Ok(match &mut self.columns[j] {
            ResultColumn::I64(c) => Arc::new(Int64Array::from(std::mem::take(c))),
            ResultColumn::F64(c) => Arc::new(Float64Array::from(std::mem::take(c))),
            ResultColumn::Any(c) => ScalarValue::iter_to_array(std::mem::take(c))?,
        })
    }
}

/// After a change to a key: its result row emitted against the one it
/// showed (`+I`, `-U`/`+U`, or nothing when equal and `skip_equal`).
fn show(
    results: &mut Results,
    specs: &[AggSpec],
    accs: &KeyAccs,
    shown: &mut Option<u32>,
    row: u32,
    skip_equal: bool,
    emitted: &mut Vec<Emitted>,
) -> Result<()> {
    let values = results.push(specs, accs)?;
    match *shown {
        None => emitted.push(Emitted {
            kind: RowKind::Insert,
            row,
            values,
        }),
        Some(old) if skip_equal && results.same(old, values) => {
            results.pop();
            return Ok(());
        }
        Some(old) => {
            emitted.push(Emitted {
                kind: RowKind::UpdateBefore,
                row,
                values: old,
            });
            emitted.push(Emitted {
                kind: RowKind::UpdateAfter,
                row,
                values,
            });
        }
    }
    *shown = Some(values);
    Ok(())
}

impl PlanNode for GroupAggregateNode {
    fn describe(&self) -> String {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        let aggs: Vec<String> = self.aggregates.iter().map(|a| a.to_string()).collect();
        let ttl = self
            .state_ttl
            .map(|t| format!(" stateTtl={}", humantime_ms(t)))
            .unwrap_or_default();
        format!(
            "GroupAggregate: keys [{}] aggregates [{}]{ttl}",
            keys.join(", "),
            aggs.join(", ")
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some(
            "accumulators and row count by key group|key; MIN/MAX/DISTINCT value counts by key group|key|aggregate|value"
                .into(),
        )
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "group",
            format!(
                "keys={};aggs={}",
                canonical_exprs(&self.keys),
                self.aggregates
                    .iter()
                    .map(|a| format!(
                        "{}{}({}){}:{}{}{}",
                        a.func.name().to_ascii_lowercase(),
                        if a.distinct { " distinct" } else { "" },
                        a.arg.as_ref().map(canonical_expr).unwrap_or_else(|| "*".into()),
                        a.filter
                            .as_ref()
                            .map(|f| format!(" filter {}", canonical_expr(f)))
                            .unwrap_or_default(),
                        type_name(&a.output_type),
                        a.separator
                            .as_ref()
                            .map(|s| format!(" separator {s:?}"))
                            .unwrap_or_default(),
                        if a.ignore_nulls { " ignore nulls" } else { "" }
                    ))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        )
    }

    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.keys)
    }

    // Updates always; deletes when input rows can leave a key.
    fn changelog(&self, input: &ChangelogMode) -> ChangelogMode {
        ChangelogMode {
            updates: true,
            deletes: !input.is_insert_only(),
            upsert_key: Some((0..self.keys.len()).collect()),
            no_update_before: false,
        }
    }
}

/// The operator of a GROUP BY's subtask.
pub fn build(node: &GroupAggregateNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let mut state = ctx.keyed_state(STATES)?;
    if node.state_ttl.is_some() {
        state.set_ttl(node.state_ttl);
    }
    let insert_only = ctx.input_insert_only();
    if ctx.rocksdb() {
        // Hot keys stay in memory between snapshots. The value counts too
        // over insert-only input: only DISTINCT reads them then, by key
        // (MIN/MAX rescan them, uncached, only when a retraction takes
        // their extreme).
        let states: &[usize] = if insert_only { &[ACC, MAP] } else { &[ACC] };
        state.cache(states, STATE_CACHE_ENTRIES);
    }
    Ok(Box::new(
        GroupAggregateOperator::new(
            node,
            &ctx.input_schema()?,
            ctx.schema(),
            state,
            ctx.metrics.clone(),
            insert_only,
        )?
        .with_mini_batch(match &ctx.config.mini_batch_size {
            Some(Err(message)) => return Err(ExecError::Config(message.clone())),
            Some(Ok(size)) => Some(*size),
            None => None,
        }),
    ))
}

impl GroupAggregateOperator {
    pub fn new(
        node: &GroupAggregateNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
        insert_only: bool,
    ) -> Result<Self> {
        let key_encoder = KeyEncoder::for_keys(&node.keys, input_schema)?;
        let specs = node
            .aggregates
            .iter()
            .map(|c| AggSpec::new(c, insert_only))
            .collect::<Result<Vec<_>>>()?;
        let keys: Vec<String> = node.keys.iter().map(|k| k.to_string()).collect();
        Ok(Self {
            name: format!("GroupAggregate [{}]", keys.join(", ")),
            keys: node.keys.clone(),
            key_encoder,
            maps: map_slots(&specs),
            specs,
            schema,
            state,
            metrics,
            live: HashMap::new(),
            live_limit: LIVE_KEYS,
            insert_only,
            mini_batch: None,
        })
    }

    /// Emits a key's result once per bundle of at most `size` rows (see
    /// [`GroupAggregateOperator::mini_batch`]).
    pub fn with_mini_batch(mut self, size: Option<usize>) -> Self {
        self.mini_batch = size.filter(|n| *n > 0);
        self
    }

    fn entry<'a>(&self, slot: &Slot, key: &'a [u8], namespace: &'a [u8]) -> EntryRef<'a> {
        EntryRef {
            key_group: slot.group,
            key,
            namespace,
        }
    }

    /// MIN/MAX after its extreme left: the best value with a positive
    /// count, from state overlaid with this batch's counts.
    fn rescan(
        &self,
        agg: usize,
        slot: &Slot,
        key: &[u8],
        counts: &ValueCounts,
        slot_id: u32,
    ) -> Result<Option<ScalarValue>> {
        let ns = (agg as u16).to_be_bytes();
        let mut live: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        let mut bad = None;
        self.state
            .scan_namespaces(MAP, self.entry(slot, key, &ns), &mut |rest, v| {
                match decode_count(v) {
                    Some(c) => {
                        live.insert(rest.to_vec(), c);
                    }
                    None => bad = Some(v.len()),
                }
                true
            })?;
        if let Some(len) = bad {
            return Err(crate::error::StateError::Corrupt {
                state: "group-agg-map".into(),
                message: format!("a value count of {len} bytes"),
            }
            .into());
        }
        for ((s, nsv), start) in counts.entries.iter().zip(&counts.start) {
            if *s == slot_id && nsv.starts_with(&ns) {
                live.insert(nsv[2..].to_vec(), counts.count[*start as usize]);
            }
        }
        let present: Vec<&[u8]> = live
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(v, _)| v.as_slice())
            .collect();
        if present.is_empty() {
            return Ok(None);
        }
        let spec = &self.specs[agg];
        Ok(spec.best(spec.decode_values(present)?.into_iter()))
    }
}

impl Operator for GroupAggregateOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        self.write_live()?;
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn processing_time_interval(&self) -> Option<std::time::Duration> {
        self.state.expiry_interval()
    }

    fn on_processing_time(&mut self, now: i64, _out: &mut Collector) -> Result<()> {
        crate::operators::expire_state(&mut self.state, now)
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        match self.mini_batch {
            // Bundles of at most `size` rows.
            Some(size) if batch.num_rows() > size => {
                let mut at = 0;
                while at < batch.num_rows() {
                    let len = size.min(batch.num_rows() - at);
                    self.process_bundle(batch.slice(at, len), out)?;
                    at += len;
                }
                Ok(())
            }
            _ => self.process_bundle(batch, out),
        }
    }
}

impl GroupAggregateOperator {
    /// Writes the live keys' changed accumulators to state (they stay
    /// live, clean).
    fn write_live(&mut self) -> Result<()> {
        let mut w = KeyedWrite::default();
        let mut unwritten = 0;
        for (key, live) in self.live.iter_mut().filter(|(_, l)| l.dirty) {
            let b = live.accs.encode(&self.specs)?;
            let e = EntryRef {
                key_group: live.group,
                key,
                namespace: &[],
            };
            let old = live.stored_len.replace(b.len());
            w.put(ACC, e, old, b);
            live.dirty = false;
            unwritten -= std::mem::take(&mut live.unwritten);
        }
        // The state counts them now.
        self.metrics.state_bytes.fetch_add(unwritten, Ordering::Relaxed);
        Ok(self.state.write(w)?)
    }

    /// Applies `batch`'s changes: one state read and one write per key;
    /// a result per row, or per key with mini-batch.
    fn process_bundle(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let rows = &batch.rows;
        let key_arrays = self
            .keys
            .iter()
            .map(|k| k.evaluate(rows).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let key_rows = match &self.key_encoder {
            Some(enc) => Some(enc.encode(&key_arrays)?),
            None => None,
        };
        let key_of = |i: usize| -> &[u8] { key_rows.as_ref().map_or(&[][..], |r| r.row(i)) };

        // The batch's keys, in order of first appearance.
        let mut slot_of: HashMap<&[u8], u32> = HashMap::new();
        let mut slots: Vec<Slot> = vec![];
        let mut row_slot: Vec<u32> = Vec::with_capacity(n);
        for i in 0..n {
            let k = key_of(i);
            let s = *slot_of.entry(k).or_insert_with(|| {
                slots.push(Slot {
                    group: self.state.key_group(k),
                    row: i,
                    stored_len: None,
                    accs: None,
                    shown: None,
                    dirty: false,
                    live: None,
                });
                (slots.len() - 1) as u32
            });
            row_slot.push(s);
        }
        let use_live = !self.state.ttl_enabled();
        let mut results = Results::new(&self.specs);
        let mut unknown: Vec<usize> = vec![];
        for (i, slot) in slots.iter_mut().enumerate() {
            match use_live.then(|| self.live.remove_entry(key_of(slot.row))).flatten() {
                Some((key, live)) => {
                    // Without TTL a key's shown row is its accumulators'
                    // values: a change that leaves them equal emits
                    // nothing.
                    slot.shown = Some(results.push(&self.specs, &live.accs)?);
                    slot.accs = Some(live.accs);
                    slot.stored_len = live.stored_len;
                    slot.live = Some((key, live.dirty, live.unwritten));
                }
                None => unknown.push(i),
            }
        }
        let stored = {
            let entries: Vec<EntryRef> = unknown
                .iter()
                .map(|i| self.entry(&slots[*i], key_of(slots[*i].row), &[]))
                .collect();
            self.state.get(ACC, &entries)?
        };
        for (i, bytes) in unknown.into_iter().zip(stored) {
            let slot = &mut slots[i];
            if let Some(b) = bytes {
                let accs = KeyAccs::decode(&b, &self.specs)?;
                slot.shown = Some(results.push(&self.specs, &accs)?);
                slot.stored_len = Some(b.len());
                slot.accs = Some(accs);
            }
        }

        // Each call's input and filter for the batch.
        let mut args: Vec<Option<ArrayRef>> = Vec::with_capacity(self.specs.len());
        let mut filters: Vec<Option<BooleanArray>> = Vec::with_capacity(self.specs.len());
        let mut encoded: Vec<Option<crate::state::codec::Rows>> = Vec::with_capacity(self.specs.len());
        for spec in &self.specs {
            let arg = match &spec.call.arg {
                Some(a) => Some(spec.prepare(a.evaluate(rows)?.into_array(n)?)?),
                None => None,
            };
            let filter = match &spec.call.filter {
                Some(f) => {
                    let m = f.evaluate(rows)?.into_array(n)?;
                    let m = m
                        .as_any()
                        .downcast_ref::<BooleanArray>()
                        .ok_or_else(|| ExecError::internal("aggregate FILTER is not boolean"))?;
                    Some(crate::change::null_as_false(m))
                }
                None => None,
            };
            let leads_map = self.maps[encoded.len()].is_some_and(|m| m.leader == encoded.len());
            encoded.push(match (&spec.codec, &arg) {
                (Some(codec), Some(a)) if leads_map => Some(codec.encode(std::slice::from_ref(a))?),
                _ => None,
            });
            args.push(arg);
            filters.push(filter);
        }
        // Whether row i takes part in call j: its FILTER holds and its
        // argument is not NULL (COUNT(*) counts every row; ARRAY_AGG keeps
        // NULLs unless told to ignore them).
        let takes = |j: usize, i: usize| -> bool {
            let call = &self.specs[j].call;
            let keeps_nulls = call.func == AggFunc::ArrayAgg && !call.ignore_nulls;
            filters[j].as_ref().is_none_or(|f| f.value(i))
                && (keeps_nulls || args[j].as_ref().is_none_or(|a| a.is_valid(i)))
        };

        // Value counts of MIN/MAX/DISTINCT calls touched by the batch:
        // each distinct (key, call, value) once, and for every row and
        // call the index of its entry (found once, here, not per row
        // below).
        let mut counts = ValueCounts::default();
        let mut row_entry: Vec<Vec<u32>> = vec![vec![]; self.specs.len()];
        if encoded.iter().any(Option::is_some) {
            let mut index: HashMap<(u32, usize, &[u8]), u32> = HashMap::new();
            for (l, enc) in encoded.iter().enumerate() {
                let Some(enc) = enc else { continue };
                let members: Vec<usize> = (0..self.specs.len())
                    .filter(|m| self.maps[*m].is_some_and(|s| s.leader == l))
                    .collect();
                let width = members.len();
                for &m in &members {
                    row_entry[m] = vec![u32::MAX; n];
                }
                for i in 0..n {
                    if !members.iter().any(|&m| takes(m, i)) {
                        continue;
                    }
                    let e = *index.entry((row_slot[i], l, enc.row(i))).or_insert_with(|| {
                        let mut ns = (l as u16).to_be_bytes().to_vec();
                        ns.extend_from_slice(enc.row(i));
                        counts.entries.push((row_slot[i], ns));
                        counts.start.push(counts.count.len() as u32);
                        counts.count.extend(std::iter::repeat_n(0, width));
                        (counts.entries.len() - 1) as u32
                    });
                    for &m in &members {
                        if takes(m, i) {
                            row_entry[m][i] = e;
                        }
                    }
                }
            }
            let entries: Vec<EntryRef> = counts
                .entries
                .iter()
                .map(|(s, ns)| {
                    let slot = &slots[*s as usize];
                    self.entry(slot, key_of(slot.row), ns)
                })
                .collect();
            counts.stored = vec![None; counts.entries.len()];
            for (e, v) in self.state.get(MAP, &entries)?.into_iter().enumerate() {
                let Some(v) = v else { continue };
                counts.stored[e] = Some(v.len());
                let start = counts.start[e] as usize;
                let end = counts.start.get(e + 1).map_or(counts.count.len(), |s| *s as usize);
                if decode_map_value(&v, &mut counts.count[start..end], self.insert_only).is_none() {
                    return Err(crate::error::StateError::Corrupt {
                        state: "group-agg-map".into(),
                        message: format!("{} bytes do not hold {} value counts", v.len(), end - start),
                    }
                    .into());
                }
            }
            counts.dirty = vec![false; counts.entries.len()];
        }

        let mut emitted: Vec<Emitted> = vec![];
        let mut dropped = 0u64;
        for (i, &s) in row_slot.iter().enumerate() {
            let kind = batch.kind(i);
            let sign: i64 = if kind.is_accumulate() { 1 } else { -1 };
            let first = slots[s as usize].accs.is_none();
            if first && kind.is_retract() {
                // Nothing to retract from: never seen, or expired.
                dropped += 1;
                continue;
            }
            let mut accs = slots[s as usize]
                .accs
                .take()
                .unwrap_or_else(|| KeyAccs::new(&self.specs));
            accs.rows += sign;
            for (j, spec) in self.specs.iter().enumerate() {
                if !takes(j, i) {
                    continue;
                }
                let acc = &mut accs.accs[j];
                if self.maps[j].is_none() {
                    if matches!(spec.call.func, AggFunc::Min | AggFunc::Max) {
                        // Insert-only input: no value ever leaves.
                        if let Some(a) = &args[j]
                            && sign > 0
                        {
                            spec.offer(acc, ScalarValue::try_from_array(a, i)?);
                        }
                    } else if spec.values_of.is_some() {
                        if let Some(a) = &args[j] {
                            spec.present(acc, a, i, sign)?;
                        }
                    } else if spec.call.func.keeps_a_value() {
                        if let Some(a) = &args[j]
                            && sign > 0
                        {
                            spec.keep(acc, a, i)?;
                        }
                    } else {
                        spec.add(acc, args[j].as_ref(), i, sign);
                    }
                    continue;
                }
                let e = row_entry[j][i] as usize;
                let c = counts.start[e] as usize + self.maps[j].map_or(0, |m| m.pos);
                let before = counts.count[c];
                let after = before + sign;
                counts.count[c] = after;
                counts.dirty[e] = true;
                match spec.call.func {
                    AggFunc::Min | AggFunc::Max => {
                        let v = || args[j].as_ref().map(|a| ScalarValue::try_from_array(a, i)).transpose();
                        if sign > 0 && after > 0 {
                            if let Some(v) = v()? {
                                spec.offer(acc, v);
                            }
                        } else if sign < 0
                            && after == 0
                            && matches!(&*acc, Acc::Extreme(Some(c)) if Some(c) == v()?.as_ref())
                        {
                            let best = self.rescan(j, &slots[s as usize], key_of(slots[s as usize].row), &counts, s)?;
                            *acc = Acc::Extreme(best);
                        }
                    }
                    // DISTINCT: the inner call sees a value when it
                    // appears and when it is gone.
                    _ if sign > 0 && before == 0 && after == 1 => spec.add(acc, args[j].as_ref(), i, 1),
                    _ if sign < 0 && before == 1 && after == 0 => spec.add(acc, args[j].as_ref(), i, -1),
                    _ => {}
                }
            }
            let slot = &mut slots[s as usize];
            slot.dirty = true;
            if self.mini_batch.is_some() {
                // The key's result is emitted once, after the bundle.
                if accs.rows != 0 {
                    slot.accs = Some(accs);
                }
                continue;
            }
            if accs.rows == 0 {
                if let Some(old) = slot.shown.take() {
                    emitted.push(Emitted {
                        kind: RowKind::Delete,
                        row: i as u32,
                        values: old,
                    });
                }
                continue;
            }
            // With TTL Flink re-emits an unchanged result, so that
            // downstream state is not evicted too early.
            let skip_equal = !self.state.ttl_enabled();
            show(
                &mut results,
                &self.specs,
                &accs,
                &mut slot.shown,
                i as u32,
                skip_equal,
                &mut emitted,
            )?;
            slot.accs = Some(accs);
        }
        if dropped > 0 {
            self.metrics.late_rows_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        if self.mini_batch.is_some() {
            // Each changed key's result against what it showed before the
            // bundle, in order of the keys' first rows.
            for slot in slots.iter_mut().filter(|s| s.dirty) {
                let row = slot.row as u32;
                let Some(accs) = &slot.accs else {
                    if let Some(old) = slot.shown.take() {
                        emitted.push(Emitted {
                            kind: RowKind::Delete,
                            row,
                            values: old,
                        });
                    }
                    continue;
                };
                let skip_equal = !self.state.ttl_enabled();
                show(
                    &mut results,
                    &self.specs,
                    accs,
                    &mut slot.shown,
                    row,
                    skip_equal,
                    &mut emitted,
                )?;
            }
        }

        // One write for the batch: held live, a key's accumulators wait
        // for a snapshot or a full live map.
        let mut w = KeyedWrite::default();
        for slot in slots.iter_mut().filter(|s| s.dirty) {
            let e = self.entry(slot, key_of(slot.row), &[]);
            match &slot.accs {
                Some(_) if use_live => {}
                Some(accs) => {
                    let b = accs.encode(&self.specs)?;
                    let old = slot.stored_len.replace(b.len());
                    w.put(ACC, e, old, b);
                }
                None => w.delete(ACC, e, slot.stored_len.take()),
            }
        }
        for (e, ((s, ns), _)) in counts
            .entries
            .iter()
            .zip(&counts.dirty)
            .enumerate()
            .filter(|(_, (_, d))| **d)
        {
            let slot = &slots[*s as usize];
            let entry = self.entry(slot, key_of(slot.row), ns);
            let start = counts.start[e] as usize;
            let end = counts.start.get(e + 1).map_or(counts.count.len(), |s| *s as usize);
            let c = &counts.count[start..end];
            let old = counts.stored[e];
            if c.iter().all(|c| *c == 0) {
                w.delete(MAP, entry, old);
            } else {
                w.put(MAP, entry, old, encode_map_value(c, self.insert_only));
            }
        }
        self.state.write(w)?;
        if use_live {
            // A key that fails the batch half way is not put back: the
            // task fails and restarts from its last checkpoint.
            let mut grown = 0;
            for slot in slots {
                let Some(accs) = slot.accs else {
                    grown -= slot.live.map_or(0, |l| l.2);
                    continue;
                };
                let (key, was_dirty, before) = slot.live.unwrap_or_else(|| (key_of(slot.row).to_vec(), false, 0));
                let unwritten = match (before, slot.stored_len) {
                    (0, None) => unwritten_bytes(&key, self.specs.len()),
                    (n, _) => n,
                };
                grown += unwritten - before;
                let live = LiveKey {
                    group: slot.group,
                    accs,
                    stored_len: slot.stored_len,
                    dirty: was_dirty || slot.dirty,
                    unwritten,
                };
                self.live.insert(key, live);
            }
            self.metrics.state_bytes.fetch_add(grown, Ordering::Relaxed);
            if self.live.len() > self.live_limit {
                self.write_live()?;
                self.live.clear();
            }
        }

        if emitted.is_empty() {
            return Ok(());
        }
        let idx = UInt32Array::from_iter_values(emitted.iter().map(|e| e.row));
        let mut columns: Vec<ArrayRef> = key_arrays
            .iter()
            .map(|a| take(a.as_ref(), &idx, None))
            .collect::<Result<_, _>>()?;
        let values = UInt32Array::from_iter_values(emitted.iter().map(|e| e.values));
        for j in 0..self.specs.len() {
            columns.push(take(results.column(j)?.as_ref(), &values, None)?);
        }
        let kinds = emitted.iter().map(|e| e.kind).collect();
        out.emit(ChangeBatch::new(batch_with_schema(&self.schema, columns)?, kinds));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::testing::feed_pretty;
    use crate::plan::{AggCall, AggFunc};
    use crate::state::HeapBackend;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    fn input() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    /// `SELECT k, COUNT(*), SUM(v), MAX(v), COUNT(DISTINCT v) GROUP BY k`
    /// over an updating input.
    fn group_by_k() -> GroupAggregateOperator {
        let v = || -> Option<Arc<dyn PhysicalExpr>> { Some(Arc::new(Column::new("v", 1))) };
        let call = |func, arg, distinct| AggCall {
            func,
            arg,
            distinct,
            filter: None,
            input_type: DataType::Int64,
            output_type: DataType::Int64,
            separator: None,
            ignore_nulls: false,
        };
        let node = GroupAggregateNode {
            keys: vec![Arc::new(Column::new("k", 0))],
            aggregates: vec![
                call(AggFunc::Count, None, false),
                call(AggFunc::Sum, v(), false),
                call(AggFunc::Max, v(), false),
                call(AggFunc::Count, v(), true),
            ],
            state_ttl: None,
        };
        let out = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("c", DataType::Int64, false),
            Field::new("s", DataType::Int64, true),
            Field::new("m", DataType::Int64, true),
            Field::new("d", DataType::Int64, false),
        ]));
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        let metrics = Arc::new(NodeMetrics::new("group".into()));
        GroupAggregateOperator::new(&node, &input(), out, state, metrics, false).expect("operator")
    }

    /// Each change of a key retracts its last result and emits the new
    /// one (Flink's `-U`/`+U`); a MAX whose extreme is retracted falls back
    /// to the next value; the last row gone deletes the key's result.
    #[test]
    fn changes_update_and_retract_each_keys_result() {
        let mut g = group_by_k();
        let s = input();
        assert_eq!(feed_pretty(&mut g, 0, &s, "+I a 1"), ["+I[a, 1, 1, 1, 1]"]);
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "+I a 3"),
            ["-U[a, 1, 1, 1, 1]", "+U[a, 2, 4, 3, 2]"]
        );
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "+I a 3"),
            ["-U[a, 2, 4, 3, 2]", "+U[a, 3, 7, 3, 2]"]
        );
        assert_eq!(feed_pretty(&mut g, 0, &s, "+I b ."), ["+I[b, 1, null, null, 0]"]);
        // One 3 goes: the other keeps MAX and the distinct count.
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "-D a 3"),
            ["-U[a, 3, 7, 3, 2]", "+U[a, 2, 4, 3, 2]"]
        );
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "-U a 3"),
            ["-U[a, 2, 4, 3, 2]", "+U[a, 1, 1, 1, 1]"]
        );
        assert_eq!(feed_pretty(&mut g, 0, &s, "-D a 1"), ["-D[a, 1, 1, 1, 1]"]);
        assert_eq!(g.state.size_bytes(), g.state.counted_bytes().expect("count"));
        assert_eq!(feed_pretty(&mut g, 0, &s, "-D b ."), ["-D[b, 1, null, null, 0]"]);
        assert_eq!(g.state.size_bytes(), 0, "every key's state is gone");
        assert_eq!(g.state.counted_bytes().expect("count"), 0);
    }

    /// With mini-batch a bundle's changes to a key are one result: `-U`
    /// the key's result before the bundle, `+U` after it; a key inserted
    /// and deleted inside one bundle emits nothing; bundles are at most
    /// the configured size.
    #[test]
    fn mini_batch_emits_each_keys_result_once_per_bundle() {
        let mut g = group_by_k().with_mini_batch(Some(3));
        let s = input();
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "+I a 1\n+I a 3\n+I b 2"),
            ["+I[a, 2, 4, 3, 2]", "+I[b, 1, 2, 2, 1]"]
        );
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "+I a 5\n-D a 1\n+I c 9\n-D c 9"),
            // Bundles of 3: the first ends after `+I c 9`, the second
            // deletes c again.
            [
                "-U[a, 2, 4, 3, 2]",
                "+U[a, 2, 8, 5, 2]",
                "+I[c, 1, 9, 9, 1]",
                "-D[c, 1, 9, 9, 1]"
            ]
        );
        // A key deleted and inserted again in one bundle: one update.
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "-D b 2\n+I b 4"),
            ["-U[b, 1, 2, 2, 1]", "+U[b, 1, 4, 4, 1]"]
        );
        // Inserted and deleted inside one bundle: nothing.
        assert!(feed_pretty(&mut g, 0, &s, "+I d 1\n-D d 1").is_empty());
    }

    /// Without TTL a key's accumulators stay live between batches and
    /// reach state at a snapshot, or when more keys than the limit are
    /// live (then all are written and forgotten): read back from state,
    /// they continue where they were.
    #[test]
    fn live_accumulators_reach_state_at_snapshots_and_when_too_many() {
        let mut g = group_by_k();
        let s = input();
        feed_pretty(&mut g, 0, &s, "+I a 1\n+I b 2\n+I a 4");
        assert_eq!(g.live.len(), 2);
        // Not in state yet, the live keys are in the state-size metric
        // (the state's own size is not in this test's metric).
        let m = g.metrics.clone();
        let metric = move || m.state_bytes.load(Ordering::Relaxed);
        let unwritten = |g: &GroupAggregateOperator| g.live.values().map(|l| l.unwritten).sum::<i64>();
        assert!(unwritten(&g) > 0);
        assert_eq!(metric(), unwritten(&g));
        assert!(g.live.values().all(|l| l.dirty && l.stored_len.is_none()));
        g.snapshot_state(1).expect("snapshot");
        assert!(g.live.values().all(|l| !l.dirty && l.stored_len.is_some()));
        assert_eq!(metric(), 0, "written: the state counts them");
        assert_eq!(g.state.size_bytes(), g.state.counted_bytes().expect("count"));
        // Forgotten: the next change reads the snapshot's accumulators.
        g.live.clear();
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "+I a 6"),
            ["-U[a, 2, 5, 4, 2]", "+U[a, 3, 11, 6, 3]"]
        );
        g.live_limit = 1;
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "+I c 5\n+I b 3"),
            ["+I[c, 1, 5, 5, 1]", "-U[b, 1, 2, 2, 1]", "+U[b, 2, 5, 3, 2]"]
        );
        assert!(g.live.is_empty(), "more than the limit: written and forgotten");
        assert_eq!(metric(), 0);
        g.live_limit = 10;
        feed_pretty(&mut g, 0, &s, "+I e 1\n+I f 2");
        assert_eq!(metric(), unwritten(&g));
        assert!(metric() > 0);
        // Gone before it was ever written: nothing left counted.
        feed_pretty(&mut g, 0, &s, "-D e 1\n-D f 2");
        assert_eq!(metric(), 0);
        assert_eq!(
            feed_pretty(&mut g, 0, &s, "-D c 5\n+I a 1"),
            ["-D[c, 1, 5, 5, 1]", "-U[a, 3, 11, 6, 3]", "+U[a, 4, 12, 6, 3]"]
        );
        assert_eq!(g.state.size_bytes(), g.state.counted_bytes().expect("count"));
    }

    #[test]
    fn distinct_entries_over_insert_only_input_hold_presence_bits() {
        let c = [3, 0, 1, 70, 0, 0, 0, 0, 2];
        let bits = encode_map_value(&c, true);
        assert_eq!(bits, [0b0000_1101, 0b1]);
        let mut out = [0; 9];
        decode_map_value(&bits, &mut out, true).expect("bits");
        assert_eq!(out, [1, 0, 1, 1, 0, 0, 0, 0, 1]);
        // Counts written by an earlier build (or over updating input)
        // read as counts.
        let counts = encode_counts(&c);
        decode_map_value(&counts, &mut out, true).expect("counts");
        assert_eq!(out, c);
        assert_eq!(encode_map_value(&c, false), counts);
        // One call keeps its count.
        assert_eq!(encode_map_value(&[5], true), encode_counts(&[5]));
    }
}
