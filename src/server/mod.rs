//! `weir serve`: an Arrow Flight SQL server for ADBC/JDBC clients. Each
//! client connection has a [`Session`] of its own (its `SET` options, its
//! user) over the catalog and jobs all sessions share, so connections run
//! statements concurrently.
//!
//! Statement classes (what a client sees for `execute`):
//! - a query: its rows, streamed; a query over unbounded input streams
//!   until the client cancels (the job is stopped when the stream drops);
//! - `INSERT INTO ... SELECT`: one row `(job_id, job_name, state)` at once;
//!   the job keeps running after the client leaves;
//! - DDL, `SET`: no rows.
//!
//! Statements with effects (DDL, `SET`, `INSERT`, job control) run when the
//! client submits them (`GetFlightInfo`, `DoPut`), exactly once, whether or
//! not the client ever reads the result: drivers fetch results in the
//! background and may close a reader unread when the next statement
//! starts. Their result waits in a table for the `DoGet` of its ticket.
//! Queries stay lazy: `GetFlightInfo` plans (nothing runs) to answer with
//! the schema, the SQL travels in the ticket and `DoGet` runs it. Prepared
//! statements are planned at prepare (result schema, nothing runs), take
//! parameters by `DoPut`, and hand out the bound SQL in the same kind of
//! ticket. Metadata calls (`GetSqlInfo`, catalogs, schemas, tables, table
//! types) answer from the catalog; key lookups answer empty; everything
//! else is `UNIMPLEMENTED`, never `INTERNAL`.
//!
//! A live query is decoupled from its client by a bounded queue: a client
//! that does not keep up is dropped with `RESOURCE_EXHAUSTED` instead of
//! stalling the job, and the job stops when its client goes away.

mod auth;
mod limits;
pub mod metrics;
mod params;
mod results;

pub use auth::{Auth, User, load_users};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, StringArray};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::FlightSqlService;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult,
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetExportedKeys, CommandGetImportedKeys, CommandGetPrimaryKeys,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementQuery, CommandStatementUpdate, DoPutPreparedStatementResult,
    ProstMessageExt, SqlInfo, SqlSupportedTransaction, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tokio::sync::{Mutex, Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};

use crate::access::{Principal, Role};
use crate::session::{Session, SessionError, StatementResult, job_row_schema};

/// Catalog and schema every table is listed under.
pub const CATALOG: &str = "weir";
pub const SCHEMA: &str = "default";

/// `None` only if the builder rejected our own constant table (a bug,
/// answered as INTERNAL rather than a panic).
static SQL_INFO: LazyLock<Option<SqlInfoData>> = LazyLock::new(|| {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "Weir");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
    b.append(SqlInfo::FlightSqlServerReadOnly, false);
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::SqlIdentifierQuoteChar, "`");
    b.append(SqlInfo::SqlIdentifierCase, 3_i32); // case sensitive
    b.build().ok()
});

fn sql_info() -> Result<&'static SqlInfoData, Status> {
    SQL_INFO
        .as_ref()
        .ok_or_else(|| Status::internal("the server's SqlInfo table is invalid"))
}

/// One batch, built by a Flight SQL metadata builder, as a DoGet answer.
fn single_batch<E: std::fmt::Display>(
    schema: SchemaRef,
    batch: Result<RecordBatch, E>,
) -> Result<Response<DoGetStream>, Status> {
    let batch = batch.map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(stream_batches(schema, futures::stream::iter([batch]))))
}

type DoGetStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send + 'static>>;

/// How `weir serve` runs: where, who may connect, and its limits.
#[derive(Clone)]
pub struct ServerOptions {
    pub listen: SocketAddr,
    pub auth: Auth,
    /// TLS certificate chain and private key (PEM files).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub metrics_listen: Option<SocketAddr>,
    /// Connections open at once; more are refused.
    pub max_connections: usize,
    /// Result streams (DoGet) open at once; more answer RESOURCE_EXHAUSTED.
    pub max_streams: usize,
    /// Largest message a client may send (bytes).
    pub max_request_bytes: usize,
    /// Result batches queued for a live query's client; when full, the
    /// query waits for the client (back-pressure) ...
    pub subscriber_queue: usize,
    /// ... up to this long: a client that reads nothing for this long is
    /// dropped as stalled rather than holding the query.
    pub subscriber_timeout: std::time::Duration,
    /// Prepared statements open at once (all clients).
    pub max_prepared: usize,
}

