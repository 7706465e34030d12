//! `delta`: a Delta Lake table as an exactly-once sink (delta-rs,
//! `deltalake-core`).
//!
//! Each sink subtask writes Parquet files through delta-rs's
//! `RecordBatchWriter` (partitioning, rolling by size, statistics) into a
//! directory of its own inside the table, `weir-<job>/<attempt>-<subtask>/`:
//! the files are in the table's directory but in no version of it. At a
//! checkpoint's barrier the writer closes its files and describes them as
//! Delta `add` actions (the checkpoint holds them); when the checkpoint
//! completes, the committer adds every subtask's files in **one** Delta
//! commit carrying a `txn` action: app id `weir-<job>-<sink uid>`, version
//! the checkpoint id. A commit replayed after a crash finds its version
//! recorded and is skipped; the job's checkpoint ids continue above the
//! recorded version (see [`crate::checkpoint::Committer::committed_through`]),
//! so a run that lost its checkpoint directory never has its commits taken
//! for replays. Files of an attempt that no checkpoint holds are removed on
//! recovery (those of the job's own directories that no version of the
//! table references). Other writers of the same table are Delta's
//! optimistic concurrency's business: a blind append conflicts with none.
//!
//! The checkpoint interval is the table's freshness: rows become visible
//! when the checkpoint after them completes (see docs/delta.md).
//!
//! Read, a table is a bounded source of one snapshot (see [`source`]).

mod committer;
mod source;
mod store;
mod table;
mod upserts;
mod writer;

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use weir_catalog::{OptionKind, OptionSpec, Options};

use crate::connectors::{Committer, SinkContext, SinkFactory, SinkWriter};
use crate::error::Result;

pub use source::{DeltaSource, OPTIONS as SOURCE_OPTIONS};
pub use table::DeltaLocation;

pub const NAME: &str = "delta";

/// The Delta connector of Flink (`delta-flink`) names the table's place
/// `table-path`; either name is taken.
pub const FLINK_TABLE_PATH: &str = "table-path";
/// Flink's filesystem sink option: a file rolls once this large.
const FILE_SIZE: &str = "sink.rolling-policy.file-size";

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        crate::paths::TABLE_PATH,
        OptionKind::Location,
        "the table's directory ('file://' prefix allowed) or object-store URL ('s3://bucket/prefix', reached with the job's 's3.*' settings); created with the DDL's columns when it holds no Delta table",
    ),
    OptionSpec::new(
        FLINK_TABLE_PATH,
        OptionKind::Location,
        "the name Flink's Delta connector gives 'path' (give one of the two)",
    ),
    OptionSpec::new(
        FILE_SIZE,
        OptionKind::MemorySize,
        "a subtask's Parquet file rolls once this large (besides every checkpoint)",
    )
    .with_default("128 mb"),
    crate::connectors::filesystem::PARQUET_COMPRESSION_OPTION,
];

/// A Delta table as a sink.
#[derive(Debug)]
pub struct DeltaSink {
    table: Arc<DeltaLocation>,
    /// The DDL's columns as they are written (Delta's types).
    schema: SchemaRef,
    partition_keys: Vec<String>,
    file_size: u64,
    compression: parquet::basic::Compression,
    /// The DDL's `PRIMARY KEY … NOT ENFORCED`: the table is keyed and
    /// takes an updating query's changes.
    key: Option<upserts::TableKey>,
}

impl DeltaSink {
    /// The sink of table `name` (its DDL's `schema`, `PARTITIONED BY`
    /// columns and options). An existing Delta table at the path must
    /// have the DDL's columns, types and partition columns.
    pub fn new(
        options: &Options,
        schema: SchemaRef,
        partition_keys: &[String],
        name: &str,
        primary_key: Option<&[String]>,
        s3: &crate::checkpoint::objects::S3Settings,
    ) -> Result<Self> {
        let table = DeltaLocation::of(options, name, s3)?;
        let delta_schema = table::delta_schema(&schema, &table)?;
        for k in partition_keys {
            delta_schema
                .index_of(k)
                .map_err(|_| table.error(format!("partition column '{k}' is not a column")))?;
        }
        table.check_existing(&delta_schema, partition_keys)?;
        let key = primary_key
            .filter(|k| !k.is_empty())
            .map(|k| upserts::TableKey::new(&delta_schema, k))
            .transpose()
            .map_err(|e| table.error(e))?;
        let compression = crate::connectors::filesystem::parquet_compression(options);
        Ok(Self {
            table: Arc::new(table),
            schema: delta_schema,
            partition_keys: partition_keys.to_vec(),
            file_size: options.memory_size(FILE_SIZE)?.unwrap_or(128 << 20),
            compression,
            key,
        })
    }
}

impl SinkFactory for DeltaSink {
    fn name(&self) -> &str {
        NAME
    }

    /// A keyed table (a primary key) applies changes by key: `+I`/`+U`
    /// write the key's row, `-D` removes it (Flink's ONLY_UPDATE_AFTER).
    fn accepts_changes(&self) -> bool {
        self.key.is_some()
    }

    fn writes_upserts(&self) -> bool {
        self.key.is_some()
    }

    fn changes_hint(&self) -> String {
        "; a Delta table without a primary key takes inserts only (declare PRIMARY KEY (...) NOT ENFORCED to apply \
         an updating query's changes by key)"
            .into()
    }

    fn create_writer(&self, subtask: usize, _parallelism: usize, ctx: &SinkContext) -> Result<SinkWriter> {
        Ok(SinkWriter::Committing(Box::new(writer::DeltaWriter::new(
            self, subtask, ctx,
        )?)))
    }

    fn committer(&self, ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
        Some(Arc::new(committer::DeltaCommitter::new(self, ctx)))
    }
}
