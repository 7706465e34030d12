//! Functions whose Flink behaviour differs from DataFusion's. Registered
//! over DataFusion's under the same name.
//!
//! - `AVG` of an integer or FLOAT column returns that type (an integer
//!   average truncated toward zero: Flink computes `SUM / COUNT` in the
//!   input type); DataFusion returns DOUBLE. Decimal, DOUBLE and interval
//!   inputs behave as in DataFusion.
//! - `SUM` in the input's type (DataFusion widens integers to BIGINT,
//!   FLOAT to DOUBLE), a DECIMAL(p, s) as DECIMAL(38, s).

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::types::{NativeType, logical_float64};
use datafusion::common::{Result, ScalarValue};
use datafusion::functions_aggregate::average::Avg;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Coercion, EmitTo, GroupsAccumulator, Signature, TypeSignature,
    TypeSignatureClass, Volatility,
};

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkAvg {
    inner: Avg,
    signature: Signature,
}

impl FlinkAvg {
    pub fn udaf() -> AggregateUDF {
        AggregateUDF::new_from_impl(Self {
            inner: Avg::new(),
            signature: Signature::one_of(
                vec![
                    TypeSignature::Coercible(vec![Coercion::new_exact(TypeSignatureClass::Decimal)]),
                    TypeSignature::Coercible(vec![Coercion::new_exact(TypeSignatureClass::Duration)]),
                    TypeSignature::Coercible(vec![Coercion::new_exact(TypeSignatureClass::Integer)]),
                    // FLOAT stays FLOAT (Flink's AVG is in the input type).
                    TypeSignature::Exact(vec![DataType::Float32]),
                    TypeSignature::Coercible(vec![Coercion::new_implicit(
                        TypeSignatureClass::Native(logical_float64()),
                        vec![TypeSignatureClass::Float],
                        NativeType::Float64,
                    )]),
                ],
                Volatility::Immutable,
            ),
        })
    }
}

/// An aggregate DataFusion computes in a wider type than Flink answers
/// in: its inputs are cast to `wide` for the inner accumulator and its
/// result to `out` (integers wrap as Java's narrowing does).
#[derive(Debug, Clone)]
struct Widening {
    wide: DataType,
    out: DataType,
}

impl Widening {
    /// Runs `f` on `args` with the input fields as `wide` and the return
    /// field as `inner_out` (what the inner aggregate returns for `wide`).
    fn args<R>(&self, args: AccumulatorArgs, inner_out: &DataType, f: impl FnOnce(AccumulatorArgs) -> R) -> R {
        let fields: Vec<FieldRef> = args
            .expr_fields
            .iter()
            .map(|x| Arc::new(Field::new(x.name(), self.wide.clone(), true)) as FieldRef)
            .collect();
        f(AccumulatorArgs {
            return_field: Arc::new(Field::new(args.return_field.name(), inner_out.clone(), true)),
            expr_fields: &fields,
            ..args
        })
    }

    fn state_args<R>(&self, args: StateFieldsArgs, inner_out: &DataType, f: impl FnOnce(StateFieldsArgs) -> R) -> R {
        let fields: Vec<FieldRef> = args
            .input_fields
            .iter()
            .map(|x| Arc::new(Field::new(x.name(), self.wide.clone(), true)) as FieldRef)
            .collect();
        f(StateFieldsArgs {
            return_field: Arc::new(Field::new(args.return_field.name(), inner_out.clone(), true)),
            input_fields: &fields,
            ..args
        })
    }

    fn widen(&self, values: &[ArrayRef]) -> Result<Vec<ArrayRef>> {
        Ok(values
            .iter()
            .map(|v| cast(v, &self.wide))
            .collect::<Result<Vec<_>, _>>()?)
    }

    fn narrow(&self, a: &ArrayRef) -> Result<ArrayRef> {
        use arrow::array::AsArray;
        use arrow::datatypes::{Int8Type, Int16Type, Int32Type, Int64Type};
        if a.data_type() == &DataType::Int64 {
            let v = a.as_primitive::<Int64Type>();
            // Java's (byte)/(short)/(int) of a long: the low bits.
            let out: Option<ArrayRef> = match self.out {
                DataType::Int8 => Some(Arc::new(v.unary::<_, Int8Type>(|x| x as i8))),
                DataType::Int16 => Some(Arc::new(v.unary::<_, Int16Type>(|x| x as i16))),
                DataType::Int32 => Some(Arc::new(v.unary::<_, Int32Type>(|x| x as i32))),
                _ => None,
            };
            if let Some(out) = out {
                return Ok(out);
            }
        }
        Ok(cast(a, &self.out)?)
    }

