//! Event-time windows: assigners (which windows a row belongs to) and the
//! window aggregate operator.

pub mod aggregate;

use crate::message::Timestamp;
use crate::plan::{WindowKind, WindowSpec};

/// Calls `f(start, end)` for every window containing `ts`, in ascending
/// order of end.
pub fn assign_windows(spec: &WindowSpec, ts: Timestamp, mut f: impl FnMut(i64, i64)) {
    match spec.kind {
        WindowKind::Tumble => {
            let start = ts - (ts - spec.offset).rem_euclid(spec.size);
            f(start, start.saturating_add(spec.size));
        }
        WindowKind::Hop => {
            let last_start = ts - (ts - spec.offset).rem_euclid(spec.slide);
            // Starts in (ts - size, last_start], oldest (smallest end) first.
            let mut start = last_start - ((spec.size - 1) / spec.slide) * spec.slide;
            while start <= last_start {
                if start > ts - spec.size {
                    f(start, start.saturating_add(spec.size));
                }
                start += spec.slide;
            }
        }
        WindowKind::Cumulate => {
            let start = ts - (ts - spec.offset).rem_euclid(spec.size);
            let first_end = start + ((ts - start) / spec.slide + 1) * spec.slide;
            let mut end = first_end;
            while end <= start + spec.size {
                f(start, end);
                end += spec.slide;
            }
        }
    }
}

/// The start of the window that ends at `end`.
pub fn window_start(spec: &WindowSpec, end: i64) -> i64 {
    match spec.kind {
        WindowKind::Tumble | WindowKind::Hop => end - spec.size,
        WindowKind::Cumulate => {
            let last = end - 1;
            last - (last - spec.offset).rem_euclid(spec.size)
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
    fn fired_means_end_minus_one_reached() {
        assert!(!is_fired(10, 8));
        assert!(is_fired(10, 9));
        assert!(is_fired(i64::MIN, i64::MIN));
    }
}
