//! `OVER (PARTITION BY expr ...)`: the expression becomes a column below
//! the window, and the projection above reads that column where it
//! computes the same expression, as Calcite's programs do for Flink.
//!
//! DataFusion evaluates a partition expression inside the window, so the
//! projection above (`auction % 4 AS bucket`) computes it a second time
//! and nothing tells that `bucket` is the partition key: a Top-N with its
//! rank (`PARTITION BY auction % 4 ... WHERE rn <= 3`) then has no upsert
//! key, and an upsert sink keyed `(bucket, rn)` was refused where Flink
//! takes it. With the expression a column, the rank partitions by that
//! column and `bucket` is a plain copy of it.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, Window};

use crate::planner::patterns::top_n::window_function;

/// The prefix of the columns made for partition expressions.
const PARTITION_COLUMN: &str = "__weir_partition_";

pub fn window_partitions(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::Projection(p) = &node else {
            return Ok(Transformed::no(node));
        };
        let LogicalPlan::Window(w) = p.input.as_ref() else {
            return Ok(Transformed::no(node));
        };
        // Two OVER windows stack as window over window, which the planner
        // refuses as Flink does: a projection between them would hide it.
        if matches!(w.input.as_ref(), LogicalPlan::Window(_)) {
            return Ok(Transformed::no(node));
        }
        let mut exprs: Vec<Expr> = vec![];
        for e in &w.window_expr {
            if let Some(wf) = window_function(e) {
                for pe in &wf.params.partition_by {
                    // A volatile expression (`RAND()`) above is another
                    // draw, not the partition's value.
                    if !matches!(pe, Expr::Column(_)) && !pe.is_volatile() && !exprs.iter().any(|x| x == pe) {
                        exprs.push(pe.clone());
                    }
                }
            }
        }
        if exprs.is_empty() {
            return Ok(Transformed::no(node));
        }
        // Names no column of the input has.
        let taken = |n: &str| w.input.schema().fields().iter().any(|f| f.name() == n);
        let mut names: Vec<String> = vec![];
        let mut i = 0;
        while names.len() < exprs.len() {
            let n = format!("{PARTITION_COLUMN}{i}");
            if !taken(&n) {
                names.push(n);
            }
            i += 1;
        }
        let as_column = |e: Expr| -> Result<Expr> {
            e.transform_down(|x| match exprs.iter().position(|p| *p == x) {
                Some(i) => Ok(Transformed::new(
                    Expr::Column(datafusion::common::Column::from_name(&names[i])),
                    true,
                    TreeNodeRecursion::Jump,
                )),
                None => Ok(Transformed::no(x)),
            })
            .map(|t| t.data)
        };
        // Below the window: its input's columns and the expressions.
        let mut below: Vec<Expr> = w.input.schema().columns().into_iter().map(Expr::Column).collect();
        below.extend(exprs.iter().zip(&names).map(|(e, n)| e.clone().alias(n)));
        let below = LogicalPlan::Projection(Projection::try_new(below, w.input.clone())?);
        // The window partitions by the columns; its expressions keep
        // their names (the projection above reads them by name).
        let window_expr = w
            .window_expr
            .iter()
            .map(|e| {
                let name = e.schema_name().to_string();
                e.clone()
                    .transform_down(|x| match x {
                        Expr::WindowFunction(mut wf) => {
                            wf.params.partition_by = wf
                                .params
                                .partition_by
                                .into_iter()
                                .map(as_column)
                                .collect::<Result<Vec<_>>>()?;
                            Ok(Transformed::new(
                                Expr::WindowFunction(wf),
                                true,
                                TreeNodeRecursion::Jump,
                            ))
                        }
                        x => Ok(Transformed::no(x)),
                    })
                    .and_then(|t| t.data.alias_if_changed(name))
            })
            .collect::<Result<Vec<_>>>()?;
        let window = LogicalPlan::Window(Window::try_new(window_expr, Arc::new(below))?);
        // Above: the same columns out, the expressions read from below.
        let above = p
            .expr
            .iter()
            .map(|e| {
                let name = e.schema_name().to_string();
                as_column(e.clone()).and_then(|x| x.alias_if_changed(name))
            })
            .collect::<Result<Vec<_>>>()?;
        let projection = Projection::try_new(above, Arc::new(window))?;
        Ok(Transformed::yes(LogicalPlan::Projection(projection)))
    })
}
