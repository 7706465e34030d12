//! A session: one client's `SET` options and user, over the catalog and
//! jobs every session of the process shares ([`Shared`]). One statement at
//! a time per session through [`Session::execute`]; sessions run
//! concurrently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arrow::array::{ArrayRef, BooleanArray, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use sqlparser::ast::Query;
use tokio::sync::mpsc;
use weir_catalog::store::Entry;
use weir_catalog::{Catalog, ViewDef};
use weir_engine::ExecError;
use weir_engine::change::ChangeBatch;
use weir_engine::config::{DML_SYNC, JobConfig, PIPELINE_NAME};
use weir_engine::paths::PathPolicy;
use weir_engine::runtime::metrics::{JobMetrics, JobState};
use weir_engine::runtime::{JobHandle, SavepointMode, deploy};
use weir_sql::error::ErrorKind;
use weir_sql::{Location, ParsedStatement, Planner, QueryPlan, SqlError, Statement};

use crate::access::Principal;
use crate::jobs::{JobRecord, Registry, SessionJob, new_job_id};

/// An error of one statement, with where it happened when known.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Sql(#[from] SqlError),
    #[error("{0}")]
    Exec(#[from] ExecError),
    #[error("{0}")]
    Catalog(#[from] weir_catalog::CatalogError),
}

impl From<weir_engine::paths::PathDenied> for SessionError {
    fn from(e: weir_engine::paths::PathDenied) -> Self {
        SessionError::Sql(e.into())
    }
}

impl SessionError {
    pub fn location(&self) -> Option<Location> {
        match self {
            SessionError::Sql(e) => e.location,
            _ => None,
        }
    }

    /// The message without the location prefix.
    pub fn message(&self) -> String {
        match self {
            SessionError::Sql(e) => e.message.clone(),
            other => other.to_string(),
        }
    }
}

/// The rows of a streaming `SELECT` as they are produced.
pub struct ResultStream {
    pub schema: SchemaRef,
    pub rows: mpsc::Receiver<RecordBatch>,
    pub job: JobHandle,
    /// The first column is `_op` (Flink's row kind of each row): a
    /// `SUBSCRIBE`, or a query whose result is updating.
    pub changelog: bool,
    /// A bounded updating query answered as its final table (`weir
    /// serve`): `schema` is the table's, `rows` carry the changes with
    /// their `_op` first, and the server applies them
    /// ([`crate::final_table`]) and sends the table once the job has ended
    /// well.
    pub final_table: bool,
    /// The session's `table.local-time-zone` (`None`: UTC), which the
    /// shell shows TIMESTAMP_LTZ values in.
    pub zone: Option<weir_engine::time_zone::SessionZone>,
}

/// The rows of a job's result channel as clients read them: with an `_op`
/// column first when `with_op`, else as they are (an insert-only query).
fn result_rows(mut changes: mpsc::Receiver<ChangeBatch>, with_op: bool) -> mpsc::Receiver<RecordBatch> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Some(batch) = changes.recv().await {
            let rows = if with_op {
                match with_op_column(&batch) {
                    Ok(b) => b,
                    Err(_) => break,
                }
            } else {
                batch.rows
            };
            if tx.send(rows).await.is_err() {
                break;
            }
        }
    });
    rx
}

pub enum StatementResult {
    /// DDL, SET, RESET: a confirmation.
    Done(String),
    /// Rows computed at once (SHOW TABLES, DESCRIBE, SET, table-less SELECT).
    Rows(SchemaRef, Vec<RecordBatch>),
    Explain(String),
    /// `INSERT INTO`: a job was started (and, with `table.dml-sync`, has
    /// finished).
    JobStarted {
        id: String,
        name: String,
        /// The checkpoint it resumed from: (id, path).
        resumed_from: Option<(u64, String)>,
        /// The job's state when the statement answers: `RUNNING`, or with
        /// `table.dml-sync` the state it ended in (`FINISHED`, ...).
        state: &'static str,
    },
    Stream(ResultStream),
    /// `STOP JOB`: the state the job ended in (or is still in, when it
    /// did not end within the wait) and what happened, in words.
    JobEnded {
        id: String,
        name: String,
        state: &'static str,
        message: String,
    },
}

/// What every session of a process shares: the data dir's catalog, the
/// jobs, the planner and the allowed directories. The server opens one
/// session per client connection over one `Shared`; statements of
/// different sessions run concurrently (DDL takes the catalog's write lock
/// only for its own check-and-change).
pub struct Shared {
    data_dir: PathBuf,
    catalog: RwLock<Catalog>,
    jobs: Mutex<JobTable>,
    /// Where a server keeps the jobs to resubmit when it restarts.
    registry: OnceLock<Registry>,
    jobs_view: JobsView,
    planner: Planner,
    paths: PathPolicy,
    /// A bounded query with an updating result answers its final table
    /// (`weir serve`: what a database client expects), not its changelog.
    final_tables: std::sync::atomic::AtomicBool,
}

/// The catalog a statement plans against (see `Session::catalog_view`).
enum CatalogView<'a> {
    Shared(RwLockReadGuard<'a, Catalog>),
    Overlaid(Catalog),
}

impl std::ops::Deref for CatalogView<'_> {
    type Target = Catalog;

    fn deref(&self) -> &Catalog {
        match self {
            CatalogView::Shared(c) => c,
            CatalogView::Overlaid(c) => c,
        }
    }
}

/// The jobs of a process: those still owned (running `INSERT`s) and every
/// job started, oldest first (SHOW JOBS).
#[derive(Default)]
struct JobTable {
    running: Vec<JobHandle>,
    known: Vec<SessionJob>,
    /// Job names being deployed (restoring state can take seconds; the
    /// table is not locked meanwhile, the name is reserved).
    starting: std::collections::HashSet<String>,
}

/// A job name reserved while its job is deployed; released when dropped
/// (deployed, failed, or the statement abandoned).
struct Reserved<'a> {
    shared: &'a Shared,
    name: String,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.shared.jobs().starting.remove(&self.name);
    }
}

impl Shared {
    /// A poisoned lock means a panic elsewhere; the data behind it is
    /// still consistent (every change is a single assignment or push), so
    /// it is used rather than failing every later statement.
    fn catalog(&self) -> RwLockReadGuard<'_, Catalog> {
        self.catalog.read().unwrap_or_else(|e| e.into_inner())
    }

    fn catalog_mut(&self) -> RwLockWriteGuard<'_, Catalog> {
        self.catalog.write().unwrap_or_else(|e| e.into_inner())
    }

    fn jobs(&self) -> MutexGuard<'_, JobTable> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One client's session: its `SET` options, who it is, and the job-name
/// counters of a script, over the [`Shared`] catalog and jobs.
pub struct Session {
    shared: Arc<Shared>,
    settings: BTreeMap<String, String>,
    default_job_name: Option<String>,
    /// [`Session::set_event_time_range`].
    event_time_range: Option<(i64, i64)>,
    /// `weir worker`: the INSERT jobs run spread over these workers.
    cluster: Option<Arc<weir_engine::runtime::cluster::Cluster>>,
    /// A worker script's job, once its INSERT started: a worker runs one.
    cluster_job: Option<String>,
    started: usize,
    /// Query jobs started (their names are numbered).
    queries: usize,
    last_outcome: Option<weir_engine::runtime::JobOutcome>,
    principal: Principal,
    /// `CREATE TEMPORARY TABLE|VIEW`: this session's only, never in the
    /// catalog file, shadowing permanent objects of the same name (as
    /// Flink's temporary objects).
    temporary: Catalog,
    /// The statements that made them, by name: a job that reads one keeps
    /// them, so a server restart can start it again.
    temporary_ddl: Vec<(String, String)>,
}

/// Job metrics by job name, shared with readers outside the session.
pub type JobsView = Arc<std::sync::Mutex<BTreeMap<String, Arc<JobMetrics>>>>;

/// Ended jobs SHOW JOBS keeps listing (the oldest are forgotten).
const ENDED_JOBS_KEPT: usize = 100;

/// The session option that narrows the allowed directories further.
pub const ALLOWED_DIRECTORIES: &str = "allowed-directories";

impl Session {
    /// Opens the data dir (created if missing) and its catalog; paths are
    /// unrestricted.
    pub fn open(data_dir: impl Into<PathBuf>) -> Result<Self, SessionError> {
        Self::open_with(data_dir, PathPolicy::unrestricted())
    }

    /// Opens the data dir with the SQL's file paths restricted to `paths`,
    /// and its catalog file.
    pub fn open_with(data_dir: impl Into<PathBuf>, paths: PathPolicy) -> Result<Self, SessionError> {
        let data_dir = data_dir.into();
        let catalog = data_dir.join("catalog.json");
        Self::open_with_catalog(data_dir, paths, Some(catalog))
    }

