//! Full disks and failing disks under a real `weir run` process: a keyed
//! window job at parallelism 2 (RocksDB state, exactly-once file sink)
//! whose checkpoint directory, state directory or sink directory is a
//! small tmpfs the test fills while the job runs, or whose checkpoint
//! uploads get an injected EIO (failpoint). Each time the failure must be
//! reported with the path and the OS error, handled as a failed
//! checkpoint or a failed attempt (tolerance, restart strategy), never a
//! panic or a hang; and once the disk is back the job's output must equal
//! a run that was never disturbed: 0 rows lost, 0 duplicated.
//!
//! Mounting needs root (CAP_SYS_ADMIN); without it the tmpfs tests say
//! they were skipped and pass.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_engine::checkpoint::CheckpointStorage;

const ENOSPC: &str = "No space left on device";

/// A tmpfs mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the filesystem to the last byte; returns the filler.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).expect("create filler");
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a file a killed process left open must not keep the mount.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

macro_rules! tmpfs_or_skip {
    ($size:expr) => {
        match Tmpfs::mount($size) {
            Ok(fs) => fs,
            Err(why) => {
                eprintln!("skipped: cannot mount tmpfs: {why}");
                return;
            }
        }
    };
}

/// The job: about 20 s of throttled input, so the test can change the
/// disk under it; `extra` holds SET statements of the test.
fn job_sql(out: &Path, extra: &str) -> String {
    format!(
        "SET 'parallelism.default' = '2';
SET 'pipeline.name' = 'full';
SET 'execution.checkpointing.interval' = '100 ms';
{extra}
CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '60000',
        'nexmark.events-per-second' = '3000', 'nexmark.first-event-rate' = '2000');
CREATE TABLE out (auction BIGINT, window_start TIMESTAMP(3), cnt BIGINT, total BIGINT)
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
INSERT INTO out SELECT auction, window_start, COUNT(*), SUM(price)
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND))
GROUP BY auction, window_start, window_end;
",
        out.display()
    )
}

/// Where one run of the job keeps its things.
struct Workspace {
    _dir: tempfile::TempDir,
    data: PathBuf,
    out: PathBuf,
    sql: PathBuf,
}

impl Workspace {
    /// `data`/`out`: directories to use instead of ones in the workspace.
    fn new(extra: &str, data: Option<PathBuf>, out: Option<PathBuf>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = data.unwrap_or_else(|| dir.path().join("data"));
        let out = out.unwrap_or_else(|| dir.path().join("out"));
        let sql = dir.path().join("job.sql");
        std::fs::write(&sql, job_sql(&out, extra)).expect("write sql");
        Self {
            _dir: dir,
            data,
            out,
            sql,
        }
    }

    fn start(&self, failpoints: Option<&str>) -> Running {
        let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
        c.arg("--data-dir")
            .arg(&self.data)
            .arg("run")
            .arg(&self.sql)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match failpoints {
            Some(f) => c.env("WEIR_FAILPOINTS", f),
            None => c.env_remove("WEIR_FAILPOINTS"),
        };
        let mut child = c.spawn().expect("spawn weir");
        let log = Arc::new(Mutex::new(String::new()));
        // Both streams go to one log, read as it grows.
        let readers = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        .map(|stream| {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Ok(mut l) = log.lock() {
                        l.push_str(&line);
                        l.push('\n');
                    }
                }
            })
        })
        .collect();
        Running { child, log, readers }
    }

    /// Runs the job to its end; panics unless it succeeds.
    fn run_to_end(&self) -> String {
        let mut r = self.start(None);
        let status = r.wait_exit(Duration::from_secs(180));
        let log = r.finish();
        assert!(status.success(), "weir run failed:\n{log}");
        log
    }
}

