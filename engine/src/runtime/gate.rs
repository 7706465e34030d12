//! The input gate of a subtask: merges its input channels into one ordered
//! stream of events and runs the watermark valve (Flink's
//! `StatusWatermarkValve`):
//! - output watermark = min over active channels, emitted only when it
//!   increases (it never regresses);
//! - an idle channel is left out of the min; a channel that becomes active
//!   below the current output does not hold it back until it catches up;
//! - when every channel is idle the gate is idle; when every channel ended,
//!   the gate ends.
//!
//! It also aligns checkpoint barriers (Flink's
//! `SingleCheckpointBarrierHandler`): in exactly-once mode, a channel that
//! delivered barrier N is blocked (not read) until every open channel has
//! delivered it; then the gate yields the barrier once and unblocks them.
//! A newer barrier abandons an older alignment; an old or repeated barrier
//! is dropped; a channel that ends no longer counts. At-least-once only
//! counts barriers, without blocking.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::task::Poll;
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use tokio::sync::mpsc::Receiver;

use crate::checkpoint::CheckpointMode;
use crate::message::{Barrier, MIN_WATERMARK, StreamMessage, Timestamp, WatermarkStatus};

#[derive(Debug)]
pub enum GateEvent {
    Batch(RecordBatch),
    Watermark(Timestamp),
    Status(WatermarkStatus),
    /// Barrier N was received on every open channel; with the time from
    /// the first to the last (alignment).
    Barrier(Barrier, Duration),
    End,
}

struct Channel {
    rx: Receiver<StreamMessage>,
    watermark: Timestamp,
    idle: bool,
    ended: bool,
    /// Delivered the barrier being aligned (exactly-once: not read).
    barrier_seen: bool,
}

struct Alignment {
    barrier: Barrier,
    started: Instant,
}

pub struct InputGate {
    channels: Vec<Channel>,
    output_watermark: Timestamp,
    idle: bool,
    next_poll: usize,
    mode: CheckpointMode,
    aligning: Option<Alignment>,
    /// Highest barrier id yielded.
    last_barrier: u64,
    /// Events produced together (a channel end completing an alignment
    /// and moving the watermark), yielded in order.
    queued: VecDeque<GateEvent>,
}

impl InputGate {
    pub fn new(receivers: Vec<Receiver<StreamMessage>>) -> Self {
        Self::with_mode(receivers, CheckpointMode::ExactlyOnce)
    }

    pub fn with_mode(receivers: Vec<Receiver<StreamMessage>>, mode: CheckpointMode) -> Self {
        Self {
            channels: receivers
                .into_iter()
                .map(|rx| Channel {
                    rx,
                    watermark: MIN_WATERMARK,
                    idle: false,
                    ended: false,
                    barrier_seen: false,
                })
                .collect(),
            output_watermark: MIN_WATERMARK,
            idle: false,
            next_poll: 0,
            mode,
            aligning: None,
            last_barrier: 0,
            queued: VecDeque::new(),
        }
    }

    /// Records barrier `b` from channel `index`; the barrier event if it
    /// completed the alignment.
    fn on_barrier(&mut self, index: usize, b: Barrier) -> Option<GateEvent> {
        if b.checkpoint_id <= self.last_barrier {
            return None;
        }
        match &self.aligning {
            Some(a) if a.barrier.checkpoint_id == b.checkpoint_id => {}
            Some(a) if a.barrier.checkpoint_id > b.checkpoint_id => return None,
            _ => {
                // A newer checkpoint subsumes the one being aligned.
                for c in &mut self.channels {
                    c.barrier_seen = false;
                }
                self.aligning = Some(Alignment {
                    barrier: b,
                    started: Instant::now(),
                });
            }
        }
        self.channels[index].barrier_seen = true;
        self.complete_alignment()
    }

    /// Yields the barrier when every open channel delivered it.
    fn complete_alignment(&mut self) -> Option<GateEvent> {
        let a = self.aligning.as_ref()?;
        if !self.channels.iter().all(|c| c.ended || c.barrier_seen) {
            return None;
        }
        let event = GateEvent::Barrier(a.barrier, a.started.elapsed());
        self.last_barrier = a.barrier.checkpoint_id;
        self.aligning = None;
        for c in &mut self.channels {
            c.barrier_seen = false;
        }
        Some(event)
    }

