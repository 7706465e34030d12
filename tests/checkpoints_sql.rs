//! Checkpointing seen from SQL: `SHOW CHECKPOINTS FOR JOB`, the exactly-once
//! file sink committing on checkpoints, and a job whose run finished
//! starting afresh (not resuming) the next time.

use weir::{Session, StatementResult};

const JOB: &str = "SET 'parallelism.default' = '2';
SET 'table.dml-sync' = 'true';
SET 'pipeline.name' = 'counted';
SET 'execution.checkpointing.interval' = '100 ms';
CREATE TABLE IF NOT EXISTS bid (auction BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND)
WITH ('connector' = 'nexmark', 'nexmark.events' = '100000', 'nexmark.events-per-second' = '100000');
CREATE TABLE IF NOT EXISTS counts (auction BIGINT, n BIGINT) WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'csv');
INSERT INTO counts SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND))
GROUP BY auction, window_start, window_end;";

fn visible_rows(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .expect("out dir")
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| std::fs::read_to_string(e.path()).expect("read").lines().count())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_listed_and_a_finished_job_starts_afresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let sql = JOB.replace("{out}", &out.display().to_string());
    let mut session = Session::open(dir.path().join("data")).expect("session");
    let results = session.execute_sql(&sql).await.expect("job");
    let Some(StatementResult::JobStarted { resumed_from, .. }) = results.last() else {
        panic!("job expected")
    };
    assert!(resumed_from.is_none(), "first run starts fresh");
    let rows = session
        .execute_sql("SHOW CHECKPOINTS FOR JOB 'counted';")
        .await
        .expect("show");
    let Some(StatementResult::Rows(_, batches)) = rows.into_iter().next() else {
        panic!("rows expected")
    };
    let text = weir::display::table(&batches);
    let completed: Vec<&str> = text.lines().filter(|l| l.contains("COMPLETED")).collect();
    assert!(completed.len() >= 3, "periodic checkpoints and a final one:\n{text}");
    assert!(
        completed.last().is_some_and(|l| l.contains("| true ")),
        "the last is the final checkpoint:\n{text}"
    );
    let first_rows = visible_rows(&out);
    assert!(first_rows > 0, "committed output is visible");
    let jobs = session.execute_sql("SHOW JOBS;").await.expect("show jobs");
    let Some(StatementResult::Rows(_, batches)) = jobs.into_iter().next() else {
        panic!("rows expected")
    };
    let text = weir::display::table(&batches);
    let line = text.lines().find(|l| l.contains("counted")).expect("the job is listed");
    // Finished (dml-sync), 100 000 events read (46 of every 50 are bids), a checkpoint.
    assert!(line.contains("FINISHED") && line.contains("92000"), "{text}");

    // The run finished: running it again starts afresh, it does not resume
    // (and so writes every row once more).
    let mut again = Session::open(dir.path().join("data")).expect("session");
    let results = again.execute_sql(&sql).await.expect("job");
    let Some(StatementResult::JobStarted { resumed_from, .. }) = results.last() else {
        panic!("job expected")
    };
    assert!(
        resumed_from.is_none(),
        "a finished job is not resumed: {resumed_from:?}"
    );
    assert_eq!(visible_rows(&out), 2 * first_rows);

    // Starting from an explicit checkpoint: the final one of the last run
    // (its output is committed already, so nothing is written again).
    let root = dir.path().join("data").join("checkpoints").join("counted");
    let last = std::fs::read_dir(&root)
        .expect("checkpoints")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse::<u64>().ok())
        .max()
        .expect("a checkpoint");
    let chk = root.join(format!("chk-{last}"));
    let mut third = Session::open(dir.path().join("data")).expect("session");
    let explicit = format!("SET 'execution.state-recovery.path' = '{}';\n{sql}", chk.display());
    let results = third.execute_sql(&explicit).await.expect("job");
    let Some(StatementResult::JobStarted { resumed_from, .. }) = results.last() else {
        panic!("job expected")
    };
    assert_eq!(
        resumed_from.as_ref().map(|r| r.0),
        Some(last),
        "resumed from the path given"
    );
    assert_eq!(
        visible_rows(&out),
        2 * first_rows,
        "a finished run's checkpoint produces nothing more"
    );

    let err = session
        .execute_sql("SHOW CHECKPOINTS FOR JOB 'nope';")
        .await
        .err()
        .expect("unknown job");
    assert!(err.to_string().contains("no job 'nope'"), "{err}");
}