impl ServerOptions {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            auth: Auth::new(vec![]),
            tls: None,
            metrics_listen: None,
            max_connections: 1024,
            max_streams: 512,
            max_request_bytes: 16 << 20,
            subscriber_queue: 64,
            subscriber_timeout: std::time::Duration::from_secs(30),
            max_prepared: 10_000,
        }
    }
}

/// A prepared statement: its text with placeholders, and the parameters
/// last bound to it.
struct Prepared {
    template: params::Template,
    params: Option<RecordBatch>,
    last_used: std::time::Instant,
}

/// A prepared statement unused this long may be forgotten when the table
/// of prepared statements is full (its client crashed without closing).
const PREPARED_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

pub struct WeirFlightSql {
    /// The session new connections' sessions are forked from (never runs a
    /// statement itself).
    base: std::sync::Mutex<Session>,
    options: ServerOptions,
    prepared: std::sync::Mutex<HashMap<Vec<u8>, Prepared>>,
    streams: Arc<Semaphore>,
    /// Set when the server shuts down: live queries end.
    shutdown: Arc<tokio::sync::watch::Sender<bool>>,
    /// Each connection's session.
    sessions: limits::ConnectionSessions,
    /// Results of statements run at submission, until their DoGet.
    results: results::Results,
    pub stats: Arc<metrics::ServerStats>,
}

impl WeirFlightSql {
    pub fn new(session: Session, options: ServerOptions) -> Self {
        Self {
            base: std::sync::Mutex::new(session),
            streams: Arc::new(Semaphore::new(options.max_streams)),
            stats: Arc::new(metrics::ServerStats::new(options.max_streams, options.max_connections)),
            options,
            prepared: Default::default(),
            shutdown: Arc::new(tokio::sync::watch::Sender::new(false)),
            sessions: Default::default(),
            results: Default::default(),
        }
    }

    pub fn into_service(self) -> FlightServiceServer<Self> {
        let max = self.options.max_request_bytes;
        FlightServiceServer::new(self).max_decoding_message_size(max)
    }

    fn prepared<T>(&self, handle: &[u8], f: impl FnOnce(&mut Prepared) -> T) -> Result<T, Status> {
        let mut all = self
            .prepared
            .lock()
            .map_err(|_| Status::internal("prepared statements lock poisoned"))?;
        let p = all.get_mut(handle).ok_or_else(|| {
            Status::not_found("unknown prepared statement handle (closed, or from before a server restart)")
        })?;
        p.last_used = std::time::Instant::now();
        Ok(f(p))
    }

    /// The SQL of a prepared statement with its parameters bound (one
    /// statement per parameter row).
    fn bound_sql(&self, handle: &[u8]) -> Result<Vec<String>, Status> {
        self.prepared(handle, |p| {
            if p.template.param_count == 0 {
                return Ok(vec![p.template.with_nulls()]);
            }
            let Some(params) = &p.params else {
                return Err(Status::invalid_argument(format!(
                    "the statement has {} parameter(s) and none are bound (DoPut them first)",
                    p.template.param_count
                )));
            };
            (0..params.num_rows())
                .map(|row| p.template.bind(params, row).map_err(Status::invalid_argument))
                .collect()
        })?
    }

    /// A new session over the shared catalog and jobs.
    fn fork(&self, principal: Principal) -> Session {
        self.base.lock().unwrap_or_else(|e| e.into_inner()).fork(principal)
    }

    /// The session of connection `conn` (created at its first statement).
    fn session_for(&self, conn: Option<u64>) -> Arc<Mutex<Session>> {
        let fresh = || Arc::new(Mutex::new(self.fork(Principal::local())));
        let Some(conn) = conn else {
            // No connection info (a service not behind our listener).
            return fresh();
        };
        let mut all = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        match all.get_mut(&conn) {
            Some(slot) => slot.get_or_insert_with(fresh).clone(),
            // The connection closed while this request was on its way: a
            // session of its own, forgotten with the request.
            None => fresh(),
        }
    }

    /// Runs `f` on the session of the request's connection, as the
    /// request's user. Statements of one connection run one at a time;
    /// different connections run concurrently.
    async fn in_session<R>(&self, caller: &Caller, f: impl AsyncFnOnce(&mut Session) -> R) -> R {
        let session = self.session_for(caller.conn);
        let mut session = session.lock().await;
        session.set_principal(caller.principal.clone());
        f(&mut session).await
    }

    /// Who sent `request`, on which connection. Without a principal from
    /// the interceptor (none installed) a password-protected server trusts
    /// nobody: the caller may only read.
    fn caller<T>(&self, request: &Request<T>) -> Caller {
        let principal = request.extensions().get::<Principal>().cloned().unwrap_or_else(|| {
            if self.options.auth.enabled() {
                Principal {
                    user: "anonymous".into(),
                    role: Role::Read,
                }
            } else {
                Principal::local()
            }
        });
        Caller {
            conn: conn_id(request),
            principal,
        }
    }

