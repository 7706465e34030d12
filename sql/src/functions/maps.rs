//! Flink's `MAP` values: the `MAP[k1, v1, ...]` constructor and
//! `STR_TO_MAP`. Lookups (`m['k']`), `CARDINALITY`, `MAP_KEYS`,
//! `MAP_VALUES` and `MAP_ENTRIES` are DataFusion's.
//!
//! - `MAP[k1, v1, k2, v2, ...]` (the parser's `__weir_map(...)`): entries
//!   in the order written; a key given twice keeps its first place and
//!   its last value, as Flink's `LinkedHashMap`. A NULL key, which Flink
//!   allows, is an error: Arrow's map keys cannot be NULL.
//! - `STR_TO_MAP(text[, listDelimiter[, keyValueDelimiter]])`: Flink's
//!   `SqlFunctionUtils.strToMap`: the text split at the list delimiter,
//!   each part at the first key-value delimiter (both Java regular
//!   expressions, `,` and `=` by default, with Java's `String.split`
//!   rules); a part without one maps to NULL; a key given twice keeps the
//!   last value. Flink builds a `HashMap`, so its entries come in the
//!   order of Java's hash buckets, which [`java_hash_map_order`] reproduces
//!   (`STR_TO_MAP('k=v,x,a=1')` is `{x=NULL, a=1, k=v}` in both).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, MapArray, StringBuilder, StructArray};
use arrow::buffer::OffsetBuffer;
use arrow::compute::interleave;
use arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::type_coercion::binary::type_union_resolution;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use crate::functions::scalars::java_regex;
use crate::types::map_type;

/// The parser's name of `MAP[...]`.
pub use crate::functions::names::MAP_FN;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Constructor,
    StrToMap,
}

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MapFn {
    op: Op,
    signature: Signature,
}

/// `MAP[...]` and `STR_TO_MAP`, to register.
pub fn all() -> Vec<ScalarUDF> {
    [Op::Constructor, Op::StrToMap]
        .into_iter()
        .map(|op| {
            ScalarUDF::new_from_impl(MapFn {
                op,
                signature: Signature::user_defined(Volatility::Immutable),
            })
        })
        .collect()
}

