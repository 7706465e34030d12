//! Live window state: per window end, a pane of DataFusion
//! `GroupsAccumulator`s over the keys that have rows in it. The heap
//! backend's whole window state, and the RocksDB store's in-memory
//! pre-aggregation buffer (flushed into RocksDB before windows fire and at
//! every snapshot).
//!
//! Rows update the accumulators in place, a batch at a time (no bytes, no
//! per-access serialisation); a window fires by evaluating its pane whole.
//! State becomes bytes only at a snapshot, in the canonical entry form the
//! keyed-state layer writes (`window-acc` and `window-timers` entries, per
//! key group, see [`crate::state::keyed`]), so a heap snapshot restores
//! into RocksDB and back, at any parallelism.

use std::collections::BTreeMap;

// hashbrown with a fast hasher (DataFusion's default map): keys are looked
// up once per row and window.
use datafusion::common::HashMap;
use datafusion::logical_expr::GroupsAccumulator;

use crate::keygroup::KeyGroup;

/// One window's groups.
#[derive(Default)]
pub struct Pane {
    index: HashMap<Box<[u8]>, usize>,
    /// Group index → key (Weir's encoding) and its key group.
    pub keys: Vec<Box<[u8]>>,
    pub groups: Vec<KeyGroup>,
    /// Created on the first update.
    pub accs: Vec<Box<dyn GroupsAccumulator>>,
}

impl Pane {
    /// The group index of `key`, added if new (`group` is its key group).
    pub fn group(&mut self, key: &[u8], group: impl FnOnce() -> KeyGroup) -> (usize, bool) {
        if let Some(g) = self.index.get(key) {
            return (*g, false);
        }
        let g = self.keys.len();
        let boxed: Box<[u8]> = key.into();
        self.index.insert(boxed.clone(), g);
        self.keys.push(boxed);
        self.groups.push(group());
        (g, true)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Panes by window end.
#[derive(Default)]
pub struct Panes {
    panes: BTreeMap<i64, Pane>,
}

impl Panes {
    pub fn pane(&mut self, end: i64) -> &mut Pane {
        self.panes.entry(end).or_default()
    }

    /// The pane with the smallest end if its window has fired at
    /// `watermark` (its last millisecond, `end - 1`, is at or below it).
    pub fn pop_fired(&mut self, watermark: i64) -> Option<(i64, Pane)> {
        let entry = self.panes.first_entry()?;
        if entry.key().saturating_sub(1) > watermark {
            return None;
        }
        let end = *entry.key();
        Some((end, entry.remove()))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&i64, &mut Pane)> {
        self.panes.iter_mut()
    }

    /// Every pane, emptying the set.
    pub fn take_all(&mut self) -> BTreeMap<i64, Pane> {
        std::mem::take(&mut self.panes)
    }
}