    /// `GetFlightInfo` of a statement: a query is planned (nothing runs)
    /// and its SQL is the ticket; anything with effects runs now and its
    /// result waits for the ticket's `DoGet`.
    async fn submit(&self, sql: String, caller: &Caller, descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
        if sql.len() > self.options.max_request_bytes {
            return Err(too_long(sql.len(), self.options.max_request_bytes));
        }
        let stmts = weir_sql::parse(&sql).map_err(|e| status(e.into()))?;
        let [only] = stmts.as_slice() else {
            return Err(Status::invalid_argument(format!(
                "expected one statement, found {} (send them one at a time)",
                stmts.len()
            )));
        };
        if crate::access::is_read_only(&only.statement) {
            let schema = self
                .in_session(caller, async |s| s.result_schema(&sql).await)
                .await
                .map_err(status)?;
            let ticket = TicketStatementQuery {
                statement_handle: sql.into_bytes().into(),
            };
            return info_for(&schema, ticket.as_any().encode_to_vec(), descriptor);
        }
        let result = self.execute(&sql, caller).await?;
        let schema = results::schema_of(&result);
        let handle = self.results.keep(result)?;
        let ticket = TicketStatementQuery {
            statement_handle: handle.into(),
        };
        info_for(&schema, ticket.as_any().encode_to_vec(), descriptor)
    }

