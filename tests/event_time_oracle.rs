//! Event-time operators against an independent oracle: DataFusion's batch
//! answer to the same query over the same input, at parallelism 1 and 4,
//! on both state backends. The input is out of order within the watermark
//! delay (no row is late), so every result is final by the end of input.
//!
//! - Interval joins: the same SQL (a join with the range condition); every
//!   match is found and every unmatched row of an outer side is padded
//!   once its time has passed.
//! - Window Top-N: a TUMBLE window TVF, against DataFusion's `date_bin`
//!   windows with the same ROW_NUMBER (sorted on every selected column, so
//!   ties cannot pick different rows).
//! - Window joins: TUMBLE TVFs on both sides joined on their bounds,
//!   against DataFusion's join of `date_bin` windows.
//! - OVER aggregates: RANGE frames (ties share their value, so the answer
//!   does not depend on the order of rows of one time), against
//!   DataFusion's window functions with the same frame.
//! - SESSION windows: each row's session computed by a reference
//!   implementation here (per key, rows by time, a new session where a row
//!   starts after the last one's end), then the same aggregate in
//!   DataFusion's batch SQL over those bounds.
//! - Temporal joins: against a versioned table (the imps, one row per key
//!   and time), versus DataFusion's pick of the latest version of the
//!   click's key at or before its time (ROW_NUMBER over the candidates).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use weir::{Session, StatementResult};

const QUERIES: &[&str] = &[
    "SELECT c.k, c.v, i.x FROM clicks c JOIN imps i ON c.k = i.k AND c.ts BETWEEN i.ts - INTERVAL '3' SECOND AND i.ts + INTERVAL '1' SECOND",
    "SELECT c.k, c.v, i.k, i.x FROM clicks c LEFT JOIN imps i ON c.k = i.k AND c.ts >= i.ts AND c.ts < i.ts + INTERVAL '2' SECOND AND c.v > i.x",
    "SELECT c.k, c.v, i.k, i.x FROM clicks c RIGHT JOIN imps i ON c.k = i.k AND i.ts BETWEEN c.ts - INTERVAL '2' SECOND AND c.ts",
    "SELECT c.k, c.v, i.k, i.x FROM clicks c FULL JOIN imps i ON c.k = i.k AND c.ts > i.ts - INTERVAL '1' SECOND AND c.ts <= i.ts + INTERVAL '500' MILLISECOND",
];

/// `n` rows `(k, ts, v)` about 100 ms apart, each up to 2 s out of order,
/// with a NULL key now and then.
fn rows(n: usize, seed: u64) -> (RecordBatch, String) {
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let base = 1_436_918_400_000i64; // 2015-07-15 00:00:00
    let (mut k, mut ts, mut v) = (vec![], vec![], vec![]);
    let mut csv = String::new();
    for i in 0..n {
        let r = next();
        let key = match r % 7 {
            6 => None,
            j => Some(["a", "b", "c", "d", "e", "f"][j as usize]),
        };
        let t = base + i as i64 * 100 + ((r >> 8) % 4000) as i64 - 2000;
        let val = ((r >> 24) % 50) as i64;
        let stamp = chrono::DateTime::from_timestamp_millis(t)
            .expect("time")
            .format("%Y-%m-%d %H:%M:%S%.3f");
        csv.push_str(&format!("{},{stamp},{val}\n", key.unwrap_or("")));
        k.push(key);
        ts.push(t);
        v.push(val);
    }
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("v", DataType::Int64, true),
        ])),
        vec![
            Arc::new(StringArray::from(k)) as ArrayRef,
            Arc::new(TimestampMillisecondArray::from(ts)),
            Arc::new(Int64Array::from(v)),
        ],
    )
    .expect("batch");
    (batch, csv)
}

fn rows_of(batch: &RecordBatch) -> Vec<String> {
    weir::display::format_rows(batch)
        .expect("format")
        .into_iter()
        .map(|r| r.trim_start_matches("+I").to_string())
        .collect()
}

