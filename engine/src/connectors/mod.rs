//! Connectors: split-based sources and sinks, looked up by the table's
//! `'connector'` option.
//!
//! A source is a [`SourceFactory`] (the enumerator: it lists splits, and
//! the runtime assigns split `i` to reader `i % parallelism`) and its
//! [`SourceSplit`]s, each read independently with its own offset, so a
//! reader can interleave, pause (alignment) or checkpoint them one by one.
//!
//! - [`nexmark`]: the Nexmark benchmark generator (person/auction/bid).
//! - [`datagen`]: Flink's datagen (random and sequence fields).
//! - [`filesystem`]: files as splits; json, csv, parquet; source and sink.
//! - [`kafka`]: topic partitions as splits; source and sink.
//! - [`print`], [`blackhole`]: sinks.
//! - [`dead_letter`]: where sources put records they cannot parse
//!   (`scan.dead-letter.path`), exactly once with checkpoints.

pub mod blackhole;
pub mod datagen;
pub mod dead_letter;
pub mod delta;
pub mod filesystem;
pub mod kafka;
pub mod nexmark;
pub mod print;
pub mod sink_writer;

use std::fmt::Debug;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use weir_catalog::{OptionKind, OptionSpec, Options, TableDef};

use crate::error::{ConnectorError, Result};

/// Rows per batch a source produces when it can go as fast as it likes.
pub const DEFAULT_BATCH_ROWS: usize = 8192;

pub enum SplitPoll {
    Batch(RecordBatch),
    /// Changes with their row kinds (a changelog format).
    Changes(crate::change::ChangeBatch),
    /// Nothing before this instant (rate limited or waiting for data).
    Wait(tokio::time::Instant),
    Finished,
}

/// One independently readable part of a source (a file, a generator
/// partition). Batches have the table's physical schema.
pub trait SourceSplit: Send {
    fn id(&self) -> String;

    fn poll_batch(&mut self) -> Result<SplitPoll>;

    /// Rows consumed so far (shown by SHOW WATERMARKS).
    fn offset(&self) -> u64;

    /// Where a checkpoint records this split to be (defaults to `offset`).
    fn position(&self) -> u64 {
        self.offset()
    }

    /// Continues from a checkpointed `position`, before the first poll.
    fn seek(&mut self, position: u64) -> Result<()>;

    /// Where the split ends, when that was fixed as the job started (a
    /// bounded Kafka partition's stop offset): kept in checkpoints and
    /// given back to [`SourceFactory::restore_splits`].
    fn end(&self) -> Option<u64> {
        None
    }

    /// How far through its input a split of a bounded source is, when it
    /// knows where it ends: (done, total), in the split's own unit
    /// (events, rows, offsets). The progress of a bounded run is their sum.
    fn progress(&self) -> Option<(u64, u64)> {
        None
    }

    /// Whether this split can be paused on its own (watermark alignment).
    fn supports_pause(&self) -> bool {
        true
    }

    /// The split is read again after watermark alignment paused it for
    /// `paused`. A paced split (a generator's rate, `scan.lines-per-second`)
    /// moves its schedule on by that long: it resumes at its rate instead
    /// of catching up on the paused time in a burst, which would run its
    /// event time ahead of the drift alignment keeps.
    fn resumed_after(&mut self, _paused: std::time::Duration) {}

    /// The bad records the last `poll_batch` set aside for the dead-letter
    /// directory. The reader takes them right after every poll, so a
    /// checkpointed `position` covers exactly the records taken before it.
    /// Only a split whose factory has a [`SourceFactory::dead_letter_dir`]
    /// sets records aside.
    fn take_dead_letters(&mut self) -> Vec<dead_letter::BadRecord> {
        vec![]
    }

    /// Bad records skipped (`*.ignore-parse-errors`) since the last call.
    fn take_skipped(&mut self) -> u64 {
        0
    }

    /// Gives the split the reader's waker: a split whose data arrives by
    /// itself (a Kafka partition) notifies it when it has some, so the
    /// reader need not poll it on a timer.
    fn set_waker(&mut self, _waker: Arc<tokio::sync::Notify>) {}

    /// What the source's [`SourceFactory::committer`] is told about this
    /// split when a checkpoint holding it completes (a Kafka partition's
    /// offset, committed to the consumer group).
    fn committable(&self) -> Option<serde_json::Value> {
        None
    }
}

pub trait SourceFactory: Debug + Send + Sync {
    fn name(&self) -> &str;

