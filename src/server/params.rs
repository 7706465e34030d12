//! Parameters of prepared statements: `?` and `$n` placeholders are
//! replaced by literals of the bound values before the statement is
//! planned, token by token, so every statement kind (SELECT, INSERT,
//! SUBSCRIBE) takes parameters the same way.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;
use sqlparser::dialect::GenericDialect;
use sqlparser::tokenizer::{Token, Tokenizer};

/// Most parameters a statement may have.
const MAX_PARAMS: usize = 65_535;

/// A statement with its placeholders found.
#[derive(Debug, Clone)]
pub struct Template {
    tokens: Vec<Token>,
    /// For each placeholder token (by index in `tokens`), the 0-based
    /// parameter it stands for.
    slots: Vec<(usize, usize)>,
    pub param_count: usize,
}

impl Template {
    pub fn parse(sql: &str) -> Result<Self, String> {
        // Literals stay as written (`'it''s'`), so rendering the tokens
        // again gives back the same statement.
        let tokens = Tokenizer::new(&GenericDialect {}, sql)
            .with_unescape(false)
            .tokenize()
            .map_err(|e| e.to_string())?;
        let mut slots = vec![];
        let mut next_positional = 0;
        let (mut question, mut numbered) = (false, false);
        for (i, t) in tokens.iter().enumerate() {
            let Token::Placeholder(p) = t else { continue };
            let index = if p == "?" {
                question = true;
                next_positional += 1;
                next_positional - 1
            } else {
                numbered = true;
                match p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                    Some(n) if (1..=MAX_PARAMS).contains(&n) => n - 1,
                    _ => return Err(format!("placeholder '{p}': expected ? or $1 ... ${MAX_PARAMS}")),
                }
            };
            slots.push((i, index));
        }
        if next_positional > MAX_PARAMS {
            return Err(format!("more than {MAX_PARAMS} parameters"));
        }
        if question && numbered {
            return Err("mix of ? and $n placeholders; use one style".into());
        }
        let param_count = slots.iter().map(|(_, p)| p + 1).max().unwrap_or(0);
        Ok(Self {
            tokens,
            slots,
            param_count,
        })
    }

    /// The statement with every placeholder NULL: what prepare plans to
    /// learn the result's columns.
    pub fn with_nulls(&self) -> String {
        self.render(|_| Ok("NULL".to_string())).unwrap_or_default()
    }

    /// The statement with `$1, $2, ...` for its placeholders (what the
    /// planner infers parameter types from).
    pub fn numbered(&self) -> String {
        self.render(|p| Ok(format!("${}", p + 1))).unwrap_or_default()
    }

    /// The statement with the values of `row` of `params` in place.
    pub fn bind(&self, params: &RecordBatch, row: usize) -> Result<String, String> {
        if params.num_columns() < self.param_count {
            return Err(format!(
                "the statement has {} parameter(s) but {} value(s) were bound",
                self.param_count,
                params.num_columns()
            ));
        }
        self.render(|p| literal(params.column(p).as_ref(), row).map_err(|e| format!("parameter {}: {e}", p + 1)))
    }

    fn render(&self, mut value: impl FnMut(usize) -> Result<String, String>) -> Result<String, String> {
        let mut out = String::new();
        let mut slots = self.slots.iter().peekable();
        for (i, t) in self.tokens.iter().enumerate() {
            match slots.peek() {
                Some((at, p)) if *at == i => {
                    out.push_str(&value(*p)?);
                    slots.next();
                }
                _ => out.push_str(&t.to_string()),
            }
        }
        Ok(out)
    }
}

/// How values of a type are written as SQL literals.
#[derive(Clone, Copy)]
enum Literal {
    Boolean,
    /// Integers and decimals, parenthesised (`-?` must not become `--`).
    Number,
    Float,
    Text,
    Date,
    Timestamp,
    TimestampLtz,
    Time,
}

fn literal_kind(t: &DataType) -> Option<Literal> {
    use DataType as T;
    Some(match t {
        T::Boolean => Literal::Boolean,
        T::Int8 | T::Int16 | T::Int32 | T::Int64 | T::UInt8 | T::UInt16 | T::UInt32 | T::UInt64 => Literal::Number,
        T::Decimal128(..) | T::Decimal256(..) => Literal::Number,
        T::Float16 | T::Float32 | T::Float64 => Literal::Float,
        T::Utf8 | T::LargeUtf8 | T::Utf8View => Literal::Text,
        T::Date32 | T::Date64 => Literal::Date,
        T::Timestamp(_, None) => Literal::Timestamp,
        T::Timestamp(_, Some(_)) => Literal::TimestampLtz,
        T::Time32(_) | T::Time64(_) => Literal::Time,
        _ => return None,
    })
}

