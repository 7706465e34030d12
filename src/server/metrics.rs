//! `--metrics-listen`: Prometheus text exposition at `/metrics`.
//!
//! Labels stay low-cardinality: `job` (the job's name), `operator` (the
//! plan node, e.g. `[2] Window`), `group` (alignment group). Subscribers
//! are aggregated, never labelled one by one.

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use arrow::record_batch::RecordBatch;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use weir_engine::runtime::metrics::JobMetrics;

use crate::session::JobsView;

/// What the Flight server itself counts.
pub struct ServerStats {
    max_streams: usize,
    subscribers: Mutex<Vec<mpsc::WeakSender<RecordBatch>>>,
    max_connections: usize,
    /// One permit per connection that may still open.
    pub connections: Arc<Semaphore>,
}

impl ServerStats {
    pub fn new(max_streams: usize, max_connections: usize) -> Self {
        Self {
            max_streams,
            subscribers: Mutex::default(),
            max_connections,
            connections: Arc::new(Semaphore::new(max_connections)),
        }
    }

    pub fn add_subscriber(&self, queue: mpsc::WeakSender<RecordBatch>) {
        if let Ok(mut s) = self.subscribers.lock() {
            s.retain(|q| q.strong_count() > 0);
            s.push(queue);
        }
    }

    /// Queue depth (batches waiting) of every live subscriber.
    fn queue_depths(&self) -> Vec<usize> {
        let Ok(mut s) = self.subscribers.lock() else {
            return vec![];
        };
        s.retain(|q| q.strong_count() > 0);
        s.iter()
            .filter_map(|q| q.upgrade())
            .map(|q| q.max_capacity() - q.capacity())
            .collect()
    }
}

/// Escapes a label value (backslash, quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let labels = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
            .collect::<Vec<_>>()
            .join(",");
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {value}");
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {value}");
        }
    }
}

