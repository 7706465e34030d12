//! `weir bench nexmark`: Nexmark queries over the built-in generator, each
//! into a blackhole sink, timed end to end (generation included, as in the
//! Nexmark suite). Reports events per second and per core.

use std::time::Instant;

use clap::Args;

use crate::session::Session;

#[derive(Args, Debug, Clone)]
pub struct NexmarkArgs {
    /// Events of all kinds per query (bids are 92% of them).
    #[arg(long, default_value_t = 10_000_000)]
    pub events: u64,
    /// Comma-separated: q0,q1,q2,q5,q7,q11,q12 (windows, sessions,
    /// processing time and stateless), q10 (a partitioned file sink), and
    /// the updating queries q3,q4,q9,q15,q16,q17,q18,q19,q20.
    #[arg(long, default_value = "q0,q1,q2,q5,q7")]
    pub queries: String,
    #[arg(long, default_value_t = 1)]
    pub parallelism: usize,
    /// rocksdb or hashmap.
    #[arg(long, default_value = "rocksdb")]
    pub state_backend: String,
}

pub const BID_COLUMNS: &str =
    "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime TIMESTAMP(3), extra STRING";
pub const AUCTION_COLUMNS: &str = "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, \
     dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra STRING";
pub const PERSON_COLUMNS: &str = "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, \
     state STRING, dateTime TIMESTAMP(3), extra STRING";

/// The queries `weir bench nexmark` knows.
pub const QUERIES: &str = "q0, q1, q2, q3, q4, q5, q7, q9, q10, q11, q12, q15, q16, q17, q18, q19, q20";

