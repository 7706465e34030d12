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
/// Flink's parquet format option: a row group closes once this large.
const BLOCK_SIZE: &str = "parquet.block.size";
/// The row groups of files written here (4 MiB, not Flink's and Spark's
/// 128 MiB): delta-rs writes through parquet's async writer, which
/// gathers each finished row group into one fresh buffer before its upload
/// (doubling it as it grows, past the allocator's 16 MiB huge-object
/// bound at 1 M rows of Nexmark bids); 4 MiB groups halved the page faults
/// and brought a pass-through job from 1.2-1.35x to 1.05-1.15x the
/// Parquet file sink's time (docs/benchmarks.md). A few hundred thousand
/// rows a group, as DuckDB and Polars write; readers skip by row group.
const DEFAULT_BLOCK_SIZE: usize = 4 << 20;

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
    OptionSpec::new(
        BLOCK_SIZE,
        OptionKind::MemorySize,
        "a Parquet row group closes once this large (encoded); larger groups take more memory while written",
    )
    .with_default("4 mb"),
];

/// A Delta table as a sink.
#[derive(Debug)]
pub struct DeltaSink {
    table: Arc<DeltaLocation>,
    /// The DDL's columns as they are written (Delta's types).
    schema: SchemaRef,
    partition_keys: Vec<String>,
    file_size: u64,
    /// `parquet.compression` and `parquet.block.size`.
    parquet: parquet::file::properties::WriterProperties,
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
        let block_size = match options.memory_size(BLOCK_SIZE)? {
            Some(0) => return Err(table.error(format!("'{BLOCK_SIZE}' must be more than 0 bytes"))),
            Some(b) => usize::try_from(b).unwrap_or(usize::MAX),
            None => DEFAULT_BLOCK_SIZE,
        };
        let parquet = parquet::file::properties::WriterProperties::builder()
            .set_compression(crate::connectors::filesystem::parquet_compression(options))
            .set_max_row_group_bytes(Some(block_size))
            .build();
        Ok(Self {
            table: Arc::new(table),
            schema: delta_schema,
            partition_keys: partition_keys.to_vec(),
            file_size: options.memory_size(FILE_SIZE)?.unwrap_or(128 << 20),
            parquet,
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
