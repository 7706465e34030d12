//! Savepoints and rescaling, end to end through SQL: a windowed job stopped
//! midway with a savepoint and restored at another parallelism (2 → 3 → 1)
//! writes exactly what an undisturbed run writes, on both state backends
//! and from a retained native RocksDB checkpoint; DRAIN fires every window
//! first; NO_CLAIM leaves the savepoint untouched; a savepoint that cannot
//! be restored is refused with a message and nothing starts.

mod common;

use std::path::{Path, PathBuf};

use weir::{Session, StatementResult};

const FILES: usize = 3;
const ROWS_PER_FILE: usize = 4000;

/// Input: three CSV files (`k, v, s, ts`), 20 ms of event time apart, read
/// at a bounded pace so a job can be stopped midway.
fn write_input(dir: &Path) -> PathBuf {
    let input = dir.join("input");
    std::fs::create_dir_all(&input).expect("input dir");
    for f in 0..FILES {
        let mut text = String::new();
        for r in 0..ROWS_PER_FILE {
            let i = r * FILES + f;
            let ms = i * 20;
            text.push_str(&format!(
                "{},{}.{},name-{},1970-01-01 00:{:02}:{:02}.{:03}\n",
                i % 37,
                i % 101,
                // Quarters: sums of doubles are exact in any order (state
                // merged across restores adds in another order).
                [0, 25, 5, 75][i % 4],
                i % 11,
                ms / 60_000,
                ms / 1000 % 60,
                ms % 1000
            ));
        }
        std::fs::write(input.join(format!("part-{f}.csv")), text).expect("write input");
    }
    input
}

/// The tables of the golden re-runs. Sources are paced (2000 lines a
/// second per file, the versions slower) so a job outlasts its first
/// checkpoint on a loaded machine: each run is stopped midway.
fn ddl(input: &Path, out: &Path) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS events (k BIGINT, v DOUBLE, s STRING, ts TIMESTAMP(3),
           WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'scan.lines-per-second' = '2000');
         CREATE TABLE IF NOT EXISTS versions (k BIGINT, v DOUBLE, s STRING, ts TIMESTAMP(3),
           WATERMARK FOR ts AS ts - INTERVAL '1' SECOND, PRIMARY KEY (s) NOT ENFORCED)
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'scan.lines-per-second' = '1000');
         CREATE TABLE IF NOT EXISTS results (g STRING, ws TIMESTAMP(3), we TIMESTAMP(3), a DOUBLE, b DOUBLE, c BIGINT)
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         CREATE TABLE IF NOT EXISTS counts (k BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), n BIGINT, mx TIMESTAMP(3))
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');",
        input.display(),
        input.display(),
        out.display(),
        out.display()
    )
}

/// The windowed queries the golden re-run covers: every window kind, an
/// offset, keyless (one subtask), string and computed keys, a filter, the
/// legacy group-window form, and aggregates with every kind of state
/// (COUNT, SUM, AVG, MIN/MAX of numbers, times and strings, DISTINCT).
const GOLDEN_QUERIES: &[(&str, &str)] = &[
    ("hop", INSERT),
    (
        "tumble_keyless_distinct",
        "INSERT INTO results SELECT 'all', window_start, window_end, SUM(v), AVG(v), COUNT(DISTINCT k)
         FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '7' SECOND))
         GROUP BY window_start, window_end;",
    ),
    (
        "cumulate_string_key",
        "INSERT INTO results SELECT s, window_start, window_end, MIN(v), MAX(v), COUNT(*)
         FROM TABLE(CUMULATE(TABLE events, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
         GROUP BY s, window_start, window_end;",
    ),
    (
        "tumble_offset_filter_computed_key",
        "INSERT INTO results SELECT CAST(k % 5 AS STRING), window_start, window_end, SUM(v), CAST(NULL AS DOUBLE), COUNT(*)
         FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '10' SECOND, INTERVAL '3' SECOND))
         WHERE k % 2 = 0
         GROUP BY k % 5, window_start, window_end;",
    ),
    (
        "legacy_group_window_max_string",
        "INSERT INTO results SELECT MAX(s), TUMBLE_START(ts, INTERVAL '5' SECOND), TUMBLE_END(ts, INTERVAL '5' SECOND),
           AVG(v), MIN(v), COUNT(*)
         FROM events GROUP BY TUMBLE(ts, INTERVAL '5' SECOND), k;",
    ),
];

