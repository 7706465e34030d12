//! No panic on any input: the SQL front door and the Flight SQL request
//! decoders (issue 14, item 6).
//!
//! - SQL: the statements of `tests/sql/*.slt`, mutated token by token
//!   (deleted, repeated, swapped, replaced by risky tokens: huge numbers,
//!   intervals, odd Unicode, window TVF arguments, placeholders), are
//!   parsed, planned and, when cheap and bounded, executed in a session
//!   over a temporary data dir. `INSERT` is only planned (`EXPLAIN`): its
//!   job would outlive the case. A live query is read for a moment and
//!   cancelled.
//! - Deeply nested SQL, run on a thread with a server worker's stack.
//! - Prepared-statement parameters (`src/server/params.rs`): templates of
//!   any text, values of every bindable type; a bound string or number is
//!   always one literal token (no injection).
//! - Flight SQL commands and tickets: arbitrary bytes and mutated messages
//!   through prost's `Any` into arrow-flight's `Command`; parameter batches
//!   through arrow-flight's IPC decoder, as `parameter_batch` decodes them.
//!
//! A panic anywhere (also in a job's tasks: a panic hook counts them) fails
//! the case; proptest shrinks it and records it in
//! `proptest-regressions/fuzz.txt`, which is committed and replayed first.
//! Cases: `PROPTEST_CASES`; seed: `PROPTEST_RNG_SEED`, printed by every
//! test. Long runs: `PROPTEST_CASES=5000 cargo test --test fuzz`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, Date64Array, Decimal128Array, Float32Array, Float64Array, Int8Array,
    Int16Array, Int32Array, Int64Array, LargeStringArray, RecordBatch, StringArray, Time32SecondArray,
    Time64MicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::FlightData;
use arrow_flight::sql::{Any, Command, ProstMessageExt};
use futures::{StreamExt, TryStreamExt};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};
use prost::Message;
use sqlparser::dialect::GenericDialect;
use sqlparser::tokenizer::{Token, Tokenizer};
use weir::{Session, StatementResult};

/// Where failing cases are kept: the workspace's `proptest-regressions/`.
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/fuzz.txt");

/// The proptest configuration of one test: `default_cases` unless
/// `PROPTEST_CASES` says otherwise, and a seed that is printed so a failure
/// found at random can be replayed with `PROPTEST_RNG_SEED`.
fn config(test: &str, default_cases: u32) -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = default_cases;
    }
    let seed = match c.rng_seed {
        RngSeed::Fixed(s) => s,
        RngSeed::Random => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    eprintln!(
        "{test}: {} cases, seed {seed} (replay: PROPTEST_RNG_SEED={seed})",
        c.cases
    );
    c.rng_seed = RngSeed::Fixed(seed);
    c.failure_persistence = Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS)));
    c.max_shrink_time = 60_000;
    c
}

/// Panics seen on any thread since the hook was installed: a job's task
/// that panics fails its job with an error, which alone would hide it.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => panic!("cannot start a tokio runtime for the fuzz tests: {e}"),
        }
    })
}

// ---------------------------------------------------------------------------
// The SQL corpus

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Every slt file as a script: its blocks' SQL in order.
fn corpus() -> &'static Vec<Vec<String>> {
    static CORPUS: OnceLock<Vec<Vec<String>>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sql");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        let data = data_dir().display().to_string();
        files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "slt"))
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .map(|text| {
                let mut scripts = vec![];
                let mut sql: Vec<&str> = vec![];
                let mut in_block = false;
                let mut in_rows = false;
                for line in text.lines().chain(std::iter::once("")) {
                    let t = line.trim();
                    if t.is_empty() {
                        if !sql.is_empty() {
                            scripts.push(sql.join("\n").replace("${DATA}", &data));
                        }
                        sql.clear();
                        (in_block, in_rows) = (false, false);
                    } else if !in_block {
                        // A comment, or a block header.
                        in_block = !t.starts_with('#');
                    } else if t == "----" {
                        in_rows = true;
                    } else if !in_rows {
                        sql.push(line);
                    }
                }
                scripts
            })
            .filter(|s| !s.is_empty())
            .collect()
    })
}

