//! The interactive shell, driven through a real pseudo-terminal (Python's
//! `pty`, which every Debian machine with Python has): multi-line statements
//! ending in `;`, errors with positions, persistent history. Each line is
//! sent only after the prompt it answers has appeared (with a deadline).

mod common;

use std::process::Command;

const DRIVER: &str = r#"
import os, pty, select, sys, time
weir, data, home, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
pid, fd = pty.fork()
if pid == 0:
    os.environ["HOME"] = home
    os.execv(weir, [weir, "--data-dir", data] + extra)
out = b""
def until(token, seconds=30):
    global out
    deadline = time.time() + seconds
    while token.encode() not in out:
        if time.time() > deadline:
            sys.stdout.write(out.decode(errors="replace"))
            sys.exit("timed out waiting for %r" % token)
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
def send(line, expect):
    global out
    out = b""
    os.write(fd, (line + "\r").encode())
    until(expect)
    sys.stdout.write(out.decode(errors="replace"))
until("weir> ")
send("CREATE TABLE t (a BIGINT)", "-> ")
send("  WITH ('connector' = 'blackhole');", "weir> ")
send("SHOW TABLES;", "weir> ")
send("SELECT nope;", "weir> ")
send("SELECT 40 + 2 AS answer;", "weir> ")
send("help", "weir> ")
os.write(fd, b"quit\r")
os.waitpid(pid, 0)
"#;

/// The shell's transcript (stdout) driven by DRIVER; `extra` are more
/// arguments for weir.
fn drive(dir: &std::path::Path, extra: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .arg(env!("CARGO_BIN_EXE_weir"))
        .arg(dir.join("data"))
        .arg(dir)
        .args(extra)
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn the_remote_shell_works_against_a_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, port) = common::serve(&dir.path().join("server"));
    let text = drive(dir.path(), &["--url", &format!("grpc://127.0.0.1:{port}")]);
    assert!(text.contains("[INFO] OK"), "{text}");
    assert!(text.contains(" t |"), "SHOW TABLES lists t: {text}");
    assert!(text.contains("[ERROR] 1:8: No field named nope"), "{text}");
    assert!(text.contains("42"), "{text}");
    // The table is the server's.
    assert!(dir.path().join("server/catalog.json").exists());
}

#[test]
fn multi_line_statements_errors_and_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = drive(dir.path(), &[]);
    assert!(text.contains("[INFO] table created"), "{text}");
    assert!(text.contains("| t "), "SHOW TABLES lists t: {text}");
    assert!(text.contains("[ERROR] 1:8: No field named nope"), "{text}");
    assert!(text.contains("42"), "{text}");
    // `help` and `quit` without ';' (the shell ended: the driver returned).
    assert!(text.contains("SHOW CREATE TABLE t;"), "help printed: {text}");
    let history = std::fs::read_to_string(dir.path().join(".weir_history")).expect("history file");
    assert!(history.contains("SHOW TABLES;"), "{history}");
    assert!(
        history.contains("CREATE TABLE t (a BIGINT)"),
        "multi-line entry kept: {history}"
    );
}
