//! Records to rows and rows to records, as Flink's Kafka table connector
//! does: the value holds every column (`value.fields-include` = `ALL`) or
//! every column but the key's (`EXCEPT_KEY`, with `key.format` and
//! `key.fields`, whose names may carry `key.fields-prefix`, which the key's
//! own field names do not).
//!
//! Text formats (json, csv, the changelog formats) are read by the same
//! decoder as the filesystem connector's lines; `raw` is the bytes of one
//! STRING or BYTES column.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, StringArray};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use weir_catalog::Options;

use super::avro::AvroFormat;
use super::metadata::{self, Meta, RecordMeta};
use super::{NAME, invalid};
use crate::change::{ChangeBatch, RowKind};
use crate::connectors::config_error;
use crate::connectors::filesystem::source::LineDecoder;
use crate::connectors::filesystem::{self, Format, FormatOptions};
use crate::error::Result;

/// The format of a key or value.
#[derive(Debug, Clone)]
pub(super) enum PartFormat {
    /// The bytes as they are: one STRING (UTF-8) or BYTES column.
    Raw,
    Text(FormatOptions),
    /// One Avro binary datum of the columns (`avro.rs`).
    Avro(Arc<AvroFormat>),
}

impl PartFormat {
    fn of(options: &Options, name: &str, key: &str, schema: &SchemaRef) -> Result<Self> {
        if name.eq_ignore_ascii_case("avro") {
            // The one Avro option with an effect on what Weir writes: the
            // schema's timestamp types (the bytes are the same long).
            let legacy = options.bool("avro.timestamp_mapping.legacy")?.unwrap_or(true);
            return AvroFormat::new(schema, legacy)
                .map(|f| PartFormat::Avro(Arc::new(f)))
                .map_err(|e| invalid(key, format!("format 'avro': {e}")));
        }
        if name.eq_ignore_ascii_case("raw") {
            match schema.fields().as_ref() {
                [f] if matches!(f.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary) => {
                    Ok(PartFormat::Raw)
                }
                fields => Err(invalid(
                    key,
                    format!(
                        "format 'raw' reads and writes one STRING or BYTES column, but it would hold {} ({})",
                        fields.len(),
                        fields.iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )),
            }
        } else {
            let f = filesystem::format_options_named(options, name)?;
            if f.format == Format::Csv
                && let Some(nested) = schema.fields().iter().find(|c| c.data_type().is_nested())
            {
                return Err(invalid(
                    key,
                    format!(
                        "format 'csv' cannot hold column '{}': ARRAY, MAP and ROW columns are not supported in CSV yet (use 'json')",
                        nested.name()
                    ),
                ));
            }
            Ok(PartFormat::Text(f))
        }
    }

    fn decoder(&self, schema: &SchemaRef) -> Option<LineDecoder> {
        match self {
            PartFormat::Raw | PartFormat::Avro(_) => None,
            PartFormat::Text(f) => Some(LineDecoder::new(f.clone(), schema)),
        }
    }

    fn is_changelog(&self) -> bool {
        matches!(self, PartFormat::Text(f) if f.format.is_changelog())
    }
}

/// The key part of a record (with `EXCEPT_KEY`).
#[derive(Debug, Clone)]
struct KeyPart {
    format: PartFormat,
    /// The key columns' indexes in the table.
    columns: Vec<usize>,
    /// Their schema, named as the key's fields (prefix removed).
    schema: SchemaRef,
}

/// How a table's rows are a topic's records.
#[derive(Debug, Clone)]
pub(super) struct Codec {
    schema: SchemaRef,
    value: PartFormat,
    /// The columns the value holds, by index in the table.
    value_columns: Vec<usize>,
    value_schema: SchemaRef,
    key: Option<KeyPart>,
    /// With `ALL`, the key columns written as the record key (the value
    /// holds them too, and is what they are read from).
    write_key: Option<KeyPart>,
    /// `upsert-kafka`: records are upserts and tombstones of their keys.
    upsert: bool,
    /// Metadata columns: (index in the table, what they hold).
    metadata: Vec<(usize, Meta)>,
}

/// Rows as records.
pub(super) struct Encoded {
    /// With a key format, each record's key.
    pub keys: Option<Vec<Vec<u8>>>,
    /// `None`: a record without a value (a raw NULL, a tombstone).
    pub values: Vec<Option<Vec<u8>>>,
    /// With a `timestamp` metadata column, each record's timestamp (ms).
    pub timestamps: Option<Vec<Option<i64>>>,
    /// With a `headers` metadata column, each record's headers.
    pub headers: Option<Vec<Headers>>,
    /// With a `topic` metadata column, each record's topic.
    pub topics: Option<Vec<Option<String>>>,
}

pub(super) use super::metadata::Headers;

/// One record as read. Key and value are slices of one buffer per poll
/// (two allocations per record were 15 % of a backfill's time).
pub(super) struct Record {
    pub offset: i64,
    pub key: Option<bytes::Bytes>,
    /// `None`: a tombstone (only `upsert-kafka` reads them).
    pub value: Option<bytes::Bytes>,
    pub meta: RecordMeta,
}

/// What a poll's records decode into.
pub(super) struct Decoded {
    pub rows: Option<ChangeBatch>,
    /// Offsets of records that do not decode, with why.
    pub bad: Vec<(i64, String)>,
}

fn project(schema: &SchemaRef, columns: &[usize], rename: impl Fn(&str) -> String) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|i| {
                let f = schema.field(*i);
                f.as_ref().clone().with_name(rename(f.name()))
            })
            .collect::<Vec<_>>(),
    ))
}

