//! Window markers in a logical plan: which column is which window's bound,
//! through projections and aliases, and the windows of joins and of
//! aggregates over window aggregates.

use datafusion::common::tree_node::TreeNode;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, LogicalPlan};
use weir_engine::plan::{GroupOutput, WindowKind, WindowSpec};

use crate::udf::{WINDOW_FN, WindowMarker};

/// A window marker call found by tracing a column down the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marker {
    pub(crate) spec: WindowSpec,
    pub(crate) part: GroupOutput,
    /// On a TIMESTAMP_LTZ's wall clock in a session zone
    /// (`WindowMarker::zoned`).
    pub(crate) zoned: bool,
}

pub(crate) fn marker_of(expr: &Expr) -> Option<Marker> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = expr.clone().unalias() else {
        return None;
    };
    if func.name() != WINDOW_FN || args.len() < 6 {
        return None;
    }
    let lit_i = |e: &Expr| match e {
        Expr::Literal(datafusion::common::ScalarValue::Int64(Some(v)), _) => Some(*v),
        _ => None,
    };
    let lit_s = |e: &Expr| match e {
        Expr::Literal(datafusion::common::ScalarValue::Utf8(Some(v)), _) => Some(v.clone()),
        _ => None,
    };
    let kind = match lit_s(&args[1])?.as_str() {
        "TUMBLE" => WindowKind::Tumble,
        "HOP" => WindowKind::Hop,
        "SESSION" => WindowKind::Session,
        _ => WindowKind::Cumulate,
    };
    let part = match lit_s(&args[5])?.as_str() {
        "start" => GroupOutput::WindowStart,
        "end" => GroupOutput::WindowEnd,
        _ => GroupOutput::WindowTime,
    };
    Some(Marker {
        spec: WindowSpec {
            kind,
            size: lit_i(&args[2])?,
            slide: lit_i(&args[3])?,
            offset: lit_i(&args[4])?,
        },
        part,
        zoned: WindowMarker::zone_of(&func).is_some(),
    })
}

/// Follows output column `idx` of `plan` down to a window marker.
pub(crate) fn trace_marker(plan: &LogicalPlan, idx: usize) -> Option<Marker> {
    trace_marker_call(plan, idx).and_then(|(e, _)| marker_of(&e))
}

/// The window marker call output column `idx` of `plan` is, with the
/// projection that makes it.
pub(crate) fn trace_marker_call(
    plan: &LogicalPlan,
    idx: usize,
) -> Option<(Expr, &datafusion::logical_expr::Projection)> {
    match plan {
        LogicalPlan::Projection(p) => {
            let e = p.expr.get(idx)?;
            if marker_of(e).is_some() {
                return Some((e.clone().unalias(), p));
            }
            match e.clone().unalias() {
                Expr::Column(c) => trace_marker_call(&p.input, p.input.schema().index_of_column(&c).ok()?),
                _ => None,
            }
        }
        LogicalPlan::Filter(f) => trace_marker_call(&f.input, idx),
        LogicalPlan::SubqueryAlias(a) => trace_marker_call(&a.input, idx),
        _ => None,
    }
}

/// Whose sessions a SESSION marker's windows are.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SessionKeys {
    /// The legacy `GROUP BY k, SESSION(ts, gap)`: each group key's.
    GroupKeys,
    /// The TVF's `PARTITION BY` columns (none: one sequence of sessions).
    Partition(Vec<Expr>),
}

pub(crate) fn session_keys(marker: &Expr) -> Option<SessionKeys> {
    let Expr::ScalarFunction(ScalarFunction { args, .. }) = marker else {
        return None;
    };
    match args.get(6)? {
        Expr::Literal(datafusion::common::ScalarValue::Utf8(Some(v)), _) if v == "keys" => Some(SessionKeys::GroupKeys),
        _ => Some(SessionKeys::Partition(args[7..].to_vec())),
    }
}

pub(crate) fn contains_session_marker(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|x| {
        if marker_of(x).is_some_and(|m| m.spec.kind == WindowKind::Session) {
            found = true;
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

/// Which window bound output column `idx` of `plan` is: a window TVF's
/// `window_start` / `window_end`, passed through projections, filters and
/// a window aggregate's GROUP BY.
pub(crate) fn trace_window_bound(plan: &LogicalPlan, idx: usize) -> Option<Marker> {
    match plan {
        LogicalPlan::Aggregate(a) => {
            let e = a.group_expr.get(idx)?;
            if let Some(m) = marker_of(e) {
                return Some(m);
            }
            match e.clone().unalias() {
                Expr::Column(c) => trace_window_bound(&a.input, a.input.schema().index_of_column(&c).ok()?),
                _ => None,
            }
        }
        LogicalPlan::Projection(p) => match p.expr.get(idx).map(|e| e.clone().unalias()) {
            Some(Expr::Column(c)) if marker_of(&p.expr[idx]).is_none() => {
                trace_window_bound(&p.input, p.input.schema().index_of_column(&c).ok()?)
            }
            _ => trace_marker(plan, idx),
        },
        LogicalPlan::Filter(f) => trace_window_bound(&f.input, idx),
        LogicalPlan::SubqueryAlias(a) => trace_window_bound(&a.input, idx),
        _ => None,
    }
}

/// Whether `agg` groups by both bounds of a window aggregate below it (not
/// of a window TVF straight under it): Flink's window aggregate over
/// another's windows (Nexmark q5's `MAX` per window). The windows' spec.
pub(crate) fn attached_window(agg: &datafusion::logical_expr::Aggregate) -> Option<WindowSpec> {
    let schema = agg.input.schema();
    let mut spec = None;
    let (mut start, mut end) = (false, false);
    for g in &agg.group_expr {
        let Expr::Column(c) = g else { continue };
        let Some(m) = schema
            .index_of_column(c)
            .ok()
            .and_then(|i| trace_window_bound(&agg.input, i))
        else {
            continue;
        };
        if spec.is_some_and(|s| s != m.spec) {
            return None;
        }
        spec = Some(m.spec);
        start |= m.part == GroupOutput::WindowStart;
        end |= m.part == GroupOutput::WindowEnd;
    }
    spec.filter(|s| start && end && s.kind != WindowKind::Session)
}

/// A window join's `window_end` columns (left, right): the join's
/// equalities hold `L.window_start = R.window_start` and `L.window_end =
/// R.window_end` of windows on both sides (window TVFs or window
/// aggregates).
pub(crate) fn window_join_ends(join: &datafusion::logical_expr::Join) -> Option<[usize; 2]> {
    let (mut start, mut end) = (false, None);
    for (l, r) in &join.on {
        let (Expr::Column(lc), Expr::Column(rc)) = (l, r) else {
            continue;
        };
        let (Ok(li), Ok(ri)) = (
            join.left.schema().index_of_column(lc),
            join.right.schema().index_of_column(rc),
        ) else {
            continue;
        };
        match (
            trace_window_bound(&join.left, li).map(|m| m.part),
            trace_window_bound(&join.right, ri).map(|m| m.part),
        ) {
            (Some(GroupOutput::WindowStart), Some(GroupOutput::WindowStart)) => start = true,
            (Some(GroupOutput::WindowEnd), Some(GroupOutput::WindowEnd)) => end = Some([li, ri]),
            _ => {}
        }
    }
    end.filter(|_| start)
}

pub(crate) fn contains_multi_window_marker(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|x| {
        if let Some(m) = marker_of(x)
            && m.spec.kind != WindowKind::Tumble
        {
            found = true;
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}