    /// True when the source ends by itself.
    fn is_bounded(&self) -> bool;

    /// Whether checkpoints can record where the source is; a batch plan's
    /// output cannot (it runs again from the start), so its job takes
    /// none.
    fn checkpointed(&self) -> bool {
        true
    }

    /// What EXPLAIN shows of the source beyond its name (a batch plan's
    /// operators), one line per line.
    fn explain(&self) -> Option<String> {
        None
    }

    /// For an unbounded source: the option that would make it end, in
    /// the words of a refusal that needs a bounded one (batch mode).
    fn bounding_hint(&self) -> String {
        String::new()
    }

    /// Whether the source reads changes (`-U`, `+U`, `-D`), not only
    /// inserts (a changelog format such as debezium-json).
    fn produces_changes(&self) -> bool {
        false
    }

    /// Whether its changes are upserts by the table's PRIMARY KEY (`+U`
    /// and `-D`, no `-U`; a `-D` may know only the key's columns), as
    /// `upsert-kafka` reads them: the planner puts a changelog normalizer
    /// keyed by the PRIMARY KEY behind it.
    fn is_upsert(&self) -> bool {
        false
    }

    /// Every split of the source. `count` is for connectors that choose
    /// their number of splits (generators): the parallelism on a fresh
    /// start, the number the snapshot has positions for on a restore (so a
    /// restore at another parallelism reassigns the same splits). A
    /// split's id must depend only on the connector's options and `count`.
    fn create_splits(&self, count: usize) -> Result<Vec<Box<dyn SourceSplit>>>;

    /// The splits of a restore whose snapshot has positions for
    /// `recorded`: by default as many as it recorded. Connectors whose
    /// split ids carry their layout (a file's byte ranges) rebuild it from
    /// them; those with split ends take them back.
    fn restore_splits(&self, recorded: &[crate::checkpoint::SplitPosition]) -> Result<Vec<Box<dyn SourceSplit>>> {
        self.create_splits(recorded.len())
    }

    /// Where bad records go (`scan.dead-letter.path`); `None`: the source
    /// fails on them or skips them.
    fn dead_letter_dir(&self) -> Option<&std::path::Path> {
        None
    }

    /// How often the source's enumerator asks for splits that appeared
    /// since the job started ([`SourceFactory::discover`]); `None`: never.
    fn discovery_interval(&self) -> Option<std::time::Duration> {
        None
    }

    /// The splits that exist now and are not in `known` (every split of the
    /// source the job started with or found since). One enumerator asks,
    /// where the job is coordinated, and hands each new split to the
    /// reader the owner rule gives it (see `runtime::enumerator`).
    fn discover(&self, _known: &std::collections::BTreeSet<String>) -> Result<Vec<Box<dyn SourceSplit>>> {
        Ok(vec![])
    }

    /// Told the splits' [`SourceSplit::committable`]s of every completed
    /// checkpoint (Flink's `notifyCheckpointComplete` of a source reader).
    fn committer(&self, _ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
        None
    }
}

/// What a sink writer needs to know about its job.
#[derive(Debug, Clone)]
pub struct SinkContext {
    /// The job's name as a file-name-safe tag: identifies its files.
    pub job_tag: String,
    /// Unique per job attempt, so a restarted attempt never reuses a name.
    pub attempt: String,
    /// Checkpointing is on: output becomes visible only when a checkpoint
    /// completes (two-phase commit), not at end of input.
    pub exactly_once: bool,
    /// With checkpointing: how often checkpoints start, and how long one
    /// may take (a transaction must outlive both).
    pub checkpoint_interval: Option<std::time::Duration>,
    pub checkpoint_timeout: Option<std::time::Duration>,
    /// The job's processing-time clock (a partition's commit time).
    pub clock: crate::clock::Clock,
    /// A local directory of the job's (below its data dir) for files bound
    /// elsewhere (the parts of a table on an object store until they go
    /// up). Emptied when an attempt starts: what a killed process left
    /// there is of no use (its uploads are aborted or completed from the
    /// store) and would otherwise stay on the disk for good.
    pub spool_dir: std::path::PathBuf,
    /// The sink operator's uid ([`SinkContext::for_sink`]): names what a
    /// sink records in its own system (a Delta table's `txn` app id).
    pub sink_uid: String,
}

impl SinkContext {
    /// This context for the sink operator `uid`.
    pub fn for_sink(&self, uid: &str) -> SinkContext {
        SinkContext {
            sink_uid: uid.to_string(),
            ..self.clone()
        }
    }
}

