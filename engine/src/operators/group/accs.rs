//! Retractable accumulators of the non-windowed GROUP BY, one per
//! aggregate call, and their bytes in state.
//!
//! DataFusion's grouped accumulators cannot take rows back, and its
//! sliding MIN/MAX retract the *oldest* value (window frames), not the
//! value a changelog retracts. So Weir keeps Flink's accumulators:
//! - COUNT, SUM, AVG: a running sum and count of non-null values (SUM is
//!   NULL when the count is 0, as Flink's `SumWithRetract`);
//! - MIN, MAX: the current extreme, plus a per-key map value → count in
//!   state (`group-agg-map`); when the extreme's count drops to 0 the map
//!   is scanned for the next one (Flink's `MaxWithRetract`);
//! - DISTINCT: the same map; the inner aggregate takes a value when its
//!   count goes 0 → 1 and gives it back when it goes 1 → 0;
//! - VAR_POP, VAR_SAMP, STDDEV_POP, STDDEV_SAMP: Welford's count, mean
//!   and squared deviations in DOUBLE, retracted in reverse (Flink's
//!   digits), the result cast back to the input's type as Java casts
//!   (saturating);
//! - FIRST_VALUE, LAST_VALUE, LISTAGG, ARRAY_AGG: over insert-only input
//!   the value so far; over an updating input the values present, in
//!   arrival order, where a retraction takes out the earliest equal value
//!   (Flink's `*WithRetract` functions: their order lists and `ListView`
//!   come to the same, and a retraction of a value not present changes
//!   nothing);
//! - COLLECT: each distinct value present with its count (Flink's
//!   `CollectAggFunction`, a map view element → count), over any input; a
//!   retraction takes one occurrence back, the element leaves at 0.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Decimal128Type, Float64Type, Int64Type};
use datafusion::common::ScalarValue;

use crate::error::{ExecError, Result};
use crate::plan::{AggCall, AggFunc, Welford};
use crate::state::codec::{RowCodec, decode_counts};

/// How a SUM/AVG adds its input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NumClass {
    Int,
    Float,
    /// Decimal of this scale.
    Decimal(i8),
}

impl NumClass {
    pub fn of(t: &DataType) -> Option<NumClass> {
        match t {
            t if t.is_integer() => Some(NumClass::Int),
            DataType::Float16 | DataType::Float32 | DataType::Float64 => Some(NumClass::Float),
            DataType::Decimal128(_, s) => Some(NumClass::Decimal(*s)),
            _ => None,
        }
    }

    /// The type a batch's input is cast to before it is added.
    fn wide_type(self) -> DataType {
        match self {
            NumClass::Int => DataType::Int64,
            NumClass::Float => DataType::Float64,
            NumClass::Decimal(s) => DataType::Decimal128(38, s),
        }
    }
}

/// A running sum in its class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(i64),
    Float(f64),
    Dec(i128),
}

impl Num {
    fn zero(class: NumClass) -> Num {
        match class {
            NumClass::Int => Num::Int(0),
            NumClass::Float => Num::Float(0.0),
            NumClass::Decimal(_) => Num::Dec(0),
        }
    }
}

/// One aggregate call as the operator runs it.
#[derive(Debug)]
pub struct AggSpec {
    pub call: AggCall,
    /// SUM/AVG: how values add.
    pub class: Option<NumClass>,
    /// Encodes values (MIN, MAX, DISTINCT).
    pub codec: Option<RowCodec>,
    /// Keeps a value → count map in state: DISTINCT, and MIN/MAX over an
    /// input with retractions (over insert-only input a value never
    /// leaves, so the extreme alone is enough, as Flink's plain MAX).
    pub map: bool,
    /// FIRST_VALUE, LAST_VALUE, LISTAGG, ARRAY_AGG over an updating
    /// input: the accumulator is the values present ([`Acc::Values`]), of
    /// this type, encoded by `codec`.
    pub values_of: Option<DataType>,
}

impl AggSpec {
    pub fn new(call: &AggCall, insert_only: bool) -> Result<AggSpec> {
        let class = match call.func {
            AggFunc::Sum | AggFunc::Avg => Some(NumClass::of(&call.input_type).ok_or_else(|| {
                ExecError::internal(format!(
                    "{} of {} has no accumulator",
                    call.func.name(),
                    call.input_type
                ))
            })?),
            _ => None,
        };
        let extreme = matches!(call.func, AggFunc::Min | AggFunc::Max);
        if call.func.keeps_a_value() && call.distinct {
            return Err(ExecError::internal(format!(
                "{} with DISTINCT has no accumulator",
                call.func.name()
            )));
        }
        let values_of = match call.func {
            AggFunc::Collect => Some(call.input_type.clone()),
            _ if insert_only || !call.func.keeps_a_value() => None,
            AggFunc::ListAgg => Some(DataType::Utf8),
            AggFunc::ArrayAgg => match &call.output_type {
                DataType::List(f) => Some(f.data_type().clone()),
                other => return Err(ExecError::internal(format!("ARRAY_AGG typed {other}"))),
            },
            _ => Some(call.input_type.clone()),
        };
        let codec = if let Some(t) = &values_of {
            Some(RowCodec::new(std::slice::from_ref(t)).map_err(ExecError::internal)?)
        } else if call.func == AggFunc::ListAgg {
            Some(RowCodec::new(&[DataType::Utf8]).map_err(ExecError::internal)?)
        } else if call.func == AggFunc::ArrayAgg {
            Some(RowCodec::new(std::slice::from_ref(&call.output_type)).map_err(ExecError::internal)?)
        } else if call.distinct || extreme || call.func.keeps_a_value() {
            Some(RowCodec::new(std::slice::from_ref(&call.input_type)).map_err(ExecError::internal)?)
        } else {
            None
        };
        Ok(AggSpec {
            call: call.clone(),
            class,
            codec,
            map: call.distinct || (extreme && !insert_only),
            values_of,
        })
    }

