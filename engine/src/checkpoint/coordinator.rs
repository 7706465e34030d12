//! The job's `CheckpointCoordinator` (one tokio task per job attempt).
//!
//! Triggers checkpoint N every `execution.checkpointing.interval` (after
//! `min-pause` since the last one ended, one at a time) by announcing
//! barrier N to the source readers; collects every task's acknowledgement;
//! materialises the checkpoint on the blocking pool; then commits the
//! sinks' pre-committed output and deletes unreferenced files. A checkpoint
//! that expires (`timeout`) or is declined is aborted; more consecutive
//! failures than `tolerable-failed-checkpoints` fail the job.
//!
//! When every task has finished, a final checkpoint records the finished
//! positions and the last sink output, and commits it (Flink's final
//! checkpoint, FLIP-147): output after the last periodic checkpoint is
//! committed exactly once too.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::fence::Fence;
use super::metadata::{CheckpointMetadata, FORMAT_VERSION, FileRef, OperatorInfo, OperatorState, SavepointInfo};
use super::savepoint::{SavepointDone, SavepointHeader, SavepointRequest};
use super::storage::CheckpointStorage;
use super::{CheckpointConfig, CheckpointError, OperatorSnapshot, TaskReport, TaskSnapshot};
use crate::checkpoint::commit::Committer;
use crate::error::{ExecError, Result};
use crate::failpoint::failpoint;
use crate::message::{Barrier, BarrierKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointStatus {
    InProgress,
    Completed,
    Failed,
}

impl CheckpointStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            CheckpointStatus::InProgress => "IN_PROGRESS",
            CheckpointStatus::Completed => "COMPLETED",
            CheckpointStatus::Failed => "FAILED",
        }
    }
}

/// One row of `SHOW CHECKPOINTS`.
#[derive(Debug, Clone)]
pub struct CheckpointStats {
    pub id: u64,
    pub trigger_time_ms: i64,
    pub duration: Duration,
    /// Longest barrier alignment of any task.
    pub alignment: Duration,
    /// Longest synchronous part of any task.
    pub sync: Duration,
    /// Upload, metadata and commit.
    pub async_part: Duration,
    /// Bytes of state the checkpoint references.
    pub full_bytes: u64,
    /// Bytes uploaded for it (the increment).
    pub incremental_bytes: u64,
    /// In-flight data persisted (unaligned checkpoints).
    pub in_flight_bytes: u64,
    pub status: CheckpointStatus,
    pub is_final: bool,
    pub message: String,
    /// What each sink's commit made in its own system (a Delta version).
    pub sink_commits: Vec<super::commit::SinkCommit>,
}

impl CheckpointStats {
    /// A checkpoint that has not completed: nothing measured yet.
    fn unfinished(barrier: Barrier, status: CheckpointStatus, message: String) -> Self {
        Self {
            id: barrier.checkpoint_id,
            trigger_time_ms: barrier.timestamp,
            duration: Duration::ZERO,
            alignment: Duration::ZERO,
            sync: Duration::ZERO,
            async_part: Duration::ZERO,
            full_bytes: 0,
            incremental_bytes: 0,
            in_flight_bytes: 0,
            status,
            is_final: false,
            message,
            sink_commits: vec![],
        }
    }
}

/// The checkpoint history of a job, shared with `SHOW CHECKPOINTS`.
#[derive(Debug, Default)]
pub struct CheckpointLog {
    entries: Mutex<VecDeque<CheckpointStats>>,
    /// Set when the job was restored: (checkpoint id, path).
    pub restored_from: Mutex<Option<(u64, String)>>,
    /// Checkpoints that completed / failed, ever (the log keeps the last
    /// 100 only); completions can be waited for.
    pub completed_total: watch::Sender<u64>,
    pub failed_total: std::sync::atomic::AtomicU64,
    /// Asks the coordinator for a checkpoint now (then as soon as the one
    /// in progress ends), e.g. before a job is suspended.
    pub trigger_now: tokio::sync::Notify,
    /// A job over workers: some worker was asked to suspend the job (its
    /// pod is going away). Set on worker 0 by a worker's request, on the
    /// others to send worker 0 that request.
    pub suspend: watch::Sender<bool>,
    /// Savepoints this job took, oldest first.
    pub savepoints: Mutex<Vec<super::savepoint::SavepointListing>>,
    /// Milliseconds the last restore took to open every operator's state
    /// (laying files out excluded); set once the restored attempt runs.
    pub restore_open_ms: std::sync::atomic::AtomicU64,
    /// Milliseconds the last restore took to choose, verify and lay out
    /// the snapshot's files (downloading them from an object store).
    pub restore_layout_ms: std::sync::atomic::AtomicU64,
    /// Each sink's latest commit report, by sink (kept when a checkpoint
    /// commits nothing, so the metrics' series do not come and go).
    latest_sink_commits: Mutex<BTreeMap<String, super::commit::SinkCommit>>,
}

const LOG_ENTRIES: usize = 100;

