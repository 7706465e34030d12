//! Flink's scalar functions that DataFusion lacks or answers differently,
//! evaluated row by row over their arguments as text (NULL in any gives
//! NULL): string functions (`CONCAT`, `REGEXP_REPLACE`, `SUBSTRING`,
//! `INITCAP`, `SPLIT_INDEX`, `REGEXP_EXTRACT`, `REGEXP`, `TO_BASE64`, `HEX`,
//! ...)
//! and the time functions that take Java patterns (`TO_TIMESTAMP`,
//! `TO_DATE`, `UNIX_TIMESTAMP`, `FROM_UNIXTIME`). Each one's answers are
//! Flink 2.3's on the conformance suite (`tests/functions/cases.txt`).
//! Times are UTC here; `flink_zone` converts what `UNIX_TIMESTAMP` and
//! `FROM_UNIXTIME` see in a session with another `table.local-time-zone`.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Date32Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef, TimeUnit};
use base64::Engine;
use chrono::{NaiveDate, NaiveDateTime};
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use crate::functions::json;

/// A text function of arguments that may be NULL, with their types.
type NullableTextFn = fn(&[Option<&str>], &[DataType]) -> Result<Option<String>>;

/// What a function computes from one row's arguments (as text, with the
/// arguments' types). `Ok(None)` is NULL.
#[derive(Debug, Clone, Copy)]
enum Eval {
    Text(fn(&[&str], &[DataType]) -> Result<Option<String>>),
    /// `.1`: the answer when an argument is NULL (Flink's `IS_DIGIT(NULL)`
    /// is FALSE).
    Bool(fn(&[&str]) -> Result<Option<bool>>, Option<bool>),
    Int(fn(&[&str]) -> Result<Option<i64>>),
    /// An `INT`.
    Int32(fn(&[&str]) -> Result<Option<i32>>),
    /// Text from arguments that may be NULL (`ELT` picks one argument: a
    /// NULL elsewhere does not matter).
    NullableText(NullableTextFn),
    /// Milliseconds since the epoch, as `TIMESTAMP(3)`.
    Millis(fn(&[&str]) -> Result<Option<i64>>),
    /// Milliseconds since the epoch, as `TIMESTAMP_LTZ(3)`, from arguments
    /// whose types matter (a number or a string).
    MillisLtz(fn(&[&str], &[DataType]) -> Result<Option<i64>>),
    /// Days since the epoch, as `DATE`.
    Days(fn(&[&str]) -> Result<Option<i32>>),
    /// JSON text that the JSON constructors insert as JSON, not as a
    /// string: typed `LargeUtf8`, which no Flink type maps to.
    Json(fn(&[&str], &[DataType]) -> Result<Option<String>>),
    /// An `ARRAY<STRING>` (elements may be NULL).
    Strings(StringsFn),
}

type StringsFn = fn(&[&str], &[DataType]) -> Result<Option<Vec<Option<String>>>>;

impl Eval {
    fn output(&self) -> DataType {
        match self {
            Eval::Text(_) | Eval::NullableText(_) => DataType::Utf8,
            Eval::Int32(_) => DataType::Int32,
            Eval::Bool(..) => DataType::Boolean,
            Eval::Int(_) => DataType::Int64,
            Eval::Millis(_) => DataType::Timestamp(TimeUnit::Millisecond, None),
            Eval::MillisLtz(_) => DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            Eval::Days(_) => DataType::Date32,
            Eval::Json(_) => DataType::LargeUtf8,
            Eval::Strings(_) => DataType::new_list(DataType::Utf8, true),
        }
    }
}

/// One of Flink's functions: its name, how many arguments it takes, and
/// what it computes. Its name says which (equality and hashing go by it).
pub struct FlinkScalar {
    name: &'static str,
    arity: (usize, usize),
    eval: Eval,
    signature: Signature,
}

