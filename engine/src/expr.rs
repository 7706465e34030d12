//! Physical expressions Weir evaluates faster than DataFusion's general
//! kernels, swapped in after planning ([`fast_paths`]).
//!
//! `ts - INTERVAL '5' SECOND` is every watermark's shape and common in
//! projections. DataFusion evaluates it through arrow's
//! `subtract_month_day_nano`, which goes through chrono per row (a q0
//! profile put it at 17 % of all CPU with chrono's helpers). An interval
//! of days and time only (no months) is a fixed number of milliseconds in
//! Flink, for `TIMESTAMP` and `TIMESTAMP_LTZ` alike (Flink's day is 86 400
//! s, DST or not), so it is one integer add per row here.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use arrow::datatypes::{
    ArrowTimestampType, DataType, FieldRef, IntervalDayTime, IntervalMonthDayNano, Schema, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Literal};

/// `expr` with the sub-expressions Weir has a faster kernel for replaced
/// (same results, same types, same errors on overflow).
pub fn fast_paths(expr: Arc<dyn PhysicalExpr>, schema: &Schema) -> Result<Arc<dyn PhysicalExpr>> {
    expr.transform_up(|e| {
        Ok(match TimestampShift::try_from_binary(&e, schema) {
            Some(shift) => Transformed::yes(Arc::new(shift) as Arc<dyn PhysicalExpr>),
            None => Transformed::no(e),
        })
    })
    .map(|t| t.data)
}

/// `timestamp ± interval` where the interval is a literal of days and
/// time only: an integer add in the timestamp's unit.
#[derive(Debug, Clone)]
pub struct TimestampShift {
    /// The expression it replaces, kept for display and stable uids.
    binary: BinaryExpr,
    /// The timestamp operand.
    ts: Arc<dyn PhysicalExpr>,
    /// Added to every value, in the timestamp's unit.
    delta: i64,
    unit: TimeUnit,
    /// `ts` is the binary's left operand (else its right).
    ts_left: bool,
}

impl TimestampShift {
    fn try_from_binary(e: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<Self> {
        let b = e.downcast_ref::<BinaryExpr>()?;
        let (ts, lit, sign, ts_left) = match (
            b.op(),
            b.right().downcast_ref::<Literal>(),
            b.left().downcast_ref::<Literal>(),
        ) {
            (Operator::Minus, Some(l), _) => (b.left(), l, -1i128, true),
            (Operator::Plus, Some(l), _) => (b.left(), l, 1, true),
            (Operator::Plus, None, Some(l)) => (b.right(), l, 1, false),
            _ => return None,
        };
        let DataType::Timestamp(unit, _) = ts.data_type(schema).ok()? else {
            return None;
        };
        let nanos: i128 = match lit.value() {
            ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano {
                months: 0,
                days,
                nanoseconds,
            })) => *days as i128 * 86_400_000_000_000 + *nanoseconds as i128,
            ScalarValue::IntervalDayTime(Some(IntervalDayTime { days, milliseconds })) => {
                (*days as i128 * 86_400_000 + *milliseconds as i128) * 1_000_000
            }
            _ => return None,
        };
        let per_unit: i128 = match unit {
            TimeUnit::Second => 1_000_000_000,
            TimeUnit::Millisecond => 1_000_000,
            TimeUnit::Microsecond => 1_000,
            TimeUnit::Nanosecond => 1,
        };
        // A fraction of the unit (a microsecond on TIMESTAMP(3)) rounds
        // in the general kernel: leave those to it.
        if nanos % per_unit != 0 {
            return None;
        }
        let delta = i64::try_from(sign * nanos / per_unit).ok()?;
        Some(Self {
            binary: b.clone(),
            ts: ts.clone(),
            delta,
            unit,
            ts_left,
        })
    }

    /// The expression it replaced.
    pub fn binary(&self) -> &BinaryExpr {
        &self.binary
    }

    fn shift<T: ArrowTimestampType>(&self, a: &ArrayRef) -> std::result::Result<ArrayRef, ArrowError> {
        let p = a.as_primitive::<T>();
        let delta = self.delta;
        let out: PrimitiveArray<T> = p.try_unary(|v| {
            v.checked_add(delta).ok_or_else(|| {
                ArrowError::ArithmeticOverflow(format!("Overflow happened on: {v:?} {} {delta:?}", self.binary.op()))
            })
        })?;
        Ok(Arc::new(out.with_data_type(a.data_type().clone())))
    }
}

impl PartialEq for TimestampShift {
    fn eq(&self, other: &Self) -> bool {
        self.binary == other.binary
    }
}

impl Eq for TimestampShift {}

