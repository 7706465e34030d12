//! The keyed-state layer every stateful operator writes through.
//!
//! It owns the layout of state in a backend, so operators never build raw
//! keys. Per operator subtask there is one backend instance (the operator's
//! uid names its directory and its savepoint files) with one named state
//! per declared [`StateDecl`] (a RocksDB column family, a heap map). In a
//! state every entry is keyed **key group first**:
//!
//! - value state: `key group (u16 BE) | key | namespace` → value;
//! - timers: `key group | time (order-preserving i64) | key length (u32 BE)
//!   | key | namespace` → empty.
//!
//! Keys are rows in Weir's encoding ([`super::codec`]); the key group is
//! [`crate::keygroup::key_group`] of those bytes. Because every entry
//! starts with its key group, a subtask's state splits by key-group range
//! when parallelism changes ([`super::transfer`]), timers included.
//!
//! Access is batched: one multi-get for every entry a batch touches, one
//! atomic [`KeyedWrite`] for every change. Timers fire per key group in
//! time order; an in-memory floor per key group (no timer below it) makes
//! a watermark visit only the groups with due timers and start each scan
//! past what already fired (deleted timers leave RocksDB tombstones until
//! compaction; rescanning them would make firing quadratic).

use std::ops::Range;

use super::{StateBackend, StateId, WriteBatch};
use crate::checkpoint::OperatorSnapshot;
use crate::clock::Clock;
use crate::error::StateError;
use crate::keygroup::KeyGroup;
use crate::message::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    Value,
    Timers,
}

/// A named state an operator declares; the name is part of the persisted
/// layout (savepoints match states by it).
#[derive(Debug, Clone, Copy)]
pub struct StateDecl {
    pub name: &'static str,
    pub kind: StateKind,
    /// Values carry their last write time (8 bytes, processing time, ms)
    /// so they can expire (`table.exec.state.ttl`); always stored, so a
    /// job can turn TTL on or off across a restore.
    pub ttl: bool,
}

/// A due timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    pub key_group: KeyGroup,
    pub time: Timestamp,
    pub key: Vec<u8>,
    pub namespace: Vec<u8>,
}

/// One entry of a value state.
#[derive(Debug, Clone, Copy)]
pub struct EntryRef<'a> {
    pub key_group: KeyGroup,
    pub key: &'a [u8],
    pub namespace: &'a [u8],
}

/// Big-endian with the sign bit flipped: byte order equals numeric order.
pub fn encode_time(ts: i64) -> [u8; 8] {
    ((ts as u64) ^ (1 << 63)).to_be_bytes()
}

pub fn decode_time(b: [u8; 8]) -> i64 {
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

fn value_key(e: EntryRef) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + e.key.len() + e.namespace.len());
    k.extend_from_slice(&e.key_group.to_be_bytes());
    k.extend_from_slice(e.key);
    k.extend_from_slice(e.namespace);
    k
}

fn timer_key(group: KeyGroup, time: Timestamp, key: &[u8], namespace: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(14 + key.len() + namespace.len());
    k.extend_from_slice(&group.to_be_bytes());
    k.extend_from_slice(&encode_time(time));
    k.extend_from_slice(&(key.len() as u32).to_be_bytes());
    k.extend_from_slice(key);
    k.extend_from_slice(namespace);
    k
}

/// The least byte string greater than every string starting with `p`.
fn successor(p: &[u8]) -> Vec<u8> {
    let mut s = p.to_vec();
    while let Some(last) = s.pop() {
        if last < 0xff {
            s.push(last + 1);
            return s;
        }
    }
    // All 0xff: nothing of this length is above; a longer run is.
    vec![0xff; p.len() + 1]
}

/// A timer's stored key without its key-group prefix (the `key` of its
/// canonical entry).
pub fn stored_timer_key(time: Timestamp, key: &[u8], namespace: &[u8]) -> Vec<u8> {
    timer_key(0, time, key, namespace).split_off(2)
}

/// Keyed state held outside a [`KeyedState`] (the heap window store's
/// live panes) written as canonical entries laid out as a `KeyedState` of
/// the same declarations stores them, so its snapshot restores into
/// either store, at any parallelism.
pub struct KeyedEntries<'d> {
    decls: &'d [StateDecl],
    /// (state, key group, stored key without its group, value).
    entries: Vec<(StateId, KeyGroup, Vec<u8>, Vec<u8>)>,
}

impl<'d> KeyedEntries<'d> {
    pub fn new(decls: &'d [StateDecl]) -> Self {
        Self { decls, entries: vec![] }
    }

    /// A value of value state `state`.
    pub fn value(&mut self, state: StateId, e: EntryRef, value: &[u8]) {
        let key = value_key(e).split_off(2);
        let mut v = Vec::with_capacity(value.len() + 1);
        // As a job without a TTL stores a TTL-able state's value.
        if self.decls.get(state).is_some_and(|d| d.ttl) {
            v.push(UNSTAMPED);
        }
        v.extend_from_slice(value);
        self.entries.push((state, e.key_group, key, v));
    }

    /// A timer of timer state `state`.
    pub fn timer(&mut self, state: StateId, group: KeyGroup, time: Timestamp, key: &[u8], namespace: &[u8]) {
        self.entries
            .push((state, group, stored_timer_key(time, key, namespace), vec![]));
    }

