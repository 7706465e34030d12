//! Flink SQL types as Arrow types, and back for `DESCRIBE`.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, TimeUnit};
use sqlparser::ast::{self, ExactNumberInfo, TimezoneInfo};

use crate::error::{Result, SqlError};

fn time_unit(precision: u64) -> TimeUnit {
    match precision {
        0..=3 => TimeUnit::Millisecond,
        4..=6 => TimeUnit::Microsecond,
        _ => TimeUnit::Nanosecond,
    }
}

/// The Arrow type and Flink's name of a declared column type.
/// Flink's types DataFusion does not know, where a query names a type
/// (`CAST(x AS TIMESTAMP_LTZ(3))`); the rest are DataFusion's.
#[derive(Debug)]
pub struct FlinkTypes;

impl datafusion::logical_expr::planner::TypePlanner for FlinkTypes {
    fn plan_type_field(
        &self,
        sql_type: &ast::DataType,
    ) -> datafusion::common::Result<Option<arrow::datatypes::FieldRef>> {
        let t = match sql_type {
            // `TIME(p)`: DataFusion knows only TIME without precision.
            ast::DataType::Time(Some(p), TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => match p {
                0 => DataType::Time32(TimeUnit::Second),
                1..=3 => DataType::Time32(TimeUnit::Millisecond),
                4..=6 => DataType::Time64(TimeUnit::Microsecond),
                _ => DataType::Time64(TimeUnit::Nanosecond),
            },
            // A cast to TIMESTAMP_LTZ(0) drops the fraction, as Flink's.
            ast::DataType::Custom(name, modifiers)
                if name.to_string().eq_ignore_ascii_case("TIMESTAMP_LTZ")
                    && modifiers.first().is_some_and(|m| m == "0") =>
            {
                DataType::Timestamp(TimeUnit::Second, Some("UTC".into()))
            }
            ast::DataType::Custom(name, _) if name.to_string().eq_ignore_ascii_case("TIMESTAMP_LTZ") => {
                to_arrow(sql_type)
                    .map_err(|e| datafusion::error::DataFusionError::Plan(e.to_string()))?
                    .0
            }
            _ => return Ok(None),
        };
        Ok(Some(Arc::new(arrow::datatypes::Field::new("", t, true))))
    }
}

pub fn to_arrow(t: &ast::DataType) -> Result<(DataType, String)> {
    use ast::DataType as T;
    Ok(match t {
        T::Boolean | T::Bool => (DataType::Boolean, "BOOLEAN".into()),
        T::TinyInt(_) => (DataType::Int8, "TINYINT".into()),
        T::SmallInt(_) => (DataType::Int16, "SMALLINT".into()),
        T::Int(_) | T::Integer(_) => (DataType::Int32, "INT".into()),
        T::BigInt(_) => (DataType::Int64, "BIGINT".into()),
        T::Float(_) | T::Real => (DataType::Float32, "FLOAT".into()),
        T::Double(_) | T::DoublePrecision => (DataType::Float64, "DOUBLE".into()),
        T::Decimal(info) | T::Numeric(info) | T::Dec(info) => {
            let (p, s) = match info {
                ExactNumberInfo::None => (10, 0),
                ExactNumberInfo::Precision(p) => (*p, 0),
                ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s as u64),
            };
            if !(1..=38).contains(&p) || s > p {
                return Err(SqlError::plan(format!(
                    "DECIMAL({p}, {s}) is out of range: precision 1..=38, scale 0..=precision"
                )));
            }
            (DataType::Decimal128(p as u8, s as i8), format!("DECIMAL({p}, {s})"))
        }
        T::String(_) | T::Text => (DataType::Utf8, "STRING".into()),
        T::Varchar(n) | T::CharacterVarying(n) | T::CharVarying(n) => {
            let name = match n {
                Some(ast::CharacterLength::IntegerLength { length, .. }) => format!("VARCHAR({length})"),
                _ => "STRING".into(),
            };
            (DataType::Utf8, name)
        }
        T::Char(n) | T::Character(n) => {
            let len = match n {
                Some(ast::CharacterLength::IntegerLength { length, .. }) => *length,
                _ => 1,
            };
            (DataType::Utf8, format!("CHAR({len})"))
        }
        T::Bytea | T::Bytes(_) | T::Binary(_) | T::Varbinary(_) | T::Blob(_) => (DataType::Binary, "BYTES".into()),
        T::Date => (DataType::Date32, "DATE".into()),
        T::Array(
            ast::ArrayElemTypeDef::AngleBracket(inner)
            | ast::ArrayElemTypeDef::SquareBracket(inner, _)
            | ast::ArrayElemTypeDef::Parenthesis(inner),
        ) => {
            let (elem, name) = to_arrow(inner)?;
            (DataType::new_list(elem, true), format!("ARRAY<{name}>"))
        }
        T::Map(elem, count) if is_multiset_count(count) => {
            let (e, e_name) = to_arrow(elem)?;
            (weir_engine::multiset::data_type(e), format!("MULTISET<{e_name}>"))
        }
        T::Map(key, value) => {
            let (k, k_name) = to_arrow(key)?;
            let (v, v_name) = to_arrow(value)?;
            (map_type(k, v), format!("MAP<{k_name}, {v_name}>"))
        }
        T::Struct(fields, _) => {
            let mut arrow_fields = Vec::with_capacity(fields.len());
            let mut names = Vec::with_capacity(fields.len());
            for (i, f) in fields.iter().enumerate() {
                let name = f
                    .field_name
                    .as_ref()
                    .map_or_else(|| format!("EXPR${i}"), |n| n.value.clone());
                if arrow_fields.iter().any(|a: &Field| a.name() == &name) {
                    return Err(SqlError::plan(format!("ROW field '{name}' is declared twice")));
                }
                let (t, t_name) = to_arrow(&f.field_type)?;
                names.push(format!("`{name}` {t_name}"));
                arrow_fields.push(Field::new(name, t, true));
            }
            (
                DataType::Struct(arrow_fields.into()),
                format!("ROW<{}>", names.join(", ")),
            )
        }
        T::Timestamp(p, tz) => {
            let p = p.unwrap_or(6);
            match tz {
                TimezoneInfo::None | TimezoneInfo::WithoutTimeZone => {
                    (DataType::Timestamp(time_unit(p), None), format!("TIMESTAMP({p})"))
                }
                _ => (
                    DataType::Timestamp(time_unit(p), Some("UTC".into())),
                    format!("TIMESTAMP_LTZ({p})"),
                ),
            }
        }
        T::Custom(name, modifiers) => {
            let n = name.to_string().to_ascii_uppercase();
            match n.as_str() {
                "TIMESTAMP_LTZ" => {
                    let p: u64 = match modifiers.first() {
                        Some(m) => m
                            .parse()
                            .map_err(|_| SqlError::plan(format!("invalid precision '{m}' for TIMESTAMP_LTZ")))?,
                        None => 6,
                    };
                    (
                        DataType::Timestamp(time_unit(p), Some("UTC".into())),
                        format!("TIMESTAMP_LTZ({p})"),
                    )
                }
                "BYTES" => (DataType::Binary, "BYTES".into()),
                "STRING" => (DataType::Utf8, "STRING".into()),
                _ => return Err(SqlError::unsupported(format!("type {name} is not supported"))),
            }
        }
        other => return Err(SqlError::unsupported(format!("type {other} is not supported"))),
    })
}