/// Tokens the mutator puts in: the risky spots of the grammar and of the
/// planner.
const RISKY: &[&str] = &[
    "(",
    ")",
    ",",
    ";",
    "NULL",
    "*",
    "-",
    "+",
    "/",
    "0",
    "1/0",
    "-1",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "99999999999999999999999999999999999999999",
    "1e309",
    "1.7976931348623157e308",
    "0.1e-400",
    "INTERVAL '0' SECOND",
    "INTERVAL '-1' SECOND",
    "INTERVAL '1.5' SECOND",
    "INTERVAL '0.0001' SECOND",
    "INTERVAL '99999999999999' DAY",
    "INTERVAL '106751991' DAY",
    "INTERVAL '9223372036854775807' MILLISECOND",
    "INTERVAL '9223372036854775' SECOND",
    "INTERVAL '1' MONTH",
    "INTERVAL '1' YEAR",
    "INTERVAL '1-2' YEAR TO MONTH",
    "INTERVAL '1 2:03:04' DAY TO SECOND",
    "INTERVAL 'x' SECOND",
    "INTERVAL '' SECOND",
    "INTERVAL '1'",
    "INTERVAL",
    "TIMESTAMP '9999-12-31 23:59:59.999'",
    "TIMESTAMP '+275760-09-13 00:00:00'",
    "TIMESTAMP '1677-09-21 00:12:43.145224191'",
    "TIMESTAMP '2024-13-45 99:99:99'",
    "DATE '-9999-01-01'",
    "CAST(ts AS BIGINT)",
    "CAST(9223372036854775807 AS TIMESTAMP(3))",
    "CAST(-9223372036854775808 AS TIMESTAMP(3))",
    "CAST('x' AS DECIMAL(38, 38))",
    "DECIMAL(39, 2)",
    "DECIMAL(0, 0)",
    "TIMESTAMP(9)",
    "TIMESTAMP_LTZ(3)",
    "'\u{202e}\u{0}\u{feff}'",
    "'\u{1F600}e\u{301}'",
    "`\u{1F600}`",
    "\"\u{FFFF}\"",
    "'it''s'",
    "''",
    "TABLE",
    "TUMBLE",
    "HOP",
    "CUMULATE",
    "SESSION",
    "DESCRIPTOR(ts)",
    "DESCRIPTOR()",
    "DESCRIPTOR(`user`)",
    "TABLE(TUMBLE(TABLE orders, DESCRIPTOR(ts), INTERVAL '0' SECOND))",
    "TABLE(HOP(TABLE orders, DESCRIPTOR(ts), INTERVAL '3' SECOND, INTERVAL '10' SECOND))",
    "TABLE(CUMULATE(TABLE orders, DESCRIPTOR(ts)))",
    "TUMBLE(ts, INTERVAL '9223372036854775' SECOND, INTERVAL '9223372036854775' SECOND)",
    "window_start",
    "window_end",
    "window_time",
    "ts",
    "`user`",
    "amount",
    "orders",
    "COUNT(*)",
    "SUM(amount)",
    "AVG(",
    "MIN(ts)",
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP BY",
    "ORDER BY",
    "LIMIT 9223372036854775807",
    "LIMIT 0",
    "OFFSET 18446744073709551615",
    "UNION ALL",
    "JOIN",
    "EXPLAIN",
    "SUBSCRIBE TO",
    "WATERMARK FOR ts AS ts",
    "ALIGNMENT GROUP 'g' MAX DRIFT INTERVAL '0' SECOND",
    "?",
    "$1",
    "$0",
    "--",
    "/*",
    "'",
    "\"",
    "`",
    "\\",
    "::",
    "[1]",
    "ARRAY[1, 2]",
    "STRUCT(1)",
    "x'ff'",
    "E'\\x'",
    "__weir_window(ts, 'HOP', 10, 0, 0, 'end')",
    "@",
    "#",
];

/// A change to a statement's token list.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Repeat(usize),
    Swap(usize, usize),
    Replace(usize, usize),
    Insert(usize, usize),
    /// A token of another statement of the corpus (file, statement, token).
    Splice(usize, usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        any::<usize>().prop_map(Edit::Delete),
        any::<usize>().prop_map(Edit::Repeat),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::Swap(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::Replace(a, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::Insert(a, b)),
        (any::<usize>(), any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(a, b, c, d)| Edit::Splice(a, b, c, d)),
    ]
}