    /// The snapshot of key groups `key_groups`: the entries in state and
    /// key order.
    pub fn finish(mut self, key_groups: Range<KeyGroup>) -> Result<OperatorSnapshot, StateError> {
        self.entries
            .sort_unstable_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
        let mut out = super::transfer::EntriesWriter::new()?;
        for (state, group, key, value) in &self.entries {
            let name = self
                .decls
                .get(*state)
                .map(|d| d.name)
                .ok_or_else(|| StateError::Corrupt {
                    state: state.to_string(),
                    message: "undeclared state".into(),
                })?;
            out.push(name, *group, key, value)?;
        }
        Ok(OperatorSnapshot::Entries {
            bytes: out.finish()?,
            key_groups,
        })
    }
}

/// An entry of restored keyed state, as [`restored_entries`] reads it.
pub enum RestoredEntry<'a> {
    /// A value (without its TTL stamp).
    Value {
        state: StateId,
        entry: EntryRef<'a>,
        value: &'a [u8],
    },
    Timer {
        state: StateId,
        timer: Timer,
    },
}

/// Reads the entries of key groups `groups` from `sources` (snapshots of
/// a state of `decls`, at any parallelism) for state kept outside a
/// [`KeyedState`]. The namespace of value state `s` is the last
/// `namespace_len[s]` bytes of its key.
pub fn restored_entries(
    sources: &[super::StateSource],
    groups: Range<KeyGroup>,
    decls: &[StateDecl],
    namespace_len: &[usize],
    visit: &mut dyn FnMut(RestoredEntry) -> Result<(), StateError>,
) -> Result<(), StateError> {
    for source in sources {
        let sr = source.key_groups();
        let overlap = sr.start.max(groups.start)..sr.end.min(groups.end);
        if overlap.is_empty() {
            continue;
        }
        source.for_each(overlap, &mut |name, group, key, value| {
            let corrupt = |message: String| StateError::Corrupt {
                state: name.to_string(),
                message,
            };
            let state = decls
                .iter()
                .position(|d| d.name == name)
                .ok_or_else(|| corrupt("a state the operator does not declare".into()))?;
            match decls[state].kind {
                StateKind::Timers => {
                    let mut k = Vec::with_capacity(2 + key.len());
                    k.extend_from_slice(&group.to_be_bytes());
                    k.extend_from_slice(key);
                    visit(RestoredEntry::Timer {
                        state,
                        timer: parse_timer(&k)?,
                    })
                }
                StateKind::Value => {
                    let ns = namespace_len.get(state).copied().unwrap_or(0);
                    let at = key
                        .len()
                        .checked_sub(ns)
                        .ok_or_else(|| corrupt(format!("a key of {} bytes has no {ns}-byte namespace", key.len())))?;
                    let value = if decls[state].ttl {
                        split_stamp(value)
                            .map(|(_, v)| v)
                            .ok_or_else(|| corrupt("a value without its TTL tag".into()))?
                    } else {
                        value
                    };
                    visit(RestoredEntry::Value {
                        state,
                        entry: EntryRef {
                            key_group: group,
                            key: &key[..at],
                            namespace: &key[at..],
                        },
                        value,
                    })
                }
            }
        })?;
    }
    Ok(())
}

fn parse_timer(k: &[u8]) -> Result<Timer, StateError> {
    let corrupt = || StateError::Corrupt {
        state: "timers".into(),
        message: format!("timer key of {} bytes is malformed", k.len()),
    };
    if k.len() < 14 {
        return Err(corrupt());
    }
    let key_len = u32::from_be_bytes([k[10], k[11], k[12], k[13]]) as usize;
    let rest = &k[14..];
    if key_len > rest.len() {
        return Err(corrupt());
    }
    Ok(Timer {
        key_group: u16::from_be_bytes([k[0], k[1]]),
        time: decode_time(k[2..10].try_into().map_err(|_| corrupt())?),
        key: rest[..key_len].to_vec(),
        namespace: rest[key_len..].to_vec(),
    })
}

/// Changes applied atomically by [`KeyedState::write`].
///
/// Each change says what it replaces (the length of the value read
/// before, `None`: none), so the state keeps its own size: an entry costs
/// its stored key and its value (without the TTL stamp), a timer its key.
#[derive(Debug, Default)]
pub struct KeyedWrite {
    batch: WriteBatch,
    /// (timer state, key group, time) of timers added.
    timers: Vec<(StateId, KeyGroup, Timestamp)>,
    /// Bytes the state grows by (negative: shrinks).
    grown: i64,
}

impl KeyedWrite {
    /// Sets `e` to `value`; `old` is the length of the value it held
    /// (`None`: it held none).
    pub fn put(&mut self, state: StateId, e: EntryRef, old: Option<usize>, value: Vec<u8>) {
        let k = value_key(e);
        self.grown += (value.len() + k.len()) as i64 - old.map_or(0, |o| (o + k.len()) as i64);
        self.batch.put(state, k, value);
    }

    /// Deletes `e`; `old` is the length of the value it held (`None`: it
    /// held none, or it is not known to: the size does not move).
    pub fn delete(&mut self, state: StateId, e: EntryRef, old: Option<usize>) {
        let k = value_key(e);
        self.grown -= old.map_or(0, |o| (o + k.len()) as i64);
        self.batch.delete(state, k);
    }

