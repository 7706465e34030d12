//! The loop of a source subtask (a source reader): reads its splits in
//! turn, each with its own offset and watermark generator, evaluates
//! computed columns, and emits the reader watermark = min over the splits
//! that are neither idle nor finished.
//!
//! Emission follows `scan.watermark.emit.strategy`: `on-periodic` every
//! `pipeline.auto-watermark-interval`, and eagerly once the watermark is
//! more than that interval (in event time) past the last one emitted, as
//! Flink's SQL watermark assigner does; or `on-event`, which is exactly
//! per-row semantics: a batch is cut before any row whose event time is at
//! or below the watermark the rows before it produced, and that watermark is
//! emitted at the cut. (Rows above the watermark cannot be affected by it,
//! so no other cut is needed.)
//!
//! Bad records a split sets aside are taken after every poll and written
//! to the reader's dead letters; at a barrier the reader pre-commits them
//! together with the split positions it records, so both describe the same
//! moment ([`crate::connectors::dead_letter`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use datafusion::physical_expr::PhysicalExpr;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::change::ChangeBatch;
use crate::checkpoint::{OperatorSnapshot, SplitPosition, TaskCheckpointing, TaskSnapshot};
use crate::connectors::dead_letter::DeadLetterWriter;
use crate::connectors::{SourceSplit, SplitPoll};
use crate::error::{ExecError, Result};
use crate::message::{Barrier, BarrierKind, MAX_WATERMARK, MIN_WATERMARK, StreamMessage, Timestamp, WatermarkStatus};
use crate::operators::calc::project;
use crate::plan::WatermarkNode;
use crate::runtime::alignment::{AlignmentCoordinator, ReaderId, SplitAlignment, max_allowed, reader_report};
use crate::runtime::chain::Chain;
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::metrics::{SourceStatus, SplitState as SplitState_, SplitStatus};
use crate::runtime::output::Output;
use crate::runtime::task::{checkpoint_chain, flush, report_finished};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitStrategy {
    OnPeriodic,
    OnEvent,
}

struct SplitState {
    split: Box<dyn SourceSplit>,
    watermark: Timestamp,
    idle: bool,
    finished: bool,
    last_activity: Instant,
    /// Not polled again before this instant (rate limit).
    wait_until: Option<Instant>,
    align: SplitAlignment,
    paused_since: Option<Instant>,
    paused_total: Duration,
}

/// This reader's membership in a watermark alignment group.
pub struct ReaderAlignment {
    pub coordinator: Arc<AlignmentCoordinator>,
    pub reader: ReaderId,
    pub max_drift_ms: i64,
    pub update_interval: Duration,
    pub buffer_size: usize,
    pub allow_unaligned: bool,
    /// Connector name, for the error when it cannot pause single splits.
    pub connector: String,
}

pub struct SourceTask {
    pub splits: Vec<Box<dyn SourceSplit>>,
    pub bounded: bool,
    pub computed: Option<Vec<Arc<dyn PhysicalExpr>>>,
    pub schema: SchemaRef,
    pub watermark: Option<WatermarkNode>,
    pub rowtime_index: Option<usize>,
    pub emit: EmitStrategy,
    pub interval: Duration,
    pub chain: Chain,
    pub output: Output,
    pub stop: watch::Receiver<bool>,
    pub metrics: Arc<NodeMetrics>,
    pub alignment: Option<ReaderAlignment>,
    /// Where the reader publishes its splits' state (SHOW WATERMARKS).
    pub status: Option<Arc<SourceStatus>>,
    /// The source's plan node (key of its split positions).
    /// The source's operator uid (its split positions are kept under it).
    pub uid: String,
    /// This reader's index among the source's subtasks.
    pub subtask: usize,
    /// Split positions of the checkpoint the job restored, by split id.
    pub restored: HashMap<String, SplitPosition>,
    /// Barriers the checkpoint coordinator announces, and where to report.
    pub triggers: Option<watch::Receiver<Option<Barrier>>>,
    pub checkpointing: Option<TaskCheckpointing>,
    /// Where bad records go (`scan.dead-letter.path`), if anywhere.
    pub dead_letters: Option<DeadLetterWriter>,
    /// Where the source's enumerator hands this reader the splits that
    /// appear while the job runs (new Kafka partitions, files, Delta
    /// commits): see [`super::enumerator`].
    pub inbox: Option<Arc<super::enumerator::SplitInbox>>,
}

struct Reader {
    splits: Vec<SplitState>,
    emitted: Timestamp,
    idle: bool,
    next: usize,
}

