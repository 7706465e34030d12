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