    fn narrow_scalar(&self, v: ScalarValue) -> Result<ScalarValue> {
        ScalarValue::try_from_array(&self.narrow(&v.to_array()?)?, 0)
    }
}

/// `AVG` of integers and FLOAT: Flink answers in the input's type (an
/// integer average truncated toward zero), DataFusion in DOUBLE.
fn avg_widening(out: &DataType) -> Option<Widening> {
    (out.is_integer() || *out == DataType::Float32).then(|| Widening {
        wide: DataType::Float64,
        out: out.clone(),
    })
}

impl AggregateUDFImpl for FlinkAvg {
    fn name(&self) -> &str {
        "avg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(t) if t.is_integer() || *t == DataType::Float32 => Ok(t.clone()),
            // Flink: DECIMAL(38, max(6, s)).
            Some(DataType::Decimal128(_, s)) => Ok(DataType::Decimal128(38, (*s).max(6))),
            _ => self.inner.return_type(arg_types),
        }
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        if let (Some(DataType::Decimal128(_, in_scale)), DataType::Decimal128(p, s)) = (
            args.expr_fields.first().map(|f| f.data_type()),
            args.return_field.data_type(),
        ) {
            return Ok(Box::new(DecimalAvg {
                sum: 0,
                count: 0,
                in_scale: *in_scale,
                out: (*p, *s),
            }));
        }
        let Some(w) = avg_widening(args.return_field.data_type()) else {
            return self.inner.accumulator(args);
        };
        let inner = w.args(args, &DataType::Float64, |a| self.inner.accumulator(a))?;
        Ok(Box::new(Widened { inner, w }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        if let DataType::Decimal128(..) = args.return_field.data_type() {
            return Ok(vec![
                Arc::new(Field::new(
                    format!("{}[sum]", args.name),
                    DataType::Decimal128(38, 0),
                    true,
                )),
                Arc::new(Field::new(format!("{}[count]", args.name), DataType::Int64, true)),
            ]);
        }
        let Some(w) = avg_widening(args.return_field.data_type()) else {
            return self.inner.state_fields(args);
        };
        w.state_args(args, &DataType::Float64, |a| self.inner.state_fields(a))
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        if let DataType::Decimal128(..) = args.return_field.data_type() {
            // `DecimalAvg` per group: Flink's HALF_UP division.
            return false;
        }
        let Some(w) = avg_widening(args.return_field.data_type()) else {
            return self.inner.groups_accumulator_supported(args);
        };
        w.args(args, &DataType::Float64, |a| self.inner.groups_accumulator_supported(a))
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let Some(w) = avg_widening(args.return_field.data_type()) else {
            return self.inner.create_groups_accumulator(args);
        };
        let inner = w.args(args, &DataType::Float64, |a| self.inner.create_groups_accumulator(a))?;
        Ok(Box::new(WidenedGroups { inner, w }))
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        if let DataType::Decimal128(..) = args.return_field.data_type() {
            return self.accumulator(args);
        }
        let Some(w) = avg_widening(args.return_field.data_type()) else {
            return self.inner.create_sliding_accumulator(args);
        };
        let inner = w.args(args, &DataType::Float64, |a| self.inner.create_sliding_accumulator(a))?;
        Ok(Box::new(Widened { inner, w }))
    }
}

/// `AVG` of a DECIMAL as Flink computes it: the exact sum over the count,
/// rounded HALF_UP to DECIMAL(38, max(6, s)).
#[derive(Debug)]
struct DecimalAvg {
    /// Unscaled, at the input's scale.
    sum: i128,
    count: i64,
    in_scale: i8,
    out: (u8, i8),
}

impl DecimalAvg {
    fn add(&mut self, values: &ArrayRef, sign: i64) -> Result<()> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::Decimal128Type;
        let v = values.as_primitive::<Decimal128Type>();
        for i in 0..v.len() {
            if v.is_valid(i) {
                self.sum = if sign > 0 {
                    self.sum.wrapping_add(v.value(i))
                } else {
                    self.sum.wrapping_sub(v.value(i))
                };
                self.count += sign;
            }
        }
        Ok(())
    }
}

