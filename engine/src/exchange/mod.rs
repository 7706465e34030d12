//! The network exchange between worker processes (issue 42): what flows
//! on a channel between subtasks, carried between processes.
//!
//! - [`frame`]: the wire form of every [`crate::message::StreamMessage`]
//!   (Arrow IPC batches with row kinds, watermarks, status, barriers, end
//!   of input) and of credits.
//! - [`link`]: one TCP connection per worker pair, many logical channels
//!   on it, each with credit-based flow control.
//! - [`bridge`]: a remote channel joined to the bounded in-memory channels
//!   operators and input gates use (a forwarding task on each side).
//! - [`mesh`]: a worker's links to all the others (one per pair), joined
//!   in any start order, refusing a worker of another plan.
//!
//! - [`workers`]: the job's workers (index, peers, TLS) and joining them.
//! - [`tls`]: mutual TLS on the links.
//! - [`control`]: the control plane between worker 0 (the job's
//!   coordinator) and the others.
//!
//! `runtime::cluster` and `runtime::job` put them to work for
//! `weir worker`.

pub mod bridge;
pub mod control;
pub mod frame;
pub mod link;
pub mod mesh;
pub mod tls;
pub mod workers;
