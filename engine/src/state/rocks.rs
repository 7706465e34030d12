//! The `rocksdb` backend (default): one RocksDB instance per stateful
//! subtask, one column family per named state. The WAL is off: durability
//! comes from checkpoints, not from RocksDB's log (as in Flink).
//!
//! Memory ([`RocksDbTuning`]): with `state.backend.rocksdb.memory.managed`
//! (the default) every instance of a job shares one LRU block cache of
//! `fixed-per-slot` × parallelism bytes, and a write-buffer manager that
//! charges memtables to that cache, capped at half of it — Flink's managed
//! memory model, so a job's RocksDB memory is bounded by its budget
//! however many operators and subtasks it has. Index and filter blocks
//! live in the cache too (pinned for L0). Bloom filters (10 bits a key,
//! whole keys) let point reads of absent keys — the first flush of every
//! new (key, window) — skip SST files; the last level, which holds most
//! keys, has none (`optimize_filters_for_hits`), since a checkpoint copies
//! every filter. Level 0 compacts at two files, so a checkpoint holds few
//! stale versions.

use std::ops::Range;
use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteOptions};

use super::{StateBackend, StateId, WriteBatch};
use crate::checkpoint::OperatorSnapshot;
use crate::error::StateError;
use crate::keygroup::KeyGroup;

/// Memory and filter settings shared by the RocksDB instances of one job.
#[derive(Clone)]
pub struct RocksDbTuning {
    config: crate::config::RocksDbConfig,
    /// Managed: the job's cache and write-buffer budget.
    shared: Option<(rocksdb::Cache, rocksdb::WriteBufferManager)>,
}

impl Default for RocksDbTuning {
    /// RocksDB's own defaults, unmanaged (tests and tools).
    fn default() -> Self {
        Self {
            config: crate::config::RocksDbConfig {
                managed: false,
                ..Default::default()
            },
            shared: None,
        }
    }
}

impl RocksDbTuning {
    /// The settings of a job whose parallel subtasks are `slots`.
    pub fn for_job(config: crate::config::RocksDbConfig, slots: usize) -> Self {
        let shared = config.managed.then(|| {
            let budget = config.per_slot.saturating_mul(slots.max(1) as u64) as usize;
            let cache = rocksdb::Cache::new_lru_cache(budget);
            let buffers =
                rocksdb::WriteBufferManager::new_write_buffer_manager_with_cache(budget / 2, false, cache.clone());
            (cache, buffers)
        });
        Self { config, shared }
    }

    fn options(&self) -> Options {
        // The WAL is off, so closing would flush the memtables to SST
        // files nobody reads: every open starts from a checkpoint (which
        // flushes for itself) or empty. A worker whose peer died spent
        // seconds closing its instance before it could exit and restart.
        // (rust-rocksdb has no setter for it; the options-string parser
        // knows every option.)
        let mut opts = Options::default()
            .get_options_from_string("avoid_flush_during_shutdown=true")
            .unwrap_or_else(|e| {
                tracing::warn!(target: "weir::state", "RocksDB: avoid_flush_during_shutdown not set: {e}");
                Options::default()
            });
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let mut table = rocksdb::BlockBasedOptions::default();
        match &self.shared {
            Some((cache, buffers)) => {
                table.set_block_cache(cache);
                table.set_cache_index_and_filter_blocks(true);
                table.set_pin_l0_filter_and_index_blocks_in_cache(true);
                opts.set_write_buffer_manager(buffers);
            }
            None => {
                table.set_block_cache(&rocksdb::Cache::new_lru_cache(self.config.block_cache as usize));
                opts.set_write_buffer_size(self.config.write_buffer as usize);
            }
        }
        if self.config.bloom_filter {
            table.set_bloom_filter(10.0, false);
            table.set_whole_key_filtering(true);
            // No filter in the last level, which holds most keys: a
            // checkpoint copies its SST files, and its filters were a
            // seventh of a COUNT DISTINCT's state. A miss there costs an
            // index and block lookup, usually in the block cache.
            opts.set_optimize_filters_for_hits(true);
            // The memtable's own filter: a read of a key that is not
            // there (a join's new row, a first DISTINCT value) skips the
            // skiplist search of a large memtable.
            opts.set_memtable_prefix_bloom_ratio(0.1);
            opts.set_memtable_whole_key_filtering(true);
        }
        // A checkpoint flushes every column family, so level 0 gains a
        // file per checkpoint, and a checkpoint copies level 0 as it is:
        // older versions of updated keys and each file's own filter and
        // index. Compacting at two files instead of RocksDB's four keeps
        // a checkpoint near the live state (q16's: 10.1 -> 8.1 MB) for
        // some 5-10 % more compaction CPU on large join states.
        opts.set_level_zero_file_num_compaction_trigger(2);
        opts.set_block_based_table_factory(&table);
        opts
    }
}

