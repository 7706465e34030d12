//! A source's split enumerator: finds the splits that appear while the job
//! runs (new Kafka partitions, new files under a monitored path, Delta
//! commits under a continuous read) and hands each to the one reader that
//! owns it. One per source, where the job is coordinated (the process, or
//! worker 0 of a job over workers), as Flink's `SplitEnumerator` runs in
//! its JobManager: the source is listed once per interval, not once per
//! reader, and a listing that says the source cannot be followed fails the
//! job once.
//!
//! The owner of a split the enumerator finds is a hash of its id over the
//! parallelism. A split handed over after a barrier passed its reader is
//! not in that checkpoint: restored from it, the enumerator does not know
//! the split (it knows the checkpoint's splits) and finds it again.
//!
//! The enumerator ends with its attempt, or once no reader here is left
//! to hand splits to (a stop drained them).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::checkpoint::SplitPosition;
use crate::connectors::{SourceFactory, SourceSplit};
use crate::error::{ExecError, Result};
use crate::exchange::control::Control;
use crate::exchange::mesh::Mesh;

/// The reader that owns split `id` of a source read by `parallelism`
/// readers (the same on every worker and every attempt).
pub fn owner(id: &str, parallelism: usize) -> usize {
    use std::hash::Hasher;
    let mut h = twox_hash::XxHash64::with_seed(0);
    h.write(id.as_bytes());
    (h.finish() % parallelism.max(1) as u64) as usize
}

/// Where a reader's new splits arrive. The reader takes them between
/// batches; `waker` (the reader's own, which its splits also wake) gets it
/// out of a wait.
pub struct SplitInbox {
    splits: Mutex<Vec<Box<dyn SourceSplit>>>,
    /// The enumerator failed for good: the reader fails the attempt with it.
    failure: Mutex<Option<ExecError>>,
    pending: AtomicBool,
    pub waker: Arc<Notify>,
    /// Dropped with the inbox: the enumerator's `readers` channel closes
    /// once every reader here is gone.
    _held: Option<tokio::sync::mpsc::Sender<()>>,
}

impl SplitInbox {
    pub fn new() -> Arc<SplitInbox> {
        Self::held(None)
    }

    /// An inbox whose end `held` (a sender of [`SplitEnumerator::readers`])
    /// tells.
    pub fn held(held: Option<tokio::sync::mpsc::Sender<()>>) -> Arc<SplitInbox> {
        Arc::new(SplitInbox {
            splits: Mutex::new(vec![]),
            failure: Mutex::new(None),
            pending: AtomicBool::new(false),
            waker: Arc::new(Notify::new()),
            _held: held,
        })
    }

    pub fn put(&self, splits: Vec<Box<dyn SourceSplit>>) {
        if splits.is_empty() {
            return;
        }
        self.splits.lock().unwrap_or_else(|p| p.into_inner()).extend(splits);
        self.pending.store(true, Ordering::Release);
        self.waker.notify_one();
    }

    fn fail(&self, e: ExecError) {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        self.pending.store(true, Ordering::Release);
        self.waker.notify_one();
    }

