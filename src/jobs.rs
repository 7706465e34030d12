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
    /// How the job ended, for a job that ended (stopped, finished, failed,
    /// cancelled) in an earlier server: not started again, but still
    /// listed by SHOW JOBS and DESCRIBE JOB, as Flink's JobManager keeps
    /// finished jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<JobEnd>,
}

/// The facts of an ended job a later server shows (its metrics are gone).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobEnd {
    /// SHOW JOBS's name of the state: `FINISHED`, `STOPPED`, `FAILED`,
    /// `CANCELED`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    pub started_ms: i64,
    pub ended_ms: i64,
    pub rows_in: u64,
    pub rows_out: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<u64>,
    pub dead_letters: u64,
}

impl JobEnd {
    fn of(state: &JobState, m: &JobMetrics) -> Self {
        let (rows_in, rows_out) = rows_in_out(m);
        JobEnd {
            state: state.name().to_string(),
            failure: match state {
                JobState::Failed(why) => Some(why.clone()),
                _ => None,
            },
            started_ms: m.lifecycle.started_ms,
            ended_ms: now_ms(),
            rows_in,
            rows_out,
            last_checkpoint: m.checkpoints.last_completed().map(|c| c.id),
            dead_letters: m.dead_letters(),
        }
    }

    /// The job's metrics as far as they are known: its state and start.
    pub fn metrics(&self) -> Arc<JobMetrics> {
        let state = match self.state.as_str() {
            "FINISHED" => JobState::Finished,
            "STOPPED" => JobState::Stopped,
            "CANCELED" => JobState::Canceled,
            _ => JobState::Failed(self.failure.clone().unwrap_or_default()),
        };
        let metrics = JobMetrics {
            lifecycle: weir_engine::runtime::metrics::JobLifecycle::started_at(self.started_ms),
            ..JobMetrics::default()
        };
        metrics.lifecycle.set(state);
        Arc::new(metrics)
    }
}

/// Ended jobs a registry keeps listing (the oldest are forgotten).
const ENDED_KEPT: usize = 100;

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

    /// A job to start again when the server restarts; an earlier run of the
    /// same name that has ended stays listed.
    pub fn add(&self, record: JobRecord) {
        self.update(|r| {
            r.retain(|x| x.name != record.name || x.ended.is_some());
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

    /// Once the job ends on its own or is stopped or cancelled, records how
    /// it ended: a later server lists it and does not start it again. A
    /// suspended job (server shutdown) stays to be resumed.
    pub fn record_end_when_ended(&self, id: String, metrics: &Arc<JobMetrics>) {
        let mut states = metrics.lifecycle.watch();
        let (registry, metrics) = (self.clone(), metrics.clone());
        tokio::spawn(async move {
            if states.wait_for(JobState::is_terminal).await.is_err() {
                return;
            }
            registry.record_end(&id, &metrics);
        });
    }

    /// Records how job `id` ended, once it has (a suspended or running job
    /// is left as it is). Also called by `STOP JOB` when it answers, so a
    /// server stopped right after cannot start the job again.
    pub fn record_end(&self, id: &str, metrics: &JobMetrics) {
        let state = metrics.lifecycle.state();
        if !state.is_terminal() || state == JobState::Suspended {
            return;
        }
        let end = JobEnd::of(&state, metrics);
        self.update(|r| {
            if let Some(record) = r.iter_mut().find(|x| x.id == id && x.ended.is_none()) {
                record.ended = Some(end);
            }
            let ended = r.iter().filter(|x| x.ended.is_some()).count();
            for _ in ENDED_KEPT..ended {
                if let Some(oldest) = r.iter().position(|x| x.ended.is_some()) {
                    r.remove(oldest);
                }
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

/// A bounded run's progress in words: the records its sources' splits
/// have read of all they hold (a split's own unit: rows, Nexmark events,
/// Kafka offsets; known when each split knows where it ends), their rate
/// since the job started, the time so far and what is left at that pace.
/// `None` while a source does not know its end.
pub fn progress_text(m: &JobMetrics) -> Option<String> {
    let (done, total) = m.progress()?;
    if total == 0 {
        return None;
    }
    let secs = ((now_ms() - m.lifecycle.started_ms).max(1)) as f64 / 1000.0;
    let f = done as f64 / total as f64;
    let left = if f > 0.0 && f < 1.0 {
        format!(", about {:.0} s left", secs * (1.0 - f) / f)
    } else {
        String::new()
    };
    Some(format!(
        "{done} of {total} records read ({:.1} %), {:.0} records/s, {secs:.1} s{left}",
        f * 100.0,
        done as f64 / secs
    ))
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
        ids.push(j.record.id.clone());
        names.push(j.record.name.clone());
        states.push(state.name());
        uptime.push(running.then(|| (now_ms() - j.metrics.lifecycle.started_ms).max(0) as u64 / 1000));
        lag.push(if running { watermark_lag_ms(&j.metrics) } else { None });
        // A job that ended in an earlier server: what was recorded then.
        if let Some(end) = &j.record.ended {
            rin.push(end.rows_in);
            rout.push(end.rows_out);
            last.push(end.last_checkpoint);
            dead.push(end.dead_letters);
            continue;
        }
        let (i, o) = rows_in_out(&j.metrics);
        rin.push(i);
        rout.push(o);
        last.push(j.metrics.checkpoints.last_completed().map(|c| c.id));
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
    let (rows_in, rows_out, dead_letters) = match &j.record.ended {
        Some(end) => (end.rows_in, end.rows_out, end.dead_letters),
        None => {
            let (i, o) = rows_in_out(m);
            (i, o, m.dead_letters())
        }
    };
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
        ("dead_letters".into(), dead_letters.to_string()),
    ];
    if let Some(end) = &j.record.ended {
        let ended = chrono::DateTime::from_timestamp_millis(end.ended_ms)
            .map(|d| d.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
            .unwrap_or_default();
        rows.push(("ended".into(), format!("{ended} (before this server started)")));
        if let Some(c) = end.last_checkpoint {
            rows.push(("last_checkpoint".into(), c.to_string()));
        }
    }
    if let JobState::Failed(reason) = &state {
        rows.push(("failure".into(), reason.clone()));
    }
    if !state.is_terminal() {
        let up = (now_ms() - m.lifecycle.started_ms).max(0) / 1000;
        rows.push(("uptime_s".into(), up.to_string()));
        if let Some(lag) = watermark_lag_ms(m) {
            rows.push(("watermark_lag_ms".into(), lag.to_string()));
        }
        if let Some(p) = progress_text(m) {
            rows.push(("progress".into(), p));
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
