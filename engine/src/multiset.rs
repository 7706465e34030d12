//! Flink's `MULTISET<T>` in Arrow: a map from each distinct element to its
//! count (`INT`), as Flink itself stores a multiset (`MapData` of element →
//! count) and writes one in JSON (`{"a": 2}`) and in its SQL client
//! (`{a=2}`).
//!
//! A MULTISET is told apart from a `MAP<T, INT>` by the name of its Arrow
//! entries field (`multiset`, a map's is `entries`): the name is part of
//! the Arrow type, so it survives casts, projections, state and the
//! catalog without metadata that DataFusion's expressions could drop.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, MapArray, StructArray};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::ScalarValue;

use crate::error::{ExecError, Result};

/// The entries field name that marks a map as a MULTISET.
pub const ENTRIES: &str = "multiset";

fn entry_fields(elem: DataType) -> Fields {
    vec![
        Field::new("key", elem, false),
        Field::new("value", DataType::Int32, false),
    ]
    .into()
}

/// Arrow's type of `MULTISET<elem>`.
pub fn data_type(elem: DataType) -> DataType {
    DataType::Map(
        Arc::new(Field::new(ENTRIES, DataType::Struct(entry_fields(elem)), false)),
        false,
    )
}

/// The element type, when `t` is a MULTISET.
pub fn element_type(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::Map(entries, _) if entries.name() == ENTRIES => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => Some(kv[0].data_type()),
            _ => None,
        },
        _ => None,
    }
}

/// The multiset of `values` (NULLs are not elements, as Flink's COLLECT
/// skips them): each distinct value once, in order of first arrival, with
/// its number of occurrences.
pub fn of_values<'a>(elem: &DataType, values: impl IntoIterator<Item = &'a ScalarValue>) -> Result<ScalarValue> {
    let mut distinct: Vec<&ScalarValue> = vec![];
    let mut counts: Vec<i32> = vec![];
    let mut index: std::collections::HashMap<&ScalarValue, usize> = std::collections::HashMap::new();
    for v in values {
        if v.is_null() {
            continue;
        }
        match index.get(v) {
            Some(&at) => counts[at] = counts[at].saturating_add(1),
            None => {
                index.insert(v, distinct.len());
                distinct.push(v);
                counts.push(1);
            }
        }
    }
    from_counts(elem, distinct.into_iter().cloned(), counts)
}

/// The multiset of the given distinct elements and their counts.
pub fn from_counts(
    elem: &DataType,
    elements: impl Iterator<Item = ScalarValue>,
    counts: Vec<i32>,
) -> Result<ScalarValue> {
    let keys = ScalarValue::iter_to_array(elements.chain(std::iter::once(ScalarValue::try_from(elem)?)))?;
    // The NULL appended above types an empty list of keys; it is cut off.
    let keys = keys.slice(0, counts.len());
    let keys = if keys.data_type() == elem {
        keys
    } else {
        arrow::compute::cast(&keys, elem)?
    };
    let n = counts.len();
    let values: ArrayRef = Arc::new(Int32Array::from(counts));
    let entries = StructArray::try_new(entry_fields(elem.clone()), vec![keys, values], None)?;
    let DataType::Map(field, _) = data_type(elem.clone()) else {
        return Err(ExecError::internal("a MULTISET is a map"));
    };
    let map = MapArray::try_new(field, OffsetBuffer::from_lengths([n]), entries, None, false)?;
    Ok(ScalarValue::Map(Arc::new(map)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int32Type;

    #[test]
    fn values_count_in_order_of_first_arrival_without_nulls() {
        let s = |t: &str| ScalarValue::Utf8(Some(t.into()));
        let values = [s("b"), s("a"), ScalarValue::Utf8(None), s("b")];
        let ScalarValue::Map(m) = of_values(&DataType::Utf8, &values).expect("multiset") else {
            panic!("not a map");
        };
        assert_eq!(element_type(m.data_type()), Some(&DataType::Utf8));
        let entries = m.value(0);
        let keys: Vec<&str> = entries.column(0).as_string::<i32>().iter().flatten().collect();
        let counts: Vec<i32> = entries.column(1).as_primitive::<Int32Type>().values().to_vec();
        assert_eq!((keys, counts), (vec!["b", "a"], vec![2, 1]));

        let ScalarValue::Map(empty) = of_values(&DataType::Int64, &[ScalarValue::Int64(None)]).expect("empty") else {
            panic!("not a map");
        };
        assert_eq!((empty.len(), empty.value(0).len(), empty.is_null(0)), (1, 0, false));
        assert_eq!(
            element_type(&crate::multiset::data_type(DataType::Int64)),
            Some(&DataType::Int64)
        );
        assert_eq!(element_type(&DataType::Utf8), None);
    }
}
