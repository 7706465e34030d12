//! The `hashmap` backend: ordered maps on the heap (fast, bounded by RAM).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::{StateBackend, StateId, WriteBatch};
use crate::checkpoint::OperatorSnapshot;
use crate::error::StateError;

pub struct HeapBackend {
    states: Vec<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl HeapBackend {
    pub fn new(states: usize) -> Self {
        Self {
            states: vec![BTreeMap::new(); states],
        }
    }

    fn state(&self, id: StateId) -> Result<&BTreeMap<Vec<u8>, Vec<u8>>, StateError> {
        self.states.get(id).ok_or_else(|| StateError::Corrupt {
            state: id.to_string(),
            message: "undeclared state".into(),
        })
    }
}

impl HeapBackend {
    /// Rebuilds the maps from [`StateBackend::snapshot`] bytes: per state
    /// an entry count, then length-prefixed keys and values (u32 LE).
    pub fn restore(states: usize, bytes: &[u8]) -> Result<Self, StateError> {
        let corrupt = |message: String| StateError::Corrupt {
            state: "heap snapshot".into(),
            message,
        };
        let mut pos = 0usize;
        let mut take = |n: usize| -> Result<&[u8], StateError> {
            let end = pos
                .checked_add(n)
                .filter(|e| *e <= bytes.len())
                .ok_or_else(|| corrupt(format!("truncated at byte {pos} of {}", bytes.len())))?;
            let s = &bytes[pos..end];
            pos = end;
            Ok(s)
        };
        let mut out = Self::new(states);
        for map in out.states.iter_mut() {
            let count = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
            for _ in 0..count {
                let kl = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
                let k = take(kl)?.to_vec();
                let vl = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
                let v = take(vl)?.to_vec();
                map.insert(k, v);
            }
        }
        if pos != bytes.len() {
            return Err(corrupt(format!("{} trailing bytes", bytes.len() - pos)));
        }
        Ok(out)
    }
}

impl StateBackend for HeapBackend {
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<OperatorSnapshot, StateError> {
        let mut out = vec![];
        for map in &self.states {
            out.extend_from_slice(&(map.len() as u64).to_le_bytes());
            for (k, v) in map {
                out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                out.extend_from_slice(k);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
        }
        Ok(OperatorSnapshot::Heap(out))
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
                    map.insert(key, v);
                }
                None => {
                    map.remove(&key);
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
