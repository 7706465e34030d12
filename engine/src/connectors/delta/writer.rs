//! One sink subtask's writer: Parquet files in a directory of its own
//! inside the table, described at each barrier as Delta `add` actions.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use deltalake_core::kernel::Add;
use deltalake_core::writer::{DeltaWriter as _, RecordBatchWriter};

use super::committer::{Committable, DeltaCommitter};
use super::table::{DeltaLocation, to_delta};
use super::upserts::Upserts;
use crate::change::ChangeBatch;
use crate::checkpoint::objects::block_on_here;
use crate::connectors::{CommittingWriter, SinkContext};
use crate::error::{ExecError, Result};
use crate::operators::{Collector, Operator};

pub struct DeltaWriter {
    table: Arc<DeltaLocation>,
    schema: SchemaRef,
    /// This subtask's directory, relative to the table's: the prefix of
    /// its files' `add` paths.
    prefix: String,
    /// `None` only while a call runs on the object-store runtime.
    writer: Option<RecordBatchWriter>,
    exactly_once: bool,
    name: String,
    /// A keyed table's changes since the last barrier (`None`: append).
    upserts: Option<Upserts>,
    /// Keys files written, for their names.
    keys_files: u64,
    sink_uid: String,
    /// Commits at the end of input when the job does not checkpoint.
    committer: DeltaCommitter,
}

impl DeltaWriter {
    /// The writer of subtask `subtask` of `sink`.
    pub fn new(sink: &super::DeltaSink, subtask: usize, ctx: &SinkContext) -> Result<Self> {
        let (table, schema, partition_keys, key) = (
            sink.table.clone(),
            sink.schema.clone(),
            sink.partition_keys.as_slice(),
            sink.key.clone(),
        );
        let file_size = sink.file_size;
        let prefix = format!("{}/{}-{subtask}", super::committer::job_dir(ctx), ctx.attempt);
        if let Some(dir) = &table.local {
            // Fails early (a directory not writable) with its name.
            let dir = dir.join(&prefix);
            std::fs::create_dir_all(&dir).map_err(|e| table.error(format!("cannot create {}: {e}", dir.display())))?;
        }
        let url = table.dir_url(&prefix)?;
        let writer = RecordBatchWriter::try_new(
            url.as_str(),
            schema.clone(),
            (!partition_keys.is_empty()).then(|| partition_keys.to_vec()),
            None,
        )
        .map_err(|e| table.error(format!("cannot write: {e}")))?
        .with_target_file_size(file_size)
        .with_writer_properties(sink.parquet.clone());
        let upserts = key.map(Upserts::new).transpose()?;
        let committer = DeltaCommitter::new(sink, ctx);
        Ok(Self {
            name: format!("Sink: {}", table.name),
            table,
            schema,
            prefix,
            writer: Some(writer),
            exactly_once: ctx.exactly_once,
            upserts,
            keys_files: 0,
            sink_uid: ctx.sink_uid.clone(),
            committer,
        })
    }

    /// What the files written since the last barrier hold, as
    /// committables: their `add` actions, and a keyed table's keys file.
    fn pre_commit_all(&mut self) -> Result<Vec<serde_json::Value>> {
        let mut out = vec![];
        if let Some(u) = &mut self.upserts {
            let flushed = u.flush()?;
            if let Some(rows) = flushed.rows {
                self.write_rows(rows)?;
            }
            if let Some(keys) = flushed.keys {
                let n = keys.num_rows() as u64;
                self.keys_files += 1;
                // Named by the sink too: two sinks of a job may write one table.
                let path = format!("{}/keys-{}-{}.parquet", self.prefix, self.sink_uid, self.keys_files);
                super::committer::write_keys_file(&self.table, &path, keys)?;
                out.push(Committable::Keys {
                    touched_keys: path,
                    keys: n,
                });
            }
        }
        for add in self.close_files()? {
            out.push(Committable::Add(Box::new(add)));
        }
        out.into_iter()
            .map(|c| {
                serde_json::to_value(c).map_err(|e| ExecError::internal(format!("a Delta committable as JSON: {e}")))
            })
            .collect()
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
        let (w, r) = block_on_here("a Delta table", async move {
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
        let (w, r) = block_on_here("a Delta table", async move {
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
        let rows = to_delta(&batch.rows, &self.schema)?;
        match &mut self.upserts {
            Some(u) => u.add(&batch, rows),
            // The planner sends an append table inserts only
            // (`accepts_changes` is false without a primary key).
            None => self.write_rows(rows),
        }
    }

    fn on_end_of_input(&mut self, _out: &mut Collector) -> Result<()> {
        if self.exactly_once {
            // The final checkpoint commits (`final_pre_commit`).
            return Ok(());
        }
        // Without checkpointing the output becomes visible at the end, in
        // one commit of this subtask's files.
        let committables = self.pre_commit_all()?;
        self.committer.commit_now(&committables)
    }
}

impl CommittingWriter for DeltaWriter {
    fn pre_commit(&mut self, _checkpoint_id: u64) -> Result<Vec<serde_json::Value>> {
        self.pre_commit_all()
    }

    fn final_pre_commit(&mut self) -> Result<Vec<serde_json::Value>> {
        self.pre_commit_all()
    }
}
