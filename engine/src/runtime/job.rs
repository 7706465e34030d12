//! Turning a plan into running subtasks, and keeping it running.
//!
//! Nodes joined by chainable forward edges form one chain; each chain runs
//! as `parallelism` subtasks. Between chains, every upstream subtask has a
//! bounded channel to every downstream subtask it can send to, so a slow
//! consumer back-pressures its producers.
//!
//! A job runs in attempts. With checkpointing on, an attempt has a
//! checkpoint coordinator; when a task fails, the restart strategy starts
//! a new attempt from the latest completed checkpoint. A job that starts
//! where a previous run of the same name neither finished nor was stopped
//! (the process died) resumes from that run's latest checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::DataType;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::checkpoint::coordinator::CoordinatorEvent;
use crate::checkpoint::coordinator::{CheckpointLog, SavepointQueue, commit_all};
use crate::checkpoint::savepoint::{SavepointDone, SavepointRequest};
use crate::checkpoint::{
    CheckpointCoordinator, CheckpointError, CheckpointStorage, Fence, RestoredJob, SplitPosition, TaskCheckpointing,
    restore_latest_from,
};
use crate::config::{JobConfig, RestartStrategy, sanitize};
use crate::connectors::dead_letter::DeadLetterWriter;
use crate::connectors::{Committer, SinkContext};
use crate::error::{ExecError, Result};
use crate::exchange::control::Control;
use crate::exchange::mesh::Mesh;
use crate::keygroup::KeyEncoder;
use crate::message::StreamMessage;
use crate::operators::Operator;
use crate::plan::{Exchange, NodeId, NodeKind, StreamGraph};
use crate::runtime::alignment::AlignmentCoordinator;
use crate::runtime::chain::Chain;
use crate::runtime::cluster::{self, Cluster, ReportWriter};
use crate::runtime::gate::{BarrierMode, InputGate};
use crate::runtime::metrics::{JobMetrics, JobState, NodeMetrics, SourceStatus};
use crate::runtime::output::{Output, Partitioner};
use crate::runtime::source_task::{EmitStrategy, ReaderAlignment, SourceTask};
use crate::runtime::task::OperatorTask;
use std::pin::Pin;

/// Which input channels of each (chain, subtask) start idle: those from a
/// source subtask with a watermark and no split, and from a task all of
/// whose inputs start idle. Such a subtask says it is idle anyway once it
/// runs; known from the start, a gate does not count on a watermark from
/// it meanwhile, so rows from the other channels meet the same watermark
/// whenever that message would have arrived (at p4 over one file, the late
/// rows a window drops were otherwise a race with three empty readers).
/// A source's splits dealt to its subtasks, and every split id.
type DealtSplits = (
    Vec<Vec<Box<dyn crate::connectors::SourceSplit>>>,
    std::collections::BTreeSet<String>,
);

fn starting_idle(
    graph: &StreamGraph,
    chains: &[Vec<NodeId>],
    has_splits: &[Vec<bool>],
    origins: &[Vec<Vec<(usize, usize)>>],
) -> Vec<Vec<Vec<bool>>> {
    let mut task_idle: Vec<Vec<bool>> = chains
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            let head = graph.node(c[0]);
            (0..head.parallelism)
                .map(|t| match &head.kind {
                    NodeKind::Source(src) => src.watermark.is_some() && has_splits[ci].get(t).is_some_and(|has| !has),
                    _ => false,
                })
                .collect()
        })
        .collect();
    // Least fixpoint over the chain graph (a DAG): a task starts idle when
    // every input does.
    for _ in 0..chains.len() {
        let mut changed = false;
        for (ci, c) in chains.iter().enumerate() {
            if matches!(graph.node(c[0]).kind, NodeKind::Source(_)) {
                continue;
            }
            for t in 0..task_idle[ci].len() {
                let ins = &origins[ci][t];
                let idle = !ins.is_empty() && ins.iter().all(|&(c, s)| task_idle[c][s]);
                if idle != task_idle[ci][t] {
                    task_idle[ci][t] = idle;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    origins
        .iter()
        .map(|subtasks| {
            subtasks
                .iter()
                .map(|ins| ins.iter().map(|&(c, s)| task_idle[c][s]).collect())
                .collect()
        })
        .collect()
}

/// Messages buffered per channel before the sender waits.
const CHANNEL_CAPACITY: usize = 8;

/// How long `cancel` waits for the tasks to be gone before it aborts.
const CANCEL_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct JobOutcome {
    pub elapsed: std::time::Duration,
    pub metrics: Arc<JobMetrics>,
}

/// A running job. Dropping it does not stop the job; call `stop` or
/// `cancel`.
pub struct JobHandle {
    pub name: String,
    pub metrics: Arc<JobMetrics>,
    /// The checkpoint the job started from: (id, path, newer checkpoints
    /// skipped as unusable).
    pub restored_from: Option<(u64, PathBuf, Vec<String>)>,
    stop: Arc<watch::Sender<bool>>,
    job_dir: PathBuf,
    checkpointing: bool,
    done: tokio::task::JoinHandle<Result<JobOutcome>>,
    savepoints: mpsc::UnboundedSender<SavepointRequest>,
    /// Where savepoints go when no directory is given.
    savepoint_dir: PathBuf,
    /// What a stop or cancel does to the job's checkpoints.
    retention: Arc<Retention>,
    /// Cancels the running attempt, which ends once every task is gone.
    cancel: Arc<watch::Sender<bool>>,
}

/// `execution.checkpointing.externalized-checkpoint-retention` of a job.
#[derive(Debug, Clone)]
struct Retention {
    storage: Option<CheckpointStorage>,
    retain: bool,
    /// This run's hold on the checkpoints (with checkpointing on).
    fence: Option<Arc<Fence>>,
    /// The run status is kept beside the checkpoints wherever they are (a
    /// job over workers: they are the one place every worker reads).
    shared: bool,
    /// The run's end is recorded: the first end stands (a suspend asked
    /// for just as the job finished must not turn FINISHED into a run to
    /// resume).
    ended: Arc<std::sync::atomic::AtomicBool>,
}

impl Retention {
    /// The checkpoint storage when it is on an object store (where the
    /// run status is kept too).
    fn remote(&self) -> Option<&CheckpointStorage> {
        self.storage.as_ref().filter(|s| self.shared || s.on_object_store())
    }

    /// Ends this run's hold on the checkpoints (see [`Fence::seal`]):
    /// `false` when a newer run of the job took them over, and then this
    /// run must leave their status and files alone.
    fn seal(&self, job: &str, status: RunStatus) -> bool {
        let Some(fence) = &self.fence else { return true };
        match fence.seal(status.as_str()) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(target: "weir::checkpoint", "job '{job}': {e}; its status and checkpoints are left as they are");
                false
            }
        }
    }

    /// Records how the run ended (after sealing it): `apply` its
    /// retention too (stopped or cancelled).
    fn end(&self, job: &str, job_dir: &Path, status: RunStatus, apply: bool) -> Result<()> {
        if self.ended.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        if !self.seal(job, status) {
            return Ok(());
        }
        status.write(job_dir, self.remote())?;
        if apply {
            self.apply(job);
        }
        Ok(())
    }

    /// The job was stopped or cancelled: its checkpoints go, or are moved
    /// aside (`retained-<ms>/` below the job's checkpoint directory, where
    /// no later run's cleanup reaches) to be restored by path.
    fn apply(&self, job: &str) {
        let Some(storage) = &self.storage else { return };
        // Only this run's ids and older: a run that claimed the job after
        // this one sealed has ids above them.
        let bound = self.fence.as_ref().map(|f| f.high_water());
        if !self.retain {
            if let Err(e) = storage.clear(bound) {
                tracing::warn!(target: "weir::checkpoint", "job '{job}': could not delete its checkpoints: {e}");
            }
            return;
        }
        match storage.retain_aside(chrono::Utc::now().timestamp_millis(), bound) {
            Ok(Some(dir)) => tracing::info!(
                target: "weir::checkpoint",
                "job '{job}': checkpoints retained in {} (restore one with SET 'execution.state-recovery.path')",
                dir.display()
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!(target: "weir::checkpoint", "job '{job}': could not retain its checkpoints: {e}"),
        }
    }
}

/// How a savepoint ends the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavepointMode {
    /// The job keeps running (`SAVEPOINT JOB`).
    Keep,
    /// `STOP JOB ... WITH SAVEPOINT`.
    Stop,
    /// `STOP JOB ... WITH SAVEPOINT DRAIN`.
    StopDrain,
}

/// Asks a job to stop; can be kept while the handle is awaited.
#[derive(Clone)]
pub struct JobStopper(Arc<watch::Sender<bool>>);

/// Stops a job or takes its savepoints, without holding its handle.
#[derive(Clone)]
pub struct JobController {
    name: String,
    stop: Arc<watch::Sender<bool>>,
    savepoints: mpsc::UnboundedSender<SavepointRequest>,
    savepoint_dir: PathBuf,
    checkpointing: bool,
    checkpoints: Arc<CheckpointLog>,
    retention: Arc<Retention>,
    job_dir: PathBuf,
}

impl JobController {
    /// Records that the job was suspended (a worker's pod going away,
    /// after [`Self::checkpoint_now`]): the run that resumes it does not
    /// count a failure, and this run publishes nothing more.
    pub async fn mark_suspended(&self) -> Result<()> {
        if !self.checkpointing {
            return Ok(());
        }
        let (retention, name, dir) = (self.retention.clone(), self.name.clone(), self.job_dir.clone());
        tokio::task::spawn_blocking(move || retention.end(&name, &dir, RunStatus::Suspended, false))
            .await
            .map_err(|e| ExecError::internal(format!("recording the suspend failed: {e}")))?
    }

    /// Whether the job checkpoints.
    pub fn checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// Takes a checkpoint now and answers whether one completed within
    /// `within` (never without checkpointing). For a worker's suspend: the
    /// restarted workers resume from it and replay nothing before it.
    pub async fn checkpoint_now(&self, within: Duration) -> bool {
        if !self.checkpointing {
            return false;
        }
        let mut completed = self.checkpoints.completed_total.subscribe();
        let before = *completed.borrow_and_update();
        self.checkpoints.trigger_now.notify_one();
        matches!(
            tokio::time::timeout(within, completed.wait_for(|n| *n > before)).await,
            Ok(Ok(_))
        )
    }

    /// A job over workers: asks worker 0 to suspend the job (see
    /// [`Control::Suspend`]); on worker 0, makes [`Self::suspend_requested`]
    /// answer.
    pub fn request_suspend(&self) {
        self.checkpoints.suspend.send_replace(true);
    }

    /// Answers once a worker asked to suspend the job.
    pub async fn suspend_requested(&self) {
        let mut rx = self.checkpoints.suspend.subscribe();
        if rx.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The directory a savepoint goes to when none is given:
    /// `<savepoint-dir>/savepoint-<12 hex digits>`.
    pub fn default_savepoint_path(&self) -> PathBuf {
        let id = format!("{:012x}", chrono::Utc::now().timestamp_micros() & 0xffff_ffff_ffff);
        self.savepoint_dir.join(format!("savepoint-{id}"))
    }

    /// Takes a savepoint into `dir` (default: [`Self::default_savepoint_path`])
    /// and with `Stop*` stops the job at it. Answers once it is complete;
    /// an error leaves the job running.
    pub async fn savepoint(&self, dir: Option<PathBuf>, mode: SavepointMode) -> Result<SavepointDone> {
        if !self.checkpointing {
            return Err(ExecError::Config(format!(
                "job '{}' runs without checkpointing, and savepoints are taken by checkpoint barriers: \
                 SET 'execution.checkpointing.interval' before its INSERT",
                self.name
            )));
        }
        let dir = dir.unwrap_or_else(|| self.default_savepoint_path());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = SavepointRequest {
            dir,
            stop: mode != SavepointMode::Keep,
            drain: mode == SavepointMode::StopDrain,
            reply: tx,
        };
        let gone = || ExecError::Config(format!("job '{}' is no longer running", self.name));
        self.savepoints.send(req).map_err(|_| gone())?;
        let done = rx.await.map_err(|_| gone())?.map_err(ExecError::Checkpoint)?;
        if mode != SavepointMode::Keep {
            let _ = self.stop.send(true);
        }
        Ok(done)
    }
}

impl JobStopper {
    pub fn stop(&self) {
        let _ = self.0.send(true);
    }
}

impl JobHandle {
    /// Asks sources to stop reading; the job then drains and ends without
    /// firing windows on partial input.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// The job ended (finished, stopped, failed or cancelled).
    pub fn is_finished(&self) -> bool {
        self.done.is_finished()
    }

    /// Ends the job to be resumed by the next run of the same job (a
    /// server shutdown). With checkpointing: asks for a checkpoint now,
    /// waits for it (at most `within`), then aborts the job; the next run
    /// restores the latest completed checkpoint, and output after it, never
    /// committed, is produced again (exactly once either way). Without
    /// checkpointing the job is stopped and the next run starts afresh.
    pub async fn suspend(mut self, within: Duration) -> Result<()> {
        if *self.stop.borrow() {
            // STOP JOB is draining it: let it end as stopped, but not wait
            // forever (a RUNNING status then resumes it next time).
            return match tokio::time::timeout(within, &mut self.done).await {
                Ok(Ok(r)) => r.map(|_| ()),
                Ok(Err(e)) => Err(ExecError::internal(format!("job task failed: {e}"))),
                Err(_) => {
                    self.done.abort();
                    Err(ExecError::internal(format!(
                        "did not finish stopping within {within:?}"
                    )))
                }
            };
        }
        if !self.checkpointing {
            self.metrics.lifecycle.set(JobState::Suspended);
            self.stop();
            return match tokio::time::timeout(within, self.wait()).await {
                Ok(r) => r.map(|_| ()),
                Err(_) => Err(ExecError::internal(format!("did not drain within {within:?}"))),
            };
        }
        let log = self.metrics.checkpoints.clone();
        let mut completed = log.completed_total.subscribe();
        let before = *completed.borrow_and_update();
        log.trigger_now.notify_one();
        tokio::select! {
            r = tokio::time::timeout(within, completed.wait_for(|n| *n > before)) => {
                if !matches!(r, Ok(Ok(_))) {
                    tracing::warn!(
                        "job '{}': no checkpoint completed within {within:?}; suspending at the previous one",
                        self.name
                    );
                }
            }
            r = &mut self.done => {
                // It ended on its own meanwhile.
                return match r {
                    Ok(r) => r.map(|_| ()),
                    Err(e) => Err(ExecError::internal(format!("job task failed: {e}"))),
                };
            }
        }
        self.done.abort();
        match (&mut self.done).await {
            // Aborted: it resumes from that checkpoint next time.
            Err(e) if e.is_cancelled() => {
                self.metrics.lifecycle.set(JobState::Suspended);
                self.retention
                    .end(&self.name, &self.job_dir, RunStatus::Suspended, false)?;
                Ok(())
            }
            // It ended on its own just before: that ending stands.
            Ok(r) => r.map(|_| ()),
            Err(e) => Err(ExecError::internal(format!("job task failed: {e}"))),
        }
    }

    /// Ends the job at once: no drain, no final checkpoint. Its completed
    /// checkpoints stay on disk, but the next run starts afresh (Flink's
    /// cancel).
    pub async fn cancel(mut self) -> Result<()> {
        self.metrics.lifecycle.set(JobState::Canceled);
        // The attempt aborts its tasks and waits until every one is gone
        // (their state closed): a new run of the job may then open the
        // same state at once. Bounded, in case a task never yields.
        let _ = self.cancel.send(true);
        if tokio::time::timeout(CANCEL_WAIT, &mut self.done).await.is_err() {
            self.done.abort();
            let _ = (&mut self.done).await;
        }
        if self.checkpointing {
            self.retention
                .end(&self.name, &self.job_dir, RunStatus::Canceled, true)?;
        }
        Ok(())
    }

    /// Takes a savepoint (see [`JobController::savepoint`]).
    pub async fn savepoint(&self, dir: Option<PathBuf>, mode: SavepointMode) -> Result<SavepointDone> {
        self.controller().savepoint(dir, mode).await
    }

    /// What controls the job from elsewhere (a session, a signal handler).
    pub fn controller(&self) -> JobController {
        JobController {
            name: self.name.clone(),
            stop: self.stop.clone(),
            savepoints: self.savepoints.clone(),
            savepoint_dir: self.savepoint_dir.clone(),
            checkpointing: self.checkpointing,
            checkpoints: self.metrics.checkpoints.clone(),
            retention: self.retention.clone(),
            job_dir: self.job_dir.clone(),
        }
    }

    pub fn stopper(&self) -> JobStopper {
        JobStopper(self.stop.clone())
    }

    pub async fn wait(self) -> Result<JobOutcome> {
        match self.done.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Err(ExecError::Cancelled),
            Err(e) => Err(ExecError::internal(format!("job task panicked: {e}"))),
        }
    }
}

/// Builds the chains: for each chain head, the node ids in chain order.
fn chains(graph: &StreamGraph) -> Vec<Vec<NodeId>> {
    let mut out = vec![];
    for node in &graph.nodes {
        let chained_in = graph.inputs(node.id).any(|e| graph.is_chained(e));
        if chained_in {
            continue;
        }
        let mut chain = vec![node.id];
        let mut cur = node.id;
        while let Some(e) = graph.outputs(cur).find(|e| graph.is_chained(e)) {
            chain.push(e.to);
            cur = e.to;
        }
        out.push(chain);
    }
    out
}

/// How a job's last run ended, kept in `<job dir>/status`. A run that did
/// not end (RUNNING) died with its process: the next run resumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Finished,
    Stopped,
    /// Stopped by a server shutdown: the next run resumes it.
    Suspended,
    Canceled,
    Failed,
}

