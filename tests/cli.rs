//! The real `weir` binary: `run` with exit codes and error positions, `-c`,
//! scripts on stdin, the session catalog and a persistent one (`--catalog`), the print sink, and graceful
//! stop on SIGINT.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn weir(data_dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.arg("--data-dir").arg(data_dir);
    c
}

fn example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

#[test]
fn quickstart_runs_to_completion_and_prints_windows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = weir(dir.path())
        .arg("run")
        .arg(example("quickstart.sql"))
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    // 1 000 000 events at 10 000 events/s of event time: 100 s, 10 windows.
    let windows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("+I[")).collect();
    assert_eq!(windows.len(), 10, "{stdout}");
    // 100 000 events per window, 46 of every 50 of them bids.
    for (i, w) in windows.iter().enumerate() {
        // As Flink's print sink writes a TIMESTAMP (`LocalDateTime`):
        // seconds only when they are not zero.
        let (minute, second) = (i / 6, (i % 6) * 10);
        let start = match second {
            0 => format!("2015-07-15T00:{minute:02}"),
            s => format!("2015-07-15T00:{minute:02}:{s:02}"),
        };
        assert!(w.starts_with(&format!("+I[{start}, ")), "window {i}: {w}");
        assert!(w.contains(", 92000, "), "window {i}: {w}");
    }
    assert!(stderr.contains("job 'quickstart' finished"), "{stderr}");
    // Running the same script again in the same data dir works.
    let again = weir(dir.path())
        .arg("run")
        .arg(example("quickstart.sql"))
        .output()
        .expect("run");
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
}

#[test]
fn run_stops_at_the_first_error_with_file_line_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("broken.sql");
    std::fs::write(
        &file,
        "SET 'parallelism.default' = '1';\n\nSELECT nope\n  FROM missing;\nSELECT 1;\n",
    )
    .expect("write");
    let out = weir(&dir.path().join("data"))
        .arg("run")
        .arg(&file)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:4:8: error: table 'missing' does not exist",
            file.display()
        )),
        "{stderr}"
    );
    // Statements after the error did not run.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("| 1 |"));
}

#[test]
fn missing_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = weir(dir.path())
        .arg("run")
        .arg(dir.path().join("nope.sql"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn command_flag_and_stdin_scripts_share_the_persistent_catalog() {
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = dir.path().join("tables.json");
    let out = weir(dir.path())
        .arg("--catalog")
        .arg(&catalog)
        .arg("-c")
        .arg("CREATE TABLE t (a BIGINT) WITH ('connector' = 'blackhole'); SELECT 40 + 2 AS answer;")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("42"));
    let mut child = weir(dir.path())
        .arg("--catalog")
        .arg(&catalog)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"SHOW TABLES;\n")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("| t "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `CREATE TEMPORARY TABLE|VIEW` live in the session only: they shadow a
/// permanent table of the same name there, and are gone in the next
/// session (they used to be written to the catalog file).
#[test]
fn temporary_tables_and_views_live_in_their_session_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog_file = dir.path().join("catalog.json");
    let out = weir(dir.path())
        .arg("--catalog")
        .arg(&catalog_file)
        .arg("-c")
        .arg(
            "CREATE TABLE t (a BIGINT) WITH ('connector' = 'blackhole');
             CREATE TEMPORARY TABLE t (b STRING, c INT) WITH ('connector' = 'blackhole');
             CREATE TEMPORARY VIEW v AS SELECT 1 AS x;
             DESCRIBE t; SHOW VIEWS;",
        )
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("| b ") && !stdout.contains("| a "),
        "the temporary t shadows t:\n{stdout}"
    );
    assert!(stdout.contains("| v "), "{stdout}");
    let catalog = std::fs::read_to_string(&catalog_file).expect("catalog");
    assert!(
        !catalog.contains("\"v\"") && !catalog.contains("\"c\""),
        "written to the catalog: {catalog}"
    );
    let out = weir(dir.path())
        .arg("--catalog")
        .arg(&catalog_file)
        .arg("-c")
        .arg("DESCRIBE t; SHOW TABLES;")
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("| a ") && !stdout.contains("| b "),
        "the permanent t:\n{stdout}"
    );
    assert!(
        !stdout.contains("| v "),
        "the temporary view outlived its session:\n{stdout}"
    );
}

