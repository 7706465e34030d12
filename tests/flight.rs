//! `weir serve` (in this process where a test needs no process of its
//! own; a real process where it signals, kills or measures it), driven by arrow-flight's
//! `FlightSqlServiceClient`: DDL, a detached INSERT job that outlives its
//! client, bounded and continuous queries (the continuous one cancelled by
//! dropping the stream), errors with positions, and the metadata calls.

mod common;

use common::{Ports, announced_ports, channel, eventually, strings};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use arrow_flight::FlightInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTables, SqlInfo};
use futures::TryStreamExt;
use tonic::transport::Channel;

struct Server {
    /// `weir serve` as a process; `None`: served in this process.
    child: Option<Child>,
    _in_process: Option<InProcess>,
    port: u16,
    /// With `--metrics-listen 127.0.0.1:0`: the metrics port.
    metrics: Option<u16>,
    data: std::path::PathBuf,
    out: std::path::PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Server {
    fn child(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .expect("a test that signals the server starts it as a process")
    }
}

/// `weir::server::serve` on a thread of this process with its own runtime,
/// from the same flags `weir serve` takes; stopped (its jobs suspended)
/// when dropped, as SIGTERM stops the process.
struct InProcess {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    ended: std::sync::mpsc::Receiver<Result<(), String>>,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Its jobs suspend at a checkpoint before the temp dir goes.
        match self.ended.recv_timeout(Duration::from_secs(60)) {
            Ok(Err(e)) if !std::thread::panicking() => panic!("the server ended with an error: {e}"),
            _ => {}
        }
    }
}

fn serve_in_process(data: &std::path::Path, args: &[String]) -> (InProcess, u16) {
    use clap::Parser;
    std::fs::create_dir_all(data).expect("data dir");
    let beside = data.parent().unwrap_or(data);
    let mut argv: Vec<String> = ["weir", "--data-dir"].map(String::from).to_vec();
    argv.push(data.display().to_string());
    argv.extend(["--allow-dir".into(), beside.display().to_string()]);
    argv.extend(["serve", "--listen", "127.0.0.1:0"].map(String::from));
    argv.extend(args.iter().cloned());
    let parsed = weir::cli::Args::try_parse_from(&argv).expect("weir serve flags");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let (end_tx, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_stack_size(weir::cli::THREAD_STACK_BYTES)
            .enable_all()
            .build()
            .expect("runtime");
        let result = rt.block_on(async move {
            let (options, session) = weir::cli::server_parts(&parsed)?;
            let listener = tokio::net::TcpListener::bind(options.listen)
                .await
                .map_err(|e| e.to_string())?;
            let _ = port_tx.send(listener.local_addr().map_err(|e| e.to_string())?.port());
            weir::server::serve(listener, options, session, async move {
                let _ = stop_rx.await;
            })
            .await
        });
        let _ = end_tx.send(result);
    });
    let port = match port_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(port) => port,
        Err(_) => panic!("the in-process server did not listen: {:?}", ended.try_recv()),
    };
    let server = InProcess {
        stop: Some(stop_tx),
        ended,
    };
    (server, port)
}

/// `weir serve` over `data` with extra flags and env, on a port the
/// system picks, once it listens.
fn spawn(data: &std::path::Path, args: &[String], env: &[(&str, &str)]) -> (Child, u16) {
    let (child, ports) = spawn_ports(data, args, env);
    (child, ports.flight)
}

