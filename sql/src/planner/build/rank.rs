//! Top-N, deduplication and window Top-N; ORDER BY on a stream.

use std::sync::Arc;

use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_expr::expressions::Column;
use weir_engine::plan::{
    ChangelogMode, Exchange, GroupOutput, NodeId, NodeKind, RankNode, RankStrategy, SortKey, TemporalSortNode,
};

use crate::error::{Result, SqlError};
use crate::refusals;

use crate::planner::build::GraphBuilder;
use crate::planner::patterns::time::*;
use crate::planner::patterns::top_n::*;
use crate::planner::patterns::window::*;

impl GraphBuilder<'_> {
    /// Top-N / deduplication: `ROW_NUMBER() OVER (PARTITION BY p ORDER BY
    /// o) AS rn` below a filter `rn <= N` (or `< N`, `= 1`). The window
    /// becomes a rank node; what lies between it and the filter is
    /// converted over it; the filter's other conjuncts stay a filter.
    pub(crate) fn top_n(&mut self, f: &datafusion::logical_expr::Filter) -> Result<NodeId> {
        let top = top_n_of(f).ok_or_else(|| SqlError::plan("not a Top-N"))?;
        let with_rank = self.rank_used.take().unwrap_or(true);
        let w = top.window;
        let Some(wf) = window_function(&w.window_expr[top.index]) else {
            return Err(SqlError::internal("a Top-N without its window function"));
        };
        let name = wf.fun.name().to_ascii_lowercase();
        if name != "row_number" {
            return Err(SqlError::unsupported(format!(
                "{}() on streaming table is not supported currently",
                name.to_ascii_uppercase()
            )));
        }
        if w.window_expr.len() != 1 {
            return Err(SqlError::unsupported(
                "a Top-N query has one ROW_NUMBER() and no other OVER function",
            ));
        }
        let limit = top.limit?;
        let ws = w.input.schema();
        let partition = wf
            .params
            .partition_by
            .iter()
            .map(|e| self.physical(e, ws))
            .collect::<Result<Vec<_>>>()?;
        let order = wf
            .params
            .order_by
            .iter()
            .map(|s| {
                Ok(SortKey {
                    expr: self.physical(&s.expr, ws)?,
                    asc: s.asc,
                    nulls_first: s.nulls_first,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if order.is_empty() {
            return Err(SqlError::unsupported("a Top-N needs an ORDER BY in its OVER clause"));
        }
        let input = self.convert(&w.input)?;
        let insert_only = self.nodes[input].changelog.is_insert_only();
        // Flink's deduplication: `= 1` on one event-time column, the rank
        // not shown.
        let rowtime_order = matches!(wf.params.order_by.as_slice(), [s] if matches!(&s.expr, Expr::Column(c)
            if ws.index_of_column(c).is_ok_and(|i| is_rowtime(&w.input, i, self.catalog))));
        let proctime_order = matches!(wf.params.order_by.as_slice(), [s] if matches!(&s.expr, Expr::Column(c)
            if ws.index_of_column(c).is_ok_and(|i| is_proctime(&w.input, i, self.catalog))));
        let strategy = if limit == 1 && !with_rank && rowtime_order && insert_only {
            if wf.params.order_by[0].asc {
                RankStrategy::KeepFirstRowtime
            } else {
                RankStrategy::KeepLastRowtime
            }
        } else if limit == 1 && !with_rank && proctime_order && insert_only {
            if wf.params.order_by[0].asc {
                RankStrategy::KeepFirstProctime
            } else {
                RankStrategy::KeepLastProctime
            }
        } else {
            RankStrategy::TopN
        };
        // Window Top-N / deduplication: the partition holds a window's
        // bounds, over insert-only input (Flink's WindowRank).
        let bound = |part: GroupOutput| {
            wf.params.partition_by.iter().find_map(|e| match e {
                Expr::Column(c) => ws
                    .index_of_column(c)
                    .ok()
                    .filter(|i| trace_window_bound(&w.input, *i).map(|m| m.part) == Some(part)),
                _ => None,
            })
        };
        let zone = bound(GroupOutput::WindowEnd)
            .filter(|end| trace_window_bound(&w.input, *end).is_some_and(|m| m.zoned))
            .and_then(|_| self.config.local_time_zone.clone());
        if let Some(end) = bound(GroupOutput::WindowEnd)
            && self.window_on_proctime(&w.input, end)
        {
            return Err(refusals::PROCTIME_WINDOW_TOP_N.error());
        }
        let strategy = match (bound(GroupOutput::WindowStart), bound(GroupOutput::WindowEnd)) {
            (Some(_), Some(end)) if insert_only => RankStrategy::Window {
                end,
                later_ties_first: limit == 1 && !with_rank && rowtime_order && !wf.params.order_by[0].asc,
            },
            _ => strategy,
        };
        let (parallelism, exchange) = if partition.is_empty() {
            (1, Exchange::Global)
        } else {
            (self.config.parallelism, Exchange::Hash(partition.clone()))
        };
        let partition_cols: Option<Vec<usize>> = partition
            .iter()
            .map(|e| e.downcast_ref::<Column>().map(|c| c.index()))
            .collect();
        let rank_index = ws.fields().len();
        // Flink's UpdateFast: an upsert-keyed input (key ⊇ partition key)
        // whose sort fields only move a row up.
        let update_key = match (&self.nodes[input].changelog.upsert_key, &partition_cols) {
            (Some(uk), Some(pc))
                if strategy == RankStrategy::TopN && !insert_only && pc.iter().all(|c| uk.contains(c)) =>
            {
                let moves_up = order.iter().all(|k| {
                    k.expr
                        .downcast_ref::<Column>()
                        .is_some_and(|c| match self.monotonicity(input, c.index()) {
                            Some(Monotonicity::Constant) => true,
                            Some(Monotonicity::Increasing) => !k.asc,
                            Some(Monotonicity::Decreasing) => k.asc,
                            None => false,
                        })
                });
                moves_up.then(|| uk.clone())
            }
            _ => None,
        };
        let node = RankNode {
            strategy,
            zone: zone.filter(|_| matches!(strategy, RankStrategy::Window { .. })),
            partition,
            order,
            limit,
            with_rank,
            update_key,
        };
        let id = self.add(
            parallelism,
            Arc::new(w.schema.as_arrow().clone()),
            NodeKind::Rank(node),
            Some((input, exchange)),
        );
        self.nodes[id].changelog = match strategy {
            RankStrategy::KeepLastRowtime | RankStrategy::KeepLastProctime => ChangelogMode {
                updates: true,
                deletes: false,
                upsert_key: partition_cols,
                no_update_before: false,
            },
            // Emitted once per key, when the watermark passes its row;
            // a window's rows once, when the watermark passes its end.
            RankStrategy::KeepFirstRowtime | RankStrategy::KeepFirstProctime | RankStrategy::Window { .. } => {
                ChangelogMode::insert_only()
            }
            RankStrategy::TopN => ChangelogMode {
                updates: with_rank || !insert_only,
                deletes: !with_rank || !insert_only,
                upsert_key: if with_rank {
                    partition_cols.map(|mut c| {
                        c.push(rank_index);
                        c
                    })
                } else {
                    None
                },
                no_update_before: false,
            },
        };
        // The plan between the filter and the window, over the rank node.
        let window_plan: *const LogicalPlan = top.window_plan;
        let was = self.replaced.replace((window_plan, id));
        let above = self.convert(&f.input);
        self.replaced = was;
        let above = above?;
        if top.rest.is_empty() {
            return Ok(above);
        }
        let rest = datafusion::logical_expr::utils::conjunction(top.rest.iter().map(|e| (*e).clone()))
            .ok_or_else(|| SqlError::plan("empty filter"))?;
        let pred = self.physical(&rest, f.input.schema())?;
        Ok(self.calc(above, Arc::new(f.input.schema().as_arrow().clone()), Some(pred), None))
    }

    /// `ORDER BY` on a stream: by the rowtime ascending first (Flink's
    /// TemporalSort, emitted as the watermark passes), or with a `LIMIT`
    /// (Flink's SortLimit: a Top-N over the whole stream, updating).
    pub(crate) fn sort(&mut self, sort: &datafusion::logical_expr::Sort) -> Result<NodeId> {
        let schema = sort.input.schema();
        let keys = sort
            .expr
            .iter()
            .map(|s| {
                Ok(SortKey {
                    expr: self.physical(&s.expr, schema)?,
                    asc: s.asc,
                    nulls_first: s.nulls_first,
                })
            })
            .collect::<Result<Vec<SortKey>>>()?;
        if let Some(fetch) = sort.fetch {
            let input = self.convert(&sort.input)?;
            let node = RankNode {
                strategy: RankStrategy::TopN,
                zone: None,
                partition: vec![],
                order: keys,
                limit: fetch,
                with_rank: false,
                update_key: None,
            };
            let insert_only = self.nodes[input].changelog.is_insert_only();
            let out_schema = self.nodes[input].schema.clone();
            let id = self.add(1, out_schema, NodeKind::Rank(node), Some((input, Exchange::Global)));
            self.nodes[id].changelog = ChangelogMode {
                updates: !insert_only,
                deletes: true,
                upsert_key: None,
                no_update_before: false,
            };
            return Ok(id);
        }
        let time_column = match sort.expr.first() {
            Some(first) if first.asc => match &first.expr {
                Expr::Column(c) => schema
                    .index_of_column(c)
                    .ok()
                    .filter(|i| is_rowtime(&sort.input, *i, self.catalog)),
                _ => None,
            },
            _ => None,
        };
        let Some(time_column) = time_column else {
            return Err(SqlError::unsupported(
                "Sort on a non-time-attribute field is not supported.",
            ));
        };
        let input = self.convert(&sort.input)?;
        self.require_insert_only(input, "TemporalSort")?;
        let out_schema = self.nodes[input].schema.clone();
        Ok(self.add(
            1,
            out_schema,
            NodeKind::TemporalSort(TemporalSortNode {
                time_column,
                order: keys.into_iter().skip(1).collect(),
            }),
            Some((input, Exchange::Global)),
        ))
    }
}