    pub fn add_timer(&mut self, state: StateId, group: KeyGroup, time: Timestamp, key: &[u8], namespace: &[u8]) {
        let k = timer_key(group, time, key, namespace);
        self.grown += k.len() as i64;
        self.batch.put(state, k, vec![]);
        self.timers.push((state, group, time));
    }

    /// Deletes a due timer (one [`KeyedState::due_timers`] gave).
    pub fn delete_timer(&mut self, state: StateId, t: &Timer) {
        let k = timer_key(t.key_group, t.time, &t.key, &t.namespace);
        self.grown -= k.len() as i64;
        self.batch.delete(state, k);
    }

    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }
}

/// An operator subtask's keyed state: the backend, the key groups it owns,
/// and the timer floors.
pub struct KeyedState {
    backend: Box<dyn StateBackend>,
    decls: Vec<StateDecl>,
    groups: Range<KeyGroup>,
    /// The job's number of key groups: what a key's group is taken modulo.
    max_parallelism: u16,
    /// Per state (timers only), per owned key group: no timer is below it.
    floors: Vec<Vec<Timestamp>>,
    /// Per state, in ms: values of `ttl` states not written for this long
    /// are gone (`table.exec.state.ttl`, or a `STATE_TTL` hint's).
    ttl: Vec<Option<i64>>,
    /// Per state: where the incremental expiry scan goes on.
    expiry_cursor: Vec<Vec<u8>>,
    /// Processing time (the job's clock: TTL stamps and expiry).
    clock: Clock,
    /// A write-back cache of point-read states (see [`KeyedState::cache`]).
    cache: std::cell::RefCell<Box<Cache>>,
    /// The bytes its entries and timers hold (stored keys and values: what
    /// a restore brought as its backend estimates it, then as written).
    size: i64,
    /// The operator's state-size metric (all its subtasks), which the
    /// size's changes move too.
    gauge: Option<std::sync::Arc<std::sync::atomic::AtomicI64>>,
}

/// A cached entry: the stored value (or its absence), and whether it was
/// written since the last flush.
type CachedValue = (Option<Vec<u8>>, bool);

/// Entries of cached states held in memory: read once from the backend,
/// written there in one sorted batch at a flush (a snapshot, a full
/// cache, or before the layer scans them).
#[derive(Default)]
struct Cache {
    /// Which states are cached.
    states: Vec<bool>,
    entries: hashbrown::HashMap<(StateId, Vec<u8>), CachedValue>,
    dirty: usize,
    limit: usize,
}

/// A cache key looked up without copying its bytes: hashes as the
/// `(StateId, Vec<u8>)` it stands for (a tuple's fields in order, a
/// `Vec` as its slice).
#[derive(Hash)]
struct CacheKeyRef<'a>(StateId, &'a [u8]);

impl hashbrown::Equivalent<(StateId, Vec<u8>)> for CacheKeyRef<'_> {
    fn equivalent(&self, key: &(StateId, Vec<u8>)) -> bool {
        self.0 == key.0 && self.1 == key.1.as_slice()
    }
}

/// In front of every value of a state declared TTL-able: a tag byte,
/// [`UNSTAMPED`] when the job keeps that state without a TTL (1 byte, not
/// a time nobody reads: Flink's state without TTL has none either), or
/// [`STAMPED`] followed by the 8-byte write time.
const UNSTAMPED: u8 = 0;
const STAMPED: u8 = 1;
const STAMP_LEN: usize = 9;

/// A TTL-able state's value as stored: (write time, value). The write time
/// is `None` for a value written without a TTL.
fn split_stamp(v: &[u8]) -> Option<(Option<i64>, &[u8])> {
    match *v.first()? {
        UNSTAMPED => Some((None, &v[1..])),
        STAMPED => {
            let t: [u8; 8] = v.get(1..STAMP_LEN)?.try_into().ok()?;
            Some((Some(decode_time(t)), &v[STAMP_LEN..]))
        }
        _ => None,
    }
}

impl KeyedState {
    /// The keyed state of the key groups `groups` (of `max_parallelism`:
    /// a key's group is its hash modulo it, [`KeyedState::key_group`]).
    pub fn new(
        backend: Box<dyn StateBackend>,
        decls: &[StateDecl],
        groups: Range<KeyGroup>,
        max_parallelism: u16,
    ) -> Self {
        let n = usize::from(groups.end.saturating_sub(groups.start));
        Self {
            backend,
            floors: decls
                .iter()
                .map(|d| match d.kind {
                    // Unknown after a restore: the first scan finds out.
                    StateKind::Timers => vec![Timestamp::MIN; n],
                    StateKind::Value => vec![],
                })
                .collect(),
            expiry_cursor: vec![vec![]; decls.len()],
            ttl: vec![None; decls.len()],
            decls: decls.to_vec(),
            groups,
            max_parallelism,
            clock: Clock::Wall,
            cache: Default::default(),
            size: 0,
            gauge: None,
        }
    }

    /// Values of TTL states expire `ttl` after their last write (`None`
    /// or zero: never).
    pub fn set_ttl(&mut self, ttl: Option<std::time::Duration>) {
        for state in 0..self.decls.len() {
            self.set_state_ttl(state, ttl);
        }
    }

    /// The TTL of one state (a join side's, from a `STATE_TTL` hint).
    pub fn set_state_ttl(&mut self, state: StateId, ttl: Option<std::time::Duration>) {
        if let Some(t) = self.ttl.get_mut(state) {
            *t = ttl.filter(|d| !d.is_zero()).map(|d| d.as_millis() as i64);
        }
    }

