//! Named failpoints for crash tests. `WEIR_FAILPOINTS=name:k[,name:k]`
//! makes the process abort (no destructors, no flushing: like `kill -9`)
//! on the k-th time it passes `name`; `name:k:error` makes an
//! [`failpoint_error`] site fail its task instead (a task failure the
//! restart strategy handles). Unset, a failpoint costs one load of an
//! already initialised value.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

type Armed = HashMap<String, (u64, AtomicU64)>;

static ARMED: OnceLock<Armed> = OnceLock::new();

fn armed() -> &'static Armed {
    ARMED.get_or_init(|| {
        let mut m = HashMap::new();
        if let Ok(spec) = std::env::var("WEIR_FAILPOINTS") {
            for item in spec.split(',').filter(|s| !s.trim().is_empty()) {
                let mut parts = item.split(':');
                let name = parts.next().unwrap_or_default().trim();
                let k = parts.next().and_then(|k| k.trim().parse().ok()).unwrap_or(1);
                // `error` sites are keyed apart, so one name cannot be both.
                let key = match parts.next() {
                    Some(mode) if mode.trim() == "error" => format!("{name}#error"),
                    _ => name.to_string(),
                };
                m.insert(key, (k, AtomicU64::new(0)));
            }
        }
        m
    })
}

fn hit(key: &str) -> Option<u64> {
    let (k, hits) = armed().get(key)?;
    (hits.fetch_add(1, Ordering::SeqCst) + 1 == *k).then_some(*k)
}

/// An error on the k-th pass of `name` if armed as `name:k:error`.
pub fn failpoint_error(name: &str) -> Result<(), String> {
    if armed().is_empty() {
        return Ok(());
    }
    match hit(&format!("{name}#error")) {
        Some(k) => Err(format!("failpoint {name} hit {k} time(s): injected task failure")),
        None => Ok(()),
    }
}

/// Aborts the process if `name` is armed and this is its k-th hit.
pub fn failpoint(name: &str) {
    if armed().is_empty() {
        return;
    }
    if let Some(k) = hit(name) {
        eprintln!("failpoint {name} hit {k} time(s): aborting");
        std::process::abort();
    }
}
