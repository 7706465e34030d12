//! Time attributes: whether a column of a logical plan is a rowtime or a
//! processing-time attribute, traced to its source's WATERMARK or
//! PROCTIME() (through the joins that keep them); and the joins' time
//! patterns: a temporal join's marker conjunct, an interval join's bounds
//! between the sides' time columns (which are time attributes).

use datafusion::logical_expr::{Expr, LogicalPlan};
use weir_catalog::Catalog;

/// Whether output column `idx` of `plan` is a table's event-time column
/// (its WATERMARK column), passed through unchanged.
pub(crate) fn is_rowtime(plan: &LogicalPlan, idx: usize, catalog: &Catalog) -> bool {
    is_time_attribute(
        plan,
        idx,
        &|table, column| {
            catalog
                .table(table)
                .and_then(|t| t.watermark.as_ref())
                .is_some_and(|w| w.column == column)
        },
        // An event-time interval join keeps both sides' event-time
        // columns (Flink).
        &|j| interval_bounds(j, catalog).is_some_and(|(b, _)| !b.proctime),
        &|_| false,
    )
}

/// Whether output column `idx` of `plan` is a processing-time attribute:
/// a table's `PROCTIME()` computed column, passed through unchanged.
pub(crate) fn is_proctime(plan: &LogicalPlan, idx: usize, catalog: &Catalog) -> bool {
    is_time_attribute(
        plan,
        idx,
        &|table, column| {
            catalog.table(table).and_then(|t| t.column(column)).is_some_and(|c| {
                c.computed
                    .as_deref()
                    .is_some_and(crate::functions::overrides::is_proctime_call)
            })
        },
        &|_| false,
        // `SELECT *, PROCTIME() AS pt FROM t` declares one too (Nexmark q12).
        &|e| matches!(e, Expr::ScalarFunction(f) if f.name() == "proctime"),
    )
}

/// Whether output column `idx` of `plan` is a table's column for which
/// `attribute(table, column)` holds, passed through aliases, filters,
/// projections and the joins `through_join` keeps it through (a side of
/// the join that is never padded with NULLs) unchanged (any other
/// expression makes it a plain value, as in Flink).
pub(crate) fn is_time_attribute(
    plan: &LogicalPlan,
    idx: usize,
    attribute: &dyn Fn(&str, &str) -> bool,
    through_join: &dyn Fn(&datafusion::logical_expr::Join) -> bool,
    declared: &dyn Fn(&Expr) -> bool,
) -> bool {
    let recurse = |p: &LogicalPlan, i| is_time_attribute(p, i, attribute, through_join, declared);
    match plan {
        LogicalPlan::SubqueryAlias(a) => recurse(&a.input, idx),
        LogicalPlan::Filter(f) => recurse(&f.input, idx),
        LogicalPlan::Projection(p) => match p.expr.get(idx).map(|e| e.clone().unalias()) {
            Some(Expr::Column(c)) => p.input.schema().index_of_column(&c).is_ok_and(|i| recurse(&p.input, i)),
            Some(e) => declared(&e),
            None => false,
        },
        // A temporal join keeps its left side's time attributes (Flink);
        // the versioned side's time is a plain value after it.
        LogicalPlan::Join(j) if temporal_of(j).is_some() => {
            idx < j.left.schema().fields().len() && recurse(&j.left, idx)
        }
        LogicalPlan::Join(j) if through_join(j) => {
            use datafusion::logical_expr::JoinType as J;
            let left_len = j.left.schema().fields().len();
            match (j.join_type, idx < left_len) {
                (J::Inner | J::Left, true) => recurse(&j.left, idx),
                (J::Inner | J::Right, false) => recurse(&j.right, idx - left_len),
                _ => false,
            }
        }
        LogicalPlan::TableScan(scan) => attribute(scan.table_name.table(), scan.projected_schema.field(idx).name()),
        _ => false,
    }
}

/// A temporal join's mark in `join`'s condition (see the rewrite): its
/// arguments (left time, right version time, right primary key...) and
/// the rest of the condition.
pub(crate) fn temporal_of(join: &datafusion::logical_expr::Join) -> Option<(Vec<Expr>, Option<Expr>)> {
    let filter = join.filter.as_ref()?;
    let mut marker = None;
    let mut rest = vec![];
    for c in datafusion::logical_expr::utils::split_conjunction_owned(filter.clone()) {
        match c {
            Expr::ScalarFunction(f) if f.name() == crate::udf::TEMPORAL_JOIN_FN => marker = Some(f.args),
            other => rest.push(other),
        }
    }
    Some((marker?, datafusion::logical_expr::utils::conjunction(rest)))
}

