//! Remote mode: `weir --url grpc://host:port` runs the REPL (or `-c`, a
//! script on stdin, `weir run FILE`) against a `weir serve` over Flight
//! SQL. Statements are split here (so a syntax error is reported without a
//! round trip) and sent one by one; results print as Flink's tableau as
//! they arrive, or, for an updating query in the interactive shell (or
//! with `sql-client.execution.result-mode` = `table`), as a table updated
//! in place, as the local shell shows them; Ctrl-C cancels a live query
//! (the server stops it).
//! Jobs started by `INSERT` are detached: they keep running on the server.

use std::io::Write;

use arrow::datatypes::Schema;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use tonic::transport::{Channel, Endpoint};

use crate::display::Tableau;
use crate::shell::{EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, Signals};

pub struct Remote {
    client: FlightSqlServiceClient<Channel>,
    pub url: String,
    /// `sql-client.execution.result-mode` as this shell last set it (the
    /// server checks the value; the shell shows results by it).
    result_mode: Option<String>,
    /// The server session's `table.local-time-zone`, as this shell set it:
    /// TIMESTAMP_LTZ values are shown in it (Flink's SQL client does).
    zone: Option<weir_engine::time_zone::SessionZone>,
}

/// Why a statement failed: the server's message, or a connection problem.
#[derive(Debug)]
pub enum RemoteError {
    Sql(weir_sql::SqlError),
    Server(String),
    Interrupted,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::Sql(e) => write!(f, "{e}"),
            RemoteError::Server(m) => write!(f, "{m}"),
            RemoteError::Interrupted => write!(f, "interrupted"),
        }
    }
}

fn server_error(e: impl std::fmt::Display) -> RemoteError {
    // arrow-flight wraps the status; the message is what the user needs.
    let text = e.to_string();
    let msg = text
        .split_once("message: \"")
        .and_then(|(_, rest)| match rest.split_once("\", ") {
            Some((m, _)) => Some(m.to_string()),
            None => rest.rsplit_once('"').map(|(m, _)| m.to_string()),
        })
        .unwrap_or(text);
    RemoteError::Server(msg.replace("\\\"", "\"").replace("\\'", "'"))
}

