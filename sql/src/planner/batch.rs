//! Batch mode: the query's logical plan runs as one DataFusion physical
//! plan (hash aggregates and joins, sorts, window functions, spilling at
//! `execution.batch.memory-limit`), its tables read through Weir's own
//! connectors ([`weir_engine::batch::SplitStream`]), and its result is the
//! one source of a small job feeding the sink
//! ([`weir_engine::batch::PlanSource`]): insert-only, each aggregate's
//! final row once, as Flink's batch mode writes it.
//!
//! What DataFusion cannot run with Flink's meaning is refused by name:
//! HOP, CUMULATE and SESSION windows (a row is in several windows, or
//! windows merge), temporal joins (a version per probe time), and time
//! read from the clock or the watermark.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan, TableScanBuilder};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use weir_catalog::{Catalog, ColumnDef, TableDef};
use weir_engine::config::{JobConfig, RUNTIME_MODE, RuntimeMode};
use weir_engine::plan::{NodeKind, SourceNode, StreamGraph};

use crate::error::{Result, SqlError};
use crate::planner::build::GraphBuilder;
use crate::planner::patterns::window::marker_of;
use crate::planner::{OnConflict, Planner};

impl Planner {
    /// Whether `plan` runs in batch mode under `config`: asked for, or
    /// `automatic` and every table it reads is bounded.
    pub(crate) fn runs_as_batch(&self, plan: &LogicalPlan, catalog: &Catalog, config: &JobConfig) -> Result<bool> {
        match config.runtime_mode {
            RuntimeMode::Streaming => Ok(false),
            RuntimeMode::Batch => Ok(true),
            RuntimeMode::Automatic => {
                let mut bounded = true;
                for def in scanned_tables(plan, catalog)? {
                    let factory = weir_engine::connectors::create_source(&def, &config.paths, &config.s3)?;
                    bounded &= factory.is_bounded();
                }
                Ok(bounded)
            }
        }
    }