/// Whether values of `t` can be bound (have a literal).
pub fn bindable(t: &DataType) -> bool {
    literal_kind(t).is_some()
}

/// `array[row]` as a SQL literal of the same type.
fn literal(array: &dyn Array, row: usize) -> Result<String, String> {
    if array.is_null(row) {
        return Ok("NULL".into());
    }
    let kind = literal_kind(array.data_type())
        .ok_or_else(|| format!("values of type {} cannot be bound", array.data_type()))?;
    let text = arrow::util::display::array_value_to_string(array, row).map_err(|e| e.to_string())?;
    let quoted = |s: &str| format!("'{}'", s.replace('\'', "''"));
    Ok(match kind {
        Literal::Boolean => array.as_boolean().value(row).to_string(),
        Literal::Number => format!("({text})"),
        Literal::Float if text.parse::<f64>().is_ok_and(f64::is_finite) => format!("CAST(({text}) AS DOUBLE)"),
        Literal::Float => return Err(format!("{text} has no SQL literal")),
        Literal::Text => quoted(&text),
        Literal::Date => format!("DATE {}", quoted(&text)),
        Literal::Timestamp => format!("TIMESTAMP {}", quoted(&text.replace('T', " "))),
        Literal::TimestampLtz => format!("CAST({} AS TIMESTAMP_LTZ(3))", quoted(&text.replace('T', " "))),
        Literal::Time => format!("TIME {}", quoted(&text)),
    })
}

/// Checks the Arrow IPC messages of a parameter upload (one `FlightData`
/// each: `data_header` and `data_body`) before arrow-flight decodes them.
///
/// arrow-ipc 59 trusts the message: a schema with an `Int` of 7 bits, a
/// buffer offset past the body or a validity bitmap shorter than the column
/// makes it panic (`fb_to_schema`, `Buffer::slice_with_length`,
/// `BooleanBuffer::new`) instead of returning an error. Parameters only
/// need flat columns of the bindable types, so this accepts exactly those
/// and checks every bound the decoder relies on; anything else is an error
/// that names the message and what is wrong.
#[derive(Debug, Default)]
pub struct ParameterStreamCheck {
    /// Each column's layout, from the schema message.
    columns: Option<Vec<Layout>>,
    messages: usize,
}

/// What the buffers of a column hold, after its validity bitmap.
#[derive(Debug, Clone, Copy)]
enum Layout {
    Bits,
    Fixed(usize),
    Offsets(usize),
    Views,
}

