//! The Delta Lake sink, read back by delta-rs's Python package
//! (`deltalake`, from the venv `scripts/adbc-venv.sh` makes), not by Weir:
//! every row once, one table version per completed checkpoint that wrote
//! something, each carrying the checkpoint's id as its `txn` version;
//! under SIGKILL at random moments and at the commit's failpoints; with
//! another writer appending to the same table; and the errors a user
//! meets (another schema, a read-only directory).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const FILES: u64 = 2;
const LINES_PER_FILE: u64 = 20_000;

/// The test venv's python (see `scripts/adbc-venv.sh`).
fn python() -> PathBuf {
    let py = common::test_python();
    assert!(
        py.exists(),
        "{} is missing: run ./scripts/setup.sh (or scripts/adbc-venv.sh) to create the test venv",
        py.display()
    );
    py
}

/// Bids as CSV, one file per reader; the rows every run must commit once,
/// as the reader prints them.
fn input(dir: &Path) -> (PathBuf, Vec<String>) {
    let bids = dir.join("bids");
    std::fs::create_dir_all(&bids).expect("bids dir");
    let mut rows = vec![];
    for f in 0..FILES {
        let mut text = String::new();
        for i in 0..LINES_PER_FILE {
            let n = f * LINES_PER_FILE + i;
            let ts = format!(
                "2024-01-01 0{}:{:02}:{:02}.{:03}",
                n / 3_600_000,
                (n / 60_000) % 60,
                (n / 1000) % 60,
                n % 1000
            );
            let auction = (n * 7919) % 97;
            let price = (n * 31) % 1000 + 1;
            let name = format!("bidder-{}", n % 13);
            text.push_str(&format!("{auction},{price},{ts},{name}\n"));
            rows.push(format!("{auction}|{price}|{ts}|{name}|{}", auction % 4));
        }
        std::fs::write(bids.join(format!("bids-{f}.csv")), text).expect("write bids");
    }
    rows.sort();
    (bids, rows)
}

fn job_sql(bids: &Path, table: &Path, extra: &str) -> String {
    format!(
        "SET 'pipeline.name' = 'delta-test';
SET 'parallelism.default' = '2';
{extra}
CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), bidder STRING)
WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'scan.lines-per-second' = '10000');
CREATE TABLE lake (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), bidder STRING, bucket BIGINT)
PARTITIONED BY (bucket)
WITH ('connector' = 'delta', 'path' = '{}', 'sink.rolling-policy.file-size' = '64 kb');
INSERT INTO lake SELECT auction, price, dateTime, bidder, auction % 4 FROM bid;
",
        bids.display(),
        table.display()
    )
}

/// A test's directory: the input, the rows expected, the job's SQL (its
/// `extra` settings first), the table's path and the data dir.
struct Setup {
    dir: tempfile::TempDir,
    expected: Vec<String>,
    table: PathBuf,
    sql: PathBuf,
    data: PathBuf,
}

fn setup(extra: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, expected) = input(dir.path());
    let table = dir.path().join("lake");
    let sql = dir.path().join("job.sql");
    std::fs::write(&sql, job_sql(&bids, &table, extra)).expect("sql");
    let data = dir.path().join("data");
    Setup {
        dir,
        expected,
        table,
        sql,
        data,
    }
}

/// What the Python reader sees of the table.
struct Read {
    rows: Vec<String>,
    version: i64,
}

fn read_table(table: &Path) -> Read {
    let script = r#"
import json, sys
from deltalake import DeltaTable
dt = DeltaTable(sys.argv[1])
t = dt.to_pyarrow_table()
rows = []
for r in t.to_pylist():
    ts = r["dateTime"].isoformat(sep=" ", timespec="milliseconds")
    rows.append(f'{r["auction"]}|{r["price"]}|{ts}|{r["bidder"]}|{r["bucket"]}')
print(json.dumps({"version": dt.version(), "rows": rows}))
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(table)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "the deltalake reader failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut rows: Vec<String> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r.as_str().expect("row").to_string())
        .collect();
    rows.sort();
    Read {
        rows,
        version: v["version"].as_i64().expect("version"),
    }
}