    /// What arrived since the last call (cheap when nothing did), or the
    /// enumerator's failure.
    pub fn take(&self) -> Result<Vec<Box<dyn SourceSplit>>> {
        if !self.pending.swap(false, Ordering::AcqRel) {
            return Ok(vec![]);
        }
        if let Some(e) = self.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        Ok(std::mem::take(
            &mut *self.splits.lock().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

/// Where each reader of a source is: here (its inbox, held by the
/// reader) or on another worker.
#[derive(Clone)]
pub enum Route {
    Local(Weak<SplitInbox>),
    Remote(u32),
}

pub struct SplitEnumerator {
    pub uid: String,
    /// The source node (its id in the plan, the same on every worker).
    pub node: usize,
    pub factory: Arc<dyn SourceFactory>,
    pub interval: Duration,
    /// Every split of the source the job reads (all readers').
    pub known: BTreeSet<String>,
    /// Per subtask.
    pub routes: Vec<Route>,
    /// Closes once every local reader's inbox is gone (nothing is sent).
    pub readers: tokio::sync::mpsc::Receiver<()>,
}

impl SplitEnumerator {
    /// Lists the source every interval until the attempt ends (`alive`
    /// closed) or no reader here is left.
    pub async fn run(mut self, mesh: Option<Arc<Mesh>>, mut alive: watch::Receiver<()>) -> Result<()> {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = alive.changed() => return Ok(()),
                // Every reader here ended (a stop drained them): so does
                // this, at once, not at its next listing.
                _ = self.readers.recv() => return Ok(()),
            }
            let found = tokio::select! {
                found = self.list() => found,
                // A listing still under way when the attempt ends (a
                // metadata call, an object store) is dropped with it.
                _ = alive.changed() => return Ok(()),
            };
            if let Err(e) = found.and_then(|found| self.hand_out(found, mesh.as_deref())) {
                // Fatal (the source cannot be followed): a reader here
                // fails the attempt with it (subtask 0 always runs here),
                // as does this task.
                tracing::error!(target: "weir::source", "{}: split discovery failed for good: {e}", self.uid);
                let live = self.routes.iter().find_map(|r| match r {
                    Route::Local(w) => w.upgrade(),
                    Route::Remote(_) => None,
                });
                match live {
                    Some(inbox) => {
                        inbox.fail(e);
                        return Ok(());
                    }
                    None => return Err(e),
                }
            }
        }
    }

    /// The splits the source has now that are not known yet (none when a
    /// listing fails for now: it is tried again at the next interval).
    async fn list(&self) -> Result<Vec<Box<dyn SourceSplit>>> {
        let factory = self.factory.clone();
        let known = self.known.clone();
        // Listing asks the cluster or the store: off the runtime's threads.
        let found = tokio::task::spawn_blocking(move || factory.discover(&known))
            .await
            .map_err(|e| ExecError::internal(format!("split discovery failed: {e}")))?;
        let found = match found {
            Ok(f) => f,
            // The source says it cannot go on (a Delta commit that deletes
            // rows under a continuous read): no retry helps.
            Err(e @ ExecError::Connector(crate::error::ConnectorError::CannotFollow { .. })) => return Err(e),
            Err(e) => {
                // Tried again at the next interval; the splits being read
                // are not affected.
                tracing::warn!(target: "weir::source", "{}: split discovery failed: {e}", self.uid);
                return Ok(vec![]);
            }
        };
        Ok(found)
    }

    /// Hands each new split to its reader.
    fn hand_out(&mut self, found: Vec<Box<dyn SourceSplit>>, mesh: Option<&Mesh>) -> Result<()> {
        let parallelism = self.routes.len();
        let mut local: HashMap<usize, Vec<Box<dyn SourceSplit>>> = HashMap::new();
        let mut remote: HashMap<u32, Vec<(usize, SplitPosition)>> = HashMap::new();
        for split in found {
            let id = split.id();
            if !self.known.insert(id.clone()) {
                continue;
            }
            let subtask = owner(&id, parallelism);
            match self.routes.get(subtask) {
                Some(Route::Local(_)) => local.entry(subtask).or_default().push(split),
                Some(Route::Remote(worker)) => remote.entry(*worker).or_default().push((
                    subtask,
                    SplitPosition {
                        split: id,
                        position: split.position(),
                        finished: false,
                        end: split.end(),
                    },
                )),
                None => {}
            }
        }
        for (subtask, splits) in local {
            // A reader gone (a stop drained it) reads nothing more.
            if let Some(Route::Local(w)) = self.routes.get(subtask)
                && let Some(inbox) = w.upgrade()
            {
                inbox.put(splits);
            }
        }
        for (worker, splits) in remote {
            // A lost worker fails the attempt through its link.
            if let Some(link) = mesh.and_then(|m| m.link(worker)) {
                let _ = link.send_control(
                    Control::Splits {
                        node: self.node,
                        splits,
                    }
                    .encode(),
                );
            }
        }
        Ok(())
    }
}

/// A worker's readers of discovered splits, for what worker 0's
/// enumerators send it: per source node, the factory that makes a split
/// from its position and each local subtask's inbox.
#[derive(Default, Clone)]
pub struct Inboxes {
    pub nodes: HashMap<usize, NodeInboxes>,
}

/// A source node's factory and its local readers' inboxes (by subtask).
pub type NodeInboxes = (Arc<dyn SourceFactory>, HashMap<usize, Arc<SplitInbox>>);

impl Inboxes {
    /// [`Self::deliver`]; a failure fails a reader of `node` here (and
    /// with it the attempt).
    pub fn deliver_or_fail(&self, node: usize, splits: Vec<(usize, SplitPosition)>) {
        if let Err(e) = self.deliver(node, splits) {
            tracing::error!(target: "weir::source", "making the splits worker 0 found: {e}");
            if let Some(inbox) = self.nodes.get(&node).and_then(|(_, i)| i.values().next()) {
                inbox.fail(e);
            }
        }
    }

    /// Makes the splits worker 0 found for readers of `node` here and
    /// hands them over.
    pub fn deliver(&self, node: usize, splits: Vec<(usize, SplitPosition)>) -> Result<()> {
        let Some((factory, inboxes)) = self.nodes.get(&node) else {
            return Err(ExecError::Cluster(format!(
                "worker 0 found splits for source node {node}, which has no reader here"
            )));
        };
        // A factory makes splits from positions the way a restore needs
        // (a file source lists its path again, new files included): keep
        // exactly the ones worker 0 found, where it said they start.
        let positions: Vec<SplitPosition> = splits.iter().map(|(_, p)| p.clone()).collect();
        let mut wanted: HashMap<String, (usize, u64)> = splits
            .into_iter()
            .map(|(subtask, p)| (p.split, (subtask, p.position)))
            .collect();
        let mut per: HashMap<usize, Vec<Box<dyn SourceSplit>>> = HashMap::new();
        for mut split in factory.restore_splits(&positions)? {
            if let Some((subtask, position)) = wanted.remove(&split.id()) {
                split.seek(position)?;
                per.entry(subtask).or_default().push(split);
            }
        }
        for missing in wanted.keys() {
            // Gone since worker 0 listed it (a file removed): as a restore
            // does, nothing of it is read.
            tracing::warn!(target: "weir::source", "split '{missing}' found by worker 0 is gone before it could be read");
        }
        for (subtask, splits) in per {
            tracing::info!(
                target: "weir::source",
                "reader {subtask} of source node {node}: {} split(s) from worker 0's enumerator: {}",
                splits.len(),
                splits.iter().map(|s| s.id()).collect::<Vec<_>>().join(", ")
            );
            let Some(inbox) = inboxes.get(&subtask) else {
                return Err(ExecError::Cluster(format!(
                    "worker 0 found splits for reader {subtask} of source node {node}, which does not run here"
                )));
            };
            inbox.put(splits);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inbox_hands_over_what_was_put_once_and_then_a_failure() {
        let inbox = SplitInbox::new();
        assert!(inbox.take().expect("nothing").is_empty());
        inbox.put(vec![]);
        assert!(inbox.take().expect("nothing").is_empty());
        inbox.fail(ExecError::Cluster("gone".into()));
        assert!(inbox.take().is_err());
        assert!(inbox.take().expect("then nothing").is_empty());
    }

    #[test]
    fn owners_spread_and_stay() {
        let owners: Vec<usize> = (0..64).map(|i| owner(&format!("t-{i}"), 4)).collect();
        assert!((0..4).all(|o| owners.contains(&o)));
        assert_eq!(owners, (0..64).map(|i| owner(&format!("t-{i}"), 4)).collect::<Vec<_>>());
        assert_eq!(owner("x", 0), 0);
    }
}
