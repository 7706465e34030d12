//! `debezium-json`: changes as Debezium envelopes, one per line, read and
//! written as Flink does.
//!
//! Reading: `op` `c` and `r` are `+I(after)`, `u` is `-U(before)` then
//! `+U(after)`, `d` is `-D(before)`; another `op`, or a missing `before` /
//! `after` the `op` needs, is a bad record (failed on, skipped or set
//! aside like any other). Writing: `+I` and `+U` are
//! `{"before":null,"after":{..},"op":"c"}`, `-U` and `-D` are
//! `{"before":{..},"after":null,"op":"d"}`: an update is two records, as
//! Flink writes it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringArray, StructArray};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

use crate::change::{ChangeBatch, RowKind};
use crate::error::Result;

/// `{before: row, after: row, op: string}` of a table's rows.
pub fn envelope_schema(schema: &SchemaRef) -> SchemaRef {
    let row = DataType::Struct(Fields::from(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    Arc::new(Schema::new(vec![
        Field::new("before", row.clone(), true),
        Field::new("after", row, true),
        Field::new("op", DataType::Utf8, true),
    ]))
}

fn parts(b: &RecordBatch) -> std::result::Result<(&StructArray, &StructArray, &StringArray), ArrowError> {
    let bad = || ArrowError::ParseError("not a Debezium envelope".into());
    Ok((
        b.column(0).as_struct_opt().ok_or_else(bad)?,
        b.column(1).as_struct_opt().ok_or_else(bad)?,
        b.column(2).as_string_opt::<i32>().ok_or_else(bad)?,
    ))
}

/// Fails on the first envelope whose `op` is unknown or lacks the row its
/// `op` needs (Flink's messages).
pub fn check_envelopes(b: &RecordBatch) -> std::result::Result<(), ArrowError> {
    let (before, after, op) = parts(b)?;
    for i in 0..b.num_rows() {
        let o = if op.is_valid(i) { op.value(i) } else { "" };
        let (needs_before, needs_after) = match o {
            "c" | "r" => (false, true),
            "u" => (true, true),
            "d" => (true, false),
            other => {
                return Err(ArrowError::ParseError(format!("Unknown \"op\" value \"{other}\"")));
            }
        };
        if needs_before && before.is_null(i) {
            let what = if o == "u" { "UPDATE" } else { "DELETE" };
            return Err(ArrowError::ParseError(format!(
                "The \"before\" field of {what} message is null, if you are using Debezium Postgres Connector, \
                 please check the Postgres table has been set REPLICA IDENTITY to FULL level."
            )));
        }
        if needs_after && after.is_null(i) {
            return Err(ArrowError::ParseError(format!(
                "The \"after\" field of a message with \"op\" \"{o}\" is null"
            )));
        }
    }
    Ok(())
}

/// Checked envelopes as the changes they carry, rows of `schema`.
pub fn expand(b: &RecordBatch, schema: &SchemaRef) -> Result<ChangeBatch> {
    let (before, after, op) = parts(b)?;
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(b.num_rows());
    let mut kinds = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        match op.value(i) {
            "u" => {
                picks.extend([(0, i), (1, i)]);
                kinds.extend([RowKind::UpdateBefore, RowKind::UpdateAfter]);
            }
            "d" => {
                picks.push((0, i));
                kinds.push(RowKind::Delete);
            }
            _ => {
                picks.push((1, i));
                kinds.push(RowKind::Insert);
            }
        }
    }
    let sides: [&dyn Array; 2] = [before, after];
    let rows = interleave(&sides, &picks)?;
    let rows = rows.as_struct();
    let columns: Vec<ArrayRef> = rows.columns().to_vec();
    let rows = crate::operators::calc::batch_of_rows(schema, columns, picks.len())?;
    Ok(ChangeBatch::new(rows, kinds))
}

/// One envelope line per change of `rows` (already JSON objects, one per
/// row, from arrow's writer).
pub fn envelopes(changes: &ChangeBatch, row_json: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(row_json.len() + changes.num_rows() * 32);
    let lines = row_json.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    for (i, line) in lines.enumerate() {
        if changes.kind(i).is_accumulate() {
            out.extend_from_slice(b"{\"before\":null,\"after\":");
            out.extend_from_slice(line);
            out.extend_from_slice(b",\"op\":\"c\"}\n");
        } else {
            out.extend_from_slice(b"{\"before\":");
            out.extend_from_slice(line);
            out.extend_from_slice(b",\"after\":null,\"op\":\"d\"}\n");
        }
    }
    Ok(out)
}