impl RunStatus {
    fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Running => "RUNNING",
            RunStatus::Finished => "FINISHED",
            RunStatus::Stopped => "STOPPED",
            RunStatus::Suspended => "SUSPENDED",
            RunStatus::Canceled => "CANCELED",
            RunStatus::Failed => "FAILED",
        }
    }

    fn parse(text: &str) -> RunStatus {
        match text.trim() {
            "RUNNING" => RunStatus::Running,
            "FINISHED" => RunStatus::Finished,
            "STOPPED" => RunStatus::Stopped,
            "SUSPENDED" => RunStatus::Suspended,
            "CANCELED" => RunStatus::Canceled,
            _ => RunStatus::Failed,
        }
    }

    /// How the job's last run ended: beside its checkpoints when they
    /// are on an object store (a new machine finds it there; an error
    /// reading it is an error, not "no run"), else in its job directory.
    pub fn read(job_dir: &Path, remote: Option<&CheckpointStorage>) -> Result<Option<RunStatus>> {
        if let Some(storage) = remote {
            return Ok(storage.read_status()?.map(|t| Self::parse(&t)));
        }
        Ok(std::fs::read_to_string(job_dir.join("status"))
            .ok()
            .map(|t| Self::parse(&t)))
    }

    /// Records the status in the job directory, and beside the
    /// checkpoints when they are on an object store.
    fn write(&self, job_dir: &Path, remote: Option<&CheckpointStorage>) -> Result<()> {
        if let Some(storage) = remote {
            storage.write_status(self.as_str())?;
        }
        self.write_local(job_dir)
    }

    fn write_local(&self, job_dir: &Path) -> Result<()> {
        let io = |source| {
            ExecError::from(CheckpointError::Io {
                path: job_dir.join("status"),
                source,
            })
        };
        std::fs::create_dir_all(job_dir).map_err(io)?;
        let tmp = job_dir.join("status.tmp");
        std::fs::write(&tmp, self.as_str()).map_err(io)?;
        std::fs::rename(&tmp, job_dir.join("status")).map_err(io)?;
        Ok(())
    }
}

/// The storage of a job's checkpoints when it is an object store, where
/// its run status is kept too.
fn status_storage(config: &JobConfig) -> Option<CheckpointStorage> {
    config
        .checkpointing
        .as_ref()
        .filter(|c| c.store.is_some() || config.cluster.is_some())
        .map(|c| c.storage())
}

/// How a run starts (see [`initial_restore`]).
struct Initial {
    restored: Option<RestoredJob>,
    fence: Option<Arc<Fence>>,
    /// A job over workers that ended on purpose, or whose restart
    /// strategy gave up (`failed`): why it does not run.
    ended: Option<String>,
    failed: bool,
    /// A job over workers restarted after a failure: the restart
    /// strategy's wait before it runs.
    delay: Option<Duration>,
    /// What a restart within this run restores: the newest checkpoint
    /// numbered `floor` or above, else `path`.
    floor: u64,
    path: Option<PathBuf>,
}

/// The status file's word, for a log that has no end with one.
fn status_file(records: &[crate::checkpoint::records::Record], config: &JobConfig) -> Result<Option<&'static str>> {
    use crate::checkpoint::records::Record;
    if matches!(records.last(), Some(Record::End { status, .. }) if !status.is_empty())
        || matches!(
            records.last(),
            Some(Record::Generation { .. } | Record::Checkpoint { .. } | Record::Savepoint { .. })
        )
    {
        return Ok(None);
    }
    Ok(RunStatus::read(&config.job_dir, status_storage(config).as_ref())?.map(|s| s.as_str()))
}

/// A worker other than worker 0 of a job that ended on purpose, or whose
/// restart strategy gives up at this start (see [`super::resume`]): a pod
/// restarted after the end must not run it again, nor wait for a worker 0
/// that will not run it. It reads the log as worker 0 does, without the
/// claims at its end (worker 0 of this very start, which decides from what
/// was before), and comes to worker 0's answer (`true`: a give-up).
fn ended_across_workers(config: &JobConfig) -> Result<Option<(String, bool)>> {
    use crate::checkpoint::records::Record;
    let (Some(_), Some(cp)) = (&config.cluster, &config.checkpointing) else {
        return Ok(None);
    };
    let storage = cp.storage();
    let mut records: Vec<Record> = storage.log_records()?.into_iter().map(|(_, r)| r).collect();
    while matches!(records.last(), Some(Record::Generation { .. })) {
        records.pop();
    }
    let file = status_file(&records, config)?;
    let start = super::resume::decide(&records, config.recovery_path.as_deref(), true, file);
    if let super::resume::Start::Ended { message, .. } = start {
        return Ok(Some((message, false)));
    }
    match restart_verdict(&records, &start, config) {
        Some(Err(why)) => Ok(Some((gave_up_message(&why, &storage)?, true))),
        _ => Ok(None),
    }
}

/// The restart strategy's word on a start of a job over workers that
/// follows `records` (the log before it) and would run as `start` says:
/// `None` when it is no restart after a failure, else the wait before it
/// runs or why the strategy gives up. Across workers a failed attempt ends
/// every process and their supervisor starts them again: the start is the
/// restart, and the strategy counts the failures the log records.
fn restart_verdict(
    records: &[crate::checkpoint::records::Record],
    start: &super::resume::Start,
    config: &JobConfig,
) -> Option<std::result::Result<Duration, String>> {
    use super::resume::Start;
    let restart = config.cluster.is_some()
        && matches!(start, Start::Latest { .. } | Start::Path(_))
        && super::resume::after_failure(records, config.recovery_path.as_deref());
    if !restart {
        return None;
    }
    use crate::checkpoint::records::Record;
    // A give-up stands until the strategy is loosened: judged again at the
    // time it was made (its run's claim), so a failure-rate interval or an
    // exponential delay's reset does not wear it off, and every worker
    // reading the log comes to the same answer.
    let gave_up_at = match records.last() {
        Some(Record::End { status, .. }) if status.trim() == super::resume::EXHAUSTED => {
            records.iter().rev().find_map(|r| match r {
                Record::Generation { time_ms, .. } => Some(*time_ms),
                _ => None,
            })
        }
        _ => None,
    };
    let past = super::resume::restarts(records);
    let mut restarts = super::restart::Restarts::replay(config.restart, &past);
    Some(restarts.failed(gave_up_at.unwrap_or_else(|| chrono::Utc::now().timestamp_millis())))
}

/// What a job whose restart strategy gave up says (worker 0's log and
/// every worker's exit).
fn gave_up_message(why: &str, storage: &CheckpointStorage) -> Result<String> {
    let latest = storage
        .complete_ids()?
        .last()
        .map(|id| format!(" (the latest: {}/chk-{id})", storage.root().display()))
        .unwrap_or_default();
    Ok(format!(
        "has failed for good: {why}. Its checkpoints stay: start it with --from-savepoint naming one{latest}, \
         or allow more restarts"
    ))
}

