//! Kafka's metadata columns (`offset BIGINT METADATA VIRTUAL`, `ts
//! TIMESTAMP_LTZ(3) METADATA FROM 'timestamp'`), with Flink's keys and
//! types. A column may declare any type the metadata's own casts to (a
//! `TIMESTAMP(3)` for `timestamp`, as Flink allows).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryBuilder, Int32Array, Int64Array, MapArray, MapBuilder, MapFieldNames, StringArray,
    StringBuilder, TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, TimeUnit};

use super::invalid;

/// A record's headers: names with optional values, in order.
pub(super) type Headers = Vec<(String, Option<Vec<u8>>)>;
use crate::error::Result;

/// A metadata key Weir reads from or writes to a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Meta {
    Topic,
    Partition,
    Offset,
    Timestamp,
    TimestampType,
    Headers,
}

/// Flink's keys, in its order, with what Weir does with each.
const KEYS: &[(&str, Option<Meta>)] = &[
    ("topic", Some(Meta::Topic)),
    ("partition", Some(Meta::Partition)),
    ("headers", Some(Meta::Headers)),
    // The epoch is not exposed by the client's safe interface.
    ("leader-epoch", None),
    ("offset", Some(Meta::Offset)),
    ("timestamp", Some(Meta::Timestamp)),
    ("timestamp-type", Some(Meta::TimestampType)),
];

/// Keys a sink writes (Flink's: `headers`, `timestamp`).
const WRITABLE: &[Meta] = &[Meta::Headers, Meta::Timestamp, Meta::Topic];

impl Meta {
    /// The metadata's own type (Flink's).
    pub fn data_type(self) -> DataType {
        match self {
            Meta::Topic | Meta::TimestampType => DataType::Utf8,
            Meta::Partition => DataType::Int32,
            Meta::Offset => DataType::Int64,
            Meta::Timestamp => DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            Meta::Headers => headers_type(),
        }
    }

    fn key(self) -> &'static str {
        KEYS.iter()
            .find(|(_, m)| *m == Some(self))
            .map(|(k, _)| *k)
            .unwrap_or_default()
    }

    /// The metadata of column `field`, declared `METADATA FROM 'key'`;
    /// `write`: of a table written to (a sink's non-virtual column).
    pub fn of(key: &str, field: &Field, table: &str, write: bool) -> Result<Meta> {
        let listed = |keys: Vec<&str>| keys.join(", ");
        let Some((_, found)) = KEYS.iter().find(|(k, _)| *k == key) else {
            return Err(invalid(
                "METADATA",
                format!(
                    "Invalid metadata key '{key}' in column '{}' of table '{table}'. The 'kafka' connector supports \
                     the following metadata keys for reading: {}",
                    field.name(),
                    listed(KEYS.iter().map(|(k, _)| *k).collect())
                ),
            ));
        };
        let Some(meta) = *found else {
            return Err(invalid(
                "METADATA",
                format!(
                    "metadata key '{key}' (column '{}' of table '{table}') is not supported yet; supported: {}",
                    field.name(),
                    listed(KEYS.iter().filter(|(_, m)| m.is_some()).map(|(k, _)| *k).collect())
                ),
            ));
        };
        if write && !WRITABLE.contains(&meta) {
            return Err(invalid(
                "METADATA",
                format!(
                    "Invalid metadata key '{key}' in column '{}' of table '{table}'. The 'kafka' connector supports \
                     the following metadata keys for writing: {} (declare a read-only key VIRTUAL so that INSERT \
                     does not write it)",
                    field.name(),
                    listed(WRITABLE.iter().map(|m| m.key()).collect())
                ),
            ));
        }
        let (from, to) = if write {
            (field.data_type(), &meta.data_type())
        } else {
            (&meta.data_type(), field.data_type())
        };
        if !castable(from, to) {
            return Err(invalid(
                "METADATA",
                format!(
                    "column '{}' of table '{table}' is {}, but metadata '{key}' is {}",
                    field.name(),
                    shown(field.data_type()),
                    shown(&meta.data_type())
                ),
            ));
        }
        Ok(meta)
    }
}

