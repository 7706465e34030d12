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
