//! `weir backfill FILE.sql --from T --to T --chunk D`: the file's INSERT
//! run in batch mode once per chunk of event time, `[from, from + D)`,
//! `[from + D, from + 2D)`, ... up to `to`: each chunk's job reads only
//! the rows of its tables with a time attribute (a `WATERMARK`) whose
//! rowtime is in the chunk, so state and memory stay those of one chunk
//! (the alignment seed's "stage the backfill in bounded chunks by time
//! range"). Only a query whose result rows each come from one chunk runs
//! so ([`weir_sql::Planner::check_chunks`]). Rows with a NULL rowtime are
//! in no chunk.
//!
//! Restartable and exactly-once: a ledger below the data dir
//! (`backfills/<name>.json`) records each chunk once its job finished, and
//! a rerun skips those. A chunk's job is named `<name>_chunk<k>`, so its
//! files in a filesystem sink carry that tag; before a chunk runs, the
//! files a killed run of it left (finished, in progress or pending) are
//! deleted, so a chunk killed before the ledger recorded it is written
//! again from nothing, never twice. Sinks other than files (and print,
//! blackhole) are refused: they would need their own idempotence.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use weir_sql::Statement;

use crate::session::Session;

#[derive(Args, Debug, Clone)]
pub struct BackfillArgs {
    /// The script: its DDL and one INSERT.
    pub file: PathBuf,
    /// The first instant of event time, `YYYY-MM-DD HH:MM:SS[.fff]` (UTC).
    #[arg(long)]
    pub from: String,
    /// The end of the range (exclusive), as --from.
    #[arg(long)]
    pub to: String,
    /// The length of a chunk of event time: `1 h`, `30 min`, `1 d`, ...
    #[arg(long, default_value = "1 h")]
    pub chunk: String,
}

/// What the ledger keeps: the range and chunking it was made for, and the
/// chunks done.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Ledger {
    from_ms: i64,
    to_ms: i64,
    chunk_ms: i64,
    /// The INSERT as written and the sink it writes: another script of
    /// the same name must not take this one's chunks for its own.
    insert: String,
    sink: String,
    done: Vec<u64>,
}

/// An instant as Flink writes a TIMESTAMP, read as UTC: ms since the epoch.
fn instant(flag: &str, text: &str) -> Result<i64, String> {
    let t = text.trim();
    for f in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d",
    ] {
        if let Ok(d) = chrono::NaiveDateTime::parse_from_str(t, f) {
            return Ok(d.and_utc().timestamp_millis());
        }
        if let Ok(d) = chrono::NaiveDate::parse_from_str(t, f)
            && let Some(d) = d.and_hms_opt(0, 0, 0)
        {
            return Ok(d.and_utc().timestamp_millis());
        }
    }
    Err(format!(
        "--{flag} '{text}': not an instant; write it as YYYY-MM-DD HH:MM:SS[.fff] (UTC)"
    ))
}

fn shown(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// Writes `ledger` so a kill leaves the old or the new one, never half.
fn save(path: &Path, ledger: &Ledger) -> Result<(), String> {
    let text = serde_json::to_vec_pretty(ledger).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("json.tmp");
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&text).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

/// Deletes what a run of the job tagged `tag` left in the file sink at
/// `dir` (and its partition directories): `part-<tag>-<attempt>-<subtask>-<n>.<ext>`,
/// finished or hidden (`.` first, `.inprogress`/`.pending` last). Returns
/// how many files went.
fn delete_chunk_files(dir: &Path, tag: &str) -> Result<usize, String> {
    let prefix = format!("part-{tag}-");
    let mut gone = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // No sink directory yet: nothing written.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        // A directory not read would keep a killed run's files.
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = e.path();
        if path.is_dir() {
            gone += delete_chunk_files(&path, tag)?;
            continue;
        }
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name.trim_start_matches('.').strip_prefix(&prefix) else {
            continue;
        };
        // `<attempt>-<subtask>-<n>.<ext>...`: exactly this job's files (a
        // job whose name goes on with `-x` has more fields).
        let stem = rest.split('.').next().unwrap_or_default();
        if stem.split('-').count() != 3 {
            continue;
        }
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        gone += 1;
    }
    Ok(gone)
}

