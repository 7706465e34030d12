//! `__weir_window(ts, kind, size_ms, slide_ms, offset_ms, part)`: the
//! internal form every window (TVF or legacy group window) is rewritten to.
//! A SESSION marker has a seventh argument: `'keys'` (the legacy
//! `GROUP BY k, SESSION(...)`: sessions per group key) or `'partition'`
//! followed by the TVF's `PARTITION BY` columns.
//!
//! For TUMBLE it computes the real `window_start` / `window_end` /
//! `window_time` of the row, so a TUMBLE TVF can also be selected from
//! without aggregation. For HOP and CUMULATE (a row has several windows) it
//! returns the row's event time unchanged; the planner only accepts those
//! under a window aggregation, which assigns the windows itself.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, FieldRef, TimeUnit, TimestampMillisecondType};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};
use weir_engine::time_zone::{Resolve, SessionZone};

/// The SESSION TVF's `PARTITION BY` as the parser hands it to the rewrite.
pub use crate::functions::names::PARTITION_BY_FN;
pub use crate::functions::names::WINDOW_FN;

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct WindowMarker {
    signature: Signature,
    /// `table.local-time-zone` for a TIMESTAMP_LTZ time attribute: windows
    /// are cut on the zone's wall clock, `window_start` and `window_end`
    /// are that wall time (TIMESTAMP(3), as Flink's), `window_time` the
    /// instant of the window's last millisecond.
    zone: Option<SessionZone>,
}

impl WindowMarker {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::new(TypeSignature::VariadicAny, Volatility::Immutable),
            zone: None,
        })
    }

    /// The marker of a window on a TIMESTAMP_LTZ in a session zone.
    pub fn zoned(zone: SessionZone) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::new(TypeSignature::VariadicAny, Volatility::Immutable),
            zone: Some(zone),
        })
    }

    /// The session zone of a marker call's function, if it is a zoned
    /// marker.
    pub fn zone_of(func: &ScalarUDF) -> Option<&SessionZone> {
        let any: &dyn std::any::Any = func.inner().as_ref();
        any.downcast_ref::<WindowMarker>().and_then(|m| m.zone.as_ref())
    }
}

/// Whether every argument of a call is a scalar, and so how many rows it
/// evaluates: one (its result goes back as a scalar: [`columnar`]), else
/// the batch's.
pub fn call_rows(args: &datafusion::logical_expr::ScalarFunctionArgs) -> (bool, usize) {
    let all_scalar = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
    (all_scalar, if all_scalar { 1 } else { args.number_rows })
}

/// `out` as a call's result: a scalar when every argument was one.
pub fn columnar(out: ArrayRef, all_scalar: bool) -> Result<ColumnarValue> {
    if all_scalar {
        Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
    } else {
        Ok(ColumnarValue::Array(out))
    }
}

fn literal_i64(v: &ColumnarValue) -> Option<i64> {
    match v {
        ColumnarValue::Scalar(ScalarValue::Int64(Some(x))) => Some(*x),
        _ => None,
    }
}

fn literal_str(v: &ColumnarValue) -> Option<String> {
    match v {
        ColumnarValue::Scalar(ScalarValue::Utf8(Some(s))) => Some(s.clone()),
        _ => None,
    }
}

impl ScalarUDFImpl for WindowMarker {
    fn name(&self) -> &str {
        WINDOW_FN
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args.first() {
            Some(DataType::Timestamp(TimeUnit::Millisecond, tz)) => {
                Ok(DataType::Timestamp(TimeUnit::Millisecond, tz.clone()))
            }
            Some(other) => {
                plan_err!("the time attribute of a window must be TIMESTAMP(3) or TIMESTAMP_LTZ(3), got {other}")
            }
            None => plan_err!("window function needs a time attribute"),
        }
    }

