//! `weir serve` safe by default, with a real Flight SQL client: paths
//! outside the allowed directories refused (traversal, symlinks, relative,
//! `file://`, case), users and roles, job ownership, masked secrets, and
//! statements of different connections running concurrently.

mod common;

use common::strings;

use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use tonic::transport::Channel;

async fn client(port: u16) -> FlightSqlServiceClient<Channel> {
    FlightSqlServiceClient::new(common::channel(port).await)
}

async fn login(port: u16, user: &str, password: &str) -> FlightSqlServiceClient<Channel> {
    let mut c = client(port).await;
    c.handshake(user, password).await.expect("handshake");
    c
}

/// Runs `sql` (submitted and read): its rows, or the error status. By
/// the raw Flight service, so the status code is the server's own.
async fn run(c: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<RecordBatch>, tonic::Status> {
    use arrow_flight::sql::{CommandStatementQuery, ProstMessageExt};
    use prost::Message;
    let token = c.token().cloned();
    fn with_token<T>(token: &Option<String>, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(t) = token {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().expect("header"));
        }
        r
    }
    let mut inner = c.inner().clone();
    let cmd = CommandStatementQuery {
        query: sql.to_string(),
        transaction_id: None,
    };
    let descriptor = arrow_flight::FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec());
    let info = inner
        .get_flight_info(with_token(&token, descriptor))
        .await?
        .into_inner();
    let mut out = vec![];
    for ep in info.endpoint {
        let ticket = ep.ticket.expect("ticket");
        let stream = inner.do_get(with_token(&token, ticket)).await?.into_inner();
        let batches = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            stream.map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s))),
        );
        out.extend(batches.try_collect::<Vec<_>>().await.map_err(|e| match e {
            arrow_flight::error::FlightError::Tonic(s) => *s,
            other => tonic::Status::unknown(other.to_string()),
        })?);
    }
    Ok(out)
}

/// The refusal of `sql`: PERMISSION_DENIED naming `key`.
async fn refused(c: &mut FlightSqlServiceClient<Channel>, sql: &str, key: &str) {
    let e = run(c, sql).await.expect_err(sql);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{sql}: {e}");
    assert!(e.message().contains(&format!("'{key}'")), "{sql}: names '{key}': {e}");
}