/// Where the first attempt starts (see [`super::resume`]): an explicit
/// `execution.state-recovery.path` (a savepoint or a checkpoint), or the
/// latest checkpoint of a run that died, or nothing (and then old
/// checkpoints of the job are cleared). With checkpointing on, the run
/// first claims the job's checkpoints (its [`Fence`]): the log before the
/// claim is then final (no earlier run publishes after it), and a restore
/// reads only what it lists.
fn initial_restore(graph: &StreamGraph, config: &JobConfig) -> Result<Initial> {
    use super::resume::{Start, decide};
    let check = |m: &crate::checkpoint::CheckpointMetadata| crate::checkpoint::compat::check(m, graph, config);
    let Some(cp) = &config.checkpointing else {
        let restored = match &config.recovery_path {
            Some(path) => Some(restore_path(path, &check, config)?),
            None => None,
        };
        return Ok(Initial {
            restored,
            fence: None,
            ended: None,
            failed: false,
            delay: None,
            floor: 0,
            path: config.recovery_path.clone(),
        });
    };
    let storage = cp.storage();
    let none = |ended: String, failed: bool| Initial {
        restored: None,
        fence: None,
        ended: Some(ended),
        failed,
        delay: None,
        floor: 0,
        path: None,
    };
    // A start that would only seal again the end the log already ends
    // with (a pod restarted after the job finished, was stopped, or its
    // restart strategy gave up: Kubernetes restarts those too) claims
    // nothing, or the log would grow by a claim and an end every time.
    let before: Vec<_> = storage.log_records()?.into_iter().map(|(_, r)| r).collect();
    if let Some(crate::checkpoint::records::Record::End { status, .. }) = before.last()
        && !status.trim().is_empty()
    {
        let start = decide(&before, config.recovery_path.as_deref(), config.cluster.is_some(), None);
        if let Start::Ended { message, .. } = start {
            return Ok(none(message, false));
        }
        if status.trim() == super::resume::EXHAUSTED
            && let Some(Err(why)) = restart_verdict(&before, &start, config)
        {
            return Ok(none(gave_up_message(&why, &storage)?, true));
        }
    }
    let from = config.recovery_path.as_ref().map(|p| p.display().to_string());
    let fence = Arc::new(Fence::claim_from(&storage, from)?);
    tracing::info!(
        target: "weir::checkpoint",
        "job '{}': claimed generation {} of its checkpoints in {}",
        config.name,
        fence.generation(),
        storage.root().display()
    );
    // Every id this run takes is above the ones used before its claim.
    let own_floor = fence.high_water().saturating_add(1);
    let records: Vec<_> = storage
        .log_records()?
        .into_iter()
        .filter(|(seq, _)| *seq < fence.generation())
        .map(|(_, r)| r)
        .collect();
    let file = status_file(&records, config)?;
    let start = decide(
        &records,
        config.recovery_path.as_deref(),
        config.cluster.is_some(),
        file,
    );
    let mut initial = Initial {
        restored: None,
        fence: Some(fence.clone()),
        ended: None,
        failed: false,
        delay: None,
        floor: own_floor,
        path: None,
    };
    match restart_verdict(&records, &start, config) {
        Some(Ok(delay)) => initial.delay = Some(delay),
        Some(Err(why)) => {
            // Its own word: this run did not run (see `resume::restarts`),
            // and the failure it gave up on stands for the next start.
            fence.seal(super::resume::EXHAUSTED)?;
            return Ok(none(gave_up_message(&why, &storage)?, true));
        }
        None => {}
    }
    // Worker 0 of a job over workers lays out only its own subtasks' keyed
    // state, as the others do (the snapshot's metadata, with the splits
    // and the sinks' output, it reads whole).
    let mine = config
        .cluster
        .as_ref()
        .map(|c| wanted_on_worker(graph, config.max_parallelism, c.index as usize, c.workers()));
    let wanted = |uid: &str, groups: &std::ops::Range<u16>| match &mine {
        Some(mine) => overlaps_mine(mine, uid, groups),
        None => true,
    };
    match start {
        Start::Path(path) => {
            initial.restored = Some(restore_path_for(&path, &check, config, &wanted)?);
            initial.path = Some(path);
        }
        Start::Latest { floor, path } => {
            initial.restored = match restore_latest_from(&storage, &check, &config.job_dir, floor, &wanted)? {
                Some(r) => Some(r),
                None => path
                    .as_deref()
                    .map(|p| restore_path_for(p, &check, config, &wanted))
                    .transpose()?,
            };
            initial.floor = floor;
            initial.path = path;
        }
        Start::Afresh => {
            // The last run ended on purpose (or there was none): start
            // afresh, and never mistake its checkpoints for ours.
            storage.clear(None)?;
        }
        Start::Ended { status, message } => {
            // This run ends as the last did, so the next restart finds
            // the same end.
            fence.seal(&status)?;
            initial.fence = None;
            initial.ended = Some(message);
        }
    }
    Ok(initial)
}

/// Restores `path`: a savepoint directory, or a checkpoint's `chk-<n>`
/// (its files are relative to the directory above it), on the local disk
/// or an object store.
fn restore_path(
    path: &Path,
    check: crate::checkpoint::restore::Compatibility,
    config: &JobConfig,
) -> Result<RestoredJob> {
    restore_path_for(path, check, config, &|_, _| true)
}

/// [`restore_path`] laying out only the keyed state `wanted` says.
fn restore_path_for(
    path: &Path,
    check: crate::checkpoint::restore::Compatibility,
    config: &JobConfig,
    wanted: crate::checkpoint::restore::Wanted,
) -> Result<RestoredJob> {
    use crate::checkpoint::storage::METADATA_FILE;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let is_checkpoint = name.strip_prefix("chk-").is_some_and(|n| n.parse::<u64>().is_ok());
    let (root, key) = if is_checkpoint {
        (
            path.parent().map(Path::to_path_buf).unwrap_or_default(),
            format!("{name}/{METADATA_FILE}"),
        )
    } else {
        (path.to_path_buf(), METADATA_FILE.to_string())
    };
    let storage = crate::checkpoint::objects::storage_at(&root, &config.s3)?;
    if !storage.exists(&key)? {
        return Err(ExecError::Config(format!(
            "'execution.state-recovery.path' = '{}' is not a savepoint or checkpoint directory (it has no {METADATA_FILE})",
            path.display(),
        )));
    }
    Ok(crate::checkpoint::restore::restore_dir_for(
        &storage,
        path,
        check,
        &config.job_dir,
        wanted,
    )?)
}

/// Whether a snapshot's part of `uid`'s keyed state over `groups` is one
/// a worker owning `mine` needs (an unknown uid is the compatibility
/// check's to refuse, so it is laid out).
fn overlaps_mine(mine: &HashMap<String, Vec<std::ops::Range<u16>>>, uid: &str, groups: &std::ops::Range<u16>) -> bool {
    mine.get(uid)
        .is_none_or(|ranges| ranges.iter().any(|r| r.start < groups.end && groups.start < r.end))
}

/// The keyed state worker `index` of `workers` needs: the parts whose key
/// groups overlap those of the subtasks it runs (subtask `s` of every
/// operator runs on worker `s % workers`).
fn wanted_on_worker(
    graph: &StreamGraph,
    max_parallelism: u16,
    index: usize,
    workers: usize,
) -> HashMap<String, Vec<std::ops::Range<u16>>> {
    let mut out: HashMap<String, Vec<std::ops::Range<u16>>> = HashMap::new();
    for n in &graph.nodes {
        let mine = (0..n.parallelism)
            .filter(|s| s % workers.max(1) == index)
            .map(|s| crate::keygroup::groups_of_subtask(s, max_parallelism, n.parallelism));
        out.entry(n.uid.clone()).or_default().extend(mine);
    }
    out
}