    /// Runs `sql` and streams its result; a live query goes through the
    /// client's bounded queue.
    async fn run_statement(&self, handle: &[u8], caller: &Caller) -> Result<DoGetStream, Status> {
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{} result streams are open (the server's --max-streams); close one and retry",
                self.options.max_streams
            ))
        })?;
        let result = match self.results.take(handle) {
            Some(result) => result?,
            None => {
                let sql = String::from_utf8(handle.to_vec())
                    .map_err(|_| Status::invalid_argument("the ticket does not hold UTF-8 SQL"))?;
                self.execute(&sql, caller).await?
            }
        };
        let stream = match result {
            StatementResult::Stream(rs) => self.subscribe(rs),
            other => answer(other)?,
        };
        // The permit is held as long as the client reads the stream.
        Ok(Box::pin(stream.map(move |item| {
            let _held = &permit;
            item
        })))
    }

    /// Runs `sql` and returns its (last) result. A live query that is not
    /// the last statement is stopped (nobody reads it).
    async fn execute(&self, sql: &str, caller: &Caller) -> Result<StatementResult, Status> {
        if sql.len() > self.options.max_request_bytes {
            return Err(too_long(sql.len(), self.options.max_request_bytes));
        }
        let mut results = self
            .in_session(caller, async |s| s.execute_sql(sql).await)
            .await
            .map_err(status)?;
        let last = results
            .pop()
            .ok_or_else(|| Status::invalid_argument("no statement in the request"))?;
        results.into_iter().for_each(discard);
        Ok(last)
    }

    /// A live query's batches through a queue of `subscriber_queue`
    /// batches: the job never waits for the client; a client that lets
    /// the queue fill is dropped with RESOURCE_EXHAUSTED (and the job
    /// stops, as it does when the client cancels).
    fn subscribe(&self, rs: crate::session::ResultStream) -> DoGetStream {
        let capacity = self.options.subscriber_queue.max(1);
        let patience = self.options.subscriber_timeout;
        let (queue, pending) = mpsc::channel::<RecordBatch>(capacity);
        // Why the stream ends, and whether at once (the client is dropped)
        // or after the rows already queued (the query failed).
        let dropped: Arc<std::sync::Mutex<Option<(Status, bool)>>> = Arc::default();
        self.stats.add_subscriber(queue.downgrade());
        let guard = StopOnDrop(rs.job.stopper());
        let (mut rows, job, schema) = (rs.rows, rs.job, rs.schema);
        // A bounded updating query's final table: its changes are applied
        // here and the table is sent only once the job has ended well (a
        // failed job sends its error, never a partial table).
        let mut table = match rs.final_table {
            true => match crate::final_table::FinalTable::new(schema.clone()) {
                Ok(t) => Some(Ok(t)),
                Err(e) => Some(Err(e)),
            },
            false => None,
        };
        let verdict = dropped.clone();
        let mut shutdown = self.shutdown.subscribe();
        tokio::spawn(async move {
            let mut why = None;
            let closing = || Some(Status::unavailable("the server is shutting down"));
            let slow = || {
                Some(Status::resource_exhausted(format!(
                    "slow subscriber: {capacity} result batches waited {patience:?} to be read, \
                     so the subscription was dropped rather than stall the query; read batches \
                     as they come (never fetchall() on a live query)"
                )))
            };
            if let Some(Err(e)) = &table {
                why = Some(Status::internal(format!("cannot keep the query's final table: {e}")));
            }
            loop {
                if why.is_some() {
                    break;
                }
                // (The watch's guard must not live across an await.)
                let batch = tokio::select! {
                    b = rows.recv() => b,
                    _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => { why = closing(); break; }
                };
                let Some(batch) = batch else { break };
                if let Some(Ok(t)) = table.as_mut() {
                    // The changes come with their `_op` first.
                    if let Err(e) = crate::display::changes_of(&batch).and_then(|c| t.apply(&c)) {
                        why = Some(Status::internal(format!("cannot keep the query's final table: {e}")));
                    }
                    continue;
                }
                // A full queue back-pressures the query, for a while.
                let sent = tokio::select! {
                    r = tokio::time::timeout(patience, queue.send(batch)) => r,
                    _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => { why = closing(); break; }
                };
                match sent {
                    Ok(Ok(())) => {}
                    // The client is gone.
                    Ok(Err(_)) => break,
                    Err(_) => {
                        why = slow();
                        break;
                    }
                }
            }
            // Ended, dropped, or the client left: the job goes now, and a
            // failure of the query is what the client hears.
            job.stop();
            drop(rows);
            let mut at_once = why.is_some();
            match job.wait().await {
                Err(e) if why.is_none() => {
                    why = Some(Status::aborted(format!("the query failed: {e}")));
                    at_once = false;
                }
                // Ended well: now the final table.
                Ok(_) if why.is_none() => {
                    if let Some(Ok(t)) = table.take() {
                        match t.finish() {
                            Ok(batches) => {
                                for b in batches {
                                    match tokio::time::timeout(patience, queue.send(b)).await {
                                        Ok(Ok(())) => {}
                                        Ok(Err(_)) => break,
                                        Err(_) => {
                                            why = slow();
                                            at_once = true;
                                            break;
                                        }
                                    }
                                }
                            }
                            Err(e) => {
                                why = Some(Status::internal(format!("cannot send the query's final table: {e}")));
                                at_once = false;
                            }
                        }
                    }
                }
                _ => {}
            }
            if let (Some(s), Ok(mut d)) = (why, verdict.lock()) {
                *d = Some((s, at_once));
            }
            // Only now: the client reads the verdict after the last batch.
            drop(queue);
        });
        // The job is stopped when this stream is dropped (client gone).
        let state = Some((pending, guard, dropped));
        let batches = futures::stream::unfold(state, |st| async move {
            let (mut pending, guard, dropped) = st?;
            let verdict = |d: &std::sync::Mutex<Option<(Status, bool)>>, now: bool| {
                let mut d = d.lock().ok()?;
                match d.as_ref() {
                    Some((_, at_once)) if *at_once || !now => d.take().map(|(s, _)| s),
                    _ => None,
                }
            };
            if let Some(s) = verdict(&dropped, true) {
                return Some((Err(s), None));
            }
            match pending.recv().await {
                Some(b) => Some((Ok(b), Some((pending, guard, dropped)))),
                None => verdict(&dropped, false).map(|s| (Err(s), None)),
            }
        });
        encode_results(schema, batches)
    }
}

/// Who sent a request, and on which connection.
struct Caller {
    conn: Option<u64>,
    principal: Principal,
}

fn too_long(len: usize, max: usize) -> Status {
    Status::invalid_argument(format!(
        "the statement is {len} bytes; at most {max} (--max-request-bytes)"
    ))
}

/// The id of the connection a request came on.
fn conn_id<T>(request: &Request<T>) -> Option<u64> {
    limits::ConnInfo::of(request).map(|c| c.id)
}

/// A result nobody will read: a live query's job is stopped.
fn discard(result: StatementResult) {
    if let StatementResult::Stream(rs) = result {
        rs.job.stop();
    }
}

