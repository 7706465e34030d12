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

/// What a check of [`eventually`] answers: not yet (`None`, or `Err` with
/// what it saw, shown if the deadline passes) or the awaited value.
pub trait Awaited<T> {
    fn ready(self) -> Result<T, String>;
}

impl<T> Awaited<T> for Option<T> {
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T> Awaited<T> for Result<T, String> {
    fn ready(self) -> Result<T, String> {
        self
    }
}

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it answers, failing the test with `what` (and what
/// the check last saw) after `secs` seconds. Tests wait for an event with
/// a deadline, never for a fixed time.
pub async fn eventually<T, A: Awaited<T>>(what: &str, secs: u64, mut check: impl AsyncFnMut() -> A) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let last = match check().await.ready() {
            Ok(v) => return v,
            Err(last) => last,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}{}",
            seen(&last)
        );
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for a check that blocks (outside an async runtime).
pub fn eventually_blocking<T, A: Awaited<T>>(what: &str, secs: u64, mut check: impl FnMut() -> A) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let last = match check().ready() {
            Ok(v) => return v,
            Err(last) => last,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}{}",
            seen(&last)
        );
        std::thread::sleep(POLL);
    }
}

fn seen(last: &str) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!("; last seen:\n{last}")
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

/// `weir serve` over `data` with extra flags, listening on a port the
/// system picks (`--listen 127.0.0.1:0`: no race with other processes for
/// a port chosen beforehand), once it listens.
pub fn serve_with(data: &std::path::Path, args: &[&str]) -> (Killed, u16) {
    serve_with_env(data, args, &[])
}

/// [`serve_with`], the server's environment extended by `env`.
pub fn serve_with_env(data: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (Killed, u16) {
    std::fs::create_dir_all(data).expect("data dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--data-dir")
        .arg(data)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir serve");
    let ports = announced_ports(&mut child);
    (Killed(child), ports.flight)
}

/// The ports a `weir serve` started with `--listen 127.0.0.1:0` (and
/// `--metrics-listen 127.0.0.1:0`) announced on its stderr.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub flight: u16,
    pub metrics: Option<u16>,
}

/// Reads the `[INFO] Flight SQL on grpc://..` line (and the metrics line
/// before it) from the piped stderr of `child`, waiting up to 60 s; a
/// thread keeps draining stderr afterwards so the server never blocks on it.
#[allow(dead_code)]
pub fn announced_ports(child: &mut std::process::Child) -> Ports {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut metrics = None;
        let mut sent = false;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            let port_after = |marker: &str| {
                let rest = &line[line.find(marker)? + marker.len()..];
                let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                digits.parse::<u16>().ok()
            };
            if line.contains("Prometheus metrics on") {
                metrics = port_after("127.0.0.1:");
            }
            if !sent
                && line.contains("Flight SQL on")
                && let Some(flight) = port_after("127.0.0.1:")
            {
                let _ = tx.send(Ports { flight, metrics });
                sent = true;
            }
        }
    });
    // The line is printed after the bind: connections are accepted from
    // here on (the kernel queues them until the server takes them).
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(p) => p,
        Err(_) => panic!(
            "weir serve did not announce its port within 60 s (exit: {:?})",
            child.try_wait()
        ),
    }
}

/// The Flight port a server announced in its log file (stderr sent to
/// `log`), waiting up to 60 s: the file is polled, as nothing signals a
/// write to it.
#[allow(dead_code)]
pub fn port_in_log(log: &std::path::Path) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("Flight SQL on"))
            && let Some(at) = line.find("127.0.0.1:")
        {
            let digits: String = line[at + 10..].chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(p) = digits.parse() {
                return p;
            }
        }
        assert!(Instant::now() < deadline, "no Flight SQL line in {}", log.display());
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// The shell's table result mode for `SELECT user, COUNT(*) AS n,
/// SUM(amount) AS total FROM orders GROUP BY user` over
/// `tests/data/orders.json`: the final rows only, then the status line.
pub fn assert_orders_per_user_table(out: &str) {
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(
        rows,
        [
            "| user | n | total |",
            "|    a | 5 |    26 |",
            "|    b | 3 |    30 |",
            "|    c | 2 |    10 |"
        ],
        "{out}"
    );
    assert!(out.contains("rows: 3, changes: 17"), "{out}");
    assert!(!out.contains("| -U |"), "{out}");
}