    pub fn uses_map(&self) -> bool {
        self.map
    }

    /// The batch's input of this call cast for adding (SUM/AVG), else as
    /// evaluated.
    pub fn prepare(&self, arg: ArrayRef) -> Result<ArrayRef> {
        if self.call.func.is_moment() && arg.data_type() != &DataType::Float64 {
            return Ok(cast(&arg, &DataType::Float64)?);
        }
        match self.class {
            Some(c) if arg.data_type() != &c.wide_type() => Ok(cast(&arg, &c.wide_type())?),
            _ => Ok(arg),
        }
    }

    /// A fresh accumulator.
    pub fn empty(&self) -> Acc {
        if self.call.func == AggFunc::Collect {
            return Acc::Counted(vec![]);
        }
        if self.values_of.is_some() {
            return Acc::Values(vec![]);
        }
        match self.call.func {
            AggFunc::Count => Acc::Count(0),
            AggFunc::Sum | AggFunc::Avg => Acc::Sum {
                sum: Num::zero(self.class.unwrap_or(NumClass::Int)),
                n: 0,
            },
            AggFunc::Min
            | AggFunc::Max
            | AggFunc::FirstValue
            | AggFunc::LastValue
            | AggFunc::ListAgg
            | AggFunc::ArrayAgg
            | AggFunc::Collect => Acc::Extreme(None),
            AggFunc::VarPop | AggFunc::VarSamp | AggFunc::StddevPop | AggFunc::StddevSamp => {
                Acc::Moments(Welford::default())
            }
        }
    }

    /// Row `i` of `arg` (prepared) added (`sign` 1) or taken back (-1).
    /// For map-keeping calls this is the inner step, called on 0 → 1 and
    /// 1 → 0 transitions only (MIN/MAX: see [`AggSpec::offer`]).
    pub fn add(&self, acc: &mut Acc, arg: Option<&ArrayRef>, i: usize, sign: i64) {
        match acc {
            Acc::Count(n) => *n += sign,
            Acc::Sum { sum, n } => {
                let Some(a) = arg else { return };
                *n += sign;
                match sum {
                    Num::Int(s) => {
                        let v = a.as_primitive::<Int64Type>().value(i);
                        *s = s.wrapping_add(v.wrapping_mul(sign));
                    }
                    Num::Float(s) => *s += a.as_primitive::<Float64Type>().value(i) * sign as f64,
                    Num::Dec(s) => {
                        let v = a.as_primitive::<Decimal128Type>().value(i);
                        *s = s.wrapping_add(v.wrapping_mul(i128::from(sign)));
                    }
                }
            }
            Acc::Moments(w) => {
                let Some(a) = arg else { return };
                let v = a.as_primitive::<Float64Type>().value(i);
                if sign > 0 { w.add(v) } else { w.retract(v) }
            }
            Acc::Extreme(_) | Acc::Values(_) | Acc::Counted(_) => {}
        }
    }

    /// MIN/MAX: `v` is present (again): it becomes the extreme if better.
    pub fn offer(&self, acc: &mut Acc, v: ScalarValue) {
        if let Acc::Extreme(cur) = acc {
            let better = match cur {
                None => true,
                Some(c) => match v.partial_cmp(c) {
                    Some(o) => {
                        (self.call.func == AggFunc::Min && o.is_lt()) || (self.call.func == AggFunc::Max && o.is_gt())
                    }
                    None => false,
                },
            };
            if better {
                *cur = Some(v);
            }
        }
    }

    /// FIRST_VALUE, LAST_VALUE, LISTAGG, ARRAY_AGG: row `i` of `arg`
    /// arrives (an insert-only input: nothing is taken back). NULLs are
    /// skipped, as Flink's, except by ARRAY_AGG without IGNORE NULLS.
    pub fn keep(&self, acc: &mut Acc, arg: &ArrayRef, i: usize) -> Result<()> {
        let Acc::Extreme(cur) = acc else {
            return Ok(());
        };
        if self.call.func == AggFunc::ArrayAgg {
            if arg.is_null(i) && self.call.ignore_nulls {
                return Ok(());
            }
            *cur = Some(appended(cur.take(), arg, i, &self.call.output_type)?);
            return Ok(());
        }
        if arg.is_null(i) {
            return Ok(());
        }
        match self.call.func {
            AggFunc::FirstValue if cur.is_none() => *cur = Some(ScalarValue::try_from_array(arg, i)?),
            AggFunc::LastValue => *cur = Some(ScalarValue::try_from_array(arg, i)?),
            AggFunc::ListAgg => {
                let v = ScalarValue::try_from_array(arg, i)?;
                let v = match v.cast_to(&DataType::Utf8)? {
                    ScalarValue::Utf8(Some(t)) => t,
                    _ => return Ok(()),
                };
                let joined = match cur.take() {
                    Some(ScalarValue::Utf8(Some(mut so_far))) => {
                        so_far.push_str(self.call.separator.as_deref().unwrap_or(","));
                        so_far.push_str(&v);
                        so_far
                    }
                    _ => v,
                };
                *cur = Some(ScalarValue::Utf8(Some(joined)));
            }
            _ => {}
        }
        Ok(())
    }