/// A user's mistake (bad SQL) is `INVALID_ARGUMENT` with the message and
/// position; a missing table, view or job `NOT_FOUND`; SQL Weir cannot run
/// is `UNIMPLEMENTED`; a failure
/// while running (a file, a connector) is `FAILED_PRECONDITION`; a bug of
/// ours is `INTERNAL`.
fn status(e: SessionError) -> Status {
    use weir_sql::error::ErrorKind;
    let msg = match e.location() {
        Some(l) => format!("{}:{}: {}", l.line, l.column, e.message()),
        None => e.message(),
    };
    let kind = match e {
        SessionError::Sql(s) => s.kind,
        SessionError::Exec(x) => weir_sql::SqlError::from(x).kind,
        SessionError::Catalog(c) => weir_sql::SqlError::from(c).kind,
    };
    match kind {
        ErrorKind::Parse | ErrorKind::Plan | ErrorKind::Catalog => Status::invalid_argument(msg),
        ErrorKind::NotFound => Status::not_found(msg),
        ErrorKind::PermissionDenied => Status::permission_denied(msg),
        ErrorKind::Unsupported => Status::unimplemented(msg),
        ErrorKind::Runtime => Status::failed_precondition(msg),
        ErrorKind::Internal => Status::internal(msg),
    }
}

fn flight_error(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(s) => *s,
        other => Status::internal(other.to_string()),
    }
}

/// Streams `batches` (of `schema`) as Flight data; an error ends the
/// stream with its status.
fn encode_results(
    schema: SchemaRef,
    batches: impl Stream<Item = Result<RecordBatch, Status>> + Send + 'static,
) -> DoGetStream {
    Box::pin(
        FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches.map_err(|s| FlightError::Tonic(Box::new(s))))
            .map_err(flight_error),
    )
}

/// The rows of a statement that is not a live query.
fn answer(result: StatementResult) -> Result<DoGetStream, Status> {
    let one = |schema: SchemaRef, columns: Vec<ArrayRef>| {
        let batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| Status::internal(e.to_string()))?;
        Ok(stream_batches(schema, futures::stream::iter([batch])))
    };
    match result {
        StatementResult::Rows(schema, batches) => Ok(stream_batches(schema, futures::stream::iter(batches))),
        StatementResult::Explain(text) => one(
            Arc::new(Schema::new(vec![arrow::datatypes::Field::new(
                "plan",
                arrow::datatypes::DataType::Utf8,
                false,
            )])),
            vec![Arc::new(StringArray::from(vec![text]))],
        ),
        StatementResult::Done(_) => Ok(stream_batches(Arc::new(Schema::empty()), futures::stream::empty())),
        StatementResult::JobStarted { id, name, state, .. } => one(
            job_row_schema(),
            vec![
                Arc::new(StringArray::from(vec![id])),
                Arc::new(StringArray::from(vec![name])),
                Arc::new(StringArray::from(vec![state])),
            ],
        ),
        StatementResult::JobEnded {
            id,
            name,
            state,
            message,
        } => one(
            crate::session::job_end_schema(),
            vec![
                Arc::new(StringArray::from(vec![id])),
                Arc::new(StringArray::from(vec![name])),
                Arc::new(StringArray::from(vec![state])),
                Arc::new(StringArray::from(vec![message])),
            ],
        ),
        StatementResult::Stream(_) => Err(Status::internal("a live query reached the one-shot answer path")),
    }
}

/// A schema as the IPC message prepared-statement results carry.
fn ipc_schema(schema: &Schema) -> Result<prost::bytes::Bytes, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &arrow::ipc::writer::IpcWriteOptions::default())
        .try_into()
        .map_err(|e: arrow::error::ArrowError| Status::internal(format!("encoding a schema: {e}")))?;
    Ok(bytes)
}

/// The parameters a client sent with DoPut: all its batches as one (no
/// columns when it sent none: arrow-rs's client sends only the command).
async fn parameter_batch(mut stream: PeekableFlightDataStream, max_bytes: usize) -> Result<RecordBatch, Status> {
    let mut messages: Vec<FlightData> = vec![];
    let mut bytes = 0;
    while let Some(m) = stream.try_next().await? {
        bytes += m.data_header.len() + m.data_body.len();
        if bytes > max_bytes {
            return Err(Status::invalid_argument(format!(
                "the parameters are over {max_bytes} bytes (--max-request-bytes)"
            )));
        }
        messages.push(m);
    }
    // arrow-ipc panics on some malformed messages: each is checked first.
    let mut check = params::ParameterStreamCheck::default();
    for m in &messages {
        check
            .check(&m.data_header, &m.data_body)
            .map_err(|e| Status::invalid_argument(format!("the parameters are not a valid Arrow stream: {e}")))?;
    }
    let messages = messages.into_iter().filter(|m| !m.data_header.is_empty());
    let batches: Vec<RecordBatch> =
        arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(futures::stream::iter(messages.map(Ok)))
            .try_collect()
            .await
            .map_err(|e| Status::invalid_argument(format!("the parameters are not a valid Arrow stream: {e}")))?;
    match batches.first() {
        None => Ok(RecordBatch::new_empty(Arc::new(Schema::empty()))),
        Some(first) => arrow::compute::concat_batches(&first.schema(), &batches)
            .map_err(|e| Status::invalid_argument(format!("parameter batches differ: {e}"))),
    }
}