impl ScalarUDFImpl for MapFn {
    fn name(&self) -> &str {
        match self.op {
            Op::Constructor => MAP_FN,
            Op::StrToMap => "str_to_map",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        match self.op {
            Op::Constructor => {
                if args.is_empty() || !args.len().is_multiple_of(2) {
                    return plan_err!(
                        "MAP[...] takes key-value pairs: an even number of values, not {}",
                        args.len()
                    );
                }
                let common = |from: usize| {
                    let types: Vec<DataType> = args.iter().skip(from).step_by(2).cloned().collect();
                    type_union_resolution(&types)
                };
                let (Some(key), Some(value)) = (common(0), common(1)) else {
                    return plan_err!("MAP[...]: its keys, and its values, must each have one common type");
                };
                Ok((0..args.len())
                    .map(|i| if i % 2 == 0 { key.clone() } else { value.clone() })
                    .collect())
            }
            Op::StrToMap => {
                if args.len() != 1 && args.len() != 3 {
                    return plan_err!(
                        "STR_TO_MAP takes a text, or a text and its two delimiters: 1 or 3 arguments, not {}",
                        args.len()
                    );
                }
                for t in args {
                    if !matches!(
                        t,
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
                    ) {
                        return plan_err!("STR_TO_MAP takes strings, not {}", crate::types::flink_name(t));
                    }
                }
                Ok(vec![DataType::Utf8; args.len()])
            }
        }
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(match self.op {
            Op::Constructor => map_type(args[0].clone(), args[1].clone()),
            Op::StrToMap => map_type(DataType::Utf8, DataType::Utf8),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let out = match self.op {
            Op::Constructor => construct(&args.args, rows)?,
            Op::StrToMap => {
                let arrays = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
                str_to_map(&arrays, rows)?
            }
        };
        crate::udf::columnar(out, all_scalar)
    }
}

/// A map array from per-row entries given as (source, row) picks of the
/// key and value arrays.
fn map_of(
    keys: &[&dyn Array],
    values: &[&dyn Array],
    key_picks: &[(usize, usize)],
    value_picks: &[(usize, usize)],
    offsets: Vec<i32>,
    nulls: Option<arrow::buffer::NullBuffer>,
) -> Result<ArrayRef> {
    let k = interleave(keys, key_picks)?;
    let v = interleave(values, value_picks)?;
    let DataType::Map(entries_field, _) = map_type(k.data_type().clone(), v.data_type().clone()) else {
        unreachable!("map_type builds a map")
    };
    let DataType::Struct(fields) = entries_field.data_type() else {
        unreachable!("a map's entries are a struct")
    };
    let entries = StructArray::try_new(fields.clone(), vec![k, v], None)?;
    Ok(Arc::new(MapArray::try_new(
        entries_field.clone(),
        OffsetBuffer::new(offsets.into()),
        entries,
        nulls,
        false,
    )?))
}

/// `MAP[k1, v1, ...]` over `rows` rows.
fn construct(args: &[ColumnarValue], rows: usize) -> Result<ArrayRef> {
    let arrays = args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
    let keys: Vec<&dyn Array> = arrays.iter().step_by(2).map(|a| a.as_ref()).collect();
    let values: Vec<&dyn Array> = arrays.iter().skip(1).step_by(2).map(|a| a.as_ref()).collect();
    if keys.iter().any(|k| k.null_count() > 0) {
        return exec_err!("MAP[...] got a NULL key: Weir's maps cannot hold one (Flink's can)");
    }
    let pairs = keys.len();
    let mut key_picks = Vec::with_capacity(rows * pairs);
    let mut value_picks = Vec::with_capacity(rows * pairs);
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0i32);
    // Literal keys (the usual case) are deduplicated once for every row.
    let literal_keys = args.iter().step_by(2).all(|a| matches!(a, ColumnarValue::Scalar(_)));
    if literal_keys {
        let scalars: Vec<ScalarValue> = keys
            .iter()
            .map(|k| ScalarValue::try_from_array(*k, 0))
            .collect::<Result<_>>()?;
        // (key source, value source) of each entry kept.
        let mut kept: Vec<(usize, usize)> = vec![];
        for (j, key) in scalars.iter().enumerate() {
            match kept.iter_mut().find(|(first, _)| &scalars[*first] == key) {
                Some(entry) => entry.1 = j,
                None => kept.push((j, j)),
            }
        }
        for i in 0..rows {
            key_picks.extend(kept.iter().map(|(k, _)| (*k, i)));
            value_picks.extend(kept.iter().map(|(_, v)| (*v, i)));
            offsets.push(i32::try_from(key_picks.len()).map_err(|_| overflow())?);
        }
    } else {
        let mut same: Vec<Vec<Option<arrow::array::DynComparator>>> = Vec::with_capacity(pairs);
        for a in 0..pairs {
            let mut row = Vec::with_capacity(pairs);
            for b in 0..pairs {
                row.push(if a < b {
                    Some(arrow::array::make_comparator(keys[a], keys[b], Default::default())?)
                } else {
                    None
                });
            }
            same.push(row);
        }
        for i in 0..rows {
            let start = key_picks.len();
            for j in 0..pairs {
                let dup = (start..key_picks.len()).find(|e| {
                    let (first, _) = key_picks[*e];
                    same.get(first)
                        .and_then(|row| row.get(j))
                        .and_then(Option::as_ref)
                        .is_some_and(|cmp| cmp(i, i).is_eq())
                });
                match dup {
                    Some(e) => value_picks[e] = (j, i),
                    None => {
                        key_picks.push((j, i));
                        value_picks.push((j, i));
                    }
                }
            }
            offsets.push(i32::try_from(key_picks.len()).map_err(|_| overflow())?);
        }
    }
    map_of(&keys, &values, &key_picks, &value_picks, offsets, None)
}

fn overflow() -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Execution("a batch of maps holds more than 2^31 entries".into())
}

/// `STR_TO_MAP` over `rows` rows of string arrays.
fn str_to_map(arrays: &[ArrayRef], rows: usize) -> Result<ArrayRef> {
    let strings: Vec<_> = arrays.iter().map(|a| a.as_string::<i32>()).collect();
    let mut keys = StringBuilder::new();
    let mut values = StringBuilder::new();
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0i32);
    let mut nulls = arrow::array::BooleanBufferBuilder::new(rows);
    let mut written = 0usize;
    for i in 0..rows {
        let arg = |n: usize, default: &'static str| match strings.get(n) {
            Some(a) if a.is_null(i) => None,
            Some(a) => Some(a.value(i)),
            None => Some(default),
        };
        let (Some(text), Some(list), Some(kv)) = (arg(0, ""), arg(1, ","), arg(2, "=")) else {
            nulls.append(false);
            offsets.push(i32::try_from(written).map_err(|_| overflow())?);
            continue;
        };
        nulls.append(true);
        let entries = parse_str_map(text, list, kv)?;
        for (k, v) in java_hash_map_order(entries) {
            keys.append_value(k);
            values.append_option(v);
            written += 1;
        }
        offsets.push(i32::try_from(written).map_err(|_| overflow())?);
    }
    let keys: ArrayRef = Arc::new(keys.finish());
    let values: ArrayRef = Arc::new(values.finish());
    let picks: Vec<(usize, usize)> = (0..written).map(|e| (0, e)).collect();
    let nulls = arrow::buffer::NullBuffer::new(nulls.finish());
    map_of(
        &[keys.as_ref()],
        &[values.as_ref()],
        &picks,
        &picks,
        offsets,
        Some(nulls),
    )
}