/// Window Top-N: its kept rows and timers restored at another parallelism.
const WINDOW_TOP_N: &str = "INSERT INTO counts SELECT k, window_start, window_end, rn, ts FROM (
      SELECT k, ts, window_start, window_end,
        ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY k DESC, ts) AS rn
      FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '2' SECOND))
    ) WHERE rn <= 3;";

/// SESSION windows per key over a third of the rows (gaps of 1.5 s and
/// more end sessions of 1 s gap), aggregated, and the TVF on its own
/// (every row with its session's bounds): open sessions and their rows or
/// accumulators across savepoints.
const SESSION_AGGREGATE: &str = "CREATE VIEW IF NOT EXISTS sparse AS SELECT * FROM events WHERE v < 30;
    INSERT INTO counts SELECT k, window_start, window_end, COUNT(*), MAX(ts)
    FROM TABLE(SESSION(TABLE sparse PARTITION BY k, DESCRIPTOR(ts), INTERVAL '1' SECOND))
    GROUP BY k, window_start, window_end;";
const SESSION_ROWS: &str = "CREATE VIEW IF NOT EXISTS sparse AS SELECT * FROM events WHERE v < 30;
    INSERT INTO counts SELECT k, window_start, window_end, CAST(v * 4 AS BIGINT), ts
    FROM TABLE(SESSION(TABLE sparse PARTITION BY k, DESCRIPTOR(ts), INTERVAL '1' SECOND));";

/// A LEFT window join of the events with themselves: each row with the
/// later rows of its key in its 2 s window, or padded.
const WINDOW_JOIN: &str = "INSERT INTO counts SELECT L.k, L.window_start, L.window_end, CAST(R.v * 4 AS BIGINT), L.ts
    FROM (SELECT * FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '2' SECOND))) L
    LEFT JOIN (SELECT * FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '2' SECOND))) R
    ON L.window_start = R.window_start AND L.window_end = R.window_end AND L.k = R.k AND L.ts < R.ts;";

/// A temporal join: each event with the version of `name-(k % 11)` valid
/// at its time (the same rows as a versioned table keyed by `s`), padded
/// before the first one; orders held for the watermark and versions
/// across restores. (The versions are read slower, so the job outlasts a
/// checkpoint even on a loaded machine.)
const TEMPORAL_JOIN: &str = "INSERT INTO counts SELECT e.k, e.ts, r.ts, CAST(r.v * 4 AS BIGINT), e.ts AS ts2
    FROM events e LEFT JOIN versions FOR SYSTEM_TIME AS OF e.ts AS r ON CONCAT('name-', CAST(e.k % 11 AS STRING)) = r.s;";

/// A LEFT interval join of the events with the (slower read) versions of
/// the same rows: each event with the rows of its key within 1 s that pass
/// the condition, padded when none does; rows of both sides held across
/// restores until the watermark frees them.
const INTERVAL_JOIN: &str = "INSERT INTO counts SELECT e.k, e.ts, r.ts, CAST(r.v * 4 AS BIGINT), e.ts AS ts2
    FROM events e LEFT JOIN versions r ON e.k = r.k AND r.v > 50
      AND e.ts BETWEEN r.ts - INTERVAL '1' SECOND AND r.ts + INTERVAL '1' SECOND;";

/// OVER aggregates per key: a RANGE frame of 3 s and a ROWS frame of the
/// 5 rows before (rows held until the watermark, frames across restores).
const OVER_RANGE: &str = "INSERT INTO counts SELECT k, ts, ts AS ts2, COUNT(*) OVER w, MIN(ts) OVER w FROM events
    WINDOW w AS (PARTITION BY k ORDER BY ts RANGE BETWEEN INTERVAL '3' SECOND PRECEDING AND CURRENT ROW);";
const OVER_ROWS: &str =
    "INSERT INTO counts SELECT k, ts, ts AS ts2, CAST(SUM(v) OVER w * 4 AS BIGINT), MIN(ts) OVER w FROM events
    WINDOW w AS (PARTITION BY k ORDER BY ts ROWS BETWEEN 5 PRECEDING AND CURRENT ROW);";

/// `ORDER BY rowtime`: rows held for the watermark, and the last time
/// emitted, across savepoints.
const TEMPORAL_SORT: &str =
    "INSERT INTO counts SELECT k, ts AS ws, ts AS we, CAST(k % 3 AS BIGINT) AS n, ts AS mx FROM events ORDER BY ws, k;";

const INSERT: &str = "INSERT INTO counts SELECT k, window_start, window_end, COUNT(*), MAX(ts)
    FROM TABLE(HOP(TABLE events, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND))
    GROUP BY k, window_start, window_end;";

