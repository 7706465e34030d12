//! The SQL regression suite: every `tests/sql/*.slt` file runs in a fresh
//! session and data dir.
//!
//! Format (sqllogictest-like):
//! ```text
//! # comment
//! statement ok
//! <sql>
//!
//! statement error <line>:<column>: <message substring>
//! <sql>
//!
//! query [rowsort]
//! <sql>
//! ----
//! <rows as +I[v1, v2]>
//! ```
//! Blocks end at a blank line. Error positions count from the first line
//! of the block's SQL. `${TMP}` is a per-file temporary directory and
//! `${DATA}` is `tests/data`. Query rows are sorted with `rowsort`
//! (needed whenever parallelism > 1). `WEIR_REWRITE=1 cargo test --test
//! sql_files` rewrites the expectations from the actual results.
//!
//! Rows recorded from another engine are references, never rewritten: a
//! query block whose header ends with `recorded:<source>` (`query rowsort
//! recorded:flink-2.3`), or every query block of a file whose leading
//! comments hold a line `# recorded: <source>`, fails as before under
//! `WEIR_REWRITE=1` and keeps its rows (fix Weir, or record it again).

use std::path::{Path, PathBuf};

use weir::{Session, StatementResult};

#[derive(Debug)]
enum Expect {
    Ok,
    Error(String),
    Rows { sort: bool, rows: Vec<String> },
}

#[derive(Debug)]
struct Block {
    /// Comment lines right before the block (kept by rewrite mode).
    comments: String,
    /// Where its expected rows come from when not from Weir (`flink-2.3`).
    recorded: Option<String>,
    header: String,
    sql: String,
    expect: Expect,
}

/// The source every query block of a file was recorded from: a line
/// `# recorded: <source>` among its leading comments.
fn recorded_file(text: &str) -> Option<String> {
    text.lines()
        .take_while(|l| l.starts_with('#') || l.trim().is_empty())
        .find_map(|l| l.strip_prefix("# recorded:"))
        .and_then(|s| s.split_whitespace().next())
        .map(str::to_string)
}

fn parse_file(text: &str) -> Vec<Block> {
    let whole_file = recorded_file(text);
    let mut blocks = vec![];
    let mut lines = text.lines().peekable();
    let mut comments = String::new();
    let mut seen_block = false;
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if t.starts_with('#') {
            // The file's leading comments are kept separately.
            if seen_block {
                comments.push_str(line);
                comments.push('\n');
            }
            continue;
        }
        seen_block = true;
        let header = t.to_string();
        let mut sql = vec![];
        let mut rows = vec![];
        let mut in_rows = false;
        while let Some(l) = lines.peek() {
            if l.trim().is_empty() {
                break;
            }
            let l = lines.next().unwrap_or_default();
            if l.trim() == "----" {
                in_rows = true;
            } else if in_rows {
                rows.push(l.to_string());
            } else {
                sql.push(l.to_string());
            }
        }
        let expect = if header == "statement ok" {
            Expect::Ok
        } else if let Some(msg) = header.strip_prefix("statement error") {
            Expect::Error(msg.trim().to_string())
        } else if header.starts_with("query") {
            Expect::Rows {
                sort: header.contains("rowsort"),
                rows,
            }
        } else {
            panic!("unknown block header: {header}");
        };
        // A file's mark covers its queries' rows, not Weir's own views
        // of a plan or the catalog (EXPLAIN, SHOW, DESCRIBE).
        let own_view = sql.first().is_some_and(|l| {
            let first = l.split_whitespace().next().unwrap_or_default().to_ascii_uppercase();
            matches!(first.as_str(), "EXPLAIN" | "SHOW" | "DESCRIBE")
        });
        let recorded = header
            .split_whitespace()
            .find_map(|w| w.strip_prefix("recorded:"))
            .map(str::to_string)
            .or_else(|| whole_file.clone().filter(|_| !own_view))
            .filter(|_| matches!(expect, Expect::Rows { .. }));
        blocks.push(Block {
            comments: std::mem::take(&mut comments),
            recorded,
            header,
            sql: sql.join("\n"),
            expect,
        });
    }
    blocks
}

