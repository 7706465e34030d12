//! `filesystem`: files as a bounded source (one file = one split) and as a
//! sink (part files per subtask), in `json` (one object per line), `csv` or
//! `parquet`, with Flink's option names and defaults.
//!
//! - `source`: the source and its split readers.
//! - `sink`: the part-file writer.

mod sink;
mod source;

pub use sink::FileSink;
pub use source::FileSource;

use arrow::datatypes::SchemaRef;
use weir_catalog::{OptionKind, OptionSpec, Options};

use super::config_error;
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
    path_of(options)?;
    let f = format_options(options)?;
    for key in options.raw().keys() {
        let wrong = (key.starts_with("json.") && f.format != Format::Json)
            || (key.starts_with("csv.") && f.format != Format::Csv);
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
    Ok(())
}
