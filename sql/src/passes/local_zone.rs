//! `table.local-time-zone` other than UTC. A TIMESTAMP_LTZ is an instant
//! (Arrow: a timestamp labelled `UTC`, the same in every zone); what the
//! session zone changes is how it meets wall-clock values. After type
//! coercion, [`local_zone`] rewrites each such meeting into an explicit
//! conversion ([`ZoneShift`]), so the rest of the planner and every
//! operator keep working on plain numbers:
//!
//! - casts of a TIMESTAMP_LTZ to TIMESTAMP, DATE, TIME or STRING (explicit,
//!   or inserted by coercion: `CONCAT`, `||`) read its wall time in the
//!   zone; casts of those to TIMESTAMP_LTZ read them as the zone's wall
//!   time (Java's `LocalDateTime.atZone`: an overlap's earlier instant);
//! - `EXTRACT`, `HOUR` ... `DAYOFWEEK`, `DATE_FORMAT` and Weir's text
//!   functions of a TIMESTAMP_LTZ see its wall time;
//! - `FLOOR/CEIL(ltz TO unit)` round the wall time and shift it back by
//!   the instant's own offset, as Flink 2.3 does (so across a daylight
//!   saving change the result is an hour off the zone's midnight, as
//!   Flink's);
//! - `UNIX_TIMESTAMP(s)` reads `s` in the zone (a lenient `Calendar`: an
//!   overlap's later instant), `FROM_UNIXTIME(n)` writes the zone's time;
//! - `LOCALTIMESTAMP`, `CURRENT_DATE`, `CURRENT_TIME`, `LOCALTIME` are the
//!   zone's.
//!
//! A window on a TIMESTAMP_LTZ time attribute is cut on the zone's wall
//! clock, as Flink's (days of 23 and 25 hours): its marker becomes a zoned
//! `WindowMarker` (`window_start`/`window_end` are wall times, TIMESTAMP(3)
//! as in Flink), and the window aggregate compares watermarks with window
//! ends on the wall clock (`time_zone::local_watermark`); so do window
//! joins and window Top-N of such windows, and SESSION windows (their gaps
//! measured on wall times, as Flink's).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ExprSchema, Result, exec_err, plan_err};
use datafusion::logical_expr::expr::{Cast, ScalarFunction, TryCast};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, LogicalPlan, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use weir_engine::time_zone::{Resolve, SessionZone};

/// Which way a [`ZoneShift`] converts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Shift {
    /// Instant → the zone's wall time (a TIMESTAMP, or epoch seconds).
    ToLocal,
    /// Wall time → the instant it names (a TIMESTAMP_LTZ, or seconds).
    ToInstant(Resolve),
    /// `(wall, instant)` → `wall` read with `instant`'s offset: Flink's
    /// `FLOOR/CEIL(ltz TO unit)`.
    BackByOffsetOf,
}

/// A conversion between instants and the session zone's wall times, of
/// timestamps (any precision) or of BIGINT epoch seconds.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ZoneShift {
    zone: SessionZone,
    shift: Shift,
    signature: Signature,
}

impl ZoneShift {
    fn call(zone: &SessionZone, shift: Shift, args: Vec<Expr>) -> Expr {
        let udf = ScalarUDF::new_from_impl(Self {
            zone: zone.clone(),
            shift,
            signature: Signature::any(args.len(), Volatility::Immutable),
        });
        Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(udf), args))
    }
}

/// Ticks per second of a timestamp, 1 for BIGINT epoch seconds.
fn ticks_per_second(t: &DataType) -> Option<i64> {
    match t {
        DataType::Int64 => Some(1),
        t => weir_engine::time_zone::ticks_per_second(t),
    }
}