impl ParameterStreamCheck {
    pub fn check(&mut self, header: &[u8], body: &[u8]) -> Result<(), String> {
        use arrow::ipc::MessageHeader;
        self.messages += 1;
        let n = self.messages;
        let bad = |what: String| format!("parameter message {n}: {what}");
        if header.is_empty() {
            return Ok(());
        }
        let message = arrow::ipc::root_as_message(header).map_err(|e| bad(format!("not an Arrow IPC message: {e}")))?;
        match message.header_type() {
            MessageHeader::Schema => {
                let schema = message.header_as_schema().ok_or_else(|| bad("schema missing".into()))?;
                let fields = schema.fields().ok_or_else(|| bad("schema without fields".into()))?;
                if fields.len() > MAX_PARAMS {
                    return Err(bad(format!("more than {MAX_PARAMS} parameters")));
                }
                let layouts = fields
                    .iter()
                    .enumerate()
                    .map(|(i, f)| layout(&f).map_err(|e| bad(format!("parameter {}: {e}", i + 1))))
                    .collect::<Result<Vec<_>, _>>()?;
                self.columns = Some(layouts);
                Ok(())
            }
            MessageHeader::RecordBatch => {
                let columns = self
                    .columns
                    .as_ref()
                    .ok_or_else(|| bad("a batch before the schema".into()))?;
                let batch = message
                    .header_as_record_batch()
                    .ok_or_else(|| bad("batch missing".into()))?;
                if batch.compression().is_some() {
                    return Err(bad("compressed parameter batches are not supported".into()));
                }
                let rows = usize::try_from(batch.length()).map_err(|_| bad("negative row count".into()))?;
                let nodes = batch.nodes().ok_or_else(|| bad("batch without field nodes".into()))?;
                let buffers = batch.buffers().ok_or_else(|| bad("batch without buffers".into()))?;
                if nodes.len() != columns.len() {
                    return Err(bad(format!(
                        "{} field nodes for {} columns",
                        nodes.len(),
                        columns.len()
                    )));
                }
                let variadic: Vec<i64> = batch
                    .variadicBufferCounts()
                    .map(|v| v.iter().collect())
                    .unwrap_or_default();
                let mut variadic = variadic.into_iter();
                let mut next = 0usize;
                let mut buffer = |column: usize| -> Result<usize, String> {
                    let b = buffers
                        .iter()
                        .nth(next)
                        .ok_or_else(|| bad(format!("parameter {}: buffers missing", column + 1)))?;
                    next += 1;
                    let (offset, len) = (usize::try_from(b.offset()), usize::try_from(b.length()));
                    match (offset, len) {
                        (Ok(o), Ok(l)) if o.checked_add(l).is_some_and(|end| end <= body.len()) => Ok(l),
                        _ => Err(bad(format!(
                            "parameter {}: buffer at {} of {} bytes is outside the {}-byte body",
                            column + 1,
                            b.offset(),
                            b.length(),
                            body.len()
                        ))),
                    }
                };
                for (i, (node, layout)) in nodes.iter().zip(columns).enumerate() {
                    let len = usize::try_from(node.length())
                        .ok()
                        .filter(|l| *l == rows)
                        .ok_or_else(|| {
                            bad(format!(
                                "parameter {}: {} values in a batch of {rows}",
                                i + 1,
                                node.length()
                            ))
                        })?;
                    let nulls = usize::try_from(node.null_count())
                        .ok()
                        .filter(|n| *n <= len)
                        .ok_or_else(|| bad(format!("parameter {}: null count {}", i + 1, node.null_count())))?;
                    let short =
                        |what: &str| bad(format!("parameter {}: {what} buffer too short for {len} values", i + 1));
                    let bitmap = len.div_ceil(8);
                    let validity = buffer(i)?;
                    if nulls > 0 && validity < bitmap {
                        return Err(short("validity"));
                    }
                    let values = buffer(i)?;
                    let needed = match *layout {
                        Layout::Bits => Some(bitmap),
                        Layout::Fixed(width) => len.checked_mul(width),
                        // No values, no offsets needed (writers differ).
                        Layout::Offsets(_) if len == 0 => Some(0),
                        Layout::Offsets(width) => (len + 1).checked_mul(width),
                        Layout::Views => len.checked_mul(16),
                    };
                    if needed.is_none_or(|n| values < n) {
                        return Err(short("values"));
                    }
                    match layout {
                        // The string bytes: offsets into them are checked by
                        // arrow's validation, which returns errors.
                        Layout::Offsets(_) => {
                            buffer(i)?;
                        }
                        Layout::Views => {
                            let count = variadic
                                .next()
                                .and_then(|c| usize::try_from(c).ok())
                                .filter(|c| *c <= buffers.len())
                                .ok_or_else(|| bad(format!("parameter {}: variadic buffer count missing", i + 1)))?;
                            for _ in 0..count {
                                buffer(i)?;
                            }
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            other => Err(bad(format!(
                "{other:?} messages are not supported in parameters (flat columns only)"
            ))),
        }
    }
}

/// The layout of a bindable column type as IPC writes it, or why the
/// field cannot be a parameter. Mirrors the checks arrow-ipc's
/// `fb_to_schema` makes with `panic!`.
fn layout(f: &arrow::ipc::Field) -> Result<Layout, String> {
    use arrow::ipc::{DateUnit, Precision, TimeUnit, Type};
    if f.dictionary().is_some() || f.children().is_some_and(|c| !c.is_empty()) {
        return Err("dictionary and nested columns cannot be bound".into());
    }
    let missing = || format!("{:?} type without its parameters", f.type_type());
    Ok(match f.type_type() {
        Type::Bool => Layout::Bits,
        Type::Int => {
            let int = f.type_as_int().ok_or_else(missing)?;
            match int.bitWidth() {
                8 | 16 | 32 | 64 => Layout::Fixed(int.bitWidth() as usize / 8),
                w => return Err(format!("integers of {w} bits do not exist")),
            }
        }
        Type::FloatingPoint => match f.type_as_floating_point().ok_or_else(missing)?.precision() {
            Precision::HALF => Layout::Fixed(2),
            Precision::SINGLE => Layout::Fixed(4),
            Precision::DOUBLE => Layout::Fixed(8),
            p => return Err(format!("floating point precision {p:?} does not exist")),
        },
        Type::Decimal => {
            let d = f.type_as_decimal().ok_or_else(missing)?;
            let (max, width) = match d.bitWidth() {
                128 => (38, 16),
                256 => (76, 32),
                w => return Err(format!("decimals of {w} bits cannot be bound")),
            };
            if !(1..=max).contains(&d.precision()) || d.scale().abs() > d.precision() {
                return Err(format!("DECIMAL({}, {}) is out of range", d.precision(), d.scale()));
            }
            Layout::Fixed(width)
        }
        Type::Utf8 => Layout::Offsets(4),
        Type::LargeUtf8 => Layout::Offsets(8),
        Type::Utf8View => Layout::Views,
        Type::Date => match f.type_as_date().ok_or_else(missing)?.unit() {
            DateUnit::DAY => Layout::Fixed(4),
            DateUnit::MILLISECOND => Layout::Fixed(8),
            u => return Err(format!("date unit {u:?} does not exist")),
        },
        Type::Time => {
            let t = f.type_as_time().ok_or_else(missing)?;
            match (t.unit(), t.bitWidth()) {
                (TimeUnit::SECOND | TimeUnit::MILLISECOND, 32) => Layout::Fixed(4),
                (TimeUnit::MICROSECOND | TimeUnit::NANOSECOND, 64) => Layout::Fixed(8),
                (u, w) => return Err(format!("time of unit {u:?} in {w} bits does not exist")),
            }
        }
        Type::Timestamp => match f.type_as_timestamp().ok_or_else(missing)?.unit() {
            TimeUnit::SECOND | TimeUnit::MILLISECOND | TimeUnit::MICROSECOND | TimeUnit::NANOSECOND => Layout::Fixed(8),
            u => return Err(format!("timestamp unit {u:?} does not exist")),
        },
        other => return Err(format!("values of type {other:?} cannot be bound")),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, StringArray};

    use super::*;

    fn batch(cols: Vec<ArrayRef>) -> RecordBatch {
        RecordBatch::try_from_iter(cols.into_iter().enumerate().map(|(i, c)| (format!("p{i}"), c))).expect("ok")
    }

    #[test]
    fn question_marks_bind_in_order_and_strings_are_escaped() {
        let t = Template::parse("SELECT ? + 1, '?' AS q WHERE name = ?").expect("ok");
        assert_eq!(t.param_count, 2);
        let params = batch(vec![
            Arc::new(Int64Array::from(vec![41])),
            Arc::new(StringArray::from(vec!["o'brien"])),
        ]);
        assert_eq!(
            t.bind(&params, 0).expect("ok"),
            "SELECT (41) + 1, '?' AS q WHERE name = 'o''brien'"
        );
        assert_eq!(t.with_nulls(), "SELECT NULL + 1, '?' AS q WHERE name = NULL");
    }

    #[test]
    fn numbered_placeholders_may_repeat_and_must_all_be_bound() {
        let t = Template::parse("SELECT $2, $1, $2").expect("ok");
        assert_eq!(t.param_count, 2);
        let params = batch(vec![
            Arc::new(Int64Array::from(vec![1, 3])),
            Arc::new(Int64Array::from(vec![Some(2), None])),
        ]);
        assert_eq!(t.bind(&params, 1).expect("ok"), "SELECT NULL, (3), NULL");
        let one = batch(vec![Arc::new(Int64Array::from(vec![1]))]);
        assert!(t.bind(&one, 0).expect_err("an error").contains("2 parameter(s) but 1"));
        assert!(Template::parse("SELECT ?, $1").is_err());
        assert!(Template::parse("SELECT $2000000000").is_err());
    }

    #[test]
    fn rendering_keeps_quotes_and_negative_numbers_cannot_start_a_comment() {
        let t = Template::parse("SELECT 'it''s', \"a\"\"b\" WHERE a = -? AND t = 'x'").expect("ok");
        assert_eq!(t.with_nulls(), "SELECT 'it''s', \"a\"\"b\" WHERE a = -NULL AND t = 'x'");
        let params = batch(vec![Arc::new(Int64Array::from(vec![-1]))]);
        assert_eq!(
            t.bind(&params, 0).expect("ok"),
            "SELECT 'it''s', \"a\"\"b\" WHERE a = -(-1) AND t = 'x'"
        );
    }
}
