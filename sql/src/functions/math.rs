//! Flink's `SIGN` and `TRUNCATE`: typed as their argument (DataFusion's
//! `signum`/`trunc` answer DOUBLE), computed on the values' own
//! representation.
//!
//! - `SIGN(x)` is -1, 0 or 1 in `x`'s type (`1.00` for a `DECIMAL(10, 2)`);
//!   a DOUBLE keeps Java's `Math.signum` (NaN stays NaN).
//! - `TRUNCATE(x[, n])` cuts towards zero at `n` decimals (default 0;
//!   negative `n` zeroes integer digits). A DECIMAL(p, s) cut at `n < s`
//!   becomes DECIMAL(1 + p - s + n, n) (`n >= 0`) or
//!   DECIMAL(min(38, 1 + p - s), 0), as Flink derives it, so `n` must then
//!   be a literal; a DOUBLE is cut on its shortest decimal text, as Java's
//!   `BigDecimal.valueOf(x).setScale(n, DOWN)`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, PrimitiveArray};
use arrow::compute::cast;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Decimal128Type, Field, FieldRef, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type,
};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Sign,
    Truncate,
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkMath {
    op: Op,
    signature: Signature,
}

/// `SIGN` and `TRUNCATE`, to register.
pub fn all() -> Vec<ScalarUDF> {
    [Op::Sign, Op::Truncate]
        .into_iter()
        .map(|op| {
            ScalarUDF::new_from_impl(FlinkMath {
                op,
                signature: Signature::variadic_any(Volatility::Immutable),
            })
        })
        .collect()
}

/// The type of `TRUNCATE(x, n)` for a DECIMAL(p, s) `x` (Flink's
/// `LogicalTypeMerging.findRoundDecimalType`).
fn truncated_decimal(p: u8, s: i8, n: i32) -> DataType {
    let (p, s) = (i32::from(p), i32::from(s));
    if n >= s {
        return DataType::Decimal128(p as u8, s as i8);
    }
    if n < 0 {
        return DataType::Decimal128((1 + p - s).min(38) as u8, 0);
    }
    DataType::Decimal128((1 + p - s + n).min(38) as u8, n as i8)
}

/// `TRUNCATE`'s decimals when they are a literal (0 when absent).
fn literal_decimals(arg: Option<&Option<&ScalarValue>>) -> Result<Option<i32>> {
    match arg {
        None => Ok(Some(0)),
        Some(None) => Ok(None),
        Some(Some(v)) if v.is_null() => Ok(None),
        Some(Some(v)) => match v.cast_to(&DataType::Int32)? {
            ScalarValue::Int32(Some(n)) => Ok(Some(n)),
            _ => plan_err!("TRUNCATE: the number of decimals must be an integer, not {v}"),
        },
    }
}

impl FlinkMath {
    fn name_upper(&self) -> &'static str {
        match self.op {
            Op::Sign => "SIGN",
            Op::Truncate => "TRUNCATE",
        }
    }
}

