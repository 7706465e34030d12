//! Window joins (Flink's `WindowJoinOperator`): two inputs joined on equal
//! `window_start` and `window_end` (a window TVF or a window aggregate on
//! each side) and their other keys, INNER, LEFT, RIGHT, FULL, semi and
//! anti. Append-only: a window's rows are kept until the watermark passes
//! its end (`window_end - 1 <= watermark`, Flink's `isWindowFired`); then
//! its left and right rows are joined, the matches (and, for an outer
//! side, its unmatched rows padded with NULLs) emitted once, `+I`, and its
//! state freed. A row of a window that has fired is late: dropped and
//! counted.
//!
//! State, through the keyed-state layer (the join key holds the window's
//! bounds, so one key is one window of one key):
//! - `window-join-left` / `window-join-right` (value): key → that side's
//!   rows in arrival order, each in Weir's row encoding behind its length;
//! - `window-join-timers` (timers): one per key at `window_end - 1`.
//!
//! A row whose join key has a NULL matches nothing (SQL equality): it is
//! kept under namespace `[1]` of its key, with its own timer, only on a
//! side whose unmatched rows are emitted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, AsArray, UInt32Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use hashbrown::HashMap;

use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::error::{Result, StateError};
use crate::keygroup::KeyGroup;
use crate::message::Timestamp;
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::join::{JoinSides, condition_holds, pairs};
use crate::operators::window::is_fired;
use crate::operators::{Collector, Operator};
use crate::plan::{JoinNode, JoinType};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::RowList;
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

const TIMERS: usize = 2;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "window-join-left",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "window-join-right",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "window-join-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Namespace of rows whose join key has a NULL (they match nothing).
const NULL_KEY: &[u8] = &[1];
/// Windows joined per state round trip.
const FIRE_CHUNK: usize = 4096;

pub struct WindowJoinOperator {
    name: String,
    join_type: JoinType,
    sides: JoinSides,
    /// Per side, the input column holding `window_end`.
    ends: [usize; 2],
    schema: SchemaRef,
    state: KeyedState,
    watermark: Timestamp,
    /// Windows on the wall clock of this zone (the node's `zone`).
    zone: Option<arrow::array::timezone::Tz>,
    metrics: Arc<NodeMetrics>,
}

/// Rows of one batch under one key (and namespace).
struct Part {
    first: usize,
    group: KeyGroup,
    null_key: bool,
    fires_at: Timestamp,
    rows: Vec<usize>,
}

