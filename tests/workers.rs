//! A job spread over worker processes (`weir worker`), on loopback: real
//! processes, real files, RocksDB on disk, SIGKILL.
//!
//! The job: bids from CSV files, a keyed TUMBLE window per auction, joined
//! (a regular join, keyed on the auction) with an auctions file, into the
//! file sink. Across 3 workers every keyed exchange crosses processes.
//! Its committed output must equal the same SQL run by one `weir run`.

mod common;

use common::Workers;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FILES: u64 = 2;
const LINES_PER_FILE: u64 = 30_000;

fn weir_bin() -> PathBuf {
    std::env::var_os("WEIR_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weir")), PathBuf::from)
}

/// The input: `FILES` bid files and one auctions file.
fn input(dir: &Path) -> (PathBuf, PathBuf) {
    let bids = dir.join("bids");
    std::fs::create_dir_all(&bids).expect("bids dir");
    for f in 0..FILES {
        let mut text = String::new();
        for i in 0..LINES_PER_FILE {
            let ts = format!("2024-01-01 00:{:02}:{:02}.{:03}", i / 60_000, (i / 1000) % 60, i % 1000);
            let auction = (i * 7919 + f * 13) % 97;
            let price = (i * 31) % 1000 + 1;
            text.push_str(&format!("{auction},{price},{ts}\n"));
        }
        std::fs::write(bids.join(format!("bids-{f}.csv")), text).expect("write bids");
    }
    let auctions = dir.join("auctions.csv");
    let text: String = (0..97)
        .filter(|a| a % 5 != 0)
        .map(|a| format!("{a},{}\n", a % 7))
        .collect();
    std::fs::write(&auctions, text).expect("write auctions");
    (bids, auctions)
}

fn job_sql(bids: &Path, auctions: &Path, out: &Path, extra: &str, pace: &str) -> String {
    format!(
        "SET 'pipeline.name' = 'workers-test';
SET 'restart-strategy.type' = 'fixed-delay';
SET 'restart-strategy.fixed-delay.attempts' = '100';
SET 'restart-strategy.fixed-delay.delay' = '0 ms';
{extra}
CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '1' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv'{pace});
CREATE TABLE auction (id BIGINT, category BIGINT)
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
CREATE TABLE out (auction BIGINT, category BIGINT, window_start TIMESTAMP(3), cnt BIGINT, total BIGINT)
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
INSERT INTO out
SELECT w.auction, a.category, w.window_start, w.cnt, w.total
FROM (
  SELECT auction, window_start, COUNT(*) AS cnt, SUM(price) AS total
  FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND))
  GROUP BY auction, window_start, window_end
) w JOIN auction a ON w.auction = a.id;
",
        bids.display(),
        auctions.display(),
        out.display()
    )
}

/// The input in `dir`, and the job's rows from one process at
/// `parallelism`: the reference every run over workers must equal.
fn reference(dir: &Path, parallelism: usize) -> (PathBuf, PathBuf, Vec<String>) {
    let (bids, auctions) = input(dir);
    let set = format!("SET 'parallelism.default' = '{parallelism}';");
    let rows = single_process(dir, &job_sql(&bids, &auctions, Path::new("@OUT@"), &set, ""));
    (bids, auctions, rows)
}

/// The same SQL in one process: the reference.
fn single_process(dir: &Path, sql: &str) -> Vec<String> {
    single_process_shown(dir, sql).0
}

/// [`single_process`], and what the script printed.
fn single_process_shown(dir: &Path, sql: &str) -> (Vec<String>, String) {
    let out = dir.join("single-out");
    let sql = sql.replace("@OUT@", &out.display().to_string());
    let file = dir.join("single.sql");
    std::fs::write(&file, sql).expect("sql");
    let o = Command::new(weir_bin())
        .arg("--data-dir")
        .arg(dir.join("single-data"))
        .arg("run")
        .arg(&file)
        .output()
        .expect("weir run");
    let shown = common::successful_stdout(&o);
    let lines = common::committed_lines(&out);
    assert!(lines.len() > 500, "the reference has {} rows", lines.len());
    (lines, shown)
}

