//! The commit side of the Delta sink: one Delta commit per completed
//! checkpoint, idempotent through the `txn` action; recovery removes the
//! files of attempts that no version of the table references.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use deltalake_core::kernel::transaction::CommitBuilder;
use deltalake_core::kernel::{Action, Add, Transaction};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableBuilder};
use futures::TryStreamExt;

use super::table::DeltaLocation;
use crate::checkpoint::objects::block_on;
use crate::connectors::{Committer, SinkContext};
use crate::error::Result;

/// The directory of the job's files inside the table, relative to it.
pub fn job_dir(ctx: &SinkContext) -> String {
    format!("weir-{}", ctx.job_tag)
}

pub struct DeltaCommitter {
    table: Arc<DeltaLocation>,
    schema: SchemaRef,
    partition_keys: Vec<String>,
    /// What the `txn` actions of this sink's commits are recorded under.
    app_id: String,
    /// The job's directory inside the table, and this attempt's prefix in
    /// it (its files are not a failed attempt's).
    job_dir: String,
    attempt: String,
}

impl DeltaCommitter {
    pub fn new(table: Arc<DeltaLocation>, schema: SchemaRef, partition_keys: Vec<String>, ctx: &SinkContext) -> Self {
        Self {
            table,
            schema,
            partition_keys,
            app_id: format!("weir-{}-{}", ctx.job_tag, ctx.sink_uid),
            job_dir: job_dir(ctx),
            attempt: ctx.attempt.clone(),
        }
    }
}

impl Committer for DeltaCommitter {
    fn commit(&self, checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()> {
        let adds = committables
            .iter()
            .map(|c| serde_json::from_value::<Add>(c.clone()))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| {
                self.table.error(format!(
                    "checkpoint {checkpoint_id} holds an unreadable add action: {e}"
                ))
            })?;
        if adds.is_empty() {
            // Nothing written since the last commit: no version.
            return Ok(());
        }
        self.table.create_if_absent(&self.schema, &self.partition_keys)?;
        let txn = (self.app_id.clone(), checkpoint_id);
        let files = adds.len();
        let started = std::time::Instant::now();
        let made = commit_adds(&self.table, &self.partition_keys, adds, Some(txn))?;
        if made.is_some() {
            crate::failpoint::failpoint("delta_sink.committed");
        }
        match made {
            // The commit's latency: how much later than the checkpoint
            // the rows become visible.
            Some(version) => tracing::info!(
                target: "weir::checkpoint",
                "Delta table '{}': checkpoint {checkpoint_id} committed as version {version} in {} ms ({files} files)",
                self.table.name,
                started.elapsed().as_millis()
            ),
            None => tracing::info!(
                target: "weir::checkpoint",
                "Delta table '{}': checkpoint {checkpoint_id} was committed before (its txn version is recorded): not again",
                self.table.name
            ),
        }
        Ok(())
    }

