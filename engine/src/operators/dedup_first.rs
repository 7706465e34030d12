//! Deduplication keeping the first row by event time (`ROW_NUMBER() OVER
//! (PARTITION BY k ORDER BY rowtime ASC) = 1`, the rank not shown): Flink
//! 2.1+'s `RowTimeDeduplicateKeepFirstRowFunction`. Its output is
//! insert-only: a key's row is emitted once, when the watermark passes
//! its time, and nothing about the key is emitted after.
//!
//! Per row, in arrival order:
//! - a row whose time is before the current watermark is late: dropped
//!   and counted (a row *at* the watermark is not late);
//! - a key already emitted ignores every later row;
//! - otherwise the row is kept if the key holds none or the kept row's
//!   time is strictly later (a tie keeps the earlier arrival), and a
//!   timer is set at its time (the replaced row's timer is deleted).
//!
//! On a watermark, each due timer emits its key's kept row `+I` and marks
//! the key emitted.
//!
//! State, through the keyed-state layer: `dedup-first-waiting` (value:
//! the kept row's time, 8 bytes, then the row in Weir's encoding; no TTL,
//! as in Flink: expiring it would lose a row the watermark has not yet
//! released), `dedup-first-emitted` (value: empty, TTL'd) and
//! `dedup-first-timers` (event-time timers, one per waiting key).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, AsArray, UInt64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use hashbrown::HashMap;

use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result};
use crate::keygroup::KeyEncoder;
use crate::message::Timestamp;
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::state::codec::RowCodec;
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};
use datafusion::physical_expr::PhysicalExpr;

