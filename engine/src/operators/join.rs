//! Regular joins (INNER, LEFT, RIGHT, FULL OUTER) on equality keys, with
//! an optional extra condition: Flink's `StreamingJoinOperator` over
//! insert-only or updating inputs. Input 0 is the left side, input 1 the
//! right; each arrives hash-exchanged by its join key.
//!
//! State, through the keyed-state layer ([`KeyedState`]): per side a value
//! state (`join-left`, `join-right`) keyed by the join key, namespace =
//! the whole row in Weir's key encoding, value = (count, associations):
//! a multiset of the side's live rows (Flink's `NoUniqueKey` layout), and
//! for a row-preserving (outer) side the number of rows of the other side
//! it matches, so the null-padded row is retracted when its first match
//! comes and re-emitted when its last match goes.
//!
//! A batch of one side costs one multi-get of its own rows and one prefix
//! scan of the other side per distinct key; the extra condition is
//! evaluated once over every candidate pair; then rows apply in order,
//! emitting what Flink emits for each:
//! - inner joins forward the input's kind (`+I`/`+U` for matches of an
//!   added row, `-U`/`-D` for a retracted one); outer joins emit `+I` for
//!   added rows, and for retracted ones `-D` from a row-preserving side,
//!   the input's kind from the other;
//! - an added row without a match on a row-preserving side: `+I[row, nulls]`;
//!   retracted: `-D[row, nulls]`;
//! - the first match of a row-preserving other-side row retracts its padded
//!   row first; its last match gone re-emits it.
//!
//! Rows whose join key has a NULL never match (they are not stored: a
//! row-preserving side emits and retracts them padded).
//!
//! A cache keeps, per side and join key, the side's complete stored rows
//! under the key once a scan has read them (a key with none included):
//! a hot key's other side is not scanned again, and its own rows are not
//! read again, while the state backend keeps the same entries (every
//! write goes to both). Bounded by [`CACHED_ROWS`] (emptied when full),
//! and unused with TTL (state may expire behind it).

use hashbrown::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, ArrayRef, BooleanArray, UInt32Array, new_null_array};
use arrow::compute::take;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::physical_expr::PhysicalExpr;

use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::{KeyEncoder, key_group};
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{JoinNode, JoinType};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::RowCodec;
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind};

/// The operator's states (index = input); names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "join-left",
        kind: StateKind::Value,
        ttl: true,
    },
    StateDecl {
        name: "join-right",
        kind: StateKind::Value,
        ttl: true,
    },
];

/// Rows (and keys) the join's cache holds at most, both sides together.
const CACHED_ROWS: usize = 500_000;

/// A side's stored rows under one key, in state order (byte order of the
/// row encoding, as a scan returns them).
type CachedKey = std::collections::BTreeMap<Vec<u8>, Entry>;

pub struct JoinOperator {
    name: String,
    join_type: JoinType,
    keys: [Vec<Arc<dyn PhysicalExpr>>; 2],
    key_encoder: KeyEncoder,
    /// Encodes each side's whole rows.
    row_codecs: [RowCodec; 2],
    schemas: [SchemaRef; 2],
    filter: Option<Arc<dyn PhysicalExpr>>,
    /// `left ++ right`, for the extra condition.
    pair_schema: SchemaRef,
    schema: SchemaRef,
    state: KeyedState,
    max_parallelism: u16,
    metrics: Arc<NodeMetrics>,
    /// Per side: join key → every row of the side under it.
    cache: [HashMap<Vec<u8>, CachedKey>; 2],
    cached: usize,
    cache_enabled: bool,
    /// [`CACHED_ROWS`], smaller in tests.
    cache_limit: usize,
}

/// A stored row's (count, associations).
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    count: i64,
    assoc: i64,
}

/// Stored as two varints (mostly 2 bytes: count 1, no associations).
fn encode_entry(e: Entry) -> Vec<u8> {
    crate::state::codec::encode_counts(&[e.count, e.assoc])
}