/// The text of `sql`'s tokens (whitespace kept), or the text itself when
/// it does not tokenize.
fn tokens(sql: &str) -> Vec<String> {
    match Tokenizer::new(&GenericDialect {}, sql).with_unescape(false).tokenize() {
        Ok(t) => t.iter().map(Token::to_string).collect(),
        Err(_) => vec![sql.to_string()],
    }
}

fn apply(sql: &str, edits: &[Edit]) -> String {
    let mut t = tokens(sql);
    for e in edits {
        let n = t.len().max(1);
        match *e {
            Edit::Delete(i) if !t.is_empty() => {
                t.remove(i % n);
            }
            Edit::Repeat(i) if !t.is_empty() => {
                let x = t[i % n].clone();
                t.insert(i % n, x);
            }
            Edit::Swap(a, b) if !t.is_empty() => t.swap(a % n, b % n),
            Edit::Replace(i, r) if !t.is_empty() => t[i % n] = RISKY[r % RISKY.len()].to_string(),
            Edit::Insert(i, r) => t.insert(i % (t.len() + 1), format!(" {} ", RISKY[r % RISKY.len()])),
            Edit::Splice(at, f, s, k) => {
                let c = corpus();
                let file = &c[f % c.len()];
                let other = tokens(&file[s % file.len()]);
                if !other.is_empty() {
                    let x = other[k % other.len()].clone();
                    t.insert(at % (t.len() + 1), x);
                }
            }
            _ => {}
        }
    }
    t.concat()
}

/// How long one statement may take before the case counts as a hang.
const STATEMENT_DEADLINE: Duration = Duration::from_secs(20);
/// How long a live query is read before it is cancelled.
const LIVE_QUERY_READ: Duration = Duration::from_millis(300);

