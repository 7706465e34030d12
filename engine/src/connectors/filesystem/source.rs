//! Reading files. Each file is a split with its own offset (rows read).
//! Bad records fail the job with the file and line (json, csv) or row group
//! (parquet), are skipped (`*.ignore-parse-errors`), or are set aside for
//! the dead-letter directory (`scan.dead-letter.path`).
//!
//! The checkpointed position of a json or csv file is the number of lines
//! consumed (good, bad, blank and comment lines alike): every line before
//! it, and no line after it, had its rows emitted or was set aside when
//! the reader took the position (a poll consumes whole lines, and the
//! reader takes the bad records after every poll). That is what keeps dead
//! letters exactly once across a restore; rows alone could not tell which
//! bad lines between two good rows were already set aside. Parquet files
//! have no lines: their position is rows.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use weir_catalog::Options;

use super::object_files::ObjectFiles;
use super::partition::Partitioning;
use super::records::{Chunk, CsvQuoting, RawRecord, RecordReader, lines_before, range_starts};
use super::text_time;
use super::{Format, FormatOptions, dead_letter_path_of, format_options, path_of};
use crate::connectors::dead_letter::BadRecord;
use crate::connectors::{DEFAULT_BATCH_ROWS, SourceFactory, SourceSplit, SplitPoll, config_error};
use crate::error::{ConnectorError, Result};
use datafusion::common::ScalarValue;

pub const MIN_SPLIT_OPTION: &str = "source.split.min-size";
/// Flink's continuous file source: the path listed again at this
/// interval, each new file read once.
pub const MONITOR_OPTION: &str = "source.monitor-interval";
pub const DEFAULT_MIN_SPLIT: i64 = 8 << 20;

#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    format: FormatOptions,
    schema: SchemaRef,
    dead_letters: Option<PathBuf>,
    /// `scan.lines-per-second` (0: unlimited).
    lines_per_second: u64,
    /// `source.split.min-size`: the smallest byte range a file is cut into.
    min_range_bytes: u64,
    /// `PARTITIONED BY`: files are found in the partition directories;
    /// partition columns come from their names, not from the files.
    partitioning: Option<Partitioning>,
    /// The table is on an object store (`path` is its URL).
    remote: Option<Arc<ObjectFiles>>,
    /// `source.monitor-interval`: unbounded, the path listed again at this
    /// interval and each file not seen before read once, whole (a file is
    /// known by its path: one changed after it was read is not read
    /// again, as in Flink).
    monitor: Option<std::time::Duration>,
}

impl FileSource {
    pub fn new(
        options: &Options,
        schema: SchemaRef,
        partition_keys: &[String],
        s3: &crate::checkpoint::objects::S3Settings,
    ) -> Result<Self> {
        let remote = ObjectFiles::of_table(options, s3)?;
        Ok(Self {
            path: match &remote {
                Some(r) => PathBuf::from(r.url()),
                None => path_of(options)?,
            },
            remote,
            format: format_options(options)?,
            schema,
            dead_letters: dead_letter_path_of(options),
            lines_per_second: options.i64("scan.lines-per-second")?.unwrap_or(0).max(0) as u64,
            min_range_bytes: options.i64(MIN_SPLIT_OPTION)?.unwrap_or(DEFAULT_MIN_SPLIT).max(1) as u64,
            monitor: options.duration(MONITOR_OPTION)?,
            partitioning: (!partition_keys.is_empty()).then(|| Partitioning {
                keys: partition_keys.to_vec(),
                default_name: options
                    .get(super::partition::DEFAULT_NAME_OPTION)
                    .unwrap_or("__DEFAULT_PARTITION__")
                    .to_string(),
            }),
        })
    }

    /// The columns a file holds (a partitioned table's files hold all
    /// but the partition columns).
    fn file_schema(&self) -> SchemaRef {
        match &self.partitioning {
            None => self.schema.clone(),
            Some(p) => std::sync::Arc::new(arrow::datatypes::Schema::new(
                self.schema
                    .fields()
                    .iter()
                    .filter(|f| !p.keys.contains(f.name()))
                    .cloned()
                    .collect::<Vec<_>>(),
            )),
        }
    }

    /// The visible files of the partition directories below the path
    /// (`k=v` to the depth of the partition keys), sorted.
    fn partition_files(&self, p: &Partitioning) -> Result<Vec<PathBuf>> {
        let io = |path: &std::path::Path, source| ConnectorError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut files = vec![];
        let mut stack = vec![(self.path.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            for entry in std::fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
                let entry = entry.map_err(|e| io(&dir, e))?;
                let name = entry.file_name().to_string_lossy().to_string();
                if name.starts_with('.') || name.starts_with('_') {
                    continue;
                }
                let kind = entry.file_type().map_err(|e| io(&entry.path(), e))?;
                if depth < p.keys.len() {
                    if kind.is_dir() && name.contains('=') {
                        stack.push((entry.path(), depth + 1));
                    }
                } else if kind.is_file() {
                    files.push(entry.path());
                }
            }
        }
        files.sort();
        Ok(files)
    }

