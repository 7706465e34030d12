//! `kafka`: topics as a source (one split per topic partition, each with
//! its own offset, watermark, idleness and alignment pause) and as a sink,
//! with Flink's option names and defaults, on librdkafka (the `rdkafka`
//! crate).
//!
//! - `source`: the enumerator (metadata, start and stop offsets by
//!   `scan.startup.mode` / `scan.bounded.mode`) and the split reader.
//!   Offsets live in Weir's checkpoints (a split's position is its next
//!   offset), never in the consumer group: the group is only told after a
//!   checkpoint completes, for monitoring.
//! - `fetcher`: a split's thread that polls its consumer ahead of the
//!   reader, which decodes.
//! - `sink`: the producer writer, `none`, `at-least-once` (flushed and
//!   every delivery checked at each barrier) or `exactly-once` (a Kafka
//!   transaction per checkpoint, committed when it completes).
//! - `protocol`: the raw requests librdkafka lacks (`EndTxn` for another
//!   process's transaction; a fetch that shows transaction markers).
//! - `codec`: records to rows and rows to records (`json`, `csv`, `raw`,
//!   and the changelog formats as sources), with `key.format`,
//!   `key.fields` and `value.fields-include`.

mod avro;
pub mod client_properties;
mod codec;
mod fetcher;
mod metadata;
pub mod protocol;
mod sink;
mod source;

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use weir_catalog::{CatalogError, OptionKind, OptionSpec, Options};

pub use sink::KafkaSink;
pub use source::KafkaSource;

use super::config_error;
use crate::error::{ConnectorError, Result};

pub const NAME: &str = "kafka";
/// The changelog of a keyed table as a topic: each record the latest row
/// of its key, a record without a value (a tombstone) the key's delete.
pub const UPSERT_NAME: &str = "upsert-kafka";

/// Formats of a record's value or key.
const FORMATS: &[&str] = &[
    "json",
    "csv",
    "raw",
    "avro",
    "debezium-json",
    "canal-json",
    "maxwell-json",
];

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "topic",
        OptionKind::String,
        "the topic, or topics separated by ';' (source); the topic written to (sink)",
    ),
    OptionSpec::new(
        "topic-pattern",
        OptionKind::String,
        "a regular expression: every topic whose whole name matches it is read (source)",
    ),
    OptionSpec::new(
        "properties.bootstrap.servers",
        OptionKind::String,
        "host:port of Kafka brokers, separated by ','",
    ),
    OptionSpec::new(
        "properties.group.id",
        OptionKind::String,
        "the consumer group: offsets are committed to it after each checkpoint, and read from it by 'group-offsets'",
    ),
    OptionSpec::new(
        "properties.**",
        OptionKind::String,
        "any librdkafka client property, passed to the client as it is; on a server, properties that load \
         code or run commands are refused and those naming files must be in the allowed directories",
    ),
    OptionSpec::new(
        "scan.startup.mode",
        OptionKind::Enum(&[
            "earliest-offset",
            "latest-offset",
            "group-offsets",
            "timestamp",
            "specific-offsets",
        ]),
        "where a partition without checkpointed state starts",
    )
    .with_default("group-offsets"),
    OptionSpec::new(
        "scan.startup.timestamp-millis",
        OptionKind::Int { min: 0, max: i64::MAX },
        "'timestamp' startup: the first record at or after this time (ms since the epoch)",
    ),
    OptionSpec::new(
        "scan.startup.specific-offsets",
        OptionKind::String,
        "'specific-offsets' startup: 'partition:0,offset:42;partition:1,offset:300'",
    ),
    OptionSpec::new(
        "scan.bounded.mode",
        OptionKind::Enum(&["unbounded", "latest-offset", "group-offsets", "timestamp", "specific-offsets"]),
        "where a partition ends: the source is bounded unless 'unbounded'",
    )
    .with_default("unbounded"),
    OptionSpec::new(
        "scan.bounded.timestamp-millis",
        OptionKind::Int { min: 0, max: i64::MAX },
        "'timestamp' bounded mode: read the records before this time (ms since the epoch)",
    ),
    OptionSpec::new(
        "scan.bounded.specific-offsets",
        OptionKind::String,
        "'specific-offsets' bounded mode: 'partition:0,offset:42;...' (exclusive; a partition not listed is not read)",
    ),
    OptionSpec::new(
        "scan.topic-partition-discovery.interval",
        OptionKind::Duration,
        "how often topics and partitions are listed again while running; 0 disables",
    )
    .with_default("5 min"),
    OptionSpec::new("format", OptionKind::Enum(FORMATS), "the format of record values"),
    OptionSpec::new("value.format", OptionKind::Enum(FORMATS), "the format of record values (same as 'format')"),
    OptionSpec::new(
        "key.format",
        OptionKind::Enum(&["json", "csv", "raw", "avro"]),
        "the format of record keys (needs 'key.fields')",
    ),
    OptionSpec::new(
        "avro.encoding",
        OptionKind::Enum(&["binary"]),
        "'avro': how a datum is encoded (Avro's JSON encoding is not supported)",
    )
    .with_default("binary"),
    OptionSpec::new(
        "avro.timestamp_mapping.legacy",
        OptionKind::Bool,
        "'avro': TIMESTAMP as timestamp-millis (true) or local-timestamp-millis; the bytes are the same",
    )
    .with_default("true"),
    OptionSpec::new(
        "key.fields",
        OptionKind::String,
        "the columns of the record key, separated by ';'",
    ),
    OptionSpec::new(
        "key.fields-prefix",
        OptionKind::String,
        "a prefix of the key columns' names that the key's own names do not have (needs EXCEPT_KEY)",
    ),
    OptionSpec::new(
        "value.fields-include",
        OptionKind::Enum(&["ALL", "EXCEPT_KEY"]),
        "whether the value holds every column (ALL) or every column but the key's",
    )
    .with_default("ALL"),
    OptionSpec::new(
        "sink.delivery-guarantee",
        OptionKind::Enum(&["none", "at-least-once", "exactly-once"]),
        "'at-least-once': every record is acknowledged before a checkpoint completes",
    )
    .with_default("at-least-once"),
    OptionSpec::new(
        "sink.transactional-id-prefix",
        OptionKind::String,
        "'exactly-once': the prefix of the producers' transactional ids",
    ),
    OptionSpec::new(
        "sink.partitioner",
        OptionKind::String,
        "'default' (the key's murmur2 hash as Kafka's Java client, any partition without a key), 'fixed' (subtask i writes partition i % partitions) or 'round-robin'",
    )
    .with_default("default"),
];

