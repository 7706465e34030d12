//! `filesystem`: files as a bounded source (one file = one split) and as a
//! sink (part files per subtask), in `json` (one object per line), `csv` or
//! `parquet`, with Flink's option names and defaults.
//!
//! - `source`: the source and its split readers; bad records fail the
//!   job, are skipped (`*.ignore-parse-errors`) or go to the dead-letter
//!   directory (`scan.dead-letter.path`, [`crate::connectors::dead_letter`]).
//! - `sink`: the part-file writer.
//! - `part_file`: the two-phase commit of files, shared by the sink and
//!   dead letters; `object_files`: its object-store form (a table whose
//!   path is an `s3://` URL: uncompleted multipart uploads).

pub(crate) mod changelog;
pub(crate) mod object_files;
pub(crate) mod part_file;
pub(crate) mod partition;
mod records;
pub(crate) mod sink;
pub(crate) mod source;
pub(crate) mod text_time;

pub use sink::FileSink;
pub use source::FileSource;

use arrow::datatypes::SchemaRef;
use weir_catalog::{OptionKind, OptionSpec, Options};

use super::config_error;
use crate::connectors::dead_letter::PATH_OPTION as DEAD_LETTER_PATH;
use crate::error::Result;

/// The options of the text formats (json, csv and the changelog
/// formats), shared with the Kafka connector.
pub const FORMAT_OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "canal-json.ignore-parse-errors",
        OptionKind::Bool,
        "skip lines that do not parse",
    )
    .with_default("false"),
    OptionSpec::new(
        "canal-json.timestamp-format.standard",
        OptionKind::Enum(&["SQL", "ISO-8601"]),
        "how timestamps are written: 'yyyy-MM-dd HH:mm:ss.SSS' or 'yyyy-MM-ddTHH:mm:ss.SSS'",
    )
    .with_default("SQL"),
    OptionSpec::new(
        "canal-json.database.include",
        OptionKind::String,
        "read only messages whose \"database\" matches this regular expression (the whole name)",
    ),
    OptionSpec::new(
        "canal-json.table.include",
        OptionKind::String,
        "read only messages whose \"table\" matches this regular expression (the whole name)",
    ),
    OptionSpec::new(
        "maxwell-json.ignore-parse-errors",
        OptionKind::Bool,
        "skip lines that do not parse",
    )
    .with_default("false"),
    OptionSpec::new(
        "maxwell-json.timestamp-format.standard",
        OptionKind::Enum(&["SQL", "ISO-8601"]),
        "how timestamps are written: 'yyyy-MM-dd HH:mm:ss.SSS' or 'yyyy-MM-ddTHH:mm:ss.SSS'",
    )
    .with_default("SQL"),
    OptionSpec::new(
        "debezium-json.ignore-parse-errors",
        OptionKind::Bool,
        "skip lines that do not parse",
    )
    .with_default("false"),
    OptionSpec::new(
        "debezium-json.schema-include",
        OptionKind::Bool,
        "messages carry a schema ('schema' and 'payload'): not supported",
    )
    .with_default("false"),
    OptionSpec::new(
        "debezium-json.timestamp-format.standard",
        OptionKind::Enum(&["SQL", "ISO-8601"]),
        "how timestamps are written: 'yyyy-MM-dd HH:mm:ss.SSS' or 'yyyy-MM-ddTHH:mm:ss.SSS'",
    )
    .with_default("SQL"),
    OptionSpec::new(
        "json.ignore-parse-errors",
        OptionKind::Bool,
        "skip lines that do not parse",
    )
    .with_default("false"),
    OptionSpec::new(
        "json.timestamp-format.standard",
        OptionKind::Enum(&["SQL", "ISO-8601"]),
        "how timestamps are written: 'yyyy-MM-dd HH:mm:ss.SSS' or 'yyyy-MM-ddTHH:mm:ss.SSS'",
    )
    .with_default("SQL"),
    OptionSpec::new("csv.field-delimiter", OptionKind::String, "one character").with_default(","),
    OptionSpec::new("csv.quote-character", OptionKind::String, "one character").with_default("\""),
    OptionSpec::new(
        "csv.ignore-parse-errors",
        OptionKind::Bool,
        "skip rows that do not parse",
    )
    .with_default("false"),
    OptionSpec::new("csv.allow-comments", OptionKind::Bool, "ignore lines starting with '#'").with_default("false"),
    OptionSpec::new(
        "csv.null-literal",
        OptionKind::String,
        "a field that is exactly this text is NULL (read), and NULL is written as it; without it no field is NULL and NULL is written as an empty field",
    ),
    PARQUET_COMPRESSION_OPTION,
];

