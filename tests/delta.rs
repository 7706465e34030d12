//! The Delta Lake sink, read back by delta-rs's Python package
//! (`deltalake`, from the venv `scripts/adbc-venv.sh` makes), not by Weir:
//! every row once, one table version per completed checkpoint that wrote
//! something, each carrying the checkpoint's id as its `txn` version;
//! under SIGKILL at random moments and at the commit's failpoints; with
//! another writer appending to the same table; and the errors a user
//! meets (another schema, a read-only directory). The Delta source reads
//! tables the Python package wrote.

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

/// `parquet.block.size` bounds the files' row groups (pyarrow counts
/// them); every row is still there once. 0 is refused by name.
#[test]
fn parquet_block_size_bounds_the_row_groups_of_a_delta_tables_files() {
    let Setup {
        dir,
        expected,
        table,
        sql,
        data,
    } = setup("");
    let text = std::fs::read_to_string(&sql)
        .expect("sql")
        .replace("'scan.lines-per-second' = '10000'", "'scan.lines-per-second' = '0'");
    let small = text.replace("'64 kb'", "'1 mb', 'parquet.block.size' = '8 kb'");
    std::fs::write(&sql, &small).expect("sql");
    let (ended, stderr) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{stderr}");
    let read = read_table(&table);
    assert_rows(&read, &expected, "small row groups");
    let script = r#"
import sys, pyarrow.parquet as pq
print(max(pq.ParquetFile(f"{sys.argv[1]}/{p}").metadata.num_row_groups for p in sys.argv[2:]))
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(&table)
        .args(&read.files)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let groups: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a count");
    // A partition's file holds ~5 000 rows of ~20 bytes: ~100 KB, so
    // many 8 KB groups; one group would mean the option was ignored.
    assert!(groups >= 4, "row groups of the largest file: {groups}");

    std::fs::write(&sql, text.replace("'64 kb'", "'64 kb', 'parquet.block.size' = '0'")).expect("sql");
    let (ended, stderr) = run(&dir.path().join("data-0"), &sql, None, None);
    assert_eq!(ended, Some(false), "{stderr}");
    assert!(
        stderr.contains("'parquet.block.size' must be more than 0 bytes"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
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
    // Keys files serve one commit each: none is left once the job ended.
    let mut keys_files = vec![];
    walk(&keyed, &mut |f| {
        if f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("keys-")) {
            keys_files.push(f.to_path_buf());
        }
    });
    assert!(keys_files.is_empty(), "keys files left: {keys_files:?}");
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

/// Writes a table with the Python `deltalake` package (another writer than
/// Weir): version 0 ids 0..1000, version 1 appends 1000..1500, partitioned
/// by a region with a space, a ':' and NULL among its values.
fn python_table(path: &Path) {
    let script = r#"
import datetime, json, os, sys, time
import pyarrow as pa
from deltalake import DeltaTable, WriterProperties, write_deltalake
path = sys.argv[1]
regions = ["eu", "us west", "a:b", None]
# Row groups of 64 rows: a file of 250 rows has four, and a restore passes
# over whole ones.
small_groups = WriterProperties(max_row_group_size=64)
def rows(lo, hi):
    ids = list(range(lo, hi))
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([None if i % 11 == 0 else f"n{i % 7}" for i in ids], pa.string()),
        "ts": pa.array([start + datetime.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
        "region": pa.array([regions[i % 4] for i in ids], pa.string()),
    })
write_deltalake(path, rows(0, 1000), partition_by=["region"], writer_properties=small_groups)
write_deltalake(path, rows(1000, 1500), mode="append", partition_by=["region"], writer_properties=small_groups)
# Time travel reads a commit's time from its log file's modification time:
# the two versions a minute apart, clearly before any later commit.
now = time.time()
for v, t in [(0, now - 120), (1, now - 60)]:
    os.utime(os.path.join(path, "_delta_log", f"{v:020}.json"), (t, t))
os._exit(0)
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(path)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// When version `v` of the table was committed, as Delta's time travel
/// reads it (its log file's modification time), in RFC 3339.
fn commit_time(table: &Path, v: u64) -> String {
    let log = table.join("_delta_log").join(format!("{v:020}.json"));
    let modified = std::fs::metadata(&log)
        .and_then(|m| m.modified())
        .expect("log file time");
    chrono::DateTime::<chrono::Utc>::from(modified).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Deletes `predicate`'s rows with the Python package (a new version that
/// removes and rewrites files).
fn python_delete(path: &Path, predicate: &str) {
    let script =
        "import os, sys\nfrom deltalake import DeltaTable\nDeltaTable(sys.argv[1]).delete(sys.argv[2])\nos._exit(0)\n";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(path)
        .arg(predicate)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The rows of ids `ids` as the Delta source test prints them.
fn source_rows(ids: std::ops::Range<i64>) -> Vec<String> {
    let regions = ["eu", "us west", "a:b", "\\N"];
    let mut rows: Vec<String> = ids
        .map(|i| {
            let name = if i % 11 == 0 {
                "\\N".to_string()
            } else {
                format!("n{}", i % 7)
            };
            format!("{i}|{name}|{}", regions[(i % 4) as usize])
        })
        .collect();
    rows.sort();
    rows
}

/// `id|name|region` of a batch of the source (NULL as `\N`).
fn batch_rows(b: &arrow::record_batch::RecordBatch) -> Vec<String> {
    use arrow::array::{Array, AsArray};
    let id = b
        .column_by_name("id")
        .expect("id")
        .as_primitive::<arrow::datatypes::Int64Type>();
    // NULL as `\N`, not as '': the two must not be taken for each other.
    let text = |c: &str, i: usize| {
        let a = b.column_by_name(c).expect("column").as_string::<i32>();
        if a.is_null(i) {
            "\\N".to_string()
        } else {
            a.value(i).to_string()
        }
    };
    (0..b.num_rows())
        .map(|i| format!("{}|{}|{}", id.value(i), text("name", i), text("region", i)))
        .collect()
}

fn lake_def(path: &Path, options: &[(&str, &str)]) -> weir_catalog::TableDef {
    let column = |name: &str, type_name: &str, data_type| weir_catalog::ColumnDef {
        name: name.into(),
        type_name: type_name.into(),
        data_type,
        nullable: true,
        computed: None,
        metadata: None,
    };
    let mut all = BTreeMap::from([
        ("connector".to_string(), "delta".to_string()),
        ("path".to_string(), path.display().to_string()),
    ]);
    for (k, v) in options {
        all.insert(k.to_string(), v.to_string());
    }
    weir_catalog::TableDef {
        name: "lake".into(),
        // Fewer columns than the table has (its `ts` is not read).
        columns: vec![
            column("id", "BIGINT", arrow::datatypes::DataType::Int64),
            column("name", "STRING", arrow::datatypes::DataType::Utf8),
            column("region", "STRING", arrow::datatypes::DataType::Utf8),
        ],
        watermark: None,
        options: all,
        primary_key: None,
        partition_keys: vec![],
    }
}

fn lake_source(
    path: &Path,
    options: &[(&str, &str)],
) -> weir_engine::error::Result<std::sync::Arc<dyn weir_engine::connectors::SourceFactory>> {
    weir_engine::connectors::create_source(
        &lake_def(path, options),
        &weir_engine::paths::PathPolicy::unrestricted(),
        &Default::default(),
    )
}

/// Polls `split` to its end.
fn drain(split: &mut Box<dyn weir_engine::connectors::SourceSplit>) -> Vec<String> {
    let mut rows = vec![];
    loop {
        match split.poll_batch().expect("poll") {
            weir_engine::connectors::SplitPoll::Batch(b) => rows.extend(batch_rows(&b)),
            weir_engine::connectors::SplitPoll::Finished => return rows,
            _ => {}
        }
    }
}

#[test]
fn a_checkpointed_delta_read_restores_into_the_version_it_started_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = dir.path().join("their table");
    python_table(&table);
    // Started on version 1 (the latest): a split per data file.
    let source = lake_source(&table, &[]).expect("source");
    let mut splits = source.create_splits(2).expect("splits");
    assert!(splits.len() >= 8, "a split per file: {}", splits.len());
    assert!(
        splits.iter().all(|s| s.id().ends_with("@v1")),
        "{:?}",
        splits.iter().map(|s| s.id()).collect::<Vec<_>>()
    );
    // Every split read half-way, as a checkpoint would record them.
    let mut read = vec![];
    let mut recorded = vec![];
    for s in &mut splits {
        let mut rows = drain(s);
        rows.truncate(rows.len() / 2);
        recorded.push(weir_engine::checkpoint::SplitPosition {
            split: s.id(),
            position: rows.len() as u64,
            finished: false,
            end: None,
        });
        read.extend(rows);
    }
    // The table moves on (a delete rewrites files), then the job restores.
    python_delete(&table, "id < 100");
    let again = lake_source(&table, &[]).expect("source at version 2");
    let mut restored = again.restore_splits(&recorded).expect("restored");
    assert_eq!(restored.len(), splits.len());
    for s in &mut restored {
        let at = recorded.iter().find(|p| p.split == s.id()).expect("the same split");
        s.seek(at.position).expect("seek");
        read.extend(drain(s));
    }
    read.sort();
    assert_eq!(
        read,
        source_rows(0..1500),
        "version 1's rows once, the delete after it not seen"
    );
}

#[test]
fn a_delta_table_is_read_as_of_a_version_or_a_time_with_its_partition_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = dir.path().join("lake");
    python_table(&table);
    python_delete(&table, "id < 100");
    let times: BTreeMap<u64, String> = (0..2).map(|v| (v, commit_time(&table, v))).collect();
    let check = |options: &[(&str, &str)], ids: std::ops::Range<i64>, what: &str| {
        let source = lake_source(&table, options).expect("source");
        let mut rows = vec![];
        for mut s in source.create_splits(2).expect("splits") {
            rows.extend(drain(&mut s));
        }
        rows.sort();
        let want = source_rows(ids.clone());
        // Not the rows themselves: thousands of them would drown the message.
        assert!(
            rows == want,
            "{what}: {} rows read, ids {ids:?} ({} rows) expected",
            rows.len(),
            want.len()
        );
    };
    check(&[], 100..1500, "latest: version 2");
    check(&[("version", "1")], 0..1500, "version 1");
    check(&[("versionAsOf", "0")], 0..1000, "Flink's delta connector's name");
    check(
        &[("timestamp-as-of", times[&0].as_str())],
        0..1000,
        &format!("as of {}", times[&0]),
    );
    check(
        &[("timestampAsOf", times[&1].as_str())],
        0..1500,
        &format!("as of {}", times[&1]),
    );

    // What a user can get wrong.
    let error = |options: &[(&str, &str)]| match lake_source(&table, options) {
        Ok(_) => panic!("{options:?} is no error"),
        Err(e) => e.to_string(),
    };
    let e = error(&[("version", "9")]);
    assert!(e.contains("version 9") && e.contains("lake"), "{e}");
    let e = error(&[("version", "1"), ("timestamp-as-of", "2024-01-01")]);
    assert!(e.contains("give one"), "{e}");
    let e = error(&[("timestamp-as-of", "yesterday")]);
    assert!(
        e.contains("'timestamp-as-of' = 'yesterday'") && e.contains("YYYY-MM-DD"),
        "{e}"
    );
    let e = error(&[("timestamp-as-of", "2000-01-01")]);
    assert!(e.contains("as of 2000-01-01"), "{e}");
    let e = lake_source(&dir.path().join("nothing"), &[])
        .expect_err("no table")
        .to_string();
    assert!(e.contains("no Delta table"), "{e}");
    let mut wrong = lake_def(&table, &[]);
    wrong.columns[0].data_type = arrow::datatypes::DataType::Int32;
    wrong.columns[0].type_name = "INT".into();
    let e = weir_engine::connectors::create_source(
        &wrong,
        &weir_engine::paths::PathPolicy::unrestricted(),
        &Default::default(),
    )
    .expect_err("a type error")
    .to_string();
    assert!(e.contains("column 'id'") && e.contains("long"), "{e}");
}

#[test]
fn a_job_reads_a_delta_table_with_a_watermark_into_a_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = dir.path().join("lake");
    python_table(&table);
    let out = dir.path().join("out");
    let sql = dir.path().join("job.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'parallelism.default' = '2';
SET 'table.local-time-zone' = 'UTC';
CREATE TABLE lake (id BIGINT, name STRING, ts TIMESTAMP_LTZ(3), region STRING,
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
WITH ('connector' = 'delta', 'path' = '{}');
CREATE TABLE counts (window_start STRING, region STRING, n BIGINT, ids BIGINT)
WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
INSERT INTO counts
SELECT CAST(window_start AS STRING), COALESCE(region, '-'), COUNT(*), SUM(id)
FROM TABLE(TUMBLE(TABLE lake, DESCRIPTOR(ts), INTERVAL '10' MINUTE))
GROUP BY window_start, window_end, region;
",
            table.display(),
            out.display()
        ),
    )
    .expect("sql");
    let (ended, stderr) = run(&dir.path().join("data"), &sql, None, None);
    assert_eq!(ended, Some(true), "{stderr}");
    let mut lines = vec![];
    walk(&out, &mut |f| {
        if !f.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
            lines.extend(std::fs::read_to_string(f).expect("out").lines().map(str::to_string));
        }
    });
    lines.sort();
    // Ids are seconds after 2024-01-01 00:00 UTC: 0..1500 s is three
    // 10-minute windows (600 ids each, the last 300), a region every
    // fourth id.
    let mut expected = vec![];
    for (w, range) in [(0, 0..600), (1, 600..1200), (2, 1200..1500)] {
        for (r, region) in ["eu", "us west", "a:b", "-"].iter().enumerate() {
            let ids: Vec<i64> = range.clone().filter(|i| i % 4 == r as i64).collect();
            expected.push(format!(
                "2024-01-01 00:{}0:00.000,{region},{},{}",
                w,
                ids.len(),
                ids.iter().sum::<i64>()
            ));
        }
    }
    expected.sort();
    assert_eq!(lines, expected);
}

/// The lines of the CSV files below `dir`, sorted.
fn csv_lines(dir: &Path) -> Vec<String> {
    let mut lines = vec![];
    walk(dir, &mut |f| {
        if !f.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
            lines.extend(std::fs::read_to_string(f).expect("csv").lines().map(str::to_string));
        }
    });
    lines.sort();
    lines
}