fn decode_entry(side: usize, v: &[u8]) -> Result<Entry> {
    let mut c = [0; 2];
    crate::state::codec::decode_counts(v, &mut c).ok_or_else(|| StateError::Corrupt {
        state: STATES[side].name.into(),
        message: format!(
            "a row entry of {} bytes does not hold a count and an association count",
            v.len()
        ),
    })?;
    Ok(Entry {
        count: c[0],
        assoc: c[1],
    })
}

/// The stored entry of namespace `ns` under the key of slot `s`.
fn entry_of<'a>(slots: &[(u16, usize)], keys: &'a crate::state::codec::Rows, s: u32, ns: &'a [u8]) -> EntryRef<'a> {
    let (group, first) = slots[s as usize];
    EntryRef {
        key_group: group,
        key: keys.row(first),
        namespace: ns,
    }
}

/// A stored row of the other side, met by this batch.
struct Other {
    slot: u32,
    row: Vec<u8>,
    entry: Entry,
    dirty: bool,
}

impl JoinOperator {
    pub fn new(
        node: &JoinNode,
        schema: SchemaRef,
        max_parallelism: u16,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self> {
        let key_types = node
            .left_keys
            .iter()
            .map(|k| k.data_type(&node.left_schema))
            .collect::<Result<Vec<_>, _>>()?;
        let codec = |s: &SchemaRef| {
            let types: Vec<_> = s.fields().iter().map(|f| f.data_type().clone()).collect();
            RowCodec::new(&types).map_err(ExecError::internal)
        };
        let mut fields: Vec<_> = node.left_schema.fields().iter().cloned().collect();
        fields.extend(node.right_schema.fields().iter().cloned());
        let keys: Vec<String> = node
            .left_keys
            .iter()
            .zip(&node.right_keys)
            .map(|(l, r)| format!("{l} = {r}"))
            .collect();
        Ok(Self {
            name: format!("Join {} ON {}", node.join_type.sql(), keys.join(" AND ")),
            join_type: node.join_type,
            keys: [node.left_keys.clone(), node.right_keys.clone()],
            key_encoder: KeyEncoder::new(&key_types)?,
            row_codecs: [codec(&node.left_schema)?, codec(&node.right_schema)?],
            schemas: [node.left_schema.clone(), node.right_schema.clone()],
            filter: node.filter.clone(),
            pair_schema: Arc::new(arrow::datatypes::Schema::new(fields)),
            schema,
            state,
            max_parallelism,
            metrics,
            cache: [HashMap::new(), HashMap::new()],
            cached: 0,
            cache_enabled: true,
            cache_limit: CACHED_ROWS,
        })
    }

    /// Whether to keep the row cache: worth it over RocksDB, a second copy
    /// over heap state.
    pub fn with_cache(mut self, enabled: bool) -> Self {
        self.cache_enabled = enabled;
        self
    }

    /// Whether side `side`'s rows are kept without a match.
    fn keeps(&self, side: usize) -> bool {
        if self.join_type.semi_anti().is_some() {
            // The left side counts its matches (its rows show or not by
            // them); the right side is only matched against.
            return side == 0;
        }
        if side == 0 {
            self.join_type.keeps_left()
        } else {
            self.join_type.keeps_right()
        }
    }

    /// `rows` of `this` side at `this_idx` beside `others` at `other_idx`,
    /// ordered left ++ right (`None` indexes are NULL rows).
    fn pairs(
        &self,
        side: usize,
        rows: &RecordBatch,
        this_idx: &UInt32Array,
        others: &RecordBatch,
        other_idx: &UInt32Array,
    ) -> Result<Vec<ArrayRef>> {
        let pick = |b: &RecordBatch, idx: &UInt32Array| -> Result<Vec<ArrayRef>> {
            if b.num_rows() == 0 {
                return Ok(b
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| new_null_array(f.data_type(), idx.len()))
                    .collect());
            }
            Ok(b.columns()
                .iter()
                .map(|c| take(c.as_ref(), idx, None))
                .collect::<Result<Vec<_>, _>>()?)
        };
        let (mine, theirs) = (pick(rows, this_idx)?, pick(others, other_idx)?);
        Ok(if side == 0 {
            mine.into_iter().chain(theirs).collect()
        } else {
            theirs.into_iter().chain(mine).collect()
        })
    }
}

