//! Files written exactly once by two-phase commit (Flink's FileSink
//! protocol), shared by the file sink and by dead letters.
//!
//! A writer owns a sequence of part files `<stem>-<n>.<ext>`. The current
//! one is written hidden as `.<stem>-<n>.<ext>.inprogress`. At a checkpoint
//! barrier the writer closes and syncs it, and [`PartFiles::pre_commit`]
//! renames it `.<stem>-<n>.<ext>.pending` (durable, still invisible:
//! readers skip names starting with '.') and returns its committable.
//! When the checkpoint is complete, [`PartCommitter::commit`] renames it to
//! `<stem>-<n>.<ext>`, atomically and idempotently. After a failure,
//! [`PartCommitter::recover`] deletes the in-progress and pending files of
//! the job that no completed checkpoint holds (the restored checkpoint's
//! committables are committed before it runs).
//!
//! Stems carry the job, a per-attempt id and the subtask, so visible names
//! never collide across attempts or subtasks.
//!
//! On an object store ([`super::object_files`]) the part is written to a
//! local spool file the same way; pending means an uncompleted multipart
//! upload, committing means completing it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::object_files::{ObjectFiles, UPLOAD_SUFFIX};

use crate::connectors::Committer;
use crate::error::{ConnectorError, Result};
use crate::failpoint::failpoint;

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> ConnectorError {
    ConnectorError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Makes renames in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err(dir, e))?;
    Ok(())
}

/// The names of one writer's part files and their moves.
pub(crate) struct PartFiles {
    dir: PathBuf,
    /// Part `n` is `<stem>-<n>.<ext>`.
    stem: String,
    ext: &'static str,
    next_part: u64,
    /// Failpoint passed once a part is pending (crash tests).
    pre_committed_failpoint: &'static str,
    /// On an object store: where parts go, and the directory (a partition,
    /// or "") relative to the table's path; `dir` is then the local spool.
    remote: Option<(Arc<ObjectFiles>, String)>,
}

impl PartFiles {
    pub fn new(dir: PathBuf, stem: String, ext: &'static str, pre_committed_failpoint: &'static str) -> Self {
        Self {
            dir,
            stem,
            ext,
            next_part: 0,
            pre_committed_failpoint,
            remote: None,
        }
    }

    /// Parts spooled in `dir` go to `rel_dir` of the object store `parts`.
    pub fn on_object_store(mut self, parts: Arc<ObjectFiles>, rel_dir: String) -> Self {
        self.remote = Some((parts, rel_dir));
        self
    }

    /// The current part's name relative to the table's path (object store).
    fn remote_name(rel_dir: &str, name: String) -> String {
        if rel_dir.is_empty() {
            name
        } else {
            format!("{rel_dir}/{name}")
        }
    }

    /// The visible name of the current part.
    pub fn final_name(&self) -> String {
        format!("{}-{}.{}", self.stem, self.next_part, self.ext)
    }

    pub fn final_path(&self) -> PathBuf {
        self.dir.join(self.final_name())
    }

    pub fn in_progress_path(&self) -> PathBuf {
        self.dir.join(format!(".{}.inprogress", self.final_name()))
    }

    /// Phase one: the current part, closed and synced by the caller,
    /// becomes pending; its committable is returned and the next rows go
    /// to a new part.
    pub fn pre_commit(&mut self) -> Result<serde_json::Value> {
        let target = self.final_name();
        if let Some((parts, rel_dir)) = &self.remote {
            let local = self.in_progress_path();
            let c = parts.stage(&local, &Self::remote_name(rel_dir, target))?;
            std::fs::remove_file(&local).map_err(|e| io_err(&local, e))?;
            failpoint(self.pre_committed_failpoint);
            self.next_part += 1;
            return Ok(c);
        }
        let pending = format!(".{target}.pending");
        std::fs::rename(self.in_progress_path(), self.dir.join(&pending))
            .map_err(|e| io_err(&self.in_progress_path(), e))?;
        sync_dir(&self.dir)?;
        failpoint(self.pre_committed_failpoint);
        self.next_part += 1;
        Ok(serde_json::json!({ "pending": pending, "target": target }))
    }

    /// Without checkpointing: the current part (closed and synced) is
    /// made visible at once.
    pub fn commit_now(&mut self) -> Result<()> {
        let path = self.in_progress_path();
        if let Some((parts, rel_dir)) = &self.remote {
            parts.put(&path, &Self::remote_name(rel_dir, self.final_name()))?;
            std::fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
            self.next_part += 1;
            return Ok(());
        }
        std::fs::rename(&path, self.final_path()).map_err(|e| io_err(&path, e))?;
        self.next_part += 1;
        Ok(())
    }

    /// Moves on to the next part without renaming anything (a part that
    /// was written under its final name).
    pub fn advance(&mut self) {
        self.next_part += 1;
    }
}

