//! The commit side of the Delta sink: one Delta commit per completed
//! checkpoint, idempotent through the `txn` action; recovery removes the
//! files of attempts that no version of the table references.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
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
use super::upserts::{KeyBytes, TableKey, keep_untouched};
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
    /// The sink's `sink.rolling-policy.file-size` and Parquet settings,
    /// which files rewritten by a keyed commit keep.
    file_size: u64,
    parquet: parquet::file::properties::WriterProperties,
    /// What the last commit made (see [`Committer::take_report`]).
    report: Mutex<Option<crate::checkpoint::commit::SinkCommit>>,
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
    pub fn new(sink: &super::DeltaSink, ctx: &SinkContext) -> Self {
        Self {
            key: sink.key.clone(),
            table: sink.table.clone(),
            schema: sink.schema.clone(),
            partition_keys: sink.partition_keys.clone(),
            file_size: sink.file_size,
            parquet: sink.parquet.clone(),
            app_id: format!("weir-{}-{}", ctx.job_tag, ctx.sink_uid),
            job_dir: job_dir(ctx),
            attempt: ctx.attempt.clone(),
            loaded: Mutex::new(None),
            report: Mutex::new(None),
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
        self.with_table_raw(f)?.map_err(|e| self.table.error(e))
    }

    /// [`Self::with_table`], delta-rs's own error apart (to tell a commit
    /// conflict).
    fn with_table_raw<T: Send + 'static>(
        &self,
        f: impl for<'t> FnOnce(&'t mut DeltaTable) -> BoxFuture<'t, std::result::Result<T, deltalake_core::DeltaTableError>>
        + Send
        + 'static,
    ) -> Result<std::result::Result<T, deltalake_core::DeltaTableError>> {
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
        Ok(r)
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
        // The barriers' output in order: a keyed subtask's keys file opens
        // the group of the data files after it. Several groups of one
        // subtask come together when a checkpoint was aborted (its output
        // is carried into the next one's): a later group's keys must also
        // leave the earlier groups' new files.
        struct Group {
            dir: String,
            keys_file: Option<String>,
            adds: Vec<Add>,
        }
        let subtask_dir = |path: &str| path.splitn(3, '/').take(2).collect::<Vec<_>>().join("/");
        let mut groups: Vec<Group> = vec![];
        let mut open: HashMap<String, usize> = HashMap::new();
        for c in committables {
            match serde_json::from_value::<Committable>(c.clone()) {
                Ok(Committable::Keys { touched_keys, .. }) => {
                    let dir = subtask_dir(&touched_keys);
                    open.insert(dir.clone(), groups.len());
                    groups.push(Group {
                        dir,
                        keys_file: Some(touched_keys),
                        adds: vec![],
                    });
                }
                Ok(Committable::Add(a)) => match open.get(&subtask_dir(&a.path)) {
                    Some(&g) => groups[g].adds.push(*a),
                    None => groups.push(Group {
                        dir: subtask_dir(&a.path),
                        keys_file: None,
                        adds: vec![*a],
                    }),
                },
                Err(e) => {
                    return Err(self
                        .table
                        .error(format!("{what} holds an unreadable commit action: {e}")));
                }
            }
        }
        let keys_files = groups.iter().filter(|g| g.keys_file.is_some()).count();
        if groups.is_empty() {
            // Nothing written since the last commit: no version.
            return Ok(());
        }
        if let Some(c) = checkpoint_id
            && keys_files > 0
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
            *self.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(crate::checkpoint::commit::SinkCommit {
                sink: self.table.name.clone(),
                version: None,
                duration: std::time::Duration::ZERO,
                files: 0,
            });
            self.remove_keys_files(groups.iter().filter_map(|g| g.keys_file.as_deref()));
            return Ok(());
        }
        let key = match (&self.key, keys_files) {
            (_, 0) => None,
            (Some(key), _) => Some(key.clone()),
            (None, _) => {
                return Err(self
                    .table
                    .error(format!("{what} holds changed keys, but the table has no primary key")));
            }
        };
        let mut sets: Vec<HashSet<KeyBytes>> = Vec::with_capacity(groups.len());
        for g in &groups {
            sets.push(match (&key, &g.keys_file) {
                (Some(key), Some(f)) => read_keys(&self.table, key, std::slice::from_ref(f))?,
                _ => HashSet::new(),
            });
        }
        let mut adds: Vec<(Add, Option<HashSet<KeyBytes>>)> = vec![];
        for (i, g) in groups.iter().enumerate() {
            let later: HashSet<KeyBytes> = groups
                .iter()
                .zip(&sets)
                .skip(i + 1)
                .filter(|(h, _)| h.dir == g.dir)
                .flat_map(|(_, s)| s.iter().cloned())
                .collect();
            for a in &g.adds {
                adds.push((a.clone(), (!later.is_empty()).then(|| later.clone())));
            }
        }
        let touched = key.map(|k| (k, sets.into_iter().flatten().collect::<HashSet<KeyBytes>>()));
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
            file_size: self.file_size,
            parquet: self.parquet.clone(),
            txn: checkpoint_id.map(|c| (self.app_id.clone(), c)),
        };
        // A conflicting commit of another writer (a compaction, another
        // subtask's end-of-input commit rewriting the same file) between
        // this one's read and its commit: again from a fresh read, a few
        // times, before the checkpoint's commit fails.
        let mut tries = 0;
        let made = loop {
            tries += 1;
            let this = change.clone();
            match self.with_table_raw(move |t| Box::pin(commit_change(t, this)))? {
                Err(deltalake_core::DeltaTableError::Transaction {
                    source:
                        e @ (deltalake_core::kernel::transaction::TransactionError::CommitConflict(_)
                        | deltalake_core::kernel::transaction::TransactionError::MaxCommitAttempts(_)),
                }) if tries < 5 => {
                    tracing::info!(
                        target: "weir::checkpoint",
                        "Delta table '{}': {what} conflicts with another writer's commit ({e}): trying again",
                        self.table.name
                    );
                }
                r => break r.map_err(|e| self.table.error(e))?,
            }
        };
        if made.is_some() {
            crate::failpoint::failpoint("delta_sink.committed");
        }
        let report = crate::checkpoint::commit::SinkCommit {
            sink: self.table.name.clone(),
            version: made.map(|(v, _, _)| v),
            duration: started.elapsed(),
            files,
        };
        *self.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
        // The keys files served this commit; a replay of it is recognised
        // by its txn version and needs none.
        self.remove_keys_files(groups.iter().filter_map(|g| g.keys_file.as_deref()));
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

