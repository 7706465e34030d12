//! The filesystem source with `source.monitor-interval` (Flink's
//! continuous file source): unbounded, the path listed again at the
//! interval, each new file read once. Through `weir run` as a process,
//! files added while it runs, SIGKILLed and restarted from its checkpoint
//! with more files added meanwhile; on local files and on an S3 server.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Killed, eventually_blocking};

/// Ten events a second through `[from, to)` seconds after midnight.
fn events(from: u64, to: u64) -> String {
    let mut text = String::new();
    for tenth in from * 10..to * 10 {
        let (s, ms) = (tenth / 10, (tenth % 10) * 100);
        text.push_str(&format!(
            "{{\"id\":{tenth},\"ts\":\"2024-01-01 00:{:02}:{:02}.{ms:03}\"}}\n",
            s / 60,
            s % 60
        ));
    }
    text
}

/// The committed rows of one-second windows `[from, to)`: ten events each.
fn windows(from: u64, to: u64) -> Vec<String> {
    let mut rows: Vec<String> = (from..to)
        .map(|s| {
            format!(
                "{{\"window_start\":\"2024-01-01 00:{:02}:{:02}\",\"cnt\":10}}",
                s / 60,
                s % 60
            )
        })
        .collect();
    rows.sort();
    rows
}

/// A job counting events per one-second window of `input`, a monitored
/// path, into `out`; `extra` sets where checkpoints go.
fn job(input: &str, out: &Path, extra: &str) -> String {
    format!(
        "SET 'parallelism.default' = '2';
SET 'execution.checkpointing.interval' = '100 ms';
SET 'pipeline.name' = 'continuous-files';
{extra}
CREATE TABLE ev (id BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts)
  WITH ('connector' = 'filesystem', 'path' = '{input}', 'format' = 'json',
        'source.monitor-interval' = '50 ms');
CREATE TABLE out (window_start TIMESTAMP(3), cnt BIGINT)
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
INSERT INTO out SELECT window_start, COUNT(*)
FROM TABLE(TUMBLE(TABLE ev, DESCRIPTOR(ts), INTERVAL '1' SECOND))
GROUP BY window_start, window_end;
",
        out.display()
    )
}

fn start(data: &Path, sql: &Path, log: &Path) -> Killed {
    let log = std::fs::File::create(log).expect("log");
    Killed(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .arg("--data-dir")
            .arg(data)
            .arg("run")
            .arg(sql)
            .env_remove("WEIR_FAILPOINTS")
            .env("WEIR_LOG", "warn,weir::checkpoint=info,weir::source=info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn weir"),
    )
}

