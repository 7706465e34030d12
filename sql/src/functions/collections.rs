//! Flink's array functions where DataFusion's answer differs: `ELEMENT`
//! and `ARRAY_CONTAINS` (`ARRAY[...]`, `a[i]` 1-based and `CARDINALITY`
//! are DataFusion's, the last cast to Flink's INT by the AST rewrite).
//!
//! - `ELEMENT(a)`: the only element of `a`; NULL when `a` is NULL or empty;
//!   an error when it has more than one (Flink's).
//! - `ARRAY_CONTAINS(a, x)`: whether `a` holds `x`, NULL included (a NULL
//!   `x` is found when `a` holds a NULL); NULL only when `a` is NULL.
//!   DataFusion's `array_has` answers NULL for a NULL `x`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanBuilder, GenericListArray, OffsetSizeTrait, UInt32Builder};
use arrow::compute::kernels::cmp::not_distinct;
use arrow::compute::{cast, take};
use arrow::datatypes::DataType;
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Element,
    Contains,
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ArrayFn {
    op: Op,
    signature: Signature,
}

/// `ELEMENT` and `ARRAY_CONTAINS`, to register.
pub fn all() -> Vec<ScalarUDF> {
    [Op::Element, Op::Contains]
        .into_iter()
        .map(|op| {
            ScalarUDF::new_from_impl(ArrayFn {
                op,
                signature: Signature::variadic_any(Volatility::Immutable),
            })
        })
        .collect()
}

/// The element type of a list type.
fn element_type(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => Some(f.data_type()),
        _ => None,
    }
}

impl ArrayFn {
    fn flink_name(&self) -> &'static str {
        match self.op {
            Op::Element => "ELEMENT",
            Op::Contains => "ARRAY_CONTAINS",
        }
    }
}

impl ScalarUDFImpl for ArrayFn {
    fn name(&self) -> &str {
        match self.op {
            Op::Element => "element",
            Op::Contains => "array_contains",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let name = self.flink_name();
        let arity = if self.op == Op::Element { 1 } else { 2 };
        if args.len() != arity {
            return plan_err!("{name} takes {arity} argument(s), not {}", args.len());
        }
        let Some(elem) = element_type(&args[0]) else {
            return plan_err!("{name} takes an ARRAY, not {}", crate::types::flink_name(&args[0]));
        };
        Ok(match self.op {
            Op::Element => elem.clone(),
            Op::Contains => DataType::Boolean,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let arrays = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
        // One list layout for both offset widths.
        let list = match arrays[0].data_type() {
            DataType::LargeList(_) => arrays[0].clone(),
            DataType::List(_) => arrays[0].clone(),
            other => cast(
                &arrays[0],
                &DataType::new_list(element_type(other).cloned().unwrap_or(DataType::Null), true),
            )?,
        };
        let out = match list.data_type() {
            DataType::LargeList(_) => self.eval(list.as_list::<i64>(), arrays.get(1))?,
            _ => self.eval(list.as_list::<i32>(), arrays.get(1))?,
        };
        crate::udf::columnar(out, all_scalar)
    }
}

impl ArrayFn {
    fn eval<O: OffsetSizeTrait>(&self, list: &GenericListArray<O>, needle: Option<&ArrayRef>) -> Result<ArrayRef> {
        let offsets = list.value_offsets();
        match self.op {
            Op::Element => {
                let mut picks = UInt32Builder::with_capacity(list.len());
                for i in 0..list.len() {
                    let (start, end) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
                    match (list.is_valid(i), end - start) {
                        (true, 1) => picks.append_value(u32::try_from(start).unwrap_or(u32::MAX)),
                        (true, n) if n > 1 => {
                            return exec_err!("ELEMENT: the array has {n} elements (it must have one or none)");
                        }
                        _ => picks.append_null(),
                    }
                }
                Ok(take(list.values().as_ref(), &picks.finish(), None)?)
            }
            Op::Contains => {
                let Some(needle) = needle else {
                    return exec_err!("ARRAY_CONTAINS takes an array and a value");
                };
                let elem = list.values();
                let needle = if needle.data_type() == elem.data_type() {
                    needle.clone()
                } else {
                    cast(needle, elem.data_type())?
                };
                let mut out = BooleanBuilder::with_capacity(list.len());
                for i in 0..list.len() {
                    if list.is_null(i) {
                        out.append_null();
                        continue;
                    }
                    let (start, end) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
                    let items = elem.slice(start, end - start);
                    let one = arrow::array::Scalar::new(needle.slice(i, 1));
                    let same = not_distinct(&items, &one)?;
                    out.append_value(same.true_count() > 0);
                }
                Ok(Arc::new(out.finish()))
            }
        }
    }
}