/// Without `--catalog` a script's tables live for its run only, as in
/// Flink's SQL client: two scripts defining `bid` differently run one
/// after the other in one data dir, and an edited CREATE TABLE runs again;
/// with a catalog file the second definition is refused, naming the table.
#[test]
fn scripts_in_one_data_dir_each_define_their_own_tables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = |name: &str, columns: &str, select: &str| {
        let file = dir.path().join(name);
        std::fs::write(
            &file,
            format!(
                "CREATE TABLE bid ({columns}) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '500');
                 CREATE TABLE out (v BIGINT) WITH ('connector' = 'print');
                 INSERT INTO out SELECT {select} FROM bid;"
            ),
        )
        .expect("write");
        file
    };
    let first = script("first.sql", "auction BIGINT, price BIGINT", "price");
    let second = script("second.sql", "auction BIGINT, bidder BIGINT", "bidder");
    for file in [&first, &second, &first] {
        let out = weir(dir.path()).arg("run").arg(file).output().expect("run");
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("+I["),
            "{file:?} printed nothing"
        );
    }
    assert!(
        !dir.path().join("catalog.json").exists(),
        "no catalog file without --catalog"
    );

    let catalog = dir.path().join("tables.json");
    let with_catalog = |file: &std::path::Path| {
        weir(dir.path())
            .arg("--catalog")
            .arg(&catalog)
            .arg("run")
            .arg(file)
            .output()
            .expect("run")
    };
    assert!(with_catalog(&first).status.success());
    let out = with_catalog(&second);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("table 'bid' already exists with a different definition"),
        "{stderr}"
    );
}

/// A query that fails before any row prints its error alone (no empty
/// table and "Received a total of 0 rows" first); the error names the
/// file, line, column and declared type in the user's words; and
/// MATCH_RECOGNIZE is refused by name at its position, not as a parser
/// AST dump.
#[test]
fn a_failing_query_prints_its_error_in_the_users_words() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("bad.csv");
    std::fs::write(&csv, "1,2\nx,3\n").expect("write");
    let out = weir(dir.path())
        .arg("-c")
        .arg(format!(
            "CREATE TABLE b (a BIGINT, c BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
             SELECT * FROM b;",
            csv.display()
        ))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!stdout.contains("Received a total"), "{stdout}");
    assert!(
        stderr.contains("bad.csv:2: invalid CSV record: column 'a' (1st, BIGINT): cannot parse 'x' as BIGINT"),
        "{stderr}"
    );
    let out = weir(dir.path())
        .arg("-c")
        .arg(
            "CREATE TABLE t (v BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts) WITH ('connector' = 'datagen', 'number-of-rows' = '5');
SELECT * FROM t MATCH_RECOGNIZE (ORDER BY ts MEASURES A.v AS x PATTERN (A) DEFINE A AS A.v > 0);",
        )
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("2:15: error: MATCH_RECOGNIZE is not supported yet"),
        "{stderr}"
    );
    assert!(!stderr.contains("Ident"), "{stderr}");
}

/// `examples/backfill_alignment.sql` as written shows what it promises:
/// the fast split 0 is held back by its alignment group (paused for a
/// while), and no split is held back longer than it.
#[test]
fn the_alignment_example_holds_the_fast_split_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = weir(dir.path())
        .arg("run")
        .arg(example("backfill_alignment.sql"))
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // SHOW WATERMARKS: | scope | name | watermark | lag_ms | state | paused_ms | detail |
    let paused: Vec<(String, u64)> = stdout
        .lines()
        .filter(|l| l.starts_with("| split"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            Some((cells.get(2)?.to_string(), cells.get(6)?.parse().ok()?))
        })
        .collect();
    assert_eq!(paused.len(), 12, "{stdout}");
    let fast = paused
        .iter()
        .find(|(n, _)| n.contains("nexmark-0-of-12"))
        .map(|(_, p)| *p);
    let most = paused.iter().map(|(_, p)| *p).max();
    assert!(fast.is_some_and(|p| p > 0), "split 0 was never paused:\n{stdout}");
    assert_eq!(fast, most, "another split was held back longer:\n{stdout}");
}

#[test]
fn sigint_stops_an_unbounded_job_gracefully() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("forever.sql");
    std::fs::write(
        &file,
        "CREATE TABLE bid (auction BIGINT, dateTime TIMESTAMP(3)) WITH ('connector' = 'nexmark', 'nexmark.events-per-second' = '1000');
         CREATE TABLE sink (auction BIGINT) WITH ('connector' = 'blackhole');
         INSERT INTO sink SELECT auction FROM bid;",
    )
    .expect("write");
    let mut child = weir(&dir.path().join("data"))
        .arg("run")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Wait (with a deadline) until the job is submitted.
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "job was never submitted");
        match lines.next() {
            Some(Ok(l)) if l.contains("submitted") => break,
            Some(Ok(_)) => continue,
            _ => panic!("weir exited before submitting the job"),
        }
    }
    let status = Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("job 'forever' stopped"), "{stderr}");
}