/// `upsert-kafka`'s own options.
pub const UPSERT_OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "sink.buffer-flush.max-rows",
        OptionKind::Int { min: 0, max: 1_000_000 },
        "keep the latest record of each key until this many are buffered (with 'sink.buffer-flush.interval'; 0: off)",
    )
    .with_default("0"),
    OptionSpec::new(
        "sink.buffer-flush.interval",
        OptionKind::Duration,
        "send the buffered records this often (with 'sink.buffer-flush.max-rows'; 0: off)",
    )
    .with_default("0 s"),
];

/// The options of `upsert-kafka`: `kafka`'s without those its key and
/// its reading fix (the key is the PRIMARY KEY, `key.fields` and the
/// partitioner follow from it; a table is read from the earliest offset).
pub fn upsert_options() -> Vec<OptionSpec> {
    const NOT_UPSERT: &[&str] = &[
        "format",
        "key.fields",
        "scan.startup.mode",
        "scan.startup.timestamp-millis",
        "scan.startup.specific-offsets",
        "sink.partitioner",
    ];
    OPTIONS
        .iter()
        .filter(|o| !NOT_UPSERT.contains(&o.key))
        .chain(UPSERT_OPTIONS)
        .copied()
        .collect()
}

/// An `upsert-kafka` table's options as the `kafka` options they mean:
/// the key is the PRIMARY KEY, the topic read from its start. Flink's
/// checks and messages.
/// `kafka_specs`: every option of a `kafka` table.
pub fn upsert_as_kafka(
    options: &Options,
    primary_key: Option<&[String]>,
    kafka_specs: &[OptionSpec],
) -> Result<Options> {
    let Some(pk) = primary_key.filter(|k| !k.is_empty()) else {
        return Err(config_error(
            UPSERT_NAME,
            "tables require to define a PRIMARY KEY constraint. The PRIMARY KEY specifies which columns should be \
             read from or write to the Kafka message key. The PRIMARY KEY also defines records in the 'upsert-kafka' \
             table should update or delete on which keys.",
        )
        .into());
    };
    for key in ["key.format", "value.format"] {
        if options.get(key).is_none() {
            return Err(config_error(
                UPSERT_NAME,
                format!("needs option '{key}' (the record {}'s format)", &key[..key.len() - 7]),
            )
            .into());
        }
    }
    if let Some(f) = options.get("value.format")
        && !matches!(f.to_ascii_lowercase().as_str(), "json" | "csv" | "raw" | "avro")
    {
        return Err(invalid(
            "value.format",
            format!(
                "'upsert-kafka' doesn't support '{f}' as value format: its records are the rows of their keys, so \
                 the format must hold rows only (json, csv, raw, avro), not changes"
            ),
        ));
    }
    let mut raw = options.raw().clone();
    raw.insert("key.fields".into(), pk.join(";"));
    raw.insert("scan.startup.mode".into(), "earliest-offset".into());
    let specs: Vec<OptionSpec> = kafka_specs.iter().chain(UPSERT_OPTIONS).copied().collect();
    Ok(Options::validate(&raw, &specs, &format!("connector '{UPSERT_NAME}'"))?)
}

