//! Event-time temporal joins (Flink's `TemporalRowTimeJoinOperator`):
//! `FROM o JOIN r FOR SYSTEM_TIME AS OF o.ts ON o.k = r.pk`, INNER or
//! LEFT. The right input is a versioned table: each of its rows is the
//! version of its key from its row time on (a later row at the same time
//! replaces it; a delete is a version saying "no row"). Each left row is
//! held until the watermark passes its time, then joined with the version
//! of its key valid at that time, the latest at or before it, once, `+I`.
//! A LEFT join pads a row without a version (or whose version is a delete,
//! or fails the rest of the condition) with NULLs.
//!
//! When the watermark passes a key's rows, the versions it no longer needs
//! are freed: every version before the latest one at or before the
//! watermark (that one still answers later left rows). A left row arriving
//! behind the watermark is joined at the next watermark with the versions
//! left then, as in Flink (its old version may be gone).
//!
//! State, through the keyed-state layer, by the join key (which holds the
//! versioned table's primary key):
//! - `temporal-join-left` (value): namespace time|null-key flag → the left
//!   rows of that time in arrival order;
//! - `temporal-join-right` (value): namespace version time → kind byte and
//!   the row;
//! - `temporal-join-timers` (timers): one per left entry (emit) and per
//!   version (cleanup), at its time.
//!
//! The right input's `-U` rows are skipped: its `+U` (at the new version's
//! time) is the version, as Flink reads a versioned table's updates.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, UInt32Array};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use hashbrown::{HashMap, HashSet};

use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::KeyGroup;
use crate::message::Timestamp;
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::interval_join::times_ms;
use crate::operators::join::{JoinSides, condition_holds, pairs};
use crate::operators::{Collector, Operator};
use crate::plan::{JoinNode, JoinType};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::RowList;
use crate::state::keyed::{decode_time, encode_time};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

const LEFT: usize = 0;
const RIGHT: usize = 1;
const TIMERS: usize = 2;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "temporal-join-left",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "temporal-join-right",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "temporal-join-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// A version's first byte: a row (`+I`, `+U`) or its absence (`-D`).
const ROW: u8 = 0;
const DELETED: u8 = 1;
/// Timer namespaces: one timer per left entry and per version, so a
/// timer's bytes are counted exactly once.
const LEFT_TIMER: u8 = 0;
const RIGHT_TIMER: u8 = 1;
/// Timers fired per state round trip.
const FIRE_CHUNK: usize = 4096;

pub struct TemporalJoinOperator {
    name: String,
    /// LEFT join: rows without a version are emitted padded.
    pads: bool,
    sides: JoinSides,
    /// Per side, the time column: the left row's time, the version's time.
    times: [usize; 2],
    schema: SchemaRef,
    state: KeyedState,
    watermark: Timestamp,
    metrics: Arc<NodeMetrics>,
}

/// A left row due at a watermark.
struct DueRow {
    /// Index of its key among the fired keys.
    key: usize,
    time: i64,
    null_key: bool,
}

/// Left rows of one batch under one key, time and NULL-key flag.
struct LeftPart {
    first: usize,
    group: KeyGroup,
    namespace: Vec<u8>,
    time: i64,
    rows: Vec<usize>,
}

/// One version of a key.
struct Version {
    time: i64,
    deleted: bool,
    row: Vec<u8>,
}