/// Waits until the committed output is exactly `expected` (rows appear
/// only at checkpoints; one too many fails at once).
fn await_output(out: &Path, expected: &[String], log: &Path, what: &str) {
    eventually_blocking(what, 90, || {
        let got = common::committed_lines(out);
        for row in &got {
            let have = got.iter().filter(|r| *r == row).count();
            assert!(
                have == 1 && expected.contains(row),
                "{what}: row {row} committed {have} times; expected {expected:?}\nlog:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if got == expected {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    });
}

/// The scenario, with `put(name, text)` making a file appear whole at
/// the monitored path and `wipe` losing the machine's local state.
fn scenario(input: &str, extra: &str, put: &dyn Fn(&str, &str), wipe: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, out, sql, log) = (
        dir.path().join("data"),
        dir.path().join("out"),
        dir.path().join("job.sql"),
        dir.path().join("weir.log"),
    );
    std::fs::write(&sql, job(input, &out, extra)).expect("sql");
    put("a.json", &events(0, 5));
    let weir = start(&data, &sql, &log);
    // The first file's windows close as its watermark passes them: the
    // last (4 s) waits for later events.
    await_output(&out, &windows(0, 4), &log, "the windows of the file there at the start");
    put("b.json", &events(5, 10));
    await_output(&out, &windows(0, 9), &log, "the windows of a file added while running");
    assert!(
        std::fs::read_to_string(&log).expect("log").contains("new file"),
        "the discovery is not logged"
    );
    // A crash, and a file arrives while the job is down.
    drop(weir);
    if wipe {
        std::fs::remove_dir_all(&data).expect("wipe");
    }
    put("c.json", &events(10, 15));
    let restarted = dir.path().join("weir-2.log");
    let _weir = start(&data, &sql, &restarted);
    await_output(
        &out,
        &windows(0, 14),
        &restarted,
        "the windows of the file added while the job was down, each window once",
    );
    let text = std::fs::read_to_string(&restarted).expect("log");
    assert!(text.contains("restoring from checkpoint"), "not restored:\n{text}");
}

#[test]
fn a_monitored_directory_reads_each_new_file_once_across_a_sigkill() {
    let input_dir = tempfile::tempdir().expect("tempdir");
    let input: PathBuf = input_dir.path().to_path_buf();
    // Written hidden, then renamed: a reader never sees half a file.
    let put = |name: &str, text: &str| {
        let tmp = input.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, input.join(name)).expect("rename");
    };
    scenario(&input.display().to_string(), "", &put, false);
}

#[test]
fn a_monitored_s3_prefix_reads_each_new_object_once_across_a_sigkill_on_a_new_machine() {
    let s3_dir = tempfile::tempdir().expect("tempdir");
    let server = common::s3_server(s3_dir.path());
    let client = server.client();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A PUT makes an object appear whole.
    let put = |name: &str, text: &str| {
        let key = object_store::path::Path::from(format!("incoming/{name}"));
        rt.block_on(object_store::ObjectStoreExt::put(
            &client,
            &key,
            object_store::PutPayload::from(text.as_bytes().to_vec()),
        ))
        .expect("put");
    };
    scenario(
        &format!("s3://{}/incoming", server.bucket),
        &server.checkpoint_settings(),
        &put,
        true,
    );
}

/// Over 3 `weir worker` processes: worker 0's enumerator alone finds the
/// new files of the monitored directory (as Flink's JobManager does) and
/// sends each to the reader that owns it, here one on worker 1 and one on
/// worker 2, which read it; every window is committed once.
#[test]
fn over_workers_worker_0_lists_and_each_new_file_is_read_once_by_its_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).expect("input dir");
    let put = |name: &str, text: &str| {
        let tmp = input.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, input.join(name)).expect("rename");
    };
    // A file for the reader on worker 1 and one for worker 2 (subtask s
    // runs on worker s % 3; a file's reader is its path's hash).
    let owned_by = |reader: usize| {
        (0..100)
            .map(|i| format!("f{i}.json"))
            .find(|n| weir_engine::runtime::enumerator::owner(&input.join(n).display().to_string(), 3) == reader)
            .expect("a name")
    };
    let (on_1, on_2) = (owned_by(1), owned_by(2));
    put("a.json", &events(0, 5));
    let out = dir.path().join("out");
    let extra = format!(
        "SET 'parallelism.default' = '3';\nSET 'execution.checkpointing.dir' = '{}';",
        dir.path().join("checkpoints").display()
    );
    let sql = job(&input.display().to_string(), &out, &extra);
    let mut workers = common::Workers::with_log_filter(dir.path(), 3, &sql, "warn,weir::source=info");
    let mut added = false;
    let done = std::cell::Cell::new(false);
    workers.supervise_until(
        120,
        |_| {
            if !added && common::committed_lines(&out) == windows(0, 4) {
                put(&on_1, &events(5, 10));
                put(&on_2, &events(10, 15));
                added = true;
            }
            let got = common::committed_lines(&out);
            let once = got.iter().all(|r| got.iter().filter(|x| *x == r).count() == 1);
            assert!(once, "a window committed twice: {got:?}");
            done.set(got == windows(0, 14));
        },
        |_| done.get(),
    );
    let logs: Vec<String> = (0..3)
        .map(|w| std::fs::read_to_string(workers.log(w)).unwrap_or_default())
        .collect();
    assert!(
        logs[0].contains("new file"),
        "worker 0 did not list the new files:\n{}",
        workers.logs()
    );
    assert!(
        !logs[1].contains("new file") && !logs[2].contains("new file"),
        "a worker other than 0 looked for new files:\n{}",
        workers.logs()
    );
    for (w, name) in [(1, &on_1), (2, &on_2)] {
        assert!(
            logs[w]
                .lines()
                .any(|l| l.contains("from worker 0's enumerator") && l.contains(name.as_str())),
            "worker {w} was not handed {name}:\n{}",
            workers.logs()
        );
    }
    for w in 0..3 {
        workers.kill(w);
    }
}
