//! Session windows (Flink's merging windows): `GROUP BY k, SESSION(ts,
//! gap)`, the `SESSION(TABLE t PARTITION BY k, DESCRIPTOR(ts), gap)` TVF
//! under a window aggregate grouped by its partition, and the TVF on its
//! own (each row with its session's bounds).
//!
//! Per key, in arrival order, as Flink's `MergingWindowSet`:
//! - a row opens the window `[ts, ts + gap)`;
//! - it merges with every open session of its key it intersects (Flink's
//!   `TimeWindow.intersects`: `start <= other.end && end >= other.start`,
//!   so a row at exactly `last + gap` still joins the session `[.., last +
//!   gap)` while that has not fired), into one session over all of them;
//! - a window that merges with nothing and whose last millisecond (`ts +
//!   gap - 1`) the watermark has reached is late: the row is dropped and
//!   counted. A row older than the watermark that merges into an open
//!   session is not late (the merged session ends after the watermark).
//!
//! A session fires when the watermark reaches its last millisecond (`end -
//! 1`): its result (an aggregate) or its rows (the TVF) are emitted once,
//! insert-only, with `window_start`, `window_end` and `window_time = end -
//! 1` (a time attribute), and its state is freed. A row of the same key
//! after that opens a new session.
//!
//! State, through the keyed-state layer:
//! - `session-windows` (value): key → the key's open sessions, each
//!   `start, end` and its payload: the aggregates' accumulator states in
//!   Weir's row encoding, or the TVF's rows;
//! - `session-timers` (timers): one per session at `end - 1`; a merge that
//!   moves a session's end moves its timer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, TimestampMillisecondArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use datafusion::logical_expr::EmitTo;
use datafusion::physical_expr::PhysicalExpr;
use hashbrown::{HashMap, HashSet};

use super::aggregate::{Aggs, WindowOutput};
use super::is_fired;
use crate::canonical::canonical_exprs;
use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::{KeyEncoder, KeyGroup};
use crate::message::{MIN_WATERMARK, Timestamp};
use crate::operators::build::BuildCtx;
use crate::operators::calc::batch_with_schema;
use crate::operators::{Collector, Operator};
use crate::plan::{ChangelogMode, PlanNode, StateKeys, StreamNode, WindowKind, WindowSpec};
use crate::plan::{GroupOutput, SessionWindowNode, WindowAggregateNode};
use crate::runtime::metrics::NodeMetrics;
use crate::state::codec::{RowCodec, RowList};
use crate::state::{EntryRef, KeyedState, KeyedWrite, StateDecl, StateKind, Timer};

const SESSIONS: usize = 0;
const TIMERS: usize = 1;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[
    StateDecl {
        name: "session-windows",
        kind: StateKind::Value,
        ttl: false,
    },
    StateDecl {
        name: "session-timers",
        kind: StateKind::Timers,
        ttl: false,
    },
];

/// Timers fired per state round trip.
const FIRE_CHUNK: usize = 4096;

/// What a session holds.
enum Payload {
    /// A window aggregate grouped by the sessions' key: accumulator
    /// states; output rows laid out by `group_outputs`.
    Aggregate {
        aggs: Aggs,
        group_outputs: Vec<GroupOutput>,
    },
    /// The SESSION TVF on its own: the session's input rows (`codec`),
    /// emitted with the window columns appended.
    Rows { codec: RowCodec },
}

/// One open session of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Session {
    start: i64,
    end: i64,
    payload: Vec<u8>,
}

/// A key's sessions as one value: per session `start`, `end` (8 bytes
/// each, big-endian) and its payload, each framed by its length.
fn encode_sessions(sessions: &[Session]) -> Vec<u8> {
    let records: Vec<Vec<u8>> = sessions
        .iter()
        .map(|s| {
            let mut r = Vec::with_capacity(16 + s.payload.len());
            r.extend_from_slice(&s.start.to_be_bytes());
            r.extend_from_slice(&s.end.to_be_bytes());
            r.extend_from_slice(&s.payload);
            r
        })
        .collect();
    RowList::encode(records.iter().map(Vec::as_slice))
}

