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
//! Not wired into jobs yet: a job still runs in one process, its channels
//! in-memory. The next step is `weir worker`: the same plan on every
//! worker, each running its subtasks, and a bridge for every channel whose
//! ends are on different workers.

pub mod bridge;
pub mod frame;
pub mod link;
pub mod mesh;
