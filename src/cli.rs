//! The `weir` command line: REPL, `weir run FILE.sql`, `weir -c SQL`,
//! scripts on stdin, and `weir bench`.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use tokio::runtime::Runtime;
use weir_engine::runtime::JobHandle;

use crate::display::Tableau;
use crate::session::{ResultStream, Session, SessionError, StatementResult};
use crate::shell::{EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, REPL, Signals, TableEnd, print_error, show_table};

#[derive(Parser, Debug)]
#[command(
    name = "weir",
    version,
    about = "Streaming SQL: Flink semantics on Arrow, DataFusion and RocksDB"
)]
pub struct Args {
    /// Catalog, job state and checkpoints live here.
    #[arg(long, global = true, default_value = "./weir-data")]
    pub data_dir: PathBuf,

    /// Keep tables and views in this catalog file, across runs. Without
    /// it the shell, `weir run`, `-c` and `weir worker` keep them for the
    /// session only, as Flink's SQL client does (a script's DDL is the
    /// truth for its run; jobs still resume from their checkpoints);
    /// `weir serve` keeps `<data-dir>/catalog.json`.
    #[arg(long, global = true, value_name = "FILE")]
    pub catalog: Option<PathBuf>,

    /// Execute these statements and exit.
    #[arg(short = 'c', long = "command")]
    pub command: Option<String>,

    /// Work against a `weir serve` (grpc://HOST:PORT or grpc+tls://...)
    /// instead of the embedded engine. WEIR_PASSWORD authenticates;
    /// WEIR_TLS_CA names the CA for grpc+tls.
    #[arg(long)]
    pub url: Option<String>,

    /// User for --url when WEIR_PASSWORD is set.
    #[arg(long, default_value = "weir")]
    pub user: String,

    /// Only files inside these directories (and the data dir) may be named
    /// by SQL: table paths, checkpoint and recovery paths. Repeatable. An
    /// object-store URL (`s3://bucket/prefix`) allows checkpoints,
    /// savepoints and restores below it, reached with the server's own S3
    /// settings (the `AWS_*` environment).
    /// `weir serve` allows only the data dir unless given; the shell and
    /// `weir run` are unrestricted unless given.
    #[arg(long = "allow-dir", global = true)]
    pub allow_dir: Vec<PathBuf>,

