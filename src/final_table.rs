//! The final table of a bounded query whose result is updating (a GROUP BY,
//! a Top-N, an outer join): what a database client asking over Flight SQL
//! expects, instead of the changelog that produced it. Flink's SQL client
//! shows such a query in its `table` result mode (its default) as the
//! table the changes add up to; its SQL gateway's JDBC driver reads the
//! same. The changelog stays available: `SUBSCRIBE`, or
//! `sql-client.execution.result-mode` = `changelog` / `tableau`.
//!
//! Rows are kept by their bytes in Arrow's row format with a count each
//! (a result may hold the same row twice: `SELECT g FROM (… GROUP BY g, x)`),
//! in the order they first appeared; an updated row keeps its place (the
//! `+U` takes the place its `-U` left), as the shell's table does.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::row::{RowConverter, SortField};
use weir_engine::change::{ChangeBatch, RowKind};

/// Rows per batch the final table is sent in.
const BATCH_ROWS: usize = 8192;

pub struct FinalTable {
    schema: SchemaRef,
    converter: RowConverter,
    /// Row bytes → (place, count).
    rows: HashMap<Box<[u8]>, (u64, u64)>,
    next_place: u64,
    /// The place of the row the last `-U` removed: its `+U` goes there.
    hole: Option<u64>,
}

impl FinalTable {
    fn fields(schema: &Schema) -> Vec<SortField> {
        schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect()
    }

    /// Whether rows of `schema` can be kept (Arrow's row format covers
    /// every type but a few nested ones): decided when the query is
    /// planned, so the columns announced before it runs are the ones sent.
    pub fn supports(schema: &Schema) -> bool {
        RowConverter::supports_fields(&Self::fields(schema))
    }

    pub fn new(schema: SchemaRef) -> Result<Self, ArrowError> {
        let converter = RowConverter::new(Self::fields(&schema))?;
        Ok(Self {
            schema,
            converter,
            rows: HashMap::new(),
            next_place: 0,
            hole: None,
        })
    }

    /// Applies one batch of changes: `+I`/`+U` add a row, `-U`/`-D` take
    /// one away. A retraction of a row not in the table (which a correct
    /// changelog never sends) changes nothing.
    pub fn apply(&mut self, changes: &ChangeBatch) -> Result<(), ArrowError> {
        let rows = self.converter.convert_columns(changes.rows.columns())?;
        for i in 0..changes.num_rows() {
            let bytes = rows.row(i);
            let kind = changes.kind(i);
            if kind.is_accumulate() {
                // A hole is for the `+U` right after its `-U`, nothing later.
                let hole = self.hole.take().filter(|_| kind == RowKind::UpdateAfter);
                if let Some((_, n)) = self.rows.get_mut(bytes.as_ref()) {
                    *n += 1;
                    continue;
                }
                let place = match hole {
                    Some(h) => h,
                    None => {
                        self.next_place += 1;
                        self.next_place
                    }
                };
                self.rows.insert(bytes.as_ref().into(), (place, 1));
            } else if let Some((place, n)) = self.rows.get_mut(bytes.as_ref()) {
                self.hole = None;
                *n -= 1;
                if *n == 0 {
                    let place = *place;
                    self.rows.remove(bytes.as_ref());
                    self.hole = (kind == RowKind::UpdateBefore).then_some(place);
                }
            }
        }
        Ok(())
    }

    /// The table: each row as many times as it is in the result, in the
    /// order rows first appeared.
    pub fn finish(self) -> Result<Vec<RecordBatch>, ArrowError> {
        let mut placed: Vec<(u64, &[u8], u64)> = self.rows.iter().map(|(b, (p, n))| (*p, &b[..], *n)).collect();
        placed.sort_unstable_by_key(|(p, _, _)| *p);
        let parser = self.converter.parser();
        let mut batches = vec![];
        let mut chunk = Vec::with_capacity(BATCH_ROWS.min(placed.len()));
        let rows = placed
            .iter()
            .flat_map(|(_, bytes, n)| std::iter::repeat_n(*bytes, *n as usize));
        for bytes in rows {
            chunk.push(bytes);
            if chunk.len() == BATCH_ROWS {
                batches.push(self.batch(&parser, &chunk)?);
                chunk.clear();
            }
        }
        if !chunk.is_empty() {
            batches.push(self.batch(&parser, &chunk)?);
        }
        Ok(batches)
    }

    fn batch(&self, parser: &arrow::row::RowParser, rows: &[&[u8]]) -> Result<RecordBatch, ArrowError> {
        let columns = self.converter.convert_rows(rows.iter().map(|b| parser.parse(b)))?;
        RecordBatch::try_new(Arc::clone(&self.schema), columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field};

    fn changes(schema: &SchemaRef, rows: &[(&str, Option<&str>, i64)]) -> ChangeBatch {
        let kinds = rows
            .iter()
            .map(|(k, _, _)| RowKind::from_short(k).expect("kind"))
            .collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(rows.iter().map(|(_, g, _)| *g).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(rows.iter().map(|(_, _, n)| *n).collect::<Vec<_>>())),
            ],
        )
        .expect("batch");
        ChangeBatch::new(batch, kinds)
    }

    fn rows_of(batches: &[RecordBatch]) -> Vec<(Option<String>, i64)> {
        let mut out = vec![];
        for b in batches {
            let g = b.column(0).as_any().downcast_ref::<StringArray>().expect("strings");
            let n = b.column(1).as_any().downcast_ref::<Int64Array>().expect("ints");
            for i in 0..b.num_rows() {
                out.push((g.is_valid(i).then(|| g.value(i).to_string()), n.value(i)));
            }
        }
        out
    }

    #[test]
    fn changes_add_up_to_the_table_in_first_seen_order() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let mut t = FinalTable::new(schema.clone()).expect("table");
        t.apply(&changes(
            &schema,
            &[
                ("+I", Some("a"), 1),
                ("+I", Some("b"), 1),
                ("+I", None, 1),
                ("-U", Some("a"), 1),
            ],
        ))
        .expect("apply");
        // The update of `a` keeps its place; `b` goes; a NULL key stays
        // told apart from the string; a duplicate row is kept twice; a
        // retraction of an absent row changes nothing.
        t.apply(&changes(
            &schema,
            &[
                ("+U", Some("a"), 2),
                ("-D", Some("b"), 1),
                ("+I", Some("c"), 5),
                ("+I", Some("c"), 5),
                ("-D", Some("zz"), 9),
            ],
        ))
        .expect("apply");
        let out = rows_of(&t.finish().expect("finish"));
        assert_eq!(
            out,
            vec![
                (Some("a".into()), 2),
                (None, 1),
                (Some("c".into()), 5),
                (Some("c".into()), 5)
            ]
        );
    }

    #[test]
    fn a_large_table_comes_in_batches_and_an_empty_one_in_none() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let empty = FinalTable::new(schema.clone()).expect("table");
        assert!(empty.finish().expect("finish").is_empty());
        let mut t = FinalTable::new(schema.clone()).expect("table");
        let names: Vec<String> = (0..20_000).map(|i| format!("k{i}")).collect();
        let rows: Vec<(&str, Option<&str>, i64)> = names.iter().map(|n| ("+I", Some(n.as_str()), 1)).collect();
        t.apply(&changes(&schema, &rows)).expect("apply");
        let batches = t.finish().expect("finish");
        assert_eq!(
            batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            vec![8192, 8192, 3616]
        );
        assert_eq!(rows_of(&batches)[19_999].0.as_deref(), Some("k19999"));
    }
}