/// How long the client may take to answer a metadata or offsets request
/// before the job fails with the broker named.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

fn invalid(key: &str, message: impl Into<String>) -> crate::error::ExecError {
    CatalogError::InvalidOption {
        key: key.into(),
        message: message.into(),
    }
    .into()
}

/// A failure of the Kafka cluster or the client: not the user's SQL.
fn external(message: impl Into<String>) -> crate::error::ExecError {
    ConnectorError::External {
        system: "kafka".into(),
        message: message.into(),
    }
    .into()
}

/// The client properties (`properties.*`, without the prefix).
fn client_properties(options: &Options) -> BTreeMap<String, String> {
    options
        .raw()
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("properties.").map(|k| (k.to_string(), v.clone())))
        .collect()
}

fn client_config(properties: &BTreeMap<String, String>) -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    for (k, v) in properties {
        c.set(k, v);
    }
    // The client's own log goes through ours, at its level.
    c.set_log_level(rdkafka::config::RDKafkaLogLevel::Warning);
    c
}

/// `partition:0,offset:42;partition:1,offset:300` (Flink's syntax).
fn parse_specific_offsets(key: &str, text: &str) -> Result<BTreeMap<i32, i64>> {
    let mut out = BTreeMap::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || {
            invalid(
                key,
                format!(
                    "invalid entry '{part}', expected 'partition:<number>,offset:<number>' (entries separated by ';')"
                ),
            )
        };
        let mut partition = None;
        let mut offset = None;
        for kv in part.split(',') {
            let (k, v) = kv.split_once(':').ok_or_else(bad)?;
            match k.trim() {
                "partition" => partition = Some(v.trim().parse::<i32>().map_err(|_| bad())?),
                "offset" => offset = Some(v.trim().parse::<i64>().map_err(|_| bad())?),
                _ => return Err(bad()),
            }
        }
        match (partition, offset) {
            (Some(p), Some(o)) if p >= 0 && o >= 0 => {
                out.insert(p, o);
            }
            _ => return Err(bad()),
        }
    }
    if out.is_empty() {
        return Err(invalid(key, "no offsets given"));
    }
    Ok(out)
}

/// The topics a source reads.
#[derive(Debug, Clone)]
enum Topics {
    List(Vec<String>),
    /// Matched against the whole name, as Java's `Pattern.matcher().matches()`.
    Pattern(regex::Regex),
}

impl Topics {
    fn from_options(options: &Options) -> Result<Self> {
        match (options.get("topic"), options.get("topic-pattern")) {
            (Some(_), Some(_)) => Err(config_error(
                NAME,
                "options 'topic' and 'topic-pattern' cannot both be set: name the topics or give a pattern",
            )
            .into()),
            (None, None) => Err(config_error(NAME, "needs option 'topic' or 'topic-pattern'").into()),
            (Some(t), None) => {
                let list: Vec<String> = t
                    .split(';')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect();
                if list.is_empty() {
                    return Err(invalid("topic", "no topic given"));
                }
                Ok(Topics::List(list))
            }
            (None, Some(p)) => super::whole_name_pattern("topic-pattern", p).map(Topics::Pattern),
        }
    }
}

/// Checks what can be checked before the table is used (no broker needed):
/// at CREATE TABLE, so a wrong option is named before any query.
/// The metadata columns declared (`(index in schema, key)`) as what they
/// hold; `write`: of a sink (its non-virtual ones, which it writes).
fn metadata_columns(
    schema: &SchemaRef,
    declared: &[(usize, String)],
    table: &str,
    write: bool,
) -> Result<Vec<(usize, metadata::Meta)>> {
    declared
        .iter()
        .map(|(i, key)| Ok((*i, metadata::Meta::of(key, schema.field(*i), table, write)?)))
        .collect()
}

/// `metadata`: the table's metadata columns, `(index in schema, key)`.
pub fn validate(
    options: &Options,
    schema: &SchemaRef,
    upsert: bool,
    metadata: &[(usize, String)],
    table: &str,
) -> Result<()> {
    if options.get("properties.bootstrap.servers").is_none() {
        return Err(config_error(
            NAME,
            "needs option 'properties.bootstrap.servers' (host:port of the brokers)",
        )
        .into());
    }
    // A table only written to may name no topic when a `topic` column
    // names each record's (reading it then asks for one).
    let named = options.get("topic").is_some() || options.get("topic-pattern").is_some();
    if named || !metadata.iter().any(|(_, key)| key == "topic") {
        Topics::from_options(options)?;
    }
    codec::Codec::new(
        options,
        schema,
        upsert,
        metadata_columns(schema, metadata, table, false)?,
    )?;
    source::Settings::from_options(options)?;
    sink::check_guarantee(options)?;
    sink::buffer(options)?;
    Ok(())
}