#[test]
fn three_workers_answer_as_one_process_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions, reference) = reference(dir.path(), 3);
    let out = dir.path().join("out");
    let mut workers = Workers::new(dir.path(), 3, &job_sql(&bids, &auctions, &out, "", ""));
    workers.supervise(120, |_| {});
    assert_eq!(workers.starts, vec![1, 1, 1], "no worker failed:\n{}", workers.logs());
    assert_same_rows(&common::committed_lines(&out), &reference, &workers.logs());
}

/// The rows equal the reference's; else how many differ, and a few.
fn assert_same_rows(got: &[String], want: &[String], logs: &str) {
    if got == want {
        return;
    }
    let missing: Vec<&String> = want.iter().filter(|r| !got.contains(r)).take(5).collect();
    let extra: Vec<&String> = got.iter().filter(|r| !want.contains(r)).take(5).collect();
    panic!(
        "{} rows, {} expected; missing e.g. {missing:?}; unexpected e.g. {extra:?}\n{logs}",
        got.len(),
        want.len()
    );
}

#[test]
fn a_worker_killed_again_and_again_costs_no_row_and_duplicates_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let checkpoints = dir.path().join("checkpoints");
    kill_each_worker_in_turn(
        dir.path(),
        &format!("SET 'execution.checkpointing.dir' = '{}';", checkpoints.display()),
    );
}

#[test]
fn with_checkpoints_on_s3_a_killed_worker_costs_no_row_and_duplicates_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s3_dir = dir.path().join("s3");
    std::fs::create_dir_all(&s3_dir).expect("s3 dir");
    let s3 = common::s3_server(&s3_dir);
    kill_each_worker_in_turn(dir.path(), &s3.checkpoint_settings());
}

#[test]
fn with_unaligned_checkpoints_across_workers_a_killed_worker_costs_no_row_and_duplicates_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let checkpoints = dir.path().join("checkpoints");
    let logs = kill_each_worker_in_turn(
        dir.path(),
        &format!(
            "SET 'execution.checkpointing.dir' = '{}';
SET 'execution.checkpointing.unaligned.enabled' = 'true';",
            checkpoints.display()
        ),
    );
    eprintln!("in-flight replays: {}", logs.matches("in-flight rows").count());
}

#[test]
fn with_the_aligned_timeout_switch_across_workers_a_killed_worker_costs_no_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let checkpoints = dir.path().join("checkpoints");
    kill_each_worker_in_turn(
        dir.path(),
        &format!(
            "SET 'execution.checkpointing.dir' = '{}';
SET 'execution.checkpointing.unaligned.enabled' = 'true';
SET 'execution.checkpointing.aligned-checkpoint-timeout' = '20 ms';",
            checkpoints.display()
        ),
    );
}

/// SIGKILL each worker in turn (the coordinator too), each once a further
/// checkpoint completed; the supervisor restarts whatever exits non-zero.
fn kill_each_worker_in_turn(dir: &Path, checkpoint_settings: &str) -> String {
    let (bids, auctions, reference) = reference(dir, 3);
    let out = dir.join("out");
    let extra = format!("SET 'execution.checkpointing.interval' = '200 ms';\n{checkpoint_settings}");
    let pace = ", 'scan.lines-per-second' = '15000'";
    let mut workers = Workers::new(dir, 3, &job_sql(&bids, &auctions, &out, &extra, pace));
    let mut plan = vec![2usize, 0, 1].into_iter();
    let mut next = plan.next();
    let log0 = workers.log(0);
    let mut seen = 0usize;
    let mut killed_at = Instant::now();
    workers.supervise(300, |w| {
        let Some(victim) = next else { return };
        let now = common::completed_checkpoints(&log0);
        if now > seen && killed_at.elapsed() > Duration::from_millis(700) && w.kill(victim) {
            seen = now;
            killed_at = Instant::now();
            next = plan.next();
        }
    });
    assert!(
        next.is_none(),
        "the job finished before every kill:\n{}",
        workers.logs()
    );
    assert!(
        workers.starts.iter().all(|s| *s >= 2),
        "every worker restarted (a full restart): {:?}",
        workers.starts
    );
    assert_same_rows(&common::committed_lines(&out), &reference, &workers.logs());
    let log = std::fs::read_to_string(workers.log(1)).unwrap_or_default();
    assert!(
        log.contains("restoring from checkpoint"),
        "worker 1 never restored:\n{}",
        workers.logs()
    );
    // It laid out only its own key groups' share of the keyed state.
    for line in log.lines().filter(|l| l.contains("as worker 0 decided")) {
        let mine = number_after(line, "its key groups' ").expect("its share");
        let all = number_after(line, " of the snapshot's ").expect("the whole");
        assert!(
            mine > 0 && mine * 3 < all * 2,
            "worker 1 laid out {mine} of {all} bytes: {line}"
        );
    }
    (0..3)
        .map(|i| std::fs::read_to_string(workers.log(i)).unwrap_or_default())
        .collect()
}

