//! What Weir refuses, one entry each, with what Flink 2.3 does with the
//! same statement. The planner and parser raise these errors (never their
//! own copy of the text); `docs/sql.md`'s "Not yet" table is generated from
//! this list (`the_docs_table_is_this_list`), and `tests/sql_files.rs` runs
//! every example against [`EXAMPLE_TABLES`] and expects its message: the
//! docs, the code and the error cannot drift apart. Refusals whose text
//! names the input (a function, a hint, a path's scheme) live where they
//! are raised; the refused functions are in the function registry's table.

use crate::error::SqlError;

/// What Flink 2.3 does with a refusal's example (recorded with the
/// `../shared/tools/flink` PyFlink mini-cluster, `explain_sql` of it over
/// the same tables).
pub enum Flink {
    /// Plans it: Weir is behind.
    Runs,
    /// Refuses it too, with this message.
    Refuses(&'static str),
}

pub struct Refusal {
    /// The feature, as the docs name it (markdown).
    pub what: &'static str,
    /// Weir's whole error message.
    pub message: &'static str,
    pub flink: Flink,
    /// A statement refused with `message`, over [`EXAMPLE_TABLES`].
    pub example: &'static str,
}

impl Refusal {
    pub fn error(&self) -> SqlError {
        SqlError::unsupported(self.message)
    }
}

/// The tables the examples read and write.
pub const EXAMPLE_TABLES: &str = "
CREATE TABLE t (k BIGINT, v BIGINT, s STRING, ts TIMESTAMP(3), pt AS PROCTIME(),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'datagen', 'number-of-rows' = '10');
CREATE TABLE u (k BIGINT, v BIGINT, s STRING, ts TIMESTAMP(3), pt AS PROCTIME(),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'datagen', 'number-of-rows' = '10');
CREATE TABLE r (k BIGINT, rate BIGINT, ts TIMESTAMP(3), PRIMARY KEY (k) NOT ENFORCED,
  WATERMARK FOR ts AS ts) WITH ('connector' = 'filesystem', 'path' = '${DIR}/r', 'format' = 'debezium-json');
CREATE TABLE sink (k BIGINT, v BIGINT) WITH ('connector' = 'blackhole');
CREATE TABLE psink (v BIGINT, k BIGINT) PARTITIONED BY (k)
  WITH ('connector' = 'filesystem', 'path' = '${DIR}/p', 'format' = 'csv');
";

pub static NOT_IN_SUBQUERY: Refusal = Refusal {
    what: "`NOT IN (subquery)`",
    message: "NOT IN (subquery) is not supported on a stream yet (its NULL rules need the whole subquery); \
              write NOT EXISTS",
    flink: Flink::Runs,
    example: "SELECT k FROM t WHERE k NOT IN (SELECT k FROM u)",
};

pub static GROUPING_SETS: Refusal = Refusal {
    what: "`GROUPING SETS`, `CUBE`, `ROLLUP`",
    message: "GROUPING SETS, CUBE and ROLLUP are not supported on a stream yet",
    flink: Flink::Runs,
    example: "SELECT k, s, COUNT(*) FROM t GROUP BY GROUPING SETS ((k), (s))",
};

pub static JOIN_NOT_DISTINCT: Refusal = Refusal {
    what: "a join on `IS NOT DISTINCT FROM`",
    message: "a join on IS NOT DISTINCT FROM is not supported on a stream yet",
    flink: Flink::Runs,
    example: "SELECT t.k FROM t JOIN u ON t.k IS NOT DISTINCT FROM u.k",
};

pub static JOIN_WITHOUT_EQUALITY: Refusal = Refusal {
    what: "a cross join, or a join without an equality between its sides",
    message: "a join on a stream needs at least one equality between the two sides \
              (cross joins and joins on other conditions alone are not supported)",
    flink: Flink::Runs,
    example: "SELECT t.k FROM t CROSS JOIN u",
};

pub static WINDOW_AGGREGATE_FILTER: Refusal = Refusal {
    what: "`FILTER (WHERE ...)` in a window aggregate",
    message: "FILTER (WHERE ...) in a window aggregate is not supported yet",
    flink: Flink::Runs,
    example: "SELECT window_start, COUNT(*) FILTER (WHERE v > 0) \
              FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
};

pub static PROCTIME_SESSION: Refusal = Refusal {
    what: "SESSION windows on processing time",
    message: "SESSION windows on processing time are not supported yet; use a rowtime attribute",
    flink: Flink::Runs,
    example: "SELECT window_start, COUNT(*) FROM TABLE(SESSION(TABLE t, DESCRIPTOR(pt), INTERVAL '1' SECOND)) \
              GROUP BY window_start, window_end",
};

pub static PROCTIME_WINDOW_JOIN: Refusal = Refusal {
    what: "window joins on processing time",
    message: "Processing time Window Join is not supported yet. (as in Flink 2.3; use rowtime attributes)",
    flink: Flink::Refuses("Processing time Window Join is not supported yet."),
    example: "SELECT a.k FROM (SELECT * FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(pt), INTERVAL '1' SECOND))) a \
              JOIN (SELECT * FROM TABLE(TUMBLE(TABLE u, DESCRIPTOR(pt), INTERVAL '1' SECOND))) b \
              ON a.k = b.k AND a.window_start = b.window_start AND a.window_end = b.window_end",
};

pub static PROCTIME_WINDOW_TOP_N: Refusal = Refusal {
    what: "window Top-N on processing time",
    message: "Processing time Window TopN is not supported yet. (as in Flink 2.3; use a rowtime attribute)",
    flink: Flink::Refuses("Processing time Window TopN is not supported yet."),
    example: "SELECT * FROM (SELECT k, v, window_start, window_end, ROW_NUMBER() OVER (PARTITION BY window_start, \
              window_end ORDER BY v DESC) AS rn FROM TABLE(TUMBLE(TABLE t, DESCRIPTOR(pt), INTERVAL '1' SECOND))) \
              WHERE rn <= 3",
};

pub static PROCTIME_OVER: Refusal = Refusal {
    what: "OVER aggregates on processing time",
    message: "OVER aggregates ordered by a processing-time attribute are not supported yet",
    flink: Flink::Runs,
    example: "SELECT k, SUM(v) OVER (PARTITION BY k ORDER BY pt ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM t",
};

pub static OVER_FILTER: Refusal = Refusal {
    what: "`FILTER (WHERE ...)` in an OVER aggregate",
    message: "FILTER (WHERE ...) in an OVER aggregate is not supported",
    flink: Flink::Refuses("OVER must be applied to aggregate function"),
    example: "SELECT k, COUNT(*) FILTER (WHERE v > 0) OVER (PARTITION BY k ORDER BY ts \
              ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM t",
};

pub static OVER_FOLLOWING: Refusal = Refusal {
    what: "OVER frames ending after the current row",
    message: "OVER windows on a stream must end at CURRENT ROW (FOLLOWING rows are not supported)",
    flink: Flink::Refuses("OVER RANGE FOLLOWING windows are not supported yet."),
    example: "SELECT k, SUM(v) OVER (PARTITION BY k ORDER BY ts ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) FROM t",
};

pub static PROCTIME_TEMPORAL_JOIN: Refusal = Refusal {
    what: "temporal joins on processing time (`FOR SYSTEM_TIME AS OF` a proctime)",
    message: "Processing-time temporal join is not supported yet (a versioned table joins on event time: \
              FOR SYSTEM_TIME AS OF the left table's rowtime)",
    flink: Flink::Refuses("Processing-time temporal join is not supported yet."),
    example: "SELECT t.k, r.rate FROM t JOIN r FOR SYSTEM_TIME AS OF t.pt ON t.k = r.k",
};

pub static INSERT_OVERWRITE: Refusal = Refusal {
    what: "`INSERT OVERWRITE`",
    message: "INSERT OVERWRITE is not supported: Streaming mode not support overwrite. (Flink 2.3's message)",
    flink: Flink::Refuses("Streaming mode not support overwrite."),
    example: "INSERT OVERWRITE psink SELECT v, k FROM t",
};

pub static INSERT_PARTITION: Refusal = Refusal {
    what: "`INSERT INTO t PARTITION (...)`",
    message: "INSERT INTO ... PARTITION (...) is not supported; select the partition columns as values",
    flink: Flink::Runs,
    example: "INSERT INTO psink PARTITION (k = 1) SELECT v FROM t",
};

pub static CREATE_OR_REPLACE_TABLE: Refusal = Refusal {
    what: "`CREATE OR REPLACE TABLE`",
    message: "CREATE OR REPLACE TABLE is not supported; DROP the table first",
    flink: Flink::Runs,
    example: "CREATE OR REPLACE TABLE x (a INT) WITH ('connector' = 'blackhole')",
};

pub static MATCH_RECOGNIZE: Refusal = Refusal {
    what: "`MATCH_RECOGNIZE` (complex event processing)",
    message: "MATCH_RECOGNIZE is not supported yet",
    flink: Flink::Runs,
    example: "SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A) DEFINE A AS A.v > 0)",
};

/// Every refusal, in the docs' order.
pub static ALL: &[&Refusal] = &[
    &NOT_IN_SUBQUERY,
    &GROUPING_SETS,
    &JOIN_NOT_DISTINCT,
    &JOIN_WITHOUT_EQUALITY,
    &PROCTIME_TEMPORAL_JOIN,
    &WINDOW_AGGREGATE_FILTER,
    &PROCTIME_SESSION,
    &PROCTIME_WINDOW_JOIN,
    &PROCTIME_WINDOW_TOP_N,
    &PROCTIME_OVER,
    &OVER_FILTER,
    &OVER_FOLLOWING,
    &INSERT_OVERWRITE,
    &INSERT_PARTITION,
    &CREATE_OR_REPLACE_TABLE,
    &MATCH_RECOGNIZE,
];

/// `docs/sql.md`'s table of refusals, and the functions the registry refuses.
pub fn markdown_table() -> String {
    let mut out = String::from("| refused | Flink 2.3 | example |\n|---|---|---|\n");
    for r in ALL {
        let flink = match r.flink {
            Flink::Runs => "runs it".to_string(),
            Flink::Refuses(m) => format!("refuses it too: \"{m}\""),
        };
        out.push_str(&format!("| {} | {flink} | `{}` |\n", r.what, r.example));
    }
    let refused: Vec<String> = crate::functions::refused().map(|name| format!("`{name}`")).collect();
    out.push_str(&format!(
        "\nFunctions refused by name (the function table says why): {}.\n",
        refused.join(", ")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/sql.md` holds the table this list generates.
    #[test]
    fn the_docs_table_is_this_list() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/sql.md");
        let docs = std::fs::read_to_string(path).expect("docs/sql.md");
        let table = markdown_table();
        let (start, end) = ("<!-- refusals:begin -->\n", "<!-- refusals:end -->");
        let (a, b) = (
            docs.find(start).expect("begin marker"),
            docs.find(end).expect("end marker"),
        );
        if std::env::var("WEIR_REWRITE").is_ok_and(|v| v == "1") {
            let new = format!("{}{start}{table}{}", &docs[..a], &docs[b..]);
            std::fs::write(path, new).expect("write docs");
            return;
        }
        assert_eq!(
            &docs[a + start.len()..b],
            table,
            "docs/sql.md's table of refusals is stale: WEIR_REWRITE=1 cargo test --workspace --lib the_docs_table"
        );
    }

    #[test]
    fn messages_are_distinct() {
        let mut m: Vec<&str> = ALL.iter().map(|r| r.message).collect();
        m.sort();
        let n = m.len();
        m.dedup();
        assert_eq!(m.len(), n, "two refusals say the same");
    }
}
