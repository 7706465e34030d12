//! DECIMAL arithmetic typed and rounded as Flink does.
//!
//! Flink derives the result type of `+ - * /` on DECIMALs by SQL Server's
//! rules (`LogicalTypeMerging`), and rounds HALF_UP to that scale:
//!
//! - `a / b`: scale `max(6, s1 + p2 + 1)`, precision `p1 - s1 + s2 + scale`;
//! - `a * b`: precision `p1 + p2 + 1`, scale `s1 + s2`;
//! - `a + b`, `a - b`: scale `max(s1, s2)`, precision
//!   `max(p1 - s1, p2 - s2) + scale + 1`;
//!
//! and when the precision passes 38 it keeps the integer digits and gives
//! up scale, down to `min(scale, 6)` (division: down to 6). An integer
//! operand is `DECIMAL(3|5|10|19, 0)` by its type. A result that does not
//! fit its precision is NULL, and a division by zero fails the query
//! (Java's `ArithmeticException`).
//!
//! DataFusion types division differently (`m / 3` of a `DECIMAL(10, 2)`:
//! DataFusion `4.116666`, Flink `DECIMAL(21, 13)` `4.1166666666667`), so
//! an operation whose DataFusion type is not Flink's becomes a call of
//! [`FlinkDecimal`], after coercion (see [`crate::functions::cast`]).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Array};
use arrow::datatypes::{DataType, Decimal128Type, i256};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ExprSchema, Result, ScalarValue, exec_err};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{
    BinaryExpr, Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};

const MAX_PRECISION: u8 = 38;
/// The least scale an adjusted result keeps.
const MIN_ADJUSTED_SCALE: i8 = 6;

/// Flink's `DECIMAL(p, s)` of an operand of type `t`, if it takes part in
/// DECIMAL arithmetic.
fn decimal_of(t: &DataType) -> Option<(u8, i8)> {
    match t {
        DataType::Decimal128(p, s) => Some((*p, *s)),
        DataType::Int8 => Some((3, 0)),
        DataType::Int16 => Some((5, 0)),
        DataType::Int32 => Some((10, 0)),
        DataType::Int64 => Some((19, 0)),
        _ => None,
    }
}

/// Keeps the integer digits of a result too wide for 38 digits and gives
/// up scale, down to `min(scale, 6)` (Flink's `adjustPrecisionScale`).
fn adjusted(precision: i32, scale: i32) -> (u8, i8) {
    if precision <= MAX_PRECISION as i32 {
        return (precision as u8, scale as i8);
    }
    let integer_digits = precision - scale;
    let least = scale.min(MIN_ADJUSTED_SCALE as i32);
    let scale = (MAX_PRECISION as i32 - integer_digits).max(least);
    (MAX_PRECISION, scale as i8)
}

/// Flink's result type of `a op b` on `DECIMAL(p1, s1)` and `DECIMAL(p2, s2)`.
pub fn result_type(op: Operator, (p1, s1): (u8, i8), (p2, s2): (u8, i8)) -> Option<(u8, i8)> {
    let (p1, s1, p2, s2) = (p1 as i32, s1 as i32, p2 as i32, s2 as i32);
    match op {
        Operator::Divide => {
            let scale = (s1 + p2 + 1).max(MIN_ADJUSTED_SCALE as i32);
            let precision = p1 - s1 + s2 + scale;
            if precision > MAX_PRECISION as i32 {
                let scale = (MAX_PRECISION as i32 - (precision - scale)).max(MIN_ADJUSTED_SCALE as i32);
                return Some((MAX_PRECISION, scale as i8));
            }
            Some((precision as u8, scale as i8))
        }
        Operator::Multiply => Some(adjusted(p1 + p2 + 1, s1 + s2)),
        Operator::Plus | Operator::Minus => {
            let scale = s1.max(s2);
            Some(adjusted((p1 - s1).max(p2 - s2) + scale + 1, scale))
        }
        _ => None,
    }
}