/// One commit of the table's log: its `txn` actions (app id, version)
/// and the files it added.
type Commit = (Vec<(String, i64)>, Vec<String>);

/// The table's log as written, by version.
fn log_of(table: &Path) -> BTreeMap<u64, Commit> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(table.join("_delta_log")).expect("log") {
        let path = e.expect("entry").path();
        let Some(version) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("commit");
        let (mut txns, mut adds) = (vec![], vec![]);
        for line in text.lines() {
            let a: serde_json::Value = serde_json::from_str(line).expect("action");
            if let Some(t) = a.get("txn") {
                txns.push((
                    t["appId"].as_str().expect("appId").to_string(),
                    t["version"].as_i64().expect("version"),
                ));
            }
            if let Some(add) = a.get("add") {
                adds.push(add["path"].as_str().expect("path").to_string());
            }
        }
        out.insert(version, (txns, adds));
    }
    out
}

/// Every commit of Weir's after the table's creation carries one `txn`
/// of the sink's app id, at increasing versions; every file added exists;
/// and no Parquet file of the job's is left that the log does not add.
fn assert_log_sound(table: &Path, stderr: &str) -> usize {
    let log = log_of(table);
    let mut last = 0i64;
    let mut added = BTreeSet::new();
    let mut weir_commits = 0;
    for (version, (txns, adds)) in &log {
        let ours: Vec<&(String, i64)> = txns
            .iter()
            .filter(|(app, _)| app.starts_with("weir-delta-test-"))
            .collect();
        if ours.is_empty() {
            continue;
        }
        weir_commits += 1;
        assert_eq!(
            ours.len(),
            1,
            "version {version} has {} txn actions of the job",
            ours.len()
        );
        assert!(
            ours[0].1 > last,
            "version {version} records checkpoint {} after {last}: a checkpoint committed twice or out of order\n{stderr}",
            ours[0].1
        );
        last = ours[0].1;
        assert!(!adds.is_empty(), "version {version} adds nothing");
        for a in adds {
            let file = table.join(a);
            assert!(file.exists(), "version {version} adds {a}, which is not there");
            assert!(added.insert(a.clone()), "{a} added twice");
        }
    }
    let mut stray = vec![];
    walk(&table.join("weir-delta-test"), &mut |p: &Path| {
        let rel = p.strip_prefix(table).expect("inside").to_string_lossy().to_string();
        if !added.contains(&rel) {
            stray.push(rel);
        }
    });
    assert!(stray.is_empty(), "files of the job no version adds: {stray:?}");
    weir_commits
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries {
        let p = e.expect("entry").path();
        if p.is_dir() {
            walk(&p, f);
        } else {
            f(&p);
        }
    }
}

fn start(data: &Path, sql: &Path, failpoints: Option<&str>) -> Child {
    common::start_run(data, sql, failpoints)
}

/// Runs the job until it ends, or SIGKILLs it `kill_after` after its
/// stderr shows `armed` checkpoints completed. Returns whether it ended
/// (and how), and its stderr.
fn run(data: &Path, sql: &Path, failpoints: Option<&str>, kill: Option<(usize, Duration)>) -> (Option<bool>, String) {
    let mut child = start(data, sql, failpoints);
    let mut pipe = child.stderr.take().expect("stderr");
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = text.clone();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .expect("stderr")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut kill_at = None;
    let ended = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status.success());
        }
        let now = Instant::now();
        if let Some((checkpoints, after)) = kill
            && kill_at.is_none()
            && text.lock().expect("stderr").matches(" completed in ").count() >= checkpoints
        {
            kill_at = Some(now + after);
        }
        if kill_at.is_some_and(|k| now >= k) {
            child.kill().expect("kill");
            child.wait().expect("reap");
            break None;
        }
        assert!(
            now < deadline,
            "weir run did not end within 180 s:\n{}",
            text.lock().expect("stderr")
        );
        // Polling the child: the kill time is the variable under test.
        std::thread::sleep(Duration::from_millis(5));
    };
    reader.join().expect("stderr reader");
    let stderr = text.lock().expect("stderr").clone();
    (ended, stderr)
}

