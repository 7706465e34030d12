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
//! - [`functions`]: the registry of Flink's functions a query may call,
//!   and one file per family of the functions Weir implements itself.
//! - [`passes`]: rewrites of the logical plan into Flink's meaning
//!   (integer literals, casts to text, the session time zone).
//! - [`error`]: [`SqlError`] with the position of the problem.

pub mod ddl;
pub mod dialect;
pub mod error;
pub mod functions;
pub mod hints;
pub mod parser;
pub mod passes;
pub mod planner;
pub mod refusals;
pub mod rewrite;
pub mod types;
pub mod udf;

pub use error::{Location, SqlError};
pub use parser::{OnConflict, ParsedStatement, Statement, parse};
pub use planner::{Planner, QueryPlan};
