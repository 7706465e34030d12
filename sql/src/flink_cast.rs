//! `CAST(x AS STRING)` as Flink writes values: `TRUE`/`FALSE`, doubles as
//! Java's `Double.toString` (`8.5E37`, `1.0`, `Infinity`), timestamps as
//! `yyyy-MM-dd HH:mm:ss` with the type's fraction digits, arrays as
//! `[1, NULL]`, maps as `{a=1}`, rows as `(1, x)`. DataFusion (Arrow's
//! display) writes `true`, `8.5e37`, `2024-01-02T03:04:05` and `[1, ]`.
//!
//! The planner rewrites every cast to a string type whose input is one of
//! those types into [`FlinkToString`] (see [`flink_casts`]), so explicit
//! casts, `TRY_CAST`, and the casts DataFusion's type coercion inserts
//! (`CONCAT` of a number, `||`) all write Flink's text.

use std::fmt::Write;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::datatypes::{
    DataType, Date32Type, Float32Type, Float64Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ExprSchema, Result, ScalarValue};
use datafusion::logical_expr::expr::{Cast, ScalarFunction, TryCast};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

/// Name of the UDF the planner puts in place of such casts.
pub const TO_STRING: &str = "__weir_flink_to_string";

/// Whether DataFusion's text of a `t` differs from Flink's.
fn needs_flink_text(t: &DataType) -> bool {
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

fn is_string(t: &DataType) -> bool {
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

/// Rewrites, in every expression of `plan`, casts to a string of values
/// whose text Flink writes differently into [`FlinkToString`].
pub fn flink_casts(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    rewrite_expressions(plan, flink_casts_in)
}

/// Rewrites every expression of every node of `plan` (subqueries
/// included) with `f`, given the schema the expression reads.
pub fn rewrite_expressions(
    plan: LogicalPlan,
    f: impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<Transformed<LogicalPlan>> {
    plan.transform_up_with_subqueries(|node| {
        let schema = match node.inputs().as_slice() {
            [] => return Ok(Transformed::no(node)),
            [one] => one.schema().clone(),
            many => {
                let mut merged = many[0].schema().as_ref().clone();
                for s in &many[1..] {
                    merged.merge(s.schema());
                }
                Arc::new(merged)
            }
        };
        // Rewritten expressions keep their names (nodes above refer to
        // columns by them) and the node its schema recomputed (EXTRACT
        // becomes BIGINT).
        let names = datafusion::logical_expr::expr_rewriter::NamePreserver::new(&node);
        let t = node.map_expressions(|e| {
            let saved = names.save(&e);
            Ok(f(e, &schema)?.update_data(|e| saved.restore(e)))
        })?;
        if t.transformed {
            t.map_data(|n| n.recompute_schema())
        } else {
            Ok(t)
        }
    })
}

/// [`flink_casts`] in one expression over `schema`.
pub fn flink_casts_in(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    e.transform_up(|e| {
        if let Expr::ScalarFunction(call) = &e {
            refuse_multiset_argument(call, schema)?;
            return flink_function(call, &e, schema);
        }
        if let Expr::BinaryExpr(b) = &e {
            return crate::flink_decimal::binary(b, &e, schema);
        }
        let (inner, to) = match &e {
            Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => (expr, field.data_type()),
            _ => return Ok(Transformed::no(e)),
        };
        if !is_string(to) {
            return numeric_cast(&e, inner, to, schema);
        }
        let from = match inner.get_type(schema as &dyn ExprSchema) {
            Ok(t) => t,
            Err(_) => return Ok(Transformed::no(e)),
        };
        if !needs_flink_text(&from) {
            return Ok(Transformed::no(e));
        }
        let to = to.clone();
        let call = Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(FlinkToString::udf()),
            vec![inner.as_ref().clone()],
        ));
        let call = if to == DataType::Utf8 {
            call
        } else {
            Expr::Cast(Cast::new(Box::new(call), to))
        };
        Ok(Transformed::yes(call))
    })
}

/// Casts between numbers as Flink's generated Java: a DOUBLE or FLOAT to
/// an integer type is Java's narrowing (`(int) 8.5E37` is 2147483647,
/// NaN 0, `(byte)` wraps what `(int)` gives), where DataFusion fails the
/// query; a number out of a DECIMAL's range is NULL (DataFusion: an
/// error), which is a TRY_CAST.
fn numeric_cast(e: &Expr, inner: &Expr, to: &DataType, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Ok(from) = inner.get_type(schema as &dyn ExprSchema) else {
        return Ok(Transformed::no(e.clone()));
    };
    // Digits before the point a value of `t` may have (`None`: any).
    let integer_digits = |t: &DataType| -> Option<i32> {
        match t {
            DataType::Int8 | DataType::UInt8 => Some(3),
            DataType::Int16 | DataType::UInt16 => Some(5),
            DataType::Int32 | DataType::UInt32 => Some(10),
            DataType::Int64 => Some(19),
            DataType::UInt64 => Some(20),
            DataType::Decimal128(p, s) => Some(i32::from(*p) - i32::from(*s)),
            _ => None,
        }
    };
    let number = |t: &DataType| t.is_integer() || t.is_floating() || matches!(t, DataType::Decimal128(..));
    // Only a cast that can overflow (not the planner's widening ones,
    // which the DECIMAL arithmetic rules read as casts).
    let can_overflow = match (integer_digits(&from), to) {
        (Some(have), DataType::Decimal128(p, s)) => have > i32::from(*p) - i32::from(*s),
        _ => true,
    };
    if matches!(to, DataType::Decimal128(..)) && number(&from) && can_overflow {
        if let Expr::Cast(Cast { expr, field }) = e {
            return Ok(Transformed::yes(Expr::TryCast(TryCast::new_from_field(
                expr.clone(),
                field.clone(),
            ))));
        }
        return Ok(Transformed::no(e.clone()));
    }
    let narrower = |t: &DataType| integer_digits(t).unwrap_or(0) < integer_digits(&from).unwrap_or(0);
    let narrowing = from.is_floating() || (from.is_integer() && narrower(to));
    if narrowing && matches!(to, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64) {
        return Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(ScalarUDF::new_from_impl(JavaNarrow {
                to: to.clone(),
                signature: Signature::any(1, Volatility::Immutable),
            })),
            vec![inner.clone()],
        ))));
    }
    Ok(Transformed::no(e.clone()))
}

