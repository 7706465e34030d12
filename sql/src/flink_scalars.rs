//! Flink's scalar functions that DataFusion lacks or answers differently,
//! evaluated row by row over their arguments as text: string functions
//! (`SPLIT_INDEX`, `REGEXP_EXTRACT`, `REGEXP`, `TO_BASE64`, `HEX`, ...)
//! and the time functions that take Java patterns (`TO_TIMESTAMP`,
//! `TO_DATE`, `UNIX_TIMESTAMP`, `FROM_UNIXTIME`). Each one's answers are
//! Flink 2.3's on the conformance suite (`tests/functions/cases.txt`).
//! Times are UTC (`table.local-time-zone` is not supported yet).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Date32Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, TimeUnit};
use base64::Engine;
use chrono::{NaiveDate, NaiveDateTime};
use datafusion::common::{Result, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use crate::flink_functions::java_regex;

/// What a function computes from one row's arguments (as text, with the
/// arguments' types). `Ok(None)` is NULL.
#[derive(Debug, Clone, Copy)]
enum Eval {
    Text(fn(&[&str], &[DataType]) -> Result<Option<String>>),
    /// `.1`: the answer when an argument is NULL (Flink's `IS_DIGIT(NULL)`
    /// is FALSE).
    Bool(fn(&[&str]) -> Result<Option<bool>>, Option<bool>),
    Int(fn(&[&str]) -> Result<Option<i64>>),
    /// Milliseconds since the epoch, as `TIMESTAMP(3)`.
    Millis(fn(&[&str]) -> Result<Option<i64>>),
    /// Days since the epoch, as `DATE`.
    Days(fn(&[&str]) -> Result<Option<i32>>),
}

impl Eval {
    fn output(&self) -> DataType {
        match self {
            Eval::Text(_) => DataType::Utf8,
            Eval::Bool(..) => DataType::Boolean,
            Eval::Int(_) => DataType::Int64,
            Eval::Millis(_) => DataType::Timestamp(TimeUnit::Millisecond, None),
            Eval::Days(_) => DataType::Date32,
        }
    }
}

/// One of Flink's functions: its name, how many arguments it takes, and
/// what it computes. Its name says which (equality and hashing go by it).
#[derive(Debug)]
pub struct FlinkScalar {
    name: &'static str,
    arity: (usize, usize),
    eval: Eval,
    signature: Signature,
}

impl FlinkScalar {
    fn udf(name: &'static str, arity: (usize, usize), eval: Eval) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            name,
            arity,
            eval,
            signature: Signature::variadic_any(Volatility::Immutable),
        })
    }
}

/// Every function of this module, to register.
pub fn all() -> Vec<ScalarUDF> {
    vec![
        FlinkScalar::udf("split_index", (3, 3), Eval::Text(split_index)),
        FlinkScalar::udf("regexp_extract", (2, 3), Eval::Text(regexp_extract)),
        FlinkScalar::udf("regexp", (2, 2), Eval::Bool(regexp, None)),
        FlinkScalar::udf("to_base64", (1, 1), Eval::Text(to_base64)),
        FlinkScalar::udf("from_base64", (1, 1), Eval::Text(from_base64)),
        FlinkScalar::udf("hex", (1, 1), Eval::Text(hex)),
        FlinkScalar::udf("bin", (1, 1), Eval::Text(bin)),
        FlinkScalar::udf("is_digit", (1, 1), Eval::Bool(is_digit, Some(false))),
        FlinkScalar::udf("is_alpha", (1, 1), Eval::Bool(is_alpha, Some(false))),
        FlinkScalar::udf("to_timestamp", (1, 2), Eval::Millis(to_timestamp)),
        FlinkScalar::udf("to_date", (1, 2), Eval::Days(to_date)),
        FlinkScalar::udf("unix_timestamp", (1, 2), Eval::Int(unix_timestamp)),
        FlinkScalar::udf("from_unixtime", (1, 2), Eval::Text(from_unixtime)),
    ]
}

