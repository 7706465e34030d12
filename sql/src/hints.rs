//! Query hints: `SELECT /*+ STATE_TTL('orders' = '1d', 'o' = '12h') */ ...`.
//!
//! Flink's `STATE_TTL` hint sets the state TTL of a regular join's input
//! sides and of a non-windowed GROUP BY, by the name or alias of the
//! input, in place of `table.exec.state.ttl`. A hint's keys must name
//! tables or aliases of its own SELECT's FROM clause (else Flink's
//! message refuses it); values are durations (`1d`, `12 h`, `500 ms`).
//! The join strategy hints Flink ignores in streaming mode (`BROADCAST`,
//! `SHUFFLE_HASH`, `SHUFFLE_MERGE`, `NEST_LOOP`) are ignored too; any other
//! hint is refused by name.

use std::collections::HashMap;
use std::time::Duration;

use sqlparser::ast::{self, SetExpr, TableFactor};
use sqlparser::tokenizer::{Token, Tokenizer};

use weir_catalog::store::Entry;
use weir_catalog::{Catalog, TableDef};

use crate::error::{Result, SqlError};

/// Input name (lowercase) → TTL, from every SELECT of `query`.
pub fn state_ttl_hints(query: &ast::Query) -> Result<HashMap<String, Duration>> {
    let mut out: HashMap<String, Duration> = HashMap::new();
    visit_query(query, &mut out)?;
    Ok(out)
}

fn visit_query(q: &ast::Query, out: &mut HashMap<String, Duration>) -> Result<()> {
    if let Some(with) = &q.with {
        for cte in &with.cte_tables {
            visit_query(&cte.query, out)?;
        }
    }
    visit_set_expr(&q.body, out)
}

fn visit_set_expr(e: &SetExpr, out: &mut HashMap<String, Duration>) -> Result<()> {
    match e {
        SetExpr::Select(s) => visit_select(s, out),
        SetExpr::Query(q) => visit_query(q, out),
        SetExpr::SetOperation { left, right, .. } => {
            visit_set_expr(left, out)?;
            visit_set_expr(right, out)
        }
        _ => Ok(()),
    }
}

fn visit_select(s: &ast::Select, out: &mut HashMap<String, Duration>) -> Result<()> {
    // The names this SELECT's FROM gives its inputs, and the subqueries
    // in it (their own SELECTs may carry hints too).
    let mut names: Vec<String> = vec![];
    for t in &s.from {
        visit_factor(&t.relation, &mut names, out)?;
        for j in &t.joins {
            visit_factor(&j.relation, &mut names, out)?;
        }
    }
    for hint in &s.optimizer_hints {
        if !hint.prefix.is_empty() {
            continue;
        }
        for (name, args) in parse_hints(&hint.text)? {
            match name.to_ascii_uppercase().as_str() {
                "STATE_TTL" => {
                    let mut unmatched = vec![];
                    for (key, value) in args {
                        let Some(value) = value else {
                            return Err(SqlError::plan(format!(
                                "STATE_TTL hint: '{key}' needs a duration: STATE_TTL('{key}' = '1d')"
                            )));
                        };
                        let ttl = weir_catalog::options::parse_duration(&value).ok_or_else(|| {
                            SqlError::plan(format!(
                                "STATE_TTL hint: '{value}' (for '{key}') is not a duration such as '1d', '12 h' or '500 ms'"
                            ))
                        })?;
                        if !names.iter().any(|n| n.eq_ignore_ascii_case(&key)) {
                            unmatched.push(key);
                            continue;
                        }
                        let key = key.to_ascii_lowercase();
                        if out.get(&key).is_some_and(|t| *t != ttl) {
                            return Err(SqlError::plan(format!(
                                "STATE_TTL hints give '{key}' two different TTLs; name the inputs apart with aliases"
                            )));
                        }
                        out.insert(key, ttl);
                    }
                    if !unmatched.is_empty() {
                        let list: Vec<String> = unmatched.iter().map(|k| format!("`{k}`")).collect();
                        return Err(SqlError::plan(format!(
                            "The options of following hints cannot match the name of input tables or views: \
                             {} in `STATE_TTL` (this SELECT reads: {})",
                            list.join(", "),
                            names.join(", ")
                        )));
                    }
                }
                // Batch join strategies: Flink ignores them on streams.
                "BROADCAST" | "SHUFFLE_HASH" | "SHUFFLE_MERGE" | "NEST_LOOP" => {}
                other => {
                    return Err(SqlError::unsupported(format!(
                        "the query hint {other} is not supported (Weir reads STATE_TTL)"
                    )));
                }
            }
        }
    }
    Ok(())
}

