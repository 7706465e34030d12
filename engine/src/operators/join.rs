//! Regular joins (INNER, LEFT, RIGHT, FULL OUTER) on equality keys, with
//! an optional extra condition: Flink's `StreamingJoinOperator` over
//! insert-only or updating inputs. Input 0 is the left side, input 1 the
//! right; each arrives hash-exchanged by its join key.
//!
//! State, through the keyed-state layer ([`KeyedState`]): per side a value
//! state (`join-left`, `join-right`) keyed by the join key, laid out as
//! Flink's `JoinRecordStateView`s ([`Layout`]):
//! - without a unique key (`NoUniqueKey`): namespace = the whole row in
//!   Weir's key encoding, value = (count, associations): a multiset of the
//!   side's live rows;
//! - by the input's upsert key (`HasUniqueKey`): namespace = the key's
//!   columns, value = (1, associations) and the row; a change replaces or
//!   removes the key's row whatever its other columns hold. When the join
//!   key holds the upsert key (`JoinKeyContainsUniqueKey`) the namespace is
//!   empty: one row per join key.
//!
//! Associations, for a row-preserving (outer) side, count the rows of the
//! other side it matches, so the null-padded row is retracted when its
//! first match comes and re-emitted when its last match goes.
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

use arrow::array::{Array, ArrayRef, BooleanArray, UInt32Array, new_null_array};
use arrow::compute::take;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::physical_expr::PhysicalExpr;

use crate::canonical::{canonical_expr, canonical_exprs};
use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::KeyEncoder;
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{JoinNode, JoinType};
use crate::plan::{PlanNode, StateKeys, StreamNode, humantime_ms};
use crate::state::codec::{RowCodec, counts_len};
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

/// A side's stored rows under one key, by namespace in state order (as a
/// scan returns them).
type CachedKey = std::collections::BTreeMap<Vec<u8>, Cached>;

/// A cached stored row: its entry, and its row when the namespace is not
/// the row (unique-key layout).
#[derive(Debug, Clone)]
struct Cached {
    entry: Entry,
    row: Option<Vec<u8>>,
}

/// How a side's rows are stored (see the module comment).
#[derive(Debug)]
enum Layout {
    Multiset,
    /// `codec` encodes the upsert key's `columns`; `None` when the join key
    /// holds them (empty namespace).
    UniqueKey {
        columns: Vec<usize>,
        codec: Option<RowCodec>,
    },
}

impl Layout {
    fn by_key(&self) -> bool {
        matches!(self, Layout::UniqueKey { .. })
    }
}

pub struct JoinOperator {
    name: String,
    join_type: JoinType,
    keys: [Vec<Arc<dyn PhysicalExpr>>; 2],
    key_encoder: KeyEncoder,
    /// Encodes each side's whole rows.
    row_codecs: [RowCodec; 2],
    layouts: [Layout; 2],
    schemas: [SchemaRef; 2],
    filter: Option<Arc<dyn PhysicalExpr>>,
    /// `left ++ right`, for the extra condition.
    pair_schema: SchemaRef,
    schema: SchemaRef,
    state: KeyedState,
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

/// Stored as two varints (mostly 2 bytes: count 1, no associations),
/// then the row in the unique-key layout.
fn encode_value(e: Entry, row: Option<&[u8]>) -> Vec<u8> {
    let mut v = crate::state::codec::encode_counts(&[e.count, e.assoc]);
    if let Some(row) = row {
        v.extend_from_slice(row);
    }
    v
}

/// The entry of a stored value, and the row after it when `by_key`.
fn decode_value(side: usize, by_key: bool, v: &[u8]) -> Result<(Entry, Option<&[u8]>)> {
    let mut c = [0; 2];
    let counts = crate::state::codec::decode_counts_prefix(v, &mut c).filter(|&at| by_key || at == v.len());
    let at = counts.ok_or_else(|| StateError::Corrupt {
        state: STATES[side].name.into(),
        message: format!(
            "a row entry of {} bytes does not hold a count and an association count{}",
            v.len(),
            if by_key { " before its row" } else { "" }
        ),
    })?;
    let entry = Entry {
        count: c[0],
        assoc: c[1],
    };
    Ok((entry, by_key.then(|| &v[at..])))
}

/// The stored entry of namespace `ns` under the key of slot `s`.
pub(crate) fn entry_of<'a>(
    slots: &[(u16, usize)],
    keys: &'a crate::state::codec::Rows,
    s: u32,
    ns: &'a [u8],
) -> EntryRef<'a> {
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
    ns: Vec<u8>,
    /// The row when the namespace is not the row (unique-key layout).
    row: Option<Vec<u8>>,
    entry: Entry,
    /// The entry as stored (what a write replaces).
    was: Entry,
    dirty: bool,
}