/// One crash at a named moment per full restart: worker 2 with a barrier
/// on its way to another worker, then worker 1 with a snapshot file
/// uploaded but its checkpoint not acknowledged, then worker 0 (which
/// commits every worker's output) with a checkpoint's commit half done.
#[test]
fn a_worker_crashing_at_each_named_failpoint_costs_no_row_and_duplicates_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions, reference) = reference(dir.path(), 3);
    let out = dir.path().join("out");
    let extra = format!(
        "SET 'execution.checkpointing.interval' = '200 ms';
SET 'execution.checkpointing.dir' = '{}';",
        dir.path().join("checkpoints").display()
    );
    let pace = ", 'scan.lines-per-second' = '15000'";
    let plan = [
        (2, 1, "exchange.barrier_sent", "exchange.barrier_sent:3"),
        (1, 2, "checkpoint.file_uploaded", "checkpoint.file_uploaded:4"),
        (0, 3, "sink.file_committed", "sink.file_committed:2"),
    ];
    let failpoints: Vec<(usize, u32, &str)> = plan.iter().map(|(w, k, _, spec)| (*w, *k, *spec)).collect();
    let sql = job_sql(&bids, &auctions, &out, &extra, pace);
    let mut workers = Workers::with_failpoints(dir.path(), 3, &sql, &[], &failpoints);
    workers.supervise(300, |_| {});
    for (w, _, name, _) in plan {
        let log = std::fs::read_to_string(workers.log(w)).unwrap_or_default();
        assert!(
            log.contains(&format!("failpoint {name} hit")),
            "worker {w} never crashed at {name} (the job ended first?):\n{}",
            workers.logs()
        );
    }
    assert!(
        workers.starts.iter().all(|s| *s >= 4),
        "three full restarts: {:?}",
        workers.starts
    );
    assert_same_rows(&common::committed_lines(&out), &reference, &workers.logs());
}

#[test]
fn a_stopped_worker_is_found_by_its_silence_and_the_job_recovers_once_it_continues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions, reference) = reference(dir.path(), 3);
    let out = dir.path().join("out");
    let checkpoints = dir.path().join("checkpoints");
    let extra = format!(
        "SET 'execution.checkpointing.interval' = '200 ms';
SET 'execution.checkpointing.dir' = '{}';",
        checkpoints.display()
    );
    let pace = ", 'scan.lines-per-second' = '10000'";
    let sql = job_sql(&bids, &auctions, &out, &extra, pace);
    let mut workers = Workers::with_flags(dir.path(), 3, &sql, &["--heartbeat-timeout", "1.5"]);
    // SIGSTOP worker 1 once a checkpoint completed: its sockets stay open,
    // only its silence gives it away. SIGCONT it once the others noticed.
    let signal = |sig: &str, pid: u32| {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    let mut stopped: Option<u32> = None;
    let mut continued = false;
    let job_checkpoints = checkpoints.clone();
    workers.supervise(300, |w| {
        if continued {
            return;
        }
        match stopped {
            None if newest_checkpoint(&job_checkpoints) > 0 => {
                if let Some(pid) = w.pid(1) {
                    signal("-STOP", pid);
                    stopped = Some(pid);
                }
            }
            Some(pid) => {
                // Whichever worker noticed first (worker 2 may, and worker 0
                // then sees worker 2's link go instead).
                let noticed =
                    (0..3).any(|i| std::fs::read_to_string(w.log(i)).is_ok_and(|l| l.contains("nothing heard")));
                if noticed {
                    signal("-CONT", pid);
                    continued = true;
                }
            }
            None => {}
        }
    });
    assert!(
        continued,
        "the job finished before worker 1 was stopped:\n{}",
        workers.logs()
    );
    assert!(
        workers.starts[1] >= 2,
        "worker 1 went on after being stopped:\n{}",
        workers.logs()
    );
    assert_same_rows(&common::committed_lines(&out), &reference, &workers.logs());
}