/// The same query streamed as changes: every `-U`/`+U` with its op.
pub fn assert_orders_per_user_changes(out: &str) {
    assert!(out.contains("| -U |"), "{out}");
    assert!(out.contains("Received a total of 17 rows"), "{out}");
}

/// A script that runs [`assert_orders_per_user_table`]'s query over the
/// orders file at `data`, after `mode` (a SET statement, or nothing).
pub fn orders_per_user_script(mode: &str, data: &std::path::Path) -> String {
    format!(
        "SET 'parallelism.default' = '1';
{mode}
CREATE TABLE IF NOT EXISTS orders (id BIGINT, `user` STRING, amount BIGINT, ts TIMESTAMP(3))
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
SELECT `user`, COUNT(*) AS n, SUM(amount) AS total FROM orders GROUP BY `user`;
",
        data.display()
    )
}

/// A finished `weir` process's stdout, after asserting it succeeded.
pub fn successful_stdout(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The lines of every visible file in `dir` (a file sink's committed
/// output: in-progress and pending files are hidden), sorted.
#[allow(dead_code)]
pub fn committed_lines(dir: &std::path::Path) -> Vec<String> {
    let mut lines: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .flat_map(|e| {
                std::fs::read_to_string(e.path())
                    .expect("read output")
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect(),
        Err(_) => vec![],
    };
    lines.sort();
    lines
}

/// A test server `scripts/setup.sh` installs: `$env` if set, else its
/// build in `~/.cache/weir-tools/bin`, else `fallback` on the PATH.
fn tool_binary(env: &str, cached: &str, fallback: &str) -> std::path::PathBuf {
    if let Ok(p) = std::env::var(env) {
        return p.into();
    }
    let cached = std::env::var("HOME")
        .map(|h| std::path::PathBuf::from(h).join(".cache/weir-tools/bin").join(cached))
        .unwrap_or_default();
    if cached.exists() {
        return cached;
    }
    fallback.into()
}

/// The Kafka-protocol test broker (or `WEIR_TANSU`).
pub fn tansu_binary() -> std::path::PathBuf {
    tool_binary("WEIR_TANSU", "tansu-510f3e2", "tansu")
}

/// A tansu broker in memory on a free port, for tests that need a broker
/// but no Kafka client of their own: the process (killed when dropped)
/// and `host:port`, once it accepts connections (deadline 30 s).
pub fn tansu(dir: &std::path::Path) -> (Killed, String) {
    let port = free_port();
    let broker = Killed(spawn_tansu(dir, port, port));
    let servers = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Nothing signals that the broker listens but its port: a refused
    // connection comes back at once, so the poll is paced.
    while std::net::TcpStream::connect(&servers).is_err() {
        assert!(Instant::now() < deadline, "the broker did not listen within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    (broker, servers)
}

/// A tansu broker process in memory listening on `port` and advertising
/// `advertised` (a proxy's port, or the same), its log in `dir`.
pub fn spawn_tansu(dir: &std::path::Path, port: u16, advertised: u16) -> Child {
    let url = format!("tcp://127.0.0.1:{port}");
    let advertised_url = format!("tcp://127.0.0.1:{advertised}");
    let log = std::fs::File::create(dir.join("broker.log")).expect("broker log");
    Command::new(tansu_binary())
        .current_dir(dir)
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &advertised_url,
        ])
        .args(["--storage-engine", "memory://tansu/"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start the test broker '{}': {e}; run scripts/setup.sh (it installs tansu) or set WEIR_TANSU",
                tansu_binary().display()
            )
        })
}

/// Creates `topic` with `partitions` partitions through tansu's own CLI.
pub fn tansu_topic(servers: &str, topic: &str, partitions: u32) {
    let out = Command::new(tansu_binary())
        .args(["topic", "create", topic, "--partitions", &partitions.to_string()])
        .args(["--broker", &format!("tcp://{servers}")])
        .output()
        .expect("tansu topic create");
    assert!(
        out.status.success(),
        "tansu topic create {topic}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The S3 test server, SeaweedFS (or `WEIR_WEED`).
pub fn weed_binary() -> std::path::PathBuf {
    tool_binary("WEIR_WEED", "weed-4.48", "weed")
}

/// An S3 server on loopback: SeaweedFS's `weed mini` (master, volume,
/// filer and S3 in one process, every port free and on 127.0.0.1, no
/// telemetry) with one bucket and one key pair.
pub struct S3Server {
    pub process: Killed,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    /// The filer's port (SeaweedFS's file API below the S3 one).
    pub filer_port: u16,
}

/// Starts an [`S3Server`] with its data in `dir`, once its S3 port
/// answers and its bucket lists (deadline 180 s).
pub fn s3_server(dir: &std::path::Path) -> S3Server {
    let (access_key, secret_key, bucket) = ("weir-test", "weir-test-secret", "weir");
    let mut args = vec![
        "mini".to_string(),
        "-ip=127.0.0.1".into(),
        "-ip.bind=127.0.0.1".into(),
        format!("-dir={}", dir.display()),
        "-master.telemetry=false".into(),
        "-admin.ui=false".into(),
        "-webdav=false".into(),
    ];
    let (mut s3_port, mut filer_port) = (0, 0);
    for flag in [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
        "s3.port.iceberg",
        "s3.port.lance",
        "admin.port",
        "admin.port.grpc",
    ] {
        let port = free_port();
        // SeaweedFS also listens on `<tmp>/seaweedfs-<part>-<port>.sock`,
        // never removed by a killed server: one left by an earlier run on
        // this (free) port would keep the new server from listening.
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with("seaweedfs-") && name.ends_with(&format!("-{port}.sock")) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        match flag {
            "s3.port" => s3_port = port,
            "filer.port" => filer_port = port,
            _ => {}
        }
        args.push(format!("-{flag}={port}"));
    }
    let log = std::fs::File::create(dir.join("weed.log")).expect("weed log");
    let process = Command::new(weed_binary())
        .current_dir(dir)
        .args(&args)
        .env("AWS_ACCESS_KEY_ID", access_key)
        .env("AWS_SECRET_ACCESS_KEY", secret_key)
        .env("S3_BUCKET", bucket)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start the S3 test server {} ({e}); run scripts/setup.sh or set WEIR_WEED",
                weed_binary().display()
            )
        });
    let process = Killed(process);
    let endpoint = format!("http://127.0.0.1:{s3_port}");
    // Generous: the crash tests start a server each while a dozen jobs
    // run on two cores, and SeaweedFS's filer then takes over a minute
    // (seen once on CI).
    let deadline = Instant::now() + Duration::from_secs(180);
    // The S3 port opens before the filer behind it is ready: wait for an
    // answer to a request (any HTTP status) on the bucket.
    loop {
        let answered = std::net::TcpStream::connect(("127.0.0.1", s3_port)).is_ok_and(|mut c| {
            use std::io::{Read, Write};
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let req = format!("HEAD /{bucket} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
            let mut head = [0u8; 12];
            c.write_all(req.as_bytes()).is_ok() && c.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1")
        });
        if answered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the S3 test server did not answer within 180 s (log: {})",
            dir.join("weed.log").display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let server = S3Server {
        process,
        endpoint,
        bucket: bucket.into(),
        access_key: access_key.into(),
        secret_key: secret_key.into(),
        filer_port,
    };
    // The bucket is created after the port answers: list it (as the key
    // pair: anonymous requests are refused either way) until it is there.
    let client = server.client();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    loop {
        let listed = rt.block_on(async { object_store::ObjectStore::list_with_delimiter(&client, None).await });
        match listed {
            Ok(_) => break,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the S3 test server's bucket was not there within 180 s: {e} (log: {})",
                dir.join("weed.log").display()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

impl S3Server {
    /// The ids of the bucket's multipart uploads not completed or aborted
    /// (S3's ListMultipartUploads; read from where SeaweedFS keeps them,
    /// its filer's `/buckets/<bucket>/.uploads/`, as `object_store` does
    /// not list uploads).
    pub fn multipart_uploads(&self) -> Vec<String> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", self.filer_port)).expect("connect to the filer");
        c.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let req = format!(
            "GET /buckets/{}/.uploads/?limit=10000 HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n",
            self.bucket
        );
        c.write_all(req.as_bytes()).expect("request the filer");
        let mut answer = String::new();
        c.read_to_string(&mut answer).expect("the filer's answer");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        if head.starts_with("HTTP/1.1 404") || head.starts_with("HTTP/1.0 404") {
            // No upload was ever started in the bucket.
            return vec![];
        }
        assert!(head.contains(" 200 "), "the filer answered: {head}");
        let listing: serde_json::Value = serde_json::from_str(body).expect("the filer's JSON listing");
        listing["Entries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["FullPath"].as_str())
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
            .collect()
    }

    /// The `SET` statements that point a job's checkpoints at this
    /// server (`s3://<bucket>/checkpoints`) as its key pair.
    pub fn checkpoint_settings(&self) -> String {
        format!(
            "SET 'execution.checkpointing.dir' = 's3://{}/checkpoints';
SET 's3.endpoint' = '{}';
SET 's3.access-key' = '{}';
SET 's3.secret-key' = '{}';
SET 's3.path.style.access' = 'true';",
            self.bucket, self.endpoint, self.access_key, self.secret_key
        )
    }

    /// The keys of the bucket below `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        use futures::TryStreamExt;
        let client = self.client();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let prefix = object_store::path::Path::from(prefix);
        let listed: Vec<object_store::ObjectMeta> = rt
            .block_on(object_store::ObjectStore::list(&client, Some(&prefix)).try_collect())
            .expect("list the bucket");
        listed.into_iter().map(|m| m.location.to_string()).collect()
    }

    /// The `storage_options` delta-rs (Python's `deltalake`) reaches the
    /// bucket with, as JSON.
    pub fn delta_storage_options(&self) -> String {
        serde_json::json!({
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        })
        .to_string()
    }

    /// A client of the server's bucket, as the key pair.
    pub fn client(&self) -> object_store::aws::AmazonS3 {
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region("us-east-1")
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret_key)
            .build()
            .expect("s3 client")
    }
}

/// A proxy on loopback in front of an S3 server that throttles: it answers
/// every `every`-th request with `503 SlowDown` (S3's throttling answer)
/// without passing it on, and forwards the others (one request per
/// connection). `throttled` counts the refusals.
pub struct ThrottlingProxy {
    /// `http://127.0.0.1:<port>`: the endpoint to give clients.
    pub endpoint: String,
    pub throttled: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

pub fn throttling_proxy(upstream: &str, every: usize) -> ThrottlingProxy {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let upstream_addr = upstream.trim_start_matches("http://").trim_end_matches('/').to_string();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let port = listener.local_addr().expect("proxy address").port();
    let throttled = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = throttled.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (upstream_addr, seen, counter) = (upstream_addr.clone(), seen.clone(), counter.clone());
            std::thread::spawn(move || {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let _ = proxy_one(conn, &upstream_addr, every > 0 && n % every == every - 1, &counter);
            });
        }
    });
    ThrottlingProxy {
        endpoint: format!("http://127.0.0.1:{port}"),
        throttled,
    }
}

/// One request of `client`: refused with 503 SlowDown (`throttle`), or
/// sent to `upstream` with `Connection: close` and its answer passed back.
fn proxy_one(
    mut client: std::net::TcpStream,
    upstream: &str,
    throttle: bool,
    throttled: &std::sync::atomic::AtomicUsize,
) -> std::io::Result<()> {
    use std::io::{Read, Write};
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    if throttle {
        throttled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                    <Message>Please reduce your request rate.</Message></Error>";
        write!(
            client,
            "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return client.flush();
    }
    // The same request, but the upstream closes after answering: its
    // answer then ends at EOF, whatever its framing. (Connection is not a
    // signed header; Host is, and passes unchanged.)
    let mut lines: Vec<&str> = head[..head.len() - 4]
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    lines.push("Connection: close");
    let mut up = std::net::TcpStream::connect(upstream)?;
    up.write_all(format!("{}\r\n\r\n", lines.join("\r\n")).as_bytes())?;
    up.write_all(&buf[head_end..])?;
    std::io::copy(&mut up, &mut client)?;
    client.flush()
}

/// The python of the venv `scripts/adbc-venv.sh` makes (the ADBC driver,
/// pyarrow, delta-rs's `deltalake`): `WEIR_ADBC_PYTHON`, or the venv at
/// `WEIR_ADBC_VENV` (default `~/.cache/weir-adbc-venv`).
pub fn test_python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("WEIR_ADBC_PYTHON") {
        return p.into();
    }
    let venv = std::env::var_os("WEIR_ADBC_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/weir-adbc-venv")
        });
    venv.join("bin/python")
}

