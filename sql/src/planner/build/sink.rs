//! The sink: conflicts between upsert and primary keys, the changelog
//! normalizer a sink makes unneeded, the sink's exchange.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, cast};
use weir_catalog::TableDef;
use weir_engine::plan::{CalcNode, Exchange, NodeId, NodeKind, SinkNode, StreamEdge, UpsertMaterializeNode};

use crate::error::{Result, SqlError};
use crate::parser::OnConflict;

use crate::planner::build::GraphBuilder;
use crate::planner::*;

impl GraphBuilder<'_> {
    /// Flink 2.3's rules for an updating query into a sink with a PRIMARY
    /// KEY that is not its upsert key (several live rows of the query may
    /// share a sink key). A sink that takes `-U` (a changelog file format)
    /// gets the changes as they are. An upsert sink (print, blackhole)
    /// needs `ON CONFLICT`: `DO DEDUPLICATE` puts Flink's upsert
    /// materializer in front of it; without a clause the INSERT is refused
    /// with Flink's message. Returns the node the sink reads.
    pub(crate) fn resolve_conflicts(
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

    pub(crate) fn add_sink(
        &mut self,
        last: NodeId,
        sink: &TableDef,
        on_conflict: Option<OnConflict>,
    ) -> Result<NodeId> {
        let factory = weir_engine::connectors::create_sink(sink, &self.config.paths, &self.config.s3)?;
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
    pub(crate) fn drop_unneeded_normalize(
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
    pub(crate) fn sink_exchange(
        &self,
        input: NodeId,
        sink: &TableDef,
        target: &SchemaRef,
    ) -> Result<(usize, Exchange)> {
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