impl Remote {
    /// Connects to `url` (`grpc://` or `grpc+tcp://` plaintext,
    /// `grpc+tls://` with the CA in `WEIR_TLS_CA` or the system's trust
    /// is not bundled); authenticates when `WEIR_PASSWORD` is set.
    pub async fn connect(url: &str, user: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("--url '{url}': expected grpc://HOST:PORT"))?;
        let endpoint = match scheme {
            "grpc" | "grpc+tcp" => Endpoint::from_shared(format!("http://{rest}")),
            "grpc+tls" => Endpoint::from_shared(format!("https://{rest}")),
            other => {
                return Err(format!(
                    "--url '{url}': unknown scheme '{other}'; use grpc:// or grpc+tls://"
                ));
            }
        }
        .map_err(|e| format!("--url '{url}': {e}"))?;
        let endpoint = if scheme == "grpc+tls" {
            weir_engine::exchange::tls::install_crypto_provider();
            let ca = std::env::var_os("WEIR_TLS_CA")
                .ok_or_else(|| "grpc+tls:// needs the server's CA certificate: set WEIR_TLS_CA=ca.pem".to_string())?;
            let pem = std::fs::read(&ca).map_err(|e| format!("WEIR_TLS_CA {}: {e}", ca.to_string_lossy()))?;
            let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
            endpoint
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(pem))
                        .domain_name(host),
                )
                .map_err(|e| format!("TLS: {e}"))?
        } else {
            endpoint
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        let mut client = FlightSqlServiceClient::new(channel);
        if let Ok(password) = std::env::var("WEIR_PASSWORD")
            && !password.is_empty()
        {
            client
                .handshake(user, &password)
                .await
                .map_err(|e| format!("{url}: authentication failed: {}", server_error(e)))?;
        }
        // This shell shows an updating query's changes itself (a table
        // updated in place, or each change): it asks its session on the
        // server for the changes, not a bounded query's final table (what
        // other clients get). A `SET` of the mode by the user goes to the
        // server as well and is honoured there too.
        let mut remote = Self {
            client,
            url: url.to_string(),
            result_mode: None,
            zone: None,
        };
        remote.ask_for_changes().await.map_err(|e| format!("{url}: {e}"))?;
        Ok(remote)
    }

    /// The server session's result mode: always the changes (this shell's
    /// own `result_mode` says how it shows them), set again after the user
    /// sets or resets it (the server checked the user's value).
    async fn ask_for_changes(&mut self) -> Result<(), RemoteError> {
        self.client
            .execute_update(
                format!("SET '{}' = 'changelog'", weir_engine::config::RESULT_MODE),
                None,
            )
            .await
            .map(|_| ())
            .map_err(server_error)
    }

    /// Runs one statement and prints its result.
    pub async fn run(
        &mut self,
        stmt: &weir_sql::ParsedStatement,
        signals: &mut Signals,
        interactive: bool,
    ) -> Result<(), RemoteError> {
        let info = self
            .client
            .execute(stmt.text.clone(), None)
            .await
            .map_err(server_error)?;
        if let weir_sql::Statement::Set(Some((k, v))) = &stmt.statement
            && k.eq_ignore_ascii_case(weir_engine::config::RESULT_MODE)
        {
            self.result_mode = Some(v.to_ascii_lowercase());
        }
        let mode_changed = match &stmt.statement {
            weir_sql::Statement::Set(Some((k, _))) | weir_sql::Statement::Reset(Some(k)) => {
                k.eq_ignore_ascii_case(weir_engine::config::RESULT_MODE)
            }
            weir_sql::Statement::Reset(None) => true,
            _ => false,
        };
        if mode_changed {
            if matches!(stmt.statement, weir_sql::Statement::Reset(_)) {
                self.result_mode = None;
            }
            self.ask_for_changes().await?;
        }
        // The server accepted the statement, so the zone is valid.
        match &stmt.statement {
            weir_sql::Statement::Set(Some((k, v))) if k == weir_engine::config::LOCAL_TIME_ZONE => {
                self.zone = weir_engine::config::local_time_zone(v).ok().flatten();
            }
            weir_sql::Statement::Reset(None) => self.zone = None,
            weir_sql::Statement::Reset(Some(k)) if k == weir_engine::config::LOCAL_TIME_ZONE => self.zone = None,
            _ => {}
        }
        let schema = info.clone().try_decode_schema().unwrap_or_else(|_| Schema::empty());
        let mut out = std::io::stdout();
        for endpoint in info.endpoint {
            let Some(ticket) = endpoint.ticket else { continue };
            let mut stream = self.client.do_get(ticket).await.map_err(server_error)?;
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            if names == ["job_id", "job_name", "state"] {
                let batches: Vec<_> = stream.try_collect().await.map_err(server_error)?;
                let ids = crate::display::column_strings(&batches, 0);
                let jobs = crate::display::column_strings(&batches, 1);
                for (id, name) in ids.iter().zip(&jobs) {
                    println!("[INFO] job '{name}' submitted to {} (id {id})", self.url);
                }
                continue;
            }
            if names == ["job_id", "job_name", "state", "message"] {
                // STOP JOB: how the job ended, in words.
                let batches: Vec<_> = stream.try_collect().await.map_err(server_error)?;
                for message in crate::display::column_strings(&batches, 3) {
                    println!("[INFO] {message}");
                }
                continue;
            }
            if schema.fields().is_empty() {
                let _: Vec<_> = stream.try_collect().await.map_err(server_error)?;
                println!("[INFO] OK");
                continue;
            }
            let schema = std::sync::Arc::new(schema.clone());
            let table = match self.result_mode.as_deref() {
                Some(mode) => mode == "table",
                None => interactive && crate::display::is_changelog(&schema),
            };
            if table {
                // The server's watermark is not on this stream: the
                // status line leaves it out.
                let end = crate::shell::show_table(&schema, stream, signals, &|| None, self.zone.clone())
                    .await
                    .map_err(server_error)?;
                if end == crate::shell::TableEnd::Interrupted {
                    return Err(RemoteError::Interrupted);
                }
                continue;
            }
            let mut tab = Tableau::new(&schema).in_zone(self.zone.clone());
            let _ = writeln!(out, "{}", tab.header(&schema));
            let mut rows = 0u64;
            loop {
                tokio::select! {
                    b = stream.try_next() => match b.map_err(server_error)? {
                        Some(batch) => {
                            rows += batch.num_rows() as u64;
                            let text = tab.rows(&batch).map_err(|e| RemoteError::Server(e.to_string()))?;
                            let _ = out.write_all(text.as_bytes());
                            let _ = out.flush();
                        }
                        None => break,
                    },
                    _ = signals.recv() => {
                        // Dropping the stream cancels it on the server.
                        let _ = writeln!(out, "{}", tab.footer(rows));
                        return Err(RemoteError::Interrupted);
                    }
                }
            }
            let _ = writeln!(out, "{}", tab.footer(rows));
        }
        Ok(())
    }

    /// Every statement of `text` in order; stops at the first error.
    pub async fn run_script(&mut self, text: &str, origin: &str) -> i32 {
        let mut signals = match Signals::install() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot listen for signals: {e}");
                return EXIT_ERROR;
            }
        };
        let stmts = match weir_sql::parse(text) {
            Ok(s) => s,
            Err(e) => {
                crate::shell::print_error(origin, &crate::session::SessionError::Sql(e));
                return EXIT_ERROR;
            }
        };
        for s in &stmts {
            match self.run(s, &mut signals, false).await {
                Ok(()) => {}
                Err(RemoteError::Interrupted) => return EXIT_INTERRUPTED,
                Err(e) => {
                    eprintln!(
                        "{origin}:{}:{}: error: {e} (statement starting here)",
                        s.location.line, s.location.column
                    );
                    return EXIT_ERROR;
                }
            }
        }
        EXIT_OK
    }
}
