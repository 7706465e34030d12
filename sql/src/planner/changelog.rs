//! Changelog modes (Flink's inference for the operators Weir has): what
//! each node emits, which node makes a stream updating, the refusals of
//! updates where only inserts may go, and monotonic columns.

use datafusion::physical_expr::expressions::Column;
use weir_engine::plan::{AggFunc, CalcNode, ChangelogMode, NodeId, NodeKind};

use crate::error::{Result, SqlError};

use crate::planner::build::GraphBuilder;
use crate::planner::patterns::top_n::*;

impl GraphBuilder<'_> {
    /// How column `col` of node `id` changes for one upsert key: through
    /// projections without a filter (a filter may turn an update into a
    /// delete) down to a GROUP BY over insert-only input, whose keys are
    /// constant, COUNT and MAX increase and MIN decreases (SUM may go
    /// either way). `None`: not known to be monotonic.
    pub(crate) fn monotonicity(&self, id: NodeId, col: usize) -> Option<Monotonicity> {
        let input = self.edges.iter().find(|e| e.to == id).map(|e| e.from);
        match &self.nodes[id].kind {
            NodeKind::Calc(CalcNode {
                filter: None,
                projection,
            }) => {
                let col = match projection {
                    Some(p) => p.get(col)?.downcast_ref::<Column>()?.index(),
                    None => col,
                };
                self.monotonicity(input?, col)
            }
            NodeKind::GroupAggregate(g) if self.nodes[input?].changelog.is_insert_only() => {
                if col < g.keys.len() {
                    return Some(Monotonicity::Constant);
                }
                match g.aggregates.get(col - g.keys.len())?.func {
                    AggFunc::Count | AggFunc::Max => Some(Monotonicity::Increasing),
                    AggFunc::Min => Some(Monotonicity::Decreasing),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The changelog mode of a node of `kind` fed by `input` (Flink's
    /// inference, for the operators Weir has).
    pub(crate) fn mode_of(&self, kind: &NodeKind, input: Option<NodeId>) -> ChangelogMode {
        let input = input.map(|i| self.nodes[i].changelog.clone()).unwrap_or_default();
        kind.spec().changelog(&input)
    }

    /// The node that makes `id`'s output updating: `id` itself, or the
    /// first updating node up its chain of calcs (what errors name).
    pub(crate) fn updating_origin(&self, mut id: NodeId) -> NodeId {
        while let NodeKind::Calc(_) | NodeKind::Sink(_) = self.nodes[id].kind {
            match self.edges.iter().find(|e| e.to == id) {
                Some(e) if !self.nodes[e.from].changelog.is_insert_only() => id = e.from,
                _ => break,
            }
        }
        id
    }

    /// Flink's refusal when an insert-only consumer (`what`) is fed
    /// updates by `input`.
    pub(crate) fn require_insert_only(&self, input: NodeId, what: &str) -> Result<()> {
        let mode = &self.nodes[input].changelog;
        if mode.is_insert_only() {
            return Ok(());
        }
        let origin = self.updating_origin(input);
        Err(SqlError::unsupported(format!(
            "{what} doesn't support consuming {} changes which is produced by node {}",
            mode.changes_text(),
            self.nodes[origin].describe()
        )))
    }
}
