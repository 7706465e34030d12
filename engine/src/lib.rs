//! # weir-engine
//!
//! Runs streaming plans: a [`plan::StreamGraph`] becomes subtasks (tokio
//! tasks) joined by bounded channels that carry Arrow batches, watermarks and
//! barriers in-band.
//!
//! # Layout
//! - [`change`]: change batches (rows with Flink's row kinds).
//! - [`message`]: what flows on a channel ([`message::StreamMessage`]).
//! - [`plan`]: immutable plan descriptions (`...Node`) and `EXPLAIN` text.
//! - [`config`]: job options (`parallelism.default`, `state.backend.type`, ...).
//! - [`keygroup`]: stable key hashing and key-group → subtask assignment.
//! - [`runtime`]: deployment, the subtask loop, input gates (watermark
//!   valve), partitioned outputs, job handles and metrics.
//! - [`operators`]: one operator per file (calc, window aggregate, limit,
//!   sinks) behind the [`operators::Operator`] trait.
//! - [`connectors`]: split-based sources (nexmark, datagen, filesystem) with
//!   per-split watermark generation, and sinks (print, blackhole,
//!   filesystem, collect).
//! - [`checkpoint`]: barrier checkpoints: coordinator, storage layout and
//!   `_metadata`, incremental RocksDB uploads, restore with fallback.
//! - [`state`]: the [`state::StateBackend`] trait, RocksDB and heap backends.
//! - [`error`]: [`error::ExecError`] and friends.
//! - [`expr`]: faster physical expressions swapped in after planning.
//! - [`multiset`]: Flink's `MULTISET<T>` as an Arrow map element → count.

pub mod change;
pub mod checkpoint;
pub mod config;
pub mod connectors;
pub mod error;
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
pub mod uid;

pub use error::ExecError;
