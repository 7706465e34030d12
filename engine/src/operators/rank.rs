//! Top-N and deduplication (`ROW_NUMBER() OVER (PARTITION BY .. ORDER BY
//! ..)` filtered to the first N): Flink's `AppendOnlyTopNFunction` /
//! `RetractableTopNFunction` and its rowtime keep-last deduplication, row
//! by row.
//!
//! State, through the keyed-state layer ([`KeyedState`]): `rank-rows`
//! (value state), partition key → the partition's rows in rank order, each
//! in Weir's key encoding. With insert-only input only the top N are kept
//! (a row that fell out can never come back); with updating input every
//! row is, so a retracted top row is replaced by the next one.
//!
//! A new row goes after the rows it ties with (the earlier arrival ranks
//! first). What is emitted, as Flink does:
//! - with the rank column: a row entering at rank r shifts ranks r..N
//!   (`-U[old, k]`, `+U[new, k]` for each), and a partition that had fewer
//!   than N rows gains `+I[last, size]`; a retraction shifts them back and
//!   the partition's former last rank, now empty, is `-D`;
//! - without it: only rows entering and leaving the top N change: `+I[new]`
//!   and `-D[evicted]`, `-D[retracted]` and `+I[promoted]`;
//! - keep-last deduplication: the first row `+I`, then a row whose time is
//!   at least the kept one's replaces it: `-U[old]`, `+U[new]`.

use hashbrown::HashMap;
use std::cmp::Ordering as CmpOrdering;
use std::sync::Arc;

use arrow::array::{ArrayRef, UInt64Array};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::ScalarValue;
use datafusion::physical_expr::PhysicalExpr;

use crate::canonical::canonical_exprs;
use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::KeyEncoder;
use crate::operators::build::{BuildCtx, STATE_CACHE_ENTRIES};
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{PlanNode, StateKeys, StreamNode, canonical_order};
use crate::plan::{RankNode, RankStrategy, SortKey};
use crate::state::codec::{RowCodec, RowList};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind};

const ROWS: usize = 0;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[StateDecl {
    name: "rank-rows",
    kind: StateKind::Value,
    ttl: true,
}];

pub struct RankOperator {
    name: String,
    strategy: RankStrategy,
    partition: Vec<Arc<dyn PhysicalExpr>>,
    /// `None`: one partition (no PARTITION BY).
    key_encoder: Option<KeyEncoder>,
    order: Vec<SortKey>,
    limit: usize,
    with_rank: bool,
    /// Keep every row (updating input), not only the top N.
    keep_all: bool,
    /// Flink's UpdateFast: the input's upsert key columns ([`RankNode`]).
    update_key: Option<Vec<usize>>,
    input_schema: SchemaRef,
    codec: RowCodec,
    schema: SchemaRef,
    state: KeyedState,
    /// Partitions as the last batches left them, decoded (the state holds
    /// the same rows as bytes): a hot partition is not decoded again.
    /// Emptied when it outgrows [`DECODED_PARTITIONS`], and unused with
    /// TTL (state may expire behind it).
    decoded: hashbrown::HashMap<Vec<u8>, (Vec<Ranked>, usize)>,
}

/// Decoded partitions a rank operator keeps.
const DECODED_PARTITIONS: usize = 100_000;

/// A ranked row: its sort key, its bytes, and (UpdateFast only) its
/// upsert key's values.
#[derive(Clone)]
struct Ranked {
    sort: Vec<ScalarValue>,
    row: Vec<u8>,
    ukey: Vec<ScalarValue>,
}

/// A partition met by the batch.
struct Part {
    group: u16,
    /// A row of the batch holding its key.
    first: usize,
    rows: Vec<Ranked>,
    stored: bool,
    /// Bytes of the stored value (state size accounting).
    stored_len: usize,
    dirty: bool,
}