/// `weir run SQL` with its own data dir, stderr piped, the failpoints
/// given armed (and none inherited).
pub fn start_run(data: &std::path::Path, sql: &std::path::Path, failpoints: Option<&str>) -> Child {
    start_run_env(data, sql, failpoints, &[])
}

/// [`start_run`] with further environment variables.
pub fn start_run_env(
    data: &std::path::Path,
    sql: &std::path::Path,
    failpoints: Option<&str>,
    env: &[(&str, &std::path::Path)],
) -> Child {
    let mut c = Command::new(worker_bin());
    c.envs(env.iter().map(|(k, v)| (*k, *v)));
    c.arg("--data-dir")
        .arg(data)
        .arg("run")
        .arg(sql)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match failpoints {
        Some(f) => c.env("WEIR_FAILPOINTS", f),
        None => c.env_remove("WEIR_FAILPOINTS"),
    };
    c.spawn().expect("spawn weir")
}

/// The child's stderr as it comes, gathered by a thread (joined once the
/// child is gone).
pub fn collect_stderr(child: &mut Child) -> (std::sync::Arc<std::sync::Mutex<String>>, std::thread::JoinHandle<()>) {
    use std::io::Read;
    let mut pipe = child.stderr.take().expect("stderr");
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = text.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .expect("stderr")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (text, reader)
}