impl Reader {
    /// Min over active (neither idle nor finished) splits, leaving out
    /// `except`; `None` if there is none.
    fn combined(&self, except: Option<usize>) -> Option<Timestamp> {
        self.splits
            .iter()
            .enumerate()
            .filter(|(i, s)| Some(*i) != except && !s.idle && !s.finished)
            .map(|(_, s)| s.watermark)
            .min()
    }
}

impl SourceTask {
    /// Every split's position: this reader's part of a checkpoint.
    fn positions(&self, reader: &Reader) -> TaskSnapshot {
        TaskSnapshot {
            sources: vec![(
                self.uid.clone(),
                reader
                    .splits
                    .iter()
                    .map(|s| SplitPosition {
                        split: s.split.id(),
                        position: s.split.position(),
                        finished: s.finished,
                        end: s.split.end(),
                    })
                    .collect(),
            )],
            operators: vec![],
        }
    }

    /// This reader's part of a checkpoint: every split's position and, with
    /// dead letters, the file of those set aside since the last one,
    /// pre-committed (it becomes visible when the checkpoint completes).
    fn snapshot(&mut self, reader: &Reader) -> Result<TaskSnapshot> {
        let mut snapshot = self.positions(reader);
        let committables: Vec<serde_json::Value> = reader.splits.iter().filter_map(|s| s.split.committable()).collect();
        if self.checkpointing.is_some() && !committables.is_empty() {
            // Told to the source's committer when the checkpoint completes.
            snapshot.operators.push((
                format!("{}/{}/splits", self.uid, self.subtask),
                OperatorSnapshot::Sink(committables),
            ));
        }
        if self.checkpointing.is_some()
            && let Some(w) = self.dead_letters.as_mut()
        {
            let committables = w.pre_commit()?;
            if !committables.is_empty() {
                snapshot
                    .operators
                    .push((w.key().to_string(), OperatorSnapshot::Sink(committables)));
            }
        }
        Ok(snapshot)
    }

    /// The reader ends: its last part of the final checkpoint, or, without
    /// checkpointing, its dead letters complete.
    fn final_snapshot(&mut self, reader: &Reader) -> Result<TaskSnapshot> {
        if self.checkpointing.is_none()
            && let Some(w) = self.dead_letters.as_mut()
        {
            w.finish()?;
        }
        self.snapshot(reader)
    }

