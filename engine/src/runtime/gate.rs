//! The input gate of a subtask: merges its input channels into one ordered
//! stream of events and runs the watermark valve (Flink's
//! `StatusWatermarkValve`):
//! - output watermark = min over active channels, emitted only when it
//!   increases (it never regresses);
//! - an idle channel is left out of the min; a channel that becomes active
//!   below the current output does not hold it back until it catches up;
//! - when every channel is idle the gate is idle; when every channel ended,
//!   the gate ends.

use std::future::poll_fn;
use std::task::Poll;

use arrow::record_batch::RecordBatch;
use tokio::sync::mpsc::Receiver;

use crate::message::{Barrier, MIN_WATERMARK, StreamMessage, Timestamp, WatermarkStatus};

#[derive(Debug)]
pub enum GateEvent {
    Batch(RecordBatch),
    Watermark(Timestamp),
    Status(WatermarkStatus),
    Barrier(Barrier),
    End,
}

struct Channel {
    rx: Receiver<StreamMessage>,
    watermark: Timestamp,
    idle: bool,
    ended: bool,
}

pub struct InputGate {
    channels: Vec<Channel>,
    output_watermark: Timestamp,
    idle: bool,
    next_poll: usize,
}

impl InputGate {
    pub fn new(receivers: Vec<Receiver<StreamMessage>>) -> Self {
        Self {
            channels: receivers
                .into_iter()
                .map(|rx| Channel {
                    rx,
                    watermark: MIN_WATERMARK,
                    idle: false,
                    ended: false,
                })
                .collect(),
            output_watermark: MIN_WATERMARK,
            idle: false,
            next_poll: 0,
        }
    }

    /// The next event. Channels are polled round-robin so one busy input
    /// cannot starve the others.
    pub async fn next(&mut self) -> GateEvent {
        loop {
            let (index, msg) = poll_fn(|cx| {
                let n = self.channels.len();
                let mut all_ended = true;
                for i in 0..n {
                    let idx = (self.next_poll + i) % n;
                    let ch = &mut self.channels[idx];
                    if ch.ended {
                        continue;
                    }
                    all_ended = false;
                    if let Poll::Ready(m) = ch.rx.poll_recv(cx) {
                        self.next_poll = (idx + 1) % n;
                        return Poll::Ready(Some((idx, m)));
                    }
                }
                if all_ended { Poll::Ready(None) } else { Poll::Pending }
            })
            .await
            .unwrap_or((usize::MAX, None));
            if index == usize::MAX {
                return GateEvent::End;
            }
            match msg {
                // A dropped sender without EndOfInput means the upstream
                // task stopped (failure or cancel): treat as ended; the job
                // reports the upstream error.
                None | Some(StreamMessage::EndOfInput) => {
                    self.channels[index].ended = true;
                    if self.channels.iter().all(|c| c.ended) {
                        return GateEvent::End;
                    }
                    if let Some(ev) = self.recompute() {
                        return ev;
                    }
                }
                Some(StreamMessage::Batch(b)) => return GateEvent::Batch(b),
                Some(StreamMessage::Barrier(b)) => return GateEvent::Barrier(b),
                Some(StreamMessage::Watermark(w)) => {
                    let ch = &mut self.channels[index];
                    if w <= ch.watermark {
                        continue;
                    }
                    ch.watermark = w;
                    ch.idle = false;
                    if let Some(ev) = self.recompute() {
                        return ev;
                    }
                }
                Some(StreamMessage::WatermarkStatus(s)) => {
                    self.channels[index].idle = s == WatermarkStatus::Idle;
                    let all_idle = self.channels.iter().all(|c| c.idle || c.ended);
                    if all_idle && !self.idle {
                        self.idle = true;
                        return GateEvent::Status(WatermarkStatus::Idle);
                    }
                    if !all_idle && self.idle {
                        self.idle = false;
                        return GateEvent::Status(WatermarkStatus::Active);
                    }
                    if let Some(ev) = self.recompute() {
                        return ev;
                    }
                }
            }
        }
    }

    /// Min over active, not-ended channels; an event if it advanced.
    fn recompute(&mut self) -> Option<GateEvent> {
        let active = self
            .channels
            .iter()
            .filter(|c| !c.idle && !c.ended && c.watermark >= self.output_watermark);
        // Ended channels are out of the min: a bounded producer sent MAX
        // before ending; a stopped one must not fire anything on its way out.
        let candidate = active.map(|c| c.watermark).min()?;
        // Channels that are active but below the output (just became active)
        // are unaligned: they do not hold the output back.
        if candidate > self.output_watermark {
            self.output_watermark = candidate;
            return Some(GateEvent::Watermark(candidate));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::channel;

    async fn expect_wm(gate: &mut InputGate, w: i64) {
        match gate.next().await {
            GateEvent::Watermark(x) => assert_eq!(x, w),
            other => panic!("expected watermark {w}, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn min_over_channels_never_regresses_and_skips_idle() {
        let (a_tx, a) = channel(16);
        let (b_tx, b) = channel(16);
        let mut gate = InputGate::new(vec![a, b]);
        a_tx.send(StreamMessage::Watermark(10)).await.expect("send");
        b_tx.send(StreamMessage::Watermark(5)).await.expect("send");
        expect_wm(&mut gate, 5).await;
        b_tx.send(StreamMessage::WatermarkStatus(WatermarkStatus::Idle))
            .await
            .expect("send");
        // b idle: the min is a's 10.
        expect_wm(&mut gate, 10).await;
        // b comes back below the output: it is unaligned and neither pulls
        // the output back nor holds it (Flink's valve).
        b_tx.send(StreamMessage::Watermark(7)).await.expect("send");
        a_tx.send(StreamMessage::Watermark(20)).await.expect("send");
        expect_wm(&mut gate, 20).await;
        // b catches up past the output: aligned again, and now holds it.
        // (A batch behind it on the same channel proves it was consumed.)
        b_tx.send(StreamMessage::Watermark(25)).await.expect("send");
        b_tx.send(StreamMessage::Batch(RecordBatch::new_empty(std::sync::Arc::new(
            arrow::datatypes::Schema::empty(),
        ))))
        .await
        .expect("send");
        assert!(matches!(gate.next().await, GateEvent::Batch(_)));
        a_tx.send(StreamMessage::Watermark(40)).await.expect("send");
        expect_wm(&mut gate, 25).await;
        a_tx.send(StreamMessage::EndOfInput).await.expect("send");
        b_tx.send(StreamMessage::Watermark(30)).await.expect("send");
        expect_wm(&mut gate, 30).await;
        drop(b_tx);
        assert!(matches!(gate.next().await, GateEvent::End));
    }
}