/// The seed's skewed backfill over 3 workers: three Nexmark splits, split
/// 0 six times faster than the others, one per worker. Worker 0's reader
/// is alone in its process, so only the group's minimum over all workers
/// can pause it; it does (SHOW WATERMARKS on its worker), the window
/// state's event-time span stays within the drift (against the same job
/// without alignment, whose span grows with the skew), and the output is
/// the single process's.
#[test]
fn an_alignment_group_spans_the_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sql = |out: &Path, extra: &str, alignment: &str| {
        format!(
            "SET 'pipeline.name' = 'align';
SET 'table.dml-sync' = 'true';
SET 'pipeline.watermark-alignment.buffer-size' = '0';
SET 'pipeline.auto-watermark-interval' = '20 ms';
{extra}
CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
    {alignment}
) WITH ('connector' = 'nexmark', 'nexmark.events' = '600000', 'splits' = '3',
        'nexmark.split-skew' = '6', 'nexmark.events-per-second' = '150000');
CREATE TABLE out (auction BIGINT, bids BIGINT, window_end TIMESTAMP(3))
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
INSERT INTO out
SELECT auction, COUNT(*), window_end
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;
SHOW WATERMARKS FOR JOB 'align';
",
            out.display()
        )
    };
    let aligned = "ALIGNMENT GROUP 'bids' MAX DRIFT INTERVAL '5' SECOND UPDATE INTERVAL '20' MILLISECOND";
    // The reference: one process, no alignment (the output is the same:
    // the watermark is the minimum over the splits either way).
    let (reference, unaligned) = single_process_shown(
        dir.path(),
        &sql(Path::new("@OUT@"), "SET 'parallelism.default' = '3';", ""),
    );
    let out = dir.path().join("out");
    let mut workers = Workers::new(dir.path(), 3, &sql(&out, "", aligned));
    workers.supervise(120, |_| {});
    assert_eq!(workers.starts, vec![1, 1, 1], "no worker failed:\n{}", workers.logs());
    assert_same_rows(&common::committed_lines(&out), &reference, &workers.logs());
    // SHOW WATERMARKS on worker 0: its (fast) split was paused.
    let log = std::fs::read_to_string(workers.log(0)).unwrap_or_default();
    let row = log
        .lines()
        .find(|l| l.contains("bid[0]"))
        .unwrap_or_else(|| panic!("no row of split 0 in SHOW WATERMARKS:\n{log}"));
    let paused: i64 = row
        .split('|')
        .map(str::trim)
        .filter_map(|c| c.parse().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no paused_ms in {row:?}"));
    assert!(paused > 0, "worker 0's fast split never paused: {row}\n{log}");
    // The window's state spans at most the drift (5 s) past the slowest
    // split, plus the watermark's 4 s delay, plus what the splits read in
    // the few update intervals before a pause or a new minimum reaches
    // them across workers: this backfill covers ~135 s of event time per
    // second on the fast split (2.7 s per 20 ms interval), ~22 s on the
    // others. Measured here: 10.4-12.9 s. 20 s leaves room for a loaded
    // machine's slower control messages; without alignment the fast split
    // runs ahead by its whole skew (~54 s).
    let widest = |text: &str| {
        text.lines()
            .filter(|l| l.contains("| state"))
            .filter_map(|l| number_after(l, "widest span "))
            .max()
    };
    let free = widest(&unaligned).unwrap_or_else(|| panic!("no state row:\n{unaligned}"));
    for w in 0..3 {
        let log = std::fs::read_to_string(workers.log(w)).unwrap_or_default();
        let span = widest(&log).unwrap_or_else(|| panic!("no state row on worker {w}:\n{log}"));
        eprintln!("worker {w}: the window state spanned at most {span} ms (without alignment {free} ms)");
        assert!(
            span <= 20_000 && span * 2 < free,
            "worker {w}'s window state spans {span} ms of event time (without alignment {free} ms):\n{log}"
        );
    }
}

