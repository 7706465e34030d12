//! Partitioned file tables (`PARTITIONED BY (dt, hm)`), as Flink's
//! filesystem connector lays them out and commits them.
//!
//! A row goes to the directory `dt=<value>/hm=<value>` below the table's
//! path (values escaped as Flink's `PartitionPathUtils` does, so `10:00` is
//! `10%3A00`; NULL or empty is `partition.default-name`); the files hold
//! the other columns. A partition is *committed* — its `_SUCCESS` file
//! written (`sink.partition-commit.policy.kind` = `success-file`) — once
//! its data is committed (the checkpoint holding it completed) and the
//! trigger says it is complete:
//! - `process-time`: the wall clock passed the moment the partition was
//!   first written plus `sink.partition-commit.delay`;
//! - `partition-time`: the watermark passed the partition's time (from its
//!   values by `partition.time-extractor.timestamp-pattern`) plus the
//!   delay (Flink's `watermark > time + delay`).
//!
//! At end of input every partition written is committed (Flink's
//! `endInput`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::timezone::Tz;
use chrono::{NaiveDate, NaiveDateTime, TimeZone};
use weir_catalog::{OptionKind, OptionSpec, Options};

use super::part_file::{PartCommitter, io_err, sync_dir};
use crate::clock::Clock;
use crate::connectors::{Committer, config_error};
use crate::error::Result;

pub const DEFAULT_NAME_OPTION: &str = "partition.default-name";
const TRIGGER: &str = "sink.partition-commit.trigger";
const DELAY: &str = "sink.partition-commit.delay";
const TIME_ZONE: &str = "sink.partition-commit.watermark-time-zone";
pub(crate) const POLICY: &str = "sink.partition-commit.policy.kind";
const SUCCESS_NAME: &str = "sink.partition-commit.success-file.name";
const EXTRACTOR: &str = "partition.time-extractor.kind";
const PATTERN: &str = "partition.time-extractor.timestamp-pattern";
const FORMATTER: &str = "partition.time-extractor.timestamp-formatter";

/// Options of partitioned tables only.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        DEFAULT_NAME_OPTION,
        OptionKind::String,
        "the directory name of a NULL or empty partition value",
    )
    .with_default("__DEFAULT_PARTITION__"),
    OptionSpec::new(
        TRIGGER,
        OptionKind::Enum(&["process-time", "partition-time"]),
        "when a partition is complete: 'process-time' (the wall clock passed its first write + delay) or 'partition-time' (the watermark passed its time + delay)",
    )
    .with_default("process-time"),
    OptionSpec::new(DELAY, OptionKind::Duration, "how long after its time a partition is committed")
        .with_default("0 s"),
    OptionSpec::new(
        TIME_ZONE,
        OptionKind::String,
        "the time zone partition times are in, for 'partition-time' (e.g. 'UTC', 'Asia/Shanghai')",
    )
    .with_default("UTC"),
    OptionSpec::new(
        POLICY,
        OptionKind::String,
        "how a complete partition is committed: 'success-file' (a file in its directory)",
    ),
    OptionSpec::new(
        SUCCESS_NAME,
        OptionKind::String,
        "the name of the success file",
    )
    .with_default("_SUCCESS"),
    OptionSpec::new(
        EXTRACTOR,
        OptionKind::Enum(&["default"]),
        "how a partition's time is read from its values",
    )
    .with_default("default"),
    OptionSpec::new(
        PATTERN,
        OptionKind::String,
        "the partition's time built from its values, e.g. '$dt $hm:00' (default: the first partition value)",
    ),
    OptionSpec::new(
        FORMATTER,
        OptionKind::String,
        "the layout of the built time, Java style (yyyy, MM, dd, HH, mm, ss)",
    )
    .with_default("yyyy-MM-dd HH:mm:ss"),
];

fn option_error(key: &str, message: impl Into<String>) -> crate::error::ConnectorError {
    config_error("filesystem", format!("option '{key}': {}", message.into()))
}

/// When a partition is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    ProcessTime,
    PartitionTime,
}

/// How a table's rows map to partition directories.
#[derive(Debug, Clone)]
pub struct Partitioning {
    pub keys: Vec<String>,
    pub default_name: String,
}