struct Run<'a> {
    parallelism: usize,
    backend: &'a str,
    from: Option<&'a Path>,
    /// Wait for the job to end.
    sync: bool,
    extra: &'a str,
}

async fn start(session: &mut Session, run: Run<'_>) -> Vec<StatementResult> {
    start_query(session, run, INSERT).await
}

async fn start_query(session: &mut Session, run: Run<'_>, insert: &str) -> Vec<StatementResult> {
    let mut sql = format!(
        "SET 'pipeline.name' = 'golden';
         SET 'parallelism.default' = '{}';
         SET 'state.backend.type' = '{}';
         SET 'execution.checkpointing.interval' = '150 ms';
         SET 'table.dml-sync' = '{}';
         {}",
        run.parallelism, run.backend, run.sync, run.extra
    );
    if let Some(p) = run.from {
        sql.push_str(&format!("SET 'execution.state-recovery.path' = '{}';", p.display()));
    }
    sql.push_str(insert);
    session.execute_sql(&sql).await.expect("job starts")
}

async fn text_of(session: &mut Session, sql: &str) -> String {
    let rows = session.execute_sql(sql).await.expect(sql);
    let Some(StatementResult::Rows(_, batches)) = rows.into_iter().next() else {
        panic!("rows expected from {sql}")
    };
    weir::display::table(&batches)
}