impl ScalarUDFImpl for ZoneShift {
    fn name(&self) -> &str {
        match self.shift {
            Shift::ToLocal => crate::functions::names::LOCAL_TIME,
            Shift::ToInstant(Resolve::Earlier) => crate::functions::names::INSTANT_OF_LOCAL_TIME,
            Shift::ToInstant(Resolve::Later) => crate::functions::names::INSTANT_OF_LOCAL_TIME_LENIENT,
            Shift::BackByOffsetOf => crate::functions::names::LOCAL_TIME_WITH_OFFSET_OF,
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match (args.first(), self.shift) {
            (Some(DataType::Int64), _) => Ok(DataType::Int64),
            (Some(DataType::Timestamp(unit, _)), Shift::ToLocal) => Ok(DataType::Timestamp(*unit, None)),
            (Some(DataType::Timestamp(unit, _)), _) => Ok(DataType::Timestamp(*unit, Some("UTC".into()))),
            (other, _) => plan_err!("{} takes a timestamp or epoch seconds, not {other:?}", self.name()),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let types: Vec<DataType> = args.arg_fields.iter().map(|f| f.data_type().clone()).collect();
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        Ok(Arc::new(Field::new(self.name(), self.return_type(&types)?, nullable)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let values = args.args[0].to_array(rows)?;
        let Some(ticks) = ticks_per_second(values.data_type()) else {
            return exec_err!("{} takes a timestamp, not {}", self.name(), values.data_type());
        };
        let to = self.return_type(&[values.data_type().clone()])?;
        let raw = arrow::compute::cast(&values, &DataType::Int64)?;
        let raw = raw.as_primitive::<Int64Type>();
        let tz = &self.zone.tz;
        let out = match self.shift {
            Shift::ToLocal => raw.try_unary::<_, Int64Type, _>(|v| {
                weir_engine::time_zone::to_local(v, ticks, tz).ok_or_else(|| self.out_of_range())
            })?,
            Shift::ToInstant(resolve) => raw.try_unary::<_, Int64Type, _>(|v| {
                weir_engine::time_zone::from_local(v, ticks, tz, resolve).ok_or_else(|| self.out_of_range())
            })?,
            Shift::BackByOffsetOf => {
                let reference = args.args[1].to_array(rows)?;
                let Some(ref_ticks) = ticks_per_second(reference.data_type()) else {
                    return exec_err!("{} takes a timestamp, not {}", self.name(), reference.data_type());
                };
                let reference = arrow::compute::cast(&reference, &DataType::Int64)?;
                arrow::compute::kernels::arity::try_binary::<_, _, _, Int64Type>(
                    raw,
                    reference.as_primitive::<Int64Type>(),
                    |wall, instant| {
                        let local = weir_engine::time_zone::to_local(instant, ref_ticks, tz)
                            .ok_or_else(|| self.out_of_range())?;
                        let offset_secs = (local - instant).div_euclid(ref_ticks);
                        wall.checked_sub(offset_secs * ticks).ok_or_else(|| self.out_of_range())
                    },
                )?
            }
        };
        let out: ArrayRef = arrow::compute::cast(&out, &to)?;
        crate::udf::columnar(out, all_scalar)
    }
}

impl ZoneShift {
    fn out_of_range(&self) -> arrow::error::ArrowError {
        arrow::error::ArrowError::ComputeError(format!(
            "a timestamp out of range in time zone '{}' ('table.local-time-zone')",
            self.zone.id
        ))
    }
}

fn is_ltz(t: &DataType) -> bool {
    matches!(t, DataType::Timestamp(_, Some(_)))
}

/// A wall-clock type a TIMESTAMP_LTZ is cast to or from in the zone.
fn is_wall_clock(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Timestamp(_, None)
            | DataType::Date32
            | DataType::Date64
            | DataType::Time32(_)
            | DataType::Time64(_)
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
    )
}

/// Rewrites every meeting of a TIMESTAMP_LTZ with the session zone's wall
/// time in `plan` into a [`ZoneShift`] (nothing for UTC).
pub fn local_zone(plan: LogicalPlan, zone: Option<&SessionZone>) -> Result<Transformed<LogicalPlan>> {
    let Some(zone) = zone else {
        return Ok(Transformed::no(plan));
    };
    // Windows first: a zoned marker's window_start is a wall time, which
    // every node above must see in its schema before its casts are read.
    let windows = crate::passes::rewrite_expressions(plan, |e, schema| {
        e.transform_up(|e| match &e {
            Expr::ScalarFunction(call) if call.func.name() == crate::udf::WINDOW_FN => {
                window_marker(call, &e, zone, &|x: &Expr| x.get_type(schema as &dyn ExprSchema).ok())
            }
            _ => Ok(Transformed::no(e)),
        })
    })?;
    let plan = if windows.transformed {
        windows
            .data
            .transform_up_with_subqueries(|n| Ok(Transformed::yes(n.recompute_schema()?)))?
            .data
    } else {
        windows.data
    };
    crate::passes::rewrite_expressions(plan, |e, schema| local_zone_in(e, schema, Some(zone)))
}

/// A window marker on a TIMESTAMP_LTZ becomes a zoned one (see the
/// module's notes).
fn window_marker(
    call: &ScalarFunction,
    e: &Expr,
    zone: &SessionZone,
    type_of: &dyn Fn(&Expr) -> Option<DataType>,
) -> Result<Transformed<Expr>> {
    if call.args.first().and_then(type_of).filter(is_ltz).is_none() {
        return Ok(Transformed::no(e.clone()));
    };
    if crate::udf::WindowMarker::zone_of(&call.func).is_some() {
        return Ok(Transformed::no(e.clone()));
    }
    Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(crate::udf::WindowMarker::zoned(zone.clone())),
        call.args.clone(),
    ))))
}

