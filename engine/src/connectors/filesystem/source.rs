//! Reading files. Each file is a split with its own offset (rows read).
//! Bad records fail the job with the file and line (json, csv) or row group
//! (parquet), unless `*.ignore-parse-errors` is set.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use weir_catalog::Options;

use super::{Format, FormatOptions, format_options, path_of};
use crate::connectors::{DEFAULT_BATCH_ROWS, SourceFactory, SourceSplit, SplitPoll, config_error};
use crate::error::{ConnectorError, Result};

#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    format: FormatOptions,
    schema: SchemaRef,
}

impl FileSource {
    pub fn new(options: &Options, schema: SchemaRef) -> Result<Self> {
        Ok(Self {
            path: path_of(options)?,
            format: format_options(options)?,
            schema,
        })
    }

    /// The files to read: the path itself, or the visible files of a
    /// directory (names starting with '.' or '_' are in-progress or
    /// metadata files, as in Flink), sorted by name.
    fn files(&self) -> Result<Vec<PathBuf>> {
        let io = |source| ConnectorError::Io {
            path: self.path.display().to_string(),
            source,
        };
        let meta = std::fs::metadata(&self.path).map_err(io)?;
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

impl SourceFactory for FileSource {
    fn name(&self) -> &str {
        "filesystem"
    }

    fn is_bounded(&self) -> bool {
        true
    }

    fn create_splits(&self, _parallelism: usize) -> Result<Vec<Box<dyn SourceSplit>>> {
        self.files()?
            .into_iter()
            .map(|f| -> Result<Box<dyn SourceSplit>> {
                Ok(Box::new(FileSplit::open(f, self.format.clone(), self.schema.clone())?))
            })
            .collect()
    }
}

enum Reader {
    Lines(BufReader<File>),
    Parquet(ParquetRecordBatchReader),
}

pub struct FileSplit {
    path: PathBuf,
    format: FormatOptions,
    schema: SchemaRef,
    reader: Option<Reader>,
    /// Lines consumed (json, csv) or rows (parquet).
    line: u64,
    rows: u64,
    /// Rows still to skip after a seek.
    skip: u64,
}

impl FileSplit {
    fn open(path: PathBuf, format: FormatOptions, schema: SchemaRef) -> Result<Self> {
        Ok(Self {
            path,
            format,
            schema,
            reader: None,
            line: 0,
            rows: 0,
            skip: 0,
        })
    }

    fn io(&self, source: std::io::Error) -> ConnectorError {
        ConnectorError::Io {
            path: self.path.display().to_string(),
            source,
        }
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
        let file = File::open(&self.path).map_err(|e| self.io(e))?;
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
            _ => Reader::Lines(BufReader::with_capacity(1 << 20, file)),
        });
        Ok(())
    }

    /// Reads up to a batch of lines: (first line number, lines).
    fn read_lines(&mut self) -> Result<(u64, Vec<String>)> {
        let first = self.line + 1;
        let mut lines = vec![];
        let Some(Reader::Lines(r)) = &mut self.reader else {
            return Ok((first, lines));
        };
        let mut buf = String::new();
        while lines.len() < DEFAULT_BATCH_ROWS {
            buf.clear();
            let n = r.read_line(&mut buf).map_err(|e| ConnectorError::Io {
                path: self.path.display().to_string(),
                source: e,
            })?;
            if n == 0 {
                break;
            }
            lines.push(buf.trim_end_matches(['\n', '\r']).to_string());
        }
        self.line += lines.len() as u64;
        Ok((first, lines))
    }

