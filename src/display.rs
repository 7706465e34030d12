//! Results as text: Flink's tableau (for the REPL and `weir run`) and
//! `+I[...]` rows (for tests and the print sink).

use arrow::array::Array;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow::util::display::ArrayFormatter;

pub use weir_engine::connectors::print::{format_changes, format_rows};

/// Prints streaming rows as a table, header first, one line per row, as
/// they arrive (column widths fixed by the header, like Flink's tableau).
pub struct Tableau {
    widths: Vec<usize>,
    header_done: bool,
    /// The first column is `_op`: it fills the op column.
    changelog: bool,
}

/// Whether a result's first column is the `_op` of a changelog.
pub fn is_changelog(schema: &SchemaRef) -> bool {
    schema.fields().first().is_some_and(|f| f.name() == "_op")
}

/// A changelog batch (`_op` first) as the changes it holds.
pub fn changes_of(batch: &RecordBatch) -> Result<weir_engine::change::ChangeBatch, arrow::error::ArrowError> {
    use weir_engine::change::{ChangeBatch, RowKind};
    let ops = batch
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .ok_or_else(|| arrow::error::ArrowError::InvalidArgumentError("_op is not a string column".into()))?;
    let kinds = (0..ops.len())
        .map(|i| {
            RowKind::from_short(ops.value(i)).ok_or_else(|| {
                arrow::error::ArrowError::InvalidArgumentError(format!("'{}' is not a row kind", ops.value(i)))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rows = batch.project(&(1..batch.num_columns()).collect::<Vec<_>>())?;
    Ok(ChangeBatch::new(rows, kinds))
}

impl Tableau {
    pub fn new(schema: &SchemaRef) -> Self {
        let changelog = is_changelog(schema);
        let widths = schema
            .fields()
            .iter()
            .skip(usize::from(changelog))
            .map(|f| {
                f.name().len().max(match f.data_type() {
                    arrow::datatypes::DataType::Timestamp(_, _) => 23,
                    _ => 12,
                })
            })
            .collect();
        Self {
            widths,
            header_done: false,
            changelog,
        }
    }

    fn rule(&self) -> String {
        let mut s = String::from("+----+");
        for w in &self.widths {
            s.push_str(&"-".repeat(w + 2));
            s.push('+');
        }
        s
    }

    fn line(&self, op: &str, values: &[String]) -> String {
        let mut s = format!("| {op} |");
        for (v, w) in values.iter().zip(&self.widths) {
            s.push_str(&format!(" {v:>w$} |"));
        }
        s
    }

    pub fn header(&mut self, schema: &SchemaRef) -> String {
        self.header_done = true;
        let names: Vec<String> = schema
            .fields()
            .iter()
            .skip(usize::from(self.changelog))
            .map(|f| f.name().clone())
            .collect();
        format!("{}\n{}\n{}", self.rule(), self.line("op", &names), self.rule())
    }

    pub fn rows(&mut self, batch: &RecordBatch) -> Result<String, arrow::error::ArrowError> {
        let changes = if self.changelog {
            changes_of(batch)?
        } else {
            batch.clone().into()
        };
        let batch = &changes.rows;
        let opts = weir_engine::connectors::print::format_options();
        let fmts = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref() as &dyn Array, &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = String::new();
        for row in 0..batch.num_rows() {
            let vals: Vec<String> = fmts.iter().map(|f| f.value(row).to_string()).collect();
            out.push_str(&self.line(changes.kind(row).short(), &vals));
            out.push('\n');
        }
        Ok(out)
    }

    pub fn footer(&self, rows: u64) -> String {
        format!(
            "{}\nReceived a total of {rows} row{}",
            self.rule(),
            if rows == 1 { "" } else { "s" }
        )
    }
}

/// A whole result as a table (SHOW TABLES, DESCRIBE, SET).
pub fn table(batches: &[RecordBatch]) -> String {
    let opts = weir_engine::connectors::print::format_options();
    match arrow::util::pretty::pretty_format_batches_with_options(batches, &opts) {
        Ok(t) => t.to_string(),
        Err(e) => format!("(cannot display result: {e})"),
    }
}

/// Column `index` of every batch as text (NULL as an empty string).
pub fn column_strings(batches: &[RecordBatch], index: usize) -> Vec<String> {
    let options = arrow::util::display::FormatOptions::default();
    let mut out = vec![];
    for b in batches.iter().filter(|b| index < b.num_columns()) {
        let column = b.column(index);
        match ArrayFormatter::try_new(column.as_ref(), &options) {
            Ok(f) => out.extend((0..column.len()).map(|i| f.value(i).to_string())),
            Err(_) => out.extend((0..column.len()).map(|_| String::new())),
        }
    }
    out
}
