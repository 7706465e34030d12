//! The loop of a non-source subtask: read the input gate, run the chain,
//! send what comes out. Watermarks, barriers and end of input are visible
//! here, in order with the data.

use std::time::{Duration, Instant};

use crate::change::ChangeBatch;
use crate::checkpoint::{OperatorSnapshot, TaskCheckpointing, TaskReport, TaskSnapshot, encode_batches};
use crate::error::Result;
use crate::message::{Barrier, StreamMessage};
use crate::runtime::chain::Chain;
use crate::runtime::gate::{GateEvent, InputGate};
use crate::runtime::output::Output;

pub struct OperatorTask {
    pub gate: InputGate,
    pub chain: Chain,
    pub output: Output,
    /// `None` when the job does not checkpoint.
    pub checkpointing: Option<TaskCheckpointing>,
    /// In-flight data of the restored unaligned checkpoint: processed
    /// before any new input.
    pub replay: Vec<(usize, ChangeBatch)>,
    /// Key of this task's in-flight data in a checkpoint.
    pub in_flight_key: String,
}

/// An unaligned checkpoint whose in-flight data is still being recorded.
struct UnalignedPending {
    barrier: Barrier,
    snapshot: TaskSnapshot,
    /// Per input of the first operator.
    recorded: Vec<(usize, ChangeBatch)>,
    alignment: Duration,
    sync: Duration,
}

/// Sends everything the chain produced, in order.
pub async fn flush(outbox: &mut Vec<StreamMessage>, output: &mut Output) -> Result<()> {
    for msg in outbox.drain(..) {
        match msg {
            StreamMessage::Batch(b) => output.send_batch(b).await?,
            other => output.broadcast(other).await?,
        }
    }
    Ok(())
}

/// Barrier `barrier` passed the chain: forward it, then snapshot the chain
/// (nothing is processed in between, so the snapshot is exactly the state
/// at the barrier) and acknowledge.
pub async fn checkpoint_chain(
    barrier: Barrier,
    alignment: std::time::Duration,
    mut snapshot: TaskSnapshot,
    chain: &mut Chain,
    output: &mut Output,
    checkpointing: Option<&TaskCheckpointing>,
) -> Result<()> {
    // Ahead of queued data on the priority lanes (unaligned checkpoints),
    // and in order with the data as the marker.
    // Savepoints stay aligned.
    if !barrier.is_savepoint() {
        output.announce(barrier);
    }
    output.broadcast(StreamMessage::Barrier(barrier)).await?;
    let Some(cp) = checkpointing else { return Ok(()) };
    let started = Instant::now();
    // Appended: a source reader's snapshot already holds its dead letters.
    snapshot.operators.extend(chain.snapshot(barrier.checkpoint_id)?);
    cp.report(TaskReport::Ack {
        checkpoint_id: barrier.checkpoint_id,
        task: cp.task,
        snapshot,
        alignment,
        sync: started.elapsed(),
    });
    Ok(())
}

/// The task ended: its final part of the last checkpoint.
pub fn report_finished(
    mut snapshot: TaskSnapshot,
    chain: &mut Chain,
    checkpointing: Option<&TaskCheckpointing>,
) -> Result<()> {
    let Some(cp) = checkpointing else { return Ok(()) };
    snapshot.operators.extend(chain.final_snapshot()?);
    cp.report(TaskReport::Finished {
        task: cp.task,
        snapshot,
    });
    Ok(())
}

impl OperatorTask {
    /// Acknowledges an unaligned snapshot with the in-flight data recorded
    /// for it. (One that was subsumed is dropped by the coordinator, which
    /// keeps its sink output and deletes its local files.)
    fn ack_unaligned(&self, mut u: UnalignedPending) -> Result<()> {
        let Some(cp) = self.checkpointing.as_ref() else {
            return Ok(());
        };
        // One stream per input (a join's inputs have different schemas):
        // input 0 under the task's key, input i under `<key>-i`.
        let inputs = u.recorded.iter().map(|(i, _)| *i).max().unwrap_or(0);
        for input in 0..=inputs {
            let batches: Vec<ChangeBatch> = u
                .recorded
                .iter()
                .filter(|(i, _)| *i == input)
                .map(|(_, b)| b.clone())
                .collect();
            let bytes = encode_batches(&batches)?;
            u.snapshot.operators.push((
                crate::checkpoint::in_flight_input_key(&self.in_flight_key, input),
                OperatorSnapshot::InFlight(bytes),
            ));
        }
        cp.report(TaskReport::Ack {
            checkpoint_id: u.barrier.checkpoint_id,
            task: cp.task,
            snapshot: u.snapshot,
            alignment: u.alignment,
            sync: u.sync,
        });
        Ok(())
    }

