//! Window slicing for HOP and CUMULATE (Flink's slice-shared windows).
//!
//! A HOP window of 10 s every 2 s holds five 2 s slices, and each slice is
//! in five windows. Updating every window a row is in costs five group
//! lookups and updates a row; here a row updates the one slice it is in,
//! and a window is assembled from its slices when it is due: per window,
//! one lookup per group of each slice and one vectorised merge of the
//! slice's accumulator states — not one lookup per row and window.
//!
//! A slice takes rows until the watermark passes its end. Then it is
//! *frozen*: its accumulators become their state columns, read (never
//! consumed) by each of its windows as they come due, and dropped after
//! the last. A row arriving for a frozen slice (late for its first
//! windows, not for all) goes straight to the windows still open, as
//! without slicing.
//!
//! Slices are memory only. Window state as stored, snapshotted and
//! restored is per window end, as without slicing: before a snapshot or a
//! flush to RocksDB, every slice is merged into the panes of the windows
//! it has not reached yet ([`Slices::spill`]), so checkpoints, savepoints
//! and rescaling see the same state either way.

use std::collections::BTreeMap;

use arrow::array::ArrayRef;

use super::panes::Pane;
use crate::plan::{WindowKind, WindowSpec};

/// The slice geometry of a window spec.
#[derive(Debug, Clone, Copy)]
pub struct Slicer {
    spec: WindowSpec,
    /// Slice length: gcd(size, slide) for HOP, the step for CUMULATE.
    slice: i64,
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn fits(v: i128) -> Option<i64> {
    i64::try_from(v).ok()
}

impl Slicer {
    /// `None` when slicing does not pay (TUMBLE: a slice is the window) or
    /// does not apply (a CUMULATE size that is not a multiple of its step).
    pub fn new(spec: &WindowSpec) -> Option<Self> {
        if spec.size < 1 || spec.slide < 1 {
            return None;
        }
        let slice = match spec.kind {
            WindowKind::Tumble => return None,
            WindowKind::Hop => gcd(spec.size, spec.slide),
            WindowKind::Cumulate if spec.size % spec.slide == 0 => spec.slide,
            WindowKind::Cumulate | WindowKind::Session => return None,
        };
        // One slice per window: nothing to share.
        (slice < spec.size).then_some(Self { spec: *spec, slice })
    }

    /// The end of the slice holding `ts`, `None` near the ends of the
    /// time range (those rows take the per-window path).
    pub fn slice_end(&self, ts: i64) -> Option<i64> {
        let (ts, slice, offset) = (i128::from(ts), i128::from(self.slice), i128::from(self.spec.offset));
        let end = ts - (ts - offset).rem_euclid(slice) + slice;
        // Its last window must fit too.
        fits(end + i128::from(self.spec.size))?;
        fits(end)
    }

    /// The ends of the first and last windows holding the slice ending at
    /// `end` (windows in between are every `slide`).
    pub fn windows(&self, end: i64) -> (i64, i64) {
        let (end, size, slide, offset, slice) = (
            i128::from(end),
            i128::from(self.spec.size),
            i128::from(self.spec.slide),
            i128::from(self.spec.offset),
            i128::from(self.slice),
        );
        let (first, last) = match self.spec.kind {
            WindowKind::Hop => {
                // Window starts are `offset + k * slide`, so ends are
                // `offset + size + k * slide`; those holding the slice
                // are in [end, end - slice + size].
                let align = offset + size;
                let first = end + (align - end).rem_euclid(slide);
                let x = end - slice + size;
                (first, x - (x - align).rem_euclid(slide))
            }
            _ => {
                // CUMULATE: the windows of the slice's period from its end on.
                let start = (end - slice) - ((end - slice) - offset).rem_euclid(size);
                (end, start + size)
            }
        };
        (
            first.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            last.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
        )
    }

    pub fn slide(&self) -> i64 {
        self.spec.slide
    }
}

/// A slice no more rows go to: its keys and accumulator state columns.
pub struct Frozen {
    pub pane: Pane,
    pub states: Vec<ArrayRef>,
    /// The next window end it has not been merged into.
    pub next_window: i64,
    pub last_window: i64,
}

/// The live and frozen slices of one operator subtask.
#[derive(Default)]
pub struct Slices {
    pub live: BTreeMap<i64, Pane>,
    pub frozen: BTreeMap<i64, Frozen>,
}

impl Slices {
    pub fn groups(&self) -> usize {
        self.live.values().map(Pane::len).sum::<usize>() + self.frozen.values().map(|f| f.pane.len()).sum::<usize>()
    }

    /// Live slices whose end the watermark passed, in end order.
    pub fn take_ended(&mut self, watermark: i64) -> Vec<(i64, Pane)> {
        let mut out = vec![];
        while let Some(e) = self.live.first_entry() {
            if e.key().saturating_sub(1) > watermark {
                break;
            }
            let end = *e.key();
            out.push((end, e.remove()));
        }
        out
    }

    /// Every live slice.
    pub fn take_live(&mut self) -> Vec<(i64, Pane)> {
        std::mem::take(&mut self.live).into_iter().collect()
    }
}

/// The bytes a pane's groups count for in the state-size metrics.
pub fn pane_bytes(pane: &Pane, per_group: i64) -> i64 {
    pane.keys().map(|k| k.len() as i64 + per_group).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::window::assign_windows;

    /// Every row of a slice is in exactly the windows the slice says.
    #[test]
    fn a_slice_is_in_the_windows_of_its_rows() {
        let specs = [
            (WindowKind::Hop, 10, 2, 0),
            (WindowKind::Hop, 10, 4, 0),
            (WindowKind::Hop, 10, 4, 3),
            (WindowKind::Hop, 9, 6, -5),
            (WindowKind::Hop, 5, 10, 1),
            (WindowKind::Cumulate, 12, 4, 0),
            (WindowKind::Cumulate, 12, 3, 5),
        ];
        for (kind, size, slide, offset) in specs {
            let spec = WindowSpec {
                kind,
                size,
                slide,
                offset,
            };
            let Some(s) = Slicer::new(&spec) else {
                assert!(kind == WindowKind::Hop && slide >= size, "{spec:?}");
                continue;
            };
            for ts in -40..40 {
                let end = s.slice_end(ts).expect("in range");
                assert!(end - s.slice <= ts && ts < end, "{spec:?} {ts} {end}");
                let mut want = vec![];
                assign_windows(&spec, ts, |_, e| want.push(e));
                let (first, last) = s.windows(end);
                let got: Vec<i64> = (0..)
                    .map(|k| first + k * s.slide())
                    .take_while(|e| *e <= last)
                    .collect();
                assert_eq!(got, want, "{spec:?} ts {ts}");
            }
        }
    }

    #[test]
    fn tumble_and_uneven_cumulate_are_not_sliced() {
        let t = WindowSpec {
            kind: WindowKind::Tumble,
            size: 10,
            slide: 10,
            offset: 0,
        };
        assert!(Slicer::new(&t).is_none());
        let c = WindowSpec {
            kind: WindowKind::Cumulate,
            size: 10,
            slide: 4,
            offset: 0,
        };
        assert!(Slicer::new(&c).is_none());
    }

    #[test]
    fn times_at_the_ends_of_the_range_take_the_window_path() {
        let spec = WindowSpec {
            kind: WindowKind::Hop,
            size: 10,
            slide: 2,
            offset: 0,
        };
        let s = Slicer::new(&spec).expect("sliced");
        assert!(s.slice_end(i64::MAX - 1).is_none());
        assert!(s.slice_end(i64::MIN).is_some());
    }
}
