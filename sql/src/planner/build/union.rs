//! `UNION ALL`.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, cast};
use weir_engine::plan::{Exchange, NodeId, NodeKind, StreamEdge};

use crate::error::{Result, SqlError};

use crate::planner::build::GraphBuilder;

impl GraphBuilder<'_> {
    /// `UNION ALL` of any number of inputs (`UNION` is a DISTINCT over
    /// it). Inputs at the union's parallelism keep their subtask
    /// (forward); others are spread, by the whole row when they carry
    /// changes (so a row's insert and its retraction take one path, in
    /// order).
    pub(crate) fn union(&mut self, u: &datafusion::logical_expr::Union) -> Result<NodeId> {
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
}