    fn recover(&self) -> Result<()> {
        self.table.create_if_absent(&self.schema, &self.partition_keys)?;
        let root = self.table.dir.join(&self.job_dir);
        if !root.exists() {
            return Ok(());
        }
        let referenced = referenced_files(&self.table)?;
        let entries = std::fs::read_dir(&root).map_err(|e| self.table.error(format!("{}: {e}", root.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| self.table.error(format!("{}: {e}", root.display())))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with(&format!("{}-", self.attempt)) {
                continue;
            }
            // Another attempt's files: what no version of the table
            // references was written after its last completed checkpoint.
            let mut removed = 0usize;
            remove_unreferenced(&entry.path(), &referenced, &mut removed)
                .map_err(|e| self.table.error(format!("cleaning up {}: {e}", entry.path().display())))?;
            if removed > 0 {
                tracing::info!(
                    target: "weir::checkpoint",
                    "Delta table '{}': removed {removed} file(s) of a failed attempt that no checkpoint committed ({})",
                    self.table.name,
                    entry.path().display()
                );
            }
        }
        Ok(())
    }

    fn committed_through(&self) -> Result<Option<u64>> {
        if !self.table.exists() {
            return Ok(None);
        }
        let table = self.table.load()?;
        let app = self.app_id.clone();
        let version = block_on("a Delta table", async move {
            let snapshot = table.snapshot()?;
            snapshot.transaction_version(table.log_store().as_ref(), app).await
        })
        .map_err(|e| self.table.error(e))?
        .map_err(|e| self.table.error(format!("cannot read its transactions: {e}")))?;
        Ok(version.and_then(|v| u64::try_from(v).ok()))
    }
}

/// Adds `adds` to the table in one commit, with the `txn` action
/// `(app id, version)` if given, unless that version (or a later one) is
/// recorded already. Returns the table version made, `None` if skipped.
pub fn commit_adds(
    table: &DeltaLocation,
    partition_keys: &[String],
    adds: Vec<Add>,
    txn: Option<(String, u64)>,
) -> Result<Option<u64>> {
    let url = table.url.clone();
    let keys = partition_keys.to_vec();
    block_on("a Delta table", async move {
        let mut t: DeltaTable = DeltaTableBuilder::from_url(url)?.build()?;
        t.load().await?;
        let log_store = t.log_store();
        let snapshot = t.snapshot()?;
        if let Some((app, version)) = &txn {
            let have = snapshot.transaction_version(log_store.as_ref(), app).await?;
            if have.is_some_and(|h| h >= *version as i64) {
                return Ok(None);
            }
        }
        let mut actions: Vec<Action> = adds.into_iter().map(Action::Add).collect();
        if let Some((app, version)) = txn {
            actions.push(Action::Txn(Transaction::new(app, version as i64)));
        }
        let operation = DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: (!keys.is_empty()).then_some(keys),
            predicate: None,
        };
        let done = CommitBuilder::default()
            .with_actions(actions)
            .build(Some(snapshot), log_store, operation)
            .await?;
        Ok::<_, deltalake_core::DeltaTableError>(Some(done.version()))
    })
    .map_err(|e| table.error(e))?
    .map_err(|e| table.error(format!("cannot commit: {e}")))
}

/// Every file a version of the table still references: its live files
/// and those removed (time travel reads them until a VACUUM).
fn referenced_files(table: &DeltaLocation) -> Result<HashSet<PathBuf>> {
    let t = table.load()?;
    let paths = block_on("a Delta table", async move {
        let snapshot = t.snapshot()?;
        let log_store = t.log_store();
        let mut paths: Vec<String> = snapshot.log_data().iter().map(|f| f.path().to_string()).collect();
        let removed: Vec<String> = snapshot
            .all_tombstones(log_store.as_ref())
            .map_ok(|r| r.path().to_string())
            .try_collect()
            .await?;
        paths.extend(removed);
        Ok::<_, deltalake_core::DeltaTableError>(paths)
    })
    .map_err(|e| table.error(e))?
    .map_err(|e| table.error(format!("cannot list its files: {e}")))?;
    // Paths come decoded: relative to the table, or whole URLs (a file
    // another writer added from elsewhere).
    Ok(paths
        .iter()
        .filter_map(|p| match url::Url::parse(p) {
            Ok(u) => u.to_file_path().ok(),
            Err(_) => Some(table.dir.join(p)),
        })
        .collect())
}

/// Removes the files below `dir` not in `referenced`, then the
/// directories left empty.
fn remove_unreferenced(dir: &Path, referenced: &HashSet<PathBuf>, removed: &mut usize) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            remove_unreferenced(&path, referenced, removed)?;
        } else if !referenced.contains(&path) {
            std::fs::remove_file(&path)?;
            *removed += 1;
        }
    }
    if std::fs::read_dir(dir)?.next().is_none() {
        std::fs::remove_dir(dir)?;
    }
    Ok(())
}
