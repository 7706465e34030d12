//! Operator uids see every part of an expression: a changed filter or
//! projection in front of a stateful operator gives it a new uid, so a
//! savepoint is never restored into a query of another meaning.
//!
//! The oracle: DataFusion evaluates two generated predicates (or
//! projections) over the same rows; where their answers differ anywhere,
//! the uids of the streaming jobs that use them must differ. The same
//! expression planned again gives the same uids, and a fixed query keeps
//! the uids recorded here, across runs and builds.

use std::collections::BTreeMap;

use arrow::array::Array;
use proptest::prelude::*;
use weir_catalog::Catalog;
use weir_catalog::store::Entry;
use weir_engine::config::JobConfig;
use weir_sql::{Planner, QueryPlan, Statement};

const DDL: &str = "CREATE TABLE t (a INT, s STRING, d DOUBLE, ts TIMESTAMP(3),
      WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
    WITH ('connector' = 'filesystem', 'path' = '{dir}', 'format' = 'csv');
  CREATE TABLE out (a INT, n BIGINT, x STRING) WITH ('connector' = 'blackhole');
  CREATE TABLE t2 (k INT, x BIGINT, y BIGINT, z AS x + 1)
    WITH ('connector' = 'filesystem', 'path' = '{dir}', 'format' = 'csv');
  CREATE TABLE out2 (k INT, s BIGINT) WITH ('connector' = 'blackhole');
  CREATE TABLE out3 (a TIMESTAMP(3), b TIMESTAMP(3), n BIGINT) WITH ('connector' = 'blackhole');";

/// The tables of [`every_node_kind_keeps_its_recorded_uids`].
const KINDS_DDL: &str = "
  CREATE TABLE u (a INT, s STRING, ts TIMESTAMP(3), WATERMARK FOR ts AS ts)
    WITH ('connector' = 'filesystem', 'path' = '{dir}', 'format' = 'csv');
  CREATE TABLE ur (a INT, s STRING, ts TIMESTAMP(3), PRIMARY KEY (a) NOT ENFORCED, WATERMARK FOR ts AS ts)
    WITH ('connector' = 'upsert-kafka', 'topic' = 'ur', 'properties.bootstrap.servers' = 'localhost:9',
          'key.format' = 'csv', 'value.format' = 'csv');
  CREATE TABLE o_w (ws TIMESTAMP(3), we TIMESTAMP(3), a INT, n BIGINT, x DOUBLE) WITH ('connector' = 'blackhole');
  CREATE TABLE o_g (a INT, n BIGINT, m DOUBLE, l STRING) WITH ('connector' = 'blackhole');
  CREATE TABLE o_j (a INT, s1 STRING, s2 STRING) WITH ('connector' = 'blackhole');
  CREATE TABLE o_r (a INT, s STRING, d DOUBLE) WITH ('connector' = 'blackhole');
  CREATE TABLE o_o (a INT, x DOUBLE, l STRING) WITH ('connector' = 'blackhole');
  CREATE TABLE o_s (a INT, s STRING, ws TIMESTAMP(3), we TIMESTAMP(3)) WITH ('connector' = 'blackhole');
  CREATE TABLE o_pk (s STRING, n BIGINT, PRIMARY KEY (s) NOT ENFORCED) WITH ('connector' = 'print');";

/// Rows the oracle evaluates expressions over (NULLs, negatives, strings
/// that are and are not numbers, cases).
const ROWS: &str = "(VALUES (1, 'abc', 1.5), (2, 'ABC', -2.0), (3, '12', 0.0), (-4, 'a_c', 3.25),
    (CAST(NULL AS INT), CAST(NULL AS VARCHAR), CAST(NULL AS DOUBLE)), (10, '3000000000', 100.0),
    (0, 'xyz', -0.5), (7, 'aXc', 7.0), (5, '-7', 2.5), (100, '', 1e10)) AS r(a, s, d)";