impl ScalarUDFImpl for FlinkMath {
    fn name(&self) -> &str {
        match self.op {
            Op::Sign => "sign",
            Op::Truncate => "truncate",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        // `return_field_from_args` decides (TRUNCATE's type needs `n`).
        plan_err!("{}: internal: typed by its arguments", self.name_upper())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let name = self.name_upper();
        let arity = match self.op {
            Op::Sign => 1..=1,
            Op::Truncate => 1..=2,
        };
        if !arity.contains(&args.arg_fields.len()) {
            return plan_err!(
                "{name} takes {}, not {} arguments",
                if self.op == Op::Sign {
                    "one number"
                } else {
                    "a number and optionally a number of decimals"
                },
                args.arg_fields.len()
            );
        }
        let x = args.arg_fields[0].data_type();
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        let ty = match x {
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64 => x.clone(),
            DataType::Null => DataType::Null,
            DataType::Decimal128(p, s) if self.op == Op::Truncate => {
                match literal_decimals(args.scalar_arguments.get(1))? {
                    Some(n) => truncated_decimal(*p, *s, n),
                    None => {
                        return plan_err!(
                            "TRUNCATE of a DECIMAL: the number of decimals must be an integer literal (it decides the result's type)"
                        );
                    }
                }
            }
            DataType::Decimal128(..) => x.clone(),
            other => {
                return plan_err!("{name} takes a number, not {}", crate::types::flink_name(other));
            }
        };
        if let Some(n) = args.arg_fields.get(1)
            && !n.data_type().is_integer()
            && !n.data_type().is_null()
        {
            return plan_err!(
                "TRUNCATE: the number of decimals must be an integer, not {}",
                crate::types::flink_name(n.data_type())
            );
        }
        Ok(Arc::new(Field::new(self.name(), ty, nullable)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let x = args.args[0].to_array(rows)?;
        let n = match args.args.get(1) {
            Some(n) => Some(cast(&n.to_array(rows)?, &DataType::Int32)?),
            None => None,
        };
        let n = n.as_ref().map(|n| n.as_primitive::<Int32Type>());
        // The row's decimals (`None`: NULL, so the answer is NULL).
        let dec = |i: usize| -> Option<i32> {
            match n {
                None => Some(0),
                Some(n) if n.is_null(i) => None,
                Some(n) => Some(n.value(i)),
            }
        };
        let out: ArrayRef = match (self.op, x.data_type()) {
            (_, DataType::Null) => x.clone(),
            (Op::Sign, DataType::Int8) => Arc::new(map_int::<Int8Type>(&x, |v, _| v.signum(), &dec)),
            (Op::Sign, DataType::Int16) => Arc::new(map_int::<Int16Type>(&x, |v, _| v.signum(), &dec)),
            (Op::Sign, DataType::Int32) => Arc::new(map_int::<Int32Type>(&x, |v, _| v.signum(), &dec)),
            (Op::Sign, DataType::Int64) => Arc::new(map_int::<Int64Type>(&x, |v, _| v.signum(), &dec)),
            (Op::Sign, DataType::Float32) => {
                Arc::new(map_int::<Float32Type>(&x, |v, _| java_signum(v.into()) as f32, &dec))
            }
            (Op::Sign, DataType::Float64) => Arc::new(map_int::<Float64Type>(&x, |v, _| java_signum(v), &dec)),
            (Op::Sign, DataType::Decimal128(p, s)) => {
                let one = 10i128.pow(u32::try_from(*s).unwrap_or(0));
                let a: Decimal128Array = map_int::<Decimal128Type>(&x, |v, _| v.signum() * one, &dec);
                Arc::new(a.with_precision_and_scale(*p, *s)?)
            }
            (Op::Truncate, DataType::Int8) => {
                Arc::new(map_int::<Int8Type>(&x, |v, n| cut_int(v.into(), n) as i8, &dec))
            }
            (Op::Truncate, DataType::Int16) => {
                Arc::new(map_int::<Int16Type>(&x, |v, n| cut_int(v.into(), n) as i16, &dec))
            }
            (Op::Truncate, DataType::Int32) => {
                Arc::new(map_int::<Int32Type>(&x, |v, n| cut_int(v.into(), n) as i32, &dec))
            }
            (Op::Truncate, DataType::Int64) => Arc::new(map_int::<Int64Type>(&x, cut_int, &dec)),
            (Op::Truncate, DataType::Float32) => {
                Arc::new(map_int::<Float32Type>(&x, |v, n| cut_double(v.into(), n) as f32, &dec))
            }
            (Op::Truncate, DataType::Float64) => Arc::new(map_int::<Float64Type>(&x, cut_double, &dec)),
            (Op::Truncate, DataType::Decimal128(p, s)) => {
                let lit = match args.args.get(1) {
                    None => 0,
                    Some(ColumnarValue::Scalar(v)) => match v.cast_to(&DataType::Int32)? {
                        ScalarValue::Int32(Some(n)) => n,
                        _ => {
                            return Ok(ColumnarValue::Scalar(ScalarValue::try_from(
                                args.return_field.data_type(),
                            )?));
                        }
                    },
                    Some(_) => return exec_err!("TRUNCATE of a DECIMAL: the number of decimals must be a literal"),
                };
                let DataType::Decimal128(rp, rs) = truncated_decimal(*p, *s, lit) else {
                    return exec_err!("TRUNCATE: internal: not a DECIMAL");
                };
                let drop = i32::from(*s) - lit;
                let a: Decimal128Array = if drop <= 0 {
                    x.as_primitive::<Decimal128Type>().clone()
                } else {
                    let div = 10i128.checked_pow(drop as u32);
                    // A cut left of the point keeps the zeroes (scale 0).
                    let back = if lit < 0 {
                        10i128.checked_pow(lit.unsigned_abs())
                    } else {
                        Some(1)
                    };
                    x.as_primitive::<Decimal128Type>().unary(|v| match (div, back) {
                        (Some(d), Some(b)) => (v / d).saturating_mul(b),
                        _ => 0,
                    })
                };
                Arc::new(a.with_precision_and_scale(rp, rs)?)
            }
            (_, other) => return exec_err!("{}: not a number: {other}", self.name_upper()),
        };
        crate::udf::columnar(out, all_scalar)
    }
}

/// `f(value, decimals)` over a primitive array; NULL where either is.
fn map_int<T: ArrowPrimitiveType>(
    x: &ArrayRef,
    f: impl Fn(T::Native, i32) -> T::Native,
    dec: &dyn Fn(usize) -> Option<i32>,
) -> PrimitiveArray<T> {
    let x = x.as_primitive::<T>();
    (0..x.len())
        .map(|i| match (x.is_valid(i), dec(i)) {
            (true, Some(n)) => Some(f(x.value(i), n)),
            _ => None,
        })
        .collect()
}

/// Java's `Math.signum`: NaN and signed zeroes are kept.
fn java_signum(v: f64) -> f64 {
    if v.is_nan() || v == 0.0 { v } else { v.signum() }
}

/// An integer cut at `n` decimals: only a negative `n` changes it.
fn cut_int(v: i64, n: i32) -> i64 {
    if n >= 0 {
        return v;
    }
    match 10i64.checked_pow(n.unsigned_abs()) {
        Some(p) => v / p * p,
        None => 0,
    }
}

/// A DOUBLE cut at `n` decimals on its shortest decimal text (Java's
/// `BigDecimal.valueOf(v).setScale(n, RoundingMode.DOWN).doubleValue()`).
fn cut_double(v: f64, n: i32) -> f64 {
    if !v.is_finite() {
        return v;
    }
    // Rust's `{}` of an f64 is the shortest text that reads back exactly,
    // without an exponent, as Java's `Double.toString` digits.
    let text = format!("{}", v.abs());
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let cut = if n >= 0 {
        let keep = (n as usize).min(frac.len());
        format!("{int}.{}", &frac[..keep])
    } else {
        let k = n.unsigned_abs() as usize;
        if k >= int.len() {
            "0".to_string()
        } else {
            format!("{}{}", &int[..int.len() - k], "0".repeat(k))
        }
    };
    let r: f64 = cut.trim_end_matches('.').parse().unwrap_or(0.0);
    // BigDecimal has no negative zero.
    if r == 0.0 { 0.0 } else { r.copysign(v) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_cut_on_their_shortest_text() {
        assert_eq!(cut_double(2.5, 0), 2.0);
        assert_eq!(cut_double(-0.5, 0).to_bits(), 0.0f64.to_bits());
        assert_eq!(cut_double(0.1 + 0.2, 2), 0.3);
        assert_eq!(cut_double(1234.5678, -2), 1200.0);
        assert_eq!(cut_double(-1234.5678, 1), -1234.5);
        assert_eq!(cut_double(8.5e37, 1), 8.5e37);
        assert!(cut_double(f64::NAN, 1).is_nan());
    }

    #[test]
    fn integers_and_decimal_types_cut_as_flink() {
        assert_eq!(cut_int(2147483647, -1), 2147483640);
        assert_eq!(cut_int(-77, -1), -70);
        assert_eq!(cut_int(5, -30), 0);
        assert_eq!(truncated_decimal(10, 2, 1), DataType::Decimal128(10, 1));
        assert_eq!(truncated_decimal(10, 2, 0), DataType::Decimal128(9, 0));
        assert_eq!(truncated_decimal(10, 2, 5), DataType::Decimal128(10, 2));
        assert_eq!(truncated_decimal(10, 2, -1), DataType::Decimal128(9, 0));
    }
}
