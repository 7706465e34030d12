//! Integer literals typed as Flink types them: `INT` when the value fits,
//! `BIGINT` otherwise. DataFusion types every integer literal `BIGINT`, so
//! without this `i + 1` of an `INT` column is a `BIGINT` that does not wrap
//! at `INT`'s range, `ARRAY[1, 2]` is `ARRAY<BIGINT>`, and `m * 2` of a
//! `DECIMAL(10, 2)` takes `DECIMAL(20, 0)`'s precision for the literal
//! (Flink: `DECIMAL(21, 2)`).
//!
//! Runs on the plan SqlToRel builds, before type coercion, so coercion
//! then widens the literal wherever the other side needs it (`b = 5` of a
//! `BIGINT` compares as `BIGINT`).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder};

/// Types the integer literals of `plan` (and of its subqueries) as Flink.
pub fn flink_literals(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    plan.transform_up_with_subqueries(|node| {
        // LIMIT and OFFSET counts are DataFusion's own BIGINT operands.
        if matches!(node, LogicalPlan::Limit(_)) {
            return Ok(Transformed::no(node));
        }
        let names = datafusion::logical_expr::expr_rewriter::NamePreserver::new(&node);
        let t = node.map_expressions(|e| {
            let saved = names.save(&e);
            Ok(flink_literals_in(e)?.update_data(|e| saved.restore(e)))
        })?;
        if !t.transformed {
            return Ok(t);
        }
        t.map_data(|n| match n {
            // A VALUES node keeps the schema it was built with: build it
            // again, so its columns are typed by their new literals.
            LogicalPlan::Values(v) => LogicalPlanBuilder::values(v.values)?.build(),
            n => n.recompute_schema(),
        })
    })
}

/// Types the integer literals of one expression as Flink.
pub fn flink_literals_in(e: Expr) -> Result<Transformed<Expr>> {
    e.transform_down(|e| match &e {
        // The window marker reads its literal arguments as BIGINT.
        Expr::ScalarFunction(call) if call.func.name() == crate::udf::WINDOW_FN => {
            Ok(Transformed::new(e, false, TreeNodeRecursion::Jump))
        }
        // A number as the parser types it (`parser::rewrite_numbers`), or
        // a user's cast of one: the literal itself. An exact number keeps
        // its value and scale, and takes the precision of its digits.
        Expr::Cast(c) if matches!(c.field.data_type(), DataType::Decimal128(..)) => {
            match (&*c.expr, c.field.data_type()) {
                (Expr::Literal(ScalarValue::Decimal128(Some(v), _, s), meta), DataType::Decimal128(p, to_s))
                    if s == to_s && (v.unsigned_abs() < 10u128.pow(u32::from(*p))) =>
                {
                    Ok(Transformed::yes(Expr::Literal(
                        ScalarValue::Decimal128(Some(*v), *p, *s),
                        meta.clone(),
                    )))
                }
                _ => Ok(Transformed::no(e)),
            }
        }
        Expr::Cast(c) if c.field.data_type() == &DataType::Float64 => match &*c.expr {
            Expr::Literal(ScalarValue::Utf8(Some(text)), meta) => match text.trim().parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(Transformed::yes(Expr::Literal(
                    ScalarValue::Float64(Some(v)),
                    meta.clone(),
                ))),
                _ => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        },
        Expr::Literal(ScalarValue::Int64(Some(v)), meta) => match i32::try_from(*v) {
            Ok(v) => Ok(Transformed::yes(Expr::Literal(
                ScalarValue::Int32(Some(v)),
                meta.clone(),
            ))),
            Err(_) => Ok(Transformed::no(e)),
        },
        _ => Ok(Transformed::no(e)),
    })
}