fn spawn_ports(data: &std::path::Path, args: &[String], env: &[(&str, &str)]) -> (Child, Ports) {
    // Every test's files live beside the data dir, in its temp dir.
    std::fs::create_dir_all(data).expect("data dir");
    let beside = data.parent().unwrap_or(data);
    let child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--data-dir")
        .arg(data)
        .arg("--allow-dir")
        .arg(beside)
        .arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .args(args)
        .envs(env.iter().copied())
        .env_remove(if env.iter().any(|(k, _)| *k == "WEIR_PASSWORD") {
            "WEIR_UNUSED"
        } else {
            "WEIR_PASSWORD"
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir serve");
    let mut child = child;
    let ports = announced_ports(&mut child);
    (child, ports)
}

/// A server as a process (for the tests that signal it or read its
/// metrics port).
async fn start_process_with(args: &[String]) -> (Server, FlightSqlServiceClient<Channel>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (child, ports) = spawn_ports(&data, args, &[]);
    let out = dir.path().join("out");
    let port = ports.flight;
    let server = Server {
        child: Some(child),
        _in_process: None,
        port,
        metrics: ports.metrics,
        data,
        out,
        _dir: Some(dir),
    };
    let client = FlightSqlServiceClient::new(channel(port).await);
    (server, client)
}

/// A server in this process (the tests that need no process of its own).
async fn start_with(args: &[String]) -> (Server, FlightSqlServiceClient<Channel>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (in_process, port) = serve_in_process(&data, args);
    let out = dir.path().join("out");
    let server = Server {
        child: None,
        _in_process: Some(in_process),
        port,
        metrics: None,
        data,
        out,
        _dir: Some(dir),
    };
    let client = FlightSqlServiceClient::new(channel(port).await);
    (server, client)
}

async fn start() -> (Server, FlightSqlServiceClient<Channel>) {
    start_with(&[]).await
}

/// The nexmark bid table and a CSV sink under `out`, at parallelism 1.
async fn create_tables(client: &mut FlightSqlServiceClient<Channel>, out: &std::path::Path) {
    for sql in [
        "CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), \
         WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) \
         WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events-per-second' = '20000')"
            .to_string(),
        format!(
            "CREATE TABLE counts (auction BIGINT, n BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv')",
            out.display()
        ),
        "SET 'parallelism.default' = '1'".to_string(),
    ] {
        client.execute_update(sql.clone(), None).await.expect(&sql);
    }
}

const COUNT_JOB: &str = "INSERT INTO counts SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), \
     INTERVAL '1' SECOND)) GROUP BY auction, window_start, window_end";

/// `GET path` on the metrics port: (status line, body).
async fn http_get(port: u16, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut text = String::new();
    conn.read_to_string(&mut text).await.expect("read");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

/// The value of an unlabelled metric line `name value`.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
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

/// Reads `stream` to its error: the rows before it and the error (a
/// stream that ends without one fails the test).
async fn rows_then_error(
    stream: &mut arrow_flight::decode::FlightRecordBatchStream,
) -> (usize, arrow_flight::error::FlightError) {
    let mut rows = 0;
    loop {
        match stream.try_next().await {
            Ok(Some(b)) => rows += b.num_rows(),
            Ok(None) => panic!("the stream ended without an error"),
            Err(e) => return (rows, e),
        }
    }
}

async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Vec<RecordBatch> {
    let info = client.execute(sql.to_string(), None).await.expect(sql);
    fetch(client, info).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_statements_jobs_and_metadata() {
    let (server, mut client) = start().await;

    // DDL over both paths clients use: a query ticket and an update.
    let none = query(
        &mut client,
        "CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), \
         WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) \
         WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events-per-second' = '20000')",
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
    let id = &strings(&job, "job_id")[0];
    assert!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    assert_eq!(strings(&jobs, "job_id"), vec![id.clone()]);

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

    // Foreign keys: empty too (browsing tools ask for them).
    for info in [
        client
            .get_exported_keys(arrow_flight::sql::CommandGetExportedKeys {
                catalog: None,
                db_schema: None,
                table: "bid".into(),
            })
            .await
            .expect("exported keys"),
        client
            .get_imported_keys(arrow_flight::sql::CommandGetImportedKeys {
                catalog: None,
                db_schema: None,
                table: "bid".into(),
            })
            .await
            .expect("imported keys"),
    ] {
        assert_eq!(
            fetch(&mut client, info)
                .await
                .iter()
                .map(|b| b.num_rows())
                .sum::<usize>(),
            0
        );
    }

    // Not supported: UNIMPLEMENTED, never INTERNAL.
    let err = client.begin_transaction().await.expect_err("no transactions");
    assert!(err.to_string().contains("not implemented"), "{err}");

    // The job outlives its client: a new connection, the job still writes.
    drop(client);
    // Any file, committed or in progress.
    eventually("the detached job to write", 60, || async {
        std::fs::read_dir(&server.out)
            .is_ok_and(|mut es| es.next().is_some())
            .then_some(())
    })
    .await;
}

fn status_of(e: &impl std::fmt::Display) -> String {
    e.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_are_planned_at_prepare_and_take_parameters() {
    use arrow::array::{Int64Array, StringArray};
    let (server, mut client) = start().await;
    create_tables(&mut client, &server.out).await;

    // Prepare answers the result's schema; nothing runs.
    let mut stmt = client
        .prepare("SELECT ? + 1 AS x, ? AS label".into(), None)
        .await
        .expect("prepare");
    let schema = stmt.dataset_schema().expect("dataset schema").clone();
    assert_eq!(
        schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>(),
        vec!["x", "label"]
    );
    assert_eq!(stmt.parameter_schema().expect("parameter schema").fields().len(), 2);
    // Executing before binding: a clear error, not a NULL result.
    let err = stmt.execute().await.expect_err("unbound parameters");
    assert!(status_of(&err).contains("none are bound"), "{err}");
    let params = |x: i64, label: &str| {
        RecordBatch::try_from_iter(vec![
            ("a", Arc::new(Int64Array::from(vec![x])) as arrow::array::ArrayRef),
            ("b", Arc::new(StringArray::from(vec![label])) as arrow::array::ArrayRef),
        ])
        .expect("params")
    };
    for (x, label) in [(41, "it's"), (1, "two")] {
        stmt.set_parameters(params(x, label)).expect("bind");
        let info = stmt.execute().await.expect("execute");
        let rows = fetch(&mut client, info).await;
        assert_eq!(strings(&rows, "x"), vec![(x + 1).to_string()]);
        assert_eq!(strings(&rows, "label"), vec![label.to_string()]);
    }
    stmt.close().await.expect("close");

    // A prepared INSERT starts nothing until it is executed.
    let mut insert = client
        .prepare(format!("{COUNT_JOB} HAVING COUNT(*) > ?"), None)
        .await
        .expect("prepare insert");
    let jobs = query(&mut client, "SHOW JOBS").await;
    assert_eq!(
        jobs.iter().map(|b| b.num_rows()).sum::<usize>(),
        0,
        "prepare ran something"
    );
    insert
        .set_parameters(
            RecordBatch::try_from_iter(vec![(
                "n",
                Arc::new(Int64Array::from(vec![0])) as arrow::array::ArrayRef,
            )])
            .expect("params"),
        )
        .expect("bind");
    insert.execute_update().await.expect("prepared update");
    let jobs = query(&mut client, "SHOW JOBS").await;
    assert_eq!(strings(&jobs, "state"), vec!["RUNNING"]);
    insert.close().await.expect("close");

    // Parameter types the planner can tell from their context.
    let typed = client
        .prepare("SELECT auction FROM bid WHERE price > ? AND auction = ?".into(), None)
        .await
        .expect("prepare");
    let types: Vec<_> = typed
        .parameter_schema()
        .expect("parameter schema")
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    assert_eq!(types, vec![arrow::datatypes::DataType::Int64; 2]);
    typed.close().await.expect("close");

    // Errors come from prepare, with the position.
    let err = client
        .prepare("SELECT nope FROM bid WHERE price > ?".into(), None)
        .await
        .expect_err("unknown column");
    assert!(
        status_of(&err).contains("nope") && status_of(&err).contains("1:"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_changelogs_and_a_slow_subscriber_is_dropped() {
    let (server, mut client) = start_process_with(&[
        "--subscriber-queue".into(),
        "1".into(),
        "--subscriber-timeout".into(),
        "0.5".into(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
    ])
    .await;
    let metrics_port = server.metrics.expect("metrics port");
    create_tables(&mut client, &server.out).await;

    // A subscription: `_op` first, then the query's columns.
    let info = client
        .execute("SUBSCRIBE TO (SELECT auction, price FROM bid)".into(), None)
        .await
        .expect("subscribe");
    let schema = info.clone().try_decode_schema().expect("schema");
    assert_eq!(
        schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>(),
        vec!["_op", "auction", "price"]
    );
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut stream = client.do_get(ticket).await.expect("do_get");
    let mut rows = 0;
    while rows < 10 {
        let b = stream.try_next().await.expect("a batch").expect("not ended");
        assert!(strings(std::slice::from_ref(&b), "_op").iter().all(|op| op == "+I"));
        rows += b.num_rows();
    }
    drop(stream);

    // A subscriber that reads nothing: once its queue has been full for
    // the timeout it is dropped (the job does not wait longer), and it
    // learns why.
    let info = client
        .execute("SUBSCRIBE TO bid".into(), None)
        .await
        .expect("subscribe to a table");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut stream = client.do_get(ticket).await.expect("do_get");
    eventually("the slow subscriber to be dropped", 60, || async {
        let (_, body) = http_get(metrics_port, "/metrics").await;
        (metric(&body, "weir_subscribers") == Some(0.0)).then_some(())
    })
    .await;
    let (_, err) = rows_then_error(&mut stream).await;
    let text = err.to_string();
    assert!(text.contains("slow subscriber"), "{text}");
    assert!(
        text.contains("RESOURCE_EXHAUSTED") || text.contains("resource"),
        "{text}"
    );

    // The metrics endpoint: Prometheus text with the jobs' series.
    query(&mut client, COUNT_JOB).await;
    let (status, body) = http_get(metrics_port, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("weir_build_info{version=\""), "{body}");
    assert!(body.contains("# TYPE weir_operator_records_in_total counter"), "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("weir_job_running{job=\"insert-into-counts") && l.ends_with("state=\"RUNNING\"} 1")),
        "{body}"
    );
    // Splits are published by the readers as they run.
    eventually("split states in the metrics", 30, || async {
        let (_, body) = http_get(metrics_port, "/metrics").await;
        body.lines()
            .any(|l| l.starts_with("weir_source_splits{job=\"insert-into-counts"))
            .then_some(())
    })
    .await;
    for family in [
        "weir_operator_backpressured_seconds_total",
        "weir_operator_state_bytes",
        "weir_checkpoints_total",
        "weir_sink_last_commit_seconds",
        "weir_sink_last_commit_version",
        "weir_subscriber_queue_depth_max",
        "weir_flight_open_streams",
    ] {
        assert!(body.contains(&format!("# TYPE {family} ")), "{family} missing:\n{body}");
    }
    let (status, _) = http_get(metrics_port, "/nope").await;
    assert!(status.contains("404"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_control_describe_stop_cancel() {
    let (server, mut client) = start().await;
    create_tables(&mut client, &server.out).await;
    client
        .execute_update("SET 'pipeline.name' = 'counts-job'".into(), None)
        .await
        .expect("set");
    let job = query(&mut client, COUNT_JOB).await;
    let id = strings(&job, "job_id")[0].clone();

    // The same job twice at once would share its state: refused.
    let err = client.execute(COUNT_JOB.into(), None).await;
    let err = match err {
        Ok(info) => {
            let ticket = info.endpoint[0].ticket.clone().expect("ticket");
            match client.do_get(ticket).await {
                Ok(s) => s.try_collect::<Vec<_>>().await.map(|_| ()).expect_err("second start"),
                Err(e) => e,
            }
        }
        Err(e) => e,
    };
    assert!(err.to_string().contains("already running"), "{err}");

    // A stateful query on the same connection (pipeline.name is set) runs
    // as a job of its own: the INSERT's state is untouched, and the query
    // leaves no directory behind.
    let windows = query(
        &mut client,
        "SELECT auction, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND)) \
         GROUP BY auction, window_start, window_end LIMIT 3",
    )
    .await;
    assert_eq!(windows.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    let jobs_dir = server.data.join("jobs");
    eventually("the query's job directory to go", 30, || {
        let left: Vec<String> = std::fs::read_dir(&jobs_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("select-"))
            .collect();
        async move { left.is_empty().then_some(()) }
    })
    .await;
    assert!(jobs_dir.join("counts-job").exists());
    let jobs = query(&mut client, "SHOW JOBS").await;
    assert_eq!(strings(&jobs, "state"), vec!["RUNNING"], "the INSERT runs on");

    // SET belongs to the connection: another client does not see it.
    let mut other = FlightSqlServiceClient::new(channel(server.port).await);
    let theirs = query(&mut other, "SET").await;
    assert!(
        !strings(&theirs, "key").contains(&"pipeline.name".to_string()),
        "{theirs:?}"
    );
    let mine = query(&mut client, "SET").await;
    assert!(strings(&mine, "key").contains(&"pipeline.name".to_string()), "{mine:?}");
    // But the jobs are the server's: the other client sees and describes it.
    let describe = query(&mut other, &format!("DESCRIBE JOB '{id}'")).await;
    let props = strings(&describe, "property");
    let values = strings(&describe, "value");
    let get = |k: &str| props.iter().position(|p| p == k).map(|i| values[i].clone());
    assert_eq!(get("state").as_deref(), Some("RUNNING"));
    assert_eq!(get("job_name").as_deref(), Some("counts-job"));
    assert!(get("statement").is_some_and(|s| s.starts_with("INSERT INTO counts")));
    assert!(get("uptime_s").is_some());

    // STOP JOB answers with the state the job ended in.
    let stopped = query(&mut client, "STOP JOB 'counts-job'").await;
    assert_eq!(strings(&stopped, "job_id"), vec![id.clone()]);
    assert_eq!(strings(&stopped, "state"), vec!["STOPPED"]);
    assert!(
        strings(&stopped, "message")[0].starts_with("job 'counts-job' stopped"),
        "{stopped:?}"
    );
    let jobs = query(&mut client, "SHOW JOBS").await;
    assert_eq!(strings(&jobs, "state"), vec!["STOPPED"]);
    let err = client.execute(format!("STOP JOB '{id}'"), None).await.map(|_| ()).err();
    // Planning a STOP runs nothing; the error comes when it runs.
    if err.is_none() {
        let info = client.execute(format!("STOP JOB '{id}'"), None).await.expect("info");
        let ticket = info.endpoint[0].ticket.clone().expect("ticket");
        let e = client.do_get(ticket).await.map(|_| ()).expect_err("already stopped");
        assert!(e.to_string().contains("nothing to stop"), "{e}");
    }

    // Cancel: at once, no final checkpoint.
    query(&mut client, COUNT_JOB).await;
    query(&mut client, "CANCEL JOB 'counts-job'").await;
    let jobs = query(&mut client, "SHOW JOBS").await;
    assert_eq!(strings(&jobs, "state"), vec!["STOPPED", "CANCELED"]);
    // Job control runs when submitted: the error comes with GetFlightInfo.
    let e = client
        .execute("CANCEL JOB 'nope'".into(), None)
        .await
        .expect_err("unknown job");
    assert!(e.to_string().contains("no job 'nope'"), "{e}");
}

/// The columns of `batches` (or an announced schema) by name.
fn names(schema: &arrow::datatypes::Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_updating_query_answers_its_final_table() {
    use std::collections::BTreeMap;
    let (server, mut client) = start().await;
    create_tables(&mut client, &server.out).await;
    client
        .execute_update(
            "CREATE TABLE few (auction BIGINT, price BIGINT) WITH ('connector' = 'nexmark', \
             'nexmark.table' = 'bid', 'nexmark.events' = '3000')"
                .into(),
            None,
        )
        .await
        .expect("create");
    // The oracle: the bids themselves (an insert-only query), summed here.
    let bids = query(&mut client, "SELECT auction % 4 AS g, price FROM few").await;
    let mut expected: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for (g, p) in strings(&bids, "g").into_iter().zip(strings(&bids, "price")) {
        let e = expected.entry(g).or_default();
        e.0 += 1;
        e.1 += p.parse::<i64>().expect("price");
    }
    assert_eq!(expected.len(), 4, "{expected:?}");
    let grouped = "SELECT auction % 4 AS g, COUNT(*) AS n, SUM(price) AS s FROM few GROUP BY auction % 4";
    let table_of = |batches: &[RecordBatch]| -> BTreeMap<String, (u64, i64)> {
        let (g, n, s) = (strings(batches, "g"), strings(batches, "n"), strings(batches, "s"));
        assert_eq!(g.len(), expected.len(), "one row per group: {g:?}");
        g.into_iter()
            .zip(n.into_iter().zip(s))
            .map(|(g, (n, s))| (g, (n.parse().expect("n"), s.parse().expect("s"))))
            .collect()
    };

    // Prepared: the columns announced before anything runs are the table's.
    let stmt = client.prepare(grouped.into(), None).await.expect("prepare");
    assert_eq!(names(stmt.dataset_schema().expect("schema")), ["g", "n", "s"]);
    // Run: the same columns, one row per group, the changes added up.
    let info = client.execute(grouped.into(), None).await.expect("execute");
    assert_eq!(
        names(&info.clone().try_decode_schema().expect("schema")),
        ["g", "n", "s"]
    );
    let rows = fetch(&mut client, info).await;
    assert_eq!(table_of(&rows), expected);

    // A Top-N over it (updating too): its final rows.
    let top = query(
        &mut client,
        &format!("SELECT g, n, s FROM (SELECT g, n, s, ROW_NUMBER() OVER (ORDER BY s DESC) AS rk FROM ({grouped})) WHERE rk <= 2"),
    )
    .await;
    let mut sums: Vec<i64> = expected.values().map(|(_, s)| *s).collect();
    sums.sort_unstable_by(|a, b| b.cmp(a));
    let mut got: Vec<i64> = strings(&top, "s").iter().map(|s| s.parse().expect("s")).collect();
    got.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(got, sums[..2]);

    // The changelog when asked for (Flink's result mode), and from
    // SUBSCRIBE: `_op` first; applied, the same table.
    for (set, sql) in [
        (Some("changelog"), grouped.to_string()),
        (Some("tableau"), grouped.to_string()),
        (None, format!("SUBSCRIBE TO ({grouped})")),
    ] {
        let mode = set.unwrap_or("table");
        client
            .execute_update(format!("SET 'sql-client.execution.result-mode' = '{mode}'"), None)
            .await
            .expect("set");
        let rows = query(&mut client, &sql).await;
        let schema = rows.first().map(|b| b.schema()).expect("rows");
        assert_eq!(names(&schema), ["_op", "g", "n", "s"], "{sql} in {mode}");
        let ops = strings(&rows, "_op");
        assert!(ops.iter().any(|o| o == "-U"), "{ops:?}");
        let mut live: BTreeMap<(String, String, String), i64> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            let key = (
                strings(&rows, "g")[i].clone(),
                strings(&rows, "n")[i].clone(),
                strings(&rows, "s")[i].clone(),
            );
            *live.entry(key).or_default() += if op.starts_with('+') { 1 } else { -1 };
        }
        let applied: BTreeMap<String, (u64, i64)> = live
            .into_iter()
            .filter(|(_, c)| *c > 0)
            .map(|((g, n, s), _)| (g, (n.parse().expect("n"), s.parse().expect("s"))))
            .collect();
        assert_eq!(applied, expected, "{sql} in {mode}");
    }
    client
        .execute_update("RESET 'sql-client.execution.result-mode'".into(), None)
        .await
        .expect("reset");

    // An unbounded updating query has no final table: its changes, `_op`
    // first (announced at prepare; nothing runs).
    let stmt = client
        .prepare(
            "SELECT auction % 4 AS g, COUNT(*) AS n FROM bid GROUP BY auction % 4".into(),
            None,
        )
        .await
        .expect("prepare");
    assert_eq!(names(stmt.dataset_schema().expect("schema")), ["_op", "g", "n"]);

    // A bounded updating query that fails: the client hears the failure
    // and gets no partial table.
    let bad = server.out.with_extension("bad.csv");
    // Many batches of good rows first: their changes reach the server
    // before the failure, so a partial table would exist to send.
    let mut text: String = (0..50_000).map(|i| format!("{i},g{}\n", i % 7)).collect();
    text.push_str("not-a-number,c\n");
    std::fs::write(&bad, text).expect("write");
    client
        .execute_update(
            format!(
                "CREATE TABLE bad (k BIGINT, v STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv')",
                bad.display()
            ),
            None,
        )
        .await
        .expect("create");
    let info = client
        .execute("SELECT v, COUNT(*) AS n FROM bad GROUP BY v".into(), None)
        .await
        .expect("execute");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut stream = client.do_get(ticket).await.expect("do_get");
    let (rows, err) = rows_then_error(&mut stream).await;
    assert_eq!(rows, 0, "no partial table");
    assert!(err.to_string().contains("not-a-number"), "{err}");
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Waits for the process to exit (after a signal), with a deadline.
async fn exited(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    eventually("the server to exit", secs, || {
        let status = child.try_wait().expect("try_wait");
        async move { status }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_survive_a_server_kill_and_a_graceful_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let out = dir.path().join("out");
    let (mut child, port) = spawn(&data, &[], &[]);
    let mut client = FlightSqlServiceClient::new(channel(port).await);
    create_tables(&mut client, &out).await;
    client
        .execute_update("SET 'execution.checkpointing.interval' = '300 ms'".into(), None)
        .await
        .expect("set");
    let id = strings(&query(&mut client, COUNT_JOB).await, "job_id")[0].clone();
    let checkpoint = |client: &mut FlightSqlServiceClient<Channel>| {
        let mut client = client.clone();
        async move {
            let jobs = query(&mut client, "SHOW JOBS").await;
            let last = strings(&jobs, "last_checkpoint");
            let state = strings(&jobs, "state");
            (state == ["RUNNING"] && !last[0].is_empty()).then(|| last[0].parse::<u64>().expect("id"))
        }
    };
    eventually("a completed checkpoint", 60, || checkpoint(&mut client)).await;

    // kill -9: the next server resubmits the job, which resumes from its
    // latest checkpoint, under the same id.
    child.kill().expect("kill");
    child.wait().expect("wait");
    let (mut child, port) = spawn(&data, &[], &[]);
    let mut client = FlightSqlServiceClient::new(channel(port).await);
    let jobs = query(&mut client, "SHOW JOBS").await;
    assert_eq!(strings(&jobs, "job_id"), vec![id.clone()]);
    assert_eq!(strings(&jobs, "state"), vec!["RUNNING"]);
    let describe = query(&mut client, &format!("DESCRIBE JOB '{id}'")).await;
    let props = strings(&describe, "property");
    assert!(props.contains(&"restored_from".to_string()), "{props:?}");
    let resumed_at = eventually("a checkpoint after the restart", 60, || checkpoint(&mut client)).await;

    // SIGTERM: the job is suspended with a final checkpoint and resumed by
    // the next server from there.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    assert!(exited(&mut child, 60).await.success());
    let (child, port) = spawn(&data, &[], &[]);
    let _server = Server {
        child: Some(child),
        _in_process: None,
        port,
        metrics: None,
        data: data.clone(),
        out,
        _dir: Some(dir),
    };
    let mut client = FlightSqlServiceClient::new(channel(port).await);
    let describe = query(&mut client, &format!("DESCRIBE JOB '{id}'")).await;
    let (props, values) = (strings(&describe, "property"), strings(&describe, "value"));
    let restored = props
        .iter()
        .position(|p| p == "restored_from")
        .map(|i| values[i].clone())
        .expect("restored after a graceful restart");
    let restored_id: u64 = restored
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("checkpoint id");
    assert!(
        restored_id > resumed_at,
        "resumed from the final checkpoint: {restored}"
    );

    // A stopped job is not resubmitted, but a later server still lists it
    // (as Flink's JobManager keeps finished jobs): its state, rows and
    // last checkpoint as they were when it stopped.
    let registry = std::fs::read_to_string(data.join("server/jobs.json")).expect("registry");
    assert!(registry.contains("INSERT INTO counts"), "{registry}");
    let stopped = query(&mut client, &format!("STOP JOB '{id}'")).await;
    assert_eq!(strings(&stopped, "state"), vec!["STOPPED"]);
    let before = query(&mut client, "SHOW JOBS").await;
    // Recorded by the time STOP JOB answered (a server stopped right
    // after must not start the job again).
    let text = std::fs::read_to_string(data.join("server/jobs.json")).unwrap_or_default();
    assert!(text.contains("\"ended\"") && text.contains("\"STOPPED\""), "{text}");
    let pid = _server.child.as_ref().map(|c| c.id().to_string()).expect("pid");
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let mut server = _server;
    assert!(exited(server.child(), 60).await.success());
    let (child, port) = spawn(&data, &[], &[]);
    server.child = Some(child);
    server.port = port;
    let mut client = FlightSqlServiceClient::new(channel(port).await);
    let after = query(&mut client, "SHOW JOBS").await;
    assert_eq!(strings(&after, "job_id"), vec![id.clone()]);
    assert_eq!(strings(&after, "state"), vec!["STOPPED"]);
    for column in ["rows_in", "rows_out", "last_checkpoint"] {
        assert_eq!(strings(&after, column), strings(&before, column), "{column}");
    }
    // The stop's final checkpoint is what a restore of it would read.
    assert!(!strings(&after, "last_checkpoint")[0].is_empty(), "{after:?}");
    let describe = query(&mut client, &format!("DESCRIBE JOB '{id}'")).await;
    let props = strings(&describe, "property");
    assert!(props.contains(&"ended".to_string()), "{props:?}");
    // Nothing runs: the job's output stays as the stop left it.
    let err = client
        .execute(format!("STOP JOB '{id}'"), None)
        .await
        .expect_err("already stopped");
    assert!(err.to_string().contains("nothing to stop"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_clients_are_all_answered_and_nothing_leaks() {
    let (mut server, mut client) = start_process_with(&["--metrics-listen".into(), "127.0.0.1:0".into()]).await;
    let metrics_port = server.metrics.expect("metrics port");
    query(&mut client, "SELECT 1").await;
    drop(client);
    let pid = server.child().id();
    let fds_before = fd_count(pid);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let port = server.port;
        tasks.spawn(async move {
            // Each client its own connection.
            let mut client = FlightSqlServiceClient::new(channel(port).await);
            let rows = query(&mut client, &format!("SELECT {i} AS i, 'client' AS who")).await;
            assert_eq!(strings(&rows, "i"), vec![i.to_string()]);
        });
    }
    let mut answered = 0;
    while let Some(r) = tasks.join_next().await {
        r.expect("client task");
        answered += 1;
    }
    assert_eq!(answered, 200);
    // Every stream and connection is released once the clients are gone.
    eventually("streams and connections to be released", 30, || async {
        let (_, body) = http_get(metrics_port, "/metrics").await;
        let streams = metric(&body, "weir_flight_open_streams");
        let connections = metric(&body, "weir_flight_connections");
        (streams == Some(0.0) && connections == Some(0.0) && fd_count(pid) <= fds_before + 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_requests_get_a_status_not_a_crash() {
    use arrow_flight::sql::{ProstMessageExt, TicketStatementQuery};
    use prost::Message;
    let (_server, mut client) = start_with(&["--max-request-bytes".into(), "65536".into()]).await;

    // A ticket that is not a Flight SQL message.
    let err = client
        .do_get(arrow_flight::Ticket::new(vec![0xff, 0x01, 0x02]))
        .await
        .map(|_| ())
        .expect_err("garbage ticket");
    assert!(!err.to_string().to_lowercase().contains("internal"), "{err}");
    // A statement ticket whose SQL is not UTF-8.
    let ticket = TicketStatementQuery {
        statement_handle: vec![0xff, 0xfe].into(),
    };
    let err = client
        .do_get(arrow_flight::Ticket::new(ticket.as_any().encode_to_vec()))
        .await
        .map(|_| ())
        .expect_err("not UTF-8");
    assert!(err.to_string().contains("UTF-8"), "{err}");
    // Two statements where one is expected.
    let err = client
        .execute("SELECT 1; SELECT 2".into(), None)
        .await
        .expect_err("two statements");
    assert!(err.to_string().contains("one statement"), "{err}");
    // A request over the size limit.
    let big = format!("SELECT '{}'", "x".repeat(200_000));
    let err = client.execute(big, None).await.expect_err("too large");
    assert!(!err.to_string().to_lowercase().contains("internal"), "{err}");
    // Unknown actions: UNIMPLEMENTED; CloseSession: accepted.
    let mut inner = client.inner().clone();
    let err = inner
        .do_action(arrow_flight::Action::new("Nope", vec![]))
        .await
        .map(|_| ())
        .expect_err("unknown action");
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err}");
    let closed = inner
        .do_action(arrow_flight::Action::new("CloseSession", vec![]))
        .await
        .expect("CloseSession");
    let results: Vec<_> = closed.into_inner().try_collect().await.expect("results");
    assert_eq!(results.len(), 1);
    // A handle that was never prepared.
    let cmd = arrow_flight::sql::CommandPreparedStatementQuery {
        prepared_statement_handle: b"nope".to_vec().into(),
    };
    let err = inner
        .get_flight_info(arrow_flight::FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec()))
        .await
        .expect_err("unknown handle");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    // Commands that are not Flight SQL messages, by every door.
    let err = inner
        .get_flight_info(arrow_flight::FlightDescriptor::new_cmd(vec![0x0a, 0xff, 0x03]))
        .await
        .expect_err("garbage command");
    assert_ne!(err.code(), tonic::Code::Internal, "{err}");
    let put = arrow_flight::FlightData {
        flight_descriptor: Some(arrow_flight::FlightDescriptor::new_cmd(b"nonsense".to_vec())),
        ..Default::default()
    };
    let err = put_error(&mut inner, put).await;
    assert_ne!(err.code(), tonic::Code::Internal, "{err}");
    // Parameters that are not an Arrow stream.
    let cmd = arrow_flight::sql::CommandPreparedStatementQuery {
        prepared_statement_handle: b"nope".to_vec().into(),
    };
    let put = arrow_flight::FlightData {
        flight_descriptor: Some(arrow_flight::FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec())),
        data_header: vec![1, 2, 3, 4].into(),
        data_body: vec![5, 6].into(),
        ..Default::default()
    };
    let err = put_error(&mut inner, put).await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    // A statement naming what does not exist.
    let err = client
        .execute("SELECT * FROM nowhere".into(), None)
        .await
        .expect_err("no table");
    assert!(err.to_string().contains("nowhere"), "{err}");
    assert!(err.to_string().contains("not found"), "NOT_FOUND: {err}");
    // Still serving.
    assert_eq!(strings(&query(&mut client, "SELECT 7 AS x").await, "x"), vec!["7"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_and_tls_protect_the_server() {
    use base64::Engine;
    use tonic::transport::{Certificate, ClientTlsConfig};
    let dir = tempfile::tempdir().expect("tempdir");
    // A CA, and a server certificate for localhost signed by it.
    let (ca, cert, key) = (
        dir.path().join("ca.pem"),
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
    );
    std::fs::write(
        dir.path().join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("ext");
    for args in [
        "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=weir-test-ca -keyout ca.key -out ca.pem",
        "req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout key.pem -out server.csr",
        "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -out cert.pem -extfile ext.cnf",
    ] {
        let made = Command::new("openssl")
            .args(args.split(' '))
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl (installed by scripts/setup.sh)");
        assert!(made.success(), "openssl {args} failed");
    }
    let args = [
        "--tls-cert".to_string(),
        cert.display().to_string(),
        "--tls-key".to_string(),
        key.display().to_string(),
    ];
    let (child, port) = spawn(&dir.path().join("data"), &args, &[("WEIR_PASSWORD", "s3cret")]);
    let _server = Server {
        child: Some(child),
        _in_process: None,
        port,
        metrics: None,
        data: dir.path().join("data"),
        out: dir.path().join("out"),
        _dir: None,
    };
    let pem = std::fs::read(&ca).expect("ca");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem))
        .domain_name("localhost");
    let deadline = Instant::now() + Duration::from_secs(60);
    let channel = loop {
        let endpoint = Channel::from_shared(format!("https://127.0.0.1:{port}"))
            .expect("uri")
            .tls_config(tls.clone())
            .expect("tls");
        match endpoint.connect().await {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no TLS listener: {e:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    // No credentials, then wrong ones: UNAUTHENTICATED.
    let mut client = FlightSqlServiceClient::new(channel.clone());
    let err = client.execute("SELECT 1".into(), None).await.expect_err("no password");
    assert!(err.to_string().contains("password"), "{err}");
    let err = client.handshake("weir", "wrong").await.expect_err("wrong password");
    assert!(err.to_string().contains("invalid user or password"), "{err}");
    // Basic in the handshake, then the Bearer token on every call.
    client.handshake("weir", "s3cret").await.expect("handshake");
    assert!(client.token().is_some());
    assert_eq!(strings(&query(&mut client, "SELECT 1 AS x").await, "x"), vec!["1"]);
    // The Go ADBC driver's unpadded Basic credentials are accepted.
    let mut unpadded = FlightSqlServiceClient::new(channel);
    let basic = base64::engine::general_purpose::STANDARD_NO_PAD.encode("weir:s3cret");
    unpadded.set_header("authorization", format!("Basic {basic}"));
    assert_eq!(strings(&query(&mut unpadded, "SELECT 2 AS x").await, "x"), vec!["2"]);
    // Plaintext against the TLS port fails.
    let plain = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .connect()
        .await;
    if let Ok(plain) = plain {
        let mut c = FlightSqlServiceClient::new(plain);
        c.handshake("weir", "s3cret")
            .await
            .expect_err("plaintext to a TLS server");
    }
}

/// Committed output lines of a file sink directory, sorted.
fn committed_lines(dir: &std::path::Path) -> Vec<String> {
    let mut lines = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).expect("part file");
        lines.extend(text.lines().map(str::to_string));
    }
    lines.sort();
    lines
}

/// A bounded job run by a server that is stopped gracefully and killed
/// mid-run writes exactly what an undisturbed run writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_across_server_restarts_writes_exactly_once() {
    let setup = |out: &std::path::Path| {
        vec![
            "SET 'parallelism.default' = '2'".to_string(),
            "SET 'execution.checkpointing.interval' = '200 ms'".to_string(),
            "CREATE TABLE bid (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), \
             WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) \
             WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '150000', \
             'nexmark.events-per-second' = '30000')"
                .to_string(),
            format!(
                "CREATE TABLE counts (auction BIGINT, n BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv')",
                out.display()
            ),
        ]
    };
    let finished = |port: u16| async move {
        let mut client = FlightSqlServiceClient::new(channel(port).await);
        let jobs = query(&mut client, "SHOW JOBS").await;
        (strings(&jobs, "state") == ["FINISHED"]).then_some(())
    };
    // The reference: one undisturbed run.
    let dir = tempfile::tempdir().expect("tempdir");
    let reference_out = dir.path().join("reference");
    let (child, port) = spawn(&dir.path().join("reference-data"), &[], &[]);
    let _reference = Server {
        child: Some(child),
        _in_process: None,
        port,
        metrics: None,
        data: dir.path().join("reference-data"),
        out: reference_out.clone(),
        _dir: None,
    };
    let mut client = FlightSqlServiceClient::new(channel(port).await);
    for sql in setup(&reference_out) {
        client.execute_update(sql.clone(), None).await.expect(&sql);
    }
    query(&mut client, COUNT_JOB).await;
    eventually("the reference run to finish", 120, || finished(port)).await;
    let reference = committed_lines(&reference_out);
    assert!(reference.len() > 100, "{} rows", reference.len());

    // The same job, its server stopped with SIGTERM, then killed with -9,
    // each time after a checkpoint.
    let data = dir.path().join("data");
    let out = dir.path().join("out");
    let (mut child, mut port) = spawn(&data, &[], &[]);
    let mut client = FlightSqlServiceClient::new(channel(port).await);
    for sql in setup(&out) {
        client.execute_update(sql.clone(), None).await.expect(&sql);
    }
    query(&mut client, COUNT_JOB).await;
    let checkpointed = |port: u16| async move {
        let mut client = FlightSqlServiceClient::new(channel(port).await);
        let jobs = query(&mut client, "SHOW JOBS").await;
        let running = strings(&jobs, "state") == ["RUNNING"];
        let checkpoint = strings(&jobs, "last_checkpoint").first().is_some_and(|c| !c.is_empty());
        (running && checkpoint).then_some(())
    };
    for signal in ["-TERM", "-KILL"] {
        eventually("a checkpoint", 60, || checkpointed(port)).await;
        let pid = child.id().to_string();
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()
                .expect("kill")
                .success()
        );
        exited(&mut child, 60).await;
        (child, port) = spawn(&data, &[], &[]);
    }
    let _server = Server {
        child: Some(child),
        _in_process: None,
        port,
        metrics: None,
        data,
        out: out.clone(),
        _dir: Some(dir),
    };
    let done = |port: u16| async move {
        let mut client = FlightSqlServiceClient::new(channel(port).await);
        let states = strings(&query(&mut client, "SHOW JOBS").await, "state");
        (states == ["FINISHED"]).then_some(())
    };
    eventually("the restarted job to finish", 120, || done(port)).await;
    let mut client = FlightSqlServiceClient::new(channel(port).await);
    let describe = query(&mut client, "DESCRIBE JOB 'insert-into-counts'").await;
    assert!(
        strings(&describe, "property").contains(&"restored_from".to_string()),
        "the last run resumed from a checkpoint"
    );
    let got = committed_lines(&out);
    assert_eq!(got.len(), reference.len(), "rows lost or duplicated");
    assert!(got == reference, "the output differs from an undisturbed run");
}

/// A live query that fails while running ends its stream with the error
/// (not a silent end of rows); SQL Weir cannot run is UNIMPLEMENTED; a
/// shutdown ends open subscriptions and the server exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_failures_unsupported_sql_and_shutdown_with_open_subscribers() {
    let (mut server, mut client) = start_process_with(&[]).await;
    let bad = server.data.with_file_name("bad.json");
    std::fs::write(&bad, "{\"id\": 1}\n{\"id\": 2}\nnot json\n").expect("write");
    client
        .execute_update(
            format!(
                "CREATE TABLE bad (id BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json')",
                bad.display()
            ),
            None,
        )
        .await
        .expect("create");
    let info = client.execute("SELECT id FROM bad".into(), None).await.expect("plan");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let stream = client.do_get(ticket).await.expect("do_get");
    let err = stream.try_collect::<Vec<_>>().await.expect_err("the query fails");
    assert!(err.to_string().contains("bad.json:3"), "{err}");

    let err = client
        .execute(
            "CREATE OR REPLACE TABLE t (x INT) WITH ('connector' = 'print')".into(),
            None,
        )
        .await
        .expect_err("unsupported");
    assert!(err.to_string().contains("not implemented or not supported"), "{err}");

    create_tables(&mut client, &server.out).await;
    let info = client
        .execute("SUBSCRIBE TO (SELECT auction FROM bid)".into(), None)
        .await
        .expect("subscribe");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut stream = client.do_get(ticket).await.expect("do_get");
    stream.try_next().await.expect("a batch").expect("rows");
    let pid = server.child().id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    // The subscriber is told, and the server does not wait for it.
    let (_, err) = rows_then_error(&mut stream).await;
    assert!(err.to_string().contains("shutting down"), "{err}");
    assert!(exited(server.child(), 60).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused_until_one_closes() {
    let (server, mut first) = start_with(&["--max-connections".into(), "2".into()]).await;
    query(&mut first, "SELECT 1").await;
    let mut second = FlightSqlServiceClient::new(channel(server.port).await);
    query(&mut second, "SELECT 2").await;
    // A third connection is closed at once: its call fails (or, as the
    // client may keep retrying a closed connection, does not succeed).
    let port = server.port;
    assert!(attempt(port, "SELECT 3").await.is_none(), "over the cap");
    // One closes: a new client gets in.
    drop(first);
    eventually("a free connection slot", 30, || attempt(port, "SELECT 4")).await;
    query(&mut second, "SELECT 5").await;

    // A connection that never says anything does not keep a slot: it is
    // closed after 10 s and the slot is free again.
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
        .await
        .expect("connect");
    eventually("the silent connection to be closed", 30, || attempt(port, "SELECT 6")).await;
    use tokio::io::AsyncReadExt;
    // (The server's HTTP/2 settings arrive first, then the end.)
    let mut all = vec![];
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut all)).await;
    assert!(closed.is_ok(), "the server closed the silent connection");
}

/// A new connection running `sql`: its answer, or None if it failed or did
/// not answer within 5 s.
async fn attempt(port: u16, sql: &str) -> Option<FlightInfo> {
    let run = async {
        let c = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect()
            .await
            .ok()?;
        FlightSqlServiceClient::new(c).execute(sql.to_string(), None).await.ok()
    };
    tokio::time::timeout(Duration::from_secs(5), run).await.ok().flatten()
}

/// The status a DoPut of `message` fails with (at the call or in its
/// results).
async fn put_error(
    inner: &mut arrow_flight::flight_service_client::FlightServiceClient<Channel>,
    message: arrow_flight::FlightData,
) -> tonic::Status {
    match inner.do_put(futures::stream::iter([message])).await {
        Ok(r) => r
            .into_inner()
            .try_collect::<Vec<_>>()
            .await
            .map(|_| ())
            .expect_err("the put fails"),
        Err(e) => e,
    }
}
