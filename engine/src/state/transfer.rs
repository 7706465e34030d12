//! State moving between backends, files and parallelisms.
//!
//! The canonical form of keyed state is an Arrow IPC stream of entries
//! `(state: utf8, key_group: u16, key: binary, value: binary)`, sorted by
//! state and key, where `key` is the stored key without its key-group
//! prefix (see [`super::keyed`]). Heap checkpoints and every savepoint hold
//! state in this form; a restore reads it at any parallelism, keeping the
//! entries of the key groups the new subtask owns.
//!
//! A native RocksDB checkpoint restores in place when the new subtask owns
//! exactly the key groups of an old one (same parallelism); otherwise
//! each old instance overlapping the new range is opened read-only and its
//! entries of the range are copied (key group first: one range scan per
//! state and instance).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, StringBuilder, UInt16Builder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt16Type};
use arrow::record_batch::RecordBatch;
use rocksdb::{DB, IteratorMode, Options};

use super::StateBackend;
use crate::error::StateError;
use crate::keygroup::KeyGroup;

/// Entries per Arrow batch when writing, and per write batch on import.
const CHUNK: usize = 16 * 1024;

/// Called with each entry: state name, key group, key, value.
pub type EntryVisitor<'a> = dyn FnMut(&str, KeyGroup, &[u8], &[u8]) -> Result<(), StateError> + 'a;

/// One old subtask's state of an operator, as a restore finds it.
#[derive(Debug, Clone)]
pub enum StateSource {
    /// A native RocksDB checkpoint copied to a local directory.
    RocksDb { dir: PathBuf, key_groups: Range<KeyGroup> },
    /// Entries in canonical form (a heap checkpoint or a savepoint file).
    Entries {
        bytes: Arc<Vec<u8>>,
        key_groups: Range<KeyGroup>,
        /// For messages.
        path: String,
    },
}

impl StateSource {
    pub fn key_groups(&self) -> Range<KeyGroup> {
        match self {
            StateSource::RocksDb { key_groups, .. } | StateSource::Entries { key_groups, .. } => key_groups.clone(),
        }
    }

    /// Visits every entry of the key groups in `range`.
    pub fn for_each(&self, range: Range<KeyGroup>, visit: &mut EntryVisitor) -> Result<(), StateError> {
        match self {
            StateSource::RocksDb { dir, .. } => for_each_in_rocksdb(dir, range, visit),
            StateSource::Entries { bytes, path, .. } => for_each_entry(bytes, path, range, visit),
        }
    }
}

pub fn entries_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("state", DataType::Utf8, false),
        Field::new("key_group", DataType::UInt16, false),
        Field::new("key", DataType::Binary, false),
        Field::new("value", DataType::Binary, false),
    ]))
}

/// Builds the canonical Arrow IPC stream from entries given in order.
pub struct EntriesWriter {
    writer: arrow::ipc::writer::StreamWriter<Vec<u8>>,
    state: StringBuilder,
    group: UInt16Builder,
    key: BinaryBuilder,
    value: BinaryBuilder,
    pending: usize,
    pub entries: u64,
}

fn ipc_err(e: arrow::error::ArrowError) -> StateError {
    StateError::Corrupt {
        state: "state entries".into(),
        message: e.to_string(),
    }
}

impl EntriesWriter {
    pub fn new() -> Result<Self, StateError> {
        Ok(Self {
            writer: arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &entries_schema()).map_err(ipc_err)?,
            state: StringBuilder::new(),
            group: UInt16Builder::new(),
            key: BinaryBuilder::new(),
            value: BinaryBuilder::new(),
            pending: 0,
            entries: 0,
        })
    }

    pub fn push(&mut self, state: &str, group: KeyGroup, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.state.append_value(state);
        self.group.append_value(group);
        self.key.append_value(key);
        self.value.append_value(value);
        self.pending += 1;
        self.entries += 1;
        if self.pending >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StateError> {
        if self.pending == 0 {
            return Ok(());
        }
        self.pending = 0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.state.finish()),
            Arc::new(self.group.finish()),
            Arc::new(self.key.finish()),
            Arc::new(self.value.finish()),
        ];
        let batch = RecordBatch::try_new(entries_schema(), columns).map_err(ipc_err)?;
        self.writer.write(&batch).map_err(ipc_err)
    }

    pub fn finish(mut self) -> Result<Vec<u8>, StateError> {
        self.flush()?;
        self.writer.finish().map_err(ipc_err)?;
        self.writer.into_inner().map_err(ipc_err)
    }
}

/// Writes every entry of `states` in `groups` held by `backend`.
pub fn export(
    backend: &dyn StateBackend,
    states: &[&str],
    groups: Range<KeyGroup>,
    out: &mut EntriesWriter,
) -> Result<(), StateError> {
    let (start, end) = group_bounds(&groups);
    for (id, name) in states.iter().enumerate() {
        let mut err = None;
        backend.scan(id, &start, &end, &mut |k, v| match push_stored(out, name, k, v) {
            Ok(()) => true,
            Err(e) => {
                err = Some(e);
                false
            }
        })?;
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(())
}

fn push_stored(out: &mut EntriesWriter, state: &str, k: &[u8], v: &[u8]) -> Result<(), StateError> {
    let (g, key) = split_group(k, state)?;
    out.push(state, g, key, v)
}

fn split_group<'a>(k: &'a [u8], state: &str) -> Result<(KeyGroup, &'a [u8]), StateError> {
    if k.len() < 2 {
        return Err(StateError::Corrupt {
            state: state.to_string(),
            message: format!("stored key of {} bytes has no key group", k.len()),
        });
    }
    Ok((u16::from_be_bytes([k[0], k[1]]), &k[2..]))
}

