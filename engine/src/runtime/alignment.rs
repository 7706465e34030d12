//! Watermark alignment (FLIP-182/217, Flink 2.3's FLINK-37399): source
//! readers in one alignment group stay within a maximum drift of each
//! other by pausing the splits that run ahead.
//!
//! - [`AlignmentCoordinator`]: one per group and job. Every update interval
//!   it takes the minimum of the readers' last reports and announces it.
//!   Readers that report `MAX` (idle or finished) never hold the group
//!   back; readers with no watermark yet report nothing.
//! - [`SplitAlignment`]: the per-split policy. Each split's watermark is
//!   sampled every update interval into a ring of the last `buffer-size`
//!   samples; a split is paused when the **oldest** sample is above
//!   `max_allowed = group_min + max_drift` (with buffer size 0: its current
//!   watermark), and resumed once its current watermark is back at or below
//!   it. Until the ring is full no pause is decided (cold start).
//!
//! The coordinator's announcements and the readers' reports run on
//! independent timers, as in Flink; tokio's clock drives both, so tests run
//! them with a paused, manually advanced clock.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::message::{MAX_WATERMARK, Timestamp};

/// Which reader reported: (source node, subtask).
pub type ReaderId = (usize, usize);

#[derive(Debug)]
pub struct AlignmentCoordinator {
    pub group: String,
    pub update_interval: Duration,
    /// The largest max drift of the group's members (for SHOW WATERMARKS).
    pub max_drift_ms: std::sync::atomic::AtomicI64,
    /// Warn when the spread stays above this (0: twice the max drift).
    pub spread_alert_ms: std::sync::atomic::AtomicI64,
    reports: Mutex<HashMap<ReaderId, Timestamp>>,
    /// The announced group minimum (`None` before the first announcement).
    announced: watch::Sender<Option<Timestamp>>,
    /// A job spread over workers: on workers other than 0 the group
    /// minimum comes from worker 0's coordinator (over all workers'
    /// readers), not from this one's readers alone.
    follower: std::sync::atomic::AtomicBool,
}

