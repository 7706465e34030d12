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
