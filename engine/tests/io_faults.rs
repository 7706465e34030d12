//! Checkpoints on a really full disk: the checkpoint directory is a small
//! tmpfs that the test fills. A checkpoint that hits ENOSPC fails with the
//! path and the OS error in its reason, leaves no `_metadata` naming a
//! missing or partial file and none of its own files behind, is tolerated
//! up to `tolerable-failed-checkpoints`, and the next checkpoint after
//! space returns completes and restores. Beyond the tolerance the
//! coordinator fails the job; a restore into a full disk fails with the
//! cause instead of falling back to an older checkpoint.
//!
//! The test plays the task, as `checkpoint.rs` does: it answers each
//! barrier with a real RocksDB snapshot; the next barrier is announced
//! only once the previous checkpoint ended, which is what it waits for.
//!
//! Mounting needs root (CAP_SYS_ADMIN); without it the test says it was
//! skipped and passes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use weir_engine::checkpoint::coordinator::{CheckpointLog, CoordinatorEnd};
use weir_engine::checkpoint::{
    CheckpointConfig, CheckpointCoordinator, CheckpointMode, CheckpointStatus, CheckpointStorage, TaskReport,
    TaskSnapshot, restore_latest,
};
use weir_engine::message::Barrier;
use weir_engine::state::{RocksDbBackend, RocksDbTuning, StateBackend, WriteBatch};

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

    /// Fills the filesystem up to `leave` free bytes (a later write gets
    /// part of its data in, then ENOSPC). Returns the filler.
    fn fill(&self, leave: u64) -> PathBuf {
        let path = self.path().join("filler");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("create filler");
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        let len = f.metadata().expect("filler size").len();
        f.set_len(len.saturating_sub(leave)).expect("shrink filler");
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a file still open elsewhere must not keep the mount.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

const KEY: &str = "window-1/0";

struct Harness {
    triggers: watch::Receiver<Option<Barrier>>,
    reports: mpsc::UnboundedSender<TaskReport>,
    log: Arc<CheckpointLog>,
    done: tokio::task::JoinHandle<weir_engine::error::Result<CoordinatorEnd>>,
    /// A barrier seen while waiting for an outcome, not yet answered.
    next: Option<Barrier>,
}

fn start(root: &Path, tolerable: u32) -> Harness {
    let (trigger_tx, triggers) = watch::channel(None);
    let (reports, report_rx) = mpsc::unbounded_channel();
    let log = Arc::new(CheckpointLog::default());
    let coordinator = CheckpointCoordinator {
        config: CheckpointConfig {
            store: None,
            s3: Default::default(),
            interval: Duration::from_millis(1),
            timeout: Duration::from_secs(60),
            min_pause: Duration::ZERO,
            tolerable_failed: tolerable,
            num_retained: 2,
            root: root.to_path_buf(),
            mode: CheckpointMode::ExactlyOnce,
            incremental: true,
            unaligned: false,
            aligned_timeout: Duration::ZERO,
        },
        storage: CheckpointStorage::new(root.to_path_buf()),
        fence: Arc::new(
            weir_engine::checkpoint::Fence::claim(&CheckpointStorage::new(root.to_path_buf())).expect("claim"),
        ),
        job: "full".into(),
        fingerprint: "plan".into(),
        tasks: 1,
        source_tasks: vec![0],
        triggers: trigger_tx,
        reports: report_rx,
        committers: Default::default(),
        log: log.clone(),
        restored: None,
        cluster: None,
        max_parallelism: 128,
        operator_info: Default::default(),
        savepoints: Arc::new(tokio::sync::Mutex::new(mpsc::unbounded_channel().1)),
        claimed: None,
        stop: None,
        protected: None,
        first_id: 1,
    };
    Harness {
        triggers,
        reports,
        log,
        done: tokio::spawn(coordinator.run()),
        next: None,
    }
}

impl Harness {
    /// Waits for the next barrier and acknowledges it with `db`'s snapshot.
    async fn checkpoint(&mut self, db: &mut RocksDbBackend) -> u64 {
        let b = match self.next.take() {
            Some(b) => b,
            None => self.next_barrier().await,
        };
        let snapshot = db.snapshot(b.checkpoint_id, &["s"], 0..128).expect("snapshot");
        self.reports
            .send(TaskReport::Ack {
                checkpoint_id: b.checkpoint_id,
                task: 0,
                snapshot: TaskSnapshot {
                    sources: vec![],
                    operators: vec![(KEY.into(), snapshot)],
                },
                alignment: Duration::ZERO,
                sync: Duration::ZERO,
            })
            .expect("report");
        b.checkpoint_id
    }

    async fn next_barrier(&mut self) -> Barrier {
        tokio::time::timeout(Duration::from_secs(30), self.triggers.changed())
            .await
            .expect("a barrier before the deadline")
            .unwrap_or_else(|_| panic!("coordinator ended: {:?}", self.log.entries()));
        self.triggers.borrow_and_update().expect("a barrier")
    }

    /// Waits until checkpoint `id` ended (the next barrier is announced
    /// only then) and returns how.
    async fn outcome(&mut self, id: u64) -> weir_engine::checkpoint::CheckpointStats {
        self.next = Some(self.next_barrier().await);
        self.log
            .entries()
            .into_iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("checkpoint {id} is not in the log"))
    }
}