/// `weir bench compare` without Flink: it generates the bids, runs each
/// file on Weir, prints the table and says how to install Flink; a query
/// Weir cannot run is reported by name and fails the command.
#[test]
fn bench_compare_runs_weir_alone_and_reports_a_failing_query() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queries = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/queries");
    let bad = dir.path().join("bad.sql");
    std::fs::write(&bad, "INSERT INTO nowhere SELECT 1;\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "compare", "--rows", "20000", "--runs", "1", "--bench-dir"])
        .arg(dir.path())
        .arg("--flink-python")
        .arg(dir.path().join("no-python"))
        .arg(queries.join("hop_count.sql"))
        .arg(queries.join("passthrough_json.sql"))
        .arg(&bad)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a failing query fails the command\n{stdout}\n{stderr}"
    );
    assert!(stderr.contains("Flink is not installed"), "{stderr}");
    assert!(
        stderr.contains("bad: weir run failed") && stderr.contains("nowhere"),
        "{stderr}"
    );
    // A query's rows/s in its Weir row (a failed run has none).
    let rate = |query: &str| -> f64 {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {query} | Weir | 1 |")))
            .unwrap_or_else(|| panic!("a {query} row\n{stdout}"));
        row.split('|')
            .nth(5)
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or_else(|| panic!("rows/s of {row}\n{stderr}"))
    };
    assert!(rate("hop_count") > 0.0);
    assert!(stdout.contains("| bad | Weir | 1 | failed |"), "{stdout}");
    // q0 over the same bids as JSON lines, and each input's floor.
    assert!(rate("passthrough_json") > 0.0);
    for var in ["${BIDS}", "${BIDS_JSON}"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("Floor of {var} ")) && l.ends_with(" rows/s")),
            "{var}'s floor\n{stdout}"
        );
    }
    let csv = dir.path().join("compare/bids-nexmark-uniform10k-20000.csv");
    let text = std::fs::read_to_string(&csv).expect("the generated bids");
    assert_eq!(text.lines().count(), 20_000);
    // Nexmark's bid columns: auction (of 10 000), bidder, price, channel,
    // url, event time (10 rows per millisecond), extra.
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
    let last = rows.last().expect("rows");
    assert_eq!(last.len(), 7, "{last:?}");
    assert!(last[0].parse::<u64>().is_ok_and(|a| a < 10_000), "{last:?}");
    assert!(last[4].starts_with("https://www.nexmark.com/"), "{last:?}");
    assert_eq!(last[5], "2024-01-01 00:00:01.999", "{last:?}");
    // Bids of about 100 bytes, half on the four hot channels.
    let bytes = text.len() as f64 / 20_000.0;
    assert!((80.0..130.0).contains(&bytes), "{bytes} bytes per bid");
    let hot = rows
        .iter()
        .filter(|r| ["Google", "Facebook", "Baidu", "Apple"].contains(&r[3]))
        .count();
    assert!((9_000..11_000).contains(&hot), "{hot} bids on hot channels");
    // The JSON lines hold the same bids, column by column.
    let json =
        std::fs::read_to_string(dir.path().join("compare/bids-nexmark-uniform10k-20000.json")).expect("the JSON bids");
    assert_eq!(json.lines().count(), 20_000);
    let names = ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"];
    for (line, row) in json.lines().zip(&rows) {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON object");
        let fields: Vec<String> = names
            .iter()
            .map(|n| match &v[n] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        assert_eq!(&fields, row, "{line}");
    }
}

/// `weir bench nexmark` runs the updating Nexmark queries over the
/// built-in generator (joins, Top-N, dedup, aggregates with FILTER and
/// DISTINCT), one table row each.
#[test]
fn bench_nexmark_runs_the_updating_queries() {
    let queries = ["q3", "q4", "q9", "q15", "q16", "q17", "q18", "q19", "q20"];
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "nexmark", "--events", "20000", "--queries", &queries.join(",")])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for q in queries {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("| {q} | 20000 |"))),
            "no row for {q}\n{stdout}"
        );
    }
}

