//! Checkpoint storage: a directory per job (Flink's layout).
//!
//! ```text
//! <execution.checkpointing.dir>/<job>/
//!     shared/    SST files, possibly referenced by several checkpoints
//!     chk-N/     private files of checkpoint N, its _metadata, and _claim
//!                (the generation that took id N)
//!     log/       records of generations and published checkpoints
//!                (the fence, see [`super::fence`] and [`super::records`])
//! ```
//!
//! The layout lives here; the bytes live in a [`CheckpointStore`]
//! ([`super::store`]). Everything here is blocking; the coordinator runs
//! it on the blocking pool so processing never waits for it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::CheckpointError;
use super::metadata::{CheckpointMetadata, FileRef};
use super::records::{LOG_DIR, Record, parse_record_name, record_key};
use super::store::{CheckpointStore, Created, LocalStore};
use crate::failpoint::failpoint;

pub use super::store::remove_dir_if_exists;

pub const METADATA_FILE: &str = "_metadata";

/// The object in `chk-N/` naming the generation that took id N.
pub const CLAIM_FILE: &str = "_claim";

#[derive(Debug, Clone)]
pub struct CheckpointStorage {
    root: PathBuf,
    store: Arc<dyn CheckpointStore>,
    /// On an object store (not a local directory).
    remote: bool,
}

impl CheckpointStorage {
    /// The checkpoints of a job below the local directory `root`.
    pub fn new(root: PathBuf) -> Self {
        let store = Arc::new(LocalStore::new(root.clone()));
        Self {
            root,
            store,
            remote: false,
        }
    }

    /// The checkpoints of a job in `store`, whose root `root` names.
    pub fn on(store: Arc<dyn CheckpointStore>, root: PathBuf) -> Self {
        Self {
            root,
            store,
            remote: true,
        }
    }

