//! What flows on a channel between subtasks. Data, event-time progress and
//! checkpoint barriers share one ordered stream, so an operator always sees
//! a watermark or barrier exactly between the batches it separates.

use crate::change::ChangeBatch;

/// Event time in epoch milliseconds, Flink's convention.
pub type Timestamp = i64;

/// Watermark that means "no more input": fires every window.
pub const MAX_WATERMARK: Timestamp = i64::MAX;
/// Watermark before any has been seen.
pub const MIN_WATERMARK: Timestamp = i64::MIN;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkStatus {
    Active,
    Idle,
}

/// A checkpoint barrier: every message before it belongs to checkpoint `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    pub checkpoint_id: u64,
    /// Trigger time (epoch ms) at the coordinator.
    pub timestamp: i64,
    pub kind: BarrierKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BarrierKind {
    #[default]
    Checkpoint,
    /// A savepoint: always aligned (no in-flight data in it). With `stop`
    /// the sources read nothing after it (they resume at the next barrier
    /// if the savepoint fails); with `drain` they first advance every
    /// watermark to the end, so every window and timer fires before it.
    Savepoint { stop: bool, drain: bool },
}

impl Barrier {
    pub fn is_savepoint(&self) -> bool {
        matches!(self.kind, BarrierKind::Savepoint { .. })
    }
}

#[derive(Debug, Clone)]
pub enum StreamMessage {
    /// Rows, with their row kinds when they are changes.
    Batch(ChangeBatch),
    /// All later rows on this channel have event time > the watermark.
    Watermark(Timestamp),
    WatermarkStatus(WatermarkStatus),
    Barrier(Barrier),
    /// The channel's producer finished; nothing follows.
    EndOfInput,
}