struct Fixture {
    planner: Planner,
    catalog: Catalog,
    config: JobConfig,
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("t.csv"), "").expect("input");
        let planner = Planner::new();
        let mut catalog = Catalog::in_memory();
        let ddl = format!("{DDL}{KINDS_DDL}").replace("{dir}", &dir.path().display().to_string());
        for stmt in weir_sql::parse(&ddl).expect("ddl parses") {
            let Statement::CreateTable(ct) = &stmt.statement else {
                panic!("not a CREATE TABLE")
            };
            let def = weir_sql::ddl::create_table(ct, &planner).expect("table");
            catalog.create(Entry::Table(def), false).expect("create");
        }
        let mut settings = BTreeMap::new();
        settings.insert("parallelism.default".to_string(), "2".to_string());
        let config = JobConfig::from_settings(&settings, "uids", dir.path()).expect("config");
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        Fixture {
            planner,
            catalog,
            config,
            rt,
            _dir: dir,
        }
    }

    /// The uids of `INSERT INTO out SELECT a, COUNT(*), MAX(<projection>)
    /// FROM t WHERE <predicate> GROUP BY a`, or the planner's refusal.
    fn uids(&self, predicate: &str, projection: &str) -> Result<Vec<String>, String> {
        self.uids_of(&format!(
            "INSERT INTO out SELECT a, COUNT(*), MAX(CAST({projection} AS STRING)) FROM t WHERE {predicate} GROUP BY a"
        ))
    }

    /// The uids of an INSERT's job.
    fn uids_of(&self, sql: &str) -> Result<Vec<String>, String> {
        let stmt = weir_sql::parse(sql).map_err(|e| e.to_string())?.remove(0);
        let Statement::Insert {
            table,
            columns,
            query,
            on_conflict,
        } = &stmt.statement
        else {
            panic!("not an INSERT")
        };
        let sink = self.catalog.table(table).expect("sink").clone();
        let graph = self
            .planner
            .plan_insert(&sink, columns, query, *on_conflict, &self.catalog, &self.config)
            .map_err(|e| e.to_string())?;
        Ok(graph.nodes.iter().map(|n| n.uid.clone()).collect())
    }

    /// Each expression's values over [`ROWS`], as text (None: DataFusion
    /// refused or failed it).
    fn values(&self, exprs: &[&str]) -> Option<Vec<Vec<String>>> {
        let select: Vec<String> = exprs.iter().enumerate().map(|(i, e)| format!("{e} AS c{i}")).collect();
        let sql = format!("SELECT {} FROM {ROWS}", select.join(", "));
        let stmt = weir_sql::parse(&sql).ok()?.remove(0);
        let Statement::Query(q) = &stmt.statement else {
            return None;
        };
        let QueryPlan::Batch(plan) = self.planner.plan_query(q, &self.catalog, &self.config).ok()? else {
            return None;
        };
        let batches = self.rt.block_on(self.planner.execute_batch(plan)).ok()?;
        let mut out = vec![vec![]; exprs.len()];
        for b in &batches {
            for (i, col) in out.iter_mut().enumerate() {
                let c = arrow::compute::cast(b.column(i), &arrow::datatypes::DataType::Utf8).ok()?;
                let c = c.as_any().downcast_ref::<arrow::array::StringArray>()?;
                for r in 0..c.len() {
                    col.push(if c.is_null(r) {
                        "NULL".into()
                    } else {
                        c.value(r).to_string()
                    });
                }
            }
        }
        Some(out)
    }
}