/// The type alone: the name (shown beside it wherever it is shown) says
/// everything else, and `eval` holds function pointers, whose addresses
/// differ from run to run, while operator uids describe a function by
/// its name, arguments and debug text (`uid::function_parameters`).
impl std::fmt::Debug for FlinkScalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlinkScalar")
    }
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
        FlinkScalar::udf("concat", (1, 254), Eval::Text(concat)),
        FlinkScalar::udf("initcap", (1, 1), Eval::Text(initcap)),
        FlinkScalar::udf("regexp_replace", (3, 3), Eval::Text(regexp_replace)),
        substr(),
        FlinkScalar::udf("substring", (2, 3), Eval::Text(substring_of)),
        FlinkScalar::udf("split_index", (3, 3), Eval::Text(split_index)),
        FlinkScalar::udf("overlay", (3, 4), Eval::Text(overlay)),
        FlinkScalar::udf("regexp_extract", (2, 3), Eval::Text(regexp_extract)),
        FlinkScalar::udf("regexp_extract_all", (2, 3), Eval::Strings(regexp_extract_all)),
        FlinkScalar::udf("split", (2, 2), Eval::Strings(split)),
        FlinkScalar::udf("regexp", (2, 2), Eval::Bool(regexp, None)),
        FlinkScalar::udf("from_base64", (1, 1), Eval::Text(from_base64)),
        FlinkScalar::udf("hex", (1, 1), Eval::Text(hex)),
        FlinkScalar::udf("bin", (1, 1), Eval::Text(bin)),
        FlinkScalar::udf("chr", (1, 1), Eval::Text(chr)),
        FlinkScalar::udf("is_digit", (1, 1), Eval::Bool(is_digit, Some(false))),
        FlinkScalar::udf("is_alpha", (1, 1), Eval::Bool(is_alpha, Some(false))),
        FlinkScalar::udf("to_timestamp", (1, 2), Eval::Millis(to_timestamp)),
        FlinkScalar::udf("to_date", (1, 2), Eval::Days(to_date)),
        FlinkScalar::udf("to_timestamp_ltz", (1, 3), Eval::MillisLtz(to_timestamp_ltz)),
        FlinkScalar::udf("unix_timestamp", (1, 2), Eval::Int(unix_timestamp)),
        FlinkScalar::udf("from_unixtime", (1, 2), Eval::Text(from_unixtime)),
        FlinkScalar::udf("convert_tz", (3, 3), Eval::Text(convert_tz)),
        FlinkScalar::udf("locate", (2, 3), Eval::Int32(locate)),
        FlinkScalar::udf("elt", (2, 255), Eval::NullableText(elt)),
        FlinkScalar::udf("parse_url", (2, 3), Eval::Text(parse_url)),
        FlinkScalar::udf("sha1", (1, 1), Eval::Text(sha1_hex)),
        FlinkScalar::udf("regexp_count", (2, 2), Eval::Int32(regexp_count)),
        FlinkScalar::udf("regexp_instr", (2, 2), Eval::Int32(regexp_instr)),
        FlinkScalar::udf("regexp_substr", (2, 2), Eval::Text(regexp_substr)),
        FlinkScalar::udf("url_encode", (1, 1), Eval::Text(url_encode)),
        FlinkScalar::udf("url_decode", (1, 1), Eval::Text(url_decode)),
        FlinkScalar::udf("is_decimal", (1, 1), Eval::Bool(is_decimal, Some(false))),
        FlinkScalar::udf("json_value", (2, 2), Eval::Text(json::json_value)),
        FlinkScalar::udf(
            crate::udf::JSON_VALUE_ON_ERROR_FN,
            (4, 4),
            Eval::NullableText(json::json_value_on_error),
        ),
        FlinkScalar::udf("json_query", (2, 2), Eval::Text(json::json_query)),
        FlinkScalar::udf("json_exists", (2, 2), Eval::Bool(json::json_exists, None)),
        FlinkScalar::udf("json_string", (1, 1), Eval::Text(json::json_string)),
        FlinkScalar::udf(json::ELEMENT_NULLS_FN, (1, 1), Eval::NullableText(json::element_nulls)),
        FlinkScalar::udf("json_array", (0, 255), Eval::NullableText(json::json_array)),
        FlinkScalar::udf(
            crate::functions::names::JSON_ARRAY_NULLS,
            (0, 255),
            Eval::NullableText(json::json_array_nulls),
        ),
        FlinkScalar::udf(
            crate::functions::names::JSON_OBJECT,
            (0, 254),
            Eval::NullableText(json::json_object),
        ),
        FlinkScalar::udf(
            crate::functions::names::JSON_OBJECT_ABSENT,
            (0, 254),
            Eval::NullableText(json::json_object_absent),
        ),
        FlinkScalar::udf(
            crate::functions::names::IS_JSON,
            (1, 2),
            Eval::Bool(json::is_json, Some(false)),
        ),
        FlinkScalar::udf(json::RAW_FN, (1, 1), Eval::Json(json::raw)),
        FlinkScalar::udf(FIT_TEXT_FN, (3, 3), Eval::Text(fit_text)),
        FlinkScalar::udf(json::MEMBER_FN, (2, 2), Eval::NullableText(json::member)),
        FlinkScalar::udf(json::MEMBER_ABSENT_FN, (2, 2), Eval::NullableText(json::member_absent)),
        FlinkScalar::udf(json::OBJECTAGG_FN, (1, 1), Eval::NullableText(json::objectagg)),
    ]
}

/// `CAST(x AS VARCHAR(n) | CHAR(n))` of a text (`functions::cast_to_length`
/// writes the call): `(text, n, pad)`.
pub use crate::functions::names::FIT_TEXT_FN;

/// [`FIT_TEXT_FN`]: the text cut to `n` characters; padded with spaces to
/// `n` when `pad` (a CHAR).
fn fit_text(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let n = usize::try_from(int(v[1], "the length")?).unwrap_or(0);
    let mut out: String = v[0].chars().take(n).collect();
    if v[2] == "true" {
        let have = out.chars().count();
        out.extend(std::iter::repeat_n(' ', n - have));
    }
    Ok(Some(out))
}

