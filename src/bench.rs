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
    /// Comma-separated: q0,q1,q2,q5,q7.
    #[arg(long, default_value = "q0,q1,q2,q5,q7")]
    pub queries: String,
    #[arg(long, default_value_t = 1)]
    pub parallelism: usize,
    /// rocksdb or hashmap.
    #[arg(long, default_value = "rocksdb")]
    pub state_backend: String,
}

const BID_COLUMNS: &str =
    "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime TIMESTAMP(3), extra STRING";

/// (name, sink columns, query).
pub fn query(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
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
        _ => return None,
    })
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
         CREATE TABLE sink ({sink_cols}) WITH ('connector' = 'blackhole');\n\
         INSERT INTO sink {q};\n"
    ))
}

pub async fn run_nexmark(args: &NexmarkArgs) -> i32 {
    println!(
        "| query | events | parallelism | state | seconds | events/s | events/s per core |\n|---|---|---|---|---|---|---|"
    );
    for name in args.queries.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some(sql) = script(name, args.events, args.parallelism, &args.state_backend) else {
            eprintln!("error: unknown query '{name}'; known: q0, q1, q2, q5, q7");
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
