//! Stable operator uids: what a checkpoint or savepoint matches state by.
//!
//! A node's uid is derived from what the node means in the SQL plan: its
//! kind, its inputs' uids and its defining expressions, written in a
//! canonical form Weir owns ([`canonical_expr`]: column indexes, Weir's
//! type names, operator symbols, function names, literals in Weir's row
//! encoding), never a dependency's `Display` text, and never parallelism.
//! So the same query gets the same uids in every build and at every
//! parallelism, and a savepoint taken at parallelism 2 restores into the
//! same query at 3. A node whose meaning changed gets a new uid: its old
//! state matches no operator (an error unless
//! `execution.state-recovery.ignore-unclaimed-state`).
//!
//! A user pins uids with `pipeline.operator-uids` = `'selector=uid,...'`
//! (selectors: `window` / `window#N` for the N-th window aggregate in plan
//! order, `limit`, `source:<table>`, `sink:<table>`), to keep an
//! operator's state across a change upstream of it. Nodes downstream of a
//! pinned one derive their uid from the pinned uid.

use std::sync::Arc;

use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal, NegativeExpr,
    NoOp, NotExpr, TryCastExpr,
};

use crate::checkpoint::metadata::checksum;
use crate::plan::{Exchange, NodeKind, StreamEdge, StreamGraph, StreamNode};
use crate::state::codec::{RowCodec, type_name};

/// Canonical text of a physical expression (Weir's, stable across builds).
pub fn canonical_expr(e: &Arc<dyn PhysicalExpr>) -> String {
    let children = |e: &Arc<dyn PhysicalExpr>| -> String {
        e.children()
            .iter()
            .map(|c| canonical_expr(c))
            .collect::<Vec<_>>()
            .join(",")
    };
    if let Some(c) = e.downcast_ref::<Column>() {
        return format!("#{}", c.index());
    }
    if let Some(l) = e.downcast_ref::<Literal>() {
        let v = l.value();
        let dt = v.data_type();
        let encoded = v
            .to_array()
            .ok()
            .and_then(|a| RowCodec::new(std::slice::from_ref(&dt)).ok()?.encode(&[a]).ok())
            .map(|rows| rows.iter().flatten().map(|b| format!("{b:02x}")).collect::<String>())
            // A type the row codec does not encode (an INTERVAL): its
            // value's debug text, which holds every field.
            .unwrap_or_else(|| format!("?{v:?}"));
        return format!("lit:{}:{encoded}", type_name(&dt));
    }
    // The same text as the expression it replaced: uids do not change
    // when Weir evaluates an expression another way.
    let shifted = e.downcast_ref::<crate::expr::TimestampShift>().map(|s| s.binary());
    if let Some(b) = e.downcast_ref::<BinaryExpr>().or(shifted) {
        return format!(
            "({} {} {})",
            canonical_expr(b.left()),
            b.op(),
            canonical_expr(b.right())
        );
    }
    if let Some(c) = e.downcast_ref::<CastExpr>() {
        return format!(
            "cast({} as {}{})",
            canonical_expr(c.expr()),
            type_name(c.cast_type()),
            cast_options(c.cast_options())
        );
    }
    if let Some(c) = e.downcast_ref::<TryCastExpr>() {
        return format!("try_cast({} as {})", canonical_expr(c.expr()), type_name(c.cast_type()));
    }
    if let Some(f) = e.downcast_ref::<ScalarFunctionExpr>() {
        return format!(
            "{}({}){}",
            f.name().to_ascii_lowercase(),
            children(e),
            function_parameters(f)
        );
    }
    if e.downcast_ref::<NotExpr>().is_some() {
        return format!("not({})", children(e));
    }
    if e.downcast_ref::<IsNullExpr>().is_some() {
        return format!("is_null({})", children(e));
    }
    if e.downcast_ref::<IsNotNullExpr>().is_some() {
        return format!("is_not_null({})", children(e));
    }
    if let Some(n) = e.downcast_ref::<NegativeExpr>() {
        return format!("neg({})", canonical_expr(n.arg()));
    }
    if let Some(i) = e.downcast_ref::<InListExpr>() {
        return format!(
            "{}in({};[{}])",
            if i.negated() { "not_" } else { "" },
            canonical_expr(i.expr()),
            canonical_exprs(i.list())
        );
    }
    if let Some(l) = e.downcast_ref::<LikeExpr>() {
        return format!(
            "{}{}({};{})",
            if l.negated() { "not_" } else { "" },
            if l.case_insensitive() { "ilike" } else { "like" },
            canonical_expr(l.expr()),
            canonical_expr(l.pattern())
        );
    }
    if let Some(c) = e.downcast_ref::<CaseExpr>() {
        let branches: Vec<String> = c
            .when_then_expr()
            .iter()
            .map(|(w, t)| format!("when {} then {}", canonical_expr(w), canonical_expr(t)))
            .collect();
        return format!(
            "case({};{};else {})",
            c.expr().map(canonical_expr).unwrap_or_default(),
            branches.join(";"),
            c.else_expr().map(canonical_expr).unwrap_or_else(|| "null".into())
        );
    }
    if e.downcast_ref::<NoOp>().is_some() {
        return "noop".into();
    }
    // Weir's watermark-bound call: the call it stands for.
    if let Some(w) = e.downcast_ref::<crate::expr::CurrentWatermark>() {
        return canonical_expr(w.call());
    }
    // A kind this describer does not know: its whole debug rendering,
    // every field included, so two such expressions of different meaning
    // never share a uid (at worst an upgrade that renders it differently
    // gives a new uid, and the restore is refused, never guessed).
    format!("unknown({e:?})")
}

