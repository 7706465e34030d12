//! From SQL to a [`StreamGraph`]: DataFusion plans the query (after our
//! AST rewrites), then each logical node becomes a streaming node:
//!
//! | logical | streaming |
//! |---|---|
//! | `TableScan` | source (+ a projection when the scan selects columns) |
//! | `Projection`, `Filter` | calc (chained to its input) |
//! | `Aggregate` grouped by a window | hash exchange by key → window aggregate |
//! | `Limit` | global exchange → limit (one subtask) |
//! | `SubqueryAlias` | nothing (names only) |
//!
//! Queries without any table (`SELECT 1 + 1`) run as DataFusion batch plans.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{DFSchema, TableReference};
use datafusion::config::ConfigOptions;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::planner::ContextProvider;
use datafusion::logical_expr::registry::FunctionRegistry;
use datafusion::logical_expr::{
    AggregateUDF, Expr, FetchType, HigherOrderUDF, LogicalPlan, ScalarUDF, SkipType, TableSource, WindowUDF,
};
use datafusion::optimizer::optimize_projections::OptimizeProjections;
use datafusion::optimizer::simplify_expressions::SimplifyExpressions;
use datafusion::optimizer::{Optimizer, OptimizerContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::LoweredAggregateBuilder;
use datafusion::physical_expr::expressions::{Column, cast};
use datafusion::prelude::SessionContext;
use datafusion::sql::planner::{ParserOptions, PlannerContext, SqlToRel};
use sqlparser::ast;
use weir_catalog::{Catalog, TableDef};
use weir_engine::config::JobConfig;
use weir_engine::plan::{
    AggCall, AggFunc, CalcNode, ChangelogMode, ChangelogNormalizeNode, Exchange, GroupAggregateNode, GroupOutput,
    JoinNode, JoinType, LagCall, LimitNode, NodeId, NodeKind, OverAggregateNode, OverFrame, OverOutput, RankNode,
    RankStrategy, SessionWindowNode, SinkNode, SortKey, SourceNode, StreamEdge, StreamGraph, StreamNode,
    TemporalSortNode, UpsertMaterializeNode, WatermarkNode, WindowAggregateNode, WindowKind, WindowSpec,
};

use crate::error::{Result, SqlError};
use crate::parser::OnConflict;
use crate::refusals;
use crate::rewrite::rewrite_query;
use crate::udf::{WINDOW_FN, WindowMarker};
use weir_engine::time_zone::SessionZone;

pub enum QueryPlan {
    /// Reads at least one table: runs as a streaming job.
    Stream(StreamGraph),
    /// No table: DataFusion computes it at once.
    Batch(LogicalPlan),
}

pub struct Planner {
    state: SessionState,
    /// Weir's expression planners, then DataFusion's: the first to plan an
    /// expression wins.
    expr_planners: Vec<Arc<dyn datafusion::logical_expr::planner::ExprPlanner>>,
}

impl Default for Planner {
    fn default() -> Self {
        Self::new()
    }
}

/// A table as the logical planner sees it: its schema, and no filters
/// taken into the scan (a filter pushed down stays a Calc after the
/// source, so every connector sees the same rows).
#[derive(Debug)]
struct StreamTableSource(SchemaRef);

impl TableSource for StreamTableSource {
    fn schema(&self) -> SchemaRef {
        self.0.clone()
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::common::Result<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
        Ok(vec![
            datafusion::logical_expr::TableProviderFilterPushDown::Unsupported;
            filters.len()
        ])
    }
}

struct Provider<'a> {
    state: &'a SessionState,
    expr_planners: &'a [Arc<dyn datafusion::logical_expr::planner::ExprPlanner>],
    catalog: &'a Catalog,
}

impl ContextProvider for Provider<'_> {
    fn get_table_source(&self, name: TableReference) -> datafusion::common::Result<Arc<dyn TableSource>> {
        let key = name.table();
        match self.catalog.table(key) {
            Some(t) => Ok(Arc::new(StreamTableSource(t.schema()))),
            None => datafusion::common::plan_err!("table '{name}' does not exist"),
        }
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.state.scalar_functions().get(name).cloned()
    }

    fn get_higher_order_meta(&self, name: &str) -> Option<Arc<HigherOrderUDF>> {
        self.state.higher_order_functions().get(name).cloned()
    }

    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.state.aggregate_functions().get(name).cloned()
    }

    fn get_window_meta(&self, name: &str) -> Option<Arc<WindowUDF>> {
        self.state.window_functions().get(name).cloned()
    }

    fn get_variable_type(&self, _variable_names: &[String]) -> Option<DataType> {
        None
    }

    fn get_type_planner(&self) -> Option<Arc<dyn datafusion::logical_expr::planner::TypePlanner>> {
        Some(Arc::new(crate::types::FlinkTypes))
    }

    fn get_expr_planners(&self) -> &[Arc<dyn datafusion::logical_expr::planner::ExprPlanner>] {
        self.expr_planners
    }

    fn options(&self) -> &ConfigOptions {
        self.state.config_options()
    }

    fn udf_names(&self) -> Vec<String> {
        self.state.scalar_functions().keys().cloned().collect()
    }

    fn higher_order_function_names(&self) -> Vec<String> {
        self.state.higher_order_functions().keys().cloned().collect()
    }

    fn udaf_names(&self) -> Vec<String> {
        self.state.aggregate_functions().keys().cloned().collect()
    }

    fn udwf_names(&self) -> Vec<String> {
        self.state.window_functions().keys().cloned().collect()
    }
}

fn parser_options() -> ParserOptions {
    ParserOptions {
        enable_ident_normalization: false,
        collect_spans: true,
        // `1.5` is a DECIMAL(2, 1) in Flink (an exponent makes a DOUBLE:
        // `parser::rewrite_numbers`).
        parse_float_as_decimal: true,
        ..ParserOptions::default()
    }
}

impl Planner {
    pub fn new() -> Self {
        let mut config = datafusion::prelude::SessionConfig::new();
        config.options_mut().sql_parser.enable_ident_normalization = false;
        config.options_mut().sql_parser.collect_spans = true;
        config.options_mut().sql_parser.parse_float_as_decimal = true;
        let mut state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .build();
        // Registering a fresh UDF into a fresh state cannot clash.
        let _ = state.register_udf(Arc::new(WindowMarker::udf()));
        let _ = state.register_udf(Arc::new(crate::udf::TemporalJoinMarker::udf()));
        let _ = state.register_udaf(Arc::new(crate::flink_functions::FlinkAvg::udaf()));
        let _ = state.register_udaf(Arc::new(crate::flink_functions::FlinkSum::udaf()));
        let _ = state.register_udaf(Arc::new(crate::flink_collect::Collect::udaf()));
        for udaf in crate::flink_moments::all() {
            let _ = state.register_udaf(Arc::new(udaf));
        }
        let _ = state.register_udf(Arc::new(crate::flink_functions::FlinkMod::udf()));
        let _ = state.register_udf(Arc::new(crate::flink_functions::Proctime::udf()));
        let _ = state.register_udf(Arc::new(crate::flink_functions::DateFormat::udf()));
        let _ = state.register_udf(Arc::new(crate::flink_functions::CurrentWatermark::udf()));
        let _ = state.register_udf(Arc::new(crate::flink_functions::TypeOf::udf()));
        let _ = state.register_udf(Arc::new(crate::flink_printf::Printf::udf()));
        for udf in crate::flink_clock::clocks()
            .into_iter()
            .chain(crate::flink_clock::Rand::udfs())
            .chain(crate::flink_bytes::all())
        {
            let _ = state.register_udf(Arc::new(udf));
        }
        for udf in [
            crate::flink_functions::FlinkLog::udf(),
            crate::flink_functions::FlinkSqrt::udf(),
            crate::flink_functions::NullStrict::greatest(),
            crate::flink_functions::NullStrict::least(),
        ]
        .into_iter()
        .chain(crate::flink_scalars::all())
        .chain(crate::flink_time::all())
        .chain(crate::flink_math::all())
        .chain(crate::flink_collections::all())
        .chain(crate::flink_maps::all())
        .chain(crate::flink_arrays::all())
        {
            let _ = state.register_udf(Arc::new(udf));
        }
        let mut expr_planners: Vec<Arc<dyn datafusion::logical_expr::planner::ExprPlanner>> = vec![
            Arc::new(crate::flink_decimal::WideProducts),
            Arc::new(crate::flink_scalars::FlinkOverlay),
        ];
        expr_planners.extend(state.expr_planners().iter().cloned());
        Self { state, expr_planners }
    }

    fn provider<'a>(&'a self, catalog: &'a Catalog) -> Provider<'a> {
        Provider {
            state: &self.state,
            expr_planners: &self.expr_planners,
            catalog,
        }
    }