impl Accumulator for DecimalAvg {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        match values.first() {
            Some(v) => self.add(v, 1),
            None => Ok(()),
        }
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        match values.first() {
            Some(v) => self.add(v, -1),
            None => Ok(()),
        }
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let (p, s) = self.out;
        if self.count == 0 {
            return Ok(ScalarValue::Decimal128(None, p, s));
        }
        let shift = i32::from(s) - i32::from(self.in_scale);
        let scaled = if shift >= 0 {
            self.sum.saturating_mul(10i128.saturating_pow(shift as u32))
        } else {
            10i128.checked_pow((-shift) as u32).map_or(0, |d| self.sum / d)
        };
        let avg = weir_engine::operators::group::accs::div_half_up(scaled, i128::from(self.count));
        Ok(ScalarValue::Decimal128(Some(avg), p, s))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::Decimal128(Some(self.sum), 38, 0),
            ScalarValue::Int64(Some(self.count)),
        ])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::{Decimal128Type, Int64Type};
        let [sums, counts] = states else {
            return datafusion::common::internal_err!("AVG's state is a sum and a count");
        };
        let (sums, counts) = (
            sums.as_primitive::<Decimal128Type>(),
            counts.as_primitive::<Int64Type>(),
        );
        for i in 0..sums.len() {
            if sums.is_valid(i) && counts.is_valid(i) {
                self.sum = self.sum.wrapping_add(sums.value(i));
                self.count += counts.value(i);
            }
        }
        Ok(())
    }
}

/// Flink's `SUM`: in the input's type (TINYINT, SMALLINT and INT wrap as
/// Java's int arithmetic, FLOAT stays FLOAT), a DECIMAL(p, s) as
/// DECIMAL(38, s); DataFusion widens integers to BIGINT, FLOAT to DOUBLE
/// and a DECIMAL to DECIMAL(p + 10, s).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkSum {
    inner: Sum,
    signature: Signature,
}

impl FlinkSum {
    pub fn udaf() -> AggregateUDF {
        AggregateUDF::new_from_impl(Self {
            inner: Sum::new(),
            signature: Signature::user_defined(Volatility::Immutable),
        })
    }

    /// Flink's result type of SUM of `t`, where it is not DataFusion's.
    fn flink_type(t: &DataType) -> Option<DataType> {
        match t {
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Float32 => Some(t.clone()),
            DataType::Decimal128(_, s) => Some(DataType::Decimal128(38, *s)),
            _ => None,
        }
    }

    /// What the inner SUM adds `t` as, and answers.
    fn wide(t: &DataType) -> DataType {
        match t {
            DataType::Int8 | DataType::Int16 | DataType::Int32 => DataType::Int64,
            DataType::Float32 => DataType::Float64,
            other => other.clone(),
        }
    }

    fn widening(&self, input: Option<&FieldRef>, out: &DataType) -> Option<Widening> {
        let input = input?.data_type();
        Self::flink_type(input).map(|_| Widening {
            wide: Self::wide(input),
            out: out.clone(),
        })
    }

    fn inner_out(&self, w: &Widening) -> Result<DataType> {
        match &w.out {
            // The inner sum of decimals adds unscaled values at the
            // result's precision.
            DataType::Decimal128(..) => Ok(w.out.clone()),
            _ => self.inner.return_type(std::slice::from_ref(&w.wide)),
        }
    }
}

