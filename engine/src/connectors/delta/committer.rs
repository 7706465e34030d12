//! The commit side of the Delta sink: one Delta commit per completed
//! checkpoint, idempotent through the `txn` action; recovery removes the
//! files of attempts that no version of the table references.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use deltalake_core::DeltaTable;
use deltalake_core::kernel::transaction::CommitBuilder;
use deltalake_core::kernel::{Action, Add, Transaction};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use futures::TryStreamExt;
use futures::future::BoxFuture;
use object_store::ObjectStoreExt;
use object_store::path::Path as Key;

use super::table::DeltaLocation;
use crate::checkpoint::objects::block_on;
use crate::connectors::{Committer, SinkContext};
use crate::error::{ExecError, Result};

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
    /// The table as last read: each commit reads only the versions made
    /// since (another writer's), not the whole log again.
    loaded: Mutex<Option<DeltaTable>>,
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
            loaded: Mutex::new(None),
        }
    }

    /// Runs `f` on the table brought up to its latest version (created
    /// with the DDL's columns first if absent), keeping it for the next
    /// call. A failed call forgets it: the next one reads the log afresh.
    fn with_table<T: Send + 'static>(
        &self,
        f: impl for<'t> FnOnce(&'t mut DeltaTable) -> BoxFuture<'t, std::result::Result<T, deltalake_core::DeltaTableError>>
        + Send
        + 'static,
    ) -> Result<T> {
        let mut slot = self
            .loaded
            .lock()
            .map_err(|_| ExecError::internal("the Delta committer's table lock is poisoned"))?;
        let table = match slot.take() {
            Some(t) => t,
            None => {
                self.table.create_if_absent(&self.schema, &self.partition_keys)?;
                self.table.unloaded()?
            }
        };
        let (table, r) = block_on("a Delta table", async move {
            let mut table = table;
            let r = match table.update_incremental(None).await {
                Ok(()) => f(&mut table).await,
                Err(e) => Err(e),
            };
            (table, r)
        })
        .map_err(|e| self.table.error(e))?;
        if r.is_ok() {
            *slot = Some(table);
        }
        r.map_err(|e| self.table.error(e))
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
        let txn = (self.app_id.clone(), checkpoint_id);
        let files = adds.len();
        let started = std::time::Instant::now();
        let keys = self.partition_keys.clone();
        let made = self.with_table(move |t| Box::pin(commit_adds(t, keys, adds, Some(txn))))?;
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
        let referenced = self.with_table(|t| Box::pin(referenced_files(t)))?;
        let files = self.table.files()?;
        let job_dir = Key::from(self.job_dir.as_str());
        let own = format!("{}/{}-", self.job_dir, self.attempt);
        // Another attempt's files: what no version of the table references
        // was written after its last completed checkpoint.
        let removed = block_on("a Delta table", async move {
            let listed: Vec<object_store::ObjectMeta> = files.list(Some(&job_dir)).try_collect().await?;
            let mut removed = Vec::new();
            for meta in listed {
                let key = meta.location;
                if key.as_ref().starts_with(&own) || referenced.contains(&key) {
                    continue;
                }
                files.delete(&key).await?;
                removed.push(key);
            }
            Ok::<_, object_store::Error>(removed)
        })
        .map_err(|e| self.table.error(e))?
        .map_err(|e| self.table.error(format!("cleaning up {}: {e}", self.job_dir)))?;
        if let Some(dir) = &self.table.local {
            // A local store leaves the emptied directories behind.
            remove_empty_dirs(&dir.join(&self.job_dir));
        }
        if !removed.is_empty() {
            tracing::info!(
                target: "weir::checkpoint",
                "Delta table '{}': removed {} file(s) of failed attempts that no checkpoint committed (below {}/{})",
                self.table.name,
                removed.len(),
                self.table.shown,
                self.job_dir
            );
        }
        Ok(())
    }

    fn committed_through(&self) -> Result<Option<u64>> {
        if !self.table.exists()? {
            return Ok(None);
        }
        let app = self.app_id.clone();
        let version = self.with_table(move |t| {
            Box::pin(async move {
                let snapshot = t.snapshot()?;
                snapshot.transaction_version(t.log_store().as_ref(), app).await
            })
        })?;
        Ok(version.and_then(|v| u64::try_from(v).ok()))
    }
}

/// Adds `adds` to `table` (at its latest version) in one commit, with the
/// `txn` action `(app id, version)` if given, unless that version (or a
/// later one) is recorded already. Returns the table version made, `None`
/// if skipped. A concurrent writer's commit in between is Delta's
/// optimistic concurrency's business: a blind append conflicts with none,
/// and the commit is retried at the next version.
pub async fn commit_adds(
    table: &mut DeltaTable,
    partition_keys: Vec<String>,
    adds: Vec<Add>,
    txn: Option<(String, u64)>,
) -> std::result::Result<Option<u64>, deltalake_core::DeltaTableError> {
    let log_store = table.log_store();
    let snapshot = table.snapshot()?;
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
        partition_by: (!partition_keys.is_empty()).then_some(partition_keys),
        predicate: None,
    };
    let done = CommitBuilder::default()
        .with_actions(actions)
        .build(Some(snapshot), log_store, operation)
        .await?;
    let version = done.version();
    table.update_incremental(None).await?;
    Ok(Some(version))
}

/// Every file a version of the table still references: its live files
/// and those removed (time travel reads them until a VACUUM), as keys
/// below the table.
async fn referenced_files(
    table: &mut DeltaTable,
) -> std::result::Result<HashSet<Key>, deltalake_core::DeltaTableError> {
    let snapshot = table.snapshot()?;
    let log_store = table.log_store();
    let mut paths: Vec<String> = snapshot.log_data().iter().map(|f| f.path().to_string()).collect();
    let removed: Vec<String> = snapshot
        .all_tombstones(log_store.as_ref())
        .map_ok(|r| r.path().to_string())
        .try_collect()
        .await?;
    paths.extend(removed);
    // Paths come decoded and relative to the table; another writer's may
    // be whole URLs (those inside the table count by their place in it).
    let root = log_store.config().location().clone();
    Ok(paths
        .iter()
        .filter_map(|p| match url::Url::parse(p) {
            Ok(u) => u
                .as_str()
                .strip_prefix(root.as_str())
                .and_then(|rel| Key::from_url_path(rel.trim_start_matches('/')).ok()),
            Err(_) => Some(Key::from(p.as_str())),
        })
        .collect())
}

/// Removes the directories below `dir` (and `dir`) that are empty,
/// leaving any other.
fn remove_empty_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.path().is_dir() {
            remove_empty_dirs(&entry.path());
        }
    }
    // Fails, as it should, while anything is left in it.
    let _ = std::fs::remove_dir(dir);
}
