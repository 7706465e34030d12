//! The `hashmap` backend: ordered maps on the heap (fast, bounded by RAM).

use std::collections::BTreeMap;
use std::ops::{Bound, Range};

use super::transfer::EntriesWriter;
use super::{StateBackend, StateId, WriteBatch};
use crate::checkpoint::OperatorSnapshot;
use crate::error::StateError;
use crate::keygroup::KeyGroup;

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
