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
//!
//! Unaligned checkpoints (FLIP-76): every barrier also travels ahead of the
//! data on a priority lane per channel (polled before any data). The first
//! announcement of barrier N makes the task snapshot at once
//! ([`GateEvent::SnapshotUnaligned`]); from then on, batches still ahead of
//! N's marker on a channel are in-flight data ([`GateEvent::InFlight`]):
//! processed, and recorded into the checkpoint, until every channel's
//! marker arrived ([`GateEvent::InFlightComplete`]). With an
//! aligned-checkpoint timeout the gate first aligns, and switches to
//! unaligned when the timeout (counted from the barrier's creation at the
//! coordinator) expires.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::change::ChangeBatch;
use tokio::sync::mpsc::{Receiver, UnboundedReceiver};
use tokio::time::{Instant, Sleep};

use crate::checkpoint::CheckpointMode;
use crate::message::{Barrier, MAX_WATERMARK, MIN_WATERMARK, StreamMessage, Timestamp, WatermarkStatus};

#[derive(Debug)]
pub enum GateEvent {
    /// A batch, and the operator input (port) its channel feeds.
    Batch(usize, ChangeBatch),
    Watermark(Timestamp),
    Status(WatermarkStatus),
    /// Barrier N was received on every open channel; with the time from
    /// the first to the last (alignment).
    Barrier(Barrier, Duration),
    /// Unaligned: snapshot now and forward the barrier; in-flight data
    /// follows. Carries the time spent aligning before the switch.
    SnapshotUnaligned(Barrier, Duration),
    /// Unaligned: a batch that was in flight at the snapshot: process it
    /// and record it.
    InFlight(usize, ChangeBatch),
    /// Unaligned: every channel delivered checkpoint N's marker; the
    /// recorded in-flight data is complete.
    InFlightComplete(u64),
    End,
}

/// How the gate treats barriers.
#[derive(Debug, Clone, Copy)]
pub struct BarrierMode {
    pub mode: CheckpointMode,
    /// Unaligned checkpoints enabled (exactly-once only).
    pub unaligned: bool,
    /// With `unaligned`: align first, switch after this long (0: never align).
    pub aligned_timeout: Duration,
}

impl Default for BarrierMode {
    fn default() -> Self {
        Self {
            mode: CheckpointMode::ExactlyOnce,
            unaligned: false,
            aligned_timeout: Duration::ZERO,
        }
    }
}

struct Channel {
    rx: Receiver<StreamMessage>,
    /// The operator input this channel feeds (0 or 1 for a join).
    input: usize,
    /// Barrier announcements that overtake the data (unaligned mode).
    priority: Option<UnboundedReceiver<Barrier>>,
    watermark: Timestamp,
    idle: bool,
    ended: bool,
    /// Delivered the barrier being aligned (exactly-once: not read).
    barrier_seen: bool,
}

struct Alignment {
    barrier: Barrier,
    started: Instant,
    /// Switched to unaligned: `barrier_seen` now means "marker arrived,
    /// nothing more to record from this channel".
    unaligned: bool,
}

enum Polled {
    Data(usize, Option<StreamMessage>),
    Announcement(usize, Barrier),
    Timeout,
    AllEnded,
}