/// Runs one statement's result to its end (a live query: for a moment).
/// Display runs on every batch, as a client would render it.
async fn drain(result: StatementResult) -> Result<(), String> {
    match result {
        StatementResult::Rows(_, batches) => {
            for b in &batches {
                weir::display::format_rows(b).map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        StatementResult::Stream(mut rs) => {
            let deadline = tokio::time::Instant::now() + LIVE_QUERY_READ;
            loop {
                match tokio::time::timeout_at(deadline, rs.rows.recv()).await {
                    Ok(Some(b)) => {
                        weir::display::format_rows(&b).map_err(|e| e.to_string())?;
                    }
                    Ok(None) => {
                        // Ended: its error, if any, is the answer.
                        return match rs.job.wait().await {
                            Ok(_) => Ok(()),
                            Err(e) => Err(e.to_string()),
                        };
                    }
                    Err(_) => {
                        let _ = rs.job.cancel().await;
                        return Ok(());
                    }
                }
            }
        }
        StatementResult::Explain(_)
        | StatementResult::Done(_)
        | StatementResult::JobStarted { .. }
        | StatementResult::JobEnded { .. } => Ok(()),
    }
}

/// Parses, plans and (when bounded) runs `script` statement by statement
/// in `session`, going on after errors. Returns the errors' messages.
async fn run_script(session: &mut Session, script: &str) -> Vec<String> {
    let mut errors = vec![];
    let stmts = match weir_sql::parse(script) {
        Ok(s) => s,
        Err(e) => return vec![e.to_string()],
    };
    for stmt in stmts {
        let text = match &stmt.statement {
            // Its job would run on after the case: plan it only.
            weir_sql::Statement::Insert { .. } => format!("EXPLAIN {}", stmt.text),
            _ => stmt.text.clone(),
        };
        let run = async {
            match session.execute_sql(&text).await {
                Ok(results) => {
                    for r in results {
                        drain(r).await?;
                    }
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        };
        match tokio::time::timeout(STATEMENT_DEADLINE, run).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => panic!("statement did not end within {STATEMENT_DEADLINE:?}: {text}"),
        }
    }
    errors
}

/// Runs `scripts` in a fresh session and data dir; fails on any panic or
/// on an error that says a bug of ours was hit.
fn check_scripts(scripts: &[String]) -> Result<(), TestCaseError> {
    count_panics();
    let before = PANICS.load(Ordering::SeqCst);
    let tmp = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let errors = runtime().block_on(async {
        let mut session = match Session::open(tmp.path().join("weir-data")) {
            Ok(s) => s,
            Err(e) => return vec![format!("cannot open a session: {e}")],
        };
        let mut errors = vec![];
        for s in scripts {
            let s = s.replace("${TMP}", &tmp.path().display().to_string());
            errors.extend(run_script(&mut session, &s).await);
        }
        for job in session.take_jobs() {
            let _ = job.cancel().await;
        }
        errors
    });
    let after = PANICS.load(Ordering::SeqCst);
    prop_assert_eq!(after, before, "a panic while running:\n{}", scripts.join(";\n"));
    for e in &errors {
        // "panicked" comes from a task's JoinError; "internal error" is how
        // our errors and DataFusion's say "a bug", never the user's fault.
        let bug = e.contains("panicked") || e.contains("Internal error") || e.contains("internal error");
        prop_assert!(!bug, "a bug reported as an error: {}\nfor:\n{}", e, scripts.join(";\n"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(config("sql_statements", 48))]
    /// A few consecutive statements of a corpus file, after the file's
    /// CREATE statements (so they have their tables), some of them mutated.
    #[test]
    fn sql_statements_never_panic(
        file in any::<prop::sample::Index>(),
        start in any::<prop::sample::Index>(),
        len in 1usize..4,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), proptest::collection::vec(edit(), 1..4)), 1..4),
    ) {
        let c = corpus();
        let all = &c[file.index(c.len())];
        let start = start.index(all.len());
        let mut script: Vec<String> = all[..start]
            .iter()
            .filter(|s| s.trim_start().to_ascii_uppercase().starts_with("CREATE"))
            .cloned()
            .collect();
        let setup = script.len();
        script.extend(all[start..(start + len).min(all.len())].iter().cloned());
        for (which, e) in &edits {
            // Mostly the statements under test, sometimes the setup.
            let i = which.index(script.len());
            let i = if i < setup && which.index(4) != 0 { script.len() - 1 } else { i };
            script[i] = apply(&script[i], e);
        }
        check_scripts(&script)?;
    }

    /// Statements of any text: the tokenizer and parser see everything.
    #[test]
    fn sql_text_never_panics(text in "\\PC{0,80}", risky in proptest::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let mut sql = text;
        for r in risky {
            sql.push(' ');
            sql.push_str(RISKY[r.index(RISKY.len())]);
        }
        // Parsing is most of what arbitrary text reaches; run it too.
        let _ = weir_sql::parse(&sql);
        check_scripts(&[sql])?;
    }
}

// ---------------------------------------------------------------------------
// Crashes the fuzzer found, with their minimal inputs.

/// Runs `script` (statements separated by `;`, `${TMP}` a temp dir) in a
/// fresh session; the errors' messages. Fails on a panic anywhere.
fn errors_of(script: &str) -> Vec<String> {
    count_panics();
    let before = PANICS.load(Ordering::SeqCst);
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => panic!("temp dir: {e}"),
    };
    let script = script.replace("${TMP}", &tmp.path().display().to_string());
    let errors = runtime().block_on(async {
        match Session::open(tmp.path().join("weir-data")) {
            Ok(mut session) => run_script(&mut session, &script).await,
            Err(e) => vec![e.to_string()],
        }
    });
    assert_eq!(PANICS.load(Ordering::SeqCst), before, "a panic while running {script}");
    errors
}

#[test]
fn regression_window_marker_is_not_callable() {
    // Called directly with a slide of 0 it reached the HOP assigner: a
    // division by zero in the window operator's task.
    let table = "CREATE TABLE t (ts TIMESTAMP(3), WATERMARK FOR ts AS ts) WITH ('connector' = 'datagen')";
    for query in [
        "SELECT COUNT(*) FROM t GROUP BY __weir_window(ts, 'HOP', 10, 0, 0, 'end')",
        "SELECT __WEIR_WINDOW(ts, 'TUMBLE', 0, 0, 0, 'start') FROM t",
    ] {
        let errors = errors_of(&format!("{table}; {query}"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("internal to Weir"), "{}", errors[0]);
    }
}

#[test]
fn regression_window_bounds_at_the_ends_of_time() {
    // Event times near i64::MAX (a BIGINT cast to TIMESTAMP(3)) and sizes
    // or offsets of millions of years overflowed the window arithmetic.
    let data = "{\"n\": 9223372036854775807}\n{\"n\": -9223372036854775808}\n{\"n\": 0}\n";
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => panic!("temp dir: {e}"),
    };
    let path = tmp.path().join("extreme.json");
    if let Err(e) = std::fs::write(&path, data) {
        panic!("writing {}: {e}", path.display());
    }
    let table = format!(
        "CREATE TABLE x (n BIGINT, ts AS CAST(n AS TIMESTAMP(3)), WATERMARK FOR ts AS ts)
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json')",
        path.display()
    );
    for window in [
        "TUMBLE(TABLE x, DESCRIPTOR(ts), INTERVAL '10' SECOND)",
        "TUMBLE(TABLE x, DESCRIPTOR(ts), INTERVAL '106751991' DAY, INTERVAL '106751990' DAY)",
        "HOP(TABLE x, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND)",
        "CUMULATE(TABLE x, DESCRIPTOR(ts), INTERVAL '5' SECOND, INTERVAL '10' SECOND)",
    ] {
        let errors = errors_of(&format!(
            "{table};
             SET 'parallelism.default' = '1';
             SELECT window_start, window_end, COUNT(*) FROM TABLE({window}) GROUP BY window_start, window_end;
             SELECT window_start, window_end, window_time FROM TABLE({window})"
        ));
        for e in &errors {
            assert!(!e.contains("panic") && !e.contains("overflow"), "{window}: {e}");
        }
    }
}

#[test]
fn regression_hop_with_millions_of_windows_per_row_is_refused() {
    // One row of HOP(1 ms, 1 day) is 86 400 000 windows, assigned one at a
    // time: the job hung on its first row.
    let errors = errors_of(
        "CREATE TABLE t (ts TIMESTAMP(3), WATERMARK FOR ts AS ts) WITH ('connector' = 'datagen');
         EXPLAIN SELECT window_end, COUNT(*) FROM TABLE(HOP(TABLE t, DESCRIPTOR(ts), INTERVAL '1' MILLISECOND, INTERVAL '1' DAY)) GROUP BY window_start, window_end",
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("86400000 windows"), "{}", errors[0]);
}

// ---------------------------------------------------------------------------
// Deep nesting: the parser has a recursion limit, but chains of binary
// operators and set operations are built by loops; whatever walks the tree
// afterwards (rewrite, planner, Display, Drop) recurses once per level.

/// Runs `sql` through parse and a session on a thread with the stack the
/// `weir` binary gives its runtime threads; a stack overflow aborts the
/// test binary, so a failure is seen as the whole `fuzz` binary crashing.
fn run_on_small_stack(sql: String) -> Result<Vec<String>, String> {
    let handle = std::thread::Builder::new()
        .stack_size(weir::cli::THREAD_STACK_BYTES)
        .spawn(move || {
            let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let mut session = Session::open(tmp.path().join("weir-data")).map_err(|e| e.to_string())?;
                Ok(run_script(&mut session, &sql).await)
            })
        })
        .map_err(|e| e.to_string())?;
    handle.join().map_err(|_| "the statement panicked".to_string())?
}