pub struct RocksDbBackend {
    db: DB,
    path: PathBuf,
    names: Vec<String>,
    write_options: WriteOptions,
    options: Options,
    /// SST files written for ingestion so far (their names).
    ingested: u64,
}

impl RocksDbBackend {
    /// Opens an empty database at `path`, removing whatever was there.
    pub fn open_fresh(path: &Path, states: &[&str], tuning: &RocksDbTuning) -> Result<Self, StateError> {
        let io = |source| StateError::Io {
            op: "preparing the state directory",
            path: path.to_path_buf(),
            source,
        };
        match std::fs::remove_dir_all(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        std::fs::create_dir_all(path).map_err(io)?;
        Self::open_existing(path, states, tuning)
    }

    /// Opens the database at `path` as it is (restored checkpoint files).
    pub fn open_existing(path: &Path, states: &[&str], tuning: &RocksDbTuning) -> Result<Self, StateError> {
        let opts = tuning.options();
        let cfs = states
            .iter()
            .map(|name| ColumnFamilyDescriptor::new(*name, opts.clone()));
        let db = DB::open_cf_descriptors(&opts, path, cfs).map_err(|e| StateError::RocksDb {
            op: "opening RocksDB".into(),
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut write_options = WriteOptions::default();
        write_options.disable_wal(true);
        Ok(Self {
            db,
            path: path.to_path_buf(),
            names: states.iter().map(|s| s.to_string()).collect(),
            write_options,
            options: opts,
            ingested: 0,
        })
    }

    /// Compacts every state into as few files as RocksDB can (tests and
    /// tools; normal operation leaves compaction to RocksDB).
    pub fn compact_all(&self) {
        for name in &self.names {
            if let Some(cf) = self.db.cf_handle(name) {
                self.db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
            }
        }
    }

    fn cf(&self, id: StateId) -> Result<&rocksdb::ColumnFamily, StateError> {
        self.names
            .get(id)
            .and_then(|n| self.db.cf_handle(n))
            .ok_or_else(|| StateError::Corrupt {
                state: id.to_string(),
                message: "undeclared state".into(),
            })
    }

    /// A RocksDB error while doing `op`.
    fn err(&self, op: impl Into<String>, e: rocksdb::Error) -> StateError {
        StateError::RocksDb {
            op: op.into(),
            path: self.path.clone(),
            message: e.to_string(),
        }
    }
}

impl StateBackend for RocksDbBackend {
    /// RocksDB's own estimate of live data (SST files, before the
    /// compactions that drop overwritten and deleted entries) plus what
    /// the memtables hold.
    fn estimated_bytes(&self) -> i64 {
        let mut bytes = 0u64;
        for name in &self.names {
            if let Some(cf) = self.db.cf_handle(name) {
                for p in ["rocksdb.estimate-live-data-size", "rocksdb.cur-size-all-mem-tables"] {
                    bytes += self.db.property_int_value_cf(cf, p).ok().flatten().unwrap_or(0);
                }
            }
        }
        i64::try_from(bytes).unwrap_or(i64::MAX)
    }

    fn snapshot(
        &mut self,
        checkpoint_id: u64,
        _states: &[&str],
        key_groups: Range<KeyGroup>,
    ) -> Result<OperatorSnapshot, StateError> {
        // The WAL is off: memtables must reach SST files to be in the
        // checkpoint. Then a native checkpoint hard-links the live files.
        let mut flush = rocksdb::FlushOptions::default();
        flush.set_wait(true);
        for name in &self.names {
            if let Some(cf) = self.db.cf_handle(name) {
                self.db
                    .flush_cf_opt(cf, &flush)
                    .map_err(|e| self.err(format!("flushing state for checkpoint {checkpoint_id}"), e))?;
            }
        }
        let mut dir = self.path.clone().into_os_string();
        dir.push(format!(".chk-{checkpoint_id}"));
        let dir = PathBuf::from(dir);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(StateError::Io {
                    op: "removing an old local snapshot",
                    path: dir,
                    source,
                });
            }
        }
        let op = || format!("taking the local snapshot for checkpoint {checkpoint_id}");
        let chk = rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(|e| self.err(op(), e))?;
        chk.create_checkpoint(&dir).map_err(|e| self.err(op(), e))?;
        let identity = self
            .db
            .get_db_identity()
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .map_err(|e| self.err("reading the instance identity", e))?;
        Ok(OperatorSnapshot::RocksDb {
            dir,
            key_groups,
            identity,
        })
    }

    fn ingest(&mut self, state: StateId, mut entries: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StateError> {
        if entries.is_empty() {
            return Ok(());
        }
        // An SST holds strictly increasing keys: sorted, the last of equal
        // keys kept.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, earlier| {
            if later.0 == earlier.0 {
                std::mem::swap(&mut later.1, &mut earlier.1);
                true
            } else {
                false
            }
        });
        let mut dir = self.path.clone().into_os_string();
        dir.push(".ingest");
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).map_err(|source| StateError::Io {
            op: "preparing state ingestion",
            path: dir.clone(),
            source,
        })?;
        self.ingested += 1;
        let file = dir.join(format!("{}.sst", self.ingested));
        let op = || format!("writing {} for ingestion", file.display());
        let writer = rocksdb::SstFileWriter::create(&self.options);
        writer.open(&file).map_err(|e| self.err(op(), e))?;
        let mut writer = writer;
        for (k, v) in &entries {
            writer.put(k, v).map_err(|e| self.err(op(), e))?;
        }
        writer.finish().map_err(|e| self.err(op(), e))?;
        drop(writer);
        let cf = self.cf(state)?;
        let mut io = rocksdb::IngestExternalFileOptions::default();
        io.set_move_files(true);
        self.db
            .ingest_external_file_cf_opts(cf, &io, vec![&file])
            .map_err(|e| self.err("ingesting restored state", e))?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    fn last_in(&self, state: StateId, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let cf = self.cf(state)?;
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_lower_bound(start.to_vec());
        let mut iter = self
            .db
            .iterator_cf_opt(cf, ro, IteratorMode::From(end, Direction::Reverse));
        match iter.next() {
            // `From(end, Reverse)` may land on `end` itself.
            Some(Ok((k, _))) if k.as_ref() == end => match iter.next() {
                Some(Ok((k, _))) => Ok(Some(k.to_vec())),
                Some(Err(e)) => Err(self.err("scanning state", e)),
                None => Ok(None),
            },
            Some(Ok((k, _))) => Ok(Some(k.to_vec())),
            Some(Err(e)) => Err(self.err("scanning state", e)),
            None => Ok(None),
        }
    }

