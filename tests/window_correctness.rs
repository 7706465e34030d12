//! Window results checked against an independent computation: the same
//! Nexmark rows are dumped to Parquet by a pass-through job, and DataFusion
//! batch SQL computes the windows from them with plain arithmetic. Runs at
//! parallelism 1 and 4, on both state backends; all must agree exactly.

use std::sync::Arc;

use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use weir::Session;

const EVENTS: u64 = 200_000;

async fn batch_rows(ctx: &SessionContext, sql: &str) -> Vec<String> {
    let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("run");
    let mut rows = vec![];
    for b in &batches {
        rows.extend(weir::display::format_rows(b).expect("format"));
    }
    rows.sort();
    rows
}

/// The compression codecs of every column chunk of the visible part files
/// of a sink directory.
fn codecs(dir: &str) -> std::collections::BTreeSet<String> {
    use parquet::file::reader::FileReader;
    let mut out = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(dir).expect("sink dir").flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let file = std::fs::File::open(e.path()).expect("open part file");
        let reader = parquet::file::reader::SerializedFileReader::new(file).expect("parquet");
        for g in reader.metadata().row_groups() {
            out.extend(g.columns().iter().map(|c| format!("{:?}", c.compression())));
        }
    }
    out
}

/// Every visible part file of a sink directory.
fn read_parquet_dir(dir: &str) -> Vec<arrow::record_batch::RecordBatch> {
    let mut out = vec![];
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("sink dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    for f in files
        .iter()
        .filter(|f| !f.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
    {
        let file = std::fs::File::open(f).expect("open part file");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet")
            .build()
            .expect("reader");
        for b in reader {
            out.push(b.expect("batch"));
        }
    }
    out
}

/// Runs the streaming jobs; returns the data dir holding raw/ hop/ tumble/.
async fn run_weir(parallelism: usize, backend: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let sql = format!(
        "SET 'parallelism.default' = '{parallelism}';
         SET 'state.backend.type' = '{backend}';
         SET 'table.dml-sync' = 'true';
         CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3),
           WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND)
         WITH ('connector' = 'nexmark', 'nexmark.events' = '{EVENTS}', 'splits' = '4', 'nexmark.seed' = '42');
         CREATE TABLE raw (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3))
         WITH ('connector' = 'filesystem', 'path' = '{d}/raw', 'format' = 'parquet');
         INSERT INTO raw SELECT auction, bidder, price, dateTime FROM bid;
         CREATE TABLE hop (auction BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), n BIGINT, total BIGINT,
           mn BIGINT, mx BIGINT, av BIGINT, bidders BIGINT)
         WITH ('connector' = 'filesystem', 'path' = '{d}/hop', 'format' = 'parquet', 'parquet.compression' = 'zstd');
         INSERT INTO hop SELECT auction, window_start, window_end, COUNT(*), SUM(price), MIN(price),
           MAX(price), AVG(price), COUNT(DISTINCT bidder)
         FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
         GROUP BY auction, window_start, window_end;
         CREATE TABLE tumble (ws TIMESTAMP(3), we TIMESTAMP(3), bucket BIGINT, n BIGINT, mx BIGINT)
         WITH ('connector' = 'filesystem', 'path' = '{d}/tumble', 'format' = 'parquet');
         INSERT INTO tumble SELECT TUMBLE_START(dateTime, INTERVAL '5' SECOND), TUMBLE_END(dateTime, INTERVAL '5' SECOND),
           bidder % 7, COUNT(*), MAX(price)
         FROM bid GROUP BY TUMBLE(dateTime, INTERVAL '5' SECOND), bidder % 7;"
    );
    let mut session = Session::open(dir.path().join("weir-data")).expect("session");
    for stmt in weir_sql::parse(&sql).expect("parse") {
        session.execute(&stmt).await.expect("statement");
        if let Some(o) = session.last_outcome() {
            assert_eq!(
                o.metrics.late_rows_dropped(),
                0,
                "in-order Nexmark input has no late rows"
            );
        }
    }
    dir
}