    /// Keeps `states` (value states read by key, never scanned by the
    /// operator) in a write-back cache of up to `limit` entries: a hot
    /// key costs no backend read or write between flushes. Flushed at
    /// every snapshot, and emptied when it outgrows the limit.
    pub fn cache(&mut self, states: &[StateId], limit: usize) {
        let c = self.cache.get_mut();
        c.states = (0..self.decls.len()).map(|s| states.contains(&s)).collect();
        c.limit = limit.max(1);
    }

    fn cached(&self, state: StateId) -> bool {
        self.cache.borrow().states.get(state).copied().unwrap_or(false)
    }

    /// Writes the cache's changes to the backend in one batch; empties it
    /// when it holds more than its limit.
    pub fn flush(&mut self) -> Result<(), StateError> {
        let c = self.cache.get_mut();
        if c.dirty > 0 {
            let mut batch = WriteBatch::default();
            for ((state, key), (value, dirty)) in c.entries.iter_mut() {
                if std::mem::take(dirty) {
                    batch.ops.push((*state, key.clone(), value.clone()));
                }
            }
            c.dirty = 0;
            // Each key once: an unstable sort keeps the meaning.
            batch.ops.sort_unstable_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            self.backend.write(batch)?;
        }
        let c = self.cache.get_mut();
        if c.entries.len() > c.limit {
            c.entries.clear();
        }
        Ok(())
    }

    /// Counts the state's size in `gauge` (the operator's state-size
    /// metric) from now on, carrying over what was counted so far.
    pub fn share_size(&mut self, gauge: std::sync::Arc<std::sync::atomic::AtomicI64>) {
        gauge.fetch_add(self.size, std::sync::atomic::Ordering::Relaxed);
        self.gauge = Some(gauge);
    }

    /// The state's size counted entry by entry, as
    /// [`KeyedState::size_bytes`] keeps it (tests check one by the other).
    #[cfg(test)]
    pub fn counted_bytes(&mut self) -> Result<i64, StateError> {
        self.flush()?;
        let (start, end) = (vec![], vec![0xff; 3]);
        let mut bytes = 0i64;
        for state in 0..self.decls.len() {
            let ttl = self.is_ttl(state);
            self.backend.scan(state, &start, &end, &mut |k, v| {
                let v = if ttl { split_stamp(v).map_or(v, |(_, v)| v) } else { v };
                bytes += (k.len() + v.len()) as i64;
                true
            })?;
        }
        Ok(bytes)
    }

