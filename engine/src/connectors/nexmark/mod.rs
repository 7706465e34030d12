//! `nexmark`: the Nexmark benchmark's event generator as a source.
//!
//! ```sql
//! CREATE TABLE bid (
//!   auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
//!   dateTime TIMESTAMP(3), extra STRING,
//!   WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
//! ) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '1000000');
//! ```
//! Columns may be omitted (all of the table's are used) or be any subset of
//! the generator's, by name. Events are split by epoch (the 50 events
//! holding 1 person, 3 auctions and 46 bids): epoch `e` goes to split
//! `e % splits`, so every split sees every kind in the right proportion.

pub mod generator;

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Builder, StringBuilder, TimestampMillisecondBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use tokio::time::{Duration, Instant};
use weir_catalog::{OptionKind, OptionSpec, Options};

use self::generator::{EventKind, EventTime, Rng, kind_of};
use super::{DEFAULT_BATCH_ROWS, SourceFactory, SourceSplit, SplitPoll, config_error};
use crate::error::Result;

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        "nexmark.table",
        OptionKind::Enum(&["person", "auction", "bid"]),
        "which events the table holds",
    )
    .with_default("bid"),
    OptionSpec::new(
        "nexmark.events",
        OptionKind::Int { min: 0, max: i64::MAX },
        "total events of all kinds to generate (bounded); absent = unbounded",
    ),
    OptionSpec::new(
        "nexmark.events-per-second",
        OptionKind::Int { min: 0, max: i64::MAX },
        "wall-clock rate over all splits; 0 = as fast as possible",
    )
    .with_default("0"),
    OptionSpec::new(
        "nexmark.first-event-rate",
        OptionKind::Int { min: 1, max: i64::MAX },
        "event-time rate: events per second of event time",
    )
    .with_default("10000"),
    OptionSpec::new("nexmark.seed", OptionKind::Int { min: 0, max: i64::MAX }, "random seed").with_default("0"),
    OptionSpec::new(
        "nexmark.base-time",
        OptionKind::String,
        "event time of event 0, 'yyyy-MM-dd HH:mm:ss[.SSS]' (UTC)",
    )
    .with_default("2015-07-15 00:00:00.000"),
    OptionSpec::new(
        "nexmark.split-skew",
        OptionKind::Int { min: 1, max: 1_000_000 },
        "split 0 reads this many times faster than the others (uneven partitions, for backfill tests)",
    )
    .with_default("1"),
    OptionSpec::new(
        "splits",
        OptionKind::Int { min: 1, max: 65536 },
        "number of splits (default: the source's parallelism)",
    ),
];

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, None)
}

/// The generator's columns for `nexmark.table`, in Nexmark's DDL order.
pub fn table_schema(options: &Options) -> Result<SchemaRef> {
    let s = |n: &str| Field::new(n, DataType::Utf8, true);
    let i = |n: &str| Field::new(n, DataType::Int64, true);
    let t = |n: &str| Field::new(n, ts(), true);
    let fields = match options.enum_value("nexmark.table").as_deref() {
        Some("person") => vec![
            i("id"),
            s("name"),
            s("emailAddress"),
            s("creditCard"),
            s("city"),
            s("state"),
            t("dateTime"),
            s("extra"),
        ],
        Some("auction") => vec![
            i("id"),
            s("itemName"),
            s("description"),
            i("initialBid"),
            i("reserve"),
            t("dateTime"),
            t("expires"),
            i("seller"),
            i("category"),
            s("extra"),
        ],
        _ => vec![
            i("auction"),
            i("bidder"),
            i("price"),
            s("channel"),
            s("url"),
            t("dateTime"),
            s("extra"),
        ],
    };
    Ok(Arc::new(Schema::new(fields)))
}

#[derive(Debug, Clone)]
struct Config {
    kind: EventKind,
    events: Option<u64>,
    rate: u64,
    time: EventTime,
    seed: u64,
    splits: Option<usize>,
    /// Split 0 reads this many times faster than the others.
    skew: u64,
}

#[derive(Debug)]
pub struct NexmarkSource {
    config: Config,
    /// The table's physical schema (what we produce).
    schema: SchemaRef,
    /// For each output column, the generator column it is.
    columns: Vec<usize>,
}

