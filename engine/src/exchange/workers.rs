//! Who the workers of a job spread over processes are, and how one joins
//! the others (`weir worker`'s flags). Kept apart from the runtime (it
//! sits in every `JobConfig`), so it needs nothing of the plan.

use std::time::Duration;

use tokio::net::TcpListener;

use super::mesh::Mesh;
use crate::error::{ExecError, Result};

/// This process's place among the job's workers.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// This worker's index in `peers`.
    pub index: u32,
    /// Every worker's address, this one's included.
    pub peers: Vec<String>,
    /// Where this worker listens (default: its entry in `peers`).
    pub listen: Option<String>,
    /// How long a worker waits for the others to be there.
    pub join_deadline: Duration,
    /// How long a peer may be silent (no heartbeat) before it counts as
    /// lost: a stopped, hung or cut-off worker keeps its socket open.
    pub heartbeat_timeout: Duration,
    /// Mutual TLS on every link (`--tls-cert/--tls-key/--tls-ca`).
    pub tls: Option<crate::exchange::tls::LinkTls>,
}

impl Cluster {
    pub fn workers(&self) -> usize {
        self.peers.len()
    }

    /// The worker that runs subtask `subtask` of every chain.
    pub fn worker_of(&self, subtask: usize) -> u32 {
        (subtask % self.peers.len().max(1)) as u32
    }

    pub fn is_local(&self, subtask: usize) -> bool {
        self.worker_of(subtask) == self.index
    }

    /// Worker 0 runs the job's coordinator.
    pub fn coordinates(&self) -> bool {
        self.index == 0
    }

    /// Joins the other workers (waiting up to the deadline for them).
    pub async fn join(&self, plan: u64) -> Result<Mesh> {
        let addr = self
            .listen
            .clone()
            .or_else(|| self.peers.get(self.index as usize).cloned())
            .ok_or_else(|| {
                ExecError::Cluster(format!(
                    "worker {} is not in --peers ({} workers)",
                    self.index,
                    self.peers.len()
                ))
            })?;
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|e| ExecError::Cluster(format!("worker {} cannot listen on {addr}: {e}", self.index)))?;
        let mesh = Mesh::join_with(
            self.index,
            listener,
            &self.peers,
            plan,
            self.join_deadline,
            self.tls.clone(),
        )
        .await
        .map_err(|e| ExecError::Cluster(format!("worker {}: {e}", self.index)))?;
        mesh.set_heartbeat_timeout(self.heartbeat_timeout);
        Ok(mesh)
    }
}
