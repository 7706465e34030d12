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

pub use crate::canonical::canonical_expr;
use crate::canonical::canonical_exprs;
use crate::checkpoint::metadata::checksum;
use crate::plan::{Exchange, NodeKind, StreamEdge, StreamGraph, StreamNode};
use crate::state::codec::type_name;

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
        let (kind, body) = n.kind.spec().uid_body(n);
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
