//! Dead letters: records a source could not parse or convert, kept as
//! evidence instead of failing the job or vanishing
//! (`'scan.dead-letter.path' = 'dir'`).
//!
//! A split hands its bad records to its reader ([`SourceSplit::take_dead_letters`],
//! right after the poll that met them); the reader's [`DeadLetterWriter`]
//! appends them to a file of its own as JSON lines, one object per record:
//!
//! ```json
//! {"table":"orders","file":"/in/a.csv","line":7,"byte_offset":312,
//!  "reason":"invalid CSV record: ...","raw":"7,x,oops","raw_bytes":8}
//! ```
//!
//! `raw` is the record's text (invalid UTF-8 replaced), cut at 64 KiB;
//! `raw_bytes` is its full length. Records carry no time or attempt id: a
//! record is identified by (table, file, line), so runs can be compared.
//!
//! **Exactly once with checkpointing.** Dead-letter files go through the
//! file sink's two-phase commit ([`super::filesystem::part_file`]): the
//! reader writes a hidden in-progress file, pre-commits it (pending) when
//! it injects a checkpoint barrier, and the checkpoint carries it as the
//! committable of `<source node>/<subtask>/dead-letters`; the source's
//! committer makes it visible when the checkpoint completes. A split's
//! checkpointed position is taken at the same moment and covers exactly
//! the records read before it (every bad record before the position is in
//! that checkpoint's files or an earlier one's; none after it is). A
//! restored job commits the restored checkpoint's files again
//! (idempotent), deletes every other in-progress or pending dead-letter
//! file of the job, and re-reads from the positions: records after the
//! checkpoint are written once more, into new files, and nothing is lost
//! or doubled.
//!
//! **Without checkpointing** records are appended to the visible file
//! directly (flushed after every poll, so a job that fails still leaves
//! them): at-least-once, as the job itself, which starts afresh when run
//! again.
//!
//! Visible files are `dead-letters-<job>-<attempt>-<node>-<subtask>-<n>.jsonl`:
//! the attempt id is unique per attempt, so names never collide across
//! attempts, subtasks or sources of one job.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::filesystem::part_file::{PartCommitter, PartFiles, io_err};
use super::{Committer, SinkContext};
use crate::error::{ExecError, Result};

/// The table option naming the dead-letter directory.
pub const PATH_OPTION: &str = "scan.dead-letter.path";

/// The longest raw text kept per record.
pub const MAX_RAW_BYTES: usize = 64 * 1024;

/// A record that failed to parse or convert, as its split saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// The file (the split).
    pub file: String,
    /// 1-based line number.
    pub line: u64,
    /// Byte offset of the line's first byte in the file.
    pub byte_offset: u64,
    pub raw: Vec<u8>,
    pub reason: String,
}

/// One dead letter as written.
#[derive(Debug, serde::Serialize)]
struct Letter<'a> {
    table: &'a str,
    file: &'a str,
    line: u64,
    byte_offset: u64,
    reason: &'a str,
    raw: String,
    raw_bytes: usize,
}

/// The largest prefix of `s` of at most `max` bytes ending on a character.
fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The file name prefix of a job's hidden dead-letter files.
fn hidden_prefix(ctx: &SinkContext) -> String {
    format!(".dead-letters-{}-", ctx.job_tag)
}

/// The committer of the dead letters in `dir` (registered under the
/// source's node, like a sink's).
pub fn committer(dir: &Path, ctx: &SinkContext) -> Arc<dyn Committer> {
    // `<attempt>-<node>-<subtask>-<n>` follow the prefix.
    Arc::new(PartCommitter::new(
        dir.to_path_buf(),
        hidden_prefix(ctx),
        4,
        "dead_letter.file_committed",
    ))
}

/// Writes the dead letters of one source subtask.
pub struct DeadLetterWriter {
    table: String,
    files: PartFiles,
    /// Checkpointing is on: files are committed by checkpoints.
    exactly_once: bool,
    /// Key of this writer's committables in a checkpoint.
    key: String,
    out: Option<BufWriter<File>>,
}

