//! The loop of a non-source subtask: read the input gate, run the chain,
//! send what comes out. Watermarks, barriers and end of input are visible
//! here, in order with the data.

use std::time::Instant;

use crate::checkpoint::{TaskCheckpointing, TaskReport, TaskSnapshot};
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
    output.broadcast(StreamMessage::Barrier(barrier)).await?;
    let Some(cp) = checkpointing else { return Ok(()) };
    let started = Instant::now();
    snapshot.operators = chain.snapshot(barrier.checkpoint_id)?;
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
    snapshot.operators = chain.final_snapshot()?;
    cp.report(TaskReport::Finished {
        task: cp.task,
        snapshot,
    });
    Ok(())
}

impl OperatorTask {
    pub async fn run(mut self) -> Result<()> {
        let mut outbox = Vec::new();
        loop {
            match self.gate.next().await {
                GateEvent::Batch(b) => self.chain.process_batch(b, &mut outbox)?,
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
                    self.chain.end_of_input(&mut outbox)?;
                    flush(&mut outbox, &mut self.output).await?;
                    return report_finished(TaskSnapshot::default(), &mut self.chain, self.checkpointing.as_ref());
                }
            }
            flush(&mut outbox, &mut self.output).await?;
            if self.chain.is_finished() || self.output.is_closed() {
                // LIMIT reached or nobody downstream: end early. Dropping
                // the gate closes our inputs, which stops upstream tasks.
                self.chain.end_of_input(&mut outbox)?;
                flush(&mut outbox, &mut self.output).await?;
                return report_finished(TaskSnapshot::default(), &mut self.chain, self.checkpointing.as_ref());
            }
        }
    }
}