/// Cast options other than DataFusion's default (`safe` turns a failed
/// cast into NULL instead of an error).
fn cast_options(o: &arrow::compute::CastOptions<'_>) -> String {
    let mut out = String::new();
    if o.safe {
        out.push_str(";safe");
    }
    if o.format_options != datafusion::common::format::DEFAULT_FORMAT_OPTIONS {
        out.push_str(&format!(";format={:?}", o.format_options));
    }
    out
}

/// What a function instance carries beyond its name and arguments (a
/// session zone, a target type, a seed): its debug rendering without
/// the signature and aliases, which the name already determines; empty
/// for a function without parameters, so their uids stay the name and
/// arguments. A function whose state would print differently in each run
/// (`Rand`'s generator, `FlinkScalar`'s function pointers) prints its
/// meaning instead: `tests/uid_properties.rs` records uids of such calls.
fn function_parameters(f: &ScalarFunctionExpr) -> String {
    let inner = f.fun().inner();
    let mut text = format!("{inner:?}");
    for (field, value) in [
        ("signature", format!("{:?}", inner.signature())),
        ("aliases", format!("{:?}", inner.aliases())),
    ] {
        let field = format!("{field}: {value}");
        for pattern in [format!(", {field}"), format!("{field}, "), field] {
            text = text.replace(&pattern, "");
        }
    }
    // `Name`, `Name { }` or `Name {  }`: nothing but the name is left.
    let after_name = text.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
    if after_name.chars().all(|c| c.is_whitespace() || c == '{' || c == '}') {
        String::new()
    } else {
        format!("{{{text}}}")
    }
}

fn canonical_exprs(es: &[Arc<dyn PhysicalExpr>]) -> String {
    es.iter().map(canonical_expr).collect::<Vec<_>>().join(",")
}

