//! The `hashmap` backend: ordered maps on the heap (fast, bounded by RAM).

use std::collections::BTreeMap;
use std::ops::{Bound, Range};

use smallvec::SmallVec;

use super::transfer::EntriesWriter;
use super::{StateBackend, StateId, WriteBatch};
use crate::checkpoint::OperatorSnapshot;
use crate::error::StateError;
use crate::keygroup::KeyGroup;

/// A key as the map holds it: up to [`INLINE_KEY`] bytes inside the map's
/// node, so that a lookup's comparisons read the node and not one heap
/// allocation per key passed (the cost of a 1 M-entry map of `Vec` keys
/// was a cache miss per comparison). Ordered as its bytes.
type Key = SmallVec<[u8; INLINE_KEY]>;
const INLINE_KEY: usize = 32;

pub struct HeapBackend {
    states: Vec<BTreeMap<Key, Vec<u8>>>,
}

impl HeapBackend {
    pub fn new(states: usize) -> Self {
        Self {
            states: vec![BTreeMap::new(); states],
        }
    }

    fn state(&self, id: StateId) -> Result<&BTreeMap<Key, Vec<u8>>, StateError> {
        self.states.get(id).ok_or_else(|| StateError::Corrupt {
            state: id.to_string(),
            message: "undeclared state".into(),
        })
    }
}

impl StateBackend for HeapBackend {
    fn snapshot(
        &mut self,
        _checkpoint_id: u64,
        states: &[&str],
        key_groups: Range<KeyGroup>,
    ) -> Result<OperatorSnapshot, StateError> {
        let mut out = EntriesWriter::new()?;
        super::transfer::export(self, states, key_groups.clone(), &mut out)?;
        Ok(OperatorSnapshot::Entries {
            bytes: out.finish()?,
            key_groups,
        })
    }

    fn estimated_bytes(&self) -> i64 {
        let entries = self.states.iter().flat_map(|m| m.iter());
        entries.map(|(k, v)| (k.len() + v.len()) as i64).sum()
    }

    fn multi_get(&self, state: StateId, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let map = self.state(state)?;
        Ok(keys.iter().map(|k| map.get(*k).cloned()).collect())
    }

    fn write(&mut self, batch: WriteBatch) -> Result<(), StateError> {
        for (id, key, value) in batch.ops {
            self.state(id)?;
            let map = &mut self.states[id];
            match value {
                Some(v) => {
                    map.insert(Key::from_vec(key), v);
                }
                None => {
                    map.remove(key.as_slice());
                }
            }
        }
        Ok(())
    }

    fn scan(
        &self,
        state: StateId,
        start: &[u8],
        end: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StateError> {
        let map = self.state(state)?;
        for (k, v) in map.range::<[u8], _>((Bound::Included(start), Bound::Excluded(end))) {
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys held inline and keys longer than that order, scan, read and
    /// delete as their bytes.
    #[test]
    fn short_and_long_keys_order_as_bytes() {
        let mut h = HeapBackend::new(1);
        let keys: Vec<Vec<u8>> = [0usize, 1, 31, 32, 33, 64]
            .iter()
            .flat_map(|n| {
                [
                    vec![7u8; *n],
                    [vec![7u8; *n], vec![0]].concat(),
                    [vec![7u8; *n], vec![9]].concat(),
                ]
            })
            .collect();
        let mut batch = WriteBatch::default();
        for (i, k) in keys.iter().enumerate() {
            batch.put(0, k.clone(), vec![i as u8]);
        }
        h.write(batch).expect("write");
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        let mut seen = vec![];
        h.scan(0, &[], &[0xff], &mut |k, _| {
            seen.push(k.to_vec());
            true
        })
        .expect("scan");
        assert_eq!(seen, sorted);
        let asked: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let got = h.multi_get(0, &asked).expect("get");
        assert!(got.iter().all(Option::is_some));
        // A range from a long key to a short one.
        let mut inside = vec![];
        h.scan(0, &[7u8; 33], &[7u8, 7, 8], &mut |k, _| {
            inside.push(k.len());
            true
        })
        .expect("scan");
        let want: Vec<usize> = sorted
            .iter()
            .filter(|k| k.as_slice() >= &[7u8; 33][..] && k.as_slice() < &[7u8, 7, 8][..])
            .map(Vec::len)
            .collect();
        assert_eq!(inside, want);
        let mut batch = WriteBatch::default();
        for k in &keys {
            batch.delete(0, k.clone());
        }
        h.write(batch).expect("delete");
        assert_eq!(h.estimated_bytes(), 0);
    }
}