impl DeltaCommitter {
    /// Deletes keys files a commit no longer needs. Best effort: one left
    /// behind is removed by the next attempt's recovery (no version
    /// references it).
    fn remove_keys_files<'a>(&self, paths: impl Iterator<Item = &'a str>) {
        let keys: Vec<Key> = paths.map(object_key).collect();
        if keys.is_empty() {
            return;
        }
        let files = match self.table.files() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(target: "weir::checkpoint", "Delta table '{}': keys files left: {e}", self.table.name);
                return;
            }
        };
        let done = block_on("a Delta table", async move {
            for k in keys {
                match files.delete(&k).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        });
        if let Err(e) = done
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            tracing::warn!(
                target: "weir::checkpoint",
                "Delta table '{}': a keys file was not removed ({e}); the next recovery removes it",
                self.table.name
            );
        }
    }
}

impl DeltaCommitter {
    /// Aborts the multipart uploads of files of other attempts of the job
    /// that were in progress when they ended (delta-rs uploads a large
    /// file in parts as it writes; a killed writer leaves them, invisible
    /// to listings and billed by the byte). On S3, which can list them;
    /// elsewhere a bucket lifecycle rule must, as Flink asks.
    fn abort_uploads(&self, own: &str) -> Result<()> {
        let Some(bucket) = self.table.bucket.clone() else {
            return Ok(());
        };
        let Some(lister) = bucket.uploads.clone() else {
            return Ok(());
        };
        let below = |rel: &str| match bucket.prefix.trim_matches('/') {
            "" => rel.to_string(),
            p => format!("{p}/{rel}"),
        };
        let (prefix, own) = (below(&format!("{}/", self.job_dir)), below(own));
        let multipart = bucket.multipart.clone();
        let done = block_on("a Delta table", async move {
            let (mut aborted, mut gone) = (0usize, 0usize);
            for upload in lister.list(&prefix).await? {
                if upload.key.starts_with(&own) {
                    continue;
                }
                // The key as S3 has it (a partition value's `%` escapes
                // are part of it, not to be escaped again).
                let key = Key::parse(&upload.key).map_err(|e| format!("the upload of {}: {e}", upload.key))?;
                match multipart.abort_multipart(&key, &upload.id).await {
                    Ok(()) => aborted += 1,
                    // Completed or aborted meanwhile.
                    Err(object_store::Error::NotFound { .. }) => gone += 1,
                    Err(e) => return Err(format!("aborting the upload of {}: {e}", upload.key)),
                }
            }
            Ok::<_, String>((aborted, gone))
        })
        .and_then(|r| r);
        match done {
            Ok((aborted, gone)) if aborted + gone > 0 => tracing::info!(
                target: "weir::checkpoint",
                "Delta table '{}': aborted {aborted} upload(s) of failed attempts' files ({gone} gone before)",
                self.table.name
            ),
            Ok(_) => {}
            // Not the job's data: the uploads stay (billed) until the
            // bucket's lifecycle rule or a later recovery removes them.
            Err(e) => tracing::warn!(
                target: "weir::checkpoint",
                "Delta table '{}': uploads in progress of failed attempts not aborted ({e}); aborting them needs \
                 s3:ListBucketMultipartUploads and s3:AbortMultipartUpload",
                self.table.name
            ),
        }
        Ok(())
    }
}