    pub async fn run(mut self) -> Result<()> {
        let mut outbox = Vec::new();
        for (input, b) in std::mem::take(&mut self.replay) {
            self.chain.process_input(input, b, &mut outbox)?;
            flush(&mut outbox, &mut self.output).await?;
        }
        let mut unaligned: Option<UnalignedPending> = None;
        // Processing-time ticks (state TTL) for the operators that ask.
        // The first tick a period from now: `interval`'s first completes at
        // once, which flushed an upsert sink's reduce buffer at whatever
        // moment the task first lost the race to its input.
        let mut ticker = self.chain.processing_time_interval().map(|d| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + d, d);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            t
        });
        loop {
            let event = match ticker.as_mut() {
                // The tick first: it is ready only once a period, so a
                // busy gate cannot starve it (nor it the gate). The gate's
                // `next` keeps what it read in itself, so dropping it for
                // a tick loses nothing.
                Some(t) => tokio::select! {
                    biased;
                    _ = t.tick() => {
                        self.chain.process_time(&mut outbox)?;
                        flush(&mut outbox, &mut self.output).await?;
                        continue;
                    }
                    ev = self.gate.next() => ev,
                },
                None => self.gate.next().await,
            };
            match event {
                GateEvent::Batch(input, b) => self.chain.process_input(input, b, &mut outbox)?,
                GateEvent::SnapshotUnaligned(b, alignment) => {
                    // Snapshot now: the barrier overtakes queued data
                    // downstream; what overtook us here is recorded.
                    flush(&mut outbox, &mut self.output).await?;
                    self.output.announce(b);
                    self.output.broadcast(StreamMessage::Barrier(b)).await?;
                    if let Some(old) = unaligned.take() {
                        // Subsumed before its in-flight data was complete:
                        // acknowledged late, the coordinator drops it but
                        // keeps its sink output for the next checkpoint.
                        self.ack_unaligned(old)?;
                    }
                    if self.checkpointing.is_some() {
                        let started = Instant::now();
                        let operators = self.chain.snapshot(b.checkpoint_id)?;
                        unaligned = Some(UnalignedPending {
                            barrier: b,
                            snapshot: TaskSnapshot {
                                sources: vec![],
                                operators,
                            },
                            recorded: vec![],
                            alignment,
                            sync: started.elapsed(),
                        });
                    }
                }
                GateEvent::InFlight(input, b) => {
                    if let Some(u) = unaligned.as_mut() {
                        u.recorded.push((input, b.clone()));
                    }
                    self.chain.process_input(input, b, &mut outbox)?;
                }
                GateEvent::InFlightComplete(_) => {
                    if let Some(u) = unaligned.take() {
                        self.ack_unaligned(u)?;
                    }
                }
                GateEvent::Watermark(w) => self.chain.process_watermark(w, &mut outbox)?,
                GateEvent::Status(s) => outbox.push(StreamMessage::WatermarkStatus(s)),
                GateEvent::Barrier(b, alignment) => {
                    flush(&mut outbox, &mut self.output).await?;
                    checkpoint_chain(
                        b,
                        alignment,
                        TaskSnapshot::default(),
                        &mut self.chain,
                        &mut self.output,
                        self.checkpointing.as_ref(),
                    )
                    .await?;
                }
                GateEvent::End => {
                    if let Some(u) = unaligned.take() {
                        self.ack_unaligned(u)?;
                    }
                    self.chain.end_of_input(&mut outbox)?;
                    flush(&mut outbox, &mut self.output).await?;
                    return report_finished(TaskSnapshot::default(), &mut self.chain, self.checkpointing.as_ref());
                }
            }
            flush(&mut outbox, &mut self.output).await?;
            if self.chain.is_finished() || self.output.is_closed() {
                // LIMIT reached or nobody downstream: end early. Dropping
                // the gate closes our inputs, which stops upstream tasks.
                if let Some(u) = unaligned.take() {
                    self.ack_unaligned(u)?;
                }
                self.chain.end_of_input(&mut outbox)?;
                flush(&mut outbox, &mut self.output).await?;
                return report_finished(TaskSnapshot::default(), &mut self.chain, self.checkpointing.as_ref());
            }
        }
    }
}