/// The savepoint worker 0 said it stopped the job with (its log).
fn savepoint_in(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let at = text.rfind("stopped with savepoint ")?;
    let rest = &text[at + "stopped with savepoint ".len()..];
    Some(rest.split(" (start").next()?.trim().to_string())
}

#[test]
fn a_worker_script_with_a_second_insert_is_refused_where_it_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions) = input(dir.path());
    let mut sql = job_sql(&bids, &auctions, &dir.path().join("out"), "", "");
    let line = sql.lines().count() + 1;
    sql.push_str("INSERT INTO out SELECT auction, auction, dateTime, price, price FROM bid;\n");
    let file = dir.path().join("two.sql");
    std::fs::write(&file, sql).expect("sql");
    let o = Command::new(weir_bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "worker",
            "--index",
            "0",
            "--peers",
            &format!("127.0.0.1:{}", common::free_port()),
        ])
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .expect("weir worker");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "two INSERTs ran on one worker:\n{err}");
    assert!(
        err.contains("a worker runs one job") && err.contains(&format!("{line}:1")),
        "the refusal does not say what and where (line {line}):\n{err}"
    );
}

/// A task that fails in every run (its window's snapshot): across
/// workers the restart strategy counts the restarts the checkpoint log
/// records, waits its delay before each, and gives up after its attempts;
/// a worker 0 started again after that gives up again at once, writing
/// nothing more to the log, and the other workers give up with it rather
/// than wait for a worker 0 that will not run the job.
#[test]
fn across_workers_the_restart_strategy_counts_restarts_and_gives_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions) = input(dir.path());
    let out = dir.path().join("out");
    let extra = format!(
        "SET 'execution.checkpointing.interval' = '200 ms';
SET 'execution.checkpointing.dir' = '{}';
SET 'restart-strategy.type' = 'fixed-delay';
SET 'restart-strategy.fixed-delay.attempts' = '2';
SET 'restart-strategy.fixed-delay.delay' = '300 ms';",
        dir.path().join("checkpoints").display()
    );
    let pace = ", 'scan.lines-per-second' = '10000'";
    let failpoints: Vec<(usize, u32, &str)> = (1..=8).map(|k| (1, k, "window.snapshot:1:error")).collect();
    let sql = job_sql(&bids, &auctions, &out, &extra, pace);
    let mut workers = Workers::with_failpoints(dir.path(), 3, &sql, &[], &failpoints);
    let log0 = workers.log(0);
    let gave_up = |l: &str| l.matches("has failed for good").count();
    let records = || {
        std::fs::read_dir(dir.path().join("checkpoints/workers-test/log"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let after_first = std::cell::Cell::new(None);
    workers.supervise_until(
        120,
        |_| {},
        |_| {
            let n = std::fs::read_to_string(&log0).map_or(0, |l| gave_up(&l));
            if n >= 1 && after_first.get().is_none() {
                after_first.set(Some(records()));
            }
            n >= 4
        },
    );
    let log = std::fs::read_to_string(&log0).unwrap_or_default();
    assert!(after_first.get().is_some_and(|n| n > 0), "no log records found:\n{log}");
    assert_eq!(
        Some(records()),
        after_first.get(),
        "worker 0 started after the give-up wrote to the log:\n{log}"
    );
    for w in 1..3 {
        let other = std::fs::read_to_string(workers.log(w)).unwrap_or_default();
        assert!(
            gave_up(&other) >= 2 && !other.contains("did not answer within"),
            "worker {w} did not give up with worker 0:\n{other}"
        );
    }
    let first = log.find("has failed for good").unwrap_or(log.len());
    let waited = log[..first]
        .matches("restarted after a failure; starting in 300ms")
        .count();
    assert_eq!(
        waited, 2,
        "two restarts, each after the strategy's delay, before it gave up:\n{log}"
    );
    assert!(
        log.contains("the fixed-delay restart strategy allows 2 restarts"),
        "the refusal does not name the strategy:\n{log}"
    );
    assert!(
        gave_up(&log) >= 2,
        "a worker 0 started after it gave up ran the job again:\n{log}"
    );
}

/// The number in `line` after `prefix` (`checkpoint 7 completed` → 7).
fn number_after(line: &str, prefix: &str) -> Option<u64> {
    let at = line.find(prefix)? + prefix.len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[test]
fn a_sigterm_on_any_worker_suspends_the_job_at_a_checkpoint_it_resumes_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions, reference) = reference(dir.path(), 3);
    let out = dir.path().join("out");
    let extra = format!(
        "SET 'execution.checkpointing.interval' = '2 s';
SET 'execution.checkpointing.dir' = '{}';",
        dir.path().join("checkpoints").display()
    );
    let pace = ", 'scan.lines-per-second' = '10000'";
    let mut workers = Workers::new(dir.path(), 3, &job_sql(&bids, &auctions, &out, &extra, pace));
    let log0 = workers.log(0);
    let mut signalled = false;
    workers.supervise(300, |w| {
        // Kubernetes deleting pod 1 (a rolling update, a drained node).
        if !signalled
            && common::completed_checkpoints(&log0) >= 1
            && let Some(pid) = w.pid(1)
        {
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            signalled = true;
        }
    });
    assert!(
        signalled,
        "the job finished before the signal:
{}",
        workers.logs()
    );
    assert!(
        workers.starts.iter().all(|s| *s == 2),
        "every worker ended at the suspend and was started once more: {:?}\n{}",
        workers.starts,
        workers.logs()
    );
    assert_same_rows(&common::committed_lines(&out), &reference, &workers.logs());
    // The suspend took a checkpoint of its own (the interval is long: it
    // was asked for), and the restarted job resumed from exactly that one.
    let log = std::fs::read_to_string(&log0).unwrap_or_default();
    let at = log
        .find("another worker was signalled; suspending")
        .unwrap_or_else(|| panic!("worker 0 never suspended:\n{}", workers.logs()));
    let after = &log[at..];
    let taken = after
        .lines()
        .take_while(|l| !l.contains("restoring from checkpoint"))
        .filter(|l| l.contains(" completed in "))
        .filter_map(|l| number_after(l, ": checkpoint "))
        .last()
        .unwrap_or_else(|| panic!("no checkpoint completed after the suspend:\n{log}"));
    let restored = after
        .lines()
        .find_map(|l| number_after(l, "restoring from checkpoint "))
        .unwrap_or_else(|| panic!("the job never resumed:\n{log}"));
    assert_eq!(
        restored, taken,
        "resumed from another checkpoint than the suspend's:\n{log}"
    );
}

#[test]
fn a_job_rescaled_from_2_to_3_to_1_workers_through_savepoints_on_s3_answers_as_one_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions, reference) = reference(dir.path(), 3);
    let out = dir.path().join("out");
    let s3_dir = dir.path().join("s3");
    std::fs::create_dir_all(&s3_dir).expect("s3 dir");
    let s3 = common::s3_server(&s3_dir);
    let extra = format!(
        "SET 'execution.checkpointing.interval' = '200 ms';
{}
SET 'execution.checkpointing.savepoint-dir' = 's3://{}/savepoints';",
        s3.checkpoint_settings(),
        s3.bucket
    );
    // Slow enough that every stop (the second round's after a kill, a
    // restart and two checkpoints on S3) comes before the input's end.
    let pace = ", 'scan.lines-per-second' = '5000'";
    let sql = job_sql(&bids, &auctions, &out, &extra, pace);
    let mut from: Option<String> = None;
    let mut rows_before = 0;
    for (round, n) in [2usize, 3, 1].into_iter().enumerate() {
        let run = dir.path().join(format!("run-{round}"));
        std::fs::create_dir_all(&run).expect("run dir");
        let flags: Vec<String> = match &from {
            Some(sp) => vec!["--from-savepoint".into(), sp.clone()],
            None => vec![],
        };
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut workers = Workers::with_flags(&run, n, &sql, &flags);
        let last = round == 2;
        let log0 = workers.log(0);
        let mut signalled = false;
        // In the 3-worker round, worker 2 is killed once after the
        // deployment's first checkpoint: restarted with the same
        // `--from-savepoint`, the job must resume from that checkpoint,
        // not from the savepoint again (which would write twice what was
        // committed since).
        let mut killed = round != 1;
        workers.supervise(300, |w| {
            let log = std::fs::read_to_string(&log0).unwrap_or_default();
            let done = log.matches(" completed in ").count();
            if !killed && done >= 1 && w.kill(2) {
                killed = true;
            }
            // SIGUSR1 worker 0 (stop with savepoint: an upgrade, a
            // rescale) once the run completed a checkpoint of its own:
            // after the restart that followed the kill, in the 3-worker
            // round. (Counting from the kill instead left too little input
            // on a loaded machine: checkpoints on S3 take over a second.)
            let restores = log.matches("restoring from checkpoint").count();
            let since_restore = log
                .rsplit("restoring from checkpoint")
                .next()
                .map_or(0, |after| after.matches(" completed in ").count());
            let resumed = round != 1 || restores >= 2;
            if !last
                && killed
                && resumed
                && !signalled
                && since_restore >= 1
                && let Some(pid) = w.pid(0)
            {
                let _ = Command::new("kill").args(["-USR1", &pid.to_string()]).status();
                signalled = true;
            }
        });
        if round == 1 {
            assert!(killed, "run 1 finished before the kill:\n{}", workers.logs());
            let log = std::fs::read_to_string(&log0).unwrap_or_default();
            let restores: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("restoring from checkpoint"))
                .collect();
            assert!(
                restores.len() >= 2 && !restores[restores.len() - 1].contains("savepoint-"),
                "after the kill the deployment resumed from its savepoint again, not from its checkpoint: {restores:?}"
            );
        } else {
            assert_eq!(
                workers.starts,
                vec![1; n],
                "run {round}: no worker failed:\n{}",
                workers.logs()
            );
        }
        if !last {
            assert!(signalled, "run {round} finished before its stop:\n{}", workers.logs());
            from = Some(savepoint_in(&log0).unwrap_or_else(|| panic!("no savepoint:\n{}", workers.logs())));
            let rows = common::committed_lines(&out).len();
            assert!(rows >= rows_before, "committed rows went back");
            rows_before = rows;
            // Its pods restarted with the same arguments (a StatefulSet
            // restarts pods that exit, even 0): they do not run the
            // stopped job again.
            drop(workers);
            let mut again = Workers::with_flags(&run, n, &sql, &flags);
            again.supervise(60, |_| {});
            let log = std::fs::read_to_string(again.log(0)).unwrap_or_default();
            assert!(
                log.contains("has been stopped with savepoint"),
                "a restarted worker 0 did not say the job was stopped:\n{}",
                again.logs()
            );
            assert_eq!(
                common::committed_lines(&out).len(),
                rows,
                "a restarted pod ran the stopped job again"
            );
        }
    }
    assert!(rows_before < reference.len(), "the stops came after the end");
    assert_same_rows(&common::committed_lines(&out), &reference, "after 2 -> 3 -> 1 workers");
}

