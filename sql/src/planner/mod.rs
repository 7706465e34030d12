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

use std::sync::Arc;

use datafusion::common::DFSchema;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::registry::FunctionRegistry;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::optimize_projections::OptimizeProjections;
use datafusion::optimizer::simplify_expressions::SimplifyExpressions;
use datafusion::optimizer::{Optimizer, OptimizerContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use datafusion::sql::planner::{PlannerContext, SqlToRel};
use sqlparser::ast;
use weir_catalog::{Catalog, TableDef};
use weir_engine::config::JobConfig;
use weir_engine::plan::StreamGraph;

use crate::error::{Result, SqlError};
use crate::parser::OnConflict;
use crate::rewrite::rewrite_query;
use crate::udf::WindowMarker;
use weir_engine::time_zone::SessionZone;

use crate::planner::build::GraphBuilder;
use crate::planner::logical::*;
use crate::planner::patterns::window::*;

mod batch;
mod build;
mod changelog;
mod logical;
pub(crate) mod patterns;

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
        let _ = state.register_udf(Arc::new(crate::udf::Named::udf()));
        let _ = state.register_udaf(Arc::new(crate::functions::overrides::FlinkAvg::udaf()));
        let _ = state.register_udaf(Arc::new(crate::functions::overrides::FlinkSum::udaf()));
        let _ = state.register_udaf(Arc::new(crate::functions::collect::Collect::udaf()));
        for udaf in crate::functions::moments::all() {
            let _ = state.register_udaf(Arc::new(udaf));
        }
        let _ = state.register_udf(Arc::new(crate::functions::overrides::FlinkMod::udf()));
        let _ = state.register_udf(Arc::new(crate::functions::overrides::Proctime::udf()));
        let _ = state.register_udf(Arc::new(crate::functions::overrides::DateFormat::udf()));
        let _ = state.register_udf(Arc::new(crate::functions::overrides::CurrentWatermark::udf()));
        let _ = state.register_udf(Arc::new(crate::functions::overrides::TypeOf::udf()));
        let _ = state.register_udf(Arc::new(crate::functions::printf::Printf::udf()));
        for udf in crate::functions::clock::clocks()
            .into_iter()
            .chain(crate::functions::clock::Rand::udfs())
            .chain(crate::functions::bytes::all())
        {
            let _ = state.register_udf(Arc::new(udf));
        }
        for udf in [
            crate::functions::overrides::FlinkLog::udf(),
            crate::functions::overrides::FlinkSqrt::udf(),
            crate::functions::overrides::NullStrict::greatest(),
            crate::functions::overrides::NullStrict::least(),
        ]
        .into_iter()
        .chain(crate::functions::scalars::all())
        .chain(crate::functions::time::all())
        .chain(crate::functions::math::all())
        .chain(crate::functions::collections::all())
        .chain(crate::functions::maps::all())
        .chain(crate::functions::arrays::all())
        {
            let _ = state.register_udf(Arc::new(udf));
        }
        let mut expr_planners: Vec<Arc<dyn datafusion::logical_expr::planner::ExprPlanner>> = vec![
            Arc::new(crate::functions::decimal::WideProducts),
            Arc::new(crate::functions::scalars::FlinkOverlay),
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
        let logical = crate::passes::literals::flink_literals_in(logical)?.data;
        let logical = crate::functions::decimal::approximate_wins_in(logical, schema)?.data;
        let logical = crate::passes::local_zone::local_zone_in(logical, schema, zone)?.data;
        let logical = crate::passes::casts::flink_casts_in(logical, schema)?.data;
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
        let plan = match sql_to_rel.sql_statement_to_plan(ast::Statement::Query(Box::new(query.clone()))) {
            // `AVG(x), AVG(CAST(x AS DOUBLE))`: two aggregates DataFusion
            // names alike; planned again with the casts named as written.
            // If that fails too, the first error is the user's.
            Err(e) if repeats_a_name(&e) => {
                crate::rewrite::name_casts_in_calls(&mut query);
                sql_to_rel
                    .sql_statement_to_plan(ast::Statement::Query(Box::new(query)))
                    .map_err(|_| e)?
            }
            plan => plan?,
        };
        // `1` is an INT, as in Flink (before coercion widens it).
        let plan = crate::passes::literals::flink_literals(plan)?.data;
        // DOUBLE beside DECIMAL is DOUBLE, as in Flink.
        let plan = crate::functions::decimal::approximate_wins(plan)?.data;
        let plan = self
            .state
            .analyzer()
            .execute_and_check(plan, self.state.config_options(), |_, _| {})?;
        // TIMESTAMP_LTZ meets wall-clock times in the session zone (after
        // coercion, which inserts casts of its own).
        let plan = crate::passes::local_zone::local_zone(plan, zone)?.data;
        // Casts to strings write Flink's text (`TRUE`, `8.5E37`, ...).
        let plan = crate::passes::casts::flink_casts(plan)?.data;
        // `PARTITION BY auction % 4`: a column below the window, so a
        // Top-N's rank has the upsert key Flink gives it (before the
        // optimizer merges the projection above the window into others).
        let plan = crate::passes::window_partitions::window_partitions(plan)?.data;
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
        if self.runs_as_batch(&plan, catalog, config)? {
            return Ok(QueryPlan::Stream(self.batch_graph(&plan, catalog, config, None)?));
        }
        let mut b = GraphBuilder::new(self, catalog, config, &plan)?;
        b.state_ttl_hints = crate::hints::state_ttl_hints(query)?;
        b.convert(&plan)?;
        Ok(QueryPlan::Stream(b.finish()))
    }

    /// Plans `INSERT INTO sink [(columns)] <query>`.
    pub fn plan_insert(
        &self,
        sink: &TableDef,
        columns: &[(String, crate::error::Location)],
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
        let plan = if columns.is_empty() {
            plan
        } else {
            into_columns(plan, sink, columns)?
        };
        let catalog = hinted.as_ref().unwrap_or(catalog);
        if self.runs_as_batch(&plan, catalog, config)? {
            return self.batch_graph(&plan, catalog, config, Some((sink, on_conflict)));
        }
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

/// `INSERT INTO t (c, ...) <query>`: the query's columns in order into the
/// named columns, every other writable column NULL, as Flink's (Calcite's)
/// rules and messages: as many names as the query has columns, each a
/// column of the sink once, and an unnamed column must take NULL.
fn into_columns(
    plan: LogicalPlan,
    sink: &TableDef,
    columns: &[(String, crate::error::Location)],
) -> Result<LogicalPlan> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::LogicalPlanBuilder;
    let target = sink.writable_schema();
    let source = plan.schema().columns();
    if columns.len() != source.len() {
        let err = SqlError::plan(format!(
            "Number of columns must match number of query columns: {} named, the query has {}",
            columns.len(),
            source.len()
        ));
        return Err(match columns.first() {
            Some((_, at)) => err.at(*at),
            None => err,
        });
    }
    let mut position: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (j, (c, at)) in columns.iter().enumerate() {
        if target.field_with_name(c).is_err() {
            return Err(SqlError::plan(format!("Unknown target column '{c}'")).at(*at));
        }
        if position.insert(c.as_str(), j).is_some() {
            return Err(SqlError::plan(format!("Target column '{c}' is assigned more than once")).at(*at));
        }
    }
    let mut exprs = Vec::with_capacity(target.fields().len());
    for f in target.fields() {
        exprs.push(match position.get(f.name().as_str()) {
            Some(&j) => Expr::Column(source[j].clone()).alias(f.name()),
            // A primary key's columns are NOT NULL (Flink makes them so).
            None if !f.is_nullable() || sink.primary_key.as_ref().is_some_and(|k| k.contains(f.name())) => {
                return Err(SqlError::plan(format!(
                    "Column '{}' has no default value and does not allow NULLs",
                    f.name()
                )));
            }
            None => datafusion::logical_expr::lit(ScalarValue::try_from(f.data_type())?).alias(f.name()),
        });
    }
    Ok(LogicalPlanBuilder::from(plan).project(exprs)?.build()?)
}

/// Whether planning failed because two of a node's outputs have one name
/// (an aggregate's schema, or the check of OVER windows before it).
fn repeats_a_name(e: &datafusion::error::DataFusionError) -> bool {
    use datafusion::error::DataFusionError;
    match e.find_root() {
        DataFusionError::SchemaError(s, _) => {
            matches!(**s, datafusion::common::SchemaError::DuplicateUnqualifiedField { .. })
        }
        DataFusionError::Plan(m) => m.starts_with("Windows require unique expression names"),
        _ => false,
    }
}

pub(crate) fn lowercase_functions(expr: &mut ast::Expr) {
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
pub(crate) fn sink_key_positions(sink: &TableDef) -> Result<Option<Vec<usize>>> {
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

pub(crate) fn reads_a_table(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::TableScan(_)) || plan.inputs().iter().any(|p| reads_a_table(p))
}

/// Identifiers an expression text refers to (columns, approximately: any
/// identifier; extra names are harmless).
pub(crate) fn identifiers(text: &str) -> Vec<String> {
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