    /// The values of the partition columns of `file` (from its
    /// directories), typed as the table declares them, by column index.
    fn partition_values(&self, p: &Partitioning, file: &std::path::Path) -> Result<Vec<(usize, ScalarValue)>> {
        let rel = file
            .parent()
            .and_then(|d| d.strip_prefix(&self.path).ok())
            .map(|d| d.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/"))
            .unwrap_or_default();
        let bad = |message: String| -> crate::error::ExecError {
            ConnectorError::Data {
                location: file.display().to_string(),
                message,
            }
            .into()
        };
        let values = p.values_of(&rel).ok_or_else(|| {
            bad(format!(
                "'{rel}' is not a partition directory of ({})",
                p.keys.join(", ")
            ))
        })?;
        let mut out = vec![];
        for (k, v) in p.keys.iter().zip(values) {
            let Ok(i) = self.schema.index_of(k) else {
                // Not read by this query.
                continue;
            };
            let ty = self.schema.field(i).data_type();
            let text: arrow::array::ArrayRef = std::sync::Arc::new(arrow::array::StringArray::from(vec![v.clone()]));
            let typed = arrow::compute::cast_with_options(
                &text,
                ty,
                &arrow::compute::CastOptions {
                    safe: false,
                    ..Default::default()
                },
            )
            .map_err(|e| {
                bad(format!(
                    "partition value {k}={} is not a {ty}: {e}",
                    v.unwrap_or_default()
                ))
            })?;
            out.push((i, ScalarValue::try_from_array(&typed, 0)?));
        }
        Ok(out)
    }

    /// The files to read: the path itself, or the visible files of a
    /// directory (names starting with '.' or '_' are in-progress or
    /// metadata files, as in Flink), sorted by name.
    fn files(&self) -> Result<Vec<PathBuf>> {
        if let Some(remote) = &self.remote {
            let depth = self.partitioning.as_ref().map(|p| p.keys.len());
            // A monitored path may be empty until files arrive (an object
            // store has no empty directory to tell it from a misspelt one).
            return Ok(remote
                .list_visible(depth, self.monitor.is_some())?
                .into_iter()
                .map(|rel| {
                    if rel.is_empty() {
                        self.path.clone()
                    } else {
                        self.path.join(rel)
                    }
                })
                .collect());
        }
        let io = |source| ConnectorError::Io {
            path: self.path.display().to_string(),
            source,
        };
        let meta = std::fs::metadata(&self.path).map_err(io)?;
        if let Some(p) = &self.partitioning
            && meta.is_dir()
        {
            return self.partition_files(p);
        }
        if meta.is_file() {
            return Ok(vec![self.path.clone()]);
        }
        let mut files = vec![];
        for entry in std::fs::read_dir(&self.path).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            if entry.file_type().map_err(io)?.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }
}

impl FileSource {
    /// Whether text files may be cut into byte ranges: not with comment
    /// lines (a quote in a comment would unbalance the quote count).
    fn splittable(&self) -> bool {
        if self.remote.is_some() {
            // On an object store a range of line-delimited JSON finds its
            // start with a small ranged read; a CSV range's start depends
            // on the quotes of every byte before it, which would cost the
            // download of the object up to there: an object of CSV is one
            // split.
            return !matches!(self.format.format, Format::Csv | Format::Parquet);
        }
        match self.format.format {
            Format::Csv => !self.format.allow_comments,
            Format::Parquet => false,
            _ => true,
        }
    }

    /// An object's name relative to the table's path ("" for the path's
    /// own object).
    fn relative(&self, f: &std::path::Path) -> String {
        f.strip_prefix(&self.path)
            .map(|r| r.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/"))
            .unwrap_or_default()
    }

    /// A split per (file, number of byte ranges) and range.
    fn splits(&self, plan: Vec<(PathBuf, usize)>) -> Result<Vec<Box<dyn SourceSplit>>> {
        let on_bad = if self.dead_letters.is_some() {
            OnBadRecord::SetAside
        } else if self.format.ignore_parse_errors {
            OnBadRecord::Skip
        } else {
            OnBadRecord::Fail
        };
        let mut splits: Vec<Box<dyn SourceSplit>> = vec![];
        let file_schema = self.file_schema();
        for (f, ranges) in plan {
            let values = match &self.partitioning {
                Some(p) => Some(self.partition_values(p, &f)?),
                None => None,
            };
            for index in 0..ranges {
                let mut split = FileSplit::new(
                    f.clone(),
                    self.format.clone(),
                    file_schema.clone(),
                    on_bad,
                    self.lines_per_second,
                );
                split.range = (ranges > 1).then_some(ByteRange { index, of: ranges });
                if let Some(remote) = &self.remote {
                    split.remote = Some((remote.clone(), self.relative(&f)));
                }
                match &values {
                    Some(v) => splits.push(Box::new(PartitionSplit {
                        inner: split,
                        schema: self.schema.clone(),
                        values: v.clone(),
                    })),
                    None => splits.push(Box::new(split)),
                }
            }
        }
        Ok(splits)
    }
}

/// `path`, or `path#i-of-n` for byte range `i` of `n`.
fn split_id(path: &std::path::Path, range: Option<ByteRange>) -> String {
    match range {
        None => path.display().to_string(),
        Some(r) => format!("{}#{}-of-{}", path.display(), r.index, r.of),
    }
}

impl SourceFactory for FileSource {
    fn name(&self) -> &str {
        "filesystem"
    }

    fn is_bounded(&self) -> bool {
        self.monitor.is_none()
    }

    fn bounding_hint(&self) -> String {
        format!("remove '{MONITOR_OPTION}'")
    }

    fn discovery_interval(&self) -> Option<std::time::Duration> {
        self.monitor
    }

    /// The files listed now that no split reads yet (new files: read whole,
    /// as Flink's enumerator assigns a discovered file).
    fn discover(&self, known: &std::collections::BTreeSet<String>) -> Result<Vec<Box<dyn SourceSplit>>> {
        let new: Vec<(PathBuf, usize)> = self
            .files()?
            .into_iter()
            .filter(|f| {
                let whole = split_id(f, None);
                let ranged = format!("{whole}#");
                !known.contains(&whole)
                    && known
                        .range::<String, _>(&ranged..)
                        .next()
                        .is_none_or(|k| !k.starts_with(&ranged))
            })
            .map(|f| (f, 1))
            .collect();
        if !new.is_empty() {
            tracing::info!(
                target: "weir::source",
                "{}: found {} new file(s): {}",
                self.path.display(),
                new.len(),
                new.iter().map(|(f, _)| f.display().to_string()).collect::<Vec<_>>().join(", ")
            );
        }
        self.splits(new)
    }

    fn produces_changes(&self) -> bool {
        self.format.format.is_changelog()
    }

    fn create_splits(&self, count: usize) -> Result<Vec<Box<dyn SourceSplit>>> {
        let files = self.files()?;
        // Fewer files than readers: cut each into byte ranges, so that
        // one big file is read by several subtasks.
        let per_file = count.div_ceil(files.len().max(1));
        let mut plan = vec![];
        for f in files {
            let ranges = if per_file > 1 && self.splittable() {
                let size = match &self.remote {
                    Some(remote) => remote.size(&self.relative(&f))?,
                    None => std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0),
                };
                per_file.min((size / self.min_range_bytes.max(1)) as usize).max(1)
            } else {
                1
            };
            plan.push((f, ranges));
        }
        self.splits(plan)
    }

    fn restore_splits(&self, recorded: &[crate::checkpoint::SplitPosition]) -> Result<Vec<Box<dyn SourceSplit>>> {
        let ids: Vec<&str> = recorded.iter().map(|p| p.split.as_str()).collect();
        // The ranges the snapshot read each file in; files it did not know
        // (new in the directory) are read whole.
        let plan = self
            .files()?
            .into_iter()
            .map(|f| {
                let whole = split_id(&f, None);
                let ranges = ids
                    .iter()
                    .filter_map(|id| id.strip_prefix(whole.as_str())?.strip_prefix('#'))
                    .find_map(|r| r.split_once("-of-")?.1.parse::<usize>().ok())
                    .unwrap_or(1);
                (f, ranges)
            })
            .collect();
        self.splits(plan)
    }

