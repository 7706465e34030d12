//! Logical plan → stream graph: [`GraphBuilder`] converts each logical
//! node, one file per kind of streaming node it builds.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::TreeNode;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, FetchType, LogicalPlan, SkipType};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use weir_catalog::Catalog;
use weir_engine::config::JobConfig;
use weir_engine::plan::{CalcNode, Exchange, LimitNode, NodeId, NodeKind, StreamEdge, StreamGraph, StreamNode};

use crate::error::{Result, SqlError};

use crate::planner::patterns::time::*;
use crate::planner::patterns::top_n::*;
use crate::planner::patterns::window::*;
use crate::planner::*;

pub(crate) mod aggregate;
pub(crate) mod join;
pub(crate) mod over;
pub(crate) mod rank;
pub(crate) mod session;
pub(crate) mod sink;
pub(crate) mod source;
pub(crate) mod union;

pub(crate) struct GraphBuilder<'a> {
    pub(crate) planner: &'a Planner,
    pub(crate) catalog: &'a Catalog,
    pub(crate) config: &'a JobConfig,
    pub(crate) nodes: Vec<StreamNode>,
    pub(crate) edges: Vec<StreamEdge>,
    /// Inside the input of a window aggregate, HOP/CUMULATE markers are
    /// allowed (the aggregate assigns their windows).
    pub(crate) under_window_aggregate: bool,
    /// Set by a projection over a Top-N filter: whether it uses the rank
    /// column (taken by that filter).
    pub(crate) rank_used: Option<bool>,
    /// A plan node already converted (a Top-N's window): its stream node.
    pub(crate) replaced: Option<(*const LogicalPlan, NodeId)>,
    /// Per table, the columns any scan of it in the query reads: a table
    /// scanned twice (a self-join, a UNION of two filters of it) is read
    /// by one source that feeds both (Flink's source reuse), so it is
    /// read once, and has one uid and one set of split positions.
    pub(crate) scan_columns: HashMap<String, BTreeSet<String>>,
    /// The source node already made for a table.
    pub(crate) sources: HashMap<String, NodeId>,
    /// `STATE_TTL` hints: input name (lowercase) → TTL.
    pub(crate) state_ttl_hints: HashMap<String, std::time::Duration>,
}

impl<'a> GraphBuilder<'a> {
    pub(crate) fn new(
        planner: &'a Planner,
        catalog: &'a Catalog,
        config: &'a JobConfig,
        plan: &LogicalPlan,
    ) -> Result<Self> {
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

    pub(crate) fn finish(self) -> StreamGraph {
        weir_engine::uid::graph(self.nodes, self.edges, &self.config.operator_uids)
    }

    pub(crate) fn add(
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

    pub(crate) fn calc(
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
    pub(crate) fn check_current_watermark(&self, exprs: &[Expr], input: &LogicalPlan) -> Result<()> {
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

    pub(crate) fn physical(&self, e: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        let physical = self.planner.state.create_physical_expr(e.clone(), schema)?;
        Ok(weir_engine::expr::fast_paths(physical, schema.as_arrow())?)
    }

    pub(crate) fn convert(&mut self, plan: &LogicalPlan) -> Result<NodeId> {
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
}
