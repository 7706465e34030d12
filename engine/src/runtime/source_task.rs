//! The loop of a source subtask (a source reader): reads its splits in
//! turn, each with its own offset and watermark generator, evaluates
//! computed columns, and emits the reader watermark = min over the splits
//! that are neither idle nor finished.
//!
//! Emission follows `scan.watermark.emit.strategy`: `on-periodic` every
//! `pipeline.auto-watermark-interval`, or `on-event`, which is exactly
//! per-row semantics: a batch is cut before any row whose event time is at
//! or below the watermark the rows before it produced, and that watermark is
//! emitted at the cut. (Rows above the watermark cannot be affected by it,
//! so no other cut is needed.)

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow::record_batch::RecordBatch;
use datafusion::physical_expr::PhysicalExpr;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::connectors::{SourceSplit, SplitPoll};
use crate::error::{ExecError, Result};
use crate::message::{MAX_WATERMARK, MIN_WATERMARK, StreamMessage, Timestamp, WatermarkStatus};
use crate::operators::calc::project;
use crate::plan::WatermarkNode;
use crate::runtime::chain::Chain;
use crate::runtime::metrics::NodeMetrics;
use crate::runtime::output::Output;
use crate::runtime::task::flush;

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
}

struct Reader {
    splits: Vec<SplitState>,
    emitted: Timestamp,
    idle: bool,
    next: usize,
}

impl Reader {
    /// Min over active splits; `None` if there is none.
    fn combined(&self, except: Option<usize>, own: Timestamp) -> Option<Timestamp> {
        let others = self
            .splits
            .iter()
            .enumerate()
            .filter(|(i, s)| Some(*i) != except && !s.idle && !s.finished)
            .map(|(_, s)| s.watermark)
            .min();
        match except {
            Some(_) => Some(others.map_or(own, |o| o.min(own))),
            None => others,
        }
    }
}

impl SourceTask {
    pub async fn run(mut self) -> Result<()> {
        let now = Instant::now();
        let mut reader = Reader {
            splits: std::mem::take(&mut self.splits)
                .into_iter()
                .map(|split| SplitState {
                    split,
                    watermark: MIN_WATERMARK,
                    idle: false,
                    finished: false,
                    last_activity: now,
                    wait_until: None,
                })
                .collect(),
            emitted: MIN_WATERMARK,
            idle: false,
            next: 0,
        };
        let mut outbox = Vec::new();
        let mut next_tick = Instant::now() + self.interval;
        let idle_timeout = self.watermark.as_ref().and_then(|w| w.idle_timeout);
        loop {
            if *self.stop.borrow() || self.chain.is_finished() || self.output.is_closed() {
                // Stopped on purpose: end without a final watermark, so no
                // window fires on partial input.
                self.chain.end_of_input(&mut outbox)?;
                return flush(&mut outbox, &mut self.output).await;
            }
            if reader.splits.iter().all(|s| s.finished) && (self.bounded || !reader.splits.is_empty()) {
                return self.finish(&mut outbox).await;
            }
            let mut progressed = false;
            let n = reader.splits.len();
            let now = Instant::now();
            for k in 0..n {
                let i = (reader.next + k) % n;
                let s = &mut reader.splits[i];
                if s.finished || s.wait_until.is_some_and(|t| t > now) {
                    continue;
                }
                match s.split.poll_batch()? {
                    SplitPoll::Batch(b) => {
                        s.last_activity = now;
                        s.wait_until = None;
                        let was_idle = std::mem::replace(&mut s.idle, false);
                        if was_idle && reader.idle {
                            reader.idle = false;
                            outbox.push(StreamMessage::WatermarkStatus(WatermarkStatus::Active));
                        }
                        self.metrics.rows_out.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                        let b = match &self.computed {
                            Some(exprs) => project(&b, exprs, &self.schema)?,
                            None => b,
                        };
                        self.on_split_batch(&mut reader, i, b, &mut outbox)?;
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
                    if !s.finished && !s.idle && now.duration_since(s.last_activity) > timeout {
                        s.idle = true;
                    }
                }
            }
            if now >= next_tick || self.emit == EmitStrategy::OnEvent {
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
                    .filter(|s| !s.finished)
                    .filter_map(|s| s.wait_until)
                    .min()
                    .map_or(next_tick, |t| t.min(next_tick));
                let mut stop = self.stop.clone();
                tokio::select! {
                    _ = tokio::time::sleep_until(wake) => {}
                    _ = stop.changed() => {}
                }
            } else {
                tokio::task::yield_now().await;
            }
        }
    }

    async fn finish(&mut self, outbox: &mut Vec<StreamMessage>) -> Result<()> {
        if self.bounded {
            // End of bounded input: the final watermark fires everything.
            self.chain.process_watermark(MAX_WATERMARK, outbox)?;
        }
        self.chain.end_of_input(outbox)?;
        flush(outbox, &mut self.output).await
    }

    /// Updates split `i`'s watermark with batch `b` and passes `b` on,
    /// cutting it where on-event emission requires.
    fn on_split_batch(
        &mut self,
        reader: &mut Reader,
        i: usize,
        b: RecordBatch,
        outbox: &mut Vec<StreamMessage>,
    ) -> Result<()> {
        let Some(wm) = &self.watermark else {
            return self.chain.process_batch(b, outbox);
        };
        let values = to_millis(&wm.expr.evaluate(&b)?.into_array(b.num_rows())?)?;
        if self.emit == EmitStrategy::OnPeriodic {
            if let Some(max) = values.iter().flatten().max() {
                let s = &mut reader.splits[i];
                s.watermark = s.watermark.max(*max);
            }
            return self.chain.process_batch(b, outbox);
        }
        let rowtime = match self.rowtime_index {
            Some(r) => Some(to_millis(b.column(r))?),
            None => None,
        };
        let mut own = reader.splits[i].watermark;
        let mut start = 0;
        for row in 0..b.num_rows() {
            let effective = reader.combined(Some(i), own).unwrap_or(MIN_WATERMARK);
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

    fn emit_combined(&mut self, reader: &mut Reader, outbox: &mut Vec<StreamMessage>) -> Result<()> {
        if self.watermark.is_none() {
            return Ok(());
        }
        match reader.combined(None, MIN_WATERMARK) {
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
                let flush = reader.splits.iter().filter(|s| !s.finished).map(|s| s.watermark).max();
                if let Some(w) = flush.filter(|w| *w > reader.emitted) {
                    reader.emitted = w;
                    self.metrics.watermark.fetch_max(w, Ordering::Relaxed);
                    self.chain.process_watermark(w, outbox)?;
                }
                let unfinished = reader.splits.is_empty() || reader.splits.iter().any(|s| !s.finished);
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use arrow::array::TimestampMillisecondArray;
    use arrow::datatypes::{Field, Schema};
    use datafusion::physical_expr::expressions::Column;
    use tokio::sync::mpsc;

    use super::*;
    use crate::runtime::output::Partitioner;

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
            }),
            rowtime_index: Some(0),
            emit: EmitStrategy::OnPeriodic,
            interval: Duration::from_millis(10),
            chain: Chain::new(vec![], vec![]),
            output: Output::channels(vec![tx], Partitioner::Forward),
            stop,
            metrics: Arc::new(NodeMetrics::new("source".into())),
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