    /// Whether the checkpoints are on an object store.
    pub fn on_object_store(&self) -> bool {
        self.remote
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a file of the storage is, for messages.
    pub fn locate(&self, rel: &str) -> PathBuf {
        self.store.locate(rel)
    }

    pub fn chk_dir(&self, id: u64) -> PathBuf {
        self.root.join(format!("chk-{id}"))
    }

    /// Takes checkpoint id `id` for `generation`: no later attempt, and no
    /// other run, writes into `chk-id/`. `false` when another generation
    /// took it first (a retried claim of one's own is `true`).
    pub fn claim_id(&self, id: u64, generation: u64) -> Result<bool, CheckpointError> {
        let mine = generation.to_string();
        match self.store.create(&format!("chk-{id}/{CLAIM_FILE}"), mine.as_bytes())? {
            Created::Created => Ok(true),
            Created::Exists(bytes) => Ok(bytes == mine.as_bytes()),
        }
    }

    /// Sequence numbers of the log's records, ascending.
    pub fn log_seqs(&self) -> Result<Vec<u64>, CheckpointError> {
        let mut seqs: Vec<u64> = self
            .store
            .list(LOG_DIR)?
            .into_iter()
            .filter(|l| !l.is_prefix)
            .filter_map(|l| parse_record_name(&l.name))
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// Creates the log record `seq` (only if none is there).
    pub fn create_record(&self, seq: u64, bytes: &[u8]) -> Result<Created, CheckpointError> {
        self.store.create(&record_key(seq), bytes)
    }

    /// Reads the log record `seq`.
    pub fn read_record(&self, seq: u64) -> Result<Record, CheckpointError> {
        let key = record_key(seq);
        let bytes = self.store.get(&key)?;
        serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Corrupt {
            path: self.locate(&key).display().to_string(),
            message: format!("not a log record: {e}"),
        })
    }

    /// Every record of the log with its sequence number, ascending. A
    /// record deleted between the listing and the read (garbage
    /// collection by the owning run) is left out.
    pub fn log_records(&self) -> Result<Vec<(u64, Record)>, CheckpointError> {
        let mut out = vec![];
        for seq in self.log_seqs()? {
            match self.read_record(seq) {
                Ok(r) => out.push((seq, r)),
                Err(CheckpointError::Missing { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Checkpoint ids the log records as published, with their records'
    /// sequence numbers.
    fn published(&self) -> Result<Vec<(u64, u64)>, CheckpointError> {
        Ok(self
            .log_records()?
            .into_iter()
            .filter_map(|(seq, r)| match r {
                Record::Checkpoint { checkpoint, .. } => Some((seq, checkpoint)),
                _ => None,
            })
            .collect())
    }

    /// Deletes the log's checkpoint records `drop` says to, oldest first,
    /// never the newest record (the log's end must stay, see
    /// [`super::fence`]) nor a generation's claim.
    fn drop_records(&self, drop: impl Fn(u64) -> bool) -> Result<(), CheckpointError> {
        let published = self.published()?;
        let newest = self.log_seqs()?.last().copied();
        for (seq, id) in published {
            if Some(seq) != newest && drop(id) {
                self.store.delete(&record_key(seq))?;
            }
        }
        Ok(())
    }

    /// Copies a local file into the checkpoint: `shared/` (named so no two
    /// checkpoints' uploads collide) or `chk-N/`.
    pub fn upload(&self, id: u64, src: &Path, name: &str, shared: bool) -> Result<FileRef, CheckpointError> {
        let rel = if shared {
            format!("shared/{name}")
        } else {
            format!("chk-{id}/{name}")
        };
        let (size, xxh64) = self.store.put_file(&rel, src, Some("checkpoint.upload"))?;
        failpoint("checkpoint.file_uploaded");
        Ok(FileRef { path: rel, size, xxh64 })
    }

    /// Writes bytes as a private file of checkpoint `id`.
    pub fn write_private(&self, id: u64, name: &str, bytes: &[u8]) -> Result<FileRef, CheckpointError> {
        self.write_file(&format!("chk-{id}/{name}"), bytes)
    }

    /// Writes bytes to `rel` (a path below the root), durably.
    pub fn write_file(&self, rel: &str, bytes: &[u8]) -> Result<FileRef, CheckpointError> {
        self.store.put(rel, bytes)?;
        Ok(FileRef {
            path: rel.to_string(),
            size: bytes.len() as u64,
            xxh64: super::metadata::checksum(bytes),
        })
    }

    /// Makes checkpoint `meta` complete: its `_metadata` published (see
    /// [`CheckpointStore::publish`]). A crash at any point leaves either
    /// no `_metadata` or a whole one.
    pub fn commit_metadata(&self, meta: &CheckpointMetadata) -> Result<(), CheckpointError> {
        let bytes = meta.encode()?;
        self.store
            .publish(&format!("chk-{}/{METADATA_FILE}", meta.checkpoint_id), &bytes)
    }

    /// Makes a savepoint complete: its `_metadata` published at the root
    /// (a savepoint directory is its own root).
    pub fn commit_savepoint(&self, meta: &CheckpointMetadata) -> Result<(), CheckpointError> {
        let bytes = meta.encode()?;
        self.store.publish(METADATA_FILE, &bytes)
    }

    /// Whether `key` (below the root) exists.
    pub fn exists(&self, key: &str) -> Result<bool, CheckpointError> {
        Ok(self.store.size(key)?.is_some())
    }

    /// Names of the directories (prefixes) directly below the root.
    pub fn subdirs(&self) -> Result<Vec<String>, CheckpointError> {
        Ok(self
            .store
            .list("")?
            .into_iter()
            .filter(|l| l.is_prefix)
            .map(|l| l.name)
            .collect())
    }

    /// Reads and verifies the metadata at `key`, without checking the
    /// files it names (a listing, not a restore).
    pub fn read_metadata(&self, key: &str) -> Result<CheckpointMetadata, CheckpointError> {
        let bytes = self.store.get(key)?;
        CheckpointMetadata::decode(&bytes, &self.locate(key).display().to_string())
    }

    /// Deletes everything below the root, and the root (a savepoint that
    /// failed, or a snapshot restored under CLAIM once it is not needed).
    pub fn destroy(&self) -> Result<(), CheckpointError> {
        self.store.delete_prefix("")?;
        self.store.remove_root_if_empty();
        Ok(())
    }

    /// How the job's last run ended (`status` beside its checkpoints), if
    /// recorded there.
    pub fn read_status(&self) -> Result<Option<String>, CheckpointError> {
        match self.store.get("status") {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(CheckpointError::Missing { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Records how the job's run stands (see [`Self::read_status`]).
    pub fn write_status(&self, status: &str) -> Result<(), CheckpointError> {
        self.store.put("status", status.as_bytes())
    }

    /// Ids of every `chk-N` directory, complete or not, ascending.
    fn chk_ids(&self) -> Result<Vec<u64>, CheckpointError> {
        let mut ids: Vec<u64> = self
            .store
            .list("")?
            .into_iter()
            .filter_map(|l| l.name.strip_prefix("chk-").and_then(|n| n.parse::<u64>().ok()))
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Ids of complete checkpoints, ascending: those the log records as
    /// published whose metadata exists. (A `chk-N` with metadata but no
    /// claim was written before the log existed, and counts too; one with
    /// a claim but no record was written by a run that was fenced, or
    /// died, before publishing it.)
    pub fn complete_ids(&self) -> Result<Vec<u64>, CheckpointError> {
        let published: HashSet<u64> = self.published()?.into_iter().map(|(_, id)| id).collect();
        let mut ids = vec![];
        for id in self.chk_ids()? {
            if self.store.size(&format!("chk-{id}/{METADATA_FILE}"))?.is_none() {
                continue;
            }
            if published.contains(&id) || self.store.size(&format!("chk-{id}/{CLAIM_FILE}"))?.is_none() {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// The id after every checkpoint ever started or published here: ids
    /// are never reused, so files of an abandoned attempt cannot be
    /// mistaken for new.
    pub fn next_id(&self) -> Result<u64, CheckpointError> {
        let dirs = self.chk_ids()?.last().copied().unwrap_or(0);
        let logged = self
            .log_records()?
            .into_iter()
            .map(|(_, r)| match r {
                Record::Checkpoint { checkpoint, .. } | Record::Savepoint { checkpoint, .. } => checkpoint,
                Record::End { next_id, .. } => next_id.saturating_sub(1),
                Record::Generation { .. } => 0,
            })
            .max()
            .unwrap_or(0);
        Ok(dirs.max(logged).saturating_add(1))
    }

    /// The record just before `seq` (how the run before a claim at `seq`
    /// left the log), if any.
    pub fn record_before(&self, seq: u64) -> Result<Option<Record>, CheckpointError> {
        if seq <= 1 {
            return Ok(None);
        }
        match self.read_record(seq - 1) {
            Ok(r) => Ok(Some(r)),
            Err(CheckpointError::Missing { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes checkpoint directory `id`: its `_metadata` first, so a
    /// deletion cut short never leaves a metadata without its claim.
    fn delete_checkpoint(&self, id: u64) -> Result<u64, CheckpointError> {
        self.store.delete(&format!("chk-{id}/{METADATA_FILE}"))?;
        self.store.delete_prefix(&format!("chk-{id}"))
    }

    /// Reads and verifies checkpoint `id`'s metadata and checks that every
    /// file it references exists with the recorded size. (Contents are
    /// verified against the checksum when restored.)
    pub fn load(&self, id: u64) -> Result<CheckpointMetadata, CheckpointError> {
        self.load_key(&format!("chk-{id}/{METADATA_FILE}"))
    }

    /// Reads and verifies `dir/_metadata`, whose files are relative to the
    /// storage root (a checkpoint's `chk-N`, or a savepoint directory that
    /// is its own root).
    pub fn load_dir(&self, dir: &Path) -> Result<CheckpointMetadata, CheckpointError> {
        let rel = dir.strip_prefix(&self.root).map_err(|_| {
            CheckpointError::Internal(format!(
                "{} is not below the checkpoint storage {}",
                dir.display(),
                self.root.display()
            ))
        })?;
        let prefix = rel.to_string_lossy();
        if prefix.is_empty() {
            self.load_key(METADATA_FILE)
        } else {
            self.load_key(&format!("{prefix}/{METADATA_FILE}"))
        }
    }

    fn load_key(&self, key: &str) -> Result<CheckpointMetadata, CheckpointError> {
        let bytes = self.store.get(key)?;
        let meta = CheckpointMetadata::decode(&bytes, &self.locate(key).display().to_string())?;
        for f in meta.files() {
            match self.store.size(&f.path)? {
                None => {
                    return Err(CheckpointError::Missing {
                        path: self.locate(&f.path),
                    });
                }
                Some(len) if len != f.size => {
                    return Err(CheckpointError::Corrupt {
                        path: self.locate(&f.path).display().to_string(),
                        message: format!("size {len} bytes, metadata says {}", f.size),
                    });
                }
                Some(_) => {}
            }
        }
        Ok(meta)
    }

    /// Copies a checkpoint file to `dst`, verifying size and checksum.
    pub fn restore_file(&self, f: &FileRef, dst: &Path) -> Result<(), CheckpointError> {
        let (size, sum) = self.store.get_to_file(&f.path, dst)?;
        if size != f.size || sum != f.xxh64 {
            return Err(CheckpointError::Corrupt {
                path: self.locate(&f.path).display().to_string(),
                message: format!(
                    "content does not match the metadata ({size} bytes, xxh64 {sum}; expected {} bytes, xxh64 {})",
                    f.size, f.xxh64
                ),
            });
        }
        Ok(())
    }

    /// Reads a checkpoint file, verifying size and checksum.
    pub fn read_file(&self, f: &FileRef) -> Result<Vec<u8>, CheckpointError> {
        let bytes = self.store.get(&f.path)?;
        let sum = super::metadata::checksum(&bytes);
        if bytes.len() as u64 != f.size || sum != f.xxh64 {
            return Err(CheckpointError::Corrupt {
                path: self.locate(&f.path).display().to_string(),
                message: format!(
                    "content does not match the metadata ({} bytes, xxh64 {sum})",
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    /// Deletes what no retained checkpoint needs: checkpoint directories
    /// older than the newest retained one and not retained, their log
    /// records, and shared files no retained checkpoint references that
    /// were uploaded for such an older checkpoint. Returns the bytes
    /// freed.
    ///
    /// Nothing newer than the newest retained checkpoint is touched: a
    /// run replaced by a newer generation may still collect garbage for
    /// the last checkpoint it published, and everything the newer run
    /// writes carries a newer id.
    pub fn collect_garbage(&self, retained: &[&CheckpointMetadata]) -> Result<u64, CheckpointError> {
        let keep: HashSet<u64> = retained.iter().map(|m| m.checkpoint_id).collect();
        let Some(newest) = retained.iter().map(|m| m.checkpoint_id).max() else {
            return Ok(0);
        };
        let old = |id: u64| id < newest && !keep.contains(&id);
        // Unpublished before their files go.
        self.drop_records(old)?;
        let mut freed = 0;
        for id in self.chk_ids()? {
            if old(id) {
                freed += self.delete_checkpoint(id)?;
            }
        }
        let referenced: HashSet<&str> = retained
            .iter()
            .flat_map(|m| m.files())
            .map(|f| f.path.as_str())
            .collect();
        for entry in self.store.list("shared")? {
            let rel = format!("shared/{}", entry.name);
            let uploaded_for = shared_file_checkpoint(&entry.name);
            if !entry.is_prefix && !referenced.contains(rel.as_str()) && uploaded_for.is_some_and(|id| id <= newest) {
                self.store.delete(&rel)?;
                freed += entry.size;
            }
        }
        Ok(freed)
    }

    /// Removes what a failed attempt at checkpoint `id` wrote: its
    /// `_metadata` first (it may exist if only the syncs after the rename
    /// failed), then the rest of `chk-id/`, then the shared files it
    /// uploaded (`shared`: names in `shared/`; no other checkpoint
    /// references them, their names carry `id`). The id stays taken, so
    /// it is never reused. If this fails, what is left is referenced by
    /// no retained checkpoint, so the garbage collection after the next
    /// completed checkpoint deletes it.
    pub fn discard_attempt(&self, id: u64, shared: &[String]) -> Result<(), CheckpointError> {
        let dir = format!("chk-{id}");
        // The checkpoint must stop existing before its files go.
        self.store.delete(&format!("{dir}/{METADATA_FILE}"))?;
        for entry in self.store.list(&dir)? {
            let rel = format!("{dir}/{}", entry.name);
            if entry.name == CLAIM_FILE {
                // The id stays taken.
                continue;
            }
            if entry.is_prefix {
                self.store.delete_prefix(&rel)?;
            } else {
                self.store.delete(&rel)?;
            }
        }
        for name in shared {
            self.store.delete(&format!("shared/{name}"))?;
        }
        Ok(())
    }

    /// Moves the checkpoints (`chk-*`, `shared/`) into `retained-<ms>/`
    /// below the root, keeping their relative layout: restorable by path,
    /// out of reach of later runs' cleanup. Only ids up to `bound` (the
    /// run's [`super::fence::Fence::high_water`]) and their shared files:
    /// a run that claimed the job since has ids above it. `None` when
    /// there was nothing to retain.
    pub fn retain_aside(&self, now_ms: i64, bound: Option<u64>) -> Result<Option<PathBuf>, CheckpointError> {
        let within = |id: u64| bound.is_none_or(|b| id <= b);
        if !self.complete_ids()?.into_iter().any(within) {
            return Ok(None);
        }
        let dest = format!("retained-{now_ms}");
        self.store.reserve(&dest)?;
        for id in self.chk_ids()? {
            if within(id) {
                self.store
                    .rename_prefix(&format!("chk-{id}"), &format!("{dest}/chk-{id}"))?;
            }
        }
        for entry in self.store.list("shared")? {
            if !entry.is_prefix && shared_file_checkpoint(&entry.name).is_some_and(within) {
                self.store.rename(
                    &format!("shared/{}", entry.name),
                    &format!("{dest}/shared/{}", entry.name),
                )?;
            }
        }
        self.drop_records(within)?;
        Ok(Some(self.locate(&dest)))
    }

    /// Removes the job's checkpoints (a fresh start, or a stop that keeps
    /// none): `chk-*` directories and `shared/` files, up to `bound` as in
    /// [`Self::retain_aside`], nothing else, so a checkpoint directory
    /// pointed at a directory holding other files never loses them. The
    /// log stays (it fences earlier runs, and its last end record keeps
    /// ids unique).
    pub fn clear(&self, bound: Option<u64>) -> Result<(), CheckpointError> {
        let within = |id: u64| bound.is_none_or(|b| id <= b);
        self.drop_records(within)?;
        for id in self.chk_ids()? {
            if within(id) {
                self.delete_checkpoint(id)?;
            }
        }
        for entry in self.store.list("shared")? {
            let ours = match shared_file_checkpoint(&entry.name) {
                Some(id) => within(id),
                None => bound.is_none(),
            };
            if !entry.is_prefix && ours {
                self.store.delete(&format!("shared/{}", entry.name))?;
            }
        }
        if bound.is_none() {
            self.store.delete_prefix("shared")?;
        }
        self.store.remove_root_if_empty();
        Ok(())
    }
}

/// The id of the checkpoint a shared file was uploaded for: its name is
/// `<operator>-c<id>-<local name>` (see the coordinator's upload).
fn shared_file_checkpoint(name: &str) -> Option<u64> {
    let mut parts = name.rsplitn(3, '-');
    let _local = parts.next()?;
    parts.next()?.strip_prefix('c')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_discarded_attempt_leaves_its_id_used_and_nothing_of_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = CheckpointStorage::new(dir.path().to_path_buf());
        let src = dir.path().join("src.sst");
        std::fs::write(&src, b"sst").expect("write");
        let older = storage.upload(1, &src, "a-c1-000001.sst", true).expect("upload");
        let mine = storage.upload(2, &src, "a-c2-000002.sst", true).expect("upload");
        storage.write_private(2, "MANIFEST", b"m").expect("private");
        // As if the rename went through and a sync after it failed.
        std::fs::write(storage.chk_dir(2).join(METADATA_FILE), b"whole").expect("metadata");
        storage
            .discard_attempt(2, &["a-c2-000002.sst".into(), "never-started.sst".into()])
            .expect("discard");
        let left: Vec<_> = std::fs::read_dir(storage.chk_dir(2))
            .expect("chk-2")
            .flatten()
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(!dir.path().join(&mine.path).exists(), "its shared file is gone");
        assert!(dir.path().join(&older.path).exists(), "other checkpoints' files stay");
        assert_eq!(storage.next_id().expect("next id"), 3, "the id stays used");
        assert!(storage.complete_ids().expect("ids").is_empty());
    }
}
