//! Where checkpoint and savepoint files live: a [`CheckpointStore`] of
//! objects named by `/`-separated keys below a root. [`super::storage`]
//! keeps the layout (`chk-N/`, `shared/`, `_metadata`) and speaks only to
//! this trait, so the layout does not change with the store.
//!
//! [`LocalStore`] is a directory on a local (or mounted) filesystem:
//! every file is synced before a write returns, and the commit point
//! ([`CheckpointStore::publish`]) is a synced temporary file renamed into
//! place after the directories holding what it names are synced.
//!
//! Blocking: callers run on the blocking pool, never on a runtime thread.

use std::fs::File;
use std::hash::Hasher;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::CheckpointError;
use crate::failpoint::{failpoint, failpoint_io};

/// One entry directly below a key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    /// A prefix holding more entries (a directory), not an object.
    pub is_prefix: bool,
    /// The object's size in bytes (0 for a prefix).
    pub size: u64,
}

/// What [`CheckpointStore::create`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The object is this writer's.
    Created,
    /// Someone created it first: their bytes (which may be this writer's
    /// own, from an earlier try whose answer was lost).
    Exists(Vec<u8>),
}

/// Objects below a root, by key (`chk-3/_metadata`, `shared/a.sst`).
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// Copies the local file `src` to `key` and makes it durable; returns
    /// its size and xxh64. `fault` names an I/O failpoint passed after the
    /// first chunk is written (a partial object, as a real failure
    /// leaves).
    fn put_file(&self, key: &str, src: &Path, fault: Option<&str>) -> Result<(u64, String), CheckpointError>;

    /// Writes `bytes` to `key` and makes them durable.
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), CheckpointError>;

    /// The commit point: writes `bytes` to `key` so that readers see all
    /// of it or nothing, and only once everything put before it is
    /// durable.
    fn publish(&self, key: &str, bytes: &[u8]) -> Result<(), CheckpointError>;

    /// Writes `bytes` to `key` only if no object is there, atomically:
    /// of writers racing for one key exactly one creates it, and every
    /// other reads the winner's bytes back (the base of a fence: a claim
    /// that cannot be taken twice).
    fn create(&self, key: &str, bytes: &[u8]) -> Result<Created, CheckpointError>;

    /// The whole object; a missing one is [`CheckpointError::Missing`].
    fn get(&self, key: &str) -> Result<Vec<u8>, CheckpointError>;

    /// Copies the object to the local file `dst`; returns its size and
    /// xxh64. An error writing `dst` is [`CheckpointError::LocalState`]
    /// (the local disk's fault, not the checkpoint's).
    fn get_to_file(&self, key: &str, dst: &Path) -> Result<(u64, String), CheckpointError>;

    /// The object's size, `None` when there is none.
    fn size(&self, key: &str) -> Result<Option<u64>, CheckpointError>;

    /// The entries directly below `prefix` (`""`: the root); none when it
    /// does not exist.
    fn list(&self, prefix: &str) -> Result<Vec<Listed>, CheckpointError>;

    /// Deletes one object; a missing one is fine.
    fn delete(&self, key: &str) -> Result<(), CheckpointError>;

    /// Deletes every object below `prefix`; returns the bytes freed.
    fn delete_prefix(&self, prefix: &str) -> Result<u64, CheckpointError>;

    /// Marks `prefix` as existing although it may hold nothing yet (a
    /// checkpoint id taken, so no later attempt reuses it).
    fn reserve(&self, prefix: &str) -> Result<(), CheckpointError>;

    /// Moves every object below `from` to the same names below `to`.
    fn rename_prefix(&self, from: &str, to: &str) -> Result<(), CheckpointError>;

    /// Moves the one object `from` to `to`.
    fn rename(&self, from: &str, to: &str) -> Result<(), CheckpointError>;

    /// Removes the root itself when nothing is left below it.
    fn remove_root_if_empty(&self);

    /// Where `key` is, for messages and errors.
    fn locate(&self, key: &str) -> PathBuf;
}

