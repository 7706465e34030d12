//! The jobs a session started: their ids, the statement that started them,
//! and (for `weir serve`) a registry on disk so a restarted server
//! resubmits them. A resubmitted job with checkpointing resumes from its
//! latest checkpoint (the job dir's status says it did not end on purpose).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, Int64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};
use weir_engine::runtime::metrics::{JobMetrics, JobState};

/// What is needed to start a job again: the statement and the options set
/// when it was submitted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobRecord {
    pub id: String,
    pub name: String,
    pub sql: String,
    pub settings: BTreeMap<String, String>,
    /// The user who started it (job control is its owner's or an
    /// admin's); absent in registries written before users existed.
    #[serde(default)]
    pub owner: Option<String>,
    /// The `CREATE TEMPORARY TABLE|VIEW` statements of the session that
    /// started it, made again before it restarts (temporary objects are
    /// in no catalog file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub temporary: Vec<String>,
}

/// A job known to the session.
#[derive(Clone)]
pub struct SessionJob {
    pub record: JobRecord,
    pub metrics: Arc<JobMetrics>,
}

impl SessionJob {
    pub fn state(&self) -> JobState {
        self.metrics.lifecycle.state()
    }
}

/// A fresh job id: 32 hex digits, like Flink's.
pub fn new_job_id() -> String {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let a = std::collections::hash_map::RandomState::new().hash_one(nanos);
    let b = std::collections::hash_map::RandomState::new().hash_one((nanos, std::process::id()));
    format!("{a:016x}{b:016x}")
}

/// `<data dir>/server/jobs.json`: the jobs a server must resubmit when it
/// starts. Written atomically (temp file + rename) on every change.
#[derive(Clone)]
pub struct Registry {
    path: PathBuf,
    records: Arc<Mutex<Vec<JobRecord>>>,
}

impl Registry {
    pub fn open(data_dir: &Path) -> Result<Self, String> {
        let path = data_dir.join("server").join("jobs.json");
        let records = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{}: not a job registry ({e}); move it away to start without it",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Ok(Self {
            path,
            records: Arc::new(Mutex::new(records)),
        })
    }

    pub fn records(&self) -> Vec<JobRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    pub fn add(&self, record: JobRecord) {
        self.update(|r| {
            r.retain(|x| x.name != record.name);
            r.push(record);
        });
    }

    pub fn remove(&self, id: &str) {
        self.update(|r| r.retain(|x| x.id != id));
    }

    fn update(&self, f: impl FnOnce(&mut Vec<JobRecord>)) {
        let Ok(mut records) = self.records.lock() else { return };
        f(&mut records);
        if let Err(e) = self.write(&records) {
            tracing::warn!("cannot save the job registry {}: {e}", self.path.display());
        }
    }

    fn write(&self, records: &[JobRecord]) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(records).map_err(std::io::Error::other)?)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Forgets the job once it ends on its own or is stopped or cancelled;
    /// a suspended job (server shutdown) stays to be resumed.
    pub fn forget_when_ended(&self, id: String, metrics: &JobMetrics) {
        let mut states = metrics.lifecycle.watch();
        let registry = self.clone();
        tokio::spawn(async move {
            let Ok(state) = states.wait_for(JobState::is_terminal).await.map(|s| s.clone()) else {
                return;
            };
            if state != JobState::Suspended {
                registry.remove(&id);
            }
        });
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Rows read by the job's sources and written by its last node.
fn rows_in_out(m: &JobMetrics) -> (u64, u64) {
    use std::sync::atomic::Ordering;
    let rows_in = m
        .nodes
        .iter()
        .filter(|n| n.name.contains("Source:"))
        .map(|n| n.rows_out.load(Ordering::Relaxed))
        .sum();
    let rows_out = m.nodes.last().map_or(0, |n| n.rows_in.load(Ordering::Relaxed));
    (rows_in, rows_out)
}

fn watermark_lag_ms(m: &JobMetrics) -> Option<i64> {
    m.source_watermark().map(|wm| now_ms().saturating_sub(wm))
}

/// `SHOW JOBS`: one row per job.
pub fn show_jobs<'a>(jobs: impl Iterator<Item = &'a SessionJob>) -> Result<RecordBatch, arrow::error::ArrowError> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("job_id", DataType::Utf8, false),
        Field::new("job_name", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("uptime_s", DataType::UInt64, true),
        Field::new("rows_in", DataType::UInt64, false),
        Field::new("rows_out", DataType::UInt64, false),
        Field::new("last_checkpoint", DataType::UInt64, true),
        Field::new("watermark_lag_ms", DataType::Int64, true),
        // Bad records its sources set aside (`scan.dead-letter.path`).
        Field::new("dead_letters", DataType::UInt64, false),
    ]));
    let (mut ids, mut names, mut states, mut uptime, mut rin, mut rout, mut last, mut lag) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut dead = vec![];
    for j in jobs {
        let state = j.state();
        let running = !state.is_terminal();
        let (i, o) = rows_in_out(&j.metrics);
        ids.push(j.record.id.clone());
        names.push(j.record.name.clone());
        states.push(state.name());
        uptime.push(running.then(|| (now_ms() - j.metrics.lifecycle.started_ms).max(0) as u64 / 1000));
        rin.push(i);
        rout.push(o);
        last.push(j.metrics.checkpoints.last_completed().map(|c| c.id));
        lag.push(if running { watermark_lag_ms(&j.metrics) } else { None });
        dead.push(j.metrics.dead_letters());
    }
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(ids)) as ArrayRef,
            Arc::new(StringArray::from(names)),
            Arc::new(StringArray::from(states)),
            Arc::new(UInt64Array::from(uptime)),
            Arc::new(UInt64Array::from(rin)),
            Arc::new(UInt64Array::from(rout)),
            Arc::new(UInt64Array::from(last)),
            Arc::new(Int64Array::from(lag)),
            Arc::new(UInt64Array::from(dead)),
        ],
    )
}

