//! `LIMIT n [OFFSET m]` on a single subtask: passes the first rows through,
//! then tells the runtime it needs no more input so the job can end.

use arrow::record_batch::RecordBatch;

use super::{Collector, Operator};
use crate::error::Result;

pub struct LimitOperator {
    skip: usize,
    remaining: usize,
}

impl LimitOperator {
    pub fn new(skip: usize, fetch: usize) -> Self {
        Self { skip, remaining: fetch }
    }
}

impl Operator for LimitOperator {
    fn name(&self) -> &str {
        "Limit"
    }

    fn process_batch(&mut self, batch: RecordBatch, out: &mut Collector) -> Result<()> {
        let mut batch = batch;
        if self.skip > 0 {
            let n = self.skip.min(batch.num_rows());
            self.skip -= n;
            batch = batch.slice(n, batch.num_rows() - n);
        }
        let take = self.remaining.min(batch.num_rows());
        if take > 0 {
            out.emit(batch.slice(0, take));
            self.remaining -= take;
        }
        if self.remaining == 0 {
            out.finish();
        }
        Ok(())
    }
}