impl PartialEq for FlinkScalar {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for FlinkScalar {}

impl std::hash::Hash for FlinkScalar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl ScalarUDFImpl for FlinkScalar {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let (lo, hi) = self.arity;
        if arg_types.len() < lo || arg_types.len() > hi {
            let takes = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            return datafusion::common::plan_err!(
                "{} takes {takes} arguments, not {}",
                self.name.to_ascii_uppercase(),
                arg_types.len()
            );
        }
        Ok(self.eval.output())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let all_scalar = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let rows = if all_scalar { 1 } else { args.number_rows };
        let types: Vec<DataType> = args.args.iter().map(|a| a.data_type()).collect();
        let cols = args
            .args
            .iter()
            .map(|a| cast(&a.to_array(rows)?, &DataType::Utf8).map_err(Into::into))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let cols: Vec<&arrow::array::StringArray> = cols.iter().map(|c| c.as_string::<i32>()).collect();
        let name = self.name.to_ascii_uppercase();
        let fail = |e: DataFusionError| DataFusionError::Execution(format!("{name}: {e}"));
        let mut vals: Vec<&str> = Vec::with_capacity(cols.len());
        // The row's arguments, or `None` when one is NULL.
        macro_rules! row {
            ($i:expr) => {{
                vals.clear();
                if cols.iter().any(|c| c.is_null($i)) {
                    None
                } else {
                    vals.extend(cols.iter().map(|c| c.value($i)));
                    Some(vals.as_slice())
                }
            }};
        }
        let out: ArrayRef = match self.eval {
            Eval::Text(f) => {
                let mut b = StringBuilder::with_capacity(rows, rows * 8);
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => b.append_option(f(v, &types).map_err(fail)?),
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
            Eval::Bool(f, on_null) => {
                let mut b = BooleanBuilder::with_capacity(rows);
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => b.append_option(f(v).map_err(fail)?),
                        None => b.append_option(on_null),
                    }
                }
                Arc::new(b.finish())
            }
            Eval::Int(f) | Eval::Millis(f) => {
                let mut b = Int64Builder::with_capacity(rows);
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => b.append_option(f(v).map_err(fail)?),
                        None => b.append_null(),
                    }
                }
                let a = b.finish();
                if matches!(self.eval, Eval::Millis(_)) {
                    let mut t = TimestampMillisecondBuilder::with_capacity(rows);
                    t.extend(a.iter());
                    Arc::new(t.finish())
                } else {
                    Arc::new(a)
                }
            }
            Eval::Days(f) => {
                let mut b = Date32Builder::with_capacity(rows);
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => b.append_option(f(v).map_err(fail)?),
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
        };
        if all_scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
        } else {
            Ok(ColumnarValue::Array(out))
        }
    }
}

fn int(text: &str, what: &str) -> Result<i64> {
    text.trim()
        .parse::<i64>()
        .map_err(|_| DataFusionError::Execution(format!("{what} '{text}' is not an integer")))
}

/// `SPLIT_INDEX(s, sep, i)`: the `i`-th (from 0) piece of `s` split at
/// every `sep`, empty pieces kept; NULL when out of range or `s` is empty.
fn split_index(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let (s, sep, i) = (v[0], v[1], int(v[2], "the index")?);
    if s.is_empty() || sep.is_empty() || i < 0 {
        return Ok(None);
    }
    Ok(s.split(sep).nth(i as usize).map(str::to_string))
}

/// `REGEXP_EXTRACT(s, regex [, group])`: the group (0: the whole match,
/// the default) of the first match; NULL without a match.
fn regexp_extract(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let group = match v.get(2) {
        Some(g) => int(g, "the group")?,
        None => 0,
    };
    let Some(re) = java_regex(v[1])? else {
        return Ok(None);
    };
    if group < 0 {
        return Ok(None);
    }
    Ok(re
        .captures(v[0])
        .and_then(|c| c.get(group as usize))
        .map(|m| m.as_str().to_string()))
}

/// `REGEXP(s, regex)`: whether any part of `s` matches.
fn regexp(v: &[&str]) -> Result<Option<bool>> {
    Ok(java_regex(v[1])?.map(|re| re.is_match(v[0])))
}

fn to_base64(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    Ok(Some(base64::engine::general_purpose::STANDARD.encode(v[0].as_bytes())))
}

/// `FROM_BASE64(s)`: the decoded bytes as UTF-8 text; NULL when `s` is
/// not base64.
fn from_base64(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    Ok(base64::engine::general_purpose::STANDARD
        .decode(v[0].trim())
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned()))
}

fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

/// `HEX(x)`: an integer as Java's `Long.toHexString` (two's complement
/// for negatives), upper case; a string's UTF-8 bytes in hex.
fn hex(v: &[&str], types: &[DataType]) -> Result<Option<String>> {
    if types.first().is_some_and(is_integer) {
        return Ok(Some(format!("{:X}", int(v[0], "HEX's argument")?)));
    }
    Ok(Some(v[0].bytes().map(|b| format!("{b:02X}")).collect()))
}

/// `BIN(n)`: an integer as Java's `Long.toBinaryString`.
fn bin(v: &[&str], types: &[DataType]) -> Result<Option<String>> {
    if !types.first().is_some_and(is_integer) {
        return Err(DataFusionError::Plan("BIN takes an integer".into()));
    }
    Ok(Some(format!("{:b}", int(v[0], "BIN's argument")?)))
}