impl PlanNode for RankNode {
    fn describe(&self) -> String {
        let r = self;
        let part: Vec<String> = r.partition.iter().map(|k| k.to_string()).collect();
        let order: Vec<String> = r.order.iter().map(|k| k.to_string()).collect();
        let what = match r.strategy {
            RankStrategy::TopN => format!(
                "Rank: ROW_NUMBER <= {}{}{}",
                r.limit,
                if r.with_rank { "" } else { " (rank not output)" },
                r.update_key.as_ref().map_or(String::new(), |k| format!(
                    " update-fast by [{}]",
                    k.iter().map(|c| format!("${c}")).collect::<Vec<_>>().join(", ")
                ))
            ),
            RankStrategy::KeepLastRowtime => "Deduplicate: keep last row (rowtime)".to_string(),
            RankStrategy::KeepFirstRowtime => "Deduplicate: keep first row (rowtime)".to_string(),
            RankStrategy::KeepLastProctime => "Deduplicate: keep last row (proctime)".to_string(),
            RankStrategy::KeepFirstProctime => "Deduplicate: keep first row (proctime)".to_string(),
            RankStrategy::Window {
                later_ties_first: true, ..
            } => "WindowDeduplicate: keep last row (rowtime)".to_string(),
            RankStrategy::Window { .. } => format!(
                "WindowRank: ROW_NUMBER <= {}{}{}",
                r.limit,
                if r.with_rank { "" } else { " (rank not output)" },
                r.zone
                    .as_ref()
                    .map(|z| format!(" in time zone {}", z.id))
                    .unwrap_or_default()
            ),
        };
        format!(
            "{what} PARTITION BY [{}] ORDER BY [{}]",
            part.join(", "),
            order.join(", ")
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some(match self.strategy {
            RankStrategy::Window { .. } => "each window partition's top rows by key group|partition key (with the window bounds); a timer per partition at window_end - 1, when they are emitted and freed".into(),
            _ => "the partition's ranked rows by key group|partition key (the top N for insert-only input, every row for updating input)".into(),
        })
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "rank",
            format!(
                "{:?};n={};rank={};partition={};order={}",
                self.strategy,
                self.limit,
                self.with_rank,
                canonical_exprs(&self.partition),
                canonical_order(&self.order)
            ),
        )
    }

    // Top-N, deduplication, window Top-N and deduplication.
    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.partition)
    }
}

/// The operator of a Top-N's subtask.
pub fn build(node: &RankNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let mut state = ctx.keyed_state(STATES)?;
    if ctx.rocksdb() {
        // Hot keys stay in memory between snapshots.
        state.cache(&[0], STATE_CACHE_ENTRIES);
    }
    // Updating input: every row is kept, so a retracted top row has a
    // successor.
    let keep_all = !ctx.input_insert_only();
    Ok(Box::new(RankOperator::new(
        node,
        &ctx.input_schema()?,
        ctx.schema(),
        keep_all,
        state,
    )?))
}

impl RankOperator {
    pub fn new(
        node: &RankNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        keep_all: bool,
        state: KeyedState,
    ) -> Result<Self> {
        let key_encoder = KeyEncoder::for_keys(&node.partition, input_schema)?;
        let types: Vec<_> = input_schema.fields().iter().map(|f| f.data_type().clone()).collect();
        Ok(Self {
            name: match node.strategy {
                RankStrategy::TopN => format!("Rank <= {}", node.limit),
                RankStrategy::KeepLastRowtime => "Deduplicate (keep last)".into(),
                RankStrategy::KeepFirstRowtime | RankStrategy::KeepFirstProctime => "Deduplicate (keep first)".into(),
                RankStrategy::KeepLastProctime => "Deduplicate (keep last)".into(),
                RankStrategy::Window { .. } => "WindowRank".into(),
            },
            strategy: node.strategy,
            partition: node.partition.clone(),
            key_encoder,
            order: node.order.clone(),
            limit: node.limit.max(1),
            with_rank: node.with_rank,
            keep_all,
            update_key: node.update_key.clone(),
            input_schema: input_schema.clone(),
            codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            schema,
            state,
            decoded: hashbrown::HashMap::new(),
        })
    }

    fn compare(&self, a: &[ScalarValue], b: &[ScalarValue]) -> CmpOrdering {
        compare_sort_keys(&self.order, a, b)
    }

