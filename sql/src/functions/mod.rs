//! The function registry: every function name a query may call, as
//! Flink's catalogue names it, with whether Weir runs it and how.
//!
//! A call is checked against it before planning (see [`check_calls`]):
//! a Flink function Weir does not have is refused naming it and why, and
//! a name that is not Flink's (DataFusion's `pow`, `strpos`, `date_trunc`
//! ...) is refused as unknown, so no query silently runs a DataFusion
//! function whose answer differs from Flink's. The conformance suite
//! (`tests/functions/cases.txt`, answers recorded on Flink 2.3) checks
//! the supported ones; `docs/sql.md`'s function table is generated from
//! [`markdown_table`] (a test keeps it in step).
//!
//! Each family of Flink's functions that Weir implements itself (where
//! DataFusion lacks it or answers differently) is a file here:
//! - [`overrides`]: registered over DataFusion's under the same name
//!   (`AVG` of integers), and Flink's own (`TYPEOF`).
//! - [`scalars`]: string functions and the time functions that take Java
//!   patterns; [`time`]: `TIMESTAMPADD`, `TIMESTAMPDIFF`, `FLOOR`/`CEIL`
//!   to a unit; [`clock`]: the clock functions (per batch) and `RAND` as
//!   Java's `Random`.
//! - [`cast`]: values as Flink writes them as text (`CAST(x AS STRING)`).
//! - [`json`], [`decimal`], [`bytes`], [`math`], [`moments`], [`printf`].
//! - [`arrays`], [`maps`], [`collections`], [`collect`] (`COLLECT` as a
//!   MULTISET).

use std::ops::ControlFlow;

pub mod arrays;
pub mod bytes;
pub mod cast;
pub mod clock;
pub mod collect;
pub mod collections;
pub mod decimal;
pub mod json;
pub mod maps;
pub mod math;
pub mod moments;
pub mod names;
pub mod overrides;
pub mod printf;
pub mod scalars;
pub mod time;

use sqlparser::ast::{self, Spanned, Visit, Visitor};

use crate::error::{Location, SqlError};
use crate::functions::time::{Op, Unit};

/// How Weir runs a Flink function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// DataFusion's function of the same name gives Flink's answers
    /// (checked by the conformance suite where it has a case).
    DataFusion,
    /// Weir's own implementation of Flink's behaviour (DataFusion's
    /// differs or is missing).
    Weir,
    /// Not supported yet: refused at planning with the reason.
    Refused(&'static str),
}

/// What kind of function a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Scalar,
    Aggregate,
    Window,
}

/// One function of Flink's catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Function {
    /// Flink's name (upper case; calls are case-insensitive).
    pub name: &'static str,
    pub kind: Kind,
    pub support: Support,
    /// Differences from Flink a user should know about.
    pub note: &'static str,
}

const fn f(name: &'static str, kind: Kind, support: Support, note: &'static str) -> Function {
    Function {
        name,
        kind,
        support,
        note,
    }
}

use Kind::{Aggregate as A, Scalar as S, Window as W};
use Support::{DataFusion as DF, Refused as No, Weir as Own};

/// Flink 2.3 refuses it too ("... Function is not supported in stream
/// mode."): its value needs the whole partition.
const BATCH_ONLY: &str = "not supported in stream mode, as in Flink";
const LIBM: &str = "results may differ from Java's in the last digit";
const PER_BATCH: &str = "the clock when each batch of rows is processed (Flink: per record in a streaming job); local values in the session zone";