    /// Adds bytes to the state's size (what a restore brought).
    pub(crate) fn add_size(&mut self, bytes: i64) {
        self.size += bytes;
        if let Some(g) = &self.gauge {
            g.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The bytes the state holds (see [`KeyedState::share_size`]).
    pub fn size_bytes(&self) -> i64 {
        self.size
    }

    /// The job's processing-time clock (the wall clock until set).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// The key group of a key's bytes (the key encoding of its columns):
    /// operators ask the state, which knows the job's max parallelism.
    pub fn key_group(&self, key: &[u8]) -> KeyGroup {
        crate::keygroup::key_group(key, self.max_parallelism)
    }

    /// The processing-time clock its TTL reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn ttl_enabled(&self) -> bool {
        self.ttl.iter().any(Option::is_some)
    }

    /// How often expired values should be looked for: a quarter of the
    /// TTL, between 10 ms and 1 s; `None` without TTL.
    pub fn expiry_interval(&self) -> Option<std::time::Duration> {
        self.ttl
            .iter()
            .flatten()
            .min()
            .map(|t| std::time::Duration::from_millis((t / 4).clamp(10, 1000) as u64))
    }

    fn is_ttl(&self, state: StateId) -> bool {
        self.decls.get(state).is_some_and(|d| d.ttl)
    }

    /// A TTL state's stored value without its write time; `None` when it
    /// expired.
    fn live_value(&self, state: StateId, v: &[u8], now: i64) -> Result<Option<Vec<u8>>, StateError> {
        let (written, value) = split_stamp(v).ok_or_else(|| StateError::Corrupt {
            state: self.decls.get(state).map_or("?", |d| d.name).into(),
            message: format!("a value of {} bytes has no write-time tag", v.len()),
        })?;
        // A value written without a TTL (the job had none then) is live
        // until the expiry scan stamps it.
        if let (Some(written), Some(ttl)) = (written, self.ttl.get(state).copied().flatten())
            && now.saturating_sub(written) >= ttl
        {
            return Ok(None);
        }
        Ok(Some(value.to_vec()))
    }

    /// Deletes the expired values of every TTL state among the next
    /// `budget` entries of each, scanning on from where the last call
    /// stopped (Flink's incremental cleanup). Returns the bytes removed
    /// (taken off the state's size).
    pub fn expire(&mut self, now: i64, budget: usize) -> Result<i64, StateError> {
        if !self.ttl_enabled() {
            return Ok(0);
        }
        // The scan reads the backend: the cache's changes go there first,
        // and what it deletes must not survive in the cache.
        self.flush()?;
        self.cache.get_mut().entries.clear();
        let mut freed = 0i64;
        let end = if u32::from(self.groups.end) > u32::from(KeyGroup::MAX) {
            vec![0xff; 3]
        } else {
            self.groups.end.to_be_bytes().to_vec()
        };
        for state in 0..self.decls.len() {
            let Some(ttl) = self.ttl.get(state).copied().flatten().filter(|_| self.is_ttl(state)) else {
                continue;
            };
            let from = if self.expiry_cursor[state].is_empty() {
                self.groups.start.to_be_bytes().to_vec()
            } else {
                self.expiry_cursor[state].clone()
            };
            let mut dead: Vec<Vec<u8>> = vec![];
            // Values written before the job had a TTL (restored from a
            // run without one): their clock starts now, so they expire
            // one TTL later instead of never.
            let mut unstamped: Vec<(Vec<u8>, Vec<u8>)> = vec![];
            let mut seen = 0usize;
            let mut last: Option<Vec<u8>> = None;
            self.backend.scan(state, &from, &end, &mut |k, v| {
                seen += 1;
                match split_stamp(v) {
                    Some((Some(written), value)) if now.saturating_sub(written) >= ttl => {
                        freed += (k.len() + value.len()) as i64;
                        dead.push(k.to_vec());
                    }
                    Some((None, value)) => {
                        let mut stamped = vec![STAMPED];
                        stamped.extend_from_slice(&encode_time(now));
                        stamped.extend_from_slice(value);
                        unstamped.push((k.to_vec(), stamped));
                    }
                    _ => {}
                }
                last = Some(k.to_vec());
                seen < budget
            })?;
            // Next time: just after the last key seen, or from the start.
            self.expiry_cursor[state] = match last {
                Some(mut k) if seen >= budget => {
                    k.push(0);
                    k
                }
                _ => vec![],
            };
            if !dead.is_empty() || !unstamped.is_empty() {
                let mut batch = WriteBatch::default();
                for k in dead {
                    batch.delete(state, k);
                }
                for (k, v) in unstamped {
                    batch.ops.push((state, k, Some(v)));
                }
                self.backend.write(batch)?;
            }
        }
        self.add_size(-freed);
        Ok(freed)
    }

    pub fn backend(&self) -> &dyn StateBackend {
        self.backend.as_ref()
    }

    pub fn groups(&self) -> Range<KeyGroup> {
        self.groups.clone()
    }

    /// Values of `entries` in `state`, in order.
    pub fn get(&self, state: StateId, entries: &[EntryRef]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let keys: Vec<Vec<u8>> = entries.iter().map(|e| value_key(*e)).collect();
        let values = if self.cached(state) {
            // Hits from memory, misses in one multi-get, then remembered.
            let mut cache = self.cache.borrow_mut();
            let mut values: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
            let mut missing: Vec<usize> = vec![];
            for (i, k) in keys.iter().enumerate() {
                match cache.entries.get(&CacheKeyRef(state, k)) {
                    Some((v, _)) => values[i] = v.clone(),
                    None => missing.push(i),
                }
            }
            if !missing.is_empty() {
                let refs: Vec<&[u8]> = missing.iter().map(|i| keys[*i].as_slice()).collect();
                let read = self.backend.multi_get(state, &refs)?;
                // The keys are not needed after this: moved into the cache.
                let mut keys = keys;
                for (i, v) in missing.iter().zip(read) {
                    cache
                        .entries
                        .insert((state, std::mem::take(&mut keys[*i])), (v.clone(), false));
                    values[*i] = v;
                }
            }
            values
        } else {
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            self.backend.multi_get(state, &refs)?
        };
        if !self.is_ttl(state) {
            return Ok(values);
        }
        let now = self.clock.now_ms();
        values
            .into_iter()
            .map(|v| match v {
                Some(v) => self.live_value(state, &v, now),
                None => Ok(None),
            })
            .collect()
    }

    pub fn write(&mut self, w: KeyedWrite) -> Result<(), StateError> {
        self.add_size(w.grown);
        for (state, group, time) in &w.timers {
            if let Some(f) = self.floor_mut(*state, *group) {
                *f = (*f).min(*time);
            }
        }
        if w.batch.is_empty() {
            return Ok(());
        }
        // In key order: RocksDB's memtable inserts keys that follow the
        // previous one without searching its skiplist from the top (a
        // window flush writes tens of thousands of keys in hash order).
        // Stable, so operations on one key keep their order.
        let mut batch = w.batch;
        if self.decls.iter().any(|d| d.ttl) {
            let mut stamp = [0u8; STAMP_LEN];
            stamp[0] = STAMPED;
            stamp[1..].copy_from_slice(&encode_time(self.clock.now_ms()));
            for (state, _, value) in &mut batch.ops {
                if let Some(v) = value
                    && self.is_ttl(*state)
                {
                    if self.ttl.get(*state).copied().flatten().is_some() {
                        v.splice(0..0, stamp);
                    } else {
                        v.insert(0, UNSTAMPED);
                    }
                }
            }
        }
        // Cached states' changes stay in memory until a flush.
        let mut full = false;
        {
            let c = self.cache.get_mut();
            if c.states.iter().any(|s| *s) {
                batch.ops.retain_mut(|(state, key, value)| {
                    if !c.states.get(*state).copied().unwrap_or(false) {
                        return true;
                    }
                    let e = c.entries.entry((*state, std::mem::take(key))).or_insert((None, false));
                    e.0 = value.take();
                    if !e.1 {
                        e.1 = true;
                        c.dirty += 1;
                    }
                    false
                });
                full = c.entries.len() > c.limit;
            }
        }
        if full {
            self.flush()?;
        }
        if batch.ops.is_empty() {
            return Ok(());
        }
        batch.ops.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        self.backend.write(batch)
    }

    fn floor_mut(&mut self, state: StateId, group: KeyGroup) -> Option<&mut Timestamp> {
        let i = usize::from(group.checked_sub(self.groups.start)?);
        self.floors.get_mut(state)?.get_mut(i)
    }

    /// Up to `limit` timers of `state` with time `<= up_to`, key group by
    /// key group, each in time order. Returns them; fewer than `limit`
    /// means none is left due. The caller deletes the timers it fires.
    pub fn due_timers(&mut self, state: StateId, up_to: Timestamp, limit: usize) -> Result<Vec<Timer>, StateError> {
        if self.decls.get(state).map(|d| d.kind) != Some(StateKind::Timers) {
            return Err(StateError::Corrupt {
                state: state.to_string(),
                message: "not a timer state".into(),
            });
        }
        let mut out: Vec<Timer> = vec![];
        for group in self.groups.clone() {
            let gi = usize::from(group - self.groups.start);
            let floor = self.floors[state][gi];
            if floor > up_to {
                continue;
            }
            let start = timer_key(group, floor, &[], &[]);
            let end = (group + 1).to_be_bytes().to_vec();
            let end = if group == KeyGroup::MAX { vec![0xff; 3] } else { end };
            let mut next = Timestamp::MAX;
            let mut err = None;
            let room = limit.saturating_sub(out.len());
            let mut taken = 0;
            self.backend
                .scan(state, &start[..10], &end, &mut |k, _| match parse_timer(k) {
                    Ok(t) if t.time > up_to => {
                        next = t.time;
                        false
                    }
                    Ok(t) => {
                        if taken == room {
                            // Full: the rest of this group waits for the next call.
                            next = t.time;
                            return false;
                        }
                        taken += 1;
                        out.push(t);
                        true
                    }
                    Err(e) => {
                        err = Some(e);
                        false
                    }
                })?;
            if let Some(e) = err {
                return Err(e);
            }
            self.floors[state][gi] = next;
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Visits the entries of value state `state` under `key` whose
    /// namespace starts with `prefix`, in byte order, with the rest of
    /// their namespace, until `visit` returns false.
    pub fn scan_namespaces(
        &self,
        state: StateId,
        e: EntryRef,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StateError> {
        let start = value_key(e);
        let end = successor(&start);
        let skip = start.len();
        if !self.is_ttl(state) {
            return self
                .backend
                .scan(state, &start, &end, &mut |k, v| visit(&k[skip.min(k.len())..], v));
        }
        let now = self.clock.now_ms();
        let mut err = None;
        self.backend
            .scan(state, &start, &end, &mut |k, v| match self.live_value(state, v, now) {
                Ok(Some(v)) => visit(&k[skip.min(k.len())..], &v),
                Ok(None) => true,
                Err(e) => {
                    err = Some(e);
                    false
                }
            })?;
        err.map_or(Ok(()), Err)
    }

    /// The latest time of any timer of `state`: one reverse seek per key
    /// group (for an operator that needs to know what a restore brought).
    pub fn max_timer_time(&self, state: StateId) -> Result<Option<Timestamp>, StateError> {
        let mut max = None;
        for group in self.groups.clone() {
            let start = group.to_be_bytes();
            let end = u32::from(group) + 1;
            let end = if end > u32::from(KeyGroup::MAX) {
                vec![0xff; 3]
            } else {
                (end as u16).to_be_bytes().to_vec()
            };
            if let Some(k) = self.backend.last_in(state, &start, &end)? {
                let t = parse_timer(&k)?.time;
                max = Some(max.map_or(t, |m: Timestamp| m.max(t)));
            }
        }
        Ok(max)
    }

    /// The synchronous part of a checkpoint, with the key groups it covers.
    pub fn snapshot(&mut self, checkpoint_id: u64) -> Result<OperatorSnapshot, StateError> {
        self.flush()?;
        let names: Vec<&str> = self.decls.iter().map(|d| d.name).collect();
        self.backend.snapshot(checkpoint_id, &names, self.groups.clone())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::state::HeapBackend;

    /// A value state and a timer state, for the state layer's tests.
    pub(crate) const DECLS: &[StateDecl] = &[
        StateDecl {
            name: "v",
            kind: StateKind::Value,
            ttl: false,
        },
        StateDecl {
            name: "t",
            kind: StateKind::Timers,
            ttl: false,
        },
    ];

    /// State kept outside a `KeyedState` and written as `KeyedEntries`
    /// restores into a `KeyedState` (of another parallelism) and reads
    /// back through `restored_entries` as it was written.
    #[test]
    fn keyed_entries_restore_into_keyed_state_and_read_back() {
        const DECLS_TTL: &[StateDecl] = &[
            StateDecl {
                name: "v",
                kind: StateKind::Value,
                ttl: true,
            },
            StateDecl {
                name: "t",
                kind: StateKind::Timers,
                ttl: false,
            },
        ];
        let mut entries = KeyedEntries::new(DECLS_TTL);
        for (g, key) in [(3u16, &b"b"[..]), (1, b"a"), (6, b"c")] {
            let e = EntryRef {
                key_group: g,
                key,
                namespace: &encode_time(100),
            };
            entries.value(0, e, key);
            entries.timer(1, g, 99, key, e.namespace);
        }
        let OperatorSnapshot::Entries { bytes, key_groups } = entries.finish(0..8).expect("finish") else {
            panic!("not entries")
        };
        let source = crate::state::StateSource::Entries {
            bytes: std::sync::Arc::new(bytes),
            key_groups,
            path: "test".into(),
        };
        // Half the key groups, into a KeyedState.
        let mut s = crate::state::open_keyed(
            crate::config::StateBackendKind::Heap,
            &crate::state::RocksDbTuning::default(),
            std::path::Path::new("unused"),
            DECLS_TTL,
            0..4,
            8,
            std::slice::from_ref(&source),
        )
        .expect("open");
        let ns = encode_time(100);
        let e = |g, key| EntryRef {
            key_group: g,
            key,
            namespace: &ns,
        };
        let got = s.get(0, &[e(1, b"a"), e(3, b"b"), e(6, b"c")]).expect("get");
        assert_eq!(got, vec![Some(b"a".to_vec()), Some(b"b".to_vec()), None]);
        let due = s.due_timers(1, 99, 10).expect("due");
        assert_eq!(
            due.iter().map(|t| t.key.clone()).collect::<Vec<_>>(),
            [b"a".to_vec(), b"b".to_vec()]
        );
        assert!(s.size_bytes() > 0, "restored state is sized");
        // The other half, read back as written.
        let mut seen = vec![];
        restored_entries(&[source], 4..8, DECLS_TTL, &[8, 0], &mut |entry| {
            match entry {
                RestoredEntry::Value { entry, value, .. } => {
                    assert_eq!(entry.namespace, ns);
                    seen.push((entry.key_group, entry.key.to_vec(), value.to_vec()));
                }
                RestoredEntry::Timer { timer, .. } => {
                    assert_eq!((timer.time, timer.namespace.as_slice()), (99, &ns[..]));
                    seen.push((timer.key_group, timer.key, vec![]));
                }
            }
            Ok(())
        })
        .expect("read");
        assert_eq!(seen, [(6, b"c".to_vec(), b"c".to_vec()), (6, b"c".to_vec(), vec![])]);
    }

    #[test]
    fn ttl_values_expire_unless_written_again_and_expiry_deletes_them() {
        const TTL_DECLS: &[StateDecl] = &[StateDecl {
            name: "v",
            kind: StateKind::Value,
            ttl: true,
        }];
        let mut s = KeyedState::new(Box::new(HeapBackend::new(1)), TTL_DECLS, 0..4, 4);
        let now = Clock::driven(1_000);
        s.set_clock(now.clone());
        s.set_ttl(Some(std::time::Duration::from_millis(100)));
        let e = |k: &'static [u8]| EntryRef {
            key_group: 1,
            key: k,
            namespace: b"",
        };
        let mut w = KeyedWrite::default();
        w.put(0, e(b"idle"), None, b"1".to_vec());
        w.put(0, e(b"busy"), None, b"2".to_vec());
        s.write(w).expect("write");
        now.set_ms(1_080);
        let mut w = KeyedWrite::default();
        w.put(0, e(b"busy"), Some(1), b"3".to_vec());
        s.write(w).expect("rewrite");
        // Stored keys and values, not the write times.
        assert_eq!(s.size_bytes(), (2 + 4 + 1) * 2);
        assert_eq!(s.size_bytes(), s.counted_bytes().expect("count"));
        now.set_ms(1_150);
        // 150 ms after its write the idle key is gone; the busy one was
        // written 70 ms ago.
        let got = s.get(0, &[e(b"idle"), e(b"busy")]).expect("get");
        assert_eq!(got, vec![None, Some(b"3".to_vec())]);
        let freed = s.expire(now.now_ms(), 1).expect("expire");
        let freed = freed + s.expire(now.now_ms(), 1).expect("expire");
        assert_eq!(freed, 2 + 4 + 1, "the expired entry's bytes are freed");
        assert_eq!(s.size_bytes(), 2 + 4 + 1);
        assert_eq!(s.size_bytes(), s.counted_bytes().expect("count"));
        let mut left = 0;
        s.backend()
            .scan(0, &[0], &[0xff], &mut |_, _| {
                left += 1;
                true
            })
            .expect("scan");
        assert_eq!(left, 1, "only the busy key is stored");
        // Without TTL nothing expires (a stamped value keeps its time).
        s.set_ttl(None);
        now.set_ms(9_999_999);
        assert_eq!(s.get(0, &[e(b"busy")]).expect("get"), vec![Some(b"3".to_vec())]);
        assert_eq!(s.expire(now.now_ms(), 10).expect("expire"), 0);
    }

    #[test]
    fn values_kept_without_ttl_carry_one_tag_byte_and_start_their_clock_when_a_ttl_comes() {
        const TTL_DECLS: &[StateDecl] = &[StateDecl {
            name: "v",
            kind: StateKind::Value,
            ttl: true,
        }];
        let stored = |s: &KeyedState| {
            let mut values = vec![];
            s.backend()
                .scan(0, &[0], &[0xff], &mut |_, v| {
                    values.push(v.to_vec());
                    true
                })
                .expect("scan");
            values
        };
        let e = EntryRef {
            key_group: 1,
            key: b"k",
            namespace: b"",
        };
        // No TTL: the value is a tag byte and the bytes, no write time.
        let mut s = KeyedState::new(Box::new(HeapBackend::new(1)), TTL_DECLS, 0..4, 4);
        let now = Clock::driven(5_000);
        s.set_clock(now.clone());
        let mut w = KeyedWrite::default();
        w.put(0, e, None, b"abc".to_vec());
        s.write(w).expect("write");
        assert_eq!(stored(&s), vec![b"\0abc".to_vec()]);
        // The job now has a TTL (as after a restore with one): the old
        // value is live until the expiry scan stamps it, then lives one
        // TTL from that scan.
        s.set_ttl(Some(std::time::Duration::from_millis(100)));
        now.set_ms(9_000);
        assert_eq!(s.get(0, &[e]).expect("get"), vec![Some(b"abc".to_vec())]);
        assert_eq!(s.expire(now.now_ms(), 10).expect("expire"), 0);
        assert_eq!(stored(&s)[0][0], STAMPED, "stamped by the scan");
        now.set_ms(9_050);
        assert_eq!(s.get(0, &[e]).expect("get"), vec![Some(b"abc".to_vec())]);
        now.set_ms(9_100);
        assert_eq!(s.get(0, &[e]).expect("get"), vec![None]);
        assert!(s.expire(now.now_ms(), 10).expect("expire") > 0);
        assert!(stored(&s).is_empty());
        // A value with an unknown tag is corrupt, named by its state.
        let mut w = WriteBatch::default();
        w.ops.push((0, value_key(e), Some(b"\x07abc".to_vec())));
        s.backend.write(w).expect("raw write");
        let err = s.get(0, &[e]).expect_err("corrupt");
        assert!(err.to_string().contains("write-time tag"), "{err}");
    }

    #[test]
    fn cached_states_reach_the_backend_at_a_flush_and_read_their_own_writes() {
        let mut s = KeyedState::new(Box::new(HeapBackend::new(2)), DECLS, 0..4, 4);
        s.cache(&[0], 2);
        let e = |k: &'static [u8]| EntryRef {
            key_group: 0,
            key: k,
            namespace: b"",
        };
        let stored = |s: &KeyedState| {
            let mut n = 0;
            s.backend()
                .scan(0, &[0], &[0xff], &mut |_, _| {
                    n += 1;
                    true
                })
                .expect("scan");
            n
        };
        let mut w = KeyedWrite::default();
        w.put(0, e(b"a"), None, b"1".to_vec());
        s.write(w).expect("write");
        assert_eq!(
            s.get(0, &[e(b"a"), e(b"b")]).expect("get"),
            vec![Some(b"1".to_vec()), None]
        );
        assert_eq!(stored(&s), 0, "held in memory");
        let mut w = KeyedWrite::default();
        w.delete(0, e(b"a"), Some(1));
        w.put(0, e(b"c"), None, b"3".to_vec());
        s.write(w).expect("write");
        assert_eq!(s.get(0, &[e(b"a")]).expect("get"), vec![None]);
        s.snapshot(1).expect("snapshot");
        assert_eq!(stored(&s), 1, "the snapshot flushed: c only");
        // Past its limit the cache writes everything out and starts over.
        let mut w = KeyedWrite::default();
        for k in [&b"d"[..], b"e", b"f"] {
            w.put(0, e(k), None, k.to_vec());
        }
        s.write(w).expect("write");
        assert_eq!(stored(&s), 4);
        // The size counts what the cache holds too.
        assert_eq!(s.size_bytes(), s.counted_bytes().expect("count"));
        assert_eq!(s.get(0, &[e(b"e")]).expect("get"), vec![Some(b"e".to_vec())]);
    }

    #[test]
    fn golden_layout() {
        let e = EntryRef {
            key_group: 258,
            key: b"k",
            namespace: &encode_time(5),
        };
        assert_eq!(value_key(e), b"\x01\x02k\x80\0\0\0\0\0\0\x05");
        assert_eq!(
            timer_key(3, -1, b"ab", b"n"),
            b"\0\x03\x7f\xff\xff\xff\xff\xff\xff\xff\0\0\0\x02abn"
        );
    }

    #[test]
    fn timers_fire_per_key_group_in_time_order_and_only_once() {
        let mut s = KeyedState::new(Box::new(HeapBackend::new(2)), DECLS, 0..4, 4);
        let mut w = KeyedWrite::default();
        for (g, t) in [(2, 30), (0, 10), (2, 5), (1, 100), (0, 20)] {
            w.add_timer(1, g, t, format!("k{g}").as_bytes(), b"");
        }
        s.write(w).expect("write");
        let due = s.due_timers(1, 25, 100).expect("due");
        let got: Vec<(u16, i64)> = due.iter().map(|t| (t.key_group, t.time)).collect();
        assert_eq!(got, [(0, 10), (0, 20), (2, 5)]);
        let mut w = KeyedWrite::default();
        for t in &due {
            w.delete_timer(1, t);
        }
        s.write(w).expect("delete");
        assert!(s.due_timers(1, 25, 100).expect("due").is_empty());
        // Chunks: a limit of one hands them out one at a time.
        let first = s.due_timers(1, i64::MAX, 1).expect("due");
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0].key_group, first[0].time, first[0].key.as_slice()),
            (1, 100, &b"k1"[..])
        );
    }
}