/// How a `weir run` child ended: its exit status (`None`: SIGKILLed by
/// the test) and its stderr.
pub struct Run {
    pub exited: Option<std::process::ExitStatus>,
    pub stderr: String,
}

/// Runs `weir run SQL` (see [`start_run`]) to its end within `secs`, or
/// SIGKILLs it `kill_after` after `armed` first holds of its stderr so
/// far (e.g. a checkpoint completed, so that a kill tests a restore
/// however slowly a loaded machine starts the job).
pub fn run_armed(
    data: &std::path::Path,
    sql: &std::path::Path,
    failpoints: Option<&str>,
    secs: u64,
    kill_after: Option<std::time::Duration>,
    armed: &dyn Fn(&str) -> bool,
) -> Run {
    use std::time::{Duration, Instant};
    let mut child = start_run(data, sql, failpoints);
    let (text, reader) = collect_stderr(&mut child);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut kill_at = None;
    let exited = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        let now = Instant::now();
        if kill_at.is_none()
            && let Some(d) = kill_after
            && armed(&text.lock().expect("stderr"))
        {
            kill_at = Some(now + d);
        }
        if kill_at.is_some_and(|k| now >= k) {
            // SIGKILL: no destructors, no flushing, no goodbye.
            child.kill().expect("kill");
            child.wait().expect("reap");
            break None;
        }
        assert!(
            now < deadline,
            "weir run did not end within {secs} s:\n{}",
            text.lock().expect("stderr")
        );
        // Polling the child's exit: the kill time is the random variable
        // under test, not a synchronisation.
        std::thread::sleep(Duration::from_millis(5));
    };
    reader.join().expect("stderr reader");
    let stderr = text.lock().expect("stderr").clone();
    Run { exited, stderr }
}

