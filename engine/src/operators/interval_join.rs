//! Interval joins: `a JOIN b ON a.k = b.k AND a.ts BETWEEN b.ts - x AND
//! b.ts + y` (INNER, LEFT, RIGHT, FULL) over insert-only inputs, as
//! Flink's `RowTimeIntervalJoin`. Input 0 is the left side, input 1 the
//! right; each arrives hash-exchanged by its join key.
//!
//! The bounds say `right.ts + lower <= left.ts <= right.ts + upper`
//! (inclusive, as Flink). A left row at `t` matches right rows in
//! `[t - upper, t - lower]`, a right row at `t` left rows in
//! `[t + lower, t + upper]`. Operator time is the watermark (clamped to
//! ≥ 0, as Flink's). Per row, as Flink does:
//! - it is joined with the other side's stored rows in its range (even
//!   when it is late: "it is valid to join late input data");
//! - it is stored only while the other side may still send matches (the
//!   operator time is below the range's upper end), with a cleanup timer
//!   at `t + relative size + 1` (`relative size` = `-lower` for the left
//!   side, `upper` for the right): when the watermark reaches it no
//!   on-time row of the other side can match any more;
//! - an outer side's row that never matched is emitted padded with NULLs
//!   when it is cleaned up, or at once when it is not stored.
//!
//! State, through the keyed-state layer: per side a value state keyed by
//! the join key, namespace = row time (8 bytes, order-preserving) ++ the
//! row in the key encoding, value = (count, matched) as two varints; and
//! per side a timer state (one timer per stored row at its cleanup time,
//! naming the row: its namespace is the row's). Everything is
//! insert-only in and out.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, Int64Array, UInt32Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::physical_expr::PhysicalExpr;
use hashbrown::HashMap;

use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::KeyEncoder;
use crate::message::{MIN_WATERMARK, Timestamp};
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::join::{condition_holds, entry_of, pairs};
use crate::operators::{Collector, Operator};
use crate::plan::{IntervalBounds, JoinNode, JoinType};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::{RowCodec, counts_len, decode_counts, encode_counts};
use crate::state::keyed::{decode_time, encode_time};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

/// The operator's states: rows of the left and right side (index = input),
/// then each side's cleanup timers (index = 2 + input). Names are part of
/// savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "interval-join-left",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "interval-join-right",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "interval-join-left-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
    StateDecl {
        name: "interval-join-right-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Timers fired per state read, so a large watermark jump is handled in
/// bounded chunks.
const FIRE_CHUNK: usize = 4096;

pub struct IntervalJoinOperator {
    name: String,
    join_type: JoinType,
    keys: [Vec<Arc<dyn PhysicalExpr>>; 2],
    key_encoder: KeyEncoder,
    row_codecs: [RowCodec; 2],
    schemas: [SchemaRef; 2],
    /// Each side's time column.
    times: [usize; 2],
    /// Per side, the other side's times a row at `t` matches:
    /// `[t + range[s].0, t + range[s].1]`.
    range: [(i64, i64); 2],
    /// Per side, how long after its time a row may still be matched by the
    /// other side's on-time rows (Flink's relative size).
    relative: [i64; 2],
    filter: Option<Arc<dyn PhysicalExpr>>,
    pair_schema: SchemaRef,
    schema: SchemaRef,
    state: KeyedState,
    metrics: Arc<NodeMetrics>,
    watermark: Timestamp,
    /// The newest row time seen (state spans it back to the watermark).
    max_ts: Timestamp,
    /// Processing time: rows take the clock, the clock expires them.
    proctime: bool,
}

/// A stored row's (count, matched): `matched` is 1 once any row of the
/// other side joined it (an outer side's row is padded only without).
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    count: i64,
    matched: i64,
}

