//! Where a Delta table is, and what it must look like: the DDL's columns
//! as Delta types, an existing table checked against them, a missing one
//! created.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake_core::kernel::StructType;
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::{DeltaTable, DeltaTableBuilder};
use weir_catalog::Options;

use crate::checkpoint::objects::{S3Settings, block_on};
use crate::error::{ConnectorError, ExecError, Result};

/// A Delta table's place: its URL (a local directory's `file://` URL, or
/// an object store's), and the catalog table that names it (for
/// messages).
#[derive(Debug, Clone)]
pub struct DeltaLocation {
    /// The table's root, ending in '/'.
    pub url: url::Url,
    /// The directory of a local table.
    pub local: Option<PathBuf>,
    /// Where the table is, as messages say it.
    pub shown: String,
    pub name: String,
    /// The bucket of a table on an object store (its uploads in progress
    /// are listed and aborted by recovery, on S3).
    pub bucket: Option<Arc<crate::checkpoint::objects::Bucket>>,
}

impl DeltaLocation {
    /// The table at the sink's `path`; one on an object store is reached
    /// with the job's `s3.*` settings.
    pub fn of(options: &Options, name: &str, s3: &S3Settings) -> Result<Self> {
        let config = |message: String| -> ExecError {
            ConnectorError::Config {
                connector: super::NAME.into(),
                message,
            }
            .into()
        };
        let raw = match (
            options.get(crate::paths::TABLE_PATH),
            options.get(super::FLINK_TABLE_PATH),
        ) {
            (Some(_), Some(_)) => {
                return Err(config(format!(
                    "table '{name}': 'path' and 'table-path' name the same thing; give one"
                )));
            }
            (Some(p), None) | (None, Some(p)) => p,
            (None, None) => options.require(crate::paths::TABLE_PATH)?,
        };
        if crate::paths::is_object_url(raw) {
            let shown = crate::paths::normalize_url(raw).map_err(|e| config(format!("table '{name}': 'path': {e}")))?;
            let bucket = crate::checkpoint::objects::open_bucket(&shown, s3)
                .map_err(|e| config(format!("table '{name}': 'path': {e}")))?;
            let url = url::Url::parse(&format!("{shown}/"))
                .map_err(|e| config(format!("table '{name}': 'path' = '{raw}' is not a URL: {e}")))?;
            super::store::register(&url, bucket.store.clone());
            return Ok(Self {
                url,
                local: None,
                shown,
                name: name.to_string(),
                bucket: Some(Arc::new(bucket)),
            });
        }
        let dir = crate::paths::local_path(raw);
        let dir = if dir.is_absolute() {
            dir
        } else {
            std::env::current_dir()
                .map_err(|e| config(format!("table '{name}': the working directory: {e}")))?
                .join(dir)
        };
        let url = url::Url::from_directory_path(&dir)
            .map_err(|_| config(format!("table '{name}': 'path' = '{raw}' is not a directory path")))?;
        Ok(Self {
            url,
            shown: dir.display().to_string(),
            local: Some(dir),
            name: name.to_string(),
            bucket: None,
        })
    }

    /// An error about this table, naming it and its path.
    pub fn error(&self, message: impl std::fmt::Display) -> ExecError {
        ConnectorError::Data {
            location: format!("Delta table '{}' at {}", self.name, self.shown),
            message: message.to_string(),
        }
        .into()
    }

    /// The table's store failed or could not be reached (a request may
    /// succeed when tried again), unlike [`DeltaLocation::error`]: what
    /// the table holds is at fault.
    pub fn unreachable(&self, message: impl std::fmt::Display) -> ExecError {
        ConnectorError::External {
            system: format!("Delta table '{}' at {}", self.name, self.shown),
            message: message.to_string(),
        }
        .into()
    }

    /// A continuous read cannot follow what the table's log holds now.
    pub fn cannot_follow(&self, message: impl std::fmt::Display) -> ExecError {
        ConnectorError::CannotFollow {
            location: format!("Delta table '{}' at {}", self.name, self.shown),
            message: message.to_string(),
        }
        .into()
    }

