//! Writing files: each sink subtask writes one part file into the `path`
//! directory. While written, the file is hidden (`.part-...inprogress`,
//! ignored by readers); at end of input it is renamed to its final name,
//! so readers only ever see complete files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::util::display::FormatOptions as DisplayOptions;
use parquet::arrow::ArrowWriter;
use weir_catalog::Options;

use super::{Format, FormatOptions, format_options, path_of};
use crate::connectors::SinkFactory;
use crate::error::{ConnectorError, Result};
use crate::operators::{Collector, Operator};

#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    format: FormatOptions,
    schema: SchemaRef,
    /// Distinguishes the files of different runs writing to one directory.
    run_id: String,
}

impl FileSink {
    pub fn new(options: &Options, schema: SchemaRef) -> Result<Self> {
        let run_id = format!("{:x}", chrono::Utc::now().timestamp_micros());
        Ok(Self {
            dir: path_of(options)?,
            format: format_options(options)?,
            schema,
            run_id,
        })
    }
}

impl SinkFactory for FileSink {
    fn name(&self) -> &str {
        "filesystem"
    }

    fn create_writer(&self, subtask: usize, _parallelism: usize) -> Result<Box<dyn Operator>> {
        let io = |source| ConnectorError::Io {
            path: self.dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let ext = match self.format.format {
            Format::Json => "json",
            Format::Csv => "csv",
            Format::Parquet => "parquet",
        };
        let name = format!("part-{}-{subtask}-0.{ext}", self.run_id);
        Ok(Box::new(FileWriter {
            final_path: self.dir.join(&name),
            temp_path: self.dir.join(format!(".{name}.inprogress")),
            format: self.format.clone(),
            schema: self.schema.clone(),
            out: None,
        }))
    }
}

// One per writer: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Out {
    Text(BufWriter<File>),
    Parquet(ArrowWriter<File>),
}

struct FileWriter {
    final_path: PathBuf,
    temp_path: PathBuf,
    format: FormatOptions,
    schema: SchemaRef,
    out: Option<Out>,
}

impl FileWriter {
    fn io(&self, source: std::io::Error) -> ConnectorError {
        ConnectorError::Io {
            path: self.temp_path.display().to_string(),
            source,
        }
    }

    fn open(&mut self) -> Result<&mut Out> {
        if self.out.is_none() {
            let f = File::create(&self.temp_path).map_err(|e| self.io(e))?;
            self.out = Some(match self.format.format {
                Format::Parquet => Out::Parquet(ArrowWriter::try_new(f, self.schema.clone(), None).map_err(|e| {
                    ConnectorError::Data {
                        location: self.temp_path.display().to_string(),
                        message: e.to_string(),
                    }
                })?),
                _ => Out::Text(BufWriter::with_capacity(1 << 20, f)),
            });
        }
        self.out
            .as_mut()
            .ok_or_else(|| crate::error::ExecError::internal("file writer not open"))
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

    fn process_batch(&mut self, batch: RecordBatch, _out: &mut Collector) -> Result<()> {
        // Columns arrive named as the query named them; files carry the
        // sink table's column names (types already match: the planner casts).
        let batch = RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())?;
        let format = self.format.clone();
        let text_batch = match format.format {
            Format::Parquet => None,
            _ => Some(self.stringify_timestamps(&batch)?),
        };
        let path = self.temp_path.display().to_string();
        let data_err = |e: &dyn std::fmt::Display| ConnectorError::Data {
            location: path.clone(),
            message: e.to_string(),
        };
        match (self.open()?, text_batch) {
            (Out::Parquet(w), _) => w.write(&batch).map_err(|e| data_err(&e))?,
            (Out::Text(w), Some(b)) if format.format == Format::Json => {
                let mut jw = arrow::json::LineDelimitedWriter::new(w);
                jw.write(&b)?;
                jw.finish()?;
            }
            (Out::Text(w), Some(b)) => {
                let mut cw = arrow::csv::WriterBuilder::new()
                    .with_header(false)
                    .with_delimiter(format.delimiter)
                    .with_quote(format.quote)
                    .build(w);
                cw.write(&b)?;
            }
            (Out::Text(_), None) => {}
        }
        Ok(())
    }

    fn on_end_of_input(&mut self, _out: &mut Collector) -> Result<()> {
        match self.out.take() {
            None => return Ok(()),
            Some(Out::Text(mut w)) => {
                w.flush().map_err(|e| self.io(e))?;
                w.get_ref().sync_all().map_err(|e| self.io(e))?;
            }
            Some(Out::Parquet(w)) => {
                let f = w.into_inner().map_err(|e| ConnectorError::Data {
                    location: self.temp_path.display().to_string(),
                    message: e.to_string(),
                })?;
                f.sync_all().map_err(|e| self.io(e))?;
            }
        }
        std::fs::rename(&self.temp_path, &self.final_path).map_err(|e| self.io(e))?;
        Ok(())
    }
}