impl AggregateUDFImpl for FlinkSum {
    fn name(&self) -> &str {
        "sum"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [t] = arg_types else {
            return datafusion::common::plan_err!("SUM takes one argument, not {}", arg_types.len());
        };
        Ok(vec![match t {
            DataType::Null => DataType::Int32,
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => DataType::UInt64,
            DataType::Float16 => DataType::Float64,
            t if t.is_integer() || t.is_floating() => t.clone(),
            DataType::Decimal32(p, s) | DataType::Decimal64(p, s) => DataType::Decimal128(*p, *s),
            DataType::Decimal128(..) | DataType::Decimal256(..) | DataType::Duration(_) | DataType::Interval(_) => {
                t.clone()
            }
            other => {
                return datafusion::common::plan_err!("SUM takes a number, not {}", crate::types::flink_name(other));
            }
        }])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first().and_then(Self::flink_type) {
            Some(t) => Ok(t),
            None => self
                .inner
                .return_type(&arg_types.iter().map(Self::wide).collect::<Vec<_>>()),
        }
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let Some(w) = self.widening(args.expr_fields.first(), args.return_field.data_type()) else {
            return self.inner.accumulator(args);
        };
        let out = self.inner_out(&w)?;
        let inner = w.args(args, &out, |a| self.inner.accumulator(a))?;
        Ok(Box::new(Widened { inner, w }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let Some(w) = self.widening(args.input_fields.first(), args.return_field.data_type()) else {
            return self.inner.state_fields(args);
        };
        let out = self.inner_out(&w)?;
        w.state_args(args, &out, |a| self.inner.state_fields(a))
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        let Some(w) = self.widening(args.expr_fields.first(), args.return_field.data_type()) else {
            return self.inner.groups_accumulator_supported(args);
        };
        let Ok(out) = self.inner_out(&w) else { return false };
        w.args(args, &out, |a| self.inner.groups_accumulator_supported(a))
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let Some(w) = self.widening(args.expr_fields.first(), args.return_field.data_type()) else {
            return self.inner.create_groups_accumulator(args);
        };
        let out = self.inner_out(&w)?;
        let inner = w.args(args, &out, |a| self.inner.create_groups_accumulator(a))?;
        Ok(Box::new(WidenedGroups { inner, w }))
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let Some(w) = self.widening(args.expr_fields.first(), args.return_field.data_type()) else {
            return self.inner.create_sliding_accumulator(args);
        };
        let out = self.inner_out(&w)?;
        let inner = w.args(args, &out, |a| self.inner.create_sliding_accumulator(a))?;
        Ok(Box::new(Widened { inner, w }))
    }
}

/// An inner accumulator over widened inputs, its result narrowed.
#[derive(Debug)]
struct Widened {
    inner: Box<dyn Accumulator>,
    w: Widening,
}

impl Accumulator for Widened {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.update_batch(&self.w.widen(values)?)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.retract_batch(&self.w.widen(values)?)
    }

    fn supports_retract_batch(&self) -> bool {
        self.inner.supports_retract_batch()
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.w.narrow_scalar(self.inner.evaluate()?)
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.inner.state()
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.inner.merge_batch(states)
    }
}

struct WidenedGroups {
    inner: Box<dyn GroupsAccumulator>,
    w: Widening,
}

impl GroupsAccumulator for WidenedGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.inner
            .update_batch(&self.w.widen(values)?, group_indices, opt_filter, total_num_groups)
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        self.w.narrow(&self.inner.evaluate(emit_to)?)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        self.inner.state(emit_to)
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.inner.merge_batch(values, group_indices, total_num_groups)
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        self.inner.convert_to_state(&self.w.widen(values)?, opt_filter)
    }
}

/// Flink's `MOD(a, b)`: the remainder of integer or floating division
/// (DataFusion spells it `a % b` only). Of integers it is typed as `b`,
/// as Calcite types it (the remainder is smaller than `b`): `MOD(i, 3)`
/// of an INT is an INT, `MOD(bigint, 3)` too.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkMod {
    signature: Signature,
}

impl FlinkMod {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            signature: Signature::user_defined(Volatility::Immutable),
        })
    }
}

fn both_integers(types: &[DataType]) -> bool {
    types.len() == 2 && types.iter().all(|t| t.is_integer() || *t == DataType::Null)
}

