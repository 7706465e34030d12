//! Batch mode: the query's logical plan runs as one DataFusion physical
//! plan (hash aggregates and joins, sorts, window functions, spilling at
//! `execution.batch.memory-limit`), its tables read through Weir's own
//! connectors ([`weir_engine::batch::SplitStream`]), and its result is the
//! one source of a small job feeding the sink
//! ([`weir_engine::batch::PlanSource`]): insert-only, each aggregate's
//! final row once, as Flink's batch mode writes it.
//!
//! A TUMBLE window is a column of each row; HOP and CUMULATE windows
//! become rows, each row unnested into one per window it is in
//! ([`windows_as_rows`]). What DataFusion cannot run with Flink's meaning
//! is refused by name: SESSION windows (windows merge), temporal joins (a
//! version per probe time), and time read from the clock or the
//! watermark.

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
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use weir_catalog::{Catalog, ColumnDef, TableDef};
use weir_engine::config::{JobConfig, RUNTIME_MODE, RuntimeMode};
use weir_engine::plan::{NodeKind, SourceNode, StreamGraph};

use crate::error::{Result, SqlError};
use crate::planner::build::GraphBuilder;
use crate::planner::patterns::window::marker_of;
use crate::planner::{OnConflict, Planner};
use sqlparser::ast;

