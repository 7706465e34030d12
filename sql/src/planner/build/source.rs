//! A table scan: its source node (one per table, read once by every scan)
//! with its watermark and computed columns.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::common::DFSchema;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use weir_engine::plan::{ChangelogNormalizeNode, Exchange, NodeId, NodeKind, SourceNode, WatermarkNode};

use crate::error::{Result, SqlError};

use crate::planner::build::GraphBuilder;
use crate::planner::*;

impl GraphBuilder<'_> {
    pub(crate) fn source(&mut self, scan: &datafusion::logical_expr::TableScan) -> Result<NodeId> {
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
        if let Some(w) = &def.watermark {
            needed.insert(w.column.clone());
            needed.extend(identifiers(&w.expr));
        }
        let (narrowed, computed) = narrowed_table(self.planner, def, needed, self.config)?;
        let factory = weir_engine::connectors::create_source(&narrowed, &self.config.paths, &self.config.s3)?;
        let full_schema = narrowed.schema();
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
    pub(crate) fn hinted_ttl(&self, plan: &LogicalPlan) -> Option<std::time::Duration> {
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
    pub(crate) fn project_scan(
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
}

/// A table's columns as expressions over its physical rows.
pub(crate) type ComputedColumns = Vec<Arc<dyn PhysicalExpr>>;

/// The table a source of `def` reads: the columns in `needed`, those the
/// connector cannot leave out (all of its physical ones where it does not
/// prune columns, the ones it requires), and what the computed ones among
/// them read; with its computed columns' expressions over its physical
/// rows (`None` when it has none). The streaming source and batch mode's
/// scans read tables alike through it.
pub(crate) fn narrowed_table(
    planner: &Planner,
    def: &weir_catalog::TableDef,
    mut needed: BTreeSet<String>,
    config: &weir_engine::config::JobConfig,
) -> Result<(weir_catalog::TableDef, Option<ComputedColumns>)> {
    if !weir_engine::connectors::supports_column_pruning(def) {
        needed.extend(def.physical_columns().map(|c| c.name.clone()));
    }
    needed.extend(weir_engine::connectors::required_columns(def));
    for c in &def.columns {
        if let Some(expr) = &c.computed
            && needed.contains(&c.name)
        {
            needed.extend(identifiers(expr));
        }
    }
    let mut narrowed = def.clone();
    narrowed.columns.retain(|c| needed.contains(&c.name));
    if !narrowed.columns.iter().any(|c| c.computed.is_some()) {
        return Ok((narrowed, None));
    }
    let physical_schema = narrowed.physical_schema();
    let physical_df = DFSchema::try_from(physical_schema.as_ref().clone())?;
    let mut exprs: Vec<Arc<dyn PhysicalExpr>> = vec![];
    for c in &narrowed.columns {
        exprs.push(match &c.computed {
            Some(text) => planner.plan_expr_text(text, &physical_df, config.local_time_zone.as_ref())?,
            None => Arc::new(Column::new(&c.name, physical_schema.index_of(&c.name)?)),
        });
    }
    Ok((narrowed, Some(exprs)))
}