    fn dead_letter_dir(&self) -> Option<&std::path::Path> {
        self.dead_letters.as_deref()
    }
}

/// What a split does with a record that does not parse or convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnBadRecord {
    /// Fail the job with the file and line.
    Fail,
    /// `*.ignore-parse-errors`: drop it (logged at debug level).
    Skip,
    /// `scan.dead-letter.path`: hand it to the reader for the dead letters.
    SetAside,
}

enum Reader {
    Records(RecordReader),
    Parquet(ParquetRecordBatchReader),
}

/// Part `index` of `of` byte ranges of a file (see [`super::records`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ByteRange {
    index: usize,
    of: usize,
}

pub struct FileSplit {
    path: PathBuf,
    /// `None`: the whole file.
    range: Option<ByteRange>,
    format: FormatOptions,
    schema: SchemaRef,
    on_bad: OnBadRecord,
    /// json, csv: the schema with timestamps read as text (see [`text_time`]).
    text_schema: Option<SchemaRef>,
    /// Where the split's byte range starts, and the file's lines before
    /// it once a record had to be reported (counting them costs a read of
    /// everything before the range).
    range_start: u64,
    lines_before: Option<u64>,
    reader: Option<Reader>,
    /// Lines consumed (json, csv) in the split: the checkpointed position.
    line: u64,
    /// Rows produced (parquet: the checkpointed position).
    rows: u64,
    /// After a seek: lines (json, csv) or rows (parquet) read again
    /// without emitting them; their bad records were dealt with before.
    skip: u64,
    /// Bad records of the last poll, for the dead letters.
    set_aside: Vec<BadRecord>,
    /// `scan.lines-per-second` (0: unlimited), from `throttle_start`.
    lines_per_second: u64,
    throttle_start: Option<(tokio::time::Instant, u64)>,
    /// Most lines read by one poll.
    max_lines: usize,
    /// On an object store: the table's files and this object's name
    /// relative to the table's path (`path` is its URL).
    remote: Option<(Arc<ObjectFiles>, String)>,
}

impl FileSplit {
    fn new(
        path: PathBuf,
        format: FormatOptions,
        schema: SchemaRef,
        on_bad: OnBadRecord,
        lines_per_second: u64,
    ) -> Self {
        let text_schema = match format.format {
            Format::Csv | Format::Json => text_time::text_schema(&schema),
            _ => None,
        };
        Self {
            path,
            range: None,
            range_start: 0,
            lines_before: None,
            text_schema,
            format,
            schema,
            on_bad,
            reader: None,
            line: 0,
            rows: 0,
            skip: 0,
            set_aside: vec![],
            lines_per_second,
            throttle_start: None,
            max_lines: DEFAULT_BATCH_ROWS,
            remote: None,
        }
    }