impl datafusion::logical_expr::ScalarUDFImpl for FlinkMod {
    fn name(&self) -> &str {
        "mod"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != 2 {
            return datafusion::common::plan_err!("MOD takes two arguments, not {}", arg_types.len());
        }
        if both_integers(arg_types) {
            return Ok(arg_types
                .iter()
                .map(|t| {
                    if *t == DataType::Null {
                        DataType::Int32
                    } else {
                        t.clone()
                    }
                })
                .collect());
        }
        for t in arg_types {
            if !t.is_numeric() && *t != DataType::Null {
                return datafusion::common::plan_err!("MOD takes numbers, not {}", crate::types::flink_name(t));
            }
        }
        Ok(vec![DataType::Float64; 2])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(if both_integers(arg_types) {
            arg_types[1].clone()
        } else {
            DataType::Float64
        })
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        let n = args.number_rows;
        let [a, b] = args.args.as_slice() else {
            return datafusion::common::exec_err!("MOD takes two arguments");
        };
        let (a, b) = (a.to_array(n)?, b.to_array(n)?);
        let out = if both_integers(&[a.data_type().clone(), b.data_type().clone()]) {
            let wide = |x: &arrow::array::ArrayRef| arrow::compute::cast(x, &DataType::Int64);
            let r = arrow::compute::kernels::numeric::rem(&wide(&a)?, &wide(&b)?)?;
            arrow::compute::cast(&r, b.data_type())?
        } else {
            arrow::compute::kernels::numeric::rem(&a, &b)?
        };
        Ok(datafusion::logical_expr::ColumnarValue::Array(out))
    }
}

/// Flink's `PROCTIME()`: the processing time, `TIMESTAMP_LTZ(3)`. In a
/// table's computed column (`pt AS PROCTIME()`) it makes a
/// processing-time attribute: deduplication ordered by it keeps rows by
/// arrival. Evaluated once per batch (every row of a batch arrives
/// together); the value is the wall clock in milliseconds.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Proctime {
    signature: Signature,
}

impl Proctime {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            signature: Signature::nullary(Volatility::Volatile),
        })
    }
}

/// Whether a computed column's expression text is `PROCTIME()`.
pub fn is_proctime_call(expr: &str) -> bool {
    let compact: String = expr.chars().filter(|c| !c.is_whitespace()).collect();
    compact.eq_ignore_ascii_case("PROCTIME()")
}

impl datafusion::logical_expr::ScalarUDFImpl for Proctime {
    fn name(&self) -> &str {
        "proctime"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Timestamp(
            arrow::datatypes::TimeUnit::Millisecond,
            Some("UTC".into()),
        ))
    }

    fn invoke_with_args(
        &self,
        _args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Ok(datafusion::logical_expr::ColumnarValue::Scalar(
            ScalarValue::TimestampMillisecond(Some(now), Some("UTC".into())),
        ))
    }
}

/// Flink's `CURRENT_WATERMARK(rowtime)`: the watermark the evaluating
/// operator has received, `NULL` before its first, typed as the rowtime
/// argument with precision 3. A Calc operator binds each call to its own
/// watermark (`weir_engine::expr::bind_current_watermark`); anywhere else
/// it is an error. The planner checks that the argument is a rowtime
/// attribute.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CurrentWatermark {
    signature: Signature,
}

impl CurrentWatermark {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            signature: Signature::any(1, Volatility::Volatile),
        })
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for CurrentWatermark {
    fn name(&self) -> &str {
        weir_engine::expr::CURRENT_WATERMARK
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [DataType::Timestamp(_, tz)] => {
                Ok(DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, tz.clone()))
            }
            [other] => datafusion::common::plan_err!(
                "CURRENT_WATERMARK() must be called with a single rowtime attribute argument, but '{}' cannot be a \
                 time attribute.",
                crate::types::flink_name(other)
            ),
            _ => datafusion::common::plan_err!(
                "CURRENT_WATERMARK() must be called with a single rowtime attribute argument"
            ),
        }
    }

    fn invoke_with_args(
        &self,
        _args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        datafusion::common::exec_err!(
            "CURRENT_WATERMARK() is evaluated in a query's SELECT list or WHERE clause only (in a projection or \
             filter of a streaming job)"
        )
    }
}

/// Flink's `DATE_FORMAT(timestamp | string, format)`: the time as text in
/// a Java pattern (`'yyyy-MM-dd HH:mm'`). DataFusion's `date_format` is
/// `to_char` with chrono's `%` layouts, which would return a Java pattern
/// unchanged; the pattern is converted (unsupported letters are refused
/// when the query is planned). A string argument is read as
/// `yyyy-MM-dd HH:mm:ss[.fff]`; one that does not parse (a date alone
/// too) gives NULL, as in Flink.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DateFormat {
    signature: Signature,
}

