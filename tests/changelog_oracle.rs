//! Differential oracle for updating queries: the changelog Weir emits,
//! applied to a table (`+I`/`+U` add a row, `-U`/`-D` remove one equal
//! row), must end as DataFusion's batch answer to the same SQL over the
//! same input, at parallelism 1 and 4, on both state backends. A
//! retraction of a row that is not in the table fails the test too.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use weir::{Session, StatementResult};
use weir_engine::change::RowKind;

/// Rows `(k, v, w)`: few keys with NULLs, duplicates, NULL values, and
/// doubles that add exactly (quarters), in a fixed pseudo-random order.
fn input() -> RecordBatch {
    let n = 600;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut k, mut v, mut w) = (vec![], vec![], vec![]);
    for _ in 0..n {
        let r = next();
        k.push(match r % 6 {
            5 => None,
            i => Some(["a", "b", "c", "dd", "e"][i as usize].to_string()),
        });
        v.push(if (r >> 8) % 11 == 0 {
            None
        } else {
            Some(((r >> 16) % 40) as i64 - 10)
        });
        w.push(Some(((r >> 32) % 64) as f64 / 4.0));
    }
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
            Field::new("w", DataType::Float64, true),
        ])),
        vec![
            Arc::new(StringArray::from(k)) as ArrayRef,
            Arc::new(Int64Array::from(v)),
            Arc::new(Float64Array::from(w)),
        ],
    )
    .expect("input batch")
}

/// A small second table `u (k, x)`: duplicate keys, a NULL key, a key
/// `t` lacks, and one `t` has that `u` lacks (`e`).
fn second() -> RecordBatch {
    let k = [
        Some("a"),
        Some("a"),
        Some("b"),
        None,
        Some("dd"),
        Some("zz"),
        Some("b"),
        Some("c"),
        Some("a"),
    ];
    let x = [
        Some(1),
        Some(5),
        Some(2),
        Some(7),
        None,
        Some(3),
        Some(2),
        Some(-4),
        Some(9),
    ];
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("x", DataType::Int64, true),
        ])),
        vec![
            Arc::new(StringArray::from(k.to_vec())) as ArrayRef,
            Arc::new(Int64Array::from(x.to_vec())),
        ],
    )
    .expect("second batch")
}

