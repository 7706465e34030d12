//! A job spread over worker processes (`weir worker`): where each subtask
//! runs, and the pieces of an attempt that differ from one process.
//!
//! Every worker plans the same SQL, so the graph, its chains, uids and
//! channel order are the same on all of them. Subtask `s` of every chain
//! runs on worker `s % N`: a forward edge between chains of equal
//! parallelism stays in one process, and a subtask's key groups are where
//! they would be in one process. Worker 0 coordinates: it restores (and
//! fences) the job's checkpoints, lists the sources' splits, runs the
//! checkpoint coordinator and the sinks' commits; the others run their
//! subtasks, write their own state to the checkpoint storage and report
//! to it (see [`crate::exchange::control`]).
//!
//! Recovery is Flink's full restart, with the process supervisor
//! (Kubernetes, or a test's launcher) doing the restarting: a worker whose
//! attempt fails, or which loses a peer, exits non-zero; started again
//! with the same arguments, the workers meet again and restore the latest
//! completed checkpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::checkpoint::{CheckpointStorage, OperatorSnapshot, TaskReport, TaskSnapshot};
use crate::config::JobConfig;
use crate::error::{ExecError, Result};
use crate::exchange::control::{Control, WireReport, WireSnapshot, Written};
use crate::exchange::mesh::Mesh;
pub use crate::exchange::workers::Cluster;
use crate::plan::StreamGraph;

/// What every worker must agree on to run one job together: its name, its
/// operators (uids) and their parallelism. A worker started with other SQL
/// or options is refused at the hello.
pub fn plan_hash(graph: &StreamGraph, config: &JobConfig) -> u64 {
    let mut text = format!("{}\n{}\n", config.name, config.max_parallelism);
    for n in &graph.nodes {
        text.push_str(&format!("{} {}\n", n.uid, n.parallelism));
    }
    let hex = crate::checkpoint::metadata::checksum(text.as_bytes());
    u64::from_str_radix(&hex, 16).unwrap_or_default()
}