    #[command(subcommand)]
    pub sub: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Execute a .sql file's statements in order and wait for its jobs.
    Run {
        file: PathBuf,
        /// Start the file's jobs from this savepoint (or retained
        /// checkpoint) directory: `SET 'execution.state-recovery.path'`.
        #[arg(long = "from-savepoint", value_name = "DIR")]
        from_savepoint: Option<PathBuf>,
    },
    /// Serve Arrow Flight SQL (ADBC/JDBC clients) until Ctrl-C / SIGTERM.
    Serve(ServeArgs),
    /// Run a .sql file's INSERT over [--from, --to) of event time in
    /// batch mode, one chunk of --chunk at a time; a rerun skips the
    /// chunks done, and a chunk killed midway is written again, never
    /// twice (filesystem sinks).
    Backfill(crate::backfill::BackfillArgs),
    /// Run a .sql file's jobs spread over worker processes: every worker
    /// gets the same file and peer list; subtask s runs on worker s % N;
    /// worker 0 coordinates checkpoints and commits. Each worker needs its
    /// own --data-dir, and checkpoints storage all of them reach (s3://).
    /// Exits 0 when the job finished, non-zero when it cannot go on (a
    /// supervisor starts it again, and the job recovers).
    Worker(WorkerArgs),
    /// Kubernetes: the manifests that run a .sql file's job over worker pods.
    K8s {
        #[command(subcommand)]
        which: K8sCommand,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum K8sCommand {
    /// Print a ConfigMap (the SQL), a headless Service and a StatefulSet
    /// (or an Indexed Job) running the file's job over N `weir worker` pods.
    Manifests(crate::k8s::ManifestArgs),
}

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// This worker's index in --peers (a StatefulSet pod's ordinal).
    #[arg(long)]
    pub index: u32,
    /// Every worker's HOST:PORT, in index order, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub peers: Vec<String>,
    /// Where to listen (default: this worker's entry in --peers), e.g.
    /// 0.0.0.0:7000 in a pod.
    #[arg(long)]
    pub listen: Option<String>,
    /// Seconds to wait for the other workers.
    #[arg(long, default_value_t = 120.0)]
    pub join_timeout: f64,
    /// Seconds a peer may send nothing, not even a heartbeat (sent every
    /// 0.5 s), before this worker counts it as lost and the job restarts.
    #[arg(long, default_value_t = 10.0)]
    pub heartbeat_timeout: f64,
    /// Start the file's jobs from this savepoint (or retained checkpoint),
    /// whatever the number of workers that took it (rescaling). Give every
    /// worker the same.
    #[arg(long = "from-savepoint", value_name = "DIR")]
    pub from_savepoint: Option<PathBuf>,
    /// Serve Prometheus metrics (this worker's subtasks) at
    /// http://ADDR/metrics; also what Kubernetes probes.
    #[arg(long)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// TLS between workers (mutual): this worker's certificate chain
    /// (PEM), valid for its host in --peers; with --tls-key and --tls-ca.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// This worker's private key (PEM).
    #[arg(long, requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The CA that signed every worker's certificate (PEM).
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    pub file: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on. Loopback by default; listening on other
    /// interfaces wants a password and TLS.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: std::net::SocketAddr,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// User name clients authenticate as (with a lone password).
    #[arg(long, default_value = "weir")]
    pub user: String,
    /// Users file: `user:role:password` lines (roles admin, user, read),
    /// or one line with a lone password for --user (or set WEIR_PASSWORD).
    /// Never on the command line: argv is visible to every local user.
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// TLS certificate chain (PEM); with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); with --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Connections open at once; more are refused.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Result streams open at once (all clients).
    #[arg(long, default_value_t = 512)]
    pub max_streams: usize,
    /// Largest request message, in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    pub max_request_bytes: usize,
    /// Result batches queued for a live query's client; when full the query
    /// waits for the client.
    #[arg(long, default_value_t = 64)]
    pub subscriber_queue: usize,
    /// Seconds a live query waits for a client that reads nothing before
    /// dropping it as stalled.
    #[arg(long, default_value_t = 30.0)]
    pub subscriber_timeout: f64,
    /// Let clients' connector properties load code or run commands in the
    /// server (librdkafka's `properties.plugin.library.paths`,
    /// `properties.sasl.kerberos.kinit.cmd`, ...). Off: such tables are
    /// refused for every role.
    #[arg(long)]
    pub allow_client_plugins: bool,
}

impl ServeArgs {
    fn options(&self) -> Result<crate::server::ServerOptions, String> {
        let mut o = crate::server::ServerOptions::new(self.listen);
        o.auth = crate::server::Auth::new(crate::server::load_users(self.password_file.as_deref(), &self.user)?);
        o.tls = self.tls_cert.clone().zip(self.tls_key.clone());
        o.metrics_listen = self.metrics_listen;
        o.max_connections = self.max_connections.max(1);
        o.max_streams = self.max_streams.max(1);
        o.max_request_bytes = self.max_request_bytes.max(1024);
        o.subscriber_queue = self.subscriber_queue.max(1);
        o.subscriber_timeout = std::time::Duration::try_from_secs_f64(self.subscriber_timeout).map_err(|_| {
            format!(
                "--subscriber-timeout {}: not a number of seconds",
                self.subscriber_timeout
            )
        })?;
        if !o.listen.ip().is_loopback() && !o.auth.enabled() {
            eprintln!(
                "[WARN] listening on {} without a password: anyone who can reach it can run SQL",
                o.listen
            );
        }
        Ok(o)
    }
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Nexmark queries over the built-in generator into a blackhole sink.
    Nexmark(crate::bench::NexmarkArgs),
    /// The seed's skewed backfill, with and without watermark alignment.
    Alignment(crate::bench::AlignmentArgs),
    /// Savepoint and restore times for ≥ 1 GiB of RocksDB state, at the
    /// same, half and double parallelism.
    Savepoint(crate::bench::SavepointArgs),
    /// Kafka read and write rates against a running cluster, beside the
    /// librdkafka consumer alone (benches/kafka.sh starts a broker).
    Kafka(crate::bench::KafkaArgs),
    /// The network exchange between worker processes over loopback:
    /// Nexmark-shaped bid batches on 1 and several channels of one
    /// connection, beside encode/decode alone and an in-memory channel.
    Exchange(crate::exchange_bench::ExchangeArgs),
    /// The same Flink SQL files on Weir and on Flink 2.3, side by side:
    /// rows/s, CPU seconds and peak memory of both, runs alternating.
    Compare(crate::compare::CompareArgs),
}

/// A session on `data_dir` over `catalog` (a file; `None`: the session's
/// own, in memory); with `restrict`, SQL may name files only in the data
/// dir and `allow`.
fn open_session(
    data_dir: &std::path::Path,
    catalog: Option<PathBuf>,
    allow: &[PathBuf],
    restrict: bool,
    client_plugins: bool,
) -> Result<Session, String> {
    if !restrict {
        return Session::open_with_catalog(data_dir, weir_engine::paths::PathPolicy::unrestricted(), catalog)
            .map_err(|e| e.to_string());
    }
    std::fs::create_dir_all(data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let mut dirs = vec![data_dir.to_path_buf()];
    dirs.extend(allow.iter().cloned());
    let mut policy = weir_engine::paths::PathPolicy::allow(&dirs)
        .map_err(|e| format!("--allow-dir: {e}"))?
        .reserving(data_dir);
    if let Some(file) = &catalog {
        policy = policy.reserving_file(file);
    }
    if client_plugins {
        policy = policy.allowing_client_plugins();
    }
    Session::open_with_catalog(data_dir, policy, catalog).map_err(|e| e.to_string())
}

/// Stack of the runtime's threads, where statements are parsed and
/// planned: syntax trees up to `weir_sql::parser::MAX_NESTING` deep are
/// walked recursively (by sqlparser, the rewrite and DataFusion).
pub const THREAD_STACK_BYTES: usize = 16 << 20;

/// What `weir serve` serves with, from its command line: the server's
/// options and a session over the data dir whose clients name files only
/// inside it and the directories it was given. Tests start a server in
/// their own process from the same flags.
pub fn server_parts(args: &Args) -> Result<(crate::server::ServerOptions, Session), String> {
    let Some(Command::Serve(serve)) = &args.sub else {
        return Err("not a `weir serve` command line".into());
    };
    // A server's tables outlive it (its clients come and go).
    let catalog = args
        .catalog
        .clone()
        .unwrap_or_else(|| args.data_dir.join("catalog.json"));
    let session = open_session(
        &args.data_dir,
        Some(catalog),
        &args.allow_dir,
        true,
        serve.allow_client_plugins,
    )?;
    Ok((serve.options()?, session))
}

pub fn main_with(args: Args) -> i32 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .thread_stack_size(THREAD_STACK_BYTES)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return EXIT_ERROR;
        }
    };
    match &args.sub {
        Some(Command::K8s {
            which: K8sCommand::Manifests(m),
        }) => {
            let sql = match std::fs::read_to_string(&m.file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: cannot read {}: {e}", m.file.display());
                    return EXIT_ERROR;
                }
            };
            return match crate::k8s::manifests(m, &sql) {
                Ok(y) => {
                    print!("{y}");
                    EXIT_OK
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    EXIT_ERROR
                }
            };
        }
        Some(Command::Bench {
            which: BenchCommand::Nexmark(b),
        }) => return rt.block_on(crate::bench::run_nexmark(b)),
        Some(Command::Bench {
            which: BenchCommand::Savepoint(b),
        }) => return rt.block_on(crate::bench::run_savepoint(b)),
        Some(Command::Bench {
            which: BenchCommand::Compare(b),
        }) => return crate::compare::run_compare(b),
        Some(Command::Bench {
            which: BenchCommand::Kafka(b),
        }) => return rt.block_on(crate::bench::run_kafka(b)),
        Some(Command::Bench {
            which: BenchCommand::Exchange(b),
        }) => return rt.block_on(crate::exchange_bench::run_exchange(b)),
        Some(Command::Bench {
            which: BenchCommand::Alignment(b),
        }) => {
            return rt.block_on(crate::bench::run_alignment(b));
        }
        Some(Command::Serve(_)) => {
            let (options, session) = match server_parts(&args) {
                Ok(parts) => parts,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_ERROR;
                }
            };
            let listen = options.listen;
            let serving = async move {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
                crate::server::serve(listener, options, session, crate::shell::shutdown_signal()).await
            };
            return match rt.block_on(serving) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    EXIT_ERROR
                }
            };
        }
        _ => {}
    }
    if let Some(url) = &args.url {
        return remote_main(&rt, &args, url);
    }
    let mut session = match open_session(
        &args.data_dir,
        args.catalog.clone(),
        &args.allow_dir,
        !args.allow_dir.is_empty(),
        false,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_ERROR;
        }
    };
    match (&args.sub, &args.command) {
        (Some(Command::Run { file, from_savepoint }), _) => {
            if let Some(dir) = from_savepoint
                && let Err(e) = session.set_option(weir_engine::config::RECOVERY_PATH, &dir.display().to_string())
            {
                eprintln!("error: --from-savepoint: {e}");
                return EXIT_ERROR;
            }
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: cannot read {}: {e}", file.display());
                    return EXIT_ERROR;
                }
            };
            let stem = file
                .file_stem()
                .map_or("job".into(), |s| s.to_string_lossy().to_string());
            session.set_default_job_name(stem);
            rt.block_on(run_script(&mut session, &text, &file.display().to_string()))
        }
        (Some(Command::Backfill(args)), _) => rt.block_on(crate::backfill::run(&mut session, args)),
        (Some(Command::Worker(w)), _) => {
            let seconds = |flag: &str, v: f64| match std::time::Duration::try_from_secs_f64(v) {
                Ok(d) if !d.is_zero() => Ok(d),
                _ => Err(format!("error: --{flag} {v}: not a positive number of seconds")),
            };
            let (join_deadline, heartbeat_timeout) = match (
                seconds("join-timeout", w.join_timeout),
                seconds("heartbeat-timeout", w.heartbeat_timeout),
            ) {
                (Ok(j), Ok(h)) => (j, h),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("{e}");
                    return EXIT_ERROR;
                }
            };
            if w.index as usize >= w.peers.len() {
                eprintln!(
                    "error: --index {} is not a worker of --peers ({} workers: 0..{})",
                    w.index,
                    w.peers.len(),
                    w.peers.len()
                );
                return EXIT_ERROR;
            }
            let text = match std::fs::read_to_string(&w.file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: cannot read {}: {e}", w.file.display());
                    return EXIT_ERROR;
                }
            };
            if let Some(dir) = &w.from_savepoint
                && let Err(e) = session.set_option(weir_engine::config::RECOVERY_PATH, &dir.display().to_string())
            {
                eprintln!("error: --from-savepoint: {e}");
                return EXIT_ERROR;
            }
            let tls = match (&w.tls_cert, &w.tls_key, &w.tls_ca) {
                (Some(c), Some(k), Some(a)) => match weir_engine::exchange::tls::LinkTls::load(c, k, a) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        eprintln!("error: TLS between workers: {e}");
                        return EXIT_ERROR;
                    }
                },
                _ => None,
            };
            session.set_cluster(weir_engine::runtime::cluster::Cluster {
                index: w.index,
                peers: w.peers.clone(),
                listen: w.listen.clone(),
                join_deadline,
                heartbeat_timeout,
                tls,
            });
            if let Some(addr) = w.metrics_listen {
                let stats = std::sync::Arc::new(crate::server::metrics::ServerStats::new(1, 1));
                let streams = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
                if let Err(e) = rt.block_on(crate::server::metrics::serve(addr, session.jobs_view(), stats, streams)) {
                    eprintln!("error: --metrics-listen {addr}: {e}");
                    return EXIT_ERROR;
                }
            }
            let stem = w
                .file
                .file_stem()
                .map_or("job".into(), |s| s.to_string_lossy().to_string());
            session.set_default_job_name(stem);
            let code = rt.block_on(run_script(&mut session, &text, &w.file.display().to_string()));
            if code == EXIT_ERROR {
                // Its supervisor starts every worker again from the last
                // checkpoint: what this one's tasks still do (the upload of
                // a checkpoint that cannot complete now) is lost work, and
                // waiting for it only delays the job's recovery.
                rt.shutdown_background();
            }
            code
        }
        (None, Some(sql)) => rt.block_on(run_script(&mut session, sql, "<command>")),
        (None, None) if !std::io::stdin().is_terminal() => {
            let mut text = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut text) {
                eprintln!("error: cannot read stdin: {e}");
                return EXIT_ERROR;
            }
            rt.block_on(run_script(&mut session, &text, "<stdin>"))
        }
        (None, None) => repl(&rt, Backend::Local(&mut session)),
        (Some(Command::Bench { .. } | Command::Serve(_) | Command::K8s { .. }), _) => EXIT_ERROR,
    }
}

