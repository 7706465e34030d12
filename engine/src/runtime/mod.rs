//! Deploys a [`crate::plan::StreamGraph`] as tokio tasks and runs it.
//!
//! - [`job`]: chaining, channels, subtask creation, the [`job::JobHandle`].
//! - [`source_task`]: source readers (splits, watermarks, idleness).
//! - [`task`]: the loop of every other subtask.
//! - [`alignment`]: watermark alignment groups (coordinator, split pause policy).
//! - [`chain`]: forward-connected operators in one task.
//! - [`gate`]: input gate and watermark valve.
//! - [`output`]: partitioning to downstream subtasks.
//! - [`metrics`] — counters and the state sources publish.
//! - [`cluster`]: a job spread over worker processes (placement, the
//!   workers' side of checkpoints).

pub mod alignment;
pub mod chain;
pub mod cluster;
pub mod enumerator;
pub mod gate;
pub mod job;
pub mod metrics;
pub mod output;
pub mod restart;
pub mod resume;
pub mod source_task;
pub mod task;

pub use job::{JobController, JobHandle, JobOutcome, SavepointMode, deploy};
