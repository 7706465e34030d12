//! # weir
//!
//! The session facade every front end uses, and the front ends.
//!
//! # Layout
//! - [`session`]: [`session::Session`]: executes statements against the
//!   catalog and starts jobs. The REPL, `weir run` and tests all go
//!   through `Session::execute`.
//! - [`access`]: users, roles and masked secret options.
//! - [`display`]: rendering results as text (tableau and `+I[...]` rows).
//! - [`cli`]: the `weir` binary: REPL, `run FILE.sql`, `-c`, stdin scripts,
//!   `serve`.
//! - [`shell`]: what the local and the remote shell share (exit codes,
//!   signals, error printing, the live table).
//! - [`server`]: `weir serve`, Arrow Flight SQL over a session.
//! - [`bench`]: `weir bench nexmark`, the Nexmark harness.
//! - [`exchange_bench`]: `weir bench exchange`, the network exchange over loopback.
//! - [`watermarks`]: the rows of `SHOW WATERMARKS FOR JOB`.
//! - [`k8s`]: `weir k8s manifests`, Kubernetes manifests for `weir worker` pods.

pub mod access;
pub mod backfill;
pub mod bench;
pub mod cli;
pub mod compare;
pub mod display;
pub mod exchange_bench;
pub mod final_table;
pub mod jobs;
pub mod k8s;
pub mod remote;
pub mod server;
pub mod session;
pub mod shell;
pub mod show_create;
pub mod watermarks;

pub use session::{ResultStream, Session, SessionError, StatementResult};