fn csv_table(name: &str, path: &str) -> String {
    format!("CREATE TABLE {name} (line STRING) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_outside_the_allowed_directories_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical");
    let data = root.join("data");
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("secret.csv"), "top secret\n").expect("secret");
    // A table an unrestricted local shell made earlier in the server's
    // catalog file, pointing outside: the server refuses to run it.
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--data-dir")
        .arg(&data)
        .arg("--catalog")
        .arg(data.join("catalog.json"))
        .arg("-c")
        .arg(format!("{};", csv_table("legacy", "/etc/passwd")))
        .output()
        .expect("weir -c");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    std::fs::create_dir_all(data.join("in")).expect("in");
    std::fs::write(data.join("in/rows.csv"), "a\nb\n").expect("rows");
    std::os::unix::fs::symlink(&outside, data.join("link")).expect("symlink");
    std::os::unix::fs::symlink(outside.join("not-yet"), data.join("dangling")).expect("symlink");

    // Default: only the data dir.
    let (_server, port) = common::serve_with(&data, &[]);
    let mut c = client(port).await;
    let d = data.display().to_string();
    let evil = root.join("evil");
    for (sql, key) in [
        (csv_table("passwd", "/etc/passwd"), "path"),
        (csv_table("passwd", "FILE:///etc/passwd"), "path"),
        (csv_table("up", &format!("{d}/../outside/secret.csv")), "path"),
        (
            csv_table("up", &format!("file://{d}/in/../../outside/secret.csv")),
            "path",
        ),
        (
            csv_table("up", &format!("{d}/missing/../../outside/secret.csv")),
            "path",
        ),
        (csv_table("sym", &format!("{d}/link/secret.csv")), "path"),
        (csv_table("rel", "outside/secret.csv"), "path"),
        (csv_table("case", &d.to_uppercase()), "path"),
        (csv_table("evil", &evil.display().to_string()), "path"),
        // A symlink to a missing target would be created outside.
        (csv_table("dang", &format!("{d}/dangling/x")), "path"),
        // A Delta table's place, by either of its names.
        (
            format!(
                "CREATE TABLE lake (a BIGINT) WITH ('connector' = 'delta', 'path' = '{}')",
                evil.display()
            ),
            "path",
        ),
        (
            format!("CREATE TABLE lake (a BIGINT) WITH ('connector' = 'delta', 'table-path' = '{d}/link/lake')"),
            "table-path",
        ),
        // Weir's own state, or a directory holding it.
        (csv_table("cat", &format!("{d}/catalog.json")), "path"),
        (csv_table("whole", &d), "path"),
        (csv_table("state", &format!("{d}/jobs")), "path"),
        (
            format!("SET 'execution.checkpointing.dir' = '{d}'"),
            "execution.checkpointing.dir",
        ),
        (
            "SET 'execution.checkpointing.dir' = '/tmp/weir-evil-checkpoints'".to_string(),
            "execution.checkpointing.dir",
        ),
        (
            format!("SET 'execution.state-recovery.path' = '{}'", outside.display()),
            "execution.state-recovery.path",
        ),
        ("SET 'allowed-directories' = '/etc'".to_string(), "allowed-directories"),
    ] {
        refused(&mut c, &sql, key).await;
    }
    // Nothing was created or written.
    let tables = strings(&run(&mut c, "SHOW TABLES").await.expect("show"), "table name");
    assert_eq!(tables, vec!["legacy"], "only the shell's table exists");
    assert!(!evil.exists(), "nothing written outside");
    assert!(
        !outside.join("not-yet").exists(),
        "nothing created through the dangling symlink"
    );
    // The shell's table: refused when a query would read it.
    let e = run(&mut c, "SELECT * FROM legacy").await.expect_err("legacy table");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert!(!e.message().contains("root:"), "nothing read: {e}");

    // Inside the data dir the same statements work.
    // Any case of `file://`, and spaces, read the same path as checked.
    run(&mut c, &csv_table("mine", &format!(" File://{d}/in")))
        .await
        .expect("inside");
    let got = run(&mut c, "SELECT line FROM mine").await.expect("read inside");
    let mut lines = strings(&got, "line");
    lines.sort();
    assert_eq!(lines, vec!["a", "b"]);
    run(
        &mut c,
        &format!(
            "CREATE TABLE out (line STRING) WITH ('connector' = 'filesystem', 'path' = '{d}/out', 'format' = 'csv')"
        ),
    )
    .await
    .expect("sink inside");
    run(&mut c, "SET 'table.dml-sync' = 'true'").await.expect("sync");
    run(&mut c, "INSERT INTO out SELECT line FROM mine")
        .await
        .expect("insert inside");
    assert!(
        std::fs::read_dir(data.join("out")).expect("out").count() > 0,
        "the sink wrote inside the data dir"
    );
    run(&mut c, &format!("SET 'execution.checkpointing.dir' = '{d}/ckpt'"))
        .await
        .expect("checkpoint dir inside");
    // A session may narrow its directories, never widen them again.
    run(&mut c, &format!("SET 'allowed-directories' = '{d}/in'"))
        .await
        .expect("narrow");
    refused(&mut c, &csv_table("o2", &format!("{d}/out")), "path").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_ownership_and_masked_secrets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let users = dir.path().join("users");
    std::fs::write(
        &users,
        "# user:role:password\nalice:admin:a-pw\nbob:user:b-pw\ncarol:user:c-pw\nrita:read:r-pw\n",
    )
    .expect("users");
    let log = dir.path().join("server.log");
    let _server = common::Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .arg("--data-dir")
            .arg(&data)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .arg("--password-file")
            .arg(&users)
            .env_remove("WEIR_PASSWORD")
            .env("WEIR_LOG", "debug")
            .stdout(std::fs::File::create(dir.path().join("server.out")).expect("out"))
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn"),
    );
    let port = common::port_in_log(&log);
    let mut alice = login(port, "alice", "a-pw").await;
    let mut bob = login(port, "bob", "b-pw").await;
    let mut carol = login(port, "carol", "c-pw").await;
    let mut rita = login(port, "rita", "r-pw").await;
    let source = "CREATE TABLE bid (auction BIGINT, price BIGINT) WITH ('connector' = 'nexmark', \
                  'nexmark.table' = 'bid', 'nexmark.events-per-second' = '1000')";
    run(&mut alice, source).await.expect("admin creates");
    run(
        &mut bob,
        "CREATE TABLE sink (auction BIGINT) WITH ('connector' = 'blackhole')",
    )
    .await
    .expect("user creates");

    // A read user queries, and nothing else.
    let got = run(&mut rita, "SELECT 1 AS one").await.expect("read queries");
    assert_eq!(strings(&got, "one"), vec!["1"]);
    run(&mut rita, "SHOW JOBS").await.expect("read lists jobs");
    run(&mut rita, "SHOW TABLES").await.expect("read lists tables");
    run(&mut rita, "SHOW CREATE TABLE sink").await.expect("read shows DDL");
    // How her results are shown is hers to set (the remote shell sets it
    // on connecting): nothing else changes.
    run(&mut rita, "SET 'sql-client.execution.result-mode' = 'changelog'")
        .await
        .expect("read sets the result mode");
    run(&mut rita, "RESET 'sql-client.execution.result-mode'")
        .await
        .expect("read resets the result mode");
    for sql in [
        "CREATE TABLE t2 (x BIGINT) WITH ('connector' = 'blackhole')",
        "DROP TABLE sink",
        "INSERT INTO sink SELECT auction FROM bid",
        "SET 'parallelism.default' = '1'",
        "STOP JOB 'bobs'",
        "CANCEL JOB 'bobs'",
    ] {
        let e = run(&mut rita, sql).await.expect_err(sql);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{sql}: {e}");
        assert!(e.message().contains("role 'read'"), "{sql}: {e}");
    }

    // Bob owns his job: Carol may neither stop nor cancel it; Alice may.
    run(&mut bob, "SET 'pipeline.name' = 'bobs'").await.expect("set");
    run(&mut bob, "INSERT INTO sink SELECT auction FROM bid")
        .await
        .expect("bob's job");
    for sql in ["STOP JOB 'bobs'", "CANCEL JOB 'bobs'"] {
        let e = run(&mut carol, sql).await.expect_err(sql);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{sql}: {e}");
        assert!(e.message().contains("belongs to user 'bob'"), "{e}");
    }
    let described = run(&mut alice, "DESCRIBE JOB 'bobs'").await.expect("describe");
    let props = strings(&described, "property");
    let values = strings(&described, "value");
    let owner = props.iter().position(|p| p == "owner").expect("owner row");
    assert_eq!(values[owner], "bob");
    run(&mut alice, "STOP JOB 'bobs'").await.expect("admin stops bob's job");
    // Bob's job name (its state) is his: Carol cannot start a job under it.
    for name in ["bobs"] {
        run(&mut carol, &format!("SET 'pipeline.name' = '{name}'"))
            .await
            .expect("set");
        let e = run(&mut carol, "INSERT INTO sink SELECT auction FROM bid")
            .await
            .expect_err("another user's job name");
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
        assert!(e.message().contains("belongs to user 'bob'"), "{e}");
    }
    // Bob controls his own next job.
    run(&mut bob, "SET 'pipeline.name' = 'bobs_2'").await.expect("set");
    run(&mut bob, "INSERT INTO sink SELECT auction FROM bid")
        .await
        .expect("bob's job");
    // A name spelt differently that shares the job's directory is the same job.
    run(&mut bob, "SET 'pipeline.name' = 'bobs.2'").await.expect("set");
    let e = run(&mut bob, "INSERT INTO sink SELECT auction FROM bid")
        .await
        .expect_err("same directory");
    assert!(e.message().contains("already running"), "{e}");
    run(&mut bob, "CANCEL JOB 'bobs_2'").await.expect("owner cancels");

    // A secret option's value never comes back, nor reaches the log.
    let secret = "hunter2-do-not-show";
    let e = run(
        &mut alice,
        &format!(
            "CREATE TABLE s (x BIGINT) WITH ('connector' = 'blackhole', 'password' = '{secret}', \
             'properties.sasl.jaas.config' = '{secret}')"
        ),
    )
    .await
    .expect_err("unknown options");
    assert!(!e.message().contains(secret), "{e}");
    for sql in ["SHOW JOBS", "DESCRIBE JOB 'bobs'", "SET"] {
        let got = run(&mut alice, sql).await.expect(sql);
        let text = arrow::util::pretty::pretty_format_batches(&got)
            .expect("text")
            .to_string();
        assert!(!text.contains(secret), "{sql}: {text}");
    }
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!logged.contains(secret), "the server log shows a secret");
    assert!(
        !logged.contains("a-pw") && !logged.contains("b-pw"),
        "the server log shows a password"
    );
}