/// Nexmark q15-q17's counters over one group (Flink's Nexmark SQL; the
/// day is `CAST(dateTime AS DATE)` where Flink's writes
/// `DATE_FORMAT(dateTime, 'yyyy-MM-dd')`: the same groups).
const RANKED_COUNTS: &str = "COUNT(*) AS total_bids, \
     COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, \
     COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
     COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, \
     COUNT(DISTINCT bidder) AS total_bidders, \
     COUNT(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, \
     COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, \
     COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, \
     COUNT(DISTINCT auction) AS total_auctions, \
     COUNT(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, \
     COUNT(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions, \
     COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions";
const RANKED_COUNT_COLUMNS: &str = "total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, rank3_bids BIGINT, \
     total_bidders BIGINT, rank1_bidders BIGINT, rank2_bidders BIGINT, rank3_bidders BIGINT, \
     total_auctions BIGINT, rank1_auctions BIGINT, rank2_auctions BIGINT, rank3_auctions BIGINT";

/// (sink columns, query).
pub fn query(name: &str) -> Option<(String, String)> {
    let (cols, q): (&str, &str) = match name {
        "q0" => (
            "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra STRING",
            "SELECT auction, bidder, price, dateTime, extra FROM bid",
        ),
        "q1" => (
            "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), dateTime TIMESTAMP(3), extra STRING",
            "SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid",
        ),
        "q2" => (
            "auction BIGINT, price BIGINT",
            "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
        ),
        "q5" => (
            "auction BIGINT, num BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3)",
            "SELECT auction, COUNT(*) AS num, window_start, window_end \
             FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) \
             GROUP BY auction, window_start, window_end",
        ),
        "q7" => (
            "window_start TIMESTAMP(3), window_end TIMESTAMP(3), maxprice BIGINT",
            "SELECT window_start, window_end, MAX(price) AS maxprice \
             FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) \
             GROUP BY window_start, window_end",
        ),
        "q11" => (
            "bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
            "SELECT B.bidder, COUNT(*) AS bid_count, SESSION_START(B.dateTime, INTERVAL '10' SECOND) AS starttime, \
             SESSION_END(B.dateTime, INTERVAL '10' SECOND) AS endtime \
             FROM bid B GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND)",
        ),
        "q10" => (
            "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra STRING, dt STRING, hm STRING",
            "SELECT auction, bidder, price, dateTime, extra, DATE_FORMAT(dateTime, 'yyyy-MM-dd'), \
             DATE_FORMAT(dateTime, 'HH:mm') FROM bid",
        ),
        "q12" => (
            "bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
            "SELECT B.bidder, COUNT(*) AS bid_count, TUMBLE_START(B.p_time, INTERVAL '10' SECOND) AS starttime, \
             TUMBLE_END(B.p_time, INTERVAL '10' SECOND) AS endtime \
             FROM (SELECT *, PROCTIME() AS p_time FROM bid) B GROUP BY B.bidder, TUMBLE(B.p_time, INTERVAL '10' SECOND)",
        ),
        "q3" => (
            "name STRING, city STRING, state STRING, id BIGINT",
            "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P ON A.seller = P.id \
             WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')",
        ),
        "q4" => (
            "id BIGINT, final BIGINT",
            "SELECT Q.category, AVG(Q.final) FROM (SELECT MAX(B.price) AS final, A.category \
             FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires \
             GROUP BY A.id, A.category) Q GROUP BY Q.category",
        ),
        "q9" => (
            "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, \
             dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra STRING, \
             auction BIGINT, bidder BIGINT, price BIGINT, bid_dateTime TIMESTAMP(3), bid_extra STRING",
            "SELECT id, itemName, description, initialBid, reserve, dateTime, expires, seller, category, extra, \
             auction, bidder, price, bid_dateTime, bid_extra FROM (SELECT A.*, B.auction, B.bidder, B.price, \
             B.dateTime AS bid_dateTime, B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY A.id \
             ORDER BY B.price DESC, B.dateTime ASC) AS rownum FROM auction A, bid B WHERE A.id = B.auction \
             AND B.dateTime BETWEEN A.dateTime AND A.expires) WHERE rownum <= 1",
        ),
        "q15" => {
            return Some((
                format!("`day` DATE, {RANKED_COUNT_COLUMNS}"),
                format!(
                    "SELECT CAST(dateTime AS DATE) AS `day`, {RANKED_COUNTS} FROM bid GROUP BY CAST(dateTime AS DATE)"
                ),
            ));
        }
        "q16" => {
            // Flink's `max(DATE_FORMAT(dateTime, 'HH:mm'))`: the same text.
            return Some((
                format!("channel STRING, `day` DATE, `minute` STRING, {RANKED_COUNT_COLUMNS}"),
                format!(
                    "SELECT channel, CAST(dateTime AS DATE) AS `day`, \
                     MAX(SUBSTRING(CAST(dateTime AS STRING), 12, 5)) AS `minute`, {RANKED_COUNTS} \
                     FROM bid GROUP BY channel, CAST(dateTime AS DATE)"
                ),
            ));
        }
        "q17" => (
            "auction BIGINT, `day` DATE, total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, \
             rank3_bids BIGINT, min_price BIGINT, max_price BIGINT, avg_price BIGINT, sum_price BIGINT",
            "SELECT auction, CAST(dateTime AS DATE) AS `day`, COUNT(*) AS total_bids, \
             COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids, \
             COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
             COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids, MIN(price) AS min_price, \
             MAX(price) AS max_price, AVG(price) AS avg_price, SUM(price) AS sum_price \
             FROM bid GROUP BY auction, CAST(dateTime AS DATE)",
        ),
        "q18" => (
            "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime TIMESTAMP(3), \
             extra STRING",
            "SELECT auction, bidder, price, channel, url, dateTime, extra FROM (SELECT *, ROW_NUMBER() OVER \
             (PARTITION BY bidder, auction ORDER BY dateTime DESC) AS rank_number FROM bid) WHERE rank_number <= 1",
        ),
        "q19" => (
            "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime TIMESTAMP(3), \
             extra STRING, rank_number BIGINT",
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number \
             FROM bid) WHERE rank_number <= 10",
        ),
        "q20" => (
            "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, bid_dateTime TIMESTAMP(3), \
             bid_extra STRING, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, \
             auction_dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, \
             auction_extra STRING",
            "SELECT auction, bidder, price, channel, url, B.dateTime, B.extra, itemName, description, initialBid, \
             reserve, A.dateTime, expires, seller, category, A.extra FROM bid AS B INNER JOIN auction AS A \
             ON B.auction = A.id WHERE A.category = 10",
        ),
        _ => return None,
    };
    Some((cols.to_string(), q.to_string()))
}

/// The full script of one benchmark query.
pub fn script(name: &str, events: u64, parallelism: usize, backend: &str) -> Option<String> {
    let (sink_cols, q) = query(name)?;
    Some(format!(
        "SET 'parallelism.default' = '{parallelism}';\n\
         SET 'state.backend.type' = '{backend}';\n\
         SET 'table.dml-sync' = 'true';\n\
         CREATE TABLE bid ({BID_COLUMNS}, WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND)\n\
           WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '{events}');\n\
         CREATE TABLE auction ({AUCTION_COLUMNS}, WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND)\n\
           WITH ('connector' = 'nexmark', 'nexmark.table' = 'auction', 'nexmark.events' = '{events}');\n\
         CREATE TABLE person ({PERSON_COLUMNS}, WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND)\n\
           WITH ('connector' = 'nexmark', 'nexmark.table' = 'person', 'nexmark.events' = '{events}');\n\
         {}\n\
         INSERT INTO sink {q};\n",
        sink_ddl(name, &sink_cols)
    ))
}

/// The sink of a benchmark query: a blackhole, or for q10 Flink's
/// partitioned file table under `${SINK_DIR}` (the run's directory).
fn sink_ddl(name: &str, cols: &str) -> String {
    if name == "q10" {
        return format!(
            "CREATE TABLE sink ({cols}) PARTITIONED BY (dt, hm) WITH ('connector' = 'filesystem', \
             'path' = '${{SINK_DIR}}', 'format' = 'csv', 'sink.partition-commit.trigger' = 'partition-time', \
             'sink.partition-commit.delay' = '1 min', 'sink.partition-commit.policy.kind' = 'success-file', \
             'partition.time-extractor.timestamp-pattern' = '$dt $hm:00', \
             'sink.rolling-policy.rollover-interval' = '1min', 'sink.rolling-policy.check-interval' = '1min');"
        );
    }
    format!("CREATE TABLE sink ({cols}) WITH ('connector' = 'blackhole');")
}

pub async fn run_nexmark(args: &NexmarkArgs) -> i32 {
    println!(
        "| query | events | parallelism | state | seconds | events/s | events/s per core |\n|---|---|---|---|---|---|---|"
    );
    for name in args.queries.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some(sql) = script(name, args.events, args.parallelism, &args.state_backend) else {
            eprintln!("error: unknown query '{name}'; known: {QUERIES}");
            return 1;
        };
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: cannot create a temporary data dir: {e}");
                return 1;
            }
        };
        let mut session = match Session::open(dir.path()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return 1;
            }
        };
        let sql = sql.replace("${SINK_DIR}", &dir.path().join("sink").display().to_string());
        let started = Instant::now();
        if let Err(e) = session.execute_sql(&sql).await {
            eprintln!("error: {name}: {e}");
            return 1;
        }
        let secs = started.elapsed().as_secs_f64();
        let rate = args.events as f64 / secs;
        println!(
            "| {name} | {} | {} | {} | {secs:.2} | {:.0} | {:.0} |",
            args.events,
            args.parallelism,
            args.state_backend,
            rate,
            rate / args.parallelism as f64
        );
    }
    0
}

