//! Remote channels joined to the bounded in-memory channels operators
//! already use, so that a task's output and an input gate do not know
//! whether a channel crosses a process: on the sending worker a task
//! takes the output channel's messages and sends them on the link; on
//! the receiving worker a task takes the link's and puts them into the
//! gate's channel. Back-pressure passes through unchanged: a gate that
//! does not read a channel (blocked by barrier alignment, or slow) leaves
//! its in-memory channel full, the receiving task stops taking, no credit
//! goes back, and the sender waits — on that channel only.

use tokio::sync::mpsc;

use super::link::{LinkError, RemoteReceiver, RemoteSender};
use crate::message::StreamMessage;

/// Sends every message of `local` on `remote`, through `EndOfInput`. An
/// upstream that stopped without it (its task failed) is an error: the
/// worker then fails, and its peers see the connection go, as a local
/// gate sees a channel dropped.
pub async fn forward_out(mut local: mpsc::Receiver<StreamMessage>, remote: RemoteSender) -> Result<(), LinkError> {
    while let Some(m) = local.recv().await {
        let end = matches!(m, StreamMessage::EndOfInput);
        let barrier = matches!(m, StreamMessage::Barrier(_));
        remote.send(m).await?;
        if barrier {
            // A crash test's moment: a barrier on its way to another
            // worker, its checkpoint not yet complete.
            crate::failpoint::failpoint("exchange.barrier_sent");
        }
        if end {
            return Ok(());
        }
    }
    Err(LinkError::Lost {
        peer: remote.peer(),
        reason: "the sending task stopped before the end of its input".into(),
    })
}

/// Puts every message of `remote` into `local`, through `EndOfInput`.
/// The connection lost first: returns the error, and `local` is dropped
/// without `EndOfInput` (the gate reads that as the upstream stopped).
pub async fn forward_in(
    mut remote: RemoteReceiver,
    local: mpsc::Sender<StreamMessage>,
    lost: impl Fn() -> Option<LinkError>,
) -> Result<(), LinkError> {
    while let Some(m) = remote.recv().await {
        let end = matches!(m, StreamMessage::EndOfInput);
        if local.send(m).await.is_err() {
            // The consuming task is gone: it ended or failed on its own.
            return Ok(());
        }
        if end {
            return Ok(());
        }
    }
    Err(lost().unwrap_or(LinkError::Lost {
        peer: u32::MAX,
        reason: "the connection was closed".into(),
    }))
}

/// The unaligned-checkpoint lane of a channel (barriers that overtake
/// data) sent on `remote`: its barriers, then `EndOfInput` once the
/// sending task dropped it, so the receiving side ends too.
pub async fn forward_lane_out(
    mut local: mpsc::UnboundedReceiver<crate::message::Barrier>,
    remote: RemoteSender,
) -> Result<(), LinkError> {
    while let Some(b) = local.recv().await {
        remote.send(StreamMessage::Barrier(b)).await?;
    }
    remote.send(StreamMessage::EndOfInput).await
}

