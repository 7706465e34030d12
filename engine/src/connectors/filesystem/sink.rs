//! Writing files, exactly once: a two-phase-commit sink (Flink's FileSink).
//!
//! Each sink subtask writes part files `part-<job>-<attempt>-<subtask>-<n>.<ext>`
//! through the protocol of [`super::part_file`]: hidden while in progress,
//! pending (durable, invisible) from the checkpoint barrier, visible when
//! the checkpoint completes. Part files roll on every checkpoint, as
//! Flink's bulk formats do.
//!
//! Without checkpointing, the file is committed at end of input.
//!
//! A table whose `path` is an object-store URL spools each part to a local
//! file and commits it by a multipart upload ([`super::object_files`]).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::{CastOptions, cast, cast_with_options};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::util::display::FormatOptions as DisplayOptions;
use parquet::arrow::ArrowWriter;
use weir_catalog::Options;

use super::object_files::ObjectFiles;
use super::part_file::{PartFiles, io_err};
use super::partition::{CommitPolicy, FileCommitter, Partitioning, commit_info};
use super::{Format, FormatOptions, format_options, path_of};
use crate::connectors::{Committer, CommittingWriter, SinkContext, SinkFactory, SinkWriter};
use crate::error::{ConnectorError, Result};
use crate::operators::{Collector, Operator};

#[derive(Debug)]
pub struct FileSink {
    /// The table's directory, or (on an object store) its URL.
    dir: PathBuf,
    /// The table is on an object store.
    remote: Option<Arc<ObjectFiles>>,
    format: FormatOptions,
    /// The table's physical columns.
    schema: SchemaRef,
    /// `PARTITIONED BY`: the partition columns' indexes in `schema`, and
    /// how their values name directories.
    partitioning: Option<(Vec<usize>, Partitioning)>,
    commit: Option<CommitPolicy>,
    rolling: RollingPolicy,
    /// Partitions written by jobs without checkpointing, committed when
    /// the job ends.
    written: Arc<Mutex<BTreeSet<String>>>,
}

/// When a part file is closed besides checkpoints.
#[derive(Debug, Clone, Copy)]
struct RollingPolicy {
    file_size: u64,
    rollover: Duration,
    check: Duration,
}

impl FileSink {
    pub fn new(
        options: &Options,
        schema: SchemaRef,
        partition_keys: &[String],
        s3: &crate::checkpoint::objects::S3Settings,
    ) -> Result<Self> {
        let remote = ObjectFiles::of_table(options, s3)?;
        let partitioning = if partition_keys.is_empty() {
            None
        } else {
            let idx = partition_keys
                .iter()
                .map(|k| schema.index_of(k))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Some((
                idx,
                Partitioning {
                    keys: partition_keys.to_vec(),
                    default_name: options
                        .get(super::partition::DEFAULT_NAME_OPTION)
                        .unwrap_or("__DEFAULT_PARTITION__")
                        .to_string(),
                },
            ))
        };
        let commit = if partition_keys.is_empty() {
            None
        } else {
            CommitPolicy::from_options(options, partition_keys)?
        };
        Ok(Self {
            dir: path_of(options)?,
            remote,
            format: format_options(options)?,
            schema,
            partitioning,
            commit,
            rolling: RollingPolicy {
                file_size: options.memory_size(super::ROLLING_FILE_SIZE)?.unwrap_or(128 << 20),
                rollover: options
                    .duration(super::ROLLOVER_INTERVAL)?
                    .unwrap_or(Duration::from_secs(30 * 60)),
                check: options
                    .duration(super::ROLLING_CHECK_INTERVAL)?
                    .unwrap_or(Duration::from_secs(60))
                    .max(Duration::from_millis(10)),
            },
            written: Arc::new(Mutex::new(BTreeSet::new())),
        })
    }

    /// The columns written into files: all but the partition columns.
    fn file_columns(&self) -> Vec<usize> {
        let skip = self.partitioning.as_ref().map(|(idx, _)| idx.as_slice()).unwrap_or(&[]);
        (0..self.schema.fields().len()).filter(|i| !skip.contains(i)).collect()
    }
}

impl SinkFactory for FileSink {
    fn name(&self) -> &str {
        "filesystem"
    }

    fn accepts_changes(&self) -> bool {
        self.format.format.is_changelog()
    }

    fn requires_update_before(&self) -> bool {
        self.format.format.is_changelog()
    }

    fn changes_hint(&self) -> String {
        "; formats 'debezium-json', 'canal-json' and 'maxwell-json' write changes (an update as a delete and an insert)"
            .into()
    }