#[derive(Args, Debug, Clone)]
pub struct AlignmentArgs {
    /// Events of all kinds.
    #[arg(long, default_value_t = 5_000_000)]
    pub events: u64,
    /// Splits (and source parallelism): one split per reader.
    #[arg(long, default_value_t = 12)]
    pub splits: usize,
    /// How many times faster split 0 reads.
    #[arg(long, default_value_t = 6)]
    pub skew: u64,
    /// Max drift in seconds for the aligned run.
    #[arg(long, default_value_t = 30)]
    pub drift: u64,
    /// pipeline.watermark-alignment.buffer-size for the aligned run.
    #[arg(long, default_value_t = 3)]
    pub buffer_size: usize,
    /// UPDATE INTERVAL of the aligned run, in milliseconds. The synthetic
    /// backfill covers ~40 s of event time per second per reader, so the
    /// interval must be short for the drift to mean anything.
    #[arg(long, default_value_t = 100)]
    pub update_interval_ms: u64,
    /// Read rate of the slow splits together, events per second; split 0
    /// reads `skew` times its share. Paced reading models partitions of
    /// uneven throughput; unpaced, the fast split would burst through its
    /// whole share before the first announcement.
    #[arg(long, default_value_t = 400_000)]
    pub rate: u64,
}

/// Figures of one backfill run.
#[derive(Debug, Default)]
pub struct BackfillFigures {
    pub seconds: f64,
    pub peak_state_bytes: i64,
    pub peak_spread_ms: i64,
    /// Median spread over the run: the steady state, without the start-up
    /// transient (before the first announcements nothing holds a reader
    /// back, in Flink as here, and the fast reader starts far ahead).
    pub median_spread_ms: i64,
    pub peak_rss_bytes: u64,
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        })
        .map_or(0, |kb| kb * 1024)
}

