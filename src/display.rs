//! Results as text: Flink's tableau (for the REPL and `weir run`) and
//! `+I[...]` rows (for tests and the print sink).

use arrow::array::{Array, AsArray};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow::util::display::ArrayFormatter;
use weir_engine::time_zone::SessionZone;

pub use weir_engine::connectors::print::{format_changes, format_rows};

/// How NULL is shown (Flink's SQL client).
const NULL: &str = "<NULL>";

/// The widest column Flink's SQL client shows before cutting a value
/// (`sql-client.display.max-column-width`).
const MAX_COLUMN_WIDTH: usize = 30;

/// Flink's tableau width of a column of type `t` (`columnWidthsByType`):
/// the widest text the type can have, or the maximum for unbounded
/// types (strings, floats, collections).
fn type_width(t: &arrow::datatypes::DataType) -> usize {
    use arrow::datatypes::{DataType as D, TimeUnit};
    match t {
        D::Int8 => 4,
        D::Int16 => 6,
        D::Int32 => 11,
        D::Int64 => 20,
        D::Decimal128(p, _) | D::Decimal256(p, _) => usize::from(*p) + 2,
        D::Boolean => 5,
        D::Date32 | D::Date64 => 10,
        D::Timestamp(unit, _) => match unit {
            TimeUnit::Second => 19,
            TimeUnit::Millisecond => 23,
            TimeUnit::Microsecond => 26,
            TimeUnit::Nanosecond => 29,
        },
        _ => MAX_COLUMN_WIDTH,
    }
}

/// Columns a value takes on a terminal: East Asian wide characters take
/// two (as Flink's `getStringDisplayWidth`).
fn display_width(s: &str) -> usize {
    s.chars().map(|c| if is_wide(c) { 2 } else { 1 }).sum()
}

fn is_wide(c: char) -> bool {
    matches!(u32::from(c),
        0x1100..=0x115F | 0x2E80..=0x303E | 0x3041..=0x33FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF | 0xAC00..=0xD7A3 | 0xF900..=0xFAFF | 0xFE30..=0xFE4F | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6 | 0x1F300..=0x1F64F | 0x1F900..=0x1F9FF | 0x20000..=0x3FFFD)
}

/// `v` right-aligned in `width` columns, or cut to fit with `...` (Flink's
/// tableau: a long value never breaks the table).
fn fit(v: &str, width: usize) -> String {
    let w = display_width(v);
    if w <= width {
        return format!("{}{v}", " ".repeat(width - w));
    }
    let room = width.saturating_sub(3);
    let mut out = String::new();
    let mut used = 0;
    for c in v.chars() {
        let cw = if is_wide(c) { 2 } else { 1 };
        if used + cw > room {
            break;
        }
        out.push(c);
        used += cw;
    }
    format!("{}{out}...", " ".repeat(room - used))
}