impl CheckpointLog {
    pub fn entries(&self) -> Vec<CheckpointStats> {
        self.entries
            .lock()
            .map(|e| e.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Each sink's latest commit report (see [`super::Committer::take_report`]).
    pub fn latest_sink_commits(&self) -> Vec<super::commit::SinkCommit> {
        self.latest_sink_commits
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    fn upsert(&self, s: CheckpointStats) {
        if let Ok(mut latest) = self.latest_sink_commits.lock() {
            // A replay recognised makes no version: the one before stands.
            for c in s.sink_commits.iter().filter(|c| c.version.is_some()) {
                latest.insert(c.sink.clone(), c.clone());
            }
        }
        match s.status {
            CheckpointStatus::Completed => self.completed_total.send_modify(|n| *n += 1),
            CheckpointStatus::Failed => {
                self.failed_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            CheckpointStatus::InProgress => {}
        }
        if let Ok(mut e) = self.entries.lock() {
            match e.iter_mut().find(|x| x.id == s.id) {
                Some(x) => *x = s,
                None => {
                    e.push_back(s);
                    if e.len() > LOG_ENTRIES {
                        e.pop_front();
                    }
                }
            }
        }
    }

    pub fn last_completed(&self) -> Option<CheckpointStats> {
        self.entries()
            .into_iter()
            .rev()
            .find(|s| s.status == CheckpointStatus::Completed)
    }
}

struct Pending {
    barrier: Barrier,
    started: Instant,
    deadline: Instant,
    acks: HashMap<usize, (TaskSnapshot, Duration, Duration)>,
    /// Set when it is a savepoint: where it goes and whom to answer.
    savepoint: Option<SavepointRequest>,
}

/// Savepoint requests of a job: one queue that every attempt's
/// coordinator serves in turn.
pub type SavepointQueue = Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<SavepointRequest>>>;

/// How the coordinator ended.
#[derive(Debug, PartialEq, Eq)]
pub enum CoordinatorEnd {
    /// Every task finished and the final checkpoint is committed.
    Finished,
    /// The tasks went away without finishing (failure or cancel).
    TasksGone,
}

pub struct CheckpointCoordinator {
    pub config: CheckpointConfig,
    pub storage: CheckpointStorage,
    pub job: String,
    pub fingerprint: String,
    pub tasks: usize,
    /// Task indexes of source readers (where barriers are injected).
    pub source_tasks: Vec<usize>,
    pub triggers: watch::Sender<Option<Barrier>>,
    pub reports: mpsc::UnboundedReceiver<TaskReport>,
    /// Operator uid → the committer of its output.
    pub committers: HashMap<String, Arc<dyn Committer>>,
    pub log: Arc<CheckpointLog>,
    /// The checkpoint restored from, if any: the base for the next
    /// incremental checkpoint.
    pub restored: Option<CheckpointMetadata>,
    pub max_parallelism: u16,
    pub operator_info: BTreeMap<String, OperatorInfo>,
    pub savepoints: SavepointQueue,
    /// Stops the job: a stop-with-savepoint stops it the moment its
    /// savepoint completes, before any other barrier could let the sources
    /// read on.
    pub stop: Option<Arc<watch::Sender<bool>>>,
    /// A checkpoint of this job's directory restored under NO_CLAIM: kept
    /// by garbage collection whatever is retained.
    pub protected: Option<CheckpointMetadata>,
    /// A snapshot restored in CLAIM mode: deleted once a checkpoint of
    /// this job completes.
    pub claimed: Option<std::path::PathBuf>,
    /// This run's hold on the storage: every checkpoint id is claimed and
    /// every checkpoint and savepoint published through it, before any
    /// sink commits.
    pub fence: Arc<Fence>,
    /// A job spread over workers: what the other workers must hear of
    /// (barriers to inject at their sources, completed checkpoints).
    pub cluster: Option<mpsc::UnboundedSender<CoordinatorEvent>>,
    /// No checkpoint id below this one: ids continue above a restored
    /// savepoint's (as Flink's counter does) and above what a sink's
    /// system records as committed (see `Committer::committed_through`).
    pub first_id: u64,
}

/// What the coordinator tells the other workers of a job spread over
/// processes.
#[derive(Debug, Clone)]
pub enum CoordinatorEvent {
    /// A barrier was triggered (with a savepoint's directory).
    Triggered(Barrier, Option<std::path::PathBuf>),
    /// A checkpoint completed (its files are the next one's base).
    Completed(u64),
}

struct State {
    retained: VecDeque<CheckpointMetadata>,
    next_id: u64,
    finished: HashMap<usize, TaskSnapshot>,
    /// Sink output pre-committed for checkpoints that were then aborted:
    /// committed with the next checkpoint that completes.
    carried: BTreeMap<String, Vec<serde_json::Value>>,
    failures: u32,
    /// See [`CheckpointCoordinator::claimed`].
    claimed: Option<std::path::PathBuf>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn clone_finished(s: &TaskSnapshot) -> TaskSnapshot {
    TaskSnapshot {
        sources: s.sources.clone(),
        operators: s
            .operators
            .iter()
            .filter_map(|(k, o)| match o {
                OperatorSnapshot::Sink(c) => Some((k.clone(), OperatorSnapshot::Sink(c.clone()))),
                _ => None,
            })
            .collect(),
    }
}

/// Removes the local RocksDB checkpoint directories of an abandoned snapshot.
fn discard(snapshot: TaskSnapshot, carried: &mut BTreeMap<String, Vec<serde_json::Value>>) {
    for (key, op) in snapshot.operators {
        match op {
            OperatorSnapshot::RocksDb { dir, .. } => {
                let _ = std::fs::remove_dir_all(dir);
            }
            OperatorSnapshot::Sink(c) => carried.entry(key).or_default().extend(c),
            // A remote worker's files: unreferenced, the garbage
            // collection after the next completed checkpoint takes them.
            OperatorSnapshot::Heap(_)
            | OperatorSnapshot::InFlight(_)
            | OperatorSnapshot::Entries { .. }
            | OperatorSnapshot::Written(_) => {}
        }
    }
}

impl CheckpointCoordinator {
    pub async fn run(mut self) -> Result<CoordinatorEnd> {
        let mut st = State {
            retained: self.restored.take().into_iter().collect(),
            next_id: self.storage.next_id()?.max(self.first_id),
            finished: HashMap::new(),
            carried: BTreeMap::new(),
            failures: 0,
            claimed: self.claimed.take(),
        };
        let mut pending: Option<Pending> = None;
        let mut next_trigger = Instant::now() + self.config.interval;
        let queue = self.savepoints.clone();
        let mut savepoints = queue.lock().await;
        let mut stopping = false;
        loop {
            let can_trigger =
                !stopping && pending.is_none() && self.source_tasks.iter().any(|t| !st.finished.contains_key(t));
            let deadline = pending.as_ref().map(|p| p.deadline);
            tokio::select! {
                _ = tokio::time::sleep_until(next_trigger), if can_trigger => {
                    pending = self.trigger(&mut st, None).await?;
                    if pending.is_none() {
                        next_trigger = self.after(Instant::now());
                    }
                }
                _ = self.log.trigger_now.notified(), if can_trigger => {
                    pending = self.trigger(&mut st, None).await?;
                    if pending.is_none() {
                        next_trigger = self.after(Instant::now());
                    }
                }
                Some(req) = savepoints.recv(), if can_trigger => {
                    pending = self.trigger(&mut st, Some(req)).await?;
                    if pending.is_none() {
                        next_trigger = self.after(Instant::now());
                    }
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or(next_trigger)), if deadline.is_some() => {
                    if let Some(p) = pending.take() {
                        let timeout = self.config.timeout;
                        next_trigger = self.after(p.started);
                        self.fail(&mut st, p, format!("expired after {timeout:?} before every task acknowledged"))?;
                    }
                }
                report = self.reports.recv() => match report {
                    None => {
                        if let Some(p) = pending.take() {
                            self.abandon(&mut st, p, "the tasks stopped".into());
                        }
                        return Ok(CoordinatorEnd::TasksGone);
                    }
                    Some(TaskReport::Ack { checkpoint_id, task, snapshot, alignment, sync }) => {
                        match pending.as_mut() {
                            Some(p) if p.barrier.checkpoint_id == checkpoint_id => {
                                p.acks.insert(task, (snapshot, alignment, sync));
                            }
                            // An ack of an aborted checkpoint: its sink output
                            // waits for the next one.
                            _ => discard(snapshot, &mut st.carried),
                        }
                    }
                    Some(TaskReport::Finished { task, snapshot }) => {
                        st.finished.insert(task, snapshot);
                    }
                    Some(TaskReport::Decline { checkpoint_id, task, reason }) => {
                        if pending.as_ref().is_some_and(|p| p.barrier.checkpoint_id == checkpoint_id)
                            && let Some(p) = pending.take()
                        {
                            next_trigger = self.after(p.started);
                            self.fail(&mut st, p, format!("declined by task {task}: {reason}"))?;
                        }
                    }
                }
            }
            let complete = pending
                .as_ref()
                .is_some_and(|p| (0..self.tasks).all(|t| p.acks.contains_key(&t) || st.finished.contains_key(&t)));
            if complete && let Some(mut p) = pending.take() {
                let trigger_at = p.started;
                match p.savepoint.take() {
                    Some(req) => {
                        let stop = req.stop;
                        if self.complete_savepoint(&mut st, p, req).await? {
                            // Stopped at the savepoint: no barrier may
                            // follow (it would let the sources read on).
                            stopping |= stop;
                        } else if stop {
                            // The sources wait at the failed stop barrier:
                            // the next checkpoint lets them go on.
                            next_trigger = Instant::now();
                            continue;
                        }
                    }
                    None => self.complete(&mut st, p).await?,
                }
                next_trigger = self.after(trigger_at);
            }
            if st.finished.len() == self.tasks {
                if let Some(p) = pending.take() {
                    // Every task finished before this one completed.
                    self.abandon(&mut st, p, "every task finished first".into());
                }
                self.final_checkpoint(&mut st).await?;
                return Ok(CoordinatorEnd::Finished);
            }
        }
    }

    /// When the checkpoint after one triggered at `triggered` may start:
    /// one interval after it, and never closer than min-pause to now (the
    /// end of the last one), whether it completed or failed.
    fn after(&self, triggered: Instant) -> Instant {
        (triggered + self.config.interval).max(Instant::now() + self.config.min_pause)
    }

    /// Starts checkpoint (or savepoint) `st.next_id`: claims the id, then
    /// sends its barrier to the sources. `None` when the id could not be
    /// claimed (the storage failing: counted as a failed checkpoint).
    async fn trigger(&self, st: &mut State, savepoint: Option<SavepointRequest>) -> Result<Option<Pending>> {
        let kind = match &savepoint {
            Some(r) => BarrierKind::Savepoint {
                stop: r.stop,
                drain: r.drain,
            },
            None => BarrierKind::Checkpoint,
        };
        // No later attempt, and no other run of the job, writes into the
        // id's directory; an id another run took is skipped.
        let first = st.next_id;
        // Bounded by the checkpoint's timeout: a storage that hangs fails
        // the checkpoint, not the coordinator. (A claim that lands later
        // only leaves an id unused.)
        let claimed = match tokio::time::timeout(self.config.timeout, self.claim_from(first)).await {
            Ok(claimed) => claimed?,
            Err(_) => Err(CheckpointError::Expired(format!(
                "no answer within {:?} (the checkpoint storage is slow or unreachable)",
                self.config.timeout
            ))),
        };
        let id = match claimed {
            Ok(id) => id,
            Err(e) => {
                let barrier = Barrier {
                    checkpoint_id: first,
                    timestamp: now_ms(),
                    kind,
                };
                st.next_id = first + 1;
                let failed = Pending {
                    barrier,
                    started: Instant::now(),
                    deadline: Instant::now(),
                    acks: HashMap::new(),
                    savepoint,
                };
                self.fail(st, failed, format!("its id could not be claimed: {e}"))?;
                return Ok(None);
            }
        };
        let barrier = Barrier {
            checkpoint_id: id,
            timestamp: now_ms(),
            kind,
        };
        st.next_id = id + 1;
        self.log.upsert(CheckpointStats::unfinished(
            barrier,
            CheckpointStatus::InProgress,
            String::new(),
        ));
        let _ = self.triggers.send(Some(barrier));
        if let Some(c) = &self.cluster {
            let _ = c.send(CoordinatorEvent::Triggered(
                barrier,
                savepoint.as_ref().map(|r| r.dir.clone()),
            ));
        }
        let now = Instant::now();
        Ok(Some(Pending {
            barrier,
            started: now,
            deadline: now + self.config.timeout,
            acks: HashMap::new(),
            savepoint,
        }))
    }

    fn abandon(&self, st: &mut State, mut p: Pending, reason: String) {
        if let Some(req) = p.savepoint.take() {
            let _ = req
                .reply
                .send(Err(format!("savepoint {} failed: {reason}", p.barrier.checkpoint_id)));
        }
        for (_, (snapshot, _, _)) in p.acks {
            discard(snapshot, &mut st.carried);
        }
        let id = p.barrier.checkpoint_id;
        tracing::warn!(target: "weir::checkpoint", "job '{}': checkpoint {id} aborted: {reason}", self.job);
        self.log.upsert(CheckpointStats {
            duration: p.started.elapsed(),
            ..CheckpointStats::unfinished(p.barrier, CheckpointStatus::Failed, reason)
        });
    }

    /// Aborts `p` and counts the failure against the tolerance (a failed
    /// savepoint does not count: the job never asked for it).
    fn fail(&self, st: &mut State, p: Pending, reason: String) -> Result<()> {
        let id = p.barrier.checkpoint_id;
        let is_savepoint = p.savepoint.is_some();
        self.abandon(st, p, reason.clone());
        if is_savepoint {
            return Ok(());
        }
        st.failures += 1;
        if st.failures > self.config.tolerable_failed {
            return Err(ExecError::Checkpoint(format!(
                "checkpoint {id} failed ({reason}); {} consecutive failures exceed \
                 'execution.checkpointing.tolerable-failed-checkpoints' = {}",
                st.failures, self.config.tolerable_failed
            )));
        }
        Ok(())
    }

    /// Every task's part of a snapshot: its acknowledgement, or, for a
    /// task that finished before acknowledging, its final output (those
    /// tasks are returned too). A task that acknowledged before finishing
    /// is represented by its ack; its final output waits for the next one.
    fn task_snapshots(
        &self,
        st: &State,
        mut acks: HashMap<usize, (TaskSnapshot, Duration, Duration)>,
    ) -> (Vec<TaskSnapshot>, Vec<usize>) {
        let mut snapshots = vec![];
        let mut from_finished = vec![];
        for t in 0..self.tasks {
            match acks.remove(&t) {
                Some((s, _, _)) => snapshots.push(s),
                None => {
                    if let Some(f) = st.finished.get(&t) {
                        snapshots.push(clone_finished(f));
                        from_finished.push(t);
                    }
                }
            }
        }
        (snapshots, from_finished)
    }

    async fn complete(&self, st: &mut State, p: Pending) -> Result<()> {
        let id = p.barrier.checkpoint_id;
        let alignment = p.acks.values().map(|a| a.1).max().unwrap_or_default();
        let sync = p.acks.values().map(|a| a.2).max().unwrap_or_default();
        let (snapshots, from_finished) = self.task_snapshots(st, p.acks);
        let async_started = Instant::now();
        let header = self.header(id, p.barrier.timestamp, false);
        match self.materialize(st, header, snapshots, Some(p.deadline)).await {
            Ok((meta, uploaded)) => {
                st.failures = 0;
                self.commit_and_clean(st, meta, uploaded, p.started, alignment, sync, async_started)
                    .await?;
                if let Some(c) = &self.cluster {
                    let _ = c.send(CoordinatorEvent::Completed(id));
                }
                // Their final output is committed now: later checkpoints
                // need not carry it again.
                for t in from_finished {
                    if let Some(f) = st.finished.get_mut(&t) {
                        f.operators.retain(|(_, op)| !matches!(op, OperatorSnapshot::Sink(_)));
                    }
                }
                Ok(())
            }
            // Another run owns the job now: stop, never tolerate it.
            Err(e @ CheckpointError::Fenced { .. }) => Err(e.into()),
            Err(e) => {
                let failed = Pending {
                    barrier: p.barrier,
                    started: p.started,
                    deadline: p.deadline,
                    acks: HashMap::new(),
                    savepoint: None,
                };
                self.fail(st, failed, format!("could not be written: {e}"))
            }
        }
    }

    fn header(&self, id: u64, trigger_time_ms: i64, is_final: bool) -> Header {
        Header {
            id,
            job: self.job.clone(),
            fingerprint: self.fingerprint.clone(),
            trigger_time_ms,
            is_final,
            max_parallelism: self.max_parallelism,
            operator_info: self.operator_info.clone(),
        }
    }

    /// Writes savepoint `p` into the requested directory, commits the
    /// sink output it holds, and answers the request. `Ok(false)`: it
    /// failed (answered with the reason; the job goes on).
    async fn complete_savepoint(&self, st: &mut State, p: Pending, req: SavepointRequest) -> Result<bool> {
        let id = p.barrier.checkpoint_id;
        let (snapshots, from_finished) = self.task_snapshots(st, p.acks);
        let carried = std::mem::take(&mut st.carried);
        let mut kept = carried.clone();
        for s in &snapshots {
            for (key, op) in &s.operators {
                if let OperatorSnapshot::Sink(c) = op {
                    kept.entry(key.clone()).or_default().extend(c.iter().cloned());
                }
            }
        }
        let header = SavepointHeader {
            id,
            job: self.job.clone(),
            fingerprint: self.fingerprint.clone(),
            trigger_time_ms: p.barrier.timestamp,
            max_parallelism: self.max_parallelism,
            operator_info: self.operator_info.clone(),
            info: SavepointInfo {
                drained: req.drain,
                stopped: req.stop,
            },
        };
        let dir = req.dir.clone();
        let fence = self.fence.clone();
        let s3 = self.config.s3.clone();
        let written = tokio::task::spawn_blocking(move || {
            let storage = super::objects::storage_at(&dir, &s3)?;
            let meta = super::savepoint::write(&storage, header, snapshots, carried)?;
            // Its sinks commit below: only while this run owns the job. A
            // savepoint it may not publish must not stay restorable.
            if let Err(e) = fence.publish_savepoint(id, &dir) {
                let _ = storage.destroy();
                return Err(e);
            }
            Ok(meta)
        })
        .await
        .map_err(|e| CheckpointError::Internal(format!("savepoint task failed: {e}")));
        let meta = match written.and_then(|r| r) {
            Ok(meta) => meta,
            Err(e @ CheckpointError::Fenced { .. }) => {
                let _ = req.reply.send(Err(format!("savepoint {id} failed: {e}")));
                return Err(e.into());
            }
            Err(e) => {
                st.carried = kept;
                let reason = format!("could not be written to {}: {e}", req.dir.display());
                tracing::warn!(target: "weir::checkpoint", "job '{}': savepoint {id} {reason}", self.job);
                self.log.upsert(CheckpointStats {
                    duration: p.started.elapsed(),
                    ..CheckpointStats::unfinished(p.barrier, CheckpointStatus::Failed, format!("savepoint {reason}"))
                });
                let _ = req.reply.send(Err(format!("savepoint {id} {reason}")));
                return Ok(false);
            }
        };
        let sink_commits = commit_all(&self.committers, &meta).await?;
        for t in from_finished {
            if let Some(f) = st.finished.get_mut(&t) {
                f.operators.retain(|(_, op)| !matches!(op, OperatorSnapshot::Sink(_)));
            }
        }
        let bytes = meta.full_size();
        tracing::info!(
            target: "weir::checkpoint",
            "job '{}': savepoint {id} written to {} in {} ms ({bytes} bytes{})",
            self.job,
            req.dir.display(),
            p.started.elapsed().as_millis(),
            if req.drain { ", drained" } else { "" }
        );
        self.log.upsert(CheckpointStats {
            duration: p.started.elapsed(),
            full_bytes: bytes,
            incremental_bytes: bytes,
            sink_commits,
            ..CheckpointStats::unfinished(
                p.barrier,
                CheckpointStatus::Completed,
                format!("savepoint {}", req.dir.display()),
            )
        });
        if req.stop
            && let Some(stop) = &self.stop
        {
            // Before anyone hears of it: the job ends at this savepoint.
            let _ = stop.send(true);
        }
        if let Ok(mut l) = self.log.savepoints.lock() {
            l.push(super::savepoint::SavepointListing {
                path: req.dir.clone(),
                checkpoint_id: id,
                trigger_time_ms: p.barrier.timestamp,
                bytes,
                drained: req.drain,
                stopped: req.stop,
            });
        }
        let _ = req.reply.send(Ok(SavepointDone {
            path: req.dir,
            checkpoint_id: id,
            bytes,
            drained: req.drain,
        }));
        Ok(true)
    }

    async fn final_checkpoint(&self, st: &mut State) -> Result<()> {
        let started = Instant::now();
        let snapshots = (0..self.tasks)
            .filter_map(|t| st.finished.get(&t).map(clone_finished))
            .collect();
        // Claimed like every other id: no other run writes into it.
        let id = self.claim_from(st.next_id).await??;
        let header = self.header(id, now_ms(), true);
        st.next_id = id + 1;
        let (meta, uploaded) = self.materialize(st, header, snapshots, None).await?;
        self.commit_and_clean(st, meta, uploaded, started, Duration::ZERO, Duration::ZERO, started)
            .await
    }

    /// Claims the first checkpoint id from `first` on that no other run
    /// took (on the blocking pool: the fence's store blocks).
    async fn claim_from(&self, first: u64) -> Result<Result<u64, CheckpointError>> {
        let fence = self.fence.clone();
        tokio::task::spawn_blocking(move || -> Result<u64, CheckpointError> {
            let mut id = first;
            while !fence.claim_id(id)? {
                id += 1;
            }
            Ok(id)
        })
        .await
        .map_err(|e| ExecError::internal(format!("checkpoint id claim task failed: {e}")))
    }

    /// Uploads and writes the metadata on the blocking pool, by
    /// `deadline` (the checkpoint's timeout, which covers the writing as
    /// in Flink): a storage that hangs fails the checkpoint then, and the
    /// job goes on.
    async fn materialize(
        &self,
        st: &mut State,
        header: Header,
        snapshots: Vec<TaskSnapshot>,
        deadline: Option<Instant>,
    ) -> Result<(CheckpointMetadata, u64), CheckpointError> {
        let storage = self.storage.clone();
        let fence = self.fence.clone();
        let base = st.retained.back().cloned();
        let carried = std::mem::take(&mut st.carried);
        let incremental = self.config.incremental;
        // If writing fails, the sink output of this checkpoint (and what it
        // carried) must reach the next one, and local snapshots must go.
        let mut kept = carried.clone();
        let mut local_dirs = vec![];
        for s in &snapshots {
            for (key, op) in &s.operators {
                match op {
                    OperatorSnapshot::Sink(c) => kept.entry(key.clone()).or_default().extend(c.iter().cloned()),
                    OperatorSnapshot::RocksDb { dir, .. } => local_dirs.push(dir.clone()),
                    _ => {}
                }
            }
        }
        let gate = Arc::new(Gate::default());
        let task_gate = gate.clone();
        let mut task = tokio::task::spawn_blocking(move || {
            let r = materialize(
                &storage,
                &fence,
                &task_gate,
                header,
                snapshots,
                base.as_ref(),
                carried,
                incremental,
            );
            if r.is_err() {
                for d in local_dirs {
                    let _ = std::fs::remove_dir_all(d);
                }
            }
            r
        });
        let joined = match deadline {
            None => (&mut task).await,
            Some(deadline) => match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(joined) => joined,
                Err(_) if gate.expire() => {
                    // The task goes on until its current request returns,
                    // then finds the gate shut and removes what it wrote:
                    // this checkpoint can never be published.
                    st.carried = kept;
                    return Err(CheckpointError::Expired(format!(
                        "expired after {:?} while its files were being written (the checkpoint storage is slow \
                         or unreachable)",
                        self.config.timeout
                    )));
                }
                // It is publishing this very moment: that ends it.
                Err(_) => (&mut task).await,
            },
        };
        let result = joined
            .map_err(|e| CheckpointError::Internal(format!("upload task failed: {e}")))
            .and_then(|r| r);
        if result.is_err() {
            st.carried = kept;
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn commit_and_clean(
        &self,
        st: &mut State,
        meta: CheckpointMetadata,
        uploaded: u64,
        started: Instant,
        alignment: Duration,
        sync: Duration,
        async_started: Instant,
    ) -> Result<()> {
        let id = meta.checkpoint_id;
        failpoint("coordinator.before_commit");
        let sink_commits = commit_all(&self.committers, &meta).await?;
        failpoint("coordinator.after_commit");
        st.retained.push_back(meta.clone());
        if let Some(path) = st.claimed.take() {
            // CLAIM: the job owns the snapshot it started from, and no
            // longer needs it now that one of its own checkpoints exists.
            let s3 = self.config.s3.clone();
            let at = path.clone();
            let removed = tokio::task::spawn_blocking(move || super::objects::storage_at(&at, &s3)?.destroy())
                .await
                .map_err(|e| ExecError::internal(format!("claimed snapshot removal failed: {e}")))?;
            match removed {
                Ok(()) => {
                    tracing::info!(target: "weir::checkpoint", "job '{}': deleted the claimed snapshot {}", self.job, path.display())
                }
                Err(e) => {
                    tracing::warn!(target: "weir::checkpoint", "job '{}': could not delete the claimed snapshot {}: {e}", self.job, path.display())
                }
            }
        }
        while st.retained.len() > self.config.num_retained.max(1) {
            st.retained.pop_front();
        }
        let storage = self.storage.clone();
        let mut retained: Vec<CheckpointMetadata> = st.retained.iter().cloned().collect();
        retained.extend(self.protected.clone());
        let gc = tokio::task::spawn_blocking(move || storage.collect_garbage(&retained.iter().collect::<Vec<_>>()))
            .await
            .map_err(|e| ExecError::internal(format!("garbage collection task failed: {e}")))?;
        if let Err(e) = gc {
            // Garbage left behind is harmless; the next run retries.
            tracing::warn!(target: "weir::checkpoint", "job '{}': could not delete old checkpoint files: {e}", self.job);
        }
        let stats = CheckpointStats {
            id,
            trigger_time_ms: meta.trigger_time_ms,
            duration: started.elapsed(),
            alignment,
            sync,
            async_part: async_started.elapsed(),
            full_bytes: meta.full_size(),
            incremental_bytes: uploaded,
            in_flight_bytes: meta.in_flight_size(),
            status: CheckpointStatus::Completed,
            is_final: meta.is_final,
            message: String::new(),
            sink_commits,
        };
        tracing::info!(
            target: "weir::checkpoint",
            "job '{}': {}checkpoint {id} completed in {} ms (alignment {} ms, sync {} ms, async {} ms), \
             state {} bytes, uploaded {} bytes, in-flight {} bytes",
            self.job,
            if meta.is_final { "final " } else { "" },
            stats.duration.as_millis(),
            stats.alignment.as_millis(),
            stats.sync.as_millis(),
            stats.async_part.as_millis(),
            stats.full_bytes,
            stats.incremental_bytes,
            stats.in_flight_bytes,
        );
        self.log.upsert(stats);
        Ok(())
    }
}

/// Commits every sink committable of `meta` (idempotent: also used to
/// re-commit after a restore).
///
/// Output of a sink that is no longer in the job (a restore with
/// `ignore-unclaimed-state`) cannot be committed: it is dropped with a
/// warning, as Flink drops unclaimed state. Returns what the sinks'
/// systems recorded (see [`Committer::take_report`]).
pub async fn commit_all(
    committers: &HashMap<String, Arc<dyn Committer>>,
    meta: &CheckpointMetadata,
) -> Result<Vec<super::commit::SinkCommit>> {
    let mut reports = vec![];
    let mut by_uid: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for (key, state) in &meta.operators {
        if let OperatorState::Sink { committables } = state {
            let (uid, _) = super::parse_operator_key(key)?;
            by_uid
                .entry(uid.to_string())
                .or_default()
                .extend(committables.iter().cloned());
        }
    }
    for (uid, committables) in by_uid {
        let Some(c) = committers.get(&uid).cloned() else {
            tracing::warn!(
                target: "weir::checkpoint",
                "checkpoint {} holds output of operator {uid}, which is not in this job: not committed",
                meta.checkpoint_id
            );
            continue;
        };
        let id = meta.checkpoint_id;
        let report = tokio::task::spawn_blocking(move || c.commit(id, &committables).map(|()| c.take_report()))
            .await
            .map_err(|e| ExecError::internal(format!("commit task failed: {e}")))??;
        reports.extend(report);
    }
    reports.sort_by(|a, b| a.sink.cmp(&b.sink));
    Ok(reports)
}

/// Whether a checkpoint being written may still publish, or its time ran
/// out first: exactly one of the two wins.
#[derive(Debug, Default)]
struct Gate(std::sync::atomic::AtomicU8);

impl Gate {
    const OPEN: u8 = 0;
    const PUBLISHING: u8 = 1;
    const EXPIRED: u8 = 2;

    fn publish(&self) -> bool {
        self.shut(Self::PUBLISHING)
    }

    fn expire(&self) -> bool {
        self.shut(Self::EXPIRED)
    }

    fn shut(&self, to: u8) -> bool {
        use std::sync::atomic::Ordering;
        self.0
            .compare_exchange(Self::OPEN, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

struct Header {
    id: u64,
    job: String,
    fingerprint: String,
    trigger_time_ms: i64,
    is_final: bool,
    max_parallelism: u16,
    operator_info: BTreeMap<String, OperatorInfo>,
}

/// Writes checkpoint `header.id`: uploads state (SSTs the base checkpoint
/// already holds are referenced, not uploaded, when incremental), then the
/// metadata. Returns it and the bytes uploaded.
///
/// If any write fails (a full or failing disk), what this attempt wrote is
/// removed again: the metadata first, so no `_metadata` ever names a
/// missing or partial file, then its private files and the shared files
/// it uploaded, whose space a full disk needs back.
#[allow(clippy::too_many_arguments)]
fn materialize(
    storage: &CheckpointStorage,
    fence: &Fence,
    gate: &Gate,
    header: Header,
    snapshots: Vec<TaskSnapshot>,
    base: Option<&CheckpointMetadata>,
    carried: BTreeMap<String, Vec<serde_json::Value>>,
    incremental: bool,
) -> Result<(CheckpointMetadata, u64), CheckpointError> {
    let id = header.id;
    let mut shared = vec![];
    let result = write_checkpoint(
        storage,
        fence,
        gate,
        header,
        snapshots,
        base,
        carried,
        incremental,
        &mut shared,
    );
    if result.is_err()
        && let Err(e) = storage.discard_attempt(id, &shared)
    {
        tracing::warn!(
            target: "weir::checkpoint",
            "checkpoint {id}: could not remove the files of the failed attempt ({e}); no checkpoint \
             references them, the garbage collection after the next completed checkpoint deletes them"
        );
    }
    result
}

/// [`materialize`] without the cleanup; `shared` collects the name of
/// every shared file it starts to upload.
#[allow(clippy::too_many_arguments)]
fn write_checkpoint(
    storage: &CheckpointStorage,
    fence: &Fence,
    gate: &Gate,
    header: Header,
    snapshots: Vec<TaskSnapshot>,
    base: Option<&CheckpointMetadata>,
    mut carried: BTreeMap<String, Vec<serde_json::Value>>,
    incremental: bool,
    shared: &mut Vec<String>,
) -> Result<(CheckpointMetadata, u64), CheckpointError> {
    let id = header.id;
    let mut uploaded = 0u64;
    let mut sources = BTreeMap::new();
    let mut operators = BTreeMap::new();
    for snapshot in snapshots {
        for (uid, positions) in snapshot.sources {
            sources.entry(uid).or_insert_with(Vec::new).extend(positions);
        }
        for (key, op) in snapshot.operators {
            let state = match op {
                OperatorSnapshot::Sink(mut committables) => {
                    if let Some(extra) = carried.remove(&key) {
                        let mut all = extra;
                        all.append(&mut committables);
                        committables = all;
                    }
                    OperatorState::Sink { committables }
                }
                op => write_operator(
                    storage,
                    id,
                    &key,
                    op,
                    base.map(|b| &b.operators),
                    incremental,
                    &mut uploaded,
                    shared,
                )?,
            };
            operators.insert(key, state);
        }
    }
    // Output of aborted checkpoints whose sink did not report this time.
    super::metadata::add_carried(&mut operators, carried);
    let meta = CheckpointMetadata {
        format: FORMAT_VERSION,
        checkpoint_id: id,
        job: header.job,
        plan_fingerprint: header.fingerprint,
        trigger_time_ms: header.trigger_time_ms,
        is_final: header.is_final,
        max_parallelism: header.max_parallelism,
        key_format: crate::state::codec::FORMAT_VERSION,
        savepoint: None,
        operator_info: header.operator_info,
        sources,
        operators,
    };
    storage.commit_metadata(&meta)?;
    failpoint("checkpoint.before_publish");
    if !gate.publish() {
        return Err(CheckpointError::Expired(format!(
            "checkpoint {id} expired before its files were written"
        )));
    }
    // The commit point: restorable, and its sinks committable, from here.
    fence.publish(id)?;
    Ok((meta, uploaded))
}

/// Writes one operator's part of checkpoint `id` (its state files) and
/// says where it is. `base`: the operators of the checkpoint the last one
/// completed, whose RocksDB files are shared by name when `incremental`.
/// A worker of a job spread over processes writes its own operators'
/// parts so, and sends the coordinator only what this returns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_operator(
    storage: &CheckpointStorage,
    id: u64,
    key: &str,
    op: OperatorSnapshot,
    base: Option<&BTreeMap<String, OperatorState>>,
    incremental: bool,
    uploaded: &mut u64,
    shared: &mut Vec<String>,
) -> Result<OperatorState, CheckpointError> {
    Ok(match op {
        OperatorSnapshot::RocksDb {
            dir,
            key_groups,
            identity,
        } => {
            // Files are shared by name with the base only if it comes
            // from the same RocksDB instance (a restore into a fresh
            // instance numbers its files anew).
            let base_files = match base.and_then(|b| b.get(key)) {
                Some(OperatorState::Rocksdb {
                    files,
                    identity: base_identity,
                    ..
                }) if incremental && *base_identity == identity && !identity.is_empty() => Some(files),
                _ => None,
            };
            let files = upload_rocksdb(storage, id, key, &dir, base_files, uploaded, shared);
            let _ = std::fs::remove_dir_all(&dir);
            OperatorState::Rocksdb {
                files: files?,
                key_groups,
                identity,
            }
        }
        OperatorSnapshot::Entries { bytes, key_groups } => {
            let file = storage.write_private(id, &format!("{}.arrows", key.replace('/', "-")), &bytes)?;
            *uploaded += file.size;
            OperatorState::Entries { file, key_groups }
        }
        OperatorSnapshot::Heap(bytes) => {
            let file = storage.write_private(id, &format!("{}-heap.bin", key.replace('/', "-")), &bytes)?;
            *uploaded += file.size;
            OperatorState::Heap { file }
        }
        OperatorSnapshot::InFlight(bytes) => {
            let file = storage.write_private(id, &format!("{}.arrows", key.replace('/', "-")), &bytes)?;
            *uploaded += file.size;
            OperatorState::InFlight { file }
        }
        OperatorSnapshot::Sink(committables) => OperatorState::Sink { committables },
        // Written by the worker that ran the operator.
        OperatorSnapshot::Written(state) => state,
    })
}

fn upload_rocksdb(
    storage: &CheckpointStorage,
    id: u64,
    key: &str,
    dir: &std::path::Path,
    base: Option<&BTreeMap<String, FileRef>>,
    uploaded: &mut u64,
    shared: &mut Vec<String>,
) -> Result<BTreeMap<String, FileRef>, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = BTreeMap::new();
    let tag = key.replace('/', "-");
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().to_string();
        let size = entry.metadata().map_err(io)?.len();
        let is_sst = name.ends_with(".sst");
        // SSTs are immutable: one the base checkpoint holds under this
        // name and size is the same file.
        if is_sst && let Some(existing) = base.and_then(|b| b.get(&name)).filter(|f| f.size == size) {
            files.insert(name, existing.clone());
            continue;
        }
        let stored_name = if is_sst {
            let n = format!("{tag}-c{id}-{name}");
            shared.push(n.clone());
            n
        } else {
            format!("{tag}-{name}")
        };
        let f = storage.upload(id, &entry.path(), &stored_name, is_sst)?;
        *uploaded += f.size;
        files.insert(name, f);
    }
    Ok(files)
}
