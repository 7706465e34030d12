//! What the tests that run `weir serve` as a process share.
// Each test binary uses a part of it.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `weir serve` over `data` on a free port, once it listens (deadline
/// 60 s): the process and the port. Files beside `data` (its parent
/// directory) are allowed.
#[allow(dead_code)]
pub fn serve(data: &std::path::Path) -> (Killed, u16) {
    let parent = data.parent().unwrap_or(data).display().to_string();
    serve_with(data, &["--allow-dir", &parent])
}

/// `weir serve` over `data` with extra flags.
pub fn serve_with(data: &std::path::Path, args: &[&str]) -> (Killed, u16) {
    let port = free_port();
    std::fs::create_dir_all(data).expect("data dir");
    let server = Killed(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .arg("--data-dir")
            .arg(data)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn weir serve"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "weir serve did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, port)
}

/// A column of result batches as strings (any type, cast to text).
#[allow(dead_code)]
pub fn strings(batches: &[arrow::record_batch::RecordBatch], column: &str) -> Vec<String> {
    use arrow::array::{Array, AsArray};
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

/// A plaintext Flight channel to `weir serve` on `port`, as soon as it
/// listens (retrying until a 60 s deadline).
pub async fn channel(port: u16) -> tonic::transport::Channel {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect()
            .await
        {
            Ok(c) => return c,
            Err(e) => {
                assert!(Instant::now() < deadline, "weir serve did not listen: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