fn visit_factor(f: &TableFactor, names: &mut Vec<String>, out: &mut HashMap<String, Duration>) -> Result<()> {
    match f {
        TableFactor::Table { name, alias, .. } => {
            if let Some(last) = name.0.last().and_then(|p| p.as_ident()) {
                names.push(last.value.clone());
            }
            if let Some(a) = alias {
                names.push(a.name.value.clone());
            }
        }
        TableFactor::Derived { subquery, alias, .. } => {
            visit_query(subquery, out)?;
            if let Some(a) = alias {
                names.push(a.name.value.clone());
            }
        }
        TableFactor::NestedJoin {
            table_with_joins,
            alias,
        } => {
            visit_factor(&table_with_joins.relation, names, out)?;
            for j in &table_with_joins.joins {
                visit_factor(&j.relation, names, out)?;
            }
            if let Some(a) = alias {
                names.push(a.name.value.clone());
            }
        }
        _ => {}
    }
    Ok(())
}

/// A hint's name and its `'key' = 'value'` pairs (a bare name, as the
/// join hints list tables, has no value).
pub(crate) type Hint = (String, Vec<(String, Option<String>)>);

/// `NAME('k' = 'v', ...) [, NAME(...)]` as (name, pairs).
pub(crate) fn parse_hints(text: &str) -> Result<Vec<Hint>> {
    let bad = |why: &str| SqlError::plan(format!("hint /*+{text}*/: {why}"));
    let tokens = Tokenizer::new(&crate::dialect::dialect(), text)
        .tokenize()
        .map_err(|e| bad(&e.to_string()))?;
    let mut tokens = tokens
        .into_iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .peekable();
    let mut out = vec![];
    while let Some(t) = tokens.next() {
        let name = match t {
            Token::Word(w) => w.value,
            Token::Comma => continue,
            other => return Err(bad(&format!("expected a hint name, found {other}"))),
        };
        let mut pairs = vec![];
        if tokens.peek() == Some(&Token::LParen) {
            tokens.next();
            loop {
                match tokens.next() {
                    Some(Token::RParen) => break,
                    Some(Token::Comma) => continue,
                    Some(Token::SingleQuotedString(k)) => {
                        if tokens.next() != Some(Token::Eq) {
                            return Err(bad(&format!("expected '=' after '{k}'")));
                        }
                        match tokens.next() {
                            Some(Token::SingleQuotedString(v)) => pairs.push((k, Some(v))),
                            _ => return Err(bad(&format!("expected a quoted value for '{k}'"))),
                        }
                    }
                    Some(Token::Word(w)) => {
                        // Join strategy hints list table names.
                        pairs.push((w.value, None));
                    }
                    Some(other) => return Err(bad(&format!("unexpected {other}"))),
                    None => return Err(bad("missing ')'")),
                }
            }
        }
        out.push((name, pairs));
    }
    Ok(out)
}