    /// The job of a batch query: its plan's result as a source, into
    /// `sink` (or to the caller, for a SELECT).
    pub(crate) fn batch_graph(
        &self,
        plan: &LogicalPlan,
        catalog: &Catalog,
        config: &JobConfig,
        sink: Option<(&TableDef, Option<OnConflict>)>,
    ) -> Result<StreamGraph> {
        refuse_streaming_only(plan)?;
        let plan = self.with_weir_scans(plan, catalog, config)?;
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(config.batch_memory_limit as usize)))
            .with_disk_manager_builder(DiskManagerBuilder::default().with_mode(if config.batch_spill {
                DiskManagerMode::Directories(vec![spill_dir(config)?])
            } else {
                DiskManagerMode::Disabled
            }))
            .build_arc()?;
        let mut session = self.state.config().clone();
        session.options_mut().execution.target_partitions = config.parallelism.max(1);
        let state = SessionStateBuilder::new_from_existing(self.state.clone())
            .with_config(session)
            .with_runtime_env(runtime)
            .build();
        // Planning is async for table providers that list files; these
        // scans list nothing, so it completes without waiting on IO.
        let physical =
            futures::executor::block_on(DefaultPhysicalPlanner::default().create_physical_plan(&plan, &state))?;
        let source = weir_engine::batch::PlanSource::new(physical, state.task_ctx());
        let schema = source.schema();
        let partitions = source.partitions();
        let mut b = GraphBuilder::new(self, catalog, config, &plan)?;
        let table = result_table(&schema);
        let last = b.add(
            partitions.max(1),
            schema,
            NodeKind::Source(SourceNode {
                table,
                factory: Arc::new(source),
                computed: None,
                watermark: None,
            }),
            None,
        );
        if let Some((sink, on_conflict)) = sink {
            b.add_sink(last, sink, on_conflict)?;
        }
        Ok(b.finish())
    }

    /// `plan` with each table scan reading the table's source splits.
    fn with_weir_scans(&self, plan: &LogicalPlan, catalog: &Catalog, config: &JobConfig) -> Result<LogicalPlan> {
        let mut failed: Option<SqlError> = None;
        let out = plan.clone().transform_up_with_subqueries(|p| {
            let LogicalPlan::TableScan(scan) = &p else {
                return Ok(Transformed::no(p));
            };
            match self.weir_scan(scan, catalog, config) {
                Ok(s) => Ok(Transformed::yes(LogicalPlan::TableScan(s))),
                Err(e) => {
                    failed = Some(e);
                    Ok(Transformed::new(p, false, TreeNodeRecursion::Stop))
                }
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(out.data),
        }
    }

    /// One scan of a bounded table: its columns the scan reads (and what
    /// its computed ones need), one DataFusion partition per split.
    fn weir_scan(&self, scan: &TableScan, catalog: &Catalog, config: &JobConfig) -> Result<TableScan> {
        let name = scan.table_name.table();
        let def = catalog
            .table(name)
            .ok_or_else(|| SqlError::not_found(format!("table '{name}' does not exist")))?;
        let projected: Vec<String> = match &scan.projection {
            Some(p) => p.iter().map(|i| def.columns[*i].name.clone()).collect(),
            None => def.columns.iter().map(|c| c.name.clone()).collect(),
        };
        let mut needed: BTreeSet<String> = projected.iter().cloned().collect();
        if !weir_engine::connectors::supports_column_pruning(def) {
            needed.extend(def.physical_columns().map(|c| c.name.clone()));
        }
        needed.extend(weir_engine::connectors::required_columns(def));
        for c in &def.columns {
            if let Some(expr) = &c.computed
                && needed.contains(&c.name)
            {
                needed.extend(crate::planner::identifiers(expr));
            }
        }
        let mut narrowed = def.clone();
        narrowed.columns.retain(|c| needed.contains(&c.name));
        let factory = weir_engine::connectors::create_source(&narrowed, &config.paths, &config.s3)?;
        if !factory.is_bounded() {
            return Err(SqlError::plan(format!(
                "table '{name}' is unbounded, and '{RUNTIME_MODE}' = 'batch' reads bounded tables only: {} on \
                 '{name}', or run the query in streaming mode",
                factory.bounding_hint()
            )));
        }
        if factory.produces_changes() {
            return Err(SqlError::unsupported(format!(
                "table '{name}' reads changes (updates and deletes), which batch mode does not take yet; run the \
                 query in streaming mode"
            )));
        }
        if factory.dead_letter_dir().is_some() {
            return Err(SqlError::unsupported(format!(
                "table '{name}' sets bad records aside ('scan.dead-letter.path'), which batch mode does not do yet; \
                 run the query in streaming mode"
            )));
        }
        let schema = narrowed.schema();
        let physical_schema = narrowed.physical_schema();
        let computed = if narrowed.columns.iter().any(|c| c.computed.is_some()) {
            let physical_df = DFSchema::try_from(physical_schema.as_ref().clone())?;
            let mut exprs: Vec<Arc<dyn PhysicalExpr>> = vec![];
            for c in &narrowed.columns {
                exprs.push(match &c.computed {
                    Some(text) => self.plan_expr_text(text, &physical_df, config.local_time_zone.as_ref())?,
                    None => Arc::new(Column::new(&c.name, physical_schema.index_of(&c.name)?)),
                });
            }
            Some(exprs)
        } else {
            None
        };
        let partitions = weir_engine::batch::SplitStream::all(
            name,
            factory.as_ref(),
            config.parallelism.max(1),
            schema.clone(),
            computed,
        )?;
        let table = StreamingTable::try_new(schema.clone(), partitions)?;
        let projection = projected
            .iter()
            .map(|c| schema.index_of(c))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(
            TableScanBuilder::new(scan.table_name.clone(), provider_as_source(Arc::new(table)))
                .with_projection(Some(projection))
                .with_filters(scan.filters.clone())
                .with_fetch(scan.fetch)
                .build()?,
        )
    }
}

/// Every table `plan` scans, as the catalog has it.
fn scanned_tables(plan: &LogicalPlan, catalog: &Catalog) -> Result<Vec<TableDef>> {
    let mut out = vec![];
    plan.apply_with_subqueries(|p| {
        if let LogicalPlan::TableScan(scan) = p
            && let Some(def) = catalog.table(scan.table_name.table())
        {
            out.push(def.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(out)
}

/// Refuses what a DataFusion plan would run with another meaning than
/// Flink's.
fn refuse_streaming_only(plan: &LogicalPlan) -> Result<()> {
    let mut refusal: Option<String> = None;
    plan.apply_with_subqueries(|p| {
        p.apply_expressions(|e| {
            e.apply(|x| {
                if let Some(m) = marker_of(x)
                    && m.spec.kind != weir_engine::plan::WindowKind::Tumble
                {
                    refusal = Some(format!(
                        "{} windows do not run in batch mode yet",
                        format!("{:?}", m.spec.kind).to_uppercase()
                    ));
                }
                if let Expr::ScalarFunction(ScalarFunction { func, .. }) = x {
                    let name = func.name();
                    if name == crate::udf::TEMPORAL_JOIN_FN {
                        refusal = Some("temporal joins (FOR SYSTEM_TIME AS OF) do not run in batch mode yet".into());
                    } else if name == weir_engine::expr::CURRENT_WATERMARK {
                        refusal = Some("CURRENT_WATERMARK has no watermark to read in batch mode".into());
                    } else if name == "proctime" {
                        refusal = Some("processing time (PROCTIME()) does not run in batch mode".into());
                    }
                }
                Ok(if refusal.is_some() {
                    TreeNodeRecursion::Stop
                } else {
                    TreeNodeRecursion::Continue
                })
            })
        })
    })?;
    match refusal {
        Some(r) => Err(SqlError::unsupported(format!(
            "{r}; run the query with '{RUNTIME_MODE}' = 'streaming'"
        ))),
        None => Ok(()),
    }
}

/// Where a batch job's operators spill: below its job directory.
fn spill_dir(config: &JobConfig) -> Result<std::path::PathBuf> {
    let dir = config.job_dir.join("spill");
    std::fs::create_dir_all(&dir)
        .map_err(|e| SqlError::plan(format!("cannot make the spill directory {}: {e}", dir.display())))?;
    Ok(dir)
}

/// The table the batch plan's result is, as the source node names it.
fn result_table(schema: &arrow::datatypes::Schema) -> TableDef {
    TableDef {
        name: "batch_result".into(),
        columns: schema
            .fields()
            .iter()
            .map(|f| ColumnDef {
                name: f.name().clone(),
                type_name: crate::types::flink_name(f.data_type()),
                data_type: f.data_type().clone(),
                nullable: f.is_nullable(),
                computed: None,
                metadata: None,
            })
            .collect(),
        watermark: None,
        options: [("connector".to_string(), "batch".to_string())].into(),
        primary_key: None,
        partition_keys: vec![],
    }
}
