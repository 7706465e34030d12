//! Flink's unit arithmetic on times: `TIMESTAMPADD(unit, n, t)`,
//! `TIMESTAMPDIFF(unit, t1, t2)` and `FLOOR/CEIL(t TO unit)`, over
//! `TIMESTAMP(p)` and `DATE` values in their own ticks (no text, no loss
//! of precision). The planner's AST rewrite (`functions::flink_calls`)
//! turns each into `__weir_<op>('UNIT', ...)` after checking the unit, so
//! a unit here is always one of [`Unit`]'s.
//!
//! Flink's rules, checked on Flink 2.3 by the conformance suite:
//! - month-based units add by calendar months, clamping the day to the
//!   month's last (`2024-01-31 + 1 MONTH = 2024-02-29`);
//! - `TIMESTAMPDIFF` counts whole units towards zero, as an `INT`; for
//!   months, a month is whole only when the later day-of-month and time
//!   reach the earlier's (Calcite's `subtractMonths`);
//! - weeks start on Sunday;
//! - `CEIL` of a value already on a boundary is the value itself, and
//!   `CEIL` to a WEEK, MONTH, QUARTER or YEAR looks at the date only, so
//!   the first day of a month at 13:45 rounds up to its own midnight
//!   (Flink's answer, below the value);
//! - a DATE plus hours, minutes or seconds is a `TIMESTAMP(6)`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, PrimitiveArray};
use arrow::compute::cast;
use arrow::datatypes::{
    ArrowTimestampType, DataType, Field, FieldRef, Int64Type, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use chrono::{Datelike, Months, NaiveDate};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// A unit of Flink's time arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

impl Unit {
    /// The unit a SQL keyword names (`HOUR`, `SQL_TSI_HOUR`).
    pub fn parse(name: &str) -> Option<Unit> {
        let upper = name.to_ascii_uppercase();
        let bare = upper.strip_prefix("SQL_TSI_").unwrap_or(&upper);
        Some(match bare {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "QUARTER" => Unit::Quarter,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Quarter => "QUARTER",
            Unit::Year => "YEAR",
        }
    }

    pub const ALL: &'static str = "SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, QUARTER or YEAR";

    /// Seconds in a fixed-length unit; `None` for calendar months.
    fn seconds(self) -> Option<i64> {
        match self {
            Unit::Second => Some(1),
            Unit::Minute => Some(60),
            Unit::Hour => Some(3_600),
            Unit::Day => Some(86_400),
            Unit::Week => Some(7 * 86_400),
            Unit::Month | Unit::Quarter | Unit::Year => None,
        }
    }

    /// Calendar months in a month-based unit.
    fn months(self) -> i64 {
        match self {
            Unit::Quarter => 3,
            Unit::Year => 12,
            _ => 1,
        }
    }
}

/// Which computation a UDF does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Add,
    Diff,
    Floor,
    Ceil,
}

impl Op {
    /// The internal name the AST rewrite calls.
    pub fn udf_name(self) -> &'static str {
        match self {
            Op::Add => crate::functions::names::TIMESTAMPADD,
            Op::Diff => crate::functions::names::TIMESTAMPDIFF,
            Op::Floor => crate::functions::names::FLOOR_TIME,
            Op::Ceil => crate::functions::names::CEIL_TIME,
        }
    }

    fn flink_name(self) -> &'static str {
        match self {
            Op::Add => "TIMESTAMPADD",
            Op::Diff => "TIMESTAMPDIFF",
            Op::Floor => "FLOOR",
            Op::Ceil => "CEIL",
        }
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TimeArith {
    op: Op,
    signature: Signature,
}

/// The four UDFs, to register.
pub fn all() -> Vec<ScalarUDF> {
    [Op::Add, Op::Diff, Op::Floor, Op::Ceil]
        .into_iter()
        .map(|op| {
            ScalarUDF::new_from_impl(TimeArith {
                op,
                signature: Signature::variadic_any(Volatility::Immutable),
            })
        })
        .collect()
}

/// A time value's representation: ticks of a timestamp unit, or days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ticks {
    Timestamp(TimeUnit),
    Date,
}