impl Operator for JoinOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn processing_time_interval(&self) -> Option<std::time::Duration> {
        self.state.expiry_interval()
    }

    fn on_processing_time(&mut self, now: i64, _out: &mut Collector) -> Result<()> {
        crate::operators::expire_state(&mut self.state, now, &self.metrics)
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        self.process_input(0, batch, out)
    }

    fn process_input(&mut self, side: usize, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        if side > 1 {
            return Err(ExecError::internal(format!("a join has inputs 0 and 1, not {side}")));
        }
        let other = 1 - side;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let rows = &batch.rows;
        let key_arrays = self.keys[side]
            .iter()
            .map(|k| k.evaluate(rows).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let null_key = |i: usize| key_arrays.iter().any(|a| a.is_null(i));
        let key_rows = self.key_encoder.encode(&key_arrays)?;
        let row_bytes = self.row_codecs[side].encode(rows.columns())?;

        // The batch's join keys, and this side's stored rows it touches.
        let mut slot_of: HashMap<&[u8], u32> = HashMap::new();
        let mut slots: Vec<(u16, usize)> = vec![];
        let mut row_slot: Vec<Option<u32>> = Vec::with_capacity(n);
        for i in 0..n {
            if null_key(i) {
                row_slot.push(None);
                continue;
            }
            let k = key_rows.row(i);
            let s = *slot_of.entry(k).or_insert_with(|| {
                slots.push((key_group(k, self.max_parallelism), i));
                (slots.len() - 1) as u32
            });
            row_slot.push(Some(s));
        }
        let mut mine: HashMap<(u32, &[u8]), (Entry, usize)> = HashMap::new();
        let mut wanted: Vec<(u32, &[u8])> = vec![];
        for (i, s) in row_slot.iter().enumerate() {
            if let Some(s) = s
                && !mine.contains_key(&(*s, row_bytes.row(i)))
            {
                mine.insert((*s, row_bytes.row(i)), (Entry::default(), 0));
                wanted.push((*s, row_bytes.row(i)));
            }
        }
        let use_cache = self.cache_enabled && !self.state.ttl_enabled();
        if use_cache {
            // Rows of keys whose whole list is cached are known.
            wanted.retain(
                |(s, r)| match self.cache[side].get(key_rows.row(slots[*s as usize].1)) {
                    Some(list) => {
                        if let Some(e) = list.get(*r) {
                            mine.insert((*s, *r), (*e, 16));
                        }
                        false
                    }
                    None => true,
                },
            );
        }
        let refs: Vec<EntryRef> = wanted.iter().map(|(s, r)| entry_of(&slots, &key_rows, *s, r)).collect();
        for (k, v) in wanted.iter().zip(self.state.get(side, &refs)?) {
            if let Some(v) = v {
                mine.insert(*k, (decode_entry(side, &v)?, v.len()));
            }
        }

        // The other side's rows under each key.
        let mut others: Vec<Other> = vec![];
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::with_capacity(slots.len());
        for s in 0..slots.len() as u32 {
            let start = others.len();
            let key = key_rows.row(slots[s as usize].1);
            if let Some(list) = self.cache[other].get(key).filter(|_| use_cache) {
                others.extend(list.iter().map(|(row, e)| Other {
                    slot: s,
                    row: row.clone(),
                    entry: *e,
                    dirty: false,
                }));
                ranges.push(start..others.len());
                continue;
            }
            let mut bad = None;
            self.state
                .scan_namespaces(other, entry_of(&slots, &key_rows, s, &[]), &mut |row, v| {
                    match decode_entry(other, v) {
                        Ok(e) if e.count > 0 => others.push(Other {
                            slot: s,
                            row: row.to_vec(),
                            entry: e,
                            dirty: false,
                        }),
                        Ok(_) => {}
                        Err(e) => bad = Some(e),
                    }
                    true
                })?;
            if let Some(e) = bad {
                return Err(e);
            }
            if use_cache {
                // The scan read the key's whole list: keep it.
                let list: CachedKey = others[start..].iter().map(|o| (o.row.clone(), o.entry)).collect();
                self.cached += list.len() + 1;
                self.cache[other].insert(key.to_vec(), list);
            }
            ranges.push(start..others.len());
        }
        let other_rows = {
            let cols = self.row_codecs[other].decode(others.iter().map(|o| o.row.as_slice()))?;
            let options = RecordBatchOptions::new().with_row_count(Some(others.len()));
            RecordBatch::try_new_with_options(self.schemas[other].clone(), cols, &options)?
        };

        // Matches: every candidate pair, minus those the extra condition
        // rejects (evaluated once for the batch).
        let mut cand_this = vec![];
        let mut cand_other = vec![];
        for (i, s) in row_slot.iter().enumerate() {
            if let Some(s) = s {
                for j in ranges[*s as usize].clone() {
                    cand_this.push(i as u32);
                    cand_other.push(j as u32);
                }
            }
        }
        let keep: Option<BooleanArray> = match &self.filter {
            Some(f) if !cand_this.is_empty() => {
                let cols = self.pairs(
                    side,
                    rows,
                    &UInt32Array::from(cand_this.clone()),
                    &other_rows,
                    &UInt32Array::from(cand_other.clone()),
                )?;
                let options = RecordBatchOptions::new().with_row_count(Some(cand_this.len()));
                let pairs = RecordBatch::try_new_with_options(self.pair_schema.clone(), cols, &options)?;
                let m = f.evaluate(&pairs)?.into_array(pairs.num_rows())?;
                let m = m
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| ExecError::internal("join condition is not boolean"))?;
                Some(crate::change::null_as_false(m))
            }
            _ => None,
        };
        let mut matches: Vec<Vec<usize>> = vec![vec![]; n];
        for (p, (i, j)) in cand_this.iter().zip(&cand_other).enumerate() {
            if keep.as_ref().is_none_or(|k| k.value(p)) {
                matches[*i as usize].push(*j as usize);
            }
        }

        // Rows in order: state changes and what Flink emits for each.
        let (this_outer, other_outer) = (self.keeps(side), self.keeps(other));
        let inner = self.join_type == JoinType::Inner;
        let semi_anti = self.join_type.semi_anti();
        let mut kinds: Vec<RowKind> = vec![];
        let mut this_idx: Vec<Option<u32>> = vec![];
        let mut other_idx: Vec<Option<u32>> = vec![];
        let mut emit = |kind: RowKind, i: Option<usize>, j: Option<usize>, times: i64| {
            for _ in 0..times.max(0) {
                kinds.push(kind);
                this_idx.push(i.map(|i| i as u32));
                other_idx.push(j.map(|j| j as u32));
            }
        };
        for i in 0..n {
            let kind = batch.kind(i);
            let add = kind.is_accumulate();
            let Some(s) = row_slot[i] else {
                // A NULL key matches nothing: an anti join shows the row.
                if let Some(anti) = semi_anti {
                    if anti && side == 0 {
                        emit(kind, Some(i), None, 1);
                    }
                    continue;
                }
                if this_outer {
                    emit(if add { RowKind::Insert } else { RowKind::Delete }, Some(i), None, 1);
                }
                continue;
            };
            let ms = &matches[i];
            let total: i64 = ms.iter().map(|j| others[*j].entry.count).sum();
            if let Some((e, _)) = mine.get_mut(&(s, row_bytes.row(i))) {
                if add {
                    e.count += 1;
                    if this_outer {
                        e.assoc = total;
                    }
                } else if e.count > 0 {
                    e.count -= 1;
                }
            }
            if let Some(anti) = semi_anti {
                if side == 0 {
                    // A left row shows while it has a match (semi) or none
                    // (anti), with its own kind.
                    if (total > 0) != anti {
                        emit(kind, Some(i), None, 1);
                    }
                    continue;
                }
                // A right row changes whether its matches show.
                for &j in ms {
                    let o = &mut others[j];
                    let c = o.entry.count;
                    o.dirty = true;
                    if add {
                        if o.entry.assoc == 0 {
                            emit(if anti { RowKind::Delete } else { RowKind::Insert }, None, Some(j), c);
                        }
                        o.entry.assoc += 1;
                    } else {
                        o.entry.assoc -= 1;
                        if o.entry.assoc == 0 {
                            emit(if anti { RowKind::Insert } else { RowKind::Delete }, None, Some(j), c);
                        }
                    }
                }
                continue;
            }
            if ms.is_empty() {
                if this_outer {
                    emit(if add { RowKind::Insert } else { RowKind::Delete }, Some(i), None, 1);
                }
                continue;
            }
            for &j in ms {
                let o = &mut others[j];
                let c = o.entry.count;
                if add {
                    if other_outer {
                        if o.entry.assoc == 0 {
                            emit(RowKind::Delete, None, Some(j), c);
                        }
                        o.entry.assoc += 1;
                        o.dirty = true;
                    }
                    emit(if inner { kind } else { RowKind::Insert }, Some(i), Some(j), c);
                } else {
                    // A row-preserving side's retraction deletes; the other
                    // side's keeps its kind (Flink: `-U[l, r]` then the
                    // padded `+I[l, null]`).
                    emit(if this_outer { RowKind::Delete } else { kind }, Some(i), Some(j), c);
                    if other_outer {
                        o.entry.assoc -= 1;
                        o.dirty = true;
                        if o.entry.assoc == 0 {
                            emit(RowKind::Insert, None, Some(j), c);
                        }
                    }
                }
            }
        }

        // One write for the batch.
        let mut w = KeyedWrite::default();
        let mut grown = 0i64;
        for (&(s, row), &(e, stored)) in &mine {
            let size = (row.len() + 18) as i64;
            if e.count > 0 {
                grown += if stored == 0 { size } else { 0 };
                w.put(side, entry_of(&slots, &key_rows, s, row), encode_entry(e));
            } else if stored > 0 {
                grown -= size;
                w.delete(side, entry_of(&slots, &key_rows, s, row));
            }
        }
        for o in others.iter().filter(|o| o.dirty) {
            w.put(
                other,
                entry_of(&slots, &key_rows, o.slot, &o.row),
                encode_entry(o.entry),
            );
        }
        self.state.write(w)?;
        if use_cache {
            // The cached lists change as the state did.
            for (&(s, row), &(e, _)) in &mine {
                if let Some(list) = self.cache[side].get_mut(key_rows.row(slots[s as usize].1)) {
                    if e.count > 0 {
                        if list.insert(row.to_vec(), e).is_none() {
                            self.cached += 1;
                        }
                    } else if list.remove(row).is_some() {
                        self.cached -= 1;
                    }
                }
            }
            for o in others.iter().filter(|o| o.dirty) {
                if let Some(list) = self.cache[other].get_mut(key_rows.row(slots[o.slot as usize].1))
                    && let Some(e) = list.get_mut(&o.row)
                {
                    *e = o.entry;
                }
            }
            if self.cached > self.cache_limit {
                self.cache = [HashMap::new(), HashMap::new()];
                self.cached = 0;
            }
        } else if self.cached > 0 {
            self.cache = [HashMap::new(), HashMap::new()];
            self.cached = 0;
        }
        self.metrics.state_bytes.fetch_add(grown, Ordering::Relaxed);

        if kinds.is_empty() {
            return Ok(());
        }
        let mut cols = self.pairs(
            side,
            rows,
            &UInt32Array::from(this_idx),
            &other_rows,
            &UInt32Array::from(other_idx),
        )?;
        if semi_anti.is_some() {
            // Left columns alone.
            cols.truncate(self.schemas[0].fields().len());
        }
        out.emit(ChangeBatch::new(batch_with_schema(&self.schema, cols)?, kinds));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The join edge cases of the changelog reference (changelog.md §8,
    //! cases 18-23), row by row.
    use super::*;
    use crate::state::HeapBackend;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    fn side(name: &str) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(format!("{name}k"), DataType::Utf8, true),
            Field::new(format!("{name}v"), DataType::Int64, true),
        ]))
    }

    fn join(join_type: JoinType) -> JoinOperator {
        let (l, r) = (side("l"), side("r"));
        let node = JoinNode {
            join_type,
            left_keys: vec![Arc::new(Column::new("lk", 0))],
            right_keys: vec![Arc::new(Column::new("rk", 0))],
            filter: None,
            left_schema: l.clone(),
            right_schema: r.clone(),
            state_ttl: [None, None],
        };
        let out = Arc::new(Schema::new(
            l.fields()
                .iter()
                .chain(r.fields().iter())
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        let state = KeyedState::new(Box::new(HeapBackend::new(2)), STATES, 0..128);
        JoinOperator::new(&node, out, 128, state, Arc::new(NodeMetrics::new("join".into()))).expect("join")
    }

    /// Feeds one change to `input` and returns what the join emits.
    fn feed(j: &mut JoinOperator, input: usize, kind: RowKind, k: Option<&str>, v: i64) -> Vec<String> {
        let rows = RecordBatch::try_new(
            j.schemas[input].clone(),
            vec![
                Arc::new(StringArray::from(vec![k])),
                Arc::new(Int64Array::from(vec![v])),
            ],
        )
        .expect("row");
        let mut out = Collector::default();
        j.process_input(input, ChangeBatch::new(rows, vec![kind]), &mut out)
            .expect("process");
        out.take()
            .iter()
            .flat_map(|b| crate::connectors::print::format_changes(b).expect("format"))
            .collect()
    }

    use RowKind::*;

    #[test]
    fn inner_join_forwards_the_kind_of_the_change() {
        let mut j = join(JoinType::Inner);
        assert!(feed(&mut j, 1, Insert, Some("a"), 1).is_empty());
        assert_eq!(feed(&mut j, 0, Insert, Some("a"), 10), ["+I[a, 10, a, 1]"]);
        assert_eq!(feed(&mut j, 0, UpdateBefore, Some("a"), 10), ["-U[a, 10, a, 1]"]);
        assert_eq!(feed(&mut j, 0, UpdateAfter, Some("a"), 11), ["+U[a, 11, a, 1]"]);
    }

    #[test]
    fn left_join_pads_and_retracts_the_padding_as_matches_come_and_go() {
        let mut j = join(JoinType::Left);
        assert_eq!(feed(&mut j, 0, Insert, Some("a"), 10), ["+I[a, 10, null, null]"]);
        assert_eq!(
            feed(&mut j, 1, Insert, Some("a"), 1),
            ["-D[a, 10, null, null]", "+I[a, 10, a, 1]"]
        );
        // A second match: no padding to retract.
        assert_eq!(feed(&mut j, 1, Insert, Some("a"), 2), ["+I[a, 10, a, 2]"]);
        // The first match goes: only its row (case 20).
        assert_eq!(feed(&mut j, 1, Delete, Some("a"), 1), ["-D[a, 10, a, 1]"]);
        // The last match goes (as an update's -U): the padded row returns.
        assert_eq!(
            feed(&mut j, 1, UpdateBefore, Some("a"), 2),
            ["-U[a, 10, a, 2]", "+I[a, 10, null, null]"]
        );
        assert_eq!(feed(&mut j, 0, Delete, Some("a"), 10), ["-D[a, 10, null, null]"]);
    }

    #[test]
    fn full_join_pads_whichever_side_comes_first() {
        let mut j = join(JoinType::Full);
        assert_eq!(feed(&mut j, 1, Insert, Some("a"), 1), ["+I[null, null, a, 1]"]);
        assert_eq!(
            feed(&mut j, 0, Insert, Some("a"), 10),
            ["-D[null, null, a, 1]", "+I[a, 10, a, 1]"]
        );
        assert_eq!(
            feed(&mut j, 0, Delete, Some("a"), 10),
            ["-D[a, 10, a, 1]", "+I[null, null, a, 1]"]
        );
    }

    #[test]
    fn duplicates_match_once_per_copy_and_null_keys_never_match() {
        let mut j = join(JoinType::Left);
        assert!(feed(&mut j, 1, Insert, Some("a"), 1).is_empty());
        assert!(feed(&mut j, 1, Insert, Some("a"), 1).is_empty());
        assert_eq!(
            feed(&mut j, 0, Insert, Some("a"), 10),
            ["+I[a, 10, a, 1]", "+I[a, 10, a, 1]"]
        );
        // One copy retracted: one -D per match of it.
        assert_eq!(feed(&mut j, 1, Delete, Some("a"), 1), ["-D[a, 10, a, 1]"]);
        assert!(feed(&mut j, 1, Insert, None, 1).is_empty());
        assert_eq!(feed(&mut j, 0, Insert, None, 5), ["+I[null, 5, null, null]"]);
        assert_eq!(feed(&mut j, 0, Delete, None, 5), ["-D[null, 5, null, null]"]);
    }

    /// Many changes of both sides, several rows per batch: the same output
    /// with the row cache off, tiny (emptied every few batches) and large.
    #[test]
    fn the_row_cache_changes_nothing_but_the_reads() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for join_type in [JoinType::Inner, JoinType::Left, JoinType::Right, JoinType::Full] {
            let mut ops = [join(join_type).with_cache(false), join(join_type), join(join_type)];
            ops[1].cache_limit = 3;
            // Live rows per side, so retractions take back what is there.
            let mut live: [Vec<(String, i64)>; 2] = [vec![], vec![]];
            for _ in 0..300 {
                let side = (next() % 2) as usize;
                let mut ks = vec![];
                let mut kinds = vec![];
                let mut vs = vec![];
                for _ in 0..(1 + next() % 4) {
                    if !live[side].is_empty() && next() % 3 == 0 {
                        let (k, v) = live[side].remove((next() % live[side].len() as u64) as usize);
                        ks.push(k);
                        vs.push(v);
                        kinds.push(Delete);
                    } else {
                        let k = ["a", "b", "c", "d"][(next() % 4) as usize].to_string();
                        let v = (next() % 3) as i64;
                        live[side].push((k.clone(), v));
                        ks.push(k);
                        vs.push(v);
                        kinds.push(Insert);
                    }
                }
                let outs: Vec<Vec<String>> = ops
                    .iter_mut()
                    .map(|j| {
                        let rows = RecordBatch::try_new(
                            j.schemas[side].clone(),
                            vec![
                                Arc::new(StringArray::from(ks.clone())),
                                Arc::new(Int64Array::from(vs.clone())),
                            ],
                        )
                        .expect("rows");
                        let mut out = Collector::default();
                        j.process_input(side, ChangeBatch::new(rows, kinds.clone()), &mut out)
                            .expect("process");
                        out.take()
                            .iter()
                            .flat_map(|b| crate::connectors::print::format_changes(b).expect("format"))
                            .collect()
                    })
                    .collect();
                assert_eq!(outs[0], outs[1], "{join_type:?}: tiny cache");
                assert_eq!(outs[0], outs[2], "{join_type:?}: cache");
            }
        }
    }
}