impl Partitioning {
    /// The directory of a row with partition values `values` (as text;
    /// `None` for NULL), relative to the table's path.
    pub fn dir(&self, values: &[Option<&str>]) -> String {
        self.keys
            .iter()
            .zip(values)
            .map(|(k, v)| {
                let v = match v {
                    Some(v) if !v.is_empty() => escape(v),
                    _ => escape(&self.default_name),
                };
                format!("{}={v}", escape(k))
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    /// The partition values of relative directory `dir` in key order, or
    /// `None` if it is not one of this table's partition directories.
    pub fn values_of(&self, dir: &str) -> Option<Vec<Option<String>>> {
        let parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
        if parts.len() != self.keys.len() {
            return None;
        }
        parts
            .iter()
            .zip(&self.keys)
            .map(|(p, k)| {
                let (name, value) = p.split_once('=')?;
                (unescape(name) == *k).then(|| {
                    let v = unescape(value);
                    (v != self.default_name).then_some(v)
                })
            })
            .collect()
    }
}

/// When and how partitions are committed.
#[derive(Debug, Clone)]
pub struct CommitPolicy {
    partitioning: Partitioning,
    trigger: Trigger,
    delay_ms: i64,
    success_file: String,
    pattern: Option<String>,
    /// chrono's layout for the built time.
    layout: String,
    time_zone: Option<Tz>,
}

impl CommitPolicy {
    /// The table's partition commit policy; `None` when it commits no
    /// partitions (no `sink.partition-commit.policy.kind`).
    pub fn from_options(options: &Options, keys: &[String]) -> Result<Option<Self>> {
        let partitioning = Partitioning {
            keys: keys.to_vec(),
            default_name: options
                .get(DEFAULT_NAME_OPTION)
                .unwrap_or("__DEFAULT_PARTITION__")
                .to_string(),
        };
        let Some(kinds) = options.get(POLICY) else {
            return Ok(None);
        };
        let mut success = false;
        for kind in kinds.split(',').map(str::trim) {
            match kind.to_ascii_lowercase().as_str() {
                "success-file" => success = true,
                "metastore" => {
                    return Err(option_error(
                        POLICY,
                        "'metastore' commits to a Hive metastore, which a filesystem table has none of; use 'success-file'",
                    )
                    .into());
                }
                other => {
                    return Err(option_error(
                        POLICY,
                        format!("unknown or unsupported policy '{other}'; accepted: success-file"),
                    )
                    .into());
                }
            }
        }
        if !success {
            return Ok(None);
        }
        let trigger = match options.get(TRIGGER).map(str::to_ascii_lowercase).as_deref() {
            Some("partition-time") => Trigger::PartitionTime,
            _ => Trigger::ProcessTime,
        };
        let delay_ms = options.duration(DELAY)?.map_or(0, |d| d.as_millis() as i64);
        let time_zone = match options.get(TIME_ZONE).unwrap_or("UTC") {
            "UTC" | "utc" => None,
            tz => Some(
                tz.parse::<Tz>()
                    .map_err(|e| option_error(TIME_ZONE, format!("unknown time zone '{tz}': {e}")))?,
            ),
        };
        let layout = crate::time_format::java_to_chrono(options.get(FORMATTER).unwrap_or("yyyy-MM-dd HH:mm:ss"))
            .map_err(|m| option_error(FORMATTER, m))?;
        let pattern = options.get(PATTERN).map(str::to_string);
        if let Some(p) = &pattern
            && !keys.iter().any(|k| p.contains(&format!("${k}")))
        {
            return Err(option_error(
                PATTERN,
                format!("'{p}' names no partition column; write them as ${}", keys.join(", $")),
            )
            .into());
        }
        Ok(Some(Self {
            partitioning,
            trigger,
            delay_ms,
            success_file: options.get(SUCCESS_NAME).unwrap_or("_SUCCESS").to_string(),
            pattern,
            layout,
            time_zone,
        }))
    }

    /// The time of partition `dir` in ms since the epoch (Flink's default
    /// extractor: the pattern with `$key` replaced by the values, or the
    /// first value, as a timestamp or a date).
    pub fn partition_time(&self, dir: &str) -> Option<i64> {
        let values = self.partitioning.values_of(dir)?;
        let text = match &self.pattern {
            Some(p) => {
                let mut t = p.clone();
                for (k, v) in self.partitioning.keys.iter().zip(&values) {
                    t = t.replace(&format!("${k}"), v.as_deref().unwrap_or(""));
                }
                t
            }
            None => values.first()?.clone()?,
        };
        let text = text.trim();
        let local = NaiveDateTime::parse_from_str(text, &self.layout)
            .ok()
            .or_else(|| {
                // Flink's default formatter is lenient: one-digit fields, a
                // fraction, or a date alone (its midnight).
                NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").ok()
            })
            .or_else(|| NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M").ok())
            .or_else(|| {
                NaiveDate::parse_from_str(text, "%Y-%m-%d")
                    .ok()
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
            })?;
        Some(match &self.time_zone {
            None => local.and_utc().timestamp_millis(),
            Some(tz) => tz.from_local_datetime(&local).earliest()?.timestamp_millis(),
        })
    }

    fn success_path(&self, base: &Path, dir: &str) -> PathBuf {
        base.join(dir).join(&self.success_file)
    }
}

/// Flink's `PartitionPathUtils.escapePathName`: characters that would
/// break a path as `%XX`.
pub fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        let special = (c as u32) < 0x20
            || matches!(
                c,
                '"' | '#' | '%' | '\'' | '*' | '/' | ':' | '=' | '?' | '\\' | '\u{7f}' | '{' | '[' | ']' | '^'
            );
        if special {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// The inverse of [`escape`].
pub fn unescape(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = v.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a writer reports with each checkpoint, beside its files: the
/// partitions it wrote since the last one, its watermark, whether its
/// input ended.
pub fn commit_info(
    partitions: &BTreeSet<String>,
    watermark: Option<i64>,
    ended: bool,
    subtask: usize,
    parallelism: usize,
) -> serde_json::Value {
    serde_json::json!({
        "partitions": partitions,
        "watermark": watermark,
        "ended": ended,
        "subtask": subtask,
        "parallelism": parallelism,
    })
}

/// What the committer knows between checkpoints.
#[derive(Default)]
struct CommitState {
    /// Partitions first seen (wall clock, ms) and not committed yet.
    pending: BTreeMap<String, i64>,
    /// Per writer subtask, the latest watermark it reported and whether
    /// its input ended (a subtask that finished early reports no more).
    writers: BTreeMap<u64, (i64, bool)>,
}

/// The file sink's committer: makes pending files visible (as
/// [`PartCommitter`], in partition directories too), then commits the
/// partitions whose trigger holds.
pub struct FileCommitter {
    dir: PathBuf,
    files: PartCommitter,
    /// Hidden files of this job start with it (`.part-<job>-`).
    prefix: String,
    policy: Option<CommitPolicy>,
    state: Mutex<CommitState>,
    /// Without checkpointing: the partitions the writers wrote, all
    /// committed when the job ends.
    written: Arc<Mutex<BTreeSet<String>>>,
    partitioned: bool,
    /// Processing time: when a partition's commit delay has passed.
    clock: Clock,
    /// The table is on an object store: partitions are key prefixes and
    /// a success file is an object put below one.
    remote: Option<std::sync::Arc<super::object_files::ObjectFiles>>,
}

impl FileCommitter {
    pub fn new(
        dir: PathBuf,
        prefix: String,
        policy: Option<CommitPolicy>,
        written: Arc<Mutex<BTreeSet<String>>>,
        partitioned: bool,
        clock: Clock,
        remote: Option<std::sync::Arc<super::object_files::ObjectFiles>>,
    ) -> Self {
        // On an object store, partitions are key prefixes: the one
        // committer finds unfinished parts below all of them.
        let partitioned = partitioned && remote.is_none();
        Self {
            clock,
            files: PartCommitter::new(dir.clone(), prefix.clone(), 3, "sink.file_committed")
                .on_object_store(remote.clone()),
            remote,
            dir,
            prefix,
            policy,
            state: Mutex::new(CommitState::default()),
            written,
            partitioned,
        }
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, CommitState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the success file of each of `dirs`.
    fn commit_partitions<'a>(&self, policy: &CommitPolicy, dirs: impl Iterator<Item = &'a String>) -> Result<()> {
        for dir in dirs {
            if let Some(remote) = &self.remote {
                // A PUT is durable when it returns; an empty object, as
                // Flink's success file.
                let rel = format!("{dir}/{}", policy.success_file);
                remote.put_bytes(&rel, vec![])?;
                tracing::info!(target: "weir::sink", "partition {dir} committed: {}/{rel}", remote.url());
                continue;
            }
            let path = policy.success_path(&self.dir, dir);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
            }
            let f = std::fs::File::create(&path).map_err(|e| io_err(&path, e))?;
            f.sync_all().map_err(|e| io_err(&path, e))?;
            if let Some(parent) = path.parent() {
                sync_dir(parent)?;
            }
            tracing::info!(target: "weir::sink", "partition {dir} committed: {}", path.display());
        }
        Ok(())
    }

    /// Relative partition directories below the table's path (to the
    /// depth of the partition keys).
    fn partition_dirs(&self) -> Result<Vec<String>> {
        let depth = self.policy.as_ref().map_or(0, |p| p.partitioning.keys.len());
        Ok(self
            .partition_dirs_for_recovery()?
            .into_iter()
            .filter(|d| !d.is_empty() && d.split('/').count() == depth)
            .collect())
    }
}

impl Committer for FileCommitter {
    fn commit(&self, checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()> {
        let (infos, files): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) =
            committables.iter().partition(|c| c.get("partitions").is_some());
        let files: Vec<serde_json::Value> = files.into_iter().cloned().collect();
        self.files.commit(checkpoint_id, &files)?;
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        let mut state = self.lock_state();
        let mut parallelism = 0;
        for info in &infos {
            for p in info["partitions"].as_array().into_iter().flatten() {
                if let Some(p) = p.as_str() {
                    state.pending.entry(p.to_string()).or_insert(now);
                }
            }
            let subtask = info["subtask"].as_u64().unwrap_or(0);
            let w = info["watermark"].as_i64().unwrap_or(i64::MIN);
            let ended = info["ended"].as_bool() == Some(true);
            let e = state.writers.entry(subtask).or_insert((w, ended));
            *e = (e.0.max(w), e.1 || ended);
            parallelism = parallelism.max(info["parallelism"].as_u64().unwrap_or(0));
        }
        // Until every writer has reported, the watermark is unknown.
        let known = parallelism > 0 && state.writers.len() as u64 >= parallelism;
        let all_ended = known && state.writers.values().all(|(_, e)| *e);
        let watermark = known.then(|| state.writers.values().map(|(w, _)| *w).min()).flatten();
        let pending = &state.pending;
        let due: Vec<String> = pending
            .iter()
            .filter(|(dir, first)| {
                all_ended
                    || match policy.trigger {
                        Trigger::ProcessTime => now > first.saturating_add(policy.delay_ms),
                        Trigger::PartitionTime => match (watermark, policy.partition_time(dir)) {
                            (Some(w), Some(t)) => w > t.saturating_add(policy.delay_ms),
                            _ => false,
                        },
                    }
            })
            .map(|(dir, _)| dir.clone())
            .collect();
        self.commit_partitions(policy, due.iter())?;
        for d in &due {
            state.pending.remove(d);
        }
        Ok(())
    }

    fn abandon(&self, attempt: &str) -> Result<()> {
        if !self.partitioned {
            return self.files.abandon(attempt);
        }
        for rel in &self.partition_dirs_for_recovery()? {
            PartCommitter::new(self.dir.join(rel), self.prefix.clone(), 3, "sink.file_committed").abandon(attempt)?;
        }
        Ok(())
    }

    fn recover(&self) -> Result<()> {
        if !self.partitioned {
            self.files.recover()?;
        } else {
            // In-progress and pending files of this job in every partition.
            let dirs = self.partition_dirs_for_recovery()?;
            for rel in &dirs {
                PartCommitter::new(self.dir.join(rel), self.prefix.clone(), 3, "sink.file_committed").recover()?;
            }
        }
        // Partitions with data but no success file are still to commit
        // (their writers' reports went with the failed attempt). The
        // restored writers report afresh, perhaps at another parallelism.
        if let (Some(policy), Some(remote)) = (&self.policy, &self.remote) {
            let now = self.clock.now_ms();
            let mut state = self.lock_state();
            state.writers.clear();
            let depth = policy.partitioning.keys.len();
            let with_data: BTreeSet<String> = remote
                .list_visible(Some(depth), true)?
                .into_iter()
                .filter_map(|rel| rel.rsplit_once('/').map(|(dir, _)| dir.to_string()))
                .collect();
            for rel in with_data {
                if !remote.exists(&format!("{rel}/{}", policy.success_file))? {
                    state.pending.entry(rel).or_insert(now);
                }
            }
        } else if let Some(policy) = &self.policy {
            let now = self.clock.now_ms();
            let mut state = self.lock_state();
            state.writers.clear();
            for rel in self.partition_dirs()? {
                let dir = self.dir.join(&rel);
                let has_data = std::fs::read_dir(&dir)
                    .map_err(|e| io_err(&dir, e))?
                    .flatten()
                    .any(|e| {
                        let n = e.file_name().to_string_lossy().to_string();
                        !n.starts_with('.') && !n.starts_with('_') && e.file_type().is_ok_and(|t| t.is_file())
                    });
                if has_data && !policy.success_path(&self.dir, &rel).exists() {
                    state.pending.entry(rel).or_insert(now);
                }
            }
        }
        Ok(())
    }

    fn finish(&self) -> Result<()> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let written = std::mem::take(&mut *self.written.lock().unwrap_or_else(|p| p.into_inner()));
        self.commit_partitions(policy, written.iter())
    }
}

impl FileCommitter {
    /// Every directory a partition's files may be in (the table's path
    /// too, for files of an unpartitioned run).
    fn partition_dirs_for_recovery(&self) -> Result<Vec<String>> {
        let mut dirs = vec![String::new()];
        let mut stack = vec![(self.dir.clone(), String::new())];
        while let Some((path, rel)) = stack.pop() {
            let entries = match std::fs::read_dir(&path) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&path, e).into()),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_err(&path, e))?;
                let name = entry.file_name().to_string_lossy().to_string();
                if name.contains('=') && entry.file_type().map_err(|e| io_err(&path, e))?.is_dir() {
                    let rel = if rel.is_empty() { name } else { format!("{rel}/{name}") };
                    dirs.push(rel.clone());
                    stack.push((entry.path(), rel));
                }
            }
        }
        Ok(dirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_escaped_as_flink_does() {
        let p = Partitioning {
            keys: vec!["dt".into(), "hm".into()],
            default_name: "__DEFAULT_PARTITION__".into(),
        };
        let dir = p.dir(&[Some("2024-01-01"), Some("10:00")]);
        assert_eq!(dir, "dt=2024-01-01/hm=10%3A00");
        assert_eq!(
            p.values_of(&dir),
            Some(vec![Some("2024-01-01".into()), Some("10:00".into())])
        );
        assert_eq!(
            p.dir(&[None, Some("")]),
            "dt=__DEFAULT_PARTITION__/hm=__DEFAULT_PARTITION__"
        );
        assert_eq!(p.values_of("dt=x"), None);
        assert_eq!(escape("a/b=c%"), "a%2Fb%3Dc%25");
        assert_eq!(unescape("a%2Fb%3Dc%25"), "a/b=c%");
    }

    #[test]
    fn partition_times_follow_the_pattern() {
        let options = |pairs: &[(&str, &str)]| {
            let raw: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Options::validate(&raw, OPTIONS, "test").expect("options")
        };
        let keys = vec!["dt".to_string(), "hm".to_string()];
        let p = CommitPolicy::from_options(&options(&[(POLICY, "success-file"), (PATTERN, "$dt $hm:00")]), &keys)
            .expect("policy")
            .expect("a policy");
        assert_eq!(p.partition_time("dt=2024-01-01/hm=10%3A05"), Some(1_704_103_500_000));
        // The first value alone, a date.
        let q = CommitPolicy::from_options(&options(&[(POLICY, "success-file")]), &keys)
            .expect("policy")
            .expect("a policy");
        assert_eq!(q.partition_time("dt=2024-01-01/hm=x"), Some(1_704_067_200_000));
        let shanghai = CommitPolicy::from_options(
            &options(&[
                (POLICY, "success-file"),
                (PATTERN, "$dt $hm:00"),
                (TIME_ZONE, "Asia/Shanghai"),
            ]),
            &keys,
        )
        .expect("policy")
        .expect("a policy");
        assert_eq!(
            shanghai.partition_time("dt=2024-01-01/hm=10%3A05"),
            Some(1_704_103_500_000 - 8 * 3_600_000)
        );
        assert!(CommitPolicy::from_options(&options(&[(POLICY, "metastore,success-file")]), &keys).is_err());
        assert!(CommitPolicy::from_options(&options(&[(POLICY, "success-file"), (PATTERN, "$x")]), &keys).is_err());
    }
}