    /// Over an updating input: row `i` of `arg` arrives (`sign` 1) and is
    /// appended, or is taken back (-1): its earliest equal value leaves.
    /// COLLECT counts it up or down instead.
    pub fn present(&self, acc: &mut Acc, arg: &ArrayRef, i: usize, sign: i64) -> Result<()> {
        let Some(t) = &self.values_of else {
            return Ok(());
        };
        let mut v = ScalarValue::try_from_array(arg, i)?;
        if &v.data_type() != t {
            v = v.cast_to(t)?;
        }
        if let Acc::Counted(counted) = acc {
            match counted.iter().position(|(p, _)| *p == v) {
                Some(at) => {
                    counted[at].1 += sign;
                    if counted[at].1 <= 0 {
                        counted.remove(at);
                    }
                }
                None if sign > 0 => counted.push((v, sign)),
                None => {}
            }
            return Ok(());
        }
        let Acc::Values(values) = acc else {
            return Ok(());
        };
        if sign > 0 {
            values.push(v);
        } else if let Some(at) = values.iter().position(|p| *p == v) {
            values.remove(at);
        }
        Ok(())
    }

    /// The result of [`Acc::Values`].
    fn of_values(&self, values: &[ScalarValue]) -> Result<ScalarValue> {
        let out = &self.call.output_type;
        let v = match (self.call.func, values) {
            (_, []) => return Ok(ScalarValue::try_from(out)?),
            (AggFunc::FirstValue, [first, ..]) => first.clone(),
            (AggFunc::LastValue, [.., last]) => last.clone(),
            (AggFunc::ListAgg, _) => {
                let sep = self.call.separator.as_deref().unwrap_or(",");
                let texts: Vec<&str> = values
                    .iter()
                    .filter_map(|v| match v {
                        ScalarValue::Utf8(Some(t)) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect();
                ScalarValue::Utf8(Some(texts.join(sep)))
            }
            (AggFunc::ArrayAgg, _) => {
                let DataType::List(field) = out else {
                    return Err(ExecError::internal(format!("ARRAY_AGG typed {out}")));
                };
                let items = ScalarValue::iter_to_array(values.iter().cloned())?;
                let offsets = arrow::buffer::OffsetBuffer::from_lengths([items.len()]);
                let list = arrow::array::ListArray::try_new(field.clone(), offsets, items, None)?;
                ScalarValue::List(Arc::new(list))
            }
            (f, _) => return Err(ExecError::internal(format!("{} keeps no values", f.name()))),
        };
        Ok(v)
    }

    /// The best of `candidates` (values whose count is positive).
    pub fn best(&self, candidates: impl Iterator<Item = ScalarValue>) -> Option<ScalarValue> {
        let mut acc = Acc::Extreme(None);
        for v in candidates {
            self.offer(&mut acc, v);
        }
        match acc {
            Acc::Extreme(v) => v,
            _ => None,
        }
    }

    /// The call's BIGINT result without a `ScalarValue`, where [`value`]
    /// would give the same (`None`: ask it).
    ///
    /// [`value`]: AggSpec::value
    pub fn value_i64(&self, acc: &Acc) -> Option<Option<i64>> {
        if self.call.output_type != DataType::Int64 {
            return None;
        }
        match acc {
            Acc::Count(n) => Some(Some(*n)),
            Acc::Sum { n: 0, .. } => Some(None),
            Acc::Sum { sum: Num::Int(s), n } => match self.call.func {
                AggFunc::Sum => Some(Some(*s)),
                AggFunc::Avg => Some(Some(s.wrapping_div(*n))),
                _ => None,
            },
            Acc::Extreme(None) => Some(None),
            Acc::Extreme(Some(ScalarValue::Int64(v))) => Some(*v),
            _ => None,
        }
    }

    /// The call's DOUBLE result without a `ScalarValue`, as
    /// [`AggSpec::value_i64`].
    pub fn value_f64(&self, acc: &Acc) -> Option<Option<f64>> {
        if self.call.output_type != DataType::Float64 {
            return None;
        }
        match acc {
            Acc::Sum { n: 0, .. } => Some(None),
            Acc::Sum { sum: Num::Float(s), n } => match self.call.func {
                AggFunc::Sum => Some(Some(*s)),
                AggFunc::Avg => Some(Some(s / *n as f64)),
                _ => None,
            },
            Acc::Extreme(None) => Some(None),
            Acc::Extreme(Some(ScalarValue::Float64(v))) => Some(*v),
            _ => None,
        }
    }

    /// The call's result.
    pub fn value(&self, acc: &Acc) -> Result<ScalarValue> {
        let out = &self.call.output_type;
        let v = match acc {
            Acc::Count(n) => ScalarValue::Int64(Some(*n)),
            Acc::Sum { n: 0, .. } => return Ok(ScalarValue::try_from(out)?),
            Acc::Sum { sum, n } => match (self.call.func, sum) {
                // Flink sums in the input's type: a narrower integer's
                // sum wraps as Java's int arithmetic does.
                (AggFunc::Sum, Num::Int(s)) => match out {
                    DataType::Int8 => ScalarValue::Int8(Some(*s as i8)),
                    DataType::Int16 => ScalarValue::Int16(Some(*s as i16)),
                    DataType::Int32 => ScalarValue::Int32(Some(*s as i32)),
                    _ => ScalarValue::Int64(Some(*s)),
                },
                (AggFunc::Sum, Num::Float(s)) => ScalarValue::Float64(Some(*s)),
                (AggFunc::Sum, Num::Dec(s)) => match out {
                    DataType::Decimal128(p, sc) => ScalarValue::Decimal128(Some(*s), *p, *sc),
                    _ => ScalarValue::Decimal128(Some(*s), 38, self.scale()),
                },
                // Flink: SUM / COUNT in the input's type, truncated.
                // (`wrapping_div`: a count driven negative by retractions
                // of unseen rows must not panic on i64::MIN / -1.)
                (_, Num::Int(s)) => ScalarValue::Int64(Some(s.wrapping_div(*n))),
                (_, Num::Float(s)) => ScalarValue::Float64(Some(s / *n as f64)),
                (_, Num::Dec(s)) => {
                    let (p, target) = match out {
                        DataType::Decimal128(p, sc) => (*p, *sc),
                        _ => (38, self.scale()),
                    };
                    let shift = i32::from(target) - i32::from(self.scale());
                    let scaled = if shift >= 0 {
                        s.saturating_mul(10i128.saturating_pow(shift as u32))
                    } else {
                        10i128.checked_pow((-shift) as u32).map_or(0, |d| s / d)
                    };
                    // Java's BigDecimal division as Flink's AVG rounds it:
                    // HALF_UP (halves away from zero).
                    ScalarValue::Decimal128(Some(div_half_up(scaled, i128::from(*n))), p, target)
                }
            },
            Acc::Extreme(None) => return Ok(ScalarValue::try_from(out)?),
            Acc::Extreme(Some(v)) => v.clone(),
            Acc::Values(values) => self.of_values(values)?,
            Acc::Counted(counted) => {
                let elem = crate::multiset::element_type(out)
                    .ok_or_else(|| ExecError::internal(format!("COLLECT typed {out}")))?;
                let counts = counted
                    .iter()
                    .map(|(_, c)| i32::try_from(*c).unwrap_or(i32::MAX))
                    .collect();
                crate::multiset::from_counts(elem, counted.iter().map(|(v, _)| v.clone()), counts)?
            }
            Acc::Moments(w) => crate::plan::moment_scalar(self.call.func.moment(w), out)?,
        };
        if &v.data_type() == out {
            Ok(v)
        } else {
            Ok(v.cast_to(out)?)
        }
    }

    fn scale(&self) -> i8 {
        match self.class {
            Some(NumClass::Decimal(s)) => s,
            _ => 0,
        }
    }

    /// Encodes a MIN/MAX value in the call's key encoding.
    fn encode_value(&self, v: &ScalarValue) -> Result<Vec<u8>> {
        let codec = self
            .codec
            .as_ref()
            .ok_or_else(|| ExecError::internal("no value codec"))?;
        let rows = codec.encode(&[v.to_array()?])?;
        Ok(rows.row(0).to_vec())
    }

    /// Appends `values` encoded by the call's codec, each after what
    /// `before(b, i)` writes and its length.
    fn push_values<'a>(
        &self,
        b: &mut Vec<u8>,
        values: impl ExactSizeIterator<Item = &'a ScalarValue>,
        before: impl Fn(&mut Vec<u8>, usize),
    ) -> Result<()> {
        if values.len() == 0 {
            return Ok(());
        }
        let codec = self
            .codec
            .as_ref()
            .ok_or_else(|| ExecError::internal("no value codec"))?;
        let rows = codec.encode(&[ScalarValue::iter_to_array(values.cloned())?])?;
        for (i, row) in rows.iter().enumerate() {
            before(b, i);
            push_int(b, row.len() as i64);
            b.extend_from_slice(row);
        }
        Ok(())
    }

    /// Decodes values encoded by the call's codec.
    pub fn decode_values<'a>(&self, values: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ScalarValue>> {
        let codec = self
            .codec
            .as_ref()
            .ok_or_else(|| ExecError::internal("no value codec"))?;
        let cols = codec.decode(values)?;
        let col = cols.first().ok_or_else(|| ExecError::internal("no value column"))?;
        (0..col.len())
            .map(|i| Ok(ScalarValue::try_from_array(col, i)?))
            .collect()
    }
}