    /// Opens the data dir with the SQL's file paths restricted to `paths`;
    /// tables and views live in the catalog file `catalog`, or, without
    /// one, in this process only (Flink's SQL client keeps its default
    /// catalog in memory: a script's DDL is the truth for its run).
    pub fn open_with_catalog(
        data_dir: impl Into<PathBuf>,
        paths: PathPolicy,
        catalog: Option<PathBuf>,
    ) -> Result<Self, SessionError> {
        let data_dir = data_dir.into();
        std::fs::create_dir_all(&data_dir).map_err(|source| weir_catalog::CatalogError::Io {
            path: data_dir.clone(),
            source,
        })?;
        let catalog = match catalog {
            Some(path) => Catalog::open(path)?,
            None => Catalog::in_memory(),
        };
        let shared = Arc::new(Shared {
            data_dir,
            catalog: RwLock::new(catalog),
            jobs: Mutex::default(),
            registry: OnceLock::new(),
            jobs_view: JobsView::default(),
            planner: Planner::new(),
            paths,
            final_tables: std::sync::atomic::AtomicBool::new(false),
        });
        Ok(Self::over(shared, Principal::local()))
    }

    fn over(shared: Arc<Shared>, principal: Principal) -> Self {
        Self {
            shared,
            settings: BTreeMap::new(),
            default_job_name: None,
            event_time_range: None,
            cluster: None,
            cluster_job: None,
            started: 0,
            queries: 0,
            last_outcome: None,
            principal,
            temporary: Catalog::in_memory(),
            temporary_ddl: Vec::new(),
        }
    }

