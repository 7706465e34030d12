//! OVER aggregates on event time.

use std::sync::Arc;

use datafusion::logical_expr::{Expr, LogicalPlan};
use weir_engine::plan::{Exchange, LagCall, NodeId, NodeKind, OverAggregateNode, OverFrame, OverOutput};

use crate::error::{Result, SqlError};
use crate::refusals;

use crate::planner::build::GraphBuilder;
use crate::planner::patterns::time::*;

impl GraphBuilder<'_> {
    /// Aggregates OVER a frame ordered by the event time (Flink's
    /// over aggregate): every row with its aggregates, emitted when the
    /// watermark passes it.
    pub(crate) fn over_aggregate(&mut self, w: &datafusion::logical_expr::Window) -> Result<NodeId> {
        use datafusion::logical_expr::{WindowFrame, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition};
        let ws = w.input.schema();
        let mut aggregates = vec![];
        let (mut lags, mut outputs) = (vec![], vec![]);
        let mut params: Option<&datafusion::logical_expr::expr::WindowFunctionParams> = None;
        let mut frame_of_all: Option<WindowFrame> = None;
        // Two different OVER windows in one SELECT plan as two stacked
        // window nodes.
        if matches!(w.input.as_ref(), LogicalPlan::Window(_)) {
            return Err(SqlError::unsupported(
                "Over Agg: Unsupported use of OVER windows. All aggregates must be computed on the same window.",
            ));
        }
        for e in &w.window_expr {
            let Some(wf) = crate::planner::patterns::top_n::window_function(e) else {
                return Err(SqlError::internal("an OVER window without its function"));
            };
            // Flink 2.3 runs RANK, DENSE_RANK and ROW_NUMBER in an OVER
            // aggregate ordered by the event time as counts: RANK and
            // DENSE_RANK both count the rows up to and including the
            // current time (rows of one time share it: 2, 2, 3), ROW_NUMBER
            // counts rows in arrival order. Each takes no frame.
            // The frame as it matters here: an unbounded start is one
            // whatever its type (the default frame's is the ORDER BY's).
            let shape = |f: &WindowFrame| {
                let start = match &f.start_bound {
                    WindowFrameBound::Preceding(v) if v.is_null() => None,
                    other => Some(other.clone()),
                };
                (f.units, start, f.end_bound.clone())
            };
            let default_frame = WindowFrame::new_bounds(
                WindowFrameUnits::Range,
                WindowFrameBound::Preceding(datafusion::common::ScalarValue::Null),
                WindowFrameBound::CurrentRow,
            );
            let (udaf, frame) = match &wf.fun {
                WindowFunctionDefinition::AggregateUDF(f) => (Some(f.clone()), wf.params.window_frame.clone()),
                WindowFunctionDefinition::WindowUDF(f) => {
                    let name = f.name().to_ascii_uppercase();
                    match name.as_str() {
                        "LAG" => (None, wf.params.window_frame.clone()),
                        "LEAD" => return Err(SqlError::unsupported("LEAD Function is not supported in stream mode.")),
                        "RANK" | "DENSE_RANK" | "ROW_NUMBER" => {
                            if shape(&wf.params.window_frame) != shape(&default_frame) {
                                return Err(SqlError::plan(
                                    "ROW/RANGE not allowed with RANK, DENSE_RANK or ROW_NUMBER functions",
                                ));
                            }
                            let frame = if name == "ROW_NUMBER" {
                                WindowFrame::new_bounds(
                                    WindowFrameUnits::Rows,
                                    WindowFrameBound::Preceding(datafusion::common::ScalarValue::UInt64(None)),
                                    WindowFrameBound::CurrentRow,
                                )
                            } else {
                                default_frame
                            };
                            (Some(datafusion::functions_aggregate::count::count_udaf()), frame)
                        }
                        _ => {
                            return Err(SqlError::unsupported(format!(
                                "{name} Function is not supported in stream mode."
                            )));
                        }
                    }
                }
            };
            let args = if matches!(wf.fun, WindowFunctionDefinition::WindowUDF(_)) && udaf.is_some() {
                vec![datafusion::logical_expr::lit(1i64)]
            } else {
                wf.params.args.clone()
            };
            if let Some(f) = &frame_of_all
                && shape(f) != shape(&frame)
            {
                return Err(SqlError::unsupported(
                    "Over Agg: Unsupported use of OVER windows. All aggregates must be computed on the same window.",
                ));
            }
            frame_of_all = Some(frame);
            if let Some(p) = params
                && (p.partition_by != wf.params.partition_by || p.order_by != wf.params.order_by)
            {
                return Err(SqlError::unsupported(
                    "Over Agg: Unsupported use of OVER windows. All aggregates must be computed on the same window.",
                ));
            }
            params = Some(&wf.params);
            if wf.params.filter.is_some() {
                return Err(refusals::OVER_FILTER.error());
            }
            let Some(udaf) = udaf else {
                // LAG(arg [, offset [, default]]): constants after the value.
                let args = &wf.params.args;
                let arg = args
                    .first()
                    .ok_or_else(|| SqlError::plan("LAG needs the value it reads"))?;
                let literal = |e: &Expr| match e.clone().unalias() {
                    Expr::Literal(v, _) => Some(v),
                    Expr::Cast(c) => match *c.expr {
                        Expr::Literal(v, _) => v.cast_to(c.field.data_type()).ok(),
                        _ => None,
                    },
                    _ => None,
                };
                let offset = match args.get(1) {
                    None => 1,
                    Some(e) => literal(e)
                        .and_then(|v| v.to_string().parse::<usize>().ok())
                        .ok_or_else(|| {
                            SqlError::plan(format!("LAG's offset must be a non-negative constant, found {e}"))
                        })?,
                };
                let ty = datafusion::logical_expr::ExprSchemable::get_type(arg, ws)?;
                let default = match args.get(2) {
                    None => datafusion::common::ScalarValue::try_from(&ty)?,
                    Some(e) => literal(e).and_then(|v| v.cast_to(&ty).ok()).ok_or_else(|| {
                        SqlError::plan(format!(
                            "LAG's default must be a constant of the value's type, found {e}"
                        ))
                    })?,
                };
                outputs.push(OverOutput::Lag(lags.len()));
                lags.push(LagCall {
                    arg: self.physical(arg, ws)?,
                    offset,
                    default,
                });
                continue;
            };
            let agg = Expr::AggregateFunction(datafusion::logical_expr::expr::AggregateFunction::new_udf(
                udaf,
                args,
                wf.params.distinct,
                None,
                vec![],
                None,
            ));
            outputs.push(OverOutput::Aggregate(aggregates.len()));
            aggregates.push(self.lower_aggregate(&agg, ws)?.aggregate);
        }
        let p = params.ok_or_else(|| SqlError::internal("an OVER window without functions"))?;
        let frame = frame_of_all.ok_or_else(|| SqlError::internal("an OVER window without functions"))?;
        let time_column = match p.order_by.as_slice() {
            [s] => match &s.expr {
                Expr::Column(c) => {
                    let i = ws.index_of_column(c)?;
                    if is_proctime(&w.input, i, self.catalog) {
                        return Err(refusals::PROCTIME_OVER.error());
                    }
                    if !is_rowtime(&w.input, i, self.catalog) {
                        return Err(SqlError::plan(
                            "OVER windows' ordering in stream mode must be defined on a time attribute.",
                        ));
                    }
                    if !s.asc {
                        return Err(SqlError::plan(
                            "OVER windows' ordering in stream mode must be ascending on the time attribute.",
                        ));
                    }
                    i
                }
                _ => {
                    return Err(SqlError::plan(
                        "OVER windows' ordering in stream mode must be defined on a time attribute.",
                    ));
                }
            },
            [] => {
                return Err(SqlError::plan(
                    "OVER windows on a stream need ORDER BY the time attribute.",
                ));
            }
            _ => {
                return Err(SqlError::plan(
                    "The window can only be ordered by a single time column.",
                ));
            }
        };
        if !matches!(frame.end_bound, WindowFrameBound::CurrentRow) {
            return Err(refusals::OVER_FOLLOWING.error());
        }
        let frame = match (&frame.units, &frame.start_bound) {
            (WindowFrameUnits::Rows, WindowFrameBound::CurrentRow) => OverFrame::Rows(Some(0)),
            (WindowFrameUnits::Range, WindowFrameBound::CurrentRow) => OverFrame::Range(Some(0)),
            (WindowFrameUnits::Rows, WindowFrameBound::Preceding(v)) if v.is_null() => OverFrame::Rows(None),
            (WindowFrameUnits::Range, WindowFrameBound::Preceding(v)) if v.is_null() => OverFrame::Range(None),
            (WindowFrameUnits::Rows, WindowFrameBound::Preceding(v)) => {
                let n = match v {
                    datafusion::common::ScalarValue::UInt64(Some(n)) => *n,
                    other => other
                        .to_string()
                        .parse::<u64>()
                        .map_err(|_| SqlError::plan(format!("ROWS {other} PRECEDING needs a row count")))?,
                };
                OverFrame::Rows(Some(n))
            }
            (WindowFrameUnits::Range, WindowFrameBound::Preceding(v)) => {
                use datafusion::common::ScalarValue as S;
                let ms = match v {
                    S::IntervalDayTime(Some(d)) => i64::from(d.days) * 86_400_000 + i64::from(d.milliseconds),
                    S::IntervalMonthDayNano(Some(i)) if i.months == 0 => {
                        i64::from(i.days) * 86_400_000 + i.nanoseconds / 1_000_000
                    }
                    other => {
                        return Err(SqlError::plan(format!(
                            "RANGE {other} PRECEDING: a RANGE frame over the time attribute needs a day-time \
                             INTERVAL (e.g. INTERVAL '1' HOUR)"
                        )));
                    }
                };
                if ms < 0 {
                    return Err(SqlError::plan("a RANGE frame's INTERVAL must not be negative"));
                }
                OverFrame::Range(Some(ms))
            }
            _ => {
                return Err(SqlError::unsupported(
                    "OVER windows on a stream support ROWS and RANGE frames ending at CURRENT ROW",
                ));
            }
        };
        let partition = p
            .partition_by
            .iter()
            .map(|e| self.physical(e, ws))
            .collect::<Result<Vec<_>>>()?;
        let input = self.convert(&w.input)?;
        self.require_insert_only(input, "OverAggregate")?;
        let (parallelism, exchange) = if partition.is_empty() {
            (1, Exchange::Global)
        } else {
            (self.config.parallelism, Exchange::Hash(partition.clone()))
        };
        Ok(self.add(
            parallelism,
            Arc::new(w.schema.as_arrow().clone()),
            NodeKind::OverAggregate(OverAggregateNode {
                partition,
                time_column,
                frame,
                aggregates,
                lags,
                outputs,
            }),
            Some((input, exchange)),
        ))
    }
}