fn decode_entry(side: usize, v: &[u8]) -> Result<Entry> {
    let mut c = [0; 2];
    decode_counts(v, &mut c).ok_or_else(|| StateError::Corrupt {
        state: STATES[side].name.into(),
        message: format!(
            "a row entry of {} bytes does not hold a count and a match flag",
            v.len()
        ),
    })?;
    Ok(Entry {
        count: c[0],
        matched: c[1],
    })
}

/// A stored row of the other side, met by this batch.
struct Other {
    slot: u32,
    /// Row time ++ row.
    ns: Vec<u8>,
    entry: Entry,
    dirty: bool,
}

/// The row time in front of a stored row's namespace.
fn ns_time(side: usize, ns: &[u8]) -> Result<i64> {
    let t: [u8; 8] = ns
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| StateError::Corrupt {
            state: STATES[side].name.into(),
            message: format!("a row entry's namespace of {} bytes has no row time", ns.len()),
        })?;
    Ok(decode_time(t))
}

/// The operator of an interval join's subtask.
pub fn build(node: &JoinNode, bounds: &IntervalBounds, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(IntervalJoinOperator::new(
        node,
        bounds,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl IntervalJoinOperator {
    pub fn new(
        node: &JoinNode,
        bounds: &IntervalBounds,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self> {
        let sides = crate::operators::join::JoinSides::new(node)?;
        let (lower, upper) = (bounds.lower, bounds.upper);
        Ok(Self {
            name: format!("IntervalJoin {}", node.join_type.sql()),
            join_type: node.join_type,
            keys: sides.keys,
            key_encoder: sides.key_encoder,
            row_codecs: sides.codecs,
            schemas: sides.schemas,
            times: [bounds.left_time, bounds.right_time],
            range: [(-upper, -lower), (lower, upper)],
            relative: [-lower, upper],
            filter: sides.filter,
            pair_schema: sides.pair_schema,
            schema,
            state,
            metrics,
            watermark: MIN_WATERMARK,
            max_ts: MIN_WATERMARK,
            proctime: bounds.proctime,
        })
    }

    /// Time (the watermark, or the clock) reached `to`: rows the other
    /// side can no longer match are freed (an outer side's unmatched
    /// ones emitted padded).
    fn advance_to(&mut self, to: Timestamp, out: &mut Collector) -> Result<()> {
        if to <= self.watermark {
            return Ok(());
        }
        self.watermark = to;
        for side in 0..2 {
            self.clean_up(side, to, out)?;
        }
        Ok(())
    }

    /// Flink's operator time: the watermark, never below 0.
    fn operator_time(&self) -> i64 {
        self.watermark.max(0)
    }

    fn outer(&self, side: usize) -> bool {
        if side == 0 {
            self.join_type.keeps_left()
        } else {
            self.join_type.keeps_right()
        }
    }

    /// Each row's time in ms (NULL: the row matches nothing); on
    /// processing time, the clock now (never behind what expired).
    fn row_times(&self, side: usize, rows: &RecordBatch) -> Result<Int64Array> {
        if self.proctime {
            let now = self.state.clock().now_ms().max(self.watermark.saturating_add(1));
            return Ok(Int64Array::from(vec![now; rows.num_rows()]));
        }
        times_ms(rows.column(self.times[side]), "interval join")
    }

    /// The newest event time and the state held per second of event time,
    /// for `SHOW WATERMARKS` (how much state a drift costs under
    /// alignment).
    fn note_event_time(&mut self, times: &Int64Array) {
        if let Some(max) = arrow::compute::max(times) {
            self.metrics.max_event_time.fetch_max(max, Ordering::Relaxed);
            self.max_ts = self.max_ts.max(max);
        }
        if self.watermark > MIN_WATERMARK && self.max_ts > self.watermark {
            let span_ms = self.max_ts - self.watermark;
            self.metrics.peak_state_span_ms.fetch_max(span_ms, Ordering::Relaxed);
            let span_s = span_ms as f64 / 1000.0;
            let rate = (self.metrics.state_bytes.load(Ordering::Relaxed) as f64 / span_s) as i64;
            self.metrics.peak_state_rate.fetch_max(rate, Ordering::Relaxed);
        }
    }

    /// Emits `rows` of side `side` padded with NULLs for the other side.
    fn emit_padded(&self, side: usize, rows: &RecordBatch, idx: Vec<u32>, out: &mut Collector) -> Result<()> {
        if idx.is_empty() {
            return Ok(());
        }
        let n = idx.len();
        let empty = RecordBatch::new_empty(self.schemas[1 - side].clone());
        let none = UInt32Array::from(vec![None::<u32>; n]);
        let cols = pairs(side, rows, &UInt32Array::from(idx), &empty, &none)?;
        out.emit(ChangeBatch::new(
            batch_with_schema(&self.schema, cols)?,
            vec![RowKind::Insert; n],
        ));
        Ok(())
    }

    /// The watermark passed the cleanup timers of side `side` up to
    /// `up_to`: their rows go, an outer side's unmatched ones padded.
    ///
    /// A timer names its row (namespace = row time ++ row), so an inner
    /// side's rows are deleted without reading them and an outer side's
    /// are read in one multi-get; a timer without a namespace (written
    /// before timers named their rows) has its key's rows at that time
    /// scanned.
    fn clean_up(&mut self, side: usize, up_to: Timestamp, out: &mut Collector) -> Result<()> {
        loop {
            let timers: Vec<Timer> = self.state.due_timers(2 + side, up_to, FIRE_CHUNK)?;
            if timers.is_empty() {
                return Ok(());
            }
            let more = timers.len() == FIRE_CHUNK;
            let mut gone: Vec<Freed> = vec![];
            for (i, t) in timers.iter().enumerate() {
                if !t.namespace.is_empty() {
                    gone.push((i, t.namespace.clone(), None));
                    continue;
                }
                let row_time = t.time - self.relative[side] - 1;
                let prefix = encode_time(row_time);
                let e = EntryRef {
                    key_group: t.key_group,
                    key: &t.key,
                    namespace: &prefix,
                };
                let mut bad = None;
                self.state.scan_namespaces(side, e, &mut |rest, v| {
                    match decode_entry(side, v) {
                        Ok(entry) => {
                            let mut ns = prefix.to_vec();
                            ns.extend_from_slice(rest);
                            gone.push((i, ns, Some(entry)));
                        }
                        Err(e) => bad = Some(e),
                    }
                    bad.is_none()
                })?;
                if let Some(e) = bad {
                    return Err(e);
                }
            }
            if self.outer(side) {
                let unread: Vec<usize> = (0..gone.len()).filter(|g| gone[*g].2.is_none()).collect();
                let wanted: Vec<EntryRef> = unread.iter().map(|g| freed_entry(&timers, &gone[*g])).collect();
                let values = self.state.get(side, &wanted)?;
                for (g, v) in unread.into_iter().zip(values) {
                    if let Some(v) = v {
                        gone[g].2 = Some(decode_entry(side, &v)?);
                    }
                }
            }
            let mut w = KeyedWrite::default();
            let mut padded: Vec<&[u8]> = vec![];
            for g in &gone {
                if let Some(entry) = g.2
                    && self.outer(side)
                    && entry.matched == 0
                {
                    for _ in 0..entry.count.max(0) {
                        padded.push(&g.1[8..]);
                    }
                }
                let e = freed_entry(&timers, g);
                let stored = g.2.map(|c| counts_len(&[c.count, c.matched]));
                // An inner side's rows are freed unread (a read per row
                // would cost more than the cleanup): a row's counts take 2
                // bytes unless it came 64 times or more.
                let stored = if self.outer(side) { stored } else { stored.or(Some(2)) };
                w.delete(side, e, stored);
            }
            for t in &timers {
                w.delete_timer(2 + side, t);
            }
            if !padded.is_empty() {
                let cols = self.row_codecs[side].decode(padded.iter().copied())?;
                let options = RecordBatchOptions::new().with_row_count(Some(padded.len()));
                let rows = RecordBatch::try_new_with_options(self.schemas[side].clone(), cols, &options)?;
                self.emit_padded(side, &rows, (0..padded.len() as u32).collect(), out)?;
            }
            self.state.write(w)?;
            if !more {
                return Ok(());
            }
        }
    }
}

/// A row a cleanup timer frees: (index of the timer, the row's namespace,
/// its entry once read).
type Freed = (usize, Vec<u8>, Option<Entry>);

fn freed_entry<'a>(timers: &'a [Timer], (i, ns, _): &'a Freed) -> EntryRef<'a> {
    EntryRef {
        key_group: timers[*i].key_group,
        key: &timers[*i].key,
        namespace: ns,
    }
}

impl Operator for IntervalJoinOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    /// A row joined now may be as old as the larger relative size behind
    /// the watermark; the rowtime columns stay time attributes, so a
    /// window after the join must not see it late.
    fn watermark_delay(&self) -> i64 {
        self.relative[0].max(self.relative[1]).max(0)
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        // A processing-time join ignores event time, but the end of a
        // bounded input (or a drain) expires every row.
        if self.proctime && watermark < crate::message::MAX_WATERMARK {
            return Ok(());
        }
        self.advance_to(watermark, out)
    }

    fn processing_time_interval(&self) -> Option<std::time::Duration> {
        self.proctime.then(|| std::time::Duration::from_millis(100))
    }

    fn on_processing_time(&mut self, now: i64, out: &mut Collector) -> Result<()> {
        if !self.proctime {
            return Ok(());
        }
        self.advance_to(now.saturating_sub(1), out)
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        self.process_input(0, batch, out)
    }

    fn process_input(&mut self, side: usize, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        if side > 1 {
            return Err(ExecError::internal(format!("a join has inputs 0 and 1, not {side}")));
        }
        if batch.kinds.is_some() && (0..batch.num_rows()).any(|i| batch.kind(i) != RowKind::Insert) {
            return Err(ExecError::internal("an interval join's input must be insert-only"));
        }
        let other = 1 - side;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let rows = &batch.rows;
        let times = self.row_times(side, rows)?;
        let key_arrays = self.keys[side]
            .iter()
            .map(|k| k.evaluate(rows).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let key_rows = self.key_encoder.encode(&key_arrays)?;
        let row_bytes = self.row_codecs[side].encode(rows.columns())?;
        self.note_event_time(&times);
        let op_time = self.operator_time();
        // Rows of the other side at or before this time are gone (or go
        // at the next cleanup): not joined.
        let other_expired = op_time - self.relative[other] - 1;
        let (lo, hi) = self.range[side];

        // The batch's keys; rows with a NULL key or time match nothing.
        let mut slot_of: HashMap<&[u8], u32> = HashMap::new();
        let mut slots: Vec<(u16, usize)> = vec![];
        let mut row_slot: Vec<Option<u32>> = Vec::with_capacity(n);
        for i in 0..n {
            if times.is_null(i) || key_arrays.iter().any(|a| a.is_null(i)) {
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

        // The other side's live rows under each key, with their times.
        let mut others: Vec<Other> = vec![];
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::with_capacity(slots.len());
        for s in 0..slots.len() as u32 {
            let start = others.len();
            let e = entry_of(&slots, &key_rows, s, &[]);
            let mut bad = None;
            self.state.scan_namespaces(other, e, &mut |ns, v| {
                match decode_entry(other, v) {
                    Ok(entry) if entry.count > 0 => others.push(Other {
                        slot: s,
                        ns: ns.to_vec(),
                        entry,
                        dirty: false,
                    }),
                    Ok(_) => {}
                    Err(e) => bad = Some(e),
                }
                bad.is_none()
            })?;
            if let Some(e) = bad {
                return Err(e);
            }
            ranges.push(start..others.len());
        }
        let other_times = others
            .iter()
            .map(|o| ns_time(other, &o.ns))
            .collect::<Result<Vec<_>>>()?;
        let other_rows = {
            let cols = self.row_codecs[other].decode(others.iter().map(|o| &o.ns[8..]))?;
            let options = RecordBatchOptions::new().with_row_count(Some(others.len()));
            RecordBatch::try_new_with_options(self.schemas[other].clone(), cols, &options)?
        };

        // Candidate pairs: same key, the other row's time in range.
        let mut cand_this = vec![];
        let mut cand_other = vec![];
        for (i, s) in row_slot.iter().enumerate() {
            let Some(s) = s else { continue };
            let t = times.value(i);
            if t.saturating_add(hi) <= other_expired {
                continue;
            }
            for j in ranges[*s as usize].clone() {
                let ot = other_times[j];
                if ot > other_expired && ot >= t.saturating_add(lo) && ot <= t.saturating_add(hi) {
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

        // Row by row: its matches; then it is stored or, unmatched on an
        // outer side and not stored, padded at once.
        let mut this_idx: Vec<Option<u32>> = vec![];
        let mut other_idx: Vec<Option<u32>> = vec![];
        // This side's rows to store: (slot, row time ++ row) → index in
        // `added` (equal rows share one entry and count).
        let mut index: HashMap<(u32, Vec<u8>), usize> = HashMap::new();
        let mut added: Vec<(u32, Vec<u8>, Entry)> = vec![];
        let mut p = 0;
        for (i, s) in row_slot.iter().enumerate() {
            let mut matched = false;
            // Candidates are in row order.
            while p < cand_this.len() && cand_this[p] as usize == i {
                let j = cand_other[p];
                let pass = keep.as_ref().is_none_or(|k| k.value(p));
                p += 1;
                if !pass {
                    continue;
                }
                let o = &mut others[j as usize];
                for _ in 0..o.entry.count {
                    this_idx.push(Some(i as u32));
                    other_idx.push(Some(j));
                }
                if o.entry.matched == 0 {
                    o.entry.matched = 1;
                    o.dirty = true;
                }
                matched = true;
            }
            match s {
                Some(s) if op_time < times.value(i).saturating_add(hi) => {
                    let mut ns = encode_time(times.value(i)).to_vec();
                    ns.extend_from_slice(row_bytes.row(i));
                    let at = *index.entry((*s, ns)).or_insert_with_key(|(s, ns)| {
                        added.push((*s, ns.clone(), Entry::default()));
                        added.len() - 1
                    });
                    let e = &mut added[at].2;
                    e.count += 1;
                    e.matched = e.matched.max(i64::from(matched));
                }
                _ if !matched && self.outer(side) => {
                    this_idx.push(Some(i as u32));
                    other_idx.push(None);
                }
                _ => {}
            }
        }

        // One write: this side's rows (added to what is stored) with their
        // cleanup timers, and the other side's rows that matched first.
        let entry = |s: u32, ns| entry_of(&slots, &key_rows, s, ns);
        let mut w = KeyedWrite::default();
        if !added.is_empty() {
            let wanted: Vec<EntryRef> = added.iter().map(|(s, ns, _)| entry(*s, ns)).collect();
            let before = self.state.get(side, &wanted)?;
            for ((e, (_, ns, new)), old) in wanted.iter().zip(&added).zip(before) {
                let mut sum = *new;
                match &old {
                    Some(v) => {
                        let was = decode_entry(side, v)?;
                        sum.count += was.count;
                        sum.matched = sum.matched.max(was.matched);
                    }
                    None => {
                        let t = ns_time(side, ns)?;
                        w.add_timer(2 + side, e.key_group, t + self.relative[side] + 1, e.key, ns);
                    }
                }
                w.put(side, *e, old.map(|v| v.len()), encode_counts(&[sum.count, sum.matched]));
            }
        }
        // The other side's rows that matched first (were unmatched).
        for o in others.iter().filter(|o| o.dirty) {
            w.put(
                other,
                entry(o.slot, &o.ns),
                Some(counts_len(&[o.entry.count, 0])),
                encode_counts(&[o.entry.count, o.entry.matched]),
            );
        }
        if !w.is_empty() {
            self.state.write(w)?;
        }

        if this_idx.is_empty() {
            return Ok(());
        }
        let k = this_idx.len();
        let cols = pairs(
            side,
            rows,
            &UInt32Array::from(this_idx),
            &other_rows,
            &UInt32Array::from(other_idx),
        )?;
        out.emit(ChangeBatch::new(
            batch_with_schema(&self.schema, cols)?,
            vec![RowKind::Insert; k],
        ));
        Ok(())
    }
}

/// A timestamp column's values in ms since the epoch (NULL stays NULL),
/// whatever its unit: the time column of `what`.
pub(crate) fn times_ms(col: &arrow::array::ArrayRef, what: &str) -> Result<Int64Array> {
    use arrow::datatypes::TimeUnit;
    let DataType::Timestamp(unit, _) = col.data_type() else {
        return Err(ExecError::internal(format!(
            "{what} time column has type {}, not a timestamp",
            col.data_type()
        )));
    };
    let raw = cast(col, &DataType::Int64)?;
    let raw = raw
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| ExecError::internal(format!("{what} time is not a timestamp")))?;
    Ok(match unit {
        TimeUnit::Second => arrow::compute::kernels::arity::unary(raw, |v: i64| v.saturating_mul(1000)),
        TimeUnit::Millisecond => raw.clone(),
        TimeUnit::Microsecond => arrow::compute::kernels::arity::unary(raw, |v: i64| v.div_euclid(1000)),
        TimeUnit::Nanosecond => arrow::compute::kernels::arity::unary(raw, |v: i64| v.div_euclid(1_000_000)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::HeapBackend;
    use arrow::array::{StringArray, TimestampMillisecondArray};
    use arrow::datatypes::{Field, Schema, TimeUnit};
    use datafusion::physical_expr::expressions::Column;

    fn side(name: &str) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(format!("{name}k"), DataType::Utf8, true),
            Field::new(
                format!("{name}ts"),
                DataType::Timestamp(TimeUnit::Millisecond, None),
                true,
            ),
        ]))
    }

    /// A LEFT interval join `r.ts - 1 s <= l.ts <= r.ts + 1 s`.
    fn join() -> IntervalJoinOperator {
        let (l, r) = (side("l"), side("r"));
        let node = JoinNode {
            join_type: JoinType::Left,
            left_keys: vec![Arc::new(Column::new("lk", 0))],
            right_keys: vec![Arc::new(Column::new("rk", 0))],
            filter: None,
            left_schema: l.clone(),
            right_schema: r.clone(),
            state_ttl: [None, None],
            unique_keys: [None, None],
            interval: None,
            window: None,
            temporal: None,
            zone: None,
        };
        let bounds = IntervalBounds {
            left_time: 1,
            right_time: 1,
            lower: -1000,
            upper: 1000,
            proctime: false,
        };
        let out = Arc::new(Schema::new(
            l.fields()
                .iter()
                .chain(r.fields().iter())
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        let metrics = Arc::new(NodeMetrics::new("interval join".into()));
        IntervalJoinOperator::new(&node, &bounds, out, state, metrics).expect("interval join")
    }

    fn feed(j: &mut IntervalJoinOperator, side: usize, rows: &[(&str, i64)], out: &mut Collector) {
        let batch = RecordBatch::try_new(
            j.schemas[side].clone(),
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(TimestampMillisecondArray::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
            ],
        )
        .expect("rows");
        j.process_input(side, ChangeBatch::from(batch), out).expect("process");
    }

    fn rows_out(out: &mut Collector) -> usize {
        out.take().iter().map(|b| b.num_rows()).sum()
    }

    /// A long run with the watermark advancing: state stays within the
    /// interval (flat, not growing with the input), every left row is
    /// emitted once (matched or padded), and the end of input frees all.
    #[test]
    fn state_stays_bounded_as_the_watermark_advances() {
        let mut j = join();
        let mut out = Collector::default();
        let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let (mut emitted, mut peak_late, mut at_round_5) = (0, 0, 0);
        for round in 0..60i64 {
            let base = round * 1000;
            // Left rows at every 10 ms; right rows only for even keys, so
            // odd keys' left rows are padded when they expire.
            let left: Vec<(&str, i64)> = (0..100).map(|i| (keys[i % 8], base + i as i64 * 10)).collect();
            let right: Vec<(&str, i64)> = (0..100)
                .filter(|i| i % 2 == 0)
                .map(|i| (keys[i % 8], base + 5000 + i as i64 * 10))
                .collect();
            feed(&mut j, 0, &left, &mut out);
            feed(&mut j, 1, &right, &mut out);
            j.on_watermark(base, &mut out).expect("watermark");
            emitted += rows_out(&mut out);
            let bytes = j.state.size_bytes();
            assert_eq!(bytes, j.state.counted_bytes().expect("count"));
            if round == 5 {
                at_round_5 = bytes;
            }
            if round > 10 {
                peak_late = peak_late.max(bytes);
            }
        }
        assert!(at_round_5 > 0);
        assert!(
            peak_late <= at_round_5 * 2,
            "state grew with the input: {at_round_5} bytes at round 5, up to {peak_late} later"
        );
        j.on_watermark(crate::message::MAX_WATERMARK, &mut out).expect("end");
        emitted += rows_out(&mut out);
        assert_eq!(j.state.size_bytes(), 0, "state left at the end");
        assert_eq!(j.state.counted_bytes().expect("count"), 0);
        // Left rows of odd keys never match: 3000 padded. Each even-key
        // left row matches the right rows of its key within 1 s.
        assert!(emitted >= 6000, "every left row is emitted at least once: {emitted}");
    }

    /// State written before timers named their rows (a timer per key and
    /// row time, namespace empty) is still freed, and an unmatched outer
    /// row padded, when the watermark passes it.
    #[test]
    fn timers_without_a_row_free_the_rows_of_their_time() {
        let mut j = join();
        let mut out = Collector::default();
        let rows = RecordBatch::try_new(
            j.schemas[0].clone(),
            vec![
                Arc::new(StringArray::from(vec!["x", "x"])),
                Arc::new(TimestampMillisecondArray::from(vec![5000, 5000])),
            ],
        )
        .expect("rows");
        let keys = j.key_encoder.encode(&[rows.column(0).clone()]).expect("keys");
        let bytes = j.row_codecs[0].encode(rows.columns()).expect("rows");
        let key = keys.row(0);
        let group = j.state.key_group(key);
        let mut w = KeyedWrite::default();
        let mut ns = encode_time(5000).to_vec();
        ns.extend_from_slice(bytes.row(0));
        let e = EntryRef {
            key_group: group,
            key,
            namespace: &ns,
        };
        w.put(0, e, None, encode_counts(&[2, 0]));
        w.add_timer(2, group, 5000 + j.relative[0] + 1, key, &[]);
        j.state.write(w).expect("write");
        j.on_watermark(5000 + j.relative[0], &mut out).expect("watermark");
        assert_eq!(rows_out(&mut out), 0, "not due yet");
        j.on_watermark(5000 + j.relative[0] + 1, &mut out).expect("watermark");
        assert_eq!(rows_out(&mut out), 2, "the unmatched row, twice, padded");
        assert_eq!(j.state.get(0, &[e]).expect("read"), vec![None], "row freed");
        assert!(j.state.due_timers(2, i64::MAX, 10).expect("timers").is_empty());
    }
}