/// The operator of an event-time temporal join's subtask (`times`: each
/// side's time column).
pub fn build(node: &JoinNode, times: [usize; 2], ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(TemporalJoinOperator::new(
        node,
        times,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl TemporalJoinOperator {
    pub fn new(
        node: &JoinNode,
        times: [usize; 2],
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self> {
        let pads = match node.join_type {
            JoinType::Inner => false,
            JoinType::Left => true,
            other => {
                return Err(ExecError::internal(format!(
                    "a temporal join is INNER or LEFT, not {}",
                    other.sql()
                )));
            }
        };
        let sides = JoinSides::new(node)?;
        Ok(Self {
            name: format!("TemporalJoin {} ON {}", node.join_type.sql(), sides.on),
            pads,
            sides,
            times,
            schema,
            state,
            watermark: Timestamp::MIN,
            metrics,
        })
    }

    fn corrupt(&self, state: usize, message: String) -> StateError {
        StateError::Corrupt {
            state: STATES[state].name.into(),
            message,
        }
    }

    /// Holds left rows until the watermark passes their time.
    fn add_left(&mut self, batch: RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        let times = times_ms(batch.column(self.times[LEFT]), "temporal join")?;
        if let Some(max) = times.iter().flatten().max() {
            self.metrics.max_event_time.fetch_max(max, Ordering::Relaxed);
        }
        let (keys, key_arrays) = self.sides.key_rows(LEFT, &batch)?;
        // Rows by key, time and NULL-key flag, in arrival order.
        let mut part_of: HashMap<(&[u8], i64, bool), usize> = HashMap::new();
        let mut parts: Vec<LeftPart> = vec![];
        let mut dropped = 0u64;
        for i in 0..n {
            if times.is_null(i) {
                // No time, no version: never joined.
                dropped += 1;
                continue;
            }
            let time = times.value(i);
            let null_key = key_arrays.iter().any(|a| a.is_null(i));
            // A NULL key matches no version: kept only to be padded.
            if null_key && !self.pads {
                continue;
            }
            let k = keys.row(i);
            let p = *part_of.entry((k, time, null_key)).or_insert_with(|| {
                let mut ns = encode_time(time).to_vec();
                ns.push(u8::from(null_key));
                parts.push(LeftPart {
                    first: i,
                    group: self.state.key_group(k),
                    namespace: ns,
                    time,
                    rows: vec![],
                });
                parts.len() - 1
            });
            parts[p].rows.push(i);
        }
        if dropped > 0 {
            self.metrics.late_rows_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        if parts.is_empty() {
            return Ok(());
        }
        let refs: Vec<EntryRef> = parts
            .iter()
            .map(|p| EntryRef {
                key_group: p.group,
                key: keys.row(p.first),
                namespace: &p.namespace,
            })
            .collect();
        let stored = self.state.get(LEFT, &refs)?;
        let rows = self.sides.codecs[LEFT].encode(batch.columns())?;
        let mut w = KeyedWrite::default();
        for ((part, e), old) in parts.iter().zip(&refs).zip(stored) {
            let ns = &part.namespace;
            let before = old.as_ref().map(Vec::len);
            let mut value = old.unwrap_or_default();
            value.extend(RowList::encode(part.rows.iter().map(|r| rows.row(*r))));
            if before.is_none() {
                w.add_timer(TIMERS, part.group, part.time, e.key, &[LEFT_TIMER, ns[8]]);
            }
            w.put(LEFT, *e, before, value);
        }
        self.state.write(w)?;
        Ok(())
    }

    /// Stores versions: the last row of a key and time wins.
    fn add_versions(&mut self, batch: ChangeBatch) -> Result<()> {
        let n = batch.num_rows();
        let rows = &batch.rows;
        let times = times_ms(rows.column(self.times[RIGHT]), "temporal join")?;
        let (keys, key_arrays) = self.sides.key_rows(RIGHT, rows)?;
        let mut last_of: HashMap<(&[u8], i64), usize> = HashMap::new();
        let mut order: Vec<(&[u8], i64)> = vec![];
        for i in 0..n {
            let kind = batch.kind(i);
            // A NULL key is no version of any key; an update's old row is
            // followed by its new one.
            if kind == RowKind::UpdateBefore || times.is_null(i) || key_arrays.iter().any(|a| a.is_null(i)) {
                continue;
            }
            let k = (keys.row(i), times.value(i));
            if last_of.insert(k, i).is_none() {
                order.push(k);
            }
        }
        if order.is_empty() {
            return Ok(());
        }
        let namespaces: Vec<[u8; 8]> = order.iter().map(|(_, t)| encode_time(*t)).collect();
        let refs: Vec<EntryRef> = order
            .iter()
            .zip(&namespaces)
            .map(|((k, _), ns)| EntryRef {
                key_group: self.state.key_group(k),
                key: k,
                namespace: ns,
            })
            .collect();
        let stored = self.state.get(RIGHT, &refs)?;
        let encoded = self.sides.codecs[RIGHT].encode(rows.columns())?;
        let mut w = KeyedWrite::default();
        for ((k, e), old) in order.iter().zip(&refs).zip(stored) {
            let i = last_of[k];
            let mut value = Vec::with_capacity(1 + encoded.row(i).len());
            value.push(if batch.kind(i).is_retract() { DELETED } else { ROW });
            value.extend_from_slice(encoded.row(i));
            if old.is_none() {
                w.add_timer(TIMERS, e.key_group, k.1, e.key, &[RIGHT_TIMER]);
            }
            w.put(RIGHT, *e, old.as_ref().map(Vec::len), value);
        }
        self.state.write(w)?;
        Ok(())
    }

    /// Joins the left rows of the keys of `due` timers at or before
    /// `watermark` with their versions, and frees what the watermark
    /// passed.
    fn fire(&mut self, due: &[Timer], watermark: Timestamp, out: &mut Collector) -> Result<()> {
        let mut w = KeyedWrite::default();
        let mut seen: HashSet<(KeyGroup, &[u8])> = HashSet::new();
        let mut keys: Vec<(KeyGroup, &[u8])> = vec![];
        for t in due {
            w.delete_timer(TIMERS, t);
            if seen.insert((t.key_group, &t.key)) {
                keys.push((t.key_group, &t.key));
            }
        }
        let mut due_rows: Vec<DueRow> = vec![];
        let mut left_bytes: Vec<Vec<u8>> = vec![];
        let mut versions: Vec<Vec<Version>> = Vec::with_capacity(keys.len());
        for (ki, (group, key)) in keys.iter().enumerate() {
            let e = EntryRef {
                key_group: *group,
                key,
                namespace: &[],
            };
            // This key's left rows the watermark passed, time by time.
            let mut entries: Vec<(Vec<u8>, Vec<u8>)> = vec![];
            self.state.scan_namespaces(LEFT, e, &mut |ns, v| {
                let passed = ns
                    .get(..8)
                    .is_some_and(|t| decode_time(t.try_into().unwrap_or_default()) <= watermark);
                if passed {
                    entries.push((ns.to_vec(), v.to_vec()));
                }
                passed
            })?;
            for (ns, v) in &entries {
                let [t @ .., flag] = ns.as_slice() else {
                    return Err(self.corrupt(LEFT, format!("a namespace of {} bytes", ns.len())).into());
                };
                let time = decode_time(t.try_into().map_err(|_| self.corrupt(LEFT, "a short time".into()))?);
                let rows = RowList::decode(v)
                    .ok_or_else(|| self.corrupt(LEFT, format!("rows of {} bytes cut short", v.len())))?;
                for r in rows {
                    due_rows.push(DueRow {
                        key: ki,
                        time,
                        null_key: *flag == 1,
                    });
                    left_bytes.push(r.to_vec());
                }
                w.delete(
                    LEFT,
                    EntryRef {
                        key_group: *group,
                        key,
                        namespace: ns,
                    },
                    Some(v.len()),
                );
            }
            // Its versions in time order.
            let mut mine: Vec<Version> = vec![];
            let mut bad = None;
            self.state.scan_namespaces(RIGHT, e, &mut |ns, v| {
                match (ns.try_into().map(decode_time), v.split_first()) {
                    (Ok(time), Some((kind, row))) => mine.push(Version {
                        time,
                        deleted: *kind == DELETED,
                        row: row.to_vec(),
                    }),
                    _ => {
                        bad = Some(ns.len());
                        return false;
                    }
                }
                true
            })?;
            if let Some(len) = bad {
                return Err(self
                    .corrupt(RIGHT, format!("a version with a {len}-byte namespace or no row"))
                    .into());
            }
            // Versions before the latest one the watermark passed answer
            // no left row still to come (Flink's cleanupExpiredVersionInState).
            let passed = mine.partition_point(|v| v.time <= watermark);
            let keep_from = passed.saturating_sub(1);
            for v in &mine[..keep_from] {
                let ns = encode_time(v.time);
                w.delete(
                    RIGHT,
                    EntryRef {
                        key_group: *group,
                        key,
                        namespace: &ns,
                    },
                    Some(1 + v.row.len()),
                );
            }
            versions.push(mine);
        }
        // Each due row with the version valid at its time.
        let mut li: Vec<u32> = vec![];
        let mut right_rows: Vec<&[u8]> = vec![];
        let mut candidate: Vec<Option<usize>> = Vec::with_capacity(due_rows.len());
        for (i, r) in due_rows.iter().enumerate() {
            let version = if r.null_key {
                None
            } else {
                let vs = &versions[r.key];
                vs.partition_point(|v| v.time <= r.time)
                    .checked_sub(1)
                    .map(|at| &vs[at])
                    .filter(|v| !v.deleted)
            };
            candidate.push(version.map(|v| {
                li.push(i as u32);
                right_rows.push(&v.row);
                right_rows.len() - 1
            }));
        }
        let left = self.sides.decode(LEFT, left_bytes.iter().map(Vec::as_slice))?;
        let right = self.sides.decode(RIGHT, right_rows.iter().copied())?;
        let ri: Vec<u32> = (0..right_rows.len() as u32).collect();
        let holds = condition_holds(
            self.sides.filter.as_ref(),
            &self.sides.pair_schema,
            0,
            &left,
            &li,
            &right,
            &ri,
        )?;
        let (mut out_l, mut out_r): (Vec<u32>, Vec<Option<u32>>) = (vec![], vec![]);
        for (i, c) in candidate.iter().enumerate() {
            let matched = c.filter(|c| holds.as_ref().is_none_or(|h| h.value(*c)));
            if matched.is_some() || self.pads {
                out_l.push(i as u32);
                out_r.push(matched.map(|c| c as u32));
            }
        }
        self.state.write(w)?;
        if out_l.is_empty() {
            return Ok(());
        }
        let columns = pairs(0, &left, &UInt32Array::from(out_l), &right, &UInt32Array::from(out_r))?;
        out.emit(batch_with_schema(&self.schema, columns)?);
        Ok(())
    }
}

impl Operator for TemporalJoinOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        self.process_input(LEFT, batch, out)
    }

    fn process_input(&mut self, side: usize, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match side {
            LEFT => self.add_left(batch.into_inserts("TemporalJoin")?),
            RIGHT => self.add_versions(batch),
            _ => Err(ExecError::internal(format!("a join has inputs 0 and 1, not {side}"))),
        }
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        loop {
            let mut due = self.state.due_timers(TIMERS, watermark, FIRE_CHUNK)?;
            if due.is_empty() {
                return Ok(());
            }
            let more = due.len() == FIRE_CHUNK;
            due.sort_by_key(|t| t.time);
            self.fire(&due, watermark, out)?;
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
    use arrow::array::{AsArray, Int64Array, StringArray, TimestampMillisecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_expr::expressions::Column;

    /// (k, ts, v) on both sides.
    fn side() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    fn join(join_type: JoinType) -> TemporalJoinOperator {
        let keys = || -> Vec<Arc<dyn PhysicalExpr>> { vec![Arc::new(Column::new("k", 0))] };
        let (mut node, out) = crate::operators::join::test_node(join_type, side(), keys());
        node.temporal = Some([1, 1]);
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        let metrics = Arc::new(NodeMetrics::new("temporal join".into()));
        TemporalJoinOperator::new(&node, [1, 1], out, state, metrics).expect("temporal join")
    }

    fn batch(rows: &[(Option<&str>, i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            side(),
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(TimestampMillisecondArray::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .expect("rows")
    }

    fn orders(j: &mut TemporalJoinOperator, rows: &[(Option<&str>, i64, i64)]) {
        j.process_input(LEFT, ChangeBatch::from(batch(rows)), &mut Collector::default())
            .expect("orders");
    }

    fn versions(j: &mut TemporalJoinOperator, rows: &[(RowKind, &str, i64, i64)]) {
        let b = batch(&rows.iter().map(|r| (Some(r.1), r.2, r.3)).collect::<Vec<_>>());
        let kinds = rows.iter().map(|r| r.0).collect();
        j.process_input(RIGHT, ChangeBatch::new(b, kinds), &mut Collector::default())
            .expect("versions");
    }

    /// `order value|version value` per joined row, sorted.
    fn emitted(j: &mut TemporalJoinOperator, watermark: Timestamp) -> Vec<String> {
        let mut out = Collector::default();
        j.on_watermark(watermark, &mut out).expect("watermark");
        let mut rows = vec![];
        for b in out.take() {
            let b = b.into_inserts("test").expect("inserts");
            let (l, r) = (
                b.column(2).as_primitive::<arrow::datatypes::Int64Type>(),
                b.column(5).as_primitive::<arrow::datatypes::Int64Type>(),
            );
            for i in 0..b.num_rows() {
                let r = if r.is_null(i) {
                    "-".to_string()
                } else {
                    r.value(i).to_string()
                };
                rows.push(format!("{}|{r}", l.value(i)));
            }
        }
        rows.sort();
        rows
    }

    /// Each order joins the version valid at its time, at the watermark;
    /// a delete is no version; versions before the latest one the
    /// watermark passed are freed, so a late order may find none.
    #[test]
    fn joins_the_version_valid_at_each_rows_time() {
        let mut j = join(JoinType::Left);
        versions(
            &mut j,
            &[
                (RowKind::Insert, "a", 0, 100),
                (RowKind::UpdateBefore, "a", 0, 100),
                (RowKind::UpdateAfter, "a", 10, 110),
                (RowKind::Insert, "b", 5, 200),
                (RowKind::Delete, "b", 8, 200),
            ],
        );
        orders(
            &mut j,
            &[
                (Some("a"), 9, 1),
                (Some("a"), 10, 2),
                (Some("b"), 7, 3),
                (Some("b"), 8, 4),
                (None, 3, 5),
                (Some("c"), 1, 6),
            ],
        );
        assert_eq!(emitted(&mut j, 8), ["3|200", "4|-", "5|-", "6|-"]);
        assert_eq!(emitted(&mut j, 20), ["1|100", "2|110"]);
        // The version of time 0 is gone (10 is the latest the watermark
        // passed): an order behind the watermark at 5 finds none.
        orders(&mut j, &[(Some("a"), 5, 7), (Some("a"), 12, 8)]);
        assert_eq!(emitted(&mut j, 21), ["7|-", "8|110"]);
        // A later version of the same time replaces it.
        versions(
            &mut j,
            &[(RowKind::Insert, "a", 30, 130), (RowKind::UpdateAfter, "a", 30, 131)],
        );
        orders(&mut j, &[(Some("a"), 31, 9)]);
        assert_eq!(emitted(&mut j, 40), ["9|131"]);
    }

    /// An INNER join drops what a LEFT join pads; the state of a long run
    /// stays flat: a key keeps one version and no order once the
    /// watermark passed them.
    #[test]
    fn inner_join_state_stays_flat() {
        let mut j = join(JoinType::Inner);
        let mut sizes = vec![];
        for round in 0..50i64 {
            let t = round * 100;
            let keys = ["a", "b", "c", "d"];
            versions(&mut j, &keys.map(|k| (RowKind::UpdateAfter, k, t, round)));
            orders(
                &mut j,
                &[(Some("a"), t + 50, round), (Some("z"), t + 50, round), (None, t, round)],
            );
            let out = emitted(&mut j, t + 60);
            assert_eq!(out, [format!("{round}|{round}")], "round {round}");
            sizes.push(j.state.size_bytes());
            assert_eq!(sizes[sizes.len() - 1], j.state.counted_bytes().expect("count"));
        }
        assert!(sizes[5] > 0);
        assert!(sizes[5..].windows(2).all(|w| w[0] == w[1]), "state grew: {sizes:?}");
        emitted(&mut j, crate::message::MAX_WATERMARK);
        let left = j.state.size_bytes();
        // One version per key stays (the latest answers any later order).
        assert!(left > 0 && left == sizes[49], "{left} vs {sizes:?}");
    }
}