    fn multi_get(&self, state: StateId, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let cf = self.cf(state)?;
        // Sorted here (an unstable sort of slices, inlined comparisons),
        // RocksDB skips its own sort of the keys behind a virtual
        // comparator: a third of a large multi-get's cost.
        let mut order: Vec<u32> = (0..keys.len() as u32).collect();
        order.sort_unstable_by(|a, b| keys[*a as usize].cmp(keys[*b as usize]));
        let sorted = order.iter().map(|i| keys[*i as usize]);
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        for (i, r) in order.iter().zip(self.db.batched_multi_get_cf(cf, sorted, true)) {
            out[*i as usize] = r
                .map(|v| v.map(|s| s.to_vec()))
                .map_err(|e| self.err("reading state", e))?;
        }
        Ok(out)
    }

    fn write(&mut self, batch: WriteBatch) -> Result<(), StateError> {
        let mut wb = rocksdb::WriteBatch::default();
        for (id, key, value) in &batch.ops {
            let cf = self.cf(*id)?;
            match value {
                Some(v) => wb.put_cf(cf, key, v),
                None => wb.delete_cf(cf, key),
            }
        }
        self.db
            .write_opt(wb, &self.write_options)
            .map_err(|e| self.err("writing state", e))
    }

    fn scan(
        &self,
        state: StateId,
        start: &[u8],
        end: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StateError> {
        let cf = self.cf(state)?;
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(end.to_vec());
        let iter = self
            .db
            .iterator_cf_opt(cf, ro, IteratorMode::From(start, Direction::Forward));
        for item in iter {
            let (k, v) = item.map_err(|e| self.err("scanning state", e))?;
            if !visit(&k, &v) {
                break;
            }
        }
        Ok(())
    }
}

/// Makes `to` a copy of the RocksDB checkpoint in `from` that `from` can
/// still be read and copied from: SST files (immutable) are hard-linked,
/// the few others copied.
pub fn clone_dir(from: &Path, to: &Path) -> Result<(), StateError> {
    let io = |path: &Path, source| StateError::Io {
        op: "cloning restored state",
        path: path.to_path_buf(),
        source,
    };
    match std::fs::remove_dir_all(to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(to, e)),
    }
    std::fs::create_dir_all(to).map_err(|e| io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io(from, e))? {
        let entry = entry.map_err(|e| io(from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let linked = entry.file_name().to_string_lossy().ends_with(".sst") && std::fs::hard_link(&src, &dst).is_ok();
        if !linked {
            std::fs::copy(&src, &dst).map_err(|e| io(&dst, e))?;
        }
    }
    Ok(())
}

impl RocksDbBackend {
    /// Drops every entry outside `groups` (keys start with their key
    /// group): RocksDB range deletions, reclaimed by compaction.
    pub fn delete_outside(&self, groups: &Range<KeyGroup>) -> Result<(), StateError> {
        for name in &self.names {
            let Some(cf) = self.db.cf_handle(name) else { continue };
            if groups.start > 0 {
                self.db
                    .delete_range_cf(cf, [0u8, 0], groups.start.to_be_bytes())
                    .map_err(|e| self.err("dropping other key groups", e))?;
            }
            self.db
                .delete_range_cf(cf, groups.end.to_be_bytes().as_slice(), [0xffu8; 3].as_slice())
                .map_err(|e| self.err("dropping other key groups", e))?;
        }
        Ok(())
    }
}

/// Moves a restored checkpoint's files to where the subtask keeps its
/// state (same file system: a rename).
pub fn move_dir(from: &Path, to: &Path) -> Result<(), StateError> {
    let io = |source| StateError::Io {
        op: "moving restored state into place",
        path: to.to_path_buf(),
        source,
    };
    match std::fs::remove_dir_all(to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::rename(from, to).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{StateBackend, WriteBatch};

    /// Closing writes nothing: the memtables (the WAL is off) would only
    /// become SST files no open ever reads, at the cost of the close.
    #[test]
    fn closing_flushes_no_memtable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("db");
        let ssts = |p: &Path| {
            std::fs::read_dir(p)
                .expect("read dir")
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".sst"))
                .count()
        };
        let mut rocks = RocksDbBackend::open_fresh(&db, &["s"], &RocksDbTuning::default()).expect("open");
        let mut batch = WriteBatch::default();
        for i in 0..1000u32 {
            batch.put(0, i.to_be_bytes().to_vec(), vec![7; 100]);
        }
        rocks.write(batch).expect("write");
        drop(rocks);
        assert_eq!(ssts(&db), 0, "closing flushed the memtable");
    }

    /// A multi-get answers in the order asked, whatever the keys' order,
    /// repeated keys and missing ones included (RocksDB is handed them
    /// sorted).
    #[test]
    fn multi_get_answers_in_the_order_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rocks =
            RocksDbBackend::open_fresh(&dir.path().join("db"), &["s"], &RocksDbTuning::default()).expect("open");
        let mut batch = WriteBatch::default();
        for k in ["b", "a", "c"] {
            batch.put(0, k.as_bytes().to_vec(), format!("v{k}").into_bytes());
        }
        rocks.write(batch).expect("write");
        let asked: Vec<&[u8]> = vec![b"c", b"x", b"a", b"b", b"a", b""];
        let got = rocks.multi_get(0, &asked).expect("multi-get");
        let want: Vec<Option<Vec<u8>>> = ["vc", "", "va", "vb", "va", ""]
            .iter()
            .map(|v| (!v.is_empty()).then(|| v.as_bytes().to_vec()))
            .collect();
        assert_eq!(got, want);
    }
}