    fn sort_keys(&self, batch: &RecordBatch) -> Result<Vec<Vec<ScalarValue>>> {
        sort_keys_of(&self.order, batch)
    }

    /// Each row's upsert-key values (UpdateFast), else empty.
    fn upsert_keys(&self, batch: &RecordBatch) -> Result<Vec<Vec<ScalarValue>>> {
        let Some(cols) = &self.update_key else {
            return Ok(vec![vec![]; batch.num_rows()]);
        };
        (0..batch.num_rows())
            .map(|i| {
                cols.iter()
                    .map(|c| Ok(ScalarValue::try_from_array(batch.column(*c), i)?))
                    .collect::<Result<Vec<_>>>()
            })
            .collect()
    }

    fn decode_rows(&self, bytes: &[u8]) -> Result<Vec<Ranked>> {
        let corrupt = |m: &str| StateError::Corrupt {
            state: "rank-rows".into(),
            message: format!("a partition of {} bytes: {m}", bytes.len()),
        };
        let rows = RowList::decode(bytes).ok_or_else(|| corrupt("truncated row"))?;
        let cols = self.codec.decode(rows.iter().copied())?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        let batch = RecordBatch::try_new_with_options(self.input_schema.clone(), cols, &options)?;
        let sorts = self.sort_keys(&batch)?;
        let ukeys = self.upsert_keys(&batch)?;
        Ok(rows
            .into_iter()
            .zip(sorts)
            .zip(ukeys)
            .map(|((row, sort), ukey)| Ranked {
                sort,
                row: row.to_vec(),
                ukey,
            })
            .collect())
    }

    fn encode_rows(rows: &[Ranked]) -> Vec<u8> {
        RowList::encode(rows.iter().map(|r| r.row.as_slice()))
    }
}

/// Lexicographic order of sort keys with each key's direction and NULL
/// placement (shared with the window rank).
pub(crate) fn compare_sort_keys(order: &[SortKey], a: &[ScalarValue], b: &[ScalarValue]) -> CmpOrdering {
    for ((x, y), k) in a.iter().zip(b).zip(order) {
        let o = match (x.is_null(), y.is_null()) {
            (true, true) => CmpOrdering::Equal,
            (true, false) => {
                if k.nulls_first {
                    CmpOrdering::Less
                } else {
                    CmpOrdering::Greater
                }
            }
            (false, true) => {
                if k.nulls_first {
                    CmpOrdering::Greater
                } else {
                    CmpOrdering::Less
                }
            }
            (false, false) => {
                let o = x.partial_cmp(y).unwrap_or(CmpOrdering::Equal);
                if k.asc { o } else { o.reverse() }
            }
        };
        if o != CmpOrdering::Equal {
            return o;
        }
    }
    CmpOrdering::Equal
}

/// Sort keys of `batch`'s rows.
pub(crate) fn sort_keys_of(order: &[SortKey], batch: &RecordBatch) -> Result<Vec<Vec<ScalarValue>>> {
    let cols = order
        .iter()
        .map(|k| k.expr.evaluate(batch).and_then(|v| v.into_array(batch.num_rows())))
        .collect::<Result<Vec<_>, _>>()?;
    (0..batch.num_rows())
        .map(|i| {
            cols.iter()
                .map(|c| Ok(ScalarValue::try_from_array(c, i)?))
                .collect::<Result<Vec<_>>>()
        })
        .collect()
}

/// One emitted change: kind, row bytes, rank.
type Emitted = (RowKind, Vec<u8>, u64);

impl Operator for RankOperator {
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
        crate::operators::expire_state(&mut self.state, now)
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let rows = &batch.rows;
        let key_rows = match &self.key_encoder {
            Some(enc) => {
                let arrays = self
                    .partition
                    .iter()
                    .map(|k| k.evaluate(rows).and_then(|v| v.into_array(n)))
                    .collect::<Result<Vec<_>, _>>()?;
                Some(enc.encode(&arrays)?)
            }
            None => None,
        };
        let key_of = |i: usize| -> &[u8] { key_rows.as_ref().map_or(&[][..], |r| r.row(i)) };
        let row_bytes = self.codec.encode(rows.columns())?;
        let sorts = self.sort_keys(rows)?;
        let mut ukeys = self.upsert_keys(rows)?;