const QUERIES: &[&str] = &[
    "SELECT k, COUNT(*), COUNT(v), SUM(v), MIN(v), MAX(v), AVG(v) FROM t GROUP BY k",
    "SELECT k, COUNT(DISTINCT v), SUM(DISTINCT v), MIN(DISTINCT w) FROM t GROUP BY k",
    // DISTINCT calls over one argument share a value-count map (q16's shape).
    "SELECT k, COUNT(DISTINCT v), COUNT(DISTINCT v) FILTER (WHERE w < 5), SUM(DISTINCT v) FILTER (WHERE w >= 5), COUNT(DISTINCT w), AVG(DISTINCT v) FROM t GROUP BY k",
    "SELECT k, COUNT(*) FILTER (WHERE v > 10), MAX(v) FILTER (WHERE w < 8), SUM(w) FILTER (WHERE v IS NULL) FROM t GROUP BY k",
    "SELECT COUNT(*), SUM(v), MIN(w), MAX(w), COUNT(DISTINCT k) FROM t",
    "SELECT k, SUM(v) FROM t GROUP BY k HAVING COUNT(*) > 100",
    "SELECT DISTINCT k, v % 3 FROM t",
    "SELECT k, v % 7, SUM(w), AVG(w) FROM t WHERE v > 0 GROUP BY k, v % 7",
    // Aggregates over an updating input: retraction of every kind.
    "SELECT c, COUNT(*) FROM (SELECT k, v % 7 AS g, COUNT(*) AS c FROM t GROUP BY k, v % 7) GROUP BY c",
    "SELECT k, MIN(s), MAX(s), COUNT(DISTINCT s), SUM(s) FROM (SELECT k, v % 5 AS g, SUM(v) AS s FROM t GROUP BY k, v % 5) GROUP BY k",
    "SELECT k, COUNT(DISTINCT s), COUNT(DISTINCT s) FILTER (WHERE g < 2), SUM(DISTINCT s) FILTER (WHERE g >= 2), MAX(DISTINCT s) FROM (SELECT k, v % 5 AS g, SUM(v) AS s FROM t GROUP BY k, v % 5) GROUP BY k",
    "SELECT MAX(c), MIN(c), COUNT(*) FROM (SELECT v, COUNT(*) AS c FROM t GROUP BY v)",
    "SELECT g, MIN(k), MAX(k) FROM (SELECT v % 4 AS g, k FROM t) GROUP BY g",
    "SELECT mx, COUNT(*) FROM (SELECT k, MAX(v) AS mx FROM t GROUP BY k) GROUP BY mx",
    "SELECT c FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) WHERE c > 110",
    // Regular joins: NULL keys, duplicate keys, keys on one side only.
    "SELECT t.k, t.v, u.x FROM t JOIN u ON t.k = u.k",
    "SELECT t.k, t.v, u.x FROM t LEFT JOIN u ON t.k = u.k AND t.v > u.x",
    "SELECT t.k, u.k, t.v, u.x FROM t RIGHT JOIN u ON t.k = u.k AND t.v < u.x",
    "SELECT t.k, u.k, t.v, u.x FROM t FULL JOIN u ON t.k = u.k AND t.v = u.x",
    // Joins of updating inputs, and aggregates over them (q4's shape).
    "SELECT a.k, a.c, u.x FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) a LEFT JOIN u ON a.k = u.k",
    "SELECT u.x, SUM(a.c), COUNT(*) FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) a JOIN u ON a.k = u.k GROUP BY u.x",
    "SELECT a.k, b.k, a.m, b.n FROM (SELECT k, MAX(v) AS m FROM t GROUP BY k) a FULL JOIN (SELECT k, COUNT(*) AS n FROM u GROUP BY k) b ON a.k = b.k",
    // Semi and anti joins from IN / EXISTS / NOT EXISTS subqueries.
    "SELECT k, v FROM t WHERE k IN (SELECT k FROM u)",
    "SELECT k, v FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.k AND u.x < t.v)",
    "SELECT k, v, w FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.k)",
    "SELECT k, c FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) a WHERE NOT EXISTS (SELECT 1 FROM (SELECT k, MAX(x) AS m FROM u GROUP BY k) b WHERE b.k = a.k AND b.m > 3)",
    "SELECT k, c FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) a WHERE a.k IN (SELECT k FROM u WHERE x > 1)",
    // UNION ALL of insert-only and updating inputs, at one parallelism or
    // several (a global aggregate runs on one subtask), and UNION.
    "SELECT k, v FROM t WHERE v > 20 UNION ALL SELECT k, x FROM u",
    "SELECT k, COUNT(*) FROM (SELECT k FROM t UNION ALL SELECT k FROM u UNION ALL SELECT k FROM t WHERE v < 0) GROUP BY k",
    "SELECT k FROM t UNION SELECT k FROM u",
    // One table read once, fed to both sides (a self-join; q7's shape: a
    // stream joined with its own aggregate).
    "SELECT a.k, a.v, b.w FROM t a JOIN t b ON a.k = b.k AND a.v = b.v",
    "SELECT t.k, t.v, t.w FROM t JOIN (SELECT k, MAX(v) AS m FROM t GROUP BY k) x ON t.k = x.k AND t.v = x.m",
    "SELECT k, c FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k) UNION ALL SELECT k, COUNT(*) FROM u GROUP BY k",
    "SELECT COUNT(*) FROM t UNION ALL SELECT x FROM u",
    // Top-N with and without the rank column, per key and global, over
    // insert-only and updating input (ties broken by a later key).
    "SELECT * FROM (SELECT k, v, w, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC NULLS LAST, w ASC) AS rn FROM t) WHERE rn <= 3",
    "SELECT k, v, w FROM (SELECT k, v, w, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC NULLS LAST, w ASC) AS rn FROM t) WHERE rn <= 3",
    "SELECT v, w, rn FROM (SELECT v, w, ROW_NUMBER() OVER (ORDER BY w DESC, v DESC NULLS LAST) AS rn FROM t) WHERE rn < 5",
    "SELECT * FROM (SELECT k, c, ROW_NUMBER() OVER (ORDER BY c DESC, k ASC NULLS LAST) AS rn FROM (SELECT k, COUNT(*) AS c FROM t GROUP BY k)) WHERE rn <= 2",
    "SELECT g, k, s FROM (SELECT g, k, s, ROW_NUMBER() OVER (PARTITION BY g ORDER BY s DESC, k ASC NULLS LAST) AS rn FROM (SELECT v % 3 AS g, k, SUM(w) AS s FROM t GROUP BY v % 3, k)) WHERE rn = 1",
    // Flink's UpdateFast Top-N (sort fields that only move a row up).
    "SELECT g, k, m FROM (SELECT g, k, m, ROW_NUMBER() OVER (PARTITION BY g ORDER BY m DESC, k ASC NULLS LAST) AS rn FROM (SELECT v % 3 AS g, k, MAX(w) AS m FROM t GROUP BY v % 3, k)) WHERE rn <= 2",
    "SELECT * FROM (SELECT k, m, ROW_NUMBER() OVER (ORDER BY m ASC, k DESC NULLS FIRST) AS rn FROM (SELECT k, MIN(v) AS m FROM t GROUP BY k)) WHERE rn <= 3",
    "SELECT k, v, rn FROM (SELECT k, v, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC NULLS FIRST) AS rn FROM (SELECT k, v FROM t WHERE w < 10)) WHERE rn <= 4 AND v > 0",
    "SELECT b.n, COUNT(*), MAX(a.m) FROM (SELECT k, v % 3 AS g, MAX(v) AS m FROM t GROUP BY k, v % 3) a RIGHT JOIN (SELECT k, COUNT(*) AS n FROM u GROUP BY k) b ON a.k = b.k GROUP BY b.n",
];

