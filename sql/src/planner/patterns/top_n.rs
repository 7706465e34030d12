//! Top-N in a logical plan: a `ROW_NUMBER()` window under a filter on it,
//! and how a column changes for one upsert key (Top-N's update-fast mode).

use arrow::datatypes::DataType;
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::error::{Result, SqlError};

/// A filter that makes a Top-N: the `ROW_NUMBER()` it bounds.
pub(crate) struct TopN<'a> {
    pub(crate) window: &'a datafusion::logical_expr::Window,
    pub(crate) window_plan: &'a LogicalPlan,
    /// Which window expression.
    pub(crate) index: usize,
    /// The rank column in the filter's input.
    pub(crate) column: usize,
    /// N, or why the bound is not one Weir runs.
    pub(crate) limit: Result<usize>,
    /// The filter's other conjuncts.
    pub(crate) rest: Vec<&'a Expr>,
}

/// The Top-N a filter makes, if its predicate bounds a window function's
/// column from above.
pub(crate) fn top_n_of(f: &datafusion::logical_expr::Filter) -> Option<TopN<'_>> {
    use datafusion::logical_expr::{BinaryExpr, Operator};
    let conjuncts = datafusion::logical_expr::utils::split_conjunction(&f.predicate);
    for (k, c) in conjuncts.iter().enumerate() {
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = c else {
            continue;
        };
        let lit = |e: &Expr| match e {
            Expr::Literal(v, _) => v.cast_to(&DataType::Int64).ok().and_then(|v| match v {
                datafusion::common::ScalarValue::Int64(Some(n)) => Some(n),
                _ => None,
            }),
            Expr::Cast(c) => match c.expr.as_ref() {
                Expr::Literal(v, _) => v.cast_to(&DataType::Int64).ok().and_then(|v| match v {
                    datafusion::common::ScalarValue::Int64(Some(n)) => Some(n),
                    _ => None,
                }),
                _ => None,
            },
            _ => None,
        };
        let col = |e: &Expr| match e.clone().unalias() {
            Expr::Column(c) => f.input.schema().index_of_column(&c).ok(),
            Expr::Cast(cast) => match *cast.expr {
                Expr::Column(c) => f.input.schema().index_of_column(&c).ok(),
                _ => None,
            },
            _ => None,
        };
        // rn OP n, or n OP rn (flipped).
        let (column, op, n) = match (col(left), lit(right), lit(left), col(right)) {
            (Some(c), Some(n), _, _) => (c, *op, n),
            (_, _, Some(n), Some(c)) => (
                c,
                match op {
                    Operator::Gt => Operator::Lt,
                    Operator::GtEq => Operator::LtEq,
                    Operator::Lt => Operator::Gt,
                    Operator::LtEq => Operator::GtEq,
                    o => *o,
                },
                n,
            ),
            _ => continue,
        };
        let Some((window, window_plan, index)) = trace_window(&f.input, column) else {
            continue;
        };
        let limit = match op {
            Operator::LtEq => Ok(n),
            Operator::Lt => Ok(n - 1),
            Operator::Eq if n == 1 => Ok(1),
            _ => Err(SqlError::unsupported(
                "a Top-N filter must bound the rank from above starting at 1 (rn <= N, rn < N or rn = 1)",
            )),
        }
        .and_then(|n| {
            usize::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| SqlError::unsupported("a Top-N needs a rank bound of at least 1"))
        });
        let rest = conjuncts
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != k)
            .map(|(_, e)| *e)
            .collect();
        return Some(TopN {
            window,
            window_plan,
            index,
            column,
            limit,
            rest,
        });
    }
    None
}

/// A window node's function under its aliases: DataFusion names a
/// window expression twice (`Alias(Alias(row_number() ...))`) when its
/// PARTITION BY is an expression (`PARTITION BY auction % 4`).
pub(crate) fn window_function(e: &Expr) -> Option<&datafusion::logical_expr::expr::WindowFunction> {
    match e {
        Expr::Alias(a) => window_function(&a.expr),
        Expr::WindowFunction(wf) => Some(wf),
        _ => None,
    }
}

/// Follows output column `idx` of `plan` down to a window function's
/// column: (the window, its plan node, which expression).
pub(crate) fn trace_window(
    plan: &LogicalPlan,
    idx: usize,
) -> Option<(&datafusion::logical_expr::Window, &LogicalPlan, usize)> {
    match plan {
        LogicalPlan::SubqueryAlias(a) => trace_window(&a.input, idx),
        LogicalPlan::Projection(p) => match p.expr.get(idx)?.clone().unalias() {
            Expr::Column(c) => trace_window(&p.input, p.input.schema().index_of_column(&c).ok()?),
            _ => None,
        },
        LogicalPlan::Window(w) => {
            // A column of the window's input is no window function's
            // (`then_some` would compute `idx - n` first and overflow).
            let n = w.input.schema().fields().len();
            idx.checked_sub(n).map(|i| (w, plan, i))
        }
        _ => None,
    }
}

/// How a column of an updating stream changes for one key (Flink's
/// `FlinkRelMdModifiedMonotonicity`, for the cases Weir infers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Monotonicity {
    Constant,
    Increasing,
    Decreasing,
}