fn deep_statements(n: usize) -> Vec<(&'static str, String)> {
    vec![
        ("parentheses", format!("SELECT {}1{}", "(".repeat(n), ")".repeat(n))),
        ("binary chain", format!("SELECT 1{}", " + 1".repeat(n))),
        ("OR chain", format!("SELECT 1 WHERE {}", vec!["1 = 1"; n].join(" OR "))),
        ("cast chain", format!("SELECT 1{}", "::BIGINT".repeat(n))),
        ("unary minus", format!("SELECT {}1", "- ".repeat(n))),
        ("NOT", format!("SELECT {}TRUE", "NOT ".repeat(n))),
        ("UNION chain", format!("SELECT 1{}", " UNION ALL SELECT 1".repeat(n))),
        (
            "subqueries",
            format!(
                "SELECT * FROM {}(SELECT 1){}",
                "(SELECT * FROM ".repeat(n),
                ")".repeat(n)
            ),
        ),
        (
            "CASE",
            format!("SELECT {}1{}", "CASE WHEN TRUE THEN ".repeat(n), " END".repeat(n)),
        ),
        ("EXPLAIN", format!("{}SELECT 1", "EXPLAIN ".repeat(n))),
        ("IS NULL chain", format!("SELECT 1{}", " IS NULL".repeat(n))),
        (
            "function calls",
            format!("SELECT {}1{}", "ABS(".repeat(n), ")".repeat(n)),
        ),
    ]
}