    /// What this session's statements see: the catalog with the session's
    /// temporary objects in place of permanent ones of the same name (the
    /// shared catalog itself, under its read lock, when there are none).
    fn catalog_view(&self) -> CatalogView<'_> {
        if self.temporary.is_empty() {
            CatalogView::Shared(self.shared.catalog())
        } else {
            CatalogView::Overlaid(self.shared.catalog().overlaid(&self.temporary))
        }
    }

    /// A new session (no `SET` options) over the same catalog and jobs,
    /// for `principal`: the server's session of one connection.
    pub fn fork(&self, principal: Principal) -> Self {
        Self::over(self.shared.clone(), principal)
    }

    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Statements from now on run for `principal` (a connection's user is
    /// known per request).
    pub fn set_principal(&mut self, principal: Principal) {
        self.principal = principal;
    }

    pub fn data_dir(&self) -> &Path {
        &self.shared.data_dir
    }

    /// The directories this session's SQL may name (none: unrestricted).
    pub fn allowed_dirs(&self) -> Vec<PathBuf> {
        self.shared.paths.dirs().to_vec()
    }

    /// The job name used when `pipeline.name` is not set (e.g. the name of
    /// the file being run).
    pub fn set_default_job_name(&mut self, name: impl Into<String>) {
        self.default_job_name = Some(name.into());
    }

    /// Restricts the next jobs' tables with a time attribute to rows whose
    /// rowtime is in `[from, to)` ms (a backfill's chunk; batch mode).
    pub fn set_event_time_range(&mut self, range: Option<(i64, i64)>) {
        self.event_time_range = range;
    }

    /// Whether `stmt`, an INSERT, may run in chunks of event time
    /// `(from_ms, to_ms, chunk_ms)` (`weir backfill`) with the result of
    /// one run ([`weir_sql::Planner::check_chunks`]).
    pub fn check_chunks(&self, stmt: &Statement, range: (i64, i64, i64)) -> Result<(), SessionError> {
        let Statement::Insert { query, .. } = stmt else {
            return Err(SqlError::unsupported("a backfill runs an INSERT").into());
        };
        let config = self.explain_config("backfill")?;
        Ok(self
            .shared
            .planner
            .check_chunks(query, &self.catalog_view(), config.local_time_zone.as_ref(), range)?)
    }

    /// A `SET` option's value in this session, if set.
    pub fn option(&self, key: &str) -> Option<String> {
        self.settings.get(key).cloned()
    }

    /// A table of the catalog, as defined.
    pub fn table(&self, name: &str) -> Option<weir_catalog::TableDef> {
        self.shared.catalog().table(name).cloned()
    }

    /// From now on, in every session over this one's jobs and catalog, a
    /// bounded query whose result is updating answers the table its changes
    /// add up to ([`crate::final_table`]) unless the session's
    /// `sql-client.execution.result-mode` asks for the changelog (`weir
    /// serve`; the shells show changes as they come, in their own modes).
    pub fn answer_final_tables(&self) {
        self.shared
            .final_tables
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// How a streaming query's rows reach its client.
    fn result_shape(&self, graph: &weir_engine::plan::StreamGraph) -> Result<ResultShape, SessionError> {
        let last = graph.nodes.last().ok_or_else(|| ExecError::internal("empty plan"))?;
        if last.changelog.is_insert_only() {
            return Ok(ResultShape::Inserts(last.schema.clone()));
        }
        let changelog_asked = self
            .result_mode()
            .is_some_and(|m| m.eq_ignore_ascii_case("changelog") || m.eq_ignore_ascii_case("tableau"));
        Ok(
            if self.shared.final_tables.load(std::sync::atomic::Ordering::Relaxed)
                && graph.is_bounded()
                && !changelog_asked
                && crate::final_table::FinalTable::supports(&last.schema)
            {
                ResultShape::FinalTable(last.schema.clone())
            } else {
                ResultShape::Changelog(changelog_schema(&last.schema))
            },
        )
    }

    /// `weir worker`: the script's INSERT jobs run spread over `cluster`'s
    /// workers, this process being one of them. Without
    /// `parallelism.default`, every operator gets one subtask per worker
    /// (not this machine's cores: every worker must plan alike).
    pub fn set_cluster(&mut self, cluster: weir_engine::runtime::cluster::Cluster) {
        self.cluster = Some(Arc::new(cluster));
    }

    /// The workers of `weir worker`, if this session is one.
    pub fn cluster(&self) -> Option<&weir_engine::runtime::cluster::Cluster> {
        self.cluster.as_deref()
    }

    /// What the last job run with `table.dml-sync` did (metrics).
    pub fn last_outcome(&self) -> Option<&weir_engine::runtime::JobOutcome> {
        self.last_outcome.as_ref()
    }

    /// Jobs started by `INSERT` that are still owned (by any session).
    pub fn take_jobs(&mut self) -> Vec<JobHandle> {
        std::mem::take(&mut self.shared.jobs().running)
    }

    /// Keeps the jobs started from now on in `<data dir>/server/jobs.json`
    /// so that [`Session::resume_jobs`] of a later process starts them
    /// again (`weir serve`).
    pub fn keep_job_registry(&mut self) -> Result<(), String> {
        let registry = Registry::open(&self.shared.data_dir)?;
        // Already set: the same file, nothing to do.
        let _ = self.shared.registry.set(registry);
        Ok(())
    }

    /// Starts again every job of the registry: one that was checkpointed
    /// resumes from its latest checkpoint. Returns, per job, its name and
    /// what happened.
    pub async fn resume_jobs(&mut self) -> Vec<(String, Result<StatementResult, SessionError>)> {
        let Some(registry) = self.shared.registry.get().cloned() else {
            return vec![];
        };
        let mut out = vec![];
        for record in registry.records() {
            // An ended job is listed, not started.
            if let Some(end) = &record.ended {
                let metrics = end.metrics();
                self.shared.jobs().known.push(SessionJob { record, metrics });
                continue;
            }
            let saved = std::mem::replace(&mut self.settings, record.settings.clone());
            // The job keeps its owner (role checks apply to later control).
            let saved_principal = std::mem::replace(&mut self.principal, Principal::local());
            // The temporary objects of the session that started it, made
            // again for it alone.
            let saved_temporary = std::mem::replace(&mut self.temporary, Catalog::in_memory());
            let saved_ddl = std::mem::take(&mut self.temporary_ddl);
            let mut made = Ok(());
            for ddl in &record.temporary {
                if let Err(e) = self.execute_sql(ddl).await {
                    made = Err(e);
                    break;
                }
            }
            let result = match made.map(|_| weir_sql::parse(&record.sql)) {
                Err(e) => Err(e),
                Ok(parsed) => match parsed {
                    Ok(stmts) => match stmts.as_slice() {
                        [
                            ParsedStatement {
                                statement:
                                    Statement::Insert {
                                        table,
                                        columns,
                                        query,
                                        on_conflict,
                                    },
                                ..
                            },
                        ] => {
                            self.start_insert(
                                Target { table, columns },
                                query,
                                *on_conflict,
                                &record.sql,
                                Some(record.id.clone()),
                                record.owner.clone(),
                            )
                            .await
                        }
                        _ => Err(SqlError::internal("a registered job is not one INSERT statement").into()),
                    },
                    Err(e) => Err(e.into()),
                },
            };
            self.settings = saved;
            self.principal = saved_principal;
            self.temporary = saved_temporary;
            self.temporary_ddl = saved_ddl;
            // A job that cannot start for now (a file or service away)
            // stays and is tried at the next start; one that can never
            // start as written (its table dropped, ...) is forgotten.
            if let Err(SessionError::Sql(e)) = &result
                && !matches!(e.kind, ErrorKind::Runtime | ErrorKind::PermissionDenied)
            {
                registry.remove(&record.id);
            }
            out.push((record.name, result));
        }
        out
    }

    /// Every job's metrics by name (the newest run of each name), readable
    /// without the session (the metrics endpoint).
    pub fn jobs_view(&self) -> JobsView {
        self.shared.jobs_view.clone()
    }

    /// A job by id or name (the newest of that name).
    fn find_job(&self, key: &str) -> Result<SessionJob, SessionError> {
        find_in(&self.shared.jobs(), key)
    }

    /// The allowed directories of this session: the process's, narrowed
    /// by the session's `allowed-directories` option.
    fn paths(&self) -> Result<PathPolicy, SessionError> {
        narrowed(&self.shared.paths, &self.settings)
    }

    /// Starts the job of `INSERT INTO table query` (`sql` is its text, kept
    /// to start it again after a server restart).
    async fn start_insert(
        &mut self,
        Target { table, columns }: Target<'_>,
        query: &Query,
        on_conflict: Option<weir_sql::OnConflict>,
        sql: &str,
        id: Option<String>,
        owner: Option<String>,
    ) -> Result<StatementResult, SessionError> {
        let sink = self.sink_table(table)?;
        let config = self.job_config(&format!("insert-into-{table}"))?;
        let graph = {
            let catalog = self.catalog_view();
            self.shared
                .planner
                .plan_insert(&sink, columns, query, on_conflict, &catalog, &config)?
        };
        let mut settings = self.settings.clone();
        settings.insert(PIPELINE_NAME.to_string(), config.name.clone());
        // Where the job started from matters once: a resubmitted job
        // resumes from its own latest checkpoint, never from this again.
        settings.remove(weir_engine::config::RECOVERY_PATH);
        let sync = self
            .settings
            .get(DML_SYNC)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let owner = owner.or_else(|| Some(self.principal.user.clone()));
        // The name is checked and reserved under one lock: two clients
        // starting the same job name at once get one job and one refusal.
        let _reserved = {
            let mut jobs = self.shared.jobs();
            // Names that share a directory are the same job (`a.b`, `a_b`).
            let same = |n: &str| weir_engine::config::sanitize(n) == weir_engine::config::sanitize(&config.name);
            if let Some(previous) = jobs.known.iter().rev().find(|j| same(&j.record.name))
                && !self.principal.may_control(previous.record.owner.as_deref())
            {
                return Err(SqlError::permission_denied(format!(
                    "permission denied: job name '{}' (its state and checkpoints) belongs to user '{}'; \
                     SET 'pipeline.name' to another name",
                    config.name,
                    previous.record.owner.as_deref().unwrap_or("?")
                ))
                .into());
            }
            if let Some(running) = jobs
                .known
                .iter()
                .find(|j| same(&j.record.name) && !j.state().is_terminal())
            {
                return Err(SqlError::plan(format!(
                    "job '{}' is already running (id {}); STOP JOB '{}' first, or SET 'pipeline.name' to start another",
                    config.name, running.record.id, config.name
                ))
                .into());
            }
            if !jobs.starting.insert(weir_engine::config::sanitize(&config.name)) {
                return Err(SqlError::plan(format!(
                    "job '{}' is being started by another statement; SET 'pipeline.name' to start another",
                    config.name
                ))
                .into());
            }
            Reserved {
                shared: &self.shared,
                name: weir_engine::config::sanitize(&config.name),
            }
        };
        let job = deploy(graph, &config, None)?;
        let (job, id, name, resumed_from) = {
            let mut jobs = self.shared.jobs();
            let name = job.name.clone();
            let id = id.unwrap_or_else(new_job_id);
            let resumed_from = job
                .restored_from
                .as_ref()
                .map(|(id, path, _)| (*id, path.display().to_string()));
            let record = JobRecord {
                id: id.clone(),
                name: name.clone(),
                sql: sql.to_string(),
                settings,
                owner,
                temporary: self.temporary_ddl.iter().map(|(_, t)| t.clone()).collect(),
                ended: None,
            };
            if let Some(r) = self.shared.registry.get()
                && !sync
            {
                r.add(record.clone());
                r.record_end_when_ended(id.clone(), &job.metrics);
            }
            if let Ok(mut view) = self.shared.jobs_view.lock() {
                view.insert(name.clone(), job.metrics.clone());
            }
            jobs.known.push(SessionJob {
                record,
                metrics: job.metrics.clone(),
            });
            let ended = jobs.known.iter().filter(|j| j.state().is_terminal()).count();
            if ended > ENDED_JOBS_KEPT
                && let Some(oldest) = jobs.known.iter().position(|j| j.state().is_terminal())
            {
                let gone = jobs.known.remove(oldest);
                if !jobs.known.iter().any(|j| j.record.name == gone.record.name)
                    && let Ok(mut view) = self.shared.jobs_view.lock()
                {
                    view.remove(&gone.record.name);
                }
            }
            if sync {
                (Some(job), id, name, resumed_from)
            } else {
                jobs.running.push(job);
                (None, id, name, resumed_from)
            }
        };
        let mut state = weir_engine::runtime::metrics::JobState::Running.name();
        if let Some(job) = job {
            let metrics = job.metrics.clone();
            self.last_outcome = Some(job.wait().await?);
            state = metrics.lifecycle.state().name();
        }
        Ok(StatementResult::JobStarted {
            id,
            name,
            resumed_from,
            state,
        })
    }

    /// `STOP JOB`: sources stop, the job drains, takes its final checkpoint
    /// and ends; waits (up to a minute) for that, holding no lock.
    async fn stop_job(&mut self, key: &str) -> Result<StatementResult, SessionError> {
        let stopping = {
            let jobs = self.shared.jobs();
            let job = find_in(&jobs, key)?;
            self.check_control(&job, "stop")?;
            let (id, name, metrics) = (job.record.id.clone(), job.record.name.clone(), job.metrics.clone());
            let state = metrics.lifecycle.state();
            if state.is_terminal() {
                return Err(SqlError::plan(format!("job '{name}' is {}; nothing to stop", state.name())).into());
            }
            let Some(handle) = jobs.running.iter().find(|j| j.name == name && !j.is_finished()) else {
                return Err(SqlError::plan(format!("job '{name}' is not running")).into());
            };
            handle.stop();
            Stopping { id, name, metrics }
        };
        let (id, metrics) = (stopping.id.clone(), stopping.metrics.clone());
        let result = stopping.finish().await;
        if let Some(r) = self.shared.registry.get() {
            r.record_end(&id, &metrics);
        }
        self.shared.jobs().running.retain(|j| !j.is_finished());
        Ok(result)
    }

    /// `SET 'key' = 'value'` (also `weir run --from-savepoint`).
    pub fn set_option(&mut self, k: &str, v: &str) -> Result<StatementResult, SessionError> {
        JobConfig::validate_pair(k, v)?;
        let (k, v) = (k.to_string(), v.to_string());
        // A path option must be allowed now; a new
        // `allowed-directories` must lie inside the current ones.
        let current = self.paths()?;
        if k == ALLOWED_DIRECTORIES {
            narrowed(&current, &BTreeMap::from([(k.clone(), v.clone())]))?;
        }
        current.check_options(
            &BTreeMap::from([(k.clone(), v.clone())]),
            weir_engine::config::JOB_OPTIONS,
        )?;
        self.settings.insert(k.clone(), v.clone());
        Ok(StatementResult::Done("option set".into()))
    }

    /// `SAVEPOINT JOB` and `STOP JOB ... WITH SAVEPOINT [DRAIN]`: answers
    /// the savepoint's path once it is complete (and, stopping, once the
    /// job has stopped).
    async fn savepoint_job(
        &mut self,
        key: &str,
        dir: Option<&str>,
        mode: SavepointMode,
    ) -> Result<StatementResult, SessionError> {
        let dir = match dir {
            Some(d) => Some(self.paths()?.check(weir_engine::config::SAVEPOINT_DIR, d)?),
            None => None,
        };
        let (id, name, metrics, controller) = {
            let jobs = self.shared.jobs();
            let job = find_in(&jobs, key)?;
            let verb = if mode == SavepointMode::Keep {
                "take a savepoint of"
            } else {
                "stop"
            };
            self.check_control(&job, verb)?;
            let name = job.record.name.clone();
            let state = job.metrics.lifecycle.state();
            let handle = jobs.running.iter().find(|j| j.name == name && !j.is_finished());
            let (false, Some(handle)) = (state.is_terminal(), handle) else {
                return Err(
                    SqlError::plan(format!("job '{name}' is {}; it has no state to save", state.name())).into(),
                );
            };
            (job.record.id.clone(), name, job.metrics.clone(), handle.controller())
        };
        let done = controller.savepoint(dir, mode).await?;
        if mode != SavepointMode::Keep {
            let _ = Stopping {
                id: id.clone(),
                name,
                metrics: metrics.clone(),
            }
            .finish()
            .await;
            if let Some(r) = self.shared.registry.get() {
                r.record_end(&id, &metrics);
            }
            self.shared.jobs().running.retain(|j| !j.is_finished());
        }
        let schema = Arc::new(Schema::new(vec![Field::new("savepoint_path", DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec![done.path.display().to_string()])) as ArrayRef],
        )
        .map_err(ExecError::from)?;
        Ok(StatementResult::Rows(schema, vec![batch]))
    }

    /// `SHOW SAVEPOINTS FOR JOB`: the savepoints the job took, and those in
    /// its default savepoint directory (earlier runs).
    fn show_savepoints(&self, key: &str) -> Result<StatementResult, SessionError> {
        use arrow::array::{BooleanArray, UInt64Array};
        let job = self.find_job(key)?;
        let mut list = job
            .metrics
            .checkpoints
            .savepoints
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default();
        if let Ok(config) = JobConfig::from_settings(&job.record.settings, &job.record.name, &self.shared.data_dir) {
            let listed = weir_engine::checkpoint::objects::storage_at(&config.savepoint_dir, &config.s3)
                .map(|root| weir_engine::checkpoint::savepoint::list(&root))
                .unwrap_or_default();
            for s in listed {
                if !list.iter().any(|x| x.path == s.path) {
                    list.push(s);
                }
            }
        }
        list.sort_by_key(|s| (s.trigger_time_ms, s.checkpoint_id));
        let time = |t: i64| {
            chrono::DateTime::from_timestamp_millis(t)
                .map(|d| d.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
                .unwrap_or_default()
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("path", DataType::Utf8, false),
            Field::new("checkpoint_id", DataType::UInt64, false),
            Field::new("time", DataType::Utf8, false),
            Field::new("bytes", DataType::UInt64, false),
            Field::new("drained", DataType::Boolean, false),
            Field::new("stopped", DataType::Boolean, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    list.iter().map(|s| s.path.display().to_string()),
                )) as ArrayRef,
                Arc::new(UInt64Array::from_iter_values(list.iter().map(|s| s.checkpoint_id))),
                Arc::new(StringArray::from_iter_values(
                    list.iter().map(|s| time(s.trigger_time_ms)),
                )),
                Arc::new(UInt64Array::from_iter_values(list.iter().map(|s| s.bytes))),
                Arc::new(BooleanArray::from(list.iter().map(|s| s.drained).collect::<Vec<_>>())),
                Arc::new(BooleanArray::from(list.iter().map(|s| s.stopped).collect::<Vec<_>>())),
            ],
        )
        .map_err(ExecError::from)?;
        Ok(StatementResult::Rows(schema, vec![batch]))
    }

    /// Only the job's owner or an admin controls a job.
    fn check_control(&self, job: &SessionJob, verb: &str) -> Result<(), SessionError> {
        if self.principal.may_control(job.record.owner.as_deref()) {
            return Ok(());
        }
        Err(SqlError::permission_denied(format!(
            "permission denied: job '{}' belongs to user '{}'; only its owner or an admin may {verb} it",
            job.record.name,
            job.record.owner.as_deref().unwrap_or("?")
        ))
        .into())
    }

    /// `CANCEL JOB`: ends the job at once, without a final checkpoint.
    async fn cancel_job(&mut self, key: &str) -> Result<StatementResult, SessionError> {
        let (name, handle) = {
            let mut jobs = self.shared.jobs();
            let job = find_in(&jobs, key)?;
            self.check_control(&job, "cancel")?;
            let name = job.record.name.clone();
            let state = job.state();
            let pos = jobs.running.iter().position(|j| j.name == name && !j.is_finished());
            let (false, Some(pos)) = (state.is_terminal(), pos) else {
                return Err(SqlError::plan(format!("job '{name}' is {}; nothing to cancel", state.name())).into());
            };
            (
                name,
                (job.record.id.clone(), job.metrics.clone(), jobs.running.remove(pos)),
            )
        };
        let (id, metrics, handle) = handle;
        handle.cancel().await?;
        if let Some(r) = self.shared.registry.get() {
            r.record_end(&id, &metrics);
        }
        Ok(StatementResult::Done(format!("job '{name}' canceled")))
    }

    /// The config of a query's job (SELECT, SUBSCRIBE): a name of its own
    /// (`select-<pid>-<n>`), as its state must not share a directory with
    /// any other job, here or in another process on the same data dir.
    fn query_config(&mut self, kind: &str) -> Result<JobConfig, SessionError> {
        self.queries += 1;
        // Random, not the pid: containers sharing a data dir are all pid 1.
        let tag = &crate::jobs::new_job_id()[..8];
        let name = format!("{kind}-{tag}-{}", self.queries);
        // An INSERT's name and recovery path are not the query's.
        let mut settings = self.settings.clone();
        settings.remove(PIPELINE_NAME);
        settings.remove(weir_engine::config::RECOVERY_PATH);
        let paths = self.paths()?;
        let mut config = JobConfig::from_settings(&settings, &name, &self.shared.data_dir)?;
        // A query's job never checkpoints (its rows go to its client).
        config.checkpointing = None;
        Ok(config.restricted_to(paths, &settings)?)
    }

    /// The config of an `INSERT`'s job: `pipeline.name`, or the script's
    /// name / `insert-into-<table>`, with a suffix from the second job on.
    fn job_config(&mut self, fallback: &str) -> Result<JobConfig, SessionError> {
        // A job's name is its identity (state, checkpoints): the second job
        // of a script gets a suffix so the two never share a directory.
        let name = match self.settings.get(PIPELINE_NAME) {
            Some(n) => n.clone(),
            None => {
                self.started += 1;
                let base = self.default_job_name.as_deref().unwrap_or(fallback);
                if self.started == 1 {
                    base.to_string()
                } else {
                    format!("{base}-{}", self.started)
                }
            }
        };
        let paths = self.paths()?;
        let mut config = JobConfig::from_settings(&self.settings, &name, &self.shared.data_dir)?
            .restricted_to(paths, &self.settings)?;
        config.event_time_range = self.event_time_range;
        if let Some(c) = &self.cluster {
            // Every job over workers needs the workers' ports and worker
            // 0's coordinator to itself: two would meet on one mesh.
            if let Some(first) = &self.cluster_job {
                return Err(SqlError::unsupported(format!(
                    "a worker runs one job, and this script's is '{first}': this second INSERT needs workers of \
                     its own (its own SQL file and --peers)"
                ))
                .into());
            }
            self.cluster_job = Some(name.clone());
            if config.checkpointing.is_some() && !self.settings.contains_key(weir_engine::config::RESTART_STRATEGY) {
                // Flink 2's default (its pods are restarted forever; a limit
                // would count node failures over months), with whatever
                // `restart-strategy.exponential-delay.*` the script set.
                let mut settings = self.settings.clone();
                settings.insert(
                    weir_engine::config::RESTART_STRATEGY.to_string(),
                    "exponential-delay".to_string(),
                );
                config.restart = JobConfig::from_settings(&settings, &name, &self.shared.data_dir)?.restart;
            }
            if !self.settings.contains_key(weir_engine::config::PARALLELISM) {
                config.parallelism = c.workers();
            }
            config.cluster = Some(c.clone());
        }
        Ok(config)
    }

    /// Parses and executes every statement of `sql`, stopping at the first
    /// error.
    pub async fn execute_sql(&mut self, sql: &str) -> Result<Vec<StatementResult>, SessionError> {
        let mut out = vec![];
        for stmt in weir_sql::parse(sql)? {
            match self.execute(&stmt).await {
                Ok(r) => out.push(r),
                Err(e) => {
                    // Live queries already started have no reader now.
                    for r in out {
                        if let StatementResult::Stream(rs) = r {
                            rs.job.stop();
                        }
                    }
                    return Err(at(e, stmt.location));
                }
            }
        }
        Ok(out)
    }

    pub async fn execute(&mut self, stmt: &ParsedStatement) -> Result<StatementResult, SessionError> {
        self.execute_statement(&stmt.statement, &stmt.text)
            .await
            .map_err(|e| at(e, stmt.location))
    }

    /// `ALTER TABLE`: the catalog's definition changed and checked as a
    /// CREATE TABLE's is; running jobs keep what they were planned with
    /// (as in Flink).
    fn alter_table(
        &mut self,
        name: &str,
        if_exists: bool,
        change: &weir_sql::parser::TableChange,
    ) -> Result<StatementResult, SessionError> {
        use weir_sql::parser::TableChange;
        // `weir serve` plans its jobs again from their SQL after a restart,
        // against the catalog as it is then: an altered table would move a
        // job's input or output under its checkpoints (Flink keeps the
        // compiled job instead).
        if let Some(r) = self.shared.registry.get() {
            let live: Vec<String> = r
                .records()
                .into_iter()
                .filter(|j| j.ended.is_none())
                .map(|j| format!("'{}'", j.name))
                .collect();
            if !live.is_empty() {
                return Err(SqlError::unsupported(format!(
                    "ALTER TABLE while jobs run is not supported by this server: job(s) {} would be planned again \
                     with the altered table after a restart; stop them first",
                    live.join(", ")
                ))
                .into());
            }
        }
        if self.temporary.get(name).is_some() && !if_exists {
            // Flink: a temporary table cannot be altered (a no-op with IF
            // EXISTS).
            return Err(SqlError::unsupported(format!(
                "ALTER TABLE of the temporary table '{name}' is not supported; DROP TEMPORARY TABLE {name} and create it again"
            ))
            .into());
        }
        if self.temporary.get(name).is_some() {
            return Ok(StatementResult::Done("nothing to alter".into()));
        }
        let paths = self.paths()?;
        let mut catalog = self.shared.catalog_mut();
        let mut def = match catalog.get(name) {
            Some(Entry::Table(t)) => t.clone(),
            Some(Entry::View(_)) => {
                return Err(SqlError::plan(format!("'{name}' is a view, not a table")).into());
            }
            None if if_exists => return Ok(StatementResult::Done("nothing to alter".into())),
            None => return Err(SqlError::not_found(format!("table '{name}' does not exist")).into()),
        };
        match change {
            TableChange::Set(options) => {
                let mut seen = std::collections::HashSet::new();
                for (k, v, at) in options {
                    if !seen.insert(k) {
                        return Err(SqlError::plan(format!("option '{k}' is given twice")).at(*at).into());
                    }
                    // Read into the table's watermark at CREATE TABLE.
                    if k.starts_with("scan.watermark.alignment.") {
                        return Err(SqlError::unsupported(format!(
                            "ALTER TABLE ... SET '{k}' is not supported: the alignment options are part of the \
                             watermark; DROP TABLE {name} and create it again"
                        ))
                        .at(*at)
                        .into());
                    }
                    def.options.insert(k.clone(), v.clone());
                }
            }
            TableChange::Reset(keys) => {
                for (k, at) in keys {
                    if k == "connector" || k.starts_with("scan.watermark.alignment.") {
                        return Err(SqlError::unsupported(format!(
                            "ALTER TABLE ... RESET '{k}' is not supported; DROP TABLE {name} and create it again"
                        ))
                        .at(*at)
                        .into());
                    }
                    def.options.remove(k);
                }
            }
            TableChange::RenameTo(to) => {
                if catalog.get(to).is_some() || self.temporary.get(to).is_some() {
                    return Err(
                        SqlError::plan(format!("cannot rename '{name}' to '{to}': '{to}' already exists")).into(),
                    );
                }
                def.name = to.clone();
            }
        }
        weir_engine::connectors::validate_table(&def).map_err(SqlError::from)?;
        weir_engine::connectors::check_table_paths(&def, &paths)?;
        catalog.replace(name, Entry::Table(def))?;
        Ok(StatementResult::Done(match change {
            TableChange::RenameTo(to) => format!("table renamed to {to}"),
            _ => "table altered".into(),
        }))
    }

    async fn execute_statement(&mut self, stmt: &Statement, text: &str) -> Result<StatementResult, SessionError> {
        self.principal.authorize(stmt)?;
        match stmt {
            Statement::CreateTable(ct) => {
                let def = weir_sql::ddl::create_table(ct, &self.shared.planner)?;
                // A path outside the allowed directories is refused now,
                // naming the option (and again whenever a job uses it).
                weir_engine::connectors::check_table_paths(&def, &self.paths()?)?;
                if ct.temporary {
                    if self.temporary.get(&def.name).is_some() && !ct.if_not_exists {
                        return Err(SqlError::plan(format!(
                            "temporary table '{}' already exists; DROP TEMPORARY TABLE {} first",
                            def.name, def.name
                        ))
                        .into());
                    }
                    let name = def.name.clone();
                    if self.temporary.get(&name).is_none() {
                        self.temporary.create(Entry::Table(def), ct.if_not_exists)?;
                        self.temporary_ddl.push((name, text.to_string()));
                    }
                    return Ok(StatementResult::Done("temporary table created".into()));
                }
                // The check and the change under one write lock: concurrent
                // DDL of the same name cannot both pass the check.
                let mut catalog = self.shared.catalog_mut();
                // The catalog outlives the script: re-running a script that
                // creates the same table again is not an error.
                if let Some(Entry::Table(existing)) = catalog.get(&def.name) {
                    if *existing == def {
                        return Ok(StatementResult::Done("table exists, unchanged".into()));
                    }
                    if !ct.if_not_exists {
                        return Err(SqlError::plan(format!(
                            "table '{}' already exists with a different definition; DROP TABLE {} first",
                            def.name, def.name
                        ))
                        .into());
                    }
                }
                catalog.create(Entry::Table(def), ct.if_not_exists)?;
                Ok(StatementResult::Done("table created".into()))
            }
            Statement::CreateView {
                name,
                if_not_exists,
                or_replace,
                temporary: true,
                query,
            } => {
                // Planned over what the session sees (temporary tables too).
                self.shared.planner.logical_plan(query, &self.catalog_view())?;
                if self.temporary.get(name).is_some() {
                    if *or_replace {
                        Catalog::drop(&mut self.temporary, name, true)?;
                    } else if *if_not_exists {
                        return Ok(StatementResult::Done("temporary view exists".into()));
                    } else {
                        return Err(SqlError::plan(format!(
                            "temporary view '{name}' already exists; DROP TEMPORARY VIEW {name} first"
                        ))
                        .into());
                    }
                }
                let view = ViewDef {
                    name: name.clone(),
                    query: query.to_string(),
                };
                self.temporary.create(Entry::View(view), false)?;
                self.temporary_ddl.retain(|(n, _)| n != name);
                self.temporary_ddl.push((name.clone(), text.to_string()));
                Ok(StatementResult::Done("temporary view created".into()))
            }
            Statement::CreateView {
                name,
                if_not_exists,
                or_replace,
                query,
                ..
            } => {
                let mut catalog = self.shared.catalog_mut();
                // Plan it now so a broken view is rejected at CREATE.
                self.shared.planner.logical_plan(query, &catalog)?;
                if *or_replace {
                    if let Some(Entry::Table(_)) = catalog.get(name) {
                        return Err(SqlError::plan(format!("'{name}' is a table, not a view")).into());
                    }
                    Catalog::drop(&mut catalog, name, true)?;
                }
                let view = ViewDef {
                    name: name.clone(),
                    query: query.to_string(),
                };
                if let Some(Entry::View(existing)) = catalog.get(name)
                    && *existing == view
                {
                    return Ok(StatementResult::Done("view exists, unchanged".into()));
                }
                catalog.create(Entry::View(view), *if_not_exists)?;
                Ok(StatementResult::Done("view created".into()))
            }
            Statement::Drop {
                name,
                view,
                if_exists,
                temporary: true,
            } => {
                let kind = if *view { "view" } else { "table" };
                match (self.temporary.get(name), view) {
                    (Some(Entry::Table(_)), true) => {
                        return Err(
                            SqlError::plan(format!("'{name}' is a temporary table; use DROP TEMPORARY TABLE")).into(),
                        );
                    }
                    (Some(Entry::View(_)), false) => {
                        return Err(
                            SqlError::plan(format!("'{name}' is a temporary view; use DROP TEMPORARY VIEW")).into(),
                        );
                    }
                    (None, _) if !*if_exists => {
                        return Err(SqlError::not_found(format!("temporary {kind} '{name}' does not exist")).into());
                    }
                    _ => {}
                }
                let dropped = Catalog::drop(&mut self.temporary, name, true)?;
                self.temporary_ddl.retain(|(n, _)| n != name);
                Ok(StatementResult::Done(if dropped {
                    format!("temporary {kind} dropped")
                } else {
                    "nothing to drop".into()
                }))
            }
            Statement::Drop {
                name, view, if_exists, ..
            } => {
                // Flink: a temporary object of the name hides the permanent
                // one, which is dropped only once the temporary one is.
                if self.temporary.get(name).is_some() {
                    return Err(SqlError::plan(format!(
                        "'{name}' is a temporary {} of this session; use DROP TEMPORARY {}",
                        if matches!(self.temporary.get(name), Some(Entry::View(_))) {
                            "view"
                        } else {
                            "table"
                        },
                        if matches!(self.temporary.get(name), Some(Entry::View(_))) {
                            "VIEW"
                        } else {
                            "TABLE"
                        },
                    ))
                    .into());
                }
                let mut catalog = self.shared.catalog_mut();
                match (catalog.get(name), view) {
                    (Some(Entry::Table(_)), true) => {
                        return Err(SqlError::plan(format!("'{name}' is a table; use DROP TABLE")).into());
                    }
                    (Some(Entry::View(_)), false) => {
                        return Err(SqlError::plan(format!("'{name}' is a view; use DROP VIEW")).into());
                    }
                    _ => {}
                }
                let dropped = Catalog::drop(&mut catalog, name, *if_exists)?;
                Ok(StatementResult::Done(if dropped {
                    format!("{} dropped", if *view { "view" } else { "table" })
                } else {
                    "nothing to drop".into()
                }))
            }
            Statement::AlterTable {
                name,
                if_exists,
                change,
            } => self.alter_table(name, *if_exists, change),
            Statement::ShowTables | Statement::ShowViews => {
                let views = matches!(stmt, Statement::ShowViews);
                let names: Vec<String> = self
                    .catalog_view()
                    .entries()
                    .filter(|(_, e)| !views || matches!(e, Entry::View(_)))
                    .map(|(n, _)| n.clone())
                    .collect();
                let column = if views { "view name" } else { "table name" };
                let schema = Arc::new(Schema::new(vec![Field::new(column, DataType::Utf8, false)]));
                let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(names)) as ArrayRef])
                    .map_err(ExecError::from)?;
                Ok(StatementResult::Rows(schema, vec![batch]))
            }
            Statement::Describe(name) => self.describe(name),
            Statement::ShowCreate { name, view } => self.show_create(name, *view),
            Statement::ShowWatermarks(job) => self.show_watermarks(job),
            Statement::ShowCheckpoints(job) => self.show_checkpoints(job),
            Statement::ShowJobs => {
                let batch = crate::jobs::show_jobs(self.shared.jobs().known.iter()).map_err(ExecError::from)?;
                Ok(StatementResult::Rows(batch.schema(), vec![batch]))
            }
            Statement::DescribeJob(key) => {
                let batch = crate::jobs::describe_job(&self.find_job(key)?).map_err(ExecError::from)?;
                Ok(StatementResult::Rows(batch.schema(), vec![batch]))
            }
            Statement::StopJob(key) => self.stop_job(key).await,
            Statement::StopJobWithSavepoint { job, dir, drain } => {
                let mode = if *drain {
                    SavepointMode::StopDrain
                } else {
                    SavepointMode::Stop
                };
                self.savepoint_job(job, dir.as_deref(), mode).await
            }
            Statement::SavepointJob { job, dir } => self.savepoint_job(job, dir.as_deref(), SavepointMode::Keep).await,
            Statement::ShowSavepoints(job) => self.show_savepoints(job),
            Statement::CancelJob(key) => self.cancel_job(key).await,
            Statement::Set(None) => {
                let schema = Arc::new(Schema::new(vec![
                    Field::new("key", DataType::Utf8, false),
                    Field::new("value", DataType::Utf8, false),
                ]));
                let keys: Vec<&str> = self.settings.keys().map(String::as_str).collect();
                let values: Vec<&str> = self.settings.iter().map(|(k, v)| crate::access::shown(k, v)).collect();
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(StringArray::from(keys)) as ArrayRef,
                        Arc::new(StringArray::from(values)),
                    ],
                )
                .map_err(ExecError::from)?;
                Ok(StatementResult::Rows(schema, vec![batch]))
            }
            Statement::Set(Some((k, v))) => self.set_option(k, v),
            Statement::Reset(None) => {
                // A session that narrowed its directories keeps them.
                self.settings.retain(|k, _| k == ALLOWED_DIRECTORIES);
                Ok(StatementResult::Done("all options reset".into()))
            }
            Statement::Reset(Some(k)) => {
                JobConfig::check_key(k)?;
                if k == ALLOWED_DIRECTORIES {
                    return Err(SqlError::permission_denied(format!(
                        "permission denied: '{ALLOWED_DIRECTORIES}' can be narrowed again but not reset"
                    ))
                    .into());
                }
                self.settings.remove(k);
                Ok(StatementResult::Done("option reset".into()))
            }
            Statement::Explain(inner) => self.explain(inner),
            Statement::Insert {
                table,
                columns,
                query,
                on_conflict,
            } => {
                self.start_insert(Target { table, columns }, query, *on_conflict, text, None, None)
                    .await
            }
            Statement::Query(q) => {
                let config = self.query_config("select")?;
                match self.plan_query(q, &config)? {
                    QueryPlan::Batch(plan) => {
                        let schema = Arc::new(plan.schema().as_arrow().clone());
                        let rows = self.shared.planner.execute_batch(plan).await?;
                        Ok(StatementResult::Rows(schema, rows))
                    }
                    QueryPlan::Stream(graph) => {
                        let shape = self.result_shape(&graph)?;
                        let final_table = matches!(shape, ResultShape::FinalTable(_));
                        let (tx, rx) = mpsc::channel(16);
                        let job = deploy(graph, &config, Some(tx))?;
                        let (schema, rows, changelog) = match shape {
                            ResultShape::Inserts(schema) => (schema, result_rows(rx, false), false),
                            ResultShape::Changelog(schema) => (schema, result_rows(rx, true), true),
                            // The changes, `_op` first, for the server to
                            // apply ([`ResultStream::final_table`]).
                            ResultShape::FinalTable(schema) => (schema, result_rows(rx, true), false),
                        };
                        Ok(StatementResult::Stream(ResultStream {
                            schema,
                            rows,
                            job,
                            changelog,
                            final_table,
                            zone: config.local_time_zone.clone(),
                        }))
                    }
                }
            }
            Statement::Subscribe(q) => {
                let config = self.query_config("subscribe")?;
                match self.plan_query(q, &config)? {
                    QueryPlan::Batch(plan) => {
                        let rows = self.shared.planner.execute_batch(plan).await?;
                        let rows = rows
                            .into_iter()
                            .map(|b| with_op_column(&b.into()))
                            .collect::<Result<Vec<_>, _>>()?;
                        let schema = match rows.first() {
                            Some(b) => b.schema(),
                            None => changelog_schema(&Schema::empty()),
                        };
                        Ok(StatementResult::Rows(schema, rows))
                    }
                    QueryPlan::Stream(graph) => {
                        let schema = graph
                            .nodes
                            .last()
                            .map(|n| changelog_schema(&n.schema))
                            .ok_or_else(|| ExecError::internal("empty plan"))?;
                        let (tx, rx) = mpsc::channel(16);
                        let job = deploy(graph, &config, Some(tx))?;
                        Ok(StatementResult::Stream(ResultStream {
                            schema,
                            rows: result_rows(rx, true),
                            job,
                            changelog: true,
                            final_table: false,
                            zone: config.local_time_zone.clone(),
                        }))
                    }
                }
            }
        }
    }

    /// `sql-client.execution.result-mode`, if set.
    /// `table.local-time-zone` of this session (`None`: UTC).
    pub fn local_time_zone(&self) -> Option<weir_engine::time_zone::SessionZone> {
        let zone = self.settings.get(weir_engine::config::LOCAL_TIME_ZONE)?;
        weir_engine::config::local_time_zone(zone).ok().flatten()
    }

    pub fn result_mode(&self) -> Option<&str> {
        self.settings.get(weir_engine::config::RESULT_MODE).map(String::as_str)
    }

    fn job_metrics(&self, job: &str) -> Result<Arc<JobMetrics>, SessionError> {
        Ok(self.find_job(job)?.metrics)
    }

    /// Plans a query under the catalog's read lock (planning is quick and
    /// never waits).
    fn plan_query(&self, q: &Query, config: &JobConfig) -> Result<QueryPlan, SessionError> {
        let catalog = self.catalog_view();
        Ok(self.shared.planner.plan_query(q, &catalog, config)?)
    }

    /// One row per checkpoint of the job (newest last): id, status, trigger
    /// time, durations, sizes.
    fn show_checkpoints(&self, job: &str) -> Result<StatementResult, SessionError> {
        use arrow::array::{BooleanArray, StringArray, UInt64Array};
        use arrow::datatypes::{DataType, Field, Schema};
        let metrics = self.job_metrics(job)?;
        let entries = metrics.checkpoints.entries();
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        let time = |t: i64| {
            chrono::DateTime::from_timestamp_millis(t)
                .map(|d| d.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
                .unwrap_or_default()
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("status", DataType::Utf8, false),
            Field::new("is_final", DataType::Boolean, false),
            Field::new("trigger_time", DataType::Utf8, false),
            Field::new("duration_ms", DataType::UInt64, false),
            Field::new("alignment_ms", DataType::UInt64, false),
            Field::new("sync_ms", DataType::UInt64, false),
            Field::new("async_ms", DataType::UInt64, false),
            Field::new("full_bytes", DataType::UInt64, false),
            Field::new("incremental_bytes", DataType::UInt64, false),
            Field::new("in_flight_bytes", DataType::UInt64, false),
            Field::new("message", DataType::Utf8, false),
            // What each two-phase sink's commit made (a Delta version).
            Field::new("sink_commits", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| e.id))) as ArrayRef,
                Arc::new(StringArray::from_iter_values(entries.iter().map(|e| e.status.as_str()))),
                Arc::new(BooleanArray::from(
                    entries.iter().map(|e| e.is_final).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from_iter_values(
                    entries.iter().map(|e| time(e.trigger_time_ms)),
                )),
                Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| ms(e.duration)))),
                Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| ms(e.alignment)))),
                Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| ms(e.sync)))),
                Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| ms(e.async_part)))),
                Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| e.full_bytes))),
                Arc::new(UInt64Array::from_iter_values(
                    entries.iter().map(|e| e.incremental_bytes),
                )),
                Arc::new(UInt64Array::from_iter_values(entries.iter().map(|e| e.in_flight_bytes))),
                Arc::new(StringArray::from_iter_values(entries.iter().map(|e| e.message.clone()))),
                Arc::new(StringArray::from_iter_values(entries.iter().map(|e| {
                    e.sink_commits
                        .iter()
                        .map(|c| c.describe())
                        .collect::<Vec<_>>()
                        .join("; ")
                }))),
            ],
        )
        .map_err(ExecError::from)?;
        Ok(StatementResult::Rows(schema, vec![batch]))
    }

    /// The types the planner infers for the `$n` parameters of `sql` (one
    /// query or INSERT), by name (`$1`); none when it cannot tell.
    pub fn parameter_types(&self, sql: &str) -> std::collections::HashMap<String, DataType> {
        let Ok(stmts) = weir_sql::parse(sql) else {
            return Default::default();
        };
        let query = match stmts.first().map(|s| &s.statement) {
            Some(Statement::Query(q) | Statement::Subscribe(q) | Statement::Insert { query: q, .. }) => q,
            _ => return Default::default(),
        };
        let Ok(plan) = self.shared.planner.logical_plan(query, &self.catalog_view()) else {
            return Default::default();
        };
        plan.get_parameter_types()
            .map(|types| types.into_iter().filter_map(|(k, t)| Some((k, t?))).collect())
            .unwrap_or_default()
    }

    /// Tables and views of the catalog: (name, "TABLE" | "VIEW", columns).
    pub fn catalog_entries(&self) -> Vec<(String, &'static str, SchemaRef)> {
        self.shared
            .catalog()
            .entries()
            .map(|(name, e)| match e {
                Entry::Table(t) => (name.clone(), "TABLE", t.schema()),
                Entry::View(_) => (name.clone(), "VIEW", Arc::new(Schema::empty())),
            })
            .collect()
    }

    /// The schema of the rows `sql` (one statement) returns, computed by
    /// planning it without running anything: a query's columns, the job
    /// row of an INSERT, no columns for the rest.
    pub async fn result_schema(&mut self, sql: &str) -> Result<SchemaRef, SessionError> {
        let mut stmts = weir_sql::parse(sql)?;
        if stmts.len() != 1 {
            return Err(SqlError::plan(format!("expected one statement, found {}", stmts.len())).into());
        }
        let stmt = stmts.remove(0);
        Ok(match &stmt.statement {
            Statement::Query(q) => {
                // Planning only: no job name is used up.
                let config = self.explain_config("select")?;
                match self.plan_query(q, &config)? {
                    QueryPlan::Batch(plan) => Arc::new(plan.schema().as_arrow().clone()),
                    QueryPlan::Stream(graph) => self.result_shape(&graph)?.schema(),
                }
            }
            Statement::Insert { .. } => job_row_schema(),
            Statement::StopJob(_) => job_end_schema(),
            Statement::Subscribe(q) => {
                let config = self.explain_config("subscribe")?;
                match self.plan_query(q, &config)? {
                    QueryPlan::Batch(plan) => changelog_schema(plan.schema().as_arrow()),
                    QueryPlan::Stream(graph) => graph
                        .nodes
                        .last()
                        .map(|n| changelog_schema(&n.schema))
                        .ok_or_else(|| ExecError::internal("empty plan"))?,
                }
            }
            // Read-only statements whose columns are only known by running
            // them: run them (nothing changes).
            Statement::ShowTables
            | Statement::ShowViews
            | Statement::ShowJobs
            | Statement::ShowWatermarks(_)
            | Statement::ShowCheckpoints(_)
            | Statement::ShowSavepoints(_)
            | Statement::DescribeJob(_)
            | Statement::Describe(_)
            | Statement::ShowCreate { .. }
            | Statement::Explain(_)
            | Statement::Set(None) => match self.execute(&stmt).await? {
                StatementResult::Rows(schema, _) => schema,
                StatementResult::Explain(_) => Arc::new(Schema::new(vec![Field::new("plan", DataType::Utf8, false)])),
                _ => Arc::new(Schema::empty()),
            },
            _ => Arc::new(Schema::empty()),
        })
    }

    /// Per split: watermark, lag, state, time paused; per alignment group:
    /// minimum, max allowed, spread; per stateful operator: state growth per
    /// second of event time and the drift a state budget allows.
    fn show_watermarks(&self, job: &str) -> Result<StatementResult, SessionError> {
        let metrics = self.job_metrics(job)?;
        let budget = match self.settings.get(weir_engine::config::ALIGNMENT_STATE_BUDGET) {
            Some(v) => Some(weir_catalog::options::parse_memory_size(v).ok_or_else(|| {
                SqlError::plan(format!(
                    "option '{}': invalid value '{v}'",
                    weir_engine::config::ALIGNMENT_STATE_BUDGET
                ))
            })?),
            None => None,
        };
        let rows = crate::watermarks::rows(&metrics, budget, chrono::Utc::now().timestamp_millis());
        let batch = crate::watermarks::to_batch(&rows).map_err(ExecError::from)?;
        Ok(StatementResult::Rows(batch.schema(), vec![batch]))
    }

    fn sink_table(&self, name: &str) -> Result<weir_catalog::TableDef, SessionError> {
        match self.catalog_view().get(name) {
            Some(Entry::Table(t)) => Ok(t.clone()),
            Some(Entry::View(_)) => Err(SqlError::plan(format!("cannot INSERT INTO view '{name}'")).into()),
            None => Err(SqlError::not_found(format!("table '{name}' does not exist")).into()),
        }
    }

    fn explain(&mut self, inner: &Statement) -> Result<StatementResult, SessionError> {
        let graph = match inner {
            Statement::Insert {
                table,
                columns,
                query,
                on_conflict,
            } => {
                let sink = self.sink_table(table)?;
                let config = self.explain_config(&format!("insert-into-{table}"))?;
                let graph = self.shared.planner.plan_insert(
                    &sink,
                    columns,
                    query,
                    *on_conflict,
                    &self.catalog_view(),
                    &config,
                )?;
                (graph, config)
            }
            Statement::Query(q) => {
                let config = self.explain_config("select")?;
                match self.plan_query(q, &config)? {
                    QueryPlan::Batch(plan) => {
                        return Ok(StatementResult::Explain(format!(
                            "Batch query (no table is read):\n{}",
                            plan.display_indent()
                        )));
                    }
                    QueryPlan::Stream(g) => (g, config),
                }
            }
            _ => {
                return Err(
                    SqlError::new(ErrorKind::Unsupported, "EXPLAIN works on SELECT and INSERT statements").into(),
                );
            }
        };
        Ok(StatementResult::Explain(graph.0.explain(&graph.1)))
    }

    /// A job config that does not count as a started job.
    fn explain_config(&self, fallback: &str) -> Result<JobConfig, SessionError> {
        let name = self
            .settings
            .get(PIPELINE_NAME)
            .cloned()
            .unwrap_or_else(|| fallback.to_string());
        Ok(JobConfig::from_settings(&self.settings, &name, &self.shared.data_dir)?
            .restricted_to(self.paths()?, &self.settings)?)
    }

    /// `SHOW CREATE TABLE|VIEW name`: one row, column `result` (Flink's).
    fn show_create(&self, name: &str, view: bool) -> Result<StatementResult, SessionError> {
        let temporary = self.temporary.get(name).is_some();
        let catalog = self.catalog_view();
        let ddl = match (catalog.get(name), view) {
            (Some(Entry::Table(t)), false) => crate::show_create::table_ddl(t, temporary),
            (Some(Entry::View(v)), true) => crate::show_create::view_ddl(v, temporary),
            (Some(Entry::Table(_)), true) => {
                return Err(SqlError::plan(format!(
                    "'{name}' is a table, not a view; SHOW CREATE TABLE {name} shows it"
                ))
                .into());
            }
            (Some(Entry::View(_)), false) => {
                return Err(SqlError::plan(format!(
                    "'{name}' is a view, not a table; SHOW CREATE VIEW {name} shows it"
                ))
                .into());
            }
            (None, _) => {
                let what = if view { "view" } else { "table" };
                return Err(SqlError::not_found(format!("{what} '{name}' does not exist")).into());
            }
        };
        let schema = Arc::new(Schema::new(vec![Field::new("result", DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(vec![ddl])) as ArrayRef])
            .map_err(ExecError::from)?;
        Ok(StatementResult::Rows(schema, vec![batch]))
    }

    fn describe(&self, name: &str) -> Result<StatementResult, SessionError> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("type", DataType::Utf8, false),
            Field::new("null", DataType::Boolean, false),
            Field::new("extras", DataType::Utf8, true),
            Field::new("watermark", DataType::Utf8, true),
        ]));
        let catalog = self.catalog_view();
        let (names, types, nulls, extras, wms): DescribeColumns = match catalog.get(name) {
            Some(Entry::Table(t)) => {
                let mut v = (vec![], vec![], vec![], vec![], vec![]);
                for c in &t.columns {
                    let rowtime = t.watermark.as_ref().is_some_and(|w| w.column == c.name);
                    v.0.push(c.name.clone());
                    v.1.push(if rowtime {
                        format!("{} *ROWTIME*", c.type_name)
                    } else {
                        c.type_name.clone()
                    });
                    v.2.push(c.nullable);
                    // Flink's DESCRIBE "extras": `AS expr`, `METADATA FROM 'k' VIRTUAL`.
                    v.3.push(match (&c.computed, &c.metadata) {
                        (Some(e), _) => Some(format!("AS {e}")),
                        (None, Some(m)) => Some(format!(
                            "METADATA FROM '{}'{}",
                            m.key,
                            if m.is_virtual { " VIRTUAL" } else { "" }
                        )),
                        (None, None) => None,
                    });
                    v.4.push(t.watermark.as_ref().filter(|_| rowtime).map(|w| match &w.alignment {
                        Some(a) => format!(
                            "{} ALIGNMENT GROUP '{}' MAX DRIFT {} ms UPDATE {} ms",
                            w.expr, a.group, a.max_drift_ms, a.update_interval_ms
                        ),
                        None => w.expr.clone(),
                    }));
                }
                v
            }
            Some(Entry::View(v)) => {
                let q = weir_sql::parse(&v.query)?;
                let Some(Statement::Query(query)) = q.into_iter().next().map(|s| s.statement) else {
                    return Err(SqlError::internal(format!("stored view '{name}' is not a query")).into());
                };
                let plan = self.shared.planner.logical_plan(&query, &catalog)?;
                let mut out = (vec![], vec![], vec![], vec![], vec![]);
                for f in plan.schema().fields() {
                    out.0.push(f.name().clone());
                    out.1.push(weir_sql::types::flink_name(f.data_type()));
                    out.2.push(f.is_nullable());
                    out.3.push(None);
                    out.4.push(None);
                }
                out
            }
            None => return Err(SqlError::not_found(format!("table or view '{name}' does not exist")).into()),
        };
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(names)) as ArrayRef,
                Arc::new(StringArray::from(types)),
                Arc::new(BooleanArray::from(nulls)),
                Arc::new(StringArray::from(extras)),
                Arc::new(StringArray::from(wms)),
            ],
        )
        .map_err(ExecError::from)?;
        Ok(StatementResult::Rows(schema, vec![batch]))
    }
}