/// Flink's parquet format option (its default is SNAPPY, as here).
pub const PARQUET_COMPRESSION: &str = "parquet.compression";
pub const PARQUET_COMPRESSION_OPTION: OptionSpec = OptionSpec::new(
    PARQUET_COMPRESSION,
    OptionKind::Enum(&["snappy", "zstd", "gzip", "brotli", "lz4", "lz4_raw", "uncompressed"]),
    "the Parquet files' compression ('lz4' is written as LZ4_RAW, which every reader takes)",
)
.with_default("snappy");

/// The `parquet.compression` of `options` (SNAPPY unless given, as Flink's
/// parquet writer).
pub fn parquet_compression(options: &Options) -> parquet::basic::Compression {
    use parquet::basic::Compression;
    match options.enum_value(PARQUET_COMPRESSION).as_deref() {
        Some("zstd") => Compression::ZSTD(Default::default()),
        Some("gzip") => Compression::GZIP(Default::default()),
        Some("brotli") => Compression::BROTLI(Default::default()),
        Some("lz4" | "lz4_raw") => Compression::LZ4_RAW,
        Some("uncompressed") => Compression::UNCOMPRESSED,
        _ => Compression::SNAPPY,
    }
}

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        crate::paths::TABLE_PATH,
        OptionKind::Location,
        "a file or directory ('file://' prefix allowed), or an s3://, gs://, az:// URL (s3.* options reach it)",
    ),
    OptionSpec::new(
        "format",
        OptionKind::Enum(&["json", "csv", "parquet", "debezium-json", "canal-json", "maxwell-json"]),
        "the file format; debezium-json, canal-json and maxwell-json hold changes (an update is written as a delete and an insert)",
    ),
    OptionSpec::new(
        DEAD_LETTER_PATH,
        OptionKind::Path,
        "a directory for the records that fail to parse (json, csv): one JSON line each, exactly once with checkpoints",
    ),
    OptionSpec::new(
        "scan.lines-per-second",
        OptionKind::Int { min: 0, max: i64::MAX },
        "read at most this many lines a second from each file (json, csv; 0 = unlimited): replays at a steady pace",
    )
    .with_default("0"),
    OptionSpec::new(
        source::MIN_SPLIT_OPTION,
        OptionKind::Int { min: 1, max: i64::MAX },
        "bytes: with fewer files than readers, json and csv files are cut into byte ranges of at least this size, read by several subtasks",
    )
    .with_default("8388608"),
    OptionSpec::new(
        source::MONITOR_OPTION,
        OptionKind::Duration,
        "makes the source unbounded: the path is listed again at this interval and each new file read once, whole (write files elsewhere or hidden, then move them in: a file is known by its path); without it the path is read once",
    ),
];

pub const ROLLING_FILE_SIZE: &str = "sink.rolling-policy.file-size";
pub const ROLLOVER_INTERVAL: &str = "sink.rolling-policy.rollover-interval";
pub const ROLLING_CHECK_INTERVAL: &str = "sink.rolling-policy.check-interval";

/// The sink's rolling policy (Flink's): a part file is closed when it
/// reaches a size or an age, and at every checkpoint.
pub const ROLLING_OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        ROLLING_FILE_SIZE,
        OptionKind::MemorySize,
        "a part file is closed (and a new one started) once it is this large",
    )
    .with_default("128 mb"),
    OptionSpec::new(
        ROLLOVER_INTERVAL,
        OptionKind::Duration,
        "a part file is closed once it has been open this long",
    )
    .with_default("30 min"),
    OptionSpec::new(
        ROLLING_CHECK_INTERVAL,
        OptionKind::Duration,
        "how often open part files are checked against the rollover interval",
    )
    .with_default("1 min"),
];