#[test]
fn deeply_nested_sql_is_an_error_not_a_crash() {
    for n in [8, 120, 1_000, 20_000, 200_000] {
        for (what, sql) in deep_statements(n) {
            eprintln!("{what} x{n}");
            match run_on_small_stack(sql) {
                Ok(errors) => {
                    // Shallow cases may run; deep ones must say why not.
                    if n >= 1_000 {
                        assert!(
                            errors.iter().any(|e| e.contains("nested too deeply")),
                            "{what} x{n}: {errors:?}"
                        );
                    }
                }
                Err(e) => panic!("{what} x{n}: {e}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Prepared-statement parameters (src/server/params.rs)

#[path = "../src/server/params.rs"]
#[allow(dead_code)]
mod params;

/// A one-row column of every bindable type, with extreme values.
fn param_column() -> impl Strategy<Value = ArrayRef> {
    let text = prop_oneof![
        "\\PC{0,16}",
        proptest::sample::select(vec![
            "'",
            "''",
            "\\'",
            "\\",
            "' OR 1=1 --",
            "'); DROP TABLE t; --",
            "?",
            "$1",
            "--",
            "/*",
            "\u{0}"
        ])
        .prop_map(str::to_string),
    ];
    prop_oneof![
        any::<Option<bool>>().prop_map(|v| Arc::new(BooleanArray::from(vec![v])) as ArrayRef),
        any::<Option<i8>>().prop_map(|v| Arc::new(Int8Array::from(vec![v])) as ArrayRef),
        any::<Option<i16>>().prop_map(|v| Arc::new(Int16Array::from(vec![v])) as ArrayRef),
        any::<Option<i32>>().prop_map(|v| Arc::new(Int32Array::from(vec![v])) as ArrayRef),
        any::<Option<i64>>().prop_map(|v| Arc::new(Int64Array::from(vec![v])) as ArrayRef),
        any::<Option<u64>>().prop_map(|v| Arc::new(UInt64Array::from(vec![v])) as ArrayRef),
        any::<f32>().prop_map(|v| Arc::new(Float32Array::from(vec![v])) as ArrayRef),
        any::<f64>().prop_map(|v| Arc::new(Float64Array::from(vec![v])) as ArrayRef),
        (any::<i128>(), 1u8..=38, -10i8..=38).prop_map(|(v, p, s)| {
            let a = Decimal128Array::from(vec![v]).with_precision_and_scale(p, s.min(p as i8));
            match a {
                Ok(a) => Arc::new(a) as ArrayRef,
                Err(_) => Arc::new(Decimal128Array::from(vec![v])) as ArrayRef,
            }
        }),
        text.clone()
            .prop_map(|v| Arc::new(StringArray::from(vec![v])) as ArrayRef),
        text.prop_map(|v| Arc::new(LargeStringArray::from(vec![v])) as ArrayRef),
        any::<i32>().prop_map(|v| Arc::new(Date32Array::from(vec![v])) as ArrayRef),
        any::<i64>().prop_map(|v| Arc::new(Date64Array::from(vec![v])) as ArrayRef),
        any::<i64>().prop_map(|v| Arc::new(TimestampSecondArray::from(vec![v])) as ArrayRef),
        any::<i64>().prop_map(|v| Arc::new(TimestampMillisecondArray::from(vec![v])) as ArrayRef),
        (
            any::<i64>(),
            proptest::sample::select(vec!["UTC", "+05:30", "Europe/Paris", "+99:99", "Nowhere/Else", ""])
        )
            .prop_map(|(v, tz)| Arc::new(TimestampNanosecondArray::from(vec![v]).with_timezone(tz)) as ArrayRef),
        any::<i32>().prop_map(|v| Arc::new(Time32SecondArray::from(vec![v])) as ArrayRef),
        any::<i64>().prop_map(|v| Arc::new(Time64MicrosecondArray::from(vec![v])) as ArrayRef),
    ]
}

fn batch_of(columns: Vec<ArrayRef>) -> Option<RecordBatch> {
    let fields: Vec<Field> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("p{i}"), c.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).ok()
}

/// The tokens of `sql` as the planner's tokenizer sees them (unescaped),
/// without whitespace.
fn significant_tokens(sql: &str) -> Option<Vec<Token>> {
    Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .ok()
        .map(|t| t.into_iter().filter(|t| !matches!(t, Token::Whitespace(_))).collect())
}

proptest! {
    #![proptest_config(config("params", 256))]
    /// Templates of any text: parse, render, bind never panic.
    #[test]
    fn templates_of_any_text_never_panic(
        text in "\\PC{0,60}",
        marks in proptest::collection::vec((any::<prop::sample::Index>(), proptest::sample::select(vec!["?", "$1", "$2", "$0", "$65536", "$x", "?::INT", "'?'"])), 0..4),
        columns in proptest::collection::vec(param_column(), 0..3),
    ) {
        let mut sql = text;
        for (at, m) in marks {
            let mut i = at.index(sql.len() + 1);
            while !sql.is_char_boundary(i) {
                i -= 1;
            }
            sql.insert_str(i, m);
        }
        if let Ok(t) = params::Template::parse(&sql) {
            let _ = t.with_nulls();
            let _ = t.numbered();
            if let Some(batch) = batch_of(columns) {
                let _ = t.bind(&batch, 0);
            }
        }
    }

    /// A bound value is exactly one literal in the statement: a string
    /// cannot end its quotes, a number cannot start a comment.
    #[test]
    fn bound_values_are_one_literal(column in param_column(), minus in any::<bool>()) {
        let sql = if minus { "SELECT -? FROM t" } else { "SELECT ? FROM t" };
        let t = params::Template::parse(sql).map_err(TestCaseError::fail)?;
        let Some(batch) = batch_of(vec![column.clone()]) else { return Ok(()) };
        let Ok(bound) = t.bind(&batch, 0) else { return Ok(()) };
        let toks = significant_tokens(&bound);
        prop_assert!(toks.is_some(), "bound statement does not tokenize: {}", bound);
        let toks = toks.unwrap_or_default();
        // SELECT [-] <value tokens> FROM t: the statement's own tokens are
        // all still there, at both ends.
        prop_assert_eq!(&toks[0], &Token::make_keyword("SELECT"), "{}", bound);
        let n = toks.len();
        prop_assert!(n >= 4, "{}", bound);
        prop_assert_eq!(&toks[n - 2], &Token::make_keyword("FROM"), "{}", bound);
        prop_assert_eq!(&toks[n - 1], &Token::make_word("t", None), "{}", bound);
        if let DataType::Utf8 | DataType::LargeUtf8 = column.data_type()
            && !column.is_null(0)
        {
            let value = arrow::util::display::array_value_to_string(&column, 0).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let start = if minus { 2 } else { 1 };
            prop_assert_eq!(&toks[start..n - 2], &[Token::SingleQuotedString(value)][..], "{}", bound);
        }
    }
}

// ---------------------------------------------------------------------------
// Flight SQL commands, tickets and parameter batches

/// The type URLs of every Flight SQL command arrow-flight decodes.
const COMMAND_TYPES: &[&str] = &[
    "type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandStatementUpdate",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandPreparedStatementQuery",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandPreparedStatementUpdate",
    "type.googleapis.com/arrow.flight.protocol.sql.TicketStatementQuery",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetSqlInfo",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetXdbcTypeInfo",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetCatalogs",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetDbSchemas",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetTables",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetTableTypes",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetPrimaryKeys",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetExportedKeys",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetImportedKeys",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandGetCrossReference",
    "type.googleapis.com/arrow.flight.protocol.sql.ActionCreatePreparedStatementRequest",
    "type.googleapis.com/arrow.flight.protocol.sql.ActionClosePreparedStatementRequest",
    "type.googleapis.com/arrow.flight.protocol.sql.CommandStatementIngest",
    "",
    "type.googleapis.com/unknown",
];

/// Mutates bytes: flips, sets, cuts and inserts.
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, op, v) in edits {
        let len = bytes.len();
        match op % 4 {
            0 if len > 0 => bytes[at % len] ^= 1 << (v % 8),
            1 if len > 0 => bytes[at % len] = v,
            2 => bytes.truncate(at % (len + 1)),
            _ => bytes.insert(at % (len + 1), v),
        }
    }
    bytes
}

fn byte_edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..6)
}

