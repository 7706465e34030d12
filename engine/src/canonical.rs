//! Canonical text of plan expressions: what uids ([`crate::uid`]) are
//! made of. Weir's own form (column indexes, Weir's type names, operator
//! symbols, function names, literals in Weir's row encoding), never a
//! dependency's `Display` text, so the same query gets the same uids in
//! every build. A leaf: each plan node's `uid_body` (beside its operator)
//! writes its expressions with it.

use std::sync::Arc;

use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal, NegativeExpr,
    NoOp, NotExpr, TryCastExpr,
};

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

/// [`canonical_expr`] of each, comma-separated.
pub fn canonical_exprs(es: &[Arc<dyn PhysicalExpr>]) -> String {
    es.iter().map(canonical_expr).collect::<Vec<_>>().join(",")
}

/// A window aggregate call's IGNORE NULLS and ORDER BY, when given.
pub fn aggregate_extras(a: &datafusion::physical_expr::aggregate::AggregateFunctionExpr) -> String {
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

/// A sort key's canonical text: expression, ascending, nulls first.
pub fn sort_key(expr: &Arc<dyn PhysicalExpr>, asc: bool, nulls_first: bool) -> String {
    format!("{}:{}:{}", canonical_expr(expr), asc, nulls_first)
}
