//! AST rewrites applied to every query before DataFusion plans it.
//!
//! - Window TVFs `TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), size [, offset]))`
//!   (and HOP, CUMULATE) become a derived table
//!   `(SELECT *, __weir_window(ts, ...) AS window_start, ... AS window_end,
//!   ... AS window_time FROM t) AS t`.
//! - Legacy group windows `GROUP BY TUMBLE(ts, size)` with
//!   `TUMBLE_START(...)`/`TUMBLE_END(...)`/`TUMBLE_ROWTIME(...)` become the
//!   same derived table, grouped by `window_start, window_end`.
//! - Views are inlined as derived tables.
//! - Function names are lower-cased: Flink's functions are case-insensitive
//!   while identifiers are case-sensitive (ident normalization is off).

use std::collections::HashSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    self, DateTimeField, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident, ObjectName, Query,
    Select, SetExpr, TableFactor, Value, VisitMut, VisitorMut,
};
use sqlparser::parser::Parser;
use weir_catalog::Catalog;
use weir_catalog::store::Entry;

use crate::error::{Result, SqlError};
use crate::parser::dialect;
use crate::udf::{NAMED_FN, PARTITION_BY_FN, SYSTEM_TIME_FN, TEMPORAL_JOIN_FN, WINDOW_FN};

const MAX_VIEW_DEPTH: usize = 32;

/// Rewrites `query` in place.
pub fn rewrite_query(query: &mut Query, catalog: &Catalog) -> Result<()> {
    rewrite_at_depth(query, catalog, 0)
}