/// `--url`: the same commands against a server.
fn remote_main(rt: &Runtime, args: &Args, url: &str) -> i32 {
    let mut remote = match rt.block_on(crate::remote::Remote::connect(url, &args.user)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_ERROR;
        }
    };
    let script = match (&args.sub, &args.command) {
        (
            Some(Command::Run {
                file,
                from_savepoint: None,
            }),
            _,
        ) => match std::fs::read_to_string(file) {
            Ok(t) => Some((t, file.display().to_string())),
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", file.display());
                return EXIT_ERROR;
            }
        },
        (None, Some(sql)) => Some((sql.clone(), "<command>".to_string())),
        (None, None) if !std::io::stdin().is_terminal() => {
            let mut text = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut text) {
                eprintln!("error: cannot read stdin: {e}");
                return EXIT_ERROR;
            }
            Some((text, "<stdin>".to_string()))
        }
        (None, None) => None,
        (Some(_), _) => {
            eprintln!("error: --url works with the shell, -c, stdin and `run`");
            return EXIT_ERROR;
        }
    };
    match script {
        Some((text, origin)) => rt.block_on(remote.run_script(&text, &origin)),
        None => repl(rt, Backend::Remote(Box::new(remote))),
    }
}

/// What `help` prints in the shell.
const SHELL_HELP: &str = "Statements end with ';' (a statement may span lines). The shell's own words need none:
  help                      this text
  quit, exit                leave (jobs started here stop; a server's keep running)
SQL (Flink's dialect; docs/sql.md lists what works):
  CREATE [TEMPORARY] TABLE | VIEW ...;   DROP TABLE | VIEW ...;
  SHOW TABLES;  SHOW VIEWS;  SHOW CREATE TABLE t;  SHOW CREATE VIEW v;  DESCRIBE t;
  SELECT ...;   SUBSCRIBE TO t;   INSERT INTO t [(columns)] SELECT ...;   EXPLAIN ...;
  SET 'key' = 'value';  SET;  RESET 'key';  RESET;
  SHOW JOBS;  DESCRIBE JOB 'id';  STOP JOB 'id' [WITH SAVEPOINT [DRAIN]];  CANCEL JOB 'id';
  SAVEPOINT JOB 'id';  SHOW SAVEPOINTS | CHECKPOINTS | WATERMARKS FOR JOB 'id';
Results: SET 'sql-client.execution.result-mode' = 'table' | 'changelog' | 'tableau'.
Ctrl-C stops a running query; Ctrl-D leaves.";

/// Where the shell's statements run.
enum Backend<'a> {
    Local(&'a mut Session),
    Remote(Box<crate::remote::Remote>),
}

/// How a streaming result is shown (`sql-client.execution.result-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResultMode {
    /// A materialized view of the result, updated in place.
    Table,
    /// Every change as it arrives, with its op.
    Changelog,
}

impl ResultMode {
    /// The session's choice; without one, the interactive shell shows an
    /// updating result as a table and everything else streams.
    fn of(session: &Session, interactive: bool, rs_changelog: bool) -> Self {
        match session.result_mode().map(str::to_ascii_lowercase).as_deref() {
            Some("table") => ResultMode::Table,
            Some(_) => ResultMode::Changelog,
            None if interactive && rs_changelog => ResultMode::Table,
            None => ResultMode::Changelog,
        }
    }
}

/// Prints a result; streams run until they end or a signal arrives.
async fn show(
    result: StatementResult,
    signals: &mut Signals,
    session: &Session,
    interactive: bool,
) -> Result<(), SessionError> {
    match result {
        StatementResult::Done(msg) | StatementResult::JobEnded { message: msg, .. } => println!("[INFO] {msg}"),
        StatementResult::Rows(_, batches) => {
            println!(
                "{}",
                crate::display::result_table(&batches, session.local_time_zone().as_ref())
            )
        }
        StatementResult::Explain(text) => println!("{text}"),
        StatementResult::JobStarted {
            id,
            name,
            resumed_from: None,
            ..
        } => println!("[INFO] job '{name}' submitted (id {id})"),
        StatementResult::JobStarted {
            id,
            name,
            resumed_from: Some((checkpoint, path)),
            ..
        } => println!("[INFO] job '{name}' submitted (id {id}): resuming from checkpoint {checkpoint} ({path})"),
        StatementResult::Stream(rs) => match ResultMode::of(session, interactive, rs.changelog) {
            ResultMode::Table => materialized(rs, signals).await?,
            ResultMode::Changelog => stream(rs, signals).await?,
        },
    }
    Ok(())
}

/// Shows a local streaming result as a table kept up to date
/// ([`show_table`]); Ctrl-C stops the query and keeps the table.
async fn materialized(rs: ResultStream, signals: &mut Signals) -> Result<(), SessionError> {
    let ResultStream {
        schema,
        mut rows,
        job,
        zone,
        ..
    } = rs;
    let metrics = job.metrics.clone();
    let watermark = move || {
        Some(
            metrics
                .source_watermark()
                .filter(|w| *w > i64::MIN && *w < i64::MAX)
                .map(crate::display::format_millis)
                .unwrap_or_else(|| "none".into()),
        )
    };
    let changes = futures::stream::poll_fn(|cx| rows.poll_recv(cx).map(|b| b.map(Ok::<_, std::convert::Infallible>)));
    let ended = show_table(&schema, changes, signals, &watermark, zone)
        .await
        .map_err(weir_engine::ExecError::from)?;
    if ended == TableEnd::Interrupted {
        job.stop();
    }
    drop(rows);
    job.wait().await?;
    Ok(())
}

/// Prints a streaming result as it arrives; Ctrl-C stops the query.
async fn stream(mut rs: ResultStream, signals: &mut Signals) -> Result<(), SessionError> {
    let mut tab = Tableau::new(&rs.schema).in_zone(rs.zone.clone());
    let mut out = std::io::stdout();
    // The header at once (a quiet live query shows it is running); the
    // total only at a successful end: a failing query prints its error,
    // not "Received a total of 0 rows" first.
    let _ = writeln!(out, "{}", tab.header(&rs.schema));
    let mut rows = 0u64;
    loop {
        tokio::select! {
            b = rs.rows.recv() => match b {
                Some(batch) => {
                    rows += batch.num_rows() as u64;
                    let text = tab.rows(&batch).map_err(weir_engine::ExecError::from)?;
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.flush();
                }
                None => break,
            },
            _ = signals.recv() => {
                rs.job.stop();
                break;
            }
        }
    }
    drop(rs.rows);
    let ended = rs.job.wait().await;
    // A failure after some rows: the rows stand, the error follows them
    // (as Flink's client prints it), without a total.
    if ended.is_ok() {
        let _ = writeln!(out, "{}", tab.footer(rows));
    }
    ended?;
    Ok(())
}

/// Runs a script: statements in order, stop at the first error, then wait
/// for the jobs it started (SIGINT/SIGTERM stop them gracefully).
pub async fn run_script(session: &mut Session, text: &str, origin: &str) -> i32 {
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
            print_error(origin, &SessionError::Sql(e));
            return EXIT_ERROR;
        }
    };
    for stmt in &stmts {
        let result = match session.execute(stmt).await {
            Ok(r) => r,
            Err(e) => {
                print_error(origin, &e);
                stop_all(session.take_jobs()).await;
                return EXIT_ERROR;
            }
        };
        if let Err(e) = show(result, &mut signals, session, false).await {
            print_error(origin, &e);
            stop_all(session.take_jobs()).await;
            return EXIT_ERROR;
        }
    }
    match session.cluster().map(|c| c.index) {
        Some(index) => wait_worker_jobs(session.take_jobs(), &mut signals, index).await,
        None => wait_jobs(session.take_jobs(), &mut signals).await,
    }
}