/// Prints streaming rows as a table, header first, one line per row, as
/// they arrive. Column widths are fixed by the types, as in Flink's
/// tableau, and a longer value is cut with `...`.
pub struct Tableau {
    widths: Vec<usize>,
    header_done: bool,
    /// The first column is `_op`: it fills the op column.
    changelog: bool,
    /// `table.local-time-zone` (`None`: UTC).
    zone: Option<SessionZone>,
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
            .map(|f| display_width(f.name()).max(type_width(f.data_type())).max(NULL.len()))
            .collect();
        Self {
            widths,
            header_done: false,
            changelog,
            zone: None,
        }
    }

    /// TIMESTAMP_LTZ values shown in `zone` (the session's).
    pub fn in_zone(mut self, zone: Option<SessionZone>) -> Self {
        self.zone = zone;
        self
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
            s.push(' ');
            s.push_str(&fit(v, *w));
            s.push_str(" |");
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
        let texts = column_texts(batch, self.zone.as_ref())?;
        let mut out = String::new();
        for row in 0..batch.num_rows() {
            let vals: Vec<String> = texts.iter().map(|c| c[row].clone()).collect();
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

/// A streaming result applied as it comes (the shell's `table` result
/// mode): rows in the order they first appeared, each with its
/// multiplicity; `+I`/`+U` add a row, `-U`/`-D` take one away.
pub struct Materialized {
    names: Vec<String>,
    changelog: bool,
    rows: Vec<(Vec<String>, usize)>,
    changes: u64,
    /// Where the last `-U` removed a row: its `+U` goes there, so an
    /// updated row stays in place.
    hole: Option<usize>,
    /// `table.local-time-zone` (`None`: UTC).
    zone: Option<SessionZone>,
}

impl Materialized {
    pub fn new(schema: &SchemaRef) -> Self {
        let changelog = is_changelog(schema);
        Self {
            names: schema
                .fields()
                .iter()
                .skip(usize::from(changelog))
                .map(|f| f.name().clone())
                .collect(),
            changelog,
            rows: vec![],
            changes: 0,
            hole: None,
            zone: None,
        }
    }

    /// TIMESTAMP_LTZ values shown in `zone` (the session's).
    pub fn in_zone(mut self, zone: Option<SessionZone>) -> Self {
        self.zone = zone;
        self
    }

    /// Rows shown (with their multiplicity).
    pub fn len(&self) -> usize {
        self.rows.iter().map(|(_, n)| n).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Changes applied so far.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn apply(&mut self, batch: &RecordBatch) -> Result<(), arrow::error::ArrowError> {
        let changes = if self.changelog {
            changes_of(batch)?
        } else {
            batch.clone().into()
        };
        let texts = column_texts(&changes.rows, self.zone.as_ref())?;
        for i in 0..changes.num_rows() {
            self.changes += 1;
            let row: Vec<String> = texts.iter().map(|c| c[i].clone()).collect();
            let at = self.rows.iter().position(|(r, _)| *r == row);
            let kind = changes.kind(i);
            match (kind.is_accumulate(), at) {
                (true, Some(at)) => self.rows[at].1 += 1,
                (true, None) => match self
                    .hole
                    .take()
                    .filter(|_| kind == weir_engine::change::RowKind::UpdateAfter)
                {
                    Some(h) if h <= self.rows.len() => self.rows.insert(h, (row, 1)),
                    _ => self.rows.push((row, 1)),
                },
                (false, Some(at)) => {
                    self.rows[at].1 -= 1;
                    if self.rows[at].1 == 0 {
                        self.rows.remove(at);
                        self.hole = (kind == weir_engine::change::RowKind::UpdateBefore).then_some(at);
                    }
                }
                // A retraction of a row not shown (dropped upstream): nothing.
                (false, None) => {}
            }
        }
        Ok(())
    }

    /// The table as text.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.names.iter().map(|n| n.len()).collect();
        for (row, _) in &self.rows {
            for (w, v) in widths.iter_mut().zip(row) {
                *w = (*w).max(display_width(v));
            }
        }
        let rule = {
            let mut s = String::from("+");
            for w in &widths {
                s.push_str(&"-".repeat(w + 2));
                s.push('+');
            }
            s
        };
        let line = |vals: &[String]| {
            let mut s = String::from("|");
            for (v, w) in vals.iter().zip(&widths) {
                s.push(' ');
                s.push_str(&fit(v, *w));
                s.push_str(" |");
            }
            s
        };
        let mut out = format!("{rule}\n{}\n{rule}\n", line(&self.names));
        for (row, n) in &self.rows {
            for _ in 0..*n {
                out.push_str(&line(row));
                out.push('\n');
            }
        }
        out.push_str(&rule);
        out
    }
}

/// Every value of every column as Flink's SQL client shows it: the text
/// `CAST(v AS STRING)` gives (`TRUE`, `8.5E37`, `{a=1}`, `(Oslo, 150)`,
/// `2024-01-02 03:04:05.000`), NULL as `<NULL>`.
/// A TIMESTAMP_LTZ shows as the wall time of the session's zone (`zone`;
/// `None`: UTC), as in Flink's SQL client.
fn column_texts(batch: &RecordBatch, zone: Option<&SessionZone>) -> Result<Vec<Vec<String>>, arrow::error::ArrowError> {
    batch
        .columns()
        .iter()
        .map(|c| {
            let texts = flink_texts(c, zone)?;
            let texts = texts.as_string::<i32>();
            Ok((0..texts.len())
                .map(|i| {
                    if texts.is_null(i) {
                        NULL.to_string()
                    } else {
                        texts.value(i).to_string()
                    }
                })
                .collect())
        })
        .collect()
}

/// Each value of `c` as `CAST(v AS STRING)` writes it in the session zone
/// `zone` (NULL stays NULL).
fn flink_texts(
    c: &arrow::array::ArrayRef,
    zone: Option<&SessionZone>,
) -> Result<arrow::array::ArrayRef, arrow::error::ArrowError> {
    let c = match (zone, c.data_type()) {
        (Some(zone), arrow::datatypes::DataType::Timestamp(_, Some(_))) => {
            weir_engine::time_zone::wall_times(c, &zone.tz)?
        }
        _ => c.clone(),
    };
    weir_sql::functions::cast::to_strings(&c).map_err(|e| arrow::error::ArrowError::ComputeError(e.to_string()))
}

/// A statement's rows (a query without a table, SHOW, DESCRIBE) as a
/// table of the values Flink's SQL client shows (`TRUE`, `8.5E37`,
/// TIMESTAMP_LTZ in the session zone, `<NULL>`).
pub fn result_table(batches: &[RecordBatch], zone: Option<&SessionZone>) -> String {
    let texts: Result<Vec<RecordBatch>, arrow::error::ArrowError> = batches
        .iter()
        .map(|b| {
            let columns = b
                .columns()
                .iter()
                .map(|c| flink_texts(c, zone))
                .collect::<Result<Vec<_>, _>>()?;
            let fields: Vec<arrow::datatypes::Field> = b
                .schema()
                .fields()
                .iter()
                .map(|f| arrow::datatypes::Field::new(f.name(), arrow::datatypes::DataType::Utf8, true))
                .collect();
            RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), columns)
        })
        .collect();
    match texts {
        Ok(t) => table(&t),
        Err(e) => format!("(cannot display result: {e})"),
    }
}