/// [`local_zone`] in one expression over `schema`.
pub fn local_zone_in(e: Expr, schema: &DFSchema, zone: Option<&SessionZone>) -> Result<Transformed<Expr>> {
    let Some(zone) = zone else {
        return Ok(Transformed::no(e));
    };
    let type_of = |e: &Expr| e.get_type(schema as &dyn ExprSchema).ok();
    let local = |e: Expr| ZoneShift::call(zone, Shift::ToLocal, vec![e]);
    e.transform_up(|e| match &e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => {
            let (Some(from), to) = (type_of(expr), field.data_type()) else {
                return Ok(Transformed::no(e));
            };
            let rebuilt = |inner: Expr, field: FieldRef| match &e {
                Expr::TryCast(_) => Expr::TryCast(TryCast::new_from_field(Box::new(inner), field)),
                _ => Expr::Cast(Cast::new_from_field(Box::new(inner), field)),
            };
            if is_ltz(&from) && is_wall_clock(to) {
                return Ok(Transformed::yes(rebuilt(local(expr.as_ref().clone()), field.clone())));
            }
            if let DataType::Timestamp(unit, Some(_)) = to
                && is_wall_clock(&from)
            {
                let wall = Arc::new(field.as_ref().clone().with_data_type(DataType::Timestamp(*unit, None)));
                let wall = rebuilt(expr.as_ref().clone(), wall);
                return Ok(Transformed::yes(ZoneShift::call(
                    zone,
                    Shift::ToInstant(Resolve::Earlier),
                    vec![wall],
                )));
            }
            Ok(Transformed::no(e))
        }
        Expr::ScalarFunction(call) => function(call, &e, zone, &type_of),
        _ => Ok(Transformed::no(e)),
    })
}

