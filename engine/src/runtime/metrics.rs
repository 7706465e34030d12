//! Counters a running job exposes (rows in/out per node, late rows).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

#[derive(Debug)]
pub struct NodeMetrics {
    pub name: String,
    pub rows_in: AtomicU64,
    pub rows_out: AtomicU64,
    pub late_rows_dropped: AtomicU64,
    /// Records a source node set aside for its dead-letter directory. A
    /// restored attempt re-reads from its checkpoint, so records set aside
    /// after it are counted again (as rows are); the files hold them once.
    pub dead_letters: AtomicU64,
    /// Records a source node skipped because they did not parse
    /// (`*.ignore-parse-errors`), counted as rows are.
    pub skipped_records: AtomicU64,
    /// Highest output watermark of any subtask of the node.
    pub watermark: AtomicI64,
    /// Live keyed state of the node, in bytes (keys + values), all
    /// subtasks: each subtask's `KeyedState` counts into it.
    pub state_bytes: Arc<AtomicI64>,
    /// Highest event time the node has put into state.
    pub max_event_time: AtomicI64,
    /// The most state the node held per second of event time (bytes/s,
    /// estimated over all subtasks), kept after the job ends.
    pub peak_state_rate: AtomicI64,
    /// The widest event time any subtask's state spanned (ms, its newest
    /// row's time minus its watermark), kept after the job ends: what
    /// watermark alignment bounds (by the group's max drift).
    pub peak_state_span_ms: AtomicI64,
    /// Time the node's subtasks waited to send to a full downstream
    /// channel (ns, summed): back-pressure from downstream.
    pub backpressured_ns: Arc<AtomicU64>,
}

impl NodeMetrics {
    pub fn new(name: String) -> Self {
        Self {
            name,
            rows_in: AtomicU64::new(0),
            rows_out: AtomicU64::new(0),
            late_rows_dropped: AtomicU64::new(0),
            dead_letters: AtomicU64::new(0),
            skipped_records: AtomicU64::new(0),
            watermark: AtomicI64::new(i64::MIN),
            state_bytes: Arc::new(AtomicI64::new(0)),
            max_event_time: AtomicI64::new(i64::MIN),
            peak_state_rate: AtomicI64::new(0),
            peak_state_span_ms: AtomicI64::new(0),
            backpressured_ns: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl JobMetrics {
    /// How far the job's bounded sources are: (done, total) over every
    /// split of every source, when each knows where it ends (`None` when
    /// one does not, or before the sources published their splits).
    pub fn progress(&self) -> Option<(u64, u64)> {
        let mut sum = (0u64, 0u64);
        let mut any = false;
        for s in &self.sources {
            let (splits, _) = s.snapshot();
            for split in splits {
                let (done, total) = split.progress?;
                sum = (sum.0.saturating_add(done.min(total)), sum.1.saturating_add(total));
                any = true;
            }
        }
        any.then_some(sum)
    }
}

#[derive(Debug, Default)]
pub struct JobMetrics {
    pub nodes: Vec<Arc<NodeMetrics>>,
    /// One per source subtask.
    pub sources: Vec<Arc<SourceStatus>>,
    /// The job's watermark alignment groups.
    pub groups: Vec<Arc<crate::runtime::alignment::AlignmentCoordinator>>,
    /// Checkpoint history (SHOW CHECKPOINTS).
    pub checkpoints: Arc<crate::checkpoint::coordinator::CheckpointLog>,
    /// What the job is doing now and since when (SHOW JOBS).
    pub lifecycle: JobLifecycle,
}

/// A job's state as users see it (Flink's names where they exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Running,
    /// Failed; waiting to restart from its latest checkpoint.
    Restarting,
    Finished,
    /// Stopped by `STOP JOB` (final checkpoint taken).
    Stopped,
    /// Stopped by its server's shutdown; the server resumes it on start.
    Suspended,
    Canceled,
    Failed(String),
}

impl JobState {
    pub fn name(&self) -> &'static str {
        match self {
            JobState::Running => "RUNNING",
            JobState::Restarting => "RESTARTING",
            JobState::Finished => "FINISHED",
            JobState::Stopped => "STOPPED",
            JobState::Suspended => "SUSPENDED",
            JobState::Canceled => "CANCELED",
            JobState::Failed(_) => "FAILED",
        }
    }

    pub fn is_terminal(&self) -> bool {
        !matches!(self, JobState::Running | JobState::Restarting)
    }
}

#[derive(Debug)]
pub struct JobLifecycle {
    /// Wall-clock start of the job (ms since the epoch).
    pub started_ms: i64,
    state: tokio::sync::watch::Sender<JobState>,
}

impl JobLifecycle {
    pub fn new() -> Self {
        Self {
            started_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            state: tokio::sync::watch::Sender::new(JobState::Running),
        }
    }