/// Flink's `SUBSTR` (the planner also puts it in place of DataFusion's for
/// `SUBSTRING(s FROM p FOR n)`).
pub fn substr() -> ScalarUDF {
    FlinkScalar::udf("substr", (2, 3), Eval::Text(substring_of))
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
        if self.name == json::MEMBER_FN || self.name == json::MEMBER_ABSENT_FN {
            json::check_member(arg_types)?;
        }
        Ok(self.eval.output())
    }

    fn return_field_from_args(&self, args: datafusion::logical_expr::ReturnFieldArgs) -> Result<FieldRef> {
        // Flink refuses a JSON_OBJECT key that may be NULL when it plans
        // the call ("Argument to function 'k' must not be NULL").
        if self.name == crate::functions::names::JSON_OBJECT || self.name == crate::functions::names::JSON_OBJECT_ABSENT
        {
            for key in args.arg_fields.iter().step_by(2) {
                if key.is_nullable() {
                    return datafusion::common::plan_err!(
                        "JSON_OBJECT: the key {} may be NULL, and a key must not be (as in Flink); give it a \
                         default with COALESCE",
                        key.name()
                    );
                }
            }
        }
        let types: Vec<DataType> = args.arg_fields.iter().map(|f| f.data_type().clone()).collect();
        Ok(Arc::new(arrow::datatypes::Field::new(
            self.name,
            self.return_type(&types)?,
            true,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let mut types: Vec<DataType> = args.args.iter().map(|a| a.data_type()).collect();
        // The JSON functions take an ARRAY, MAP or ROW as JSON (Flink
        // writes `[1,2]`, `{"a":1}`): its JSON text, typed as JSON.
        let json_fn = self.name.starts_with("json_") || self.name.starts_with(crate::functions::names::JSON_PREFIX);
        let cols = args
            .args
            .iter()
            .zip(types.iter_mut())
            .map(|(a, t)| {
                let a = a.to_array(rows)?;
                if json_fn && json::is_nested(t) {
                    *t = DataType::LargeUtf8;
                    return cast(&json::nested_json(&a)?, &DataType::Utf8).map_err(Into::into);
                }
                cast(&a, &DataType::Utf8).map_err(Into::into)
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let cols: Vec<&arrow::array::StringArray> = cols.iter().map(|c| c.as_string::<i32>()).collect();
        // Internal functions (`__weir_...`) stand for a Flink call whose
        // name the message already gives.
        let name = match self.name.strip_prefix(crate::functions::names::PREFIX) {
            Some(_) => String::new(),
            None => format!("{}: ", self.name.to_ascii_uppercase()),
        };
        let fail = |e: DataFusionError| match e {
            DataFusionError::Execution(why) => DataFusionError::Execution(format!("{name}{why}")),
            other => DataFusionError::Execution(format!("{name}{other}")),
        };
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
            Eval::Strings(f) => {
                let mut b = arrow::array::ListBuilder::new(StringBuilder::new());
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => match f(v, &types).map_err(fail)? {
                            Some(items) => {
                                b.values().extend(items);
                                b.append(true);
                            }
                            None => b.append(false),
                        },
                        None => b.append(false),
                    }
                }
                Arc::new(b.finish())
            }
            Eval::Json(f) => {
                let mut b = arrow::array::LargeStringBuilder::with_capacity(rows, rows * 8);
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => b.append_option(f(v, &types).map_err(fail)?),
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
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
            Eval::MillisLtz(f) => {
                let mut t = TimestampMillisecondBuilder::with_capacity(rows).with_timezone("UTC");
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => t.append_option(f(v, &types).map_err(fail)?),
                        None => t.append_null(),
                    }
                }
                Arc::new(t.finish())
            }
            Eval::Int32(f) => {
                let mut b = arrow::array::Int32Builder::with_capacity(rows);
                for i in 0..rows {
                    match row!(i) {
                        Some(v) => b.append_option(f(v).map_err(fail)?),
                        None => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
            Eval::NullableText(f) => {
                let mut b = StringBuilder::with_capacity(rows, rows * 8);
                let mut args: Vec<Option<&str>> = Vec::with_capacity(cols.len());
                for i in 0..rows {
                    args.clear();
                    args.extend(cols.iter().map(|c| c.is_valid(i).then(|| c.value(i))));
                    b.append_option(f(&args, &types).map_err(fail)?);
                }
                Arc::new(b.finish())
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
        crate::udf::columnar(out, all_scalar)
    }
}

/// `CONCAT(a, b, ...)`: NULL when any argument is NULL (DataFusion's
/// skips NULLs).
fn concat(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    Ok(Some(v.concat()))
}

/// `INITCAP(s)`: Calcite's `SqlFunctions.initcap`, which Flink calls: a
/// word is a run of ASCII letters and digits; its first letter is made
/// upper case and the rest lower case, and every other character is left
/// as it is and ends the word (so `héllo` is `HéLlo` and `ünïcödé` is
/// `üNïCöDé`, as Flink 2.3 writes them).
fn initcap(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let [s] = v else {
        return datafusion::common::exec_err!("takes one argument");
    };
    let mut out = String::with_capacity(s.len());
    let mut start = true;
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(if start {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            });
            start = false;
        } else {
            out.push(c);
            start = true;
        }
    }
    Ok(Some(out))
}

/// `REGEXP_REPLACE(s, regex, replacement)`: every match replaced
/// (DataFusion's replaces the first unless given `'g'`), the replacement
/// taken literally (`$1` is not a group), the regex read as Java reads it
/// (`\w`, `\d`, `\s`, `\b` are ASCII). An invalid regex gives NULL, as
/// Flink.
fn regexp_replace(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let [s, pattern, replacement] = v else {
        return datafusion::common::exec_err!("takes a string, a regex and a replacement");
    };
    let Some(re) = java_regex(pattern)? else {
        return Ok(None);
    };
    Ok(Some(re.replace_all(s, regex::NoExpand(replacement)).into_owned()))
}

thread_local! {
    static REGEX_CACHE: std::cell::RefCell<hashbrown::HashMap<String, Option<regex::Regex>>> =
        Default::default();
}

/// A Java regular expression as Rust's `regex` (cached per thread):
/// `None` when it is not valid (Flink's functions then give NULL); an
/// error for valid Java that Rust's engine cannot run.
pub fn java_regex(pattern: &str) -> Result<Option<regex::Regex>> {
    if let Some(hit) = REGEX_CACHE.with(|c| c.borrow().get(pattern).cloned()) {
        return Ok(hit);
    }
    for unsupported in ["(?=", "(?!", "(?<=", "(?<!", "(?>", "*+", "++", "?+"] {
        if pattern.contains(unsupported) {
            return datafusion::common::exec_err!(
                "the regex '{pattern}' uses '{unsupported}' (look-around, atomic or possessive), which Weir cannot run"
            );
        }
    }
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('w') => out.push_str("[0-9A-Za-z_]"),
            Some('W') => out.push_str("[^0-9A-Za-z_]"),
            Some('d') => out.push_str("[0-9]"),
            Some('D') => out.push_str("[^0-9]"),
            Some('s') => out.push_str("[\\t\\n\\x0B\\f\\r ]"),
            Some('S') => out.push_str("[^\\t\\n\\x0B\\f\\r ]"),
            Some('b') => out.push_str("(?-u:\\b)"),
            Some('B') => out.push_str("(?-u:\\B)"),
            Some(d @ '1'..='9') => {
                return datafusion::common::exec_err!(
                    "the regex '{pattern}' uses the back-reference \\{d}, which Weir cannot run"
                );
            }
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    let re = regex::Regex::new(&out).ok();
    REGEX_CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() > 256 {
            c.clear();
        }
        c.insert(pattern.to_string(), re.clone());
    });
    Ok(re)
}

/// `SUBSTRING(s, start [, length])` / `SUBSTR`: 1-based; a negative start
/// counts from the end (`-3`: the last three characters); a start before
/// the first character or past the end gives `''`.
fn substring_of(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let (s, pos, len) = match v {
        [s, pos] => (*s, *pos, None),
        [s, pos, len] => (*s, *pos, Some(*len)),
        _ => return datafusion::common::exec_err!("takes a string, a start and an optional length"),
    };
    let number = |t: &str| {
        t.parse::<i64>()
            .map_err(|_| datafusion::error::DataFusionError::Execution(format!("'{t}' is not an integer")))
    };
    let pos = number(pos)?;
    let len = len.map(number).transpose()?;
    if len.is_some_and(|l| l < 0) {
        return Ok(None);
    }
    let chars = s.chars().count() as i64;
    let start = match pos {
        p if p > 0 => p - 1,
        p if p < 0 => chars + p,
        _ => 0,
    };
    if start < 0 || start >= chars {
        return Ok(Some(String::new()));
    }
    let end = len.map_or(chars, |l| (start + l).min(chars));
    Ok(Some(
        s.chars().skip(start as usize).take((end - start) as usize).collect(),
    ))
}

fn int(text: &str, what: &str) -> Result<i64> {
    text.trim()
        .parse::<i64>()
        .map_err(|_| DataFusionError::Execution(format!("{what} '{text}' is not an integer")))
}

/// Plans `OVERLAY(s PLACING r FROM start [FOR length])` as Weir's
/// `overlay` ([`overlay`]), where DataFusion's planner would take its own.
#[derive(Debug)]
pub struct FlinkOverlay;

impl datafusion::logical_expr::planner::ExprPlanner for FlinkOverlay {
    fn plan_overlay(
        &self,
        args: Vec<datafusion::logical_expr::Expr>,
    ) -> Result<datafusion::logical_expr::planner::PlannerResult<Vec<datafusion::logical_expr::Expr>>> {
        let udf = Arc::new(FlinkScalar::udf("overlay", (3, 4), Eval::Text(overlay)));
        Ok(datafusion::logical_expr::planner::PlannerResult::Planned(
            datafusion::logical_expr::Expr::ScalarFunction(datafusion::logical_expr::expr::ScalarFunction::new_udf(
                udf, args,
            )),
        ))
    }
}

/// `OVERLAY(s PLACING r FROM start [FOR length])` as Flink 2.3 answers it
/// (measured; DataFusion's differs at the edges): `s` unchanged when
/// `start` is not one of its characters (`OVERLAY('' PLACING 'XX' FROM 1)`
/// is ''); `r` ends the text when the replaced part reaches the end of `s`
/// or `length` (default: `r`'s) is not positive; else the text after the
/// replaced part follows.
fn overlay(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let (s, r) = (v[0], v[1]);
    let start = int(v[2], "the start position")?;
    let n = s.chars().count() as i64;
    if start < 1 || start > n {
        return Ok(Some(s.to_string()));
    }
    let length = match v.get(3) {
        Some(l) => int(l, "the length")?,
        None => r.chars().count() as i64,
    };
    let mut out: String = s.chars().take((start - 1) as usize).collect();
    out.push_str(r);
    let end = (start - 1).saturating_add(length);
    if length > 0 && end < n {
        out.extend(s.chars().skip(end as usize));
    }
    Ok(Some(out))
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

/// `REGEXP_EXTRACT_ALL(s, regex[, group])`: group `group` (1 by default,
/// 0 the whole match) of every match, NULL where the group took no part;
/// NULL for an invalid regex or a group the regex does not have.
fn regexp_extract_all(v: &[&str], _: &[DataType]) -> Result<Option<Vec<Option<String>>>> {
    let group = match v.get(2) {
        Some(g) => int(g, "the group")?,
        None => 1,
    };
    let Some(re) = java_regex(v[1])? else {
        return Ok(None);
    };
    let Some(group) = usize::try_from(group).ok().filter(|g| *g < re.captures_len()) else {
        return Ok(None);
    };
    Ok(Some(
        re.captures_iter(v[0])
            .map(|c| c.get(group).map(|m| m.as_str().to_string()))
            .collect(),
    ))
}

/// `SPLIT(s, delimiter)`: the parts between delimiters, empty ones too
/// (`'a,,b,'` is `[a, , b, ]`); every character for an empty delimiter;
/// no part of an empty string.
fn split(v: &[&str], _: &[DataType]) -> Result<Option<Vec<Option<String>>>> {
    let [s, delimiter] = v else {
        return datafusion::common::exec_err!("takes two arguments");
    };
    if s.is_empty() {
        return Ok(Some(vec![]));
    }
    if delimiter.is_empty() {
        return Ok(Some(s.chars().map(|c| Some(c.to_string())).collect()));
    }
    Ok(Some(s.split(delimiter).map(|p| Some(p.to_string())).collect()))
}

/// `REGEXP_COUNT(s, regex)`: how many times the regex matches (NULL for
/// an invalid regex).
fn regexp_count(v: &[&str]) -> Result<Option<i32>> {
    Ok(java_regex(v[1])?.map(|re| i32::try_from(re.find_iter(v[0]).count()).unwrap_or(i32::MAX)))
}

/// `REGEXP_INSTR(s, regex)`: the 1-based character position of the first
/// match, 0 when none.
fn regexp_instr(v: &[&str]) -> Result<Option<i32>> {
    Ok(java_regex(v[1])?.map(|re| {
        re.find(v[0]).map_or(0, |m| {
            i32::try_from(v[0][..m.start()].chars().count() + 1).unwrap_or(i32::MAX)
        })
    }))
}

/// `REGEXP_SUBSTR(s, regex)`: the first match, NULL when none.
fn regexp_substr(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    Ok(java_regex(v[1])?.and_then(|re| re.find(v[0]).map(|m| m.as_str().to_string())))
}

/// `URL_ENCODE(s)`: Java's `URLEncoder.encode(s, UTF-8)`: letters, digits
/// and `.-*_` kept, a space as `+`, every other byte `%XX`.
fn url_encode(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let mut out = String::with_capacity(v[0].len());
    for b in v[0].bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'*' | b'_' => out.push(char::from(b)),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    Ok(Some(out))
}

/// `URL_DECODE(s)`: Java's `URLDecoder.decode(s, UTF-8)`: `+` is a space,
/// `%XX` a byte; NULL when an escape is malformed (Java throws, Flink
/// answers NULL).
fn url_decode(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let s = v[0].as_bytes();
    let mut bytes = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => bytes.push(b),
                    None => return Ok(None),
                }
                i += 2;
            }
            c => bytes.push(c),
        }
        i += 1;
    }
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// `IS_DECIMAL(s)`: whether Java's `Double.parseDouble` reads `s`, as
/// Flink tests it: surrounding blanks trimmed, an exponent and a trailing
/// `d`/`f` allowed (`' 1'`, `'1e3'`, `'.5'`, `'5.'`, `'NaN'`).
fn is_decimal(v: &[&str]) -> Result<Option<bool>> {
    // Java's trim: every character up to the space.
    let s = v[0].trim_matches(|c: char| c <= ' ');
    let s = s.strip_suffix(['d', 'D', 'f', 'F']).unwrap_or(s);
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if body == "NaN" || body == "Infinity" {
        return Ok(Some(true));
    }
    // Rust also reads `inf` and `nan`, which Java does not.
    let java_chars = body
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    Ok(Some(
        java_chars && body.bytes().any(|b| b.is_ascii_digit()) && s.parse::<f64>().is_ok(),
    ))
}