async fn batch_answer(sql: &str, clicks: &RecordBatch, imps: &RecordBatch) -> BTreeMap<String, i64> {
    let ctx = SessionContext::new();
    let imps = {
        // `imps` names its value `x`.
        let mut fields: Vec<Field> = imps.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[2] = Field::new("x", DataType::Int64, true);
        RecordBatch::try_new(Arc::new(Schema::new(fields)), imps.columns().to_vec()).expect("imps")
    };
    for (name, b) in [("clicks", clicks), ("imps", &imps)] {
        let table = MemTable::try_new(b.schema(), vec![vec![b.clone()]]).expect("mem table");
        ctx.register_table(name, Arc::new(table)).expect("register");
    }
    let batches = ctx
        .sql(sql)
        .await
        .expect("batch plan")
        .collect()
        .await
        .expect("batch run");
    let mut out = BTreeMap::new();
    for b in &batches {
        for r in rows_of(b) {
            *out.entry(r).or_insert(0) += 1;
        }
    }
    out
}

/// `batch` with the bounds of each row's session (gap `gap_ms`, per key
/// `k` when `by_key`, NULL a key of its own): `window_start`, `window_end`.
fn with_sessions(batch: &RecordBatch, gap_ms: i64, by_key: bool) -> RecordBatch {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::TimestampMillisecondType;
    let keys = batch.column(0).as_string::<i32>();
    let times = batch.column(1).as_primitive::<TimestampMillisecondType>();
    let mut rows: Vec<usize> = (0..batch.num_rows()).collect();
    let key = |i: usize| by_key.then(|| (!keys.is_null(i)).then(|| keys.value(i).to_string()));
    rows.sort_by_key(|&i| (key(i), times.value(i)));
    let (mut starts, mut ends) = (vec![0i64; rows.len()], vec![0i64; rows.len()]);
    let mut at = 0;
    while at < rows.len() {
        // A session: rows of one key while each starts at or before the
        // end so far (Flink's windows intersect when they touch).
        let (start, mut end) = (times.value(rows[at]), times.value(rows[at]) + gap_ms);
        let mut last = at + 1;
        while last < rows.len() && key(rows[last]) == key(rows[at]) && times.value(rows[last]) <= end {
            end = end.max(times.value(rows[last]) + gap_ms);
            last += 1;
        }
        for &i in &rows[at..last] {
            starts[i] = start;
            ends[i] = end;
        }
        at = last;
    }
    let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = batch.columns().to_vec();
    for (name, v) in [("window_start", starts), ("window_end", ends)] {
        fields.push(Field::new(
            name,
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ));
        columns.push(Arc::new(TimestampMillisecondArray::from(v)));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("sessions")
}

async fn run(session: &mut Session, sql: &str) -> Result<StatementResult, String> {
    let stmt = weir_sql::parse(sql).map_err(|e| e.to_string())?;
    session.execute(&stmt[0]).await.map_err(|e| e.to_string())
}

async fn streaming_answer(
    session: &mut Session,
    sql: &str,
    parallelism: usize,
    backend: &str,
) -> Result<BTreeMap<String, i64>, String> {
    run(session, &format!("SET 'parallelism.default' = '{parallelism}'")).await?;
    run(session, &format!("SET 'state.backend.type' = '{backend}'")).await?;
    let StatementResult::Stream(mut rs) = run(session, sql).await? else {
        return Err("not a streaming result".into());
    };
    if rs.changelog {
        return Err("the result must be insert-only".into());
    }
    let mut table = BTreeMap::new();
    while let Some(b) = rs.rows.recv().await {
        for row in rows_of(&b) {
            *table.entry(row).or_insert(0) += 1;
        }
    }
    rs.job.wait().await.map_err(|e| e.to_string())?;
    Ok(table)
}

/// A session with the `clicks` (k, ts, v) and `imps` (k, ts, x) tables over
/// CSV files of `clicks` and `imps`, several splits each.
async fn session_with_tables(dir: &std::path::Path, clicks_csv: &str, imps_csv: &str) -> Session {
    let mut session = Session::open(dir.join("data")).expect("session");
    for (name, value, csv) in [("clicks", "v", clicks_csv), ("imps", "x", imps_csv)] {
        let path = dir.join(format!("{name}.csv"));
        std::fs::write(&path, csv).expect("write csv");
        let ddl = format!(
            "CREATE TABLE {name} (k STRING, ts TIMESTAMP(3), {value} BIGINT, \
             WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) \
             WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'csv.null-literal' = '', 'source.split.min-size' = '2048')",
            path.display()
        );
        run(&mut session, &ddl).await.expect("create table");
    }
    session
}

/// Runs `sql` (and EXPLAIN of it, which must show `operator`) at
/// parallelism 1 and 4 on both backends; the differences from `expected`.
async fn compare_with_batch(
    session: &mut Session,
    sql: &str,
    operator: &str,
    expected: &BTreeMap<String, i64>,
    failures: &mut Vec<String>,
) {
    match run(session, &format!("EXPLAIN {sql}")).await {
        Ok(StatementResult::Explain(text)) if text.contains(operator) => {}
        Ok(StatementResult::Explain(text)) => failures.push(format!("{sql}: no {operator} in the plan:\n{text}")),
        Ok(_) => failures.push(format!("{sql}: EXPLAIN gave no plan")),
        Err(e) => failures.push(format!("{sql}: EXPLAIN failed: {e}")),
    }
    for (p, backend) in [(1, "rocksdb"), (4, "rocksdb"), (1, "hashmap"), (4, "hashmap")] {
        match streaming_answer(session, sql, p, backend).await {
            Ok(actual) if &actual == expected => {}
            Ok(actual) => {
                let missing: Vec<_> = expected.iter().filter(|(r, n)| actual.get(*r) != Some(n)).collect();
                let extra: Vec<_> = actual.iter().filter(|(r, n)| expected.get(*r) != Some(n)).collect();
                failures.push(format!(
                    "{sql} (p {p}, {backend}): {} rows expected, {} emitted\n  expected, not as emitted: {missing:?}\n  emitted, not as expected: {extra:?}",
                    expected.values().sum::<i64>(),
                    actual.values().sum::<i64>()
                ))
            }
            Err(e) => failures.push(format!("{sql} (p {p}, {backend}): {e}")),
        }
    }
}

/// Window Top-N over TUMBLE, and the same over a window aggregate:
/// streaming SQL, and DataFusion's batch SQL for the same rows.
const WINDOW_RANKS: &[(&str, &str)] = &[
    (
        "SELECT * FROM (SELECT window_start, window_end, k, ts, v, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY v DESC, ts, k) AS rn \
         FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '2' SECOND))) WHERE rn <= 3",
        "SELECT * FROM (SELECT window_start, window_end, k, ts, v, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY v DESC, ts, k) AS rn \
         FROM (SELECT k, ts, v, date_bin(INTERVAL '2 seconds', ts) AS window_start, date_bin(INTERVAL '2 seconds', ts) + INTERVAL '2 seconds' AS window_end FROM clicks)) WHERE rn <= 3",
    ),
    (
        "SELECT window_start, k, ts, v FROM (SELECT window_start, window_end, k, ts, v, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, k ORDER BY ts, v) AS rn \
         FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '5' SECOND))) WHERE rn < 3",
        "SELECT window_start, k, ts, v FROM (SELECT window_start, window_end, k, ts, v, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, k ORDER BY ts, v) AS rn \
         FROM (SELECT k, ts, v, date_bin(INTERVAL '5 seconds', ts) AS window_start, date_bin(INTERVAL '5 seconds', ts) + INTERVAL '5 seconds' AS window_end FROM clicks)) WHERE rn < 3",
    ),
    (
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY total DESC, k) AS rn FROM \
         (SELECT window_start, window_end, k, SUM(v) AS total FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '3' SECOND)) \
          GROUP BY window_start, window_end, k)) WHERE rn <= 2",
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY total DESC, k) AS rn FROM \
         (SELECT window_start, window_end, k, SUM(v) AS total FROM (SELECT k, v, date_bin(INTERVAL '3 seconds', ts) AS window_start, \
          date_bin(INTERVAL '3 seconds', ts) + INTERVAL '3 seconds' AS window_end FROM clicks) GROUP BY window_start, window_end, k)) WHERE rn <= 2",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn window_ranks_end_as_the_batch_answer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (clicks, clicks_csv) = rows(400, 0x51_7cc1_b727_220a);
    let (imps, imps_csv) = rows(10, 0x2545_f491_4f6c_dd1d);
    let mut session = session_with_tables(dir.path(), &clicks_csv, &imps_csv).await;
    let mut failures = vec![];
    for (sql, batch_sql) in WINDOW_RANKS {
        let expected = batch_answer(batch_sql, &clicks, &imps).await;
        assert!(
            expected.len() > 20,
            "{sql}: the batch answer is too small to test anything"
        );
        compare_with_batch(&mut session, sql, "WindowRank:", &expected, &mut failures).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interval_joins_end_as_the_batch_answer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (clicks, clicks_csv) = rows(400, 0x9e37_79b9_7f4a_7c15);
    let (imps, imps_csv) = rows(300, 0x2545_f491_4f6c_dd1d);
    let mut session = session_with_tables(dir.path(), &clicks_csv, &imps_csv).await;
    let mut failures = vec![];
    for sql in QUERIES {
        let expected = batch_answer(sql, &clicks, &imps).await;
        assert!(
            expected.len() > 20,
            "{sql}: the batch answer is too small to test anything"
        );
        let padded = expected.keys().filter(|r| r.contains("null")).count();
        eprintln!(
            "{sql}: {} rows, {padded} distinct padded",
            expected.values().sum::<i64>()
        );
        // The plan is an interval join, not a regular one.
        compare_with_batch(&mut session, sql, "IntervalJoin:", &expected, &mut failures).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// SESSION windows: (streaming SQL, batch SQL over `sessions` — the clicks
/// with their reference session bounds —, gap in ms, sessions per key).
const SESSIONS: &[(&str, &str, i64, bool)] = &[
    (
        "SELECT k, window_start, window_end, COUNT(*), SUM(v), MAX(v) \
         FROM TABLE(SESSION(TABLE clicks PARTITION BY k, DESCRIPTOR(ts), INTERVAL '300' MILLISECOND)) \
         GROUP BY k, window_start, window_end",
        "SELECT k, window_start, window_end, COUNT(*), SUM(v), MAX(v) FROM sessions GROUP BY k, window_start, window_end",
        300,
        true,
    ),
    (
        "SELECT k, SESSION_START(ts, INTERVAL '1' SECOND), SESSION_END(ts, INTERVAL '1' SECOND), COUNT(*) \
         FROM clicks GROUP BY k, SESSION(ts, INTERVAL '1' SECOND)",
        "SELECT k, window_start, window_end, COUNT(*) FROM sessions GROUP BY k, window_start, window_end",
        1000,
        true,
    ),
    (
        "SELECT window_start, window_end, k, ts, v \
         FROM TABLE(SESSION(TABLE clicks PARTITION BY k, DESCRIPTOR(ts), INTERVAL '500' MILLISECOND))",
        "SELECT window_start, window_end, k, ts, v FROM sessions",
        500,
        true,
    ),
    (
        "SELECT window_start, window_end, COUNT(*), MIN(v) \
         FROM TABLE(SESSION(TABLE clicks, DESCRIPTOR(ts), INTERVAL '150' MILLISECOND)) GROUP BY window_start, window_end",
        "SELECT window_start, window_end, COUNT(*), MIN(v) FROM sessions GROUP BY window_start, window_end",
        150,
        false,
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_windows_end_as_the_reference_answer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (clicks, clicks_csv) = rows(400, 0x6a09_e667_f3bc_c909);
    let (_, imps_csv) = rows(10, 0x2545_f491_4f6c_dd1d);
    let mut session = session_with_tables(dir.path(), &clicks_csv, &imps_csv).await;
    let mut failures = vec![];
    for (sql, batch_sql, gap, by_key) in SESSIONS {
        let sessions = with_sessions(&clicks, *gap, *by_key);
        let ctx = SessionContext::new();
        let table = MemTable::try_new(sessions.schema(), vec![vec![sessions]]).expect("mem table");
        ctx.register_table("sessions", Arc::new(table)).expect("register");
        let mut expected = BTreeMap::new();
        for b in ctx.sql(batch_sql).await.expect("plan").collect().await.expect("run") {
            for r in rows_of(&b) {
                *expected.entry(r).or_insert(0) += 1;
            }
        }
        let groups = expected.len();
        assert!(groups > 20, "{sql}: the reference answer is too small to test anything");
        let operator = if sql.contains("GROUP BY") {
            "SESSION(gap"
        } else {
            "SessionWindow:"
        };
        compare_with_batch(&mut session, sql, operator, &expected, &mut failures).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A TUMBLE window TVF of `table` with `value` (streaming) and the same
/// windows by `date_bin` (batch), both `(k, ts, value, window_start,
/// window_end) AS alias`.
fn tumbled(table: &str, value: &str, alias: &str) -> (String, String) {
    (
        format!("(SELECT * FROM TABLE(TUMBLE(TABLE {table}, DESCRIPTOR(ts), INTERVAL '2' SECOND))) {alias}"),
        format!(
            "(SELECT k, ts, {value}, date_bin(INTERVAL '2 seconds', ts) AS window_start, \
             date_bin(INTERVAL '2 seconds', ts) + INTERVAL '2 seconds' AS window_end FROM {table}) {alias}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn window_joins_end_as_the_batch_answer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (clicks, clicks_csv) = rows(400, 0xbb67_ae85_84ca_a73b);
    let (imps, imps_csv) = rows(300, 0x3c6e_f372_fe94_f82b);
    let mut session = session_with_tables(dir.path(), &clicks_csv, &imps_csv).await;
    let ((ls, lb), (rs, rb)) = (tumbled("clicks", "v", "L"), tumbled("imps", "x", "R"));
    let on = "L.window_start = R.window_start AND L.window_end = R.window_end AND L.k = R.k";
    let queries = [
        format!("SELECT L.window_start, L.k, L.v, R.x FROM {{l}} JOIN {{r}} ON {on}"),
        format!(
            "SELECT L.window_start, L.k, L.v, R.window_end, R.k, R.x FROM {{l}} FULL JOIN {{r}} ON {on} AND L.v > R.x"
        ),
        format!("SELECT L.window_end, L.k, L.v FROM {{l}} WHERE NOT EXISTS (SELECT * FROM {{r}} WHERE {on})"),
    ];
    let mut failures = vec![];
    for q in &queries {
        let sql = q.replace("{l}", &ls).replace("{r}", &rs);
        let batch_sql = q.replace("{l}", &lb).replace("{r}", &rb);
        let expected = batch_answer(&batch_sql, &clicks, &imps).await;
        assert!(
            expected.len() > 20,
            "{sql}: the batch answer is too small to test anything"
        );
        compare_with_batch(&mut session, &sql, "WindowJoin:", &expected, &mut failures).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// OVER aggregates: (streaming SQL, DataFusion's batch SQL).
const OVERS: &[(&str, &str)] = &[
    (
        "SELECT k, ts, v, SUM(v) OVER w, COUNT(*) OVER w, MAX(v) OVER w FROM clicks \
         WINDOW w AS (PARTITION BY k ORDER BY ts RANGE BETWEEN INTERVAL '2' SECOND PRECEDING AND CURRENT ROW)",
        "SELECT k, ts, v, SUM(v) OVER w, COUNT(*) OVER w, MAX(v) OVER w FROM clicks \
         WINDOW w AS (PARTITION BY k ORDER BY ts RANGE BETWEEN INTERVAL '2 seconds' PRECEDING AND CURRENT ROW)",
    ),
    (
        "SELECT k, ts, v, SUM(v) OVER (PARTITION BY k ORDER BY ts), MIN(v) OVER (PARTITION BY k ORDER BY ts) FROM clicks",
        "SELECT k, ts, v, SUM(v) OVER (PARTITION BY k ORDER BY ts), MIN(v) OVER (PARTITION BY k ORDER BY ts) FROM clicks",
    ),
    (
        "SELECT k, ts, COUNT(*) OVER (ORDER BY ts RANGE BETWEEN INTERVAL '500' MILLISECOND PRECEDING AND CURRENT ROW) FROM clicks",
        "SELECT k, ts, COUNT(*) OVER (ORDER BY ts RANGE BETWEEN INTERVAL '500 milliseconds' PRECEDING AND CURRENT ROW) FROM clicks",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_aggregates_end_as_the_batch_answer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (clicks, clicks_csv) = rows(400, 0xa54f_f53a_5f1d_36f1);
    let (imps, imps_csv) = rows(10, 0x510e_527f_ade6_82d1);
    let mut session = session_with_tables(dir.path(), &clicks_csv, &imps_csv).await;
    let mut failures = vec![];
    for (sql, batch_sql) in OVERS {
        let expected = batch_answer(batch_sql, &clicks, &imps).await;
        assert!(
            expected.len() > 20,
            "{sql}: the batch answer is too small to test anything"
        );
        compare_with_batch(&mut session, sql, "OverAggregate:", &expected, &mut failures).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `batch` and its CSV `csv` (one line per row) without the rows whose
/// key and time an earlier row has: versions of one key at one time
/// replace each other in arrival order, which splits read in parallel do
/// not fix.
fn unique_versions(batch: &RecordBatch, csv: &str) -> (RecordBatch, String) {
    use arrow::array::{Array, AsArray, BooleanArray};
    use arrow::datatypes::TimestampMillisecondType;
    let keys = batch.column(0).as_string::<i32>();
    let times = batch.column(1).as_primitive::<TimestampMillisecondType>();
    let mut seen = std::collections::HashSet::new();
    let keep: Vec<bool> = (0..batch.num_rows())
        .map(|i| seen.insert(((!keys.is_null(i)).then(|| keys.value(i)), times.value(i))))
        .collect();
    let lines: String = csv
        .lines()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(l, _)| format!("{l}\n"))
        .collect();
    let filtered = arrow::compute::filter_record_batch(batch, &BooleanArray::from(keep)).expect("filter");
    (filtered, lines)
}

/// Temporal joins: (streaming SQL against `versions`, the imps as a
/// versioned table, and DataFusion's batch SQL: per click, the latest imp
/// of its key at or before its time).
const TEMPORALS: &[(&str, &str)] = &[
    (
        "SELECT c.k, c.v, i.x FROM clicks c JOIN versions FOR SYSTEM_TIME AS OF c.ts AS i ON c.k = i.k",
        "SELECT c.k, c.v, m.x FROM c JOIN m ON c.id = m.id AND m.rn = 1",
    ),
    (
        "SELECT c.k, c.v, i.x FROM clicks c LEFT JOIN versions FOR SYSTEM_TIME AS OF c.ts AS i ON c.k = i.k AND c.v > i.x",
        "SELECT c.k, c.v, m.x FROM c LEFT JOIN m ON c.id = m.id AND m.rn = 1 AND c.v > m.x",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn temporal_joins_end_as_the_batch_answer() {
    let dir = tempfile::tempdir().expect("tmp");
    let (clicks, clicks_csv) = rows(400, 0x1f83_d9ab_fb41_bd6b);
    let (imps, imps_csv) = rows(300, 0x5be0_cd19_137e_2179);
    let (imps, imps_csv) = unique_versions(&imps, &imps_csv);
    let mut session = session_with_tables(dir.path(), &clicks_csv, &imps_csv).await;
    let ddl = format!(
        "CREATE TABLE versions (k STRING, ts TIMESTAMP(3), x BIGINT, \
         WATERMARK FOR ts AS ts - INTERVAL '5' SECOND, PRIMARY KEY (k) NOT ENFORCED) \
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'csv.null-literal' = '', 'source.split.min-size' = '2048')",
        dir.path().join("imps.csv").display()
    );
    run(&mut session, &ddl).await.expect("versioned table");
    let with = "WITH c AS (SELECT k, ts, v, ROW_NUMBER() OVER (ORDER BY ts, k, v) AS id FROM clicks), \
                m AS (SELECT c.id, i.x, ROW_NUMBER() OVER (PARTITION BY c.id ORDER BY i.ts DESC) AS rn \
                FROM c JOIN imps i ON c.k = i.k AND i.ts <= c.ts) ";
    let mut failures = vec![];
    for (sql, batch_sql) in TEMPORALS {
        let expected = batch_answer(&format!("{with}{batch_sql}"), &clicks, &imps).await;
        assert!(
            expected.len() > 20,
            "{sql}: the batch answer is too small to test anything"
        );
        compare_with_batch(&mut session, sql, "TemporalJoin:", &expected, &mut failures).await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