impl Hash for TimestampShift {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.binary.hash(state)
    }
}

impl fmt::Display for TimestampShift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.binary.fmt(f)
    }
}

impl PhysicalExpr for TimestampShift {
    fn data_type(&self, schema: &Schema) -> Result<DataType> {
        self.ts.data_type(schema)
    }

    fn nullable(&self, schema: &Schema) -> Result<bool> {
        self.ts.nullable(schema)
    }

    fn return_field(&self, schema: &Schema) -> Result<FieldRef> {
        self.binary.return_field(schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let array = match self.ts.evaluate(batch)? {
            ColumnarValue::Array(a) => a,
            // A constant timestamp: the general kernel, once.
            ColumnarValue::Scalar(_) => return self.binary.evaluate(batch),
        };
        let out = match self.unit {
            TimeUnit::Second => self.shift::<TimestampSecondType>(&array),
            TimeUnit::Millisecond => self.shift::<TimestampMillisecondType>(&array),
            TimeUnit::Microsecond => self.shift::<TimestampMicrosecondType>(&array),
            TimeUnit::Nanosecond => self.shift::<TimestampNanosecondType>(&array),
        }?;
        Ok(ColumnarValue::Array(out))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.ts]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        let ts = children.into_iter().next().unwrap_or_else(|| self.ts.clone());
        let binary = if self.ts_left {
            BinaryExpr::new(ts.clone(), *self.binary.op(), self.binary.right().clone())
        } else {
            BinaryExpr::new(self.binary.left().clone(), *self.binary.op(), ts.clone())
        };
        Ok(Arc::new(Self {
            binary,
            ts,
            delta: self.delta,
            unit: self.unit,
            ts_left: self.ts_left,
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.binary.fmt_sql(f)
    }
}

/// The name the planner gives Flink's `CURRENT_WATERMARK(rowtime)` call.
pub const CURRENT_WATERMARK: &str = "current_watermark";

/// Flink's `CURRENT_WATERMARK(rowtime)`: the watermark the evaluating
/// operator has received, `NULL` before its first. Planned as a call of
/// the [`CURRENT_WATERMARK`] function, which a Calc operator swaps for this
/// expression bound to its own watermark ([`bind_current_watermark`]).
#[derive(Debug)]
pub struct CurrentWatermark {
    /// The planned call, kept for display.
    call: Arc<dyn PhysicalExpr>,
    /// The operator's watermark (ms); `i64::MIN`: none yet.
    watermark: Arc<std::sync::atomic::AtomicI64>,
    data_type: DataType,
}

impl CurrentWatermark {
    /// The planned call it evaluates against the operator's watermark.
    pub fn call(&self) -> &Arc<dyn PhysicalExpr> {
        &self.call
    }
}

impl PartialEq for CurrentWatermark {
    fn eq(&self, other: &Self) -> bool {
        self.call.as_ref() == other.call.as_ref()
    }
}

impl Eq for CurrentWatermark {}

impl Hash for CurrentWatermark {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.call.hash(state)
    }
}

impl fmt::Display for CurrentWatermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.call.fmt(f)
    }
}

impl PhysicalExpr for CurrentWatermark {
    fn data_type(&self, _schema: &Schema) -> Result<DataType> {
        Ok(self.data_type.clone())
    }

    fn nullable(&self, _schema: &Schema) -> Result<bool> {
        Ok(true)
    }

    fn return_field(&self, schema: &Schema) -> Result<FieldRef> {
        self.call.return_field(schema)
    }

    fn evaluate(&self, _batch: &RecordBatch) -> Result<ColumnarValue> {
        let w = self.watermark.load(std::sync::atomic::Ordering::Relaxed);
        let value = (w != i64::MIN).then_some(w);
        let tz = match &self.data_type {
            DataType::Timestamp(_, tz) => tz.clone(),
            _ => None,
        };
        Ok(ColumnarValue::Scalar(ScalarValue::TimestampMillisecond(value, tz)))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        // The rowtime argument names the attribute; it is not evaluated.
        vec![]
    }

    fn with_new_children(self: Arc<Self>, _children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(self)
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.call.fmt_sql(f)
    }
}

/// `expr` with every `CURRENT_WATERMARK(...)` call reading `watermark`;
/// whether it had one.
pub fn bind_current_watermark(
    expr: Arc<dyn PhysicalExpr>,
    schema: &Schema,
    watermark: &Arc<std::sync::atomic::AtomicI64>,
) -> Result<(Arc<dyn PhysicalExpr>, bool)> {
    let mut found = false;
    let bound = expr
        .transform_up(|e| {
            let is_call = e
                .downcast_ref::<datafusion::physical_expr::ScalarFunctionExpr>()
                .is_some_and(|f| f.name() == CURRENT_WATERMARK);
            if !is_call {
                return Ok(Transformed::no(e));
            }
            found = true;
            let data_type = e.data_type(schema)?;
            Ok(Transformed::yes(Arc::new(CurrentWatermark {
                call: e,
                watermark: watermark.clone(),
                data_type,
            }) as Arc<dyn PhysicalExpr>))
        })?
        .data;
    Ok((bound, found))
}