    /// The next event. Channels are polled round-robin so one busy input
    /// cannot starve the others.
    pub async fn next(&mut self) -> GateEvent {
        if let Some(ev) = self.queued.pop_front() {
            return ev;
        }
        let blocking = self.mode == CheckpointMode::ExactlyOnce;
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
                    if blocking && ch.barrier_seen {
                        // Aligning: data after the barrier waits.
                        continue;
                    }
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
                    // The ended channel no longer counts toward alignment.
                    let barrier = self.complete_alignment();
                    let wm = self.recompute();
                    match (barrier, wm) {
                        (Some(b), Some(w)) => {
                            self.queued.push_back(w);
                            return b;
                        }
                        (Some(ev), None) | (None, Some(ev)) => return ev,
                        (None, None) => {}
                    }
                }
                Some(StreamMessage::Batch(b)) => return GateEvent::Batch(b),
                Some(StreamMessage::Barrier(b)) => {
                    if let Some(ev) = self.on_barrier(index, b) {
                        return ev;
                    }
                }
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

    fn barrier(id: u64) -> StreamMessage {
        StreamMessage::Barrier(Barrier {
            checkpoint_id: id,
            timestamp: 0,
        })
    }

    fn one_row() -> StreamMessage {
        StreamMessage::Batch(RecordBatch::new_empty(std::sync::Arc::new(
            arrow::datatypes::Schema::empty(),
        )))
    }

    async fn expect_barrier(gate: &mut InputGate, id: u64) {
        match gate.next().await {
            GateEvent::Barrier(b, _) => assert_eq!(b.checkpoint_id, id),
            other => panic!("expected barrier {id}, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn exactly_once_blocks_a_channel_after_its_barrier_until_all_arrive() {
        let (a_tx, a) = channel(16);
        let (b_tx, b) = channel(16);
        let mut gate = InputGate::new(vec![a, b]);
        a_tx.send(barrier(1)).await.expect("send");
        // Data after the barrier on a must not be read before b's barrier.
        a_tx.send(StreamMessage::Watermark(99)).await.expect("send");
        b_tx.send(one_row()).await.expect("send");
        assert!(
            matches!(gate.next().await, GateEvent::Batch(_)),
            "b's pre-barrier data flows"
        );
        b_tx.send(barrier(1)).await.expect("send");
        expect_barrier(&mut gate, 1).await;
        // A repeated barrier is dropped; a's post-barrier data flows now.
        b_tx.send(barrier(1)).await.expect("send");
        b_tx.send(StreamMessage::Watermark(50)).await.expect("send");
        expect_wm(&mut gate, 50).await;
    }

    #[tokio::test]
    async fn a_newer_barrier_subsumes_an_unfinished_alignment() {
        let (a_tx, a) = channel(16);
        let (b_tx, b) = channel(16);
        let mut gate = InputGate::new(vec![a, b]);
        a_tx.send(barrier(1)).await.expect("send");
        a_tx.send(barrier(2)).await.expect("send");
        // b skipped checkpoint 1 (its barrier was lost with an abort).
        b_tx.send(barrier(2)).await.expect("send");
        // a is blocked on 1; b's barrier 2 starts checkpoint 2, which
        // unblocks a, whose barrier 2 completes it.
        expect_barrier(&mut gate, 2).await;
        b_tx.send(barrier(1)).await.expect("send");
        b_tx.send(one_row()).await.expect("send");
        assert!(matches!(gate.next().await, GateEvent::Batch(_)), "old barrier ignored");
    }

    #[tokio::test]
    async fn a_channel_that_ends_mid_alignment_stops_counting() {
        let (a_tx, a) = channel(16);
        let (b_tx, b) = channel(16);
        let mut gate = InputGate::new(vec![a, b]);
        a_tx.send(barrier(3)).await.expect("send");
        b_tx.send(StreamMessage::EndOfInput).await.expect("send");
        expect_barrier(&mut gate, 3).await;
        a_tx.send(StreamMessage::EndOfInput).await.expect("send");
        assert!(matches!(gate.next().await, GateEvent::End));
    }

    #[tokio::test]
    async fn at_least_once_counts_barriers_without_blocking() {
        let (a_tx, a) = channel(16);
        let (b_tx, b) = channel(16);
        let mut gate = InputGate::with_mode(vec![a, b], CheckpointMode::AtLeastOnce);
        a_tx.send(barrier(1)).await.expect("send");
        a_tx.send(one_row()).await.expect("send");
        // Records after the barrier on the fast channel are processed
        // before the checkpoint (duplicates after a restore).
        assert!(matches!(gate.next().await, GateEvent::Batch(_)));
        b_tx.send(barrier(1)).await.expect("send");
        expect_barrier(&mut gate, 1).await;
    }
}