/// Starts every subtask of `graph`. `results` receives the rows of a bare
/// `SELECT` (a graph whose last node has no sink).
pub fn deploy(
    graph: StreamGraph,
    config: &JobConfig,
    results: Option<mpsc::Sender<crate::change::ChangeBatch>>,
) -> Result<JobHandle> {
    let mut config = config.clone();
    if results.is_some() {
        // A query's rows go to its client; there is nothing to resume.
        config.checkpointing = None;
    }
    let batch = graph
        .nodes
        .iter()
        .any(|n| matches!(&n.kind, NodeKind::Source(s) if !s.factory.checkpointed()));
    if batch {
        // A batch plan (`automatic` mode over bounded tables too) takes
        // no checkpoints: a failed attempt runs it again from the start.
        config.checkpointing = None;
    }
    let restore_started = Instant::now();
    // A job spread over workers: worker 0 restores and claims the job's
    // checkpoints; the others restore what it tells them at the start of
    // each attempt, and leave the run's status to it.
    let coordinates = config.cluster.as_ref().is_none_or(|c| c.coordinates());
    let initial = if coordinates {
        initial_restore(&graph, &config)?
    } else {
        let ended = ended_across_workers(&config)?;
        Initial {
            restored: None,
            fence: None,
            failed: ended.as_ref().is_some_and(|(_, failed)| *failed),
            ended: ended.map(|(why, _)| why),
            delay: None,
            floor: 0,
            path: None,
        }
    };
    let Initial {
        restored,
        fence,
        ended,
        failed: gave_up,
        delay: first_delay,
        floor: restart_floor,
        path: restart_path,
    } = initial;
    let already_finished = ended.is_some();
    if let Some(why) = &ended {
        tracing::info!(target: "weir::checkpoint", "job '{}' {why}", config.name);
    }
    let restore_time = restore_started.elapsed();
    let restored_from = restored
        .as_ref()
        .map(|r| (r.checkpoint_id(), r.path.clone(), r.skipped.clone()));
    let checkpoint_log = Arc::new(CheckpointLog::default());
    if let Some(r) = &restored {
        if let Ok(mut slot) = checkpoint_log.restored_from.lock() {
            *slot = Some((r.checkpoint_id(), r.path.display().to_string()));
        }
        checkpoint_log.restore_layout_ms.store(
            (restore_time.as_millis() as u64).max(1),
            std::sync::atomic::Ordering::Relaxed,
        );
        tracing::info!(
            target: "weir::checkpoint",
            "job '{}': restoring from checkpoint {} ({}): {} of its {} bytes of state verified and laid out in {} ms",
            config.name,
            r.checkpoint_id(),
            r.path.display(),
            r.laid_out,
            r.metadata.full_size(),
            restore_time.as_millis()
        );
    }
    if config.checkpointing.is_some() && coordinates && !already_finished {
        RunStatus::Running.write(&config.job_dir, status_storage(&config).as_ref())?;
    }
    let name = config.name.clone();
    let metrics = build_metrics(&graph, &config, checkpoint_log);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let stop_for_attempts = stop_tx.clone();
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let (savepoint_tx, savepoint_rx) = mpsc::unbounded_channel();
    let savepoint_queue: SavepointQueue = Arc::new(tokio::sync::Mutex::new(savepoint_rx));
    let retention = Arc::new(Retention {
        storage: config.checkpointing.as_ref().map(|c| c.storage()),
        retain: config.retain_checkpoints,
        fence: fence.clone(),
        shared: config.cluster.is_some(),
        ended: Arc::default(),
    });
    let savepoint_dir = config.savepoint_dir.clone();
    let end_retention = retention.clone();
    let job_dir = config.job_dir.clone();
    let checkpointing = config.checkpointing.is_some();
    let graph = Arc::new(graph);
    let job_metrics = metrics.clone();
    let started = Instant::now();
    // A query's job (rows to a client) keeps nothing: its directory goes
    // when it ends.
    let ephemeral = results.is_some().then(|| config.job_dir.clone());
    let supervise = async move {
        if gave_up {
            let why = format!("job '{}' {}", config.name, ended.unwrap_or_default());
            job_metrics.lifecycle.set(JobState::Failed(why.clone()));
            return Err(ExecError::Cluster(why));
        }
        if already_finished {
            job_metrics.lifecycle.set(JobState::Finished);
            return Ok(JobOutcome {
                elapsed: started.elapsed(),
                metrics: job_metrics,
            });
        }
        let mut restored = restored;
        let mut attempt = 0u32;
        // The other workers wait for worker 0 only so long: a longer wait
        // would send them into their supervisor's own backoff.
        let first_delay = first_delay.map(|d| match &config.cluster {
            Some(c) => d.min(c.join_deadline / 2),
            None => d,
        });
        if let Some(delay) = first_delay.filter(|d| !d.is_zero()) {
            tracing::warn!(
                target: "weir::checkpoint",
                "job '{}': restarted after a failure; starting in {delay:?} (restart strategy)",
                config.name
            );
            job_metrics.lifecycle.set(JobState::Restarting);
            tokio::time::sleep(delay).await;
            job_metrics.lifecycle.set(JobState::Running);
        }
        let mut restarts = super::restart::Restarts::new(config.restart);
        loop {
            let result = run_attempt(
                &graph,
                &config,
                results.clone(),
                &job_metrics,
                &stop_rx,
                restored.take(),
                attempt,
                &savepoint_queue,
                &stop_for_attempts,
                &cancel_rx,
                fence.as_ref(),
            )
            .await;
            let err = match result {
                Ok(()) => {
                    let (status, state) = if *stop_rx.borrow() {
                        (RunStatus::Stopped, JobState::Stopped)
                    } else {
                        (RunStatus::Finished, JobState::Finished)
                    };
                    if config.checkpointing.is_some() && coordinates {
                        end_retention.end(&config.name, &config.job_dir, status, status == RunStatus::Stopped)?;
                    }
                    job_metrics.lifecycle.set(state);
                    return Ok(JobOutcome {
                        elapsed: started.elapsed(),
                        metrics: job_metrics,
                    });
                }
                Err(e) => e,
            };
            // A newer run of the job owns its checkpoints: restarting
            // would take them back from it.
            let fenced = matches!(err, ExecError::CheckpointStorage(CheckpointError::Fenced { .. }));
            // A source that cannot follow its system (a Delta commit that
            // deletes rows under a continuous read) would stop there again.
            let cannot_follow = matches!(
                err,
                ExecError::Connector(crate::error::ConnectorError::CannotFollow { .. })
            );
            let retry = if config.cluster.is_some() {
                // Across workers, a failed attempt ends the process: its
                // supervisor restarts every worker (a full restart), and
                // the restart strategy decides at that start.
                None
            } else if fenced || cannot_follow || *stop_rx.borrow() || *cancel_rx.borrow() {
                None
            } else {
                match restarts.failed(chrono::Utc::now().timestamp_millis()) {
                    Ok(delay) => Some(delay),
                    Err(why) => {
                        tracing::warn!(target: "weir::checkpoint", "job '{}' is not restarted: {why}", config.name);
                        None
                    }
                }
            };
            let Some(delay) = retry else {
                job_metrics.lifecycle.set(JobState::Failed(err.to_string()));
                // Cancelled: `JobHandle::cancel` records the end (and its
                // retention), which must not be taken by this one.
                if config.checkpointing.is_some() && !fenced && coordinates && !*cancel_rx.borrow() {
                    // Checkpoints stay: the next run of this job resumes.
                    let _ = end_retention.end(&config.name, &config.job_dir, RunStatus::Failed, false);
                }
                return Err(err);
            };
            attempt += 1;
            job_metrics.lifecycle.set(JobState::Restarting);
            tracing::warn!(
                target: "weir::checkpoint",
                "job '{}' failed: {err}; restarting (attempt {attempt}{}) in {delay:?}",
                config.name,
                match config.restart {
                    RestartStrategy::FixedDelay { attempts, .. } => format!(" of {attempts}"),
                    RestartStrategy::FailureRate {
                        max_failures, interval, ..
                    } => format!(", at most {max_failures} per {interval:?}"),
                    RestartStrategy::ExponentialDelay { attempts, .. } if attempts < u32::MAX => {
                        format!(" of {attempts} before the wait resets")
                    }
                    _ => String::new(),
                }
            );
            tokio::time::sleep(delay).await;
            job_metrics.lifecycle.set(JobState::Running);
            if let Some(cp) = &config.checkpointing {
                let storage = cp.storage();
                let graph = graph.clone();
                let cfg = config.clone();
                let restart_path = restart_path.clone();
                let layout_started = Instant::now();
                restored = tokio::task::spawn_blocking(move || -> Result<Option<RestoredJob>> {
                    let check =
                        |m: &crate::checkpoint::CheckpointMetadata| crate::checkpoint::compat::check(m, &graph, &cfg);
                    match restore_latest_from(&storage, &check, &cfg.job_dir, restart_floor, &|_, _| true)? {
                        Some(r) => Ok(Some(r)),
                        // No checkpoint of this deployment yet: the one
                        // it started from, again.
                        None => match &restart_path {
                            Some(p) => Ok(Some(restore_path(p, &check, &cfg)?)),
                            None => Ok(None),
                        },
                    }
                })
                .await
                .map_err(|e| ExecError::internal(format!("restore task failed: {e}")))??;
                if let Some(r) = &restored {
                    tracing::info!(
                        target: "weir::checkpoint",
                        "job '{}': restoring from checkpoint {} ({})",
                        config.name,
                        r.checkpoint_id(),
                        r.path.display()
                    );
                    if let Ok(mut slot) = job_metrics.checkpoints.restored_from.lock() {
                        *slot = Some((r.checkpoint_id(), r.path.display().to_string()));
                    }
                    job_metrics.checkpoints.restore_layout_ms.store(
                        (layout_started.elapsed().as_millis() as u64).max(1),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
            }
        }
    };
    let done = tokio::spawn(async move {
        let result = supervise.await;
        if let Some(dir) = ephemeral {
            let _ = std::fs::remove_dir_all(dir);
        }
        result
    });
    Ok(JobHandle {
        name,
        metrics,
        stop: stop_tx,
        job_dir,
        checkpointing,
        done,
        restored_from,
        savepoints: savepoint_tx,
        savepoint_dir,
        retention,
        cancel: Arc::new(cancel_tx),
    })
}
/// `Ok(the fence error)` when an attempt that failed with `err` was
/// replaced by a newer run of the job (whatever failed first: the newer
/// run's recovery may have removed this attempt's files under it), so it
/// is neither restarted nor reported as a mere failure; else `Err(err)`.
async fn superseded(err: ExecError, fence: &Arc<Fence>, job: &str) -> Result<ExecError, ExecError> {
    if matches!(err, ExecError::CheckpointStorage(CheckpointError::Fenced { .. })) {
        return Ok(err);
    }
    let fence = fence.clone();
    match tokio::task::spawn_blocking(move || fence.check()).await {
        Ok(Err(e @ CheckpointError::Fenced { .. })) => {
            tracing::warn!(target: "weir::checkpoint", "job '{job}': the attempt failed ({err}) after another run took over");
            Ok(e.into())
        }
        _ => Err(err),
    }
}

/// Metrics of the job, and its alignment coordinators (one per group).
fn build_metrics(graph: &StreamGraph, config: &JobConfig, checkpoint_log: Arc<CheckpointLog>) -> Arc<JobMetrics> {
    build_metrics_and_groups(graph, config, checkpoint_log).0
}

fn build_metrics_and_groups(
    graph: &StreamGraph,
    config: &JobConfig,
    checkpoint_log: Arc<CheckpointLog>,
) -> (Arc<JobMetrics>, HashMap<String, Arc<AlignmentCoordinator>>) {
    let mut sources = vec![];
    let mut coordinators: HashMap<String, Arc<AlignmentCoordinator>> = HashMap::new();
    for n in &graph.nodes {
        if let NodeKind::Source(src) = &n.kind {
            let group = src.watermark.as_ref().and_then(|w| w.alignment.clone());
            if let Some(g) = &group {
                let c = coordinators.entry(g.group.clone()).or_insert_with(|| {
                    AlignmentCoordinator::new(g.group.clone(), Duration::from_millis(g.update_interval_ms as u64))
                });
                // The group announces at the fastest interval any member asked for.
                if Duration::from_millis(g.update_interval_ms as u64) < c.update_interval {
                    let drift = c.max_drift_ms.load(std::sync::atomic::Ordering::Relaxed);
                    *c = AlignmentCoordinator::new(g.group.clone(), Duration::from_millis(g.update_interval_ms as u64));
                    c.max_drift_ms.store(drift, std::sync::atomic::Ordering::Relaxed);
                }
                c.max_drift_ms
                    .fetch_max(g.max_drift_ms, std::sync::atomic::Ordering::Relaxed);
                c.spread_alert_ms
                    .store(config.alignment_spread_alert_ms, std::sync::atomic::Ordering::Relaxed);
            }
            for subtask in 0..n.parallelism {
                sources.push(Arc::new(SourceStatus::new(
                    src.table.name.clone(),
                    subtask,
                    group.as_ref().map(|g| g.group.clone()),
                )));
            }
        }
    }
    let metrics = Arc::new(JobMetrics {
        nodes: graph
            .nodes
            .iter()
            .map(|n| Arc::new(NodeMetrics::new(format!("[{}] {}", n.id, n.describe()))))
            .collect(),
        sources,
        groups: coordinators.values().cloned().collect(),
        checkpoints: checkpoint_log,
        lifecycle: Default::default(),
    });
    (metrics, coordinators)
}
/// One attempt: deploys every subtask (from `restored` if given), runs
/// them with a checkpoint coordinator when checkpointing is on, and ends
/// when all finished or one failed.
#[allow(clippy::too_many_arguments)]
async fn run_attempt(
    graph: &Arc<StreamGraph>,
    config: &JobConfig,
    results: Option<mpsc::Sender<crate::change::ChangeBatch>>,
    job_metrics: &Arc<JobMetrics>,
    stop_rx: &watch::Receiver<bool>,
    restored: Option<RestoredJob>,
    attempt: u32,
    savepoints: &SavepointQueue,
    stop: &Arc<watch::Sender<bool>>,
    cancel: &watch::Receiver<bool>,
    fence: Option<&Arc<Fence>>,
) -> Result<()> {
    // Alignment coordinators are per attempt: alignment state is never
    // checkpointed, a restored job starts it afresh (as Flink does).
    let (attempt_metrics, coordinators) = build_metrics_and_groups(graph, config, job_metrics.checkpoints.clone());
    let metrics = Arc::new(JobMetrics {
        nodes: job_metrics.nodes.clone(),
        sources: job_metrics.sources.clone(),
        groups: attempt_metrics.groups.clone(),
        checkpoints: job_metrics.checkpoints.clone(),
        // Per attempt: the job's lifecycle is the supervisor's, not ours.
        lifecycle: Default::default(),
    });
    let _ = attempt_metrics;
    // A job spread over workers: meet the others, and (all but worker 0)
    // learn from worker 0 how the attempt starts.
    let mesh = match &config.cluster {
        Some(c) => {
            let m = c.join(cluster::plan_hash(graph, config)).await?;
            tracing::debug!(target: "weir::cluster", "worker {}: joined the other workers", c.index);
            Some(m)
        }
        None => None,
    };
    let remote = config.cluster.as_deref().zip(mesh.as_ref());
    let coordinates = remote.is_none_or(|(c, _)| c.coordinates());
    let mut restored = restored;
    let mut from_coordinator = None;
    let mut started = None;
    if let Some((c, m)) = remote
        && !c.coordinates()
    {
        let ours = config.checkpointing.as_ref().map(|c| c.root.display().to_string());
        let Some((attempt_tag, restore, splits, rx)) = await_start(c, m, ours).await? else {
            // Worker 0 found the job finished (its final checkpoint
            // committed before a restart): nothing to run.
            m.close().await;
            return Ok(());
        };
        let layout_started = Instant::now();
        if let Some(path) = restore {
            let graph = graph.clone();
            let cfg = config.clone();
            let mine = wanted_on_worker(&graph, config.max_parallelism, c.index as usize, c.workers());
            restored = Some(
                tokio::task::spawn_blocking(move || {
                    let check =
                        |m: &crate::checkpoint::CheckpointMetadata| crate::checkpoint::compat::check(m, &graph, &cfg);
                    // Only what this worker's subtasks read (an unknown
                    // uid is the compatibility check's to refuse).
                    let wanted = |uid: &str, groups: &std::ops::Range<u16>| overlaps_mine(&mine, uid, groups);
                    restore_path_for(Path::new(&path), &check, &cfg, &wanted)
                })
                .await
                .map_err(|e| ExecError::internal(format!("restore task failed: {e}")))??,
            );
        }
        if let Some(r) = &restored {
            tracing::info!(
                target: "weir::checkpoint",
                "job '{}': worker {}: restoring from checkpoint {} ({}), as worker 0 decided: its key groups' {} of \
                 the snapshot's {} bytes laid out in {} ms",
                config.name,
                c.index,
                r.checkpoint_id(),
                r.path.display(),
                r.laid_out,
                r.metadata.full_size(),
                layout_started.elapsed().as_millis()
            );
        }
        started = Some((attempt_tag, splits));
        from_coordinator = Some(rx);
    }
    let sink_ctx = SinkContext {
        job_tag: sanitize(&config.name),
        attempt: match &started {
            Some((tag, _)) => tag.clone(),
            None => format!("{:x}{attempt}", chrono::Utc::now().timestamp_micros()),
        },
        exactly_once: config.checkpointing.is_some(),
        checkpoint_interval: config.checkpointing.as_ref().map(|c| c.interval),
        checkpoint_timeout: config.checkpointing.as_ref().map(|c| c.timeout),
        clock: config.clock.clone(),
        spool_dir: config.job_dir.join("spool"),
        sink_uid: String::new(),
    };
    // A killed attempt's spooled parts: never read again.
    crate::checkpoint::storage::remove_dir_if_exists(&sink_ctx.spool_dir)?;
    let committers = if coordinates {
        let Some(committers) = restore_commits(graph, config, &sink_ctx, restored.as_ref()).await? else {
            // The run had ended; its last output is committed: nothing to do.
            if let Some(m) = &mesh {
                cluster::broadcast(
                    m,
                    &Control::JobDone {
                        ok: true,
                        reason: String::new(),
                    },
                )?;
                m.close().await;
            }
            return Ok(());
        };
        committers
    } else {
        // Worker 0 commits and recovers the sinks' output.
        if restored.is_none() {
            crate::checkpoint::storage::remove_dir_if_exists(&config.job_dir.join("state"))?;
        }
        HashMap::new()
    };
    let (trigger_tx, trigger_rx) = watch::channel(None);
    let (report_tx, mut report_rx) = mpsc::unbounded_channel();
    let mut task_count = 0usize;
    let mut source_tasks = vec![];
    let checkpointing = config.checkpointing.clone();
    let mut task_ctx = |is_source: bool| {
        let task = task_count;
        task_count += 1;
        if is_source {
            source_tasks.push(task);
        }
        checkpointing.as_ref().map(|cp| TaskCheckpointing {
            task,
            reports: report_tx.clone(),
            mode: cp.mode,
        })
    };
    let chains = chains(graph);

    // Which source subtasks have splits, on any worker (a reader of
    // another worker is not idle because this one opened no split for it).
    let (mut dealt_splits, has_splits) = match started.take() {
        Some((_, splits)) => {
            let has: Vec<Vec<bool>> = splits
                .iter()
                .map(|per_subtask| per_subtask.iter().map(|s| !s.is_empty()).collect())
                .collect();
            (
                splits_from_coordinator(graph, &chains, splits, config.cluster.as_deref())?,
                has,
            )
        }
        None => {
            let dealt = deal_splits(graph, &chains, restored.as_ref())?;
            let has = dealt
                .iter()
                .map(|(per_subtask, _)| per_subtask.iter().map(|s| !s.is_empty()).collect())
                .collect();
            (dealt, has)
        }
    };
    if let Some(m) = &mesh
        && coordinates
    {
        cluster::broadcast(
            m,
            &Control::Start {
                checkpoints: config.checkpointing.as_ref().map(|c| c.root.display().to_string()),
                attempt: sink_ctx.attempt.clone(),
                restore: restored.as_ref().map(|r| r.path.display().to_string()),
                splits: dealt_splits
                    .iter()
                    .map(|(dealt, _)| {
                        dealt
                            .iter()
                            .map(|splits| {
                                splits
                                    .iter()
                                    .map(|s| SplitPosition {
                                        split: s.id(),
                                        position: s.position(),
                                        finished: false,
                                        end: s.end(),
                                    })
                                    .collect()
                            })
                            .collect()
                    })
                    .collect(),
            },
        )?;
    }

    let Wiring {
        mut inputs,
        ports,
        origins,
        mut outputs,
        bridges,
    } = wire(graph, &chains, config, &metrics, remote)?;

    let idle = starting_idle(graph, &chains, &has_splits, &origins);

    let opening = Instant::now();
    // Which worker runs each task (by task number): worker 0 takes a
    // report of a task only from the worker that runs it.
    let mut task_owners: Vec<u32> = vec![];
    let mut tasks: JoinSet<Result<()>> = JoinSet::new();
    // One RocksDB memory budget for the whole attempt (every stateful
    // subtask's instance shares its cache and write buffers).
    let tuning = crate::state::RocksDbTuning::for_job(config.rocksdb, config.parallelism);
    // Sources that find splits while the job runs: one enumerator each,
    // where the job is coordinated; the readers here get inboxes.
    let mut enumerators = vec![];
    let mut inboxes = super::enumerator::Inboxes::default();
    for (ci, chain) in chains.iter().enumerate() {
        let head = graph.node(chain[0]);
        let (dealt, all_splits) = &mut dealt_splits[ci];
        let discovery = match &head.kind {
            NodeKind::Source(src) => src
                .factory
                .discovery_interval()
                .map(|interval| (src.factory.clone(), interval)),
            _ => None,
        };
        // This chain's readers' inboxes (each held by its reader; the
        // enumerator holds them weakly, and ends once none is left).
        let mut local_inboxes: HashMap<usize, Arc<super::enumerator::SplitInbox>> = HashMap::new();
        if let Some((factory, interval)) = &discovery {
            use super::enumerator::{Route, SplitInbox};
            let mut routes = vec![];
            let (held, readers) = mpsc::channel(1);
            for subtask in 0..head.parallelism {
                match remote {
                    Some((c, _)) if !c.is_local(subtask) => routes.push(Route::Remote(c.worker_of(subtask))),
                    _ => {
                        let inbox = SplitInbox::held(coordinates.then(|| held.clone()));
                        routes.push(Route::Local(Arc::downgrade(&inbox)));
                        local_inboxes.insert(subtask, inbox);
                    }
                }
            }
            if coordinates {
                enumerators.push(super::enumerator::SplitEnumerator {
                    uid: head.uid.clone(),
                    node: head.id,
                    factory: factory.clone(),
                    interval: *interval,
                    known: all_splits.clone(),
                    routes,
                    readers,
                });
            } else {
                // What worker 0's enumerators send this worker.
                inboxes.nodes.insert(head.id, (factory.clone(), local_inboxes.clone()));
            }
        }
        for subtask in 0..head.parallelism {
            // Numbered on every worker alike, run by one.
            let checkpointing = task_ctx(matches!(head.kind, NodeKind::Source(_)));
            task_owners.push(remote.map_or(0, |(c, _)| c.worker_of(subtask)));
            if remote.is_some_and(|(c, _)| !c.is_local(subtask)) {
                continue;
            }
            let first_op = usize::from(matches!(head.kind, NodeKind::Source(_)));
            let mut ops: Vec<Box<dyn Operator>> = vec![];
            let mut op_metrics = vec![];
            for &id in &chain[first_op..] {
                ops.push(create_operator(
                    graph,
                    id,
                    subtask,
                    config,
                    &tuning,
                    &metrics,
                    restored.as_ref(),
                    &sink_ctx,
                )?);
                op_metrics.push(metrics.nodes[id].clone());
            }
            let tail = graph.node(*chain.last().unwrap_or(&chain[0]));
            let output = match outputs[ci][subtask].take() {
                Some(o) => o,
                None if matches!(tail.kind, NodeKind::Sink(_)) => Output::None,
                None => match &results {
                    Some(tx) => Output::Results(tx.clone()),
                    None => Output::None,
                },
            };
            let uids = chain[first_op..].iter().map(|id| graph.node(*id).uid.clone()).collect();
            let chain_ops = Chain::new(ops, op_metrics, uids, subtask, config.clock.clone());
            match &head.kind {
                NodeKind::Source(src) => {
                    let mine = std::mem::take(&mut dealt[subtask]);
                    let emit = match src.table.options.get("scan.watermark.emit.strategy") {
                        Some(v) if v.eq_ignore_ascii_case("on-event") => EmitStrategy::OnEvent,
                        _ => EmitStrategy::OnPeriodic,
                    };
                    let rowtime_index = src
                        .watermark
                        .as_ref()
                        .and_then(|w| head.schema.index_of(&w.column).ok());
                    let alignment = match src.watermark.as_ref().and_then(|w| w.alignment.as_ref()) {
                        Some(g) => Some(ReaderAlignment {
                            coordinator: coordinators
                                .get(&g.group)
                                .cloned()
                                .ok_or_else(|| ExecError::internal("alignment group without coordinator"))?,
                            reader: (head.id, subtask),
                            max_drift_ms: g.max_drift_ms,
                            update_interval: Duration::from_millis(g.update_interval_ms as u64),
                            buffer_size: config.alignment_buffer_size,
                            allow_unaligned: config.allow_unaligned_source_splits,
                            connector: src.factory.name().to_string(),
                        }),
                        None => None,
                    };
                    let status = metrics
                        .sources
                        .iter()
                        .find(|s| s.table == src.table.name && s.subtask == subtask)
                        .cloned();
                    let positions: HashMap<String, SplitPosition> = restored
                        .as_ref()
                        .and_then(|r| r.metadata.sources.get(&head.uid))
                        .map(|ps| ps.iter().map(|p| (p.split.clone(), p.clone())).collect())
                        .unwrap_or_default();
                    let task = SourceTask {
                        splits: mine,
                        bounded: src.factory.is_bounded(),
                        computed: src.computed.clone(),
                        schema: head.schema.clone(),
                        watermark: src.watermark.clone(),
                        rowtime_index,
                        emit,
                        interval: config.auto_watermark_interval,
                        chain: chain_ops,
                        output,
                        stop: stop_rx.clone(),
                        metrics: metrics.nodes[head.id].clone(),
                        alignment,
                        status,
                        uid: head.uid.clone(),
                        subtask,
                        restored: positions,
                        triggers: config.checkpointing.as_ref().map(|_| trigger_rx.clone()),
                        checkpointing,
                        dead_letters: src
                            .factory
                            .dead_letter_dir()
                            .map(|dir| DeadLetterWriter::new(dir, &src.table.name, &sink_ctx, &head.uid, subtask))
                            .transpose()?,
                        inbox: local_inboxes.remove(&subtask),
                    };
                    tasks.spawn(task.run());
                }
                _ => {
                    let receivers = std::mem::take(&mut inputs[ci][subtask]);
                    let mode = config
                        .checkpointing
                        .as_ref()
                        .map_or(BarrierMode::default(), |c| BarrierMode {
                            mode: c.mode,
                            unaligned: c.unaligned,
                            aligned_timeout: c.aligned_timeout,
                        });
                    let in_flight_key = crate::checkpoint::in_flight_key(&head.uid, subtask);
                    let mut replay = vec![];
                    if let Some(r) = restored.as_ref() {
                        for input in 0..graph.inputs(head.id).map(|e| e.input + 1).max().unwrap_or(1) {
                            let key = crate::checkpoint::in_flight_input_key(&in_flight_key, input);
                            for b in r.in_flight.get(&key).cloned().unwrap_or_default() {
                                replay.push((input, b));
                            }
                        }
                    }
                    if !replay.is_empty() {
                        tracing::info!(
                            target: "weir::checkpoint",
                            "job '{}': task {in_flight_key} replays {} in-flight rows of the unaligned checkpoint",
                            config.name,
                            replay.iter().map(|(_, b)| b.num_rows()).sum::<usize>()
                        );
                    }
                    let task = OperatorTask {
                        gate: InputGate::with_lanes(receivers, mode)
                            .with_inputs(&ports[ci][subtask])
                            .starting_idle(&idle[ci][subtask]),
                        chain: chain_ops,
                        output,
                        checkpointing,
                        replay,
                        in_flight_key,
                    };
                    tasks.spawn(task.run());
                }
            }
        }
    }

    // Every operator has taken its share of the restored state.
    let _ = std::fs::remove_dir_all(config.job_dir.join("state").join("restored"));
    if let Some(r) = &restored {
        let ms = opening.elapsed().as_millis() as u64;
        metrics
            .checkpoints
            .restore_open_ms
            .store(ms.max(1), std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            target: "weir::checkpoint",
            "job '{}': state of {} opened in {ms} ms",
            config.name,
            r.path.display()
        );
    }
    // Alignment groups across workers: the others send worker 0 their
    // readers' watermarks and take the group minimum it announces.
    let groups = coordinators.clone();
    for c in coordinators.into_values() {
        if !coordinates {
            c.set_follower();
        }
        // Ends by itself once every reader of the group is gone.
        tokio::spawn(c.run());
    }
    // Dropped when the attempt ends: the alignment exchange stops.
    let (attempt_alive, _) = watch::channel(());
    for b in bridges {
        tasks.spawn(b);
    }
    let mesh = mesh.map(Arc::new);
    // With the tasks: a panic or a failure nobody here can read fails
    // the attempt.
    for e in enumerators {
        tasks.spawn(e.run(mesh.clone(), attempt_alive.subscribe()));
    }
    let mut coordinator_set = JoinSet::new();
    // Across workers: worker 0 hears from the others (their reports, their
    // end) and tells them of checkpoints; the others hear from it.
    let mut events = None;
    let mut coordinator_gone = None;
    match (&mesh, from_coordinator) {
        (Some(m), None) => {
            let owners = Arc::new(std::mem::take(&mut task_owners));
            for peer in 1..m.workers() as u32 {
                let rx = m
                    .link(peer)
                    .and_then(|l| l.take_control())
                    .ok_or_else(|| ExecError::internal(format!("no control channel from worker {peer}")))?;
                let probe = m.link(peer).map(|l| l.failure_probe());
                tasks.spawn(from_worker(
                    peer,
                    rx,
                    report_tx.clone(),
                    probe,
                    groups.clone(),
                    metrics.checkpoints.clone(),
                    owners.clone(),
                ));
            }
            if !groups.is_empty() {
                tokio::spawn(align_across_workers(
                    m.clone(),
                    groups.clone(),
                    attempt_alive.subscribe(),
                    true,
                ));
            }
            let (tx, mut rx) = mpsc::unbounded_channel();
            events = Some(tx);
            // A stop here (after a stop-with-savepoint, or asked) stops
            // the other workers' sources too.
            let mut stopping = stop_rx.clone();
            let stop_mesh = m.clone();
            tokio::spawn(async move {
                if stopping.wait_for(|s| *s).await.is_ok() {
                    let _ = cluster::broadcast(&stop_mesh, &Control::Stop);
                }
            });
            let m = m.clone();
            tokio::spawn(async move {
                while let Some(event) = rx.recv().await {
                    let message = match event {
                        CoordinatorEvent::Triggered(barrier, dir) => Control::Trigger {
                            barrier: barrier.into(),
                            savepoint_dir: dir.map(|d| d.display().to_string()),
                        },
                        CoordinatorEvent::Completed(checkpoint_id) => Control::Completed { checkpoint_id },
                    };
                    // A lost worker fails the attempt through its reader.
                    let _ = cluster::broadcast(&m, &message);
                }
            });
        }
        (Some(m), Some(rx)) => {
            let writer = ReportWriter::new(config);
            let (done_tx, done_rx) = watch::channel(None);
            if !groups.is_empty() {
                tokio::spawn(align_across_workers(
                    m.clone(),
                    groups.clone(),
                    attempt_alive.subscribe(),
                    false,
                ));
            }
            // A signal to this worker (its pod going away) asks worker 0
            // to suspend the job.
            let mut suspend = metrics.checkpoints.suspend.subscribe();
            let to_zero = m.clone();
            let alive = attempt_alive.subscribe();
            tokio::spawn(async move {
                let mut alive = alive;
                tokio::select! {
                    r = suspend.wait_for(|s| *s) => if r.is_ok() && let Some(l) = to_zero.link(0) {
                        let _ = l.send_control(Control::Suspend.encode());
                    },
                    _ = alive.changed() => {}
                }
            });
            let probe = m.link(0).map(|l| l.failure_probe());
            let followed = groups.clone();
            tokio::spawn(from_coordinator_loop(
                rx,
                trigger_tx.clone(),
                writer.clone(),
                done_tx,
                probe,
                stop.clone(),
                followed,
                local_committers(graph, &sink_ctx),
                inboxes.clone(),
            ));
            let over = done_rx.clone();
            coordinator_gone = Some(done_rx);
            let m = m.clone();
            let reports = report_rx;
            report_rx = mpsc::unbounded_channel().1;
            coordinator_set.spawn(cluster::forward_reports(reports, writer, over, move |bytes| {
                let link = m.link(0).ok_or_else(|| ExecError::internal("no link to worker 0"))?;
                link.send_control(bytes).map_err(|e| ExecError::Cluster(e.to_string()))
            }));
        }
        _ => {}
    }
    drop(report_tx);
    if let Some(cp) = config.checkpointing.as_ref().filter(|_| coordinates) {
        let mut first_id = restored.as_ref().map_or(1, |r| r.checkpoint_id() + 1);
        for c in committers.values() {
            let c = c.clone();
            let through = tokio::task::spawn_blocking(move || c.committed_through())
                .await
                .map_err(|e| ExecError::internal(format!("sink recovery failed: {e}")))??;
            first_id = first_id.max(through.map_or(1, |t| t + 1));
        }
        let fence = fence
            .cloned()
            .ok_or_else(|| ExecError::internal("a job with checkpointing has no fence"))?;
        let coordinator = CheckpointCoordinator {
            fence,
            config: cp.clone(),
            storage: cp.storage(),
            job: config.name.clone(),
            fingerprint: graph.fingerprint(),
            tasks: task_count,
            source_tasks,
            triggers: trigger_tx,
            reports: report_rx,
            committers: committers.clone(),
            log: metrics.checkpoints.clone(),
            // The incremental base must live in this job's storage: a
            // snapshot restored from elsewhere is not shared from (the
            // first checkpoint after a savepoint is full; NO_CLAIM).
            restored: restored
                .as_ref()
                .filter(|r| {
                    !r.is_savepoint() && r.path.parent() == Some(cp.root.as_path()) && !no_claim_restore(r, config)
                })
                .map(|r| r.metadata.clone()),
            // A checkpoint of this job's own directory named by the user
            // under NO_CLAIM: never deleted by garbage collection.
            protected: restored
                .as_ref()
                .filter(|r| r.path.parent() == Some(cp.root.as_path()) && no_claim_restore(r, config))
                .map(|r| r.metadata.clone()),
            max_parallelism: config.max_parallelism,
            operator_info: crate::checkpoint::compat::operator_info(graph),
            savepoints: savepoints.clone(),
            stop: Some(stop.clone()),
            claimed: restored
                .as_ref()
                .filter(|r| config.claim && r.path.parent() != Some(cp.root.as_path()))
                .map(|r| r.path.clone()),
            cluster: events,
            first_id,
        };
        coordinator_set.spawn(coordinator.run());
    }
    let gone: Option<Pin<Box<dyn std::future::Future<Output = ExecError> + Send>>> =
        coordinator_gone.clone().map(|mut done| {
            Box::pin(async move {
                match done.wait_for(|d| matches!(d, Some(Err(_)))).await {
                    Ok(d) => match &*d {
                        Some(Err(reason)) => ExecError::Cluster(reason.clone()),
                        _ => ExecError::internal("the coordinator's end without a reason"),
                    },
                    Err(_) => ExecError::Cluster("the connection to worker 0 is lost".into()),
                }
            }) as Pin<Box<dyn std::future::Future<Output = ExecError> + Send>>
        });
    let supervised = supervise(tasks, coordinator_set, cancel, gone).await;
    if let Some(m) = &mesh {
        tracing::debug!(target: "weir::cluster", "worker {}: the attempt's tasks ended: {supervised:?}", m.index);
    }
    let supervised = match (&mesh, coordinator_gone) {
        // Worker 0: the end of the attempt is the others' end too.
        (Some(m), None) => {
            if let Err(e) = &supervised {
                let _ = cluster::broadcast(
                    m,
                    &Control::JobDone {
                        ok: false,
                        reason: e.to_string(),
                    },
                );
                m.close().await;
            }
            supervised
        }
        // Another worker: tell worker 0, then wait for the job's end.
        (Some(m), Some(mut done)) => {
            let to_coordinator = |c: Control| m.link(0).map(|l| l.send_control(c.encode()));
            match supervised {
                Err(e) => {
                    let _ = to_coordinator(Control::Failed { reason: e.to_string() });
                    m.close().await;
                    Err(e)
                }
                Ok(()) => {
                    if !sink_ctx.exactly_once && !*stop_rx.borrow() {
                        // What waits for the end of this worker's writers
                        // (a file sink's partitions) is committed here.
                        for c in local_committers(graph, &sink_ctx).into_values() {
                            tokio::task::spawn_blocking(move || c.finish())
                                .await
                                .map_err(|e| ExecError::internal(format!("sink finish failed: {e}")))??;
                        }
                    }
                    let _ = to_coordinator(Control::TasksDone);
                    let end = match done.wait_for(Option::is_some).await {
                        Ok(d) => d.clone().unwrap_or(Ok(())),
                        Err(_) => Err("the connection to worker 0 is lost".into()),
                    };
                    m.close().await;
                    return end.map_err(ExecError::Cluster);
                }
            }
        }
        _ => supervised,
    };
    let ended = match (supervised, fence) {
        (Err(err), Some(fence)) => match superseded(err, fence, &config.name).await {
            Ok(fenced) => {
                // This attempt's unfinished output can never commit: its
                // files go (only its own: the newer run's are named by
                // another attempt).
                for c in committers.values() {
                    let c = c.clone();
                    let attempt = sink_ctx.attempt.clone();
                    let removed = tokio::task::spawn_blocking(move || c.abandon(&attempt)).await;
                    if let Ok(Err(e)) = removed {
                        tracing::warn!(target: "weir::checkpoint", "job '{}': could not remove the output of a replaced attempt: {e}", config.name);
                    }
                }
                return Err(fenced);
            }
            Err(err) => Err(err),
        },
        (ended, _) => ended,
    };
    ended?;
    if !sink_ctx.exactly_once && !*stop_rx.borrow() {
        // The input ended and the writers committed their output: what
        // waits for the end (a file sink's partitions) is committed now.
        for c in committers.values() {
            let c = c.clone();
            tokio::task::spawn_blocking(move || c.finish())
                .await
                .map_err(|e| ExecError::internal(format!("sink finish failed: {e}")))??;
        }
    }
    if let Some(m) = &mesh {
        // A peer gone after its tasks were done changes nothing: the job
        // finished (its restart finds the job done).
        if let Err(e) = cluster::broadcast(
            m,
            &Control::JobDone {
                ok: true,
                reason: String::new(),
            },
        ) {
            tracing::warn!(target: "weir::checkpoint", "job '{}': the end not told to every worker: {e}", config.name);
        }
        m.close().await;
    }
    Ok(())
}

/// The committers of this worker's sinks, to let go of what worker 0
/// committed (see [`Committer::release`]); worker 0 alone commits and
/// recovers.
fn local_committers(graph: &StreamGraph, sink_ctx: &SinkContext) -> HashMap<String, Arc<dyn Committer>> {
    graph
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Sink(s) => s
                .factory
                .committer(&sink_ctx.for_sink(&n.uid))
                .map(|c| (n.uid.clone(), c)),
            _ => None,
        })
        .collect()
}