#[test]
fn result_modes_show_an_updating_query_as_a_table_or_as_its_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orders.json");
    let script = |mode: &str| common::orders_per_user_script(mode, &data);
    let run = |text: String| {
        let file = dir.path().join("q.sql");
        std::fs::write(&file, text).expect("write");
        let out = weir(&dir.path().join("data"))
            .arg("run")
            .arg(&file)
            .output()
            .expect("run");
        common::successful_stdout(&out)
    };
    // Table: the final rows only, and a status line.
    common::assert_orders_per_user_table(&run(script("SET 'sql-client.execution.result-mode' = 'table';")));
    // A script streams changes by default: every -U/+U with its op.
    common::assert_orders_per_user_changes(&run(script("")));
    let bad = weir(&dir.path().join("data"))
        .args(["-c", "SET 'sql-client.execution.result-mode' = 'grid'"])
        .output()
        .expect("run");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("sql-client.execution.result-mode"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// `INSERT ... ON CONFLICT DO DEDUPLICATE` into a print sink keyed by a
/// sum, whose rows come and go as the sums change: the printed changelog
/// is Flink 2.3's for the same SQL and file (recorded with
/// tools/flink/run_flink_sql.py at parallelism 1).
#[test]
fn on_conflict_deduplicate_prints_flinks_changelog() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/upsert_conflicts.csv");
    let sql = format!(
        "SET 'parallelism.default' = '1';
         CREATE TABLE src (c STRING, v INT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         CREATE TABLE p (c STRING, total INT, PRIMARY KEY (total) NOT ENFORCED) WITH ('connector' = 'print');
         INSERT INTO p SELECT c, SUM(v) FROM src GROUP BY c ON CONFLICT DO DEDUPLICATE;",
        data.display()
    );
    let file = dir.path().join("q.sql");
    std::fs::write(&file, sql).expect("write");
    let out = weir(&dir.path().join("data"))
        .arg("run")
        .arg(&file)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed: Vec<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.len() > 2 && l.as_bytes()[2] == b'[' && "+-".contains(&l[..1]))
        .collect();
    assert_eq!(
        printed,
        [
            "+I[a, 10]",
            "-D[a, 10]",
            "+I[a, 30]",
            "+U[b, 30]",
            "+I[a, 35]",
            "-D[b, 30]",
            "+U[b, 35]",
            "+U[c, 35]",
            "+U[b, 35]",
            "+I[c, 36]",
        ],
        "{stdout}"
    );
}

/// The same INSERT on Flink 2.3 (tools/flink, `-p 1`) printed the line
/// asserted here.
#[test]
fn the_print_sink_writes_values_as_flinks_print_sink_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("one.json"), "{\"id\": 1}\n").expect("data");
    let job = dir.path().join("print.sql");
    std::fs::write(
        &job,
        format!(
            "SET 'parallelism.default' = '1';
             CREATE TABLE one (id INT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
             CREATE TABLE p (a TIMESTAMP(3), b TIMESTAMP(3), c TIMESTAMP(6), d DOUBLE, e DOUBLE, f DECIMAL(10, 2),
               g DATE, h ARRAY<INT>, i MAP<STRING, INT>, j ROW<x INT, y STRING>, k BOOLEAN, l TIMESTAMP_LTZ(3),
               m FLOAT, n STRING, o BYTES) WITH ('connector' = 'print');
             INSERT INTO p SELECT TIMESTAMP '2024-01-01 00:00:00', TIMESTAMP '2024-01-01 00:00:10.5',
               TIMESTAMP '2024-01-01 10:20:30.123456', 1e10, 0.1e0, 12.50, DATE '2024-02-29',
               ARRAY[1, CAST(NULL AS INT)], MAP['a', 1], ROW(1, 'z'), TRUE, TO_TIMESTAMP_LTZ(1704067210000, 3),
               CAST(1.5 AS FLOAT), CAST(NULL AS STRING), CAST('ab' AS BYTES) FROM one;",
            dir.path().join("one.json").display()
        ),
    )
    .expect("job");
    let out = weir(dir.path()).arg("run").arg(&job).output().expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.lines().any(|l| l
            == "+I[2024-01-01T00:00, 2024-01-01T00:00:10.500, 2024-01-01T10:20:30.123456, 1.0E10, 0.1, 12.50, \
                2024-02-29, [1, null], {a=1}, +I[1, z], true, 2024-01-01T00:00:10Z, 1.5, null, [97, 98]]"),
        "{stdout}"
    );
}