fn write_keys(db: &mut RocksDbBackend, range: std::ops::Range<u32>) {
    let mut b = WriteBatch::default();
    for i in range {
        // Incompressible-ish values: SST sizes follow the key count.
        let value: Vec<u8> = (0..200u32)
            .map(|j| (i.wrapping_mul(2_654_435_761).wrapping_add(j * 97) >> 7) as u8)
            .collect();
        b.put(0, format!("key-{i:08}").into_bytes(), value);
    }
    db.write(b).expect("write");
}

fn count_keys(db: &RocksDbBackend) -> usize {
    let mut n = 0;
    db.scan(0, b"", b"\xff", &mut |_, _| {
        n += 1;
        true
    })
    .expect("scan");
    n
}

/// What a failed checkpoint `id` must leave: only its `_claim` in
/// `chk-id/` (the id stays used) and none of its shared files; and every complete
/// checkpoint must still name only whole files.
fn assert_nothing_left_of(root: &Path, id: u64) {
    let chk = root.join(format!("chk-{id}"));
    let left: Vec<_> = std::fs::read_dir(&chk)
        .map(|es| es.flatten().map(|e| e.file_name()).filter(|n| n != "_claim").collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "failed checkpoint {id} left {left:?} in {}",
        chk.display()
    );
    let marker = format!("-c{id}-");
    let shared: Vec<_> = std::fs::read_dir(root.join("shared"))
        .map(|es| {
            es.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.contains(&marker))
                .collect()
        })
        .unwrap_or_default();
    assert!(shared.is_empty(), "failed checkpoint {id} left shared files {shared:?}");
    let storage = CheckpointStorage::new(root.to_path_buf());
    for complete in storage.complete_ids().expect("ids") {
        // `load` checks that every file the metadata names exists with its size.
        storage
            .load(complete)
            .unwrap_or_else(|e| panic!("complete checkpoint {complete} is not whole: {e}"));
    }
}

