//! Filter and projection over whole batches with DataFusion physical
//! expressions (`WHERE` and the `SELECT` list of a stateless query part).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};

use arrow::array::{Array, BooleanArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;

use super::{Collector, Operator};
use crate::canonical::{canonical_expr, canonical_exprs};
use crate::change::ChangeBatch;
use crate::error::{ExecError, Result};
use crate::operators::build::BuildCtx;
use crate::plan::CalcNode;
use crate::plan::{ChangelogMode, PlanNode, StreamNode};

pub struct CalcOperator {
    name: String,
    filter: Option<Arc<dyn PhysicalExpr>>,
    projection: Option<Vec<Arc<dyn PhysicalExpr>>>,
    schema: SchemaRef,
    /// The watermark this subtask has received, when an expression reads
    /// it (`CURRENT_WATERMARK`).
    watermark: Option<Arc<AtomicI64>>,
}

impl PlanNode for CalcNode {
    fn describe(&self) -> String {
        let mut parts = vec![];
        if let Some(f) = &self.filter {
            parts.push(format!("filter {f}"));
        }
        if let Some(p) = &self.projection {
            let cols: Vec<String> = p.iter().map(|e| e.to_string()).collect();
            parts.push(format!("project [{}]", cols.join(", ")));
        }
        format!("Calc: {}", parts.join(", "))
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        (
            "calc",
            format!(
                "filter={};project={}",
                self.filter.as_ref().map(canonical_expr).unwrap_or_default(),
                self.projection.as_deref().map(canonical_exprs).unwrap_or_default()
            ),
        )
    }

    fn changelog(&self, input: &ChangelogMode) -> ChangelogMode {
        match &self.projection {
            Some(p) => input.through_projection(
                &p.iter()
                    .map(|e| e.downcast_ref::<Column>().map(|c| c.index()))
                    .collect::<Vec<_>>(),
            ),
            None => input.clone(),
        }
    }
}

/// The operator of a projection/filter's subtask.
pub fn build(node: &CalcNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    Ok(Box::new(CalcOperator::new(
        node,
        ctx.input_schema()?.as_ref(),
        ctx.schema(),
    )?))
}

impl CalcOperator {
    /// `input` is the schema the node's expressions read.
    pub fn new(node: &CalcNode, input: &Schema, schema: SchemaRef) -> Result<Self> {
        // Each subtask binds `CURRENT_WATERMARK` to its own watermark.
        let watermark = Arc::new(AtomicI64::new(i64::MIN));
        let mut reads_watermark = false;
        let mut bind = |e: &Arc<dyn PhysicalExpr>| -> Result<Arc<dyn PhysicalExpr>> {
            let (bound, found) = crate::expr::bind_current_watermark(e.clone(), input, &watermark)?;
            reads_watermark |= found;
            Ok(bound)
        };
        let filter = node.filter.as_ref().map(&mut bind).transpose()?;
        let projection = match &node.projection {
            Some(p) => Some(p.iter().map(&mut bind).collect::<Result<Vec<_>>>()?),
            None => None,
        };
        Ok(Self {
            name: node.describe(),
            filter,
            projection,
            schema,
            watermark: reads_watermark.then_some(watermark),
        })
    }
}

/// Evaluates `exprs` on `batch` into a batch of `schema`.
pub fn project(batch: &RecordBatch, exprs: &[Arc<dyn PhysicalExpr>], schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = exprs
        .iter()
        .map(|e| e.evaluate(batch).and_then(|v| v.into_array(batch.num_rows())))
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(schema.clone(), columns, &options)?)
}

/// A batch of `schema` from `columns`, casting any column whose type
/// differs (a connector's natural type to the declared one, an aggregate's
/// result to the planned one).
pub fn batch_with_schema(schema: &SchemaRef, columns: Vec<arrow::array::ArrayRef>) -> Result<RecordBatch> {
    let rows = columns.first().map_or(0, |c| c.len());
    batch_of_rows(schema, columns, rows)
}