    /// The URL of `rel`, a directory inside the table.
    pub fn dir_url(&self, rel: &str) -> Result<url::Url> {
        self.url
            .join(&format!("{}/", rel.trim_end_matches('/')))
            .map_err(|e| self.error(format!("'{rel}' inside the table: {e}")))
    }

    /// The table, its log not read yet.
    pub fn unloaded(&self) -> Result<DeltaTable> {
        DeltaTableBuilder::from_url(self.url.clone())
            .and_then(|b| b.build())
            .map_err(|e| self.error(format!("cannot open the table: {e}")))
    }

    /// The store of the table's files, rooted at the table.
    pub fn files(&self) -> Result<Arc<dyn object_store::ObjectStore>> {
        Ok(self.unloaded()?.log_store().object_store(None))
    }

    /// Whether a Delta table is there (its log has a commit).
    pub fn exists(&self) -> Result<bool> {
        if let Some(dir) = &self.local {
            return Ok(std::fs::read_dir(dir.join("_delta_log"))
                .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".json")))));
        }
        let files = self.files()?;
        block_on("a Delta table", async move {
            use futures::TryStreamExt;
            let log = object_store::path::Path::from("_delta_log");
            let mut listing = files.list(Some(&log));
            while let Some(meta) = listing.try_next().await? {
                if meta.location.as_ref().ends_with(".json") {
                    return Ok(true);
                }
            }
            Ok::<_, object_store::Error>(false)
        })
        .map_err(|e| self.error(e))?
        .map_err(|e| self.error(format!("cannot list its log: {e}")))
    }

    /// The table at its latest version (blocking).
    pub fn load(&self) -> Result<DeltaTable> {
        let mut table = self.unloaded()?;
        block_on("a Delta table", async move {
            table.load().await?;
            Ok::<_, deltalake_core::DeltaTableError>(table)
        })
        .map_err(|e| self.error(e))?
        .map_err(|e| self.error(format!("cannot read the table: {e}")))
    }

    /// Creates the table with `schema`'s columns unless one is there
    /// (blocking). Two writers creating it at once: one wins, the other
    /// finds it.
    pub fn create_if_absent(&self, schema: &SchemaRef, partition_keys: &[String]) -> Result<()> {
        if self.exists()? {
            return Ok(());
        }
        if let Some(dir) = &self.local {
            std::fs::create_dir_all(dir).map_err(|e| self.error(format!("cannot create the directory: {e}")))?;
        }
        let columns = kernel_schema(schema).map_err(|e| self.error(e))?;
        let url = self.url.clone();
        let name = self.name.clone();
        let keys = partition_keys.to_vec();
        block_on("a Delta table", async move {
            deltalake_core::operations::create::CreateBuilder::new()
                .with_location(url.to_string())
                .with_table_name(name)
                .with_columns(columns.fields().cloned())
                .with_partition_columns(keys)
                .with_save_mode(deltalake_core::protocol::SaveMode::Ignore)
                .await
                .map(|_| ())
        })
        .map_err(|e| self.error(e))?
        .map_err(|e| self.error(format!("cannot create the table: {e}")))
    }

    /// An existing table must have the DDL's columns (names, types) and
    /// partition columns; a missing one is created by the job.
    pub fn check_existing(&self, schema: &SchemaRef, partition_keys: &[String]) -> Result<()> {
        if !self.exists()? {
            return Ok(());
        }
        let table = self.load()?;
        let snapshot = table.snapshot().map_err(|e| self.error(e))?;
        check_columns(self, snapshot, schema, partition_keys, true)
    }
}