async fn check(parallelism: usize, backend: &str) {
    let dir = run_weir(parallelism, backend).await;
    let d = dir.path().display().to_string();
    // Flink's parquet writer compresses with SNAPPY unless told otherwise.
    let snappy: std::collections::BTreeSet<String> = ["SNAPPY".to_string()].into();
    assert_eq!(codecs(&format!("{d}/raw")), snappy);
    let zstd = codecs(&format!("{d}/hop"));
    assert!(
        zstd.len() == 1 && zstd.iter().all(|c| c.starts_with("ZSTD")),
        "'parquet.compression' = 'zstd': {zstd:?}"
    );
    let ctx = SessionContext::new();
    for t in ["raw", "hop", "tumble"] {
        let batches = read_parquet_dir(&format!("{d}/{t}"));
        let schema = batches.first().expect("a part file").schema();
        let table = MemTable::try_new(schema, vec![batches]).expect("mem table");
        ctx.register_table(t, Arc::new(table)).expect("register");
    }
    let raw_count = batch_rows(&ctx, "SELECT COUNT(*) FROM raw").await;
    assert_eq!(
        raw_count,
        vec![format!("+I[{}]", EVENTS * 46 / 50)],
        "every bid of the generator"
    );

    let expected_hop = batch_rows(
        &ctx,
        "SELECT auction, ws, ws + 10000, COUNT(*), SUM(price), MIN(price), MAX(price), CAST(AVG(price) AS BIGINT), COUNT(DISTINCT bidder)
         FROM (SELECT auction, bidder, price, t - (t % 2000) - k * 2000 AS ws, t
               FROM (SELECT *, CAST(\"dateTime\" AS BIGINT) AS t FROM raw)
               CROSS JOIN (VALUES (0), (1), (2), (3), (4)) AS ks(k))
         WHERE ws + 10000 > t
         GROUP BY auction, ws",
    )
    .await;
    let actual_hop = batch_rows(
        &ctx,
        "SELECT auction, CAST(ws AS BIGINT), CAST(we AS BIGINT), n, total, mn, mx, av, bidders FROM hop",
    )
    .await;
    assert!(
        expected_hop.len() > 1000,
        "a meaningful number of windows: {}",
        expected_hop.len()
    );
    assert_eq!(
        actual_hop.len(),
        expected_hop.len(),
        "HOP window count, p={parallelism} {backend}"
    );
    assert_eq!(actual_hop, expected_hop, "HOP results, p={parallelism} {backend}");

    let expected_tumble = batch_rows(
        &ctx,
        "SELECT t - (t % 5000), t - (t % 5000) + 5000, bidder % 7, COUNT(*), MAX(price)
         FROM (SELECT *, CAST(\"dateTime\" AS BIGINT) AS t FROM raw)
         GROUP BY t - (t % 5000), bidder % 7",
    )
    .await;
    let actual_tumble = batch_rows(
        &ctx,
        "SELECT CAST(ws AS BIGINT), CAST(we AS BIGINT), bucket, n, mx FROM tumble",
    )
    .await;
    assert_eq!(
        actual_tumble, expected_tumble,
        "TUMBLE results, p={parallelism} {backend}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn windows_match_batch_sql_p1_rocksdb() {
    check(1, "rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn windows_match_batch_sql_p4_rocksdb() {
    check(4, "rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn windows_match_batch_sql_p1_heap() {
    check(1, "hashmap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn windows_match_batch_sql_p4_heap() {
    check(4, "hashmap").await;
}

/// Out-of-order bids with late ones: 20 000 rows of 37 keys, 5 ms apart
/// in event time, each up to 2 s early, every 50th 15 s behind (late for
/// some or all of its windows under a 1 s watermark delay).
fn disordered_csv(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("bids.csv");
    let mut text = String::new();
    let mut state = 11u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let base = 1_704_067_200_000i64; // 2024-01-01
    for i in 0..20_000i64 {
        let mut ts = base + i * 5 - (next() % 2000) as i64;
        if i % 50 == 0 {
            ts -= 15_000;
        }
        let t = chrono::DateTime::from_timestamp_millis(ts).expect("time").naive_utc();
        text.push_str(&format!(
            "{},{},{}\n",
            i % 37,
            next() % 1000,
            t.format("%Y-%m-%d %H:%M:%S%.3f")
        ));
    }
    std::fs::write(&path, text).expect("write");
    path
}

/// HOP and CUMULATE (with offsets, several slide/size ratios) give the
/// same rows and drop the same late rows with slices as with every row
/// updating each of its windows, on both backends, at parallelism 1 and 4,
/// with checkpoints (which merge slices into windows) or without.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slicing_matches_per_window_updates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = disordered_csv(dir.path());
    let queries = [
        (
            "hop_offset",
            "HOP(TABLE bid, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND, INTERVAL '0.5' SECOND)",
        ),
        (
            "hop_3_12",
            "HOP(TABLE bid, DESCRIPTOR(ts), INTERVAL '3' SECOND, INTERVAL '12' SECOND)",
        ),
        (
            "cumulate",
            "CUMULATE(TABLE bid, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND, INTERVAL '1' SECOND)",
        ),
    ];
    let mut run = 0;
    // One reader has the file's one split at p4; the three without one
    // start idle, so every window subtask meets the rows and watermarks in
    // the order p1 does: the same rows are late, the same windows come out.
    let mut at_p1 = std::collections::HashMap::new();
    for backend in ["rocksdb", "hashmap"] {
        for parallelism in [1, 4] {
            for (name, tvf) in queries {
                let mut results = vec![];
                for (slicing, checkpoints) in [(false, false), (true, false), (true, true)] {
                    run += 1;
                    let out = dir.path().join(format!("out-{run}"));
                    let checkpointing = if checkpoints {
                        "SET 'execution.checkpointing.interval' = '20 ms';"
                    } else {
                        ""
                    };
                    let sql = format!(
                        "SET 'parallelism.default' = '{parallelism}';
                         SET 'state.backend.type' = '{backend}';
                         SET 'table.dml-sync' = 'true';
                         SET 'table.exec.window-agg.slicing' = '{slicing}';
                         {checkpointing}
                         CREATE TABLE bid (k BIGINT, v BIGINT, ts TIMESTAMP(3),
                           WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
                         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv',
                               'scan.watermark.emit.strategy' = 'on-event');
                         CREATE TABLE out (k BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), n BIGINT, total BIGINT,
                           mn BIGINT, mx BIGINT, d BIGINT)
                         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'parquet');
                         INSERT INTO out SELECT k, window_start, window_end, COUNT(*), SUM(v), MIN(v), MAX(v),
                           COUNT(DISTINCT v % 5)
                         FROM TABLE({tvf}) GROUP BY k, window_start, window_end;",
                        csv.display(),
                        out.display()
                    );
                    let mut session = Session::open(dir.path().join(format!("data-{run}"))).expect("session");
                    let mut late = 0;
                    for stmt in weir_sql::parse(&sql).expect("parse") {
                        session.execute(&stmt).await.expect("statement");
                        if let Some(o) = session.last_outcome() {
                            late = o.metrics.late_rows_dropped();
                        }
                    }
                    let ctx = SessionContext::new();
                    let batches = read_parquet_dir(&out.display().to_string());
                    let schema = batches.first().expect("a part file").schema();
                    let table = MemTable::try_new(schema, vec![batches]).expect("mem table");
                    ctx.register_table("out", Arc::new(table)).expect("register");
                    let rows = batch_rows(&ctx, "SELECT * FROM out").await;
                    results.push((slicing, checkpoints, late, rows));
                }
                let (_, _, late, rows) = &results[0];
                if parallelism == 1 {
                    at_p1.insert((backend, name), (*late, rows.clone()));
                } else {
                    let (l1, r1) = &at_p1[&(backend, name)];
                    assert_eq!(
                        late, l1,
                        "late rows dropped, {name} {backend} p{parallelism} against p1"
                    );
                    assert_eq!(rows, r1, "results, {name} {backend} p{parallelism} against p1");
                }
                assert!(rows.len() > 1000, "{name}: {} windows", rows.len());
                assert!(*late > 0, "{name}: the input has late rows");
                for (slicing, checkpoints, l, r) in &results[1..] {
                    let what = format!("{name} {backend} p{parallelism} slicing={slicing} checkpoints={checkpoints}");
                    assert_eq!(l, late, "late rows dropped, {what}");
                    assert_eq!(r.len(), rows.len(), "windows, {what}");
                    assert_eq!(r, rows, "results, {what}");
                }
            }
        }
    }
}