/// The zone's meaning of a function call (see the module's list).
fn function(
    call: &ScalarFunction,
    e: &Expr,
    zone: &SessionZone,
    type_of: &dyn Fn(&Expr) -> Option<DataType>,
) -> Result<Transformed<Expr>> {
    let local = |e: Expr| ZoneShift::call(zone, Shift::ToLocal, vec![e]);
    let with_args = |args: Vec<Expr>| Expr::ScalarFunction(ScalarFunction::new_udf(call.func.clone(), args));
    let ltz_args_local = || -> Option<Vec<Expr>> {
        let mut changed = false;
        let args = call
            .args
            .iter()
            .map(|a| {
                if type_of(a).is_some_and(|t| is_ltz(&t)) {
                    changed = true;
                    local(a.clone())
                } else {
                    a.clone()
                }
            })
            .collect();
        changed.then_some(args)
    };
    let name = call.func.name();
    Ok(match name {
        // Windows on a TIMESTAMP_LTZ are cut on the zone's wall clock.
        crate::udf::WINDOW_FN => window_marker(call, e, zone, type_of)?,
        "date_part" | "date_format" => match ltz_args_local() {
            Some(args) => Transformed::yes(with_args(args)),
            None => Transformed::no(e.clone()),
        },
        crate::functions::names::FLOOR_TIME | crate::functions::names::CEIL_TIME => match call.args.get(1) {
            Some(x) if type_of(x).is_some_and(|t| is_ltz(&t)) => {
                let rounded = with_args(vec![call.args[0].clone(), local(x.clone())]);
                Transformed::yes(ZoneShift::call(zone, Shift::BackByOffsetOf, vec![rounded, x.clone()]))
            }
            _ => Transformed::no(e.clone()),
        },
        "localtimestamp" => Transformed::yes(local(e.clone())),
        "current_date" | "current_time" | "localtime" => {
            let to = type_of(e).unwrap_or(DataType::Date32);
            let now = Expr::ScalarFunction(ScalarFunction::new_udf(
                Arc::new(crate::functions::clock::local_timestamp()),
                vec![],
            ));
            Transformed::yes(Expr::Cast(Cast::new(Box::new(local(now)), to)))
        }
        "unix_timestamp" if !call.args.is_empty() => {
            Transformed::yes(ZoneShift::call(zone, Shift::ToInstant(Resolve::Later), vec![e.clone()]))
        }
        "from_unixtime" => {
            let mut args = call.args.clone();
            if let Some(n) = args.first_mut() {
                let secs = Expr::Cast(Cast::new(Box::new(n.clone()), DataType::Int64));
                *n = local(secs);
            }
            Transformed::yes(with_args(args))
        }
        // Weir's text functions read a TIMESTAMP_LTZ argument as its text,
        // which is the zone's (as a cast to STRING).
        _ if (call.func.inner().as_ref() as &dyn std::any::Any).is::<crate::functions::scalars::FlinkScalar>() => {
            match ltz_args_local() {
                Some(args) => Transformed::yes(with_args(args)),
                None => Transformed::no(e.clone()),
            }
        }
        _ => Transformed::no(e.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::TimeUnit;

    fn la() -> SessionZone {
        weir_engine::time_zone::session_zone("America/Los_Angeles")
            .expect("valid")
            .expect("not UTC")
    }

    fn run(shift: Shift, args: Vec<ColumnarValue>, fields: Vec<FieldRef>) -> ArrayRef {
        let udf = ZoneShift {
            zone: la(),
            shift,
            signature: Signature::any(args.len(), Volatility::Immutable),
        };
        let types: Vec<DataType> = fields.iter().map(|f| f.data_type().clone()).collect();
        let out = udf
            .invoke_with_args(ScalarFunctionArgs {
                number_rows: 2,
                return_field: Arc::new(Field::new("x", udf.return_type(&types).expect("type"), true)),
                arg_fields: fields,
                args,
                config_options: Arc::default(),
            })
            .expect("invoke");
        out.to_array(2).expect("array")
    }

    #[test]
    fn instants_become_wall_times_and_back() {
        let instants =
            arrow::array::TimestampMillisecondArray::from(vec![Some(1_710_064_800_000), None]).with_timezone("UTC");
        let field = Arc::new(Field::new("l", instants.data_type().clone(), true));
        let local = run(
            Shift::ToLocal,
            vec![ColumnarValue::Array(Arc::new(instants))],
            vec![field],
        );
        assert_eq!(local.data_type(), &DataType::Timestamp(TimeUnit::Millisecond, None));
        let v = local.as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        assert_eq!(v.value(0), 1_710_064_800_000 - 7 * 3_600_000, "03:00 PDT");
        assert!(v.is_null(1));
        let field = Arc::new(Field::new("w", local.data_type().clone(), true));
        let back = run(
            Shift::ToInstant(Resolve::Earlier),
            vec![ColumnarValue::Array(local)],
            vec![field],
        );
        assert_eq!(
            back.data_type(),
            &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
        );
        let v = back.as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        assert_eq!(v.value(0), 1_710_064_800_000);
    }
}