/// Partition options on a table that is not partitioned are a mistake
/// (they would do nothing): refused by name. On a partitioned one, the
/// commit policy must parse.
pub fn validate_partitioning(options: &Options, keys: &[String]) -> Result<()> {
    if keys.is_empty() {
        if let Some(key) = options
            .raw()
            .keys()
            .find(|k| partition::OPTIONS.iter().any(|s| s.matches(k)))
        {
            return Err(config_error(
                "filesystem",
                format!("option '{key}' applies to partitioned tables only (PARTITIONED BY (...))"),
            )
            .into());
        }
        return Ok(());
    }
    partition::CommitPolicy::from_options(options, keys)?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
    Parquet,
    /// Debezium's change envelope, one JSON object per line:
    /// `{"before":{..},"after":{..},"op":"c|r|u|d"}`.
    DebeziumJson,
    /// Canal's: `{"data":[..],"old":[..],"type":"INSERT|UPDATE|DELETE"}`.
    CanalJson,
    /// Maxwell's: `{"data":{..},"old":{..},"type":"insert|update|delete"}`.
    MaxwellJson,
}

impl Format {
    /// One JSON document per line (json and the changelog formats).
    pub fn is_json(self) -> bool {
        !matches!(self, Format::Csv | Format::Parquet)
    }

    /// A format whose records are changes, not rows.
    pub fn is_changelog(self) -> bool {
        matches!(self, Format::DebeziumJson | Format::CanalJson | Format::MaxwellJson)
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Csv => "csv",
            Format::Parquet => "parquet",
            Format::DebeziumJson => "debezium-json",
            Format::CanalJson => "canal-json",
            Format::MaxwellJson => "maxwell-json",
        }
    }

    /// The option prefix of the format's own options.
    fn prefix(self) -> &'static str {
        match self {
            Format::Json => "json.",
            Format::Csv => "csv.",
            Format::Parquet => "parquet.",
            Format::DebeziumJson => "debezium-json.",
            Format::CanalJson => "canal-json.",
            Format::MaxwellJson => "maxwell-json.",
        }
    }
}

#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub format: Format,
    pub ignore_parse_errors: bool,
    pub iso_timestamps: bool,
    pub delimiter: u8,
    pub quote: u8,
    pub allow_comments: bool,
    /// `csv.null-literal`: the text of NULL. Without it a CSV field is
    /// never NULL (an empty STRING is `''`), as in Flink.
    pub null_literal: Option<String>,
    /// canal-json: the database and table name patterns to keep (anchored).
    pub canal_database: Option<regex::Regex>,
    pub canal_table: Option<regex::Regex>,
    /// `parquet.compression` (written files).
    pub parquet_compression: parquet::basic::Compression,
}

/// A `*.include` pattern, matched against the whole name as Java's
/// `Pattern.matches` does.
fn include_pattern(options: &Options, key: &str) -> Result<Option<regex::Regex>> {
    options.get(key).map(|p| super::whole_name_pattern(key, p)).transpose()
}

fn single_byte(options: &Options, key: &str) -> Result<u8> {
    let v = options.get(key).unwrap_or_default();
    let v = if v == "\\t" { "\t" } else { v };
    match v.as_bytes() {
        [b] => Ok(*b),
        _ => Err(weir_catalog::CatalogError::InvalidOption {
            key: key.into(),
            message: format!("invalid value '{v}', expected a single ASCII character"),
        }
        .into()),
    }
}

pub fn path_of(options: &Options) -> Result<std::path::PathBuf> {
    // The same reading as the allowed-directories check.
    Ok(crate::paths::local_path(options.require("path")?))
}

/// The dead-letter directory, if the table has one.
pub fn dead_letter_path_of(options: &Options) -> Option<std::path::PathBuf> {
    options.get(DEAD_LETTER_PATH).map(crate::paths::local_path)
}

/// The same directory, whether spelled alike or not (when both exist).
fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    let normal = |p: &std::path::Path| p.components().collect::<std::path::PathBuf>();
    normal(a) == normal(b) || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

pub fn format_options(options: &Options) -> Result<FormatOptions> {
    format_options_named(options, options.require("format")?)
}