/// How long a signalled worker gives the job's last checkpoint before it
/// ends (Kubernetes gives a pod 30 s from SIGTERM by default; the
/// manifests give 120).
const SUSPEND_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// `weir worker`: waits for the jobs.
///
/// SIGTERM or SIGINT on any worker (Kubernetes deleting, evicting or
/// rolling a pod) **suspends** the job: worker 0 takes a checkpoint now,
/// then every worker ends non-zero; started again (by the StatefulSet),
/// they resume from that checkpoint, replaying nothing committed. Another
/// worker asks worker 0 to do so ([`weir_engine::exchange::control::Control::Suspend`]).
/// A second signal ends the process at once.
///
/// SIGUSR1 on worker 0 stops the job with a savepoint (an upgrade or a
/// rescale: `kubectl exec weir-0 -- kill -USR1 1`); every worker then
/// exits 0, and restarted pods do not run the job again until they are
/// started `--from-savepoint` it.
async fn wait_worker_jobs(jobs: Vec<JobHandle>, signals: &mut Signals, index: u32) -> i32 {
    if jobs.is_empty() {
        return EXIT_OK;
    }
    let controllers: Vec<_> = jobs.iter().map(|j| (j.name.clone(), j.controller())).collect();
    let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
    let mut all = Box::pin(futures::future::join_all(jobs.into_iter().map(|j| j.wait())));
    let mut usr1 = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("[WARN] worker {index}: cannot listen for SIGUSR1 (stop with savepoint): {e}");
            None
        }
    };
    let mut asked = Box::pin(futures::future::select_all(
        controllers.iter().map(|(_, c)| Box::pin(c.suspend_requested())),
    ));
    let mut suspending: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> = None;
    let suspend = |why: &str| -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let controllers: Vec<_> = controllers.iter().map(|(n, c)| (n.clone(), c.clone())).collect();
        if index == 0 {
            eprintln!(
                "[INFO] worker 0: {why}; suspending: a checkpoint now, then every worker ends and resumes from it when started again"
            );
            Box::pin(async move {
                for (name, c) in controllers {
                    if !c.checkpointing() {
                        eprintln!("[WARN] job '{name}' does not checkpoint: started again, it starts afresh");
                        continue;
                    }
                    if !c.checkpoint_now(SUSPEND_WITHIN).await {
                        eprintln!(
                            "[WARN] job '{name}': no checkpoint completed within {SUSPEND_WITHIN:?}; started again, it resumes from the one before"
                        );
                    }
                    // Recorded either way: a suspend is no failure for the
                    // restart strategy (and a run that ended meanwhile
                    // keeps its own end).
                    if let Err(e) = c.mark_suspended().await {
                        eprintln!("[WARN] job '{name}': could not record the suspend: {e}");
                    }
                }
            })
        } else {
            eprintln!("[INFO] worker {index}: {why}; asking worker 0 to suspend the job");
            for (_, c) in &controllers {
                c.request_suspend();
            }
            // Worker 0's end reaches this worker as its lost link; this is
            // only the deadline if it never does.
            Box::pin(async move {
                tokio::time::sleep(SUSPEND_WITHIN + std::time::Duration::from_secs(5)).await;
                eprintln!("[WARN] worker {index}: worker 0 did not end the job in time; ending here");
            })
        }
    };
    let results = loop {
        tokio::select! {
            r = &mut all => break r,
            _ = signals.recv() => {
                if suspending.is_some() {
                    eprintln!("[WARN] worker {index}: signalled again: ending now");
                    return EXIT_INTERRUPTED;
                }
                suspending = Some(suspend("signalled"));
            }
            _ = &mut asked, if index == 0 && suspending.is_none() => {
                suspending = Some(suspend("another worker was signalled"));
            }
            // Suspended: the process ends; the others follow when its links go.
            _ = async { if let Some(s) = suspending.as_mut() { s.await } }, if suspending.is_some() => {
                return EXIT_INTERRUPTED;
            }
            _ = async { match usr1.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } }, if suspending.is_none() => {
                if index != 0 {
                    eprintln!("[INFO] worker {index}: SIGUSR1 (stop with savepoint) is for worker 0");
                    continue;
                }
                for (name, controller) in &controllers {
                    match controller.savepoint(None, weir_engine::runtime::SavepointMode::Stop).await {
                        Ok(done) => eprintln!(
                            "[INFO] job '{name}' stopped with savepoint {} (start from it with --from-savepoint)",
                            done.path.display()
                        ),
                        // Stopping without one would drop the job's state
                        // (a stop clears its checkpoints): it goes on, as
                        // Flink's does when a stop-with-savepoint fails.
                        Err(e) => eprintln!("[WARN] job '{name}': no savepoint ({e}); it goes on (send SIGUSR1 again to retry)"),
                    }
                }
            }
        }
    };
    if suspending.is_some() {
        // Worker 0 ended the job for the suspend: this worker's end is its
        // lost link, which is no failure.
        eprintln!("[INFO] worker {index}: the job is suspended; started again, it resumes");
        return EXIT_INTERRUPTED;
    }
    let mut code = EXIT_OK;
    for (name, r) in names.iter().zip(results) {
        match r {
            Ok(outcome) => eprintln!("[INFO] job '{name}' ended after {:.2} s", outcome.elapsed.as_secs_f64()),
            Err(e) => {
                eprintln!("error: job '{name}' failed: {e}");
                code = EXIT_ERROR;
            }
        }
    }
    code
}