    fn decode_json(&self, lines: &[String], first: u64) -> Result<Option<RecordBatch>> {
        let decode = |text: &str| -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
            let mut d = arrow::json::ReaderBuilder::new(self.schema.clone())
                .with_batch_size(DEFAULT_BATCH_ROWS)
                .build_decoder()?;
            d.decode(text.as_bytes())?;
            d.flush()
        };
        let keep: Vec<&String> = lines.iter().filter(|l| !l.trim().is_empty()).collect();
        let joined = keep.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n");
        match decode(&joined) {
            Ok(b) => Ok(b),
            Err(e) => {
                // Find the line at fault, line by line.
                let mut good = vec![];
                for (i, l) in lines.iter().enumerate() {
                    if l.trim().is_empty() {
                        continue;
                    }
                    match decode(l) {
                        Ok(_) => good.push(l.as_str()),
                        Err(le) if self.format.ignore_parse_errors => {
                            tracing::debug!("{}:{}: skipped: {le}", self.path.display(), first + i as u64);
                        }
                        Err(le) => {
                            return Err(self
                                .data_error(first + i as u64, format!("invalid JSON record: {le}"))
                                .into());
                        }
                    }
                }
                if !self.format.ignore_parse_errors {
                    return Err(self.data_error(first, format!("invalid JSON: {e}")).into());
                }
                Ok(decode(&good.join("\n")).map_err(|e| self.data_error(first, e))?)
            }
        }
    }

    fn decode_csv(&self, lines: &[String], first: u64) -> Result<Option<RecordBatch>> {
        let build = || {
            arrow::csv::ReaderBuilder::new(self.schema.clone())
                .with_header(false)
                .with_delimiter(self.format.delimiter)
                .with_quote(self.format.quote)
                .with_batch_size(DEFAULT_BATCH_ROWS)
        };
        let decode = |text: &str| -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
            let mut out: Vec<RecordBatch> = vec![];
            for b in build().build(std::io::Cursor::new(text.as_bytes()))? {
                out.push(b?);
            }
            match out.len() {
                0 => Ok(None),
                _ => arrow::compute::concat_batches(&self.schema, &out).map(Some),
            }
        };
        let is_comment = |l: &str| self.format.allow_comments && l.starts_with('#');
        let keep: Vec<(usize, &String)> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !is_comment(l))
            .collect();
        let joined = keep.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>().join("\n");
        match decode(&joined) {
            Ok(b) => Ok(b),
            Err(e) => {
                let mut good = vec![];
                for (i, l) in &keep {
                    match decode(l) {
                        Ok(_) => good.push(l.as_str()),
                        Err(_) if self.format.ignore_parse_errors => {}
                        Err(le) => {
                            let msg = le.to_string().replace(" at line 0", "").replace(" at line 1", "");
                            return Err(self
                                .data_error(first + *i as u64, format!("invalid CSV record: {msg}"))
                                .into());
                        }
                    }
                }
                if !self.format.ignore_parse_errors {
                    return Err(self.data_error(first, format!("invalid CSV: {e}")).into());
                }
                Ok(decode(&good.join("\n")).map_err(|e| self.data_error(first, e))?)
            }
        }
    }

    fn align(&self, batch: RecordBatch) -> Result<RecordBatch> {
        crate::operators::calc::batch_with_schema(&self.schema, batch.columns().to_vec())
    }
}

impl SourceSplit for FileSplit {
    fn id(&self) -> String {
        self.path.display().to_string()
    }

    fn offset(&self) -> u64 {
        self.rows
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        // Rows are counted after decoding, so skipping decoded rows lands
        // on the same row whatever the batch boundaries were.
        self.skip = position;
        Ok(())
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        self.ensure_open()?;
        loop {
            let batch = match self.format.format {
                Format::Parquet => {
                    let Some(Reader::Parquet(r)) = &mut self.reader else {
                        return Ok(SplitPoll::Finished);
                    };
                    match r.next() {
                        None => return Ok(SplitPoll::Finished),
                        Some(Ok(b)) => Some(b),
                        Some(Err(e)) => {
                            return Err(self
                                .data_error(self.rows, format!("parquet read failed after row {}: {e}", self.rows))
                                .into());
                        }
                    }
                }
                f => {
                    let (first, lines) = self.read_lines()?;
                    if lines.is_empty() {
                        return Ok(SplitPoll::Finished);
                    }
                    if f == Format::Json {
                        self.decode_json(&lines, first)?
                    } else {
                        self.decode_csv(&lines, first)?
                    }
                }
            };
            if let Some(mut b) = batch.filter(|b| b.num_rows() > 0) {
                if self.skip > 0 {
                    let k = self.skip.min(b.num_rows() as u64);
                    self.skip -= k;
                    self.rows += k;
                    b = b.slice(k as usize, b.num_rows() - k as usize);
                    if b.num_rows() == 0 {
                        continue;
                    }
                }
                self.rows += b.num_rows() as u64;
                let b = if self.format.format == Format::Parquet {
                    self.align(b)?
                } else {
                    b
                };
                return Ok(SplitPoll::Batch(b));
            }
        }
    }
}
