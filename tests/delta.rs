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
use std::process::Command;
use std::time::Duration;

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
    /// The files of the version read, relative to the table.
    files: BTreeSet<String>,
}

fn read_table(table: &Path) -> Read {
    read_table_at(&table.display().to_string(), None)
}

/// What the Python reader sees of the table at `uri`, reached with
/// `storage_options` (JSON) if given; also the files of its version.
fn read_table_at(uri: &str, storage_options: Option<&str>) -> Read {
    let script = r#"
import json, sys
from deltalake import DeltaTable
dt = DeltaTable(sys.argv[1], storage_options=json.loads(sys.argv[2]) or None)
t = dt.to_pyarrow_table()
rows = []
for r in t.to_pylist():
    ts = r["dateTime"].isoformat(sep=" ", timespec="milliseconds")
    rows.append(f'{r["auction"]}|{r["price"]}|{ts}|{r["bidder"]}|{r["bucket"]}')
import pyarrow
files = pyarrow.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()
print(json.dumps({"version": dt.version(), "rows": rows, "files": files}))
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(uri)
        .arg(storage_options.unwrap_or("{}"))
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
        files: v["files"]
            .as_array()
            .expect("files")
            .iter()
            .map(|f| f.as_str().expect("file").to_string())
            .collect(),
    }
}

/// One commit of the table's log: its `txn` actions (app id, version)
/// and the files it added.
type Commit = (Vec<(String, i64)>, Vec<String>);

