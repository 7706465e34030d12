//! GROUP BY: window aggregates (over a window TVF, attached to another
//! window aggregate, on processing time) and group aggregates.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::LoweredAggregateBuilder;
use weir_engine::plan::{
    AggCall, AggFunc, Exchange, GroupAggregateNode, GroupOutput, NodeId, NodeKind, WindowAggregateNode, WindowKind,
    WindowSpec,
};

use crate::error::{Result, SqlError};
use crate::refusals;

use crate::planner::build::GraphBuilder;
use crate::planner::patterns::time::*;
use crate::planner::patterns::window::*;
use crate::planner::*;

impl GraphBuilder<'_> {
    /// An aggregate call of a logical Aggregate as DataFusion's physical
    /// aggregate (and its FILTER), over the aggregate's input.
    pub(crate) fn lower_aggregate(
        &self,
        e: &Expr,
        input_schema: &DFSchema,
    ) -> Result<datafusion::physical_expr::aggregate::LoweredAggregate> {
        Ok(LoweredAggregateBuilder::new(
            e,
            input_schema,
            input_schema.as_arrow(),
            self.planner.state.execution_props(),
            &PhysicalPlanningContext::default(),
        )
        .build()?)
    }

    /// A GROUP BY: over a window's columns a window aggregate, else a
    /// group aggregate.
    pub(crate) fn aggregate(&mut self, agg: &datafusion::logical_expr::Aggregate) -> Result<NodeId> {
        let input_schema = agg.input.schema();
        let windowed = agg.group_expr.iter().any(|g| match g {
            Expr::Column(c) => input_schema
                .index_of_column(c)
                .ok()
                .is_some_and(|i| trace_marker(&agg.input, i).is_some()),
            _ => false,
        });
        if windowed && self.sessions_of_other_keys(agg) {
            // As Flink: the SESSION TVF on its own, then a GROUP BY over
            // its rows (an updating aggregate).
            return self.group_aggregate(agg);
        }
        if windowed {
            return self.window_aggregate(agg, false);
        }
        if attached_window(agg).is_some() {
            // Over a window aggregate's rows (insert-only, each of one
            // window): the same windows, fired when the watermark passes
            // their end (Flink's window properties from the input).
            return self.window_aggregate(agg, true);
        }
        self.group_aggregate(agg)
    }

    /// Whether `agg` groups a SESSION TVF's rows by other keys than its
    /// `PARTITION BY`: Flink then runs the TVF on its own (sessions per
    /// partition) and aggregates its rows like any table's.
    pub(crate) fn sessions_of_other_keys(&self, agg: &datafusion::logical_expr::Aggregate) -> bool {
        let input_schema = agg.input.schema();
        let mut partition = None;
        let mut keys = vec![];
        for g in &agg.group_expr {
            let call = match g {
                Expr::Column(c) => input_schema
                    .index_of_column(c)
                    .ok()
                    .and_then(|i| trace_marker_call(&agg.input, i)),
                _ => None,
            };
            match call {
                Some((e, _)) => {
                    if let Some(SessionKeys::Partition(p)) = session_keys(&e) {
                        partition = Some(p);
                    }
                }
                None => keys.push(g),
            }
        }
        let Some(partition) = partition else { return false };
        let name = |e: &Expr| match e.clone().unalias() {
            Expr::Column(c) => Some(c.name),
            _ => None,
        };
        let mut partition: Vec<Option<String>> = partition.iter().map(name).collect();
        let mut keys: Vec<Option<String>> = keys.into_iter().map(name).collect();
        partition.sort();
        partition.dedup();
        keys.sort();
        keys.dedup();
        partition != keys || keys.contains(&None)
    }

    pub(crate) fn group_aggregate(&mut self, agg: &datafusion::logical_expr::Aggregate) -> Result<NodeId> {
        let input_schema = agg.input.schema();
        if agg.group_expr.iter().any(|g| matches!(g, Expr::GroupingSet(_))) {
            return Err(refusals::GROUPING_SETS.error());
        }
        let keys = agg
            .group_expr
            .iter()
            .map(|g| self.physical(g, input_schema))
            .collect::<Result<Vec<_>>>()?;
        let physical_input = input_schema.as_arrow();
        let mut calls = vec![];
        for e in &agg.aggr_expr {
            let lowered = self.lower_aggregate(e, input_schema)?;
            let a = lowered.aggregate;
            let name = a.fun().name().to_ascii_lowercase();
            let func = match name.as_str() {
                "count" => AggFunc::Count,
                "sum" => AggFunc::Sum,
                "avg" => AggFunc::Avg,
                "min" => AggFunc::Min,
                "max" => AggFunc::Max,
                "var_pop" => AggFunc::VarPop,
                "var" | "var_samp" => AggFunc::VarSamp,
                "stddev_pop" => AggFunc::StddevPop,
                "stddev" | "stddev_samp" => AggFunc::StddevSamp,
                "first_value" => AggFunc::FirstValue,
                "last_value" => AggFunc::LastValue,
                // LISTAGG is planned as DataFusion's string_agg.
                "string_agg" => AggFunc::ListAgg,
                "array_agg" => AggFunc::ArrayAgg,
                "collect" => AggFunc::Collect,
                other => {
                    return Err(SqlError::unsupported(format!(
                        "aggregate function {} is not supported in a GROUP BY without a window yet \
                         (supported: COUNT, SUM, AVG, MIN, MAX, VAR_POP, VAR_SAMP, STDDEV_POP, STDDEV_SAMP, \
                         each with DISTINCT and FILTER; FIRST_VALUE, LAST_VALUE, LISTAGG, ARRAY_AGG and COLLECT)",
                        other.to_ascii_uppercase()
                    )));
                }
            };
            if func.keeps_a_value() && a.is_distinct() {
                return Err(SqlError::unsupported(format!(
                    "{}(DISTINCT ...) is not supported in a GROUP BY without a window",
                    func.name()
                )));
            }
            if !a.order_bys().is_empty() {
                return Err(SqlError::unsupported(format!(
                    "{}(... ORDER BY ...) is not supported on a stream",
                    func.name()
                )));
            }
            let mut exprs = a.expressions();
            // LISTAGG(x, sep): the separator is a literal.
            let separator = if func == AggFunc::ListAgg && exprs.len() == 2 {
                let sep = exprs.pop().and_then(|e| {
                    e.downcast_ref::<datafusion::physical_expr::expressions::Literal>()
                        .and_then(|l| match l.value() {
                            datafusion::common::ScalarValue::Utf8(Some(t))
                            | datafusion::common::ScalarValue::LargeUtf8(Some(t))
                            | datafusion::common::ScalarValue::Utf8View(Some(t)) => Some(t.clone()),
                            _ => None,
                        })
                });
                match sep {
                    Some(t) => Some(t),
                    None => {
                        return Err(SqlError::unsupported("LISTAGG's separator must be a string literal"));
                    }
                }
            } else {
                None
            };
            if exprs.len() > 1 {
                return Err(SqlError::unsupported(format!(
                    "{} of several arguments is not supported on a stream",
                    func.name()
                )));
            }
            // COUNT(*) is planned as COUNT(1): a constant counts every row.
            let arg = exprs.into_iter().next().filter(|e| {
                !(func == AggFunc::Count
                    && e.downcast_ref::<datafusion::physical_expr::expressions::Literal>()
                        .is_some_and(|l| !l.value().is_null()))
            });
            let input_type = match &arg {
                Some(a) => a.data_type(physical_input)?,
                None => DataType::Null,
            };
            if matches!(func, AggFunc::Sum | AggFunc::Avg)
                && !(input_type.is_integer()
                    || matches!(
                        input_type,
                        DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Decimal128(_, _)
                    ))
            {
                return Err(SqlError::unsupported(format!(
                    "{} of {} is not supported in a GROUP BY without a window",
                    func.name(),
                    crate::types::flink_name(&input_type)
                )));
            }
            if matches!(func, AggFunc::Min | AggFunc::Max) || a.is_distinct() {
                weir_engine::state::codec::RowCodec::new(std::slice::from_ref(&input_type))
                    .map_err(|e| SqlError::unsupported(format!("{}: {e}", func.name())))?;
            }
            calls.push(AggCall {
                func,
                arg,
                distinct: a.is_distinct(),
                filter: lowered.filter,
                input_type,
                output_type: a.field().data_type().clone(),
                separator,
                ignore_nulls: a.ignore_nulls(),
            });
        }
        let input = self.convert(&agg.input)?;
        let ttl = self.hinted_ttl(&agg.input);
        Ok(self.group_node(input, Arc::new(agg.schema.as_arrow().clone()), keys, calls, ttl))
    }

    /// A group aggregate of `input` by `keys`: hash-exchanged by its keys,
    /// or on one subtask without keys.
    pub(crate) fn group_node(
        &mut self,
        input: NodeId,
        schema: SchemaRef,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        aggregates: Vec<AggCall>,
        state_ttl: Option<std::time::Duration>,
    ) -> NodeId {
        let (parallelism, exchange) = if keys.is_empty() {
            (1, Exchange::Global)
        } else {
            (self.config.parallelism, Exchange::Hash(keys.clone()))
        };
        self.add(
            parallelism,
            schema,
            NodeKind::GroupAggregate(GroupAggregateNode {
                keys,
                aggregates,
                state_ttl,
            }),
            Some((input, exchange)),
        )
    }

    /// Whether the window of output column `idx` of `plan` (a window
    /// marker's column) is on a processing-time attribute.
    pub(crate) fn window_on_proctime(&self, plan: &LogicalPlan, idx: usize) -> bool {
        let Some((call, projection)) = trace_marker_call(plan, idx) else {
            return false;
        };
        let Expr::ScalarFunction(f) = call.unalias() else {
            return false;
        };
        match f.args.first() {
            Some(Expr::Column(c)) => projection
                .input
                .schema()
                .index_of_column(c)
                .is_ok_and(|i| is_proctime(&projection.input, i, self.catalog)),
            _ => false,
        }
    }

    /// A window aggregate: over a window TVF's rows, or (`attached`) over
    /// a window aggregate's, each row in the window its bounds name.
    pub(crate) fn window_aggregate(
        &mut self,
        agg: &datafusion::logical_expr::Aggregate,
        attached: bool,
    ) -> Result<NodeId> {
        let input_schema = agg.input.schema();
        let mut group_outputs = vec![];
        let mut keys = vec![];
        let mut spec: Option<WindowSpec> = None;
        let mut time_column = None;
        let mut zoned = false;
        for g in &agg.group_expr {
            let marker = match g {
                Expr::Column(c) => input_schema.index_of_column(c).ok().and_then(|i| {
                    if attached {
                        trace_window_bound(&agg.input, i)
                    } else {
                        trace_marker(&agg.input, i)
                    }
                    .map(|m| (i, m))
                }),
                _ => None,
            };
            match marker {
                Some((i, m)) => {
                    if spec.is_some_and(|s| s != m.spec) {
                        return Err(SqlError::plan("GROUP BY mixes columns of two different windows"));
                    }
                    spec = Some(m.spec);
                    zoned |= m.zoned;
                    // The time a row's window is found from: a TVF row's
                    // window_start column (the marker), an attached row's
                    // window_end.
                    let time_part = if attached {
                        GroupOutput::WindowEnd
                    } else {
                        GroupOutput::WindowStart
                    };
                    if m.part == time_part {
                        time_column = Some(i);
                    }
                    group_outputs.push(m.part);
                }
                None => {
                    group_outputs.push(GroupOutput::Key(keys.len()));
                    keys.push(self.physical(g, input_schema)?);
                }
            }
        }
        let Some(spec) = spec else {
            return Err(SqlError::unsupported(
                "a window aggregation must GROUP BY both window_start and window_end",
            ));
        };
        if !group_outputs.contains(&GroupOutput::WindowEnd) {
            return Err(SqlError::plan(
                "a window aggregation must GROUP BY both window_start and window_end",
            ));
        }
        let time_column = time_column
            .ok_or_else(|| SqlError::plan("a window aggregation must GROUP BY both window_start and window_end"))?;
        let proctime = !attached && self.window_on_proctime(&agg.input, time_column);
        let zone = if zoned {
            self.config.local_time_zone.clone()
        } else {
            None
        };
        if proctime && spec.kind == WindowKind::Session {
            return Err(refusals::PROCTIME_SESSION.error());
        }
        let mut aggregates = vec![];
        for e in &agg.aggr_expr {
            let lowered = self.lower_aggregate(e, input_schema)?;
            if lowered.filter.is_some() {
                return Err(refusals::WINDOW_AGGREGATE_FILTER.error());
            }
            aggregates.push(lowered.aggregate);
        }
        let was = std::mem::replace(&mut self.under_window_aggregate, true);
        let input = self.convert(&agg.input);
        self.under_window_aggregate = was;
        let input = input?;
        self.require_insert_only(input, "WindowAggregate")?;
        let (parallelism, exchange) = if keys.is_empty() {
            (1, Exchange::Global)
        } else {
            (self.config.parallelism, Exchange::Hash(keys.clone()))
        };
        Ok(self.add(
            parallelism,
            Arc::new(agg.schema.as_arrow().clone()),
            NodeKind::WindowAggregate(WindowAggregateNode {
                window: spec,
                time_column,
                proctime,
                attached,
                keys,
                group_outputs,
                aggregates,
                zone,
            }),
            Some((input, exchange)),
        ))
    }
}