/// Runs the seed's backfill: `splits` Nexmark splits, split 0 `skew` times
/// faster, into a keyed HOP window on RocksDB; samples state size, the
/// spread between source readers and memory every 50 ms.
pub async fn backfill(args: &AlignmentArgs, aligned: bool) -> Result<BackfillFigures, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut session = Session::open(dir.path()).map_err(|e| e.to_string())?;
    let alignment = if aligned {
        format!(
            " ALIGNMENT GROUP 'bids' MAX DRIFT INTERVAL '{}' SECOND UPDATE INTERVAL '{}' MILLISECOND",
            args.drift, args.update_interval_ms
        )
    } else {
        String::new()
    };
    let sql = format!(
        "SET 'parallelism.default' = '{splits}';
         SET 'pipeline.watermark-alignment.buffer-size' = '{buffer}';
         CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3),
           WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND{alignment})
         WITH ('connector' = 'nexmark', 'nexmark.events' = '{events}', 'splits' = '{splits}',
               'nexmark.split-skew' = '{skew}', 'nexmark.events-per-second' = '{rate}');
         CREATE TABLE sink (auction BIGINT, bids BIGINT, window_end TIMESTAMP(3)) WITH ('connector' = 'blackhole');
         INSERT INTO sink SELECT auction, COUNT(*), window_end
         FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
         GROUP BY auction, window_start, window_end;",
        splits = args.splits,
        buffer = args.buffer_size,
        events = args.events,
        skew = args.skew,
        rate = args.rate,
    );
    let started = Instant::now();
    session.execute_sql(&sql).await.map_err(|e| e.to_string())?;
    let job = session.take_jobs().pop().ok_or("no job started")?;
    let metrics = job.metrics.clone();
    let mut figures = BackfillFigures::default();
    let mut spreads = vec![];
    let mut sample = |f: &mut BackfillFigures| {
        let state: i64 = metrics
            .nodes
            .iter()
            .map(|n| n.state_bytes.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        f.peak_state_bytes = f.peak_state_bytes.max(state);
        let wms: Vec<i64> = metrics
            .sources
            .iter()
            .map(|s| s.snapshot())
            .filter(|(splits, _)| {
                splits
                    .iter()
                    .any(|x| x.state != weir_engine::runtime::metrics::SplitState::Finished)
            })
            .map(|(_, w)| w)
            .filter(|w| *w > i64::MIN && *w < i64::MAX)
            .collect();
        if let (Some(min), Some(max)) = (wms.iter().min(), wms.iter().max()) {
            f.peak_spread_ms = f.peak_spread_ms.max(max - min);
            spreads.push(max - min);
        }
        f.peak_rss_bytes = f.peak_rss_bytes.max(rss_bytes());
        if std::env::var_os("WEIR_BENCH_TRACE").is_some() {
            let rows = crate::watermarks::rows(&metrics, None, 0);
            let line: Vec<String> = rows
                .iter()
                .filter(|r| r.scope != "state")
                .map(|r| format!("{}:{}:{}", r.name, r.watermark, r.state))
                .collect();
            eprintln!("{}", line.join(" | "));
        }
    };
    let mut done = Box::pin(job.wait());
    loop {
        tokio::select! {
            r = &mut done => {
                r.map_err(|e| e.to_string())?;
                break;
            }
            // A sampling period, not synchronisation.
            _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => sample(&mut figures),
        }
    }
    spreads.sort_unstable();
    figures.median_spread_ms = spreads.get(spreads.len() / 2).copied().unwrap_or(0);
    figures.seconds = started.elapsed().as_secs_f64();
    Ok(figures)
}

