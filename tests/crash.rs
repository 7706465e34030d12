//! Exactly-once under `kill -9`: a real `weir run` process running a keyed
//! window job at parallelism 2 into the exactly-once file sink is killed
//! at random moments (SIGKILL) or aborted at named failpoints inside the
//! checkpoint and commit protocol, restarted until it finishes, and its
//! finished files are compared with a failure-free run: 0 rows lost, 0
//! duplicated.
//!
//! Seeded: `WEIR_CRASH_SEED` picks the seed (default fixed),
//! `WEIR_CRASH_TRIALS` the number of trials (default 20). A failing trial
//! prints its seed and kill plan.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// SplitMix64: a tiny seeded generator for kill plans.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn job_sql(out: &Path) -> String {
    format!(
        "SET 'parallelism.default' = '2';
SET 'execution.checkpointing.interval' = '150 ms';
SET 'pipeline.name' = 'crash-test';
CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '240000',
        'nexmark.events-per-second' = '100000', 'nexmark.first-event-rate' = '20000');
CREATE TABLE out (auction BIGINT, window_start TIMESTAMP(3), cnt BIGINT, total BIGINT)
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
INSERT INTO out SELECT auction, window_start, COUNT(*), SUM(price)
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND))
GROUP BY auction, window_start, window_end;
",
        out.display()
    )
}

struct Run {
    exited: Option<std::process::ExitStatus>,
    stderr: String,
}

fn start(data: &Path, sql: &Path, failpoints: Option<&str>) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.arg("--data-dir")
        .arg(data)
        .arg("run")
        .arg(sql)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match failpoints {
        Some(f) => c.env("WEIR_FAILPOINTS", f),
        None => c.env_remove("WEIR_FAILPOINTS"),
    };
    c.spawn().expect("spawn weir")
}

/// Lets the process run for `kill_after` (or to its end), then SIGKILLs it.
fn run_once(data: &Path, sql: &Path, kill_after: Option<Duration>, failpoints: Option<&str>) -> Run {
    let mut child = start(data, sql, failpoints);
    let mut stderr_pipe = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let kill_at = kill_after.map(|d| Instant::now() + d);
    let exited = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        let now = Instant::now();
        if kill_at.is_some_and(|k| now >= k) {
            // SIGKILL: no destructors, no flushing, no goodbye.
            child.kill().expect("kill");
            child.wait().expect("reap");
            break None;
        }
        assert!(now < deadline, "weir run did not end within 120 s");
        // Polling the child's exit: the kill time is the random variable
        // under test, not a synchronisation.
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        exited,
        stderr: reader.join().expect("stderr reader"),
    }
}

/// Rows of every finished (visible) part file, with their multiplicity.
fn finished_rows(out: &Path) -> BTreeMap<String, usize> {
    let mut rows = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(out) else {
        return rows;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).expect("read part file");
        for line in text.lines().filter(|l| !l.is_empty()) {
            *rows.entry(line.to_string()).or_default() += 1;
        }
    }
    rows
}

fn completed_checkpoints(stderr: &str) -> usize {
    stderr
        .lines()
        .filter(|l| l.contains("checkpoint") && l.contains("completed") && !l.contains("final"))
        .count()
}

/// Failpoints inside the protocol: abort on the k-th pass.
const FAILPOINTS: &[&str] = &[
    "checkpoint.file_uploaded",
    "checkpoint.before_metadata_write",
    "checkpoint.before_metadata_rename",
    "checkpoint.after_metadata_rename",
    "coordinator.before_commit",
    "coordinator.after_commit",
    "sink.pre_committed",
    "sink.file_committed",
];

struct Workspace {
    _dir: tempfile::TempDir,
    data: PathBuf,
    out: PathBuf,
    sql: PathBuf,
}

fn workspace() -> Workspace {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let out = dir.path().join("out");
    let sql = dir.path().join("job.sql");
    std::fs::write(&sql, job_sql(&out)).expect("write sql");
    Workspace {
        data,
        out,
        sql,
        _dir: dir,
    }
}