    fn io(&self, source: std::io::Error) -> ConnectorError {
        ConnectorError::Io {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// The file's line number of the split's line `line` (1-based).
    fn line_number(&mut self, line: u64) -> u64 {
        if self.range_start == 0 {
            return line;
        }
        let before = match self.lines_before {
            Some(n) => n,
            None => {
                let n = match &self.remote {
                    Some((objects, rel)) => objects.lines_before(rel, self.range_start).unwrap_or(0),
                    None => lines_before(&self.path, self.range_start).unwrap_or(0),
                };
                self.lines_before = Some(n);
                n
            }
        };
        before + line
    }

    fn data_error(&self, line: u64, message: impl std::fmt::Display) -> ConnectorError {
        ConnectorError::Data {
            location: format!("{}:{line}", self.path.display()),
            message: message.to_string(),
        }
    }

    fn ensure_open(&mut self) -> Result<()> {
        if self.reader.is_some() {
            return Ok(());
        }
        // On an object store, a byte range of an object (its bounds found
        // with ranged reads) is downloaded alone, at its own offsets.
        let remote_range = match (&self.remote, self.range) {
            (Some((objects, rel)), Some(r)) => {
                let starts = objects.line_range_starts(rel, r.of, r.index + 2)?;
                let start = starts.get(r.index).copied().unwrap_or(u64::MAX);
                let end = starts.get(r.index + 1).copied().unwrap_or(u64::MAX);
                let end = if r.index + 1 == r.of { objects.size(rel)? } else { end };
                Some(start.min(end)..end)
            }
            _ => None,
        };
        let file = match (&self.remote, &remote_range) {
            (Some((objects, rel)), Some(range)) => objects.download_range(rel, range.clone())?,
            (Some((objects, rel)), None) => objects.download(rel)?,
            (None, _) => File::open(&self.path).map_err(|e| self.io(e))?,
        };
        self.reader = Some(match self.format.format {
            Format::Parquet => {
                let builder = ParquetRecordBatchReaderBuilder::try_new(file)
                    .map_err(|e| self.data_error(0, format!("not a readable parquet file: {e}")))?;
                let file_schema = builder.schema().clone();
                let mut indices = vec![];
                for f in self.schema.fields() {
                    let i = file_schema.index_of(f.name()).map_err(|_| {
                        config_error(
                            "filesystem",
                            format!(
                                "{}: column '{}' is not in the parquet file",
                                self.path.display(),
                                f.name()
                            ),
                        )
                    })?;
                    indices.push(i);
                }
                let mask = ProjectionMask::roots(builder.parquet_schema(), indices);
                let reader = builder
                    .with_projection(mask)
                    .with_batch_size(DEFAULT_BATCH_ROWS)
                    .build()
                    .map_err(|e| self.data_error(0, e))?;
                Reader::Parquet(reader)
            }
            _ => {
                let quote = (self.format.format == Format::Csv).then_some(CsvQuoting {
                    quote: self.format.quote,
                    delimiter: self.format.delimiter,
                });
                let range = match (self.range, remote_range) {
                    (_, Some(range)) => range,
                    (None, None) => 0..u64::MAX,
                    (Some(r), None) => {
                        let need = r.index + 2;
                        let starts = range_starts(&self.path, r.of, need, quote).map_err(|e| self.io(e))?;
                        let end = starts.get(r.index + 1).copied().unwrap_or(u64::MAX);
                        let start = starts.get(r.index).copied().unwrap_or(u64::MAX);
                        start..end
                    }
                };
                // Line numbers count from the range's start until a record
                // is reported (see `line_number`).
                self.range_start = range.start.min(range.end);
                Reader::Records(RecordReader::open(file, range, 0, quote).map_err(|e| self.io(e))?)
            }
        });
        Ok(())
    }

    /// With `scan.lines-per-second`: how many lines may be read now, or
    /// the instant the next may. Lines read again after a seek are free.
    fn line_budget(&mut self, replaying: bool) -> std::result::Result<usize, tokio::time::Instant> {
        if self.lines_per_second == 0 || replaying {
            return Ok(self.max_lines);
        }
        let now = tokio::time::Instant::now();
        let (start, first_line) = *self.throttle_start.get_or_insert((now, self.line));
        let read = self.line - first_line;
        let due = start + Duration::from_secs_f64(read as f64 / self.lines_per_second as f64);
        if due > now {
            return Err(due);
        }
        // About 50 ms of lines at a time, so the pace is steady.
        Ok(((self.lines_per_second / 20) as usize).clamp(1, self.max_lines))
    }

    /// Reads up to `max` records, and no more than `max_lines` lines.
    fn read_records(&mut self, max: usize, max_lines: u64) -> Result<Chunk> {
        let Some(Reader::Records(r)) = &mut self.reader else {
            return Ok(Chunk::default());
        };
        let chunk = r.read(max, max_lines).map_err(|e| ConnectorError::Io {
            path: self.path.display().to_string(),
            source: e,
        })?;
        self.line += chunk.lines();
        Ok(chunk)
    }

    /// Decodes a chunk of records into one batch. A chunk of only good
    /// records is decoded as it was read, in one go; otherwise bad records
    /// are found by bisection (a chunk with a few bad records costs a few
    /// decodes of its halves, not one per record) and failed on, skipped
    /// or set aside; `replay` (records read again after a seek) only counts.
    fn decode_chunk(&mut self, chunk: Chunk, replay: bool) -> Result<Option<RecordBatch>> {
        let decoder = LineDecoder {
            format: self.format.clone(),
            schema: match self.format.format {
                f if f.is_changelog() => super::changelog::envelope_schema(f, &self.schema),
                _ => self.schema.clone(),
            },
            text_schema: self.text_schema.clone(),
        };
        let comments = self.format.allow_comments && self.format.format == Format::Csv;
        let is_comment = |l: &str| comments && l.starts_with('#');
        let whole = std::str::from_utf8(&chunk.text).ok();
        if let Some(text) = whole {
            // The common case: every record has content.
            let plain = chunk.records.iter().all(|r| {
                let t = &text[r.span.clone()];
                !t.trim().is_empty() && !is_comment(t)
            });
            if plain && let Ok(b) = decoder.decode_records(text, chunk.records.len()) {
                return Ok(b);
            }
        }
        let mut texts: Vec<(&RawRecord, &str)> = vec![];
        let mut bad: Vec<(&RawRecord, String)> = vec![];
        for r in &chunk.records {
            match std::str::from_utf8(chunk.bytes(r)) {
                Ok(t) if t.trim().is_empty() || is_comment(t) => {}
                Ok(t) => texts.push((r, t)),
                Err(e) => bad.push((r, format!("invalid UTF-8 after byte {} of the line", e.valid_up_to()))),
            }
        }
        let all: Vec<&str> = texts.iter().map(|(_, t)| *t).collect();
        let batch = match decoder.decode_lines(&all) {
            Ok(b) if bad.is_empty() => return Ok(b),
            Ok(b) => Some(b),
            Err(_) => None,
        };
        let batch = match batch {
            Some(b) => b,
            None => {
                let mut failed = vec![];
                decoder.find_bad(&all, 0, &mut failed);
                for (i, reason) in failed {
                    bad.push((texts[i].0, reason));
                }
                let bad_numbers: std::collections::HashSet<u64> = bad.iter().map(|(l, _)| l.number).collect();
                let good: Vec<&str> = texts
                    .iter()
                    .filter(|(l, _)| !bad_numbers.contains(&l.number))
                    .map(|(_, t)| *t)
                    .collect();
                let first = chunk.records.first().map_or(self.line, |l| l.number);
                let first = self.line_number(first);
                decoder
                    .decode_lines(&good)
                    .map_err(|e| self.data_error(first, format!("the lines decode one by one but not together: {e}")))?
            }
        };
        bad.sort_by_key(|(l, _)| l.number);
        if replay {
            return Ok(batch);
        }
        match self.on_bad {
            OnBadRecord::Fail => {
                if let Some((l, reason)) = bad.first() {
                    let line = self.line_number(l.number);
                    return Err(self.data_error(line, reason).into());
                }
            }
            OnBadRecord::Skip => {
                for (l, reason) in &bad {
                    let line = self.line_number(l.number);
                    tracing::debug!("{}:{line}: skipped: {reason}", self.path.display());
                }
            }
            OnBadRecord::SetAside => {
                let file = self.path.display().to_string();
                let base = if bad.is_empty() { 0 } else { self.line_number(0) };
                self.set_aside.extend(bad.into_iter().map(|(l, reason)| BadRecord {
                    file: file.clone(),
                    line: base + l.number,
                    byte_offset: l.byte_offset,
                    raw: chunk.bytes(l).to_vec(),
                    reason,
                }));
            }
        }
        Ok(batch)
    }

    fn align(&self, batch: RecordBatch) -> Result<RecordBatch> {
        crate::operators::calc::batch_with_schema(&self.schema, batch.columns().to_vec())
    }

    fn poll_parquet(&mut self) -> Result<SplitPoll> {
        loop {
            let Some(Reader::Parquet(r)) = &mut self.reader else {
                return Ok(SplitPoll::Finished);
            };
            let mut b = match r.next() {
                None => return Ok(SplitPoll::Finished),
                Some(Ok(b)) => b,
                Some(Err(e)) => {
                    return Err(self
                        .data_error(self.rows, format!("parquet read failed after row {}: {e}", self.rows))
                        .into());
                }
            };
            if self.skip > 0 {
                // Rows are counted after decoding, so skipping decoded rows
                // lands on the same row whatever the batch boundaries were.
                let k = self.skip.min(b.num_rows() as u64);
                self.skip -= k;
                self.rows += k;
                b = b.slice(k as usize, b.num_rows() - k as usize);
            }
            if b.num_rows() > 0 {
                self.rows += b.num_rows() as u64;
                return Ok(SplitPoll::Batch(self.align(b)?));
            }
        }
    }

    fn poll_lines(&mut self) -> Result<SplitPoll> {
        loop {
            let replay = self.skip > 0;
            let max = match self.line_budget(replay) {
                Ok(n) if replay => n.min(self.skip as usize),
                Ok(n) => n,
                Err(due) => return Ok(SplitPoll::Wait(due)),
            };
            // A chunk never straddles the position: positions are record
            // boundaries, and a replay reads no more lines than it skips.
            let max_lines = if replay { self.skip } else { u64::MAX };
            let chunk = self.read_records(max, max_lines)?;
            if chunk.records.is_empty() {
                return Ok(SplitPoll::Finished);
            }
            if replay {
                self.skip = self.skip.saturating_sub(chunk.lines());
            }
            let batch = self.decode_chunk(chunk, replay)?;
            let rows = batch.as_ref().map_or(0, |b| b.num_rows() as u64);
            self.rows += rows;
            match batch {
                Some(b) if rows > 0 && !replay && self.format.format.is_changelog() => {
                    let changes = super::changelog::expand(self.format.format, &b, &self.schema)?;
                    if changes.num_rows() > 0 {
                        return Ok(SplitPoll::Changes(changes));
                    }
                }
                Some(b) if rows > 0 && !replay => return Ok(SplitPoll::Batch(b)),
                // Only bad lines: the reader takes them before the next poll.
                _ if !self.set_aside.is_empty() => {
                    return Ok(SplitPoll::Wait(tokio::time::Instant::now()));
                }
                _ => {}
            }
        }
    }
}

fn has_decimal(t: &DataType) -> bool {
    match t {
        DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..) => true,
        DataType::Struct(fields) => fields.iter().any(|f| has_decimal(f.data_type())),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => has_decimal(f.data_type()),
        _ => false,
    }
}

/// The most digits in a row a number may have where a DECIMAL column may
/// read it: arrow's decimal parser counts digits in a `u8` (more wrap it:
/// a panic in debug builds, a wrong value otherwise), and no DECIMAL holds
/// more than 76 anyway.
const MAX_NUMBER_DIGITS: usize = 255;

/// Refuses text holding a run of more than [`MAX_NUMBER_DIGITS`] digits
/// (outside JSON strings; in CSV anywhere, as a quoted field is parsed
/// too), before arrow's decimal parser sees it.
fn refuse_long_numbers(text: &[u8], json: bool) -> std::result::Result<(), arrow::error::ArrowError> {
    let (mut run, mut in_string, mut escaped) = (0usize, false, false);
    for &b in text {
        if json && in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if b.is_ascii_digit() {
            run += 1;
            if run > MAX_NUMBER_DIGITS {
                return Err(arrow::error::ArrowError::ParseError(format!(
                    "a number of more than {MAX_NUMBER_DIGITS} digits"
                )));
            }
            continue;
        }
        run = 0;
        if json && b == b'"' {
            in_string = true;
        }
    }
    Ok(())
}

/// Decodes lines of one format into batches of the table's schema (a
/// changelog format: into its envelopes, see [`super::changelog::expand`]).
/// Shared with the Kafka connector, whose records are decoded the same way.
pub(crate) struct LineDecoder {
    format: FormatOptions,
    schema: SchemaRef,
    /// json, csv: the schema with timestamps read as text, for the fast parser.
    text_schema: Option<SchemaRef>,
}

impl LineDecoder {
    /// The decoder of `format` for rows of `schema`.
    pub(crate) fn new(format: FormatOptions, schema: &SchemaRef) -> Self {
        let text_schema = match format.format {
            Format::Csv | Format::Json => text_time::text_schema(schema),
            _ => None,
        };
        Self {
            schema: match format.format {
                f if f.is_changelog() => super::changelog::envelope_schema(f, schema),
                _ => schema.clone(),
            },
            format,
            text_schema,
        }
    }