/// [`batch_with_schema`] with its row count given: a batch of no columns
/// (a source read only for `COUNT(*)`) still has rows.
pub fn batch_of_rows(schema: &SchemaRef, columns: Vec<arrow::array::ArrayRef>, rows: usize) -> Result<RecordBatch> {
    let columns = columns
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c)
            } else {
                arrow::compute::cast(&c, f.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(schema.clone(), columns, &options)?)
}

/// Rows of `batch` for which `predicate` is true (null counts as false).
pub fn filter(batch: &RecordBatch, predicate: &Arc<dyn PhysicalExpr>) -> Result<RecordBatch> {
    let mask = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
    let mask = mask
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| ExecError::internal("filter predicate is not boolean"))?;
    if mask.true_count() == batch.num_rows() && mask.null_count() == 0 {
        return Ok(batch.clone());
    }
    Ok(filter_record_batch(batch, mask)?)
}

/// [`filter`] over a change batch: kinds follow their rows.
fn filter_changes(batch: ChangeBatch, predicate: &Arc<dyn PhysicalExpr>) -> Result<ChangeBatch> {
    if batch.is_insert_only() {
        return Ok(filter(&batch.rows, predicate)?.into());
    }
    let mask = predicate.evaluate(&batch.rows)?.into_array(batch.num_rows())?;
    let mask = mask
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| ExecError::internal("filter predicate is not boolean"))?;
    if mask.true_count() == batch.num_rows() && mask.null_count() == 0 {
        return Ok(batch);
    }
    // Null counts as false, as in `filter_record_batch`.
    let mask = crate::change::null_as_false(mask);
    Ok(batch.filter(&mask)?)
}

impl Operator for CalcOperator {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_watermark(&mut self, watermark: crate::message::Timestamp, _out: &mut Collector) -> Result<()> {
        if let Some(w) = &self.watermark {
            w.fetch_max(watermark, AtomicOrdering::Relaxed);
        }
        Ok(())
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        // Row kinds pass through: a filtered-out change is dropped with
        // its row, a projected one keeps its kind.
        let batch = match &self.filter {
            Some(f) => filter_changes(batch, f)?,
            None => batch,
        };
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = match &self.projection {
            Some(p) => batch.with_rows(project(&batch.rows, p, &self.schema)?),
            None => batch,
        };
        out.emit(batch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::testing::feed_pretty;
    use arrow::datatypes::{DataType, Field};
    use datafusion::logical_expr::Operator as BinOp;
    use datafusion::physical_expr::expressions::{binary, col, lit};

    fn input() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    /// `SELECT v * 10, k WHERE v > 1`.
    fn calc() -> CalcOperator {
        let s = input();
        let c = |name: &str| col(name, &s).expect("a column of the input");
        let node = CalcNode {
            filter: Some(binary(c("v"), BinOp::Gt, lit(1i64), &s).expect("v > 1")),
            projection: Some(vec![
                binary(c("v"), BinOp::Multiply, lit(10i64), &s).expect("v * 10"),
                c("k"),
            ]),
        };
        let out = Arc::new(Schema::new(vec![
            Field::new("v10", DataType::Int64, true),
            Field::new("k", DataType::Utf8, true),
        ]));
        CalcOperator::new(&node, &s, out).expect("calc")
    }

    #[test]
    fn filters_and_projects_rows_keeping_their_kinds() {
        let mut c = calc();
        let out = feed_pretty(
            &mut c,
            0,
            &input(),
            "
            a 1
            -U b 2
            +U b 3
            -D . 4
            c .
            ",
        );
        // A NULL condition drops its row, as a false one.
        assert_eq!(out, ["-U[20, b]", "+U[30, b]", "-D[40, null]"]);
    }

    #[test]
    fn a_batch_of_no_passing_rows_emits_nothing() {
        let mut c = calc();
        assert!(feed_pretty(&mut c, 0, &input(), "a 0\nb 1").is_empty());
    }
}