/// `[start, end)` byte bounds of the keys of `groups`.
fn group_bounds(groups: &Range<KeyGroup>) -> (Vec<u8>, Vec<u8>) {
    let start = groups.start.to_be_bytes().to_vec();
    // Key groups are below u16::MAX (max parallelism is at most 32768).
    let end = groups.end.to_be_bytes().to_vec();
    (start, end)
}

/// Visits the entries of a canonical stream whose key group is in `range`.
pub fn for_each_entry(
    bytes: &[u8],
    path: &str,
    range: Range<KeyGroup>,
    visit: &mut EntryVisitor,
) -> Result<(), StateError> {
    let corrupt = |message: String| StateError::Corrupt {
        state: path.to_string(),
        message,
    };
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| corrupt(format!("not a state file: {e}")))?;
    if reader.schema().fields() != entries_schema().fields() {
        return Err(corrupt(format!("unexpected columns {:?}", reader.schema().fields())));
    }
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(format!("unreadable: {e}")))?;
        if batch.columns().iter().any(|c| c.null_count() > 0) {
            return Err(corrupt("NULL in a state entry".into()));
        }
        let state = batch.column(0).as_string::<i32>();
        let group = batch.column(1).as_primitive::<UInt16Type>();
        let key = batch.column(2).as_binary::<i32>();
        let value = batch.column(3).as_binary::<i32>();
        for i in 0..batch.num_rows() {
            let g = group.value(i);
            if range.contains(&g) {
                visit(state.value(i), g, key.value(i), value.value(i))?;
            }
        }
    }
    Ok(())
}

fn rocks_err(dir: &Path, op: &str, e: rocksdb::Error) -> StateError {
    StateError::RocksDb {
        op: op.into(),
        path: dir.to_path_buf(),
        message: e.to_string(),
    }
}

/// Visits the entries of `range` in the RocksDB instance at `dir`, opened
/// read-only (a checkpoint's files are never modified).
pub fn for_each_in_rocksdb(dir: &Path, range: Range<KeyGroup>, visit: &mut EntryVisitor) -> Result<(), StateError> {
    let opts = Options::default();
    let names = DB::list_cf(&opts, dir).map_err(|e| rocks_err(dir, "listing the states of a checkpoint", e))?;
    let db = DB::open_cf_for_read_only(&opts, dir, &names, false)
        .map_err(|e| rocks_err(dir, "opening a checkpoint read-only", e))?;
    let (start, end) = group_bounds(&range);
    for name in names.iter().filter(|n| n.as_str() != "default") {
        let Some(cf) = db.cf_handle(name) else { continue };
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_iterate_upper_bound(end.clone());
        for item in db.iterator_cf_opt(cf, ro, IteratorMode::From(&start, rocksdb::Direction::Forward)) {
            let (k, v) = item.map_err(|e| rocks_err(dir, "reading a checkpoint", e))?;
            let (g, key) = split_group(&k, name)?;
            visit(name, g, key, &v)?;
        }
    }
    Ok(())
}

/// Copies the entries of `range` from every source into `backend`, whose
/// states are `states` (an entry of another state is an error: the
/// operator changed its states). Entries go in by [`StateBackend::ingest`]
/// in chunks of one state (RocksDB: SST files ingested directly).
pub fn import(
    backend: &mut dyn StateBackend,
    states: &[&str],
    sources: &[StateSource],
    range: Range<KeyGroup>,
) -> Result<u64, StateError> {
    const INGEST_CHUNK: usize = 256 * 1024;
    let mut total = 0u64;
    for source in sources {
        let sr = source.key_groups();
        let overlap = sr.start.max(range.start)..sr.end.min(range.end);
        if overlap.is_empty() {
            continue;
        }
        let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut chunk_state = 0usize;
        source.for_each(overlap, &mut |state, g, key, value| {
            let id = states
                .iter()
                .position(|s| *s == state)
                .ok_or_else(|| StateError::Corrupt {
                    state: state.to_string(),
                    message: format!(
                        "the restored state has a state '{state}' this operator does not declare ({states:?})"
                    ),
                })?;
            if id != chunk_state || chunk.len() >= INGEST_CHUNK {
                backend.ingest(chunk_state, std::mem::take(&mut chunk))?;
                chunk_state = id;
            }
            let mut k = Vec::with_capacity(2 + key.len());
            k.extend_from_slice(&g.to_be_bytes());
            k.extend_from_slice(key);
            chunk.push((k, value.to_vec()));
            total += 1;
            Ok(())
        })?;
        backend.ingest(chunk_state, chunk)?;
    }
    Ok(total)
}