/// ARRAY_AGG's array so far (`None`: empty) with `arg[i]` appended.
fn appended(so_far: Option<ScalarValue>, arg: &ArrayRef, i: usize, output: &DataType) -> Result<ScalarValue> {
    let DataType::List(field) = output else {
        return Err(ExecError::internal(format!("ARRAY_AGG typed {output}")));
    };
    let one = arg.slice(i, 1);
    let one = if one.data_type() == field.data_type() {
        one
    } else {
        cast(&one, field.data_type())?
    };
    let values = match so_far {
        Some(ScalarValue::List(list)) if !list.is_empty() => {
            let before = list.value(0);
            arrow::compute::concat(&[before.as_ref(), one.as_ref()])?
        }
        _ => one,
    };
    let offsets = arrow::buffer::OffsetBuffer::from_lengths([values.len()]);
    let list = arrow::array::ListArray::try_new(field.clone(), offsets, values, None)?;
    Ok(ScalarValue::List(Arc::new(list)))
}

/// One call's accumulator.
#[derive(Debug, Clone, PartialEq)]
pub enum Acc {
    Count(i64),
    Sum {
        sum: Num,
        n: i64,
    },
    /// MIN/MAX: the current extreme (the map in state holds the rest).
    Extreme(Option<ScalarValue>),
    /// The variance family's running moments.
    Moments(Welford),
    /// FIRST_VALUE, LAST_VALUE, LISTAGG, ARRAY_AGG over an updating input:
    /// the values present, in arrival order.
    Values(Vec<ScalarValue>),
    /// COLLECT: each distinct value present and its count (> 0), in order
    /// of first arrival.
    Counted(Vec<(ScalarValue, i64)>),
}