pub struct InputGate {
    channels: Vec<Channel>,
    output_watermark: Timestamp,
    /// A channel ended before its watermark reached the end: its producer
    /// was stopped (STOP JOB, a stop-with-savepoint). The watermark stays
    /// where it is from then on: the channels still open must not move it
    /// past what the stopped one held back, which would fire windows on
    /// partial input after the job's last snapshot.
    frozen: bool,
    idle: bool,
    next_poll: usize,
    mode: BarrierMode,
    aligning: Option<Alignment>,
    /// When an alignment switches to unaligned.
    timeout: Option<Pin<Box<Sleep>>>,
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
        let n = receivers.len();
        Self::with_lanes(
            receivers
                .into_iter()
                .zip(std::iter::repeat_with(|| None).take(n))
                .collect(),
            BarrierMode {
                mode,
                ..Default::default()
            },
        )
    }

    /// Tags channel `i`'s batches with operator input `inputs[i]`.
    pub fn with_inputs(mut self, inputs: &[usize]) -> Self {
        for (ch, input) in self.channels.iter_mut().zip(inputs) {
            ch.input = *input;
        }
        self
    }

    /// Marks the channels whose producer is known to be idle from the
    /// start (a source subtask without a split): they do not hold the
    /// watermark back until their first message says so. A watermark
    /// from such a channel makes it active, as after an idle status.
    pub fn starting_idle(mut self, idle: &[bool]) -> Self {
        for (ch, idle) in self.channels.iter_mut().zip(idle) {
            ch.idle = *idle;
        }
        self.idle = !self.channels.is_empty() && self.channels.iter().all(|c| c.idle);
        self
    }

    /// Channels with their optional priority lanes.
    pub fn with_lanes(
        lanes: Vec<(Receiver<StreamMessage>, Option<UnboundedReceiver<Barrier>>)>,
        mode: BarrierMode,
    ) -> Self {
        Self {
            channels: lanes
                .into_iter()
                .map(|(rx, priority)| Channel {
                    rx,
                    input: 0,
                    priority,
                    watermark: MIN_WATERMARK,
                    idle: false,
                    ended: false,
                    barrier_seen: false,
                })
                .collect(),
            output_watermark: MIN_WATERMARK,
            frozen: false,
            idle: false,
            next_poll: 0,
            mode,
            aligning: None,
            timeout: None,
            last_barrier: 0,
            queued: VecDeque::new(),
        }
    }

    /// Starts checkpoint `b` (abandoning an older one). The event to
    /// yield if it starts unaligned at once.
    fn start(&mut self, b: Barrier) -> Option<GateEvent> {
        for c in &mut self.channels {
            c.barrier_seen = false;
        }
        self.timeout = None;
        self.aligning = Some(Alignment {
            barrier: b,
            started: Instant::now(),
            unaligned: false,
        });
        // Savepoints are aligned, whatever the checkpoint mode.
        if !self.mode.unaligned || b.is_savepoint() {
            return None;
        }
        // The timeout runs from the barrier's creation (a global clock, as
        // in Flink): a barrier that arrives late switches at once.
        let age = Duration::from_millis((chrono::Utc::now().timestamp_millis() - b.timestamp).max(0) as u64);
        let left = self.mode.aligned_timeout.saturating_sub(age);
        if self.mode.aligned_timeout.is_zero() || left.is_zero() {
            return self.switch_to_unaligned();
        }
        self.timeout = Some(Box::pin(tokio::time::sleep(left)));
        None
    }

    /// The alignment of the current checkpoint becomes unaligned: snapshot
    /// now; channels that already delivered the marker have nothing in
    /// flight, the others are recorded until theirs arrives.
    fn switch_to_unaligned(&mut self) -> Option<GateEvent> {
        self.timeout = None;
        let a = self.aligning.as_mut()?;
        a.unaligned = true;
        let event = GateEvent::SnapshotUnaligned(a.barrier, a.started.elapsed());
        // Every channel may already have delivered its marker (or ended).
        if let Some(done) = self.complete_alignment() {
            self.queued.push_back(done);
        }
        Some(event)
    }

    /// Records barrier `b` (an announcement, or the marker in the data,
    /// from channel `index`); the event it causes, if any.
    fn on_barrier(&mut self, index: usize, b: Barrier, marker: bool) -> Option<GateEvent> {
        if b.checkpoint_id <= self.last_barrier {
            return None;
        }
        let mut first = None;
        match &self.aligning {
            Some(a) if a.barrier.checkpoint_id == b.checkpoint_id => {}
            Some(a) if a.barrier.checkpoint_id > b.checkpoint_id => return None,
            // A newer checkpoint subsumes the one being aligned.
            _ => first = self.start(b),
        }
        if marker {
            self.channels[index].barrier_seen = true;
        }
        match (first, self.complete_alignment()) {
            (Some(f), Some(done)) => {
                self.queued.push_back(done);
                Some(f)
            }
            (Some(ev), None) | (None, Some(ev)) => Some(ev),
            (None, None) => None,
        }
    }

    /// Yields the barrier (aligned) or the end of in-flight data
    /// (unaligned) when every open channel delivered its marker.
    fn complete_alignment(&mut self) -> Option<GateEvent> {
        let a = self.aligning.as_ref()?;
        if !self.channels.iter().all(|c| c.ended || c.barrier_seen) {
            return None;
        }
        let event = if a.unaligned {
            GateEvent::InFlightComplete(a.barrier.checkpoint_id)
        } else {
            GateEvent::Barrier(a.barrier, a.started.elapsed())
        };
        self.last_barrier = a.barrier.checkpoint_id;
        self.aligning = None;
        self.timeout = None;
        for c in &mut self.channels {
            c.barrier_seen = false;
        }
        Some(event)
    }

    /// Whether a batch from channel `index` was in flight at an unaligned
    /// snapshot.
    fn in_flight(&self, index: usize) -> bool {
        self.aligning.as_ref().is_some_and(|a| a.unaligned) && !self.channels[index].barrier_seen
    }

    /// The next event. Channels are polled round-robin so one busy input
    /// cannot starve the others.
    pub async fn next(&mut self) -> GateEvent {
        if let Some(ev) = self.queued.pop_front() {
            return ev;
        }
        loop {
            let polled = poll_fn(|cx| {
                if let Some(t) = self.timeout.as_mut()
                    && t.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Polled::Timeout);
                }
                // Announcements overtake data: polled first, every time.
                for (idx, ch) in self.channels.iter_mut().enumerate() {
                    if let Some(p) = ch.priority.as_mut()
                        && let Poll::Ready(Some(b)) = p.poll_recv(cx)
                    {
                        return Poll::Ready(Polled::Announcement(idx, b));
                    }
                }
                let aligned_blocking = self.mode.mode == CheckpointMode::ExactlyOnce
                    && self.aligning.as_ref().is_some_and(|a| !a.unaligned);
                let n = self.channels.len();
                let mut all_ended = true;
                for i in 0..n {
                    let idx = (self.next_poll + i) % n;
                    let ch = &mut self.channels[idx];
                    if ch.ended {
                        continue;
                    }
                    all_ended = false;
                    if aligned_blocking && ch.barrier_seen {
                        // Aligning: data after the barrier waits.
                        continue;
                    }
                    if let Poll::Ready(m) = ch.rx.poll_recv(cx) {
                        self.next_poll = (idx + 1) % n;
                        return Poll::Ready(Polled::Data(idx, m));
                    }
                }
                if all_ended {
                    Poll::Ready(Polled::AllEnded)
                } else {
                    Poll::Pending
                }
            })
            .await;
            let (index, msg) = match polled {
                Polled::AllEnded => return GateEvent::End,
                Polled::Timeout => {
                    if let Some(ev) = self.switch_to_unaligned() {
                        return ev;
                    }
                    continue;
                }
                Polled::Announcement(index, b) => {
                    if let Some(ev) = self.on_barrier(index, b, false) {
                        return ev;
                    }
                    continue;
                }
                Polled::Data(index, msg) => (index, msg),
            };
            match msg {
                // A dropped sender without EndOfInput means the upstream
                // task stopped (failure or cancel): treat as ended; the job
                // reports the upstream error.
                None | Some(StreamMessage::EndOfInput) => {
                    self.channels[index].ended = true;
                    if self.channels[index].watermark < MAX_WATERMARK {
                        self.frozen = true;
                    }
                    if self.channels.iter().all(|c| c.ended) {
                        // A checkpoint still collecting (unaligned markers)
                        // completes first: its snapshot must not be lost.
                        if let Some(done) = self.complete_alignment() {
                            self.queued.push_back(GateEvent::End);
                            return done;
                        }
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
                Some(StreamMessage::Batch(b)) if self.in_flight(index) => {
                    return GateEvent::InFlight(self.channels[index].input, b);
                }
                Some(StreamMessage::Batch(b)) => return GateEvent::Batch(self.channels[index].input, b),
                Some(StreamMessage::Barrier(b)) => {
                    if let Some(ev) = self.on_barrier(index, b, true) {
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
                        // Flink's StatusWatermarkValve: no channel advances
                        // any more, so the watermarks of all are flushed, the
                        // highest becomes the output, when the channel that
                        // just went idle was the one holding it back. Else
                        // the order in which inputs went idle decides how
                        // far event time gets (a reader of a short file
                        // going idle last would hold every window back).
                        if !self.frozen && self.channels[index].watermark == self.output_watermark {
                            let max = self.channels.iter().map(|c| c.watermark).max();
                            if let Some(max) = max.filter(|m| *m > self.output_watermark) {
                                self.output_watermark = max;
                                self.queued.push_back(GateEvent::Status(WatermarkStatus::Idle));
                                return GateEvent::Watermark(max);
                            }
                        }
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
        if self.frozen {
            return None;
        }
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
    use tokio::sync::mpsc::{Sender, channel};

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
        b_tx.send(StreamMessage::Batch(
            arrow::record_batch::RecordBatch::new_empty(std::sync::Arc::new(arrow::datatypes::Schema::empty())).into(),
        ))
        .await
        .expect("send");
        assert!(matches!(gate.next().await, GateEvent::Batch(..)));
        a_tx.send(StreamMessage::Watermark(40)).await.expect("send");
        expect_wm(&mut gate, 25).await;
        a_tx.send(StreamMessage::EndOfInput).await.expect("send");
        b_tx.send(StreamMessage::Watermark(30)).await.expect("send");
        expect_wm(&mut gate, 30).await;
        drop(b_tx);
        assert!(matches!(gate.next().await, GateEvent::End));
    }

    /// Flink's valve: when the last active channel goes idle holding the
    /// output back, the highest watermark of all is flushed, whatever the
    /// order in which the channels went idle.
    #[tokio::test]
    async fn all_channels_idle_flush_the_highest_watermark() {
        let idle = || StreamMessage::WatermarkStatus(WatermarkStatus::Idle);
        // Channel a at 10, b at 5: the output is 5.
        async fn at_10_and_5() -> (Sender<StreamMessage>, Sender<StreamMessage>, InputGate) {
            let (a_tx, a) = channel(16);
            let (b_tx, b) = channel(16);
            let mut gate = InputGate::new(vec![a, b]);
            a_tx.send(StreamMessage::Watermark(10)).await.expect("send");
            b_tx.send(StreamMessage::Watermark(5)).await.expect("send");
            expect_wm(&mut gate, 5).await;
            (a_tx, b_tx, gate)
        }
        // a idle first: b's 5 still holds the output.
        let (a_tx, b_tx, mut gate) = at_10_and_5().await;
        a_tx.send(idle()).await.expect("send");
        b_tx.send(idle()).await.expect("send");
        expect_wm(&mut gate, 10).await;
        assert!(matches!(gate.next().await, GateEvent::Status(WatermarkStatus::Idle)));
        // The other order: b idle first lets a's 10 through; a going idle
        // then has nothing higher to flush.
        let (a_tx, b_tx, mut gate) = at_10_and_5().await;
        b_tx.send(idle()).await.expect("send");
        expect_wm(&mut gate, 10).await;
        a_tx.send(idle()).await.expect("send");
        assert!(matches!(gate.next().await, GateEvent::Status(WatermarkStatus::Idle)));
    }

    #[tokio::test]
    async fn a_channel_starting_idle_holds_nothing_back_until_it_speaks() {
        let (a_tx, a) = channel(16);
        let (b_tx, b) = channel(16);
        // b's producer is a reader without a split: nothing has arrived
        // from it, and a's first watermark passes at once.
        let mut gate = InputGate::new(vec![a, b]).starting_idle(&[false, true]);
        a_tx.send(StreamMessage::Watermark(10)).await.expect("send");
        expect_wm(&mut gate, 10).await;
        // Its own idle status changes nothing.
        b_tx.send(StreamMessage::WatermarkStatus(WatermarkStatus::Idle))
            .await
            .expect("send");
        a_tx.send(StreamMessage::Watermark(20)).await.expect("send");
        expect_wm(&mut gate, 20).await;
        // A watermark makes it active: once aligned, it holds the output.
        b_tx.send(StreamMessage::Watermark(25)).await.expect("send");
        a_tx.send(StreamMessage::Watermark(40)).await.expect("send");
        expect_wm(&mut gate, 25).await;
        // Every channel idle from the start: the gate is idle, and says
        // nothing about it (its consumers start idle too).
        let (_c_tx, c) = channel::<StreamMessage>(16);
        let gate = InputGate::new(vec![c]).starting_idle(&[true]);
        assert!(gate.idle);
    }

    #[tokio::test]
    async fn a_stopped_channel_freezes_the_watermark_a_finished_one_does_not() {
        for finished in [false, true] {
            let (a_tx, a) = channel(16);
            let (b_tx, b) = channel(16);
            let mut gate = InputGate::new(vec![a, b]);
            a_tx.send(StreamMessage::Watermark(10)).await.expect("send");
            b_tx.send(StreamMessage::Watermark(50)).await.expect("send");
            expect_wm(&mut gate, 10).await;
            if finished {
                a_tx.send(StreamMessage::Watermark(MAX_WATERMARK)).await.expect("send");
            }
            a_tx.send(StreamMessage::EndOfInput).await.expect("send");
            drop(a_tx);
            b_tx.send(StreamMessage::Watermark(60)).await.expect("send");
            drop(b_tx);
            let mut seen = vec![];
            loop {
                match gate.next().await {
                    GateEvent::Watermark(w) => seen.push(w),
                    GateEvent::End => break,
                    other => panic!("unexpected {other:?}"),
                }
            }
            if finished {
                assert_eq!(seen.last(), Some(&60), "a finished channel lets b's watermark on");
            } else {
                assert!(
                    seen.is_empty(),
                    "a stopped channel freezes the watermark at 10: {seen:?}"
                );
            }
        }
    }

    fn barrier(id: u64) -> StreamMessage {
        StreamMessage::Barrier(Barrier {
            kind: Default::default(),
            checkpoint_id: id,
            timestamp: 0,
        })
    }

    fn one_row() -> StreamMessage {
        StreamMessage::Batch(
            arrow::record_batch::RecordBatch::new_empty(std::sync::Arc::new(arrow::datatypes::Schema::empty())).into(),
        )
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
            matches!(gate.next().await, GateEvent::Batch(..)),
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
        assert!(matches!(gate.next().await, GateEvent::Batch(..)), "old barrier ignored");
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
        assert!(matches!(gate.next().await, GateEvent::Batch(..)));
        b_tx.send(barrier(1)).await.expect("send");
        expect_barrier(&mut gate, 1).await;
    }

    type Lane = (Receiver<StreamMessage>, Option<UnboundedReceiver<Barrier>>);

    fn lanes(
        n: usize,
    ) -> (
        Vec<tokio::sync::mpsc::Sender<StreamMessage>>,
        Vec<tokio::sync::mpsc::UnboundedSender<Barrier>>,
        Vec<Lane>,
    ) {
        let (mut data, mut prio, mut lanes) = (vec![], vec![], vec![]);
        for _ in 0..n {
            let (tx, rx) = channel(16);
            let (ptx, prx) = tokio::sync::mpsc::unbounded_channel();
            data.push(tx);
            prio.push(ptx);
            lanes.push((rx, Some(prx)));
        }
        (data, prio, lanes)
    }

    fn barrier_at(id: u64, timestamp: i64) -> Barrier {
        Barrier {
            kind: Default::default(),
            checkpoint_id: id,
            timestamp,
        }
    }

    #[tokio::test]
    async fn unaligned_snapshots_at_the_first_announcement_and_records_until_the_markers() {
        let (data, prio, lanes) = lanes(2);
        let mode = BarrierMode {
            mode: CheckpointMode::ExactlyOnce,
            unaligned: true,
            aligned_timeout: Duration::ZERO,
        };
        let mut gate = InputGate::with_lanes(lanes, mode);
        let b = barrier_at(1, chrono::Utc::now().timestamp_millis());
        // b has data queued ahead of everything; a announces checkpoint 1.
        data[1].send(one_row()).await.expect("send");
        prio[0].send(b).expect("announce");
        data[0].send(StreamMessage::Barrier(b)).await.expect("marker");
        match gate.next().await {
            GateEvent::SnapshotUnaligned(x, _) => assert_eq!(x.checkpoint_id, 1),
            other => panic!("snapshot expected at once, got {other:?}"),
        }
        // b's queued batch overtaken by the barrier is in flight.
        let mut in_flight = 0;
        data[1].send(one_row()).await.expect("send");
        prio[1].send(b).expect("announce");
        data[1].send(StreamMessage::Barrier(b)).await.expect("marker");
        data[1].send(one_row()).await.expect("send after the marker");
        loop {
            match gate.next().await {
                GateEvent::InFlight(..) => in_flight += 1,
                GateEvent::InFlightComplete(id) => {
                    assert_eq!(id, 1);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(in_flight, 2, "both batches ahead of b's marker are recorded");
        assert!(
            matches!(gate.next().await, GateEvent::Batch(..)),
            "after the marker: normal data"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_alignment_that_times_out_switches_to_unaligned() {
        let (data, prio, lanes) = lanes(2);
        let mode = BarrierMode {
            mode: CheckpointMode::ExactlyOnce,
            unaligned: true,
            aligned_timeout: Duration::from_secs(10),
        };
        let mut gate = InputGate::with_lanes(lanes, mode);
        let b = barrier_at(1, chrono::Utc::now().timestamp_millis());
        prio[0].send(b).expect("announce");
        data[0].send(StreamMessage::Barrier(b)).await.expect("marker");
        data[0].send(one_row()).await.expect("after a's marker");
        data[1].send(one_row()).await.expect("b, before its barrier");
        // Aligning: a is blocked, b's data flows as normal data.
        assert!(matches!(gate.next().await, GateEvent::Batch(..)));
        // Nothing else can be read until the timeout (the driven clock
        // advances to it): then the checkpoint goes unaligned.
        match gate.next().await {
            GateEvent::SnapshotUnaligned(x, aligned_for) => {
                assert_eq!(x.checkpoint_id, 1);
                // The timeout counts from the barrier's creation (wall
                // clock): a loaded machine may start aligning a little later.
                assert!(aligned_for >= Duration::from_secs(9), "{aligned_for:?}");
            }
            other => panic!("switch expected, got {other:?}"),
        }
        // a is unblocked; its post-marker batch is not in flight.
        assert!(matches!(gate.next().await, GateEvent::Batch(..)));
        data[1].send(one_row()).await.expect("b, still before its barrier");
        assert!(matches!(gate.next().await, GateEvent::InFlight(..)));
        data[1].send(StreamMessage::Barrier(b)).await.expect("marker");
        assert!(matches!(gate.next().await, GateEvent::InFlightComplete(1)));
    }

    #[tokio::test]
    async fn a_barrier_older_than_the_timeout_switches_at_once() {
        let (_data, prio, lanes) = lanes(2);
        let mode = BarrierMode {
            mode: CheckpointMode::ExactlyOnce,
            unaligned: true,
            aligned_timeout: Duration::from_millis(100),
        };
        let mut gate = InputGate::with_lanes(lanes, mode);
        let old = barrier_at(1, chrono::Utc::now().timestamp_millis() - 60_000);
        prio[1].send(old).expect("announce");
        assert!(matches!(gate.next().await, GateEvent::SnapshotUnaligned(_, _)));
    }

    #[tokio::test]
    async fn unaligned_recording_completes_before_the_end_when_every_channel_ends() {
        let (data, prio, lanes) = lanes(2);
        let mode = BarrierMode {
            mode: CheckpointMode::ExactlyOnce,
            unaligned: true,
            aligned_timeout: Duration::ZERO,
        };
        let mut gate = InputGate::with_lanes(lanes, mode);
        let b = barrier_at(4, chrono::Utc::now().timestamp_millis());
        prio[0].send(b).expect("announce");
        assert!(matches!(gate.next().await, GateEvent::SnapshotUnaligned(_, _)));
        // a delivers its marker and ends; b ends without ever sending one.
        data[0].send(StreamMessage::Barrier(b)).await.expect("marker");
        data[0].send(StreamMessage::EndOfInput).await.expect("end");
        data[1].send(StreamMessage::EndOfInput).await.expect("end");
        assert!(matches!(gate.next().await, GateEvent::InFlightComplete(4)));
        assert!(matches!(gate.next().await, GateEvent::End));
    }
}
