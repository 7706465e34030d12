//! `delta` as a source: one snapshot of a table (its latest version when
//! the job is planned, or `'version'` / `'timestamp-as-of'`), a split per
//! data file of that snapshot; with `'scan.mode' = 'continuous'` also the
//! files each later commit appends, found by walking the log a commit at a
//! time (Delta's streaming read: a commit that only rearranges rows, such
//! as OPTIMIZE, adds nothing new; one that deletes or updates rows stops
//! the read with an error naming it, as Delta's streaming readers do
//! without `ignoreChanges`).
//!
//! A split's id carries the snapshot's version (`path@v7`), and an
//! appended file's also its commit (`path@v7+12`): a job restored from a
//! checkpoint reads the version it started on, whatever was committed to
//! the table since, so the files it had not finished are the same files,
//! and walks the commits after it again (the checkpoint's splits are the
//! files already found; the walk is the log cursor). Its position is the
//! rows of the file emitted. Partition
//! columns come from the log's partition values, not from the file or its
//! directory (a table written by Spark or delta-rs alike).
//!
//! A data file is read whole into memory by the split that reads it (the
//! table's own object store: local directory or bucket); Delta files are
//! rolled at about 128 MB by their writers. Deletion vectors and column
//! mapping are refused with the table and the feature named: their rows or
//! columns would be read wrong.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use object_store::ObjectStoreExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use weir_catalog::{OptionKind, OptionSpec, Options};

use super::table::DeltaLocation;
use crate::checkpoint::objects::{S3Settings, block_on};
use crate::connectors::{DEFAULT_BATCH_ROWS, SourceFactory, SourceSplit, SplitPoll};
use crate::error::{ExecError, Result};

/// The snapshot read: a version of the table.
pub const VERSION: &str = "version";
/// The snapshot read: the last version committed at or before this time.
pub const TIMESTAMP_AS_OF: &str = "timestamp-as-of";
/// Flink's Delta connector (`delta-flink`) names them so.
const FLINK_VERSION: &str = "versionAsOf";
const FLINK_TIMESTAMP: &str = "timestampAsOf";
/// `snapshot` (bounded) or `continuous` (the snapshot, then each commit's
/// appended files).
pub const SCAN_MODE: &str = "scan.mode";
/// Flink's Delta connector's name for it: `batch` or `streaming`.
const FLINK_MODE: &str = "mode";
/// How often a continuous read looks for new commits.
pub const MONITOR: &str = "source.monitor-interval";
/// Flink's Delta connector's name for it (milliseconds).
const FLINK_MONITOR: &str = "updateCheckIntervalMillis";
/// Flink's Delta connector checks every 5 s.
const DEFAULT_MONITOR: std::time::Duration = std::time::Duration::from_secs(5);

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        VERSION,
        OptionKind::Int { min: 0, max: i64::MAX },
        "read the table as of this version (default: its latest version when the job is planned)",
    ),
    OptionSpec::new(
        FLINK_VERSION,
        OptionKind::Int { min: 0, max: i64::MAX },
        "the name Flink's Delta connector gives 'version'",
    ),
    OptionSpec::new(
        TIMESTAMP_AS_OF,
        OptionKind::String,
        "read the table as of its last version committed at or before this time ('2026-12-07 08:00:00' in UTC, or RFC 3339 with an offset)",
    ),
    OptionSpec::new(
        FLINK_TIMESTAMP,
        OptionKind::String,
        "the name Flink's Delta connector gives 'timestamp-as-of'",
    ),
    // No `with_default` on these two: `Options::get` answers a default as
    // if given, which would clash with Flink's names for them.
    OptionSpec::new(
        SCAN_MODE,
        OptionKind::Enum(&["snapshot", "continuous"]),
        "'snapshot' (default) reads one version and ends; 'continuous' reads it, then the rows each later commit appends, and does not end",
    ),
    OptionSpec::new(
        FLINK_MODE,
        OptionKind::Enum(&["batch", "streaming"]),
        "the name Flink's Delta connector gives 'scan.mode' ('batch' is 'snapshot', 'streaming' is 'continuous')",
    ),
    OptionSpec::new(
        MONITOR,
        OptionKind::Duration,
        "how often a continuous read looks for new commits (default 5 s)",
    ),
    OptionSpec::new(
        FLINK_MONITOR,
        OptionKind::Int { min: 1, max: i64::MAX },
        "the name Flink's Delta connector gives 'source.monitor-interval' (milliseconds)",
    ),
];

/// One data file of the snapshot.
#[derive(Debug, Clone)]
struct DataFile {
    /// The file's path as the log gives it (decoded), for ids and messages.
    path: String,
    /// Its object in the table's store, and its size (the log's).
    key: object_store::path::Path,
    size: u64,
    partition: HashMap<String, Option<String>>,
}

