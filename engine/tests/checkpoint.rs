//! The checkpoint coordinator, storage and restore against real RocksDB
//! state on disk: incremental uploads, garbage collection of shared files,
//! and corrupt checkpoints detected with a fallback to the previous one.
//!
//! The test plays the tasks: it answers each barrier the coordinator
//! announces with a real RocksDB snapshot. Waiting is on events (the next
//! barrier is announced only after the previous checkpoint completed).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use weir_engine::checkpoint::coordinator::CheckpointLog;
use weir_engine::checkpoint::{
    CheckpointConfig, CheckpointCoordinator, CheckpointError, CheckpointMode, CheckpointStatus, CheckpointStorage,
    OperatorState, TaskReport, TaskSnapshot, restore_latest,
};
use weir_engine::message::Barrier;
use weir_engine::state::{RocksDbBackend, RocksDbTuning, StateBackend, WriteBatch};

const KEY: &str = "window-1/0";

struct Harness {
    triggers: watch::Receiver<Option<Barrier>>,
    reports: mpsc::UnboundedSender<TaskReport>,
    log: Arc<CheckpointLog>,
    done: tokio::task::JoinHandle<weir_engine::error::Result<weir_engine::checkpoint::coordinator::CoordinatorEnd>>,
}

fn start(root: &Path, retained: usize) -> Harness {
    start_coordinator(root, retained, Duration::from_secs(60), 0, 1, Default::default(), None)
}

