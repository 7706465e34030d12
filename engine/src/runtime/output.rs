//! The output side of a subtask: partitions batches to downstream subtasks
//! (forward, hash by key group, rebalance, global) and broadcasts control
//! messages (watermarks, statuses, barriers, end of input) to all of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::UInt32Array;
use datafusion::physical_expr::PhysicalExpr;
use tokio::sync::mpsc::{Sender, UnboundedSender};

use crate::change::ChangeBatch;
use crate::error::Result;
use crate::keygroup::{KeyEncoder, key_group, subtask_for_group};
use crate::message::{Barrier, StreamMessage};

pub enum Partitioner {
    /// Exactly one downstream channel.
    Forward,
    Hash {
        keys: Vec<Arc<dyn PhysicalExpr>>,
        encoder: KeyEncoder,
        max_parallelism: u16,
    },
    Rebalance {
        next: usize,
    },
}

/// Where the last operator of a chain sends its output.
pub enum Output {
    /// To the subtasks of the next node.
    Channels {
        senders: Vec<Sender<StreamMessage>>,
        partitioner: Partitioner,
        /// Senders whose receiver is gone (downstream finished early).
        closed: Vec<bool>,
        /// Priority lanes (unaligned checkpoints): barrier announcements
        /// that overtake the data queued in `senders`.
        priority: Vec<UnboundedSender<Barrier>>,
        /// Where the time spent waiting for a full channel is added (ns).
        backpressured: Option<Arc<AtomicU64>>,
    },
    /// The rows of a bare `SELECT`, to the session that asked.
    Results(Sender<ChangeBatch>),
    /// A sink chain: nothing leaves the task.
    None,
    /// One node feeding several consumers (a table read once by both sides
    /// of a self-join, a stream both aggregated and joined): every batch
    /// and control message goes to each, in the same order, so each
    /// consumer sees the barriers and watermarks in place among its rows.
    Fanout(Vec<Output>),
}

impl Output {
    pub fn channels(senders: Vec<Sender<StreamMessage>>, partitioner: Partitioner) -> Self {
        let closed = vec![false; senders.len()];
        Output::Channels {
            senders,
            partitioner,
            closed,
            priority: vec![],
            backpressured: None,
        }
    }

    /// Counts the time sends wait for a full downstream channel into
    /// `counter` (nanoseconds; the back-pressure metric).
    pub fn with_backpressure_counter(mut self, counter: Arc<AtomicU64>) -> Self {
        if let Output::Channels { backpressured, .. } = &mut self {
            *backpressured = Some(counter);
        }
        self
    }

    /// This output and `other` both: a second consumer of the same node.
    pub fn and(self, other: Output) -> Self {
        match self {
            Output::Fanout(mut all) => {
                all.push(other);
                Output::Fanout(all)
            }
            Output::None => other,
            one => Output::Fanout(vec![one, other]),
        }
    }

    /// Adds priority lanes, one per sender, in the same order.
    pub fn with_priority(mut self, lanes: Vec<UnboundedSender<Barrier>>) -> Self {
        if let Output::Channels { priority, .. } = &mut self {
            *priority = lanes;
        }
        self
    }

    /// Announces barrier `b` ahead of all queued data (unaligned
    /// checkpoints); a no-op without priority lanes.
    pub fn announce(&self, b: Barrier) {
        match self {
            Output::Channels { priority, .. } => {
                for lane in priority {
                    // A gone receiver finished: it needs no barrier.
                    let _ = lane.send(b);
                }
            }
            Output::Fanout(all) => all.iter().for_each(|o| o.announce(b)),
            Output::Results(_) | Output::None => {}
        }
    }

    /// True when nobody downstream will read anything more.
    pub fn is_closed(&self) -> bool {
        match self {
            // Checked on the sender too: a task whose rows are all filtered
            // out never sends, yet must learn that its consumer is gone.
            Output::Channels { closed, senders, .. } => closed.iter().zip(senders).all(|(c, tx)| *c || tx.is_closed()),
            Output::Results(tx) => tx.is_closed(),
            Output::None => false,
            Output::Fanout(all) => all.iter().all(Output::is_closed),
        }
    }