    /// A zoned marker's `window_start` and `window_end` are wall times.
    fn return_field_from_args(
        &self,
        args: datafusion::logical_expr::ReturnFieldArgs,
    ) -> Result<arrow::datatypes::FieldRef> {
        let types: Vec<DataType> = args.arg_fields.iter().map(|f| f.data_type().clone()).collect();
        let mut t = self.return_type(&types)?;
        let part = match args.scalar_arguments.get(5) {
            Some(Some(ScalarValue::Utf8(Some(p)))) => p.as_str(),
            _ => "",
        };
        // Flink's window_start and window_end are TIMESTAMP(3) for a
        // TIMESTAMP_LTZ attribute too (its wall time; UTC's in a UTC
        // session); window_time keeps the attribute's type.
        if matches!(part, "start" | "end") {
            t = DataType::Timestamp(TimeUnit::Millisecond, None);
        }
        Ok(Arc::new(arrow::datatypes::Field::new(self.name(), t, true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let a = &args.args;
        if a.len() < 6 {
            return exec_err!("malformed window marker arguments");
        }
        let (Some(kind), Some(size), Some(offset), Some(part)) = (
            literal_str(&a[1]),
            literal_i64(&a[2]),
            literal_i64(&a[4]),
            literal_str(&a[5]),
        ) else {
            return exec_err!("malformed window marker arguments");
        };
        // The attribute's wall time (a TIMESTAMP: UTC's in a UTC session).
        let wall = |a: &ColumnarValue| -> Result<ColumnarValue> {
            let arr = a.to_array(args.number_rows)?;
            Ok(ColumnarValue::Array(match &self.zone {
                Some(z) => weir_engine::time_zone::wall_times(&arr, &z.tz)?,
                None => arrow::compute::cast(&arr, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
            }))
        };
        if kind != "TUMBLE" {
            // The operator assigns the windows, from the wall time.
            return if part == "time" { Ok(a[0].clone()) } else { wall(&a[0]) };
        }
        let arr = wall(&a[0])?.to_array(args.number_rows)?;
        if size < 1 {
            return exec_err!("window size must be positive, got {size} ms");
        }
        let Some(ts) = arr.as_primitive_opt::<TimestampMillisecondType>() else {
            return exec_err!(
                "the time attribute of a window must be TIMESTAMP(3), got {}",
                arr.data_type()
            );
        };
        // In i128, clamped to a timestamp's range: event times and offsets
        // near the ends of i64 overflowed (a panic in debug builds).
        let (size, offset) = (i128::from(size), i128::from(offset));
        let clamp = |t: i128| t.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let f = |t: i64| {
            let t = i128::from(t);
            let start = t - (t - offset).rem_euclid(size);
            clamp(match part.as_str() {
                "start" => start,
                "end" => start + size,
                _ => start + size - 1,
            })
        };
        let out: TimestampMillisecondArray = ts.unary(f);
        let tz = match a[0].data_type() {
            DataType::Timestamp(_, tz) => tz,
            _ => None,
        };
        let out = match &self.zone {
            _ if part != "time" => out,
            None => out.with_timezone_opt(tz),
            // The instant of the window's last millisecond (a time that
            // happens twice: its second, so the window holds both).
            Some(z) => out
                .try_unary::<_, TimestampMillisecondType, _>(|v| {
                    weir_engine::time_zone::from_local(v, 1000, &z.tz, Resolve::Later).ok_or_else(|| {
                        arrow::error::ArrowError::ComputeError("a window out of the range of TIMESTAMP_LTZ".into())
                    })
                })?
                .with_timezone_opt(tz),
        };
        Ok(ColumnarValue::Array(Arc::new(out) as Arc<dyn Array>))
    }
}

/// `FOR SYSTEM_TIME AS OF` as the parser hands it to the rewrite: the
/// argument of the versioned table (`rates(__weir_system_time(o.ts))`).
pub use crate::functions::names::SYSTEM_TIME_FN;

/// A table's dynamic options (`t /*+ OPTIONS('k' = 'v') */`), handed
/// from the parser to `hints::dynamic_options` as `t(__weir_options('k',
/// 'v'))`.
pub use crate::functions::names::OPTIONS_FN;

/// The right side of the `IS [NOT] DISTINCT FROM` that `x IS [NOT] JSON`
/// is parsed as (see `parser::rewrite_is_json_tokens`).
pub use crate::functions::names::IS_JSON_FN;
/// `JSON_VALUE(j, p ... ON ERROR)` as the parser writes it:
/// `__weir_json_value_on_error(j, p, mode, default)` (see
/// `parser::rewrite_json_value_tokens`).
pub use crate::functions::names::JSON_VALUE_ON_ERROR_FN;
/// The rewrite's mark of a temporal join, one conjunct of its `ON`:
/// `__weir_temporal_join(left_time, right_rowtime, right_pk...)`. The
/// planner takes it out of the condition; it is true if evaluated.
pub use crate::functions::names::TEMPORAL_JOIN_FN;

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TemporalJoinMarker {
    signature: Signature,
}

impl TemporalJoinMarker {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::new(TypeSignature::VariadicAny, Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for TemporalJoinMarker {
    fn name(&self) -> &str {
        TEMPORAL_JOIN_FN
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))
    }
}

pub use crate::functions::names::NAMED_FN;

/// [`NAMED_FN`]: its first argument, as it is (type and nullability too).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Named {
    signature: Signature,
}

impl Named {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::any(2, Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for Named {
    fn name(&self) -> &str {
        NAMED_FN
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args.first() {
            Some(t) => Ok(t.clone()),
            None => plan_err!("{NAMED_FN} takes the value it names"),
        }
    }

    fn return_field_from_args(&self, args: datafusion::logical_expr::ReturnFieldArgs) -> Result<FieldRef> {
        match args.arg_fields.first() {
            Some(f) => Ok(Arc::new(Field::new(NAMED_FN, f.data_type().clone(), f.is_nullable()))),
            None => plan_err!("{NAMED_FN} takes the value it names"),
        }
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if args.args.is_empty() {
            return exec_err!("{NAMED_FN} takes the value it names");
        }
        Ok(args.args.swap_remove(0))
    }
}

/// `INSERT` of a ROW into a ROW column of other field names: Flink matches
/// fields by position (DataFusion's struct casts match them by name). The
/// planner's `__weir_positional_cast(x, NULL of the target type)`.
pub use crate::functions::names::POSITIONAL_CAST_FN;

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PositionalCast {
    signature: Signature,
}

impl PositionalCast {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::any(2, Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for PositionalCast {
    fn name(&self) -> &str {
        POSITIONAL_CAST_FN
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[1].clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let to = args.return_field.data_type().clone();
        match &args.args[0] {
            ColumnarValue::Array(a) => Ok(ColumnarValue::Array(cast_by_position(a, &to)?)),
            ColumnarValue::Scalar(s) => {
                let a = cast_by_position(&s.to_array()?, &to)?;
                Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&a, 0)?))
            }
        }
    }
}

/// Whether `from` casts to `to` with rows matched by position: the same
/// shape, and castable leaves.
pub fn positionally_castable(from: &DataType, to: &DataType) -> bool {
    match (from, to) {
        (DataType::Struct(a), DataType::Struct(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| positionally_castable(x.data_type(), y.data_type()))
        }
        (DataType::List(a), DataType::List(b)) | (DataType::Map(a, _), DataType::Map(b, _)) => {
            positionally_castable(a.data_type(), b.data_type())
        }
        _ => arrow::compute::can_cast_types(from, to),
    }
}

/// Whether a cast from `from` to `to` meets a row (and so needs
/// [`cast_by_position`]).
pub fn casts_a_row(from: &DataType, to: &DataType) -> bool {
    from != to
        && match (from, to) {
            (DataType::Struct(_), DataType::Struct(_)) => true,
            (DataType::List(a), DataType::List(b)) | (DataType::Map(a, _), DataType::Map(b, _)) => {
                casts_a_row(a.data_type(), b.data_type())
            }
            _ => false,
        }
}

/// `a` as `to`, rows' fields matched by position (recursively through
/// arrays and maps); other values by Arrow's cast.
pub fn cast_by_position(a: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    use arrow::array::{AsArray, ListArray, MapArray, StructArray};
    Ok(match (a.data_type(), to) {
        (DataType::Struct(from), DataType::Struct(fields)) if from.len() == fields.len() => {
            let s = a.as_struct();
            let columns = s
                .columns()
                .iter()
                .zip(fields.iter())
                .map(|(c, f)| cast_by_position(c, f.data_type()))
                .collect::<Result<Vec<_>>>()?;
            Arc::new(StructArray::try_new(fields.clone(), columns, s.nulls().cloned())?)
        }
        (DataType::List(_), DataType::List(field)) => {
            let l = a.as_list::<i32>();
            let values = cast_by_position(l.values(), field.data_type())?;
            Arc::new(ListArray::try_new(
                field.clone(),
                l.offsets().clone(),
                values,
                l.nulls().cloned(),
            )?)
        }
        (DataType::Map(_, _), DataType::Map(field, sorted)) => {
            let m = a.as_map();
            let entries: ArrayRef = Arc::new(m.entries().clone());
            let entries = cast_by_position(&entries, field.data_type())?;
            Arc::new(MapArray::try_new(
                field.clone(),
                m.offsets().clone(),
                entries.as_struct().clone(),
                m.nulls().cloned(),
                *sorted,
            )?)
        }
        _ => arrow::compute::cast(a, to)?,
    })
}