/// The operand as written: the widening of an integer to DECIMAL that
/// coercion adds is peeled off (DataFusion widens a BIGINT to
/// `DECIMAL(20, 0)`, Flink reads it as `DECIMAL(19, 0)`); a CAST the user
/// wrote is not (DataFusion does not widen DECIMAL operands).
fn written(e: &Expr, schema: &DFSchema) -> Option<(Expr, (u8, i8))> {
    let mut e = e;
    if let Expr::Cast(c) = e {
        let widening = match c.expr.get_type(schema as &dyn ExprSchema).ok()? {
            DataType::Int8 => Some(3),
            DataType::Int16 => Some(5),
            DataType::Int32 => Some(10),
            DataType::Int64 => Some(20),
            _ => None,
        };
        if widening.is_some_and(|p| c.field.data_type() == &DataType::Decimal128(p, 0)) {
            e = &c.expr;
        }
    }
    let t = e.get_type(schema as &dyn ExprSchema).ok()?;
    Some((e.clone(), decimal_of(&t)?))
}

/// `a op b` as Flink computes it, when its DataFusion type differs.
pub fn binary(b: &BinaryExpr, e: &Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    if !matches!(
        b.op,
        Operator::Plus | Operator::Minus | Operator::Multiply | Operator::Divide
    ) {
        return Ok(Transformed::no(e.clone()));
    }
    let (Some((left, l)), Some((right, r))) = (written(&b.left, schema), written(&b.right, schema)) else {
        return Ok(Transformed::no(e.clone()));
    };
    // Integers alone are not DECIMAL arithmetic.
    let decimal = |x: &Expr| matches!(x.get_type(schema as &dyn ExprSchema), Ok(DataType::Decimal128(..)));
    if !decimal(&left) && !decimal(&right) {
        return Ok(Transformed::no(e.clone()));
    }
    let Some((p, s)) = result_type(b.op, l, r) else {
        return Ok(Transformed::no(e.clone()));
    };
    if e.get_type(schema as &dyn ExprSchema).ok() == Some(DataType::Decimal128(p, s)) {
        return Ok(Transformed::no(e.clone()));
    }
    let udf = FlinkDecimal::udf(b.op);
    Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(udf),
        vec![left, right],
    ))))
}

/// Plans a product whose scale passes 38 as Flink's, while the query is
/// turned into a plan: DataFusion's coercion refuses it when the plan's
/// schema is computed, before [`binary`] could retype it (Flink gives up
/// scale: `DECIMAL(30, 20) * DECIMAL(30, 20)` is `DECIMAL(38, 17)`).
#[derive(Debug)]
pub struct WideProducts;

impl datafusion::logical_expr::planner::ExprPlanner for WideProducts {
    fn plan_binary_op(
        &self,
        expr: datafusion::logical_expr::planner::RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<datafusion::logical_expr::planner::PlannerResult<datafusion::logical_expr::planner::RawBinaryExpr>>
    {
        use datafusion::logical_expr::planner::PlannerResult;
        let wide = expr.op == sqlparser::ast::BinaryOperator::Multiply
            && matches!(
                (
                    expr.left.get_type(schema as &dyn ExprSchema).ok().as_ref().and_then(decimal_of),
                    expr.right.get_type(schema as &dyn ExprSchema).ok().as_ref().and_then(decimal_of),
                ),
                (Some((_, sl)), Some((_, sr))) if i32::from(sl) + i32::from(sr) > i32::from(MAX_PRECISION)
            );
        if !wide {
            return Ok(PlannerResult::Original(expr));
        }
        Ok(PlannerResult::Planned(Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(FlinkDecimal::udf(Operator::Multiply)),
            vec![expr.left, expr.right],
        ))))
    }
}

/// `+ - * /` on DECIMALs with Flink's result type and HALF_UP rounding.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkDecimal {
    op: Operator,
    name: String,
    signature: Signature,
}

impl FlinkDecimal {
    pub fn udf(op: Operator) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            name: format!("{}{}", crate::functions::names::DECIMAL_PREFIX, op_name(op)),
            op,
            signature: Signature::any(2, Volatility::Immutable),
        })
    }
}

fn op_name(op: Operator) -> &'static str {
    match op {
        Operator::Divide => "divide",
        Operator::Multiply => "multiply",
        Operator::Plus => "plus",
        _ => "minus",
    }
}