/// sqlparser has no MULTISET type: the parser gives `MULTISET<T>` as a
/// map from `T` to this marker type, which only [`to_arrow`] reads.
const MULTISET_COUNT: &str = "WEIR_MULTISET_COUNT";

/// The parsed form of `MULTISET<elem>` ([`MULTISET_COUNT`]).
pub fn multiset_ast(elem: ast::DataType) -> ast::DataType {
    let count = ast::DataType::Custom(ast::ObjectName::from(vec![ast::Ident::new(MULTISET_COUNT)]), vec![]);
    ast::DataType::Map(Box::new(elem), Box::new(count))
}

fn is_multiset_count(t: &ast::DataType) -> bool {
    matches!(t, ast::DataType::Custom(name, _) if name.to_string() == MULTISET_COUNT)
}

/// Arrow's type of Flink's `MAP<K, V>`: entries of a non-null key and a
/// nullable value, unsorted (DataFusion's `make_map` builds the same).
pub fn map_type(key: DataType, value: DataType) -> DataType {
    let entries = Field::new(
        "entries",
        DataType::Struct(vec![Field::new("key", key, false), Field::new("value", value, true)].into()),
        false,
    );
    DataType::Map(Arc::new(entries), false)
}

// Flink's names of types: the engine's too (its messages name columns'
// types as users declared them).
pub use weir_engine::type_names::{flink_field_type, flink_name};

/// Whether `t` can be a rowtime (event-time) column: TIMESTAMP(3) or
/// TIMESTAMP_LTZ(3), as in Flink.
pub fn is_rowtime_type(t: &DataType) -> bool {
    matches!(t, DataType::Timestamp(TimeUnit::Millisecond, _))
}