fn assert_failed_with_enospc(s: &weir_engine::checkpoint::CheckpointStats, root: &Path) {
    assert_eq!(s.status, CheckpointStatus::Failed, "{s:?}");
    assert!(
        s.message.contains("No space left on device") && s.message.contains(&root.display().to_string()),
        "the reason names the path and the OS error: {}",
        s.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_on_a_full_disk_fail_cleanly_within_tolerance_and_resume_when_space_returns() {
    let fs = match Tmpfs::mount("24m") {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: cannot mount tmpfs: {why}");
            return;
        }
    };
    let root = fs.path().join("checkpoints");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut db = RocksDbBackend::open_fresh(&dir.path().join("db"), &["s"], &RocksDbTuning::default()).expect("open");
    let mut h = start(&root, 2);

    write_keys(&mut db, 0..10_000);
    let first = h.checkpoint(&mut db).await;
    assert_eq!(h.outcome(first).await.status, CheckpointStatus::Completed);

    // New state to upload, and a disk with 64 KiB left: the SST upload
    // gets part of its data in before ENOSPC.
    write_keys(&mut db, 10_000..20_000);
    let filler = fs.fill(64 * 1024);
    let mut failed = vec![];
    for _ in 0..2 {
        let id = h.checkpoint(&mut db).await;
        let s = h.outcome(id).await;
        assert_failed_with_enospc(&s, &root);
        assert_nothing_left_of(&root, id);
        failed.push(id);
    }
    assert!(!h.done.is_finished(), "two failures are within the tolerance of 2");
    assert_eq!(
        h.log.failed_total.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "both are counted as failed checkpoints"
    );

    // Space returns: the next checkpoint completes, and it restores.
    std::fs::remove_file(&filler).expect("remove filler");
    let recovered = h.checkpoint(&mut db).await;
    let s = h.outcome(recovered).await;
    assert_eq!(s.status, CheckpointStatus::Completed, "{s:?}");
    let job_dir = dir.path().join("restored-job");
    let restored = restore_latest(&CheckpointStorage::new(root.clone()), &|_| Ok(()), &job_dir)
        .expect("restore")
        .expect("a checkpoint");
    assert_eq!(restored.checkpoint_id(), recovered);
    let copy = RocksDbBackend::open_existing(
        &job_dir.join("state").join("restored").join("window-1-0"),
        &["s"],
        &RocksDbTuning::default(),
    )
    .expect("open");
    assert_eq!(count_keys(&copy), 20_000, "the restored state is the whole state");
    drop(copy);
    // The failed attempts' files are gone; so are their empty directories
    // once a later checkpoint completed (garbage collection).
    for id in &failed {
        assert_nothing_left_of(&root, *id);
    }

    // Full again, for good: the third consecutive failure is beyond the
    // tolerance and fails the job, naming the cause.
    write_keys(&mut db, 20_000..30_000);
    let _filler = fs.fill(0);
    // A restore into a full local disk is the disk's fault, not the
    // checkpoint's: it does not fall back to an older checkpoint (whose
    // committed output would then be produced again).
    let err = restore_latest(
        &CheckpointStorage::new(root.clone()),
        &|_| Ok(()),
        &fs.path().join("job"),
    )
    .expect_err("no room to lay the state out");
    assert!(
        matches!(err, weir_engine::checkpoint::CheckpointError::LocalState { .. })
            && err.to_string().contains("No space left on device"),
        "{err}"
    );
    // The next checkpoint fails writing; the ones after it cannot even
    // claim their ids (no barrier goes out), and fail too.
    let last_written = h.checkpoint(&mut db).await;
    let log = h.log.clone();
    let err = tokio::time::timeout(Duration::from_secs(30), h.done)
        .await
        .expect("the coordinator ends")
        .expect("join")
        .expect_err("three consecutive failures, two tolerated");
    let msg = err.to_string();
    let entries = log.entries();
    let last = entries.last().expect("checkpoints").id;
    assert!(
        msg.contains(&format!("checkpoint {last} failed"))
            && msg.contains("No space left on device")
            && msg.contains("3 consecutive failures")
            && msg.contains("'execution.checkpointing.tolerable-failed-checkpoints' = 2"),
        "{msg}"
    );
    for s in entries.iter().filter(|s| s.id >= last_written) {
        assert_failed_with_enospc(s, &root);
    }
    assert_nothing_left_of(&root, last_written);
    let last = last_written;
    assert_nothing_left_of(&root, last);
}
