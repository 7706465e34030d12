//! `datagen`: Flink's data generator, with Flink's option names.
//!
//! `fields.<name>.kind` = `random` (default; `min`/`max` for numbers,
//! `length` for strings, `max-past` for timestamps, `null-rate`) or
//! `sequence` (`start`..=`end`; the source ends when a sequence is
//! exhausted). Unlike Flink's, random values are deterministic: row `r`'s
//! values are drawn from a generator seeded by `r`.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use arrow::datatypes::{DataType, SchemaRef};
use tokio::time::{Duration, Instant};
use weir_catalog::{OptionKind, OptionSpec, Options};

use super::nexmark::generator::Rng;
use super::{DEFAULT_BATCH_ROWS, SourceFactory, SourceSplit, SplitPoll, config_error};
use crate::error::Result;

const ANY_INT: OptionKind = OptionKind::Int {
    min: i64::MIN,
    max: i64::MAX,
};

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "rows-per-second",
        OptionKind::Int { min: 1, max: i64::MAX },
        "rows per second over all splits",
    )
    .with_default("10000"),
    OptionSpec::new(
        "number-of-rows",
        OptionKind::Int { min: 0, max: i64::MAX },
        "total rows (bounded); absent = unbounded",
    ),
    OptionSpec::new(
        "fields.*.kind",
        OptionKind::Enum(&["random", "sequence"]),
        "how a field's values are made",
    )
    .with_default("random"),
    OptionSpec::new("fields.*.min", ANY_INT, "smallest random value"),
    OptionSpec::new("fields.*.max", ANY_INT, "largest random value"),
    OptionSpec::new(
        "fields.*.length",
        OptionKind::Int { min: 0, max: 1 << 20 },
        "random string length",
    )
    .with_default("100"),
    OptionSpec::new("fields.*.start", ANY_INT, "first sequence value"),
    OptionSpec::new("fields.*.end", ANY_INT, "last sequence value"),
    OptionSpec::new(
        "fields.*.max-past",
        OptionKind::Duration,
        "random timestamps lie up to this far before now",
    )
    .with_default("0 ms"),
    OptionSpec::new(
        "fields.*.null-rate",
        OptionKind::String,
        "fraction of nulls, 0.0 to 1.0",
    )
    .with_default("0.0"),
];

#[derive(Debug, Clone)]
enum FieldGen {
    Sequence { start: i64, end: i64 },
    RandomInt { min: i64, max: i64 },
    RandomFloat { min: f64, max: f64 },
    RandomBool,
    RandomString { length: usize },
    RandomTimestamp { max_past_ms: i64 },
}

#[derive(Debug, Clone)]
struct Field {
    kind: FieldGen,
    null_rate: f64,
    target: DataType,
}

fn base_type(t: &DataType) -> Option<char> {
    Some(match t {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => 'i',
        DataType::Float32 | DataType::Float64 => 'f',
        DataType::Boolean => 'b',
        DataType::Utf8 | DataType::LargeUtf8 => 's',
        DataType::Timestamp(_, _) => 't',
        _ => return None,
    })
}

/// Checks field options against the table's columns.
pub fn validate(options: &Options, schema: &SchemaRef) -> Result<()> {
    build_fields(options, schema, 0).map(|_| ())
}