fn assert_rows(read: &Read, expected: &[String], context: &str) {
    if read.rows != expected {
        let got: BTreeSet<&String> = read.rows.iter().collect();
        let want: BTreeSet<&String> = expected.iter().collect();
        let missing: Vec<_> = want.difference(&got).take(5).collect();
        let extra: Vec<_> = got.difference(&want).take(5).collect();
        panic!(
            "{context}: {} rows read, {} expected (missing e.g. {missing:?}, unexpected e.g. {extra:?}; duplicates: {})",
            read.rows.len(),
            expected.len(),
            read.rows.len() - got.len()
        );
    }
}

#[test]
fn a_job_into_a_delta_table_commits_one_version_per_checkpoint_and_another_reader_sees_every_row_once() {
    let Setup {
        dir: _dir,
        expected,
        table,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '300 ms';");
    let (ended, stderr) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{stderr}");
    let read = read_table(&table);
    assert_rows(&read, &expected, "a run without failures");
    let commits = assert_log_sound(&table, &stderr);
    let checkpoints = stderr.matches(" completed in ").count();
    assert!(
        commits >= 3,
        "the rows came in {commits} commits: too few to test anything\n{stderr}"
    );
    assert!(
        commits <= checkpoints,
        "{commits} commits for {checkpoints} completed checkpoints\n{stderr}"
    );
    // Version 0 created the table; each commit after it is one checkpoint.
    assert_eq!(
        read.version as usize, commits,
        "versions besides the checkpoints' commits"
    );
}

#[test]
fn without_checkpointing_a_bounded_job_commits_its_delta_files_at_the_end() {
    let Setup {
        dir: _dir,
        expected,
        table,
        sql,
        data,
    } = setup("");
    // As fast as it reads.
    let text = std::fs::read_to_string(&sql).expect("sql");
    std::fs::write(
        &sql,
        text.replace("'scan.lines-per-second' = '10000'", "'scan.lines-per-second' = '0'"),
    )
    .expect("sql");
    let (ended, stderr) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{stderr}");
    assert_rows(&read_table(&table), &expected, "without checkpointing");
}

/// SIGKILL at random moments (each once a further checkpoint completed),
/// the job started again after each: every row once, each checkpoint
/// committed at most once, no file of a killed attempt left behind.
#[test]
fn sigkill_at_random_moments_into_a_delta_table_loses_and_duplicates_nothing() {
    let Setup {
        dir: _dir,
        expected,
        table,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '150 ms';");
    let mut seed = 0x5eed_de17_u64;
    let mut kills = 0;
    let mut all = String::new();
    for _ in 0..8 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let after = Duration::from_millis((seed >> 33) % 400);
        let kill = (kills < 3).then_some((1, after));
        let (ended, stderr) = run(&data, &sql, None, kill);
        all.push_str(&stderr);
        match ended {
            None => kills += 1,
            Some(true) => break,
            Some(false) => panic!("a run failed:\n{stderr}"),
        }
    }
    assert_eq!(kills, 3, "the job ended before three kills:\n{all}");
    assert!(all.contains("restoring from checkpoint"), "no run restored:\n{all}");
    assert_rows(&read_table(&table), &expected, "after 3 SIGKILLs");
    assert_log_sound(&table, &all);
}

/// A crash at each moment of the commit: the checkpoint complete but its
/// Delta commit not made; the commit made but the process gone before
/// anything else; the restored checkpoint's re-commit made and the
/// process gone again before it went on.
#[test]
fn a_crash_at_each_delta_commit_failpoint_loses_and_duplicates_nothing() {
    let Setup {
        dir: _dir,
        expected,
        table,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '150 ms';");
    let mut all = String::new();
    for failpoints in [
        Some("coordinator.before_commit:3"),
        Some("delta_sink.committed:1"),
        Some("delta_sink.committed:3"),
        None,
    ] {
        let (ended, stderr) = run(&data, &sql, failpoints, None);
        all.push_str(&stderr);
        match (failpoints, ended) {
            (None, Some(true)) => {}
            (Some(_), Some(false)) => {}
            (f, e) => panic!("failpoints {f:?}: the run ended {e:?}:\n{stderr}"),
        }
    }
    assert!(
        all.contains("was committed before"),
        "no re-commit was recognised as done:\n{all}"
    );
    assert_rows(&read_table(&table), &expected, "after the failpoints");
    assert_log_sound(&table, &all);
}

/// Another process appends to the table while the job writes to it:
/// both writers' rows are there once.
#[test]
fn another_writer_appending_between_checkpoints_keeps_both_writers_rows_once() {
    let Setup {
        dir: _dir,
        mut expected,
        table,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    let mut child = start(&data, &sql, None);
    let append = r#"
import sys
import pyarrow as pa
from datetime import datetime
from deltalake import write_deltalake
n = int(sys.argv[2])
t = pa.table({
    "auction": pa.array([1000 + n], pa.int64()),
    "price": pa.array([n], pa.int64()),
    "dateTime": pa.array([datetime(2030, 1, 1, 0, 0, n)], pa.timestamp("us")),
    "bidder": pa.array([f"other-{n}"], pa.string()),
    "bucket": pa.array([(1000 + n) % 4], pa.int64()),
})
write_deltalake(sys.argv[1], t, mode="append")
"#;
    let mut appended = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while appended < 5 {
        assert!(Instant::now() < deadline, "the other writer never got to append");
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut stderr)
                .expect("stderr");
            panic!("the job ended ({status}) before the other writer appended {appended} times:\n{stderr}");
        }
        if !table.join("_delta_log").exists() {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let out = Command::new(python())
            .arg("-c")
            .arg(append)
            .arg(&table)
            .arg(appended.to_string())
            .output()
            .expect("python");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        expected.push(format!(
            "{}|{appended}|2030-01-01 00:00:{appended:02}.000|other-{appended}|{}",
            1000 + appended,
            (1000 + appended) % 4
        ));
        appended += 1;
    }
    let status = child.wait().expect("wait");
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.matches(" completed in ").count() >= 2,
        "the other writer's appends came after the job's end:\n{stderr}"
    );
    expected.sort();
    assert_rows(&read_table(&table), &expected, "two writers");
}

#[test]
fn a_delta_table_of_other_columns_is_refused_naming_the_column_and_both_types() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, _) = input(dir.path());
    let table = dir.path().join("lake");
    let create = r#"