fn rewrite_at_depth(query: &mut Query, catalog: &Catalog, depth: usize) -> Result<()> {
    if depth > MAX_VIEW_DEPTH {
        return Err(SqlError::plan(
            "views nested too deeply (a view that refers to itself?)",
        ));
    }
    let mut v = Rewriter { catalog, depth };
    match query.visit(&mut v) {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

struct Rewriter<'a> {
    catalog: &'a Catalog,
    depth: usize,
}

/// Milliseconds of an `INTERVAL 'n' UNIT` literal.
pub fn interval_ms(expr: &Expr) -> Result<i64> {
    let ms = interval_ms_or_zero(expr)?;
    if ms < 1 {
        return Err(SqlError::plan(format!("window interval {expr} must be positive")));
    }
    Ok(ms)
}

/// Milliseconds of an interval literal, zero allowed (e.g. a drift).
pub fn interval_ms_or_zero(expr: &Expr) -> Result<i64> {
    let bad = || {
        SqlError::plan(format!(
            "expected an interval literal such as INTERVAL '10' SECOND, found {expr}"
        ))
    };
    let Expr::Interval(iv) = expr else { return Err(bad()) };
    let text = match iv.value.as_ref() {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => s.clone(),
            Value::Number(n, _) => n.clone(),
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let mut parts = text.split_whitespace();
    let number: f64 = parts.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let unit_from_text = parts.next().map(|u| u.to_ascii_uppercase());
    let unit_ms = |u: &str| -> Option<f64> {
        Some(match u.trim_end_matches('S') {
            "MILLISECOND" => 1.0,
            "SECOND" => 1_000.0,
            "MINUTE" => 60_000.0,
            "HOUR" => 3_600_000.0,
            "DAY" => 86_400_000.0,
            _ => return None,
        })
    };
    let per = match (&iv.leading_field, unit_from_text) {
        (Some(DateTimeField::Millisecond | DateTimeField::Milliseconds), _) => 1.0,
        (Some(DateTimeField::Second | DateTimeField::Seconds), _) => 1_000.0,
        (Some(DateTimeField::Minute | DateTimeField::Minutes), _) => 60_000.0,
        (Some(DateTimeField::Hour | DateTimeField::Hours), _) => 3_600_000.0,
        (Some(DateTimeField::Day | DateTimeField::Days), _) => 86_400_000.0,
        (None, Some(u)) => unit_ms(&u).ok_or_else(bad)?,
        _ => {
            return Err(SqlError::unsupported(format!(
                "interval {expr}: only MILLISECOND, SECOND, MINUTE, HOUR and DAY are supported for windows"
            )));
        }
    };
    let ms = (number * per).round();
    if !(ms >= 0.0 && ms < i64::MAX as f64) {
        return Err(SqlError::plan(format!("interval {expr} must not be negative")));
    }
    Ok(ms as i64)
}

fn args_of(f: &ast::Function) -> Vec<&Expr> {
    match &f.args {
        FunctionArguments::List(l) => l
            .args
            .iter()
            .filter_map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                FunctionArg::Named {
                    arg: FunctionArgExpr::Expr(e),
                    ..
                } => Some(e),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

fn fn_name(name: &ObjectName) -> String {
    name.to_string().to_ascii_uppercase()
}

/// The select list that adds the window columns. `session` is a SESSION
/// marker's seventh argument on: `'keys'`, or `'partition'` and columns.
fn window_columns(ts: &str, call: &WindowCall, session: &str) -> String {
    let (kind, size, slide, offset) = (call.kind, call.size, call.slide, call.offset);
    let session = if kind == "SESSION" {
        format!(", {session}")
    } else {
        String::new()
    };
    ["start", "end", "time"]
        .iter()
        .map(|part| {
            format!("{WINDOW_FN}({ts}, '{kind}', {size}, {slide}, {offset}, '{part}'{session}) AS window_{part}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_query_text(sql: &str) -> Result<Box<Query>> {
    let d = dialect();
    Ok(Parser::new(&d).try_with_sql(sql)?.parse_query()?)
}

fn parse_expr(sql: &str) -> Result<Expr> {
    let d = dialect();
    Ok(Parser::new(&d).try_with_sql(sql)?.parse_expr()?)
}

/// `(<query>) AS alias` as a table factor.
fn derived(query_sql: &str, alias: &Ident) -> Result<TableFactor> {
    let q = parse_query_text(&format!("SELECT * FROM ({query_sql}) AS {alias}"))?;
    match *q.body {
        SetExpr::Select(mut s) if !s.from.is_empty() => Ok(s.from.swap_remove(0).relation),
        _ => Err(SqlError::internal("derived table did not parse as expected")),
    }
}

struct WindowCall {
    kind: &'static str,
    size: i64,
    slide: i64,
    offset: i64,
}

/// Parses the size arguments of TUMBLE/HOP/CUMULATE (after the table and
/// time column).
fn window_call(name: &str, sizes: &[&Expr], legacy: bool) -> Result<WindowCall> {
    let ms = |i: usize| sizes.get(i).map(|e| interval_ms(e)).transpose();
    let arity = |min: usize, max: usize| {
        if sizes.len() < min || sizes.len() > max {
            Err(SqlError::plan(format!(
                "{name} takes {min}{} interval argument(s), got {}",
                if max > min { format!(" or {max}") } else { String::new() },
                sizes.len()
            )))
        } else {
            Ok(())
        }
    };
    let call = match name {
        "TUMBLE" => {
            arity(1, 2)?;
            let size = ms(0)?.unwrap_or(1);
            WindowCall {
                kind: "TUMBLE",
                size,
                slide: size,
                offset: ms(1)?.unwrap_or(0),
            }
        }
        "HOP" => {
            arity(2, 3)?;
            // Both forms take (slide, size).
            let (slide, size) = (ms(0)?.unwrap_or(1), ms(1)?.unwrap_or(1));
            if size % slide != 0 {
                return Err(SqlError::plan(format!(
                    "HOP window size ({size} ms) must be an integral multiple of the slide ({slide} ms)"
                )));
            }
            WindowCall {
                kind: "HOP",
                size,
                slide,
                offset: ms(2)?.unwrap_or(0),
            }
        }
        "CUMULATE" if !legacy => {
            arity(2, 3)?;
            let (step, size) = (ms(0)?.unwrap_or(1), ms(1)?.unwrap_or(1));
            if size % step != 0 {
                return Err(SqlError::plan(format!(
                    "CUMULATE window size ({size} ms) must be an integral multiple of the step ({step} ms)"
                )));
            }
            WindowCall {
                kind: "CUMULATE",
                size,
                slide: step,
                offset: ms(2)?.unwrap_or(0),
            }
        }
        "SESSION" => {
            arity(1, 1)?;
            let gap = ms(0)?.unwrap_or(1);
            WindowCall {
                kind: "SESSION",
                size: gap,
                slide: gap,
                offset: 0,
            }
        }
        other => {
            return Err(SqlError::unsupported(format!(
                "window function {other} is not supported"
            )));
        }
    };
    // Every row is assigned to size / slide windows, one at a time: a HOP of
    // 1 ms over a year held a job on its first row for hours.
    let per_row = call.size / call.slide;
    if per_row > MAX_WINDOWS_PER_ROW {
        return Err(SqlError::plan(format!(
            "{name} window of {} ms every {} ms puts each row in {per_row} windows; at most {MAX_WINDOWS_PER_ROW} are supported",
            call.size, call.slide
        )));
    }
    Ok(call)
}

/// Most windows a HOP or CUMULATE window may put one row in.
pub const MAX_WINDOWS_PER_ROW: i64 = 100_000;

impl Rewriter<'_> {
    fn tvf(&self, expr: &Expr, alias: &Option<ast::TableAlias>) -> Result<Option<TableFactor>> {
        let Expr::Function(f) = expr else { return Ok(None) };
        let name = fn_name(&f.name);
        if !["TUMBLE", "HOP", "CUMULATE", "SESSION"].contains(&name.as_str()) {
            return Ok(None);
        }
        let mut args = args_of(f);
        // SESSION's `PARTITION BY` (see the parser's TVF rewrite).
        let partition = match args.get(1) {
            Some(Expr::Function(p)) if fn_name(&p.name) == PARTITION_BY_FN.to_ascii_uppercase() => {
                let cols = args_of(p).iter().map(|c| c.to_string()).collect::<Vec<_>>();
                args.remove(1);
                if name != "SESSION" {
                    return Err(SqlError::plan(format!(
                        "PARTITION BY is an argument of the SESSION window TVF, not of {name}"
                    )));
                }
                cols
            }
            _ => vec![],
        };
        if args.len() < 3 {
            return Err(SqlError::plan(format!(
                "{name} expects (TABLE t, DESCRIPTOR(time_column), interval...)"
            )));
        }
        let table = match args[0] {
            Expr::Identifier(i) => ObjectName::from(vec![i.clone()]),
            Expr::CompoundIdentifier(parts) => ObjectName::from(parts.clone()),
            other => {
                return Err(SqlError::plan(format!(
                    "the first argument of {name} must be TABLE <name>, found {other}"
                )));
            }
        };
        let ts = match args[1] {
            Expr::Function(d) if fn_name(&d.name) == "DESCRIPTOR" => match args_of(d).as_slice() {
                [Expr::Identifier(c)] => c.clone(),
                _ => return Err(SqlError::plan("DESCRIPTOR takes exactly one column name")),
            },
            other => {
                return Err(SqlError::plan(format!(
                    "the second argument of {name} must be DESCRIPTOR(time_column), found {other}"
                )));
            }
        };
        let call = window_call(&name, &args[2..], false)?;
        let alias_ident = alias.as_ref().map(|a| a.name.clone()).unwrap_or_else(|| {
            table
                .0
                .last()
                .and_then(|p| p.as_ident().cloned())
                .unwrap_or_else(|| Ident::new("w"))
        });
        let session = std::iter::once("'partition'".to_string())
            .chain(partition)
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT *, {} FROM {table}",
            window_columns(&ts.to_string(), &call, &session)
        );
        let mut factor = derived(&sql, &alias_ident)?;
        self.rewrite_factor_subquery(&mut factor)?;
        Ok(Some(factor))
    }

    fn view(&self, name: &ObjectName, alias: &Option<ast::TableAlias>) -> Result<Option<TableFactor>> {
        let key = crate::parser::object_name(name);
        let Some(Entry::View(v)) = self.catalog.get(&key) else {
            return Ok(None);
        };
        let alias_ident = alias.as_ref().map(|a| a.name.clone()).unwrap_or_else(|| {
            name.0
                .last()
                .and_then(|p| p.as_ident().cloned())
                .unwrap_or_else(|| Ident::new(&key))
        });
        let mut factor = derived(&v.query, &alias_ident)?;
        self.rewrite_factor_subquery(&mut factor)?;
        Ok(Some(factor))
    }

    fn rewrite_factor_subquery(&self, factor: &mut TableFactor) -> Result<()> {
        if let TableFactor::Derived { subquery, .. } = factor {
            rewrite_at_depth(subquery, self.catalog, self.depth + 1)?;
        }
        Ok(())
    }

    /// A versioned view (Flink's): the last row per key of a table with a
    /// watermark, `SELECT ... FROM (SELECT *, ROW_NUMBER() OVER (PARTITION
    /// BY k ORDER BY ts DESC) AS rn FROM t) WHERE rn = 1`, whose key is `k`
    /// and version time `ts` (the table's rowtime). Returns them.
    fn versioned_view(&self, name: &str, query: &str) -> Result<(String, Vec<String>)> {
        let refuse = |why: &str| {
            SqlError::plan(format!(
                "Temporal Table Join requires primary key in versioned table, but no primary key can be found: \
                 the view '{name}' is not a versioned view ({why}); a versioned view keeps the last row per key: \
                 SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY rowtime DESC) AS rn FROM t) \
                 WHERE rn = 1"
            ))
        };
        let q = parse_query_text(query)?;
        let SetExpr::Select(outer) = q.body.as_ref() else {
            return Err(refuse("not a SELECT"));
        };
        let [from] = outer.from.as_slice() else {
            return Err(refuse("not one subquery"));
        };
        let TableFactor::Derived { subquery, .. } = &from.relation else {
            return Err(refuse("not over a subquery"));
        };
        let SetExpr::Select(inner) = subquery.body.as_ref() else {
            return Err(refuse("the subquery is not a SELECT"));
        };
        // The ROW_NUMBER column and its window.
        let mut found = None;
        for item in &inner.projection {
            if let ast::SelectItem::ExprWithAlias {
                expr: Expr::Function(f),
                alias,
            } = item
                && fn_name(&f.name) == "ROW_NUMBER"
                && let Some(ast::WindowType::WindowSpec(w)) = &f.over
            {
                found = Some((alias.value.clone(), w));
            }
        }
        let Some((rn, window)) = found else {
            return Err(refuse("no ROW_NUMBER() OVER (...) AS rn"));
        };
        let kept_first = match &outer.selection {
            Some(Expr::BinaryOp { left, op, right }) => {
                let is_rn = |e: &Expr| matches!(e, Expr::Identifier(i) if i.value == rn);
                let is_one = |e: &Expr| matches!(e, Expr::Value(v) if v.value == Value::Number("1".into(), false));
                matches!(op, ast::BinaryOperator::Eq | ast::BinaryOperator::LtEq)
                    && ((is_rn(left) && is_one(right)) || (is_one(left) && is_rn(right)))
            }
            _ => false,
        };
        if !kept_first {
            return Err(refuse("no WHERE rn = 1"));
        }
        let pk: Vec<String> = window
            .partition_by
            .iter()
            .map(|e| match e {
                Expr::Identifier(i) => Some(i.value.clone()),
                _ => None,
            })
            .collect::<Option<_>>()
            .filter(|k: &Vec<String>| !k.is_empty())
            .ok_or_else(|| refuse("PARTITION BY is not a list of columns"))?;
        let rowtime = match window.order_by.as_slice() {
            [o] if o.options.asc == Some(false) => match &o.expr {
                Expr::Identifier(i) => i.value.clone(),
                _ => return Err(refuse("ORDER BY is not a column")),
            },
            _ => return Err(refuse("not ordered by one time column DESC (the last row per key)")),
        };
        // The time column must be the table's rowtime.
        let table = match inner.from.as_slice() {
            [t] => match &t.relation {
                TableFactor::Table { name, .. } => name.to_string(),
                _ => return Err(refuse("not over a table")),
            },
            _ => return Err(refuse("not over one table")),
        };
        let is_rowtime = self
            .catalog
            .table(table.trim_matches('`'))
            .and_then(|t| t.watermark.as_ref())
            .is_some_and(|w| w.column == rowtime);
        if !is_rowtime {
            return Err(SqlError::plan(format!(
                "Event-Time Temporal Table Join requires both primary key and row time attribute in versioned \
                 table, but no row time attribute can be found: '{rowtime}' of the view '{name}' is not the \
                 WATERMARK column of '{table}'"
            )));
        }
        Ok((rowtime, pk))
    }

    /// Temporal joins `JOIN r FOR SYSTEM_TIME AS OF o.ts ON ...` (the
    /// parser hands the clause over as `r(__weir_system_time(o.ts))`):
    /// the table loses the argument and the `ON` gains the conjunct
    /// `__weir_temporal_join(o.ts, r.<rowtime>, r.<pk>...)`, which tells
    /// the planner the versioned side, its version time and its key.
    fn temporal_joins(&self, select: &mut Select) -> Result<()> {
        let system_time = |factor: &mut TableFactor| -> Result<Option<(Expr, ObjectName, Ident)>> {
            let TableFactor::Table { name, alias, args, .. } = factor else {
                return Ok(None);
            };
            let Some(a) = args.as_ref() else { return Ok(None) };
            let marker = match a.args.as_slice() {
                [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Function(f)))]
                    if fn_name(&f.name) == SYSTEM_TIME_FN.to_ascii_uppercase() =>
                {
                    f
                }
                _ => return Ok(None),
            };
            let time = match args_of(marker).as_slice() {
                [t] => (*t).clone(),
                _ => return Err(SqlError::plan("FOR SYSTEM_TIME AS OF takes one time attribute column")),
            };
            let alias = alias.as_ref().map(|a| a.name.clone()).unwrap_or_else(|| {
                name.0
                    .last()
                    .and_then(|p| p.as_ident().cloned())
                    .unwrap_or_else(|| Ident::new(name.to_string()))
            });
            *args = None;
            Ok(Some((time, name.clone(), alias)))
        };
        for twj in &mut select.from {
            if system_time(&mut twj.relation)?.is_some() {
                return Err(SqlError::plan(
                    "FOR SYSTEM_TIME AS OF names the versioned table on the right side of a temporal join \
                     (`FROM orders AS o JOIN rates FOR SYSTEM_TIME AS OF o.ts AS r ON ...`)",
                ));
            }
            for join in &mut twj.joins {
                let Some((time, name, alias)) = system_time(&mut join.relation)? else {
                    continue;
                };
                let table_name = crate::parser::object_name(&name);
                let (rowtime, pk) = match self.catalog.get(&table_name) {
                    Some(Entry::Table(def)) => {
                        let Some(pk) = def.primary_key.clone().filter(|k| !k.is_empty()) else {
                            return Err(SqlError::plan(format!(
                                "Temporal Table Join requires primary key in versioned table, but no primary key \
                                 can be found. Declare PRIMARY KEY (...) NOT ENFORCED on '{table_name}'"
                            )));
                        };
                        let Some(w) = def.watermark.as_ref() else {
                            return Err(SqlError::plan(format!(
                                "Event-Time Temporal Table Join requires both primary key and row time attribute \
                                 in versioned table, but no row time attribute can be found. Declare a WATERMARK \
                                 on '{table_name}'"
                            )));
                        };
                        (w.column.clone(), pk)
                    }
                    Some(Entry::View(v)) => self.versioned_view(&table_name, &v.query)?,
                    None => return Err(SqlError::not_found(format!("table '{table_name}' does not exist"))),
                };
                let column = |c: &str| Expr::CompoundIdentifier(vec![alias.clone(), Ident::with_quote('`', c)]);
                let mut marker_args = vec![time.to_string(), column(&rowtime).to_string()];
                marker_args.extend(pk.iter().map(|c| column(c).to_string()));
                let marker = parse_expr(&format!("{TEMPORAL_JOIN_FN}({})", marker_args.join(", ")))?;
                use ast::JoinOperator as J;
                let constraint = match &mut join.join_operator {
                    J::Join(c)
                    | J::Inner(c)
                    | J::Left(c)
                    | J::LeftOuter(c)
                    | J::Right(c)
                    | J::RightOuter(c)
                    | J::FullOuter(c) => c,
                    _ => {
                        return Err(SqlError::unsupported(
                            "Temporal Table Join currently only supports INNER JOIN and LEFT JOIN",
                        ));
                    }
                };
                match constraint {
                    ast::JoinConstraint::On(on) => {
                        let cond = std::mem::replace(on, Expr::value(Value::Boolean(true)));
                        *on = Expr::BinaryOp {
                            left: Box::new(Expr::Nested(Box::new(cond))),
                            op: ast::BinaryOperator::And,
                            right: Box::new(marker),
                        };
                    }
                    _ => {
                        return Err(SqlError::plan(
                            "a temporal join needs an ON condition with the versioned table's primary key",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Legacy `GROUP BY TUMBLE(ts, size)`: wraps FROM in the windowed
    /// derived table and renames the window property functions.
    fn group_window(&self, select: &mut Select) -> Result<()> {
        let GroupByExpr::Expressions(exprs, _) = &mut select.group_by else {
            return Ok(());
        };
        let Some(pos) = exprs.iter().position(
            |e| matches!(e, Expr::Function(f) if ["TUMBLE", "HOP", "SESSION"].contains(&fn_name(&f.name).as_str())),
        ) else {
            return Ok(());
        };
        let Expr::Function(f) = exprs[pos].clone() else {
            return Ok(());
        };
        let name = fn_name(&f.name);
        let args = args_of(&f);
        let ts = match args.first() {
            Some(Expr::Identifier(c)) => c.clone(),
            Some(Expr::CompoundIdentifier(parts)) => parts.last().cloned().unwrap_or_else(|| Ident::new("?")),
            _ => {
                return Err(SqlError::plan(format!(
                    "the first argument of {name} in GROUP BY must be the time attribute column"
                )));
            }
        };
        let call = window_call(&name, &args[1..], true)?;
        // window_time too: `*_ROWTIME(...)` may be selected.
        exprs.splice(
            pos..=pos,
            [
                Expr::Identifier(Ident::new("window_start")),
                Expr::Identifier(Ident::new("window_end")),
                Expr::Identifier(Ident::new("window_time")),
            ],
        );
        if select.from.len() != 1 {
            return Err(SqlError::unsupported(
                "a group window over several tables is not supported",
            ));
        }
        let from = &select.from[0];
        let alias = match (&from.relation, from.joins.is_empty()) {
            (TableFactor::Table { name, alias, .. }, true) => alias
                .as_ref()
                .map(|a| a.name.clone())
                .or_else(|| name.0.last().and_then(|p| p.as_ident().cloned()))
                .unwrap_or_else(|| Ident::new("w")),
            (TableFactor::Derived { alias: Some(a), .. }, true) => a.name.clone(),
            _ => Ident::new("w"),
        };
        let sql = format!(
            "SELECT *, {} FROM {from}",
            window_columns(&ts.to_string(), &call, "'keys'")
        );
        let mut factor = derived(&sql, &alias)?;
        self.rewrite_factor_subquery(&mut factor)?;
        select.from[0].relation = factor;
        select.from[0].joins.clear();
        // TUMBLE_START(...) → window_start, etc.
        let prefix = format!("{name}_");
        let mut err = None;
        let mut rename = |e: &mut Expr| {
            if let Expr::Function(f) = e {
                let n = fn_name(&f.name);
                if let Some(prop) = n.strip_prefix(&prefix) {
                    let col = match prop {
                        "START" => "window_start",
                        "END" => "window_end",
                        "ROWTIME" => "window_time",
                        other => {
                            err = Some(SqlError::unsupported(format!("{name}_{other} is not supported")));
                            return ControlFlow::<()>::Continue(());
                        }
                    };
                    *e = Expr::Identifier(Ident::new(col));
                }
            }
            ControlFlow::Continue(())
        };
        for item in select.projection.iter_mut() {
            let _ = ast::visit_expressions_mut(item, &mut rename);
        }
        if let Some(h) = select.having.as_mut() {
            let _ = ast::visit_expressions_mut(h, &mut rename);
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `SELECT *, id FROM t`: the `*` (or `t.*`) of one catalog table spelt
/// out as its columns when another item repeats one of their names, so
/// [`uniquify_names`] can name the repeat `id0` as Flink does (DataFusion
/// expands the wildcard later and refuses the repeated name).
fn expand_wildcard_beside_columns(select: &mut Select, catalog: &Catalog) {
    let [from] = select.from.as_slice() else {
        return;
    };
    if !from.joins.is_empty() {
        return;
    }
    let TableFactor::Table {
        name,
        alias,
        args: None,
        ..
    } = &from.relation
    else {
        return;
    };
    let key = crate::parser::object_name(name);
    let Some(Entry::Table(def)) = catalog.get(&key) else {
        return;
    };
    let qualifier = alias
        .as_ref()
        .map(|a| a.name.value.clone())
        .or_else(|| name.0.last().and_then(|p| p.as_ident()).map(|i| i.value.clone()));
    let is_ours = |item: &ast::SelectItem| match item {
        ast::SelectItem::Wildcard(opts) => is_plain(opts),
        ast::SelectItem::QualifiedWildcard(ast::SelectItemQualifiedWildcardKind::ObjectName(q), opts) => {
            is_plain(opts) && q.0.last().and_then(|p| p.as_ident()).map(|i| &i.value) == qualifier.as_ref()
        }
        _ => false,
    };
    let named: HashSet<String> = select
        .projection
        .iter()
        .filter_map(|item| match item {
            ast::SelectItem::UnnamedExpr(Expr::Identifier(i)) => Some(i.value.clone()),
            ast::SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) => parts.last().map(|i| i.value.clone()),
            ast::SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            _ => None,
        })
        .collect();
    let repeats = def.columns.iter().any(|c| named.contains(&c.name));
    // An expression after the `*` is named by its position among the
    // expanded columns (`SELECT *, i * 2` of 11 columns: `EXPR$11`).
    let expression_after = select
        .projection
        .iter()
        .skip_while(|item| !is_ours(item))
        .any(|item| matches!(item, ast::SelectItem::UnnamedExpr(e) if column_name(e).is_none()));
    if !(repeats || expression_after) || !select.projection.iter().any(is_ours) {
        return;
    }
    let items = std::mem::take(&mut select.projection);
    for item in items {
        if is_ours(&item) {
            select.projection.extend(
                def.columns
                    .iter()
                    .map(|c| ast::SelectItem::UnnamedExpr(Expr::Identifier(Ident::with_quote('`', &c.name)))),
            );
        } else {
            select.projection.push(item);
        }
    }
}

/// A wildcard without `EXCEPT`, `REPLACE`, ... options.
fn is_plain(opts: &ast::WildcardAdditionalOptions) -> bool {
    opts.opt_ilike.is_none()
        && opts.opt_exclude.is_none()
        && opts.opt_except.is_none()
        && opts.opt_replace.is_none()
        && opts.opt_rename.is_none()
}

/// The name an unnamed select item has by itself in Flink: a column's
/// (however qualified or parenthesized); `None` for an expression.
fn column_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Identifier(i) => Some(i.value.clone()),
        Expr::CompoundIdentifier(parts) => parts.last().map(|i| i.value.clone()),
        Expr::Nested(inner) => column_name(inner),
        _ => None,
    }
}

/// Names a select list's unnamed items as Flink does: an expression is
/// `EXPR$<i>`, its position (DataFusion would name it by its text, as
/// `t.i + Int32(1)`), and a repeated column gets a number (`SELECT id, id`
/// gives columns `id` and `id0`, where DataFusion would refuse the
/// projection). After a `*` that could not be spelt out (a join's), an
/// expression's position is not known here: it keeps DataFusion's name.
fn uniquify_names(select: &mut Select) {
    let mut seen: HashSet<String> = HashSet::new();
    let mut taken: HashSet<String> = select
        .projection
        .iter()
        .filter_map(|item| match item {
            ast::SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            ast::SelectItem::UnnamedExpr(e) => column_name(e),
            _ => None,
        })
        .collect();
    let mut after_wildcard = false;
    for (position, item) in select.projection.iter_mut().enumerate() {
        let ast::SelectItem::UnnamedExpr(expr) = item else {
            after_wildcard |= matches!(
                item,
                ast::SelectItem::Wildcard(_) | ast::SelectItem::QualifiedWildcard(..)
            );
            continue;
        };
        if column_name(expr).is_none() && !after_wildcard {
            let alias = format!("EXPR${position}");
            taken.insert(alias.clone());
            *item = ast::SelectItem::ExprWithAlias {
                expr: expr.clone(),
                alias: Ident::new(alias),
            };
            continue;
        }
        // A column is named by its name, however qualified or quoted
        // (`a.id` and `b.id` of a join are `id` and `id0` in Flink).
        let name = column_name(expr);
        if seen.insert(name.clone().unwrap_or_else(|| expr.to_string())) {
            continue;
        }
        let alias = name
            .map(|name| {
                (0..)
                    .map(|k| format!("{name}{k}"))
                    .find(|n| !taken.contains(n))
                    .unwrap_or_default()
            })
            .unwrap_or_else(|| format!("EXPR${position}"));
        taken.insert(alias.clone());
        *item = ast::SelectItem::ExprWithAlias {
            expr: expr.clone(),
            alias: Ident::new(alias),
        };
    }
}

impl VisitorMut for Rewriter<'_> {
    type Break = SqlError;

    fn pre_visit_select(&mut self, select: &mut Select) -> ControlFlow<SqlError> {
        expand_wildcard_beside_columns(select, self.catalog);
        uniquify_names(select);
        match self.temporal_joins(select).and_then(|()| self.group_window(select)) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e),
        }
    }

    fn post_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<SqlError> {
        if matches!(factor, TableFactor::MatchRecognize { .. }) {
            use sqlparser::ast::Spanned;
            let start = factor.span().start;
            return ControlFlow::Break(crate::refusals::MATCH_RECOGNIZE.error().at(crate::error::Location {
                line: start.line,
                column: start.column,
            }));
        }
        let replaced = match factor {
            TableFactor::TableFunction { expr, alias } => self.tvf(expr, alias),
            TableFactor::Table {
                name,
                alias,
                args: None,
                ..
            } => self.view(name, alias),
            _ => Ok(None),
        };
        match replaced {
            Ok(Some(f)) => {
                *factor = f;
                ControlFlow::Continue(())
            }
            Ok(None) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e),
        }
    }

    fn post_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<SqlError> {
        // A query's ORDER BY orders NULL as Flink does (below every value).
        if let Some(ast::OrderBy {
            kind: ast::OrderByKind::Expressions(exprs),
            ..
        }) = query.order_by.as_mut()
        {
            for o in exprs {
                if o.options.nulls_first.is_none() {
                    o.options.nulls_first = Some(o.options.asc.unwrap_or(true));
                }
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<SqlError> {
        // Flink orders NULL below every value: first when ascending, last
        // when descending (DataFusion's default is the opposite).
        if let Expr::Function(f) = expr
            && let Some(ast::WindowType::WindowSpec(spec)) = f.over.as_mut()
        {
            for o in &mut spec.order_by {
                if o.options.nulls_first.is_none() {
                    o.options.nulls_first = Some(o.options.asc.unwrap_or(true));
                }
            }
        }
        if let Expr::Function(f) = expr
            && let [part] = f.name.0.as_mut_slice()
            && let Some(ident) = part.as_ident()
            && ident.quote_style.is_none()
        {
            // The span stays: errors about the call point at its name.
            let lower = Ident::with_span(ident.span, ident.value.to_ascii_lowercase());
            *part = ast::ObjectNamePart::Identifier(lower);
        }
        ControlFlow::Continue(())
    }
}

/// Wraps each cast in a function call's arguments in [`NAMED_FN`] with
/// the cast as written, so `AVG(x)` and `AVG(CAST(x AS DOUBLE))` get two
/// names (DataFusion names a cast as its operand, and an aggregate's
/// output schema refuses the repeated name). Only for a query that met
/// that refusal: every other plan stays as it was, and with it its
/// operators' uids.
pub fn name_casts_in_calls(query: &mut Query) {
    struct Namer {
        calls: usize,
    }
    impl VisitorMut for Namer {
        type Break = ();
        // Inside Weir's own calls (markers the planner reads back) casts
        // stay as they are.
        fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            if let Expr::Function(f) = e {
                self.calls += usize::from(!is_internal(f));
            }
            ControlFlow::Continue(())
        }
        fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            match e {
                Expr::Function(f) if !is_internal(f) => self.calls = self.calls.saturating_sub(1),
                Expr::Function(_) => {}
                Expr::Cast { .. } if self.calls > 0 => {
                    let written = e.to_string();
                    let cast = std::mem::replace(e, Expr::value(Value::Null));
                    *e = named(cast, written);
                }
                _ => {}
            }
            ControlFlow::Continue(())
        }
    }
    let _ = query.visit(&mut Namer { calls: 0 });
}

fn is_internal(f: &ast::Function) -> bool {
    f.name.to_string().starts_with(crate::functions::names::PREFIX)
}

fn named(value: Expr, written: String) -> Expr {
    let arg = |e: Expr| FunctionArg::Unnamed(FunctionArgExpr::Expr(e));
    Expr::Function(ast::Function {
        name: ObjectName::from(vec![Ident::new(NAMED_FN)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: vec![arg(value), arg(Expr::value(Value::SingleQuotedString(written)))],
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}