fn build_fields(options: &Options, schema: &SchemaRef, now_ms: i64) -> Result<Vec<Field>> {
    for key in options.keys_with_prefix("fields.") {
        let name = key.split('.').nth(1).unwrap_or_default();
        if schema.index_of(name).is_err() {
            return Err(config_error("datagen", format!("option '{key}' names no column of the table")).into());
        }
    }
    let mut fields = vec![];
    for f in schema.fields() {
        let name = f.name();
        let key = |k: &str| format!("fields.{name}.{k}");
        let kind = options.enum_value(&key("kind")).unwrap_or_else(|| "random".into());
        let ty = base_type(f.data_type()).ok_or_else(|| {
            config_error(
                "datagen",
                format!(
                    "column '{name}' has type {} which datagen cannot generate",
                    f.data_type()
                ),
            )
        })?;
        let null_rate_s = options.get(&key("null-rate")).unwrap_or("0.0");
        let null_rate: f64 = null_rate_s
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| (0.0..=1.0).contains(v))
            .ok_or_else(|| weir_catalog::CatalogError::InvalidOption {
                key: key("null-rate"),
                message: format!("invalid value '{null_rate_s}', expected a number from 0.0 to 1.0"),
            })?;
        let generator = if kind == "sequence" {
            if ty != 'i' && ty != 's' {
                return Err(config_error(
                    "datagen",
                    format!("'{}' = 'sequence' needs a numeric or string column", key("kind")),
                )
                .into());
            }
            let start = options
                .i64(&key("start"))?
                .ok_or_else(|| config_error("datagen", format!("'{}' is required for a sequence", key("start"))))?;
            let end = options
                .i64(&key("end"))?
                .ok_or_else(|| config_error("datagen", format!("'{}' is required for a sequence", key("end"))))?;
            if end < start {
                return Err(config_error("datagen", format!("'{}' < '{}'", key("end"), key("start"))).into());
            }
            FieldGen::Sequence { start, end }
        } else {
            let min = options.i64(&key("min"))?;
            let max = options.i64(&key("max"))?;
            if let (Some(a), Some(b)) = (min, max)
                && b < a
            {
                return Err(config_error("datagen", format!("'{}' < '{}'", key("max"), key("min"))).into());
            }
            match ty {
                'i' => {
                    let (lo, hi) = int_range(f.data_type());
                    FieldGen::RandomInt {
                        min: min.unwrap_or(lo),
                        max: max.unwrap_or(hi),
                    }
                }
                'f' => FieldGen::RandomFloat {
                    min: min.map_or(f64::MIN / 2.0, |v| v as f64),
                    max: max.map_or(f64::MAX / 2.0, |v| v as f64),
                },
                'b' => FieldGen::RandomBool,
                's' => FieldGen::RandomString {
                    length: options.i64(&key("length"))?.unwrap_or(100) as usize,
                },
                _ => FieldGen::RandomTimestamp {
                    max_past_ms: options.duration(&key("max-past"))?.map_or(0, |d| d.as_millis() as i64),
                },
            }
        };
        let _ = now_ms;
        fields.push(Field {
            kind: generator,
            null_rate,
            target: f.data_type().clone(),
        });
    }
    Ok(fields)
}