/// A parameter batch as a client sends it: schema and batches as Flight data.
fn parameter_messages(batch: RecordBatch) -> Vec<FlightData> {
    runtime().block_on(async {
        arrow_flight::encode::FlightDataEncoderBuilder::new()
            .build(futures::stream::iter([Ok::<_, arrow_flight::error::FlightError>(
                batch,
            )]))
            .filter_map(|m| async move { m.ok() })
            .collect()
            .await
    })
}

/// What `server::parameter_batch` does with the messages of a DoPut,
/// with `params::ParameterStreamCheck` first (arrow-ipc panics on messages
/// it does not check).
fn decode_parameters(messages: Vec<FlightData>) -> Result<RecordBatch, String> {
    let mut check = params::ParameterStreamCheck::default();
    for m in &messages {
        check.check(&m.data_header, &m.data_body)?;
    }
    runtime().block_on(async {
        let messages = messages.into_iter().filter(|m| !m.data_header.is_empty());
        let batches: Vec<RecordBatch> = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            futures::stream::iter(messages.map(Ok)),
        )
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
        match batches.first() {
            None => Ok(RecordBatch::new_empty(Arc::new(Schema::empty()))),
            Some(first) => arrow::compute::concat_batches(&first.schema(), &batches).map_err(|e| e.to_string()),
        }
    })
}

