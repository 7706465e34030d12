//! Flink's `VAR_POP`, `VAR_SAMP` (`VARIANCE`), `STDDEV_POP` and
//! `STDDEV_SAMP` (`STDDEV`), registered over DataFusion's.
//!
//! Flink computes them with Welford's method in DOUBLE, as DataFusion
//! does, but types the result as the input: the variance of an INT column
//! is an INT (Java's saturating cast), of a DECIMAL a `DECIMAL(38, 6)`;
//! DataFusion answers DOUBLE. The moments and the formula are the
//! engine's [`Welford`] and [`AggFunc::moment`], shared with the GROUP BY
//! operator's retractable accumulator (`engine/src/operators/group/
//! accs.rs`); this accumulator serves windows.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{Accumulator, AggregateUDF, AggregateUDFImpl, Signature, Volatility};
use weir_engine::plan::{AggFunc, Welford};

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FlinkMoment {
    func: AggFunc,
    name: &'static str,
    aliases: Vec<String>,
    signature: Signature,
}

/// The four functions, to register (DataFusion's names and aliases, so
/// they replace DataFusion's).
pub fn all() -> Vec<AggregateUDF> {
    [
        (AggFunc::VarPop, "var_pop", vec![]),
        (AggFunc::VarSamp, "var", vec!["var_samp", "var_sample", "variance"]),
        (AggFunc::StddevPop, "stddev_pop", vec![]),
        (AggFunc::StddevSamp, "stddev", vec!["stddev_samp"]),
    ]
    .into_iter()
    .map(|(func, name, aliases)| {
        AggregateUDF::new_from_impl(FlinkMoment {
            func,
            name,
            aliases: aliases.into_iter().map(String::from).collect(),
            signature: Signature::any(1, Volatility::Immutable),
        })
    })
    .collect()
}

/// Flink's result type for an input type.
pub fn result_type(func: AggFunc, input: &DataType) -> Result<DataType> {
    Ok(match input {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64 => input.clone(),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 | DataType::Null => DataType::Float64,
        DataType::Decimal128(..) => DataType::Decimal128(38, 6),
        other => {
            return plan_err!(
                "{} takes a number, not {}",
                func.name(),
                crate::types::flink_name(other)
            );
        }
    })
}

impl AggregateUDFImpl for FlinkMoment {
    fn name(&self) -> &str {
        self.name
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [t] => result_type(self.func, t),
            _ => plan_err!("{} takes one argument", self.func.name()),
        }
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(Moments {
            func: self.func,
            out: args.return_field.data_type().clone(),
            w: Welford::default(),
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(format!("{}[count]", args.name), DataType::Int64, false)),
            Arc::new(Field::new(format!("{}[mean]", args.name), DataType::Float64, false)),
            Arc::new(Field::new(format!("{}[m2]", args.name), DataType::Float64, false)),
        ])
    }
}

/// The moments of a window's rows.
#[derive(Debug)]
struct Moments {
    func: AggFunc,
    out: DataType,
    w: Welford,
}

impl Moments {
    fn apply(&mut self, values: &ArrayRef, add: bool) -> Result<()> {
        let x = cast(values, &DataType::Float64)?;
        for v in x.as_primitive::<Float64Type>().iter().flatten() {
            if add { self.w.add(v) } else { self.w.retract(v) }
        }
        Ok(())
    }
}

impl Accumulator for Moments {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        match values.first() {
            Some(v) => self.apply(v, true),
            None => Ok(()),
        }
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        match values.first() {
            Some(v) => self.apply(v, false),
            None => Ok(()),
        }
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [n, mean, m2] = states else {
            return plan_err!("{}: three state columns expected", self.func.name());
        };
        let (n, mean, m2) = (
            n.as_primitive::<Int64Type>(),
            mean.as_primitive::<Float64Type>(),
            m2.as_primitive::<Float64Type>(),
        );
        for i in 0..n.len() {
            if n.is_valid(i) {
                self.w.merge(&Welford {
                    n: n.value(i),
                    mean: mean.value(i),
                    m2: m2.value(i),
                });
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::Int64(Some(self.w.n)),
            ScalarValue::Float64(Some(self.w.mean)),
            ScalarValue::Float64(Some(self.w.m2)),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        weir_engine::plan::moment_scalar(self.func.moment(&self.w), &self.out)
    }

    fn size(&self) -> usize {
        size_of_val(self)
    }
}