async fn collect_rows(result: StatementResult) -> Result<Vec<String>, String> {
    match result {
        StatementResult::Rows(_, batches) => {
            let mut out = vec![];
            for b in &batches {
                out.extend(weir::display::format_rows(b).map_err(|e| e.to_string())?);
            }
            Ok(out)
        }
        StatementResult::Stream(mut rs) => {
            let mut out = vec![];
            while let Some(b) = rs.rows.recv().await {
                // Changes print as Flink prints them: `-U[a, 1]`.
                let b = if rs.changelog {
                    weir::display::changes_of(&b).map_err(|e| e.to_string())?
                } else {
                    b.into()
                };
                out.extend(weir::display::format_changes(&b).map_err(|e| e.to_string())?);
            }
            rs.job.wait().await.map_err(|e| e.to_string())?;
            Ok(out)
        }
        StatementResult::Explain(text) => Ok(text.lines().map(str::to_string).collect()),
        StatementResult::Done(_) | StatementResult::JobStarted { .. } | StatementResult::JobEnded { .. } => Ok(vec![]),
    }
}

async fn run_block(session: &mut Session, sql: &str) -> Result<Vec<String>, String> {
    let stmts = weir_sql::parse(sql).map_err(|e| e.to_string())?;
    let mut rows = vec![];
    for s in &stmts {
        let r = session.execute(s).await.map_err(|e| e.to_string())?;
        rows = collect_rows(r).await?;
    }
    Ok(rows)
}