    fn create_writer(&self, subtask: usize, parallelism: usize, ctx: &SinkContext) -> Result<SinkWriter> {
        let stem = format!("part-{}-{}-{subtask}", ctx.job_tag, ctx.attempt);
        // On an object store, parts are spooled in a local directory of
        // their own until they go up.
        let spool = match &self.remote {
            Some(_) => {
                let io = |source| ConnectorError::Io {
                    path: ctx.spool_dir.display().to_string(),
                    source,
                };
                std::fs::create_dir_all(&ctx.spool_dir).map_err(io)?;
                Some(
                    tempfile::Builder::new()
                        .prefix(&format!("{stem}-"))
                        .tempdir_in(&ctx.spool_dir)
                        .map_err(io)?,
                )
            }
            None => {
                std::fs::create_dir_all(&self.dir).map_err(|source| ConnectorError::Io {
                    path: self.dir.display().to_string(),
                    source,
                })?;
                None
            }
        };
        let ext = match self.format.format {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
            _ => "json",
        };
        let columns = self.file_columns();
        let file_schema = Arc::new(self.schema.project(&columns)?);
        Ok(SinkWriter::Committing(Box::new(FileWriter {
            dir: spool
                .as_ref()
                .map(|s| s.path().to_path_buf())
                .unwrap_or_else(|| self.dir.clone()),
            remote: self.remote.clone(),
            _spool: spool,
            stem,
            ext,
            exactly_once: ctx.exactly_once,
            format: self.format.clone(),
            columns,
            schema: file_schema,
            partitioning: self.partitioning.clone(),
            reports: self.commit.is_some(),
            rolling: self.rolling,
            names: HashMap::new(),
            open: HashMap::new(),
            rolled: vec![],
            touched: BTreeSet::new(),
            watermark: None,
            ended: false,
            subtask,
            parallelism,
            written: self.written.clone(),
            buffer: vec![],
        })))
    }

    fn committer(&self, ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
        // `<attempt>-<subtask>-<n>` follow the prefix.
        Some(Arc::new(FileCommitter::new(
            self.dir.clone(),
            format!(".part-{}-", ctx.job_tag),
            self.commit.clone(),
            self.written.clone(),
            self.partitioning.is_some(),
            ctx.clock.clone(),
            self.remote.clone(),
        )))
    }
}

/// A Parquet writer's error: an I/O error (a full disk) keeps its OS
/// error; anything else is data the format cannot hold.
fn parquet_err(path: &Path, e: parquet::errors::ParquetError) -> ConnectorError {
    match e {
        parquet::errors::ParquetError::External(inner) => match inner.downcast::<std::io::Error>() {
            Ok(source) => io_err(path, *source),
            Err(other) => ConnectorError::Data {
                location: path.display().to_string(),
                message: other.to_string(),
            },
        },
        other => ConnectorError::Data {
            location: path.display().to_string(),
            message: other.to_string(),
        },
    }
}

/// An Arrow writer's error: an I/O error (a full disk) names the file and
/// keeps its OS error.
fn arrow_err(path: &Path, e: arrow::error::ArrowError) -> crate::error::ExecError {
    match e {
        arrow::error::ArrowError::IoError(_, source) => io_err(path, source).into(),
        other => other.into(),
    }
}

// One per writer: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Out {
    Text(BufWriter<File>),
    Parquet(ArrowWriter<File>),
}

/// An open part file of one partition.
struct OpenPart {
    out: Out,
    /// Bytes written to it (text formats).
    bytes: u64,
    opened: Instant,
}

struct FileWriter {
    /// Where part files are written: the table's directory, or a local
    /// spool for a table on an object store (`remote`).
    dir: PathBuf,
    remote: Option<Arc<ObjectFiles>>,
    /// Deleted with the writer.
    _spool: Option<tempfile::TempDir>,
    /// `part-<job>-<attempt>-<subtask>`.
    stem: String,
    ext: &'static str,
    exactly_once: bool,
    format: FormatOptions,
    /// The input columns written into files, and their schema.
    columns: Vec<usize>,
    schema: SchemaRef,
    partitioning: Option<(Vec<usize>, Partitioning)>,
    /// Partitions are committed: each checkpoint reports them.
    reports: bool,
    rolling: RollingPolicy,
    /// Per partition directory ("" unpartitioned), its part file names.
    names: HashMap<String, PartFiles>,
    open: HashMap<String, OpenPart>,
    /// Parts closed since the last checkpoint (their committables).
    rolled: Vec<serde_json::Value>,
    /// Partitions written since the last checkpoint.
    touched: BTreeSet<String>,
    watermark: Option<i64>,
    ended: bool,
    subtask: usize,
    parallelism: usize,
    written: Arc<Mutex<BTreeSet<String>>>,
    /// Reused for the text of a batch.
    buffer: Vec<u8>,
}