impl NexmarkSource {
    pub fn new(options: &Options, schema: SchemaRef) -> Result<Self> {
        let full = table_schema(options)?;
        let mut columns = vec![];
        for f in schema.fields() {
            let idx = full.index_of(f.name()).map_err(|_| {
                let names: Vec<&str> = full.fields().iter().map(|f| f.name().as_str()).collect();
                config_error(
                    "nexmark",
                    format!(
                        "column '{}' is not a field of nexmark table '{}'; fields: {}",
                        f.name(),
                        options.get("nexmark.table").unwrap_or("bid"),
                        names.join(", ")
                    ),
                )
            })?;
            let from = full.field(idx).data_type();
            if !arrow::compute::can_cast_types(from, f.data_type()) {
                return Err(config_error(
                    "nexmark",
                    format!(
                        "column '{}' is declared {} but the generator produces {from}",
                        f.name(),
                        f.data_type()
                    ),
                )
                .into());
            }
            columns.push(idx);
        }
        let base = options.get("nexmark.base-time").unwrap_or("2015-07-15 00:00:00.000");
        let base_time_ms = parse_timestamp(base).ok_or_else(|| weir_catalog::CatalogError::InvalidOption {
            key: "nexmark.base-time".into(),
            message: format!("invalid value '{base}', expected 'yyyy-MM-dd HH:mm:ss[.SSS]'"),
        })?;
        let kind = match options.enum_value("nexmark.table").as_deref() {
            Some("person") => EventKind::Person,
            Some("auction") => EventKind::Auction,
            _ => EventKind::Bid,
        };
        Ok(Self {
            config: Config {
                kind,
                events: options.i64("nexmark.events")?.map(|v| v as u64),
                rate: options.i64("nexmark.events-per-second")?.unwrap_or(0) as u64,
                time: EventTime {
                    base_time_ms,
                    first_event_rate: options.i64("nexmark.first-event-rate")?.unwrap_or(10_000) as u64,
                },
                seed: options.i64("nexmark.seed")?.unwrap_or(0) as u64,
                splits: options.i64("splits")?.map(|v| v as usize),
                skew: options.i64("nexmark.split-skew")?.unwrap_or(1) as u64,
            },
            schema,
            columns,
        })
    }
}

/// Parses `yyyy-MM-dd HH:mm:ss[.SSS]` (UTC) to epoch milliseconds.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.trim();
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f"))
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

impl SourceFactory for NexmarkSource {
    fn name(&self) -> &str {
        "nexmark"
    }

    fn is_bounded(&self) -> bool {
        self.config.events.is_some()
    }

    fn bounding_hint(&self) -> String {
        "set 'nexmark.events'".into()
    }

    fn create_splits(&self, parallelism: usize) -> Result<Vec<Box<dyn SourceSplit>>> {
        let n = self.config.splits.unwrap_or(parallelism).max(1);
        Ok((0..n)
            .map(|i| {
                Box::new(NexmarkSplit {
                    config: self.config.clone(),
                    schema: self.schema.clone(),
                    columns: self.columns.clone(),
                    index: i as u64,
                    splits: n as u64,
                    next_epoch: i as u64,
                    events_read: 0,
                    started: None,
                }) as Box<dyn SourceSplit>
            })
            .collect())
    }
}

pub struct NexmarkSplit {
    config: Config,
    schema: SchemaRef,
    columns: Vec<usize>,
    index: u64,
    splits: u64,
    /// The next epoch (of TOTAL_PROPORTION events) this split generates.
    next_epoch: u64,
    /// Events of every kind this split has passed (its offset).
    events_read: u64,
    started: Option<Instant>,
}

enum Col {
    I(Int64Builder),
    S(StringBuilder),
    T(TimestampMillisecondBuilder),
}

impl NexmarkSplit {
    fn builders(&self, cap: usize) -> Vec<Col> {
        let full_kinds: &[u8] = match self.config.kind {
            EventKind::Person => b"ISSSSSTS",
            EventKind::Auction => b"ISSIITTIIS",
            EventKind::Bid => b"IIISSTS",
        };
        self.columns
            .iter()
            .map(|&c| match full_kinds[c] {
                b'I' => Col::I(Int64Builder::with_capacity(cap)),
                b'T' => Col::T(TimestampMillisecondBuilder::with_capacity(cap)),
                _ => Col::S(StringBuilder::with_capacity(cap, cap * 16)),
            })
            .collect()
    }

    fn wants(&self, column: usize) -> bool {
        self.columns.contains(&column)
    }