async fn run_file(path: &Path, rewrite: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut session = Session::open(tmp.path().join("weir-data")).map_err(|e| e.to_string())?;
    run_block(&mut session, "SET 'table.dml-sync' = 'true'").await?;
    let mut failures = vec![];
    // Failures that rewriting cannot fix (errors, statements).
    let mut hard = vec![];
    let mut rewritten = vec![];
    for block in parse_file(&text) {
        let sql = block
            .sql
            .replace("${TMP}", &tmp.path().display().to_string())
            .replace("${DATA}", &data.display().to_string());
        let result = run_block(&mut session, &sql).await;
        let mut out_block = format!("{}\n{}\n", block.header, block.sql);
        match (&block.expect, result) {
            (Expect::Ok, Ok(_)) => {}
            (Expect::Ok, Err(e)) => hard.push(format!("{}: expected ok, got error: {e}", first_line(&block.sql))),
            (Expect::Error(msg), Err(e)) => {
                if !e.contains(msg.as_str()) {
                    hard.push(format!(
                        "{}: expected error containing '{msg}', got: {e}",
                        first_line(&block.sql)
                    ));
                }
            }
            (Expect::Error(msg), Ok(_)) => hard.push(format!(
                "{}: expected error '{msg}', but it succeeded",
                first_line(&block.sql)
            )),
            (Expect::Rows { sort, rows }, Ok(mut actual)) => {
                if *sort {
                    actual.sort();
                }
                if &actual != rows {
                    let failure = format!(
                        "{}:\n  expected:\n    {}\n  actual:\n    {}",
                        first_line(&block.sql),
                        rows.join("\n    "),
                        actual.join("\n    ")
                    );
                    match &block.recorded {
                        // A reference: rewriting would make Weir its own.
                        Some(source) => hard.push(format!(
                            "{failure}\n  (recorded from {source}: not rewritten; fix Weir or record it again)"
                        )),
                        None => failures.push(failure),
                    }
                }
                if block.recorded.is_some() {
                    out_block = format!("{}\n{}\n----\n{}\n", block.header, block.sql, rows.join("\n"));
                } else {
                    out_block = format!("{}\n{}\n----\n{}\n", block.header, block.sql, actual.join("\n"));
                }
                if out_block.ends_with("----\n\n") {
                    out_block = format!("{}\n{}\n----\n", block.header, block.sql);
                }
            }
            (Expect::Rows { rows, .. }, Err(e)) => {
                // Rewriting keeps the expected rows of a query that failed.
                out_block = format!("{}\n{}\n----\n{}\n", block.header, block.sql, rows.join("\n"));
                hard.push(format!("{}: expected rows, got error: {e}", first_line(&block.sql)))
            }
        }
        rewritten.push(format!("{}{out_block}", block.comments));
    }
    if rewrite {
        // Keep the comments at the top of the file.
        let header: String = text
            .lines()
            .take_while(|l| l.starts_with('#') || l.trim().is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(path, format!("{header}{}", rewritten.join("\n"))).map_err(|e| e.to_string())?;
        // Only row expectations are rewritten; anything else still fails.
        failures.clear();
    }
    failures.extend(hard);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

fn first_line(sql: &str) -> String {
    sql.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_files() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sql");
    let rewrite = std::env::var("WEIR_REWRITE").is_ok_and(|v| v == "1");
    let filter = std::env::var("WEIR_SQL_FILTER").unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/sql exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| p.display().to_string().contains(&filter))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files found");
    let mut failed = vec![];
    for f in &files {
        if let Err(e) = run_file(f, rewrite).await {
            failed.push(format!("== {}\n{e}", f.display()));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} SQL files failed:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
}

/// `WEIR_REWRITE` never turns a recorded reference into Weir's output: a
/// block marked `recorded:flink-2.3` (or a file marked `# recorded:`)
/// that differs still fails and keeps its rows; an unmarked block is
/// rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_keeps_recorded_references() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.slt");
    let text =
        "# A reference.\n\nquery recorded:flink-2.3\nSELECT 1 + 1\n----\n+I[3]\n\nquery\nSELECT 2 + 2\n----\n+I[5]\n";
    std::fs::write(&path, text).expect("write");
    let err = run_file(&path, true).await.expect_err("the reference differs");
    assert!(err.contains("recorded from flink-2.3"), "{err}");
    let after = std::fs::read_to_string(&path).expect("read");
    assert!(
        after.contains("query recorded:flink-2.3\nSELECT 1 + 1\n----\n+I[3]\n"),
        "{after}"
    );
    assert!(
        after.contains("SELECT 2 + 2\n----\n+I[4]\n"),
        "the unmarked block is rewritten: {after}"
    );

    let whole = dir.path().join("whole.slt");
    std::fs::write(&whole, "# recorded: flink-2.3\n\nquery\nSELECT 1 + 1\n----\n+I[3]\n").expect("write");
    let err = run_file(&whole, true).await.expect_err("the reference differs");
    assert!(err.contains("recorded from flink-2.3"), "{err}");
    assert!(std::fs::read_to_string(&whole).expect("read").contains("+I[3]"));
}

/// Every refusal `docs/sql.md` lists (generated from
/// `weir_sql::refusals`) is what Weir answers its example with: the table
/// cannot claim a refusal the planner lost, nor a message it no longer says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listed_refusal_refuses_its_example() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("r")).expect("dir");
    let mut session = Session::open(dir.path().join("data")).expect("session");
    let tables = weir_sql::refusals::EXAMPLE_TABLES.replace("${DIR}", &dir.path().display().to_string());
    run_block(&mut session, &tables).await.expect("the example tables");
    for r in weir_sql::refusals::ALL {
        // EXPLAIN plans a query without starting it (a refusal lost would
        // otherwise start a job).
        let sql = if r.example.starts_with("SELECT") {
            format!("EXPLAIN {}", r.example)
        } else {
            r.example.to_string()
        };
        let err = run_block(&mut session, &sql)
            .await
            .expect_err(&format!("Weir refuses `{}`", r.example));
        assert!(
            err.contains(r.message),
            "`{}`\n  answered: {err}\n  listed:   {}",
            r.example,
            r.message
        );
    }
}