/// Epoch milliseconds as `yyyy-MM-dd HH:mm:ss.SSS` (UTC).
pub fn format_millis(ms: i64) -> String {
    let a = arrow::array::TimestampMillisecondArray::from(vec![ms]);
    let opts = weir_engine::connectors::print::format_options();
    ArrayFormatter::try_new(&a, &opts).map_or_else(|_| ms.to_string(), |f| f.value(0).to_string())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray, StringBuilder};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn long_and_wide_values_keep_the_table_aligned() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let long = "a value much longer than thirty columns of a terminal";
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int32Array::from(vec![Some(1), None, Some(-2147483648)])),
                Arc::new(StringArray::from(vec![Some(long), Some("北京欢迎你"), None])),
            ],
        )
        .expect("valid");
        let mut tab = Tableau::new(&schema);
        let text = format!(
            "{}\n{}{}",
            tab.header(&schema),
            tab.rows(&batch).expect("valid"),
            tab.footer(3)
        );
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(['|', '+'])).collect();
        let width = display_width(lines[0]);
        assert!(lines.iter().all(|l| display_width(l) == width), "{text}");
        // Flink's widths: INT 11, a string at most 30; a longer one is cut.
        assert!(
            text.contains("| +I |           1 | a value much longer than th... |"),
            "{text}"
        );
        assert!(
            text.contains("|      <NULL> |                     北京欢迎你 |"),
            "{text}"
        );
        assert!(
            text.contains("| -2147483648 |                         <NULL> |"),
            "{text}"
        );

        let mut table = Materialized::new(&schema);
        table.apply(&batch).expect("valid");
        let text = table.render();
        let lines: Vec<&str> = text.lines().collect();
        let width = display_width(lines[0]);
        assert!(lines.iter().all(|l| display_width(l) == width), "{text}");
        assert!(text.contains(long), "the table mode shows whole values: {text}");
    }

    #[test]
    fn values_show_as_flinks_sql_client_writes_them() {
        use arrow::array::{BooleanArray, Float64Array, MapBuilder, StructArray};
        let mut map = MapBuilder::new(None, StringBuilder::new(), arrow::array::Int32Builder::new());
        map.keys().append_value("a");
        map.values().append_value(1);
        map.keys().append_value("b");
        map.values().append_null();
        map.append(true).expect("map");
        let map = Arc::new(map.finish()) as arrow::array::ArrayRef;
        let row = Arc::new(StructArray::from(vec![
            (
                Arc::new(Field::new("city", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec![Some("Oslo")])) as arrow::array::ArrayRef,
            ),
            (
                Arc::new(Field::new("zip", DataType::Int32, true)),
                Arc::new(Int32Array::from(vec![None])) as arrow::array::ArrayRef,
            ),
        ])) as arrow::array::ArrayRef;
        let schema = Arc::new(Schema::new(vec![
            Field::new("flag", DataType::Boolean, true),
            Field::new("d", DataType::Float64, true),
            Field::new("m", map.data_type().clone(), true),
            Field::new("r", row.data_type().clone(), true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(BooleanArray::from(vec![Some(true)])),
                Arc::new(Float64Array::from(vec![Some(8.5e37)])),
                map,
                row,
            ],
        )
        .expect("valid");
        let mut tab = Tableau::new(&schema);
        let text = tab.rows(&batch).expect("valid");
        for shown in ["TRUE", "8.5E37", "{a=1, b=NULL}", "(Oslo, NULL)"] {
            assert!(text.contains(shown), "{shown} in {text}");
        }
    }

    #[test]
    fn statement_rows_show_as_flinks_sql_client_writes_them() {
        use arrow::array::{BooleanArray, Float64Array};
        let ltz = arrow::array::TimestampMillisecondArray::from(vec![Some(1_704_067_200_000)]).with_timezone("UTC");
        let schema = Arc::new(Schema::new(vec![
            Field::new("b", DataType::Boolean, true),
            Field::new("d", DataType::Float64, true),
            Field::new("l", ltz.data_type().clone(), true),
            Field::new("n", DataType::Int32, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(BooleanArray::from(vec![Some(true)])),
                Arc::new(Float64Array::from(vec![Some(8.5e37)])),
                Arc::new(ltz),
                Arc::new(Int32Array::from(vec![None])),
            ],
        )
        .expect("valid");
        let zone = weir_engine::time_zone::session_zone("Asia/Shanghai").expect("valid");
        let text = result_table(&[batch], zone.as_ref());
        for shown in ["TRUE", "8.5E37", "2024-01-01 08:00:00.000", "<NULL>"] {
            assert!(text.contains(shown), "{shown} in {text}");
        }
    }

    #[test]
    fn timestamp_ltz_shows_in_the_session_zone() {
        let ltz = arrow::array::TimestampMillisecondArray::from(vec![Some(1_710_064_800_000)]).with_timezone("UTC");
        let schema = Arc::new(Schema::new(vec![Field::new("l", ltz.data_type().clone(), true)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ltz)]).expect("valid");
        let utc = Tableau::new(&schema).rows(&batch).expect("valid");
        assert!(utc.contains("2024-03-10 10:00:00.000"), "{utc}");
        let zone = weir_engine::time_zone::session_zone("America/Los_Angeles").expect("valid");
        let local = Tableau::new(&schema).in_zone(zone.clone()).rows(&batch).expect("valid");
        assert!(local.contains("2024-03-10 03:00:00.000"), "{local}");
        let mut view = Materialized::new(&schema).in_zone(zone);
        view.apply(&batch).expect("valid");
        assert!(view.render().contains("2024-03-10 03:00:00.000"), "{}", view.render());
    }
}
