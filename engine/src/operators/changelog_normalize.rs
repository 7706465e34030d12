//! The changelog normalizer behind an upsert source (Flink's
//! `ChangelogNormalize` over `upsert-kafka`): an upsert stream says only
//! "this is now the row of key k" (`+U`) or "key k is gone" (`-D`, whose
//! other columns are unknown). Operators downstream need the changes
//! that retract what they took before, so per key it keeps the last row
//! and emits, as Flink's `ProcTimeDeduplicateKeepLastRowFunction` on a
//! changelog does:
//!
//! - `+I`/`+U` for a key without a row: `+I[row]`;
//! - `+I`/`+U` for a key with one: `-U[previous]`, `+U[row]`; nothing when
//!   the row equals the previous one (only without state TTL, as Flink: a
//!   TTL may have dropped the key downstream, so the row is sent again);
//! - `-D`/`-U` for a key with a row: `-D[previous]` (whole, not the
//!   tombstone's key-only row); for a key without one: nothing.
//!
//! Its output is a full changelog whose upsert key is the PRIMARY KEY.
//!
//! State, through the keyed-state layer: `changelog-normalize-rows` (value
//! per key: the key's last row; TTL'd with `table.exec.state.ttl`).

use std::sync::Arc;

use datafusion::physical_expr::PhysicalExpr;

use crate::canonical::canonical_exprs;
use crate::change::{ChangeBatch, RowKind};
use crate::checkpoint::OperatorSnapshot;
use crate::error::{ExecError, Result};
use crate::keygroup::KeyEncoder;
use crate::operators::build::BuildCtx;
use crate::operators::{Collector, Operator, ValueChange, batch_keys, emit_rows, write_values};
use crate::plan::{ChangelogMode, ChangelogNormalizeNode, PlanNode, StateKeys, StreamNode, column_indexes};
use crate::state::codec::RowCodec;
use crate::state::{KeyedState, StateDecl, StateKind};
use arrow::datatypes::SchemaRef;

const ROWS: usize = 0;
/// The operator's states; their names are part of savepoints.
pub const STATES: &[StateDecl] = &[StateDecl {
    name: "changelog-normalize-rows",
    kind: StateKind::Value,
    ttl: true,
}];

pub struct ChangelogNormalizeOperator {
    key: Vec<Arc<dyn PhysicalExpr>>,
    key_encoder: KeyEncoder,
    codec: RowCodec,
    schema: SchemaRef,
    state: KeyedState,
}

/// A key of the batch: its row as the batch's rows change it.
struct Slot {
    row: Option<Vec<u8>>,
    stored_len: Option<usize>,
    changed: bool,
}

impl PlanNode for ChangelogNormalizeNode {
    fn describe(&self) -> String {
        format!(
            "ChangelogNormalize: by [{}]",
            self.key.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", ")
        )
    }

    fn explain_state(&self) -> Option<String> {
        Some("the last row of each key by key group|key".into())
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        ("changelog_normalize", format!("key={}", canonical_exprs(&self.key)))
    }

    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::Keyed(&self.key)
    }

    fn changelog(&self, _: &ChangelogMode) -> ChangelogMode {
        ChangelogMode {
            updates: true,
            deletes: true,
            upsert_key: column_indexes(&self.key),
            no_update_before: false,
        }
    }
}

/// The operator of a changelog normalizer's subtask.
pub fn build(node: &crate::plan::ChangelogNormalizeNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    let state = ctx.keyed_state(STATES)?;
    Ok(Box::new(ChangelogNormalizeOperator::new(
        &node.key,
        ctx.schema(),
        state,
    )?))
}

impl ChangelogNormalizeOperator {
    pub fn new(key: &[Arc<dyn PhysicalExpr>], schema: SchemaRef, state: KeyedState) -> Result<Self> {
        let types: Vec<_> = schema.fields().iter().map(|f| f.data_type().clone()).collect();
        let key_encoder = KeyEncoder::for_keys(key, &schema)?
            .ok_or_else(|| ExecError::internal("a changelog normalizer without a key"))?;
        Ok(Self {
            key: key.to_vec(),
            key_encoder,
            codec: RowCodec::new(&types).map_err(ExecError::internal)?,
            schema,
            state,
        })
    }
}