/// What a source adds to its table and connector, each only where it
/// departs from the plain case (so the uids of plain reads stay): the
/// columns it reads when not all of them (projection pushdown), its
/// computed columns, and its changelog when not insert-only (a format
/// such as `debezium-json` changes how downstream state is kept).
fn source_extras(s: &crate::plan::SourceNode, n: &crate::plan::StreamNode) -> String {
    let mut out = String::new();
    let all: Vec<&str> = s.table.columns.iter().map(|c| c.name.as_str()).collect();
    let read: Vec<&str> = n.schema.fields().iter().map(|f| f.name().as_str()).collect();
    if read != all {
        out.push_str(&format!(";columns={}", read.join(",")));
    }
    if let Some(c) = &s.computed {
        out.push_str(&format!(";computed={}", canonical_exprs(c)));
    }
    if !n.changelog.is_insert_only() {
        out.push_str(&format!(
            ";changelog={}{}{}",
            if n.changelog.updates { "U" } else { "" },
            if n.changelog.deletes { "D" } else { "" },
            if n.changelog.no_update_before {
                "-no-update-before"
            } else {
                ""
            }
        ));
    }
    out
}

/// A window aggregate call's IGNORE NULLS and ORDER BY, when given.
fn aggregate_extras(a: &datafusion::physical_expr::aggregate::AggregateFunctionExpr) -> String {
    let mut out = String::new();
    if a.ignore_nulls() {
        out.push_str(" ignore nulls");
    }
    let order = a.order_bys();
    if !order.is_empty() {
        let keys: Vec<String> = order
            .iter()
            .map(|k| {
                format!(
                    "{}:{}:{}",
                    canonical_expr(&k.expr),
                    !k.options.descending,
                    k.options.nulls_first
                )
            })
            .collect();
        out.push_str(&format!(" order by {}", keys.join(",")));
    }
    out
}

/// A window aggregate's grouping outputs when its window columns are not
/// in the order start, end, time (`GROUP BY window_end, window_start`
/// swaps two columns of one type: the same output types, another
/// meaning for every node downstream). Keys keep their GROUP BY order.
fn window_outputs(outputs: &[crate::plan::GroupOutput]) -> String {
    use crate::plan::GroupOutput;
    let rank = |o: &GroupOutput| match o {
        GroupOutput::WindowStart => Some(0),
        GroupOutput::WindowEnd => Some(1),
        GroupOutput::WindowTime => Some(2),
        GroupOutput::Key(_) => None,
    };
    let parts: Vec<i32> = outputs.iter().filter_map(rank).collect();
    if parts.windows(2).all(|p| p[0] < p[1]) {
        return String::new();
    }
    let cols: Vec<String> = outputs
        .iter()
        .map(|o| match o {
            GroupOutput::WindowStart => "start".to_string(),
            GroupOutput::WindowEnd => "end".to_string(),
            GroupOutput::WindowTime => "time".to_string(),
            GroupOutput::Key(i) => format!("k{i}"),
        })
        .collect();
    format!(";outputs={}", cols.join(","))
}

/// An OVER aggregate's output columns, when not its aggregates then its
/// LAGs in order.
fn over_outputs(o: &crate::plan::OverAggregateNode) -> String {
    use crate::plan::OverOutput;
    let natural: Vec<OverOutput> = (0..o.aggregates.len())
        .map(OverOutput::Aggregate)
        .chain((0..o.lags.len()).map(OverOutput::Lag))
        .collect();
    if o.outputs == natural {
        return String::new();
    }
    let cols: Vec<String> = o
        .outputs
        .iter()
        .map(|c| match c {
            OverOutput::Aggregate(i) => format!("a{i}"),
            OverOutput::Lag(i) => format!("l{i}"),
        })
        .collect();
    format!(";outputs={}", cols.join(","))
}

/// A graph of `nodes` (inputs before the nodes they feed) with their uids
/// assigned (`pinned`: `pipeline.operator-uids`). The uid module builds the
/// graph, so the plan's types do not depend on how uids are made.
pub fn graph(nodes: Vec<StreamNode>, edges: Vec<StreamEdge>, pinned: &[(String, String)]) -> StreamGraph {
    let mut g = StreamGraph { nodes, edges };
    let uids = assign(&g, pinned);
    for (n, uid) in g.nodes.iter_mut().zip(uids) {
        n.uid = uid;
    }
    g
}