/// Applies a changelog to a multiset of rows; `Err` on a retraction of a
/// row that is not there.
fn apply(table: &mut BTreeMap<String, i64>, kind: RowKind, row: String) -> Result<(), String> {
    let n = table.entry(row.clone()).or_insert(0);
    if kind.is_accumulate() {
        *n += 1;
    } else {
        if *n == 0 {
            return Err(format!("{} of a row not in the table: {row}", kind.short()));
        }
        *n -= 1;
    }
    if *n == 0 {
        table.remove(&row);
    }
    Ok(())
}

fn rows_of(batch: &RecordBatch) -> Vec<String> {
    weir::display::format_rows(batch)
        .expect("format")
        .into_iter()
        .map(|r| r.trim_start_matches("+I").to_string())
        .collect()
}

async fn batch_answer(sql: &str, input: &RecordBatch, second: &RecordBatch) -> BTreeMap<String, i64> {
    let ctx = SessionContext::new();
    ctx.register_udaf(weir_sql::functions::overrides::FlinkAvg::udaf());
    let table = MemTable::try_new(input.schema(), vec![vec![input.clone()]]).expect("mem table");
    ctx.register_table("t", Arc::new(table)).expect("register");
    let table = MemTable::try_new(second.schema(), vec![vec![second.clone()]]).expect("mem table");
    ctx.register_table("u", Arc::new(table)).expect("register");
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

async fn streaming_answer(
    session: &mut Session,
    sql: &str,
    parallelism: usize,
    backend: &str,
) -> Result<BTreeMap<String, i64>, String> {
    for s in [
        format!("SET 'parallelism.default' = '{parallelism}'"),
        format!("SET 'state.backend.type' = '{backend}'"),
    ] {
        let stmt = weir_sql::parse(&s).map_err(|e| e.to_string())?;
        session.execute(&stmt[0]).await.map_err(|e| e.to_string())?;
    }
    let stmt = weir_sql::parse(sql).map_err(|e| e.to_string())?;
    let StatementResult::Stream(mut rs) = session.execute(&stmt[0]).await.map_err(|e| e.to_string())? else {
        return Err("not a streaming result".into());
    };
    let mut table = BTreeMap::new();
    while let Some(b) = rs.rows.recv().await {
        let changes = if rs.changelog {
            weir::display::changes_of(&b).map_err(|e| e.to_string())?
        } else {
            b.into()
        };
        for (i, row) in rows_of(&changes.rows).into_iter().enumerate() {
            apply(&mut table, changes.kind(i), row)?;
        }
    }
    rs.job.wait().await.map_err(|e| e.to_string())?;
    Ok(table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changelogs_end_as_the_batch_answer() {
    let dir = tempfile::tempdir().expect("tmp");
    let input = input();
    let second = second();
    let path = dir.path().join("t.json");
    let path_u = dir.path().join("u.json");
    for (p, b) in [(&path, &input), (&path_u, &second)] {
        let f = std::fs::File::create(p).expect("create");
        let mut w = arrow::json::LineDelimitedWriter::new(f);
        w.write(b).expect("write json");
        w.finish().expect("finish json");
    }
    let mut session = Session::open(dir.path().join("data")).expect("session");
    let ddl = format!(
        "CREATE TABLE t (k STRING, v BIGINT, w DOUBLE) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json', 'source.split.min-size' = '1024')",
        path.display()
    );
    let stmt = weir_sql::parse(&ddl).expect("ddl");
    session.execute(&stmt[0]).await.expect("create table");
    let ddl = format!(
        "CREATE TABLE u (k STRING, x BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json')",
        path_u.display()
    );
    let stmt = weir_sql::parse(&ddl).expect("ddl");
    session.execute(&stmt[0]).await.expect("create table u");
    let mut failures = vec![];
    for sql in QUERIES {
        let expected = batch_answer(sql, &input, &second).await;
        assert!(
            !expected.is_empty(),
            "{sql}: the batch answer is empty; the query tests nothing"
        );
        for (p, backend) in [(1, "rocksdb"), (4, "rocksdb"), (1, "hashmap"), (4, "hashmap")] {
            match streaming_answer(&mut session, sql, p, backend).await {
                Ok(actual) if actual == expected => {}
                Ok(actual) => failures.push(format!(
                    "{sql} (p {p}, {backend}):\n  expected {expected:?}\n  actual   {actual:?}"
                )),
                Err(e) => failures.push(format!("{sql} (p {p}, {backend}): {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