    fn decode(&self, text: &str) -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
        if text.is_empty() {
            return Ok(None);
        }
        if let Some(b) = self.text_schema.as_ref().and_then(|t| self.decode_fast(text, t)) {
            return Ok(Some(b));
        }
        if self.format.format.is_changelog() {
            let text = super::changelog::normalize(&self.format, text)?;
            let b = self.decode_as(&text, &self.schema)?;
            if let Some(b) = &b {
                super::changelog::check_envelopes(self.format.format, b)?;
            }
            return Ok(b);
        }
        self.decode_as(text, &self.schema)
    }

    /// `text` decoded into `schema` by arrow's json or csv reader.
    fn decode_as(
        &self,
        text: &str,
        schema: &SchemaRef,
    ) -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
        if schema.fields().iter().any(|f| has_decimal(f.data_type())) {
            let json = self.format.format.is_json();
            if let Err(e) = refuse_long_numbers(text.as_bytes(), json) {
                // CSV: a long run may sit in a text column; only a DECIMAL
                // column's value is refused (read as text to look).
                if json || self.decimal_field_too_long(text, schema)? {
                    return Err(e);
                }
            }
        }
        if self.format.format.is_json() {
            let mut d = arrow::json::ReaderBuilder::new(schema.clone())
                .with_batch_size(DEFAULT_BATCH_ROWS)
                .build_decoder()?;
            d.decode(text.as_bytes())?;
            return d.flush();
        }
        self.decode_csv(text, schema)
    }

    /// Whether a top-level DECIMAL column of CSV `text` holds a value of
    /// more than [`MAX_NUMBER_DIGITS`] digits in a row.
    fn decimal_field_too_long(
        &self,
        text: &str,
        schema: &SchemaRef,
    ) -> std::result::Result<bool, arrow::error::ArrowError> {
        let is_decimal = |t: &DataType| {
            matches!(
                t,
                DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..)
            )
        };
        let as_text: Vec<arrow::datatypes::Field> = schema
            .fields()
            .iter()
            .map(|f| {
                if is_decimal(f.data_type()) {
                    f.as_ref().clone().with_data_type(DataType::Utf8)
                } else {
                    f.as_ref().clone()
                }
            })
            .collect();
        let Some(b) = self.decode_csv(text, &std::sync::Arc::new(arrow::datatypes::Schema::new(as_text)))? else {
            return Ok(false);
        };
        for (i, f) in schema.fields().iter().enumerate() {
            if !is_decimal(f.data_type()) {
                continue;
            }
            let Some(col) = b.column(i).as_any().downcast_ref::<arrow::array::StringArray>() else {
                continue;
            };
            if col
                .iter()
                .flatten()
                .any(|v| refuse_long_numbers(v.as_bytes(), false).is_err())
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Timestamps read as text and parsed by [`text_time`]; `None` when
    /// anything does not decode that way (the general decode then says
    /// why, or takes what only it reads: time zones, JSON numbers).
    fn decode_fast(&self, text: &str, text_schema: &SchemaRef) -> Option<RecordBatch> {
        let b = self.decode_as(text, text_schema).ok()??;
        let mut columns = Vec::with_capacity(b.num_columns());
        for (c, f) in b.columns().iter().zip(self.schema.fields()) {
            columns.push(match f.data_type() {
                arrow::datatypes::DataType::Timestamp(unit, None) => {
                    text_time::parse_column(c.as_any().downcast_ref()?, *unit)?
                }
                _ => c.clone(),
            });
        }
        RecordBatch::try_new(self.schema.clone(), columns).ok()
    }

    fn decode_csv(
        &self,
        text: &str,
        schema: &SchemaRef,
    ) -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
        // Without `csv.null-literal` no field is NULL: an empty STRING
        // field is '' and an empty field of another type does not parse,
        // as in Flink's CSV format. Arrow reads an empty field as NULL
        // (no regex run per field: a third of the time on string-heavy
        // rows), which `empty_is_not_null` turns back into Flink's rule.
        // A null literal other than '' needs arrow's regex (its parser
        // would refuse the literal in a numeric column otherwise).
        let null = match self.format.null_literal.as_deref() {
            None | Some("") => None,
            Some(text) => Some(
                regex::Regex::new(&format!("^{}$", regex::escape(text)))
                    .map_err(|e| arrow::error::ArrowError::ParseError(e.to_string()))?,
            ),
        };
        // Read with every column nullable: an empty field of a NOT NULL
        // STRING column is '' (not a NULL arrow would refuse) once
        // `empty_is_not_null` has run; the DDL's schema is put back then.
        let read_schema: SchemaRef = if null.is_none() {
            Arc::new(arrow::datatypes::Schema::new(
                schema
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone().with_nullable(true))
                    .collect::<Vec<_>>(),
            ))
        } else {
            schema.clone()
        };
        let mut builder = arrow::csv::ReaderBuilder::new(read_schema.clone())
            .with_header(false)
            .with_delimiter(self.format.delimiter)
            .with_quote(self.format.quote)
            .with_batch_size(DEFAULT_BATCH_ROWS);
        if let Some(null) = null {
            builder = builder.with_null_regex(null);
        }
        let reader = builder.build(std::io::Cursor::new(text.as_bytes()))?;
        let mut out: Vec<RecordBatch> = vec![];
        for b in reader {
            out.push(b?);
        }
        let batch = match out.len() {
            0 => return Ok(None),
            1 => out.pop(),
            _ => arrow::compute::concat_batches(&read_schema, &out).map(Some)?,
        };
        let Some(mut batch) = batch else {
            return Ok(None);
        };
        if self.format.null_literal.is_none() {
            batch = empty_is_not_null(batch)?;
        }
        if batch.schema() != *schema {
            // A NULL left in a NOT NULL column (the null literal '') is
            // refused here, naming the column.
            batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec())?;
        }
        Ok(Some(batch))
    }

    /// Decodes `text`, `records` records separated by line breaks, into a
    /// batch of that many rows.
    fn decode_records(
        &self,
        text: &str,
        records: usize,
    ) -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
        let batch = self.decode(text)?;
        let rows = batch.as_ref().map_or(0, |b| b.num_rows());
        if rows != records {
            return Err(arrow::error::ArrowError::ParseError(format!(
                "{records} records decode as {rows} rows"
            )));
        }
        Ok(batch)
    }

    /// Decodes `lines` into one row each. Joined, an unfinished line can
    /// run into the next (`{"a":1,"b":` then `2}`, or an open CSV quote)
    /// and two lines decode as one record: a row count that is not the
    /// line count is an error, so that each line is judged on its own.
    pub(crate) fn decode_lines(
        &self,
        lines: &[&str],
    ) -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
        let batch = self.decode(&lines.join("\n"))?;
        let rows = batch.as_ref().map_or(0, |b| b.num_rows());
        if rows != lines.len() {
            return Err(arrow::error::ArrowError::ParseError(match lines {
                [_] => format!("the line holds {rows} records, not one"),
                _ => format!("{} lines decode as {rows} records", lines.len()),
            }));
        }
        Ok(batch)
    }

    /// Why one line does not decode, as users read it.
    fn reason(&self, e: &arrow::error::ArrowError) -> String {
        match self.format.format {
            Format::Json => format!("invalid JSON record: {e}"),
            Format::DebeziumJson => format!("invalid Debezium JSON record: {e}"),
            Format::CanalJson => format!("invalid Canal JSON record: {e}"),
            Format::MaxwellJson => format!("invalid Maxwell JSON record: {e}"),
            _ => format!("invalid CSV record: {}", csv_reason(e, &self.schema)),
        }
    }

    /// Appends (index + `base`, reason) for every line of `lines` that
    /// does not decode on its own, halving the lines that fail together.
    pub(crate) fn find_bad(&self, lines: &[&str], base: usize, bad: &mut Vec<(usize, String)>) {
        match self.decode_lines(lines) {
            Ok(_) => {}
            Err(e) if lines.len() == 1 => bad.push((base, self.reason(&e))),
            Err(_) => {
                let mid = lines.len() / 2;
                self.find_bad(&lines[..mid], base, bad);
                self.find_bad(&lines[mid..], base + mid, bad);
            }
        }
    }
}