impl Committer for DeltaCommitter {
    fn take_report(&self) -> Option<crate::checkpoint::commit::SinkCommit> {
        self.report.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn commit(&self, checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()> {
        self.apply(Some(checkpoint_id), committables)
    }

    fn recover(&self) -> Result<()> {
        let referenced = self.with_table(|t| Box::pin(referenced_files(t)))?;
        let files = self.table.files()?;
        let job_dir = Key::from(self.job_dir.as_str());
        let own = format!("{}/{}-", self.job_dir, self.attempt);
        self.abort_uploads(&own)?;
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
            // A local store's half-written files (`name#N`, renamed into
            // place when complete) are not listed: a killed attempt's are
            // removed here. Then the directories left empty.
            let own = format!("{}-", self.attempt);
            let mut staged = 0usize;
            if let Ok(entries) = std::fs::read_dir(dir.join(&self.job_dir)) {
                for e in entries.flatten() {
                    if !e.file_name().to_string_lossy().starts_with(&own) {
                        remove_staged(&e.path(), &mut staged)
                            .map_err(|err| self.table.error(format!("cleaning up {}: {err}", e.path().display())))?;
                    }
                }
            }
            if staged > 0 {
                tracing::info!(
                    target: "weir::checkpoint",
                    "Delta table '{}': removed {staged} half-written file(s) of failed attempts",
                    self.table.name
                );
            }
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
#[derive(Clone)]
pub struct Change {
    partition_keys: Vec<String>,
    schema: SchemaRef,
    /// The new data files, each with the keys a later barrier of its
    /// subtask changed (their rows must not be added).
    adds: Vec<(Add, Option<HashSet<KeyBytes>>)>,
    /// A keyed table's changed keys: their rows leave the table's files.
    touched: Option<(TableKey, HashSet<KeyBytes>)>,
    /// Where the files rewritten without those rows go (relative to the
    /// table, and as a URL).
    rewrite_dir: String,
    rewrite_url: url::Url,
    /// The rewritten files' rolling size and Parquet settings (the sink's).
    file_size: u64,
    parquet: parquet::file::properties::WriterProperties,
    txn: Option<(String, u64)>,
}

/// Makes `change` one commit of `table` (at its latest version): the
/// table's files holding a changed key removed and written again without
/// those rows, the new files added, and the `txn` action `(app id,
/// version)` if given, unless that version (or a later one) is recorded
/// already. Returns the table version made, the files removed and those
/// written in their place; `None` if skipped. Another writer's commit in
/// between: an append-only commit goes on top of blind appends (delta-rs
/// retries it); a keyed commit goes on top of commits that only append
/// (the table brought up to them), and fails on any other (a compaction,
/// a delete: `MaxCommitAttempts`), its rewritten files deleted, so that
/// the caller makes it again from a fresh read of the table.
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
        file_size,
        parquet,
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
    // The files this commit wrote in place of the ones it removes.
    let mut rewritten_paths: Vec<String> = vec![];
    let mut superseded = vec![];
    for (a, later) in adds {
        match later {
            None => actions.push(Action::Add(a)),
            Some(later) => superseded.push((a, later)),
        }
    }
    if let Some((key, touched)) = &touched {
        let mut files: Vec<Candidate> = table
            .snapshot()?
            .log_data()
            .iter()
            .map(|f| Candidate {
                path: f.path().to_string(),
                partition: f.partition_values_map(),
                remove: Some(f.remove_action(true)),
                keys: touched,
            })
            .collect();
        // New files of an aborted checkpoint whose keys a later barrier
        // changed: in no version yet, so nothing to remove.
        for (a, later) in &superseded {
            files.push(Candidate {
                path: a.path.clone(),
                partition: a.partition_values.clone(),
                remove: None,
                keys: later,
            });
        }
        let (removes, written) = rewrite_without(
            table,
            &schema,
            &partition_keys,
            key,
            files,
            &rewrite_url,
            (file_size, parquet.clone()),
        )
        .await?;
        removed = removes.len();
        rewritten = written.len();
        actions.extend(removes.into_iter().map(Action::Remove));
        rewritten_paths = written.iter().map(|a| format!("{rewrite_dir}/{}", a.path)).collect();
        actions.extend(written.into_iter().map(|mut a| {
            a.path = format!("{rewrite_dir}/{}", a.path);
            Action::Add(a)
        }));
    }
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
    let app_id = txn.as_ref().map(|(app, _)| app.clone());
    if let Some((app, version)) = txn {
        actions.push(Action::Txn(Transaction::new(app, version as i64)));
    }
    // Tests land another writer's commit here (between this commit's
    // read of the table and its own commit).
    crate::failpoint::failpoint_pause("delta_sink.before_commit");
    // A keyed commit rewrites the files it read: any commit since that
    // read fails it, to be made again from a fresh read. delta-rs's own
    // conflict check passes over a compaction's removals (`dataChange`
    // false), and its rewritten file would bring back the rows this
    // commit removes (Delta's protocol, and Spark, call that a conflict).
    if touched.is_none() {
        let done = CommitBuilder::default()
            .with_max_retries(DEFAULT_COMMIT_RETRIES)
            .with_actions(actions)
            .build(Some(table.snapshot()?), log_store, operation)
            .await?;
        let version = done.version();
        table.update_incremental(None).await?;
        return Ok(Some((version, removed, rewritten)));
    }
    // Commits since the read that only append (another writer's blind
    // appends) leave this commit's reading true: it goes on top of them
    // (the table brought up to them, then tried again as strictly).
    for _ in 0..MAX_REBASES {
        let read = table.snapshot()?.version();
        let tried = CommitBuilder::default()
            .with_max_retries(0)
            .with_actions(actions.clone())
            .build(Some(table.snapshot()?), log_store.clone(), operation.clone())
            .await;
        match tried {
            Ok(done) => {
                let version = done.version();
                table.update_incremental(None).await?;
                return Ok(Some((version, removed, rewritten)));
            }
            Err(deltalake_core::DeltaTableError::Transaction {
                source: deltalake_core::kernel::transaction::TransactionError::MaxCommitAttempts(_),
            }) => match appends_only_since(&log_store, read, app_id.as_deref()).await? {
                Some(latest) => {
                    tracing::info!(
                        target: "weir::checkpoint",
                        "a keyed Delta commit read version {read}; versions {}..={latest} only append: it goes on top of them",
                        read + 1
                    );
                    table.update_incremental(Some(latest)).await?
                }
                None => break,
            },
            Err(e) => return Err(e),
        }
    }
    // Not made, certainly (refused before its log entry was written): its
    // rewritten files are in no version; the caller reads afresh.
    let store = table.object_store();
    for p in rewritten_paths {
        let _ = store.delete(&Key::from(p.as_str())).await;
    }
    Err(deltalake_core::DeltaTableError::Transaction {
        source: deltalake_core::kernel::transaction::TransactionError::MaxCommitAttempts(0),
    })
}

/// How often a keyed commit goes on top of other writers' appends before
/// it reads the table afresh.
const MAX_REBASES: usize = 8;

/// The latest version if every commit after `read` only appends (no
/// removal of any kind, no metadata or protocol change, no `txn` of this
/// sink's app id: another attempt of the job committing, whose version a
/// fresh read must check); `None` if one does more (a compaction, a
/// delete: the keyed commit must read again).
async fn appends_only_since(
    log_store: &deltalake_core::logstore::LogStoreRef,
    read: u64,
    app_id: Option<&str>,
) -> std::result::Result<Option<u64>, deltalake_core::DeltaTableError> {
    let latest = log_store.get_latest_version(read).await?;
    for v in read + 1..=latest {
        let Some(bytes) = log_store.read_commit_entry(v).await? else {
            return Ok(None);
        };
        let only_appends = deltalake_core::logstore::get_actions(v, &bytes)?
            .iter()
            .all(|a| match a {
                Action::Remove(_) | Action::Metadata(_) | Action::Protocol(_) => false,
                Action::Txn(t) => Some(t.app_id.as_str()) != app_id,
                _ => true,
            });
        if !only_appends {
            return Ok(None);
        }
    }
    Ok(Some(latest))
}

/// delta-rs's own number of tries of a commit that conflicts with none
/// of the commits made since its read (an append).
const DEFAULT_COMMIT_RETRIES: usize = 15;

fn generic(e: impl std::fmt::Display) -> deltalake_core::DeltaTableError {
    deltalake_core::DeltaTableError::Generic(e.to_string())
}

/// A data file whose rows of some keys must go.
struct Candidate<'a> {
    /// As the log gives it, relative to the table.
    path: String,
    partition: HashMap<String, Option<String>>,
    /// A live file's removal; `None` for a file in no version yet.
    remove: Option<Remove>,
    keys: &'a HashSet<KeyBytes>,
}

/// Of `files`, those that hold one of their keys: their
/// `remove` actions, and the `add` actions of the files written in their
/// place (their other rows), paths relative to `rewrite_url`.
async fn rewrite_without(
    table: &DeltaTable,
    schema: &SchemaRef,
    partition_keys: &[String],
    key: &TableKey,
    files: Vec<Candidate<'_>>,
    rewrite_url: &url::Url,
    (file_size, props): (u64, parquet::file::properties::WriterProperties),
) -> std::result::Result<(Vec<Remove>, Vec<Add>), deltalake_core::DeltaTableError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let store = table.object_store();
    let converter = key.converter().map_err(generic)?;
    let mut removes = vec![];
    let mut writer: Option<RecordBatchWriter> = None;
    for Candidate {
        path,
        partition,
        remove,
        keys: touched,
    } in files
    {
        if remove.as_ref().is_some_and(|r| r.deletion_vector.is_some()) {
            return Err(generic(format!(
                "file {path} has a deletion vector: applying changes to a table with deletion vectors is not supported yet"
            )));
        }
        let bytes = store.get(&object_key(&path)).await?.bytes().await?;
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
        // A live file without such a key stays; a new one (no `remove`) is
        // written again all the same (it is added in its rewritten form).
        if !changed && remove.is_some() {
            continue;
        }
        removes.extend(remove);
        for b in kept.into_iter().filter(|b| b.num_rows() > 0) {
            let w = match writer.as_mut() {
                Some(w) => w,
                None => writer.insert(
                    RecordBatchWriter::try_new(
                        rewrite_url.as_str(),
                        schema.clone(),
                        (!partition_keys.is_empty()).then(|| partition_keys.to_vec()),
                        None,
                    )?
                    .with_target_file_size(file_size)
                    .with_writer_properties(props.clone()),
                ),
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
/// types: partition columns (not in the file) from its partition values
/// (an empty value is NULL, as the Delta protocol says); a nullable column
/// the file lacks (added to the table after it was written) is NULL.
pub(super) fn full_batch(
    batch: &RecordBatch,
    schema: &SchemaRef,
    partition: &HashMap<String, Option<String>>,
) -> std::result::Result<RecordBatch, String> {
    let n = batch.num_rows();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let column = match partition.get(f.name()) {
            Some(value) => {
                let value = value.as_deref().filter(|v| !v.is_empty());
                let text = arrow::array::StringArray::from(vec![value; n]);
                // Not `safe`: a value that does not parse is an error, not
                // a NULL.
                let strict = arrow::compute::CastOptions {
                    safe: false,
                    ..Default::default()
                };
                arrow::compute::cast_with_options(&text, f.data_type(), &strict)
                    .map_err(|e| format!("partition value of '{}': {e}", f.name()))?
            }
            None => match batch.column_by_name(f.name()) {
                Some(c) if c.data_type() == f.data_type() => c.clone(),
                Some(c) => arrow::compute::cast(c, f.data_type()).map_err(|e| format!("column '{}': {e}", f.name()))?,
                None if f.is_nullable() => arrow::array::new_null_array(f.data_type(), n),
                None => return Err(format!("the file has no column '{}'", f.name())),
            },
        };
        columns.push(column);
    }
    let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(n));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options).map_err(|e| e.to_string())
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
fn read_keys(table: &DeltaLocation, key: &TableKey, paths: &[String]) -> Result<HashSet<KeyBytes>> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let converter = key.converter()?;
    let store = table.files()?;
    let mut out = HashSet::new();
    for path in paths {
        let store = store.clone();
        let k = object_key(path);
        let bytes = block_on("a Delta table", async move { store.get(&k).await?.bytes().await })
            .map_err(|e| table.error(e))?
            .map_err(|e| table.error(format!("cannot read the keys file {path}: {e}")))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| table.error(format!("the keys file {path}: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| table.error(format!("the keys file {path}: {e}")))?;
            let rows = converter.convert_columns(batch.columns())?;
            out.extend(rows.iter().map(|r| KeyBytes::from(r.as_ref())));
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
            Err(_) => Some(object_key(p)),
        })
        .collect())
}

/// The object key of `path`, a file's path as the table's log gives it:
/// its text is the key (a partition value's escapes, `k=a%20b`, are part
/// of the name); only text that is no valid key is encoded.
fn object_key(path: &str) -> Key {
    Key::parse(path).unwrap_or_else(|_| Key::from(path))
}

/// Removes the directories below `dir` (and `dir`) that are empty,
/// leaving any other.
/// Removes the files below `dir` that a local object store was still
/// writing (`name#N`: never a table's file).
fn remove_staged(dir: &Path, removed: &mut usize) -> std::io::Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            remove_staged(&path, removed)?;
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.rsplit_once('#'))
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            std::fs::remove_file(&path)?;
            *removed += 1;
        }
    }
    Ok(())
}

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
