//! Change batches: rows with their row kinds (Flink's changelog model).
//!
//! A [`ChangeBatch`] is a `RecordBatch` plus an optional row-kind array
//! beside it. `None` means every row is an insert: append-only paths
//! (sources, projections, window aggregates) carry none and pay nothing.
//! Updating operators (a GROUP BY without a window, joins, Top-N) emit
//! kinds; Calc filters and hash exchanges take them along row by row.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, UInt8Array, UInt32Array};
use arrow::compute::{filter, filter_record_batch, take, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

/// Flink's `RowKind`, with its byte values (`toByteValue`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum RowKind {
    Insert = 0,
    UpdateBefore = 1,
    UpdateAfter = 2,
    Delete = 3,
}

impl RowKind {
    pub const ALL: [RowKind; 4] = [
        RowKind::Insert,
        RowKind::UpdateBefore,
        RowKind::UpdateAfter,
        RowKind::Delete,
    ];

    /// `+I`, `-U`, `+U`, `-D`.
    pub fn short(self) -> &'static str {
        match self {
            RowKind::Insert => "+I",
            RowKind::UpdateBefore => "-U",
            RowKind::UpdateAfter => "+U",
            RowKind::Delete => "-D",
        }
    }

    pub fn from_short(s: &str) -> Option<RowKind> {
        RowKind::ALL.into_iter().find(|k| k.short() == s)
    }

    pub fn from_byte(b: u8) -> Option<RowKind> {
        RowKind::ALL.get(usize::from(b)).copied()
    }

    /// `+I` and `+U` add a row; `-U` and `-D` take one back.
    pub fn is_accumulate(self) -> bool {
        matches!(self, RowKind::Insert | RowKind::UpdateAfter)
    }

    pub fn is_retract(self) -> bool {
        !self.is_accumulate()
    }
}

/// `mask` with NULL as false (arrow's `prep_null_mask_filter` expects
/// nulls to be present).
pub fn null_as_false(mask: &BooleanArray) -> BooleanArray {
    if mask.null_count() == 0 {
        mask.clone()
    } else {
        arrow::compute::prep_null_mask_filter(mask)
    }
}

/// Rows and their kinds. `kinds == None`: all `+I`.
#[derive(Debug, Clone)]
pub struct ChangeBatch {
    pub rows: RecordBatch,
    /// One [`RowKind`] byte per row.
    pub kinds: Option<UInt8Array>,
}

impl From<RecordBatch> for ChangeBatch {
    fn from(rows: RecordBatch) -> Self {
        ChangeBatch { rows, kinds: None }
    }
}

/// Name of the row-kind column when a change batch is stored as one
/// record batch (unaligned in-flight data).
pub const KIND_COLUMN: &str = "_weir_row_kind";

impl ChangeBatch {
    /// Rows with their kinds; all inserts collapse to `None`.
    pub fn new(rows: RecordBatch, kinds: Vec<RowKind>) -> Self {
        debug_assert_eq!(rows.num_rows(), kinds.len());
        if kinds.iter().all(|k| *k == RowKind::Insert) {
            return rows.into();
        }
        let kinds = UInt8Array::from_iter_values(kinds.into_iter().map(|k| k as u8));
        ChangeBatch {
            rows,
            kinds: Some(kinds),
        }
    }

    pub fn num_rows(&self) -> usize {
        self.rows.num_rows()
    }

    /// Whether every row is an insert.
    pub fn is_insert_only(&self) -> bool {
        self.kinds.is_none()
    }

    /// The kind of row `i`.
    pub fn kind(&self, i: usize) -> RowKind {
        match &self.kinds {
            // Only `RowKind as u8` values are ever stored (`new`, `decode`).
            Some(k) => RowKind::from_byte(k.value(i)).unwrap_or(RowKind::Insert),
            None => RowKind::Insert,
        }
    }

    pub fn slice(&self, offset: usize, len: usize) -> Self {
        ChangeBatch {
            rows: self.rows.slice(offset, len),
            kinds: self.kinds.as_ref().map(|k| k.slice(offset, len)),
        }
    }

    /// The rows where `mask` is true, with their kinds.
    pub fn filter(&self, mask: &BooleanArray) -> Result<Self, ArrowError> {
        let kinds = match &self.kinds {
            Some(k) => Some(
                filter(k, mask)?
                    .as_any()
                    .downcast_ref::<UInt8Array>()
                    .cloned()
                    .ok_or_else(|| ArrowError::ComputeError("row kinds lost their type in a filter".into()))?,
            ),
            None => None,
        };
        Ok(ChangeBatch {
            rows: filter_record_batch(&self.rows, mask)?,
            kinds,
        })
    }

