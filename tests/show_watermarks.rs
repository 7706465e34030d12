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

/// Peak state of a job's operators, sampled while it runs (a sampling
/// period, not synchronisation), and the `SHOW WATERMARKS` state rows at
/// its end.
async fn interval_join_peak_state(aligned: bool) -> (i64, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut session = Session::open(dir.path()).expect("session");
    let group = if aligned {
        " ALIGNMENT GROUP 'g' MAX DRIFT INTERVAL '1' SECOND UPDATE INTERVAL '20' MILLISECOND"
    } else {
        ""
    };
    // Both tables generate the same 30 s of event time; `fast` reads it in
    // 3 s, `slow` in 6 s, so `fast` runs ahead in event time (a backfill)
    // unless aligned. (Paced: an unpaced reader would be through before
    // the first alignment announcement.)
    session
        .execute_sql(&format!(
            "SET 'parallelism.default' = '1';
             SET 'pipeline.name' = 'ij';
             SET 'pipeline.auto-watermark-interval' = '20 ms';
             SET 'pipeline.watermark-alignment.buffer-size' = '0';
             CREATE TABLE fast (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
               WATERMARK FOR dateTime AS dateTime - INTERVAL '1' SECOND{group})
             WITH ('connector' = 'nexmark', 'nexmark.events' = '30000', 'nexmark.first-event-rate' = '1000',
               'nexmark.events-per-second' = '10000');
             CREATE TABLE slow (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
               WATERMARK FOR dateTime AS dateTime - INTERVAL '1' SECOND{group})
             WITH ('connector' = 'nexmark', 'nexmark.events' = '30000', 'nexmark.first-event-rate' = '1000',
               'nexmark.events-per-second' = '5000');
             CREATE TABLE sink (auction BIGINT, a BIGINT, b BIGINT) WITH ('connector' = 'blackhole');
             INSERT INTO sink SELECT f.auction, f.price, s.price FROM fast f JOIN slow s
               ON f.auction = s.auction AND f.dateTime BETWEEN s.dateTime - INTERVAL '1' SECOND AND s.dateTime + INTERVAL '1' SECOND;"
        ))
        .await
        .expect("job");
    let job = session.take_jobs().pop().expect("job started");
    let metrics = job.metrics.clone();
    let mut peak = 0;
    let mut done = Box::pin(job.wait());
    loop {
        tokio::select! {
            r = &mut done => {
                r.expect("job ends");
                break;
            }
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {
                // The join's state as SHOW WATERMARKS shows it ("N bytes").
                let state: i64 = weir::watermarks::rows(&metrics, None, 0)
                    .iter()
                    .filter(|r| r.scope == "state" && r.name.contains("IntervalJoin"))
                    .filter_map(|r| r.state.strip_suffix(" bytes")?.parse::<i64>().ok())
                    .sum();
                peak = peak.max(state);
            }
        }
    }
    let rows = weir::watermarks::rows(&metrics, None, 0);
    let state_rows: Vec<String> = rows
        .iter()
        .filter(|r| r.scope == "state")
        .map(|r| format!("{} {} {}", r.name, r.state, r.detail))
        .collect();
    (peak, state_rows.join("\n"))
}

/// An interval join's state is in `SHOW WATERMARKS` (bytes, and bytes per
/// second of event time, for sizing a drift), here over two sources in
/// one alignment group, one reading ahead: the seed's promise. With
/// alignment the fast source is held within the drift (1 s) of the slow
/// one, so the join keeps about the rows of a few seconds; without it the
/// fast source runs up to 15 s of event time ahead and the join keeps all
/// of them. (A paced source resumes after a pause at its rate, not in a
/// catch-up burst that would run ahead of the drift.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_watermarks_sizes_an_interval_joins_state() {
    let (aligned, rows) = interval_join_peak_state(true).await;
    let line = rows
        .lines()
        .find(|l| l.contains("IntervalJoin"))
        .unwrap_or_else(|| panic!("SHOW WATERMARKS lists the interval join's state:\n{rows}"));
    assert!(!line.contains("peak 0 bytes/s"), "a state rate was measured: {line}");
    assert!(aligned > 0, "the join held no state");
    let (unaligned, _) = interval_join_peak_state(false).await;
    eprintln!("interval join peak state: {aligned} bytes aligned, {unaligned} bytes not");
    assert!(
        aligned * 2 < unaligned,
        "alignment bounds the join's state: {aligned} bytes aligned, {unaligned} bytes not"
    );
}