/// A partition column whose values need escaping in a path.
const KIND: &str = "CASE WHEN auction % 3 = 0 THEN 'a b' WHEN auction % 3 = 1 THEN 'c:d' END";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_checkpoints_names_each_delta_version_and_the_source_reads_the_table_back() {
    use weir::{Session, StatementResult};
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    let (direct, back) = (dir.path().join("direct"), dir.path().join("back"));
    let mut session = Session::open(dir.path().join("data")).expect("session");
    session
        .execute_sql(&format!(
            "SET 'parallelism.default' = '2';
SET 'table.dml-sync' = 'true';
SET 'execution.checkpointing.interval' = '100 ms';
CREATE TABLE bid (auction BIGINT, price BIGINT)
WITH ('connector' = 'nexmark', 'nexmark.events' = '60000', 'nexmark.events-per-second' = '60000');
CREATE TABLE lake (auction BIGINT, price BIGINT, kind STRING) PARTITIONED BY (kind)
WITH ('connector' = 'delta', 'path' = '{}');
CREATE TABLE direct (auction BIGINT, price BIGINT, kind STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
CREATE TABLE back (auction BIGINT, price BIGINT, kind STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
SET 'pipeline.name' = 'into-lake';
INSERT INTO lake SELECT auction, price, {KIND} FROM bid;",
            lake.display(),
            direct.display(),
            back.display()
        ))
        .await
        .expect("job into the lake");
    let rows = session
        .execute_sql("SHOW CHECKPOINTS FOR JOB 'into-lake';")
        .await
        .expect("show");
    let Some(StatementResult::Rows(_, batches)) = rows.into_iter().next() else {
        panic!("rows expected")
    };
    let text = weir::display::table(&batches);
    let versions: Vec<u64> = text
        .split("lake: Delta version ")
        .skip(1)
        .map(|rest| {
            rest.split(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .expect("a version number")
        })
        .collect();
    assert!(!versions.is_empty(), "commits listed:\n{text}");
    assert!(
        versions.windows(2).all(|w| w[1] == w[0] + 1),
        "one version per committing checkpoint, none skipped or doubled: {versions:?}\n{text}"
    );
    // Another reader: the version, and the partition values as written.
    let script = "import json, os, sys\nfrom deltalake import DeltaTable\ndt = DeltaTable(sys.argv[1])\nkinds = sorted(set(str(k) for k in dt.to_pyarrow_table().column('kind').to_pylist()))\nprint(json.dumps([dt.version(), kinds]))\nsys.stdout.flush()\nos._exit(0)\n";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(&lake)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (read, kinds): (u64, Vec<String>) = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        kinds,
        ["None", "a b", "c:d"],
        "partition values with a space, a ':' and NULL"
    );
    assert_eq!(versions.last(), Some(&read), "the last listed is the table's version");

    // Read back through the Delta source: the rows the generator gave.
    session
        .execute_sql(&format!(
            "SET 'pipeline.name' = 'direct';
INSERT INTO direct SELECT auction, price, {KIND} FROM bid;
SET 'pipeline.name' = 'from-lake';
INSERT INTO back SELECT auction, price, kind FROM lake;"
        ))
        .await
        .expect("jobs out of the lake");
    let (want, got) = (csv_lines(&direct), csv_lines(&back));
    assert!(want.len() > 50_000, "{}", want.len());
    assert!(
        want == got,
        "{} rows generated, {} read back from the table",
        want.len(),
        got.len()
    );

    // A query that reads none of the table's columns still reads its rows.
    let ones = dir.path().join("ones");
    session
        .execute_sql(&format!(
            "CREATE TABLE ones (one INT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
SET 'pipeline.name' = 'ones';
INSERT INTO ones SELECT 1 FROM lake;",
            ones.display()
        ))
        .await
        .expect("a job reading no column");
    assert_eq!(csv_lines(&ones).len(), want.len());
}

/// DuckDB's answer to `query` (its rows as `a|b|c`, sorted), the reference
/// a keyed table must equal.
fn duckdb_answer(query: &str) -> Vec<String> {
    let script = r#"
import json, os, sys
import duckdb
rows = duckdb.sql(sys.argv[1]).fetchall()
print(json.dumps(sorted("|".join(str(v) for v in r) for r in rows)), flush=True)
os._exit(0)
"#;
    let out = Command::new(python())
        .args(["-c", script, query])
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// A GROUP BY over a join (bids of auctions, auctions of sellers; some
/// auctions have no seller row) into a keyed Delta table, with a HAVING
/// that deletes a seller once it passes a bound: SIGKILLed after a
/// checkpoint and started again, the table another reader sees equals
/// DuckDB's answer over the same input files.
#[test]
fn a_group_by_over_a_join_into_a_keyed_delta_table_equals_duckdbs_answer_after_a_sigkill() {
    let Setup {
        dir,
        expected: _,
        table: _,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    let auctions = dir.path().join("auctions.csv");
    let mut text = String::new();
    // Auctions 0..90 of 97 have a seller: bids of the others join nothing.
    for a in 0..90 {
        text.push_str(&format!("{a},seller-{}\n", a % 7));
    }
    std::fs::write(&auctions, text).expect("auctions");
    let keyed = dir.path().join("per_seller");
    let job = std::fs::read_to_string(&sql).expect("sql").replace(
        "INSERT INTO lake SELECT auction, price, dateTime, bidder, auction % 4 FROM bid;",
        &format!(
            "CREATE TABLE auction (id BIGINT, seller STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
CREATE TABLE per_seller (seller STRING, bids BIGINT, top BIGINT, total BIGINT, PRIMARY KEY (seller) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{}');
INSERT INTO per_seller
SELECT a.seller, COUNT(*), MAX(b.price), SUM(b.price)
FROM bid AS b JOIN auction AS a ON b.auction = a.id
GROUP BY a.seller HAVING COUNT(*) < 5361;",
            auctions.display(),
            keyed.display()
        ),
    );
    std::fs::write(&sql, job).expect("sql");
    let want = duckdb_answer(&format!(
        "SELECT a.seller, count(*), max(b.price), sum(b.price)
         FROM read_csv('{}/*.csv', header = false, columns = {{'auction': 'BIGINT', 'price': 'BIGINT', 'ts': 'VARCHAR', 'bidder': 'VARCHAR'}}) AS b
         JOIN read_csv('{}', header = false, columns = {{'id': 'BIGINT', 'seller': 'VARCHAR'}}) AS a ON b.auction = a.id
         GROUP BY a.seller HAVING count(*) < 5361",
        dir.path().join("bids").display(),
        auctions.display()
    ));
    assert!(
        !want.is_empty() && want.len() < 7,
        "the bound keeps some sellers and deletes others: {want:?}"
    );

    let (ended, first) = run(&data, &sql, None, Some((2, Duration::from_millis(100))));
    assert_eq!(ended, None, "the job ended before the kill:\n{first}");
    let (ended, second) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{second}");
    assert!(second.contains("restoring from checkpoint"), "{second}");
    let script = r#"
import json, os, sys
from deltalake import DeltaTable
rows = DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()
print(json.dumps(sorted(f'{r["seller"]}|{r["bids"]}|{r["top"]}|{r["total"]}' for r in rows)), flush=True)
os._exit(0)
"#;
    let out = Command::new(python())
        .args(["-c", script])
        .arg(&keyed)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<String> = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(got, want, "the keyed table is not DuckDB's answer\n{second}");
}

/// A column added to the table after some files were written: those files
/// read it as NULL (as every Delta reader does), the later ones as written.
#[test]
fn a_column_added_to_a_delta_table_is_null_in_the_files_written_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = dir.path().join("grown");
    let script = r#"
import os, sys
import pyarrow as pa
from deltalake import write_deltalake
path = sys.argv[1]
write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))
write_deltalake(path, pa.table({"id": pa.array([3], pa.int64()), "name": ["c"], "region": ["eu"]}),
                mode="append", schema_mode="merge")
os._exit(0)
"#;
    let out = Command::new(python())
        .args(["-c", script])
        .arg(&table)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let source = lake_source(&table, &[]).expect("source");
    let mut rows = vec![];
    for mut s in source.create_splits(1).expect("splits") {
        rows.extend(drain(&mut s));
    }
    rows.sort();
    assert_eq!(rows, ["1|a|\\N", "2|b|\\N", "3|c|eu"]);
}

/// Rows `from..to` as the other writer appends them to `lake`, and as the
/// reader prints them.
fn other_rows(from: u64, to: u64) -> Vec<String> {
    (from..to)
        .map(|n| {
            let auction = 1000 + n;
            format!(
                "{auction}|{n}|2030-01-01 00:{:02}:{:02}.000|other-{n}|{}",
                n / 60,
                n % 60,
                auction % 4
            )
        })
        .collect()
}

/// Runs a Python snippet on the table `path` (`sys.argv[1]`), the
/// further arguments after it.
fn python_on(path: &Path, script: &str, args: &[String]) {
    // `os._exit`: pyarrow's threads sometimes abort the interpreter's
    // exit after the work is done.
    let script = format!("{script}\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n");
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(path)
        .args(args)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

const APPEND_ROWS: &str = r#"
import sys
import pyarrow as pa
from datetime import datetime, timedelta
from deltalake import write_deltalake
ns = range(int(sys.argv[2]), int(sys.argv[3]))
write_deltalake(sys.argv[1], pa.table({
    "auction": pa.array([1000 + n for n in ns], pa.int64()),
    "price": pa.array(list(ns), pa.int64()),
    "dateTime": pa.array([datetime(2030, 1, 1) + timedelta(seconds=n) for n in ns], pa.timestamp("us")),
    "bidder": pa.array([f"other-{n}" for n in ns], pa.string()),
    "bucket": pa.array([(1000 + n) % 4 for n in ns], pa.int64()),
}), mode="append")
"#;

/// The copy holds exactly `expected` (a table not made yet holds nothing).
fn copy_holds(copy: &Path, expected: &[String]) -> Result<(), String> {
    if !copy.join("_delta_log").exists() {
        return Err("no table yet".into());
    }
    let read = read_table(copy);
    if read.rows == expected {
        Ok(())
    } else {
        Err(format!("{} rows of {}", read.rows.len(), expected.len()))
    }
}

/// A continuous copy's setup: `lake` written by the setup's job (the
/// snapshot), and a job copying it continuously into `copy` at
/// `parallelism`, checkpoints every `checkpoint_ms`, the log looked at
/// every `monitor_ms`. Returns the setup, the copy's path, SQL and data dir.
fn continuous_copy(parallelism: usize, checkpoint_ms: u64, monitor_ms: u64) -> (Setup, PathBuf, PathBuf, PathBuf) {
    let setup = setup("");
    let text = std::fs::read_to_string(&setup.sql).expect("sql");
    std::fs::write(
        &setup.sql,
        text.replace("'scan.lines-per-second' = '10000'", "'scan.lines-per-second' = '0'"),
    )
    .expect("sql");
    let (ended, stderr) = run(&setup.data, &setup.sql, None, None);
    assert_eq!(ended, Some(true), "{stderr}");
    let copy = setup.dir.path().join("copy");
    let copy_sql = setup.dir.path().join("copy.sql");
    std::fs::write(
        &copy_sql,
        format!(
            "SET 'pipeline.name' = 'delta-copy';
SET 'parallelism.default' = '{parallelism}';
SET 'execution.checkpointing.interval' = '{checkpoint_ms} ms';
CREATE TABLE lake (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), bidder STRING, bucket BIGINT)
WITH ('connector' = 'delta', 'path' = '{}', 'scan.mode' = 'continuous', 'source.monitor-interval' = '{monitor_ms} ms');
CREATE TABLE copy (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), bidder STRING, bucket BIGINT)
PARTITIONED BY (bucket) WITH ('connector' = 'delta', 'path' = '{}');
INSERT INTO copy SELECT * FROM lake;
",
            setup.table.display(),
            copy.display()
        ),
    )
    .expect("sql");
    let copy_data = setup.dir.path().join("copy-data");
    (setup, copy, copy_sql, copy_data)
}

/// `'scan.mode' = 'continuous'`: a job copies a Delta table (Weir's
/// snapshot, then the commits another writer appends: two appends, an
/// OPTIMIZE between them that rewrites rows already read, one more while
/// the job is SIGKILLed) into another; after the restart the copy has
/// every row once. A DELETE on the table then stops the read with an
/// error naming the commit.
#[test]
fn a_continuous_delta_read_takes_each_appended_commit_once_across_a_sigkill() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (
        Setup {
            dir: _dir,
            mut expected,
            table,
            ..
        },
        copy,
        copy_sql,
        copy_data,
    ) = continuous_copy(1, 200, 100);
    let start = |kill: Arc<AtomicBool>| {
        let (data, sql) = (copy_data.clone(), copy_sql.clone());
        std::thread::spawn(move || {
            common::run_armed(&data, &sql, None, 300, Some(Duration::ZERO), &|_| {
                kill.load(Ordering::SeqCst)
            })
        })
    };
    let kill = Arc::new(AtomicBool::new(false));
    let job = start(kill.clone());
    common::eventually_blocking("the snapshot in the copy", 120, || {
        assert!(!job.is_finished(), "the continuous job ended");
        copy_holds(&copy, &expected)
    });

    let append = |from: u64, to: u64, expected: &mut Vec<String>| {
        python_on(&table, APPEND_ROWS, &[from.to_string(), to.to_string()]);
        expected.extend(other_rows(from, to));
        expected.sort();
    };
    append(0, 50, &mut expected);
    // Rewrites every file (rows already read): appends nothing.
    python_on(
        &table,
        "import sys\nfrom deltalake import DeltaTable\nDeltaTable(sys.argv[1]).optimize.compact()",
        &[],
    );
    append(50, 80, &mut expected);
    common::eventually_blocking("the appended commits in the copy", 120, || {
        assert!(!job.is_finished(), "the continuous job ended");
        copy_holds(&copy, &expected)
    });
    kill.store(true, Ordering::SeqCst);
    let killed = job.join().expect("job");
    assert!(killed.exited.is_none(), "not killed:\n{}", killed.stderr);

    // While the job is away.
    append(80, 100, &mut expected);
    let job = start(Arc::new(AtomicBool::new(false)));
    common::eventually_blocking("the commit made while the job was away", 120, || {
        assert!(!job.is_finished(), "the continuous job ended");
        copy_holds(&copy, &expected)
    });

    python_on(
        &table,
        "import sys\nfrom deltalake import DeltaTable\nDeltaTable(sys.argv[1]).delete('auction = 1010')",
        &[],
    );
    let ended = job.join().expect("job");
    assert_eq!(ended.exited.map(|s| s.success()), Some(false), "{}", ended.stderr);
    assert!(
        ended.stderr.contains("deletes or updates rows")
            && ended.stderr.contains("a continuous read takes appended rows only"),
        "{}",
        ended.stderr
    );
    assert!(!ended.stderr.contains("panicked"), "{}", ended.stderr);
    assert_rows(&read_table(&copy), &expected, "after the DELETE");
}