impl Codec {
    /// `metadata`: the metadata columns, by index in `schema`.
    pub fn new(options: &Options, schema: &SchemaRef, upsert: bool, metadata: Vec<(usize, Meta)>) -> Result<Self> {
        let (value_key, value_name) = match (options.get("format"), options.get("value.format")) {
            (Some(_), Some(_)) => {
                return Err(config_error(
                    NAME,
                    "options 'format' and 'value.format' are the same option: set one of them",
                )
                .into());
            }
            (Some(f), None) => ("format", f),
            (None, Some(f)) => ("value.format", f),
            (None, None) => return Err(config_error(NAME, "needs option 'format' (or 'value.format')").into()),
        };
        let except_key = options
            .get("value.fields-include")
            .is_some_and(|v| v.eq_ignore_ascii_case("EXCEPT_KEY"));
        let prefix = options.get("key.fields-prefix").unwrap_or_default().to_string();
        if !prefix.is_empty() && !except_key {
            return Err(invalid(
                "key.fields-prefix",
                "a key prefix needs 'value.fields-include' = 'EXCEPT_KEY' (with ALL the value holds the key columns under their own names)",
            ));
        }
        let key_columns = match options.get("key.fields") {
            None => vec![],
            Some(list) => {
                let mut cols = vec![];
                for name in list.split(';').map(str::trim).filter(|n| !n.is_empty()) {
                    let i = schema.index_of(name).map_err(|_| {
                        invalid(
                            "key.fields",
                            format!(
                                "column '{name}' is not a physical column of the table (columns: {})",
                                schema
                                    .fields()
                                    .iter()
                                    .map(|f| f.name().as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        )
                    })?;
                    if metadata.iter().any(|(m, _)| *m == i) {
                        return Err(invalid(
                            "key.fields",
                            format!("column '{name}' is a metadata column, not a field of the record key"),
                        ));
                    }
                    if !name.starts_with(&prefix) {
                        return Err(invalid(
                            "key.fields",
                            format!("key column '{name}' does not start with 'key.fields-prefix' '{prefix}'"),
                        ));
                    }
                    cols.push(i);
                }
                cols
            }
        };
        let key = match (options.get("key.format"), key_columns.is_empty()) {
            (Some(_), true) => {
                return Err(config_error(NAME, "option 'key.format' needs 'key.fields' (the key columns)").into());
            }
            (None, false) => {
                return Err(
                    config_error(NAME, "option 'key.fields' needs 'key.format' (how the key is written)").into(),
                );
            }
            (None, true) => None,
            (Some(f), false) => {
                let key_schema = project(schema, &key_columns, |n| n[prefix.len()..].to_string());
                Some(KeyPart {
                    format: PartFormat::of(options, f, "key.format", &key_schema)?,
                    columns: key_columns.clone(),
                    schema: key_schema,
                })
            }
        };
        if except_key && key.is_none() {
            return Err(invalid(
                "value.fields-include",
                "'EXCEPT_KEY' needs 'key.format' and 'key.fields': without a key the value holds every column",
            ));
        }
        let value_columns: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !except_key || !key_columns.contains(i))
            .filter(|i| !metadata.iter().any(|(m, _)| m == i))
            .collect();
        let value_schema = project(schema, &value_columns, str::to_string);
        let value = PartFormat::of(options, value_name, value_key, &value_schema)?;
        if value.is_changelog() && key.is_some() {
            return Err(config_error(
                NAME,
                "a changelog value format with 'key.format' is not supported: its envelope holds the whole row",
            )
            .into());
        }
        if value.is_changelog() && !metadata.is_empty() {
            return Err(config_error(
                NAME,
                "metadata columns with a changelog value format are not supported yet",
            )
            .into());
        }
        let (key, write_key) = if except_key { (key, None) } else { (None, key) };
        Ok(Self {
            schema: schema.clone(),
            value,
            value_columns,
            value_schema,
            key,
            write_key,
            upsert,
            metadata,
        })
    }

    /// Whether a sink writes a `topic` column (each record's topic).
    pub fn writes_topic(&self) -> bool {
        self.metadata.iter().any(|(_, m)| *m == Meta::Topic)
    }

    /// Whether a column reads the records' headers.
    pub fn reads_headers(&self) -> bool {
        self.metadata.iter().any(|(_, m)| *m == Meta::Headers)
    }

    pub fn is_upsert(&self) -> bool {
        self.upsert
    }

    /// The record key's part, whichever `value.fields-include` is.
    fn any_key(&self) -> Option<&KeyPart> {
        self.key.as_ref().or(self.write_key.as_ref())
    }

    /// `<format>.ignore-parse-errors` of the value's (or key's) format.
    pub fn ignores_parse_errors(&self) -> bool {
        let ignores = |f: &PartFormat| matches!(f, PartFormat::Text(o) if o.ignore_parse_errors);
        ignores(&self.value) || self.key.as_ref().is_some_and(|k| ignores(&k.format))
    }

    pub fn produces_changes(&self) -> bool {
        self.upsert || self.value.is_changelog()
    }

    /// The decoders of a split of `topic`.
    pub fn decoders(&self, topic: &str) -> Decoders {
        // Tombstones are read from their keys, also with `ALL`.
        let key = if self.upsert { self.any_key() } else { self.key.as_ref() };
        Decoders {
            value: self.value.decoder(&self.value_schema),
            key: key.and_then(|k| k.format.decoder(&k.schema)),
            topic: topic.to_string(),
        }
    }

    /// The metadata columns of `records`, by index in the table.
    fn metadata_columns(&self, d: &Decoders, records: &[&Record]) -> Result<Vec<(usize, ArrayRef)>> {
        if self.metadata.is_empty() {
            return Ok(vec![]);
        }
        let metas: Vec<(i64, &RecordMeta)> = records.iter().map(|r| (r.offset, &r.meta)).collect();
        self.metadata
            .iter()
            .map(|(i, m)| {
                Ok((
                    *i,
                    metadata::column(*m, &d.topic, &metas, self.schema.field(*i).data_type())?,
                ))
            })
            .collect()
    }

    /// Decodes the records of one poll. Bad records are reported, not
    /// failed on: the reader fails or skips them.
    pub fn decode(&self, d: &Decoders, records: &[Record]) -> Result<Decoded> {
        if !self.upsert {
            let values: Vec<&Record> = records.iter().filter(|r| r.value.is_some()).collect();
            return self.decode_values(d, &values);
        }
        let (values, tombstones): (Vec<&Record>, Vec<&Record>) = records.iter().partition(|r| r.value.is_some());
        let mut upserts = self.decode_values(d, &values)?;
        let mut bad = std::mem::take(&mut upserts.bad);
        let upsert_rows = upserts.rows.map(|c| c.rows);
        let good_upserts: Vec<i64> = values
            .iter()
            .map(|r| r.offset)
            .filter(|o| bad.binary_search_by_key(o, |(b, _)| *b).is_err())
            .collect();
        let deletes = self.decode_tombstones(d, &tombstones, &mut bad)?;
        bad.sort_by_key(|(o, _)| *o);
        if deletes.is_none() {
            let rows = upsert_rows.map(|r| {
                let n = r.num_rows();
                ChangeBatch::new(r, vec![RowKind::UpdateAfter; n])
            });
            return Ok(Decoded { rows, bad });
        }
        // Both in offset order: merged back into it.
        let mut order: Vec<(i64, usize, usize)> = good_upserts.iter().enumerate().map(|(i, o)| (*o, 0, i)).collect();
        if let Some((offsets, _)) = &deletes {
            order.extend(offsets.iter().enumerate().map(|(i, o)| (*o, 1, i)));
        }
        order.sort_unstable();
        let parts: Vec<RecordBatch> = [upsert_rows, deletes.map(|(_, rows)| rows)]
            .into_iter()
            .map(|b| b.unwrap_or_else(|| RecordBatch::new_empty(self.schema.clone())))
            .collect();
        if order.is_empty() {
            return Ok(Decoded { rows: None, bad });
        }
        let at: Vec<(usize, usize)> = order.iter().map(|(_, part, i)| (*part, *i)).collect();
        let columns = (0..self.schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> = parts.iter().map(|p| p.column(c).as_ref()).collect();
                arrow::compute::interleave(&arrays, &at)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let rows = RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(at.len())),
        )?;
        let kinds = order
            .iter()
            .map(|(_, part, _)| {
                if *part == 0 {
                    RowKind::UpdateAfter
                } else {
                    RowKind::Delete
                }
            })
            .collect();
        Ok(Decoded {
            rows: Some(ChangeBatch::new(rows, kinds)),
            bad,
        })
    }