/// Makes pending part files visible; deletes what no checkpoint holds.
pub(crate) struct PartCommitter {
    dir: PathBuf,
    /// `.<kind>-<job>-`: hidden files of this job start with it.
    prefix: String,
    /// Dash-separated fields between the prefix and the extension
    /// (`<attempt>-<subtask>-<n>`: 3). Checked so that the files of a job
    /// whose name extends this one's (`a` and `a-b`) are never touched.
    fields: usize,
    /// Failpoint passed after each rename (crash tests).
    committed_failpoint: &'static str,
    /// The table is on an object store (`dir` is its URL).
    remote: Option<Arc<ObjectFiles>>,
}

impl PartCommitter {
    pub fn new(dir: PathBuf, prefix: String, fields: usize, committed_failpoint: &'static str) -> Self {
        Self {
            dir,
            prefix,
            fields,
            committed_failpoint,
            remote: None,
        }
    }

    /// Commits and recovers the parts of a table on an object store.
    pub fn on_object_store(mut self, parts: Option<Arc<ObjectFiles>>) -> Self {
        self.remote = parts;
        self
    }

    /// Whether `name` is an in-progress or pending file of this job.
    fn owns(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix(&self.prefix) else {
            return false;
        };
        let unfinished = rest.ends_with(".inprogress") || rest.ends_with(".pending") || rest.ends_with(UPLOAD_SUFFIX);
        let stem = rest.split('.').next().unwrap_or_default();
        unfinished && stem.split('-').count() == self.fields
    }
}

impl Committer for PartCommitter {
    fn commit(&self, _checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()> {
        if let Some(parts) = &self.remote {
            for c in committables {
                if parts.complete(c)? {
                    failpoint(self.committed_failpoint);
                }
            }
            return Ok(());
        }
        // The directories renames happened in (partitions of a partitioned
        // table: the targets' parents).
        let mut dirs: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
        dirs.insert(self.dir.clone());
        for c in committables {
            let (Some(pending), Some(target)) = (c["pending"].as_str(), c["target"].as_str()) else {
                return Err(crate::error::ExecError::internal(format!(
                    "not a file committable: {c}"
                )));
            };
            let (pending, target) = (self.dir.join(pending), self.dir.join(target));
            if let Some(parent) = target.parent() {
                dirs.insert(parent.to_path_buf());
            }
            match std::fs::rename(&pending, &target) {
                Ok(()) => failpoint(self.committed_failpoint),
                // Committed before (a re-commit after recovery).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && target.exists() => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Committed before and then moved or deleted downstream
                    // (as Flink's FileSink, assume committed): failing here
                    // would make the job unable to ever restore.
                    tracing::warn!(
                        "{}: neither pending nor committed file exists; assuming it was committed and moved",
                        target.display()
                    );
                }
                Err(e) => return Err(io_err(&pending, e).into()),
            }
        }
        for d in dirs {
            sync_dir(&d)?;
        }
        Ok(())
    }

    fn abandon(&self, attempt: &str) -> Result<()> {
        self.remove_unfinished(Some(attempt))
    }

    fn recover(&self) -> Result<()> {
        self.remove_unfinished(None)
    }
}

impl PartCommitter {
    /// Deletes this job's in-progress and pending files (of `attempt`
    /// only, if given).
    fn remove_unfinished(&self, attempt: Option<&str>) -> Result<()> {
        let of_attempt = |name: &str| {
            attempt.is_none_or(|a| {
                name.strip_prefix(&self.prefix)
                    .and_then(|rest| rest.strip_prefix(a))
                    .is_some_and(|rest| rest.starts_with('-'))
            })
        };
        if let Some(parts) = &self.remote {
            // Below every partition at once: an object store lists keys.
            return parts.abort_unfinished(|name| self.owns(name) && of_attempt(name));
        }
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err(&self.dir, e).into()),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_err(&self.dir, e))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if self.owns(&name) && of_attempt(&name) {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => {}
                    // Renamed or removed meanwhile (by a commit).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&entry.path(), e).into()),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_leaves_the_files_of_a_job_whose_name_extends_this_one_alone() {
        let c = PartCommitter::new(PathBuf::from("/x"), ".part-a-".into(), 3, "t");
        assert!(c.owns(".part-a-1f2e0-0-3.json.inprogress"));
        assert!(c.owns(".part-a-1f2e0-1-0.csv.pending"));
        // Job `a-b`'s files start with `.part-a-` too.
        assert!(!c.owns(".part-a-b-1f2e0-0-3.json.inprogress"));
        // Finished files are never recovered away.
        assert!(!c.owns("part-a-1f2e0-0-3.json"));
    }

    #[test]
    fn an_abandoned_attempt_loses_only_its_own_unfinished_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = [
            ".part-a-1f2e0-0-3.json.inprogress",
            ".part-a-1f2e0-1-0.json.pending",
            ".part-a-1f2e01-0-3.json.inprogress",
            ".part-a-77aa0-0-3.json.pending",
            "part-a-1f2e0-0-2.json",
        ];
        for n in names {
            std::fs::write(dir.path().join(n), b"x").expect("write");
        }
        let c = PartCommitter::new(dir.path().to_path_buf(), ".part-a-".into(), 3, "t");
        c.abandon("1f2e0").expect("abandon");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".part-a-1f2e01-0-3.json.inprogress",
                ".part-a-77aa0-0-3.json.pending",
                "part-a-1f2e0-0-2.json"
            ]
        );
    }
}
