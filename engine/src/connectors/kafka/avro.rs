//! Flink's `avro` format: a record's key or value is one Avro binary datum
//! (no container header, no schema id), written and read with the schema
//! Flink derives from the columns (`AvroSchemaConverter.convertToSchema`):
//!
//! - a nullable column is the union `["null", T]` (NULL is branch 0), a
//!   `NOT NULL` one `T`;
//! - BOOLEAN `boolean`; TINYINT, SMALLINT, INT `int`; BIGINT `long`;
//!   FLOAT `float`; DOUBLE `double`; STRING `string`; BYTES `bytes`;
//! - DECIMAL(p, s) `bytes` of logical type `decimal` (the unscaled value,
//!   big-endian two's complement); DATE `int` `date`;
//!   TIMESTAMP(0..3) and TIMESTAMP_LTZ(0..3) `long` `timestamp-millis`,
//!   (4..6) `timestamp-micros`; with `'avro.timestamp_mapping.legacy' =
//!   'false'` a TIMESTAMP is `local-timestamp-millis`/`-micros` instead
//!   (Flink's non-legacy mapping; the bytes are the same long, the schema
//!   a reader sees differs);
//! - ARRAY `array`, MAP with STRING keys `map`, ROW a nested `record`.
//!
//! Since a datum carries no schema, the columns' order, types and
//! nullability are the contract: Flink and Weir tables with the same
//! columns read each other's records. Record and field names do not
//! reach the bytes.

use std::sync::Arc;

use apache_avro::Schema;
use apache_avro::types::Value;
use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
    Int8Array, Int16Array, Int32Array, Int64Array, ListArray, MapArray, StringArray, StructArray,
    TimestampMicrosecondArray, TimestampMillisecondArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use serde_json::json;

/// The `avro` format of a key or value: its Avro schema and its columns.
#[derive(Debug)]
pub(super) struct AvroFormat {
    schema: Schema,
    columns: SchemaRef,
}

impl AvroFormat {
    /// The format of `columns`; an error names a column Avro cannot hold.
    /// `legacy_timestamps`: `avro.timestamp_mapping.legacy` (TIMESTAMP as
    /// `timestamp-*`, else `local-timestamp-*`).
    pub fn new(columns: &SchemaRef, legacy_timestamps: bool) -> Result<Self, String> {
        let mapping = Mapping { legacy_timestamps };
        let record = record_type(
            columns.fields(),
            "record",
            Some("org.apache.flink.avro.generated"),
            mapping,
        )?;
        let schema = Schema::parse(&record).map_err(|e| format!("the columns are no Avro record: {e}"))?;
        Ok(Self {
            schema,
            columns: columns.clone(),
        })
    }

    /// Each datum as a row.
    pub fn decode(&self, parts: &[&[u8]]) -> Result<RecordBatch, String> {
        let width = self.columns.fields().len();
        let mut columns: Vec<Vec<Value>> = (0..width).map(|_| Vec::with_capacity(parts.len())).collect();
        for part in parts {
            let mut reader = Bounded {
                rest: part,
                ended: false,
            };
            let datum = apache_avro::from_avro_datum(&self.schema, &mut reader, None)
                .map_err(|e| format!("not an Avro record of the table's columns: {e}"))?;
            // apache-avro reads a union at the end of the bytes as NULL
            // (lenient to old writers); Java's Avro, and so Flink, fails.
            if reader.ended {
                return Err(format!(
                    "not an Avro record of the table's columns: it ends after {} bytes, before its last field",
                    part.len()
                ));
            }
            if !reader.rest.is_empty() {
                return Err(format!(
                    "{} bytes after the Avro record of the table's columns (written with another schema?)",
                    reader.rest.len()
                ));
            }
            let Value::Record(fields) = datum else {
                return Err("not an Avro record".into());
            };
            for (column, (_, v)) in columns.iter_mut().zip(fields) {
                column.push(v);
            }
        }
        let arrays = self
            .columns
            .fields()
            .iter()
            .zip(&columns)
            .map(|(f, values)| array_of(&values.iter().collect::<Vec<_>>(), f.data_type()))
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new_with_options(
            self.columns.clone(),
            arrays,
            &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(parts.len())),
        )
        .map_err(|e| e.to_string())
    }

    /// Each row as a datum.
    pub fn encode(&self, rows: &RecordBatch) -> Result<Vec<Vec<u8>>, String> {
        let fields = rows.schema().fields().clone();
        (0..rows.num_rows())
            .map(|r| {
                let record = fields
                    .iter()
                    .zip(rows.columns())
                    .map(|(f, c)| Ok((f.name().clone(), value_at(c.as_ref(), r, f.is_nullable())?)))
                    .collect::<Result<Vec<_>, String>>()?;
                apache_avro::to_avro_datum(&self.schema, Value::Record(record)).map_err(|e| e.to_string())
            })
            .collect()
    }
}