/// The exposition text for `jobs` (name, metrics) and the server.
pub fn render(jobs: &[(String, Arc<JobMetrics>)], server: &ServerStats, streams: &Semaphore) -> String {
    let mut out = String::new();
    let mut f = Family { out: &mut out };
    f.head("weir_build_info", "gauge", "Weir's version; always 1.");
    f.sample("weir_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);

    f.head(
        "weir_job_running",
        "gauge",
        "1 while the job runs (or restarts), else 0.",
    );
    for (job, m) in jobs {
        let state = m.lifecycle.state();
        f.sample(
            "weir_job_running",
            &[("job", job), ("state", state.name())],
            u8::from(!state.is_terminal()),
        );
    }
    f.head("weir_job_uptime_seconds", "gauge", "Seconds since the job started.");
    let now = chrono::Utc::now().timestamp_millis();
    for (job, m) in jobs.iter().filter(|(_, m)| !m.lifecycle.state().is_terminal()) {
        let up = (now - m.lifecycle.started_ms).max(0) as f64 / 1000.0;
        f.sample("weir_job_uptime_seconds", &[("job", job)], up);
    }

    type NodeValue = fn(&weir_engine::runtime::metrics::NodeMetrics) -> f64;
    let per_node: [(&str, &str, &str, NodeValue); 7] = [
        (
            "weir_operator_records_in_total",
            "counter",
            "Rows into the operator.",
            |n| n.rows_in.load(Ordering::Relaxed) as f64,
        ),
        (
            "weir_operator_records_out_total",
            "counter",
            "Rows out of the operator.",
            |n| n.rows_out.load(Ordering::Relaxed) as f64,
        ),
        (
            "weir_operator_late_records_dropped_total",
            "counter",
            "Rows dropped as late (behind the watermark).",
            |n| n.late_rows_dropped.load(Ordering::Relaxed) as f64,
        ),
        (
            "weir_operator_dead_letters_total",
            "counter",
            "Bad records a source set aside for its dead-letter directory (scan.dead-letter.path).",
            |n| n.dead_letters.load(Ordering::Relaxed) as f64,
        ),
        (
            "weir_operator_skipped_records_total",
            "counter",
            "Bad records a source skipped (*.ignore-parse-errors).",
            |n| n.skipped_records.load(Ordering::Relaxed) as f64,
        ),
        (
            "weir_operator_backpressured_seconds_total",
            "counter",
            "Time spent waiting for downstream (rate() of it is the back-pressure ratio).",
            |n| n.backpressured_ns.load(Ordering::Relaxed) as f64 / 1e9,
        ),
        (
            "weir_operator_state_bytes",
            "gauge",
            "Live keyed state of the operator (keys and values).",
            |n| n.state_bytes.load(Ordering::Relaxed).max(0) as f64,
        ),
    ];
    for (name, kind, help, value) in per_node {
        f.head(name, kind, help);
        for (job, m) in jobs {
            for n in &m.nodes {
                f.sample(name, &[("job", job), ("operator", &n.name)], value(n));
            }
        }
    }

    f.head(
        "weir_watermark_lag_seconds",
        "gauge",
        "Wall clock minus the slowest source reader's watermark.",
    );
    for (job, m) in jobs.iter().filter(|(_, m)| !m.lifecycle.state().is_terminal()) {
        if let Some(wm) = m.source_watermark() {
            f.sample(
                "weir_watermark_lag_seconds",
                &[("job", job)],
                (now - wm) as f64 / 1000.0,
            );
        }
    }
    f.head(
        "weir_alignment_group_spread_seconds",
        "gauge",
        "Watermark alignment: fastest minus slowest reader of the group.",
    );
    for (job, m) in jobs {
        for g in &m.groups {
            if let Some(spread) = g.spread() {
                f.sample(
                    "weir_alignment_group_spread_seconds",
                    &[("job", job), ("group", &g.group)],
                    spread as f64 / 1000.0,
                );
            }
        }
    }

    f.head(
        "weir_source_splits",
        "gauge",
        "Source splits by state (active, idle, paused by watermark alignment, back-pressured, finished).",
    );
    for (job, m) in jobs.iter().filter(|(_, m)| !m.lifecycle.state().is_terminal()) {
        let mut by_state: std::collections::BTreeMap<&str, usize> = Default::default();
        for s in &m.sources {
            for split in s.snapshot().0 {
                *by_state.entry(split.state.as_str()).or_default() += 1;
            }
        }
        for (state, n) in by_state {
            f.sample("weir_source_splits", &[("job", job), ("state", state)], n);
        }
    }

    f.head("weir_checkpoints_total", "counter", "Checkpoints by outcome.");
    for (job, m) in jobs {
        let c = &m.checkpoints;
        let completed = *c.completed_total.borrow();
        let failed = c.failed_total.load(Ordering::Relaxed);
        for (status, n) in [("completed", completed), ("failed", failed)] {
            f.sample("weir_checkpoints_total", &[("job", job), ("status", status)], n);
        }
    }
    let last = |m: &JobMetrics| m.checkpoints.last_completed();
    type CheckpointValue = fn(&weir_engine::checkpoint::coordinator::CheckpointStats) -> f64;
    let per_checkpoint: [(&str, &str, CheckpointValue); 4] = [
        (
            "weir_checkpoint_last_duration_seconds",
            "Duration of the last completed checkpoint.",
            |c| c.duration.as_secs_f64(),
        ),
        (
            "weir_checkpoint_last_size_bytes",
            "State the last completed checkpoint references.",
            |c| c.full_bytes as f64,
        ),
        (
            "weir_checkpoint_last_uploaded_bytes",
            "Bytes uploaded for the last completed checkpoint (the increment).",
            |c| c.incremental_bytes as f64,
        ),
        (
            "weir_checkpoint_last_alignment_seconds",
            "Longest barrier alignment in the last completed checkpoint.",
            |c| c.alignment.as_secs_f64(),
        ),
    ];
    for (name, help, value) in per_checkpoint {
        f.head(name, "gauge", help);
        for (job, m) in jobs {
            if let Some(c) = last(m) {
                f.sample(name, &[("job", job)], value(&c));
            }
        }
    }

    // Each Delta sink's latest commit: the version it made and how long
    // the commit took (how much later than the checkpoint rows became
    // visible); kept over checkpoints that commit nothing.
    f.head(
        "weir_sink_last_commit_seconds",
        "gauge",
        "How long a sink's latest commit took.",
    );
    for (job, m) in jobs {
        for c in m.checkpoints.latest_sink_commits() {
            f.sample(
                "weir_sink_last_commit_seconds",
                &[("job", job), ("sink", &c.sink)],
                c.duration.as_secs_f64(),
            );
        }
    }
    f.head(
        "weir_sink_last_commit_version",
        "gauge",
        "The table version a sink's last commit made (Delta).",
    );
    for (job, m) in jobs {
        for c in m.checkpoints.latest_sink_commits() {
            if let Some(v) = c.version {
                f.sample("weir_sink_last_commit_version", &[("job", job), ("sink", &c.sink)], v);
            }
        }
    }

    let depths = server.queue_depths();
    f.head("weir_subscribers", "gauge", "Live queries being streamed to clients.");
    f.sample("weir_subscribers", &[], depths.len());
    f.head(
        "weir_subscriber_queue_depth_max",
        "gauge",
        "Most result batches waiting for any one subscriber.",
    );
    f.sample(
        "weir_subscriber_queue_depth_max",
        &[],
        depths.iter().max().copied().unwrap_or(0),
    );
    f.head(
        "weir_subscriber_queue_depth_sum",
        "gauge",
        "Result batches waiting for all subscribers.",
    );
    f.sample("weir_subscriber_queue_depth_sum", &[], depths.iter().sum::<usize>());
    f.head("weir_flight_connections", "gauge", "Client connections open now.");
    f.sample(
        "weir_flight_connections",
        &[],
        server
            .max_connections
            .saturating_sub(server.connections.available_permits()),
    );
    f.head("weir_flight_open_streams", "gauge", "Result streams (DoGet) open now.");
    f.sample(
        "weir_flight_open_streams",
        &[],
        server.max_streams.saturating_sub(streams.available_permits()),
    );
    out
}

/// Serves `GET /metrics` on `listen` (plain HTTP/1.1, one response per
/// connection) until the process ends.
pub async fn serve(
    listen: SocketAddr,
    jobs: JobsView,
    server: Arc<ServerStats>,
    streams: Arc<Semaphore>,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("--metrics-listen {listen}: {e}"))?;
    // The bound address: with port 0 the system picked one.
    let listen = listener.local_addr().unwrap_or(listen);
    eprintln!("[INFO] Prometheus metrics on http://{listen}/metrics");
    // Scrapers are few: more connections than this wait their turn.
    let scrapes = Arc::new(Semaphore::new(16));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = scrapes.clone().acquire_owned().await else {
                return;
            };
            let mut conn = match listener.accept().await {
                Ok((conn, _)) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off.
                    tracing::warn!("metrics endpoint: accepting failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (jobs, server, streams) = (jobs.clone(), server.clone(), streams.clone());
            tokio::spawn(async move {
                let _permit = permit;
                // The request line is all we need; a request that does not
                // fit in 8 KiB, or takes more than 5 s, is not one of ours.
                let mut buf = vec![0u8; 8192];
                let mut len = 0;
                let read = async {
                    while len < buf.len() && !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf[len..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => len += n,
                        }
                    }
                };
                if tokio::time::timeout(std::time::Duration::from_secs(5), read)
                    .await
                    .is_err()
                {
                    return;
                }
                let request = String::from_utf8_lossy(&buf[..len]);
                let path = request.split_whitespace().nth(1).unwrap_or("");
                let (status, body) = if request.starts_with("GET ") && (path == "/metrics" || path == "/") {
                    let jobs = jobs
                        .lock()
                        .map(|j| j.clone().into_iter().collect::<Vec<_>>())
                        .unwrap_or_default();
                    ("200 OK", render(&jobs, &server, &streams))
                } else {
                    ("404 Not Found", "only GET /metrics is served here\n".to_string())
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(())
}