/// Watermark alignment across workers, every update interval of the
/// fastest group: worker 0 (`leader`) announces each group's minimum over
/// every worker's readers; the others send it their readers' watermarks.
/// Ends with the attempt (`alive` closed).
async fn align_across_workers(
    mesh: Arc<Mesh>,
    groups: HashMap<String, Arc<AlignmentCoordinator>>,
    mut alive: watch::Receiver<()>,
    leader: bool,
) {
    let interval = groups
        .values()
        .map(|c| c.update_interval)
        .min()
        .unwrap_or(Duration::from_millis(200))
        .max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = alive.changed() => return,
        }
        for (group, c) in &groups {
            if leader {
                if let Some(min) = c.group_min() {
                    // A lost worker fails the attempt elsewhere.
                    let _ = cluster::broadcast(
                        &mesh,
                        &Control::GroupMin {
                            group: group.clone(),
                            min,
                        },
                    );
                }
            } else {
                let reports = c.reports();
                if !reports.is_empty()
                    && let Some(link) = mesh.link(0)
                {
                    let _ = link.send_control(
                        Control::Alignment {
                            group: group.clone(),
                            reports,
                        }
                        .encode(),
                    );
                }
            }
        }
    }
}

/// Worker 0's side of the control channel from worker `peer`: its tasks'
/// reports go to the checkpoint coordinator; ends when its tasks are done.
async fn from_worker(
    peer: u32,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    reports: mpsc::UnboundedSender<crate::checkpoint::TaskReport>,
    failure: Option<impl Fn() -> Option<crate::exchange::link::LinkError>>,
    groups: HashMap<String, Arc<AlignmentCoordinator>>,
    suspend: Arc<CheckpointLog>,
    owners: Arc<Vec<u32>>,
) -> Result<()> {
    while let Some(bytes) = rx.recv().await {
        match Control::decode(&bytes).map_err(|e| ExecError::Cluster(format!("worker {peer}: {e}")))? {
            Control::Report(r) => {
                // A report of another worker's task (a worker started with
                // other placement, or a bug) would complete a checkpoint
                // with the wrong state.
                let task = r.task();
                if owners.get(task) != Some(&peer) {
                    return Err(ExecError::Cluster(format!(
                        "worker {peer} reported task {task}, which {}",
                        match owners.get(task) {
                            Some(w) => format!("runs on worker {w}"),
                            None => "does not exist".to_string(),
                        }
                    )));
                }
                // The coordinator is gone only when the attempt ends.
                let _ = reports.send(r.into_task_report());
            }
            Control::Alignment { group, reports } => {
                if let Some(c) = groups.get(&group) {
                    for (reader, watermark) in reports {
                        c.report(reader, watermark);
                    }
                }
            }
            Control::TasksDone => return Ok(()),
            Control::Suspend => {
                tracing::info!(target: "weir::checkpoint", "worker {peer} asks to suspend the job");
                suspend.suspend.send_replace(true);
            }
            Control::Failed { reason } => return Err(ExecError::Cluster(format!("worker {peer} failed: {reason}"))),
            other => {
                return Err(ExecError::Cluster(format!(
                    "worker {peer} sent the coordinator what only the coordinator sends: {other:?}"
                )));
            }
        }
    }
    let why = failure.and_then(|f| f()).map(|e| format!(": {e}")).unwrap_or_default();
    Err(ExecError::Cluster(format!(
        "the connection to worker {peer} is lost before its tasks ended{why}"
    )))
}

