//! The fence: one owner of a job's checkpoint storage at a time.
//!
//! Two copies of one job can share a checkpoint directory: a zombie left
//! behind by a network partition, or the same job started twice. Both
//! must never publish checkpoints (a restore would mix their states) nor
//! commit sinks (output twice). Object stores have no locks, but they
//! (and local files) can create an object only if none is there; on that
//! alone the fence stands, with no database.
//!
//! ```text
//! <root>/log/00000000000000000007.json   {"kind":"generation","generation":7,"owner":"host pid 4211",…}
//! <root>/log/00000000000000000008.json   {"kind":"checkpoint","generation":7,"checkpoint":12}
//! <root>/chk-12/_claim                   7   (the generation that took id 12)
//! ```
//!
//! - The log is dense: every record is created at one past the highest
//!   sequence number its writer knows, so no number is ever skipped.
//! - A run claims a **generation** by creating a record at one past the
//!   highest it lists; the generation is that record's number. A writer
//!   that loses the race lists again.
//! - It **publishes** checkpoint N by creating the next record after its
//!   own last one. Once a newer generation exists, that slot is taken (the
//!   newer claim was made at exactly one past the last record the older
//!   run wrote, and generation records are never deleted), so the older
//!   run's create fails, whenever it wakes up: it stops, naming the
//!   generation that replaced it, and neither commits its sinks nor
//!   deletes anything. Unlike a pointer read before writing (Arroyo's
//!   advisory `current-generation.json`), there is no window in between.
//! - Checkpoint ids are claimed too (`chk-N/_claim`, created), so two runs
//!   never write into one `chk-N/`; a run that finds an id taken skips it.
//! - A restore reads only checkpoints the log records: `_metadata` that a
//!   fenced run wrote before losing its publish is never restored.
//! - A run that ends on purpose (stopped, cancelled) **seals** its
//!   generation with one more record before it clears or moves its
//!   checkpoints, so a replaced run never deletes its successor's.
//!
//! A create whose answer is lost (a dropped connection after the store
//! took it) is retried by the client and comes back "exists": the bytes
//! read back say whether the record is this run's own.

use std::sync::Mutex;

use super::CheckpointError;
pub use super::records::{LOG_DIR, Record, record_key};
use super::storage::CheckpointStorage;
use super::store::Created;

/// How often a claim retries when other runs keep taking the next slot.
const CLAIM_TRIES: usize = 64;

/// Who claims, for the generation record: host, process and which claim
/// of the process (two claims never write the same bytes, so a claim
/// read back is told from another's).
fn owner() -> String {
    static CLAIMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CLAIMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "unknown host".into());
    format!("{host} pid {} claim {n}", std::process::id())
}

/// A run's hold on a job's checkpoint storage.
#[derive(Debug)]
pub struct Fence {
    storage: CheckpointStorage,
    generation: u64,
    /// The sequence number of this run's last record.
    last: Mutex<u64>,
}

impl Fence {
    /// Claims the next generation of `storage`'s job: from now on every
    /// earlier run's publish fails.
    pub fn claim(storage: &CheckpointStorage) -> Result<Fence, CheckpointError> {
        let owner = owner();
        for _ in 0..CLAIM_TRIES {
            let seq = storage.log_seqs()?.last().map_or(1, |s| s + 1);
            let record = Record::Generation {
                generation: seq,
                owner: owner.clone(),
                time_ms: chrono::Utc::now().timestamp_millis(),
            };
            let bytes = record.encode()?;
            let fence = Fence {
                storage: storage.clone(),
                generation: seq,
                last: Mutex::new(seq),
            };
            match storage.create_record(seq, &bytes)? {
                Created::Created => return Ok(fence),
                // This very claim, whose answer was lost.
                Created::Exists(existing) if existing == bytes => return Ok(fence),
                // Another run took the slot first: list again.
                Created::Exists(_) => {}
            }
        }
        Err(CheckpointError::Internal(format!(
            "could not claim a generation of {} in {CLAIM_TRIES} tries: other runs of the job keep claiming",
            storage.root().display()
        )))
    }