    /// Writes the records split `split` set aside in its last poll.
    fn write_dead_letters(&mut self, split: &mut dyn SourceSplit) -> Result<()> {
        let bad = split.take_dead_letters();
        if bad.is_empty() {
            return Ok(());
        }
        let Some(w) = self.dead_letters.as_mut() else {
            return Err(ExecError::internal(format!(
                "split {} set records aside, but its source has no dead-letter directory",
                split.id()
            )));
        };
        w.write(&bad)?;
        self.metrics.dead_letters.fetch_add(bad.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Checkpoint `b` starts here: record split positions, snapshot the
    /// chain, and send the barrier after everything read before it.
    async fn inject_barrier(
        &mut self,
        snapshot: TaskSnapshot,
        b: Barrier,
        outbox: &mut Vec<StreamMessage>,
    ) -> Result<()> {
        flush(outbox, &mut self.output).await?;
        checkpoint_chain(
            b,
            Duration::ZERO,
            snapshot,
            &mut self.chain,
            &mut self.output,
            self.checkpointing.as_ref(),
        )
        .await
    }

    /// Waits until the job stops or a barrier newer than `last` comes
    /// (the savepoint failed); returns the last barrier handled.
    async fn wait_after_stop_barrier(&mut self, last: u64) -> u64 {
        let mut stop = self.stop.clone();
        loop {
            if *stop.borrow() {
                return last;
            }
            let Some(rx) = self.triggers.as_mut() else { return last };
            if rx.borrow().is_some_and(|b| b.checkpoint_id > last) {
                // Left for the run loop to inject: seen here, so marked
                // unseen again for its `has_changed`.
                rx.mark_changed();
                return last;
            }
            tokio::select! {
                r = stop.changed() => if r.is_err() { return last },
                r = rx.changed() => if r.is_err() { return last },
            }
        }
    }

    pub async fn run(mut self) -> Result<()> {
        let now = Instant::now();
        let mut splits = vec![];
        // Splits whose data arrives by itself wake the reader through it
        // (as new splits from the enumerator do).
        let waker = self
            .inbox
            .as_ref()
            .map_or_else(|| Arc::new(tokio::sync::Notify::new()), |i| i.waker.clone());
        for mut split in std::mem::take(&mut self.splits) {
            split.set_waker(waker.clone());
            // Resume where the restored checkpoint says the split was.
            let finished = match self.restored.get(&split.id()) {
                Some(p) => {
                    split.seek(p.position)?;
                    p.finished
                }
                None => false,
            };
            splits.push(SplitState {
                split,
                watermark: MIN_WATERMARK,
                idle: false,
                finished,
                last_activity: now,
                wait_until: None,
                align: SplitAlignment::default(),
                paused_since: None,
                paused_total: Duration::ZERO,
            });
        }
        let mut reader = Reader {
            splits,
            emitted: MIN_WATERMARK,
            idle: false,
            next: 0,
        };
        let mut last_barrier = 0u64;
        let mut outbox = Vec::new();
        let mut next_tick = Instant::now() + self.interval;
        let idle_timeout = self.watermark.as_ref().and_then(|w| w.idle_timeout);
        let mut announcements = self.alignment.as_ref().map(|a| a.coordinator.subscribe());
        let mut next_align = self.alignment.as_ref().map(|a| Instant::now() + a.update_interval);
        // Set when the sleep below was woken by an announcement: waiting on
        // `changed()` marks it seen, so `has_changed()` would miss it.
        let mut fresh_announcement = false;
        loop {
            if self.take_new_splits(&mut reader, &waker)? > 0 && reader.idle {
                // A new split holds the watermark back until it has data,
                // as any active split: the reader is active again.
                reader.idle = false;
                outbox.push(StreamMessage::WatermarkStatus(WatermarkStatus::Active));
            }
            let barrier = match self.triggers.as_mut() {
                Some(rx) if rx.has_changed().unwrap_or(false) => *rx.borrow_and_update(),
                _ => None,
            };
            if let Some(b) = barrier.filter(|b| b.checkpoint_id > last_barrier) {
                last_barrier = b.checkpoint_id;
                if let BarrierKind::Savepoint { drain: true, .. } = b.kind {
                    // DRAIN: the end of event time, before the savepoint,
                    // so every window and timer fires into the sinks.
                    self.chain.process_watermark(MAX_WATERMARK, &mut outbox)?;
                }
                let snapshot = self.snapshot(&reader)?;
                self.inject_barrier(snapshot, b, &mut outbox).await?;
                if let BarrierKind::Savepoint { stop: true, .. } = b.kind {
                    // Nothing is read after a stop-with-savepoint barrier:
                    // the job stops once the savepoint completes, or goes
                    // on at the next barrier if it failed.
                    last_barrier = self.wait_after_stop_barrier(last_barrier).await;
                }
            }
            if *self.stop.borrow() || self.chain.is_finished() || self.output.is_closed() {
                // Stopped on purpose: end without a final watermark, so no
                // window fires on partial input.
                self.chain.end_of_input(&mut outbox)?;
                flush(&mut outbox, &mut self.output).await?;
                let snapshot = self.final_snapshot(&reader)?;
                return report_finished(snapshot, &mut self.chain, self.checkpointing.as_ref());
            }
            // An unbounded source that finds new splits (a monitored file
            // path) waits for them once its splits are read.
            if reader.splits.iter().all(|s| s.finished)
                && (self.bounded || !reader.splits.is_empty())
                && !self.awaits_splits()
            {
                // A finished reader never holds its group back (FLINK-35157).
                if let Some(a) = &self.alignment {
                    a.coordinator.report(a.reader, crate::message::MAX_WATERMARK);
                }
                self.publish_status(&reader);
                let snapshot = self.final_snapshot(&reader)?;
                return self.finish(snapshot, &mut outbox).await;
            }
            let mut progressed = false;
            let n = reader.splits.len();
            let now = Instant::now();
            for k in 0..n {
                let i = (reader.next + k) % n;
                let s = &mut reader.splits[i];
                // Paused splits are not polled at all (no busy polling).
                if s.finished || s.align.paused || s.wait_until.is_some_and(|t| t > now) {
                    continue;
                }
                let polled = s.split.poll_batch()?;
                self.write_dead_letters(s.split.as_mut())?;
                let skipped = s.split.take_skipped();
                if skipped > 0 {
                    self.metrics.skipped_records.fetch_add(skipped, Ordering::Relaxed);
                }
                let polled = match polled {
                    SplitPoll::Batch(b) => SplitPoll::Changes(b.into()),
                    other => other,
                };
                match polled {
                    SplitPoll::Batch(_) => unreachable_batch()?,
                    SplitPoll::Changes(b) => {
                        s.last_activity = now;
                        s.wait_until = None;
                        let was_idle = std::mem::replace(&mut s.idle, false);
                        if was_idle && reader.idle {
                            reader.idle = false;
                            outbox.push(StreamMessage::WatermarkStatus(WatermarkStatus::Active));
                        }
                        self.metrics.rows_out.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                        let b = match &self.computed {
                            Some(exprs) => b.with_rows(project(&b.rows, exprs, &self.schema)?),
                            None => b,
                        };
                        self.on_split_batch(&mut reader, i, b, &mut outbox)?;
                        if self.alignment.as_ref().is_some_and(|a| a.buffer_size == 0) {
                            // Buffer 0 (Flink <= 2.2): a split that passes the
                            // bound is paused at once, not at the next announcement.
                            if let Some(min) = announcements.as_ref().and_then(|rx| *rx.borrow()) {
                                self.align_splits(&mut reader, min)?;
                            }
                        }
                        progressed = true;
                        reader.next = (i + 1) % n;
                        break;
                    }
                    SplitPoll::Wait(until) => s.wait_until = Some(until),
                    SplitPoll::Finished => {
                        s.finished = true;
                        progressed = true;
                    }
                }
            }
            flush(&mut outbox, &mut self.output).await?;

            let now = Instant::now();
            if let Some(timeout) = idle_timeout {
                for s in reader.splits.iter_mut() {
                    // Time paused by alignment is not inactivity (FLIP-471).
                    if !s.finished && !s.idle && !s.align.paused && now.duration_since(s.last_activity) > timeout {
                        s.idle = true;
                    }
                }
            }
            if let (Some(a), Some(at)) = (&self.alignment, next_align)
                && now >= at
            {
                next_align = Some(now + a.update_interval);
                // Sample every split, report the reader's watermark.
                for s in reader.splits.iter_mut().filter(|s| !s.finished) {
                    s.align.sample(s.watermark, a.buffer_size);
                }
                let quiet = reader.idle || reader.splits.iter().all(|s| s.finished || s.idle);
                let unfinished = reader.splits.iter().any(|s| !s.finished);
                let wm = reader.combined(None);
                if let Some(v) = reader_report(quiet && unfinished, wm) {
                    a.coordinator.report(a.reader, v);
                }
                self.publish_status(&reader);
            }
            let announced = match announcements.as_mut() {
                Some(rx) if fresh_announcement || rx.has_changed().unwrap_or(false) => {
                    fresh_announcement = false;
                    *rx.borrow_and_update()
                }
                _ => None,
            };
            if let Some(min) = announced {
                self.align_splits(&mut reader, min)?;
            }
            if now >= next_tick || self.emit == EmitStrategy::OnEvent {
                if now >= next_tick {
                    self.publish_status(&reader);
                    // Operators chained here that keep processing time
                    // (a file sink's rollover, state TTL) are told at the
                    // watermark tick.
                    if self.chain.processing_time_interval().is_some() {
                        self.chain.process_time(&mut outbox)?;
                    }
                }
                next_tick = now + self.interval;
                self.emit_combined(&mut reader, &mut outbox)?;
                flush(&mut outbox, &mut self.output).await?;
            }
            if !progressed {
                // Nothing to read now: sleep until a split is due, the next
                // watermark tick, or a stop request.
                let wake = reader
                    .splits
                    .iter()
                    .filter(|s| !s.finished && !s.align.paused)
                    .filter_map(|s| s.wait_until)
                    .min()
                    .map_or(next_tick, |t| t.min(next_tick));
                let wake = next_align.map_or(wake, |a| a.min(wake));
                let mut stop = self.stop.clone();
                let mut triggers = self.triggers.clone();
                let trigger = async {
                    match triggers.as_mut() {
                        Some(t) => {
                            if t.changed().await.is_err() {
                                // The coordinator is gone: nothing to wake for.
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                let mut woken = false;
                match announcements.as_mut() {
                    Some(rx) => {
                        let mut gone = false;
                        tokio::select! {
                            _ = tokio::time::sleep_until(wake) => {}
                            _ = stop.changed() => {}
                            _ = trigger => {}
                            _ = waker.notified() => woken = true,
                            r = rx.changed() => match r {
                                Ok(()) => fresh_announcement = true,
                                // The coordinator ended with the job.
                                Err(_) => gone = true,
                            },
                        }
                        if gone {
                            announcements = None;
                        }
                    }
                    None => {
                        tokio::select! {
                            _ = tokio::time::sleep_until(wake) => {}
                            _ = stop.changed() => {}
                            _ = trigger => {}
                            _ = waker.notified() => woken = true,
                        }
                    }
                }
                if woken {
                    // A split has data: which one the waker does not say,
                    // and an empty split's poll costs next to nothing, so
                    // every waiting split is due now (else the one with
                    // data would sit out its wait: measured, 30 waits of
                    // 200 ms per partition in a 4-partition backfill).
                    for s in reader.splits.iter_mut() {
                        s.wait_until = None;
                    }
                }
            } else {
                tokio::task::yield_now().await;
            }
        }
    }

    /// Starts reading the splits the enumerator found for this reader
    /// since the last call; fails with the enumerator's failure.
    fn take_new_splits(&mut self, reader: &mut Reader, waker: &Arc<tokio::sync::Notify>) -> Result<usize> {
        let Some(inbox) = &self.inbox else { return Ok(0) };
        let now = Instant::now();
        let mut added = 0;
        for mut split in inbox.take()? {
            split.set_waker(waker.clone());
            reader.splits.push(SplitState {
                split,
                watermark: MIN_WATERMARK,
                idle: false,
                finished: false,
                last_activity: now,
                wait_until: None,
                align: SplitAlignment::default(),
                paused_since: None,
                paused_total: Duration::ZERO,
            });
            added += 1;
        }
        Ok(added)
    }

    /// Pauses and resumes splits against the announced group minimum.
    fn align_splits(&mut self, reader: &mut Reader, group_min: Timestamp) -> Result<()> {
        let Some(a) = &self.alignment else { return Ok(()) };
        let bound = max_allowed(group_min, a.max_drift_ms);
        let now = Instant::now();
        let several = reader.splits.len() > 1;
        // Split-level decisions first (FLIP-217).
        let mut decisions = vec![];
        for s in reader.splits.iter() {
            let mut next = s.align.clone();
            if !s.finished {
                next.decide(s.watermark, s.idle, bound, a.buffer_size);
            }
            decisions.push(next.paused);
        }
        let cannot = reader
            .splits
            .iter()
            .zip(&decisions)
            .any(|(s, pause)| *pause && !s.align.paused && !s.split.supports_pause());
        if several && cannot && !a.allow_unaligned {
            return Err(ExecError::Config(format!(
                "watermark alignment must pause a single split, but connector '{}' cannot pause splits one by one; \
                     set '{}' = 'true' to pause the whole source reader instead (correct only with one split per reader)",
                a.connector,
                crate::config::ALLOW_UNALIGNED_SPLITS
            )));
        }
        if several && reader.splits.iter().any(|s| !s.split.supports_pause()) {
            // Reader-level alignment: the whole reader pauses while its
            // watermark is beyond the bound.
            let wm = reader.combined(None).unwrap_or(MIN_WATERMARK);
            let quiet = reader.splits.iter().all(|s| s.idle || s.finished);
            let mut probe = SplitAlignment::default();
            probe.paused = reader.splits.iter().any(|s| s.align.paused);
            probe.decide(wm, quiet, bound, 0);
            for s in reader.splits.iter_mut() {
                set_paused(s, probe.paused, now);
            }
            return Ok(());
        }
        for (s, pause) in reader.splits.iter_mut().zip(decisions) {
            if !s.finished {
                set_paused(s, pause, now);
            }
        }
        Ok(())
    }

    /// Publishes each split's state for SHOW WATERMARKS.
    fn publish_status(&self, reader: &Reader) {
        let Some(status) = &self.status else { return };
        let now = Instant::now();
        let rows = reader
            .splits
            .iter()
            .map(|s| SplitStatus {
                split: s.split.id(),
                watermark: s.watermark,
                state: if s.finished {
                    SplitState_::Finished
                } else if s.align.paused {
                    SplitState_::Paused
                } else if s.idle {
                    SplitState_::Idle
                } else if self.output.is_back_pressured() {
                    SplitState_::BackPressured
                } else {
                    SplitState_::Active
                },
                paused: s.paused_total + s.paused_since.map_or(Duration::ZERO, |p| now.duration_since(p)),
                offset: s.split.offset(),
                progress: s.split.progress(),
            })
            .collect();
        status.publish(rows, reader.emitted);
    }

    /// Whether this reader outlives its splits: an unbounded source that
    /// discovers new ones.
    fn awaits_splits(&self) -> bool {
        !self.bounded && self.inbox.is_some()
    }

    async fn finish(&mut self, snapshot: TaskSnapshot, outbox: &mut Vec<StreamMessage>) -> Result<()> {
        if self.bounded {
            // End of bounded input: the final watermark fires everything.
            self.chain.process_watermark(MAX_WATERMARK, outbox)?;
        }
        self.chain.end_of_input(outbox)?;
        flush(outbox, &mut self.output).await?;
        report_finished(snapshot, &mut self.chain, self.checkpointing.as_ref())
    }

    /// Updates split `i`'s watermark with batch `b` and passes `b` on,
    /// cutting it where on-event emission requires.
    fn on_split_batch(
        &mut self,
        reader: &mut Reader,
        i: usize,
        b: ChangeBatch,
        outbox: &mut Vec<StreamMessage>,
    ) -> Result<()> {
        let Some(wm) = &self.watermark else {
            return self.chain.process_batch(b, outbox);
        };
        let values = to_millis(&wm.expr.evaluate(&b.rows)?.into_array(b.num_rows())?)?;
        if self.emit == EmitStrategy::OnPeriodic {
            return self.eager_periodic(reader, i, b, &values, outbox);
        }
        let rowtime = match self.rowtime_index {
            Some(r) => Some(to_millis(b.rows.column(r))?),
            None => None,
        };
        let mut own = reader.splits[i].watermark;
        // The other splits do not change during this batch: their minimum
        // is taken once, only this split's watermark moves per row.
        let others = reader.combined(Some(i));
        let mut start = 0;
        for row in 0..b.num_rows() {
            let effective = others.map_or(own, |o| o.min(own));
            let ts = rowtime.as_ref().and_then(|r| r[row]);
            if effective > reader.emitted && ts.is_some_and(|t| t <= effective) {
                if row > start {
                    self.chain.process_batch(b.slice(start, row - start), outbox)?;
                }
                start = row;
                reader.emitted = effective;
                self.chain.process_watermark(effective, outbox)?;
            }
            if let Some(v) = values[row] {
                own = own.max(v);
            }
        }
        if start < b.num_rows() {
            self.chain.process_batch(b.slice(start, b.num_rows() - start), outbox)?;
        }
        reader.splits[i].watermark = own;
        Ok(())
    }

    /// `on-periodic` as Flink's SQL watermark assigner does it: besides the
    /// periodic tick, a watermark more than the interval (in event-time
    /// milliseconds) past the last one emitted is emitted after the row
    /// that moved it ("eagerly"; Flink's last emitted starts at 0). Weir
    /// sends such a watermark on at the end of the batch, or within it
    /// just before a row it makes late: no other row can tell the
    /// difference, and batches stay whole.
    fn eager_periodic(
        &mut self,
        reader: &mut Reader,
        i: usize,
        b: ChangeBatch,
        values: &[Option<i64>],
        outbox: &mut Vec<StreamMessage>,
    ) -> Result<()> {
        // Row times are read only once a watermark waits to be sent on.
        let mut rowtime: Option<Vec<Option<i64>>> = None;
        let eager_ms = i64::try_from(self.interval.as_millis()).unwrap_or(i64::MAX);
        let mut own = reader.splits[i].watermark;
        let others = reader.combined(Some(i));
        // Flink's `lastWatermark` (0 before the first), and the watermark
        // it would have emitted that Weir has not sent on yet.
        let mut last = if reader.emitted == MIN_WATERMARK {
            0
        } else {
            reader.emitted
        };
        let mut pending: Option<Timestamp> = None;
        let mut start = 0;
        for row in 0..b.num_rows() {
            let ts = match (pending, self.rowtime_index) {
                (Some(_), Some(r)) => {
                    if rowtime.is_none() {
                        rowtime = Some(to_millis(b.rows.column(r))?);
                    }
                    rowtime.as_ref().and_then(|t| t[row])
                }
                _ => None,
            };
            if let Some(p) = pending.filter(|p| ts.is_some_and(|t| t <= *p)) {
                if row > start {
                    self.chain.process_batch(b.slice(start, row - start), outbox)?;
                }
                start = row;
                pending = None;
                self.emit_watermark(reader, p, outbox)?;
            }
            if let Some(v) = values[row] {
                own = own.max(v);
            }
            let effective = others.map_or(own, |o| o.min(own));
            if effective.saturating_sub(last) > eager_ms {
                last = effective;
                pending = Some(effective).filter(|e| *e > reader.emitted);
            }
        }
        if start < b.num_rows() {
            self.chain.process_batch(b.slice(start, b.num_rows() - start), outbox)?;
        }
        reader.splits[i].watermark = own;
        if let Some(p) = pending {
            self.emit_watermark(reader, p, outbox)?;
        }
        Ok(())
    }

    fn emit_watermark(&mut self, reader: &mut Reader, w: Timestamp, outbox: &mut Vec<StreamMessage>) -> Result<()> {
        reader.emitted = w;
        self.metrics.watermark.fetch_max(w, Ordering::Relaxed);
        self.chain.process_watermark(w, outbox)
    }

    fn emit_combined(&mut self, reader: &mut Reader, outbox: &mut Vec<StreamMessage>) -> Result<()> {
        if self.watermark.is_none() {
            return Ok(());
        }
        match reader.combined(None) {
            Some(w) if w > reader.emitted => {
                reader.emitted = w;
                self.metrics.watermark.fetch_max(w, Ordering::Relaxed);
                self.chain.process_watermark(w, outbox)?;
            }
            Some(_) => {}
            None => {
                // Every split idle (or none assigned). First flush: emit the
                // highest watermark any idle split reached (FLINK-38454), so
                // the order in which splits went idle does not matter; then
                // tell downstream not to wait for us.
                // A reader awaiting new splits counts its finished ones too:
                // a file read to its end has advanced event time that far.
                let awaits = self.awaits_splits();
                let flush = reader
                    .splits
                    .iter()
                    .filter(|s| awaits || !s.finished)
                    .map(|s| s.watermark)
                    .max();
                if let Some(w) = flush.filter(|w| *w > reader.emitted) {
                    reader.emitted = w;
                    self.metrics.watermark.fetch_max(w, Ordering::Relaxed);
                    self.chain.process_watermark(w, outbox)?;
                }
                let unfinished = awaits || reader.splits.is_empty() || reader.splits.iter().any(|s| !s.finished);
                if unfinished && !reader.idle {
                    reader.idle = true;
                    outbox.push(StreamMessage::WatermarkStatus(WatermarkStatus::Idle));
                }
            }
        }
        Ok(())
    }
}

/// Timestamp values of `array` in epoch milliseconds.
fn to_millis(array: &arrow::array::ArrayRef) -> Result<Vec<Option<i64>>> {
    let target = DataType::Timestamp(TimeUnit::Millisecond, None);
    let a = match array.data_type() {
        DataType::Timestamp(TimeUnit::Millisecond, None) => array.clone(),
        DataType::Timestamp(_, _) => cast(array, &target)?,
        other => {
            return Err(ExecError::Config(format!(
                "watermark expression must be TIMESTAMP(3) or TIMESTAMP_LTZ(3), got {other}"
            )));
        }
    };
    let a = a.as_primitive::<TimestampMillisecondType>();
    Ok((0..a.len()).map(|i| (!a.is_null(i)).then(|| a.value(i))).collect())
}

/// Pauses or resumes a split, keeping paused time out of its idleness clock.
fn set_paused(s: &mut SplitState, paused: bool, now: Instant) {
    if paused == s.align.paused {
        return;
    }
    s.align.paused = paused;
    if paused {
        s.paused_since = Some(now);
    } else if let Some(since) = s.paused_since.take() {
        let d = now.duration_since(since);
        s.paused_total += d;
        s.last_activity += d;
        s.split.resumed_after(d);
    }
}

/// `SplitPoll::Batch` is turned into `Changes` before the match.
fn unreachable_batch() -> Result<()> {
    Err(crate::error::ExecError::internal(
        "a split batch was not converted to changes",
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use arrow::array::TimestampMillisecondArray;
    use arrow::datatypes::{Field, Schema};
    use datafusion::physical_expr::expressions::Column;
    use tokio::sync::mpsc;

    use super::*;
    use crate::runtime::output::Partitioner;
    use arrow::record_batch::RecordBatch;

    /// Emits its batches, then has nothing more for a long time.
    struct ScriptedSplit {
        batches: VecDeque<RecordBatch>,
    }

    impl SourceSplit for ScriptedSplit {
        fn id(&self) -> String {
            "scripted".into()
        }

        fn poll_batch(&mut self) -> Result<SplitPoll> {
            Ok(match self.batches.pop_front() {
                Some(b) => SplitPoll::Batch(b),
                None => SplitPoll::Wait(Instant::now() + Duration::from_secs(3600)),
            })
        }

        fn offset(&self) -> u64 {
            0
        }

        fn seek(&mut self, _position: u64) -> Result<()> {
            Ok(())
        }
    }

    /// Always has data: event time climbs to `max` and stays there.
    struct BusySplit {
        next: i64,
        max: i64,
    }

    impl SourceSplit for BusySplit {
        fn id(&self) -> String {
            "busy".into()
        }

        fn poll_batch(&mut self) -> Result<SplitPoll> {
            let ts = self.next.min(self.max);
            self.next += 1_000;
            Ok(SplitPoll::Batch(batch(&[ts])))
        }

        fn offset(&self) -> u64 {
            0
        }

        fn seek(&mut self, _position: u64) -> Result<()> {
            Ok(())
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        )]))
    }

    fn batch(ts: &[i64]) -> RecordBatch {
        RecordBatch::try_new(schema(), vec![Arc::new(TimestampMillisecondArray::from(ts.to_vec()))]).expect("batch")
    }

    fn task(
        splits: Vec<Box<dyn SourceSplit>>,
        idle: Option<Duration>,
        tx: mpsc::Sender<StreamMessage>,
        stop: watch::Receiver<bool>,
    ) -> SourceTask {
        SourceTask {
            splits,
            bounded: false,
            computed: None,
            schema: schema(),
            watermark: Some(WatermarkNode {
                column: "ts".into(),
                sql: "ts".into(),
                expr: Arc::new(Column::new("ts", 0)),
                idle_timeout: idle,
                alignment: None,
            }),
            rowtime_index: Some(0),
            emit: EmitStrategy::OnPeriodic,
            interval: Duration::from_millis(10),
            chain: Chain::new(vec![], vec![], vec![], 0, Default::default()),
            output: Output::channels(vec![tx], Partitioner::Forward),
            stop,
            metrics: Arc::new(NodeMetrics::new("source".into())),
            alignment: None,
            status: None,
            uid: "source-test".into(),
            subtask: 0,
            restored: HashMap::new(),
            triggers: None,
            checkpointing: None,
            dead_letters: None,
            inbox: None,
        }
    }

    /// Waits (with a deadline) for a watermark of at least `at_least`.
    async fn await_watermark(rx: &mut mpsc::Receiver<StreamMessage>, at_least: i64) -> Vec<StreamMessage> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = vec![];
        loop {
            let msg = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no watermark >= {at_least} before the deadline; saw {seen:?}"))
                .expect("source still running");
            let done = matches!(msg, StreamMessage::Watermark(w) if w >= at_least);
            seen.push(msg);
            if done {
                return seen;
            }
        }
    }

    #[tokio::test]
    async fn an_idle_split_does_not_hold_back_the_reader_watermark() {
        let busy = BusySplit {
            next: 1_000,
            max: 5_000,
        };
        let silent = ScriptedSplit {
            batches: VecDeque::new(),
        };
        let (tx, mut rx) = mpsc::channel(64);
        let (stop_tx, stop_rx) = watch::channel(false);
        let t = task(
            vec![Box::new(busy), Box::new(silent)],
            Some(Duration::from_millis(50)),
            tx,
            stop_rx,
        );
        let handle = tokio::spawn(t.run());
        // The busy split never idles; the silent one goes idle after 50 ms,
        // and from then on the reader's watermark is the busy split's.
        let seen = await_watermark(&mut rx, 5_000).await;
        assert!(
            !seen
                .iter()
                .any(|m| matches!(m, StreamMessage::Watermark(w) if *w > 5_000)),
            "never beyond the data: {seen:?}"
        );
        stop_tx.send(true).expect("stop");
        handle.await.expect("join").expect("source ends cleanly on stop");
    }

    #[tokio::test]
    async fn a_reader_whose_splits_are_all_silent_goes_idle() {
        let (tx, mut rx) = mpsc::channel(64);
        let (stop_tx, stop_rx) = watch::channel(false);
        let t = task(
            vec![Box::new(ScriptedSplit {
                batches: VecDeque::new(),
            })],
            Some(Duration::from_millis(20)),
            tx,
            stop_rx,
        );
        let handle = tokio::spawn(t.run());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let msg = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .expect("idle status before the deadline")
                .expect("running");
            match msg {
                StreamMessage::WatermarkStatus(WatermarkStatus::Idle) => break,
                StreamMessage::Watermark(w) => panic!("no data, yet watermark {w}"),
                _ => {}
            }
        }
        stop_tx.send(true).expect("stop");
        handle.await.expect("join").expect("clean stop");
    }
}