/// `MAP<STRING, BYTES>`, the type of `headers`.
fn headers_type() -> DataType {
    let entries = Field::new(
        "entries",
        DataType::Struct(
            vec![
                Field::new("key", DataType::Utf8, false),
                Field::new("value", DataType::Binary, true),
            ]
            .into(),
        ),
        false,
    );
    DataType::Map(Arc::new(entries), false)
}

/// Flink's casts between a metadata's type and a column's (narrower than
/// arrow's: no BIGINT to DATE).
fn castable(from: &DataType, to: &DataType) -> bool {
    use DataType as D;
    if matches!(from, D::Map(..)) || matches!(to, D::Map(..)) {
        // Maps compare by their key and value types (field names aside).
        return map_types(from) == map_types(to) && map_types(from).is_some();
    }
    from == to
        || matches!(to, D::Utf8 | D::LargeUtf8) && !matches!(from, D::Binary)
        || from.is_numeric() && to.is_numeric()
        || matches!((from, to), (D::Timestamp(..), D::Timestamp(..) | D::Date32))
}

fn map_types(t: &DataType) -> Option<(DataType, DataType)> {
    match t {
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => Some((kv[0].data_type().clone(), kv[1].data_type().clone())),
            _ => None,
        },
        _ => None,
    }
}

/// A type as Flink's DDL names it (for the types errors here show).
fn shown(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 => "STRING".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Timestamp(TimeUnit::Millisecond, Some(_)) => "TIMESTAMP_LTZ(3)".into(),
        DataType::Timestamp(TimeUnit::Millisecond, None) => "TIMESTAMP(3)".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Map(..) if map_types(t) == map_types(&headers_type()) => "MAP<STRING, BYTES>".into(),
        other => other.to_string(),
    }
}

/// What a record carries beside its key and value.
#[derive(Debug, Clone, Default)]
pub(super) struct RecordMeta {
    pub partition: i32,
    /// Milliseconds since the epoch; `None`: the record has none.
    pub timestamp: Option<i64>,
    /// `NoTimestampType`, `CreateTime` or `LogAppendTime` (0, 1, 2).
    pub timestamp_type: u8,
    /// Its headers, in order (read only when a column asks for them).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl RecordMeta {
    /// `headers`: whether to copy the record's headers.
    pub fn of(m: &impl rdkafka::Message, headers: bool) -> Self {
        use rdkafka::Timestamp as T;
        use rdkafka::message::Headers;
        let (timestamp, timestamp_type) = match m.timestamp() {
            T::NotAvailable => (None, 0),
            T::CreateTime(t) => (Some(t), 1),
            T::LogAppendTime(t) => (Some(t), 2),
        };
        // Asked only when read: librdkafka parses the headers (and
        // allocates) on the first call, 8 % of a backfill's time.
        let headers = match headers.then(|| m.headers()).flatten() {
            Some(h) => h
                .iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect(),
            None => vec![],
        };
        RecordMeta {
            partition: m.partition(),
            timestamp,
            timestamp_type,
            headers,
        }
    }
}