/// Runs the backfill; the process's exit code.
pub async fn run(session: &mut Session, args: &BackfillArgs) -> i32 {
    match backfill(session, args).await {
        Ok(()) => crate::shell::EXIT_OK,
        Err(e) => {
            eprintln!("error: {e}");
            crate::shell::EXIT_ERROR
        }
    }
}

async fn backfill(session: &mut Session, args: &BackfillArgs) -> Result<(), String> {
    let origin = args.file.display().to_string();
    let from = instant("from", &args.from)?;
    let to = instant("to", &args.to)?;
    if to <= from {
        return Err(format!("--to {} is not after --from {}", args.to, args.from));
    }
    let chunk = weir_catalog::options::parse_duration(&args.chunk)
        .filter(|d| !d.is_zero())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .ok_or_else(|| format!("--chunk '{}': not a duration such as '1 h' or '30 min'", args.chunk))?;
    let text = std::fs::read_to_string(&args.file).map_err(|e| format!("cannot read {origin}: {e}"))?;
    let stmts = weir_sql::parse(&text).map_err(|e| format!("{origin}:{e}"))?;
    let inserts: Vec<_> = stmts
        .iter()
        .filter(|s| matches!(s.statement, Statement::Insert { .. }))
        .collect();
    let [insert] = inserts.as_slice() else {
        return Err(format!(
            "{origin}: a backfill runs one INSERT; the file has {}",
            inserts.len()
        ));
    };
    let name = args
        .file
        .file_stem()
        .map_or("backfill".into(), |s| s.to_string_lossy().to_string());
    // The script's own settings and tables, in order, but not its INSERT.
    for s in stmts
        .iter()
        .filter(|s| !matches!(s.statement, Statement::Insert { .. }))
    {
        session
            .execute(s)
            .await
            .map_err(|e| format!("{origin}:{}: {e}", s.location))?;
    }
    let name = session.option(weir_engine::config::PIPELINE_NAME).unwrap_or(name);
    // A chunk's job does not restart itself: an attempt's files would
    // stay beside the next one's. A failed chunk fails the backfill, and
    // its rerun deletes them first.
    for (k, v) in [
        (weir_engine::config::RUNTIME_MODE, "batch"),
        (weir_engine::config::DML_SYNC, "true"),
        (weir_engine::config::RESTART_STRATEGY, "none"),
    ] {
        session.set_option(k, v).map_err(|e| e.to_string())?;
    }
    session
        .check_chunks(&insert.statement, (from, to, chunk))
        .map_err(|e| format!("{origin}:{}: {e}", insert.location))?;
    let Statement::Insert { table, .. } = &insert.statement else {
        return Err("the INSERT is gone".into());
    };
    let sink = session
        .table(table)
        .ok_or_else(|| format!("{origin}:{}: table '{table}' does not exist", insert.location))?;
    let sink_path = format!(
        "{}:{}",
        sink.connector().unwrap_or("?"),
        sink.options.get("path").cloned().unwrap_or_default()
    );
    let sink_dir = match sink.connector() {
        Some("filesystem") => {
            let path = sink.options.get("path").cloned().unwrap_or_default();
            if weir_engine::paths::is_object_url(&path) {
                return Err(format!(
                    "a backfill writes exactly once into local files only yet; '{table}' is on an object store ({path})"
                ));
            }
            Some(weir_engine::paths::local_path(&path))
        }
        Some("print" | "blackhole") => None,
        other => {
            return Err(format!(
                "a backfill writes exactly once into filesystem sinks only yet (and print, blackhole); '{table}' \
                 is '{}'",
                other.unwrap_or("?")
            ));
        }
    };
    let dir = session.data_dir().join("backfills");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{}.json", weir_engine::config::sanitize(&name)));
    let mut ledger = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<Ledger>(&bytes).map_err(|e| format!("{}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ledger {
            from_ms: from,
            to_ms: to,
            chunk_ms: chunk,
            insert: insert.text.clone(),
            sink: sink_path.clone(),
            done: vec![],
        },
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if (&ledger.insert, &ledger.sink) != (&insert.text, &sink_path) {
        return Err(format!(
            "backfill '{name}' ({}) was started by another INSERT or into another sink; give this one another \
             'pipeline.name'",
            path.display()
        ));
    }
    if (ledger.from_ms, ledger.to_ms, ledger.chunk_ms) != (from, to, chunk) {
        return Err(format!(
            "backfill '{name}' was started over [{}, {}) in chunks of {} ms ({}); run it with those, or give this \
             one another 'pipeline.name'",
            shown(ledger.from_ms),
            shown(ledger.to_ms),
            ledger.chunk_ms,
            path.display()
        ));
    }
    // In i128: a chunk of ~i64::MAX ms must not wrap.
    let span = i128::from(to) - i128::from(from);
    let chunks = u64::try_from((span + i128::from(chunk) - 1) / i128::from(chunk)).unwrap_or(0);
    let started = Instant::now();
    let mut ran = 0u32;
    for k in 0..chunks {
        if ledger.done.contains(&k) {
            continue;
        }
        let a = i64::try_from(i128::from(from) + i128::from(k) * i128::from(chunk)).unwrap_or(to);
        let b = a.saturating_add(chunk).min(to);
        let job = format!("{name}_chunk{k}");
        if let Some(dir) = &sink_dir {
            let gone = delete_chunk_files(dir, &weir_engine::config::sanitize(&job))?;
            if gone > 0 {
                eprintln!(
                    "[INFO] backfill '{name}': chunk {k} ran before and was not recorded: its {gone} files deleted"
                );
            }
        }
        eprintln!(
            "[INFO] backfill '{name}': chunk {k} [{}, {}) started",
            shown(a),
            shown(b)
        );
        session.set_event_time_range(Some((a, b)));
        session
            .set_option(weir_engine::config::PIPELINE_NAME, &job)
            .map_err(|e| e.to_string())?;
        let chunk_started = Instant::now();
        let result = session.execute(insert).await.map_err(|e| {
            format!(
                "{origin}:{}: chunk {k} [{}, {}): {e}",
                insert.location,
                shown(a),
                shown(b)
            )
        })?;
        if let crate::session::StatementResult::JobStarted { state, .. } = &result
            && *state != "FINISHED"
        {
            return Err(format!("chunk {k} [{}, {}) ended {state}", shown(a), shown(b)));
        }
        // The rows the sink took.
        let rows = session
            .last_outcome()
            .and_then(|o| o.metrics.nodes.last())
            .map(|n| n.rows_in.load(std::sync::atomic::Ordering::Relaxed));
        ledger.done.push(k);
        save(&path, &ledger)?;
        ran += 1;
        let done = (ledger.done.len() as u64).min(chunks);
        let secs = chunk_started.elapsed().as_secs_f64();
        let per_chunk = started.elapsed().as_secs_f64() / f64::from(ran);
        eprintln!(
            "[INFO] backfill '{name}': chunk {k} [{}, {}) done{} in {secs:.2} s; {done} of {chunks} chunks, about \
             {:.0} s left",
            shown(a),
            shown(b),
            rows.map(|r| format!(", {r} rows written")).unwrap_or_default(),
            per_chunk * (chunks - done) as f64
        );
    }
    session.set_event_time_range(None);
    eprintln!(
        "[INFO] backfill '{name}': [{}, {}) done, {chunks} chunks ({ran} run now) in {:.2} s",
        shown(from),
        shown(to),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_read_as_utc() {
        assert_eq!(instant("from", "1970-01-01 00:00:01").ok(), Some(1000));
        assert_eq!(instant("from", "1970-01-02").ok(), Some(86_400_000));
        assert_eq!(instant("from", "1970-01-01T00:00:00.250").ok(), Some(250));
        let e = instant("to", "yesterday").expect_err("not an instant");
        assert!(e.contains("--to 'yesterday'"), "{e}");
    }

    #[test]
    fn only_the_chunks_own_files_are_deleted() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path();
        std::fs::create_dir_all(p.join("dt=1")).expect("dir");
        for f in [
            "part-j_chunk1-ab12-0-0.csv",
            ".part-j_chunk1-ab12-1-0.csv.inprogress",
            "dt=1/.part-j_chunk1-ab12-0-1.csv.pending",
            "part-j_chunk10-ab12-0-0.csv",
            "part-j_chunk1-x-ab12-0-0.csv",
            "other.csv",
        ] {
            std::fs::write(p.join(f), "x").expect("write");
        }
        assert_eq!(delete_chunk_files(p, "j_chunk1").ok(), Some(3));
        assert!(p.join("part-j_chunk10-ab12-0-0.csv").exists());
        assert!(p.join("part-j_chunk1-x-ab12-0-0.csv").exists());
        assert!(p.join("other.csv").exists());
    }
}