/// DESCRIBE's columns: name, type, nullable, extras, watermark.
type DescribeColumns = (
    Vec<String>,
    Vec<String>,
    Vec<bool>,
    Vec<Option<String>>,
    Vec<Option<String>>,
);

/// A job of `jobs` by id or name (the newest of that name).
fn find_in(jobs: &JobTable, key: &str) -> Result<SessionJob, SessionError> {
    // An id first: a job may be named like another job's id.
    let newest = |f: &dyn Fn(&SessionJob) -> bool| jobs.known.iter().rev().find(|j| f(j)).cloned();
    newest(&|j| j.record.id == key)
        .or_else(|| newest(&|j| j.record.name == key))
        .ok_or_else(|| {
            let known: Vec<&str> = jobs.known.iter().map(|j| j.record.name.as_str()).collect();
            SqlError::not_found(format!(
                "no job '{key}'; jobs: {}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ))
            .into()
        })
}

/// `paths` narrowed by the `allowed-directories` option of `settings`
/// (comma-separated directories, each inside `paths`).
fn narrowed(paths: &PathPolicy, settings: &BTreeMap<String, String>) -> Result<PathPolicy, SessionError> {
    let Some(list) = settings.get(ALLOWED_DIRECTORIES) else {
        return Ok(paths.clone());
    };
    let dirs: Vec<PathBuf> = list
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    Ok(paths.narrow(ALLOWED_DIRECTORIES, &dirs)?)
}

/// Gives an error without a position the statement's position.
fn at(e: SessionError, location: Location) -> SessionError {
    match e {
        SessionError::Sql(s) => SessionError::Sql(s.at(location)),
        SessionError::Exec(e) => SessionError::Sql(SqlError::from(e).at(location)),
        other => SessionError::Sql(SqlError {
            kind: ErrorKind::Catalog,
            message: other.to_string(),
            location: Some(location),
        }),
    }
}

/// The sink of an `INSERT` and the columns it names (none: all).
struct Target<'a> {
    table: &'a str,
    columns: &'a [(String, weir_sql::Location)],
}

/// A job asked to stop, to be waited for.
pub struct Stopping {
    id: String,
    name: String,
    metrics: Arc<JobMetrics>,
}

impl Stopping {
    /// Waits (up to a minute) for the job to end, and answers with the
    /// state it ended in: STOPPED (with its final checkpoint), or FINISHED
    /// or FAILED when it ended otherwise meanwhile.
    pub async fn finish(self) -> StatementResult {
        let Stopping { id, name, metrics } = self;
        let mut states = metrics.lifecycle.watch();
        let ended = tokio::time::timeout(STOP_WAIT, states.wait_for(|s| s.is_terminal()))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|s| s.clone());
        let message = match &ended {
            Some(JobState::Stopped) => match metrics.checkpoints.last_completed() {
                Some(c) => format!("job '{name}' stopped (final checkpoint {})", c.id),
                None => format!("job '{name}' stopped"),
            },
            Some(JobState::Failed(why)) => format!("job '{name}' failed while stopping: {why}"),
            Some(other) => format!("job '{name}' ended {} before it stopped", other.name()),
            None => format!(
                "job '{name}' is stopping (still draining after {} s); SHOW JOBS tells when it has stopped",
                STOP_WAIT.as_secs()
            ),
        };
        StatementResult::JobEnded {
            id,
            name,
            state: metrics.lifecycle.state().name(),
            message,
        }
    }
}

