//! Event-time windows: assigners (which windows a row belongs to) and the
//! window aggregate operator.

pub mod aggregate;
pub mod panes;
pub mod session;
pub mod slices;

use crate::message::Timestamp;
use crate::plan::{WindowKind, WindowSpec};

/// A window bound computed in `i128`, clamped to the range of a timestamp:
/// an event time near the ends of `i64` (a BIGINT cast to TIMESTAMP(3), an
/// offset or size of millions of years) overflowed `i64` arithmetic, which
/// panics in a debug build and wraps to a wrong window in a release build.
fn clamp(t: i128) -> i64 {
    t.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Calls `f(start, end)` for every window containing `ts`, in ascending
/// order of end. Windows with a size or slide below 1 ms have no rows (the
/// planner refuses them; this keeps a bad plan from dividing by zero).
pub fn assign_windows(spec: &WindowSpec, ts: Timestamp, mut f: impl FnMut(i64, i64)) {
    if spec.size < 1 || spec.slide < 1 {
        debug_assert!(false, "window spec with a size or slide below 1 ms: {spec:?}");
        return;
    }
    let (ts, size, slide, offset) = (
        i128::from(ts),
        i128::from(spec.size),
        i128::from(spec.slide),
        i128::from(spec.offset),
    );
    match spec.kind {
        WindowKind::Tumble => {
            let start = ts - (ts - offset).rem_euclid(size);
            f(clamp(start), clamp(start + size));
        }
        WindowKind::Hop => {
            let last_start = ts - (ts - offset).rem_euclid(slide);
            // Starts in (ts - size, last_start], oldest (smallest end) first.
            let mut start = last_start - ((size - 1) / slide) * slide;
            while start <= last_start {
                if start > ts - size {
                    f(clamp(start), clamp(start + size));
                }
                start += slide;
            }
        }
        // A row's own session window, before any merge (the session
        // operator merges; this is its proto-window).
        WindowKind::Session => f(clamp(ts), clamp(ts + size)),
        WindowKind::Cumulate => {
            let start = ts - (ts - offset).rem_euclid(size);
            let mut end = start + ((ts - start) / slide + 1) * slide;
            while end <= start + size {
                f(clamp(start), clamp(end));
                end += slide;
            }
        }
    }
}

/// The start of the window that ends at `end`.
pub fn window_start(spec: &WindowSpec, end: i64) -> i64 {
    let (end, size, offset) = (i128::from(end), i128::from(spec.size), i128::from(spec.offset));
    match spec.kind {
        WindowKind::Tumble | WindowKind::Hop | WindowKind::Session => clamp(end - size),
        WindowKind::Cumulate if size < 1 => clamp(end),
        WindowKind::Cumulate => {
            let last = end - 1;
            clamp(last - (last - offset).rem_euclid(size))
        }
    }
}

/// Flink's `isWindowFired`: the window `[start, end)` has fired once the
/// watermark reached `end - 1`.
pub fn is_fired(end: i64, watermark: Timestamp) -> bool {
    end.saturating_sub(1) <= watermark
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(spec: WindowSpec, ts: i64) -> Vec<(i64, i64)> {
        let mut v = vec![];
        assign_windows(&spec, ts, |s, e| v.push((s, e)));
        v
    }

    #[test]
    fn tumble_hop_cumulate() {
        let t = WindowSpec {
            kind: WindowKind::Tumble,
            size: 10,
            slide: 10,
            offset: 0,
        };
        assert_eq!(windows(t, 15), vec![(10, 20)]);
        assert_eq!(windows(t, -1), vec![(-10, 0)]);
        let h = WindowSpec {
            kind: WindowKind::Hop,
            size: 10,
            slide: 4,
            offset: 0,
        };
        assert_eq!(windows(h, 9), vec![(0, 10), (4, 14), (8, 18)]);
        assert_eq!(windows(h, 10), vec![(4, 14), (8, 18)]);
        let c = WindowSpec {
            kind: WindowKind::Cumulate,
            size: 10,
            slide: 5,
            offset: 0,
        };
        assert_eq!(windows(c, 3), vec![(0, 5), (0, 10)]);
        assert_eq!(windows(c, 7), vec![(0, 10)]);
        assert_eq!(window_start(&c, 5), 0);
        assert_eq!(window_start(&c, 10), 0);
        let off = WindowSpec {
            kind: WindowKind::Tumble,
            size: 10,
            slide: 10,
            offset: 3,
        };
        assert_eq!(windows(off, 12), vec![(3, 13)]);
        assert_eq!(windows(off, 2), vec![(-7, 3)]);
    }

    #[test]
    fn event_times_at_the_ends_of_the_range_do_not_overflow() {
        // Regression (fuzz): these overflowed i64 and panicked in debug builds.
        for kind in [WindowKind::Tumble, WindowKind::Hop, WindowKind::Cumulate] {
            for (size, slide, offset) in [
                (10, 5, 0),
                (i64::MAX, i64::MAX, i64::MAX - 1),
                (i64::MAX - 1, (i64::MAX - 1) / 2, 1),
            ] {
                let spec = WindowSpec {
                    kind,
                    size,
                    slide: if kind == WindowKind::Tumble { size } else { slide },
                    offset,
                };
                for ts in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
                    let mut n = 0;
                    assign_windows(&spec, ts, |start, end| {
                        assert!(start <= end, "{spec:?} {ts}: [{start}, {end})");
                        let _ = window_start(&spec, end);
                        n += 1;
                    });
                    if kind == WindowKind::Tumble {
                        assert_eq!(n, 1, "{spec:?} {ts}");
                    }
                }
            }
        }
    }

    #[test]
    fn fired_means_end_minus_one_reached() {
        assert!(!is_fired(10, 8));
        assert!(is_fired(10, 9));
        assert!(is_fired(i64::MIN, i64::MIN));
    }
}