/// The id of the newest completed checkpoint below `root` (at any depth
/// of job directories): its `chk-<id>` has `_metadata`.
fn newest_checkpoint(root: &Path) -> u64 {
    let mut newest = 0;
    if let Ok(d) = std::fs::read_dir(root) {
        for e in d.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            match name.strip_prefix("chk-").and_then(|n| n.parse::<u64>().ok()) {
                Some(id) if e.path().join("_metadata").exists() => newest = newest.max(id),
                Some(_) => {}
                None if e.path().is_dir() => newest = newest.max(newest_checkpoint(&e.path())),
                None => {}
            }
        }
    }
    newest
}

/// `weir k8s manifests` for the quickstart, as a StatefulSet and as an
/// Indexed Job, equal to the reviewed files in `tests/data/k8s/` (checked
/// as YAML and against the Kubernetes schemas when those files were
/// reviewed; `WEIR_UPDATE_GOLDEN=1` rewrites them).
#[test]
fn the_kubernetes_manifests_are_the_reviewed_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (kind, workers, golden) in [
        ("statefulset", "3", "quickstart-statefulset.yaml"),
        ("job", "2", "quickstart-job.yaml"),
    ] {
        let o = Command::new(weir_bin())
            .current_dir(root)
            .args([
                "k8s",
                "manifests",
                "examples/quickstart.sql",
                "--workers",
                workers,
                "--kind",
                kind,
            ])
            .output()
            .expect("weir k8s manifests");
        let yaml = common::successful_stdout(&o);
        let path = root.join("tests/data/k8s").join(golden);
        if std::env::var_os("WEIR_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &yaml).expect("write golden");
        }
        let want = std::fs::read_to_string(&path).expect("golden file");
        assert_eq!(
            yaml, want,
            "{golden} differs: review the change, then WEIR_UPDATE_GOLDEN=1"
        );
    }
    // A bad argument is refused by name.
    let o = Command::new(weir_bin())
        .current_dir(root)
        .args([
            "k8s",
            "manifests",
            "examples/quickstart.sql",
            "--workers",
            "2",
            "--name",
            "No_Good",
        ])
        .output()
        .expect("weir k8s manifests");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--name 'No_Good'"));
}