/// A directory on a local filesystem.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Copies `src` to `dst`, returning (bytes, xxh64), and makes `dst`
/// durable; `fault` as in [`CheckpointStore::put_file`].
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

fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

impl LocalStore {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// A key's path below the root, with its directory created.
    fn path_for_write(&self, key: &str) -> Result<PathBuf, CheckpointError> {
        let path = self.root.join(key);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        Ok(path)
    }
}

impl CheckpointStore for LocalStore {
    fn put_file(&self, key: &str, src: &Path, fault: Option<&str>) -> Result<(u64, String), CheckpointError> {
        let dst = self.path_for_write(key)?;
        copy_hashed(src, &dst, fault)
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let path = self.path_for_write(key)?;
        let mut f = File::create(&path).map_err(io(&path))?;
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        f.write_all(head).map_err(io(&path))?;
        failpoint_io("checkpoint.upload").map_err(io(&path))?;
        f.write_all(tail).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))
    }

    fn publish(&self, key: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let path = self.path_for_write(key)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let mut tmp = path.clone().into_os_string();
        tmp.push(".inprogress");
        let tmp = PathBuf::from(tmp);
        failpoint("checkpoint.before_metadata_write");
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        f.write_all(head).map_err(io(&tmp))?;
        failpoint_io("checkpoint.metadata_write").map_err(io(&tmp))?;
        f.write_all(tail).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        // Every file the metadata names, and the directories holding them,
        // are durable before the metadata makes the checkpoint exist.
        for sub in [self.root.join("shared"), dir.join("state")] {
            if sub.exists() {
                sync_dir(&sub)?;
            }
        }
        sync_dir(&dir)?;
        sync_dir(&self.root)?;
        failpoint("checkpoint.before_metadata_rename");
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        sync_dir(&dir)?;
        failpoint("checkpoint.after_metadata_rename");
        Ok(())
    }

    fn create(&self, key: &str, bytes: &[u8]) -> Result<Created, CheckpointError> {
        let path = self.path_for_write(key)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        // Written and synced aside, then linked into place: a link fails
        // if the name exists (atomic, as object_store's local files do),
        // and a reader never sees a partial object.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp = path.clone().into_os_string();
        tmp.push(format!(".{}-{n}.creating", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let linked = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(io(&tmp))?;
            f.write_all(bytes).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
            Ok::<_, CheckpointError>(std::fs::hard_link(&tmp, &path))
        })();
        let _ = std::fs::remove_file(&tmp);
        match linked? {
            Ok(()) => {
                sync_dir(&dir)?;
                Ok(Created::Created)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Created::Exists(self.get(key)?)),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, CheckpointError> {
        let path = self.root.join(key);
        std::fs::read(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::Missing { path: path.clone() },
            _ => CheckpointError::Io {
                path: path.clone(),
                source,
            },
        })
    }

    fn get_to_file(&self, key: &str, dst: &Path) -> Result<(u64, String), CheckpointError> {
        let src = self.root.join(key);
        copy_hashed(&src, dst, None).map_err(|e| match e {
            CheckpointError::Io { path, source } if path == dst => CheckpointError::LocalState { path, source },
            CheckpointError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                CheckpointError::Missing { path: src.clone() }
            }
            other => other,
        })
    }

    fn size(&self, key: &str) -> Result<Option<u64>, CheckpointError> {
        let path = self.root.join(key);
        match std::fs::metadata(&path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>, CheckpointError> {
        let dir = self.root.join(prefix);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(io(&dir)(e)),
        };
        let mut out = vec![];
        for entry in entries {
            let entry = entry.map_err(io(&dir))?;
            let is_prefix = entry.file_type().map_err(io(&entry.path()))?.is_dir();
            let size = if is_prefix {
                0
            } else {
                entry.metadata().map_or(0, |m| m.len())
            };
            out.push(Listed {
                name: entry.file_name().to_string_lossy().to_string(),
                is_prefix,
                size,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), CheckpointError> {
        let path = self.root.join(key);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                // The deletion is durable before anything it protected
                // (a `_metadata` first, then its files) goes.
                if let Some(dir) = path.parent() {
                    sync_dir(dir)?;
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn delete_prefix(&self, prefix: &str) -> Result<u64, CheckpointError> {
        let dir = self.root.join(prefix);
        let freed = dir_size(&dir);
        remove_dir_if_exists(&dir)?;
        Ok(freed)
    }

    fn reserve(&self, prefix: &str) -> Result<(), CheckpointError> {
        let dir = self.root.join(prefix);
        std::fs::create_dir_all(&dir).map_err(io(&dir))
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        // A rename of a directory entry: a file the same as a directory.
        self.rename_prefix(from, to)
    }

    fn rename_prefix(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        let dst = self.path_for_write(to)?;
        std::fs::rename(self.root.join(from), &dst).map_err(io(&dst))?;
        if let Some(dir) = dst.parent() {
            sync_dir(dir)?;
        }
        sync_dir(&self.root)
    }

    fn remove_root_if_empty(&self) {
        // Not empty (someone else's files): kept.
        let _ = std::fs::remove_dir(&self.root);
    }

    fn locate(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_store_round_trips_lists_and_deletes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::new(dir.path().join("root"));
        assert!(store.list("").expect("list").is_empty(), "no root yet: nothing");
        store.put("chk-1/a", b"hello").expect("put");
        store.publish("chk-1/_metadata", b"meta").expect("publish");
        store.reserve("chk-2").expect("reserve");
        assert_eq!(store.get("chk-1/a").expect("get"), b"hello");
        assert!(matches!(store.get("chk-1/b"), Err(CheckpointError::Missing { .. })));
        assert_eq!(store.size("chk-1/a").expect("size"), Some(5));
        assert_eq!(store.size("chk-1/b").expect("size"), None);
        let names: Vec<(String, bool)> = store
            .list("")
            .expect("list")
            .into_iter()
            .map(|l| (l.name, l.is_prefix))
            .collect();
        assert_eq!(names, [("chk-1".to_string(), true), ("chk-2".to_string(), true)]);
        let dst = dir.path().join("copy");
        let (size, sum) = store.get_to_file("chk-1/a", &dst).expect("get to file");
        assert_eq!((size, sum), (5, super::super::metadata::checksum(b"hello")));
        store.rename_prefix("chk-1", "retained-1/chk-1").expect("rename");
        assert_eq!(store.get("retained-1/chk-1/_metadata").expect("get"), b"meta");
        assert_eq!(store.delete_prefix("retained-1").expect("delete"), 9);
        store.delete("chk-1/a").expect("a missing object is fine");
        assert_eq!(store.delete_prefix("chk-2").expect("delete"), 0);
        store.remove_root_if_empty();
        assert!(!dir.path().join("root").exists());
    }

    #[test]
    fn of_writers_racing_to_create_one_key_exactly_one_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = std::sync::Arc::new(LocalStore::new(dir.path().to_path_buf()));
        for round in 0..20 {
            let key = format!("log/{round:020}.json");
            let results: Vec<(usize, Created)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..8)
                    .map(|w| {
                        let (store, key) = (store.clone(), key.clone());
                        s.spawn(move || (w, store.create(&key, format!("writer {w}").as_bytes()).expect("create")))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("thread")).collect()
            });
            let winners: Vec<usize> = results
                .iter()
                .filter(|(_, c)| *c == Created::Created)
                .map(|(w, _)| *w)
                .collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            let winner = format!("writer {}", winners[0]).into_bytes();
            assert!(
                results
                    .iter()
                    .all(|(_, c)| matches!(c, Created::Created) || *c == Created::Exists(winner.clone())),
                "round {round}: a loser read other bytes than the winner's: {results:?}"
            );
            assert_eq!(store.get(&key).expect("get"), winner);
        }
        // No staging file is left beside the objects.
        assert_eq!(store.list("log").expect("list").len(), 20);
    }
}
