//! Changelog formats: changes as JSON envelopes, one per line, read and
//! written as Flink does.
//!
//! `debezium-json`: `op` `c` and `r` are `+I(after)`, `u` is `-U(before)`
//! then `+U(after)`, `d` is `-D(before)`; another `op`, or a missing
//! `before` / `after` the `op` needs, is a bad record (failed on, skipped
//! or set aside like any other). Written: `+I` and `+U` as
//! `{"before":null,"after":{..},"op":"c"}`, `-U` and `-D` as
//! `{"before":{..},"after":null,"op":"d"}`: an update is two records.
//!
//! `canal-json`: `{"data":[rows],"old":[rows],"type":"INSERT|UPDATE|DELETE",
//! "database":..,"table":..}`; an UPDATE's `old` holds the changed fields
//! only: a field absent from `old` had the value it has in `data`, a
//! field present (even as `null`) had the value in `old`. `CREATE` (a DDL
//! event) is skipped; `canal-json.database.include` / `.table.include`
//! keep only messages whose database / table match a regular expression
//! (whole text). Written: `{"data":[row],"type":"INSERT"}` for `+I`/`+U`,
//! `"DELETE"` for `-U`/`-D`.
//!
//! `maxwell-json`: `{"data":{row},"old":{..},"type":"insert|update|delete"}`,
//! `old` as Canal's; written `{"data":{row},"type":"insert"|"delete"}`.
//!
//! Canal and Maxwell lines are first rewritten (serde_json) into
//! envelopes arrow's JSON reader decodes into typed rows, one row per line
//! (so bad lines are still found and reported one by one): Maxwell's into
//! Debezium's, Canal's into `{"before":[..],"after":[..],"op":..}`.

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, ListArray, StringArray, StructArray};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use serde_json::{Map, Value};

use super::{Format, FormatOptions};
use crate::change::{ChangeBatch, RowKind};
use crate::error::Result;

/// What arrow's reader decodes a changelog format's (rewritten) lines
/// into: `{before: row, after: row, op: string}`; Canal's rows are lists.
pub fn envelope_schema(format: Format, schema: &SchemaRef) -> SchemaRef {
    let mut row = DataType::Struct(Fields::from(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    if format == Format::CanalJson {
        row = DataType::new_list(row, true);
    }
    Arc::new(Schema::new(vec![
        Field::new("before", row.clone(), true),
        Field::new("after", row, true),
        Field::new("op", DataType::Utf8, true),
    ]))
}

fn bad(message: impl Into<String>) -> ArrowError {
    ArrowError::ParseError(message.into())
}

/// Canal and Maxwell lines rewritten as the envelopes of
/// [`envelope_schema`], one line for each (a skipped Canal message becomes
/// an envelope with `op` `skip`); Debezium's as they are.
pub fn normalize<'a>(f: &FormatOptions, text: &'a str) -> std::result::Result<Cow<'a, str>, ArrowError> {
    let name = match f.format {
        Format::CanalJson => "Canal",
        Format::MaxwellJson => "Maxwell",
        _ => return Ok(Cow::Borrowed(text)),
    };
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split('\n') {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("Corrupt {name} JSON message: {e}")))?;
        let Value::Object(mut m) = v else {
            return Err(bad(format!("Corrupt {name} JSON message: not a JSON object")));
        };
        let envelope = if f.format == Format::CanalJson {
            canal(f, &mut m)?
        } else {
            maxwell(&mut m)?
        };
        out.push_str(&envelope.to_string());
        out.push('\n');
    }
    Ok(Cow::Owned(out))
}

fn type_of(m: &Map<String, Value>) -> std::result::Result<String, ArrowError> {
    match m.get("type") {
        Some(Value::String(t)) => Ok(t.clone()),
        Some(Value::Null) | None => Err(bad("the message has no \"type\"")),
        Some(other) => Ok(other.to_string()),
    }
}