/// The receiving side of [`forward_lane_out`].
pub async fn forward_lane_in(
    mut remote: RemoteReceiver,
    local: mpsc::UnboundedSender<crate::message::Barrier>,
    lost: impl Fn() -> Option<LinkError>,
) -> Result<(), LinkError> {
    while let Some(m) = remote.recv().await {
        match m {
            StreamMessage::Barrier(b) => {
                if local.send(b).is_err() {
                    return Ok(());
                }
            }
            StreamMessage::EndOfInput => return Ok(()),
            other => {
                return Err(LinkError::Protocol {
                    peer: u32::MAX,
                    reason: format!("a barrier lane carried {other:?}"),
                });
            }
        }
    }
    Err(lost().unwrap_or(LinkError::Lost {
        peer: u32::MAX,
        reason: "the connection was closed".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::link::pair;
    use crate::message::{Barrier, BarrierKind};
    use crate::runtime::gate::{GateEvent, InputGate};
    use std::sync::Arc;

    fn barrier(id: u64) -> StreamMessage {
        StreamMessage::Barrier(Barrier {
            checkpoint_id: id,
            timestamp: 0,
            kind: BarrierKind::Checkpoint,
        })
    }

    fn row(v: i64) -> StreamMessage {
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            "v",
            arrow::datatypes::DataType::Int64,
            false,
        )]));
        StreamMessage::Batch(
            arrow::record_batch::RecordBatch::try_new(schema, vec![Arc::new(arrow::array::Int64Array::from(vec![v]))])
                .expect("batch")
                .into(),
        )
    }

    /// The one value of a one-row batch from the gate.
    fn value(e: GateEvent) -> i64 {
        match e {
            GateEvent::Batch(_, b) => b
                .rows
                .column(0)
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("i64")
                .value(0),
            other => panic!("expected a row, got {other:?}"),
        }
    }

    /// Exactly-once barrier alignment with both of a gate's channels
    /// coming over the network from another worker: after its barrier a
    /// channel is not read, so its sender stalls once the in-memory
    /// channel and the credits are full, while the other channel's rows
    /// still flow up to its barrier; the checkpoint's barrier then comes
    /// out of the gate once, and the held-back rows follow, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn barriers_align_across_the_network_and_hold_back_only_their_channel() {
        let (sending_worker, receiving_worker) = pair().await;
        let mut upstream = vec![];
        let mut gate_inputs = vec![];
        for ch in 0..2u32 {
            // The sending worker: a task's output channel, forwarded out.
            let (out_tx, out_rx) = mpsc::channel(2);
            tokio::spawn(forward_out(out_rx, sending_worker.sender(ch).expect("sender")));
            upstream.push(out_tx);
            // The receiving worker: the gate's channel, fed from the link.
            let (in_tx, in_rx) = mpsc::channel(2);
            let remote = receiving_worker.receiver(ch, 2).expect("receiver");
            tokio::spawn(forward_in(remote, in_tx, || None));
            gate_inputs.push(in_rx);
        }
        let mut gate = InputGate::new(gate_inputs);
        // Channel 0 reaches barrier 1 first, then keeps producing.
        upstream[0].send(barrier(1)).await.expect("send");
        let ahead = upstream[0].clone();
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = sent.clone();
        let producer = tokio::spawn(async move {
            for v in 100..200 {
                ahead.send(row(v)).await.expect("send");
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        // Channel 1's rows before its barrier all come through the gate,
        // though channel 0's side of the network is full.
        for v in 0..50 {
            upstream[1].send(row(v)).await.expect("send");
            assert_eq!(value(gate.next().await), v, "only channel 1's pre-barrier rows");
        }
        // Channel 0's producer is held back: past its barrier at most what
        // the path holds is sent (output channel 2, the forwarder 1, the
        // credits 2, the receiving forwarder 1, the gate's channel 2).
        let held = sent.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            held <= 8,
            "channel 0 sent {held} rows past its barrier before the alignment"
        );
        upstream[1].send(barrier(1)).await.expect("send");
        match gate.next().await {
            GateEvent::Barrier(b, _) => assert_eq!(b.checkpoint_id, 1),
            other => panic!("expected the aligned barrier, got {other:?}"),
        }
        // Channel 0's rows after its barrier now flow, all of them, in order.
        for v in 100..200 {
            assert_eq!(value(gate.next().await), v, "channel 0's rows in order");
        }
        producer.await.expect("producer");
        for tx in &upstream {
            tx.send(StreamMessage::EndOfInput).await.expect("send");
        }
        assert!(matches!(gate.next().await, GateEvent::End));
    }

    /// The sending worker gone mid-stream: the gate's channel ends without
    /// `EndOfInput`, as when a local upstream task stops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_worker_ends_the_gate_channel_without_end_of_input() {
        let (sending_worker, receiving_worker) = pair().await;
        let (out_tx, out_rx) = mpsc::channel(2);
        tokio::spawn(forward_out(out_rx, sending_worker.sender(0).expect("sender")));
        let (in_tx, mut in_rx) = mpsc::channel(2);
        let remote = receiving_worker.receiver(0, 2).expect("receiver");
        let receiving = Arc::new(receiving_worker);
        let r = receiving.clone();
        let forwarder = tokio::spawn(forward_in(remote, in_tx, move || r.failure()));
        out_tx.send(row(1)).await.expect("send");
        assert!(matches!(in_rx.recv().await, Some(StreamMessage::Batch(_))));
        drop(sending_worker);
        assert!(in_rx.recv().await.is_none(), "the channel ended");
        let e = forwarder.await.expect("join").expect_err("lost");
        assert!(matches!(e, LinkError::Lost { peer: 0, .. }), "{e}");
    }
}