/// The table's log as written, by version.
fn log_of(table: &Path) -> BTreeMap<u64, Commit> {
    let mut out = BTreeMap::new();
    // No log yet: no commit yet.
    let Ok(entries) = std::fs::read_dir(table.join("_delta_log")) else {
        return out;
    };
    for e in entries {
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

/// Runs the job until it ends, or SIGKILLs it `after` once its stderr
/// shows `checkpoints` checkpoints completed. Returns whether it ended
/// (and how), and its stderr.
fn run(data: &Path, sql: &Path, failpoints: Option<&str>, kill: Option<(usize, Duration)>) -> (Option<bool>, String) {
    let checkpoints = kill.map_or(0, |(c, _)| c);
    let run = common::run_armed(data, sql, failpoints, 180, kill.map(|(_, after)| after), &|stderr| {
        stderr.matches(" completed in ").count() >= checkpoints
    });
    (run.exited.map(|s| s.success()), run.stderr)
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

/// The versions of the table's commits made by the job (those carrying
/// its `txn`) and by anyone else, table creation aside.
fn commits_by_writer(table: &Path) -> (Vec<u64>, Vec<u64>) {
    let (mut ours, mut others) = (vec![], vec![]);
    for (version, (txns, adds)) in log_of(table) {
        if txns.iter().any(|(app, _)| app.starts_with("weir-delta-test-")) {
            ours.push(version);
        } else if !adds.is_empty() {
            others.push(version);
        }
    }
    (ours, others)
}

/// Another process appends to the table while the job writes to it, each
/// append after a further commit of the job's: both writers' rows are
/// there once, and the log shows their commits interleaved.
#[test]
fn another_writer_appending_between_checkpoints_keeps_both_writers_rows_once() {
    let Setup {
        dir: _dir,
        mut expected,
        table,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    // Slower input: the job must still be writing while the other writer
    // (a Python process each time) appends five times.
    let text = std::fs::read_to_string(&sql).expect("sql");
    std::fs::write(
        &sql,
        text.replace("'scan.lines-per-second' = '10000'", "'scan.lines-per-second' = '3000'"),
    )
    .expect("sql");
    let job = {
        let (data, sql) = (data.clone(), sql.clone());
        std::thread::spawn(move || common::run_armed(&data, &sql, None, 180, None, &|_| false))
    };
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
    for appended in 0..5usize {
        // The event: the job's commit number `appended + 1` is in the log.
        common::eventually_blocking("a further commit of the job's", 120, || {
            let (ours, _) = commits_by_writer(&table);
            if ours.len() > appended {
                return Ok(());
            }
            assert!(
                !job.is_finished(),
                "the job ended before the other writer appended {appended} times"
            );
            Err(format!("{} commits of the job's", ours.len()))
        });
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
    }
    let run = job.join().expect("job thread");
    assert!(run.exited.is_some_and(|s| s.success()), "{}", run.stderr);
    let (ours, others) = commits_by_writer(&table);
    assert_eq!(others.len(), 5, "the other writer's commits: {others:?}");
    // Interleaved: a commit of the job's came after one of the other's,
    // so the job's optimistic commit met a version it had not read.
    assert!(
        ours.last() > others.first(),
        "the job's commits {ours:?} all came before the other writer's {others:?}:\n{}",
        run.stderr
    );
    expected.sort();
    assert_rows(&read_table(&table), &expected, "two writers");
    assert_log_sound(&table, &run.stderr);
}

/// The table on an S3-compatible server (SeaweedFS), checkpoints there
/// too, the job SIGKILLed once after a checkpoint: another reader, through
/// its own S3 client, sees every row once, and no file of the killed
/// attempt is left in the bucket.
#[test]
fn a_delta_table_on_s3_survives_a_sigkill_with_every_row_once() {
    let Setup {
        dir,
        expected,
        table,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    let s3_dir = dir.path().join("s3");
    std::fs::create_dir_all(&s3_dir).expect("s3 dir");
    let s3 = common::s3_server(&s3_dir);
    let uri = format!("s3://{}/lake", s3.bucket);
    let text = std::fs::read_to_string(&sql).expect("sql");
    let text = text.replace(&format!("'path' = '{}'", table.display()), &format!("'path' = '{uri}'"));
    std::fs::write(&sql, format!("{}\n{text}", s3.checkpoint_settings())).expect("sql");
    let (ended, first) = run(&data, &sql, None, Some((1, Duration::from_millis(150))));
    assert_eq!(ended, None, "the job ended before the kill:\n{first}");
    let (ended, second) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{second}");
    assert!(second.contains("restoring from checkpoint"), "{second}");
    let read = read_table_at(&uri, Some(&s3.delta_storage_options()));
    assert_rows(&read, &expected, "on S3 after a SIGKILL");
    let stray: Vec<String> = s3
        .keys("lake/weir-delta-test")
        .into_iter()
        .filter(|k| !read.files.contains(k.trim_start_matches("lake/")))
        .collect();
    assert!(
        stray.is_empty(),
        "files of the job no version adds: {stray:?}\n{second}"
    );
    assert!(
        !read.files.is_empty() && read.files.iter().all(|f| f.starts_with("weir-delta-test/")),
        "{:?}",
        read.files
    );
}

/// A job whose checkpoints are gone (a new data dir) writing to a table
/// its earlier run committed to: its checkpoint ids continue above the
/// recorded `txn` version, so its commits are not taken for replays of the
/// earlier run's: the rows are there twice, once per run, none skipped.
#[test]
fn a_rerun_without_its_checkpoints_commits_above_the_recorded_version() {
    let Setup {
        dir: _dir,
        expected,
        table,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    let (ended, first) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{first}");
    let before = txn_versions(&table);
    let last = *before.last().expect("the first run committed");
    std::fs::remove_dir_all(&data).expect("forget the checkpoints");
    let (ended, second) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{second}");
    assert!(!second.contains("was committed before"), "{second}");
    let after = txn_versions(&table);
    assert!(
        after.len() > before.len(),
        "the rerun committed nothing: {after:?}\n{second}"
    );
    assert!(
        after[before.len()] > last,
        "the rerun's first commit records checkpoint {} after {last}",
        after[before.len()]
    );
    let mut twice: Vec<String> = expected.iter().flat_map(|r| [r.clone(), r.clone()]).collect();
    twice.sort();
    assert_rows(&read_table(&table), &twice, "two runs");
    assert_log_sound(&table, &format!("{first}{second}"));
}

/// The job's `txn` versions in the log, in version order.
fn txn_versions(table: &Path) -> Vec<i64> {
    log_of(table)
        .values()
        .flat_map(|(txns, _)| {
            txns.iter()
                .filter(|(app, _)| app.starts_with("weir-delta-test-"))
                .map(|(_, v)| *v)
        })
        .collect()
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

/// The keyed job: a GROUP BY with HAVING (rows updated, then deleted
/// when their count passes the bound) into a keyed table; its SQL replaces
/// the setup's, and the rows another reader must see at the end.
fn keyed_job(dir: &Path, sql: &Path, expected: &[String]) -> (PathBuf, Vec<String>) {
    let mut per_auction: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for row in expected {
        let cols: Vec<&str> = row.split('|').collect();
        let (auction, price): (i64, i64) = (cols[0].parse().expect("auction"), cols[1].parse().expect("price"));
        let e = per_auction.entry(auction).or_insert((0, 0));
        e.0 += 1;
        e.1 = e.1.max(price);
    }
    let mut want: Vec<String> = per_auction
        .iter()
        .filter(|(_, (count, _))| *count < 413)
        .map(|(a, (count, top))| format!("{a}|{count}|{top}"))
        .collect();
    want.sort();
    assert!(
        !want.is_empty() && want.len() < per_auction.len(),
        "the bound keeps some auctions and deletes others"
    );
    let text = std::fs::read_to_string(sql).expect("sql");
    let keyed = dir.join("per_auction");
    let text = text.replace(
        "INSERT INTO lake SELECT auction, price, dateTime, bidder, auction % 4 FROM bid;",
        &format!(
            "CREATE TABLE per_auction (auction BIGINT, bids BIGINT, top BIGINT, PRIMARY KEY (auction) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{}');
INSERT INTO per_auction SELECT auction, COUNT(*), MAX(price) FROM bid GROUP BY auction HAVING COUNT(*) < 413;",
            keyed.display()
        ),
    );
    std::fs::write(sql, text).expect("sql");
    (keyed, want)
}

/// The keyed table as another reader (Python's `deltalake`) sees it.
fn read_keyed(keyed: &Path) -> Vec<String> {
    let script = r#"
import json, sys
from deltalake import DeltaTable
rows = DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()
print(json.dumps(sorted(f'{r["auction"]}|{r["bids"]}|{r["top"]}' for r in rows)), flush=True)
# pyarrow's threads sometimes abort the interpreter's exit (`terminate
# called without an active exception`) after the answer is out.
import os; os._exit(0)
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(keyed)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut got: Vec<String> = serde_json::from_slice(&out.stdout).expect("json");
    got.sort();
    got
}

/// An updating query into a keyed Delta table (`PRIMARY KEY … NOT
/// ENFORCED`), SIGKILLed once after a checkpoint and started again:
/// another reader sees exactly the query's final result.
#[test]
fn an_updating_query_into_a_keyed_delta_table_applies_its_changes_exactly_once() {
    let Setup {
        dir,
        expected,
        table: _,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    let (keyed, want) = keyed_job(dir.path(), &sql, &expected);
    let (ended, first) = run(&data, &sql, None, Some((2, Duration::from_millis(100))));
    assert_eq!(ended, None, "the job ended before the kill:\n{first}");
    let (ended, second) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{second}");
    assert!(second.contains("restoring from checkpoint"), "{second}");
    assert!(
        format!("{first}{second}").contains("keys changed"),
        "no commit applied changes by key:\n{first}{second}"
    );
    assert_eq!(
        read_keyed(&keyed),
        want,
        "the keyed table is not the query's final result\n{second}"
    );
}

/// The keyed job crashes right after a commit, then again before any
/// further checkpoint completes (the first restart's recovery removed the
/// committed checkpoint's keys files): the third run re-commits that
/// checkpoint as done, without its keys, and ends with the right table.
#[test]
fn a_keyed_delta_commit_replayed_twice_is_skipped_without_its_keys_files() {
    let Setup {
        dir,
        expected,
        table: _,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    let (keyed, want) = keyed_job(dir.path(), &sql, &expected);
    let mut all = String::new();
    for failpoints in [
        Some("delta_sink.committed:2"),
        Some("checkpoint.before_publish:1"),
        None,
    ] {
        let (ended, stderr) = run(&data, &sql, failpoints, None);
        all.push_str(&stderr);
        match (failpoints, ended) {
            (None, Some(true)) | (Some(_), Some(false)) => {}
            (f, e) => panic!("failpoints {f:?}: the run ended {e:?}:\n{stderr}"),
        }
    }
    assert!(all.contains("was committed before"), "no replay was recognised:\n{all}");
    assert_eq!(
        read_keyed(&keyed),
        want,
        "the keyed table is not the query's final result\n{all}"
    );
}

/// Checkpoints of the keyed job fail (their metadata cannot be written)
/// and the job goes on: the sinks' output of a failed checkpoint is
/// committed with the next one, so one commit holds two barriers' changes
/// of a subtask, and a key changed in both must end as the later change
/// says (no row twice, no deleted row back).
#[test]
fn a_keyed_delta_commit_of_an_aborted_and_the_next_checkpoint_applies_both_in_order() {
    let Setup {
        dir,
        expected,
        table: _,
        sql,
        data,
    } = setup(
        "SET 'execution.checkpointing.interval' = '200 ms';
SET 'execution.checkpointing.tolerable-failed-checkpoints' = '10';",
    );
    let (keyed, want) = keyed_job(dir.path(), &sql, &expected);
    let (ended, stderr) = run(&data, &sql, Some("checkpoint.metadata_write:2-4:eio"), None);
    assert_eq!(ended, Some(true), "{stderr}");
    assert!(stderr.contains("checkpoint 2 aborted"), "{stderr}");
    assert_eq!(
        read_keyed(&keyed),
        want,
        "the keyed table is not the query's final result\n{stderr}"
    );
    // Every version, the one that took the aborted checkpoints' changes
    // too, holds each key once.
    let script = r#"
import sys
from collections import Counter
from deltalake import DeltaTable
dt = DeltaTable(sys.argv[1])
for v in range(1, dt.version() + 1):
    rows = DeltaTable(sys.argv[1], version=v).to_pyarrow_table().column("auction").to_pylist()
    twice = [k for k, n in Counter(rows).items() if n > 1]
    if twice:
        print(f"version {v}: keys {twice[:5]} more than once", flush=True)
        import os; os._exit(1)
print("ok", flush=True)
import os; os._exit(0)
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(&keyed)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
