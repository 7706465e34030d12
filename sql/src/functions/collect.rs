//! Flink's `COLLECT(x)`: the non-NULL values of a group as a
//! `MULTISET<T> NOT NULL` (each distinct value with its count; `{}` when
//! there are none), for windows and OVER windows. The GROUP BY operator
//! has its own retractable accumulator of the same result
//! (`engine/src/operators/group/accs.rs`, `Acc::Counted`); the Arrow form
//! is [`weir_engine::multiset`].

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, ListArray};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{Accumulator, AggregateUDF, AggregateUDFImpl, Signature, Volatility};
use weir_engine::multiset;

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Collect {
    signature: Signature,
}

impl Collect {
    pub fn udaf() -> AggregateUDF {
        AggregateUDF::new_from_impl(Self {
            signature: Signature::any(1, Volatility::Immutable),
        })
    }
}

impl AggregateUDFImpl for Collect {
    fn name(&self) -> &str {
        "collect"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [DataType::Null] => plan_err!("COLLECT of an untyped NULL: cast it to a type"),
            [t] => Ok(multiset::data_type(t.clone())),
            _ => plan_err!("COLLECT takes one argument"),
        }
    }

    fn is_nullable(&self) -> bool {
        false
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let out = args.return_field.data_type();
        let Some(elem) = multiset::element_type(out) else {
            return plan_err!("COLLECT typed {out}");
        };
        Ok(Box::new(Counts {
            elem: elem.clone(),
            entries: vec![],
            index: HashMap::new(),
        }))
    }

    /// The distinct values and their counts, as two lists (the state
    /// encoding keeps lists, not maps).
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let elem = args
            .input_fields
            .first()
            .map_or(DataType::Null, |f| f.data_type().clone());
        Ok(vec![
            Arc::new(Field::new(
                format!("{}[values]", args.name),
                DataType::new_list(elem, true),
                true,
            )),
            Arc::new(Field::new(
                format!("{}[counts]", args.name),
                DataType::new_list(DataType::Int64, true),
                true,
            )),
        ])
    }
}

/// Each distinct value present and its count, in order of first arrival;
/// `index` finds a value's entry.
#[derive(Debug)]
struct Counts {
    elem: DataType,
    entries: Vec<(ScalarValue, i64)>,
    index: HashMap<ScalarValue, usize>,
}

impl Counts {
    fn count(&mut self, v: ScalarValue, by: i64) {
        if v.is_null() {
            return;
        }
        match self.index.get(&v) {
            Some(&at) => {
                self.entries[at].1 += by;
                if self.entries[at].1 <= 0 {
                    // Gone: a value that comes back is last in order.
                    let (gone, _) = self.entries.remove(at);
                    self.index.remove(&gone);
                    for (later, _) in &self.entries[at..] {
                        if let Some(i) = self.index.get_mut(later) {
                            *i -= 1;
                        }
                    }
                }
            }
            None if by > 0 => {
                self.index.insert(v.clone(), self.entries.len());
                self.entries.push((v, by));
            }
            None => {}
        }
    }

    fn apply(&mut self, values: &[ArrayRef], sign: i64) -> Result<()> {
        let Some(col) = values.first() else {
            return Ok(());
        };
        for i in 0..col.len() {
            if col.is_valid(i) {
                self.count(ScalarValue::try_from_array(col, i)?, sign);
            }
        }
        Ok(())
    }

    fn present(&self) -> impl Iterator<Item = &(ScalarValue, i64)> {
        self.entries.iter()
    }
}

fn one_list(items: ArrayRef) -> Result<ScalarValue> {
    let field = Arc::new(Field::new_list_field(items.data_type().clone(), true));
    let offsets = OffsetBuffer::from_lengths([items.len()]);
    Ok(ScalarValue::List(Arc::new(ListArray::try_new(
        field, offsets, items, None,
    )?)))
}

impl Accumulator for Counts {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.apply(values, 1)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.apply(values, -1)
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [values, counts] = states else {
            return plan_err!("COLLECT: two state columns expected");
        };
        let (values, counts) = (values.as_list::<i32>(), counts.as_list::<i32>());
        for row in 0..values.len() {
            if values.is_null(row) || counts.is_null(row) {
                continue;
            }
            let (v, c) = (values.value(row), counts.value(row));
            let c = c.as_primitive::<Int64Type>();
            for i in 0..v.len().min(c.len()) {
                self.count(ScalarValue::try_from_array(&v, i)?, c.value(i));
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values = ScalarValue::iter_to_array(
            self.present()
                .map(|(v, _)| v.clone())
                .chain(std::iter::once(ScalarValue::try_from(&self.elem)?)),
        )?;
        let n = values.len() - 1;
        let counts: ArrayRef = Arc::new(Int64Array::from_iter_values(self.present().map(|(_, c)| *c)));
        Ok(vec![one_list(values.slice(0, n))?, one_list(counts)?])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let counts = self
            .present()
            .map(|(_, c)| i32::try_from(*c).unwrap_or(i32::MAX))
            .collect();
        multiset::from_counts(&self.elem, self.present().map(|(v, _)| v.clone()), counts)
            .map_err(|e| datafusion::error::DataFusionError::Execution(e.to_string()))
    }

    fn size(&self) -> usize {
        size_of_val(self)
            + self
                .entries
                .iter()
                .map(|(v, _)| v.size() + size_of::<i64>())
                .sum::<usize>()
                * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    fn text(m: &ScalarValue) -> String {
        let strings = crate::functions::cast::to_strings(&m.to_array().expect("array")).expect("text");
        strings.as_string::<i32>().value(0).to_string()
    }

    #[test]
    fn counts_skip_nulls_retract_and_merge_through_state() {
        let mut a = Counts {
            elem: DataType::Utf8,
            entries: vec![],
            index: HashMap::new(),
        };
        let rows: ArrayRef = Arc::new(StringArray::from(vec![Some("b"), Some("a"), None, Some("b")]));
        a.update_batch(&[rows]).expect("update");
        assert_eq!(text(&a.evaluate().expect("evaluate")), "{b=2, a=1}");
        let gone: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), Some("zz")]));
        a.retract_batch(&[gone]).expect("retract");
        assert_eq!(text(&a.evaluate().expect("evaluate")), "{b=2}");

        let mut b = Counts {
            elem: DataType::Utf8,
            entries: vec![],
            index: HashMap::new(),
        };
        assert_eq!(text(&b.evaluate().expect("empty")), "{}");
        let state: Vec<ArrayRef> = a
            .state()
            .expect("state")
            .iter()
            .map(|s| s.to_array().expect("array"))
            .collect();
        b.merge_batch(&state).expect("merge");
        b.merge_batch(&state).expect("merge");
        assert_eq!(text(&b.evaluate().expect("evaluate")), "{b=4}");
    }
}