const WAITING: usize = 0;
const EMITTED: usize = 1;
const TIMERS: usize = 2;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "dedup-first-waiting",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "dedup-first-emitted",
        kind: StateKind::Value,
        ttl: true,
    },
    StateDecl {
        name: "dedup-first-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Timers fired per state read.
const FIRE_CHUNK: usize = 4096;

pub struct DedupFirstOperator {
    partition: Vec<Arc<dyn PhysicalExpr>>,
    /// `None`: one partition (no PARTITION BY).
    key_encoder: Option<KeyEncoder>,
    /// The event-time column of the input.
    time_column: usize,
    codec: RowCodec,
    /// The input's columns, and the rank column (always 1) when the plan
    /// node has it.
    schema: SchemaRef,
    state: KeyedState,
    watermark: Timestamp,
    metrics: Arc<crate::runtime::metrics::NodeMetrics>,
}

/// What a key of the batch holds, as its rows change it.
#[derive(Default)]
struct Slot {
    /// The row the key's first row in the batch is: its key.
    first: usize,
    group: u16,
    emitted: bool,
    /// The kept row: its time and bytes, and whether it was stored.
    waiting: Option<(Timestamp, Vec<u8>)>,
    stored: Option<Timestamp>,
    /// The stored value's size (state size accounting).
    stored_len: usize,
}

/// The operator of a keep-first rowtime deduplication's subtask: its time
/// column is the first ORDER BY key.
pub fn build(node: &crate::plan::RankNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    let time_column = node
        .order
        .first()
        .and_then(|k| k.expr.downcast_ref::<datafusion::physical_expr::expressions::Column>())
        .map(|c| c.index())
        .ok_or_else(|| ExecError::internal("a keep-first deduplication without its time column"))?;
    Ok(Box::new(DedupFirstOperator::new(
        &node.partition,
        time_column,
        &ctx.input_schema()?,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl DedupFirstOperator {
    pub fn new(
        partition: &[Arc<dyn PhysicalExpr>],
        time_column: usize,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<crate::runtime::metrics::NodeMetrics>,
    ) -> Result<Self> {
        let types: Vec<_> = input_schema.fields().iter().map(|f| f.data_type().clone()).collect();
        Ok(Self {
            partition: partition.to_vec(),
            key_encoder: KeyEncoder::for_keys(partition, input_schema)?,
            time_column,
            codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            schema,
            state,
            watermark: Timestamp::MIN,
            metrics,
        })
    }
}

impl Operator for DedupFirstOperator {
    fn name(&self) -> &str {
        "Deduplicate (keep first, rowtime)"
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

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        let batch = batch.into_inserts("Deduplicate")?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let times = batch.column(self.time_column);
        let times = match times.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, None) => times.clone(),
            _ => cast(times, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        };
        let times = times.as_primitive::<TimestampMillisecondType>();
        let key_rows = KeyEncoder::encode_rows(self.key_encoder.as_ref(), &self.partition, &batch)?;
        let key_of = |i: usize| -> &[u8] { key_rows.as_ref().map_or(&[][..], |r| r.row(i)) };

        // The keys of the rows that are not late, and their stored state.
        let mut late = 0u64;
        let mut slot_of: HashMap<&[u8], usize> = HashMap::new();
        let mut slots: Vec<Slot> = vec![];
        let mut row_slot: Vec<Option<usize>> = Vec::with_capacity(n);
        for i in 0..n {
            if times.is_null(i) || times.value(i) < self.watermark {
                late += 1;
                row_slot.push(None);
                continue;
            }
            let k = key_of(i);
            let s = *slot_of.entry(k).or_insert_with(|| {
                slots.push(Slot {
                    first: i,
                    group: self.state.key_group(k),
                    ..Slot::default()
                });
                slots.len() - 1
            });
            row_slot.push(Some(s));
        }
        if late > 0 {
            self.metrics.late_rows_dropped.fetch_add(late, Ordering::Relaxed);
        }
        if slots.is_empty() {
            return Ok(());
        }
        let entries: Vec<EntryRef> = slots
            .iter()
            .map(|s| EntryRef {
                key_group: s.group,
                key: key_of(s.first),
                namespace: &[],
            })
            .collect();
        let emitted = self.state.get(EMITTED, &entries)?;
        let waiting = self.state.get(WAITING, &entries)?;
        for ((slot, e), w) in slots.iter_mut().zip(emitted).zip(waiting) {
            slot.emitted = e.is_some();
            if let Some(w) = w {
                let (t, row) = split_waiting(&w)?;
                slot.stored = Some(t);
                slot.stored_len = w.len();
                slot.waiting = Some((t, row.to_vec()));
            }
        }

        let rows = self.codec.encode(batch.columns())?;
        for (i, s) in row_slot.iter().enumerate() {
            let Some(slot) = s.map(|s| &mut slots[s]) else {
                continue;
            };
            if slot.emitted {
                continue;
            }
            let t = times.value(i);
            // Strictly earlier replaces: a tie keeps the earlier arrival.
            if slot.waiting.as_ref().is_none_or(|(kept, _)| t < *kept) {
                slot.waiting = Some((t, rows.row(i).to_vec()));
            }
        }

        let mut w = KeyedWrite::default();
        for slot in &slots {
            let Some((t, row)) = &slot.waiting else {
                continue;
            };
            if slot.stored == Some(*t) {
                continue;
            }
            let key = key_of(slot.first);
            let e = EntryRef {
                key_group: slot.group,
                key,
                namespace: &[],
            };
            if let Some(old) = slot.stored {
                w.delete_timer(
                    TIMERS,
                    &Timer {
                        key_group: slot.group,
                        time: old,
                        key: key.to_vec(),
                        namespace: vec![],
                    },
                );
            }
            let mut value = Vec::with_capacity(8 + row.len());
            value.extend_from_slice(&t.to_be_bytes());
            value.extend_from_slice(row);
            w.put(WAITING, e, slot.stored.map(|_| slot.stored_len), value);
            w.add_timer(TIMERS, slot.group, *t, key, &[]);
        }
        self.state.write(w)?;
        Ok(())
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        self.watermark = self.watermark.max(watermark);
        loop {
            let due = self.state.due_timers(TIMERS, watermark, FIRE_CHUNK)?;
            if due.is_empty() {
                return Ok(());
            }
            let entries: Vec<EntryRef> = due
                .iter()
                .map(|t| EntryRef {
                    key_group: t.key_group,
                    key: &t.key,
                    namespace: &[],
                })
                .collect();
            let waiting = self.state.get(WAITING, &entries)?;
            let mut w = KeyedWrite::default();
            let mut rows: Vec<(Timestamp, Vec<u8>)> = vec![];
            for ((timer, e), value) in due.iter().zip(&entries).zip(waiting) {
                w.delete_timer(TIMERS, timer);
                let Some(value) = value else {
                    continue;
                };
                let (t, row) = split_waiting(&value)?;
                if t != timer.time {
                    // A replaced row's timer (deleted in the same write as
                    // its replacement, so only after a restore race): skip.
                    continue;
                }
                rows.push((t, row.to_vec()));
                w.delete(WAITING, *e, Some(value.len()));
                // A key fires once: it had no mark.
                w.put(EMITTED, *e, None, vec![]);
            }
            self.state.write(w)?;
            if !rows.is_empty() {
                // In time order, as Flink's timer queue fires them (the
                // state hands them out key group by key group).
                rows.sort_by_key(|(t, _)| *t);
                let mut columns = self.codec.decode(rows.iter().map(|(_, r)| r.as_slice()))?;
                if self.schema.fields().len() > columns.len() {
                    columns.push(Arc::new(UInt64Array::from(vec![1u64; rows.len()])));
                }
                out.emit(batch_with_schema(&self.schema, columns)?);
            }
            if due.len() < FIRE_CHUNK {
                return Ok(());
            }
        }
    }
}

/// A waiting value: the kept row's time, then its bytes.
fn split_waiting(value: &[u8]) -> Result<(Timestamp, &[u8])> {
    match value.split_first_chunk::<8>() {
        Some((t, row)) => Ok((Timestamp::from_be_bytes(*t), row)),
        None => Err(crate::error::StateError::Corrupt {
            state: "dedup-first-waiting".into(),
            message: format!("a value of {} bytes is shorter than its time", value.len()),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    //! The rules of Flink's `RowTimeDeduplicateKeepFirstRowFunction`, row by
    //! row (changelog.md §8, case 30).
    use super::*;
    use crate::runtime::metrics::NodeMetrics;
    use crate::state::HeapBackend;
    use arrow::datatypes::{Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    use crate::operators::testing::{feed_pretty, printed};

    fn dedup() -> DedupFirstOperator {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ]));
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        DedupFirstOperator::new(
            &[Arc::new(Column::new("k", 0))],
            2,
            &schema,
            schema.clone(),
            state,
            Arc::new(NodeMetrics::new("dedup".into())),
        )
        .expect("dedup")
    }

    /// Feeds rows written `k v ts` (ts in ms), one per line; the operator
    /// emits nothing until a watermark.
    fn feed(d: &mut DedupFirstOperator, rows: &str) {
        let schema = d.schema.clone();
        assert!(feed_pretty(d, 0, &schema, rows).is_empty());
    }

    fn watermark(d: &mut DedupFirstOperator, wm: Timestamp) -> Vec<String> {
        let mut out = Collector::default();
        d.on_watermark(wm, &mut out).expect("watermark");
        printed(&mut out)
    }

    #[test]
    fn the_earliest_row_is_emitted_when_the_watermark_passes_it() {
        let mut d = dedup();
        // ts 5, then 3 (earlier: replaces), then 3 again (a tie: the
        // earlier arrival stays).
        feed(&mut d, "a 1 5\na 2 3");
        feed(&mut d, "a 3 3\nb 4 7");
        assert!(watermark(&mut d, 2).is_empty());
        let out = watermark(&mut d, 3);
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with("+I[a, 2, "), "{out:?}");
        // The key is closed: a later, even earlier-timed, row is ignored.
        feed(&mut d, "a 5 4");
        let out = watermark(&mut d, 10);
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with("+I[b, 4, "), "{out:?}");
    }

    #[test]
    fn rows_before_the_watermark_are_late_and_rows_at_it_are_not() {
        let mut d = dedup();
        assert!(watermark(&mut d, 100).is_empty());
        feed(&mut d, "a 1 99\nb 2 100");
        assert_eq!(d.metrics.late_rows_dropped.load(Ordering::Relaxed), 1);
        let out = watermark(&mut d, 101);
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with("+I[b, 2, "), "{out:?}");
    }

    #[test]
    fn keys_fire_in_time_order_and_state_is_freed() {
        let mut d = dedup();
        feed(&mut d, "z 1 30\ny 2 10\nx 3 20");
        feed(&mut d, "z 4 25");
        let held = d.state.size_bytes();
        assert_eq!(held, d.state.counted_bytes().expect("count"));
        let out: Vec<String> = watermark(&mut d, 100).iter().map(|r| r[..7].to_string()).collect();
        assert_eq!(out, ["+I[y, 2", "+I[x, 3", "+I[z, 4"]);
        // The waiting rows and their timers are gone; each key's mark is
        // left.
        let left = d.state.size_bytes();
        assert!(left < held / 4, "{left} of {held}");
        assert_eq!(left, d.state.counted_bytes().expect("count"));
    }
}