impl DateFormat {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            signature: Signature::any(2, Volatility::Immutable),
        })
    }
}

fn date_format_layout(v: Option<&ScalarValue>) -> Result<Option<weir_engine::time_format::JavaFormat>> {
    let text = match v {
        Some(ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s)) => s.clone(),
        Some(ScalarValue::Null) => None,
        Some(other) => {
            return datafusion::common::plan_err!("DATE_FORMAT's format must be a string, got {other}");
        }
        None => return datafusion::common::plan_err!("DATE_FORMAT's format must be a literal string"),
    };
    text.map(|t| {
        weir_engine::time_format::JavaFormat::new(&t)
            .map_err(|e| datafusion::common::DataFusionError::Plan(format!("DATE_FORMAT: {e}")))
    })
    .transpose()
}

impl datafusion::logical_expr::ScalarUDFImpl for DateFormat {
    fn name(&self) -> &str {
        "date_format"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, args: datafusion::logical_expr::ReturnFieldArgs) -> Result<FieldRef> {
        match args.arg_fields.first().map(|f| f.data_type()) {
            Some(DataType::Timestamp(..) | DataType::Date32 | DataType::Date64)
            | Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null) => {}
            Some(other) => {
                return datafusion::common::plan_err!(
                    "DATE_FORMAT takes a TIMESTAMP or a STRING, got {}",
                    crate::types::flink_name(other)
                );
            }
            None => return datafusion::common::plan_err!("DATE_FORMAT takes two arguments"),
        }
        date_format_layout(args.scalar_arguments.get(1).copied().flatten())?;
        Ok(Arc::new(Field::new(self.name(), DataType::Utf8, true)))
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        use arrow::array::{Array, AsArray, StringBuilder};
        use arrow::datatypes::{TimeUnit, TimestampMillisecondType};
        use datafusion::logical_expr::ColumnarValue;
        let layout = match &args.args[1] {
            ColumnarValue::Scalar(s) => date_format_layout(Some(s))?,
            ColumnarValue::Array(_) => {
                return datafusion::common::exec_err!("DATE_FORMAT's format must be a literal string");
            }
        };
        let n = args.number_rows;
        let value = args.args[0].to_array(n)?;
        let mut out = StringBuilder::with_capacity(n, n * 16);
        let Some(layout) = layout else {
            out.append_nulls(n);
            return Ok(ColumnarValue::Array(Arc::new(out.finish())));
        };
        let mut write = |t: Option<chrono::NaiveDateTime>| match t {
            Some(t) => out.append_value(layout.format(&t)),
            None => out.append_null(),
        };
        match value.data_type() {
            DataType::Timestamp(_, tz) => {
                let ms = cast(&value, &DataType::Timestamp(TimeUnit::Millisecond, tz.clone()))?;
                let ms = ms.as_primitive::<TimestampMillisecondType>();
                let zone: Option<arrow::array::timezone::Tz> = tz.as_deref().map(str::parse).transpose()?;
                for i in 0..ms.len() {
                    let t = (!ms.is_null(i))
                        .then(|| chrono::DateTime::from_timestamp_millis(ms.value(i)))
                        .flatten()
                        .map(|utc| match &zone {
                            Some(z) => utc.with_timezone(z).naive_local(),
                            None => utc.naive_utc(),
                        });
                    write(t);
                }
            }
            DataType::Date32 | DataType::Date64 => {
                let ms = cast(&value, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
                let ms = ms.as_primitive::<TimestampMillisecondType>();
                for i in 0..ms.len() {
                    write(
                        (!ms.is_null(i))
                            .then(|| chrono::DateTime::from_timestamp_millis(ms.value(i)))
                            .flatten()
                            .map(|t| t.naive_utc()),
                    );
                }
            }
            _ => {
                let text = cast(&value, &DataType::Utf8)?;
                let text = text.as_string::<i32>();
                for i in 0..text.len() {
                    let t = (!text.is_null(i))
                        .then(|| text.value(i).trim())
                        .and_then(|s| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").ok());
                    write(t);
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// Flink's `TYPEOF(x)`: the name of `x`'s type as Flink writes it
/// (`INT`, `DECIMAL(10, 2)`, `ARRAY<INT NOT NULL>`), `NOT NULL` when the
/// planner knows it holds no NULLs. The second argument of Flink's form
/// (`force_serializable`) changes nothing here and is accepted.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TypeOf {
    signature: Signature,
}

impl TypeOf {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            signature: Signature::one_of(
                vec![TypeSignature::Any(1), TypeSignature::Any(2)],
                Volatility::Immutable,
            ),
        })
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for TypeOf {
    fn name(&self) -> &str {
        "typeof"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, _args: datafusion::logical_expr::ReturnFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(Field::new(self.name(), DataType::Utf8, false)))
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        let Some(field) = args.arg_fields.first() else {
            return datafusion::common::exec_err!("TYPEOF takes one argument");
        };
        Ok(datafusion::logical_expr::ColumnarValue::Scalar(ScalarValue::Utf8(
            Some(crate::types::flink_field_type(field)),
        )))
    }
}

/// Flink's `LOG(x)` (natural) and `LOG(base, x)`; DataFusion's `log(x)` is
/// base 10.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkLog {
    signature: Signature,
}

impl FlinkLog {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            signature: Signature::one_of(
                vec![
                    TypeSignature::Uniform(1, vec![DataType::Float64]),
                    TypeSignature::Uniform(2, vec![DataType::Float64]),
                ],
                Volatility::Immutable,
            ),
        })
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for FlinkLog {
    fn name(&self) -> &str {
        "log"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        use arrow::array::{AsArray, Float64Array};
        use arrow::datatypes::Float64Type;
        let n = args.number_rows;
        let arrays = args
            .args
            .iter()
            .map(|a| a.to_array(n))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let out: Float64Array = match arrays.as_slice() {
            [x] => arrow::compute::unary(x.as_primitive::<Float64Type>(), f64::ln),
            [b, x] => arrow::compute::binary(
                b.as_primitive::<Float64Type>(),
                x.as_primitive::<Float64Type>(),
                |b, x| x.ln() / b.ln(),
            )?,
            _ => return datafusion::common::exec_err!("LOG takes one or two arguments"),
        };
        Ok(datafusion::logical_expr::ColumnarValue::Array(Arc::new(out)))
    }
}

/// Flink's `SQRT(x)`: NaN for a negative `x` (DataFusion's fails).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkSqrt {
    signature: Signature,
}

