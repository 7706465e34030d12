//! Analyzer-style passes over DataFusion's logical plan, run by the
//! planner after DataFusion's own analysis: each rewrites expressions into
//! what Flink means by them.
//! - [`literals`]: integer literals are `INT` when they fit, as in Flink.
//! - [`casts`]: casts to strings write Flink's text; narrowing casts wrap
//!   as Java's do.
//! - [`local_zone`]: a `table.local-time-zone` other than UTC.
//! - [`window_partitions`]: a window's partition expressions become
//!   columns below it (before the optimizer merges projections).

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::{Expr, LogicalPlan};

pub mod casts;
pub mod literals;
pub mod local_zone;
pub mod window_partitions;

/// Rewrites every expression of every node of `plan` (subqueries
/// included) with `f`, given the schema the expression reads.
pub fn rewrite_expressions(
    plan: LogicalPlan,
    f: impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<Transformed<LogicalPlan>> {
    plan.transform_up_with_subqueries(|node| {
        let schema = match node.inputs().as_slice() {
            [] => return Ok(Transformed::no(node)),
            [one] => one.schema().clone(),
            many => {
                let mut merged = many[0].schema().as_ref().clone();
                for s in &many[1..] {
                    merged.merge(s.schema());
                }
                Arc::new(merged)
            }
        };
        // Rewritten expressions keep their names (nodes above refer to
        // columns by them) and the node its schema recomputed (EXTRACT
        // becomes BIGINT).
        let names = datafusion::logical_expr::expr_rewriter::NamePreserver::new(&node);
        let t = node.map_expressions(|e| {
            let saved = names.save(&e);
            Ok(f(e, &schema)?.update_data(|e| saved.restore(e)))
        })?;
        if t.transformed {
            t.map_data(|n| n.recompute_schema())
        } else {
            Ok(t)
        }
    })
}