/// A CA and a certificate for 127.0.0.1 signed by it, in `dir`:
/// (`<name>-ca.pem`, `<name>-cert.pem`, `<name>-key.pem`).
fn certificates(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("ext");
    let commands = [
        format!(
            "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN={name}-ca -keyout {name}-ca.key -out {name}-ca.pem"
        ),
        format!("req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout {name}-key.pem -out {name}.csr"),
        format!(
            "x509 -req -in {name}.csr -CA {name}-ca.pem -CAkey {name}-ca.key -CAcreateserial -days 1 -out {name}-cert.pem -extfile ext.cnf"
        ),
    ];
    for args in &commands {
        let made = Command::new("openssl")
            .args(args.split(' '))
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl (installed by scripts/setup.sh)");
        assert!(made.success(), "openssl {args} failed");
    }
    (
        dir.join(format!("{name}-ca.pem")),
        dir.join(format!("{name}-cert.pem")),
        dir.join(format!("{name}-key.pem")),
    )
}

#[test]
fn workers_talk_over_mutual_tls_and_refuse_a_stranger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bids, auctions, reference) = reference(dir.path(), 2);
    let (ca, cert, key) = certificates(dir.path(), "job");
    let tls = |ca: &Path, cert: &Path, key: &Path| -> Vec<String> {
        vec![
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
            "--tls-ca".into(),
            ca.display().to_string(),
        ]
    };
    let flags = tls(&ca, &cert, &key);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = dir.path().join("out");
    let run = dir.path().join("tls-run");
    std::fs::create_dir_all(&run).expect("run dir");
    let mut workers = Workers::with_flags(&run, 2, &job_sql(&bids, &auctions, &out, "", ""), &flags);
    workers.supervise(120, |_| {});
    assert_eq!(workers.starts, vec![1, 1], "no worker failed:\n{}", workers.logs());
    assert_same_rows(&common::committed_lines(&out), &reference, &workers.logs());

    // A worker whose certificate another CA signed is refused, both ways.
    let (other_ca, other_cert, other_key) = certificates(dir.path(), "stranger");
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", common::free_port(), common::free_port());
    let sql = dir.path().join("stranger.sql");
    std::fs::write(&sql, job_sql(&bids, &auctions, &dir.path().join("out2"), "", "")).expect("sql");
    let spawn = |i: usize, flags: Vec<String>| {
        Command::new(weir_bin())
            .arg("--data-dir")
            .arg(dir.path().join(format!("stranger-data-{i}")))
            .args([
                "worker",
                "--index",
                &i.to_string(),
                "--peers",
                &peers,
                "--join-timeout",
                "5",
            ])
            .args(flags)
            .arg(&sql)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let ours = spawn(0, tls(&ca, &cert, &key));
    let theirs = spawn(1, tls(&other_ca, &other_cert, &other_key));
    // Worker 0 connects to the stranger and refuses its certificate; the
    // stranger never gets a hello through.
    for (who, child, why) in [("worker 0", ours, "TLS"), ("the stranger", theirs, "did not connect")] {
        let o = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{who} ran with a stranger: {err}");
        assert!(err.contains(why), "{who}: {err}");
    }
    assert!(common::committed_lines(&dir.path().join("out2")).is_empty());
    // Bad files are named.
    let o = Command::new(weir_bin())
        .args(["worker", "--index", "0", "--peers", "127.0.0.1:1"])
        .args(tls(&ca, &dir.path().join("missing.pem"), &key))
        .arg(&sql)
        .output()
        .expect("weir worker");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.pem"));
}