/// The bytes of one datum, remembering whether a read asked past them.
struct Bounded<'a> {
    rest: &'a [u8],
    ended: bool,
}

impl std::io::Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.rest.is_empty() && !buf.is_empty() {
            self.ended = true;
        }
        self.rest.read(buf)
    }
}

/// The Avro type of a field, a union with `null` when it is nullable.
/// How Flink's schema converter maps types (its options).
#[derive(Debug, Clone, Copy)]
struct Mapping {
    legacy_timestamps: bool,
}

fn field_type(f: &Field, name: &str, m: Mapping) -> Result<serde_json::Value, String> {
    let t = avro_type(f.data_type(), name, f.name(), m)?;
    Ok(if f.is_nullable() { json!(["null", t]) } else { t })
}

fn record_type(fields: &Fields, name: &str, namespace: Option<&str>, m: Mapping) -> Result<serde_json::Value, String> {
    let fields = fields
        .iter()
        .map(|f| {
            let t = field_type(f, &format!("{name}_{}", f.name()), m)?;
            Ok(if f.is_nullable() {
                json!({"name": f.name(), "type": t, "default": null})
            } else {
                json!({"name": f.name(), "type": t})
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut r = json!({"type": "record", "name": name, "fields": fields});
    if let Some(ns) = namespace {
        r["namespace"] = json!(ns);
    }
    Ok(r)
}

/// `name`: a nested record's name (Flink's `<parent>_<field>`); `column`
/// names the column in errors.
fn avro_type(t: &DataType, name: &str, column: &str, m: Mapping) -> Result<serde_json::Value, String> {
    Ok(match t {
        DataType::Boolean => json!("boolean"),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => json!("int"),
        DataType::Int64 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Utf8 | DataType::LargeUtf8 => json!("string"),
        DataType::Binary | DataType::LargeBinary => json!("bytes"),
        DataType::Decimal128(p, s) => json!({"type": "bytes", "logicalType": "decimal", "precision": p, "scale": s}),
        DataType::Date32 => json!({"type": "int", "logicalType": "date"}),
        DataType::Timestamp(TimeUnit::Second | TimeUnit::Millisecond, None) if !m.legacy_timestamps => {
            json!({"type": "long", "logicalType": "local-timestamp-millis"})
        }
        DataType::Timestamp(TimeUnit::Microsecond, None) if !m.legacy_timestamps => {
            json!({"type": "long", "logicalType": "local-timestamp-micros"})
        }
        DataType::Timestamp(TimeUnit::Second | TimeUnit::Millisecond, _) => {
            json!({"type": "long", "logicalType": "timestamp-millis"})
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => json!({"type": "long", "logicalType": "timestamp-micros"}),
        DataType::List(item) => json!({"type": "array", "items": field_type(item, name, m)?}),
        DataType::Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(format!("column '{column}': a MAP without entries"));
            };
            if !matches!(kv[0].data_type(), DataType::Utf8 | DataType::LargeUtf8) {
                return Err(format!(
                    "column '{column}': Avro maps have STRING keys, not {}",
                    kv[0].data_type()
                ));
            }
            json!({"type": "map", "values": field_type(&kv[1], name, m)?})
        }
        DataType::Struct(fields) => record_type(fields, name, None, m)?,
        DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
            return Err(format!(
                "column '{column}': {} has no Avro type in Flink's 'avro' format (precision 6 at most)",
                if tz.is_some() {
                    "TIMESTAMP_LTZ(9)"
                } else {
                    "TIMESTAMP(9)"
                }
            ));
        }
        other => {
            return Err(format!(
                "column '{column}' of type {other} has no Avro type in Flink's 'avro' format"
            ));
        }
    })
}

/// A value without its union branch.
fn plain(v: &Value) -> &Value {
    match v {
        Value::Union(_, inner) => inner,
        v => v,
    }
}

fn nulls_of(values: &[&Value]) -> Option<NullBuffer> {
    let valid: Vec<bool> = values.iter().map(|v| !matches!(plain(v), Value::Null)).collect();
    valid.contains(&false).then(|| NullBuffer::from(valid))
}

/// The values of one column (datums decoded with its schema) as an array.
fn array_of(values: &[&Value], t: &DataType) -> Result<ArrayRef, String> {
    let each = values.iter().map(|v| plain(v));
    Ok(match t {
        DataType::Boolean => Arc::new(BooleanArray::from_iter(each.map(|v| match v {
            Value::Boolean(b) => Some(*b),
            _ => None,
        }))),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => {
            let ints: Int32Array = each
                .map(|v| match v {
                    Value::Int(i) => Some(*i),
                    _ => None,
                })
                .collect();
            match t {
                DataType::Int8 => Arc::new(narrow::<Int8Array, i8>(&ints)?),
                DataType::Int16 => Arc::new(narrow::<Int16Array, i16>(&ints)?),
                _ => Arc::new(ints),
            }
        }
        DataType::Int64 => Arc::new(Int64Array::from_iter(each.map(|v| match v {
            Value::Long(i) => Some(*i),
            _ => None,
        }))),
        DataType::Float32 => Arc::new(Float32Array::from_iter(each.map(|v| match v {
            Value::Float(f) => Some(*f),
            _ => None,
        }))),
        DataType::Float64 => Arc::new(Float64Array::from_iter(each.map(|v| match v {
            Value::Double(f) => Some(*f),
            _ => None,
        }))),
        DataType::Utf8 | DataType::LargeUtf8 => {
            let s: StringArray = each
                .map(|v| match v {
                    Value::String(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect();
            arrow::compute::cast(&s, t).map_err(|e| e.to_string())?
        }
        DataType::Binary | DataType::LargeBinary => {
            let b: BinaryArray = each
                .map(|v| match v {
                    Value::Bytes(b) => Some(b.as_slice()),
                    _ => None,
                })
                .collect();
            arrow::compute::cast(&b, t).map_err(|e| e.to_string())?
        }
        DataType::Decimal128(p, s) => {
            let unscaled = each
                .map(|v| match v {
                    Value::Decimal(d) => {
                        let bytes = Vec::<u8>::try_from(d).map_err(|e| e.to_string())?;
                        unscaled_of(&bytes).map(Some)
                    }
                    _ => Ok(None),
                })
                .collect::<Result<Decimal128Array, String>>()?;
            let a = unscaled.with_precision_and_scale(*p, *s).map_err(|e| e.to_string())?;
            a.validate_decimal_precision(*p)
                .map_err(|e| format!("a DECIMAL beyond its precision: {e}"))?;
            Arc::new(a)
        }
        DataType::Date32 => Arc::new(Date32Array::from_iter(each.map(|v| match v {
            Value::Date(d) => Some(*d),
            _ => None,
        }))),
        DataType::Timestamp(TimeUnit::Millisecond, tz) => Arc::new(
            TimestampMillisecondArray::from_iter(each.map(|v| match v {
                Value::TimestampMillis(t) | Value::LocalTimestampMillis(t) | Value::Long(t) => Some(*t),
                _ => None,
            }))
            .with_timezone_opt(tz.clone()),
        ),
        DataType::Timestamp(TimeUnit::Second, tz) => Arc::new(
            arrow::array::TimestampSecondArray::from_iter(each.map(|v| match v {
                Value::TimestampMillis(t) | Value::LocalTimestampMillis(t) | Value::Long(t) => Some(t.div_euclid(1000)),
                _ => None,
            }))
            .with_timezone_opt(tz.clone()),
        ),
        DataType::Timestamp(TimeUnit::Microsecond, tz) => Arc::new(
            TimestampMicrosecondArray::from_iter(each.map(|v| match v {
                Value::TimestampMicros(t) | Value::LocalTimestampMicros(t) | Value::Long(t) => Some(*t),
                _ => None,
            }))
            .with_timezone_opt(tz.clone()),
        ),
        DataType::List(item) => {
            let mut lengths = Vec::with_capacity(values.len());
            let mut items: Vec<&Value> = vec![];
            for v in values {
                match plain(v) {
                    Value::Array(xs) => {
                        lengths.push(xs.len());
                        items.extend(xs);
                    }
                    _ => lengths.push(0),
                }
            }
            let child = array_of(&items, item.data_type())?;
            Arc::new(
                ListArray::try_new(
                    item.clone(),
                    OffsetBuffer::from_lengths(lengths),
                    child,
                    nulls_of(values),
                )
                .map_err(|e| e.to_string())?,
            )
        }
        DataType::Map(entries, sorted) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err("a MAP without entries".into());
            };
            let mut lengths = Vec::with_capacity(values.len());
            let mut keys: Vec<&str> = vec![];
            let mut items: Vec<&Value> = vec![];
            for v in values {
                match plain(v) {
                    Value::Map(m) => {
                        // Sorted by key: an Avro map (a Java HashMap) has
                        // no order of its own.
                        let mut pairs: Vec<(&String, &Value)> = m.iter().collect();
                        pairs.sort_by_key(|(k, _)| *k);
                        lengths.push(pairs.len());
                        for (k, x) in pairs {
                            keys.push(k);
                            items.push(x);
                        }
                    }
                    _ => lengths.push(0),
                }
            }
            let key_column =
                arrow::compute::cast(&StringArray::from(keys), kv[0].data_type()).map_err(|e| e.to_string())?;
            let value_column = array_of(&items, kv[1].data_type())?;
            let entries_array =
                StructArray::try_new(kv.clone(), vec![key_column, value_column], None).map_err(|e| e.to_string())?;
            Arc::new(
                MapArray::try_new(
                    entries.clone(),
                    OffsetBuffer::from_lengths(lengths),
                    entries_array,
                    nulls_of(values),
                    *sorted,
                )
                .map_err(|e| e.to_string())?,
            )
        }
        DataType::Struct(fields) => {
            let null = Value::Null;
            let children = fields
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let column: Vec<&Value> = values
                        .iter()
                        .map(|v| match plain(v) {
                            Value::Record(r) => r.get(i).map_or(&null, |(_, x)| x),
                            _ => &null,
                        })
                        .collect();
                    array_of(&column, f.data_type())
                })
                .collect::<Result<Vec<_>, String>>()?;
            Arc::new(StructArray::try_new(fields.clone(), children, nulls_of(values)).map_err(|e| e.to_string())?)
        }
        other => return Err(format!("no Avro reading of {other}")),
    })
}

/// An INT column narrowed to TINYINT or SMALLINT (Flink writes them as
/// Avro ints); a value out of range is an error.
fn narrow<A, T>(ints: &Int32Array) -> Result<A, String>
where
    A: FromIterator<Option<T>>,
    T: TryFrom<i32>,
{
    ints.iter()
        .map(|v| match v {
            None => Ok(None),
            Some(i) => T::try_from(i)
                .map(Some)
                .map_err(|_| format!("{i} is out of the column's integer range")),
        })
        .collect()
}

/// A decimal's unscaled value from its big-endian two's complement bytes.
fn unscaled_of(bytes: &[u8]) -> Result<i128, String> {
    if bytes.len() > 16 {
        return Err(format!("a decimal of {} bytes is beyond DECIMAL(38)", bytes.len()));
    }
    let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
        0xFF
    } else {
        0
    };
    let mut full = [fill; 16];
    full[16 - bytes.len()..].copy_from_slice(bytes);
    Ok(i128::from_be_bytes(full))
}