pub trait SinkFactory: Debug + Send + Sync {
    fn name(&self) -> &str;

    /// The writer of one sink subtask (the last operator of its chain):
    /// a committing writer exactly when [`SinkFactory::committer`] gives a
    /// committer (the runtime checks, [`sink_writer::writer_operator`]).
    fn create_writer(&self, subtask: usize, parallelism: usize, ctx: &SinkContext) -> Result<SinkWriter>;

    /// Whether the sink takes updates and deletes (`-U`, `+U`, `-D`), not
    /// only inserts (Flink's `getChangelogMode`).
    fn accepts_changes(&self) -> bool {
        false
    }

    /// Whether an update must come as `-U` and `+U` (a changelog file
    /// format; Flink's retract-mode sinks). Other sinks that take changes
    /// are upsert sinks: a sink key shared by several live rows of the
    /// query needs `ON CONFLICT` there.
    fn requires_update_before(&self) -> bool {
        false
    }

    /// Whether the sink writes each change by key and needs no `-U` nor
    /// a delete's other columns (Flink's ONLY_UPDATE_AFTER sinks:
    /// `upsert-kafka`, `blackhole`): an upsert source feeding it through
    /// projections needs no changelog normalizer.
    fn writes_upserts(&self) -> bool {
        false
    }

    /// Appended to the planner's refusal of updates: what would take them.
    fn changes_hint(&self) -> String {
        String::new()
    }

    /// The committer of a two-phase-commit sink; `None` for sinks whose
    /// output is visible at once (print, blackhole).
    fn committer(&self, _ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
        None
    }
}

pub use crate::checkpoint::commit::Committer;
pub use sink_writer::{CommittingWriter, SinkWriter};

/// Table options every connector accepts.
/// Flink's `sink.parallelism`, of the sinks that have it (kafka,
/// upsert-kafka, filesystem, print).
pub const SINK_PARALLELISM: &str = "sink.parallelism";
const SINK_OPTIONS: &[OptionSpec] = &[OptionSpec::new(
    SINK_PARALLELISM,
    OptionKind::Int { min: 1, max: 32768 },
    "subtasks of the sink (default: its input's); rows reach it round-robin, or, from an updating input, by primary key",
)];

const COMMON_OPTIONS: &[OptionSpec] = &[
    OptionSpec::new("connector", OptionKind::String, "the connector"),
    OptionSpec::new(
        "scan.watermark.idle-timeout",
        OptionKind::Duration,
        "a split without input for this long is idle (overrides table.exec.source.idle-timeout)",
    ),
    OptionSpec::new(
        "scan.watermark.emit.strategy",
        OptionKind::Enum(&["on-periodic", "on-event"]),
        "emit watermarks periodically or after every row",
    )
    .with_default("on-periodic"),
    OptionSpec::new(
        "scan.watermark.alignment.group",
        OptionKind::String,
        "watermark alignment group (same as ALIGNMENT GROUP in the WATERMARK clause)",
    ),
    OptionSpec::new(
        "scan.watermark.alignment.max-drift",
        OptionKind::Duration,
        "how far ahead of the group minimum a split may run",
    ),
    OptionSpec::new(
        "scan.watermark.alignment.update-interval",
        OptionKind::Duration,
        "how often readers report and the group announces",
    )
    .with_default("1 s"),
];

const CONNECTORS: &[&str] = &[
    "nexmark",
    "datagen",
    "filesystem",
    "delta",
    "kafka",
    "upsert-kafka",
    "print",
    "blackhole",
];

fn specs_of(connector: &str) -> Option<Vec<OptionSpec>> {
    let own: Vec<&[OptionSpec]> = match connector {
        "nexmark" => vec![nexmark::OPTIONS],
        "datagen" => vec![datagen::OPTIONS],
        "filesystem" => vec![
            filesystem::OPTIONS,
            filesystem::FORMAT_OPTIONS,
            filesystem::ROLLING_OPTIONS,
            filesystem::partition::OPTIONS,
            SINK_OPTIONS,
        ],
        delta::NAME => vec![delta::OPTIONS, delta::SOURCE_OPTIONS, SINK_OPTIONS],
        "kafka" => vec![kafka::OPTIONS, filesystem::FORMAT_OPTIONS, SINK_OPTIONS],
        "upsert-kafka" => return Some(upsert_kafka_specs()),
        "print" => vec![print::OPTIONS, SINK_OPTIONS],
        "blackhole" => vec![],
        _ => return None,
    };
    Some(
        COMMON_OPTIONS
            .iter()
            .chain(own.into_iter().flatten())
            .copied()
            .collect(),
    )
}

