//! What a restart strategy (`restart-strategy.type`, Flink's options and
//! defaults) decides after each failure: restart after a wait, or fail
//! the job for good.
//!
//! In one process the job's supervisor asks after each failed attempt.
//! Across workers a failed attempt ends every worker and the process
//! supervisor (Kubernetes) starts them again, so worker 0 asks when it
//! starts: the failures so far are the restarts recorded in the
//! checkpoint log (see [`super::resume::restarts`]), replayed.

use std::time::Duration;

use crate::config::RestartStrategy;

/// The failures a strategy has seen, and what it decided.
#[derive(Debug, Clone)]
pub struct Restarts {
    strategy: RestartStrategy,
    /// fixed-delay: failures so far; exponential-delay: since the last
    /// reset.
    count: u32,
    /// failure-rate: the failures' times (ms), newest last.
    times: Vec<i64>,
    /// exponential-delay: the current wait (ms), and when the last restart
    /// was (ms): a run that lasted the reset threshold resets the wait.
    backoff_ms: f64,
    restarted_at: Option<i64>,
}

impl Restarts {
    pub fn new(strategy: RestartStrategy) -> Self {
        Restarts {
            strategy,
            count: 0,
            times: vec![],
            backoff_ms: 0.0,
            restarted_at: None,
        }
    }

    /// A strategy that has seen failures at `past` (ms, oldest first), as
    /// a restarted worker 0 reads them from the log.
    pub fn replay(strategy: RestartStrategy, past: &[i64]) -> Self {
        let mut r = Self::new(strategy);
        for t in past {
            let _ = r.decide(*t, false);
        }
        r
    }

    /// A failure at `now_ms`: the wait before the restart, or why the job
    /// fails for good.
    pub fn failed(&mut self, now_ms: i64) -> Result<Duration, String> {
        self.decide(now_ms, true)
    }

    fn decide(&mut self, now_ms: i64, jittered: bool) -> Result<Duration, String> {
        match self.strategy {
            RestartStrategy::None => Err("'restart-strategy.type' is none: a failure ends the job".into()),
            RestartStrategy::FixedDelay { attempts, delay } => {
                self.count = self.count.saturating_add(1);
                if self.count > attempts {
                    return Err(format!(
                        "it failed {} times and the fixed-delay restart strategy allows {attempts} restarts \
                         ('restart-strategy.fixed-delay.attempts')",
                        self.count
                    ));
                }
                Ok(delay)
            }
            RestartStrategy::FailureRate {
                max_failures,
                interval,
                delay,
            } => {
                self.times.push(now_ms);
                let since = now_ms.saturating_sub(interval.as_millis() as i64);
                self.times.retain(|t| *t >= since);
                if self.times.len() > max_failures as usize {
                    return Err(format!(
                        "it failed {} times within {interval:?} and the failure-rate restart strategy allows {max_failures} \
                         ('restart-strategy.failure-rate.max-failures-per-interval')",
                        self.times.len()
                    ));
                }
                Ok(delay)
            }
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                multiplier,
                reset_threshold,
                jitter,
                attempts,
            } => {
                let ran_ms = self.restarted_at.map(|at| now_ms.saturating_sub(at));
                match ran_ms {
                    // The first failure, or one after a run long enough:
                    // the wait and the attempts start over.
                    None => {
                        self.backoff_ms = initial.as_millis() as f64;
                        self.count = 0;
                    }
                    Some(ran) if ran >= reset_threshold.as_millis() as i64 => {
                        self.backoff_ms = initial.as_millis() as f64;
                        self.count = 0;
                    }
                    Some(_) => {
                        self.backoff_ms = (self.backoff_ms * multiplier).min(max.as_millis() as f64);
                    }
                }
                self.count = self.count.saturating_add(1);
                if self.count > attempts {
                    return Err(format!(
                        "it failed {} times without a run of {reset_threshold:?}, and the exponential-delay restart \
                         strategy allows {attempts} ('restart-strategy.exponential-delay.attempts-before-reset-backoff')",
                        self.count
                    ));
                }
                let mut wait = self.backoff_ms;
                if jittered && jitter > 0.0 {
                    // Up to `jitter` of the wait, added or taken off, so
                    // jobs failing together do not restart together.
                    wait += wait * jitter * (2.0 * unit_random() - 1.0);
                }
                let wait = Duration::from_millis(wait.max(0.0) as u64);
                self.restarted_at = Some(now_ms.saturating_add(wait.as_millis() as i64));
                Ok(wait)
            }
        }
    }
}

/// A number in [0, 1) that differs between calls and processes.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1000;

    #[test]
    fn fixed_delay_allows_its_attempts_then_gives_up() {
        let mut r = Restarts::new(RestartStrategy::FixedDelay {
            attempts: 2,
            delay: Duration::from_millis(100),
        });
        assert_eq!(r.failed(0), Ok(Duration::from_millis(100)));
        assert_eq!(r.failed(S), Ok(Duration::from_millis(100)));
        let why = r.failed(2 * S).expect_err("gives up");
        assert!(
            why.contains("failed 3 times") && why.contains("fixed-delay.attempts"),
            "{why}"
        );
        // Replayed from a log, the count carries on.
        let mut r = Restarts::replay(
            RestartStrategy::FixedDelay {
                attempts: 2,
                delay: Duration::ZERO,
            },
            &[0, S],
        );
        assert!(r.failed(2 * S).is_err());
        assert!(Restarts::new(RestartStrategy::None).failed(0).is_err());
    }

    #[test]
    fn failure_rate_counts_only_the_interval() {
        let strategy = RestartStrategy::FailureRate {
            max_failures: 2,
            interval: Duration::from_secs(60),
            delay: Duration::from_secs(1),
        };
        let mut r = Restarts::new(strategy);
        assert!(r.failed(0).is_ok());
        assert!(r.failed(30 * S).is_ok());
        // The first is out of the interval by now.
        assert!(r.failed(61 * S).is_ok());
        let why = r.failed(62 * S).expect_err("gives up");
        assert!(why.contains("3 times within"), "{why}");
    }

    #[test]
    fn exponential_delay_grows_to_its_cap_and_resets_after_a_long_run() {
        let strategy = RestartStrategy::ExponentialDelay {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
            multiplier: 2.0,
            reset_threshold: Duration::from_secs(3600),
            jitter: 0.0,
            attempts: 6,
        };
        let mut r = Restarts::new(strategy);
        let waits: Vec<u64> = (0..5)
            .map(|i| r.failed(i * 20 * S).map(|d| d.as_secs()).unwrap_or(0))
            .collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 10]);
        // A run of over an hour since the last restart: back to 1 s, and
        // the attempts start over.
        assert_eq!(r.failed(2 * 3600 * S), Ok(Duration::from_secs(1)));
        for i in 1..6 {
            assert!(r.failed(2 * 3600 * S + i * S).is_ok(), "attempt {i}");
        }
        let why = r.failed(2 * 3600 * S + 10 * S).expect_err("gives up");
        assert!(why.contains("attempts-before-reset-backoff"), "{why}");
    }

    #[test]
    fn jitter_stays_within_its_share_of_the_wait() {
        let strategy = RestartStrategy::ExponentialDelay {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(10),
            multiplier: 1.5,
            reset_threshold: Duration::from_secs(3600),
            jitter: 0.1,
            attempts: u32::MAX,
        };
        for i in 0..50 {
            let wait = Restarts::new(strategy).failed(i).expect("restarts");
            assert!(
                wait >= Duration::from_secs(9) && wait <= Duration::from_secs(11),
                "{wait:?}"
            );
        }
    }
}
