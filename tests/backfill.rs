//! `weir backfill`: a file's INSERT over [--from, --to) of event time, one
//! chunk at a time in batch mode. Killed (SIGKILL) in the middle of a
//! chunk and started again, it writes every row of the range once; a
//! chunk that finished but was not recorded (a kill between the two) is
//! written again from nothing, not twice.

mod common;

use std::process::{Command, Stdio};

/// Four hours of rows, one a minute, and rows before and after the range.
fn input(dir: &std::path::Path) -> (std::path::PathBuf, Vec<String>) {
    let path = dir.join("events.csv");
    let mut text = String::new();
    let mut want = vec![];
    for m in -30..(4 * 60 + 30) {
        let t = chrono::DateTime::from_timestamp(1_704_067_200 + m * 60, 0).expect("time");
        let ts = t.format("%Y-%m-%d %H:%M:%S%.3f").to_string();
        let line = format!("{ts},k{},{m}", m % 7);
        if (0..4 * 60).contains(&m) {
            want.push(line.clone());
        }
        text.push_str(&line);
        text.push('\n');
    }
    std::fs::write(&path, text).expect("input");
    want.sort();
    (path, want)
}

fn script(dir: &std::path::Path, input: &std::path::Path, out: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("fill.sql");
    std::fs::write(
        &path,
        format!(
            "SET 'parallelism.default' = '2';\n\
             CREATE TABLE events (ts TIMESTAMP(3), k STRING, v BIGINT, WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE)\n\
               WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'scan.lines-per-second' = '150');\n\
             CREATE TABLE out (ts TIMESTAMP(3), k STRING, v BIGINT)\n\
               WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');\n\
             INSERT INTO out SELECT ts, k, v FROM events;\n",
            input.display(),
            out.display()
        ),
    )
    .expect("script");
    path
}

fn backfill(data: &std::path::Path, sql: &std::path::Path) -> Command {
    backfill_in(data, sql, "1 h")
}

