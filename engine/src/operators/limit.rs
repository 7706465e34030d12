//! `LIMIT n [OFFSET m]` on a single subtask: passes the first rows through,
//! then tells the runtime it needs no more input so the job can end. Its
//! two counters are its checkpointed state.

use super::{Collector, Operator};
use crate::checkpoint::OperatorSnapshot;
use crate::error::Result;
use crate::operators::build::BuildCtx;
use crate::plan::{LimitNode, PlanNode, StreamNode};

pub struct LimitOperator {
    skip: usize,
    remaining: usize,
}

impl PlanNode for LimitNode {
    fn describe(&self) -> String {
        format!("Limit: fetch {} skip {}", self.fetch, self.skip)
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        ("limit", format!("skip={};fetch={}", self.skip, self.fetch))
    }

    // A LIMIT's count is operator state, not keyed: no state keys.
}

/// The operator of a LIMIT's subtask, from its restored count if any.
pub fn build(node: &crate::plan::LimitNode, ctx: &BuildCtx) -> Result<Box<dyn Operator>> {
    Ok(match ctx.restored_operator_state() {
        Some(bytes) => Box::new(LimitOperator::restore(bytes)?),
        None => Box::new(LimitOperator::new(node.skip, node.fetch)),
    })
}

impl LimitOperator {
    pub fn new(skip: usize, fetch: usize) -> Self {
        Self { skip, remaining: fetch }
    }

    /// Continues from a checkpoint's counters (16 bytes, LE).
    pub fn restore(bytes: &[u8]) -> Result<Self> {
        let field = |i: usize| -> Option<usize> {
            Some(u64::from_le_bytes(bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?) as usize)
        };
        match (bytes.len(), field(0), field(1)) {
            (16, Some(skip), Some(remaining)) => Ok(Self { skip, remaining }),
            _ => Err(crate::error::StateError::Corrupt {
                state: "limit".into(),
                message: format!("expected 16 bytes of counters, found {}", bytes.len()),
            }
            .into()),
        }
    }
}

impl Operator for LimitOperator {
    fn name(&self) -> &str {
        "Limit"
    }

    fn snapshot_state(&mut self, _checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        let mut bytes = (self.skip as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&(self.remaining as u64).to_le_bytes());
        Ok(Some(OperatorSnapshot::Heap(bytes)))
    }

    fn process_batch(&mut self, batch: crate::change::ChangeBatch, out: &mut Collector) -> Result<()> {
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
