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
    use std::hash::{BuildHasher, Hasher};
    static CLAIMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CLAIMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Host and pid can repeat (containers on one host network all run as
    // pid 1): a random part keeps two claims' bytes apart.
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u64(n);
    random.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let nonce = random.finish();
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "unknown host".into());
    format!("{host} pid {} claim {n} nonce {nonce:016x}", std::process::id())
}

/// A run's hold on a job's checkpoint storage.
#[derive(Debug)]
pub struct Fence {
    storage: CheckpointStorage,
    generation: u64,
    /// The sequence number of this run's last record.
    last: Mutex<u64>,
    /// The highest checkpoint id this run or any before it used (claimed,
    /// published or recorded at an end): what a cleanup of this run may
    /// touch, and the floor of ids after it.
    high_water: std::sync::atomic::AtomicU64,
}

/// `n + 1`, or an error naming the log record at `n` (a record numbered
/// `u64::MAX` is no log Weir wrote).
fn after(storage: &CheckpointStorage, n: u64) -> Result<u64, CheckpointError> {
    n.checked_add(1).ok_or_else(|| CheckpointError::Corrupt {
        path: storage.locate(&record_key(n)).display().to_string(),
        message: "the log's sequence numbers are exhausted".into(),
    })
}

impl Fence {
    /// Claims the next generation of `storage`'s job: from now on every
    /// earlier run's publish fails.
    pub fn claim(storage: &CheckpointStorage) -> Result<Fence, CheckpointError> {
        Self::claim_from(storage, None)
    }

    /// [`Fence::claim`] by a run that starts from `from` (an explicit
    /// savepoint or checkpoint), which the claim records.
    pub fn claim_from(storage: &CheckpointStorage, from: Option<String>) -> Result<Fence, CheckpointError> {
        let owner = owner();
        for _ in 0..CLAIM_TRIES {
            let seq = match storage.log_seqs()?.last() {
                Some(s) => after(storage, *s)?,
                None => 1,
            };
            let record = Record::Generation {
                generation: seq,
                owner: owner.clone(),
                time_ms: chrono::Utc::now().timestamp_millis(),
                from: from.clone(),
            };
            let bytes = record.encode()?;
            let claimed = match storage.create_record(seq, &bytes)? {
                Created::Created => true,
                // This very claim, whose answer was lost.
                Created::Exists(existing) => existing == bytes,
            };
            if claimed {
                // Every id used so far is an earlier run's: no later run
                // has claimed yet, so none of its ids exists.
                let high_water = storage.next_id()?.saturating_sub(1);
                return Ok(Fence {
                    storage: storage.clone(),
                    generation: seq,
                    last: Mutex::new(seq),
                    high_water: high_water.into(),
                });
            }
            // Another run took the slot first: list again.
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

    /// Ends this run's generation, recording how it ended (`status`): `Ok`
    /// means no newer run had claimed the job; one that claims later reads
    /// the status from the log, and takes ids above this run's. What this
    /// run then deletes or moves is bounded by [`Self::high_water`].
    pub fn seal(&self, status: &str) -> Result<(), CheckpointError> {
        self.append(&Record::End {
            generation: self.generation,
            status: status.to_string(),
            next_id: after(&self.storage, self.high_water())?,
        })
    }

    /// The highest checkpoint id this run (or one before it) used.
    pub fn high_water(&self) -> u64 {
        self.high_water.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a newer run has claimed the job since this run's last
    /// record (`Err(Fenced)`). Advisory (a claim may follow the moment
    /// after): [`Self::publish`] is the check that guards; this one tells
    /// why an attempt failed, and keeps a replaced run from restarting.
    pub fn check(&self) -> Result<(), CheckpointError> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| CheckpointError::Internal("the fence's lock is poisoned".into()))?;
        loop {
            let seq = after(&self.storage, *last)?;
            match self.storage.read_record(seq) {
                Ok(found) if found.generation() != self.generation => return Err(self.fenced(seq, found)),
                // This run's own record whose answer was lost: look on.
                Ok(_) => *last = seq,
                Err(CheckpointError::Missing { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes checkpoint id `id` for this run; `false` when another run
    /// took it first.
    pub fn claim_id(&self, id: u64) -> Result<bool, CheckpointError> {
        let mine = self.storage.claim_id(id, self.generation)?;
        // Taken by either run, the id is used.
        self.high_water.fetch_max(id, std::sync::atomic::Ordering::AcqRel);
        Ok(mine)
    }

    fn append(&self, record: &Record) -> Result<(), CheckpointError> {
        let bytes = record.encode()?;
        let mut last = self
            .last
            .lock()
            .map_err(|_| CheckpointError::Internal("the fence's lock is poisoned".into()))?;
        loop {
            let seq = after(&self.storage, *last)?;
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
        assert!(first.seal("STOPPED").is_err(), "a replaced run cannot seal");
        assert!(matches!(first.check(), Err(CheckpointError::Fenced { .. })));
        second.check().expect("the newest run is not fenced");
        // Still fenced later, whatever the newer run has done since.
        assert!(second.claim_id(2).expect("id"));
        second.publish(2).expect("publish");
        assert!(first.publish(3).is_err());
        second.seal("STOPPED").expect("seal");
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
    fn a_check_looks_past_the_runs_own_lost_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = storage(dir.path());
        let a = Fence::claim(&s).expect("claim");
        // a's publish reached the store, its answer did not; then another
        // run claimed after it.
        let seq = *a.last.lock().expect("lock") + 1;
        let own = Record::Checkpoint {
            generation: a.generation(),
            checkpoint: 1,
        };
        s.create_record(seq, &own.encode().expect("encode")).expect("create");
        let b = Fence::claim(&s).expect("claim");
        match a.check() {
            Err(CheckpointError::Fenced { by, .. }) => assert_eq!(by, b.generation()),
            other => panic!("not fenced: {other:?}"),
        }
    }

    #[test]
    fn an_ended_runs_cleanup_spares_its_successor_and_ids_stay_unique() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = storage(dir.path());
        let a = Fence::claim(&s).expect("claim");
        assert!(a.claim_id(1).expect("id"));
        s.write_private(1, "state", b"a").expect("write");
        a.publish(1).expect("publish");
        a.seal("STOPPED").expect("seal");
        // A new run claims after the seal, before the old one cleaned up.
        let b = Fence::claim(&s).expect("claim");
        assert_eq!(
            s.record_before(b.generation()).expect("record"),
            Some(Record::End {
                generation: a.generation(),
                status: "STOPPED".into(),
                next_id: 2
            })
        );
        assert_eq!(s.next_id().expect("next"), 2);
        assert!(b.claim_id(2).expect("id"));
        s.write_private(2, "state", b"b").expect("write");
        b.publish(2).expect("publish");
        s.clear(Some(a.high_water())).expect("the old run's cleanup");
        assert!(!s.chk_dir(1).join("state").exists(), "the old run's checkpoint goes");
        assert!(s.chk_dir(2).join("state").exists(), "the new run's stays");
        // A fresh start clears everything; the next ids are still new.
        b.seal("CANCELED").expect("seal");
        let c = Fence::claim(&s).expect("claim");
        s.clear(None).expect("fresh start");
        assert!(!s.chk_dir(2).exists());
        assert_eq!(s.next_id().expect("next"), 3, "ids are never reused");
        assert_eq!(c.high_water(), 2);
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