async fn stop_all(jobs: Vec<JobHandle>) {
    for j in &jobs {
        j.stop();
    }
    for j in jobs {
        let _ = j.wait().await;
    }
}

/// How often `weir run` prints a bounded job's progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits for every job; on SIGINT or SIGTERM asks them to stop and waits
/// for them to drain.
async fn wait_jobs(jobs: Vec<JobHandle>, signals: &mut Signals) -> i32 {
    if jobs.is_empty() {
        return EXIT_OK;
    }
    let stops: Vec<_> = jobs.iter().map(|j| j.stopper()).collect();
    let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
    let metrics: Vec<_> = jobs.iter().map(|j| j.metrics.clone()).collect();
    let mut all = Box::pin(futures::future::join_all(jobs.into_iter().map(|j| j.wait())));
    let mut interrupted = false;
    // A bounded run says how far it is every few seconds (a line each, so
    // a print sink's rows and a log keep their lines).
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    let results = loop {
        tokio::select! {
            r = &mut all => break r,
            _ = signals.recv() => { interrupted = true; for s in &stops { s.stop(); } break all.await }
            _ = progress.tick() => {
                for (name, m) in names.iter().zip(&metrics) {
                    if m.lifecycle.state().is_terminal() {
                        continue;
                    }
                    if let Some(p) = crate::jobs::progress_text(m) {
                        eprintln!("[INFO] job '{name}': {p}");
                    }
                }
            }
        }
    };
    let mut code = if interrupted { EXIT_INTERRUPTED } else { EXIT_OK };
    for (name, r) in names.iter().zip(results) {
        match r {
            Ok(outcome) => {
                let late = outcome.metrics.late_rows_dropped();
                eprintln!(
                    "[INFO] job '{name}' {} after {:.2} s{}",
                    if interrupted { "stopped" } else { "finished" },
                    outcome.elapsed.as_secs_f64(),
                    if late > 0 {
                        format!(", {late} late rows dropped")
                    } else {
                        String::new()
                    }
                );
            }
            Err(e) => {
                eprintln!("error: job '{name}' failed: {e}");
                code = EXIT_ERROR;
            }
        }
    }
    code
}