/// Flink 2.x's built-in functions called by name (operators, `CASE`,
/// `CAST`, `EXTRACT`, `POSITION`, `TRIM`, `SUBSTRING ... FROM`,
/// `OVERLAY` and `FLOOR/CEIL ... TO` are syntax, not listed).
pub const FUNCTIONS: &[Function] = &[
    // Arithmetic.
    f("ABS", S, DF, ""),
    f("MOD", S, Own, "typed as its second argument, as Flink"),
    f("POWER", S, DF, ""),
    f("SQRT", S, Own, ""),
    f("LN", S, DF, ""),
    f("LOG10", S, DF, ""),
    f("LOG2", S, DF, ""),
    f(
        "LOG",
        S,
        Own,
        "LOG(x) is the natural logarithm, LOG(b, x) to base b (DataFusion's log is base 10)",
    ),
    f("EXP", S, DF, ""),
    f("CEIL", S, DF, ""),
    f("CEILING", S, DF, ""),
    f("FLOOR", S, DF, ""),
    f("ROUND", S, DF, ""),
    f("SIN", S, DF, LIBM),
    f("COS", S, DF, LIBM),
    f("TAN", S, DF, LIBM),
    f("COT", S, DF, LIBM),
    f("ASIN", S, DF, LIBM),
    f("ACOS", S, DF, LIBM),
    f("ATAN", S, DF, LIBM),
    f("ATAN2", S, DF, LIBM),
    f("SINH", S, DF, LIBM),
    f("COSH", S, DF, LIBM),
    f("TANH", S, DF, LIBM),
    f("DEGREES", S, DF, ""),
    f("RADIANS", S, DF, ""),
    f("PI", S, DF, ""),
    f("E", S, Own, ""),
    f("SIGN", S, Own, ""),
    f(
        "RAND",
        S,
        Own,
        "java.util.Random's numbers: a literal seed's sequence per call (Flink's at parallelism 1), a row's seed its first number",
    ),
    f(
        "RAND_INTEGER",
        S,
        Own,
        "as RAND; a bound not above 0 fails the query, as in Flink",
    ),
    f("UUID", S, DF, ""),
    f("BIN", S, Own, ""),
    f("HEX", S, Own, ""),
    f(
        "UNHEX",
        S,
        Own,
        "BYTES of hex digits; an odd count's first digit dropped and a zero byte first, as Flink; NULL for a non-hex character",
    ),
    f(
        "TRUNCATE",
        S,
        Own,
        "of a DECIMAL, the number of decimals must be a literal",
    ),
    // Strings.
    f("CHAR_LENGTH", S, DF, ""),
    f("CHARACTER_LENGTH", S, DF, ""),
    f("UPPER", S, DF, ""),
    f("LOWER", S, DF, ""),
    f("LTRIM", S, DF, ""),
    f("RTRIM", S, DF, ""),
    f("BTRIM", S, DF, ""),
    f("REPEAT", S, DF, ""),
    f("REPLACE", S, DF, ""),
    f(
        "REGEXP_REPLACE",
        S,
        Own,
        "Java regular expressions; constructs Rust's regex lacks (look-around, back-references) are refused",
    ),
    f("REGEXP_EXTRACT", S, Own, "Java regular expressions, as REGEXP_REPLACE"),
    f(
        "REGEXP_EXTRACT_ALL",
        S,
        Own,
        "Java regex; group 1 by default; NULL for an invalid regex or group",
    ),
    f("REGEXP_COUNT", S, Own, "Java regular expressions, as REGEXP_REPLACE"),
    f("REGEXP_INSTR", S, Own, "Java regular expressions, as REGEXP_REPLACE"),
    f("REGEXP_SUBSTR", S, Own, "Java regular expressions, as REGEXP_REPLACE"),
    f("REGEXP", S, Own, "Java regular expressions, as REGEXP_REPLACE"),
    f("SUBSTR", S, Own, ""),
    f("SUBSTRING", S, Own, ""),
    f("INITCAP", S, Own, ""),
    f("CONCAT", S, Own, ""),
    f("CONCAT_WS", S, DF, ""),
    f("LPAD", S, DF, ""),
    f("RPAD", S, DF, ""),
    f("REVERSE", S, DF, ""),
    f("ASCII", S, DF, ""),
    f(
        "CHR",
        S,
        Own,
        "the character of the low byte (`CHR(321)` is `A`), `''` for a negative number, as Flink",
    ),
    f("INSTR", S, DF, ""),
    f("LEFT", S, DF, ""),
    f("RIGHT", S, DF, ""),
    f("LOCATE", S, Own, ""),
    f("SPLIT_INDEX", S, Own, ""),
    f(
        "STR_TO_MAP",
        S,
        Own,
        "entries in Java HashMap order as Flink; delimiters are Java regular expressions",
    ),
    f("PARSE_URL", S, Own, ""),
    f("ELT", S, Own, ""),
    f("STARTSWITH", S, Own, ""),
    f("ENDSWITH", S, Own, ""),
    f("TRANSLATE", S, DF, ""),
    f(
        "SPLIT",
        S,
        Own,
        "empty parts kept; every character for an empty delimiter; `[]` for an empty string",
    ),
    f(
        "PRINTF",
        S,
        Own,
        "java.util.Formatter's conversions but %h, %a and %t (refused when run); NULL where Java throws, as Flink; ARRAY, MAP, ROW and BYTES arguments refused",
    ),
    f("URL_ENCODE", S, Own, ""),
    f("URL_DECODE", S, Own, ""),
    f("TO_BASE64", S, Own, "of a STRING's UTF-8 or of BYTES as they are"),
    f("FROM_BASE64", S, Own, ""),
    f(
        "ENCODE",
        S,
        Own,
        "Java's standard charsets (US-ASCII, ISO-8859-1, UTF-8, UTF-16BE, UTF-16LE, UTF-16), unmappable characters as '?'; another charset fails the query",
    ),
    f("DECODE", S, Own, "as ENCODE; malformed bytes as U+FFFD"),
    f("IS_ALPHA", S, Own, ""),
    f("IS_DECIMAL", S, Own, ""),
    f("IS_DIGIT", S, Own, ""),
    // Hashes.
    f("MD5", S, DF, "typed STRING (Flink: CHAR(32))"),
    f("SHA1", S, Own, "typed STRING (Flink: CHAR(40))"),
    f("SHA224", S, Own, "typed STRING (Flink: CHAR(56))"),
    f("SHA256", S, Own, "typed STRING (Flink: CHAR(64))"),
    f("SHA384", S, Own, "typed STRING (Flink: CHAR(96))"),
    f("SHA512", S, Own, "typed STRING (Flink: CHAR(128))"),
    f("SHA2", S, Own, "the bit length must be a literal; typed STRING"),
    // Time.
    f(
        "DATE_FORMAT",
        S,
        Own,
        "Java patterns; pattern letters without a chrono equivalent are refused",
    ),
    f("TO_DATE", S, Own, "Java patterns"),
    f("TO_TIMESTAMP", S, Own, "Java patterns; TIMESTAMP(3)"),
    f(
        "TO_TIMESTAMP_LTZ",
        S,
        Own,
        "epoch seconds (precision 0) or milliseconds (3); a string with a pattern, read in a zone (Java's ids, as CONVERT_TZ; UTC when none is given, as Flink)",
    ),
    f(
        "UNIX_TIMESTAMP",
        S,
        Own,
        "with a string argument, read in the session zone; UNIX_TIMESTAMP() (now) is refused",
    ),
    f("FROM_UNIXTIME", S, Own, "written in the session zone"),
    f(
        "CONVERT_TZ",
        S,
        Own,
        "Java's zone ids (tz names, GMT+hh:mm; others read as GMT); a DST gap takes the offset before it, an overlap the later instant",
    ),
    f("TIMESTAMPADD", S, Own, ""),
    f("TIMESTAMPDIFF", S, Own, ""),
    f("YEAR", S, Own, ""),
    f("QUARTER", S, Own, ""),
    f("MONTH", S, Own, ""),
    f("WEEK", S, Own, ""),
    f("DAYOFYEAR", S, Own, ""),
    f("DAYOFMONTH", S, Own, ""),
    f("DAYOFWEEK", S, Own, ""),
    f("HOUR", S, Own, ""),
    f("MINUTE", S, Own, ""),
    f("SECOND", S, Own, ""),
    f("NOW", S, Own, PER_BATCH),
    f("CURRENT_TIMESTAMP", S, Own, PER_BATCH),
    f("LOCALTIMESTAMP", S, Own, PER_BATCH),
    f("CURRENT_DATE", S, Own, PER_BATCH),
    f("CURRENT_TIME", S, Own, PER_BATCH),
    f("LOCALTIME", S, Own, PER_BATCH),
    f("CURRENT_ROW_TIMESTAMP", S, Own, PER_BATCH),
    f(
        "PROCTIME",
        S,
        Own,
        "a processing-time attribute in a computed column or view",
    ),
    f("CURRENT_WATERMARK", S, Own, ""),
    // Conditions and types.
    f("COALESCE", S, DF, ""),
    f("NULLIF", S, DF, ""),
    f("IFNULL", S, DF, ""),
    f("IF", S, Own, ""),
    f("GREATEST", S, Own, ""),
    f("LEAST", S, Own, ""),
    f("TYPEOF", S, Own, ""),
    // Collections, JSON and values.
    f(
        "CARDINALITY",
        S,
        Own,
        "of an ARRAY or a MAP; of a MULTISET refused (Flink 2.3 fails on it too)",
    ),
    f("ELEMENT", S, Own, ""),
    f("ARRAY_CONTAINS", S, Own, ""),
    f("ARRAY_APPEND", S, Own, ""),
    f("ARRAY_PREPEND", S, Own, ""),
    f("ARRAY_CONCAT", S, Own, ""),
    f("ARRAY_DISTINCT", S, Own, ""),
    f("ARRAY_EXCEPT", S, Own, ""),
    f("ARRAY_INTERSECT", S, Own, ""),
    f("ARRAY_JOIN", S, Own, ""),
    f("ARRAY_MAX", S, Own, ""),
    f("ARRAY_MIN", S, Own, ""),
    f("ARRAY_POSITION", S, Own, ""),
    f("ARRAY_REMOVE", S, Own, ""),
    f("ARRAY_REVERSE", S, Own, ""),
    f("ARRAY_SLICE", S, Own, ""),
    f("ARRAY_SORT", S, Own, ""),
    f("ARRAY_UNION", S, Own, ""),
    f("MAP_KEYS", S, DF, ""),
    f("MAP_VALUES", S, DF, ""),
    f("MAP_ENTRIES", S, DF, ""),
    f(
        "MAP_FROM_ARRAYS",
        S,
        Own,
        "DataFusion's map(keys, values): a NULL or repeated key fails the query",
    ),
    f(
        "JSON_VALUE",
        S,
        Own,
        "paths: $, .key, ['key'], [n] (wildcards and filters refused); RETURNING; {NULL | ERROR | DEFAULT literal} ON ERROR for any result that is not a scalar (not JSON, absent, JSON null, an object or array, as Flink 2.3); ON EMPTY is read and, as in Flink 2.3, never applies",
    ),
    f("JSON_QUERY", S, Own, "WITHOUT WRAPPER only; paths as JSON_VALUE"),
    f("JSON_EXISTS", S, Own, "paths as JSON_VALUE"),
    f(
        "JSON_OBJECT",
        S,
        Own,
        "a JSON_OBJECT/JSON_ARRAY argument is inserted as JSON, any other string as a JSON string (Flink's rule)",
    ),
    f(
        "JSON_ARRAY",
        S,
        Own,
        "a JSON_OBJECT/JSON_ARRAY argument is inserted as JSON, any other string as a JSON string (Flink's rule)",
    ),
    f("JSON_STRING", S, Own, ""),
    f(
        "IS JSON",
        S,
        Own,
        "x IS [NOT] JSON [VALUE, SCALAR, ARRAY or OBJECT]; FALSE for NULL",
    ),
    f("ROW", S, Own, "fields named EXPR$0, EXPR$1, ... as Flink names them"),
    // Aggregates.
    f("COUNT", A, DF, ""),
    f("SUM", A, DF, ""),
    f("AVG", A, Own, "of integers: the integer type, truncated, as Flink"),
    f("MIN", A, DF, ""),
    f("MAX", A, DF, ""),
    f("STDDEV", A, Own, "STDDEV_SAMP"),
    f(
        "STDDEV_POP",
        A,
        Own,
        "Welford's method in DOUBLE as Flink, typed as the input (an INT's is an INT by Java's saturating cast, a DECIMAL's DECIMAL(38, 6))",
    ),
    f("STDDEV_SAMP", A, Own, "as STDDEV_POP"),
    f("VAR_POP", A, Own, "as STDDEV_POP"),
    f("VAR_SAMP", A, Own, "as STDDEV_POP"),
    f(
        "FIRST_VALUE",
        A,
        DF,
        "NULLs skipped; in windows and in a GROUP BY (over an updating input, a retraction takes out the earliest equal value, as Flink's)",
    ),
    f(
        "LAST_VALUE",
        A,
        DF,
        "NULLs skipped; in windows and in a GROUP BY (over an updating input, a retraction takes out the earliest equal value, as Flink's)",
    ),
    f("VARIANCE", A, Own, "VAR_SAMP"),
    f(
        "COLLECT",
        A,
        Own,
        "a MULTISET of the non-NULL values, `{}` when none; in windows, OVER windows and a GROUP BY (a retraction takes one occurrence back); elements in order of first arrival (Flink's order is its hash map's); refused with DISTINCT",
    ),
    f(
        "LISTAGG",
        A,
        Own,
        "',' by default; in windows (DataFusion's string_agg) and in a GROUP BY (over an updating input, a retraction takes out the earliest equal value, as Flink's); refused with DISTINCT",
    ),
    f(
        "ARRAY_AGG",
        A,
        DF,
        "NULLs kept unless IGNORE NULLS, arrival order; in windows and in a GROUP BY (over an updating input, a retraction takes out the earliest equal value, as Flink's); refused with DISTINCT",
    ),
    f(
        "JSON_OBJECTAGG",
        A,
        Own,
        "`{}` for no members; NULL ON NULL by default; members sorted by key, as Flink prints them; a NULL or repeated key fails the job, as in Flink; in windows and a GROUP BY (a retraction takes the member out); not in OVER windows, as Flink",
    ),
    f(
        "JSON_ARRAYAGG",
        A,
        Own,
        "`[]` for no values; ABSENT ON NULL by default; in windows and a GROUP BY (a retraction takes out the earliest equal value, as Flink); not in OVER windows, as Flink",
    ),
    // OVER windows.
    f(
        "ROW_NUMBER",
        W,
        Own,
        "in Top-N and deduplication; elsewhere, as Flink on a stream, the rows up to the current one",
    ),
    f(
        "RANK",
        W,
        Own,
        "as Flink on a stream: the partition's rows up to the current time (ties share the higher count)",
    ),
    f("DENSE_RANK", W, Own, "as Flink on a stream: the same as RANK"),
    f("LAG", W, DF, ""),
    f(
        "LEAD",
        W,
        No("LEAD Function is not supported in stream mode. (Flink 2.3's message)"),
        "",
    ),
    f("NTILE", W, No(BATCH_ONLY), ""),
    f("CUME_DIST", W, No(BATCH_ONLY), ""),
    f("PERCENT_RANK", W, No(BATCH_ONLY), ""),
];

