//! A chain of forward-connected operators running in one task. Batches go
//! through synchronously; what leaves the last operator is collected for
//! the task to send. Watermarks visit every operator in order, each firing
//! its timers before the watermark moves on (results precede the watermark
//! that produced them).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::change::ChangeBatch;
use crate::checkpoint::{OperatorSnapshot, operator_key};
use crate::clock::Clock;
use crate::error::Result;
use crate::message::{StreamMessage, Timestamp};
use crate::operators::{Collector, Operator};
use crate::runtime::metrics::NodeMetrics;

pub struct Chain {
    ops: Vec<Box<dyn Operator>>,
    metrics: Vec<Arc<NodeMetrics>>,
    /// Uid of each operator, and this subtask's index: the keys of their
    /// state in a checkpoint.
    uids: Vec<String>,
    subtask: usize,
    /// Set when an operator needs no more input (LIMIT reached).
    finished: bool,
    /// The job's processing-time clock, read at each tick.
    clock: Clock,
}

impl Chain {
    pub fn new(
        ops: Vec<Box<dyn Operator>>,
        metrics: Vec<Arc<NodeMetrics>>,
        uids: Vec<String>,
        subtask: usize,
        clock: Clock,
    ) -> Self {
        debug_assert_eq!(ops.len(), metrics.len());
        debug_assert_eq!(ops.len(), uids.len());
        Self {
            ops,
            metrics,
            uids,
            subtask,
            finished: false,
            clock,
        }
    }

    /// Every operator's state at barrier `checkpoint_id`.
    pub fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<(String, OperatorSnapshot)>> {
        let mut out = vec![];
        for (op, uid) in self.ops.iter_mut().zip(&self.uids) {
            if let Some(s) = op.snapshot_state(checkpoint_id)? {
                out.push((operator_key(uid, self.subtask), s));
            }
        }
        Ok(out)
    }

    /// What the final checkpoint holds of this chain (after end of input).
    pub fn final_snapshot(&mut self) -> Result<Vec<(String, OperatorSnapshot)>> {
        let mut out = vec![];
        for (op, uid) in self.ops.iter_mut().zip(&self.uids) {
            if let Some(s) = op.final_snapshot()? {
                out.push((operator_key(uid, self.subtask), s));
            }
        }
        Ok(out)
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    pub fn process_batch(&mut self, batch: ChangeBatch, out: &mut Vec<StreamMessage>) -> Result<()> {
        self.push(0, 0, batch, out)
    }

    /// A batch for input `input` of the chain's first operator.
    pub fn process_input(&mut self, input: usize, batch: ChangeBatch, out: &mut Vec<StreamMessage>) -> Result<()> {
        self.push(0, input, batch, out)
    }

    fn push(&mut self, idx: usize, input: usize, batch: ChangeBatch, out: &mut Vec<StreamMessage>) -> Result<()> {
        if idx == self.ops.len() {
            out.push(StreamMessage::Batch(batch));
            return Ok(());
        }
        self.metrics[idx]
            .rows_in
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        let mut c = Collector::default();
        self.ops[idx].process_input(input, batch, &mut c)?;
        self.forward(idx, c, out)
    }

    fn forward(&mut self, idx: usize, mut c: Collector, out: &mut Vec<StreamMessage>) -> Result<()> {
        if c.is_finished() {
            self.finished = true;
        }
        for b in c.take() {
            self.metrics[idx]
                .rows_out
                .fetch_add(b.num_rows() as u64, Ordering::Relaxed);
            self.push(idx + 1, 0, b, out)?;
        }
        Ok(())
    }

    pub fn process_watermark(&mut self, wm: Timestamp, out: &mut Vec<StreamMessage>) -> Result<()> {
        let mut wm = wm;
        for idx in 0..self.ops.len() {
            let mut c = Collector::default();
            self.ops[idx].on_watermark(wm, &mut c)?;
            self.metrics[idx].watermark.fetch_max(wm, Ordering::Relaxed);
            self.forward(idx, c, out)?;
            // An operator whose output rows may lie behind its input
            // watermark holds the watermark back (the end of input stays
            // the end).
            let delay = self.ops[idx].watermark_delay();
            if delay > 0 && wm != crate::message::MAX_WATERMARK {
                wm = wm.saturating_sub(delay);
            }
        }
        out.push(StreamMessage::Watermark(wm));
        Ok(())
    }

    /// The shortest processing-time interval an operator asks for.
    pub fn processing_time_interval(&self) -> Option<std::time::Duration> {
        self.ops.iter().filter_map(|o| o.processing_time_interval()).min()
    }

    /// A processing-time tick: every operator that asked is told the
    /// clock's time.
    pub fn process_time(&mut self, out: &mut Vec<StreamMessage>) -> Result<()> {
        let now = self.clock.now_ms();
        for idx in 0..self.ops.len() {
            if self.ops[idx].processing_time_interval().is_none() {
                continue;
            }
            let mut c = Collector::default();
            self.ops[idx].on_processing_time(now, &mut c)?;
            self.forward(idx, c, out)?;
        }
        Ok(())
    }

    pub fn end_of_input(&mut self, out: &mut Vec<StreamMessage>) -> Result<()> {
        for idx in 0..self.ops.len() {
            let mut c = Collector::default();
            self.ops[idx].on_end_of_input(&mut c)?;
            self.forward(idx, c, out)?;
        }
        out.push(StreamMessage::EndOfInput);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::operators::Collector;

    /// Records the processing times it is told.
    struct Probe(Arc<Mutex<Vec<i64>>>);

    impl Operator for Probe {
        fn name(&self) -> &str {
            "probe"
        }

        fn process_batch(&mut self, _batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
            Ok(())
        }

        fn processing_time_interval(&self) -> Option<std::time::Duration> {
            Some(std::time::Duration::from_millis(100))
        }

        fn on_processing_time(&mut self, now: i64, _out: &mut Collector) -> Result<()> {
            self.0.lock().expect("probe").push(now);
            Ok(())
        }
    }

    #[test]
    fn ticks_tell_operators_the_jobs_clock() {
        let told = Arc::new(Mutex::new(vec![]));
        let clock = Clock::driven(1_000);
        let mut chain = Chain::new(
            vec![Box::new(Probe(told.clone()))],
            vec![Arc::new(NodeMetrics::new("probe".into()))],
            vec!["probe_1".into()],
            0,
            clock.clone(),
        );
        let mut out = vec![];
        chain.process_time(&mut out).expect("tick");
        assert!(clock.set_ms(61_000));
        chain.process_time(&mut out).expect("tick");
        assert_eq!(*told.lock().expect("probe"), [1_000, 61_000]);
    }
}