fn history_path(data_dir: &Path) -> PathBuf {
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".weir_history"),
        None => data_dir.join("history"),
    }
}

/// The interactive shell: statements end with `;` and may span lines.
fn repl(rt: &Runtime, mut backend: Backend<'_>) -> i32 {
    use rustyline::error::ReadlineError;
    let mut editor = match rustyline::DefaultEditor::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot start the line editor: {e}");
            return EXIT_ERROR;
        }
    };
    let history = match &backend {
        Backend::Local(session) => history_path(session.data_dir()),
        Backend::Remote(_) => history_path(Path::new(".")),
    };
    let _ = editor.load_history(&history);
    println!(
        "Weir {} — statements end with ';'. Type 'help' for help, 'quit' or Ctrl-D to leave.",
        env!("CARGO_PKG_VERSION")
    );
    if let Backend::Remote(r) = &backend {
        println!("Connected to {}; jobs you start keep running there.", r.url);
    }
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() { "weir> " } else { "   -> " };
        match editor.readline(prompt) {
            Ok(line) => {
                // The shell's own words work alone on a line, with or
                // without ';' (as in Flink's SQL client).
                if buffer.trim().is_empty() {
                    let word = line.trim().trim_end_matches(';').trim().to_ascii_lowercase();
                    if word == "help" {
                        let _ = editor.add_history_entry(line.trim());
                        println!("{SHELL_HELP}");
                        continue;
                    }
                    if word == "quit" || word == "exit" {
                        break;
                    }
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if !buffer.trim_end().ends_with(';') {
                    continue;
                }
                let text = std::mem::take(&mut buffer);
                let _ = editor.add_history_entry(text.trim());
                let _ = editor.save_history(&history);
                let t = text.trim().trim_end_matches(';').trim().to_ascii_lowercase();
                if t == "quit" || t == "exit" {
                    break;
                }
                rt.block_on(async {
                    let mut signals = match Signals::install() {
                        Ok(s) => s,
                        Err(e) => {
                            eprintln!("[ERROR] cannot listen for signals: {e}");
                            return;
                        }
                    };
                    match (weir_sql::parse(&text), &mut backend) {
                        (Err(e), _) => print_error(REPL, &SessionError::Sql(e)),
                        (Ok(stmts), Backend::Remote(remote)) => {
                            for s in &stmts {
                                match remote.run(s, &mut signals, true).await {
                                    Ok(()) => {}
                                    Err(crate::remote::RemoteError::Interrupted) => break,
                                    Err(e) => {
                                        eprintln!("[ERROR] {e}");
                                        break;
                                    }
                                }
                            }
                        }
                        (Ok(stmts), Backend::Local(session)) => {
                            for s in &stmts {
                                match session.execute(s).await {
                                    Ok(r) => {
                                        if let Err(e) = show(r, &mut signals, session, true).await {
                                            print_error(REPL, &e);
                                            break;
                                        }
                                    }
                                    Err(e) => {
                                        print_error(REPL, &e);
                                        break;
                                    }
                                }
                            }
                        }
                    }
                });
            }
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_ERROR;
            }
        }
    }
    // Jobs submitted from the embedded shell run until they finish or the
    // shell ends; a server's jobs are the server's.
    if let Backend::Local(session) = backend {
        rt.block_on(stop_all(session.take_jobs()));
    }
    EXIT_OK
}