/// `snapshot` must have the DDL's columns (`schema`, in Delta's types) with
/// their types; with `whole` (a sink) no column besides, and the DDL's
/// partition columns. A source may declare fewer columns than the table
/// has, and no `PARTITIONED BY` (the log says which columns are).
pub fn check_columns(
    table: &DeltaLocation,
    snapshot: &deltalake_core::table::state::DeltaTableState,
    schema: &SchemaRef,
    partition_keys: &[String],
    whole: bool,
) -> Result<()> {
    let theirs = snapshot.schema();
    let ours = kernel_schema(schema).map_err(|e| table.error(e))?;
    for field in ours.fields() {
        match theirs.field(field.name()) {
            None => {
                return Err(table.error(format!(
                    "the DDL's column '{}' is not in the table (its columns: {})",
                    field.name(),
                    theirs
                        .fields()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            Some(t) if t.data_type() != field.data_type() => {
                return Err(table.error(format!(
                    "column '{}' is {} in the DDL (Delta type {}) but {} in the table",
                    field.name(),
                    ddl_type(schema, field.name()),
                    field.data_type(),
                    t.data_type()
                )));
            }
            Some(_) => {}
        }
    }
    if whole && let Some(extra) = theirs.fields().find(|f| ours.field(f.name()).is_none()) {
        return Err(table.error(format!(
            "the table's column '{}' ({}) is not in the DDL",
            extra.name(),
            extra.data_type()
        )));
    }
    let table_keys = snapshot.metadata().partition_columns().to_vec();
    if (whole || !partition_keys.is_empty()) && table_keys != partition_keys {
        return Err(table.error(format!(
            "the table is partitioned by [{}], the DDL by [{}]",
            table_keys.join(", "),
            partition_keys.join(", ")
        )));
    }
    Ok(())
}

/// The DDL's type of `column`, as the DDL's Arrow type reads.
fn ddl_type(schema: &SchemaRef, column: &str) -> String {
    schema
        .field_with_name(column)
        .map(|f| f.data_type().to_string())
        .unwrap_or_default()
}

/// `schema` as a Delta schema.
pub(super) fn kernel_schema(schema: &SchemaRef) -> std::result::Result<StructType, String> {
    schema
        .clone()
        .try_into_kernel()
        .map_err(|e: arrow::error::ArrowError| format!("the DDL's columns have no Delta type: {e}"))
}

/// The DDL's columns as written to Delta: timestamps in microseconds (the
/// only unit Delta has), a TIMESTAMP as Delta's `timestamp_ntz`, a
/// TIMESTAMP_LTZ as `timestamp` (UTC). A type Delta lacks is an error
/// naming the column.
pub fn delta_schema(schema: &SchemaRef, table: &DeltaLocation) -> Result<SchemaRef> {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(delta_type(f.data_type())))
        .collect();
    let out: SchemaRef = Arc::new(Schema::new(fields));
    for f in out.fields() {
        let one: SchemaRef = Arc::new(Schema::new(vec![f.as_ref().clone()]));
        kernel_schema(&one).map_err(|e| {
            table.error(format!(
                "column '{}' ({}) cannot be written to Delta: {e}",
                f.name(),
                ddl_type(schema, f.name())
            ))
        })?;
    }
    Ok(out)
}

fn delta_type(t: &DataType) -> DataType {
    match t {
        DataType::Timestamp(_, None) => DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp(_, Some(_)) => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        DataType::List(f) => DataType::List(Arc::new(f.as_ref().clone().with_data_type(delta_type(f.data_type())))),
        DataType::Struct(fs) => DataType::Struct(
            fs.iter()
                .map(|f| f.as_ref().clone().with_data_type(delta_type(f.data_type())))
                .collect(),
        ),
        DataType::Map(f, sorted) => DataType::Map(
            Arc::new(f.as_ref().clone().with_data_type(delta_type(f.data_type()))),
            *sorted,
        ),
        other => other.clone(),
    }
}

/// `batch` (the DDL's columns) in `schema`'s types (see [`delta_schema`]).
pub fn to_delta(
    batch: &arrow::record_batch::RecordBatch,
    schema: &SchemaRef,
) -> Result<arrow::record_batch::RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                arrow::compute::cast(c, f.data_type())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(arrow::record_batch::RecordBatch::try_new(schema.clone(), columns)?)
}