/// Flink's interval join condition: bounds between the two sides'
/// event-time columns in a join's ON (`l.ts BETWEEN r.ts - INTERVAL '1'
/// MINUTE AND r.ts`, or comparisons `<`, `<=`, `>`, `>=` with an interval
/// added or subtracted), a lower and an upper one. Returns them with the
/// rest of the condition. A strict comparison moves its bound by 1 ms.
pub(crate) fn interval_bounds(
    join: &datafusion::logical_expr::Join,
    catalog: &Catalog,
) -> Option<(weir_engine::plan::IntervalBounds, Option<Expr>)> {
    use datafusion::logical_expr::{Between, BinaryExpr, Operator};
    let filter = join.filter.as_ref()?;
    let mut conjuncts = vec![];
    for c in datafusion::logical_expr::utils::split_conjunction_owned(filter.clone()) {
        match c {
            Expr::Between(Between {
                expr,
                negated: false,
                low,
                high,
            }) => {
                conjuncts.push(Expr::BinaryExpr(BinaryExpr::new(expr.clone(), Operator::GtEq, low)));
                conjuncts.push(Expr::BinaryExpr(BinaryExpr::new(expr, Operator::LtEq, high)));
            }
            other => conjuncts.push(other),
        }
    }
    // `column ± interval` of one side's time attribute: (side, column,
    // offset in ms, on processing time).
    let term = |e: &Expr| -> Option<(usize, usize, i64, bool)> {
        let (col, offset) = match e {
            Expr::Column(c) => (c, 0),
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let Expr::Column(c) = left.as_ref() else { return None };
                let Expr::Literal(v, _) = right.as_ref() else {
                    return None;
                };
                let ms = interval_ms(v)?;
                match op {
                    Operator::Plus => (c, ms),
                    Operator::Minus => (c, ms.checked_neg()?),
                    _ => return None,
                }
            }
            _ => return None,
        };
        for (side, input) in [&join.left, &join.right].into_iter().enumerate() {
            if let Ok(i) = input.schema().index_of_column(col) {
                if is_rowtime(input, i, catalog) {
                    return Some((side, i, offset, false));
                }
                return is_proctime(input, i, catalog).then_some((side, i, offset, true));
            }
        }
        None
    };
    let (mut lower, mut upper): (Option<i64>, Option<i64>) = (None, None);
    let (mut times, mut rest) = (None, vec![]);
    for c in conjuncts {
        let bound = match &c {
            Expr::BinaryExpr(BinaryExpr { left, op, right })
                if matches!(op, Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq) =>
            {
                match (term(left), term(right)) {
                    // Both sides' rowtimes, or both sides' proctimes.
                    (Some(a), Some(b)) if a.0 != b.0 && a.3 == b.3 => {
                        // As `left.ts OP right.ts + d`.
                        let (l, r, op) = if a.0 == 0 { (a, b, *op) } else { (b, a, op.swap()?) };
                        Some(((l.1, r.1, l.3), op, r.2.checked_sub(l.2)?))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let Some((cols, op, d)) = bound else {
            rest.push(c);
            continue;
        };
        if times.is_some_and(|t| t != cols) {
            // Bounds on other time columns: part of the condition.
            rest.push(c);
            continue;
        }
        times = Some(cols);
        match op {
            Operator::GtEq => lower = Some(lower.map_or(d, |x| x.max(d))),
            Operator::Gt => lower = Some(lower.map_or(d + 1, |x| x.max(d + 1))),
            Operator::LtEq => upper = Some(upper.map_or(d, |x| x.min(d))),
            _ => upper = Some(upper.map_or(d - 1, |x| x.min(d - 1))),
        }
    }
    let ((left_time, right_time, proctime), lower, upper) = (times?, lower?, upper?);
    let bounds = weir_engine::plan::IntervalBounds {
        left_time,
        right_time,
        lower,
        upper,
        proctime,
    };
    Some((bounds, datafusion::logical_expr::utils::conjunction(rest)))
}

/// An interval literal's length in ms (`None` for months and years, whose
/// length varies).
pub(crate) fn interval_ms(v: &datafusion::common::ScalarValue) -> Option<i64> {
    use datafusion::common::ScalarValue as S;
    match v {
        S::IntervalDayTime(Some(d)) => Some(i64::from(d.days) * 86_400_000 + i64::from(d.milliseconds)),
        S::IntervalMonthDayNano(Some(m)) if m.months == 0 => {
            Some(i64::from(m.days) * 86_400_000 + m.nanoseconds.div_euclid(1_000_000))
        }
        _ => None,
    }
}