/// Streams `batches` (of `schema`) as Flight data.
fn stream_batches(schema: SchemaRef, batches: impl Stream<Item = RecordBatch> + Send + 'static) -> DoGetStream {
    Box::pin(
        FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches.map(Ok))
            .map_err(flight_error),
    )
}

fn info_for(schema: &Schema, ticket: Vec<u8>, descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
    Ok(FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(format!("encoding the schema: {e}")))?
        .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
        .with_descriptor(descriptor))
}

/// Stops a streaming query's job when the client's stream is dropped
/// (cancelled, disconnected, or done).
struct StopOnDrop(weir_engine::runtime::job::JobStopper);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

#[tonic::async_trait]
impl FlightSqlService for WeirFlightSql {
    type FlightService = WeirFlightSql;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let caller = self.caller(&request);
        let info = self.submit(query.query, &caller, request.into_inner()).await?;
        Ok(Response::new(info))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let caller = self.caller(&request);
        Ok(Response::new(
            self.run_statement(&ticket.statement_handle, &caller).await?,
        ))
    }

    async fn do_put_statement_update(
        &self,
        ticket: CommandStatementUpdate,
        request: Request<arrow_flight::sql::server::PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let caller = self.caller(&request);
        discard(self.execute(&ticket.query, &caller).await?);
        // Streaming statements have no affected-row count.
        Ok(-1)
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let template = params::Template::parse(&query.query).map_err(Status::invalid_argument)?;
        // Planned with every parameter NULL: the result's columns, and
        // any error in the statement, are known now; nothing runs.
        let sql = template.with_nulls();
        let numbered = template.numbered();
        let caller = self.caller(&request);
        let (schema, types) = self
            .in_session(&caller, async |s| {
                let schema = s.result_schema(&sql).await?;
                // What the planner can tell from the context (`price > $1`
                // is a BIGINT); NULL where it cannot (`SELECT $1`).
                Ok::<_, SessionError>((schema, s.parameter_types(&numbered)))
            })
            .await
            .map_err(status)?;
        let parameter_schema = Schema::new(
            (1..=template.param_count)
                .map(|i| {
                    let name = format!("${i}");
                    let t = types
                        .get(&name)
                        .filter(|t| params::bindable(t))
                        .cloned()
                        .unwrap_or(arrow::datatypes::DataType::Null);
                    arrow::datatypes::Field::new(name, t, true)
                })
                .collect::<Vec<_>>(),
        );
        let handle = auth::secret_token()?.into_bytes();
        {
            let mut all = self
                .prepared
                .lock()
                .map_err(|_| Status::internal("prepared statements lock poisoned"))?;
            if all.len() >= self.options.max_prepared {
                all.retain(|_, p| p.last_used.elapsed() < PREPARED_IDLE);
            }
            if all.len() >= self.options.max_prepared {
                return Err(Status::resource_exhausted(format!(
                    "{} prepared statements are open; close some (ClosePreparedStatement)",
                    all.len()
                )));
            }
            all.insert(
                handle.clone(),
                Prepared {
                    template,
                    params: None,
                    last_used: std::time::Instant::now(),
                },
            );
        }
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema: ipc_schema(&schema)?,
            parameter_schema: ipc_schema(&parameter_schema)?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        // Closing an unknown handle is not an error: clients close on
        // every path, including after a server restart.
        if let Ok(mut all) = self.prepared.lock() {
            all.remove(query.prepared_statement_handle.as_ref());
        }
        Ok(())
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let params = parameter_batch(request.into_inner(), self.options.max_request_bytes).await?;
        let handle = query.prepared_statement_handle.to_vec();
        self.prepared(&handle, |p| {
            if params.num_rows() > 1 {
                return Err(Status::invalid_argument(format!(
                    "a query takes one row of parameters; {} were bound",
                    params.num_rows()
                )));
            }
            if let Some(row) = (params.num_rows() == 1).then_some(0) {
                // Checked now so a bad value is reported by the bind.
                p.template.bind(&params, row).map_err(Status::invalid_argument)?;
            }
            p.params = Some(params);
            Ok(())
        })??;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle.into()),
        })
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let mut sql = self.bound_sql(&cmd.prepared_statement_handle)?;
        let sql = match sql.len() {
            1 => sql.remove(0),
            n => {
                return Err(Status::invalid_argument(format!(
                    "a query takes one row of parameters; {n} are bound"
                )));
            }
        };
        let caller = self.caller(&request);
        let info = self.submit(sql, &caller, request.into_inner()).await?;
        Ok(Response::new(info))
    }

    async fn do_put_prepared_statement_update(
        &self,
        cmd: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let handle = cmd.prepared_statement_handle.to_vec();
        let caller = self.caller(&request);
        let params = parameter_batch(request.into_inner(), self.options.max_request_bytes).await?;
        if params.num_columns() > 0 || params.num_rows() > 0 {
            self.prepared(&handle, |p| p.params = Some(params))?;
        }
        for sql in &self.bound_sql(&handle)? {
            discard(self.execute(sql, &caller).await?);
        }
        // Streaming statements have no affected-row count.
        Ok(-1)
    }

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>, Status> {
        let token = self.options.auth.handshake(request.metadata())?;
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().unwrap_or_default().into_bytes().into(),
        };
        let stream: Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>> =
            Box::pin(futures::stream::iter([Ok(reply)]));
        let mut response = Response::new(stream);
        if let Some(t) = token {
            let value = format!("Bearer {t}")
                .parse()
                .map_err(|_| Status::internal("token is not a header value"))?;
            response.metadata_mut().insert("authorization", value);
        }
        Ok(response)
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        let action = &request.get_ref().r#type;
        if action == "CloseSession" {
            // A session is the connection; nothing to release. The answer
            // is `CloseSessionResult { status: CLOSED }` (field 1 = 1).
            let result = arrow_flight::Result {
                body: vec![0x08, 0x01].into(),
            };
            return Ok(Response::new(Box::pin(futures::stream::iter([Ok(result)]))));
        }
        Err(Status::unimplemented(format!("action '{action}' is not supported")))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(sql_info()?).schema();
        command_info(&schema, query, request)
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let builder = query.into_builder(sql_info()?);
        let schema = builder.schema();
        single_batch(schema, builder.build())
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        command_info(&schema, query, request)
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG);
        let schema = builder.schema();
        single_batch(schema, builder.build())
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        command_info(&schema, query, request)
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG, SCHEMA);
        let schema = builder.schema();
        single_batch(schema, builder.build())
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        command_info(&schema, query, request)
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let entries = self.fork(Principal::local()).catalog_entries();
        // The builder applies the client's catalog/schema/table/type filters.
        let mut builder = query.into_builder();
        for (name, kind, columns) in entries {
            builder
                .append(CATALOG, SCHEMA, name, kind, &columns)
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        let schema = builder.schema();
        single_batch(schema, builder.build())
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = table_types_schema();
        command_info(&schema, query, request)
    }

    async fn do_get_table_types(
        &self,
        _query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let schema = table_types_schema();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec!["TABLE", "VIEW"])) as ArrayRef],
        )
        .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(stream_batches(schema, futures::stream::iter([batch]))))
    }

    // No keys exist: empty answers, not errors (clients ask routinely).
    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&keys_schema(), query, request)
    }

    async fn do_get_primary_keys(
        &self,
        _query: CommandGetPrimaryKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        no_keys()
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&keys_schema(), query, request)
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        no_keys()
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&keys_schema(), query, request)
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        no_keys()
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// A metadata command's FlightInfo: its fixed schema, the command itself
/// as the ticket.
fn command_info(
    schema: &Schema,
    command: impl ProstMessageExt,
    request: Request<FlightDescriptor>,
) -> Result<Response<FlightInfo>, Status> {
    Ok(Response::new(info_for(
        schema,
        command.as_any().encode_to_vec(),
        request.into_inner(),
    )?))
}