/// `DESCRIBE JOB`: one (property, value) row per fact, then one per
/// operator with its rows in and out.
pub fn describe_job(j: &SessionJob) -> Result<RecordBatch, arrow::error::ArrowError> {
    let m = &j.metrics;
    let state = j.state();
    let (rows_in, rows_out) = rows_in_out(m);
    let started = chrono::DateTime::from_timestamp_millis(m.lifecycle.started_ms)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
        .unwrap_or_default();
    let mut rows: Vec<(String, String)> = vec![
        ("job_id".into(), j.record.id.clone()),
        ("job_name".into(), j.record.name.clone()),
        ("state".into(), state.name().into()),
        ("started".into(), started),
        ("statement".into(), j.record.sql.clone()),
        ("rows_in".into(), rows_in.to_string()),
        ("rows_out".into(), rows_out.to_string()),
        ("dead_letters".into(), m.dead_letters().to_string()),
    ];
    if let JobState::Failed(reason) = &state {
        rows.push(("failure".into(), reason.clone()));
    }
    if !state.is_terminal() {
        let up = (now_ms() - m.lifecycle.started_ms).max(0) / 1000;
        rows.push(("uptime_s".into(), up.to_string()));
        if let Some(lag) = watermark_lag_ms(m) {
            rows.push(("watermark_lag_ms".into(), lag.to_string()));
        }
    }
    if let Some(c) = m.checkpoints.last_completed() {
        rows.push(("last_checkpoint".into(), c.id.to_string()));
    }
    if let Some((id, path)) = m.checkpoints.restored_from.lock().ok().and_then(|r| r.clone()) {
        rows.push(("restored_from".into(), format!("checkpoint {id} ({path})")));
        // Verifying and laying out (downloading) the files, then opening
        // every operator's state.
        let layout = m
            .checkpoints
            .restore_layout_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        if layout > 0 {
            rows.push(("restore_layout_ms".into(), layout.to_string()));
        }
        let ms = m.checkpoints.restore_open_ms.load(std::sync::atomic::Ordering::Relaxed);
        if ms > 0 {
            rows.push(("restore_open_ms".into(), ms.to_string()));
        }
    }
    for sp in m.checkpoints.savepoints.lock().map(|l| l.clone()).unwrap_or_default() {
        let how = match (sp.stopped, sp.drained) {
            (true, true) => ", stopped, drained",
            (true, false) => ", stopped",
            _ => "",
        };
        rows.push((
            "savepoint".into(),
            format!("{} ({} bytes{how})", sp.path.display(), sp.bytes),
        ));
    }
    if let Some(owner) = &j.record.owner {
        rows.push(("owner".into(), owner.clone()));
    }
    for (k, v) in &j.record.settings {
        rows.push((format!("option {k}"), crate::access::shown(k, v).to_string()));
    }
    for n in &m.nodes {
        use std::sync::atomic::Ordering;
        let dead = n.dead_letters.load(Ordering::Relaxed);
        let skipped = n.skipped_records.load(Ordering::Relaxed);
        rows.push((
            format!("operator {}", n.name),
            format!(
                "in {}, out {}{}{}",
                n.rows_in.load(Ordering::Relaxed),
                n.rows_out.load(Ordering::Relaxed),
                if dead > 0 {
                    format!(", dead letters {dead}")
                } else {
                    String::new()
                },
                if skipped > 0 {
                    format!(", skipped bad records {skipped}")
                } else {
                    String::new()
                }
            ),
        ));
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("property", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0.as_str()))) as ArrayRef,
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1.as_str()))),
        ],
    )
}