/// A statement holding its connection's session for seconds (an INSERT
/// with `table.dml-sync` over a paced source) while 20 other connections
/// run SHOW JOBS and short queries, each with a deadline far below that:
/// under one session lock they would all wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_run_statements_concurrently() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, port) = common::serve(&dir.path().join("data"));
    let mut long = client(port).await;
    for sql in [
        "CREATE TABLE slow (id BIGINT) WITH ('connector' = 'datagen', 'rows-per-second' = '1000', \
         'number-of-rows' = '12000')",
        "CREATE TABLE nowhere (id BIGINT) WITH ('connector' = 'blackhole')",
        "SET 'table.dml-sync' = 'true'",
        "SET 'parallelism.default' = '1'",
    ] {
        run(&mut long, sql).await.expect(sql);
    }
    let started = Instant::now();
    let long_run = tokio::spawn(async move {
        run(&mut long, "INSERT INTO nowhere SELECT id FROM slow")
            .await
            .map(|_| ())
    });
    // Wait until the long statement's job is visibly running.
    let mut probe = client(port).await;
    common::eventually("the long INSERT to show as RUNNING", 30, async || {
        let jobs = run(&mut probe, "SHOW JOBS").await.expect("show jobs");
        let states = strings(&jobs, "state");
        if states.iter().any(|s| s == "RUNNING") {
            Ok(())
        } else {
            Err(states.join(", "))
        }
    })
    .await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        tasks.spawn(async move {
            let mut c = client(port).await;
            for sql in ["SHOW JOBS", "SELECT 1 + 1 AS two", "SHOW TABLES"] {
                let r = tokio::time::timeout(Duration::from_secs(3), run(&mut c, sql)).await;
                match r {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => panic!("client {i}: {sql}: {e}"),
                    Err(_) => panic!("client {i}: {sql} waited 3 s behind another connection's statement"),
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a client");
    }
    assert!(
        !long_run.is_finished(),
        "the long statement ended before the others ran ({:?}): the test proved nothing",
        started.elapsed()
    );
    long_run.await.expect("join").expect("the long INSERT");
}