impl Operator for ChangelogNormalizeOperator {
    fn name(&self) -> &str {
        "ChangelogNormalize"
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

    // Watermarks pass through (the default): the normalizer holds no rows
    // back, so it moves no row past a watermark.
    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let keys = self
            .key
            .iter()
            .map(|k| k.evaluate(&batch.rows).and_then(|v| v.into_array(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = self.key_encoder.encode(&keys)?;
        let rows = self.codec.encode(batch.rows.columns())?;

        let (refs, of_row) = batch_keys(&keys, &self.state);
        let mut slots: Vec<Slot> = self
            .state
            .get(ROWS, &refs)?
            .into_iter()
            .map(|stored| Slot {
                stored_len: stored.as_ref().map(Vec::len),
                row: stored,
                changed: false,
            })
            .collect();

        // Equal rows are dropped only when no TTL can have expired the
        // key downstream (Flink's rule).
        let drop_equal = !self.state.ttl_enabled();
        let mut emitted: Vec<(RowKind, Vec<u8>)> = vec![];
        for (i, &s) in of_row.iter().enumerate() {
            let slot = &mut slots[s];
            let row = rows.row(i);
            if batch.kind(i).is_accumulate() {
                match slot.row.take() {
                    None => emitted.push((RowKind::Insert, row.to_vec())),
                    Some(previous) if drop_equal && previous == row => {
                        slot.row = Some(previous);
                        continue;
                    }
                    Some(previous) => {
                        emitted.push((RowKind::UpdateBefore, previous));
                        emitted.push((RowKind::UpdateAfter, row.to_vec()));
                    }
                }
                slot.row = Some(row.to_vec());
            } else {
                let Some(previous) = slot.row.take() else {
                    // A delete of a key never seen (or expired): nothing.
                    continue;
                };
                emitted.push((RowKind::Delete, previous));
            }
            slot.changed = true;
        }
        let changes = slots.iter().enumerate().filter(|(_, s)| s.changed).map(|(i, s)| {
            (
                i,
                ValueChange {
                    stored_len: s.stored_len,
                    value: s.row.as_deref(),
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
    use arrow::array::{Array, AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use arrow::record_batch::RecordBatch;
    use datafusion::physical_expr::expressions::Column;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]))
    }

    fn normalizer() -> ChangelogNormalizeOperator {
        let state = KeyedState::new(Box::new(HeapBackend::new(STATES.len())), STATES, 0..128, 128);
        ChangelogNormalizeOperator::new(&[Arc::new(Column::new("id", 0))], schema(), state).expect("normalizer")
    }

    fn changes(rows: &[(&str, i64, Option<&str>)]) -> ChangeBatch {
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
            ],
        )
        .expect("batch");
        let kinds = rows
            .iter()
            .map(|r| RowKind::from_short(r.0).expect("a row kind"))
            .collect();
        ChangeBatch::new(batch, kinds)
    }

    fn run(op: &mut ChangelogNormalizeOperator, batch: ChangeBatch) -> Vec<String> {
        let mut out = Collector::default();
        op.process_batch(batch, &mut out).expect("processed");
        out.take()
            .iter()
            .flat_map(|b| {
                (0..b.num_rows()).map(move |i| {
                    let id = b.rows.column(0).as_primitive::<Int64Type>().value(i);
                    let name = b.rows.column(1).as_string::<i32>();
                    let name = if name.is_null(i) { "null" } else { name.value(i) };
                    format!("{}[{id}, {name}]", b.kind(i).short())
                })
            })
            .collect()
    }

    #[test]
    fn upserts_become_inserts_and_updates_and_tombstones_whole_deletes() {
        let mut op = normalizer();
        let out = run(
            &mut op,
            changes(&[
                ("+U", 1, Some("a")),
                ("+U", 2, Some("x")),
                ("+U", 1, Some("b")),
                // The same row again: no change.
                ("+U", 1, Some("b")),
                // A tombstone knows only its key.
                ("-D", 1, None),
                // A tombstone of a key never seen: nothing.
                ("-D", 3, None),
            ]),
        );
        assert_eq!(out, ["+I[1, a]", "+I[2, x]", "-U[1, a]", "+U[1, b]", "-D[1, b]"]);
        // Across batches, from state: key 1 starts over, key 2 updates.
        let out = run(&mut op, changes(&[("+U", 1, Some("c")), ("+U", 2, Some("y"))]));
        assert_eq!(out, ["+I[1, c]", "-U[2, x]", "+U[2, y]"]);
        let out = run(&mut op, changes(&[("-D", 2, None), ("-D", 2, None)]));
        assert_eq!(out, ["-D[2, y]"]);
    }
}