/// A key's accumulators and its row count (`+I`/`+U` minus `-U`/`-D`):
/// when it reaches 0 the key's row is deleted.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyAccs {
    pub rows: i64,
    pub accs: Vec<Acc>,
}

/// First byte of a stored [`KeyAccs`]: 2 = row count, counts and integer
/// sums as zigzag varints (most take one to three bytes, where a fixed i64
/// took eight: a key's accumulators are most of a GROUP BY's state). 1 =
/// the same fixed-width, still read (state written by earlier builds).
const FORMAT: u8 = 2;
const FORMAT_FIXED: u8 = 1;

fn push_int(b: &mut Vec<u8>, v: i64) {
    b.extend_from_slice(&crate::state::codec::encode_counts(&[v]));
}

impl KeyAccs {
    pub fn new(specs: &[AggSpec]) -> Self {
        KeyAccs {
            rows: 0,
            accs: specs.iter().map(AggSpec::empty).collect(),
        }
    }

    pub fn encode(&self, specs: &[AggSpec]) -> Result<Vec<u8>> {
        let mut b = vec![FORMAT];
        push_int(&mut b, self.rows);
        for (acc, spec) in self.accs.iter().zip(specs) {
            match acc {
                Acc::Count(n) => {
                    b.push(0);
                    push_int(&mut b, *n);
                }
                Acc::Sum { sum, n } => {
                    b.push(1);
                    push_int(&mut b, *n);
                    match sum {
                        Num::Int(v) => push_int(&mut b, *v),
                        Num::Float(v) => b.extend_from_slice(&v.to_bits().to_be_bytes()),
                        Num::Dec(v) => b.extend_from_slice(&v.to_be_bytes()),
                    }
                }
                Acc::Moments(w) => {
                    b.push(3);
                    push_int(&mut b, w.n);
                    b.extend_from_slice(&w.mean.to_bits().to_be_bytes());
                    b.extend_from_slice(&w.m2.to_bits().to_be_bytes());
                }
                Acc::Extreme(None) => b.extend_from_slice(&[2, 0]),
                Acc::Extreme(Some(v)) => {
                    let bytes = spec.encode_value(v)?;
                    b.extend_from_slice(&[2, 1]);
                    push_int(&mut b, bytes.len() as i64);
                    b.extend_from_slice(&bytes);
                }
                Acc::Values(values) => {
                    b.push(4);
                    push_int(&mut b, values.len() as i64);
                    spec.push_values(&mut b, values.iter(), |_, _| {})?;
                }
                Acc::Counted(counted) => {
                    b.push(5);
                    push_int(&mut b, counted.len() as i64);
                    spec.push_values(&mut b, counted.iter().map(|(v, _)| v), |b, i| push_int(b, counted[i].1))?;
                }
            }
        }
        Ok(b)
    }