/// The operator of a window join's subtask (`ends`: each side's
/// `window_end` column).
pub fn build(node: &JoinNode, ends: [usize; 2], ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(WindowJoinOperator::new(
        node,
        ends,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl WindowJoinOperator {
    pub fn new(
        node: &JoinNode,
        ends: [usize; 2],
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self> {
        let sides = JoinSides::new(node)?;
        Ok(Self {
            name: format!("WindowJoin {} ON {}", node.join_type.sql(), sides.on),
            join_type: node.join_type,
            sides,
            ends,
            schema,
            state,
            watermark: Timestamp::MIN,
            zone: node.zone.as_ref().map(|z| z.tz),
            metrics,
        })
    }

    /// Whether side `side`'s rows are emitted without a match.
    fn keeps(&self, side: usize) -> bool {
        match self.join_type.semi_anti() {
            Some(anti) => side == 0 && anti,
            None if side == 0 => self.join_type.keeps_left(),
            None => self.join_type.keeps_right(),
        }
    }

    fn corrupt(&self, side: usize, len: usize) -> StateError {
        StateError::Corrupt {
            state: STATES[side].name.into(),
            message: format!("a window's rows ({len} bytes) are cut short"),
        }
    }

    /// The rows of `values` (one side's stored rows per window) as one
    /// batch, and the range of each window's rows in it.
    fn decode(&self, side: usize, values: &[Option<Vec<u8>>]) -> Result<(RecordBatch, Vec<std::ops::Range<usize>>)> {
        let mut rows: Vec<&[u8]> = vec![];
        let mut ranges = Vec::with_capacity(values.len());
        for v in values {
            let start = rows.len();
            if let Some(v) = v {
                rows.extend(RowList::decode(v).ok_or_else(|| self.corrupt(side, v.len()))?);
            }
            ranges.push(start..rows.len());
        }
        Ok((self.sides.decode(side, rows.into_iter())?, ranges))
    }

    /// Joins the windows of `due` timers: their rows of both sides, then
    /// frees them.
    fn fire(&mut self, due: &[Timer], out: &mut Collector) -> Result<()> {
        let refs: Vec<EntryRef> = due
            .iter()
            .map(|t| EntryRef {
                key_group: t.key_group,
                key: &t.key,
                namespace: &t.namespace,
            })
            .collect();
        let left_values = self.state.get(0, &refs)?;
        let right_values = self.state.get(1, &refs)?;
        let mut w = KeyedWrite::default();
        for (((t, e), l), r) in due.iter().zip(&refs).zip(&left_values).zip(&right_values) {
            w.delete_timer(TIMERS, t);
            w.delete(0, *e, l.as_ref().map(Vec::len));
            w.delete(1, *e, r.as_ref().map(Vec::len));
        }
        let (left, left_ranges) = self.decode(0, &left_values)?;
        let (right, right_ranges) = self.decode(1, &right_values)?;
        // Candidate pairs: every left row with every right row of its
        // window (rows under a NULL key match nothing).
        let (mut li, mut ri) = (vec![], vec![]);
        for (k, t) in due.iter().enumerate() {
            if t.namespace.as_slice() == NULL_KEY {
                continue;
            }
            for l in left_ranges[k].clone() {
                for r in right_ranges[k].clone() {
                    li.push(l as u32);
                    ri.push(r as u32);
                }
            }
        }
        let holds = condition_holds(
            self.sides.filter.as_ref(),
            &self.sides.pair_schema,
            0,
            &left,
            &li,
            &right,
            &ri,
        )?;
        let mut matched = [vec![false; left.num_rows()], vec![false; right.num_rows()]];
        let (mut out_l, mut out_r): (Vec<Option<u32>>, Vec<Option<u32>>) = (vec![], vec![]);
        for (p, (l, r)) in li.iter().zip(&ri).enumerate() {
            if holds.as_ref().is_some_and(|h| !h.value(p)) {
                continue;
            }
            matched[0][*l as usize] = true;
            matched[1][*r as usize] = true;
            if self.join_type.semi_anti().is_none() {
                out_l.push(Some(*l));
                out_r.push(Some(*r));
            }
        }
        match self.join_type.semi_anti() {
            // Left rows once each, with a match (semi) or without (anti).
            Some(anti) => {
                for (l, m) in matched[0].iter().enumerate() {
                    if *m != anti {
                        out_l.push(Some(l as u32));
                    }
                }
            }
            None => {
                if self.keeps(0) {
                    out_l.extend(
                        matched[0]
                            .iter()
                            .enumerate()
                            .filter(|(_, m)| !**m)
                            .map(|(l, _)| Some(l as u32)),
                    );
                    out_r.resize(out_l.len(), None);
                }
                if self.keeps(1) {
                    for (r, m) in matched[1].iter().enumerate() {
                        if !m {
                            out_l.push(None);
                            out_r.push(Some(r as u32));
                        }
                    }
                }
            }
        }
        self.state.write(w)?;
        if out_l.is_empty() {
            return Ok(());
        }
        let batch = match self.join_type.semi_anti() {
            Some(_) => {
                let idx = UInt32Array::from(out_l);
                let columns = left
                    .columns()
                    .iter()
                    .map(|c| arrow::compute::take(c.as_ref(), &idx, None))
                    .collect::<Result<Vec<_>, _>>()?;
                batch_with_schema(&self.schema, columns)?
            }
            None => {
                let columns = pairs(0, &left, &UInt32Array::from(out_l), &right, &UInt32Array::from(out_r))?;
                batch_with_schema(&self.schema, columns)?
            }
        };
        out.emit(batch);
        Ok(())
    }
}

impl Operator for WindowJoinOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        self.process_input(0, batch, out)
    }

    fn process_input(&mut self, side: usize, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        let batch = batch.into_inserts("WindowJoin")?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let ends = batch.column(self.ends[side]);
        let ends = match ends.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, None) => ends.clone(),
            _ => cast(ends, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        };
        let ends = ends.as_primitive::<TimestampMillisecondType>();
        if let Some(max) = ends.iter().flatten().max() {
            self.metrics
                .max_event_time
                .fetch_max(max.saturating_sub(1), Ordering::Relaxed);
        }
        let (keys, key_arrays) = self.sides.key_rows(side, &batch)?;
        let keeps = self.keeps(side);

        let mut late = 0u64;
        let mut part_of: HashMap<(&[u8], bool), usize> = HashMap::new();
        let mut parts: Vec<Part> = vec![];
        for i in 0..n {
            let fires_at = (!ends.is_null(i))
                .then(|| ends.value(i))
                .filter(|e| !is_fired(*e, self.watermark));
            let Some(end) = fires_at else {
                late += 1;
                continue;
            };
            let null_key = key_arrays.iter().any(|a| a.is_null(i));
            // A NULL key never matches: kept only to be emitted padded.
            if null_key && !keeps {
                continue;
            }
            let k = keys.row(i);
            let p = *part_of.entry((k, null_key)).or_insert_with(|| {
                parts.push(Part {
                    first: i,
                    group: self.state.key_group(k),
                    null_key,
                    fires_at: end.saturating_sub(1),
                    rows: vec![],
                });
                parts.len() - 1
            });
            parts[p].rows.push(i);
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
                namespace: if p.null_key { NULL_KEY } else { &[] },
            })
            .collect();
        let stored = self.state.get(side, &refs)?;
        let other = self.state.get(1 - side, &refs)?;
        let rows = self.sides.codecs[side].encode(batch.columns())?;
        let mut w = KeyedWrite::default();
        for ((part, e), (mine, theirs)) in parts.iter().zip(&refs).zip(stored.into_iter().zip(other)) {
            let old = mine.as_ref().map(Vec::len);
            let mut value = mine.unwrap_or_default();
            value.extend(RowList::encode(part.rows.iter().map(|r| rows.row(*r))));
            // The window's first row of either side sets its timer.
            if old.is_none() && theirs.is_none() {
                w.add_timer(TIMERS, part.group, part.fires_at, e.key, e.namespace);
            }
            w.put(side, *e, old, value);
        }
        self.state.write(w)?;
        Ok(())
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        // Wall-clock windows complete on the wall clock.
        let watermark = crate::time_zone::watermark_in(watermark, self.zone.as_ref());
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
            // Earlier windows first.
            due.sort_by_key(|t| t.time);
            self.fire(&due, out)?;
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
    use arrow::datatypes::{Field, Schema};
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_expr::expressions::Column;

    fn side() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("end", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        ]))
    }

    /// A FULL window join on (end, k).
    fn join() -> WindowJoinOperator {
        let keys =
            || -> Vec<Arc<dyn PhysicalExpr>> { vec![Arc::new(Column::new("end", 1)), Arc::new(Column::new("k", 0))] };
        let (mut node, out) = crate::operators::join::test_node(JoinType::Full, side(), keys());
        node.window = Some([1, 1]);
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        let metrics = Arc::new(NodeMetrics::new("window join".into()));
        WindowJoinOperator::new(&node, [1, 1], out, state, metrics).expect("window join")
    }

    /// Feeds rows written as text (`a 10`: key, time in ms; `.` for NULL).
    fn feed(j: &mut WindowJoinOperator, side: usize, rows: &str, out: &mut Collector) {
        j.process_input(side, crate::change::from_pretty(&self::side(), rows), out)
            .expect("process");
    }

    fn emitted(out: &mut Collector) -> Vec<String> {
        let mut rows = vec![];
        for b in out.take() {
            let b = b.into_inserts("test").expect("inserts");
            let (lk, rk) = (b.column(0).as_string::<i32>(), b.column(2).as_string::<i32>());
            for i in 0..b.num_rows() {
                let show = |a: &arrow::array::StringArray| {
                    if a.is_null(i) {
                        "-".to_string()
                    } else {
                        a.value(i).to_string()
                    }
                };
                rows.push(format!("{}|{}", show(lk), show(rk)));
            }
        }
        rows.sort();
        rows
    }

    /// A window is joined once when the watermark passes its end, NULL
    /// keys match nothing but are padded on an outer side, rows of a fired
    /// window are late, and the state is freed.
    #[test]
    fn joins_at_the_window_end_and_frees_it() {
        let mut j = join();
        let mut out = Collector::default();
        feed(&mut j, 0, "a 10\n. 10\nb 20", &mut out);
        feed(&mut j, 1, "a 10\n. 10\nc 10", &mut out);
        j.on_watermark(8, &mut out).expect("watermark");
        assert!(emitted(&mut out).is_empty(), "nothing before the window's end");
        j.on_watermark(9, &mut out).expect("watermark");
        assert_eq!(emitted(&mut out), ["-|-", "-|-", "-|c", "a|a"]);
        feed(&mut j, 1, "a 10\nb 20", &mut out);
        assert_eq!(j.metrics.late_rows_dropped.load(Ordering::Relaxed), 1);
        j.on_watermark(crate::message::MAX_WATERMARK, &mut out).expect("end");
        assert_eq!(emitted(&mut out), ["b|b"]);
        assert_eq!(j.state.size_bytes(), 0, "state left at the end");
        assert_eq!(j.state.counted_bytes().expect("count"), 0);
    }
}