/// A snapshot of a Delta table as a bounded source.
#[derive(Debug)]
pub struct DeltaSource {
    table: Arc<DeltaLocation>,
    /// The DDL's columns.
    schema: SchemaRef,
    /// The DDL's columns in Delta's types (what the files hold).
    delta_schema: SchemaRef,
    /// The version read on a fresh start.
    version: u64,
    /// The DDL's `PARTITIONED BY` (optional for a source; checked when given).
    partition_keys: Vec<String>,
    /// The files of `version` (a restore at another version lists its own).
    files: Vec<DataFile>,
    /// The table's partition columns (of the version read).
    table_keys: Vec<String>,
    /// `continuous`: how often the log is walked for new commits.
    continuous: Option<std::time::Duration>,
    /// A continuous read's walk of the log past the snapshot, shared by
    /// the readers of this process.
    cursor: std::sync::Mutex<Cursor>,
}

/// How far a continuous read walked the log.
#[derive(Debug, Default)]
struct Cursor {
    /// The snapshot read (the first splits' version).
    snapshot: u64,
    /// The last commit walked.
    walked: u64,
    /// The files the commits walked appended, with their commit.
    found: Vec<(u64, DataFile)>,
    /// Whether a walk since the start checked that the log still has the
    /// commit after `walked` (a job away past the log's retention).
    checked: bool,
    /// The commit the read cannot follow, and why: raised by the next
    /// discovery, so the files appended before it are handed out first.
    stop: Option<(u64, String)>,
    /// The partition columns of the snapshot (a commit that changes them
    /// stops the read; appended files' partition values are read by them).
    table_keys: Vec<String>,
}

impl DeltaSource {
    /// The source of table `name`: its snapshot resolved now (the
    /// options' version or time, else the latest), its columns checked
    /// against the DDL's.
    pub fn new(
        options: &Options,
        schema: SchemaRef,
        partition_keys: &[String],
        name: &str,
        s3: &S3Settings,
    ) -> Result<Self> {
        let table = DeltaLocation::of(options, name, s3)?;
        let delta_schema = super::table::delta_schema(&schema, &table)?;
        if !table.exists()? {
            return Err(table.error("there is no Delta table there (its _delta_log has no commit)"));
        }
        let version = one_of(options, VERSION, FLINK_VERSION, &table)?
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|e| table.error(format!("'{VERSION}' = '{v}': {e}")))
            })
            .transpose()?;
        let at = one_of(options, TIMESTAMP_AS_OF, FLINK_TIMESTAMP, &table)?
            .map(|t| parse_time(&t).map_err(|e| table.error(format!("'{TIMESTAMP_AS_OF}' = '{t}': {e}"))))
            .transpose()?;
        let snapshot = match (version, at) {
            (Some(_), Some(_)) => {
                return Err(table.error(format!(
                    "'{VERSION}' and '{TIMESTAMP_AS_OF}' both choose the version read; give one"
                )));
            }
            (Some(v), None) => Snapshot::Version(v),
            (None, Some(t)) => Snapshot::AsOf(t),
            (None, None) => Snapshot::Latest,
        };
        let mode_given = if options.get(FLINK_MODE).is_some() {
            FLINK_MODE
        } else {
            SCAN_MODE
        };
        let interval_given = if options.get(FLINK_MONITOR).is_some() {
            FLINK_MONITOR
        } else {
            MONITOR
        };
        let continuous = match (options.get(SCAN_MODE), options.get(FLINK_MODE)) {
            (Some(_), Some(_)) => {
                return Err(table.error(format!(
                    "'{SCAN_MODE}' and '{FLINK_MODE}' name the same thing; give one"
                )));
            }
            (Some(m), None) => m.trim().eq_ignore_ascii_case("continuous"),
            (None, Some(m)) => m.trim().eq_ignore_ascii_case("streaming"),
            (None, None) => false,
        };
        let interval = match (options.duration(MONITOR)?, options.get(FLINK_MONITOR)) {
            (Some(_), Some(_)) => {
                return Err(table.error(format!(
                    "'{MONITOR}' and '{FLINK_MONITOR}' name the same thing; give one"
                )));
            }
            (Some(d), None) => d,
            (None, Some(ms)) => std::time::Duration::from_millis(ms.trim().parse().unwrap_or(0)),
            (None, None) => DEFAULT_MONITOR,
        };
        if interval.is_zero() {
            return Err(table.error(format!("'{interval_given}' must be more than 0")));
        }
        if !continuous && (options.get(MONITOR).is_some() || options.get(FLINK_MONITOR).is_some()) {
            let (option, value) = if mode_given == FLINK_MODE || interval_given == FLINK_MONITOR {
                (FLINK_MODE, "streaming")
            } else {
                (SCAN_MODE, "continuous")
            };
            return Err(table.error(format!(
                "'{interval_given}' is for a continuous read: set '{option}' = '{value}' too"
            )));
        }
        let (version, files, table_keys) = list_files(&table, snapshot, &delta_schema, partition_keys)?;
        Ok(Self {
            table: Arc::new(table),
            schema,
            delta_schema,
            version,
            files,
            table_keys: table_keys.clone(),
            partition_keys: partition_keys.to_vec(),
            continuous: continuous.then_some(interval),
            cursor: std::sync::Mutex::new(Cursor {
                snapshot: version,
                walked: version,
                table_keys: table_keys.clone(),
                ..Cursor::default()
            }),
        })
    }

    /// Splits of `files`, the snapshot `version`'s (`commit` `None`) or
    /// appended by `commit` after it.
    fn splits(&self, version: u64, commit: Option<u64>, files: &[DataFile]) -> Result<Vec<Box<dyn SourceSplit>>> {
        let store = self.table.files()?;
        Ok(files
            .iter()
            .map(|f| {
                Box::new(DeltaSplit {
                    table: self.table.clone(),
                    store: store.clone(),
                    file: f.clone(),
                    id: split_id(&f.path, version, commit),
                    version: commit.unwrap_or(version),
                    schema: self.schema.clone(),
                    delta_schema: self.delta_schema.clone(),
                    footer: None,
                    next_group: 0,
                    reader: None,
                    done: false,
                    rows: 0,
                    skip: 0,
                }) as Box<dyn SourceSplit>
            })
            .collect())
    }
}

