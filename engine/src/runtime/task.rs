//! The loop of a non-source subtask: read the input gate, run the chain,
//! send what comes out. Watermarks and end of input are visible here, in
//! order with the data.

use crate::error::Result;
use crate::message::StreamMessage;
use crate::runtime::chain::Chain;
use crate::runtime::gate::{GateEvent, InputGate};
use crate::runtime::output::Output;

pub struct OperatorTask {
    pub gate: InputGate,
    pub chain: Chain,
    pub output: Output,
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

impl OperatorTask {
    pub async fn run(mut self) -> Result<()> {
        let mut outbox = Vec::new();
        loop {
            match self.gate.next().await {
                GateEvent::Batch(b) => self.chain.process_batch(b, &mut outbox)?,
                GateEvent::Watermark(w) => self.chain.process_watermark(w, &mut outbox)?,
                GateEvent::Status(s) => outbox.push(StreamMessage::WatermarkStatus(s)),
                // Checkpointing is not wired yet: barriers pass through.
                GateEvent::Barrier(b) => outbox.push(StreamMessage::Barrier(b)),
                GateEvent::End => {
                    self.chain.end_of_input(&mut outbox)?;
                    flush(&mut outbox, &mut self.output).await?;
                    return Ok(());
                }
            }
            flush(&mut outbox, &mut self.output).await?;
            if self.chain.is_finished() || self.output.is_closed() {
                // LIMIT reached or nobody downstream: end early. Dropping
                // the gate closes our inputs, which stops upstream tasks.
                self.chain.end_of_input(&mut outbox)?;
                flush(&mut outbox, &mut self.output).await?;
                return Ok(());
            }
        }
    }
}
