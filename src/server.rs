//! `weir serve`: an Arrow Flight SQL server over one [`Session`] that owns
//! the catalog and the jobs, for ADBC/JDBC clients.
//!
//! Statement classes (what a client sees for `execute`):
//! - a query: its rows, streamed; a query over unbounded input streams
//!   until the client cancels (the job is stopped when the stream drops);
//! - `INSERT INTO ... SELECT`: one row `(job_id, job_name, state)` at once;
//!   the job keeps running after the client leaves;
//! - DDL, `SET`: no rows.
//!
//! The SQL travels in the ticket: `GetFlightInfo` plans the statement
//! (nothing runs) to answer with its schema, `DoGet` runs it. Metadata
//! calls (`GetSqlInfo`, catalogs, schemas, tables, table types) answer from
//! the catalog; key lookups answer empty; everything else is
//! `UNIMPLEMENTED` (the trait's default), never `INTERNAL`.

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
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetExportedKeys, CommandGetImportedKeys, CommandGetPrimaryKeys,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandStatementQuery, CommandStatementUpdate,
    ProstMessageExt, SqlInfo, SqlSupportedTransaction, TicketStatementQuery,
};
use arrow_flight::{FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

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

pub struct WeirFlightSql {
    session: Arc<Mutex<Session>>,
}

impl WeirFlightSql {
    pub fn new(session: Session) -> Self {
        Self {
            session: Arc::new(Mutex::new(session)),
        }
    }

    pub fn into_service(self) -> FlightServiceServer<Self> {
        FlightServiceServer::new(self)
    }
}

/// A user's mistake (bad SQL, unknown table) is `INVALID_ARGUMENT` with the
/// message and position; a failure of ours is `INTERNAL`.
fn status(e: SessionError) -> Status {
    let msg = match e.location() {
        Some(l) => format!("{}:{}: {}", l.line, l.column, e.message()),
        None => e.message(),
    };
    match e {
        SessionError::Exec(weir_engine::ExecError::Internal(_)) => Status::internal(msg),
        _ => Status::invalid_argument(msg),
    }
}

fn flight_error(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(s) => *s,
        other => Status::internal(other.to_string()),
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
        let schema = self
            .session
            .lock()
            .await
            .result_schema(&query.query)
            .await
            .map_err(status)?;
        let ticket = TicketStatementQuery {
            statement_handle: query.query.into_bytes().into(),
        };
        let info = info_for(&schema, ticket.as_any().encode_to_vec(), request.into_inner())?;
        Ok(Response::new(info))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let sql = String::from_utf8(ticket.statement_handle.to_vec())
            .map_err(|_| Status::invalid_argument("the ticket does not hold UTF-8 SQL"))?;
        let result = {
            let mut session = self.session.lock().await;
            let mut results = session.execute_sql(&sql).await.map_err(status)?;
            results
                .pop()
                .ok_or_else(|| Status::invalid_argument("no statement in the request"))?
        };
        let stream = match result {
            StatementResult::Rows(schema, batches) => stream_batches(schema, futures::stream::iter(batches)),
            StatementResult::Explain(text) => {
                let schema = Arc::new(Schema::new(vec![arrow::datatypes::Field::new(
                    "plan",
                    arrow::datatypes::DataType::Utf8,
                    false,
                )]));
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![Arc::new(StringArray::from(vec![text])) as ArrayRef],
                )
                .map_err(|e| Status::internal(e.to_string()))?;
                stream_batches(schema, futures::stream::iter([batch]))
            }
            StatementResult::Done(_) => stream_batches(Arc::new(Schema::empty()), futures::stream::empty()),
            StatementResult::JobStarted { name, .. } => {
                let schema = job_row_schema();
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(StringArray::from(vec![name.clone()])) as ArrayRef,
                        Arc::new(StringArray::from(vec![name])),
                        Arc::new(StringArray::from(vec!["RUNNING"])),
                    ],
                )
                .map_err(|e| Status::internal(e.to_string()))?;
                stream_batches(schema, futures::stream::iter([batch]))
            }
            StatementResult::Stream(rs) => {
                let guard = StopOnDrop(rs.job.stopper());
                let rows = rs.rows;
                let batches = futures::stream::unfold((rows, guard), |(mut rows, guard)| async move {
                    rows.recv().await.map(|b| (b, (rows, guard)))
                });
                stream_batches(rs.schema, batches)
            }
        };
        Ok(Response::new(stream))
    }

    async fn do_put_statement_update(
        &self,
        ticket: CommandStatementUpdate,
        _request: Request<arrow_flight::sql::server::PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        self.session
            .lock()
            .await
            .execute_sql(&ticket.query)
            .await
            .map_err(status)?;
        // Streaming statements have no affected-row count.
        Ok(-1)
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(sql_info()?).schema();
        Ok(Response::new(info_for(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
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
        Ok(Response::new(info_for(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
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
        Ok(Response::new(info_for(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
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
        Ok(Response::new(info_for(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let entries = self.session.lock().await.catalog_entries();
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
        Ok(Response::new(info_for(
            &schema,
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
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
        Ok(Response::new(info_for(
            &keys_schema(),
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
    }

    async fn do_get_primary_keys(
        &self,
        _query: CommandGetPrimaryKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Ok(Response::new(stream_batches(keys_schema(), futures::stream::empty())))
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Ok(Response::new(info_for(
            &keys_schema(),
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Ok(Response::new(stream_batches(keys_schema(), futures::stream::empty())))
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Ok(Response::new(info_for(
            &keys_schema(),
            query.as_any().encode_to_vec(),
            request.into_inner(),
        )?))
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Ok(Response::new(stream_batches(keys_schema(), futures::stream::empty())))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
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

/// Serves Flight SQL on `listen` until ctrl-c / SIGTERM; then stops every
/// job (each takes its final checkpoint) and returns.
pub async fn serve(listen: SocketAddr, session: Session) -> Result<(), String> {
    let service = WeirFlightSql::new(session);
    let session = service.session.clone();
    eprintln!("[INFO] Flight SQL on grpc://{listen}");
    tonic::transport::Server::builder()
        .add_service(service.into_service())
        .serve_with_shutdown(listen, async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async {
                    match term.as_mut() {
                        Some(t) => { t.recv().await; }
                        None => std::future::pending::<()>().await,
                    }
                } => {}
            }
        })
        .await
        .map_err(|e| format!("cannot serve on {listen}: {e}"))?;
    let mut session = session.lock().await;
    for job in session.take_jobs() {
        job.stop();
        if let Err(e) = job.wait().await {
            eprintln!("warning: a job ended with an error on shutdown: {e}");
        }
    }
    Ok(())
}
