//! Flink's `ARRAY_*` functions, with Flink's NULL rules and orders (the
//! conformance suite records Flink 2.3's answers):
//!
//! - a NULL array argument gives NULL (DataFusion's `array_append` and
//!   `array_concat` treat it as empty);
//! - elements compare as values with NULL equal to NULL (`ARRAY_REMOVE(a,
//!   NULL)` removes the NULLs; `ARRAY_DISTINCT` keeps one NULL);
//! - results keep the order of the first array (DataFusion's
//!   `array_distinct` and `array_union` sort);
//! - `ARRAY_SORT(a[, ascending[, nullsFirst]])`: NULLs first when
//!   ascending and last when descending unless told;
//! - `ARRAY_SLICE(a, start[, end])`: 1-based, inclusive, 0 is the start,
//!   negative offsets count from the end, out of range is clamped.
//!
//! Elements are compared through Arrow's row format, so every element
//! type (strings, decimals, timestamps, nested values) works one way.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int32Array, Int32Builder, ListArray, StringBuilder, UInt32Builder,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::compute::{cast, interleave, take};
use arrow::datatypes::{DataType, Field};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::type_coercion::binary::type_union_resolution;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Append,
    Prepend,
    Concat,
    Distinct,
    Position,
    Remove,
    Reverse,
    Slice,
    Sort,
    Max,
    Min,
    Join,
    Union,
    Except,
    Intersect,
}

const ALL: [Op; 15] = [
    Op::Append,
    Op::Prepend,
    Op::Concat,
    Op::Distinct,
    Op::Position,
    Op::Remove,
    Op::Reverse,
    Op::Slice,
    Op::Sort,
    Op::Max,
    Op::Min,
    Op::Join,
    Op::Union,
    Op::Except,
    Op::Intersect,
];

/// What each argument of a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arg {
    List,
    Element,
    Int,
    Bool,
    Text,
}

impl Op {
    fn flink_name(self) -> &'static str {
        match self {
            Op::Append => "ARRAY_APPEND",
            Op::Prepend => "ARRAY_PREPEND",
            Op::Concat => "ARRAY_CONCAT",
            Op::Distinct => "ARRAY_DISTINCT",
            Op::Position => "ARRAY_POSITION",
            Op::Remove => "ARRAY_REMOVE",
            Op::Reverse => "ARRAY_REVERSE",
            Op::Slice => "ARRAY_SLICE",
            Op::Sort => "ARRAY_SORT",
            Op::Max => "ARRAY_MAX",
            Op::Min => "ARRAY_MIN",
            Op::Join => "ARRAY_JOIN",
            Op::Union => "ARRAY_UNION",
            Op::Except => "ARRAY_EXCEPT",
            Op::Intersect => "ARRAY_INTERSECT",
        }
    }

    /// The kinds of the arguments of a call with `n` of them, or `None`
    /// when `n` is not an arity of the function.
    fn args(self, n: usize) -> Option<Vec<Arg>> {
        use Arg::*;
        let kinds = match (self, n) {
            (Op::Append | Op::Prepend | Op::Position | Op::Remove, 2) => vec![List, Element],
            (Op::Concat, n) if n >= 1 => vec![List; n],
            (Op::Union | Op::Except | Op::Intersect, 2) => vec![List, List],
            (Op::Distinct | Op::Reverse | Op::Max | Op::Min, 1) => vec![List],
            (Op::Slice, 2) => vec![List, Int],
            (Op::Slice, 3) => vec![List, Int, Int],
            (Op::Sort, n @ 1..=3) => [List, Bool, Bool][..n].to_vec(),
            (Op::Join, n @ 2..=3) => [List, Text, Text][..n].to_vec(),
            _ => return None,
        };
        Some(kinds)
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ArrayOp {
    op: Op,
    name: String,
    signature: Signature,
}

/// The `ARRAY_*` functions, to register.
pub fn all() -> Vec<ScalarUDF> {
    ALL.into_iter()
        .map(|op| {
            ScalarUDF::new_from_impl(ArrayOp {
                op,
                name: op.flink_name().to_ascii_lowercase(),
                signature: Signature::user_defined(Volatility::Immutable),
            })
        })
        .collect()
}

fn element_type(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => Some(f.data_type()),
        _ => None,
    }
}