fn backfill_in(data: &std::path::Path, sql: &std::path::Path, chunk: &str) -> Command {
    let mut c = Command::new(common::worker_bin());
    c.arg("--data-dir")
        .arg(data)
        .arg("backfill")
        .arg(sql)
        .args([
            "--from",
            "2024-01-01 00:00:00",
            "--to",
            "2024-01-01 04:00:00",
            "--chunk",
            chunk,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// The rows of every file of `dir` readers see (hidden ones are not).
fn written(dir: &std::path::Path) -> Vec<String> {
    common::committed_lines(dir)
        .into_iter()
        .map(|l| {
            // The sink writes `2024-01-01 00:00:00` for a whole second.
            let (ts, rest) = l.split_once(',').expect("csv");
            let ts = if ts.len() == 19 {
                format!("{ts}.000")
            } else {
                ts.to_string()
            };
            format!("{ts},{rest}")
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn a_backfill_killed_mid_chunk_and_restarted_writes_every_row_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let (events, want) = input(dir.path());
    let out = dir.path().join("out");
    let data = dir.path().join("data");
    let sql = script(dir.path(), &events, &out);

    // First run: killed once the first chunk is recorded and the second
    // is under way (each chunk reads the file at 150 lines/s: ~2 s).
    let mut child = backfill(&data, &sql).spawn().expect("spawn weir backfill");
    let (text, reader) = common::collect_stderr(&mut child);
    common::eventually_blocking("chunk 0 recorded", 120, || {
        let seen = text.lock().expect("stderr").clone();
        if let Ok(Some(status)) = child.try_wait() {
            panic!("backfill ended ({status}) before its first chunk: {seen}");
        }
        seen.contains(") done").then_some(())
    });
    // In chunk 1: once it has started (its job reads for ~2 s).
    common::eventually_blocking("chunk 1 started", 120, || {
        text.lock().expect("stderr").contains("chunk 1 [").then_some(())
    });
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let _ = reader.join();
    let first = text.lock().expect("stderr").clone();
    assert!(
        !first.contains("chunk 3 ["),
        "the backfill ended before the kill: {first}"
    );

    // Started again: the recorded chunk is skipped, the killed one runs
    // again from nothing.
    let run = backfill(&data, &sql).output().expect("rerun");
    let second = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "{second}");
    assert!(!second.contains("chunk 0 ["), "chunk 0 ran again: {second}");
    assert!(second.contains("4 chunks"), "{second}");
    let got = written(&out);
    assert_eq!(got.len(), common::committed_lines(&out).len(), "a row written twice");
    assert_eq!(got, want, "the backfilled rows");

    // A chunk done but not recorded (a kill right after its job): the
    // rerun deletes what it wrote and writes it again.
    let ledger = data.join("backfills").join("fill.json");
    let mut l: serde_json::Value = serde_json::from_slice(&std::fs::read(&ledger).expect("ledger")).expect("json");
    l["done"] = serde_json::json!([0, 1, 3]);
    std::fs::write(&ledger, serde_json::to_vec(&l).expect("json")).expect("write ledger");
    let run = backfill(&data, &sql).output().expect("rerun");
    let third = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "{third}");
    assert!(third.contains("chunk 2 ran before and was not recorded"), "{third}");
    assert_eq!(common::committed_lines(&out).len(), want.len(), "{third}");
    assert_eq!(written(&out), want);

    // Another range under the same name is refused, naming the ledger.
    let run = backfill_in(&data, &sql, "30 min").output().expect("other chunking");
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(!run.status.success() && err.contains("was started over"), "{err}");
}

/// Windows that fit the chunks: a TUMBLE window aggregate backfilled in
/// chunks of two windows gives each window's row once, as one run would;
/// a GROUP BY over all time is refused (its chunks' rows would be partial
/// counts), naming why.
#[test]
fn a_tumble_aggregate_runs_in_chunks_and_a_group_by_over_all_time_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let (events, rows) = input(dir.path());
    let out = dir.path().join("windows");
    let data = dir.path().join("data");
    let sql = dir.path().join("windows.sql");
    let tables = format!(
        "CREATE TABLE events (ts TIMESTAMP(3), k STRING, v BIGINT, WATERMARK FOR ts AS ts - INTERVAL '1' MINUTE)\n\
           WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');\n\
         CREATE TABLE out (ws TIMESTAMP(3), k STRING, n BIGINT, s BIGINT)\n\
           WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');\n",
        events.display(),
        out.display()
    );
    std::fs::write(
        &sql,
        format!(
            "{tables}INSERT INTO out SELECT window_start, k, COUNT(*), SUM(v) \
             FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '30' MINUTE)) GROUP BY window_start, window_end, k;\n"
        ),
    )
    .expect("script");
    let run = backfill(&data, &sql).output().expect("backfill");
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "{err}");
    // The expected windows, from the rows of the range.
    let mut want: std::collections::BTreeMap<(String, String), (i64, i64)> = Default::default();
    for r in &rows {
        let mut f = r.split(',');
        let (ts, k, v) = (f.next().expect("ts"), f.next().expect("k"), f.next().expect("v"));
        let minute: i64 = ts[14..16].parse().expect("minute");
        let ws = format!("{}:{:02}:00", &ts[..13], minute / 30 * 30);
        let e = want.entry((ws, k.to_string())).or_insert((0, 0));
        e.0 += 1;
        e.1 += v.parse::<i64>().expect("v");
    }
    let mut want: Vec<String> = want
        .into_iter()
        .map(|((ws, k), (n, s))| format!("{ws},{k},{n},{s}"))
        .collect();
    want.sort();
    assert_eq!(common::committed_lines(&out), want, "{err}");

    std::fs::write(
        &sql,
        format!(
            "{tables}INSERT INTO out SELECT CAST(NULL AS TIMESTAMP(3)), k, COUNT(*), SUM(v) FROM events GROUP BY k;\n"
        ),
    )
    .expect("script");
    let run = backfill_in(&data.join("again"), &sql, "1 h")
        .output()
        .expect("backfill");
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(
        !run.status.success() && err.contains("its GROUP BY is over all time"),
        "{err}"
    );
    // A table without a WATERMARK would be read whole by every chunk.
    std::fs::write(
        &sql,
        format!(
            "CREATE TABLE plain (ts TIMESTAMP(3), k STRING, v BIGINT) \
               WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');\n{tables}\
             INSERT INTO out SELECT ts, k, v, v FROM plain;\n",
            events.display()
        ),
    )
    .expect("script");
    let run = backfill_in(&data.join("plain"), &sql, "1 h")
        .output()
        .expect("backfill");
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(
        !run.status.success() && err.contains("table 'plain' has no WATERMARK"),
        "{err}"
    );
}
