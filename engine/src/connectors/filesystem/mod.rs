//! `filesystem`: files as a bounded source (one file = one split) and as a
//! sink (part files per subtask), in `json` (one object per line), `csv` or
//! `parquet`, with Flink's option names and defaults.
//!
//! - `source`: the source and its split readers; bad records fail the
//!   job, are skipped (`*.ignore-parse-errors`) or go to the dead-letter
//!   directory (`scan.dead-letter.path`, [`crate::connectors::dead_letter`]).
//! - `sink`: the part-file writer.
//! - `part_file`: the two-phase commit of files, shared by the sink and
//!   dead letters.

pub(crate) mod part_file;
mod records;
mod sink;
mod source;
mod text_time;

pub use sink::FileSink;
pub use source::FileSource;

use arrow::datatypes::SchemaRef;
use weir_catalog::{OptionKind, OptionSpec, Options};

use super::config_error;
use crate::connectors::dead_letter::PATH_OPTION as DEAD_LETTER_PATH;
use crate::error::Result;

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "path",
        OptionKind::Path,
        "a file or directory; 'file://' prefix allowed",
    ),
    OptionSpec::new(
        "format",
        OptionKind::Enum(&["json", "csv", "parquet"]),
        "the file format",
    ),
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
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
    Parquet,
}

#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub format: Format,
    pub ignore_parse_errors: bool,
    pub iso_timestamps: bool,
    pub delimiter: u8,
    pub quote: u8,
    pub allow_comments: bool,
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
    let format = match options.require("format")?.to_ascii_lowercase().as_str() {
        "json" => Format::Json,
        "csv" => Format::Csv,
        _ => Format::Parquet,
    };
    let ignore = match format {
        Format::Json => options.bool("json.ignore-parse-errors")?,
        Format::Csv => options.bool("csv.ignore-parse-errors")?,
        Format::Parquet => None,
    };
    Ok(FormatOptions {
        format,
        ignore_parse_errors: ignore.unwrap_or(false),
        iso_timestamps: options.enum_value("json.timestamp-format.standard").as_deref() == Some("iso-8601"),
        delimiter: single_byte(options, "csv.field-delimiter")?,
        quote: single_byte(options, "csv.quote-character")?,
        allow_comments: options.bool("csv.allow-comments")?.unwrap_or(false),
    })
}

/// Checks what can be checked before the table is used.
pub fn validate(options: &Options, _schema: &SchemaRef) -> Result<()> {
    let path = path_of(options)?;
    let f = format_options(options)?;
    for key in options.raw().keys() {
        let wrong = (key.starts_with("json.") && f.format != Format::Json)
            || (key.starts_with("csv.") && f.format != Format::Csv)
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
            let key = if f.format == Format::Json {
                "json.ignore-parse-errors"
            } else {
                "csv.ignore-parse-errors"
            };
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