#[test]
fn sigkill_at_random_moments_loses_and_duplicates_nothing() {
    let trials: u64 = std::env::var("WEIR_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("WEIR_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED);

    let golden_ws = workspace();
    let golden = run_once(&golden_ws.data, &golden_ws.sql, None, None);
    assert!(
        golden.exited.is_some_and(|s| s.success()),
        "failure-free run failed:\n{}",
        golden.stderr
    );
    let golden_rows = finished_rows(&golden_ws.out);
    let golden_duration_hint = completed_checkpoints(&golden.stderr);
    assert!(
        golden_rows.len() > 1000 && golden_duration_hint >= 5,
        "the job is too small to test anything: {} rows, {golden_duration_hint} checkpoints",
        golden_rows.len()
    );

    let mut kills = 0;
    let mut restores = 0;
    let mut checkpoints_before_kills = 0;
    for trial in 0..trials {
        let mut rng = Rng(seed ^ trial.wrapping_mul(0x1000_0000_01B3));
        let ws = workspace();
        let mut plan = vec![];
        let mut attempt = 0;
        loop {
            attempt += 1;
            assert!(
                attempt < 20,
                "trial {trial} (seed {seed}): no end after 20 attempts; plan {plan:?}"
            );
            // Up to three failures per trial, then let it finish.
            let (kill_after, failpoint) = if attempt > 3 {
                (None, None)
            } else if rng.below(2) == 0 {
                (Some(Duration::from_millis(200 + rng.below(1800))), None)
            } else {
                let fp = FAILPOINTS[rng.below(FAILPOINTS.len() as u64) as usize];
                (None, Some(format!("{fp}:{}", 1 + rng.below(6))))
            };
            plan.push(format!("{kill_after:?}/{failpoint:?}"));
            let run = run_once(&ws.data, &ws.sql, kill_after, failpoint.as_deref());
            if run.stderr.contains("restoring from checkpoint") {
                restores += 1;
            }
            match run.exited {
                Some(s) if s.success() => break,
                Some(_) if run.stderr.contains("failpoint") => {
                    kills += 1;
                    checkpoints_before_kills += completed_checkpoints(&run.stderr);
                }
                Some(s) => panic!(
                    "trial {trial} (seed {seed}, plan {plan:?}): weir exited with {s} without being killed:\n{}",
                    run.stderr
                ),
                None => {
                    kills += 1;
                    checkpoints_before_kills += completed_checkpoints(&run.stderr);
                }
            }
        }
        let rows = finished_rows(&ws.out);
        let lost: usize = golden_rows
            .iter()
            .map(|(r, n)| n.saturating_sub(rows.get(r).copied().unwrap_or(0)))
            .sum();
        let duplicated: usize = rows
            .iter()
            .map(|(r, n)| n.saturating_sub(golden_rows.get(r).copied().unwrap_or(0)))
            .sum();
        assert!(
            lost == 0 && duplicated == 0,
            "trial {trial} (seed {seed}, plan {plan:?}): {lost} rows lost, {duplicated} duplicated or unexpected"
        );
        let hidden = std::fs::read_dir(&ws.out)
            .map(|es| {
                es.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(hidden, 0, "trial {trial}: in-progress or pending files left behind");
    }
    // Not vacuous: processes were really killed mid-run, checkpoints had
    // completed before kills, and restarts restored from them.
    assert!(kills >= trials as usize, "only {kills} kills in {trials} trials");
    assert!(
        checkpoints_before_kills >= trials as usize,
        "{checkpoints_before_kills} checkpoints before kills"
    );
    assert!(
        restores >= trials as usize / 2,
        "only {restores} restores from a checkpoint"
    );
    eprintln!(
        "{trials} trials: {kills} kills, {checkpoints_before_kills} checkpoints completed before them, {restores} restores"
    );
}
