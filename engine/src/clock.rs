//! Processing time: the one clock every "what time is it now" reads —
//! state TTL stamps and expiry, processing-time windows and interval
//! joins, the runtime's processing-time ticks, a file sink's partition
//! commits. The job's [`crate::config::JobConfig::clock`] is passed to
//! each of them, so a test drives processing time by setting one
//! [`Clock::Driven`] (as it drives watermark alignment with tokio's
//! paused clock), never by sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system's wall clock, in ms since the epoch.
    #[default]
    Wall,
    /// A time its owner sets (tests): every holder of a clone reads it.
    Driven(Arc<AtomicI64>),
}

impl Clock {
    /// A driven clock starting at `ms`.
    pub fn driven(ms: i64) -> Self {
        Clock::Driven(Arc::new(AtomicI64::new(ms)))
    }

    /// Now, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::Wall => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            Clock::Driven(t) => t.load(Ordering::Acquire),
        }
    }

    /// Sets a driven clock to `ms`; the wall clock cannot be set (false).
    pub fn set_ms(&self, ms: i64) -> bool {
        match self {
            Clock::Wall => false,
            Clock::Driven(t) => {
                t.store(ms, Ordering::Release);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driven_clock_is_shared_by_its_clones_and_the_wall_clock_is_not_settable() {
        let c = Clock::driven(1000);
        let seen = c.clone();
        assert_eq!(seen.now_ms(), 1000);
        assert!(c.set_ms(61_000));
        assert_eq!(seen.now_ms(), 61_000);
        let wall = Clock::Wall;
        assert!(!wall.set_ms(0));
        assert!(wall.now_ms() > 1_700_000_000_000, "the wall clock is the epoch's");
    }
}