    /// Appends the event `n` if it is of our kind.
    fn append(&self, n: u64, cols: &mut [Col], scratch: &mut String) -> bool {
        if kind_of(n) != self.config.kind {
            return false;
        }
        let mut rng = Rng::new(self.config.seed, n);
        let t = &self.config.time;
        let (avg_p, avg_a, avg_b) = generator::AVG_BYTES;
        scratch.clear();
        // Values in generator column order; `extra` is drawn last so that
        // skipping it never changes the other fields.
        match self.config.kind {
            EventKind::Person => {
                let p = generator::person(n, &mut rng, t);
                let extra_col = 7;
                if self.wants(extra_col) {
                    rng.push_extra(scratch, generator::person_size(&p), avg_p);
                }
                for (c, &src) in cols.iter_mut().zip(&self.columns) {
                    match (c, src) {
                        (Col::I(b), 0) => b.append_value(p.id),
                        (Col::S(b), 1) => b.append_value(&p.name),
                        (Col::S(b), 2) => b.append_value(&p.email),
                        (Col::S(b), 3) => b.append_value(&p.credit_card),
                        (Col::S(b), 4) => b.append_value(p.city),
                        (Col::S(b), 5) => b.append_value(p.state),
                        (Col::T(b), 6) => b.append_value(p.date_time),
                        (Col::S(b), _) => b.append_value(scratch.as_str()),
                        _ => {}
                    }
                }
            }
            EventKind::Auction => {
                let a = generator::auction(n, &mut rng, t);
                if self.wants(9) {
                    rng.push_extra(scratch, generator::auction_size(&a), avg_a);
                }
                for (c, &src) in cols.iter_mut().zip(&self.columns) {
                    match (c, src) {
                        (Col::I(b), 0) => b.append_value(a.id),
                        (Col::S(b), 1) => b.append_value(&a.item_name),
                        (Col::S(b), 2) => b.append_value(&a.description),
                        (Col::I(b), 3) => b.append_value(a.initial_bid),
                        (Col::I(b), 4) => b.append_value(a.reserve),
                        (Col::T(b), 5) => b.append_value(a.date_time),
                        (Col::T(b), 6) => b.append_value(a.expires),
                        (Col::I(b), 7) => b.append_value(a.seller),
                        (Col::I(b), 8) => b.append_value(a.category),
                        (Col::S(b), _) => b.append_value(scratch.as_str()),
                        _ => {}
                    }
                }
            }
            EventKind::Bid => {
                let bid = generator::bid(n, &mut rng, t);
                let needs_channel = self.wants(3) || self.wants(4);
                let (channel, url) = if needs_channel {
                    generator::channel_and_url(bid.channel)
                } else {
                    (String::new(), String::new())
                };
                if self.wants(6) {
                    let size = generator::BID_FIXED_BYTES + channel.len() + url.len();
                    rng.push_extra(scratch, size, avg_b);
                }
                for (c, &src) in cols.iter_mut().zip(&self.columns) {
                    match (c, src) {
                        (Col::I(b), 0) => b.append_value(bid.auction),
                        (Col::I(b), 1) => b.append_value(bid.bidder),
                        (Col::I(b), 2) => b.append_value(bid.price),
                        (Col::S(b), 3) => b.append_value(&channel),
                        (Col::S(b), 4) => b.append_value(&url),
                        (Col::T(b), 5) => b.append_value(bid.date_time),
                        (Col::S(b), _) => b.append_value(scratch.as_str()),
                        _ => {}
                    }
                }
            }
        }
        true
    }
}

impl NexmarkSplit {
    /// Relative read speed: `nexmark.split-skew` for split 0, else 1.
    fn speed(&self) -> u64 {
        if self.index == 0 { self.config.skew.max(1) } else { 1 }
    }
}

impl SourceSplit for NexmarkSplit {
    fn resumed_after(&mut self, paused: std::time::Duration) {
        if let Some(started) = &mut self.started {
            *started += paused;
        }
    }

    fn id(&self) -> String {
        format!("nexmark-{}-of-{}", self.index, self.splits)
    }

    fn offset(&self) -> u64 {
        self.events_read
    }

