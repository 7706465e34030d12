//! # weir-sql
//!
//! Flink-style SQL in, streaming plans out.
//!
//! # Layout
//! - [`parser`]: splits a script into statements and parses them with
//!   sqlparser, extended for Weir's statements (`CREATE TABLE` with
//!   `WATERMARK FOR`, `SET`, `RESET`, `SHOW TABLES`, `DESCRIBE`, `EXPLAIN`).
//! - [`rewrite`]: AST rewrites before planning: window TVFs and legacy
//!   group windows into one internal form, views inlined, function names
//!   case-folded (Flink's functions are case-insensitive, identifiers not).
//! - [`dialect`]: the SQL dialect and the catalog's names for parsed objects.
//! - [`hints`]: query hints (`STATE_TTL`).
//! - [`refusals`]: what Weir refuses, each with Flink 2.3's answer.
//! - [`types`]: Flink SQL types ↔ Arrow types.
//! - [`ddl`]: `CREATE TABLE` → catalog [`weir_catalog::TableDef`].
//! - [`planner`]: DataFusion logical plans → [`weir_engine::plan::StreamGraph`].
//! - [`udf`]: the internal window marker function.
//! - [`flink_functions`]: functions where Flink's result differs from
//!   DataFusion's (`AVG` of integers), and Flink's own (`TYPEOF`).
//! - [`flink_bytes`]: `TO_BASE64`, `UNHEX`, `ENCODE`, `DECODE` on bytes.
//! - [`flink_cast`]: casts to strings write Flink's text.
//! - [`flink_clock`]: the clock functions (per batch) and `RAND` as Java's `Random`.
//! - [`flink_collect`]: `COLLECT`, a group's values as a MULTISET.
//! - [`flink_arrays`]: the `ARRAY_*` functions with Flink's NULL rules and orders.
//! - [`flink_collections`]: `ELEMENT` and `ARRAY_CONTAINS` as Flink answers them.
//! - [`flink_json`]: the `JSON_*` functions with Flink's defaults.
//! - [`flink_math`]: `SIGN` and `TRUNCATE` typed as their argument.
//! - [`flink_moments`]: `VAR_*` and `STDDEV_*`.
//! - [`flink_printf`]: `PRINTF` as `java.util.Formatter` writes it.
//! - [`flink_time`]: `TIMESTAMPADD`, `TIMESTAMPDIFF`, `FLOOR`/`CEIL` to a unit.
//! - [`flink_zone`]: a `table.local-time-zone` other than UTC.
//! - [`flink_maps`]: `MAP[...]` and `STR_TO_MAP` as Flink builds maps.
//! - [`flink_decimal`]: DECIMAL `+ - * /` with Flink's result types and HALF_UP rounding.
//! - [`flink_literals`]: integer literals are `INT` when they fit, as in Flink.
//! - [`flink_scalars`]: Flink's string and time functions DataFusion lacks.
//! - [`functions`]: the registry of Flink's functions a query may call.
//! - [`error`]: [`SqlError`] with the position of the problem.

pub mod ddl;
pub mod dialect;
pub mod error;
pub mod flink_arrays;
pub mod flink_bytes;
pub mod flink_cast;
pub mod flink_clock;
pub mod flink_collect;
pub mod flink_collections;
pub mod flink_decimal;
pub mod flink_functions;
pub mod flink_json;
pub mod flink_literals;
pub mod flink_maps;
pub mod flink_math;
pub mod flink_moments;
pub mod flink_printf;
pub mod flink_scalars;
pub mod flink_time;
pub mod flink_zone;
pub mod functions;
pub mod hints;
pub mod parser;
pub mod planner;
pub mod refusals;
pub mod rewrite;
pub mod types;
pub mod udf;

pub use error::{Location, SqlError};
pub use parser::{OnConflict, ParsedStatement, Statement, parse};
pub use planner::{Planner, QueryPlan};
