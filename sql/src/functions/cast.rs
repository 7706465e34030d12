//! `CAST(x AS STRING)` as Flink writes values: `TRUE`/`FALSE`, doubles as
//! Java's `Double.toString` (`8.5E37`, `1.0`, `Infinity`), timestamps as
//! `yyyy-MM-dd HH:mm:ss` with the type's fraction digits, arrays as
//! `[1, NULL]`, maps as `{a=1}`, rows as `(1, x)`. DataFusion (Arrow's
//! display) writes `true`, `8.5e37`, `2024-01-02T03:04:05` and `[1, ]`.
//!
//! The planner rewrites every cast to a string type whose input is one of
//! those types into [`FlinkToString`] (see [`crate::passes::casts`]), so explicit
//! casts, `TRY_CAST`, and the casts DataFusion's type coercion inserts
//! (`CONCAT` of a number, `||`) all write Flink's text.

use std::fmt::Write;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::datatypes::{
    DataType, Date32Type, Float32Type, Float64Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

/// Name of the UDF the planner puts in place of such casts.
pub use crate::functions::names::TO_STRING;

/// Whether DataFusion's text of a `t` differs from Flink's.
pub(crate) fn needs_flink_text(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Boolean
            | DataType::Float32
            | DataType::Float64
            | DataType::Timestamp(_, _)
            | DataType::Date32
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::Map(_, _)
            | DataType::Struct(_)
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    )
}

pub(crate) fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Flink's text of each value of `x` (NULL stays NULL).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkToString {
    signature: Signature,
}

impl FlinkToString {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::any(1, Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for FlinkToString {
    fn name(&self) -> &str {
        TO_STRING
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [x] = args.args.as_slice() else {
            return datafusion::common::exec_err!("{TO_STRING} takes one argument");
        };
        match x {
            ColumnarValue::Array(a) => Ok(ColumnarValue::Array(to_strings(a)?)),
            ColumnarValue::Scalar(s) => {
                let a = to_strings(&s.to_array()?)?;
                Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&a, 0)?))
            }
        }
    }
}

/// Flink's text of every value of `a`.
pub fn to_strings(a: &ArrayRef) -> Result<ArrayRef> {
    let mut out = StringBuilder::with_capacity(a.len(), a.len() * 8);
    let mut text = String::new();
    for i in 0..a.len() {
        if a.is_null(i) {
            out.append_null();
            continue;
        }
        text.clear();
        write_value(a, i, &mut text)?;
        out.append_value(&text);
    }
    Ok(Arc::new(out.finish()))
}

/// Appends Flink's text of `a[i]` (not NULL) to `out`; NULLs nested in
/// arrays, maps and rows are written `NULL`, as Flink does.
fn write_value(a: &dyn Array, i: usize, out: &mut String) -> Result<()> {
    let nested = |a: &dyn Array, i: usize, out: &mut String| -> Result<()> {
        if a.is_null(i) {
            out.push_str("NULL");
            Ok(())
        } else {
            write_value(a, i, out)
        }
    };
    match a.data_type() {
        DataType::Boolean => out.push_str(if a.as_boolean().value(i) { "TRUE" } else { "FALSE" }),
        // Bytes read as UTF-8, malformed bytes as U+FFFD (Java's decoder);
        // Arrow's cast fails on them.
        DataType::Binary => out.push_str(&String::from_utf8_lossy(a.as_binary::<i32>().value(i))),
        DataType::LargeBinary => out.push_str(&String::from_utf8_lossy(a.as_binary::<i64>().value(i))),
        DataType::BinaryView => out.push_str(&String::from_utf8_lossy(a.as_binary_view().value(i))),
        DataType::Float64 => java_double(a.as_primitive::<Float64Type>().value(i), out),
        DataType::Float32 => java_float(a.as_primitive::<Float32Type>().value(i), out),
        DataType::Date32 => {
            let d = a.as_primitive::<Date32Type>().value_as_date(i);
            match d {
                Some(d) => {
                    let _ = write!(out, "{}", d.format("%Y-%m-%d"));
                }
                None => return datafusion::common::exec_err!("a DATE out of range"),
            }
        }
        DataType::Timestamp(unit, _) => {
            let (t, digits) = match unit {
                TimeUnit::Second => (a.as_primitive::<TimestampSecondType>().value_as_datetime(i), 0),
                TimeUnit::Millisecond => (a.as_primitive::<TimestampMillisecondType>().value_as_datetime(i), 3),
                TimeUnit::Microsecond => (a.as_primitive::<TimestampMicrosecondType>().value_as_datetime(i), 6),
                TimeUnit::Nanosecond => (a.as_primitive::<TimestampNanosecondType>().value_as_datetime(i), 9),
            };
            let Some(t) = t else {
                return datafusion::common::exec_err!("a TIMESTAMP out of range");
            };
            // A TIMESTAMP_LTZ is written in UTC here; in a session with
            // another zone, `flink_zone` has cast it to the zone's wall
            // time before it gets here.
            let _ = write!(out, "{}", t.format("%Y-%m-%d %H:%M:%S"));
            if digits > 0 {
                let nanos = t.and_utc().timestamp_subsec_nanos();
                let frac = format!("{nanos:09}");
                out.push('.');
                out.push_str(&frac[..digits]);
            }
        }
        DataType::List(_) | DataType::LargeList(_) => {
            let values = match a.data_type() {
                DataType::List(_) => a.as_list::<i32>().value(i),
                _ => a.as_list::<i64>().value(i),
            };
            out.push('[');
            for j in 0..values.len() {
                if j > 0 {
                    out.push_str(", ");
                }
                nested(values.as_ref(), j, out)?;
            }
            out.push(']');
        }
        DataType::Map(_, _) => {
            let entries = a.as_map().value(i);
            out.push('{');
            for j in 0..entries.len() {
                if j > 0 {
                    out.push_str(", ");
                }
                nested(entries.column(0).as_ref(), j, out)?;
                out.push('=');
                nested(entries.column(1).as_ref(), j, out)?;
            }
            out.push('}');
        }
        DataType::Struct(_) => {
            let row = a.as_struct();
            out.push('(');
            for (c, col) in row.columns().iter().enumerate() {
                if c > 0 {
                    out.push_str(", ");
                }
                nested(col.as_ref(), i, out)?;
            }
            out.push(')');
        }
        _ => {
            let text = arrow::util::display::array_value_to_string(a, i)?;
            out.push_str(&text);
        }
    }
    Ok(())
}

pub use weir_engine::java_text::{java_double, java_float};

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: f64) -> String {
        let mut s = String::new();
        java_double(v, &mut s);
        s
    }

    #[test]
    fn doubles_read_as_java_writes_them() {
        assert_eq!(d(2.5), "2.5");
        assert_eq!(d(-0.5), "-0.5");
        assert_eq!(d(100.0), "100.0");
        assert_eq!(d(8.5e37), "8.5E37");
        assert_eq!(d(1e7), "1.0E7");
        assert_eq!(d(1e-5), "1.0E-5");
        assert_eq!(d(0.001), "0.001");
        assert_eq!(d(0.0), "0.0");
        assert_eq!(d(-0.0), "-0.0");
        assert_eq!(d(0.1 * 0.1), "0.010000000000000002");
        assert_eq!(d(f64::INFINITY), "Infinity");
        assert_eq!(d(f64::NAN), "NaN");
    }
}