impl FileWriter {
    fn files(&mut self, partition: &str) -> &mut PartFiles {
        let dir = if partition.is_empty() {
            self.dir.clone()
        } else {
            self.dir.join(partition)
        };
        let stem = &self.stem;
        let ext = self.ext;
        let remote = &self.remote;
        self.names.entry(partition.to_string()).or_insert_with(|| {
            let files = PartFiles::new(dir, stem.clone(), ext, "sink.pre_committed");
            match remote {
                Some(parts) => files.on_object_store(parts.clone(), partition.to_string()),
                None => files,
            }
        })
    }

    /// The open part of `partition`, opened if need be.
    fn open(&mut self, partition: &str) -> Result<&mut OpenPart> {
        if !self.open.contains_key(partition) {
            let path = self.files(partition).in_progress_path();
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
            }
            let f = File::create(&path).map_err(|e| io_err(&path, e))?;
            let out = match self.format.format {
                Format::Parquet => {
                    let props = parquet::file::properties::WriterProperties::builder()
                        .set_compression(self.format.parquet_compression)
                        .build();
                    Out::Parquet(
                        ArrowWriter::try_new(f, self.schema.clone(), Some(props)).map_err(|e| parquet_err(&path, e))?,
                    )
                }
                _ => Out::Text(BufWriter::with_capacity(1 << 20, f)),
            };
            self.open.insert(
                partition.to_string(),
                OpenPart {
                    out,
                    bytes: 0,
                    opened: Instant::now(),
                },
            );
            if self.partitioning.is_some() {
                self.touched.insert(partition.to_string());
            }
        }
        self.open
            .get_mut(partition)
            .ok_or_else(|| crate::error::ExecError::internal("file writer not open"))
    }

    /// Closes `partition`'s part file and makes it durable; then, with
    /// checkpoints, it becomes pending (its committable kept for the next
    /// checkpoint), else visible at once.
    fn roll(&mut self, partition: &str) -> Result<()> {
        let Some(part) = self.open.remove(partition) else {
            return Ok(());
        };
        let path = self.files(partition).in_progress_path();
        match part.out {
            Out::Text(mut w) => {
                w.flush().map_err(|e| io_err(&path, e))?;
                w.get_ref().sync_all().map_err(|e| io_err(&path, e))?;
            }
            Out::Parquet(w) => {
                let f = w.into_inner().map_err(|e| parquet_err(&path, e))?;
                f.sync_all().map_err(|e| io_err(&path, e))?;
            }
        }
        if self.exactly_once {
            let mut c = self.files(partition).pre_commit()?;
            if !partition.is_empty() {
                // Committables name files relative to the table's path.
                for k in ["pending", "target"] {
                    if let Some(name) = c[k].as_str() {
                        c[k] = serde_json::Value::String(format!("{partition}/{name}"));
                    }
                }
            }
            self.rolled.push(c);
        } else {
            self.files(partition).commit_now()?;
            if self.partitioning.is_some() {
                self.written
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(partition.to_string());
            }
        }
        Ok(())
    }

    /// Phase one at a checkpoint: every open part becomes pending; the
    /// committables of those and of the parts rolled since the last
    /// checkpoint, and (partitions committed) what this writer reports.
    fn pre_commit_files(&mut self) -> Result<Vec<serde_json::Value>> {
        let open: Vec<String> = self.open.keys().cloned().collect();
        for p in open {
            self.roll(&p)?;
        }
        let mut out = std::mem::take(&mut self.rolled);
        if self.reports {
            out.push(commit_info(
                &std::mem::take(&mut self.touched),
                self.watermark,
                self.ended,
                self.subtask,
                self.parallelism,
            ));
        }
        Ok(out)
    }

    /// Appends `text` (a batch as lines) to `partition`'s part; rolls it
    /// once it is large enough.
    fn write_text(&mut self, partition: &str, text: &[u8]) -> Result<()> {
        let path = self.files(partition).in_progress_path();
        let part = self.open(partition)?;
        match &mut part.out {
            Out::Text(w) => w.write_all(text).map_err(|e| io_err(&path, e))?,
            Out::Parquet(_) => {
                return Err(crate::error::ExecError::internal("a text format opened a parquet file"));
            }
        }
        part.bytes += text.len() as u64;
        if part.bytes >= self.rolling.file_size {
            self.roll(partition)?;
        }
        Ok(())
    }

    /// Writes `batch` (file columns only) into `partition`.
    fn write_rows(&mut self, partition: &str, batch: &RecordBatch) -> Result<()> {
        let format = self.format.clone();
        if format.format == Format::Parquet {
            let path = self.files(partition).in_progress_path();
            let part = self.open(partition)?;
            let Out::Parquet(w) = &mut part.out else {
                return Err(crate::error::ExecError::internal("parquet opened a text file"));
            };
            w.write(batch).map_err(|e| parquet_err(&path, e))?;
            let size = (w.bytes_written() + w.in_progress_size()) as u64;
            if size >= self.rolling.file_size {
                self.roll(partition)?;
            }
            return Ok(());
        }
        let text = self.stringify_timestamps(batch)?;
        let path = self.files(partition).in_progress_path();
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        if format.format == Format::Json {
            // NULLs written out (`"x":null`), in rows and maps, as Flink's
            // json format does (`json.encode.ignore-null-fields` false).
            let mut jw = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(&mut buffer);
            jw.write(&text).map_err(|e| arrow_err(&path, e))?;
            jw.finish().map_err(|e| arrow_err(&path, e))?;
        } else {
            let mut builder = arrow::csv::WriterBuilder::new()
                .with_header(false)
                .with_delimiter(format.delimiter)
                .with_quote(format.quote);
            if let Some(null) = &format.null_literal {
                builder = builder.with_null(null.clone());
            }
            let mut cw = builder.build(&mut buffer);
            cw.write(&text).map_err(|e| arrow_err(&path, e))?;
        }
        let r = self.write_text(partition, &buffer);
        self.buffer = buffer;
        r
    }

    /// Changes as envelopes of the changelog format, one line each.
    fn write_changes(&mut self, partition: &str, changes: crate::change::ChangeBatch) -> Result<()> {
        let text = self.stringify_timestamps(&changes.rows)?;
        let path = self.files(partition).in_progress_path();
        let mut json = Vec::new();
        {
            let mut jw = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(&mut json);
            jw.write(&text).map_err(|e| arrow_err(&path, e))?;
            jw.finish().map_err(|e| arrow_err(&path, e))?;
        }
        let lines = super::changelog::envelopes(self.format.format, &changes, &json)?;
        self.write_text(partition, &lines)
    }

    /// The batch's rows by partition directory, each with the file
    /// columns only (named as the sink table names them).
    fn split(&self, batch: &crate::change::ChangeBatch) -> Result<Vec<(String, crate::change::ChangeBatch)>> {
        let project = |b: &crate::change::ChangeBatch| -> Result<crate::change::ChangeBatch> {
            let cols = self.columns.iter().map(|i| b.rows.column(*i).clone()).collect();
            Ok(b.with_rows(RecordBatch::try_new(self.schema.clone(), cols)?))
        };
        let Some((idx, partitioning)) = &self.partitioning else {
            return Ok(vec![(String::new(), project(batch)?)]);
        };
        let values = idx
            .iter()
            .map(|i| cast(batch.rows.column(*i), &DataType::Utf8))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let values: Vec<&arrow::array::StringArray> = values.iter().map(|v| v.as_string::<i32>()).collect();
        let mut rows_of: HashMap<String, Vec<u32>> = HashMap::new();
        let mut order = vec![];
        for r in 0..batch.num_rows() {
            let row: Vec<Option<&str>> = values.iter().map(|v| (!v.is_null(r)).then(|| v.value(r))).collect();
            let dir = partitioning.dir(&row);
            let e = rows_of.entry(dir.clone()).or_insert_with(|| {
                order.push(dir);
                vec![]
            });
            e.push(r as u32);
        }
        let mut out = vec![];
        for dir in order {
            let rows = &rows_of[&dir];
            let part = if rows.len() == batch.num_rows() {
                project(batch)?
            } else {
                project(&batch.take(&arrow::array::UInt32Array::from(rows.clone()))?)?
            };
            out.push((dir, part));
        }
        Ok(out)
    }

    /// Timestamps as text the way Flink writes them.
    fn stringify_timestamps(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        stringify_timestamps(batch, self.format.iso_timestamps)
    }
}