    pub fn decode(bytes: &[u8], specs: &[AggSpec]) -> Result<Self> {
        let corrupt = |what: &str| {
            crate::error::StateError::Corrupt {
                state: "group-acc".into(),
                message: format!("accumulators of {} bytes: {what}", bytes.len()),
            }
            .into()
        };
        let varints = match bytes.first() {
            Some(&FORMAT) => true,
            Some(&FORMAT_FIXED) => false,
            Some(_) => return Err(corrupt("unknown format byte")),
            None => return Err(corrupt("empty")),
        };
        let mut r = Reader {
            b: bytes,
            at: 1,
            varints,
        };
        let rows = r.i64().ok_or_else(|| corrupt("truncated row count"))?;
        let mut accs = Vec::with_capacity(specs.len());
        for spec in specs {
            let tag = r.take(1).ok_or_else(|| corrupt("truncated"))?[0];
            let acc = match (tag, spec.class) {
                (0, _) => Acc::Count(r.i64().ok_or_else(|| corrupt("truncated count"))?),
                (1, Some(class)) => {
                    let n = r.i64().ok_or_else(|| corrupt("truncated sum"))?;
                    let sum = match class {
                        NumClass::Int => Num::Int(r.i64().ok_or_else(|| corrupt("truncated sum"))?),
                        NumClass::Float => Num::Float(f64::from_bits(
                            r.fixed_i64().ok_or_else(|| corrupt("truncated sum"))? as u64,
                        )),
                        NumClass::Decimal(_) => {
                            let b = r.take(16).ok_or_else(|| corrupt("truncated sum"))?;
                            Num::Dec(i128::from_be_bytes(b.try_into().map_err(|_| corrupt("sum"))?))
                        }
                    };
                    Acc::Sum { sum, n }
                }
                (2, _) => match r.take(1).ok_or_else(|| corrupt("truncated extreme"))?[0] {
                    0 => Acc::Extreme(None),
                    _ => {
                        let len = r.len().ok_or_else(|| corrupt("truncated extreme"))?;
                        let v = r.take(len).ok_or_else(|| corrupt("truncated extreme"))?;
                        let mut vals = spec.decode_values([v])?;
                        Acc::Extreme(vals.pop())
                    }
                },
                (4 | 5, _) if spec.values_of.is_some() => {
                    let counted = tag == 5;
                    let n = r.len().ok_or_else(|| corrupt("truncated values"))?;
                    let mut rows = Vec::with_capacity(n.min(bytes.len()));
                    let mut counts = Vec::with_capacity(if counted { n.min(bytes.len()) } else { 0 });
                    for _ in 0..n {
                        if counted {
                            counts.push(r.i64().ok_or_else(|| corrupt("truncated count"))?);
                        }
                        let len = r.len().ok_or_else(|| corrupt("truncated values"))?;
                        rows.push(r.take(len).ok_or_else(|| corrupt("truncated values"))?);
                    }
                    let values = if rows.is_empty() {
                        vec![]
                    } else {
                        spec.decode_values(rows)?
                    };
                    if counted {
                        Acc::Counted(values.into_iter().zip(counts).collect())
                    } else {
                        Acc::Values(values)
                    }
                }
                (3, _) if spec.call.func.is_moment() => {
                    let n = r.i64().ok_or_else(|| corrupt("truncated moments"))?;
                    let mut float = || {
                        r.fixed_i64()
                            .map(|b| f64::from_bits(b as u64))
                            .ok_or_else(|| corrupt("truncated moments"))
                    };
                    let mean = float()?;
                    let m2 = float()?;
                    Acc::Moments(Welford { n, mean, m2 })
                }
                _ => return Err(corrupt("accumulator does not match the aggregate")),
            };
            accs.push(acc);
        }
        Ok(KeyAccs { rows, accs })
    }

    /// Every call's result.
    pub fn values(&self, specs: &[AggSpec]) -> Result<Vec<ScalarValue>> {
        self.accs.iter().zip(specs).map(|(a, s)| s.value(a)).collect()
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    /// Integers as varints (format 2) or fixed i64s (format 1).
    varints: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    /// A count or integer sum, in the format's width.
    fn i64(&mut self) -> Option<i64> {
        if !self.varints {
            return self.fixed_i64();
        }
        let mut v = [0];
        let n = crate::state::codec::decode_counts_prefix(self.b.get(self.at..)?, &mut v)?;
        self.at += n;
        Some(v[0])
    }

    fn fixed_i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A length: a varint, or a u32 in format 1.
    fn len(&mut self) -> Option<usize> {
        if self.varints {
            return usize::try_from(self.i64()?).ok();
        }
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?) as usize)
    }
}

/// The single count stored for a MIN/MAX map entry.
pub fn decode_count(v: &[u8]) -> Option<i64> {
    let mut c = [0];
    decode_counts(v, &mut c).map(|()| c[0])
}