/// The shortest big-endian two's complement bytes of `v` (Java's
/// `BigInteger.toByteArray`, which Flink writes).
fn bytes_of(v: i128) -> Vec<u8> {
    let full = v.to_be_bytes();
    let mut start = 0;
    while start < 15 {
        let (b, next) = (full[start], full[start + 1]);
        let redundant = (b == 0 && next & 0x80 == 0) || (b == 0xFF && next & 0x80 != 0);
        if !redundant {
            break;
        }
        start += 1;
    }
    full[start..].to_vec()
}

/// Row `r` of `c` as an Avro value (in a union when `nullable`).
fn value_at(c: &dyn Array, r: usize, nullable: bool) -> Result<Value, String> {
    if c.is_null(r) {
        return if nullable {
            Ok(Value::Union(0, Box::new(Value::Null)))
        } else {
            Err("a NULL in a NOT NULL column".into())
        };
    }
    let v = match c.data_type() {
        DataType::Boolean => Value::Boolean(c.as_boolean().value(r)),
        DataType::Int8 => Value::Int(c.as_primitive::<arrow::datatypes::Int8Type>().value(r).into()),
        DataType::Int16 => Value::Int(c.as_primitive::<arrow::datatypes::Int16Type>().value(r).into()),
        DataType::Int32 => Value::Int(c.as_primitive::<arrow::datatypes::Int32Type>().value(r)),
        DataType::Int64 => Value::Long(c.as_primitive::<arrow::datatypes::Int64Type>().value(r)),
        DataType::Float32 => Value::Float(c.as_primitive::<arrow::datatypes::Float32Type>().value(r)),
        DataType::Float64 => Value::Double(c.as_primitive::<arrow::datatypes::Float64Type>().value(r)),
        DataType::Utf8 => Value::String(c.as_string::<i32>().value(r).to_string()),
        DataType::LargeUtf8 => Value::String(c.as_string::<i64>().value(r).to_string()),
        DataType::Binary => Value::Bytes(c.as_binary::<i32>().value(r).to_vec()),
        DataType::LargeBinary => Value::Bytes(c.as_binary::<i64>().value(r).to_vec()),
        DataType::Decimal128(..) => Value::Decimal(apache_avro::Decimal::from(bytes_of(
            c.as_primitive::<arrow::datatypes::Decimal128Type>().value(r),
        ))),
        DataType::Date32 => Value::Date(c.as_primitive::<arrow::datatypes::Date32Type>().value(r)),
        // A plain long: valid for the `timestamp-*` and the
        // `local-timestamp-*` schema alike (the bytes are the same).
        DataType::Timestamp(TimeUnit::Second, _) => Value::Long(
            c.as_primitive::<arrow::datatypes::TimestampSecondType>()
                .value(r)
                .saturating_mul(1000),
        ),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            Value::Long(c.as_primitive::<arrow::datatypes::TimestampMillisecondType>().value(r))
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            Value::Long(c.as_primitive::<arrow::datatypes::TimestampMicrosecondType>().value(r))
        }
        DataType::List(item) => {
            let list = c.as_list::<i32>().value(r);
            Value::Array(
                (0..list.len())
                    .map(|i| value_at(list.as_ref(), i, item.is_nullable()))
                    .collect::<Result<_, _>>()?,
            )
        }
        DataType::Map(entries, _) => {
            let value_nullable = match entries.data_type() {
                DataType::Struct(kv) => kv[1].is_nullable(),
                _ => true,
            };
            let m = c.as_map();
            let (start, end) = (m.value_offsets()[r] as usize, m.value_offsets()[r + 1] as usize);
            let keys = arrow::compute::cast(m.keys(), &DataType::Utf8).map_err(|e| e.to_string())?;
            let keys = keys.as_string::<i32>();
            Value::Map(
                (start..end)
                    .map(|i| {
                        Ok((
                            keys.value(i).to_string(),
                            value_at(m.values().as_ref(), i, value_nullable)?,
                        ))
                    })
                    .collect::<Result<_, String>>()?,
            )
        }
        DataType::Struct(fields) => {
            let s = c.as_struct();
            Value::Record(
                fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, col)| Ok((f.name().clone(), value_at(col.as_ref(), r, f.is_nullable())?)))
                    .collect::<Result<_, String>>()?,
            )
        }
        other => return Err(format!("no Avro writing of {other}")),
    };
    Ok(if nullable { Value::Union(1, Box::new(v)) } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{FieldRef, Schema as ArrowSchema};

    fn field(name: &str, t: DataType, nullable: bool) -> FieldRef {
        Arc::new(Field::new(name, t, nullable))
    }

    fn columns() -> SchemaRef {
        let point = Fields::from(vec![
            field("x", DataType::Int32, false),
            field("label", DataType::Utf8, true),
        ]);
        Arc::new(ArrowSchema::new(vec![
            field("id", DataType::Int64, false),
            field("name", DataType::Utf8, true),
            field("price", DataType::Decimal128(10, 2), true),
            field("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            field("day", DataType::Date32, true),
            field("tags", DataType::List(field("element", DataType::Utf8, true)), true),
            field(
                "attrs",
                DataType::Map(
                    field(
                        "entries",
                        DataType::Struct(Fields::from(vec![
                            field("key", DataType::Utf8, false),
                            field("value", DataType::Int32, true),
                        ])),
                        false,
                    ),
                    false,
                ),
                true,
            ),
            field("at", DataType::Struct(point), true),
            field("small", DataType::Int16, true),
            field("ok", DataType::Boolean, true),
            field("ratio", DataType::Float64, true),
        ]))
    }

    #[test]
    fn the_schema_is_flinks_for_the_same_columns() {
        let f = AvroFormat::new(&columns(), true).expect("a schema");
        let text = f.schema.canonical_form();
        // Nullable columns are unions with null first; a NOT NULL one is
        // its type alone; DECIMAL is bytes of logical type decimal.
        assert!(text.contains(r#"{"name":"id","type":"long"}"#), "{text}");
        assert!(text.contains(r#"{"name":"name","type":["null","string"]}"#), "{text}");
        assert!(
            text.contains(r#""name":"price","type":["null",{"type":"bytes""#),
            "{text}"
        );
        assert!(
            text.contains(r#""name":"org.apache.flink.avro.generated.record""#),
            "{text}"
        );
    }

    /// `avro.timestamp_mapping.legacy` = false: a TIMESTAMP is a
    /// `local-timestamp-millis` (a TIMESTAMP_LTZ stays `timestamp-millis`),
    /// the bytes the same long, and both read back.
    #[test]
    fn non_legacy_mapping_writes_local_timestamps() {
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
            Field::new(
                "ltz",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                false,
            ),
        ]));
        let legacy = AvroFormat::new(&schema, true).expect("a schema");
        let local = AvroFormat::new(&schema, false).expect("a schema");
        // The canonical form drops logical types: the schema as written.
        let text = serde_json::to_string(&local.schema).expect("json");
        assert!(text.contains(r#""logicalType":"local-timestamp-millis""#), "{text}");
        assert!(text.contains(r#""logicalType":"timestamp-millis""#), "{text}");
        let legacy_text = serde_json::to_string(&legacy.schema).expect("json");
        assert!(!legacy_text.contains("local-timestamp"), "{legacy_text}");
        assert_eq!(
            legacy_text.matches(r#""logicalType":"timestamp-millis""#).count(),
            2,
            "{legacy_text}"
        );
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(TimestampMillisecondArray::from(vec![1_704_067_210_000])),
                Arc::new(TimestampMillisecondArray::from(vec![5]).with_timezone("UTC")),
            ],
        )
        .expect("batch");
        let a = legacy.encode(&batch).expect("legacy");
        let b = local.encode(&batch).expect("local");
        assert_eq!(a, b, "the same bytes");
        let parts: Vec<&[u8]> = b.iter().map(Vec::as_slice).collect();
        assert_eq!(local.decode(&parts).expect("decoded"), batch);
    }

    #[test]
    fn rows_round_trip_through_avro_datums() {
        let schema = columns();
        let f = AvroFormat::new(&schema, true).expect("a schema");
        // Rows written by hand as Avro values, then read and written back.
        let rows = [
            Value::Record(vec![
                ("id".into(), Value::Long(1)),
                ("name".into(), Value::Union(1, Box::new(Value::String("Oslo".into())))),
                (
                    "price".into(),
                    Value::Union(
                        1,
                        Box::new(Value::Decimal(apache_avro::Decimal::from(bytes_of(-12345)))),
                    ),
                ),
                (
                    "ts".into(),
                    Value::Union(1, Box::new(Value::TimestampMillis(1_704_067_210_000))),
                ),
                ("day".into(), Value::Union(1, Box::new(Value::Date(19_723)))),
                (
                    "tags".into(),
                    Value::Union(
                        1,
                        Box::new(Value::Array(vec![
                            Value::Union(1, Box::new(Value::String("a".into()))),
                            Value::Union(0, Box::new(Value::Null)),
                        ])),
                    ),
                ),
                (
                    "attrs".into(),
                    Value::Union(
                        1,
                        Box::new(Value::Map(
                            [
                                ("b".to_string(), Value::Union(1, Box::new(Value::Int(2)))),
                                ("a".to_string(), Value::Union(0, Box::new(Value::Null))),
                            ]
                            .into_iter()
                            .collect(),
                        )),
                    ),
                ),
                (
                    "at".into(),
                    Value::Union(
                        1,
                        Box::new(Value::Record(vec![
                            ("x".into(), Value::Int(-3)),
                            ("label".into(), Value::Union(0, Box::new(Value::Null))),
                        ])),
                    ),
                ),
                ("small".into(), Value::Union(1, Box::new(Value::Int(-300)))),
                ("ok".into(), Value::Union(1, Box::new(Value::Boolean(true)))),
                ("ratio".into(), Value::Union(1, Box::new(Value::Double(0.25)))),
            ]),
            Value::Record(
                schema
                    .fields()
                    .iter()
                    .map(|c| {
                        let v = if c.name() == "id" {
                            Value::Long(2)
                        } else {
                            Value::Union(0, Box::new(Value::Null))
                        };
                        (c.name().clone(), v)
                    })
                    .collect(),
            ),
        ];
        let datums: Vec<Vec<u8>> = rows
            .iter()
            .map(|r| apache_avro::to_avro_datum(&f.schema, r.clone()).expect("a datum"))
            .collect();
        let parts: Vec<&[u8]> = datums.iter().map(Vec::as_slice).collect();
        let batch = f.decode(&parts).expect("decodes");
        assert_eq!(batch.num_rows(), 2);
        let text = arrow::util::pretty::pretty_format_batches(std::slice::from_ref(&batch))
            .expect("prints")
            .to_string();
        for expected in [
            "Oslo",
            "-123.45",
            "2024-01-01T00:00:10",
            "2024-01-01",
            "{a: , b: 2}",
            "-300",
            "0.25",
        ] {
            assert!(text.contains(expected), "{expected} in\n{text}");
        }
        assert!(batch.column(1).is_null(1), "the second row's NULLs");
        // Written back: the same rows (a map's entries may come in another
        // order: Avro maps have none).
        let written = f.encode(&batch).expect("encodes");
        let parts: Vec<&[u8]> = written.iter().map(Vec::as_slice).collect();
        assert_eq!(f.decode(&parts).expect("decodes again"), batch);
    }

    #[test]
    fn bad_datums_are_errors_that_say_why() {
        let f = AvroFormat::new(&columns(), true).expect("a schema");
        let e = f.decode(&[b"\x02".as_slice()]).expect_err("truncated");
        assert!(e.contains("ends after 1 bytes"), "{e}");
        // A string of negative length.
        let e = f.decode(&[b"\x02\x02\x7F".as_slice()]).expect_err("bad length");
        assert!(e.contains("not an Avro record"), "{e}");
        let id_only = Arc::new(ArrowSchema::new(vec![field("id", DataType::Int64, false)]));
        let g = AvroFormat::new(&id_only, true).expect("a schema");
        let e = g.decode(&[b"\x02\x04".as_slice()]).expect_err("trailing bytes");
        assert!(e.contains("1 bytes after"), "{e}");
        let nanos = Arc::new(ArrowSchema::new(vec![field(
            "t",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            true,
        )]));
        let e = AvroFormat::new(&nanos, true).expect_err("no Avro type");
        assert!(e.contains("column 't'"), "{e}");
    }

    #[test]
    fn decimals_are_javas_shortest_twos_complement() {
        for (v, bytes) in [
            (0i128, vec![0u8]),
            (127, vec![0x7F]),
            (128, vec![0x00, 0x80]),
            (-1, vec![0xFF]),
            (-128, vec![0x80]),
            (-129, vec![0xFF, 0x7F]),
        ] {
            assert_eq!(bytes_of(v), bytes, "{v}");
            assert_eq!(unscaled_of(&bytes).expect("fits"), v);
        }
    }
}