/// Weir has no keys: an empty answer, not an error (clients ask routinely).
fn no_keys() -> Result<Response<DoGetStream>, Status> {
    Ok(Response::new(stream_batches(keys_schema(), futures::stream::empty())))
}

fn table_types_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![arrow::datatypes::Field::new(
        "table_type",
        arrow::datatypes::DataType::Utf8,
        false,
    )]))
}

/// Flight SQL's key-listing schema (primary, exported, imported keys).
fn keys_schema() -> SchemaRef {
    use arrow::datatypes::{DataType, Field};
    Arc::new(Schema::new(vec![
        Field::new("pk_catalog_name", DataType::Utf8, true),
        Field::new("pk_db_schema_name", DataType::Utf8, true),
        Field::new("pk_table_name", DataType::Utf8, false),
        Field::new("pk_column_name", DataType::Utf8, false),
        Field::new("fk_catalog_name", DataType::Utf8, true),
        Field::new("fk_db_schema_name", DataType::Utf8, true),
        Field::new("fk_table_name", DataType::Utf8, false),
        Field::new("fk_column_name", DataType::Utf8, false),
        Field::new("key_sequence", DataType::Int32, false),
        Field::new("fk_key_name", DataType::Utf8, true),
        Field::new("pk_key_name", DataType::Utf8, true),
        Field::new("update_rule", DataType::UInt8, false),
        Field::new("delete_rule", DataType::UInt8, false),
    ]))
}

