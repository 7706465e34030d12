//! Counters a running job exposes (rows in/out per node, late rows).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

#[derive(Debug)]
pub struct NodeMetrics {
    pub name: String,
    pub rows_in: AtomicU64,
    pub rows_out: AtomicU64,
    pub late_rows_dropped: AtomicU64,
    /// Highest output watermark of any subtask of the node.
    pub watermark: AtomicI64,
}

impl NodeMetrics {
    pub fn new(name: String) -> Self {
        Self {
            name,
            rows_in: AtomicU64::new(0),
            rows_out: AtomicU64::new(0),
            late_rows_dropped: AtomicU64::new(0),
            watermark: AtomicI64::new(i64::MIN),
        }
    }
}

#[derive(Debug, Default)]
pub struct JobMetrics {
    pub nodes: Vec<Arc<NodeMetrics>>,
}

impl JobMetrics {
    pub fn late_rows_dropped(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.late_rows_dropped.load(Ordering::Relaxed))
            .sum()
    }

    /// One line per node: `name: in N, out M[, late L]`.
    pub fn summary(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let late = n.late_rows_dropped.load(Ordering::Relaxed);
                format!(
                    "{}: in {}, out {}{}",
                    n.name,
                    n.rows_in.load(Ordering::Relaxed),
                    n.rows_out.load(Ordering::Relaxed),
                    if late > 0 {
                        format!(", late dropped {late}")
                    } else {
                        String::new()
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