struct Running {
    child: Child,
    log: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Polls the log until `done` holds for it (deadline 120 s), failing
    /// if the process exits first. Returns the log.
    fn wait_for(&mut self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let log = self.log();
            if done(&log) {
                return log;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // What it wrote last may still be in the pipe.
                let log = self.finish();
                if done(&log) {
                    return log;
                }
                panic!("weir exited ({status}) before {what}:\n{log}");
            }
            assert!(Instant::now() < deadline, "no {what} within 120 s:\n{log}");
            // Polling a log for an event, with a deadline.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "weir did not exit within {within:?} (a hang):\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no destructors, no flushing, no goodbye.
    fn kill(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!(
                "the job ended ({status}) before the test could kill it: too fast for this machine?\n{}",
                self.log()
            );
        }
        self.child.kill().expect("kill");
        self.child.wait().expect("reap");
    }

    /// Waits for the output readers (the process has exited) and returns the log.
    fn finish(&mut self) -> String {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        self.log()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rows of every finished (visible) part file, with their multiplicity.
fn finished_rows(out: &Path) -> BTreeMap<String, usize> {
    let mut rows = BTreeMap::new();
    for e in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name == "filler" {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).expect("read part file");
        for line in text.lines().filter(|l| !l.is_empty()) {
            *rows.entry(line.to_string()).or_default() += 1;
        }
    }
    rows
}

/// The rows of an undisturbed run, computed beside the disturbed one.
fn golden() -> std::thread::JoinHandle<BTreeMap<String, usize>> {
    std::thread::spawn(|| {
        let ws = Workspace::new("", None, None);
        let log = ws.run_to_end();
        let rows = finished_rows(&ws.out);
        assert!(rows.len() > 500, "the job is too small to test anything:\n{log}");
        rows
    })
}

fn assert_same_rows(golden: std::thread::JoinHandle<BTreeMap<String, usize>>, out: &Path, what: &str) {
    let expected = golden.join().expect("the undisturbed run");
    let rows = finished_rows(out);
    let lost: usize = expected
        .iter()
        .map(|(r, n)| n.saturating_sub(rows.get(r).copied().unwrap_or(0)))
        .sum();
    let duplicated: usize = rows
        .iter()
        .map(|(r, n)| n.saturating_sub(expected.get(r).copied().unwrap_or(0)))
        .sum();
    assert!(
        lost == 0 && duplicated == 0,
        "{what}: {lost} rows lost, {duplicated} duplicated or unexpected (of {})",
        expected.values().sum::<usize>()
    );
    let hidden: Vec<_> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        hidden.is_empty(),
        "{what}: in-progress or pending files left: {hidden:?}"
    );
}

/// Ids of checkpoints the log says completed (periodic ones).
fn completed(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| !l.contains("final checkpoint"))
        .filter_map(|l| {
            let (id, rest) = l.split_once("checkpoint ")?.1.split_once(' ')?;
            rest.starts_with("completed").then(|| id.parse().ok()).flatten()
        })
        .collect()
}

/// (id, reason) of checkpoints the log says were aborted.
fn aborted(log: &str) -> Vec<(u64, String)> {
    log.lines()
        .filter_map(|l| {
            let (id, reason) = l.split_once("checkpoint ")?.1.split_once(" aborted: ")?;
            Some((id.parse().ok()?, reason.to_string()))
        })
        .collect()
}

fn first_line_with<'a>(log: &'a str, needle: &str) -> &'a str {
    log.lines().find(|l| l.contains(needle)).unwrap_or_default()
}

/// What a failed checkpoint must leave: nothing but its `_claim` in
/// `chk-id/` (which keeps the id used) and none of its shared files; and every
/// complete checkpoint names only whole files.
fn assert_nothing_left_of(root: &Path, id: u64) {
    let chk = root.join(format!("chk-{id}"));
    let left: Vec<_> = std::fs::read_dir(&chk)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "_claim")
        .collect();
    assert!(
        left.is_empty(),
        "failed checkpoint {id} left {left:?} in {}",
        chk.display()
    );
    let marker = format!("-c{id}-");
    let shared: Vec<_> = std::fs::read_dir(root.join("shared"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(&marker))
        .collect();
    assert!(shared.is_empty(), "failed checkpoint {id} left shared files {shared:?}");
    let storage = CheckpointStorage::new(root.to_path_buf());
    for complete in storage.complete_ids().expect("checkpoint ids") {
        // `load` checks every file the metadata names exists with its size.
        storage
            .load(complete)
            .unwrap_or_else(|e| panic!("complete checkpoint {complete} is not whole: {e}"));
    }
}

