//! `blackhole`: discards every row (for benchmarks: measures everything
//! but the sink).

use super::SinkFactory;
use crate::error::Result;
use crate::operators::{Collector, Operator};

#[derive(Debug)]
pub struct BlackholeSink;

impl SinkFactory for BlackholeSink {
    fn name(&self) -> &str {
        "blackhole"
    }

    fn accepts_changes(&self) -> bool {
        true
    }

    /// As Flink's: `-U` is not asked for.
    fn writes_upserts(&self) -> bool {
        true
    }

    fn create_writer(
        &self,
        _subtask: usize,
        _parallelism: usize,
        _ctx: &super::SinkContext,
    ) -> Result<super::SinkWriter> {
        Ok(super::SinkWriter::Direct(Box::new(BlackholeWriter)))
    }
}

struct BlackholeWriter;

impl Operator for BlackholeWriter {
    fn name(&self) -> &str {
        "Sink: blackhole"
    }

    fn process_batch(&mut self, _batch: crate::change::ChangeBatch, _out: &mut Collector) -> Result<()> {
        Ok(())
    }
}
