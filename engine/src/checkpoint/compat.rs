//! Whether a checkpoint or savepoint can be restored into a job.
//!
//! State is matched to operators by uid ([`crate::uid`]), so the snapshot
//! may come from another parallelism or an upgraded query. Refused, before
//! anything starts, with a message naming the operator and the option to
//! change: state no operator claims (unless
//! `execution.state-recovery.ignore-unclaimed-state`), a changed
//! `pipeline.max-parallelism` (key groups cannot change), changed key
//! types of an operator, another key encoding, and in-flight data of an
//! unaligned checkpoint at another parallelism.

use std::collections::BTreeMap;

use super::CheckpointError;
use super::metadata::{CheckpointMetadata, OperatorInfo};
use crate::config::{IGNORE_UNCLAIMED_STATE, JobConfig, MAX_PARALLELISM};
use crate::plan::{StateKeys, StreamGraph};
use crate::state::codec::{self, type_name};

/// What a snapshot records about each operator of `graph`.
pub fn operator_info(graph: &StreamGraph) -> BTreeMap<String, OperatorInfo> {
    graph
        .nodes
        .iter()
        .map(|n| {
            let info = OperatorInfo {
                description: n.describe(),
                parallelism: n.parallelism,
                key_types: key_types(graph, n.id),
                keys_recorded: true,
            };
            (n.uid.clone(), info)
        })
        .collect()
}

/// Weir's names of the key types of a keyed node (empty for a node
/// without keyed state or with one key for all rows).
fn key_types(graph: &StreamGraph, id: usize) -> Vec<String> {
    let StateKeys::Keyed(keys) = graph.node(id).kind.state_keys() else {
        return vec![];
    };
    let Some(input) = graph.inputs(id).next().map(|e| graph.node(e.from).schema.clone()) else {
        return vec![];
    };
    keys.iter()
        .map(|k| k.data_type(&input).map_or_else(|e| format!("?{e}"), |t| type_name(&t)))
        .collect()
}

/// The uids of the snapshot whose state is restored into `graph`:
/// everything, or an error naming what cannot be.
pub fn check(meta: &CheckpointMetadata, graph: &StreamGraph, config: &JobConfig) -> Result<(), CheckpointError> {
    let what = if meta.savepoint.is_some() {
        "savepoint"
    } else {
        "checkpoint"
    };
    if meta.max_parallelism != config.max_parallelism {
        return Err(CheckpointError::Incompatible(format!(
            "the {what} was taken with '{MAX_PARALLELISM}' = {} and the job has {}: state is split into that \
             many key groups and cannot be split differently; set '{MAX_PARALLELISM}' = '{}'",
            meta.max_parallelism, config.max_parallelism, meta.max_parallelism
        )));
    }
    if meta.key_format != codec::FORMAT_VERSION {
        return Err(CheckpointError::Incompatible(format!(
            "the {what} encodes state in version {} of Weir's state format; this build reads version {}",
            meta.key_format,
            codec::FORMAT_VERSION
        )));
    }
    let with_state = meta
        .operators
        .keys()
        .filter_map(|k| k.split('/').next())
        .chain(meta.sources.keys().map(String::as_str));
    let mut unclaimed = vec![];
    for uid in with_state {
        let Some(node) = graph.by_uid(uid) else {
            if !unclaimed.contains(&uid) {
                unclaimed.push(uid);
            }
            continue;
        };
        let Some(info) = meta.operator_info.get(uid) else {
            continue;
        };
        let now = key_types(graph, node.id);
        // Snapshots before every keyed kind recorded its keys (SESSION
        // windows and OVER aggregates recorded none): nothing to compare.
        let unrecorded = !info.keys_recorded && info.key_types.is_empty();
        if now != info.key_types && !unrecorded {
            return Err(CheckpointError::Incompatible(format!(
                "operator {uid} ({}) kept state keyed by ({}) and is now keyed by ({}): key types cannot change",
                info.description,
                info.key_types.join(", "),
                now.join(", ")
            )));
        }
        let has_in_flight = meta
            .operators
            .keys()
            .any(|k| k.starts_with(&format!("{uid}/")) && k.contains("/in-flight"));
        if has_in_flight && node.parallelism != info.parallelism {
            return Err(CheckpointError::Incompatible(format!(
                "the unaligned checkpoint holds in-flight data of operator {uid} ({}) at parallelism {}; it \
                 restores only at that parallelism (now {}). Restore at parallelism {} and take a savepoint \
                 (always aligned) to rescale",
                info.description, info.parallelism, node.parallelism, info.parallelism
            )));
        }
    }
    if !unclaimed.is_empty() && !config.ignore_unclaimed_state {
        let names: Vec<String> = unclaimed
            .iter()
            .map(|u| match meta.operator_info.get(*u) {
                Some(i) => format!("{u} ({})", i.description),
                None => u.to_string(),
            })
            .collect();
        return Err(CheckpointError::Incompatible(format!(
            "the {what} holds state of {} that matches no operator of this query (the query changed \
             where that state belongs); to start without it, SET '{IGNORE_UNCLAIMED_STATE}' = 'true'",
            names.join(", ")
        )));
    }
    Ok(())
}