    /// Tombstones as rows of the table: the key's columns from the record
    /// key, the others empty (NULL, or a NOT NULL column's default: the
    /// normalizer replaces the row by the key's last one). Returns the
    /// good tombstones' offsets and rows; bad ones go to `bad`.
    fn decode_tombstones(
        &self,
        d: &Decoders,
        tombstones: &[&Record],
        bad: &mut Vec<(i64, String)>,
    ) -> Result<Option<(Vec<i64>, RecordBatch)>> {
        let Some(k) = self.any_key() else {
            return Err(crate::error::ExecError::internal("an upsert table without a key"));
        };
        let mut good: Vec<&Record> = vec![];
        for r in tombstones {
            match &r.key {
                Some(_) => good.push(r),
                None => bad.push((r.offset, "a tombstone (a record without a value) without a key".into())),
            }
        }
        let keys: Vec<&[u8]> = good.iter().map(|r| r.key.as_deref().unwrap_or_default()).collect();
        let key_rows = match rows_of(&k.format, d.key.as_ref(), &k.schema, &keys) {
            Ok(rows) => rows,
            Err(_) => {
                let mut failed = vec![];
                decode_part(&k.format, d.key.as_ref(), &keys, &good, &mut failed);
                failed.sort_by_key(|(o, _)| *o);
                good.retain(|r| failed.binary_search_by_key(&r.offset, |(o, _)| *o).is_err());
                bad.extend(failed);
                let keys: Vec<&[u8]> = good.iter().map(|r| r.key.as_deref().unwrap_or_default()).collect();
                rows_of(&k.format, d.key.as_ref(), &k.schema, &keys).map_err(|e| {
                    crate::error::ExecError::internal(format!(
                        "keys that decode one by one do not decode together: {e}"
                    ))
                })?
            }
        };
        if good.is_empty() {
            return Ok(None);
        }
        let n = good.len();
        let metadata = self.metadata_columns(d, &good)?;
        let columns = self
            .schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| match k.columns.iter().position(|c| *c == i) {
                Some(at) => Ok(key_rows.column(at).clone()),
                None if metadata.iter().any(|(m, _)| *m == i) => Ok(metadata
                    .iter()
                    .find(|(m, _)| *m == i)
                    .map(|(_, c)| c.clone())
                    .unwrap_or_else(|| arrow::array::new_null_array(f.data_type(), n))),
                None if f.is_nullable() => Ok(arrow::array::new_null_array(f.data_type(), n)),
                None => Ok(datafusion::common::ScalarValue::new_default(f.data_type())?.to_array_of_size(n)?),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let rows = crate::operators::calc::batch_with_schema(&self.schema, columns)?;
        Ok(Some((good.iter().map(|r| r.offset).collect(), rows)))
    }

    /// Decodes records that all have values.
    fn decode_values(&self, d: &Decoders, records: &[&Record]) -> Result<Decoded> {
        let values: Vec<&[u8]> = records.iter().map(|r| r.value.as_deref().unwrap_or_default()).collect();
        let keys: Vec<&[u8]> = records.iter().map(|r| r.key.as_deref().unwrap_or_default()).collect();
        // The common case: every record decodes, in one go.
        if let Ok(value) = rows_of(&self.value, d.value.as_ref(), &self.value_schema, &values) {
            let key = match &self.key {
                None => Some(None),
                Some(k) => rows_of(&k.format, d.key.as_ref(), &k.schema, &keys).ok().map(Some),
            };
            if let Some(key) = key {
                return Ok(Decoded {
                    rows: self.assemble(d, value, key, records)?,
                    bad: vec![],
                });
            }
        }
        let mut bad: Vec<(i64, String)> = vec![];
        decode_part(&self.value, d.value.as_ref(), &values, records, &mut bad);
        if let Some(k) = &self.key {
            decode_part(&k.format, d.key.as_ref(), &keys, records, &mut bad);
        }
        bad.sort_by_key(|(o, _)| *o);
        bad.dedup_by_key(|(o, _)| *o);
        let good: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| bad.binary_search_by_key(&r.offset, |(o, _)| *o).is_err())
            .collect();
        if good.is_empty() {
            return Ok(Decoded { rows: None, bad });
        }
        let together = |e: String| {
            crate::error::ExecError::internal(format!("records that decode one by one do not decode together: {e}"))
        };
        let values: Vec<&[u8]> = good.iter().map(|r| r.value.as_deref().unwrap_or_default()).collect();
        let value = rows_of(&self.value, d.value.as_ref(), &self.value_schema, &values).map_err(together)?;
        let key = match &self.key {
            None => None,
            Some(k) => {
                let keys: Vec<&[u8]> = good.iter().map(|r| r.key.as_deref().unwrap_or_default()).collect();
                Some(rows_of(&k.format, d.key.as_ref(), &k.schema, &keys).map_err(together)?)
            }
        };
        Ok(Decoded {
            rows: self.assemble(d, value, key, &good)?,
            bad,
        })
    }

