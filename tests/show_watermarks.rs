//! `SHOW WATERMARKS FOR JOB`: per split, per alignment group, per stateful
//! operator, and the drift a state budget allows.

use weir::{Session, StatementResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shows_splits_groups_state_and_sizing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut session = Session::open(dir.path()).expect("session");
    session
        .execute_sql(
            "SET 'parallelism.default' = '2';
             SET 'table.dml-sync' = 'true';
             SET 'pipeline.name' = 'skewed';
             SET 'pipeline.watermark-alignment.state-budget' = '64 mb';
             SET 'pipeline.auto-watermark-interval' = '50 ms';
             CREATE TABLE bid (auction BIGINT, dateTime TIMESTAMP(3),
               WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
                 ALIGNMENT GROUP 'bids' MAX DRIFT INTERVAL '10' SECOND UPDATE INTERVAL '100' MILLISECOND)
             WITH ('connector' = 'nexmark', 'nexmark.events' = '300000', 'splits' = '4', 'nexmark.split-skew' = '4',
               'nexmark.events-per-second' = '200000');
             CREATE TABLE sink (auction BIGINT, n BIGINT) WITH ('connector' = 'blackhole');
             INSERT INTO sink SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
             GROUP BY auction, window_start, window_end;",
        )
        .await
        .expect("job");
    let results = session
        .execute_sql("SHOW WATERMARKS FOR JOB 'skewed';")
        .await
        .expect("show");
    let Some(StatementResult::Rows(_, batches)) = results.into_iter().next() else {
        panic!("rows expected")
    };
    let text = weir::display::table(&batches);
    let lines: Vec<&str> = text.lines().collect();
    let splits: Vec<&&str> = lines.iter().filter(|l| l.contains("| split ")).collect();
    assert_eq!(splits.len(), 4, "one row per split:\n{text}");
    assert!(splits.iter().all(|l| l.contains("finished")), "{text}");
    // The bounded end: 30 s of events, the watermark 4 s behind the last.
    assert!(splits.iter().all(|l| l.contains("2015-07-15 00:00:25.9")), "{text}");
    assert!(!text.contains("reader drift -9"), "no drift against +inf: {text}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("| group ") && l.contains("bids") && l.contains("max drift 10000 ms")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("| state ") && l.contains("WindowAggregate")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("| sizing ") && l.contains("67108864 bytes") && l.contains("a max drift of about")),
        "{text}"
    );

    let err = session
        .execute_sql("SHOW WATERMARKS FOR JOB 'nope';")
        .await
        .err()
        .expect("unknown job");
    assert!(err.to_string().contains("no job 'nope'; jobs: skewed"), "{err}");
}