/// Flink's dynamic table options: each `t /*+ OPTIONS('k' = 'v') */` of
/// `query` (the parser hands it over as `t(__weir_options('k', 'v'))`)
/// reads a table of `t`'s definition with those options in place of its
/// own, checked as the table's own options are (an unknown key, a bad
/// value or a path outside the allowed directories is refused by name,
/// when planned and again when the job starts). Returns the query with
/// each hinted reference naming its own entry of a catalog that holds
/// them (the table keeps its name: EXPLAIN, uids and SHOW WATERMARKS say
/// `t`), or `None` when the query has no such hint.
pub fn dynamic_options(query: &ast::Query, catalog: &Catalog) -> Result<Option<(ast::Query, Catalog)>> {
    use std::ops::ControlFlow;

    use sqlparser::ast::{FunctionArg, FunctionArgExpr, Ident, ObjectName, TableAlias, VisitMut, VisitorMut};

    struct Hinted<'a> {
        catalog: &'a Catalog,
        entries: Vec<(String, TableDef)>,
        error: Option<SqlError>,
    }

    impl Hinted<'_> {
        fn take(&mut self, factor: &mut TableFactor) -> Result<()> {
            let TableFactor::Table { name, alias, args, .. } = factor else {
                return Ok(());
            };
            let Some(a) = args.as_ref() else { return Ok(()) };
            let call = match a.args.as_slice() {
                [FunctionArg::Unnamed(FunctionArgExpr::Expr(ast::Expr::Function(f)))]
                    if f.name.to_string().eq_ignore_ascii_case(crate::udf::OPTIONS_FN) =>
                {
                    f
                }
                _ => return Ok(()),
            };
            let mut values = vec![];
            if let ast::FunctionArguments::List(list) = &call.args {
                for arg in &list.args {
                    match arg {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(ast::Expr::Value(v))) => match &v.value {
                            ast::Value::SingleQuotedString(s) => values.push(s.clone()),
                            other => return Err(SqlError::internal(format!("an OPTIONS hint value {other}"))),
                        },
                        other => return Err(SqlError::internal(format!("an OPTIONS hint argument {other}"))),
                    }
                }
            }
            let table = crate::dialect::object_name(name);
            let def = match self.catalog.get(&table) {
                Some(Entry::Table(def)) => def,
                Some(Entry::View(_)) => {
                    return Err(SqlError::plan(format!(
                        "hint OPTIONS: '{table}' is a view; dynamic options apply to tables"
                    )));
                }
                None => return Err(SqlError::not_found(format!("table '{table}' does not exist"))),
            };
            let mut def = def.clone();
            for pair in values.chunks(2) {
                if let [k, v] = pair {
                    def.options.insert(k.clone(), v.clone());
                }
            }
            // Checked as the table's own options: an unknown key or a bad
            // value names the option (the job checks paths again).
            weir_engine::connectors::validate_table(&def)
                .map_err(|e| SqlError::plan(format!("hint OPTIONS of table '{table}': {e}")))?;
            let key = format!("{table}{}{}", crate::udf::OPTIONS_FN, self.entries.len() + 1);
            if alias.is_none() {
                // Columns stay qualified by the table's own name.
                *alias = Some(TableAlias {
                    explicit: false,
                    name: name
                        .0
                        .last()
                        .and_then(|p| p.as_ident().cloned())
                        .unwrap_or_else(|| Ident::new(&table)),
                    columns: vec![],
                    at: None,
                });
            }
            *name = ObjectName::from(vec![Ident::with_quote('`', &key)]);
            *args = None;
            self.entries.push((key, def));
            Ok(())
        }
    }

    impl VisitorMut for Hinted<'_> {
        type Break = ();

        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
            match self.take(factor) {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    self.error = Some(e);
                    ControlFlow::Break(())
                }
            }
        }
    }

    let mut query = query.clone();
    let mut hinted = Hinted {
        catalog,
        entries: vec![],
        error: None,
    };
    let _ = query.visit(&mut hinted);
    if let Some(e) = hinted.error {
        return Err(e);
    }
    if hinted.entries.is_empty() {
        return Ok(None);
    }
    let mut extra = Catalog::in_memory();
    for (key, def) in hinted.entries {
        extra.insert(key, Entry::Table(def));
    }
    Ok(Some((query, catalog.overlaid(&extra))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hints(sql: &str) -> Result<HashMap<String, Duration>> {
        let stmts = sqlparser::parser::Parser::parse_sql(&crate::dialect::dialect(), sql).expect("parse");
        let ast::Statement::Query(q) = &stmts[0] else {
            panic!("not a query")
        };
        state_ttl_hints(q)
    }

    #[test]
    fn state_ttl_hints_name_the_inputs_of_their_select() {
        let h = hints(
            "SELECT /*+ STATE_TTL('o' = '1d', 'Lineitem' = '12 h') */ * FROM orders o JOIN lineitem ON o.k = lineitem.k",
        )
        .expect("hints");
        assert_eq!(h.get("o"), Some(&Duration::from_secs(86_400)));
        assert_eq!(h.get("lineitem"), Some(&Duration::from_secs(43_200)));
        // In a subquery's own SELECT.
        let h = hints("SELECT * FROM (SELECT /*+ STATE_TTL('t' = '500 ms') */ k, COUNT(*) FROM t GROUP BY k) x")
            .expect("hints");
        assert_eq!(h.get("t"), Some(&Duration::from_millis(500)));
        // Flink's join strategy hints are ignored.
        assert!(hints("SELECT /*+ BROADCAST(t) */ * FROM t").expect("hints").is_empty());
    }

    #[test]
    fn bad_hints_are_refused_by_name() {
        let e = hints("SELECT /*+ STATE_TTL('x' = '1d') */ * FROM t").expect_err("unmatched");
        assert!(
            e.to_string()
                .contains("cannot match the name of input tables or views: `x`"),
            "{e}"
        );
        let e = hints("SELECT /*+ STATE_TTL('t' = 'soon') */ * FROM t").expect_err("duration");
        assert!(e.to_string().contains("'soon' (for 't') is not a duration"), "{e}");
        let e = hints("SELECT /*+ LOOKUP('table' = 't') */ * FROM t").expect_err("unknown");
        assert!(e.to_string().contains("query hint LOOKUP is not supported"), "{e}");
        let e = hints("SELECT /*+ STATE_TTL('t' '1d') */ * FROM t").expect_err("syntax");
        assert!(e.to_string().contains("expected '=' after 't'"), "{e}");
    }
}
