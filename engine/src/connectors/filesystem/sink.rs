//! Writing files, exactly once: a two-phase-commit sink (Flink's FileSink).
//!
//! Each sink subtask writes part files `part-<job>-<attempt>-<subtask>-<n>.<ext>`
//! through the protocol of [`super::part_file`]: hidden while in progress,
//! pending (durable, invisible) from the checkpoint barrier, visible when
//! the checkpoint completes. Part files roll on every checkpoint, as
//! Flink's bulk formats do.
//!
//! Without checkpointing, the file is committed at end of input.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::util::display::FormatOptions as DisplayOptions;
use parquet::arrow::ArrowWriter;
use weir_catalog::Options;

use super::part_file::{PartCommitter, PartFiles, io_err};
use super::{Format, FormatOptions, format_options, path_of};
use crate::checkpoint::OperatorSnapshot;
use crate::connectors::{Committer, SinkContext, SinkFactory};
use crate::error::{ConnectorError, Result};
use crate::operators::{Collector, Operator};

#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    format: FormatOptions,
    schema: SchemaRef,
}

impl FileSink {
    pub fn new(options: &Options, schema: SchemaRef) -> Result<Self> {
        Ok(Self {
            dir: path_of(options)?,
            format: format_options(options)?,
            schema,
        })
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

    fn create_writer(&self, subtask: usize, _parallelism: usize, ctx: &SinkContext) -> Result<Box<dyn Operator>> {
        std::fs::create_dir_all(&self.dir).map_err(|source| ConnectorError::Io {
            path: self.dir.display().to_string(),
            source,
        })?;
        let ext = match self.format.format {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
            _ => "json",
        };
        Ok(Box::new(FileWriter {
            files: PartFiles::new(
                self.dir.clone(),
                format!("part-{}-{}-{subtask}", ctx.job_tag, ctx.attempt),
                ext,
                "sink.pre_committed",
            ),
            exactly_once: ctx.exactly_once,
            format: self.format.clone(),
            schema: self.schema.clone(),
            out: None,
        }))
    }

    fn committer(&self, ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
        // `<attempt>-<subtask>-<n>` follow the prefix.
        Some(Arc::new(PartCommitter::new(
            self.dir.clone(),
            format!(".part-{}-", ctx.job_tag),
            3,
            "sink.file_committed",
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

struct FileWriter {
    /// `part-<job>-<attempt>-<subtask>-<n>.<ext>`.
    files: PartFiles,
    exactly_once: bool,
    format: FormatOptions,
    schema: SchemaRef,
    out: Option<Out>,
}

impl FileWriter {
    fn in_progress_path(&self) -> PathBuf {
        self.files.in_progress_path()
    }

    fn io(&self, source: std::io::Error) -> ConnectorError {
        io_err(&self.in_progress_path(), source)
    }

    fn open(&mut self) -> Result<&mut Out> {
        if self.out.is_none() {
            let path = self.in_progress_path();
            let f = File::create(&path).map_err(|e| self.io(e))?;
            self.out = Some(match self.format.format {
                Format::Parquet => {
                    Out::Parquet(ArrowWriter::try_new(f, self.schema.clone(), None).map_err(|e| parquet_err(&path, e))?)
                }
                _ => Out::Text(BufWriter::with_capacity(1 << 20, f)),
            });
        }
        self.out
            .as_mut()
            .ok_or_else(|| crate::error::ExecError::internal("file writer not open"))
    }

    /// Closes the current part file and makes it durable. Returns its
    /// in-progress path, or `None` if nothing was written since the last.
    fn close_part(&mut self) -> Result<Option<PathBuf>> {
        let path = self.in_progress_path();
        match self.out.take() {
            None => return Ok(None),
            Some(Out::Text(mut w)) => {
                w.flush().map_err(|e| self.io(e))?;
                w.get_ref().sync_all().map_err(|e| self.io(e))?;
            }
            Some(Out::Parquet(w)) => {
                let f = w.into_inner().map_err(|e| parquet_err(&path, e))?;
                f.sync_all().map_err(|e| self.io(e))?;
            }
        }
        Ok(Some(path))
    }

    /// Phase one: the part file becomes pending (durable, invisible) and
    /// its committable is returned; the next rows go to a new part.
    fn pre_commit(&mut self) -> Result<Vec<serde_json::Value>> {
        if self.close_part()?.is_none() {
            return Ok(vec![]);
        }
        Ok(vec![self.files.pre_commit()?])
    }

    /// Changes as envelopes of the changelog format, one line each.
    fn write_changes(&mut self, changes: crate::change::ChangeBatch) -> Result<()> {
        let rows = RecordBatch::try_new(self.schema.clone(), changes.rows.columns().to_vec())?;
        let text = self.stringify_timestamps(&rows)?;
        let path = self.in_progress_path();
        let mut json = Vec::new();
        {
            let mut jw = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(&mut json);
            jw.write(&text).map_err(|e| arrow_err(&path, e))?;
            jw.finish().map_err(|e| arrow_err(&path, e))?;
        }
        let lines = super::changelog::envelopes(self.format.format, &changes, &json)?;
        match self.open()? {
            Out::Text(w) => w.write_all(&lines).map_err(|e| io_err(&path, e))?,
            Out::Parquet(_) => {
                return Err(crate::error::ExecError::internal(
                    "a changelog format opened a parquet file",
                ));
            }
        }
        Ok(())
    }

    /// Timestamps as text the way Flink writes them.
    fn stringify_timestamps(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let format = if self.format.iso_timestamps {
            "%Y-%m-%dT%H:%M:%S%.3f"
        } else {
            "%Y-%m-%d %H:%M:%S%.3f"
        };
        let opts = CastOptions {
            safe: false,
            format_options: DisplayOptions::default()
                .with_timestamp_format(Some(format))
                .with_timestamp_tz_format(Some(format)),
        };
        let mut fields = vec![];
        let mut cols: Vec<ArrayRef> = vec![];
        for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
            if matches!(f.data_type(), DataType::Timestamp(_, _)) {
                cols.push(cast_with_options(c, &DataType::Utf8, &opts)?);
                fields.push(Field::new(f.name(), DataType::Utf8, f.is_nullable()));
            } else {
                cols.push(c.clone());
                fields.push(f.as_ref().clone());
            }
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
    }
}

impl Operator for FileWriter {
    fn name(&self) -> &str {
        "Sink: filesystem"
    }

    fn process_batch(&mut self, batch: crate::change::ChangeBatch, _out: &mut Collector) -> Result<()> {
        if self.format.format.is_changelog() {
            return self.write_changes(batch);
        }
        let batch = batch.into_inserts("filesystem sink")?;
        // Columns arrive named as the query named them; files carry the
        // sink table's column names (types already match: the planner casts).
        let batch = RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())?;
        let format = self.format.clone();
        let text_batch = match format.format {
            Format::Parquet => None,
            _ => Some(self.stringify_timestamps(&batch)?),
        };
        let path = self.in_progress_path();
        match (self.open()?, text_batch) {
            (Out::Parquet(w), _) => w.write(&batch).map_err(|e| parquet_err(&path, e))?,
            (Out::Text(w), Some(b)) if format.format == Format::Json => {
                let mut jw = arrow::json::LineDelimitedWriter::new(w);
                jw.write(&b).map_err(|e| arrow_err(&path, e))?;
                jw.finish().map_err(|e| arrow_err(&path, e))?;
            }
            (Out::Text(w), Some(b)) => {
                let mut cw = arrow::csv::WriterBuilder::new()
                    .with_header(false)
                    .with_delimiter(format.delimiter)
                    .with_quote(format.quote)
                    .build(w);
                cw.write(&b).map_err(|e| arrow_err(&path, e))?;
            }
            (Out::Text(_), None) => {}
        }
        Ok(())
    }

    fn snapshot_state(&mut self, _checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(OperatorSnapshot::Sink(self.pre_commit()?)))
    }

    fn final_snapshot(&mut self) -> Result<Option<OperatorSnapshot>> {
        Ok(Some(OperatorSnapshot::Sink(self.pre_commit()?)))
    }

    fn on_end_of_input(&mut self, _out: &mut Collector) -> Result<()> {
        if self.exactly_once {
            // Committed by the final checkpoint (`final_snapshot`).
            return Ok(());
        }
        if self.close_part()?.is_some() {
            self.files.commit_now()?;
        }
        Ok(())
    }
}