fn upsert_kafka_specs() -> Vec<OptionSpec> {
    COMMON_OPTIONS
        .iter()
        .copied()
        .chain(kafka::upsert_options())
        .chain(filesystem::FORMAT_OPTIONS.iter().copied())
        .chain(SINK_OPTIONS.iter().copied())
        .collect()
}

fn config_error(connector: &str, message: impl Into<String>) -> ConnectorError {
    ConnectorError::Config {
        connector: connector.to_string(),
        message: message.into(),
    }
}

/// Validates a table's `WITH` options; returns the connector name.
pub fn validate_table(table: &TableDef) -> Result<(String, Options)> {
    let connector = table.connector().ok_or_else(|| {
        config_error(
            "?",
            format!(
                "table '{}' needs a 'connector' option; accepted: {}",
                table.name,
                CONNECTORS.join(", ")
            ),
        )
    })?;
    let specs = specs_of(connector).ok_or_else(|| {
        config_error(
            connector,
            format!("unknown connector; accepted: {}", CONNECTORS.join(", ")),
        )
    })?;
    let options = Options::validate(&table.options, &specs, &format!("connector '{connector}'"))?;
    if !table.partition_keys.is_empty() && connector != "filesystem" && connector != delta::NAME {
        return Err(config_error(
            connector,
            "PARTITIONED BY is supported by the 'filesystem' and 'delta' connectors only (their rows go to a directory per partition)",
        )
        .into());
    }
    if connector == "filesystem" {
        filesystem::validate(&options, &table.physical_schema())?;
        filesystem::validate_partitioning(&options, &table.partition_keys)?;
    }
    if connector == "datagen" {
        datagen::validate(&options, &table.physical_schema())?;
    }
    if connector == "nexmark" {
        nexmark::NexmarkSource::new(&options, table.physical_schema())?;
    }
    let metadata = TableDef::metadata_of(table.physical_columns());
    if connector == kafka::NAME {
        kafka::validate(&options, &table.physical_schema(), false, &metadata, &table.name)?;
    } else if connector == kafka::UPSERT_NAME {
        let kafka_specs = specs_of(kafka::NAME).unwrap_or_default();
        let options = kafka::upsert_as_kafka(&options, table.primary_key.as_deref(), &kafka_specs)?;
        kafka::validate(&options, &table.physical_schema(), true, &metadata, &table.name)?;
        return Ok((connector.to_string(), options));
    } else if let Some((i, key)) = metadata.first() {
        let column = table
            .physical_columns()
            .nth(*i)
            .map(|c| c.name.as_str())
            .unwrap_or_default();
        return Err(config_error(
            connector,
            format!(
                "has no metadata: column '{column}' of table '{}' declares METADATA FROM '{key}' \
                 (the 'kafka' and 'upsert-kafka' connectors have metadata columns)",
                table.name
            ),
        )
        .into());
    }
    Ok((connector.to_string(), options))
}

/// Whether a source may be given only the columns a query uses. Not for
/// positional formats (CSV, and Kafka's `raw`, which is one column): every
/// column must be read to find the ones wanted.
pub fn supports_column_pruning(table: &TableDef) -> bool {
    let positional = |key: &str| {
        table
            .options
            .get(key)
            .is_some_and(|f| ["csv", "raw", "avro"].iter().any(|p| f.eq_ignore_ascii_case(p)))
    };
    match table.connector() {
        Some("filesystem") => !positional("format"),
        // Every column's options are its own, and a sequence column
        // bounds the rows even when no query reads it (Flink's datagen
        // takes no projection either).
        Some("datagen") => false,
        Some(kafka::NAME | kafka::UPSERT_NAME) => !["format", "value.format", "key.format"].into_iter().any(positional),
        _ => true,
    }
}