#[test]
fn enospc_in_the_checkpoint_dir_fails_checkpoints_until_space_returns_and_loses_nothing() {
    let fs = tmpfs_or_skip!("64m");
    let golden = golden();
    let ckpt = fs.path().join("checkpoints");
    let ws = Workspace::new(
        &format!(
            "SET 'execution.checkpointing.dir' = '{}';
             SET 'execution.checkpointing.tolerable-failed-checkpoints' = '1000';",
            ckpt.display()
        ),
        None,
        None,
    );
    let root = ckpt.join("full");
    let mut job = ws.start(None);
    job.wait_for("a completed checkpoint", |l| !completed(l).is_empty());

    let filler = fs.fill();
    let log = job.wait_for("two checkpoints failed for lack of space", |l| {
        aborted(l).iter().filter(|(_, r)| r.contains(ENOSPC)).count() >= 2
    });
    assert!(
        !log.contains("restarting"),
        "failures within tolerance restart nothing:\n{log}"
    );
    let failed: Vec<u64> = aborted(&log)
        .into_iter()
        .filter(|(_, r)| r.contains(ENOSPC))
        .map(|(id, reason)| {
            assert!(
                reason.contains(&root.display().to_string()),
                "the reason names the path: {reason}"
            );
            id
        })
        .collect();
    eprintln!("what the user sees: {}", first_line_with(&log, ENOSPC));
    // While the disk is full nothing completes, so nothing was collected:
    // what is not there was removed by the failed attempt itself.
    for id in &failed {
        assert_nothing_left_of(&root, *id);
    }

    std::fs::remove_file(&filler).expect("remove filler");
    let last_failed = *failed.iter().max().expect("failures");
    job.wait_for("a checkpoint completing once space returned", |l| {
        completed(l).iter().any(|id| *id > last_failed)
    });
    job.kill();
    let first_log = job.finish();
    assert!(!first_log.contains("panicked"), "{first_log}");

    // Started again, the job resumes from a checkpoint taken after the
    // disk was back, and finishes.
    let log = ws.run_to_end();
    let resumed = log
        .lines()
        .find_map(|l| {
            l.split("resuming from checkpoint ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("the second run resumes:\n{log}"));
    assert!(
        resumed > last_failed,
        "resumed from {resumed}, failures up to {last_failed}"
    );
    assert_same_rows(golden, &ws.out, "checkpoint dir full, then a restore");
}

#[test]
fn eio_in_checkpoint_uploads_is_tolerated_then_restarts_the_job_beyond_tolerance() {
    let golden = golden();
    let ws = Workspace::new(
        "SET 'execution.checkpointing.tolerable-failed-checkpoints' = '2';
         SET 'restart-strategy.fixed-delay.delay' = '0 ms';",
        None,
        None,
    );
    // The second metadata write fails (one tolerated failure); later (a
    // checkpoint uploads a handful of files) the 41st to 43rd uploads fail: three consecutive failed
    // checkpoints (a failed one stops at its first failed upload), one
    // more than tolerated.
    let mut job = ws.start(Some("checkpoint.metadata_write:2:eio,checkpoint.upload:41-43:eio"));
    let status = job.wait_exit(Duration::from_secs(180));
    let log = job.finish();
    assert!(status.success(), "the job recovers and finishes:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    let root = ws.data.join("checkpoints").join("full");
    let failed: Vec<_> = aborted(&log)
        .into_iter()
        .filter(|(_, r)| r.contains("could not be written"))
        .collect();
    assert_eq!(failed.len(), 4, "one metadata and three upload failures:\n{log}");
    for (id, reason) in &failed {
        assert!(
            reason.contains("Input/output error") && reason.contains(&root.display().to_string()),
            "checkpoint {id}: the reason names the path and the OS error: {reason}"
        );
    }
    eprintln!("what the user sees: {}", first_line_with(&log, "Input/output error"));
    eprintln!("what the user sees: {}", first_line_with(&log, "restarting (attempt"));
    assert!(
        failed[0].1.contains("_metadata.inprogress"),
        "the first is the metadata write: {}",
        failed[0].1
    );
    assert!(
        log.contains("3 consecutive failures exceed 'execution.checkpointing.tolerable-failed-checkpoints' = 2"),
        "{log}"
    );
    assert!(log.contains("restarting (attempt 1 of 3)"), "{log}");
    assert_eq!(log.matches("restarting (attempt").count(), 1, "{log}");
    assert!(log.contains("restoring from checkpoint"), "{log}");
    assert_same_rows(golden, &ws.out, "EIO in checkpoint uploads");
}

#[test]
fn rocksdb_on_a_full_state_dir_fails_the_job_with_the_cause_and_a_restart_recovers() {
    let fs = tmpfs_or_skip!("64m");
    let golden = golden();
    let data = fs.path().join("data");
    let checkpoints = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::new(
        &format!(
            "SET 'execution.checkpointing.dir' = '{}';
             SET 'restart-strategy.fixed-delay.delay' = '100 ms';",
            checkpoints.path().display()
        ),
        Some(data.clone()),
        None,
    );
    let mut job = ws.start(None);
    job.wait_for("a completed checkpoint", |l| !completed(l).is_empty());
    let filler = fs.fill();
    let status = job.wait_exit(Duration::from_secs(120));
    let log = job.finish();
    assert!(!status.success(), "the job fails while its state disk is full:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    eprintln!("what the user sees: {}", first_line_with(&log, "restarting (attempt"));
    eprintln!("what the user sees: {}", log.lines().last().unwrap_or_default());
    let state_dir = data.join("jobs").join("full").join("state");
    assert!(
        log.lines().any(|l| l.contains("state backend: ")
            && l.contains(&state_dir.display().to_string())
            && l.contains(ENOSPC)),
        "the cause names the backend, the directory and the OS error:\n{log}"
    );
    assert!(log.contains("restarting (attempt 1 of 3)"), "{log}");

    // Space back: the next run resumes from the last checkpoint.
    std::fs::remove_file(&filler).expect("remove filler");
    let log = ws.run_to_end();
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert_same_rows(golden, &ws.out, "state dir full, then a restore");
}

#[test]
fn the_file_sink_on_a_full_disk_fails_attempts_and_after_space_returns_loses_nothing() {
    let fs = tmpfs_or_skip!("64m");
    let golden = golden();
    let out = fs.path().join("out");
    let ws = Workspace::new(
        "SET 'restart-strategy.fixed-delay.attempts' = '1000';
         SET 'restart-strategy.fixed-delay.delay' = '50 ms';",
        None,
        Some(out.clone()),
    );
    let mut job = ws.start(None);
    job.wait_for("a completed checkpoint", |l| !completed(l).is_empty());
    let filler = fs.fill();
    let log = job.wait_for("an attempt failing for lack of space", |l| {
        l.lines()
            .any(|l| l.contains("restarting (attempt") && l.contains(ENOSPC))
    });
    assert!(
        log.lines()
            .any(|l| l.contains("restarting (attempt") && l.contains(&out.display().to_string())),
        "the cause names the part file:\n{log}"
    );
    eprintln!("what the user sees: {}", first_line_with(&log, "restarting (attempt"));
    std::fs::remove_file(&filler).expect("remove filler");
    let status = job.wait_exit(Duration::from_secs(180));
    let log = job.finish();
    assert!(status.success(), "the job finishes once space returned:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert_same_rows(golden, &ws.out, "sink dir full, then restarts");
}