impl ScalarUDFImpl for FlinkDecimal {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let [a, b] = args else {
            return exec_err!("{} takes two arguments", self.name);
        };
        match (decimal_of(a), decimal_of(b)) {
            (Some(l), Some(r)) => match result_type(self.op, l, r) {
                Some((p, s)) => Ok(DataType::Decimal128(p, s)),
                None => exec_err!("{}: not an arithmetic operator", self.name),
            },
            _ => exec_err!("{}: {a} and {b} are not DECIMAL or integer types", self.name),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [a, b] = args.args.as_slice() else {
            return exec_err!("{} takes two arguments", self.name);
        };
        let DataType::Decimal128(p, s) = args.return_field.data_type() else {
            return exec_err!("{}: not a DECIMAL result", self.name);
        };
        let scalar = matches!((a, b), (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_)));
        let rows = args.number_rows;
        if !scalar
            && self.op == Operator::Multiply
            && let Some(array) = exact_product(a, b, rows, *p, *s)?
        {
            return Ok(ColumnarValue::Array(array));
        }
        let (a, sa) = as_decimal(a, rows)?;
        let (b, sb) = as_decimal(b, rows)?;
        let (p, s) = (*p, *s);
        let limit = i256::from_i128(10).wrapping_pow(p as u32);
        let mut out = Vec::with_capacity(rows);
        for i in 0..rows {
            if a.is_null(i) || b.is_null(i) {
                out.push(None);
                continue;
            }
            let (x, y) = (i256::from_i128(a.value(i)), i256::from_i128(b.value(i)));
            let v = match self.op {
                Operator::Divide => divide(x, sa, y, sb, s)?,
                Operator::Multiply => rescale(x.checked_mul(y), sa + sb, s),
                Operator::Plus | Operator::Minus => {
                    let common = sa.max(sb);
                    let (x, y) = (rescale(Some(x), sa, common), rescale(Some(y), sb, common));
                    let sum = match (x, y) {
                        (Some(x), Some(y)) if self.op == Operator::Plus => x.checked_add(y),
                        (Some(x), Some(y)) => x.checked_sub(y),
                        _ => None,
                    };
                    rescale(sum, common, s)
                }
                _ => None,
            };
            // Past the result's precision: NULL, as Flink's DecimalData.
            out.push(v.filter(|v| v.wrapping_abs() < limit).and_then(|v| v.to_i128()));
        }
        let array: ArrayRef = Arc::new(Decimal128Array::from(out).with_precision_and_scale(p, s)?);
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&array, 0)?)
        } else {
            ColumnarValue::Array(array)
        })
    }
}