/// Predicates over `t`'s columns, with every part that can change their
/// meaning: negation, patterns, case-insensitivity, cast targets, list
/// values, CASE branches, arithmetic, NULL tests.
fn predicate() -> impl Strategy<Value = String> {
    let int = -5i32..12;
    let leaf = prop_oneof![
        (prop::collection::vec(int.clone(), 1..4), any::<bool>()).prop_map(|(l, neg)| {
            let l: Vec<String> = l.iter().map(|v| v.to_string()).collect();
            format!("a {}IN ({})", if neg { "NOT " } else { "" }, l.join(", "))
        }),
        (
            prop::sample::select(vec!["a%", "A%", "%c", "a_c", "%", "_b%", "12"]),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(p, neg, ci)| format!(
                "s {}{} '{p}'",
                if neg { "NOT " } else { "" },
                if ci { "ILIKE" } else { "LIKE" }
            )),
        (
            prop::sample::select(vec!["INT", "BIGINT", "DOUBLE", "TINYINT"]),
            int.clone()
        )
            .prop_map(|(t, k)| format!("TRY_CAST(s AS {t}) > {k}")),
        (
            int.clone(),
            prop::sample::select(vec!["'x'", "'y'", "'z'"]),
            any::<bool>()
        )
            .prop_map(|(k, v, with_else)| {
                format!(
                    "CASE WHEN a > {k} THEN 'x' {} END = {v}",
                    if with_else { "ELSE 'y'" } else { "" }
                )
            }),
        (
            int.clone(),
            int.clone(),
            prop::sample::select(vec!["+", "-", "*", "%"]),
            prop::sample::select(vec!["<", ">", "=", "<>", ">="])
        )
            .prop_map(|(k, m, op, cmp)| format!("a {op} {k} {cmp} {m}")),
        int.clone().prop_map(|k| format!("-a < {k}")),
        (prop::sample::select(vec!["a", "s", "d"]), any::<bool>())
            .prop_map(|(c, neg)| format!("{c} IS {}NULL", if neg { "NOT " } else { "" })),
        (-3.0f64..3.0).prop_map(|k| format!("d > {k:.2}")),
        prop::sample::select(vec![
            "UPPER(s) = 'ABC'",
            "LOWER(s) = 'abc'",
            "CHAR_LENGTH(s) > 2",
            "s = 'abc'"
        ])
        .prop_map(str::to_string),
    ];
    leaf.prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|p| format!("NOT ({p})")),
            (inner.clone(), inner.clone()).prop_map(|(p, q)| format!("({p}) AND ({q})")),
            (inner.clone(), inner).prop_map(|(p, q)| format!("({p}) OR ({q})")),
        ]
    })
}

/// Projections: the value a stateful operator aggregates.
fn projection() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["INT", "BIGINT", "TINYINT", "DOUBLE"]).prop_map(|t| format!("TRY_CAST(s AS {t})")),
        (-3i32..4).prop_map(|k| format!("CASE WHEN a > {k} THEN s ELSE 'other' END")),
        (-3i32..4, -3i32..4).prop_map(|(k, v)| format!("CASE a WHEN {k} THEN {v} ELSE -1 END")),
        prop::sample::select(vec![
            "UPPER(s)",
            "LOWER(s)",
            "TRIM(s)",
            "s",
            "SUBSTRING(s, 2)",
            "SUBSTRING(s, 1, 2)"
        ])
        .prop_map(str::to_string),
        (-3i32..4).prop_map(|k| format!("a * {k}")),
        (-3i32..4).prop_map(|k| format!("-a + {k}")),
        (-3i32..4).prop_map(|k| format!("CAST(a AS BIGINT) + {k}")),
        Just("a IN (1, 2)".to_string()),
        Just("a NOT IN (1, 2)".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Two predicates that answer differently on some row give the job
    /// different uids; a predicate planned twice gives the same ones.
    #[test]
    fn predicates_of_different_meaning_get_different_uids(p in predicate(), q in predicate()) {
        let f = fixture();
        let (Ok(up), Ok(uq)) = (f.uids(&p, "a"), f.uids(&q, "a")) else {
            return Ok(());
        };
        prop_assert_eq!(&up, &f.uids(&p, "a").expect("planned before"), "{} planned twice", p);
        if let Some(v) = f.values(&[&p, &q]) && v[0] != v[1] {
            prop_assert_ne!(up, uq, "'{}' and '{}' answer {:?} and {:?}", p, q, v[0], v[1]);
        }
    }

    #[test]
    fn projections_of_different_meaning_get_different_uids(p in projection(), q in projection()) {
        let f = fixture();
        let (Ok(up), Ok(uq)) = (f.uids("a > 0", &p), f.uids("a > 0", &q)) else {
            return Ok(());
        };
        prop_assert_eq!(&up, &f.uids("a > 0", &p).expect("planned before"), "{} planned twice", p);
        if let Some(v) = f.values(&[&format!("CAST({p} AS STRING)"), &format!("CAST({q} AS STRING)")]) && v[0] != v[1] {
            prop_assert_ne!(up, uq, "'{}' and '{}' answer {:?} and {:?}", p, q, v[0], v[1]);
        }
    }
}