/// Waits (bounded) until the running job 'golden' completed `n` checkpoints.
async fn wait_for_checkpoints(session: &mut Session, n: usize) {
    common::eventually(&format!("{n} completed checkpoints"), 60, async || {
        let text = text_of(session, "SHOW CHECKPOINTS FOR JOB 'golden';").await;
        if text.lines().filter(|l| l.contains("COMPLETED")).count() >= n {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
}

async fn savepoint(session: &mut Session, stmt: &str) -> PathBuf {
    let text = text_of(session, stmt).await;
    let path = text
        .lines()
        .map(|l| l.trim_matches(|c: char| c == '|' || c.is_whitespace()))
        .find(|l| l.contains("savepoint-") || l.starts_with('/'))
        .unwrap_or_else(|| panic!("a savepoint path in\n{text}"));
    let path = PathBuf::from(path);
    assert!(path.join("_metadata").exists(), "{} has no _metadata", path.display());
    path
}

async fn undisturbed(dir: &Path, input: &Path, backend: &str) -> Vec<String> {
    undisturbed_query(dir, input, backend, INSERT).await
}

async fn undisturbed_query(dir: &Path, input: &Path, backend: &str, insert: &str) -> Vec<String> {
    let out = dir.join(format!("expected-{backend}"));
    let mut session = Session::open(dir.join(format!("data-expected-{backend}"))).expect("session");
    session.execute_sql(&ddl(input, &out)).await.expect("ddl");
    start_query(
        &mut session,
        Run {
            parallelism: 2,
            backend,
            from: None,
            sync: true,
            extra: "",
        },
        insert,
    )
    .await;
    let rows = common::committed_lines(&out);
    assert!(rows.len() > 20, "{} rows", rows.len());
    rows
}

/// The golden re-run: `query` undisturbed, then with savepoints midway,
/// restored at parallelism 2, then 3, then 1, on both state backends: the
/// committed output is the same, row for row.
async fn golden_rerun(query: &str) {
    golden_rerun_with(query, "").await;
}

/// [`golden_rerun`] with `extra` SET statements in the disturbed runs.
async fn golden_rerun_with(query: &str, extra: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write_input(dir.path());
    for backend in ["rocksdb", "hashmap"] {
        let expected = undisturbed_query(dir.path(), &input, backend, query).await;
        let out = dir.path().join(format!("out-{backend}"));
        let mut session = Session::open(dir.path().join(format!("data-{backend}"))).expect("session");
        session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
        let mut from: Option<PathBuf> = None;
        for p in [2, 3] {
            let run = Run {
                parallelism: p,
                backend,
                from: from.as_deref(),
                sync: false,
                extra,
            };
            let sp = run_to_savepoint(&mut session, run, query).await;
            let so_far = common::committed_lines(&out);
            assert!(
                so_far.len() < expected.len(),
                "{backend} p={p}: stopped midway ({} of {} rows)",
                so_far.len(),
                expected.len()
            );
            from = Some(sp);
        }
        let run = Run {
            parallelism: 1,
            backend,
            from: from.as_deref(),
            sync: true,
            extra,
        };
        start_query(&mut session, run, query).await;
        let got = common::committed_lines(&out);
        assert_same_rows(&got, &expected, backend);
    }
}

/// Equal row lists, or a short report of the difference.
fn assert_same_rows(got: &[String], expected: &[String], what: &str) {
    if got == expected {
        return;
    }
    let extra: Vec<&String> = got.iter().filter(|r| !expected.contains(r)).take(5).collect();
    let missing: Vec<&String> = expected.iter().filter(|r| !got.contains(r)).take(5).collect();
    panic!(
        "{what}: {} rows, expected {}; first extra {extra:?}; first missing {missing:?}",
        got.len(),
        expected.len()
    );
}

/// A savepoint of one state backend restores into the other: RocksDB at
/// parallelism 2, the heap at 3, RocksDB at 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn savepoints_move_between_state_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write_input(dir.path());
    let query = GOLDEN_QUERIES[0].1;
    let expected = undisturbed_query(dir.path(), &input, "rocksdb", query).await;
    let out = dir.path().join("out");
    let mut session = Session::open(dir.path().join("data")).expect("session");
    session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
    let mut from: Option<PathBuf> = None;
    for (p, backend) in [(2, "rocksdb"), (3, "hashmap")] {
        let run = Run {
            parallelism: p,
            backend,
            from: from.as_deref(),
            sync: false,
            extra: "",
        };
        from = Some(run_to_savepoint(&mut session, run, query).await);
    }
    let run = Run {
        parallelism: 1,
        backend: "rocksdb",
        from: from.as_deref(),
        sync: true,
        extra: "",
    };
    start_query(&mut session, run, query).await;
    assert_same_rows(
        &common::committed_lines(&out),
        &expected,
        "rocksdb -> hashmap -> rocksdb",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_hop() {
    golden_rerun(GOLDEN_QUERIES[0].1).await;
}

/// RocksDB's in-memory buffer overflowing all the time: windows are
/// flushed mid-life, merged with more rows, and fire from RocksDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_hop_with_a_tiny_window_buffer() {
    golden_rerun_with(
        GOLDEN_QUERIES[0].1,
        "SET 'table.exec.window-agg.buffer-size-limit' = '7';",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_temporal_sort() {
    golden_rerun(TEMPORAL_SORT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_session_aggregate() {
    golden_rerun(SESSION_AGGREGATE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_session_rows() {
    golden_rerun(SESSION_ROWS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_window_join() {
    golden_rerun(WINDOW_JOIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_interval_join() {
    golden_rerun(INTERVAL_JOIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_temporal_join() {
    golden_rerun(TEMPORAL_JOIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_over_range() {
    golden_rerun(OVER_RANGE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_over_rows() {
    golden_rerun(OVER_ROWS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_window_top_n() {
    golden_rerun(WINDOW_TOP_N).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_tumble_keyless_distinct() {
    golden_rerun(GOLDEN_QUERIES[1].1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_cumulate_string_key() {
    golden_rerun(GOLDEN_QUERIES[2].1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_tumble_offset_filter_computed_key() {
    golden_rerun(GOLDEN_QUERIES[3].1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_rerun_legacy_group_window() {
    golden_rerun(GOLDEN_QUERIES[4].1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retained_rocksdb_checkpoint_restores_at_another_parallelism() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write_input(dir.path());
    let expected = undisturbed(dir.path(), &input, "rocksdb").await;
    let out = dir.path().join("out");
    let data = dir.path().join("data");
    let mut session = Session::open(&data).expect("session");
    session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
    let retain = "SET 'execution.checkpointing.externalized-checkpoint-retention' = 'RETAIN_ON_CANCELLATION';";
    start(
        &mut session,
        Run {
            parallelism: 2,
            backend: "rocksdb",
            from: None,
            sync: false,
            extra: retain,
        },
    )
    .await;
    wait_for_checkpoints(&mut session, 2).await;
    session.execute_sql("CANCEL JOB 'golden';").await.expect("cancel");
    // The retained checkpoints moved aside; the newest complete one.
    let root = data.join("checkpoints").join("golden");
    let retained = std::fs::read_dir(&root)
        .expect("checkpoint root")
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("retained-"))
        .expect("a retained directory")
        .path();
    let chk = std::fs::read_dir(&retained)
        .expect("retained")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("_metadata").exists())
        .max_by_key(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("chk-"))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .expect("a complete retained checkpoint");
    assert!(common::committed_lines(&out).len() < expected.len(), "cancelled midway");
    start(
        &mut session,
        Run {
            parallelism: 3,
            backend: "rocksdb",
            from: Some(&chk),
            sync: true,
            extra: "",
        },
    )
    .await;
    assert_same_rows(&common::committed_lines(&out), &expected, "retained checkpoint");
}

/// Sum of the `n` column of TUMBLE output rows.
fn counted(rows: &[String]) -> u64 {
    rows.iter()
        .map(|l| {
            l.split(',')
                .nth(3)
                .and_then(|n| n.parse::<u64>().ok())
                .expect("n column")
        })
        .sum()
}

fn state_entries(savepoint: &Path) -> usize {
    let manifest = std::fs::read_to_string(savepoint.join("_metadata")).expect("manifest");
    let mut n = 0;
    for line in manifest.lines().filter(|l| l.contains("\"path\": \"state/window")) {
        let rel = line.split('"').nth(3).expect("path value");
        let bytes = std::fs::read(savepoint.join(rel)).expect("state file");
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).expect("ipc");
        n += reader.map(|b| b.expect("batch").num_rows()).sum::<usize>();
    }
    n
}

fn lines_read(savepoint: &Path) -> u64 {
    let manifest = std::fs::read_to_string(savepoint.join("_metadata")).expect("manifest");
    manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("\"position\": "))
        .map(|v| v.trim_end_matches(',').parse::<u64>().expect("position"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_fires_every_window_before_the_savepoint_and_no_drain_keeps_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write_input(dir.path());
    let tumble = "INSERT INTO counts SELECT k, window_start, window_end, COUNT(*), MAX(ts)
        FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '10' SECOND))
        GROUP BY k, window_start, window_end;";
    for drain in [false, true] {
        let out = dir.path().join(format!("out-{drain}"));
        let mut session = Session::open(dir.path().join(format!("data-{drain}"))).expect("session");
        session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
        session
            .execute_sql(&format!(
                "SET 'pipeline.name' = 'golden'; SET 'parallelism.default' = '2';
                 SET 'execution.checkpointing.interval' = '150 ms'; {tumble}"
            ))
            .await
            .expect("start");
        wait_for_checkpoints(&mut session, 1).await;
        let stmt = if drain {
            "STOP JOB 'golden' WITH SAVEPOINT DRAIN;"
        } else {
            "STOP JOB 'golden' WITH SAVEPOINT;"
        };
        let sp = savepoint(&mut session, stmt).await;
        let rows = common::committed_lines(&out);
        let read = lines_read(&sp);
        assert!(
            read > 0 && read < (FILES * ROWS_PER_FILE) as u64,
            "stopped midway: {read}"
        );
        if drain {
            // Every row read is in a window that fired into the sink.
            assert_eq!(counted(&rows), read, "drained");
            assert_eq!(state_entries(&sp), 0, "a drained savepoint holds no window");
        } else {
            assert!(counted(&rows) < read, "open windows did not fire");
            assert!(state_entries(&sp) > 0, "open windows are in the savepoint");
        }
        let describe = text_of(&mut session, "SHOW SAVEPOINTS FOR JOB 'golden';").await;
        assert!(
            describe.contains(&sp.display().to_string()) && describe.contains(if drain { "true" } else { "false" }),
            "{describe}"
        );
    }
}

/// A session over `dir` with the tables, and the HOP job stopped midway
/// (parallelism 2, RocksDB) with a savepoint: (session, output dir,
/// savepoint).
async fn stopped_with_savepoint(dir: &Path) -> (Session, PathBuf, PathBuf) {
    let input = write_input(dir);
    let out = dir.join("out");
    let mut session = Session::open(dir.join("data")).expect("session");
    session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
    let run = Run {
        parallelism: 2,
        backend: "rocksdb",
        from: None,
        sync: false,
        extra: "",
    };
    let sp = run_to_savepoint(&mut session, run, INSERT).await;
    (session, out, sp)
}

/// Starts `query`, waits for a checkpoint, and stops it with a savepoint.
async fn run_to_savepoint(session: &mut Session, run: Run<'_>, query: &str) -> PathBuf {
    start_query(session, run, query).await;
    wait_for_checkpoints(session, 1).await;
    savepoint(session, "STOP JOB 'golden' WITH SAVEPOINT;").await
}

/// Every file below `dir` with its bytes.
fn snapshot_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).expect("read")));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_claim_leaves_the_savepoint_byte_identical_and_checkpoints_full() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut session, _out, sp) = stopped_with_savepoint(dir.path()).await;
    let before = snapshot_files(&sp);
    start(
        &mut session,
        Run {
            parallelism: 3,
            backend: "rocksdb",
            from: Some(&sp),
            sync: false,
            extra: "",
        },
    )
    .await;
    wait_for_checkpoints(&mut session, 2).await;
    let text = text_of(&mut session, "SHOW CHECKPOINTS FOR JOB 'golden';").await;
    session.execute_sql("STOP JOB 'golden';").await.expect("stop");
    assert_eq!(snapshot_files(&sp), before, "NO_CLAIM: the savepoint is untouched");
    // The first checkpoint after the savepoint uploads all its state.
    let first = text.lines().find(|l| l.contains("COMPLETED")).expect("a checkpoint");
    let cells: Vec<&str> = first.split('|').map(str::trim).collect();
    let (full, incremental) = (cells[9], cells[10]);
    assert_eq!(
        full, incremental,
        "first checkpoint after the savepoint is full:\n{text}"
    );

    // CLAIM: the job owns the savepoint and deletes it once it checkpointed.
    start(
        &mut session,
        Run {
            parallelism: 1,
            backend: "rocksdb",
            from: Some(&sp),
            sync: false,
            extra: "SET 'execution.state-recovery.claim-mode' = 'CLAIM';",
        },
    )
    .await;
    wait_for_checkpoints(&mut session, 1).await;
    session.execute_sql("STOP JOB 'golden';").await.expect("stop");
    assert!(!sp.exists(), "CLAIM deletes the savepoint after a checkpoint");
}

async fn refused(session: &mut Session, from: &Path, extra: &str, expect: &[&str]) {
    let sql = format!(
        "SET 'pipeline.name' = 'golden'; SET 'parallelism.default' = '2';
         SET 'execution.checkpointing.interval' = '150 ms'; {extra}
         SET 'execution.state-recovery.path' = '{}'; {INSERT}",
        from.display()
    );
    let Err(err) = session.execute_sql(&sql).await else {
        panic!("{} was restored", from.display())
    };
    let err = err.to_string();
    for e in expect {
        assert!(err.contains(e), "'{e}' not in: {err}");
    }
    // Nothing started.
    let jobs = text_of(session, "SHOW JOBS;").await;
    assert!(!jobs.contains("RUNNING"), "{jobs}");
    session.execute_sql("RESET;").await.expect("reset");
}

fn copy_dir(from: &Path, to: &Path) {
    for (p, bytes) in snapshot_files(from) {
        let dest = to.join(p.strip_prefix(from).expect("below"));
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::write(dest, bytes).expect("copy");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn savepoints_that_cannot_be_restored_are_refused_and_nothing_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut session, out, sp) = stopped_with_savepoint(dir.path()).await;
    let rows_before = common::committed_lines(&out);
    let state_file = snapshot_files(&sp)
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| p.to_string_lossy().contains("window_"))
        .expect("a window state file");
    let rel = state_file.strip_prefix(&sp).expect("below").to_path_buf();
    let variant = |name: &str| {
        let d = dir.path().join(name);
        copy_dir(&sp, &d);
        d
    };

    let truncated = variant("truncated");
    let f = truncated.join(&rel);
    let len = std::fs::metadata(&f).expect("len").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .and_then(|h| h.set_len(len / 2))
        .expect("truncate");
    refused(&mut session, &truncated, "", &["corrupt", "size"]).await;

    let flipped = variant("flipped");
    let f = flipped.join(&rel);
    let mut bytes = std::fs::read(&f).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&f, bytes).expect("flip");
    refused(&mut session, &flipped, "", &["corrupt", "does not match"]).await;

    let missing = variant("missing");
    std::fs::remove_file(missing.join(&rel)).expect("remove");
    refused(&mut session, &missing, "", &["missing"]).await;

    let future = variant("future");
    let meta = std::fs::read_to_string(future.join("_metadata")).expect("manifest");
    let body = meta
        .rsplit_once("xxh64:")
        .expect("trailer")
        .0
        .replace("\"format\": 2", "\"format\": 99");
    let sum = weir_engine::checkpoint::metadata::checksum(body.as_bytes());
    std::fs::write(future.join("_metadata"), format!("{body}xxh64:{sum}\n")).expect("rewrite");
    refused(&mut session, &future, "", &["format version 99", "reads version 2"]).await;

    refused(
        &mut session,
        &sp,
        "SET 'pipeline.max-parallelism' = '256';",
        &["'pipeline.max-parallelism' = 128", "256"],
    )
    .await;

    // Another query: its window aggregate is another operator.
    let other = INSERT.replace("COUNT(*), MAX(ts)", "COUNT(*), MIN(ts)");
    let sql = format!(
        "SET 'pipeline.name' = 'golden'; SET 'parallelism.default' = '2';
         SET 'execution.checkpointing.interval' = '150 ms';
         SET 'execution.state-recovery.path' = '{}'; {other}",
        sp.display()
    );
    let Err(err) = session.execute_sql(&sql).await else {
        panic!("restored into another query")
    };
    let err = err.to_string();
    assert!(
        err.contains("matches no operator") && err.contains("ignore-unclaimed-state"),
        "{err}"
    );
    assert_eq!(common::committed_lines(&out), rows_before, "nothing ran");
    // Allowed: the unclaimed state is dropped, the new operator starts empty.
    session
        .execute_sql(&format!(
            "SET 'execution.state-recovery.ignore-unclaimed-state' = 'true'; SET 'table.dml-sync' = 'true'; {sql}"
        ))
        .await
        .expect("restored without the unclaimed state");
}

/// `pipeline.operator-uids` pins the window's uid: its state survives a
/// changed filter upstream (which changes the derived uid), and a changed
/// key type is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pinned_uids_keep_window_state_across_a_changed_filter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write_input(dir.path());
    let query = |filter: &str| INSERT.replace("GROUP BY", &format!("WHERE {filter} GROUP BY"));
    let (before, after) = (query("k >= 0"), query("k >= 0 AND k < 1000"));
    let expected = undisturbed_query(dir.path(), &input, "rocksdb", &before).await;
    let out = dir.path().join("out");
    let mut session = Session::open(dir.path().join("data")).expect("session");
    session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
    let pin = "SET 'pipeline.operator-uids' = 'window=counts, sink:counts=counts-sink';";
    let run = Run {
        parallelism: 2,
        backend: "rocksdb",
        from: None,
        sync: false,
        extra: pin,
    };
    let sp = run_to_savepoint(&mut session, run, &before).await;

    // Without the pin the changed query's window is another operator.
    let sql = format!(
        "RESET 'pipeline.operator-uids';
         SET 'pipeline.name' = 'golden'; SET 'execution.checkpointing.interval' = '150 ms';
         SET 'execution.state-recovery.path' = '{}'; {after}",
        sp.display()
    );
    let Err(err) = session.execute_sql(&sql).await else {
        panic!("restored without the pin")
    };
    assert!(err.to_string().contains("counts"), "{err}");
    session.execute_sql("RESET;").await.expect("reset");

    // A pinned window whose key type changed: refused by name.
    let retyped = before
        .replace("SELECT k,", "SELECT CAST(k AS STRING),")
        .replace("GROUP BY k,", "GROUP BY CAST(k AS STRING),");
    let sql = format!(
        "SET 'pipeline.name' = 'golden'; SET 'execution.checkpointing.interval' = '150 ms'; {pin}
         SET 'execution.state-recovery.path' = '{}'; {retyped}",
        sp.display()
    );
    let Err(err) = session.execute_sql(&sql).await else {
        panic!("restored with other key types")
    };
    assert!(err.to_string().contains("key types cannot change"), "{err}");
    session.execute_sql("RESET;").await.expect("reset");

    // Pinned: the state is the window's, the output as if undisturbed.
    let run = Run {
        parallelism: 3,
        backend: "rocksdb",
        from: Some(&sp),
        sync: true,
        extra: pin,
    };
    start_query(&mut session, run, &after).await;
    assert_same_rows(&common::committed_lines(&out), &expected, "pinned uids");
}

/// Every keyed operator records its key types, not only the six kinds of
/// before: a pinned SESSION TVF (rows with their session) whose partition
/// key changed type is refused by name (it used to restore BIGINT keys'
/// state under INT keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pinned_session_window_refuses_changed_key_types() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write_input(dir.path());
    let out = dir.path().join("out");
    let mut session = Session::open(dir.path().join("data")).expect("session");
    session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
    let pin = "SET 'pipeline.operator-uids' = 'session_window=sessions, sink:counts=counts-sink';";
    let run = Run {
        parallelism: 2,
        backend: "rocksdb",
        from: None,
        sync: false,
        extra: pin,
    };
    let sp = run_to_savepoint(&mut session, run, SESSION_ROWS).await;
    let retyped = SESSION_ROWS
        .replace(
            "sparse AS SELECT * FROM",
            "sparse_int AS SELECT CAST(k AS INT) AS k, v, s, ts FROM",
        )
        .replace("TABLE sparse PARTITION", "TABLE sparse_int PARTITION");
    let sql = format!(
        "SET 'pipeline.name' = 'golden'; SET 'execution.checkpointing.interval' = '150 ms'; {pin}
         SET 'execution.state-recovery.path' = '{}'; {retyped}",
        sp.display()
    );
    let Err(err) = session.execute_sql(&sql).await else {
        panic!("restored with other key types")
    };
    let err = err.to_string();
    assert!(
        err.contains("key types cannot change") && err.contains("sessions") && err.contains("(i32)"),
        "{err}"
    );
}

/// Savepoints and checkpoints on an S3 server (SeaweedFS on loopback): the
/// HOP job at parallelism 2 is stopped with a savepoint the store holds,
/// its machine's local data directory is deleted, and another session
/// (a new machine) restores it at parallelism 3 by URL: the output is the
/// undisturbed run's, row for row. `SHOW SAVEPOINTS` lists it by URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_savepoint_on_s3_taken_at_2_restores_at_3_on_a_new_machine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = write_input(dir.path());
    let expected = undisturbed(dir.path(), &input, "rocksdb").await;
    std::fs::create_dir_all(dir.path().join("s3")).expect("s3 dir");
    let s3_dir = dir.path().join("s3");
    let server = tokio::task::spawn_blocking(move || common::s3_server(&s3_dir))
        .await
        .expect("S3 server");
    let on_s3 = format!(
        "SET 'execution.checkpointing.dir' = 's3://{b}/checkpoints';
         SET 'execution.checkpointing.savepoint-dir' = 's3://{b}/savepoints';
         SET 's3.endpoint' = '{}';
         SET 's3.access-key' = '{}';
         SET 's3.secret-key' = '{}';
         SET 's3.path.style.access' = 'true';",
        server.endpoint,
        server.access_key,
        server.secret_key,
        b = server.bucket
    );
    let out = dir.path().join("out");
    let first_machine = dir.path().join("data-a");
    let mut session = Session::open(&first_machine).expect("session");
    session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
    let run = Run {
        parallelism: 2,
        backend: "rocksdb",
        from: None,
        sync: false,
        extra: &on_s3,
    };
    start_query(&mut session, run, INSERT).await;
    wait_for_checkpoints(&mut session, 1).await;
    let text = text_of(&mut session, "STOP JOB 'golden' WITH SAVEPOINT;").await;
    let url = text
        .lines()
        .map(|l| l.trim_matches(|c: char| c == '|' || c.is_whitespace()))
        .find(|l| l.starts_with("s3://"))
        .unwrap_or_else(|| panic!("a savepoint URL in\n{text}"))
        .to_string();
    assert!(url.starts_with("s3://weir/savepoints/savepoint-"), "{url}");
    let listed = text_of(&mut session, "SHOW SAVEPOINTS FOR JOB 'golden';").await;
    assert!(listed.contains(&url), "{listed}");
    // The savepoint is on the store, whole.
    let key = format!("{}/_metadata", url.trim_start_matches("s3://weir/"));
    let client = server.client();
    let meta = {
        use object_store::ObjectStoreExt;
        client
            .get(&object_store::path::Path::from(key.as_str()))
            .await
            .expect("the savepoint's _metadata on the store")
            .bytes()
            .await
            .expect("read")
    };
    assert!(meta.len() > 100);
    let so_far = common::committed_lines(&out);
    assert!(
        so_far.len() < expected.len(),
        "stopped midway ({} of {} rows)",
        so_far.len(),
        expected.len()
    );
    drop(session);
    // A new machine: nothing of the first one's local state.
    std::fs::remove_dir_all(&first_machine).expect("wipe the first machine");
    let mut session = Session::open(dir.path().join("data-b")).expect("session");
    session.execute_sql(&ddl(&input, &out)).await.expect("ddl");
    let from = PathBuf::from(&url);
    let run = Run {
        parallelism: 3,
        backend: "rocksdb",
        from: Some(&from),
        sync: true,
        extra: &on_s3,
    };
    start_query(&mut session, run, INSERT).await;
    assert_same_rows(
        &common::committed_lines(&out),
        &expected,
        "restored from S3 at parallelism 3",
    );
    // How long the download and the state's opening took is reported.
    let described = text_of(&mut session, "DESCRIBE JOB 'golden';").await;
    assert!(
        described.contains(&url) && described.contains("restore_layout_ms") && described.contains("restore_open_ms"),
        "{described}"
    );
}