    /// Rows `indices`, with their kinds.
    pub fn take(&self, indices: &UInt32Array) -> Result<Self, ArrowError> {
        let kinds = match &self.kinds {
            Some(k) => Some(
                take(k, indices, None)?
                    .as_any()
                    .downcast_ref::<UInt8Array>()
                    .cloned()
                    .ok_or_else(|| ArrowError::ComputeError("row kinds lost their type in a take".into()))?,
            ),
            None => None,
        };
        Ok(ChangeBatch {
            rows: take_record_batch(&self.rows, indices)?,
            kinds,
        })
    }

    /// The rows of an insert-only batch; an operator that cannot take
    /// changes calls this (the planner never sends it any: an error here
    /// is a planner bug, named after the operator).
    pub fn into_inserts(self, operator: &str) -> crate::error::Result<RecordBatch> {
        if self.kinds.is_some() {
            return Err(crate::error::ExecError::internal(format!(
                "{operator} received update or delete rows, which it cannot consume"
            )));
        }
        Ok(self.rows)
    }

    /// The same kinds over other rows of the same length (a projection).
    pub fn with_rows(&self, rows: RecordBatch) -> Self {
        ChangeBatch {
            rows,
            kinds: self.kinds.clone(),
        }
    }

    /// One record batch with the kinds as a last column [`KIND_COLUMN`]
    /// (always present, so batches of one channel share a schema).
    pub fn encode(&self) -> Result<RecordBatch, ArrowError> {
        let kinds: ArrayRef = match &self.kinds {
            Some(k) => Arc::new(k.clone()),
            None => Arc::new(UInt8Array::from(vec![RowKind::Insert as u8; self.num_rows()])),
        };
        let mut fields: Vec<Arc<Field>> = self.rows.schema().fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(KIND_COLUMN, DataType::UInt8, false)));
        let mut columns = self.rows.columns().to_vec();
        columns.push(kinds);
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
    }

    /// Reverses [`ChangeBatch::encode`]; a batch without the column is all
    /// inserts (in-flight data written before row kinds existed).
    pub fn decode(batch: RecordBatch) -> Result<Self, ArrowError> {
        let n = batch.num_columns();
        let schema = batch.schema();
        if n == 0 || schema.field(n - 1).name() != KIND_COLUMN {
            return Ok(batch.into());
        }
        let kinds = batch
            .column(n - 1)
            .as_any()
            .downcast_ref::<UInt8Array>()
            .cloned()
            .ok_or_else(|| ArrowError::InvalidArgumentError(format!("{KIND_COLUMN} is not UInt8")))?;
        if let Some(bad) = kinds.iter().flatten().find(|b| RowKind::from_byte(*b).is_none()) {
            return Err(ArrowError::InvalidArgumentError(format!(
                "row kind byte {bad} is not one of 0 (+I), 1 (-U), 2 (+U), 3 (-D)"
            )));
        }
        if kinds.null_count() > 0 {
            return Err(ArrowError::InvalidArgumentError(format!("{KIND_COLUMN} has nulls")));
        }
        let rows = batch.project(&(0..n - 1).collect::<Vec<_>>())?;
        let all_inserts = kinds.values().iter().all(|b| *b == RowKind::Insert as u8);
        Ok(ChangeBatch {
            rows,
            kinds: (!all_inserts).then_some(kinds),
        })
    }
}

