//! Flink's names of Arrow types, as a DDL declares them and `TYPEOF`
//! prints them: what every message about a column's type says (never
//! Arrow's `Int64` or `Utf8`).

use arrow::datatypes::{DataType, TimeUnit};

/// Flink's name for an Arrow type (columns whose type was inferred).
pub fn flink_name(t: &DataType) -> String {
    match t {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::UInt64 => "BIGINT".into(),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p}, {s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "STRING".into(),
        DataType::Binary | DataType::LargeBinary => "BYTES".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Time32(TimeUnit::Second) => "TIME(0)".into(),
        DataType::Time32(_) => "TIME(3)".into(),
        DataType::Time64(TimeUnit::Microsecond) => "TIME(6)".into(),
        DataType::Time64(_) => "TIME(9)".into(),
        DataType::Timestamp(u, tz) => {
            let p = match u {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            };
            if tz.is_some() {
                format!("TIMESTAMP_LTZ({p})")
            } else {
                format!("TIMESTAMP({p})")
            }
        }
        DataType::Null => "NULL".into(),
        DataType::List(f) | DataType::LargeList(f) => format!("ARRAY<{}>", flink_field_type(f)),
        DataType::Map(..) if crate::multiset::element_type(t).is_some() => {
            let elem = crate::multiset::element_type(t).map_or_else(String::new, flink_name);
            format!("MULTISET<{elem}>")
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                // Arrow's map keys are never NULL; Flink's type of a
                // declared `MAP<STRING, V>` has no `NOT NULL` either.
                format!("MAP<{}, {}>", flink_name(kv[0].data_type()), flink_field_type(&kv[1]))
            }
            other => other.to_string(),
        },
        DataType::Struct(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .map(|f| format!("`{}` {}", f.name(), flink_field_type(f)))
                .collect();
            format!("ROW<{}>", fields.join(", "))
        }
        other => other.to_string(),
    }
}

/// Flink's name of a field's type, `NOT NULL` when it holds no NULLs (as
/// `TYPEOF` prints it).
pub fn flink_field_type(f: &arrow::datatypes::Field) -> String {
    if f.is_nullable() {
        flink_name(f.data_type())
    } else {
        format!("{} NOT NULL", flink_name(f.data_type()))
    }
}