/// `batch` with its timestamps as text the way Flink's json and csv formats
/// write them: `yyyy-MM-dd HH:mm:ss[.fraction]` (`iso`: a `T` between),
/// a TIMESTAMP_LTZ with `Z` after ([`crate::time_format::write_timestamp_text`]).
/// Shared with Kafka.
pub(crate) fn stringify_timestamps(batch: &RecordBatch, iso: bool) -> Result<RecordBatch> {
    // Years past 9999 (chrono's `%.f`: the fraction in 0, 3, 6 or 9 digits).
    let (format, zoned) = if iso {
        ("%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.fZ")
    } else {
        ("%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.fZ")
    };
    let opts = CastOptions {
        safe: false,
        format_options: DisplayOptions::default()
            .with_timestamp_format(Some(format))
            .with_timestamp_tz_format(Some(zoned)),
    };
    let mut fields = vec![];
    let mut cols: Vec<ArrayRef> = vec![];
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        if let Some(text) = fast_timestamp_text(c, iso) {
            cols.push(text);
            fields.push(Field::new(f.name(), DataType::Utf8, f.is_nullable()));
        } else if matches!(f.data_type(), DataType::Timestamp(_, _)) {
            cols.push(cast_with_options(c, &DataType::Utf8, &opts)?);
            fields.push(Field::new(f.name(), DataType::Utf8, f.is_nullable()));
        } else {
            cols.push(c.clone());
            fields.push(f.as_ref().clone());
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

/// A UTC (or zone-less) timestamp column as text by
/// [`crate::time_format::write_timestamp_text`]; `None` when another zone
/// or a year beyond 9999 needs the general cast.
fn fast_timestamp_text(c: &ArrayRef, iso: bool) -> Option<ArrayRef> {
    use arrow::array::AsArray;
    use arrow::datatypes::{
        TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
    };
    let DataType::Timestamp(unit, tz) = c.data_type() else {
        return None;
    };
    if tz.as_deref().is_some_and(|z| !matches!(z, "UTC" | "+00:00" | "Z")) {
        return None;
    }
    let (values, ticks): (&[i64], i64) = match unit {
        TimeUnit::Second => (c.as_primitive::<TimestampSecondType>().values(), 1),
        TimeUnit::Millisecond => (c.as_primitive::<TimestampMillisecondType>().values(), 1000),
        TimeUnit::Microsecond => (c.as_primitive::<TimestampMicrosecondType>().values(), 1_000_000),
        TimeUnit::Nanosecond => (c.as_primitive::<TimestampNanosecondType>().values(), 1_000_000_000),
    };
    let mut out = arrow::array::StringBuilder::with_capacity(c.len(), c.len() * 24);
    let mut text = String::with_capacity(30);
    for (i, v) in values.iter().enumerate() {
        if c.is_null(i) {
            out.append_null();
            continue;
        }
        text.clear();
        crate::time_format::write_timestamp_text(*v, ticks, iso, tz.is_some(), &mut text)?;
        out.append_value(&text);
    }
    Some(Arc::new(out.finish()))
}

impl Operator for FileWriter {
    fn name(&self) -> &str {
        "Sink: filesystem"
    }

    fn process_batch(&mut self, batch: crate::change::ChangeBatch, _out: &mut Collector) -> Result<()> {
        if !self.format.format.is_changelog() && !batch.is_insert_only() {
            batch.into_inserts("filesystem sink")?;
            return Ok(());
        }
        for (partition, part) in self.split(&batch)? {
            if self.format.format.is_changelog() {
                self.write_changes(&partition, part)?;
            } else {
                self.write_rows(&partition, &part.rows)?;
            }
        }
        Ok(())
    }

    fn on_watermark(&mut self, watermark: crate::message::Timestamp, _out: &mut Collector) -> Result<()> {
        self.watermark = Some(watermark);
        Ok(())
    }

    fn processing_time_interval(&self) -> Option<Duration> {
        Some(self.rolling.check)
    }

    fn on_processing_time(&mut self, _now: i64, _out: &mut Collector) -> Result<()> {
        let old: Vec<String> = self
            .open
            .iter()
            .filter(|(_, p)| p.opened.elapsed() >= self.rolling.rollover)
            .map(|(k, _)| k.clone())
            .collect();
        for p in old {
            self.roll(&p)?;
        }
        Ok(())
    }

    fn on_end_of_input(&mut self, _out: &mut Collector) -> Result<()> {
        self.ended = true;
        if self.exactly_once {
            // Committed by the final checkpoint (`final_snapshot`).
            return Ok(());
        }
        let open: Vec<String> = self.open.keys().cloned().collect();
        for p in open {
            self.roll(&p)?;
        }
        Ok(())
    }
}

impl CommittingWriter for FileWriter {
    fn pre_commit(&mut self, _checkpoint_id: u64) -> Result<Vec<serde_json::Value>> {
        self.pre_commit_files()
    }

    fn final_pre_commit(&mut self) -> Result<Vec<serde_json::Value>> {
        self.pre_commit_files()
    }
}