/// Arrow's CSV error in the user's words: arrow says "Error while parsing
/// value 'x' as type 'Int64' for column 0. Row data: '[x,3]'" (its type
/// name and a 0-based position); the user declared `a BIGINT` first:
/// "column 'a' (1st, BIGINT): cannot parse 'x'". Anything else is kept,
/// without the reader's line number (it counts within what it was given).
fn csv_reason(e: &arrow::error::ArrowError, schema: &SchemaRef) -> String {
    let text = e.to_string();
    let parsed = (|| {
        let rest = text.split_once("Error while parsing value '")?.1;
        let (value, rest) = rest.split_once("' as type '")?;
        let column = rest.split_once("for column ")?.1;
        let digits: String = column.chars().take_while(char::is_ascii_digit).collect();
        let field = schema.fields().get(digits.parse::<usize>().ok()?)?;
        let n = digits.parse::<usize>().ok()? + 1;
        let nth = match (n % 10, n % 100) {
            (1, r) if r != 11 => "st",
            (2, r) if r != 12 => "nd",
            (3, r) if r != 13 => "rd",
            _ => "th",
        };
        let ty = crate::type_names::flink_name(field.data_type());
        Some(format!(
            "column '{}' ({n}{nth}, {ty}): cannot parse '{value}' as {ty}",
            field.name()
        ))
    })();
    parsed.unwrap_or_else(|| text.replace(" at line 0", "").replace(" at line 1", ""))
}

impl SourceSplit for FileSplit {
    fn resumed_after(&mut self, paused: std::time::Duration) {
        if let Some((started, _)) = &mut self.throttle_start {
            *started += paused;
        }
    }

    fn id(&self) -> String {
        split_id(&self.path, self.range)
    }

    fn offset(&self) -> u64 {
        self.rows
    }

