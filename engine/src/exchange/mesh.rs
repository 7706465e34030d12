//! The links of one worker to every other worker of the job: one
//! connection per pair. Worker `I` connects to every worker with a higher
//! index and accepts one from every worker with a lower index. Each hello
//! names the worker and the hash of the job's plan. A connection from a
//! worker started with other SQL, or another worker count, is refused by
//! name instead of exchanging rows under different meanings.
//!
//! Workers start in any order: a Kubernetes StatefulSet with parallel pod
//! management starts them at once. So a connection is retried until the
//! deadline, and a peer that never answers is an error naming its address.

use std::collections::HashMap;
use std::time::Duration;

use tokio::net::TcpListener;

use super::link::{Link, LinkError};

/// This worker's links, by peer index.
pub struct Mesh {
    pub index: u32,
    links: HashMap<u32, Link>,
}

/// Why a worker could not join its peers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    #[error("worker {index} is not one of the {workers} workers in --peers")]
    NotAPeer { index: u32, workers: usize },
    #[error("worker {peer} at {addr} did not answer within {waited:?}: {reason}")]
    Unreachable {
        peer: u32,
        addr: String,
        waited: Duration,
        reason: String,
    },
    #[error(
        "worker {peer} runs another job (plan {theirs:016x}, here {ours:016x}): start every worker with the same SQL file and --peers"
    )]
    OtherPlan { peer: u32, theirs: u64, ours: u64 },
    #[error("a connection from worker {peer}, which should not connect to worker {index}: {why}")]
    Unexpected { peer: u32, index: u32, why: String },
    #[error(transparent)]
    Link(#[from] LinkError),
}

impl Mesh {
    /// Joins the workers at `peers` (this one is `peers[index]`, listening
    /// on `listener`) for the job whose plan hashes to `plan`, waiting up
    /// to `deadline` for all of them.
    pub async fn join(
        index: u32,
        listener: TcpListener,
        peers: &[String],
        plan: u64,
        deadline: Duration,
    ) -> Result<Mesh, MeshError> {
        Self::join_with(index, listener, peers, plan, deadline, None).await
    }