fn int_range(t: &DataType) -> (i64, i64) {
    match t {
        DataType::Int8 => (i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => (i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

#[derive(Debug)]
pub struct DatagenSource {
    fields: Vec<Field>,
    schema: SchemaRef,
    rows: Option<u64>,
    rate: u64,
    now_ms: i64,
}

impl DatagenSource {
    pub fn new(options: &Options, schema: SchemaRef) -> Result<Self> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        let fields = build_fields(options, &schema, now_ms)?;
        let mut rows = options.i64("number-of-rows")?.map(|v| v as u64);
        // A sequence bounds the source to its length.
        for f in &fields {
            if let FieldGen::Sequence { start, end } = f.kind {
                let len = (end - start) as u64 + 1;
                rows = Some(rows.map_or(len, |r| r.min(len)));
            }
        }
        Ok(Self {
            fields,
            schema,
            rows,
            rate: options.i64("rows-per-second")?.unwrap_or(10_000) as u64,
            now_ms,
        })
    }
}

impl SourceFactory for DatagenSource {
    fn name(&self) -> &str {
        "datagen"
    }

    fn is_bounded(&self) -> bool {
        self.rows.is_some()
    }

    fn bounding_hint(&self) -> String {
        "set 'number-of-rows'".into()
    }

    fn create_splits(&self, parallelism: usize) -> Result<Vec<Box<dyn SourceSplit>>> {
        let n = parallelism.max(1) as u64;
        Ok((0..n)
            .map(|i| {
                Box::new(DatagenSplit {
                    fields: self.fields.clone(),
                    schema: self.schema.clone(),
                    end: self.rows.unwrap_or(u64::MAX),
                    rate: self.rate as f64 / n as f64,
                    now_ms: self.now_ms,
                    next_row: i,
                    step: n,
                    read: 0,
                    started: None,
                }) as Box<dyn SourceSplit>
            })
            .collect())
    }
}

struct DatagenSplit {
    fields: Vec<Field>,
    schema: SchemaRef,
    end: u64,
    rate: f64,
    now_ms: i64,
    next_row: u64,
    step: u64,
    read: u64,
    started: Option<Instant>,
}

impl SourceSplit for DatagenSplit {
    fn resumed_after(&mut self, paused: std::time::Duration) {
        if let Some(started) = &mut self.started {
            *started += paused;
        }
    }

    fn id(&self) -> String {
        format!("datagen-{}-of-{}", self.next_row % self.step, self.step)
    }

    fn offset(&self) -> u64 {
        self.read
    }

    fn progress(&self) -> Option<(u64, u64)> {
        if self.end == u64::MAX {
            return None;
        }
        let left = if self.next_row < self.end {
            (self.end - self.next_row - 1) / self.step + 1
        } else {
            0
        };
        Some((self.read, self.read + left))
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        // Rows are a pure function of their number.
        self.next_row += position * self.step;
        self.read = position;
        Ok(())
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        if self.next_row >= self.end {
            return Ok(SplitPoll::Finished);
        }
        let ahead = Duration::from_secs_f64(self.read as f64 / self.rate);
        let started = *self
            .started
            .get_or_insert_with(|| Instant::now().checked_sub(ahead).unwrap_or_else(Instant::now));
        let due = (started.elapsed().as_secs_f64() * self.rate) as u64;
        if due <= self.read {
            return Ok(SplitPoll::Wait(
                started + Duration::from_secs_f64((self.read + 1) as f64 / self.rate),
            ));
        }
        let mut rows = vec![];
        while (rows.len() as u64) < (due - self.read).min(DEFAULT_BATCH_ROWS as u64) && self.next_row < self.end {
            rows.push(self.next_row);
            self.next_row += self.step;
        }
        self.read += rows.len() as u64;
        let mut arrays = vec![];
        for (fi, f) in self.fields.iter().enumerate() {
            let rng_for = |r: u64| Rng::new(fi as u64, r);
            let is_null = |r: u64| f.null_rate > 0.0 && Rng::new(fi as u64 + 1_000_003, r).unit() < f.null_rate;
            let a: ArrayRef = match &f.kind {
                FieldGen::Sequence { start, .. } if matches!(f.target, DataType::Utf8 | DataType::LargeUtf8) => {
                    let mut b = StringBuilder::new();
                    rows.iter()
                        .for_each(|r| b.append_value((start + *r as i64).to_string()));
                    Arc::new(b.finish())
                }
                FieldGen::Sequence { start, .. } => {
                    let mut b = Int64Builder::new();
                    rows.iter().for_each(|r| b.append_value(start + *r as i64));
                    Arc::new(b.finish())
                }
                &FieldGen::RandomInt { min, max } => {
                    let mut b = Int64Builder::new();
                    for r in &rows {
                        let span = (max as i128 - min as i128 + 1) as u128;
                        let v = (min as i128 + (u128::from(rng_for(*r).next_u64()) % span) as i128) as i64;
                        b.append_option((!is_null(*r)).then_some(v));
                    }
                    Arc::new(b.finish())
                }
                FieldGen::RandomFloat { min, max } => {
                    let mut b = Float64Builder::new();
                    for r in &rows {
                        let v = min + (max - min) * rng_for(*r).unit();
                        b.append_option((!is_null(*r)).then_some(v));
                    }
                    Arc::new(b.finish())
                }
                FieldGen::RandomBool => {
                    let mut b = BooleanBuilder::new();
                    for r in &rows {
                        b.append_option((!is_null(*r)).then_some(rng_for(*r).below(2) == 1));
                    }
                    Arc::new(b.finish())
                }
                &FieldGen::RandomString { length } => {
                    let mut b = StringBuilder::new();
                    let mut s = String::new();
                    for r in &rows {
                        s.clear();
                        rng_for(*r).push_string(&mut s, length);
                        b.append_option((!is_null(*r)).then_some(s.as_str()));
                    }
                    Arc::new(b.finish())
                }
                &FieldGen::RandomTimestamp { max_past_ms } => {
                    let mut b = TimestampMillisecondBuilder::new();
                    for r in &rows {
                        let past = rng_for(*r).below(max_past_ms.max(0) as u64 + 1) as i64;
                        b.append_option((!is_null(*r)).then_some(self.now_ms - past));
                    }
                    Arc::new(b.finish())
                }
            };
            arrays.push(a);
        }
        Ok(SplitPoll::Batch(crate::operators::calc::batch_of_rows(
            &self.schema,
            arrays,
            rows.len(),
        )?))
    }
}