/// `REGEXP(s, regex)`: whether any part of `s` matches.
fn regexp(v: &[&str]) -> Result<Option<bool>> {
    Ok(java_regex(v[1])?.map(|re| re.is_match(v[0])))
}

/// `FROM_BASE64(s)`: the decoded bytes as UTF-8 text; NULL when `s` is
/// not base64.
fn from_base64(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    Ok(base64::engine::general_purpose::STANDARD
        .decode(v[0].trim())
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// `LOCATE(needle, s[, from])`: the 1-based position of `needle` in `s`
/// at or after character `from` (below 1 reads as 1), 0 when absent; an
/// empty `needle` is at 1 (Flink's answers).
fn locate(v: &[&str]) -> Result<Option<i32>> {
    let (needle, s) = (v[0], v[1]);
    if needle.is_empty() {
        return Ok(Some(1));
    }
    let from = match v.get(2) {
        Some(f) => int(f, "the start position")?.max(1),
        None => 1,
    };
    let Some((skip, _)) = s.char_indices().nth(usize::try_from(from - 1).unwrap_or(usize::MAX)) else {
        return Ok(Some(0));
    };
    Ok(Some(match s[skip..].find(needle) {
        Some(at) => i32::try_from(s[..skip + at].chars().count() + 1).unwrap_or(i32::MAX),
        None => 0,
    }))
}

/// `ELT(n, a, b, ...)`: the n-th of the values (1-based), NULL when `n`
/// is NULL or out of range.
fn elt(v: &[Option<&str>], _: &[DataType]) -> Result<Option<String>> {
    let Some(n) = v[0] else {
        return Ok(None);
    };
    let n = int(n, "the index")?;
    Ok(usize::try_from(n)
        .ok()
        .filter(|n| *n >= 1)
        .and_then(|n| v.get(n).copied().flatten())
        .map(str::to_string))
}

/// `PARSE_URL(url, part[, key])`: a part of the URL as Java's `java.net.URL`
/// splits it (`HOST`, `PATH`, `QUERY`, `REF`, `PROTOCOL`, `FILE`,
/// `AUTHORITY`, `USERINFO`), or the value of `key` in the query; NULL when
/// the URL has no known protocol or the part is absent.
fn parse_url(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let Some(url) = JavaUrl::parse(v[0]) else {
        return Ok(None);
    };
    let part = v[1].to_ascii_uppercase();
    if let Some(key) = v.get(2) {
        if part != "QUERY" {
            return Ok(None);
        }
        return Ok(url.query.and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix(*key).and_then(|rest| rest.strip_prefix('=')))
                .map(str::to_string)
        }));
    }
    let host = || {
        let hp = url.authority?.rsplit_once('@').map_or(url.authority?, |(_, h)| h);
        // `[::1]:80` keeps its brackets; a port goes.
        Some(match hp.rfind(':') {
            Some(i) if !hp[i..].contains(']') => &hp[..i],
            _ => hp,
        })
    };
    Ok(match part.as_str() {
        "HOST" => host(),
        "PATH" => Some(url.path),
        "QUERY" => url.query,
        "REF" => url.fragment,
        "PROTOCOL" => Some(url.protocol),
        "FILE" => {
            return Ok(Some(match url.query {
                Some(q) => format!("{}?{q}", url.path),
                None => url.path.to_string(),
            }));
        }
        "AUTHORITY" => url.authority,
        "USERINFO" => url.authority.and_then(|a| a.rsplit_once('@')).map(|(u, _)| u),
        _ => None,
    }
    .map(str::to_string))
}

