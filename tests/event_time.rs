//! Event time end to end: out-of-order input within the watermark bound
//! gives the same windows as sorted input; rows beyond the bound are
//! dropped and counted as late. `on-event` emission makes lateness exact
//! (per row), so the counts are deterministic.

use weir::{Session, StatementResult};

/// Runs a TUMBLE count/sum over `file`; returns (sorted rows, late rows).
async fn windows_of(file: &str, parallelism: usize) -> (Vec<String>, u64) {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut session = Session::open(dir.path()).expect("session");
    let setup = format!(
        "SET 'parallelism.default' = '{parallelism}';
         SET 'table.dml-sync' = 'true';
         CREATE TABLE orders (id BIGINT, `user` STRING, amount BIGINT, ts TIMESTAMP(3),
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json',
               'scan.watermark.emit.strategy' = 'on-event');
         CREATE TABLE out (ws TIMESTAMP(3), `user` STRING, n BIGINT, total BIGINT)
         WITH ('connector' = 'filesystem', 'path' = '{}/out', 'format' = 'json');
         INSERT INTO out SELECT window_start, `user`, COUNT(*), SUM(amount)
         FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '10' SECOND))
         GROUP BY window_start, window_end, `user`;",
        data.display(),
        dir.path().display()
    );
    session.execute_sql(&setup).await.expect("job runs");
    let late = session.last_outcome().expect("sync job").metrics.late_rows_dropped();
    let mut rows = vec![];
    let results = session
        .execute_sql(&format!(
            "CREATE TABLE back (ws TIMESTAMP(3), `user` STRING, n BIGINT, total BIGINT)
             WITH ('connector' = 'filesystem', 'path' = '{}/out', 'format' = 'json');
             SELECT * FROM back;",
            dir.path().display()
        ))
        .await
        .expect("read back");
    for r in results {
        if let StatementResult::Stream(mut rs) = r {
            while let Some(b) = rs.rows.recv().await {
                rows.extend(weir::display::format_rows(&b).expect("format"));
            }
            rs.job.wait().await.expect("read job");
        }
    }
    rows.sort();
    (rows, late)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_within_bound_equals_sorted() {
    let (sorted, late_sorted) = windows_of("orders.json", 1).await;
    let (shuffled, late_shuffled) = windows_of("orders_shuffled.json", 1).await;
    assert_eq!(late_sorted, 0);
    assert_eq!(late_shuffled, 0, "every row is within the 5 s bound");
    assert_eq!(sorted.len(), 7);
    assert!(
        sorted.contains(&"+I[2024-01-01 00:00:00.000, a, 2, 15]".to_string()),
        "{sorted:?}"
    );
    assert_eq!(sorted, shuffled);
    let (parallel, _) = windows_of("orders_shuffled.json", 3).await;
    assert_eq!(parallel, sorted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_beyond_the_bound_are_dropped_and_counted() {
    // orders_late.json: after a row at 00:00:25 (watermark 00:00:20), rows at
    // :14 and :19 belong to the fired window [:10, :20): late. A row at
    // exactly :20 is not late (SQL watermarks have no -1 ms).
    let (rows, late) = windows_of("orders_late.json", 1).await;
    assert_eq!(late, 2);
    assert!(
        rows.contains(&"+I[2024-01-01 00:00:10.000, b, 2, 10]".to_string()),
        "{rows:?}"
    );
    assert!(
        !rows.iter().any(|r| r.contains(", c, ") && r.contains("00:00:10.000")),
        "late :19 row of c dropped: {rows:?}"
    );
    assert!(
        rows.contains(&"+I[2024-01-01 00:00:20.000, b, 1, 1]".to_string()),
        "row at the watermark kept: {rows:?}"
    );
    assert!(
        rows.contains(&"+I[2024-01-01 00:00:10.000, a, 1, 1]".to_string()),
        "late :14 row of a not added: {rows:?}"
    );
}

/// Visible rows per partition directory of `out` (`dt=../hm=..`), and
/// the partitions with a `_SUCCESS` file.
fn partitions_of(out: &std::path::Path) -> (std::collections::BTreeMap<String, usize>, Vec<String>) {
    let mut rows = std::collections::BTreeMap::new();
    let mut committed = vec![];
    for dt in std::fs::read_dir(out).into_iter().flatten().flatten() {
        for hm in std::fs::read_dir(dt.path()).into_iter().flatten().flatten() {
            let name = format!(
                "{}/{}",
                dt.file_name().to_string_lossy(),
                hm.file_name().to_string_lossy()
            );
            let mut n = 0;
            let mut success = false;
            for f in std::fs::read_dir(hm.path()).into_iter().flatten().flatten() {
                let file = f.file_name().to_string_lossy().to_string();
                if file == "_SUCCESS" {
                    success = true;
                } else if !file.starts_with('.') {
                    n += std::fs::read_to_string(f.path()).map_or(0, |t| t.lines().count());
                }
            }
            rows.insert(name.clone(), n);
            if success {
                committed.push(name);
            }
        }
    }
    (rows, committed)
}

/// A partitioned file sink with checkpoints commits a partition (writes
/// its `_SUCCESS`) only once all its rows are committed and the watermark
/// passed the partition's end plus the delay: every time a `_SUCCESS` is
/// seen while the job runs, the partition's visible rows are all of them;
/// partitions are committed while the job runs, not only at its end; at
/// the end every partition is committed with each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_are_committed_once_complete_and_passed() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 6000 rows 6 s apart: ten hours, 600 rows an hour, in time order.
    let base = chrono::NaiveDate::from_ymd_opt(2024, 1, 1)
        .and_then(|d| d.and_hms_opt(20, 0, 0))
        .expect("time");
    let mut csv = String::new();
    for i in 0..6000i64 {
        let t = base + chrono::Duration::seconds(6 * i);
        csv.push_str(&format!(
            "{},{},{i},{},{}\n",
            t.format("%Y-%m-%d %H:%M:%S"),
            ["a", "b", "c"][(i % 3) as usize],
            t.format("%Y-%m-%d"),
            t.format("%H:00")
        ));
    }
    let input = dir.path().join("events.csv");
    std::fs::write(&input, csv).expect("input");
    let out = dir.path().join("out");
    let mut session = Session::open(dir.path().join("data")).expect("session");
    session
        .execute_sql(&format!(
            "SET 'pipeline.name' = 'partitions';
             SET 'parallelism.default' = '2';
             SET 'execution.checkpointing.interval' = '100 ms';
             SET 'table.dml-sync' = 'false';
             CREATE TABLE src (ts TIMESTAMP(3), k STRING, v BIGINT, dt STRING, hm STRING,
               WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
             WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'scan.lines-per-second' = '2000');
             CREATE TABLE out (k STRING, v BIGINT, dt STRING, hm STRING) PARTITIONED BY (dt, hm)
             WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv',
                   'sink.partition-commit.trigger' = 'partition-time', 'sink.partition-commit.delay' = '1 h',
                   'sink.partition-commit.policy.kind' = 'success-file',
                   'partition.time-extractor.timestamp-pattern' = '$dt $hm:00');
             INSERT INTO out SELECT k, v, dt, hm FROM src;",
            input.display(),
            out.display()
        ))
        .await
        .expect("job starts");
    let status = dir.path().join("data").join("jobs").join("partitions").join("status");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut committed_while_running = std::collections::BTreeSet::new();
    loop {
        let finished = std::fs::read_to_string(&status).is_ok_and(|s| s.trim() == "FINISHED");
        let (rows, committed) = partitions_of(&out);
        for p in &committed {
            assert_eq!(rows[p], 600, "{p} committed with {} of its 600 rows", rows[p]);
            if !finished {
                committed_while_running.insert(p.clone());
            }
        }
        if finished {
            assert_eq!(
                committed.len(),
                10,
                "every partition committed at the end: {committed:?}"
            );
            assert_eq!(rows.values().sum::<usize>(), 6000);
            assert!(rows.keys().all(|p| p.contains("%3A00")), "':' escaped: {rows:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the job did not finish: {rows:?}");
        // Observing the directory while the job runs (not waiting for it).
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(
        !committed_while_running.is_empty(),
        "no partition was committed before the end of input"
    );
}

/// A session over `dir` with an unbounded Nexmark `bid` table (with
/// `extra` columns) generated at `rate` events a second, parallelism 2.
async fn unbounded_bids(dir: &std::path::Path, extra: &str, rate: u32) -> Session {
    let mut session = Session::open(dir).expect("session");
    session
        .execute_sql(&format!(
            "SET 'parallelism.default' = '2';
             CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
               dateTime TIMESTAMP(3), extra STRING{extra})
             WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events-per-second' = '{rate}');"
        ))
        .await
        .expect("table");
    session
}

/// Windows on processing time fire when the clock passes their end, on an
/// unbounded source (no watermark ever comes): each window is the
/// operator's clock's, one second long, aligned, and emitted after its
/// end. Nexmark q12's shape: `PROCTIME()` declared in a subquery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processing_time_windows_fire_on_the_clock() {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Int64Type, TimestampMillisecondType};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut session = unbounded_bids(dir.path(), "", 2000).await;
    let explain = session
        .execute_sql(
            "EXPLAIN SELECT B.bidder, COUNT(*), TUMBLE_START(B.p_time, INTERVAL '1' SECOND), TUMBLE_END(B.p_time, INTERVAL '1' SECOND)
             FROM (SELECT *, PROCTIME() AS p_time FROM bid) B GROUP BY B.bidder, TUMBLE(B.p_time, INTERVAL '1' SECOND);",
        )
        .await
        .expect("explain");
    let Some(StatementResult::Explain(text)) = explain.into_iter().next() else {
        panic!("no plan")
    };
    assert!(text.contains("on processing time"), "{text}");
    let results = session
        .execute_sql(
            "CREATE VIEW timed AS SELECT *, PROCTIME() AS p_time FROM bid;
             SELECT window_start, window_end, COUNT(*) AS n
             FROM TABLE(TUMBLE(TABLE timed, DESCRIPTOR(p_time), INTERVAL '1' SECOND))
             GROUP BY window_start, window_end;",
        )
        .await
        .expect("query");
    let Some(StatementResult::Stream(mut rs)) = results.into_iter().last() else {
        panic!("a streaming result")
    };
    let mut windows = vec![];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while windows.len() < 3 {
        let b = tokio::time::timeout_at(deadline, rs.rows.recv())
            .await
            .expect("windows within 60 s")
            .expect("rows");
        let received = weir_engine::clock::Clock::Wall.now_ms();
        let starts = b.column(0).as_primitive::<TimestampMillisecondType>();
        let ends = b.column(1).as_primitive::<TimestampMillisecondType>();
        let counts = b.column(2).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(!starts.is_null(i) && counts.value(i) > 0);
            assert_eq!(ends.value(i) - starts.value(i), 1000);
            assert_eq!(starts.value(i) % 1000, 0, "aligned to the second");
            assert!(ends.value(i) <= received, "emitted only after its end");
            windows.push(starts.value(i));
        }
    }
    windows.sort();
    windows.dedup();
    assert!(windows.len() >= 3, "one row per window: {windows:?}");
    rs.job.cancel().await.expect("cancel");
}