/// The registry's entry for a called name (case-insensitive).
pub fn lookup(name: &str) -> Option<&'static Function> {
    FUNCTIONS.iter().find(|f| f.name.eq_ignore_ascii_case(name))
}

/// Checks every function a query calls against the registry: the first
/// call of a refused or unknown function is an error naming it, with its
/// position. Weir's internal functions (`__weir_*`) pass.
pub fn check_calls<V: Visit>(node: &V) -> Result<(), SqlError> {
    struct Check(Option<SqlError>);
    impl Visitor for Check {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &ast::Expr) -> ControlFlow<()> {
            let ast::Expr::Function(call) = e else {
                return ControlFlow::Continue(());
            };
            let Some(last) = call.name.0.last().and_then(|p| p.as_ident()) else {
                return ControlFlow::Continue(());
            };
            if last.value.starts_with(crate::functions::names::PREFIX) {
                return ControlFlow::Continue(());
            }
            let upper = last.value.to_ascii_uppercase();
            let err = match lookup(&upper) {
                Some(Function {
                    support: Support::Refused(why),
                    note,
                    ..
                }) => {
                    let hint = if note.is_empty() {
                        String::new()
                    } else {
                        format!(" ({note})")
                    };
                    SqlError::unsupported(format!("function {upper}: {why}{hint}"))
                }
                Some(_) => return ControlFlow::Continue(()),
                None => SqlError::plan(format!(
                    "no function named {upper}: it is not one of Flink's built-in functions (docs/sql.md lists them)"
                )),
            };
            let start = call.name.span().start;
            self.0 = Some(if start.line > 0 {
                err.at(Location {
                    line: start.line,
                    column: start.column,
                })
            } else {
                err
            });
            ControlFlow::Break(())
        }
    }
    let mut check = Check(None);
    let _ = node.visit(&mut check);
    check.0.map_or(Ok(()), Err)
}

