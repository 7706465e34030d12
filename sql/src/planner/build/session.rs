//! The SESSION window TVF on its own (sessions per partition, rows out).

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use weir_engine::plan::{Exchange, GroupOutput, NodeId, NodeKind, SessionWindowNode, WindowKind};

use crate::error::{Result, SqlError};
use crate::refusals;
use crate::udf::WindowMarker;

use crate::planner::build::GraphBuilder;
use crate::planner::patterns::time::*;
use crate::planner::patterns::window::*;
use crate::planner::*;

impl GraphBuilder<'_> {
    /// A projection that adds a SESSION TVF's window columns, not under a
    /// window aggregate grouped by its partition: Flink's window table
    /// function on its own. The session operator (hash by the partition)
    /// emits each row with its session's `window_start`, `window_end`,
    /// `window_time` when the session fires; a calc then lays the
    /// projection out.
    pub(crate) fn session_window(&mut self, p: &datafusion::logical_expr::Projection) -> Result<NodeId> {
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
}