/// How long `STOP JOB` waits for the job to drain and checkpoint.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What a streaming query answers with.
enum ResultShape {
    /// An insert-only result: its rows as they come.
    Inserts(SchemaRef),
    /// An updating result as changes: each row's kind in a leading `_op`
    /// column (the same whether asked for before running, as Flight's
    /// GetFlightInfo does, or while streaming).
    Changelog(SchemaRef),
    /// A bounded updating result: the table the changes add up to, once
    /// the query has ended.
    FinalTable(SchemaRef),
}

impl ResultShape {
    fn schema(self) -> SchemaRef {
        match self {
            ResultShape::Inserts(s) | ResultShape::Changelog(s) | ResultShape::FinalTable(s) => s,
        }
    }
}

/// A subscription's columns: `_op` (Flink's row kinds `+I -U +U -D`),
/// then the query's.
pub fn changelog_schema(schema: &Schema) -> SchemaRef {
    let mut fields = vec![Arc::new(Field::new("_op", DataType::Utf8, false))];
    fields.extend(schema.fields().iter().cloned());
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Prepends `_op` (`+I`, `-U`, `+U`, `-D`) to every row.
fn with_op_column(batch: &ChangeBatch) -> Result<RecordBatch, ExecError> {
    let schema = changelog_schema(&batch.rows.schema());
    let ops = StringArray::from_iter_values((0..batch.num_rows()).map(|i| batch.kind(i).short()));
    let mut columns = vec![Arc::new(ops) as ArrayRef];
    columns.extend(batch.rows.columns().iter().cloned());
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The row `STOP JOB` answers with over Flight SQL: the job's end.
pub fn job_end_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("job_id", DataType::Utf8, false),
        Field::new("job_name", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("message", DataType::Utf8, false),
    ]))
}

/// The row an `INSERT` answers with over Flight SQL: the detached job.
pub fn job_row_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("job_id", DataType::Utf8, false),
        Field::new("job_name", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
    ]))
}