    fn position(&self) -> u64 {
        // Lines or rows still to read again after a seek count as read:
        // a checkpoint taken before they are must not move the position
        // back (their records were dealt with by an earlier attempt).
        self.skip
            + match self.format.format {
                Format::Parquet => self.rows,
                _ => self.line,
            }
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        self.skip = position;
        Ok(())
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        self.ensure_open()?;
        match self.format.format {
            Format::Parquet => self.poll_parquet(),
            _ => self.poll_lines(),
        }
    }

    fn take_dead_letters(&mut self) -> Vec<BadRecord> {
        std::mem::take(&mut self.set_aside)
    }
}

/// A file of a partition directory: its rows with the partition's values
/// as the partition columns.
struct PartitionSplit {
    inner: FileSplit,
    /// The table's columns read (file columns and partition columns).
    schema: SchemaRef,
    /// Partition column index in `schema` → its value.
    values: Vec<(usize, ScalarValue)>,
}

impl PartitionSplit {
    fn widen(&self, file_rows: RecordBatch) -> Result<RecordBatch> {
        let n = file_rows.num_rows();
        let mut file_columns = file_rows.columns().iter();
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for i in 0..self.schema.fields().len() {
            match self.values.iter().find(|(at, _)| *at == i) {
                Some((_, v)) => columns.push(v.to_array_of_size(n)?),
                None => {
                    columns.push(file_columns.next().cloned().ok_or_else(|| {
                        crate::error::ExecError::internal("a partition file batch is short of columns")
                    })?)
                }
            }
        }
        let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(n));
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?)
    }
}

impl SourceSplit for PartitionSplit {
    fn resumed_after(&mut self, paused: std::time::Duration) {
        self.inner.resumed_after(paused);
    }

    fn id(&self) -> String {
        self.inner.id()
    }

    fn offset(&self) -> u64 {
        self.inner.offset()
    }

    fn position(&self) -> u64 {
        self.inner.position()
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        self.inner.seek(position)
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        Ok(match self.inner.poll_batch()? {
            SplitPoll::Batch(b) => SplitPoll::Batch(self.widen(b)?),
            SplitPoll::Changes(c) => {
                let rows = self.widen(c.rows.clone())?;
                SplitPoll::Changes(c.with_rows(rows))
            }
            other => other,
        })
    }

    fn take_dead_letters(&mut self) -> Vec<BadRecord> {
        self.inner.take_dead_letters()
    }
}

