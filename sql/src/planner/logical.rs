//! What DataFusion's logical planner sees: the catalog's tables as
//! schemas, Flink's parser options, and the filter pushdown that keeps
//! filters outside SESSION windows.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::TableReference;
use datafusion::config::ConfigOptions;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::planner::ContextProvider;
use datafusion::logical_expr::{AggregateUDF, Expr, HigherOrderUDF, LogicalPlan, ScalarUDF, TableSource, WindowUDF};
use datafusion::sql::planner::ParserOptions;
use weir_catalog::Catalog;

use crate::planner::patterns::window::*;

/// A table as the logical planner sees it: its schema, and no filters
/// taken into the scan (a filter pushed down stays a Calc after the
/// source, so every connector sees the same rows).
#[derive(Debug)]
pub(crate) struct StreamTableSource(SchemaRef);

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

pub(crate) struct Provider<'a> {
    pub(crate) state: &'a SessionState,
    pub(crate) expr_planners: &'a [Arc<dyn datafusion::logical_expr::planner::ExprPlanner>],
    pub(crate) catalog: &'a Catalog,
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

pub(crate) fn parser_options() -> ParserOptions {
    ParserOptions {
        enable_ident_normalization: false,
        collect_spans: true,
        // `1.5` is a DECIMAL(2, 1) in Flink (an exponent makes a DOUBLE:
        // `parser::rewrite_numbers`).
        parse_float_as_decimal: true,
        ..ParserOptions::default()
    }
}

/// DataFusion's filter push-down, except through the projection that adds a
/// SESSION TVF's window columns: as Flink, a WHERE over the TVF on its own
/// filters its rows after their sessions are formed. (Under a window
/// aggregate the filter runs before the aggregate, which forms the
/// sessions, as Flink pushes it there.)
#[derive(Debug)]
pub(crate) struct PushDownFilterOutsideSessions(pub(crate) datafusion::optimizer::push_down_filter::PushDownFilter);

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
