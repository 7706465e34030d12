//! `print`: writes rows to stdout in Flink's format, `+I[v1, v2]`, with a
//! `subtask>` prefix when the sink runs with more than one subtask, and the
//! optional `print-identifier` before it.

use std::io::Write;

use arrow::array::Array;
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use weir_catalog::{OptionKind, OptionSpec, Options};

use super::SinkFactory;
use crate::change::ChangeBatch;
use crate::error::{ConnectorError, Result};
use crate::operators::{Collector, Operator};

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new("print-identifier", OptionKind::String, "prefix of every printed line"),
    OptionSpec::new("standard-error", OptionKind::Bool, "print to stderr instead of stdout").with_default("false"),
];

#[derive(Debug)]
pub struct PrintSink {
    identifier: Option<String>,
    stderr: bool,
}

impl PrintSink {
    pub fn new(options: &Options, _table: &str) -> Self {
        Self {
            identifier: options.get("print-identifier").map(str::to_string),
            stderr: options.bool("standard-error").ok().flatten().unwrap_or(false),
        }
    }
}

impl SinkFactory for PrintSink {
    fn name(&self) -> &str {
        "print"
    }

    fn accepts_changes(&self) -> bool {
        true
    }

    fn create_writer(
        &self,
        subtask: usize,
        parallelism: usize,
        _ctx: &super::SinkContext,
    ) -> Result<super::SinkWriter> {
        let mut prefix = String::new();
        if let Some(id) = &self.identifier {
            prefix.push_str(id);
            prefix.push(':');
        }
        if parallelism > 1 {
            prefix.push_str(&format!("{}> ", subtask + 1));
        } else if self.identifier.is_some() {
            prefix.push(' ');
        }
        Ok(super::SinkWriter::Direct(Box::new(PrintWriter {
            prefix,
            stderr: self.stderr,
        })))
    }
}

struct PrintWriter {
    prefix: String,
    stderr: bool,
}

/// Flink's SQL client rendering of values (the shell's tableau): timestamps
/// `yyyy-MM-dd HH:mm:ss.SSS`, NULL as `<NULL>`.
pub fn format_options() -> FormatOptions<'static> {
    FormatOptions::default()
        .with_null("<NULL>")
        .with_timestamp_format(Some("%Y-%m-%d %H:%M:%S%.3f"))
        .with_timestamp_tz_format(Some("%Y-%m-%d %H:%M:%S%.3f"))
}

/// Renders each row of `batch` as `+I[v1, v2, ...]`.
pub fn format_rows(batch: &RecordBatch) -> Result<Vec<String>> {
    format_changes(&ChangeBatch::from(batch.clone()))
}

/// Renders each change as Flink's `Row.toString()`: its kind, then
/// `[v1, v2, ...]` (`+I[a, 1]`, `-U[a, 1]`, `+U[a, 2]`, `-D[b, 1]`).
pub fn format_changes(changes: &ChangeBatch) -> Result<Vec<String>> {
    let batch = &changes.rows;
    // `Row.toString()`, as the print connector writes: NULL is `null`.
    let opts = format_options().with_null("null");
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref() as &dyn Array, &opts))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((0..batch.num_rows())
        .map(|row| {
            let vals: Vec<String> = formatters.iter().map(|f| f.value(row).to_string()).collect();
            format!("{}[{}]", changes.kind(row).short(), vals.join(", "))
        })
        .collect())
}

impl Operator for PrintWriter {
    fn name(&self) -> &str {
        "Sink: print"
    }

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        // As Flink's print sink: `Row.toString()` of the row's Java
        // values (`2024-01-01T00:00:10`, `1.0E10`), which is not the SQL
        // client's text `format_changes` writes.
        let mut text = String::new();
        for row in 0..batch.num_rows() {
            text.push_str(&self.prefix);
            text.push_str(batch.kind(row).short());
            text.push('[');
            for (c, column) in batch.rows.columns().iter().enumerate() {
                if c > 0 {
                    text.push_str(", ");
                }
                crate::java_text::java_value(column.as_ref(), row, &mut text);
            }
            text.push_str("]\n");
        }
        let res = if self.stderr {
            std::io::stderr().lock().write_all(text.as_bytes())
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|_| out.flush())
        };
        res.map_err(|source| ConnectorError::Io {
            path: if self.stderr { "stderr" } else { "stdout" }.into(),
            source,
        })?;
        Ok(())
    }
}