fn decode_sessions(bytes: &[u8]) -> Result<Vec<Session>> {
    let corrupt = || StateError::Corrupt {
        state: STATES[SESSIONS].name.into(),
        message: format!("a key's sessions ({} bytes) are cut short", bytes.len()),
    };
    let records = RowList::decode(bytes).ok_or_else(corrupt)?;
    records
        .into_iter()
        .map(|r| {
            let start = r.get(0..8).and_then(|b| b.try_into().ok()).map(i64::from_be_bytes);
            let end = r.get(8..16).and_then(|b| b.try_into().ok()).map(i64::from_be_bytes);
            match (start, end) {
                (Some(start), Some(end)) => Ok(Session {
                    start,
                    end,
                    payload: r[16..].to_vec(),
                }),
                _ => Err(corrupt().into()),
            }
        })
        .collect()
}

/// Union-find over the sessions a batch merges: stored sessions first,
/// then each window a row opened.
struct Merges {
    parent: Vec<usize>,
}

impl Merges {
    fn find(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn add(&mut self) -> usize {
        self.parent.push(self.parent.len());
        self.parent.len() - 1
    }
}

/// One key met by a batch.
struct Part {
    first: usize,
    group: KeyGroup,
    rows: Vec<u32>,
}

/// A key's sessions after a batch.
struct Merged {
    /// The sessions stored before the batch.
    stored: Vec<Session>,
    stored_len: Option<usize>,
    /// The key's sessions now: bounds, and which stored sessions (by
    /// index) and rows (by batch row) make each.
    sessions: Vec<(i64, i64, Vec<usize>, Vec<u32>)>,
}

pub struct SessionWindowOperator {
    name: String,
    gap: i64,
    time_column: usize,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    key_encoder: Option<KeyEncoder>,
    payload: Payload,
    schema: SchemaRef,
    state: KeyedState,
    watermark: Timestamp,
    /// Sessions on the wall clock of this zone (a window aggregate's
    /// [`WindowAggregateNode::zone`]): the time column holds wall times,
    /// watermarks are compared on that clock, `window_time` is an instant.
    zone: Option<arrow::array::timezone::Tz>,
    metrics: Arc<NodeMetrics>,
}

impl PlanNode for SessionWindowNode {
    fn describe(&self) -> String {
        let keys: Vec<String> = self.partition.iter().map(|k| k.to_string()).collect();
        format!(
            "SessionWindow: {} partition [{}]{}",
            WindowSpec {
                kind: WindowKind::Session,
                size: self.gap,
                slide: self.gap,
                offset: 0
            },
            keys.join(", "),
            self.zone
                .as_ref()
                .map(|z| format!(" in time zone {}", z.id))
                .unwrap_or_default()
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some(
            "each partition's open sessions (bounds, rows) by key group|partition key; a timer per session at its end - 1, when its rows are emitted and freed"
                .into(),
        )
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "session_window",
            format!(
                "gap={};time={};partition={}",
                self.gap,
                self.time_column,
                canonical_exprs(&self.partition)
            ) + &self
                .zone
                .as_ref()
                .map(|z| format!(";zone={}", z.id))
                .unwrap_or_default(),
        )
    }

    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.partition)
    }

    fn changelog(&self, _: &ChangelogMode) -> ChangelogMode {
        ChangelogMode::insert_only()
    }
}