impl AlignmentCoordinator {
    pub fn new(group: String, update_interval: Duration) -> Arc<Self> {
        let (announced, _) = watch::channel(None);
        Arc::new(Self {
            group,
            update_interval,
            max_drift_ms: std::sync::atomic::AtomicI64::new(0),
            spread_alert_ms: std::sync::atomic::AtomicI64::new(0),
            reports: Mutex::new(HashMap::new()),
            announced,
            follower: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Takes the group minimum from worker 0 (see [`Self::follow`]).
    pub fn set_follower(&self) {
        self.follower.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A follower's announcement: the minimum worker 0 computed.
    pub fn follow(&self, group_min: Timestamp) {
        self.announced.send_replace(Some(group_min));
    }

    /// Every reader's last report (what a follower sends worker 0).
    pub fn reports(&self) -> Vec<(ReaderId, Timestamp)> {
        self.reports
            .lock()
            .map(|r| r.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default()
    }

    /// A reader's watermark (`MAX` when idle or finished).
    pub fn report(&self, reader: ReaderId, watermark: Timestamp) {
        if let Ok(mut r) = self.reports.lock() {
            r.insert(reader, watermark);
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<Timestamp>> {
        self.announced.subscribe()
    }

    /// The group minimum over every reader that reported.
    pub fn group_min(&self) -> Option<Timestamp> {
        self.reports.lock().ok().and_then(|r| r.values().copied().min())
    }

    /// Highest minus lowest reported watermark of readers that have one
    /// and are not idle or finished.
    pub fn spread(&self) -> Option<i64> {
        let r = self.reports.lock().ok()?;
        let live: Vec<i64> = r.values().copied().filter(|w| *w != MAX_WATERMARK).collect();
        let (min, max) = (live.iter().min()?, live.iter().max()?);
        Some(max.saturating_sub(*min))
    }

    /// Announces the current minimum to every reader (every reader, also
    /// those with no more splits to read: FLINK-37670).
    pub fn announce(&self) {
        if let Some(min) = self.group_min() {
            self.announced.send_replace(Some(min));
        }
    }

    /// Runs the periodic announcement until the job ends.
    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.update_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut had_readers = false;
        let mut above = 0u32;
        loop {
            tick.tick().await;
            if self.follower.load(std::sync::atomic::Ordering::Relaxed) {
                // Worker 0 announces (and alerts) for the whole group.
                let readers = self.announced.receiver_count();
                had_readers |= readers > 0;
                if had_readers && readers == 0 {
                    return;
                }
                continue;
            }
            self.announce();
            // The alert the seed recommends: the spread between source
            // watermarks stays wide (alignment off, too loose, or stuck).
            let drift = self.max_drift_ms.load(std::sync::atomic::Ordering::Relaxed);
            let alert = match self.spread_alert_ms.load(std::sync::atomic::Ordering::Relaxed) {
                0 => drift.saturating_mul(2).max(1_000),
                v => v,
            };
            match self.spread() {
                Some(s) if s > alert => {
                    above += 1;
                    if above == 3 {
                        tracing::warn!(
                            "watermark spread in alignment group '{}' has stayed above {} ms for 3 intervals ({} ms)",
                            self.group,
                            alert,
                            s
                        );
                    }
                }
                _ => above = 0,
            }
            // Readers subscribe when they start, which may be after us.
            let readers = self.announced.receiver_count();
            had_readers |= readers > 0;
            if had_readers && readers == 0 {
                return;
            }
        }
    }
}

/// `group_min + max_drift`, saturating: when every reader is idle or
/// finished the minimum is `MAX` and so is the bound (FLINK-31632).
pub fn max_allowed(group_min: Timestamp, max_drift_ms: i64) -> Timestamp {
    group_min.saturating_add(max_drift_ms)
}

/// The alignment state of one split.
#[derive(Debug, Clone, Default)]
pub struct SplitAlignment {
    samples: VecDeque<Timestamp>,
    pub paused: bool,
}

impl SplitAlignment {
    /// Takes this interval's sample of the split's watermark.
    pub fn sample(&mut self, watermark: Timestamp, buffer_size: usize) {
        if buffer_size == 0 {
            return;
        }
        self.samples.push_back(watermark);
        while self.samples.len() > buffer_size {
            self.samples.pop_front();
        }
    }

    /// The watermark the pause decision looks at: the oldest of the last
    /// `buffer_size` samples, or the current one with a buffer of 0.
    pub fn comparand(&self, current: Timestamp, buffer_size: usize) -> Option<Timestamp> {
        if buffer_size == 0 {
            Some(current)
        } else if self.samples.len() >= buffer_size {
            self.samples.front().copied()
        } else {
            None
        }
    }

    /// Decides pause or resume against `max_allowed`; returns true when the
    /// state changed. Idle splits are never paused, and a paused split that
    /// went idle is resumed (FLINK-40093).
    pub fn decide(&mut self, current: Timestamp, idle: bool, max_allowed: Timestamp, buffer_size: usize) -> bool {
        let before = self.paused;
        if idle {
            self.paused = false;
        } else if self.paused {
            if current <= max_allowed {
                self.paused = false;
            }
        } else if self.comparand(current, buffer_size).is_some_and(|c| c > max_allowed) {
            self.paused = true;
        }
        before != self.paused
    }

    /// Forgets the samples (after a restore: alignment is not checkpointed).
    pub fn reset(&mut self) {
        self.samples.clear();
        self.paused = false;
    }
}

/// What a reader reports: `MAX` when idle or finished, its watermark when
/// it has one, nothing before its first watermark (FLINK-32414).
pub fn reader_report(idle_or_finished: bool, watermark: Option<Timestamp>) -> Option<Timestamp> {
    if idle_or_finished {
        Some(MAX_WATERMARK)
    } else {
        watermark.filter(|w| *w > crate::message::MIN_WATERMARK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_allowed_saturates() {
        assert_eq!(max_allowed(MAX_WATERMARK, 30_000), MAX_WATERMARK);
        assert_eq!(max_allowed(1_000, 0), 1_000);
    }

    #[test]
    fn buffer_zero_pauses_on_the_current_watermark() {
        let mut s = SplitAlignment::default();
        assert!(!s.decide(100, false, 100, 0), "equal to the bound is allowed (drift 0)");
        assert!(s.decide(101, false, 100, 0));
        assert!(s.paused);
        assert!(!s.decide(150, false, 120, 0), "stays paused while above");
        assert!(s.decide(120, false, 120, 0), "resumes at or below the bound");
    }

    #[test]
    fn buffer_three_decides_on_the_oldest_sample() {
        let mut s = SplitAlignment::default();
        for w in [10, 50, 90] {
            s.sample(w, 3);
        }
        // Current watermark far ahead, but the oldest sample (10) is fine.
        assert!(!s.decide(200, false, 40, 3));
        s.sample(200, 3); // ring: 50, 90, 200
        assert!(s.decide(200, false, 40, 3), "oldest (50) > 40");
        // Resume uses the current watermark.
        assert!(!s.decide(200, false, 150, 3));
        assert!(s.decide(150, false, 150, 3));
    }

    #[test]
    fn cold_start_needs_a_full_ring() {
        let mut s = SplitAlignment::default();
        s.sample(1_000, 3);
        assert_eq!(s.comparand(1_000, 3), None);
        assert!(!s.decide(1_000, false, 0, 3));
    }

    #[test]
    fn idle_splits_are_never_paused_and_paused_idle_ones_resume() {
        let mut s = SplitAlignment::default();
        assert!(!s.decide(1_000, true, 0, 0));
        assert!(s.decide(1_000, false, 0, 0));
        assert!(s.decide(1_000, true, 0, 0), "FLINK-40093: resumable once idle");
        assert!(!s.paused);
    }

    #[test]
    fn reports_follow_flink() {
        assert_eq!(reader_report(true, None), Some(MAX_WATERMARK));
        assert_eq!(reader_report(false, None), None);
        assert_eq!(reader_report(false, Some(crate::message::MIN_WATERMARK)), None);
        assert_eq!(reader_report(false, Some(5)), Some(5));
    }

    #[test]
    fn coordinator_min_ignores_silent_readers_and_saturates() {
        let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
        let mut rx = c.subscribe();
        c.announce();
        assert_eq!(*rx.borrow_and_update(), None, "nothing reported, nothing announced");
        c.report((0, 0), 5_000);
        c.report((1, 0), MAX_WATERMARK); // an idle member of another table
        c.announce();
        assert_eq!(*rx.borrow_and_update(), Some(5_000));
        c.report((0, 0), MAX_WATERMARK);
        c.announce();
        assert_eq!(*rx.borrow_and_update(), Some(MAX_WATERMARK));
        assert_eq!(max_allowed(MAX_WATERMARK, 30_000), MAX_WATERMARK);
    }
}