/// Flink's CSV rule without a null literal, on a batch arrow read with an
/// empty field as NULL: an empty STRING (or BYTES) field is the empty
/// value, an empty field of any other type does not parse (the error
/// arrow gives for a value that does not parse, `line` counted in the
/// batch).
fn empty_is_not_null(batch: RecordBatch) -> std::result::Result<RecordBatch, arrow::error::ArrowError> {
    use arrow::array::{Array, BinaryArray, StringArray};
    use arrow::datatypes::DataType;
    if batch.columns().iter().all(|c| c.null_count() == 0) {
        return Ok(batch);
    }
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (i, c) in batch.columns().iter().enumerate() {
        if c.null_count() == 0 {
            columns.push(c.clone());
            continue;
        }
        let filled: arrow::array::ArrayRef = match c.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                let empty = arrow::compute::cast(&StringArray::from(vec![""]), c.data_type())?;
                arrow::compute::kernels::zip::zip(
                    &arrow::compute::is_not_null(c)?,
                    c,
                    &arrow::array::Scalar::new(empty),
                )?
            }
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                let empty = arrow::compute::cast(&BinaryArray::from(vec![&b""[..]]), c.data_type())?;
                arrow::compute::kernels::zip::zip(
                    &arrow::compute::is_not_null(c)?,
                    c,
                    &arrow::array::Scalar::new(empty),
                )?
            }
            other => {
                let line = (0..c.len()).find(|&r| c.is_null(r)).unwrap_or(0);
                return Err(arrow::error::ArrowError::ParseError(format!(
                    "Error while parsing value '' as type '{other}' for column {i} at line {line}"
                )));
            }
        };
        columns.push(filled);
    }
    RecordBatch::try_new(batch.schema(), columns)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    fn csv_split(path: &std::path::Path, max_lines: usize) -> FileSplit {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let format = FormatOptions {
            format: Format::Csv,
            ignore_parse_errors: false,
            iso_timestamps: false,
            delimiter: b',',
            quote: b'"',
            allow_comments: false,
            null_literal: None,
            canal_database: None,
            canal_table: None,
            parquet_compression: parquet::basic::Compression::SNAPPY,
        };
        let mut s = FileSplit::new(path.to_path_buf(), format, schema, OnBadRecord::SetAside, 0);
        s.max_lines = max_lines;
        s
    }

    /// Polls until `polls` batches were returned or the split finished:
    /// (ids emitted, bad lines set aside, finished).
    fn read(split: &mut FileSplit, polls: usize) -> (Vec<i64>, Vec<u64>, bool) {
        let (mut ids, mut bad) = (vec![], vec![]);
        let mut batches = 0;
        while batches < polls {
            let polled = split.poll_batch().expect("poll");
            bad.extend(split.take_dead_letters().iter().map(|r| r.line));
            match polled {
                SplitPoll::Batch(b) => {
                    let col: &Int64Array = b.column(0).as_primitive::<Int64Type>();
                    ids.extend(col.values().iter().copied());
                    batches += 1;
                }
                SplitPoll::Changes(_) => panic!("this split reads no changes"),
                SplitPoll::Wait(_) => {}
                SplitPoll::Finished => return (ids, bad, true),
            }
        }
        (ids, bad, false)
    }

    /// The invariant dead letters rest on: a split resumed at the position
    /// of another, wherever that one stopped, sets aside exactly the bad
    /// lines the other had not, and emits exactly the rows it had not.
    #[test]
    fn numbers_too_long_for_the_decimal_parser_are_refused_outside_strings() {
        let long = "7".repeat(MAX_NUMBER_DIGITS + 1);
        let ok = "7".repeat(MAX_NUMBER_DIGITS);
        assert!(refuse_long_numbers(format!("{{\"d\":{long}}}").as_bytes(), true).is_err());
        assert!(refuse_long_numbers(format!("{{\"d\":{ok}}}").as_bytes(), true).is_ok());
        // In a JSON string (even after an escaped quote) it is text.
        assert!(refuse_long_numbers(format!("{{\"s\":\"\\\"{long}\"}}").as_bytes(), true).is_ok());
        assert!(refuse_long_numbers(format!("1,\"{long}\"").as_bytes(), false).is_err());
    }

    /// A CSV table with a DECIMAL column: a long digit run in its STRING
    /// column is read; in the DECIMAL column it is a bad record.
    #[test]
    fn only_a_decimal_columns_long_number_is_refused_in_csv() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.csv");
        let long = "7".repeat(MAX_NUMBER_DIGITS + 1);
        std::fs::write(&path, format!("{long},1.5\n")).expect("write");
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("d", DataType::Decimal128(10, 2), true),
        ]));
        let format = FormatOptions {
            format: Format::Csv,
            ignore_parse_errors: false,
            iso_timestamps: false,
            delimiter: b',',
            quote: b'"',
            allow_comments: false,
            null_literal: None,
            canal_database: None,
            canal_table: None,
            parquet_compression: parquet::basic::Compression::SNAPPY,
        };
        let decoder = LineDecoder {
            format,
            schema: schema.clone(),
            text_schema: None,
        };
        let text = std::fs::read_to_string(&path).expect("read");
        let b = decoder
            .decode(&text)
            .expect("a long text value is data")
            .expect("a row");
        assert_eq!(b.num_rows(), 1);
        assert!(decoder.decode(&format!("a,{long}\n")).is_err());
    }

    #[test]
    fn a_split_resumed_at_a_position_continues_exactly_where_it_was() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.csv");
        let mut text = String::new();
        let (mut good, mut bad) = (vec![], vec![]);
        for i in 1..=60i64 {
            if i % 7 == 0 {
                text.push_str(&format!("{i},x\n"));
                bad.push(i as u64);
            } else if i % 11 == 0 {
                text.push('\n');
            } else {
                text.push_str(&format!("{i},{}\n", i * 2));
                good.push(i);
            }
        }
        std::fs::write(&path, text).expect("write");
        for polls in 0..=20 {
            let mut first = csv_split(&path, 4);
            let (mut ids, mut set_aside, finished) = read(&mut first, polls);
            let mut second = csv_split(&path, 4);
            second.seek(first.position()).expect("seek");
            let (more_ids, more_bad, _) = read(&mut second, usize::MAX);
            ids.extend(more_ids);
            set_aside.extend(more_bad);
            assert_eq!(ids, good, "rows, cut after {polls} polls");
            assert_eq!(set_aside, bad, "bad lines, cut after {polls} polls");
            if finished {
                assert_eq!(first.position(), 60);
            }
            // The resumed split counts the rows it skipped.
            assert_eq!(second.offset(), good.len() as u64);
        }
    }

    /// A CSV source over `path` that cuts files into ranges of any size.
    fn ranged_source(path: &std::path::Path) -> FileSource {
        let template = csv_split(path, 4);
        FileSource {
            path: path.to_path_buf(),
            format: template.format.clone(),
            schema: template.schema.clone(),
            dead_letters: None,
            lines_per_second: 0,
            min_range_bytes: 1,
            partitioning: None,
            remote: None,
            monitor: None,
        }
    }

    /// One file cut into byte ranges reads the rows of the whole file,
    /// each once, and a restore rebuilds the same ranges from their ids.
    #[test]
    fn byte_ranges_read_the_whole_file_and_restore_by_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.csv");
        let text: String = (1..=50i64).map(|i| format!("{i},{}\n", i * 3)).collect();
        std::fs::write(&path, text).expect("write");
        let source = ranged_source(&path);
        let splits = source.create_splits(3).expect("splits");
        let ids: Vec<String> = splits.iter().map(|s| s.id()).collect();
        assert_eq!(
            ids,
            (0..3)
                .map(|i| format!("{}#{i}-of-3", path.display()))
                .collect::<Vec<_>>()
        );
        let recorded = |ids: &[String]| -> Vec<crate::checkpoint::SplitPosition> {
            ids.iter()
                .map(|id| crate::checkpoint::SplitPosition {
                    split: id.clone(),
                    position: 0,
                    finished: false,
                    end: None,
                })
                .collect()
        };
        let restored = source.restore_splits(&recorded(&ids[1..])).expect("restore");
        assert_eq!(restored.iter().map(|s| s.id()).collect::<Vec<_>>(), ids);
        let whole = source
            .restore_splits(&recorded(&[path.display().to_string()]))
            .expect("restore");
        assert_eq!(whole.len(), 1);
        let mut rows = vec![];
        for mut s in splits {
            loop {
                match s.poll_batch().expect("poll") {
                    SplitPoll::Batch(b) => {
                        rows.extend(b.column(0).as_primitive::<Int64Type>().values().iter().copied())
                    }
                    SplitPoll::Changes(_) => panic!("this split reads no changes"),
                    SplitPoll::Wait(_) => {}
                    SplitPoll::Finished => break,
                }
            }
        }
        assert_eq!(rows, (1..=50).collect::<Vec<_>>());
        // Fewer readers than files, or small files: whole files.
        let one = FileSource {
            min_range_bytes: 1 << 20,
            ..source
        };
        assert_eq!(one.create_splits(3).expect("splits").len(), 1);
    }

    /// A bad record in a later byte range is reported with its line in the
    /// file, not in the range.
    #[test]
    fn a_bad_record_in_a_byte_range_names_its_line_in_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.csv");
        let text: String = (1..=50i64)
            .map(|i| {
                if i == 40 {
                    "40,x\n".to_string()
                } else {
                    format!("{i},{i}\n")
                }
            })
            .collect();
        std::fs::write(&path, text).expect("write");
        let source = ranged_source(&path);
        let mut last = source.create_splits(2).expect("splits").pop().expect("a split");
        let err = loop {
            match last.poll_batch() {
                Ok(SplitPoll::Finished) => panic!("the bad line was not reported"),
                Ok(_) => {}
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("in.csv:40: invalid CSV record"), "{err}");
    }

    #[test]
    fn a_bad_record_fails_the_split_with_its_file_and_line_unless_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("in.csv");
        std::fs::write(&path, "1,2\n3,x\n").expect("write");
        let mut split = csv_split(&path, 8);
        split.on_bad = OnBadRecord::Fail;
        let err = split.poll_batch().err().expect("an error").to_string();
        // The column by its name, position from 1 and declared type: not
        // Arrow's `Int64` and 0-based column.
        assert!(
            err.contains("in.csv:2: invalid CSV record: column 'v' (2nd, BIGINT): cannot parse 'x' as BIGINT"),
            "{err}"
        );
        assert!(!err.contains("Int64"), "{err}");
        // An empty field of a numeric column (not NULL in Flink's CSV).
        std::fs::write(&path, "1,2\n,4\n").expect("write");
        let mut split = csv_split(&path, 8);
        split.on_bad = OnBadRecord::Fail;
        let err = split.poll_batch().err().expect("an error").to_string();
        assert!(
            err.contains("in.csv:2: invalid CSV record: column 'id' (1st, BIGINT): cannot parse '' as BIGINT"),
            "{err}"
        );
    }
}