/// A URL split as `java.net.URL` splits it.
struct JavaUrl<'a> {
    protocol: &'a str,
    authority: Option<&'a str>,
    path: &'a str,
    query: Option<&'a str>,
    fragment: Option<&'a str>,
}

impl<'a> JavaUrl<'a> {
    fn parse(url: &'a str) -> Option<Self> {
        let url = url.trim();
        let (protocol, rest) = url.split_once(':')?;
        // java.net.URL knows these handlers; any other is malformed.
        if !["http", "https", "ftp", "file", "jar"].contains(&protocol.to_ascii_lowercase().as_str()) {
            return None;
        }
        let (rest, fragment) = match rest.split_once('#') {
            Some((r, f)) => (r, Some(f)),
            None => (rest, None),
        };
        let (rest, authority) = match rest.strip_prefix("//") {
            Some(r) => {
                let end = r.find(['/', '?']).unwrap_or(r.len());
                (&r[end..], Some(&r[..end]))
            }
            None => (rest, None),
        };
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        Some(JavaUrl {
            protocol,
            authority,
            path,
            query,
            fragment,
        })
    }
}

/// `SHA1(s)`: the hex SHA-1 of `s`'s UTF-8 bytes.
fn sha1_hex(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    use sha1::Digest;
    let digest = sha1::Sha1::digest(v[0].as_bytes());
    Ok(Some(digest.iter().map(|b| format!("{b:02x}")).collect()))
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

/// `CHR(n)`: the character of `n`'s low byte (`CHR(321)` is `A`, 256 is
/// U+0000), `''` for a negative `n` (Flink's `SqlFunctionUtils.chr`).
fn chr(v: &[&str], types: &[DataType]) -> Result<Option<String>> {
    if !types.first().is_some_and(is_integer) {
        return Err(DataFusionError::Plan("CHR takes an integer".into()));
    }
    let n = int(v[0], "CHR's argument")?;
    if n < 0 {
        return Ok(Some(String::new()));
    }
    Ok(Some(char::from((n & 0xFF) as u8).to_string()))
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

/// `TO_TIMESTAMP_LTZ(n [, precision])`: epoch seconds (precision 0) or
/// milliseconds (3, the default) as a `TIMESTAMP_LTZ(3)`, a fraction of a
/// millisecond cut off as Java's `(long)` cast does; NULL out of range.
/// `TO_TIMESTAMP_LTZ(s [, pattern [, zone]])`: a time string (Flink's
/// `TO_TIMESTAMP` patterns) read in `zone` (UTC when none is given, in
/// every session zone, as Flink).
fn to_timestamp_ltz(v: &[&str], types: &[DataType]) -> Result<Option<i64>> {
    /// Flink's range of `TIMESTAMP_LTZ` (years 0000 to 9999).
    const MAX_MILLIS: f64 = 253_402_300_799_999.0;
    const MIN_MILLIS: f64 = -62_167_219_200_000.0;
    if types[0].is_numeric() {
        let scale = match v.get(1).copied().unwrap_or("3").trim() {
            "0" => 1000.0,
            "3" => 1.0,
            p => {
                return Err(DataFusionError::Execution(format!(
                    "The precision value '{p}' for function TO_TIMESTAMP_LTZ(numeric, precision) is unsupported, \
                     the supported value is '0' for second or '3' for millisecond."
                )));
            }
        };
        if v.len() > 2 {
            return Err(DataFusionError::Plan(
                "TO_TIMESTAMP_LTZ(numeric, precision) takes 2 arguments, not 3".into(),
            ));
        }
        if matches!(
            types[0],
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
        ) {
            let n = int(v[0], "the epoch value")?;
            let millis = n.checked_mul(scale as i64);
            return Ok(millis.filter(|m| (MIN_MILLIS..=MAX_MILLIS).contains(&(*m as f64))));
        }
        let x: f64 = v[0]
            .trim()
            .parse()
            .map_err(|_| DataFusionError::Execution(format!("'{}' is not a number", v[0])))?;
        let millis = (x * scale).trunc();
        return Ok((millis.is_finite() && (MIN_MILLIS..=MAX_MILLIS).contains(&millis)).then_some(millis as i64));
    }
    // Without a pattern, as TO_TIMESTAMP's default: the fraction optional.
    let Some(local) = to_timestamp(&v[..v.len().min(2)])? else {
        return Ok(None);
    };
    let Some(zone) = v.get(2) else {
        return Ok(Some(local));
    };
    let Some(local) = chrono::DateTime::from_timestamp_millis(local) else {
        return Ok(None);
    };
    Ok(Some(in_zone(local.naive_utc(), &java_zone(zone)).timestamp_millis()))
}

use weir_engine::time_zone::java_zone;

/// The instant a local time names in `zone`, as Java's lenient calendar
/// reads it.
fn in_zone(local: NaiveDateTime, zone: &arrow::array::timezone::Tz) -> chrono::DateTime<chrono::Utc> {
    weir_engine::time_zone::instant_of(local, zone, weir_engine::time_zone::Resolve::Later)
}

/// `CONVERT_TZ(text, from, to)`: a `yyyy-MM-dd HH:mm:ss` time read in
/// zone `from`, written in zone `to` (Java's zone ids, see
/// [`java_zone`]); NULL when the text does not parse.
fn convert_tz(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let [text, from, to] = v else {
        return datafusion::common::exec_err!("CONVERT_TZ takes a time text and two time zones");
    };
    // A date alone is not a time here (Flink: NULL).
    if !text.contains(':') {
        return Ok(None);
    }
    let Some(millis) = to_timestamp(&[text])? else {
        return Ok(None);
    };
    let Some(local) = chrono::DateTime::from_timestamp_millis(millis) else {
        return Ok(None);
    };
    let instant = in_zone(local.naive_utc(), &java_zone(from));
    Ok(Some(
        instant
            .with_timezone(&java_zone(to))
            .format("%Y-%m-%d %H:%M:%S")
            .to_string(),
    ))
}

/// `UNIX_TIMESTAMP(s [, pattern])`: seconds since the epoch of `s` read
/// in UTC (`flink_zone` shifts it for the session zone); NULL
/// when `s` does not parse.
fn unix_timestamp(v: &[&str]) -> Result<Option<i64>> {
    let pattern = v.get(1).copied().unwrap_or(DEFAULT_TIME_PATTERN);
    Ok(parse_time(v[0], Some(pattern))?.map(|t| t.and_utc().timestamp()))
}

/// `FROM_UNIXTIME(n [, pattern])`: seconds since the epoch as text
/// (default `yyyy-MM-dd HH:mm:ss`), in UTC (`flink_zone` shifts `n` for
/// the session zone).
fn from_unixtime(v: &[&str], _: &[DataType]) -> Result<Option<String>> {
    let secs = int(v[0], "the seconds")?;
    let pattern = v.get(1).copied().unwrap_or(DEFAULT_TIME_PATTERN);
    // Called per row: the pattern is parsed once per thread while it stays
    // the same.
    thread_local! {
        static LAST: std::cell::RefCell<Option<(String, std::rc::Rc<weir_engine::time_format::JavaFormat>)>> =
            const { std::cell::RefCell::new(None) };
    }
    let format = LAST.with(|last| -> Result<_> {
        let mut last = last.borrow_mut();
        if let Some((p, f)) = last.as_ref()
            && p == pattern
        {
            return Ok(f.clone());
        }
        let f = std::rc::Rc::new(weir_engine::time_format::JavaFormat::new(pattern).map_err(DataFusionError::Plan)?);
        *last = Some((pattern.to_string(), f.clone()));
        Ok(f)
    })?;
    Ok(chrono::DateTime::from_timestamp(secs, 0).map(|t| format.format(&t.naive_utc())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chr_takes_the_low_byte_as_flink() {
        let int = [DataType::Int32];
        let c = |n: &str| chr(&[n], &int).expect("chr");
        assert_eq!(c("65"), Some("A".into()));
        assert_eq!(c("321"), Some("A".into()), "321 & 0xFF = 65");
        assert_eq!(c("256"), Some("\u{0}".into()));
        assert_eq!(c("233"), Some("é".into()), "Latin-1, as Java's (char)");
        assert_eq!(c("-350"), Some(String::new()));
        assert!(chr(&["a"], &[DataType::Utf8]).is_err(), "CHR takes an integer");
    }

    /// Flink 2.3's answers.
    #[test]
    fn overlay_answers_as_flink_at_the_edges() {
        let o = |s: &str, r: &str, from: &str, len: Option<&str>| {
            let mut args = vec![s, r, from];
            args.extend(len);
            overlay(&args, &[]).expect("overlay").expect("text")
        };
        assert_eq!(o("", "XX", "2", Some("3")), "");
        assert_eq!(o("", "XX", "1", Some("3")), "");
        assert_eq!(o("a", "XX", "2", Some("3")), "a");
        assert_eq!(o("abc", "XX", "4", Some("1")), "abc");
        assert_eq!(o("abcdef", "XX", "2", Some("10")), "aXX");
        assert_eq!(o("abcdef", "XX", "0", Some("2")), "abcdef");
        assert_eq!(o("abcdef", "XX", "-1", Some("2")), "abcdef");
        assert_eq!(o("abcdef", "XX", "2", Some("-1")), "aXX");
        assert_eq!(o("abcdef", "XX", "2", None), "aXXdef");
        assert_eq!(o("ab", "XX", "5", None), "ab");
        assert_eq!(o("abcdef", "XX", "2", Some("0")), "aXX");
        assert_eq!(o("abcdef", "XX", "3", Some("0")), "abXX");
        assert_eq!(o("abcdef", "XX", "6", Some("1")), "abcdeXX");
        assert_eq!(o("abcdef", "XX", "2", Some("1")), "aXXcdef");
        assert_eq!(o("abcdef", "", "2", Some("2")), "adef");
        assert_eq!(o("äöüß", "X", "2", Some("1")), "äXüß");
        assert_eq!(o("abcdef", "XX", "5", Some("2")), "abcdXX");
        assert_eq!(o("abcdef", "XX", "5", Some("1")), "abcdXXf");
        assert_eq!(o("abcdef", "XYZ", "2", None), "aXYZef");
        assert_eq!(o("abcdef", "", "2", None), "a");
        assert_eq!(o("abcdef", "XX", "1", Some("6")), "XX");
        assert_eq!(o("abcdef", "XX", "1", Some("5")), "XXf");
    }

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
    fn zones_read_as_java_reads_their_ids() {
        let tz = |from: &str, to: &str, t: &str| convert_tz(&[t, from, to], &[]).expect("convert");
        // Flink 2.3's answers.
        assert_eq!(
            tz("UTC", "America/Los_Angeles", "1970-01-01 00:00:00").as_deref(),
            Some("1969-12-31 16:00:00")
        );
        // A DST gap takes the offset before it; an overlap the later instant.
        assert_eq!(
            tz("America/New_York", "UTC", "2024-03-10 02:30:00").as_deref(),
            Some("2024-03-10 07:30:00")
        );
        assert_eq!(
            tz("America/New_York", "UTC", "2024-11-03 01:30:00").as_deref(),
            Some("2024-11-03 06:30:00")
        );
        assert_eq!(
            tz("UTC", "GMT+08:00", "2024-02-29 13:45:30.123").as_deref(),
            Some("2024-02-29 21:45:30")
        );
        assert_eq!(
            tz("UTC", "GMT+8", "2024-02-29 13:45:30").as_deref(),
            Some("2024-02-29 21:45:30")
        );
        // Ids Java does not know are GMT.
        assert_eq!(
            tz("UTC", "Foo/Bar", "2024-02-29 13:45:30").as_deref(),
            Some("2024-02-29 13:45:30")
        );
        assert_eq!(
            tz("UTC", "+05:30", "2024-02-29 13:45:30").as_deref(),
            Some("2024-02-29 13:45:30")
        );
        assert_eq!(tz("UTC", "Asia/Tokyo", "2024-02-29"), None);
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