/// The operator of a SESSION window aggregate's subtask.
pub fn build_aggregate(node: &WindowAggregateNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(SessionWindowOperator::aggregate(
        node,
        &ctx.input_schema()?,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

/// The operator of a SESSION window TVF's subtask (rows with their
/// session's bounds).
pub fn build_rows(node: &SessionWindowNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(SessionWindowOperator::rows(
        node,
        &ctx.input_schema()?,
        ctx.schema(),
        state,
        ctx.metrics.clone(),
    )?))
}

impl SessionWindowOperator {
    /// A session window aggregate (its node's window is a SESSION).
    pub fn aggregate(
        node: &WindowAggregateNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self> {
        Ok(Self {
            name: format!("WindowAggregate {}", node.window),
            gap: node.window.size,
            time_column: node.time_column,
            keys: node.keys.clone(),
            key_encoder: KeyEncoder::for_keys(&node.keys, input_schema)?,
            payload: Payload::Aggregate {
                aggs: Aggs::new(&node.aggregates)?,
                group_outputs: node.group_outputs.clone(),
            },
            schema,
            state,
            watermark: MIN_WATERMARK,
            zone: node.zone.as_ref().map(|z| z.tz),
            metrics,
        })
    }

    /// The SESSION TVF on its own: rows with their session's bounds.
    pub fn rows(
        node: &SessionWindowNode,
        input_schema: &SchemaRef,
        schema: SchemaRef,
        state: KeyedState,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self> {
        let types: Vec<DataType> = input_schema.fields().iter().map(|f| f.data_type().clone()).collect();
        Ok(Self {
            name: format!("SessionWindow (gap {} ms)", node.gap),
            gap: node.gap,
            time_column: node.time_column,
            keys: node.partition.clone(),
            key_encoder: KeyEncoder::for_keys(&node.partition, input_schema)?,
            payload: Payload::Rows {
                codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            },
            schema,
            state,
            watermark: MIN_WATERMARK,
            zone: node.zone.as_ref().map(|z| z.tz),
            metrics,
        })
    }

    fn event_times(&self, batch: &RecordBatch) -> Result<TimestampMillisecondArray> {
        let col = batch.column(self.time_column);
        // The TVF on its own reads the attribute's instants: in a zone, as
        // its wall times (a window aggregate's marker column holds them).
        let col = match (&self.zone, &self.payload) {
            (Some(z), Payload::Rows { .. }) => crate::time_zone::wall_times(col, z)?,
            _ => col.clone(),
        };
        let col = match col.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, None) => col.clone(),
            _ => cast(&col, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        };
        Ok(col.as_primitive::<TimestampMillisecondType>().clone())
    }

    /// Merges a key's rows into its stored sessions, in arrival order.
    /// Returns the key's sessions and the number of late rows.
    fn merge_rows(
        &self,
        stored: Vec<Session>,
        stored_len: Option<usize>,
        rows: &[u32],
        times: &TimestampMillisecondArray,
    ) -> (Merged, u64) {
        let mut merges = Merges {
            parent: (0..stored.len()).collect(),
        };
        // Open sessions: (start, end, class).
        let mut open: Vec<(i64, i64, usize)> = stored.iter().enumerate().map(|(i, s)| (s.start, s.end, i)).collect();
        let mut row_class: Vec<(u32, usize)> = Vec::with_capacity(rows.len());
        let mut late = 0;
        for &row in rows {
            if times.is_null(row as usize) {
                late += 1;
                continue;
            }
            let ts = times.value(row as usize);
            let (mut start, mut end) = (ts, ts.saturating_add(self.gap));
            let mut hits = open
                .iter()
                .enumerate()
                .filter(|(_, (s, e, _))| *s <= end && *e >= start);
            let class = match hits.next() {
                None if is_fired(end, self.watermark) => {
                    late += 1;
                    continue;
                }
                None => {
                    let class = merges.add();
                    open.push((start, end, class));
                    class
                }
                Some((first, _)) => {
                    let hit: Vec<usize> = std::iter::once(first).chain(hits.map(|(i, _)| i)).collect();
                    let root = merges.find(open[first].2);
                    for &h in hit.iter().rev() {
                        let (s, e, c) = open.remove(h);
                        start = start.min(s);
                        end = end.max(e);
                        let c = merges.find(c);
                        merges.parent[c] = root;
                    }
                    open.push((start, end, root));
                    root
                }
            };
            row_class.push((row, class));
        }
        open.sort_by_key(|(s, _, _)| *s);
        let mut sessions: Vec<(i64, i64, Vec<usize>, Vec<u32>)> =
            open.iter().map(|(s, e, _)| (*s, *e, vec![], vec![])).collect();
        let roots: HashMap<usize, usize> = open
            .iter()
            .enumerate()
            .map(|(i, (_, _, c))| (merges.find(*c), i))
            .collect();
        for i in 0..stored.len() {
            let at = roots[&merges.find(i)];
            sessions[at].2.push(i);
        }
        for (row, class) in row_class {
            let at = roots[&merges.find(class)];
            sessions[at].3.push(row);
        }
        (
            Merged {
                stored,
                stored_len,
                sessions,
            },
            late,
        )
    }
}

impl Operator for SessionWindowOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(self.state.snapshot(checkpoint_id)?))
    }

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        let batch = batch.into_inserts(&self.name)?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let times = self.event_times(&batch)?;
        if let Some(max) = times.iter().flatten().max() {
            self.metrics.max_event_time.fetch_max(max, Ordering::Relaxed);
        }
        let keys = KeyEncoder::encode_rows(self.key_encoder.as_ref(), &self.keys, &batch)?;
        let key_of = |i: usize| -> &[u8] { keys.as_ref().map_or(&[], |k| k.row(i)) };

        // Rows by key, in arrival order.
        let mut part_of: HashMap<&[u8], usize> = HashMap::new();
        let mut parts: Vec<Part> = vec![];
        for i in 0..n {
            let k = key_of(i);
            let p = *part_of.entry(k).or_insert_with(|| {
                parts.push(Part {
                    first: i,
                    group: self.state.key_group(k),
                    rows: vec![],
                });
                parts.len() - 1
            });
            parts[p].rows.push(i as u32);
        }
        let refs: Vec<EntryRef> = parts
            .iter()
            .map(|p| EntryRef {
                key_group: p.group,
                key: key_of(p.first),
                namespace: &[],
            })
            .collect();
        let stored = self.state.get(SESSIONS, &refs)?;
        let mut late = 0u64;
        let mut merged = Vec::with_capacity(parts.len());
        for (part, value) in parts.iter().zip(stored) {
            let (sessions, len) = match value {
                Some(v) => (decode_sessions(&v)?, Some(v.len())),
                None => (vec![], None),
            };
            let (m, l) = self.merge_rows(sessions, len, &part.rows, &times);
            late += l;
            merged.push(m);
        }
        if late > 0 {
            self.metrics.late_rows_dropped.fetch_add(late, Ordering::Relaxed);
        }

        // The payload of every session the batch changed: a session of
        // several stored ones or with new rows. Others keep their bytes.
        let changed = |s: &(i64, i64, Vec<usize>, Vec<u32>)| s.2.len() != 1 || !s.3.is_empty();
        let mut payloads: Vec<Vec<u8>> = vec![];
        match &self.payload {
            Payload::Aggregate { aggs, .. } => {
                let mut group_of_row = vec![0usize; n];
                let mut live = vec![false; n];
                let mut stored_states: Vec<&[u8]> = vec![];
                let mut stored_groups: Vec<usize> = vec![];
                let mut groups = 0;
                for m in &merged {
                    for s in m.sessions.iter().filter(|s| changed(s)) {
                        for &i in &s.2 {
                            stored_states.push(&m.stored[i].payload);
                            stored_groups.push(groups);
                        }
                        for &r in &s.3 {
                            group_of_row[r as usize] = groups;
                            live[r as usize] = true;
                        }
                        groups += 1;
                    }
                }
                if groups > 0 {
                    let mut accs = aggs.accumulators()?;
                    aggs.merge_stored(&mut accs, &stored_states, &stored_groups, groups)?;
                    let values = aggs.evaluate(&batch)?;
                    let filter = live.iter().any(|l| !l).then(|| BooleanArray::from(live.clone()));
                    for (acc, v) in accs.iter_mut().zip(&values) {
                        acc.update_batch(v, &group_of_row, filter.as_ref(), groups)?;
                    }
                    payloads = aggs.encode_states(&mut accs)?;
                }
            }
            Payload::Rows { codec } => {
                let any_rows = merged.iter().any(|m| m.sessions.iter().any(|s| !s.3.is_empty()));
                let encoded = if any_rows {
                    Some(codec.encode(batch.columns())?)
                } else {
                    None
                };
                for m in &merged {
                    for s in m.sessions.iter().filter(|s| changed(s)) {
                        let mut rows: Vec<&[u8]> = vec![];
                        for &i in &s.2 {
                            rows.extend(
                                RowList::decode(&m.stored[i].payload).ok_or_else(|| StateError::Corrupt {
                                    state: STATES[SESSIONS].name.into(),
                                    message: "a session's rows are cut short".into(),
                                })?,
                            );
                        }
                        if let Some(e) = &encoded {
                            rows.extend(s.3.iter().map(|r| e.row(*r as usize)));
                        }
                        payloads.push(RowList::encode(rows.into_iter()));
                    }
                }
            }
        }

        let mut payloads = payloads.into_iter();
        let mut w = KeyedWrite::default();
        for ((m, part), e) in merged.into_iter().zip(&parts).zip(&refs) {
            if !m.sessions.iter().any(changed) {
                continue;
            }
            let stored_ends: HashSet<i64> = m.stored.iter().map(|s| s.end).collect();
            let ends: HashSet<i64> = m.sessions.iter().map(|s| s.1).collect();
            for s in &m.stored {
                if !ends.contains(&s.end) {
                    w.delete_timer(
                        TIMERS,
                        &Timer {
                            key_group: part.group,
                            time: s.end.saturating_sub(1),
                            key: e.key.to_vec(),
                            namespace: vec![],
                        },
                    );
                }
            }
            let mut sessions = Vec::with_capacity(m.sessions.len());
            for s in &m.sessions {
                if !stored_ends.contains(&s.1) {
                    w.add_timer(TIMERS, part.group, s.1.saturating_sub(1), e.key, &[]);
                }
                let payload = if changed(s) {
                    payloads
                        .next()
                        .ok_or_else(|| ExecError::internal("a session without its payload"))?
                } else {
                    m.stored[s.2[0]].payload.clone()
                };
                sessions.push(Session {
                    start: s.0,
                    end: s.1,
                    payload,
                });
            }
            let value = encode_sessions(&sessions);
            w.put(SESSIONS, *e, m.stored_len, value);
        }
        self.state.write(w)?;
        Ok(())
    }

    fn on_watermark(&mut self, watermark: Timestamp, out: &mut Collector) -> Result<()> {
        // Wall-clock sessions complete on the wall clock.
        let watermark = crate::time_zone::watermark_in(watermark, self.zone.as_ref());
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        loop {
            let mut due: Vec<Timer> = self.state.due_timers(TIMERS, watermark, FIRE_CHUNK)?;
            if due.is_empty() {
                return Ok(());
            }
            let more = due.len() == FIRE_CHUNK;
            due.sort_by_key(|t| t.time);
            // A key's due sessions fire together, at its first due timer.
            let mut seen: HashSet<(KeyGroup, &[u8])> = HashSet::new();
            let keys: Vec<&Timer> = due.iter().filter(|t| seen.insert((t.key_group, &t.key))).collect();
            let refs: Vec<EntryRef> = keys
                .iter()
                .map(|t| EntryRef {
                    key_group: t.key_group,
                    key: &t.key,
                    namespace: &[],
                })
                .collect();
            let values = self.state.get(SESSIONS, &refs)?;
            let mut w = KeyedWrite::default();
            for t in &due {
                w.delete_timer(TIMERS, t);
            }
            // (end, start, key, payload) of every fired session.
            let mut fired: Vec<(i64, i64, &[u8], Vec<u8>)> = vec![];
            for (e, value) in refs.iter().zip(values) {
                let Some(value) = value else { continue };
                let sessions = decode_sessions(&value)?;
                let (now, rest): (Vec<Session>, Vec<Session>) =
                    sessions.into_iter().partition(|s| is_fired(s.end, watermark));
                if now.is_empty() {
                    continue;
                }
                if rest.is_empty() {
                    w.delete(SESSIONS, *e, Some(value.len()));
                } else {
                    w.put(SESSIONS, *e, Some(value.len()), encode_sessions(&rest));
                }
                fired.extend(now.into_iter().map(|s| (s.end, s.start, e.key, s.payload)));
            }
            self.state.write(w)?;
            // Earlier sessions first, as Flink's timers fire.
            fired.sort_by_key(|f| f.0);
            if !fired.is_empty() {
                out.emit(self.output(&fired)?);
            }
            if !more {
                return Ok(());
            }
        }
    }
}