/// The options of format `name` (json, csv, parquet, or a changelog
/// format), read from `options` (the Kafka connector's `value.format`).
pub fn format_options_named(options: &Options, name: &str) -> Result<FormatOptions> {
    let format = match name.to_ascii_lowercase().as_str() {
        "json" => Format::Json,
        "csv" => Format::Csv,
        "debezium-json" => Format::DebeziumJson,
        "canal-json" => Format::CanalJson,
        "maxwell-json" => Format::MaxwellJson,
        _ => Format::Parquet,
    };
    let ignore = match format {
        Format::Parquet => None,
        f => options.bool(&format!("{}ignore-parse-errors", f.prefix()))?,
    };
    Ok(FormatOptions {
        format,
        ignore_parse_errors: ignore.unwrap_or(false),
        iso_timestamps: options
            .enum_value(&format!("{}timestamp-format.standard", format.prefix()))
            .as_deref()
            == Some("iso-8601"),
        delimiter: single_byte(options, "csv.field-delimiter")?,
        quote: single_byte(options, "csv.quote-character")?,
        allow_comments: options.bool("csv.allow-comments")?.unwrap_or(false),
        null_literal: options.get("csv.null-literal").map(str::to_string),
        canal_database: include_pattern(options, "canal-json.database.include")?,
        canal_table: include_pattern(options, "canal-json.table.include")?,
        parquet_compression: parquet_compression(options),
    })
}

/// Checks what can be checked before the table is used.
pub fn validate(options: &Options, schema: &SchemaRef) -> Result<()> {
    let path = path_of(options)?;
    let f = format_options(options)?;
    if f.format == Format::Csv
        && let Some(nested) = schema.fields().iter().find(|c| c.data_type().is_nested())
    {
        // Arrow's CSV has no nested values; Flink's writes them with
        // `csv.array-element-delimiter`, which Weir does not have yet.
        return Err(config_error(
            "filesystem",
            format!(
                "format 'csv' cannot hold column '{}': ARRAY, MAP and ROW columns are not supported in CSV yet (use 'json' or 'parquet')",
                nested.name()
            ),
        )
        .into());
    }
    for key in options.raw().keys() {
        let wrong = ["json.", "csv.", "debezium-json.", "canal-json.", "maxwell-json."]
            .iter()
            .any(|p| key.starts_with(p) && f.format.prefix() != *p)
            || ((key == "scan.lines-per-second" || key == source::MIN_SPLIT_OPTION) && f.format == Format::Parquet);
        if wrong {
            return Err(config_error(
                "filesystem",
                format!(
                    "option '{key}' does not apply to format '{}'",
                    options.get("format").unwrap_or_default()
                ),
            )
            .into());
        }
    }
    if options.duration(source::MONITOR_OPTION)?.is_some_and(|d| d.is_zero()) {
        return Err(config_error(
            "filesystem",
            format!(
                "option '{}' must be greater than 0 (leave it out to read the path once)",
                source::MONITOR_OPTION
            ),
        )
        .into());
    }
    if f.format == Format::DebeziumJson && options.bool("debezium-json.schema-include")? == Some(true) {
        return Err(config_error(
            "filesystem",
            "'debezium-json.schema-include' = 'true' is not supported: messages must be the bare envelope \
             {\"before\":..,\"after\":..,\"op\":..}",
        )
        .into());
    }
    if let Some(dead) = dead_letter_path_of(options) {
        let refuse = |message: String| -> Result<()> { Err(config_error("filesystem", message).into()) };
        if f.format == Format::Parquet {
            // A parquet file fails as a whole (a row group), never a record.
            return refuse(format!(
                "option '{DEAD_LETTER_PATH}' does not apply to format 'parquet': only json and csv records are set aside"
            ));
        }
        if f.ignore_parse_errors {
            // Two answers to one question: say which, rather than pick one.
            let key = format!("{}ignore-parse-errors", f.format.prefix());
            return refuse(format!(
                "options '{DEAD_LETTER_PATH}' and '{key}' = 'true' contradict each other: bad records go to the \
                 dead-letter directory or are skipped; remove one of them"
            ));
        }
        if same_dir(&dead, &path) {
            // Its files would be read as input by the next scan or restore.
            return refuse(format!(
                "option '{DEAD_LETTER_PATH}' must not be the table's own 'path' ({})",
                path.display()
            ));
        }
    }
    Ok(())
}