/// `a / b` rounded HALF_UP (a half away from zero), as Java's
/// `BigDecimal.divide(.., RoundingMode.HALF_UP)`; 0 for a division by 0.
pub fn div_half_up(a: i128, b: i128) -> i128 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    let r = a.wrapping_rem(b);
    if r.unsigned_abs().saturating_mul(2) >= b.unsigned_abs() {
        if (a < 0) == (b < 0) {
            q.wrapping_add(1)
        } else {
            q.wrapping_sub(1)
        }
    } else {
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    fn call(func: AggFunc, input: DataType, output: DataType, distinct: bool) -> AggCall {
        AggCall {
            func,
            arg: None,
            distinct,
            filter: None,
            input_type: input,
            output_type: output,
            separator: None,
            ignore_nulls: false,
        }
    }

    /// The BIGINT and DOUBLE results taken without a `ScalarValue` are
    /// the ones [`AggSpec::value`] gives, for every accumulator they
    /// take, and they decline the others.
    #[test]
    fn plain_results_equal_the_scalar_ones() {
        use AggFunc::*;
        let (i, f) = (DataType::Int64, DataType::Float64);
        let cases: Vec<(AggFunc, DataType, DataType, Vec<Acc>)> = vec![
            (
                Count,
                DataType::Null,
                i.clone(),
                vec![Acc::Count(0), Acc::Count(-3), Acc::Count(7)],
            ),
            (
                Sum,
                i.clone(),
                i.clone(),
                vec![
                    Acc::Sum { sum: Num::Int(0), n: 0 },
                    Acc::Sum {
                        sum: Num::Int(i64::MIN),
                        n: 2,
                    },
                    Acc::Sum {
                        sum: Num::Int(-5),
                        n: 1,
                    },
                ],
            ),
            (
                Avg,
                i.clone(),
                i.clone(),
                vec![
                    Acc::Sum { sum: Num::Int(7), n: 2 },
                    Acc::Sum {
                        sum: Num::Int(-7),
                        n: 2,
                    },
                    Acc::Sum {
                        sum: Num::Int(i64::MIN),
                        n: -1,
                    },
                    Acc::Sum { sum: Num::Int(1), n: 0 },
                ],
            ),
            (
                Sum,
                f.clone(),
                f.clone(),
                vec![
                    Acc::Sum {
                        sum: Num::Float(0.5),
                        n: 3,
                    },
                    Acc::Sum {
                        sum: Num::Float(f64::NAN),
                        n: 1,
                    },
                    Acc::Sum {
                        sum: Num::Float(2.0),
                        n: 0,
                    },
                ],
            ),
            (
                Avg,
                f.clone(),
                f.clone(),
                vec![Acc::Sum {
                    sum: Num::Float(1.0),
                    n: 3,
                }],
            ),
            (
                Max,
                i.clone(),
                i.clone(),
                vec![Acc::Extreme(None), Acc::Extreme(Some(ScalarValue::Int64(Some(-2))))],
            ),
            (
                Min,
                f.clone(),
                f.clone(),
                vec![Acc::Extreme(None), Acc::Extreme(Some(ScalarValue::Float64(Some(-0.0))))],
            ),
            (VarPop, f.clone(), f.clone(), vec![Acc::Moments(Welford::default())]),
            (
                Sum,
                DataType::Int32,
                DataType::Int32,
                vec![Acc::Sum {
                    sum: Num::Int(1 << 40),
                    n: 1,
                }],
            ),
        ];
        for (func, input, output, accs) in cases {
            let spec = AggSpec::new(&call(func, input.clone(), output.clone(), false), true).expect("spec");
            for acc in accs {
                let scalar = spec.value(&acc).expect("value");
                let plain = match output {
                    DataType::Int64 => spec.value_i64(&acc).map(ScalarValue::Int64),
                    DataType::Float64 => spec.value_f64(&acc).map(ScalarValue::Float64),
                    _ => spec.value_i64(&acc).map(ScalarValue::Int64),
                };
                match plain {
                    Some(p) => assert_eq!(p, scalar, "{func:?}({input}) of {acc:?}"),
                    None => assert!(
                        func.is_moment() || output == DataType::Int32,
                        "{func:?}({input}) of {acc:?} declined"
                    ),
                }
            }
        }
    }

    #[test]
    fn accumulators_round_trip_through_bytes() {
        let specs = vec![
            AggSpec::new(&call(AggFunc::Count, DataType::Null, DataType::Int64, false), false).expect("count"),
            AggSpec::new(&call(AggFunc::Sum, DataType::Int32, DataType::Int64, false), false).expect("sum"),
            AggSpec::new(
                &call(
                    AggFunc::Avg,
                    DataType::Decimal128(10, 2),
                    DataType::Decimal128(14, 6),
                    false,
                ),
                false,
            )
            .expect("avg"),
            AggSpec::new(&call(AggFunc::Max, DataType::Utf8, DataType::Utf8, false), false).expect("max"),
            AggSpec::new(&call(AggFunc::Min, DataType::Float64, DataType::Float64, false), false).expect("min"),
        ];
        let k = KeyAccs {
            rows: 3,
            accs: vec![
                Acc::Count(3),
                Acc::Sum {
                    sum: Num::Int(-7),
                    n: 2,
                },
                Acc::Sum {
                    sum: Num::Dec(1001),
                    n: 2,
                },
                Acc::Extreme(Some(ScalarValue::Utf8(Some("zebra".into())))),
                Acc::Extreme(None),
            ],
        };
        let bytes = k.encode(&specs).expect("encode");
        assert_eq!(KeyAccs::decode(&bytes, &specs).expect("decode"), k);
        let values = k.values(&specs).expect("values");
        assert_eq!(values[1], ScalarValue::Int64(Some(-7)));
        // AVG(DECIMAL(10,2)) of 10.01 over 2 rows = 5.005000 (DECIMAL(14,6)).
        assert_eq!(values[2], ScalarValue::Decimal128(Some(5_005_000), 14, 6));
        assert_eq!(values[4], ScalarValue::Float64(None));
        for cut in 0..bytes.len() {
            assert!(KeyAccs::decode(&bytes[..cut], &specs).is_err(), "cut at {cut}");
        }
    }

    /// COLLECT counts each value up and down (an element leaves at 0, a
    /// retraction of an absent value changes nothing), its counts
    /// round-trip through bytes, and its result is a MULTISET.
    #[test]
    fn collect_counts_values_and_round_trips_through_bytes() {
        let out = crate::multiset::data_type(DataType::Utf8);
        let specs = vec![AggSpec::new(&call(AggFunc::Collect, DataType::Utf8, out, false), true).expect("collect")];
        let mut k = KeyAccs::new(&specs);
        let arg: ArrayRef = Arc::new(arrow::array::StringArray::from(vec!["b", "a", "b", "zz"]));
        for (i, sign) in [(0, 1), (1, 1), (2, 1), (1, -1), (3, -1)] {
            specs[0].present(&mut k.accs[0], &arg, i, sign).expect("count");
        }
        assert_eq!(k.accs[0], Acc::Counted(vec![(ScalarValue::Utf8(Some("b".into())), 2)]));
        let bytes = k.encode(&specs).expect("encode");
        assert_eq!(KeyAccs::decode(&bytes, &specs).expect("decode"), k);
        for cut in 0..bytes.len() {
            assert!(KeyAccs::decode(&bytes[..cut], &specs).is_err(), "cut at {cut}");
        }
        let ScalarValue::Map(m) = specs[0].value(&k.accs[0]).expect("value") else {
            panic!("COLLECT is a map");
        };
        assert_eq!(m.value(0).len(), 1);
        let ScalarValue::Map(empty) = specs[0].value(&Acc::Counted(vec![])).expect("empty") else {
            panic!("COLLECT of nothing is a map");
        };
        assert_eq!((empty.is_null(0), empty.value(0).len()), (false, 0));
    }

    /// Over an updating input the kept values round-trip through bytes
    /// (NULLs too), and a retraction takes out the earliest equal value.
    #[test]
    fn kept_values_over_an_updating_input_take_out_the_earliest_equal_value() {
        let item = Arc::new(arrow::datatypes::Field::new_list_field(DataType::Int32, true));
        let specs = vec![
            AggSpec::new(
                &call(AggFunc::FirstValue, DataType::Int32, DataType::Int32, false),
                false,
            )
            .expect("first"),
            AggSpec::new(
                &call(AggFunc::LastValue, DataType::Int32, DataType::Int32, false),
                false,
            )
            .expect("last"),
            AggSpec::new(&call(AggFunc::ListAgg, DataType::Utf8, DataType::Utf8, false), false).expect("listagg"),
            AggSpec::new(
                &call(AggFunc::ArrayAgg, DataType::Int32, DataType::List(item), false),
                false,
            )
            .expect("array"),
        ];
        let ints: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![Some(1), Some(2), Some(1), None]));
        let texts: ArrayRef = Arc::new(arrow::array::StringArray::from(vec!["1", "2", "1", "x"]));
        let mut k = KeyAccs::new(&specs);
        for (j, spec) in specs.iter().enumerate() {
            let arg = if j == 2 { &texts } else { &ints };
            for i in 0..4 {
                spec.present(&mut k.accs[j], arg, i, 1).expect("add");
            }
            // The first 1 leaves; the later one stays.
            spec.present(&mut k.accs[j], arg, 0, -1).expect("retract");
            // A value not present changes nothing.
            let absent: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![7]));
            let absent_text: ArrayRef = Arc::new(arrow::array::StringArray::from(vec!["7"]));
            spec.present(&mut k.accs[j], if j == 2 { &absent_text } else { &absent }, 0, -1)
                .expect("retract absent");
        }
        let bytes = k.encode(&specs).expect("encode");
        let back = KeyAccs::decode(&bytes, &specs).expect("decode");
        assert_eq!(back, k);
        let v = back.values(&specs).expect("values");
        assert_eq!(v[0], ScalarValue::Int32(Some(2)));
        assert_eq!(v[1], ScalarValue::Int32(None));
        assert_eq!(v[2], ScalarValue::Utf8(Some("2,1,x".into())));
        assert_eq!(v[3].to_string(), "[2, 1, ]");
        for cut in 0..bytes.len() {
            assert!(KeyAccs::decode(&bytes[..cut], &specs).is_err(), "cut at {cut}");
        }
    }

    /// State written by earlier builds (fixed-width format 1) still reads;
    /// the varint format takes a fraction of its bytes.
    #[test]
    fn fixed_width_accumulators_of_earlier_builds_still_decode() {
        let specs = vec![
            AggSpec::new(&call(AggFunc::Count, DataType::Null, DataType::Int64, false), false).expect("count"),
            AggSpec::new(&call(AggFunc::Sum, DataType::Int64, DataType::Int64, false), false).expect("sum"),
        ];
        let mut old = vec![1u8];
        old.extend_from_slice(&5i64.to_be_bytes());
        old.push(0);
        old.extend_from_slice(&5i64.to_be_bytes());
        old.push(1);
        old.extend_from_slice(&4i64.to_be_bytes());
        old.extend_from_slice(&(-123_456i64).to_be_bytes());
        let k = KeyAccs {
            rows: 5,
            accs: vec![
                Acc::Count(5),
                Acc::Sum {
                    sum: Num::Int(-123_456),
                    n: 4,
                },
            ],
        };
        assert_eq!(KeyAccs::decode(&old, &specs).expect("format 1"), k);
        let new = k.encode(&specs).expect("encode");
        assert_eq!(new, [2, 10, 0, 10, 1, 8, 255, 136, 15]);
        assert_eq!(KeyAccs::decode(&new, &specs).expect("format 2"), k);
    }

    #[test]
    fn sum_is_null_without_values_and_int_avg_truncates() {
        let sum = AggSpec::new(&call(AggFunc::Sum, DataType::Int64, DataType::Int64, false), false).expect("sum");
        let avg = AggSpec::new(&call(AggFunc::Avg, DataType::Int32, DataType::Int32, false), false).expect("avg");
        let mut acc = sum.empty();
        assert_eq!(sum.value(&acc).expect("v"), ScalarValue::Int64(None));
        let a: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![5, -8]));
        sum.add(&mut acc, Some(&a), 0, 1);
        sum.add(&mut acc, Some(&a), 1, 1);
        assert_eq!(sum.value(&acc).expect("v"), ScalarValue::Int64(Some(-3)));
        let mut acc = avg.empty();
        avg.add(&mut acc, Some(&a), 0, 1);
        avg.add(&mut acc, Some(&a), 1, 1);
        // -3 / 2 truncates toward zero, as Java's integer division.
        assert_eq!(avg.value(&acc).expect("v"), ScalarValue::Int32(Some(-1)));
        sum.add(&mut acc, Some(&a), 1, -1);
    }
}