fn list_of(elem: &DataType) -> DataType {
    DataType::new_list(elem.clone(), true)
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

impl ScalarUDFImpl for ArrayOp {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        let name = self.op.flink_name();
        let Some(kinds) = self.op.args(types.len()) else {
            return plan_err!("{name} does not take {} argument(s)", types.len());
        };
        // One element type for every array and element argument.
        let mut elems = vec![];
        for (t, k) in types.iter().zip(&kinds) {
            match (k, t) {
                (Arg::List, DataType::Null) => {}
                (Arg::List, t) => match element_type(t) {
                    Some(e) => elems.push(e.clone()),
                    None => return plan_err!("{name} takes an ARRAY, not {}", crate::types::flink_name(t)),
                },
                (Arg::Element, t) => elems.push(t.clone()),
                _ => {}
            }
        }
        let elem = if elems.is_empty() {
            DataType::Null
        } else {
            match type_union_resolution(&elems) {
                Some(e) => e,
                None => {
                    let names: Vec<String> = elems.iter().map(crate::types::flink_name).collect();
                    return plan_err!("{name}: the elements have no common type ({})", names.join(", "));
                }
            }
        };
        if self.op == Op::Join && !is_text(&elem) && elem != DataType::Null {
            return plan_err!(
                "{name} takes an ARRAY<STRING>, not ARRAY<{}>",
                crate::types::flink_name(&elem)
            );
        }
        types
            .iter()
            .zip(kinds)
            .map(|(t, k)| {
                Ok(match k {
                    Arg::List => list_of(&elem),
                    Arg::Element => elem.clone(),
                    Arg::Int if t.is_integer() || *t == DataType::Null => DataType::Int32,
                    Arg::Bool if matches!(t, DataType::Boolean | DataType::Null) => DataType::Boolean,
                    Arg::Text if is_text(t) || *t == DataType::Null => DataType::Utf8,
                    _ => return plan_err!("{name} does not take a {} there", crate::types::flink_name(t)),
                })
            })
            .collect()
    }

    fn return_type(&self, types: &[DataType]) -> Result<DataType> {
        let elem = types.first().and_then(element_type).cloned().unwrap_or(DataType::Null);
        Ok(match self.op {
            Op::Position => DataType::Int32,
            Op::Max | Op::Min => elem,
            Op::Join => DataType::Utf8,
            _ => list_of(&elem),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let arrays = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
        let out = self.eval(&arrays, rows)?;
        crate::udf::columnar(out, all_scalar)
    }
}

/// One array argument: its lists, and its elements as comparable rows.
struct Lists {
    lists: ListArray,
    rows: Rows,
}

impl Lists {
    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let o = self.lists.value_offsets();
        o[i] as usize..o[i + 1] as usize
    }

    fn is_null(&self, i: usize) -> bool {
        self.lists.is_null(i)
    }
}

/// Builds the per-row lists of picked (source, index) elements.
struct Picks {
    picks: Vec<(usize, usize)>,
    offsets: Vec<i32>,
    valid: Vec<bool>,
}

impl Picks {
    fn new(rows: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            picks: vec![],
            offsets,
            valid: Vec::with_capacity(rows),
        }
    }

    fn end_row(&mut self, valid: bool) -> Result<()> {
        let Ok(end) = i32::try_from(self.picks.len()) else {
            return exec_err!("a batch of arrays holds more than 2^31 elements");
        };
        self.offsets.push(end);
        self.valid.push(valid);
        Ok(())
    }

    fn finish(self, sources: &[&dyn Array], elem: &DataType) -> Result<ArrayRef> {
        let values = interleave(sources, &self.picks)?;
        let field = Arc::new(Field::new_list_field(elem.clone(), true));
        let nulls = NullBuffer::from(self.valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        Ok(Arc::new(ListArray::try_new(
            field,
            OffsetBuffer::new(self.offsets.into()),
            values,
            nulls,
        )?))
    }
}

impl ArrayOp {
    fn eval(&self, arrays: &[ArrayRef], rows: usize) -> Result<ArrayRef> {
        let kinds = self.op.args(arrays.len()).unwrap_or_default();
        let elem = arrays
            .iter()
            .zip(&kinds)
            .find_map(|(a, k)| {
                (*k == Arg::List)
                    .then(|| element_type(a.data_type()).cloned())
                    .flatten()
            })
            .unwrap_or(DataType::Null);
        let converter = RowConverter::new(vec![SortField::new(elem.clone())])?;
        let mut lists = vec![];
        let mut others: Vec<Option<ArrayRef>> = vec![];
        for (a, k) in arrays.iter().zip(&kinds) {
            if *k == Arg::List {
                let a = if a.data_type() == &list_of(&elem) {
                    a.clone()
                } else {
                    cast(a, &list_of(&elem))?
                };
                let list = a.as_list::<i32>().clone();
                let rows = converter.convert_columns(&[list.values().clone()])?;
                lists.push(Lists { lists: list, rows });
                others.push(None);
            } else {
                others.push(Some(a.clone()));
            }
        }
        // The element argument, comparable with the lists' elements.
        let element = others
            .get(1)
            .cloned()
            .flatten()
            .filter(|_| kinds.get(1) == Some(&Arg::Element));
        let element_rows = match &element {
            Some(e) => Some(converter.convert_columns(std::slice::from_ref(e))?),
            None => None,
        };
        let first = &lists[0];
        match self.op {
            Op::Position => {
                let (Some(e), Some(er)) = (&element, &element_rows) else {
                    return exec_err!("ARRAY_POSITION takes an array and a value");
                };
                let mut out = Int32Builder::with_capacity(rows);
                for i in 0..rows {
                    if first.is_null(i) || e.is_null(i) {
                        out.append_null();
                        continue;
                    }
                    let at = first.range(i).position(|j| first.rows.row(j) == er.row(i));
                    out.append_value(at.map_or(0, |p| p as i32 + 1));
                }
                Ok(Arc::new(out.finish()))
            }
            Op::Max | Op::Min => {
                let mut picks = UInt32Builder::with_capacity(rows);
                for i in 0..rows {
                    let values = first.lists.values();
                    let best = first.range(i).filter(|j| values.is_valid(*j)).reduce(|a, b| {
                        let better = if self.op == Op::Max {
                            first.rows.row(b) > first.rows.row(a)
                        } else {
                            first.rows.row(b) < first.rows.row(a)
                        };
                        if better { b } else { a }
                    });
                    match best.filter(|_| !first.is_null(i)) {
                        Some(j) => picks.append_value(u32::try_from(j).unwrap_or(u32::MAX)),
                        None => picks.append_null(),
                    }
                }
                Ok(take(first.lists.values().as_ref(), &picks.finish(), None)?)
            }
            Op::Join => {
                let text = |a: &ArrayRef| -> Result<arrow::array::StringArray> {
                    let a = cast(a, &DataType::Utf8)?;
                    match a.as_string_opt::<i32>() {
                        Some(s) => Ok(s.clone()),
                        None => exec_err!("ARRAY_JOIN takes strings"),
                    }
                };
                let delimiter = others[1].as_ref().map(text).transpose()?;
                let replacement = others.get(2).cloned().flatten().as_ref().map(text).transpose()?;
                let values = text(first.lists.values())?;
                let mut out = StringBuilder::new();
                for i in 0..rows {
                    let Some(d) = delimiter.as_ref().filter(|d| d.is_valid(i)).map(|d| d.value(i)) else {
                        out.append_null();
                        continue;
                    };
                    // A NULL replacement is no replacement.
                    let r = replacement.as_ref().filter(|r| r.is_valid(i)).map(|r| r.value(i));
                    if first.is_null(i) {
                        out.append_null();
                        continue;
                    }
                    let parts: Vec<&str> = first
                        .range(i)
                        .filter_map(|j| if values.is_valid(j) { Some(values.value(j)) } else { r })
                        .collect();
                    out.append_value(parts.join(d));
                }
                Ok(Arc::new(out.finish()))
            }
            _ => self.eval_lists(&lists, &others, element.as_ref(), element_rows.as_ref(), rows, &elem),
        }
    }

    /// The operations whose answer is an array.
    fn eval_lists(
        &self,
        lists: &[Lists],
        others: &[Option<ArrayRef>],
        element: Option<&ArrayRef>,
        element_rows: Option<&Rows>,
        rows: usize,
        elem: &DataType,
    ) -> Result<ArrayRef> {
        let first = &lists[0];
        let mut out = Picks::new(rows);
        // Sort keys per (ascending, nulls first), built when first needed.
        let mut sort_rows: HashMap<(bool, bool), Rows> = HashMap::new();
        let ints = |n: usize| {
            others
                .get(n)
                .cloned()
                .flatten()
                .and_then(|a| a.as_primitive_opt::<arrow::datatypes::Int32Type>().cloned())
        };
        let bools = |n: usize| -> Option<BooleanArray> {
            others
                .get(n)
                .cloned()
                .flatten()
                .and_then(|a| a.as_boolean_opt().cloned())
        };
        let (start, end): (Option<Int32Array>, Option<Int32Array>) = match self.op {
            Op::Slice => (ints(1), ints(2)),
            _ => (None, None),
        };
        let (ascending, nulls_first) = match self.op {
            Op::Sort => (bools(1), bools(2)),
            _ => (None, None),
        };
        for i in 0..rows {
            if lists.iter().any(|l| l.is_null(i)) {
                out.end_row(false)?;
                continue;
            }
            let r = first.range(i);
            match self.op {
                Op::Append => {
                    out.picks.extend(r.map(|j| (0, j)));
                    out.picks.push((1, i));
                }
                Op::Prepend => {
                    out.picks.push((1, i));
                    out.picks.extend(r.map(|j| (0, j)));
                }
                Op::Concat => {
                    for (k, l) in lists.iter().enumerate() {
                        out.picks.extend(l.range(i).map(|j| (k, j)));
                    }
                }
                Op::Reverse => out.picks.extend(r.rev().map(|j| (0, j))),
                Op::Remove => {
                    let x = element_rows.map(|er| er.row(i));
                    out.picks
                        .extend(r.filter(|j| Some(first.rows.row(*j)) != x).map(|j| (0, j)));
                }
                Op::Distinct | Op::Union => {
                    let mut seen = HashSet::new();
                    for (k, l) in lists.iter().enumerate() {
                        for j in l.range(i) {
                            if seen.insert(l.rows.row(j)) {
                                out.picks.push((k, j));
                            }
                        }
                    }
                }
                Op::Except | Op::Intersect => {
                    let other = &lists[1];
                    let theirs: HashSet<_> = other.range(i).map(|j| other.rows.row(j)).collect();
                    let mut seen = HashSet::new();
                    let keep = self.op == Op::Intersect;
                    for j in r {
                        let v = first.rows.row(j);
                        if theirs.contains(&v) == keep && seen.insert(v) {
                            out.picks.push((0, j));
                        }
                    }
                }
                Op::Slice => {
                    let value = |a: &Option<Int32Array>| a.as_ref().map(|a| a.is_valid(i).then(|| a.value(i)));
                    let n = r.len() as i64;
                    let (s, e) = match (value(&start), value(&end)) {
                        (Some(Some(s)), None) => (i64::from(s), n),
                        (Some(Some(s)), Some(Some(e))) => (i64::from(s), i64::from(e)),
                        _ => {
                            out.end_row(false)?;
                            continue;
                        }
                    };
                    let at = |o: i64| match o {
                        0 => 1,
                        o if o < 0 => n + o + 1,
                        o => o,
                    };
                    let (s, e) = (at(s).max(1), at(e).min(n));
                    if s <= e {
                        out.picks
                            .extend((r.start + s as usize - 1..r.start + e as usize).map(|j| (0, j)));
                    }
                }
                Op::Sort => {
                    let flag = |a: &Option<BooleanArray>| a.as_ref().map(|a| a.is_valid(i).then(|| a.value(i)));
                    let asc = match flag(&ascending) {
                        None => true,
                        Some(Some(v)) => v,
                        Some(None) => {
                            out.end_row(false)?;
                            continue;
                        }
                    };
                    let nf = match flag(&nulls_first) {
                        None => asc,
                        Some(Some(v)) => v,
                        Some(None) => {
                            out.end_row(false)?;
                            continue;
                        }
                    };
                    let keys = match sort_rows.entry((asc, nf)) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            let options = arrow::compute::SortOptions {
                                descending: !asc,
                                nulls_first: nf,
                            };
                            let c = RowConverter::new(vec![SortField::new_with_options(elem.clone(), options)])?;
                            e.insert(c.convert_columns(std::slice::from_ref(first.lists.values()))?)
                        }
                    };
                    let mut order: Vec<usize> = r.collect();
                    order.sort_by(|a, b| keys.row(*a).cmp(&keys.row(*b)));
                    out.picks.extend(order.into_iter().map(|j| (0, j)));
                }
                Op::Position | Op::Max | Op::Min | Op::Join => unreachable!("not an array answer"),
            }
            out.end_row(true)?;
        }
        let mut sources: Vec<&dyn Array> = lists.iter().map(|l| l.lists.values().as_ref()).collect();
        if let Some(e) = element.filter(|_| matches!(self.op, Op::Append | Op::Prepend)) {
            sources.push(e.as_ref());
        }
        out.finish(&sources, elem)
    }
}