/// The uid of every node, in node order (inputs come first), from its
/// canonical description; inputs are referred to by their uid, so a
/// node's uid covers everything upstream.
pub fn assign(graph: &StreamGraph, pinned: &[(String, String)]) -> Vec<String> {
    let mut uids: Vec<String> = Vec::with_capacity(graph.nodes.len());
    let mut ordinal: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for n in &graph.nodes {
        let inputs: Vec<String> = graph
            .inputs(n.id)
            .map(|e| {
                let how = match &e.exchange {
                    Exchange::Forward => "forward".to_string(),
                    Exchange::Hash(k) => format!("hash[{}]", canonical_exprs(k)),
                    Exchange::Rebalance => "rebalance".into(),
                    Exchange::Global => "global".into(),
                };
                // A join's right input says so (input 0 keeps the
                // single-input text, so existing uids stay).
                let port = if e.input > 0 {
                    format!(":in{}", e.input)
                } else {
                    String::new()
                };
                format!("{}:{how}{port}", uids.get(e.from).cloned().unwrap_or_default())
            })
            .collect();
        let out_types: Vec<String> = n.schema.fields().iter().map(|f| type_name(f.data_type())).collect();
        let (kind, body) = match &n.kind {
            NodeKind::Source(s) => (
                "source",
                format!("table={};connector={}", s.table.name, s.factory.name()) + &source_extras(s, n),
            ),
            NodeKind::Calc(c) => (
                "calc",
                format!(
                    "filter={};project={}",
                    c.filter.as_ref().map(canonical_expr).unwrap_or_default(),
                    c.projection.as_deref().map(canonical_exprs).unwrap_or_default()
                ),
            ),
            NodeKind::WindowAggregate(w) => (
                "window",
                format!(
                    "{:?}:{}:{}:{};time=#{};keys={};aggs={}",
                    w.window.kind,
                    w.window.size,
                    w.window.slide,
                    w.window.offset,
                    w.time_column,
                    canonical_exprs(&w.keys),
                    w.aggregates
                        .iter()
                        .map(|a| format!(
                            "{}{}({}){}",
                            a.fun().name().to_ascii_lowercase(),
                            if a.is_distinct() { " distinct" } else { "" },
                            canonical_exprs(&a.expressions()),
                            aggregate_extras(a)
                        ))
                        .collect::<Vec<_>>()
                        .join(",")
                ) + &window_outputs(&w.group_outputs)
                    + if w.proctime { ";proctime" } else { "" }
                    + if w.attached { ";attached" } else { "" },
            ),
            NodeKind::GroupAggregate(g) => (
                "group",
                format!(
                    "keys={};aggs={}",
                    canonical_exprs(&g.keys),
                    g.aggregates
                        .iter()
                        .map(|a| format!(
                            "{}{}({}){}:{}{}{}",
                            a.func.name().to_ascii_lowercase(),
                            if a.distinct { " distinct" } else { "" },
                            a.arg.as_ref().map(canonical_expr).unwrap_or_else(|| "*".into()),
                            a.filter
                                .as_ref()
                                .map(|f| format!(" filter {}", canonical_expr(f)))
                                .unwrap_or_default(),
                            type_name(&a.output_type),
                            a.separator
                                .as_ref()
                                .map(|s| format!(" separator {s:?}"))
                                .unwrap_or_default(),
                            if a.ignore_nulls { " ignore nulls" } else { "" }
                        ))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ),
            NodeKind::Join(j) => (
                "join",
                format!(
                    "{:?};left={};right={};filter={}{}",
                    j.join_type,
                    canonical_exprs(&j.left_keys),
                    canonical_exprs(&j.right_keys),
                    j.filter.as_ref().map(canonical_expr).unwrap_or_default(),
                    // The state layout: rows by unique key are not a
                    // multiset's entries (absent, the uid of before).
                    if j.unique_keys == [None, None] {
                        String::new()
                    } else {
                        format!(";unique={:?}", j.unique_keys)
                    },
                ) + &j
                    .interval
                    .map(|b| {
                        format!(";interval={},{},{},{}", b.left_time, b.right_time, b.lower, b.upper)
                            + if b.proctime { ";proctime" } else { "" }
                    })
                    .unwrap_or_default()
                    + &j.window.map(|[l, r]| format!(";window={l},{r}")).unwrap_or_default()
                    + &j.temporal
                        .map(|[l, r]| format!(";temporal={l},{r}"))
                        .unwrap_or_default(),
            ),
            NodeKind::Union => ("union", String::new()),
            NodeKind::Rank(r) => (
                "rank",
                format!(
                    "{:?};n={};rank={};partition={};order={}",
                    r.strategy,
                    r.limit,
                    r.with_rank,
                    canonical_exprs(&r.partition),
                    r.order
                        .iter()
                        .map(|k| format!("{}:{}:{}", canonical_expr(&k.expr), k.asc, k.nulls_first))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ),
            NodeKind::Limit(l) => ("limit", format!("skip={};fetch={}", l.skip, l.fetch)),
            NodeKind::TemporalSort(t) => (
                "temporal_sort",
                format!(
                    "time={};order={}",
                    t.time_column,
                    t.order
                        .iter()
                        .map(|k| format!("{}:{}:{}", canonical_expr(&k.expr), k.asc, k.nulls_first))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ),
            NodeKind::OverAggregate(o) => (
                "over_aggregate",
                format!(
                    "time={};frame={:?};partition={};aggs={}",
                    o.time_column,
                    o.frame,
                    canonical_exprs(&o.partition),
                    o.aggregates
                        .iter()
                        .map(|a| a.name().to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ) + &o
                    .lags
                    .iter()
                    .map(|l| {
                        format!(";lag={}:{}", canonical_expr(&l.arg), l.offset)
                            + &if l.default.is_null() {
                                String::new()
                            } else {
                                format!(
                                    ":default={}",
                                    canonical_expr(
                                        &(Arc::new(Literal::new(l.default.clone())) as Arc<dyn PhysicalExpr>)
                                    )
                                )
                            }
                    })
                    .collect::<String>()
                    + &over_outputs(o),
            ),
            NodeKind::SessionWindow(w) => (
                "session_window",
                format!(
                    "gap={};time={};partition={}",
                    w.gap,
                    w.time_column,
                    canonical_exprs(&w.partition)
                ) + &w.zone.as_ref().map(|z| format!(";zone={}", z.id)).unwrap_or_default(),
            ),
            NodeKind::UpsertMaterialize(m) => (
                "upsert_materialize",
                format!("key={};upsert={:?}", canonical_exprs(&m.key), m.upsert_key),
            ),
            NodeKind::ChangelogNormalize(c) => ("changelog_normalize", format!("key={}", canonical_exprs(&c.key))),
            NodeKind::Sink(s) => ("sink", format!("table={};connector={}", s.name, s.factory.name())),
        };
        let text = format!("{kind}|{body}|in=[{}]|out=[{}]", inputs.join(";"), out_types.join(","));
        let nth = ordinal.entry(kind).or_insert(0);
        *nth += 1;
        let selectors = match &n.kind {
            NodeKind::Source(s) => vec![format!("source:{}", s.table.name)],
            NodeKind::Sink(s) => vec![format!("sink:{}", s.name)],
            _ if *nth == 1 => vec![kind.to_string(), format!("{kind}#1")],
            _ => vec![format!("{kind}#{nth}")],
        };
        let given = pinned
            .iter()
            .find(|(sel, _)| selectors.iter().any(|s| s.eq_ignore_ascii_case(sel)))
            .map(|(_, uid)| uid.clone());
        let mut uid = given.unwrap_or_else(|| format!("{kind}_{}", &checksum(text.as_bytes())[..12]));
        // Two nodes that mean the same (the same projection of a source
        // read by both sides of a self-join) still need their own uids:
        // the later one is numbered, in node order, so stably.
        if uids.contains(&uid) {
            let base = uid.clone();
            let mut k = 2;
            while uids.contains(&uid) {
                uid = format!("{base}-{k}");
                k += 1;
            }
        }
        uids.push(uid);
    }
    uids
}