/// One fixture per test thread: planning is what is tested, not setup.
fn fixture() -> std::rc::Rc<Fixture> {
    thread_local! {
        static F: std::rc::Rc<Fixture> = std::rc::Rc::new(Fixture::new());
    }
    F.with(|f| f.clone())
}

/// The pairs the uid describer used to confuse (it described unknown
/// expression kinds by their children only).
#[test]
fn expressions_that_used_to_share_a_uid() {
    let f = fixture();
    let pairs = [
        ("a IN (1, 2, 3)", "a NOT IN (1, 2, 3)"),
        ("a IN (1, 2, 3)", "a IN (1, 2, 4)"),
        ("s LIKE 'a%'", "s NOT LIKE 'a%'"),
        ("s LIKE 'a%'", "s ILIKE 'a%'"),
        ("s ILIKE 'a%'", "s NOT ILIKE 'a%'"),
        ("TRY_CAST(s AS INT) > 0", "TRY_CAST(s AS BIGINT) > 0"),
        (
            "CASE WHEN a > 1 THEN 'x' ELSE 'y' END = 'x'",
            "CASE WHEN a > 1 THEN 'y' ELSE 'x' END = 'x'",
        ),
        (
            "CASE WHEN a > 1 THEN 'x' END = 'x'",
            "CASE WHEN a > 1 THEN 'x' ELSE 'x' END = 'x'",
        ),
        ("-a > 1", "a > 1"),
    ];
    for (p, q) in pairs {
        let up = f.uids(p, "a").unwrap_or_else(|e| panic!("{p}: {e}"));
        let uq = f.uids(q, "a").unwrap_or_else(|e| panic!("{q}: {e}"));
        assert_ne!(up, uq, "'{p}' and '{q}' share uids");
    }
    let projections = [
        ("TRY_CAST(s AS INT)", "TRY_CAST(s AS BIGINT)"),
        ("CASE a WHEN 1 THEN 2 ELSE 3 END", "CASE a WHEN 1 THEN 3 ELSE 2 END"),
    ];
    for (p, q) in projections {
        assert_ne!(f.uids("a > 0", p), f.uids("a > 0", q), "'{p}' and '{q}' share uids");
    }
    // Literals the state codec does not encode (an INTERVAL) were all `?`.
    assert_ne!(
        f.uids("ts + INTERVAL '5' SECOND > TIMESTAMP '2024-01-01 00:00:00'", "a"),
        f.uids("ts + INTERVAL '1' HOUR > TIMESTAMP '2024-01-01 00:00:00'", "a"),
        "interval literals share uids"
    );
    // A source reading other columns of the same types (projection
    // pushdown left only their types in the uid), or a computed column.
    let pairs = [
        (
            "INSERT INTO out2 SELECT k, SUM(x) FROM t2 GROUP BY k",
            "INSERT INTO out2 SELECT k, SUM(y) FROM t2 GROUP BY k",
        ),
        (
            "INSERT INTO out2 SELECT k, SUM(x) FROM t2 GROUP BY k",
            "INSERT INTO out2 SELECT k, SUM(z) FROM t2 GROUP BY k",
        ),
        (
            "INSERT INTO out2 SELECT k, CAST(LISTAGG(CAST(x AS STRING)) AS BIGINT) FROM t2 GROUP BY k",
            "INSERT INTO out2 SELECT k, CAST(LISTAGG(CAST(x AS STRING), ';') AS BIGINT) FROM t2 GROUP BY k",
        ),
    ];
    let windows = (
        "INSERT INTO out3 SELECT window_start, window_end, COUNT(*) FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY window_start, window_end",
        "INSERT INTO out3 SELECT window_end, window_start, COUNT(*) FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY window_end, window_start",
    );
    for (p, q) in pairs.into_iter().chain([windows]) {
        let up = f.uids_of(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        let uq = f.uids_of(q).unwrap_or_else(|e| panic!("{q}: {e}"));
        assert_ne!(up, uq, "'{p}' and '{q}' share uids");
    }
}

/// A fixed query's uids, recorded: the same in every run and build (a
/// change here breaks every savepoint of such a query: only on purpose).
#[test]
fn uids_are_stable_across_runs() {
    let f = fixture();
    // Reads every column, with the expression kinds described before
    // (these uids are the ones Weir gave this query before they were
    // made total: savepoints of such queries still restore).
    let uids = f
        .uids(
            "a > 1 AND s IS NOT NULL AND d > 0 AND ts IS NOT NULL",
            "CAST(a AS BIGINT) + 1",
        )
        .expect("planned");
    assert_eq!(uids, RECORDED, "uids changed");
    // Flink's string functions hold function pointers, whose addresses
    // differ in every run of the binary: described by their name, these
    // uids are the same in each run (and the same as before).
    let uids = f
        .uids(
            "UPPER(s) = 'ABC' AND REGEXP_REPLACE(s, 'a', 'b') <> '' AND d > 0 AND ts IS NOT NULL",
            "CONCAT(s, 'x')",
        )
        .expect("planned");
    assert_eq!(
        uids, RECORDED_FUNCTIONS,
        "uids of a query with Flink's string functions changed"
    );
}

const RECORDED_FUNCTIONS: [&str; 7] = [
    "source_982ad2013713",
    "calc_8e2fddd957ea",
    "calc_8f6de3494bde",
    "group_6fb76a851437",
    "calc_c0a8c67753b1",
    "calc_af6da474f763",
    "sink_62654a5a3725",
];

const RECORDED: [&str; 7] = [
    "source_982ad2013713",
    "calc_c6743776d5b8",
    "calc_c2577b592ea6",
    "group_0c6b8d23c8ac",
    "calc_2d5fb07e6ce8",
    "calc_49791c0eb1df",
    "sink_d898b7277f8d",
];

/// One query per node kind and variant (every window kind, every join,
/// Top-N and deduplication, OVER with LAG, the changelog operators).
const KIND_QUERIES: &[&str] = &[
    "INSERT INTO o_w SELECT window_start, window_end, a, COUNT(*), SUM(d)
       FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY window_start, window_end, a",
    "INSERT INTO o_w SELECT window_start, window_end, a, COUNT(DISTINCT s), MAX(d)
       FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND, INTERVAL '1' MINUTE))
       GROUP BY window_start, window_end, a",
    "INSERT INTO o_w SELECT window_start, window_end, a, COUNT(*), AVG(d)
       FROM TABLE(CUMULATE(TABLE t, DESCRIPTOR(ts), INTERVAL '10' SECOND, INTERVAL '1' MINUTE))
       GROUP BY window_start, window_end, a",
    "INSERT INTO o_w SELECT window_start, window_end, a, COUNT(*), MIN(d)
       FROM TABLE(SESSION(TABLE t PARTITION BY a, DESCRIPTOR(ts), INTERVAL '5' SECOND))
       GROUP BY window_start, window_end, a",
    "INSERT INTO o_w SELECT window_end, window_start, a, COUNT(*), SUM(d)
       FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY window_end, window_start, a",
    "INSERT INTO o_s SELECT a, s, window_start, window_end
       FROM TABLE(SESSION(TABLE t PARTITION BY a, DESCRIPTOR(ts), INTERVAL '5' SECOND))",
    "INSERT INTO o_g SELECT a, COUNT(DISTINCT s), MAX(d), LISTAGG(s) FROM t GROUP BY a",
    "INSERT INTO o_g SELECT a, SUM(CAST(d AS BIGINT)) FILTER (WHERE d > 0), STDDEV_POP(d), MIN(s) FROM t GROUP BY a",
    "INSERT INTO o_j SELECT t.a, t.s, u.s FROM t JOIN u ON t.a = u.a WHERE t.d > 0",
    "INSERT INTO o_j SELECT t.a, t.s, u.s FROM t LEFT JOIN u ON t.a = u.a AND t.s <> u.s",
    "INSERT INTO o_j SELECT t.a, t.s, u.s FROM t JOIN u ON t.a = u.a
       AND t.ts BETWEEN u.ts - INTERVAL '1' MINUTE AND u.ts",
    "INSERT INTO o_j SELECT l.a, l.s, r.s
       FROM (SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE))) l
       JOIN (SELECT * FROM TABLE(TUMBLE(TABLE u, DESCRIPTOR(ts), INTERVAL '1' MINUTE))) r
       ON l.a = r.a AND l.window_start = r.window_start AND l.window_end = r.window_end",
    "INSERT INTO o_j SELECT t.a, t.s, ur.s FROM t JOIN ur FOR SYSTEM_TIME AS OF t.ts ON t.a = ur.a",
    "INSERT INTO o_j SELECT a, s, s FROM t UNION ALL SELECT a, s, s FROM u",
    "INSERT INTO o_r SELECT a, s, d FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY a ORDER BY d DESC) AS rn FROM t)
       WHERE rn <= 3",
    "INSERT INTO o_r SELECT a, s, d FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY a ORDER BY ts DESC) AS rn FROM t)
       WHERE rn = 1",
    "INSERT INTO o_r SELECT a, s, d FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY a ORDER BY ts ASC) AS rn FROM t)
       WHERE rn = 1",
    "INSERT INTO o_r SELECT a, s, d FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end
       ORDER BY d DESC) AS rn FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MINUTE))) WHERE rn <= 2",
    "INSERT INTO o_r SELECT a, s, d FROM t LIMIT 5",
    "INSERT INTO o_r SELECT a, s, d FROM t ORDER BY ts, d DESC",
    "INSERT INTO o_o SELECT a, SUM(d) OVER w, LAG(s, 2, 'none') OVER w FROM t
       WINDOW w AS (PARTITION BY a ORDER BY ts ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)",
    "INSERT INTO o_o SELECT a, MAX(d) OVER (PARTITION BY a ORDER BY ts
       RANGE BETWEEN INTERVAL '1' MINUTE PRECEDING AND CURRENT ROW), s FROM t",
    "INSERT INTO o_pk SELECT s, COUNT(*) FROM t GROUP BY a, s ON CONFLICT DO DEDUPLICATE",
    "INSERT INTO o_j SELECT a, s, s FROM ur",
];

