//! A real third-party client against `weir serve`: the ADBC Flight SQL
//! driver (Go, through Python's DB-API) runs `tests/adbc/weir_adbc_test.py`
//! (DDL, a detached job, SHOW JOBS, a prepared query with parameters,
//! metadata through `adbc_get_objects`, a live subscription read and
//! cancelled, STOP JOB, statements whose results are never read
//! taking effect exactly once, and a bounded updating query's final table, or its changes with `_op` when asked). Its venv comes from `scripts/adbc-venv.sh`, which
//! `scripts/setup.sh` runs.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The venv's python (see `common::test_python`).
fn python() -> PathBuf {
    common::test_python()
}

#[test]
fn adbc_flight_sql_driver_runs_the_client_script() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The sink is beside the data dir: allowed explicitly.
    let (_server, port) = common::serve_with(
        &dir.path().join("data"),
        &["--allow-dir", &dir.path().display().to_string()],
    );
    let sink = dir.path().join("sink").display().to_string();
    let out = run_script("weir_adbc_test.py", &[&format!("grpc://127.0.0.1:{port}"), &sink]);
    assert!(out.contains("adbc: 12 passed, 0 failed"), "every step ran:\n{out}");
}

/// A client with role `user` asks, through Kafka client properties, for
/// a shared library to be loaded, a command to be run and files outside
/// the allowed directory to be opened: each is refused, the library's
/// constructor never runs, and the same kind of property inside the
/// allowed directory works against a real broker.
#[test]
fn adbc_user_cannot_load_code_or_open_files_through_client_properties() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allowed = dir.path().join("allowed");
    std::fs::create_dir(&allowed).expect("allowed dir");
    // A library whose constructor leaves a marker: loaded means run.
    let marker = dir.path().join("plugin-ran");
    let source = dir.path().join("plugin.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void ran(void) {{\n\
             FILE *f = fopen(\"{}\", \"w\"); if (f) {{ fputs(\"loaded\", f); fclose(f); }}\n}}\n\
             int conf_init(void) {{ return 0; }}\n",
            marker.display()
        ),
    )
    .expect("plugin source");
    let library = allowed.join("libplugin.so");
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
        .expect("cc (scripts/setup.sh installs a C toolchain)");
    assert!(cc.status.success(), "cc: {}", String::from_utf8_lossy(&cc.stderr));

    let broker_dir = tempfile::tempdir().expect("tempdir");
    let (_broker, servers) = common::tansu(broker_dir.path());
    common::tansu_topic(&servers, "props", 1);

    let users = dir.path().join("users");
    std::fs::write(&users, "admin:admin:a-pw\nuser1:user:u-pw\n").expect("users");
    let (_server, port) = common::serve_with(
        &dir.path().join("data"),
        &[
            "--allow-dir",
            &allowed.display().to_string(),
            "--password-file",
            &users.display().to_string(),
        ],
    );
    let out = run_script(
        "weir_adbc_properties.py",
        &[
            &format!("grpc://127.0.0.1:{port}"),
            "user1",
            "u-pw",
            &allowed.display().to_string(),
            &library.display().to_string(),
            &servers,
        ],
    );
    assert!(
        out.contains("adbc properties: 3 passed, 0 failed"),
        "every step ran:\n{out}"
    );
    assert!(!marker.exists(), "the client's library was loaded into the server");
    assert!(
        !allowed.join("kinit-ran").exists(),
        "the client's command ran in the server"
    );
}

/// A server given `--allow-dir s3://weir/allowed` and, in its
/// environment, the S3 server's endpoint and keys: a DB-API client is
/// refused checkpoints, savepoints, restores and tables elsewhere (in the
/// bucket, through `..`, in another bucket) and an endpoint of its own; a
/// job of its own checkpoints below the allowed location and writes every
/// row once, to a local table and to a table on the store it reads back.
#[test]
fn adbc_user_checkpoints_only_below_the_allowed_object_store_location() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("s3")).expect("s3 dir");
    let s3 = common::s3_server(&dir.path().join("s3"));
    let allowed = dir.path().join("allowed");
    std::fs::create_dir(&allowed).expect("allowed dir");
    let (_server, port) = common::serve_with_env(
        &dir.path().join("data"),
        &[
            "--allow-dir",
            &allowed.display().to_string(),
            "--allow-dir",
            "s3://weir/allowed",
        ],
        &[
            ("AWS_ENDPOINT", &s3.endpoint),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", &s3.access_key),
            ("AWS_SECRET_ACCESS_KEY", &s3.secret_key),
        ],
    );
    let sink = allowed.join("out");
    let out = run_script(
        "weir_adbc_object_store.py",
        &[
            &format!("grpc://127.0.0.1:{port}"),
            "s3://weir/allowed",
            "s3://weir/elsewhere",
            &sink.display().to_string(),
        ],
    );
    assert!(
        out.contains("adbc object store: 3 passed, 0 failed"),
        "every step ran:\n{out}"
    );
    let rows = common::committed_lines(&sink);
    let mut ids: Vec<u64> = rows.iter().filter_map(|l| l.trim().parse().ok()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=3000).collect::<Vec<u64>>(), "every row once");
    // Every object the job wrote is below the allowed location.
    let client = s3.client();
    let keys: Vec<String> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            use futures::TryStreamExt;
            object_store::ObjectStore::list(&client, None)
                .map_ok(|m| m.location.to_string())
                .try_collect()
                .await
                .expect("list")
        });
    assert!(
        keys.iter().any(|k| k.starts_with("allowed/checkpoints/on-s3/log/")),
        "the job's checkpoint log is on the store: {keys:?}"
    );
    assert!(
        keys.iter().any(|k| k.starts_with("allowed/tables/ids/part-")),
        "the table's parts are on the store: {keys:?}"
    );
    assert!(keys.iter().all(|k| k.starts_with("allowed/")), "{keys:?}");
}

/// Runs `tests/adbc/SCRIPT` with the venv's python (deadline 180 s for a
/// hung driver; the scripts have their own); its stdout, after checking
/// it exited 0.
fn run_script(script: &str, args: &[&str]) -> String {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/setup.sh (or scripts/adbc-venv.sh) to create the ADBC venv",
        python.display()
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/adbc")
        .join(script);
    let mut client = common::Killed(
        Command::new(&python)
            .arg(&script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the ADBC client"),
    );
    // The pipes are drained while the client runs: a client writing more
    // than a pipe holds (a long failure message) would otherwise block
    // and look hung.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(
        client
            .0
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let err = drain(
        client
            .0
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = client.0.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "the ADBC client did not finish in 180 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    assert!(status.success(), "ADBC client failed ({status}):\n{out}\n{err}");
    out
}
