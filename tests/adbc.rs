//! A real third-party client against `weir serve`: the ADBC Flight SQL
//! driver (Go, through Python's DB-API) runs `tests/adbc/weir_adbc_test.py`
//! (DDL, a detached job, SHOW JOBS, a prepared query with parameters,
//! metadata through `adbc_get_objects`, a live subscription read and
//! cancelled, STOP JOB, statements whose results are never read
//! taking effect exactly once, and an updating query's changes with `_op`). Its venv comes from `scripts/adbc-venv.sh`, which
//! `scripts/setup.sh` runs.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The venv's python: `WEIR_ADBC_PYTHON`, or the venv
/// `scripts/adbc-venv.sh` makes.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("WEIR_ADBC_PYTHON") {
        return p.into();
    }
    let venv = std::env::var_os("WEIR_ADBC_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/weir-adbc-venv"));
    venv.join("bin/python")
}

#[test]
fn adbc_flight_sql_driver_runs_the_client_script() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/setup.sh (or scripts/adbc-venv.sh) to create the ADBC venv",
        python.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    // The sink is beside the data dir: allowed explicitly.
    let (_server, port) = common::serve_with(
        &dir.path().join("data"),
        &["--allow-dir", &dir.path().display().to_string()],
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/adbc/weir_adbc_test.py");
    let mut client = common::Killed(
        Command::new(&python)
            .arg(&script)
            .arg(format!("grpc://127.0.0.1:{port}"))
            .arg(dir.path().join("sink"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the ADBC client"),
    );
    // The script has its own deadlines; this one catches a hung driver.
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = client.0.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "the ADBC client did not finish in 180 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    if let Some(mut o) = client.0.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = client.0.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "ADBC client failed ({status}):\n{out}\n{err}");
    assert!(
        out.contains("adbc: 12 passed, 0 failed"),
        "every step ran:\n{out}\n{err}"
    );
}