/// Columns a source needs whatever a query uses: a Kafka record key's
/// (`key.fields`; an `upsert-kafka` table's PRIMARY KEY), so that the key
/// still decodes and changes still find their rows.
pub fn required_columns(table: &TableDef) -> Vec<String> {
    match table.connector() {
        Some(kafka::NAME) => table
            .options
            .get("key.fields")
            .map(|k| {
                k.split(';')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        Some(kafka::UPSERT_NAME) => table.primary_key.clone().unwrap_or_default(),
        _ => vec![],
    }
}

/// The columns a connector supplies when the table declares none
/// (`CREATE TABLE bid WITH ('connector' = 'nexmark', ...)`).
pub fn default_schema(table: &TableDef) -> Result<Option<SchemaRef>> {
    let (connector, options) = validate_table(table)?;
    Ok(match connector.as_str() {
        "nexmark" => Some(nexmark::table_schema(&options)?),
        _ => None,
    })
}

/// Checks every path option of `table` against `paths` (the allowed
/// directories of the session or job), and the client properties a
/// connector passes through.
pub fn check_table_paths(table: &TableDef, paths: &crate::paths::PathPolicy) -> Result<()> {
    let Some(specs) = table.connector().and_then(specs_of) else {
        return Ok(());
    };
    let denied = |e: crate::paths::PathDenied| ConnectorError::PermissionDenied(format!("table '{}': {e}", table.name));
    paths.check_options(&table.options, &specs).map_err(denied)?;
    // Options a connector hands to its client library as they are.
    if matches!(table.connector(), Some(kafka::NAME | kafka::UPSERT_NAME)) {
        kafka::client_properties::check(&table.options, paths).map_err(denied)?;
    }
    Ok(())
}

/// The source of `table`; `s3` reaches a table on S3 (the job's `s3.*`).
pub fn create_source(
    table: &TableDef,
    paths: &crate::paths::PathPolicy,
    s3: &crate::checkpoint::objects::S3Settings,
) -> Result<Arc<dyn SourceFactory>> {
    check_table_paths(table, paths)?;
    let (connector, options) = validate_table(table)?;
    let schema = table.physical_schema();
    Ok(match connector.as_str() {
        "nexmark" => Arc::new(nexmark::NexmarkSource::new(&options, schema)?),
        "datagen" => Arc::new(datagen::DatagenSource::new(&options, schema)?),
        "filesystem" => Arc::new(filesystem::FileSource::new(
            &options,
            schema,
            &table.partition_keys,
            s3,
        )?),
        delta::NAME => Arc::new(delta::DeltaSource::new(
            &options,
            schema,
            &table.partition_keys,
            &table.name,
            s3,
        )?),
        "kafka" | "upsert-kafka" => {
            let metadata = TableDef::metadata_of(table.physical_columns());
            let upsert = connector == kafka::UPSERT_NAME;
            Arc::new(kafka::KafkaSource::new(
                &options,
                schema,
                &table.name,
                upsert,
                &metadata,
            )?)
        }
        other => {
            return Err(config_error(other, "can only be used as a sink (INSERT INTO), not read from").into());
        }
    })
}

/// The sink of `table`; `s3` reaches a table on S3 (the job's `s3.*`).
pub fn create_sink(
    table: &TableDef,
    paths: &crate::paths::PathPolicy,
    s3: &crate::checkpoint::objects::S3Settings,
) -> Result<Arc<dyn SinkFactory>> {
    check_table_paths(table, paths)?;
    let (connector, options) = validate_table(table)?;
    // An INSERT writes every column but the virtual metadata ones.
    let schema = table.writable_schema();
    Ok(match connector.as_str() {
        "print" => Arc::new(print::PrintSink::new(&options, &table.name)),
        "blackhole" => Arc::new(blackhole::BlackholeSink),
        "filesystem" => Arc::new(filesystem::FileSink::new(&options, schema, &table.partition_keys, s3)?),
        delta::NAME => Arc::new(delta::DeltaSink::new(
            &options,
            schema,
            &table.partition_keys,
            &table.name,
            table.primary_key.as_deref(),
            s3,
        )?),
        "kafka" | "upsert-kafka" => {
            let metadata = TableDef::metadata_of(table.writable_columns());
            let upsert = connector == kafka::UPSERT_NAME;
            Arc::new(kafka::KafkaSink::new(&options, schema, &table.name, upsert, &metadata)?)
        }
        other => {
            return Err(config_error(other, "is a source only; it cannot be written to").into());
        }
    })
}

/// A pattern option (`*.include`, `topic-pattern`) matched against a whole
/// name, as Java's `Pattern.matches` does; a bad pattern is an error that
/// names `key` and what the regex parser found wrong.
pub(crate) fn whole_name_pattern(key: &str, pattern: &str) -> Result<regex::Regex> {
    regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
        weir_catalog::CatalogError::InvalidOption {
            key: key.into(),
            // The parser's last line says what is wrong (the lines before
            // draw the pattern).
            message: format!(
                "invalid regular expression '{pattern}': {}",
                e.to_string()
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .trim_start_matches("error: ")
            ),
        }
        .into()
    })
}