impl Ticks {
    fn of(t: &DataType) -> Option<Ticks> {
        match t {
            // A TIMESTAMP_LTZ's instants are counted in UTC (the session
            // zone's wall time is the caller's: `flink_zone`).
            DataType::Timestamp(u, _) => Some(Ticks::Timestamp(*u)),
            DataType::Date32 => Some(Ticks::Date),
            _ => None,
        }
    }

    /// Ticks in a day.
    fn per_day(self) -> i64 {
        match self {
            Ticks::Date => 1,
            Ticks::Timestamp(u) => 86_400 * per_second(u),
        }
    }

    /// Ticks in a fixed unit (`None` when the unit is shorter than a
    /// tick: a second of a DATE).
    fn per_unit(self, seconds: i64) -> Option<i64> {
        match self {
            Ticks::Date => (seconds % 86_400 == 0).then_some(seconds / 86_400),
            Ticks::Timestamp(u) => Some(seconds * per_second(u)),
        }
    }
}

fn per_second(u: TimeUnit) -> i64 {
    match u {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    }
}

const EPOCH: NaiveDate = NaiveDate::from_ymd_opt(1970, 1, 1).expect("a valid date");

fn date_of(days: i64) -> Option<NaiveDate> {
    EPOCH.checked_add_signed(chrono::TimeDelta::try_days(days)?)
}

fn days_of(d: NaiveDate) -> i64 {
    (d - EPOCH).num_days()
}

/// `days` plus `months` calendar months, the day clamped to the month's
/// last (Calcite's `addMonths`, Java's `plusMonths`).
fn add_months(days: i64, months: i64) -> Option<i64> {
    let d = date_of(days)?;
    let m = Months::new(u32::try_from(months.unsigned_abs()).ok()?);
    let d = if months >= 0 {
        d.checked_add_months(m)?
    } else {
        d.checked_sub_months(m)?
    };
    Some(days_of(d))
}

/// Whole months from `d1` to `d0` (Calcite's `subtractMonths(int, int)`).
fn months_between_dates(d0: i64, d1: i64) -> Option<i64> {
    if d0 < d1 {
        return months_between_dates(d1, d0).map(|m| -m);
    }
    // No month has more than 31 days, so this is at most the answer.
    let mut m = (d0 - d1) / 31;
    loop {
        if add_months(d1, m)? >= d0 || add_months(d1, m + 1)? > d0 {
            return Some(m);
        }
        m += 1;
    }
}

/// Whole months from `t1` to `t0`, in ticks of `per_day` a day (Calcite's
/// `subtractMonths(long, long)`: a month ending on the same day but at an
/// earlier time of day is not whole).
fn months_between(t0: i64, t1: i64, per_day: i64) -> Option<i64> {
    let (d0, r0) = (t0.div_euclid(per_day), t0.rem_euclid(per_day));
    let (d1, r1) = (t1.div_euclid(per_day), t1.rem_euclid(per_day));
    let mut x = months_between_dates(d0, d1)?;
    if add_months(d1, x)? == d0 && r0 < r1 {
        x -= 1;
    }
    Some(x)
}

/// The first day of `unit`'s period holding `days`.
fn floor_days(days: i64, unit: Unit) -> Option<i64> {
    let d = date_of(days)?;
    let first = match unit {
        // 1970-01-01 was a Thursday: Sunday is 0.
        Unit::Week => return Some(days - (days + 4).rem_euclid(7)),
        Unit::Month => d.with_day(1)?,
        Unit::Quarter => NaiveDate::from_ymd_opt(d.year(), (d.month0() / 3) * 3 + 1, 1)?,
        Unit::Year => NaiveDate::from_ymd_opt(d.year(), 1, 1)?,
        _ => d,
    };
    Some(days_of(first))
}