impl SessionWindowOperator {
    /// The output rows of fired sessions `(end, start, key, payload)`.
    fn output(&self, fired: &[(i64, i64, &[u8], Vec<u8>)]) -> Result<RecordBatch> {
        match &self.payload {
            Payload::Aggregate { aggs, group_outputs } => {
                let mut accs = aggs.accumulators()?;
                let states: Vec<&[u8]> = fired.iter().map(|f| f.3.as_slice()).collect();
                let groups: Vec<usize> = (0..fired.len()).collect();
                aggs.merge_stored(&mut accs, &states, &groups, fired.len())?;
                let columns = accs
                    .iter_mut()
                    .map(|a| a.evaluate(EmitTo::All))
                    .collect::<Result<Vec<ArrayRef>, _>>()?;
                let starts: Vec<i64> = fired.iter().map(|f| f.1).collect();
                let ends: Vec<i64> = fired.iter().map(|f| f.0).collect();
                WindowOutput {
                    schema: &self.schema,
                    group_outputs,
                    key_encoder: self.key_encoder.as_ref(),
                    zone: self.zone.as_ref(),
                }
                .batch(&starts, &ends, fired.iter().map(|f| f.2), columns)
            }
            Payload::Rows { codec } => {
                let mut rows: Vec<&[u8]> = vec![];
                let (mut starts, mut ends) = (vec![], vec![]);
                for (end, start, _, payload) in fired {
                    let r = RowList::decode(payload).ok_or_else(|| StateError::Corrupt {
                        state: STATES[SESSIONS].name.into(),
                        message: "a session's rows are cut short".into(),
                    })?;
                    starts.extend(std::iter::repeat_n(*start, r.len()));
                    ends.extend(std::iter::repeat_n(*end, r.len()));
                    rows.extend(r);
                }
                let mut columns = codec.decode(rows)?;
                let ts = |v: Vec<i64>| -> ArrayRef { Arc::new(TimestampMillisecondArray::from(v)) };
                // A wall time that happens twice: its second instant, when
                // the session is complete.
                let times: Vec<i64> = ends
                    .iter()
                    .map(|e| {
                        let last = e.saturating_sub(1);
                        match &self.zone {
                            Some(z) => crate::time_zone::from_local(last, 1000, z, crate::time_zone::Resolve::Later)
                                .unwrap_or(last),
                            None => last,
                        }
                    })
                    .collect();
                columns.extend([ts(starts), ts(ends), ts(times)]);
                batch_with_schema(&self.schema, columns)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::HeapBackend;
    use arrow::array::StringArray;
    use arrow::datatypes::{Field, Schema};
    use datafusion::physical_expr::expressions::Column;

    /// The SESSION TVF on its own over `(k, ts)`, gap 300 ms.
    fn sessions() -> SessionWindowOperator {
        let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
        let input = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("ts", ts.clone(), true),
        ]));
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        for name in ["window_start", "window_end", "window_time"] {
            fields.push(Field::new(name, ts.clone(), false));
        }
        let node = SessionWindowNode {
            gap: 300,
            time_column: 1,
            partition: vec![Arc::new(Column::new("k", 0))],
            zone: None,
        };
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        let metrics = Arc::new(NodeMetrics::new("sessions".into()));
        SessionWindowOperator::rows(&node, &input, Arc::new(Schema::new(fields)), state, metrics).expect("sessions")
    }