/// `IS_DIGIT(s)`: `s` is not empty and only ASCII digits.
fn is_digit(v: &[&str]) -> Result<Option<bool>> {
    Ok(Some(!v[0].is_empty() && v[0].chars().all(|c| c.is_ascii_digit())))
}

/// `IS_ALPHA(s)`: `s` is not empty and only letters.
fn is_alpha(v: &[&str]) -> Result<Option<bool>> {
    Ok(Some(!v[0].is_empty() && v[0].chars().all(char::is_alphabetic)))
}

const DEFAULT_TIME_PATTERN: &str = "yyyy-MM-dd HH:mm:ss";

/// Parses `text` with a Java pattern (Flink's default when `None`): a
/// pattern without a time of day gives midnight. `None` when it does not
/// parse (Flink's functions give NULL).
fn parse_time(text: &str, pattern: Option<&str>) -> Result<Option<NaiveDateTime>> {
    let text = text.trim();
    let Some(pattern) = pattern else {
        // Flink's default reads `yyyy-MM-dd HH:mm:ss` with optional
        // fraction, and a date alone.
        for layout in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
            if let Ok(t) = NaiveDateTime::parse_from_str(text, layout) {
                return Ok(Some(t));
            }
        }
        return Ok(NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .ok()
            .and_then(|d| d.and_hms_opt(0, 0, 0)));
    };
    let layout = weir_engine::time_format::java_to_chrono(pattern).map_err(DataFusionError::Plan)?;
    if let Ok(t) = NaiveDateTime::parse_from_str(text, &layout) {
        return Ok(Some(t));
    }
    Ok(NaiveDate::parse_from_str(text, &layout)
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0)))
}

/// `TO_TIMESTAMP(s [, pattern])`: `TIMESTAMP(3)`.
fn to_timestamp(v: &[&str]) -> Result<Option<i64>> {
    Ok(parse_time(v[0], v.get(1).copied())?.map(|t| t.and_utc().timestamp_millis()))
}

/// `TO_DATE(s [, pattern])` (default `yyyy-MM-dd`).
fn to_date(v: &[&str]) -> Result<Option<i32>> {
    let pattern = v.get(1).copied().unwrap_or("yyyy-MM-dd");
    Ok(parse_time(v[0], Some(pattern))?.map(|t| {
        let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
        (t.date() - epoch).num_days() as i32
    }))
}

/// `UNIX_TIMESTAMP(s [, pattern])`: seconds since the epoch (UTC); NULL
/// when `s` does not parse.
fn unix_timestamp(v: &[&str]) -> Result<Option<i64>> {
    let pattern = v.get(1).copied().unwrap_or(DEFAULT_TIME_PATTERN);
    Ok(parse_time(v[0], Some(pattern))?.map(|t| t.and_utc().timestamp()))
}

/// `FROM_UNIXTIME(n [, pattern])`: seconds since the epoch as text
/// (default `yyyy-MM-dd HH:mm:ss`, UTC).
fn from_unixtime(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let secs = int(v[0], "the seconds")?;
    let pattern = v.get(1).copied().unwrap_or(DEFAULT_TIME_PATTERN);
    let layout = weir_engine::time_format::java_to_chrono(pattern).map_err(DataFusionError::Plan)?;
    Ok(chrono::DateTime::from_timestamp(secs, 0).map(|t| t.naive_utc().format(&layout).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_index_keeps_empty_pieces() {
        let t = |s: &str, i: &str| split_index(&[s, " ", i], &[]).expect("split");
        assert_eq!(t("  a b", "2").as_deref(), Some("a"));
        assert_eq!(t("  a b", "0").as_deref(), Some(""));
        assert_eq!(t("a", "1"), None);
        assert_eq!(t("", "0"), None);
    }

    #[test]
    fn hex_and_bin_of_negatives_are_twos_complement() {
        assert_eq!(
            hex(&["-7"], &[DataType::Int32]).expect("hex").as_deref(),
            Some("FFFFFFFFFFFFFFF9")
        );
        assert_eq!(hex(&["Hi"], &[DataType::Utf8]).expect("hex").as_deref(), Some("4869"));
        assert_eq!(bin(&["7"], &[DataType::Int64]).expect("bin").as_deref(), Some("111"));
    }

    #[test]
    fn times_parse_with_java_patterns() {
        assert_eq!(
            to_timestamp(&["02/01/2024", "dd/MM/yyyy"]).expect("parse"),
            Some(1_704_153_600_000)
        );
        assert_eq!(
            unix_timestamp(&["2024-01-02 03:04:05"]).expect("parse"),
            Some(1_704_164_645)
        );
        assert_eq!(unix_timestamp(&["nonsense"]).expect("parse"), None);
        assert_eq!(
            from_unixtime(&["700000"], &[]).expect("format").as_deref(),
            Some("1970-01-09 02:26:40")
        );
    }
}