/// A continuous read's options: the interval without the mode, both
/// names of the mode, a zero interval: errors naming them.
#[test]
fn a_continuous_reads_options_are_checked_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lake = dir.path().join("lake");
    python_on(&lake, APPEND_ROWS, &["0".into(), "3".into()]);
    for (with, error) in [
        (
            "'source.monitor-interval' = '1 s'",
            "'source.monitor-interval' is for a continuous read: set 'scan.mode' = 'continuous' too",
        ),
        (
            "'scan.mode' = 'continuous', 'mode' = 'streaming'",
            "'scan.mode' and 'mode' name the same thing; give one",
        ),
        (
            "'scan.mode' = 'continuous', 'source.monitor-interval' = '0 s'",
            "'source.monitor-interval' must be more than 0",
        ),
    ] {
        let sql = dir.path().join("job.sql");
        std::fs::write(
            &sql,
            format!(
                "CREATE TABLE lake (auction BIGINT, price BIGINT) WITH ('connector' = 'delta', 'path' = '{}', {with});
CREATE TABLE out (auction BIGINT, price BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO out SELECT * FROM lake;
",
                lake.display()
            ),
        )
        .expect("sql");
        let (ended, stderr) = run(&dir.path().join("data"), &sql, None, None);
        assert_eq!(ended, Some(false), "{with}: {stderr}");
        assert!(stderr.contains(error), "{with}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A Top-N (the three highest bids of each bucket, their rank a column)
/// into a keyed Delta table keyed by (bucket, rank), SIGKILLed once after
/// a checkpoint and started again: another reader sees exactly the top
/// three of each bucket, ranked.
#[test]
fn a_top_n_into_a_keyed_delta_table_holds_each_buckets_top_three_after_a_sigkill() {
    let Setup {
        dir,
        expected,
        table: _,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    // Ranked by price, then auction, then time (unique): one answer.
    let mut by_bucket: BTreeMap<i64, Vec<(i64, i64, String)>> = BTreeMap::new();
    for row in &expected {
        let c: Vec<&str> = row.split('|').collect();
        let (auction, price): (i64, i64) = (c[0].parse().expect("auction"), c[1].parse().expect("price"));
        by_bucket
            .entry(auction % 4)
            .or_default()
            .push((price, auction, c[2].to_string()));
    }
    let mut want = vec![];
    for (bucket, mut rows) in by_bucket {
        rows.sort_by(|a, b| b.cmp(a));
        for (i, (price, auction, ts)) in rows.into_iter().take(3).enumerate() {
            want.push(format!("{bucket}|{}|{auction}|{price}|{ts}", i + 1));
        }
    }
    want.sort();
    let top = dir.path().join("top");
    let text = std::fs::read_to_string(&sql).expect("sql").replace(
        "INSERT INTO lake SELECT auction, price, dateTime, bidder, auction % 4 FROM bid;",
        &format!(
            "CREATE TABLE top3 (bucket BIGINT, rn BIGINT, auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  PRIMARY KEY (bucket, rn) NOT ENFORCED)
WITH ('connector' = 'delta', 'path' = '{}');
INSERT INTO top3 SELECT bucket, rn, auction, price, dateTime FROM (
  SELECT auction % 4 AS bucket, auction, price, dateTime,
    ROW_NUMBER() OVER (PARTITION BY auction % 4 ORDER BY price DESC, auction DESC, dateTime DESC) AS rn
  FROM bid)
WHERE rn <= 3;",
            top.display()
        ),
    );
    std::fs::write(&sql, text).expect("sql");
    let (ended, first) = run(&data, &sql, None, Some((2, Duration::from_millis(100))));
    assert_eq!(ended, None, "the job ended before the kill:\n{first}");
    let (ended, second) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{second}");
    assert!(second.contains("restoring from checkpoint"), "{second}");
    let script = r#"
import json, sys
from deltalake import DeltaTable
rows = DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()
print(json.dumps(sorted(
    f'{r["bucket"]}|{r["rn"]}|{r["auction"]}|{r["price"]}|{r["dateTime"].isoformat(sep=" ", timespec="milliseconds")}'
    for r in rows)), flush=True)
import os; os._exit(0)
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(&top)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<String> = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(got, want, "the table is not the Top-N's result\n{second}");
}

/// The keyed job with its third commit paused between its read of the
/// table and its commit while `between` (Python on the keyed table)
/// commits as another writer; then let go. Returns the job's stderr (it
/// must end well), the keyed table, the query's result and what `between`
/// printed.
fn keyed_commit_interrupted_by(between: &str) -> (String, PathBuf, Vec<String>, String, tempfile::TempDir) {
    let Setup {
        dir,
        expected,
        table: _,
        sql,
        data,
    } = setup("SET 'execution.checkpointing.interval' = '200 ms';");
    let (keyed, want) = keyed_job(dir.path(), &sql, &expected);
    let gate = dir.path().join("gate");
    std::fs::create_dir_all(&gate).expect("gate dir");
    // The third commit: the table has the first two's files (each
    // subtask's) to compact.
    let mut child = common::start_run_env(
        &data,
        &sql,
        Some("delta_sink.before_commit:3:pause"),
        &[("WEIR_FAILPOINT_DIR", &gate)],
    );
    let (text, reader) = common::collect_stderr(&mut child);
    common::eventually_blocking("the third commit paused", 120, || {
        let t = text.lock().expect("stderr").clone();
        if t.contains("failpoint delta_sink.before_commit hit 3 time(s): paused") {
            return Ok(());
        }
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "the job ended before its third commit:\n{t}"
        );
        Err(String::new())
    });
    let out = Command::new(python())
        .arg("-c")
        .arg(between)
        .arg(&keyed)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    std::fs::write(gate.join("delta_sink.before_commit.resume"), "").expect("resume");
    let status = child.wait().expect("wait");
    reader.join().expect("stderr reader");
    let stderr = text.lock().expect("stderr").clone();
    assert!(status.success(), "{stderr}");
    (stderr, keyed, want, said, dir)
}

/// A compaction (another writer's OPTIMIZE) commits between a keyed
/// commit's read of the table and its own commit, removing files the
/// keyed commit rewrites: the keyed commit fails (delta-rs alone would let
/// it land) and Weir makes it again from a fresh read, and the table ends as the
/// query's result (no row lost to the compaction, none doubled).
#[test]
fn a_compaction_between_a_keyed_commits_read_and_its_commit_is_a_conflict_tried_again() {
    let compact = r#"
import sys
from deltalake import DeltaTable
dt = DeltaTable(sys.argv[1])
before = dt.version()
m = dt.optimize.compact()
after = DeltaTable(sys.argv[1]).version()
print(m["numFilesRemoved"], after - before, after, flush=True)
import os; os._exit(0)
"#;
    let (stderr, keyed, want, said, _dir) = keyed_commit_interrupted_by(compact);
    let numbers: Vec<u64> = said.split_whitespace().map(|n| n.parse().expect("a number")).collect();
    let [removed, versions, compacted] = numbers[..] else {
        panic!("three numbers: {said}");
    };
    assert!(
        removed >= 2 && versions == 1,
        "the compaction committed nothing to conflict with: {said}"
    );
    assert!(
        stderr.contains("conflicts with another writer's commit") && stderr.contains("trying again"),
        "no conflict was retried:\n{stderr}"
    );
    assert_eq!(
        read_keyed(&keyed),
        want,
        "the keyed table is not the query's final result\n{stderr}"
    );
    // No version from the compaction on holds a key twice (delta-rs alone
    // let the keyed commit land over it, and the compacted file brought
    // the keys' old rows back beside their new ones).
    let dups = r#"
import sys
from deltalake import DeltaTable
latest = DeltaTable(sys.argv[1]).version()
worst = 0
for v in range(int(sys.argv[2]), latest + 1):
    keys = DeltaTable(sys.argv[1], version=v).to_pyarrow_table().column("auction").to_pylist()
    worst = max(worst, len(keys) - len(set(keys)))
print(worst)
import os; os._exit(0)
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(dups)
        .arg(&keyed)
        .arg(compacted.to_string())
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "a version after the compaction holds keys twice\n{stderr}"
    );
}

/// A writer killed while delta-rs uploads a large file in parts leaves a
/// multipart upload in progress (invisible, billed); the next attempt's
/// recovery aborts it, so none is left once the job ends.
#[test]
fn a_killed_delta_writers_multipart_uploads_on_s3_are_aborted_by_recovery() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s3_dir = dir.path().join("s3");
    std::fs::create_dir_all(&s3_dir).expect("s3 dir");
    let s3 = common::s3_server(&s3_dir);
    let sql = dir.path().join("job.sql");
    // 60 000 rows of 1 000 random characters: parts of 5 MB go up long
    // before the first checkpoint (a minute away) or the end.
    std::fs::write(
        &sql,
        format!(
            "{}
SET 'pipeline.name' = 'delta-big';
SET 'parallelism.default' = '1';
SET 'execution.checkpointing.interval' = '1 min';
CREATE TABLE gen (id BIGINT, s STRING) WITH ('connector' = 'datagen', 'number-of-rows' = '60000',
  'rows-per-second' = '20000', 'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '60000',
  'fields.s.length' = '1000');
CREATE TABLE big (id BIGINT, s STRING) WITH ('connector' = 'delta', 'path' = 's3://{}/big',
  'sink.rolling-policy.file-size' = '1 gb', 'parquet.compression' = 'uncompressed');
INSERT INTO big SELECT * FROM gen;
",
            s3.checkpoint_settings(),
            s3.bucket
        ),
    )
    .expect("sql");
    let data = dir.path().join("data");
    let first = common::run_armed(&data, &sql, None, 180, Some(Duration::ZERO), &|_| {
        !s3.multipart_uploads().is_empty()
    });
    assert!(
        first.exited.is_none(),
        "the job ended before an upload began:\n{}",
        first.stderr
    );
    let left = s3.multipart_uploads();
    assert!(!left.is_empty(), "no upload in progress after the kill");
    let (ended, second) = run(&data, &sql, None, None);
    assert_eq!(ended, Some(true), "{second}");
    assert!(second.contains("upload(s) of failed attempts' files"), "{second}");
    let now = s3.multipart_uploads();
    assert!(
        now.iter().all(|u| !left.contains(u)),
        "the killed attempt's uploads {left:?} are still in progress: {now:?}\n{second}"
    );
    let read = read_count(&format!("s3://{}/big", s3.bucket), &s3.delta_storage_options());
    assert_eq!(read, 60_000, "{second}");
}

/// The rows of the table at `uri` (another reader's count).
fn read_count(uri: &str, storage_options: &str) -> u64 {
    let out = Command::new(python())
        .arg("-c")
        .arg(
            // `os._exit`: pyarrow's threads sometimes abort the
            // interpreter's exit after the answer is out.
            "import json, os, sys\nfrom deltalake import DeltaTable\n\
             print(DeltaTable(sys.argv[1], storage_options=json.loads(sys.argv[2])).to_pyarrow_table().num_rows, flush=True)\n\
             os._exit(0)",
        )
        .arg(uri)
        .arg(storage_options)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a count")
}

/// A continuous read at parallelism 2, SIGKILLed at random moments while
/// another writer appends (files found by one reader but not yet in a
/// checkpoint, checkpoints holding some of a commit's files): after the
/// last restart the copy holds every row once.
#[test]
fn sigkill_at_random_moments_of_a_continuous_delta_read_loses_and_duplicates_nothing() {
    let (
        Setup {
            dir: _dir,
            mut expected,
            table,
            ..
        },
        copy,
        copy_sql,
        copy_data,
    ) = continuous_copy(2, 100, 30);
    let mut seed = 0x5eed_c0b1_u64;
    let mut all = String::new();
    for round in 0..4u64 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let after = Duration::from_millis((seed >> 33) % 300);
        let job = {
            let (data, sql) = (copy_data.clone(), copy_sql.clone());
            std::thread::spawn(move || {
                common::run_armed(&data, &sql, None, 120, Some(after), &|stderr| {
                    stderr.contains(" completed in ")
                })
            })
        };
        // Two commits while the job runs (and is killed).
        for part in 0..2 {
            let from = round * 40 + part * 20;
            python_on(&table, APPEND_ROWS, &[from.to_string(), (from + 20).to_string()]);
            expected.extend(other_rows(from, from + 20));
        }
        let run = job.join().expect("job");
        assert!(run.exited.is_none(), "the continuous job ended:\n{}", run.stderr);
        all.push_str(&run.stderr);
    }
    expected.sort();
    assert!(all.contains("restoring from checkpoint"), "no run restored:\n{all}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let job = {
        let (data, sql, stop) = (copy_data.clone(), copy_sql.clone(), stop.clone());
        std::thread::spawn(move || {
            common::run_armed(&data, &sql, None, 120, Some(Duration::ZERO), &|_| {
                stop.load(std::sync::atomic::Ordering::SeqCst)
            })
        })
    };
    common::eventually_blocking("every row in the copy", 120, || {
        assert!(!job.is_finished(), "the continuous job ended");
        copy_holds(&copy, &expected)
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    job.join().expect("job");
    assert_rows(&read_table(&copy), &expected, "after the SIGKILLs");
}

/// Another writer's blind append (a key of its own) between a keyed
/// commit's read and its commit: the commit goes on top of it, not read
/// again; both the query's rows and the appended one are there once.
#[test]
fn an_append_between_a_keyed_commits_read_and_its_commit_is_gone_on_top_of() {
    let append = r#"
import sys
import pyarrow as pa
from deltalake import write_deltalake
write_deltalake(sys.argv[1], pa.table({
    "auction": pa.array([5000], pa.int64()),
    "bids": pa.array([1], pa.int64()),
    "top": pa.array([1], pa.int64()),
}), mode="append")
import os; os._exit(0)
"#;
    let (stderr, keyed, mut want, _, _dir) = keyed_commit_interrupted_by(append);
    assert!(
        !stderr.contains("conflicts with another writer's commit"),
        "an append made the keyed commit read again:\n{stderr}"
    );
    assert!(stderr.contains("only append: it goes on top of them"), "{stderr}");
    want.push("5000|1|1".to_string());
    want.sort();
    assert_eq!(read_keyed(&keyed), want, "{stderr}");
}