    /// The table's rows from decoded values (and keys, with `EXCEPT_KEY`)
    /// of `records` (and their metadata).
    fn assemble(
        &self,
        d: &Decoders,
        value: RecordBatch,
        key: Option<RecordBatch>,
        records: &[&Record],
    ) -> Result<Option<ChangeBatch>> {
        if let PartFormat::Text(f) = &self.value
            && f.format.is_changelog()
        {
            let changes = filesystem::changelog::expand(f.format, &value, &self.schema)?;
            return Ok((changes.num_rows() > 0).then_some(changes));
        }
        let mut columns: Vec<Option<ArrayRef>> = vec![None; self.schema.fields().len()];
        if let (Some(k), Some(key)) = (&self.key, key) {
            for (c, i) in k.columns.iter().enumerate() {
                columns[*i] = Some(key.column(c).clone());
            }
        }
        for (c, i) in self.value_columns.iter().enumerate() {
            columns[*i] = Some(value.column(c).clone());
        }
        for (i, column) in self.metadata_columns(d, records)? {
            columns[i] = Some(column);
        }
        let columns = columns
            .into_iter()
            .map(|c| {
                c.ok_or_else(|| crate::error::ExecError::internal("a column is in neither key, value nor metadata"))
            })
            .collect::<Result<Vec<_>>>()?;
        let rows = crate::operators::calc::batch_with_schema(&self.schema, columns)?;
        Ok((rows.num_rows() > 0).then(|| rows.into()))
    }