    /// [`Mesh::join`], every link over TLS when `tls` is given.
    pub async fn join_with(
        index: u32,
        listener: TcpListener,
        peers: &[String],
        plan: u64,
        deadline: Duration,
        tls: Option<super::tls::LinkTls>,
    ) -> Result<Mesh, MeshError> {
        let accept_tls = tls.clone();
        let n = peers.len();
        if index as usize >= n {
            return Err(MeshError::NotAPeer { index, workers: n });
        }
        let until = tokio::time::Instant::now() + deadline;
        // Accept the lower-index workers while connecting to the higher.
        let expected = index;
        let accepting = tokio::spawn(async move {
            let mut links = HashMap::new();
            while links.len() < expected as usize {
                let accepted = tokio::time::timeout_at(until, listener.accept()).await;
                let Ok(Ok((stream, _))) = accepted else {
                    let missing: Vec<u32> = (0..expected).filter(|p| !links.contains_key(p)).collect();
                    return Err(missing);
                };
                // A connection that does not say hello in time is dropped.
                let Ok(hello) = tokio::time::timeout_at(until, Link::accept_with(stream, accept_tls.as_ref())).await
                else {
                    continue;
                };
                let Ok((peer, theirs, link)) = hello else { continue };
                links.insert(peer, (theirs, link));
            }
            Ok(links)
        });
        let mut links = HashMap::new();
        for peer in index + 1..n as u32 {
            let addr = &peers[peer as usize];
            // The most telling failure (a refused certificate, a broken
            // protocol) beats the last one (the peer gone by then).
            let mut telling: Option<String> = None;
            let link = loop {
                match Link::connect_with(addr, index, plan, peer, tls.as_ref()).await {
                    Ok(link) => break link,
                    Err(e) if tokio::time::Instant::now() >= until => {
                        accepting.abort();
                        return Err(MeshError::Unreachable {
                            peer,
                            addr: addr.clone(),
                            waited: deadline,
                            reason: telling.unwrap_or_else(|| e.to_string()),
                        });
                    }
                    // Not listening yet: it starts in its own time.
                    Err(e) => {
                        let text = e.to_string();
                        if matches!(e, LinkError::Protocol { .. }) || text.contains("TLS") {
                            telling = Some(text);
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                }
            };
            links.insert(peer, link);
        }
        let accepted = match accepting.await {
            Ok(Ok(a)) => a,
            Ok(Err(missing)) => {
                let peer = missing.first().copied().unwrap_or_default();
                return Err(MeshError::Unreachable {
                    peer,
                    addr: peers.get(peer as usize).cloned().unwrap_or_default(),
                    waited: deadline,
                    reason: format!("workers {missing:?} did not connect"),
                });
            }
            Err(e) => {
                return Err(MeshError::Link(LinkError::Lost {
                    peer: u32::MAX,
                    reason: format!("accepting connections: {e}"),
                }));
            }
        };
        for (peer, (theirs, link)) in accepted {
            if peer >= index {
                return Err(MeshError::Unexpected {
                    peer,
                    index,
                    why: format!("worker {index} connects to it (higher indexes are connected to)"),
                });
            }
            if theirs != plan {
                return Err(MeshError::OtherPlan {
                    peer,
                    theirs,
                    ours: plan,
                });
            }
            links.insert(peer, link);
        }
        Ok(Mesh { index, links })
    }

    /// The link to worker `peer` (none to this worker itself).
    pub fn link(&self, peer: u32) -> Option<&Link> {
        self.links.get(&peer)
    }

    /// How many workers the job has, this one included.
    pub fn workers(&self) -> usize {
        self.links.len() + 1
    }

    /// See [`Link::set_heartbeat_timeout`].
    pub fn set_heartbeat_timeout(&self, timeout: Duration) {
        for link in self.links.values() {
            link.set_heartbeat_timeout(timeout);
        }
    }

    /// Sends what is queued on every link and closes them (a last control
    /// message must reach its peer before this process exits).
    pub async fn close(&self) {
        for link in self.links.values() {
            link.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::StreamMessage;

    async fn listeners(n: usize) -> (Vec<TcpListener>, Vec<String>) {
        let mut ls = vec![];
        let mut addrs = vec![];
        for _ in 0..n {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            addrs.push(l.local_addr().expect("addr").to_string());
            ls.push(l);
        }
        (ls, addrs)
    }

    /// Three workers, started in reverse order, each joined to the other
    /// two by one connection, and a message between any pair.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_workers_join_in_any_order_and_talk_pairwise() {
        let (ls, addrs) = listeners(3).await;
        let mut joins = vec![];
        for (i, l) in ls.into_iter().enumerate().rev() {
            let addrs = addrs.clone();
            joins.push(tokio::spawn(async move {
                Mesh::join(i as u32, l, &addrs, 0xfeed, Duration::from_secs(20)).await
            }));
        }
        let mut meshes: Vec<Mesh> = vec![];
        for j in joins {
            meshes.push(j.await.expect("join").expect("mesh"));
        }
        meshes.sort_by_key(|m| m.index);
        for m in &meshes {
            assert_eq!(m.workers(), 3);
            assert!(m.link(m.index).is_none());
        }
        for (from, to) in [(0u32, 2u32), (2, 1), (1, 0)] {
            let ch = from * 10 + to;
            let tx = meshes[from as usize]
                .link(to)
                .expect("link")
                .sender(ch)
                .expect("sender");
            let mut rx = meshes[to as usize]
                .link(from)
                .expect("link")
                .receiver(ch, 1)
                .expect("receiver");
            tx.send(StreamMessage::Watermark(i64::from(ch))).await.expect("send");
            assert!(matches!(rx.recv().await, Some(StreamMessage::Watermark(w)) if w == i64::from(ch)));
        }
    }

    /// A worker with another plan is refused by name; a peer that never
    /// comes is an error naming its address, at the deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_plan_or_a_missing_peer_is_an_error_naming_the_worker() {
        let (mut ls, addrs) = listeners(2).await;
        let l1 = ls.pop().expect("listener");
        let l0 = ls.pop().expect("listener");
        let a = addrs.clone();
        let one = tokio::spawn(async move { Mesh::join(1, l1, &a, 2, Duration::from_secs(20)).await });
        let zero = Mesh::join(0, l0, &addrs, 1, Duration::from_secs(20)).await;
        // Worker 0 connected; worker 1 finds the other plan.
        assert!(zero.is_ok());
        let e = one.await.expect("join").err().expect("refused");
        assert_eq!(
            e,
            MeshError::OtherPlan {
                peer: 0,
                theirs: 1,
                ours: 2
            }
        );
        assert!(e.to_string().contains("same SQL file"), "{e}");
        // Worker 1 of 2 never starts.
        let (mut ls, addrs) = listeners(2).await;
        drop(ls.pop());
        let l0 = ls.pop().expect("listener");
        let e = Mesh::join(0, l0, &addrs, 1, Duration::from_millis(500))
            .await
            .err()
            .expect("unreachable");
        assert!(
            matches!(&e, MeshError::Unreachable { peer: 1, addr, .. } if *addr == addrs[1]),
            "{e}"
        );
        let (mut ls, addrs) = listeners(1).await;
        let l = ls.pop().expect("listener");
        assert_eq!(
            Mesh::join(3, l, &addrs, 1, Duration::from_secs(1)).await.err(),
            Some(MeshError::NotAPeer { index: 3, workers: 1 })
        );
    }
}