    fn feed(op: &mut SessionWindowOperator, rows: &[(&str, i64)], out: &mut Collector) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
                Arc::new(TimestampMillisecondArray::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
            ],
        )
        .expect("rows");
        op.process_batch(ChangeBatch::from(batch), out).expect("process");
    }

    /// A long run with the watermark advancing: sessions end and are
    /// freed, so state stays flat (not growing with the input), every row
    /// is emitted once, and the end of input frees all.
    #[test]
    fn state_stays_bounded_as_the_watermark_advances() {
        let mut op = sessions();
        let mut out = Collector::default();
        let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let (mut emitted, mut peak_late, mut at_round_5) = (0, 0, 0);
        for round in 0..60i64 {
            let base = round * 1000;
            // Each key's rows every 80 ms within half of a round: a session
            // per key and round, ended by the other half's silence.
            let rows: Vec<(&str, i64)> = (0..50).map(|i| (keys[i % 8], base + i as i64 * 10)).collect();
            feed(&mut op, &rows, &mut out);
            op.on_watermark(base - 200, &mut out).expect("watermark");
            emitted += out.take().iter().map(|b| b.num_rows()).sum::<usize>();
            let bytes = op.state.size_bytes();
            assert_eq!(bytes, op.state.counted_bytes().expect("count"));
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
        op.on_watermark(crate::message::MAX_WATERMARK, &mut out).expect("end");
        emitted += out.take().iter().map(|b| b.num_rows()).sum::<usize>();
        assert_eq!(op.state.size_bytes(), 0, "state left at the end");
        assert_eq!(op.state.counted_bytes().expect("count"), 0);
        assert_eq!(emitted, 60 * 50, "every row once");
    }

    /// Flink's merge rules, row by row: a row at exactly `last + gap`
    /// joins the open session; a row bridging two sessions merges them;
    /// a late row whose own window touches nothing is dropped, one that
    /// touches an open session is kept.
    #[test]
    fn merges_as_flink() {
        let mut op = sessions();
        let mut out = Collector::default();
        feed(&mut op, &[("a", 0), ("a", 300), ("b", 0), ("b", 1000)], &mut out);
        // b: [0, 300) and [1000, 1300); 600 bridges neither (900 < 1000).
        feed(&mut op, &[("b", 600)], &mut out);
        op.on_watermark(500, &mut out).expect("watermark");
        // b's [0, 300) fired at 299; a's [0, 600) has not (599 > 500).
        let fired: Vec<_> = out.take();
        assert_eq!(fired.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
        // a: 100 is before the watermark but touches [0, 600): kept. b: 50
        // touches nothing open ([50, 350) fired): late.
        feed(&mut op, &[("a", 100), ("b", 50), ("b", 700)], &mut out);
        assert_eq!(op.metrics.late_rows_dropped.load(Ordering::Relaxed), 1);
        // b's 700 ([700, 1000)) bridges [600, 900) and [1000, 1300).
        op.on_watermark(crate::message::MAX_WATERMARK, &mut out).expect("end");
        let mut got: Vec<String> = vec![];
        for b in out.take() {
            let b = b.into_inserts("test").expect("inserts");
            let k = b.column(0).as_string::<i32>();
            let start = b.column(2).as_primitive::<TimestampMillisecondType>();
            let end = b.column(3).as_primitive::<TimestampMillisecondType>();
            for i in 0..b.num_rows() {
                got.push(format!("{} {}-{}", k.value(i), start.value(i), end.value(i)));
            }
        }
        got.sort();
        assert_eq!(
            got,
            [
                "a 0-600",
                "a 0-600",
                "a 0-600",
                "b 600-1300",
                "b 600-1300",
                "b 600-1300"
            ]
        );
    }

    #[test]
    fn sessions_round_trip_and_corruption_is_named() {
        let s = vec![
            Session {
                start: -5,
                end: 10,
                payload: vec![1, 2, 3],
            },
            Session {
                start: 20,
                end: 30,
                payload: vec![],
            },
        ];
        let bytes = encode_sessions(&s);
        assert_eq!(decode_sessions(&bytes).expect("decode"), s);
        let err = decode_sessions(&bytes[..bytes.len() - 1]).expect_err("cut short");
        assert!(err.to_string().contains("session-windows"), "{err}");
    }
}