/// Another worker's side of the control channel from worker 0: barriers to
/// inject, checkpoints completed, the job's end (into `done`: `Err` when
/// the job failed or worker 0 is gone).
#[allow(clippy::too_many_arguments)]
async fn from_coordinator_loop(
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    triggers: watch::Sender<Option<crate::message::Barrier>>,
    writer: Arc<std::sync::Mutex<ReportWriter>>,
    done: watch::Sender<Option<std::result::Result<(), String>>>,
    failure: Option<impl Fn() -> Option<crate::exchange::link::LinkError>>,
    stop: Arc<watch::Sender<bool>>,
    groups: HashMap<String, Arc<AlignmentCoordinator>>,
    committers: HashMap<String, Arc<dyn Committer>>,
    inboxes: super::enumerator::Inboxes,
) {
    // The writer's lock is held through uploads: this loop never takes it
    // (a runtime thread would wait out the upload, and with it the
    // heartbeats, alignment and triggers). Triggers go in the book;
    // completions to a task of their own, in order.
    let book = writer.lock().unwrap_or_else(|p| p.into_inner()).book();
    // Splits worker 0's enumerators found for readers here, made in order
    // on a task of their own: making them may list the source again (see
    // `SourceFactory::restore_splits`), which must not hold up triggers.
    let (splits_tx, mut splits_rx) = mpsc::unbounded_channel::<(usize, Vec<(usize, SplitPosition)>)>();
    tokio::spawn(async move {
        while let Some((node, splits)) = splits_rx.recv().await {
            let inboxes = inboxes.clone();
            if tokio::task::spawn_blocking(move || inboxes.deliver_or_fail(node, splits))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let (completed_tx, mut completed_rx) = mpsc::unbounded_channel::<u64>();
    tokio::spawn(async move {
        while let Some(checkpoint_id) = completed_rx.recv().await {
            // Worker 0 committed this worker's output of it: what this
            // process holds for it is let go.
            let w = writer.clone();
            let Ok(released) = tokio::task::spawn_blocking(move || {
                w.lock().unwrap_or_else(|p| p.into_inner()).completed(checkpoint_id)
            })
            .await
            else {
                return;
            };
            for (key, committables) in released {
                let Some(c) = crate::checkpoint::parse_operator_key(&key)
                    .ok()
                    .and_then(|(uid, _)| committers.get(uid).cloned())
                else {
                    continue;
                };
                let job = tokio::task::spawn_blocking(move || c.release(&committables)).await;
                if let Ok(Err(e)) = job {
                    tracing::warn!(target: "weir::checkpoint", "releasing committed output of {key}: {e}");
                }
            }
        }
    });
    while let Some(bytes) = rx.recv().await {
        match Control::decode(&bytes) {
            Ok(Control::Trigger { barrier, savepoint_dir }) => {
                book.triggered(barrier.checkpoint_id, savepoint_dir);
                let _ = triggers.send(Some(barrier.into()));
            }
            Ok(Control::Completed { checkpoint_id }) => {
                let _ = completed_tx.send(checkpoint_id);
            }
            Ok(Control::Stop) => {
                let _ = stop.send(true);
            }
            Ok(Control::GroupMin { group, min }) => {
                if let Some(c) = groups.get(&group) {
                    c.follow(min);
                }
            }
            Ok(Control::Splits { node, splits }) => {
                let _ = splits_tx.send((node, splits));
            }
            Ok(Control::JobDone { ok, reason }) => {
                let _ = done.send(Some(if ok { Ok(()) } else { Err(format!("worker 0: {reason}")) }));
                return;
            }
            Ok(other) => {
                let _ = done.send(Some(Err(format!("worker 0 sent what it never sends: {other:?}"))));
                return;
            }
            Err(e) => {
                let _ = done.send(Some(Err(format!("worker 0: {e}"))));
                return;
            }
        }
    }
    let why = failure.and_then(|f| f()).map(|e| format!(": {e}")).unwrap_or_default();
    let _ = done.send(Some(Err(format!(
        "the connection to worker 0 (the job's coordinator) is lost{why}"
    ))));
}

/// Waits for worker 0's start of the attempt: the attempt's tag, the
/// checkpoint to restore, the splits; and the control channel from it.
#[allow(clippy::type_complexity)]
async fn await_start(
    c: &Cluster,
    m: &Mesh,
    ours: Option<String>,
) -> Result<
    Option<(
        String,
        Option<String>,
        Vec<Vec<Vec<SplitPosition>>>,
        mpsc::UnboundedReceiver<Vec<u8>>,
    )>,
> {
    let mut rx = m
        .link(0)
        .and_then(|l| l.take_control())
        .ok_or_else(|| ExecError::internal("no control channel from worker 0"))?;
    let first = tokio::time::timeout(c.join_deadline, rx.recv())
        .await
        .map_err(|_| ExecError::Cluster(format!("worker 0 did not start the job within {:?}", c.join_deadline)))?
        .ok_or_else(|| ExecError::Cluster("the connection to worker 0 is lost before the job started".into()))?;
    match Control::decode(&first).map_err(|e| ExecError::Cluster(format!("worker 0: {e}")))? {
        Control::Start {
            attempt,
            restore,
            splits,
            checkpoints,
        } => {
            if checkpoints != ours {
                return Err(ExecError::Config(format!(
                    "worker 0 keeps the job's checkpoints in {}, this worker in {}: every worker must write them \
                     to one place all reach (SET 'execution.checkpointing.dir' = 's3://...', the same for all; \
                     a local path only when every worker shares it)",
                    checkpoints.as_deref().unwrap_or("(none: checkpointing off)"),
                    ours.as_deref().unwrap_or("(none: checkpointing off)")
                )));
            }
            Ok(Some((attempt, restore, splits, rx)))
        }
        Control::JobDone { ok: true, .. } => Ok(None),
        Control::JobDone { ok: false, reason } => Err(ExecError::Cluster(format!("worker 0: {reason}"))),
        other => Err(ExecError::Cluster(format!(
            "worker 0 sent {other:?} before starting the job"
        ))),
    }
}

/// The splits worker 0 dealt (see [`deal_splits`]), as this worker's
/// readers open them: only its own subtasks' splits are opened.
fn splits_from_coordinator(
    graph: &StreamGraph,
    chains: &[Vec<NodeId>],
    splits: Vec<Vec<Vec<SplitPosition>>>,
    cluster: Option<&Cluster>,
) -> Result<Vec<DealtSplits>> {
    if splits.len() != chains.len() {
        return Err(ExecError::Cluster(format!(
            "worker 0 dealt splits for {} chains, this worker's plan has {}",
            splits.len(),
            chains.len()
        )));
    }
    let mut out = vec![];
    for (chain, per_subtask) in chains.iter().zip(splits) {
        let head = graph.node(chain[0]);
        let mut all = std::collections::BTreeSet::new();
        let mut dealt = vec![];
        if let NodeKind::Source(src) = &head.kind {
            // Opened all together, as a restore does (a source may size
            // its splits by how many there are), then dealt as worker 0
            // dealt them; the others' splits are dropped unread.
            let mut owner = HashMap::new();
            let mut every = vec![];
            for (subtask, positions) in per_subtask.into_iter().enumerate() {
                for p in positions {
                    all.insert(p.split.clone());
                    owner.insert(p.split.clone(), subtask);
                    every.push(p);
                }
            }
            dealt = (0..head.parallelism).map(|_| vec![]).collect();
            if !every.is_empty() {
                for split in src.factory.restore_splits(&every)? {
                    // A split worker 0 did not deal (a file that appeared
                    // since it listed) is its enumerator's to find.
                    if let Some(subtask) = owner.remove(&split.id())
                        && subtask < dealt.len()
                        && cluster.is_some_and(|c| c.is_local(subtask))
                    {
                        dealt[subtask].push(split);
                    }
                }
            }
            if let Some(missing) = owner.keys().next() {
                return Err(ExecError::Cluster(format!(
                    "worker 0 dealt split '{missing}' of {}, which this worker cannot make",
                    src.table.name
                )));
            }
            dealt.resize_with(head.parallelism, Vec::new);
        }
        out.push((dealt, all));
    }
    Ok(out)
}

/// One input channel of a subtask: its data, and with unaligned
/// checkpoints a lane for barriers that overtake data.
type Lane = (
    mpsc::Receiver<StreamMessage>,
    Option<mpsc::UnboundedReceiver<crate::message::Barrier>>,
);

/// The channels of an attempt, per chain and subtask: for every edge that
/// is not chained, a bounded channel from each upstream subtask to each
/// downstream subtask it can reach.
struct Wiring {
    inputs: Vec<Vec<Vec<Lane>>>,
    /// The operator input each of those channels feeds.
    ports: Vec<Vec<Vec<usize>>>,
    /// The upstream (chain, subtask) of each of those channels.
    origins: Vec<Vec<Vec<(usize, usize)>>>,
    outputs: Vec<Vec<Option<Output>>>,
    /// The forwarding tasks of channels that cross to another worker.
    bridges: Vec<Bridge>,
}

/// With `remote` (a job spread over workers), only this worker's
/// subtasks get working ends: a channel between two of them stays
/// in-memory; one to or from a subtask on another worker is an
/// in-memory channel joined to a channel of the link to that worker by a
/// forwarding task (in `Wiring::bridges`). Channel ids count in this
/// function's order, which is the same on every worker (the same graph).
fn wire(
    graph: &StreamGraph,
    chains: &[Vec<NodeId>],
    config: &JobConfig,
    metrics: &JobMetrics,
    remote: Option<(&Cluster, &Mesh)>,
) -> Result<Wiring> {
    let chain_of = |node: NodeId| chains.iter().position(|c| c.contains(&node));
    let unaligned = config.checkpointing.as_ref().is_some_and(|c| c.unaligned);
    let mut inputs: Vec<Vec<Vec<Lane>>> = chains
        .iter()
        .map(|c| (0..graph.node(c[0]).parallelism).map(|_| vec![]).collect())
        .collect();
    let mut ports: Vec<Vec<Vec<usize>>> = chains
        .iter()
        .map(|c| (0..graph.node(c[0]).parallelism).map(|_| vec![]).collect())
        .collect();
    let mut origins: Vec<Vec<Vec<(usize, usize)>>> = chains
        .iter()
        .map(|c| (0..graph.node(c[0]).parallelism).map(|_| vec![]).collect())
        .collect();
    let mut outputs: Vec<Vec<Option<Output>>> = chains
        .iter()
        .map(|c| (0..graph.node(c[0]).parallelism).map(|_| None).collect())
        .collect();
    let mut bridges: Vec<Bridge> = vec![];
    let mut next_channel = 0u32;
    let worker_of = |subtask: usize| remote.map_or(0, |(c, _)| c.worker_of(subtask));
    let me = remote.map_or(0, |(c, _)| c.index);
    let link = |worker: u32| -> Result<&crate::exchange::link::Link> {
        remote
            .and_then(|(_, m)| m.link(worker))
            .ok_or_else(|| ExecError::internal(format!("no link to worker {worker}")))
    };
    let exchange_error = |e: crate::exchange::link::LinkError| ExecError::Cluster(e.to_string());
    for edge in graph.edges.iter().filter(|e| !graph.is_chained(e)) {
        let (Some(from_chain), Some(to_chain)) = (chain_of(edge.from), chain_of(edge.to)) else {
            return Err(ExecError::internal("edge between unknown nodes"));
        };
        let p_from = graph.node(edge.from).parallelism;
        let p_to = graph.node(edge.to).parallelism;
        // `i` is the upstream subtask: it picks targets and the slot in `outputs`.
        #[allow(clippy::needless_range_loop)]
        for i in 0..p_from {
            let targets: Vec<usize> = match edge.exchange {
                Exchange::Forward if p_from == p_to => vec![i],
                Exchange::Global => vec![0],
                _ => (0..p_to).collect(),
            };
            let mut senders = vec![];
            let mut priority = vec![];
            for t in targets {
                let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
                // Unaligned checkpoints: a lane for barriers that overtake data.
                let lane = unaligned.then(mpsc::unbounded_channel);
                let (data_id, lane_id) = (next_channel, next_channel + 1);
                next_channel += 2;
                let (from_here, to_here) = (worker_of(i) == me, worker_of(t) == me);
                // The ends a subtask of another worker would hold are left
                // unused here (its task runs there).
                let (tx, rx, lane) = match (from_here, to_here) {
                    (true, false) => {
                        let l = link(worker_of(t))?;
                        let remote_tx = l.sender(data_id).map_err(exchange_error)?;
                        bridges.push(Box::pin(async move {
                            crate::exchange::bridge::forward_out(rx, remote_tx)
                                .await
                                .map_err(|e| ExecError::Cluster(e.to_string()))
                        }));
                        let lane = match lane {
                            Some((ptx, prx)) => {
                                let remote_lane = l.sender(lane_id).map_err(exchange_error)?;
                                bridges.push(Box::pin(async move {
                                    crate::exchange::bridge::forward_lane_out(prx, remote_lane)
                                        .await
                                        .map_err(|e| ExecError::Cluster(e.to_string()))
                                }));
                                Some((ptx, mpsc::unbounded_channel().1))
                            }
                            None => None,
                        };
                        (tx, mpsc::channel(1).1, lane)
                    }
                    (false, true) => {
                        let l = link(worker_of(i))?;
                        let remote_rx = l.receiver(data_id, CHANNEL_CAPACITY as u32).map_err(exchange_error)?;
                        let lost = l.failure_probe();
                        bridges.push(Box::pin(async move {
                            crate::exchange::bridge::forward_in(remote_rx, tx, lost)
                                .await
                                .map_err(|e| ExecError::Cluster(e.to_string()))
                        }));
                        let lane = match lane {
                            Some((ptx, prx)) => {
                                let remote_lane = l.receiver(lane_id, LANE_CREDITS).map_err(exchange_error)?;
                                let lost = l.failure_probe();
                                bridges.push(Box::pin(async move {
                                    crate::exchange::bridge::forward_lane_in(remote_lane, ptx, lost)
                                        .await
                                        .map_err(|e| ExecError::Cluster(e.to_string()))
                                }));
                                Some((mpsc::unbounded_channel().0, prx))
                            }
                            None => None,
                        };
                        (mpsc::channel(1).0, rx, lane)
                    }
                    _ => (tx, rx, lane),
                };
                senders.push(tx);
                let lane = lane.map(|(ptx, prx)| {
                    priority.push(ptx);
                    prx
                });
                inputs[to_chain][t].push((rx, lane));
                ports[to_chain][t].push(edge.input);
                origins[to_chain][t].push((from_chain, i));
            }
            let partitioner = match &edge.exchange {
                Exchange::Hash(keys) => {
                    let input_schema = &graph.node(edge.from).schema;
                    let types = keys
                        .iter()
                        .map(|k| k.data_type(input_schema))
                        .collect::<Result<Vec<DataType>, _>>()?;
                    if types.is_empty() {
                        Partitioner::Forward
                    } else {
                        Partitioner::Hash {
                            keys: keys.clone(),
                            encoder: KeyEncoder::new(&types)?,
                            max_parallelism: config.max_parallelism,
                        }
                    }
                }
                _ if senders.len() == 1 => Partitioner::Forward,
                _ => Partitioner::Rebalance { next: i },
            };
            let output = Output::channels(senders, partitioner)
                .with_priority(priority)
                .with_backpressure_counter(metrics.nodes[edge.from].backpressured_ns.clone());
            // A node with several consumers sends to each.
            outputs[from_chain][i] = Some(match outputs[from_chain][i].take() {
                Some(earlier) => earlier.and(output),
                None => output,
            });
        }
    }
    Ok(Wiring {
        inputs,
        ports,
        origins,
        outputs,
        bridges,
    })
}

/// A task joining an in-memory channel to a channel of a link.
type Bridge = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

/// Credits of a barrier lane between workers: enough that a barrier never
/// waits for the receiver to take the one before.
const LANE_CREDITS: u32 = 64;

/// The restore side of an attempt: every committer of the job (sinks',
/// dead letters', sources told of completed checkpoints), with what the
/// restored checkpoint pre-committed committed now and what a failed
/// attempt wrote outside any checkpoint removed. `None`: the restored run
/// had ended (its last output is committed; nothing is left to run).
async fn restore_commits(
    graph: &StreamGraph,
    config: &JobConfig,
    sink_ctx: &SinkContext,
    restored: Option<&RestoredJob>,
) -> Result<Option<HashMap<String, Arc<dyn Committer>>>> {
    let mut committers: HashMap<String, Arc<dyn Committer>> = HashMap::new();
    for n in &graph.nodes {
        if let NodeKind::Sink(s) = &n.kind
            && let Some(c) = s.factory.committer(&sink_ctx.for_sink(&n.uid))
        {
            committers.insert(n.uid.clone(), c);
        }
        // A source's dead letters are committed like a sink's output.
        if let NodeKind::Source(s) = &n.kind
            && let Some(dir) = s.factory.dead_letter_dir()
        {
            committers.insert(n.uid.clone(), crate::connectors::dead_letter::committer(dir, sink_ctx));
        }
        // A source told of completed checkpoints (Kafka's group offsets).
        if let NodeKind::Source(s) = &n.kind
            && let Some(c) = s.factory.committer(sink_ctx)
        {
            committers.insert(n.uid.clone(), c);
        }
    }
    if let Some(r) = restored {
        // Output the restored checkpoint pre-committed is committed now
        // (again, if it was before: commits are idempotent).
        commit_all(&committers, &r.metadata).await?;
    }
    if sink_ctx.exactly_once || restored.is_some() {
        // What a failed attempt wrote and no checkpoint holds goes.
        for c in committers.values() {
            let c = c.clone();
            tokio::task::spawn_blocking(move || c.recover())
                .await
                .map_err(|e| ExecError::internal(format!("sink recovery failed: {e}")))??;
        }
    }
    if restored.is_some_and(|r| r.metadata.is_final) {
        return Ok(None);
    }
    if restored.is_none() {
        crate::checkpoint::storage::remove_dir_if_exists(&config.job_dir.join("state"))?;
    }
    Ok(Some(committers))
}

/// Each chain's source splits dealt to its subtasks (empty for a chain
/// without a source), and every split id. A source's splits are listed
/// once and dealt: a listing per subtask could differ (a topic created in
/// between) and leave a split to no reader. Restored: the splits the
/// snapshot has positions for, whatever the parallelism was (split ids
/// do not depend on it); fresh: as many as subtasks.
fn deal_splits(
    graph: &StreamGraph,
    chains: &[Vec<NodeId>],
    restored: Option<&RestoredJob>,
) -> Result<Vec<DealtSplits>> {
    let mut dealt_splits: Vec<DealtSplits> = vec![];
    for chain in chains {
        let head = graph.node(chain[0]);
        let mut dealt: Vec<Vec<Box<dyn crate::connectors::SourceSplit>>> = vec![];
        let mut all_splits = std::collections::BTreeSet::new();
        if let NodeKind::Source(src) = &head.kind {
            let recorded: &[crate::checkpoint::SplitPosition] = restored
                .and_then(|r| r.metadata.sources.get(&head.uid))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let splits = if recorded.is_empty() {
                src.factory.create_splits(head.parallelism)?
            } else {
                src.factory.restore_splits(recorded)?
            };
            all_splits = splits.iter().map(|s| s.id()).collect();
            dealt = (0..head.parallelism).map(|_| vec![]).collect();
            for (i, s) in splits.into_iter().enumerate() {
                dealt[i % head.parallelism].push(s);
            }
        }
        dealt_splits.push((dealt, all_splits));
    }
    Ok(dealt_splits)
}

/// Supervision of an attempt's subtasks and checkpoint coordinator: the
/// first failure (or a cancel) fails the attempt and aborts every
/// subtask; the coordinator is let finish.
async fn supervise(
    mut tasks: JoinSet<Result<()>>,
    mut coordinator_set: JoinSet<Result<crate::checkpoint::coordinator::CoordinatorEnd>>,
    cancel: &watch::Receiver<bool>,
    gone: Option<Pin<Box<dyn std::future::Future<Output = ExecError> + Send>>>,
) -> Result<()> {
    // Worker 0 gone or failed (another worker): the attempt is over.
    let mut gone = gone;
    // The coordinator is not aborted with the tasks: it finishes what it
    // is writing (a checkpoint whose metadata is on disk gets committed)
    // and ends when the last task's report channel closes.
    let mut first_error = None;
    let mut fail = |err: ExecError, tasks: &mut JoinSet<Result<()>>| {
        if first_error.is_none() {
            first_error = Some(err);
            // One failed subtask fails the attempt.
            tasks.abort_all();
        }
    };
    let mut cancel = cancel.clone();
    let mut cancelling = *cancel.borrow();
    // A handle dropped without cancelling: nothing more can come.
    let mut cancel_gone = false;
    if cancelling {
        fail(ExecError::Cancelled, &mut tasks);
    }
    loop {
        tokio::select! {
            r = cancel.changed(), if !cancelling && !cancel_gone => {
                if r.is_err() {
                    cancel_gone = true;
                } else if *cancel.borrow() {
                    cancelling = true;
                    fail(ExecError::Cancelled, &mut tasks);
                }
            }
            err = async {
                match gone.as_mut() {
                    Some(g) => g.await,
                    None => std::future::pending().await,
                }
            }, if gone.is_some() => {
                tracing::debug!(target: "weir::cluster", "worker 0 is gone: {err}");
                gone = None;
                fail(err, &mut tasks);
            }
            res = tasks.join_next() => match res {
                None => {
                    tracing::debug!(target: "weir::cluster", "the attempt's subtasks ended");
                    break;
                }
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => fail(e, &mut tasks),
                Some(Err(e)) if e.is_cancelled() => {}
                Some(Err(e)) => fail(ExecError::internal(format!("subtask panicked: {e}")), &mut tasks),
            },
            Some(res) = coordinator_set.join_next(), if !coordinator_set.is_empty() => match res {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => fail(e, &mut tasks),
                Err(e) => fail(ExecError::internal(format!("checkpoint coordinator panicked: {e}")), &mut tasks),
            },
        }
    }
    while let Some(res) = coordinator_set.join_next().await {
        match res {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => fail(e, &mut tasks),
            Err(e) => fail(
                ExecError::internal(format!("checkpoint coordinator panicked: {e}")),
                &mut tasks,
            ),
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `r` is the snapshot the user named (`execution.state-recovery.path`)
/// and the claim mode is NO_CLAIM: the job must neither build on nor
/// delete it.
fn no_claim_restore(r: &RestoredJob, config: &JobConfig) -> bool {
    !config.claim && config.recovery_path.as_deref().is_some_and(|p| p == r.path.as_path())
}

/// The operator of subtask `subtask` of node `id`: built by its own file's
/// constructor.
#[allow(clippy::too_many_arguments)]
fn create_operator(
    graph: &StreamGraph,
    id: NodeId,
    subtask: usize,
    config: &JobConfig,
    tuning: &crate::state::RocksDbTuning,
    metrics: &Arc<JobMetrics>,
    restored: Option<&RestoredJob>,
    sink_ctx: &SinkContext,
) -> Result<Box<dyn Operator>> {
    use crate::operators::*;
    use crate::plan::{JoinNode, RankNode, RankStrategy, WindowKind};
    let ctx = build::BuildCtx {
        graph,
        id,
        subtask,
        config,
        tuning,
        metrics: metrics.nodes[id].clone(),
        restored,
        attempt: &sink_ctx.attempt,
    };
    let node = graph.node(id);
    match &node.kind {
        NodeKind::Source(_) => Err(ExecError::internal("a source is not an operator")),
        NodeKind::Sink(s) => crate::connectors::sink_writer::writer_operator(
            s.factory.as_ref(),
            subtask,
            node.parallelism,
            &sink_ctx.for_sink(&node.uid),
        ),
        NodeKind::Calc(c) => calc::build(c, &ctx),
        NodeKind::Union => union::build(&ctx),
        NodeKind::Limit(l) => limit::build(l, &ctx),
        NodeKind::Join(j @ JoinNode { window: Some(ends), .. }) => window_join::build(j, *ends, &ctx),
        NodeKind::Join(
            j @ JoinNode {
                temporal: Some(times), ..
            },
        ) => temporal_join::build(j, *times, &ctx),
        NodeKind::Join(
            j @ JoinNode {
                interval: Some(bounds), ..
            },
        ) => interval_join::build(j, bounds, &ctx),
        NodeKind::Join(j) => join::build(j, &ctx),
        NodeKind::TemporalSort(t) => temporal_sort::build(t, &ctx),
        NodeKind::ChangelogNormalize(c) => changelog_normalize::build(c, &ctx),
        NodeKind::UpsertMaterialize(m) => upsert_materialize::build(m, &ctx),
        NodeKind::Rank(
            r @ RankNode {
                strategy: RankStrategy::Window { end, later_ties_first },
                ..
            },
        ) => window_rank::build(r, *end, *later_ties_first, &ctx),
        NodeKind::Rank(r) if r.strategy == RankStrategy::KeepFirstRowtime => dedup_first::build(r, &ctx),
        NodeKind::Rank(r) => rank::build(r, &ctx),
        NodeKind::GroupAggregate(g) => group::aggregate::build(g, &ctx),
        NodeKind::WindowAggregate(w) if w.window.kind == WindowKind::Session => {
            window::session::build_aggregate(w, &ctx)
        }
        NodeKind::WindowAggregate(w) => window::aggregate::build(w, &ctx),
        NodeKind::SessionWindow(w) => window::session::build_rows(w, &ctx),
        NodeKind::OverAggregate(o) => over_aggregate::build(o, &ctx),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::control::WireReport;

    /// Worker 0 takes a task's report only from the worker that runs it.
    #[tokio::test]
    async fn a_report_of_another_workers_task_fails_the_attempt() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (reports, mut got) = mpsc::unbounded_channel();
        let decline = |task| {
            Control::Report(WireReport::Decline {
                checkpoint_id: 1,
                task,
                reason: "test".into(),
            })
            .encode()
        };
        // Tasks 0..3 run on workers 0, 1, 0.
        tx.send(decline(1)).expect("send");
        tx.send(decline(2)).expect("send");
        drop(tx);
        let end = from_worker(
            1,
            rx,
            reports,
            None::<fn() -> Option<crate::exchange::link::LinkError>>,
            HashMap::new(),
            Arc::new(CheckpointLog::default()),
            Arc::new(vec![0, 1, 0]),
        )
        .await;
        let e = end.expect_err("refused");
        assert!(
            e.to_string()
                .contains("worker 1 reported task 2, which runs on worker 0"),
            "{e}"
        );
        // Its own task's report went through first.
        assert!(got.try_recv().is_ok());
        assert!(got.try_recv().is_err());
    }
}