/// The option given under either of its names (two is an error).
fn one_of(options: &Options, ours: &str, flinks: &str, table: &DeltaLocation) -> Result<Option<String>> {
    match (options.get(ours), options.get(flinks)) {
        (Some(_), Some(_)) => Err(table.error(format!("'{ours}' and '{flinks}' name the same thing; give one"))),
        (Some(v), None) | (None, Some(v)) => Ok(Some(v.trim().to_string())),
        (None, None) => Ok(None),
    }
}

/// `2026-12-07 08:00:00[.fff]` (UTC), `2026-12-07T08:00:00Z`, or RFC 3339
/// with an offset.
fn parse_time(text: &str) -> std::result::Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    for format in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(t.and_utc());
        }
        if let Ok(d) = chrono::NaiveDate::parse_from_str(text, format) {
            return Ok(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
        }
    }
    Err("not a time: give 'YYYY-MM-DD HH:MM:SS' (UTC) or RFC 3339 such as '2026-12-07T08:00:00+01:00'".into())
}

/// Which version of the table to read.
#[derive(Debug, Clone, Copy)]
enum Snapshot {
    Latest,
    Version(u64),
    AsOf(chrono::DateTime<chrono::Utc>),
}

/// The version `snapshot` names and its data files, the table checked
/// against the DDL's columns (`delta_schema`) and partition columns.
fn list_files(
    table: &DeltaLocation,
    snapshot: Snapshot,
    delta_schema: &SchemaRef,
    partition_keys: &[String],
) -> Result<(u64, Vec<DataFile>, Vec<String>)> {
    let mut t = table.unloaded()?;
    let loaded = block_on("a Delta table", async move {
        let r = match snapshot {
            Snapshot::Latest => t.load().await,
            Snapshot::Version(v) => t.load_version(v).await,
            Snapshot::AsOf(at) => t.load_with_datetime(at).await,
        };
        r.map(|_| t)
    })
    .map_err(|e| table.error(e))?;
    let t = loaded.map_err(|e| {
        let which = match snapshot {
            Snapshot::Latest => String::new(),
            Snapshot::Version(v) => format!(" at version {v}"),
            Snapshot::AsOf(at) => format!(" as of {at}"),
        };
        table.error(format!("cannot read the table{which}: {e}"))
    })?;
    let wanted = snapshot;
    let snapshot = t.snapshot().map_err(|e| table.error(e))?;
    let version = snapshot.version();
    // delta-rs loads what there is: a version past the latest loads the
    // latest, a time before the first commit the first version.
    match wanted {
        Snapshot::Version(v) if v != version => {
            return Err(table.error(format!("the table has no version {v} (its latest is {version})")));
        }
        Snapshot::AsOf(at) => {
            // The commit's time as time travel reads it: its log file's
            // modification time (asked of the store when the snapshot was
            // read from a log checkpoint and does not know it).
            let ts = snapshot.version_timestamp(version).or_else(|| {
                let store = t.object_store();
                let log = object_store::path::Path::from(format!("_delta_log/{version:020}.json"));
                block_on("a Delta table", async move { store.head(&log).await })
                    .ok()
                    .and_then(|r| r.ok())
                    .map(|m| m.last_modified.timestamp_millis())
            });
            if let Some(ts) = ts
                && ts > at.timestamp_millis()
            {
                let first = chrono::DateTime::from_timestamp_millis(ts).map_or(ts.to_string(), |t| t.to_string());
                return Err(table.error(format!(
                    "nothing to read as of {at}: its earliest version ({version}) was committed at {first}"
                )));
            }
        }
        _ => {}
    }
    let config = snapshot.metadata().configuration();
    if let Some(mode) = config
        .get("delta.columnMapping.mode")
        .filter(|m| !m.eq_ignore_ascii_case("none"))
    {
        return Err(table.error(format!(
            "version {version} uses column mapping (delta.columnMapping.mode = {mode}), which the delta source does not read yet"
        )));
    }
    super::table::check_columns(table, snapshot, delta_schema, partition_keys, false)?;
    let table_keys = snapshot.metadata().partition_columns().to_vec();
    let mut files = vec![];
    for f in snapshot.log_data().iter() {
        if f.deletion_vector_descriptor().is_some() {
            return Err(table.error(format!(
                "file {} of version {version} has a deletion vector, which the delta source does not read yet",
                f.path()
            )));
        }
        let path = f.path().to_string();
        let key = match url::Url::parse(&path) {
            Ok(_) => file_key(table, version, &path)?,
            Err(_) => f.object_store_path(),
        };
        files.push(data_file(path, key, f.size(), f.partition_values_map(), &table_keys));
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((version, files, table_keys))
}

/// A data file as the log describes it (its partition values those of the
/// table's partition columns).
fn data_file(
    path: String,
    key: object_store::path::Path,
    size: i64,
    mut partition: HashMap<String, Option<String>>,
    table_keys: &[String],
) -> DataFile {
    partition.retain(|k, _| table_keys.contains(k));
    DataFile {
        path,
        key,
        size: size.max(0) as u64,
        partition,
    }
}

/// The object of a file the log names by its whole URL (a shallow
/// clone's): inside the table it is read from its place there; elsewhere
/// not yet.
fn file_key(table: &DeltaLocation, version: u64, path: &str) -> Result<object_store::path::Path> {
    match path.strip_prefix(table.url.as_str()) {
        Some(rel) => object_store::path::Path::from_url_path(rel)
            .map_err(|e| table.error(format!("file {path} of version {version}: {e}"))),
        None => Err(table.error(format!(
            "file {path} of version {version} is outside the table (a shallow clone), which the delta source does not read yet"
        ))),
    }
}

/// What a commit means to a continuous read.
enum CommitRead {
    /// The files it appended (none for one that only rearranges rows).
    Files(Vec<DataFile>),
    /// Why the read cannot go past it.
    Stops(String),
}

/// What commit `version` appended, read from its log entry; `None` if
/// there is no such commit yet. A commit that removes rows (a DELETE,
/// UPDATE or MERGE: a `remove` that changes data) or changes the table's
/// columns ends a continuous read with an error naming it; one that only
/// rearranges rows (OPTIMIZE: `dataChange` false) appends nothing.
fn commit_files(
    table: &DeltaLocation,
    log_store: &deltalake_core::logstore::LogStoreRef,
    version: u64,
    delta_schema: &SchemaRef,
    table_keys: &[String],
) -> Result<Option<CommitRead>> {
    use deltalake_core::kernel::Action;
    let store = log_store.clone();
    let entry = block_on("a Delta table", async move { store.read_commit_entry(version).await })
        .map_err(|e| table.unreachable(e))?
        .map_err(|e| table.unreachable(format!("cannot read commit {version}: {e}")))?;
    let Some(bytes) = entry else {
        return Ok(None);
    };
    let actions = deltalake_core::logstore::get_actions(version, &bytes)
        .map_err(|e| table.error(format!("commit {version} is not readable: {e}")))?;
    let mut files = vec![];
    for action in actions {
        match action {
            Action::Add(add) if add.data_change => {
                if add.deletion_vector.is_some() {
                    return Ok(Some(CommitRead::Stops(format!(
                        "file {} of version {version} has a deletion vector, which the delta source does not read yet",
                        add.path
                    ))));
                }
                let key = if url::Url::parse(&add.path).is_ok() {
                    file_key(table, version, &add.path)?
                } else {
                    object_store::path::Path::from_url_path(&add.path)
                        .map_err(|e| table.error(format!("file {} of version {version}: {e}", add.path)))?
                };
                files.push(data_file(
                    key.to_string(),
                    key,
                    add.size,
                    add.partition_values,
                    table_keys,
                ));
            }
            Action::Remove(r) if r.data_change => {
                return Ok(Some(CommitRead::Stops(format!(
                    "version {version} deletes or updates rows (it removes file {}): a continuous read takes appended rows only, as Delta's streaming readers do; read the table again from a snapshot under a new job name (or with this job's checkpoints cleared)",
                    r.path
                ))));
            }
            Action::Metadata(m) => {
                let theirs = m
                    .parse_schema()
                    .map_err(|e| table.error(format!("version {version}: the table's columns: {e}")))?;
                let ours = super::table::kernel_schema(delta_schema).map_err(|e| table.error(e))?;
                let again = "a continuous read stops there; start the job again to read the table as it is now";
                if let Some(f) = ours
                    .fields()
                    .find(|f| theirs.field(f.name()).is_none_or(|t| t.data_type() != f.data_type()))
                {
                    return Ok(Some(CommitRead::Stops(format!(
                        "version {version} changes the table's column '{}': {again}",
                        f.name()
                    ))));
                }
                if m.partition_columns() != table_keys {
                    return Ok(Some(CommitRead::Stops(format!(
                        "version {version} partitions the table by [{}] (it was by [{}]): {again}",
                        m.partition_columns().join(", "),
                        table_keys.join(", ")
                    ))));
                }
                if let Some(mode) = m
                    .configuration()
                    .get("delta.columnMapping.mode")
                    .filter(|m| !m.eq_ignore_ascii_case("none"))
                {
                    return Ok(Some(CommitRead::Stops(format!(
                        "version {version} turns on column mapping (delta.columnMapping.mode = {mode}), which the delta source does not read yet"
                    ))));
                }
            }
            _ => {}
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Some(CommitRead::Files(files)))
}

/// `path@v7`: a file of snapshot 7; `path@v7+12`: a file commit 12
/// appended, read by a continuous read of snapshot 7.
fn split_id(path: &str, snapshot: u64, commit: Option<u64>) -> String {
    match commit {
        None => format!("{path}@v{snapshot}"),
        Some(c) => format!("{path}@v{snapshot}+{c}"),
    }
}

/// The snapshot and commit a split id names.
fn parse_id(id: &str) -> Option<(u64, Option<u64>)> {
    let (_, v) = id.rsplit_once("@v")?;
    match v.split_once('+') {
        None => Some((v.parse().ok()?, None)),
        Some((s, c)) => Some((s.parse().ok()?, Some(c.parse().ok()?))),
    }
}

impl DeltaSource {
    /// Walks the commits after `cursor.walked` that exist now, keeping
    /// the files they append.
    fn walk(&self, cursor: &mut Cursor) -> Result<()> {
        let log_store = self.table.unloaded()?.log_store();
        let mut looked_again = false;
        while cursor.stop.is_none() {
            let next = cursor.walked + 1;
            match commit_files(&self.table, &log_store, next, &self.delta_schema, &cursor.table_keys)? {
                Some(CommitRead::Files(files)) => {
                    cursor.found.extend(files.into_iter().map(|f| (next, f)));
                    cursor.walked = next;
                    cursor.checked = true;
                }
                // Handed out first: what the commits before it appended.
                Some(CommitRead::Stops(why)) => cursor.stop = Some((next, why)),
                None if cursor.checked => return Ok(()),
                None => {
                    // No commit `next` on the first walk since the start:
                    // none yet, or the log no longer has it (cleaned up
                    // past its retention while the job was away), which
                    // would skip rows without a word. Once checked, a
                    // running read keeps up long before any cleanup.
                    let store = log_store.clone();
                    let latest = block_on("a Delta table", async move {
                        store.get_latest_version(next.saturating_sub(1)).await
                    })
                    .map_err(|e| self.table.unreachable(e))?
                    .map_err(|e| self.table.unreachable(format!("cannot list the log: {e}")))?;
                    if latest < next {
                        cursor.checked = true;
                        return Ok(());
                    }
                    // Committed between the two reads: read it again.
                    if !looked_again {
                        looked_again = true;
                        continue;
                    }
                    return Err(self.table.cannot_follow(format!(
                        "commit {next} is no longer in the log (the latest is {latest}): its rows cannot be read; read the table again from a snapshot under a new job name (or with this job's checkpoints cleared)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The splits of the files `cursor` found, as of its snapshot.
    fn found_splits(
        &self,
        cursor: &Cursor,
        known: &std::collections::BTreeSet<String>,
    ) -> Result<Vec<Box<dyn SourceSplit>>> {
        let mut out = vec![];
        for (commit, f) in &cursor.found {
            if !known.contains(&split_id(&f.path, cursor.snapshot, Some(*commit))) {
                out.extend(self.splits(cursor.snapshot, Some(*commit), std::slice::from_ref(f))?);
            }
        }
        Ok(out)
    }

    fn cursor(&self) -> std::sync::MutexGuard<'_, Cursor> {
        self.cursor.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SourceFactory for DeltaSource {
    fn name(&self) -> &str {
        super::NAME
    }

    fn is_bounded(&self) -> bool {
        self.continuous.is_none()
    }

    fn bounding_hint(&self) -> String {
        format!("set '{SCAN_MODE}' = 'snapshot' (or remove it)")
    }

    fn discovery_interval(&self) -> Option<std::time::Duration> {
        self.continuous
    }

    /// A continuous read's files appended since the snapshot that `known`
    /// does not hold: the log walked on from where this process left it.
    fn discover(&self, known: &std::collections::BTreeSet<String>) -> Result<Vec<Box<dyn SourceSplit>>> {
        if self.continuous.is_none() {
            return Ok(vec![]);
        }
        let mut cursor = self.cursor();
        if let Some((_, why)) = &cursor.stop {
            // The readers are handed the files before the stop first: the
            // stop is raised once the enumerator has nothing more to hand.
            let before_stop = self.found_splits(&cursor, known)?;
            if before_stop.is_empty() {
                return Err(self.table.cannot_follow(why));
            }
            return Ok(before_stop);
        }
        let before = cursor.walked;
        self.walk(&mut cursor)?;
        if cursor.walked > before {
            tracing::info!(
                target: "weir::source",
                "Delta table '{}': read commits {}..={} ({} file(s) appended since version {})",
                self.table.name,
                before + 1,
                cursor.walked,
                cursor.found.len(),
                cursor.snapshot
            );
        }
        self.found_splits(&cursor, known)
    }

    fn create_splits(&self, _count: usize) -> Result<Vec<Box<dyn SourceSplit>>> {
        *self.cursor() = Cursor {
            snapshot: self.version,
            walked: self.version,
            table_keys: self.table_keys.clone(),
            ..Cursor::default()
        };
        let mut splits = self.splits(self.version, None, &self.files)?;
        if self.continuous.is_some() {
            splits.push(Box::new(SnapshotMarker { version: self.version }));
        }
        Ok(splits)
    }

    /// The version the checkpoint's splits read, listed again (the table
    /// may have moved on since); a continuous read's commits after it
    /// walked again up to the last one the checkpoint had files of (the
    /// ones after that are found as the job runs).
    fn restore_splits(&self, recorded: &[crate::checkpoint::SplitPosition]) -> Result<Vec<Box<dyn SourceSplit>>> {
        let ids: Vec<(u64, Option<u64>)> = recorded.iter().filter_map(|p| parse_id(&p.split)).collect();
        let versions: std::collections::BTreeSet<u64> = ids.iter().map(|(s, _)| *s).collect();
        let version = match versions.len() {
            // Not this source's checkpoint (no id names a version).
            0 => return self.create_splits(0),
            1 => versions.into_iter().next().unwrap_or(self.version),
            _ => {
                return Err(self.table.error(format!(
                    "the checkpoint read several versions of the table ({versions:?}); it was not taken by this source"
                )));
            }
        };
        let last_commit = ids.iter().filter_map(|(_, c)| *c).max();
        if last_commit.is_some() && self.continuous.is_none() {
            return Err(self.table.error(
                "the checkpoint was taken by a continuous read ('scan.mode' = 'continuous'); restore it into one",
            ));
        }
        let (mut splits, table_keys) = if version == self.version {
            (self.splits(self.version, None, &self.files)?, self.table_keys.clone())
        } else {
            let (version, files, keys) = list_files(
                &self.table,
                Snapshot::Version(version),
                &self.delta_schema,
                &self.partition_keys,
            )?;
            (self.splits(version, None, &files)?, keys)
        };
        let mut cursor = self.cursor();
        *cursor = Cursor {
            snapshot: version,
            walked: version,
            table_keys,
            ..Cursor::default()
        };
        if let Some(last) = last_commit {
            let log_store = self.table.unloaded()?.log_store();
            for commit in version + 1..=last {
                let files = match commit_files(&self.table, &log_store, commit, &self.delta_schema, &cursor.table_keys)?
                {
                    Some(CommitRead::Files(files)) => files,
                    Some(CommitRead::Stops(why)) => return Err(self.table.cannot_follow(why)),
                    None => {
                        return Err(self.table.cannot_follow(format!(
                            "commit {commit}, whose files the checkpoint read, is no longer in the log (Delta keeps its log for 'delta.logRetentionDuration', 30 days by default)"
                        )));
                    }
                };
                cursor.found.extend(files.into_iter().map(|f| (commit, f)));
                cursor.walked = commit;
            }
            // The checkpoint's files only (a worker given worker 0's
            // splits must make exactly those); the others of these
            // commits (found by a reader after the barrier) are not in
            // the job's known splits, so the first discovery hands them
            // out, from their start.
            let recorded_ids: std::collections::HashSet<&str> = recorded.iter().map(|p| p.split.as_str()).collect();
            for (commit, f) in &cursor.found {
                if recorded_ids.contains(split_id(&f.path, version, Some(*commit)).as_str()) {
                    splits.extend(self.splits(version, Some(*commit), std::slice::from_ref(f))?);
                }
            }
        }
        if self.continuous.is_some() {
            splits.push(Box::new(SnapshotMarker { version }));
        }
        Ok(splits)
    }
}

/// A continuous read's split of no file, whose id names the snapshot
/// (`@v7`): every reader's splits and every checkpoint carry the version
/// even when the snapshot has no file, so a worker of a job spread over
/// processes (given worker 0's splits) and a restore walk the log from the
/// same version. It ends at once.
struct SnapshotMarker {
    version: u64,
}

impl SourceSplit for SnapshotMarker {
    fn id(&self) -> String {
        split_id("", self.version, None)
    }

    fn offset(&self) -> u64 {
        0
    }

    fn seek(&mut self, _position: u64) -> Result<()> {
        Ok(())
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        Ok(SplitPoll::Finished)
    }
}

/// A data file of the snapshot, read a row group at a time: its footer,
/// then each row group's bytes with one ranged read, so a reader holds one
/// row group of each of its files (not whole files) and a restore skips
/// whole row groups without fetching them.
struct DeltaSplit {
    table: Arc<DeltaLocation>,
    store: Arc<dyn object_store::ObjectStore>,
    file: DataFile,
    id: String,
    /// The version that holds the file (the snapshot, or the commit that
    /// appended it).
    version: u64,
    schema: SchemaRef,
    delta_schema: SchemaRef,
    /// The file's footer, once read.
    footer: Option<ArrowReaderMetadata>,
    /// The next row group to read.
    next_group: usize,
    reader: Option<ParquetRecordBatchReader>,
    done: bool,
    /// Rows emitted (the checkpointed position).
    rows: u64,
    /// After a seek: rows to pass over without emitting them.
    skip: u64,
}

/// Bytes `base..base + bytes.len()` of a file of `len` bytes: what a
/// Parquet reader may ask of one fetched range (a row group, the footer).
struct Window {
    base: u64,
    bytes: bytes::Bytes,
    len: u64,
}

impl parquet::file::reader::Length for Window {
    fn len(&self) -> u64 {
        self.len
    }
}

impl parquet::file::reader::ChunkReader for Window {
    type T = bytes::buf::Reader<bytes::Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use bytes::Buf;
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        self.slice(start, Some(length))
    }
}

impl Window {
    fn slice(&self, start: u64, length: Option<usize>) -> parquet::errors::Result<bytes::Bytes> {
        let outside = || {
            parquet::errors::ParquetError::General(format!(
                "bytes from {start} are outside the range read ({}..{})",
                self.base,
                self.base + self.bytes.len() as u64
            ))
        };
        let from = start.checked_sub(self.base).ok_or_else(outside)? as usize;
        let to = length.map_or(self.bytes.len(), |l| from + l);
        if from > self.bytes.len() || to > self.bytes.len() {
            return Err(outside());
        }
        Ok(self.bytes.slice(from..to))
    }
}

impl DeltaSplit {
    fn error(&self, message: impl std::fmt::Display) -> ExecError {
        self.table
            .error(format!("file {} (version {}): {message}", self.file.path, self.version))
    }

    /// Bytes `range` of the file.
    fn fetch(&self, range: std::ops::Range<u64>) -> Result<bytes::Bytes> {
        let (store, key) = (self.store.clone(), self.file.key.clone());
        block_on("a Delta table", async move { store.get_range(&key, range).await })
            .map_err(|e| self.error(e))?
            .map_err(|e| self.error(format!("cannot read it: {e}")))
    }

    /// The file's footer: its last 64 KiB, or more if the metadata is
    /// longer.
    fn read_footer(&self) -> Result<ArrowReaderMetadata> {
        let size = self.file.size;
        let not_parquet = |e: &dyn std::fmt::Display| self.error(format!("not a readable parquet file: {e}"));
        if size < 8 {
            return Err(not_parquet(&format!("{size} bytes")));
        }
        let mut tail = self.fetch(size.saturating_sub(64 << 10)..size)?;
        let footer: [u8; 8] = tail[tail.len() - 8..]
            .try_into()
            .map_err(|_| not_parquet(&"no footer"))?;
        let needed = parquet::file::metadata::FooterTail::try_new(&footer)
            .map_err(|e| not_parquet(&e))?
            .metadata_length() as u64
            + 8;
        if needed > size {
            return Err(not_parquet(&format!(
                "its footer says {needed} bytes of metadata, the file has {size}"
            )));
        }
        if needed > tail.len() as u64 {
            tail = self.fetch(size - needed..size)?;
        }
        let at = tail.len() - needed as usize;
        let metadata = parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&tail[at..tail.len() - 8])
            .map_err(|e| not_parquet(&e))?;
        ArrowReaderMetadata::try_new(Arc::new(metadata), Default::default()).map_err(|e| not_parquet(&e))
    }

    /// A reader of the next row group, its rows the DDL's columns the file
    /// holds (partition columns are not in it; a column added to the table
    /// after the file was written is not either, and reads as NULL).
    /// `None` when no row group is left.
    fn open_next(&mut self) -> Result<Option<ParquetRecordBatchReader>> {
        if self.footer.is_none() {
            self.footer = Some(self.read_footer()?);
        }
        let Some(footer) = self.footer.clone() else {
            return Ok(None);
        };
        let metadata = footer.metadata().clone();
        // A restore passes over whole row groups without reading them.
        while self.next_group < metadata.num_row_groups() {
            let n = metadata.row_group(self.next_group).num_rows().max(0) as u64;
            if self.skip < n {
                break;
            }
            self.skip -= n;
            self.rows += n;
            self.next_group += 1;
        }
        if self.next_group >= metadata.num_row_groups() {
            return Ok(None);
        }
        let group = metadata.row_group(self.next_group);
        let (mut from, mut to) = (u64::MAX, 0u64);
        for c in group.columns() {
            let (start, len) = c.byte_range();
            from = from.min(start);
            to = to.max(start + len);
        }
        let bytes = if from < to {
            self.fetch(from..to)?
        } else {
            bytes::Bytes::new()
        };
        let window = Window {
            base: from.min(to),
            bytes,
            len: self.file.size,
        };
        let file_schema = footer.schema().clone();
        let mut roots = vec![];
        for f in self.delta_schema.fields() {
            if self.file.partition.contains_key(f.name()) {
                continue;
            }
            match file_schema.index_of(f.name()) {
                Ok(i) => roots.push(i),
                Err(_) if f.is_nullable() => {}
                Err(_) => return Err(self.error(format!("column '{}' (NOT NULL) is not in the file", f.name()))),
            }
        }
        let mask = ProjectionMask::roots(footer.parquet_schema(), roots);
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(window, footer)
            .with_projection(mask)
            .with_row_groups(vec![self.next_group])
            .with_batch_size(DEFAULT_BATCH_ROWS)
            .build()
            .map_err(|e| self.error(e))?;
        self.next_group += 1;
        Ok(Some(reader))
    }
}

impl SourceSplit for DeltaSplit {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn offset(&self) -> u64 {
        self.rows
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        self.skip = position;
        Ok(())
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        loop {
            if self.done {
                return Ok(SplitPoll::Finished);
            }
            if self.reader.is_none() {
                match self.open_next()? {
                    Some(r) => self.reader = Some(r),
                    None => {
                        self.done = true;
                        return Ok(SplitPoll::Finished);
                    }
                }
            }
            let Some(reader) = self.reader.as_mut() else {
                continue;
            };
            let mut batch = match reader.next() {
                None => {
                    // The row group is read: its bytes go.
                    self.reader = None;
                    continue;
                }
                Some(Ok(b)) => b,
                Some(Err(e)) => return Err(self.error(format!("read failed after row {}: {e}", self.rows))),
            };
            if self.skip > 0 {
                let k = self.skip.min(batch.num_rows() as u64);
                self.skip -= k;
                self.rows += k;
                batch = batch.slice(k as usize, batch.num_rows() - k as usize);
            }
            if batch.num_rows() == 0 {
                continue;
            }
            let n = batch.num_rows();
            self.rows += n as u64;
            let full = super::committer::full_batch(&batch, &self.delta_schema, &self.file.partition)
                .map_err(|e| self.error(e))?;
            let out = crate::operators::calc::batch_of_rows(&self.schema, full.columns().to_vec(), n)?;
            return Ok(SplitPoll::Batch(out));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_unless_they_say_otherwise() {
        let t = |s: &str| parse_time(s).map(|t| t.to_rfc3339());
        assert_eq!(t("2026-12-07 08:00:00").as_deref(), Ok("2026-12-07T08:00:00+00:00"));
        assert_eq!(
            t("2026-12-07 08:00:00.250").as_deref(),
            Ok("2026-12-07T08:00:00.250+00:00")
        );
        assert_eq!(
            t("2026-12-07T09:00:00+01:00").as_deref(),
            Ok("2026-12-07T08:00:00+00:00")
        );
        assert_eq!(t("2026-12-07").as_deref(), Ok("2026-12-07T00:00:00+00:00"));
        assert!(t("yesterday").is_err_and(|e| e.contains("YYYY-MM-DD")));
    }

    #[test]
    fn a_split_id_names_its_snapshot_and_commit() {
        let id = split_id("k=a b/part-1.parquet", 7, None);
        assert_eq!(id, "k=a b/part-1.parquet@v7");
        assert_eq!(parse_id(&id), Some((7, None)));
        let id = split_id("x@v1/part-2.parquet", 7, Some(12));
        assert_eq!(id, "x@v1/part-2.parquet@v7+12");
        assert_eq!(parse_id(&id), Some((7, Some(12))));
        assert_eq!(parse_id("part-3.parquet"), None);
    }
}
