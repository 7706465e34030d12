//! Named failpoints for crash tests. `WEIR_FAILPOINTS=name:k[,name:k]`
//! makes the process abort (no destructors, no flushing: like `kill -9`)
//! on the k-th time it passes `name`. Unset, a failpoint costs one load of
//! an already initialised value.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static ARMED: OnceLock<HashMap<String, (u64, AtomicU64)>> = OnceLock::new();

fn armed() -> &'static HashMap<String, (u64, AtomicU64)> {
    ARMED.get_or_init(|| {
        let mut m = HashMap::new();
        if let Ok(spec) = std::env::var("WEIR_FAILPOINTS") {
            for item in spec.split(',').filter(|s| !s.trim().is_empty()) {
                let (name, k) = item.split_once(':').unwrap_or((item, "1"));
                let k = k.trim().parse().unwrap_or(1);
                m.insert(name.trim().to_string(), (k, AtomicU64::new(0)));
            }
        }
        m
    })
}

/// Aborts the process if `name` is armed and this is its k-th hit.
pub fn failpoint(name: &str) {
    let points = armed();
    if points.is_empty() {
        return;
    }
    if let Some((k, hits)) = points.get(name)
        && hits.fetch_add(1, Ordering::SeqCst) + 1 == *k
    {
        eprintln!("failpoint {name} hit {k} time(s): aborting");
        std::process::abort();
    }
}