import sys
import pyarrow as pa
from deltalake import write_deltalake
t = pa.table({
    "auction": pa.array([1], pa.int64()),
    "price": pa.array(["one"], pa.string()),
    "dateTime": pa.array([0], pa.timestamp("us")),
    "bidder": pa.array(["x"], pa.string()),
    "bucket": pa.array([1], pa.int64()),
})
write_deltalake(sys.argv[1], t, partition_by=["bucket"])
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(create)
        .arg(&table)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sql = dir.path().join("job.sql");
    std::fs::write(&sql, job_sql(&bids, &table, "")).expect("sql");
    let (ended, stderr) = run(&dir.path().join("data"), &sql, None, None);
    assert_eq!(ended, Some(false), "{stderr}");
    assert!(
        stderr.contains("column 'price' is Int64 in the DDL (Delta type long) but string in the table"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A directory the job cannot write: a clear error naming the table,
/// never a panic. (As root, permission bits stop nothing: `/sys` does.)
#[test]
fn a_read_only_delta_directory_is_a_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, _) = input(dir.path());
    let table = if is_root() {
        PathBuf::from("/sys/weir-delta-test-lake")
    } else {
        let t = dir.path().join("lake");
        std::fs::create_dir_all(&t).expect("table dir");
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        t
    };
    let sql = dir.path().join("job.sql");
    std::fs::write(
        &sql,
        job_sql(&bids, &table, "SET 'execution.checkpointing.interval' = '300 ms';"),
    )
    .expect("sql");
    let (ended, stderr) = run(&dir.path().join("data"), &sql, None, None);
    if !is_root() {
        std::fs::set_permissions(&table, std::fs::Permissions::from_mode(0o755)).expect("chmod back");
    }
    assert_eq!(ended, Some(false), "{stderr}");
    assert!(
        stderr.contains(&format!("Delta table 'lake' at {}", table.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Whether this process runs as root (permission bits do not stop it).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