    /// Each row of `batch` (the table's physical columns) as a record's
    /// key (with `key.format`) and value.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Encoded> {
        let timestamps = match self.metadata.iter().find(|(_, m)| *m == Meta::Timestamp) {
            Some((i, _)) => Some(metadata::timestamps(batch.column(*i))?),
            None => None,
        };
        let headers = match self.metadata.iter().find(|(_, m)| *m == Meta::Headers) {
            Some((i, _)) => Some(metadata::headers(batch.column(*i))?),
            None => None,
        };
        let topics = match self.metadata.iter().find(|(_, m)| *m == Meta::Topic) {
            Some((i, _)) => Some(metadata::topics(batch.column(*i))?),
            None => None,
        };
        let keys = match self.key.as_ref().or(self.write_key.as_ref()) {
            None => None,
            Some(k) => {
                let cols = k.columns.iter().map(|i| batch.column(*i).clone()).collect();
                let part = RecordBatch::try_new(k.schema.clone(), cols)?;
                Some(
                    encode_part(&k.format, &part)?
                        .into_iter()
                        .map(Option::unwrap_or_default)
                        .collect(),
                )
            }
        };
        let cols = self.value_columns.iter().map(|i| batch.column(*i).clone()).collect();
        let part = RecordBatch::try_new(self.value_schema.clone(), cols)?;
        Ok(Encoded {
            keys,
            values: encode_part(&self.value, &part)?,
            timestamps,
            headers,
            topics,
        })
    }

    /// Whether the value format is a changelog one (`debezium-json`, ...):
    /// every change a record, an update two.
    pub fn writes_changes(&self) -> bool {
        !self.upsert && self.value.is_changelog()
    }

    /// Changes as records of the changelog value format, one envelope
    /// each (`+I`/`+U` an insert, `-U`/`-D` a delete, as Flink writes).
    pub fn encode_changelog(&self, batch: ChangeBatch) -> Result<Encoded> {
        let PartFormat::Text(f) = &self.value else {
            return Err(crate::error::ExecError::internal("a changelog format that is not text"));
        };
        let mut encoded = self.encode(&batch.rows)?;
        let mut json = Vec::new();
        for v in &encoded.values {
            json.extend_from_slice(v.as_deref().unwrap_or_default());
            json.push(b'\n');
        }
        let lines = filesystem::changelog::envelopes(f.format, &batch, &json)?;
        encoded.values = lines
            .split(|b| *b == b'\n')
            .take(batch.num_rows())
            .map(|l| Some(l.to_vec()))
            .collect();
        Ok(encoded)
    }

    /// An upsert table's changes as records: `+I` and `+U` the row, `-D`
    /// a tombstone of its key, `-U` a tombstone too unless a later record
    /// of its key (and topic) in the batch supersedes it.
    pub fn encode_changes(&self, batch: ChangeBatch) -> Result<Encoded> {
        let mut encoded = self.encode(&batch.rows)?;
        if batch.kinds.is_none() {
            return Ok(encoded);
        }
        // `-D` is a tombstone of its key, and so is `-U` (Flink's
        // `DynamicKafkaRecordSerializationSchema`), unless a later record of
        // the same key in this batch supersedes it: the `+U` that follows it
        // in an update. Flink's planner leaves `-U` out wherever the sink does
        // not need it; Weir's operators always send it, so the pairing is
        // done here. A `-U` with no `+U` after it is a row that left the
        // result (a filter on an aggregate dropped its new value): without
        // its tombstone the topic would keep the old row.
        let n = batch.num_rows();
        let mut keep = vec![true; n];
        // A record is another of the same key only in the same topic (a
        // writable `topic` column sends rows to several).
        let mut later_keys: std::collections::HashSet<(Option<&str>, &[u8])> = std::collections::HashSet::new();
        for i in (0..n).rev() {
            let topic = encoded.topics.as_ref().and_then(|t| t[i].as_deref());
            let key = encoded.keys.as_ref().map(|k| (topic, k[i].as_slice()));
            match batch.kind(i) {
                RowKind::Delete => encoded.values[i] = None,
                RowKind::UpdateBefore => match key {
                    Some(k) if later_keys.contains(&k) => keep[i] = false,
                    _ => encoded.values[i] = None,
                },
                _ => {}
            }
            if let Some(k) = key {
                later_keys.insert(k);
            }
        }
        drop(later_keys);
        if keep.iter().all(|k| *k) {
            return Ok(encoded);
        }
        fn retain<T>(v: &mut Vec<T>, keep: &[bool]) {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        if let Some(k) = encoded.keys.as_mut() {
            retain(k, &keep);
        }
        retain(&mut encoded.values, &keep);
        if let Some(t) = encoded.timestamps.as_mut() {
            retain(t, &keep);
        }
        if let Some(h) = encoded.headers.as_mut() {
            retain(h, &keep);
        }
        if let Some(t) = encoded.topics.as_mut() {
            retain(t, &keep);
        }
        Ok(encoded)
    }
}