/// The row before an update: `after` with the fields `old` names (even as
/// null) set to their old values.
fn before_update(after: &Value, old: Option<&Value>) -> Value {
    let mut before = after.clone();
    if let (Value::Object(b), Some(Value::Object(o))) = (&mut before, old) {
        for (k, v) in o {
            b.insert(k.clone(), v.clone());
        }
    }
    before
}

fn envelope(before: Value, after: Value, op: &str) -> Value {
    let mut e = Map::with_capacity(3);
    e.insert("before".into(), before);
    e.insert("after".into(), after);
    e.insert("op".into(), Value::String(op.into()));
    Value::Object(e)
}

fn canal(f: &FormatOptions, m: &mut Map<String, Value>) -> std::result::Result<Value, ArrowError> {
    for (field, key, pattern) in [
        ("database", "canal-json.database.include", &f.canal_database),
        ("table", "canal-json.table.include", &f.canal_table),
    ] {
        if let Some(p) = pattern {
            let Some(Value::String(name)) = m.get(field) else {
                return Err(bad(format!(
                    "Corrupt Canal JSON message: no \"{field}\" to match '{key}' against"
                )));
            };
            if !p.is_match(name) {
                return Ok(envelope(Value::Null, Value::Null, "skip"));
            }
        }
    }
    let t = type_of(m)?;
    let data = |m: &mut Map<String, Value>| match m.remove("data") {
        Some(Value::Array(rows)) => Ok(rows),
        _ => Err(bad(format!(
            "Corrupt Canal JSON message: the \"data\" of a {t} message is not an array of rows"
        ))),
    };
    Ok(match t.as_str() {
        "INSERT" => envelope(Value::Null, Value::Array(data(m)?), "c"),
        "DELETE" => envelope(Value::Array(data(m)?), Value::Null, "d"),
        "UPDATE" => {
            let after = data(m)?;
            let old = match m.remove("old") {
                Some(Value::Array(o)) if o.len() >= after.len() => o,
                _ => {
                    return Err(bad(
                        "Corrupt Canal JSON message: the \"old\" of an UPDATE message needs one entry per row of \"data\"",
                    ));
                }
            };
            let before = after.iter().zip(&old).map(|(a, o)| before_update(a, Some(o))).collect();
            envelope(Value::Array(before), Value::Array(after), "u")
        }
        // A DDL event: nothing to read.
        "CREATE" => envelope(Value::Null, Value::Null, "skip"),
        other => return Err(bad(format!("Unknown \"type\" value \"{other}\""))),
    })
}

fn maxwell(m: &mut Map<String, Value>) -> std::result::Result<Value, ArrowError> {
    let t = type_of(m)?;
    let data = match m.remove("data") {
        Some(d @ Value::Object(_)) => d,
        _ => {
            return Err(bad(format!(
                "Corrupt Maxwell JSON message: the \"data\" of a {t} message is not a row"
            )));
        }
    };
    Ok(match t.as_str() {
        "insert" => envelope(Value::Null, data, "c"),
        "delete" => envelope(data, Value::Null, "d"),
        "update" => envelope(before_update(&data, m.get("old")), data, "u"),
        other => return Err(bad(format!("Unknown \"type\" value \"{other}\""))),
    })
}

fn parts(b: &RecordBatch) -> std::result::Result<(&dyn Array, &dyn Array, &StringArray), ArrowError> {
    let op = b
        .column(2)
        .as_string_opt::<i32>()
        .ok_or_else(|| bad("not a change envelope"))?;
    Ok((b.column(0).as_ref(), b.column(1).as_ref(), op))
}

