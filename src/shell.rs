//! What the local and the remote shell share: exit codes, signals, error
//! printing and the live table of an updating result. A leaf: `cli` (the
//! command line) and `remote` (the shell against a server) both use it.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::session::SessionError;

/// Errors in the shell are shown without a file name.
pub(crate) const REPL: &str = "<repl>";

/// Process exit codes.
pub const EXIT_OK: i32 = 0;
pub const EXIT_ERROR: i32 = 1;
pub const EXIT_INTERRUPTED: i32 = 130;

pub(crate) fn print_error(origin: &str, e: &SessionError) {
    if origin == REPL {
        match e.location() {
            Some(l) => eprintln!("[ERROR] {}:{}: {}", l.line, l.column, e.message()),
            None => eprintln!("[ERROR] {}", e.message()),
        }
        return;
    }
    match e.location() {
        Some(l) => eprintln!("{origin}:{}:{}: error: {}", l.line, l.column, e.message()),
        None => eprintln!("{origin}: error: {}", e.message()),
    }
}

/// SIGINT and SIGTERM, listened to from the start of a script or shell, so
/// a signal that arrives at any moment stops jobs gracefully instead of
/// killing the process.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for either signal.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Why [`show_table`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableEnd {
    /// The result ended.
    Ended,
    /// SIGINT/SIGTERM: the caller stops the query.
    Interrupted,
}

/// Shows a changelog result (`_op` first) as a table kept up to date:
/// each change is applied (`+I`/`+U` add a row, `-U`/`-D` remove one)
/// and, on a terminal, the table is redrawn a few times a second under a
/// status line (rows, changes per second, elapsed time, and the
/// watermark where it is known); piped, the final table is printed once.
/// Used by the local and the remote shell.
pub(crate) async fn show_table<S, E>(
    schema: &arrow::datatypes::SchemaRef,
    mut changes: S,
    signals: &mut Signals,
    watermark: &dyn Fn() -> Option<String>,
    zone: Option<weir_engine::time_zone::SessionZone>,
) -> Result<TableEnd, arrow::error::ArrowError>
where
    S: futures::Stream<Item = Result<arrow::record_batch::RecordBatch, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    use futures::StreamExt;
    let terminal = std::io::stdout().is_terminal();
    let mut view = crate::display::Materialized::new(schema).in_zone(zone);
    let started = Instant::now();
    let mut redraw = tokio::time::interval(Duration::from_millis(250));
    redraw.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let status = |view: &crate::display::Materialized| {
        let secs = started.elapsed().as_secs_f64();
        let mut line = format!(
            "rows: {}, changes: {} ({:.0}/s), elapsed: {secs:.1} s",
            view.len(),
            view.changes(),
            view.changes() as f64 / secs.max(0.001)
        );
        if let Some(w) = watermark() {
            line.push_str(&format!(", watermark: {w}"));
        }
        line
    };
    let mut out = std::io::stdout();
    let mut end = TableEnd::Ended;
    loop {
        tokio::select! {
            b = changes.next() => match b {
                Some(batch) => view.apply(&batch.map_err(|e| arrow::error::ArrowError::ExternalError(Box::new(e)))?)?,
                None => break,
            },
            _ = redraw.tick(), if terminal => {
                // Clear the screen, then the table and its status.
                let _ = write!(out, "\x1b[2J\x1b[H{}\n{}\n", view.render(), status(&view));
                let _ = out.flush();
            }
            _ = signals.recv() => {
                end = TableEnd::Interrupted;
                break;
            }
        }
    }
    if terminal {
        let _ = write!(out, "\x1b[2J\x1b[H");
    }
    let _ = writeln!(out, "{}\n{}", view.render(), status(&view));
    Ok(end)
}

/// The first SIGINT or SIGTERM (a server's shutdown); a second one exits
/// the process at once, without waiting for jobs to suspend. The binary's
/// side of a shutdown: the server itself only takes a future to stop on.
pub async fn shutdown_signal() {
    signalled().await;
    tokio::spawn(async {
        signalled().await;
        eprintln!("[WARN] second signal: exiting without suspending jobs");
        std::process::exit(EXIT_INTERRUPTED);
    });
}

async fn signalled() {
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
}