    /// True when a downstream channel is full: sending now would wait.
    pub fn is_back_pressured(&self) -> bool {
        match self {
            Output::Channels { senders, closed, .. } => {
                senders.iter().zip(closed).any(|(tx, c)| !*c && tx.capacity() == 0)
            }
            Output::Results(tx) => tx.capacity() == 0,
            Output::None => false,
            Output::Fanout(all) => all.iter().any(Output::is_back_pressured),
        }
    }

    pub async fn send_batch(&mut self, batch: ChangeBatch) -> Result<()> {
        let counter = match &*self {
            Output::Channels {
                backpressured: Some(c), ..
            } if self.is_back_pressured() => Some(c.clone()),
            _ => None,
        };
        let Some(counter) = counter else {
            return self.send_batch_now(batch).await;
        };
        let started = std::time::Instant::now();
        let result = self.send_batch_now(batch).await;
        counter.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        result
    }

    async fn send_batch_now(&mut self, batch: ChangeBatch) -> Result<()> {
        match self {
            Output::None => Ok(()),
            Output::Fanout(all) => {
                // Boxed: the future recurses into the inner outputs. A
                // batch's clone shares its arrays.
                for o in all.iter_mut() {
                    Box::pin(o.send_batch(batch.clone())).await?;
                }
                Ok(())
            }
            Output::Results(tx) => {
                // A closed result channel means the client stopped reading
                // (Ctrl-C or LIMIT on its side): not an error.
                let _ = tx.send(batch).await;
                Ok(())
            }
            Output::Channels {
                senders,
                partitioner,
                closed,
                ..
            } => match partitioner {
                Partitioner::Forward => send(&senders[0], &mut closed[0], StreamMessage::Batch(batch)).await,
                Partitioner::Rebalance { next } => {
                    let i = *next % senders.len();
                    *next = next.wrapping_add(1);
                    send(&senders[i], &mut closed[i], StreamMessage::Batch(batch)).await
                }
                Partitioner::Hash {
                    keys,
                    encoder,
                    max_parallelism,
                } => {
                    let n = senders.len();
                    if n == 1 {
                        return send(&senders[0], &mut closed[0], StreamMessage::Batch(batch)).await;
                    }
                    let arrays = keys
                        .iter()
                        .map(|k| k.evaluate(&batch.rows).and_then(|v| v.into_array(batch.num_rows())))
                        .collect::<Result<Vec<_>, _>>()?;
                    let rows = encoder.encode(&arrays)?;
                    let mut per_target: Vec<Vec<u32>> = vec![vec![]; n];
                    for (i, row) in rows.iter().enumerate() {
                        let g = key_group(row, *max_parallelism);
                        per_target[subtask_for_group(g, *max_parallelism, n)].push(i as u32);
                    }
                    for (t, idx) in per_target.into_iter().enumerate() {
                        if idx.is_empty() {
                            continue;
                        }
                        let part = if idx.len() == batch.num_rows() {
                            batch.clone()
                        } else {
                            batch.take(&UInt32Array::from(idx))?
                        };
                        send(&senders[t], &mut closed[t], StreamMessage::Batch(part)).await?;
                    }
                    Ok(())
                }
            },
        }
    }

    /// Sends a control message to every downstream subtask.
    pub async fn broadcast(&mut self, msg: StreamMessage) -> Result<()> {
        match self {
            Output::Channels { senders, closed, .. } => {
                for (tx, c) in senders.iter().zip(closed.iter_mut()) {
                    send(tx, c, msg.clone()).await?;
                }
            }
            Output::Fanout(all) => {
                for o in all.iter_mut() {
                    Box::pin(o.broadcast(msg.clone())).await?;
                }
            }
            Output::Results(_) | Output::None => {}
        }
        Ok(())
    }
}

async fn send(tx: &Sender<StreamMessage>, closed: &mut bool, msg: StreamMessage) -> Result<()> {
    if *closed {
        return Ok(());
    }
    if tx.send(msg).await.is_err() {
        // The receiver is gone: it finished early (LIMIT) or failed; the
        // job reports a failure from the task that failed.
        *closed = true;
    }
    Ok(())
}
