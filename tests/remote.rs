//! `weir --url`: the command line against a running `weir serve`.

mod common;

use std::process::{Command, Stdio};

fn weir(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run weir")
}

#[test]
fn the_cli_runs_statements_on_a_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, port) = common::serve(&dir.path().join("server-data"));
    let url = format!("grpc://127.0.0.1:{port}");
    let out_dir = dir.path().join("out");
    let script = format!(
        "CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), \
           WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) \
         WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events-per-second' = '10000');
         CREATE TABLE sink (auction BIGINT, price BIGINT) \
         WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
         SELECT 40 + 2 AS answer;
         INSERT INTO sink SELECT auction, price FROM bid;
         SHOW JOBS;",
        out_dir.display()
    );
    let out = weir(&["--url", &url, "-c", &script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("answer") && stdout.contains("42"), "{stdout}");
    assert!(stdout.contains("job 'insert-into-sink"), "{stdout}");
    assert!(stdout.contains("RUNNING"), "{stdout}");
    // The catalog and the job are the server's, not the client's.
    let out = weir(&["--url", &url, "-c", "SHOW TABLES;"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("bid") && stdout.contains("sink"), "{stdout}");

    // A server-side error: exit 1, the message with its position.
    let out = weir(&["--url", &url, "-c", "SELECT 1;\nSELECT nope FROM bid;"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("<command>:2:1") && stderr.contains("nope"), "{stderr}");
    // A syntax error is found before anything is sent.
    let out = weir(&["--url", &url, "-c", "SELECT 1;\nSELEC 1;"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("<command>:2:1: error:"), "{stderr}");
    // Nothing listening / a bad URL: a clear error, no panic.
    let out = weir(&[
        "--url",
        &format!("grpc://127.0.0.1:{}", common::free_port()),
        "-c",
        "SELECT 1;",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
    let out = weir(&["--url", "localhost:1", "-c", "SELECT 1;"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expected grpc://"), "{stderr}");
}

#[test]
fn the_remote_shell_shows_an_updating_query_as_a_table_or_as_its_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, port) = common::serve(&dir.path().join("server-data"));
    let url = format!("grpc://127.0.0.1:{port}");
    let data = dir.path().join("orders.json");
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orders.json"),
        &data,
    )
    .expect("copy orders");
    let script = |mode: &str| common::orders_per_user_script(mode, &data);
    let run = |text: String| common::successful_stdout(&weir(&["--url", &url, "-c", &text]));
    // Table: the final rows only (as the local shell shows them), and a
    // status line without the server's watermark.
    common::assert_orders_per_user_table(&run(script("SET 'sql-client.execution.result-mode' = 'table';")));
    // A script streams the changes by default, with their ops.
    common::assert_orders_per_user_changes(&run(script("")));
}