/// Java's narrowing to an integer type: of a floating-point value toward
/// zero, saturating, NaN 0 (Rust's `as` to i32/i64 is the same rule); of
/// a wider integer, its low bits (`(byte) 2147483647` is -1), where
/// DataFusion's cast fails the query.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JavaNarrow {
    to: DataType,
    signature: Signature,
}

impl ScalarUDFImpl for JavaNarrow {
    fn name(&self) -> &str {
        "__weir_java_narrow"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.to.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use arrow::datatypes::{Float64Type, Int8Type, Int16Type, Int32Type, Int64Type};
        let [x] = args.args.as_slice() else {
            return datafusion::common::exec_err!("CAST takes one value");
        };
        let scalar = matches!(x, ColumnarValue::Scalar(_));
        if x.data_type().is_integer() {
            let a = arrow::compute::cast(&x.to_array(1)?, &DataType::Int64)?;
            let v = a.as_primitive::<Int64Type>();
            let out: ArrayRef = match self.to {
                DataType::Int8 => Arc::new(v.unary::<_, Int8Type>(|v| v as i8)),
                DataType::Int16 => Arc::new(v.unary::<_, Int16Type>(|v| v as i16)),
                DataType::Int32 => Arc::new(v.unary::<_, Int32Type>(|v| v as i32)),
                _ => Arc::new(v.clone()),
            };
            return crate::udf::columnar(out, scalar);
        }
        let a = arrow::compute::cast(&x.to_array(1)?, &DataType::Float64)?;
        let d = a.as_primitive::<Float64Type>();
        let out: ArrayRef = match self.to {
            DataType::Int8 => Arc::new(d.unary::<_, Int8Type>(|v| v as i32 as i8)),
            DataType::Int16 => Arc::new(d.unary::<_, Int16Type>(|v| v as i32 as i16)),
            DataType::Int32 => Arc::new(d.unary::<_, Int32Type>(|v| v as i32)),
            _ => Arc::new(d.unary::<_, Int64Type>(|v| v as i64)),
        };
        if scalar {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?));
        }
        Ok(ColumnarValue::Array(out))
    }
}