/// The column of `meta` for records (`topic`, offset and their
/// [`RecordMeta`]), cast to the declared type `to`.
pub(super) fn column(meta: Meta, topic: &str, records: &[(i64, &RecordMeta)], to: &DataType) -> Result<ArrayRef> {
    let own: ArrayRef = match meta {
        Meta::Topic => Arc::new(StringArray::from_iter_values(records.iter().map(|_| topic))),
        Meta::Partition => Arc::new(Int32Array::from_iter_values(records.iter().map(|(_, m)| m.partition))),
        Meta::Offset => Arc::new(Int64Array::from_iter_values(records.iter().map(|(o, _)| *o))),
        // Flink's is NOT NULL: a record without one (a pre-0.10 message
        // format) reads as -1, as Kafka's Java client reports it.
        Meta::Timestamp => Arc::new(
            TimestampMillisecondArray::from_iter_values(records.iter().map(|(_, m)| m.timestamp.unwrap_or(-1)))
                .with_timezone("UTC"),
        ),
        Meta::TimestampType => Arc::new(StringArray::from_iter_values(records.iter().map(
            |(_, m)| match m.timestamp_type {
                1 => "CreateTime",
                2 => "LogAppendTime",
                _ => "NoTimestampType",
            },
        ))),
        Meta::Headers => {
            let mut b = MapBuilder::new(
                Some(MapFieldNames {
                    entry: "entries".into(),
                    key: "key".into(),
                    value: "value".into(),
                }),
                StringBuilder::new(),
                BinaryBuilder::new(),
            );
            for (_, m) in records {
                // A key given twice is one entry: its first place, its last
                // value (Flink reads headers into a map the same way).
                let mut entries: Vec<(&str, Option<&[u8]>)> = Vec::with_capacity(m.headers.len());
                for (k, v) in &m.headers {
                    match entries.iter_mut().find(|(seen, _)| *seen == k) {
                        Some(e) => e.1 = v.as_deref(),
                        None => entries.push((k, v.as_deref())),
                    }
                }
                for (k, v) in entries {
                    b.keys().append_value(k);
                    b.values().append_option(v);
                }
                b.append(true)?;
            }
            let map = b.finish();
            // The builder's value field is nullable as Flink's; keep the
            // declared field names.
            return Ok(Arc::new(MapArray::try_new(
                match to {
                    DataType::Map(f, _) => f.clone(),
                    _ => return Err(crate::error::ExecError::internal("headers read into a non-map column")),
                },
                map.offsets().clone(),
                map.entries().clone(),
                None,
                false,
            )?));
        }
    };
    Ok(arrow::compute::cast(&own, to)?)
}

/// A sink's `timestamp` column as the records' timestamps (ms).
pub(super) fn timestamps(column: &ArrayRef) -> Result<Vec<Option<i64>>> {
    let ms = arrow::compute::cast(column, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
    let ms = ms
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
        .ok_or_else(|| crate::error::ExecError::internal("a timestamp cast gave another type"))?;
    Ok(ms.iter().collect())
}

/// A sink's `topic` column as each record's topic.
pub(super) fn topics(column: &ArrayRef) -> Result<Vec<Option<String>>> {
    let text = arrow::compute::cast(column, &DataType::Utf8)?;
    let Some(text) = text.as_any().downcast_ref::<StringArray>() else {
        return Err(crate::error::ExecError::internal("a topic cast gave another type"));
    };
    Ok(text.iter().map(|t| t.map(str::to_string)).collect())
}

/// A sink's `headers` column as each record's headers (a NULL map: none).
pub(super) fn headers(column: &ArrayRef) -> Result<Vec<Headers>> {
    let Some(maps) = column.as_any().downcast_ref::<MapArray>() else {
        return Err(crate::error::ExecError::internal("a headers column that is not a map"));
    };
    let keys = arrow::compute::cast(maps.keys(), &DataType::Utf8)?;
    let keys = keys
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| crate::error::ExecError::internal("header keys cast to another type"))?;
    let values = arrow::compute::cast(maps.values(), &DataType::Binary)?;
    let values = values
        .as_any()
        .downcast_ref::<arrow::array::BinaryArray>()
        .ok_or_else(|| crate::error::ExecError::internal("header values cast to another type"))?;
    let offsets = maps.value_offsets();
    Ok((0..maps.len())
        .map(|i| {
            if maps.is_null(i) {
                return vec![];
            }
            (offsets[i] as usize..offsets[i + 1] as usize)
                .map(|j| {
                    (
                        keys.value(j).to_string(),
                        values.is_valid(j).then(|| values.value(j).to_vec()),
                    )
                })
                .collect()
        })
        .collect())
}
