//! Joins: regular, interval, window and temporal.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::logical_expr::Expr;
use weir_engine::plan::{ChangelogMode, Exchange, JoinNode, JoinType, NodeId, NodeKind, StreamEdge};

use crate::error::{Result, SqlError};
use crate::refusals;

use crate::planner::build::GraphBuilder;
use crate::planner::patterns::time::*;
use crate::planner::patterns::window::*;

impl GraphBuilder<'_> {
    pub(crate) fn join(&mut self, join: &datafusion::logical_expr::Join) -> Result<NodeId> {
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
    pub(crate) fn temporal_times(
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
}