pub async fn run_alignment(args: &AlignmentArgs) -> i32 {
    println!(
        "| run | events | splits | skew | seconds | peak state bytes | peak reader spread | median reader spread | peak RSS |\n|---|---|---|---|---|---|---|---|---|"
    );
    for aligned in [false, true] {
        match backfill(args, aligned).await {
            Ok(f) => println!(
                "| {} | {} | {} | {}x | {:.1} | {} | {:.1} s | {:.1} s | {} MiB |",
                if aligned {
                    format!(
                        "MAX DRIFT {} s, UPDATE {} ms, buffer {}",
                        args.drift, args.update_interval_ms, args.buffer_size
                    )
                } else {
                    "no alignment".into()
                },
                args.events,
                args.splits,
                args.skew,
                f.seconds,
                f.peak_state_bytes,
                f.peak_spread_ms as f64 / 1000.0,
                f.median_spread_ms as f64 / 1000.0,
                f.peak_rss_bytes >> 20
            ),
            Err(e) => {
                eprintln!("error: {e}");
                return 1;
            }
        }
    }
    0
}

#[derive(Args, Debug, Clone)]
pub struct SavepointArgs {
    /// RocksDB state to build before the savepoint, in MiB (on disk).
    #[arg(long, default_value_t = 1024)]
    pub state_mib: u64,
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
    /// Where the job's data dir goes (a temporary directory below it).
    #[arg(long, default_value = "/tmp")]
    pub dir: std::path::PathBuf,
}

/// Bytes of the files below `dir`, local checkpoint copies (`*.chk-N`,
/// hard links of the live files) left out.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().contains(".chk-"))
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// The table text of one statement's rows.
async fn rows_text(session: &mut Session, sql: &str) -> Result<String, String> {
    match session
        .execute_sql(sql)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
    {
        Some(crate::session::StatementResult::Rows(_, b)) => Ok(crate::display::table(&b)),
        _ => Err(format!("no rows from {sql}")),
    }
}

/// The value of column `col` (0-based, after the leading `|`) of the
/// first line of `text` containing `needle` (one job runs at a time here).
fn cell(text: &str, needle: &str, col: usize) -> Option<String> {
    let line = text.lines().find(|l| l.contains(needle))?;
    line.split('|').map(str::trim).nth(col + 1).map(str::to_string)
}