impl Planner {
    /// Whether `plan` runs in batch mode under `config`: asked for, or
    /// `automatic` and every table it reads is bounded.
    pub(crate) fn runs_as_batch(&self, plan: &LogicalPlan, catalog: &Catalog, config: &JobConfig) -> Result<bool> {
        match config.runtime_mode {
            RuntimeMode::Streaming => Ok(false),
            RuntimeMode::Batch => Ok(true),
            // Batch when batch mode can run it: every table bounded, and
            // nothing batch mode refuses (which streaming mode runs).
            RuntimeMode::Automatic => {
                if config.cluster.is_some()
                    || refuse_streaming_only(plan).is_err()
                    || windows_as_rows(plan.clone()).is_err()
                {
                    return Ok(false);
                }
                for def in scanned_tables(plan, catalog)? {
                    let factory = weir_engine::connectors::create_source(&def, &config.paths, &config.s3)?;
                    if !factory.is_bounded()
                        || factory.produces_changes()
                        || factory.dead_letter_dir().is_some()
                        || reads_processing_time(&def)
                    {
                        return Ok(false);
                    }
                }
                Ok(true)
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
        if config.cluster.is_some() {
            // Each worker would plan and read everything, then run only
            // its own partitions.
            return Err(SqlError::unsupported(format!(
                "batch mode does not run over worker processes yet; run the job with 'weir run', or with \
                 '{RUNTIME_MODE}' = 'streaming'"
            )));
        }
        refuse_streaming_only(plan)?;
        let plan = windows_as_rows(plan.clone())?;
        no_markers_left(&plan)?;
        let plan = first_and_last_skip_nulls(plan)?;
        let plan = clocks_read_once(plan, &self.state)?;
        let progress = Arc::new(weir_engine::batch::ScanProgress::default());
        let plan = self.with_weir_scans(&plan, catalog, config, &progress)?;
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
        let source = weir_engine::batch::PlanSource::new(physical, state.task_ctx(), progress);
        let schema = source.schema();
        let mut b = GraphBuilder::new(self, catalog, config, &plan)?;
        let table = result_table(&schema);
        // The job's parallelism; a subtask reads several of the plan's
        // output partitions when it has more.
        let last = b.add(
            config.parallelism.max(1),
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
    fn with_weir_scans(
        &self,
        plan: &LogicalPlan,
        catalog: &Catalog,
        config: &JobConfig,
        progress: &Arc<weir_engine::batch::ScanProgress>,
    ) -> Result<LogicalPlan> {
        let mut failed: Option<SqlError> = None;
        let out = plan.clone().transform_up_with_subqueries(|p| {
            let LogicalPlan::TableScan(scan) = &p else {
                return Ok(Transformed::no(p));
            };
            match self.weir_scan(scan, catalog, config, progress) {
                Ok(s) => Ok(Transformed::yes(s)),
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
    /// its computed ones need), one DataFusion partition per split; in a
    /// backfill's chunk, a table with a time attribute only its rows of
    /// the chunk's event time.
    fn weir_scan(
        &self,
        scan: &TableScan,
        catalog: &Catalog,
        config: &JobConfig,
        progress: &Arc<weir_engine::batch::ScanProgress>,
    ) -> Result<LogicalPlan> {
        let name = scan.table_name.table();
        let def = catalog
            .table(name)
            .ok_or_else(|| SqlError::not_found(format!("table '{name}' does not exist")))?;
        let mut projected: Vec<String> = match &scan.projection {
            Some(p) => p.iter().map(|i| def.columns[*i].name.clone()).collect(),
            None => def.columns.iter().map(|c| c.name.clone()).collect(),
        };
        let range = match (config.event_time_range, &def.watermark) {
            (Some(r), Some(w)) => Some((w.column.clone(), r)),
            _ => None,
        };
        // The rowtime the chunk's filter reads, if the query does not.
        let added = match &range {
            Some((c, _)) if !projected.contains(c) => {
                projected.push(c.clone());
                true
            }
            _ => false,
        };
        let needed: BTreeSet<String> = projected.iter().cloned().collect();
        let (narrowed, computed) = crate::planner::build::source::narrowed_table(self, def, needed, config)?;
        if reads_processing_time(&narrowed) {
            return Err(SqlError::unsupported(format!(
                "table '{name}' has a processing-time column (PROCTIME()), which batch mode does not run; run the \
                 query with '{RUNTIME_MODE}' = 'streaming'"
            )));
        }
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
        let partitions = weir_engine::batch::SplitStream::all(
            name,
            factory.clone(),
            config.parallelism.max(1),
            schema.clone(),
            computed,
            progress,
        )?;
        let table = StreamingTable::try_new(schema.clone(), partitions)?;
        let projection = projected
            .iter()
            .map(|c| schema.index_of(c))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let read = TableScanBuilder::new(scan.table_name.clone(), provider_as_source(Arc::new(table)))
            .with_projection(Some(projection))
            .with_filters(scan.filters.clone())
            // A LIMIT pushed into the scan counts the rows the chunk's
            // filter keeps, not those it reads.
            .with_fetch(if range.is_some() { None } else { scan.fetch })
            .build()?;
        let Some((column, (from, to))) = range else {
            return Ok(LogicalPlan::TableScan(read));
        };
        let tz = match schema.field_with_name(&column)?.data_type() {
            arrow::datatypes::DataType::Timestamp(_, tz) => tz.clone(),
            _ => None,
        };
        let at = |ms: i64| {
            Expr::Literal(
                datafusion::common::ScalarValue::TimestampMillisecond(Some(ms), tz.clone()),
                None,
            )
        };
        let rowtime = Expr::Column(datafusion::common::Column::new(Some(scan.table_name.clone()), &column));
        let mut plan = datafusion::logical_expr::LogicalPlanBuilder::from(LogicalPlan::TableScan(read))
            .filter(rowtime.clone().gt_eq(at(from)).and(rowtime.lt(at(to))))?;
        if added {
            // The scan's own columns again, as the plan above reads them.
            plan = plan.project(scan.projected_schema.columns().into_iter().map(Expr::Column))?;
        }
        Ok(plan.build()?)
    }
}

impl Planner {
    /// Whether `query` may run in chunks of event time `[from, to)` of
    /// `chunk_ms` each (`weir backfill`) with the result of one run: only
    /// if each row of its result comes from rows of one chunk. Per-row
    /// queries over tables with a WATERMARK (the column chunks are cut
    /// on) may; so may TUMBLE window aggregates on that column whose
    /// windows never straddle a chunk (the size divides the chunk, and
    /// --from and --to are window bounds). GROUP BY over all time, joins,
    /// OVER windows, Top-N, HOP/CUMULATE/SESSION windows, tables without
    /// a WATERMARK, and windows in a session time zone may not.
    pub fn check_chunks(
        &self,
        query: &ast::Query,
        catalog: &Catalog,
        zone: Option<&weir_engine::time_zone::SessionZone>,
        (from_ms, to_ms, chunk_ms): (i64, i64, i64),
    ) -> Result<()> {
        use weir_engine::plan::WindowKind;
        let plan = self.logical_plan_in(query, catalog, zone)?;
        let mut problem: Option<String> = None;
        // Window bounds in i128: an offset or instant near the ends of i64.
        let off_window = |t: i64, s: &weir_engine::plan::WindowSpec| {
            (i128::from(t) - i128::from(s.offset)).rem_euclid(i128::from(s.size)) != 0
        };
        plan.apply_with_subqueries(|p| {
            let found = match p {
                LogicalPlan::TableScan(scan) => {
                    let name = scan.table_name.table();
                    match catalog.table(name) {
                        Some(def) if def.watermark.is_none() => Some(format!(
                            "table '{name}' has no WATERMARK, so every chunk would read all of it"
                        )),
                        _ => None,
                    }
                }
                LogicalPlan::Aggregate(a) => match window_of(a) {
                    Some((m, time)) if m.spec.kind == WindowKind::Tumble => {
                        if m.zoned {
                            Some("its windows are cut in the session time zone, not in UTC as chunks are".into())
                        } else if let Some(msg) = time_is_not_the_rowtime(time, catalog) {
                            Some(msg)
                        } else {
                            (chunk_ms % m.spec.size != 0 || off_window(from_ms, &m.spec) || off_window(to_ms, &m.spec))
                                .then(|| {
                                    format!(
                                        "its TUMBLE windows of {} ms would straddle chunks: --chunk must be a \
                                         multiple of the window, and --from and --to window bounds",
                                        m.spec.size
                                    )
                                })
                        }
                    }
                    Some((m, _)) => Some(format!(
                        "its {} windows span chunks",
                        match m.spec.kind {
                            WindowKind::Hop => "HOP",
                            WindowKind::Cumulate => "CUMULATE",
                            _ => "SESSION",
                        }
                    )),
                    // Windows of a window aggregate below (checked there).
                    None if crate::planner::patterns::window::attached_window(a).is_some() => None,
                    None => Some("its GROUP BY is over all time, not per window".into()),
                },
                LogicalPlan::Join(_) => Some("its join would not meet rows of different chunks".into()),
                LogicalPlan::Window(_) => {
                    Some("its OVER window, Top-N or deduplication reads rows of every chunk".into())
                }
                LogicalPlan::Distinct(_) => Some("its DISTINCT is over all time".into()),
                LogicalPlan::Sort(_) | LogicalPlan::Limit(_) => Some("its ORDER BY or LIMIT is over all time".into()),
                _ => None,
            };
            if found.is_some() {
                problem = found;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        match problem {
            Some(p) => Err(SqlError::unsupported(format!(
                "this query does not run in chunks of event time with the result of one run: {p}; run it whole \
                 ('weir run' with '{RUNTIME_MODE}' = 'batch')"
            ))),
            None => Ok(()),
        }
    }
}

/// The window marker an aggregate groups by (traced through the
/// projections below), with the table column its time attribute is, when
/// that is a column read unchanged from a scan.
fn window_of(
    a: &datafusion::logical_expr::Aggregate,
) -> Option<(crate::planner::patterns::window::Marker, Option<(String, String)>)> {
    use crate::planner::patterns::window::trace_marker_call;
    for g in &a.group_expr {
        let call = match g.clone().unalias() {
            Expr::Column(c) => {
                let i = a.input.schema().index_of_column(&c).ok()?;
                trace_marker_call(&a.input, i).map(|(call, proj)| (call, proj.input.as_ref()))
            }
            direct if marker_of(&direct).is_some() => Some((direct, a.input.as_ref())),
            _ => None,
        };
        let Some((call, below)) = call else { continue };
        let Some(m) = marker_of(&call) else { continue };
        let time = match &call {
            Expr::ScalarFunction(ScalarFunction { args, .. }) => match args.first() {
                Some(Expr::Column(c)) => below
                    .schema()
                    .index_of_column(c)
                    .ok()
                    .and_then(|i| scan_column(below, i)),
                _ => None,
            },
            _ => None,
        };
        return Some((m, time));
    }
    None
}

/// The table and column output `idx` of `plan` is, read unchanged from a
/// scan through projections, filters and aliases.
fn scan_column(plan: &LogicalPlan, idx: usize) -> Option<(String, String)> {
    match plan {
        LogicalPlan::TableScan(s) => Some((
            s.table_name.table().to_string(),
            s.projected_schema.field(idx).name().clone(),
        )),
        LogicalPlan::Projection(p) => match p.expr.get(idx)?.clone().unalias() {
            Expr::Column(c) => scan_column(&p.input, p.input.schema().index_of_column(&c).ok()?),
            _ => None,
        },
        LogicalPlan::Filter(f) => scan_column(&f.input, idx),
        LogicalPlan::SubqueryAlias(a) => scan_column(&a.input, idx),
        _ => None,
    }
}

/// Why a window's time attribute is not the WATERMARK column chunks are
/// cut on, if it is not.
fn time_is_not_the_rowtime(time: Option<(String, String)>, catalog: &Catalog) -> Option<String> {
    let Some((table, column)) = time else {
        return Some("its windows are on a computed time, not on a table's WATERMARK column chunks are cut on".into());
    };
    match catalog.table(&table).and_then(|d| d.watermark.as_ref()) {
        Some(w) if w.column == column => None,
        _ => Some(format!(
            "its windows are on '{table}.{column}', not on the WATERMARK column chunks are cut on"
        )),
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
                    && m.spec.kind == weir_engine::plan::WindowKind::Session
                {
                    refusal = Some("SESSION windows do not run in batch mode yet".into());
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

/// The most windows a HOP or CUMULATE window TVF puts one row in, in batch
/// mode.
const MAX_WINDOWS_PER_ROW: i64 = 10_000;

/// The column of a row's windows while a HOP or CUMULATE window TVF is
/// unnested.
const WINDOWS_COL: &str = "__weir_windows";

/// HOP and CUMULATE windows as rows: the projection that adds a window
/// TVF's columns reads its input with each row repeated once per window
/// it is in (its windows as [`WindowsOf`] lists, unnested), and takes
/// `window_start`, `window_end` and `window_time` from that window. The
/// windows are the streaming operator's own
/// ([`weir_engine::operators::window::assign_windows`]).
fn windows_as_rows(plan: LogicalPlan) -> Result<LogicalPlan> {
    use datafusion::logical_expr::{LogicalPlanBuilder, Projection};
    use weir_engine::plan::WindowKind;
    let several =
        |m: &crate::planner::patterns::window::Marker| matches!(m.spec.kind, WindowKind::Hop | WindowKind::Cumulate);
    let out = plan.transform_up_with_subqueries(|p| {
        let LogicalPlan::Projection(proj) = &p else {
            return Ok(Transformed::no(p));
        };
        let mut found: Option<(Expr, crate::planner::patterns::window::Marker)> = None;
        let mut clash = false;
        for e in &proj.expr {
            e.apply(|x| {
                if let Some(m) = marker_of(x).filter(several)
                    && let Expr::ScalarFunction(f) = x.clone().unalias()
                    && let Some(ts) = f.args.first()
                {
                    match &found {
                        None => found = Some((ts.clone(), m)),
                        Some((t, n)) if t == ts && n.spec == m.spec => {}
                        Some(_) => clash = true,
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        let Some((ts, marker)) = found else {
            return Ok(Transformed::no(p));
        };
        if clash {
            return Err(datafusion::error::DataFusionError::Plan(
                "two different HOP or CUMULATE windows in one SELECT do not run in batch mode yet".into(),
            ));
        }
        // Each row becomes a row per window: a bound keeps a window of a
        // million slides from multiplying the input out of memory.
        let per_row = marker.spec.size / marker.spec.slide.max(1);
        if per_row > MAX_WINDOWS_PER_ROW {
            return Err(datafusion::error::DataFusionError::Plan(format!(
                "a window of {per_row} slides (or steps) per row does not run in batch mode (at most \
                 {MAX_WINDOWS_PER_ROW})"
            )));
        }
        if marker.zoned {
            return Err(datafusion::error::DataFusionError::Plan(
                "HOP and CUMULATE windows on a TIMESTAMP_LTZ in a session time zone do not run in batch mode yet"
                    .into(),
            ));
        }
        let input = proj.input.as_ref().clone();
        let windows = Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::new(datafusion::logical_expr::ScalarUDF::new_from_impl(WindowsOf::new(
                marker.spec,
            ))),
            vec![ts],
        ))
        .alias(WINDOWS_COL);
        let mut columns: Vec<Expr> = input.schema().columns().into_iter().map(Expr::Column).collect();
        columns.push(windows);
        let expanded = LogicalPlanBuilder::from(input)
            .project(columns)?
            .unnest_column(WINDOWS_COL)?
            .build()?;
        let window = Expr::Column(datafusion::common::Column::from_name(WINDOWS_COL));
        let mut exprs = vec![];
        for e in &proj.expr {
            let name = e.name_for_alias()?;
            let t = e.clone().transform(|x| {
                let Some(m) = marker_of(&x).filter(several) else {
                    return Ok(Transformed::no(x));
                };
                let part = match m.part {
                    weir_engine::plan::GroupOutput::WindowStart => "start",
                    weir_engine::plan::GroupOutput::WindowEnd => "end",
                    _ => "time",
                };
                Ok(Transformed::yes(datafusion::functions::core::expr_fn::get_field(
                    window.clone(),
                    part,
                )))
            })?;
            exprs.push(if t.transformed && !matches!(e, Expr::Alias(_)) {
                t.data.alias(name)
            } else {
                t.data
            });
        }
        Ok(Transformed::yes(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::new(expanded),
        )?)))
    })?;
    Ok(out.data)
}

/// `__weir_windows(ts)`: the windows of `spec` a row at `ts` is in, as a
/// list of `{start, end, time}` (start and end wall times, time the
/// attribute's type, as the window marker's parts are).
#[derive(Debug, PartialEq, Eq, Hash)]
struct WindowsOf {
    spec: weir_engine::plan::WindowSpec,
    signature: datafusion::logical_expr::Signature,
}

impl WindowsOf {
    fn new(spec: weir_engine::plan::WindowSpec) -> Self {
        Self {
            spec,
            signature: datafusion::logical_expr::Signature::any(1, datafusion::logical_expr::Volatility::Immutable),
        }
    }

    fn window_fields(time: &arrow::datatypes::DataType) -> arrow::datatypes::Fields {
        use arrow::datatypes::{DataType, Field, TimeUnit};
        let wall = DataType::Timestamp(TimeUnit::Millisecond, None);
        vec![
            Field::new("start", wall.clone(), false),
            Field::new("end", wall, false),
            Field::new("time", time.clone(), false),
        ]
        .into()
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for WindowsOf {
    fn name(&self) -> &str {
        crate::functions::names::WINDOWS_FN
    }

    fn signature(&self) -> &datafusion::logical_expr::Signature {
        &self.signature
    }

    fn return_type(
        &self,
        args: &[arrow::datatypes::DataType],
    ) -> datafusion::common::Result<arrow::datatypes::DataType> {
        use arrow::datatypes::{DataType, Field, TimeUnit};
        match args.first() {
            Some(t @ DataType::Timestamp(TimeUnit::Millisecond, _)) => Ok(DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(Self::window_fields(t)),
                false,
            )))),
            other => datafusion::common::plan_err!(
                "the time attribute of a window must be TIMESTAMP(3) or TIMESTAMP_LTZ(3), got {other:?}"
            ),
        }
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> datafusion::common::Result<datafusion::logical_expr::ColumnarValue> {
        use arrow::array::{Array, ArrayRef, AsArray, ListArray, StructArray, TimestampMillisecondArray};
        use arrow::buffer::OffsetBuffer;
        use arrow::datatypes::{DataType, Field, TimestampMillisecondType};
        let Some(arg) = args.args.first() else {
            return datafusion::common::exec_err!("{} takes the time attribute", self.name());
        };
        let times = arg.to_array(args.number_rows)?;
        let tz = match times.data_type() {
            DataType::Timestamp(_, tz) => tz.clone(),
            _ => None,
        };
        let Some(ts) = times.as_primitive_opt::<TimestampMillisecondType>() else {
            return datafusion::common::exec_err!("the time attribute of a window must be TIMESTAMP(3)");
        };
        let (mut starts, mut ends, mut lengths) = (vec![], vec![], Vec::with_capacity(ts.len()));
        for i in 0..ts.len() {
            let before = starts.len();
            if ts.is_valid(i) {
                weir_engine::operators::window::assign_windows(&self.spec, ts.value(i), |s, e| {
                    starts.push(s);
                    ends.push(e);
                });
            }
            lengths.push(starts.len() - before);
        }
        if i32::try_from(starts.len()).is_err() {
            return datafusion::common::exec_err!(
                "{} windows from one batch of {} rows: too many for one list",
                starts.len(),
                ts.len()
            );
        }
        let time: TimestampMillisecondArray = ends.iter().map(|e| Some(e.saturating_sub(1))).collect();
        let fields = Self::window_fields(times.data_type());
        let windows = StructArray::try_new(
            fields.clone(),
            vec![
                Arc::new(TimestampMillisecondArray::from(starts)) as ArrayRef,
                Arc::new(TimestampMillisecondArray::from(ends)),
                Arc::new(time.with_timezone_opt(tz)),
            ],
            None,
        )?;
        let list = ListArray::try_new(
            Arc::new(Field::new("item", DataType::Struct(fields), false)),
            OffsetBuffer::from_lengths(lengths),
            Arc::new(windows),
            None,
        )?;
        Ok(datafusion::logical_expr::ColumnarValue::Array(Arc::new(list)))
    }
}

/// Whether one of `def`'s columns is `PROCTIME()`.
fn reads_processing_time(def: &TableDef) -> bool {
    def.columns
        .iter()
        .filter_map(|c| c.computed.as_deref())
        .any(crate::functions::overrides::is_proctime_call)
}

/// A HOP or CUMULATE marker [`windows_as_rows`] did not turn into rows (a
/// filter on a window bound moved below the window's projection) would
/// read the row's time as the window's: refused.
fn no_markers_left(plan: &LogicalPlan) -> Result<()> {
    let mut left = false;
    plan.apply_with_subqueries(|p| {
        p.apply_expressions(|e| {
            e.apply(|x| {
                left |= marker_of(x).is_some_and(|m| {
                    matches!(
                        m.spec.kind,
                        weir_engine::plan::WindowKind::Hop | weir_engine::plan::WindowKind::Cumulate
                    )
                });
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    if left {
        return Err(SqlError::unsupported(format!(
            "a HOP or CUMULATE window's bounds used outside its SELECT (a filter on window_start or window_end \
             below the aggregate) do not run in batch mode yet; run the query with '{RUNTIME_MODE}' = 'streaming'"
        )));
    }
    Ok(())
}

/// FIRST_VALUE and LAST_VALUE skip NULLs, as Flink's do (DataFusion's keep
/// them unless told): each call gets IGNORE NULLS, under its old name.
fn first_and_last_skip_nulls(plan: LogicalPlan) -> Result<LogicalPlan> {
    use datafusion::logical_expr::expr::{AggregateFunction, NullTreatment};
    let out = plan.transform_up_with_subqueries(|p| {
        let LogicalPlan::Aggregate(agg) = &p else {
            return Ok(Transformed::no(p));
        };
        let mut changed = false;
        let mut exprs = vec![];
        for e in &agg.aggr_expr {
            let name = e.name_for_alias()?;
            let t = e.clone().transform(|x| match x {
                Expr::AggregateFunction(AggregateFunction { func, mut params })
                    if matches!(func.name(), "first_value" | "last_value") && params.null_treatment.is_none() =>
                {
                    params.null_treatment = Some(NullTreatment::IgnoreNulls);
                    Ok(Transformed::yes(Expr::AggregateFunction(AggregateFunction {
                        func,
                        params,
                    })))
                }
                other => Ok(Transformed::no(other)),
            })?;
            changed |= t.transformed;
            exprs.push(if t.transformed && !matches!(e, Expr::Alias(_)) {
                t.data.alias(name)
            } else {
                t.data
            });
        }
        if !changed {
            return Ok(Transformed::no(p));
        }
        Ok(Transformed::yes(LogicalPlan::Aggregate(
            datafusion::logical_expr::Aggregate::try_new(agg.input.clone(), agg.group_expr.clone(), exprs)?,
        )))
    })?;
    Ok(out.data)
}

/// The clock functions a batch query reads once, when it is planned, as
/// Flink's batch mode does (streaming mode reads them per batch of rows);
/// `CURRENT_ROW_TIMESTAMP()` stays per row.
fn clocks_read_once(plan: LogicalPlan, state: &datafusion::execution::SessionState) -> Result<LogicalPlan> {
    use datafusion::logical_expr::expr_rewriter::NamePreserver;
    const ONCE: &[&str] = &[
        "now",
        "current_timestamp",
        "localtimestamp",
        "current_date",
        "current_time",
        "localtime",
    ];
    let empty = DFSchema::empty();
    let batch = arrow::record_batch::RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty()));
    let out = plan.transform_up_with_subqueries(|p| {
        let names = NamePreserver::new(&p);
        let p = p.map_expressions(|e| {
            let saved = names.save(&e);
            let t = e.transform(|x| {
                let Expr::ScalarFunction(ScalarFunction { func, args }) = &x else {
                    return Ok(Transformed::no(x));
                };
                if !args.is_empty() || !ONCE.contains(&func.name()) {
                    return Ok(Transformed::no(x));
                }
                let value = state.create_physical_expr(x.clone(), &empty)?.evaluate(&batch)?;
                match value {
                    datafusion::logical_expr::ColumnarValue::Scalar(v) => Ok(Transformed::yes(Expr::Literal(v, None))),
                    datafusion::logical_expr::ColumnarValue::Array(_) => Ok(Transformed::no(x)),
                }
            })?;
            Ok(t.update_data(|e| saved.restore(e)))
        })?;
        if p.transformed {
            p.map_data(|p| p.recompute_schema())
        } else {
            Ok(p)
        }
    })?;
    Ok(out.data)
}