/// Change batches written as text, for operator unit tests (RisingWave's
/// `StreamChunk::from_pretty`): one row per line, an optional row kind
/// first (`+I`, `-U`, `+U`, `-D`; none: an insert), then one token per
/// column of `schema`, `.` for NULL. A token is read as the column's type
/// by Arrow's cast from text; a timestamp column also takes a number of
/// milliseconds.
#[cfg(test)]
pub fn from_pretty(schema: &arrow::datatypes::SchemaRef, text: &str) -> ChangeBatch {
    use arrow::array::{Int64Array, StringArray};
    use arrow::compute::{CastOptions, cast_with_options};
    let mut kinds = vec![];
    let mut columns: Vec<Vec<Option<&str>>> = vec![vec![]; schema.fields().len()];
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut tokens = line.split_whitespace().peekable();
        let kind = tokens.peek().and_then(|t| RowKind::from_short(t));
        if kind.is_some() {
            tokens.next();
        }
        kinds.push(kind.unwrap_or(RowKind::Insert));
        let tokens: Vec<&str> = tokens.collect();
        assert_eq!(
            tokens.len(),
            columns.len(),
            "row {line:?}: one token per column of {schema:?}"
        );
        for (c, t) in columns.iter_mut().zip(tokens) {
            c.push((t != ".").then_some(t));
        }
    }
    let strict = CastOptions {
        safe: false,
        ..Default::default()
    };
    let arrays = schema
        .fields()
        .iter()
        .zip(&columns)
        .map(|(f, values)| {
            // A timestamp is given as epoch millis or as text: each value is
            // cast on its own (a column cast reads every value one way).
            let one = |v: &Option<&str>| -> ArrayRef {
                match (f.data_type(), v.and_then(|t| t.parse::<i64>().ok())) {
                    (DataType::Timestamp(..), Some(ms)) => Arc::new(Int64Array::from(vec![ms])),
                    _ => Arc::new(StringArray::from(vec![*v])),
                }
            };
            let cast: Vec<ArrayRef> = values
                .iter()
                .map(|v| {
                    cast_with_options(&one(v), f.data_type(), &strict)
                        .unwrap_or_else(|e| panic!("column {}: {v:?} as {}: {e}", f.name(), f.data_type()))
                })
                .collect();
            let parts: Vec<&dyn Array> = cast.iter().map(|a| a.as_ref()).collect();
            if parts.is_empty() {
                return arrow::array::new_empty_array(f.data_type());
            }
            arrow::compute::concat(&parts).expect("one type")
        })
        .collect();
    let rows = RecordBatch::try_new(schema.clone(), arrays).expect("rows match the schema");
    ChangeBatch::new(rows, kinds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    fn rows(v: &[i64]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(v.to_vec()))],
        )
        .expect("batch")
    }

    #[test]
    fn pretty_rows_have_their_kinds_types_and_nulls() {
        use arrow::array::{AsArray, StringArray, TimestampMillisecondArray};
        use arrow::datatypes::{Int64Type, TimeUnit};
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        ]));
        let b = from_pretty(
            &schema,
            "
            a 1 1000
            -U b . 2000
            +U . 3 1970-01-01T00:00:03
            ",
        );
        use RowKind::*;
        assert_eq!(
            (0..3).map(|i| b.kind(i)).collect::<Vec<_>>(),
            [Insert, UpdateBefore, UpdateAfter]
        );
        assert_eq!(
            b.rows.column(0).as_string::<i32>(),
            &StringArray::from(vec![Some("a"), Some("b"), None])
        );
        assert_eq!(
            b.rows.column(1).as_primitive::<Int64Type>().iter().collect::<Vec<_>>(),
            [Some(1), None, Some(3)]
        );
        let ts = b
            .rows
            .column(2)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .expect("ms");
        assert_eq!(ts.values().to_vec(), [1000, 2000, 3000]);
        let all_inserts = from_pretty(&schema, "x 1 1");
        assert!(all_inserts.is_insert_only());
    }

    #[test]
    fn kinds_follow_their_rows_through_filter_take_and_encoding() {
        use RowKind::*;
        let b = ChangeBatch::new(rows(&[1, 2, 3, 4]), vec![Insert, UpdateBefore, UpdateAfter, Delete]);
        let f = b
            .filter(&BooleanArray::from(vec![false, true, true, true]))
            .expect("filter");
        assert_eq!(
            (0..3).map(|i| f.kind(i)).collect::<Vec<_>>(),
            [UpdateBefore, UpdateAfter, Delete]
        );
        let t = b.take(&UInt32Array::from(vec![3, 0])).expect("take");
        assert_eq!([t.kind(0), t.kind(1)], [Delete, Insert]);
        let d = ChangeBatch::decode(b.encode().expect("encode")).expect("decode");
        assert_eq!(d.rows, b.rows);
        assert_eq!(d.kinds, b.kinds);
        let plain = ChangeBatch::decode(ChangeBatch::from(rows(&[5])).encode().expect("encode")).expect("decode");
        assert!(plain.is_insert_only());
        assert!(ChangeBatch::new(rows(&[1]), vec![Insert]).is_insert_only());
    }

    #[test]
    fn a_bad_kind_byte_is_an_error_not_a_panic() {
        let b = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("v", DataType::Int64, false),
                Field::new(KIND_COLUMN, DataType::UInt8, false),
            ])),
            vec![Arc::new(Int64Array::from(vec![1])), Arc::new(UInt8Array::from(vec![9]))],
        )
        .expect("batch");
        let e = ChangeBatch::decode(b).expect_err("byte 9");
        assert!(e.to_string().contains("row kind byte 9"), "{e}");
    }
}