    /// This run's generation (the sequence number of its claim).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn storage(&self) -> &CheckpointStorage {
        &self.storage
    }

    /// Records checkpoint `checkpoint` as complete. The commit point: its
    /// sinks may commit only after this returns `Ok`.
    pub fn publish(&self, checkpoint: u64) -> Result<(), CheckpointError> {
        self.append(&Record::Checkpoint {
            generation: self.generation,
            checkpoint,
        })
    }

    /// Records the savepoint of checkpoint id `checkpoint`, written to
    /// `path`: as [`Self::publish`], the point after which its sinks may
    /// commit.
    pub fn publish_savepoint(&self, checkpoint: u64, path: &std::path::Path) -> Result<(), CheckpointError> {
        self.append(&Record::Savepoint {
            generation: self.generation,
            checkpoint,
            path: path.display().to_string(),
        })
    }

    /// Ends this run's generation: `Ok` means no newer run has claimed the
    /// job, and none can take what this run leaves behind for its own.
    pub fn seal(&self) -> Result<(), CheckpointError> {
        self.append(&Record::End {
            generation: self.generation,
        })
    }

    /// Whether a newer run has claimed the job since this run's last
    /// record (`Err(Fenced)`). Advisory (a claim may follow the moment
    /// after): [`Self::publish`] is the check that guards; this one tells
    /// why an attempt failed, and keeps a replaced run from restarting.
    pub fn check(&self) -> Result<(), CheckpointError> {
        let last = *self
            .last
            .lock()
            .map_err(|_| CheckpointError::Internal("the fence's lock is poisoned".into()))?;
        match self.storage.read_record(last + 1) {
            Ok(found) if found.generation() != self.generation => Err(self.fenced(last + 1, found)),
            Ok(_) | Err(CheckpointError::Missing { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes checkpoint id `id` for this run; `false` when another run
    /// took it first.
    pub fn claim_id(&self, id: u64) -> Result<bool, CheckpointError> {
        self.storage.claim_id(id, self.generation)
    }

    fn append(&self, record: &Record) -> Result<(), CheckpointError> {
        let bytes = record.encode()?;
        let mut last = self
            .last
            .lock()
            .map_err(|_| CheckpointError::Internal("the fence's lock is poisoned".into()))?;
        loop {
            let seq = *last + 1;
            match self.storage.create_record(seq, &bytes)? {
                Created::Created => {
                    *last = seq;
                    return Ok(());
                }
                Created::Exists(existing) => {
                    let found: Record = serde_json::from_slice(&existing).map_err(|e| CheckpointError::Corrupt {
                        path: self.storage.locate(&record_key(seq)).display().to_string(),
                        message: format!("not a log record: {e}"),
                    })?;
                    if found.generation() != self.generation {
                        return Err(self.fenced(seq, found));
                    }
                    // This run's own record whose answer was lost (this
                    // one, retried; or an earlier one that failed for us
                    // but reached the store): the next slot is free.
                    *last = seq;
                    if existing == bytes {
                        return Ok(());
                    }
                }
            }
        }
    }

    fn fenced(&self, seq: u64, found: Record) -> CheckpointError {
        let by = found.generation();
        let owner = match found {
            Record::Generation { owner, .. } => Some(owner),
            // Not the claim itself (a log written by another scheme):
            // read the claim for its owner.
            _ => self.storage.read_record(by).ok().and_then(|r| match r {
                Record::Generation { owner, .. } => Some(owner),
                _ => None,
            }),
        };
        CheckpointError::Fenced {
            root: self.storage.root().display().to_string(),
            generation: self.generation,
            by,
            owner: owner.unwrap_or_else(|| "an unknown run".into()),
            seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(dir: &std::path::Path) -> CheckpointStorage {
        CheckpointStorage::new(dir.join("job"))
    }

    #[test]
    fn a_newer_generation_stops_the_older_ones_publish_and_seal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = Fence::claim(&storage(dir.path())).expect("claim");
        assert!(first.claim_id(1).expect("id"));
        first.publish(1).expect("publish");
        let second = Fence::claim(&storage(dir.path())).expect("claim");
        assert!(second.generation() > first.generation());
        let err = first.publish(2).expect_err("fenced");
        let msg = err.to_string();
        assert!(matches!(err, CheckpointError::Fenced { .. }), "{msg}");
        assert!(msg.contains(&format!("generation {}", second.generation())), "{msg}");
        assert!(msg.contains(&format!("generation {}", first.generation())), "{msg}");
        assert!(first.seal().is_err(), "a replaced run cannot seal");
        assert!(matches!(first.check(), Err(CheckpointError::Fenced { .. })));
        second.check().expect("the newest run is not fenced");
        // Still fenced later, whatever the newer run has done since.
        assert!(second.claim_id(2).expect("id"));
        second.publish(2).expect("publish");
        assert!(first.publish(3).is_err());
        second.seal().expect("seal");
    }

    #[test]
    fn ids_are_claimed_once_and_records_survive_lost_answers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = storage(dir.path());
        let a = Fence::claim(&s).expect("claim");
        assert!(a.claim_id(5).expect("id"));
        assert!(a.claim_id(5).expect("id again"), "a retried claim of one's own id");
        let b = Fence::claim(&s).expect("claim");
        assert!(!b.claim_id(5).expect("id"), "taken by another generation");
        // b's own record reached the store but its answer was lost: b
        // appends after it and is not fenced by itself.
        let seq = *b.last.lock().expect("lock") + 1;
        let own = Record::Checkpoint {
            generation: b.generation(),
            checkpoint: 6,
        };
        s.create_record(seq, &own.encode().expect("encode")).expect("create");
        b.publish(7).expect("after its own record");
        let ids: Vec<u64> = s
            .log_records()
            .expect("records")
            .into_iter()
            .filter_map(|(_, r)| match r {
                Record::Checkpoint { checkpoint, .. } => Some(checkpoint),
                _ => None,
            })
            .collect();
        assert_eq!(ids, [6, 7]);
    }

    #[test]
    fn racing_claims_get_distinct_generations() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = storage(dir.path());
        let gens: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..6)
                .map(|_| scope.spawn(|| Fence::claim(&s).expect("claim").generation()))
                .collect();
            handles.into_iter().map(|h| h.join().expect("join")).collect()
        });
        let mut sorted = gens.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, (1..=6).collect::<Vec<u64>>(), "{gens:?}");
    }
}