/// The `weir` binary `Workers` run: `WEIR_BIN`, or cargo's build.
pub fn worker_bin() -> std::path::PathBuf {
    std::env::var_os("WEIR_BIN").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_BIN_EXE_weir")),
        std::path::PathBuf::from,
    )
}

/// `weir worker` processes of one job on loopback, under a supervisor
/// loop that restarts a worker exiting non-zero (what Kubernetes does for
/// a StatefulSet). Each worker's stdout and stderr go to its log.
pub struct Workers {
    pub peers: String,
    sql: std::path::PathBuf,
    dir: std::path::PathBuf,
    pub children: Vec<Option<Child>>,
    pub starts: Vec<u32>,
    /// More `weir worker` flags.
    flags: Vec<String>,
    /// `WEIR_FAILPOINTS` for a worker's start: (worker, start number).
    failpoints: std::collections::HashMap<(usize, u32), String>,
    /// `WEIR_LOG`, if not the default.
    log_filter: Option<String>,
}

impl Workers {
    pub fn new(dir: &std::path::Path, n: usize, sql: &str) -> Workers {
        Self::with_flags(dir, n, sql, &[])
    }

    pub fn with_flags(dir: &std::path::Path, n: usize, sql: &str, flags: &[&str]) -> Workers {
        Self::with_failpoints(dir, n, sql, flags, &[])
    }

    /// Workers of which worker `w`'s `k`-th start (from 1) is armed with
    /// `WEIR_FAILPOINTS=spec`, for each `(w, k, spec)` (later starts are
    /// not: a crash at a failpoint happens once).
    pub fn with_failpoints(
        dir: &std::path::Path,
        n: usize,
        sql: &str,
        flags: &[&str],
        failpoints: &[(usize, u32, &str)],
    ) -> Workers {
        Self::build(dir, n, sql, flags, failpoints, None)
    }