impl DeadLetterWriter {
    pub fn new(dir: &Path, table: &str, ctx: &SinkContext, uid: &str, subtask: usize) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        Ok(Self {
            table: table.to_string(),
            files: PartFiles::new(
                dir.to_path_buf(),
                format!("dead-letters-{}-{}-{uid}-{subtask}", ctx.job_tag, ctx.attempt),
                "jsonl",
                "dead_letter.pre_committed",
            ),
            exactly_once: ctx.exactly_once,
            key: format!("{uid}/{subtask}/dead-letters"),
            out: None,
        })
    }

    /// Key of this writer's committables in a checkpoint; its node is the
    /// source's, so the source's committer gets them.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The file being written now.
    fn current_path(&self) -> PathBuf {
        if self.exactly_once {
            self.files.in_progress_path()
        } else {
            self.files.final_path()
        }
    }

    /// Appends `records`; without checkpointing they are flushed to the
    /// visible file at once.
    pub fn write(&mut self, records: &[BadRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let path = self.current_path();
        if self.out.is_none() {
            let f = File::create(&path).map_err(|e| io_err(&path, e))?;
            self.out = Some(BufWriter::with_capacity(1 << 16, f));
        }
        let Some(out) = self.out.as_mut() else {
            return Err(ExecError::internal("dead-letter file not open"));
        };
        for r in records {
            let raw = String::from_utf8_lossy(&r.raw);
            let letter = Letter {
                table: &self.table,
                file: &r.file,
                line: r.line,
                byte_offset: r.byte_offset,
                reason: &r.reason,
                raw: truncate_utf8(&raw, MAX_RAW_BYTES).to_string(),
                raw_bytes: r.raw.len(),
            };
            let mut line = serde_json::to_vec(&letter)
                .map_err(|e| ExecError::internal(format!("dead letter not serialisable: {e}")))?;
            line.push(b'\n');
            out.write_all(&line).map_err(|e| io_err(&path, e))?;
        }
        if !self.exactly_once {
            out.flush().map_err(|e| io_err(&path, e))?;
        }
        Ok(())
    }

    /// Closes the current file and syncs it; false if none was open.
    fn close(&mut self) -> Result<bool> {
        let path = self.current_path();
        let Some(mut w) = self.out.take() else {
            return Ok(false);
        };
        w.flush().map_err(|e| io_err(&path, e))?;
        w.get_ref().sync_all().map_err(|e| io_err(&path, e))?;
        Ok(true)
    }

    /// Phase one at a checkpoint barrier (or the final checkpoint): the
    /// current file becomes pending; its committable is returned.
    pub fn pre_commit(&mut self) -> Result<Vec<serde_json::Value>> {
        if !self.exactly_once {
            return Err(ExecError::internal("dead letters pre-committed without checkpointing"));
        }
        if !self.close()? {
            return Ok(vec![]);
        }
        Ok(vec![self.files.pre_commit()?])
    }

    /// End of input without checkpointing: the visible file is complete.
    pub fn finish(&mut self) -> Result<()> {
        if self.exactly_once {
            // Committed by the final checkpoint (`pre_commit`).
            return Ok(());
        }
        if self.close()? {
            self.files.advance();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(exactly_once: bool) -> SinkContext {
        SinkContext {
            job_tag: "job-a".into(),
            attempt: "1f0".into(),
            exactly_once,
            checkpoint_interval: None,
            checkpoint_timeout: None,
            clock: Default::default(),
            spool_dir: std::env::temp_dir(),
            sink_uid: String::new(),
        }
    }

    fn record(line: u64, raw: &[u8]) -> BadRecord {
        BadRecord {
            file: "/in/x.csv".into(),
            line,
            byte_offset: line * 10,
            raw: raw.to_vec(),
            reason: "bad".into(),
        }
    }

    fn visible(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn letters_become_visible_only_when_their_checkpoint_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = DeadLetterWriter::new(dir.path(), "t", &ctx(true), "source_3", 1).expect("writer");
        w.write(&[record(2, b"a,b"), record(5, b"\xff\xfe")]).expect("write");
        let committables = w.pre_commit().expect("pre-commit");
        assert_eq!(committables.len(), 1);
        assert_eq!(
            visible(dir.path()),
            vec![".dead-letters-job-a-1f0-source_3-1-0.jsonl.pending"]
        );
        // Nothing new since: no file, no committable.
        assert!(w.pre_commit().expect("empty pre-commit").is_empty());
        w.write(&[record(9, b"x")]).expect("write");
        let c = committer(dir.path(), &ctx(true));
        c.commit(1, &committables).expect("commit");
        // Idempotent: a restored job commits again.
        c.commit(1, &committables).expect("re-commit");
        // The in-progress file of the failed attempt goes.
        c.recover().expect("recover");
        assert_eq!(visible(dir.path()), vec!["dead-letters-job-a-1f0-source_3-1-0.jsonl"]);
        let text = std::fs::read_to_string(dir.path().join("dead-letters-job-a-1f0-source_3-1-0.jsonl")).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["table"], "t");
        assert_eq!(lines[0]["line"], 2);
        assert_eq!(lines[0]["byte_offset"], 20);
        assert_eq!(lines[0]["raw"], "a,b");
        assert_eq!(lines[1]["raw"], "\u{fffd}\u{fffd}");
        assert_eq!(lines[1]["raw_bytes"], 2);
    }

    #[test]
    fn without_checkpointing_letters_are_visible_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = DeadLetterWriter::new(dir.path(), "t", &ctx(false), "source_0", 0).expect("writer");
        w.write(&[record(1, b"x")]).expect("write");
        let path = dir.path().join("dead-letters-job-a-1f0-source_0-0-0.jsonl");
        assert_eq!(std::fs::read_to_string(&path).expect("visible").lines().count(), 1);
        w.finish().expect("finish");
        assert_eq!(visible(dir.path()), vec!["dead-letters-job-a-1f0-source_0-0-0.jsonl"]);
    }

    #[test]
    fn long_raw_text_is_cut_on_a_character_boundary() {
        let s = "é".repeat(MAX_RAW_BYTES);
        let cut = truncate_utf8(&s, MAX_RAW_BYTES + 1);
        assert_eq!(cut.len(), MAX_RAW_BYTES);
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
