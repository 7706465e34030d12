//! `UNION ALL`: the rows of every input, as they come, under the union's
//! column names (the planner has already cast each input to the union's
//! types). Row kinds pass through; the gate merges the inputs' channels,
//! so the watermark is the minimum over all of them.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};

use super::{Collector, Operator};
use crate::change::ChangeBatch;
use crate::error::Result;
use crate::operators::build::BuildCtx;

pub struct UnionOperator {
    schema: SchemaRef,
}

/// The operator of a UNION ALL's subtask.
pub fn build(ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    Ok(Box::new(UnionOperator::new(ctx.schema())))
}

impl UnionOperator {
    pub fn new(schema: SchemaRef) -> Self {
        Self { schema }
    }
}

impl Operator for UnionOperator {
    fn name(&self) -> &str {
        "Union All"
    }

    fn process_batch(&mut self, batch: ChangeBatch, out: &mut Collector) -> Result<()> {
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let rows = RecordBatch::try_new_with_options(self.schema.clone(), batch.rows.columns().to_vec(), &options)?;
        out.emit(batch.with_rows(rows));
        Ok(())
    }
}