#[cfg(test)]
mod tests {
    use arrow::array::{TimestampMillisecondArray, TimestampSecondArray};
    use arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::col;

    use super::*;

    fn schema(dt: DataType) -> Schema {
        Schema::new(vec![Field::new("ts", dt, true)])
    }

    fn check(dt: DataType, array: ArrayRef, op: Operator, interval: ScalarValue, swapped: bool) {
        let s = schema(dt);
        let c = col("ts", &s).expect("test");
        let l: Arc<dyn PhysicalExpr> = Arc::new(Literal::new(interval));
        let general: Arc<dyn PhysicalExpr> = if swapped {
            Arc::new(BinaryExpr::new(l, op, c))
        } else {
            Arc::new(BinaryExpr::new(c, op, l))
        };
        let fast = fast_paths(general.clone(), &s).expect("test");
        assert!(fast.downcast_ref::<TimestampShift>().is_some(), "{fast}");
        assert_eq!(fast.to_string(), general.to_string());
        let batch = RecordBatch::try_new(Arc::new(s), vec![array]).expect("test");
        let want = general
            .evaluate(&batch)
            .expect("test")
            .into_array(batch.num_rows())
            .expect("test");
        let got = fast
            .evaluate(&batch)
            .expect("test")
            .into_array(batch.num_rows())
            .expect("test");
        assert_eq!(got.as_ref(), want.as_ref());
    }

    fn ms() -> ArrayRef {
        Arc::new(TimestampMillisecondArray::from(vec![
            Some(1_700_000_000_123),
            None,
            Some(0),
            Some(-86_400_001),
        ]))
    }

    #[test]
    fn day_time_intervals_shift_like_the_general_kernel() {
        let five_s = ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(0, 0, 5_000_000_000)));
        let day_and_ms = ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(0, 2, 7_000_000)));
        let dt = ScalarValue::IntervalDayTime(Some(IntervalDayTime::new(1, 250)));
        let ts3 = DataType::Timestamp(TimeUnit::Millisecond, None);
        check(ts3.clone(), ms(), Operator::Minus, five_s.clone(), false);
        check(ts3.clone(), ms(), Operator::Plus, day_and_ms, false);
        check(ts3.clone(), ms(), Operator::Plus, five_s, true);
        check(ts3, ms(), Operator::Minus, dt, false);
        let secs: ArrayRef = Arc::new(TimestampSecondArray::from(vec![Some(10), None]));
        let one_min = ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(0, 0, 60_000_000_000)));
        check(
            DataType::Timestamp(TimeUnit::Second, None),
            secs,
            Operator::Minus,
            one_min,
            false,
        );
        let utc = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
        let ltz: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![Some(5_000)]).with_timezone("UTC"));
        let hour = ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(0, 0, 3_600_000_000_000)));
        check(utc, ltz, Operator::Minus, hour, false);
    }

    #[test]
    fn months_and_sub_unit_intervals_keep_the_general_kernel() {
        let s = schema(DataType::Timestamp(TimeUnit::Millisecond, None));
        for interval in [
            IntervalMonthDayNano::new(1, 0, 0),
            // A microsecond on TIMESTAMP(3).
            IntervalMonthDayNano::new(0, 0, 1_000),
        ] {
            let e: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
                col("ts", &s).expect("test"),
                Operator::Minus,
                Arc::new(Literal::new(ScalarValue::IntervalMonthDayNano(Some(interval)))),
            ));
            let fast = fast_paths(e, &s).expect("test");
            assert!(fast.downcast_ref::<TimestampShift>().is_none());
        }
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let s = schema(DataType::Timestamp(TimeUnit::Millisecond, None));
        let e: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            col("ts", &s).expect("test"),
            Operator::Minus,
            Arc::new(Literal::new(ScalarValue::IntervalMonthDayNano(Some(
                IntervalMonthDayNano::new(0, 0, 1_000_000_000),
            )))),
        ));
        let fast = fast_paths(e, &s).expect("test");
        let a: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![i64::MIN]));
        let batch = RecordBatch::try_new(Arc::new(s), vec![a]).expect("test");
        assert!(fast.evaluate(&batch).is_err());
    }
}