/// The plain arguments of a call (`None` when any is named, `*`, or the
/// call has a clause DataFusion handles itself).
fn plain_args(call: &ast::Function) -> Option<Vec<ast::Expr>> {
    let ast::FunctionArguments::List(list) = &call.args else {
        return None;
    };
    if !list.clauses.is_empty() || list.duplicate_treatment.is_some() {
        return None;
    }
    list.args
        .iter()
        .map(|a| match a {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

fn call(name: &str, args: Vec<ast::Expr>) -> ast::Expr {
    ast::Expr::Function(ast::Function {
        name: ast::ObjectName::from(vec![ast::Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: ast::FunctionArguments::None,
        args: ast::FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|e| ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// `(ROW(a, b)).EXPR$0` and `items[1].sku`: a field named after a
/// subscript or a parenthesized value. DataFusion plans a field given as
/// a string (`."sku"`-style), not as a name: the names become texts
/// (case kept: Flink's field names are case-sensitive).
fn field_names_as_text(chain: &mut Vec<ast::AccessExpr>) {
    let taken = std::mem::take(chain);
    for access in taken {
        match access {
            ast::AccessExpr::Dot(ast::Expr::Identifier(id)) => chain.push(ast::AccessExpr::Dot(text(&id.value))),
            ast::AccessExpr::Dot(ast::Expr::CompoundIdentifier(ids)) => {
                chain.extend(ids.iter().map(|id| ast::AccessExpr::Dot(text(&id.value))));
            }
            other => chain.push(other),
        }
    }
}

fn text(s: &str) -> ast::Expr {
    ast::Expr::Value(ast::Value::SingleQuotedString(s.into()).into())
}

/// Flink functions that are another form of SQL DataFusion plans as Flink
/// answers (after [`check_calls`], so the names they become need not be
/// Flink's):
/// - `IF(c, a, b)` is `CASE WHEN c THEN a ELSE b END`;
/// - `YEAR(x)` ... `SECOND(x)`, `DAYOFWEEK`, `DAYOFYEAR`, `DAYOFMONTH`,
///   `WEEK`, `QUARTER` are `EXTRACT(... FROM x)` (BIGINT; see
///   `flink_cast`);
/// - `STARTSWITH` / `ENDSWITH` are DataFusion's `starts_with` / `ends_with`;
/// - `E()` is the DOUBLE literal of e;
/// - `CARDINALITY(a)` is DataFusion's, cast to Flink's INT;
/// - `MAP_FROM_ARRAYS(k, v)` is DataFusion's `map(k, v)`;
/// - `ROW(a, b)` is `named_struct('EXPR$0', a, 'EXPR$1', b)`;
/// - `LISTAGG(x[, sep])` is DataFusion's `string_agg(x, sep)`, `sep` ','
///   by default;
/// - a `TIMESTAMP '...'` literal is typed by its fraction digits;
/// - `x IS [NOT] JSON [kind]` (parsed as an `IS DISTINCT FROM` marker) is
///   `__weir_is_json(x, 'KIND')`;
/// - `TIMESTAMPADD`, `TIMESTAMPDIFF` and `FLOOR/CEIL(t TO unit)` are
///   Weir's `__weir_*` time arithmetic (`flink_time`), the unit a text
///   literal;
/// - `SHA224/256/384/512(x)` and `SHA2(x, bits)` are the hex text of
///   DataFusion's digest.
pub fn flink_calls<V: ast::VisitMut>(node: &mut V) -> Result<(), SqlError> {
    let mut err = None;
    let _ = ast::visit_expressions_mut(node, |e| {
        if let ast::Expr::TypedString(t) = e {
            timestamp_literal_precision(t);
            return ControlFlow::Continue(());
        }
        if let ast::Expr::Cast { data_type, .. } = e
            && match data_type {
                ast::DataType::Bytes(None) => true,
                ast::DataType::Custom(name, modifiers) => {
                    modifiers.is_empty() && name.to_string().eq_ignore_ascii_case("BYTES")
                }
                _ => false,
            }
        {
            // Flink's BYTES (DataFusion knows BYTEA).
            *data_type = ast::DataType::Bytea;
            return ControlFlow::Continue(());
        }
        if let Some(fitted) = cast_to_length(e) {
            *e = fitted;
            return ControlFlow::Continue(());
        }
        if let ast::Expr::CompoundFieldAccess { access_chain, .. } = e {
            field_names_as_text(access_chain);
            return ControlFlow::Continue(());
        }
        if matches!(e, ast::Expr::IsDistinctFrom(..) | ast::Expr::IsNotDistinctFrom(..)) {
            let taken = std::mem::replace(e, ast::Expr::Value(ast::Value::Null.into()));
            *e = distinct_from(taken);
            return ControlFlow::Continue(());
        }
        if let Some(rounded) = round_to_unit(e) {
            match rounded {
                Ok(new) => *e = new,
                Err(x) => {
                    err = Some(x);
                    return ControlFlow::Break(());
                }
            }
            return ControlFlow::Continue(());
        }
        let ast::Expr::Function(f) = e else {
            return ControlFlow::<()>::Continue(());
        };
        let Some(name) = f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| i.value.to_ascii_lowercase())
        else {
            return ControlFlow::Continue(());
        };
        if name == "json_arrayagg" || name == "json_objectagg" {
            let new = if name == "json_arrayagg" {
                json_arrayagg(f)
            } else {
                json_objectagg(f)
            };
            match new {
                Ok(new) => *e = new,
                Err(x) => {
                    err = Some(x);
                    return ControlFlow::Break(());
                }
            }
            return ControlFlow::Continue(());
        }
        if f.over.is_some() || f.filter.is_some() {
            return ControlFlow::Continue(());
        }
        if matches!(name.as_str(), "json_object" | "json_array" | "json_value") {
            match json_call(&name, f) {
                Ok(Some(new)) => *e = new,
                Ok(None) => {}
                Err(x) => {
                    err = Some(x);
                    return ControlFlow::Break(());
                }
            }
            return ControlFlow::Continue(());
        }
        if name == "listagg"
            && let ast::FunctionArguments::List(list) = &f.args
            && list.duplicate_treatment == Some(ast::DuplicateTreatment::Distinct)
        {
            let start = f.name.span().start;
            let e = SqlError::unsupported("LISTAGG(DISTINCT ...) is not supported yet");
            err = Some(if start.line > 0 {
                e.at(Location {
                    line: start.line,
                    column: start.column,
                })
            } else {
                e
            });
            return ControlFlow::Break(());
        }
        let Some(args) = plain_args(f) else {
            return ControlFlow::Continue(());
        };
        let field = |part: ast::DateTimeField, x: ast::Expr| ast::Expr::Extract {
            field: part,
            syntax: ast::ExtractSyntax::From,
            expr: Box::new(x),
        };
        use ast::DateTimeField as D;
        let part = match name.as_str() {
            "year" => Some(D::Year),
            "quarter" => Some(D::Quarter),
            "month" => Some(D::Month),
            "week" => Some(D::Week(None)),
            "dayofyear" => Some(D::Doy),
            "dayofmonth" => Some(D::Day),
            "dayofweek" => Some(D::Dow),
            "hour" => Some(D::Hour),
            "minute" => Some(D::Minute),
            "second" => Some(D::Second),
            _ => None,
        };
        let bad = |msg: String| {
            let start = f.name.span().start;
            let e = SqlError::plan(msg);
            if start.line > 0 {
                e.at(Location {
                    line: start.line,
                    column: start.column,
                })
            } else {
                e
            }
        };
        let upper = name.to_ascii_uppercase();
        let new = match (name.as_str(), args.as_slice()) {
            (_, [x]) if part.is_some() => part.map(|p| field(p, x.clone())),
            ("if", [c, a, b]) => Some(ast::Expr::Case {
                case_token: ast::helpers::attached_token::AttachedToken::empty(),
                end_token: ast::helpers::attached_token::AttachedToken::empty(),
                operand: None,
                conditions: vec![ast::CaseWhen {
                    condition: c.clone(),
                    result: a.clone(),
                }],
                else_result: Some(Box::new(b.clone())),
            }),
            ("timestampadd" | "timestampdiff", [unit, a, b]) => {
                let op = if name == "timestampadd" { Op::Add } else { Op::Diff };
                match unit_of(unit) {
                    Some(u) => Some(call(op.udf_name(), vec![text(u.name()), a.clone(), b.clone()])),
                    None => {
                        err = Some(at(
                            SqlError::plan(format!(
                                "{upper}: the first argument must be a time unit ({}), not {unit}",
                                Unit::ALL
                            )),
                            unit.span(),
                        ));
                        return ControlFlow::Break(());
                    }
                }
            }
            ("listagg", [x]) => Some(call("string_agg", vec![x.clone(), text(",")])),
            ("listagg", [x, sep]) => Some(call("string_agg", vec![x.clone(), sep.clone()])),
            ("cardinality", [x]) => Some(ast::Expr::Cast {
                kind: ast::CastKind::Cast,
                expr: Box::new(call("cardinality", vec![x.clone()])),
                data_type: ast::DataType::Int(None),
                array: false,
                format: None,
            }),
            ("map_from_arrays", [k, v]) => Some(call("map", vec![k.clone(), v.clone()])),
            // Flink names a ROW(...)'s fields EXPR$0, EXPR$1, ...
            ("row", fields) if !fields.is_empty() => Some(call(
                "named_struct",
                fields
                    .iter()
                    .enumerate()
                    .flat_map(|(i, x)| [text(&format!("EXPR${i}")), x.clone()])
                    .collect(),
            )),
            ("startswith", [a, b]) => Some(call("starts_with", vec![a.clone(), b.clone()])),
            ("endswith", [a, b]) => Some(call("ends_with", vec![a.clone(), b.clone()])),
            // A DOUBLE, as the parser writes approximate numbers.
            ("e", []) => Some(ast::Expr::Cast {
                kind: ast::CastKind::Cast,
                expr: Box::new(text("2.718281828459045")),
                data_type: ast::DataType::Double(ast::ExactNumberInfo::None),
                array: false,
                format: None,
            }),
            ("sha224" | "sha256" | "sha384" | "sha512", [x]) => Some(call(
                crate::functions::bytes::HEX_OF_BYTES,
                vec![call("digest", vec![x.clone(), text(&name)])],
            )),
            ("sha2", [x, bits]) => match bits {
                ast::Expr::Value(v) if matches!(&v.value, ast::Value::Number(n, _) if ["224", "256", "384", "512"].contains(&n.as_str())) =>
                {
                    let ast::Value::Number(n, _) = &v.value else {
                        unreachable!()
                    };
                    Some(call(
                        crate::functions::bytes::HEX_OF_BYTES,
                        vec![call("digest", vec![x.clone(), text(&format!("sha{n}"))])],
                    ))
                }
                _ => {
                    err = Some(bad(
                        "SHA2: the bit length must be the literal 224, 256, 384 or 512".into()
                    ));
                    return ControlFlow::Break(());
                }
            },
            (
                "timestampadd" | "timestampdiff" | "if" | "startswith" | "endswith" | "sha224" | "sha256" | "sha384"
                | "sha512" | "sha2",
                _,
            ) => {
                let how = match name.as_str() {
                    "if" => "a condition, a value when true and one when false",
                    "timestampadd" => "a time unit, a count and a time",
                    "timestampdiff" => "a time unit and two times",
                    "sha2" => "a value and a bit length",
                    "startswith" | "endswith" => "two arguments",
                    _ => "one argument",
                };
                err = Some(bad(format!("{upper} takes {how}, not {} arguments", args.len())));
                return ControlFlow::Break(());
            }
            _ if part.is_some() => {
                err = Some(bad(format!("{upper} takes one argument, not {}", args.len())));
                return ControlFlow::Break(());
            }
            _ => None,
        };
        if let Some(new) = new {
            *e = new;
        }
        ControlFlow::Continue(())
    });
    err.map_or(Ok(()), Err)
}

/// Whether `e` is a call of a JSON constructor (as written, or already
/// rewritten to Weir's), whose value another constructor inserts as JSON.
fn is_json_constructor(e: &ast::Expr) -> bool {
    matches!(e, ast::Expr::Function(g) if g.name.0.last().and_then(|p| p.as_ident()).is_some_and(|i| {
        matches!(
            i.value.to_ascii_lowercase().as_str(),
            "json_object" | "json_array" | crate::functions::names::JSON_OBJECT | crate::functions::names::JSON_OBJECT_ABSENT | crate::functions::names::JSON_ARRAY_NULLS
        )
    }))
}

/// What JSON_ARRAYAGG and JSON_OBJECTAGG share: refused in an OVER window
/// (Flink has them in none) and with DISTINCT; their arguments and their
/// `NULL | ABSENT ON NULL` clause, the only clause they take.
fn json_aggregate_call<'a>(
    f: &'a ast::Function,
    name: &str,
) -> Result<(&'a ast::FunctionArgumentList, Option<ast::JsonNullClause>), SqlError> {
    let refuse = |why: &str| at(SqlError::unsupported(format!("{name}: {why}")), f.name.span());
    if f.over.is_some() {
        return Err(refuse("not supported in an OVER window (as in Flink)"));
    }
    let ast::FunctionArguments::List(list) = &f.args else {
        return Err(refuse("takes arguments"));
    };
    let mut nulls = None;
    for c in &list.clauses {
        match c {
            ast::FunctionArgumentClause::JsonNullClause(n) => nulls = Some(n.clone()),
            other => return Err(refuse(&format!("the clause {other} is not supported"))),
        }
    }
    if list.duplicate_treatment.is_some() {
        return Err(refuse("DISTINCT is not supported"));
    }
    Ok((list, nulls))
}

/// `LISTAGG(element, ',')` with the call `f`'s `FILTER (WHERE ...)`.
fn listagg_filtered(element: ast::Expr, f: &ast::Function) -> ast::Expr {
    let mut agg = call("string_agg", vec![element, text(",")]);
    if let ast::Expr::Function(g) = &mut agg {
        g.filter = f.filter.clone();
    }
    agg
}

/// `JSON_ARRAYAGG(x [ABSENT | NULL ON NULL])`: the group's values as a JSON
/// array, `[]` when there are none, planned as LISTAGG of each value's
/// JSON text (JSON_STRING's; a JSON constructor's value inserted as JSON,
/// a NULL left out or, with `NULL ON NULL`, `null`). LISTAGG brings the
/// windows and the GROUP BY with retraction (the earliest equal value
/// leaves, as Flink's `JsonArrayAggFunction`'s list view). Flink has it in
/// no OVER window.
fn json_arrayagg(f: &ast::Function) -> Result<ast::Expr, SqlError> {
    let (list, null_clause) = json_aggregate_call(f, "JSON_ARRAYAGG")?;
    let nulls = null_clause == Some(ast::JsonNullClause::NullOnNull);
    let refuse = |why: &str| at(SqlError::unsupported(format!("JSON_ARRAYAGG: {why}")), f.name.span());
    let [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(x))] = list.args.as_slice() else {
        return Err(refuse("takes one value"));
    };
    let value = if is_json_constructor(x) {
        call(crate::functions::json::RAW_FN, vec![x.clone()])
    } else {
        x.clone()
    };
    let element = call(
        if nulls {
            crate::functions::json::ELEMENT_NULLS_FN
        } else {
            "json_string"
        },
        vec![value],
    );
    let agg = listagg_filtered(element, f);
    let concat = |l: ast::Expr, r: ast::Expr| ast::Expr::BinaryOp {
        left: Box::new(l),
        op: ast::BinaryOperator::StringConcat,
        right: Box::new(r),
    };
    Ok(call(
        "coalesce",
        vec![concat(concat(text("["), agg), text("]")), text("[]")],
    ))
}

/// `CAST(x AS VARCHAR(n))` and `CAST(x AS CHAR(n))` (`CHAR` is `CHAR(1)`)
/// as Flink casts: the text cut to `n` characters, a CHAR's padded with
/// spaces to `n` (`CAST('ab' AS CHAR(4)) || '|'` is `ab  |`). Both are a
/// STRING in Weir; the cast becomes `__weir_fit_text(CAST(x AS STRING), n,
/// pad)`. `VARCHAR` without a length (or `VARCHAR(2147483647)`, STRING)
/// is unchanged.
fn cast_to_length(e: &ast::Expr) -> Option<ast::Expr> {
    let ast::Expr::Cast {
        kind,
        expr,
        data_type,
        array,
        format,
    } = e
    else {
        return None;
    };
    let length = |n: &Option<ast::CharacterLength>| match n {
        Some(ast::CharacterLength::IntegerLength { length, .. }) => Some(*length),
        _ => None,
    };
    let (n, pad) = match data_type {
        ast::DataType::Varchar(n) | ast::DataType::CharacterVarying(n) | ast::DataType::CharVarying(n) => {
            (length(n).filter(|n| *n < i32::MAX as u64)?, false)
        }
        ast::DataType::Char(n) | ast::DataType::Character(n) => (length(n).unwrap_or(1), true),
        _ => return None,
    };
    let as_string = ast::Expr::Cast {
        kind: kind.clone(),
        expr: expr.clone(),
        data_type: ast::DataType::String(None),
        array: *array,
        format: format.clone(),
    };
    Some(call(
        crate::functions::scalars::FIT_TEXT_FN,
        vec![
            as_string,
            ast::Expr::Value(ast::Value::Number(n.to_string(), false).into()),
            ast::Expr::Value(ast::Value::Boolean(pad).into()),
        ],
    ))
}

/// A JSON member, `__weir_json_kv(k, v)` as the parser writes `[KEY] k
/// VALUE v`: its key and value.
fn json_member(a: &ast::FunctionArg) -> Option<(ast::Expr, ast::Expr)> {
    let ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(ast::Expr::Function(kv))) = a else {
        return None;
    };
    if !kv.name.to_string().eq_ignore_ascii_case(crate::functions::json::KV_FN) {
        return None;
    }
    let ast::FunctionArguments::List(list) = &kv.args else {
        return None;
    };
    match list.args.as_slice() {
        [
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(k)),
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(v)),
        ] => Some((k.clone(), v.clone())),
        _ => None,
    }
}

/// `JSON_OBJECTAGG([KEY] k VALUE v [NULL | ABSENT ON NULL])`: the group's
/// members as a JSON object, planned as LISTAGG of each member's `[k, v]`
/// text (a NULL value `null`, or left out with `ABSENT ON NULL`), which
/// `flink_json::objectagg` turns into the object: members sorted by key
/// (Flink prints its map's keys in order), a repeated key an error with
/// Flink's message. LISTAGG brings windows and the GROUP BY with
/// retraction (the member with that key and value leaves, as Flink's map
/// view drops the key). The key must be a string, as Flink's signature
/// (`flink_json::check_member`, when planned).
fn json_objectagg(f: &ast::Function) -> Result<ast::Expr, SqlError> {
    let (list, null_clause) = json_aggregate_call(f, "JSON_OBJECTAGG")?;
    let absent = null_clause == Some(ast::JsonNullClause::AbsentOnNull);
    let refuse = |why: &str| at(SqlError::unsupported(format!("JSON_OBJECTAGG: {why}")), f.name.span());
    let [arg] = list.args.as_slice() else {
        return Err(refuse("takes one member, `key VALUE value`"));
    };
    let Some((key, value)) = json_member(arg) else {
        return Err(refuse("takes one member, `key VALUE value`"));
    };
    let value = if is_json_constructor(&value) {
        call(crate::functions::json::RAW_FN, vec![value])
    } else {
        value
    };
    let member = call(
        if absent {
            crate::functions::json::MEMBER_ABSENT_FN
        } else {
            crate::functions::json::MEMBER_FN
        },
        vec![key, value],
    );
    let agg = listagg_filtered(member, f);
    Ok(call(crate::functions::json::OBJECTAGG_FN, vec![agg]))
}

/// Flink's JSON constructors and `JSON_VALUE ... RETURNING` as Weir's
/// functions (`flink_json`):
/// - `JSON_OBJECT(k VALUE v, ...)` is `__weir_json_object(k, v, ...)`
///   (`_absent` with `ABSENT ON NULL`);
/// - `JSON_ARRAY(... NULL ON NULL)` is `__weir_json_array_nulls(...)`;
/// - `JSON_VALUE(j, p RETURNING t)` is `TRY_CAST(JSON_VALUE(j, p) AS t)`
///   (a value that is not a `t` is an error, so NULL by default).
fn json_call(name: &str, f: &ast::Function) -> Result<Option<ast::Expr>, SqlError> {
    let ast::FunctionArguments::List(list) = &f.args else {
        return Ok(None);
    };
    let upper = name.to_ascii_uppercase();
    let nulls = list.clauses.iter().find_map(|c| match c {
        ast::FunctionArgumentClause::JsonNullClause(n) => Some(n.clone()),
        _ => None,
    });
    let returning = list.clauses.iter().find_map(|c| match c {
        ast::FunctionArgumentClause::JsonReturningClause(r) => Some(r.data_type.clone()),
        _ => None,
    });
    let unsupported = list.clauses.iter().find(|c| {
        !matches!(
            c,
            ast::FunctionArgumentClause::JsonNullClause(_) | ast::FunctionArgumentClause::JsonReturningClause(_)
        )
    });
    if let Some(c) = unsupported.filter(|_| name != "json_value") {
        return Err(at(
            SqlError::unsupported(format!("{upper}: the clause {c} is not supported")),
            f.name.span(),
        ));
    }
    let unnamed = |a: &ast::FunctionArg| match a {
        ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Some(e.clone()),
        _ => None,
    };
    // A JSON constructor's value in another's arguments is inserted as
    // JSON (Flink's rule); any other string is a JSON string.
    let mut nested = false;
    let mut as_json = |e: ast::Expr| -> ast::Expr {
        if is_json_constructor(&e) {
            nested = true;
            call(crate::functions::json::RAW_FN, vec![e])
        } else {
            e
        }
    };
    match name {
        "json_object" => {
            let mut args = vec![];
            for a in &list.args {
                let Some((k, v)) = json_member(a) else {
                    return Err(at(
                        SqlError::plan("JSON_OBJECT takes members as `key VALUE value`"),
                        f.name.span(),
                    ));
                };
                args.extend([k, as_json(v)]);
            }
            if args.is_empty() {
                // `JSON_OBJECT()`: the empty object.
                return Ok(Some(text("{}")));
            }
            let udf = match nulls {
                Some(ast::JsonNullClause::AbsentOnNull) => crate::functions::names::JSON_OBJECT_ABSENT,
                _ => crate::functions::names::JSON_OBJECT,
            };
            Ok(Some(call(udf, args)))
        }
        "json_array" => {
            let Some(args) = list.args.iter().map(unnamed).collect::<Option<Vec<_>>>() else {
                return Ok(None);
            };
            let args: Vec<ast::Expr> = args.into_iter().map(&mut as_json).collect();
            if nulls == Some(ast::JsonNullClause::NullOnNull) {
                Ok(Some(call(crate::functions::names::JSON_ARRAY_NULLS, args)))
            } else if nested {
                Ok(Some(call("json_array", args)))
            } else {
                Ok(None)
            }
        }
        _ => {
            let Some(t) = returning else {
                return Ok(None);
            };
            let Some(args) = list.args.iter().map(unnamed).collect::<Option<Vec<_>>>() else {
                return Ok(None);
            };
            Ok(Some(ast::Expr::Cast {
                kind: ast::CastKind::TryCast,
                expr: Box::new(call("json_value", args)),
                data_type: t,
                array: false,
                format: None,
            }))
        }
    }
}

/// A `TIMESTAMP '...'` literal takes the precision of its fraction digits,
/// as Flink types it (`TIMESTAMP '2024-01-31 10:00:00'` is
/// `TIMESTAMP(0)`, `'... 10:00:00.123'` is `TIMESTAMP(3)`), rounded up to
/// the precisions Arrow has (0, 3, 6, 9); DataFusion would type every
/// one `TIMESTAMP(9)`.
fn timestamp_literal_precision(t: &mut ast::TypedString) {
    let ast::DataType::Timestamp(None, ast::TimezoneInfo::None) = t.data_type else {
        return;
    };
    let ast::Value::SingleQuotedString(text) = &t.value.value else {
        return;
    };
    let digits = text
        .trim()
        .rsplit_once('.')
        .map_or(0, |(_, frac)| frac.chars().take_while(char::is_ascii_digit).count());
    let p = match digits {
        0 => 0,
        1..=3 => 3,
        4..=6 => 6,
        _ => 9,
    };
    t.data_type = ast::DataType::Timestamp(Some(p), ast::TimezoneInfo::None);
}

/// `x IS [NOT] DISTINCT FROM y` with SQL's precedence: sqlparser reads
/// everything after `FROM` as `y`, so `a IS DISTINCT FROM b AND c` came
/// as `a IS DISTINCT FROM (b AND c)`; Flink (Calcite) binds it as a
/// comparison, `(a IS DISTINCT FROM b) AND c`. The AND/OR/comparison
/// chain is rotated back above the predicate. Then `x IS [NOT] JSON`,
/// which the parser hands over as this predicate, becomes Weir's test.
fn distinct_from(e: ast::Expr) -> ast::Expr {
    let (x, rhs, negated) = match e {
        ast::Expr::IsDistinctFrom(x, r) => (x, r, false),
        ast::Expr::IsNotDistinctFrom(x, r) => (x, r, true),
        other => return other,
    };
    let make = |x, r| {
        if negated {
            ast::Expr::IsNotDistinctFrom(x, r)
        } else {
            ast::Expr::IsDistinctFrom(x, r)
        }
    };
    use ast::BinaryOperator as B;
    match *rhs {
        ast::Expr::BinaryOp { left, op, right }
            if matches!(
                op,
                B::And | B::Or | B::Xor | B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq
            ) =>
        {
            ast::Expr::BinaryOp {
                left: Box::new(distinct_from(make(x, left))),
                op,
                right,
            }
        }
        rhs => {
            let e = make(x, Box::new(rhs));
            is_json_test(&e).unwrap_or(e)
        }
    }
}

/// `x IS [NOT] JSON kind`, which the parser hands over as `x IS [NOT]
/// DISTINCT FROM __weir_is_json_kind('KIND')`, as Weir's test.
fn is_json_test(e: &ast::Expr) -> Option<ast::Expr> {
    let (x, marker, negated) = match e {
        ast::Expr::IsNotDistinctFrom(x, m) => (x, m, false),
        ast::Expr::IsDistinctFrom(x, m) => (x, m, true),
        _ => return None,
    };
    let ast::Expr::Function(f) = &**marker else {
        return None;
    };
    let is_marker = f
        .name
        .0
        .last()
        .and_then(|p| p.as_ident())
        .is_some_and(|i| i.value == crate::udf::IS_JSON_FN);
    if !is_marker {
        return None;
    }
    let kind = plain_args(f)?.into_iter().next()?;
    let test = call(crate::functions::names::IS_JSON, vec![(**x).clone(), kind]);
    Some(if negated {
        ast::Expr::UnaryOp {
            op: ast::UnaryOperator::Not,
            expr: Box::new(ast::Expr::Nested(Box::new(test))),
        }
    } else {
        test
    })
}

/// The unit a `TIMESTAMPADD`/`TIMESTAMPDIFF` argument names.
fn unit_of(e: &ast::Expr) -> Option<Unit> {
    match e {
        ast::Expr::Identifier(i) if i.quote_style.is_none() => Unit::parse(&i.value),
        _ => None,
    }
}

/// `err` at `span`'s start, when the span is known.
fn at(err: SqlError, span: sqlparser::tokenizer::Span) -> SqlError {
    if span.start.line > 0 {
        err.at(Location {
            line: span.start.line,
            column: span.start.column,
        })
    } else {
        err
    }
}

/// `FLOOR(t TO unit)` / `CEIL(t TO unit)` as Weir's unit rounding
/// (`flink_time`); `None` for any other expression (a numeric `FLOOR`
/// included).
fn round_to_unit(e: &ast::Expr) -> Option<Result<ast::Expr, SqlError>> {
    let (op, x, field) = match e {
        ast::Expr::Floor {
            expr,
            field: ast::CeilFloorKind::DateTimeField(f),
        } if *f != ast::DateTimeField::NoDateTime => (Op::Floor, expr, f),
        ast::Expr::Ceil {
            expr,
            field: ast::CeilFloorKind::DateTimeField(f),
        } if *f != ast::DateTimeField::NoDateTime => (Op::Ceil, expr, f),
        _ => return None,
    };
    let name = if op == Op::Floor { "FLOOR" } else { "CEIL" };
    Some(match Unit::parse(&field.to_string()) {
        Some(u) => Ok(call(op.udf_name(), vec![text(u.name()), (**x).clone()])),
        None => Err(at(
            SqlError::unsupported(format!("{name}(... TO {field}): the unit must be {}", Unit::ALL)),
            e.span(),
        )),
    })
}

/// The names of the functions Weir refuses, in the registry's order.
pub fn refused() -> impl Iterator<Item = &'static str> {
    FUNCTIONS
        .iter()
        .filter(|f| matches!(f.support, Support::Refused(_)))
        .map(|f| f.name)
}

/// `docs/sql.md`'s function table.
pub fn markdown_table() -> String {
    let mut out = String::from("| function | kind | Weir | notes |\n|---|---|---|---|\n");
    for f in FUNCTIONS {
        let kind = match f.kind {
            Kind::Scalar => "scalar",
            Kind::Aggregate => "aggregate",
            Kind::Window => "OVER",
        };
        let (support, why) = match f.support {
            Support::DataFusion => ("yes", ""),
            Support::Weir => ("yes (Weir's)", ""),
            Support::Refused(why) => ("no", why),
        };
        let note = [why, f.note]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("; ");
        out.push_str(&format!("| `{}` | {kind} | {support} | {note} |\n", f.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/sql.md` holds the table this registry generates.
    #[test]
    fn the_docs_table_is_the_registrys() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sql.md");
        let docs = std::fs::read_to_string(path).expect("docs/sql.md");
        let table = markdown_table();
        if std::env::var("WEIR_REWRITE").is_ok_and(|v| v == "1") {
            let (start, end) = ("<!-- functions:begin -->\n", "<!-- functions:end -->");
            let (a, b) = (
                docs.find(start).expect("begin marker"),
                docs.find(end).expect("end marker"),
            );
            let new = format!("{}{start}{table}{}", &docs[..a], &docs[b..]);
            std::fs::write(path, new).expect("write docs");
            return;
        }
        assert!(
            docs.contains(&table),
            "docs/sql.md's function table is stale: WEIR_REWRITE=1 cargo test -p weir-sql the_docs_table"
        );
    }

    #[test]
    fn names_are_unique_and_upper_case() {
        let mut names: Vec<&str> = FUNCTIONS.iter().map(|f| f.name).collect();
        assert!(names.iter().all(|n| n.chars().all(|c| !c.is_ascii_lowercase())));
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a function is listed twice");
    }
}
