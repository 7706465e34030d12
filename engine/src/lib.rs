//! # weir-engine
//!
//! Runs streaming plans: a [`plan::StreamGraph`] becomes subtasks (tokio
//! tasks) joined by bounded channels that carry Arrow batches, watermarks and
//! barriers in-band.
//!
//! # Layout
//! - [`change`]: change batches (rows with Flink's row kinds).
//! - [`message`]: what flows on a channel ([`message::StreamMessage`]).
//! - [`plan`]: immutable plan descriptions (`...Node`), the
//!   [`plan::PlanNode`] trait each node kind answers beside its operator,
//!   and `EXPLAIN` text.
//! - [`uid`]: stable operator uids, and [`uid::graph`], the one way to
//!   build a [`plan::StreamGraph`]; [`canonical`]: the canonical text of
//!   expressions uids are made of.
//! - [`config`]: job options (`parallelism.default`, `state.backend.type`, ...).
//! - [`keygroup`]: stable key hashing and key-group → subtask assignment.
//! - [`runtime`]: deployment, the subtask loop, input gates (watermark
//!   valve), partitioned outputs, job handles and metrics.
//! - [`operators`]: one operator per file behind the
//!   [`operators::Operator`] trait, each with its `build` constructor
//!   (given an [`operators::build::BuildCtx`]).
//! - [`connectors`]: split-based sources (nexmark, datagen, filesystem,
//!   kafka) with per-split watermark generation, and sinks (print,
//!   blackhole, filesystem, kafka) as [`connectors::SinkWriter`]s.
//! - [`checkpoint`]: barrier checkpoints: coordinator, storage layout and
//!   `_metadata`, incremental RocksDB uploads, restore with fallback,
//!   two-phase commits.
//! - [`state`]: the [`state::StateBackend`] trait, RocksDB and heap backends.
//! - [`error`]: [`error::ExecError`] and friends.
//! - [`expr`]: faster physical expressions swapped in after planning.
//! - [`multiset`]: Flink's `MULTISET<T>` as an Arrow map element → count.
//! - [`java_text`]: values as Java's `toString` writes them (the `print`
//!   connector's text).
//! - [`time_zone`]: the session time zone and zone arguments;
//!   [`time_format`]: Java date patterns as chrono layouts.
//! - [`paths`]: the directories a job's SQL may read or write.
//! - [`failpoint`]: named failpoints for crash and fault tests.

pub mod batch;
pub mod canonical;
pub mod change;
pub mod checkpoint;
pub mod clock;
pub mod config;
pub mod connectors;
pub mod error;
pub mod exchange;
pub mod expr;
pub mod failpoint;
pub mod java_text;
pub mod keygroup;
pub mod message;
pub mod multiset;
pub mod operators;
pub mod paths;
pub mod plan;
pub mod runtime;
pub mod state;
pub mod time_format;
pub mod time_zone;
pub mod type_names;
pub mod uid;

pub use error::ExecError;