impl FlinkSqrt {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            signature: Signature::uniform(1, vec![DataType::Float64], Volatility::Immutable),
        })
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for FlinkSqrt {
    fn name(&self) -> &str {
        "sqrt"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        use arrow::array::{AsArray, Float64Array};
        use arrow::datatypes::Float64Type;
        let x = args.args[0].to_array(args.number_rows)?;
        let out: Float64Array = arrow::compute::unary(x.as_primitive::<Float64Type>(), f64::sqrt);
        Ok(datafusion::logical_expr::ColumnarValue::Array(Arc::new(out)))
    }
}

/// Flink's `GREATEST` / `LEAST`: DataFusion's, except that a NULL
/// argument makes the result NULL (DataFusion skips NULLs).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NullStrict {
    inner: Arc<datafusion::logical_expr::ScalarUDF>,
}

impl NullStrict {
    pub fn greatest() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            inner: datafusion::functions::core::greatest(),
        })
    }

    pub fn least() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(Self {
            inner: datafusion::functions::core::least(),
        })
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for NullStrict {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        let n = args.number_rows;
        let inputs = args
            .args
            .iter()
            .map(|a| a.to_array(n))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let result = self.inner.invoke_with_args(args)?.to_array(n)?;
        let mut any_null: Option<BooleanArray> = None;
        for a in &inputs {
            let nulls = arrow::compute::is_null(a)?;
            any_null = Some(match any_null {
                Some(acc) => arrow::compute::or(&acc, &nulls)?,
                None => nulls,
            });
        }
        let out = match any_null {
            Some(mask) => arrow::compute::nullif(&result, &mask)?,
            None => result,
        };
        Ok(datafusion::logical_expr::ColumnarValue::Array(out))
    }
}
