//! The sink's upsert materializer (`INSERT ... ON CONFLICT DO DEDUPLICATE`,
//! Flink's `SinkUpsertMaterializer`): put in front of an upsert sink whose
//! PRIMARY KEY is not the query's upsert key, so several live rows of the
//! query can share one sink key. Per sink key it keeps the live rows in
//! arrival order, and the sink sees the latest one:
//!
//! - `+I`/`+U`: the row replaces the entry of the same upsert key (rows are
//!   compared whole when the query has none) or is appended; emitted `+I`
//!   when the key held no row, `+U` otherwise;
//! - `-U`/`-D`: the first equal entry is removed; the key's last row gone
//!   is `-D` (with the retracted row's values), the latest entry removed
//!   makes the one before it current (`+U`), any other removal emits
//!   nothing. A retraction matching no entry (its state expired) is
//!   dropped, as Flink drops it.
//!
//! Its output has no `-U`: `+I`, `+U`, `-D` by the sink's key.
//!
//! State, through the keyed-state layer: `upsert-materialize-rows` (value
//! per sink key: each entry's upsert-key bytes — none without an upsert
//! key — and row bytes, each behind a varint length; TTL'd with
//! `table.exec.state.ttl` as in Flink).

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;

use crate::canonical::canonical_exprs;
use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result, StateError};
use crate::keygroup::KeyEncoder;
use crate::operators::build::BuildCtx;
use crate::operators::{Collector, Operator, ValueChange, batch_keys, emit_rows, write_values};
use crate::plan::{ChangelogMode, PlanNode, StateKeys, StreamNode, UpsertMaterializeNode, column_indexes};
use crate::state::codec::{RowCodec, append_counts, decode_counts_prefix};
use crate::state::{KeyedState, StateDecl, StateKind};

const ROWS: usize = 0;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[StateDecl {
    name: "upsert-materialize-rows",
    kind: StateKind::Value,
    ttl: true,
}];

pub struct UpsertMaterializeOperator {
    key: Vec<Arc<dyn PhysicalExpr>>,
    key_encoder: KeyEncoder,
    /// The input's upsert key columns; `None`: entries compared whole.
    upsert_key: Option<Vec<usize>>,
    upsert_codec: Option<RowCodec>,
    codec: RowCodec,
    schema: SchemaRef,
    state: KeyedState,
}

/// One live row of a sink key: what identifies it (its upsert key's
/// bytes; empty without an upsert key, where the row is its own identity,
/// so it is not stored twice), and its bytes.
#[derive(Clone)]
struct Entry {
    id: Vec<u8>,
    row: Vec<u8>,
}

impl Entry {
    /// What identifies the entry: the upsert key's bytes, or the row.
    fn identity(&self) -> &[u8] {
        if self.id.is_empty() { &self.row } else { &self.id }
    }
}

/// A sink key of the batch: its entries as the batch's rows change them.
struct Slot {
    entries: Vec<Entry>,
    stored_len: Option<usize>,
    changed: bool,
}

impl PlanNode for UpsertMaterializeNode {
    fn describe(&self) -> String {
        format!(
            "UpsertMaterialize: by [{}] ({})",
            self.key.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", "),
            match &self.upsert_key {
                Some(k) => format!(
                    "entries by upsert key [{}]",
                    k.iter().map(|c| format!("${c}")).collect::<Vec<_>>().join(", ")
                ),
                None => "entries by whole row".into(),
            }
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some("the live rows of each sink key by key group|sink key, in arrival order".into())
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "upsert_materialize",
            format!("key={};upsert={:?}", canonical_exprs(&self.key), self.upsert_key),
        )
    }

    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.key)
    }

    // `+I`, `+U`, `-D` by the sink's key.
    fn changelog(&self, _: &ChangelogMode) -> ChangelogMode {
        ChangelogMode {
            updates: true,
            deletes: true,
            upsert_key: column_indexes(&self.key),
            no_update_before: true,
        }
    }
}

/// The operator of an upsert materializer's subtask.
pub fn build(node: &crate::plan::UpsertMaterializeNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(UpsertMaterializeOperator::new(
        &node.key,
        node.upsert_key.clone(),
        ctx.schema(),
        state,
    )?))
}

impl UpsertMaterializeOperator {
    pub fn new(
        key: &[Arc<dyn PhysicalExpr>],
        upsert_key: Option<Vec<usize>>,
        schema: SchemaRef,
        state: KeyedState,
    ) -> Result<Self> {
        let types: Vec<_> = schema.fields().iter().map(|f| f.data_type().clone()).collect();
        let key_encoder = KeyEncoder::for_keys(key, &schema)?
            .ok_or_else(|| ExecError::internal("an upsert materializer without a sink key"))?;
        let upsert_codec = match &upsert_key {
            Some(cols) => Some(
                RowCodec::new(&cols.iter().map(|c| types[*c].clone()).collect::<Vec<_>>())
                    .map_err(ExecError::internal)?,
            ),
            None => None,
        };
        Ok(Self {
            key: key.to_vec(),
            key_encoder,
            upsert_key,
            upsert_codec,
            codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            schema,
            state,
        })
    }
}

fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.iter().map(|e| e.id.len() + e.row.len() + 4).sum());
    for e in entries {
        append_counts(&mut out, &[e.id.len() as i64]);
        out.extend_from_slice(&e.id);
        append_counts(&mut out, &[e.row.len() as i64]);
        out.extend_from_slice(&e.row);
    }
    out
}

fn decode_entries(mut v: &[u8]) -> Result<Vec<Entry>> {
    let corrupt = || StateError::Corrupt {
        state: STATES[ROWS].name.into(),
        message: "an entry's length runs past its value".into(),
    };
    let take = |v: &mut &[u8]| -> Result<Vec<u8>> {
        let mut len = [0i64];
        let at = decode_counts_prefix(v, &mut len).ok_or_else(corrupt)?;
        let end = usize::try_from(len[0])
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|end| *end <= v.len())
            .ok_or_else(corrupt)?;
        let bytes = v[at..end].to_vec();
        *v = &v[end..];
        Ok(bytes)
    };
    let mut entries = vec![];
    while !v.is_empty() {
        let id = take(&mut v)?;
        let row = take(&mut v)?;
        entries.push(Entry { id, row });
    }
    Ok(entries)
}

impl Operator for UpsertMaterializeOperator {
    fn name(&self) -> &str {
        "UpsertMaterialize"
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
        let rows_batch = &batch.rows;
        let keys = self
            .key
            .iter()
            .map(|k| k.evaluate(rows_batch).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = self.key_encoder.encode(&keys)?;
        let rows = self.codec.encode(rows_batch.columns())?;
        let ids = match (&self.upsert_key, &self.upsert_codec) {
            (Some(cols), Some(codec)) => {
                let columns: Vec<ArrayRef> = cols.iter().map(|c| rows_batch.column(*c).clone()).collect();
                Some(codec.encode(&columns)?)
            }
            _ => None,
        };
        // Without an upsert key an entry is its whole row.
        let id_of = |i: usize| -> &[u8] { ids.as_ref().map_or_else(|| rows.row(i), |r| r.row(i)) };
        let stored_id = |i: usize| -> Vec<u8> { ids.as_ref().map_or_else(Vec::new, |r| r.row(i).to_vec()) };

        let (refs, row_slot) = batch_keys(&keys, &self.state);
        let mut slots: Vec<Slot> = vec![];
        for stored in self.state.get(ROWS, &refs)? {
            slots.push(Slot {
                stored_len: stored.as_ref().map(Vec::len),
                entries: stored.as_deref().map(decode_entries).transpose()?.unwrap_or_default(),
                changed: false,
            });
        }

        // The output, in input order: each row's bytes and kind.
        let mut emitted: Vec<(RowKind, Vec<u8>)> = vec![];
        let mut dropped = 0u64;
        for (i, &s) in row_slot.iter().enumerate() {
            let slot = &mut slots[s];
            let id = id_of(i);
            let find = |entries: &[Entry]| entries.iter().position(|e| e.identity() == id);
            if batch.kind(i).is_accumulate() {
                let kind = if slot.entries.is_empty() {
                    RowKind::Insert
                } else {
                    RowKind::UpdateAfter
                };
                let entry = Entry {
                    id: stored_id(i),
                    row: rows.row(i).to_vec(),
                };
                // Without an upsert key every row is a new entry.
                match self.upsert_key.as_ref().and_then(|_| find(&slot.entries)) {
                    Some(at) => slot.entries[at] = entry,
                    None => slot.entries.push(entry),
                }
                emitted.push((kind, rows.row(i).to_vec()));
            } else {
                let Some(at) = find(&slot.entries) else {
                    dropped += 1;
                    continue;
                };
                let last = slot.entries.len() - 1;
                slot.entries.remove(at);
                match slot.entries.last() {
                    None => emitted.push((RowKind::Delete, rows.row(i).to_vec())),
                    Some(latest) if at == last => emitted.push((RowKind::UpdateAfter, latest.row.clone())),
                    Some(_) => {}
                }
            }
            slot.changed = true;
        }
        if dropped > 0 {
            // Flink logs each: "The state is cleared because of state ttl".
            tracing::info!(
                "upsert materializer: {dropped} retraction(s) matched no stored row (state expired by \
                 'table.exec.state.ttl'?); dropped"
            );
        }

        let values: Vec<Option<Vec<u8>>> = slots
            .iter()
            .map(|s| (s.changed && !s.entries.is_empty()).then(|| encode_entries(&s.entries)))
            .collect();
        let changes = slots.iter().enumerate().filter(|(_, s)| s.changed).map(|(i, s)| {
            (
                i,
                ValueChange {
                    stored_len: s.stored_len,
                    value: values[i].as_deref(),
                },
            )
        });
        write_values(&mut self.state, ROWS, &refs, changes)?;
        emit_rows(&self.codec, &self.schema, &emitted, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::HeapBackend;
    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use arrow::record_batch::RecordBatch;
    use datafusion::physical_expr::expressions::Column;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("c", DataType::Utf8, true),
            Field::new("total", DataType::Int64, true),
        ]))
    }

    /// Keyed by `total`; the upsert key is `c` (or none).
    fn materializer(upsert_key: Option<Vec<usize>>) -> UpsertMaterializeOperator {
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        UpsertMaterializeOperator::new(&[Arc::new(Column::new("total", 1))], upsert_key, schema(), state)
            .expect("operator")
    }

    fn changes(rows: &[(&str, &str, i64)]) -> ChangeBatch {
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
            ],
        )
        .expect("batch");
        let kinds = rows.iter().map(|r| RowKind::from_short(r.0).expect("kind")).collect();
        ChangeBatch::new(batch, kinds)
    }

    fn run(op: &mut UpsertMaterializeOperator, batches: &[ChangeBatch]) -> Vec<String> {
        let mut out = Collector::default();
        for b in batches {
            op.process_batch(b.clone(), &mut out).expect("process");
        }
        let mut lines = vec![];
        for b in out.take() {
            let c = b.rows.column(0).as_string::<i32>();
            let t = b.rows.column(1).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                lines.push(format!("{}[{}, {}]", b.kind(i).short(), c.value(i), t.value(i)));
            }
        }
        lines
    }

    /// Flink 2.3's output for `SELECT c, SUM(v) ... GROUP BY c` into a
    /// print sink keyed by the sum, `ON CONFLICT DO DEDUPLICATE` (the same
    /// changes, recorded from Flink): a removal that is not the latest
    /// entry emits nothing, the latest removed brings back the one before.
    #[test]
    fn flinks_changelog_for_a_sink_keyed_by_the_sum() {
        let input = [
            ("+I", "a", 10),
            ("-U", "a", 10),
            ("+U", "a", 30),
            ("+I", "b", 30),
            ("-U", "a", 30),
            ("+U", "a", 35),
            ("-U", "b", 30),
            ("+U", "b", 35),
            ("+I", "c", 35),
            ("-U", "c", 35),
            ("+U", "c", 36),
        ];
        // One row a batch, and all rows in one batch: the same output.
        let expected = [
            "+I[a, 10]",
            "-D[a, 10]",
            "+I[a, 30]",
            "+U[b, 30]",
            "+I[a, 35]",
            "-D[b, 30]",
            "+U[b, 35]",
            "+U[c, 35]",
            "+U[b, 35]",
            "+I[c, 36]",
        ];
        let one_by_one: Vec<ChangeBatch> = input.iter().map(|r| changes(&[*r])).collect();
        assert_eq!(run(&mut materializer(Some(vec![0])), &one_by_one), expected);
        assert_eq!(run(&mut materializer(Some(vec![0])), &[changes(&input)]), expected);
        // Every key's rows retracted: nothing left in state.
        let mut op = materializer(Some(vec![0]));
        run(&mut op, &[changes(&input)]);
        let left = run(
            &mut op,
            &[changes(&[("-U", "a", 35), ("-U", "b", 35), ("-D", "c", 36)])],
        );
        // a is not the latest of 35: nothing; b leaves 35 empty: -D with its values.
        assert_eq!(left, ["-D[b, 35]", "-D[c, 36]"]);
        assert_eq!(op.state.size_bytes(), 0);
        assert_eq!(op.state.counted_bytes().expect("count"), 0);
    }

    /// With an upsert key a `+U` replaces its key's entry; without one the
    /// rows are entries whole, so a second `+I` of the same row is a
    /// second entry, and a retraction removes one copy.
    #[test]
    fn entries_by_upsert_key_or_whole_row() {
        let by_key = run(
            &mut materializer(Some(vec![0])),
            &[changes(&[("+I", "a", 1), ("+U", "a", 1), ("-U", "a", 1)])],
        );
        assert_eq!(by_key, ["+I[a, 1]", "+U[a, 1]", "-D[a, 1]"]);
        let whole = run(
            &mut materializer(None),
            &[changes(&[
                ("+I", "a", 1),
                ("+I", "a", 1),
                ("-D", "a", 1),
                ("-D", "a", 1),
            ])],
        );
        // The first -D removes the first copy, not the latest: nothing.
        assert_eq!(whole, ["+I[a, 1]", "+U[a, 1]", "-D[a, 1]"]);
    }

    /// A retraction with no stored row (expired) is dropped, not an error.
    #[test]
    fn a_retraction_without_state_is_dropped() {
        let out = run(
            &mut materializer(Some(vec![0])),
            &[changes(&[("-D", "x", 7), ("+I", "y", 7)])],
        );
        assert_eq!(out, ["+I[y, 7]"]);
    }

    #[test]
    fn stored_entries_round_trip_and_corruption_is_an_error() {
        let entries = vec![
            Entry {
                id: b"k".to_vec(),
                row: vec![1; 200],
            },
            Entry {
                id: vec![],
                row: vec![],
            },
        ];
        let v = encode_entries(&entries);
        let back = decode_entries(&v).expect("decode");
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].row, vec![1; 200]);
        // A row whose length runs past the value, an id longer than it.
        assert!(decode_entries(&v[..v.len() - 3]).is_err());
        assert!(decode_entries(&[0x7e]).is_err());
    }
}