/// A processing-time interval join expires rows by the clock: on an
/// unbounded source, a LEFT join whose right side never matches emits its
/// left rows padded while the job runs, about a second (the bound) after
/// they arrived; matches on the key are emitted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processing_time_interval_joins_expire_rows_on_the_clock() {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int64Type;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut session = unbounded_bids(dir.path(), ", pt AS PROCTIME()", 500).await;
    let sql = "SELECT a.auction, a.price, b.price FROM bid a LEFT JOIN bid b
               ON a.auction = b.auction AND b.price < 0
               AND a.pt BETWEEN b.pt - INTERVAL '1' SECOND AND b.pt + INTERVAL '1' SECOND;";
    let explain = session.execute_sql(&format!("EXPLAIN {sql}")).await.expect("explain");
    let Some(StatementResult::Explain(text)) = explain.into_iter().next() else {
        panic!("no plan")
    };
    assert!(
        text.contains("IntervalJoin") && text.contains("(processing time)"),
        "{text}"
    );
    let results = session.execute_sql(sql).await.expect("query");
    let Some(StatementResult::Stream(mut rs)) = results.into_iter().last() else {
        panic!("a streaming result")
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut padded = 0;
    while padded < 100 {
        let b = tokio::time::timeout_at(deadline, rs.rows.recv())
            .await
            .expect("padded rows within 60 s")
            .expect("rows");
        let right = b.column(2).as_primitive::<Int64Type>();
        assert_eq!(right.null_count(), b.num_rows(), "no bid has a negative price");
        padded += b.num_rows();
    }
    rs.job.cancel().await.expect("cancel");
}
