//! A keyed Delta table (`PRIMARY KEY … NOT ENFORCED`): an updating query's
//! changes applied per checkpoint, as Flink's upsert sinks do: `+I`/`+U`
//! write the row of their key, `-D` and `-U` remove it (a `-U` reaches the
//! sink without its `+U` when a filter after an aggregate drops the new
//! row: `HAVING COUNT(*) < 10`).
//!
//! A sink subtask keeps the checkpoint's changes and, per key, which one
//! came last (a key's changes all reach one subtask: the planner routes
//! them by the query's upsert key, which is inside the primary key). At the
//! barrier it writes the rows of the keys whose last change is an upsert
//! as Parquet data files (in no version yet, as in append mode) and every
//! key it touched as a small Parquet *keys file* beside them. When the
//! checkpoint completes, the committer makes **one** Delta commit: the
//! table's files that hold a touched key are removed and written again
//! without those rows (copy-on-write), and the new rows' files are added,
//! with the `txn` action as in append mode.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};

use crate::change::{ChangeBatch, RowKind};
use crate::error::{ExecError, Result};

/// The primary key of a keyed table: its columns' positions in the
/// table's (Delta-typed) schema, and how its values become comparable
/// byte rows.
#[derive(Debug, Clone)]
pub struct TableKey {
    pub columns: Vec<usize>,
    /// The key columns alone (a keys file's schema).
    pub schema: SchemaRef,
}

impl TableKey {
    pub fn new(table_schema: &SchemaRef, names: &[String]) -> std::result::Result<Self, String> {
        let mut columns = vec![];
        for n in names {
            columns.push(
                table_schema
                    .index_of(n)
                    .map_err(|_| format!("primary key column '{n}' is not a column"))?,
            );
        }
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|&i| table_schema.field(i).clone())
                .collect::<Vec<_>>(),
        ));
        Ok(Self { columns, schema })
    }

    pub fn converter(&self) -> Result<RowConverter> {
        Ok(RowConverter::new(
            self.schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?)
    }

    /// The key columns of `batch` (the table's columns).
    pub fn of(&self, batch: &RecordBatch) -> Vec<ArrayRef> {
        self.columns.iter().map(|&i| batch.column(i).clone()).collect()
    }
}

/// A key in the row format of its table's [`TableKey::converter`] (looked
/// up by a row's bytes, with no copy).
pub type KeyBytes = Box<[u8]>;

/// One subtask's changes since the last barrier.
pub struct Upserts {
    key: TableKey,
    converter: RowConverter,
    batches: Vec<RecordBatch>,
    /// Per key: where its last change is (batch, row) and whether it
    /// deletes.
    last: HashMap<KeyBytes, (usize, usize, bool)>,
}

/// What a barrier writes of a subtask's changes.
pub struct Flushed {
    /// The rows of the keys whose last change is an upsert.
    pub rows: Option<RecordBatch>,
    /// Every key changed (the key columns).
    pub keys: Option<RecordBatch>,
}

impl Upserts {
    pub fn new(key: TableKey) -> Result<Self> {
        Ok(Self {
            converter: key.converter()?,
            key,
            batches: vec![],
            last: HashMap::new(),
        })
    }

    /// Takes `batch`'s changes; `rows` are its rows in the table's types.
    pub fn add(&mut self, batch: &ChangeBatch, rows: RecordBatch) -> Result<()> {
        let keys = self.converter.convert_columns(&self.key.of(&rows))?;
        let b = self.batches.len();
        for i in 0..rows.num_rows() {
            // As Flink's upsert sinks: `-U` removes the key's row, as
            // `-D` does; the `+U` after it (if a filter did not drop it)
            // comes later and wins.
            let deletes = match batch.kind(i) {
                RowKind::Insert | RowKind::UpdateAfter => false,
                RowKind::Delete | RowKind::UpdateBefore => true,
            };
            // A key seen before is found by its bytes, without a copy.
            let key = keys.row(i);
            match self.last.get_mut(key.as_ref()) {
                Some(at) => *at = (b, i, deletes),
                None => {
                    self.last.insert(KeyBytes::from(key.as_ref()), (b, i, deletes));
                }
            }
        }
        self.batches.push(rows);
        Ok(())
    }

    /// The changes since the last barrier, and a clean slate.
    pub fn flush(&mut self) -> Result<Flushed> {
        let batches = std::mem::take(&mut self.batches);
        let last = std::mem::take(&mut self.last);
        if last.is_empty() {
            return Ok(Flushed { rows: None, keys: None });
        }
        let mut all: Vec<(usize, usize)> = Vec::with_capacity(last.len());
        let mut upserted: Vec<(usize, usize)> = vec![];
        for (b, i, deletes) in last.into_values() {
            all.push((b, i));
            if !deletes {
                upserted.push((b, i));
            }
        }
        // In arrival order: the files read as the changes came.
        all.sort_unstable();
        upserted.sort_unstable();
        let Some(first) = batches.first() else {
            return Err(ExecError::internal("Delta upserts: a key without its batch"));
        };
        let schema = first.schema();
        let take = |indices: &[(usize, usize)], columns: &[usize], schema: SchemaRef| -> Result<RecordBatch> {
            let mut out = Vec::with_capacity(columns.len());
            for &c in columns {
                let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
                out.push(arrow::compute::interleave(&arrays, indices)?);
            }
            Ok(RecordBatch::try_new(schema, out)?)
        };
        let every: Vec<usize> = (0..schema.fields().len()).collect();
        let rows = if upserted.is_empty() {
            None
        } else {
            Some(take(&upserted, &every, schema.clone())?)
        };
        let keys = take(&all, &self.key.columns, self.key.schema.clone())?;
        Ok(Flushed { rows, keys: Some(keys) })
    }
}

/// The rows of `batch` whose key is not in `touched`.
pub fn keep_untouched(
    batch: &RecordBatch,
    key: &TableKey,
    converter: &RowConverter,
    touched: &std::collections::HashSet<KeyBytes>,
) -> Result<Option<RecordBatch>> {
    let keys = converter.convert_columns(&key.of(batch))?;
    let keep: BooleanArray = (0..batch.num_rows())
        .map(|i| Some(!touched.contains(keys.row(i).as_ref())))
        .collect();
    if keep.true_count() == batch.num_rows() {
        return Ok(None);
    }
    Ok(Some(arrow::compute::filter_record_batch(batch, &keep)?))
}
