//! Checkpoint storage: a directory per job (Flink's layout).
//!
//! ```text
//! <execution.checkpointing.dir>/<job>/
//!     shared/    SST files, possibly referenced by several checkpoints
//!     chk-N/     private files of checkpoint N and its _metadata
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
use super::store::{CheckpointStore, LocalStore};
use crate::failpoint::failpoint;

pub use super::store::remove_dir_if_exists;

pub const METADATA_FILE: &str = "_metadata";

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

    /// Takes checkpoint id `id`: no later attempt reuses it, even if
    /// nothing else of the checkpoint is ever written.
    pub fn reserve(&self, id: u64) -> Result<(), CheckpointError> {
        self.store.reserve(&format!("chk-{id}"))
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

    /// Ids of checkpoints whose metadata exists, ascending.
    pub fn complete_ids(&self) -> Result<Vec<u64>, CheckpointError> {
        let mut ids = vec![];
        for id in self.chk_ids()? {
            if self.store.size(&format!("chk-{id}/{METADATA_FILE}"))?.is_some() {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// The id after every checkpoint ever started here: ids are never
    /// reused, so files of an abandoned attempt cannot be mistaken for new.
    pub fn next_id(&self) -> Result<u64, CheckpointError> {
        Ok(self.chk_ids()?.last().map_or(1, |m| m + 1))
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

    /// Deletes every checkpoint directory not in `retained` (older ones,
    /// and abandoned or corrupt newer ones) and every shared file no
    /// retained checkpoint references. Returns the bytes freed.
    pub fn collect_garbage(&self, retained: &[&CheckpointMetadata]) -> Result<u64, CheckpointError> {
        let keep: HashSet<u64> = retained.iter().map(|m| m.checkpoint_id).collect();
        let mut freed = 0;
        for id in self.chk_ids()? {
            if !keep.contains(&id) {
                freed += self.store.delete_prefix(&format!("chk-{id}"))?;
            }
        }
        let referenced: HashSet<&str> = retained
            .iter()
            .flat_map(|m| m.files())
            .map(|f| f.path.as_str())
            .collect();
        for entry in self.store.list("shared")? {
            let rel = format!("shared/{}", entry.name);
            if !entry.is_prefix && !referenced.contains(rel.as_str()) {
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

    /// Moves every checkpoint (`chk-*`, `shared/`) into `retained-<ms>/`
    /// below the root, keeping their relative layout: restorable by path,
    /// out of reach of later runs' cleanup. `None` when there was none.
    pub fn retain_aside(&self, now_ms: i64) -> Result<Option<PathBuf>, CheckpointError> {
        if self.complete_ids()?.is_empty() {
            return Ok(None);
        }
        let dest = format!("retained-{now_ms}");
        self.store.reserve(&dest)?;
        for entry in self.store.list("")? {
            if entry.name == "shared" || entry.name.starts_with("chk-") {
                self.store
                    .rename_prefix(&entry.name, &format!("{dest}/{}", entry.name))?;
            }
        }
        Ok(Some(self.locate(&dest)))
    }

    /// Removes every checkpoint of the job (a fresh start): the `chk-*`
    /// directories and `shared/`, nothing else, so a checkpoint directory
    /// pointed at a directory holding other files never loses them; the
    /// root goes only when that leaves it empty.
    pub fn clear(&self) -> Result<(), CheckpointError> {
        for entry in self.store.list("")? {
            if entry.name == "shared" || entry.name.starts_with("chk-") {
                self.store.delete_prefix(&entry.name)?;
            }
        }
        self.store.remove_root_if_empty();
        Ok(())
    }
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