/// The per-split decoders of a [`Codec`].
pub(super) struct Decoders {
    value: Option<LineDecoder>,
    key: Option<LineDecoder>,
    /// The split's topic (the `topic` metadata column).
    topic: String,
}

/// Text of a record, without the line break some producers end it with.
fn text_of(bytes: &[u8]) -> std::result::Result<&str, String> {
    let t = std::str::from_utf8(bytes).map_err(|e| format!("invalid UTF-8 after byte {}", e.valid_up_to()))?;
    Ok(t.trim_end_matches(['\n', '\r']))
}

/// Adds the records of `parts` that do not decode on their own to `bad`.
fn decode_part(
    format: &PartFormat,
    d: Option<&LineDecoder>,
    parts: &[&[u8]],
    records: &[&Record],
    bad: &mut Vec<(i64, String)>,
) {
    if let PartFormat::Avro(a) = format {
        for (i, p) in parts.iter().enumerate() {
            if let Err(e) = a.decode(&[p]) {
                bad.push((records[i].offset, e));
            }
        }
        return;
    }
    let (PartFormat::Text(_), Some(d)) = (format, d) else {
        return;
    };
    let mut texts = vec![];
    let mut at = vec![];
    for (i, p) in parts.iter().enumerate() {
        match text_of(p) {
            Ok(t) if t.trim().is_empty() => bad.push((records[i].offset, "an empty record".into())),
            Ok(t) => {
                texts.push(t);
                at.push(i);
            }
            Err(e) => bad.push((records[i].offset, e)),
        }
    }
    if d.decode_lines(&texts).is_ok() {
        return;
    }
    let mut failed = vec![];
    d.find_bad(&texts, 0, &mut failed);
    for (i, reason) in failed {
        bad.push((records[at[i]].offset, reason));
    }
}