/// An operand's unscaled values as they are (a DECIMAL's, or an
/// integer's), without a cast of the column to DECIMAL(38, s).
enum Unscaled<'a> {
    Scalar(Option<i128>),
    Dec(&'a Decimal128Array),
    I64(&'a arrow::array::Int64Array),
    I32(&'a arrow::array::Int32Array),
    I16(&'a arrow::array::Int16Array),
    I8(&'a arrow::array::Int8Array),
}

impl Unscaled<'_> {
    fn get(&self, i: usize) -> Option<i128> {
        fn at<T: arrow::array::ArrowPrimitiveType>(a: &arrow::array::PrimitiveArray<T>, i: usize) -> Option<T::Native> {
            a.is_valid(i).then(|| a.value(i))
        }
        match self {
            Unscaled::Scalar(v) => *v,
            Unscaled::Dec(a) => at(*a, i),
            Unscaled::I64(a) => at(*a, i).map(i128::from),
            Unscaled::I32(a) => at(*a, i).map(i128::from),
            Unscaled::I16(a) => at(*a, i).map(i128::from),
            Unscaled::I8(a) => at(*a, i).map(i128::from),
        }
    }
}

/// `v`'s unscaled values and scale, if it is a DECIMAL or an integer.
fn unscaled(v: &ColumnarValue) -> Option<(Unscaled<'_>, i8)> {
    match v {
        ColumnarValue::Scalar(ScalarValue::Decimal128(x, _, s)) => Some((Unscaled::Scalar(*x), *s)),
        ColumnarValue::Scalar(ScalarValue::Int64(x)) => Some((Unscaled::Scalar(x.map(i128::from)), 0)),
        ColumnarValue::Scalar(ScalarValue::Int32(x)) => Some((Unscaled::Scalar(x.map(i128::from)), 0)),
        ColumnarValue::Scalar(ScalarValue::Int16(x)) => Some((Unscaled::Scalar(x.map(i128::from)), 0)),
        ColumnarValue::Scalar(ScalarValue::Int8(x)) => Some((Unscaled::Scalar(x.map(i128::from)), 0)),
        ColumnarValue::Scalar(_) => None,
        ColumnarValue::Array(a) => match a.data_type() {
            DataType::Decimal128(_, s) => Some((Unscaled::Dec(a.as_primitive()), *s)),
            DataType::Int64 => Some((Unscaled::I64(a.as_primitive()), 0)),
            DataType::Int32 => Some((Unscaled::I32(a.as_primitive()), 0)),
            DataType::Int16 => Some((Unscaled::I16(a.as_primitive()), 0)),
            DataType::Int8 => Some((Unscaled::I8(a.as_primitive()), 0)),
            _ => None,
        },
    }
}

/// `a * b` at result `DECIMAL(p, s)` when `s` is the operands' scales
/// together (no scale given up, nothing to round): the product of the
/// unscaled values in i128, NULL past the precision. An i128 overflow is
/// past any precision (10^38 < i128::MAX), so it is NULL too: the same
/// answers as the general path's i256 arithmetic, without its cost per
/// row (q1's `0.908 * price`). `None` when the fast path does not apply.
fn exact_product(a: &ColumnarValue, b: &ColumnarValue, rows: usize, p: u8, s: i8) -> Result<Option<ArrayRef>> {
    let (Some((x, sx)), Some((y, sy))) = (unscaled(a), unscaled(b)) else {
        return Ok(None);
    };
    if i16::from(sx) + i16::from(sy) != i16::from(s) || p > MAX_PRECISION {
        return Ok(None);
    }
    let limit = 10u128.pow(u32::from(p));
    let product = |i: usize| -> Option<i128> {
        let v = x.get(i)?.checked_mul(y.get(i)?)?;
        (v.unsigned_abs() < limit).then_some(v)
    };
    let array: Decimal128Array = (0..rows).map(product).collect();
    Ok(Some(Arc::new(array.with_precision_and_scale(p, s)?)))
}

/// An operand as DECIMAL values and their scale (integers at scale 0).
fn as_decimal(v: &ColumnarValue, rows: usize) -> Result<(Decimal128Array, i8)> {
    let array = v.to_array(rows)?;
    let scale = match array.data_type() {
        DataType::Decimal128(_, s) => *s,
        _ => 0,
    };
    let cast = arrow::compute::cast(&array, &DataType::Decimal128(MAX_PRECISION, scale))?;
    Ok((cast.as_primitive::<Decimal128Type>().clone(), scale))
}

fn ten_pow(n: u32) -> Option<i256> {
    i256::from_i128(10).checked_pow(n)
}

/// `v` at scale `from` brought to scale `to`, rounding HALF_UP.
fn rescale(v: Option<i256>, from: i8, to: i8) -> Option<i256> {
    let v = v?;
    if to >= from {
        return v.checked_mul(ten_pow((to - from) as u32)?);
    }
    let d = ten_pow((from - to) as u32)?;
    Some(half_up(v, d))
}

/// `n / d` rounded HALF_UP (away from zero at the half), `d` > 0.
fn half_up(n: i256, d: i256) -> i256 {
    let (q, r) = (n / d, n % d);
    if r.wrapping_abs().wrapping_mul(i256::from_i128(2)) >= d {
        if n.is_negative() { q - i256::ONE } else { q + i256::ONE }
    } else {
        q
    }
}

/// `x / y` (at scales `sx`, `sy`) at scale `s`, HALF_UP; None past i256.
fn divide(x: i256, sx: i8, y: i256, sy: i8, s: i8) -> Result<Option<i256>> {
    if y == i256::ZERO {
        return exec_err!("Division by zero");
    }
    let negative = x.is_negative() != y.is_negative();
    let (x, y) = (x.wrapping_abs(), y.wrapping_abs());
    // quotient * 10^s = x * 10^(s + sy - sx) / y
    let k = s as i32 + sy as i32 - sx as i32;
    let (mut n, mut d) = (x, y);
    if k < 0 {
        match ten_pow((-k) as u32).and_then(|t| d.checked_mul(t)) {
            Some(v) => d = v,
            // The divisor is beyond every dividend: the quotient rounds to 0.
            None => return Ok(Some(i256::ZERO)),
        }
    }
    let digits = k.max(0) as u32;
    let q = match ten_pow(digits).and_then(|t| n.checked_mul(t)) {
        Some(v) => {
            n = v;
            half_up(n, d)
        }
        None => {
            // Too wide at once: long division, a digit at a time.
            let (mut q, mut r) = (n / d, n % d);
            for _ in 0..digits {
                let Some(r10) = r.checked_mul(i256::from_i128(10)) else {
                    return Ok(None);
                };
                let Some(q10) = q.checked_mul(i256::from_i128(10)) else {
                    return Ok(None);
                };
                q = q10 + r10 / d;
                r = r10 % d;
            }
            if r.wrapping_mul(i256::from_i128(2)) >= d {
                q + i256::ONE
            } else {
                q
            }
        }
    };
    Ok(Some(if negative { q.wrapping_neg() } else { q }))
}

/// Flink's common type of a DOUBLE (or FLOAT) and a DECIMAL is DOUBLE:
/// in comparisons, `BETWEEN`, `IN`, `CASE` (and `IF`) results,
/// `COALESCE`-like calls, `ARRAY[...]` elements and `MAP[...]` keys and
/// values. DataFusion's is `DECIMAL(30, 15)`, which rounds the double and
/// fails past 10^15 (`d > 0.5` of `d` = 8.5E37; `ARRAY[d, 1.5]` held NULL
/// for it). Before DataFusion's coercion, each DECIMAL side of such an
/// expression is cast to DOUBLE. (Arithmetic already computes in DOUBLE in both.)
pub fn approximate_wins(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    plan.transform_up_with_subqueries(|node| {
        let schema = merge_schema(&node.inputs());
        let names = NamePreserver::new(&node);
        let t = node.map_expressions(|e| {
            let saved = names.save(&e);
            Ok(approximate_wins_in(e, &schema)?.update_data(|e| saved.restore(e)))
        })?;
        if !t.transformed {
            return Ok(t);
        }
        t.map_data(|n| n.recompute_schema())
    })
}

/// [`approximate_wins`] on one expression over `schema`.
pub fn approximate_wins_in(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let kind = |e: &Expr| match e.get_type(schema as &dyn ExprSchema) {
        Ok(DataType::Float16 | DataType::Float32 | DataType::Float64) => Some(true),
        Ok(DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..)) => {
            Some(false)
        }
        _ => None,
    };
    // Casts the DECIMALs among `xs` to DOUBLE when a DOUBLE is among them.
    let widen = |xs: Vec<&mut Expr>| -> bool {
        let kinds: Vec<Option<bool>> = xs.iter().map(|x| kind(x)).collect();
        if !kinds.contains(&Some(true)) || !kinds.contains(&Some(false)) {
            return false;
        }
        for (x, k) in xs.into_iter().zip(kinds) {
            if k == Some(false) {
                let inner = std::mem::replace(x, Expr::Literal(ScalarValue::Null, None));
                *x = Expr::Cast(Cast::new(Box::new(inner), DataType::Float64));
            }
        }
        true
    };
    e.transform_up(|mut e| {
        let changed = match &mut e {
            Expr::BinaryExpr(b)
                if matches!(
                    b.op,
                    Operator::Eq
                        | Operator::NotEq
                        | Operator::Lt
                        | Operator::LtEq
                        | Operator::Gt
                        | Operator::GtEq
                        | Operator::IsDistinctFrom
                        | Operator::IsNotDistinctFrom
                ) =>
            {
                widen(vec![&mut *b.left, &mut *b.right])
            }
            Expr::Between(b) => widen(vec![&mut *b.expr, &mut *b.low, &mut *b.high]),
            Expr::InList(l) => widen(std::iter::once(&mut *l.expr).chain(l.list.iter_mut()).collect()),
            Expr::Case(c) => widen(
                c.when_then_expr
                    .iter_mut()
                    .map(|(_, then)| &mut **then)
                    .chain(c.else_expr.as_deref_mut())
                    .collect(),
            ),
            Expr::ScalarFunction(call)
                if matches!(
                    call.func.name(),
                    "coalesce" | "nullif" | "nvl" | "ifnull" | "greatest" | "least"
                ) =>
            {
                widen(call.args.iter_mut().collect())
            }
            // ARRAY[...]'s elements, MAP[...]'s keys and its values.
            Expr::ScalarFunction(call) if call.func.name() == "make_array" => widen(call.args.iter_mut().collect()),
            Expr::ScalarFunction(call) if call.func.name() == crate::functions::maps::MAP_FN => {
                let (mut keys, mut values): (Vec<&mut Expr>, Vec<&mut Expr>) = (vec![], vec![]);
                for (i, x) in call.args.iter_mut().enumerate() {
                    if i % 2 == 0 { keys.push(x) } else { values.push(x) }
                }
                let keys = widen(keys);
                widen(values) || keys
            }
            _ => false,
        };
        Ok(if changed {
            Transformed::yes(e)
        } else {
            Transformed::no(e)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(op: Operator, l: (u8, i8), r: (u8, i8)) -> (u8, i8) {
        result_type(op, l, r).expect("arithmetic")
    }

    #[test]
    fn result_types_are_flinks() {
        // Each as Flink 2.3's TYPEOF answers.
        assert_eq!(typed(Operator::Divide, (10, 2), (10, 0)), (21, 13));
        assert_eq!(typed(Operator::Divide, (10, 2), (5, 1)), (17, 8));
        assert_eq!(typed(Operator::Divide, (10, 0), (10, 2)), (23, 11));
        assert_eq!(typed(Operator::Divide, (38, 10), (38, 10)), (38, 6));
        assert_eq!(typed(Operator::Divide, (30, 20), (5, 2)), (38, 26));
        assert_eq!(typed(Operator::Divide, (10, 2), (10, 2)), (23, 13));
        assert_eq!(typed(Operator::Multiply, (10, 2), (10, 2)), (21, 4));
        assert_eq!(typed(Operator::Multiply, (10, 2), (30, 20)), (38, 19));
        assert_eq!(typed(Operator::Multiply, (30, 20), (30, 20)), (38, 17));
        assert_eq!(typed(Operator::Plus, (10, 2), (5, 3)), (12, 3));
        assert_eq!(typed(Operator::Plus, (38, 2), (38, 3)), (38, 3));
        assert_eq!(typed(Operator::Minus, (10, 2), (5, 3)), (12, 3));
    }

    fn div(x: i128, sx: i8, y: i128, sy: i8, s: i8) -> Option<i128> {
        divide(i256::from_i128(x), sx, i256::from_i128(y), sy, s)
            .expect("divides")
            .and_then(|v| v.to_i128())
    }

    #[test]
    fn division_rounds_half_up_at_the_result_scale() {
        // 12.35 / 3 = 4.1166666666667 at scale 13.
        assert_eq!(div(1235, 2, 3, 0, 13), Some(41_166_666_666_667));
        // -0.05 / 3 = -0.0166666666667 (HALF_UP: away from zero).
        assert_eq!(div(-5, 2, 3, 0, 13), Some(-166_666_666_667));
        // 1 / 3 of two DECIMAL(38, 10): scale 6.
        assert_eq!(div(10_000_000_000, 10, 30_000_000_000, 10, 6), Some(333_333));
        // 0.5 / 1 at scale 0 rounds up; -0.5 down.
        assert_eq!(div(5, 1, 1, 0, 0), Some(1));
        assert_eq!(div(-5, 1, 1, 0, 0), Some(-1));
    }

    #[test]
    fn a_division_too_wide_for_one_step_is_long_division() {
        // 10^37 / 3 at scale 40 needs 10^77: past i256 at once.
        let x = 10i128.pow(37);
        let q = divide(i256::from_i128(x), 0, i256::from_i128(3), 0, 40).expect("divides");
        let expected = "3".repeat(77);
        assert_eq!(q.map(|v| v.to_string()), Some(expected));
    }

    #[test]
    fn division_by_zero_fails() {
        assert!(divide(i256::ONE, 0, i256::ZERO, 0, 6).is_err());
    }

    #[test]
    fn an_exact_product_is_the_general_paths_answer() {
        use arrow::array::Int64Array;
        let prices: ArrayRef = Arc::new(Int64Array::from(vec![Some(1_000), None, Some(i64::MAX), Some(-7)]));
        let rate = ColumnarValue::Scalar(ScalarValue::Decimal128(Some(908), 3, 3));
        let got = exact_product(&rate, &ColumnarValue::Array(prices), 4, 23, 3)
            .expect("product")
            .expect("the fast path");
        let got = got.as_primitive::<Decimal128Type>();
        assert_eq!(got.data_type(), &DataType::Decimal128(23, 3));
        assert_eq!(got.value(0), 908_000);
        assert!(got.is_null(1));
        // 0.908 * (2^63 - 1) has 19 integer digits (22 unscaled): it fits
        // DECIMAL(23, 3).
        assert_eq!(got.value(2), 908 * i128::from(i64::MAX));
        assert_eq!(got.value(3), -6_356);
        // Past the precision: NULL, as Flink's DecimalData.
        let big: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(10i128.pow(30))])
                .with_precision_and_scale(38, 0)
                .expect("decimal"),
        );
        let ten = ColumnarValue::Scalar(ScalarValue::Decimal128(Some(10i128.pow(9)), 10, 0));
        let got = exact_product(&ColumnarValue::Array(big), &ten, 1, 38, 0)
            .expect("product")
            .expect("fast");
        assert!(got.is_null(0), "10^39 is past DECIMAL(38, 0)");
        // 10^19 * 10^19 fits i128 but not DECIMAL(38, 0): NULL, by the
        // precision check (not by an overflow).
        let e19: ArrayRef = Arc::new(
            Decimal128Array::from(vec![
                Some(10i128.pow(19)),
                Some(-(10i128.pow(19))),
                Some(10i128.pow(18)),
            ])
            .with_precision_and_scale(20, 0)
            .expect("decimal"),
        );
        let got = exact_product(&ColumnarValue::Array(e19.clone()), &ColumnarValue::Array(e19), 3, 38, 0)
            .expect("product")
            .expect("fast");
        assert!(got.is_null(0) && got.is_null(1), "10^38 is past DECIMAL(38, 0)");
        assert_eq!(got.as_primitive::<Decimal128Type>().value(2), 10i128.pow(36));
        // Against the general path's arithmetic (i256, then the precision),
        // over integer widths, signs, NULLs and the extremes.
        let general = |x: i128, y: i128, p: u8| -> Option<i128> {
            let v = rescale(i256::from_i128(x).checked_mul(i256::from_i128(y)), 0, 0)?;
            (v.wrapping_abs() < i256::from_i128(10).wrapping_pow(u32::from(p)))
                .then(|| v.to_i128())
                .flatten()
        };
        let xs: Vec<Option<i64>> = vec![
            Some(0),
            Some(1),
            Some(-1),
            Some(i64::MAX),
            Some(i64::MIN),
            None,
            Some(-12_345),
        ];
        let ys: Vec<Option<i32>> = vec![
            Some(7),
            Some(i32::MIN),
            Some(-1),
            Some(i32::MAX),
            Some(3),
            Some(5),
            None,
        ];
        let x: ArrayRef = Arc::new(arrow::array::Int64Array::from(xs.clone()));
        let y: ArrayRef = Arc::new(arrow::array::Int32Array::from(ys.clone()));
        for p in [10u8, 19, 29, 38] {
            let got = exact_product(
                &ColumnarValue::Array(x.clone()),
                &ColumnarValue::Array(y.clone()),
                7,
                p,
                0,
            )
            .expect("product")
            .expect("fast");
            let got = got.as_primitive::<Decimal128Type>();
            for (i, (a, b)) in xs.iter().zip(&ys).enumerate() {
                let want = a.zip(*b).and_then(|(a, b)| general(i128::from(a), i128::from(b), p));
                assert_eq!(got.is_valid(i).then(|| got.value(i)), want, "row {i} at precision {p}");
            }
        }
        // A result whose scale was given up takes the general path.
        let one = ColumnarValue::Scalar(ScalarValue::Decimal128(Some(1), 38, 20));
        assert!(exact_product(&one, &one, 1, 38, 6).expect("no error").is_none());
    }

    #[test]
    fn products_and_sums_round_half_up_when_scale_is_given_up() {
        assert_eq!(rescale(Some(i256::from_i128(125)), 2, 1), Some(i256::from_i128(13)));
        assert_eq!(rescale(Some(i256::from_i128(-125)), 2, 1), Some(i256::from_i128(-13)));
        assert_eq!(rescale(Some(i256::from_i128(124)), 2, 1), Some(i256::from_i128(12)));
    }
}