/// The uids of one query per node kind, as Weir gave them when they were
/// recorded (`WEIR_RECORD_UIDS=1` rewrites the file): a change to how a
/// kind writes its uid would leave its savepoints' state unclaimed.
#[test]
fn every_node_kind_keeps_its_recorded_uids() {
    let f = fixture();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/uids_by_kind.txt");
    let got: Vec<String> = KIND_QUERIES
        .iter()
        .map(|q| {
            let uids = f.uids_of(q).unwrap_or_else(|e| panic!("{q}: {e}"));
            uids.join(" ")
        })
        .collect();
    let kinds: std::collections::BTreeSet<&str> = got
        .iter()
        .flat_map(|l| l.split(' '))
        .filter_map(|u| u.rsplit_once('_').map(|(k, _)| k))
        .collect();
    for kind in [
        "source",
        "calc",
        "window",
        "group",
        "join",
        "union",
        "rank",
        "limit",
        "temporal_sort",
        "over_aggregate",
        "session_window",
        "upsert_materialize",
        "changelog_normalize",
        "sink",
    ] {
        assert!(kinds.contains(kind), "no query makes a {kind} node: {kinds:?}");
    }
    if std::env::var_os("WEIR_RECORD_UIDS").is_some() {
        std::fs::write(&path, got.join("\n") + "\n").expect("record");
    }
    let recorded = std::fs::read_to_string(&path).expect("recorded uids");
    let recorded: Vec<&str> = recorded.lines().collect();
    assert_eq!(recorded.len(), KIND_QUERIES.len(), "one recorded line per query");
    for ((q, got), want) in KIND_QUERIES.iter().zip(&got).zip(recorded) {
        assert_eq!(got, want, "uids of {q}");
    }
}