/// The entries of one `STR_TO_MAP` text, in the order Flink puts them
/// (a key given again keeps its place and takes the later value); the
/// expected size Flink sizes its `HashMap` with comes along.
fn parse_str_map<'a>(text: &'a str, list: &str, kv: &str) -> Result<StrMap<'a>> {
    let mut out = StrMap {
        entries: vec![],
        expected: 0,
    };
    if text.is_empty() {
        return Ok(out);
    }
    let (Some(list_re), Some(kv_re)) = (java_regex(list)?, java_regex(kv)?) else {
        return exec_err!("STR_TO_MAP: the delimiters '{list}' and '{kv}' must be valid regular expressions");
    };
    let parts = java_split(&list_re, text, 0);
    out.expected = parts.len();
    for part in parts {
        let kv = java_split(&kv_re, part, 2);
        let (k, v) = match kv.as_slice() {
            [k, v] => (*k, Some(*v)),
            _ => (part, None),
        };
        match out.entries.iter_mut().find(|(key, _)| *key == k) {
            Some(entry) => entry.1 = v,
            None => out.entries.push((k, v)),
        }
    }
    Ok(out)
}

struct StrMap<'a> {
    entries: Vec<(&'a str, Option<&'a str>)>,
    expected: usize,
}

/// Java's `String.split(regex, limit)`: no leading empty part for a
/// zero-width match at the start; with `limit` 0, trailing empty parts
/// dropped; with `limit` n > 0, at most n parts.
fn java_split<'a>(re: &regex::Regex, s: &'a str, limit: usize) -> Vec<&'a str> {
    let mut parts = vec![];
    let mut index = 0;
    for m in re.find_iter(s) {
        if limit > 0 && parts.len() == limit - 1 {
            break;
        }
        if m.end() == 0 {
            // A zero-width match at the start gives no leading part.
            continue;
        }
        parts.push(&s[index..m.start()]);
        index = m.end();
    }
    if index == 0 && parts.is_empty() {
        return vec![s];
    }
    parts.push(&s[index..]);
    if limit == 0 {
        while parts.last().is_some_and(|p| p.is_empty()) {
            parts.pop();
        }
    }
    parts
}

/// Java's `String.hashCode` (over UTF-16 code units).
fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The iteration order of a Java `HashMap` sized by Flink's
/// `CollectionUtil.newHashMapWithExpectedSize(expected)` after putting
/// `entries` in order: by hash bucket, then by insertion within one.
fn java_hash_map_order(map: StrMap<'_>) -> Vec<(&str, Option<&str>)> {
    let StrMap { mut entries, expected } = map;
    // computeRequiredCapacity, then HashMap's tableSizeFor; resizes as
    // entries exceed three quarters of the table (a resize keeps bucket
    // order, so only the final size matters).
    let wanted = if expected <= 2 {
        expected + 1
    } else {
        (expected * 4).div_ceil(3)
    };
    let mut capacity = wanted.max(1).next_power_of_two();
    while entries.len() > capacity * 3 / 4 {
        capacity *= 2;
    }
    let bucket = |k: &str| {
        let h = java_string_hash(k);
        let spread = h ^ ((h as u32) >> 16) as i32;
        (spread as u32 as usize) & (capacity - 1)
    };
    // A stable sort keeps insertion order within a bucket.
    entries.sort_by_key(|(k, _)| bucket(k));
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn str_to_map(text: &str, list: &str, kv: &str) -> String {
        let map = parse_str_map(text, list, kv).expect("parse");
        let entries: Vec<String> = java_hash_map_order(map)
            .into_iter()
            .map(|(k, v)| format!("{k}={}", v.unwrap_or("NULL")))
            .collect();
        format!("{{{}}}", entries.join(", "))
    }

    #[test]
    fn str_to_map_orders_entries_as_java_hash_map() {
        // Flink 2.3's answers.
        assert_eq!(str_to_map("k=v=w,x,a=1,a=2", ",", "="), "{x=NULL, a=2, k=v=w}");
        assert_eq!(
            str_to_map("  a,b,c;d=1&e=2  ", ",", "="),
            "{  a=NULL, c;d=1&e=2  , b=NULL}"
        );
        assert_eq!(str_to_map("Hello World", " ", "l"), "{He=lo, Wor=d}");
        assert_eq!(str_to_map("héllo wörld ß", " ", "l"), "{hé=lo, wör=d, ß=NULL}");
        assert_eq!(str_to_map("  a,b,c;d=1&e=2  ", " ", "l"), "{=NULL, a,b,c;d=1&e=2=NULL}");
        assert_eq!(str_to_map("a.1|b.2", "|", "."), "{=}");
        assert_eq!(str_to_map("", ",", "="), "{}");
        assert_eq!(str_to_map(",,", ",", "="), "{}");
    }

    #[test]
    fn java_split_rules() {
        let re = regex::Regex::new(",").expect("regex");
        assert_eq!(java_split(&re, "a,,b,,", 0), vec!["a", "", "b"]);
        assert_eq!(java_split(&re, ",a", 0), vec!["", "a"]);
        assert_eq!(java_split(&re, "a,b,c", 2), vec!["a", "b,c"]);
        let empty = regex::Regex::new("").expect("regex");
        assert_eq!(java_split(&empty, "ab", 0), vec!["a", "b"]);
    }
}