/// Decodes every part into a batch of `schema`; an error if any part
/// does not decode (then [`decode_part`] finds which).
fn rows_of(
    format: &PartFormat,
    d: Option<&LineDecoder>,
    schema: &SchemaRef,
    parts: &[&[u8]],
) -> std::result::Result<RecordBatch, String> {
    match (format, d) {
        (PartFormat::Avro(a), _) => a.decode(parts),
        (PartFormat::Text(_), Some(d)) => {
            let texts = parts
                .iter()
                .map(|p| text_of(p))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            match d.decode_lines(&texts).map_err(|e| e.to_string())? {
                Some(b) => Ok(b),
                None => Ok(RecordBatch::new_empty(schema.clone())),
            }
        }
        _ => {
            let column: ArrayRef = match schema.field(0).data_type() {
                // As Java's `new String(bytes, UTF_8)`: bad bytes become U+FFFD.
                DataType::Utf8 => Arc::new(StringArray::from_iter_values(
                    parts.iter().map(|p| String::from_utf8_lossy(p)),
                )),
                DataType::LargeUtf8 => Arc::new(arrow::array::LargeStringArray::from_iter_values(
                    parts.iter().map(|p| String::from_utf8_lossy(p)),
                )),
                _ => Arc::new(BinaryArray::from_iter_values(parts.iter())),
            };
            RecordBatch::try_new(schema.clone(), vec![column]).map_err(|e| e.to_string())
        }
    }
}