/// `FLOOR`/`CEIL` of one value in ticks.
fn round(v: i64, ticks: Ticks, unit: Unit, up: bool) -> Option<i64> {
    if let Some(secs) = unit.seconds().filter(|_| unit != Unit::Week) {
        let Some(len) = ticks.per_unit(secs) else {
            // A DATE is already whole seconds, minutes and hours.
            return Some(v);
        };
        let floor = v.div_euclid(len) * len;
        return if up && floor != v {
            floor.checked_add(len)
        } else {
            Some(floor)
        };
    }
    let per_day = ticks.per_day();
    let days = v.div_euclid(per_day);
    let floor = floor_days(days, unit)?;
    // Flink rounds a WEEK, MONTH, QUARTER or YEAR up from the date alone:
    // `CEIL(TIMESTAMP '2024-02-01 13:45:00' TO MONTH)` is 2024-02-01.
    if !up || floor == days {
        return floor.checked_mul(per_day);
    }
    let next = match unit {
        Unit::Week => floor + 7,
        _ => add_months(floor, unit.months())?,
    };
    next.checked_mul(per_day)
}

/// `TIMESTAMPADD` of one value in ticks.
fn add(v: i64, n: i64, ticks: Ticks, unit: Unit) -> Option<i64> {
    match unit.seconds() {
        Some(secs) => v.checked_add(n.checked_mul(ticks.per_unit(secs)?)?),
        None => {
            let per_day = ticks.per_day();
            let (days, rem) = (v.div_euclid(per_day), v.rem_euclid(per_day));
            add_months(days, n.checked_mul(unit.months())?)?
                .checked_mul(per_day)?
                .checked_add(rem)
        }
    }
}

/// Nanoseconds per tick, to compare a DATE with a TIMESTAMP (i128: a
/// DATE's nanoseconds overflow i64 past 2262).
fn nanos(v: i64, ticks: Ticks) -> i128 {
    let per = match ticks {
        Ticks::Date => 86_400 * 1_000_000_000,
        Ticks::Timestamp(u) => 1_000_000_000 / per_second(u),
    };
    i128::from(v) * i128::from(per)
}

/// `TIMESTAMPDIFF` from `a` to `b` (nanoseconds).
fn diff(a: i128, b: i128, unit: Unit) -> Option<i64> {
    let whole = match unit.seconds() {
        Some(secs) => (b - a) / (i128::from(secs) * 1_000_000_000),
        None => {
            // Calendar months only need millisecond precision (Flink's).
            let ms = |n: i128| i64::try_from(n.div_euclid(1_000_000)).ok();
            i128::from(months_between(ms(b)?, ms(a)?, 86_400_000)? / unit.months())
        }
    };
    i64::try_from(whole).ok()
}

/// The i64 ticks of a timestamp or date array (dates widened).
fn ticks_array(a: &ArrayRef, ticks: Ticks) -> Result<PrimitiveArray<Int64Type>> {
    Ok(match ticks {
        Ticks::Date => cast(a, &DataType::Int64)?.as_primitive::<Int64Type>().clone(),
        Ticks::Timestamp(u) => {
            fn raw<T: ArrowTimestampType>(a: &ArrayRef) -> PrimitiveArray<Int64Type> {
                a.as_primitive::<T>().reinterpret_cast::<Int64Type>()
            }
            match u {
                TimeUnit::Second => raw::<TimestampSecondType>(a),
                TimeUnit::Millisecond => raw::<TimestampMillisecondType>(a),
                TimeUnit::Microsecond => raw::<TimestampMicrosecondType>(a),
                TimeUnit::Nanosecond => raw::<TimestampNanosecondType>(a),
            }
        }
    })
}