impl Other {
    fn row(&self) -> &[u8] {
        self.row.as_deref().unwrap_or(&self.ns)
    }
}

/// A row of this side's state the batch touches.
#[derive(Debug, Clone, Copy)]
struct Mine {
    entry: Entry,
    /// Bytes stored before the batch (0: none).
    stored: usize,
    /// The batch row that last added it (the row to store by unique key).
    row: Option<usize>,
}

impl PlanNode for JoinNode {
    fn describe(&self) -> String {
        let j = self;
        let on: Vec<String> = j
            .left_keys
            .iter()
            .zip(&j.right_keys)
            .map(|(l, r)| format!("{l} = {r}"))
            .collect();
        let filter = j.filter.as_ref().map(|f| format!(" AND {f}")).unwrap_or_default();
        let ttl = match j.state_ttl {
            [None, None] => String::new(),
            [l, r] => {
                let show = |t: Option<std::time::Duration>| t.map_or("default".to_string(), humantime_ms);
                format!(" stateTtl=[left {}, right {}]", show(l), show(r))
            }
        };
        match &j.interval {
            Some(b) => {
                let (lt, rt) = (
                    j.left_schema
                        .fields()
                        .get(b.left_time)
                        .map_or("?", |f| f.name().as_str()),
                    j.right_schema
                        .fields()
                        .get(b.right_time)
                        .map_or("?", |f| f.name().as_str()),
                );
                format!(
                    "IntervalJoin: {} ON {} AND left.{lt} BETWEEN right.{rt} + {} ms AND right.{rt} + {} ms{filter}{}",
                    j.join_type.sql(),
                    on.join(" AND "),
                    b.lower,
                    b.upper,
                    if b.proctime { " (processing time)" } else { "" }
                )
            }
            None if j.window.is_some() => {
                let zone = j
                    .zone
                    .as_ref()
                    .map(|z| format!(" in time zone {}", z.id))
                    .unwrap_or_default();
                format!(
                    "WindowJoin: {} ON {}{filter}{zone}",
                    j.join_type.sql(),
                    on.join(" AND ")
                )
            }
            None if let Some([lt, rt]) = j.temporal => {
                let name = |s: &SchemaRef, i: usize| s.fields().get(i).map_or("?".to_string(), |f| f.name().clone());
                format!(
                    "TemporalJoin: {} FOR SYSTEM_TIME AS OF left.{} (versions by right.{}) ON {}{filter}",
                    j.join_type.sql(),
                    name(&j.left_schema, lt),
                    name(&j.right_schema, rt),
                    on.join(" AND ")
                )
            }
            None => format!("Join: {} ON {}{filter}{ttl}", j.join_type.sql(), on.join(" AND ")),
        }
    }

    fn explain_state(&self) -> Option<String> {
        Some(if self.temporal.is_some() {
            "left rows by key group|join key|time until the watermark passes them; the right side's versions by key group|join key|version time, those before the latest one the watermark passed freed; a timer per left time and version".into()
        } else if self.window.is_some() {
            "each side's rows by key group|join key (with the window bounds); a timer per key at window_end - 1, when the window's rows are joined, emitted and freed".into()
        } else if self.interval.is_some() {
            "each side's rows by key group|join key|row time|row → (count, matched), cleanup timers by row time; a row is freed (an outer side's unmatched one emitted padded) when the watermark passes the last time the other side can match it".into()
        } else if self.unique_keys == [None, None] {
            "each side's rows by key group|join key|row → (count, matches of an outer side)".into()
        } else {
            format!(
                "left rows by {}; right rows by {}",
                self.state_layout(0),
                self.state_layout(1)
            )
        })
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        let j = self;
        (
            "join",
            format!(
                "{:?};left={};right={};filter={}{}",
                j.join_type,
                canonical_exprs(&j.left_keys),
                canonical_exprs(&j.right_keys),
                j.filter.as_ref().map(canonical_expr).unwrap_or_default(),
                // The state layout: rows by unique key are not a
                // multiset's entries (absent, the uid of before).
                if j.unique_keys == [None, None] {
                    String::new()
                } else {
                    format!(";unique={:?}", j.unique_keys)
                },
            ) + &j
                .interval
                .map(|b| {
                    format!(";interval={},{},{},{}", b.left_time, b.right_time, b.lower, b.upper)
                        + if b.proctime { ";proctime" } else { "" }
                })
                .unwrap_or_default()
                + &j.window.map(|[l, r]| format!(";window={l},{r}")).unwrap_or_default()
                + &j.temporal
                    .map(|[l, r]| format!(";temporal={l},{r}"))
                    .unwrap_or_default(),
        )
    }