    /// In events of every kind (what `offset` counts): the split's epochs
    /// below `nexmark.events`, the last one maybe cut short.
    fn progress(&self) -> Option<(u64, u64)> {
        let end = self.config.events?;
        let (len, splits, index) = (generator::TOTAL_PROPORTION, self.splits.max(1), self.index);
        let epochs = end.div_ceil(len);
        if index >= epochs {
            return Some((self.events_read, 0));
        }
        let mine = (epochs - 1 - index) / splits + 1;
        // The last epoch (maybe cut short) is this split's or another's.
        let total = if (epochs - 1) % splits == index {
            (mine - 1) * len + (end - (epochs - 1) * len)
        } else {
            mine * len
        };
        Some((self.events_read, total))
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        // Events are a pure function of their number: skipping is
        // arithmetic. A split passes whole epochs (only the last of a
        // bounded source may be cut short).
        let epoch_len = generator::TOTAL_PROPORTION;
        let epochs = position.div_ceil(epoch_len);
        self.next_epoch = self.index + epochs * self.splits;
        self.events_read = position;
        Ok(())
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        let end = self.config.events.unwrap_or(u64::MAX);
        let epoch_len = generator::TOTAL_PROPORTION;
        if self.next_epoch.saturating_mul(epoch_len) >= end {
            return Ok(SplitPoll::Finished);
        }
        // How many events (of every kind) this split may pass now.
        let mut budget = DEFAULT_BATCH_ROWS as u64;
        if self.config.rate > 0 {
            let per_split = self.config.rate as f64 / self.splits as f64 * self.speed() as f64;
            // A restored split is already `events_read` into its schedule.
            let ahead = Duration::from_secs_f64(self.events_read as f64 / per_split);
            let started = *self
                .started
                .get_or_insert_with(|| Instant::now().checked_sub(ahead).unwrap_or_else(Instant::now));
            let due = (started.elapsed().as_secs_f64() * per_split) as u64;
            if due < self.events_read + epoch_len {
                let next = started + Duration::from_secs_f64((self.events_read + epoch_len) as f64 / per_split);
                return Ok(SplitPoll::Wait(next));
            }
            budget = budget.min(due - self.events_read);
        }
        let (lo, hi) = match self.config.kind {
            EventKind::Person => (0, generator::PERSON_PROPORTION),
            EventKind::Auction => (
                generator::PERSON_PROPORTION,
                generator::PERSON_PROPORTION + generator::AUCTION_PROPORTION,
            ),
            EventKind::Bid => (generator::PERSON_PROPORTION + generator::AUCTION_PROPORTION, epoch_len),
        };
        // Unthrottled, the fast split reads more per poll; throttled, its
        // higher rate already gives it more budget (a burst here would jump
        // event time far ahead in one batch).
        let speed = if self.config.rate > 0 { 1 } else { self.speed() };
        let epochs = (budget / epoch_len).max(1) * speed;
        let mut cols = self.builders((epochs * (hi - lo)) as usize);
        let mut scratch = String::with_capacity(128);
        let mut rows = 0;
        for _ in 0..epochs {
            let first = self.next_epoch.saturating_mul(epoch_len);
            if first >= end {
                break;
            }
            for n in (first + lo)..(first + hi).min(end) {
                self.append(n, &mut cols, &mut scratch);
                rows += 1;
            }
            self.events_read += epoch_len.min(end - first);
            self.next_epoch += self.splits;
        }
        let arrays: Vec<ArrayRef> = cols
            .into_iter()
            .map(|c| -> ArrayRef {
                match c {
                    Col::I(mut b) => Arc::new(b.finish()),
                    Col::S(mut b) => Arc::new(b.finish()),
                    Col::T(mut b) => Arc::new(b.finish()),
                }
            })
            .collect();
        let batch = crate::operators::calc::batch_of_rows(&self.schema, arrays, rows)?;
        if batch.num_rows() == 0 {
            // The bounded end fell before this kind's events in the epoch.
            return Ok(SplitPoll::Finished);
        }
        Ok(SplitPoll::Batch(batch))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn source(table: &str, events: u64, splits: usize) -> NexmarkSource {
        let mut m = BTreeMap::new();
        m.insert("nexmark.table".to_string(), table.to_string());
        m.insert("nexmark.events".to_string(), events.to_string());
        m.insert("splits".to_string(), splits.to_string());
        let options = Options::validate(&m, OPTIONS, "test").expect("options");
        let schema = table_schema(&options).expect("schema");
        NexmarkSource::new(&options, schema).expect("source")
    }

    fn ids(table: &str, events: u64, splits: usize) -> Vec<i64> {
        let src = source(table, events, splits);
        let mut out = vec![];
        for mut split in src.create_splits(1).expect("splits") {
            let mut rows = 0;
            loop {
                match split.poll_batch().expect("poll") {
                    SplitPoll::Batch(b) => {
                        rows += b.num_rows();
                        let a = b
                            .column(0)
                            .as_any()
                            .downcast_ref::<arrow::array::Int64Array>()
                            .expect("ids");
                        out.extend(a.values().iter().copied());
                    }
                    SplitPoll::Finished => break,
                    SplitPoll::Wait(_) => panic!("unthrottled"),
                    SplitPoll::Changes(_) => panic!("nexmark reads no changes"),
                }
            }
            // Every split gets every kind (no split starves).
            assert!(rows > 0, "split {} of {table} produced nothing", split.id());
        }
        out.sort();
        out
    }

    #[test]
    fn every_split_gets_every_kind_and_the_union_does_not_depend_on_splits() {
        for table in ["person", "auction", "bid"] {
            let one = ids(table, 10_000, 1);
            assert_eq!(one, ids(table, 10_000, 3), "{table}");
            assert_eq!(one, ids(table, 10_000, 4), "{table}");
        }
        assert_eq!(ids("person", 10_000, 4).len(), 200);
        assert_eq!(ids("auction", 10_000, 4).len(), 600);
        // A bounded end inside an epoch: 60 events = 1 full epoch + 10.
        assert_eq!(ids("bid", 60, 2).len(), 46 + 6);
    }
}