        let mut part_of: HashMap<&[u8], usize> = HashMap::new();
        let mut parts: Vec<Part> = vec![];
        let mut row_part = Vec::with_capacity(n);
        for i in 0..n {
            let k = key_of(i);
            let p = *part_of.entry(k).or_insert_with(|| {
                parts.push(Part {
                    group: self.state.key_group(k),
                    first: i,
                    rows: vec![],
                    stored: false,
                    stored_len: 0,
                    dirty: false,
                });
                parts.len() - 1
            });
            row_part.push(p);
        }
        let use_decoded = !self.state.ttl_enabled();
        let mut unknown: Vec<usize> = vec![];
        for (i, p) in parts.iter_mut().enumerate() {
            match use_decoded.then(|| self.decoded.remove(key_of(p.first))).flatten() {
                Some((rows, len)) => {
                    p.rows = rows;
                    p.stored = true;
                    p.stored_len = len;
                }
                None => unknown.push(i),
            }
        }
        let entries: Vec<EntryRef> = unknown
            .iter()
            .map(|i| EntryRef {
                key_group: parts[*i].group,
                key: key_of(parts[*i].first),
                namespace: &[],
            })
            .collect();
        let stored = self.state.get(ROWS, &entries)?;
        for (i, bytes) in unknown.into_iter().zip(stored) {
            if let Some(b) = bytes {
                parts[i].rows = self.decode_rows(&b)?;
                parts[i].stored = true;
                parts[i].stored_len = b.len();
            }
        }