    // Every join (regular, interval, window, temporal) keeps both sides
    // under the equi-join keys; the left side's stand for both (the
    // planner coerces them to one type).
    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.left_keys)
    }
}

/// The operator of a regular join's subtask.
pub fn build(node: &JoinNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let mut state = ctx.keyed_state(STATES)?;
    // A STATE_TTL hint sets a side's TTL instead of the job's.
    for (side, ttl) in node.state_ttl.iter().enumerate() {
        if ttl.is_some() {
            state.set_state_ttl(side, *ttl);
        }
    }
    Ok(Box::new(
        JoinOperator::new(node, ctx.schema(), state)?.with_cache(ctx.rocksdb()),
    ))
}

impl JoinOperator {
    pub fn new(node: &JoinNode, schema: SchemaRef, state: KeyedState) -> Result<Self> {
        let layout = |side: usize, schema: &SchemaRef| -> Result<Layout> {
            let Some(columns) = node.unique_keys[side].clone() else {
                return Ok(Layout::Multiset);
            };
            let codec = if node.join_key_holds_unique_key(side) {
                None
            } else {
                let types = columns
                    .iter()
                    .map(|&c| {
                        schema
                            .fields()
                            .get(c)
                            .map(|f| f.data_type().clone())
                            .ok_or_else(|| ExecError::internal(format!("join upsert key column {c} out of range")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Some(RowCodec::new(&types).map_err(ExecError::internal)?)
            };
            Ok(Layout::UniqueKey { columns, codec })
        };
        let sides = JoinSides::new(node)?;
        Ok(Self {
            name: format!("Join {} ON {}", node.join_type.sql(), sides.on),
            join_type: node.join_type,
            keys: sides.keys,
            key_encoder: sides.key_encoder,
            row_codecs: sides.codecs,
            layouts: [layout(0, &node.left_schema)?, layout(1, &node.right_schema)?],
            schemas: sides.schemas,
            filter: sides.filter,
            pair_schema: sides.pair_schema,
            schema,
            state,
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
}

/// What a join operator (regular, interval, window, temporal) derives
/// from its plan node: both sides' keys, their encoder, row codecs and schemas,
/// the rest of the ON condition over `left ++ right`, and the ON
/// equalities as text (for its name).
pub(crate) struct JoinSides {
    pub keys: [Vec<Arc<dyn PhysicalExpr>>; 2],
    pub key_encoder: KeyEncoder,
    pub codecs: [RowCodec; 2],
    pub schemas: [SchemaRef; 2],
    pub filter: Option<Arc<dyn PhysicalExpr>>,
    pub pair_schema: SchemaRef,
    pub on: String,
}

impl JoinSides {
    pub fn new(node: &JoinNode) -> Result<Self> {
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
        let on: Vec<String> = node
            .left_keys
            .iter()
            .zip(&node.right_keys)
            .map(|(l, r)| format!("{l} = {r}"))
            .collect();
        Ok(Self {
            keys: [node.left_keys.clone(), node.right_keys.clone()],
            key_encoder: KeyEncoder::new(&key_types)?,
            codecs: [codec(&node.left_schema)?, codec(&node.right_schema)?],
            schemas: [node.left_schema.clone(), node.right_schema.clone()],
            filter: node.filter.clone(),
            pair_schema: Arc::new(arrow::datatypes::Schema::new(fields)),
            on: on.join(" AND "),
        })
    }

    /// Each row's join key of side `side` (encoded), and the key columns.
    pub fn key_rows(&self, side: usize, batch: &RecordBatch) -> Result<(crate::state::codec::Rows, Vec<ArrayRef>)> {
        let n = batch.num_rows();
        let arrays = self.keys[side]
            .iter()
            .map(|k| k.evaluate(batch).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((self.key_encoder.encode(&arrays)?, arrays))
    }

    /// Stored rows of side `side` as one batch.
    pub fn decode<'a>(&self, side: usize, rows: impl Iterator<Item = &'a [u8]>) -> Result<RecordBatch> {
        let rows: Vec<&[u8]> = rows.collect();
        let columns = self.codecs[side].decode(rows.iter().copied())?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        Ok(RecordBatch::try_new_with_options(
            self.schemas[side].clone(),
            columns,
            &options,
        )?)
    }
}

/// A self-join node over `side` on `keys` for operator tests, and its
/// output schema (both sides, nullable).
#[cfg(test)]
pub(crate) fn test_node(
    join_type: JoinType,
    side: SchemaRef,
    keys: Vec<Arc<dyn PhysicalExpr>>,
) -> (JoinNode, SchemaRef) {
    let out = Arc::new(arrow::datatypes::Schema::new(
        side.fields()
            .iter()
            .chain(side.fields().iter())
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let node = JoinNode {
        join_type,
        left_keys: keys.clone(),
        right_keys: keys,
        filter: None,
        left_schema: side.clone(),
        right_schema: side,
        state_ttl: [None, None],
        unique_keys: [None, None],
        interval: None,
        window: None,
        temporal: None,
        zone: None,
    };
    (node, out)
}

/// `rows` of `this` side at `this_idx` beside `others` at `other_idx`,
/// ordered left ++ right (`None` indexes are NULL rows): a join's output
/// columns (the interval join's too).
pub(crate) fn pairs(
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

/// A join's extra condition over every candidate pair (`this` side's
/// `rows` at `this_idx` with `others` at `other_idx`), evaluated once for
/// the batch; NULL counts as false. `None`: no condition, every pair holds.
pub(crate) fn condition_holds(
    filter: Option<&Arc<dyn PhysicalExpr>>,
    pair_schema: &SchemaRef,
    side: usize,
    rows: &RecordBatch,
    this_idx: &[u32],
    others: &RecordBatch,
    other_idx: &[u32],
) -> Result<Option<BooleanArray>> {
    let Some(f) = filter.filter(|_| !this_idx.is_empty()) else {
        return Ok(None);
    };
    let cols = pairs(
        side,
        rows,
        &UInt32Array::from(this_idx.to_vec()),
        others,
        &UInt32Array::from(other_idx.to_vec()),
    )?;
    let options = RecordBatchOptions::new().with_row_count(Some(this_idx.len()));
    let batch = RecordBatch::try_new_with_options(pair_schema.clone(), cols, &options)?;
    let m = f.evaluate(&batch)?.into_array(batch.num_rows())?;
    let m = m
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| ExecError::internal("join condition is not boolean"))?;
    Ok(Some(crate::change::null_as_false(m)))
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
        crate::operators::expire_state(&mut self.state, now)
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
        // Each row's namespace: the row, or its upsert key.
        let by_key = self.layouts[side].by_key();
        let other_by_key = self.layouts[other].by_key();
        let uk_bytes = match &self.layouts[side] {
            Layout::UniqueKey {
                columns,
                codec: Some(codec),
            } => Some(codec.encode(&columns.iter().map(|&c| rows.column(c).clone()).collect::<Vec<_>>())?),
            _ => None,
        };
        let nss: Vec<&[u8]> = (0..n)
            .map(|i| match (&uk_bytes, by_key) {
                (Some(uk), _) => uk.row(i),
                (None, true) => &[][..],
                (None, false) => row_bytes.row(i),
            })
            .collect();

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
                slots.push((self.state.key_group(k), i));
                (slots.len() - 1) as u32
            });
            row_slot.push(Some(s));
        }
        let mut mine: HashMap<(u32, &[u8]), Mine> = HashMap::new();
        let mut wanted: Vec<(u32, &[u8])> = vec![];
        let fresh = Mine {
            entry: Entry::default(),
            stored: 0,
            row: None,
        };
        for (i, s) in row_slot.iter().enumerate() {
            if let Some(s) = s
                && !mine.contains_key(&(*s, nss[i]))
            {
                mine.insert((*s, nss[i]), fresh);
                wanted.push((*s, nss[i]));
            }
        }
        let use_cache = self.cache_enabled && !self.state.ttl_enabled();
        if use_cache {
            // Rows of keys whose whole list is cached are known.
            wanted.retain(
                |(s, r)| match self.cache[side].get(key_rows.row(slots[*s as usize].1)) {
                    Some(list) => {
                        if let Some(c) = list.get(*r) {
                            let stored = 16;
                            mine.insert(
                                (*s, *r),
                                Mine {
                                    entry: c.entry,
                                    stored,
                                    row: None,
                                },
                            );
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
                let (entry, _) = decode_value(side, by_key, &v)?;
                mine.insert(
                    *k,
                    Mine {
                        entry,
                        stored: v.len(),
                        row: None,
                    },
                );
            }
        }

        // The other side's rows under each key.
        let mut others: Vec<Other> = vec![];
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::with_capacity(slots.len());
        for s in 0..slots.len() as u32 {
            let start = others.len();
            let key = key_rows.row(slots[s as usize].1);
            if let Some(list) = self.cache[other].get(key).filter(|_| use_cache) {
                others.extend(list.iter().map(|(ns, c)| Other {
                    slot: s,
                    ns: ns.clone(),
                    row: c.row.clone(),
                    entry: c.entry,
                    was: c.entry,
                    dirty: false,
                }));
                ranges.push(start..others.len());
                continue;
            }
            let mut bad = None;
            self.state
                .scan_namespaces(other, entry_of(&slots, &key_rows, s, &[]), &mut |ns, v| {
                    match decode_value(other, other_by_key, v) {
                        Ok((e, row)) if e.count > 0 => others.push(Other {
                            slot: s,
                            ns: ns.to_vec(),
                            row: row.map(<[u8]>::to_vec),
                            entry: e,
                            was: e,
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
                let list: CachedKey = others[start..]
                    .iter()
                    .map(|o| {
                        let c = Cached {
                            entry: o.entry,
                            row: o.row.clone(),
                        };
                        (o.ns.clone(), c)
                    })
                    .collect();
                self.cached += list.len() + 1;
                self.cache[other].insert(key.to_vec(), list);
            }
            ranges.push(start..others.len());
        }
        let other_rows = {
            let cols = self.row_codecs[other].decode(others.iter().map(Other::row))?;
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
        let keep = condition_holds(
            self.filter.as_ref(),
            &self.pair_schema,
            side,
            rows,
            &cand_this,
            &other_rows,
            &cand_other,
        )?;
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
            if let Some(m) = mine.get_mut(&(s, nss[i])) {
                // By unique key the row replaces the key's row, and a
                // retraction removes it (Flink's `HasUniqueKey` view).
                if add {
                    m.entry.count = if by_key { 1 } else { m.entry.count + 1 };
                    m.row = Some(i);
                    if this_outer {
                        m.entry.assoc = total;
                    }
                } else if by_key {
                    m.entry.count = 0;
                } else if m.entry.count > 0 {
                    m.entry.count -= 1;
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
        let stored_row = |m: &Mine| -> Result<Option<&[u8]>> {
            match (by_key, m.row) {
                (false, _) => Ok(None),
                (true, Some(i)) => Ok(Some(row_bytes.row(i))),
                (true, None) => Err(ExecError::internal("a join row kept by unique key without its row")),
            }
        };
        for (&(s, ns), m) in &mine {
            let row = if m.entry.count > 0 { stored_row(m)? } else { None };
            let old = (m.stored > 0).then_some(m.stored);
            if m.entry.count > 0 {
                w.put(
                    side,
                    entry_of(&slots, &key_rows, s, ns),
                    old,
                    encode_value(m.entry, row),
                );
            } else if m.stored > 0 {
                w.delete(side, entry_of(&slots, &key_rows, s, ns), old);
            }
        }
        for o in others.iter().filter(|o| o.dirty) {
            let old = counts_len(&[o.was.count, o.was.assoc]) + o.row.as_ref().map_or(0, Vec::len);
            w.put(
                other,
                entry_of(&slots, &key_rows, o.slot, &o.ns),
                Some(old),
                encode_value(o.entry, o.row.as_deref()),
            );
        }
        self.state.write(w)?;
        if use_cache {
            // The cached lists change as the state did.
            for (&(s, ns), m) in &mine {
                if let Some(list) = self.cache[side].get_mut(key_rows.row(slots[s as usize].1)) {
                    if m.entry.count > 0 {
                        let row = stored_row(m)?.map(<[u8]>::to_vec);
                        let c = Cached { entry: m.entry, row };
                        if list.insert(ns.to_vec(), c).is_none() {
                            self.cached += 1;
                        }
                    } else if list.remove(ns).is_some() {
                        self.cached -= 1;
                    }
                }
            }
            for o in others.iter().filter(|o| o.dirty) {
                if let Some(list) = self.cache[other].get_mut(key_rows.row(slots[o.slot as usize].1))
                    && let Some(c) = list.get_mut(&o.ns)
                {
                    c.entry = o.entry;
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

        if kinds.is_empty() {
            return Ok(());
        }
        let mut cols = pairs(
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
    use crate::operators::testing::feed_pretty;
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
        join_by(join_type, [None, None])
    }

    /// A join whose sides are stored by these upsert keys.
    fn join_by(join_type: JoinType, unique_keys: [Option<Vec<usize>>; 2]) -> JoinOperator {
        let (l, r) = (side("l"), side("r"));
        let node = JoinNode {
            join_type,
            left_keys: vec![Arc::new(Column::new("lk", 0))],
            right_keys: vec![Arc::new(Column::new("rk", 0))],
            filter: None,
            left_schema: l.clone(),
            right_schema: r.clone(),
            state_ttl: [None, None],
            unique_keys,
            interval: None,
            window: None,
            temporal: None,
            zone: None,
        };
        let out = Arc::new(Schema::new(
            l.fields()
                .iter()
                .chain(r.fields().iter())
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        let state = KeyedState::new(Box::new(HeapBackend::new(2)), STATES, 0..128, 128);
        JoinOperator::new(&node, out, state).expect("join")
    }

    /// Feeds changes written as text (`+I a 1`, `.` for NULL) to `input`
    /// and returns what the join emits.
    fn feed(j: &mut JoinOperator, input: usize, rows: &str) -> Vec<String> {
        let schema = j.schemas[input].clone();
        feed_pretty(j, input, &schema, rows)
    }

    use RowKind::*;

    #[test]
    fn inner_join_forwards_the_kind_of_the_change() {
        let mut j = join(JoinType::Inner);
        assert!(feed(&mut j, 1, "+I a 1").is_empty());
        assert_eq!(feed(&mut j, 0, "+I a 10"), ["+I[a, 10, a, 1]"]);
        assert_eq!(feed(&mut j, 0, "-U a 10"), ["-U[a, 10, a, 1]"]);
        assert_eq!(feed(&mut j, 0, "+U a 11"), ["+U[a, 11, a, 1]"]);
    }

    #[test]
    fn left_join_pads_and_retracts_the_padding_as_matches_come_and_go() {
        let mut j = join(JoinType::Left);
        assert_eq!(feed(&mut j, 0, "+I a 10"), ["+I[a, 10, null, null]"]);
        assert_eq!(feed(&mut j, 1, "+I a 1"), ["-D[a, 10, null, null]", "+I[a, 10, a, 1]"]);
        // A second match: no padding to retract.
        assert_eq!(feed(&mut j, 1, "+I a 2"), ["+I[a, 10, a, 2]"]);
        // The first match goes: only its row (case 20).
        assert_eq!(feed(&mut j, 1, "-D a 1"), ["-D[a, 10, a, 1]"]);
        // The last match goes (as an update's -U): the padded row returns.
        assert_eq!(feed(&mut j, 1, "-U a 2"), ["-U[a, 10, a, 2]", "+I[a, 10, null, null]"]);
        assert_eq!(feed(&mut j, 0, "-D a 10"), ["-D[a, 10, null, null]"]);
    }

    #[test]
    fn full_join_pads_whichever_side_comes_first() {
        let mut j = join(JoinType::Full);
        assert_eq!(feed(&mut j, 1, "+I a 1"), ["+I[null, null, a, 1]"]);
        assert_eq!(feed(&mut j, 0, "+I a 10"), ["-D[null, null, a, 1]", "+I[a, 10, a, 1]"]);
        assert_eq!(feed(&mut j, 0, "-D a 10"), ["-D[a, 10, a, 1]", "+I[null, null, a, 1]"]);
    }

    #[test]
    fn duplicates_match_once_per_copy_and_null_keys_never_match() {
        let mut j = join(JoinType::Left);
        assert!(feed(&mut j, 1, "+I a 1").is_empty());
        assert!(feed(&mut j, 1, "+I a 1").is_empty());
        assert_eq!(feed(&mut j, 0, "+I a 10"), ["+I[a, 10, a, 1]", "+I[a, 10, a, 1]"]);
        // One copy retracted: one -D per match of it.
        assert_eq!(feed(&mut j, 1, "-D a 1"), ["-D[a, 10, a, 1]"]);
        assert!(feed(&mut j, 1, "+I . 1").is_empty());
        assert_eq!(feed(&mut j, 0, "+I . 5"), ["+I[null, 5, null, null]"]);
        assert_eq!(feed(&mut j, 0, "-D . 5"), ["-D[null, 5, null, null]"]);
    }

    #[test]
    fn rows_by_unique_key_are_replaced_and_removed_by_key() {
        // The right side's upsert key is its join key (one row per key),
        // the left side's is `lv`.
        let mut j = join_by(JoinType::Inner, [Some(vec![1]), Some(vec![0])]);
        assert!(j.layouts[1].by_key() && j.layouts[0].by_key());
        assert!(feed(&mut j, 1, "+I a 1").is_empty());
        assert_eq!(feed(&mut j, 0, "+I a 10"), ["+I[a, 10, a, 1]"]);
        // An upsert without its -U: the key's row is replaced, not added.
        assert_eq!(feed(&mut j, 1, "+U a 2"), ["+U[a, 10, a, 2]"]);
        assert_eq!(feed(&mut j, 0, "+I a 11"), ["+I[a, 11, a, 2]"]);
        assert_eq!(feed(&mut j, 0, "+U a 11"), ["+U[a, 11, a, 2]"]);
        assert_eq!(feed(&mut j, 1, "+I a 3"), ["+I[a, 10, a, 3]", "+I[a, 11, a, 3]"]);
        // A deletion by key removes the row whatever its other columns.
        assert_eq!(feed(&mut j, 1, "-D a 999"), ["-D[a, 10, a, 999]", "-D[a, 11, a, 999]"]);
        assert!(feed(&mut j, 0, "+I a 12").is_empty());
        assert_eq!(feed(&mut j, 1, "+I a 4").len(), 3);
    }

    /// A well-formed changelog of unique rows (every update a -U of the
    /// stored row, then its +U): the same changes whether the sides are
    /// stored as multisets or by unique key (in or out of the join key),
    /// with the cache on or off; only the order among one key's matches
    /// may differ (state order is by namespace).
    #[test]
    fn unique_key_layouts_emit_what_the_multiset_does() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for join_type in [JoinType::Inner, JoinType::Left, JoinType::Full] {
            let mut ops = [
                join(join_type),
                join_by(join_type, [Some(vec![1]), Some(vec![1])]),
                join_by(join_type, [Some(vec![1]), Some(vec![1])]).with_cache(false),
            ];
            // Live rows per side: upsert key v → join key.
            let mut live: [std::collections::BTreeMap<i64, String>; 2] = Default::default();
            for _ in 0..300 {
                let side = (next() % 2) as usize;
                let (mut ks, mut vs, mut kinds) = (vec![], vec![], vec![]);
                for _ in 0..(1 + next() % 4) {
                    let v = (next() % 12) as i64;
                    let k = ["a", "b", "c"][(next() % 3) as usize].to_string();
                    match live[side].get(&v).cloned() {
                        Some(old) if next() % 2 == 0 => {
                            live[side].remove(&v);
                            ks.push(old);
                            vs.push(v);
                            kinds.push(Delete);
                        }
                        Some(old) => {
                            ks.extend([old, k.clone()]);
                            vs.extend([v, v]);
                            kinds.extend([UpdateBefore, UpdateAfter]);
                            live[side].insert(v, k);
                        }
                        None => {
                            live[side].insert(v, k.clone());
                            ks.push(k);
                            vs.push(v);
                            kinds.push(Insert);
                        }
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
                        let mut lines: Vec<String> = out
                            .take()
                            .iter()
                            .flat_map(|b| crate::connectors::print::format_changes(b).expect("format"))
                            .collect();
                        lines.sort();
                        lines
                    })
                    .collect();
                assert_eq!(outs[0], outs[1], "{join_type:?}: by unique key");
                assert_eq!(outs[0], outs[2], "{join_type:?}: by unique key, no cache");
            }
        }
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
