//! Keys → key groups → subtasks.
//!
//! A key's group is `hash(key) % max_parallelism`; a subtask owns a
//! contiguous range of groups (Flink's `KeyGroupRangeAssignment`), which is
//! what lets state be redistributed when parallelism changes. Keys are
//! rows in Weir's own encoding ([`crate::state::codec`]) and the hash is
//! Weir's too, both pinned by golden tests: key groups are part of
//! persisted state, so neither may ever change.

use std::ops::Range;

use arrow::array::ArrayRef;

use crate::error::{ExecError, Result};
use crate::state::codec::{RowCodec, Rows};

pub type KeyGroup = u16;

/// 64-bit hash of a byte string (a murmur3-style mix; stable forever).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    let mut h: u64 = 0x8445_d61a_4e77_4912 ^ (bytes.len() as u64).wrapping_mul(M);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut k = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        k = k.wrapping_mul(M);
        k ^= k >> 47;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rem.len()].copy_from_slice(rem);
        h ^= u64::from_le_bytes(buf);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 47;
    h = h.wrapping_mul(M);
    h ^= h >> 47;
    h
}

pub fn key_group(key: &[u8], max_parallelism: u16) -> KeyGroup {
    (stable_hash(key) % u64::from(max_parallelism.max(1))) as KeyGroup
}

/// The subtask that owns `group` (Flink's `computeOperatorIndexForKeyGroup`).
pub fn subtask_for_group(group: KeyGroup, max_parallelism: u16, parallelism: usize) -> usize {
    usize::from(group) * parallelism / usize::from(max_parallelism.max(1))
}

/// The key groups subtask `index` of `parallelism` owns.
pub fn groups_of_subtask(index: usize, max_parallelism: u16, parallelism: usize) -> Range<u16> {
    let m = usize::from(max_parallelism);
    let start = (index * m).div_ceil(parallelism);
    let end = ((index + 1) * m).div_ceil(parallelism);
    start as u16..end as u16
}

/// Encodes key columns as byte rows in Weir's encoding.
#[derive(Debug, Clone)]
pub struct KeyEncoder {
    codec: RowCodec,
}

impl KeyEncoder {
    pub fn new(types: &[arrow::datatypes::DataType]) -> Result<Self> {
        let codec = RowCodec::new(types).map_err(|m| ExecError::Config(format!("GROUP BY key: {m}")))?;
        Ok(Self { codec })
    }

    /// The encoder of keys `exprs` over rows of `schema`; `None` without
    /// keys (a global aggregate, a Top-N without PARTITION BY: one key).
    pub fn for_keys(
        exprs: &[std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>],
        schema: &arrow::datatypes::Schema,
    ) -> Result<Option<Self>> {
        let types = exprs
            .iter()
            .map(|k| k.data_type(schema))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if types.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self::new(&types)?))
    }

    pub fn encode(&self, columns: &[ArrayRef]) -> Result<Rows> {
        Ok(self.codec.encode(columns)?)
    }

    pub fn codec(&self) -> &RowCodec {
        &self.codec
    }

    /// The keys `exprs` of every row of `batch`, encoded; `None` without
    /// an encoder (no keys: every row has the empty key).
    pub fn encode_rows(
        encoder: Option<&Self>,
        exprs: &[std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>],
        batch: &arrow::record_batch::RecordBatch,
    ) -> Result<Option<Rows>> {
        let Some(enc) = encoder else { return Ok(None) };
        let n = batch.num_rows();
        let arrays = exprs
            .iter()
            .map(|k| k.evaluate(batch).and_then(|v| v.into_array(n)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Some(enc.encode(&arrays)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_all_groups_and_agree_with_assignment() {
        for p in 1..=7 {
            let mut covered = 0;
            for i in 0..p {
                let r = groups_of_subtask(i, 128, p);
                for g in r.clone() {
                    assert_eq!(subtask_for_group(g, 128, p), i, "p={p} g={g}");
                }
                covered += r.len();
            }
            assert_eq!(covered, 128);
        }
    }

    /// Persisted state depends on these values never changing.
    #[test]
    fn golden_hashes_and_key_groups() {
        let hashes = [
            stable_hash(b""),
            stable_hash(b"a"),
            stable_hash(b"auction-1"),
            stable_hash(&[0u8; 17]),
        ];
        assert_eq!(hashes, GOLDEN);
        // Keys of every type, encoded by Weir, into key groups of 128.
        use arrow::array::*;
        use std::sync::Arc;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1000])),
            Arc::new(Int32Array::from(vec![-7])),
            Arc::new(StringArray::from(vec!["auction-1"])),
            Arc::new(BooleanArray::from(vec![true])),
            Arc::new(Float64Array::from(vec![2.5])),
            Arc::new(TimestampMillisecondArray::from(vec![1_700_000_000_000])),
            Arc::new(
                Decimal128Array::from(vec![12345])
                    .with_precision_and_scale(10, 2)
                    .expect("decimal"),
            ),
            Arc::new(Date32Array::from(vec![19000])),
            Arc::new(StringArray::from(vec![None::<&str>])),
        ];
        let groups: Vec<KeyGroup> = columns
            .iter()
            .map(|c| {
                let enc = KeyEncoder::new(&[c.data_type().clone()]).expect("encoder");
                key_group(enc.encode(std::slice::from_ref(c)).expect("encode").row(0), 128)
            })
            .collect();
        assert_eq!(groups, GOLDEN_GROUPS);
    }

    const GOLDEN: [u64; 4] = [
        4654505885621677629,
        1670019746057965472,
        16436619137035492202,
        4483727716364471552,
    ];
    const GOLDEN_GROUPS: [KeyGroup; 9] = [94, 8, 99, 3, 5, 8, 48, 97, 63];
}