proptest! {
    #![proptest_config(config("flight", 512))]
    /// Arbitrary bytes as a command or ticket.
    #[test]
    fn commands_of_any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Ok(any) = Any::decode(bytes.as_slice()) {
            let _ = Command::try_from(any);
        }
        let _ = arrow_flight::FlightDescriptor::decode(bytes.as_slice());
        let _ = arrow_flight::Ticket::decode(bytes.as_slice());
        let _ = arrow_flight::Action::decode(bytes.as_slice());
    }

    /// A well-formed `Any` of every command type, with a damaged body.
    #[test]
    fn commands_with_damaged_bodies_never_panic(
        which in any::<prop::sample::Index>(),
        sql in "\\PC{0,24}",
        edits in byte_edits(),
    ) {
        let body = arrow_flight::sql::CommandStatementQuery { query: sql.clone(), transaction_id: None }.encode_to_vec();
        let any = Any { type_url: COMMAND_TYPES[which.index(COMMAND_TYPES.len())].to_string(), value: mutate(body, &edits).into() };
        let _ = Command::try_from(any.clone());
        // The ticket the server hands out, damaged in transit.
        let ticket = arrow_flight::sql::TicketStatementQuery { statement_handle: sql.into_bytes().into() }.as_any().encode_to_vec();
        if let Ok(any) = Any::decode(mutate(ticket, &edits).as_slice()) {
            let _ = Command::try_from(any);
        }
    }

    /// Parameter batches: real ones, damaged in their IPC header or body,
    /// then bound into a statement as the server does.
    #[test]
    fn parameter_batches_never_panic(
        columns in proptest::collection::vec(param_column(), 1..3),
        target in any::<prop::sample::Index>(),
        in_header in any::<bool>(),
        edits in byte_edits(),
    ) {
        let Some(batch) = batch_of(columns) else { return Ok(()) };
        let mut messages = parameter_messages(batch);
        if !messages.is_empty() {
            let i = target.index(messages.len());
            let m = &mut messages[i];
            if in_header {
                m.data_header = mutate(m.data_header.to_vec(), &edits).into();
            } else {
                m.data_body = mutate(m.data_body.to_vec(), &edits).into();
            }
        }
        if let Ok(params) = decode_parameters(messages) {
            let t = params::Template::parse("SELECT ?, ? FROM t WHERE a = $1").or_else(|_| params::Template::parse("SELECT ?, ?"));
            if let Ok(t) = t {
                for row in 0..params.num_rows() {
                    let _ = t.bind(&params, row);
                }
            }
        }
    }
}

/// An Int64 parameter column `[1, NULL, 3]` as Flight messages.
fn int_parameters() -> Vec<FlightData> {
    let batch = batch_of(vec![
        Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])) as ArrayRef
    ]);
    match batch {
        Some(b) => parameter_messages(b),
        None => panic!("a one-column batch"),
    }
}

#[test]
fn regression_parameter_buffers_outside_the_body_are_refused() {
    // arrow-ipc sliced the body at the offsets the header gives and
    // panicked ("the offset of the new Buffer cannot exceed the existing
    // length") when a client sent a batch whose body was cut short.
    let mut messages = int_parameters();
    let last = messages.len() - 1;
    messages[last].data_body = messages[last].data_body.slice(..4);
    let e = decode_parameters(messages).expect_err("refused");
    assert!(e.contains("outside the 4-byte body"), "{e}");
    // Undamaged, the same messages decode.
    let ok = decode_parameters(int_parameters()).expect("decodes");
    assert_eq!(ok.num_rows(), 3);
}
