//! Checkpoint storage: a directory per job (Flink's layout).
//!
//! ```text
//! <execution.checkpointing.dir>/<job>/
//!     shared/    SST files, possibly referenced by several checkpoints
//!     chk-N/     private files of checkpoint N and its _metadata
//! ```
//!
//! Everything here is blocking file I/O; the coordinator runs it on the
//! blocking pool so processing never waits for it.

use std::collections::HashSet;
use std::fs::File;
use std::hash::Hasher;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::CheckpointError;
use super::metadata::{CheckpointMetadata, FileRef};
use crate::failpoint::{failpoint, failpoint_io};

pub const METADATA_FILE: &str = "_metadata";

#[derive(Debug, Clone)]
pub struct CheckpointStorage {
    root: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Copies `src` to `dst`, returning (bytes, xxh64), and makes `dst` durable.
/// `fault` names an I/O failpoint passed after the first chunk is written,
/// so an injected error leaves a partial file as a real one would.
fn copy_hashed(src: &Path, dst: &Path, fault: Option<&str>) -> Result<(u64, String), CheckpointError> {
    let mut input = File::open(src).map_err(io(src))?;
    let mut out = File::create(dst).map_err(io(dst))?;
    let mut h = twox_hash::XxHash64::with_seed(0);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = input.read(&mut buf).map_err(io(src))?;
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io(dst))?;
        if total == 0
            && let Some(name) = fault
        {
            failpoint_io(name).map_err(io(dst))?;
        }
        total += n as u64;
    }
    out.sync_all().map_err(io(dst))?;
    Ok((total, format!("{:016x}", h.finish())))
}

/// Reads a whole file; a missing one is `Missing`, not an I/O error.
fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => CheckpointError::Missing {
            path: path.to_path_buf(),
        },
        _ => CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// Removes a directory tree; one that does not exist is fine.
pub fn remove_dir_if_exists(dir: &Path) -> Result<(), CheckpointError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CheckpointError::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

impl CheckpointStorage {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn chk_dir(&self, id: u64) -> PathBuf {
        self.root.join(format!("chk-{id}"))
    }

    fn shared_dir(&self) -> PathBuf {
        self.root.join("shared")
    }

    /// Copies a local file into the checkpoint: `shared/` (named so no two
    /// checkpoints' uploads collide) or `chk-N/`.
    pub fn upload(&self, id: u64, src: &Path, name: &str, shared: bool) -> Result<FileRef, CheckpointError> {
        let (dir, rel_dir) = if shared {
            (self.shared_dir(), "shared".to_string())
        } else {
            (self.chk_dir(id), format!("chk-{id}"))
        };
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let (size, xxh64) = copy_hashed(src, &dir.join(name), Some("checkpoint.upload"))?;
        failpoint("checkpoint.file_uploaded");
        Ok(FileRef {
            path: format!("{rel_dir}/{name}"),
            size,
            xxh64,
        })
    }

    /// Writes bytes as a private file of checkpoint `id`.
    pub fn write_private(&self, id: u64, name: &str, bytes: &[u8]) -> Result<FileRef, CheckpointError> {
        self.write_file(&format!("chk-{id}/{name}"), bytes)
    }

