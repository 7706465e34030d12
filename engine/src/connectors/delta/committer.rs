//! The commit side of the Delta sink: one Delta commit per completed
//! checkpoint, idempotent through the `txn` action; recovery removes the
//! files of attempts that no version of the table references.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use arrow::row::OwnedRow;
use deltalake_core::DeltaTable;
use deltalake_core::kernel::transaction::CommitBuilder;
use deltalake_core::kernel::{Action, Add, Remove, Transaction};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::writer::{DeltaWriter as _, RecordBatchWriter};
use futures::TryStreamExt;
use futures::future::BoxFuture;
use object_store::ObjectStoreExt;
use object_store::path::Path as Key;

use super::table::DeltaLocation;
use super::upserts::{TableKey, keep_untouched};
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
    /// A keyed table's primary key (changes are applied by it).
    key: Option<TableKey>,
}

/// What a sink subtask's barrier leaves for the commit.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Committable {
    /// A keyed table's keys changed since the last barrier: a Parquet file
    /// of the key columns, relative to the table.
    Keys { touched_keys: String, keys: u64 },
    /// A data file written, in no version yet.
    Add(Box<Add>),
}

impl DeltaCommitter {
    pub fn new(
        table: Arc<DeltaLocation>,
        schema: SchemaRef,
        partition_keys: Vec<String>,
        key: Option<TableKey>,
        ctx: &SinkContext,
    ) -> Self {
        Self {
            key,
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

impl DeltaCommitter {
    /// Commits `committables` at once, without a `txn` (a job that does
    /// not checkpoint, at its end).
    pub fn commit_now(&self, committables: &[serde_json::Value]) -> Result<()> {
        self.apply(None, committables)
    }

    /// One Delta commit of `committables`: checkpoint `checkpoint_id`'s
    /// (recorded as the `txn` version, skipped if recorded already), or
    /// the end's without one.
    fn apply(&self, checkpoint_id: Option<u64>, committables: &[serde_json::Value]) -> Result<()> {
        let what = checkpoint_id.map_or("the end of input".to_string(), |c| format!("checkpoint {c}"));
        let mut adds = vec![];
        let mut keys_files = vec![];
        for c in committables {
            match serde_json::from_value::<Committable>(c.clone()) {
                Ok(Committable::Add(a)) => adds.push(*a),
                Ok(Committable::Keys { touched_keys, .. }) => keys_files.push(touched_keys),
                Err(e) => {
                    return Err(self
                        .table
                        .error(format!("{what} holds an unreadable commit action: {e}")));
                }
            }
        }
        if adds.is_empty() && keys_files.is_empty() {
            // Nothing written since the last commit: no version.
            return Ok(());
        }
        if let Some(c) = checkpoint_id
            && !keys_files.is_empty()
            && self.committed_through()?.is_some_and(|v| v >= c)
        {
            // Replayed after a restore: its keys files may be gone (a
            // later attempt's recovery removes what no version
            // references), and are not needed.
            tracing::info!(
                target: "weir::checkpoint",
                "Delta table '{}': {what} was committed before (its txn version is recorded): not again",
                self.table.name
            );
            return Ok(());
        }
        let touched = match (&self.key, keys_files.is_empty()) {
            (_, true) => None,
            (Some(key), false) => Some((key.clone(), read_keys(&self.table, key, &keys_files)?)),
            (None, false) => {
                return Err(self
                    .table
                    .error(format!("{what} holds changed keys, but the table has no primary key")));
            }
        };
        let changed = touched.as_ref().map_or(0, |(_, t)| t.len());
        let files = adds.len();
        let started = std::time::Instant::now();
        let rewrite_dir = format!("{}/{}-rewritten", self.job_dir, self.attempt);
        let change = Change {
            partition_keys: self.partition_keys.clone(),
            schema: self.schema.clone(),
            adds,
            touched,
            rewrite_url: self.table.dir_url(&rewrite_dir)?,
            rewrite_dir,
            txn: checkpoint_id.map(|c| (self.app_id.clone(), c)),
        };
        let made = self.with_table(move |t| Box::pin(commit_change(t, change)))?;
        if made.is_some() {
            crate::failpoint::failpoint("delta_sink.committed");
        }
        match made {
            // The commit's latency: how much later than the checkpoint
            // the rows become visible.
            Some((version, removed, rewritten)) => tracing::info!(
                target: "weir::checkpoint",
                "Delta table '{}': {what} committed as version {version} in {} ms ({files} files{})",
                self.table.name,
                started.elapsed().as_millis(),
                if changed > 0 {
                    format!("; {changed} keys changed, {removed} files rewritten as {rewritten}")
                } else {
                    String::new()
                }
            ),
            None => tracing::info!(
                target: "weir::checkpoint",
                "Delta table '{}': {what} was committed before (its txn version is recorded): not again",
                self.table.name
            ),
        }
        Ok(())
    }
}

impl Committer for DeltaCommitter {
    fn commit(&self, checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()> {
        self.apply(Some(checkpoint_id), committables)
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

/// One commit's worth of changes (see [`commit_change`]).
pub struct Change {
    partition_keys: Vec<String>,
    schema: SchemaRef,
    /// The new data files.
    adds: Vec<Add>,
    /// A keyed table's changed keys: their rows leave the table's files.
    touched: Option<(TableKey, HashSet<OwnedRow>)>,
    /// Where the files rewritten without those rows go (relative to the
    /// table, and as a URL).
    rewrite_dir: String,
    rewrite_url: url::Url,
    txn: Option<(String, u64)>,
}

/// Makes `change` one commit of `table` (at its latest version): the
/// table's files holding a changed key removed and written again without
/// those rows, the new files added, and the `txn` action `(app id,
/// version)` if given, unless that version (or a later one) is recorded
/// already. Returns the table version made, the files removed and those
/// written in their place; `None` if skipped. A concurrent writer's commit
/// in between is Delta's optimistic concurrency's business: a blind append
/// conflicts with none (the commit is retried at the next version), a
/// concurrent removal of a file this one rewrites fails the commit, and the
/// checkpoint's commit is tried again from a fresh read of the table.
pub async fn commit_change(
    table: &mut DeltaTable,
    change: Change,
) -> std::result::Result<Option<(u64, usize, usize)>, deltalake_core::DeltaTableError> {
    let Change {
        partition_keys,
        schema,
        adds,
        touched,
        rewrite_dir,
        rewrite_url,
        txn,
    } = change;
    let log_store = table.log_store();
    if let Some((app, version)) = &txn {
        let have = table.snapshot()?.transaction_version(log_store.as_ref(), app).await?;
        if have.is_some_and(|h| h >= *version as i64) {
            return Ok(None);
        }
    }
    let mut actions: Vec<Action> = vec![];
    let (mut removed, mut rewritten) = (0, 0);
    if let Some((key, touched)) = &touched {
        let (removes, written) = rewrite_without(table, &schema, &partition_keys, key, touched, &rewrite_url).await?;
        removed = removes.len();
        rewritten = written.len();
        actions.extend(removes.into_iter().map(Action::Remove));
        actions.extend(written.into_iter().map(|mut a| {
            a.path = format!("{rewrite_dir}/{}", a.path);
            Action::Add(a)
        }));
    }
    actions.extend(adds.into_iter().map(Action::Add));
    let operation = if touched.is_some() {
        // As Delta's streaming writers (Spark's) record an update.
        DeltaOperation::StreamingUpdate {
            output_mode: deltalake_core::protocol::OutputMode::Update,
            query_id: txn.as_ref().map_or_else(|| "weir".to_string(), |(app, _)| app.clone()),
            epoch_id: txn.as_ref().map_or(0, |(_, v)| *v as i64),
        }
    } else {
        DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: (!partition_keys.is_empty()).then_some(partition_keys),
            predicate: None,
        }
    };
    if let Some((app, version)) = txn {
        actions.push(Action::Txn(Transaction::new(app, version as i64)));
    }
    let done = CommitBuilder::default()
        .with_actions(actions)
        .build(Some(table.snapshot()?), log_store, operation)
        .await?;
    let version = done.version();
    table.update_incremental(None).await?;
    Ok(Some((version, removed, rewritten)))
}

fn generic(e: impl std::fmt::Display) -> deltalake_core::DeltaTableError {
    deltalake_core::DeltaTableError::Generic(e.to_string())
}

/// The table's live files that hold a key of `touched`: their `remove`
/// actions, and the `add` actions of the files written in their place
/// (their other rows), paths relative to `rewrite_url`.
async fn rewrite_without(
    table: &DeltaTable,
    schema: &SchemaRef,
    partition_keys: &[String],
    key: &TableKey,
    touched: &HashSet<OwnedRow>,
    rewrite_url: &url::Url,
) -> std::result::Result<(Vec<Remove>, Vec<Add>), deltalake_core::DeltaTableError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let files: Vec<(String, HashMap<String, Option<String>>, Remove)> = table
        .snapshot()?
        .log_data()
        .iter()
        .map(|f| (f.path().to_string(), f.partition_values_map(), f.remove_action(true)))
        .collect();
    let store = table.object_store();
    let converter = key.converter().map_err(generic)?;
    let mut removes = vec![];
    let mut writer: Option<RecordBatchWriter> = None;
    for (path, partition, remove) in files {
        if remove.deletion_vector.is_some() {
            return Err(generic(format!(
                "file {path} has a deletion vector: applying changes to a table with deletion vectors is not supported yet"
            )));
        }
        let bytes = store.get(&Key::from(path.as_str())).await?.bytes().await?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| generic(format!("{path}: {e}")))?;
        let mut kept = vec![];
        let mut changed = false;
        for batch in reader {
            let batch = batch.map_err(|e| generic(format!("{path}: {e}")))?;
            let full = full_batch(&batch, schema, &partition).map_err(|e| generic(format!("{path}: {e}")))?;
            match keep_untouched(&full, key, &converter, touched).map_err(generic)? {
                None => kept.push(full),
                Some(rest) => {
                    changed = true;
                    kept.push(rest);
                }
            }
        }
        if !changed {
            continue;
        }
        removes.push(remove);
        for b in kept.into_iter().filter(|b| b.num_rows() > 0) {
            let w = match writer.as_mut() {
                Some(w) => w,
                None => writer.insert(RecordBatchWriter::try_new(
                    rewrite_url.as_str(),
                    schema.clone(),
                    (!partition_keys.is_empty()).then(|| partition_keys.to_vec()),
                    None,
                )?),
            };
            w.write(b).await?;
        }
    }
    let written = match writer.as_mut() {
        Some(w) => w.flush().await?,
        None => vec![],
    };
    Ok((removes, written))
}

/// A data file's `batch` with the table's columns in `schema`'s order and
/// types: partition columns (not in the file) from its partition values.
fn full_batch(
    batch: &RecordBatch,
    schema: &SchemaRef,
    partition: &HashMap<String, Option<String>>,
) -> std::result::Result<RecordBatch, String> {
    let n = batch.num_rows();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let column = match partition.get(f.name()) {
            Some(value) => {
                let text = arrow::array::StringArray::from(vec![value.as_deref(); n]);
                arrow::compute::cast(&text, f.data_type())
                    .map_err(|e| format!("partition value of '{}': {e}", f.name()))?
            }
            None => {
                let c = batch
                    .column_by_name(f.name())
                    .ok_or_else(|| format!("the file has no column '{}'", f.name()))?;
                if c.data_type() == f.data_type() {
                    c.clone()
                } else {
                    arrow::compute::cast(c, f.data_type()).map_err(|e| format!("column '{}': {e}", f.name()))?
                }
            }
        };
        columns.push(column);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// Writes `keys` (a keyed table's changed keys) as a Parquet file at
/// `path`, relative to the table.
pub fn write_keys_file(table: &DeltaLocation, path: &str, keys: RecordBatch) -> Result<()> {
    let mut bytes = vec![];
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, keys.schema(), None)
        .map_err(|e| table.error(format!("cannot write the keys file {path}: {e}")))?;
    w.write(&keys)
        .and_then(|_| w.close().map(|_| ()))
        .map_err(|e| table.error(format!("cannot write the keys file {path}: {e}")))?;
    let store = table.files()?;
    let key = Key::from(path);
    block_on("a Delta table", async move { store.put(&key, bytes.into()).await })
        .map_err(|e| table.error(e))?
        .map_err(|e| table.error(format!("cannot write the keys file {path}: {e}")))?;
    Ok(())
}

/// The keys in the keys files `paths` (relative to the table).
fn read_keys(table: &DeltaLocation, key: &TableKey, paths: &[String]) -> Result<HashSet<OwnedRow>> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let converter = key.converter()?;
    let store = table.files()?;
    let mut out = HashSet::new();
    for path in paths {
        let store = store.clone();
        let k = Key::from(path.as_str());
        let bytes = block_on("a Delta table", async move { store.get(&k).await?.bytes().await })
            .map_err(|e| table.error(e))?
            .map_err(|e| table.error(format!("cannot read the keys file {path}: {e}")))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| table.error(format!("the keys file {path}: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| table.error(format!("the keys file {path}: {e}")))?;
            let rows = converter.convert_columns(batch.columns())?;
            out.extend(rows.iter().map(|r| r.owned()));
        }
    }
    Ok(out)
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
