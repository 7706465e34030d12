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
use std::hash::BuildHasher;

use datafusion::logical_expr::GroupsAccumulator;
use hashbrown::HashTable;

use crate::keygroup::KeyGroup;

/// Hashes keys for [`Pane::group`]: once a row, whatever the number of
/// windows (panes) it updates.
#[derive(Clone, Default)]
pub struct KeyHasher(hashbrown::DefaultHashBuilder);

impl KeyHasher {
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.0.hash_one(key)
    }
}

/// One window's groups.
///
/// Keys live end to end in one buffer and the index holds (hash, group):
/// a lookup compares bytes in a compact array, not behind a pointer per
/// key (the pointer chase was a third of a many-keys HOP's CPU).
#[derive(Default)]
pub struct Pane {
    index: HashTable<(u64, u32)>,
    bytes: Vec<u8>,
    /// Where key `g` ends in `bytes` (it starts where `g - 1` ends).
    ends: Vec<usize>,
    /// Key `g`'s hash, so merging the pane elsewhere does not rehash.
    hashes: Vec<u64>,
    /// Group index → its key group.
    pub groups: Vec<KeyGroup>,
    /// Created on the first update.
    pub accs: Vec<Box<dyn GroupsAccumulator>>,
}

impl Pane {
    /// Key (Weir's encoding) of group `g`.
    pub fn key(&self, g: usize) -> &[u8] {
        let start = if g == 0 { 0 } else { self.ends[g - 1] };
        &self.bytes[start..self.ends[g]]
    }

    pub fn hash(&self, g: usize) -> u64 {
        self.hashes[g]
    }

    /// Every key, in group order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|g| self.key(g))
    }

    /// The group index of `key` (whose hash is `hash`), added if new
    /// (`group` is its key group).
    pub fn group(&mut self, key: &[u8], hash: u64, group: impl FnOnce() -> KeyGroup) -> (usize, bool) {
        let (bytes, ends) = (&self.bytes, &self.ends);
        let key_of = |g: u32| {
            let g = g as usize;
            let start = if g == 0 { 0 } else { ends[g - 1] };
            &bytes[start..ends[g]]
        };
        if let Some(&(_, g)) = self.index.find(hash, |&(h, g)| h == hash && key_of(g) == key) {
            return (g as usize, false);
        }
        let g = self.ends.len();
        self.index.insert_unique(hash, (hash, g as u32), |&(h, _)| h);
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
        self.hashes.push(hash);
        self.groups.push(group());
        (g, true)
    }

    /// Room for `n` more groups of about `key_len` bytes each.
    pub fn reserve(&mut self, n: usize, key_len: usize) {
        self.index.reserve(n, |&(h, _)| h);
        self.bytes.reserve(n * key_len);
        self.ends.reserve(n);
        self.hashes.reserve(n);
        self.groups.reserve(n);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
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