    /// Writes bytes to `rel` (a path below the root), synced.
    pub fn write_file(&self, rel: &str, bytes: &[u8]) -> Result<FileRef, CheckpointError> {
        let path = self.root.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let mut f = File::create(&path).map_err(io(&path))?;
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        f.write_all(head).map_err(io(&path))?;
        failpoint_io("checkpoint.upload").map_err(io(&path))?;
        f.write_all(tail).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))?;
        Ok(FileRef {
            path: rel.to_string(),
            size: bytes.len() as u64,
            xxh64: super::metadata::checksum(bytes),
        })
    }

    /// Makes checkpoint `meta` complete: metadata written to a temporary
    /// file, synced, renamed into place, directory synced. A crash at any
    /// point leaves either no `_metadata` or a whole one.
    pub fn commit_metadata(&self, meta: &CheckpointMetadata) -> Result<(), CheckpointError> {
        self.commit_metadata_in(&self.chk_dir(meta.checkpoint_id), meta)
    }

    /// [`Self::commit_metadata`] into `dir` (a savepoint directory).
    pub fn commit_metadata_in(&self, dir: &Path, meta: &CheckpointMetadata) -> Result<(), CheckpointError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let tmp = dir.join("_metadata.inprogress");
        let bytes = meta.encode()?;
        failpoint("checkpoint.before_metadata_write");
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        f.write_all(head).map_err(io(&tmp))?;
        failpoint_io("checkpoint.metadata_write").map_err(io(&tmp))?;
        f.write_all(tail).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        // Every file the metadata names, and the directories holding them,
        // are durable before the metadata makes the checkpoint exist.
        if self.shared_dir().exists() {
            sync_dir(&self.shared_dir())?;
        }
        for sub in ["state"] {
            if dir.join(sub).exists() {
                sync_dir(&dir.join(sub))?;
            }
        }
        sync_dir(dir)?;
        sync_dir(&self.root)?;
        failpoint("checkpoint.before_metadata_rename");
        let path = dir.join(METADATA_FILE);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        sync_dir(dir)?;
        failpoint("checkpoint.after_metadata_rename");
        Ok(())
    }

    /// Ids of every `chk-N` directory, complete or not, ascending.
    fn chk_ids(&self) -> Result<Vec<u64>, CheckpointError> {
        let mut ids = vec![];
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
            Err(e) => return Err(io(&self.root)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&self.root))?;
            if let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("chk-"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Ids of checkpoints whose metadata exists, ascending.
    pub fn complete_ids(&self) -> Result<Vec<u64>, CheckpointError> {
        Ok(self
            .chk_ids()?
            .into_iter()
            .filter(|id| self.chk_dir(*id).join(METADATA_FILE).exists())
            .collect())
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
        self.load_dir(&self.chk_dir(id))
    }

    /// Reads and verifies `dir/_metadata`, whose files are relative to the
    /// storage root (a checkpoint's `chk-N`, or a savepoint directory that
    /// is its own root).
    pub fn load_dir(&self, dir: &Path) -> Result<CheckpointMetadata, CheckpointError> {
        let path = dir.join(METADATA_FILE);
        let bytes = read(&path)?;
        let meta = CheckpointMetadata::decode(&bytes, &path.display().to_string())?;
        for f in meta.files() {
            let p = self.root.join(&f.path);
            match std::fs::metadata(&p) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(CheckpointError::Missing { path: p });
                }
                Err(e) => return Err(io(&p)(e)),
                Ok(m) if m.len() != f.size => {
                    return Err(CheckpointError::Corrupt {
                        path: p.display().to_string(),
                        message: format!("size {} bytes, metadata says {}", m.len(), f.size),
                    });
                }
                Ok(_) => {}
            }
        }
        Ok(meta)
    }

    /// Copies a checkpoint file to `dst`, verifying size and checksum.
    pub fn restore_file(&self, f: &FileRef, dst: &Path) -> Result<(), CheckpointError> {
        let src = self.root.join(&f.path);
        let (size, sum) = copy_hashed(&src, dst, None).map_err(|e| match e {
            // Writing the copy failed: the local disk's fault (full, say),
            // not the checkpoint's.
            CheckpointError::Io { path, source } if path == dst => CheckpointError::LocalState { path, source },
            CheckpointError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                CheckpointError::Missing { path: src.clone() }
            }
            other => other,
        })?;
        if size != f.size || sum != f.xxh64 {
            return Err(CheckpointError::Corrupt {
                path: src.display().to_string(),
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
        let src = self.root.join(&f.path);
        let bytes = read(&src)?;
        let sum = super::metadata::checksum(&bytes);
        if bytes.len() as u64 != f.size || sum != f.xxh64 {
            return Err(CheckpointError::Corrupt {
                path: src.display().to_string(),
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
                let dir = self.chk_dir(id);
                freed += dir_size(&dir);
                std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
            }
        }
        let referenced: HashSet<&str> = retained
            .iter()
            .flat_map(|m| m.files())
            .map(|f| f.path.as_str())
            .collect();
        let shared = self.shared_dir();
        if let Ok(entries) = std::fs::read_dir(&shared) {
            for entry in entries {
                let entry = entry.map_err(io(&shared))?;
                let rel = format!("shared/{}", entry.file_name().to_string_lossy());
                if !referenced.contains(rel.as_str()) {
                    freed += entry.metadata().map(|m| m.len()).unwrap_or(0);
                    std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
                }
            }
        }
        Ok(freed)
    }

    /// Removes what a failed attempt at checkpoint `id` wrote: its
    /// `_metadata` first (it may exist if only the syncs after the rename
    /// failed), then the rest of `chk-id/`, then the shared files it
    /// uploaded (`shared`: names in `shared/`; no other checkpoint
    /// references them, their names carry `id`). The empty `chk-id/`
    /// stays, so the id is never reused. If this fails, what is left is
    /// referenced by no retained checkpoint, so the garbage collection
    /// after the next completed checkpoint deletes it.
    pub fn discard_attempt(&self, id: u64, shared: &[String]) -> Result<(), CheckpointError> {
        let dir = self.chk_dir(id);
        let metadata = dir.join(METADATA_FILE);
        match std::fs::remove_file(&metadata) {
            // The checkpoint must stop existing before its files go.
            Ok(()) => sync_dir(&dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&metadata)(e)),
        }
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => Some(e),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&dir)(e)),
        };
        for entry in entries.into_iter().flatten() {
            let path = entry.map_err(io(&dir))?.path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path)(e)),
            }
        }
        let shared_dir = self.shared_dir();
        for name in shared {
            let path = shared_dir.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path)(e)),
            }
        }
        Ok(())
    }

    /// Removes every checkpoint of the job (a fresh start): the `chk-*`
    /// directories and `shared/`, nothing else, so a checkpoint directory
    /// pointed at a directory holding other files never loses them; the
    /// root goes only when that leaves it empty.
    /// Moves every checkpoint (`chk-*`, `shared/`) into `retained-<ms>/`
    /// below the root, keeping their relative layout: restorable by path,
    /// out of reach of later runs' cleanup. `None` when there was none.
    pub fn retain_aside(&self, now_ms: i64) -> Result<Option<PathBuf>, CheckpointError> {
        if self.complete_ids()?.is_empty() {
            return Ok(None);
        }
        let dest = self.root.join(format!("retained-{now_ms}"));
        std::fs::create_dir_all(&dest).map_err(io(&dest))?;
        for entry in std::fs::read_dir(&self.root).map_err(io(&self.root))?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name == "shared" || name.starts_with("chk-") {
                let to = dest.join(&name);
                std::fs::rename(entry.path(), &to).map_err(io(&to))?;
            }
        }
        sync_dir(&dest)?;
        sync_dir(&self.root)?;
        Ok(Some(dest))
    }

    pub fn clear(&self) -> Result<(), CheckpointError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: self.root.clone(),
                    source,
                });
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name == "shared" || name.starts_with("chk-") {
                remove_dir_if_exists(&entry.path())?;
            }
        }
        // Not empty (someone else's files): kept.
        let _ = std::fs::remove_dir(&self.root);
        Ok(())
    }
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|es| es.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
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