        let limit = self.limit;
        let mut emitted: Vec<Emitted> = vec![];
        for i in 0..n {
            let part = &mut parts[row_part[i]];
            let kind = batch.kind(i);
            let new = Ranked {
                sort: sorts[i].clone(),
                row: row_bytes.row(i).to_vec(),
                ukey: std::mem::take(&mut ukeys[i]),
            };
            if self.strategy == RankStrategy::KeepFirstProctime {
                // Flink's `ProcTimeDeduplicateKeepFirstRowFunction`: the
                // key's first row at once, later rows dropped (the input
                // is insert-only: the planner picks this only then).
                if kind.is_accumulate() && part.rows.is_empty() {
                    emitted.push((RowKind::Insert, new.row.clone(), 1));
                    part.rows = vec![new];
                    part.dirty = true;
                }
                continue;
            }
            if matches!(
                self.strategy,
                RankStrategy::KeepLastRowtime | RankStrategy::KeepLastProctime
            ) {
                // One kept row; equal or later time replaces it (on
                // processing time every row is later: arrival order).
                let old = part.rows.first().cloned();
                if kind.is_retract() {
                    if old.as_ref().is_some_and(|o| o.row == new.row) {
                        part.rows.clear();
                        part.dirty = true;
                        emitted.push((RowKind::Delete, new.row, 1));
                    }
                    continue;
                }
                match old {
                    None => emitted.push((RowKind::Insert, new.row.clone(), 1)),
                    Some(o)
                        if self.strategy == RankStrategy::KeepLastProctime
                            || self.compare(&new.sort, &o.sort) != CmpOrdering::Greater =>
                    {
                        emitted.push((RowKind::UpdateBefore, o.row, 1));
                        emitted.push((RowKind::UpdateAfter, new.row.clone(), 1));
                    }
                    Some(_) => continue,
                }
                part.rows = vec![new];
                part.dirty = true;
                continue;
            }
            if self.update_key.is_some() && kind != RowKind::Delete {
                // Flink's UpdatableTopNFunction: a `+U` replaces the row
                // of its upsert key where it is; the `-U` before it is not
                // needed (Flink's input sends none).
                if kind == RowKind::UpdateBefore {
                    continue;
                }
                if let Some(old_at) = part.rows.iter().position(|r| r.ukey == new.ukey) {
                    let shown: Vec<Vec<u8>> = if self.with_rank {
                        part.rows.iter().take(limit).map(|r| r.row.clone()).collect()
                    } else {
                        vec![]
                    };
                    let old = part.rows.remove(old_at);
                    let at = part
                        .rows
                        .partition_point(|r| self.compare(&r.sort, &new.sort) != CmpOrdering::Greater);
                    part.rows.insert(at, new);
                    part.dirty = true;
                    let rows = &part.rows;
                    if self.with_rank {
                        // Each rank whose row changed (the partition keeps
                        // its size): their `-U`s, then their `+U`s, in
                        // rank order, as Flink emits them.
                        let changed: Vec<usize> = (0..shown.len())
                            .filter(|k| rows.get(*k).is_some_and(|a| a.row != shown[*k]))
                            .collect();
                        for &k in &changed {
                            emitted.push((RowKind::UpdateBefore, shown[k].clone(), k as u64 + 1));
                        }
                        for &k in &changed {
                            emitted.push((RowKind::UpdateAfter, rows[k].row.clone(), k as u64 + 1));
                        }
                    } else {
                        match (old_at < limit, at < limit) {
                            (true, true) => {
                                emitted.push((RowKind::UpdateBefore, old.row, old_at as u64 + 1));
                                emitted.push((RowKind::UpdateAfter, rows[at].row.clone(), at as u64 + 1));
                            }
                            // It enters: the row it pushes out leaves first.
                            (false, true) => {
                                if let Some(out) = rows.get(limit) {
                                    emitted.push((RowKind::Delete, out.row.clone(), limit as u64 + 1));
                                }
                                emitted.push((RowKind::Insert, rows[at].row.clone(), at as u64 + 1));
                            }
                            // It leaves (not with monotonic sort fields,
                            // kept for safety): the next row enters.
                            (true, false) => {
                                emitted.push((RowKind::Delete, old.row, old_at as u64 + 1));
                                emitted.push((RowKind::Insert, rows[limit - 1].row.clone(), limit as u64));
                            }
                            (false, false) => {}
                        }
                    }
                    continue;
                }
            }
            if kind.is_accumulate() {
                // After the rows it ties with.
                let at = part
                    .rows
                    .partition_point(|r| self.compare(&r.sort, &new.sort) != CmpOrdering::Greater);
                let before = part.rows.len();
                if at >= limit && !self.keep_all {
                    continue;
                }
                part.rows.insert(at, new);
                part.dirty = true;
                if at < limit {
                    let rows = &part.rows;
                    if self.with_rank {
                        for k in at..before.min(limit) {
                            emitted.push((RowKind::UpdateBefore, rows[k + 1].row.clone(), k as u64 + 1));
                            emitted.push((RowKind::UpdateAfter, rows[k].row.clone(), k as u64 + 1));
                        }
                        if before < limit {
                            emitted.push((RowKind::Insert, rows[before].row.clone(), before as u64 + 1));
                        }
                    } else {
                        if before >= limit {
                            emitted.push((RowKind::Delete, rows[limit].row.clone(), limit as u64 + 1));
                        }
                        emitted.push((RowKind::Insert, rows[at].row.clone(), at as u64 + 1));
                    }
                }
                if !self.keep_all {
                    part.rows.truncate(limit);
                }
            } else {
                let Some(at) = part.rows.iter().position(|r| r.row == new.row) else {
                    // Not held: never seen, or beyond the top N.
                    continue;
                };
                let before = part.rows.len();
                // What ranks at..N showed before the row left.
                let shown: Vec<Vec<u8>> = part.rows[at.min(before)..before.min(limit).max(at)]
                    .iter()
                    .map(|r| r.row.clone())
                    .collect();
                let gone = part.rows.remove(at);
                part.dirty = true;
                if at >= limit {
                    continue;
                }
                let rows = &part.rows;
                if self.with_rank {
                    // Each rank from the retracted one down moves up a row;
                    // the last shown rank is left empty when no row follows.
                    for (j, old) in shown.into_iter().enumerate() {
                        let k = at + j;
                        match rows.get(k) {
                            Some(r) => {
                                emitted.push((RowKind::UpdateBefore, old, k as u64 + 1));
                                emitted.push((RowKind::UpdateAfter, r.row.clone(), k as u64 + 1));
                            }
                            None => emitted.push((RowKind::Delete, old, k as u64 + 1)),
                        }
                    }
                } else {
                    emitted.push((RowKind::Delete, gone.row, at as u64 + 1));
                    if before > limit {
                        emitted.push((RowKind::Insert, rows[limit - 1].row.clone(), limit as u64));
                    }
                }
            }
        }