/// Starts the state-building job (or a restore of it) and returns when it runs.
async fn start_state_job(
    session: &mut Session,
    parallelism: usize,
    from: Option<&std::path::Path>,
    extra: &str,
) -> Result<f64, String> {
    let from = from
        .map(|p| format!("SET 'execution.state-recovery.path' = '{}';", p.display()))
        .unwrap_or_default();
    let sql = format!(
        "SET 'pipeline.name' = 'big'; SET 'parallelism.default' = '{parallelism}';
         SET 'execution.checkpointing.interval' = '20 s'; {extra} {from}
         INSERT INTO sink SELECT k, COUNT(*), MAX(s)
         FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(ts), INTERVAL '1' HOUR))
         GROUP BY k, window_start, window_end;"
    );
    let started = Instant::now();
    session.execute_sql(&sql).await.map_err(|e| e.to_string())?;
    if from.is_empty() {
        return Ok(0.0);
    }
    // Restored once every operator has opened its state.
    let deadline = Instant::now() + std::time::Duration::from_secs(900);
    loop {
        let jobs = rows_text(session, "DESCRIBE JOB 'big';").await?;
        if cell(&jobs, "restore_open_ms", 1).is_some() {
            return Ok(started.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            return Err(format!("the job did not start reading within 15 min:\n{jobs}"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `weir bench savepoint`: for the same ≥ 1 GiB of RocksDB state, the
/// savepoint's time and size beside a native incremental checkpoint's, and
/// restore times from the savepoint at the same, half and double
/// parallelism and from the native checkpoint at the same parallelism.
pub async fn run_savepoint(args: &SavepointArgs) -> i32 {
    match savepoint_figures(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

async fn savepoint_figures(args: &SavepointArgs) -> Result<(), String> {
    let tmp = tempfile::tempdir_in(&args.dir).map_err(|e| e.to_string())?;
    let data = tmp.path().join("data");
    let mut session = Session::open(&data).map_err(|e| e.to_string())?;
    session
        .execute_sql(
            "CREATE TABLE src (k BIGINT, s STRING,
               ts AS CAST(TIMESTAMP '2024-01-01 00:00:00' AS TIMESTAMP(3)), WATERMARK FOR ts AS ts)
             WITH ('connector' = 'datagen', 'fields.k.kind' = 'sequence', 'fields.k.start' = '1',
                   'fields.k.end' = '1000000000', 'fields.s.length' = '48', 'rows-per-second' = '100000000');
             CREATE TABLE sink (k BIGINT, n BIGINT, s STRING) WITH ('connector' = 'blackhole');",
        )
        .await
        .map_err(|e| e.to_string())?;
    let p = args.parallelism;
    let retain = "SET 'execution.checkpointing.externalized-checkpoint-retention' = 'RETAIN_ON_CANCELLATION';";
    start_state_job(&mut session, p, None, retain).await?;
    let state_dir = data.join("jobs").join("big").join("state");
    let target = args.state_mib << 20;
    let started = Instant::now();
    while dir_bytes(&state_dir) < target {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        if started.elapsed().as_secs() > 1800 {
            return Err("state did not reach the target in 30 min".into());
        }
    }
    let built = started.elapsed().as_secs_f64();
    // A periodic checkpoint of this state: wait for one to complete.
    let before = rows_text(&mut session, "SHOW CHECKPOINTS FOR JOB 'big';")
        .await?
        .matches("COMPLETED")
        .count();
    loop {
        let text = rows_text(&mut session, "SHOW CHECKPOINTS FOR JOB 'big';").await?;
        if text.matches("COMPLETED").count() > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let text = rows_text(&mut session, "SHOW CHECKPOINTS FOR JOB 'big';").await?;
    let last = text
        .lines()
        .rfind(|l| l.contains("COMPLETED"))
        .unwrap_or_default()
        .to_string();
    let cells: Vec<&str> = last.split('|').map(str::trim).collect();
    let (chk_ms, chk_full, chk_incr) = (cells[5].to_string(), cells[9].to_string(), cells[10].to_string());
    let t = Instant::now();
    let sp_text = rows_text(&mut session, "STOP JOB 'big' WITH SAVEPOINT;").await?;
    let sp_secs = t.elapsed().as_secs_f64();
    let sp = sp_text
        .lines()
        .map(|l| l.trim_matches(|c: char| c == '|' || c.is_whitespace()))
        .find(|l| l.contains("savepoint-"))
        .map(std::path::PathBuf::from)
        .ok_or_else(|| format!("no savepoint path in\n{sp_text}"))?;
    let sp_bytes = dir_bytes(&sp);
    println!(
        "state built in {built:.0} s ({} MiB of RocksDB files across {p} subtasks)\n",
        dir_bytes(&state_dir) >> 20
    );
    println!("| snapshot | time | size |\n|---|---:|---:|");
    println!("| incremental checkpoint (periodic) | {chk_ms} ms | {chk_full} bytes referenced, {chk_incr} uploaded |");
    println!(
        "| savepoint (STOP JOB ... WITH SAVEPOINT, canonical) | {:.0} ms | {sp_bytes} bytes |",
        sp_secs * 1000.0
    );
    // The retained native checkpoint: the newest that is not the final one.
    let root = data.join("checkpoints").join("big");
    let mut native = None;
    for retained in std::fs::read_dir(&root).map_err(|e| e.to_string())?.flatten() {
        for chk in std::fs::read_dir(retained.path()).into_iter().flatten().flatten() {
            let meta = std::fs::read_to_string(chk.path().join("_metadata")).unwrap_or_default();
            if meta.contains("\"is_final\": false") {
                let id: u64 = chk
                    .file_name()
                    .to_string_lossy()
                    .trim_start_matches("chk-")
                    .parse()
                    .unwrap_or(0);
                if native.as_ref().is_none_or(|(n, _)| id > *n) {
                    native = Some((id, chk.path()));
                }
            }
        }
    }
    println!("\n| restore | parallelism | seconds until every operator opened its state |\n|---|---:|---:|");
    let mut restores: Vec<(String, usize, std::path::PathBuf)> = vec![];
    if let Some((_, chk)) = native {
        for q in [p, (p / 2).max(1), p * 2] {
            restores.push(("native RocksDB checkpoint".into(), q, chk.clone()));
        }
    }
    for q in [p, (p / 2).max(1), p * 2] {
        restores.push(("savepoint".into(), q, sp.clone()));
    }
    for (what, q, from) in restores {
        let secs = start_state_job(&mut session, q, Some(&from), "").await?;
        println!("| {what} | {q} | {secs:.2} |");
        session
            .execute_sql("CANCEL JOB 'big';")
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct KafkaArgs {
    /// A Kafka cluster to use (`host:port`); benches/kafka.sh starts tansu.
    #[arg(long)]
    pub bootstrap: String,
    /// Bids written into the topic and read back.
    #[arg(long, default_value_t = 2_000_000)]
    pub rows: u64,
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Only the reads, of this already filled topic (to profile them).
    #[arg(long)]
    pub read_topic: Option<String>,
}

/// Creates `topic` with `partitions` partitions (it must not exist).
fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<(), String> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for r in futures::executor::block_on(admin.create_topics([&t], &AdminOptions::new())).map_err(|e| e.to_string())? {
        r.map_err(|(t, e)| format!("create topic {t}: {e}"))?;
    }
    Ok(())
}

/// The physical limit: librdkafka's consumer alone reading every record
/// of `topic` on one thread.
fn raw_read(bootstrap: &str, topic: &str, partitions: i32, rows: u64) -> Result<(), String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "weir-bench-raw")
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| e.to_string())?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut n = 0u64;
    while n < rows {
        if started.elapsed() > std::time::Duration::from_secs(600) {
            return Err(format!("read {n} of {rows} records in 600 s"));
        }
        if let Some(m) = consumer.poll(std::time::Duration::from_millis(100)) {
            m.map_err(|e| e.to_string())?;
            n += 1;
        }
    }
    Ok(())
}

/// CPU seconds (user + system) a process has used so far, from
/// `/proc/<pid>/stat`; None where there is no procfs.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(ticks / 100.0)
}

/// A run's wall time and the CPU time Weir and the broker spent in it.
struct Timed {
    wall: f64,
    weir_cpu: Option<f64>,
    broker_cpu: Option<f64>,
}

impl Timed {
    /// `| seconds | rows/s | Weir CPU s | rows per Weir CPU s | broker CPU s |`
    fn cells(&self, rows: f64) -> String {
        let f = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.1}"));
        let per_core = self.weir_cpu.map_or("?".to_string(), |c| format!("{:.0}", rows / c));
        format!(
            "{:.1} | {:.0} | {} | {per_core} | {}",
            self.wall,
            rows / self.wall,
            f(self.weir_cpu),
            f(self.broker_cpu)
        )
    }
}

/// Measures `run` (wall and CPU time; the broker's pid from
/// `WEIR_BENCH_BROKER_PID`, which benches/kafka.sh sets).
async fn measured<F: std::future::Future<Output = Result<(), String>>>(run: F) -> Result<Timed, String> {
    let broker = std::env::var("WEIR_BENCH_BROKER_PID").ok();
    let broker_cpu = || broker.as_deref().and_then(cpu_seconds);
    let (weir0, broker0) = (cpu_seconds("self"), broker_cpu());
    let started = Instant::now();
    run.await?;
    let wall = started.elapsed().as_secs_f64();
    let diff = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
    Ok(Timed {
        wall,
        weir_cpu: diff(weir0, cpu_seconds("self")),
        broker_cpu: diff(broker0, broker_cpu()),
    })
}

/// Runs `sql` (DDL and one INSERT, dml-sync), measured.
async fn timed(sql: &str) -> Result<Timed, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut session = Session::open(dir.path()).map_err(|e| e.to_string())?;
    measured(async { session.execute_sql(sql).await.map(|_| ()).map_err(|e| e.to_string()) }).await
}

pub async fn run_kafka(args: &KafkaArgs) -> i32 {
    match kafka_figures(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

async fn kafka_figures(args: &KafkaArgs) -> Result<(), String> {
    let tag = chrono::Utc::now().timestamp_millis();
    let alo = args
        .read_topic
        .clone()
        .unwrap_or_else(|| format!("weir-bench-{tag}-alo"));
    let eos = format!("weir-bench-{tag}-eos");
    if args.read_topic.is_none() {
        create_topic(&args.bootstrap, &alo, args.partitions)?;
        create_topic(&args.bootstrap, &eos, args.partitions)?;
    }
    // 46 of every 50 Nexmark events are bids.
    let events = args.rows * 50 / 46 + 50;
    let write = |topic: &str, guarantee: &str| {
        format!(
            "SET 'parallelism.default' = '1';
             SET 'table.dml-sync' = 'true';
             SET 'execution.checkpointing.interval' = '1 s';
             CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3))
               WITH ('connector' = 'nexmark', 'nexmark.events' = '{events}');
             CREATE TABLE topic (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3))
               WITH ('connector' = 'kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = '{}',
                     'format' = 'json', 'sink.delivery-guarantee' = '{guarantee}',
                     'sink.transactional-id-prefix' = '{topic}', 'sink.partitioner' = 'round-robin');
             INSERT INTO topic SELECT * FROM bid;",
            args.bootstrap
        )
    };
    let read = |parallelism: usize, query: &str| {
        format!(
            "SET 'parallelism.default' = '{parallelism}';
             SET 'table.dml-sync' = 'true';
             CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3),
               WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND)
               WITH ('connector' = 'kafka', 'topic' = '{alo}', 'properties.bootstrap.servers' = '{}',
                     'format' = 'json', 'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset');
             {query}",
            args.bootstrap
        )
    };
    let rows = args.rows as f64;
    eprintln!("topic {alo}");
    println!(
        "| run | rows | seconds | rows/s | Weir CPU s | rows per Weir CPU s | broker CPU s |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    let row = |name: &str, t: &Timed| println!("| {name} | {} | {} |", args.rows, t.cells(rows));
    if args.read_topic.is_none() {
        row(
            "sink at-least-once (Nexmark bids → JSON)",
            &timed(&write(&alo, "at-least-once")).await?,
        );
        row(
            "sink exactly-once (checkpoint 1 s)",
            &timed(&write(&eos, "exactly-once")).await?,
        );
    }
    let bootstrap = args.bootstrap.clone();
    let (partitions, n) = (args.partitions, args.rows);
    let topic = alo.clone();
    let raw = measured(async move {
        tokio::task::spawn_blocking(move || raw_read(&bootstrap, &topic, partitions, n))
            .await
            .map_err(|e| e.to_string())?
    })
    .await?;
    row("librdkafka consumer alone (the limit)", &raw);
    let share = |t: &Timed| {
        let per_cpu = |t: &Timed| t.weir_cpu.map(|c| rows / c);
        let cpu = match (per_cpu(t), per_cpu(&raw)) {
            (Some(a), Some(b)) => format!(", {:.0} % per CPU second", 100.0 * a / b),
            _ => String::new(),
        };
        eprintln!("  {:.0} % of the consumer alone's rate{cpu}", 100.0 * raw.wall / t.wall);
    };
    let q0 = "CREATE TABLE sink (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3)) WITH ('connector' = 'blackhole');
              INSERT INTO sink SELECT * FROM bid;";
    let t = timed(&read(1, q0)).await?;
    row("q0 from Kafka (JSON → blackhole)", &t);
    share(&t);
    // Two subtasks, two partitions each: how the decode spreads over
    // the cores (the consumer alone is one thread).
    let t = timed(&read(2, q0)).await?;
    row("q0 from Kafka (JSON → blackhole), parallelism 2", &t);
    share(&t);
    // The same records as one STRING each (`raw`): the read without the
    // JSON decode, to tell the decode's cost from the rest of the path.
    let t = timed(&format!(
        "SET 'parallelism.default' = '1';
         SET 'table.dml-sync' = 'true';
         CREATE TABLE lines (line STRING)
           WITH ('connector' = 'kafka', 'topic' = '{alo}', 'properties.bootstrap.servers' = '{}',
                 'format' = 'raw', 'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset');
         CREATE TABLE sink (line STRING) WITH ('connector' = 'blackhole');
         INSERT INTO sink SELECT * FROM lines;",
        args.bootstrap
    ))
    .await?;
    row("q0 from Kafka, raw format (no decode)", &t);
    share(&t);
    let t = timed(&read(
        1,
        "CREATE TABLE sink (auction BIGINT, n BIGINT, window_end TIMESTAMP(3)) WITH ('connector' = 'blackhole');
         INSERT INTO sink SELECT auction, COUNT(*), window_end
         FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
         GROUP BY auction, window_start, window_end;",
    ))
    .await?;
    row("q5-style HOP count from Kafka", &t);
    share(&t);
    Ok(())
}