    /// Plans a scalar expression against `schema`: (logical, physical),
    /// in the session zone `zone` (`None`: UTC).
    pub fn plan_expr(
        &self,
        expr: &ast::Expr,
        schema: &DFSchema,
        zone: Option<&SessionZone>,
    ) -> Result<(Expr, Arc<dyn PhysicalExpr>)> {
        let catalog = Catalog::in_memory();
        let provider = self.provider(&catalog);
        let sql_to_rel = SqlToRel::new_with_options(&provider, parser_options());
        let mut expr = expr.clone();
        crate::functions::check_calls(&expr)?;
        crate::functions::flink_calls(&mut expr)?;
        lowercase_functions(&mut expr);
        let logical = sql_to_rel.sql_to_expr(expr, schema, &mut PlannerContext::new())?;
        let logical = crate::flink_literals::flink_literals_in(logical)?.data;
        let logical = crate::flink_decimal::approximate_wins_in(logical, schema)?.data;
        let logical = crate::flink_zone::local_zone_in(logical, schema, zone)?.data;
        let logical = crate::flink_cast::flink_casts_in(logical, schema)?.data;
        let physical = self.state.create_physical_expr(logical.clone(), schema)?;
        let physical = weir_engine::expr::fast_paths(physical, schema.as_arrow())?;
        Ok((logical, physical))
    }

    /// Parses and plans a stored expression text (computed columns,
    /// watermarks).
    fn plan_expr_text(
        &self,
        text: &str,
        schema: &DFSchema,
        zone: Option<&SessionZone>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let expr = crate::parser::parse_expr_text(text)?;
        Ok(self.plan_expr(&expr, schema, zone)?.1)
    }

    /// The logical plan of a query, views inlined and windows rewritten,
    /// its times those of UTC (types and names do not depend on the zone).
    pub fn logical_plan(&self, query: &ast::Query, catalog: &Catalog) -> Result<LogicalPlan> {
        self.logical_plan_in(query, catalog, None)
    }

    /// [`Self::logical_plan`] in the session zone `zone` (`None`: UTC).
    pub fn logical_plan_in(
        &self,
        query: &ast::Query,
        catalog: &Catalog,
        zone: Option<&SessionZone>,
    ) -> Result<LogicalPlan> {
        Ok(self.logical_plan_with(query, catalog, zone)?.0)
    }

    /// [`Self::logical_plan_in`], and the catalog its scans name: `catalog`,
    /// or one that also holds the tables read with dynamic options
    /// (`t /*+ OPTIONS(...) */`, [`crate::hints::dynamic_options`]).
    fn logical_plan_with(
        &self,
        query: &ast::Query,
        catalog: &Catalog,
        zone: Option<&SessionZone>,
    ) -> Result<(LogicalPlan, Option<Catalog>)> {
        let mut query = query.clone();
        rewrite_query(&mut query, catalog)?;
        // After views are inlined, so a view's own hints count too.
        let hinted = match crate::hints::dynamic_options(&query, catalog)? {
            Some((rewritten, with_options)) => {
                query = rewritten;
                Some(with_options)
            }
            None => None,
        };
        let catalog = hinted.as_ref().unwrap_or(catalog);
        crate::functions::check_calls(&query)?;
        crate::functions::flink_calls(&mut query)?;
        let provider = self.provider(catalog);
        let sql_to_rel = SqlToRel::new_with_options(&provider, parser_options());
        let plan = sql_to_rel.sql_statement_to_plan(ast::Statement::Query(Box::new(query)))?;
        // `1` is an INT, as in Flink (before coercion widens it).
        let plan = crate::flink_literals::flink_literals(plan)?.data;
        // DOUBLE beside DECIMAL is DOUBLE, as in Flink.
        let plan = crate::flink_decimal::approximate_wins(plan)?.data;
        let plan = self
            .state
            .analyzer()
            .execute_and_check(plan, self.state.config_options(), |_, _| {})?;
        // TIMESTAMP_LTZ meets wall-clock times in the session zone (after
        // coercion, which inserts casts of its own).
        let plan = crate::flink_zone::local_zone(plan, zone)?.data;
        // Casts to strings write Flink's text (`TRUE`, `8.5E37`, ...).
        let plan = crate::flink_cast::flink_casts(plan)?.data;
        // Only rules that keep the plan's operators: column pruning (so
        // sources generate only what is used), expression simplification,
        // the equalities of a join's ON moved to its keys, and filters
        // pushed towards the sources.
        let optimizer = Optimizer::with_rules(vec![
            Arc::new(SimplifyExpressions::new()),
            // IN / EXISTS subqueries become semi and anti joins.
            Arc::new(datafusion::optimizer::decorrelate_predicate_subquery::DecorrelatePredicateSubquery::new()),
            // `FROM a, b WHERE a.k = b.k`: the equalities become the keys
            // of an inner join (the rest of the WHERE stays above it).
            Arc::new(datafusion::optimizer::eliminate_cross_join::EliminateCrossJoin::new()),
            // Filters move below joins, projections, aggregates (on their
            // group keys) and unions, as Flink's FILTER_INTO_JOIN and
            // transpose rules do: a join keeps only the rows that can
            // pass (q20 stores one category's auctions, not all of them).
            // Before the equalities are extracted, since it also turns the
            // cross join above back into a join with a condition.
            Arc::new(PushDownFilterOutsideSessions(
                datafusion::optimizer::push_down_filter::PushDownFilter::new(),
            )),
            Arc::new(datafusion::optimizer::extract_equijoin_predicate::ExtractEquijoinPredicate::new()),
            Arc::new(OptimizeProjections::new()),
        ]);
        let plan = optimizer.optimize(plan, &OptimizerContext::new(), |_, _| {})?;
        Ok((plan, hinted))
    }

    /// Plans a `SELECT`.
    pub fn plan_query(&self, query: &ast::Query, catalog: &Catalog, config: &JobConfig) -> Result<QueryPlan> {
        let (plan, hinted) = self.logical_plan_with(query, catalog, config.local_time_zone.as_ref())?;
        if !reads_a_table(&plan) {
            return Ok(QueryPlan::Batch(plan));
        }
        let catalog = hinted.as_ref().unwrap_or(catalog);
        let mut b = GraphBuilder::new(self, catalog, config, &plan)?;
        b.state_ttl_hints = crate::hints::state_ttl_hints(query)?;
        b.convert(&plan)?;
        Ok(QueryPlan::Stream(b.finish()))
    }

    /// Plans `INSERT INTO sink <query>`.
    pub fn plan_insert(
        &self,
        sink: &TableDef,
        query: &ast::Query,
        on_conflict: Option<OnConflict>,
        catalog: &Catalog,
        config: &JobConfig,
    ) -> Result<StreamGraph> {
        let (plan, hinted) = self.logical_plan_with(query, catalog, config.local_time_zone.as_ref())?;
        if !reads_a_table(&plan) {
            return Err(SqlError::unsupported(
                "INSERT of a query that reads no table is not supported",
            ));
        }
        let catalog = hinted.as_ref().unwrap_or(catalog);
        let mut b = GraphBuilder::new(self, catalog, config, &plan)?;
        b.state_ttl_hints = crate::hints::state_ttl_hints(query)?;
        let last = b.convert(&plan)?;
        b.add_sink(last, sink, on_conflict)?;
        Ok(b.finish())
    }

    /// Runs a table-less query with DataFusion.
    pub async fn execute_batch(&self, plan: LogicalPlan) -> Result<Vec<arrow::record_batch::RecordBatch>> {
        let ctx = SessionContext::new_with_state(self.state.clone());
        Ok(ctx.execute_logical_plan(plan).await?.collect().await?)
    }
}

