//! One sink subtask's writer: Parquet files in a directory of its own
//! inside the table, described at each barrier as Delta `add` actions.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use deltalake_core::kernel::Add;
use deltalake_core::writer::{DeltaWriter as _, RecordBatchWriter};
use parquet::file::properties::WriterProperties;

use super::table::{DeltaLocation, to_delta};
use crate::change::ChangeBatch;
use crate::checkpoint::objects::block_on;
use crate::connectors::{CommittingWriter, SinkContext};
use crate::error::{ExecError, Result};
use crate::operators::{Collector, Operator};

pub struct DeltaWriter {
    table: Arc<DeltaLocation>,
    schema: SchemaRef,
    partition_keys: Vec<String>,
    /// This subtask's directory, relative to the table's: the prefix of
    /// its files' `add` paths.
    prefix: String,
    /// `None` only while a call runs on the object-store runtime.
    writer: Option<RecordBatchWriter>,
    exactly_once: bool,
    name: String,
}

impl DeltaWriter {
    pub fn new(
        table: Arc<DeltaLocation>,
        schema: SchemaRef,
        partition_keys: &[String],
        file_size: u64,
        compression: parquet::basic::Compression,
        subtask: usize,
        ctx: &SinkContext,
    ) -> Result<Self> {
        let prefix = format!("{}/{}-{subtask}", super::committer::job_dir(ctx), ctx.attempt);
        if let Some(dir) = &table.local {
            // Fails early (a directory not writable) with its name.
            let dir = dir.join(&prefix);
            std::fs::create_dir_all(&dir).map_err(|e| table.error(format!("cannot create {}: {e}", dir.display())))?;
        }
        let url = table.dir_url(&prefix)?;
        let props = WriterProperties::builder().set_compression(compression).build();
        let writer = RecordBatchWriter::try_new(
            url.as_str(),
            schema.clone(),
            (!partition_keys.is_empty()).then(|| partition_keys.to_vec()),
            None,
        )
        .map_err(|e| table.error(format!("cannot write: {e}")))?
        .with_target_file_size(file_size)
        .with_writer_properties(props);
        Ok(Self {
            name: format!("Sink: {}", table.name),
            table,
            schema,
            partition_keys: partition_keys.to_vec(),
            prefix,
            writer: Some(writer),
            exactly_once: ctx.exactly_once,
        })
    }

    fn take(&mut self) -> Result<RecordBatchWriter> {
        self.writer
            .take()
            .ok_or_else(|| ExecError::internal("the Delta writer is gone (a write failed before)"))
    }

    /// Writes `rows` (Delta's types) into this subtask's open files, on
    /// the object-store runtime (delta-rs is async).
    fn write_rows(&mut self, rows: arrow::record_batch::RecordBatch) -> Result<()> {
        let mut w = self.take()?;
        let (w, r) = block_on("a Delta table", async move {
            let r = w.write(rows).await;
            (w, r)
        })
        .map_err(|e| self.table.error(e))?;
        self.writer = Some(w);
        r.map_err(|e| self.table.error(format!("cannot write: {e}")))
    }

    /// Closes the open files: what they hold is durable, in no version of
    /// the table yet. Their `add` actions, paths relative to the table.
    fn close_files(&mut self) -> Result<Vec<Add>> {
        let mut w = self.take()?;
        let (w, r) = block_on("a Delta table", async move {
            let r = w.flush().await;
            (w, r)
        })
        .map_err(|e| self.table.error(e))?;
        self.writer = Some(w);
        let mut adds = r.map_err(|e| self.table.error(format!("cannot close its files: {e}")))?;
        for a in &mut adds {
            a.path = format!("{}/{}", self.prefix, a.path);
        }
        Ok(adds)
    }
}

impl Operator for DeltaWriter {
    fn name(&self) -> &str {
        &self.name
    }

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        if batch.rows.num_rows() == 0 {
            return Ok(());
        }
        // The planner sends inserts only (`accepts_changes` is false).
        let rows = to_delta(&batch.rows, &self.schema)?;
        self.write_rows(rows)
    }

    fn on_end_of_input(&mut self, _out: &mut Collector) -> Result<()> {
        if self.exactly_once {
            // The final checkpoint commits (`final_pre_commit`).
            return Ok(());
        }
        // Without checkpointing the output becomes visible at the end, in
        // one commit of this subtask's files.
        let adds = self.close_files()?;
        self.table.create_if_absent(&self.schema, &self.partition_keys)?;
        let mut table = self.table.unloaded()?;
        let keys = self.partition_keys.clone();
        block_on("a Delta table", async move {
            table.load().await?;
            super::committer::commit_adds(&mut table, keys, adds, None).await
        })
        .map_err(|e| self.table.error(e))?
        .map_err(|e| self.table.error(format!("cannot commit: {e}")))
        .map(|_| ())
    }
}

impl CommittingWriter for DeltaWriter {
    fn pre_commit(&mut self, _checkpoint_id: u64) -> Result<Vec<serde_json::Value>> {
        committables(self.close_files()?)
    }

    fn final_pre_commit(&mut self) -> Result<Vec<serde_json::Value>> {
        committables(self.close_files()?)
    }
}

fn committables(adds: Vec<Add>) -> Result<Vec<serde_json::Value>> {
    adds.into_iter()
        .map(|a| serde_json::to_value(a).map_err(|e| ExecError::internal(format!("a Delta add action as JSON: {e}"))))
        .collect()
}
