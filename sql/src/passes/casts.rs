//! The cast pass: every cast to a string type whose input Flink writes
//! differently becomes [`FlinkToString`] (explicit casts, `TRY_CAST`, and
//! the casts DataFusion's type coercion inserts for `CONCAT` of a number
//! or `||`), numeric narrowing casts wrap as Java's do, and the functions
//! whose arguments Flink reads as text get Flink's text.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ExprSchema, Result, ScalarValue};
use datafusion::logical_expr::expr::{Cast, ScalarFunction, TryCast};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

use crate::functions::cast::{FlinkToString, TO_STRING, is_string, needs_flink_text};
use crate::passes::rewrite_expressions;

/// Rewrites, in every expression of `plan`, casts to a string of values
/// whose text Flink writes differently into [`FlinkToString`].
pub fn flink_casts(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    rewrite_expressions(plan, flink_casts_in)
}

/// [`flink_casts`] in one expression over `schema`.
pub fn flink_casts_in(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    e.transform_up(|e| {
        if let Expr::ScalarFunction(call) = &e {
            refuse_multiset_argument(call, schema)?;
            return flink_function(call, &e, schema);
        }
        if let Expr::BinaryExpr(b) = &e {
            return crate::functions::decimal::binary(b, &e, schema);
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
        crate::functions::names::JAVA_NARROW
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
        name @ ("rand" | "rand_integer") => Ok(match crate::functions::clock::Rand::for_call(name, &call.args) {
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
                Arc::new(crate::functions::scalars::substr()),
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