fn lowercase_functions(expr: &mut ast::Expr) {
    let _ = ast::visit_expressions_mut(expr, |e| {
        if let ast::Expr::Function(f) = e
            && let [part] = f.name.0.as_mut_slice()
            && let Some(ident) = part.as_ident()
            && ident.quote_style.is_none()
        {
            *part = ast::ObjectNamePart::Identifier(ast::Ident::new(ident.value.to_ascii_lowercase()));
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// The positions of a sink's PRIMARY KEY columns among the columns an
/// INSERT writes (`None`: no key).
fn sink_key_positions(sink: &TableDef) -> Result<Option<Vec<usize>>> {
    let Some(pk) = &sink.primary_key else {
        return Ok(None);
    };
    let cols: Vec<&str> = sink.writable_columns().map(|c| c.name.as_str()).collect();
    pk.iter()
        .map(|k| cols.iter().position(|c| c == k))
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or_else(|| SqlError::internal("a PRIMARY KEY column is not a column of its sink"))
}

fn reads_a_table(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::TableScan(_)) || plan.inputs().iter().any(|p| reads_a_table(p))
}

/// A window marker call found by tracing a column down the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Marker {
    spec: WindowSpec,
    part: GroupOutput,
    /// On a TIMESTAMP_LTZ's wall clock in a session zone
    /// (`WindowMarker::zoned`).
    zoned: bool,
}

fn marker_of(expr: &Expr) -> Option<Marker> {
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
fn trace_marker(plan: &LogicalPlan, idx: usize) -> Option<Marker> {
    trace_marker_call(plan, idx).and_then(|(e, _)| marker_of(&e))
}

/// The window marker call output column `idx` of `plan` is, with the
/// projection that makes it.
fn trace_marker_call(plan: &LogicalPlan, idx: usize) -> Option<(Expr, &datafusion::logical_expr::Projection)> {
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

/// DataFusion's filter push-down, except through the projection that adds a
/// SESSION TVF's window columns: as Flink, a WHERE over the TVF on its own
/// filters its rows after their sessions are formed. (Under a window
/// aggregate the filter runs before the aggregate, which forms the
/// sessions, as Flink pushes it there.)
#[derive(Debug)]
struct PushDownFilterOutsideSessions(datafusion::optimizer::push_down_filter::PushDownFilter);

impl datafusion::optimizer::OptimizerRule for PushDownFilterOutsideSessions {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn apply_order(&self) -> Option<datafusion::optimizer::ApplyOrder> {
        self.0.apply_order()
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn datafusion::optimizer::OptimizerConfig,
    ) -> datafusion::common::Result<datafusion::common::tree_node::Transformed<LogicalPlan>> {
        fn adds_sessions(plan: &LogicalPlan) -> bool {
            match plan {
                LogicalPlan::SubqueryAlias(a) => adds_sessions(&a.input),
                LogicalPlan::Projection(p) => p.expr.iter().any(contains_session_marker),
                _ => false,
            }
        }
        if let LogicalPlan::Filter(f) = &plan
            && adds_sessions(&f.input)
        {
            return Ok(datafusion::common::tree_node::Transformed::no(plan));
        }
        self.0.rewrite(plan, config)
    }
}

/// Whose sessions a SESSION marker's windows are.
#[derive(Debug, Clone, PartialEq)]
enum SessionKeys {
    /// The legacy `GROUP BY k, SESSION(ts, gap)`: each group key's.
    GroupKeys,
    /// The TVF's `PARTITION BY` columns (none: one sequence of sessions).
    Partition(Vec<Expr>),
}

fn session_keys(marker: &Expr) -> Option<SessionKeys> {
    let Expr::ScalarFunction(ScalarFunction { args, .. }) = marker else {
        return None;
    };
    match args.get(6)? {
        Expr::Literal(datafusion::common::ScalarValue::Utf8(Some(v)), _) if v == "keys" => Some(SessionKeys::GroupKeys),
        _ => Some(SessionKeys::Partition(args[7..].to_vec())),
    }
}

fn contains_session_marker(e: &Expr) -> bool {
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
fn trace_window_bound(plan: &LogicalPlan, idx: usize) -> Option<Marker> {
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
fn attached_window(agg: &datafusion::logical_expr::Aggregate) -> Option<WindowSpec> {
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
fn window_join_ends(join: &datafusion::logical_expr::Join) -> Option<[usize; 2]> {
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

fn contains_multi_window_marker(e: &Expr) -> bool {
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

use datafusion::common::tree_node::TreeNode;

/// A filter that makes a Top-N: the `ROW_NUMBER()` it bounds.
struct TopN<'a> {
    window: &'a datafusion::logical_expr::Window,
    window_plan: &'a LogicalPlan,
    /// Which window expression.
    index: usize,
    /// The rank column in the filter's input.
    column: usize,
    /// N, or why the bound is not one Weir runs.
    limit: Result<usize>,
    /// The filter's other conjuncts.
    rest: Vec<&'a Expr>,
}

/// The Top-N a filter makes, if its predicate bounds a window function's
/// column from above.
fn top_n_of(f: &datafusion::logical_expr::Filter) -> Option<TopN<'_>> {
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

/// Follows output column `idx` of `plan` down to a window function's
/// column: (the window, its plan node, which expression).
fn trace_window(plan: &LogicalPlan, idx: usize) -> Option<(&datafusion::logical_expr::Window, &LogicalPlan, usize)> {
    match plan {
        LogicalPlan::SubqueryAlias(a) => trace_window(&a.input, idx),
        LogicalPlan::Projection(p) => match p.expr.get(idx)?.clone().unalias() {
            Expr::Column(c) => trace_window(&p.input, p.input.schema().index_of_column(&c).ok()?),
            _ => None,
        },
        LogicalPlan::Window(w) => {
            let n = w.input.schema().fields().len();
            (idx >= n).then_some((w, plan, idx - n))
        }
        _ => None,
    }
}

/// Whether output column `idx` of `plan` is a table's event-time column
/// (its WATERMARK column), passed through unchanged.
/// How a column of an updating stream changes for one key (Flink's
/// `FlinkRelMdModifiedMonotonicity`, for the cases Weir infers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Monotonicity {
    Constant,
    Increasing,
    Decreasing,
}

fn is_rowtime(plan: &LogicalPlan, idx: usize, catalog: &Catalog) -> bool {
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
fn is_proctime(plan: &LogicalPlan, idx: usize, catalog: &Catalog) -> bool {
    is_time_attribute(
        plan,
        idx,
        &|table, column| {
            catalog.table(table).and_then(|t| t.column(column)).is_some_and(|c| {
                c.computed
                    .as_deref()
                    .is_some_and(crate::flink_functions::is_proctime_call)
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
fn is_time_attribute(
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
fn temporal_of(join: &datafusion::logical_expr::Join) -> Option<(Vec<Expr>, Option<Expr>)> {
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
fn interval_bounds(
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
fn interval_ms(v: &datafusion::common::ScalarValue) -> Option<i64> {
    use datafusion::common::ScalarValue as S;
    match v {
        S::IntervalDayTime(Some(d)) => Some(i64::from(d.days) * 86_400_000 + i64::from(d.milliseconds)),
        S::IntervalMonthDayNano(Some(m)) if m.months == 0 => {
            Some(i64::from(m.days) * 86_400_000 + m.nanoseconds.div_euclid(1_000_000))
        }
        _ => None,
    }
}

struct GraphBuilder<'a> {
    planner: &'a Planner,
    catalog: &'a Catalog,
    config: &'a JobConfig,
    nodes: Vec<StreamNode>,
    edges: Vec<StreamEdge>,
    /// Inside the input of a window aggregate, HOP/CUMULATE markers are
    /// allowed (the aggregate assigns their windows).
    under_window_aggregate: bool,
    /// Set by a projection over a Top-N filter: whether it uses the rank
    /// column (taken by that filter).
    rank_used: Option<bool>,
    /// A plan node already converted (a Top-N's window): its stream node.
    replaced: Option<(*const LogicalPlan, NodeId)>,
    /// Per table, the columns any scan of it in the query reads: a table
    /// scanned twice (a self-join, a UNION of two filters of it) is read
    /// by one source that feeds both (Flink's source reuse), so it is
    /// read once, and has one uid and one set of split positions.
    scan_columns: HashMap<String, BTreeSet<String>>,
    /// The source node already made for a table.
    sources: HashMap<String, NodeId>,
    /// `STATE_TTL` hints: input name (lowercase) → TTL.
    state_ttl_hints: HashMap<String, std::time::Duration>,
}

impl<'a> GraphBuilder<'a> {
    fn new(planner: &'a Planner, catalog: &'a Catalog, config: &'a JobConfig, plan: &LogicalPlan) -> Result<Self> {
        let mut scan_columns: HashMap<String, BTreeSet<String>> = HashMap::new();
        plan.apply_with_subqueries(|p| {
            if let LogicalPlan::TableScan(scan) = p
                && let Some(def) = catalog.table(scan.table_name.table())
            {
                // By the catalog key: a table read with dynamic options
                // (`t /*+ OPTIONS(...) */`) is a source of its own.
                let cols = scan_columns.entry(scan.table_name.table().to_string()).or_default();
                match &scan.projection {
                    Some(ix) => cols.extend(ix.iter().filter_map(|i| def.columns.get(*i)).map(|c| c.name.clone())),
                    None => cols.extend(def.columns.iter().map(|c| c.name.clone())),
                }
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        })?;
        Ok(Self {
            planner,
            catalog,
            config,
            nodes: vec![],
            edges: vec![],
            under_window_aggregate: false,
            rank_used: None,
            replaced: None,
            scan_columns,
            sources: HashMap::new(),
            state_ttl_hints: HashMap::new(),
        })
    }

    fn finish(self) -> StreamGraph {
        weir_engine::uid::graph(self.nodes, self.edges, &self.config.operator_uids)
    }

    fn add(
        &mut self,
        parallelism: usize,
        schema: SchemaRef,
        kind: NodeKind,
        input: Option<(NodeId, Exchange)>,
    ) -> NodeId {
        let id = self.nodes.len();
        let changelog = self.mode_of(&kind, input.as_ref().map(|(from, _)| *from));
        self.nodes.push(StreamNode {
            id,
            uid: String::new(),
            parallelism,
            schema,
            kind,
            changelog,
        });
        if let Some((from, exchange)) = input {
            self.edges.push(StreamEdge {
                from,
                to: id,
                exchange,
                input: 0,
            });
        }
        id
    }

    /// How column `col` of node `id` changes for one upsert key: through
    /// projections without a filter (a filter may turn an update into a
    /// delete) down to a GROUP BY over insert-only input, whose keys are
    /// constant, COUNT and MAX increase and MIN decreases (SUM may go
    /// either way). `None`: not known to be monotonic.
    fn monotonicity(&self, id: NodeId, col: usize) -> Option<Monotonicity> {
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
    fn mode_of(&self, kind: &NodeKind, input: Option<NodeId>) -> ChangelogMode {
        let input = input.map(|i| self.nodes[i].changelog.clone()).unwrap_or_default();
        match kind {
            // Upserts by the key: no `-U`, deletes maybe of the key only
            // (normalized right behind).
            NodeKind::Source(s) if s.factory.is_upsert() => ChangelogMode {
                updates: true,
                deletes: true,
                upsert_key: None,
                no_update_before: true,
            },
            NodeKind::ChangelogNormalize(c) => ChangelogMode {
                updates: true,
                deletes: true,
                upsert_key: c
                    .key
                    .iter()
                    .map(|k| k.downcast_ref::<Column>().map(|c| c.index()))
                    .collect(),
                no_update_before: false,
            },
            // A changelog format reads updates and deletes.
            NodeKind::Source(s) if s.factory.produces_changes() => ChangelogMode {
                updates: true,
                deletes: true,
                upsert_key: None,
                no_update_before: false,
            },
            NodeKind::Source(_)
            | NodeKind::WindowAggregate(_)
            | NodeKind::SessionWindow(_)
            | NodeKind::OverAggregate(_) => ChangelogMode::insert_only(),
            NodeKind::Calc(c) => match &c.projection {
                Some(p) => input.through_projection(
                    &p.iter()
                        .map(|e| e.downcast_ref::<Column>().map(|c| c.index()))
                        .collect::<Vec<_>>(),
                ),
                None => input,
            },
            // Updates always; deletes when input rows can leave a key.
            NodeKind::GroupAggregate(g) => ChangelogMode {
                updates: true,
                deletes: !input.is_insert_only(),
                upsert_key: Some((0..g.keys.len()).collect()),
                no_update_before: false,
            },
            NodeKind::Limit(_) | NodeKind::Sink(_) | NodeKind::TemporalSort(_) => input,
            // `+I`, `+U`, `-D` by the sink's key.
            NodeKind::UpsertMaterialize(m) => ChangelogMode {
                updates: true,
                deletes: true,
                upsert_key: m
                    .key
                    .iter()
                    .map(|k| k.downcast_ref::<Column>().map(|c| c.index()))
                    .collect(),
                no_update_before: true,
            },
            // Set by `join` and `union` once every input is known.
            NodeKind::Join(_) | NodeKind::Union | NodeKind::Rank(_) => input,
        }
    }

    /// The node that makes `id`'s output updating: `id` itself, or the
    /// first updating node up its chain of calcs (what errors name).
    fn updating_origin(&self, mut id: NodeId) -> NodeId {
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
    fn require_insert_only(&self, input: NodeId, what: &str) -> Result<()> {
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

    fn calc(
        &mut self,
        input: NodeId,
        schema: SchemaRef,
        filter: Option<Arc<dyn PhysicalExpr>>,
        projection: Option<Vec<Arc<dyn PhysicalExpr>>>,
    ) -> NodeId {
        let p = self.nodes[input].parallelism;
        self.add(
            p,
            schema,
            NodeKind::Calc(CalcNode { filter, projection }),
            Some((input, Exchange::Forward)),
        )
    }

    /// `CURRENT_WATERMARK(x)` in `exprs` over `input`: `x` must be a rowtime
    /// attribute (Flink's message otherwise).
    fn check_current_watermark(&self, exprs: &[Expr], input: &LogicalPlan) -> Result<()> {
        let mut bad: Option<String> = None;
        for e in exprs {
            let _ = e.apply(|x| {
                if let Expr::ScalarFunction(ScalarFunction { func, args }) = x
                    && func.name() == weir_engine::expr::CURRENT_WATERMARK
                {
                    let rowtime = match args.as_slice() {
                        [Expr::Column(c)] => input
                            .schema()
                            .index_of_column(c)
                            .is_ok_and(|i| is_rowtime(input, i, self.catalog)),
                        _ => false,
                    };
                    if !rowtime {
                        let ty = args
                            .first()
                            .and_then(|a| datafusion::logical_expr::ExprSchemable::get_type(a, input.schema()).ok())
                            .map_or_else(|| "?".into(), |t| crate::types::flink_name(&t));
                        bad = Some(ty);
                        return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
                    }
                }
                Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
            });
        }
        match bad {
            Some(ty) => Err(SqlError::plan(format!(
                "CURRENT_WATERMARK() must be called with a single rowtime attribute argument, but '{ty}' cannot be a \
                 time attribute."
            ))),
            None => Ok(()),
        }
    }

    fn physical(&self, e: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        let physical = self.planner.state.create_physical_expr(e.clone(), schema)?;
        Ok(weir_engine::expr::fast_paths(physical, schema.as_arrow())?)
    }

    fn convert(&mut self, plan: &LogicalPlan) -> Result<NodeId> {
        if let Some((p, id)) = self.replaced
            && std::ptr::eq(p, plan)
        {
            return Ok(id);
        }
        match plan {
            LogicalPlan::TableScan(scan) => self.source(scan),
            LogicalPlan::SubqueryAlias(a) => self.convert(&a.input),
            LogicalPlan::Projection(p)
                if !self.under_window_aggregate && p.expr.iter().any(contains_session_marker) =>
            {
                self.session_window(p)
            }
            LogicalPlan::Projection(p) => {
                if !self.under_window_aggregate && p.expr.iter().any(contains_multi_window_marker) {
                    return Err(SqlError::unsupported(
                        "HOP and CUMULATE window TVFs are supported only under GROUP BY window_start, window_end",
                    ));
                }
                // Over a Top-N: whether the rank column is shown decides
                // what a rank shift emits.
                if let LogicalPlan::Filter(f) = p.input.as_ref()
                    && let Some(top) = top_n_of(f)
                {
                    let rank_col = f.input.schema().qualified_field(top.column);
                    let rank_col = datafusion::common::Column::from(rank_col);
                    self.rank_used = Some(p.expr.iter().any(|e| e.column_refs().contains(&rank_col)));
                }
                self.check_current_watermark(&p.expr, &p.input)?;
                let input = self.convert(&p.input)?;
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| self.physical(e, p.input.schema()))
                    .collect::<Result<Vec<_>>>()?;
                Ok(self.calc(input, Arc::new(p.schema.as_arrow().clone()), None, Some(exprs)))
            }
            LogicalPlan::Filter(f) if top_n_of(f).is_some() => self.top_n(f),
            LogicalPlan::Filter(f) => {
                self.check_current_watermark(std::slice::from_ref(&f.predicate), &f.input)?;
                let input = self.convert(&f.input)?;
                let pred = self.physical(&f.predicate, f.input.schema())?;
                Ok(self.calc(input, Arc::new(f.input.schema().as_arrow().clone()), Some(pred), None))
            }
            LogicalPlan::Aggregate(agg) => self.aggregate(agg),
            LogicalPlan::Limit(l) => {
                let fetch = match l.get_fetch_type()? {
                    FetchType::Literal(Some(n)) => n,
                    _ => return Err(SqlError::unsupported("LIMIT needs a constant row count")),
                };
                let skip = match l.get_skip_type()? {
                    SkipType::Literal(n) => n,
                    _ => return Err(SqlError::unsupported("OFFSET needs a constant row count")),
                };
                let input = self.convert(&l.input)?;
                self.require_insert_only(input, "Limit")?;
                let schema = self.nodes[input].schema.clone();
                Ok(self.add(
                    1,
                    schema,
                    NodeKind::Limit(LimitNode { skip, fetch }),
                    Some((input, Exchange::Global)),
                ))
            }
            LogicalPlan::Sort(sort) => self.sort(sort),
            LogicalPlan::Join(j) => self.join(j),
            LogicalPlan::Union(u) => self.union(u),
            LogicalPlan::Distinct(datafusion::logical_expr::Distinct::All(input)) => {
                // A GROUP BY of every column without aggregates.
                let source = self.convert(input)?;
                let n = input.schema().fields().len();
                let keys = (0..n)
                    .map(|i| {
                        let f = input.schema().field(i);
                        Arc::new(Column::new(f.name(), i)) as Arc<dyn PhysicalExpr>
                    })
                    .collect::<Vec<_>>();
                let ttl = self.hinted_ttl(input);
                Ok(self.group_node(source, Arc::new(input.schema().as_arrow().clone()), keys, vec![], ttl))
            }
            LogicalPlan::Distinct(_) => Err(SqlError::unsupported("SELECT DISTINCT ON on a stream is not supported")),
            LogicalPlan::Window(w) => self.over_aggregate(w),
            other => Err(SqlError::unsupported(format!(
                "{} is not supported in a streaming query",
                other.display()
            ))),
        }
    }

    fn source(&mut self, scan: &datafusion::logical_expr::TableScan) -> Result<NodeId> {
        let name = scan.table_name.table();
        let def = self
            .catalog
            .table(name)
            .ok_or_else(|| SqlError::not_found(format!("table '{name}' does not exist")))?;
        let projected: Vec<String> = match &scan.projection {
            Some(p) => p.iter().map(|i| def.columns[*i].name.clone()).collect(),
            None => def.columns.iter().map(|c| c.name.clone()).collect(),
        };
        if let Some(&source) = self.sources.get(name) {
            return self.project_scan(source, scan, &projected);
        }
        // Columns the source must produce: every scan's projection, plus
        // what the watermark and the used computed columns need.
        let mut needed: BTreeSet<String> = projected.iter().cloned().collect();
        needed.extend(self.scan_columns.get(name).into_iter().flatten().cloned());
        if !weir_engine::connectors::supports_column_pruning(def) {
            needed.extend(def.physical_columns().map(|c| c.name.clone()));
        }
        needed.extend(weir_engine::connectors::required_columns(def));
        if let Some(w) = &def.watermark {
            needed.insert(w.column.clone());
            needed.extend(identifiers(&w.expr));
        }
        for c in &def.columns {
            if let Some(expr) = &c.computed
                && needed.contains(&c.name)
            {
                needed.extend(identifiers(expr));
            }
        }
        let mut narrowed = def.clone();
        narrowed.columns.retain(|c| needed.contains(&c.name));
        let factory = weir_engine::connectors::create_source(&narrowed, &self.config.paths)?;
        let full_schema = narrowed.schema();
        let physical_schema = narrowed.physical_schema();
        let physical_df = DFSchema::try_from(physical_schema.as_ref().clone())?;
        let computed = if narrowed.columns.iter().any(|c| c.computed.is_some()) {
            let mut exprs: Vec<Arc<dyn PhysicalExpr>> = vec![];
            for c in &narrowed.columns {
                exprs.push(match &c.computed {
                    Some(text) => {
                        self.planner
                            .plan_expr_text(text, &physical_df, self.config.local_time_zone.as_ref())?
                    }
                    None => Arc::new(Column::new(&c.name, physical_schema.index_of(&c.name)?)),
                });
            }
            Some(exprs)
        } else {
            None
        };
        let table_idle = def
            .options
            .get("scan.watermark.idle-timeout")
            .and_then(|v| weir_catalog::options::parse_duration(v));
        let idle_timeout = table_idle.or(self.config.source_idle_timeout).filter(|d| !d.is_zero());
        let watermark = match &def.watermark {
            Some(w) => {
                let full_df = DFSchema::try_from(full_schema.as_ref().clone())?;
                Some(WatermarkNode {
                    column: w.column.clone(),
                    sql: w.expr.clone(),
                    expr: self
                        .planner
                        .plan_expr_text(&w.expr, &full_df, self.config.local_time_zone.as_ref())?,
                    idle_timeout,
                    alignment: w.alignment.clone(),
                })
            }
            None => None,
        };
        let source = self.add(
            self.config.parallelism,
            full_schema.clone(),
            NodeKind::Source(SourceNode {
                table: narrowed.clone(),
                factory,
                computed,
                watermark,
            }),
            None,
        );
        // An upsert source's changes become a full changelog by its key
        // (Flink's ChangelogNormalize), which every scan of it reads.
        let source = if let NodeKind::Source(s) = &self.nodes[source].kind
            && s.factory.is_upsert()
        {
            let pk = def.primary_key.clone().unwrap_or_default();
            let key = pk
                .iter()
                .map(|c| Ok(Arc::new(Column::new(c, full_schema.index_of(c)?)) as Arc<dyn PhysicalExpr>))
                .collect::<Result<Vec<_>>>()?;
            self.add(
                self.config.parallelism,
                full_schema.clone(),
                NodeKind::ChangelogNormalize(ChangelogNormalizeNode { key: key.clone() }),
                Some((source, Exchange::Hash(key))),
            )
        } else {
            source
        };
        self.sources.insert(name.to_string(), source);
        self.project_scan(source, scan, &projected)
    }

    /// The TTL a `STATE_TTL` hint gives the input `plan`, by its alias or
    /// its table's name.
    fn hinted_ttl(&self, plan: &LogicalPlan) -> Option<std::time::Duration> {
        if self.state_ttl_hints.is_empty() {
            return None;
        }
        let hinted = |name: &str| self.state_ttl_hints.get(&name.to_ascii_lowercase()).copied();
        match plan {
            LogicalPlan::SubqueryAlias(a) => hinted(a.alias.table()).or_else(|| self.hinted_ttl(&a.input)),
            LogicalPlan::TableScan(s) => hinted(s.table_name.table()),
            LogicalPlan::Projection(p) => self.hinted_ttl(&p.input),
            LogicalPlan::Filter(f) => self.hinted_ttl(&f.input),
            _ => None,
        }
    }

    /// The columns `projected` of one scan, from the table's source.
    fn project_scan(
        &mut self,
        source: NodeId,
        scan: &datafusion::logical_expr::TableScan,
        projected: &[String],
    ) -> Result<NodeId> {
        let full_schema = self.nodes[source].schema.clone();
        if full_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .eq(projected.iter().map(|s| s.as_str()))
        {
            return Ok(source);
        }
        let exprs = projected
            .iter()
            .map(|n| Ok(Arc::new(Column::new(n, full_schema.index_of(n)?)) as Arc<dyn PhysicalExpr>))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.calc(
            source,
            Arc::new(scan.projected_schema.as_arrow().clone()),
            None,
            Some(exprs),
        ))
    }

    /// An aggregate call of a logical Aggregate as DataFusion's physical
    /// aggregate (and its FILTER), over the aggregate's input.
    fn lower_aggregate(
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
    fn aggregate(&mut self, agg: &datafusion::logical_expr::Aggregate) -> Result<NodeId> {
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
    fn sessions_of_other_keys(&self, agg: &datafusion::logical_expr::Aggregate) -> bool {
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

    /// A projection that adds a SESSION TVF's window columns, not under a
    /// window aggregate grouped by its partition: Flink's window table
    /// function on its own. The session operator (hash by the partition)
    /// emits each row with its session's `window_start`, `window_end`,
    /// `window_time` when the session fires; a calc then lays the
    /// projection out.
    fn session_window(&mut self, p: &datafusion::logical_expr::Projection) -> Result<NodeId> {
        let marker = p
            .expr
            .iter()
            .map(|e| e.clone().unalias())
            .find(|e| marker_of(e).is_some_and(|m| m.spec.kind == WindowKind::Session))
            .ok_or_else(|| SqlError::internal("a session window without its marker"))?;
        let (Some(m), Expr::ScalarFunction(ScalarFunction { args, func })) = (marker_of(&marker), &marker) else {
            return Err(SqlError::internal("a session window without its marker"));
        };
        // On a TIMESTAMP_LTZ in a session zone: sessions on its wall clock.
        let zone = WindowMarker::zone_of(func).and(self.config.local_time_zone.clone());
        let input_schema = p.input.schema();
        let time_column = match &args[0] {
            Expr::Column(c) => input_schema.index_of_column(c)?,
            other => {
                return Err(SqlError::plan(format!(
                    "the time attribute of a SESSION window must be a column, found {other}"
                )));
            }
        };
        if is_proctime(&p.input, time_column, self.catalog) {
            return Err(refusals::PROCTIME_SESSION.error());
        }
        let partition = match session_keys(&marker) {
            Some(SessionKeys::Partition(cols)) => cols
                .iter()
                .map(|c| self.physical(c, input_schema))
                .collect::<Result<Vec<_>>>()?,
            _ => {
                return Err(SqlError::unsupported(
                    "GROUP BY SESSION(...) needs its session columns grouped by (SESSION_START, SESSION_END)",
                ));
            }
        };
        let input = self.convert(&p.input)?;
        self.require_insert_only(input, "SessionWindow")?;
        let in_fields = input_schema.as_arrow().fields().clone();
        let ts_type = in_fields[time_column].data_type().clone();
        // window_start and window_end are wall times, TIMESTAMP(3) (Flink's
        // type for a TIMESTAMP_LTZ attribute too); window_time is a time
        // attribute of the attribute's type.
        let wall_type = match &ts_type {
            DataType::Timestamp(unit, Some(_)) => DataType::Timestamp(*unit, None),
            other => other.clone(),
        };
        let mut fields: Vec<arrow::datatypes::FieldRef> = in_fields.iter().cloned().collect();
        for (name, t) in [
            ("window_start", &wall_type),
            ("window_end", &wall_type),
            ("window_time", &ts_type),
        ] {
            fields.push(Arc::new(arrow::datatypes::Field::new(name, t.clone(), false)));
        }
        let schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let (parallelism, exchange) = if partition.is_empty() {
            (1, Exchange::Global)
        } else {
            (self.config.parallelism, Exchange::Hash(partition.clone()))
        };
        let sessions = self.add(
            parallelism,
            schema.clone(),
            NodeKind::SessionWindow(SessionWindowNode {
                gap: m.spec.size,
                time_column,
                partition,
                zone,
            }),
            Some((input, exchange)),
        );
        let n = in_fields.len();
        let mut exprs: Vec<Arc<dyn PhysicalExpr>> = vec![];
        for (i, e) in p.expr.iter().enumerate() {
            let name = p.schema.field(i).name();
            exprs.push(match marker_of(e) {
                Some(m) => {
                    let at = n + match m.part {
                        GroupOutput::WindowStart => 0,
                        GroupOutput::WindowEnd => 1,
                        _ => 2,
                    };
                    Arc::new(Column::new(name, at))
                }
                None if contains_session_marker(e) => {
                    return Err(SqlError::unsupported(format!(
                        "an expression over a SESSION window's bounds in the same SELECT as the TVF: {e}"
                    )));
                }
                None => self.physical(e, input_schema)?,
            });
        }
        Ok(self.calc(sessions, Arc::new(p.schema.as_arrow().clone()), None, Some(exprs)))
    }

    fn group_aggregate(&mut self, agg: &datafusion::logical_expr::Aggregate) -> Result<NodeId> {
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

    fn join(&mut self, join: &datafusion::logical_expr::Join) -> Result<NodeId> {
        use datafusion::logical_expr::JoinType as J;
        let join_type = match join.join_type {
            J::Inner => JoinType::Inner,
            J::Left => JoinType::Left,
            J::Right => JoinType::Right,
            J::Full => JoinType::Full,
            J::LeftSemi => JoinType::LeftSemi,
            J::LeftAnti if join.null_aware => {
                return Err(refusals::NOT_IN_SUBQUERY.error());
            }
            J::LeftAnti => JoinType::LeftAnti,
            other => {
                return Err(SqlError::unsupported(format!(
                    "{other} joins are not supported on a stream yet"
                )));
            }
        };
        if join.null_equality == datafusion::common::NullEquality::NullEqualsNull {
            return Err(refusals::JOIN_NOT_DISTINCT.error());
        }
        if join.on.is_empty() {
            return Err(refusals::JOIN_WITHOUT_EQUALITY.error());
        }
        let (ls, rs) = (join.left.schema(), join.right.schema());
        let mut left_keys = vec![];
        let mut right_keys = vec![];
        for (l, r) in &join.on {
            let (lk, rk) = (self.physical(l, ls)?, self.physical(r, rs)?);
            let (lt, rt) = (lk.data_type(ls.as_arrow())?, rk.data_type(rs.as_arrow())?);
            if lt != rt {
                return Err(SqlError::plan(format!(
                    "join keys {l} ({}) and {r} ({}) have different types; CAST one to the other",
                    crate::types::flink_name(&lt),
                    crate::types::flink_name(&rt)
                )));
            }
            left_keys.push(lk);
            right_keys.push(rk);
        }
        weir_engine::keygroup::KeyEncoder::new(
            &left_keys
                .iter()
                .map(|k| k.data_type(ls.as_arrow()))
                .collect::<std::result::Result<Vec<_>, _>>()?,
        )?;
        // Over left ++ right columns (a semi join's own schema is the
        // left side's alone).
        let both = ls.as_ref().join(rs.as_ref())?;
        let left = self.convert(&join.left)?;
        let right = self.convert(&join.right)?;
        let (lm, rm) = (self.nodes[left].changelog.clone(), self.nodes[right].changelog.clone());
        // Time bounds between the sides' event-time columns over
        // insert-only inputs make an interval join (Flink's rule; else
        // the condition is a regular join's filter).
        // Equal window_start and window_end of windows on both sides over
        // insert-only inputs make a window join (Flink's rule), joined
        // when the window fires.
        let window = window_join_ends(join).filter(|_| lm.is_insert_only() && rm.is_insert_only());
        // Windows on a TIMESTAMP_LTZ's wall clock (in a session zone) join
        // by the wall clock; both sides' windows must be cut the same way.
        let window_zone = match window.map(|[l, r]| {
            [
                trace_window_bound(&join.left, l).is_some_and(|m| m.zoned),
                trace_window_bound(&join.right, r).is_some_and(|m| m.zoned),
            ]
        }) {
            Some([true, true]) => self.config.local_time_zone.clone(),
            Some([true, false] | [false, true]) => {
                return Err(SqlError::plan(
                    "a window join of windows on a TIMESTAMP_LTZ with windows on a TIMESTAMP: their bounds are \
                     not the same clock's; declare both time attributes with one type",
                ));
            }
            _ => None,
        };
        if let Some([l, r]) = window
            && (self.window_on_proctime(&join.left, l) || self.window_on_proctime(&join.right, r))
        {
            return Err(refusals::PROCTIME_WINDOW_JOIN.error());
        }
        let interval = match interval_bounds(join, self.catalog) {
            Some(found)
                if window.is_none()
                    && lm.is_insert_only()
                    && rm.is_insert_only()
                    && join_type.semi_anti().is_none() =>
            {
                Some(found)
            }
            _ => None,
        };
        let temporal = match temporal_of(join) {
            Some((args, rest)) => {
                let times = self.temporal_times(join, join_type, &args)?;
                self.require_insert_only(left, "Temporal join (its left side)")?;
                Some((times, rest))
            }
            None => None,
        };
        let filter = match (&temporal, &interval, &join.filter) {
            (Some((_, rest)), _, _) | (None, Some((_, rest)), _) => {
                rest.as_ref().map(|f| self.physical(f, &both)).transpose()?
            }
            (None, None, Some(f)) => Some(self.physical(f, &both)?),
            (None, None, None) => None,
        };
        let node = JoinNode {
            join_type,
            left_keys: left_keys.clone(),
            right_keys: right_keys.clone(),
            filter,
            left_schema: Arc::new(ls.as_arrow().clone()),
            right_schema: Arc::new(rs.as_arrow().clone()),
            state_ttl: [self.hinted_ttl(&join.left), self.hinted_ttl(&join.right)],
            unique_keys: [lm.upsert_key.clone(), rm.upsert_key.clone()],
            interval: interval.as_ref().map(|(b, _)| *b).filter(|_| temporal.is_none()),
            window: window.filter(|_| temporal.is_none()),
            temporal: temporal.as_ref().map(|(t, _)| *t),
            zone: window_zone.filter(|_| temporal.is_none()),
        };
        let is_interval = node.interval.is_some() || node.window.is_some() || node.temporal.is_some();
        let id = self.add(
            self.config.parallelism,
            Arc::new(join.schema.as_arrow().clone()),
            NodeKind::Join(node),
            Some((left, Exchange::Hash(left_keys))),
        );
        self.edges.push(StreamEdge {
            from: right,
            to: id,
            exchange: Exchange::Hash(right_keys),
            input: 1,
        });
        // Flink: an inner join passes its inputs' kinds on; an outer join
        // emits inserts and deletes (padded rows come and go).
        self.nodes[id].changelog = match join_type {
            // An interval or window join emits inserts only (padded rows
            // once their time or window has passed).
            _ if is_interval => ChangelogMode::insert_only(),
            // Left rows alone: a right row appearing (anti) or leaving
            // (semi) takes left rows back.
            JoinType::LeftSemi => ChangelogMode {
                updates: lm.updates,
                deletes: lm.deletes || !rm.is_insert_only(),
                upsert_key: lm.upsert_key.clone(),
                no_update_before: false,
            },
            JoinType::LeftAnti => ChangelogMode {
                updates: lm.updates,
                deletes: true,
                upsert_key: lm.upsert_key.clone(),
                no_update_before: false,
            },
            _ => ChangelogMode {
                updates: lm.updates || rm.updates,
                deletes: join_type != JoinType::Inner || lm.deletes || rm.deletes,
                upsert_key: None,
                no_update_before: false,
            },
        };
        Ok(id)
    }

    /// Checks a temporal join as Flink does and returns its time columns:
    /// the left side's rowtime, the versioned side's version time.
    fn temporal_times(
        &self,
        join: &datafusion::logical_expr::Join,
        join_type: JoinType,
        args: &[Expr],
    ) -> Result<[usize; 2]> {
        if !matches!(join_type, JoinType::Inner | JoinType::Left) {
            return Err(SqlError::unsupported(format!(
                "Temporal Table Join currently only supports INNER JOIN and LEFT JOIN, but was {} JOIN",
                join_type.sql()
            )));
        }
        let (ls, rs) = (join.left.schema(), join.right.schema());
        let [Expr::Column(lt), Expr::Column(rt), pk @ ..] = args else {
            return Err(SqlError::plan(
                "FOR SYSTEM_TIME AS OF takes a time attribute column of the left table",
            ));
        };
        let Ok(li) = ls.index_of_column(lt) else {
            return Err(SqlError::plan(format!(
                "FOR SYSTEM_TIME AS OF {lt}: temporal table join currently only supports \
                 'FOR SYSTEM_TIME AS OF' left table's time attribute field"
            )));
        };
        let ri = rs.index_of_column(rt)?;
        if !is_rowtime(&join.left, li, self.catalog) {
            if is_proctime(&join.left, li, self.catalog) {
                return Err(refusals::PROCTIME_TEMPORAL_JOIN.error());
            }
            let ty = ls.field(li).data_type();
            if !matches!(ty, DataType::Timestamp(..)) {
                return Err(SqlError::plan(format!(
                    "The system time period specification expects Timestamp type but is '{}' ({lt})",
                    crate::types::flink_name(ty)
                )));
            }
            return Err(SqlError::plan(format!(
                "FOR SYSTEM_TIME AS OF {lt}: temporal table join currently only supports \
                 'FOR SYSTEM_TIME AS OF' left table's time attribute field (a column with a WATERMARK)"
            )));
        }
        // The versioned table's key must be among the join's equalities:
        // one version per join key.
        // (A key compared with another type is cast: the cast column is
        // still the key.)
        fn uncast(e: &Expr) -> &Expr {
            match e {
                Expr::Cast(c) => uncast(&c.expr),
                Expr::TryCast(c) => uncast(&c.expr),
                Expr::Alias(a) => uncast(&a.expr),
                other => other,
            }
        }
        let missing: Vec<String> = pk
            .iter()
            .filter(|c| !join.on.iter().any(|(_, k)| uncast(k) == *c))
            .map(|c| match c {
                Expr::Column(c) => c.name.clone(),
                other => other.to_string(),
            })
            .collect();
        if !missing.is_empty() {
            return Err(SqlError::plan(format!(
                "Temporal Table Join requires primary key in versioned table, but no primary key can be \
                 found: the versioned table's primary key [{}] must be in the join's equalities \
                 (ON left.col = versioned.{})",
                missing.join(", "),
                missing[0]
            )));
        }
        Ok([li, ri])
    }

    /// `UNION ALL` of any number of inputs (`UNION` is a DISTINCT over
    /// it). Inputs at the union's parallelism keep their subtask
    /// (forward); others are spread, by the whole row when they carry
    /// changes (so a row's insert and its retraction take one path, in
    /// order).
    fn union(&mut self, u: &datafusion::logical_expr::Union) -> Result<NodeId> {
        let schema = Arc::new(u.schema.as_arrow().clone());
        let mut inputs = vec![];
        for input in &u.inputs {
            let mut id = self.convert(input)?;
            let have = self.nodes[id].schema.clone();
            if have.fields().len() != schema.fields().len() {
                return Err(SqlError::plan("UNION inputs have different numbers of columns"));
            }
            if have
                .fields()
                .iter()
                .zip(schema.fields())
                .any(|(a, b)| a.data_type() != b.data_type())
            {
                let exprs = have
                    .fields()
                    .iter()
                    .zip(schema.fields())
                    .enumerate()
                    .map(|(i, (a, b))| {
                        let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new(a.name(), i));
                        Ok(if a.data_type() == b.data_type() {
                            col
                        } else {
                            cast(col, &have, b.data_type().clone())?
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                id = self.calc(id, schema.clone(), None, Some(exprs));
            }
            inputs.push(id);
        }
        let parallelisms: BTreeSet<usize> = inputs.iter().map(|i| self.nodes[*i].parallelism).collect();
        let parallelism = match parallelisms.iter().collect::<Vec<_>>().as_slice() {
            [p] => **p,
            _ => self.config.parallelism,
        };
        let exchange = |b: &Self, i: NodeId| {
            let n = &b.nodes[i];
            if n.parallelism == parallelism {
                Exchange::Forward
            } else if n.changelog.is_insert_only() {
                Exchange::Rebalance
            } else {
                Exchange::Hash(
                    (0..n.schema.fields().len())
                        .map(|c| Arc::new(Column::new(n.schema.field(c).name(), c)) as Arc<dyn PhysicalExpr>)
                        .collect(),
                )
            }
        };
        let first = exchange(self, inputs[0]);
        let id = self.add(parallelism, schema, NodeKind::Union, Some((inputs[0], first)));
        let mut mode = self.nodes[inputs[0]].changelog.clone();
        for &i in &inputs[1..] {
            let e = exchange(self, i);
            self.edges.push(StreamEdge {
                from: i,
                to: id,
                exchange: e,
                input: 0,
            });
            let m = &self.nodes[i].changelog;
            mode.updates |= m.updates;
            mode.deletes |= m.deletes;
        }
        mode.upsert_key = None;
        self.nodes[id].changelog = mode;
        Ok(id)
    }

    /// Top-N / deduplication: `ROW_NUMBER() OVER (PARTITION BY p ORDER BY
    /// o) AS rn` below a filter `rn <= N` (or `< N`, `= 1`). The window
    /// becomes a rank node; what lies between it and the filter is
    /// converted over it; the filter's other conjuncts stay a filter.
    /// Aggregates OVER a frame ordered by the event time (Flink's
    /// over aggregate): every row with its aggregates, emitted when the
    /// watermark passes it.
    fn over_aggregate(&mut self, w: &datafusion::logical_expr::Window) -> Result<NodeId> {
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
        let unaliased: Vec<Expr> = w.window_expr.iter().map(|e| e.clone().unalias()).collect();
        for e in &unaliased {
            let Expr::WindowFunction(wf) = e else {
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

    fn top_n(&mut self, f: &datafusion::logical_expr::Filter) -> Result<NodeId> {
        let top = top_n_of(f).ok_or_else(|| SqlError::plan("not a Top-N"))?;
        let with_rank = self.rank_used.take().unwrap_or(true);
        let w = top.window;
        let Expr::WindowFunction(wf) = &w.window_expr[top.index] else {
            return Err(SqlError::plan("a Top-N without its window function"));
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
    fn sort(&mut self, sort: &datafusion::logical_expr::Sort) -> Result<NodeId> {
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

    /// A group aggregate of `input` by `keys`: hash-exchanged by its keys,
    /// or on one subtask without keys.
    fn group_node(
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
    fn window_on_proctime(&self, plan: &LogicalPlan, idx: usize) -> bool {
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
    fn window_aggregate(&mut self, agg: &datafusion::logical_expr::Aggregate, attached: bool) -> Result<NodeId> {
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

    /// Flink 2.3's rules for an updating query into a sink with a PRIMARY
    /// KEY that is not its upsert key (several live rows of the query may
    /// share a sink key). A sink that takes `-U` (a changelog file format)
    /// gets the changes as they are. An upsert sink (print, blackhole)
    /// needs `ON CONFLICT`: `DO DEDUPLICATE` puts Flink's upsert
    /// materializer in front of it; without a clause the INSERT is refused
    /// with Flink's message. Returns the node the sink reads.
    fn resolve_conflicts(
        &mut self,
        last: NodeId,
        sink: &TableDef,
        factory: &dyn weir_engine::connectors::SinkFactory,
        on_conflict: Option<OnConflict>,
    ) -> Result<NodeId> {
        let mode = self.nodes[last].changelog.clone();
        if let Some(strategy) = on_conflict {
            let why = if factory.requires_update_before() {
                Some("it requires UPDATE_BEFORE (retract mode)")
            } else if mode.is_insert_only() || !factory.accepts_changes() {
                Some("it only accepts INSERT (append-only) changes")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(SqlError::plan(format!(
                    "ON CONFLICT clause is only allowed for upsert sinks. The sink '{}' is not an upsert sink \
                     because {why}.",
                    sink.name
                )));
            }
            if strategy != OnConflict::Deduplicate {
                let missing: Vec<String> = self
                    .nodes
                    .iter()
                    .filter_map(|n| match &n.kind {
                        NodeKind::Source(s) if s.watermark.is_none() => Some(s.table.name.clone()),
                        _ => None,
                    })
                    .collect();
                if !missing.is_empty() {
                    return Err(SqlError::plan(format!(
                        "ON CONFLICT DO {strategy} requires all source tables to define watermarks, but the \
                         following source(s) do not: {}. Please add a WATERMARK declaration to these tables.",
                        missing.join(", ")
                    )));
                }
                return Err(SqlError::unsupported(format!(
                    "INSERT INTO {}: ON CONFLICT DO {strategy} (Flink's watermark-compacting materializer) is not \
                     supported yet; ON CONFLICT DO DEDUPLICATE is",
                    sink.name
                )));
            }
        }
        let Some(pk) = &sink.primary_key else {
            return Ok(last);
        };
        if mode.is_insert_only() || factory.requires_update_before() || !factory.accepts_changes() {
            return Ok(last);
        }
        let names: Vec<String> = self.nodes[last]
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let pk_positions = sink_key_positions(sink)?.unwrap_or_default();
        // An upsert key inside the sink's key identifies the sink's rows.
        if let Some(upsert) = &mode.upsert_key
            && upsert.iter().all(|c| pk_positions.contains(c))
        {
            return Ok(last);
        }
        if on_conflict != Some(OnConflict::Deduplicate) {
            let upsert_names = mode
                .upsert_key
                .as_ref()
                .map(|k| k.iter().map(|i| names[*i].clone()).collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            return Err(SqlError::plan(format!(
                "The query has an upsert key that differs from the primary key of the sink table '{}'. Primary \
                 key: [{}], upsert key: [{upsert_names}]. This can lead to non-deterministic results when multiple \
                 records with different upsert keys map to the same primary key. Please specify an ON CONFLICT \
                 clause to define how conflicts should be handled: ON CONFLICT DO DEDUPLICATE (update to the latest \
                 record, state intensive, since we need to keep the entire history), or ON CONFLICT DO ERROR (fail \
                 on conflict), or ON CONFLICT DO NOTHING (keep first record).",
                sink.name,
                pk.join(", ")
            )));
        }
        let schema = self.nodes[last].schema.clone();
        let key: Vec<Arc<dyn PhysicalExpr>> = pk_positions
            .iter()
            .map(|i| Arc::new(Column::new(schema.field(*i).name(), *i)) as Arc<dyn PhysicalExpr>)
            .collect();
        Ok(self.add(
            self.config.parallelism,
            schema,
            NodeKind::UpsertMaterialize(UpsertMaterializeNode {
                key: key.clone(),
                upsert_key: mode.upsert_key.clone(),
            }),
            Some((last, Exchange::Hash(key))),
        ))
    }

    fn add_sink(&mut self, last: NodeId, sink: &TableDef, on_conflict: Option<OnConflict>) -> Result<NodeId> {
        let factory = weir_engine::connectors::create_sink(sink, &self.config.paths)?;
        let last = self.resolve_conflicts(last, sink, factory.as_ref(), on_conflict)?;
        let last = self.drop_unneeded_normalize(last, sink, factory.as_ref())?;
        let mode = &self.nodes[last].changelog;
        if !mode.is_insert_only() && !factory.accepts_changes() {
            let origin = self.updating_origin(last);
            return Err(SqlError::unsupported(format!(
                "Table sink '{}' doesn't support consuming {} changes which is produced by node {}{}",
                sink.name,
                mode.changes_text(),
                self.nodes[origin].describe(),
                factory.changes_hint()
            )));
        }
        let target = sink.writable_schema();
        let have = self.nodes[last].schema.clone();
        if have.fields().len() != target.fields().len() {
            let cols: Vec<&str> = target.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(SqlError::plan(format!(
                "INSERT INTO {}: the query produces {} columns but the sink has {} ({})",
                sink.name,
                have.fields().len(),
                target.fields().len(),
                cols.join(", ")
            )));
        }
        let mut input = last;
        if have
            .fields()
            .iter()
            .zip(target.fields())
            .any(|(a, b)| a.data_type() != b.data_type())
        {
            let mismatch = |i: usize, a: &arrow::datatypes::Field, b: &arrow::datatypes::Field| {
                SqlError::plan(format!(
                    "INSERT INTO {}: column {} ('{}') is {} but the sink column '{}' is {}",
                    sink.name,
                    i + 1,
                    a.name(),
                    crate::types::flink_name(a.data_type()),
                    b.name(),
                    crate::types::flink_name(b.data_type())
                ))
            };
            let mut exprs = vec![];
            for (i, (a, b)) in have.fields().iter().zip(target.fields()).enumerate() {
                let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new(a.name(), i));
                if a.data_type() == b.data_type() {
                    exprs.push(col);
                } else if crate::udf::casts_a_row(a.data_type(), b.data_type()) {
                    if !crate::udf::positionally_castable(a.data_type(), b.data_type()) {
                        return Err(mismatch(i, a, b));
                    }
                    // Rows are written by position, as Flink does.
                    let udf = Arc::new(crate::udf::PositionalCast::udf());
                    let target = datafusion::common::ScalarValue::try_from(b.data_type())?;
                    let call = Expr::ScalarFunction(datafusion::logical_expr::expr::ScalarFunction::new_udf(
                        udf,
                        vec![
                            Expr::Column(datafusion::common::Column::from_name(a.name())),
                            Expr::Literal(target, None),
                        ],
                    ));
                    let df_schema = datafusion::common::DFSchema::try_from(have.as_ref().clone())?;
                    exprs.push(self.planner.state.create_physical_expr(call, &df_schema)?);
                } else if arrow::compute::can_cast_types(a.data_type(), b.data_type()) {
                    exprs.push(cast(col, &have, b.data_type().clone())?);
                } else {
                    return Err(mismatch(i, a, b));
                }
            }
            input = self.calc(input, target.clone(), None, Some(exprs));
        }
        let (p, exchange) = self.sink_exchange(input, sink, &target)?;
        Ok(self.add(
            p,
            target,
            NodeKind::Sink(SinkNode {
                name: sink.name.clone(),
                factory,
            }),
            Some((input, exchange)),
        ))
    }

    /// Removes the changelog normalizer of an upsert source whose changes
    /// reach a sink that writes them by the same key (Flink 2.x's
    /// `ChangelogNormalizeRequirementResolver`, FLINK-37475): the sink
    /// needs no `-U` and no deleted row's other columns, so the
    /// normalizer's state and work buy nothing. It stays when anything
    /// between them filters (an update could have to become a delete) or
    /// is not a projection, when the sink's PRIMARY KEY is not the
    /// source's (as columns passed through unchanged), when a metadata
    /// column is read (a tombstone has no value to read it from), and when
    /// the source also feeds another part of the query. Returns the node
    /// that now feeds the sink (`last`, renumbered).
    fn drop_unneeded_normalize(
        &mut self,
        last: NodeId,
        sink: &TableDef,
        factory: &dyn weir_engine::connectors::SinkFactory,
    ) -> Result<NodeId> {
        if !factory.writes_upserts() {
            return Ok(last);
        }
        let consumers = |b: &Self, id: NodeId| b.edges.iter().filter(|e| e.from == id).count();
        let input_of = |b: &Self, id: NodeId| b.edges.iter().find(|e| e.to == id).map(|e| e.from);
        // The sink's key columns, followed down the projections.
        let mut key = sink_key_positions(sink)?;
        let mut path = vec![];
        let mut at = last;
        let normalize = loop {
            match &self.nodes[at].kind {
                NodeKind::ChangelogNormalize(_) => break at,
                NodeKind::Calc(CalcNode {
                    filter: None,
                    projection,
                }) if path.is_empty() || consumers(self, at) == 1 => {
                    if let (Some(cols), Some(p)) = (&mut key, projection) {
                        for c in cols.iter_mut() {
                            match p.get(*c).and_then(|e| e.downcast_ref::<Column>()) {
                                Some(col) => *c = col.index(),
                                None => return Ok(last),
                            }
                        }
                    }
                    path.push(at);
                    match input_of(self, at) {
                        Some(i) => at = i,
                        None => return Ok(last),
                    }
                }
                _ => return Ok(last),
            }
        };
        let NodeKind::ChangelogNormalize(n) = &self.nodes[normalize].kind else {
            return Ok(last);
        };
        let normalize_key: Vec<usize> = n
            .key
            .iter()
            .filter_map(|k| k.downcast_ref::<Column>().map(|c| c.index()))
            .collect();
        if let Some(cols) = &key {
            let (mut a, mut b) = (cols.clone(), normalize_key.clone());
            a.sort_unstable();
            a.dedup();
            b.sort_unstable();
            if a != b {
                return Ok(last);
            }
        }
        let Some(source) = input_of(self, normalize) else {
            return Ok(last);
        };
        let reads_metadata = matches!(&self.nodes[source].kind,
            NodeKind::Source(s) if s.table.columns.iter().any(|c| c.metadata.is_some()));
        // The normalizer feeds the path only (`last` feeds nothing yet).
        let feeds = usize::from(!path.is_empty());
        if reads_metadata || consumers(self, normalize) != feeds || consumers(self, source) != 1 {
            return Ok(last);
        }
        // Source → (by the key, so each key's changes stay in order) → the
        // first projection; the normalizer's node and edges go.
        let exchange = self
            .edges
            .iter()
            .find(|e| e.to == normalize)
            .map(|e| e.exchange.clone())
            .unwrap_or(Exchange::Forward);
        self.edges.retain(|e| e.from != normalize && e.to != normalize);
        if let Some(&first) = path.last() {
            self.edges.push(StreamEdge {
                from: source,
                to: first,
                exchange,
                input: 0,
            });
        }
        self.nodes.remove(normalize);
        let renumber = |id: NodeId| if id > normalize { id - 1 } else { id };
        for (i, node) in self.nodes.iter_mut().enumerate() {
            node.id = i;
        }
        for e in &mut self.edges {
            e.from = renumber(e.from);
            e.to = renumber(e.to);
        }
        for id in self.sources.values_mut() {
            *id = renumber(if *id == normalize { source } else { *id });
        }
        // The projections now pass the source's upserts on.
        for &id in path.iter().rev() {
            let id = renumber(id);
            let input = input_of(self, id);
            self.nodes[id].changelog = self.mode_of(&self.nodes[id].kind, input);
        }
        Ok(renumber(if last == normalize { source } else { last }))
    }

    /// The sink's parallelism (`sink.parallelism`, else its input's) and
    /// how rows reach it, as Flink's `CommonExecSink`: forwarded at the
    /// input's parallelism; at another one, round-robin from an
    /// insert-only input, by the sink's primary key from an updating one
    /// (so a key's changes stay in order), which must then have one.
    fn sink_exchange(&self, input: NodeId, sink: &TableDef, target: &SchemaRef) -> Result<(usize, Exchange)> {
        let have = self.nodes[input].parallelism;
        let Some(text) = sink.options.get(weir_engine::connectors::SINK_PARALLELISM) else {
            return Ok((have, Exchange::Forward));
        };
        let p: usize = text.trim().parse().map_err(|_| {
            SqlError::plan(format!(
                "option '{}' of table '{}': '{text}' is not a whole number",
                weir_engine::connectors::SINK_PARALLELISM,
                sink.name
            ))
        })?;
        if p == have {
            return Ok((p, Exchange::Forward));
        }
        // Key groups are spread over the subtasks: no more subtasks than
        // key groups (as 'parallelism.default').
        let max = usize::from(self.config.max_parallelism);
        if p > max {
            return Err(SqlError::plan(format!(
                "option '{}' of table '{}': {p} exceeds 'pipeline.max-parallelism' = {max}",
                weir_engine::connectors::SINK_PARALLELISM,
                sink.name
            )));
        }
        let mode = &self.nodes[input].changelog;
        if mode.is_insert_only() {
            return Ok((p, Exchange::Rebalance));
        }
        let Some(pk) = sink.primary_key.as_ref().filter(|k| !k.is_empty()) else {
            return Err(SqlError::plan(format!(
                "The sink for table '{}' has a configured parallelism of {p}, while the input parallelism is {have}. \
                 Since the configured parallelism is different from the input's parallelism and the changelog mode \
                 contains {}, which is not INSERT_ONLY mode, primary key is required but no primary key is found",
                sink.name,
                mode.kinds()
            )));
        };
        let key = pk
            .iter()
            .map(|name| {
                let i = target.index_of(name).map_err(|_| {
                    SqlError::internal(format!(
                        "primary key column '{name}' is not a column of sink '{}'",
                        sink.name
                    ))
                })?;
                Ok(Arc::new(Column::new(name, i)) as Arc<dyn PhysicalExpr>)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((p, Exchange::Hash(key)))
    }
}

/// Identifiers an expression text refers to (columns, approximately: any
/// identifier; extra names are harmless).
fn identifiers(text: &str) -> Vec<String> {
    let Ok(expr) = crate::parser::parse_expr_text(text) else {
        return vec![];
    };
    let mut out = vec![];
    let _ = ast::visit_expressions(&expr, |e| {
        match e {
            ast::Expr::Identifier(i) => out.push(i.value.clone()),
            ast::Expr::CompoundIdentifier(parts) => out.extend(parts.last().map(|i| i.value.clone())),
            _ => {}
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    out
}