        let mut w = KeyedWrite::default();
        for p in parts.iter_mut().filter(|p| p.dirty) {
            let key = key_of(p.first);
            let e = EntryRef {
                key_group: p.group,
                key,
                namespace: &[],
            };
            let old = p.stored.then_some(p.stored_len);
            if p.rows.is_empty() {
                if p.stored {
                    w.delete(ROWS, e, old);
                }
                p.stored_len = 0;
            } else {
                let value = Self::encode_rows(&p.rows);
                p.stored_len = value.len();
                w.put(ROWS, e, old, value);
            }
        }
        self.state.write(w)?;
        if use_decoded {
            if self.decoded.len() + parts.len() > DECODED_PARTITIONS {
                self.decoded.clear();
            }
            for p in parts.into_iter().filter(|p| !p.rows.is_empty()) {
                self.decoded.insert(key_of(p.first).to_vec(), (p.rows, p.stored_len));
            }
        }

        if emitted.is_empty() {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> = self.codec.decode(emitted.iter().map(|(_, r, _)| r.as_slice()))?;
        if self.schema.fields().len() > columns.len() {
            columns.push(Arc::new(UInt64Array::from_iter_values(
                emitted.iter().map(|(_, _, r)| *r),
            )));
        }
        let kinds = emitted.iter().map(|(k, _, _)| *k).collect();
        out.emit(ChangeBatch::new(batch_with_schema(&self.schema, columns)?, kinds));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::testing::feed_pretty;
    use crate::state::HeapBackend;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::col;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    /// `ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC) <= 2`, the rank
    /// column not selected; `keep_all` over updating input.
    fn top2(keep_all: bool) -> RankOperator {
        let s = schema();
        let node = RankNode {
            strategy: RankStrategy::TopN,
            zone: None,
            partition: vec![col("k", &s).expect("k")],
            order: vec![SortKey {
                expr: col("v", &s).expect("v"),
                asc: false,
                nulls_first: false,
            }],
            limit: 2,
            with_rank: false,
            update_key: None,
        };
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        RankOperator::new(&node, &s, s.clone(), keep_all, state).expect("rank")
    }

    #[test]
    fn a_row_entering_the_top_n_pushes_the_last_one_out() {
        let mut r = top2(false);
        let s = schema();
        assert_eq!(feed_pretty(&mut r, 0, &s, "a 1"), ["+I[a, 1]"]);
        assert_eq!(feed_pretty(&mut r, 0, &s, "a 3"), ["+I[a, 3]"]);
        // Below the top 2: nothing.
        assert!(feed_pretty(&mut r, 0, &s, "a 0").is_empty());
        assert_eq!(feed_pretty(&mut r, 0, &s, "a 2"), ["-D[a, 1]", "+I[a, 2]"]);
        // Another partition ranks apart.
        assert_eq!(feed_pretty(&mut r, 0, &s, "b 0"), ["+I[b, 0]"]);
    }

    #[test]
    fn over_updating_input_a_retracted_top_row_has_its_successor() {
        let mut r = top2(true);
        let s = schema();
        feed_pretty(&mut r, 0, &s, "a 1\na 2\na 3");
        // 3 leaves the top 2: 1, kept though out of the top, comes back.
        assert_eq!(feed_pretty(&mut r, 0, &s, "-D a 3"), ["-D[a, 3]", "+I[a, 1]"]);
        // An update moves a row within the top without changing its set.
        assert_eq!(feed_pretty(&mut r, 0, &s, "-U a 1\n+U a 5"), ["-D[a, 1]", "+I[a, 5]"]);
    }
}