/// Ctrl-C or SIGTERM.
/// How long a shutdown waits for clients to finish their requests.
const DRAIN_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a shutdown waits for each job's last checkpoint.
const SUSPEND_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// Serves Flight SQL on `listener` until `stop` completes: first
/// resubmits the jobs a previous server left running; on shutdown
/// suspends every job (each takes a checkpoint and ends; the next server
/// resumes it from there). Signals and the process's exit are the
/// caller's (the binary passes [`crate::shell::shutdown_signal`]; a test
/// runs a server in its own process and stops it with a channel).
pub async fn serve(
    listener: tokio::net::TcpListener,
    options: ServerOptions,
    mut session: Session,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    session.keep_job_registry()?;
    // A database client reading a bounded GROUP BY wants its table.
    session.answer_final_tables();
    for (name, result) in session.resume_jobs().await {
        match result {
            Ok(StatementResult::JobStarted {
                resumed_from: Some((id, path)),
                ..
            }) => eprintln!("[INFO] job '{name}' resumed from checkpoint {id} ({path})"),
            Ok(_) => eprintln!("[INFO] job '{name}' started again"),
            Err(e) => eprintln!("[ERROR] job '{name}' could not be started again: {e}"),
        }
    }
    let listen = options.listen;
    // Owns nothing but reaches the shared jobs: suspends them at the end.
    let mut control = session.fork(Principal::local());
    let service = WeirFlightSql::new(session, options.clone());
    if let Some(addr) = options.metrics_listen {
        let jobs = control.jobs_view();
        metrics::serve(addr, jobs, service.stats.clone(), service.streams.clone()).await?;
    }
    let auth = options.auth.clone();
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(256))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)));
    if let Some((cert, key)) = &options.tls {
        weir_engine::exchange::tls::install_crypto_provider();
        let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
        builder = builder
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(identity)
                    .timeout(std::time::Duration::from_secs(10)),
            )
            .map_err(|e| format!("TLS: {e}"))?;
    }
    let scheme = if options.tls.is_some() { "grpc+tls" } else { "grpc" };
    // The bound address (`--listen 127.0.0.1:0` lets the system pick the
    // port; scripts and tests read it from this line).
    let listen = listener.local_addr().unwrap_or(listen);
    eprintln!(
        "[INFO] Flight SQL on {scheme}://{listen}{}",
        if auth.enabled() { " (password required)" } else { "" }
    );
    let connections = service.stats.connections.clone();
    let sessions = service.sessions.clone();
    let shutdown = service.shutdown.clone();
    let service = tonic::service::interceptor::InterceptedService::new(service.into_service(), move |r| auth.check(r));
    let mut closing = shutdown.subscribe();
    let serving = builder.add_service(service).serve_with_incoming_shutdown(
        limits::incoming(listener, connections, options.max_connections, sessions),
        async move {
            stop.await;
            eprintln!("[INFO] shutting down: live queries end, jobs are suspended at a checkpoint");
            // Live queries end now, or the server would wait for their
            // clients to hang up.
            shutdown.send_replace(true);
        },
    );
    // Clients get DRAIN_WITHIN to finish (one that stopped reading may
    // never); then the jobs are suspended regardless.
    tokio::select! {
        r = serving => r.map_err(|e| format!("cannot serve on {listen}: {e}"))?,
        _ = async {
            let _ = closing.wait_for(|s| *s).await;
            tokio::time::sleep(DRAIN_WITHIN).await;
        } => eprintln!("[WARN] clients still connected after {DRAIN_WITHIN:?}; closing their connections"),
    }
    // Each job checkpoints and ends; the next server resumes it.
    let jobs = control.take_jobs();
    let suspended = futures::future::join_all(jobs.into_iter().map(|j| j.suspend(SUSPEND_WITHIN))).await;
    for e in suspended.into_iter().filter_map(Result::err) {
        eprintln!("warning: a job ended with an error on shutdown: {e}");
    }
    Ok(())
}
