//! The network exchange between worker processes (issue 42): what flows
//! on a channel between subtasks, carried between processes.
//!
//! - [`frame`]: the wire form of every [`crate::message::StreamMessage`]
//!   (Arrow IPC batches with row kinds, watermarks, status, barriers, end
//!   of input) and of credits.
//! - [`link`]: one TCP connection per worker pair, many logical channels
//!   on it, each with credit-based flow control.
//!
//! Not wired into the runtime yet: a job still runs in one process, its
//! channels in-memory. The next step bridges a remote channel to the
//! bounded in-memory channels operators already use (a forwarding task
//! per remote channel on each side), so operators, gates and barriers
//! stay as they are.

pub mod frame;
pub mod link;
