//! Named failpoints for crash and fault tests, armed by the environment:
//! `WEIR_FAILPOINTS=spec[,spec...]`, each spec `name:hits[:mode]`, where
//! `hits` is `k` (the k-th pass) or `k-m` (the k-th through m-th passes).
//!
//! - no mode: the process aborts (no destructors, no flushing: like
//!   `kill -9`) at a [`failpoint`] site;
//! - `error`: a [`failpoint_error`] site fails its task (a task failure
//!   the restart strategy handles);
//! - `eio` / `enospc`: a [`failpoint_io`] site returns that OS error, as
//!   a failing disk or a full one would;
//! - `pause`: a [`failpoint_pause`] site holds its thread until the file
//!   `<name>.resume` exists in `WEIR_FAILPOINT_DIR` (a test makes another
//!   writer's commit land exactly there, then lets it go on).
//!
//! Unset, a failpoint costs one load of an already initialised value.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

struct Armed {
    first: u64,
    last: u64,
    hits: AtomicU64,
}

static ARMED: OnceLock<HashMap<String, Armed>> = OnceLock::new();

/// EIO and ENOSPC: the same numbers on Linux and the BSDs.
const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn armed() -> &'static HashMap<String, Armed> {
    ARMED.get_or_init(|| {
        let mut m = HashMap::new();
        if let Ok(spec) = std::env::var("WEIR_FAILPOINTS") {
            for item in spec.split(',').filter(|s| !s.trim().is_empty()) {
                let mut parts = item.split(':');
                let name = parts.next().unwrap_or_default().trim();
                let hits = parts.next().unwrap_or("1").trim();
                let (first, last) = match hits.split_once('-') {
                    Some((a, b)) => (a.trim().parse().unwrap_or(1), b.trim().parse().unwrap_or(u64::MAX)),
                    None => {
                        let k = hits.parse().unwrap_or(1);
                        (k, k)
                    }
                };
                // Each mode is keyed apart, so one name can be armed for
                // several kinds of site.
                let key = match parts.next().map(str::trim) {
                    Some(mode @ ("error" | "eio" | "enospc" | "pause")) => format!("{name}#{mode}"),
                    _ => name.to_string(),
                };
                m.insert(
                    key,
                    Armed {
                        first,
                        last,
                        hits: AtomicU64::new(0),
                    },
                );
            }
        }
        m
    })
}

/// The pass number if `key` is armed and this pass is in its range.
fn hit(key: &str) -> Option<u64> {
    let a = armed().get(key)?;
    let n = a.hits.fetch_add(1, Ordering::SeqCst) + 1;
    (a.first..=a.last).contains(&n).then_some(n)
}

/// An error on the armed passes of `name` if armed as `name:k:error`.
pub fn failpoint_error(name: &str) -> Result<(), String> {
    if armed().is_empty() {
        return Ok(());
    }
    match hit(&format!("{name}#error")) {
        Some(k) => Err(format!("failpoint {name} hit {k} time(s): injected task failure")),
        None => Ok(()),
    }
}

/// An OS error (EIO or ENOSPC) on the armed passes of `name` if armed as
/// `name:k:eio` or `name:k:enospc`. Each pass counts for both modes.
pub fn failpoint_io(name: &str) -> std::io::Result<()> {
    if armed().is_empty() {
        return Ok(());
    }
    for (mode, errno) in [("eio", EIO), ("enospc", ENOSPC)] {
        if let Some(k) = hit(&format!("{name}#{mode}")) {
            tracing::warn!("failpoint {name} hit {k} time(s): injected {}", mode.to_uppercase());
            return Err(std::io::Error::from_raw_os_error(errno));
        }
    }
    Ok(())
}

/// Holds this thread on the armed passes of `name` if armed as
/// `name:k:pause`, until `<WEIR_FAILPOINT_DIR>/<name>.resume` exists
/// (checked every 10 ms; the site's caller is the one waiting, not a test
/// synchronising on time). Says so on stderr first, so the test knows.
pub fn failpoint_pause(name: &str) {
    if armed().is_empty() {
        return;
    }
    if let Some(k) = hit(&format!("{name}#pause")) {
        let dir = std::env::var_os("WEIR_FAILPOINT_DIR").map_or_else(|| std::path::PathBuf::from("."), Into::into);
        let resume = dir.join(format!("{name}.resume"));
        eprintln!(
            "failpoint {name} hit {k} time(s): paused until {} exists",
            resume.display()
        );
        while !resume.exists() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        eprintln!("failpoint {name}: resumed");
    }
}

/// Aborts the process if `name` is armed and this is an armed pass.
pub fn failpoint(name: &str) {
    if armed().is_empty() {
        return;
    }
    if let Some(k) = hit(name) {
        eprintln!("failpoint {name} hit {k} time(s): aborting");
        std::process::abort();
    }
}