    /// The lifecycle of a job that started at `started_ms` (one known
    /// from a record, not run here).
    pub fn started_at(started_ms: i64) -> Self {
        Self {
            started_ms,
            ..Self::new()
        }
    }

    pub fn state(&self) -> JobState {
        self.state.borrow().clone()
    }

    /// Sees every state change (e.g. to wait for the job to end).
    pub fn watch(&self) -> tokio::sync::watch::Receiver<JobState> {
        self.state.subscribe()
    }

    /// Sets the state unless the job already reached a terminal one (a
    /// cancel is not overwritten by the aborted supervisor).
    pub fn set(&self, state: JobState) {
        self.state.send_if_modified(|s| {
            if s.is_terminal() || *s == state {
                return false;
            }
            *s = state;
            true
        });
    }
}

impl Default for JobLifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl JobMetrics {
    /// The slowest source reader's watermark (ms), if every reader has one.
    pub fn source_watermark(&self) -> Option<i64> {
        let wms: Vec<i64> = self.sources.iter().map(|s| s.snapshot().1).collect();
        let min = wms.iter().copied().min()?;
        (min != i64::MIN).then_some(min)
    }

    pub fn late_rows_dropped(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.late_rows_dropped.load(Ordering::Relaxed))
            .sum()
    }

    /// Records the job's sources set aside as dead letters.
    pub fn dead_letters(&self) -> u64 {
        self.nodes.iter().map(|n| n.dead_letters.load(Ordering::Relaxed)).sum()
    }

    /// One line per node: `name: in N, out M[, late L][, dead letters D]`.
    pub fn summary(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let late = n.late_rows_dropped.load(Ordering::Relaxed);
                let dead = n.dead_letters.load(Ordering::Relaxed);
                format!(
                    "{}: in {}, out {}{}{}",
                    n.name,
                    n.rows_in.load(Ordering::Relaxed),
                    n.rows_out.load(Ordering::Relaxed),
                    if late > 0 {
                        format!(", late dropped {late}")
                    } else {
                        String::new()
                    },
                    if dead > 0 {
                        format!(", dead letters {dead}")
                    } else {
                        String::new()
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitState {
    Active,
    Idle,
    Paused,
    /// Readable, but the reader waits for downstream to take its output.
    BackPressured,
    Finished,
}

impl SplitState {
    pub fn as_str(&self) -> &'static str {
        match self {
            SplitState::Active => "active",
            SplitState::Idle => "idle",
            SplitState::Paused => "paused-by-alignment",
            SplitState::BackPressured => "back-pressured",
            SplitState::Finished => "finished",
        }
    }
}

/// One split as its reader last saw it.
#[derive(Debug, Clone)]
pub struct SplitStatus {
    pub split: String,
    pub watermark: i64,
    pub state: SplitState,
    pub paused: std::time::Duration,
    pub offset: u64,
    /// (done, total) when the split knows where it ends
    /// ([`crate::connectors::SourceSplit::progress`]).
    pub progress: Option<(u64, u64)>,
}

/// What one source subtask publishes about its splits (SHOW WATERMARKS).
#[derive(Debug)]
pub struct SourceStatus {
    pub table: String,
    pub subtask: usize,
    pub group: Option<String>,
    inner: std::sync::Mutex<(Vec<SplitStatus>, i64)>,
}

impl SourceStatus {
    pub fn new(table: String, subtask: usize, group: Option<String>) -> Self {
        Self {
            table,
            subtask,
            group,
            inner: std::sync::Mutex::new((vec![], i64::MIN)),
        }
    }

    pub fn publish(&self, splits: Vec<SplitStatus>, reader_watermark: i64) {
        if let Ok(mut g) = self.inner.lock() {
            *g = (splits, reader_watermark);
        }
    }

    /// (splits, the reader's output watermark).
    pub fn snapshot(&self) -> (Vec<SplitStatus>, i64) {
        self.inner.lock().map(|g| g.clone()).unwrap_or_default()
    }
}
