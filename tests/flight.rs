//! `weir serve` as a real process, driven by arrow-flight's
//! `FlightSqlServiceClient`: DDL, a detached INSERT job that outlives its
//! client, bounded and continuous queries (the continuous one cancelled by
//! dropping the stream), errors with positions, and the metadata calls.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::record_batch::RecordBatch;
use arrow_flight::FlightInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTables, SqlInfo};
use futures::TryStreamExt;
use tonic::transport::Channel;

struct Server {
    child: Child,
    _dir: tempfile::TempDir,
    out: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

async fn start() -> (Server, FlightSqlServiceClient<Channel>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("serve")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn weir serve");
    let out = dir.path().join("out");
    let server = Server { child, _dir: dir, out };
    // Connect as soon as it listens (retrying until a deadline).
    let deadline = Instant::now() + Duration::from_secs(60);
    let channel = loop {
        match Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "weir serve did not listen: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    (server, FlightSqlServiceClient::new(channel))
}

async fn fetch(client: &mut FlightSqlServiceClient<Channel>, info: FlightInfo) -> Vec<RecordBatch> {
    let mut batches = vec![];
    for ep in info.endpoint {
        let ticket = ep.ticket.expect("ticket");
        let stream = client.do_get(ticket).await.expect("do_get");
        batches.extend(stream.try_collect::<Vec<_>>().await.expect("batches"));
    }
    batches
}

async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Vec<RecordBatch> {
    let info = client.execute(sql.to_string(), None).await.expect(sql);
    fetch(client, info).await
}

fn strings(batches: &[RecordBatch], column: &str) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name(column).expect("column");
            let c = arrow::compute::cast(c, &arrow::datatypes::DataType::Utf8).expect("cast");
            let s = c.as_string::<i32>();
            (0..s.len()).map(|i| s.value(i).to_string()).collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_statements_jobs_and_metadata() {
    let (server, mut client) = start().await;

    // DDL over both paths clients use: a query ticket and an update.
    let none = query(
        &mut client,
        "CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), \
         WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) \
         WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid')",
    )
    .await;
    assert!(none.iter().all(|b| b.num_rows() == 0));
    let sink = format!(
        "CREATE TABLE counts (auction BIGINT, n BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv')",
        server.out.display()
    );
    client.execute_update(sink, None).await.expect("update");
    client
        .execute_update("SET 'parallelism.default' = '1'".into(), None)
        .await
        .expect("set");

    // The schema comes with GetFlightInfo, before anything runs.
    let info = client
        .execute("SELECT auction, price FROM bid LIMIT 5".into(), None)
        .await
        .expect("info");
    let schema = info.clone().try_decode_schema().expect("schema");
    assert_eq!(schema.fields().len(), 2, "{schema:?}");
    let rows = fetch(&mut client, info).await;
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 5);

    // A continuous query: read a little, then drop the stream (cancel).
    let info = client
        .execute("SELECT auction FROM bid".into(), None)
        .await
        .expect("info");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut stream = client.do_get(ticket).await.expect("do_get");
    let first = stream.try_next().await.expect("a batch").expect("not ended");
    assert!(first.num_rows() > 0);
    drop(stream);

    // INSERT: one row for the detached job, at once.
    let job = query(
        &mut client,
        "INSERT INTO counts SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND)) \
         GROUP BY auction, window_start, window_end",
    )
    .await;
    assert_eq!(strings(&job, "state"), vec!["RUNNING"]);
    // Job control as SQL: the schema is announced before the rows.
    let info = client.execute("SHOW JOBS".into(), None).await.expect("show jobs");
    assert!(
        info.clone()
            .try_decode_schema()
            .expect("schema")
            .field_with_name("state")
            .is_ok()
    );
    let jobs = fetch(&mut client, info).await;
    assert!(strings(&jobs, "state").contains(&"RUNNING".to_string()), "{jobs:?}");
    assert_eq!(strings(&job, "job_name"), strings(&job, "job_id"));

    // Bad SQL: INVALID_ARGUMENT with the position, not INTERNAL.
    let err = client
        .execute("SELECT nope FROM bid".into(), None)
        .await
        .expect_err("unknown column");
    let text = err.to_string();
    assert!(text.contains("nope") && text.contains("1:"), "{text}");
    assert!(!text.to_lowercase().contains("internal"), "{text}");

    // Metadata.
    let tables = client
        .get_tables(CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: None,
            table_name_filter_pattern: None,
            table_types: vec![],
            include_schema: true,
        })
        .await
        .expect("tables");
    let tables = fetch(&mut client, tables).await;
    let mut names = strings(&tables, "table_name");
    names.sort();
    assert_eq!(names, vec!["bid", "counts"]);
    assert_eq!(strings(&tables, "catalog_name")[0], "weir");
    let catalogs = client.get_catalogs().await.expect("catalogs");
    assert_eq!(
        strings(&fetch(&mut client, catalogs).await, "catalog_name"),
        vec!["weir"]
    );
    let schemas = client
        .get_db_schemas(CommandGetDbSchemas {
            catalog: None,
            db_schema_filter_pattern: None,
        })
        .await
        .expect("schemas");
    assert_eq!(
        strings(&fetch(&mut client, schemas).await, "db_schema_name"),
        vec!["default"]
    );
    let types = client.get_table_types().await.expect("types");
    assert_eq!(
        strings(&fetch(&mut client, types).await, "table_type"),
        vec!["TABLE", "VIEW"]
    );
    let info = client
        .get_sql_info(vec![SqlInfo::FlightSqlServerName, SqlInfo::FlightSqlServerReadOnly])
        .await
        .expect("sql info");
    let info = fetch(&mut client, info).await;
    assert_eq!(info.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    let keys = client
        .get_primary_keys(CommandGetPrimaryKeys {
            catalog: None,
            db_schema: None,
            table: "bid".into(),
        })
        .await
        .expect("primary keys: empty, not an error");
    assert_eq!(
        fetch(&mut client, keys)
            .await
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        0
    );

    // Not supported yet: UNIMPLEMENTED, never INTERNAL.
    let Err(err) = client.prepare("SELECT 1".into(), None).await else {
        panic!("prepared statements are not supported yet")
    };
    assert!(err.to_string().contains("not implemented"), "{err}");

    // The job outlives its client: a new connection, the job still writes.
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let committed = std::fs::read_dir(&server.out)
            .map(|es| es.flatten().any(|e| !e.file_name().to_string_lossy().starts_with('.')))
            .unwrap_or(false);
        let in_progress = std::fs::read_dir(&server.out)
            .map(|es| es.flatten().count() > 0)
            .unwrap_or(false);
        if committed || in_progress {
            break;
        }
        assert!(Instant::now() < deadline, "the detached job wrote nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