/// Sends `message` to every peer; a lost peer is an error (the attempt
/// cannot go on without it).
pub fn broadcast(mesh: &Mesh, message: &Control) -> Result<()> {
    let bytes = message.encode();
    let mut first_error = None;
    // Every peer hears it, whichever link failed.
    for peer in 0..mesh.workers() as u32 {
        if let Some(link) = mesh.link(peer)
            && let Err(e) = link.send_control(bytes.clone())
        {
            first_error.get_or_insert(ExecError::Cluster(e.to_string()));
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A worker other than 0 writes its tasks' checkpoint state to the
/// checkpoint storage itself and sends worker 0 where it is: the state
/// never crosses the network twice, and worker 0's memory does not hold
/// every worker's snapshot.
pub struct ReportWriter {
    storage: Option<CheckpointStorage>,
    s3: crate::checkpoint::objects::S3Settings,
    incremental: bool,
    /// Per checkpoint in progress, what this worker wrote.
    written: HashMap<u64, Written>,
    /// What this worker wrote for the last checkpoint that completed.
    base: Option<Written>,
    /// Triggers seen: which checkpoints are savepoints, and where to.
    book: TriggerBook,
    /// Sink output of checkpoints this worker could not write: it goes
    /// with the task's next report, as the coordinator carries an
    /// aborted checkpoint's output to the next.
    carried: std::collections::BTreeMap<String, Vec<serde_json::Value>>,
    /// Sink output sent per checkpoint: released once it completed (see
    /// [`crate::checkpoint::Committer::release`]).
    sent: std::collections::BTreeMap<u64, Vec<(String, Vec<serde_json::Value>)>>,
}

/// The triggers worker 0 sent, kept apart from the [`ReportWriter`]'s lock
/// (held through uploads): the control loop records a trigger without
/// waiting for an upload, and a report waits for its trigger without
/// holding anything.
#[derive(Clone)]
pub struct TriggerBook {
    /// Savepoints in progress: their directories.
    savepoints: Arc<Mutex<HashMap<u64, String>>>,
    /// The newest checkpoint whose trigger came from worker 0. A barrier
    /// can reach this worker's tasks through a third worker before the
    /// trigger does: a report waits for its trigger (see
    /// [`TriggerBook::seen`]), which says whether it is a savepoint and
    /// where its state goes.
    announced: Arc<tokio::sync::watch::Sender<u64>>,
}

impl TriggerBook {
    fn new() -> Self {
        TriggerBook {
            savepoints: Arc::default(),
            announced: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    fn savepoints(&self) -> std::sync::MutexGuard<'_, HashMap<u64, String>> {
        self.savepoints.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Worker 0 triggered checkpoint `id` (a savepoint into `savepoint`).
    pub fn triggered(&self, id: u64, savepoint: Option<String>) {
        if let Some(dir) = savepoint {
            self.savepoints().insert(id, dir);
        }
        self.announced.send_if_modified(|a| {
            let newer = id > *a;
            *a = (*a).max(id);
            newer
        });
    }

    /// Answers once checkpoint `id`'s trigger arrived (at once if it did):
    /// only then is it known whether `id` is a savepoint. Never, if the
    /// book is dropped first (the attempt ended).
    pub fn seen(&self, id: u64) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.announced.subscribe();
        async move {
            if rx.wait_for(|a| *a >= id).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl ReportWriter {
    pub fn new(config: &JobConfig) -> Arc<Mutex<ReportWriter>> {
        Arc::new(Mutex::new(ReportWriter {
            storage: config.checkpointing.as_ref().map(|c| c.storage()),
            s3: config.s3.clone(),
            incremental: config.checkpointing.as_ref().is_some_and(|c| c.incremental),
            written: HashMap::new(),
            base: None,
            book: TriggerBook::new(),
            carried: Default::default(),
            sent: Default::default(),
        }))
    }

    /// The triggers this writer goes by (see [`TriggerBook`]).
    pub fn book(&self) -> TriggerBook {
        self.book.clone()
    }

    /// Checkpoint `id` completed: its files are the next one's base.
    /// Returns the sink output this worker sent for it and before (worker
    /// 0 committed it), by operator key.
    pub fn completed(&mut self, id: u64) -> Vec<(String, Vec<serde_json::Value>)> {
        if let Some(w) = self.written.remove(&id) {
            self.base = Some(w);
        }
        self.written.retain(|k, _| *k > id);
        self.book.savepoints().retain(|k, _| *k > id);
        let later = self.sent.split_off(&(id + 1));
        std::mem::replace(&mut self.sent, later)
            .into_values()
            .flatten()
            .collect()
    }

    /// `report` with its state written (blocking: uploads).
    pub fn write(&mut self, report: TaskReport) -> WireReport {
        match report {
            TaskReport::Ack {
                checkpoint_id,
                task,
                snapshot,
                alignment,
                sync,
            } => match self.write_snapshot(checkpoint_id, snapshot) {
                Ok(snapshot) => {
                    let sinks: Vec<(String, Vec<serde_json::Value>)> = snapshot
                        .operators
                        .iter()
                        .filter_map(|(k, s)| match s {
                            crate::checkpoint::OperatorState::Sink { committables } => {
                                Some((k.clone(), committables.clone()))
                            }
                            _ => None,
                        })
                        .collect();
                    if !sinks.is_empty() {
                        self.sent.entry(checkpoint_id).or_default().extend(sinks);
                    }
                    WireReport::Ack {
                        checkpoint_id,
                        task,
                        snapshot,
                        alignment_us: alignment.as_micros() as u64,
                        sync_us: sync.as_micros() as u64,
                    }
                }
                Err(reason) => WireReport::Decline {
                    checkpoint_id,
                    task,
                    reason,
                },
            },
            TaskReport::Finished { task, snapshot } => {
                // A finished task's part is its split positions and sink
                // output (see `TaskReport::Finished`).
                let mut operators = vec![];
                for (key, op) in snapshot.operators {
                    match op {
                        OperatorSnapshot::Sink(c) => {
                            let committables = self.with_carried(&key, c);
                            operators.push((key, crate::checkpoint::OperatorState::Sink { committables }))
                        }
                        OperatorSnapshot::RocksDb { dir, .. } => {
                            let _ = std::fs::remove_dir_all(dir);
                        }
                        _ => {}
                    }
                }
                WireReport::Finished {
                    task,
                    snapshot: WireSnapshot {
                        sources: snapshot.sources,
                        operators,
                    },
                }
            }
            TaskReport::Decline {
                checkpoint_id,
                task,
                reason,
            } => WireReport::Decline {
                checkpoint_id,
                task,
                reason,
            },
        }
    }

    fn write_snapshot(&mut self, id: u64, snapshot: TaskSnapshot) -> Result<WireSnapshot, String> {
        let Some(storage) = self.storage.clone() else {
            return Err("a checkpoint acknowledged without checkpoint storage".into());
        };
        let dir = self.book.savepoints().get(&id).cloned();
        let savepoint = match dir {
            Some(dir) => Some(
                crate::checkpoint::objects::storage_at(std::path::Path::new(&dir), &self.s3)
                    .map_err(|e| format!("savepoint directory {dir}: {e}"))?,
            ),
            None => None,
        };
        let mut out = WireSnapshot {
            sources: snapshot.sources,
            operators: vec![],
        };
        let mut uploaded = 0u64;
        let mut shared = vec![];
        let mut ops = snapshot.operators.into_iter();
        let mut failure = None;
        for (key, op) in ops.by_ref() {
            let state = match (&savepoint, op) {
                (_, OperatorSnapshot::Sink(c)) => Ok(crate::checkpoint::OperatorState::Sink {
                    committables: self.with_carried(&key, c),
                }),
                (Some(sp), op) => crate::checkpoint::savepoint::write_operator(sp, &key, op),
                (None, op) => crate::checkpoint::coordinator::write_operator(
                    &storage,
                    id,
                    &key,
                    op,
                    self.base.as_ref(),
                    self.incremental,
                    &mut uploaded,
                    &mut shared,
                ),
            };
            match state {
                Ok(state) => {
                    if savepoint.is_none() && !matches!(state, crate::checkpoint::OperatorState::Sink { .. }) {
                        self.written.entry(id).or_default().insert(key.clone(), state.clone());
                    }
                    out.operators.push((key, state));
                }
                Err(e) => {
                    failure = Some(format!("worker could not write {key}: {e}"));
                    break;
                }
            }
        }
        if let Some(reason) = failure {
            // The rest is never written: its local snapshots go, its sink
            // output waits for the next checkpoint.
            for (key, state) in out.operators {
                if let crate::checkpoint::OperatorState::Sink { committables } = state {
                    self.carried.entry(key).or_default().extend(committables);
                }
            }
            for (key, op) in ops {
                match op {
                    OperatorSnapshot::RocksDb { dir, .. } => {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                    OperatorSnapshot::Sink(c) => self.carried.entry(key).or_default().extend(c),
                    _ => {}
                }
            }
            self.written.remove(&id);
            return Err(reason);
        }
        Ok(out)
    }

    /// `committables` after what earlier failed checkpoints left of `key`.
    fn with_carried(&mut self, key: &str, committables: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
        match self.carried.remove(key) {
            Some(mut earlier) => {
                earlier.extend(committables);
                earlier
            }
            None => committables,
        }
    }
}

/// A worker other than 0 forwards its tasks' reports to worker 0, each
/// with its state written (`send` puts it on the link). An acknowledgement
/// can arrive before worker 0's trigger (its barrier came through a third
/// worker) and waits for it; it stops waiting when the attempt is `over`
/// (worker 0 gone, or the job's end heard): the trigger of a dead
/// coordinator never comes, and a waiting forwarder would hold the
/// attempt, and with it the process, forever.
pub async fn forward_reports(
    mut reports: tokio::sync::mpsc::UnboundedReceiver<TaskReport>,
    writer: Arc<Mutex<ReportWriter>>,
    mut over: tokio::sync::watch::Receiver<Option<std::result::Result<(), String>>>,
    send: impl Fn(Vec<u8>) -> Result<()> + Send + 'static,
) -> Result<crate::checkpoint::coordinator::CoordinatorEnd> {
    use crate::checkpoint::coordinator::CoordinatorEnd;
    let book = writer.lock().unwrap_or_else(|p| p.into_inner()).book();
    loop {
        let report = tokio::select! {
            r = reports.recv() => match r {
                Some(r) => r,
                None => return Ok(CoordinatorEnd::Finished),
            },
            // Whatever is still queued cannot count any more.
            _ = over.wait_for(Option::is_some) => return Ok(CoordinatorEnd::Finished),
        };
        if let TaskReport::Ack { checkpoint_id, .. } = &report {
            // The trigger says whether this is a savepoint.
            tokio::select! {
                _ = book.seen(*checkpoint_id) => {}
                _ = over.wait_for(Option::is_some) => return Ok(CoordinatorEnd::Finished),
            }
        }
        let w = writer.clone();
        let wire = tokio::task::spawn_blocking(move || w.lock().unwrap_or_else(|p| p.into_inner()).write(report))
            .await
            .map_err(|e| ExecError::internal(format!("checkpoint upload task failed: {e}")))?;
        send(Control::Report(wire).encode())?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> Arc<Mutex<ReportWriter>> {
        let config =
            JobConfig::from_settings(&Default::default(), "job", std::path::Path::new("/tmp")).expect("config");
        ReportWriter::new(&config)
    }

    fn ack(checkpoint_id: u64) -> TaskReport {
        TaskReport::Ack {
            checkpoint_id,
            task: 0,
            snapshot: TaskSnapshot {
                sources: vec![],
                operators: vec![],
            },
            alignment: std::time::Duration::ZERO,
            sync: std::time::Duration::ZERO,
        }
    }

    /// An acknowledgement whose trigger never comes (worker 0 killed
    /// after the barrier got here through another worker) does not hold
    /// the attempt once worker 0 is known gone: CI saw a worker hang with
    /// its listener closed while the others restarted around it.
    #[tokio::test]
    async fn a_report_waiting_for_a_dead_coordinators_trigger_ends_with_the_attempt() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (done_tx, done_rx) = tokio::sync::watch::channel(None);
        let sent = Arc::new(Mutex::new(0usize));
        let counter = sent.clone();
        let w = writer();
        let book = w.lock().expect("writer").book();
        let forwarder = tokio::spawn(forward_reports(rx, w, done_rx, move |_| {
            *counter.lock().expect("count") += 1;
            Ok(())
        }));
        // Checkpoint 1 was triggered: its report goes at once.
        book.triggered(1, None);
        tx.send(ack(1)).expect("send");
        // Checkpoint 2's barrier came first; worker 0 then died.
        tx.send(ack(2)).expect("send");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while *sent.lock().expect("count") < 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "checkpoint 1's report never went"
            );
            tokio::task::yield_now().await;
        }
        done_tx
            .send(Some(Err("the connection to worker 0 is lost".into())))
            .expect("done");
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), forwarder).await;
        assert!(
            matches!(ended, Ok(Ok(Ok(_)))),
            "the forwarder still waits for a trigger no one will send"
        );
        assert_eq!(
            *sent.lock().expect("count"),
            1,
            "checkpoint 2 was never triggered: not reported"
        );
        drop(tx);
    }
}