/// Each row of `part` as bytes in `format` (`None`: a raw NULL).
fn encode_part(format: &PartFormat, part: &RecordBatch) -> Result<Vec<Option<Vec<u8>>>> {
    let f = match format {
        PartFormat::Raw => {
            let c = part.column(0);
            return Ok(match c.data_type() {
                DataType::Utf8 => c
                    .as_string::<i32>()
                    .iter()
                    .map(|v| v.map(|s| s.as_bytes().to_vec()))
                    .collect(),
                DataType::LargeUtf8 => c
                    .as_string::<i64>()
                    .iter()
                    .map(|v| v.map(|s| s.as_bytes().to_vec()))
                    .collect(),
                _ => c.as_binary::<i32>().iter().map(|v| v.map(<[u8]>::to_vec)).collect(),
            });
        }
        PartFormat::Avro(a) => {
            let datums = a.encode(part).map_err(|message| crate::error::ConnectorError::Data {
                location: format!("connector '{NAME}', format 'avro'"),
                message,
            })?;
            return Ok(datums.into_iter().map(Some).collect());
        }
        PartFormat::Text(f) => f,
    };
    let text = filesystem::sink::stringify_timestamps(part, f.iso_timestamps)?;
    // A changelog format's rows are JSON objects (put in envelopes by
    // `Codec::encode_changelog`).
    if f.format == Format::Json || f.format.is_changelog() {
        let mut json = Vec::new();
        {
            // Flink's JSON format writes NULL fields as `null`.
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(&mut json);
            w.write(&text)?;
            w.finish()?;
        }
        let out: Vec<Option<Vec<u8>>> = json
            .split(|b| *b == b'\n')
            .take(part.num_rows())
            .map(|l| Some(l.to_vec()))
            .collect();
        if out.len() != part.num_rows() {
            return Err(crate::error::ExecError::internal(
                "JSON writer wrote fewer lines than rows",
            ));
        }
        return Ok(out);
    }
    // CSV: row by row, since a quoted field may hold a line break.
    let mut out = Vec::with_capacity(part.num_rows());
    for r in 0..part.num_rows() {
        let mut buffer = Vec::new();
        {
            let mut b = arrow::csv::WriterBuilder::new()
                .with_header(false)
                .with_delimiter(f.delimiter)
                .with_quote(f.quote);
            if let Some(null) = &f.null_literal {
                b = b.with_null(null.clone());
            }
            b.build(&mut buffer).write(&text.slice(r, 1))?;
        }
        while buffer.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buffer.pop();
        }
        out.push(Some(buffer));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use std::collections::BTreeMap;

    fn options(pairs: &[(&str, &str)]) -> Options {
        let m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let specs: Vec<_> = super::super::OPTIONS
            .iter()
            .chain(filesystem::FORMAT_OPTIONS)
            .copied()
            .collect();
        Options::validate(&m, &specs, "connector 'kafka'").expect("valid options")
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k_id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]))
    }

    fn record(offset: i64, key: &str, value: &str) -> Record {
        Record {
            offset,
            key: Some(bytes::Bytes::copy_from_slice(key.as_bytes())),
            value: Some(bytes::Bytes::copy_from_slice(value.as_bytes())),
            meta: RecordMeta::default(),
        }
    }

    fn tombstone(offset: i64, key: &str) -> Record {
        Record {
            offset,
            key: Some(bytes::Bytes::copy_from_slice(key.as_bytes())),
            value: None,
            meta: RecordMeta::default(),
        }
    }

    #[test]
    fn upsert_records_are_updates_and_tombstones_deletes_in_offset_order() {
        // `ALL`: the key columns are read from the value, and from the key
        // of a tombstone.
        let o = options(&[("value.format", "json"), ("key.format", "json"), ("key.fields", "k_id")]);
        let c = Codec::new(&o, &schema(), true, vec![]).expect("codec");
        let d = c.decoders("t");
        let out = c
            .decode(
                &d,
                &[
                    record(1, r#"{"k_id":1}"#, r#"{"k_id":1,"name":"a"}"#),
                    tombstone(2, r#"{"k_id":1}"#),
                    tombstone(3, "{oops"),
                    Record {
                        offset: 4,
                        key: None,
                        value: None,
                        meta: RecordMeta::default(),
                    },
                    record(5, r#"{"k_id":2}"#, r#"{"k_id":2,"name":"b"}"#),
                ],
            )
            .expect("decoded");
        assert_eq!(out.bad.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![3, 4]);
        let rows = out.rows.expect("rows");
        let kinds: Vec<&str> = (0..rows.num_rows()).map(|i| rows.kind(i).short()).collect();
        assert_eq!(kinds, ["+U", "-D", "+U"]);
        let ids = rows.rows.column(0).as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![1, 1, 2]);
        assert!(rows.rows.column(1).is_null(1), "a tombstone knows only its key");

        // Written back: -D a tombstone of its key; a -U with no later
        // record of its key too (the row left the result).
        let mut changes = rows.clone();
        changes.kinds = Some(arrow::array::UInt8Array::from(vec![2, 1, 3]));
        let e = c.encode_changes(changes).expect("encoded");
        assert_eq!(e.values, vec![Some(br#"{"k_id":1,"name":"a"}"#.to_vec()), None, None]);
        let keys = e.keys.expect("keys");
        assert_eq!(keys[1], br#"{"k_id":1}"#.to_vec());
        assert_eq!(keys[2], br#"{"k_id":2}"#.to_vec());

        // An update: the -U is superseded by the +U of its key after it.
        let mut changes = rows.clone();
        changes.kinds = Some(arrow::array::UInt8Array::from(vec![1, 2, 3]));
        let e = c.encode_changes(changes).expect("encoded");
        assert_eq!(e.values.len(), 2);
        assert!(e.values[0].is_some() && e.values[1].is_none());
        assert_eq!(
            e.keys.expect("keys"),
            vec![br#"{"k_id":1}"#.to_vec(), br#"{"k_id":2}"#.to_vec()]
        );
    }

    #[test]
    fn except_key_reads_the_key_columns_from_the_key_without_their_prefix() {
        let o = options(&[
            ("format", "json"),
            ("key.format", "json"),
            ("key.fields", "k_id"),
            ("key.fields-prefix", "k_"),
            ("value.fields-include", "EXCEPT_KEY"),
        ]);
        let c = Codec::new(&o, &schema(), false, vec![]).expect("codec");
        let d = c.decoders("t");
        let out = c
            .decode(
                &d,
                &[
                    record(7, r#"{"id":1}"#, r#"{"name":"a"}"#),
                    record(8, r#"{"id":2}"#, "{oops"),
                ],
            )
            .expect("decoded");
        assert_eq!(out.bad.len(), 1);
        assert_eq!(out.bad[0].0, 8);
        let rows = out.rows.expect("rows").rows;
        assert_eq!(rows.num_rows(), 1);
        assert_eq!(rows.column(0).as_primitive::<arrow::datatypes::Int64Type>().value(0), 1);
        assert_eq!(rows.column(1).as_string::<i32>().value(0), "a");
        let e = c.encode(&rows).expect("encoded");
        assert_eq!(e.keys.expect("keys")[0], br#"{"id":1}"#.to_vec());
        assert_eq!(e.values[0].as_deref(), Some(&br#"{"name":"a"}"#[..]));
    }

    #[test]
    fn options_that_contradict_each_other_are_refused_by_name() {
        let e = Codec::new(
            &options(&[("format", "json"), ("key.fields-prefix", "k_")]),
            &schema(),
            false,
            vec![],
        )
        .expect_err("prefix without EXCEPT_KEY");
        assert!(e.to_string().contains("key.fields-prefix"), "{e}");
        let e = Codec::new(&options(&[("format", "raw")]), &schema(), false, vec![]).expect_err("raw with two columns");
        assert!(e.to_string().contains("one STRING or BYTES column"), "{e}");
        let e = Codec::new(
            &options(&[("format", "json"), ("key.fields", "nope"), ("key.format", "json")]),
            &schema(),
            false,
            vec![],
        )
        .expect_err("unknown key column");
        assert!(e.to_string().contains("'nope'"), "{e}");
    }
}