/// Flink has no function of a MULTISET but `CAST(m AS STRING)` and
/// `TYPEOF` (`CARDINALITY(m)` fails in Flink 2.3's code generator); a
/// MULTISET is an Arrow map here, and a map function would answer as if
/// the counts were a map's values.
fn refuse_multiset_argument(call: &ScalarFunction, schema: &DFSchema) -> Result<()> {
    let name = call.func.name();
    if name == TO_STRING || name == "typeof" {
        return Ok(());
    }
    for a in &call.args {
        if let Ok(t) = a.get_type(schema as &dyn ExprSchema)
            && weir_engine::multiset::element_type(&t).is_some()
        {
            return datafusion::common::plan_err!(
                "{}({}) of a {}: Flink has no function of a MULTISET but CAST(... AS STRING)",
                name.to_ascii_uppercase(),
                a.schema_name(),
                crate::types::flink_name(&t)
            );
        }
    }
    Ok(())
}

/// DataFusion functions the planner calls for SQL syntax (not by name, so
/// the registry's versions are not used): `SUBSTRING(s FROM p FOR n)` is
/// Flink's substring; `EXTRACT` is BIGINT, and its `DOW` counts from
/// Sunday = 1 (DataFusion's from 0).
fn flink_function(call: &ScalarFunction, e: &Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match call.func.name() {
        // Each call with a literal seed (or none) has its own generator.
        name @ ("rand" | "rand_integer") => Ok(match crate::flink_clock::Rand::for_call(name, &call.args) {
            Some(udf) => Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
                Arc::new(udf),
                call.args.clone(),
            ))),
            None => Transformed::no(e.clone()),
        }),
        // Flink's CEIL/FLOOR of a DECIMAL(p, s) is a DECIMAL(p, 0);
        // DataFusion's keeps (p, s), where CEIL(99999999.99) overflows a
        // DECIMAL(10, 2). Computed one digit wider, then typed as Flink.
        "ceil" | "floor" => {
            let arg = call.args.first();
            let Some(DataType::Decimal128(p, s)) = arg.and_then(|a| a.get_type(schema as &dyn ExprSchema).ok()) else {
                return Ok(Transformed::no(e.clone()));
            };
            if s <= 0 {
                return Ok(Transformed::no(e.clone()));
            }
            let wide = Expr::Cast(Cast::new(
                Box::new(call.args[0].clone()),
                DataType::Decimal128((p + 1).min(38), s),
            ));
            let inner = Expr::ScalarFunction(ScalarFunction::new_udf(call.func.clone(), vec![wide]));
            Ok(Transformed::yes(Expr::Cast(Cast::new(
                Box::new(inner),
                DataType::Decimal128(p, 0),
            ))))
        }
        // Weir's takes any arguments; DataFusion's has typed ones.
        "substr" if call.func.signature().type_signature != datafusion::logical_expr::TypeSignature::VariadicAny => {
            Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
                Arc::new(crate::flink_scalars::substr()),
                call.args.clone(),
            ))))
        }
        "date_part" => {
            let part = match call.args.first() {
                Some(Expr::Literal(ScalarValue::Utf8(Some(p)), _)) => p.to_ascii_lowercase(),
                _ => return Ok(Transformed::no(e.clone())),
            };
            if part == "epoch" {
                return Ok(Transformed::no(e.clone()));
            }
            let as_bigint = Expr::Cast(Cast::new(Box::new(e.clone()), DataType::Int64));
            Ok(Transformed::yes(if part == "dow" {
                as_bigint + Expr::Literal(ScalarValue::Int64(Some(1)), None)
            } else {
                as_bigint
            }))
        }
        _ => Ok(Transformed::no(e.clone())),
    }
}

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