/// Fails on the first Debezium envelope whose `op` is unknown or lacks the
/// row its `op` needs (Flink's messages). Canal and Maxwell envelopes were
/// made whole by [`normalize`].
pub fn check_envelopes(format: Format, b: &RecordBatch) -> std::result::Result<(), ArrowError> {
    if format != Format::DebeziumJson {
        return Ok(());
    }
    let (before, after, op) = parts(b)?;
    for i in 0..b.num_rows() {
        let o = if op.is_valid(i) { op.value(i) } else { "" };
        let (needs_before, needs_after) = match o {
            "c" | "r" => (false, true),
            "u" => (true, true),
            "d" => (true, false),
            other => {
                return Err(bad(format!("Unknown \"op\" value \"{other}\"")));
            }
        };
        if needs_before && before.is_null(i) {
            let what = if o == "u" { "UPDATE" } else { "DELETE" };
            return Err(bad(format!(
                "The \"before\" field of {what} message is null, if you are using Debezium Postgres Connector, \
                 please check the Postgres table has been set REPLICA IDENTITY to FULL level."
            )));
        }
        if needs_after && after.is_null(i) {
            return Err(bad(format!(
                "The \"after\" field of a message with \"op\" \"{o}\" is null"
            )));
        }
    }
    Ok(())
}

/// Checked envelopes as the changes they carry, rows of `schema`.
pub fn expand(format: Format, b: &RecordBatch, schema: &SchemaRef) -> Result<ChangeBatch> {
    let (before, after, op) = parts(b)?;
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(b.num_rows());
    let mut kinds = Vec::with_capacity(b.num_rows());
    let rows = if format == Format::CanalJson {
        // Each envelope holds lists of rows: pick from the lists' values.
        let not_list = || bad("not a Canal envelope");
        let before: &ListArray = before.as_list_opt().ok_or_else(not_list)?;
        let after: &ListArray = after.as_list_opt().ok_or_else(not_list)?;
        let range = |l: &ListArray, i: usize| {
            if l.is_null(i) {
                0..0
            } else {
                let o = l.value_offsets();
                o[i] as usize..o[i + 1] as usize
            }
        };
        for i in 0..b.num_rows() {
            match op.value(i) {
                "c" => range(after, i).for_each(|j| {
                    picks.push((1, j));
                    kinds.push(RowKind::Insert);
                }),
                "d" => range(before, i).for_each(|j| {
                    picks.push((0, j));
                    kinds.push(RowKind::Delete);
                }),
                "u" => range(before, i).zip(range(after, i)).for_each(|(x, y)| {
                    picks.extend([(0, x), (1, y)]);
                    kinds.extend([RowKind::UpdateBefore, RowKind::UpdateAfter]);
                }),
                _ => {}
            }
        }
        let sides: [&dyn Array; 2] = [before.values().as_ref(), after.values().as_ref()];
        interleave(&sides, &picks)?
    } else {
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
        interleave(&sides, &picks)?
    };
    let rows: &StructArray = rows
        .as_struct_opt()
        .ok_or_else(|| bad("change envelope rows are not rows"))?;
    let columns: Vec<ArrayRef> = rows.columns().to_vec();
    let rows = crate::operators::calc::batch_of_rows(schema, columns, picks.len())?;
    Ok(ChangeBatch::new(rows, kinds))
}

/// One envelope line per change of `rows` (already JSON objects, one per
/// row, from arrow's writer), in the sink's changelog format.
pub fn envelopes(format: Format, changes: &ChangeBatch, row_json: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(row_json.len() + changes.num_rows() * 32);
    let lines = row_json.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    for (i, line) in lines.enumerate() {
        let add = changes.kind(i).is_accumulate();
        let (open, close): (&[u8], &[u8]) = match (format, add) {
            (Format::CanalJson, true) => (b"{\"data\":[", b"],\"type\":\"INSERT\"}\n"),
            (Format::CanalJson, false) => (b"{\"data\":[", b"],\"type\":\"DELETE\"}\n"),
            (Format::MaxwellJson, true) => (b"{\"data\":", b",\"type\":\"insert\"}\n"),
            (Format::MaxwellJson, false) => (b"{\"data\":", b",\"type\":\"delete\"}\n"),
            (_, true) => (b"{\"before\":null,\"after\":", b",\"op\":\"c\"}\n"),
            (_, false) => (b"{\"before\":", b",\"after\":null,\"op\":\"d\"}\n"),
        };
        out.extend_from_slice(open);
        out.extend_from_slice(line);
        out.extend_from_slice(close);
    }
    Ok(out)
}