    /// Workers logging what `filter` (`WEIR_LOG`) lets through.
    pub fn with_log_filter(dir: &std::path::Path, n: usize, sql: &str, filter: &str) -> Workers {
        Self::build(dir, n, sql, &[], &[], Some(filter))
    }

    fn build(
        dir: &std::path::Path,
        n: usize,
        sql: &str,
        flags: &[&str],
        failpoints: &[(usize, u32, &str)],
        log_filter: Option<&str>,
    ) -> Workers {
        let peers: Vec<String> = (0..n).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let file = dir.join("job.sql");
        std::fs::write(&file, sql).expect("sql");
        let mut w = Workers {
            peers: peers.join(","),
            sql: file,
            dir: dir.to_path_buf(),
            children: (0..n).map(|_| None).collect(),
            starts: vec![0; n],
            flags: flags.iter().map(|f| f.to_string()).collect(),
            failpoints: failpoints
                .iter()
                .map(|(w, k, spec)| ((*w, *k), spec.to_string()))
                .collect(),
            log_filter: log_filter.map(str::to_string),
        };
        for i in 0..n {
            w.start(i);
        }
        w
    }

    pub fn log(&self, i: usize) -> std::path::PathBuf {
        self.dir.join(format!("worker-{i}.log"))
    }

    pub fn start(&mut self, i: usize) {
        self.starts[i] += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(i))
            .expect("log");
        let out = log.try_clone().expect("log");
        let mut command = Command::new(worker_bin());
        match self.failpoints.get(&(i, self.starts[i])) {
            Some(spec) => command.env("WEIR_FAILPOINTS", spec),
            None => command.env_remove("WEIR_FAILPOINTS"),
        };
        match &self.log_filter {
            Some(f) => command.env("WEIR_LOG", f),
            None => command.env_remove("WEIR_LOG"),
        };
        let child = command
            .arg("--data-dir")
            .arg(self.dir.join(format!("data-{i}")))
            .args([
                "worker",
                "--index",
                &i.to_string(),
                "--peers",
                &self.peers,
                "--join-timeout",
                "60",
            ])
            .args(&self.flags)
            .arg(&self.sql)
            .stdout(out)
            .stderr(log)
            .spawn()
            .expect("spawn weir worker");
        self.children[i] = Some(child);
    }

    /// The supervisor's loop (what Kubernetes does for a StatefulSet): a
    /// worker that exits non-zero is started again with the same
    /// arguments; returns once every worker exited 0. `tick` runs between
    /// rounds (to kill workers).
    pub fn supervise(&mut self, secs: u64, tick: impl FnMut(&mut Workers)) {
        self.supervise_until(secs, tick, |_| false);
    }

    /// [`Self::supervise`], returning early once `until` says so.
    pub fn supervise_until(&mut self, secs: u64, mut tick: impl FnMut(&mut Workers), until: impl Fn(&Workers) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut finished = vec![false; self.children.len()];
        loop {
            #[allow(clippy::needless_range_loop)] // `start(i)` borrows self
            for i in 0..self.children.len() {
                let Some(c) = self.children[i].as_mut() else { continue };
                if let Some(status) = c.try_wait().expect("wait") {
                    self.children[i] = None;
                    if status.success() {
                        finished[i] = true;
                    } else {
                        // As a StatefulSet restarts every pod that exits:
                        // a worker done before another failed is started
                        // again too (the job recovers, or is found done).
                        for j in 0..finished.len() {
                            if finished[j] && self.children[j].is_none() {
                                finished[j] = false;
                                self.start(j);
                            }
                        }
                        assert!(self.starts[i] < 40, "worker {i} restarted 40 times:\n{}", self.logs());
                        self.start(i);
                    }
                }
            }
            if finished.iter().all(|f| *f) || until(self) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the job did not finish within {secs} s:\n{}",
                self.logs()
            );
            tick(self);
            // Polling the processes' exit (no event to wait on).
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self, i: usize) -> bool {
        match self.children[i].as_mut() {
            Some(c) => {
                let _ = c.kill();
                true
            }
            None => false,
        }
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.children[i].as_ref().map(Child::id)
    }

    pub fn logs(&self) -> String {
        (0..self.children.len())
            .map(|i| {
                let text = std::fs::read_to_string(self.log(i)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!(
                    "--- worker {i} ({} starts)\n{}",
                    self.starts[i],
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Checkpoints completed so far, as a worker's log (all its runs) says.
pub fn completed_checkpoints(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .map(|l| l.matches(" completed in ").count())
        .unwrap_or(0)
}