/// Ticks back to the value's own type.
fn from_ticks(v: PrimitiveArray<Int64Type>, ticks: Ticks) -> Result<ArrayRef> {
    let v: ArrayRef = Arc::new(v);
    Ok(match ticks {
        Ticks::Date => cast(&v, &DataType::Date32)?,
        Ticks::Timestamp(u) => cast(&v, &DataType::Timestamp(u, None))?,
    })
}

impl TimeArith {
    /// The unit argument (a literal the rewrite put there).
    fn unit(&self, arg: &ColumnarValue) -> Result<Unit> {
        match arg {
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(u))) => match Unit::parse(u) {
                Some(u) => Ok(u),
                None => exec_err!("{}: no time unit {u} (one of {})", self.op.flink_name(), Unit::ALL),
            },
            _ => exec_err!("{}: the time unit must be a keyword", self.op.flink_name()),
        }
    }

    fn time_arg(&self, t: &DataType, what: &str) -> Result<Ticks> {
        match Ticks::of(t) {
            Some(k) => Ok(k),
            None => plan_err!(
                "{}: {what} must be a TIMESTAMP or DATE, not {}",
                self.op.flink_name(),
                crate::types::flink_name(t)
            ),
        }
    }
}

impl ScalarUDFImpl for TimeArith {
    fn name(&self) -> &str {
        self.op.udf_name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let name = self.op.flink_name();
        match (self.op, args) {
            (Op::Add, [_, n, t]) => {
                if !n.is_integer() && !n.is_null() {
                    return plan_err!(
                        "TIMESTAMPADD: the count must be an integer, not {}",
                        crate::types::flink_name(n)
                    );
                }
                self.time_arg(t, "the time")?;
                // Typed by `return_field_from_args`, which sees the unit.
                Ok(t.clone())
            }
            (Op::Diff, [_, a, b]) => {
                self.time_arg(a, "the first time")?;
                self.time_arg(b, "the second time")?;
                Ok(DataType::Int32)
            }
            (Op::Floor | Op::Ceil, [_, t]) => {
                self.time_arg(t, "the time")?;
                Ok(t.clone())
            }
            _ => plan_err!("{name}: wrong number of arguments ({})", args.len().saturating_sub(1)),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let types: Vec<DataType> = args.arg_fields.iter().map(|f| f.data_type().clone()).collect();
        let mut ty = self.return_type(&types)?;
        let unit = match args.scalar_arguments.first() {
            Some(Some(ScalarValue::Utf8(Some(u)))) => Unit::parse(u),
            _ => None,
        };
        if self.op == Op::Add && ty == DataType::Date32 && unit.is_some_and(|u| u.seconds().is_some_and(|s| s < 86_400))
        {
            ty = DataType::Timestamp(TimeUnit::Microsecond, None);
        }
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        Ok(Arc::new(Field::new(self.name(), ty, nullable)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let unit = self.unit(&args.args[0])?;
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let arrays = args.args[1..]
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let name = self.op.flink_name();
        let overflow = || {
            datafusion::error::DataFusionError::Execution(format!("{name}: the result is out of the range of its type"))
        };
        let out: ArrayRef = match self.op {
            Op::Floor | Op::Ceil => {
                let ticks = self.time_arg(arrays[0].data_type(), "the time")?;
                let v = ticks_array(&arrays[0], ticks)?;
                let up = self.op == Op::Ceil;
                let r: PrimitiveArray<Int64Type> = v
                    .iter()
                    .map(|x| x.map(|x| round(x, ticks, unit, up).ok_or_else(overflow)).transpose())
                    .collect::<Result<_>>()?;
                from_ticks(r, ticks)?
            }
            Op::Add => {
                let mut time = arrays[1].clone();
                if time.data_type() != args.return_field.data_type() {
                    // A DATE plus hours is a timestamp.
                    time = cast(&time, args.return_field.data_type())?;
                }
                let arrays = [arrays[0].clone(), time];
                let ticks = self.time_arg(arrays[1].data_type(), "the time")?;
                let n = cast(&arrays[0], &DataType::Int64)?;
                let n = n.as_primitive::<Int64Type>();
                let v = ticks_array(&arrays[1], ticks)?;
                let r: PrimitiveArray<Int64Type> = n
                    .iter()
                    .zip(v.iter())
                    .map(|(n, x)| match (n, x) {
                        (Some(n), Some(x)) => add(x, n, ticks, unit).map(Some).ok_or_else(overflow),
                        _ => Ok(None),
                    })
                    .collect::<Result<_>>()?;
                from_ticks(r, ticks)?
            }
            Op::Diff => {
                let ta = self.time_arg(arrays[0].data_type(), "the first time")?;
                let tb = self.time_arg(arrays[1].data_type(), "the second time")?;
                let a = ticks_array(&arrays[0], ta)?;
                let b = ticks_array(&arrays[1], tb)?;
                let r: Int32Array = a
                    .iter()
                    .zip(b.iter())
                    .map(|(a, b)| match (a, b) {
                        (Some(a), Some(b)) => diff(nanos(a, ta), nanos(b, tb), unit)
                            .and_then(|d| i32::try_from(d).ok())
                            .map(Some)
                            .ok_or_else(overflow),
                        _ => Ok(None),
                    })
                    .collect::<Result<_>>()?;
                Arc::new(r)
            }
        };
        // A TIMESTAMP_LTZ comes back labelled as one.
        let out = match args.return_field.data_type() {
            t @ DataType::Timestamp(_, Some(_)) if out.data_type() != t => cast(&out, t)?,
            _ => out,
        };
        crate::udf::columnar(out, all_scalar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(y: i32, m: u32, d: u32) -> i64 {
        days_of(NaiveDate::from_ymd_opt(y, m, d).expect("valid"))
    }

    #[test]
    fn months_clamp_and_count_as_calcite() {
        assert_eq!(add_months(day(2024, 1, 31), 1), Some(day(2024, 2, 29)));
        assert_eq!(add_months(day(2024, 3, 31), -1), Some(day(2024, 2, 29)));
        assert_eq!(months_between_dates(day(2024, 2, 29), day(2024, 1, 31)), Some(1));
        assert_eq!(months_between_dates(day(2024, 2, 28), day(2024, 1, 31)), Some(0));
        // The same day of month at an earlier time is not a whole month.
        let ms = 86_400_000;
        let t = |d: i64, h: i64| d * ms + h * 3_600_000;
        assert_eq!(
            months_between(t(day(2024, 3, 29), 10), t(day(2024, 2, 29), 11), ms),
            Some(0)
        );
        assert_eq!(
            months_between(t(day(2024, 3, 29), 11), t(day(2024, 2, 29), 11), ms),
            Some(1)
        );
    }

    #[test]
    fn weeks_start_on_sunday_and_ceil_keeps_boundaries() {
        let ms = Ticks::Timestamp(TimeUnit::Millisecond);
        // 2024-02-29 was a Thursday; its week began on Sunday the 25th.
        let thu = day(2024, 2, 29) * 86_400_000;
        assert_eq!(round(thu, ms, Unit::Week, false), Some(day(2024, 2, 25) * 86_400_000));
        assert_eq!(round(thu, ms, Unit::Week, true), Some(day(2024, 3, 3) * 86_400_000));
        assert_eq!(round(thu, ms, Unit::Month, true), Some(day(2024, 3, 1) * 86_400_000));
        let first = day(2024, 3, 1) * 86_400_000;
        assert_eq!(round(first, ms, Unit::Month, true), Some(first));
        // Flink's: above a day, CEIL looks at the date only.
        assert_eq!(round(first + 3_600_000, ms, Unit::Month, true), Some(first));
        assert_eq!(round(first + 3_600_000, ms, Unit::Day, true), Some(first + 86_400_000));
        // Before 1970 a floor goes down, not towards zero.
        assert_eq!(round(-1, ms, Unit::Day, false), Some(-86_400_000));
    }
}