/// A coordinator over `tasks` tasks (task 0 is the only source reader).
fn start_coordinator(
    root: &Path,
    retained: usize,
    timeout: Duration,
    tolerable: u32,
    tasks: usize,
    committers: std::collections::HashMap<String, Arc<dyn weir_engine::connectors::Committer>>,
    protected: Option<weir_engine::checkpoint::CheckpointMetadata>,
) -> Harness {
    let (trigger_tx, triggers) = watch::channel(None);
    let (reports, report_rx) = mpsc::unbounded_channel();
    let log = Arc::new(CheckpointLog::default());
    let coordinator = CheckpointCoordinator {
        config: CheckpointConfig {
            store: None,
            s3: Default::default(),
            interval: Duration::from_millis(1),
            timeout,
            min_pause: Duration::ZERO,
            tolerable_failed: tolerable,
            num_retained: retained,
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
        job: "test".into(),
        fingerprint: "plan".into(),
        tasks,
        source_tasks: vec![0],
        triggers: trigger_tx,
        reports: report_rx,
        committers,
        log: log.clone(),
        restored: None,
        cluster: None,
        max_parallelism: 128,
        operator_info: Default::default(),
        savepoints: Arc::new(tokio::sync::Mutex::new(tokio::sync::mpsc::unbounded_channel().1)),
        claimed: None,
        stop: None,
        protected,
        first_id: 1,
    };
    Harness {
        triggers,
        reports,
        log,
        done: tokio::spawn(coordinator.run()),
    }
}

impl Harness {
    /// Waits for the next barrier and acknowledges it with `db`'s snapshot.
    async fn checkpoint(&mut self, db: &mut RocksDbBackend) -> u64 {
        tokio::time::timeout(Duration::from_secs(30), self.triggers.changed())
            .await
            .expect("a barrier before the deadline")
            .expect("coordinator running");
        let b = self.triggers.borrow_and_update().expect("a barrier");
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

    /// Ends the job and waits for the coordinator's final checkpoint.
    async fn finish(self) {
        self.reports
            .send(TaskReport::Finished {
                task: 0,
                snapshot: TaskSnapshot::default(),
            })
            .expect("report");
        tokio::time::timeout(Duration::from_secs(30), self.done)
            .await
            .expect("coordinator ends")
            .expect("join")
            .expect("coordinator ok");
    }

    fn stats(&self, id: u64) -> weir_engine::checkpoint::CheckpointStats {
        self.log
            .entries()
            .into_iter()
            .find(|s| s.id == id && s.status == CheckpointStatus::Completed)
            .unwrap_or_else(|| panic!("checkpoint {id} not completed: {:?}", self.log.entries()))
    }
}

fn write_keys(db: &mut RocksDbBackend, range: std::ops::Range<u32>, tag: u8) {
    let mut b = WriteBatch::default();
    for i in range {
        // Incompressible-ish values so sizes mean something.
        let value: Vec<u8> = (0..200u32)
            .map(|j| (i.wrapping_mul(2_654_435_761).wrapping_add(j * 97) >> 7) as u8 ^ tag)
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

fn shared_files(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.join("shared"))
        .map(|es| {
            es.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_checkpoints_upload_only_new_files_and_unreferenced_ones_are_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("checkpoints");
    let mut db = RocksDbBackend::open_fresh(&dir.path().join("db"), &["s"], &RocksDbTuning::default()).expect("open");
    let mut h = start(&root, 1);

    write_keys(&mut db, 0..50_000, 0);
    let first = h.checkpoint(&mut db).await;
    // A checkpoint that touched 20 keys of 50 000.
    write_keys(&mut db, 0..20, 1);
    let second = h.checkpoint(&mut db).await;
    // Completion of `second` is observed by the next barrier (announced
    // only after it completed).
    db.compact_all();
    let third = h.checkpoint(&mut db).await;
    write_keys(&mut db, 20..30, 2);
    let fourth = h.checkpoint(&mut db).await;
    h.triggers.changed().await.expect("barrier after the fourth");

    let s1 = h.stats(first);
    let s2 = h.stats(second);
    assert!(s1.full_bytes > 3_000_000, "first checkpoint holds the state: {s1:?}");
    assert_eq!(
        s1.incremental_bytes, s1.full_bytes,
        "the first checkpoint uploads everything"
    );
    assert!(
        s2.incremental_bytes * 20 < s2.full_bytes,
        "a checkpoint touching 20 keys uploads a small fraction: {} of {} bytes",
        s2.incremental_bytes,
        s2.full_bytes
    );
    // After compaction the old SSTs are gone from RocksDB; once no
    // retained checkpoint references them they are gone from storage too.
    let meta = CheckpointStorage::new(root.clone()).load(fourth).expect("load latest");
    let OperatorState::Rocksdb { files, .. } = &meta.operators[KEY] else {
        panic!("rocksdb state expected");
    };
    let referenced: Vec<String> = files
        .values()
        .filter(|f| f.path.starts_with("shared/"))
        .map(|f| f.path.trim_start_matches("shared/").to_string())
        .collect();
    let mut expected = referenced.clone();
    expected.sort();
    assert_eq!(
        shared_files(&root),
        expected,
        "only files of the retained checkpoint remain"
    );
    assert!(
        !root.join(format!("chk-{first}")).exists() && !root.join(format!("chk-{third}")).exists(),
        "subsumed checkpoints are deleted"
    );
    h.finish().await;
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

fn flip_byte(path: &Path, at_fraction: f64) {
    let mut bytes = std::fs::read(path).expect("read");
    let i = ((bytes.len() as f64) * at_fraction) as usize;
    let i = i.min(bytes.len() - 1);
    bytes[i] ^= 0x20;
    std::fs::write(path, bytes).expect("write");
}

fn truncate(path: &Path) {
    let len = std::fs::metadata(path).expect("meta").len();
    let f = std::fs::OpenOptions::new().write(true).open(path).expect("open");
    f.set_len(len / 2).expect("truncate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_checkpoints_are_detected_and_restore_falls_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pristine = dir.path().join("pristine");
    let mut db = RocksDbBackend::open_fresh(&dir.path().join("db"), &["s"], &RocksDbTuning::default()).expect("open");
    let mut h = start(&pristine, 3);
    write_keys(&mut db, 0..5_000, 0);
    let older = h.checkpoint(&mut db).await;
    write_keys(&mut db, 5_000..6_000, 0);
    let newer = h.checkpoint(&mut db).await;
    h.finish().await;
    // The final checkpoint is the newest; drop it so `newer` is latest.
    let storage = CheckpointStorage::new(pristine.clone());
    let ids = storage.complete_ids().expect("ids");
    assert_eq!(ids, vec![older, newer, ids[2]], "three retained");
    let final_id = *ids.last().expect("final");
    std::fs::remove_dir_all(pristine.join(format!("chk-{final_id}"))).expect("drop final");

    // The newest checkpoint's own files: its private files and the SSTs
    // only it references.
    let newer_meta = storage.load(newer).expect("load");
    let OperatorState::Rocksdb { files, .. } = &newer_meta.operators[KEY] else {
        panic!("rocksdb state");
    };
    let private = files
        .values()
        .find(|f| f.path.starts_with("chk-"))
        .expect("a private file")
        .path
        .clone();
    let newest_sst = files
        .values()
        .filter(|f| f.path.starts_with("shared/") && f.path.contains(&format!("-c{newer}-")))
        .map(|f| f.path.clone())
        .next()
        .expect("an SST uploaded by the newer checkpoint");

    type Damage = Box<dyn Fn(&Path)>;
    let meta_path = format!("chk-{newer}/_metadata");
    let cases: Vec<(&str, Damage)> = vec![
        ("metadata truncated", {
            let p = meta_path.clone();
            Box::new(move |r: &Path| truncate(&r.join(&p)))
        }),
        ("metadata bit flip", {
            let p = meta_path.clone();
            Box::new(move |r: &Path| flip_byte(&r.join(&p), 0.4))
        }),
        ("private file deleted", {
            let p = private.clone();
            Box::new(move |r: &Path| std::fs::remove_file(r.join(&p)).expect("rm"))
        }),
        ("shared SST bit flip", {
            let p = newest_sst.clone();
            Box::new(move |r: &Path| flip_byte(&r.join(&p), 0.5))
        }),
        ("shared SST truncated", {
            let p = newest_sst.clone();
            Box::new(move |r: &Path| truncate(&r.join(&p)))
        }),
        ("shared SST deleted", {
            let p = newest_sst.clone();
            Box::new(move |r: &Path| std::fs::remove_file(r.join(&p)).expect("rm"))
        }),
    ];
    for (name, damage) in cases {
        let root = dir.path().join(name.replace(' ', "-"));
        copy_dir(&pristine, &root);
        damage(&root);
        let job_dir = dir.path().join(format!("job-{}", name.replace(' ', "-")));
        let storage = CheckpointStorage::new(root.clone());
        let restored = restore_latest(&storage, &|_| Ok(()), &job_dir)
            .unwrap_or_else(|e| panic!("{name}: fallback expected, got error {e}"))
            .unwrap_or_else(|| panic!("{name}: a checkpoint expected"));
        assert_eq!(
            restored.checkpoint_id(),
            older,
            "{name}: falls back to the previous checkpoint"
        );
        assert_eq!(restored.skipped.len(), 1, "{name}: {:?}", restored.skipped);
        assert!(
            restored.skipped[0].contains(&format!("checkpoint {newer}")),
            "{name}: says which checkpoint was skipped: {:?}",
            restored.skipped
        );
        // The restored state is the older checkpoint's, complete.
        let db = RocksDbBackend::open_existing(
            &job_dir.join("state").join("restored").join("window-1-0"),
            &["s"],
            &RocksDbTuning::default(),
        )
        .expect("open");
        assert_eq!(count_keys(&db), 5_000, "{name}");
    }

    // Every checkpoint damaged: a clear error, never a panic.
    let root = dir.path().join("all-bad");
    copy_dir(&pristine, &root);
    for id in [older, newer] {
        truncate(&root.join(format!("chk-{id}/_metadata")));
    }
    let err = restore_latest(
        &CheckpointStorage::new(root),
        &|_| Ok(()),
        &dir.path().join("job-all-bad"),
    )
    .expect_err("nothing restorable");
    let msg = err.to_string();
    assert!(
        msg.contains("no complete checkpoint can be restored") && msg.contains("truncated"),
        "{msg}"
    );

    // A different plan: refused, not silently loaded or skipped.
    let err = restore_latest(
        &CheckpointStorage::new(pristine),
        &|_| Err(CheckpointError::Incompatible("another plan".into())),
        &dir.path().join("job-other"),
    )
    .expect_err("plan mismatch");
    assert!(matches!(err, CheckpointError::Incompatible(_)), "{err}");
}

/// Records what it is asked to commit.
#[derive(Default)]
struct RecordingCommitter(std::sync::Mutex<Vec<serde_json::Value>>);

impl weir_engine::connectors::Committer for RecordingCommitter {
    fn commit(&self, _checkpoint_id: u64, committables: &[serde_json::Value]) -> weir_engine::error::Result<()> {
        self.0.lock().expect("lock").extend(committables.iter().cloned());
        Ok(())
    }

    fn recover(&self) -> weir_engine::error::Result<()> {
        Ok(())
    }
}

/// Two tasks: 0 a source reader (no state), 1 a two-phase-commit sink.
fn start_with_sink(root: &Path, timeout: Duration, tolerable: u32, committer: Arc<RecordingCommitter>) -> Harness {
    let mut committers: std::collections::HashMap<String, Arc<dyn weir_engine::connectors::Committer>> =
        Default::default();
    committers.insert("sink-2".into(), committer);
    start_coordinator(root, 2, timeout, tolerable, 2, committers, None)
}

impl Harness {
    async fn next_barrier(&mut self) -> u64 {
        tokio::time::timeout(Duration::from_secs(30), self.triggers.changed())
            .await
            .expect("a barrier before the deadline")
            .expect("coordinator running");
        self.triggers.borrow_and_update().expect("a barrier").checkpoint_id
    }

    fn ack(&self, task: usize, id: u64, committables: Option<Vec<serde_json::Value>>) {
        let operators = match committables {
            Some(c) => vec![(
                "sink-2/0".to_string(),
                weir_engine::checkpoint::OperatorSnapshot::Sink(c),
            )],
            None => vec![],
        };
        self.reports
            .send(TaskReport::Ack {
                checkpoint_id: id,
                task,
                snapshot: TaskSnapshot {
                    sources: vec![],
                    operators,
                },
                alignment: Duration::ZERO,
                sync: Duration::ZERO,
            })
            .expect("report");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_output_of_an_aborted_checkpoint_is_committed_with_the_next_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let committed = Arc::new(RecordingCommitter::default());
    let mut h = start_with_sink(dir.path(), Duration::from_millis(300), 5, committed.clone());
    let v = |s: &str| serde_json::json!({ "part": s });

    let first = h.next_barrier().await;
    h.ack(0, first, None);
    h.ack(1, first, Some(vec![v("a")]));
    // Checkpoint 2: the sink pre-commits, the source never acknowledges:
    // it expires, and its sink output must not be lost.
    let second = h.next_barrier().await;
    assert_eq!(
        *committed.0.lock().expect("lock"),
        vec![v("a")],
        "committed once complete"
    );
    h.ack(1, second, Some(vec![v("b")]));
    let third = h.next_barrier().await;
    let failed: Vec<_> = h
        .log
        .entries()
        .into_iter()
        .filter(|s| s.status == CheckpointStatus::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].message.contains("expired"), "{failed:?}");
    h.ack(0, third, None);
    h.ack(1, third, Some(vec![v("c")]));
    let _fourth = h.next_barrier().await;
    assert_eq!(*committed.0.lock().expect("lock"), vec![v("a"), v("b"), v("c")]);
    // The completed checkpoint holds both, so a crash before the commit
    // re-commits both.
    let meta = CheckpointStorage::new(dir.path().to_path_buf())
        .load(third)
        .expect("load");
    assert_eq!(meta.committables().cloned().collect::<Vec<_>>(), vec![v("b"), v("c")]);
    // End of input: the sink's last output is committed by the final checkpoint.
    h.reports
        .send(TaskReport::Finished {
            task: 0,
            snapshot: TaskSnapshot::default(),
        })
        .expect("report");
    h.reports
        .send(TaskReport::Finished {
            task: 1,
            snapshot: TaskSnapshot {
                sources: vec![],
                operators: vec![(
                    "sink-2/0".into(),
                    weir_engine::checkpoint::OperatorSnapshot::Sink(vec![v("d")]),
                )],
            },
        })
        .expect("report");
    let end = tokio::time::timeout(Duration::from_secs(30), h.done)
        .await
        .expect("ends")
        .expect("join")
        .expect("ok");
    assert_eq!(end, weir_engine::checkpoint::coordinator::CoordinatorEnd::Finished);
    assert_eq!(committed.0.lock().expect("lock").last(), Some(&v("d")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_beyond_the_tolerance_fail_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut h = start_with_sink(dir.path(), Duration::from_secs(60), 1, Arc::default());
    for _ in 0..2 {
        let id = h.next_barrier().await;
        h.reports
            .send(TaskReport::Decline {
                checkpoint_id: id,
                task: 1,
                reason: "disk full".into(),
            })
            .expect("report");
    }
    let err = tokio::time::timeout(Duration::from_secs(30), h.done)
        .await
        .expect("ends")
        .expect("join")
        .expect_err("two consecutive failures, one tolerated");
    let msg = err.to_string();
    assert!(
        msg.contains("disk full") && msg.contains("tolerable-failed-checkpoints' = 1"),
        "{msg}"
    );
}

/// A sink that acknowledged checkpoint N and then finished before N
/// completed: its final output (after N) is committed by a later
/// checkpoint, not dropped with N's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_output_of_a_task_that_finished_during_a_checkpoint_is_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let committed = Arc::new(RecordingCommitter::default());
    let mut h = start_with_sink(dir.path(), Duration::from_secs(60), 0, committed.clone());
    let v = |s: &str| serde_json::json!({ "part": s });
    let n = h.next_barrier().await;
    h.ack(1, n, Some(vec![v("before-n")]));
    h.reports
        .send(TaskReport::Finished {
            task: 1,
            snapshot: TaskSnapshot {
                sources: vec![],
                operators: vec![(
                    "sink-2/0".into(),
                    weir_engine::checkpoint::OperatorSnapshot::Sink(vec![v("after-n")]),
                )],
            },
        })
        .expect("report");
    h.ack(0, n, None);
    let next = h.next_barrier().await;
    assert_eq!(*committed.0.lock().expect("lock"), vec![v("before-n")]);
    h.ack(0, next, None);
    h.reports
        .send(TaskReport::Finished {
            task: 0,
            snapshot: TaskSnapshot::default(),
        })
        .expect("report");
    tokio::time::timeout(Duration::from_secs(30), h.done)
        .await
        .expect("ends")
        .expect("join")
        .expect("ok");
    assert_eq!(*committed.0.lock().expect("lock"), vec![v("before-n"), v("after-n")]);
}

/// NO_CLAIM of a checkpoint in the job's own directory: later checkpoints
/// and their garbage collection leave it and its shared files in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_checkpoint_survives_garbage_collection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("checkpoints");
    let mut db = RocksDbBackend::open_fresh(&dir.path().join("db"), &["s"], &RocksDbTuning::default()).expect("open");
    let mut h = start(&root, 1);
    write_keys(&mut db, 0..20_000, 0);
    let first = h.checkpoint(&mut db).await;
    h.triggers.changed().await.expect("barrier after the first");
    drop(h);
    let storage = CheckpointStorage::new(root.clone());
    let meta = storage.load(first).expect("load");
    let files: Vec<std::path::PathBuf> = meta.files().map(|f| root.join(&f.path)).collect();

    let mut h = start_coordinator(&root, 1, Duration::from_secs(60), 0, 1, Default::default(), Some(meta));
    for round in 1..4u8 {
        write_keys(&mut db, 0..20_000, round);
        db.compact_all();
        h.checkpoint(&mut db).await;
    }
    h.triggers.changed().await.expect("barrier after the last");
    assert!(storage.load(first).is_ok(), "the protected checkpoint still verifies");
    assert!(files.iter().all(|f| f.exists()), "its files are all there");
}
